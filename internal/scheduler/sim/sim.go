package sim

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/allotlabs/allot/internal/scheduler"
)

// ScheduleFunc is the scheduler core's entry point; Config.Schedule defaults
// to scheduler.Schedule. It must be safe for concurrent use.
type ScheduleFunc func(s scheduler.Snapshot, now time.Time, p scheduler.Policy) scheduler.Plan

// Epoch is virtual time zero: the trace origin after windowing.
var Epoch = time.Date(2017, 1, 1, 0, 0, 0, 0, time.UTC)

// Config is one replay: a cluster, a policy and the knobs that turn a trace
// (which has no tiers, time limits or checkpoints) into scheduler jobs.
type Config struct {
	Nodes       int
	GPUsPerNode int // at most 64
	// DomainNodes nodes share an interconnect domain ("d000", "d001", …);
	// 0 means no domain constraint (Node.Domain "").
	DomainNodes int
	GPUType     string
	Teams       []TeamSpec // guarantees; teams of the trace not listed get none
	Policy      scheduler.Policy
	// Cycle is the periodic cycle in virtual time; 0 schedules only on
	// events (submit, finish, end of a preemption grace period).
	Cycle          time.Duration
	WalltimeFactor float64 // time limit = duration × factor (≤ 0 means 1)
	// WalltimeFactorMax > WalltimeFactor spreads the factor: each user's
	// factor is drawn (seeded hash of the user) uniformly between the two,
	// and each job's is that times a log-uniform jitter in [0.8, 1.25]
	// (hash of the job), at least 1. Users' limits are 2-5× their run
	// times, and a user tends to ask alike.
	WalltimeFactorMax float64
	// ETA measures start estimates (Result.ETAAtSubmit, ETAAt1h; see
	// eta.go): the cycles with a job to predict fill Plan.Pending for it.
	ETA bool
	// LearnedOrder fills Job.Estimate (which orders the queue under
	// scheduler.OrderResponse) with the learned run time (eta.go: the
	// user's, else the team's, median run time / limit × the job's
	// limit, from jobs completed before its arrival). Under
	// Policy.PredictedBackfill Job.Predicted gets the same value.
	LearnedOrder bool
	TierMix      []TierWeight
	Seed         int64
	// CheckpointFraction of the jobs (by seeded hash) are checkpointable;
	// they checkpoint every CheckpointInterval of run time.
	CheckpointFraction float64
	CheckpointInterval time.Duration
	Schedule           ScheduleFunc // nil means scheduler.Schedule
	Timeline           bool         // record busy GPUs over time (for plots)
	JobWaits           bool         // fill Result.JobWaits (allot sim --waits)
	// MaxPreemptions fails the replay when one job has been preempted more
	// than this many times (a preemption livelock); 0 means 100.
	MaxPreemptions int
	// EveryEvent disables the skipping of provably idle baseline cycles
	// (for tests that check the skipping changes nothing).
	EveryEvent bool
	// NoKeep makes every cycle read all running jobs again instead of
	// keeping their state (scheduler.RunningKeep) between cycles (for
	// tests that check keeping it changes nothing).
	NoKeep   bool
	Progress *atomic.Int64
	// Burst models cloud burst (ModeAllot only; nil = none).
	Burst *BurstConfig
}

// Group is a per-tier or per-team breakdown.
type Group struct {
	Jobs       int     `json:"jobs"`
	WaitMeanS  float64 `json:"wait_mean_s"`
	WaitP95S   float64 `json:"wait_p95_s"`
	GPUS       float64 `json:"gpu_s"`
	ShareRatio float64 `json:"share_ratio"`
	WaitP99S   float64 `json:"-"` // table only: the JSON keys are fixed by the issue
}

