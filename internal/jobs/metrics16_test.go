package jobs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/metric"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/riverqueue/river/rivertype"
)

// quietCluster is seeded with only node up, the demo's queue cancelled
// and no minimum runtime (so a fresh job may be preempted).
func quietCluster(t *testing.T, node string) (*store.Store, allot.User) {
	t.Helper()
	ctx := context.Background()
	st, _ := seeded(t, node)
	admin, err := st.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	queued, err := st.ListJobs(ctx, store.JobFilter{State: allot.JobPending, Limit: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range queued {
		if _, err := st.CancelJob(ctx, &admin, j.ID); err != nil {
			t.Fatal(err)
		}
	}
	p, err := st.CurrentPolicy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.MinRuntime, p.CreatedBy = 0, "test"
	if err := st.InsertPolicy(ctx, &p); err != nil {
		t.Fatal(err)
	}
	return st, admin
}

// TestCycleMetrics: a cycle counts itself, observes its three phases and
// each start's wait by tier, and a preemption by its (bounded) reason.
func TestCycleMetrics(t *testing.T) {
	ctx := context.Background()
	st, admin := quietCluster(t, "gpu13")
	reg := prometheus.NewRegistry()
	s := &jobs.Scheduler{Store: st, CheckpointRoot: "/tmp", Metrics: jobs.NewCycleMetrics(reg)}
	m := s.Metrics
	low, err := st.SubmitJob(ctx, &admin, allot.JobSpec{Name: "low", Team: "fraud", Tier: allot.TierPreemptible, GPUs: 8, GPUType: "T4",
		TimeLimit: time.Hour, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := s.Cycle(ctx); err != nil || res.Started != 1 {
		t.Fatalf("first cycle: %+v %v", res, err)
	}
	if got := value(t, m.JobsStarted.WithLabelValues(string(allot.TierPreemptible))); got != 1 {
		t.Errorf("started preemptible = %v", got)
	}
	if got := histCount(t, reg, "allot_job_wait_seconds", "tier", string(allot.TierPreemptible)); got != 1 {
		t.Errorf("job waits of preemptible = %d", got)
	}
	if _, err := st.SubmitJob(ctx, &admin, allot.JobSpec{Name: "urgent", Team: "fraud", Tier: allot.Tier2, GPUs: 8, GPUType: "T4",
		TimeLimit: time.Hour, Command: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Cycle(ctx)
	if err != nil || res.Preempted != 1 {
		t.Fatalf("second cycle: %+v %v", res, err)
	}
	if got := value(t, m.Cycles); got != 2 {
		t.Errorf("cycles = %v", got)
	}
	for _, phase := range []string{metric.PhaseLoad, metric.PhaseSchedule, metric.PhaseApply} {
		if n := histCount(t, reg, "allot_scheduling_cycle_seconds", "phase", phase); n != 2 {
			t.Errorf("phase %s observed %d times, want 2", phase, n)
		}
	}
	var preempted float64
	for _, r := range metric.PreemptReasons {
		v := value(t, m.Preemptions.WithLabelValues(r))
		preempted += v
		if v != 0 && r != "preemptible" && r != "reserved" {
			t.Errorf("the preemptible job was preempted for reason %q", r)
		}
	}
	if preempted != 1 {
		t.Errorf("preemptions = %v, want 1", preempted)
	}
	j, err := st.GetJob(ctx, low.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := float64(j.StartedAt.Sub(j.SubmittedAt)) / float64(time.Second)
	// The wait ends at the cycle's snapshot instant, a moment before the
	// apply stamps started_at.
	if got := histSum(t, reg, "allot_job_wait_seconds", "tier", string(allot.TierPreemptible)); got <= 0 || got > want || got < want-1 {
		t.Errorf("wait of the preemptible job = %v s, want just under %v s (start − submit)", got, want)
	}
}

// TestPreemptReason maps each of the core's reason texts to its label.
func TestPreemptReason(t *testing.T) {
	for text, want := range map[string]string{
		"preempted for tier 1 job 7: it runs as preemptible":                                                               "preemptible",
		"preempted for job 9 of team nlp, which is under its guarantee: team recs runs above its guarantee (16 of 8 GPUs)": "above_guarantee",
		"preempted for job 9 of team nlp, which is under its guarantee: team recs has no guarantee":                        "above_guarantee",
		"preempted for tier 1 job 3: tier-1 work may preempt tier 3-4":                                                     "tier1",
		"preempted for tier 2 job 3: tier 2 takes back its 16 reserved GPUs":                                               "reserved",
		"something new": "other",
	} {
		if got := metric.PreemptReason(text); got != want {
			t.Errorf("PreemptReason(%q) = %q, want %q", text, got, want)
		}
	}
}

// TestRiverMiddleware: an attempt's queue wait, run time and failure
// (an error or a panic, which goes on to River).
func TestRiverMiddleware(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metric.NewRiver(reg)
	m.Kinds("idle")
	// River stamps a job's times on the real clock, not on Allot's business
	// clock: the middleware measures against the same real clock.
	now := time.Now()
	scheduled, attempted := now.Add(-3*time.Second), now.Add(-time.Second)
	job := &rivertype.JobRow{Kind: "k", ScheduledAt: scheduled, AttemptedAt: &attempted}
	if err := m.Work(context.Background(), job, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := m.Work(context.Background(), job, func(context.Context) error { return boom }); err != boom {
		t.Fatalf("error not passed on: %v", err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("panic not passed on")
			}
		}()
		m.Work(context.Background(), job, func(context.Context) error { panic("bang") }) //nolint:errcheck
	}()
	if got := value(t, m.Failures.WithLabelValues("k")); got != 2 {
		t.Errorf("failures = %v, want 2", got)
	}
	if got := value(t, m.Failures.WithLabelValues("idle")); got != 0 {
		t.Errorf("idle failures = %v", got)
	}
	if n := histCount(t, reg, "allot_river_job_latency_seconds", "kind", "k"); n != 3 {
		t.Errorf("latency observations = %d", n)
	}
	if s := histSum(t, reg, "allot_river_job_latency_seconds", "kind", "k"); s < 5.99 || s > 6.01 {
		t.Errorf("latency sum = %v, want 3 × 2 s", s)
	}
	if n := histCount(t, reg, "allot_river_job_duration_seconds", "kind", "k"); n != 3 {
		t.Errorf("duration observations = %d", n)
	}
}

// TestStateCache: the live-state gauges are read from PostgreSQL at most
// once per TTL; past it, a scrape sees the change.
func TestStateCache(t *testing.T) {
	ctx := context.Background()
	st, admin := quietCluster(t, "gpu13")
	c := metric.NewState(st)
	c.TTL = time.Hour
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	pending := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		total := 0.0
		for _, mf := range mfs {
			if mf.GetName() == "allot_pending_jobs" {
				for _, m := range mf.GetMetric() {
					total += m.GetGauge().GetValue()
				}
			}
		}
		return total
	}
	if got := pending(); got != 0 {
		t.Fatalf("pending = %v on a quiet cluster", got)
	}
	if _, err := st.SubmitJob(ctx, &admin, allot.JobSpec{Name: "big", Team: "nlp", Tier: allot.Tier3, GPUs: 32, GPUType: "T4",
		TimeLimit: time.Hour, Command: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if got := pending(); got != 0 {
		t.Errorf("pending = %v within the TTL, want the cached 0", got)
	}
	c.TTL = time.Nanosecond
	if got := pending(); got != 1 {
		t.Errorf("pending = %v past the TTL, want 1", got)
	}
}

func histMetric(t *testing.T, reg *prometheus.Registry, name, label, value string) *dto.Histogram {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetHistogram()
				}
			}
		}
	}
	return &dto.Histogram{}
}

func histCount(t *testing.T, reg *prometheus.Registry, name, label, value string) uint64 {
	t.Helper()
	return histMetric(t, reg, name, label, value).GetSampleCount()
}

func histSum(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	return histMetric(t, reg, name, label, value).GetSampleSum()
}

// value reads one counter or gauge.
func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.GetGauge().GetValue()
}

// TestStateDatabaseAway: when PostgreSQL does not answer, a scrape has no
// live series, says so in allot_metrics_state_errors_total, and keeps the
// other collectors' series.
func TestStateDatabaseAway(t *testing.T) {
	t.Parallel()
	pool := storetest.Pool(t)
	reg := prometheus.NewRegistry()
	c := metric.NewState(store.New(pool))
	c.Timeout = time.Second
	reg.MustRegister(c, metric.NewPool("main", pool))
	pool.Close()
	for want := 1.0; want <= 2; want++ {
		mfs, err := reg.Gather()
		if err == nil {
			t.Fatal("Gather with the database away: no error")
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				got[mf.GetName()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		if got["allot_metrics_state_errors_total"] != want {
			t.Errorf("state errors = %v, want %v", got["allot_metrics_state_errors_total"], want)
		}
		if _, ok := got["allot_pending_jobs"]; ok {
			t.Error("live series without a database")
		}
		if _, ok := got["allot_db_pool_max_conns"]; !ok {
			t.Error("the pool's series are missing too")
		}
	}
}
