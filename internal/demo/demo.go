// Package demo seeds a demonstration organisation: three teams with leads
// and engineers, finance and admin people, 16 GPU nodes in two interconnect
// domains, GPU types with rates, the five tiers, a policy, and this month's
// and last month's usage history, so every page has something true to show
// at any instant of any month. Tests use it as their fixture too.
package demo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// Persona names, as shown on the dev login page.
const (
	Engineer = "engineer"
	Lead     = "lead"
	Finance  = "finance"
	Admin    = "admin"
)

// Personas lists the persona names in display order.
var Personas = []string{Engineer, Lead, Finance, Admin}

// PersonaEmail maps a persona to its demo user.
var PersonaEmail = map[string]string{
	Engineer: "noah@example.com",
	Lead:     "nadia@example.com",
	Finance:  "finn@example.com",
	Admin:    "ada@example.com",
}

type person struct {
	name, email, team, role string
	admin, finance          bool
}

var people = []person{
	{"Ada Admin", "ada@example.com", "", "", true, false},
	{"Finn Finance", "finn@example.com", "", "", false, true},
	{"Farah Haddad", "farah@example.com", "fraud", allot.TeamRoleLead, false, false},
	{"Felix Braun", "felix@example.com", "fraud", allot.TeamRoleMember, false, false},
	{"Fiona Walsh", "fiona@example.com", "fraud", allot.TeamRoleMember, false, false},
	{"Rosa Martins", "rosa@example.com", "recs", allot.TeamRoleLead, false, false},
	{"Ravi Iyer", "ravi@example.com", "recs", allot.TeamRoleMember, false, false},
	{"Rui Costa", "rui@example.com", "recs", allot.TeamRoleMember, false, false},
	{"Nadia Petrova", "nadia@example.com", "nlp", allot.TeamRoleLead, false, false},
	{"Noah Kim", "noah@example.com", "nlp", allot.TeamRoleMember, false, false},
	{"Nina Rossi", "nina@example.com", "nlp", allot.TeamRoleMember, false, false},
}

// Team is one demo team and the share of its monthly budget its story uses.
type Team struct {
	allot.Team
	UsedPct int      // percent of the monthly budget a whole month of history uses
	Nodes   []string // nodes its history ran on
}

// Teams is the demo organisation's teams. Their budgets (2000, 3000 and
// 4000 GPU-hours a month) are the same at every instant.
var Teams = []Team{
	{allot.Team{Slug: "fraud", Name: "Fraud Detection", CostCenter: "CC-4100", MonthlyBudgetGPUHours: 2000, FairShareWeight: 1,
		Guarantees: map[string]int{"A100-80GB": 16}, PosixAccount: "svc-fraud"}, 35, []string{"gpu01", "gpu02", "gpu03", "gpu04"}},
	{allot.Team{Slug: "recs", Name: "Recommendations", CostCenter: "CC-4200", MonthlyBudgetGPUHours: 3000, FairShareWeight: 1,
		Guarantees: map[string]int{"A100-80GB": 24, "T4": 16}, PosixAccount: "svc-recs"}, 82, []string{"gpu05", "gpu06", "gpu07", "gpu08"}},
	{allot.Team{Slug: "nlp", Name: "Language Models", CostCenter: "CC-4300", MonthlyBudgetGPUHours: 4000, FairShareWeight: 2,
		Guarantees: map[string]int{"A100-80GB": 32}, PosixAccount: "svc-nlp"}, 104, []string{"gpu09", "gpu10", "gpu11", "gpu12"}},
}

