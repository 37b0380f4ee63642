// Package scheduler is Allot's pure scheduling core: a snapshot of the
// cluster, the queue, usage and policy goes in, a Plan comes out. It does no
// I/O, never reads the wall clock and uses no global randomness; the same code
// runs in the live worker and in the trace simulator (package sim). The
// output depends only on the input's content: Pending, Running and Teams may
// come in any order; node indices are identities.
//
// # ModeAllot, one cycle
//
//  1. Effective class: tier 1 > 2 > 3 > 4 > preemptible. Job.Preemptible, or
//     a tier 3-4 job of a Team.OverBudget team, runs as TierPreemptible.
//     Tier 1 is served oldest first (Policy.Tier1FIFO, the default), its
//     preemptors waiting for their victims' grace in that turn.
//  2. Priority inside a class, Slurm's multifactor form:
//     WeightFairShare·F + WeightSize·S + WeightAge·A with F = 2^(-U/S_t)
//     (classic fair share; U = the team's share of all decayed usage, S_t =
//     Weight / ΣWeight), S = GPUs / cluster GPUs, A = wait / MaxAge capped at 1.
//     Classic rather than Fair Tree: teams are one flat level (no accounts
//     with users below them), where Fair Tree's advantage — isolating
//     siblings' users — does not apply; the classic factor is a continuous
//     number per team that sshare-like output (Plan.Shares) can show and
//     that people can reason about ("used 3× its share → F = 1/8").
//     Pending order: class, priority (desc), submit time, job id.
//     That is OrderMultifactor, the live loop's order. The default,
//     OrderResponse, replaces the priority inside a class with the
//     response ratio (wait + T) / T (T: Job.Estimate, else the time limit)
//     times the team's fair share 2F (floor 1/32): short jobs first,
//     continuous aging instead of the starvation guard (a fresh job is at
//     ratio 1, so every waiting job passes it once it has waited long
//     enough for its length), and teams above their share wait longer.
//     (Policy.WideAging, off by default, ages multi-node gangs per node;
//     Policy.TeamWaitBoost, off, raises the priority of teams whose
//     pending jobs waited longer than the cluster's on average, and
//     Policy.StarvedTeamPreempt, off, lets a team at 3× that preempt.)
//     With it StarvationWait defaults to 0 (the guard serves jobs older
//     than 20 minutes FIFO, which on a loaded cluster is almost the whole
//     queue: allot became FIFO + EASY with worse backfill).
//     Guarantees that add up to more than the cluster's GPUs are scaled
//     to their proportional parts of it (Policy.RawGuarantees keeps
//     them): otherwise no team is ever above its guarantee and tier-2
//     jobs find no victim.
//  3. Placement, gang (all or nothing): a job that fits on one node goes on
//     one node: partly used nodes before wholly free ones, then the node
//     whose busy period it extends least (how much later than the node's
//     last running job it would reach its time limit), then the fewest free
//     GPUs that still fit (best fit), then the lowest node index. Wide jobs
//     wait for wholly free nodes, and long jobs scattered over every node
//     keep every node busy for days; so long jobs join long jobs and short
//     ones fill gaps on nodes that stay busy anyway. (At most 256 candidate
//     nodes are scored per placement, visited in best-fit order.) The
//     baselines keep the reference's plain best fit. A larger job takes
//     whole free nodes of one interconnect domain (or, with GPUsPerNode, that many GPUs
//     on each of ceil(GPUs/GPUsPerNode) nodes): the domain with the least
//     sufficient free capacity, then the lowest index; nodes in index
//     order. GPU indices: the lowest free ones. GPUType must match when set;
//     production classes only use on-premise nodes. Nodes that are not up
//     take nothing new; Domain "" is one flat domain.
//  4. Reservations (EASY backfill, by time limits): the first
//     ReservationDepth blocked jobs of each class get a reservation at the
//     earliest time they fit, on specific nodes. A later job starts now
//     only if it does not take GPUs a reservation counts on at its time
//     (jobs ending before then may use them). The projection frees running
//     jobs at Start+TimeLimit (terminating ones at GraceEnd) and holds
//     earlier reservations from now until their projected end
//     (conservative). Policy.PredictedBackfill (off by default) uses
//     predicted run times (Job.Predicted) instead of time limits here.
//     Starvation guard: tier 3-4 jobs that have waited StarvationWait
//     (default 20 min) are served right after the production classes and
//     before every other research job, oldest first (submit time, id): each
//     starts if it fits, else may preempt under its rights (step 5), else
//     the first 8 blocked ones reserve the earliest nodes they fit on. This
//     bounds every research job's wait by StarvationWait plus a FIFO queue
//     — a wide job of a low-priority team is no longer passed forever by
//     newer, higher-priority jobs — while class order and fair share decide
//     everything younger. Tier 1 > 2 > 3 > 4 still holds for jobs of equal
//     age: the guard only reorders research jobs that have all waited
//     StarvationWait, by age. A reservation made after the other research
//     jobs were placed would constrain nothing, as each cycle starts afresh.
//  5. Preemption: a blocked tier-1 job may take preemptible work, tier 3-4
//     work of teams above their guarantee, then any tier 3-4 work; a tier-2
//     job the first two; a tier 3-4 job of a team under its guarantee that
//     has waited GuaranteePatience the first two, in its own class or below.
//     Never tier 1-2, never jobs younger than MinRuntime, never terminating
//     jobs. A job that will fit within one GracePeriod anyway (GPUs coming
//     free from earlier preemptions) only reserves. Victims on a node are
//     taken in order: victim group, lowest class, least work lost (run time
//     since the last checkpoint × GPUs), lowest priority, fewest GPUs, id;
//     among nodes (or domains) the set with the best (worst group, work
//     lost, GPUs freed, victims, index) wins. Work lost comes before
//     priority: on a replayed trace, killing long-running jobs of a low
//     priority team wasted a third of the cluster. A team reclaiming its
//     guarantee (not tier 1-2) preempts only if the work lost (preemptible
//     victims' work does not count) is at most 3 % of the GPU time the
//     job would otherwise wait by time limits (guaranteeLostRatio).
//     While a starving job is blocked, only starving jobs reclaim
//     guarantees, and a research preemptor takes no whole-node victim that
//     would come before it when requeued (submitted before a starving
//     preemptor, or starving by the end of the grace period): that victim
//     would take the freed node back and the preemptor would preempt again.
//     The preemptor then
//     reserves the GPUs coming free; in later cycles, Job.PreemptedBy lets
//     it claim them before anyone else.
//
// Guarantees are compared in total GPUs (Team.Guarantee summed over types).
//
// # Baselines
//
// ModeFIFO, ModeEASY and ModeFIFOPartitioned ignore tiers, sites and
// priorities and follow the simulator's reference rules: order by (Submit,
// ID); one node best fit for jobs up to a node, else whole free nodes
// lowest index first (one domain when domains are set). FIFO blocks at the
// first job that does not fit; EASY reserves for that head job at the
// earliest time enough GPUs (counted cluster-wide) reach their time limits
// and backfills jobs that end by then or fit in the GPUs left over;
// FIFO-partitioned gives each team (in name order) the lowest-index nodes
// covering its guarantee and runs strict FIFO per team within it.
//
// # Cost
//
// A cycle is O(nodes + running + pending·log pending) plus, for each
// reservation, a projection of O(nodes + running). Free capacity is
// indexed by free-GPU count per (GPU type, site) pool, so a placement is
// O(pools × GPUs per node + nodes held by reservations) for the baselines
// and at most O(256 + nodes held by reservations) for ModeAllot's packing;
// the starvation guard sorts the starving jobs once, O(n log n). Work is bounded
// per cycle: at most 8 blocked jobs look for victims, and beyond the
// reservations only the first 16 blocked jobs get a detailed reason; the
// rest get a generic one. Policy.NoPendingInfo skips Pending and Shares
// altogether, or computes Pending only for Policy.EstimateFor (the
// simulator does, for its ETA measurement).
//
// # Start estimates
//
// PendingInfo.EstStart is, by default (ETAForecast), a forecast: the
// blocked jobs take GPUs in the order the cycle served them, each at the
// earliest time enough GPUs it may use are free, running jobs ending at
// their expected run time (Job.Expected, else Estimate, else the time
// limit), with idle gaps before a job ahead usable by shorter jobs
// (backfill); a tier-1/2 job that may preempt is expected when its victims
// pass MinRuntime, plus the grace period. It covers the first 256 blocked
// jobs (O(nodes) each; Policy.EstimateFor: the first 512). PendingInfo.EstStartLimits
// keeps the earlier estimate (reservation time, or the earliest fit by
// time limits ignoring jobs ahead; ETALimits makes it EstStart).
// Snapshots from the same caller reuse the node topology of the previous
// cycle when the nodes are equal (Snapshot.NodesSame skips even the
// comparison).
package scheduler

