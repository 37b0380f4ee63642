package store_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/store"
)

var ada = store.PolicyChange{Actor: "ada@example.com", Note: "test"}

func change(action, object string) store.PolicyChange {
	c := ada
	c.Action, c.Object = action, object
	return c
}

// counts returns (policy versions, audit entries).
func (b bundle) counts(t *testing.T) [2]int {
	t.Helper()
	return [2]int{b.count(t, "policy_versions"), b.count(t, "audit_log")}
}

func (b bundle) wantCounts(t *testing.T, want [2]int, what string) {
	t.Helper()
	if got := b.counts(t); got != want {
		t.Errorf("%s: versions/audit entries %v, want %v", what, got, want)
	}
}

func TestUpdateTierVersionsMultiplier(t *testing.T) {
	b := setup(t)
	start := b.counts(t)
	r, err := b.st.UpdateTier(b.ctx, change("tier.update", "tier:3"), allot.Tier3, func(t *allot.Tier) { t.MultiplierBP = 12000 })
	if err != nil || !r.Changed || r.Entry.PolicyVersion == 0 {
		t.Fatalf("update: %+v %v", r, err)
	}
	b.wantCounts(t, [2]int{start[0] + 1, start[1] + 1}, "valid change")
	var before, after store.TierValues
	if json.Unmarshal(r.Entry.Before, &before) != nil || json.Unmarshal(r.Entry.After, &after) != nil ||
		before.Multiplier != "1" || after.Multiplier != "1.2" || r.Entry.Note != "test" || r.Entry.Actor != "ada@example.com" {
		t.Errorf("audit entry: %s → %s (%+v)", r.Entry.Before, r.Entry.After, r.Entry)
	}
	card, err := b.st.RateCard(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := card.MultiplierAt(allot.Tier3, b.now.Add(-time.Second)); m.BP != 10000 {
		t.Errorf("history rewritten: multiplier before the change is %d", m.BP)
	}
	if m, _ := card.MultiplierAt(allot.Tier3, b.now); m.BP != 12000 {
		t.Errorf("multiplier from now is %d", m.BP)
	}

	// The same values again: nothing happens.
	r, err = b.st.UpdateTier(b.ctx, change("tier.update", "tier:3"), allot.Tier3, func(t *allot.Tier) { t.MultiplierBP = 12000 })
	if err != nil || r.Changed {
		t.Errorf("no-op: %+v %v", r, err)
	}
	b.wantCounts(t, [2]int{start[0] + 1, start[1] + 1}, "no-op")

	// Bad values change nothing.
	for name, tc := range map[string]struct {
		apply func(*allot.Tier)
		field string
	}{
		"multiplier": {func(t *allot.Tier) { t.MultiplierBP = 200000 }, "multiplier"},
		"order":      {func(t *allot.Tier) { t.ClassOrder = 1 }, "class_order"},
		"runtime":    {func(t *allot.Tier) { t.MaxRuntime = 0 }, "max_runtime_s"},
		"preempt":    {func(t *allot.Tier) { t.MayPreempt = []allot.TierID{allot.Tier1} }, "may_preempt"},
		"itself":     {func(t *allot.Tier) { t.MayPreempt = []allot.TierID{allot.Tier3} }, "may_preempt"},
	} {
		_, err := b.st.UpdateTier(b.ctx, change("tier.update", "tier:3"), allot.Tier3, tc.apply)
		if allot.Fields(err)[tc.field] == "" {
			t.Errorf("%s: %v, want a %s field error", name, err, tc.field)
		}
	}
	if _, err := b.st.UpdateTier(b.ctx, change("tier.update", "tier:9"), "9", func(*allot.Tier) {}); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("unknown tier: %v", err)
	}
	b.wantCounts(t, [2]int{start[0] + 1, start[1] + 1}, "refused changes")

	// A month that is closed refuses a multiplier change in force inside
	// it; other tier fields still change.
	if err := b.st.CloseMonth(b.ctx, billing.Month(b.now), "finn@example.com"); err != nil {
		t.Fatal(err)
	}
	_, err = b.st.UpdateTier(b.ctx, change("tier.update", "tier:4"), allot.Tier4, func(t *allot.Tier) { t.MultiplierBP = 9000 })
	if allot.ErrorCode(err) != allot.EConflict {
		t.Errorf("multiplier into a closed month: %v", err)
	}
	r, err = b.st.UpdateTier(b.ctx, change("tier.update", "tier:4"), allot.Tier4, func(t *allot.Tier) { t.Description = "Sweeps." })
	if err != nil || !r.Changed {
		t.Errorf("description with a closed month: %+v %v", r, err)
	}
	b.wantCounts(t, [2]int{start[0] + 2, start[1] + 2}, "after the closed month")
}

