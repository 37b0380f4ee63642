package store_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/jackc/pgx/v5"
)

// BenchmarkQueueApply50k times what ApplyPlan writes for a queue of
// 50,000 pending jobs in steady state (the same decisions again, as at
// BenchmarkLiveCycle50k's fixed clock): the whole apply, and, within it,
// the jobs-row write (pendingToJobRows) alone; the rest is storing the
// queue (one row of arrays).
//
//	go test -run '^$' -bench BenchmarkQueueApply50k -benchtime 1x ./internal/store
func BenchmarkQueueApply50k(b *testing.B) {
	const n = 50000
	ctx := context.Background()
	pool := storetest.Pool(b)
	st := store.New(pool)
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	if err := demo.Seed(ctx, st); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, submitted_at, pending_reason)
		SELECT 'qb-' || i, 'nlp', (SELECT min(id) FROM users), '3', 1 + i % 8, 'A100-80GB', 3600, '{true}', $1::timestamptz - i * interval '1 second', ''
		FROM generate_series(1, $2) i`, now, n); err != nil {
		b.Fatal(err)
	}
	rows, _ := pool.Query(ctx, `SELECT id FROM jobs WHERE state = 'pending' ORDER BY id`)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		b.Fatal(err)
	}
	pending := make([]store.PendingUpdate, len(ids))
	for i, id := range ids {
		pending[i] = store.PendingUpdate{JobID: id, Priority: float64(5000 - i%1000), Breakdown: allot.PriorityBreakdown{Class: 3, FairShare: 0.5, Size: 0.01, Age: 0.0123},
			Reason: "waiting for 4 GPUs on one node of type A100-80GB; largest free block is 0; 12 blocked job(s) ahead", EstStart: now.Add(time.Hour), EstKind: store.EstProjection}
	}
	apply := func() time.Duration {
		t0 := time.Now() // stopwatch
		if err := st.InTx(ctx, func(tx *store.Store) error { _, err := tx.ApplyPlan(ctx, nil, nil, pending); return err }); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	// The jobs-row write ApplyPlan still makes (pendingToJobRows), alone.
	m := len(pending)
	ids2, prio, reasons, bds := make([]int64, m), make([]float64, m), make([]string, m), make([]string, m)
	for i, p := range pending {
		bd, _ := json.Marshal(p.Breakdown)
		ids2[i], prio[i], reasons[i], bds[i] = p.JobID, p.Priority, p.Reason, string(bd)
	}
	replace := func() time.Duration {
		t0 := time.Now() // stopwatch
		_, err := pool.Exec(ctx, `
			UPDATE jobs j SET priority = u.p, priority_breakdown = u.b::jsonb, pending_reason = u.r
			FROM unnest($1::bigint[], $2::float8[], $3::text[], $4::text[]) AS u(id, p, r, b)
			WHERE j.id = u.id AND j.state = 'pending' AND (j.priority, j.pending_reason, j.priority_breakdown) IS DISTINCT FROM (u.p, u.r, u.b::jsonb)`,
			ids2, prio, reasons, bds)
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	b.ResetTimer()
	var applies, replaces []time.Duration
	for range b.N {
		first := apply()
		b.Logf("first apply (every jobs row written): %v", first.Round(time.Millisecond))
		for range 5 {
			applies = append(applies, apply())
			replaces = append(replaces, replace())
		}
	}
	b.StopTimer()
	slices.Sort(applies)
	slices.Sort(replaces)
	a, r := applies[len(applies)/2], replaces[len(replaces)/2]
	b.ReportMetric(float64(a.Milliseconds()), "apply-p50-ms")
	b.ReportMetric(float64(r.Milliseconds()), "jobs-rows-p50-ms")
	b.Logf("%d pending, steady: ApplyPlan p50 %v, of which the jobs-row write (compare every pending row) p50 %v; the rest stores the queue", n,
		a.Round(time.Millisecond), r.Round(time.Millisecond))
}
