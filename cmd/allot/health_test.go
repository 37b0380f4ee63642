package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agent"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/health"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
)

// startAgentCLI runs `allot agent` in-process from its command line (the
// code path of the real binary: flags, fake backend with a fault file,
// --health-cmd) until the test ends.
func (l *live) startAgentCLI(node string, extra ...string) {
	l.t.Helper()
	tok, err := l.m.Store.CreateNodeToken(context.Background(), node, "test")
	if err != nil {
		l.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	args := append([]string{"--server", l.url, "--token", tok, "--hostname", node, "--gpu", "fake", "--fake-model", "A100-80GB",
		"--heartbeat", testHeartbeat.String(), "--metrics-addr", "", "--log-level", "error"}, extra...)
	args = append(args, localAgentFlags(l.t, node)...)
	done := make(chan int, 1)
	var stderr syncBuffer
	go func() { done <- agent.MainContext(ctx, args, io.Discard, &stderr) }()
	l.agents[node] = func() {
		cancel()
		if rc := <-done; rc != 0 {
			l.t.Errorf("agent %s exited %d: %s", node, rc, stderr.String())
		}
	}
	l.waitNode(node, allot.NodeUp)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (l *live) node(name string) web.NodeDetailJSON {
	l.t.Helper()
	code, _, b := l.api("GET", "/api/v1/nodes/"+name, demo.Engineer, "")
	if code != http.StatusOK {
		l.t.Fatalf("node %s: %d %s", name, code, b)
	}
	var n web.NodeDetailJSON
	if err := json.Unmarshal(b, &n); err != nil {
		l.t.Fatal(err)
	}
	return n
}

func writeFaults(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // atomic: the agent never reads half a file
		t.Fatal(err)
	}
}

func (e *env) auditCount(t *testing.T) (entries, version int) {
	t.Helper()
	ctx := context.Background()
	if err := e.m.Pool.QueryRow(ctx, `SELECT count(*) FROM audit_log`).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM policy_versions`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	return entries, version
}

// A drained node takes no new job; an admin's drain and undrain are
// audited with their reason and note; once undrained it runs the job that
// waited.
func TestHealthDrainedNodeTakesNoJob(t *testing.T) {
	l := bootLive(t, "gpu01", "gpu02")
	code, _, b := l.api("POST", "/api/v1/nodes/gpu01/drain", demo.Admin, `{"reason":"replacing a fan"}`)
	if code != http.StatusOK || !strings.Contains(string(b), `"state": "drained"`) {
		t.Fatalf("drain: %d %s", code, b)
	}
	// Two whole-node jobs: one fits on gpu02, the other must wait.
	cmd := jsonCmd("sh", "-c", "sleep 30")
	j1 := l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":8,"gpu_type":"A100-80GB","time_limit":"5m","command":`+cmd+`}`)
	j2 := l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":8,"gpu_type":"A100-80GB","time_limit":"5m","command":`+cmd+`}`)
	l.eventually(20*time.Second, "one job running", func() bool {
		return l.job(j1.ID).State == "running" || l.job(j2.ID).State == "running"
	})
	time.Sleep(3 * time.Second) // three scheduling cycles
	waiting := j2
	if l.job(j2.ID).State == "running" {
		waiting = j1
	}
	if st := l.job(waiting.ID).State; st != "pending" {
		t.Fatalf("second job is %s, want pending: the drained node took it", st)
	}
	var onDrained int
	l.m.Pool.QueryRow(context.Background(), `SELECT count(*) FROM allocations WHERE node = 'gpu01' AND job_id IN ($1, $2)`, j1.ID, j2.ID).Scan(&onDrained) //nolint:errcheck
	if onDrained != 0 {
		t.Fatalf("%d GPUs allocated on the drained node", onDrained)
	}
	if n := l.node("gpu01"); n.State != "drained" || n.Reason != "admin: replacing a fan" || n.DrainSource != "admin" {
		t.Errorf("drained node = %+v", n.NodeJSON)
	}
	// The node page says why.
	br := l.login(demo.Engineer)
	if _, page := br.get("/nodes/gpu01"); !strings.Contains(page, `data-testid="why-text"`) || !strings.Contains(page, "replacing a fan") ||
		strings.Contains(page, `data-testid="undrain-form"`) {
		t.Errorf("node page for an engineer lacks the reason or shows admin forms")
	}
	// Undrain with a note: the waiting job starts there.
	code, _, b = l.api("POST", "/api/v1/nodes/gpu01/undrain", demo.Admin, `{"note":"fan replaced, burn-in passed"}`)
	if code != http.StatusOK {
		t.Fatalf("undrain: %d %s", code, b)
	}
	l.waitJob(waiting.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running after the undrain")
	entries, err := l.m.Store.AuditLog(context.Background(), store.AuditFilter{Object: "node:gpu01"})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Action != "node.undrain" || entries[0].Note != "fan replaced, burn-in passed" ||
		entries[0].Actor != demo.PersonaEmail[demo.Admin] || entries[1].Action != "node.drain" || entries[1].Note != "replacing a fan" {
		t.Errorf("audit = %+v", entries)
	}
	for _, id := range []int64{j1.ID, j2.ID} {
		l.api("POST", fmt.Sprintf("/api/v1/jobs/%d/cancel", id), demo.Engineer, "")
	}
}

// A double-bit ECC error injected into a running fake-GPU agent drains its
// node at the next heartbeat: the event is recorded with the GPU history,
// admins get a notification and the admin webhook, and the node page
// shows why.
func TestHealthECCDrainsWithinOneHeartbeat(t *testing.T) {
	l := bootLive(t)
	var mu sync.Mutex
	var hooks []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		hooks = append(hooks, string(b))
		mu.Unlock()
	}))
	defer hook.Close()
	if err := l.m.Store.SetAdminWebhook(context.Background(), "test", hook.URL); err != nil {
		t.Fatal(err)
	}
	faults := filepath.Join(t.TempDir(), "faults.json")
	l.startAgentCLI("gpu03", "--fake-faults", faults)
	time.Sleep(3 * testHeartbeat) // some healthy history
	injected := clock.Now()
	writeFaults(t, faults, `{"gpus":[{"index":5,"ecc_dbe":1}]}`)
	var drainedAfter time.Duration
	l.eventually(10*time.Second, "gpu03 drained", func() bool {
		ok := l.node("gpu03").State == allot.NodeDrained
		if ok {
			drainedAfter = time.Since(injected)
		}
		return ok
	})
	ctx := context.Background()
	// Within one heartbeat: exactly one heartbeat reported the error before
	// (and including) the one that drained the node.
	var eventAt time.Time
	var evID int64
	if err := l.m.Pool.QueryRow(ctx, `SELECT id, at FROM health_events WHERE node = 'gpu03' AND rule_name = 'ecc-double-bit'`).Scan(&evID, &eventAt); err != nil {
		t.Fatal(err)
	}
	var faultyBeats int
	l.m.Pool.QueryRow(ctx, `SELECT count(DISTINCT at) FROM gpu_samples WHERE node = 'gpu03' AND ecc_dbe_vol > 0 AND at <= $1`, eventAt).Scan(&faultyBeats) //nolint:errcheck
	if faultyBeats != 1 {
		t.Errorf("%d heartbeats carried the ECC error before the drain, want 1", faultyBeats)
	}
	t.Logf("measured: injected ECC error → node drained in %v (heartbeat %v)", drainedAfter.Round(time.Millisecond), testHeartbeat)
	n := l.node("gpu03")
	if n.DrainSource != "health" || !strings.Contains(n.Reason, "ecc-double-bit") || !strings.Contains(n.Reason, "GPU 5: 1 double-bit ECC errors") {
		t.Errorf("node = %+v", n.NodeJSON)
	}
	if len(n.Events) != 1 || n.Events[0].Action != "drain" || n.Events[0].GPUs[0] != 5 || len(n.Events[0].Samples) < 8*3 {
		t.Fatalf("events = %+v", n.Events)
	}
	// The evidence includes the healthy readings before the error.
	var clean, faulty int
	for _, s := range n.Events[0].Samples {
		if s.GPU == 5 && s.ECCDBE == 0 {
			clean++
		}
		if s.GPU == 5 && s.ECCDBE > 0 {
			faulty++
		}
	}
	if clean < 2 || faulty != 1 {
		t.Errorf("history of GPU 5: %d clean, %d faulty readings", clean, faulty)
	}
	// Audited as the system; a notification; the admin webhook.
	entries, _ := l.m.Store.AuditLog(ctx, store.AuditFilter{Object: "node:gpu03", Action: "node.drain"})
	if len(entries) != 1 || entries[0].Actor != allot.ActorSystem {
		t.Errorf("audit = %+v", entries)
	}
	l.eventually(10*time.Second, "admin webhook", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(hooks) == 1 && strings.Contains(hooks[0], "gpu03") && strings.Contains(hooks[0], "ecc-double-bit")
	})
	br := l.login(demo.Admin)
	_, page := br.get("/nodes")
	if !strings.Contains(page, `data-testid="open-events"`) || !strings.Contains(page, `data-testid="notification" data-unread="true"`) {
		t.Errorf("/nodes lacks the open event or the notification")
	}
	_, page = br.get("/nodes/gpu03")
	for _, want := range []string{`data-testid="why-text"`, "GPU 5: 1 double-bit ECC errors", `data-testid="chart-temp"`, "<polyline", `data-testid="undrain-form"`} {
		if !strings.Contains(page, want) {
			t.Errorf("node page lacks %s", want)
		}
	}
	// The error stays (volatile counter): no second event, still drained.
	time.Sleep(3 * testHeartbeat)
	if n := l.node("gpu03"); len(n.Events) != 1 || n.State != allot.NodeDrained {
		t.Errorf("after more heartbeats: state %s, %d events", n.State, len(n.Events))
	}
}