// Tiers are the five tiers of DESIGN.md with demo prices and limits.
func Tiers() []allot.Tier {
	return []allot.Tier{
		{ID: allot.Tier1, Name: "Production incident", Description: "Production incident retraining: dedicated reservation, may preempt tiers 3–4 and preemptible work.",
			ClassOrder: 1, MayPreempt: []allot.TierID{allot.Tier3, allot.Tier4, allot.TierPreemptible}, ReservedGPUs: 16, MultiplierBP: 15000, MaxRuntime: 48 * time.Hour},
		{ID: allot.Tier2, Name: "Scheduled production", Description: "Scheduled production retraining: dedicated reservation, may preempt preemptible work.",
			ClassOrder: 2, MayPreempt: []allot.TierID{allot.TierPreemptible}, ReservedGPUs: 16, MultiplierBP: 12500, MaxRuntime: 72 * time.Hour},
		{ID: allot.Tier3, Name: "Experiment", Description: "Experiment development and validation: fair share.",
			ClassOrder: 3, MultiplierBP: 10000, MaxRuntime: 7 * 24 * time.Hour},
		{ID: allot.Tier4, Name: "Exploration", Description: "Exploratory research and sweeps: fair share.",
			ClassOrder: 4, MultiplierBP: 10000, MaxRuntime: 7 * 24 * time.Hour},
		{ID: allot.TierPreemptible, Name: "Preemptible", Description: "Runs on idle GPUs only and is killed first; 70 % off.",
			ClassOrder: 5, MultiplierBP: 3000, MaxRuntime: 3 * 24 * time.Hour},
	}
}

// Nodes returns gpu01–gpu16, 8 GPUs each: gpu01–gpu08 A100-80GB in domain
// ib-a; gpu09–gpu12 A100-80GB and gpu13–gpu16 T4 in domain ib-b. They are
// down until their agents register (`allot dev` starts them in-process).
func Nodes() []allot.Node {
	var out []allot.Node
	for i := 1; i <= 16; i++ {
		n := allot.Node{Name: fmt.Sprintf("gpu%02d", i), GPUType: "A100-80GB", GPUCount: 8, Site: allot.SiteOnPrem,
			Domain: "ib-a", Rack: fmt.Sprintf("r%d", (i-1)/4+1), State: allot.NodeDown}
		if i > 8 {
			n.Domain = "ib-b"
		}
		if i > 12 {
			n.GPUType = "T4"
		}
		out = append(out, n)
	}
	return out
}

// StoryFrom is how far into a month the month itself tells the budget
// story (recs past 80 %, nlp past 100 %): from then on this month's history
// holds each team's full share; before, each team is on the pace of that
// story (its share × the part of the month gone by), and last month, seeded
// complete with its alerts, holds the full story.
const StoryFrom = 7 * 24 * time.Hour

// StoryClock is a clock that runs at real speed from noon on the 20th of
// the month now() is in, when this month holds the whole budget story
// (past StoryFrom). Tests of the story run their cluster on it; everything
// else runs at now() itself.
func StoryClock(now func() time.Time) func() time.Time {
	at := now()
	shift := store.MonthStart(at).Add(19*24*time.Hour + 12*time.Hour).Sub(at)
	return func() time.Time { return now().Add(shift) }
}

// SeededKey is the allot_meta key that marks a complete demo seed; its
// value is the instant the demo was seeded as of.
const SeededKey = "demo_seeded"

// Seed fills an empty, migrated database with the demo organisation as of
// st.Now(), in one transaction: on any error nothing is left behind. It
// fails if the database already holds teams.
func Seed(ctx context.Context, st *store.Store) error {
	return st.InTx(ctx, func(tx *store.Store) error { return seed(ctx, tx) })
}

// SeedAll is Seed and SeedActivity in one transaction: what `allot dev`
// runs on an empty database.
func SeedAll(ctx context.Context, st *store.Store) error {
	return st.InTx(ctx, func(tx *store.Store) error {
		if err := seed(ctx, tx); err != nil {
			return err
		}
		return seedActivity(ctx, tx)
	})
}

// State says what a database holds: nothing yet, a complete demo seed, or
// teams that no complete demo seed made (an interrupted seed of an older
// version, or an organisation of its own).
type State int

// The States.
const (
	Empty State = iota
	Seeded
	Foreign
)

// Inspect tells the State of st's database.
func Inspect(ctx context.Context, st *store.Store) (State, error) {
	n, err := st.CountTeams(ctx)
	if err != nil || n == 0 {
		return Empty, err
	}
	_, ok, err := st.Meta(ctx, SeededKey)
	if err != nil || !ok {
		return Foreign, err
	}
	return Seeded, nil
}