import "time"

// Tier is a job's class. Lower values are more important; class order beats
// every other priority factor.
type Tier int

const (
	Tier1           Tier = 1 // production incident retraining
	Tier2           Tier = 2 // scheduled production retraining
	Tier3           Tier = 3 // experiment development / validation
	Tier4           Tier = 4 // exploratory research, sweeps
	TierPreemptible Tier = 5 // explicit, or demoted by budget
)

// Production reports whether t is a production tier (1 or 2): pinned to
// on-premise nodes, never a preemption victim, never demoted.
func (t Tier) Production() bool { return t == Tier1 || t == Tier2 }

// Research reports whether t is a research tier (3 or 4).
func (t Tier) Research() bool { return t == Tier3 || t == Tier4 }

// NodeState mirrors the node states of the domain.
type NodeState string

const (
	NodeUp       NodeState = "up"
	NodeDraining NodeState = "draining" // running jobs continue, nothing new starts
	NodeDrained  NodeState = "drained"
	NodeDown     NodeState = "down"
)

// Site values for Node.Site.
const (
	SiteOnPrem = "onprem"
	SiteCloud  = "cloud"
)

// Node is one GPU machine. Which of its GPUs are in use is derived from the
// Placement of the snapshot's running jobs; Unavailable lists GPU indices that
// must not be allocated for other reasons (a failed GPU).
type Node struct {
	Name    string
	GPUType string
	GPUs    int    // GPUs on the node, indices 0..GPUs-1
	Site    string // SiteOnPrem or SiteCloud; "" counts as SiteOnPrem
	// Domain is the interconnect domain (NVLink/IB). Multi-node jobs take
	// whole nodes of one domain. "" means "no topology information": all
	// nodes with Domain "" (of one GPU type and site) form one flat domain.
	Domain      string
	State       NodeState // "" counts as NodeUp
	Unavailable []int
}

