// Command allot is the single Allot binary: portal server, worker, node
// agent, CLI and trace simulator, chosen by subcommand.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/allotlabs/allot/internal/agent"
	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/scheduler/sim"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: allot <command> [flags]

Run the system:
  dev       everything in one process with demo data (finds or starts PostgreSQL)
  server    portal and JSON API (DATABASE_URL)
  worker    River worker pool: scheduling cycles and periodic jobs (DATABASE_URL)
  agent     node agent: runs the jobs the scheduler gives this node (--gpu nvml|fake, --health-cmd PROG)
  migrate   apply database migrations (DATABASE_URL); the default tiers and policy come with them
  bootstrap-admin  the first admin and an API token (DATABASE_URL): allot bootstrap-admin --email ops@corp.example
  slurm     Allot on a Slurm cluster: allot slurm check | render | diff | apply | sync (see allot slurm help)
  secret-key  the key that encrypts jobs' secret env at rest: allot secret-key new > /etc/allot/secret.key | reseal --secret-key-file F (DATABASE_URL)
  node-token  node agents' tokens (DATABASE_URL): allot node-token create NAME --gpu-type T --gpus N [--label k=v] | list [NODE] | revoke ID|PREFIX|--node NODE | rotate NODE

Use it:
  submit    submit a job:  allot submit --team nlp --tier 3 --gpus 8 --time 4h -- python train.py; a Slurm batch script: allot submit job.sh
  jobs      list jobs, like squeue:  allot jobs --me --state PD,R --format id,name,st,time,reason
  cancel    cancel jobs, like scancel:  allot cancel 42 43, or by filter: allot cancel --team nlp --state PD --me --yes
  show      a job as Key=Value lines, like scontrol show job:  allot show 42
  share     each team's fair share and budget use, like sshare
  prio      pending jobs in queue order with their priority factors, like sprio
  nodes     nodes by GPU type and state, like sinfo:  allot nodes -N
  completion  shell completion: allot completion bash | zsh | fish  (e.g. source <(allot completion bash))
  login     sign in through the server's single sign-on (a link and a code for any browser); stores a token that renews itself
  logout    sign out: revoke the stored token and remove it
  token     personal API tokens: allot token create --name laptop | list | revoke ID
  user      who jobs run as (admin): allot user accounts | set-account noah@example.com noah | disable EMAIL | enable EMAIL
  team      teams (admin): allot team list | create ml --name "Machine Learning" --budget-gpu-hours 1000 | set ml --guarantee H100=8 | set-account ml svc-ml
  gpu-type  GPU types (admin): allot gpu-type list | create H100 --memory-gb 80 --rate 4.10 | set NAME --rate R | retire NAME
  billing   allot billing rollup: the hourly billing rollup, now (DATABASE_URL)
  node      nodes (admin): allot node list | drain gpu03 --reason "fan" [--requeue] | undrain gpu03 --note "fixed" | set gpu03 --gpu-type H100 --gpus 8

Measure it:
  sim       replay a job trace through the scheduler and baselines

