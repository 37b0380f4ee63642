package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// leaseRow is what these tests read of one lease.
type leaseRow struct {
	State     string
	StartedAt *time.Time
	PID       *int
	OfferSent *time.Time
}

func (b bundle) lease(t *testing.T, r store.LeaseRef, node string) leaseRow {
	t.Helper()
	var l leaseRow
	if err := b.pool.QueryRow(b.ctx, `SELECT state, started_at, pid, offer_sent_at FROM leases WHERE job_id = $1 AND segment = $2 AND node = $3`,
		r.JobID, r.Segment, node).Scan(&l.State, &l.StartedAt, &l.PID, &l.OfferSent); err != nil {
		t.Fatal(err)
	}
	return l
}

// openAllocations returns the GPUs a job holds now and when each started.
func (b bundle) openAllocations(t *testing.T, jobID int64) map[int]time.Time {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT gpu_index, started_at FROM allocations WHERE job_id = $1 AND released_at IS NULL`, jobID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]time.Time{}
	for rows.Next() {
		var g int
		var at time.Time
		if err := rows.Scan(&g, &at); err != nil {
			t.Fatal(err)
		}
		out[g] = at
	}
	return out
}

// placed starts one 1-GPU job on node (a cycle's apply) and returns its lease.
func (b bundle) placed(t *testing.T, node string) store.LeaseRef {
	t.Helper()
	order := b.startOn(t, node)
	if err := b.st.InTx(b.ctx, func(tx *store.Store) error {
		_, err := tx.ApplyPlan(b.ctx, []store.StartOrder{order}, nil, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return store.LeaseRef{JobID: order.JobID, Segment: 1}
}

// TestLostStartRecoveredByHeartbeat: a start report commits without
// waiting for the disk; when its commit is lost (simulated: the lease row
// set back to taken, as PostgreSQL's crash recovery would leave it), the
// agent's next heartbeat, which lists the process, makes the lease running
// from then. A start report arriving after the heartbeat changes nothing
// but the pid. The GPUs' allocation (what is billed) is the cycle's
// throughout: one open row per GPU, started when the job was placed.
func TestLostStartRecoveredByHeartbeat(t *testing.T) {
	b := setup(t)
	b.register(t, "gpu13", "GPU-a", "GPU-b")
	ref := b.placed(t, "gpu13")
	allocs := b.openAllocations(t, ref.JobID)
	if _, err := b.st.TakeOrders(b.ctx, "gpu13"); err != nil {
		t.Fatal(err)
	}
	if err := b.st.TakeLease(b.ctx, "gpu13", ref); err != nil {
		t.Fatal(err)
	}
	o, err := b.st.TakeOrders(b.ctx, "gpu13")
	if err != nil || len(o.Start) != 1 || o.Start[0] != ref {
		t.Fatalf("start orders %v (%v), want %v", o.Start, err, ref)
	}
	if err := b.st.LeaseStarted(b.ctx, "gpu13", ref, 4242); err != nil {
		t.Fatal(err)
	}
	if l := b.lease(t, ref, "gpu13"); l.State != "running" || l.PID == nil || *l.PID != 4242 {
		t.Fatalf("after the start report: %+v", l)
	}
	// The commit is lost.
	if _, err := b.pool.Exec(b.ctx, `UPDATE leases SET state = 'taken', started_at = NULL, seen_at = NULL, pid = NULL
		WHERE job_id = $1 AND segment = $2 AND node = 'gpu13'`, ref.JobID, ref.Segment); err != nil {
		t.Fatal(err)
	}
	later := b.now.Add(10 * time.Second)
	b.st.Now = func() time.Time { return later }
	round, err := b.st.RecordHeartbeatRound(b.ctx, "gpu13", []store.GPUSample{{Index: 0, UtilPct: 90}, {Index: 1}},
		[]store.JobStat{{JobID: ref.JobID, Segment: ref.Segment, CPUSeconds: 3}}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(round.Orphans) != 0 {
		t.Errorf("heartbeat kills %v: the lease is the node's", round.Orphans)
	}
	l := b.lease(t, ref, "gpu13")
	if l.State != "running" || l.StartedAt == nil || !l.StartedAt.Equal(later) {
		t.Fatalf("after the heartbeat listing it: %+v, want running from %v", l, later)
	}
	// The start report comes again (the outbox retried) or late: the pid
	// is filled in, the start stays the heartbeat's.
	b.st.Now = func() time.Time { return later.Add(time.Second) }
	if err := b.st.LeaseStarted(b.ctx, "gpu13", ref, 4242); err != nil {
		t.Fatal(err)
	}
	if l := b.lease(t, ref, "gpu13"); l.State != "running" || l.PID == nil || *l.PID != 4242 || !l.StartedAt.Equal(later) {
		t.Errorf("after the late start report: %+v", l)
	}
	if got := b.openAllocations(t, ref.JobID); len(got) != 1 || !got[0].Equal(allocs[0]) {
		t.Errorf("allocations %v, want the cycle's %v untouched", got, allocs)
	}
}

// TestLostTakeRecoveredByResend: a take commits without waiting for the
// disk; when its commit is lost (the lease set back to offered) the node,
// which still heartbeats, is sent the offer again after the short deadline
// instead of the job being requeued; its agent takes it again and the
// start order follows. Offers of a node that went quiet expire at the
// short deadline; those a live node does not take expire at the long one.
func TestLostTakeRecoveredByResend(t *testing.T) {
	b := setup(t)
	b.register(t, "gpu13", "GPU-a", "GPU-b")
	ref := b.placed(t, "gpu13")
	if o, err := b.st.TakeOrders(b.ctx, "gpu13"); err != nil || len(o.Offer) != 1 {
		t.Fatalf("offers %v (%v)", o.Offer, err)
	}
	if err := b.st.TakeLease(b.ctx, "gpu13", ref); err != nil {
		t.Fatal(err)
	}
	// The take's commit is lost.
	if _, err := b.pool.Exec(b.ctx, `UPDATE leases SET state = 'offered', taken_at = NULL WHERE job_id = $1 AND node = 'gpu13'`, ref.JobID); err != nil {
		t.Fatal(err)
	}
	// 31 s on, the node still heartbeats.
	now := b.now.Add(31 * time.Second)
	b.st.Now = func() time.Time { return now }
	if _, err := b.st.RecordHeartbeatAsync(b.ctx, "gpu13", nil, ""); err != nil {
		t.Fatal(err)
	}
	deadlines := func() store.OfferDeadlines {
		return store.OfferDeadlines{Silent: now.Add(-30 * time.Second), Live: now.Add(-2 * time.Minute), Resend: now.Add(-30 * time.Second)}
	}
	if got, err := b.st.ExpireStaleOffers(b.ctx, deadlines()); err != nil || len(got) != 0 {
		t.Fatalf("a live node's offer expired: %v (%v)", got, err)
	}
	if l := b.lease(t, ref, "gpu13"); l.State != "offered" || l.OfferSent != nil {
		t.Fatalf("after the resend: %+v, want offered, not sent", l)
	}
	o, err := b.st.TakeOrders(b.ctx, "gpu13")
	if err != nil || len(o.Offer) != 1 || o.Offer[0].JobID != ref.JobID {
		t.Fatalf("the offer is not sent again: %v (%v)", o.Offer, err)
	}
	if err := b.st.TakeLease(b.ctx, "gpu13", ref); err != nil {
		t.Fatal(err)
	}
	if o, err := b.st.TakeOrders(b.ctx, "gpu13"); err != nil || len(o.Start) != 1 {
		t.Fatalf("no start order after the second take: %v (%v)", o, err)
	}
	if j, err := b.st.GetJob(b.ctx, ref.JobID); err != nil || j.State != allot.JobRunning {
		t.Fatalf("job %v (%v), want running", j.State, err)
	}

	// A quiet node: gpu14's agent sends no heartbeat after the offer.
	b.st.Now = func() time.Time { return b.now }
	b.register(t, "gpu14", "GPU-c")
	quiet := b.placed(t, "gpu14")
	// A live node that does not take: gpu15.
	b.register(t, "gpu15", "GPU-d")
	refusing := b.placed(t, "gpu15")
	now = b.now.Add(31 * time.Second)
	b.st.Now = func() time.Time { return now }
	if _, err := b.st.RecordHeartbeatAsync(b.ctx, "gpu15", nil, ""); err != nil {
		t.Fatal(err)
	}
	got, err := b.st.ExpireStaleOffers(b.ctx, deadlines())
	if err != nil || len(got) != 1 || got[0] != quiet.JobID {
		t.Fatalf("expired %v (%v), want only the quiet node's job %d", got, err, quiet.JobID)
	}
	if held := b.openAllocations(t, quiet.JobID); len(held) != 0 {
		t.Errorf("the expired job still holds GPUs %v", held)
	}
	if j, err := b.st.GetJob(b.ctx, quiet.JobID); err != nil || j.State != allot.JobPending {
		t.Errorf("quiet node's job %v (%v), want pending", j.State, err)
	}
	now = b.now.Add(2*time.Minute + time.Second)
	if _, err := b.st.RecordHeartbeatAsync(b.ctx, "gpu15", nil, ""); err != nil {
		t.Fatal(err)
	}
	got, err = b.st.ExpireStaleOffers(b.ctx, deadlines())
	if err != nil || len(got) != 1 || got[0] != refusing.JobID {
		t.Fatalf("expired %v (%v), want the refusing node's job %d", got, err, refusing.JobID)
	}
	if j, err := b.st.GetJob(b.ctx, ref.JobID); err != nil || j.State != allot.JobRunning {
		t.Errorf("the taken job %v (%v), want still running", j.State, err)
	}
}

// TestLeaseReportsCommitAsyncAlone: the take and start reports turn
// synchronous commit off for their own transaction only: the connection
// they ran on commits synchronously afterwards. A report of a lease the
// node does not hold is refused and changes nothing.
func TestLeaseReportsCommitAsyncAlone(t *testing.T) {
	b := setup(t)
	b.register(t, "gpu13", "GPU-a", "GPU-b")
	ref := b.placed(t, "gpu13")
	pc, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	st := store.New(pc.Conn())
	st.Now = b.st.Now
	if err := st.TakeLease(b.ctx, "gpu13", ref); err != nil {
		t.Fatal(err)
	}
	if err := st.LeaseStarted(b.ctx, "gpu13", ref, 7); err != nil {
		t.Fatal(err)
	}
	var sc string
	if err := pc.Conn().QueryRow(b.ctx, `SHOW synchronous_commit`).Scan(&sc); err != nil || sc != "on" {
		t.Errorf("synchronous_commit is %q afterwards (%v), want on", sc, err)
	}
	other := store.LeaseRef{JobID: ref.JobID, Segment: 2}
	if err := st.TakeLease(b.ctx, "gpu13", other); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("take of a lease the node does not hold: %v, want not found", err)
	}
	if err := st.LeaseStarted(b.ctx, "gpu14", ref, 7); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("start on another node: %v, want not found", err)
	}
	if l := b.lease(t, ref, "gpu13"); l.State != "running" || *l.PID != 7 {
		t.Errorf("lease %+v, want running with pid 7", l)
	}
}

// TestTakeWakesTheGangsOtherNodes: a take that completes a gang wakes the
// gang's other nodes to fetch their start orders, not the taking node (it
// polls again after its takes and finds its start then); a single-node
// job's take wakes nobody. The taking node's next poll has its start.
func TestTakeWakesTheGangsOtherNodes(t *testing.T) {
	b := setup(t)
	b.register(t, "gpu13", "GPU-a", "GPU-b")
	b.register(t, "gpu14", "GPU-c", "GPU-d")
	pc, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	if _, err := pc.Exec(b.ctx, `LISTEN `+store.OrdersChannel); err != nil {
		t.Fatal(err)
	}
	woken := func() []string {
		var out []string
		for {
			ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
			n, err := pc.Conn().WaitForNotification(ctx)
			cancel()
			if err != nil {
				return out
			}
			out = append(out, n.Payload)
		}
	}
	single := b.placed(t, "gpu13")
	woken() // the cycle's own
	if err := b.st.TakeLease(b.ctx, "gpu13", single); err != nil {
		t.Fatal(err)
	}
	if got := woken(); len(got) != 0 {
		t.Errorf("a single-node take woke %v", got)
	}
	if o, err := b.st.TakeOrders(b.ctx, "gpu13"); err != nil || len(o.Start) != 1 || o.Start[0] != single {
		t.Errorf("the taking node's next poll: starts %v (%v), want %v", o.Start, err, single)
	}

	j, err := b.st.SubmitJob(b.ctx, b.user(t, "noah@example.com"), allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 2, GPUsPerNode: 1,
		TimeLimit: time.Hour, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.st.InTx(b.ctx, func(tx *store.Store) error {
		_, err := tx.ApplyPlan(b.ctx, []store.StartOrder{{JobID: j.ID, RunAs: allot.Tier3,
			Parts: []store.LeasePart{{Node: "gpu13", GPUs: []int{1}}, {Node: "gpu14", GPUs: []int{0}}}}}, nil, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	woken()
	gang := store.LeaseRef{JobID: j.ID, Segment: 1}
	if err := b.st.TakeLease(b.ctx, "gpu14", gang); err != nil {
		t.Fatal(err)
	}
	if got := woken(); len(got) != 0 {
		t.Errorf("a take that leaves the gang incomplete woke %v", got)
	}
	if err := b.st.TakeLease(b.ctx, "gpu13", gang); err != nil {
		t.Fatal(err)
	}
	if got := woken(); len(got) != 1 || got[0] != "gpu14" {
		t.Errorf("the gang's last take woke %v, want [gpu14]", got)
	}
	for _, n := range []string{"gpu13", "gpu14"} {
		if o, err := b.st.TakeOrders(b.ctx, n); err != nil || len(o.Start) != 1 || o.Start[0] != gang {
			t.Errorf("%s: starts %v (%v), want %v", n, o.Start, err, gang)
		}
	}
}
