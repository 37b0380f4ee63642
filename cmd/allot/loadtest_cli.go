package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	neturl "net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/apf"
	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/devdb"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/loadtest"
	"github.com/allotlabs/allot/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const loadtestUsage = `usage: allot loadtest [flags]

Drives Allot with simulated node agents and submitting clients for
--duration and reports, per operation, count, errors by status, rate and
p50/p90/p95/p99/max latency, and the scheduling cycles the worker ran.

Two ways to run it:

  allot loadtest --database-url postgres://…/postgres [flags]
      boots its own server and worker in this process on a fresh database
      it creates on that PostgreSQL (allot_loadtest_<time>_<pid>), seeds
      the demo organisation, runs, reports and drops the database
      (--keep-db keeps it). The README's load figures come from this mode.

  allot loadtest --url https://allot.example.com --token allot_… [--database-url …]
      against a running server. Submitters and pages need only the token
      (one that may submit to --teams); agents, --nodes, --pending and
      --pages seed through the server's own database, so they need its
      --database-url as well. Nodes, tokens and jobs it adds are named lt-….

Simulated agents register with node tokens, heartbeat with readings for
every GPU, long-poll their orders, take every lease offered, report it
started, and exited 0 after --job-runtime (a stop order ends it at once):
jobs really go through the scheduler. Latencies of paced calls (submits
at --submit-rate, heartbeats) count from when the call was due.

