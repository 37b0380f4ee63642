package store

import (
	"context"
	"fmt"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/jackc/pgx/v5"
)

// billingLock serializes rollups and month closing.
const billingLock = 7_401_223_020

// LockBilling takes the billing lock for the current transaction.
func (s *Store) LockBilling(ctx context.Context) error {
	_, err := s.db.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, billingLock)
	return mapErr("taking the billing lock", err)
}

// RateCard loads every rate and multiplier version.
func (s *Store) RateCard(ctx context.Context) (*billing.RateCard, error) {
	rows, err := s.db.Query(ctx, `SELECT gpu_type, rate_micros, currency, effective_from FROM gpu_rates ORDER BY gpu_type, effective_from`)
	if err != nil {
		return nil, mapErr("loading rates", err)
	}
	rates, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (billing.Rate, error) {
		var x billing.Rate
		return x, r.Scan(&x.GPUType, &x.Micros, &x.Currency, &x.EffectiveFrom)
	})
	if err != nil {
		return nil, mapErr("loading rates", err)
	}
	rows, err = s.db.Query(ctx, `SELECT tier, multiplier_bp, effective_from FROM tier_multipliers ORDER BY tier, effective_from`)
	if err != nil {
		return nil, mapErr("loading multipliers", err)
	}
	mults, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (billing.Multiplier, error) {
		var x billing.Multiplier
		var tier string
		err := r.Scan(&tier, &x.BP, &x.EffectiveFrom)
		x.Tier = allot.TierID(tier)
		return x, err
	})
	if err != nil {
		return nil, mapErr("loading multipliers", err)
	}
	return billing.NewRateCard(rates, mults)
}

// UsageSegments returns the usage (GPUs held by job run segments, per node)
// that overlaps [from, to), with running allocations billed up to upTo.
// Demoted or preemptible jobs bill as preemptible; a segment ended by
// preemption (or stopped by a drain-and-requeue) carries PreemptedAt for the
// preemption credit.
func (s *Store) UsageSegments(ctx context.Context, from, to, upTo time.Time) ([]billing.Segment, error) {
	return s.usageSegments(ctx, "", from, to, upTo)
}

// JobUsageSegments is UsageSegments for one job's whole life up to upTo:
// what it has cost so far, by the same rules as the bill.
func (s *Store) JobUsageSegments(ctx context.Context, jobID int64, upTo time.Time) ([]billing.Segment, error) {
	return s.usageSegments(ctx, " AND a.job_id = $4", time.Unix(0, 0).UTC(), upTo, upTo, jobID)
}

func (s *Store) usageSegments(ctx context.Context, filter string, args ...any) ([]billing.Segment, error) {
	rows, err := s.db.Query(ctx, `
		SELECT a.job_id, a.segment, j.team, u.email, t.cost_center,
			CASE WHEN j.run_as <> '' THEN j.run_as WHEN j.preemptible THEN 'preemptible' ELSE j.tier END,
			n.gpu_type, a.node, count(*)::int, a.started_at, least(coalesce(a.released_at, $3), $3), j.checkpointable,
			(SELECT max(l.exited_at) FROM leases l WHERE l.job_id = a.job_id AND l.segment = a.segment AND l.node = a.node AND l.stop_reason IN ('preempted', 'drain')),
			(SELECT max(l.last_checkpoint) FROM leases l WHERE l.job_id = a.job_id AND l.segment = a.segment)
		FROM allocations a
		JOIN jobs j ON j.id = a.job_id
		JOIN users u ON u.id = j.user_id
		JOIN teams t ON t.slug = j.team
		JOIN nodes n ON n.name = a.node
		WHERE a.started_at < least($2, $3) AND coalesce(a.released_at, 'infinity'::timestamptz) > $1`+filter+`
		GROUP BY a.job_id, a.segment, j.team, u.email, t.cost_center, j.run_as, j.preemptible, j.tier, n.gpu_type, a.node,
			a.started_at, a.released_at, j.checkpointable
		ORDER BY a.job_id, a.segment, a.node, a.started_at`, args...)
	if err != nil {
		return nil, mapErr("loading usage", err)
	}
	segs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (billing.Segment, error) {
		var x billing.Segment
		var tier string
		var preempted, checkpoint *time.Time
		err := r.Scan(&x.JobID, &x.Segment, &x.Team, &x.User, &x.CostCenter, &tier, &x.GPUType, &x.Node, &x.GPUs, &x.Start, &x.End,
			&x.Checkpointable, &preempted, &checkpoint)
		if checkpoint != nil {
			x.LastCheckpoint = *checkpoint
		}
		x.TierAsRun = allot.TierID(tier)
		if preempted != nil && !x.End.Before(*preempted) {
			x.PreemptedAt = *preempted
		}
		if x.Segment == 0 {
			x.Segment = 1
		}
		return x, err
	})
	if err != nil {
		return nil, mapErr("loading usage", err)
	}
	out := segs[:0]
	for _, x := range segs {
		if x.End.After(x.Start) {
			out = append(out, x)
		}
	}
	return out, nil
}

