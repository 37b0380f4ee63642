package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/backend"
	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/slurm"
	"github.com/allotlabs/allot/internal/slurmpolicy"
	"github.com/allotlabs/allot/internal/store"
)

// slurmFlags are the flags that point Allot at a Slurm cluster (`allot
// worker`, `allot server`, `allot slurm`). Every one also comes from the
// environment (ALLOT_WORKER_SLURM_URL …, see `allot help env`).
type slurmFlags struct {
	url, version, user, keyFile, tokenFile, conf string
	partition, gpuType, overBudgetFile, since    string
	workdir                                      string
	interval                                     time.Duration
	batch                                        int
	manage                                       bool
}

func addSlurmFlags(fs *flag.FlagSet) *slurmFlags {
	f := &slurmFlags{}
	fs.StringVar(&f.url, "slurm-url", "", "slurmrestd `URL`, e.g. http://slurmctl:6820: run the jobs of Slurm GPU types on this Slurm cluster (\"\": no Slurm)")
	fs.StringVar(&f.version, "slurm-rest-version", "auto", "slurmrestd API version: v0.0.38 (Slurm 22.05), v0.0.40 (23.11), v0.0.41 (24.05), or auto")
	fs.StringVar(&f.user, "slurm-user", "slurm", "the SlurmUser (or root) whose token Allot uses as an authenticating proxy, submitting as each engineer")
	fs.StringVar(&f.keyFile, "slurm-jwt-key", "", "`file` with slurmctld's HS256 JWT key (AuthAltParameters=jwt_key=…): Allot mints 5-minute tokens from it")
	fs.StringVar(&f.tokenFile, "slurm-token-file", "", "`file` with a token from `scontrol token username=slurm lifespan=…`, instead of --slurm-jwt-key")
	fs.StringVar(&f.conf, "slurm-conf", "", "slurm.conf `path` for the Slurm commands Allot runs (scontrol drain on 22.05, sacctmgr for accounts and QOS); \"\": the default")
	fs.StringVar(&f.workdir, "slurm-workdir", "/tmp", "working `directory` of Slurm jobs that name none (their output: allot-<id>-<Slurm id>.out there)")
	fs.StringVar(&f.partition, "slurm-partition", "", "partition Allot submits to (\"\": the cluster's default)")
	fs.StringVar(&f.gpuType, "slurm-gpu-type", "", "Allot GPU type (of backend slurm) for Slurm nodes and jobs whose GRES type names none")
	fs.StringVar(&f.overBudgetFile, "slurm-over-budget-file", "", "`file` the worker keeps the teams over budget in, for job_submit.lua (\"\": not written; GET /api/v1/slurm/over-budget has it too)")
	fs.StringVar(&f.since, "slurm-import-since", "", "first accounting import starts here (RFC 3339 or YYYY-MM-DD; default the start of this month)")
	fs.BoolVar(&f.manage, "slurm-manage-accounts", false, "the worker keeps Slurm's accounts, users and QOS what Allot's policy says (sacctmgr on this host, every minute; see allot slurm diff)")
	fs.IntVar(&f.batch, "slurm-import-batch", store.DefaultImportBatch, "accounting runs imported per transaction (a crash redoes at most one batch)")
	fs.DurationVar(&f.interval, "slurm-sync", jobs.DefaultEngineInterval, "how often the worker syncs with Slurm")
	return f
}

func (f *slurmFlags) enabled() bool { return f.url != "" }

// env is the environment of the Slurm commands Allot runs.
func (f *slurmFlags) env() []string {
	env := os.Environ()
	if f.conf != "" {
		env = append(env, "SLURM_CONF="+f.conf)
	}
	return env
}

// validate checks the flags themselves (a usage error: exit 2).
func (f *slurmFlags) validate() error {
	switch {
	case f.keyFile != "" && f.tokenFile != "":
		return errors.New("give --slurm-jwt-key or --slurm-token-file, not both")
	case f.keyFile == "" && f.tokenFile == "":
		return errors.New("--slurm-url needs --slurm-jwt-key (slurmctld's JWT key) or --slurm-token-file")
	case f.interval <= 0:
		return errors.New("--slurm-sync must be a positive duration, e.g. 5s")
	case f.batch < 1:
		return errors.New("--slurm-import-batch must be at least 1")
	case !filepath.IsAbs(f.workdir):
		return errors.New("--slurm-workdir must be an absolute path")
	}
	_, err := f.importSince()
	return err
}

