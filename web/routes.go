package web

import (
	"github.com/allotlabs/allot/static"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// routes is the one route table.
func (s *Server) routes() {
	e := s.e
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{})))
	e.GET(static.Prefix+"*", echo.WrapHandler(static.Handler()))

	// Portal.
	e.GET("/", s.home)
	e.GET("/login", s.loginPage)
	e.POST("/login/dev", s.devLogin)
	e.POST("/logout", s.logout)
	e.GET("/jobs", s.jobsPage)
	e.GET("/jobs/new", s.newJobPage)
	e.POST("/jobs", s.submitJobForm)
	e.POST("/jobs/quota", s.quotaPreview)
	e.GET("/jobs/:id", s.jobPage)
	e.POST("/jobs/:id/cancel", s.cancelJobForm)
	e.GET("/finance", s.financePage)
	e.GET("/teams/:team", s.teamPage)
	e.GET("/rightsizing", s.rightSizingPage)
	e.POST("/finance/close", s.closeMonthForm)

	// JSON API.
	api := e.Group("/api/v1")
	api.GET("/me", s.apiMe)
	api.POST("/jobs", s.apiSubmitJob)
	api.GET("/jobs", s.apiListJobs)
	api.GET("/jobs/:id", s.apiGetJob)
	api.POST("/jobs/:id/cancel", s.apiCancelJob)
	api.GET("/jobs/:id/log", s.apiJobLog)
	api.GET("/alerts", s.apiAlerts)
	api.GET("/teams/:team/budget", s.apiTeamBudget)
	api.GET("/rightsizing", s.apiRightSizing)
	api.GET("/rightsizing.csv", s.apiRightSizingCSV)
	api.PUT("/teams/:team/webhook", s.apiSetWebhook)
	api.GET("/chargeback", s.apiChargeback)
	api.GET("/chargeback.csv", s.apiChargebackCSV)
	api.POST("/chargeback/:month/close", s.apiCloseMonth)
	api.Any("/*", s.apiNotFound)

	// Node agents (node tokens).
	ag := e.Group("/api/agent/v1")
	ag.POST("/register", s.agentRegister)
	ag.POST("/heartbeat", s.agentHeartbeat)
	ag.GET("/orders", s.agentOrders)
	ag.POST("/leases/take", s.agentTakeLease)
	ag.POST("/jobs/started", s.agentStarted)
	ag.POST("/jobs/exited", s.agentExited)
	ag.POST("/jobs/log", s.agentLog)
	ag.Any("/*", s.apiNotFound)
}