func seed(ctx context.Context, st *store.Store) error {
	if n, err := st.CountTeams(ctx); err != nil || n > 0 {
		if err == nil {
			err = fmt.Errorf("seeding: the database already holds %d teams", n)
		}
		return err
	}
	now := st.Now().UTC()
	monthStart := store.MonthStart(now)
	lastMonth := monthStart.AddDate(0, -1, 0)
	for _, g := range []allot.GPUType{
		{Name: "A100-80GB", MemoryGB: 80, HourlyRate: allot.Money{Micros: 3_200_000, Currency: "USD"}},
		{Name: "T4", MemoryGB: 16, HourlyRate: allot.Money{Micros: 350_000, Currency: "USD"}},
	} {
		if err := st.CreateGPUType(ctx, &g, monthStart.AddDate(-1, 0, 0)); err != nil {
			return fmt.Errorf("seeding GPU types: %w", err)
		}
	}
	for _, t := range Tiers() {
		if err := st.UpsertTier(ctx, &t); err != nil {
			return fmt.Errorf("seeding tiers: %w", err)
		}
	}
	var nodeNames []string
	for _, n := range Nodes() {
		if err := st.CreateNode(ctx, &n); err != nil {
			return fmt.Errorf("seeding nodes: %w", err)
		}
		nodeNames = append(nodeNames, n.Name)
	}
	// The nodes have been the cluster since the GPU types' rates began, so
	// the history seeded below lies inside registered capacity.
	if err := st.SeedNodeHistory(ctx, nodeNames, monthStart.AddDate(-1, 0, 0)); err != nil {
		return err
	}
	// `allot migrate` stores the default policy (migration 0020); the
	// demo keeps it as its first version.
	p, err := st.CurrentPolicy(ctx)
	if err != nil {
		return fmt.Errorf("seeding policy: %w", err)
	}
	if p.Version == 0 {
		p = allot.DefaultPolicy()
		if err := st.InsertPolicy(ctx, &p); err != nil {
			return fmt.Errorf("seeding policy: %w", err)
		}
	}
	for i := range Teams {
		t := Teams[i].Team
		if err := st.CreateTeam(ctx, &t); err != nil {
			return fmt.Errorf("seeding teams: %w", err)
		}
	}
	users := map[string]*allot.User{}
	byTeam := map[string][]*allot.User{}
	for _, who := range people {
		u := &allot.User{OIDCSubject: "demo|" + who.email, Email: who.email, Name: who.name, Admin: who.admin, Finance: who.finance}
		if who.team != "" {
			u.Memberships = []allot.Membership{{Team: who.team, Role: who.role}}
			// The team's people are mapped to their POSIX accounts (noah,
			// nadia, …); the admin has none, so the jobs she submits run
			// as the team's service account (svc-nlp, …).
			u.PosixUser = strings.ToLower(strings.Fields(who.name)[0])
		}
		if err := st.CreateUser(ctx, u); err != nil {
			return fmt.Errorf("seeding users: %w", err)
		}
		users[who.email] = u
		if who.team != "" {
			byTeam[who.team] = append(byTeam[who.team], u)
		}
	}
	k := 0
	for _, t := range Teams {
		budget := t.MonthlyBudgetGPUHours * 3600 // GPU-seconds
		// Last month: the whole story, with the alerts it fired.
		if err := seedHistory(ctx, st, t, byTeam[t.Slug], lastMonth, monthStart, budget*int64(t.UsedPct)/100, p, &k); err != nil {
			return err
		}
		if err := seedHistory(ctx, st, t, byTeam[t.Slug], monthStart, now, ThisMonthUse(t, now), allot.Policy{}, &k); err != nil {
			return err
		}
	}
	if err := seedQueue(ctx, st, users); err != nil {
		return err
	}
	return st.SetMeta(ctx, SeededKey, now.Format(time.RFC3339))
}

// ThisMonthUse is the GPU-seconds team t's history holds for the month of
// now (see StoryFrom).
func ThisMonthUse(t Team, now time.Time) int64 {
	monthStart := store.MonthStart(now)
	full := t.MonthlyBudgetGPUHours * 3600 * int64(t.UsedPct) / 100
	elapsed := now.Sub(monthStart)
	if elapsed >= StoryFrom {
		return full
	}
	month := monthStart.AddDate(0, 1, 0).Sub(monthStart)
	return int64(float64(full) * float64(elapsed) / float64(month))
}

