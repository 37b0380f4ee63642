package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// The Slurm-like query and control commands (jobs, cancel, show, share,
// prio, nodes) against a real server with jobs of two teams.

const ravi = "ravi" // a member of team recs (the demo personas are all nlp, finance or admin)

// slurmEnv boots a server, gives ravi a token, lifts the teams' budgets
// (no job is demoted to preemptible, whatever the instant) and submits
// the test's jobs; it returns their ids by name.
func slurmEnv(t *testing.T) (*env, map[string]int64) {
	stdinIsTTY = func() bool { return false }
	e := boot(t)
	ctx := context.Background()
	u, err := e.m.Store.UserByEmail(ctx, "ravi@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if e.tokens[ravi], _, err = e.m.Store.CreateAPIToken(ctx, u.ID, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Pool.Exec(ctx, `UPDATE teams SET monthly_budget_gpu_hours = 1000000`); err != nil {
		t.Fatal(err)
	}
	ids := map[string]int64{}
	for _, j := range []struct{ persona, body string }{
		{demo.Engineer, `{"name":"e3-noah-a","team":"nlp","tier":3,"gpus":8,"gpu_type":"A100-80GB","time_limit":"4h","command":["python","train.py"]}`},
		{demo.Engineer, `{"name":"e3-noah-wide-job","team":"nlp","tier":4,"gpus":16,"gpus_per_node":8,"time_limit_s":5400,"command":["true"]}`},
		{demo.Lead, `{"name":"e3-nadia","team":"nlp","tier":3,"gpus":1,"gpu_type":"T4","time_limit":"2d","command":["true"]}`},
		{ravi, `{"name":"e3-ravi","team":"recs","tier":3,"gpus":4,"time_limit":"30m","command":["true"]}`},
	} {
		code, _, b := e.api("POST", "/api/v1/jobs", j.persona, j.body)
		var out web.JobJSON
		if err := json.Unmarshal(b, &out); code != 201 || err != nil {
			t.Fatalf("submit %s: %d %s", j.body, code, b)
		}
		ids[out.Name] = out.ID
	}
	return e, ids
}

