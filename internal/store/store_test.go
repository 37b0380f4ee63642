package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
)

type bundle struct {
	st   *store.Store
	pool *pgxpool.Pool
	ctx  context.Context
	now  time.Time
}

func setup(t *testing.T) bundle {
	t.Helper()
	t.Parallel()
	pool := storetest.Pool(t)
	st := store.New(pool)
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	ctx := context.Background()
	if err := demo.Seed(ctx, st); err != nil {
		t.Fatal(err)
	}
	return bundle{st: st, pool: pool, ctx: ctx, now: now}
}

func (b bundle) user(t *testing.T, email string) *allot.User {
	t.Helper()
	u, err := b.st.UserByEmail(b.ctx, email)
	if err != nil {
		t.Fatal(err)
	}
	return &u
}

func (b bundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDoubleAllocationRefusedConcurrently(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	var ids []int64
	for range 2 {
		j, err := b.st.SubmitJob(b.ctx, noah, allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 2, TimeLimit: time.Hour, Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	// Two transactions race to take GPU 3 of gpu16; both insert before
	// either commits. The unique partial index lets exactly one win.
	start := make(chan struct{})
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = b.st.InTx(b.ctx, func(tx *store.Store) error {
				if _, err := tx.Allocate(b.ctx, ids[i], "gpu16", []int{3, 4 + i}, b.now); err != nil {
					return err
				}
				time.Sleep(50 * time.Millisecond) // hold the row lock so the other waits on us
				return nil
			})
		}()
	}
	close(start)
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			if allot.ErrorCode(err) != allot.EConflict {
				t.Errorf("error code %q, want conflict: %v", allot.ErrorCode(err), err)
			}
		}
	}
	if failed != 1 {
		t.Fatalf("%d of 2 transactions failed, want exactly 1: %v", failed, errs)
	}
	active, err := b.st.ActiveAllocations(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(active) != 1 || len(active[0].GPUIndices) != 2 {
		t.Fatalf("active allocations = %+v, want one of 2 GPUs", active)
	}
	// Once released, the GPU can be allocated again.
	if _, err := b.st.CancelJob(b.ctx, noah, active[0].JobID); err != nil {
		t.Fatal(err)
	}
	other := ids[0]
	if active[0].JobID == ids[0] {
		other = ids[1]
	}
	if _, err := b.st.Allocate(b.ctx, other, "gpu16", []int{3}, b.now.Add(time.Minute)); err != nil {
		t.Fatalf("GPU not reusable after release: %v", err)
	}
}

func TestDatabaseRefusesImpossibleValues(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	bad := []struct {
		name string
		sql  string
		args []any
	}{
		{"negative gpus", `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command) VALUES ('x', 'nlp', $1, '3', -1, 60, '{true}')`, []any{noah.ID}},
		{"zero gpus", `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command) VALUES ('x', 'nlp', $1, '3', 0, 60, '{true}')`, []any{noah.ID}},
		{"unknown tier", `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command) VALUES ('x', 'nlp', $1, '7', 1, 60, '{true}')`, []any{noah.ID}},
		{"unknown team", `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command) VALUES ('x', 'nope', $1, '3', 1, 60, '{true}')`, []any{noah.ID}},
		{"empty command", `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command) VALUES ('x', 'nlp', $1, '3', 1, 60, '{}')`, []any{noah.ID}},
		{"unknown state", `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command, state) VALUES ('x', 'nlp', $1, '3', 1, 60, '{true}', 'zombie')`, []any{noah.ID}},
		{"zero time limit", `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command) VALUES ('x', 'nlp', $1, '3', 1, 0, '{true}')`, []any{noah.ID}},
		{"negative gpu index", `INSERT INTO allocations (job_id, node, gpu_index, started_at) SELECT min(id), 'gpu01', -1, now() FROM jobs`, nil},
		{"unknown node", `INSERT INTO allocations (job_id, node, gpu_index, started_at) SELECT min(id), 'gpu99', 0, now() FROM jobs`, nil},
		{"negative rate", `INSERT INTO gpu_rates (gpu_type, rate_micros, currency, effective_from) VALUES ('T4', -1, 'USD', now())`, nil},
		{"negative guarantee", `INSERT INTO team_guarantees (team, gpu_type, gpus) VALUES ('fraud', 'T4', -2)`, nil},
		{"bad node state", `UPDATE nodes SET state = 'melting' WHERE name = 'gpu01'`, nil},
		{"bad membership role", `INSERT INTO memberships (user_id, team, role) VALUES ($1, 'fraud', 'owner')`, []any{noah.ID}},
	}
	for _, tt := range bad {
		if _, err := b.pool.Exec(b.ctx, tt.sql, tt.args...); err == nil {
			t.Errorf("%s: accepted", tt.name)
		}
	}
}

