// Package jobs runs Allot's background work on River: scheduling cycles
// (periodic at the policy's Cycle and triggered by submits, finishes,
// cancels and node changes, coalesced; each also decays the fair-share
// usage), marking silent nodes down and session cleanup. Any number of
// worker processes may share the queue; the cycle lock makes one cycle run
// at a time. Billing rollups and alerts come with later issues.
package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/backend"
	"github.com/allotlabs/allot/internal/metric"
	"github.com/allotlabs/allot/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
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
	Registry   prometheus.Registerer // cycle metrics go here (nil: not exported)
	MaxWorkers int                   // per process, default 10
	// MaxStartsPerCycle caps the starts of one scheduling cycle
	// (Scheduler.MaxStarts: 0 the default, <0 none).
	MaxStartsPerCycle int
	// DecayPeriod is how often a cycle decays the teams' fair-share usage
	// (Scheduler.DecayPeriod: 0 the default, a minute; <0 every cycle).
	DecayPeriod time.Duration
	// MinCycleInterval is the least time between the starts of two of
	// this worker's cycles (ScheduleWorker.MinInterval; 0: none, cycles
	// run back to back while requests keep coming), at most
	// MaxMinCycleInterval.
	MinCycleInterval time.Duration
	// CycleDuty is the most of the time this worker's cycles may take
	// while requests keep coming (ScheduleWorker.Duty): 0 is
	// DefaultCycleDuty, 1 no limit (cycles back to back).
	CycleDuty float64
	// CycleTick is how often the worker looks whether the policy's Cycle
	// (the scheduling period, which admins edit) has passed since the last
	// cycle (default 1 s); submits, finishes, cancels and node changes run
	// a cycle at once.
	CycleTick time.Duration
	// HeartbeatInterval is the agents' heartbeat period (default 10 s); a
	// node silent for the policy's HeartbeatMissedAfter (at least 2
	// intervals) is marked down.
	HeartbeatInterval time.Duration
	// CheckpointRoot is the directory under which checkpointable jobs get
	// ALLOT_CHECKPOINT_DIR (default /var/lib/allot/checkpoints).
	CheckpointRoot string
	// BudgetCheckInterval is how often budgets are checked (default 1 min).
	BudgetCheckInterval time.Duration
	// WebhookBackoff is the first retry delay of a failed webhook (default 30 s).
	WebhookBackoff time.Duration
	// AllowPrivateWebhooks lets webhooks reach loopback and private
	// addresses (development and tests only).
	AllowPrivateWebhooks bool
	// SampleRetention is how long raw GPU samples are kept once rolled up
	// (default 14 days).
	SampleRetention time.Duration
	// Burst configures cloud burst (off when Burst.Provider is nil).
	Burst BurstConfig
	// Engine syncs an external engine (Slurm) every EngineInterval (nil:
	// none; see internal/backend).
	Engine         *backend.Reconciler
	EngineInterval time.Duration
}

// OfferDeadline is how long an offer waits for its take when its node has
// sent no heartbeat meanwhile, and after how long an offer a live node has
// not taken is sent again: 3 heartbeat intervals, at least 30 s.
func OfferDeadline(interval time.Duration) time.Duration { return max(3*interval, 30*time.Second) }

// LiveOfferDeadline is how long an offer waits for its take when its node
// still heartbeats: 10 intervals, at least 2 minutes.
func LiveOfferDeadline(interval time.Duration) time.Duration { return max(10*interval, 2*time.Minute) }

// LostNodesArgs marks nodes that stopped sending heartbeats down.
type LostNodesArgs struct{}

// Kind names the job in River's table.
func (LostNodesArgs) Kind() string { return "lost_nodes" }

// LostNodesWorker works LostNodesArgs.
type LostNodesWorker struct {
	river.WorkerDefaults[LostNodesArgs]
	Store    *store.Store
	Logger   *slog.Logger
	Interval time.Duration // the agents' heartbeat interval
}

// Work marks silent nodes down, requeues or fails their jobs, and asks for
// a scheduling cycle when anything changed.
func (w *LostNodesWorker) Work(ctx context.Context, _ *river.Job[LostNodesArgs]) error {
	lost, err := w.Store.LostNodes(ctx, w.Interval)
	if err != nil {
		return err
	}
	if len(lost) > 0 {
		w.Logger.Warn("nodes stopped sending heartbeats; marked down", "nodes", lost)
	}
	// A gang whose leases are not all taken goes back to the queue: within
	// 3 intervals (at least 30 s) when a node of it went quiet, within 10
	// (at least 2 minutes) when its nodes still heartbeat (under load their
	// takes may wait in a queue; a node that does not take refused). An
	// offer a live node has not taken within the short deadline is sent
	// again (its answer, or its take's commit, may have been lost).
	now := w.Store.Now()
	short := now.Add(-OfferDeadline(w.Interval))
	expired, err := w.Store.ExpireStaleOffers(ctx, store.OfferDeadlines{Silent: short, Live: now.Add(-LiveOfferDeadline(w.Interval)), Resend: short})
	if err != nil {
		return err
	}
	if len(expired) > 0 {
		w.Logger.Warn("leases not taken in time; jobs requeued", "jobs", expired)
	}
	// A stop that no agent confirms within its grace plus 3 intervals (the
	// agent restarted and lost the process) ends the lease.
	unconfirmed, err := w.Store.EndUnconfirmedStops(ctx, w.Store.Now().Add(-max(3*w.Interval, 30*time.Second)))
	if err != nil {
		return err
	}
	if unconfirmed > 0 {
		w.Logger.Warn("stops no agent confirmed; leases ended", "count", unconfirmed)
	}
	if len(lost) > 0 || len(expired) > 0 || unconfirmed > 0 {
		return Trigger(ctx, w.Store, river.ClientFromContext[pgx.Tx](ctx))
	}
	return nil
}

