package store_test

import (
	"slices"
	"testing"

	"github.com/allotlabs/allot/internal/slurmpolicy"
	"github.com/google/go-cmp/cmp"
)

// TestSlurmPolicyInput: the rendering input is the live policy, tiers and
// teams; members' accounts resolve as their jobs do (mapping, else claim,
// else the team's service account), disabled people are left out; the
// over-budget teams are those at the demotion threshold of their budget.
func TestSlurmPolicyInput(t *testing.T) {
	b := setup(t)
	in, err := b.st.SlurmPolicyInput(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := b.st.CurrentPolicy(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.Policy.Version != p.Version || len(in.Tiers) != 5 || len(in.Teams) != 3 {
		t.Fatalf("input: policy v%d (want v%d), %d tiers, %d teams", in.Policy.Version, p.Version, len(in.Tiers), len(in.Teams))
	}
	want := map[string][]string{"fraud": {"farah", "felix", "fiona"}, "recs": {"rosa", "ravi", "rui"}, "nlp": {"nadia", "noah", "nina"}}
	for team, accounts := range want {
		got := slices.Clone(in.Members[team])
		slices.Sort(got)
		slices.Sort(accounts)
		if !slices.Equal(got, accounts) {
			t.Errorf("members of %s: %q, want %q", team, got, accounts)
		}
	}
	// Noah loses his mapping and has no claim: he runs as svc-nlp. Nina is disabled.
	if _, _, err := b.st.SetPosixUser(b.ctx, "ada@example.com", "noah@example.com", "", "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE users SET disabled_at = now() WHERE email = 'nina@example.com'`); err != nil {
		t.Fatal(err)
	}
	if in, err = b.st.SlurmPolicyInput(b.ctx); err != nil {
		t.Fatal(err)
	}
	got := slices.Clone(in.Members["nlp"])
	slices.Sort(got)
	if !slices.Equal(got, []string{"nadia", "svc-nlp"}) {
		t.Errorf("members of nlp: %q, want nadia, svc-nlp", got)
	}
	// The rendering carries the team's weight and its accounts.
	r := slurmpolicy.Render(in)
	if a := r.Desired.Accounts["nlp"]; a.Shares != 2 || a.Organization != "cc-4300" || !slices.Equal(a.Users, []string{"nadia", "svc-nlp"}) {
		t.Errorf("rendered account nlp: %+v", a)
	}

	// Over budget: the scheduler's rule (usage ≥ BudgetDemotePct % of the budget).
	over := func() []string {
		t.Helper()
		o, err := b.st.OverBudgetTeams(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	expect := func(pct int) []string {
		t.Helper()
		teams, err := b.st.ListTeams(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := []string{}
		for _, tm := range teams {
			used, err := b.st.TeamMonthUsage(b.ctx, tm.Slug)
			if err != nil {
				t.Fatal(err)
			}
			if tm.MonthlyBudgetGPUHours > 0 && used*100 >= tm.MonthlyBudgetGPUHours*3600*int64(pct) {
				out = append(out, tm.Slug)
			}
		}
		return out
	}
	if d := cmp.Diff(expect(p.BudgetDemotePct), over()); d != "" {
		t.Errorf("over budget (-want +got):\n%s", d)
	}
	// A one-GPU-hour budget is spent; no budget is never over.
	if _, err := b.pool.Exec(b.ctx, `UPDATE teams SET monthly_budget_gpu_hours = CASE slug WHEN 'recs' THEN 1 WHEN 'nlp' THEN 0 ELSE monthly_budget_gpu_hours END`); err != nil {
		t.Fatal(err)
	}
	o := over()
	if !slices.Contains(o, "recs") || slices.Contains(o, "nlp") {
		t.Errorf("over budget with recs at 1 GPU-hour and nlp without a budget: %q", o)
	}
	if d := cmp.Diff(expect(p.BudgetDemotePct), o); d != "" {
		t.Errorf("over budget (-want +got):\n%s", d)
	}
	if in, err = b.st.SlurmPolicyInput(b.ctx); err != nil || !slices.Equal(in.OverBudget, o) {
		t.Errorf("input's over-budget teams %q (%v), want %q", in.OverBudget, err, o)
	}
}
