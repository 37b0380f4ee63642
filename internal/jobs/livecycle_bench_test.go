package jobs_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/metric"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// BenchmarkLiveCycle50k times the live scheduling cycle (jobs.Scheduler
// over PostgreSQL: lock, usage decay, snapshot, the pure core, the plan
// applied and committed) at the size: 50,000 pending jobs on
// 10,000 nodes × 8 GPUs (80,000 GPUs), seeded by SQL. The cluster is full
// (one running 8-GPU job per node), as it is when that much work waits,
// so a cycle places nothing and rewrites what changed of the queue's
// priorities and reasons. The first cycle after seeding writes every
// pending job's reason; the steady ones after it are the figure. Phases
// come from the scheduler's own allot_scheduling_cycle_seconds{phase}.
//
// Each call does the same fixed work (the first cycle and 5 steady ones),
// so run it with -benchtime 1x:
//
//	go test -run '^$' -bench BenchmarkLiveCycle50k -benchtime 1x ./internal/jobs
//
// ALLOT_BENCH_PENDING and ALLOT_BENCH_NODES change the size;
// ALLOT_BENCH_TRACE=1 logs the steady cycles' mean time per SQL statement
// (from its start until its rows are read and closed).
func BenchmarkLiveCycle50k(b *testing.B) {
	pending, nodes := benchSize(b, "ALLOT_BENCH_PENDING", 50000), benchSize(b, "ALLOT_BENCH_NODES", 10000)
	ctx := context.Background()
	pool := storetest.Pool(b)
	st := store.New(pool)
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	seedLiveCycle(b, pool, st, now, pending, nodes)
	var tr *stmtTracer
	if os.Getenv("ALLOT_BENCH_TRACE") != "" {
		// The cycles on a pool that times each statement.
		tr = &stmtTracer{}
		tr.reset()
		cfg := pool.Config().Copy()
		cfg.ConnConfig.Tracer = tr
		traced, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer traced.Close()
		st = store.New(traced)
		st.Now = func() time.Time { return now }
	}

	reg := prometheus.NewRegistry()
	sch := &jobs.Scheduler{Store: st, CheckpointRoot: b.TempDir(), Metrics: jobs.NewCycleMetrics(reg)}
	cycle := func() (time.Duration, jobs.CycleResult) {
		t0 := time.Now() // stopwatch: the cycle's wall time
		res, err := sch.Cycle(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if !res.Ran {
			b.Fatal("the cycle lock was held: nothing else runs cycles here")
		}
		return time.Since(t0), res
	}
	b.ResetTimer()
	var steady []time.Duration
	var first time.Duration
	var firstPhases, phases map[string]float64
	for range b.N {
		before := phaseSums(b, reg)
		var res jobs.CycleResult
		first, res = cycle()
		firstPhases = phaseDelta(before, phaseSums(b, reg), 1)
		if res.Pending != pending || res.Started != 0 {
			b.Fatalf("first cycle: %d pending, %d started; want %d pending and none started (the cluster is full)", res.Pending, res.Started, pending)
		}
		before = phaseSums(b, reg)
		tr.reset()
		steady = steady[:0]
		for range 12 {
			// As on a live cluster, the policy's cycle period passes
			// between two cycles: every job has waited 10 s longer (its
			// age and response ratio move). Two minutes of cycles: the
			// rows' copies of the priorities are refreshed within them
			// (jobs.rowRefresh).
			now = now.Add(10 * time.Second)
			d, _ := cycle()
			steady = append(steady, d)
		}
		phases = phaseDelta(before, phaseSums(b, reg), len(steady))
		tr.log(b, len(steady))
	}
	b.StopTimer()
	slices.Sort(steady)
	p50, worst := steady[len(steady)/2], steady[len(steady)-1]
	b.ReportMetric(float64(first.Milliseconds()), "first-cycle-ms")
	b.ReportMetric(float64(p50.Milliseconds()), "cycle-p50-ms")
	b.ReportMetric(float64(worst.Milliseconds()), "cycle-max-ms")
	for _, ph := range []string{metric.PhaseLoad, metric.PhaseSchedule, metric.PhaseApply} {
		b.ReportMetric(phases[ph], ph+"-ms")
	}
	b.Logf("%d pending × %d nodes (%d GPUs): first cycle %v (load %.0f, schedule %.0f, apply %.0f ms); steady cycles p50 %v, max %v (mean load %.0f, schedule %.0f, apply %.0f ms); target ≤ 1 s",
		pending, nodes, nodes*8, first.Round(time.Millisecond), firstPhases[metric.PhaseLoad], firstPhases[metric.PhaseSchedule], firstPhases[metric.PhaseApply],
		p50.Round(time.Millisecond), worst.Round(time.Millisecond), phases[metric.PhaseLoad], phases[metric.PhaseSchedule], phases[metric.PhaseApply])
}

// seedLiveCycle seeds the demo, then replaces its queue with pending jobs
// waiting on nodes busy nodes × 8 GPUs, each running one 8-GPU job (the
// benchmark's cluster), as of now.
func seedLiveCycle(b testing.TB, pool *pgxpool.Pool, st *store.Store, now time.Time, pending, nodes int) {
	b.Helper()
	ctx := context.Background()
	if err := demo.Seed(ctx, st); err != nil {
		b.Fatal(err)
	}
	seedStart := time.Now() // stopwatch: the seeding's wall time
	type step struct {
		sql  string
		args []any
	}
	for _, q := range []step{
		// The demo's queue out of the way: only the synthetic cluster waits.
		{`UPDATE jobs SET state = 'cancelled', ended_at = submitted_at WHERE state = 'pending'`, nil},
		{`INSERT INTO nodes (name, gpu_type, gpu_count, declared_gpus, site, domain, rack, state, registered_at, last_heartbeat)
			SELECT 'lc' || lpad(i::text, 5, '0'), 'A100-80GB', 8, 8, 'onprem', 'lc-' || (i / 512), 'lc-r' || (i / 32), 'up', $1, $1
			FROM generate_series(0, $2 - 1) i`, []any{now, nodes}},
		{`INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, state, submitted_at, started_at, segment, run_as)
			SELECT 'lc-run-' || lpad(i::text, 5, '0'), (ARRAY['fraud','recs','nlp'])[i % 3 + 1], (SELECT min(id) FROM users), '3', 8, 'A100-80GB',
				7 * 86400, '{sleep,infinity}', 'running', $1::timestamptz - interval '2 hours', $1::timestamptz - interval '1 hour', 1, '3'
			FROM generate_series(0, $2 - 1) i`, []any{now, nodes}},
		{`INSERT INTO leases (job_id, segment, node, rank, gpu_indices, env, state, offered_at, taken_at, started_at, pid)
			SELECT id, 1, 'lc' || substr(name, 8), 0, '{0,1,2,3,4,5,6,7}', '{}', 'running', started_at, started_at, started_at, 1
			FROM jobs WHERE name LIKE 'lc-run-%'`, nil},
		{`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at)
			SELECT j.id, 1, 'lc' || substr(j.name, 8), g, j.started_at
			FROM jobs j CROSS JOIN generate_series(0, 7) g WHERE j.name LIKE 'lc-run-%'`, nil},
		{`INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, submitted_at, pending_reason)
			SELECT 'lc-pend-' || i, (ARRAY['fraud','recs','nlp'])[i % 3 + 1], (SELECT min(id) FROM users), (ARRAY['3','4'])[i % 2 + 1], 1 + i % 8,
				CASE WHEN i % 5 = 0 THEN NULL ELSE 'A100-80GB' END, 3600 * (1 + i % 12), '{sleep,3600}', $1::timestamptz - i * interval '1 second',
				'waiting for the next scheduling cycle'
			FROM generate_series(1, $2) i`, []any{now, pending}},
		{`ANALYZE`, nil},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.args...); err != nil {
			b.Fatalf("seeding: %v\n%s", err, q.sql)
		}
	}
	b.Logf("seeded %d pending jobs and %d busy nodes (%d GPUs) in %v", pending, nodes, nodes*8, time.Since(seedStart).Round(time.Millisecond))

}

