package backend_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/backend"
	"github.com/allotlabs/allot/internal/health"
	"github.com/allotlabs/allot/internal/slurm"
	"github.com/allotlabs/allot/internal/slurmpolicy"
	"github.com/allotlabs/allot/internal/slurmtest"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
)

// Allot over a real Slurm 22.05 (internal/slurmtest): PostgreSQL, River-free
// reconciler calls, slurmrestd with JWT, slurmdbd accounting.

const (
	engA = "allot-sb1" // nlp's engineer, known to Allot
	engB = "allot-sb2" // nlp's engineer who only uses sbatch (unknown to Allot)
	engC = "allot-sb3" // vision's engineer
)

type env struct {
	t     *testing.T
	ctx   context.Context
	st    *store.Store
	c     *slurmtest.Cluster
	rec   *backend.Reconciler
	alice allot.User
	vic   allot.User
	admin allot.User
}

func setup(t *testing.T) *env {
	t.Helper()
	if ok, why := slurmtest.Available(); !ok {
		t.Skip(why)
	}
	ctx := context.Background()
	st := storetest.New(t)
	e := &env{t: t, ctx: ctx, st: st}
	from := st.Now().Add(-24 * time.Hour).Truncate(time.Hour)
	must(t, st.CreateGPUType(ctx, &allot.GPUType{Name: "h100", MemoryGB: 80, HourlyRate: allot.Money{Micros: 3_600_000, Currency: "USD"}, Backend: allot.BackendSlurm}, from))
	for _, tm := range []allot.Team{{Slug: "nlp", Name: "NLP", CostCenter: "CC-1", FairShareWeight: 3, MonthlyBudgetGPUHours: 1000},
		{Slug: "vision", Name: "Vision", CostCenter: "CC-2", FairShareWeight: 1, MonthlyBudgetGPUHours: 1}} {
		must(t, st.CreateTeam(ctx, &tm))
	}
	e.alice = allot.User{OIDCSubject: "alice", Email: "alice@corp.example", Name: "Alice", PosixUser: engA,
		Memberships: []allot.Membership{{Team: "nlp", Role: allot.TeamRoleMember}}}
	e.vic = allot.User{OIDCSubject: "vic", Email: "vic@corp.example", Name: "Vic", PosixUser: engC,
		Memberships: []allot.Membership{{Team: "vision", Role: allot.TeamRoleMember}}}
	e.admin = allot.User{OIDCSubject: "root", Email: "admin@corp.example", Name: "Admin", Admin: true}
	for _, u := range []*allot.User{&e.alice, &e.vic, &e.admin} {
		must(t, st.CreateUser(ctx, u))
	}
	for _, u := range []string{engA, engB, engC} {
		slurmtest.EnsureUser(t, u)
	}
	in, err := st.SlurmPolicyInput(ctx)
	must(t, err)
	in.Members["nlp"] = append(in.Members["nlp"], engB)
	in.Policy.MinRuntime = 0
	in.Policy.GracePeriod = 5 * time.Second
	in.OverBudgetFile = filepath.Join(t.TempDir(), "over-budget")
	in.OverBudgetRefresh = time.Second
	r := slurmpolicy.Render(in)
	e.c = slurmtest.Start(t, slurmtest.Options{Nodes: 2, GPUsPerNode: 4, Users: []string{engA, engB, engC},
		ConfExtra: r.SlurmConf, JobSubmitLua: r.JobSubmitLua, Enforce: "associations,limits,qos"})
	actual, err := slurmpolicy.ReadClusterState(ctx, e.c.Env())
	must(t, err)
	must(t, slurmpolicy.Apply(ctx, e.c.Env(), slurmpolicy.Diff(r.Desired, actual)))
	cl, err := slurm.New(slurm.Config{URL: e.c.RestURL, TokenUser: e.c.SlurmUser, JWTKeyFile: e.c.JWTKeyFile, SlurmConf: e.c.SlurmConf})
	must(t, err)
	e.rec = &backend.Reconciler{Store: st, Engine: &backend.SlurmEngine{Client: cl},
		Mapping:        store.EngineMapping{Backend: allot.BackendSlurm, DefaultGPUType: "h100"},
		OverBudgetFile: in.OverBudgetFile, ImportSince: from, Overlap: time.Minute}
	e.sync()
	return e
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (e *env) sync() backend.Report {
	e.t.Helper()
	rep, err := e.rec.Sync(e.ctx)
	if err != nil {
		e.t.Fatalf("sync: %v", err)
	}
	return rep
}

// until syncs until ok holds (a deadline, not product time).
func (e *env) until(what string, ok func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second) // a deadline, not product time
	for {
		e.sync()
		if ok() {
			return
		}
		// a deadline, not product time
		if time.Now().After(deadline) {
			out, _ := e.c.Exec("squeue", "-a", "-o", "%i %u %a %q %T %r %b %N")
			e.t.Fatalf("timed out waiting for %s; squeue:\n%s", what, out)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func (e *env) job(id int64) allot.Job {
	e.t.Helper()
	j, err := e.st.GetJob(e.ctx, id)
	must(e.t, err)
	return j
}

func (e *env) engineJob(id int64) store.EngineJobInfo {
	e.t.Helper()
	in, ok, err := e.st.EngineJob(e.ctx, id)
	must(e.t, err)
	if !ok {
		e.t.Fatalf("job %d has no Slurm side", id)
	}
	return in
}

func (e *env) submit(u *allot.User, tier allot.TierID, gpus int, cmd ...string) allot.Job {
	e.t.Helper()
	j, err := e.st.SubmitJob(e.ctx, u, allot.JobSpec{Name: "t", Team: u.Memberships[0].Team, Tier: tier, GPUs: gpus, GPUType: "h100",
		TimeLimit: 10 * time.Minute, Command: cmd, WorkDir: e.c.JobsDir})
	must(e.t, err)
	if j.Backend != allot.BackendSlurm {
		e.t.Fatalf("job %d backend %q, want slurm", j.ID, j.Backend)
	}
	return j
}

func gpuSeconds(t *testing.T, st *store.Store, id int64) int64 {
	t.Helper()
	segs, err := st.JobUsageSegments(context.Background(), id, st.Now().Add(time.Hour))
	must(t, err)
	var n int64
	for _, s := range segs {
		n += int64(s.GPUs) * int64(s.End.Sub(s.Start)/time.Second)
	}
	return n
}

func TestSlurmBackend(t *testing.T) {
	e := setup(t)
	ctx := e.ctx

	e.run(t, "nodes", func(t *testing.T) {
		nodes, err := e.st.ListNodes(ctx)
		must(t, err)
		var names []string
		for _, n := range nodes {
			if n.Backend == allot.BackendSlurm && n.GPUType == "h100" && n.GPUCount == 4 && n.State == allot.NodeUp {
				names = append(names, n.Name)
			}
		}
		if !slices.Equal(names, e.c.Nodes) {
			t.Fatalf("Slurm nodes in Allot %v, want %v up with 4 h100", names, e.c.Nodes)
		}
	})

	e.run(t, "submit through Allot, run as the engineer, bill", func(t *testing.T) {
		j := e.submit(&e.alice, allot.Tier3, 2, "sh", "-c", "sleep 2; echo hello from $USER")
		e.sync()
		in := e.engineJob(j.ID)
		if in.ExternalID == 0 {
			t.Fatalf("not submitted: %+v (job %+v)", in, e.job(j.ID))
		}
		e.c.WaitJob(t, in.ExternalID, "COMPLETED")
		e.until("job completed and its run imported", func() bool {
			r := e.engineJob(j.ID).Runs
			return e.job(j.ID).State == allot.JobCompleted && len(r) == 1 && !r[0].End.IsZero()
		})
		out := e.c.Run(t, "sacct", "-n", "-X", "-P", "-j", itoa(in.ExternalID), "-o", "User,Account,QOS,AllocTRES")
		if !strings.Contains(out, engA+"|nlp|allot-t3|") || !strings.Contains(out, "gres/gpu=2") {
			t.Fatalf("Slurm accounting: %q, want user %s, account nlp, QOS allot-t3, 2 GPUs", out, engA)
		}
		if n := gpuSeconds(t, e.st, j.ID); n < 2*2 || n > 2*30 {
			t.Fatalf("billed %d GPU-seconds, want about 2 × 2–3 s", n)
		}
	})

	e.run(t, "sbatch directly: imported and billed", func(t *testing.T) {
		id := e.c.Sbatch(t, engB, "-A", "nlp", "--qos=allot-t4", "--gres=gpu:1", "-J", "direct", "--wrap", "sleep 1")
		e.c.WaitJob(t, id, "COMPLETED")
		var jobID int64
		e.until("sbatch job imported", func() bool {
			jobs, err := e.st.ListJobs(ctx, store.JobFilter{Team: "nlp", Limit: -1})
			must(t, err)
			for _, j := range jobs {
				if in, ok, _ := e.st.EngineJob(ctx, j.ID); ok && in.ExternalID == id && j.State == allot.JobCompleted &&
					len(in.Runs) == 1 && !in.Runs[0].End.IsZero() {
					jobID = j.ID
					return true
				}
			}
			return false
		})
		j := e.job(jobID)
		if j.Tier != allot.Tier4 || j.RunAsUser != engB || j.Name != "direct" || j.User != engB+"@slurm.local" {
			t.Fatalf("imported job %+v", j)
		}
		if n := gpuSeconds(t, e.st, jobID); n < 1 || n > 20 {
			t.Fatalf("billed %d GPU-seconds for a 1-GPU 1 s job: %+v\n%s", n, e.engineJob(jobID), allocations(t, e.st))
		}
	})

	e.run(t, "re-import changes nothing", func(t *testing.T) {
		before := allocations(t, e.st)
		runs, err := e.rec.Engine.Runs(ctx, e.rec.ImportSince, e.st.Now().Add(time.Minute))
		must(t, err)
		res, err := e.st.ImportEngineRuns(ctx, e.rec.Mapping, runs, nil)
		must(t, err)
		if res.NewRuns != 0 || res.UpdatedRuns != 0 {
			t.Fatalf("re-import: %+v", res)
		}
		if after := allocations(t, e.st); after != before {
			t.Fatalf("allocations changed on re-import:\n%s\n%s", before, after)
		}
	})

	e.run(t, "cancel in Allot cancels in Slurm", func(t *testing.T) {
		j := e.submit(&e.alice, allot.Tier3, 1, "sleep", "300")
		e.until("running", func() bool { return e.job(j.ID).State == allot.JobRunning })
		_, err := e.st.CancelJob(ctx, &e.alice, j.ID)
		must(t, err)
		e.sync()
		e.c.WaitJob(t, e.engineJob(j.ID).ExternalID, "CANCELLED")
		e.until("allocations released", func() bool { return !strings.Contains(allocations(t, e.st), "open") })
		if st := e.job(j.ID).State; st != allot.JobCancelled {
			t.Fatalf("state %s", st)
		}
	})

	e.run(t, "preemption with requeue is credited", func(t *testing.T) {
		var low []allot.Job
		for range e.c.Nodes {
			low = append(low, e.submit(&e.alice, allot.TierPreemptible, 4, "sleep", "300"))
		}
		e.until("preemptible jobs running", func() bool {
			return e.job(low[0].ID).State == allot.JobRunning && e.job(low[1].ID).State == allot.JobRunning
		})
		hi := e.submit(&e.alice, allot.Tier1, 4, "sleep", "1")
		var victim allot.Job
		e.until("a preempted run imported and the urgent job done", func() bool {
			if e.job(hi.ID).State != allot.JobCompleted {
				return false
			}
			for _, j := range low {
				if in := e.engineJob(j.ID); len(in.Runs) >= 1 && in.Runs[0].State == "PREEMPTED" && !in.Runs[0].End.IsZero() {
					victim = e.job(j.ID)
					return true
				}
			}
			return false
		})
		if victim.Preemptions != 1 {
			t.Fatalf("victim %d: %d preemptions", victim.ID, victim.Preemptions)
		}
		segs, err := e.st.JobUsageSegments(ctx, victim.ID, e.st.Now().Add(time.Hour))
		must(t, err)
		credited := false
		for _, s := range segs {
			credited = credited || (s.Segment == 1 && !s.PreemptedAt.IsZero())
		}
		if !credited {
			t.Fatalf("the preempted run is not marked for the preemption credit: %+v", segs)
		}
		for _, j := range low {
			_, err := e.st.CancelJob(ctx, &e.alice, j.ID)
			must(t, err)
		}
		e.until("preemptible jobs cancelled in Slurm", func() bool {
			return e.squeueField(e.engineJob(low[0].ID).ExternalID, "%T") == "" && e.squeueField(e.engineJob(low[1].ID).ExternalID, "%T") == ""
		})
	})

	e.run(t, "over budget: demoted at submission and in the queue", func(t *testing.T) {
		held := e.c.Sbatch(t, engC, "-A", "vision", "--qos=allot-t3", "-H", "--gres=gpu:1", "--wrap", "sleep 1")
		e.sync() // imported while vision is within budget
		e.overBudget(&e.vic, "vision")
		rep := e.sync()
		if rep.Demoted != 1 || !slices.Contains(rep.OverBudget, "vision") {
			t.Fatalf("sync report %+v", rep)
		}
		if q := e.squeueField(held, "%q"); q != "allot-preemptible" {
			t.Fatalf("queued job %d has QOS %q, want allot-preemptible", held, q)
		}
		// sbatch, through job_submit.lua reading the list the sync wrote
		// (it re-reads it every OverBudgetRefresh: let that pass).
		time.Sleep(2 * time.Second)
		out := e.c.RunAs(t, engC, "sh", "-c", "sbatch --parsable -A vision --qos=allot-t3 -H --gres=gpu:1 --wrap 'sleep 1' 2>&1")
		if !strings.Contains(out, "account vision is over its GPU-hour budget; job runs as preemptible") {
			t.Fatalf("sbatch said %q", out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		id, err := strconv.ParseInt(strings.Split(lines[len(lines)-1], ";")[0], 10, 64)
		must(t, err)
		if q := e.squeueField(id, "%q"); q != "allot-preemptible" {
			t.Fatalf("sbatch job has QOS %q", q)
		}
		// Through Allot: the budget check (what it asks, 2 GPU-hours, is
		// more than the team's 1 GPU-hour budget leaves, at any instant)
		// demotes it, and Slurm runs it preemptible.
		j, err := e.st.SubmitJob(ctx, &e.vic, allot.JobSpec{Name: "t", Team: "vision", Tier: allot.Tier3, GPUs: 1, GPUType: "h100",
			TimeLimit: 2 * time.Hour, Command: []string{"sleep", "1"}, WorkDir: e.c.JobsDir})
		must(t, err)
		if !j.Demoted {
			t.Fatalf("Allot did not demote job %d", j.ID)
		}
		e.sync()
		if q := e.squeueField(e.engineJob(j.ID).ExternalID, "%q"); q != "allot-preemptible" {
			t.Fatalf("Allot's job has QOS %q in Slurm", q)
		}
		e.c.Run(t, "scancel", itoa(held), itoa(id))
	})

	e.run(t, "pending: Slurm's reason and expected start", func(t *testing.T) {
		var fill []allot.Job
		for range e.c.Nodes {
			fill = append(fill, e.submit(&e.alice, allot.Tier3, 4, "sleep", "60"))
		}
		wait := e.submit(&e.alice, allot.Tier3, 4, "sleep", "1")
		e.until("the last job waits with Slurm's reason", func() bool {
			in := e.engineJob(wait.ID)
			return in.State == "PENDING" && in.Reason != "" && e.job(wait.ID).PendingReason != ""
		})
		in := e.engineJob(wait.ID)
		why := e.job(wait.ID).PendingReason
		if strings.HasPrefix(why, "Slurm: ") || why == "queued in Slurm" {
			t.Fatalf("reason %q not in Allot's words (code %s)", why, in.Reason)
		}
		t.Logf("Slurm reason %s → %q; expected start %v", in.Reason, why, in.StartEstimate)
		for _, j := range append(fill, wait) {
			_, err := e.st.CancelJob(ctx, &e.alice, j.ID)
			must(t, err)
		}
		e.sync()
	})

	e.run(t, "drain both ways", func(t *testing.T) {
		n := e.c.Nodes[0]
		_, err := e.st.DrainNode(ctx, e.admin.Email, n, "XID 79 on GPU 3", false)
		must(t, err)
		e.sync()
		if out := e.c.Run(t, "scontrol", "show", "node", n); !strings.Contains(out, "DRAIN") || !strings.Contains(out, "Reason=allot: ") || !strings.Contains(out, "XID 79 on GPU 3") {
			t.Fatalf("not drained in Slurm: %s", out)
		}
		must(t, e.st.UndrainNode(ctx, e.admin.Email, n, "fixed"))
		e.sync()
		if out := e.c.Run(t, "scontrol", "show", "node", n); strings.Contains(out, "DRAIN") {
			t.Fatalf("still drained in Slurm: %s", out)
		}
		m := e.c.Nodes[1]
		e.c.Run(t, "scontrol", "update", "nodename="+m, "state=drain", "reason=bios update")
		e.sync()
		info, err := e.st.NodeInfoByName(ctx, m)
		must(t, err)
		if info.State != allot.NodeDrained || info.DrainReason != "Slurm: bios update" || info.DrainSource != "slurm" {
			t.Fatalf("Allot shows %s %q %q", info.State, info.DrainSource, info.DrainReason)
		}
		e.c.Run(t, "scontrol", "update", "nodename="+m, "state=resume")
		e.sync()
		if info, _ = e.st.NodeInfoByName(ctx, m); info.State != allot.NodeUp {
			t.Fatalf("after resume in Slurm Allot shows %s", info.State)
		}
	})

	e.run(t, "a health rule drains the Slurm node", func(t *testing.T) {
		n := e.c.Nodes[1]
		_, err := e.st.EvaluateHealth(ctx, n, []health.GPU{{Index: 0}, {Index: 1}, {Index: 2, XIDs: []int{79}}, {Index: 3}}, "")
		must(t, err)
		e.sync()
		out := e.c.Run(t, "scontrol", "show", "node", n)
		if !strings.Contains(out, "DRAIN") || !strings.Contains(out, "Reason=allot: ") || !strings.Contains(out, "xid") {
			t.Fatalf("health drain not in Slurm: %s", out)
		}
		must(t, e.st.UndrainNode(ctx, e.admin.Email, n, "GPU replaced"))
		e.sync()
		if out := e.c.Run(t, "scontrol", "show", "node", n); strings.Contains(out, "DRAIN") {
			t.Fatalf("still drained in Slurm: %s", out)
		}
	})

	e.run(t, "a new member can submit: accounts follow Allot", func(t *testing.T) {
		const engD = "allot-sb4"
		slurmtest.EnsureUser(t, engD)
		dana := allot.User{OIDCSubject: "dana", Email: "dana@corp.example", Name: "Dana", PosixUser: engD,
			Memberships: []allot.Membership{{Team: "nlp", Role: allot.TeamRoleMember}}}
		must(t, e.st.CreateUser(ctx, &dana))
		e.rec.ApplyPolicy = backend.SlurmPolicyApplier(e.st, e.c.Env())
		defer func() { e.rec.ApplyPolicy = nil }()
		if rep := e.sync(); rep.PolicyChanges == 0 {
			t.Fatalf("no account change for a new member: %+v", rep)
		}
		j := e.submit(&dana, allot.Tier3, 1, "true")
		e.until("the new member's job ran", func() bool { return e.job(j.ID).State == allot.JobCompleted })
		if changes, err := backend.SlurmPolicyChanges(ctx, e.st, e.c.Env()); err != nil || len(changes) != 0 {
			t.Fatalf("after applying: %v %v", changes, err)
		}
	})

	e.run(t, "Slurm down: said clearly, caught up after", func(t *testing.T) {
		e.c.StopRest(t)
		j := e.submit(&e.alice, allot.Tier3, 1, "sleep", "1")
		if _, err := e.rec.Sync(ctx); err == nil || !errors.Is(err, slurm.ErrUnreachable) {
			t.Fatalf("sync with slurmrestd down: %v", err)
		}
		sync, err := e.st.EngineSync(ctx)
		must(t, err)
		if sync.DownSince.IsZero() || !strings.Contains(sync.LastError, "not reachable") {
			t.Fatalf("sync state %+v", sync)
		}
		if m, err := e.st.MetricsState(ctx); err != nil || m.Engine == nil || m.Engine.DownSince.IsZero() {
			t.Fatalf("metrics state: %+v %v (allot_engine_up must be 0)", m.Engine, err)
		}
		if why := e.job(j.ID).PendingReason; !strings.Contains(why, "Slurm") {
			t.Fatalf("pending reason while Slurm is down: %q", why)
		}
		e.c.StartRest(t)
		e.until("submitted and run after Slurm is back", func() bool {
			r := e.engineJob(j.ID).Runs
			return e.job(j.ID).State == allot.JobCompleted && len(r) == 1 && !r[0].End.IsZero()
		})
		if sync, _ = e.st.EngineSync(ctx); !sync.DownSince.IsZero() || sync.LastError != "" {
			t.Fatalf("sync state after recovery %+v", sync)
		}
	})
}

// allocations is the allocations table as text, "open" marking open rows.
// run runs a subtest with e's helpers failing it (not the parent).
func (e *env) run(t *testing.T, name string, fn func(t *testing.T)) {
	t.Run(name, func(t *testing.T) {
		parent := e.t
		e.t = t
		defer func() { e.t = parent }()
		fn(t)
	})
}

// squeueField is one %-field of a job from squeue ("" once it is gone).
func (e *env) squeueField(id int64, format string) string {
	e.t.Helper()
	out, _ := e.c.Exec("squeue", "-h", "-j", itoa(id), "-o", format)
	return strings.TrimSpace(out)
}

// overBudget makes team over its budget: the demotion threshold at 1 %
// and enough finished usage this month (back to the month's start at
// most: any instant works once the test has run a few seconds).
func (e *env) overBudget(u *allot.User, team string) {
	e.t.Helper()
	_, err := e.st.UpdatePolicy(e.ctx, store.PolicyChange{Actor: e.admin.Email, Action: "policy.update", Object: "policy"}, func(v *store.PolicyValues) error {
		v.BudgetWarnPct, v.BudgetDemotePct = 1, 1
		return nil
	})
	must(e.t, err)
	now := e.st.Now().UTC().Truncate(time.Second)
	start := now.Add(-time.Hour)
	if ms := store.MonthStart(now); ms.After(start) {
		start = ms
	}
	secs := int64(now.Sub(start) / time.Second)
	if secs < 2 {
		e.t.Fatalf("only %d s of this month so far", secs)
	}
	for used := int64(0); used*100 < 3600; used += 4 * (secs - 1) {
		must(e.t, e.st.RecordFinishedJob(e.ctx, u, allot.JobSpec{Name: "past", Team: team, Tier: allot.Tier3, GPUs: 4, GPUType: "h100",
			TimeLimit: time.Hour, Command: []string{"true"}}, allot.JobCompleted, start, start, now.Add(-time.Second), e.c.Nodes[0], []int{0, 1, 2, 3}))
	}
	over, err := e.st.OverBudgetTeams(e.ctx)
	must(e.t, err)
	if !slices.Contains(over, team) {
		e.t.Fatalf("%s not over budget: %v", team, over)
	}
}

func allocations(t *testing.T, st *store.Store) string {
	t.Helper()
	rows, err := st.Pool().Query(context.Background(), `SELECT job_id, segment, node, gpu_index, started_at, coalesce(released_at::text, 'open')
		FROM allocations ORDER BY job_id, segment, node, gpu_index`)
	must(t, err)
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var job int64
		var seg, gpu int
		var node, rel string
		var start time.Time
		must(t, rows.Scan(&job, &seg, &node, &gpu, &start, &rel))
		fmt.Fprintf(&b, "%d/%d %s:%d %s–%s\n", job, seg, node, gpu, start.UTC().Format(time.RFC3339), rel)
	}
	must(t, rows.Err())
	return b.String()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
