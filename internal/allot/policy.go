package allot

import "time"

// Policy is one version of the cluster-wide scheduling and budget policy.
// A change creates a new version; old versions are kept.
type Policy struct {
	Version   int64
	CreatedAt time.Time
	CreatedBy string // email of the admin, or "system"
	Comment   string

	// QueueOrder orders the pending jobs inside a class (a tier):
	// QueueOrderResponse (the default) or QueueOrderMultifactor.
	QueueOrder string
	// Tier1FIFO (default true) serves tier-1 (incident) jobs oldest first,
	// by submission time, whatever their priority, and a tier-1 job whose
	// victims are in their grace period keeps its turn (the GPUs they free
	// go to it, not to a younger tier-1 job); false orders tier 1 by
	// priority like the other classes (scheduler.Policy.Tier1FIFO). JSON
	// (store.PolicyValues): tier1_fifo.
	Tier1FIFO       bool
	WeightFairShare int // W_fs, default 10000
	WeightSize      int // W_size, default 1000
	WeightAge       int // W_age, default 500
	// MaxAge is the wait at which the age factor reaches 1 (7 days).
	MaxAge time.Duration
	// HalfLife is the fair-share usage decay half-life (7 days).
	HalfLife time.Duration
	// GracePeriod is the time between SIGTERM and SIGKILL on preemption.
	GracePeriod time.Duration
	// MinRuntime protects a job from preemption right after it starts.
	MinRuntime time.Duration
	// Cycle is the period of the scheduling cycle: a cycle runs once Cycle
	// has passed since the last one (submits, finishes, cancels and node
	// changes also run one at once, and restart the period).
	Cycle time.Duration
	// Budget alert thresholds in percent (80, 100).
	BudgetWarnPct   int
	BudgetDemotePct int
	// Cloud burst thresholds.
	BurstPendingGPUHours int
	BurstMeanWait        time.Duration
	BurstReleaseGPUHours int
	// HeartbeatMissedAfter is how long a node may send no heartbeat before
	// it is marked down (see LostAfter).
	HeartbeatMissedAfter time.Duration
	// BurstMaxNodes caps the burst nodes alive at once; 0 disables burst.
	BurstMaxNodes int
	// BurstMonthlyBudget caps a month's burst spend (0 = no cap).
	BurstMonthlyBudget Money
	// HealthRules are the node health rules (DefaultHealthRules when new).
	HealthRules []HealthRule
	// AutoUndrainAfter undrains a node drained by a health rule once it has
	// passed its checks this long (0 = never: an admin undrains).
	AutoUndrainAfter time.Duration
	// MaxLossRequeues is how many times a checkpointable job goes back to
	// the queue after losing its node or its process before the next such
	// loss fails it (0: no limit). JSON (store.PolicyValues):
	// max_loss_requeues.
	MaxLossRequeues int
}

// MaxLossRequeuesLimit bounds Policy.MaxLossRequeues.
const MaxLossRequeuesLimit = 1000

// DefaultPolicy returns DESIGN.md's defaults as version 0 (not yet stored).
func DefaultPolicy() Policy {
	return Policy{
		CreatedBy:            "system",
		Comment:              "defaults from DESIGN.md",
		QueueOrder:           QueueOrderResponse,
		Tier1FIFO:            true,
		WeightFairShare:      10000,
		WeightSize:           1000,
		WeightAge:            500,
		MaxAge:               7 * 24 * time.Hour,
		HalfLife:             7 * 24 * time.Hour,
		GracePeriod:          120 * time.Second,
		MinRuntime:           10 * time.Minute,
		Cycle:                10 * time.Second,
		BudgetWarnPct:        80,
		BudgetDemotePct:      100,
		BurstPendingGPUHours: 50,
		BurstMeanWait:        2 * time.Hour,
		BurstReleaseGPUHours: 20,
		HeartbeatMissedAfter: 60 * time.Second,
		MaxLossRequeues:      5,
		BurstMaxNodes:        4,
		HealthRules:          DefaultHealthRules(),
	}
}

