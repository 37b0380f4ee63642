package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/apf"
	"github.com/allotlabs/allot/internal/backend"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/metric"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
)

// Config is what a Main runs with.
type Config struct {
	DatabaseURL string
	Addr        string // listen address for the portal/API; "" = no server
	Worker      bool   // run a River worker pool in this process
	Migrate     bool   // apply migrations at start
	DevMode     bool
	Logger      *slog.Logger
	// CycleTick is how often the worker looks whether the policy's
	// scheduling period (Policy.Cycle, which admins edit) has passed since
	// the last cycle (default 1 s).
	CycleTick time.Duration
	// HeartbeatInterval is the agents' heartbeat period (default 10 s).
	HeartbeatInterval time.Duration
	// CheckpointRoot is where checkpointable jobs get ALLOT_CHECKPOINT_DIR.
	CheckpointRoot string
	// OIDC is single sign-on (empty Issuer: none). An empty RedirectURL is
	// the server's own URL + /oidc/callback.
	OIDC web.OIDCConfig
	// Burst configures cloud burst in the worker (off without a provider).
	Burst jobs.BurstConfig
	// Now, when set, is this process's clock instead of clock.Now (tests
	// that run one cluster at a chosen instant).
	Now func() time.Time
	// APITokenTTL is the lifetime of a personal API token made without an
	// expiry, and the longest one may ask for (web.Config.APITokenTTL):
	// `allot server --api-token-ttl`, 90 days by default there; 0 here
	// (tests): none.
	APITokenTTL time.Duration
	// RequirePOSIXAccount refuses a job submission for which no POSIX
	// account resolves (the admin's mapping, the identity provider's
	// claim, the team's service account): `allot server
	// --require-posix-account`, on in `allot dev`. Off (the default), such
	// a job runs as the agent's default job user.
	RequirePOSIXAccount bool
	// SecretKeyFile, when set, is the key file that encrypts jobs' secret
	// environment values at rest (store.SecretKeys): `allot server` and
	// `allot worker --secret-key-file`; `allot dev` makes one. Unset, they
	// are stored in clear (a warning at start).
	SecretKeyFile string
	// MetricsAddr, when set, is a listener of its own for /metrics (this
	// process's registry: the worker's scheduler metrics, the server's
	// HTTP metrics, the database pool): `allot worker --metrics-addr`.
	MetricsAddr string
	// MaxStartsPerCycle caps the jobs one scheduling cycle starts
	// (jobs.Config.MaxStartsPerCycle): `allot worker --max-starts-per-cycle`.
	MaxStartsPerCycle int
	// DecayPeriod is how often a cycle decays the fair-share usage
	// (jobs.Config.DecayPeriod): `allot worker --decay-period`.
	DecayPeriod time.Duration
	// Serve is what the server answers (web.Config.Serve): `allot server
	// --serve all|agents|users`. A users-only server does not announce
	// itself in api_servers: agents' silence counts only against servers
	// that hear them.
	Serve string
	// MinCycleInterval spaces a worker's cycles out
	// (jobs.Config.MinCycleInterval): `allot worker --min-cycle-interval`.
	MinCycleInterval time.Duration
	// CycleDuty limits the share of time a worker's cycles take
	// (jobs.Config.CycleDuty): `allot worker --cycle-duty`.
	CycleDuty float64
	// MetricsToken, when set, is a scrape token the portal's /metrics
	// accepts besides admins' API tokens: `allot server --metrics-token-file`.
	MetricsToken string
	// HTTP is the server's timeouts and the size of the agent API's pool
	// (`allot server --write-timeout` and the others; zero fields: the
	// defaults, DefaultHTTPLimits).
	HTTP HTTPLimits
	// Engine builds the worker's sync with an external engine (Slurm) on
	// the worker's store (nil: none); EngineInterval is its period.
	Engine         func(*store.Store) *backend.Reconciler
	EngineInterval time.Duration
	// SlurmEnv is the environment of the Slurm commands the server runs for
	// /admin/slurm (sacctmgr with SLURM_CONF; nil: no Slurm cluster).
	SlurmEnv []string
	// SlurmOverBudgetFile is the over-budget list's path job_submit.lua
	// reads (--slurm-over-budget-file; "" = slurmpolicy's default).
	SlurmOverBudgetFile string
	// RateLimits are the server's per-IP, per-token and per-node request
	// limits (`allot server --api-rate`…); the zero value, what tests
	// boot with, limits nothing.
	RateLimits web.RateLimits
	// Admission is the server's admission control by priority level
	// (internal/apf: agents, user writes, user reads; `allot server
	// --api-max-inflight`…); the zero value, what tests boot with,
	// admits everything at once.
	Admission apf.Config
}

