package store_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/health"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/google/go-cmp/cmp"
)

// waitForLockWait waits until a session of the test's database waits on a
// lock (true) or done is closed first (false).
func (b bundle) waitForLockWait(t *testing.T, done <-chan struct{}) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second) // deadline (real time)
	for time.Now().Before(deadline) {            // deadline (real time)
		select {
		case <-done:
			return false
		default:
		}
		var n int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("neither a lock wait nor the end of the other transaction within 10 s")
	return false
}

// startOn submits a one-GPU job and returns a start order for it on node.
func (b bundle) startOn(t *testing.T, node string) store.StartOrder {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `UPDATE nodes SET state = 'up', registered_at = $2, last_heartbeat = $2 WHERE name = $1`, node, b.now); err != nil {
		t.Fatal(err)
	}
	j, err := b.st.SubmitJob(b.ctx, b.user(t, "noah@example.com"), allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Hour, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	return store.StartOrder{JobID: j.ID, Parts: []store.LeasePart{{Node: node, GPUs: []int{0}}}, RunAs: allot.Tier3}
}

// A drain that comes while a scheduling cycle places a job on the node
// waits for the cycle and sees its lease: the node is draining, not
// drained with a job running on it.
func TestDrainWaitsForCycleThatPlacesAJob(t *testing.T) {
	b := setup(t)
	order := b.startOn(t, "gpu16")
	applied, release := make(chan error, 1), make(chan struct{})
	cycleDone := make(chan error, 1)
	go func() {
		cycleDone <- b.st.InTx(b.ctx, func(tx *store.Store) error {
			res, err := tx.ApplyPlan(b.ctx, []store.StartOrder{order}, nil, nil)
			if err == nil && res.Started != 1 {
				err = allot.Errorf(allot.EInternal, "started %d", res.Started)
			}
			applied <- err
			<-release // the cycle has not committed yet
			return err
		})
	}()
	if err := <-applied; err != nil {
		close(release)
		t.Fatal(err)
	}
	drained := make(chan struct{})
	var res store.DrainResult
	var drainErr error
	go func() {
		defer close(drained)
		res, drainErr = b.st.DrainNode(b.ctx, "ada@example.com", "gpu16", "fan", false)
	}()
	waited := b.waitForLockWait(t, drained)
	close(release)
	if err := <-cycleDone; err != nil {
		t.Fatal(err)
	}
	<-drained
	if drainErr != nil {
		t.Fatal(drainErr)
	}
	if !waited || res.State != allot.NodeDraining {
		t.Fatalf("drain waited for the cycle: %v; state %s, want draining (the cycle's job runs there)", waited, res.State)
	}
}

