package jobs_test

// Every policy field takes effect within one cycle of being saved: each
// test below saves a field with store.UpdatePolicy (the code behind PUT
// /api/v1/policy and the admin form) or store.SetHealthRules on a running
// database, runs what reads it (a scheduling cycle, a budget check, a
// burst evaluation, a heartbeat, the lost-node sweep; or the River worker
// itself) and observes the effect. cmd/allot/policy_live_test.go does the
// same through the API on a running Allot.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/burst"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/health"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

// policyEnv is a seeded database with the demo's queue cancelled.
type policyEnv struct {
	t     *testing.T
	ctx   context.Context
	st    *store.Store
	pool  *pgxpool.Pool
	admin allot.User
	sched *jobs.Scheduler
}

func newPolicyEnv(t *testing.T, nodes string) *policyEnv {
	t.Helper()
	st, pool := seeded(t, nodes)
	e := &policyEnv{t: t, ctx: context.Background(), st: st, pool: pool, sched: &jobs.Scheduler{Store: st, CheckpointRoot: t.TempDir()}}
	var err error
	if e.admin, err = st.UserByEmail(e.ctx, demo.PersonaEmail[demo.Admin]); err != nil {
		t.Fatal(err)
	}
	queued, err := st.ListJobs(e.ctx, store.JobFilter{State: allot.JobPending, Limit: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range queued {
		if _, err := st.CancelJob(e.ctx, &e.admin, j.ID); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// set saves one policy field as PUT /api/v1/policy does: value is the
// field's JSON.
func (e *policyEnv) set(patch string) allot.Policy {
	e.t.Helper()
	r, err := e.st.UpdatePolicy(e.ctx, store.PolicyChange{Actor: e.admin.Email, Action: "policy.update", Object: "policy", Note: "test"},
		func(v *store.PolicyValues) error { return json.Unmarshal([]byte(patch), v) })
	if err != nil || !r.Changed {
		e.t.Fatalf("saving %s: changed %v, %v", patch, r.Changed, err)
	}
	p, err := e.st.CurrentPolicy(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// cycle runs one scheduling cycle.
func (e *policyEnv) cycle() jobs.CycleResult {
	e.t.Helper()
	for range 5 {
		res, err := e.sched.Cycle(e.ctx)
		if allot.ErrorCode(err) == allot.EConflict {
			continue
		}
		if err != nil || !res.Ran {
			e.t.Fatalf("cycle: ran %v, %v", res.Ran, err)
		}
		return res
	}
	e.t.Fatal("cycle: stale plans five times in a row")
	return jobs.CycleResult{}
}

func (e *policyEnv) submit(spec allot.JobSpec) allot.Job {
	e.t.Helper()
	if spec.TimeLimit == 0 {
		spec.TimeLimit = time.Hour
	}
	if spec.Command == nil {
		spec.Command = []string{"true"}
	}
	j, err := e.st.SubmitJob(e.ctx, &e.admin, spec)
	if err != nil {
		e.t.Fatalf("submit %+v: %v", spec, err)
	}
	return j
}

// backdate makes job id submitted ago before now.
func (e *policyEnv) backdate(id int64, ago time.Duration) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.ctx, `UPDATE jobs SET submitted_at = $2 WHERE id = $1`, id, e.st.Now().Add(-ago)); err != nil {
		e.t.Fatal(err)
	}
}

func (e *policyEnv) job(id int64) allot.Job {
	e.t.Helper()
	j, err := e.st.GetJob(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return j
}

func (e *policyEnv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// TestPolicyPriorityFieldsTakeEffect: the weights and MaxAge, saved
// between two cycles, make the next cycle's priorities.
func TestPolicyPriorityFieldsTakeEffect(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field, value string
	}{
		{"weight_fair_share", "200000"},
		{"weight_size", "300000"},
		{"weight_age", "500000"},
		{"max_age_s", "7200"},
	} {
		t.Run(tc.field, func(t *testing.T) {
			e := newPolicyEnv(t, "-")
			e.set(`{"queue_order": "multifactor"}`) // the weights make the multifactor order's priority
			j := e.submit(allot.JobSpec{Team: "fraud", Tier: allot.Tier3, GPUs: 8})
			e.backdate(j.ID, time.Hour)
			// total is the priority the breakdown gives with p's weights.
			total := func(b allot.PriorityBreakdown, p allot.Policy) float64 {
				return float64(p.WeightFairShare)*b.FairShare + float64(p.WeightSize)*b.Size + float64(p.WeightAge)*b.Age
			}
			// The factors are stored to 4 decimals, the total to a whole number.
			tol := func(p allot.Policy) float64 {
				return float64(p.WeightFairShare+p.WeightSize+p.WeightAge)*0.5e-4 + 1
			}
			old := e.cycle().Policy
			before := e.job(j.ID)
			if math.Abs(before.Priority-total(before.Breakdown, old)) > tol(old) {
				t.Fatalf("before: priority %v, breakdown %+v, policy %+v", before.Priority, before.Breakdown, old)
			}
			p := e.set(fmt.Sprintf(`{%q: %s}`, tc.field, tc.value))
			if got := e.cycle().Policy.Version; got != p.Version {
				t.Fatalf("the cycle ran with policy version %d, saved %d", got, p.Version)
			}
			after := e.job(j.ID)
			if math.Abs(after.Priority-total(after.Breakdown, p)) > tol(p) {
				t.Errorf("after %s = %s: priority %v, breakdown %+v; want %v", tc.field, tc.value, after.Priority, after.Breakdown, total(after.Breakdown, p))
			}
			if tc.field == "max_age_s" {
				// Waited an hour of a 2 h MaxAge: the age factor is 1/2
				// (it was 1 h / 7 d).
				if before.Breakdown.Age > 0.01 || math.Abs(after.Breakdown.Age-0.5) > 0.01 {
					t.Errorf("age factor %v → %v, want 1 h / 7 d → 0.5", before.Breakdown.Age, after.Breakdown.Age)
				}
				return
			}
			if math.Abs(after.Priority-before.Priority) < 10*tol(p) {
				t.Errorf("%s = %s changed the priority only from %v to %v", tc.field, tc.value, before.Priority, after.Priority)
			}
		})
	}
}

// TestPolicyQueueOrderTakesEffect: under the response order (the default)
// a short job that has waited a little comes before a week-long one that
// has waited longer, and its priority is its response ratio (wait + T) / T
// times the fair-share multiplier; saved as multifactor between two cycles,
// the older, larger job comes first by the weights. A bad order is
// refused with a field error and changes nothing.
func TestPolicyQueueOrderTakesEffect(t *testing.T) {
	e := newPolicyEnv(t, "-") // parallel (seeded)
	long := e.submit(allot.JobSpec{Team: "fraud", Tier: allot.Tier3, GPUs: 8, TimeLimit: 7 * 24 * time.Hour})
	e.backdate(long.ID, 2*time.Hour)
	short := e.submit(allot.JobSpec{Team: "fraud", Tier: allot.Tier3, GPUs: 8, TimeLimit: 10 * time.Minute})
	e.backdate(short.ID, 10*time.Minute)
	if p := e.cycle().Policy; p.QueueOrder != allot.QueueOrderResponse {
		t.Fatalf("the default policy's order is %q, want %q", p.QueueOrder, allot.QueueOrderResponse)
	}
	l, s := e.job(long.ID), e.job(short.ID)
	if s.Priority <= l.Priority {
		t.Errorf("response order: short job's priority %v ≤ the week-long job's %v", s.Priority, l.Priority)
	}
	for _, c := range []struct {
		j    allot.Job
		want float64 // (wait + T) / T
	}{{l, (2.0 + 7*24) / (7 * 24)}, {s, 2}} {
		b := c.j.Breakdown
		if b.Order != allot.QueueOrderResponse || math.Abs(b.ResponseRatio-c.want) > 1e-3 {
			t.Errorf("job %d: breakdown %+v, want order response with ratio %.4f", c.j.ID, b, c.want)
		}
		if got := b.ResponseRatio * allot.FairShareMultiplier(b.FairShare); math.Abs(got-c.j.Priority) > 2e-3*max(1, got) {
			t.Errorf("job %d: priority %v, want ratio × multiplier = %v", c.j.ID, c.j.Priority, got)
		}
	}

	_, err := e.st.UpdatePolicy(e.ctx, store.PolicyChange{Actor: e.admin.Email, Action: "policy.update", Object: "policy"},
		func(v *store.PolicyValues) error { return json.Unmarshal([]byte(`{"queue_order": "sjf"}`), v) })
	if fe := allot.Fields(err); fe["queue_order"] == "" {
		t.Errorf("queue_order sjf: %v, want a queue_order field error", err)
	}
	if p, _ := e.st.CurrentPolicy(e.ctx); p.QueueOrder != allot.QueueOrderResponse {
		t.Errorf("after a refused change the order is %q", p.QueueOrder)
	}

	e.set(`{"queue_order": "multifactor"}`)
	e.cycle()
	l, s = e.job(long.ID), e.job(short.ID)
	if l.Priority <= s.Priority || l.Breakdown.Order != "" || l.Breakdown.ResponseRatio != 0 {
		t.Errorf("multifactor: week-long job %v (%+v) vs short %v; want the older one first, no response ratio", l.Priority, l.Breakdown, s.Priority)
	}
}

// TestPolicyTier1FIFOTakesEffect: two tier-1 jobs of one team want the
// same 8 free T4 GPUs, an older day-long one and a younger 10-minute one
// whose response ratio, so its priority, is higher. With tier1_fifo on
// (the default) the older job starts; saved off at runtime, the next
// cycle serves the same pair (again on a node of their own) by priority:
// the younger job starts.
func TestPolicyTier1FIFOTakesEffect(t *testing.T) {
	e := newPolicyEnv(t, "gpu13") // parallel (seeded); gpu13: 8 × T4, the only node up
	pair := func() (older, younger allot.Job) {
		older = e.submit(allot.JobSpec{Team: "fraud", Tier: allot.Tier1, GPUs: 8, GPUType: "T4", TimeLimit: 24 * time.Hour})
		e.backdate(older.ID, 30*time.Minute) // ratio (0.5 h + 24 h) / 24 h ≈ 1.02
		younger = e.submit(allot.JobSpec{Team: "fraud", Tier: allot.Tier1, GPUs: 8, GPUType: "T4", TimeLimit: 10 * time.Minute})
		e.backdate(younger.ID, 5*time.Minute) // ratio (5 + 10) / 10 = 1.5
		return older, younger
	}
	states := func(a, b allot.Job) (allot.Job, allot.Job) { return e.job(a.ID), e.job(b.ID) }

	older, younger := pair()
	if p := e.cycle().Policy; !p.Tier1FIFO {
		t.Fatal("the default policy's tier1_fifo is false, want true")
	}
	o, y := states(older, younger)
	if o.State != allot.JobRunning || y.State != allot.JobPending {
		t.Errorf("tier1_fifo on: older job %s, younger %s (%s); want the older one started", o.State, y.State, y.PendingReason)
	}
	if y.Priority <= o.Priority {
		t.Fatalf("the younger job's priority %v ≤ the older one's %v: the case does not tell the two orders apart", y.Priority, o.Priority)
	}

	// Off: the waiting younger job is withdrawn, a second T4 node comes up,
	// and a new pair like the first competes for it.
	if _, err := e.st.CancelJob(e.ctx, &e.admin, younger.ID); err != nil {
		t.Fatal(err)
	}
	if p := e.set(`{"tier1_fifo": false}`); p.Tier1FIFO {
		t.Fatal("tier1_fifo saved false, read back true")
	}
	e.exec(`UPDATE nodes SET state = 'up', registered_at = $2, last_heartbeat = $2 WHERE name = $1`, "gpu14", e.st.Now())
	older2, younger2 := pair()
	if p := e.cycle().Policy; p.Tier1FIFO {
		t.Fatal("the cycle ran with tier1_fifo true after it was saved false")
	}
	o, y = states(older2, younger2)
	if y.State != allot.JobRunning || o.State != allot.JobPending {
		t.Errorf("tier1_fifo off: older job %s (%s), younger %s; want the younger, higher-priority one started", o.State, o.PendingReason, y.State)
	}
	if got := e.job(older.ID).State; got != allot.JobRunning {
		t.Errorf("the first pair's older job is %s, want still running", got)
	}
}

// TestPolicyHalfLifeTakesEffect: each cycle decays the fair-share usage
// with the half-life in force.
func TestPolicyHalfLifeTakesEffect(t *testing.T) {
	e := newPolicyEnv(t, "-")
	const start = 1e7
	// usageAfterAnHour sets fraud's decayed usage to start as of an hour
	// ago, runs a cycle and returns the usage the cycle left.
	usageAfterAnHour := func() float64 {
		e.exec(`INSERT INTO team_usage (team, gpu_seconds, updated_at) VALUES ('fraud', $1, $2)
			ON CONFLICT (team) DO UPDATE SET gpu_seconds = excluded.gpu_seconds, updated_at = excluded.updated_at`, start, e.st.Now().Add(-time.Hour))
		e.cycle()
		var u float64
		if err := e.pool.QueryRow(e.ctx, `SELECT gpu_seconds FROM team_usage WHERE team = 'fraud'`).Scan(&u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	// Both include the GPU-seconds fraud's jobs used in that hour (the same
	// but for milliseconds).
	week := usageAfterAnHour()
	e.set(`{"half_life_s": 3600}`)
	hour := usageAfterAnHour()
	weekDecay, hourDecay := start*math.Pow(0.5, 1.0/168), start*0.5
	if math.Abs((week-weekDecay)-(hour-hourDecay)) > 1e4 {
		t.Errorf("after an hour: %.0f with a 7-day half-life (decay alone %.0f), %.0f with a 1-hour one (decay alone %.0f)", week, weekDecay, hour, hourDecay)
	}
}

// TestPolicyPreemptionFieldsTakeEffect: MinRuntime keeps a fresh job from
// being preempted until it is lowered; the preemption then gives the
// victim the GracePeriod saved before.
func TestPolicyPreemptionFieldsTakeEffect(t *testing.T) {
	e := newPolicyEnv(t, "gpu13")
	victim := e.submit(allot.JobSpec{Team: "recs", Tier: allot.TierPreemptible, GPUs: 8, GPUType: "T4", TimeLimit: time.Hour})
	e.cycle()
	ref := store.LeaseRef{JobID: victim.ID, Segment: 1}
	if j := e.job(victim.ID); j.State != allot.JobRunning {
		t.Fatalf("victim is %s: %s", j.State, j.PendingReason)
	}
	if err := e.st.TakeLease(e.ctx, "gpu13", ref); err != nil {
		t.Fatal(err)
	}
	if err := e.st.LeaseStarted(e.ctx, "gpu13", ref, 4242); err != nil {
		t.Fatal(err)
	}
	urgent := e.submit(allot.JobSpec{Team: "fraud", Tier: allot.Tier1, GPUs: 8, GPUType: "T4", TimeLimit: 5 * time.Minute})
	stop := func() (*time.Time, int64) {
		var at *time.Time
		var grace int64
		if err := e.pool.QueryRow(e.ctx, `SELECT stop_requested_at, coalesce(stop_grace_s, 0) FROM leases WHERE job_id = $1 AND segment = 1`, victim.ID).Scan(&at, &grace); err != nil {
			t.Fatal(err)
		}
		return at, grace
	}
	e.cycle()
	if at, _ := stop(); at != nil {
		t.Fatalf("a job running for less than the default minimum runtime (10m) was preempted")
	}
	// A shorter grace alone changes nothing: the victim is still too young.
	e.set(`{"grace_period_s": 45}`)
	e.cycle()
	if at, _ := stop(); at != nil {
		t.Fatalf("preempted with min_runtime_s 600")
	}
	e.set(`{"min_runtime_s": 0}`)
	e.cycle()
	at, grace := stop()
	if at == nil || grace != 45 {
		t.Fatalf("after min_runtime_s 0: stop requested %v with grace %d s; want a stop with the saved 45 s", at, grace)
	}
	if j := e.job(urgent.ID); j.State != allot.JobPending {
		t.Errorf("the preemptor is %s while its victim has its grace", j.State)
	}
}

// monthSafe waits, near a month's edges, until this month has at least a
// few seconds behind it and a minute ahead: the budget tests compare this
// month's usage across cycles.
func (e *policyEnv) monthSafe() {
	now := e.st.Now()
	start := store.MonthStart(now)
	if end := start.AddDate(0, 1, 0); end.Sub(now) < time.Minute {
		time.Sleep(end.Sub(now) + 5*time.Second)
	} else if now.Sub(start) < 5*time.Second {
		time.Sleep(start.Add(5 * time.Second).Sub(now))
	}
}

// budgetAt gives team a budget it has used pct of (about 50 % or less, at
// least 2 %) this month and returns pct. It adds usage this month when the
// team has too little to measure (early in a month).
func (e *policyEnv) budgetAt(team string) float64 {
	e.t.Helper()
	e.monthSafe()
	used, err := e.st.TeamMonthUsage(e.ctx, team)
	if err != nil {
		e.t.Fatal(err)
	}
	if used < 100 {
		j := e.submit(allot.JobSpec{Team: team, Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Minute})
		now := e.st.Now()
		from := now.Add(-time.Minute)
		if ms := store.MonthStart(now); from.Before(ms) {
			from = ms
		}
		e.exec(`UPDATE jobs SET state = 'completed', segment = 1, submitted_at = $2, started_at = $2, ended_at = $3 WHERE id = $1`, j.ID, from, now)
		// 50 one-GPU allocations of at least 5 s each.
		e.exec(`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at) SELECT $1, 1, 'gpu01', 0, $2, $3 FROM generate_series(1, 50)`,
			j.ID, from, now)
		if used, err = e.st.TeamMonthUsage(e.ctx, team); err != nil || used < 100 {
			e.t.Fatalf("usage after adding some: %d, %v", used, err)
		}
	}
	hours := max(1, (2*used+3599)/3600)
	e.exec(`UPDATE teams SET monthly_budget_gpu_hours = $2 WHERE slug = $1`, team, hours)
	return float64(used) * 100 / float64(hours*3600)
}

// TestPolicyBudgetFieldsTakeEffect: a lower demotion threshold demotes a
// team's tier-3 jobs in the next cycle; a lower warning threshold fires
// its alert in the next budget check.
func TestPolicyBudgetFieldsTakeEffect(t *testing.T) {
	t.Parallel()
	t.Run("budget_demote_pct", func(t *testing.T) {
		e := newPolicyEnv(t, "-")
		pct := e.budgetAt("fraud")
		j := e.submit(allot.JobSpec{Team: "fraud", Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Minute})
		if j.Preemptible {
			t.Fatalf("demoted at submission at %.1f %% of the budget", pct)
		}
		e.cycle()
		if got := e.job(j.ID); got.Breakdown.Class != 3 || strings.Contains(got.PendingReason, "budget") {
			t.Fatalf("at %.1f %% with the default threshold: class %d, %q", pct, got.Breakdown.Class, got.PendingReason)
		}
		demote := max(1, int(pct)-1)
		e.set(fmt.Sprintf(`{"budget_warn_pct": 1, "budget_demote_pct": %d}`, demote))
		e.cycle()
		got := e.job(j.ID)
		if got.Breakdown.Class != 5 || !strings.Contains(got.PendingReason, fmt.Sprintf("over %d %% of its monthly budget", demote)) {
			t.Errorf("at %.1f %% with budget_demote_pct %d: class %d, %q", pct, demote, got.Breakdown.Class, got.PendingReason)
		}
	})
	t.Run("budget_warn_pct", func(t *testing.T) {
		e := newPolicyEnv(t, "-")
		pct := e.budgetAt("fraud")
		fired := func() []int {
			t.Helper()
			alerts, err := jobs.BudgetCheck(e.ctx, e.st, nil)
			if err != nil {
				t.Fatal(err)
			}
			var out []int
			for _, a := range alerts {
				if a.Team == "fraud" {
					out = append(out, a.ThresholdPct)
				}
			}
			return out
		}
		if got := fired(); len(got) != 0 {
			t.Fatalf("at %.1f %% with the default thresholds, alerts %v", pct, got)
		}
		warn := max(1, int(pct)-1)
		e.set(fmt.Sprintf(`{"budget_warn_pct": %d}`, warn))
		if got := fired(); !slices.Equal(got, []int{warn}) {
			t.Errorf("at %.1f %% with budget_warn_pct %d: alerts %v", pct, warn, got)
		}
	})
}

// burstEnv queues work burst nodes of 8 T4 GPUs could take: gpuHours of
// non-production jobs that have waited waited.
func (e *policyEnv) queueForBurst(gpuHours int, waited time.Duration) {
	e.t.Helper()
	for left := gpuHours; left > 0; {
		g := min(left, 8)
		j := e.submit(allot.JobSpec{Team: "nlp", Tier: allot.Tier4, GPUs: g, TimeLimit: time.Hour})
		e.backdate(j.ID, waited)
		left -= g
	}
}

func (e *policyEnv) burstDecision() burst.Decision {
	e.t.Helper()
	v, err := jobs.LoadBurstView(e.ctx, e.st, jobs.BurstConfig{GPUType: "T4", GPUsPerNode: 8})
	if err != nil {
		e.t.Fatal(err)
	}
	return v.Decision
}

// TestPolicyBurstFieldsTakeEffect: each burst setting, saved, changes the
// next evaluation's decision.
func TestPolicyBurstFieldsTakeEffect(t *testing.T) {
	t.Parallel()
	request2 := func(d burst.Decision) bool { return d.Action == burst.ActRequest && d.Count == 2 }
	for _, tc := range []struct {
		field, value string
		after        func(burst.Decision) bool
	}{
		// 60 GPU-h waiting 2.5 h: 2 nodes for a 4-hour horizon.
		{"burst_pending_gpu_hours", "100", func(d burst.Decision) bool { return d.Action == burst.ActNone }},
		{"burst_mean_wait_s", "14400", func(d burst.Decision) bool { return d.Action == burst.ActNone }},
		{"burst_max_nodes", "1", func(d burst.Decision) bool { return d.Action == burst.ActRequest && d.Count == 1 }},
		{"burst_monthly_budget", `"0.01"`, func(d burst.Decision) bool { return d.Action != burst.ActRequest }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			e := newPolicyEnv(t, "-")
			e.queueForBurst(60, 150*time.Minute)
			if d := e.burstDecision(); !request2(d) {
				t.Fatalf("with the default policy: %+v", d)
			}
			e.set(fmt.Sprintf(`{%q: %s}`, tc.field, tc.value))
			if d := e.burstDecision(); !tc.after(d) {
				t.Errorf("after %s = %s: %+v", tc.field, tc.value, d)
			}
		})
	}
	t.Run("burst_release_gpu_hours", func(t *testing.T) {
		e := newPolicyEnv(t, "-")
		// One idle, registered burst node.
		ev := store.BurstEvent{Kind: store.BurstRequest, Provider: "test", Reason: "test", NodesWanted: 1, GPUType: "T4", GPUsPerNode: 8}
		if err := e.st.CreateBurstEvent(e.ctx, &ev); err != nil {
			t.Fatal(err)
		}
		rate, err := e.st.RateAt(e.ctx, "T4", e.st.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := e.st.BurstProvisioned(e.ctx, ev.ID, []string{"spot-test-1"}, []string{store.NewNodeTokenSecret()}, rate, 1); err != nil {
			t.Fatal(err)
		}
		inv := store.NodeInventory{Hostname: "spot-test-1"}
		for i := range 8 {
			inv.GPUs = append(inv.GPUs, store.NodeGPU{Index: i, UUID: fmt.Sprintf("GPU-spot-%d", i), Model: "T4"})
		}
		if _, err := e.st.RegisterNode(e.ctx, "spot-test-1", inv); err != nil {
			t.Fatal(err)
		}
		e.queueForBurst(10, 150*time.Minute)
		if d := e.burstDecision(); d.Action != burst.ActRelease || !slices.Equal(d.Release, []string{"spot-test-1"}) {
			t.Fatalf("10 GPU-h pending, below the default 20: %+v", d)
		}
		e.set(`{"burst_release_gpu_hours": 5}`)
		if d := e.burstDecision(); d.Action != burst.ActNone {
			t.Errorf("10 GPU-h pending with burst_release_gpu_hours 5: %+v", d)
		}
	})
}

// TestPolicyHealthFieldsTakeEffect: saved health rules judge the next
// heartbeat; AutoUndrainAfter undrains at the next passing heartbeat.
func TestPolicyHealthFieldsTakeEffect(t *testing.T) {
	e := newPolicyEnv(t, "gpu13")
	gpus := func(xid ...int) []health.GPU {
		var out []health.GPU
		for i := range 8 {
			g := health.GPU{Index: i}
			if i == 3 {
				g.XIDs = xid
			}
			out = append(out, g)
		}
		return out
	}
	state := func(xid ...int) string {
		t.Helper()
		out, err := e.st.EvaluateHealth(e.ctx, "gpu13", gpus(xid...), "")
		if err != nil {
			t.Fatal(err)
		}
		return out.State
	}
	// XID 13 (graphics engine exception) is not among the default rules.
	if s := state(13); s != allot.NodeUp {
		t.Fatalf("XID 13 with the default rules: node %s", s)
	}
	rules := append(allot.DefaultHealthRules(), allot.HealthRule{Name: "xid-13", Metric: allot.MetricXID, Match: []int{13}, Severity: "critical", Action: allot.HealthDrain})
	if _, err := e.st.SetHealthRules(e.ctx, e.admin.Email, rules, nil, "test"); err != nil {
		t.Fatal(err)
	}
	if s := state(13); s != allot.NodeDrained && s != allot.NodeDraining {
		t.Fatalf("XID 13 with a rule for it: node %s", s)
	}
	// Healthy since an hour ago: admins undrain by hand by default.
	state()
	e.exec(`UPDATE nodes SET health_ok_since = $2 WHERE name = $1`, "gpu13", e.st.Now().Add(-time.Hour))
	if s := state(); s == allot.NodeUp {
		t.Fatalf("undrained with auto_undrain_after_s 0")
	}
	e.set(`{"auto_undrain_after_s": 1800}`)
	if s := state(); s != allot.NodeUp {
		t.Errorf("healthy for an hour with auto_undrain_after_s 1800: node %s", s)
	}
}

// TestPolicyHeartbeatMissedAfterTakesEffect: the lost-node sweep uses the
// saved silence limit, never less than two heartbeat intervals.
func TestPolicyHeartbeatMissedAfterTakesEffect(t *testing.T) {
	e := newPolicyEnv(t, "-")
	const interval = 10 * time.Second
	if err := e.st.AnnounceServer(e.ctx, "test-server"); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE api_servers SET started_at = $1`, e.st.Now().Add(-time.Hour))
	silent := func(node string, d time.Duration) {
		e.exec(`UPDATE nodes SET state = 'up', registered_at = $2, last_heartbeat = $3 WHERE name = $1`, node, e.st.Now().Add(-2*time.Hour), e.st.Now().Add(-d))
	}
	silent("gpu13", 45*time.Second)
	silent("gpu14", 15*time.Second)
	lost := func() []string {
		t.Helper()
		l, err := e.st.LostNodes(e.ctx, interval)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(l)
		return l
	}
	if l := lost(); len(l) != 0 {
		t.Fatalf("silent for 45 s and 15 s with the default 60 s: lost %v", l)
	}
	e.set(`{"heartbeat_missed_after_s": 30}`)
	if l := lost(); !slices.Equal(l, []string{"gpu13"}) {
		t.Fatalf("with heartbeat_missed_after_s 30: lost %v, want gpu13", l)
	}
	// 5 s is less than two 10-second heartbeats: 20 s applies.
	e.set(`{"heartbeat_missed_after_s": 5}`)
	if l := lost(); len(l) != 0 {
		t.Fatalf("with heartbeat_missed_after_s 5: lost %v; gpu14 is silent for 15 s, less than two heartbeats", l)
	}
	silent("gpu14", 25*time.Second)
	if l := lost(); !slices.Equal(l, []string{"gpu14"}) {
		t.Fatalf("silent for 25 s with heartbeat_missed_after_s 5: lost %v, want gpu14", l)
	}
}

// fakeProvider records provision requests and returns fresh names.
type fakeProvider struct {
	mu       sync.Mutex
	requests []burst.Request
}

func (p *fakeProvider) Name() string { return "fake" }

func (p *fakeProvider) Provision(_ context.Context, req burst.Request) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests = append(p.requests, req)
	names := make([]string, req.Count)
	for i := range names {
		names[i] = fmt.Sprintf("spot-%d-%d", len(p.requests), i)
	}
	return names, nil
}

func (p *fakeProvider) Release(context.Context, []string) error { return nil }

func (p *fakeProvider) counts() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for _, r := range p.requests {
		out = append(out, r.Count)
	}
	return out
}

// TestPolicyWorkerFollowsThePolicy runs the River worker: the scheduling
// period follows Cycle as it is saved (triggered cycles still run at
// once), and a saved budget or burst threshold is applied by a budget
// check and a burst evaluation right after the next cycle, not at their
// hourly period here.
func TestPolicyWorkerFollowsThePolicy(t *testing.T) {
	e := newPolicyEnv(t, "-")
	pct := e.budgetAt("fraud")
	e.queueForBurst(60, 150*time.Minute)
	e.set(`{"cycle_s": 3600}`)
	provider := &fakeProvider{}
	const tick = 100 * time.Millisecond
	client, err := jobs.NewClient(jobs.Config{Pool: e.pool, Store: e.st, CycleTick: tick, HeartbeatInterval: time.Hour, BudgetCheckInterval: time.Hour,
		Burst: jobs.BurstConfig{Provider: provider, GPUType: "T4", GPUsPerNode: 8, Interval: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Stop(context.Background()) }) //nolint:errcheck
	cycles := func() []time.Time {
		t.Helper()
		var at []time.Time
		if err := e.pool.QueryRow(e.ctx, `SELECT coalesce(array_agg(started_at ORDER BY id), '{}') FROM scheduling_cycles`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second) // deadline (real time)
		for !ok() {
			if time.Now().After(deadline) { // deadline (real time)
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// The first cycle runs at start; with Cycle = 1 h no other follows.
	eventually("the first cycle", func() bool { return len(cycles()) > 0 })
	n := len(cycles())
	time.Sleep(2 * time.Second) // 20 ticks
	if got := len(cycles()); got != n {
		t.Fatalf("%d cycles in 2 s with cycle_s 3600", got-n)
	}
	// Triggered cycles run at once.
	if err := jobs.Trigger(e.ctx, e.st, client); err != nil {
		t.Fatal(err)
	}
	eventually("a triggered cycle", func() bool { return len(cycles()) > n })
	// A 1-second period: cycles every second, not every tick.
	e.set(`{"cycle_s": 1}`)
	n = len(cycles())
	eventually("4 periodic cycles", func() bool { return len(cycles()) >= n+4 })
	at := cycles()[n:]
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < time.Second-tick {
			t.Errorf("cycles %v apart with cycle_s 1 (tick %v)", gap, tick)
		}
	}
	// Budget: the alert at the saved threshold fires after the next cycle
	// (the periodic check ran at start, and runs again in an hour).
	alerts := func() []int {
		t.Helper()
		var pcts []int
		if err := e.pool.QueryRow(e.ctx, `SELECT coalesce(array_agg(threshold_pct ORDER BY threshold_pct), '{}') FROM budget_alerts WHERE team = 'fraud' AND month = $1`,
			store.MonthStart(e.st.Now())).Scan(&pcts); err != nil {
			t.Fatal(err)
		}
		return pcts
	}
	warn := max(1, int(pct)-1)
	if slices.Contains(alerts(), warn) {
		t.Fatalf("alert at %d %% before the threshold was saved", warn)
	}
	e.set(fmt.Sprintf(`{"budget_warn_pct": %d}`, warn))
	eventually(fmt.Sprintf("fraud's alert at %d %% (used %.1f %%)", warn, pct), func() bool { return slices.Contains(alerts(), warn) })
	// Burst: nothing evaluated the 60 GPU-h queue yet (hourly); a saved
	// maximum of 1 node is evaluated after the next cycle and applied.
	if c := provider.counts(); len(c) != 0 {
		t.Fatalf("burst evaluated before any change: %v", c)
	}
	e.set(`{"burst_max_nodes": 1}`)
	eventually("a burst request", func() bool { return len(provider.counts()) > 0 })
	if c := provider.counts(); !slices.Equal(c, []int{1}) {
		t.Errorf("burst requests %v, want one of 1 node (burst_max_nodes 1)", c)
	}
}