// Result is one policy's replay metrics; the JSON keys are the issue's.
type Result struct {
	Jobs            int     `json:"jobs"`
	Dropped         int     `json:"dropped"`
	TotalGPUs       int     `json:"total_gpus"`
	MakespanS       float64 `json:"makespan_s"`
	Utilization     float64 `json:"utilization"`
	OfferedLoad     float64 `json:"offered_load"`
	UtilizationSpan float64 `json:"utilization_span"`
	OfferedLoadSpan float64 `json:"offered_load_span"`
	// IdlePendingSpan is the share of the span's GPU-time (on-premise
	// nodes) that was idle while jobs were pending; IdleHeldSpan is the
	// part of it during which the smallest pending job would have fitted
	// on the free GPUs (one node, or enough wholly free nodes), ignoring
	// reservations, domains and node pools: GPUs the policy held back
	// (for a reservation, or by class order). The rest is fragmentation:
	// free GPUs no pending job fits.
	IdlePendingSpan       float64          `json:"idle_pending_span"`
	IdleHeldSpan          float64          `json:"idle_held_span"`
	WaitMeanS             float64          `json:"wait_mean_s"`
	WaitP50S              float64          `json:"wait_p50_s"`
	WaitP95S              float64          `json:"wait_p95_s"`
	WaitP99S              float64          `json:"wait_p99_s"`
	JCTMeanS              float64          `json:"jct_mean_s"`
	BoundedSlowdownMean   float64          `json:"bounded_slowdown_mean"`
	Preemptions           int              `json:"preemptions"`
	GPUSLostToPreemption  float64          `json:"gpu_s_lost_to_preemption"`
	JainFairness          float64          `json:"jain_fairness"`
	ByTier                map[string]Group `json:"by_tier"`
	ByTeam                map[string]Group `json:"by_team"`
	Cycles                int              `json:"cycles"`
	CycleMeanUS           float64          `json:"cycle_mean_us"`
	CycleP99US            float64          `json:"cycle_p99_us"`
	SimWallS              float64          `json:"sim_wall_s"`
	Waits                 []float64        `json:"-"` // seconds, per job that ran, sorted
	Timeline              []Point          `json:"-"` // busy GPUs, a step function
	SpanStartS, SpanEndS  float64          `json:"-"`
	TimeLimitKills        int              `json:"-"`
	DroppedNeverStartable int              `json:"-"` // of Dropped: stuck at the end, not filtered up front
	// JobWaits has one record per job that ran, in trace order (--waits).
	JobWaits []JobWait `json:"-"`
	// Burst is what cloud burst did (Config.Burst).
	Burst *BurstResult `json:"burst,omitempty"`
	// ETA error at submit and one hour later (Config.ETA).
	ETAAtSubmit *ETAStats `json:"eta_at_submit,omitempty"`
	ETAAt1h     *ETAStats `json:"eta_at_1h,omitempty"`
}

// JobWait is one job's wait, for per-job analysis (allot sim --waits).
type JobWait struct {
	ID          int64  // 1-based position in the replayed trace
	Name        string // the trace's job id
	Team        string
	Tier        scheduler.Tier
	GPUs        int
	SubmitS     float64 // virtual seconds after the window start
	FirstStartS float64
	WaitS       float64
	Preemptions int
}

// Point is one step of the busy-GPU timeline: from T (seconds) on, Busy
// GPUs are allocated.
type Point struct {
	T    float64
	Busy int
}

type jobPhase uint8

const (
	phasePending jobPhase = iota
	phaseRunning
	phaseTerminating
	phaseDone
	phaseDropped
	phaseFuture
)

type simJob struct {
	tj         *TraceJob
	id         int64
	tier       scheduler.Tier
	ckpt       bool
	timeLimit  time.Duration
	phase      jobPhase
	done       time.Duration // checkpointed progress carried across requeues
	firstStart time.Duration // -1 until first start
	runStart   time.Duration
	finish     time.Duration
	gen        uint32 // invalidates stale heap events
	placement  []scheduler.Slot
	team       int
	killed     bool
	preempted  int
	stuck      bool          // dropped at the end: never started on an empty cluster
	reserved   int           // the cycle (1-based) whose plan last reserved for it
	expected   time.Duration // learned expected run time at arrival (learner), 0 = unknown
	lastCk     time.Duration // the run's last checkpoint set in the snapshot (0: none)
}

type evKind uint8

const (
	evFinish evKind = iota
	evGrace
)

