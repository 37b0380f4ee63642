package jobs_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
)

// TestCycleStoresItsQueue runs real cycles on one T4 node (gpu13) and
// reads back what each stored: a job waiting behind a running one gets
// the scheduler's estimate (its time limit's end), a tier-1 job that
// preempts is told it starts by preemption when its victim's grace period
// ends (the grace end the stop recorded), ranks follow the scheduler's
// class order, and jobs that leave the queue (cancelled, started) lose
// their rows.
func TestCycleStoresItsQueue(t *testing.T) {
	ctx := context.Background()
	st, pool := seeded(t, "gpu13")
	if _, err := pool.Exec(ctx, `UPDATE jobs SET state = 'cancelled', ended_at = submitted_at WHERE state = 'pending'`); err != nil {
		t.Fatal(err)
	}
	admin, err := st.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	submit := func(name string, tier allot.TierID, gpus int, limit time.Duration) int64 {
		t.Helper()
		j, err := st.SubmitJob(ctx, &admin, allot.JobSpec{Name: name, Team: "recs", Tier: tier, GPUs: gpus, GPUType: "T4", TimeLimit: limit, Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	s := &jobs.Scheduler{Store: st}
	cycle := func() int64 {
		t.Helper()
		if _, err := s.Cycle(ctx); err != nil {
			t.Fatal(err)
		}
		var id int64
		if err := pool.QueryRow(ctx, `SELECT max(id) FROM scheduling_cycles`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	decision := func(id, cycleID int64) *store.QueueDecision {
		t.Helper()
		q, err := st.JobQueueOf(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if q.Cycle.ID != cycleID {
			t.Fatalf("job %d: the queue is from cycle %d, want %d", id, q.Cycle.ID, cycleID)
		}
		return q.Decision
	}

	low := submit("low", allot.Tier3, 8, 4*time.Hour)
	c := cycle()
	var startedAt time.Time
	if err := pool.QueryRow(ctx, `SELECT started_at FROM jobs WHERE id = $1 AND state = 'running'`, low).Scan(&startedAt); err != nil {
		t.Fatalf("the tier-3 job did not start: %v", err)
	}
	if d := decision(low, c); d != nil {
		t.Errorf("a started job has a queue row: %+v", d)
	}
	// It has run for an hour (past the policy's minimum runtime, so that it
	// may be preempted).
	startedAt = startedAt.Add(-time.Hour)
	for _, q := range []string{`UPDATE jobs SET submitted_at = $2, started_at = $2 WHERE id = $1`, `UPDATE allocations SET started_at = $2 WHERE job_id = $1`,
		`UPDATE leases SET state = 'running', taken_at = $2, started_at = $2 WHERE job_id = $1`} {
		if _, err := pool.Exec(ctx, q, low, startedAt); err != nil {
			t.Fatal(err)
		}
	}
	wait := submit("wait", allot.Tier4, 4, time.Hour)
	gone := submit("gone", allot.Tier4, 2, time.Hour)
	c = cycle()
	d := decision(wait, c)
	if d == nil || d.Rank != 1 || !near(d.EstStart, startedAt.Add(4*time.Hour)) || d.EstKind == "" || d.EstKind == store.EstPreemption {
		t.Fatalf("a job behind a 4 h job: %+v, want rank 1, a start at %v", d, startedAt.Add(4*time.Hour))
	}
	if g := decision(gone, c); g == nil || g.Rank != 2 {
		t.Fatalf("second job: %+v", g)
	}
	if _, err := st.CancelJob(ctx, &admin, gone); err != nil {
		t.Fatal(err)
	}

	// A tier-1 job needs the whole node: it preempts the tier-3 job and is
	// told it starts when the victim's grace period ends.
	hi := submit("incident", allot.Tier1, 8, time.Hour)
	c = cycle()
	var graceEnd time.Time
	if err := pool.QueryRow(ctx, `SELECT stop_requested_at + stop_grace_s * interval '1 second' FROM leases
		WHERE job_id = $1 AND stop_requested_at IS NOT NULL`, low).Scan(&graceEnd); err != nil {
		q, _ := st.JobQueueOf(ctx, hi)
		t.Fatalf("the tier-3 job was not preempted: %v; the tier-1 job: %+v", err, q.Decision)
	}
	for range 2 { // the cycle that preempted, and the next (victim in its grace period)
		d = decision(hi, c)
		if d == nil || d.Rank != 1 || d.RunAs != allot.Tier1 || d.EstKind != store.EstPreemption || !near(d.EstStart, graceEnd) {
			t.Fatalf("cycle %d: the preempting tier-1 job: %+v, want rank 1, a start by preemption at %v", c, d, graceEnd)
		}
		if w := decision(wait, c); w == nil || w.Rank != 2 {
			t.Fatalf("cycle %d: the tier-4 job behind it: %+v", c, w)
		}
		if g := decision(gone, c); g != nil {
			t.Errorf("cycle %d: a cancelled job still has a row: %+v", c, g)
		}
		c = cycle()
	}
	if !strings.Contains(d.Reason, "preempt") {
		t.Errorf("reason %q does not say it preempts", d.Reason)
	}

	// The victim's processes end: the tier-1 job starts and leaves the queue.
	if _, err := pool.Exec(ctx, `UPDATE allocations SET released_at = $2 WHERE job_id = $1 AND released_at IS NULL`, low, st.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE jobs SET state = 'pending' WHERE id = $1`, low); err != nil {
		t.Fatal(err)
	}
	c = cycle()
	if err := pool.QueryRow(ctx, `SELECT 1 FROM jobs WHERE id = $1 AND state = 'running'`, hi).Scan(new(int)); err != nil {
		t.Fatalf("the tier-1 job did not start: %v", err)
	}
	if d := decision(hi, c); d != nil {
		t.Errorf("the started tier-1 job still has a row: %+v", d)
	}
	var n int
	pool.QueryRow(ctx, `SELECT count(*) FROM queue_decisions WHERE cycle_id = $1`, c).Scan(&n) //nolint:errcheck
	if d := decision(low, c); d == nil || n != 2 {
		t.Errorf("the requeued job %+v; %d rows, want 2 (it and the tier-4 job)", d, n)
	}
	sh, err := st.LastShares(ctx)
	if err != nil || sh.CycleID != c || len(sh.Teams) < 3 || sh.Teams["recs"].NormShares <= 0 {
		t.Errorf("the cycle's shares: %+v %v", sh, err)
	}
}

// near: the core keeps times on a whole-second grid.
func near(a, b time.Time) bool { return a.Sub(b).Abs() < time.Second }
