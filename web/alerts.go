package web

import (
	"net/http"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/labstack/echo/v4"
)

// AlertJSON is one budget alert.
type AlertJSON struct {
	Team           string    `json:"team"`
	Month          string    `json:"month"`
	ThresholdPct   int       `json:"threshold_pct"`
	FiredAt        time.Time `json:"fired_at"`
	UsedGPUHours   string    `json:"used_gpu_hours"`
	BudgetGPUHours int64     `json:"budget_gpu_hours"`
	Message        string    `json:"message"`
}

// alertsFor returns the budget alerts of the teams u belongs to (all for
// finance and admins).
func (s *Server) alertsFor(c echo.Context, u *allot.User, limit int) ([]store.BudgetAlert, error) {
	return s.st.BudgetAlerts(c.Request().Context(), visibleTeams(u), limit)
}

func (s *Server) apiAlerts(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	alerts, err := s.alertsFor(c, u, 200)
	if err != nil {
		return err
	}
	out := make([]AlertJSON, 0, len(alerts))
	for _, a := range alerts {
		out = append(out, AlertJSON{Team: a.Team, Month: a.Month.Format("2006-01"), ThresholdPct: a.ThresholdPct, FiredAt: a.FiredAt.UTC(),
			UsedGPUHours: allot.Hours(a.UsedGPUSeconds), BudgetGPUHours: a.BudgetGPUHours, Message: a.Message})
	}
	return writeJSON(c, http.StatusOK, map[string]any{"alerts": out})
}

// WebhookJSON is the body of PUT /api/v1/teams/{team}/webhook.
type WebhookJSON struct {
	URL string `json:"url"`
	// Note is the audit log's comment (optional).
	Note string `json:"note,omitempty"`
}

// apiSetWebhook sets a team's Slack-compatible alert webhook (its leads and
// admins); an empty URL removes it. It is audited as an admin's edit of the
// team is (a team.webhook entry with the team's values before and after),
// and setting the URL already in force changes nothing.
func (s *Server) apiSetWebhook(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	team := c.Param("team")
	if !u.Admin && !u.LeadOf(team) {
		return allot.Errorf(allot.EForbidden, "only a lead of team %q or an admin can set its webhook", team)
	}
	var body WebhookJSON
	if err := decodeStrict(c.Request().Body, &body); err != nil {
		return err
	}
	body.URL = strings.TrimSpace(body.URL)
	ctx := c.Request().Context()
	if msg := webhookProblem(ctx, body.URL); msg != "" {
		return (allot.FieldErrors{"url": msg}).Err()
	}
	if _, err := s.st.UpdateTeamPolicy(ctx, policyChange(u, "team.webhook", "team:"+team, body.Note), team, func(_ *allot.Team, hook *string) {
		*hook = body.URL
	}); err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, WebhookJSON{URL: body.URL})
}