Run 'allot <command> -h' for a command's flags, 'allot help env' for the ALLOT_* variables they read,
'allot help sbatch' for the #SBATCH options allot submit reads.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "dev":
		return cmdDev(args[1:], stdout, stderr)
	case "server":
		return cmdServe(args[0], args[1:], stderr)
	case "worker":
		return cmdServe(args[0], args[1:], stderr)
	case "secret-key":
		return cmdSecretKey(args[1:], stdout, stderr)
	case "migrate":
		return cmdMigrate(args[1:], stdout, stderr)
	case "slurm":
		return cmdSlurm(args[1:], stdout, stderr)
	case "bootstrap-admin":
		return cmdBootstrapAdmin(args[1:], stdout, stderr)
	case "gpu-type":
		return cmdGPUType(args[1:], stdout, stderr)
	case "billing":
		return cmdBilling(args[1:], stdout, stderr)
	case "submit":
		return cmdSubmit(args[1:], stdout, stderr)
	case "jobs":
		return cmdJobs(args[1:], stdout, stderr)
	case "cancel":
		return cmdCancel(args[1:], stdout, stderr)
	case "show":
		return cmdShow(args[1:], stdout, stderr)
	case "share":
		return cmdShare(args[1:], stdout, stderr)
	case "prio":
		return cmdPrio(args[1:], stdout, stderr)
	case "nodes":
		return cmdNodes(args[1:], stdout, stderr)
	case "completion":
		return cmdCompletion(args[1:], stdout, stderr)
	case completeCommand: // hidden: what shell completion asks for
		return cmdComplete(args[1:], stdout)
	case "login":
		return cmdLogin(args[1:], stdout, stderr)
	case "logout":
		return cmdLogout(args[1:], stdout, stderr)
	case "token":
		return cmdToken(args[1:], stdout, stderr)
	case "user":
		if len(args) > 1 && (args[1] == "disable" || args[1] == "enable") {
			return cmdUserAccess(args[1], args[2:], stdout, stderr)
		}
		return cmdUser(args[1:], stdout, stderr)
	case "team":
		return cmdTeam(args[1:], stdout, stderr)
	case "sim":
		return sim.Main(args[1:], stdout, stderr)
	case "test-env":
		return cmdTestEnv(args[1:], stdout, stderr)
	case "agent":
		return agent.Main(args[1:], stdout, stderr)
	case agent.ShimCommand: // hidden: each job's supervisor, started by the agent
		return agent.ShimMain(args[1:], stderr)
	case "oidc-provider": // hidden: the development OIDC provider
		return cmdOIDCProvider(args[1:], stdout, stderr)
	case "node-token":
		return cmdNodeToken(args[1:], stdout, stderr)
	case "node":
		return cmdNode(args[1:], stdout, stderr)
	case "loadtest":
		return cmdLoadtest(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		if len(args) > 1 && args[1] == "env" {
			return cmdHelpEnv(stdout)
		}
		if len(args) > 1 && args[1] == "sbatch" {
			return cmdHelpSbatch(stdout)
		}
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "allot: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

func databaseURL(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u, nil
	}
	return "", errors.New("set DATABASE_URL (or --database-url) to the PostgreSQL to use")
}

