package jobs

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/allotlabs/allot/internal/backend"
)

// DefaultEngineInterval is how often the worker syncs an external engine.
const DefaultEngineInterval = 5 * time.Second

// EngineSyncArgs runs one sync with the external engine (Slurm): nodes,
// drains, jobs, submissions, cancels, demotions and the accounting import.
type EngineSyncArgs struct{}

// Kind names the job in River's table.
func (EngineSyncArgs) Kind() string { return "engine_sync" }

// EngineSyncWorker runs EngineSyncArgs. Only one sync runs at a time in
// the whole installation (River keeps the periodic job unique while one is
// queued or running), so no job is submitted twice.
type EngineSyncWorker struct {
	river.WorkerDefaults[EngineSyncArgs]
	Reconciler *backend.Reconciler
	Logger     *slog.Logger
}

// Timeout bounds one sync (a long accounting import continues in the next
// one, from where this one's last whole batch ended).
func (w *EngineSyncWorker) Timeout(*river.Job[EngineSyncArgs]) time.Duration { return 5 * time.Minute }

// Work syncs once. An unreachable engine is not a River failure to retry
// in a tight loop: it is recorded (the portal shows it) and the next
// period tries again.
func (w *EngineSyncWorker) Work(ctx context.Context, _ *river.Job[EngineSyncArgs]) error {
	if w.Reconciler == nil {
		return nil
	}
	rep, err := w.Reconciler.Sync(ctx)
	if err != nil {
		w.Logger.Warn("engine sync failed", "engine", w.Reconciler.Engine.Name(), "err", err)
		return nil
	}
	if rep.Submitted+rep.Cancelled+rep.Demoted+rep.NewRuns+rep.ImportedJobs+rep.Drained+rep.Resumed > 0 {
		w.Logger.Info("engine sync", "engine", w.Reconciler.Engine.Name(), "submitted", rep.Submitted, "cancelled", rep.Cancelled,
			"demoted", rep.Demoted, "imported_jobs", rep.ImportedJobs, "new_runs", rep.NewRuns, "drained", rep.Drained, "resumed", rep.Resumed,
			"took", rep.Took.String())
	}
	return nil
}
