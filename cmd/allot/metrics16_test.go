package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// sample is one line of a Prometheus text exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

var (
	sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$`)
	labelRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// exposition is a scrape, parsed: its samples and the TYPE of each family.
type exposition struct {
	samples []sample
	types   map[string]string
}

func parseExposition(t *testing.T, r io.Reader) exposition {
	t.Helper()
	e := exposition{types: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			e.types[name] = typ
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := sampleRE.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("unparsable exposition line %q", line)
		}
		v, err := strconv.ParseFloat(m[4], 64)
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		s := sample{name: m[1], labels: map[string]string{}, value: v}
		for _, l := range labelRE.FindAllStringSubmatch(m[3], -1) {
			s.labels[l[1]] = strings.NewReplacer(`\"`, `"`, `\\`, `\`, `\n`, "\n").Replace(l[2])
		}
		e.samples = append(e.samples, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return e
}

// find returns the samples of name whose labels include want.
func (e exposition) find(name string, want map[string]string) []sample {
	var out []sample
	for _, s := range e.samples {
		if s.name != name {
			continue
		}
		ok := true
		for k, v := range want {
			ok = ok && s.labels[k] == v
		}
		if ok {
			out = append(out, s)
		}
	}
	return out
}

// value is the one sample of name with exactly these labels (NaN: none).
func (e exposition) value(name string, labels map[string]string) float64 {
	for _, s := range e.find(name, labels) {
		if len(s.labels) == len(labels) {
			return s.value
		}
	}
	return math.NaN()
}

// sum adds the samples of name whose labels include want.
func (e exposition) sum(name string, want map[string]string) float64 {
	total := 0.0
	for _, s := range e.find(name, want) {
		total += s.value
	}
	return total
}

// labelSets lists the label names of a family's samples, deduplicated.
func (e exposition) labelSets(name string) []string {
	seen := map[string]bool{}
	for _, s := range e.samples {
		if s.name != name {
			continue
		}
		var ks []string
		for k := range s.labels {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		seen[strings.Join(ks, ",")] = true
	}
	var out []string
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func scrape(t *testing.T, url, token string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", token)
	}
	c := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// TestMetrics16Worker runs a worker with its own /metrics listener (":0"),
// makes a cluster with running, pending and lost work, and scrapes it over
// HTTP: every family the dashboards and alerts use is there with its
// labels, and the queue gauges equal what was submitted.
func TestMetrics16Worker(t *testing.T) {
	l := startLive(t, func(m *Main) { m.MetricsAddr = "127.0.0.1:0" })
	ctx := context.Background()
	if !strings.HasPrefix(l.m.MetricsURL(), "http://127.0.0.1:") || !strings.HasSuffix(l.m.MetricsURL(), "/metrics") {
		t.Fatalf("MetricsURL() = %q", l.m.MetricsURL())
	}
	// recs has no budget: its ratio must be absent.
	l.exec(`UPDATE teams SET monthly_budget_gpu_hours = 0 WHERE slug = 'recs'`)
	for _, n := range []string{"gpu01", "gpu02", "gpu13"} {
		l.startAgent(n)
	}
	for _, n := range []string{"gpu01", "gpu02", "gpu13"} {
		l.waitNode(n, allot.NodeUp)
	}
	// gpu02's heartbeats stop: it goes down as lost.
	l.links["gpu02"].Store(false)
	l.waitNode("gpu02", allot.NodeDown)

	sleep := jsonCmd("sh", "-c", "sleep 300")
	run1 := l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":4,"gpu_type":"A100-80GB","time_limit":"10m","command":`+sleep+`}`)
	run2 := l.submit(demo.Admin, `{"team":"fraud","tier":3,"gpus":2,"gpu_type":"T4","time_limit":"10m","command":`+sleep+`}`)
	for _, id := range []int64{run1.ID, run2.ID} {
		l.waitJob(id, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	}
	// Jobs that cannot start: 16 A100 GPUs (8 are up), 16 T4 (8 up).
	for range 2 {
		l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":16,"gpu_type":"A100-80GB","time_limit":"1h","command":`+sleep+`}`)
	}
	l.submit(demo.Admin, `{"team":"fraud","tier":3,"gpus":16,"gpu_type":"T4","time_limit":"30m","command":`+sleep+`}`)

	// The gauges are cached up to 5 s: scrape until they show the queue.
	var e exposition
	l.eventually(30*time.Second, "the scrape to show the queue", func() bool {
		code, _, b := scrape(t, l.m.MetricsURL(), "")
		if code != http.StatusOK {
			t.Fatalf("worker /metrics: %d %s", code, b)
		}
		e = parseExposition(t, strings.NewReader(string(b)))
		return e.value("allot_pending_jobs", map[string]string{"tier": "3", "team": "nlp", "gpu_type": "A100-80GB"}) == 2 &&
			e.value("allot_pending_jobs", map[string]string{"tier": "3", "team": "fraud", "gpu_type": "T4"}) == 1 &&
			e.sum("allot_running_jobs", map[string]string{"gpu_type": "T4"}) >= 1 &&
			e.value("allot_nodes_lost", map[string]string{}) == 1 &&
			e.sum("allot_jobs_started_total", nil) >= 2 && e.sum("allot_job_wait_seconds_count", nil) >= 2
	})

	// Every family, with its type and labels.
	families := []struct{ name, typ, labels string }{
		{"allot_pending_jobs", "gauge", "gpu_type,team,tier"},
		{"allot_pending_gpu_hours", "gauge", "gpu_type,team,tier"},
		{"allot_running_jobs", "gauge", "gpu_type,team,tier"},
		{"allot_allocated_gpus", "gauge", "gpu_type,site"},
		{"allot_total_gpus", "gauge", "gpu_type,site,state"},
		{"allot_job_wait_seconds", "histogram", "le,tier"},
		{"allot_scheduling_cycle_seconds", "histogram", "le,phase"},
		{"allot_scheduling_cycles_total", "counter", ""},
		{"allot_scheduling_last_cycle_timestamp_seconds", "gauge", ""},
		{"allot_scheduling_period_seconds", "gauge", ""},
		{"allot_preemptions_total", "counter", "reason"},
		{"allot_jobs_started_total", "counter", "tier"},
		{"allot_team_budget_used_ratio", "gauge", "team"},
		{"allot_team_fair_share", "gauge", "team"},
		{"allot_node_state", "gauge", "node,state"},
		{"allot_nodes_lost", "gauge", ""},
		{"allot_burst_nodes", "gauge", ""},
		{"allot_burst_threshold_gpu_hours", "gauge", ""},
		{"allot_billing_rollup_seconds", "histogram", "le"},
		{"allot_billing_rollup_failures_total", "counter", ""},
		{"allot_billing_rollup_last_success_timestamp_seconds", "gauge", ""},
		{"allot_river_jobs", "gauge", "queue,state"},
		{"allot_river_job_latency_seconds", "histogram", "kind,le"},
		{"allot_river_job_duration_seconds", "histogram", "kind,le"},
		{"allot_river_job_failures_total", "counter", "kind"},
		{"allot_db_pool_acquired_conns", "gauge", "pool"},
		{"allot_db_pool_idle_conns", "gauge", "pool"},
		{"allot_db_pool_total_conns", "gauge", "pool"},
		{"allot_db_pool_max_conns", "gauge", "pool"},
		{"allot_db_pool_acquires_total", "counter", "pool"},
		{"allot_db_pool_empty_acquires_total", "counter", "pool"},
		{"allot_db_pool_acquire_wait_seconds_total", "counter", "pool"},
		{"allot_db_pool_canceled_acquires_total", "counter", "pool"},
	}
	for _, f := range families {
		if e.types[f.name] != f.typ {
			t.Errorf("%s: type %q, want %q", f.name, e.types[f.name], f.typ)
			continue
		}
		series := f.name
		if f.typ == "histogram" {
			series += "_bucket"
		}
		if got := e.labelSets(series); len(got) != 1 || got[0] != f.labels {
			t.Errorf("%s: label sets %q, want [%q]", series, got, f.labels)
		}
	}

	// Values.
	check := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	check("pending GPU-hours of nlp", e.value("allot_pending_gpu_hours", map[string]string{"tier": "3", "team": "nlp", "gpu_type": "A100-80GB"}), 2*16)
	check("pending GPU-hours of fraud", e.value("allot_pending_gpu_hours", map[string]string{"tier": "3", "team": "fraud", "gpu_type": "T4"}), 16*0.5)
	check("pending jobs in all", e.sum("allot_pending_jobs", nil), 3)
	check("running nlp A100 jobs", e.value("allot_running_jobs", map[string]string{"tier": "3", "team": "nlp", "gpu_type": "A100-80GB"}), 1)
	check("running fraud T4 jobs", e.value("allot_running_jobs", map[string]string{"tier": "3", "team": "fraud", "gpu_type": "T4"}), 1)
	check("allocated A100", e.value("allot_allocated_gpus", map[string]string{"gpu_type": "A100-80GB", "site": "onprem"}), 4)
	check("allocated T4", e.value("allot_allocated_gpus", map[string]string{"gpu_type": "T4", "site": "onprem"}), 2)
	check("A100 GPUs up", e.value("allot_total_gpus", map[string]string{"gpu_type": "A100-80GB", "site": "onprem", "state": "up"}), 8)
	check("A100 GPUs down", e.value("allot_total_gpus", map[string]string{"gpu_type": "A100-80GB", "site": "onprem", "state": "down"}), 11*8)
	check("T4 GPUs up", e.value("allot_total_gpus", map[string]string{"gpu_type": "T4", "site": "onprem", "state": "up"}), 8)
	check("T4 GPUs down", e.value("allot_total_gpus", map[string]string{"gpu_type": "T4", "site": "onprem", "state": "down"}), 3*8)
	check("gpu01 up", e.value("allot_node_state", map[string]string{"node": "gpu01", "state": "up"}), 1)
	check("gpu02 down", e.value("allot_node_state", map[string]string{"node": "gpu02", "state": "down"}), 1)
	if n := len(e.find("allot_node_state", nil)); n != 16 {
		t.Errorf("allot_node_state has %d series, want one per node (16)", n)
	}
	check("lost nodes", e.value("allot_nodes_lost", map[string]string{}), 1)
	check("burst nodes", e.value("allot_burst_nodes", map[string]string{}), 0)
	p, err := l.m.Store.CurrentPolicy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check("burst threshold", e.value("allot_burst_threshold_gpu_hours", map[string]string{}), float64(p.BurstPendingGPUHours))
	check("scheduling period", e.value("allot_scheduling_period_seconds", map[string]string{}), p.Cycle.Seconds())
	last := e.value("allot_scheduling_last_cycle_timestamp_seconds", map[string]string{})
	if now := float64(l.m.Store.Now().Unix()); !(last > now-60 && last <= now+1) {
		t.Errorf("last cycle at %v, now is %v", last, now)
	}
	if c := e.value("allot_scheduling_cycles_total", map[string]string{}); c < 1 {
		t.Errorf("allot_scheduling_cycles_total = %v", c)
	}
	for _, phase := range []string{"load", "schedule", "apply"} {
		if c := e.value("allot_scheduling_cycle_seconds_count", map[string]string{"phase": phase}); c < 1 {
			t.Errorf("cycle phase %s observed %v times", phase, c)
		}
	}
	if c := e.sum("allot_job_wait_seconds_count", map[string]string{"tier": "3"}); c < 2 {
		t.Errorf("job waits of tier 3 observed %v times, want ≥ 2 (two jobs started)", c)
	}
	if n := len(e.find("allot_preemptions_total", nil)); n != 5 {
		t.Errorf("allot_preemptions_total has %d reasons, want 5", n)
	}
	// Budgets: every team with one, none without.
	rows, err := l.m.Pool.Query(ctx, `SELECT slug, monthly_budget_gpu_hours FROM teams ORDER BY slug`)
	if err != nil {
		t.Fatal(err)
	}
	budgets := map[string]int64{}
	for rows.Next() {
		var team string
		var b int64
		if err := rows.Scan(&team, &b); err != nil {
			t.Fatal(err)
		}
		budgets[team] = b
	}
	rows.Close()
	for team, b := range budgets {
		got := e.value("allot_team_budget_used_ratio", map[string]string{"team": team})
		switch {
		case b == 0 && !math.IsNaN(got):
			t.Errorf("team %s has no budget but a ratio %v", team, got)
		case b > 0 && (math.IsNaN(got) || got < 0):
			t.Errorf("team %s (budget %d GPU-h): ratio %v", team, b, got)
		case b > 0:
			used, err := l.m.Store.TeamMonthUsage(ctx, team)
			if err != nil {
				t.Fatal(err)
			}
			// The gauge was read up to 5 s (cache) plus the scrape loop
			// before: the team's running jobs may have added that much.
			if want := float64(used) / float64(b*3600); got > want+1e-9 || got < want-float64(6*8*60)/float64(b*3600) {
				t.Errorf("team %s: ratio %v, want ≈ %v (%d GPU-s of %d GPU-h)", team, got, want, used, b)
			}
		}
		if f := e.value("allot_team_fair_share", map[string]string{"team": team}); !(f >= 0 && f <= 1) {
			t.Errorf("team %s: fair share %v", team, f)
		}
	}
	if budgets["recs"] != 0 || len(budgets) < 3 {
		t.Fatalf("teams %v", budgets)
	}
	// River: the queue's states and the cycle jobs' latency and run time.
	if c := e.value("allot_river_jobs", map[string]string{"queue": "default", "state": "completed"}); c < 1 {
		t.Errorf("completed River jobs: %v", c)
	}
	for _, h := range []string{"allot_river_job_latency_seconds_count", "allot_river_job_duration_seconds_count"} {
		if c := e.value(h, map[string]string{"kind": "schedule_cycle"}); c < 1 {
			t.Errorf("%s{kind=schedule_cycle} = %v", h, c)
		}
	}
	if c := e.value("allot_river_job_failures_total", map[string]string{"kind": "billing_rollup"}); c != 0 {
		t.Errorf("billing rollup failures: %v", c)
	}
	// The rollup ran at start (RunOnStart).
	if c := e.value("allot_billing_rollup_seconds_count", map[string]string{}); c < 1 {
		t.Errorf("billing rollups observed: %v", c)
	} else if ts := e.value("allot_billing_rollup_last_success_timestamp_seconds", map[string]string{}); ts < float64(l.m.Store.Now().Add(-time.Hour).Unix()) {
		t.Errorf("last rollup success at %v", ts)
	}
	// The pool.
	if m := e.value("allot_db_pool_max_conns", map[string]string{"pool": "main"}); m < 1 {
		t.Errorf("pool max conns %v", m)
	}
	if a := e.value("allot_db_pool_acquires_total", map[string]string{"pool": "main"}); a < 10 {
		t.Errorf("pool acquires %v", a)
	}
	// The fair share is the one the API shows (same inputs, same core),
	// once usage stands still: the running jobs cancelled, and a scrape
	// read after that (the gauges are cached up to 5 s).
	for _, id := range []int64{run1.ID, run2.ID} {
		if rc, _, errOut := l.cli(demo.Admin, "cancel", fmt.Sprint(id)); rc != 0 {
			t.Fatalf("cancel %d: %s", id, errOut)
		}
	}
	l.eventually(30*time.Second, "the scrape to show no running job and no allocated GPU", func() bool {
		_, _, b := scrape(t, l.m.MetricsURL(), "")
		e = parseExposition(t, strings.NewReader(string(b)))
		return len(e.find("allot_running_jobs", nil)) == 0 && len(e.find("allot_allocated_gpus", nil)) == 0
	})
	var fs web.FairShareJSON
	if code, _, b := l.api("GET", "/api/v1/fairshare", demo.Admin, ""); code != http.StatusOK || json.Unmarshal(b, &fs) != nil {
		t.Fatalf("fairshare: %d %s", code, b)
	}
	for _, row := range fs.Teams {
		if got := e.value("allot_team_fair_share", map[string]string{"team": row.Team}); math.Abs(got-row.FairShare) > 0.01 {
			t.Errorf("team %s: fair share %v on /metrics, %v on the API", row.Team, got, row.FairShare)
		}
	}
}

