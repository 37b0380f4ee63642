package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tierJob records a finished job of tier on node's GPUs, every GPU busy
// (90 %) with peakMiB of an 80 GB GPU's memory used, and returns its id.
func tierJob(t *testing.T, st *store.Store, pool *pgxpool.Pool, name string, tier allot.TierID, node string, gpus int, peakMiB int64, start, end time.Time) int64 {
	t.Helper()
	ctx := context.Background()
	u, err := st.UserByEmail(ctx, "noah@example.com")
	if err != nil {
		t.Fatal(err)
	}
	var idx []int
	for g := range gpus {
		idx = append(idx, g)
	}
	spec := allot.JobSpec{Name: name, Team: "nlp", Tier: tier, GPUs: gpus, GPUType: "A100-80GB", TimeLimit: 8 * time.Hour, Command: []string{"true"}}
	if err := st.RecordFinishedJob(ctx, &u, spec, allot.JobCompleted, start, start, end, node, idx); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := pool.QueryRow(ctx, `SELECT id FROM jobs WHERE name = $1`, name).Scan(&id); err != nil {
		t.Fatal(err)
	}
	for g := range gpus {
		meterSamples(t, pool, node, g, id, start, end, 90, peakMiB, 81920)
	}
	return id
}

// TestRightSizingGPUTypeAllowedForTier: a cheaper-GPU-type finding names
// only a type the job's tier may run on, with enough memory for the job's
// peak and enough GPUs at the sites the tier may use, and prices the saving
// at that type's rate. Besides the demo's A100-80GB (3.20 USD) and T4
// (16 GB, 0.35 USD) on premises there are: A100-spot (80 GB, 1.40 USD)
// on one 4-GPU burst node only; H100-80GB (80 GB, 4.00 USD, on premises:
// more memory per dollar nowhere, so never suggested); L4 (24 GB,
// 0.20 USD) with no node at all (nothing could run there).
func TestRightSizingGPUTypeAllowedForTier(t *testing.T) {
	st, pool, _ := meterSetup(t)
	ctx := context.Background()
	from := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for _, g := range []allot.GPUType{
		{Name: "A100-spot", MemoryGB: 80, HourlyRate: usd(1_400_000)},
		{Name: "H100-80GB", MemoryGB: 80, HourlyRate: usd(4_000_000)},
		{Name: "L4", MemoryGB: 24, HourlyRate: usd(200_000)},
	} {
		if err := st.CreateGPUType(ctx, &g, from); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []allot.Node{
		{Name: "burst-spot-0", GPUType: "A100-spot", GPUCount: 4, Site: allot.SiteCloud, State: allot.NodeDown},
		{Name: "gpu17", GPUType: "H100-80GB", GPUCount: 8, Site: allot.SiteOnPrem, State: allot.NodeDown},
	} {
		if err := st.CreateNode(ctx, &n); err != nil {
			t.Fatal(err)
		}
	}
	const big, small = 61440, 9318 // MiB: 60 GB (fits no T4) and 9.1 GB
	start, end := nov19(8, 0), nov19(11, 0)
	// 1 GPU for 3 h each.
	prodBig := tierJob(t, st, pool, "tier2-60gb", allot.Tier2, "gpu02", 1, big, start, end)
	expBig := tierJob(t, st, pool, "tier3-60gb", allot.Tier3, "gpu03", 1, big, start, end)
	prodSmall := tierJob(t, st, pool, "tier2-9gb", allot.Tier2, "gpu04", 1, small, start, end)
	expSmall := tierJob(t, st, pool, "tier3-9gb", allot.Tier3, "gpu06", 1, small, start, end)
	// 8 GPUs: more than the burst type's 4.
	expWide := tierJob(t, st, pool, "tier3-60gb-8", allot.Tier3, "gpu05", 8, big, start, end)
	if _, err := st.RollupJobUsage(ctx, nov19(0, 0), nov19(23, 0)); err != nil {
		t.Fatal(err)
	}
	rep, err := st.RightSizing(ctx, nov19(0, 0), nov19(0, 0).Add(24*time.Hour), store.RightSizingScope{})
	if err != nil {
		t.Fatal(err)
	}
	type finding struct {
		Suggestion string
		Savings    allot.Money
	}
	got := map[int64]finding{}
	cost := map[int64]allot.Money{}
	for _, j := range rep.Jobs {
		cost[j.JobID] = j.Cost
		for _, f := range j.Flags {
			if f.Rule == store.RuleCheaperGPUType {
				got[j.JobID] = finding{f.Suggestion, f.Savings}
			}
		}
	}
	want := map[int64]finding{
		// Tier 3 may use burst nodes: 3 × (3.20 − 1.40) = 5.40.
		expBig: {"use gpu_type A100-spot (on burst nodes: tiers 3, 4 and preemptible only): peak memory 60 GB fits its 80 GB", usd(5_400_000)},
		// T4 is cheaper than A100-spot and on premises: 3 × (3.20 − 0.35) = 8.55.
		expSmall: {"use gpu_type T4: peak memory 9.1 GB fits its 16 GB", usd(8_550_000)},
		// Tier 2 (× 1.25): per hour 4.00 against 0.4375, billed 0.44: 3 × 3.56.
		prodSmall: {"use gpu_type T4: peak memory 9.1 GB fits its 16 GB", usd(10_680_000)},
		// prodBig: A100-spot is the only cheaper type with 80 GB, and tier 2
		// never runs on burst nodes: no finding. expWide: 8 GPUs do not fit
		// the 4 burst GPUs.
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("cheaper-type findings (-want +got)\n%s\njobs: tier2-60gb %d, tier3-60gb %d, tier2-9gb %d, tier3-9gb %d, tier3-60gb-8 %d",
			d, prodBig, expBig, prodSmall, expSmall, expWide)
	}
	// The saving is the job's cost less the same GPU-hours at the type's rate.
	if c := cost[prodSmall]; c != usd(12_000_000) {
		t.Errorf("tier-2 job cost %v, want 12.00 USD (3 h × 3.20 × 1.25)", c)
	}
	if c := cost[expBig]; c != usd(9_600_000) {
		t.Errorf("tier-3 job cost %v, want 9.60 USD", c)
	}

	// Once on-premise nodes of the spot type exist, tier 2 may use it too.
	if err := st.CreateNode(ctx, &allot.Node{Name: "gpu18", GPUType: "A100-spot", GPUCount: 8, Site: allot.SiteOnPrem, State: allot.NodeDown}); err != nil {
		t.Fatal(err)
	}
	rep, err = st.RightSizing(ctx, nov19(0, 0), nov19(0, 0).Add(24*time.Hour), store.RightSizingScope{})
	if err != nil {
		t.Fatal(err)
	}
	var prodNow string
	for _, j := range rep.Jobs {
		for _, f := range j.Flags {
			if j.JobID == prodBig && f.Rule == store.RuleCheaperGPUType {
				prodNow = f.Suggestion
			}
		}
	}
	if prodNow != "use gpu_type A100-spot: peak memory 60 GB fits its 80 GB" {
		t.Errorf("tier-2 job with on-premise A100-spot nodes: %q", prodNow)
	}
}
