package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agent"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/burst"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

// live is a running Allot (server + River worker) with real agents running
// real processes on some of the demo nodes.
type live struct {
	*env
	agents map[string]context.CancelFunc
	links  map[string]*atomic.Bool // false = the agent's network is cut
}

const testHeartbeat = 300 * time.Millisecond

func bootLive(t *testing.T, nodes ...string) *live {
	t.Helper()
	l := startLive(t, nil)
	for _, n := range nodes {
		l.startAgent(n)
	}
	for _, n := range nodes {
		l.waitNode(n, allot.NodeUp)
	}
	return l
}

// startLive starts Allot for live tests (worker, 1 s cycle, fast
// heartbeats); prepare, if set, adjusts the Main before it runs. The demo's
// queue is cancelled and the policy made fast; no agent runs yet.
func startLive(t *testing.T, prepare func(m *Main)) *live {
	t.Helper()
	ctx := context.Background()
	m := &Main{Config: Config{Worker: true, DevMode: true, HeartbeatInterval: testHeartbeat, CheckpointRoot: jobTempDir(t)}}
	if prepare != nil {
		prepare(m)
	}
	l := &live{env: bootMain(t, m).withTokens(), agents: map[string]context.CancelFunc{}, links: map[string]*atomic.Bool{}}
	t.Cleanup(func() { // before bootMain's: the server closes last
		for _, stop := range l.agents {
			stop()
		}
		if p, ok := m.Burst.Provider.(*burst.LocalProvider); ok {
			p.Close()
		}
	})
	// The demo's queued jobs would take GPUs the tests count on.
	admin, err := m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	queued, err := m.Store.ListJobs(ctx, store.JobFilter{State: allot.JobPending})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range queued {
		if _, err := m.Store.CancelJob(ctx, &admin, j.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Fast policy for tests: short grace, no minimum runtime, a cycle every
	// second, nodes down after a second of silence.
	p, err := m.Store.CurrentPolicy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.GracePeriod, p.MinRuntime, p.CreatedBy = 2*time.Second, 0, "test"
	p.Cycle, p.HeartbeatMissedAfter = time.Second, time.Second
	if err := m.Store.InsertPolicy(ctx, &p); err != nil {
		t.Fatal(err)
	}
	return l
}

type switchable struct {
	up *atomic.Bool
	rt http.RoundTripper
}

func (s switchable) RoundTrip(r *http.Request) (*http.Response, error) {
	if !s.up.Load() {
		return nil, errors.New("network cut by the test")
	}
	return s.rt.RoundTrip(r)
}

func (l *live) startAgent(node string) {
	l.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tok, err := l.m.Store.CreateNodeToken(ctx, node, "test")
	if err != nil {
		l.t.Fatal(err)
	}
	nodes, _ := l.m.Store.ListNodes(ctx)
	var domain, typ string
	for _, n := range nodes {
		if n.Name == node {
			domain, typ = n.Domain, n.GPUType
		}
	}
	up := &atomic.Bool{}
	up.Store(true)
	a := agent.New(agent.Local(agent.Config{Server: l.url, Token: tok, Hostname: node, Domain: domain, HeartbeatInterval: testHeartbeat,
		OrdersWait: 5 * time.Second, StopGrace: 2 * time.Second, ShutdownGrace: time.Second, RetryMax: 200 * time.Millisecond,
		Backend:    agent.NewFake(agent.FakeOptions{GPUs: 8, Model: typ, Hostname: node}),
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		HTTPClient: &http.Client{Transport: switchable{up: up, rt: http.DefaultTransport}}}))
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }() //nolint:errcheck
	l.agents[node] = func() { cancel(); <-done }
	l.links[node] = up
}

func (l *live) waitNode(node, state string) {
	l.t.Helper()
	l.eventually(20*time.Second, fmt.Sprintf("node %s %s", node, state), func() bool {
		nodes, err := l.m.Store.ListNodes(context.Background())
		if err != nil {
			l.t.Fatal(err)
		}
		for _, n := range nodes {
			if n.Name == node {
				return n.State == state
			}
		}
		return false
	})
}

func (l *live) eventually(limit time.Duration, what string, ok func() bool) {
	l.t.Helper()
	deadline := time.Now().Add(limit) // deadline (real time)
	for !ok() {
		if time.Now().After(deadline) { // deadline (real time)
			l.t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (l *live) submit(persona, body string) web.JobJSON {
	l.t.Helper()
	code, _, b := l.api("POST", "/api/v1/jobs", persona, body)
	if code != http.StatusCreated {
		l.t.Fatalf("submit: %d %s", code, b)
	}
	var j web.JobJSON
	json.Unmarshal(b, &j) //nolint:errcheck
	return j
}

func (l *live) job(id int64) web.JobJSON {
	l.t.Helper()
	code, _, b := l.api("GET", fmt.Sprintf("/api/v1/jobs/%d", id), demo.Admin, "")
	if code != http.StatusOK {
		l.t.Fatalf("job %d: %d %s", id, code, b)
	}
	var j web.JobJSON
	json.Unmarshal(b, &j) //nolint:errcheck
	return j
}

func (l *live) waitJob(id int64, limit time.Duration, pred func(web.JobJSON) bool, what string) web.JobJSON {
	l.t.Helper()
	var j web.JobJSON
	deadline := time.Now().Add(limit) // deadline (real time)
	for {
		j = l.job(id)
		if pred(j) {
			return j
		}
		if time.Now().After(deadline) { // deadline (real time)
			lines, _ := l.m.Store.JobLog(context.Background(), id)
			l.t.Fatalf("timed out after %v waiting for job %d %s; it is %s (segment %d): %s %s; log: %q", limit, id, what, j.State, j.Segment, j.PendingReason, j.EndReason, lines)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func jsonCmd(args ...string) string {
	b, _ := json.Marshal(args)
	return string(b)
}

func TestLiveSubmitRunComplete(t *testing.T) {
	l := bootLive(t, "gpu01", "gpu02", "gpu13")
	j := l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":2,"gpu_type":"A100-80GB","time_limit":"5m","command":`+
		jsonCmd("sh", "-c", `echo "gpus=$CUDA_VISIBLE_DEVICES job=$ALLOT_JOB_ID team=$ALLOT_TEAM"; sleep 0.3; echo done`)+`}`)
	got := l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "completed" }, "completed")
	if got.StartedAt == nil || got.EndedAt == nil || *got.ExitCode != 0 || got.Segment != 1 {
		t.Errorf("finished job = %+v", got)
	}
	code, _, b := l.api("GET", fmt.Sprintf("/api/v1/jobs/%d/log", j.ID), demo.Engineer, "")
	var lg web.JobLogJSON
	json.Unmarshal(b, &lg) //nolint:errcheck
	if code != 200 || len(lg.Lines) != 2 || lg.Lines[0] != fmt.Sprintf("gpus=0,1 job=%d team=nlp", j.ID) || lg.Lines[1] != "done" {
		t.Errorf("log = %d %q", code, lg.Lines)
	}
	// The job page shows the output.
	br := l.login(demo.Engineer)
	if _, page := br.get(fmt.Sprintf("/jobs/%d", j.ID)); !strings.Contains(page, `data-testid="log"`) || !strings.Contains(page, "gpus=0,1 job=") {
		t.Errorf("job page lacks the output")
	}
	// A failing command fails the job with its exit code.
	f := l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":1,"time_limit":"5m","command":`+jsonCmd("sh", "-c", "exit 3")+`}`)
	got = l.waitJob(f.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "failed" }, "failed")
	if *got.ExitCode != 3 || got.EndReason != "exit code 3" {
		lines, _ := l.m.Store.JobLog(context.Background(), f.ID)
		var msg string
		l.m.Pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('segment %s on %s: %s, exit %s %s, reason %s, stop %s', segment, node, state, exit_code, exit_signal, exit_reason, stop_reason), '; '), '') FROM leases WHERE job_id = $1`, f.ID).Scan(&msg) //nolint:errcheck
		t.Errorf("failed job = %+v; its leases ended: %q; log: %q", got, msg, lines)
	}
	// Cancelling a running job stops its process and frees its GPUs.
	dir := jobTempDir(t)
	c := l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":1,"time_limit":"5m","command":`+
		jsonCmd("sh", "-c", `trap 'echo cancelled > `+dir+`/marker; exit 0' TERM; while true; do sleep 0.1; done`)+`}`)
	l.waitJob(c.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	l.eventually(10*time.Second, "process started", func() bool {
		var st string
		l.m.Pool.QueryRow(context.Background(), `SELECT state FROM leases WHERE job_id = $1`, c.ID).Scan(&st) //nolint:errcheck
		return st == "running"
	})
	if rc, _, errOut := l.cli(demo.Engineer, "cancel", fmt.Sprint(c.ID)); rc != 0 {
		t.Fatalf("cancel: %s", errOut)
	}
	l.eventually(10*time.Second, "GPUs of the cancelled job released", func() bool {
		var held int
		l.m.Pool.QueryRow(context.Background(), `SELECT count(*) FROM allocations WHERE job_id = $1 AND released_at IS NULL`, c.ID).Scan(&held) //nolint:errcheck
		return held == 0
	})
	if b, _ := os.ReadFile(filepath.Join(dir, "marker")); string(b) != "cancelled\n" {
		t.Errorf("the cancelled job's process did not get SIGTERM (marker %q)", b)
	}
	if got := l.job(c.ID); got.State != "cancelled" {
		t.Errorf("cancelled job is %s", got.State)
	}
	// Every allocation is released once jobs end.
	var active int
	l.m.Pool.QueryRow(context.Background(), "SELECT count(*) FROM allocations WHERE released_at IS NULL").Scan(&active) //nolint:errcheck
	if active != 0 {
		// demo jobs may be running; only ours must be released
		var ours int
		l.m.Pool.QueryRow(context.Background(), "SELECT count(*) FROM allocations WHERE released_at IS NULL AND job_id = ANY($1)", []int64{j.ID, f.ID}).Scan(&ours) //nolint:errcheck
		if ours != 0 {
			t.Errorf("%d GPUs still allocated to finished jobs", ours)
		}
	}
}

func TestLiveGangEnvironment(t *testing.T) {
	l := bootLive(t, "gpu01", "gpu02", "gpu09")
	dir := jobTempDir(t)
	j := l.submit(demo.Admin, `{"team":"fraud","tier":3,"gpus":16,"gpu_type":"A100-80GB","time_limit":"5m","checkpointable":true,"command":`+
		jsonCmd("sh", "-c", `env > `+dir+`/env-$NODE_RANK; sleep 0.2`)+`}`)
	l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "completed" }, "completed")
	envs := map[string]map[string]string{}
	for _, r := range []string{"0", "1"} {
		b, err := os.ReadFile(filepath.Join(dir, "env-"+r))
		if err != nil {
			t.Fatalf("rank %s never ran: %v", r, err)
		}
		envs[r] = map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				envs[r][k] = v
			}
		}
	}
	for r, e := range envs {
		want := map[string]string{"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "NODE_RANK": r,
			"ALLOT_NNODES": "2", "ALLOT_JOB_ID": fmt.Sprint(j.ID), "ALLOT_TEAM": "fraud", "MASTER_PORT": envs["0"]["MASTER_PORT"]}
		for k, v := range want {
			if e[k] != v {
				t.Errorf("rank %s: %s=%q, want %q", r, k, e[k], v)
			}
		}
		if e["MASTER_ADDR"] != envs["0"]["MASTER_ADDR"] || (e["MASTER_ADDR"] != "gpu01" && e["MASTER_ADDR"] != "gpu02") {
			t.Errorf("rank %s: MASTER_ADDR=%q", r, e["MASTER_ADDR"])
		}
		if !strings.HasSuffix(e["ALLOT_CHECKPOINT_DIR"], fmt.Sprintf("/job-%d", j.ID)) || e["PATH"] == "" {
			t.Errorf("rank %s: ALLOT_CHECKPOINT_DIR=%q PATH=%q", r, e["ALLOT_CHECKPOINT_DIR"], e["PATH"])
		}
	}
}

