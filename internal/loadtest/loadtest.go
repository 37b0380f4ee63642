// Package loadtest drives a running Allot (server, worker, PostgreSQL)
// with simulated node agents and submitting clients for a bounded time and
// reports, per operation, the count, errors by status, rate and latency
// percentiles, and the live scheduling cycle's duration. `allot loadtest`
// is its command line (cmd/allot/loadtest_cli.go); that file also boots a
// server and worker in-process on a fresh database for the figures in the
// README.
//
// Everything goes through the public HTTP APIs the real clients use (the
// JSON job API with a personal token, the agent protocol with node
// tokens), except seeding: nodes, node tokens, pending jobs, a busy
// cluster and a year of history go in directly by SQL, which needs the
// server's database (Config.DB).
package loadtest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Config is one load run.
type Config struct {
	URL string // the server, e.g. http://127.0.0.1:8080
	// AgentURL is where the simulated agents go: a server of its own for
	// the agent API (`allot server --serve agents`); "": URL.
	AgentURL string
	Token    string // a personal API token that may submit to Teams (and read the pages)
	// DB and Store reach the server's database; they are needed to seed
	// (Agents, Nodes, Pending, Pages) and to read the cycles the worker
	// ran (scheduling_cycles). Without them only Submitters can run.
	DB    *pgxpool.Pool
	Store *store.Store
	// Gather, when set, reads the server's and worker's metrics (a booted
	// server's registry, or Scrapes of running processes): the window's
	// cycle phases, admission refusals and server-side times come from it.
	Gather prometheus.Gatherer

	Duration time.Duration
	// Warmup runs the load for this long before the measured Duration
	// (nothing from it is counted): the cluster fills up and the cycles
	// reach their steady state first.
	Warmup     time.Duration
	Submitters int
	SubmitRate float64 // target submissions/s over all submitters; 0 = as fast as they go
	// SubmitGPUType is the GPU type the submitted jobs ask for ("": any).
	// A type no agent has keeps them pending: submissions and heartbeats
	// measured without the cluster filling up.
	SubmitGPUType string
	Teams         []string

	Agents       int
	GPUsPerAgent int
	GPUType      string
	Heartbeat    time.Duration
	JobRuntime   time.Duration // how long a simulated job runs before it exits 0; 0 = until the run ends

	Pending     int  // pending jobs seeded before the run
	Nodes       int  // busy nodes (no agent) seeded before the run
	Pages       bool // time GET /cluster and the first team's page, with a year of history seeded
	HistoryJobs int  // finished 8-GPU jobs in that year (default 50,000 = 400k allocation rows)
	// PageInterval is the pause between two rounds of page requests.
	PageInterval time.Duration
	// RequestTimeout bounds every call (default 30 s).
	RequestTimeout time.Duration
	// CycleProbe runs one scheduling cycle of the tool's own
	// jobs.Scheduler over Store after seeding, timing its load phase
	// apart (needs Store).
	CycleProbe bool

	Logger *slog.Logger // progress; nil: none
}