func TestSetRatePolicy(t *testing.T) {
	b := setup(t)
	start := b.counts(t)
	usd := func(micros int64) allot.Money { return allot.Money{Micros: micros, Currency: "USD"} }
	r, err := b.st.SetRatePolicy(b.ctx, change("rate.set", "rate:T4"), "T4", usd(400_000), b.now)
	if err != nil || !r.Changed {
		t.Fatalf("set: %+v %v", r, err)
	}
	var before, after store.RateValues
	if json.Unmarshal(r.Entry.Before, &before) != nil || json.Unmarshal(r.Entry.After, &after) != nil ||
		before.Rate != "0.35" || after.Rate != "0.40" || !after.EffectiveFrom.Equal(b.now) {
		t.Errorf("audit: %s → %s", r.Entry.Before, r.Entry.After)
	}
	types, _ := b.st.ListGPUTypes(b.ctx)
	for _, g := range types {
		if g.Name == "T4" && g.HourlyRate.Micros != 400_000 {
			t.Errorf("T4 rate now %v", g.HourlyRate)
		}
	}
	// The rate already in force, again: no version.
	if r, err := b.st.SetRatePolicy(b.ctx, change("rate.set", "rate:T4"), "T4", usd(400_000), b.now.Add(time.Hour)); err != nil || r.Changed {
		t.Errorf("no-op: %+v %v", r, err)
	}
	b.wantCounts(t, [2]int{start[0] + 1, start[1] + 1}, "valid + no-op")

	if err := b.st.CloseMonth(b.ctx, billing.Month(b.now.AddDate(0, -1, 0)), "finn@example.com"); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		gpu   string
		rate  allot.Money
		from  time.Time
		code  string
		field string
	}{
		"closed month": {"T4", usd(500_000), b.now.AddDate(0, -1, 0), allot.EConflict, ""},
		"currency":     {"T4", allot.Money{Micros: 500_000, Currency: "EUR"}, b.now, allot.EInvalid, "currency"},
		"negative":     {"T4", usd(-1), b.now, allot.EInvalid, "rate"},
		"too large":    {"T4", usd(billing.MaxRateMicros + 1), b.now, allot.EInvalid, "rate"},
		"same instant": {"T4", usd(450_000), b.now, allot.EInvalid, "effective_from"},
		"unknown type": {"H100", usd(500_000), b.now, allot.ENotFound, ""},
	} {
		_, err := b.st.SetRatePolicy(b.ctx, change("rate.set", "rate:"+tc.gpu), tc.gpu, tc.rate, tc.from)
		if allot.ErrorCode(err) != tc.code || (tc.field != "" && allot.Fields(err)[tc.field] == "") {
			t.Errorf("%s: %v, want %s %s", name, err, tc.code, tc.field)
		}
	}
	b.wantCounts(t, [2]int{start[0] + 1, start[1] + 1}, "refused rates")
	if n := b.count(t, "gpu_rates"); n != 3 {
		t.Errorf("gpu_rates rows %d, want 3", n)
	}
}

func TestTeamPolicy(t *testing.T) {
	b := setup(t)
	start := b.counts(t)
	team := allot.Team{Slug: "vision", Name: "Vision", CostCenter: "CC-7", MonthlyBudgetGPUHours: 500, FairShareWeight: 2,
		Guarantees: map[string]int{"T4": 8}}
	r, err := b.st.CreateTeamPolicy(b.ctx, change("team.create", "team:vision"), team, "https://hooks.example.com/x")
	if err != nil || !r.Changed || len(r.Entry.Before) != 0 {
		t.Fatalf("create: %+v %v", r, err)
	}
	got, err := b.st.GetTeam(b.ctx, "vision")
	if err != nil || got.Guarantees["T4"] != 8 || got.FairShareWeight != 2 {
		t.Errorf("created %+v %v", got, err)
	}
	if hook, _ := b.st.TeamWebhook(b.ctx, "vision"); hook != "https://hooks.example.com/x" {
		t.Errorf("webhook %q", hook)
	}
	if _, err := b.st.CreateTeamPolicy(b.ctx, change("team.create", "team:vision"), team, ""); allot.Fields(err)["slug"] == "" {
		t.Errorf("duplicate: %v", err)
	}
	bad := team
	bad.Slug, bad.Guarantees = "vision-two", map[string]int{"H100": 1}
	if _, err := b.st.CreateTeamPolicy(b.ctx, change("team.create", "team:vision-two"), bad, ""); allot.Fields(err)["guarantees"] == "" {
		t.Errorf("unknown GPU type: %v", err)
	}
	b.wantCounts(t, [2]int{start[0] + 1, start[1] + 1}, "create")

	r, err = b.st.UpdateTeamPolicy(b.ctx, change("team.update", "team:vision"), "vision", func(t *allot.Team, hook *string) {
		t.MonthlyBudgetGPUHours, t.Guarantees, *hook = 800, map[string]int{"A100-80GB": 8}, ""
	})
	if err != nil || !r.Changed {
		t.Fatalf("update: %+v %v", r, err)
	}
	var before, after store.TeamValues
	if json.Unmarshal(r.Entry.Before, &before) != nil || json.Unmarshal(r.Entry.After, &after) != nil ||
		before.MonthlyBudgetGPUHours != 500 || after.MonthlyBudgetGPUHours != 800 || after.Guarantees["T4"] != 0 ||
		after.Guarantees["A100-80GB"] != 8 || after.WebhookURL != "" {
		t.Errorf("audit %s → %s", r.Entry.Before, r.Entry.After)
	}
	if r, err := b.st.UpdateTeamPolicy(b.ctx, change("team.update", "team:vision"), "vision", func(t *allot.Team, _ *string) {
		t.MonthlyBudgetGPUHours = 800
	}); err != nil || r.Changed {
		t.Errorf("no-op: %+v %v", r, err)
	}
	if _, err := b.st.UpdateTeamPolicy(b.ctx, change("team.update", "team:vision"), "vision", func(t *allot.Team, _ *string) {
		t.FairShareWeight = 0
	}); allot.Fields(err)["fair_share_weight"] == "" {
		t.Errorf("weight 0: %v", err)
	}
	b.wantCounts(t, [2]int{start[0] + 2, start[1] + 2}, "update")
}

