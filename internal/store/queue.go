package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The queue as the last scheduling cycle decided it (migration 0028): every
// cycle replaces it inside its own transaction (ApplyPlan, RecordShares),
// so a reader, which reads it in one statement, sees one cycle's queue,
// whole, never half of one and half of the next.

// Kinds of start estimate (QueueDecision.EstKind).
const (
	// EstReservation: the scheduler holds GPUs for the job from EstStart on.
	EstReservation = "reservation"
	// EstPreemption: the job starts by preemption when its victims' grace
	// period ends, at EstStart.
	EstPreemption = "preemption"
	// EstProjection: the earliest time enough GPUs come free by the running
	// jobs' time limits, with the jobs ahead of it placed first.
	EstProjection = "projection"
)

// QueueDecision is what one cycle decided for one pending job.
type QueueDecision struct {
	JobID   int64
	CycleID int64
	// Rank is the job's place in the scheduler's order over the whole
	// queue, 1 first.
	Rank int
	// RunAs is the class the job competed in (preemptible when demoted
	// or submitted preemptible).
	RunAs     allot.TierID
	Reason    string
	EstStart  time.Time // zero: unknown
	EstKind   string    // EstReservation, EstPreemption, EstProjection or ""
	DecidedAt time.Time // the cycle's instant
}

// QueueCycle is the cycle the stored queue is from.
type QueueCycle struct {
	ID        int64 // 0: no cycle has run (since the database started)
	DecidedAt time.Time
	Pending   int // jobs in its queue
}

// JobQueue is a pending job's place in the stored queue.
type JobQueue struct {
	Cycle QueueCycle
	// Decision is nil when the last cycle did not plan the job: it was
	// submitted (or requeued) after it, or another engine (Slurm) places
	// it.
	Decision *QueueDecision
	// TypeRank and TypeOf rank the job among the queued jobs that compete
	// for the same GPUs (same GPU type, or either side taking any type),
	// in the same order; AheadGPUSeconds is Σ GPUs × time limit of those
	// ahead of it.
	TypeRank, TypeOf int
	AheadGPUSeconds  int64
}

// TeamShare is one team's fair-share standing as a cycle computed it
// (scheduler.TeamShare, like a row of Slurm's sshare).
type TeamShare struct {
	Team           string
	NormShares     float64
	RawUsage       float64 // decayed GPU-seconds
	EffectiveUsage float64
	FairShare      float64
}

// CycleShares is the shares of the last cycle that recorded them.
type CycleShares struct {
	CycleID   int64 // 0: none recorded yet
	DecidedAt time.Time
	Teams     map[string]TeamShare
}

// cycleIDSQL reserves the id of the transaction's scheduling_cycles row,
// once per transaction: ApplyPlan's queue rows, RecordShares' and
// RecordCycle's row carry the same id.
const cycleIDSQL = `SELECT coalesce(nullif(current_setting('allot.cycle_id', true), '')::bigint,
	set_config('allot.cycle_id', nextval(pg_get_serial_sequence('scheduling_cycles', 'id'))::text, true)::bigint)`

func (s *Store) cycleID(ctx context.Context) (int64, error) {
	var id int64
	err := s.db.QueryRow(ctx, cycleIDSQL).Scan(&id)
	return id, mapErr("numbering the cycle", err)
}

// runAsOfClass is the tier a breakdown's class names ("" for none).
func runAsOfClass(class int) allot.TierID {
	t, _ := allot.TierOfClass(class)
	return t
}

// recordQueue replaces the stored queue with pending, in the scheduler's
// order: one row of arrays, one statement whatever the queue's size
// (migration 0028 says why not a row per job).
func (s *Store) recordQueue(ctx context.Context, pending []PendingUpdate, now time.Time) error {
	id, err := s.cycleID(ctx)
	if err != nil {
		return err
	}
	n := len(pending)
	var (
		ids       = make([]int64, 0, n)
		classes   = make([]int16, 0, n)
		reasonIDs = make([]int32, 0, n)
		reasons   []string
		reasonID  = map[string]int32{}
		ests      = make([]pgtype.Timestamptz, 0, n)
		kinds     = make([]string, 0, n)
		seen      = make(map[int64]bool, n)
	)
	for _, p := range pending {
		if seen[p.JobID] {
			continue // listed twice: its first place counts
		}
		seen[p.JobID] = true
		r, ok := reasonID[p.Reason]
		if !ok {
			reasons = append(reasons, p.Reason)
			r = int32(len(reasons))
			reasonID[p.Reason] = r
		}
		est, kind := pgtype.Timestamptz{Time: p.EstStart, Valid: !p.EstStart.IsZero()}, p.EstKind
		if !est.Valid {
			kind = ""
		}
		ids, classes, reasonIDs, ests, kinds = append(ids, p.JobID), append(classes, int16(p.Breakdown.Class)), append(reasonIDs, r), append(ests, est), append(kinds, kind)
	}
	if reasons == nil {
		reasons = []string{}
	}
	_, err = s.db.Exec(ctx, `
		INSERT INTO queue_cycle (one, cycle_id, decided_at, job_ids, classes, reason_ids, reasons, est_starts, est_kinds)
		VALUES (true, $1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (one) DO UPDATE SET cycle_id = EXCLUDED.cycle_id, decided_at = EXCLUDED.decided_at, job_ids = EXCLUDED.job_ids,
			classes = EXCLUDED.classes, reason_ids = EXCLUDED.reason_ids, reasons = EXCLUDED.reasons, est_starts = EXCLUDED.est_starts,
			est_kinds = EXCLUDED.est_kinds`,
		id, now, ids, classes, reasonIDs, reasons, ests, kinds)
	return mapErr("writing the queue", err)
}

