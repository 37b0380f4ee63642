package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/allotlabs/allot/internal/agent"
	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/devdb"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/oidcdev"
	"github.com/allotlabs/allot/internal/store"
	"github.com/jackc/pgx/v5"
)

const devTokenName = "dev persona token"

// cmdDev runs the whole system with demo data on a database it finds or
// starts: `make run`.
func cmdDev(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return devMain(ctx, args, stdout, stderr)
}

// devMain is `allot dev` until ctx ends.
func devMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", ":8080", "listen address of the portal and API")
	dataDir := fs.String("data-dir", ".allot/pgdata", "where a private PostgreSQL keeps its data when one must be started; tokens.env and faults/ go next to it")
	noAgents := fs.Bool("no-agents", false, "do not start the 16 in-process agents with fake GPUs")
	dbURL := cliflag.Secret(fs, "database-url", "DATABASE_URL", "PostgreSQL `URL` to use as is (unset: find or start one)")
	noOIDC := fs.Bool("no-oidc", false, "do not start the development OIDC provider (with ALLOT_OIDC_ISSUER set, that provider is used instead)")
	oidcAddr := fs.String("oidc-addr", defaultDevOIDCAddr, "listen address of the development OIDC provider; when the default is taken it moves to a free port and says so, when one given here is taken allot dev stops")
	oidcPassword := fs.String("oidc-password", "demo", "password of the development OIDC provider's users noah, nadia, finn and ada")
	jobsDir := fs.String("jobs-dir", "", "working directory of jobs that name none, holding the demo's train.py, eval.py and sweep.py (default: work next to --data-dir, .allot/work)")
	faultsDir := fs.String("faults-dir", "", "folder whose <node>.json files inject GPU faults into the in-process agents (default: faults next to --data-dir, .allot/faults)")
	now := fs.String("now", "", "run the whole demo as if it were this RFC 3339 instant (e.g. 2026-12-01T00:00:30Z); time then passes at real speed (default: env ALLOT_NOW, else the real time)")
	level := cliflag.LogLevel(fs, slog.LevelInfo, "log `level`: debug, info, warn or error (default info; debug adds River's own lines and the agents')")
	bf := addBurstFlags(fs, "local")
	tokenTTL := apiTokenTTLFlag(fs)
	metricsAddr := fs.String("metrics-addr", "", "listen `address` of a /metrics listener without authentication, e.g. 127.0.0.1:9401 (default none: the portal's /metrics, with an admin's token, has the same series)")
	requireAccount := fs.Bool("require-posix-account", true, "refuse a job for which no POSIX account resolves (the demo maps its people and teams to accounts)")
	if err := cliflag.Parse(fs, args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "allot dev: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	oidcExplicit := false
	fs.Visit(func(f *flag.Flag) { oidcExplicit = oidcExplicit || f.Name == "oidc-addr" })
	var err error
	if *oidcAddr, err = devOIDCAddr(*oidcAddr); err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		return 2
	}
	if *now != "" {
		at, err := clock.Parse(*now)
		if err != nil {
			fmt.Fprintf(stderr, "allot dev: --now: %v\n", err)
			return 2
		}
		clock.Set(at)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level.Level, ReplaceAttr: clock.LogTime}))
	// The in-process agents and burst nodes are 16+ loggers of their own:
	// warnings only, unless asked for debug.
	quiet := max(level.Level, slog.LevelWarn)
	if level.Level <= slog.LevelDebug {
		quiet = level.Level
	}
	if clock.Shifted() {
		log.Info("the clock is shifted: the demo runs as if it were "+clock.Now().UTC().Format(time.RFC3339), "offset", clock.Offset().Round(time.Second).String())
	}

	db, err := devdb.Find(ctx, devdb.Options{EnvURL: dbURL(), DataDir: *dataDir, Logger: log})
	if err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		return 1
	}
	defer db.Close()
	url := db.URL
	if db.Source != devdb.SourceEnv {
		if url, err = devdb.EnsureDatabase(ctx, db.URL, "allot"); err != nil {
			fmt.Fprintf(stderr, "allot dev: %v\n", err)
			return 1
		}
	}
	// One allot dev per database: a second would revoke the first one's
	// persona tokens and node tokens, and both would run the demo's agents.
	lock, err := lockDevDatabase(ctx, url)
	if err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		return 1
	}
	defer lock.Close(context.Background())
	stateDir := filepath.Dir(*dataDir)
	if *faultsDir == "" {
		*faultsDir = filepath.Join(stateDir, "faults")
	}
	if *faultsDir, err = filepath.Abs(*faultsDir); err == nil {
		err = os.MkdirAll(*faultsDir, 0o755)
	}
	// As root the demo's jobs run as unprivileged accounts, which must
	// reach their working and checkpoint directories: where the state
	// directory lies under one others cannot search (a 0700 home, a test's
	// temporary directory), they go to a directory of their own in TMPDIR.
	jobsRoot := stateDir
	if os.Geteuid() == 0 && !*noAgents && !searchable(filepath.Dir(mustAbs(stateDir))) {
		jobsRoot = filepath.Join(os.TempDir(), "allot-dev-"+shortHash(mustAbs(stateDir)))
		fmt.Fprintf(stderr, "allot dev: %s is not reachable by the demo's job accounts; their working and checkpoint directories are in %s until allot dev stops\n", stateDir, jobsRoot)
		if err = os.MkdirAll(jobsRoot, 0o755); err == nil {
			defer os.RemoveAll(jobsRoot)
		}
	}
	if err == nil {
		if *jobsDir == "" {
			*jobsDir = filepath.Join(jobsRoot, "work")
		}
		if *jobsDir, err = filepath.Abs(*jobsDir); err == nil {
			err = demo.WriteWorkspace(*jobsDir)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "allot dev: --faults-dir or --jobs-dir: %v\n", err)
		return 1
	}
	cpRoot, _ := filepath.Abs(filepath.Join(jobsRoot, "checkpoints"))
	// Jobs' secret env is encrypted at rest, as in production, with a key
	// of the state directory's (made once, kept with the database).
	keyFile, err := devSecretKey(stateDir)
	if err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		return 1
	}
	m := &Main{Config: Config{DatabaseURL: url, Addr: *addr, Worker: true, Migrate: true, DevMode: true, Logger: log, CheckpointRoot: cpRoot, APITokenTTL: tokenTTL(),
		RequirePOSIXAccount: *requireAccount, MetricsAddr: *metricsAddr, SecretKeyFile: keyFile}}
	// Single sign-on: the company's provider when ALLOT_OIDC_* says so,
	// else a development provider with the demo personas.
	var idp *oidcdev.Server
	var oidcMoved string
	if m.OIDC, err = oidcFlags(flag.NewFlagSet("env", flag.ContinueOnError))(); err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		return 2
	}
	if !m.OIDC.Enabled() && !*noOIDC {
		if idp, m.OIDC, oidcMoved, err = devOIDC(*oidcAddr, !oidcExplicit, *oidcPassword); err != nil {
			fmt.Fprintf(stderr, "allot dev: %v\n", err)
			return 1
		}
		defer idp.Close()
		if oidcMoved != "" {
			log.Warn(oidcMoved)
		}
	}
	local := newLocalBurst(m, slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: quiet, ReplaceAttr: clock.LogTime})))
	defer local.Close()
	if m.Burst, err = bf.config(local); err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		return 2
	}
	if err := m.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		m.Close()
		return 1
	}
	if err := lock.announce(ctx, m.URL()); err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		m.Close()
		return 1
	}
	if idp != nil {
		idp.Register(oidcdev.Client{ID: m.OIDC.ClientID, Secret: m.OIDC.ClientSecret, RedirectURIs: []string{m.URL() + "/oidc/callback"}})
	}
	defer m.Close()
	state, err := demo.Inspect(ctx, m.Store)
	switch {
	case err != nil:
	case state == demo.Empty:
		log.Info("seeding the demo organisation", "as_of", m.Store.Now().UTC().Format(time.RFC3339))
		err = demo.SeedAll(ctx, m.Store)
		if err == nil {
			// Bill the seeded history now: the worker's rollup at start
			// may have run before the seed was in (its next is an hour
			// away), and the demo's last month is to be billed complete.
			_, err = jobs.Rollup(ctx, m.Store, m.Store.Now())
		}
	case state == demo.Foreign:
		err = fmt.Errorf("the database %s holds teams but no complete demo seed (an interrupted seed of an older version, or an organisation of its own): "+
			"refusing to run the demo on it; start over with an empty database (stop allot dev, remove %s, or pass --database-url of another database)",
			redactURL(url), *dataDir)
	}
	if err == nil && m.Burst.Provider != nil {
		err = ensureBurstGPUType(ctx, m.Store, m.Burst.GPUType)
	}
	if err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		return 1
	}
	if !*noAgents {
		if err := devJobAccount(stderr, stateDir, cpRoot, *jobsDir); err != nil {
			fmt.Fprintf(stderr, "allot dev: %v\n", err)
			return 1
		}
		stopAgents, err := startDevAgentsWithFaults(ctx, m, slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: quiet, ReplaceAttr: clock.LogTime})), *faultsDir, *jobsDir)
		if err != nil {
			fmt.Fprintf(stderr, "allot dev: %v\n", err)
			return 1
		}
		defer stopAgents()
	}
	// The tokens, and the file that holds them, come before the banner: who
	// sees "Allot is running" may read .allot/tokens.env.
	type personaToken struct{ persona, email, secret string }
	var printed []personaToken
	var tokens []envVar
	for _, p := range demo.Personas {
		u, err := m.Store.UserByEmail(ctx, demo.PersonaEmail[p])
		if err != nil {
			fmt.Fprintf(stderr, "allot dev: %v\n", err)
			return 1
		}
		if err := m.Store.RevokeAPITokensNamed(ctx, u.ID, devTokenName); err != nil {
			fmt.Fprintf(stderr, "allot dev: %v\n", err)
			return 1
		}
		secret, _, err := m.Store.CreateAPIToken(ctx, u.ID, devTokenName)
		if err != nil {
			fmt.Fprintf(stderr, "allot dev: %v\n", err)
			return 1
		}
		printed = append(printed, personaToken{p, u.Email, secret})
		tokens = append(tokens, envVar{"ALLOT_TOKEN_" + strings.ToUpper(p), secret})
		if p == demo.Engineer {
			tokens = append(tokens, envVar{"ALLOT_TOKEN", secret})
		}
	}
	tokens = append(tokens, envVar{"ALLOT_URL", m.URL()})
	envFile := filepath.Join(stateDir, "tokens.env")
	envErr := writeEnvFile(envFile, tokens)
	if envErr != nil {
		log.Warn("could not write the tokens file", "err", envErr)
	}
	fmt.Fprintf(stdout, "\nAllot is running at %s (database: %s, %s)\n", m.URL(), db.Source, redactURL(url))
	fmt.Fprintf(stdout, "Open %s/login and pick a persona", m.URL())
	switch {
	case idp != nil:
		fmt.Fprintf(stdout, ", or \"Sign in with SSO\" through the development OIDC provider at %s:\n", idp.Issuer())
		if oidcMoved != "" {
			fmt.Fprintf(stdout, "  (%s)\n", oidcMoved)
		}
		for _, u := range oidcdev.DemoUsers(*oidcPassword) {
			fmt.Fprintf(stdout, "  %-6s password %-6s groups %s\n", u.Username, u.Password, strings.Join(u.Groups, ", "))
		}
		fmt.Fprintf(stdout, "  From a shell, bin/allot login --server %s signs in through it too (unset ALLOT_TOKEN, which comes first).\n", m.URL())
	case m.OIDC.Enabled():
		fmt.Fprintf(stdout, ", or \"Sign in with SSO\" through %s.\n", m.OIDC.Issuer)
	default:
		fmt.Fprintln(stdout, ".")
	}
	fmt.Fprint(stdout, "\nAPI tokens (new at every start; make your own at /tokens):\n")
	for _, p := range printed {
		fmt.Fprintf(stdout, "  %-9s %-18s %s\n", p.persona, p.email, p.secret)
	}
	if envErr == nil {
		fmt.Fprintf(stdout, "\n(also in %[1]s: `. %[1]s` exports them; the engineer's is ALLOT_TOKEN, the CLI's default)\n", envFile)
	}
	if !*noAgents {
		fmt.Fprintf(stdout, "\nInject GPU faults into the fake GPUs here (this instance only), e.g.\n  echo '{\"gpus\":[{\"index\":0,\"ecc_dbe\":1}]}' > %s\n", devFaultFile(*faultsDir, "gpu03"))
	}
	fmt.Fprintf(stdout, `
Try (make build first: bin/allot exits 2 on bad flags and 1 when the server refuses; go run always exits 1):
  . %[2]s
  bin/allot submit --team nlp --tier 3 --gpus 8 --time 4h -- python3 train.py --lr 3e-4
  bin/allot jobs
  curl -H "Authorization: Bearer $ALLOT_TOKEN" -H "Content-Type: application/json" \
       -d '{"team":"nlp","tier":3,"gpus":1,"time_limit":"1h","command":["python3","eval.py"]}' %[1]s/api/v1/jobs

Ctrl-C stops everything.
`, m.URL(), envFile)
	if err := m.Wait(ctx); err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		return 1
	}
	fmt.Fprintln(stderr, "allot dev: stopping")
	return 0
}

