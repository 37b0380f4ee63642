package store_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// queueJobs cancels the demo's queue and submits n pending jobs of nlp
// (tier 3, alternately A100 and any type).
func queueJobs(t *testing.T, b bundle, n int) []int64 {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `UPDATE jobs SET state = 'cancelled', ended_at = submitted_at WHERE state = 'pending'`); err != nil {
		t.Fatal(err)
	}
	noah := b.user(t, "noah@example.com")
	var ids []int64
	for i := range n {
		spec := allot.JobSpec{Name: fmt.Sprintf("q%d", i), Team: "nlp", Tier: allot.Tier3, GPUs: 1 + i%4, TimeLimit: time.Hour, Command: []string{"true"}}
		if i%2 == 0 {
			spec.GPUType = "A100-80GB"
		}
		j, err := b.st.SubmitJob(b.ctx, noah, spec)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	return ids
}

// applyQueue stores a cycle's queue: ids in that order, the first with a
// reservation, as a cycle does (ApplyPlan, RecordShares, RecordCycle in
// one transaction).
func applyQueue(b bundle, ids []int64, est time.Time, block func()) error {
	return b.st.InTx(b.ctx, func(tx *store.Store) error {
		var pending []store.PendingUpdate
		for i, id := range ids {
			p := store.PendingUpdate{JobID: id, Priority: float64(1000 - i), Breakdown: allot.PriorityBreakdown{Class: 3}, Reason: fmt.Sprintf("reason %d of %d", i+1, len(ids))}
			if i == 0 {
				p.EstStart, p.EstKind = est, store.EstReservation
				p.Breakdown.Class = 5
			}
			pending = append(pending, p)
		}
		if _, err := tx.ApplyPlan(b.ctx, nil, nil, pending); err != nil {
			return err
		}
		if err := tx.RecordShares(b.ctx, []store.TeamShare{{Team: "nlp", NormShares: 0.5, RawUsage: float64(len(ids)), EffectiveUsage: 0.25, FairShare: 0.7}}); err != nil {
			return err
		}
		if block != nil {
			block()
		}
		return tx.RecordCycle(b.ctx, b.now, time.Millisecond, len(ids), store.ApplyResult{}, "applied")
	})
}