// cmdServe runs `allot server` or `allot worker` until SIGINT/SIGTERM.
func cmdServe(name string, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", "", "PostgreSQL URL (default: env DATABASE_URL)")
	migrate := fs.Bool("migrate", false, "apply migrations before starting")
	level := cliflag.LogLevel(fs, slog.LevelInfo, "log `level`: debug, info, warn or error (default info; River's own routine lines only at debug)")
	addr := ":8080"
	var oidcConfig func() (web.OIDCConfig, error)
	tokenTTL := noAPITokenTTL
	requireAccount := new(bool)
	applyLimits := func(*Config) error { return nil }
	serve := new(string)
	if name == "server" {
		applyLimits = limitFlags(fs)
		fs.StringVar(&addr, "addr", ":8080", "listen address")
		serve = fs.String("serve", web.ServeAll, "what this server answers: all, agents (the agent API only, with health and metrics) or users (the portal and API, no agent API): replicas of each role keep node agents and user traffic in processes of their own")
		oidcConfig = oidcFlags(fs)
		tokenTTL = apiTokenTTLFlag(fs)
		requireAccount = fs.Bool("require-posix-account", os.Getenv("ALLOT_REQUIRE_POSIX_ACCOUNT") == "true",
			"refuse a job for which no POSIX account resolves (admin mapping, --oidc-account-claim, team service account); off, such jobs run as the agent's --job-user (env ALLOT_REQUIRE_POSIX_ACCOUNT=true)")
	}
	secretKeyFile := fs.String("secret-key-file", "", "`file` of the key(s) that encrypt jobs' secret environment values at rest (allot secret-key new; mode 0600); the server seals and hands them to agents, the worker hands them to Slurm: give both the same file. Unset: stored in clear")
	bf := addBurstFlags(fs, "none") // the server shows the burst settings on /burst; the worker acts on them
	sf := addSlurmFlags(fs)         // the worker syncs with Slurm; the server shows its config on /admin/slurm
	applyMetrics := metricsFlags(fs, name)
	maxStarts, decay, minCycle, duty := new(int), new(time.Duration), new(time.Duration), new(float64)
	*duty = jobs.DefaultCycleDuty
	if name == "worker" {
		duty = fs.Float64("cycle-duty", jobs.DefaultCycleDuty,
			"most of the time scheduling cycles may take while requests keep coming: after a cycle that took d, the next starts no sooner than d×(1−duty)/duty after it (at most 10 s), so cycles over a large queue leave the cores to heartbeats and submissions while a small cluster's cycles of a few ms wait a few ms (1: back to back)")
		minCycle = fs.Duration("min-cycle-interval", 0,
			"least time between the starts of two scheduling cycles (like Slurm's sched_min_interval): under a storm of submissions one cycle takes all that came meanwhile, instead of cycles over a large queue running back to back; a start waits at most this much more (0: none)")
		maxStarts = fs.Int("max-starts-per-cycle", jobs.DefaultMaxStarts,
			"most jobs one scheduling cycle starts; the rest start in the next cycle, at once (-1: no limit; like Slurm's sched_max_job_start)")
		decay = fs.Duration("decay-period", jobs.DefaultDecayPeriod,
			"how often a cycle decays the teams' fair-share usage and brings it up to now; cycles in between rank with the last (like Slurm's PriorityCalcPeriod; 0: every cycle)")
	}
	if err := cliflag.Parse(fs, args); err != nil {
		return 2
	}
	if name == "worker" && (*maxStarts == 0 || *maxStarts < -1) {
		fmt.Fprintf(stderr, "allot %s: --max-starts-per-cycle must be a positive number of jobs, or -1 for no limit\n", name)
		return 2
	}
	if err := jobs.CheckMinCycleInterval(*minCycle); err != nil {
		fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
		return 2
	}
	if err := jobs.CheckCycleDuty(*duty); err != nil {
		fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
		return 2
	}
	if *decay < 0 {
		fmt.Fprintf(stderr, "allot %s: --decay-period must be 0 (every cycle) or more, not %s\n", name, *decay)
		return 2
	}
	url, err := databaseURL(*dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level.Level, ReplaceAttr: clock.LogTime}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *secretKeyFile != "" {
		if _, err := store.LoadSecretKeys(*secretKeyFile); err != nil {
			fmt.Fprintf(stderr, "allot %s: --secret-key-file: %v\n", name, err)
			return 2
		}
	}
	cfg := Config{DatabaseURL: url, Migrate: *migrate, Logger: log, RequirePOSIXAccount: *requireAccount, SecretKeyFile: *secretKeyFile}
	if name == "worker" {
		cfg.MaxStartsPerCycle = *maxStarts
		cfg.MinCycleInterval = *minCycle
		cfg.CycleDuty = *duty
		cfg.DecayPeriod = *decay
		if *decay == 0 {
			cfg.DecayPeriod = -1 // jobs.Scheduler: <0 decays every cycle
		}
		if sf.enabled() {
			if err := sf.validate(); err != nil {
				fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
				return 2
			}
			if cfg.Engine, err = sf.reconciler(ctx); err != nil {
				fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
				return 1
			}
			cfg.EngineInterval = sf.interval
		}
	}
	if sf.conf != "" || sf.enabled() {
		cfg.SlurmEnv = sf.env()
	}
	cfg.SlurmOverBudgetFile = sf.overBudgetFile
	if name == "server" {
		if err := web.CheckServe(*serve); err != nil {
			fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
			return 2
		}
		cfg.Addr, cfg.APITokenTTL, cfg.Serve = addr, tokenTTL(), *serve
		if cfg.OIDC, err = oidcConfig(); err != nil {
			fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
			return 2
		}
	} else {
		cfg.Worker = true
	}
	if cfg.Burst, err = bf.config(nil); err != nil {
		fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
		return 2
	}
	if err := applyMetrics(&cfg); err != nil {
		fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
		return 2
	}
	if err := applyLimits(&cfg); err != nil {
		fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
		return 2
	}
	m := &Main{Config: cfg}
	if err := m.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
		m.Close()
		return 1
	}
	log.Info("started", "command", name, "url", m.URL())
	err = m.Wait(ctx)
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(stderr, "allot %s: %v\n", name, err)
		return 1
	}
	return 0
}

func cmdMigrate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbURL := fs.String("database-url", "", "PostgreSQL URL (default: env DATABASE_URL)")
	if err := cliflag.Parse(fs, args); err != nil {
		return 2
	}
	url, err := databaseURL(*dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "allot migrate: %v\n", err)
		return 2
	}
	ctx := context.Background()
	pool, err := store.Open(ctx, url)
	if err != nil {
		fmt.Fprintf(stderr, "allot migrate: %v\n", err)
		return 1
	}
	defer pool.Close()
	if err := store.Migrate(ctx, pool, slog.New(slog.NewTextHandler(stdout, nil))); err != nil {
		fmt.Fprintf(stderr, "allot migrate: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, "database is up to date")
	return 0
}

// runChild runs argv with env, wiring stdio, and returns its exit code.
func runChild(argv []string, env []string, stdout, stderr io.Writer) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, os.Stdin, stdout, stderr
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "allot: %v\n", err)
		return 1
	}
	go func() {
		for s := range sig {
			cmd.Process.Signal(s) //nolint:errcheck
		}
	}()
	if err := cmd.Wait(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		return 1
	}
	return 0
}
