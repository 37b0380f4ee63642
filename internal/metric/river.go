package metric

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// River measures the jobs this worker works, as River middleware: queue
// wait (scheduled → started), run time and failures by kind. (Queue depth,
// allot_river_jobs, comes from the river_job table at scrape time: State.)
type River struct {
	river.MiddlewareDefaults
	Latency  *prometheus.HistogramVec
	Duration *prometheus.HistogramVec
	Failures *prometheus.CounterVec
	now      func() time.Time
}

// NewRiver creates the River job metrics and registers them on reg (nil:
// not registered). Put it in river.Config.Middleware.
func NewRiver(reg prometheus.Registerer) *River {
	b := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	m := &River{
		Latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "allot_river_job_latency_seconds",
			Help:    "Queue wait of River jobs this worker started: from the time a job was due (scheduled_at, or its insert when available at once) to the start of its attempt, by kind.",
			Buckets: b}, []string{"kind"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "allot_river_job_duration_seconds",
			Help: "Run time of River job attempts this worker worked, by kind.", Buckets: b}, []string{"kind"}),
		Failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "allot_river_job_failures_total",
			Help: "River job attempts this worker worked that returned an error or panicked (River retries them), by kind."}, []string{"kind"}),
		now: time.Now,
	}
	if reg != nil {
		reg.MustRegister(m.Latency, m.Duration, m.Failures)
	}
	return m
}

// Kinds gives each of kinds its series from the start (zero counts), so a
// kind that never failed still has allot_river_job_failures_total 0 and
// rate() and alerts see it.
func (m *River) Kinds(kinds ...string) {
	for _, k := range kinds {
		m.Latency.WithLabelValues(k)
		m.Duration.WithLabelValues(k)
		m.Failures.WithLabelValues(k)
	}
}

var _ rivertype.WorkerMiddleware = (*River)(nil)

// Work observes one attempt. The wall clock is right here, not Allot's
// clock: River stamps scheduled_at and attempted_at with real time.
func (m *River) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) (err error) {
	start := m.now()
	at := start
	if job.AttemptedAt != nil {
		at = *job.AttemptedAt
	}
	m.Latency.WithLabelValues(job.Kind).Observe(max(at.Sub(job.ScheduledAt).Seconds(), 0))
	defer func() {
		m.Duration.WithLabelValues(job.Kind).Observe(m.now().Sub(start).Seconds())
		if r := recover(); r != nil {
			m.Failures.WithLabelValues(job.Kind).Inc()
			panic(r) // River's executor turns it into a failed attempt
		}
		if err != nil {
			m.Failures.WithLabelValues(job.Kind).Inc()
		}
	}()
	return doInner(ctx)
}