type event struct {
	at   time.Duration
	job  int32
	gen  uint32
	kind evKind
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(a, b int) bool {
	if h[a].at != h[b].at {
		return h[a].at < h[b].at
	}
	return h[a].job < h[b].job
}
func (h eventHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// state is one replay in progress.
type state struct {
	cfg      Config
	sched    ScheduleFunc
	total    int
	nodes    []scheduler.Node
	used     []uint64 // per node, bit g set = GPU g allocated
	nodeUsed []int
	free     int

	jobs []simJob
	// anyReserved: the last plan had reservations (pending jobs carry
	// Job.Reserved).
	anyReserved bool
	running     []scheduler.Job // passed to Schedule as is; index runIdx
	runIdx      []int32         // job index → position in running, -1 if absent
	pending     []scheduler.Job // sorted by (Submit, ID)
	teams       []scheduler.Team
	teamIdx     map[string]int

	// lrn learns run times from completed jobs (nil when nothing reads them).
	lrn *learner

	events eventHeap
	now    time.Duration
	nextIn int // next arrival index

	// accounting
	last       time.Duration
	busy       int
	teamBusy   []int
	tierBusy   []int // index tier-1
	teamDemand []int
	tierDemand []int
	teamFair   []float64 // current water-filled share
	tierFair   []float64
	fairDirty  bool
	teamR      []float64 // GPU-seconds received
	tierR      []float64
	teamF      []float64 // ∫ fair share
	tierF      []float64
	usefulSpan float64 // busy GPU-seconds inside the arrival span, minus lost work
	// Idle GPU-seconds inside the span while jobs were pending (Result.
	// IdlePendingSpan), and of those while the smallest fitted.
	idlePend, idleHeld float64
	// The on-premise nodes' free GPUs, the most on one node and the wholly
	// free nodes, recomputed when dirty; pendMin: the fewest GPUs a
	// pending job asks for (0: none pending).
	idle    idleNodes
	pendMin int
	lost    float64
	spanA   time.Duration
	spanB   time.Duration
	decay   float64 // λ = ln2 / half-life, per second

	preemptions int
	cycleNS     []int64
	timeline    []Point
	startedAny  bool
	// Since the last cycle: GPUs were freed, or a job arrived that a
	// baseline might start (see mayStart).
	released  bool
	startable bool
	teamPend  []int // pending jobs per team
	progress  *atomic.Int64
	waterBuf  []int
	burst     *burstState // nil without Config.Burst
	eta       *etaState   // nil without Config.ETA
	// nodesChanged: s.nodes changed since the last cycle (burst), so the
	// snapshot may not promise NodesSame.
	nodesChanged bool
	// keep is told every position of running changed (nil: Config.NoKeep).
	keep *scheduler.RunningKeep
	// order remembers the last cycle's queue order (nil: Config.NoKeep).
	order *scheduler.OrderMemory
}

// Run replays trace (sorted by Submit) under cfg and returns the metrics.
func Run(cfg Config, trace []TraceJob) (*Result, error) {
	wall := time.Now()
	if cfg.Nodes <= 0 || cfg.GPUsPerNode <= 0 || cfg.GPUsPerNode > 64 {
		return nil, fmt.Errorf("cluster of %d nodes × %d GPUs: want nodes ≥ 1 and 1..64 GPUs per node", cfg.Nodes, cfg.GPUsPerNode)
	}
	if cfg.DomainNodes < 0 {
		return nil, errors.New("domain nodes must be ≥ 0")
	}
	if cfg.WalltimeFactor <= 0 {
		cfg.WalltimeFactor = 1
	}
	if cfg.TierMix == nil {
		cfg.TierMix = DefaultTierMix
	}
	if cfg.CheckpointInterval <= 0 {
		cfg.CheckpointInterval = 30 * time.Minute
	}
	if cfg.Policy.Mode == "" {
		cfg.Policy = scheduler.DefaultPolicy()
	}
	// The replay reads starts, preemptions and nothing else of a plan.
	cfg.Policy.NoPendingInfo = true
	s := &state{cfg: cfg, sched: cfg.Schedule, progress: cfg.Progress}
	if !cfg.NoKeep {
		s.keep = new(scheduler.RunningKeep)
		s.order = new(scheduler.OrderMemory)
	}
	if s.sched == nil {
		s.sched = scheduler.Schedule
	}
	if cfg.Burst != nil {
		if cfg.Policy.Mode != scheduler.ModeAllot {
			return nil, fmt.Errorf("%s: burst is modelled for the allot policy only", cfg.Policy.Mode)
		}
		if cfg.Burst.Shape.GPUs < 1 || cfg.Burst.Shape.GPUs > 64 {
			return nil, fmt.Errorf("burst nodes of %d GPUs: want 1..64", cfg.Burst.Shape.GPUs)
		}
		s.burst = newBurstState(*cfg.Burst)
	}
	s.build(trace)
	if cfg.ETA {
		s.eta = newETAState(len(s.jobs))
	}
	if cfg.ETA || cfg.LearnedOrder || cfg.Policy.PredictedBackfill && cfg.Policy.Mode == scheduler.ModeAllot {
		s.lrn = newLearner()
	}
	if err := s.loop(); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Policy.Mode, err)
	}
	r := s.result()
	if s.burst != nil {
		r.Burst = s.burstFinish()
	}
	if s.eta != nil {
		r.ETAAtSubmit, r.ETAAt1h = s.etaResult()
	}
	r.SimWallS = time.Since(wall).Seconds()
	return r, nil
}