const lineCols = `line_key, month, kind, adjusts, usage_hour, job_id, segment, team, cost_center, user_email, tier, gpu_type,
	rate_from, multiplier_from, from_at, to_at, gpu_seconds, rate_micros, multiplier_bp, amount_micros, currency`

// ChargeLines returns the lines billed in month (its usage, its credits and
// the adjustments dated in it), in the billing package's total order.
func (s *Store) ChargeLines(ctx context.Context, month billing.YearMonth) ([]billing.Line, error) {
	return s.chargeLines(ctx, `WHERE month = $1`, month.Start())
}

// ChargeLinesOfTeams returns month's lines for teams only (nil: all).
func (s *Store) ChargeLinesOfTeams(ctx context.Context, month billing.YearMonth, teams []string) ([]billing.Line, error) {
	if teams == nil {
		return s.ChargeLines(ctx, month)
	}
	return s.chargeLines(ctx, `WHERE month = $1 AND team = ANY($2)`, month.Start(), teams)
}

// ChargeLinesIn returns the lines (of teams only, nil: all) whose billing
// instant lies in p (see billing.Period): the charges and credits of its
// usage hours and the adjustments of the months whose first instant it
// holds.
func (s *Store) ChargeLinesIn(ctx context.Context, p billing.Period, teams []string) ([]billing.Line, error) {
	months := p.Months()
	if len(months) == 0 {
		return nil, nil
	}
	adj := []time.Time{}
	for _, m := range months {
		if p.HoldsAdjustmentsOf(m) {
			adj = append(adj, m.Start())
		}
	}
	return s.chargeLines(ctx, `WHERE month >= $1 AND month < $2 AND ($3::text[] IS NULL OR team = ANY($3))
		AND (kind <> 'adjustment' AND usage_hour >= $4 AND usage_hour < $5 OR kind = 'adjustment' AND month = ANY($6::date[]))`,
		months[0].Start(), months[len(months)-1].End(), teams, p.From, p.To, adj)
}

// ChargeLinesForUsage returns every line about usage in month, wherever it
// is billed (its own lines and adjustments dated later).
func (s *Store) ChargeLinesForUsage(ctx context.Context, month billing.YearMonth) ([]billing.Line, error) {
	return s.chargeLines(ctx, `WHERE usage_hour >= $1 AND usage_hour < $2`, month.Start(), month.End())
}

func (s *Store) chargeLines(ctx context.Context, where string, args ...any) ([]billing.Line, error) {
	rows, err := s.db.Query(ctx, `SELECT `+lineCols+` FROM charge_lines `+where+` ORDER BY team, job_id, usage_hour, line_key`, args...)
	if err != nil {
		return nil, mapErr("loading charge lines", err)
	}
	lines, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (billing.Line, error) {
		var l billing.Line
		var key, kind, adjusts, tier string
		var month time.Time
		err := r.Scan(&key, &month, &kind, &adjusts, &l.Hour, &l.JobID, &l.Segment, &l.Team, &l.CostCenter, &l.User, &tier, &l.GPUType,
			&l.RateFrom, &l.MultiplierFrom, &l.From, &l.To, &l.GPUSeconds, &l.RateMicros, &l.MultiplierBP, &l.Amount.Micros, &l.Amount.Currency)
		l.Kind, l.Adjusts, l.Tier, l.Month = billing.Kind(kind), billing.Kind(adjusts), allot.TierID(tier), billing.Month(month)
		l.Hour, l.RateFrom, l.MultiplierFrom, l.From, l.To = l.Hour.UTC(), l.RateFrom.UTC(), l.MultiplierFrom.UTC(), l.From.UTC(), l.To.UTC()
		return l, err
	})
	return lines, mapErr("loading charge lines", err)
}