// drain-and-requeue stops the node's running job with the policy's grace
// (the job sees SIGTERM) and puts it back in the queue.
func TestHealthDrainAndRequeue(t *testing.T) {
	l := bootLive(t)
	rules := `{"rules":[{"name":"xid-requeue","metric":"xid","match":[79],"severity":"critical","action":"drain-and-requeue"}],"auto_undrain_after":"0s"}`
	if code, _, b := l.api("PUT", "/api/v1/health/rules", demo.Admin, rules); code != http.StatusOK {
		t.Fatalf("rules: %d %s", code, b)
	}
	faults := filepath.Join(t.TempDir(), "faults.json")
	l.startAgentCLI("gpu04", "--fake-faults", faults)
	dir := jobTempDir(t)
	j := l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":2,"gpu_type":"A100-80GB","time_limit":"5m","checkpointable":true,"command":`+
		jsonCmd("sh", "-c", `trap 'echo term >> `+dir+`/marker; sleep 0.5; exit 0' TERM; while true; do sleep 0.1; done`)+`}`)
	l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	l.eventually(10*time.Second, "process started", func() bool {
		var st string
		l.m.Pool.QueryRow(context.Background(), `SELECT state FROM leases WHERE job_id = $1`, j.ID).Scan(&st) //nolint:errcheck
		return st == "running"
	})
	writeFaults(t, faults, `{"gpus":[{"index":0,"xids":[79]}]}`)
	got := l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "pending" && j.Segment == 1 }, "requeued")
	if got.EndReason != "" || got.ExitCode != nil {
		t.Errorf("requeued job = %+v", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "marker")); string(b) != "term\n" {
		t.Errorf("the job did not see SIGTERM once: %q", b)
	}
	var grace int
	var reason, signal string
	l.m.Pool.QueryRow(context.Background(), `SELECT stop_grace_s, stop_reason, exit_signal FROM leases WHERE job_id = $1 AND segment = 1`, j.ID).Scan(&grace, &reason, &signal) //nolint:errcheck
	if grace != 2 || reason != "drain" || signal == "SIGKILL" {
		t.Errorf("lease: grace %d s, reason %q, signal %q; want the policy's 2 s, drain, no SIGKILL", grace, reason, signal)
	}
	l.eventually(10*time.Second, "gpu04 drained", func() bool { return l.node("gpu04").State == allot.NodeDrained })
	n := l.node("gpu04")
	if len(n.Events) != 1 || len(n.Events[0].Requeued) != 1 || n.Events[0].Requeued[0] != j.ID {
		t.Errorf("events = %+v", n.Events)
	}
	// It does not run on the drained node again.
	time.Sleep(2 * time.Second)
	if st := l.job(j.ID).State; st != "pending" {
		t.Errorf("job is %s after the drain, want pending", st)
	}
	l.api("POST", fmt.Sprintf("/api/v1/jobs/%d/cancel", j.ID), demo.Engineer, "")
}