// Slot is the part of a job's gang on one node.
type Slot struct {
	Node int   // index into Snapshot.Nodes
	GPUs []int // GPU indices on that node, ascending
}

// Job is a pending or running job as the scheduler sees it.
type Job struct {
	ID          int64 // unique and stable; the last tie-breaker everywhere
	Name        string
	Team        string
	User        string
	Tier        Tier // as submitted (1..4 or TierPreemptible)
	GPUs        int
	GPUType     string // "" = any type
	GPUsPerNode int    // 0 = scheduler decides
	TimeLimit   time.Duration
	Submit      time.Time // original submit time (kept across preemption/requeue)
	// Estimate is the expected run time (e.g. learned from the team's
	// history of run time against time limit); 0 = unknown. It orders the
	// queue under OrderResponse; reservations still use TimeLimit.
	Estimate time.Duration
	// Expected is the expected run time used only by the start forecast
	// (PendingInfo.EstStart): running jobs are projected to end at
	// Start+Expected, pending ones to run that long. 0 falls back to
	// Estimate, then to TimeLimit. It never changes a scheduling decision,
	// so a caller can fill it (the simulator learns it from each user's
	// and team's history) without changing the order.
	Expected time.Duration
	// Predicted is the run time reservations and backfill assume under
	// Policy.PredictedBackfill (ModeAllot), e.g. the user's recent run
	// time / time limit ratio × this job's limit; capped at TimeLimit; 0 =
	// none (the time limit). A running job past it is predicted to run
	// twice as long, again as needed, at most its limit. Nothing else
	// reads it.
	Predicted      time.Duration
	Preemptible    bool // runs as preemptible (explicit, or demoted at submission)
	Checkpointable bool

	// Reserved: the previous cycle gave this pending job a reservation
	// (Plan.Reservations). Under Policy.HoldReservations it keeps its
	// place at the head of its class until it starts, so that the nodes
	// drained for it are not given to a job that overtook it meanwhile.
	Reserved bool

	// Running jobs only.
	Start          time.Time
	LastCheckpoint time.Time // zero if none
	Placement      []Slot
	RunAs          Tier // effective class it was started in (TierPreemptible if demoted)
	// Terminating is set once a preemption has been issued and the job is in
	// its grace period; its GPUs are still held until GraceEnd.
	Terminating bool
	GraceEnd    time.Time
	// PreemptedBy is the pending job this terminating job was preempted for
	// (Preemption.By); Schedule holds the GPUs coming free for that job
	// first, so that nobody else takes them. 0 = unknown (then the freed
	// GPUs go to whoever comes first in priority order).
	PreemptedBy int64
}