// TestMetrics16PortalToken: the portal's /metrics answers only an admin's
// API token or the scrape token, with a 401 JSON problem otherwise (never
// the login page), and a session cookie does not count.
func TestMetrics16PortalToken(t *testing.T) {
	const scrapeToken = "scrape-token-0123456789abcdef"
	e := bootMain(t, &Main{Config: Config{Worker: true, DevMode: true, MetricsToken: scrapeToken}}).withTokens()
	url := e.url + "/metrics"
	for _, c := range []struct{ what, auth string }{
		{"no token", ""},
		{"an unknown token", "Bearer allot_nope"},
		{"an engineer's token", "Bearer " + e.tokens[demo.Engineer]},
		{"a lead's token", "Bearer " + e.tokens[demo.Lead]},
		{"finance's token", "Bearer " + e.tokens[demo.Finance]},
		{"the scrape token as Basic", "Basic " + scrapeToken},
		{"a prefix of the scrape token", "Bearer " + scrapeToken[:10]},
	} {
		code, h, b := scrape(t, url, c.auth)
		var p web.Problem
		if code != http.StatusUnauthorized || !strings.Contains(h.Get("Content-Type"), "json") || json.Unmarshal(b, &p) != nil || p.Status != 401 || p.Detail == "" {
			t.Errorf("/metrics with %s: %d %s %s, want a 401 problem", c.what, code, h.Get("Content-Type"), b)
		}
		if strings.Contains(string(b), "allot_") && !strings.Contains(string(b), "detail") {
			t.Errorf("/metrics with %s leaked metrics", c.what)
		}
	}
	// An admin's browser session is no scrape credential either.
	br := e.login(demo.Admin)
	resp, err := br.c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/metrics with an admin's session cookie: %d, want 401", resp.StatusCode)
	}
	for _, auth := range []string{"Bearer " + e.tokens[demo.Admin], "Bearer " + scrapeToken} {
		code, _, b := scrape(t, url, auth)
		if code != http.StatusOK || !strings.Contains(string(b), "allot_http_requests_total") || !strings.Contains(string(b), "allot_db_pool_max_conns") {
			t.Errorf("/metrics with %s…: %d %.200s", auth[:12], code, b)
		}
	}
	// A revoked admin token no longer works.
	ctx := context.Background()
	ada, err := e.m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	secret, tok, err := e.m.Store.CreateAPIToken(ctx, ada.ID, "scraper")
	if err != nil {
		t.Fatal(err)
	}
	if code, _, _ := scrape(t, url, "Bearer "+secret); code != http.StatusOK {
		t.Fatalf("fresh admin token: %d", code)
	}
	if _, err := e.m.Store.RevokeAPIToken(ctx, tok.ID, &ada); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := scrape(t, url, "Bearer "+secret); code != http.StatusUnauthorized {
		t.Errorf("revoked admin token: %d, want 401", code)
	}
}

