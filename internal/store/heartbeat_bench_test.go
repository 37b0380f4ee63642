package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/health"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
)

// BenchmarkHeartbeatPath: what the server does for one heartbeat of an
// 8-GPU node running nothing (the node row, 8 samples, the node's leases,
// the health read), one heartbeat after another on one connection: the
// transactional paths before issue 16 (BEGIN, SET LOCAL, statements,
// COMMIT: 9 round trips, two transactions), the statements (3 round
// trips, one asynchronous commit) and the batch the server sends now
// (RecordHeartbeatRound: 1 round trip, one asynchronous commit).
//
//	go run ./cmd/allot test-env -- go test -run '^$' -bench BenchmarkHeartbeatPath -benchtime 2000x ./internal/store
func BenchmarkHeartbeatPath(b *testing.B) {
	pool := storetest.Pool(b)
	st := store.New(pool)
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	ctx := context.Background()
	if err := demo.Seed(ctx, st); err != nil {
		b.Fatal(err)
	}
	inv := store.NodeInventory{Hostname: "gpu13", Backend: "fake"}
	samples := make([]store.GPUSample, 8)
	gpus := make([]health.GPU, 8)
	for i := range 8 {
		inv.GPUs = append(inv.GPUs, store.NodeGPU{Index: i, UUID: "GPU-bench-" + string(rune('a'+i)), Model: "T4"})
		samples[i] = store.GPUSample{Index: i, UtilPct: 50, MemUsedMiB: 1024, MemTotalMiB: 15360, TempC: 40, PowerW: 70}
		gpus[i] = health.GPU{Index: i}
	}
	if _, err := st.RegisterNode(ctx, "gpu13", inv); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		record func() (store.HeartbeatOutcome, error)
		jobs   func() ([]store.Orphan, error)
	}{
		{"transactions", func() (store.HeartbeatOutcome, error) { return st.RecordHeartbeatTx(ctx, "gpu13", samples) },
			func() ([]store.Orphan, error) { return st.HeartbeatJobsTx(ctx, "gpu13", nil) }},
		{"statements", func() (store.HeartbeatOutcome, error) { return st.RecordHeartbeatAsync(ctx, "gpu13", samples, "") },
			func() ([]store.Orphan, error) { return st.HeartbeatJobsAsync(ctx, "gpu13", nil) }},
		{"batch", nil, nil},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				now = now.Add(10 * time.Second)
				if c.record == nil {
					if _, err := st.RecordHeartbeatRound(ctx, "gpu13", samples, nil, gpus, ""); err != nil {
						b.Fatal(err)
					}
					continue
				}
				if _, err := c.record(); err != nil {
					b.Fatal(err)
				}
				if _, err := c.jobs(); err != nil {
					b.Fatal(err)
				}
				if _, err := st.EvaluateHeartbeatHealth(ctx, "gpu13", gpus, "", ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