// Team is one team's standing for fair share, guarantees and budget.
type Team struct {
	Name   string
	Weight float64 // fair-share shares (raw; normalised by the scheduler)
	// Guarantee is the team's guaranteed GPUs by GPU type ("" = any type).
	Guarantee map[string]int
	// Usage is the team's decayed GPU-seconds (half-life applied by the caller).
	Usage float64
	// OverBudget: the team has used more than 100 % of its monthly budget;
	// its tier 3-4 jobs run as preemptible.
	OverBudget bool
}

// Mode selects the scheduling algorithm. ModeAllot is the product's policy;
// the others are the baselines the simulator compares it with.
type Mode string

const (
	ModeAllot           Mode = "allot"
	ModeFIFO            Mode = "fifo"             // strict FIFO on the shared cluster
	ModeEASY            Mode = "easy"             // FIFO + EASY backfill, shared
	ModeFIFOPartitioned Mode = "fifo-partitioned" // each team only its guaranteed GPUs
)

// Policy holds the tunables of DESIGN.md.
type Policy struct {
	Mode            Mode
	WeightFairShare float64       // default 10000
	WeightSize      float64       // default 1000
	WeightAge       float64       // default 500
	MaxAge          time.Duration // age factor saturates here (default 7 days)
	HalfLife        time.Duration // usage decay half-life (default 7 days; applied by callers)
	GracePeriod     time.Duration // SIGTERM → SIGKILL (default 120 s)
	MinRuntime      time.Duration // anti-thrash: no preemption before this much runtime
	// GuaranteePatience: a tier 3-4 job of a team under its guarantee
	// preempts only after waiting this long (0 = at once). Short waits are
	// usually ended by the natural churn of jobs, without losing work.
	GuaranteePatience time.Duration
	// StarvationWait: (0 by default; the live loop sets 20 min) a tier 3-4
	// job that has waited this long is served by the starvation guard (package doc, step 4): right after the
	// production classes, oldest first, with a reservation when blocked
	// (at most maxStarvationResv per cycle), so that wide jobs of
	// low-priority teams are not starved by newer jobs (0 = off).
	StarvationWait time.Duration
	// ReservationDepth is how many blocked jobs per class get a backfill
	// reservation in ModeAllot (0 means 1, EASY's classic depth). Jobs that
	// preempted, or wait for GPUs coming free from preemption, always get one.
	ReservationDepth int
	// ClassOrder, when non-nil, is the order the queue serves classes in
	// (lower first), as admins set the tiers' order; missing classes keep
	// their natural place. Nil: tier 1, 2, 3, 4, preemptible.
	ClassOrder map[Tier]int
	// Reserved is a production class's dedicated reservation in GPUs. It is
	// lent to other work while the class does not use it: while the class's
	// running jobs hold fewer GPUs, a blocked job of the class that fits in
	// the rest may take tier 3-4 GPUs back by preemption, beyond the class's
	// preemption rights (never tier 1-2 work; minimum runtime and grace as
	// for any preemption). Nil or 0: no reservation.
	Reserved map[Tier]int
	// MayPreempt narrows the preemption rules above to the tiers'
	// preemption rights as admins set them: a class in the map may preempt
	// only the classes listed for it (still only within the rules). Classes
	// not in the map keep the rules (the live loop maps the production
	// tiers; tier 3-4 guarantee reclaim is a team right, not a tier one).
	MayPreempt map[Tier][]Tier
	// NoPendingInfo skips Plan.Pending and Plan.Shares (the simulator does
	// not read them; the live loop must leave it false), except for the
	// jobs in EstimateFor. Without EstimateFor it also lets a ModeAllot
	// cycle that provably starts and preempts nothing return at once
	// (Plan.Idle: every GPU busy, none in a grace period, no pending job
	// that may preempt; HoldReservations off).
	NoPendingInfo bool
	// EstimateFor, with NoPendingInfo, fills Plan.Pending for these
	// pending jobs only (the simulator's ETA measurement): each entry is
	// what the full Plan.Pending would hold for that job.
	EstimateFor map[int64]bool
	// ETA selects how PendingInfo.EstStart is computed: ETAForecast (""
	// too) or ETALimits.
	ETA ETAMethod
	// Order is how jobs are ordered inside a class: OrderMultifactor
	// (Slurm's form, "" too) or OrderResponse.
	Order Order
	// HoldReservations: a job that held a reservation in the previous
	// cycle (Job.Reserved) comes first in its class.
	HoldReservations bool
	// RawGuarantees keeps oversubscribed guarantees as they are; by
	// default (ModeAllot), guarantees that add up to more than the
	// cluster's GPUs are scaled down to their proportional parts of it.
	RawGuarantees bool
	// WideAging (OrderResponse): a job needing several whole nodes ages as
	// if it were that many times shorter (T / nodes), since it needs that
	// many nodes drained at once. Off by default: on the suite it fixed
	// Jain on one setting and raised the mean wait on the ITP ones (see
	// sim/RESULTS.md).
	WideAging bool
	// SizeExponent (OrderResponse): the priority is multiplied by
	// GPUs^SizeExponent, the job-size factor: positive favours large jobs
	// (as Slurm's default size factor does), negative small ones, 0 (the
	// default) neither. Measured on the suites and not kept (see
	// sim/RESULTS.md); the simulator's --allot-size-exponent sets it.
	SizeExponent float64
	// Tier1FIFO (default true): tier-1 (incident) jobs are served oldest
	// first (submit time, id) instead of by priority, and a tier-1 job
	// whose victims are in their grace period is served in that turn
	// instead of ahead of the queue (the other classes' preemptors still
	// come first, right after tier 1). The GPUs coming free then go to
	// the tier-1 jobs in the order they came: a job's victims' GPUs can
	// no longer be taken, the moment its victims end, by a younger tier-1
	// preemptor whose own victims are still in their grace period, which
	// left the older job waiting for the next victims' grace (on the
	// suite, most tier-1 waits over grace + one cycle). False keeps the
	// priority order within tier 1.
	Tier1FIFO bool
	// PredictedBackfill (ModeAllot; off by default): reservations and
	// backfill use predicted run times (Job.Predicted) instead of time
	// limits, after Tsafrir, Etsion and Feitelson (2007): a reservation's
	// time is computed with running jobs ending at Start + Predicted
	// (doubled while the job outlives it, at most its limit), jobs
	// started this cycle and reserved jobs running their predicted time,
	// and a job may start on GPUs a reservation counts on if its
	// predicted run ends by the reservation's time. Preemption decisions
	// (whether GPUs come free within a grace period, the work a guarantee
	// reclaim may lose), the packing score and EstStartLimits keep time
	// limits. See sim/RESULTS.md for what it did on the suite.
	PredictedBackfill bool
	// TeamWaitBoost (OrderResponse; off by default): a team whose
	// pending tier 3-4 jobs have waited longer on average than all
	// teams' pending tier 3-4 jobs has their priority multiplied by that
	// ratio (at most maxTeamWaitBoost): fair share on waiting. On the
	// suite it lowered the worst team's ratio mostly by raising the mean
	// wait (see sim/RESULTS.md).
	TeamWaitBoost bool
	// StarvedTeamPreempt (OrderResponse; off by default): a tier 3-4 job
	// of a team whose pending tier 3-4 jobs have waited at least 3 times
	// as long on average as all teams' may preempt like a team under its
	// guarantee (after GuaranteePatience, within the lost-work bound),
	// and only jobs submitted after it, so that preemptions always go
	// from older to younger jobs and cannot come back round. On the
	// suite it lowered mean waits at 1.5× the GPU-hours lost (see
	// sim/RESULTS.md).
	StarvedTeamPreempt bool
}