type envVar struct{ name, value string }

// writeEnvFile writes vars as `export NAME='value'` lines, so that a plain
// `. file` puts them in the environment of the commands the shell runs.
func writeEnvFile(path string, vars []envVar) error {
	var b strings.Builder
	for _, v := range vars {
		fmt.Fprintf(&b, "export %s=%s\n", v.name, shellQuote(v.value))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// devLockKey is the advisory lock `allot dev` holds on its database for
// as long as it runs (pg_try_advisory_lock; advisory locks are per
// database, so other databases on the same server are not affected).
const devLockKey = 740122310

// devLock is the connection that holds devLockKey; closing it frees the
// database for the next allot dev.
type devLock struct{ *pgx.Conn }

// lockDevDatabase takes devLockKey on the database at url, or says which
// allot dev holds it and what to do.
func lockDevDatabase(ctx context.Context, url string) (*devLock, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = devLockName("(starting)")
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", redactURL(url), err)
	}
	// A dev that just stopped releases the lock when its backend ends, a
	// moment after its connection closed: give it a few seconds.
	var ok bool
	for deadline := time.Now().Add(5 * time.Second); ; {
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", devLockKey).Scan(&ok); err != nil {
			conn.Close(ctx)
			return nil, err
		}
		if ok {
			return &devLock{conn}, nil
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var holder string
	conn.QueryRow(ctx, `SELECT coalesce(a.application_name, '') FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.classid::int8 = 0 AND l.objid::int8 = $1 AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`, devLockKey).Scan(&holder) //nolint:errcheck // only for the message
	conn.Close(ctx)
	if holder == "" {
		holder = "allot dev"
	}
	return nil, fmt.Errorf("another allot dev (%s) is already running on the database %s, and a second one would revoke its persona tokens: "+
		"stop that one (Ctrl-C where it runs), or give this one a database of its own with --database-url (or DATABASE_URL; "+
		"with no PostgreSQL at 127.0.0.1:5432, --data-dir starts a private one)", holder, redactURL(url))
}

// announce names this allot dev on the lock's connection, so a second one
// can say where the first one serves.
func (l *devLock) announce(ctx context.Context, url string) error {
	_, err := l.Exec(ctx, "SELECT set_config('application_name', $1, false)", devLockName("at "+url))
	return err
}

// devLockName is the application_name of the lock's connection (at most
// 63 bytes are kept): where this allot dev serves, its process and host.
func devLockName(where string) string {
	return fmt.Sprintf("allot dev %s, pid %d on %s", where, os.Getpid(), hostname())
}

func redactURL(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		rest := u[i+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if c := strings.Index(rest[:at], ":"); c >= 0 {
				return u[:i+3] + rest[:c] + ":***" + rest[at:]
			}
		}
	}
	return u
}

// cmdTestEnv runs a command with DATABASE_URL pointing at the PostgreSQL
// `allot dev` would use (starting a private one if needed, and stopping it
// afterwards). `make test` runs `go test` under it.
func cmdTestEnv(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("test-env", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data-dir", ".allot/testpg", "data directory of a private PostgreSQL, if one is needed")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: allot test-env [--data-dir DIR] -- COMMAND [ARGS...]")
		return 2
	}
	ctx := context.Background()
	db, err := devdb.Find(ctx, devdb.Options{EnvURL: os.Getenv("DATABASE_URL"), DataDir: *dataDir})
	if err != nil {
		fmt.Fprintf(stderr, "allot test-env: %v\n", err)
		return 1
	}
	defer db.Close()
	fmt.Fprintf(stderr, "allot test-env: PostgreSQL from %s: %s\n", db.Source, redactURL(db.URL))
	return runChild(fs.Args(), append(os.Environ(), "DATABASE_URL="+db.URL), stdout, stderr)
}

