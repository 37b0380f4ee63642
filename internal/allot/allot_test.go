package allot_test

import (
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/google/go-cmp/cmp"
)

func TestJobTransitions(t *testing.T) {
	t.Parallel()
	legal := map[[2]allot.JobState]bool{
		{allot.JobPending, allot.JobRunning}:   true,
		{allot.JobPending, allot.JobCancelled}: true,
		{allot.JobRunning, allot.JobCompleted}: true,
		{allot.JobRunning, allot.JobFailed}:    true,
		{allot.JobRunning, allot.JobCancelled}: true,
		{allot.JobRunning, allot.JobPending}:   true, // requeued
	}
	for _, from := range allot.JobStates {
		for _, to := range allot.JobStates {
			j := allot.Job{ID: 7, State: from}
			err := j.Transition(to, time.Unix(100, 0))
			if want := legal[[2]allot.JobState{from, to}]; (err == nil) != want {
				t.Errorf("%s → %s: err=%v, want legal=%v", from, to, err, want)
			}
			if err != nil && allot.ErrorCode(err) != allot.EConflict {
				t.Errorf("%s → %s: code %q, want conflict", from, to, allot.ErrorCode(err))
			}
			if err != nil && j.State != from {
				t.Errorf("%s → %s: state changed on error", from, to)
			}
		}
	}
}

func spec() allot.JobSpec {
	return allot.JobSpec{Name: "train", Team: "nlp", Tier: allot.Tier3, GPUs: 8, TimeLimit: 4 * time.Hour, Command: []string{"python", "train.py"}}
}

func TestValidateSubmission(t *testing.T) {
	t.Parallel()
	tier3 := &allot.Tier{ID: allot.Tier3, MaxRuntime: 72 * time.Hour}
	member := &allot.User{Memberships: []allot.Membership{{Team: "nlp", Role: allot.TeamRoleMember}}}
	ctx := allot.SubmitContext{Submitter: member, TeamFound: true, Tier: tier3, GPUTypes: []string{"A100-80GB", "T4"},
		MaxGang: map[string]int{"": 64, "A100-80GB": 64, "T4": 8}}
	tests := []struct {
		name  string
		edit  func(*allot.JobSpec, *allot.SubmitContext)
		field string
	}{
		{"zero gpus", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.GPUs = 0 }, "gpus"},
		{"negative gpus", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.GPUs = -4 }, "gpus"},
		{"bigger than any gang", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.GPUs = 65 }, "gpus"},
		{"bigger than the type's gang", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.GPUs, s.GPUType = 16, "T4" }, "gpus"},
		{"unknown team", func(s *allot.JobSpec, c *allot.SubmitContext) { s.Team, c.TeamFound = "nope", false }, "team"},
		{"unknown tier", func(s *allot.JobSpec, c *allot.SubmitContext) { s.Tier, c.Tier = "7", nil }, "tier"},
		{"unknown gpu type", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.GPUType = "H100" }, "gpu_type"},
		{"zero time limit", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.TimeLimit = 0 }, "time_limit_s"},
		{"time limit above tier max", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.TimeLimit = 73 * time.Hour }, "time_limit_s"},
		{"empty command", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.Command = nil }, "command"},
		{"blank command", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.Command = []string{" "} }, "command"},
		{"non-member", func(s *allot.JobSpec, c *allot.SubmitContext) { c.Submitter = &allot.User{} }, "team"},
		{"reserved env", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.Env = map[string]string{"CUDA_VISIBLE_DEVICES": "0"} }, "env"},
		{"gpus per node not dividing", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.GPUsPerNode = 3 }, "gpus_per_node"},
		{"relative workdir", func(s *allot.JobSpec, _ *allot.SubmitContext) { s.WorkDir = "tmp" }, "workdir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c := spec(), ctx
			tt.edit(&s, &c)
			err := allot.ValidateSubmission(&s, c)
			if allot.ErrorCode(err) != allot.EInvalid {
				t.Fatalf("got %v, want invalid", err)
			}
			f := allot.Fields(err)
			if f[tt.field] == "" {
				t.Fatalf("no message for %s in %v", tt.field, f)
			}
		})
	}
	s := spec()
	if err := allot.ValidateSubmission(&s, ctx); err != nil {
		t.Fatalf("valid spec rejected: %v", err)
	}
	admin := ctx
	admin.Submitter = &allot.User{Admin: true}
	if err := allot.ValidateSubmission(&s, admin); err != nil {
		t.Fatalf("admin rejected: %v", err)
	}
}