// ETAMethod is how the start of a pending job is estimated.
type ETAMethod string

const (
	// ETAForecast (the default) projects the queue: running jobs end at
	// their expected run time (Job.Expected, else Job.Estimate, capped at
	// the time limit; else the time limit; a job past its expected run
	// time ends halfway to its limit), and the blocked jobs take GPUs one
	// after the other in the order this cycle served them (preemptors of
	// this cycle, production classes, starving jobs, the rest), each at
	// the earliest time enough of the GPUs it may use are free, running
	// its expected time (GPUs are tracked one by one, so a small job may
	// start on a GPU freed before a larger job ahead of it starts:
	// backfill; FIFO modes keep starts in queue order). A tier-1/2 job
	// that may preempt is expected at the earliest time victims it may
	// take (past MinRuntime) or free GPUs suffice, plus one grace period,
	// when that is earlier. Arrivals after now are not foreseen. Only the
	// first 256 blocked jobs (of Policy.EstimateFor: the first 512) get one.
	ETAForecast ETAMethod = "forecast"
	// ETALimits is the earlier estimate: a reservation's time, else (for
	// the first 16 blocked jobs) the earliest time the job fits by
	// running jobs' time limits, ignoring the blocked jobs ahead of it
	// that hold no reservation.
	ETALimits ETAMethod = "limits"
)