// client connects (after validate); check pings slurmrestd, so that a
// wrong URL or token is an error at start, not a silent queue.
func (f *slurmFlags) client(ctx context.Context, check bool) (*slurm.Client, slurm.Info, error) {
	var info slurm.Info
	if err := f.validate(); err != nil {
		return nil, info, err
	}
	v := f.version
	if v == "auto" {
		v = ""
	}
	c, err := slurm.New(slurm.Config{URL: f.url, Version: v, TokenUser: f.user, JWTKeyFile: f.keyFile, TokenFile: f.tokenFile, SlurmConf: f.conf})
	if err != nil {
		return nil, info, err
	}
	if check {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		if info, err = c.Ping(cctx); err != nil {
			return nil, info, fmt.Errorf("checking Slurm at %s: %w", f.url, err)
		}
	}
	return c, info, nil
}

func (f *slurmFlags) importSince() (time.Time, error) {
	if f.since == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02"} {
		if t, err := time.Parse(layout, f.since); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("--slurm-import-since: want RFC 3339 or YYYY-MM-DD, got %q", f.since)
}

// reconciler builds the worker's Slurm sync, checking the cluster answers.
func (f *slurmFlags) reconciler(ctx context.Context) (func(*store.Store) *backend.Reconciler, error) {
	since, err := f.importSince()
	if err != nil {
		return nil, err
	}
	c, info, err := f.client(ctx, true)
	if err != nil {
		return nil, err
	}
	return func(st *store.Store) *backend.Reconciler {
		r := &backend.Reconciler{Store: st, Engine: &backend.SlurmEngine{Client: c, Partition: f.partition, WorkDir: f.workdir},
			Mapping:        store.EngineMapping{Backend: allot.BackendSlurm, DefaultGPUType: f.gpuType, ImportBatch: f.batch},
			OverBudgetFile: f.overBudgetFile, ImportSince: since, Cluster: f.url, Version: info.Version + " (Slurm " + info.Release + ")"}
		if f.manage {
			r.ApplyPolicy = backend.SlurmPolicyApplier(st, f.env())
		}
		return r
	}, nil
}

const slurmUsage = `allot slurm: Allot on a Slurm cluster (see README "Allot on your Slurm cluster")

  allot slurm check   [slurm flags]            is slurmrestd there, and does it take Allot's token?
  allot slurm render  [--out DIR]              the Slurm config Allot's live policy needs: slurm.conf fragment,
                                               sacctmgr commands, job_submit.lua, over-budget list (DATABASE_URL)
  allot slurm diff    [--slurm-conf F]         what the cluster's accounts and QOS lack (sacctmgr), as commands
  allot slurm apply   [--slurm-conf F]         make the cluster's accounts and QOS what Allot's policy says
  allot slurm sync    [slurm flags]            one sync now: nodes, drains, jobs, submissions, accounting import

Slurm flags: --slurm-url URL (--slurm-jwt-key FILE | --slurm-token-file FILE) [--slurm-user slurm]
  [--slurm-rest-version auto] [--slurm-conf FILE] [--slurm-gpu-type T] [--slurm-partition P]
  [--slurm-over-budget-file FILE] [--slurm-import-since DATE]; --database-url or DATABASE_URL where Allot's database is needed.
`

