package metric

import (
	"context"
	"sync"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/scheduler"
	"github.com/allotlabs/allot/internal/store"
	"github.com/prometheus/client_golang/prometheus"
)

// State exports the cluster's live state from PostgreSQL at scrape time:
// queue, GPUs, nodes, budgets, fair share, the last cycle, River's queue.
// One scrape runs a handful of GROUP BY queries (store.MetricsState) under
// Timeout; the result is kept for TTL, so that many scrapers (or several
// Prometheus replicas) cost PostgreSQL one read per TTL, and concurrent
// scrapes wait for the one read in progress instead of starting their own.
//
// Every worker exports the same values (they all read the same database):
// dashboards and alerts aggregate with max without(instance).
type State struct {
	Store   *store.Store
	TTL     time.Duration // default 5 s
	Timeout time.Duration // default 3 s

	mu   sync.Mutex
	last store.MetricsState
	at   time.Time // wall clock of last; zero: none yet
	errs float64   // failed reads

	pending, pendingGPUH, running, allocated, total, nodeState, nodesLost, burstNodes, burstThreshold,
	budget, fairShare, lastCycle, period, river, stateErrors, engineUp, engineSync, engineUnmapped *prometheus.Desc
}

// NewState returns the collector over st.
func NewState(st *store.Store) *State {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	const live = " Read from PostgreSQL at scrape time (cached a few seconds); every worker exports the same value."
	q := []string{"tier", "team", "gpu_type"}
	return &State{Store: st,
		pending:     d("allot_pending_jobs", "Pending jobs by the tier submitted in, team and GPU type asked for (gpu_type=\"any\": none asked)."+live, q...),
		pendingGPUH: d("allot_pending_gpu_hours", "Pending work: Σ GPUs × time limit of pending jobs, in GPU-hours, by tier, team and GPU type."+live, q...),
		running:     d("allot_running_jobs", "Running jobs by the tier submitted in, team and GPU type asked for (gpu_type=\"any\": none asked)."+live, q...),
		allocated:   d("allot_allocated_gpus", "GPUs in active allocations (jobs running or still stopping), by the node's GPU type and site."+live, "gpu_type", "site"),
		total:       d("allot_total_gpus", "GPUs of registered nodes by GPU type, site and node state (up, draining, drained, down)."+live, "gpu_type", "site", "state"),
		nodeState:   d("allot_node_state", "1 for each node's current state (up, draining, drained, down); only the current state has a series, so count by (state) counts nodes."+live, "node", "state"),
		nodesLost:   d("allot_nodes_lost", "Nodes down because their heartbeats stopped (not drained by an admin or a health rule)."+live),
		burstNodes:  d("allot_burst_nodes", "Cloud burst nodes provisioned and not yet released."+live),
		burstThreshold: d("allot_burst_threshold_gpu_hours",
			"The policy's burst trigger: pending GPU-hours (of jobs burst nodes could run) over which, with the mean wait over its threshold, burst nodes are requested. Absent when the policy sets none."+live),
		budget:    d("allot_team_budget_used_ratio", "A team's GPU-hours allocated this month so far / its monthly GPU-hour budget (1 = at budget). Absent for teams without a budget."+live, "team"),
		fairShare: d("allot_team_fair_share", "A team's fair-share factor F = 2^(-U/S) as the scheduler computes it (0..1; 1 = used nothing of its share)."+live, "team"),
		lastCycle: d("allot_scheduling_last_cycle_timestamp_seconds",
			"Unix time (Allot's clock) at which the newest recorded scheduling cycle of any worker started. Absent before the first cycle."+live),
		period:   d("allot_scheduling_period_seconds", "The policy's scheduling period (cycle), in seconds: a cycle runs at least this often, and at once on submits, finishes and node changes."+live),
		river:    d("allot_river_jobs", "River jobs by queue and state (available, scheduled, running, retryable, completed, discarded, cancelled, pending), from the river_job table."+live, "queue", "state"),
		engineUp: d("allot_engine_up", "1 while the external engine (Slurm) answered the worker's last sync, 0 while it does not; absent without one."+live, "engine"),
		engineSync: d("allot_engine_last_sync_timestamp_seconds",
			"Unix time (Allot's clock) of the last sync with the external engine (Slurm) that worked."+live, "engine"),
		engineUnmapped: d("allot_engine_unmapped_records", "Engine records the last sync could not map to Allot (an account that is no team, a node of no GPU type)."+live, "engine"),
		stateErrors: d("allot_metrics_state_errors_total",
			"Scrapes whose read of the live state from PostgreSQL failed (their DB-derived series are missing)."),
	}
}

