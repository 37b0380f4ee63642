package store_test

import (
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// TestSubmitUsageCache: the month usage a submission is judged on may come
// from the sum the previous submission made, but never from a stale one:
// any committed change to allocations (a new one, a release) is seen by
// the next submission, a running allocation's time is counted (to the
// whole second), and a clock set back recomputes. Each figure is checked
// against TeamUsageBetween, the definition.
func TestSubmitUsageCache(t *testing.T) {
	b := setup(t)
	clk := b.now
	st := store.New(b.pool)
	st.Now = func() time.Time { return clk }
	noah := b.user(t, "noah@example.com")
	spec := allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Hour, Command: []string{"true"}}
	month := store.MonthStart(clk)
	var budget int64
	if err := b.pool.QueryRow(b.ctx, `SELECT monthly_budget_gpu_hours FROM teams WHERE slug = 'nlp'`).Scan(&budget); err != nil {
		t.Fatal(err)
	}
	check := func(what string, at time.Time) {
		t.Helper()
		q, err := st.QuotaPreview(b.ctx, noah, &spec)
		if err != nil {
			t.Fatal(err)
		}
		want, err := st.TeamUsageBetween(b.ctx, "nlp", month, at)
		if err != nil {
			t.Fatal(err)
		}
		if got := budget*3600 - q.RemainingGPUSeconds; got != want {
			t.Errorf("%s: judged on %d GPU-seconds used, the usage up to %v is %d", what, got, at.Format(time.RFC3339Nano), want)
		}
	}
	check("first", clk)
	check("again (cached)", clk)
	// A job of nlp starts on two GPUs: the next submission sees it.
	var job int64
	if err := b.pool.QueryRow(b.ctx, `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command, state, submitted_at, started_at, segment, run_as)
		VALUES ('cache', 'nlp', $1, '3', 2, 86400, '{true}', 'running', $2, $2, 1, '3') RETURNING id`, noah.ID, clk.Add(-time.Hour)).Scan(&job); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO allocations (job_id, segment, node, gpu_index, started_at) VALUES ($1, 1, 'gpu01', 0, $2), ($1, 1, 'gpu01', 1, $2)`,
		job, clk.Add(-time.Hour+300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	check("after two allocations started", clk)
	// 10.7 s later, nothing changed: the cached sum counts the two running
	// GPUs 10 s further, exactly the usage at +10 s.
	clk = clk.Add(10700 * time.Millisecond)
	check("10.7 s later (cached, to the whole second)", b.now.Add(10*time.Second))
	// One GPU released: seen at once.
	if _, err := b.pool.Exec(b.ctx, `UPDATE allocations SET released_at = $2 WHERE job_id = $1 AND gpu_index = 1`, job, clk.Add(-2*time.Second)); err != nil {
		t.Fatal(err)
	}
	check("after a release", clk)
	// The clock set back: recomputed, not extrapolated.
	clk = b.now.Add(-time.Minute)
	check("clock set back", clk)
	// It is the epoch that keeps the sum fresh: with its trigger off, a
	// new allocation goes unseen while the sum is cached (so the cache is
	// used at all).
	q0, err := st.QuotaPreview(b.ctx, noah, &spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE allocations DISABLE TRIGGER allocations_epoch_bump`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at) VALUES ($1, 1, 'gpu02', 0, $2, $3)`,
		job, clk.Add(-2*time.Hour), clk.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	q1, err := st.QuotaPreview(b.ctx, noah, &spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE allocations ENABLE TRIGGER allocations_epoch_bump`); err != nil {
		t.Fatal(err)
	}
	if q1.RemainingGPUSeconds != q0.RemainingGPUSeconds {
		t.Errorf("with the epoch frozen the cached sum should have been used: remaining %d, then %d", q0.RemainingGPUSeconds, q1.RemainingGPUSeconds)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE allocations SET released_at = released_at WHERE job_id = $1`, job); err != nil {
		t.Fatal(err)
	}
	check("trigger back, any change", clk)
	// In a transaction nothing is cached (and nothing breaks).
	if err := st.InTx(b.ctx, func(tx *store.Store) error {
		_, err := tx.QuotaPreview(b.ctx, noah, &spec)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// An unknown team is still refused.
	bad := spec
	bad.Team = "nosuch"
	if _, err := st.SubmitJob(b.ctx, noah, bad); err == nil {
		t.Error("a submission to an unknown team should be refused")
	}
}

// TestSubmitGangCache: the largest gang a submission is checked against may
// come from the previous submission's read of the nodes, but a node added
// is seen by the next one; a heartbeat does not make it read them again.
func TestSubmitGangCache(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	// Domain ib-a holds 8 A100 nodes: 64 GPUs is the largest gang.
	big := allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 72, GPUsPerNode: 8, GPUType: "A100-80GB", TimeLimit: time.Hour, Command: []string{"true"}}
	if _, err := b.st.SubmitJob(b.ctx, noah, big); err == nil {
		t.Fatal("a 72-GPU job should not fit a 64-GPU domain")
	}
	epoch := func() int64 {
		var v int64
		if err := b.pool.QueryRow(b.ctx, `SELECT last_value + is_called::int FROM nodes_epoch`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := epoch()
	if _, err := b.pool.Exec(b.ctx, `UPDATE nodes SET last_heartbeat = $1, state = 'up' WHERE name = 'gpu01'`, b.now); err != nil {
		t.Fatal(err)
	}
	if e := epoch(); e != before {
		t.Errorf("a heartbeat moved the nodes' epoch %d → %d", before, e)
	}
	if err := b.st.CreateNode(b.ctx, &allot.Node{Name: "gpu17", GPUType: "A100-80GB", GPUCount: 8, Site: allot.SiteOnPrem, Domain: "ib-a", Rack: "r5",
		State: allot.NodeDown}); err != nil {
		t.Fatal(err)
	}
	if e := epoch(); e == before {
		t.Error("a new node did not move the nodes' epoch")
	}
	if _, err := b.st.SubmitJob(b.ctx, noah, big); err != nil {
		t.Errorf("with a ninth node in ib-a the 72-GPU job fits: %v", err)
	}
}