// A failing --health-cmd reports the node unhealthy with its output; once
// it passes for the policy's AutoUndrainAfter, the node is undrained
// automatically (actor "system", audited).
func TestHealthCmdAndAutoUndrain(t *testing.T) {
	l := bootLive(t)
	if code, _, b := l.api("PUT", "/api/v1/health/rules", demo.Admin,
		`{"rules":[{"name":"health-check","metric":"health_check","severity":"critical","action":"drain"}],"auto_undrain_after":"1s"}`); code != http.StatusOK {
		t.Fatalf("rules: %d %s", code, b)
	}
	dir := jobTempDir(t)
	check := filepath.Join(dir, "check-gpus")
	script := func(body string) {
		writeFaults(t, check, "#!/bin/sh\n"+body+"\n")
		os.Chmod(check, 0o755) //nolint:errcheck
	}
	script(`echo "NVLink 3 on GPU 2 is down"; exit 3`)
	// The interval is also the check's timeout: at 200 ms a full suite's
	// load once timed the shell script out, and the node drained with
	// "timed out" instead of the script's output.
	l.startAgentCLI("gpu05", "--health-cmd", check, "--health-interval", "1s")
	l.eventually(10*time.Second, "gpu05 drained", func() bool { return l.node("gpu05").State == allot.NodeDrained })
	n := l.node("gpu05")
	if !strings.Contains(n.Reason, "NVLink 3 on GPU 2 is down") || !strings.Contains(n.HealthOutput, "exit status 3: NVLink 3 on GPU 2 is down") {
		t.Errorf("node = %+v", n.NodeJSON)
	}
	br := l.login(demo.Engineer)
	if _, page := br.get("/nodes/gpu05"); !strings.Contains(page, `data-testid="health-output"`) || !strings.Contains(page, "NVLink 3 on GPU 2 is down") {
		t.Errorf("node page lacks the health check output")
	}
	// Fixed: it passes, and a second later it is back up by itself.
	fixed := clock.Now()
	script(`echo ok`)
	l.eventually(15*time.Second, "gpu05 undrained automatically", func() bool { return l.node("gpu05").State == allot.NodeUp })
	t.Logf("measured: health check fixed → undrained automatically in %v (auto_undrain_after 1s)", time.Since(fixed).Round(time.Millisecond))
	entries, _ := l.m.Store.AuditLog(context.Background(), store.AuditFilter{Object: "node:gpu05"})
	if len(entries) != 2 || entries[0].Action != "node.undrain" || entries[0].Actor != allot.ActorSystem || !strings.Contains(entries[0].Note, "passed its health checks") ||
		entries[1].Action != "node.drain" || entries[1].Actor != allot.ActorSystem {
		t.Errorf("audit = %+v", entries)
	}
	if n := l.node("gpu05"); n.HealthOutput != "" || n.Events[0].ResolvedAt == nil {
		t.Errorf("after the fix: output %q, event resolved %v", n.HealthOutput, n.Events[0].ResolvedAt)
	}
}