// Validate says what is wrong with c, before anything is touched.
func (c *Config) Validate() error {
	var errs []string
	add := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
	if c.URL == "" {
		add("no server URL")
	} else if !strings.HasPrefix(c.URL, "http://") && !strings.HasPrefix(c.URL, "https://") {
		add("--url must start with http:// or https://, not %q", c.URL)
	}
	if c.AgentURL != "" && !strings.HasPrefix(c.AgentURL, "http://") && !strings.HasPrefix(c.AgentURL, "https://") {
		add("the agents' server URL must start with http:// or https://, not %q", c.AgentURL)
	}
	if c.Duration <= 0 {
		add("--duration must be positive, not %v", c.Duration)
	}
	if c.Duration > 24*time.Hour {
		add("--duration must be at most 24h, not %v", c.Duration)
	}
	if c.Warmup < 0 || c.Warmup > time.Hour {
		add("--warmup must be 0..1h, not %v", c.Warmup)
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"--submitters", c.Submitters}, {"--agents", c.Agents}, {"--pending", c.Pending}, {"--nodes", c.Nodes}, {"--history-jobs", c.HistoryJobs}} {
		if n.v < 0 {
			add("%s must not be negative, not %d", n.name, n.v)
		}
	}
	if c.Submitters > 10000 || c.Agents > 100000 || c.Nodes > 100000 || c.Pending > 10_000_000 {
		add("at most 10,000 submitters, 100,000 agents, 100,000 nodes and 10,000,000 pending jobs")
	}
	if c.SubmitRate < 0 {
		add("--submit-rate must not be negative, not %v", c.SubmitRate)
	}
	if c.SubmitRate > 0 && c.Submitters == 0 {
		add("--submit-rate needs --submitters")
	}
	if c.Submitters > 0 && c.Token == "" {
		add("submitters need a --token")
	}
	if c.Pages && c.Token == "" {
		add("--pages needs a --token")
	}
	if (c.Submitters > 0 || c.Pending > 0 || c.Nodes > 0 || c.Pages) && len(c.Teams) == 0 {
		add("--teams must name at least one team")
	}
	if c.Agents > 0 || c.Nodes > 0 {
		if c.GPUsPerAgent < 1 || c.GPUsPerAgent > 64 {
			add("--gpus-per-agent must be 1..64, not %d", c.GPUsPerAgent)
		}
		if c.GPUType == "" {
			add("--gpu-type must name a GPU type")
		}
	}
	if c.Agents > 0 && (c.Heartbeat < 10*time.Millisecond || c.Heartbeat > 10*time.Minute) {
		add("--heartbeat must be 10ms..10m, not %v", c.Heartbeat)
	}
	if c.JobRuntime < 0 {
		add("--job-runtime must not be negative, not %v", c.JobRuntime)
	}
	if (c.Agents > 0 || c.Nodes > 0 || c.Pending > 0 || c.Pages || c.CycleProbe) && (c.DB == nil || c.Store == nil) {
		add("--agents, --nodes, --pending, --pages and the cycle probe seed the server's database: give --database-url")
	}
	if c.Submitters == 0 && c.Agents == 0 && !c.Pages {
		add("nothing to do: give --submitters, --agents or --pages")
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

func (c *Config) defaults() {
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 30 * time.Second
	}
	if c.PageInterval == 0 {
		c.PageInterval = time.Second
	}
	if c.HistoryJobs == 0 {
		c.HistoryJobs = 50000
	}
}

// Report is what a run measured.
type Report struct {
	StartedAt time.Time  `json:"started_at"`
	DurationS float64    `json:"duration_s"` // the measured window
	Config    RunConfig  `json:"config"`
	Seeding   []SeedStep `json:"seeding,omitempty"`
	Ops       []OpReport `json:"ops"`
	// Cycles are the scheduling cycles the worker recorded during the
	// window (scheduling_cycles), nil without a database.
	Cycles *CycleReport `json:"cycles,omitempty"`
	// Probe is the tool's own cycle after seeding (CycleProbe).
	Probe *ProbeReport `json:"cycle_probe,omitempty"`
	// Jobs counts the run's submitted jobs by state at the end.
	Jobs map[string]int `json:"submitted_jobs_by_state,omitempty"`
	// Nodes counts the simulated agents' nodes by state at the end.
	Nodes map[string]int `json:"agent_nodes_by_state,omitempty"`
	// Refused counts, in the window, the booted server's requests refused
	// by admission control ("level/reason") and its refused agent requests
	// counted as their node's sign of life ("agent requests counted as alive").
	Refused map[string]int `json:"admission_refused,omitempty"`
	// Server is, for a booted server, the time its agent API and job
	// submission routes took inside it over the window.
	Server []ServerOp `json:"server_side,omitempty"`
	Notes  []string   `json:"notes,omitempty"`
}

// countByState runs query (state, count rows) into a map.
func countByState(ctx context.Context, db *pgxpool.Pool, query string, args ...any) (map[string]int, error) {
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			rows.Close()
			return nil, err
		}
		out[s] = n
	}
	rows.Close()
	return out, rows.Err()
}

