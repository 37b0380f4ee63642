package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// putPolicy saves body through PUT /api/v1/policy as the admin.
func (e *env) putPolicy(body string) {
	e.t.Helper()
	if status, _, b := e.api("PUT", "/api/v1/policy", demo.Admin, body); status != http.StatusOK {
		e.t.Fatalf("PUT /api/v1/policy %s: %d %s", body, status, b)
	}
}

// docsText returns the text of the /docs element with data-testid id.
func (e *env) docsText(id string) string {
	e.t.Helper()
	status, page := e.login(demo.Engineer).get("/docs")
	if status != http.StatusOK {
		e.t.Fatalf("GET /docs: %d", status)
	}
	d, err := goquery.NewDocumentFromReader(strings.NewReader(page))
	if err != nil {
		e.t.Fatal(err)
	}
	return strings.TrimSpace(d.Find(`[data-testid="` + id + `"]`).Text())
}

func (e *env) cycleCount() int {
	e.t.Helper()
	var n int
	if err := e.m.Pool.QueryRow(context.Background(), `SELECT count(*) FROM scheduling_cycles`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestLivePolicyCycleAndHeartbeat changes the scheduling period and the
// silence after which a node is down through the admin API on a running
// Allot, and watches the worker follow each within a cycle; /docs shows
// the values in force.
func TestLivePolicyCycleAndHeartbeat(t *testing.T) {
	l := bootLive(t, "gpu13")
	if c, h := l.docsText("docs-cycle"), l.docsText("docs-heartbeat-missed"); c != "1s" || h != "1s" {
		t.Errorf("/docs: cycle %q, node down after %q; want the live tests' 1s and 1s", c, h)
	}
	if f := l.docsText("docs-tier1-fifo"); !strings.Contains(f, "Tier 1 (incident) jobs are served oldest first") {
		t.Errorf("/docs does not say tier 1 is served oldest first: %q", f)
	}

	// Nodes: a silent node stays up for the hour the policy now allows…
	l.putPolicy(`{"heartbeat_missed_after_s": 3600}`)
	if h := l.docsText("docs-heartbeat-missed"); h != "1h" {
		t.Errorf("/docs after the change: node down after %q", h)
	}
	l.links["gpu13"].Store(false)
	time.Sleep(3 * time.Second) // 10 heartbeats missed, 20 sweeps
	l.waitNode("gpu13", allot.NodeUp)
	// …and is marked down once the limit is a second again.
	l.putPolicy(`{"heartbeat_missed_after_s": 1}`)
	l.waitNode("gpu13", allot.NodeDown)
	l.links["gpu13"].Store(true)
	l.waitNode("gpu13", allot.NodeUp)

	// Cycles: with an hour's period, none runs unasked for (the save
	// itself asks for one)…
	l.putPolicy(`{"cycle_s": 3600}`)
	if c := l.docsText("docs-cycle"); c != "1h" {
		t.Errorf("/docs after the change: cycle %q", c)
	}
	// A deadline, not a speed: with the whole suite on 2 cores a cycle
	// can wait seconds for River and the cycle lock (10 s was once short).
	l.eventually(30*time.Second, "the cycle the save asked for", func() bool {
		var v int64
		l.m.Pool.QueryRow(context.Background(), `SELECT count(*) FROM scheduling_cycles WHERE started_at >= (SELECT max(created_at) FROM policy_versions)`).Scan(&v) //nolint:errcheck
		return v > 0
	})
	// Events just before (gpu13 coming back up) may still ask for one:
	// wait until a second passes without a cycle.
	n := l.cycleCount()
	for range 10 {
		time.Sleep(time.Second)
		m := l.cycleCount()
		if m == n {
			break
		}
		n = m
	}
	time.Sleep(3 * time.Second)
	if got := l.cycleCount(); got != n {
		t.Errorf("%d cycles in 3 s with cycle_s 3600", got-n)
	}
	// …while a submit, and the job's end, still run one at once.
	j := l.submit(demo.Admin, `{"team":"recs","tier":3,"gpus":1,"gpu_type":"T4","time_limit":"5m","command":["true"]}`)
	l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == string(allot.JobCompleted) }, "completed")
	// A 1-second period: cycles again every second.
	l.putPolicy(`{"cycle_s": 1}`)
	n = l.cycleCount()
	l.eventually(20*time.Second, "3 periodic cycles", func() bool { return l.cycleCount() >= n+3 })
}

// TestPolicyHeartbeatLimitIsHonest: the API refuses a silence limit
// shorter than two heartbeats, and /docs shows the limit that applies
// when the stored one is shorter (saved before the heartbeat interval
// grew).
func TestPolicyHeartbeatLimitIsHonest(t *testing.T) {
	e := boot(t) // agents heartbeat every 10 s
	if h := e.docsText("docs-heartbeat-missed"); h != "1m" {
		t.Errorf("/docs: node down after %q, want the default 1m", h)
	}
	status, _, body := e.api("PUT", "/api/v1/policy", demo.Admin, `{"heartbeat_missed_after_s": 10}`)
	var p web.Problem
	json.Unmarshal(body, &p) //nolint:errcheck
	if status != http.StatusUnprocessableEntity || !strings.Contains(p.Errors["heartbeat_missed_after_s"], "at least 20s") {
		t.Errorf("PUT heartbeat_missed_after_s 10: %d %s", status, body)
	}
	ctx := context.Background()
	pol, err := e.m.Store.CurrentPolicy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pol.HeartbeatMissedAfter, pol.CreatedBy = 5*time.Second, "test"
	if err := e.m.Store.InsertPolicy(ctx, &pol); err != nil {
		t.Fatal(err)
	}
	if h := e.docsText("docs-heartbeat-missed"); h != "20s" {
		t.Errorf("/docs with 5 s stored and 10 s heartbeats: node down after %q, want 20s", h)
	}
	// This Allot has no cloud provider: /docs says burst is off.
	if off := e.docsText("docs-burst-off"); !strings.Contains(off, "no cloud provider") {
		t.Errorf("/docs burst: %q", off)
	}
}
