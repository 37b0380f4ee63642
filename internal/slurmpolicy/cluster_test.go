package slurmpolicy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/slurm"
	"github.com/allotlabs/allot/internal/slurmpolicy"
	"github.com/allotlabs/allot/internal/slurmtest"
)

// Real Slurm (internal/slurmtest): the rendered policy applied to a
// private 22.05 cluster, its diff, job_submit.lua's demotion and QOS
// preemption with requeue and grace time.

const (
	userA = "allot-h3a" // a member of nlp
	userB = "allot-h3b" // a member of vision
	// grace is the policy's grace period in these tests: longer than the
	// harness's KillWait (5 s), so a preemptor that waits for it shows the
	// grace time, not the kill wait.
	grace = 12 * time.Second
	// killWait is the harness's KillWait: SIGTERM to SIGKILL.
	killWait = 5 * time.Second
)

func clusterInput(t *testing.T) slurmpolicy.Input {
	in := testInput()
	in.Policy.GracePeriod = grace
	in.Policy.MinRuntime = 0 // preemptible jobs are preempted at once
	in.Teams[0].PosixAccount = ""
	in.Teams[1].Name += ", Équipe ÉTÉ = 2" // a comma, an equals sign, non-ASCII (sacctmgr lower-cases ASCII only)
	in.Members = map[string][]string{"nlp": {userA}, "vision": {userB}}
	in.OverBudget = []string{"vision"}
	in.OverBudgetFile = filepath.Join(t.TempDir(), "allot-over-budget")
	in.OverBudgetRefresh = time.Second
	return in
}

func startCluster(t *testing.T, r slurmpolicy.Rendered) *slurmtest.Cluster {
	t.Helper()
	if ok, why := slurmtest.Available(); !ok {
		t.Skip(why)
	}
	slurmtest.EnsureUser(t, userA)
	slurmtest.EnsureUser(t, userB)
	return slurmtest.Start(t, slurmtest.Options{Nodes: 1, GPUsPerNode: 2,
		ConfExtra: r.SlurmConf, JobSubmitLua: r.JobSubmitLua, Enforce: "associations,limits,qos"})
}

func read(t *testing.T, c *slurmtest.Cluster) slurmpolicy.ClusterState {
	t.Helper()
	st, err := slurmpolicy.ReadClusterState(context.Background(), c.Env())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func texts(cs []slurmpolicy.Change) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "%s\n    %s\n", c.Text, c.Command())
	}
	return b.String()
}

