package main

import (
	"context"
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

	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/devdb"
	"github.com/allotlabs/allot/internal/oidcdev"
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
	dataDir := fs.String("data-dir", ".allot/pgdata", "where a private PostgreSQL keeps its data when one must be started")
	noAgents := fs.Bool("no-agents", false, "do not start the 16 in-process agents with fake GPUs")
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL to use as is (default: env DATABASE_URL; unset: find or start one)")
	noOIDC := fs.Bool("no-oidc", false, "do not start the development OIDC provider (with ALLOT_OIDC_ISSUER set, that provider is used instead)")
	oidcPassword := fs.String("oidc-password", "demo", "password of the development OIDC provider's users noah, nadia, finn and ada")
	now := fs.String("now", "", "run the whole demo as if it were this RFC 3339 instant (e.g. 2026-12-01T00:00:30Z); time then passes at real speed (default: env ALLOT_NOW, else the real time)")
	bf := addBurstFlags(fs, "local")
	if err := fs.Parse(args); err != nil {
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
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if clock.Shifted() {
		log.Info("the clock is shifted: the demo runs as if it were "+clock.Now().UTC().Format(time.RFC3339), "offset", clock.Offset().Round(time.Second).String())
	}

	db, err := devdb.Find(ctx, devdb.Options{EnvURL: *dbURL, DataDir: *dataDir, Logger: log})
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
	cpRoot, _ := filepath.Abs(filepath.Join(filepath.Dir(*dataDir), "checkpoints"))
	m := &Main{Config: Config{DatabaseURL: url, Addr: *addr, Worker: true, Migrate: true, DevMode: true, Logger: log, CheckpointRoot: cpRoot}}
	// Single sign-on: the company's provider when ALLOT_OIDC_* says so,
	// else a development provider with the demo personas.
	var idp *oidcdev.Server
	if m.OIDC, err = oidcFlags(flag.NewFlagSet("env", flag.ContinueOnError))(); err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		return 2
	}
	if !m.OIDC.Enabled() && !*noOIDC {
		if idp, m.OIDC, err = devOIDC(*oidcPassword); err != nil {
			fmt.Fprintf(stderr, "allot dev: %v\n", err)
			return 1
		}
		defer idp.Close()
	}
	local := newLocalBurst(m, slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
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
		stopAgents, err := startDevAgents(ctx, m, slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
		if err != nil {
			fmt.Fprintf(stderr, "allot dev: %v\n", err)
			return 1
		}
		defer stopAgents()
	}
	var tokens strings.Builder
	fmt.Fprintf(stdout, "\nAllot is running at %s (database: %s, %s)\n", m.URL(), db.Source, redactURL(url))
	fmt.Fprintf(stdout, "Open %s/login and pick a persona", m.URL())
	switch {
	case idp != nil:
		fmt.Fprintf(stdout, ", or \"Sign in with SSO\" through the development OIDC provider at %s:\n", idp.Issuer())
		for _, u := range oidcdev.DemoUsers(*oidcPassword) {
			fmt.Fprintf(stdout, "  %-6s password %-6s groups %s\n", u.Username, u.Password, strings.Join(u.Groups, ", "))
		}
	case m.OIDC.Enabled():
		fmt.Fprintf(stdout, ", or \"Sign in with SSO\" through %s.\n", m.OIDC.Issuer)
	default:
		fmt.Fprintln(stdout, ".")
	}
	fmt.Fprint(stdout, "\nAPI tokens (new at every start; make your own at /tokens):\n")
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
		fmt.Fprintf(stdout, "  %-9s %-18s %s\n", p, u.Email, secret)
		fmt.Fprintf(&tokens, "ALLOT_TOKEN_%s=%s\n", strings.ToUpper(p), secret)
		if p == demo.Engineer {
			fmt.Fprintf(&tokens, "ALLOT_TOKEN=%s\n", secret)
		}
	}
	fmt.Fprintf(&tokens, "ALLOT_URL=%s\n", m.URL())
	envFile := filepath.Join(filepath.Dir(*dataDir), "tokens.env")
	if err := os.MkdirAll(filepath.Dir(envFile), 0o700); err == nil {
		if err := os.WriteFile(envFile, []byte(tokens.String()), 0o600); err == nil {
			fmt.Fprintf(stdout, "\n(also in %s: `set -a; . %s; set +a` makes the engineer's token the CLI default)\n", envFile, envFile)
		}
	}
	fmt.Fprintf(stdout, `
Try:
  go run ./cmd/allot submit --server %[1]s --token <engineer token> --team nlp --tier 3 --gpus 8 --time 4h -- python train.py --lr 3e-4
  curl -H "Authorization: Bearer <engineer token>" -H "Content-Type: application/json" \
       -d '{"team":"nlp","tier":3,"gpus":1,"time_limit":"1h","command":["python","eval.py"]}' %[1]s/api/v1/jobs

Ctrl-C stops everything.
`, m.URL())
	if err := m.Wait(ctx); err != nil {
		fmt.Fprintf(stderr, "allot dev: %v\n", err)
		return 1
	}
	fmt.Fprintln(stderr, "allot dev: stopping")
	return 0
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