func TestLivePreemption(t *testing.T) {
	l := bootLive(t, "gpu13")
	dir := jobTempDir(t)
	victim := l.submit(demo.Admin, `{"team":"recs","tier":"preemptible","gpus":8,"gpu_type":"T4","time_limit":"10m","checkpointable":true,"command":`+
		jsonCmd("sh", "-c", `echo run $ALLOT_SEGMENT >> `+dir+`/runs; trap 'echo term >> `+dir+`/runs; echo saved > $ALLOT_CHECKPOINT_DIR/ckpt; exit 0' TERM; while true; do sleep 0.1; done`)+`}`)
	l.waitJob(victim.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	l.eventually(10*time.Second, "victim process started", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "runs"))
		return strings.Contains(string(b), "run 1")
	})
	// And its start reached the server: on a loaded machine the report
	// can arrive after a preemption that came quickly, and the lease's
	// start then postdates the checkpoint its process wrote.
	l.eventually(10*time.Second, "victim's start reported", func() bool {
		var started *time.Time
		l.m.Pool.QueryRow(context.Background(), `SELECT started_at FROM leases WHERE job_id = $1 AND segment = 1`, victim.ID).Scan(&started) //nolint:errcheck
		return started != nil
	})
	urgent := l.submit(demo.Admin, `{"team":"fraud","tier":1,"gpus":8,"gpu_type":"T4","time_limit":"5m","command":`+jsonCmd("sh", "-c", "sleep 1")+`}`)
	got := l.waitJob(urgent.ID, 30*time.Second, func(j web.JobJSON) bool { return j.State == "completed" }, "completed")
	v := l.waitJob(victim.ID, 30*time.Second, func(j web.JobJSON) bool { return j.Segment == 2 && j.State == "running" }, "running again")
	// "running" is set when the GPUs are allocated; the process starts a
	// moment later.
	var b []byte
	deadline := time.Now().Add(10 * time.Second)                             // a deadline (real time), not product time
	for string(b) != "run 1\nterm\nrun 2\n" && time.Now().Before(deadline) { // deadline (real time)
		time.Sleep(20 * time.Millisecond)
		b, _ = os.ReadFile(filepath.Join(dir, "runs"))
	}
	if string(b) != "run 1\nterm\nrun 2\n" {
		t.Errorf("victim's runs:\n%s", b)
	}
	// The checkpoint it wrote in its grace period was reported, so the
	// preemption credit covers only the work after it.
	var ckpt, started, exited *time.Time
	l.m.Pool.QueryRow(context.Background(), `SELECT last_checkpoint, started_at, exited_at FROM leases WHERE job_id = $1 AND segment = 1`, victim.ID).Scan(&ckpt, &started, &exited) //nolint:errcheck
	if ckpt == nil || started == nil || ckpt.Before(*started) || ckpt.After(*exited) {
		t.Errorf("victim's checkpoint %v, ran %v..%v", ckpt, started, exited)
	}
	if v.Preemptions != 1 || !v.SubmittedAt.Equal(victim.SubmittedAt) {
		t.Errorf("victim = %+v (submitted %v)", v, victim.SubmittedAt)
	}
	if got.StartedAt.Before(v.SubmittedAt) {
		t.Errorf("tier-1 job started before the victim was submitted?")
	}
}