// seedHistory records finished 8-GPU jobs on the team's nodes between from
// and until, gpuSeconds in all, in jobs of at most 6 h, each on the node
// free soonest. With a policy (last month), it records the budget alerts
// the month fired where the usage crossed their thresholds.
func seedHistory(ctx context.Context, st *store.Store, t Team, members []*allot.User, from, until time.Time, gpuSeconds int64, p allot.Policy, k *int) error {
	target := time.Duration(gpuSeconds/8) * time.Second // node-time at 8 GPUs
	if target < time.Minute {
		return nil
	}
	nodes := len(t.Nodes)
	chunk := min(6*time.Hour, ((target + time.Duration(nodes) - 1) / time.Duration(nodes)).Round(time.Second))
	nodeFree := make([]time.Time, nodes)
	for i := range nodeFree {
		nodeFree[i] = from
	}
	type crossing struct {
		pct int
		at  time.Time
	}
	var thresholds []int
	if p.BudgetWarnPct > 0 {
		thresholds = []int{p.BudgetWarnPct, p.BudgetDemotePct}
	}
	budget := t.MonthlyBudgetGPUHours * 3600
	var used int64
	var crossed []crossing
	names := []string{"bert-finetune", "ranker-train", "eval-sweep", "ablation", "distill", "pretrain-shard"}
	for target > 0 {
		d := min(chunk, target)
		target -= d
		n := 0
		for i := range nodeFree {
			if nodeFree[i].Before(nodeFree[n]) {
				n = i
			}
		}
		start := nodeFree[n]
		end := start.Add(d)
		if end.After(until.Add(-time.Minute)) {
			return fmt.Errorf("seeding history of %s: %s of usage does not fit between %s and %s", t.Slug, allot.FormatDuration(target+d), from.Format(time.RFC3339), until.Format(time.RFC3339))
		}
		nodeFree[n] = end
		i := *k
		*k++
		u := members[i%len(members)]
		spec := allot.JobSpec{Name: fmt.Sprintf("%s-%d", names[i%len(names)], i+1), Team: t.Slug, Tier: []allot.TierID{allot.Tier3, allot.Tier4, allot.Tier3, allot.Tier2}[i%4],
			GPUs: 8, GPUType: "A100-80GB", TimeLimit: 8 * time.Hour, Command: []string{"python", "train.py", "--epochs", "3"}}
		state := allot.JobCompleted
		if i%9 == 4 {
			state = allot.JobFailed
		}
		if err := st.RecordFinishedJob(ctx, u, spec, state, start.Add(-time.Duration(i%5)*time.Minute), start, end, t.Nodes[n], []int{0, 1, 2, 3, 4, 5, 6, 7}); err != nil {
			return fmt.Errorf("seeding history of %s: %w", t.Slug, err)
		}
		before := used
		used += int64(d/time.Second) * 8
		for _, pct := range thresholds {
			if before*100 < budget*int64(pct) && used*100 >= budget*int64(pct) {
				crossed = append(crossed, crossing{pct, end})
			}
		}
	}
	for _, c := range crossed {
		a := store.BudgetAlert{Team: t.Slug, Month: from, ThresholdPct: c.pct, FiredAt: c.at, UsedGPUSeconds: budget * int64(c.pct) / 100,
			BudgetGPUHours: t.MonthlyBudgetGPUHours}
		a.Message = allot.BudgetAlertMessage(t.Slug, a.UsedGPUSeconds, t.MonthlyBudgetGPUHours, from, c.pct >= p.BudgetDemotePct)
		if _, err := st.FireBudgetAlert(ctx, &a); err != nil {
			return fmt.Errorf("seeding alerts of %s: %w", t.Slug, err)
		}
	}
	return nil
}

// trainLoop is a stand-in training script that runs anywhere: it prints a
// step and a loss every 5 seconds for about secs seconds, and checkpoints
// when ALLOT_CHECKPOINT_DIR is set.
func trainLoop(name string, secs int) []string {
	return []string{"sh", "-c", fmt.Sprintf(`echo "%s: starting on GPUs $CUDA_VISIBLE_DEVICES (node rank ${NODE_RANK:-0})"
trap 'echo "%s: SIGTERM, checkpointing"; exit 0' TERM
i=0; while [ $i -lt %d ]; do i=$((i+5)); echo "%s step $i loss 0.$((9999 - i %% 9000))"
[ -n "$ALLOT_CHECKPOINT_DIR" ] && echo $i > "$ALLOT_CHECKPOINT_DIR/step"; sleep 5 & wait; done`, name, name, secs, name)}
}

