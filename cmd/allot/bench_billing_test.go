package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
)

// BenchmarkChargebackCSV1M streams a 1,000,000-line chargeback CSV through
// the real server and reports wall time and the server's peak heap growth
// (it must stay flat: rows are streamed, never held). -benchtime 1x.
func BenchmarkChargebackCSV1M(b *testing.B) {
	ctx := context.Background()
	m := &Main{}
	startSeeded(b, &m)
	_, err := m.Pool.Exec(ctx, `
		INSERT INTO charge_lines (line_key, month, kind, usage_hour, job_id, segment, team, cost_center, user_email, tier, gpu_type,
			rate_from, multiplier_from, from_at, to_at, gpu_seconds, rate_micros, multiplier_bp, amount_micros, currency)
		SELECT 'bench|' || i, '2026-10-01', 'charge', '2026-10-01'::timestamptz + (i % 744) * interval '1 hour', (SELECT min(id) FROM jobs),
			i, 'nlp', 'CC-4300', 'noah@example.com', '3', 'A100-80GB', '2025-01-01', '1970-01-01',
			'2026-10-01'::timestamptz + (i % 744) * interval '1 hour', '2026-10-01'::timestamptz + (i % 744 + 1) * interval '1 hour',
			28800, 3200000, 10000, 25600000, 'USD'
		FROM generate_series(1, 1000000) i`)
	if err != nil {
		b.Fatal(err)
	}
	// As autovacuum would after such a load (it may be off on a test
	// server): without statistics the planner sorts the whole month for
	// every page.
	if _, err := m.Pool.Exec(ctx, `ANALYZE charge_lines`); err != nil {
		b.Fatal(err)
	}
	u, _ := m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Finance])
	token, _, err := m.Store.CreateAPIToken(ctx, u.ID, "bench")
	if err != nil {
		b.Fatal(err)
	}
	// Allot's own CSV and the FOCUS export of the same lines.
	for _, format := range []string{"allot", "focus"} {
		b.Run(format, func(b *testing.B) {
			url := m.URL() + "/api/v1/chargeback.csv?month=2026-10"
			if format == "focus" {
				url += "&format=focus"
			}
			runtime.GC()
			var base runtime.MemStats
			runtime.ReadMemStats(&base)
			var peak atomic.Uint64
			stop := make(chan struct{})
			go func() {
				var ms runtime.MemStats
				for {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
						runtime.ReadMemStats(&ms)
						if ms.HeapInuse > peak.Load() {
							peak.Store(ms.HeapInuse)
						}
					}
				}
			}()
			b.ResetTimer()
			start := time.Now() // stopwatch
			var lines int
			for range b.N {
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(make([]byte, 64<<10), 1<<20)
				lines = 0
				for sc.Scan() {
					lines++
				}
				io.Copy(io.Discard, resp.Body) //nolint:errcheck
				resp.Body.Close()
			}
			wall := time.Since(start)
			close(stop)
			b.StopTimer()
			if lines != 1_000_001 {
				b.Fatalf("%s CSV has %d lines, want 1,000,001", format, lines)
			}
			grow := float64(peak.Load()) - float64(base.HeapInuse)
			b.ReportMetric(wall.Seconds()/float64(b.N), "s/export")
			b.ReportMetric(grow/(1<<20), "MiB-peak-heap-growth")
			b.Logf("%s: 1,000,000 lines in %v; server heap in use: %.1f MiB before, peak %.1f MiB", format, wall/time.Duration(b.N),
				float64(base.HeapInuse)/(1<<20), float64(peak.Load())/(1<<20))
		})
	}
}

// BenchmarkTeamDashboardYear measures the team budget dashboard's latency
// (GET /api/v1/teams/nlp/budget, as the lead) with a year of history: 400k
// allocation rows over 12 months for the team. -benchtime 1x.
func BenchmarkTeamDashboardYear(b *testing.B) {
	ctx := context.Background()
	m := &Main{}
	startSeeded(b, &m)
	for _, q := range []string{
		`INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, state, submitted_at, started_at, ended_at, segment, run_as)
			SELECT 'year-' || i, 'nlp', (SELECT id FROM users WHERE email = 'noah@example.com'), '3', 8, 'A100-80GB', 36000, '{true}', 'completed',
				now() - interval '365 days' + i * interval '10 minutes', now() - interval '365 days' + i * interval '10 minutes',
				now() - interval '365 days' + i * interval '10 minutes' + interval '9 minutes', 1, '3'
			FROM generate_series(0, 49999) i`,
		`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at)
			SELECT j.id, 1, 'gpu09', g, j.started_at, j.ended_at FROM jobs j CROSS JOIN generate_series(0, 7) g WHERE j.name LIKE 'year-%'`,
		`ANALYZE`,
	} {
		if _, err := m.Pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	u, _ := m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Lead])
	token, _, err := m.Store.CreateAPIToken(ctx, u.ID, "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var lat []time.Duration
	for range b.N {
		lat = lat[:0]
		for range 200 {
			req, _ := http.NewRequest("GET", m.URL()+"/api/v1/teams/nlp/budget", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			t0 := time.Now() // stopwatch
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body) //nolint:errcheck
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
			lat = append(lat, time.Since(t0))
		}
	}
	b.StopTimer()
	sortDurations(lat)
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(p(0.5), "p50-ms")
	b.ReportMetric(p(0.95), "p95-ms")
	b.Logf("team dashboard with a year of history (400k allocation rows): p50 %.1f ms, p95 %.1f ms over 200 requests", p(0.5), p(0.95))
}

func sortDurations(d []time.Duration) {
	for i := 1; i < len(d); i++ {
		for j := i; j > 0 && d[j] < d[j-1]; j-- {
			d[j], d[j-1] = d[j-1], d[j]
		}
	}
}
