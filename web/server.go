// Package web is Allot's HTTP layer: the portal (echo + templ + HTMX) and
// the JSON API. routes.go is the only route table; errors.go maps domain
// errors to responses in one place.
package web

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/metric"
	"github.com/allotlabs/allot/internal/store"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
)

// Config is what the server needs from main.
type Config struct {
	// Serve is what this server answers (`allot server --serve`): ServeAll
	// (""), ServeAgents (the agent API only, plus health and metrics) or
	// ServeUsers (everything but the agent API). Replicas of each role let
	// a site keep user traffic and node agents in processes (and machines,
	// or CPU priorities) of their own.
	Serve    string
	Store    *store.Store
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// DevMode enables the persona login page. Only `allot dev` sets it.
	DevMode bool
	// SecureCookies marks cookies Secure (set when served over HTTPS).
	SecureCookies bool
	// SessionTTL is how long a portal session lasts (default 12 h).
	SessionTTL time.Duration
	// APITokenTTL is the lifetime of a personal API token made without an
	// expiry, and the longest one may ask for (`allot server
	// --api-token-ttl`, 90 days there); 0: no default, tokens last until
	// revoked unless they ask for an expiry.
	APITokenTTL time.Duration
	// OnJobEvent, if set, is called after anything that may let a job start
	// or makes one wait: a submit, a cancel, a job's exit, a node joining.
	// main wires it to a scheduling-cycle request.
	OnJobEvent func(ctx context.Context)
	// Notifier wakes agents' long polls (nil: polls wait out their timeout).
	Notifier *Notifier
	// HeartbeatInterval is what agents are told to use (default 10 s).
	HeartbeatInterval time.Duration
	// Rollup brings the charge lines up to date (before a month closes).
	Rollup func(ctx context.Context) error
	// OIDC is the single sign-on configuration (oidc.go); empty Issuer:
	// no SSO.
	OIDC OIDCConfig
	// Burst is the worker's cloud-burst configuration, shown on /burst
	// (the page shows the rule's live inputs whether or not burst is on).
	Burst jobs.BurstConfig
	// MetricsToken is a scrape token /metrics accepts besides admins' API tokens ("": none; metrics_auth.go).
	MetricsToken string
	// AgentStore, when set, serves the agent API (/api/agent/v1) over a
	// pool of its own, so user traffic can never take the connections
	// heartbeats and lease reports need (nil: Store).
	AgentStore *store.Store
	// HeartbeatStore, when set, serves the agents' heartbeats (and their
	// node-token check) over a pool of their own within the agent API:
	// lease reports waiting on a job's row lock never hold up a node's
	// proof of life (nil: AgentStore).
	HeartbeatStore *store.Store
	// ExportStore, when set, serves the statements and exports that read
	// a month or the whole audit log (chargeback JSON and CSV, the finance
	// page's totals, the audit CSV) over a small pool of their own, so 40
	// of them at once queue there instead of taking every connection
	// (nil: Store).
	ExportStore *store.Store
	// RateLimits are the per-IP, per-token and per-node request limits
	// (ratelimit.go); the zero value limits nothing.
	RateLimits RateLimits
	// BodyReadTimeout is how long a request may take to send its body
	// (deadlines.go); 0: no limit.
	BodyReadTimeout time.Duration
	// ExportStallTimeout drops a CSV export whose client has taken nothing
	// for this long; while it reads, the download lasts as long as it
	// needs (0: no deadline of the export's own).
	ExportStallTimeout time.Duration
	// SlurmEnv is the environment sacctmgr runs with against the Slurm
	// cluster (SLURM_CONF=…); nil: no Slurm cluster (/admin/slurm shows
	// the rendered files only).
	SlurmEnv []string
	// SlurmOverBudgetFile is the over-budget list's path baked into the
	// rendered job_submit.lua ("": slurmpolicy.DefaultOverBudgetFile).
	SlurmOverBudgetFile string
}

// Server serves the portal and the API.
type Server struct {
	cfg      Config
	notifier *Notifier
	access   []RouteAccess
	e        *echo.Echo
	http     *metric.HTTP
	log      *slog.Logger
	st       *store.Store
	agentSt  *store.Store // the agent API's store (Config.AgentStore, else st)
	hbSt     *store.Store // the heartbeats' store (Config.HeartbeatStore, else agentSt)
	exportSt *store.Store // exports' and statements' store (Config.ExportStore, else st)
	limits   limiters
	oidc     *oidcClient // nil without SSO
	contacts *contacts   // node tokens seen, and refused heartbeats heard (contacts.go)
}

const (
	sessionCookie = "allot_session"
	ctxUser       = "user"
	ctxCSRF       = "csrf"
)