// RunConfig echoes the run's settings.
type RunConfig struct {
	WarmupS      float64 `json:"warmup_s"`
	Submitters   int     `json:"submitters"`
	SubmitRate   float64 `json:"submit_rate"`
	Agents       int     `json:"agents"`
	GPUsPerAgent int     `json:"gpus_per_agent"`
	HeartbeatS   float64 `json:"heartbeat_s"`
	JobRuntimeS  float64 `json:"job_runtime_s"`
	Pending      int     `json:"pending"`
	Nodes        int     `json:"nodes"`
	Pages        bool    `json:"pages"`
	HistoryJobs  int     `json:"history_jobs,omitempty"`
}

// SeedStep is how long one seeding step took.
type SeedStep struct {
	What string  `json:"what"`
	S    float64 `json:"s"`
}

// CycleReport summarizes the worker's cycles (duration_us as recorded:
// from the cycle lock to the plan applied, before the commit).
type CycleReport struct {
	Count      int     `json:"count"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	Max        float64 `json:"max_ms"`
	MaxPending int     `json:"max_pending"`
	Started    int     `json:"jobs_started"`
	Preempted  int     `json:"jobs_preempted"`
	// Phases are the mean seconds per phase from the worker's per-phase
	// cycle histogram, when its registry exports one (label "phase").
	Phases map[string]float64 `json:"phase_mean_ms,omitempty"`
}

// ProbeReport is one cycle the tool ran itself with a jobs.Scheduler over
// the same store: LoadMS is LoadSchedState alone (in a transaction rolled
// back), CycleMS the whole Scheduler.Cycle (lock, decay, load, plan,
// apply, commit); CycleMS − LoadMS is about the plan and its apply.
type ProbeReport struct {
	Pending int     `json:"pending"`
	Nodes   int     `json:"nodes"`
	GPUs    int     `json:"gpus"`
	LoadMS  float64 `json:"load_ms"`
	CycleMS float64 `json:"cycle_ms"`
	Started int     `json:"started"`
	Skipped int     `json:"skipped_busy"` // tries that found the worker's cycle holding the lock
}

type runner struct {
	cfg    Config
	ops    *ops
	log    *slog.Logger
	hc     *http.Client
	userID int64
	// calls is the context of every call: the caller's, not the
	// window's, so calls in flight when the window closes finish.
	calls context.Context
}

// Run seeds what cfg asks for, drives the load for cfg.Duration and
// reports. It fails only when the run could not be set up (seeding,
// registration); failed calls during the run are counted in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, ops: newOps(), log: cfg.Logger, calls: ctx}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	conns := cfg.Submitters + 2*cfg.Agents + 8
	r.hc = &http.Client{Transport: &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: 2 * time.Minute}}
	defer r.hc.CloseIdleConnections()
	rep := &Report{Config: RunConfig{WarmupS: cfg.Warmup.Seconds(), Submitters: cfg.Submitters, SubmitRate: cfg.SubmitRate, Agents: cfg.Agents, GPUsPerAgent: cfg.GPUsPerAgent,
		HeartbeatS: cfg.Heartbeat.Seconds(), JobRuntimeS: cfg.JobRuntime.Seconds(), Pending: cfg.Pending, Nodes: cfg.Nodes, Pages: cfg.Pages}}
	if cfg.Pages {
		rep.Config.HistoryJobs = cfg.HistoryJobs
	}

	// Seeding, timed step by step.
	step := func(what string, fn func() error) error {
		t0 := time.Now()
		r.log.Info("seeding", "what", what)
		if err := fn(); err != nil {
			return err
		}
		rep.Seeding = append(rep.Seeding, SeedStep{What: what, S: round1(time.Since(t0).Seconds())})
		return nil
	}
	if cfg.DB != nil {
		// Seeded jobs belong to the oldest user (the demo's first person
		// in a self-hosted run).
		if err := cfg.DB.QueryRow(ctx, `SELECT id FROM users ORDER BY id LIMIT 1`).Scan(&r.userID); err != nil && (cfg.Pending > 0 || cfg.Nodes > 0 || cfg.Pages) {
			return nil, fmt.Errorf("finding a user to own the seeded jobs: %w", err)
		}
	}
	var tokens []string
	if cfg.Agents > 0 {
		if err := step(fmt.Sprintf("%d agents' nodes and node tokens", cfg.Agents), func() (err error) { tokens, err = r.seedAgents(ctx); return err }); err != nil {
			return nil, err
		}
	}
	if cfg.Nodes > 0 {
		if err := step(fmt.Sprintf("%d busy nodes", cfg.Nodes), func() error { return r.seedNodes(ctx, cfg.Nodes) }); err != nil {
			return nil, err
		}
	}
	if cfg.Pending > 0 {
		if err := step(fmt.Sprintf("%d pending jobs", cfg.Pending), func() error { return r.seedPending(ctx, cfg.Pending) }); err != nil {
			return nil, err
		}
	}
	if cfg.Pages {
		if err := step(fmt.Sprintf("a year of history (%d jobs)", cfg.HistoryJobs), func() error { return r.seedHistory(ctx, cfg.HistoryJobs) }); err != nil {
			return nil, err
		}
	}
	if len(rep.Seeding) > 0 {
		// VACUUM too: a year-old history is all-visible on a live system
		// (autovacuum), so its index-only scans read no table pages; a fresh
		// seed is not until vacuumed.
		if err := step("VACUUM ANALYZE", func() error {
			_, err := cfg.DB.Exec(ctx, `VACUUM ANALYZE nodes, node_tokens, jobs, leases, allocations, job_usage_hours`)
			return err
		}); err != nil {
			return nil, err
		}
	}

	// Agents register before the window opens (registration is a
	// one-off), 32 at a time.
	agents := make([]*simAgent, cfg.Agents)
	for i := range agents {
		agents[i] = newSimAgent(r, agentName(i), tokens[i], r.hc)
	}
	var regTime time.Duration
	if len(agents) > 0 {
		t0 := time.Now()
		if err := step(fmt.Sprintf("%d agents registered through the API", len(agents)), func() error {
			return parallel(ctx, len(agents), 32, func(i int) error { return agents[i].register(ctx) })
		}); err != nil {
			return nil, fmt.Errorf("registering the agents: %w", err)
		}
		regTime = time.Since(t0)
	}
	if cfg.CycleProbe {
		p, err := r.probe(ctx)
		if err != nil {
			return nil, fmt.Errorf("timing a cycle: %w", err)
		}
		rep.Probe = p
	}

	// The warm-up, then the window.
	opens := time.Now().Add(cfg.Warmup) // the window's start
	// Read before any load starts: failing here has nothing to undo.
	var autovacuum string
	if cfg.DB != nil {
		if err := cfg.DB.QueryRow(ctx, `SHOW autovacuum`).Scan(&autovacuum); err != nil {
			return nil, fmt.Errorf("reading the autovacuum setting: %w", err)
		}
	}
	runCtx, cancel := context.WithDeadline(ctx, opens.Add(cfg.Duration))
	defer cancel()
	var wg sync.WaitGroup
	r.ops.off.Store(cfg.Warmup > 0)
	r.log.Info("load running", "warm-up", cfg.Warmup, "for", cfg.Duration, "submitters", cfg.Submitters, "agents", cfg.Agents)
	for _, a := range agents {
		wg.Go(func() { a.heartbeats(runCtx) })
		wg.Go(func() { a.orders(runCtx) })
	}
	var submitted []int64
	var subMu sync.Mutex
	if cfg.Submitters > 0 {
		work := r.pace(runCtx, &wg)
		for i := range cfg.Submitters {
			wg.Go(func() {
				ids := r.submitter(runCtx, i, work)
				subMu.Lock()
				submitted = append(submitted, ids...)
				subMu.Unlock()
			})
		}
	}
	if cfg.Pages {
		wg.Go(func() { r.pages(runCtx) })
	}
	if autovacuum == "off" {
		// Without it the planner keeps the seeding's statistics of a table
		// that grows by thousands of rows a second, and plans for an empty
		// queue; a live cluster's autovacuum analyzes a table once a tenth
		// of it changed.
		rep.Notes = append(rep.Notes, fmt.Sprintf("this PostgreSQL runs without autovacuum: the tool analyzed jobs, leases, nodes and allocations every %v in its stead", analyzeEvery))
		wg.Go(func() { r.analyze(runCtx) })
	}
	sleep(runCtx, time.Until(opens))
	// The window opens when the warm-up ends (a late wake-up on a loaded
	// machine shortens no window), and what marks its start (the last
	// cycle, the phase counters) is read after that.
	r.ops.off.Store(false)
	start := opens
	rep.StartedAt = start.UTC()
	before := r.readMetrics()
	var cycleID int64
	if cfg.DB != nil {
		if err := cfg.DB.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM scheduling_cycles`).Scan(&cycleID); err != nil {
			cancel()
			wg.Wait()
			return nil, fmt.Errorf("reading the cycles: %w", err)
		}
	}
	<-runCtx.Done()
	wg.Wait()
	// The window ends when the last call in flight has: every call
	// counted falls inside it.
	window := time.Since(start)
	for _, a := range agents {
		a.stopTimers()
	}
	rep.DurationS = round1(window.Seconds())
	for _, p := range r.ops.order {
		// A long poll's latency is how long the server had nothing to
		// say: only its count and errors mean something.
		o := p.report(window)
		if strings.Contains(o.Name, "long poll") {
			o.P50, o.P90, o.P95, o.P99, o.Max = 0, 0, 0, 0, 0
		}
		// Registration is before the window (and the warm-up): its rate is
		// over its own time.
		if o.Name == "agent register" && regTime > 0 {
			o.Rate = round1(float64(o.Count) / regTime.Seconds())
		}
		rep.Ops = append(rep.Ops, o)
	}
	after := r.readMetrics()
	if err := cmp.Or(before.err, after.err); err != nil {
		// A failed reading would pass totals since the start for the window's.
		rep.Notes = append(rep.Notes, "the metrics were not read before and after the window, so no server-side times, refusals or cycle phases: "+err.Error())
		before, after = metricsReading{}, metricsReading{}
	}
	rep.Refused = refusalsIn(before.refused, after.refused)
	rep.Server = serverOpsIn(before.served, after.served)
	if cfg.DB != nil {
		var err error
		if rep.Cycles, err = r.cycles(ctx, cycleID); err != nil {
			return nil, err
		}
		if ph := phaseMeans(before.phases, after.phases); len(ph) > 0 {
			rep.Cycles.Phases = ph
		}
		if len(submitted) > 0 {
			if rep.Jobs, err = countByState(ctx, cfg.DB, `SELECT state, count(*) FROM jobs WHERE id = ANY($1) GROUP BY state`, submitted); err != nil {
				return nil, fmt.Errorf("counting the submitted jobs: %w", err)
			}
		}
		if cfg.Agents > 0 {
			// A node marked down under load fails its jobs (node_lost).
			if rep.Nodes, err = countByState(ctx, cfg.DB, `SELECT state, count(*) FROM nodes WHERE name LIKE $1 || '%' GROUP BY state`, agentPrefix); err != nil {
				return nil, fmt.Errorf("counting the agents' nodes: %w", err)
			}
		}
	} else {
		rep.Notes = append(rep.Notes, "no --database-url: the worker's cycles were not read")
	}
	return rep, nil
}

