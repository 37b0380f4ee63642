package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agent"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/testlock"
	"github.com/allotlabs/allot/web"
)

// The monitoring kit in deploy/: Prometheus's scrape config and alert
// rules, Grafana's dashboards.
const (
	promDir       = "../../deploy/prometheus"
	dashboardsDir = "../../deploy/grafana/dashboards"
)

// TestMonitoringDashboardsAgainstPrometheus runs a real Prometheus against
// a running Allot (server with its scrape token, worker with its metrics
// listener, two agents serving their dcgm-exporter-named series) that has
// run, preempted, finished and queued jobs, and asks it every query of
// every panel and variable of the Grafana dashboards: a query that errors
// or returns no series fails the test, named with its dashboard and
// panel. The alert rules load into that Prometheus and evaluate without
// error, and promtool checks the rules, the config and the rules' unit
// tests (alerts_test.yml).
func TestMonitoringDashboardsAgainstPrometheus(t *testing.T) {
	dashboards := loadDashboards(t)
	checkComposeMounts(t)
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (Debian: apt-get install prometheus; .ci/run installs it): the dashboards' queries and the alert rules are not checked")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("prometheus is installed but promtool is not: %v", err)
	}
	checkPromtool(t, promtool)

	// Allot: one process with the server (portal /metrics behind the
	// scrape token) and the worker (its own /metrics listener).
	scrapeToken := "scrape-" + strings.Repeat("x", 24)
	l := startLive(t, func(m *Main) {
		m.MetricsAddr, m.MetricsToken = "127.0.0.1:0", scrapeToken
	})
	// Its waits are bounded by time: not beside Slurm clusters. (After
	// startLive, which makes the test parallel: a lock held while paused
	// would stop the package's sequential Slurm tests.)
	testlock.Exclusive(t)
	agentURLs := []string{l.startMetricsAgent("gpu13"), l.startMetricsAgent("gpu01")}
	l.waitNode("gpu13", allot.NodeUp)
	l.waitNode("gpu01", allot.NodeUp)
	// Prometheus scrapes from before the workload, as in production: the
	// preemption and the starts show in rate() and increase().
	prom := startPrometheus(t, promBin, scrapeToken, hostPort(t, l.url), hostPort(t, l.m.MetricsURL()), agentURLs)
	prom.waitTargetsUp(t, 20*time.Second)
	l.monitoringWorkload()

	// The portal's /metrics refuses a scrape without the token.
	if resp, err := http.Get(l.url + "/metrics"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("portal /metrics without a token: %d, want 401", resp.StatusCode)
		}
	}

	// Every panel query and every variable query returns series. Rates
	// need two scrapes in their window, and the live-state gauges are
	// cached for a few seconds, so a query that is empty is asked again
	// until the deadline.
	var queries []dashQuery
	for _, d := range dashboards {
		queries = append(queries, d.queries()...)
	}
	if len(queries) < 60 {
		t.Fatalf("only %d dashboard queries found: did the dashboards' layout change?", len(queries))
	}
	failing := map[int]string{}
	for i := range queries {
		failing[i] = "not asked"
	}
	deadline := time.Now().Add(15 * time.Second)          // deadline (real time)
	for len(failing) > 0 && time.Now().Before(deadline) { // deadline (real time)
		for i := range failing {
			if why := prom.check(queries[i]); why == "" {
				delete(failing, i)
			} else {
				failing[i] = why
			}
		}
		if len(failing) > 0 {
			time.Sleep(time.Second)
		}
	}
	var bad []string
	for i, why := range failing {
		q := queries[i]
		bad = append(bad, fmt.Sprintf("%s / %s: %s\n    %s", q.dashboard, q.panel, why, q.expr))
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("%d of %d dashboard queries fail against Prometheus:\n%s", len(bad), len(queries), strings.Join(bad, "\n"))
	}
	t.Logf("%d dashboard queries of %d dashboards answered with series", len(queries)-len(bad), len(dashboards))

	// What the workload did shows: the preemption, the starts by tier,
	// the job on the agents' GPUs.
	for expr, least := range map[string]float64{
		`sum(increase(allot_preemptions_total{job="allot-worker"}[1m]))`:                                   1,
		`sum(increase(allot_job_wait_seconds_count{job="allot-worker"}[1m]))`:                              1,
		`sum(allot_preemptions_total{job="allot-worker"})`:                                                 1,
		`sum(allot_jobs_started_total{job="allot-worker",tier="1"})`:                                       1,
		`count(DCGM_FI_DEV_GPU_UTIL{job="allot-agent",allot_team="nlp"})`:                                  2,
		`sum(max without(instance, job) (allot_running_jobs{team="nlp"}))`:                                 1,
		`sum(max without(instance, job) (allot_pending_jobs))`:                                             1,
		`sum(allot_http_requests_total{job="allot-server",route="/api/v1/jobs",method="POST",code="201"})`: 3,
		`sum(max without(instance, job) (allot_total_gpus{state="up"}))`:                                   16,
		`max(allot_db_pool_max_conns{job="allot-worker"})`:                                                 1,
		`count(up{job=~"allot-server|allot-worker|allot-agent"} == 1)`:                                     4,
		`sum(max without(instance, job) (allot_node_state{node=~"gpu01|gpu13",state="up"}))`:               2,
		`sum(allot_scheduling_cycle_seconds_count{job="allot-worker",phase="apply"})`:                      1,
		`max(allot_billing_rollup_last_success_timestamp_seconds{job="allot-worker"})`:                     1,
		`sum(allot_river_job_duration_seconds_count{job="allot-worker",kind="schedule_cycle"})`:            1,
	} {
		v, err := prom.value(expr)
		if err != nil || v < least {
			t.Errorf("%s = %v (%v), want at least %v", expr, v, err, least)
		}
	}

	// The alert rules run in this Prometheus without evaluation errors.
	prom.checkRules(t)
}

