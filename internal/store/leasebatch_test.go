package store_test

import (
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// TestBatchedTakesAndStarts: one batched take takes every lease it can,
// refuses alone a lease the node does not hold or that has ended, is
// idempotent, and answers the start orders now due on the node: a
// single-node job's at once, a gang's only when its last member is taken
// (and the gang's other nodes then get theirs from their poll). The starts
// it answered are not sent again by a poll. A batched start report
// records each start as a single one would, refusing alone a lease whose
// state forbids it; a repeated one changes nothing.
func TestBatchedTakesAndStarts(t *testing.T) {
	b := setup(t)
	b.register(t, "gpu13", "GPU-a", "GPU-b")
	b.register(t, "gpu14", "GPU-c", "GPU-d")
	noah := b.user(t, "noah@example.com")
	submit := func(gpus, perNode int) int64 {
		t.Helper()
		j, err := b.st.SubmitJob(b.ctx, noah, allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: gpus, GPUsPerNode: perNode,
			TimeLimit: time.Hour, Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		return j.ID
	}
	for _, n := range []string{"gpu13", "gpu14"} {
		if _, err := b.pool.Exec(b.ctx, `UPDATE nodes SET state = 'up', last_heartbeat = $2 WHERE name = $1`, n, b.now); err != nil {
			t.Fatal(err)
		}
	}
	single, gangJob, ended := submit(1, 0), submit(2, 1), submit(1, 0)
	if err := b.st.InTx(b.ctx, func(tx *store.Store) error {
		_, err := tx.ApplyPlan(b.ctx, []store.StartOrder{
			{JobID: single, RunAs: allot.Tier3, Parts: []store.LeasePart{{Node: "gpu13", GPUs: []int{0}}}},
			{JobID: gangJob, RunAs: allot.Tier3, Parts: []store.LeasePart{{Node: "gpu13", GPUs: []int{1}}, {Node: "gpu14", GPUs: []int{0}}}},
			{JobID: ended, RunAs: allot.Tier3, Parts: []store.LeasePart{{Node: "gpu14", GPUs: []int{1}}}},
		}, nil, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	one, gang, gone := store.LeaseRef{JobID: single, Segment: 1}, store.LeaseRef{JobID: gangJob, Segment: 1}, store.LeaseRef{JobID: ended, Segment: 1}
	notHeld := store.LeaseRef{JobID: ended, Segment: 1} // gpu14's lease, asked for by gpu13
	for _, n := range []string{"gpu13", "gpu14"} {
		if _, err := b.st.TakeOrders(b.ctx, n); err != nil {
			t.Fatal(err)
		}
	}

	// gpu13 takes its single-node lease, its gang member, and one it does
	// not hold: the single job starts at once; the gang waits for gpu14.
	results, starts, err := b.st.TakeLeases(b.ctx, "gpu13", []store.LeaseRef{gang, notHeld, one})
	if err != nil {
		t.Fatal(err)
	}
	if results[0] != nil || allot.ErrorCode(results[1]) != allot.ENotFound || results[2] != nil {
		t.Fatalf("results %v, want [nil, not found, nil]", results)
	}
	if len(starts) != 1 || starts[0] != one {
		t.Fatalf("starts %v, want [%v]", starts, one)
	}
	if l := b.lease(t, gang, "gpu13"); l.State != "taken" {
		t.Errorf("gang member on gpu13: %+v, want taken", l)
	}
	if o, err := b.st.TakeOrders(b.ctx, "gpu13"); err != nil || len(o.Start) != 0 {
		t.Errorf("gpu13's next poll: starts %v (%v), want none (the take answered the single job's)", o.Start, err)
	}

	// gpu14's lease of `ended` is stopped and exits; its batch takes the
	// gang's last member (the start is due on both nodes) and is refused
	// the ended lease alone.
	if _, _, err := b.st.TakeLeases(b.ctx, "gpu14", []store.LeaseRef{gone}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.LeaseExited(b.ctx, "gpu14", gone, store.LeaseExit{ExitCode: 0, At: b.now}); err != nil {
		t.Fatal(err)
	}
	results, starts, err = b.st.TakeLeases(b.ctx, "gpu14", []store.LeaseRef{gone, gang})
	if err != nil {
		t.Fatal(err)
	}
	if allot.ErrorCode(results[0]) != allot.EConflict || results[1] != nil {
		t.Fatalf("results %v, want [conflict, nil]", results)
	}
	if len(starts) != 1 || starts[0] != gang {
		t.Fatalf("gpu14 starts %v, want [%v]", starts, gang)
	}
	if o, err := b.st.TakeOrders(b.ctx, "gpu13"); err != nil || len(o.Start) != 1 || o.Start[0] != gang {
		t.Errorf("gpu13's poll after the gang completed: starts %v (%v), want [%v]", o.Start, err, gang)
	}
	// Taking again is idempotent and sends no start twice.
	results, starts, err = b.st.TakeLeases(b.ctx, "gpu13", []store.LeaseRef{one, gang})
	if err != nil || results[0] != nil || results[1] != nil || len(starts) != 0 {
		t.Errorf("repeated take: %v, starts %v (%v), want no refusal and no start", results, starts, err)
	}

	// Starts: two recorded, one on a lease that has ended refused alone;
	// a repeated report only fills in the pid.
	res, err := b.st.LeasesStarted(b.ctx, "gpu13", []store.StartReport{{LeaseRef: one, PID: 11}, {LeaseRef: gang, PID: 12}})
	if err != nil || res[0] != nil || res[1] != nil {
		t.Fatalf("starts: %v (%v)", res, err)
	}
	res, err = b.st.LeasesStarted(b.ctx, "gpu14", []store.StartReport{{LeaseRef: gone, PID: 13}, {LeaseRef: gang, PID: 14}})
	if err != nil || allot.ErrorCode(res[0]) != allot.EConflict || res[1] != nil {
		t.Fatalf("gpu14 starts: %v (%v), want [conflict, nil]", res, err)
	}
	for _, c := range []struct {
		ref  store.LeaseRef
		node string
		pid  int
	}{{one, "gpu13", 11}, {gang, "gpu13", 12}, {gang, "gpu14", 14}} {
		if l := b.lease(t, c.ref, c.node); l.State != "running" || l.PID == nil || *l.PID != c.pid || l.StartedAt == nil {
			t.Errorf("%v on %s: %+v, want running with pid %d", c.ref, c.node, l, c.pid)
		}
	}
	if res, err := b.st.LeasesStarted(b.ctx, "gpu13", []store.StartReport{{LeaseRef: one, PID: 99}}); err != nil || res[0] != nil {
		t.Errorf("a repeated start report: %v (%v)", res, err)
	}
	if l := b.lease(t, one, "gpu13"); l.State != "running" || *l.PID != 11 {
		t.Errorf("after a repeated start report: %+v, want running with pid 11 still", l)
	}
	if l := b.lease(t, gone, "gpu14"); l.State != "exited" {
		t.Errorf("the ended lease: %+v, want exited still", l)
	}
}