// Order selects the priority inside a class (ModeAllot).
type Order string

const (
	// OrderMultifactor: WeightFairShare·F + WeightSize·S + WeightAge·A.
	OrderMultifactor Order = "multifactor"
	// OrderResponse: the response ratio (wait + T) / T, with T the job's
	// expected run time (Job.Estimate, else its time limit, else MaxAge),
	// scaled by the team's fair share 2F (1 at its share, up to 2 below
	// it, towards 0 above it; at least 1/32). Short jobs go first, every
	// job's priority grows with its wait relative to its length (no job
	// starves: a new job always starts at ratio 1), and a team above its
	// share needs proportionally longer waits.
	OrderResponse Order = "response"
)

// DefaultPolicy returns DESIGN.md's defaults for ModeAllot.
func DefaultPolicy() Policy {
	return Policy{
		Mode:            ModeAllot,
		WeightFairShare: 10000,
		WeightSize:      1000,
		WeightAge:       500,
		MaxAge:          7 * 24 * time.Hour,
		HalfLife:        7 * 24 * time.Hour,
		GracePeriod:     120 * time.Second,
		MinRuntime:      10 * time.Minute,

		GuaranteePatience: 10 * time.Minute,
		ReservationDepth:  1,
		Order:             OrderResponse,
		Tier1FIFO:         true,
	}
}

// Snapshot is everything Schedule looks at. Schedule never mutates it.
type Snapshot struct {
	Nodes   []Node
	Running []Job
	Pending []Job
	Teams   []Team
	// NodesSame is the caller's promise that Nodes is the very slice of
	// its previous Schedule call, unmodified since (the simulator keeps
	// one). Schedule then skips comparing the nodes with those of the
	// cycle it reuses state from. False is always correct.
	NodesSame bool
	// Keep, when set, keeps the running jobs' state between this caller's
	// cycles; the caller reports the running jobs it changed (see
	// RunningKeep). Nil is always correct.
	Keep *RunningKeep
	// Order, when set, remembers the order this caller's last cycle served
	// its queue in, to sort the next one faster (see OrderMemory). Nil is
	// always correct.
	Order *OrderMemory
}