flags:
`

// cmdLoadtest is `allot loadtest`.
func cmdLoadtest(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, loadtestUsage)
		fs.PrintDefaults()
	}
	url := fs.String("url", "", "a running server to load (else one is booted on a fresh database of --database-url)")
	token := cliflag.Secret(fs, "token", "ALLOT_TOKEN", "personal API token for submissions and pages (with --url)")
	metricsURLs := fs.String("metrics-url", "", "with --url: the server's and worker's /metrics (comma-separated; --token is sent as the bearer),\nread before and after the window for the server's time per route, admission refusals and the cycle phases")
	dbURL := fs.String("database-url", "", "PostgreSQL: where to create the fresh database (alone), or the running server's database (with --url)")
	keepDB := fs.Bool("keep-db", false, "keep the fresh database after the run")
	processes := fs.Bool("processes", false, "run the booted server and worker as processes of their own, as production does: allot server --serve users,\nallot server --serve agents (the agents' address) and allot worker, started from this binary")
	agentNice := fs.Int("agent-server-nice", 0, "with --processes: the agent API server's nice value (-20..19; negative needs root): its priority on shared cores")
	minCycle := fs.Duration("min-cycle-interval", 0, "a booted worker's least time between two cycles (as `allot worker --min-cycle-interval`; 0: none)")
	duty := fs.Float64("cycle-duty", jobs.DefaultCycleDuty, "a booted worker's most share of time in cycles while requests keep coming (as `allot worker --cycle-duty`; 1: back to back)")
	agentConns := fs.Int("agent-conns", 0, "a booted server's agent API pool (default: `allot server`'s, "+fmt.Sprint(DefaultHTTPLimits.AgentConns)+")")
	admission := admissionFlags(fs, apf.Default) // a booted server's, as `allot server`'s
	var cfg loadtest.Config
	fs.DurationVar(&cfg.Duration, "duration", 60*time.Second, "how long the load runs and is measured")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "run the load this long before the measured --duration (the cluster fills, cycles settle)")
	fs.IntVar(&cfg.Submitters, "submitters", 32, "concurrent submitting clients")
	fs.Float64Var(&cfg.SubmitRate, "submit-rate", 0, "target submissions/s over all submitters (0: as fast as they go)")
	fs.StringVar(&cfg.SubmitGPUType, "submit-gpu-type", "", "GPU type the submitted jobs ask for (default any; one no agent has keeps them pending)")
	teams := fs.String("teams", "fraud,recs,nlp", "teams to submit to, comma-separated; the first one's page is timed")
	fs.IntVar(&cfg.Agents, "agents", 100, "simulated node agents")
	fs.IntVar(&cfg.GPUsPerAgent, "gpus-per-agent", 8, "GPUs of each simulated (and seeded) node")
	fs.StringVar(&cfg.GPUType, "gpu-type", "A100-80GB", "GPU type of the simulated and seeded nodes")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", agentproto.DefaultHeartbeatInterval, "the agents' heartbeat interval")
	fs.DurationVar(&cfg.JobRuntime, "job-runtime", 30*time.Second, "how long a simulated job runs before it exits 0 (0: until the run ends)")
	fs.IntVar(&cfg.Pending, "pending", 0, "pending jobs to seed by SQL before the run")
	fs.IntVar(&cfg.Nodes, "nodes", 0, "busy nodes (no agent, one running job each) to seed by SQL before the run")
	fs.BoolVar(&cfg.Pages, "pages", false, "also time GET /cluster and the first team's page, with a year of history seeded")
	fs.IntVar(&cfg.HistoryJobs, "history-jobs", 50000, "finished 8-GPU jobs in the year of history (--pages)")
	fs.DurationVar(&cfg.PageInterval, "page-interval", 500*time.Millisecond, "pause between two rounds of page requests")
	probe := fs.Bool("cycle-probe", true, "time one cycle of the tool's own scheduler after seeding (needs --database-url)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	cpuProfile := fs.String("cpu-profile", "", "write a CPU profile of this process (the tool, and a booted server and worker) to this file")
	level := &cliflag.Level{Level: slog.LevelError}
	fs.Var(level, "log-level", "log level of the tool and a booted server: debug, info, warn or error (a booted server warns of every\nrace a simulated agent loses, e.g. a heartbeat listing a job that just exited)")
	if err := cliflag.Parse(fs, args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	bad := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "allot loadtest: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	for _, t := range strings.Split(*teams, ",") {
		if t = strings.TrimSpace(t); t != "" {
			cfg.Teams = append(cfg.Teams, t)
		}
	}
	selfHosted := *url == ""
	if selfHosted && *dbURL == "" {
		return bad("give --database-url (boot a server on a fresh database there) or --url and --token (a running server)")
	}
	if selfHosted && *metricsURLs != "" {
		return bad("--metrics-url is for a running server (--url); a booted one's registry is read directly")
	}
	if !selfHosted && (*keepDB || *agentConns != 0 || *minCycle != 0 || *duty != jobs.DefaultCycleDuty) {
		return bad("--keep-db, --agent-conns, --min-cycle-interval and --cycle-duty are for a booted server (no --url)")
	}
	if !selfHosted && *processes {
		return bad("--processes is for a booted server (no --url)")
	}
	if *agentNice != 0 && !*processes {
		return bad("--agent-server-nice needs --processes")
	}
	if *agentNice < -20 || *agentNice > 19 {
		return bad("--agent-server-nice must be -20..19, not %d", *agentNice)
	}
	if *processes && cfg.Heartbeat > agentproto.DefaultHeartbeatInterval {
		return bad("--processes: the processes tell agents to heartbeat every %s (allot server's); --heartbeat must be at most that, not %s", agentproto.DefaultHeartbeatInterval, cfg.Heartbeat)
	}
	if err := jobs.CheckMinCycleInterval(*minCycle); err != nil {
		return bad("%v", err)
	}
	if err := jobs.CheckCycleDuty(*duty); err != nil {
		return bad("%v", err)
	}
	if *agentConns < 0 || *agentConns > 1000 {
		return bad("--agent-conns must be 0..1000, not %d", *agentConns)
	}
	adm, err := admission()
	if err != nil {
		return bad("%v", err)
	}
	cfg.URL, cfg.Token = *url, token()
	if *metricsURLs != "" {
		var ss loadtest.Scrapes
		for _, u := range strings.Split(*metricsURLs, ",") {
			if u = strings.TrimSpace(u); u == "" {
				continue
			}
			if pu, err := neturl.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
				return bad("--metrics-url: %q is not an http(s) URL", u)
			}
			ss = append(ss, loadtest.Scrape{URL: u, Token: cfg.Token})
		}
		cfg.Gather = ss
	}
	cfg.CycleProbe = *probe && *dbURL != ""
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level.Level}))
	cfg.Logger = logger
	if selfHosted {
		// Validate the flags before creating anything: the URL and token
		// come from the booted server.
		check := cfg
		check.URL, check.Token, check.DB, check.Store = "http://booted", "booted", new(pgxpool.Pool), &store.Store{}
		if err := check.Validate(); err != nil {
			return bad("%v", err)
		}
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "allot loadtest: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "allot loadtest: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var rep *loadtest.Report
	if selfHosted {
		o := procOptions{agentConns: *agentConns, minCycle: *minCycle, duty: *duty, agentNice: *agentNice, admission: adm}
		if *processes {
			rep, err = loadtestProcesses(ctx, *dbURL, *keepDB, o, cfg, logger, stderr)
		} else {
			rep, err = loadtestSelfHosted(ctx, *dbURL, *keepDB, o, cfg, logger, stderr)
		}
	} else {
		if *dbURL != "" {
			pool, perr := store.Open(ctx, *dbURL)
			if perr != nil {
				fmt.Fprintf(stderr, "allot loadtest: %v\n", perr)
				return 1
			}
			defer pool.Close()
			cfg.DB, cfg.Store = pool, store.New(pool)
		}
		if verr := cfg.Validate(); verr != nil {
			return bad("%v", verr)
		}
		rep, err = loadtest.Run(ctx, cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "allot loadtest: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "allot loadtest: %v\n", err)
		return 1
	}
	return 0
}

// loadtestSelfHosted creates a fresh database on the PostgreSQL of
// adminURL, boots a server and River worker on it in this process (as
// `allot server` + `allot worker` would, on one pool), seeds the demo
// organisation with its queued jobs cancelled (the run's own load is all
// there is), makes the admin an API token and runs cfg against it.
func loadtestSelfHosted(ctx context.Context, adminURL string, keep bool, o procOptions, cfg loadtest.Config, logger *slog.Logger, stderr io.Writer) (*loadtest.Report, error) {
	dbURL, drop, err := loadtestDatabase(ctx, adminURL, keep, stderr)
	if err != nil {
		return nil, err
	}
	defer drop()
	checkpoints, err := os.MkdirTemp("", "allot-loadtest-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(checkpoints)
	m := &Main{Config: Config{DatabaseURL: dbURL, Addr: "127.0.0.1:0", Worker: true, Migrate: true, Logger: logger,
		HeartbeatInterval: cfg.Heartbeat, CheckpointRoot: checkpoints, HTTP: HTTPLimits{AgentConns: o.agentConns}, Admission: o.admission, MinCycleInterval: o.minCycle, CycleDuty: o.duty}}
	if err := m.Run(ctx); err != nil {
		m.Close() //nolint:errcheck
		return nil, err
	}
	defer func() {
		if err := m.Close(); err != nil {
			logger.Warn("closing the booted server", "err", err)
		}
	}()
	if cfg.Token, err = loadtestSeed(ctx, m.Store); err != nil {
		return nil, err
	}
	cfg.URL, cfg.DB, cfg.Store, cfg.Gather = m.URL(), m.Pool, m.Store, m.Registry
	return loadtest.Run(ctx, cfg)
}

// loadtestDatabase creates a fresh database on the PostgreSQL of adminURL
// and returns its URL and what drops it (unless keep: then it says so).
func loadtestDatabase(ctx context.Context, adminURL string, keep bool, stderr io.Writer) (string, func(), error) {
	name := fmt.Sprintf("allot_loadtest_%d_%d", time.Now().Unix(), os.Getpid())
	dbURL, err := devdb.EnsureDatabase(ctx, adminURL, name)
	if err != nil {
		return "", nil, err
	}
	return dbURL, func() {
		if keep {
			fmt.Fprintf(stderr, "allot loadtest: kept database %s\n", name)
			return
		}
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(dctx, adminURL)
		if err == nil {
			_, err = conn.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			conn.Close(dctx) //nolint:errcheck
		}
		if err != nil {
			fmt.Fprintf(stderr, "allot loadtest: dropping database %s: %v\n", name, err)
		}
	}, nil
}

// loadtestSeed seeds the demo organisation with its queued jobs cancelled
// (the run's own load is all there is) and returns an API token of its
// admin.
func loadtestSeed(ctx context.Context, st *store.Store) (string, error) {
	if err := demo.Seed(ctx, st); err != nil {
		return "", fmt.Errorf("seeding the demo: %w", err)
	}
	admin, err := st.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		return "", err
	}
	queued, err := st.ListJobs(ctx, store.JobFilter{State: allot.JobPending, Limit: -1})
	if err != nil {
		return "", err
	}
	for _, j := range queued {
		if _, err := st.CancelJob(ctx, &admin, j.ID); err != nil {
			return "", err
		}
	}
	tok, _, err := st.CreateAPIToken(ctx, admin.ID, "loadtest")
	return tok, err
}