// ReplaceMonthLines replaces every line billed in month with lines, in the
// caller's transaction. The database refuses it for a closed month.
func (s *Store) ReplaceMonthLines(ctx context.Context, month billing.YearMonth, lines []billing.Line) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM charge_lines WHERE month = $1`, month.Start()); err != nil {
		return mapErr(fmt.Sprintf("replacing charge lines of %s", month), err)
	}
	if len(lines) == 0 {
		return nil
	}
	rows := make([][]any, len(lines))
	for i := range lines {
		l := &lines[i]
		if l.Month != month {
			return allot.Errorf(allot.EInternal, "line %s is billed in %s, not %s", l.Key(), l.Month, month)
		}
		rows[i] = []any{l.Key().String(), month.Start(), string(l.Kind), string(l.Adjusts), l.Hour, l.JobID, l.Segment, l.Team, l.CostCenter,
			l.User, string(l.Tier), l.GPUType, l.RateFrom, l.MultiplierFrom, l.From, l.To, l.GPUSeconds, l.RateMicros, l.MultiplierBP,
			l.Amount.Micros, l.Amount.Currency}
	}
	_, err := s.db.CopyFrom(ctx, pgx.Identifier{"charge_lines"}, []string{"line_key", "month", "kind", "adjusts", "usage_hour", "job_id",
		"segment", "team", "cost_center", "user_email", "tier", "gpu_type", "rate_from", "multiplier_from", "from_at", "to_at",
		"gpu_seconds", "rate_micros", "multiplier_bp", "amount_micros", "currency"}, pgx.CopyFromRows(rows))
	return mapErr(fmt.Sprintf("writing charge lines of %s", month), err)
}

// MonthHasCharges reports whether month has any charge line.
func (s *Store) MonthHasCharges(ctx context.Context, month billing.YearMonth) (bool, error) {
	var ok bool
	err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM charge_lines WHERE month = $1)`, month.Start()).Scan(&ok)
	return ok, mapErr("looking for charges", err)
}

