package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// emptyDB is a migrated database without the demo.
func emptyDB(t *testing.T) (*store.Store, context.Context) {
	t.Helper()
	t.Parallel()
	st := store.New(storetest.Pool(t))
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	return st, context.Background()
}

// TestMigrateMakesDefaults: after migrating, the five tiers of DESIGN.md
// (the demo's, without reservations) and allot.DefaultPolicy() exist, and
// nothing else; migrating again changes nothing.
func TestMigrateMakesDefaults(t *testing.T) {
	st, ctx := emptyDB(t)
	tiers, err := st.ListTiers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := demo.Tiers()
	for i := range want {
		want[i].ReservedGPUs = 0
	}
	if d := cmp.Diff(want, tiers, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("tiers after migrate (-want +got):\n%s", d)
	}
	p, err := st.CurrentPolicy(ctx)
	if err != nil || p.Version == 0 {
		t.Fatalf("policy = %+v, %v", p, err)
	}
	def := allot.DefaultPolicy()
	def.Version, def.CreatedAt = p.Version, p.CreatedAt
	if d := cmp.Diff(def, p, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("policy after migrate (-DefaultPolicy +got):\n%s", d)
	}
	mults, err := st.MultiplierHistory(ctx)
	if err != nil || len(mults) != 5 {
		t.Errorf("multipliers = %+v, %v", mults, err)
	}
	if n, err := st.CountTeams(ctx); err != nil || n != 0 {
		t.Errorf("teams = %d, %v", n, err)
	}
	if types, err := st.ListGPUTypes(ctx); err != nil || len(types) != 0 {
		t.Errorf("GPU types = %v, %v", types, err)
	}
	if err := store.Migrate(ctx, st.Pool(), nil); err != nil {
		t.Fatal(err)
	}
	hist, err := st.PolicyHistory(ctx)
	if err != nil || len(hist) != 1 {
		t.Errorf("policy versions after a second migrate = %d, %v", len(hist), err)
	}
	// The demo seeds on top of the defaults: its policy is still version 1.
	if err := demo.Seed(ctx, st); err != nil {
		t.Fatal(err)
	}
	if hist, err := st.PolicyHistory(ctx); err != nil || len(hist) != 1 {
		t.Errorf("policy versions after the demo seed = %d, %v", len(hist), err)
	}
	if tiers, _ := st.ListTiers(ctx); tiers[0].ReservedGPUs != 16 {
		t.Errorf("demo tier 1 = %+v", tiers[0])
	}
}

