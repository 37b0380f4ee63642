package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
)

// TestEngineRunsRightSizing: a Slurm run whose accounting carries
// gres/gpuutil (no agent samples) is billed from its allocations and
// right-sized from Slurm's figure; importing it twice changes nothing.
// The engine's records are the edge here: no Slurm runs (the real-Slurm
// tests are in internal/backend).
func TestEngineRunsRightSizing(t *testing.T) {
	ctx := context.Background()
	st := storetest.New(t)
	now := st.Now().UTC().Truncate(time.Hour)
	start, end := now.Add(-3*time.Hour), now.Add(-time.Hour)
	if err := st.CreateGPUType(ctx, &allot.GPUType{Name: "h100", MemoryGB: 80, HourlyRate: allot.Money{Micros: 2_000_000, Currency: "USD"},
		Backend: allot.BackendSlurm}, start.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTeam(ctx, &allot.Team{Slug: "nlp", Name: "NLP", CostCenter: "CC-1", FairShareWeight: 1}); err != nil {
		t.Fatal(err)
	}
	m := store.EngineMapping{Backend: allot.BackendSlurm, DefaultGPUType: "h100"}
	if _, err := st.SyncEngineNodes(ctx, m, []allot.EngineNode{{Name: "gpu01", GPUs: 8, GPUType: "h100"}}); err != nil {
		t.Fatal(err)
	}
	util, mem := 4.0, int64(2048)
	runs := []allot.EngineRun{{ExternalID: 77, Name: "sweep", Account: "nlp", User: "nadia", Tier: allot.Tier4, QOS: "allot-t4",
		State: allot.EngineCompleted, Code: "COMPLETED", Submit: start, Start: start, End: end, GPUs: 8, Nodes: []string{"gpu01"},
		GPUUtilPct: &util, GPUMemMiB: &mem}}
	res, err := st.ImportEngineRuns(ctx, m, runs, nil)
	if err != nil || res.NewRuns != 1 {
		t.Fatalf("import: %+v %v", res, err)
	}
	if res, err = st.ImportEngineRuns(ctx, m, runs, nil); err != nil || res.NewRuns+res.UpdatedRuns != 0 {
		t.Fatalf("re-import: %+v %v", res, err)
	}
	if _, err := st.RollupJobUsage(ctx, start, now); err != nil {
		t.Fatal(err)
	}
	rep, err := st.RightSizing(ctx, start, now, store.RightSizingScope{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Jobs) != 1 {
		t.Fatalf("right-sizing flagged %d jobs, want the 4 %% job: %+v", len(rep.Jobs), rep)
	}
	j := rep.Jobs[0]
	if j.GPUSeconds != 8*2*3600 || j.MeanUtilPct == nil || *j.MeanUtilPct != util || len(j.Flags) == 0 {
		t.Fatalf("flagged job %+v", j)
	}
}

// TestGPUTypeBackend: a GPU type names its backend; a job's backend is
// its type's, and an unknown backend is a field error that creates
// nothing.
func TestGPUTypeBackend(t *testing.T) {
	ctx := context.Background()
	st := storetest.New(t)
	c := store.PolicyChange{Actor: "admin@example.com"}
	_, err := st.CreateGPUTypeAudited(ctx, c, allot.GPUType{Name: "x1", MemoryGB: 10, HourlyRate: allot.Money{Currency: "USD"}, Backend: "kueue"})
	if f := allot.Fields(err); f["backend"] == "" {
		t.Fatalf("backend kueue: %v", err)
	}
	types, err := st.GPUTypeInfos(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range types {
		if g.Name == "x1" {
			t.Fatal("a refused GPU type was created")
		}
	}
	if _, err := st.CreateGPUTypeAudited(ctx, c, allot.GPUType{Name: "s1", MemoryGB: 80, HourlyRate: allot.Money{Currency: "USD"}, Backend: allot.BackendSlurm}); err != nil {
		t.Fatal(err)
	}
	g, err := st.GPUTypeInfo(ctx, "s1")
	if err != nil || g.Backend != allot.BackendSlurm {
		t.Fatalf("s1: %+v %v", g, err)
	}
}