// Bad input changes nothing: unknown node 404, empty reason 422, non-admin
// 403, unknown metric/action/severity 422 with field errors, a down node
// 409 — through the API and the portal forms.
func TestHealthAdminBadInput(t *testing.T) {
	e := boot(t)
	ctx := context.Background()
	// No queued work, so no cycle places a job on gpu07 once it is up (the
	// CLI drain below expects an empty node to go straight to drained).
	if _, err := e.m.Pool.Exec(ctx, `UPDATE jobs SET state = 'cancelled', ended_at = $1 WHERE state = 'pending'`, e.m.Store.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Pool.Exec(ctx, `UPDATE nodes SET state = 'up' WHERE name = 'gpu07'`); err != nil {
		t.Fatal(err)
	}
	entries, version := e.auditCount(t)
	for _, c := range []struct {
		method, path, persona, body string
		status                      int
		field                       string
	}{
		{"POST", "/api/v1/nodes/nope/drain", demo.Admin, `{"reason":"x"}`, 404, ""},
		{"POST", "/api/v1/nodes/nope/undrain", demo.Admin, `{"note":"x"}`, 404, ""},
		{"GET", "/api/v1/nodes/nope", demo.Admin, "", 404, ""},
		{"PUT", "/api/v1/nodes/nope/labels", demo.Admin, `{"labels":{"a":"b"}}`, 404, ""},
		{"POST", "/api/v1/nodes/gpu07/drain", demo.Admin, `{"reason":"  "}`, 422, "reason"},
		{"POST", "/api/v1/nodes/gpu07/drain", demo.Admin, `{"reason":"x","force":true}`, 422, "force"},
		{"POST", "/api/v1/nodes/gpu07/drain", demo.Lead, `{"reason":"x"}`, 403, ""},
		{"POST", "/api/v1/nodes/gpu07/drain", demo.Engineer, `{"reason":"x"}`, 403, ""},
		{"POST", "/api/v1/nodes/gpu08/drain", demo.Admin, `{"reason":"x"}`, 409, ""}, // down
		{"POST", "/api/v1/nodes/gpu07/undrain", demo.Admin, `{"note":"x"}`, 409, ""}, // not drained
		{"POST", "/api/v1/nodes/gpu07/undrain", demo.Admin, `{"note":""}`, 422, "note"},
		{"PUT", "/api/v1/nodes/gpu07/labels", demo.Admin, `{"labels":{"Bad Key":"x"}}`, 422, "labels.Bad Key"},
		{"PUT", "/api/v1/nodes/gpu07/labels", demo.Finance, `{"labels":{"a":"b"}}`, 403, ""},
		{"PUT", "/api/v1/nodes/nope/inventory", demo.Admin, `{"gpu_type":"T4","gpus":8}`, 404, ""},
		{"PUT", "/api/v1/nodes/gpu07/inventory", demo.Admin, `{"gpu_type":"T4","gpus":"eight"}`, 422, "gpus"},
		{"PUT", "/api/v1/nodes/gpu07/inventory", demo.Admin, `{"gpu_type":"B300","gpus":8}`, 422, "gpu_type"},
		{"PUT", "/api/v1/nodes/gpu07/inventory", demo.Admin, `{"gpu_type":"T4","gpus":0}`, 422, "gpus"},
		{"PUT", "/api/v1/nodes/gpu07/inventory", demo.Lead, `{"gpu_type":"T4","gpus":8}`, 403, ""},
		{"PUT", "/api/v1/health/rules", demo.Admin, `{"rules":[{"name":"t","metric":"temperature","severity":"critical","action":"drain"}]}`, 422, "rules[0].metric"},
		{"PUT", "/api/v1/health/rules", demo.Admin, `{"rules":[{"name":"t","metric":"xid","severity":"fatal","action":"reboot","for":"soon"}]}`, 422, "rules[0].action"},
		{"PUT", "/api/v1/health/rules", demo.Lead, `{"rules":[]}`, 403, ""},
		{"GET", "/api/v1/notifications", demo.Engineer, "", 403, ""},
	} {
		code, _, b := e.api(c.method, c.path, c.persona, c.body)
		if code != c.status {
			t.Errorf("%s %s as %s: %d %s, want %d", c.method, c.path, c.persona, code, b, c.status)
			continue
		}
		if c.field != "" {
			var p web.Problem
			json.Unmarshal(b, &p) //nolint:errcheck
			if p.Errors[c.field] == "" {
				t.Errorf("%s %s: no error for %s: %s", c.method, c.path, c.field, b)
			}
		}
	}
	// The portal form: an empty reason shows the field error, a non-admin is refused.
	br := e.login(demo.Admin)
	code, page := br.get("/nodes/gpu07")
	if code != 200 || !strings.Contains(page, `data-testid="drain-form"`) {
		t.Fatalf("node page: %d", code)
	}
	if code, page := br.post("/nodes/gpu07/drain", page, url.Values{"reason": {""}}); code != 422 || !strings.Contains(page, `data-testid="error-reason"`) {
		t.Errorf("empty reason form: %d", code)
	}
	if code, page := br.post("/admin/health", healthPage(t, br), url.Values{"rules": {"1"}, "name_0": {"x"}, "metric_0": {"ecc_dbe"},
		"severity_0": {"urgent"}, "action_0": {"drain"}, "auto_undrain_after": {"-5m"}}); code != 422 ||
		!strings.Contains(page, `data-testid="error-rules[0].severity"`) || !strings.Contains(page, `data-testid="error-auto_undrain_after"`) {
		t.Errorf("bad rules form: %d", code)
	}
	// An admin webhook at this machine or a private network is refused
	// (as a team's is), and the valid rules sent with it are not saved.
	for _, hook := range []string{"http://127.0.0.1:9/hook", "https://10.1.2.3/hook", "http://localhost/hook"} {
		if code, page := br.post("/admin/health", healthPage(t, br), url.Values{"rules": {"1"}, "name_0": {"x"}, "metric_0": {"ecc_dbe"},
			"severity_0": {"critical"}, "action_0": {"drain"}, "auto_undrain_after": {"0s"}, "webhook": {hook}}); code != 422 ||
			!strings.Contains(page, `data-testid="error-webhook"`) {
			t.Errorf("webhook %s: %d", hook, code)
		}
	}
	// The CLI: a non-zero exit with the server's message.
	if rc, _, errOut := e.cli(demo.Admin, "node", "drain", "gpu07"); rc != 1 || !strings.Contains(errOut, "reason: is required") {
		t.Errorf("cli drain without reason: %d %q", rc, errOut)
	}
	if rc, _, errOut := e.cli(demo.Lead, "node", "drain", "gpu07", "--reason", "x"); rc != 1 || !strings.Contains(errOut, "allot node drain:") {
		t.Errorf("cli drain as lead: %d %q", rc, errOut)
	}
	eng := e.login(demo.Engineer)
	_, npage := eng.get("/nodes/gpu07")
	if code, _ := eng.post("/nodes/gpu07/drain", npage, url.Values{"reason": {"mine now"}}); code != 403 {
		t.Errorf("engineer drain form: %d, want 403", code)
	}
	if code, _ := eng.get("/admin/health"); code != 403 {
		t.Errorf("engineer /admin/health: %d", code)
	}
	if n, v := e.auditCount(t); n != entries || v != version {
		t.Errorf("bad input changed something: audit %d → %d, policy version %d → %d", entries, n, version, v)
	}
	var state string
	e.m.Pool.QueryRow(ctx, `SELECT state FROM nodes WHERE name = 'gpu07'`).Scan(&state) //nolint:errcheck
	if state != "up" {
		t.Errorf("gpu07 is %s", state)
	}
	// And good input: labels are a policy change, rules too.
	code, _, b := e.api("PUT", "/api/v1/nodes/gpu07/labels", demo.Admin, `{"labels":{"rack-row":"b","cooling":"liquid"},"note":"inventory"}`)
	if code != 200 || !strings.Contains(string(b), `"cooling": "liquid"`) {
		t.Errorf("labels: %d %s", code, b)
	}
	code, _, b = e.api("PUT", "/api/v1/health/rules", demo.Admin,
		`{"rules":[{"name":"nvlink","metric":"xid","match":[74],"for":"0s","severity":"warning","action":"warn"},{"name":"hot","metric":"throttle","for":"90m","severity":"critical","action":"drain"}],"auto_undrain_after":"30m"}`)
	if code != 200 || !strings.Contains(string(b), `"for": "1h30m"`) || !strings.Contains(string(b), `"auto_undrain_after": "30m"`) {
		t.Errorf("rules: %d %s", code, b)
	}
	if n, v := e.auditCount(t); n != entries+2 || v != version+2 {
		t.Errorf("two changes: audit %d → %d, policy version %d → %d", entries, n, version, v)
	}
	acts, _ := e.m.Store.AuditLog(ctx, store.AuditFilter{Limit: 2})
	if len(acts) != 2 || acts[0].Action != "health.update" || acts[1].Action != "node.labels" {
		t.Errorf("audit = %+v", acts)
	}
	if code, page := br.get("/admin/health"); code != 200 || !strings.Contains(page, `value="nvlink"`) || !strings.Contains(page, `value="1h30m"`) {
		t.Errorf("/admin/health: %d", code)
	}
	// Drain and undrain from the CLI; both audited with the admin as actor.
	if rc, out, errOut := e.cli(demo.Admin, "node", "drain", "gpu07", "--reason", "PSU swap"); rc != 0 || out != "node gpu07 is drained\n" {
		t.Errorf("cli drain: %d %q %q", rc, out, errOut)
	}
	if rc, out, errOut := e.cli(demo.Admin, "node", "list"); rc != 0 || !strings.Contains(out, "admin: PSU swap") {
		t.Errorf("cli list: %d %q %q", rc, out, errOut)
	}
	if rc, out, errOut := e.cli(demo.Admin, "node", "undrain", "gpu07", "--note", "new PSU"); rc != 0 || out != "node gpu07 is up\n" {
		t.Errorf("cli undrain: %d %q %q", rc, out, errOut)
	}
	acts, _ = e.m.Store.AuditLog(ctx, store.AuditFilter{Object: "node:gpu07", Action: "node."})
	if len(acts) != 3 || acts[0].Action != "node.undrain" || acts[0].Note != "new PSU" || acts[0].Actor != demo.PersonaEmail[demo.Admin] ||
		acts[1].Action != "node.drain" || acts[1].Note != "PSU swap" {
		t.Errorf("audit = %+v", acts)
	}
}

// Throttling warns after 10 minutes and drains after an hour, with the
// per-rule "since" kept in the database between heartbeats (a fake clock
// drives the store).
func TestHealthThrottleWarnThenDrain(t *testing.T) {
	e := boot(t)
	ctx := context.Background()
	// A day ahead: the worker's lost-node check never sees this node silent.
	base := clock.Now().UTC().Add(24 * time.Hour).Truncate(time.Minute)
	now := base
	st := store.New(e.m.Pool)
	st.Now = func() time.Time { return now }
	if _, err := st.RegisterNode(ctx, "gpu10", store.NodeInventory{Hostname: "gpu10", Backend: "fake",
		GPUs: []store.NodeGPU{{Index: 0, UUID: "GPU-a", Model: "A100-80GB"}, {Index: 1, UUID: "GPU-b", Model: "A100-80GB"}}}); err != nil {
		t.Fatal(err)
	}
	hot := []health.GPU{{Index: 0}, {Index: 1, Throttle: allot.ThrottleHWThermal}}
	for _, s := range []struct {
		at     time.Duration
		gpus   []health.GPU
		state  string
		events int
	}{
		{0, hot, "up", 0},
		{9 * time.Minute, hot, "up", 0},
		{10 * time.Minute, hot, "up", 1}, // warn
		{30 * time.Minute, hot, "up", 1},
		{60 * time.Minute, hot, "drained", 2}, // drain (no jobs: drained at once)
		{61 * time.Minute, []health.GPU{{Index: 0}, {Index: 1}}, "drained", 2},
	} {
		now = base.Add(s.at)
		out, err := st.EvaluateHealth(ctx, "gpu10", s.gpus, "")
		if err != nil {
			t.Fatal(err)
		}
		evs, _ := st.HealthEvents(ctx, "gpu10", false, 10)
		if out.State != s.state || len(evs) != s.events {
			t.Errorf("at +%v: state %s, %d events; want %s, %d", s.at, out.State, len(evs), s.state, s.events)
		}
	}
	evs, _ := st.HealthEvents(ctx, "gpu10", false, 10)
	if len(evs) == 2 && (evs[0].Rule.Name != "throttle-drain" || evs[1].Rule.Name != "throttle-warn" || evs[1].Action != "warn" ||
		!evs[1].Since.Equal(base) || evs[0].ResolvedAt == nil) {
		t.Errorf("events = %+v", evs)
	}
	ns, _ := st.Notifications(ctx, true, 10)
	if len(ns) != 2 || ns[0].Kind != "health.drain" || ns[1].Kind != "health.warn" || !strings.Contains(ns[1].Message, "hardware thermal slowdown") {
		t.Errorf("notifications = %+v", ns)
	}
	// A drained node that goes silent and comes back stays drained, with its reason.
	inv := store.NodeInventory{Hostname: "gpu10", Backend: "fake",
		GPUs: []store.NodeGPU{{Index: 0, UUID: "GPU-a", Model: "A100-80GB"}, {Index: 1, UUID: "GPU-b", Model: "A100-80GB"}}}
	if lost, err := st.MarkLostNodes(ctx, base.Add(2*time.Hour)); err != nil || !slices.Contains(lost, "gpu10") {
		t.Fatalf("lost: %v %v", lost, err)
	}
	if _, err := st.RegisterNode(ctx, "gpu10", inv); err != nil {
		t.Fatal(err)
	}
	if n, _ := st.NodeInfoByName(ctx, "gpu10"); n.State != allot.NodeDrained || !strings.HasPrefix(n.StateReason, "health rule throttle-drain") {
		t.Errorf("after coming back: %s %q", n.State, n.StateReason)
	}
	// No admin webhook configured: they are marked handled, nothing is sent.
	sent, err := st.DeliverNotifications(ctx, func(pgx.Tx, string, store.Notification) error {
		t.Error("delivered without an admin webhook")
		return nil
	})
	var left int
	e.m.Pool.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE webhook_sent_at IS NULL`).Scan(&left) //nolint:errcheck
	if err != nil || sent != 0 || left != 0 {
		t.Errorf("deliver: %d sent, %d left, %v", sent, left, err)
	}
}

func healthPage(t *testing.T, b *browser) string {
	t.Helper()
	code, page := b.get("/admin/health")
	if code != 200 {
		t.Fatalf("/admin/health: %d", code)
	}
	return page
}

// TestBrowserNodeHealth: an admin in a real browser sees the node an
// injected ECC error drained, why, and its GPU history, then undrains it
// with a note (an empty note is refused inline first).
func TestBrowserNodeHealth(t *testing.T) {
	l := bootLive(t)
	faults := filepath.Join(t.TempDir(), "faults.json")
	l.startAgentCLI("gpu06", "--fake-faults", faults)
	time.Sleep(4 * testHeartbeat)
	writeFaults(t, faults, `{"gpus":[{"index":2,"ecc_dbe":1}]}`)
	l.eventually(10*time.Second, "gpu06 drained", func() bool { return l.node("gpu06").State == allot.NodeDrained })
	b := browse(t)
	b.login(l.url+"/", demo.Admin, `[data-testid="nav-nodes"]`)
	b.do(chromedp.Navigate(l.url+"/nodes"),
		chromedp.WaitVisible(css(`[data-testid="open-events"]`)))
	screenshot(t, b.ctx, "nodes")
	if ev := b.text(`[data-testid="open-events"]`); !strings.Contains(ev, "gpu06") || !strings.Contains(ev, "ecc-double-bit") {
		t.Errorf("open events: %q", ev)
	}
	b.do(chromedp.Click(css(`[data-testid="node-gpu06"] a`)), chromedp.WaitVisible(css(`[data-testid="why"]`)))
	screenshot(t, b.ctx, "node-drained")
	if why := b.text(`[data-testid="why-text"]`); !strings.Contains(why, "GPU 2: 1 double-bit ECC errors") {
		t.Errorf("why: %q", why)
	}
	writeFaults(t, faults, `{"gpus":[]}`) // the GPU was reset
	b.do(chromedp.Click(css(`[data-testid="undrain-form"] button`)), chromedp.WaitVisible(css(`[data-testid="error-note"]`)))
	b.do(chromedp.SetValue(css(`#undrain-note`), "GPU 2 reseated, dcgmi diag -r 3 passed"),
		chromedp.Click(css(`[data-testid="undrain-form"] button`)),
		chromedp.WaitVisible(css(`[data-testid="saved"]`)))
	if st := b.text(`h1 [data-testid="node-state"]`); st != "up" {
		t.Errorf("state after undrain: %q", st)
	}
	if a := b.text(`[data-testid="node-audit"]`); !strings.Contains(a, "node.undrain") || !strings.Contains(a, "dcgmi diag -r 3 passed") {
		t.Errorf("audit on the page: %q", a)
	}
	screenshot(t, b.ctx, "node-undrained")
}