func TestSubmitJobQuota(t *testing.T) {
	b := setup(t)
	tests := []struct {
		name        string
		email       string
		spec        allot.JobSpec
		preemptible bool
		warning     string
	}{
		{"within budget", "felix@example.com", allot.JobSpec{Team: "fraud", Tier: allot.Tier3, GPUs: 8, TimeLimit: 4 * time.Hour, Command: []string{"python", "train.py"}}, false, ""},
		{"over budget demoted", "noah@example.com", allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 8, TimeLimit: 4 * time.Hour, Command: []string{"python", "train.py"}}, true, "Budget exceeded by"},
		{"over budget production keeps priority", "nadia@example.com", allot.JobSpec{Team: "nlp", Tier: allot.Tier1, GPUs: 8, TimeLimit: 4 * time.Hour, Command: []string{"python", "train.py"}}, false, "production tiers are never demoted"},
		{"some left but less", "ravi@example.com", allot.JobSpec{Team: "recs", Tier: allot.Tier4, GPUs: 64, TimeLimit: 48 * time.Hour, Command: []string{"python", "big.py"}}, true, "Only 540.0 h remaining in budget"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := b.user(t, tt.email)
			preview, err := b.st.QuotaPreview(b.ctx, u, &tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			j, err := b.st.SubmitJob(b.ctx, u, tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			if j.Preemptible != tt.preemptible || j.Demoted != tt.preemptible {
				t.Errorf("preemptible=%v demoted=%v, want %v", j.Preemptible, j.Demoted, tt.preemptible)
			}
			if !contains(j.QuotaWarning, tt.warning) || (tt.warning == "" && j.QuotaWarning != "") {
				t.Errorf("warning %q, want %q", j.QuotaWarning, tt.warning)
			}
			if preview.Warning != j.QuotaWarning {
				t.Errorf("preview %q differs from stored %q", preview.Warning, j.QuotaWarning)
			}
			if j.State != allot.JobPending || j.User != tt.email || j.SubmittedAt.IsZero() {
				t.Errorf("job = %+v", j)
			}
		})
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0))
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

func TestSubmitJobInvalidWritesNothing(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	before := b.count(t, "jobs")
	_, err := b.st.SubmitJob(b.ctx, noah, allot.JobSpec{Team: "fraud", Tier: "9", GPUs: 0, TimeLimit: 0})
	want := allot.FieldErrors{
		"team":         `you are not a member of team "fraud"`,
		"tier":         `unknown tier "9": use 1, 2, 3, 4 or preemptible`,
		"gpus":         "must be at least 1",
		"time_limit_s": "must be positive",
		"command":      "is required",
	}
	if d := cmp.Diff(want, allot.Fields(err)); d != "" {
		t.Errorf("field errors (-want +got)\n%s", d)
	}
	if after := b.count(t, "jobs"); after != before {
		t.Errorf("jobs %d → %d", before, after)
	}
}

func TestUsageAndMaxGang(t *testing.T) {
	b := setup(t)
	teams, err := b.st.ListTeams(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, tm := range teams {
		used, err := b.st.TeamMonthUsage(b.ctx, tm.Slug)
		if err != nil {
			t.Fatal(err)
		}
		got[tm.Slug] = used * 100 / (tm.MonthlyBudgetGPUHours * 3600)
	}
	if d := cmp.Diff(map[string]int64{"fraud": 35, "recs": 82, "nlp": 104}, got); d != "" {
		t.Errorf("used %% (-want +got)\n%s", d)
	}
	mg, err := b.st.MaxGang(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]int{"": 64, "A100-80GB": 64, "T4": 32}, mg); d != "" {
		t.Errorf("max gang (-want +got)\n%s", d)
	}
}