// DevJobAccount is the unprivileged account the demo's jobs run as when
// allot dev runs as root (and a job's submitter maps to no account).
const DevJobAccount = "allot-demo"

// devJobAccount prepares the demo's job accounts: as root, the demo's
// people (noah, nadia, …), its teams' service accounts (svc-nlp, …) and
// allot-demo, created if missing and kept, which must reach the jobs'
// working and checkpoint directories under stateDir; otherwise jobs run as
// the developer's own account, without cgroups.
func devJobAccount(stderr io.Writer, stateDir, cpRoot, jobsDir string) error {
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "allot dev: not root, so the demo's jobs run as your own account, without per-job cgroups or GPU fencing (run as root to see them)")
		return nil
	}
	// The demo's people and teams' service accounts, so its jobs run as
	// their submitters; allot-demo for jobs whose submitter maps to none.
	var made []string
	for _, name := range append(demo.Accounts(), DevJobAccount) {
		created, err := agent.EnsureAccount(name)
		if err != nil {
			return fmt.Errorf("creating the demo's job account %s: %w", name, err)
		}
		if created {
			made = append(made, name)
		}
	}
	if len(made) > 0 {
		fmt.Fprintf(stderr, "allot dev: created unprivileged accounts for the demo's jobs: %s (userdel removes them)\n", strings.Join(made, " "))
	}
	agent.SetLocalJobUser(DevJobAccount)
	// The job account traverses the state dir (not list it) to its
	// working directory and its checkpoints.
	if err := os.MkdirAll(cpRoot, 0o755); err != nil {
		return err
	}
	for _, d := range []string{stateDir, cpRoot} {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o011 != 0o011 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o011); err != nil {
				return err
			}
		}
	}
	for _, d := range []string{filepath.Dir(cpRoot), jobsDir} {
		if !searchable(d) {
			return fmt.Errorf("the demo's jobs run as unprivileged accounts, which cannot reach %s: a directory on its path is not searchable by others (chmod o+x it, or choose --jobs-dir elsewhere)", d)
		}
	}
	return nil
}

// searchable reports whether every directory from dir up to / lets others
// pass (o+x).
func searchable(dir string) bool {
	for p := dir; ; p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if p == "/" || p == "." {
			return true
		}
	}
}

func mustAbs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:6])
}

// devSecretKey is the demo's secret key file in dir, made (mode 0600) when
// missing.
func devSecretKey(dir string) (string, error) {
	path := filepath.Join(dir, "secret.key")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("making the demo's secret key: %w", err)
	}
	_, err = fmt.Fprintf(f, "# allot dev: encrypts the demo jobs' secret env at rest\n%s\n", store.NewSecretKey())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path) //nolint:errcheck // a partial key file would be taken as made at the next start
	}
	return path, err
}
