package store

import (
	"context"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// MetricsState is what the worker's /metrics reports of the cluster's live
// state (metric.State turns it into gauges). Each part is one GROUP BY
// query (or a small table read), cheap enough to run at scrape time even
// at 50k pending jobs × 10k nodes; metric.State caches it for a few
// seconds.
type MetricsState struct {
	Now       time.Time
	Policy    allot.Policy
	LastCycle time.Time // start of the newest recorded scheduling cycle (zero: none)
	Jobs      []JobCount
	Allocated []GPUCount // GPUs in active allocations, by the node's type and site
	Nodes     []NodeStatus
	// BurstNodes are burst nodes not yet released.
	BurstNodes int
	Budgets    []TeamBudgetUse
	Shares     []TeamShareInput // loaded only while CycleShares has none
	// CycleShares are the fair-share factors the last scheduling cycle
	// computed (what it ordered the queue by); none before the first.
	CycleShares CycleShares
	River       []RiverCount
	// Engine is the last word from an external engine (Slurm); nil when
	// none is configured.
	Engine *EngineSyncState
}

// JobCount is the pending or running jobs of one tier × team × GPU type
// (GPUType "" = any type).
type JobCount struct {
	State      allot.JobState
	Tier       allot.TierID // the tier submitted in
	Team       string
	GPUType    string
	Jobs       int
	GPUSeconds int64 // Σ GPUs × time limit
}

// GPUCount is a number of GPUs of one type at one site.
type GPUCount struct {
	GPUType, Site string
	GPUs          int
}

// NodeStatus is one node's state for metrics.
type NodeStatus struct {
	Name, GPUType, Site, State string
	GPUs                       int
	// Lost: down because its heartbeats stopped (LostNodes), not by an
	// admin or a health rule.
	Lost bool
}

// TeamBudgetUse is a team's monthly budget and its usage this month so far.
type TeamBudgetUse struct {
	Team           string
	BudgetGPUHours int64
	UsedGPUSeconds int64
}

// RiverCount is the number of River jobs of one queue in one state.
type RiverCount struct {
	Queue, State string
	Jobs         int
}

// MetricsState reads the live state for /metrics at s.Now(), in one
// read-only REPEATABLE READ transaction: one connection for all of it, and
// one snapshot, so that running jobs and allocated GPUs agree.
func (s *Store) MetricsState(ctx context.Context) (MetricsState, error) {
	var m MetricsState
	err := s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY`); err != nil {
			return mapErr("starting the metrics read", err)
		}
		var err error
		m, err = tx.metricsState(ctx)
		return err
	})
	return m, err
}

func (s *Store) metricsState(ctx context.Context) (MetricsState, error) {
	m := MetricsState{Now: s.Now()}
	var err error
	if m.Policy, err = s.CurrentPolicy(ctx); err != nil {
		return m, err
	}
	if m.LastCycle, err = s.LastCycleAt(ctx); err != nil {
		return m, err
	}
	rows, err := s.db.Query(ctx, `
		SELECT state, tier, team, coalesce(gpu_type, ''), count(*), sum(gpus::bigint * time_limit_s)::bigint
		FROM jobs WHERE state IN ('pending', 'running') GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4`)
	if m.Jobs, err = collect(rows, err, "counting jobs for metrics", func(r pgx.CollectableRow) (JobCount, error) {
		var c JobCount
		return c, r.Scan(&c.State, &c.Tier, &c.Team, &c.GPUType, &c.Jobs, &c.GPUSeconds)
	}); err != nil {
		return m, err
	}
	rows, err = s.db.Query(ctx, `
		SELECT n.gpu_type, n.site, count(*) FROM allocations a JOIN nodes n ON n.name = a.node
		WHERE a.released_at IS NULL GROUP BY 1, 2 ORDER BY 1, 2`)
	if m.Allocated, err = collect(rows, err, "counting allocated GPUs for metrics", func(r pgx.CollectableRow) (GPUCount, error) {
		var c GPUCount
		return c, r.Scan(&c.GPUType, &c.Site, &c.GPUs)
	}); err != nil {
		return m, err
	}
	rows, err = s.db.Query(ctx, `
		SELECT name, gpu_type, site, gpu_count, state, state = 'down' AND state_reason LIKE 'no heartbeat since %'
		FROM nodes ORDER BY name`)
	if m.Nodes, err = collect(rows, err, "listing nodes for metrics", func(r pgx.CollectableRow) (NodeStatus, error) {
		var n NodeStatus
		return n, r.Scan(&n.Name, &n.GPUType, &n.Site, &n.GPUs, &n.State, &n.Lost)
	}); err != nil {
		return m, err
	}
	if err := s.db.QueryRow(ctx, `SELECT count(*) FROM burst_nodes WHERE released_at IS NULL`).Scan(&m.BurstNodes); err != nil {
		return m, mapErr("counting burst nodes for metrics", err)
	}
	budgets := map[string]int64{}
	rows, err = s.db.Query(ctx, `SELECT slug, monthly_budget_gpu_hours FROM teams WHERE monthly_budget_gpu_hours > 0 ORDER BY slug`)
	if m.Budgets, err = collect(rows, err, "listing budgets for metrics", func(r pgx.CollectableRow) (TeamBudgetUse, error) {
		var b TeamBudgetUse
		err := r.Scan(&b.Team, &b.BudgetGPUHours)
		budgets[b.Team] = b.BudgetGPUHours
		return b, err
	}); err != nil {
		return m, err
	}
	if len(m.Budgets) > 0 {
		// The scheduler's own measure of this month's usage (LoadSchedState).
		used := map[string]int64{}
		rows, err := s.db.Query(ctx, usageSQL("$1", "$2", "j.team = ANY($3)", true), MonthStart(m.Now), m.Now, mapKeys(budgets))
		if err != nil {
			return m, mapErr("this month's usage for metrics", err)
		}
		var team string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&team, &n}, func() error { used[team] = n; return nil }); err != nil {
			return m, mapErr("this month's usage for metrics", err)
		}
		for i := range m.Budgets {
			m.Budgets[i].UsedGPUSeconds = used[m.Budgets[i].Team]
		}
	}
	if m.CycleShares, err = s.LastShares(ctx); err != nil {
		return m, err
	}
	if m.CycleShares.CycleID == 0 { // before the first cycle: computed from the inputs
		if m.Shares, err = s.TeamShareInputs(ctx); err != nil {
			return m, err
		}
	}
	rows, err = s.db.Query(ctx, `SELECT queue, state::text, count(*) FROM river_job GROUP BY 1, 2 ORDER BY 1, 2`)
	if m.River, err = collect(rows, err, "counting River jobs for metrics", func(r pgx.CollectableRow) (RiverCount, error) {
		var c RiverCount
		return c, r.Scan(&c.Queue, &c.State, &c.Jobs)
	}); err != nil {
		return m, err
	}
	sync, err := s.EngineSync(ctx)
	if err != nil {
		return m, err
	}
	if !sync.LastOK.IsZero() || !sync.LastErrorAt.IsZero() {
		m.Engine = &sync
	}
	return m, nil
}

func collect[T any](rows pgx.Rows, err error, what string, f pgx.RowToFunc[T]) ([]T, error) {
	if err != nil {
		return nil, mapErr(what, err)
	}
	out, err := pgx.CollectRows(rows, f)
	return out, mapErr(what, err)
}

// collectMap reads rows of two columns, a key and its value, into a map.
func collectMap[K comparable, V any](rows pgx.Rows, err error, what string) (map[K]V, error) {
	if err != nil {
		return nil, mapErr(what, err)
	}
	out := map[K]V{}
	var k K
	var v V
	_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = v; return nil })
	return out, mapErr(what, err)
}

func mapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