func (s *state) build(trace []TraceJob) {
	c := s.cfg
	s.total = c.Nodes * c.GPUsPerNode
	s.nodes = make([]scheduler.Node, c.Nodes)
	for i := range s.nodes {
		n := scheduler.Node{
			Name:    fmt.Sprintf("n%04d", i),
			GPUType: c.GPUType,
			GPUs:    c.GPUsPerNode,
			Site:    scheduler.SiteOnPrem,
			State:   scheduler.NodeUp,
		}
		if c.DomainNodes > 0 {
			n.Domain = fmt.Sprintf("d%03d", i/c.DomainNodes)
		}
		s.nodes[i] = n
	}
	s.used = make([]uint64, c.Nodes)
	s.nodeUsed = make([]int, c.Nodes)
	s.free = s.total
	if hl := c.Policy.HalfLife; hl > 0 {
		s.decay = math.Ln2 / hl.Seconds()
	}

	// Teams: the teams file's, plus any team of the trace, sorted by name.
	guar := map[string]int{}
	for _, t := range c.Teams {
		guar[t.Name] = t.GPUs
	}
	names := map[string]bool{}
	for _, t := range c.Teams {
		names[t.Name] = true
	}
	for i := range trace {
		names[trace[i].Team] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	s.teamIdx = make(map[string]int, len(sorted))
	s.teams = make([]scheduler.Team, len(sorted))
	for i, n := range sorted {
		s.teamIdx[n] = i
		t := scheduler.Team{Name: n, Weight: 1}
		if g := guar[n]; g > 0 {
			t.Guarantee = map[string]int{c.GPUType: g}
			t.Weight = float64(g)
		}
		s.teams[i] = t
	}
	nt := len(sorted)
	s.teamBusy, s.teamDemand, s.teamPend = make([]int, nt), make([]int, nt), make([]int, nt)
	s.teamFair, s.teamR, s.teamF = make([]float64, nt), make([]float64, nt), make([]float64, nt)
	s.tierBusy, s.tierDemand = make([]int, 5), make([]int, 5)
	s.tierFair, s.tierR, s.tierF = make([]float64, 5), make([]float64, 5), make([]float64, 5)

	s.jobs = make([]simJob, len(trace))
	s.runIdx = make([]int32, len(trace))
	for i := range trace {
		tj := &trace[i]
		tier := TierOf(c.TierMix, c.Seed, tj.Name)
		factor := c.WalltimeFactor
		if c.WalltimeFactorMax > c.WalltimeFactor {
			u := float64(hash64(c.Seed, "walltime-user", tj.User)%1_000_000) / 1e6
			v := float64(hash64(c.Seed, "walltime-job", tj.Name)%1_000_000) / 1e6
			factor = c.WalltimeFactor + u*(c.WalltimeFactorMax-c.WalltimeFactor)
			factor = max(1, factor*math.Exp((2*v-1)*math.Log(1.25)))
		}
		limit := time.Duration(math.Ceil(float64(tj.Duration)*factor/float64(time.Second))) * time.Second
		s.jobs[i] = simJob{
			tj:         tj,
			id:         int64(i + 1),
			tier:       tier,
			ckpt:       CheckpointableOf(c.CheckpointFraction, c.Seed, tj.Name),
			timeLimit:  limit,
			firstStart: -1,
			phase:      phaseFuture,
			team:       s.teamIdx[tj.Team],
		}
		s.runIdx[i] = -1
	}
	if len(trace) > 0 {
		s.spanA = trace[0].Submit
		s.spanB = trace[len(trace)-1].Submit
		s.last = s.spanA
		s.now = s.spanA
	}
}

// neverRuns reports why a job can never start on this cluster under this
// policy, or "".
func (s *state) neverRuns(j *simJob) string {
	g, per := j.tj.GPUs, s.cfg.GPUsPerNode
	if g > s.total {
		return "larger than the cluster"
	}
	if g > per {
		need := (g + per - 1) / per
		dom := s.cfg.DomainNodes
		if dom == 0 || dom > s.cfg.Nodes {
			dom = s.cfg.Nodes
		}
		if need > dom {
			return "needs more whole nodes than one interconnect domain has"
		}
	}
	if s.cfg.Policy.Mode == scheduler.ModeFIFOPartitioned {
		q := s.teams[j.team].Guarantee[s.cfg.GPUType]
		if q == 0 {
			return "team has no guarantee (partitioned)"
		}
		if g > q {
			return "larger than the team's partition"
		}
	}
	return ""
}

func (s *state) loop() error {
	periodic := s.cfg.Cycle > 0 && s.cfg.Policy.Mode == scheduler.ModeAllot
	for {
		// Next event time.
		next := time.Duration(math.MaxInt64)
		if s.nextIn < len(s.jobs) {
			next = s.jobs[s.nextIn].tj.Submit
		}
		if len(s.events) > 0 && s.events[0].at < next {
			next = s.events[0].at
		}
		tick := false
		if periodic && len(s.pending) > 0 {
			// The next multiple of Cycle strictly after now.
			c := s.cfg.Cycle
			t := (s.now/c + 1) * c
			if t < next {
				next, tick = t, true
			}
		}
		btick := false
		if s.burst != nil {
			busy := len(s.events) > 0 || s.nextIn < len(s.jobs) || len(s.running) > 0
			if t := s.burst.next(s.now, len(s.pending), busy); t < next {
				next, btick, tick = t, true, false
			} else if t == next {
				btick = true
			}
		}
		if next == time.Duration(math.MaxInt64) {
			break
		}
		if !tick && !btick && s.nextIn >= len(s.jobs) && len(s.events) == 0 {
			break
		}
		s.advance(next)
		evented := false
		// 1. finishes, time-limit kills and ends of grace periods.
		for len(s.events) > 0 && s.events[0].at == next {
			e := heap.Pop(&s.events).(event)
			j := &s.jobs[e.job]
			if j.gen != e.gen {
				continue
			}
			switch e.kind {
			case evFinish:
				if j.phase == phaseRunning || j.phase == phaseTerminating {
					s.finishJob(int(e.job))
					evented = true
				}
			case evGrace:
				if j.phase == phaseTerminating {
					s.requeue(int(e.job))
					evented = true
				}
			}
		}
		// 2. arrivals.
		for s.nextIn < len(s.jobs) && s.jobs[s.nextIn].tj.Submit == next {
			s.arrive(s.nextIn)
			s.nextIn++
			evented = true
		}
		// 2b. burst nodes coming up; the burst rule on its ticks.
		if btick && s.burstStep() {
			evented = true
		}
		// 3. schedule.
		if len(s.pending) == 0 {
			continue
		}
		if !evented && !tick {
			continue
		}
		if s.skip(tick) {
			continue
		}
		if err := s.cycle(); err != nil {
			return err
		}
		if !s.startedAny && len(s.events) == 0 && s.nextIn >= len(s.jobs) && len(s.running) == 0 && (s.burst == nil || len(s.burst.inflight) == 0) {
			// An empty cluster and no future events: what is still pending
			// can never start.
			for _, p := range s.pending {
				j := &s.jobs[p.ID-1]
				j.phase = phaseDropped
				j.stuck = true
				s.teamPend[j.team]--
				s.teamDemand[j.team] -= j.tj.GPUs
				s.tierDemand[j.tier-1] -= j.tj.GPUs
				s.markProgress()
			}
			s.pending = s.pending[:0]
			s.pendMin = 0
			s.fairDirty = true
		}
	}
	s.advance(s.now)
	return nil
}

// skip reports whether this cycle can be skipped because it provably
// starts nothing. Only the baselines skip: they never preempt and their
// decisions depend on nothing but the queue and the free GPUs (a later
// cycle can only find less room before an EASY reservation), so
//   - with no free GPU nothing can start;
//   - when only arrivals happened since the last cycle (which left every
//     remaining pending job blocked), only an arrival can start, and only
//     if mayStart said so when it arrived.
//
// ModeAllot is never skipped here: priorities age, usage decays, and
// preemption becomes possible as running jobs pass the minimum runtime.
// The core itself returns at once from the cycles it can prove idle
// (scheduler.Plan.Idle: every GPU busy, none in a grace period and no
// pending job that may preempt), after applying the running jobs' changes
// to the keep.
func (s *state) skip(tick bool) bool {
	if s.cfg.Policy.Mode == scheduler.ModeAllot || s.cfg.EveryEvent {
		return false
	}
	if s.free == 0 {
		return true
	}
	return !tick && !s.released && !s.startable
}

// mayStart reports whether a baseline could start job j, which arrives
// while the jobs in s.pending are blocked: strict FIFO only if the queue is
// empty, the partitioned FIFO only if its team's queue is empty, and
// anything only if it fits in the free GPUs right now (ignoring domains and
// partitions, so the test errs on the side of running the cycle).
func (s *state) mayStart(j *simJob) bool {
	switch s.cfg.Policy.Mode {
	case scheduler.ModeFIFO:
		if len(s.pending) > 0 {
			return false
		}
	case scheduler.ModeFIFOPartitioned:
		if s.teamPend[j.team] > 0 {
			return false
		}
	}
	per := s.cfg.GPUsPerNode
	if j.tj.GPUs <= per {
		for _, u := range s.nodeUsed {
			if per-u >= j.tj.GPUs {
				return true
			}
		}
		return false
	}
	need, whole := (j.tj.GPUs+per-1)/per, 0
	for _, u := range s.nodeUsed {
		if u == 0 {
			if whole++; whole >= need {
				return true
			}
		}
	}
	return false
}

// advance moves virtual time to t, integrating every time-weighted metric
// over (s.last, t] with the state as it was.
func (s *state) advance(t time.Duration) {
	if s.fairDirty {
		waterFill(s.total, s.teamDemand, s.teamFair, &s.waterBuf)
		waterFill(s.total, s.tierDemand, s.tierFair, &s.waterBuf)
		s.fairDirty = false
	}
	if t > s.last {
		dt := (t - s.last).Seconds()
		for i, b := range s.teamBusy {
			s.teamR[i] += float64(b) * dt
			s.teamF[i] += s.teamFair[i] * dt
		}
		for i, b := range s.tierBusy {
			s.tierR[i] += float64(b) * dt
			s.tierF[i] += s.tierFair[i] * dt
		}
		if ov := overlap(s.last, t, s.spanA, s.spanB); ov > 0 {
			s.usefulSpan += float64(s.busy) * ov
			if len(s.pending) > 0 {
				s.idleWhilePending(ov)
			}
		}
		if s.decay > 0 {
			e := math.Exp(-s.decay * dt)
			for i := range s.teams {
				u := s.teams[i].Usage*e + float64(s.teamBusy[i])*(1-e)/s.decay
				s.teams[i].Usage = u
			}
		} else {
			for i := range s.teams {
				s.teams[i].Usage += float64(s.teamBusy[i]) * dt
			}
		}
		s.last = t
	}
	s.now = t
}

func overlap(a, b, lo, hi time.Duration) float64 {
	if a < lo {
		a = lo
	}
	if b > hi {
		b = hi
	}
	if b <= a {
		return 0
	}
	return (b - a).Seconds()
}

// waterFill sets fair[i] to the max-min fair split of capacity among the
// demands (equal weights, each capped at its demand).
func waterFill(capacity int, demand []int, fair []float64, buf *[]int) {
	idx := (*buf)[:0]
	for i, d := range demand {
		fair[i] = 0
		if d > 0 {
			idx = append(idx, i)
		}
	}
	// By (demand, index), a total order; a few dozen teams (the usual
	// case) by insertion sort, without a comparison function's calls.
	if len(idx) > 64 {
		slices.SortFunc(idx, func(a, b int) int { return cmp.Or(cmp.Compare(demand[a], demand[b]), cmp.Compare(a, b)) })
	}
	for i := 1; i < len(idx); i++ {
		x := idx[i]
		k := i
		for k > 0 && (demand[idx[k-1]] > demand[x] || demand[idx[k-1]] == demand[x] && idx[k-1] > x) {
			idx[k] = idx[k-1]
			k--
		}
		idx[k] = x
	}
	left := float64(capacity)
	for k, i := range idx {
		share := left / float64(len(idx)-k)
		if float64(demand[i]) <= share {
			fair[i] = float64(demand[i])
			left -= float64(demand[i])
			continue
		}
		for _, r := range idx[k:] {
			fair[r] = share
		}
		break
	}
	*buf = idx
}

func (s *state) markProgress() {
	if s.progress != nil {
		s.progress.Add(1)
	}
}

func (s *state) arrive(i int) {
	j := &s.jobs[i]
	if why := s.neverRuns(j); why != "" {
		j.phase = phaseDropped
		s.markProgress()
		return
	}
	j.phase = phasePending
	s.teamDemand[j.team] += j.tj.GPUs
	s.tierDemand[j.tier-1] += j.tj.GPUs
	s.fairDirty = true
	if !s.startable && s.cfg.Policy.Mode != scheduler.ModeAllot {
		s.startable = s.mayStart(j)
	}
	s.teamPend[j.team]++
	if s.lrn != nil {
		j.expected = s.learned(j)
	}
	if s.eta != nil {
		s.eta.first = append(s.eta.first, int32(i))
		s.eta.later = append(s.eta.later, int32(i))
	}
	// Arrivals come in submit order, so appending keeps pending sorted.
	s.pending = append(s.pending, s.pendingJob(j))
	s.pendingAsks(j.tj.GPUs)
}

func (s *state) pendingJob(j *simJob) scheduler.Job {
	exp := time.Duration(0)
	if j.expected > 0 {
		exp = max(j.expected-j.done, time.Second)
	}
	var estimate, predicted time.Duration
	if s.cfg.LearnedOrder {
		estimate = exp
	}
	if s.cfg.Policy.PredictedBackfill {
		predicted = exp
	}
	if s.eta == nil {
		exp = 0 // the forecast's Expected only with the ETA measurement, as before
	}
	return scheduler.Job{
		Expected:       exp,
		Estimate:       estimate,
		Predicted:      predicted,
		ID:             j.id,
		Name:           j.tj.Name,
		Team:           j.tj.Team,
		User:           j.tj.User,
		Tier:           j.tier,
		GPUs:           j.tj.GPUs,
		TimeLimit:      j.timeLimit,
		Submit:         Epoch.Add(j.tj.Submit),
		Preemptible:    j.tier == scheduler.TierPreemptible,
		Checkpointable: j.ckpt,
	}
}

// cycle calls the scheduler once and applies its plan.
func (s *state) cycle() error {
	now := Epoch.Add(s.now)
	// Only ModeAllot reads LastCheckpoint (the work a victim would lose);
	// the baselines never preempt.
	if s.cfg.CheckpointFraction > 0 && s.cfg.Policy.Mode == scheduler.ModeAllot {
		for k := range s.running {
			r := &s.running[k]
			if r.Checkpointable {
				j := &s.jobs[r.ID-1]
				if ck := s.lastCheckpoint(s.now, j.runStart); ck > 0 && ck != j.lastCk {
					j.lastCk = ck
					r.LastCheckpoint = Epoch.Add(ck)
				}
			}
		}
	}
	snap := scheduler.Snapshot{Nodes: s.nodes, Running: s.running, Pending: s.pending, Teams: s.teams, NodesSame: !s.nodesChanged, Keep: s.keep, Order: s.order}
	s.nodesChanged = false
	pol := s.cfg.Policy
	if s.eta != nil && s.etaTargets() {
		pol.EstimateFor = s.eta.want
		s.refreshRunning()
	}
	t0 := time.Now()
	plan := s.sched(snap, now, pol)
	s.cycleNS = append(s.cycleNS, time.Since(t0).Nanoseconds())
	s.released, s.startable = false, false
	s.startedAny = len(plan.Starts) > 0 || len(plan.Preemptions) > 0

	for _, st := range plan.Starts {
		if err := s.start(st); err != nil {
			return fmt.Errorf("cycle at t=%s: %w", s.now, err)
		}
	}
	if len(plan.Starts) > 0 {
		// Drop started jobs from pending in one pass, keeping order.
		k := 0
		s.pendMin = 0
		for _, p := range s.pending {
			if s.jobs[p.ID-1].phase == phasePending {
				s.pending[k] = p
				k++
				s.pendingAsks(p.GPUs)
			}
		}
		clear(s.pending[k:])
		s.pending = s.pending[:k]
	}
	for _, pr := range plan.Preemptions {
		if err := s.preempt(pr); err != nil {
			return fmt.Errorf("cycle at t=%s: %w", s.now, err)
		}
	}
	// Tell the next cycle which jobs hold a reservation (Job.Reserved).
	if s.cfg.Policy.Mode == scheduler.ModeAllot && (len(plan.Reservations) > 0 || s.anyReserved) {
		for _, r := range plan.Reservations {
			s.jobs[r.JobID-1].reserved = len(s.cycleNS)
		}
		for k := range s.pending {
			p := &s.pending[k]
			p.Reserved = s.jobs[p.ID-1].reserved == len(s.cycleNS)
		}
		s.anyReserved = len(plan.Reservations) > 0
	}
	if s.eta != nil {
		s.etaRecord(&plan)
	}
	return nil
}

// lastCheckpoint is the time of the last periodic checkpoint of a run that
// started at start, or 0 (never: a checkpoint at the run's start is worthless).
func (s *state) lastCheckpoint(now, start time.Duration) time.Duration {
	iv := s.cfg.CheckpointInterval
	n := (now - start) / iv
	if n <= 0 {
		return 0
	}
	return start + n*iv
}

func (s *state) start(st scheduler.Start) error {
	if st.JobID < 1 || int(st.JobID) > len(s.jobs) {
		return fmt.Errorf("start of unknown job %d", st.JobID)
	}
	idx := int(st.JobID - 1)
	j := &s.jobs[idx]
	if j.phase != phasePending {
		return fmt.Errorf("start of job %d, which is not pending", st.JobID)
	}
	n := 0
	for _, sl := range st.Placement {
		if sl.Node < 0 || sl.Node >= len(s.nodes) {
			return fmt.Errorf("job %d placed on unknown node %d", st.JobID, sl.Node)
		}
		for _, g := range sl.GPUs {
			if g < 0 || g >= s.nodes[sl.Node].GPUs {
				return fmt.Errorf("job %d placed on GPU %d of node %d, which has %d", st.JobID, g, sl.Node, s.nodes[sl.Node].GPUs)
			}
			if s.used[sl.Node]&(1<<g) != 0 {
				return fmt.Errorf("job %d placed on GPU %d of node %d, which is in use", st.JobID, g, sl.Node)
			}
			s.used[sl.Node] |= 1 << g
			s.nodeUsed[sl.Node]++
			n++
		}
	}
	if n != j.tj.GPUs {
		return fmt.Errorf("job %d asks for %d GPUs but was placed on %d", st.JobID, j.tj.GPUs, n)
	}
	s.free -= n
	s.idle.fresh = false
	s.teamPend[j.team]--
	j.phase = phaseRunning
	j.runStart = s.now
	j.lastCk = 0
	j.placement = st.Placement
	if j.firstStart < 0 {
		j.firstStart = s.now
	}
	remaining := j.tj.Duration - j.done
	run := remaining
	j.killed = false
	if j.timeLimit < run {
		run, j.killed = j.timeLimit, true
	}
	j.gen++
	heap.Push(&s.events, event{at: s.now + run, job: int32(idx), gen: j.gen, kind: evFinish})

	job := s.pendingJob(j)
	job.Start = Epoch.Add(s.now)
	job.Placement = st.Placement
	job.RunAs = st.RunAs
	if job.RunAs == 0 {
		job.RunAs = j.tier
	}
	if s.eta != nil && job.Expected > 0 {
		s.eta.nextRefresh = min(s.eta.nextRefresh, s.now+job.Expected)
	}
	s.runIdx[idx] = int32(len(s.running))
	s.keep.Changed(len(s.running))
	s.running = append(s.running, job)
	s.setBusy(j, +n)
	return nil
}

func (s *state) setBusy(j *simJob, d int) {
	s.busy += d
	s.teamBusy[j.team] += d
	s.tierBusy[j.tier-1] += d
	if s.cfg.Timeline {
		t := s.now.Seconds()
		if k := len(s.timeline); k > 0 && s.timeline[k-1].T == t {
			s.timeline[k-1].Busy = s.busy
		} else {
			s.timeline = append(s.timeline, Point{T: t, Busy: s.busy})
		}
	}
}

func (s *state) preempt(pr scheduler.Preemption) error {
	if pr.JobID < 1 || int(pr.JobID) > len(s.jobs) {
		return fmt.Errorf("preemption of unknown job %d", pr.JobID)
	}
	idx := int(pr.JobID - 1)
	j := &s.jobs[idx]
	if j.phase != phaseRunning {
		return fmt.Errorf("preemption of job %d, which is not running (or already terminating)", pr.JobID)
	}
	s.preemptions++
	j.preempted++
	if limit := cmp.Or(s.cfg.MaxPreemptions, 100); j.preempted > limit {
		return fmt.Errorf("job %d (%s) preempted more than %d times (the last time by job %d: %s): the policy livelocks", pr.JobID, j.tj.Name, limit, pr.By, pr.Reason)
	}
	j.phase = phaseTerminating
	end := s.now + s.cfg.Policy.GracePeriod
	r := &s.running[s.runIdx[idx]]
	s.keep.Changed(int(s.runIdx[idx]))
	r.Terminating = true
	r.GraceEnd = Epoch.Add(end)
	// As the live loop does: the core holds the GPUs coming free for the
	// preemptor first.
	r.PreemptedBy = pr.By
	heap.Push(&s.events, event{at: end, job: int32(idx), gen: j.gen, kind: evGrace})
	return nil
}

// release frees a running or terminating job's GPUs.
func (s *state) release(idx int) {
	j := &s.jobs[idx]
	for _, sl := range j.placement {
		for _, g := range sl.GPUs {
			s.used[sl.Node] &^= 1 << g
			s.nodeUsed[sl.Node]--
		}
	}
	s.free += j.tj.GPUs
	s.idle.fresh = false
	s.released = true
	j.placement = nil
	// Swap-remove from running.
	k := s.runIdx[idx]
	last := int32(len(s.running) - 1)
	if k != last {
		s.keep.Changed(int(k))
		s.running[k] = s.running[last]
		s.runIdx[s.running[k].ID-1] = k
	}
	s.running[last] = scheduler.Job{}
	s.running = s.running[:last]
	s.runIdx[idx] = -1
	j.gen++
	s.setBusy(j, -j.tj.GPUs)
}

func (s *state) finishJob(idx int) {
	s.release(idx)
	j := &s.jobs[idx]
	j.phase = phaseDone
	j.finish = s.now
	s.learn(j)
	s.teamDemand[j.team] -= j.tj.GPUs
	s.tierDemand[j.tier-1] -= j.tj.GPUs
	s.fairDirty = true
	s.markProgress()
}

// requeue ends a preempted job's grace period: its GPUs are freed, the work
// since its last checkpoint is lost, and it goes back to the queue with its
// original submit time.
func (s *state) requeue(idx int) {
	j := &s.jobs[idx]
	saved := time.Duration(0)
	if j.ckpt {
		if ck := s.lastCheckpoint(s.now, j.runStart); ck > 0 {
			saved = ck - j.runStart
		}
	}
	lostFrom := j.runStart + saved
	gpus := float64(j.tj.GPUs)
	s.lost += gpus * (s.now - lostFrom).Seconds()
	s.usefulSpan -= gpus * overlap(lostFrom, s.now, s.spanA, s.spanB)
	j.done += saved
	s.release(idx)
	j.phase = phasePending
	s.teamPend[j.team]++
	p := s.pendingJob(j)
	at := sort.Search(len(s.pending), func(k int) bool {
		q := &s.pending[k]
		if !q.Submit.Equal(p.Submit) {
			return q.Submit.After(p.Submit)
		}
		return q.ID > p.ID
	})
	s.pending = append(s.pending, scheduler.Job{})
	copy(s.pending[at+1:], s.pending[at:])
	s.pending[at] = p
	s.pendingAsks(p.GPUs)
}
