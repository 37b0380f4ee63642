package web

import (
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// RuleMetrics: /metrics on the portal's port. Prometheus sends a bearer
// token, which the handler checks: an admin's API token, or the scrape
// token of `allot server --metrics-token-file` (Config.MetricsToken). No
// session cookie counts, and a refusal is a 401 problem, never the login
// page (a scraper would read it as a broken exposition).
var RuleMetrics = Rule{Name: "metrics", Public: true}

// ctxMetricsAuth holds the Authorization header of a /metrics request.
const ctxMetricsAuth = "metrics_authorization"

// metricsRoute is the handler of GET /metrics. It also installs
// metricsBearer in front of the router: authenticate would refuse the
// scrape token, which is no user's API token, before the handler runs.
func (s *Server) metricsRoute() echo.HandlerFunc {
	s.e.Pre(metricsBearer)
	// ContinueOnError: a collector that fails (the worker's live-state
	// gauges when PostgreSQL is away, in one process with the worker)
	// leaves the others' series.
	h := promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	return func(c echo.Context) error {
		if msg := s.metricsCaller(c); msg != "" {
			return metricsDenied(c, msg)
		}
		h.ServeHTTP(c.Response(), c.Request())
		return nil
	}
}

// metricsBearer moves the Authorization header of a /metrics request out
// of authenticate's way, into the context for metricsCaller.
func metricsBearer(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if c.Request().URL.Path == "/metrics" {
			c.Set(ctxMetricsAuth, c.Request().Header.Get("Authorization"))
			c.Request().Header.Del("Authorization")
		}
		return next(c)
	}
}

// metricsCaller says why the caller may not read /metrics ("": they may).
func (s *Server) metricsCaller(c echo.Context) string {
	h, _ := c.Get(ctxMetricsAuth).(string)
	if h == "" {
		return "/metrics needs a token: send Authorization: Bearer <an admin's API token, or the scrape token of allot server --metrics-token-file>"
	}
	tok, ok := strings.CutPrefix(h, "Bearer ")
	tok = strings.TrimSpace(tok)
	if !ok || tok == "" {
		return "Authorization header must be \"Bearer <token>\""
	}
	if want := s.cfg.MetricsToken; want != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(want)) == 1 {
		return ""
	}
	u, err := s.st.UserByAPIToken(c.Request().Context(), tok)
	switch {
	case err != nil:
		// Unknown, revoked or expired token, or the database is away:
		// either way no metrics, and no detail about which.
		if allot.ErrorCode(err) != allot.EUnauthorized {
			s.log.Warn("checking a /metrics token", "err", err)
		}
		return "invalid or revoked token, or it has expired: /metrics takes an admin's API token or the scrape token"
	case !u.Admin:
		return "/metrics takes an admin's API token or the scrape token, not the token of " + u.Email
	}
	return ""
}

// metricsDenied answers 401 with a JSON problem.
func metricsDenied(c echo.Context, msg string) error {
	c.Response().Header().Set("WWW-Authenticate", `Bearer realm="allot"`)
	c.Response().Header().Set(echo.HeaderContentType, "application/problem+json")
	c.Response().WriteHeader(http.StatusUnauthorized)
	return jsonEncoder(c.Response()).Encode(Problem{Type: "https://allot.dev/problems/" + allot.EUnauthorized,
		Title: http.StatusText(http.StatusUnauthorized), Status: http.StatusUnauthorized, Detail: msg})
}