// TestMetrics16Flags: --metrics-addr defaults (worker :9401, server none),
// ALLOT_METRICS_ADDR, and --metrics-token-file's checks.
func TestMetrics16Flags(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "  0123456789abcdef0123  \n")
	for _, c := range []struct {
		name string
		args []string
		env  string // ALLOT_METRICS_ADDR ("-": unset)
		addr string
		tok  string
		err  string
	}{
		{name: "worker", env: "-", addr: ":9401"},
		{name: "server", env: "-", addr: ""},
		{name: "worker", env: "127.0.0.1:9555", addr: "127.0.0.1:9555"},
		{name: "worker", env: "", addr: ""},
		{name: "worker", args: []string{"--metrics-addr", ""}, env: "-", addr: ""},
		{name: "server", args: []string{"--metrics-addr", "127.0.0.1:0", "--metrics-token-file", good}, env: "-", addr: "127.0.0.1:0", tok: "0123456789abcdef0123"},
		{name: "server", args: []string{"--metrics-token-file", write("empty", "\n")}, env: "-", err: "is empty"},
		{name: "server", args: []string{"--metrics-token-file", write("short", "abc\n")}, env: "-", err: "use at least 16"},
		{name: "server", args: []string{"--metrics-token-file", write("two", "0123456789abcdef 0123456789abcdef\n")}, env: "-", err: "one word on one line"},
		{name: "server", args: []string{"--metrics-token-file", filepath.Join(dir, "missing")}, env: "-", err: "no such file"},
	} {
		t.Run(fmt.Sprintf("%s %q %s", c.name, c.args, c.env), func(t *testing.T) {
			if c.env == "-" {
				t.Setenv("ALLOT_METRICS_ADDR", "")
				os.Unsetenv("ALLOT_METRICS_ADDR")
			} else {
				t.Setenv("ALLOT_METRICS_ADDR", c.env)
			}
			t.Setenv("ALLOT_METRICS_TOKEN_FILE", "")
			fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			apply := metricsFlags(fs, c.name)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			var cfg Config
			err := apply(&cfg)
			switch {
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Errorf("error %v, want %q", err, c.err)
			case c.err == "" && err != nil:
				t.Errorf("error %v", err)
			case c.err == "" && (cfg.MetricsAddr != c.addr || cfg.MetricsToken != c.tok):
				t.Errorf("addr %q token %q, want %q %q", cfg.MetricsAddr, cfg.MetricsToken, c.addr, c.tok)
			}
		})
	}
	// The worker flag exists on the command itself, and a bad token file
	// stops allot server before it connects anywhere.
	var stderr strings.Builder
	if code := run([]string{"server", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--metrics-token-file", filepath.Join(dir, "missing")}, io.Discard, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "--metrics-token-file") {
		t.Errorf("server with a missing token file: exit %d %q", code, stderr.String())
	}
}
