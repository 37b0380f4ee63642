package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/webhook"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
)

// BudgetCheckArgs checks every team's monthly budget.
type BudgetCheckArgs struct{}

// Kind names the job in River's table.
func (BudgetCheckArgs) Kind() string { return "budget_check" }

// WebhookArgs delivers one alert to a team's webhook (Slack-compatible).
type WebhookArgs struct {
	Team string `json:"team"`
	URL  string `json:"url"`
	Text string `json:"text"`
}

// Kind names the job in River's table.
func (WebhookArgs) Kind() string { return "webhook" }

// InsertOpts retries deliveries.
func (WebhookArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{MaxAttempts: 10} }

// BudgetCheck fires the 80 % and 100 % alerts (the policy's thresholds)
// once per team and month, and enqueues their webhooks in the same
// transaction. inserter may be nil (no webhooks). It returns the alerts it
// fired.
func BudgetCheck(ctx context.Context, st *store.Store, inserter func(ctx context.Context, tx pgx.Tx, args river.JobArgs) error) ([]store.BudgetAlert, error) {
	var fired []store.BudgetAlert
	err := st.InPgxTx(ctx, func(tx pgx.Tx, s *store.Store) error {
		p, err := s.CurrentPolicy(ctx)
		if err != nil {
			return err
		}
		teams, err := s.ListTeams(ctx)
		if err != nil {
			return err
		}
		now := s.Now()
		for _, t := range teams {
			if t.MonthlyBudgetGPUHours <= 0 {
				continue
			}
			used, err := s.TeamMonthUsage(ctx, t.Slug)
			if err != nil {
				return err
			}
			budget := t.MonthlyBudgetGPUHours * 3600
			for _, pct := range []int{p.BudgetWarnPct, p.BudgetDemotePct} {
				if used*100 < budget*int64(pct) {
					continue
				}
				msg := allot.BudgetAlertMessage(t.Slug, used, t.MonthlyBudgetGPUHours, now, pct >= p.BudgetDemotePct)
				a := store.BudgetAlert{Team: t.Slug, Month: store.MonthStart(now), ThresholdPct: pct, FiredAt: now,
					UsedGPUSeconds: used, BudgetGPUHours: t.MonthlyBudgetGPUHours, Message: msg}
				isNew, err := s.FireBudgetAlert(ctx, &a)
				if err != nil || !isNew {
					if err != nil {
						return err
					}
					continue
				}
				fired = append(fired, a)
				url, err := s.TeamWebhook(ctx, t.Slug)
				if err != nil {
					return err
				}
				if url != "" && inserter != nil {
					if err := inserter(ctx, tx, WebhookArgs{Team: t.Slug, URL: url, Text: msg}); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	return fired, err
}

// BudgetCheckWorker works BudgetCheckArgs.
type BudgetCheckWorker struct {
	river.WorkerDefaults[BudgetCheckArgs]
	Store *store.Store
}

// Work checks budgets.
func (w *BudgetCheckWorker) Work(ctx context.Context, _ *river.Job[BudgetCheckArgs]) error {
	client := river.ClientFromContext[pgx.Tx](ctx)
	_, err := BudgetCheck(ctx, w.Store, func(ctx context.Context, tx pgx.Tx, args river.JobArgs) error {
		_, err := client.InsertTx(ctx, tx, args, nil)
		return err
	})
	return err
}

// WebhookWorker posts alerts; a failed delivery is retried with backoff
// (River) and every attempt goes to the delivery log.
type WebhookWorker struct {
	river.WorkerDefaults[WebhookArgs]
	Store *store.Store
	HTTP  *http.Client
	// Backoff is the first retry delay, doubling per attempt up to an hour
	// (default 30 s).
	Backoff time.Duration
	// AllowPrivate permits deliveries to loopback and private addresses
	// (development and tests).
	AllowPrivate bool
	// Lookup resolves webhook hosts (nil: the system resolver); tests pass
	// a table.
	Lookup webhook.Lookup
}

// NextRetry doubles the backoff per attempt.
func (w *WebhookWorker) NextRetry(job *river.Job[WebhookArgs]) time.Time {
	d := w.Backoff
	if d == 0 {
		d = 30 * time.Second
	}
	for i := 1; i < job.Attempt && d < time.Hour; i++ {
		d *= 2
	}
	return time.Now().Add(min(d, time.Hour))
}

// Work posts {"text": …} to the team's webhook.
func (w *WebhookWorker) Work(ctx context.Context, job *river.Job[WebhookArgs]) error {
	body, _ := json.Marshal(map[string]string{"text": job.Args.Text})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, job.Args.URL, bytes.NewReader(body))
	if err != nil {
		w.Store.LogDelivery(ctx, job.Args.Team, job.Args.URL, job.Attempt, 0, err.Error()) //nolint:errcheck
		return river.JobCancel(fmt.Errorf("bad webhook URL: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	client := w.HTTP
	if client == nil {
		// The address policy (internal/webhook) again, at connect time: the
		// URL was checked when it was set, but a name can resolve
		// differently now (DNS rebinding, a changed record), and the admin
		// webhook or a URL set before the policy tightened may never have
		// been checked at all.
		client = (&webhook.Dialer{Lookup: w.Lookup, AllowPrivate: w.AllowPrivate}).Client()
		defer client.CloseIdleConnections() // one client per delivery: keep no sockets
	}
	resp, err := client.Do(req)
	if err != nil {
		if lerr := w.Store.LogDelivery(ctx, job.Args.Team, job.Args.URL, job.Attempt, 0, err.Error()); lerr != nil {
			return lerr
		}
		if errors.Is(err, webhook.ErrNotPublic) {
			// Retrying cannot help until someone fixes the URL.
			return river.JobCancel(err)
		}
		return err
	}
	resp.Body.Close()
	msg := ""
	if resp.StatusCode >= 300 {
		msg = resp.Status
	}
	if err := w.Store.LogDelivery(ctx, job.Args.Team, job.Args.URL, job.Attempt, resp.StatusCode, msg); err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("webhook answered %s", resp.Status)
	}
	return nil
}

// WeeklyReportArgs sends each team its weekly right-sizing summary.
type WeeklyReportArgs struct{}

// Kind names the job in River's table.
func (WeeklyReportArgs) Kind() string { return "weekly_report" }

// WeeklyReportWorker works WeeklyReportArgs: it posts each team's summary to
// its webhook (teams without one read the report in the portal).
type WeeklyReportWorker struct {
	river.WorkerDefaults[WeeklyReportArgs]
	Store *store.Store
}

// Work enqueues one webhook delivery per team with a webhook.
func (w *WeeklyReportWorker) Work(ctx context.Context, _ *river.Job[WeeklyReportArgs]) error {
	client := river.ClientFromContext[pgx.Tx](ctx)
	teams, err := w.Store.ListTeams(ctx)
	if err != nil {
		return err
	}
	for _, t := range teams {
		url, err := w.Store.TeamWebhook(ctx, t.Slug)
		if err != nil || url == "" {
			if err != nil {
				return err
			}
			continue
		}
		msg, err := WeeklySummary(ctx, w.Store, t.Slug, w.Store.Now())
		if err != nil {
			return err
		}
		if _, err := client.Insert(ctx, WebhookArgs{Team: t.Slug, URL: url, Text: msg}, nil); err != nil {
			return err
		}
	}
	return nil
}
