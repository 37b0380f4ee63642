package jobs_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestCyclesKilledMidwayLoseNothing runs scheduling cycles from two
// "workers" at once while one of them is killed at random points of its
// transaction (its context is cancelled, as when a process dies: the
// database rolls back). No GPU may end up in two active allocations, every
// job must still be pending or running, and every running job must hold
// exactly its GPUs.
func TestCyclesKilledMidwayLoseNothing(t *testing.T) {
	ctx := context.Background()
	st, pool := seeded(t, "")
	admin, err := st.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{1, 1, 2, 4, 8, 16}
	for i := range 150 {
		spec := allot.JobSpec{Name: fmt.Sprintf("j%d", i), Team: []string{"fraud", "recs", "nlp"}[i%3], Tier: allot.Tier3,
			GPUs: sizes[rng.IntN(len(sizes))], TimeLimit: time.Hour, Command: []string{"true"}}
		if _, err := st.SubmitJob(ctx, &admin, spec); err != nil {
			t.Fatal(err)
		}
	}
	var total int
	pool.QueryRow(ctx, `SELECT count(*) FROM jobs`).Scan(&total) //nolint:errcheck

	a := &jobs.Scheduler{Store: st, CheckpointRoot: "/tmp"}
	b := &jobs.Scheduler{Store: st, CheckpointRoot: "/tmp"}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the worker that keeps dying
		defer wg.Done()
		for i := range 60 {
			cctx, cancel := context.WithTimeout(ctx, time.Duration(i%15)*time.Millisecond)
			a.Cycle(cctx) //nolint:errcheck // killed cycles fail; that is the point
			cancel()
		}
	}()
	go func() { // a healthy worker, racing it
		defer wg.Done()
		for range 30 {
			if _, err := b.Cycle(ctx); err != nil && allot.ErrorCode(err) != allot.EConflict {
				t.Errorf("healthy cycle: %v", err)
			}
			// Jobs finish now and then, so there is always work to place.
			pool.Exec(ctx, `WITH done AS (SELECT id FROM jobs WHERE state = 'running' ORDER BY random() LIMIT 3)
				UPDATE allocations SET released_at = $1 WHERE released_at IS NULL AND job_id IN (SELECT id FROM done)`, clock.Now()) //nolint:errcheck
			pool.Exec(ctx, `UPDATE jobs SET state = 'completed', ended_at = $1 WHERE state = 'running'
				AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.job_id = jobs.id AND a.released_at IS NULL)`, clock.Now()) //nolint:errcheck
		}
	}()
	wg.Wait()
	// A killed cycle's backend may still hold the cycle lock for a moment
	// after its client gave up, and a cycle that finds it held does
	// nothing (Ran false, no error). On a loaded machine CI saw 0 jobs
	// started: the healthy worker's cycles, and the one after them, most
	// likely all found the lock held. The last cycle is retried until it
	// runs, once the database has rolled the killed ones back.
	deadline := time.Now().Add(30 * time.Second) // a deadline for PostgreSQL's rollbacks, not product time
	for {
		res, err := b.Cycle(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Ran {
			break
		}
		if time.Now().After(deadline) { // the same deadline
			t.Fatal("the cycle lock stayed held 30 s after every killed cycle ended")
		}
		time.Sleep(50 * time.Millisecond)
	}

	var doubled, lost, wrong, orphanLeases, started int
	pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT node, gpu_index FROM allocations WHERE released_at IS NULL GROUP BY 1, 2 HAVING count(*) > 1) d`).Scan(&doubled) //nolint:errcheck
	pool.QueryRow(ctx, `SELECT $1 - count(*) FILTER (WHERE state IN ('pending', 'running', 'completed', 'failed')) FROM jobs`, total).Scan(&lost)                     //nolint:errcheck
	pool.QueryRow(ctx, `SELECT count(*) FROM jobs j WHERE state = 'running' AND j.gpus <> (SELECT count(*) FROM allocations a
		WHERE a.job_id = j.id AND a.released_at IS NULL AND a.segment = j.segment)`).Scan(&wrong) //nolint:errcheck
	pool.QueryRow(ctx, `SELECT count(*) FROM leases l JOIN jobs j ON j.id = l.job_id WHERE l.segment > j.segment`).Scan(&orphanLeases) //nolint:errcheck
	pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE segment > 0`).Scan(&started)                                                   //nolint:errcheck
	if doubled != 0 || lost != 0 || wrong != 0 || orphanLeases != 0 {
		t.Errorf("doubly allocated GPUs %d, lost jobs %d, running jobs with the wrong GPU count %d, leases of rolled-back starts %d", doubled, lost, wrong, orphanLeases)
	}
	if started < 20 {
		t.Errorf("only %d jobs ever started: the cycles did not do their work", started)
	}
}