// startMetricsAgent starts an in-process agent with 8 fake GPUs for node
// (as live.startAgent) and serves its /metrics; it returns that URL.
func (l *live) startMetricsAgent(node string) string {
	l.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tok, err := l.m.Store.CreateNodeToken(ctx, node, "test")
	if err != nil {
		l.t.Fatal(err)
	}
	nodes, err := l.m.Store.ListNodes(ctx)
	if err != nil {
		l.t.Fatal(err)
	}
	var domain, typ string
	for _, n := range nodes {
		if n.Name == node {
			domain, typ = n.Domain, n.GPUType
		}
	}
	a := agent.New(agent.Local(agent.Config{Server: l.url, Token: tok, Hostname: node, Domain: domain, HeartbeatInterval: testHeartbeat,
		OrdersWait: 5 * time.Second, StopGrace: 2 * time.Second, ShutdownGrace: time.Second, RetryMax: 200 * time.Millisecond,
		Backend: agent.NewFake(agent.FakeOptions{GPUs: 8, Model: typ, Hostname: node}),
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil))}))
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }() //nolint:errcheck
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.MetricsHandler())
	srv := httptest.NewServer(mux)
	l.agents[node] = func() { srv.Close(); cancel(); <-done }
	return srv.URL + "/metrics"
}

// monitoringWorkload leaves series for every panel: a job running on both
// agents' GPU types, finished jobs (one failed), a preemption, and a job
// that waits.
func (l *live) monitoringWorkload() {
	l.t.Helper()
	// Preemption: a preemptible job takes the 8 T4s of gpu13, a tier-1 job
	// takes them back.
	victim := l.submit(demo.Admin, `{"team":"recs","tier":"preemptible","gpus":8,"gpu_type":"T4","time_limit":"10m","checkpointable":true,"command":`+
		jsonCmd("sh", "-c", `trap 'exit 0' TERM; while true; do sleep 0.1; done`)+`}`)
	l.waitJob(victim.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	urgent := l.submit(demo.Admin, `{"team":"fraud","tier":1,"gpus":8,"gpu_type":"T4","time_limit":"10m","command":`+jsonCmd("sleep", "60")+`}`)
	// Meanwhile: nlp's job on 2 A100s keeps running (the GPUs carry its
	// team), two short ones end, one of them failing. The second start in
	// tier 3 comes after the first: a tier's wait histogram has a series
	// from its first start on, so only later starts show in increase().
	running := l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":2,"gpu_type":"A100-80GB","time_limit":"10m","command":`+jsonCmd("sleep", "60")+`}`)
	l.waitJob(running.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	time.Sleep(1500 * time.Millisecond) // a scrape in between
	ok := l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":1,"gpu_type":"A100-80GB","time_limit":"5m","command":`+jsonCmd("true")+`}`)
	failed := l.submit(demo.Engineer, `{"team":"nlp","tier":4,"gpus":1,"gpu_type":"A100-80GB","time_limit":"5m","command":`+jsonCmd("sh", "-c", "exit 3")+`}`)
	l.waitJob(ok.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "completed" }, "completed")
	l.waitJob(failed.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "failed" }, "failed")
	l.waitJob(urgent.ID, 30*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	// The victim waits for the T4s again (requeued, checkpointable).
	l.waitJob(victim.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "pending" && j.Preemptions == 1 }, "requeued")
	// The agent's GPU series carry the job once its process runs.
	l.eventually(10*time.Second, "nlp's job running on gpu01", func() bool {
		var st string
		l.m.Pool.QueryRow(context.Background(), `SELECT state FROM leases WHERE job_id = $1`, running.ID).Scan(&st) //nolint:errcheck
		return st == "running"
	})
}

