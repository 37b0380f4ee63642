package jobs

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/allotlabs/allot/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
)

// HealthArgs finishes drains and sends the admin notifications (node
// health events, automatic undrains) to the admin webhook.
type HealthArgs struct{}

// Kind names the job in River's table.
func (HealthArgs) Kind() string { return "node_health" }

// HealthWorker works HealthArgs. Health rules themselves are evaluated on
// every heartbeat (store.EvaluateHealth); this catches what happens
// between heartbeats.
type HealthWorker struct {
	river.WorkerDefaults[HealthArgs]
	Store  *store.Store
	Logger *slog.Logger
}

// Work marks draining nodes whose jobs are gone drained and enqueues one
// webhook delivery (retried with backoff by WebhookWorker) per new
// notification, in the transaction that marks it sent.
func (w *HealthWorker) Work(ctx context.Context, _ *river.Job[HealthArgs]) error {
	drained, err := w.Store.FinishDrains(ctx)
	if err != nil {
		return err
	}
	if len(drained) > 0 && w.Logger != nil {
		w.Logger.Info("nodes drained", "nodes", drained)
	}
	client := river.ClientFromContext[pgx.Tx](ctx)
	_, err = w.Store.DeliverNotifications(ctx, func(tx pgx.Tx, url string, n store.Notification) error {
		text := fmt.Sprintf("[%s] %s", n.Severity, n.Message)
		_, err := client.InsertTx(ctx, tx, WebhookArgs{URL: url, Text: text}, nil)
		return err
	})
	return err
}
