package web

import (
	"fmt"
	"strings"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/static"
	"github.com/labstack/echo/v4"
)

// What a server answers (Config.Serve, `allot server --serve`).
const (
	ServeAll    = "all"    // everything (the default)
	ServeAgents = "agents" // the agent API (/api/agent/v1), health and metrics
	ServeUsers  = "users"  // everything but the agent API
)

// CheckServe checks a --serve value ("" is ServeAll).
func CheckServe(v string) error {
	switch v {
	case "", ServeAll, ServeAgents, ServeUsers:
		return nil
	}
	return fmt.Errorf("--serve must be %s, %s or %s, not %q", ServeAll, ServeAgents, ServeUsers, v)
}

const agentAPIPrefix = "/api/agent/v1"

// serves reports whether this server's role answers path: health,
// readiness, metrics and static files on every role.
func (s *Server) serves(path string) bool {
	switch path {
	case "/healthz", "/readyz", "/metrics", static.Prefix + "*":
		return true
	}
	agent := strings.HasPrefix(path, agentAPIPrefix)
	switch s.cfg.Serve {
	case ServeAgents:
		return agent
	case ServeUsers:
		return !agent
	}
	return true
}

// otherRole answers, on a server of one role, what the other role
// serves: a 404 problem that says where to go, instead of a page or an
// "unknown endpoint".
func (s *Server) otherRole() {
	var path, msg string
	switch s.cfg.Serve {
	case ServeAgents:
		path, msg = "/*", "this server answers only node agents (allot server --serve agents): use the portal's and API's address"
	case ServeUsers:
		path, msg = agentAPIPrefix+"/*", "this server does not answer node agents (allot server --serve users): point agents at an agent API server (--serve agents or all)"
	default:
		return
	}
	h := func(c echo.Context) error { return allot.Errorf(allot.ENotFound, "%s", msg) }
	s.access = append(s.access, RouteAccess{Method: "*", Path: path, Rule: RulePublic})
	s.e.Any(path, h)
}