// seedQueue submits a few pending jobs through the normal submission path.
func seedQueue(ctx context.Context, st *store.Store, users map[string]*allot.User) error {
	for _, q := range []struct {
		email string
		spec  allot.JobSpec
	}{
		{"noah@example.com", allot.JobSpec{Name: "llama-sft", Team: "nlp", Tier: allot.Tier3, GPUs: 16, GPUType: "A100-80GB", TimeLimit: 12 * time.Hour,
			Command: trainLoop("sft", 7200), Checkpointable: true}},
		{"felix@example.com", allot.JobSpec{Name: "fraud-gbdt-gpu", Team: "fraud", Tier: allot.Tier3, GPUs: 2, TimeLimit: 2 * time.Hour,
			Command: trainLoop("gbdt", 1800)}},
		{"rosa@example.com", allot.JobSpec{Name: "ranker-nightly", Team: "recs", Tier: allot.Tier2, GPUs: 8, GPUType: "A100-80GB", TimeLimit: 6 * time.Hour,
			Command: trainLoop("ranker", 3600), Checkpointable: true}},
		{"ravi@example.com", allot.JobSpec{Name: "embedding-sweep", Team: "recs", Tier: allot.Tier4, GPUs: 1, GPUType: "T4", TimeLimit: 3 * time.Hour,
			Command: trainLoop("sweep-trial-7", 900), Preemptible: true}},
	} {
		if _, err := st.SubmitJob(ctx, users[q.email], q.spec); err != nil {
			return fmt.Errorf("seeding queue: %w", err)
		}
	}
	return nil
}

// SeedActivity adds a week of recent activity to a seeded demo so the
// dashboards have something true to draw: finished jobs of every team and
// tier on the T4 nodes (gpu13–gpu16, which the month's history leaves free)
// over the last 7 days, each having waited in the queue a tier-typical
// time; hourly utilization rollups for the finished work of the last 8
// days (store.SeedDemoMetering: some jobs run low, some leave GPUs idle,
// some would fit a T4); and the teams' decayed fair-share usage from all
// history. Each team's recent jobs add about 5 % of its monthly budget.
// `allot dev` runs it after Seed; tests call it when they need history.
func SeedActivity(ctx context.Context, st *store.Store) error {
	return st.InTx(ctx, func(tx *store.Store) error { return seedActivity(ctx, tx) })
}