// ClosedMonths returns the closed billing months, oldest first.
func (s *Store) ClosedMonths(ctx context.Context) ([]billing.YearMonth, error) {
	rows, err := s.db.Query(ctx, `SELECT month FROM billing_months ORDER BY month`)
	if err != nil {
		return nil, mapErr("loading closed months", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (billing.YearMonth, error) {
		var t time.Time
		err := r.Scan(&t)
		return billing.Month(t), err
	})
	return out, mapErr("loading closed months", err)
}

// FirstUsage returns the start of the earliest allocation (zero if none).
func (s *Store) FirstUsage(ctx context.Context) (time.Time, error) {
	var t *time.Time
	err := s.db.QueryRow(ctx, `SELECT min(started_at) FROM allocations`).Scan(&t)
	if err != nil || t == nil {
		return time.Time{}, mapErr("finding first usage", err)
	}
	return *t, nil
}

// CloseMonth marks month closed; its lines never change again.
func (s *Store) CloseMonth(ctx context.Context, month billing.YearMonth, by string) error {
	_, err := s.db.Exec(ctx, `INSERT INTO billing_months (month, closed_at, closed_by) VALUES ($1, $2, $3)`, month.Start(), s.Now(), by)
	if err != nil && allot.ErrorCode(mapErr("", err)) == allot.EConflict {
		return allot.Errorf(allot.EConflict, "%s is already closed", month)
	}
	return mapErr(fmt.Sprintf("closing %s", month), err)
}

// SetRateChecked records a new rate unless it is backdated into a closed
// month (EConflict).
func (s *Store) SetRateChecked(ctx context.Context, gpuType string, rate allot.Money, effectiveFrom time.Time) error {
	return s.InTx(ctx, func(tx *Store) error {
		if err := tx.LockBilling(ctx); err != nil {
			return err
		}
		closed, err := tx.ClosedMonths(ctx)
		if err != nil {
			return err
		}
		if len(closed) > 0 {
			if err := billing.CheckEffective(effectiveFrom, closed[len(closed)-1].Next()); err != nil {
				return err
			}
		}
		return tx.SetRate(ctx, gpuType, rate, effectiveFrom)
	})
}

// ChargeRow is one charge line as finance sees it (the CSV row).
type ChargeRow struct {
	Month        string
	Kind         string
	Team         string
	CostCenter   string
	JobID        int64
	JobName      string
	User         string
	Tier         string
	GPUType      string
	GPUs         int64 // GPU-seconds ÷ the line's span, rounded
	From, To     time.Time
	GPUSeconds   int64
	RateMicros   int64
	MultiplierBP int
	Amount       allot.Money
	MeanGPUUtil  *float64 // mean utilization of the job's GPUs over the line's span; nil without samples
	// Adjusts is, on an adjustment, the kind of line it corrects.
	Adjusts string
	// Hour is the UTC hour the usage happened in (for an adjustment, in
	// the closed month it corrects).
	Hour time.Time
	// RateFrom and MultiplierFrom are the rate and multiplier versions.
	RateFrom, MultiplierFrom time.Time
	// TeamName is the team's display name (its slug if it is gone).
	TeamName string
}

// ExportPageRows is how many rows one statement of a streamed export
// (EachChargeRow, EachAudit) reads. Each page is its own short statement,
// read whole and its connection given back before the caller sees a row,
// so a client that downloads slowly, or not at all, holds no database
// connection between pages (issue 16: 40 unread chargeback downloads held
// 40 of the server's connections and stalled the control plane). 2,000
// rows (about 270 kB of CSV) is what a client that stops reading costs the
// server before its socket fills, and a page costs a millisecond or two of
// statement overhead: 73 of them for a 145,734-line month.
const ExportPageRows = 2000

// EachChargeRow streams month's lines (restricted to teams when non-nil) to
// fn in a stable order (team, job, hour, kind, line key), a page of
// ExportPageRows at a time, without holding a connection while fn runs.
//
// The pages are keyset pages over that order with the set fixed when the
// export starts: only lines whose usage hour is at most the latest one
// then, and every page checks that the month's lines are still the ones
// the first page read. A rollup replaces all of an open month's lines in
// one transaction (so they all change their xmin); if one commits between
// two pages, the export stops with EConflict rather than mixing two
// rollups' lines into totals no statement ever had. A closed month never
// changes (the database refuses it), so its export never stops so.
func (s *Store) EachChargeRow(ctx context.Context, month billing.YearMonth, teams []string, fn func(*ChargeRow) error) error {
	return s.EachChargeRowIn(ctx, month, billing.MonthPeriod(month), teams, fn)
}

// EachChargeRowIn is EachChargeRow for the lines billed in month whose
// billing instant (billing.Period) lies in p: the charges and credits of
// the usage hours in p, and the month's adjustments if p holds its first
// instant.
func (s *Store) EachChargeRowIn(ctx context.Context, month billing.YearMonth, p billing.Period, teams []string, fn func(*ChargeRow) error) error {
	p = p.Within(month)
	if !p.From.Before(p.To) {
		return nil
	}
	adj := p.HoldsAdjustmentsOf(month)
	var bound *time.Time
	err := s.db.QueryRow(ctx, `SELECT max(usage_hour) FROM charge_lines
		WHERE month = $1 AND ($2::text[] IS NULL OR team = ANY($2))
			AND (kind <> 'adjustment' AND usage_hour >= $3 AND usage_hour < $4 OR $5 AND kind = 'adjustment')`,
		month.Start(), teams, p.From, p.To, adj).Scan(&bound)
	if err != nil || bound == nil {
		return mapErr("loading charge lines", err)
	}
	var (
		after                  chargeRowKey
		sentinel, sentinelXmin string
		page                   = make([]ChargeRow, 0, ExportPageRows)
		keys                   = make([]chargeRowKey, 0, ExportPageRows)
	)
	// The period's condition, the same for every page: a whole month (the
	// usual export) adds none, and a part of one adds plain conditions,
	// never one that a parameter switches on or off (which would keep the
	// planner off the index for every page).
	var period string
	var periodArgs []any
	switch whole := billing.MonthPeriod(month); {
	case adj && p.From.Equal(whole.From) && p.To.Equal(whole.To): // every line of the month
	case adj:
		period, periodArgs = ` AND (l.kind = 'adjustment' OR l.usage_hour >= $6 AND l.usage_hour < $7)`, []any{p.From, p.To}
	default:
		period, periodArgs = ` AND l.kind <> 'adjustment' AND l.usage_hour >= $6 AND l.usage_hour < $7`, []any{p.From, p.To}
	}
	for first := true; ; first = false {
		page, keys = page[:0], keys[:0]
		var seen *string
		// The first page has no keyset condition (an OR with a flag would
		// keep the planner off the index for every page).
		args := append([]any{month.Start(), teams, *bound, sentinel, ExportPageRows}, periodArgs...)
		keyset := period
		if !first {
			n := len(args)
			keyset += fmt.Sprintf(` AND (l.team, l.job_id, l.usage_hour, l.kind, l.line_key) > ($%d, $%d, $%d, $%d, $%d)`, n+1, n+2, n+3, n+4, n+5)
			args = append(args, after.team, after.jobID, after.hour, after.kind, after.lineKey)
		}
		rows, err := s.db.Query(ctx, `
			SELECT to_char(l.month, 'YYYY-MM'), l.kind, l.team, l.cost_center, l.job_id, j.name, l.user_email, l.tier, l.gpu_type,
				CASE WHEN l.to_at > l.from_at THEN round(abs(l.gpu_seconds) / extract(epoch FROM l.to_at - l.from_at))::bigint ELSE 0 END,
				l.from_at, l.to_at, l.gpu_seconds, l.rate_micros, l.multiplier_bp, l.amount_micros, l.currency,
				(SELECT avg(g.util_pct)::float8 FROM gpu_samples g WHERE g.job_id = l.job_id AND g.at >= l.from_at AND g.at < l.to_at),
				l.usage_hour, l.line_key, l.xmin::text, (SELECT s.xmin::text FROM charge_lines s WHERE s.line_key = $4),
				l.adjusts, l.rate_from, l.multiplier_from, COALESCE(t.name, l.team)
			FROM charge_lines l JOIN jobs j ON j.id = l.job_id LEFT JOIN teams t ON t.slug = l.team
			WHERE l.month = $1 AND ($2::text[] IS NULL OR l.team = ANY($2)) AND l.usage_hour <= $3`+keyset+`
			ORDER BY l.team, l.job_id, l.usage_hour, l.kind, l.line_key
			LIMIT $5`, args...)
		if err != nil {
			return mapErr("loading charge lines", err)
		}
		for rows.Next() {
			var r ChargeRow
			var k chargeRowKey
			var xmin string
			if err := rows.Scan(&r.Month, &r.Kind, &r.Team, &r.CostCenter, &r.JobID, &r.JobName, &r.User, &r.Tier, &r.GPUType, &r.GPUs,
				&r.From, &r.To, &r.GPUSeconds, &r.RateMicros, &r.MultiplierBP, &r.Amount.Micros, &r.Amount.Currency, &r.MeanGPUUtil,
				&k.hour, &k.lineKey, &xmin, &seen, &r.Adjusts, &r.RateFrom, &r.MultiplierFrom, &r.TeamName); err != nil {
				rows.Close()
				return mapErr("reading charge lines", err)
			}
			r.From, r.To = r.From.UTC(), r.To.UTC()
			r.Hour, r.RateFrom, r.MultiplierFrom = k.hour.UTC(), r.RateFrom.UTC(), r.MultiplierFrom.UTC()
			k.team, k.jobID, k.kind = r.Team, r.JobID, r.Kind
			if first && len(page) == 0 {
				sentinel, sentinelXmin = k.lineKey, xmin
			}
			page, keys = append(page, r), append(keys, k)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return mapErr("reading charge lines", err)
		}
		if !first && (seen == nil || *seen != sentinelXmin) && len(page) > 0 {
			return allot.Errorf(allot.EConflict, "the charge lines of %s changed during the export (a billing rollup ran): download it again", month)
		}
		for i := range page {
			if err := fn(&page[i]); err != nil {
				return err
			}
		}
		if len(page) < ExportPageRows {
			return nil
		}
		after = keys[len(keys)-1]
	}
}

// chargeRowKey is a charge line's place in EachChargeRow's order.
type chargeRowKey struct {
	team          string
	jobID         int64
	hour          time.Time
	kind, lineKey string
}

// MonthClosed returns when month was closed and by whom (zero if open).
func (s *Store) MonthClosed(ctx context.Context, month billing.YearMonth) (time.Time, string, error) {
	var at time.Time
	var by string
	err := s.db.QueryRow(ctx, `SELECT closed_at, closed_by FROM billing_months WHERE month = $1`, month.Start()).Scan(&at, &by)
	if err == pgx.ErrNoRows {
		return time.Time{}, "", nil
	}
	return at, by, mapErr("checking month", err)
}
