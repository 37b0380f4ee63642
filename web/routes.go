package web

import (
	"net/http"

	"github.com/allotlabs/allot/static"
	"github.com/labstack/echo/v4"
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
	r(get, "/metrics", s.metricsRoute(), RuleMetrics) // a bearer token: an admin's or the scrape token (metrics_auth.go)
	r(get, static.Prefix+"*", echo.WrapHandler(static.Handler()), RulePublic)

	// Login and sessions.
	r(get, "/", s.home, RulePublic)
	r(get, "/login", s.loginPage, RulePublic)
	r(post, "/login/dev", s.devLogin, RulePublic)
	r(post, "/logout", s.logout, RulePublic)
	r(get, "/login/oidc", s.oidcStart, RulePublic)
	r(get, "/oidc/callback", s.oidcCallback, RulePublic)
	r(get, "/tokens", s.tokensPage, RuleUser)
	r(post, "/tokens", s.createTokenForm, RuleUser)
	r(post, "/tokens/:id/revoke", s.revokeTokenForm, RuleUser)

	// Jobs.
	r(get, "/jobs", s.jobsPage, RuleUser)
	r(get, "/jobs/new", s.newJobPage, RuleSubmitter)
	r(post, "/jobs", s.submitJobForm, RuleSubmitter)
	r(post, "/jobs/quota", s.quotaPreview, RuleSubmitter)
	r(get, "/jobs/:id", s.jobPage, RuleUser)
	r(post, "/jobs/:id/cancel", s.cancelJobForm, RuleCanceller)

	// Teams, reports, chargeback.
	r(get, "/teams/:team", s.teamPage, RuleTeamMember)
	r(get, "/rightsizing", s.rightSizingPage, RuleReports)
	r(get, "/finance", s.financePage, RuleLeadOrFinance)
	r(post, "/finance/close", s.closeMonthForm, RuleFinance)

	// Cluster dashboard.
	r(get, "/cluster", s.clusterPage, RuleUser)

	// Admin.
	r(get, "/admin", s.adminPage, RuleAdmin)
	r(get, "/admin/tiers", s.adminTiersPage, RuleAdmin)
	r(post, "/admin/tiers/:tier", s.adminTierForm, RuleAdmin)
	r(get, "/admin/gpu-types", s.adminGPUTypesPage, RuleAdmin)
	r(post, "/admin/gpu-types", s.adminCreateGPUTypeForm, RuleAdmin)
	r(post, "/admin/gpu-types/:name", s.adminGPUTypeForm, RuleAdmin)
	r(get, "/admin/rates", s.adminRatesPage, RuleAdmin)
	r(post, "/admin/rates/:gpu_type", s.adminRateForm, RuleAdmin)
	r(get, "/admin/teams", s.adminTeamsPage, RuleAdmin)
	r(post, "/admin/teams", s.adminTeamForm, RuleAdmin)
	r(post, "/admin/teams/:team", s.adminTeamForm, RuleAdmin)
	r(get, "/admin/policy", s.adminPolicyPage, RuleAdmin)
	r(post, "/admin/policy", s.adminPolicyForm, RuleAdmin)
	r(get, "/admin/audit", s.auditPage, RuleAdmin)
	r(get, "/admin/versions", s.versionsPage, RuleAdmin)
	r(get, "/admin/users", s.adminUsersPage, RuleAdmin)
	r(post, "/admin/users/:user/disable", s.adminUserAccessForm(true), RuleAdmin)
	r(post, "/admin/users/:user/enable", s.adminUserAccessForm(false), RuleAdmin)
	r(get, "/admin/accounts", s.adminAccountsPage, RuleAdmin)
	r(post, "/admin/users/:user/account", s.adminAccountForm, RuleAdmin)
	r(get, "/admin/identity", s.adminIdentityPage, RuleAdmin)
	r(post, "/admin/identity/rules", s.adminIdPRuleCreateForm, RuleAdmin)
	r(post, "/admin/identity/rules/:id", s.adminIdPRuleUpdateForm, RuleAdmin)
	r(post, "/admin/identity/rules/:id/delete", s.adminIdPRuleDeleteForm, RuleAdmin)
	r(post, "/admin/identity/link", s.adminLinkForm, RuleAdmin)
	r(post, "/admin/identity/try", s.adminTryForm, RuleAdmin)
	r(get, "/admin/slurm", s.adminSlurmPage, RuleAdmin)
	r(post, "/admin/slurm/sync", s.adminSlurmSyncForm, RuleAdmin)
	r(get, "/admin/node-tokens", s.adminNodeTokensPage, RuleAdmin)
	r(post, "/admin/node-tokens", s.adminCreateNodeTokenForm, RuleAdmin)
	r(post, "/admin/node-tokens/rotate", s.adminRotateNodeTokenForm, RuleAdmin)
	r(post, "/admin/node-tokens/:id/revoke", s.adminRevokeNodeTokenForm, RuleAdmin)

	// Policy docs.
	r(get, "/docs", s.docsPage, RuleUser)

	// Health and nodes.
	r(get, "/nodes", s.nodesPage, RuleUser)
	r(post, "/nodes/notifications/read", s.readNotificationsForm, RuleAdmin)
	r(get, "/nodes/:name", s.nodePage, RuleUser)
	r(post, "/nodes/:name/drain", s.drainNodeForm, RuleAdmin)
	r(post, "/nodes/:name/undrain", s.undrainNodeForm, RuleAdmin)
	r(post, "/nodes/:name/labels", s.nodeLabelsForm, RuleAdmin)
	r(get, "/admin/health", s.healthRulesPage, RuleAdmin)
	r(post, "/admin/health", s.healthRulesForm, RuleAdmin)

	// Cloud burst.
	r(get, "/burst", s.burstPage, RuleUser)

	// JSON API.
	const api = "/api/v1"
	r(get, api+"/me", s.apiMe, RuleUser)
	// API: allot login (oidc_cli.go); public, the CLI has no token yet.
	r(get, api+"/auth/cli", s.apiCLIConfig, RulePublic)
	r(post, api+"/auth/cli/token", s.apiCLIToken, RulePublic)
	r(post, api+"/jobs", s.apiSubmitJob, RuleSubmitter)
	r(get, api+"/jobs", s.apiListJobs, RuleUser)
	r(get, api+"/jobs/:id", s.apiGetJob, RuleUser)
	r(post, api+"/jobs/:id/cancel", s.apiCancelJob, RuleCanceller)
	r(get, api+"/jobs/:id/log", s.apiJobLog, RuleUser)
	r(get, api+"/alerts", s.apiAlerts, RuleUser)
	r(get, api+"/teams/:team/budget", s.apiTeamBudget, RuleTeamMember)
	r(put, api+"/teams/:team/webhook", s.apiSetWebhook, RuleTeamLead)
	r(get, api+"/rightsizing", s.apiRightSizing, RuleReports)
	r(get, api+"/rightsizing.csv", s.apiRightSizingCSV, RuleReports)
	r(get, api+"/chargeback", s.apiChargeback, RuleLeadOrFinance)
	r(get, api+"/chargeback.csv", s.apiChargebackCSV, RuleLeadOrFinance)
	r(post, api+"/chargeback/:month/close", s.apiCloseMonth, RuleFinance)
	r(get, api+"/capacity", s.apiCapacity, RuleFinance)
	r(get, api+"/capacity.csv", s.apiCapacityCSV, RuleFinance)
	r(get, api+"/cluster", s.apiCluster, RuleUser)
	r(get, api+"/fairshare", s.apiFairShare, RuleUser)
	r(get, api+"/priorities", s.apiPriorities, RuleUser) // the pending jobs the caller can see (api_cli.go)
	r(get, api+"/node-usage", s.apiNodeUsage, RuleUser)  // every node's GPUs allocated and idle (api_cli.go)
	// (API: cluster, admin, tokens, health, burst go here, grouped.)
	r(get, api+"/burst", s.apiBurst, RuleUser)
	r(get, api+"/tokens", s.apiListTokens, RuleUser)
	r(post, api+"/tokens", s.apiCreateToken, RuleUser)
	r(del, api+"/tokens/:id", s.apiRevokeToken, RuleUser)
	// API: node tokens and people (admin).
	r(get, api+"/node-tokens", s.apiListNodeTokens, RuleAdmin)
	r(post, api+"/node-tokens", s.apiCreateNodeToken, RuleAdmin)
	r(del, api+"/node-tokens/:id", s.apiRevokeNodeToken, RuleAdmin)
	r(post, api+"/nodes/:name/rotate-token", s.apiRotateNodeToken, RuleAdmin)
	r(post, api+"/nodes/:name/revoke-tokens", s.apiRevokeNodeTokens, RuleAdmin)
	r(get, api+"/users", s.apiListUsers, RuleAdmin)
	r(post, api+"/users/:user/disable", s.apiDisableUser, RuleAdmin)
	r(post, api+"/users/:user/enable", s.apiEnableUser, RuleAdmin)
	// API: admin policy editing, audit (admin); the policy in force (everyone).
	r(get, api+"/policy", s.apiGetPolicy, RuleUser)
	r(put, api+"/policy", s.apiPutPolicy, RuleAdmin)
	r(get, api+"/policy/versions", s.apiPolicyVersions, RuleAdmin)
	r(get, api+"/tiers", s.apiListTiers, RuleUser)
	r(put, api+"/tiers/:tier", s.apiUpdateTier, RuleAdmin)
	r(get, api+"/gpu-types", s.apiListGPUTypes, RuleUser)
	r(post, api+"/gpu-types", s.apiCreateGPUType, RuleAdmin)
	r(put, api+"/gpu-types/:name", s.apiUpdateGPUType, RuleAdmin)
	r(get, api+"/rates", s.apiRates, RuleUser)
	r(put, api+"/rates/:gpu_type", s.apiSetRate, RuleAdmin)
	r(get, api+"/teams", s.apiListTeams, RuleAdmin)
	r(post, api+"/teams", s.apiCreateTeam, RuleAdmin)
	r(put, api+"/teams/:team", s.apiUpdateTeam, RuleAdmin)
	// API: who jobs run as (the team's service account is a team field).
	r(get, api+"/accounts", s.apiListAccounts, RuleAdmin)
	r(put, api+"/users/:user/account", s.apiSetAccount, RuleAdmin)
	// API: identity-provider mapping and linking (admin).
	r(get, api+"/idp-mappings", s.apiListIdPMappings, RuleAdmin)
	r(post, api+"/idp-mappings", s.apiCreateIdPMapping, RuleAdmin)
	r(put, api+"/idp-mappings/:id", s.apiUpdateIdPMapping, RuleAdmin)
	r(del, api+"/idp-mappings/:id", s.apiDeleteIdPMapping, RuleAdmin)
	r(post, api+"/idp-mappings/try", s.apiTryIdPMappings, RuleAdmin)
	r(get, api+"/idp-sign-ins", s.apiIdPSignIns, RuleAdmin)
	r(post, api+"/users/:user/oidc-link", s.apiLinkOIDC, RuleAdmin)
	// API: the Slurm configuration rendered from the policy (web/slurm.go).
	r(get, api+"/slurm/config", s.apiSlurmConfig, RuleAdmin)
	r(get, api+"/slurm/over-budget", s.apiSlurmOverBudget, RuleAdmin)
	r(get, api+"/audit", s.apiAudit, RuleAdmin)
	r(get, api+"/audit.csv", s.apiAuditCSV, RuleAdmin)
	// API: nodes and health.
	r(get, api+"/nodes", s.apiListNodes, RuleUser)
	r(get, api+"/nodes/:name", s.apiGetNode, RuleUser)
	r(post, api+"/nodes/:name/drain", s.apiDrainNode, RuleAdmin)
	r(post, api+"/nodes/:name/undrain", s.apiUndrainNode, RuleAdmin)
	r(put, api+"/nodes/:name/labels", s.apiSetNodeLabels, RuleAdmin)
	r(put, api+"/nodes/:name/inventory", s.apiSetNodeInventory, RuleAdmin)
	r(get, api+"/health/rules", s.apiHealthRules, RuleUser)
	r(put, api+"/health/rules", s.apiSetHealthRules, RuleAdmin)
	r(get, api+"/notifications", s.apiNotifications, RuleAdmin)
	r(anyMethod, api+"/*", s.apiNotFound, RulePublic)

	// Node agents (node tokens, checked by the handlers).
	const ag = agentAPIPrefix
	r(post, ag+"/register", s.agentRegister, RuleNode)
	r(post, ag+"/heartbeat", s.agentHeartbeat, RuleNode)
	r(get, ag+"/orders", s.agentOrders, RuleNode)
	r(post, ag+"/leases/take", s.agentTakeLease, RuleNode)
	r(post, ag+"/leases/take-batch", s.agentTakeBatch, RuleNode)
	r(post, ag+"/jobs/started", s.agentStarted, RuleNode)
	r(post, ag+"/jobs/started-batch", s.agentStartedBatch, RuleNode)
	r(post, ag+"/jobs/exited", s.agentExited, RuleNode)
	r(post, ag+"/jobs/log", s.agentLog, RuleNode)
	// Slurm hosts keep job_submit.lua's over-budget list current (web/slurm.go).
	r(get, ag+"/slurm/over-budget", s.agentSlurmOverBudget, RuleNode)
	r(anyMethod, ag+"/*", s.apiNotFound, RulePublic) // a 404, whoever asks
	s.otherRole()
}