func seedActivity(ctx context.Context, st *store.Store) error {
	now := st.Now().UTC()
	teams, err := st.ListTeams(ctx)
	if err != nil {
		return err
	}
	members := map[string][]*allot.User{}
	for _, p := range people {
		if p.team == "" {
			continue
		}
		u, err := st.UserByEmail(ctx, p.email)
		if err != nil {
			return fmt.Errorf("seeding activity: %w", err)
		}
		members[p.team] = append(members[p.team], &u)
	}
	type kind struct {
		tier allot.TierID
		wait time.Duration
	}
	kinds := []kind{{allot.Tier3, 25 * time.Minute}, {allot.Tier4, 70 * time.Minute}, {allot.Tier2, 3 * time.Minute},
		{allot.TierPreemptible, 2 * time.Hour}, {allot.Tier1, time.Minute}}
	names := []string{"eval", "sweep", "nightly", "hpo-trial", "incident-retrain"}
	start := now.Add(-7 * 24 * time.Hour).Truncate(time.Hour)
	k := 0
	for ti, t := range teams {
		// About 5 % of the budget over 7 days, in 4-GPU jobs on one T4 node.
		node := fmt.Sprintf("gpu%02d", 13+ti%4)
		perDay := time.Duration(float64(t.MonthlyBudgetGPUHours) * 0.05 / 7 / 4 * float64(time.Hour)).Round(time.Minute)
		perDay = min(max(perDay, 10*time.Minute), 10*time.Hour)
		for d := 0; d < 7; d++ {
			for half := 0; half < 2; half++ {
				s := start.Add(time.Duration(d)*24*time.Hour + time.Duration(half)*12*time.Hour + time.Duration(ti)*time.Hour)
				e := s.Add(perDay / 2)
				if !e.Before(now.Add(-time.Hour)) {
					continue
				}
				kd := kinds[k%len(kinds)]
				u := members[t.Slug][k%len(members[t.Slug])]
				gpus := []int{0, 1, 2, 3}
				if half == 1 {
					gpus = []int{4, 5, 6, 7}
				}
				spec := allot.JobSpec{Name: fmt.Sprintf("%s-%s-%d", t.Slug, names[k%len(names)], k+1), Team: t.Slug, Tier: kd.tier, GPUs: 4,
					GPUType: "T4", TimeLimit: 12 * time.Hour, Command: []string{"python", "train.py", "--config", names[k%len(names)] + ".yaml"}}
				wait := kd.wait + time.Duration(k%5)*kd.wait/4
				if err := st.RecordFinishedJob(ctx, u, spec, allot.JobCompleted, s.Add(-wait), s, e, node, gpus); err != nil {
					return fmt.Errorf("seeding activity of %s: %w", t.Slug, err)
				}
				k++
			}
		}
	}
	if err := st.SeedDemoMetering(ctx, now.Add(-8*24*time.Hour), now); err != nil {
		return err
	}
	p, err := st.CurrentPolicy(ctx)
	if err != nil {
		return err
	}
	return st.BackfillTeamUsage(ctx, p.HalfLife)
}

// Workspace is what `allot dev` puts in the directory its in-process
// agents run jobs in (agent.Config.WorkDir) when a job names none: the
// scripts the README's and the demo's examples run, as stand-ins that work
// anywhere with a python3 (or python). Each prints steps and a loss, stops
// cleanly on SIGTERM, and checkpoints into ALLOT_CHECKPOINT_DIR when set.
var Workspace = map[string]string{
	"train.py": standIn("train", 600),
	"eval.py":  standIn("eval", 60),
	"sweep.py": standIn("sweep", 300),
	"README.txt": `This is the demo's job directory: a job submitted without a working
directory (--workdir, "workdir") runs here. train.py, eval.py and sweep.py
are stand-ins for real training scripts: they print a step and a loss
every 5 seconds, honour SIGTERM (preemption) and write a checkpoint into
$ALLOT_CHECKPOINT_DIR when the job is checkpointable.
`,
}

func standIn(name string, secs int) string {
	return fmt.Sprintf(`#!/usr/bin/env python3
"""Allot demo stand-in for %[1]s: prints steps and a loss, honours SIGTERM
and checkpoints into $ALLOT_CHECKPOINT_DIR. Arguments are shown, not used."""
import os, signal, sys, time

def stop(signum, frame):
    print("%[1]s: SIGTERM, checkpointing and stopping", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
print("%[1]s: args %%s on GPUs %%s (rank %%s of %%s)" %% (sys.argv[1:], os.environ.get("CUDA_VISIBLE_DEVICES", ""),
      os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")), flush=True)
ckpt = os.environ.get("ALLOT_CHECKPOINT_DIR", "")
step = 0
if ckpt and os.path.exists(os.path.join(ckpt, "step")):
    step = int(open(os.path.join(ckpt, "step")).read() or 0)
    print("%[1]s: resuming from step %%d" %% step, flush=True)
while step < %[2]d:
    time.sleep(5)
    step += 5
    if ckpt:
        with open(os.path.join(ckpt, "step"), "w") as f:
            f.write(str(step))
    print("%[1]s step %%d loss %%.4f" %% (step, 2.0 / (1 + step / 100.0)), flush=True)
print("%[1]s: done", flush=True)
`, name, secs)
}

// WriteWorkspace writes Workspace into dir (created if needed), leaving
// files a user changed alone.
func WriteWorkspace(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("demo workspace: %w", err)
	}
	for name, body := range Workspace {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err == nil {
			continue
		}
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			return fmt.Errorf("demo workspace: %w", err)
		}
	}
	return nil
}