// TestUntakenOffersExpire: when a node never takes its lease, the start is
// undone after the deadline: GPUs released, the job pending again.
func TestUntakenOffersExpire(t *testing.T) {
	ctx := context.Background()
	st, pool := seeded(t, "gpu13")
	if _, err := (&jobs.Scheduler{Store: st}).Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	var offered []int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(job_id ORDER BY job_id), '{}') FROM leases WHERE node = 'gpu13' AND state = 'offered'`).Scan(&offered); err != nil || len(offered) == 0 {
		t.Fatalf("no offer on gpu13: %v", err)
	}
	id := offered[0]
	// One deadline for every node, no resend.
	expire := func(cutoff time.Time) ([]int64, error) {
		return st.ExpireStaleOffers(ctx, store.OfferDeadlines{Silent: cutoff, Live: cutoff})
	}
	if got, err := expire(st.Now().Add(-time.Minute)); err != nil || len(got) != 0 {
		t.Fatalf("fresh offer expired: %v %v", got, err)
	}
	got, err := expire(st.Now().Add(time.Minute))
	if err != nil || fmt.Sprint(got) != fmt.Sprint(offered) {
		t.Fatalf("ExpireStaleOffers = %v, %v; want %v", got, err, offered)
	}
	j, err := st.GetJob(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var held int
	pool.QueryRow(ctx, `SELECT count(*) FROM allocations WHERE job_id = $1 AND released_at IS NULL`, id).Scan(&held) //nolint:errcheck
	if j.State != allot.JobPending || held != 0 || !strings.Contains(j.PendingReason, "did not take") {
		t.Errorf("after expiry: state %s, %d GPUs held, reason %q", j.State, held, j.PendingReason)
	}
}

// TestOverBudgetJobsSayWhy: a tier-3 job of a team that went over its
// budget after submission waits as preemptible, and its reason says so.
func TestOverBudgetJobsSayWhy(t *testing.T) {
	ctx := context.Background()
	st, pool := seededAt(t, "-", demo.StoryClock(clock.Now))
	noah, err := st.UserByEmail(ctx, "noah@example.com")
	if err != nil {
		t.Fatal(err)
	}
	pool.Exec(ctx, `UPDATE teams SET monthly_budget_gpu_hours = 1000000 WHERE slug = 'nlp'`) //nolint:errcheck
	j, err := st.SubmitJob(ctx, &noah, allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 8, TimeLimit: time.Hour, Command: []string{"true"}})
	if err != nil || j.Preemptible {
		t.Fatalf("submit: %+v %v", j, err)
	}
	pool.Exec(ctx, `UPDATE teams SET monthly_budget_gpu_hours = 10 WHERE slug = 'nlp'`) //nolint:errcheck
	if _, err := (&jobs.Scheduler{Store: st}).Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := st.GetJob(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got.PendingReason, "over 100 % of its monthly budget") || got.Breakdown.Class != 5 {
		t.Errorf("reason %q, class %d", got.PendingReason, got.Breakdown.Class)
	}
}

// TestAgentRestartEndsLostLeases: an agent that comes back without a job it
// was running (it crashed) gets that lease ended at registration: the GPUs
// are released and the job goes back to the queue or fails.
func TestAgentRestartEndsLostLeases(t *testing.T) {
	ctx := context.Background()
	st, pool := seeded(t, "gpu13")
	if _, err := (&jobs.Scheduler{Store: st}).Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	var ref store.LeaseRef
	if err := pool.QueryRow(ctx, `SELECT job_id, segment FROM leases WHERE node = 'gpu13' ORDER BY job_id LIMIT 1`).Scan(&ref.JobID, &ref.Segment); err != nil {
		t.Fatal(err)
	}
	if err := st.TakeLease(ctx, "gpu13", ref); err != nil {
		t.Fatal(err)
	}
	if err := st.LeaseStarted(ctx, "gpu13", ref, 4242); err != nil {
		t.Fatal(err)
	}
	inv := store.NodeInventory{Hostname: "gpu13", GPUs: []store.NodeGPU{}}
	for i := range 8 {
		inv.GPUs = append(inv.GPUs, store.NodeGPU{Index: i, UUID: fmt.Sprint("GPU-", i), Model: "T4"})
	}
	if _, err := st.RegisterNode(ctx, "gpu13", inv); err != nil { // the job is not in inv.Running
		t.Fatal(err)
	}
	// Its exit report may still come; without one, the stop ends it.
	if n, err := st.EndUnconfirmedStops(ctx, st.Now().Add(-time.Minute)); err != nil || n != 0 {
		t.Fatalf("ended %d leases too early (%v)", n, err)
	}
	if n, err := st.EndUnconfirmedStops(ctx, st.Now().Add(time.Minute)); err != nil || n != 1 {
		t.Fatalf("EndUnconfirmedStops = %d, %v; want 1", n, err)
	}
	j, err := st.GetJob(ctx, ref.JobID)
	if err != nil {
		t.Fatal(err)
	}
	var held int
	pool.QueryRow(ctx, `SELECT count(*) FROM allocations WHERE job_id = $1 AND released_at IS NULL`, ref.JobID).Scan(&held) //nolint:errcheck
	if j.State == allot.JobRunning || held != 0 {
		t.Errorf("after the agent restarted without it: job %s, %d GPUs still held", j.State, held)
	}
}

// seeded returns a store on a fresh database with the demo organisation,
// with the named nodes up as if their agents had registered ("" = all).
func seeded(t *testing.T, nodes string) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	return seededAt(t, nodes, nil)
}

// seededAt is seeded on the clock now (nil: the test clock).
func seededAt(t *testing.T, nodes string, now func() time.Time) (*store.Store, *pgxpool.Pool) {
	t.Helper()
	t.Parallel()
	ctx := context.Background()
	pool := storetest.Pool(t)
	st := store.New(pool)
	if now != nil {
		st.Now = now
	}
	if err := demo.Seed(ctx, st); err != nil {
		t.Fatal(err)
	}
	if nodes != "-" {
		if _, err := pool.Exec(ctx, `UPDATE nodes SET state = 'up', registered_at = $2, last_heartbeat = $2 WHERE $1 = '' OR name = $1`, nodes, st.Now()); err != nil {
			t.Fatal(err)
		}
	}
	return st, pool
}

// TestCycleStartsAtMostMaxStarts: a cycle that could start many jobs
// starts MaxStarts of them, in priority order; the others stay pending,
// saying they start next cycle, and the following cycles start them
// until none is deferred. No GPU is in two allocations meanwhile.
func TestCycleStartsAtMostMaxStarts(t *testing.T) {
	ctx := context.Background()
	st, pool := seeded(t, "")
	admin, err := st.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		spec := allot.JobSpec{Name: fmt.Sprintf("small%d", i), Team: "recs", Tier: allot.Tier3, GPUs: 1, GPUType: "T4",
			TimeLimit: time.Hour, Command: []string{"true"}}
		if _, err := st.SubmitJob(ctx, &admin, spec); err != nil {
			t.Fatal(err)
		}
	}
	s := &jobs.Scheduler{Store: st, MaxStarts: 5}
	res, err := s.Cycle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Started != 5 || res.Deferred == 0 {
		t.Fatalf("first cycle started %d, deferred %d; want 5 and some deferred", res.Started, res.Deferred)
	}
	var reasons int
	pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE state = 'pending' AND pending_reason LIKE 'ready to start: the last cycle started the 5 jobs ahead of it%'`).Scan(&reasons) //nolint:errcheck
	if reasons != res.Deferred {
		t.Errorf("%d pending jobs say they start next cycle; %d were deferred", reasons, res.Deferred)
	}
	// Priority order: no deferred job outranks a started one of the cycle.
	var inverted int
	pool.QueryRow(ctx, `SELECT count(*) FROM jobs d, jobs s WHERE d.pending_reason LIKE 'ready to start:%' AND s.state = 'running'
		AND d.priority > s.priority AND d.tier = s.tier AND d.team = s.team`).Scan(&inverted) //nolint:errcheck
	if inverted != 0 {
		t.Errorf("%d deferred jobs outrank a started one of their team and tier", inverted)
	}
	total := res.Started
	for i := 0; res.Deferred > 0; i++ {
		if i > 40 {
			t.Fatalf("still %d deferred after %d cycles", res.Deferred, i)
		}
		if res, err = s.Cycle(ctx); err != nil {
			t.Fatal(err)
		}
		if res.Started > 5 {
			t.Fatalf("a cycle started %d jobs, over its 5", res.Started)
		}
		total += res.Started
	}
	var doubled int
	pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT node, gpu_index FROM allocations WHERE released_at IS NULL GROUP BY 1, 2 HAVING count(*) > 1) d`).Scan(&doubled) //nolint:errcheck
	if doubled != 0 || total <= 5 {
		t.Errorf("%d GPUs doubly allocated, %d started in all", doubled, total)
	}
}