func TestCancelJob(t *testing.T) {
	b := setup(t)
	noah, nina, nadia, felix := b.user(t, "noah@example.com"), b.user(t, "nina@example.com"), b.user(t, "nadia@example.com"), b.user(t, "felix@example.com")
	j, err := b.st.SubmitJob(b.ctx, noah, allot.JobSpec{Team: "nlp", Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Hour, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.CancelJob(b.ctx, nina, j.ID); allot.ErrorCode(err) != allot.EForbidden {
		t.Errorf("teammate cancel: %v, want forbidden", err)
	}
	if _, err := b.st.CancelJob(b.ctx, felix, j.ID); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("other team cancel: %v, want not found", err)
	}
	got, err := b.st.CancelJob(b.ctx, nadia, j.ID)
	if err != nil || got.State != allot.JobCancelled || got.EndedAt.IsZero() {
		t.Fatalf("lead cancel: %+v, %v", got, err)
	}
	if _, err := b.st.CancelJob(b.ctx, noah, j.ID); allot.ErrorCode(err) != allot.EConflict {
		t.Errorf("second cancel: %v, want conflict", err)
	}
}

func TestTokensAndSessions(t *testing.T) {
	b := setup(t)
	noah := b.user(t, "noah@example.com")
	secret, tok, err := b.st.CreateAPIToken(b.ctx, noah.ID, "laptop")
	if err != nil {
		t.Fatal(err)
	}
	var stored []byte
	if err := b.pool.QueryRow(b.ctx, "SELECT token_hash FROM api_tokens WHERE id = $1", tok.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if string(stored) == secret || len(stored) != 32 {
		t.Fatal("token not hashed at rest")
	}
	u, err := b.st.UserByAPIToken(b.ctx, secret)
	if err != nil || u.Email != "noah@example.com" {
		t.Fatalf("UserByAPIToken = %v, %v", u.Email, err)
	}
	if _, err := b.st.UserByAPIToken(b.ctx, secret+"x"); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("bad token: %v", err)
	}
	sid, err := b.st.CreateSession(b.ctx, noah.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if u, err := b.st.UserBySession(b.ctx, sid); err != nil || u.ID != noah.ID {
		t.Fatalf("UserBySession = %v, %v", u, err)
	}
	if err := b.st.DeleteSession(b.ctx, sid); err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.UserBySession(b.ctx, sid); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("deleted session: %v", err)
	}
}

func TestPolicyVersions(t *testing.T) {
	b := setup(t)
	p, err := b.st.CurrentPolicy(b.ctx)
	if err != nil || p.Version != 1 {
		t.Fatalf("current = %+v, %v", p, err)
	}
	p.GracePeriod = 300 * time.Second
	p.CreatedBy = "ada@example.com"
	if err := b.st.InsertPolicy(b.ctx, &p); err != nil {
		t.Fatal(err)
	}
	bad := p
	bad.BudgetWarnPct = 0
	if err := b.st.InsertPolicy(b.ctx, &bad); allot.ErrorCode(err) != allot.EInvalid {
		t.Errorf("bad policy: %v", err)
	}
	hist, err := b.st.PolicyHistory(b.ctx)
	if err != nil || len(hist) != 2 || hist[0].GracePeriod != 300*time.Second || hist[1].GracePeriod != 120*time.Second {
		t.Fatalf("history = %+v, %v", hist, err)
	}
}

func TestMigrateIsIdempotent(t *testing.T) {
	b := setup(t)
	if err := store.Migrate(b.ctx, b.pool, nil); err != nil {
		t.Fatal(err)
	}
	ms, _ := store.Migrations()
	if n := b.count(t, "allot_migrations"); n != len(ms) {
		t.Errorf("%d migrations recorded, want %d", n, len(ms))
	}
}

// TestSeedEarlyInTheMonth: `make run` half an hour into a month still seeds
// a demo with usage history (budgets scaled down to fit).
func TestSeedEarlyInTheMonth(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	now := time.Date(2026, 12, 1, 0, 30, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	if err := demo.Seed(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	used, err := st.TeamMonthUsage(context.Background(), "nlp")
	if err != nil || used <= 0 {
		t.Fatalf("nlp used %d GPU-seconds, %v", used, err)
	}
}
