package web

import (
	"net/http"

	"github.com/allotlabs/allot/static"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// routes is the one route table. Every route names its access rule
// (access.go); the authorization-matrix test walks them all as every
// persona. Keep each area's routes together under its comment.
func (s *Server) routes() {
	const get, post, put, del, anyMethod = http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, "*"
	r := s.route
	_ = del

	// Health, metrics, static files.
	r(get, "/healthz", s.healthz, RulePublic)
	r(get, "/readyz", s.readyz, RulePublic)
	r(get, "/metrics", echo.WrapHandler(promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{})), RulePublic)
	r(get, static.Prefix+"*", echo.WrapHandler(static.Handler()), RulePublic)

	// Login and sessions.
	r(get, "/", s.home, RulePublic)
	r(get, "/login", s.loginPage, RulePublic)
	r(post, "/login/dev", s.devLogin, RulePublic)
	r(post, "/logout", s.logout, RulePublic)

	// Jobs.
	r(get, "/jobs", s.jobsPage, RuleUser)
	r(get, "/jobs/new", s.newJobPage, RuleSubmitter)
	r(post, "/jobs", s.submitJobForm, RuleSubmitter)
	r(post, "/jobs/quota", s.quotaPreview, RuleSubmitter)
	r(get, "/jobs/:id", s.jobPage, RuleUser)
	r(post, "/jobs/:id/cancel", s.cancelJobForm, RuleUser)

	// Teams, reports, chargeback.
	r(get, "/teams/:team", s.teamPage, RuleTeamMember)
	r(get, "/rightsizing", s.rightSizingPage, RuleReports)
	r(get, "/finance", s.financePage, RuleLeadOrFinance)
	r(post, "/finance/close", s.closeMonthForm, RuleFinance)

	// Cluster dashboard.

	// Admin.

	// Policy docs.

	// Health and nodes.

	// Cloud burst.

	// JSON API.
	const api = "/api/v1"
	r(get, api+"/me", s.apiMe, RuleUser)
	r(post, api+"/jobs", s.apiSubmitJob, RuleSubmitter)
	r(get, api+"/jobs", s.apiListJobs, RuleUser)
	r(get, api+"/jobs/:id", s.apiGetJob, RuleUser)
	r(post, api+"/jobs/:id/cancel", s.apiCancelJob, RuleUser)
	r(get, api+"/jobs/:id/log", s.apiJobLog, RuleUser)
	r(get, api+"/alerts", s.apiAlerts, RuleUser)
	r(get, api+"/teams/:team/budget", s.apiTeamBudget, RuleTeamMember)
	r(put, api+"/teams/:team/webhook", s.apiSetWebhook, RuleTeamLead)
	r(get, api+"/rightsizing", s.apiRightSizing, RuleReports)
	r(get, api+"/rightsizing.csv", s.apiRightSizingCSV, RuleReports)
	r(get, api+"/chargeback", s.apiChargeback, RuleLeadOrFinance)
	r(get, api+"/chargeback.csv", s.apiChargebackCSV, RuleLeadOrFinance)
	r(post, api+"/chargeback/:month/close", s.apiCloseMonth, RuleFinance)
	// (API: cluster, admin, tokens, health, burst go here, grouped.)
	r(anyMethod, api+"/*", s.apiNotFound, RulePublic)

	// Node agents (node tokens, checked by the handlers).
	const ag = "/api/agent/v1"
	r(post, ag+"/register", s.agentRegister, RuleNode)
	r(post, ag+"/heartbeat", s.agentHeartbeat, RuleNode)
	r(get, ag+"/orders", s.agentOrders, RuleNode)
	r(post, ag+"/leases/take", s.agentTakeLease, RuleNode)
	r(post, ag+"/jobs/started", s.agentStarted, RuleNode)
	r(post, ag+"/jobs/exited", s.agentExited, RuleNode)
	r(post, ag+"/jobs/log", s.agentLog, RuleNode)
	r(anyMethod, ag+"/*", s.apiNotFound, RuleNode)
}