// hostPort is the host:port of a URL.
func hostPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		t.Fatalf("no host in %q: %v", raw, err)
	}
	return u.Host
}

// checkComposeMounts checks that every file or folder of deploy/ that
// docker-compose.yml mounts exists, the monitoring profile's among them.
func checkComposeMounts(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	mounts := regexp.MustCompile(`(?m)^\s*- (\./deploy/[^:\s]+):`).FindAllStringSubmatch(string(b), -1)
	if len(mounts) < 4 {
		t.Fatalf("docker-compose.yml mounts %d paths of deploy/, want Prometheus's config and Grafana's provisioning and dashboards", len(mounts))
	}
	for _, m := range mounts {
		if _, err := os.Stat(filepath.Join("../..", m[1])); err != nil {
			t.Errorf("docker-compose.yml mounts %s: %v", m[1], err)
		}
	}
}

// checkPromtool runs promtool over deploy/prometheus: the rules, their
// unit tests, and the config (in a copy whose token file exists: promtool
// checks that it does).
func checkPromtool(t *testing.T, promtool string) {
	t.Helper()
	run := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run(promDir, "check", "rules", "alerts.yml")
	run(promDir, "test", "rules", "alerts_test.yml")
	tmp := t.TempDir()
	cfg, err := os.ReadFile(filepath.Join(promDir, "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	// The dashboards, the rules and this test's own scrape config select
	// on these job names.
	var jobs []string
	for _, m := range regexp.MustCompile(`(?m)^\s*- job_name: (\S+)`).FindAllStringSubmatch(string(cfg), -1) {
		jobs = append(jobs, m[1])
	}
	if strings.Join(jobs, " ") != "allot-server allot-worker allot-agent" {
		t.Errorf("prometheus.yml's scrape jobs are %q, want allot-server, allot-worker, allot-agent", jobs)
	}
	const tokenPath = "/run/allot-metrics/token"
	if !strings.Contains(string(cfg), tokenPath) {
		t.Fatalf("prometheus.yml reads the scrape token from somewhere else than %s, where docker-compose.yml puts it", tokenPath)
	}
	token := filepath.Join(tmp, "token")
	writeFile(t, token, "0123456789abcdef0123456789abcdef\n")
	writeFile(t, filepath.Join(tmp, "prometheus.yml"), strings.ReplaceAll(string(cfg), tokenPath, token))
	for _, f := range []string{"alerts.yml", "targets/agents.yml"} {
		b, err := os.ReadFile(filepath.Join(promDir, f))
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(tmp, f), string(b))
	}
	run(tmp, "check", "config", "prometheus.yml")
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// promServer is a running Prometheus server.
type promServer struct {
	url string
}

// startPrometheus starts Prometheus scraping the server (with the token),
// the worker's listener and the agents every second, with the alert rules
// of deploy/prometheus, on a free port and its own storage; the test's
// cleanup stops it and removes the storage.
func startPrometheus(t *testing.T, bin, token, server, worker string, agents []string) *promServer {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "token"), token+"\n")
	rules, err := filepath.Abs(filepath.Join(promDir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var agentTargets []string
	for _, a := range agents {
		agentTargets = append(agentTargets, fmt.Sprintf("%q", hostPort(t, a)))
	}
	// The job names are the ones deploy/prometheus/prometheus.yml gives:
	// the dashboards and rules select on them.
	writeFile(t, filepath.Join(dir, "prometheus.yml"), fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: allot-server
    authorization: {type: Bearer, credentials_file: %q}
    static_configs: [{targets: [%q]}]
  - job_name: allot-worker
    static_configs: [{targets: [%q]}]
  - job_name: allot-agent
    static_configs: [{targets: [%s]}]
`, rules, filepath.Join(dir, "token"), server, worker, strings.Join(agentTargets, ", ")))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() { // before t.TempDir's removal: registered after it
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus log:\n%s", b)
		}
	})
	p := &promServer{url: "http://" + addr}
	deadline := time.Now().Add(15 * time.Second) // a deadline for Prometheus to start: real clock
	for {
		resp, err := http.Get(p.url + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) { // deadline (real time)
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Fatalf("prometheus not ready after 15 s: %v\n%s", err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// api GETs a Prometheus API path and decodes its data into v; it returns
// the API's error, if any.
func (p *promServer) api(path string, query url.Values, v any) error {
	resp, err := http.Get(p.url + path + "?" + query.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("%s: %d, undecodable: %w", path, resp.StatusCode, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s", r.Error)
	}
	return json.Unmarshal(r.Data, v)
}

// waitTargetsUp waits until every scrape target is up.
func (p *promServer) waitTargetsUp(t *testing.T, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit) // deadline (real time)
	for {
		var d struct {
			ActiveTargets []struct {
				ScrapeURL string `json:"scrapeUrl"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"activeTargets"`
		}
		err := p.api("/api/v1/targets", nil, &d)
		var down []string
		for _, tg := range d.ActiveTargets {
			if tg.Health != "up" {
				down = append(down, fmt.Sprintf("%s: %s %s", tg.ScrapeURL, tg.Health, tg.LastError))
			}
		}
		if err == nil && len(d.ActiveTargets) == 4 && len(down) == 0 {
			return
		}
		if time.Now().After(deadline) { // deadline (real time)
			t.Fatalf("scrape targets not all up after %v (%d targets, %v): %s", limit, len(d.ActiveTargets), err, strings.Join(down, "; "))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// check asks one dashboard query: "" when it answers with series, else
// why not.
func (p *promServer) check(q dashQuery) string {
	if q.labelValues != "" {
		var vals []string
		if err := p.api("/api/v1/label/"+q.labelValues+"/values", url.Values{"match[]": {q.expr}}, &vals); err != nil {
			return "error: " + err.Error()
		}
		if len(vals) == 0 {
			return "no label values"
		}
		return ""
	}
	var d struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	}
	if err := p.api("/api/v1/query", url.Values{"query": {q.expr}}, &d); err != nil {
		return "error: " + err.Error()
	}
	if d.ResultType == "scalar" || len(d.Result) > 0 {
		return ""
	}
	return "no series"
}

// value is the single value of an instant query.
func (p *promServer) value(expr string) (float64, error) {
	var d struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	if err := p.api("/api/v1/query", url.Values{"query": {expr}}, &d); err != nil {
		return 0, err
	}
	if len(d.Result) != 1 {
		return 0, fmt.Errorf("%d series", len(d.Result))
	}
	var v float64
	s, _ := d.Result[0].Value[1].(string)
	_, err := fmt.Sscan(s, &v)
	return v, err
}

// checkRules waits for the rules' first evaluations and fails on a rule
// whose evaluation errs.
func (p *promServer) checkRules(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second) // deadline (real time)
	for {
		var d struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := p.api("/api/v1/rules", nil, &d); err != nil {
			t.Fatal(err)
		}
		var bad, unknown []string
		n := 0
		for _, g := range d.Groups {
			for _, r := range g.Rules {
				n++
				switch r.Health {
				case "ok":
				case "unknown":
					unknown = append(unknown, r.Name)
				default:
					bad = append(bad, fmt.Sprintf("%s: %s %s", r.Name, r.Health, r.LastError))
				}
			}
		}
		if len(bad) > 0 {
			t.Errorf("alert rules failing in Prometheus:\n%s", strings.Join(bad, "\n"))
			return
		}
		if n == 0 {
			t.Fatal("Prometheus loaded no alert rules")
		}
		if len(unknown) == 0 {
			return
		}
		if time.Now().After(deadline) { // deadline (real time)
			t.Fatalf("alert rules never evaluated: %v", unknown)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dashboard is the part of a Grafana dashboard JSON the test reads.
type dashboard struct {
	file       string
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Query      any    `json:"query"`
			Definition string `json:"definition"`
			Datasource any    `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashPanel `json:"panels"`
}

type dashPanel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource map[string]any `json:"datasource"`
	Targets    []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource map[string]any `json:"datasource"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"` // a collapsed row's
}

// dashQuery is one query of a dashboard, its Grafana variables replaced.
type dashQuery struct {
	dashboard, panel string
	expr             string
	labelValues      string // label_values(expr, labelValues): a variable's query
}

// loadDashboards reads deploy/grafana/dashboards and checks what Grafana
// and the provisioning need: the five dashboards, unique uids and panel
// ids, every panel on the ${datasource} variable with a query.
func loadDashboards(t *testing.T) []dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboardsDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ds []dashboard
	uids := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d := dashboard{file: filepath.Base(f)}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Errorf("%s: %v", d.file, err)
			continue
		}
		if d.UID == "" || d.Title == "" || uids[d.UID] != "" {
			t.Errorf("%s: uid %q (also %q), title %q: each dashboard needs its own uid and a title", d.file, d.UID, uids[d.UID], d.Title)
		}
		uids[d.UID] = d.file
		hasDS := false
		for _, v := range d.Templating.List {
			hasDS = hasDS || (v.Name == "datasource" && v.Type == "datasource")
		}
		if !hasDS {
			t.Errorf("%s: no datasource variable", d.file)
		}
		ids := map[int]bool{}
		for _, p := range d.panels() {
			if ids[p.ID] {
				t.Errorf("%s: panel id %d twice", d.file, p.ID)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s / %s: no query", d.file, p.Title)
			}
			if p.Datasource["uid"] != "${datasource}" {
				t.Errorf("%s / %s: datasource %v, want the ${datasource} variable", d.file, p.Title, p.Datasource)
			}
			for _, tg := range p.Targets {
				if tg.Expr == "" || tg.Datasource["uid"] != "${datasource}" {
					t.Errorf("%s / %s / %s: empty query or datasource %v", d.file, p.Title, tg.RefID, tg.Datasource)
				}
			}
		}
		ds = append(ds, d)
	}
	if len(ds) != 5 {
		t.Fatalf("%d dashboards in %s, want 5 (cluster, queue, teams, nodes, control plane)", len(ds), dashboardsDir)
	}
	return ds
}