// Describe implements prometheus.Collector.
func (c *State) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.pendingGPUH, c.running, c.allocated, c.total, c.nodeState, c.nodesLost, c.burstNodes,
		c.burstThreshold, c.budget, c.fairShare, c.lastCycle, c.period, c.river, c.stateErrors, c.engineUp, c.engineSync, c.engineUnmapped} {
		ch <- d
	}
}

// read returns the cached state, or reads it when older than TTL.
func (c *State) read() (store.MetricsState, float64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ttl, timeout := c.TTL, c.Timeout
	if ttl <= 0 {
		ttl = 5 * time.Second
	}
	if timeout <= 0 {
		timeout = 3 * time.Second
	}
	if !c.at.IsZero() && time.Since(c.at) < ttl {
		return c.last, c.errs, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s, err := c.Store.MetricsState(ctx)
	if err != nil {
		c.errs++
		return s, c.errs, err
	}
	c.last, c.at = s, time.Now()
	return s, c.errs, nil
}

// Collect implements prometheus.Collector.
func (c *State) Collect(ch chan<- prometheus.Metric) {
	s, n, err := c.read()
	ch <- prometheus.MustNewConstMetric(c.stateErrors, prometheus.CounterValue, n)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.pending, err)
		return
	}
	g := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	for _, j := range s.Jobs {
		typ := j.GPUType
		if typ == "" {
			typ = "any"
		}
		switch j.State {
		case allot.JobPending:
			g(c.pending, float64(j.Jobs), string(j.Tier), j.Team, typ)
			g(c.pendingGPUH, float64(j.GPUSeconds)/3600, string(j.Tier), j.Team, typ)
		case allot.JobRunning:
			g(c.running, float64(j.Jobs), string(j.Tier), j.Team, typ)
		}
	}
	for _, a := range s.Allocated {
		g(c.allocated, float64(a.GPUs), a.GPUType, a.Site)
	}
	type key struct{ typ, site, state string }
	total := map[key]int{}
	lost := 0
	for _, n := range s.Nodes {
		total[key{n.GPUType, n.Site, n.State}] += n.GPUs
		g(c.nodeState, 1, n.Name, n.State)
		if n.Lost {
			lost++
		}
	}
	for k, v := range total {
		g(c.total, float64(v), k.typ, k.site, k.state)
	}
	g(c.nodesLost, float64(lost))
	g(c.burstNodes, float64(s.BurstNodes))
	if s.Policy.BurstPendingGPUHours > 0 {
		g(c.burstThreshold, float64(s.Policy.BurstPendingGPUHours))
	}
	for _, b := range s.Budgets {
		g(c.budget, float64(b.UsedGPUSeconds)/float64(b.BudgetGPUHours*3600), b.Team)
	}
	// The last cycle's factors (what it ordered the queue by, as the
	// fair-share table shows them); before the first cycle, computed by
	// the scheduler core from the same inputs.
	shares := FairShares(s.Shares, s.Now)
	if s.CycleShares.CycleID != 0 {
		shares = map[string]float64{}
		for team, sh := range s.CycleShares.Teams {
			shares[team] = sh.FairShare
		}
	}
	for team, f := range shares {
		g(c.fairShare, f, team)
	}
	if !s.LastCycle.IsZero() {
		g(c.lastCycle, float64(s.LastCycle.UnixNano())/1e9)
	}
	g(c.period, s.Policy.Cycle.Seconds())
	for _, r := range s.River {
		g(c.river, float64(r.Jobs), r.Queue, r.State)
	}
	if e := s.Engine; e != nil {
		up := 1.0
		if !e.DownSince.IsZero() {
			up = 0
		}
		g(c.engineUp, up, allot.BackendSlurm)
		if !e.LastOK.IsZero() {
			g(c.engineSync, float64(e.LastOK.UnixNano())/1e9, allot.BackendSlurm)
		}
		n := 0
		for _, v := range e.Unmapped {
			n += v
		}
		g(c.engineUnmapped, float64(n), allot.BackendSlurm)
	}
}

// FairShares computes every team's fair-share factor with the scheduler
// core, from the same inputs the cycle uses (weights and decayed usage).
func FairShares(in []store.TeamShareInput, now time.Time) map[string]float64 {
	snap := scheduler.Snapshot{}
	for _, t := range in {
		snap.Teams = append(snap.Teams, scheduler.Team{Name: t.Team, Weight: float64(t.Weight), Usage: t.UsageGPUSec})
	}
	out := map[string]float64{}
	for _, sh := range scheduler.Schedule(snap, now, scheduler.Policy{}).Shares {
		out[sh.Team] = sh.FairShare
	}
	return out
}
