package metric

import (
	"strings"

	"github.com/allotlabs/allot/internal/allot"

	"github.com/prometheus/client_golang/prometheus"
)

// Cycle phases of allot_scheduling_cycle_seconds.
const (
	PhaseLoad     = "load"     // lock, decay usage, snapshot from PostgreSQL
	PhaseSchedule = "schedule" // the pure core (scheduler.Schedule) and the orders
	PhaseApply    = "apply"    // writing the plan and the cycle record
)

// WaitBuckets are the buckets of allot_job_wait_seconds: from a second to
// a day (a job waiting longer lands in +Inf).
var WaitBuckets = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 12 * 3600, 24 * 3600}

// Scheduler holds the scheduling loop's in-process metrics: what this
// worker's cycles did. (What the cluster looks like, pending and running
// jobs, GPUs, nodes, budgets, comes from PostgreSQL at scrape time: see
// State.)
type Scheduler struct {
	CycleSeconds *prometheus.HistogramVec // by phase
	Cycles       prometheus.Counter
	Stale        prometheus.Counter
	Preemptions  *prometheus.CounterVec // by reason (PreemptReason)
	JobsStarted  *prometheus.CounterVec // by tier
	JobWait      *prometheus.HistogramVec
}

// NewScheduler creates the scheduling metrics and registers them on reg
// (nil: not registered, for tests and processes without a registry).
func NewScheduler(reg prometheus.Registerer) *Scheduler {
	m := &Scheduler{
		CycleSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "allot_scheduling_cycle_seconds",
			Help:    "Duration of this worker's scheduling cycles by phase: load (lock, usage decay, snapshot from PostgreSQL), schedule (the core's plan), apply (writing the plan).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"phase"}),
		Cycles: prometheus.NewCounter(prometheus.CounterOpts{Name: "allot_scheduling_cycles_total",
			Help: "Scheduling cycles this worker ran to the end (applied or failed; not the ones that found another worker holding the cycle lock)."}),
		Stale: prometheus.NewCounter(prometheus.CounterOpts{Name: "allot_schedule_stale_plans_total",
			Help: "Plans dropped because the state changed under them (the cycle is retried)."}),
		Preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "allot_preemptions_total",
			Help: "Preemptions issued by this worker's scheduling cycles, by reason: preemptible (the victim ran as preemptible), above_guarantee (its team ran above its guarantee), reserved (a production tier took back its reserved GPUs), tier1 (tier-1 work preempting tier 3-4), other."},
			[]string{"reason"}),
		JobsStarted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "allot_jobs_started_total",
			Help: "Jobs (segments) started by this worker's scheduling cycles, by the tier they run as."}, []string{"tier"}),
		JobWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "allot_job_wait_seconds",
			Help:    "Queue wait of jobs started by this worker's cycles (the cycle's snapshot instant − submit; a requeued job counts from its submission), by the tier it was submitted in.",
			Buckets: WaitBuckets}, []string{"tier"}),
	}
	for _, p := range []string{PhaseLoad, PhaseSchedule, PhaseApply} {
		m.CycleSeconds.WithLabelValues(p) // present from the start, so rate() has a series
	}
	for _, r := range PreemptReasons {
		m.Preemptions.WithLabelValues(r)
	}
	// Every tier's series from the start: otherwise increase() never counts
	// a tier's first start after a worker's restart.
	for _, t := range allot.Tiers {
		m.JobsStarted.WithLabelValues(string(t))
		m.JobWait.WithLabelValues(string(t))
	}
	if reg != nil {
		reg.MustRegister(m.CycleSeconds, m.Cycles, m.Stale, m.Preemptions, m.JobsStarted, m.JobWait)
	}
	return m
}

// PreemptReasons are the values of allot_preemptions_total's reason.
var PreemptReasons = []string{"preemptible", "above_guarantee", "reserved", "tier1", "other"}

// PreemptReason maps the core's human-readable preemption reason (see
// scheduler.markVictim) to a bounded label value: the text names jobs and
// teams, which would make a label of unbounded cardinality.
func PreemptReason(text string) string {
	switch {
	case strings.Contains(text, "reserved GPUs"):
		return "reserved"
	case strings.Contains(text, "runs as preemptible"):
		return "preemptible"
	case strings.Contains(text, "guarantee ("), strings.Contains(text, "has no guarantee"):
		return "above_guarantee"
	case strings.Contains(text, "tier-1 work"):
		return "tier1"
	}
	return "other"
}

// Billing holds the billing rollup's metrics.
type Billing struct {
	Seconds     prometheus.Histogram
	Failures    prometheus.Counter
	LastSuccess prometheus.Gauge
}

// NewBilling creates the rollup metrics and registers them on reg (nil:
// not registered).
func NewBilling(reg prometheus.Registerer) *Billing {
	m := &Billing{
		Seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "allot_billing_rollup_seconds",
			Help:    "Duration of this worker's billing rollups (charge lines of every open month recomputed from the allocations).",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}}),
		Failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "allot_billing_rollup_failures_total",
			Help: "Billing rollups of this worker that failed (River retries them)."}),
		LastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "allot_billing_rollup_last_success_timestamp_seconds",
			Help: "Unix time of the last billing rollup that succeeded in this worker (0 until its first; the hourly rollup also runs when a worker starts, unless another worker ran it this hour). Several workers: take max without(instance)."}),
	}
	if reg != nil {
		reg.MustRegister(m.Seconds, m.Failures, m.LastSuccess)
	}
	return m
}