// New builds the server and its routes.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		cfg.Registry = metric.NewRegistry()
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = agentproto.DefaultHeartbeatInterval
	}
	if cfg.Notifier == nil {
		cfg.Notifier = NewNotifier(cfg.Logger)
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	s := &Server{cfg: cfg, notifier: cfg.Notifier, e: e, http: metric.NewHTTP(cfg.Registry), log: cfg.Logger, st: cfg.Store,
		agentSt: cfg.AgentStore, exportSt: cfg.ExportStore, limits: newLimiters(cfg.RateLimits), contacts: newContacts()}
	if s.agentSt == nil {
		s.agentSt = cfg.Store
	}
	if s.hbSt = cfg.HeartbeatStore; s.hbSt == nil {
		s.hbSt = s.agentSt
	}
	if s.exportSt == nil {
		s.exportSt = cfg.Store
	}
	if cfg.OIDC.Enabled() {
		s.oidc = newOIDCClient(cfg.OIDC)
	}
	e.HTTPErrorHandler = s.handleError
	e.Use(s.observe, middleware.Recover(), middleware.BodyLimit("1M"), middleware.SecureWithConfig(middleware.SecureConfig{
		XSSProtection: "0", ContentTypeNosniff: "nosniff", XFrameOptions: "DENY", ReferrerPolicy: "same-origin",
		ContentSecurityPolicy: "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'",
	}))
	// Before CSRF and authentication: a flood is turned away before it
	// costs a token lookup.
	e.Use(s.limitByClient)
	e.Use(middleware.CSRFWithConfig(middleware.CSRFConfig{
		Skipper:        func(c echo.Context) bool { return isAPI(c) || c.Request().URL.Path == "/metrics" },
		TokenLookup:    "form:_csrf,header:X-CSRF-Token",
		CookieName:     "_csrf",
		CookiePath:     "/",
		CookieHTTPOnly: true,
		CookieSecure:   cfg.SecureCookies,
		CookieSameSite: http.SameSiteLaxMode,
		ContextKey:     ctxCSRF,
		// A missing token is refused like a wrong one: 403.
		ErrorHandler: func(error, echo.Context) error { return middleware.ErrCSRFInvalid },
	}))
	e.Use(s.authenticate, s.limitByToken)
	s.routes()
	return s
}

// Handler returns the server as an http.Handler.
func (s *Server) Handler() http.Handler { return s.bodyDeadline(s.e) }

func isAPI(c echo.Context) bool { return strings.HasPrefix(c.Request().URL.Path, "/api/") }

// Notifier returns the server's long-poll notifier (main starts its
// listener).
func (s *Server) Notifier() *Notifier { return s.notifier }

// observe records request metrics and logs server errors.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		s.http.InFlight.Inc()
		defer s.http.InFlight.Dec()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		code := c.Response().Status
		s.http.Requests.WithLabelValues(route, c.Request().Method, strconv.Itoa(code)).Inc()
		s.http.Duration.WithLabelValues(route, c.Request().Method).Observe(time.Since(start).Seconds())
		return nil
	}
}

// authenticate loads the caller from a bearer token (API clients) or the
// session cookie (browsers). It never rejects: handlers decide.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx := c.Request().Context()
		if isAgentAPI(c) {
			return next(c) // node tokens, checked by the agent handlers
		}
		if h := c.Request().Header.Get("Authorization"); h != "" {
			tok, ok := strings.CutPrefix(h, "Bearer ")
			if !ok {
				return allot.Errorf(allot.EUnauthorized, "Authorization header must be \"Bearer <token>\"")
			}
			// The request's context carries the epochs read with the token,
			// so that a submission skips reading its context again.
			u, ctx, err := s.st.UserByAPITokenContext(ctx, strings.TrimSpace(tok))
			if err != nil {
				return err
			}
			c.SetRequest(c.Request().WithContext(ctx))
			c.Set(ctxUser, &u)
			return next(c)
		}
		// Browsers' session cookies count on the API for reading only:
		// changes through the API need a token (no CSRF exposure).
		if isAPI(c) && c.Request().Method != http.MethodGet && c.Request().Method != http.MethodHead {
			return next(c)
		}
		if ck, err := c.Cookie(sessionCookie); err == nil && ck.Value != "" {
			u, err := s.st.UserBySession(ctx, ck.Value)
			switch {
			case err == nil:
				c.Set(ctxUser, &u)
			case allot.ErrorCode(err) == allot.EUnauthorized:
				s.clearSession(c)
			default:
				return err
			}
		}
		return next(c)
	}
}

// currentUser returns the caller or an EUnauthorized error.
func currentUser(c echo.Context) (*allot.User, error) {
	if u, ok := c.Get(ctxUser).(*allot.User); ok {
		return u, nil
	}
	if isAPI(c) {
		return nil, allot.Errorf(allot.EUnauthorized, "missing API token: send Authorization: Bearer <token>")
	}
	return nil, allot.Errorf(allot.EUnauthorized, "log in to continue")
}

// userAndBody returns the caller and the request's JSON body read into a
// T by decodeStrict.
func userAndBody[T any](c echo.Context) (*allot.User, T, error) {
	var body T
	u, err := currentUser(c)
	if err != nil {
		return nil, body, err
	}
	if err := decodeStrict(c.Request().Body, &body); err != nil {
		return nil, body, err
	}
	return u, body, nil
}

func (s *Server) jobEvent(ctx context.Context) {
	if s.cfg.OnJobEvent != nil {
		s.cfg.OnJobEvent(ctx)
	}
}

// visibleTeams returns the teams whose jobs u may see: nil for all (admin,
// finance), else u's teams.
func visibleTeams(u *allot.User) []string {
	if u.Admin || u.Finance {
		return nil
	}
	t := u.Teams()
	if t == nil {
		t = []string{}
	}
	return t
}

func canSee(u *allot.User, j *allot.Job) bool {
	return u.Admin || u.Finance || u.MemberOf(j.Team)
}