// RecordShares replaces the stored fair-share standing with a cycle's. It
// runs in the cycle's transaction, after ApplyPlan.
func (s *Store) RecordShares(ctx context.Context, shares []TeamShare) error {
	id, err := s.cycleID(ctx)
	if err != nil {
		return err
	}
	teams, norm, raw, eff, fs := make([]string, len(shares)), make([]float64, len(shares)), make([]float64, len(shares)),
		make([]float64, len(shares)), make([]float64, len(shares))
	for i, t := range shares {
		teams[i], norm[i], raw[i], eff[i], fs[i] = t.Team, t.NormShares, t.RawUsage, t.EffectiveUsage, t.FairShare
	}
	if _, err := s.db.Exec(ctx, `DELETE FROM cycle_shares`); err != nil {
		return mapErr("recording the fair-share standing", err)
	}
	_, err = s.db.Exec(ctx, `INSERT INTO cycle_shares (team, cycle_id, decided_at, norm_shares, raw_usage, effective_usage, fair_share)
		SELECT t, $2, $3, n, r, e, f FROM unnest($1::text[], $4::float8[], $5::float8[], $6::float8[], $7::float8[]) AS u(t, n, r, e, f)
		ON CONFLICT (team) DO NOTHING`, teams, id, s.Now(), norm, raw, eff, fs)
	return mapErr("recording the fair-share standing", err)
}

// LastShares returns the fair-share standing the last cycle recorded.
func (s *Store) LastShares(ctx context.Context) (CycleShares, error) {
	out := CycleShares{Teams: map[string]TeamShare{}}
	rows, err := s.db.Query(ctx, `SELECT team, cycle_id, decided_at, norm_shares, raw_usage, effective_usage, fair_share FROM cycle_shares ORDER BY team`)
	if err != nil {
		return out, mapErr("reading the fair-share standing", err)
	}
	var t TeamShare
	var id int64
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&t.Team, &id, &at, &t.NormShares, &t.RawUsage, &t.EffectiveUsage, &t.FairShare}, func() error {
		out.CycleID, out.DecidedAt, out.Teams[t.Team] = id, at, t
		return nil
	})
	return out, mapErr("reading the fair-share standing", err)
}

// JobQueueOf returns where the last cycle put job id, in one statement
// (one snapshot: the queue of one cycle).
func (s *Store) JobQueueOf(ctx context.Context, id int64) (JobQueue, error) {
	var q JobQueue
	var cycleID *int64
	var cycleAt, est *time.Time
	var pending, rank, typeRank, typeOf *int
	var class *int16
	var reason, kind *string
	var ahead *int64
	err := s.db.QueryRow(ctx, `
		WITH m AS MATERIALIZED (SELECT * FROM queue_cycle),
		me AS (SELECT p.i, j.gpu_type FROM (SELECT array_position(m.job_ids, $1::bigint) AS i FROM m) p
			JOIN jobs j ON j.id = $1 AND j.state = 'pending' WHERE p.i IS NOT NULL)
		SELECT m.cycle_id, m.decided_at, cardinality(m.job_ids), me.i, m.classes[me.i], m.reasons[m.reason_ids[me.i]], m.est_starts[me.i], m.est_kinds[me.i],
			c.ahead + 1, c.n, c.ahead_s
		FROM (SELECT 1) one
		LEFT JOIN m ON true
		LEFT JOIN me ON true
		LEFT JOIN LATERAL (
			SELECT (count(*) FILTER (WHERE o.r < me.i))::int AS ahead, count(*)::int AS n,
				coalesce(sum(oj.gpus::bigint * oj.time_limit_s) FILTER (WHERE o.r < me.i), 0)::bigint AS ahead_s
			FROM unnest(m.job_ids) WITH ORDINALITY o(id, r) JOIN jobs oj ON oj.id = o.id
			WHERE me.gpu_type IS NULL OR oj.gpu_type IS NULL OR oj.gpu_type = me.gpu_type) c ON me.i IS NOT NULL`, id).
		Scan(&cycleID, &cycleAt, &pending, &rank, &class, &reason, &est, &kind, &typeRank, &typeOf, &ahead)
	if err != nil {
		return q, mapErr(fmt.Sprintf("reading job %d's place in the queue", id), err)
	}
	if cycleID == nil {
		return q, nil
	}
	q.Cycle = QueueCycle{ID: *cycleID, DecidedAt: *cycleAt, Pending: *pending}
	if rank != nil {
		d := &QueueDecision{JobID: id, CycleID: q.Cycle.ID, Rank: *rank, RunAs: runAsOfClass(int(*class)), Reason: *reason, EstKind: *kind, DecidedAt: q.Cycle.DecidedAt}
		if est != nil {
			d.EstStart = *est
		}
		q.Decision = d
		q.TypeRank, q.TypeOf, q.AheadGPUSeconds = *typeRank, *typeOf, *ahead
	}
	return q, nil
}

