// Package jobs runs Allot's background work on River: periodic and
// event-triggered jobs (scheduling cycles, billing rollups and alerts come
// with later issues; today: session cleanup). Any number of worker
// processes may share the queue.
package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/allotlabs/allot/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// CleanupSessionsArgs removes expired portal sessions.
type CleanupSessionsArgs struct{}

// Kind names the job in River's table.
func (CleanupSessionsArgs) Kind() string { return "cleanup_sessions" }

// InsertOpts makes the job unique per hour so replicas don't pile it up.
func (CleanupSessionsArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: time.Hour}}
}

// CleanupSessionsWorker works CleanupSessionsArgs.
type CleanupSessionsWorker struct {
	river.WorkerDefaults[CleanupSessionsArgs]
	Store  *store.Store
	Logger *slog.Logger
}

// Work deletes expired sessions.
func (w *CleanupSessionsWorker) Work(ctx context.Context, _ *river.Job[CleanupSessionsArgs]) error {
	n, err := w.Store.DeleteExpiredSessions(ctx)
	if err != nil {
		return err
	}
	if n > 0 {
		w.Logger.Info("deleted expired sessions", "count", n)
	}
	return nil
}

// Config configures the worker pool.
type Config struct {
	Pool       *pgxpool.Pool
	Store      *store.Store
	Logger     *slog.Logger
	MaxWorkers int // per process, default 10
}

// NewClient builds a River client with every Allot worker and periodic job
// registered. Start it with Start(ctx); stop it with Stop(ctx).
func NewClient(cfg Config) (*river.Client[pgx.Tx], error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxWorkers == 0 {
		cfg.MaxWorkers = 10
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &CleanupSessionsWorker{Store: cfg.Store, Logger: cfg.Logger})
	client, err := river.NewClient(riverpgxv5.New(cfg.Pool), &river.Config{
		Logger:  cfg.Logger,
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.MaxWorkers}},
		Workers: workers,
		PeriodicJobs: []*river.PeriodicJob{
			river.NewPeriodicJob(river.PeriodicInterval(time.Hour),
				func() (river.JobArgs, *river.InsertOpts) { return CleanupSessionsArgs{}, nil },
				&river.PeriodicJobOpts{RunOnStart: true}),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("creating River client: %w", err)
	}
	return client, nil
}