// TestSlurmSync: render → apply → the diff is empty; each policy change
// and hand edit is exactly its difference, and applying it empties the
// diff again; the sacctmgr script fixes drift and is idempotent.
func TestSlurmSync(t *testing.T) {
	t.Parallel()
	in := clusterInput(t)
	r := slurmpolicy.Render(in)
	if err := os.WriteFile(in.OverBudgetFile, []byte(r.OverBudgetList), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, r)
	ctx := context.Background()

	// Render → apply → the diff is empty.
	changes := slurmpolicy.Diff(r.Desired, read(t, c))
	if len(changes) == 0 {
		t.Fatal("a fresh cluster already has Allot's QOS and accounts")
	}
	t.Logf("%d changes on a fresh cluster:\n%s", len(changes), texts(changes))
	start := time.Now() // stopwatch
	if err := slurmpolicy.Apply(ctx, c.Env(), changes); err != nil {
		t.Fatal(err)
	}
	applied := time.Since(start)
	start = time.Now() // a stopwatch
	read(t, c)
	t.Logf("applying %d changes took %v, reading the state %v", len(changes), applied.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if left := slurmpolicy.Diff(r.Desired, read(t, c)); len(left) != 0 {
		t.Fatalf("after applying, still:\n%s\nread: %+v", texts(left), read(t, c))
	}

	// One weight changes: the diff is exactly that; applying it empties it.
	in.Teams[0].FairShareWeight = 5
	r2 := slurmpolicy.Render(in)
	changes = slurmpolicy.Diff(r2.Desired, read(t, c))
	if len(changes) != 1 || changes[0].Text != "account nlp: fairshare 3 → 5" {
		t.Fatalf("after nlp's weight 3 → 5, changes:\n%s", texts(changes))
	}
	if err := slurmpolicy.Apply(ctx, c.Env(), changes); err != nil {
		t.Fatal(err)
	}
	if left := slurmpolicy.Diff(r2.Desired, read(t, c)); len(left) != 0 {
		t.Fatalf("after applying the weight, still:\n%s", texts(left))
	}
	// The user's own association kept its share (only the account's changed).
	if out := c.Run(t, "sacctmgr", "-n", "-P", "show", "assoc", "where", "account=nlp", "user="+userA, "format=Share"); strings.TrimSpace(out) != "1" {
		t.Errorf("%s's association in nlp has share %q, want 1", userA, out)
	}
	// A tier's preemption list and the grace period change, and a member leaves.
	in.Tiers[1].MayPreempt = []allot.TierID{"4", "preemptible"}
	in.Policy.GracePeriod = 30 * time.Second
	in.Members["vision"] = nil
	r3 := slurmpolicy.Render(in)
	changes = slurmpolicy.Diff(r3.Desired, read(t, c))
	got := texts(changes)
	for _, want := range []string{"qos allot-t2: preempt allot-preemptible → allot-preemptible,allot-t4", "qos allot-t1: grace time 12 s → 30 s",
		"account vision: remove user " + userB} {
		if !strings.Contains(got, want) {
			t.Errorf("changes lack %q:\n%s", want, got)
		}
	}
	if len(changes) != 7 { // 5 grace times, 1 preempt list, 1 user
		t.Errorf("%d changes, want 7:\n%s", len(changes), got)
	}
	if err := slurmpolicy.Apply(ctx, c.Env(), changes); err != nil {
		t.Fatal(err)
	}
	if left := slurmpolicy.Diff(r3.Desired, read(t, c)); len(left) != 0 {
		t.Fatalf("after applying, still:\n%s", texts(left))
	}
	// Back to the first policy (the demotion and preemption tests use it).
	if err := slurmpolicy.Apply(ctx, c.Env(), slurmpolicy.Diff(r.Desired, read(t, c))); err != nil {
		t.Fatal(err)
	}
	if left := slurmpolicy.Diff(r.Desired, read(t, c)); len(left) != 0 {
		t.Fatalf("back to the first policy, still:\n%s", texts(left))
	}

	// Hand edits show in the diff, clearing a preemption list included.
	c.Run(t, "sacctmgr", "-i", "modify", "qos", "where", "name=allot-t3", "set", "Priority=9", "Preempt=allot-t4")
	changes = slurmpolicy.Diff(r.Desired, read(t, c))
	if got := texts(changes); len(changes) != 2 || !strings.Contains(got, "qos allot-t3: priority 9 → 3") ||
		!strings.Contains(got, "qos allot-t3: preempt allot-t4 → none") {
		t.Errorf("after hand edits of allot-t3, changes:\n%s", got)
	}
	if err := slurmpolicy.Apply(ctx, c.Env(), changes); err != nil {
		t.Fatal(err)
	}
	if left := slurmpolicy.Diff(r.Desired, read(t, c)); len(left) != 0 {
		t.Fatalf("after undoing the hand edits, still:\n%s", texts(left))
	}

	// The shell script fixes drift too, and is idempotent.
	c.Run(t, "sacctmgr", "-i", "modify", "account", "where", "name=vision", "set", "Fairshare=7")
	c.Run(t, "sacctmgr", "-i", "modify", "qos", "where", "name=allot-t4", "set", "GraceTime=1")
	script := filepath.Join(t.TempDir(), "sacctmgr.sh")
	if err := os.WriteFile(script, []byte(r.Sacctmgr), 0o700); err != nil {
		t.Fatal(err)
	}
	c.Run(t, "sh", script)
	if left := slurmpolicy.Diff(r.Desired, read(t, c)); len(left) != 0 {
		t.Fatalf("after the script, changes:\n%s", texts(left))
	}
}

// TestSlurmDemotionAndPreemption: on a cluster synced to the policy,
// job_submit.lua demotes an over-budget account's sbatch and REST
// submissions with the message, and tier 1 preempts preemptible work with
// requeue after the grace time.
func TestSlurmDemotionAndPreemption(t *testing.T) {
	t.Parallel()
	in := clusterInput(t)
	r := slurmpolicy.Render(in)
	if err := os.WriteFile(in.OverBudgetFile, []byte(r.OverBudgetList), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, r)
	ctx := context.Background()
	if err := slurmpolicy.Apply(ctx, c.Env(), slurmpolicy.Diff(r.Desired, read(t, c))); err != nil {
		t.Fatal(err)
	}

	t.Run("job_submit.lua demotes an over-budget account", func(t *testing.T) {
		out, err := c.ExecAs(userB, "sbatch", "--parsable", "-A", "vision", "--qos=allot-t3", "-t", "5", "--wrap", "sleep 60")
		if err != nil {
			t.Fatal(err)
		}
		const msg = "account vision is over its GPU-hour budget; job runs as preemptible"
		if !strings.Contains(out, msg) {
			t.Errorf("sbatch for vision printed %q, want %q", out, msg)
		}
		id := lastID(t, out)
		if q := jobField(t, c, id, "%q"); q != slurmpolicy.QOSPreemptible {
			t.Errorf("vision's tier-3 job runs in QOS %q, want %s", q, slurmpolicy.QOSPreemptible)
		}
		if cm := jobField(t, c, id, "%k"); cm != slurmpolicy.DemotedTag {
			t.Errorf("vision's job comment %q, want %q", cm, slurmpolicy.DemotedTag)
		}
		// No --qos: the default (tier 3) is demoted too.
		out, err = c.ExecAs(userB, "sbatch", "--parsable", "-A", "vision", "-t", "5", "--comment", "allot:job=7", "--wrap", "sleep 60")
		if err != nil {
			t.Fatal(err)
		}
		id2 := lastID(t, out)
		if q, cm := jobField(t, c, id2, "%q"), jobField(t, c, id2, "%k"); q != slurmpolicy.QOSPreemptible || cm != "allot:job=7 "+slurmpolicy.DemotedTag {
			t.Errorf("vision's job without --qos: QOS %q comment %q", q, cm)
		}
		// No -A: the user's default account (vision) counts; tier 1 is never demoted.
		out, err = c.ExecAs(userB, "sbatch", "--parsable", "-t", "5", "--wrap", "sleep 60")
		if err != nil {
			t.Fatal(err)
		}
		id4 := lastID(t, out)
		if q, a := jobField(t, c, id4, "%q"), jobField(t, c, id4, "%a"); q != slurmpolicy.QOSPreemptible || a != "vision" || !strings.Contains(out, msg) {
			t.Errorf("vision's member without -A: account %q QOS %q, sbatch said %q", a, q, out)
		}
		out, err = c.ExecAs(userB, "sbatch", "--parsable", "-A", "vision", "--qos=allot-t1", "-t", "5", "--wrap", "sleep 60")
		if err != nil {
			t.Fatal(err)
		}
		id5 := lastID(t, out)
		if q := jobField(t, c, id5, "%q"); q != "allot-t1" || strings.Contains(out, "budget") {
			t.Errorf("vision's tier-1 job: QOS %q, sbatch said %q", q, out)
		}
		// Another account stays in its tier, without a message.
		out, err = c.ExecAs(userA, "sbatch", "--parsable", "-A", "nlp", "--qos=allot-t3", "-t", "5", "--wrap", "sleep 60")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "budget") {
			t.Errorf("sbatch for nlp printed %q", out)
		}
		id3 := lastID(t, out)
		if q := jobField(t, c, id3, "%q"); q != "allot-t3" {
			t.Errorf("nlp's tier-3 job runs in QOS %q, want allot-t3", q)
		}
		// Through slurmrestd too (how Allot submits, as the engineer).
		cl, err := slurm.New(slurm.Config{URL: c.RestURL, JWTKeyFile: c.JWTKeyFile, TokenUser: c.SlurmUser, SlurmConf: c.SlurmConf, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		id8, userMsg, err := cl.Submit(ctx, userB, slurm.JobSubmit{Name: "rest", Account: "vision", QOS: "allot-t4", Comment: "allot:job=9",
			Workdir: c.JobsDir, Script: "#!/bin/sh\nsleep 60\n", TimeLimit: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if q, cm := jobField(t, c, id8, "%q"), jobField(t, c, id8, "%k"); q != slurmpolicy.QOSPreemptible || cm != "allot:job=9 "+slurmpolicy.DemotedTag || !strings.Contains(userMsg, msg) {
			t.Errorf("REST submission for vision: QOS %q comment %q, message %q", q, cm, userMsg)
		}
		// The list changes (Allot rewrites the file): the script reads it
		// again after its refresh interval (1 s here).
		in2 := in
		in2.OverBudget = []string{"nlp"}
		writeAtomically(t, in.OverBudgetFile, slurmpolicy.Render(in2).OverBudgetList)
		time.Sleep(1100 * time.Millisecond) // the script's refresh interval, in real time
		out, err = c.ExecAs(userA, "sbatch", "--parsable", "-A", "nlp", "-t", "5", "--wrap", "sleep 60")
		if err != nil {
			t.Fatal(err)
		}
		id6 := lastID(t, out)
		out, err = c.ExecAs(userB, "sbatch", "--parsable", "-A", "vision", "-t", "5", "--wrap", "sleep 60")
		if err != nil {
			t.Fatal(err)
		}
		id7 := lastID(t, out)
		if q6, q7 := jobField(t, c, id6, "%q"), jobField(t, c, id7, "%q"); q6 != slurmpolicy.QOSPreemptible || q7 != "allot-t3" {
			t.Errorf("after the list changed to nlp: nlp's job in %q, vision's in %q", q6, q7)
		}
		writeAtomically(t, in.OverBudgetFile, r.OverBudgetList)
		ids := []int64{id, id2, id3, id4, id5, id6, id7, id8}
		for _, j := range ids {
			c.Run(t, "scancel", strconv.FormatInt(j, 10))
		}
		for _, j := range ids {
			c.WaitJob(t, j)
		}
	})

	t.Run("tier 1 preempts preemptible work with requeue after the grace time", func(t *testing.T) {
		c.WaitIdle(t)
		dir := c.JobsDir
		// The preemptible job's work runs as a step (srun): Slurm 22.05
		// sends the SIGTERM that starts the grace time to a job's steps,
		// not to its batch shell. The step notes when it is told to stop
		// and keeps running until it is killed.
		script := filepath.Join(dir, "h3-preemptible.sh")
		body := fmt.Sprintf("#!/bin/bash\nsrun bash -c \"trap 'date +%%s.%%N >> %s/h3-term-\\$SLURM_JOB_ID; sleep 100' TERM; date +%%s >> %s/h3-start-\\$SLURM_JOB_ID; while true; do sleep 0.2; done\"\n", dir, dir)
		if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := c.ExecAs(userB, "sbatch", "--parsable", "-A", "vision", "--qos=allot-preemptible", "--gres=gpu:2", "--requeue",
			"-o", "/dev/null", "-t", "10", script)
		if err != nil {
			t.Fatal(err)
		}
		victim := lastID(t, out)
		c.WaitJob(t, victim, "RUNNING")
		waitFile(t, filepath.Join(dir, fmt.Sprintf("h3-start-%d", victim)))
		out, err = c.ExecAs(userA, "sbatch", "--parsable", "-A", "nlp", "--qos=allot-t1", "--gres=gpu:2", "-o", "/dev/null", "-t", "5",
			"--wrap", fmt.Sprintf("date +%%s.%%N > %s/h3-t1-$SLURM_JOB_ID", dir))
		if err != nil {
			t.Fatal(err)
		}
		urgent := lastID(t, out)
		c.WaitJob(t, urgent, "COMPLETED")
		// The preemptible job got SIGTERM when it was picked, and the
		// tier-1 job started once the grace time was over (without it,
		// Slurm would requeue at once and kill after KillWait, 5 s); a step
		// that ignores the SIGTERM is killed KillWait after the grace time.
		term := readTime(t, filepath.Join(dir, fmt.Sprintf("h3-term-%d", victim)))
		started := readTime(t, filepath.Join(dir, fmt.Sprintf("h3-t1-%d", urgent)))
		waited := started.Sub(term)
		t.Logf("tier-1 job started %v after the preemptible job's SIGTERM (grace time %v)", waited.Round(10*time.Millisecond), grace)
		if waited < grace-time.Second || waited > grace+killWait+15*time.Second {
			t.Errorf("tier-1 job started %v after the preemptible job's SIGTERM, want about the grace time %v\n%s", waited, grace, logLines(c, "preempt", "grace", "requeue"))
		}
		// The victim was requeued: a PREEMPTED run in accounting, and the job is back in its QOS.
		acct := c.Run(t, "sacct", "-n", "-P", "-X", "-D", "-j", strconv.FormatInt(victim, 10), "-o", "JobID,State,QOS")
		if !strings.Contains(acct, "PREEMPTED") {
			t.Errorf("sacct of the preemptible job has no PREEMPTED run:\n%s", acct)
		}
		show := c.Run(t, "scontrol", "show", "job", strconv.FormatInt(victim, 10))
		if !strings.Contains(show, "Restarts=1") || !strings.Contains(show, "QOS="+slurmpolicy.QOSPreemptible) {
			t.Errorf("the preemptible job was not requeued once in its QOS:\n%s", show)
		}
		c.Run(t, "scancel", strconv.FormatInt(victim, 10))
		c.WaitJob(t, victim, "CANCELLED")
	})
}

func lastID(t *testing.T, out string) int64 {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	idStr, _, _ := strings.Cut(strings.TrimSpace(lines[len(lines)-1]), ";")
	id, err := strconv.ParseInt(idStr, 10, 64)
	if err != nil {
		t.Fatalf("no job id in sbatch's output %q", out)
	}
	return id
}

func jobField(t *testing.T, c *slurmtest.Cluster, id int64, format string) string {
	t.Helper()
	return strings.TrimSpace(c.Run(t, "squeue", "-h", "-j", strconv.FormatInt(id, 10), "-o", format))
}

// waitFile waits up to 30 s for a job to write path.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // stopwatch
	for {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return
		}
		// a deadline, not product time
		if time.Now().After(deadline) {
			t.Fatalf("%s not written after 30 s", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// writeAtomically replaces path with content (a rename, as Allot writes
// the list: the script never reads half a file).
func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// readTime reads the first "seconds.nanoseconds" a job wrote to path
// (the jobs' own clock: real time, as Slurm's grace time is).
func readTime(t *testing.T, path string) time.Time {
	t.Helper()
	waitFile(t, path)
	b, _ := os.ReadFile(path)
	f, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		t.Fatalf("%s: %q", path, b)
	}
	return time.Unix(0, int64(f*1e9))
}

// logLines are slurmctld's log lines that mention any of words.
func logLines(c *slurmtest.Cluster, words ...string) string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, "log", "slurmctld.log"))
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(strings.ToLower(l), w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