// stmtTracer sums the time of each SQL statement, by its first words.
type stmtTracer struct {
	mu   sync.Mutex
	sums map[string]time.Duration
	n    map[string]int
}

type traceStart struct{}

type traceMark struct {
	sql string
	at  time.Time
}

func (t *stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceStart{}, traceMark{d.SQL, time.Now()}) // stopwatch
}

func (t *stmtTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	m, ok := ctx.Value(traceStart{}).(traceMark)
	if !ok {
		return
	}
	k := strings.Join(strings.Fields(m.sql), " ")
	k = k[:min(len(k), 90)]
	t.mu.Lock()
	t.sums[k] += time.Since(m.at) // stopwatch
	t.n[k]++
	t.mu.Unlock()
}

func (t *stmtTracer) reset() {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.sums, t.n = map[string]time.Duration{}, map[string]int{}
	t.mu.Unlock()
}

// log logs the statements over 1 ms a cycle, slowest first.
func (t *stmtTracer) log(b *testing.B, cycles int) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := slices.Collect(maps.Keys(t.sums))
	slices.SortFunc(keys, func(x, y string) int { return cmp.Compare(t.sums[y], t.sums[x]) })
	var sb strings.Builder
	for _, k := range keys {
		if per := t.sums[k] / time.Duration(cycles); per >= time.Millisecond {
			fmt.Fprintf(&sb, "\n  %6.1f ms/cycle  %3d×  %s", float64(per.Microseconds())/1000, t.n[k], k)
		}
	}
	b.Logf("statements of the %d steady cycles:%s", cycles, sb.String())
}

func benchSize(b *testing.B, env string, def int) int {
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive number", env, v)
	}
	return n
}

// phaseSums reads allot_scheduling_cycle_seconds' sum per phase.
func phaseSums(b *testing.B, reg *prometheus.Registry) map[string]float64 {
	fams, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "allot_scheduling_cycle_seconds" || f.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "phase" {
					out[l.GetValue()] += m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return out
}

// phaseDelta is the mean ms per cycle of each phase between two readings.
func phaseDelta(before, after map[string]float64, cycles int) map[string]float64 {
	out := map[string]float64{}
	for ph, v := range after {
		out[ph] = (v - before[ph]) * 1000 / float64(cycles)
	}
	return out
}
