package jobs

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/allotlabs/allot/internal/backend"
	"github.com/allotlabs/allot/internal/store"
)

// DefaultEngineInterval is how often the worker syncs an external engine.
const DefaultEngineInterval = 5 * time.Second

// EngineSyncArgs runs one sync with the external engine (Slurm): nodes,
// drains, jobs, submissions, cancels, demotions and the accounting import.
// Woken: asked for by a job event (EngineTrigger), not the period.
type EngineSyncArgs struct {
	Woken bool `json:"woken,omitempty"`
}

// Kind names the job in River's table.
func (EngineSyncArgs) Kind() string { return "engine_sync" }

// EngineSyncWorker runs EngineSyncArgs. Only one sync runs at a time in
// the whole installation (a PostgreSQL session lock; River keeps at most
// one periodic and one woken sync queued), so no job is submitted twice.
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
func (w *EngineSyncWorker) Work(ctx context.Context, job *river.Job[EngineSyncArgs]) error {
	if w.Reconciler == nil {
		return nil
	}
	// A woken sync waits for one in progress (which may have passed the
	// submissions already); a periodic one finding a sync running has
	// nothing to add.
	release, ok, err := w.Reconciler.Store.EngineSyncLock(ctx, job.Args.Woken)
	if err != nil || !ok {
		return err
	}
	defer release()
	var rep backend.Report
	if !job.Args.Woken {
		rep, err = w.Reconciler.Sync(ctx)
	} else {
		// A job event: the queue and submissions, now, again while jobs
		// arrived meanwhile (their wake-up found this one still running and
		// was folded into it).
		for range 20 {
			if rep, err = w.Reconciler.SyncJobs(ctx); err != nil {
				break
			}
			more, perr := w.Reconciler.Store.PendingEngineSubmits(ctx, w.Reconciler.Mapping.Backend, 1)
			if perr != nil || len(more) == 0 {
				err = perr
				break
			}
		}
	}
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

// engineSyncOpts keep at most one sync of each kind (periodic, woken)
// queued or running.
func engineSyncOpts() *river.InsertOpts {
	return &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning, rivertype.JobStateRetryable, rivertype.JobStateScheduled}}}
}

// EngineTrigger asks for a sync with the external engine now, when one is
// in use (a GPU type of another backend exists; looked up at most every
// 10 s): a job submitted or cancelled through Allot reaches Slurm without
// waiting for the sync's period. A sync already queued covers the ask.
type EngineTrigger struct {
	mu      sync.Mutex
	checked time.Time
	engine  bool
}

// Sync inserts an engine sync if an engine is in use.
func (t *EngineTrigger) Sync(ctx context.Context, st *store.Store, client Inserter) error {
	if client == nil {
		return nil
	}
	t.mu.Lock()
	// A stopwatch for the cache, not product time.
	if t.checked.IsZero() || time.Since(t.checked) > 10*time.Second {
		types, err := st.EngineGPUTypes(ctx)
		if err != nil {
			t.mu.Unlock()
			return err
		}
		t.engine, t.checked = len(types) > 0, time.Now()
	}
	engine := t.engine
	t.mu.Unlock()
	if !engine {
		return nil
	}
	_, err := client.Insert(ctx, EngineSyncArgs{Woken: true}, engineSyncOpts())
	return err
}
