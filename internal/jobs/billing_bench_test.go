package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
)

// BenchmarkRollupMonth1000GPUs rolls up one month of a 1,000-GPU cluster:
// 125 nodes × 8 GPUs busy all month with 100,000 8-GPU jobs of 54 minutes
// each (720,000 GPU-hours, 800,000 allocation rows). Run it with
// -benchtime 1x: each iteration rebuilds the lines from scratch.
func BenchmarkRollupMonth1000GPUs(b *testing.B) {
	ctx := context.Background()
	pool := storetest.Pool(b)
	st := store.New(pool)
	now := time.Date(2026, 12, 1, 0, 30, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	if err := demo.Seed(ctx, st); err != nil {
		b.Fatal(err)
	}
	// Only the synthetic month: drop the demo's history.
	for _, q := range []string{
		`DELETE FROM allocations`,
		`INSERT INTO nodes (name, gpu_type, gpu_count, site, domain, state) SELECT 'b' || lpad(n::text, 3, '0'), 'A100-80GB', 8, 'onprem', 'ib-c', 'up' FROM generate_series(1, 125) n`,
		`INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, state, submitted_at, started_at, ended_at, segment, run_as)
			SELECT 'bench-' || i, (ARRAY['fraud', 'recs', 'nlp'])[1 + i % 3], (SELECT min(id) FROM users), (ARRAY['2', '3', '4', 'preemptible'])[1 + i % 4], 8, 'A100-80GB', 7200,
				'{true}', 'completed', '2026-11-01'::timestamptz + (i / 125) * interval '54 minutes',
				'2026-11-01'::timestamptz + (i / 125) * interval '54 minutes', '2026-11-01'::timestamptz + (i / 125 + 1) * interval '54 minutes', 1,
				(ARRAY['2', '3', '4', 'preemptible'])[1 + i % 4]
			FROM generate_series(0, 99999) i`,
		`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at)
			SELECT j.id, 1, 'b' || lpad((1 + (j.id - m.lo) % 125)::text, 3, '0'), g, j.started_at, j.ended_at
			FROM jobs j CROSS JOIN (SELECT min(id) AS lo FROM jobs WHERE name LIKE 'bench-%') m CROSS JOIN generate_series(0, 7) g
			WHERE j.name LIKE 'bench-%'`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	var lines int
	for range b.N {
		res, err := jobs.Rollup(ctx, st, now)
		if err != nil {
			b.Fatal(err)
		}
		lines = res.Lines
	}
	b.StopTimer()
	got, err := st.ChargeLines(ctx, billing.YearMonth{Year: 2026, Month: time.November})
	if err != nil {
		b.Fatal(err)
	}
	sum, err := billing.Totals(got)
	if err != nil {
		b.Fatal(err)
	}
	if sum.Total.GPUSeconds != 720_000*3600 {
		b.Fatalf("billed %d GPU-seconds, want %d", sum.Total.GPUSeconds, 720_000*3600)
	}
	b.ReportMetric(float64(lines), "lines")
}