// parallel runs fn(0..n-1) on k goroutines and returns the first error.
func parallel(ctx context.Context, n, k int, fn func(int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range min(n, k) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// pace hands out submission times: with a target rate, one every 1/rate
// at its intended time (the latency of a submission counts from then, so
// a server that falls behind shows as latency, not as a lower rate that
// hides it); without one, nil: submitters go as fast as they can.
func (r *runner) pace(ctx context.Context, wg *sync.WaitGroup) <-chan time.Time {
	if r.cfg.SubmitRate <= 0 {
		return nil
	}
	work := make(chan time.Time, max(16, int(r.cfg.SubmitRate)))
	wg.Go(func() {
		defer close(work)
		interval := time.Duration(float64(time.Second) / r.cfg.SubmitRate)
		start := time.Now()
		for k := 0; ; k++ {
			at := start.Add(time.Duration(k) * interval)
			if d := time.Until(at); d > time.Millisecond {
				sleep(ctx, d)
			}
			select {
			case <-ctx.Done():
				return
			case work <- at:
			}
		}
	})
	return work
}

// submitter posts jobs until ctx ends and returns the ids it got.
func (r *runner) submitter(ctx context.Context, i int, work <-chan time.Time) []int64 {
	var ids []int64
	o := r.ops.get("submit job")
	for k := 0; ctx.Err() == nil; k++ {
		intended := time.Now()
		if work != nil {
			var ok bool
			if intended, ok = <-work; !ok {
				break
			}
		}
		job := map[string]any{"name": submittedJob, "team": r.cfg.Teams[(i+k)%len(r.cfg.Teams)], "tier": 3, "gpus": 1,
			"time_limit": "1h", "command": []string{"sleep", "60"}}
		if r.cfg.SubmitGPUType != "" {
			job["gpu_type"] = r.cfg.SubmitGPUType
		}
		body, _ := json.Marshal(job)
		var out struct {
			ID int64 `json:"id"`
		}
		err := r.call(r.calls, http.MethodPost, "/api/v1/jobs", body, http.StatusCreated, &out)
		if err == nil && out.ID == 0 {
			err = errors.New("submit: no job id in the answer")
		}
		o.record(r.calls, time.Since(intended), err)
		if err == nil {
			ids = append(ids, out.ID)
		}
	}
	return ids
}

// pages times the cluster page and the first team's page, one after the
// other, every PageInterval.
func (r *runner) pages(ctx context.Context) {
	team := "/teams/" + r.cfg.Teams[0]
	for ctx.Err() == nil {
		for _, path := range []string{"/cluster", team} {
			t0 := time.Now()
			err := r.call(r.calls, http.MethodGet, path, nil, http.StatusOK, nil)
			r.ops.get("page GET "+path).record(r.calls, time.Since(t0), err)
		}
		sleep(ctx, r.cfg.PageInterval)
	}
}

// call makes one API request with the personal token and decodes a JSON
// answer into out (when not nil); another status than want is an error.
func (r *runner) call(ctx context.Context, method, path string, body []byte, want int, out any) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(r.cfg.URL, "/")+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+r.cfg.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &statusError{status: resp.StatusCode, body: strings.TrimSpace(string(b))}
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// errProbeDone rolls back the probe's read-only transaction.
var errProbeDone = errors.New("probe done")

// probe times one load of the scheduling state and then one whole cycle
// of the tool's own Scheduler over the same store. While the worker's own
// cycle holds the lock, Cycle does not run: it tries again for up to a
// minute.
func (r *runner) probe(ctx context.Context) (*ProbeReport, error) {
	p := &ProbeReport{}
	err := r.cfg.Store.InTx(ctx, func(tx *store.Store) error {
		t0 := time.Now()
		st, err := tx.LoadSchedState(ctx)
		if err != nil {
			return err
		}
		p.LoadMS = ms(time.Since(t0))
		p.Pending, p.Nodes = len(st.Pending), len(st.Nodes)
		for _, n := range st.Nodes {
			p.GPUs += n.GPUCount
		}
		return errProbeDone
	})
	if err != nil && !errors.Is(err, errProbeDone) {
		return nil, err
	}
	sch := &jobs.Scheduler{Store: r.cfg.Store, Logger: r.log}
	deadline := time.Now().Add(time.Minute)
	for {
		t0 := time.Now()
		res, err := sch.Cycle(ctx)
		d := time.Since(t0)
		if err != nil {
			return nil, err
		}
		if res.Ran {
			p.CycleMS, p.Started = ms(d), res.Started
			return p, nil
		}
		p.Skipped++
		if time.Now().After(deadline) {
			return nil, errors.New("the worker's cycles held the lock for a minute")
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

// cycles summarizes the cycles recorded after id.
func (r *runner) cycles(ctx context.Context, after int64) (*CycleReport, error) {
	rows, err := r.cfg.DB.Query(ctx, `SELECT duration_us, pending, started, preempted FROM scheduling_cycles WHERE id > $1 ORDER BY id`, after)
	if err != nil {
		return nil, fmt.Errorf("reading the cycles: %w", err)
	}
	defer rows.Close()
	c := &CycleReport{}
	var lat []time.Duration
	for rows.Next() {
		var us int64
		var pending, started, preempted int
		if err := rows.Scan(&us, &pending, &started, &preempted); err != nil {
			return nil, err
		}
		lat = append(lat, time.Duration(us)*time.Microsecond)
		c.MaxPending = max(c.MaxPending, pending)
		c.Started += started
		c.Preempted += preempted
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.Sort(lat)
	c.Count, c.P50, c.P99, c.Max = len(lat), pct(lat, .5), pct(lat, .99), pct(lat, 1)
	return c, nil
}

// phaseSums are a per-phase cycle histogram's sum and count by phase.
type phaseSums map[string][2]float64

// metricsReading is one reading of the booted processes' registry.
type metricsReading struct {
	phases  phaseSums
	refused map[string]float64
	served  map[string]serverHist
	err     error // the reading failed: it says nothing
}

// readMetrics gathers the registry once (nothing without one).
func (r *runner) readMetrics() metricsReading {
	if r.cfg.Gather == nil {
		return metricsReading{}
	}
	fams, err := r.cfg.Gather.Gather()
	if err != nil {
		return metricsReading{err: err}
	}
	return metricsReading{phases: phasesOf(fams), refused: refusalsOf(fams), served: serverTimesOf(fams)}
}

// phasesOf is, from the worker's registry, any histogram of scheduling
// cycles with a "phase" label (the worker's per-phase metric, when it has
// one).
func phasesOf(fams []*dto.MetricFamily) phaseSums {
	out := phaseSums{}
	for _, f := range fams {
		if f.GetType() != dto.MetricType_HISTOGRAM || !strings.Contains(f.GetName(), "cycle") {
			continue
		}
		for _, m := range f.GetMetric() {
			if phase, ok := labelOf(m, "phase"); ok {
				h := m.GetHistogram()
				v := out[phase]
				out[phase] = [2]float64{v[0] + h.GetSampleSum(), v[1] + float64(h.GetSampleCount())}
			}
		}
	}
	return out
}

// labelOf is metric m's value of label name, and whether m has it.
func labelOf(m *dto.Metric, name string) (string, bool) {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

// refusedCounted is Report.Refused's key for the refused agent requests the
// server counted as signs of life.
const refusedCounted = "agent requests counted as alive"

// refusalsOf is the booted server's admission refusals by level/reason
// and its refused agent requests counted as alive.
func refusalsOf(fams []*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, f := range fams {
		switch f.GetName() {
		case "allot_admission_rejected_total":
			for _, m := range f.GetMetric() {
				level, _ := labelOf(m, "level")
				reason, _ := labelOf(m, "reason")
				out[level+"/"+reason] += m.GetCounter().GetValue()
			}
		case "allot_refused_agent_requests_counted_total":
			for _, m := range f.GetMetric() {
				out[refusedCounted] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// refusalsIn is what grew between two readings of refusals.
func refusalsIn(before, after map[string]float64) map[string]int {
	out := map[string]int{}
	for k, a := range after {
		if n := int(a - before[k]); n > 0 {
			out[k] = n
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// phaseMeans is each phase's mean, in ms, between two readings.
func phaseMeans(before, after phaseSums) map[string]float64 {
	out := map[string]float64{}
	for ph, a := range after {
		b := before[ph]
		if n := a[1] - b[1]; n > 0 {
			out[ph] = round1((a[0] - b[0]) / n * 1000)
		}
	}
	return out
}

// analyzeEvery is how often the tool analyzes the tables a load changes
// when the server's autovacuum is off (analyze).
const analyzeEvery = 15 * time.Second

// analyze refreshes the planner's statistics of the tables the load
// changes every analyzeEvery until ctx ends, as autovacuum would on a live
// cluster (this project's test PostgreSQL runs without it). A failure is
// logged: the load goes on with older statistics.
func (r *runner) analyze(ctx context.Context) {
	for {
		sleep(ctx, analyzeEvery)
		if ctx.Err() != nil {
			return
		}
		if _, err := r.cfg.DB.Exec(ctx, `ANALYZE jobs, leases, nodes, allocations`); err != nil && ctx.Err() == nil {
			r.log.Warn("analyzing the tables in autovacuum's stead", "err", err)
		}
	}
}