// A cycle that places a job on a node being drained waits for the drain
// and then refuses the plan (EConflict): no lease on a drained node.
func TestCycleWaitsForDrainAndRefusesThePlan(t *testing.T) {
	b := setup(t)
	order := b.startOn(t, "gpu16")
	// A drain in progress, locking the node as DrainNode and the health
	// drain do (FOR UPDATE, then the state change), not yet committed.
	drain, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer drain.Rollback(context.Background()) //nolint:errcheck
	if _, err := drain.Exec(b.ctx, `SELECT state FROM nodes WHERE name = 'gpu16' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	if _, err := drain.Exec(b.ctx, `UPDATE nodes SET state = 'drained', drain_source = 'admin' WHERE name = 'gpu16'`); err != nil {
		t.Fatal(err)
	}
	cycled := make(chan struct{})
	var cycleErr error
	go func() {
		defer close(cycled)
		cycleErr = b.st.InTx(b.ctx, func(tx *store.Store) error {
			_, err := tx.ApplyPlan(b.ctx, []store.StartOrder{order}, nil, nil)
			return err
		})
	}()
	waited := b.waitForLockWait(t, cycled)
	if err := drain.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	<-cycled
	if !waited || allot.ErrorCode(cycleErr) != allot.EConflict {
		t.Fatalf("cycle waited for the drain: %v; error %v, want a conflict", waited, cycleErr)
	}
	if n := b.count(t, "leases"); n != 0 {
		t.Fatalf("%d leases on the drained node", n)
	}
}

// Heartbeats do not wait for a cycle that placed a job on the node.
func TestHeartbeatDoesNotWaitForCycle(t *testing.T) {
	b := setup(t)
	order := b.startOn(t, "gpu16")
	applied, release := make(chan error, 1), make(chan struct{})
	cycleDone := make(chan error, 1)
	go func() {
		cycleDone <- b.st.InTx(b.ctx, func(tx *store.Store) error {
			_, err := tx.ApplyPlan(b.ctx, []store.StartOrder{order}, nil, nil)
			applied <- err
			<-release
			return err
		})
	}()
	defer func() { close(release); <-cycleDone }()
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	if _, err := b.st.Heartbeat(ctx, "gpu16", []store.GPUSample{{Index: 0, UtilPct: 50}}); err != nil {
		t.Fatalf("heartbeat during a cycle: %v", err)
	}
}

// A cluster upgraded from before health rules existed gets the default
// rules on the policies it already has (else nothing would ever drain).
func TestMigrationGivesOldPoliciesTheDefaultHealthRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := store.Open(ctx, storetest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ms, err := store.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE allot_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	var m0010 string
	for _, m := range ms {
		if m.Version >= 10 {
			if m.Version == 10 {
				m0010 = m.SQL
			}
			continue
		}
		if _, err := pool.Exec(ctx, m.SQL); err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO allot_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			t.Fatal(err)
		}
	}
	// A policy stored by the release before 0010.
	if _, err := pool.Exec(ctx, `INSERT INTO policy_versions (created_by, weight_fair_share, weight_size, weight_age, max_age_s, half_life_s,
		grace_period_s, min_runtime_s, cycle_s, budget_warn_pct, budget_demote_pct, burst_pending_gpu_hours, burst_mean_wait_s,
		burst_release_gpu_hours, heartbeat_missed_after_s) VALUES ('seed', 1000, 100, 100, 86400, 604800, 30, 300, 1, 80, 100, 40, 600, 10, 30)`); err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	p, err := store.New(pool).CurrentPolicy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(allot.DefaultHealthRules(), p.HealthRules); d != "" || p.Version == 0 {
		t.Errorf("version %d health rules after the upgrade (-want +got):\n%s", p.Version, d)
	}
	// The literal in the migration is exactly the Go defaults' JSON.
	want, _ := json.Marshal(allot.DefaultHealthRules())
	if !strings.Contains(m0010, "SET health_rules = '"+string(want)+"'") {
		t.Errorf("migration 0010's default rules differ from json.Marshal(allot.DefaultHealthRules()) = %s", want)
	}
}

// register (re-)registers node with the GPUs of the given UUIDs, indexed
// 0..n-1 as NVML numbers what it finds.
func (b bundle) register(t *testing.T, node string, uuids ...string) {
	t.Helper()
	inv := store.NodeInventory{Hostname: node, Backend: "fake"}
	for i, u := range uuids {
		inv.GPUs = append(inv.GPUs, store.NodeGPU{Index: i, UUID: u, Model: "T4"})
	}
	if _, err := b.st.RegisterNode(b.ctx, node, inv); err != nil {
		t.Fatal(err)
	}
}

// beat evaluates one heartbeat of n GPUs with the given double-bit ECC
// totals and returns the node's state and how many events it has.
func (b bundle) beat(t *testing.T, node string, n int, ecc map[int]int64) (string, []store.HealthEvent) {
	t.Helper()
	gpus := make([]health.GPU, n)
	for i := range gpus {
		gpus[i] = health.GPU{Index: i, ECCDBE: ecc[i]}
	}
	out, err := b.st.EvaluateHealth(b.ctx, node, gpus, "")
	if err != nil {
		t.Fatal(err)
	}
	evs, err := b.st.HealthEvents(b.ctx, node, false, 100)
	if err != nil {
		t.Fatal(err)
	}
	return out.State, evs
}

var eightGPUs = []string{"GPU-0", "GPU-1", "GPU-2", "GPU-3", "GPU-4", "GPU-5", "GPU-6", "GPU-7"}

// A double-bit ECC total only grows: after an admin undrained the node, a
// new error (the total rises, or another GPU) drains it again; the same
// total does not.
func TestHealthECCFiresAgainAfterUndrain(t *testing.T) {
	b := setup(t)
	b.register(t, "gpu16", eightGPUs...)
	undrain := func() {
		t.Helper()
		if err := b.st.UndrainNode(b.ctx, "ada@example.com", "gpu16", "GPU reseated"); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range []struct {
		undrain bool
		ecc     map[int]int64
		state   string
		events  int
	}{
		{false, nil, allot.NodeUp, 0},
		{false, map[int]int64{5: 1}, allot.NodeDrained, 1},
		{false, map[int]int64{5: 1}, allot.NodeDrained, 1},
		{true, map[int]int64{5: 1}, allot.NodeUp, 1},       // acknowledged: the same error does not drain it again
		{false, map[int]int64{5: 2}, allot.NodeDrained, 2}, // another error on GPU 5
		{false, map[int]int64{5: 2}, allot.NodeDrained, 2},
		{true, map[int]int64{5: 2, 2: 1}, allot.NodeDrained, 3}, // a first one on GPU 2
	} {
		if s.undrain {
			undrain()
		}
		state, evs := b.beat(t, "gpu16", 8, s.ecc)
		if state != s.state || len(evs) != s.events {
			t.Fatalf("step %d: %s with %d events, want %s with %d", i, state, len(evs), s.state, s.events)
		}
	}
	_, evs := b.beat(t, "gpu16", 8, map[int]int64{5: 2, 2: 1})
	open := 0
	for _, e := range evs {
		if e.ResolvedAt == nil {
			open++
		}
	}
	if open != 1 || evs[0].ResolvedAt != nil || evs[0].Detail != "GPU 2: 1 double-bit ECC errors; GPU 5: 2 double-bit ECC errors" ||
		evs[1].Detail != "GPU 5: 2 double-bit ECC errors" || evs[2].Detail != "GPU 5: 1 double-bit ECC errors" {
		t.Errorf("events = %+v", evs)
	}
	ns, _ := b.st.Notifications(b.ctx, false, 10)
	if len(ns) != 3 {
		t.Errorf("%d notifications, want 3", len(ns))
	}
}

// A GPU missing when the agent registers again (here the node comes back
// with 7 of its 8 GPUs, NVML numbering them 0–6) is missing: the
// gpu-missing rule drains the node. It is back at the next registration
// that reports it; an admin's undrain accepts the smaller inventory.
func TestHealthGPUMissingAtReregistration(t *testing.T) {
	b := setup(t)
	b.register(t, "gpu16", eightGPUs...) // a new node: its inventory, nothing missing
	if state, evs := b.beat(t, "gpu16", 8, nil); state != allot.NodeUp || len(evs) != 0 {
		t.Fatalf("new node: %s, %d events", state, len(evs))
	}
	seven := []string{"GPU-0", "GPU-1", "GPU-2", "GPU-4", "GPU-5", "GPU-6", "GPU-7"}
	b.register(t, "gpu16", seven...)
	state, evs := b.beat(t, "gpu16", 7, nil)
	if state != allot.NodeDrained || len(evs) != 1 || evs[0].Rule.Name != "gpu-missing" ||
		evs[0].Detail != "GPU 3 (GPU-3) missing since the agent registered again" {
		t.Fatalf("after coming back with 7 GPUs: %s, events %+v", state, evs)
	}
	// Still missing at the next restart: still missing (one event).
	b.register(t, "gpu16", seven...)
	if _, evs := b.beat(t, "gpu16", 7, nil); len(evs) != 1 || evs[0].ResolvedAt != nil {
		t.Fatalf("second restart: events %+v", evs)
	}
	// Reseated: all 8 are back; the event is resolved.
	b.register(t, "gpu16", eightGPUs...)
	if _, evs := b.beat(t, "gpu16", 8, nil); len(evs) != 1 || evs[0].ResolvedAt == nil {
		t.Fatalf("after the GPU is back: events %+v", evs)
	}
	// Gone again, then an admin undrains: the node runs on 7 GPUs.
	b.register(t, "gpu16", seven...)
	if state, evs := b.beat(t, "gpu16", 7, nil); state != allot.NodeDrained || len(evs) != 2 {
		t.Fatalf("gone again: %s, %d events", state, len(evs))
	}
	if err := b.st.UndrainNode(b.ctx, "ada@example.com", "gpu16", "GPU 3 sent for RMA"); err != nil {
		t.Fatal(err)
	}
	if state, evs := b.beat(t, "gpu16", 7, nil); state != allot.NodeUp || len(evs) != 2 || evs[0].ResolvedAt == nil {
		t.Fatalf("after the undrain: %s, events %+v", state, evs)
	}
	b.register(t, "gpu16", seven...)
	if state, evs := b.beat(t, "gpu16", 7, nil); state != allot.NodeUp || len(evs) != 2 {
		t.Fatalf("restart after the undrain: %s, %d events", state, len(evs))
	}
	// A node without an inventory (a burst node's name reused for a new
	// machine) starts afresh.
	b.register(t, "gpu16", "GPU-0")
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM node_gpus WHERE node = 'gpu16'`); err != nil {
		t.Fatal(err)
	}
	b.register(t, "gpu16", "GPU-new")
	var lost string
	if err := b.pool.QueryRow(b.ctx, `SELECT lost_gpus::text FROM nodes WHERE name = 'gpu16'`).Scan(&lost); err != nil || lost != "[]" {
		t.Fatalf("lost GPUs of a new machine: %s %v", lost, err)
	}
}

