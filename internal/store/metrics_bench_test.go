package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
)

// BenchmarkMetricsState50kPending10kNodes is one read of the worker's live
// gauges (what a scrape costs PostgreSQL at most once per cache TTL) at the
// issue's scale: 10,000 nodes × 8 GPUs, 50,000 pending jobs, 60,000 GPUs
// allocated to 7,500 running jobs, on top of the demo's history.
func BenchmarkMetricsState50kPending10kNodes(b *testing.B) {
	ctx := context.Background()
	pool := storetest.Pool(b)
	st := store.New(pool)
	if err := demo.Seed(ctx, st); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO nodes (name, gpu_type, gpu_count, site, domain, state, registered_at, last_heartbeat)
			SELECT 'n' || lpad(n::text, 5, '0'), 'A100-80GB', 8, 'onprem', 'ib-c', (ARRAY['up', 'up', 'up', 'draining', 'down'])[1 + n % 5], now(), now()
			FROM generate_series(1, 10000) n`,
		`INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, state, submitted_at)
			SELECT 'p-' || i, (ARRAY['fraud', 'recs', 'nlp'])[1 + i % 3], (SELECT min(id) FROM users), (ARRAY['2', '3', '4', 'preemptible'])[1 + i % 4],
				1 << (i % 4), CASE WHEN i % 7 = 0 THEN NULL ELSE 'A100-80GB' END, 3600 * (1 + i % 12), '{true}', 'pending', now() - i * interval '1 second'
			FROM generate_series(1, 50000) i`,
		`INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, state, submitted_at, started_at, segment, run_as)
			SELECT 'r-' || i, (ARRAY['fraud', 'recs', 'nlp'])[1 + i % 3], (SELECT min(id) FROM users), '3', 8, 'A100-80GB', 7200, '{true}', 'running',
				now() - interval '1 hour', now() - interval '30 minutes', 1, '3'
			FROM generate_series(1, 7500) i`,
		`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at)
			SELECT j.id, 1, 'n' || lpad((1 + (j.id - m.lo) % 10000)::text, 5, '0'), g, j.started_at
			FROM jobs j CROSS JOIN (SELECT min(id) AS lo FROM jobs WHERE name LIKE 'r-%') m CROSS JOIN generate_series(0, 7) g
			WHERE j.name LIKE 'r-%'`,
		`ANALYZE`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		start := time.Now() // stopwatch
		s, err := st.MetricsState(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms/read")
		if len(s.Nodes) < 10000 || len(s.Jobs) == 0 {
			b.Fatalf("read %d nodes, %d job groups", len(s.Nodes), len(s.Jobs))
		}
	}
}