func TestSlurmJobsList(t *testing.T) {
	e, ids := slurmEnv(t)
	a, w, nadia, rv := ids["e3-noah-a"], ids["e3-noah-wide-job"], ids["e3-nadia"], ids["e3-ravi"]
	cli := func(persona string, args ...string) string {
		t.Helper()
		rc, out, errOut := e.cli(persona, args...)
		if rc != 0 {
			t.Fatalf("allot %s as %s: exit %d\n%s%s", strings.Join(args, " "), persona, rc, out, errOut)
		}
		return out
	}

	// -o with squeue letters: widths, justification, truncation, literal text.
	got := cli(demo.Engineer, "jobs", "--me", "-n", "e3-", "-o", "%.8i %-12j %a %t %.5D %b %l|%%")
	row := "%8s %-12s %s %s %5s %s %s|%%\n"
	want := fmt.Sprintf(row, "JOBID", "NAME", "TEAM", "ST", "NODES", "GRES", "TIME_LIMIT") +
		fmt.Sprintf(row, fmt.Sprint(w), "e3-noah-wide", "nlp", "PD", "2", "gpu:16", "1:30:00") +
		fmt.Sprintf(row, fmt.Sprint(a), "e3-noah-a", "nlp", "PD", "1", "gpu:A100-80GB:8", "4:00:00")
	if got != want {
		t.Errorf("allot jobs -o:\n%s\nwant:\n%s", got, want)
	}
	// A width cuts the header too, as squeue does.
	if got := cli(demo.Engineer, "jobs", "--me", "-n", "e3-noah-a", "-o", "%.3D|%-3j"); got != "NOD|NAM\n  1|e3-\n" {
		t.Errorf("-o %%.3D|%%-3j: %q", got)
	}
	// Names, --parsable, --noheader.
	got = cli(demo.Lead, "jobs", "-n", "e3-", "--format", "id,name,account,user,state,time_limit", "--parsable")
	want = fmt.Sprintf("JOBID|NAME|TEAM|USER|STATE|TIME_LIMIT\n"+
		"%d|e3-nadia|nlp|nadia@example.com|PENDING|2-00:00:00\n"+
		"%d|e3-noah-wide-job|nlp|noah@example.com|PENDING|1:30:00\n"+
		"%d|e3-noah-a|nlp|noah@example.com|PENDING|4:00:00\n", nadia, w, a)
	if got != want {
		t.Errorf("allot jobs --parsable:\n%s\nwant:\n%s", got, want)
	}
	got = cli(demo.Lead, "jobs", "-n", "e3-", "-O", "jobid,st", "--parsable", "--noheader", "--user", "noah@example.com")
	if want := fmt.Sprintf("%d|PD\n%d|PD\n", w, a); got != want {
		t.Errorf("--user noah --noheader:\n%s\nwant:\n%s", got, want)
	}
	// --team: the engineer sees only nlp; the admin sees recs.
	if got := cli(demo.Engineer, "jobs", "--team", "recs", "-n", "e3-", "-o", "%i", "--noheader"); got != "" {
		t.Errorf("engineer --team recs: %q", got)
	}
	if got, want := cli(demo.Admin, "jobs", "-A", "recs", "-n", "e3-", "-o", "%i %u", "--noheader"), fmt.Sprintf("%d ravi@example.com\n", rv); got != want {
		t.Errorf("admin -A recs: %q, want %q", got, want)
	}
	// The default columns.
	got = cli(demo.Engineer, "jobs", "--me", "-n", "e3-noah-a")
	if lines := strings.Split(strings.TrimSpace(got), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "JOBID") ||
		!strings.Contains(lines[1], "8×A100-80GB") || !strings.Contains(lines[1], "4:00:00") || !strings.Contains(lines[1], "PENDING") {
		t.Errorf("default columns:\n%s", got)
	}

	// States by Slurm's names: cancel one, then filter.
	if rc, out, errOut := e.cli(demo.Engineer, "cancel", fmt.Sprint(w)); rc != 0 || out != fmt.Sprintf("job %d is cancelled\n", w) {
		t.Fatalf("cancel: %d %q %q", rc, out, errOut)
	}
	if got, want := cli(demo.Engineer, "jobs", "-n", "e3-noah", "-t", "CA", "-o", "%i %T", "--noheader"), fmt.Sprintf("%d CANCELLED\n", w); got != want {
		t.Errorf("-t CA: %q, want %q", got, want)
	}
	if got, want := cli(demo.Engineer, "jobs", "-n", "e3-noah", "--state", "pending,CA", "-o", "%i", "--noheader"), fmt.Sprintf("%d\n%d\n", w, a); got != want {
		t.Errorf("--state pending,CA: %q, want %q", got, want)
	}
	if got := cli(demo.Engineer, "jobs", "-n", "e3-", "--state", "R,CD", "-o", "%i", "--noheader"); got != "" {
		t.Errorf("--state R,CD: %q", got)
	}
	if got := cli(demo.Engineer, "jobs", "-n", "e3-", "--state", "R", "--json"); got != "[]\n" {
		t.Errorf("--json of no job: %q", got)
	}
	if got, want := cli(demo.Engineer, "jobs", "-n", "e3-noah", "--state", "all", "--json"), fmt.Sprint(a); !strings.Contains(got, `"id": `+want) {
		t.Errorf("--json: %s", got)
	}

	// Bad input: a clear message and exit 2, before any request.
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"jobs", "-o", "%i %Y"}, "unknown format letter %Y"},
		{[]string{"jobs", "-o", "%.8"}, "ends in the middle of a field"},
		{[]string{"jobs", "--format", "id,colour"}, `unknown field "colour"`},
		{[]string{"jobs", "--format", "name:x"}, `bad width "x"`},
		{[]string{"jobs", "--state", "RUNNING,ZZ"}, `unknown state "zz"`},
		{[]string{"jobs", "--state", "PR"}, "no Allot job is ever PR"},
		{[]string{"jobs", "--team", "a,b"}, "--team takes one team"},
		{[]string{"jobs", "--limit", "-1"}, "--limit"},
		{[]string{"cancel", "x1"}, `"x1" is not a job id`},
		{[]string{"cancel", "1", "--team", "nlp"}, "not both"},
		{[]string{"cancel", "--team", "nlp", "--state", "CD"}, "only pending and running jobs can be cancelled"},
		{[]string{"show", "abc"}, `"abc" is not a job id`},
		{[]string{"share", "--team", "nope"}, `no team "nope"`},
		{[]string{"prio", "--limit", "0"}, "--limit"},
		{[]string{"nodes", "--state", "sleepy"}, `unknown node state "sleepy"`},
		{[]string{"completion", "tcsh"}, `no completion for shell "tcsh"`},
	} {
		rc, out, errOut := e.cli(demo.Engineer, c.args...)
		if c.args[0] == "completion" {
			var o, eb bytes.Buffer
			rc = run(c.args, &o, &eb)
			out, errOut = o.String(), eb.String()
		}
		if rc != 2 || !strings.Contains(errOut, c.msg) || out != "" {
			t.Errorf("allot %s: exit %d, stdout %q, stderr %q; want exit 2 and %q", strings.Join(c.args, " "), rc, out, errOut, c.msg)
		}
	}
	// The API refuses a bad state or user in the list too.
	if code, _, b := e.api("GET", "/api/v1/jobs?state=pending,bogus", demo.Engineer, ""); code != 422 || !strings.Contains(string(b), `unknown state \"bogus\"`) {
		t.Errorf("API bad state: %d %s", code, b)
	}
	if code, _, b := e.api("GET", "/api/v1/jobs?user=noah", demo.Engineer, ""); code != 422 || !strings.Contains(string(b), "must be a person's email") {
		t.Errorf("API bad user: %d %s", code, b)
	}
}

