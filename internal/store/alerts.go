package store

import (
	"context"
	"fmt"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// BudgetAlert is a threshold a team crossed in a month.
type BudgetAlert struct {
	Team           string
	Month          time.Time
	ThresholdPct   int
	FiredAt        time.Time
	UsedGPUSeconds int64
	BudgetGPUHours int64
	Message        string
	WebhookURL     string
}

// FireBudgetAlert records the alert unless it already fired this month; it
// reports whether it is new. Run it in the transaction that also enqueues
// the webhook delivery.
func (s *Store) FireBudgetAlert(ctx context.Context, a *BudgetAlert) (bool, error) {
	tag, err := s.db.Exec(ctx, `
		INSERT INTO budget_alerts (team, month, threshold_pct, fired_at, used_gpu_seconds, budget_gpu_hours, message)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING`,
		a.Team, a.Month, a.ThresholdPct, a.FiredAt, a.UsedGPUSeconds, a.BudgetGPUHours, a.Message)
	if err != nil {
		return false, mapErr("recording budget alert", err)
	}
	return tag.RowsAffected() == 1, nil
}

// BudgetAlerts returns the alerts of the given teams (nil: all), newest first.
func (s *Store) BudgetAlerts(ctx context.Context, teams []string, limit int) ([]BudgetAlert, error) {
	rows, err := s.db.Query(ctx, `
		SELECT a.team, a.month, a.threshold_pct, a.fired_at, a.used_gpu_seconds, a.budget_gpu_hours, a.message, t.webhook_url
		FROM budget_alerts a JOIN teams t ON t.slug = a.team
		WHERE $1::text[] IS NULL OR a.team = ANY($1)
		ORDER BY a.fired_at DESC, a.team, a.threshold_pct DESC LIMIT $2`, teams, limit)
	if err != nil {
		return nil, mapErr("loading budget alerts", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BudgetAlert, error) {
		var a BudgetAlert
		return a, r.Scan(&a.Team, &a.Month, &a.ThresholdPct, &a.FiredAt, &a.UsedGPUSeconds, &a.BudgetGPUHours, &a.Message, &a.WebhookURL)
	})
	return out, mapErr("loading budget alerts", err)
}

// SetTeamWebhook sets (or clears, with "") a team's alert webhook.
func (s *Store) SetTeamWebhook(ctx context.Context, team, url string) error {
	tag, err := s.db.Exec(ctx, `UPDATE teams SET webhook_url = $2 WHERE slug = $1`, team, url)
	if err != nil {
		return mapErr("setting webhook", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("setting webhook of %q: %w", team, allot.ErrNotFound)
	}
	return nil
}

// TeamWebhook returns a team's webhook URL ("" if none).
func (s *Store) TeamWebhook(ctx context.Context, team string) (string, error) {
	var url string
	err := s.db.QueryRow(ctx, `SELECT webhook_url FROM teams WHERE slug = $1`, team).Scan(&url)
	return url, mapErr("loading webhook", err)
}

// LogDelivery records one webhook delivery attempt.
func (s *Store) LogDelivery(ctx context.Context, team, url string, attempt int, status int, errMsg string) error {
	var code *int
	if status != 0 {
		code = &status
	}
	_, err := s.db.Exec(ctx, `INSERT INTO webhook_deliveries (team, url, attempt, status_code, error, at) VALUES (nullif($1, ''), $2, $3, $4, $5, $6)`,
		team, url, attempt, code, errMsg, s.Now())
	return mapErr("logging webhook delivery", err)
}

// Delivery is one logged webhook attempt.
type Delivery struct {
	Team    string
	URL     string
	Attempt int
	Status  *int
	Error   string
	At      time.Time
}

// Deliveries returns a team's webhook delivery log, newest first.
func (s *Store) Deliveries(ctx context.Context, team string, limit int) ([]Delivery, error) {
	rows, err := s.db.Query(ctx, `SELECT team, url, attempt, status_code, error, at FROM webhook_deliveries WHERE team = $1 ORDER BY id DESC LIMIT $2`, team, limit)
	return collectDeliveries(rows, err)
}

// collectDeliveries reads the rows of a query of team, url, attempt,
// status_code, error, at.
func collectDeliveries(rows pgx.Rows, err error) ([]Delivery, error) {
	if err != nil {
		return nil, mapErr("loading deliveries", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		return d, r.Scan(&d.Team, &d.URL, &d.Attempt, &d.Status, &d.Error, &d.At)
	})
	return out, mapErr("loading deliveries", err)
}