// HTTPLimits are the HTTP server's timeouts and the agent API's pool. A
// zero field takes DefaultHTTPLimits' value; a negative duration turns
// that timeout off.
type HTTPLimits struct {
	// ReadHeaderTimeout bounds sending the request line and headers.
	ReadHeaderTimeout time.Duration
	// BodyTimeout bounds sending the body (web.Config.BodyReadTimeout;
	// the server's ReadTimeout would also cut long polls and downloads).
	BodyTimeout time.Duration
	// WriteTimeout bounds a request from its headers to the end of its
	// answer; the agents' long polls and the CSV exports set their own.
	WriteTimeout time.Duration
	// IdleTimeout closes a kept-alive connection with no request for this
	// long.
	IdleTimeout time.Duration
	// ExportStallTimeout drops a CSV export whose client takes nothing
	// for this long (a reading client's download lasts what it needs).
	ExportStallTimeout time.Duration
	// AgentConns is the agent API's own pool: heartbeats, polls and lease
	// reports never wait behind user requests for a connection.
	AgentConns int
	// HeartbeatConns is the heartbeats' own pool within the agent API:
	// lease reports that wait on a job's row lock (a cycle starting work)
	// never hold up a node's proof of life.
	HeartbeatConns int
	// ExportConns is the exports' and monthly statements' own pool: many
	// of them at once wait for one of these, not for the main pool.
	ExportConns int
}

// DefaultHTTPLimits: a header in 10 s, a body (≤ 1 MiB) in 30 s, an answer
// in 2 min, 2 min idle between requests (agents call every few seconds),
// 30 s of an export's client reading nothing, 8 connections for agents'
// polls and lease reports and 4 for their heartbeats, 4 for exports (the
// main pool has 32).
var DefaultHTTPLimits = HTTPLimits{ReadHeaderTimeout: 10 * time.Second, BodyTimeout: 30 * time.Second, WriteTimeout: 2 * time.Minute,
	IdleTimeout: 2 * time.Minute, ExportStallTimeout: 30 * time.Second, AgentConns: 8, HeartbeatConns: 4, ExportConns: 4}

// withDefaults fills zero fields from DefaultHTTPLimits and turns the
// negative ones into 0 (off), as http.Server reads them.
func (l HTTPLimits) withDefaults() HTTPLimits {
	d := DefaultHTTPLimits
	for _, f := range []struct{ v, def *time.Duration }{{&l.ReadHeaderTimeout, &d.ReadHeaderTimeout}, {&l.BodyTimeout, &d.BodyTimeout},
		{&l.WriteTimeout, &d.WriteTimeout}, {&l.IdleTimeout, &d.IdleTimeout}, {&l.ExportStallTimeout, &d.ExportStallTimeout}} {
		switch {
		case *f.v == 0:
			*f.v = *f.def
		case *f.v < 0:
			*f.v = 0
		}
	}
	if l.AgentConns <= 0 {
		l.AgentConns = d.AgentConns
	}
	if l.ExportConns <= 0 {
		l.ExportConns = d.ExportConns
	}
	if l.HeartbeatConns <= 0 {
		l.HeartbeatConns = d.HeartbeatConns
	}
	return l
}

// Main is one running Allot process: HTTP server and/or River worker over
// one pool. End-to-end tests boot it on :0.
type Main struct {
	Config
	Pool  *pgxpool.Pool
	Store *store.Store
	// AgentPool and AgentStore serve the agent API in a server (nil
	// without Addr): a small pool of their own (HTTPLimits.AgentConns).
	AgentPool  *pgxpool.Pool
	AgentStore *store.Store
	// HeartbeatPool serves the agents' heartbeats (HTTPLimits.HeartbeatConns).
	HeartbeatPool *pgxpool.Pool
	// ExportPool serves the exports and monthly statements in a server
	// (HTTPLimits.ExportConns; nil without Addr).
	ExportPool *pgxpool.Pool
	// Server is the portal and API (nil without Addr).
	Server *web.Server

	ln       net.Listener
	http     *http.Server
	river    *river.Client[pgx.Tx] // worker pool, or insert-only in a server
	working  bool
	served   chan error
	stopBg   context.CancelFunc
	triggers chan struct{}
	// engineTrigger wakes the Slurm sync on job events (submissions and
	// cancels reach Slurm without waiting for the sync's period).
	engineTrigger jobs.EngineTrigger
	serverID      string
	bgDone        chan struct{}
	Registry      *prometheus.Registry
	metrics       *metricsServer // the MetricsAddr listener (metricsrv.go)
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// Trigger asks for a scheduling cycle without waiting: requests that
// arrive while one is being sent are folded into the next, so a burst of
// submits costs a handful of requests.
func (m *Main) Trigger(context.Context) {
	select {
	case m.triggers <- struct{}{}:
	default: // one is already pending; it covers this one
	}
}

func (m *Main) triggerLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.triggers:
			if err := jobs.Trigger(ctx, m.Store, m.river); err != nil && ctx.Err() == nil {
				m.Logger.Warn("requesting a scheduling cycle", "err", err)
			}
			if err := m.engineTrigger.Sync(ctx, m.Store, m.river); err != nil && ctx.Err() == nil {
				m.Logger.Warn("requesting a Slurm sync", "err", err)
			}
		}
	}
}

