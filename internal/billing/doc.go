// Package billing holds Allot's pure money rules: it turns usage segments
// into charge lines and totals, exactly. It does no I/O, reads no clock and
// touches no database; the store and the hourly River rollup call it.
//
// # Usage
//
// A [Segment] is the GPUs one job run segment held: from Start to End (the
// release time, or "billed up to" for a segment still running; on node loss
// the caller passes the last heartbeat). GPUs counts identical GPUs held
// together, so usage is GPU-seconds = GPUs × seconds. TierAsRun is the tier
// the segment ran as: a job demoted for budget runs, and bills, as
// [allot.TierPreemptible].
//
// # Time: whole seconds on the UTC grid
//
// Usage is counted in whole seconds. Every instant is floored to its UTC
// second (Unix seconds), and a segment covers the seconds
// [floor(Start), floor(End)). Sub-second parts are therefore neither created
// nor lost by splitting: cutting [S, E) at any instant t gives
// (floor(t)-floor(S)) + (floor(E)-floor(t)) = floor(E)-floor(S) seconds.
// Rate and multiplier EffectiveFrom instants are floored the same way.
//
// What the allocations table holds matches: allocations are stored on
// whole seconds (migration 0023 floors started_at and released_at as they
// are written, as Slurm's accounting keeps whole seconds), so a month's
// billed GPU-seconds equal the sum of released_at − started_at over its
// allocations exactly. An allocation that starts and ends within one
// second has length 0 in the table and bills nothing; one that crosses a
// second boundary bills that second. (Before, instants were kept to the
// microsecond and floored only here: issue 16 measured 1,347,903 GPU-s
// billed against 1,347,971 s of raw allocation over 2,484 allocations.)
//
// # Rate card
//
// A [RateCard] is versioned policy: rates per GPU type (micro-units of the
// currency per GPU-hour) and multipliers per tier (basis points, 10000 = ×1,
// preemptible 3000 = ×0.3 = 70 % off). The version in force at an instant is
// the one with the latest EffectiveFrom at or before it; its EffectiveFrom
// is its version. Usage is charged at the rates in force when it happened:
// usage before a GPU type's (or tier's) first version is an error. One rate
// card has one currency.
//
// # Split
//
// [Split] cuts each segment at UTC hour boundaries (so at month boundaries
// too) and at rate and multiplier changes: every [Piece] lies within one
// hour, one month, one rate version and one multiplier version. The sum of
// the pieces' seconds equals the segment's, exactly.
//
// # Preemption credit
//
// GPU-time a job lost to preemption is not charged. A segment with
// PreemptedAt set was ended by preemption; its lost window is
// [LastCheckpoint, End) when the job is Checkpointable and has a checkpoint
// at or after Start, else the whole segment [Start, End) (a checkpoint older
// than the segment saved nothing of it). The window is clamped to the
// segment and split like usage into credit pieces. The time is still
// charged, and a separate line of kind [KindPreemptionCredit] with the same
// keys and negative GPU-seconds and amount takes it back, so the team sees
// the credit. Because the lost window lies inside the segment, every credit
// line has at most the seconds of the charge line with the same keys, and
// rounding is monotone, so a charge line plus its credit line, and so every
// segment's lines, never net below zero.
//
// # Lines and the rounding rule
//
// [Lines] aggregates pieces into charge lines keyed by [LineKey]: kind,
// billing month, hour, job, segment, team, cost center, user, tier, GPU type,
// rate version and multiplier version. GPU-seconds are summed first, and
// then each line is priced once:
//
//	amount = gpu_seconds × rate_micros × multiplier_bp / (3600 × 10000)
//
// computed exactly in 128-bit integer arithmetic (never float) and ROUNDED
// ONCE PER LINE, HALF UP (ties away from zero), TO THE CURRENCY'S MINOR
// UNIT: the cent for most currencies ([RoundingUnit]: 10 000 micro-units;
// 1 000 000 for zero-decimal currencies such as JPY, 1 000 for three-decimal
// ones such as KWD). Amounts are stored in micro-units (allot.Money) but are
// always whole cents, so every sum of lines (team, user, job, statement, CSV)
// is exact to the cent and displays without further rounding. Credit lines
// round the magnitude of their own seconds the same way and are negated.
// Because rounding happens once per line after aggregation, splitting the
// input differently within one line's key (pre-splitting a segment at any
// instant, or reordering segments) does not change any line.
//
// # Totals
//
// [Totals] sums lines by team, team × GPU type × tier, user, job and in all,
// with integer arithmetic and overflow checks: the sum of the lines equals
// every total exactly.
//
// # Months
//
// Months are UTC calendar months, written "YYYY-MM" ([YearMonth],
// [Month], [ParseMonth]). [CheckMonth] also rejects a future month, given
// now. A closed month never changes: late usage for it is billed by
// [Adjust] as lines of kind [KindAdjustment] dated in the first open month,
// so that billed + adjustments = recomputed exactly, per line key, per total
// and in all. [CheckEffective] rejects a rate or multiplier change backdated
// into a closed month.
//
// # Periods
//
// A statement or export may cover any [Period] [From, To) of whole UTC
// hours, not only a month ([CheckPeriod]). Lines are hourly, so a period
// selects whole lines by their billing instant ([BillingInstant]: the
// usage hour, or for an adjustment the first instant of its billing
// month) and nothing is prorated or rounded again: periods that split a
// month, or months that make a quarter, add up exactly. The month stays
// the unit that closes.
//
// # Idempotency
//
// Output never depends on input order or map iteration order: lines are
// sorted by a total order ([CompareLines]) and each has a deterministic key
// ([Line.Key], [LineKey.String]) a rollup can upsert on. Rolling the same
// input twice gives identical lines.
package billing
