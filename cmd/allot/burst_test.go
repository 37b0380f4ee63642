package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agent"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/burst"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// bootBurst is bootLive with cloud burst configured by cfg (called with
// the Main before it runs, so a local provider can point at its URL). The
// demo's queue is cancelled; no on-premise agent runs until a test starts
// one. The returned Burster shares the worker's configuration, for
// evaluating the rule on demand instead of every minute.
func bootBurst(t *testing.T, cfg func(m *Main) jobs.BurstConfig) (*live, *jobs.Burster) {
	t.Helper()
	l := startLive(t, func(m *Main) {
		m.Burst = cfg(m)
		m.Burst.Interval = time.Hour // the tests evaluate the rule themselves
	})
	if err := ensureBurstGPUType(context.Background(), l.m.Store, l.m.Burst.GPUType); err != nil {
		t.Fatal(err)
	}
	return l, jobs.NewBurster(l.m.Store, slog.New(slog.NewTextHandler(io.Discard, nil)), l.m.Burst)
}

// queueOld submits a job through the API and backdates its submit time.
func (l *live) queueOld(body string, waited time.Duration) int64 {
	l.t.Helper()
	j := l.submit(demo.Engineer, body)
	if _, err := l.m.Pool.Exec(context.Background(), `UPDATE jobs SET submitted_at = $3::timestamptz - $2::interval WHERE id = $1`,
		j.ID, fmt.Sprintf("%d seconds", int(waited/time.Second)), l.m.Store.Now()); err != nil {
		l.t.Fatal(err)
	}
	return j.ID
}

// waitFile is a job command that runs until the test creates file.
func waitFile(file string) string {
	c, _ := json.Marshal([]string{"sh", "-c", fmt.Sprintf("while [ ! -e %s ]; do sleep 0.1; done", file)})
	return string(c)
}

func (l *live) evaluate(b *jobs.Burster) jobs.Evaluation {
	l.t.Helper()
	ev, err := b.Evaluate(context.Background(), l.m.river)
	if err != nil {
		l.t.Fatal(err)
	}
	if !ev.Ran {
		l.t.Fatal("the burst evaluation did not run")
	}
	return ev
}

func (l *live) burstEvent(id int64) store.BurstEvent {
	l.t.Helper()
	e, err := l.m.Store.BurstEventByID(context.Background(), id)
	if err != nil {
		l.t.Fatal(err)
	}
	return e
}

func (l *live) burstNodes() []store.BurstNode {
	l.t.Helper()
	n, err := l.m.Store.BurstNodes(context.Background(), time.Time{})
	if err != nil {
		l.t.Fatal(err)
	}
	return n
}