// panels is every panel, the ones in collapsed rows too.
func (d dashboard) panels() []dashPanel {
	var out []dashPanel
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

var (
	// Grafana's interval variables, in the forms a query may write them.
	grafanaInterval = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)(:[a-z]+)?\}?`)
	// A dashboard variable: $team, ${team}, ${team:regex}.
	grafanaVar   = regexp.MustCompile(`\$\{\w+(:\w+)?\}|\$\w+`)
	labelValuesQ = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)
)

// expand replaces Grafana's variables as the dashboards' "All" does: the
// intervals with 1m, a dashboard variable with .* (their allValue).
func expand(expr string) string {
	expr = grafanaInterval.ReplaceAllString(expr, "1m")
	return grafanaVar.ReplaceAllString(expr, ".*")
}

// queries is every query of d: the panels' targets and the query
// variables' label_values.
func (d dashboard) queries() []dashQuery {
	var qs []dashQuery
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q := v.Definition
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		} else if s, ok := v.Query.(string); ok {
			q = s
		}
		dq := dashQuery{dashboard: d.Title, panel: "variable $" + v.Name, expr: expand(q)}
		if m := labelValuesQ.FindStringSubmatch(q); m != nil {
			dq.expr, dq.labelValues = expand(m[1]), m[2]
		}
		qs = append(qs, dq)
	}
	for _, p := range d.panels() {
		for _, tg := range p.Targets {
			qs = append(qs, dashQuery{dashboard: d.Title, panel: p.Title + " (" + tg.RefID + ")", expr: expand(tg.Expr)})
		}
	}
	return qs
}