// TestQueueStoredByCycle: a cycle's queue is stored in its order with
// its estimates, under the id of its scheduling_cycles row; a job the
// next cycle does not list (started, cancelled) loses its row.
func TestQueueStoredByCycle(t *testing.T) {
	b := setup(t)
	ids := queueJobs(t, b, 4)
	q, err := b.st.JobQueueOf(b.ctx, ids[0])
	if err != nil || q.Cycle.ID != 0 || q.Decision != nil {
		t.Fatalf("before any cycle: %+v %v", q, err)
	}
	est := b.now.Add(90 * time.Minute)
	order := []int64{ids[2], ids[0], ids[3], ids[1]}
	if err := applyQueue(b, order, est, nil); err != nil {
		t.Fatal(err)
	}
	var cycleID int64
	if err := b.pool.QueryRow(b.ctx, `SELECT max(id) FROM scheduling_cycles`).Scan(&cycleID); err != nil {
		t.Fatal(err)
	}
	for rank, id := range order {
		q, err := b.st.JobQueueOf(b.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		d := q.Decision
		if d == nil || d.Rank != rank+1 || d.CycleID != cycleID || q.Cycle.ID != cycleID || q.Cycle.Pending != 4 || !q.Cycle.DecidedAt.Equal(b.now) ||
			d.Reason != fmt.Sprintf("reason %d of 4", rank+1) {
			t.Fatalf("job %d (rank %d): %+v decision %+v; cycle %d", id, rank+1, q, d, cycleID)
		}
		if rank == 0 && (!d.EstStart.Equal(est) || d.EstKind != store.EstReservation || d.RunAs != allot.TierPreemptible) {
			t.Errorf("head: estimate %v %q run as %q", d.EstStart, d.EstKind, d.RunAs)
		}
		if rank > 0 && (!d.EstStart.IsZero() || d.EstKind != "" || d.RunAs != allot.Tier3) {
			t.Errorf("rank %d: estimate %v %q run as %q", rank+1, d.EstStart, d.EstKind, d.RunAs)
		}
	}
	// ids[0] (A100) competes with ids[2] (A100, ahead) and the any-type
	// jobs; ids[1] (any type) with every job.
	q, _ = b.st.JobQueueOf(b.ctx, ids[0])
	if q.TypeRank != 2 || q.TypeOf != 4 || q.AheadGPUSeconds != 3*3600 {
		t.Errorf("A100 job among competitors: %d of %d, %d GPU-s ahead", q.TypeRank, q.TypeOf, q.AheadGPUSeconds)
	}
	list, cyc, err := b.st.QueueList(b.ctx, store.PriorityFilter{})
	if err != nil || cyc.ID != cycleID || len(list) != 4 {
		t.Fatalf("list: %d jobs, cycle %+v, %v", len(list), cyc, err)
	}
	for i, j := range list {
		if j.ID != order[i] || j.Decision == nil || j.Decision.Rank != i+1 {
			t.Errorf("list[%d] = job %d %+v, want job %d", i, j.ID, j.Decision, order[i])
		}
	}
	sh, err := b.st.LastShares(b.ctx)
	if err != nil || sh.CycleID != cycleID || sh.Teams["nlp"].FairShare != 0.7 || len(sh.Teams) != 1 {
		t.Errorf("shares: %+v %v", sh, err)
	}

	// The next cycle lists ids[3] no more (it started, or was cancelled);
	// a job submitted since has not been through one.
	if err := applyQueue(b, []int64{ids[1], ids[2], ids[0]}, est, nil); err != nil {
		t.Fatal(err)
	}
	if q, _ := b.st.JobQueueOf(b.ctx, ids[3]); q.Decision != nil || q.Cycle.ID != cycleID+1 || q.Cycle.Pending != 3 {
		t.Errorf("a job the cycle dropped: %+v %+v", q, q.Decision)
	}
	if n := b.count(t, "queue_decisions"); n != 3 {
		t.Errorf("%d stored decisions, want 3", n)
	}
	if q, _ := b.st.JobQueueOf(b.ctx, ids[1]); q.Decision == nil || q.Decision.Rank != 1 || q.Decision.CycleID != cycleID+1 {
		t.Errorf("new head: %+v", q.Decision)
	}
	late, err := b.st.SubmitJob(b.ctx, b.user(t, "noah@example.com"), allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Hour, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if q, err := b.st.JobQueueOf(b.ctx, late.ID); err != nil || q.Decision != nil || q.Cycle.ID != cycleID+1 {
		t.Errorf("a job submitted after the cycle: %+v %v", q, err)
	}
	if list, _, _ := b.st.QueueList(b.ctx, store.PriorityFilter{}); len(list) != 5 || list[3].ID != ids[3] || list[3].Decision != nil || list[4].ID != late.ID || list[4].Decision != nil {
		t.Errorf("unranked jobs come last: %+v", list)
	}
}

// TestQueueReadDuringCycleSeesOneCycle: a reader never sees a
// half-written queue. While a cycle's transaction has replaced the queue
// but not committed, readers see the previous cycle's whole; after, the
// new one's whole; and readers racing many cycles always see every row of
// one cycle (ranks 1..n of that cycle's order, its id on every row).
func TestQueueReadDuringCycleSeesOneCycle(t *testing.T) {
	b := setup(t)
	ids := queueJobs(t, b, 6)
	rev := []int64{ids[5], ids[4], ids[3], ids[2], ids[1]} // 5 jobs, reversed, without ids[0]
	if err := applyQueue(b, ids, b.now.Add(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	first, err := b.st.LastQueueCycle(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, wantCycle int64, want []int64) {
		t.Helper()
		list, cyc, err := b.st.QueueList(b.ctx, store.PriorityFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if cyc.ID != wantCycle || cyc.Pending != len(want) {
			t.Fatalf("%s: cycle %+v, want %d with %d jobs", what, cyc, wantCycle, len(want))
		}
		for i, id := range want {
			if list[i].ID != id || list[i].Decision == nil || list[i].Decision.Rank != i+1 || list[i].Decision.CycleID != wantCycle {
				t.Fatalf("%s: list[%d] = job %d %+v, want job %d of cycle %d", what, i, list[i].ID, list[i].Decision, id, wantCycle)
			}
		}
		q, err := b.st.JobQueueOf(b.ctx, ids[0])
		if err != nil || q.Cycle.ID != wantCycle || (q.Decision != nil) != slices.Contains(want, ids[0]) {
			t.Fatalf("%s: job page's read %+v %v", what, q, err)
		}
	}
	written, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- applyQueue(b, rev, b.now.Add(time.Hour), func() { close(written); <-release })
	}()
	<-written
	check("during the cycle", first.ID, ids)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	check("after the cycle", first.ID+1, rev)

	// Racing: one writer alternates the two queues, readers check each read.
	orders := [][]int64{ids, rev}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 20 {
			if err := applyQueue(b, orders[i%2], b.now.Add(time.Hour), nil); err != nil {
				t.Error(err)
				return
			}
		}
		close(stop)
	}()
	reads := 0
	for {
		select {
		case <-stop:
		default:
			list, cyc, err := b.st.QueueList(b.ctx, store.PriorityFilter{})
			if err != nil {
				t.Fatal(err)
			}
			want := orders[0]
			if cyc.Pending == 5 {
				want = orders[1]
			}
			if len(list) != 6 || (cyc.Pending == 5) != (list[5].Decision == nil) {
				t.Fatalf("read %d: %d jobs listed, the cycle had %d", reads, len(list), cyc.Pending)
			}
			for i, j := range list[:cyc.Pending] {
				if j.ID != want[i] || j.Decision == nil || j.Decision.Rank != i+1 || j.Decision.CycleID != cyc.ID {
					t.Fatalf("read %d: list[%d] = job %d %+v in cycle %d: a half-written queue", reads, i, j.ID, j.Decision, cyc.ID)
				}
			}
			reads++
			continue
		}
		break
	}
	wg.Wait()
	if reads == 0 {
		t.Error("no read raced the cycles")
	}
}