// allocNodes returns the nodes job id ever held GPUs on.
func (l *live) allocNodes(id int64) []string {
	l.t.Helper()
	var nodes []string
	rows, err := l.m.Pool.Query(context.Background(), `SELECT DISTINCT node FROM allocations WHERE job_id = $1 ORDER BY node`, id)
	if err != nil {
		l.t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			l.t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// TestBurstLocal: 60 GPU-hours of non-production work waiting 2.5 h make
// the rule request 2 local burst nodes; they register with node tokens and
// run that work, while a tier-1 job stays pending until an on-premise node
// comes up; with the queue below 20 GPU-hours, an idle burst node goes and
// a busy one stays until its job ends. Events, audit, page and API show it.
func TestBurstLocal(t *testing.T) {
	l, b := bootBurst(t, func(m *Main) jobs.BurstConfig {
		return jobs.BurstConfig{Provider: newLocalBurst(m, slog.New(slog.NewTextHandler(io.Discard, nil))), GPUType: "A100-spot", GPUsPerNode: 8,
			RetryBackoff: 50 * time.Millisecond, RegisterTimeout: time.Minute}
	})
	ctx := context.Background()
	dir := jobTempDir(t)
	// 8×3 + 8×3 + 4×3 = 60 GPU-h; the tier-1 job does not count.
	a := l.queueOld(`{"team":"nlp","tier":3,"gpus":8,"time_limit":"3h","command":`+waitFile(dir+"/a")+`}`, 150*time.Minute)
	bj := l.queueOld(`{"team":"nlp","tier":4,"gpus":8,"time_limit":"3h","command":`+waitFile(dir+"/b")+`}`, 150*time.Minute)
	c := l.queueOld(`{"team":"nlp","tier":3,"gpus":4,"time_limit":"3h","command":`+waitFile(dir+"/c")+`}`, 150*time.Minute)
	prod := l.queueOld(`{"team":"nlp","tier":1,"gpus":8,"time_limit":"1h","command":`+waitFile(dir+"/p")+`}`, 150*time.Minute)

	ev := l.evaluate(b)
	if ev.View.Queue.GPUSeconds != 60*3600 || ev.View.Queue.Jobs != 3 {
		t.Fatalf("measured %+v, want the 3 non-production jobs and 60 GPU-h", ev.View.Queue)
	}
	if ev.View.Decision.Action != burst.ActRequest || ev.View.Decision.Count != 2 || len(ev.Events) != 1 {
		t.Fatalf("decision %+v, events %v: want a request for ceil(60 / (8 × 4 h)) = 2 nodes", ev.View.Decision, ev.Events)
	}
	reqID := ev.Events[0]
	// The request in flight counts as capacity: the next minute asks for nothing.
	if again := l.evaluate(b); again.View.Decision.Action != burst.ActNone || len(again.Events) != 0 {
		t.Fatalf("second evaluation: %+v, events %v", again.View.Decision, again.Events)
	}
	l.eventually(20*time.Second, "the provider's nodes", func() bool { return l.burstEvent(reqID).Status == store.BurstDone })
	e := l.burstEvent(reqID)
	if len(e.NodeNames) != 2 || e.Provider != "local" || e.Attempts != 1 {
		t.Fatalf("request event %+v", e)
	}
	for _, n := range e.NodeNames {
		l.waitNode(n, allot.NodeUp)
	}
	nodes, err := l.m.Store.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if slices.Contains(e.NodeNames, n.Name) && (n.Site != allot.SiteCloud || n.GPUType != "A100-spot" || n.GPUCount != 8) {
			t.Fatalf("burst node %+v: want site cloud, A100-spot × 8", n)
		}
	}
	// Two of the three research jobs run on the burst nodes (16 GPUs).
	onBurst := func(id int64) bool {
		ns := l.allocNodes(id)
		return len(ns) > 0 && slices.Contains(e.NodeNames, ns[0])
	}
	l.eventually(20*time.Second, "research jobs on burst nodes", func() bool {
		n := 0
		for _, id := range []int64{a, bj, c} {
			if l.job(id).State == string(allot.JobRunning) && onBurst(id) {
				n++
			}
		}
		return n == 2
	})
	// The production job never goes to the cloud: it waits for on-prem.
	time.Sleep(1500 * time.Millisecond) // a cycle or more
	if j := l.job(prod); j.State != string(allot.JobPending) || len(l.allocNodes(prod)) != 0 {
		t.Fatalf("tier-1 job is %s on %v with only burst nodes up; want pending", j.State, l.allocNodes(prod))
	}
	l.startAgent("gpu01")
	l.waitJob(prod, 20*time.Second, func(j web.JobJSON) bool { return j.State == string(allot.JobRunning) }, "running on-prem")
	if ns := l.allocNodes(prod); !slices.Equal(ns, []string{"gpu01"}) {
		t.Fatalf("tier-1 job ran on %v, want gpu01", ns)
	}

	// The research job still pending (≤ 24 GPU-h) is cancelled: the queue
	// is below 20 GPU-h. Both burst nodes are busy: nothing is released.
	var waiting int64
	for _, id := range []int64{a, bj, c} {
		if !onBurst(id) {
			waiting = id
		}
	}
	if waiting != 0 {
		if code, _, body := l.api("POST", fmt.Sprintf("/api/v1/jobs/%d/cancel", waiting), demo.Engineer, ""); code != http.StatusOK {
			t.Fatalf("cancel: %d %s", code, body)
		}
	}
	if ev := l.evaluate(b); ev.View.Decision.Action != burst.ActNone || len(ev.Released) != 0 {
		for _, id := range []int64{a, bj, c} {
			lines, _ := l.m.Store.JobLog(ctx, id)
			t.Logf("job %d: %s %q", id, l.job(id).State, lines)
		}
		t.Fatalf("with both burst nodes busy: %+v released %v", ev.View.Decision, ev.Released)
	}
	// The job on one burst node ends: that node is idle and goes; the other stays.
	var first, second int64
	for _, id := range []int64{a, bj, c} {
		if id != waiting && first == 0 {
			first = id
		} else if id != waiting {
			second = id
		}
	}
	names := map[int64]string{}
	for _, id := range []int64{first, second} {
		names[id] = l.allocNodes(id)[0]
	}
	file := map[int64]string{a: "a", bj: "b", c: "c"}
	if err := os.WriteFile(filepath.Join(dir, file[first]), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l.waitJob(first, 20*time.Second, func(j web.JobJSON) bool { return j.State == string(allot.JobCompleted) }, "completed")
	l.eventually(10*time.Second, "the finished job's node idle", func() bool {
		for _, n := range l.burstNodes() {
			if n.Node == names[first] {
				return n.Idle
			}
		}
		return false
	})
	ev = l.evaluate(b)
	if !slices.Equal(ev.Released, []string{names[first]}) {
		t.Fatalf("released %v (decision %+v), want only the idle node %s", ev.Released, ev.View.Decision, names[first])
	}
	relID := ev.Events[0]
	l.eventually(20*time.Second, "the release done", func() bool { return l.burstEvent(relID).Status == store.BurstDone })
	l.waitNode(names[first], allot.NodeDown)
	p := b.Config.Provider.(*burst.LocalProvider)
	if running := p.Running(); !slices.Equal(running, []string{names[second]}) {
		t.Fatalf("local agents running %v, want only %s", running, names[second])
	}
	alive := l.burstNodes()
	if len(alive) != 1 || alive[0].Node != names[second] || alive[0].Idle {
		t.Fatalf("burst nodes alive %+v, want the busy %s", alive, names[second])
	}
	// Its job ends: it goes too.
	if err := os.WriteFile(filepath.Join(dir, file[second]), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l.waitJob(second, 20*time.Second, func(j web.JobJSON) bool { return j.State == string(allot.JobCompleted) }, "completed")
	l.eventually(10*time.Second, "the second node released", func() bool {
		ev := l.evaluate(b)
		return slices.Equal(ev.Released, []string{names[second]})
	})
	l.eventually(20*time.Second, "no burst node alive", func() bool { return len(l.burstNodes()) == 0 && len(p.Running()) == 0 })

	// Audit: one burst.request and two burst.release entries by system.
	entries, err := l.m.Store.AuditLog(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, en := range entries {
		if strings.HasPrefix(en.Action, "burst.") && en.Actor == allot.ActorSystem {
			count[en.Action]++
		}
	}
	if count["burst.request"] != 1 || count["burst.release"] != 2 {
		t.Fatalf("audit entries %v, want 1 request and 2 releases", count)
	}
	// The API and the page show the events with why, how many and cost.
	code, _, body := l.api("GET", "/api/v1/burst", demo.Engineer, "")
	if code != http.StatusOK {
		t.Fatalf("GET /api/v1/burst: %d %s", code, body)
	}
	var rep struct {
		Enabled bool `json:"enabled"`
		Events  []struct {
			Kind            string   `json:"kind"`
			Status          string   `json:"status"`
			Nodes           int      `json:"nodes"`
			NodeNames       []string `json:"node_names"`
			PendingGPUHours float64  `json:"pending_gpu_hours"`
			Reason          string   `json:"reason"`
			CostSoFar       string   `json:"cost_so_far"`
		} `json:"events"`
		Thresholds struct {
			PendingGPUHours int `json:"pending_gpu_hours"`
		} `json:"thresholds"`
	}
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Enabled || len(rep.Events) != 3 || rep.Thresholds.PendingGPUHours != 50 {
		t.Fatalf("API: %s", body)
	}
	req := rep.Events[2]
	if req.Kind != "request" || req.Nodes != 2 || req.PendingGPUHours != 60 || !strings.Contains(req.Reason, "pending 60.0 GPU-h") ||
		!strings.HasSuffix(req.CostSoFar, " USD") {
		t.Fatalf("request event in the API: %+v", req)
	}
	// Cost: exact, from the nodes' lifetimes at the spot rate.
	all, err := l.m.Store.BurstNodesOfEvents(ctx, []int64{reqID})
	if err != nil {
		t.Fatal(err)
	}
	want, err := jobs.BurstCost(all, time.Time{}, clock.Now(), "USD")
	if err != nil {
		t.Fatal(err)
	}
	if req.CostSoFar != want.String() {
		t.Fatalf("cost so far %s, want %s", req.CostSoFar, want)
	}
	code, html := l.login(demo.Engineer).get("/burst")
	if code != http.StatusOK || !strings.Contains(html, `data-testid="burst-events"`) || strings.Count(html, `data-testid="burst-event"`) != 3 {
		t.Fatalf("GET /burst: %d\n%s", code, html)
	}
}

// TestBurstExecFailing: a provider command that fails is retried with
// backoff, the event ends failed with the command's stderr, and no node or
// node token is left behind.
func TestBurstExecFailing(t *testing.T) {
	dir := jobTempDir(t)
	script := filepath.Join(dir, "burst-wrapper")
	calls := filepath.Join(dir, "calls")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat >> "+calls+"\necho >> "+calls+"\necho 'spot capacity exhausted in eu-west-1' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	l, b := bootBurst(t, func(m *Main) jobs.BurstConfig {
		return jobs.BurstConfig{Provider: &burst.ExecProvider{Command: script}, GPUType: "A100-spot", GPUsPerNode: 8,
			RetryBackoff: 50 * time.Millisecond, MaxAttempts: 3}
	})
	l.queueOld(`{"team":"nlp","tier":3,"gpus":8,"time_limit":"8h","command":["true"]}`, 3*time.Hour)
	ev := l.evaluate(b)
	if len(ev.Events) != 1 || ev.View.Decision.Count != 2 {
		t.Fatalf("evaluation %+v", ev)
	}
	id := ev.Events[0]
	l.eventually(60*time.Second, "the request to fail for good", func() bool { return l.burstEvent(id).Status == store.BurstFailed })
	e := l.burstEvent(id)
	if e.Attempts != 3 || !strings.Contains(e.Error, "spot capacity exhausted in eu-west-1") || !strings.Contains(e.Error, "exit status 3") {
		t.Fatalf("failed event %+v", e)
	}
	raw, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), `"action":"provision"`); n != 3 {
		t.Fatalf("the command ran %d times, want 3:\n%s", n, raw)
	}
	var count int
	if err := l.m.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM nodes WHERE site = 'cloud') + (SELECT count(*) FROM burst_nodes)
		+ (SELECT count(*) FROM node_tokens WHERE created_by = 'burst')`).Scan(&count); err != nil {
		t.Fatal(err)
	}
	if count != 0 {
		t.Fatalf("%d node, burst node or token rows left behind by a failed provider", count)
	}
	// Backoff doubles per attempt.
	w := &jobs.BurstProviderWorker{Burster: b}
	d1 := time.Until(w.NextRetry(&river.Job[jobs.BurstProviderArgs]{JobRow: jobRow(1)}))
	d3 := time.Until(w.NextRetry(&river.Job[jobs.BurstProviderArgs]{JobRow: jobRow(3)}))
	if d1 > 60*time.Millisecond || d3 < 190*time.Millisecond {
		t.Fatalf("backoff after attempt 1: %v, after 3: %v; want 50 ms then 200 ms", d1, d3)
	}
	// The failure is on the page: the command's stderr for admins only,
	// others see that it failed and its exit status. A new evaluation does
	// not count the failed request as capacity: it asks again.
	if _, html := l.login(demo.Admin).get("/burst"); !strings.Contains(html, "spot capacity exhausted") {
		t.Fatalf("the failure is not on /burst for an admin:\n%s", html)
	}
	if _, html := l.login(demo.Engineer).get("/burst"); strings.Contains(html, "spot capacity exhausted") ||
		!strings.Contains(html, "provider failed, see admins (exit status 3)") {
		t.Fatalf("/burst shows an engineer the provider's stderr, or not that it failed:\n%s", html)
	}
	if _, _, body := l.api("GET", "/api/v1/burst", demo.Engineer, ""); strings.Contains(string(body), "spot capacity exhausted") ||
		!strings.Contains(string(body), "provider failed, see admins (exit status 3)") {
		t.Fatalf("GET /api/v1/burst shows an engineer the provider's stderr:\n%s", body)
	}
	if ev := l.evaluate(b); len(ev.Events) != 1 || ev.View.InFlight != 0 {
		t.Fatalf("after a failed request: %+v", ev)
	}
}

// TestBurstExecRegisters: a provider command that succeeds returns names
// that become cloud nodes with node tokens: an agent with the token it was
// given registers; a node whose agent never registers is released as
// failed after the timeout (the command is called to release it).
func TestBurstExecRegisters(t *testing.T) {
	dir := jobTempDir(t)
	script := filepath.Join(dir, "burst-wrapper")
	calls := filepath.Join(dir, "calls")
	if err := os.WriteFile(script, []byte(`#!/bin/sh
input=$(cat)
printf '%s\n' "$input" >> `+calls+`
case "$input" in
*'"action":"release"'*) exit 0 ;;
esac
echo '{"nodes":[{"name":"spot-a"},{"name":"spot-b"}]}'
`), 0o755); err != nil {
		t.Fatal(err)
	}
	l, b := bootBurst(t, func(m *Main) jobs.BurstConfig {
		return jobs.BurstConfig{Provider: &burst.ExecProvider{Command: script}, GPUType: "A100-spot", GPUsPerNode: 8, Server: "https://allot.example.com",
			RetryBackoff: 50 * time.Millisecond, RegisterTimeout: 3 * time.Second}
	})
	l.queueOld(`{"team":"nlp","tier":3,"gpus":8,"time_limit":"8h","command":["true"]}`, 3*time.Hour)
	ev := l.evaluate(b)
	if len(ev.Events) != 1 {
		t.Fatalf("evaluation %+v", ev)
	}
	id := ev.Events[0]
	l.eventually(20*time.Second, "the request done", func() bool { return l.burstEvent(id).Status == store.BurstDone })
	if e := l.burstEvent(id); !slices.Equal(e.NodeNames, []string{"spot-a", "spot-b"}) {
		t.Fatalf("event %+v", e)
	}
	raw, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	var req struct {
		burst.Request
		Action string `json:"action"`
	}
	if err := json.Unmarshal([]byte(strings.SplitN(string(raw), "\n", 2)[0]), &req); err != nil {
		t.Fatal(err)
	}
	if req.Action != "provision" || req.Count != 2 || req.GPUType != "A100-spot" || req.GPUsPerNode != 8 || req.Site != "cloud" ||
		req.Server != "https://allot.example.com" || len(req.NodeTokens) != 2 || req.EventID != id {
		t.Fatalf("request on stdin: %s", raw)
	}
	// spot-a's agent registers with the first token; spot-b never does.
	actx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	a := agent.New(agent.Local(agent.Config{Server: l.url, Token: req.NodeTokens[0], Hostname: "spot-a", HeartbeatInterval: testHeartbeat,
		Backend: agent.NewFake(agent.FakeOptions{GPUs: 8, Model: "A100-spot", Hostname: "spot-a"}), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	go func() { a.Run(actx); close(done) }() //nolint:errcheck
	l.agents["spot-a"] = func() { cancel(); <-done }
	l.waitNode("spot-a", allot.NodeUp)
	time.Sleep(3 * time.Second) // past the registration timeout
	ev = l.evaluate(b)
	if !slices.Equal(ev.Released, []string{"spot-b"}) {
		t.Fatalf("released %v, want the node that never registered", ev.Released)
	}
	rel := l.burstEvent(ev.Events[0])
	if rel.Kind != store.BurstRelease || !strings.Contains(rel.Reason, "no agent registered") {
		t.Fatalf("release event %+v", rel)
	}
	l.eventually(20*time.Second, "the release done", func() bool { return l.burstEvent(rel.ID).Status == store.BurstDone })
	raw, _ = os.ReadFile(calls)
	if !strings.Contains(string(raw), `{"action":"release","nodes":["spot-b"]}`) {
		t.Fatalf("release not sent to the command:\n%s", raw)
	}
	nodes := l.burstNodes()
	if len(nodes) != 1 || nodes[0].Node != "spot-a" || !nodes[0].Registered {
		t.Fatalf("burst nodes alive %+v, want spot-a", nodes)
	}
	var failed bool
	if err := l.m.Pool.QueryRow(context.Background(), `SELECT failed FROM burst_nodes WHERE node = 'spot-b'`).Scan(&failed); err != nil || !failed {
		t.Fatalf("spot-b failed = %v, %v", failed, err)
	}
}

func jobRow(attempt int) *rivertype.JobRow { return &rivertype.JobRow{Attempt: attempt} }

// TestBurstFlags: bad burst settings stop `allot worker` with a clear
// message before it connects anywhere.
func TestBurstFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--burst-provider", "local"}, "only allot dev can use it"},
		{[]string{"--burst-provider", "exec"}, "needs --burst-exec"},
		{[]string{"--burst-provider", "aws"}, "must be exec, local or none"},
		{[]string{"--burst-provider", "exec", "--burst-exec", "/bin/true", "--burst-gpus", "0"}, "--burst-gpus must be between 1 and 64"},
	} {
		var out, errb strings.Builder
		args := append([]string{"worker", "--database-url", "postgres://nobody@127.0.0.1:1/none"}, c.args...)
		if code := run(args, &out, &errb); code != 2 || !strings.Contains(errb.String(), c.msg) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", c.args, code, errb.String(), c.msg)
		}
	}
}

// startBurstAgent runs an agent for burst node name with node token tok;
// l.links[name] cuts its network (a spot reclaim, seen from Allot).
func (l *live) startBurstAgent(name, tok string) {
	l.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	up := &atomic.Bool{}
	up.Store(true)
	a := agent.New(agent.Local(agent.Config{Server: l.url, Token: tok, Hostname: name, HeartbeatInterval: testHeartbeat,
		OrdersWait: 5 * time.Second, ShutdownGrace: time.Second, RetryMax: 200 * time.Millisecond,
		Backend:    agent.NewFake(agent.FakeOptions{GPUs: 8, Model: "A100-spot", Hostname: name}),
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		HTTPClient: &http.Client{Transport: switchable{up: up, rt: http.DefaultTransport}}}))
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }() //nolint:errcheck
	if stop := l.agents[name]; stop != nil {
		stop()
	}
	l.agents[name] = func() { cancel(); <-done }
	l.links[name] = up
}

// lastProvision is the last provision request an exec script logged.
func lastProvision(t *testing.T, calls string) burst.Request {
	t.Helper()
	raw, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	var req burst.Request
	for line := range strings.SplitSeq(strings.TrimSpace(string(raw)), "\n") {
		if strings.Contains(line, `"action":"provision"`) {
			req = burst.Request{}
			if err := json.Unmarshal([]byte(line), &req); err != nil {
				t.Fatal(err)
			}
		}
	}
	return req
}

func (l *live) burstNode(name string) (store.BurstNode, bool) {
	for _, n := range l.burstNodes() {
		if n.Node == name {
			return n, true
		}
	}
	return store.BurstNode{}, false
}

// TestBurstReleaseLifecycle: a burst node lost to a spot reclaim is not
// capacity and is released as failed at the next evaluation; a release
// is done only when the provider confirms it (until then the node takes no
// work and is billed), a release that fails for good shows on /burst
// (stderr for admins only) and is retried by a later evaluation; released
// nodes leave the cluster's capacity, and a provider that reuses the host
// names gets them back as new nodes with new tokens.
func TestBurstReleaseLifecycle(t *testing.T) {
	dir := jobTempDir(t)
	script := filepath.Join(dir, "burst-wrapper")
	calls := filepath.Join(dir, "calls")
	failRelease := filepath.Join(dir, "fail-release")
	if err := os.WriteFile(script, []byte(`#!/bin/sh
input=$(cat)
printf '%s\n' "$input" >> `+calls+`
case "$input" in
*'"action":"release"'*)
	if [ -e `+failRelease+` ]; then echo 'cloud API throttled for account 1234-5678' >&2; exit 4; fi
	exit 0 ;;
