package store_test

import (
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/health"
	"github.com/allotlabs/allot/internal/store"
)

// TestHealthBookkeepingDoesNotWaitForCycle: while a scheduling cycle that
// places a job on a node has not committed, the node's heartbeats still
// evaluate health when all they write is bookkeeping (here the first
// heartbeat's "passing since"), but a heartbeat whose rule drains the node
// waits for the cycle and then sees its job: the node is draining, not
// drained with a job on it.
func TestHealthBookkeepingDoesNotWaitForCycle(t *testing.T) {
	b := setup(t)
	order := b.startOn(t, "gpu16")
	if _, err := b.pool.Exec(b.ctx, `UPDATE nodes SET health_ok_since = NULL WHERE name = 'gpu16'`); err != nil {
		t.Fatal(err)
	}
	applied, release := make(chan error, 1), make(chan struct{})
	cycleDone := make(chan error, 1)
	go func() {
		cycleDone <- b.st.InTx(b.ctx, func(tx *store.Store) error {
			_, err := tx.ApplyPlan(b.ctx, []store.StartOrder{order}, nil, nil)
			applied <- err
			<-release // the cycle has not committed yet
			return err
		})
	}()
	if err := <-applied; err != nil {
		close(release)
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	ok := make([]health.GPU, 8)
	for i := range ok {
		ok[i].Index = i
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.st.EvaluateHealth(b.ctx, "gpu16", ok, "")
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a heartbeat that only records that the node passes waited for the cycle")
	}
	var since *time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT health_ok_since FROM nodes WHERE name = 'gpu16'`).Scan(&since); err != nil || since == nil {
		t.Fatalf("passing since not recorded (%v)", err)
	}

	// A double-bit ECC error drains: that waits for the cycle.
	bad := append([]health.GPU(nil), ok...)
	bad[2].ECCDBE = 1
	drained := make(chan struct{})
	var out store.HealthOutcome
	var evalErr error
	go func() {
		defer close(drained)
		out, evalErr = b.st.EvaluateHealth(b.ctx, "gpu16", bad, "")
	}()
	waited := b.waitForLockWait(t, drained)
	close(release)
	released = true
	if err := <-cycleDone; err != nil {
		t.Fatal(err)
	}
	<-drained
	if evalErr != nil {
		t.Fatal(evalErr)
	}
	if !waited || len(out.Fired) != 1 || out.State != allot.NodeDraining {
		t.Fatalf("drain waited for the cycle: %v; fired %v, state %s, want one event and draining (the cycle's job runs there)", waited, out.Fired, out.State)
	}
}