// MaxMinCycleInterval bounds Config.MinCycleInterval (the flags refuse
// more): a start waits at most this much longer.
const MaxMinCycleInterval = 10 * time.Second

// CheckMinCycleInterval is the flags' check of a --min-cycle-interval.
func CheckMinCycleInterval(d time.Duration) error {
	if d < 0 || d > MaxMinCycleInterval {
		return fmt.Errorf("--min-cycle-interval must be 0 (none) to %s, not %s", MaxMinCycleInterval, d)
	}
	return nil
}

// DefaultCycleDuty is Config.CycleDuty's default: a cycle is followed by
// a pause at least as long before the next (`allot worker --cycle-duty`).
const DefaultCycleDuty = 0.5

// CheckCycleDuty is the flags' check of a --cycle-duty.
func CheckCycleDuty(d float64) error {
	if !(d > 0 && d <= 1) {
		return fmt.Errorf("--cycle-duty must be more than 0 and at most 1 (no pause), not %v", d)
	}
	return nil
}

// Inserter is the part of a River client that inserts jobs.
type Inserter interface {
	Insert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

// Trigger asks for a scheduling cycle soon. Requests are never lost: a
// request that River folds into a queued or running cycle job is seen by
// that job, which re-checks the request counter, and completes itself in
// the same transaction as its last check (see ScheduleWorker).
func Trigger(ctx context.Context, st *store.Store, client Inserter) error {
	if _, err := st.RequestSchedule(ctx); err != nil {
		return err
	}
	if client == nil {
		return nil
	}
	_, err := client.Insert(ctx, ScheduleArgs{}, nil)
	return err
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
	if cfg.CycleTick <= 0 {
		cfg.CycleTick = time.Second
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = agentproto.DefaultHeartbeatInterval
	}
	if cfg.BudgetCheckInterval == 0 {
		cfg.BudgetCheckInterval = time.Minute
	}
	if cfg.CheckpointRoot == "" {
		cfg.CheckpointRoot = "/var/lib/allot/checkpoints"
	}
	sched := &Scheduler{Store: cfg.Store, Logger: cfg.Logger, CheckpointRoot: cfg.CheckpointRoot, Metrics: NewCycleMetrics(cfg.Registry),
		MaxStarts: cfg.MaxStartsPerCycle, DecayPeriod: cfg.DecayPeriod}
	// The worker's /metrics: its cycles, rollups and River jobs, and the
	// cluster's live state read from PostgreSQL at scrape time.
	rollupMetrics, riverMetrics := metric.NewBilling(cfg.Registry), metric.NewRiver(cfg.Registry)
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(metric.NewState(cfg.Store))
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &CleanupSessionsWorker{Store: cfg.Store, Logger: cfg.Logger})
	duty := cfg.CycleDuty
	if duty == 0 {
		duty = DefaultCycleDuty
	}
	river.AddWorker(workers, &ScheduleWorker{Scheduler: sched, Tick: cfg.CycleTick, Burst: cfg.Burst.Provider != nil, MinInterval: cfg.MinCycleInterval, Duty: duty})
	river.AddWorker(workers, &LostNodesWorker{Store: cfg.Store, Logger: cfg.Logger, Interval: cfg.HeartbeatInterval})
	river.AddWorker(workers, &BillingRollupWorker{Store: cfg.Store, Metrics: rollupMetrics})
	river.AddWorker(workers, &MeteringWorker{Store: cfg.Store, Retention: cfg.SampleRetention})
	river.AddWorker(workers, &WeeklyReportWorker{Store: cfg.Store})
	river.AddWorker(workers, &BudgetCheckWorker{Store: cfg.Store})
	river.AddWorker(workers, &WebhookWorker{Store: cfg.Store, Backoff: cfg.WebhookBackoff, AllowPrivate: cfg.AllowPrivateWebhooks})
	river.AddWorker(workers, &HealthWorker{Store: cfg.Store, Logger: cfg.Logger})
	burster := NewBurster(cfg.Store, cfg.Logger, cfg.Burst)
	river.AddWorker(workers, &BurstEvaluateWorker{Burster: burster})
	river.AddWorker(workers, &BurstProviderWorker{Burster: burster})
	river.AddWorker(workers, &EngineSyncWorker{Reconciler: cfg.Engine, Logger: cfg.Logger})
	riverMetrics.Kinds(CleanupSessionsArgs{}.Kind(), ScheduleArgs{}.Kind(), LostNodesArgs{}.Kind(), BillingRollupArgs{}.Kind(), MeteringArgs{}.Kind(),
		WeeklyReportArgs{}.Kind(), BudgetCheckArgs{}.Kind(), WebhookArgs{}.Kind(), HealthArgs{}.Kind(), BurstEvaluateArgs{}.Kind(), BurstProviderArgs{}.Kind())
	client, err := river.NewClient(riverpgxv5.New(cfg.Pool), &river.Config{
		// Pick up triggered cycles fast (submit → running latency); inserts
		// wake the producer through LISTEN/NOTIFY, polling is the fallback.
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 250 * time.Millisecond,
		Logger:            RiverLogger(cfg.Logger),
		Middleware:        []rivertype.Middleware{riverMetrics},
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.MaxWorkers}},
		Workers:           workers,
		PeriodicJobs: []*river.PeriodicJob{
			river.NewPeriodicJob(river.PeriodicInterval(time.Hour),
				func() (river.JobArgs, *river.InsertOpts) { return CleanupSessionsArgs{}, nil },
				&river.PeriodicJobOpts{RunOnStart: true}),
			river.NewPeriodicJob(river.PeriodicInterval(cfg.CycleTick),
				func() (river.JobArgs, *river.InsertOpts) { return ScheduleArgs{Periodic: true}, nil },
				&river.PeriodicJobOpts{RunOnStart: true}),
			river.NewPeriodicJob(river.PeriodicInterval(cfg.HeartbeatInterval/2),
				func() (river.JobArgs, *river.InsertOpts) { return LostNodesArgs{}, nil }, nil),
			river.NewPeriodicJob(river.PeriodicInterval(cfg.HeartbeatInterval),
				func() (river.JobArgs, *river.InsertOpts) { return HealthArgs{}, nil }, nil),
			river.NewPeriodicJob(river.PeriodicInterval(cfg.BudgetCheckInterval),
				func() (river.JobArgs, *river.InsertOpts) { return BudgetCheckArgs{}, nil },
				&river.PeriodicJobOpts{RunOnStart: true}),
			river.NewPeriodicJob(river.PeriodicInterval(time.Hour),
				func() (river.JobArgs, *river.InsertOpts) {
					return MeteringArgs{}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: time.Hour}}
				}, &river.PeriodicJobOpts{RunOnStart: true}),
			river.NewPeriodicJob(river.PeriodicInterval(7*24*time.Hour),
				func() (river.JobArgs, *river.InsertOpts) {
					return WeeklyReportArgs{}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: 24 * time.Hour}}
				}, nil),
			// Hourly, a few minutes past the hour, so late exit reports of
			// the hour are in.
			river.NewPeriodicJob(river.PeriodicInterval(time.Hour),
				func() (river.JobArgs, *river.InsertOpts) {
					return BillingRollupArgs{}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: time.Hour}}
				}, &river.PeriodicJobOpts{RunOnStart: true}),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("creating River client: %w", err)
	}
	if cfg.Engine != nil {
		every := cfg.EngineInterval
		if every <= 0 {
			every = DefaultEngineInterval
		}
		client.PeriodicJobs().Add(river.NewPeriodicJob(river.PeriodicInterval(every),
			func() (river.JobArgs, *river.InsertOpts) { return EngineSyncArgs{}, engineSyncOpts() },
			&river.PeriodicJobOpts{RunOnStart: true}))
	}
	if cfg.Burst.Provider != nil {
		every := burster.Config.Interval
		client.PeriodicJobs().Add(river.NewPeriodicJob(river.PeriodicInterval(every),
			func() (river.JobArgs, *river.InsertOpts) {
				return BurstEvaluateArgs{}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: every}}
			}, nil))
	}
	return client, nil
}