func TestLiveNodeLost(t *testing.T) {
	l := bootLive(t, "gpu13", "gpu01")
	dir := jobTempDir(t)
	j := l.submit(demo.Admin, `{"team":"recs","tier":3,"gpus":4,"gpu_type":"T4","time_limit":"10m","checkpointable":true,"command":`+
		jsonCmd("sh", "-c", `echo started >> `+dir+`/log; sleep 60`)+`}`)
	nc := l.submit(demo.Admin, `{"team":"recs","tier":3,"gpus":4,"gpu_type":"T4","time_limit":"10m","command":`+jsonCmd("sleep", "60")+`}`)
	l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	l.waitJob(nc.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	l.links["gpu13"].Store(false) // the node falls off the network
	l.waitNode("gpu13", allot.NodeDown)
	got := l.waitJob(j.ID, 10*time.Second, func(j web.JobJSON) bool { return j.State == "pending" }, "requeued")
	if !strings.Contains(got.PendingReason, "gpu13") && got.PendingReason == "" {
		t.Errorf("pending reason %q", got.PendingReason)
	}
	failed := l.waitJob(nc.ID, 10*time.Second, func(j web.JobJSON) bool { return j.State == "failed" }, "failed")
	if failed.EndReason != "node_lost" {
		t.Errorf("non-checkpointable job ended with %q", failed.EndReason)
	}
	// Usage stops at the last heartbeat: the allocations were released
	// no later than when the node was marked down.
	var late int
	l.m.Pool.QueryRow(context.Background(), `SELECT count(*) FROM allocations a JOIN nodes n ON n.name = a.node
		WHERE a.node = 'gpu13' AND (a.released_at IS NULL OR a.released_at > greatest(n.last_heartbeat, a.started_at))`).Scan(&late) //nolint:errcheck
	if late != 0 {
		rows, _ := l.m.Pool.Query(context.Background(), `SELECT a.job_id, a.gpu_index, a.started_at, a.released_at, n.last_heartbeat, n.state FROM allocations a JOIN nodes n ON n.name = a.node WHERE a.node = 'gpu13'`)
		for rows.Next() {
			var id int64
			var g int
			var s, hb time.Time
			var r *time.Time
			var st string
			rows.Scan(&id, &g, &s, &r, &hb, &st) //nolint:errcheck
			t.Logf("job %d gpu %d %v..%v hb %v %s", id, g, s, r, hb, st)
		}
		rows.Close()
		t.Errorf("%d allocations on the lost node run past its last heartbeat", late)
	}
	// The node comes back: it registers again, its stale process is
	// stopped, and the requeued job runs again.
	l.links["gpu13"].Store(true)
	l.waitNode("gpu13", allot.NodeUp)
	l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" && j.Segment == 2 }, "running again")
}

func TestAgentBadInput(t *testing.T) {
	l := bootLive(t, "gpu01")
	ctx := context.Background()
	tok, err := l.m.Store.CreateNodeToken(ctx, "gpu02", "test")
	if err != nil {
		t.Fatal(err)
	}
	j := l.submit(demo.Admin, `{"team":"fraud","tier":3,"gpus":1,"gpu_type":"A100-80GB","time_limit":"5m","command":`+jsonCmd("sleep", "30")+`}`)
	l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	var beforeJobs, beforeLeases, beforeSamples int
	count := func() (int, int, int) {
		var a, b, c int
		l.m.Pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM jobs WHERE state <> 'running'), (SELECT count(*) FROM leases WHERE state = 'exited'), (SELECT count(*) FROM node_gpus WHERE node = 'gpu02')").Scan(&a, &b, &c) //nolint:errcheck
		return a, b, c
	}
	beforeJobs, beforeLeases, beforeSamples = count()
	tests := []struct {
		name, method, path, token, body string
		status                          int
		detail                          string
	}{
		{"unknown token", "POST", "/api/agent/v1/heartbeat", "allot_node_nope", `{"time":"2026-01-01T00:00:00Z","gpus":[],"jobs":[]}`, 401, "invalid or revoked node token"},
		{"user token", "POST", "/api/agent/v1/register", l.tokens[demo.Admin], `{}`, 401, "node token"},
		{"no token", "GET", "/api/agent/v1/orders", "", ``, 401, "node token"},
		{"lease it does not own", "POST", "/api/agent/v1/jobs/exited", tok, fmt.Sprintf(`{"job_id":%d,"segment":1,"exit_code":0,"time":"2026-01-01T00:00:00Z"}`, j.ID), 404, "holds no lease"},
		{"take a lease it does not own", "POST", "/api/agent/v1/leases/take", tok, fmt.Sprintf(`{"job_id":%d,"segment":1}`, j.ID), 404, "holds no lease"},
		{"log for a job it does not run", "POST", "/api/agent/v1/jobs/log", tok, fmt.Sprintf(`{"job_id":%d,"segment":1,"lines":["pwned"]}`, j.ID), 404, "holds no lease"},
		{"malformed heartbeat", "POST", "/api/agent/v1/heartbeat", tok, `{"time": 5`, 400, "malformed JSON"},
		{"heartbeat with a wrong type", "POST", "/api/agent/v1/heartbeat", tok, `{"gpus":"many"}`, 422, "invalid input"},
		{"heartbeat before registering", "POST", "/api/agent/v1/heartbeat", tok, `{"time":"2026-01-01T00:00:00Z","gpus":[],"jobs":[]}`, 404, "register again"},
		{"register without GPUs", "POST", "/api/agent/v1/register", tok, `{"hostname":"gpu02","protocol":1,"gpus":[]}`, 422, "invalid input"},
		{"register with duplicate GPU indices", "POST", "/api/agent/v1/register", tok, `{"hostname":"gpu02","protocol":1,"gpus":[{"index":0},{"index":0}]}`, 422, "invalid input"},
		{"wrong protocol", "POST", "/api/agent/v1/register", tok, `{"hostname":"gpu02","protocol":99,"gpus":[{"index":0}]}`, 422, "invalid input"},
		{"bad lease ref", "POST", "/api/agent/v1/leases/take", tok, `{"job_id":0,"segment":0}`, 422, "invalid input"},
		{"bad wait", "GET", "/api/agent/v1/orders?wait=1h", tok, ``, 422, "invalid input"},
		{"empty batched take", "POST", "/api/agent/v1/leases/take-batch", tok, `{"leases":[]}`, 422, "invalid input"},
		{"batched take without leases", "POST", "/api/agent/v1/leases/take-batch", tok, `{}`, 422, "invalid input"},
		{"batched take of a lease twice", "POST", "/api/agent/v1/leases/take-batch", tok,
			fmt.Sprintf(`{"leases":[{"job_id":%d,"segment":1},{"job_id":%d,"segment":1}]}`, j.ID, j.ID), 422, "invalid input"},
		{"batched take of 65 leases", "POST", "/api/agent/v1/leases/take-batch", tok, `{"leases":[` + strings.Repeat(`{"job_id":1,"segment":1},`, 64) + `{"job_id":1,"segment":1}]}`, 422, "invalid input"},
		{"batched take with a bad ref", "POST", "/api/agent/v1/leases/take-batch", tok, `{"leases":[{"job_id":1,"segment":0}]}`, 422, "invalid input"},
		{"batched take of a wrong type", "POST", "/api/agent/v1/leases/take-batch", tok, `{"leases":5}`, 422, "invalid input"},
		{"batched starts with a bad ref", "POST", "/api/agent/v1/jobs/started-batch", tok, `{"started":[{"job_id":0,"segment":1,"pid":1}]}`, 422, "invalid input"},
		{"batched starts, none", "POST", "/api/agent/v1/jobs/started-batch", tok, `{"started":[]}`, 422, "invalid input"},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(tt.method, l.url+tt.path, strings.NewReader(tt.body))
		if tt.token != "" {
			req.Header.Set("Authorization", "Bearer "+tt.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p web.Problem
		json.Unmarshal(b, &p) //nolint:errcheck
		if resp.StatusCode != tt.status || !strings.Contains(p.Detail, tt.detail) || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s, want %d %q", tt.name, resp.StatusCode, b, tt.status, tt.detail)
		}
	}
	if a, b, c := count(); a != beforeJobs || b != beforeLeases || c != beforeSamples {
		t.Errorf("bad agent input changed state: jobs %d→%d, exited leases %d→%d, gpu02 inventory %d→%d", beforeJobs, a, beforeLeases, b, beforeSamples, c)
	}
	if got := l.job(j.ID); got.State != "running" {
		t.Errorf("victim of forged reports is %s", got.State)
	}
}

// TestLiveServerRestart: the server and worker go away while a job runs and
// come back on the same address; the agent keeps the job alive, reconnects,
// and the job completes with its output intact.
func TestLiveServerRestart(t *testing.T) {
	l := bootLive(t, "gpu13")
	dir := jobTempDir(t)
	j := l.submit(demo.Admin, `{"team":"recs","tier":3,"gpus":2,"gpu_type":"T4","time_limit":"5m","command":`+
		jsonCmd("sh", "-c", `echo before; while [ ! -f `+dir+`/go ]; do sleep 0.05; done; echo after`)+`}`)
	l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	l.eventually(10*time.Second, "first output", func() bool {
		lines, _ := l.m.Store.JobLog(context.Background(), j.ID)
		return len(lines) == 1
	})
	addr := strings.TrimPrefix(l.url, "http://")
	if err := l.m.Close(); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "go"), nil, 0o644) //nolint:errcheck // the job ends while the server is down
	time.Sleep(3 * testHeartbeat)
	m2 := &Main{Config: Config{DatabaseURL: l.m.DatabaseURL, Addr: addr, Worker: true, DevMode: true,
		HeartbeatInterval: testHeartbeat, CheckpointRoot: l.m.CheckpointRoot}}
	if err := m2.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.m, l.env.m = m2, m2
	got := l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "completed" }, "completed after the restart")
	lines, _ := m2.Store.JobLog(context.Background(), j.ID)
	if strings.Join(lines, ",") != "before,after" || *got.ExitCode != 0 {
		t.Errorf("after restart: exit %v, log %q", got.ExitCode, lines)
	}
	var nodeState string
	m2.Pool.QueryRow(context.Background(), `SELECT state FROM nodes WHERE name = 'gpu13'`).Scan(&nodeState) //nolint:errcheck
	if nodeState != allot.NodeUp {
		t.Errorf("node is %s after the restart", nodeState)
	}
}