// The queue orders (Policy.QueueOrder). Tier order comes first in both.
const (
	// QueueOrderResponse orders a class by response ratio
	// (wait + T) / T, T the job's time limit, times the team's fair-share
	// multiplier max(2F, 1/32): short jobs first, every job aging past
	// newer ones once it has waited about its own length, teams above
	// their share later. It beat EASY backfill on every loaded replay of
	// the simulator's suite (internal/scheduler/sim/RESULTS.md).
	QueueOrderResponse = "response"
	// QueueOrderMultifactor is Slurm's multifactor form:
	// W_fs·F + W_size·S + W_age·A, with the 20-minute starvation guard.
	QueueOrderMultifactor = "multifactor"
)

// LostAfter is how long a node whose agent heartbeats every interval may
// be silent before it is marked down: HeartbeatMissedAfter, but never less
// than two intervals (a shorter setting would mark every healthy node down
// between two heartbeats, failing its jobs).
func (p *Policy) LostAfter(interval time.Duration) time.Duration {
	return max(p.HeartbeatMissedAfter, 2*interval)
}

// Validate checks the policy's values.
func (p *Policy) Validate() error {
	f := FieldErrors{}
	if p.QueueOrder != QueueOrderResponse && p.QueueOrder != QueueOrderMultifactor {
		f.Add("queue_order", "%q: must be %q (shortest expected wait first, aged, times fair share) or %q (Slurm's weights × factors)",
			p.QueueOrder, QueueOrderResponse, QueueOrderMultifactor)
	}
	for name, w := range map[string]int{"weight_fair_share": p.WeightFairShare, "weight_size": p.WeightSize, "weight_age": p.WeightAge} {
		if w < 0 || w > 1_000_000 {
			f.Add(name, "must be between 0 and 1000000")
		}
	}
	pos := func(name string, d time.Duration) {
		if d <= 0 {
			f.Add(name, "must be positive")
		}
	}
	pos("max_age_s", p.MaxAge)
	pos("half_life_s", p.HalfLife)
	pos("cycle_s", p.Cycle)
	pos("heartbeat_missed_after_s", p.HeartbeatMissedAfter)
	pos("burst_mean_wait_s", p.BurstMeanWait)
	if p.GracePeriod < 0 {
		f.Add("grace_period_s", "must not be negative")
	}
	if p.MinRuntime < 0 {
		f.Add("min_runtime_s", "must not be negative")
	}
	if p.BudgetWarnPct <= 0 || p.BudgetWarnPct > p.BudgetDemotePct {
		f.Add("budget_warn_pct", "must be positive and at most the demotion threshold")
	}
	if p.BudgetDemotePct <= 0 || p.BudgetDemotePct > MaxPct {
		f.Add("budget_demote_pct", "must be between 1 and %d", MaxPct)
	}
	if p.BurstMaxNodes < 0 || p.BurstMaxNodes > MaxBurstNodes {
		f.Add("burst_max_nodes", "must be between 0 and %d", MaxBurstNodes)
	}
	if p.BurstPendingGPUHours > MaxGPUHours {
		f.Add("burst_pending_gpu_hours", "must be at most %d", MaxGPUHours)
	}
	if p.BurstMonthlyBudget.Micros < 0 {
		f.Add("burst_monthly_budget", "must not be negative")
	}
	if p.AutoUndrainAfter < 0 {
		f.Add("auto_undrain_after_s", "must not be negative")
	}
	if p.MaxLossRequeues < 0 || p.MaxLossRequeues > MaxLossRequeuesLimit {
		f.Add("max_loss_requeues", "must be between 0 (no limit) and %d", MaxLossRequeuesLimit)
	}
	if p.BurstReleaseGPUHours < 0 || p.BurstReleaseGPUHours >= p.BurstPendingGPUHours {
		f.Add("burst_release_gpu_hours", "must be at least 0 and below the burst threshold")
	}
	return f.Err()
}
