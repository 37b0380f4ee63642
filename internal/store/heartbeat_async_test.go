package store_test

import (
	"testing"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/health"
	"github.com/allotlabs/allot/internal/store"
)

// TestRecordHeartbeatAsync: the asynchronous-commit heartbeat records what
// RecordHeartbeat records (the node's last heartbeat, one sample per GPU),
// refuses an unregistered node the same way, and its synchronous_commit
// setting stays inside its own transaction: the connection it ran on
// commits synchronously afterwards.
func TestRecordHeartbeatAsync(t *testing.T) {
	b := setup(t)
	b.register(t, "gpu13", "GPU-a", "GPU-b")
	// One connection, so "afterwards" is the same session.
	pc, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	conn := pc.Conn()
	st := store.New(conn)
	st.Now = b.st.Now
	samples := []store.GPUSample{{Index: 0, UtilPct: 50, MemTotalMiB: 16384}, {Index: 1, UtilPct: 75, MemTotalMiB: 16384}}
	out, err := st.RecordHeartbeatAsync(b.ctx, "gpu13", samples, "")
	if err != nil {
		t.Fatal(err)
	}
	if out.State != allot.NodeUp {
		t.Errorf("state %q, want up", out.State)
	}
	var n int
	if err := conn.QueryRow(b.ctx, `SELECT count(*) FROM gpu_samples WHERE node = 'gpu13' AND at = $1`, b.now).Scan(&n); err != nil || n != 2 {
		t.Errorf("%d samples at the heartbeat's time (%v), want 2", n, err)
	}
	var hb bool
	if err := conn.QueryRow(b.ctx, `SELECT last_heartbeat = $1 FROM nodes WHERE name = 'gpu13'`, b.now).Scan(&hb); err != nil || !hb {
		t.Errorf("last heartbeat not recorded (%v)", err)
	}
	var sc string
	if err := conn.QueryRow(b.ctx, `SHOW synchronous_commit`).Scan(&sc); err != nil || sc != "on" {
		t.Errorf("synchronous_commit is %q afterwards (%v), want on", sc, err)
	}
	// gpu14 never registered: refused, nothing written.
	if _, err := st.RecordHeartbeatAsync(b.ctx, "gpu14", samples, ""); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("unregistered node: %v, want not found", err)
	}
	if err := conn.QueryRow(b.ctx, `SELECT count(*) FROM gpu_samples WHERE node = 'gpu14'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d samples of the unregistered node (%v)", n, err)
	}
}

// TestRecordHeartbeatRound: the heartbeat sent as one batch records the
// node's last heartbeat and one sample per GPU, confirms the leases it
// lists (seen now, their statistics), kills what the node does not run,
// evaluates health on what it read (a double-bit ECC error drains the
// node in the same heartbeat), refuses a node marked down (its leases
// untouched) and an unregistered node the same way as RecordHeartbeat,
// and leaves the pool's connections committing
// synchronously.
func TestRecordHeartbeatRound(t *testing.T) {
	b := setup(t)
	b.register(t, "gpu13", "GPU-a", "GPU-b")
	order := b.startOn(t, "gpu13")
	if err := b.st.InTx(b.ctx, func(tx *store.Store) error {
		_, err := tx.ApplyPlan(b.ctx, []store.StartOrder{order}, nil, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ref := store.LeaseRef{JobID: order.JobID, Segment: 1}
	if err := b.st.TakeLease(b.ctx, "gpu13", ref); err != nil {
		t.Fatal(err)
	}
	if err := b.st.LeaseStarted(b.ctx, "gpu13", ref, 4242); err != nil {
		t.Fatal(err)
	}
	samples := []store.GPUSample{{Index: 0, UtilPct: 50, MemTotalMiB: 16384}, {Index: 1, UtilPct: 75, MemTotalMiB: 16384}}
	stats := []store.JobStat{{JobID: order.JobID, Segment: 1, CPUSeconds: 12.5, RSSBytes: 1 << 20}, {JobID: 999999, Segment: 1}}
	r, err := b.st.RecordHeartbeatRound(b.ctx, "gpu13", samples, stats, []health.GPU{{Index: 0}, {Index: 1}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if r.Beat.State != allot.NodeUp || r.Health.State != allot.NodeUp || len(r.Orphans) != 1 || r.Orphans[0].JobID != 999999 {
		t.Errorf("round: %+v, want the node up and job 999999 killed", r)
	}
	var n int
	var seen bool
	var cpu float64
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM gpu_samples WHERE node = 'gpu13' AND at = $1),
		(SELECT seen_at = $1 FROM leases WHERE job_id = $2), (SELECT cpu_seconds FROM leases WHERE job_id = $2)`, b.now, order.JobID).Scan(&n, &seen, &cpu); err != nil {
		t.Fatal(err)
	}
	if n != 2 || !seen || cpu != 12.5 {
		t.Errorf("%d samples (want 2), lease seen now %v, cpu %v s (want 12.5)", n, seen, cpu)
	}
	// A double-bit ECC error drains the node in the same round.
	r, err = b.st.RecordHeartbeatRound(b.ctx, "gpu13", samples, stats[:1], []health.GPU{{Index: 0, ECCDBE: 1}, {Index: 1}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if r.Health.State != allot.NodeDraining || len(r.Health.Fired) != 1 {
		t.Errorf("ECC error: health %+v, want draining with one event", r.Health)
	}
	var sc string
	for range 4 { // every connection of the pool it may have used
		if err := b.pool.QueryRow(b.ctx, `SHOW synchronous_commit`).Scan(&sc); err != nil || sc != "on" {
			t.Errorf("synchronous_commit is %q afterwards (%v), want on", sc, err)
		}
	}
	// A node marked down is refused, and the leases its heartbeat lists
	// (confirmed in the same batch) are left as they were.
	if _, err := b.pool.Exec(b.ctx, `UPDATE nodes SET state = 'down' WHERE name = 'gpu13'`); err != nil {
		t.Fatal(err)
	}
	late := []store.JobStat{{JobID: order.JobID, Segment: 1, CPUSeconds: 99}}
	if _, err := b.st.RecordHeartbeatRound(b.ctx, "gpu13", samples, late, []health.GPU{{Index: 0}, {Index: 1}}, ""); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("node marked down: %v, want not found", err)
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT cpu_seconds FROM leases WHERE job_id = $1`, order.JobID).Scan(&cpu); err != nil || cpu != 12.5 {
		t.Errorf("a down node's heartbeat recorded its lease's CPU: %v s (%v), want 12.5 kept", cpu, err)
	}
	if _, err := b.st.RecordHeartbeatRound(b.ctx, "gpu14", samples, nil, nil, ""); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("unregistered node: %v, want not found", err)
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM gpu_samples WHERE node = 'gpu14'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d samples of the unregistered node (%v)", n, err)
	}
}
