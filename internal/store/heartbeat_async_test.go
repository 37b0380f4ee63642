package store_test

import (
	"testing"

	"github.com/allotlabs/allot/internal/allot"
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