func TestBootstrapAdmin(t *testing.T) {
	st, ctx := emptyDB(t)
	for _, bad := range []string{"", "ops", "ops@", "o ps@corp.example"} {
		if _, err := st.BootstrapAdminUser(ctx, bad, "", "cli", false, 0); allot.ErrorCode(err) != allot.EInvalid || allot.Fields(err)["email"] == "" {
			t.Errorf("email %q: %v", bad, err)
		}
	}
	if _, err := st.BootstrapAdminUser(ctx, "ops@corp.example", "", "cli", false, -time.Hour); allot.Fields(err)["ttl"] == "" {
		t.Errorf("negative ttl: %v", err)
	}
	if n := countRows(t, st, "users"); n != 0 {
		t.Fatalf("bad input left %d users", n)
	}
	r, err := st.BootstrapAdminUser(ctx, "ops@corp.example", "", "cli", false, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Created || !r.User.Admin || r.User.Name != "ops" || !store.NeverSignedIn(r.User.OIDCSubject) || r.Secret == "" {
		t.Errorf("bootstrap = %+v", r)
	}
	u, err := st.UserByAPIToken(ctx, r.Secret)
	if err != nil || u.Email != "ops@corp.example" || !u.Admin {
		t.Errorf("token's user = %+v, %v", u, err)
	}
	if !r.Token.ExpiresAt.Equal(st.Now().Add(24 * time.Hour)) {
		t.Errorf("expires %v", r.Token.ExpiresAt)
	}
	log, err := st.AuditLog(ctx, store.AuditFilter{})
	if err != nil || len(log) != 1 || log[0].Action != "user.bootstrap_admin" || log[0].Object != "user:ops@corp.example" || log[0].Actor != "cli" {
		t.Fatalf("audit = %+v, %v", log, err)
	}
	// A second one is refused, and changes nothing.
	_, err = st.BootstrapAdminUser(ctx, "other@corp.example", "", "cli", false, 0)
	if allot.ErrorCode(err) != allot.EConflict {
		t.Fatalf("second bootstrap: %v", err)
	}
	if n := countRows(t, st, "users"); n != 1 {
		t.Errorf("refused bootstrap left %d users", n)
	}
	// --force makes another admin.
	r2, err := st.BootstrapAdminUser(ctx, "other@corp.example", "Other Person", "cli", true, 0)
	if err != nil || !r2.User.Admin || r2.User.Name != "Other Person" || len(r2.Admins) != 1 || !r2.Token.ExpiresAt.IsZero() {
		t.Fatalf("forced = %+v, %v", r2, err)
	}
}

func countRows(t *testing.T, st *store.Store, table string) int {
	t.Helper()
	var n int
	if err := st.Pool().QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestGPUTypesAudited(t *testing.T) {
	st, ctx := emptyDB(t)
	c := store.PolicyChange{Actor: "ops@corp.example"}
	bad := []allot.GPUType{
		{Name: "", MemoryGB: 80, HourlyRate: allot.Money{Micros: 1, Currency: "USD"}},
		{Name: "H100", MemoryGB: 0, HourlyRate: allot.Money{Micros: 1, Currency: "USD"}},
		{Name: "H100", MemoryGB: 80, HourlyRate: allot.Money{Micros: -1, Currency: "USD"}},
		{Name: "H100 SXM", MemoryGB: 80, HourlyRate: allot.Money{Micros: 1, Currency: "USD"}},
	}
	for _, g := range bad {
		if _, err := st.CreateGPUTypeAudited(ctx, c, g); allot.ErrorCode(err) != allot.EInvalid || len(allot.Fields(err)) == 0 {
			t.Errorf("%+v: %v", g, err)
		}
	}
	r, err := st.CreateGPUTypeAudited(ctx, c, allot.GPUType{Name: "H100", MemoryGB: 80, HourlyRate: allot.Money{Micros: 4_100_000, Currency: "USD"}})
	if err != nil || !r.Changed || r.Entry.Action != "gpu_type.create" {
		t.Fatalf("create = %+v, %v", r, err)
	}
	if _, err := st.CreateGPUTypeAudited(ctx, c, allot.GPUType{Name: "h100", MemoryGB: 80, HourlyRate: allot.Money{Currency: "USD"}}); allot.Fields(err)["name"] == "" {
		t.Errorf("duplicate: %v", err)
	}
	if _, err := st.CreateGPUTypeAudited(ctx, c, allot.GPUType{Name: "T4", MemoryGB: 16, HourlyRate: allot.Money{Currency: "EUR"}}); allot.Fields(err)["currency"] == "" {
		t.Errorf("other currency: %v", err)
	}
	g, err := st.GPUTypeInfo(ctx, "H100")
	if err != nil || g.MemoryGB != 80 || g.HourlyRate.Micros != 4_100_000 || g.Retired() {
		t.Fatalf("H100 = %+v, %v", g, err)
	}
	mem := 94
	if r, err := st.UpdateGPUType(ctx, c, "H100", store.GPUTypeUpdate{MemoryGB: &mem}); err != nil || !r.Changed {
		t.Fatalf("update = %+v, %v", r, err)
	}
	if r, err := st.UpdateGPUType(ctx, c, "H100", store.GPUTypeUpdate{MemoryGB: &mem}); err != nil || r.Changed {
		t.Errorf("same again = %+v, %v", r, err)
	}
	if _, err := st.UpdateGPUType(ctx, c, "nope", store.GPUTypeUpdate{MemoryGB: &mem}); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("unknown: %v", err)
	}
	// A node of an unknown type is a field error naming the known ones.
	n := allot.Node{Name: "gpu01", GPUType: "A100", GPUCount: 8, Site: allot.SiteOnPrem}
	if err := st.CreateNodeDeclared(ctx, "cli", n, nil); allot.Fields(err)["gpu_type"] == "" {
		t.Errorf("unknown type: %v", err)
	} else if got := allot.Fields(err)["gpu_type"]; got != `unknown GPU type "A100": use one of H100, or create it with `+"`allot gpu-type create`" {
		t.Errorf("message %q", got)
	}
	n.GPUType = "H100"
	if err := st.CreateNodeDeclared(ctx, "cli", n, allot.NodeLabels{"rack": "r1"}); err != nil {
		t.Fatal(err)
	}
	yes := true
	if r, err := st.UpdateGPUType(ctx, c, "H100", store.GPUTypeUpdate{Retired: &yes}); err != nil || r.Entry.Action != "gpu_type.retire" {
		t.Fatalf("retire = %+v, %v", r, err)
	}
	n.Name = "gpu02"
	if err := st.CreateNodeDeclared(ctx, "cli", n, nil); allot.Fields(err)["gpu_type"] != `GPU type "H100" is retired` {
		t.Errorf("retired type: %v", err)
	}
	if g, _ := st.GPUTypeInfo(ctx, "H100"); !g.Retired() || g.Nodes != 1 || g.MemoryGB != 94 {
		t.Errorf("retired H100 = %+v", g)
	}
}

func TestInventoryNote(t *testing.T) {
	gpus := func(n int, model string, mib int64) []store.NodeGPU {
		var out []store.NodeGPU
		for i := range n {
			out = append(out, store.NodeGPU{Index: i, Model: model, MemoryMiB: mib})
		}
		return out
	}
	for _, c := range []struct {
		typ      string
		mem, dec int
		gpus     []store.NodeGPU
		want     string
	}{
		{"A100-80GB", 80, 8, gpus(8, "NVIDIA A100-SXM4-80GB", 81920), ""},
		{"H100", 80, 8, gpus(8, "NVIDIA H100 80GB HBM3", 81559), ""},
		{"T4", 16, 4, gpus(4, "Tesla T4", 15360), ""},
		{"big", 80, 0, gpus(2, "whatever", 81920), ""},
		{"H100", 80, 8, gpus(4, "NVIDIA A100-PCIE-40GB", 40960), "registered 4 GPUs of NVIDIA A100-PCIE-40GB (40 GB); declared 8 × H100 (80 GB)"},
		{"A100-80GB", 80, 8, gpus(4, "NVIDIA A100-SXM4-80GB", 81920), "registered 4 GPUs of NVIDIA A100-SXM4-80GB (80 GB); declared 8 × A100-80GB (80 GB)"},
		{"A100-80GB", 80, 8, gpus(8, "NVIDIA A100-SXM4-40GB", 40960), "registered 8 GPUs of NVIDIA A100-SXM4-40GB (40 GB); declared 8 × A100-80GB (80 GB)"},
	} {
		if got := store.InventoryNote(c.typ, c.mem, c.dec, c.gpus); got != c.want {
			t.Errorf("%s %d×: got %q, want %q", c.typ, c.dec, got, c.want)
		}
	}
}