// RiverLogger is the logger River itself gets from log: River's records
// at warn and above and its reports of failed jobs (which River logs at
// info; they come out as warnings), and all of River's lines once log is
// at debug. River reports its routine work (job counts, maintenance runs)
// at info every few seconds, which would drown Allot's own lines.
func RiverLogger(log *slog.Logger) *slog.Logger {
	return slog.New(riverHandler{log.Handler()})
}

type riverHandler struct{ h slog.Handler }

func (r riverHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return r.h.Enabled(ctx, l)
}

func (r riverHandler) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Level < slog.LevelWarn && !r.h.Enabled(ctx, slog.LevelDebug) {
		if !strings.Contains(rec.Message, ": Job errored") && !strings.Contains(rec.Message, ": Job panicked") {
			return nil
		}
		rec.Level = slog.LevelWarn
	}
	return r.h.Handle(ctx, rec)
}

func (r riverHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return riverHandler{r.h.WithAttrs(as)}
}

func (r riverHandler) WithGroup(name string) slog.Handler {
	return riverHandler{r.h.WithGroup(name)}
}

// NewInserter returns an insert-only River client, for processes (servers)
// that request work without running it.
func NewInserter(pool *pgxpool.Pool) (*river.Client[pgx.Tx], error) {
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return nil, fmt.Errorf("creating River client: %w", err)
	}
	return c, nil
}