// cmdSlurm is `allot slurm`.
func cmdSlurm(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, slurmUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	verb := args[0]
	fs := flag.NewFlagSet("slurm "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, slurmUsage) }
	dbURL := fs.String("database-url", "", "PostgreSQL URL (default: env DATABASE_URL)")
	out := fs.String("out", "", "render: write the four files into this directory (default: print them)")
	keyFile := fs.String("secret-key-file", "", "sync: the servers' `file` of keys, to hand jobs' sealed secret env to Slurm (without it such jobs wait, saying why)")
	sf := addSlurmFlags(fs)
	if err := cliflag.Parse(fs, args[1:]); err != nil {
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "allot slurm %s: unexpected %q\n", verb, fs.Arg(0))
		return 2
	}
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintf(stderr, "allot slurm %s: %v\n", verb, err)
		return 1
	}
	openStore := func() (*store.Store, func(), error) {
		url, err := databaseURL(*dbURL)
		if err != nil {
			return nil, nil, err
		}
		var keys *store.SecretKeys
		if *keyFile != "" {
			if keys, err = store.LoadSecretKeys(*keyFile); err != nil {
				return nil, nil, err
			}
		}
		pool, err := store.Open(ctx, url)
		if err != nil {
			return nil, nil, err
		}
		st := store.New(pool)
		st.Secrets = keys
		return st, pool.Close, nil
	}
	switch verb {
	case "check":
		if !sf.enabled() {
			fmt.Fprintln(stderr, "allot slurm check: --slurm-url is required")
			return 2
		}
		if err := sf.validate(); err != nil {
			fmt.Fprintf(stderr, "allot slurm check: %v\n", err)
			return 2
		}
		_, info, err := sf.client(ctx, true)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "slurmrestd at %s answers: REST %s, Slurm %s, controllers %v\n", sf.url, info.Version, info.Release, info.Controllers)
		return 0
	case "render":
		st, closeDB, err := openStore()
		if err != nil {
			return fail(err)
		}
		defer closeDB()
		in, err := st.SlurmPolicyInput(ctx)
		if err != nil {
			return fail(err)
		}
		if sf.overBudgetFile != "" {
			in.OverBudgetFile = sf.overBudgetFile
		}
		r := slurmpolicy.Render(in)
		files := []struct{ name, text string }{{"slurm-allot.conf", r.SlurmConf}, {"sacctmgr-allot.sh", r.Sacctmgr},
			{"job_submit.lua", r.JobSubmitLua}, {"allot-over-budget", r.OverBudgetList}}
		for _, f := range files {
			if *out == "" {
				fmt.Fprintf(stdout, "==> %s <==\n%s\n", f.name, f.text)
				continue
			}
			if err := os.WriteFile(filepath.Join(*out, f.name), []byte(f.text), 0o644); err != nil {
				return fail(err)
			}
			fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(*out, f.name))
		}
		return 0
	case "diff", "apply":
		st, closeDB, err := openStore()
		if err != nil {
			return fail(err)
		}
		defer closeDB()
		changes, err := backend.SlurmPolicyChanges(ctx, st, sf.env())
		if err != nil {
			return fail(err)
		}
		if len(changes) == 0 {
			fmt.Fprintln(stdout, "the cluster's accounts and QOS are what Allot's policy says")
			return 0
		}
		for _, c := range changes {
			fmt.Fprintf(stdout, "%s\n    %s\n", c.String(), c.Command())
		}
		if verb == "diff" {
			return 0
		}
		if err := slurmpolicy.Apply(ctx, sf.env(), changes); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "applied %d changes\n", len(changes))
		return 0
	case "sync":
		if !sf.enabled() {
			fmt.Fprintln(stderr, "allot slurm sync: --slurm-url is required")
			return 2
		}
		if err := sf.validate(); err != nil {
			fmt.Fprintf(stderr, "allot slurm sync: %v\n", err)
			return 2
		}
		st, closeDB, err := openStore()
		if err != nil {
			return fail(err)
		}
		defer closeDB()
		mk, err := sf.reconciler(ctx)
		if err != nil {
			return fail(err)
		}
		rep, err := mk(st).Sync(ctx)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "synced in %s: %d nodes (%d drained, %d resumed), %d jobs (%d imported), %d submitted (%d refused), %d cancelled, %d demoted, %d runs (%d new, %d updated)\n",
			rep.Took.Round(time.Millisecond), rep.Nodes, rep.Drained, rep.Resumed, rep.Jobs, rep.ImportedJobs, rep.Submitted, rep.SubmitFailed,
			rep.Cancelled, rep.Demoted, rep.Runs, rep.NewRuns, rep.UpdatedRuns)
		for _, u := range rep.Unmapped {
			fmt.Fprintf(stdout, "not imported: %s\n", u)
		}
		return 0
	}
	fmt.Fprint(stderr, slurmUsage)
	return 2
}