// Run connects, migrates if asked, and starts what the config names. It
// returns once everything is serving.
func (m *Main) Run(ctx context.Context) error {
	if m.Logger == nil {
		m.Logger = slog.New(slog.DiscardHandler)
	}
	pool, err := store.Open(ctx, m.DatabaseURL)
	if err != nil {
		return err
	}
	m.Pool, m.Store = pool, store.New(pool)
	if m.Now != nil {
		m.Store.Now = m.Now
	}
	m.Store.RequirePOSIXAccount = m.RequirePOSIXAccount
	if m.SecretKeyFile != "" {
		if m.Store.Secrets, err = store.LoadSecretKeys(m.SecretKeyFile); err != nil {
			pool.Close()
			return err
		}
		m.Logger.Info("jobs' secret environment values are encrypted at rest", "key", m.Store.Secrets.KeyID())
	} else if m.Addr != "" {
		m.Logger.Warn("jobs' secret environment values are stored in clear: give --secret-key-file (allot secret-key new) to encrypt them")
	}
	if m.Migrate {
		if err := store.Migrate(ctx, pool, m.Logger); err != nil {
			return err
		}
	}
	m.Registry = metric.NewRegistry()
	m.Registry.MustRegister(metric.NewPool("main", pool))
	if m.Worker {
		var engine *backend.Reconciler
		if m.Engine != nil {
			engine = m.Engine(m.Store)
			engine.Logger = m.Logger
		}
		m.river, err = jobs.NewClient(jobs.Config{Pool: pool, Store: m.Store, Logger: m.Logger, Registry: m.Registry,
			CycleTick: m.CycleTick, HeartbeatInterval: m.HeartbeatInterval, CheckpointRoot: m.CheckpointRoot,
			AllowPrivateWebhooks: m.DevMode, Burst: m.Burst, MaxStartsPerCycle: m.MaxStartsPerCycle, DecayPeriod: m.DecayPeriod, MinCycleInterval: m.MinCycleInterval, CycleDuty: m.CycleDuty, EngineInterval: m.EngineInterval, Engine: engine})
		if err != nil {
			return err
		}
		if err := m.river.Start(ctx); err != nil {
			return fmt.Errorf("starting River: %w", err)
		}
		m.working = true
	} else if m.river, err = jobs.NewInserter(pool); err != nil {
		return err
	}
	if err := m.serveMetrics(ctx); err != nil {
		return err
	}
	if m.Addr != "" {
		if err := checkOIDCRedirect(m.OIDC); err != nil {
			return err
		}
		m.ln, err = net.Listen("tcp", m.Addr)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", m.Addr, err)
		}
		limits := m.HTTP.withDefaults()
		if m.AgentPool, err = openSidePool(ctx, m.DatabaseURL, limits.AgentConns, "allot-agent-api"); err != nil {
			m.ln.Close()
			return err
		}
		m.AgentStore = store.New(m.AgentPool)
		m.AgentStore.Now, m.AgentStore.RequirePOSIXAccount, m.AgentStore.Secrets = m.Store.Now, m.RequirePOSIXAccount, m.Store.Secrets
		if m.HeartbeatPool, err = openSidePool(ctx, m.DatabaseURL, limits.HeartbeatConns, "allot-heartbeats"); err != nil {
			m.ln.Close()
			return err
		}
		heartbeatStore := store.New(m.HeartbeatPool)
		heartbeatStore.Now = m.Store.Now
		if m.ExportPool, err = openSidePool(ctx, m.DatabaseURL, limits.ExportConns, "allot-exports"); err != nil {
			m.ln.Close()
			return err
		}
		exportStore := store.New(m.ExportPool)
		exportStore.Now = m.Store.Now
		m.Registry.MustRegister(metric.NewPool("agent", m.AgentPool), metric.NewPool("heartbeat", m.HeartbeatPool), metric.NewPool("export", m.ExportPool))
		oidcCfg := m.OIDC
		if oidcCfg.Enabled() && oidcCfg.RedirectURL == "" {
			oidcCfg.RedirectURL = m.URL() + "/oidc/callback"
		}
		srv := web.New(web.Config{Serve: m.Serve, SlurmEnv: m.SlurmEnv, SlurmOverBudgetFile: m.SlurmOverBudgetFile, OIDC: oidcCfg, SecureCookies: strings.HasPrefix(oidcCfg.RedirectURL, "https://"),
			Store: m.Store, Logger: m.Logger, Registry: m.Registry, DevMode: m.DevMode, Burst: m.Burst,
			OnJobEvent: m.Trigger, HeartbeatInterval: m.HeartbeatInterval, APITokenTTL: m.APITokenTTL, MetricsToken: m.MetricsToken,
			AgentStore: m.AgentStore, HeartbeatStore: heartbeatStore, ExportStore: exportStore, RateLimits: m.RateLimits, BodyReadTimeout: limits.BodyTimeout, ExportStallTimeout: limits.ExportStallTimeout,
			Rollup: func(ctx context.Context) error { _, err := jobs.Rollup(ctx, m.Store, m.Store.Now()); return err }})
		m.Server = srv
		bg, stop := context.WithCancel(context.Background())
		m.stopBg, m.bgDone = stop, make(chan struct{})
		hearsAgents := m.Serve != web.ServeUsers
		if hearsAgents { // their silence counts while it is up
			m.serverID = fmt.Sprintf("%s-%d-%d", hostname(), os.Getpid(), time.Now().UnixNano())
			if err := m.Store.AnnounceServer(ctx, m.serverID); err != nil {
				stop()
				m.ln.Close()
				return err
			}
		}
		m.triggers = make(chan struct{}, 1)
		go func() {
			defer close(m.bgDone)
			if hearsAgents {
				// The agents' orders long polls are its only listeners: a
				// users-only server holds no connection for them.
				go srv.Notifier().Listen(bg, pool)
			}
			go m.triggerLoop(bg)
			every := m.HeartbeatInterval
			if every == 0 {
				every = agentproto.DefaultHeartbeatInterval
			}
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-bg.Done():
					return
				case <-t.C:
					if m.serverID != "" {
						if err := m.Store.AnnounceServer(bg, m.serverID); err != nil && bg.Err() == nil {
							m.Logger.Warn("announcing server", "err", err)
						}
					}
					rctx, cancel := context.WithTimeout(bg, every)
					if err := srv.RecordContacts(rctx); err != nil && bg.Err() == nil {
						m.Logger.Warn("recording refused agent requests (kept for the next try)", "err", err)
					}
					cancel()
				}
			}
		}()
		// No ReadTimeout: it would cancel long polls and downloads (see
		// web/deadlines.go); the body has its own deadline.
		// Admission control wraps the whole server: a request is queued or
		// refused before it costs a token lookup.
		admission := apf.New(m.Admission, m.Registry)
		admission.RefusedAgent = srv.RefusedAgentRequest
		m.http = &http.Server{Handler: admission.Handler(srv.Handler()), ReadHeaderTimeout: limits.ReadHeaderTimeout, WriteTimeout: limits.WriteTimeout,
			IdleTimeout: limits.IdleTimeout, ConnContext: web.WithConn}
		m.http.RegisterOnShutdown(srv.Notifier().Close)
		m.served = make(chan error, 1)
		go func() { m.served <- m.http.Serve(m.ln) }()
	}
	return nil
}

