package slurm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/slurmtest"
)

// Live tests run against a private real Slurm 22.05 cluster (slurmtest).

const liveUser = "allot-slurm-h2" // throw-away POSIX account (slurmtest.EnsureUser)

func liveCluster(t *testing.T) (*slurmtest.Cluster, *Client) {
	t.Helper()
	if ok, why := slurmtest.Available(); !ok {
		t.Skip("no Slurm here: " + why)
	}
	slurmtest.EnsureUser(t, liveUser)
	c := slurmtest.Start(t, slurmtest.Options{
		Nodes: 2, GPUsPerNode: 4, GPUType: "h100",
		Accounts: []string{"nlp", "vision"}, Users: []string{liveUser}, Enforce: "associations,limits",
		// Allot needs the job comment in accounting (allot:job=<id>) and the
		// typed GPU TRES for the GPU type of a run.
		ConfExtra: "AccountingStoreFlags=job_comment\nAccountingStorageTRES=gres/gpu,gres/gpu:h100\n",
	})
	cl, err := New(Config{URL: c.RestURL, JWTKeyFile: c.JWTKeyFile, TokenUser: c.SlurmUser, SlurmConf: c.SlurmConf, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c, cl
}

// waitJob polls Jobs until ok(job) (deadline on the wall clock: protocol time).
func waitJob(t *testing.T, cl *Client, id int64, what string, ok func(Job) bool) Job {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a deadline, not product time
	var last Job
	// a deadline, not product time
	for time.Now().Before(deadline) {
		jobs, err := cl.Jobs(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			if j.ID == id {
				last = j
				if ok(j) {
					return j
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("job %d never %s; last %+v", id, what, last)
	return Job{}
}

func TestLiveSubmitRunAccountCancel(t *testing.T) {
	t.Parallel() // each test has its own cluster
	c, cl := liveCluster(t)
	ctx := context.Background()
	info, err := cl.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Version != "v0.0.38" || !strings.HasPrefix(info.Release, "22.05") {
		t.Errorf("Ping = %+v", info)
	}
	from := time.Now().Add(-time.Minute) // accounting window: Slurm's real clock

	// Submit as the engineer through the authenticating proxy.
	id, msg, err := cl.Submit(ctx, liveUser, JobSubmit{Name: "live-run", Account: "nlp", Partition: c.Partition,
		Comment: "allot:job=501", Workdir: c.JobsDir, Script: "#!/bin/sh\nsleep 60\n",
		GPUs: 2, GRESType: "h100", TimeLimit: 10 * time.Minute, Requeue: true})
	if err != nil {
		t.Fatal(err)
	}
	if msg != "" {
		t.Errorf("user message %q", msg)
	}
	j := waitJob(t, cl, id, "running", func(j Job) bool { return j.State == "RUNNING" })
	if j.User != liveUser || j.Account != "nlp" || j.GPUs != 2 || j.GRESType != "h100" || len(j.Nodes) != 1 ||
		len(j.GPUIndices[j.Nodes[0]]) != 2 || j.Comment != "allot:job=501" || j.TimeLimit != 10*time.Minute {
		t.Errorf("running job = %+v", j)
	}
	// The whole cluster for a second job: pending on Resources (or Priority)
	// with Slurm's expected start once backfill has looked at it.
	id2, _, err := cl.Submit(ctx, liveUser, JobSubmit{Name: "live-wide", Account: "nlp", Workdir: c.JobsDir,
		Script: "#!/bin/sh\nsleep 1\n", Nodes: 2, GPUsPerNode: 4, TimeLimit: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	j2 := waitJob(t, cl, id2, "estimated", func(j Job) bool { return j.State == "PENDING" && !j.Start.IsZero() && j.Reason != "" })
	if j2.GPUs != 8 || (j2.Reason != "Resources" && j2.Reason != "Priority") || j2.Start.Before(j.Start.Add(9*time.Minute)) {
		t.Errorf("pending job = %+v", j2)
	}
	t.Logf("pending job %d: %s, expected start %s (the running job's end)", id2, ExplainReason(j2.Reason, j2), j2.Start.Format(time.RFC3339))

	// The CLI fallback sees the same.
	cj, err := cl.JobsCLI(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := jobByID(t, cj, id); got.State != "RUNNING" || got.User != liveUser || got.GPUs != 2 || got.GRESType != "h100" ||
		!reflect.DeepEqual(got.GPUIndices, j.GPUIndices) || !got.Start.Equal(j.Start) || got.Comment != j.Comment {
		t.Errorf("squeue --json: %+v\n REST: %+v", got, j)
	}

	// Errors Slurm gives, surfaced.
	if _, _, err := cl.Submit(ctx, liveUser, JobSubmit{Account: "vision-not", Workdir: c.JobsDir, Script: "#!/bin/sh\n"}); !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "Invalid account") {
		t.Errorf("bad account: %v", err)
	}
	if err := cl.Cancel(ctx, liveUser, 999999); !errors.Is(err, ErrNotFound) {
		t.Errorf("cancel unknown job: %v", err)
	}

	// Move the queued job (over-budget demotion path), then cancel both as the user.
	cm := "allot:job=502 allot:demoted-over-budget"
	if err := cl.UpdateJob(ctx, id2, JobUpdate{Comment: &cm}); err != nil {
		t.Fatal(err)
	}
	j2 = waitJob(t, cl, id2, "updated", func(j Job) bool { return j.Comment == cm })
	if w := ExplainReason(j2.Reason, j2); !strings.HasPrefix(w, "over budget: runs as preemptible") {
		t.Errorf("words %q", w)
	}
	for _, x := range []int64{id, id2} {
		if err := cl.Cancel(ctx, liveUser, x); err != nil {
			t.Fatal(err)
		}
	}
	waitJob(t, cl, id, "cancelled", func(j Job) bool { return j.State == "CANCELLED" })
	if err := cl.Cancel(ctx, liveUser, id); err != nil {
		t.Errorf("cancel of an ended job: %v", err)
	}

	// Accounting shows the run with its GPUs, user and comment.
	var run *Run
	deadline := time.Now().Add(20 * time.Second) // a deadline, not product time
	// a deadline, not product time
	for run == nil && time.Now().Before(deadline) {
		runs, err := cl.Accounting(ctx, from, time.Now().Add(time.Minute)) // Slurm's own (real) clock: its accounting window
		if err != nil {
			t.Fatal(err)
		}
		for i := range runs {
			if runs[i].JobID == id && runs[i].State == "CANCELLED" && !runs[i].End.IsZero() {
				run = &runs[i]
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	if run == nil {
		t.Fatal("run not in accounting")
	}
	if run.User != liveUser || run.Account != "nlp" || run.GPUs != 2 || run.GRESType != "h100" || run.Comment != "allot:job=501" ||
		!run.Start.Equal(j.Start) || run.End.Before(run.Start) || !slices.Equal(run.Nodes, j.Nodes) {
		t.Errorf("run = %+v", *run)
	}
	// sacct (the CLI fallback) agrees.
	sr, err := cl.Sacct(ctx, from, time.Now().Add(time.Minute)) // Slurm's own (real) clock: its accounting window
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range sr {
		if r.Key() == run.Key() {
			found = true
			if r.GPUs != 2 || r.GRESType != "h100" || r.State != "CANCELLED" || !r.Start.Equal(run.Start) || !r.End.Equal(run.End) || r.Comment != run.Comment {
				t.Errorf("sacct %+v\n REST %+v", r, *run)
			}
		}
	}
	if !found {
		t.Errorf("sacct lacks %s: %+v", run.Key(), sr)
	}
}

func TestLiveDrainResume(t *testing.T) {
	t.Parallel() // each test has its own cluster
	c, cl := liveCluster(t)
	ctx := context.Background()
	node := c.Nodes[1]
	if err := cl.Drain(ctx, node, "allot: XID 79 on GPU 3"); err != nil {
		t.Fatal(err)
	}
	nodeOf := func() Node {
		nodes, err := cl.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			if n.Name == node {
				return n
			}
		}
		t.Fatalf("no node %s", node)
		return Node{}
	}
	if n := nodeOf(); !n.Drain || n.Reason != "allot: XID 79 on GPU 3" || n.GPUs != 4 || n.GRESType != "h100" {
		t.Errorf("drained node = %+v", n)
	}
	if err := cl.Resume(ctx, node); err != nil {
		t.Fatal(err)
	}
	if n := nodeOf(); n.Drain || n.State != "IDLE" {
		t.Errorf("resumed node = %+v", n)
	}
	if err := cl.Resume(ctx, node); err != nil {
		t.Errorf("resume of a node in service: %v", err)
	}
	if err := cl.Drain(ctx, "nosuchnode", "x"); !errors.Is(err, ErrNotFound) {
		t.Errorf("drain unknown node: %v", err)
	}
}

func TestLiveBadConfig(t *testing.T) {
	t.Parallel() // each test has its own cluster
	c, cl := liveCluster(t)
	ctx := context.Background()
	if _, err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// A key slurmctld does not know.
	wrong := filepath.Join(t.TempDir(), "wrong.key")
	os.WriteFile(wrong, []byte("this-is-not-the-cluster-key-0123"), 0o600)
	bad, _ := New(Config{URL: c.RestURL, JWTKeyFile: wrong})
	_, err := bad.Ping(ctx)
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "rejected the token") {
		t.Errorf("wrong key: %v", err)
	}
	t.Logf("wrong token: %v", err)
	if _, err := bad.Jobs(ctx); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("wrong key, Jobs: %v", err)
	}
	// Slurm's own (real) clock: its accounting window
	if _, err := bad.Accounting(ctx, time.Now().Add(-time.Hour), time.Now()); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("wrong key, Accounting: %v", err)
	}
	// Nothing listening there.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + l.Addr().String()
	l.Close()
	gone, _ := New(Config{URL: dead, JWTKeyFile: c.JWTKeyFile})
	_, err = gone.Ping(ctx)
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "slurmrestd at "+dead+" is not reachable") {
		t.Errorf("wrong URL: %v", err)
	}
	t.Logf("wrong URL: %v", err)
	// slurmctld down behind a running slurmrestd.
	c.StopCtld(t)
	_, err = cl.Ping(ctx)
	if !errors.Is(err, ErrUnreachable) {
		t.Errorf("slurmctld down: %v", err)
	}
	t.Logf("slurmctld down: %v", err)
	c.StartCtld(t)
	// slurmdbd down.
	c.StopDBD(t)
	_, err = cl.Accounting(ctx, time.Now().Add(-time.Hour), time.Now()) // Slurm's own (real) clock: its accounting window
	if !errors.Is(err, ErrUnreachable) {
		t.Errorf("slurmdbd down: %v", err)
	}
	t.Logf("slurmdbd down: %v", err)
	c.StartDBD(t)
}

// TestLiveFigures measures REST submit latency (200 sequential submits as a
// user, next to plain sbatch) and the accounting import rate. It logs the
// figures; no timing is asserted.
func TestLiveFigures(t *testing.T) {
	if os.Getenv("ALLOT_SLURM_FIGURES") == "" {
		t.Skip("takes ~35 s; run with ALLOT_SLURM_FIGURES=1")
	}
	c, cl := liveCluster(t)
	ctx := context.Background()
	from := time.Now().Add(-time.Minute) // Slurm's own (real) clock: its accounting window
	const n = 200
	var lat []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now() // stopwatch
		_, _, err := cl.Submit(ctx, liveUser, JobSubmit{Name: fmt.Sprintf("fig-%d", i), Account: "nlp", Workdir: c.JobsDir,
			Comment: fmt.Sprintf("allot:job=%d", 1000+i), Script: "#!/bin/sh\ntrue\n", GPUs: 1, TimeLimit: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	var sb []time.Duration
	for i := 0; i < 20; i++ {
		t0 := time.Now() // a stopwatch
		c.Sbatch(t, liveUser, "-A", "nlp", "--gres=gpu:1", "-t", "1", "-D", c.JobsDir, "-o", "/dev/null", "--wrap", "true")
		sb = append(sb, time.Since(t0))
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		s := slices.Clone(d)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[int(float64(len(s)-1)*p)]
	}
	t.Logf("REST submit as user (v0.0.38, %d sequential): p50 %v, p99 %v, max %v", n, pct(lat, .5), pct(lat, .99), pct(lat, 1))
	t.Logf("plain sbatch (%d sequential, fork+exec): p50 %v, p99 %v", len(sb), pct(sb, .5), pct(sb, .99))

	// Let them all finish, then import.
	deadline := time.Now().Add(90 * time.Second) // a deadline, not product time
	// a deadline, not product time
	for time.Now().Before(deadline) {
		jobs, err := cl.Jobs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		busy := 0
		for _, j := range jobs {
			if !finished(j.State) {
				busy++
			}
		}
		if busy == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	to := time.Now().Add(time.Minute) // Slurm's own (real) clock: its accounting window
	var runs []Run
	var best time.Duration
	for i := 0; i < 3; i++ {
		t0 := time.Now() // a stopwatch
		r, err := cl.Accounting(ctx, from, to)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); i == 0 || d < best {
			best = d
		}
		runs = r
	}
	if len(runs) < n {
		t.Fatalf("%d runs in accounting, want ≥ %d", len(runs), n)
	}
	// Decode-only rate: the same body parsed again.
	ad, _ := cl.adapter(ctx)
	q := map[string][]string{"start_time": {"uts" + itoa(from.Unix())}, "end_time": {"uts" + itoa(to.Unix())}}
	body, err := cl.call(ctx, "read accounting", "GET", "/slurmdb/v0.0.38/jobs", q, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now() // a stopwatch
	const reps = 20
	for i := 0; i < reps; i++ {
		if _, err := ad.decodeRuns(body); err != nil {
			t.Fatal(err)
		}
	}
	dec := time.Since(t0) / reps
	t.Logf("accounting import: %d runs in %v via REST (%.0f runs/s end to end, %d KiB); decode alone %v (%.0f runs/s)",
		len(runs), best, float64(len(runs))/best.Seconds(), len(body)/1024, dec, float64(len(runs))/dec.Seconds())
}

// TestLivePreemptRequeue: a preemptible run requeued by a higher partition's
// job shows in Accounting as a PREEMPTED run plus the requeued record, with
// distinct keys, and /jobs shows the requeue (BeginTime, restarts).
func TestLivePreemptRequeue(t *testing.T) {
	t.Parallel() // each test has its own cluster
	if ok, why := slurmtest.Available(); !ok {
		t.Skip("no Slurm here: " + why)
	}
	slurmtest.EnsureUser(t, liveUser)
	c := slurmtest.Start(t, slurmtest.Options{
		Nodes: 1, GPUsPerNode: 4, GPUType: "h100", Accounts: []string{"nlp", "vision"}, Users: []string{liveUser},
		Enforce: "associations,limits",
		ConfExtra: "AccountingStoreFlags=job_comment\nAccountingStorageTRES=gres/gpu,gres/gpu:h100\n" +
			"PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\nJobRequeue=1\n" +
			"PartitionName=gpu Nodes={{nodes}} Default=YES MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF\n" +
			"PartitionName=preemptible Nodes={{nodes}} MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE\n",
	})
	cl, err := New(Config{URL: c.RestURL, JWTKeyFile: c.JWTKeyFile, Version: "v0.0.38", SlurmConf: c.SlurmConf})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	from := time.Now().Add(-time.Minute) // Slurm's own (real) clock: its accounting window
	victim, _, err := cl.Submit(ctx, liveUser, JobSubmit{Name: "victim", Account: "vision", Partition: "preemptible",
		Comment: "allot:job=601", Workdir: c.JobsDir, Script: "#!/bin/sh\nsleep 300\n", GPUsPerNode: 4, GRESType: "h100",
		TimeLimit: 10 * time.Minute, Requeue: true})
	if err != nil {
		t.Fatal(err)
	}
	waitJob(t, cl, victim, "running", func(j Job) bool { return j.State == "RUNNING" })
	// slurmdbd must have the start before the preemption: wait until its
	// accounting shows it (a fixed 3 s was not always enough on a loaded
	// machine, and the preempted run then had no start).
	for recorded := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) { // a deadline, not product time
		runs, err := cl.Accounting(ctx, from, time.Now().Add(time.Minute)) // Slurm's own (real) clock: its accounting window
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(runs, func(r Run) bool { return r.JobID == victim && !r.Start.IsZero() }) {
			break
		}
		if time.Now().After(recorded) { // the deadline's clock
			t.Fatal("slurmdbd did not record the victim's start within a minute")
		}
	}
	prod, _, err := cl.Submit(ctx, liveUser, JobSubmit{Name: "prod", Account: "nlp", Partition: "gpu",
		Comment: "allot:job=602", Workdir: c.JobsDir, Script: "#!/bin/sh\nsleep 2\n", GPUsPerNode: 4, TimeLimit: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	waitJob(t, cl, prod, "running", func(j Job) bool { return j.State == "RUNNING" || finished(j.State) })
	v := waitJob(t, cl, victim, "requeued", func(j Job) bool { return j.State == "PENDING" && j.Restarts == 1 })
	if v.Reason != "BeginTime" || ExplainReason(v.Reason, v) != "requeued after preemption: eligible again shortly" {
		t.Errorf("requeued job = %+v", v)
	}
	var recs []Run
	deadline := time.Now().Add(15 * time.Second) // a deadline, not product time
	// a deadline, not product time
	for time.Now().Before(deadline) {
		runs, err := cl.Accounting(ctx, from, time.Now().Add(time.Minute)) // Slurm's own (real) clock: its accounting window
		if err != nil {
			t.Fatal(err)
		}
		recs = recs[:0]
		for _, r := range runs {
			if r.JobID == victim {
				recs = append(recs, r)
			}
		}
		if len(recs) == 2 || (len(recs) == 1 && recs[0].State == "PREEMPTED" && time.Until(deadline) < 11*time.Second) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if len(recs) == 0 {
		t.Fatal("victim not in accounting")
	}
	a := recs[0]
	if a.State != "PREEMPTED" || a.GPUs != 4 || a.GRESType != "h100" || a.Start.IsZero() || a.End.Before(a.Start) || a.Comment != "allot:job=601" {
		t.Errorf("preempted run = %+v", a)
	}
	// The requeued record may only be written when it is eligible or
	// starts (BeginTime is ~2 minutes after the requeue); when present it is
	// a separate record with its own key.
	if len(recs) == 2 {
		b := recs[1]
		if b.State != "PENDING" || !b.Start.IsZero() || b.Key() == a.Key() || b.Submit.Before(a.End) {
			t.Errorf("requeued record = %+v (first %+v)", b, a)
		}
		t.Logf("preempted run %s: %s → %s; requeued record %s", a.Key(), a.Start.Format(time.TimeOnly), a.End.Format(time.TimeOnly), b.Key())
	} else {
		t.Logf("preempted run %s: %s → %s; requeued record not yet in slurmdbd", a.Key(), a.Start.Format(time.TimeOnly), a.End.Format(time.TimeOnly))
	}
	for _, id := range []int64{victim, prod} {
		cl.Cancel(ctx, "", id)
	}
}

// TestLiveTokenFileAndProxyRules: a static token from `scontrol token`
// works; proxied users are held to Slurm's rules.
func TestLiveTokenFileAndProxyRules(t *testing.T) {
	t.Parallel() // each test has its own cluster
	c, cl := liveCluster(t)
	ctx := context.Background()
	tf := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tf, []byte(c.Token(t, c.SlurmUser, 10*time.Minute)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := New(Config{URL: c.RestURL, TokenFile: tf})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Ping(ctx); err != nil {
		t.Fatalf("static token: %v", err)
	}
	// nobody is a POSIX account without any Slurm association.
	_, _, err = st.Submit(ctx, "nobody", JobSubmit{Account: "vision", Workdir: c.JobsDir, Script: "#!/bin/sh\n"})
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "(2045)") {
		t.Errorf("submit outside the user's accounts: %v", err)
	}
	// A job of root may not be cancelled by liveUser.
	id, _, err := cl.Submit(ctx, "root", JobSubmit{Account: "vision", Workdir: c.JobsDir, Script: "#!/bin/sh\nsleep 30\n", Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Cancel(ctx, liveUser, id); !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "Access/permission denied") {
		t.Errorf("cancel of another user's job: %v", err)
	}
	if err := cl.Cancel(ctx, "", id); err != nil {
		t.Error(err)
	}
}
