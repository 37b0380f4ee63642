package web

import (
	"net/http"
	"net/url"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/labstack/echo/v4"
)

// Rule is the access rule of one route, checked before its handler runs.
// Handlers still check access to the object they serve (a job's team); a
// rule only says who may reach the route at all. routes.go gives every
// route exactly one rule, and the authorization-matrix test walks them all
// as every persona.
type Rule struct {
	Name string
	// Public routes need no login (health, static files, login, agents'
	// node-token API).
	Public bool
	// Allow decides for a logged-in caller.
	Allow func(u *allot.User, c echo.Context) bool
	// Deny is the message a caller who is refused gets.
	Deny string
}

// The rules, from most open to most closed.
var (
	// RulePublic: anyone, logged in or not.
	RulePublic = Rule{Name: "public", Public: true}
	// RuleNode: the agents' API; handlers check the node token.
	RuleNode = Rule{Name: "node", Public: true}
	// RuleUser: any logged-in person.
	RuleUser = Rule{Name: "user", Allow: func(*allot.User, echo.Context) bool { return true }}
	// RuleSubmitter: people who may submit jobs: team members and admins.
	// Finance is read-only.
	RuleSubmitter = Rule{Name: "submitter", Deny: "only team members and admins submit jobs",
		Allow: func(u *allot.User, _ echo.Context) bool { return u.Admin || len(u.Memberships) > 0 }}
	// RuleCanceller: the same people as RuleSubmitter (the matrix's
	// "submitter" row), refused with what cancelling takes; the handler
	// then checks the job itself (its submitter, a lead of its team, an
	// admin).
	RuleCanceller = Rule{Name: "submitter", Deny: "only a job's submitter, a lead of its team or an admin can cancel it; finance can see jobs but not cancel them",
		Allow: RuleSubmitter.Allow}
	// RuleTeamMember: members of the :team in the path, finance and admins.
	RuleTeamMember = Rule{Name: "team-member", Deny: "you are not in this team",
		Allow: func(u *allot.User, c echo.Context) bool { return u.Admin || u.Finance || u.MemberOf(c.Param("team")) }}
	// RuleTeamLead: the leads of the :team in the path, and admins.
	RuleTeamLead = Rule{Name: "team-lead", Deny: "only a lead of this team or an admin may do this",
		Allow: func(u *allot.User, c echo.Context) bool { return u.Admin || u.LeadOf(c.Param("team")) }}
	// RuleReports: usage reports: team members (their teams), finance, admins.
	RuleReports = Rule{Name: "reports", Deny: "reports are for team members, leads, finance and admins",
		Allow: func(u *allot.User, _ echo.Context) bool { return u.Admin || u.Finance || len(u.Memberships) > 0 }}
	// RuleLeadOrFinance: money views: team leads (their teams), finance, admins.
	RuleLeadOrFinance = Rule{Name: "lead-or-finance", Deny: "chargeback is for finance, admins and team leads",
		Allow: func(u *allot.User, _ echo.Context) bool { return u.Admin || u.Finance || leadsAny(u) }}
	// RuleFinance: finance and admins.
	RuleFinance = Rule{Name: "finance", Deny: "only finance and admins may do this",
		Allow: func(u *allot.User, _ echo.Context) bool { return u.Admin || u.Finance }}
	// RuleAdmin: admins only.
	RuleAdmin = Rule{Name: "admin", Deny: "only admins may do this",
		Allow: func(u *allot.User, _ echo.Context) bool { return u.Admin }}
)

func leadsAny(u *allot.User) bool {
	for _, m := range u.Memberships {
		if m.Role == allot.TeamRoleLead {
			return true
		}
	}
	return false
}

// RouteAccess is one route and its rule, for the authorization matrix.
type RouteAccess struct {
	Method string
	Path   string
	Rule   Rule
}

// Access returns every route with its rule, in registration order.
func (s *Server) Access() []RouteAccess { return s.access }

// route registers one route with its rule; method "*" is any method.
func (s *Server) route(method, path string, h echo.HandlerFunc, r Rule) {
	if !s.serves(path) {
		return
	}
	s.access = append(s.access, RouteAccess{Method: method, Path: path, Rule: r})
	if method == "*" {
		s.e.Any(path, s.guard(r, h))
		return
	}
	s.e.Add(method, path, s.guard(r, h))
}

// guard runs r before h: no caller → 401 (a page redirects to the login
// page, keeping where they were going); a caller r refuses → 403.
func (s *Server) guard(r Rule, h echo.HandlerFunc) echo.HandlerFunc {
	if r.Public {
		return h
	}
	return func(c echo.Context) error {
		u, ok := c.Get(ctxUser).(*allot.User)
		if !ok {
			if !isAPI(c) && c.Request().Method == http.MethodGet && c.Request().Header.Get("HX-Request") == "" {
				return c.Redirect(http.StatusSeeOther, "/login?next="+url.QueryEscape(c.Request().URL.RequestURI()))
			}
			_, err := currentUser(c)
			return err
		}
		if !r.Allow(u, c) {
			return allot.Errorf(allot.EForbidden, "%s", r.Deny)
		}
		return h(c)
	}
}