// QueuedJob is a pending job with the last cycle's decision (nil: not
// planned by it).
type QueuedJob struct {
	allot.Job
	Decision *QueueDecision
}

// decisionScan reads a job row followed by the queue_decisions columns
// queueSelect adds.
type decisionScan struct {
	r     pgx.Row
	extra []any
}

func (d decisionScan) Scan(dest ...any) error { return d.r.Scan(append(dest, d.extra...)...) }

// queueSelect is jobSelect with the job's stored decision (alias q) and
// the cycle's id, instant and queue length (alias m, read once).
var queueSelect = func() string {
	const from = "\n\tFROM jobs j"
	if !strings.Contains(jobSelect, from) {
		panic("store: jobSelect no longer reads " + from)
	}
	return strings.Replace(jobSelect, from, `, q.rank, q.run_as, q.reason, q.est_start, q.est_kind, m.cycle_id, m.decided_at, m.n`+from, 1) +
		` LEFT JOIN (SELECT cycle_id, decided_at, cardinality(job_ids) AS n FROM queue_cycle) m ON true
		LEFT JOIN queue_decisions q ON q.job_id = j.id`
}()

// QueueList returns the pending jobs f selects in the scheduler's order as
// the last cycle decided it (jobs it did not plan last, by submission), with
// that cycle, in one statement. Limit: default 100, at most 1000.
func (s *Store) QueueList(ctx context.Context, f PriorityFilter) ([]QueuedJob, QueueCycle, error) {
	var cyc QueueCycle
	where, args := JobFilter{Teams: f.Teams, Team: f.Team, State: allot.JobPending, UserID: f.UserID}.where()
	switch {
	case f.Limit <= 0:
		f.Limit = 100
	case f.Limit > 1000:
		f.Limit = 1000
	}
	args = append(args, f.Limit)
	// The cycle comes with every row, read in the same statement.
	q := queueSelect + ` WHERE ` + strings.Join(where, " AND ") + fmt.Sprintf(" ORDER BY q.rank NULLS LAST, j.submitted_at, j.id LIMIT $%d", len(args))
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, cyc, mapErr("listing the queue", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueuedJob, error) {
		var mCycle *int64
		var rank, mPending *int
		var runAs, reason, kind *string
		var est, mAt *time.Time
		j, err := scanJob(decisionScan{r: r, extra: []any{&rank, &runAs, &reason, &est, &kind, &mCycle, &mAt, &mPending}})
		if err != nil {
			return QueuedJob{}, err
		}
		qj := QueuedJob{Job: j}
		if mCycle != nil {
			cyc = QueueCycle{ID: *mCycle, DecidedAt: *mAt, Pending: *mPending}
		}
		if rank != nil {
			d := &QueueDecision{JobID: j.ID, CycleID: cyc.ID, Rank: *rank, RunAs: allot.TierID(*runAs), Reason: *reason, EstKind: *kind, DecidedAt: cyc.DecidedAt}
			if est != nil {
				d.EstStart = *est
			}
			qj.Decision = d
		}
		return qj, nil
	})
	if err != nil {
		return nil, cyc, mapErr("listing the queue", err)
	}
	if len(out) == 0 {
		// No job to be consistent with: the cycle alone.
		cyc, err = s.LastQueueCycle(ctx)
	}
	return out, cyc, mapErr("listing the queue", err)
}

// LastQueueCycle returns the cycle the stored queue is from (ID 0: none).
func (s *Store) LastQueueCycle(ctx context.Context) (QueueCycle, error) {
	var c QueueCycle
	err := s.db.QueryRow(ctx, `SELECT cycle_id, decided_at, cardinality(job_ids) FROM queue_cycle`).Scan(&c.ID, &c.DecidedAt, &c.Pending)
	if err == pgx.ErrNoRows {
		return QueueCycle{}, nil
	}
	return c, mapErr("reading the last cycle", err)
}