func TestCheckQuota(t *testing.T) {
	t.Parallel()
	s := spec() // 8 GPUs × 4 h = 32 GPU-hours
	tests := []struct {
		name      string
		tier      allot.TierID
		budget    int64
		usedHours int64
		want      allot.QuotaOutcome
	}{
		{"enough left", allot.Tier3, 100, 68, allot.QuotaOutcome{RemainingGPUSeconds: 32 * 3600}},
		{"some left", allot.Tier3, 100, 90, allot.QuotaOutcome{Preemptible: true, RemainingGPUSeconds: 10 * 3600,
			Warning: "Only 10.0 h remaining in budget; this job will run as preemptible"}},
		{"exceeded", allot.Tier4, 100, 112, allot.QuotaOutcome{Preemptible: true, RemainingGPUSeconds: -12 * 3600,
			Warning: "Budget exceeded by 12.0 h; this job will run as preemptible"}},
		{"exactly zero left", allot.Tier3, 100, 100, allot.QuotaOutcome{Preemptible: true,
			Warning: "Budget exceeded by 0.0 h; this job will run as preemptible"}},
		{"production never demoted", allot.Tier1, 100, 112, allot.QuotaOutcome{RemainingGPUSeconds: -12 * 3600,
			Warning: "Budget exceeded by 12.0 h; production tiers are never demoted, this job keeps its priority"}},
		{"no budget", allot.Tier3, 0, 500, allot.QuotaOutcome{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.Tier = tt.tier
			got := allot.CheckQuota(&s, tt.budget, tt.usedHours*3600)
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("(-want +got)\n%s", d)
			}
		})
	}
}

func TestMoney(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"2.5": "2.50 USD", "0.123456": "0.123456 USD", "3 EUR": "3.00 EUR", "-1.05": "-1.05 USD"} {
		m, err := allot.ParseMoney(in, "USD")
		if err != nil || m.String() != want {
			t.Errorf("ParseMoney(%q) = %v, %v; want %s", in, m, err, want)
		}
	}
	for _, bad := range []string{"", "1.2345678", "abc", "1.2.3", "1 US"} {
		if _, err := allot.ParseMoney(bad, "USD"); err == nil {
			t.Errorf("ParseMoney(%q) accepted", bad)
		}
	}
}

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"4h": 4 * time.Hour, "90m": 90 * time.Minute, "2d": 48 * time.Hour, "1d12h": 36 * time.Hour, "3600": time.Hour} {
		if got, err := allot.ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "soon", "4x"} {
		if _, err := allot.ParseDuration(bad); err == nil {
			t.Errorf("ParseDuration(%q) accepted", bad)
		}
	}
	if got := allot.FormatDuration(90 * time.Minute); got != "1h30m" {
		t.Errorf("FormatDuration = %s", got)
	}
}

func TestValidateDomain(t *testing.T) {
	t.Parallel()
	team := allot.Team{Slug: "nlp", Name: "NLP", CostCenter: "CC-1", FairShareWeight: 1}
	if err := team.Validate(); err != nil {
		t.Fatal(err)
	}
	team.Slug, team.FairShareWeight, team.MonthlyBudgetGPUHours = "NLP!", 0, -1
	if f := allot.Fields(team.Validate()); len(f) != 3 {
		t.Errorf("team fields = %v", f)
	}
	n := allot.Node{Name: "gpu01", GPUType: "T4", GPUCount: 0, Site: "moon", State: allot.NodeUp}
	if f := allot.Fields(n.Validate()); f["gpu_count"] == "" || f["site"] == "" {
		t.Errorf("node fields = %v", f)
	}
	p := allot.DefaultPolicy()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	p.BudgetWarnPct = 120
	if allot.Fields(p.Validate())["budget_warn_pct"] == "" {
		t.Error("policy warn > demote accepted")
	}
	tier := allot.Tier{ID: allot.Tier1, Name: "x", ClassOrder: 1, MayPreempt: []allot.TierID{allot.Tier2}, MultiplierBP: 3000, MaxRuntime: time.Hour}
	if allot.Fields(tier.Validate())["may_preempt"] == "" {
		t.Error("tier may preempt production accepted")
	}
	if tier.Multiplier() != "0.3" {
		t.Errorf("multiplier %s", tier.Multiplier())
	}
}

func TestSplitCommand(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][]string{
		`python train.py --lr 3e-4`: {"python", "train.py", "--lr", "3e-4"},
		`bash -c 'echo "hi there"'`: {"bash", "-c", `echo "hi there"`},
		`echo "a\"b" c\ d ''`:       {"echo", `a"b`, "c d", ""},
		"  torchrun\tx.py  ":        {"torchrun", "x.py"},
	} {
		got, err := allot.SplitCommand(in)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("SplitCommand(%q) (-want +got)\n%s", in, d)
		}
		back, _ := allot.SplitCommand(allot.JoinCommand(got))
		if d := cmp.Diff(got, back); d != "" {
			t.Errorf("JoinCommand round trip of %q (-want +got)\n%s", in, d)
		}
	}
	for _, bad := range []string{`echo 'x`, `echo "x`, `echo x\`} {
		if _, err := allot.SplitCommand(bad); err == nil {
			t.Errorf("SplitCommand(%q) accepted", bad)
		}
	}
}