// Priority is a job's multifactor priority and its breakdown. Each factor is
// in 0..1; Total = WFS*FairShare + WSize*Size + WAge*Age.
type Priority struct {
	Class     Tier // effective class (budget demotion applied)
	Total     float64
	FairShare float64
	Size      float64
	Age       float64
}

// Start tells the caller to start a job now on exactly these GPUs.
type Start struct {
	JobID     int64
	Placement []Slot
	RunAs     Tier // effective class (TierPreemptible when demoted or preemptible)
	Backfill  bool // started ahead of a higher-priority reserved job
	Priority  Priority
}

// Preemption tells the caller to SIGTERM a running job; after the grace
// period its GPUs are freed and it returns to the queue with its original
// submit time.
type Preemption struct {
	JobID  int64
	By     int64  // the preemptor
	Reason string // human-readable
}

// Reservation is an EASY-backfill reservation for a blocked job.
type Reservation struct {
	JobID int64
	At    time.Time
	// Claims lists the nodes and GPU counts held for the job from At on
	// (ModeAllot); nil for ModeEASY, whose reservation counts GPUs
	// cluster-wide like the reference EASY.
	Claims []Claim
}

// Claim is part of a reservation: GPUs GPUs on node Node (an index into
// Snapshot.Nodes).
type Claim struct {
	Node int
	GPUs int
}

// PendingInfo explains one pending job that was not started this cycle.
type PendingInfo struct {
	JobID    int64
	Priority Priority
	Reason   string    // e.g. "waiting for 16 GPUs in one interconnect domain; largest free block is 8; expected start 14:20 when job 4812 reaches its time limit"
	EstStart time.Time // zero when unknown (see Policy.ETA for how it is computed)
	// EstStartLimits is the ETALimits estimate (reservation time, or the
	// earliest fit by time limits ignoring jobs ahead), whatever
	// Policy.ETA says; zero when unknown or not computed. Under
	// ETAForecast it is set for reservation holders and the jobs that
	// get a detailed reason.
	EstStartLimits time.Time
	// EstKind says what EstStart rests on ("" when it is zero).
	EstKind EstKind
}

// EstKind is what a start estimate rests on (PendingInfo.EstKind).
type EstKind string

const (
	// EstReservation: the job holds a reservation from EstStart on (by
	// time limits; the forecast was not earlier).
	EstReservation EstKind = "reservation"
	// EstPreemption: GPUs freed by preemption: the job preempted this
	// cycle or waits for its victims' grace period (EstStart = its end),
	// or, a tier-1/2 job, it will preempt once victims pass MinRuntime.
	EstPreemption EstKind = "preemption"
	// EstForecast: the queue forecast (ETAForecast), no reservation or an
	// earlier time than the reservation's.
	EstForecast EstKind = "forecast"
	// EstLimits: the earliest fit by time limits, ignoring the jobs ahead
	// without a reservation (ETALimits, or no forecast for the job).
	EstLimits EstKind = "limits"
)

// TeamShare is a team's fair-share standing, like one row of Slurm's sshare.
type TeamShare struct {
	Team           string
	NormShares     float64 // S
	RawUsage       float64 // decayed GPU-seconds
	EffectiveUsage float64 // U, the team's share of all decayed usage
	FairShare      float64 // F = 2^(-U/S)
}

// Plan is the outcome of one scheduling cycle.
type Plan struct {
	Starts       []Start
	Preemptions  []Preemption
	Reservations []Reservation
	Pending      []PendingInfo // every pending job not started, in priority order
	Shares       []TeamShare   // sorted by team name
	// Idle: the cycle returned at once, as it provably started and
	// preempted nothing and its caller reads nothing else (see
	// Policy.NoPendingInfo); Reservations were not computed.
	Idle bool
}