esac
echo '{"nodes":[{"name":"spot-a"},{"name":"spot-b"}]}'
`), 0o755); err != nil {
		t.Fatal(err)
	}
	l, b := bootBurst(t, func(m *Main) jobs.BurstConfig {
		return jobs.BurstConfig{Provider: &burst.ExecProvider{Command: script}, GPUType: "A100-spot", GPUsPerNode: 8,
			RetryBackoff: 50 * time.Millisecond, MaxAttempts: 2, RegisterTimeout: time.Minute}
	})
	ctx := context.Background()
	var onprem int
	if err := l.m.Pool.QueryRow(ctx, `SELECT sum(gpu_count)::int FROM nodes WHERE site = 'onprem'`).Scan(&onprem); err != nil {
		t.Fatal(err)
	}
	clusterTotal := func() int {
		code, _, body := l.api("GET", "/api/v1/cluster", demo.Admin, "")
		var r struct {
			GPUs struct {
				Total int `json:"total"`
			} `json:"gpus"`
		}
		if code != http.StatusOK || json.Unmarshal(body, &r) != nil {
			t.Fatalf("GET /api/v1/cluster: %d %s", code, body)
		}
		return r.GPUs.Total
	}

	j1 := l.queueOld(`{"team":"nlp","tier":3,"gpus":8,"time_limit":"8h","command":["true"]}`, 3*time.Hour)
	ev := l.evaluate(b)
	if len(ev.Events) != 1 || ev.View.Decision.Count != 2 {
		t.Fatalf("evaluation %+v", ev)
	}
	reqID := ev.Events[0]
	l.eventually(20*time.Second, "the request done", func() bool { return l.burstEvent(reqID).Status == store.BurstDone })
	first := lastProvision(t, calls)
	l.startBurstAgent("spot-a", first.NodeTokens[0])
	l.startBurstAgent("spot-b", first.NodeTokens[1])
	l.waitNode("spot-a", allot.NodeUp)
	l.waitNode("spot-b", allot.NodeUp)
	l.waitJob(j1, 20*time.Second, func(j web.JobJSON) bool { return j.State == string(allot.JobCompleted) }, "completed")
	if got := clusterTotal(); got != onprem+16 {
		t.Fatalf("cluster GPUs with 2 burst nodes alive: %d, want %d", got, onprem+16)
	}

	// spot-b is reclaimed: no heartbeat, it goes down. The next evaluation
	// releases it as lost, and only it (it is not idle capacity).
	l.links["spot-b"].Store(false)
	l.waitNode("spot-b", allot.NodeDown)
	if err := os.WriteFile(failRelease, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ev = l.evaluate(b)
	if !slices.Equal(ev.Released, []string{"spot-b"}) || len(ev.Events) != 1 {
		t.Fatalf("released %v (events %v), want the lost spot-b alone", ev.Released, ev.Events)
	}
	rel1 := l.burstEvent(ev.Events[0])
	if !strings.Contains(rel1.Reason, "lost") {
		t.Fatalf("release event %+v", rel1)
	}
	// Not released until the provider confirms: still listed, billed.
	if n, ok := l.burstNode("spot-b"); !ok || !n.Releasing || !n.ReleasedAt.IsZero() || !n.Failed {
		t.Fatalf("spot-b while its release is unconfirmed: %+v (listed %v)", n, ok)
	}
	l.eventually(30*time.Second, "the release to fail for good", func() bool { return l.burstEvent(rel1.ID).Status == store.BurstFailed })
	failedAt := clock.Now()
	if e := l.burstEvent(rel1.ID); e.Attempts != 2 || !strings.Contains(e.Error, "throttled") {
		t.Fatalf("failed release %+v", e)
	}
	n, ok := l.burstNode("spot-b")
	if !ok || !n.Releasing || !n.ReleasedAt.IsZero() {
		t.Fatalf("spot-b after its release failed: %+v (listed %v); want still being released, billed", n, ok)
	}
	// Its cost runs to now: the priced interval of the view's nodes ends
	// at released_at, unset.
	v, err := jobs.LoadBurstView(ctx, l.m.Store, b.Config)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(v.Nodes, func(n store.BurstNode) bool { return n.Node == "spot-b" }); i < 0 || !v.Nodes[i].ReleasedAt.IsZero() {
		t.Fatalf("burst view while spot-b's release is unconfirmed: %+v", v.Nodes)
	}
	if _, html := l.login(demo.Admin).get("/burst"); !strings.Contains(html, "cloud API throttled") || !strings.Contains(html, "releasing") {
		t.Fatalf("the failed release is not on /burst for an admin:\n%s", html)
	}
	if _, html := l.login(demo.Engineer).get("/burst"); strings.Contains(html, "1234-5678") ||
		!strings.Contains(html, "provider failed, see admins (exit status 4)") {
		t.Fatalf("/burst for an engineer:\n%s", html)
	}

	// The provider works again: the next evaluation releases spot-b again
	// (and the idle spot-a, the queue being empty); confirmed, they are
	// released and leave the cluster's capacity.
	if err := os.Remove(failRelease); err != nil {
		t.Fatal(err)
	}
	ev = l.evaluate(b)
	if !slices.Contains(ev.Released, "spot-b") || !slices.Contains(ev.Released, "spot-a") {
		t.Fatalf("released %v, want spot-b again and the idle spot-a", ev.Released)
	}
	for _, id := range ev.Events {
		l.eventually(20*time.Second, "the releases done", func() bool { return l.burstEvent(id).Status == store.BurstDone })
	}
	if alive := l.burstNodes(); len(alive) != 0 {
		t.Fatalf("burst nodes alive after the releases: %+v", alive)
	}
	all, err := l.m.Store.BurstNodesOfEvents(ctx, []int64{reqID})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range all {
		if n.Node == "spot-b" && !n.ReleasedAt.After(failedAt) {
			t.Fatalf("spot-b released at %v, before the provider confirmed (after %v)", n.ReleasedAt, failedAt)
		}
	}
	if got := clusterTotal(); got != onprem {
		t.Fatalf("cluster GPUs with every burst node released: %d, want the %d on-premise", got, onprem)
	}
	if code, _, body := l.api("GET", "/api/v1/nodes", demo.Admin, ""); code != http.StatusOK || strings.Contains(string(body), `"spot-`) {
		t.Fatalf("GET /api/v1/nodes lists released burst nodes: %d %s", code, body)
	}

	// The provider hands out the same names again: they come back as new
	// nodes with new tokens; the old tokens stay revoked.
	l.queueOld(`{"team":"nlp","tier":3,"gpus":8,"time_limit":"8h","command":["true"]}`, 3*time.Hour)
	ev = l.evaluate(b)
	if len(ev.Events) != 1 {
		t.Fatalf("evaluation %+v", ev)
	}
	req2 := ev.Events[0]
	l.eventually(20*time.Second, "the second request settled", func() bool {
		s := l.burstEvent(req2).Status
		return s == store.BurstDone || s == store.BurstFailed
	})
	if e := l.burstEvent(req2); e.Status != store.BurstDone || !slices.Equal(e.NodeNames, []string{"spot-a", "spot-b"}) {
		t.Fatalf("request with reused names: %+v", e)
	}
	if _, err := l.m.Store.NodeByToken(ctx, first.NodeTokens[0]); err == nil {
		t.Fatal("the released spot-a's old token still works")
	}
	second := lastProvision(t, calls)
	l.startBurstAgent("spot-a", second.NodeTokens[0])
	l.waitNode("spot-a", allot.NodeUp)
	if n, ok := l.burstNode("spot-a"); !ok || n.EventID != req2 || !n.Registered || n.Releasing {
		t.Fatalf("spot-a again: %+v (listed %v)", n, ok)
	}
	var rows int
	if err := l.m.Pool.QueryRow(ctx, `SELECT count(*) FROM burst_nodes WHERE node = 'spot-a'`).Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("spot-a has %d burst rows (%v), want one per event", rows, err)
	}
}