func TestSlurmCancel(t *testing.T) {
	e, ids := slurmEnv(t)
	a, w, nadia, rv := ids["e3-noah-a"], ids["e3-noah-wide-job"], ids["e3-nadia"], ids["e3-ravi"]
	state := func(id int64) string {
		t.Helper()
		var s string
		if err := e.m.Pool.QueryRow(context.Background(), `SELECT state FROM jobs WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	// Several ids: the engineer's own is cancelled; the lead's job and
	// another team's are refused, each said, and the exit status is 1.
	rc, out, errOut := e.cli(demo.Engineer, "cancel", fmt.Sprint(a), fmt.Sprint(nadia), fmt.Sprint(rv))
	if rc != 1 || out != fmt.Sprintf("job %d is cancelled\n", a) ||
		!strings.Contains(errOut, fmt.Sprintf("job %d: only the submitter, a lead of team nlp or an admin can cancel job %d (not cancelled)", nadia, nadia)) ||
		!strings.Contains(errOut, fmt.Sprintf("job %d: no job %d (not cancelled)", rv, rv)) || !strings.Contains(errOut, "2 of 3 jobs not cancelled") {
		t.Errorf("multi-cancel: exit %d\n%s%s", rc, out, errOut)
	}
	if state(a) != "cancelled" || state(nadia) != "pending" || state(rv) != "pending" {
		t.Errorf("states after multi-cancel: %s %s %s", state(a), state(nadia), state(rv))
	}

	// A filter without --yes and without a terminal: refused, nothing cancelled.
	rc, out, errOut = e.cli(demo.Lead, "cancel", "--team", "nlp", "--name", "e3-", "--state", "PD")
	if rc != 1 || out != "" || !strings.Contains(errOut, "the filters select 2 jobs; not a terminal to confirm on: add --yes") {
		t.Errorf("filtered cancel without --yes: exit %d %q %q", rc, out, errOut)
	}
	if state(w) != "pending" || state(nadia) != "pending" {
		t.Error("a refused filtered cancel cancelled something")
	}
	// --me narrows to the caller's jobs; --yes cancels them.
	rc, out, errOut = e.cli(demo.Engineer, "cancel", "--me", "--name", "e3-", "-y")
	if rc != 0 || out != fmt.Sprintf("job %d is cancelled\n", w) {
		t.Errorf("cancel --me --yes: exit %d %q %q", rc, out, errOut)
	}
	// The lead cancels the team's rest; the other team's job stays.
	rc, out, errOut = e.cli(demo.Lead, "cancel", "--team", "nlp", "--name", "e3-", "--yes")
	if rc != 0 || out != fmt.Sprintf("job %d is cancelled\n", nadia) {
		t.Errorf("lead cancel --team --yes: exit %d %q %q", rc, out, errOut)
	}
	if state(rv) != "pending" {
		t.Error("recs' job was cancelled")
	}
	rc, out, _ = e.cli(demo.Lead, "cancel", "--team", "nlp", "--name", "e3-", "--yes")
	if rc != 0 || out != "no job matches: nothing cancelled\n" {
		t.Errorf("nothing left: %d %q", rc, out)
	}
}

func TestConfirmCancel(t *testing.T) {
	jobs := []web.JobJSON{{ID: 7, Name: "a", Team: "nlp", User: "noah@example.com", State: "pending"}}
	for _, c := range []struct {
		in   string
		tty  bool
		yes  bool
		want bool
	}{
		{"y\n", true, false, true}, {"YES\n", true, false, true}, {"n\n", true, false, false}, {"\n", true, false, false},
		{"", true, false, false}, {"y\n", false, false, false}, {"", false, true, true},
	} {
		var out, errb bytes.Buffer
		if got := confirmCancel(strings.NewReader(c.in), c.tty, &out, &errb, jobs, c.yes); got != c.want {
			t.Errorf("answer %q tty=%v yes=%v: %v, want %v\n%s%s", c.in, c.tty, c.yes, got, c.want, out.String(), errb.String())
		}
		if c.tty && !c.yes && !strings.Contains(out.String(), "7  a  nlp  noah@example.com  pending") {
			t.Errorf("the prompt does not list the job:\n%s", out.String())
		}
	}
}

func TestSlurmShowSharePrio(t *testing.T) {
	e, ids := slurmEnv(t)
	a, rv := ids["e3-noah-a"], ids["e3-ravi"]
	// Once a cycle has ranked it, the job's priority is the response order's
	// product; the checks below read every pending job of the team, so
	// wait until a cycle has ranked them all (a cycle can run between two
	// of the environment's submissions and rank only the first).
	deadline := time.Now().Add(20 * time.Second) // a deadline: submissions ask for a cycle at once
	for {
		var d web.JobDetailJSON
		e.getJSON(fmt.Sprintf("/api/v1/jobs/%d", a), demo.Engineer, &d)
		var p web.PrioritiesJSON
		e.getJSON("/api/v1/priorities", demo.Engineer, &p)
		all := len(p.Jobs) > 0
		for _, j := range p.Jobs {
			all = all && j.Factors.Order == "response"
		}
		if d.Queue != nil && d.Queue.Ranked && d.PriorityBreakdown.Order == "response" && all {
			break
		}
		if time.Now().After(deadline) { // deadline (real time)
			t.Fatalf("job %d (or another of its team's) was not ranked by a cycle under the response order: %+v; %+v", a, d.Queue, p.Jobs)
		}
		time.Sleep(100 * time.Millisecond)
	}

	rc, out, errOut := e.cli(demo.Engineer, "show", "job", fmt.Sprint(a))
	if rc != 0 {
		t.Fatalf("show: %d %s", rc, errOut)
	}
	for _, s := range []string{fmt.Sprintf("JobId=%d JobName=e3-noah-a\n", a), "   UserId=noah@example.com Account=nlp RunAsUser=",
		"JobState=PENDING AllotState=pending", "\n   Reason=", "TimeLimit=4:00:00 RunTime=0:00 TimeLeft=4:00:00",
		"GPUs=8 GPUType=A100-80GB GPUsPerNode=(null) TRES=gpu:A100-80GB:8", "\n   Command=python train.py\n", "QueuePosition=",
		"PriorityFactors=response-ratio:1×fair-share:", "StartTime=N/A", "MinCPUsNode=0 MinMemoryNode=0 Image=(null)"} {
		if !strings.Contains(out, s) {
			t.Errorf("show lacks %q:\n%s", s, out)
		}
	}
	rc, out, _ = e.cli(demo.Engineer, "show", "--json", fmt.Sprint(a))
	var d web.JobDetailJSON
	if err := json.Unmarshal([]byte(out), &d); rc != 0 || err != nil || d.ID != a || d.Queue == nil {
		t.Errorf("show --json: %d %v %s", rc, err, out)
	}
	if rc, _, errOut := e.cli(demo.Engineer, "show", fmt.Sprint(rv)); rc != 1 || !strings.Contains(errOut, fmt.Sprintf("no job %d", rv)) {
		t.Errorf("show another team's job: %d %q", rc, errOut)
	}

	// share: every team's standing; the budget of the engineer's team only.
	rc, out, errOut = e.cli(demo.Engineer, "share", "--parsable")
	if rc != 0 {
		t.Fatalf("share: %d %s", rc, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if lines[0] != "Account|RawShares|NormShares|RawUsage|EffectvUsage|FairShare|BudgetGPUh|UsedGPUh|Used%" || len(lines) != 4 {
		t.Fatalf("share:\n%s", out)
	}
	var fsh web.FairShareJSON
	e.getJSON("/api/v1/fairshare", demo.Engineer, &fsh)
	for _, l := range lines[1:] {
		f := strings.Split(l, "|")
		var row *web.FairShareRowJSON
		for i := range fsh.Teams {
			if fsh.Teams[i].Team == f[0] {
				row = &fsh.Teams[i]
			}
		}
		if row == nil || f[1] != fmt.Sprint(row.RawShares) || f[5] != fmt.Sprintf("%.6f", row.FairShare) {
			t.Errorf("share row %q does not match the API's %+v", l, row)
		}
		if (f[0] == "nlp") != (f[6] == "1000000") || (f[0] != "nlp") != (f[7] == "") {
			t.Errorf("share row %q: the budget columns are for the engineer's team only", l)
		}
	}
	if rc, out, _ := e.cli(demo.Finance, "share", "--team", "recs,fraud", "--noheader", "-P"); rc != 0 || strings.Count(out, "|1000000|") != 2 {
		t.Errorf("finance share --team recs,fraud: %d\n%s", rc, out)
	}

	// prio: the engineer's team's pending jobs in queue order, factors × weights.
	var p web.PrioritiesJSON
	e.getJSON("/api/v1/priorities", demo.Engineer, &p)
	if p.Weights.FairShare != 10000 || p.Weights.Size != 1000 || p.Weights.Age != 500 || len(p.Jobs) == 0 {
		t.Fatalf("priorities: %+v", p)
	}
	seen := map[int64]bool{}
	for i, j := range p.Jobs {
		seen[j.ID] = true
		if j.Team != "nlp" {
			t.Errorf("the engineer sees job %d of team %s", j.ID, j.Team)
		}
		// The response order (the default): priority = response ratio × fair-share multiplier.
		if prod := j.Factors.ResponseRatio * j.FairShareMultiplier; p.Order != "response" || j.Factors.Order != "response" ||
			j.Factors.ResponseRatio < 1 || math.Abs(prod-j.Priority) > 2e-3*max(1, prod) {
			t.Errorf("job %d (order %q/%q): priority %v ≠ response ratio %v × multiplier %v", j.ID, p.Order, j.Factors.Order, j.Priority,
				j.Factors.ResponseRatio, j.FairShareMultiplier)
		}
		if i > 0 {
			q := p.Jobs[i-1]
			if q.ClassOrder > j.ClassOrder || q.ClassOrder == j.ClassOrder && q.Priority < j.Priority {
				t.Errorf("out of order: %+v before %+v", q, j)
			}
		}
	}
	if !seen[a] || seen[rv] {
		t.Errorf("priorities: noah's job listed %v, ravi's %v", seen[a], seen[rv])
	}
	for q, msg := range map[string]string{"limit=0": "between 1 and 1000", "limit=x": "between 1 and 1000", "user=noah@example.com": "only user=me"} {
		if code, _, b := e.api("GET", "/api/v1/priorities?"+q, demo.Engineer, ""); code != 422 || !strings.Contains(string(b), msg) {
			t.Errorf("priorities?%s: %d %s", q, code, b)
		}
	}
	var all web.PrioritiesJSON
	e.getJSON("/api/v1/priorities?limit=1000", demo.Finance, &all)
	teams := map[string]bool{}
	for _, j := range all.Jobs {
		teams[j.Team] = true
	}
	if !teams["nlp"] || !teams["recs"] {
		t.Errorf("finance sees the pending jobs of %v", teams)
	}
	rc, out, _ = e.cli(demo.Engineer, "prio", "--me", "--parsable")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if rc != 0 || lines[0] != "JOBID|TEAM|USER|TIER|CLASS|PRIORITY|RESPONSE|FS_MULT|FAIRSHARE" || len(lines) < 3 || // the demo's queue has noah's jobs too
		!strings.Contains(out, fmt.Sprintf("\n%d|nlp|noah@example.com|3|", a)) || !strings.Contains(out, fmt.Sprintf("\n%d|nlp|noah@example.com|4|", ids["e3-noah-wide-job"])) {
		t.Fatalf("prio --me:\n%s", out)
	}
	for _, l := range lines[1:] {
		if f := strings.Split(l, "|"); f[1] != "nlp" || f[2] != "noah@example.com" {
			t.Errorf("prio --me row %q", l)
		}
	}
	if rc, out, _ := e.cli(demo.Engineer, "prio", "-w", "--parsable", "--noheader"); rc != 0 || out != "Weights||500|10000|1000\n" {
		t.Errorf("prio -w: %d %q", rc, out)
	}
	if rc, out, _ := e.cli(ravi, "prio", "--parsable", "--noheader", "-n"); rc != 0 || !strings.Contains(out, fmt.Sprintf("%d|recs|ravi@example.com|3|3|", rv)) || strings.Contains(out, "|nlp|") {
		t.Errorf("prio as ravi: %d\n%s", rc, out)
	}

	// The multifactor order, saved by an admin: the next cycle's
	// priorities are the sums of weights × factors, and prio shows them so.
	if code, _, b := e.api("PUT", "/api/v1/policy", demo.Admin, `{"queue_order": "multifactor"}`); code != 200 {
		t.Fatalf("setting the multifactor order: %d %s", code, b)
	}
	deadline = time.Now().Add(20 * time.Second) // a deadline: the saved policy asks for a cycle at once
	for {
		p = web.PrioritiesJSON{} // fresh: decoding into the old rows would keep their omitted fields
		e.getJSON("/api/v1/priorities", demo.Engineer, &p)
		done := p.Order == "multifactor" && len(p.Jobs) > 0
		for _, j := range p.Jobs {
			done = done && j.Factors.Order == ""
		}
		if done {
			break
		}
		if time.Now().After(deadline) { // deadline (real time)
			t.Fatalf("no cycle under the multifactor order: %+v", p)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, j := range p.Jobs {
		if sum := j.Points.Age + j.Points.FairShare + j.Points.Size; math.Abs(sum-j.Priority) > 1 || j.FairShareMultiplier != 0 {
			t.Errorf("multifactor: job %d: priority %v ≠ Σ points %v (multiplier %v)", j.ID, j.Priority, sum, j.FairShareMultiplier)
		}
	}
	if rc, out, _ := e.cli(demo.Engineer, "prio", "--me", "--parsable"); rc != 0 || !strings.HasPrefix(out, "JOBID|TEAM|USER|TIER|CLASS|PRIORITY|AGE|FAIRSHARE|JOBSIZE\n") {
		t.Errorf("prio under the multifactor order: %d\n%s", rc, out)
	}
}

func TestSlurmNodes(t *testing.T) {
	stdinIsTTY = func() bool { return false }
	e := boot(t)
	// The demo's 16 nodes are down (no agents); one is drained and holds
	// three GPUs of a job.
	ctx := context.Background()
	if _, err := e.m.Pool.Exec(ctx, `UPDATE nodes SET state = 'drained', state_reason = 'fan' WHERE name = 'gpu03'`); err != nil {
		t.Fatal(err)
	}
	var job int64
	if err := e.m.Pool.QueryRow(ctx, `SELECT min(id) FROM jobs WHERE state = 'pending'`).Scan(&job); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Store.Allocate(ctx, job, "gpu03", []int{0, 1, 5}, e.m.Store.Now()); err != nil {
		t.Fatal(err)
	}
	rc, out, errOut := e.cli(demo.Engineer, "nodes", "--parsable")
	want := "GPUTYPE|STATE|NODES|GPUS|ALLOC|IDLE|OTHER|NODELIST\n" +
		"A100-80GB|drain|1|8|3|0|5|gpu03\n" +
		"A100-80GB|down|11|88|0|0|88|gpu[01-02,04-12]\n" +
		"T4|down|4|32|0|0|32|gpu[13-16]\n"
	if rc != 0 || out != want {
		t.Errorf("nodes: %d %s\n%s\nwant:\n%s", rc, errOut, out, want)
	}
	rc, out, _ = e.cli(demo.Engineer, "nodes", "-N", "--state", "drain", "--parsable", "--noheader")
	if rc != 0 || out != "gpu03|1|A100-80GB|drain|8|3|0|5|0|onprem|fan\n" {
		t.Errorf("nodes -N --state drain: %d %q", rc, out)
	}
	rc, out, _ = e.cli(demo.Engineer, "nodes", "-p", "T4", "--noheader")
	if rc != 0 || len(strings.Split(strings.TrimSpace(out), "\n")) != 1 || !strings.HasPrefix(out, "T4 ") {
		t.Errorf("nodes -p T4: %d %q", rc, out)
	}
	if rc, out, _ := e.cli(demo.Engineer, "nodes", "--state", "idle", "--noheader"); rc != 0 || out != "" {
		t.Errorf("nodes --state idle: %d %q", rc, out)
	}
	if code, _, _ := e.api("GET", "/api/v1/node-usage", demo.Finance, ""); code != 200 {
		t.Errorf("node-usage as finance: %d", code)
	}
}

func secondsDur(s int64) time.Duration { return time.Duration(s) * time.Second }

func TestHostList(t *testing.T) {
	for in, want := range map[string]string{
		"gpu01":                         "gpu01",
		"gpu01,gpu02,gpu03,gpu07":       "gpu[01-03,07]",
		"b2,a1,a2,x,a3":                 "x,a[1-3],b2",
		"n9,n10,n11":                    "n[9-11]",
		"gpu09,gpu10,gpu100":            "gpu[09-10,100]",
		"cloud-a,cloud-b":               "cloud-a,cloud-b",
		"gpu01,gpu02,gpu04,gpu05,gpu06": "gpu[01-02,04-06]",
	} {
		if got := hostList(strings.Split(in, ",")); got != want {
			t.Errorf("hostList(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestSlurmFormats(t *testing.T) {
	for in, want := range map[int64]string{0: "0:00", 59: "0:59", 61: "1:01", 3600: "1:00:00", 86399: "23:59:59", 86400: "1-00:00:00", 90061: "1-01:01:01"} {
		if got := slurmDuration(secondsDur(in)); got != want {
			t.Errorf("slurmDuration(%ds) = %s, want %s", in, got, want)
		}
	}
	for in, want := range map[string][]string{"PD,r": {"pending", "running"}, "CANCELED, ca": {"cancelled"}, "all": nil, "": nil, "Completed,F": {"completed", "failed"}} {
		got, err := parseStates(in)
		if err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("parseStates(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"all,PD", "S", "preempted", "lost"} {
		if _, err := parseStates(in); err == nil {
			t.Errorf("parseStates(%q): no error", in)
		}
	}
	// Every letter and name parses, and each letter's header is its field's.
	for _, f := range jobFields {
		if f.letter != 0 {
			if _, err := parseFormat(jobFields, "%"+string(f.letter)); err != nil {
				t.Errorf("%%%c: %v", f.letter, err)
			}
		}
		for _, n := range f.names {
			if fieldByName(jobFields, n) != fieldByName(jobFields, f.names[0]) {
				t.Errorf("name %s is taken twice", n)
			}
		}
	}
}

func TestCompletion(t *testing.T) {
	cmds := usageCommands()
	for _, want := range []string{"submit", "jobs", "cancel", "show", "share", "prio", "nodes", "completion", "token", "node", "dev", "server"} {
		if !contains(cmds, want) {
			t.Errorf("usage commands %v lack %s", cmds, want)
		}
	}
	if got := complete([]string{""}); strings.Join(got, " ") != strings.Join(cmds, " ") {
		t.Errorf("complete(''): %v", got)
	}
	// Every command of the usage text completes from a prefix, and its
	// flags (from its own -h) complete; so do its subcommands' flags.
	for _, c := range cmds {
		if got := complete([]string{c[:1]}); !contains(got, c) {
			t.Errorf("%q does not complete to %s: %v", c[:1], c, got)
		}
		flags := complete([]string{c, "-"})
		for _, sub := range subcommands(c) {
			if got := complete([]string{c, sub[:1]}); !contains(got, sub) {
				t.Errorf("allot %s %s… does not complete to %s: %v", c, sub[:1], sub, got)
			}
			flags = append(flags, complete([]string{c, sub, "-"})...)
		}
		for _, f := range flags {
			if !strings.HasPrefix(f, "-") {
				t.Errorf("allot %s -<TAB>: %q", c, f)
			}
		}
	}
	for cmd, want := range map[string][]string{
		"jobs":            {"--me", "--team", "--state", "-t", "--user", "--format", "-o", "-O", "--Format", "--parsable", "--noheader", "--json", "--server", "--token"},
		"cancel":          {"--yes", "-y", "--team", "--state", "--me", "--user"},
		"show":            {"--json"},
		"share":           {"--team", "--parsable", "-P"},
		"prio":            {"--me", "--weights", "-w", "--norm"},
		"nodes":           {"-N", "--gpu-type", "--state"},
		"user":            {"--server", "--token", "--note"},
		"bootstrap-admin": {"--email", "--database-url"},
		"migrate":         {"--database-url"},
	} {
		got := complete([]string{cmd, "-"})
		for _, f := range want {
			if !contains(got, f) {
				t.Errorf("allot %s -<TAB>: %v lacks %s", cmd, got, f)
			}
		}
	}
	if got := complete([]string{"jobs", "--st"}); strings.Join(got, " ") != "--start --state --states" {
		t.Errorf("jobs --st<TAB>: %v", got)
	}
	if got := complete([]string{"jobs", "--state", "P"}); strings.Join(got, " ") != "PD" {
		t.Errorf("jobs --state P<TAB>: %v", got)
	}
	if got := complete([]string{"token", ""}); strings.Join(got, " ") != "create list revoke" {
		t.Errorf("token <TAB>: %v", got)
	}
	if got := complete([]string{"completion", ""}); strings.Join(got, " ") != "bash zsh fish" {
		t.Errorf("completion <TAB>: %v", got)
	}
	if got := complete([]string{"submit", "job"}); got != nil {
		t.Errorf("submit job<TAB> (a file): %v", got)
	}
	var out bytes.Buffer
	if rc := run([]string{completeCommand, "jobs", "--me"}, &out, &out); rc != 0 || out.String() != "--me\n" {
		t.Errorf("allot __complete jobs --me: %d %q", rc, out.String())
	}

	// The scripts: bash's is valid bash and passes the words to allot.
	dir := t.TempDir()
	for _, sh := range []string{"bash", "zsh", "fish"} {
		var o, eb bytes.Buffer
		if rc := run([]string{"completion", sh}, &o, &eb); rc != 0 || !strings.Contains(o.String(), completeCommand) {
			t.Fatalf("completion %s: %d %s", sh, rc, eb.String())
		}
		if err := os.WriteFile(filepath.Join(dir, sh), o.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := exec.LookPath(sh); err == nil {
			if b, err := exec.Command(sh, "-n", filepath.Join(dir, sh)).CombinedOutput(); err != nil {
				t.Errorf("%s -n: %v\n%s", sh, err, b)
			}
		}
	}
	// Each shell's script passes the words to `allot __complete` (a fake
	// allot here, which records them) and offers what it prints.
	fake := filepath.Join(dir, "bin")
	if err := os.MkdirAll(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fake, "allot"), []byte("#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$ARGS_FILE\"\nprintf '%s\\n' --me --me-too\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ sh, script string }{
		{"bash", `source "$SCRIPT"; COMP_WORDS=(allot jobs --m); COMP_CWORD=2; _allot; printf '%s,' "${COMPREPLY[@]}"`},
		{"zsh", `compdef() { :; }; _files() { print FILES }; compadd() { shift; print -rn -- "${(j:,:)@},"; }
			source "$SCRIPT"; words=(allot jobs --m); CURRENT=3; _allot`},
		{"fish", `source "$SCRIPT"; for c in (complete -C 'allot jobs --m'); printf '%s,' $c; end`},
	} {
		if _, err := exec.LookPath(c.sh); err != nil {
			t.Logf("%s is not installed: its script is not run", c.sh)
			continue
		}
		args := filepath.Join(dir, c.sh+".args")
		cmd := exec.Command(c.sh, "-c", c.script)
		if c.sh == "zsh" {
			cmd = exec.Command(c.sh, "-f", "-c", c.script)
		}
		cmd.Env = append(os.Environ(), "PATH="+fake+":"+os.Getenv("PATH"), "ARGS_FILE="+args, "SCRIPT="+filepath.Join(dir, c.sh))
		b, err := cmd.CombinedOutput()
		if err != nil || string(b) != "--me,--me-too," {
			t.Errorf("%s completion offers %q (%v), want --me,--me-too,", c.sh, b, err)
		}
		if got, _ := os.ReadFile(args); string(got) != completeCommand+"\njobs\n--m\n" {
			t.Errorf("%s's script called allot with %q", c.sh, got)
		}
	}
}