// Saving what is already in force makes no policy version and no audit
// entry; the health form's rules and webhook are saved together or not at
// all.
func TestHealthSettingsOnlyRecordChanges(t *testing.T) {
	b := setup(t)
	counts := func() [2]int { return [2]int{b.count(t, "policy_versions"), b.count(t, "audit_log")} }
	before := counts()
	p, err := b.st.CurrentPolicy(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	undrain := p.AutoUndrainAfter
	if r, err := b.st.SetHealthRules(b.ctx, "ada@example.com", p.HealthRules, &undrain, ""); err != nil || r.Changed {
		t.Fatalf("same rules: %+v %v", r, err)
	}
	if r, err := b.st.SetNodeLabels(b.ctx, "ada@example.com", "gpu16", allot.NodeLabels{}, ""); err != nil || r.Changed {
		t.Fatalf("same labels: %+v %v", r, err)
	}
	if err := b.st.SetAdminWebhook(b.ctx, "ada@example.com", ""); err != nil {
		t.Fatal(err)
	}
	if changed, err := b.st.SetHealthSettings(b.ctx, "ada@example.com", p.HealthRules, &undrain, "", ""); err != nil || changed {
		t.Fatalf("same settings: %v %v", changed, err)
	}
	if got := counts(); got != before {
		t.Fatalf("saving nothing new: (versions, audit) %v → %v", before, got)
	}
	// Labels in another order, then the same ones: one change.
	for range 2 {
		if _, err := b.st.SetNodeLabels(b.ctx, "ada@example.com", "gpu16", allot.NodeLabels{"rack-row": "b", "cooling": "liquid"}, ""); err != nil {
			t.Fatal(err)
		}
	}
	if got := counts(); got != [2]int{before[0] + 1, before[1] + 1} {
		t.Fatalf("one label change: %v → %v", before, got)
	}
	// A bad webhook: the rules are not saved either.
	before = counts()
	if _, err := b.st.SetHealthSettings(b.ctx, "ada@example.com", []allot.HealthRule{}, &undrain, "ftp://hooks.example.com", ""); allot.ErrorCode(err) != allot.EInvalid {
		t.Fatalf("bad webhook: %v", err)
	}
	if got := counts(); got != before {
		t.Fatalf("a refused form saved something: %v → %v", before, got)
	}
	if changed, err := b.st.SetHealthSettings(b.ctx, "ada@example.com", []allot.HealthRule{}, &undrain, "https://hooks.example.com/x", ""); err != nil || !changed {
		t.Fatalf("good form: %v %v", changed, err)
	}
	if got := counts(); got != [2]int{before[0] + 1, before[1] + 2} {
		t.Fatalf("rules and webhook: %v → %v", before, got)
	}
}