// TestBurstStuckEvents: the final outcome of a provider call is written
// even when the job's context is cancelled, and an event left open longer
// than StuckAfter is marked failed, so it stops counting in flight.
func TestBurstStuckEvents(t *testing.T) {
	l, b := bootBurst(t, func(m *Main) jobs.BurstConfig {
		return jobs.BurstConfig{Provider: &burst.ExecProvider{Command: "/bin/true"}, GPUType: "A100-spot", GPUsPerNode: 8,
			RetryBackoff: 50 * time.Millisecond, MaxAttempts: 3, StuckAfter: time.Hour}
	})
	ctx := context.Background()
	newRequest := func() int64 {
		e := store.BurstEvent{Kind: store.BurstRequest, Provider: "exec", Reason: "test", NodesWanted: 2, GPUType: "A100-spot", GPUsPerNode: 8}
		if err := l.m.Store.CreateBurstEvent(ctx, &e); err != nil {
			t.Fatal(err)
		}
		return e.ID
	}
	// The last attempt runs out of time (the job's context ends during the
	// provider call): its outcome is stored anyway.
	slow := filepath.Join(t.TempDir(), "slow")
	if err := os.WriteFile(slow, []byte("#!/bin/sh\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := b.Config
	cfg.Provider = &burst.ExecProvider{Command: slow}
	id := newRequest()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := jobs.NewBurster(l.m.Store, nil, cfg).Call(cctx, id, 3, 3); err == nil {
		t.Fatal("a provider call cut by its context succeeded")
	}
	if e := l.burstEvent(id); e.Status != store.BurstFailed || e.Attempts != 3 {
		t.Fatalf("event after its last attempt was cancelled: %+v, want failed", e)
	}
	// A request whose job died while retrying is given up on.
	id = newRequest()
	if _, err := l.m.Pool.Exec(ctx, `UPDATE burst_events SET status = 'retrying', attempts = 1, error = 'boom', at = $2::timestamptz - interval '2 hours' WHERE id = $1`, id, l.m.Store.Now()); err != nil {
		t.Fatal(err)
	}
	fresh := newRequest()
	if n, err := l.m.Store.BurstInFlight(ctx); err != nil || n != 4 {
		t.Fatalf("in flight %d, %v; want 4", n, err)
	}
	ev := l.evaluate(b)
	if !slices.Equal(ev.Failed, []int64{id}) || ev.View.InFlight != 2 {
		t.Fatalf("evaluation failed %v with %d in flight; want %d failed and the fresh request's 2 in flight", ev.Failed, ev.View.InFlight, id)
	}
	if e := l.burstEvent(id); e.Status != store.BurstFailed || !strings.Contains(e.Error, "boom") || !strings.Contains(e.Error, "no outcome since") {
		t.Fatalf("stuck event %+v", e)
	}
	if e := l.burstEvent(fresh); e.Status != store.BurstPending {
		t.Fatalf("fresh event %+v, want still pending", e)
	}
}