// URL is the base URL the server listens on.
func (m *Main) URL() string {
	if m.ln == nil {
		return ""
	}
	addr := m.ln.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "localhost"
	}
	return fmt.Sprintf("http://%s", net.JoinHostPort(host, fmt.Sprint(addr.Port)))
}

// Wait blocks until ctx ends or the server fails.
func (m *Main) Wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-m.served:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// Close stops the server (draining requests), the worker and the pool.
func (m *Main) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	// Stop announcing first: from now on nobody hears the agents, so their
	// silence must not count against them.
	if m.stopBg != nil {
		m.stopBg()
		<-m.bgDone
		if m.serverID != "" {
			errs = append(errs, m.Store.RetireServer(ctx, m.serverID))
		}
	}
	if m.working {
		errs = append(errs, m.river.Stop(ctx))
	}
	if m.http != nil {
		errs = append(errs, m.http.Shutdown(ctx))
	}
	errs = append(errs, m.closeMetrics(ctx))
	if m.HeartbeatPool != nil {
		m.HeartbeatPool.Close()
	}
	if m.AgentPool != nil {
		m.AgentPool.Close()
	}
	if m.ExportPool != nil {
		m.ExportPool.Close()
	}
	if m.Pool != nil {
		m.Pool.Close()
	}
	return errors.Join(errs...)
}

// openSidePool opens a server's pool for one class of work (the agent
// API, exports): conns connections at most, whatever the URL's
// pool_max_conns says (that sizes the main pool), named name in
// pg_stat_activity.
func openSidePool(ctx context.Context, url string, conns int, name string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing database URL: %w", err)
	}
	cfg.MaxConns = int32(conns)
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	store.SetClock(cfg.ConnConfig)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting the %s pool: %w", name, err)
	}
	return pool, nil
}