func TestUpdatePolicyValues(t *testing.T) {
	b := setup(t)
	start := b.counts(t)
	old, _ := b.st.CurrentPolicy(b.ctx)
	r, err := b.st.UpdatePolicy(b.ctx, change("policy.update", "policy"), func(v *store.PolicyValues) error {
		v.GracePeriodS, v.BurstMonthlyBudget = 300, "2500.5"
		return nil
	})
	if err != nil || !r.Changed {
		t.Fatalf("update: %+v %v", r, err)
	}
	p, _ := b.st.CurrentPolicy(b.ctx)
	if p.GracePeriod != 5*time.Minute || p.BurstMonthlyBudget.Micros != 2_500_500_000 || len(p.HealthRules) != len(old.HealthRules) ||
		p.Version != r.Entry.PolicyVersion || p.WeightAge != old.WeightAge {
		t.Errorf("policy now %+v", p)
	}
	if r, err := b.st.UpdatePolicy(b.ctx, change("policy.update", "policy"), func(v *store.PolicyValues) error { v.GracePeriodS = 300; return nil }); err != nil || r.Changed {
		t.Errorf("no-op: %+v %v", r, err)
	}
	for field, apply := range map[string]func(*store.PolicyValues){
		"budget_warn_pct":         func(v *store.PolicyValues) { v.BudgetWarnPct = 120 },
		"burst_release_gpu_hours": func(v *store.PolicyValues) { v.BurstReleaseGPUHours = v.BurstPendingGPUHours },
		"half_life_s":             func(v *store.PolicyValues) { v.HalfLifeS = 0 },
		"burst_monthly_budget":    func(v *store.PolicyValues) { v.BurstMonthlyBudget = "lots" },
	} {
		if _, err := b.st.UpdatePolicy(b.ctx, change("policy.update", "policy"), func(v *store.PolicyValues) error { apply(v); return nil }); allot.Fields(err)[field] == "" {
			t.Errorf("%s: %v", field, err)
		}
	}
	// Seconds that would wrap around as a time.Duration are refused, not
	// wrapped into a valid-looking value.
	for _, secs := range []int64{2e10, math.MaxInt64} {
		for field, apply := range map[string]func(*store.PolicyValues){
			"grace_period_s":       func(v *store.PolicyValues) { v.GracePeriodS = secs },
			"half_life_s":          func(v *store.PolicyValues) { v.HalfLifeS = secs },
			"auto_undrain_after_s": func(v *store.PolicyValues) { v.AutoUndrainAfterS = secs },
			"max_age_s":            func(v *store.PolicyValues) { v.MaxAgeS = secs },
		} {
			if _, err := b.st.UpdatePolicy(b.ctx, change("policy.update", "policy"), func(v *store.PolicyValues) error { apply(v); return nil }); !strings.Contains(allot.Fields(err)[field], "at most") {
				t.Errorf("%s = %d: %v", field, secs, err)
			}
		}
	}
	// Above the domain's bound but far from wrapping: refused too.
	if _, err := b.st.UpdatePolicy(b.ctx, change("policy.update", "policy"), func(v *store.PolicyValues) error { v.CycleS = 2 * 3600; return nil }); allot.Fields(err)["cycle_s"] == "" {
		t.Errorf("a two-hour cycle: %v", err)
	}
	// An error from apply aborts the change after it modified the values.
	boom := errors.New("patch unreadable")
	if _, err := b.st.UpdatePolicy(b.ctx, change("policy.update", "policy"), func(v *store.PolicyValues) error {
		v.GracePeriodS = 600
		return boom
	}); !errors.Is(err, boom) {
		t.Errorf("apply's error: %v", err)
	}
	if p, _ := b.st.CurrentPolicy(b.ctx); p.GracePeriod != 5*time.Minute {
		t.Errorf("a failed apply changed the grace period to %s", p.GracePeriod)
	}
	b.wantCounts(t, [2]int{start[0] + 1, start[1] + 1}, "policy edits")

	// EachAudit streams what AuditLog pages.
	var n int
	if err := b.st.EachAudit(b.ctx, store.AuditFilter{Action: "policy."}, func(e *allot.AuditEntry) error {
		n++
		return nil
	}); err != nil || n != 1 {
		t.Errorf("EachAudit: %d entries, %v", n, err)
	}
}
