package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
)

// TestSubSecondAllocationsBillWhatIsAllocated: allocations are stored on
// whole seconds (migration 0023), so what a job is billed equals the sum
// of released_at − started_at over its allocations exactly, sub-second
// allocations and fractions included: before, fractions were rounded away
// on the bill but not in the table.
func TestSubSecondAllocationsBillWhatIsAllocated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := storetest.Pool(t)
	st := store.New(pool)
	now := time.Date(2026, 11, 20, 12, 30, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	if err := demo.Seed(ctx, st); err != nil {
		t.Fatal(err)
	}
	u, err := st.UserByEmail(ctx, "felix@example.com")
	if err != nil {
		t.Fatal(err)
	}
	j, err := st.SubmitJob(ctx, &u, allot.JobSpec{Team: "fraud", Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Hour, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	var node, gpuType string
	if err := pool.QueryRow(ctx, `SELECT name, gpu_type FROM nodes ORDER BY name LIMIT 1`).Scan(&node, &gpuType); err != nil {
		t.Fatal(err)
	}
	base := now.Add(-2 * time.Hour).Truncate(time.Hour)
	ms := func(d int) time.Time { return base.Add(time.Duration(d) * time.Millisecond) }
	// [start, end) in ms after base: within one second, crossing one,
	// long with fractions at both ends, exact.
	spans := [][2]int{{400, 800}, {700, 2300}, {5500, 65250}, {70000, 71000}, {90999, 91001}}
	for i, s := range spans {
		if _, err := pool.Exec(ctx, `INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at) VALUES ($1, 1, $2, $3, $4, $5)`,
			j.ID, node, 60+i%4, ms(s[0]), ms(s[1])); err != nil {
			t.Fatal(err)
		}
	}
	var frac int
	var allocated float64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE started_at <> date_trunc('second', started_at) OR released_at <> date_trunc('second', released_at)),
		sum(extract(epoch FROM released_at - started_at)) FROM allocations WHERE job_id = $1`, j.ID).Scan(&frac, &allocated); err != nil {
		t.Fatal(err)
	}
	// Floors: 0→0, 0→2, 5→65, 70→71, 90→91: 0 + 2 + 60 + 1 + 1.
	if frac != 0 || allocated != 64 {
		t.Errorf("stored allocations: %d with fractions, %.3f s allocated; want none, 64", frac, allocated)
	}
	if _, err := jobs.Rollup(ctx, st, now); err != nil {
		t.Fatal(err)
	}
	lines, err := st.ChargeLines(ctx, billing.Month(now))
	if err != nil {
		t.Fatal(err)
	}
	var billed int64
	for _, l := range lines {
		if l.JobID == j.ID && l.Kind == billing.KindCharge {
			billed += l.GPUSeconds
		}
	}
	if float64(billed) != allocated {
		t.Errorf("billed %d GPU-seconds for %.3f allocated", billed, allocated)
	}
}