// BenchmarkEvaluateHealth measures what health evaluation adds to one
// heartbeat of an 8-GPU node with the default rules: the common case (all
// healthy, nothing changes) and a node with a rule holding (throttling
// under its 10-minute threshold).
func BenchmarkEvaluateHealth(b *testing.B) {
	e := bootBench(b, false)
	ctx := context.Background()
	for _, name := range []string{"hb-ok", "hb-hot"} {
		if err := e.m.Store.CreateNode(ctx, &allot.Node{Name: name, GPUType: "A100-80GB", GPUCount: 8, Site: allot.SiteOnPrem, State: allot.NodeDown}); err != nil {
			b.Fatal(err)
		}
		inv := store.NodeInventory{Hostname: name, Backend: "fake"}
		for g := range 8 {
			inv.GPUs = append(inv.GPUs, store.NodeGPU{Index: g, UUID: fmt.Sprintf("GPU-%s-%d", name, g), Model: "A100-80GB"})
		}
		if _, err := e.m.Store.RegisterNode(ctx, name, inv); err != nil {
			b.Fatal(err)
		}
	}
	ok := make([]health.GPU, 8)
	for i := range ok {
		ok[i].Index = i
	}
	hot := append([]health.GPU(nil), ok...)
	hot[3].Throttle = allot.ThrottleHWThermal
	for _, c := range []struct {
		name string
		gpus []health.GPU
	}{{"hb-ok", ok}, {"hb-hot", hot}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := e.m.Store.EvaluateHealth(ctx, c.name, c.gpus, ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
