package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/burst"
	"github.com/allotlabs/allot/internal/metric"
	"github.com/allotlabs/allot/internal/scheduler"
	"github.com/allotlabs/allot/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
)

// ScheduleArgs asks for a scheduling cycle. Inserts coalesce: while one is
// queued or running, more are skipped (River unique jobs), and the running
// cycle re-runs itself when requests arrived meanwhile.
type ScheduleArgs struct {
	// Periodic marks the periodic cycle. River may insert it ahead of time
	// as a scheduled job; triggered cycles must not be folded into it.
	Periodic bool `json:"periodic,omitempty"`
}

// Kind names the job in River's table.
func (ScheduleArgs) Kind() string { return "schedule_cycle" }

// InsertOpts makes cycles unique while queued or running.
func (ScheduleArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: 3, UniqueOpts: river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{
		rivertype.JobStateAvailable, rivertype.JobStatePending, rivertype.JobStateRunning, rivertype.JobStateScheduled,
	}}}
}

// CycleMetrics are the scheduling loop's Prometheus metrics (package
// metric: allot_scheduling_cycle_seconds by phase, which replaces the
// single allot_schedule_cycle_seconds, allot_scheduling_cycles_total,
// allot_jobs_started_total, allot_preemptions_total, allot_job_wait_seconds).
// The queue gauges (allot_pending_jobs, allot_pending_gpu_hours, …) come
// from PostgreSQL at scrape time (metric.State), so that every worker
// reports the live queue, not the one of its own last cycle.
type CycleMetrics = metric.Scheduler

// NewCycleMetrics registers the cycle metrics on reg (nil: not registered).
func NewCycleMetrics(reg prometheus.Registerer) *CycleMetrics { return metric.NewScheduler(reg) }

// Scheduler runs scheduling cycles: load a snapshot, call the pure core,
// apply the plan in one transaction.
type Scheduler struct {
	Store  *store.Store
	Logger *slog.Logger
	// CheckpointRoot is where checkpointable jobs get ALLOT_CHECKPOINT_DIR
	// (a shared filesystem on a real cluster).
	CheckpointRoot string
	Metrics        *CycleMetrics
	// MaxStarts caps the starts one cycle applies (0: DefaultMaxStarts; <0:
	// no cap), like Slurm's sched_max_job_start: a cycle that would start
	// thousands of jobs at once (an empty cluster meeting a long queue)
	// holds its transaction, and the job and node rows agents report on,
	// for seconds. The rest wait, in priority order, for the next cycle,
	// which runs at once.
	MaxStarts int
	// DecayPeriod is how often the teams' fair-share usage is decayed and
	// brought up to now (0: DefaultDecayPeriod; <0: every cycle), Slurm's
	// PriorityCalcPeriod: between two decays the cycles rank with the
	// usage of the last one. A policy change (a new half-life) decays at
	// the next cycle, as does a worker's first cycle.
	DecayPeriod time.Duration

	// cacheMu holds what the cycles keep of the state between them.
	cacheMu     sync.Mutex
	cache       store.SchedCache
	decayed     bool  // a cycle of this scheduler decayed the usage
	decayedWith int64 // under this policy version

	rowsMu sync.Mutex
	rows   map[int64]rowCopy // what the last cycles wrote to pending jobs' rows

	learnMu sync.Mutex
	learnAt time.Time // business time of the last learning, zero: never
	learned store.RunTimeRatios

	// order is the last cycle's queue order, which makes the next cycle's
	// sort cheaper (scheduler.OrderMemory); orderMu guards it, and a cycle
	// that finds it taken sorts without it.
	orderMu sync.Mutex
	order   scheduler.OrderMemory
}

// rowCopy is what a cycle wrote to a pending job's row.
type rowCopy struct {
	class  int
	reason string
	policy int64
	at     time.Time
}

// rowRefresh is how old (in business time) a pending job's row copy of its
// priority and breakdown may grow while only they change (plus up to 5/6
// of it, by job id, to spread the rewrites): the stored queue
// (queue_cycle) has every cycle's; the rows serve the job lists.
const rowRefresh = time.Minute

// markCurrentRows sets RowCurrent on the updates whose job's row holds the
// same reason and class, under the same policy version, written less than
// rowRefresh ago; the rest are written.
func (s *Scheduler) markCurrentRows(pending []store.PendingUpdate, st store.SchedState) {
	s.rowsMu.Lock()
	defer s.rowsMu.Unlock()
	for i := range pending {
		p := &pending[i]
		c, ok := s.rows[p.JobID]
		// Spread over the next rowRefresh so that rows written by one
		// cycle (all of them, the first) are not all rewritten by another.
		limit := rowRefresh + time.Duration(p.JobID%6)*rowRefresh/6
		age := st.Now.Sub(c.at)
		p.RowCurrent = ok && c.reason == p.Reason && c.class == p.Breakdown.Class && c.policy == st.Policy.Version &&
			age >= 0 && age < limit
	}
}

// wroteRows remembers what a committed cycle wrote to the rows, and
// forgets jobs that left the queue.
func (s *Scheduler) wroteRows(pending []store.PendingUpdate, st store.SchedState) {
	s.rowsMu.Lock()
	defer s.rowsMu.Unlock()
	next := make(map[int64]rowCopy, len(pending))
	for _, p := range pending {
		if p.RowCurrent {
			next[p.JobID] = s.rows[p.JobID]
			continue
		}
		next[p.JobID] = rowCopy{class: p.Breakdown.Class, reason: p.Reason, policy: st.Policy.Version, at: st.Now}
	}
	s.rows = next
}

// Learning run times for the start forecast: the median ratio of each
// user's (else team's) last learnLast completed jobs (at least learnLeast)
// submitted within learnSince, relearned every learnEvery.
const (
	learnLast  = 20
	learnLeast = 3
	learnSince = 30 * 24 * time.Hour
	learnEvery = time.Minute
)

// expectRunTimes sets Job.Expected of snap's pending and running jobs (in
// st's order, as Snapshot makes them) to their user's, else their team's,
// learned ratio × their time limit. It only moves the start forecast
// (PendingInfo.EstStart), never a decision; a failure to learn leaves the
// forecast on time limits and is logged.
func (s *Scheduler) expectRunTimes(ctx context.Context, tx *store.Store, st store.SchedState, snap *scheduler.Snapshot) {
	s.learnMu.Lock()
	if s.learnAt.IsZero() || st.Now.Sub(s.learnAt) >= learnEvery || st.Now.Before(s.learnAt) {
		r, err := tx.RunTimeRatios(ctx, st.Now.Add(-learnSince), learnLast, learnLeast)
		if err != nil {
			if s.Logger != nil {
				s.Logger.Warn("learning run times for the start forecast", "err", err)
			}
		} else {
			s.learned, s.learnAt = r, st.Now
		}
	}
	learned := s.learned
	s.learnMu.Unlock()
	expect := func(j *allot.Job, c *scheduler.Job) {
		r, ok := learned.ByUser[j.UserID]
		if !ok {
			r, ok = learned.ByTeam[j.Team]
		}
		if ok && c.TimeLimit > 0 {
			c.Expected = max(time.Duration(r*float64(c.TimeLimit)), time.Minute)
		}
	}
	for i := range snap.Pending {
		expect(&st.Pending[i], &snap.Pending[i])
	}
	for i := range snap.Running {
		expect(&st.Running[i].Job, &snap.Running[i])
	}
}

// DefaultDecayPeriod is Scheduler.DecayPeriod's default: a minute, where
// Slurm's PriorityCalcPeriod defaults to 5. Decaying every team's usage
// sums every open allocation per team (120 to 170 ms of a 10 s cycle at
// 80,000 GPUs); within a minute the usage of a 7-day half-life moves by
// 0.007 % from decay and by what a minute of the cluster adds.
const DefaultDecayPeriod = time.Minute

// decayPeriod is the period DecayUsageEvery gets under policy p: 0 (now)
// before this scheduler's first decay and after a policy change.
func (s *Scheduler) decayPeriod(p allot.Policy) time.Duration {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	switch {
	case !s.decayed || s.decayedWith != p.Version || s.DecayPeriod < 0:
		return 0
	case s.DecayPeriod == 0:
		return DefaultDecayPeriod
	}
	return s.DecayPeriod
}

// load reads the cycle's state, with what the earlier cycles kept.
func (s *Scheduler) load(ctx context.Context, tx *store.Store) (store.SchedState, error) {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	return tx.LoadSchedStateCached(ctx, &s.cache)
}

// DefaultMaxStarts is Scheduler.MaxStarts's default.
const DefaultMaxStarts = 256

// CycleResult says what one cycle did.
type CycleResult struct {
	Ran     bool // false when another cycle held the lock
	Pending int
	// Deferred counts the starts the plan had beyond MaxStarts: they
	// wait for the next cycle, which the worker runs at once.
	Deferred int
	store.ApplyResult
	// Policy is the policy version the cycle ran with.
	Policy allot.Policy
}

// schedule runs the core on snap with the policy of st, with the kept
// queue order when no other cycle of this scheduler holds it.
func (s *Scheduler) schedule(snap scheduler.Snapshot, st *store.SchedState) scheduler.Plan {
	if s.orderMu.TryLock() {
		defer s.orderMu.Unlock()
		snap.Order = &s.order
	}
	return scheduler.Schedule(snap, st.Now, corePolicy(st.Policy, st.Tiers))
}

// Cycle runs one scheduling cycle: it brings the teams' fair-share usage
// up to now with the current policy's half-life when DecayPeriod has
// passed, loads the state (reading again only what may have changed) and
// the current policy, plans and applies the plan.
func (s *Scheduler) Cycle(ctx context.Context) (CycleResult, error) {
	var res CycleResult
	start := time.Now()
	var phase struct{ load, schedule, apply time.Duration }
	var waits []startWait
	var applied []store.PendingUpdate // the queue of the cycle, once it commits
	var appliedState store.SchedState
	var decayed bool
	var decayedWith int64
	err := s.Store.InTx(ctx, func(tx *store.Store) error {
		applied, decayed = nil, false
		ok, err := tx.TryCycleLock(ctx)
		if err != nil || !ok {
			return err
		}
		res.Ran = true
		p, err := tx.CurrentPolicy(ctx)
		if err != nil {
			return err
		}
		period := s.decayPeriod(p)
		if decayed, err = tx.DecayUsageEvery(ctx, p.HalfLife, period); err != nil {
			return err
		}
		// A decay now that had nothing to do (the usage is as of now)
		// counts too.
		decayed, decayedWith = decayed || period == 0, p.Version
		st, err := s.load(ctx, tx)
		if err != nil {
			return err
		}
		t := time.Now()
		phase.load = t.Sub(start)
		res.Policy = st.Policy
		snap, nodeNames := Snapshot(st)
		s.expectRunTimes(ctx, tx, st, &snap)
		plan := s.schedule(snap, &st)
		// The snapshot has no env (it is only needed to start): the
		// starting jobs' is read now.
		startIDs := make([]int64, len(plan.Starts))
		for i, p := range plan.Starts {
			startIDs[i] = p.JobID
		}
		envs, err := tx.PendingEnvs(ctx, startIDs)
		if err != nil {
			return err
		}
		for i := range st.Pending {
			if e, ok := envs[st.Pending[i].ID]; ok {
				st.Pending[i].Env = e
			}
		}
		starts, preempts, pending := s.orders(st, plan, nodeNames)
		starts, preempts, pending, res.Deferred = s.capStarts(starts, preempts, pending)
		s.markCurrentRows(pending, st)
		applied = pending
		appliedState = st
		res.Pending = len(st.Pending) - len(starts)
		phase.schedule = time.Since(t)
		t = time.Now()
		if res.ApplyResult, err = tx.ApplyPlan(ctx, starts, preempts, pending); err != nil {
			return err
		}
		if err := tx.RecordShares(ctx, TeamShares(plan.Shares)); err != nil {
			return err
		}
		if s.Metrics != nil {
			waits = startWaits(st, starts, preempts)
		}
		err = tx.RecordCycle(ctx, st.Now, time.Since(start), len(st.Pending), res.ApplyResult, "applied")
		phase.apply = time.Since(t)
		return err
	})
	if err == nil && applied != nil {
		s.wroteRows(applied, appliedState)
	}
	if err == nil && decayed {
		s.cacheMu.Lock()
		s.decayed, s.decayedWith = true, decayedWith
		s.cacheMu.Unlock()
	}
	if s.Metrics != nil && res.Ran {
		m := s.Metrics
		m.Cycles.Inc()
		m.CycleSeconds.WithLabelValues(metric.PhaseLoad).Observe(phase.load.Seconds())
		if phase.schedule > 0 || err == nil {
			m.CycleSeconds.WithLabelValues(metric.PhaseSchedule).Observe(phase.schedule.Seconds())
		}
		if err == nil {
			// A failed apply's time is in no phase: its transaction rolled
			// back, and the retry observes its own.
			m.CycleSeconds.WithLabelValues(metric.PhaseApply).Observe(phase.apply.Seconds())
			for _, w := range waits {
				if w.preemptReason != "" {
					m.Preemptions.WithLabelValues(w.preemptReason).Inc()
					continue
				}
				m.JobsStarted.WithLabelValues(string(w.runAs)).Inc()
				m.JobWait.WithLabelValues(string(w.tier)).Observe(w.wait.Seconds())
			}
		} else if allot.ErrorCode(err) == allot.EConflict {
			m.Stale.Inc()
		}
	}
	return res, err
}

// capStarts keeps the first MaxStarts starts of a plan (the core lists
// them in the order it placed them: priority, then backfill). The others
// stay pending, saying why, with their priority; the preemptions made
// for them are dropped too, since the next cycle plans their starts again.
func (s *Scheduler) capStarts(starts []store.StartOrder, preempts []store.PreemptOrder, pending []store.PendingUpdate) (
	[]store.StartOrder, []store.PreemptOrder, []store.PendingUpdate, int) {
	limit := s.MaxStarts
	if limit == 0 {
		limit = DefaultMaxStarts
	}
	if limit < 0 || len(starts) <= limit {
		return starts, preempts, pending, 0
	}
	deferred := map[int64]bool{}
	// They come first in the queue, in the order they were placed.
	ready := make([]store.PendingUpdate, 0, len(starts)-limit+len(pending))
	for _, o := range starts[limit:] {
		deferred[o.JobID] = true
		ready = append(ready, store.PendingUpdate{JobID: o.JobID, Priority: o.Priority, Breakdown: o.Breakdown,
			Reason: fmt.Sprintf("ready to start: the last cycle started the %d jobs ahead of it (at most %d a cycle); the next cycle starts it", limit, limit)})
	}
	pending = append(ready, pending...)
	kept := preempts[:0:0]
	for _, p := range preempts {
		if !deferred[p.By] {
			kept = append(kept, p)
		}
	}
	return starts[:limit], kept, pending, len(starts) - limit
}

// startWait is what the metrics record of one start (or, with
// preemptReason set, one preemption) of an applied plan.
type startWait struct {
	tier, runAs   allot.TierID
	wait          time.Duration
	preemptReason string
}

// startWaits lists the starts' waits (the cycle's instant − submission) and
// the preemptions' reasons. (An order ApplyPlan skips, for a job cancelled
// between the snapshot and the apply, still counts: rare, and the cycle
// lock keeps it to that one race.)
func startWaits(st store.SchedState, starts []store.StartOrder, preempts []store.PreemptOrder) []startWait {
	byID := make(map[int64]*allot.Job, len(starts))
	for i := range st.Pending {
		byID[st.Pending[i].ID] = &st.Pending[i]
	}
	out := make([]startWait, 0, len(starts)+len(preempts))
	for _, o := range starts {
		j := byID[o.JobID]
		if j == nil {
			continue
		}
		out = append(out, startWait{tier: j.Tier, runAs: o.RunAs, wait: max(st.Now.Sub(j.SubmittedAt), 0)})
	}
	for _, p := range preempts {
		out = append(out, startWait{preemptReason: metric.PreemptReason(p.Reason)})
	}
	return out
}

func tierOf(t allot.TierID) scheduler.Tier {
	if t == allot.TierPreemptible {
		return scheduler.TierPreemptible
	}
	n, _ := strconv.Atoi(string(t))
	return scheduler.Tier(n)
}

func tierID(t scheduler.Tier) allot.TierID {
	if t == scheduler.TierPreemptible {
		return allot.TierPreemptible
	}
	return allot.TierID(strconv.Itoa(int(t)))
}

// corePolicy is the core's policy: the stored weights and times, the
// tiers' class order, and the production tiers' preemption rights and
// reserved GPUs, as admins set them. (Tier 3-4 jobs preempt only to reclaim their team's
// guarantee, a right of the team's guarantee, not of the tier.)
func corePolicy(p allot.Policy, tiers []allot.Tier) scheduler.Policy {
	cp := scheduler.DefaultPolicy()
	// The admin policy picks the order inside a class: the response
	// ratio (the simulator's default, no starvation guard: continuous
	// aging serves every job) or Slurm's multifactor weights with the
	// 20-minute starvation guard, as before.
	cp.Order, cp.StarvationWait = queueOrder(p), 0
	if cp.Order == scheduler.OrderMultifactor {
		cp.StarvationWait = 20 * time.Minute
	}
	// Tier 1 oldest first (the default), or by priority like the others.
	cp.Tier1FIFO = p.Tier1FIFO
	cp.WeightFairShare, cp.WeightSize, cp.WeightAge = float64(p.WeightFairShare), float64(p.WeightSize), float64(p.WeightAge)
	cp.MaxAge, cp.HalfLife, cp.GracePeriod, cp.MinRuntime = p.MaxAge, p.HalfLife, p.GracePeriod, p.MinRuntime
	if len(tiers) > 0 {
		cp.ClassOrder, cp.MayPreempt, cp.Reserved = map[scheduler.Tier]int{}, map[scheduler.Tier][]scheduler.Tier{}, map[scheduler.Tier]int{}
		for _, t := range tiers {
			c := tierOf(t.ID)
			cp.ClassOrder[c] = t.ClassOrder
			if !t.ID.Production() {
				continue
			}
			cp.Reserved[c] = t.ReservedGPUs
			cp.MayPreempt[c] = []scheduler.Tier{}
			for _, v := range t.MayPreempt {
				cp.MayPreempt[c] = append(cp.MayPreempt[c], tierOf(v))
			}
		}
	}
	return cp
}

// queueOrder is the core's order inside a class for the policy's
// QueueOrder.
func queueOrder(p allot.Policy) scheduler.Order {
	if p.QueueOrder == allot.QueueOrderMultifactor {
		return scheduler.OrderMultifactor
	}
	return scheduler.OrderResponse
}

func coreJob(j *allot.Job) scheduler.Job {
	return scheduler.Job{ID: j.ID, Name: j.Name, Team: j.Team, User: j.User, Tier: tierOf(j.Tier), GPUs: j.GPUs, GPUType: j.GPUType,
		GPUsPerNode: j.GPUsPerNode, TimeLimit: j.TimeLimit, Submit: j.SubmittedAt, Preemptible: j.Preemptible, Checkpointable: j.Checkpointable}
}

// Snapshot converts what the store loaded into the core's input, and
// returns the node names by index.
func Snapshot(st store.SchedState) (scheduler.Snapshot, []string) {
	var snap scheduler.Snapshot
	// Sized up front: growing them by appends copied 50,000 jobs over and
	// over (a tenth of a cycle's CPU).
	if len(st.Nodes) > 0 {
		snap.Nodes = make([]scheduler.Node, 0, len(st.Nodes))
	}
	if len(st.Running) > 0 {
		snap.Running = make([]scheduler.Job, 0, len(st.Running))
	}
	if len(st.Pending) > 0 {
		snap.Pending = make([]scheduler.Job, 0, len(st.Pending))
	}
	idx := make(map[string]int, len(st.Nodes))
	names := make([]string, len(st.Nodes))
	for i, n := range st.Nodes {
		idx[n.Name], names[i] = i, n.Name
		snap.Nodes = append(snap.Nodes, scheduler.Node{Name: n.Name, GPUType: n.GPUType, GPUs: n.GPUCount, Site: n.Site, Domain: n.Domain,
			State: scheduler.NodeState(n.State)})
	}
	for _, h := range st.Held {
		if i, ok := idx[h.Node]; ok {
			snap.Nodes[i].Unavailable = append(snap.Nodes[i].Unavailable, h.GPUs...)
		}
	}
	for i := range st.Running {
		r := &st.Running[i]
		j := coreJob(&r.Job)
		j.Start = r.AllocStart
		j.RunAs = tierOf(r.Job.RunAs)
		if r.Job.RunAs == "" {
			j.RunAs = j.Tier
		}
		for _, p := range r.Parts {
			if n, ok := idx[p.Node]; ok {
				j.Placement = append(j.Placement, scheduler.Slot{Node: n, GPUs: p.GPUs})
			}
		}
		if !r.StopRequested.IsZero() {
			j.Terminating, j.GraceEnd, j.PreemptedBy = true, r.StopRequested.Add(r.Grace), r.PreemptedBy
		}
		j.LastCheckpoint = r.LastCheckpoint
		snap.Running = append(snap.Running, j)
	}
	for i := range st.Pending {
		snap.Pending = append(snap.Pending, coreJob(&st.Pending[i]))
	}
	for _, t := range st.Teams {
		g := map[string]int{}
		for typ, n := range t.Guarantees {
			g[typ] = n
		}
		budget := t.MonthlyBudgetGPUHours * 3600
		over := budget > 0 && st.MonthUsed[t.Slug]*100 >= budget*int64(st.Policy.BudgetDemotePct)
		snap.Teams = append(snap.Teams, scheduler.Team{Name: t.Slug, Weight: float64(t.FairShareWeight), Guarantee: g, Usage: st.Usage[t.Slug], OverBudget: over})
	}
	return snap, names
}

// breakdown rounds the factors to 4 decimals (and orders round the total to
// a whole number): what people see, and few enough digits that most pending
// jobs' rows stay unchanged from one cycle to the next instead of being
// rewritten every 10 s.
func breakdown(p scheduler.Priority, order scheduler.Order) allot.PriorityBreakdown {
	r := func(x float64) float64 { return math.Round(x*1e4) / 1e4 }
	b := allot.PriorityBreakdown{Class: int(p.Class), FairShare: r(p.FairShare), Size: r(p.Size), Age: r(p.Age)}
	if order == scheduler.OrderResponse {
		// Total = response ratio × max(2F, 1/32) (scheduler.Priority).
		b.Order, b.ResponseRatio = allot.QueueOrderResponse, r(p.Total/allot.FairShareMultiplier(p.FairShare))
	}
	return b
}

// roundPriority is the priority as stored and shown: a whole number under
// the multifactor order (weights in the thousands), three decimals of the
// response order's product (around 1 to 100).
func roundPriority(p scheduler.Priority, order scheduler.Order) float64 {
	if order == scheduler.OrderResponse {
		return math.Round(p.Total*1e3) / 1e3
	}
	return math.Round(p.Total)
}

// orders turns the plan into store writes, with each lease's environment.
func (s *Scheduler) orders(st store.SchedState, plan scheduler.Plan, names []string) ([]store.StartOrder, []store.PreemptOrder, []store.PendingUpdate) {
	jobs := map[int64]*allot.Job{}
	for i := range st.Pending {
		jobs[st.Pending[i].ID] = &st.Pending[i]
	}
	host := map[string]string{}
	for _, n := range st.Nodes {
		host[n.Name] = n.Hostname
		if n.Hostname == "" {
			host[n.Name] = n.Name
		}
	}
	order := queueOrder(st.Policy)
	var starts []store.StartOrder
	for _, p := range plan.Starts {
		j := jobs[p.JobID]
		if j == nil {
			continue
		}
		o := store.StartOrder{JobID: j.ID, RunAs: tierID(p.RunAs), Priority: roundPriority(p.Priority, order), Breakdown: breakdown(p.Priority, order)}
		if j.Checkpointable {
			o.CheckpointDir = strings.TrimRight(s.CheckpointRoot, "/") + fmt.Sprintf("/job-%d", j.ID)
		}
		master := host[names[p.Placement[0].Node]]
		for rank, slot := range p.Placement {
			env := map[string]string{}
			for k, v := range j.Env {
				env[k] = v
			}
			gpus := make([]string, len(slot.GPUs))
			for i, g := range slot.GPUs {
				gpus[i] = strconv.Itoa(g)
			}
			env["CUDA_VISIBLE_DEVICES"] = strings.Join(gpus, ",")
			env["ALLOT_JOB_ID"] = strconv.FormatInt(j.ID, 10)
			env["ALLOT_JOB_NAME"] = j.Name
			env["ALLOT_TEAM"] = j.Team
			env["ALLOT_TIER"] = string(o.RunAs)
			env["ALLOT_SEGMENT"] = strconv.Itoa(j.Segment + 1)
			if o.CheckpointDir != "" {
				env["ALLOT_CHECKPOINT_DIR"] = o.CheckpointDir
			}
			env["MASTER_ADDR"] = master
			env["MASTER_PORT"] = strconv.Itoa(29500 + int(j.ID%1000))
			env["WORLD_SIZE"] = strconv.Itoa(j.GPUs)
			env["NODE_RANK"] = strconv.Itoa(rank)
			env["RANK"] = strconv.Itoa(rank)
			env["ALLOT_NNODES"] = strconv.Itoa(len(p.Placement))
			env["LOCAL_WORLD_SIZE"] = strconv.Itoa(len(slot.GPUs))
			o.Parts = append(o.Parts, store.LeasePart{Node: names[slot.Node], Rank: rank, GPUs: slot.GPUs, Env: env})
		}
		starts = append(starts, o)
	}
	var preempts []store.PreemptOrder
	for _, p := range plan.Preemptions {
		preempts = append(preempts, store.PreemptOrder{JobID: p.JobID, By: p.By, Reason: p.Reason, Grace: st.Policy.GracePeriod})
	}
	over := map[string]bool{}
	for _, t := range st.Teams {
		budget := t.MonthlyBudgetGPUHours * 3600
		over[t.Slug] = budget > 0 && st.MonthUsed[t.Slug]*100 >= budget*int64(st.Policy.BudgetDemotePct)
	}
	pending := make([]store.PendingUpdate, 0, len(plan.Pending))
	for _, p := range plan.Pending {
		reason := p.Reason
		if j := jobs[p.JobID]; j != nil && over[j.Team] && !j.Preemptible && (j.Tier == allot.Tier3 || j.Tier == allot.Tier4) {
			reason = fmt.Sprintf("team %s is over %d %% of its monthly budget, so this tier-%s job runs as preemptible (idle GPUs only, may be stopped, 70 %% cheaper) until the month ends; ",
				j.Team, st.Policy.BudgetDemotePct, j.Tier) + reason
		}
		pending = append(pending, store.PendingUpdate{JobID: p.JobID, Priority: roundPriority(p.Priority, order), Breakdown: breakdown(p.Priority, order), Reason: reason,
			EstStart: p.EstStart, EstKind: EstKind(p)})
	}
	return starts, preempts, pending
}

// ScheduleWorker works ScheduleArgs: cycles until no request arrived
// during the last one.
type ScheduleWorker struct {
	river.WorkerDefaults[ScheduleArgs]
	Scheduler *Scheduler
	// Tick is the period of the periodic ScheduleArgs: how often the
	// worker looks whether the policy's Cycle has passed since the last
	// cycle (default 1 s).
	Tick time.Duration
	// Burst says whether cloud burst is on: a policy change of its
	// thresholds then asks for a burst evaluation at once.
	Burst bool
	// MinInterval is the least time between the starts of two cycles of
	// this worker (like Slurm's sched_min_interval): while submissions
	// keep asking for cycles, one runs at most every MinInterval and each
	// takes all the requests that came meanwhile, instead of cycles over a
	// large queue running back to back and taking a core from heartbeats
	// and submissions. Starts asked for at once are spaced out one after
	// the other (spaceOut). 0: none.
	MinInterval time.Duration
	// Duty is the most of the time this worker's cycles may take while
	// requests keep coming (0 < Duty < 1; 0 or 1: no limit): after a cycle
	// that took d, the next starts no sooner than d × (1 − Duty) / Duty
	// after it ended (at most MaxMinCycleInterval). It scales with the
	// queue, where MinInterval does not: on a small cluster a cycle of
	// 10 ms delays the next by 10 ms at most (Duty 0.5), while cycles of
	// 400 ms over 40,000 pending jobs no longer run back to back and take
	// a core from heartbeats and submissions.
	Duty float64

	mu        sync.Mutex
	policy    *allot.Policy // the policy of this worker's last cycle
	lastCycle time.Time     // when this worker's last cycle started, or is to start (spaceOut reserves it; real time)
	lastEnd   time.Time     // when this worker's last cycle that ran ended (real time)
	lastTook  time.Duration // how long it took
}

// spaceOut waits until MinInterval has passed since this worker's last
// cycle started, and Duty's rest since the last one ended, and records
// the cycle about to start. Each caller
// reserves its start under the lock before it waits (the later of now and
// the last reserved start plus MinInterval), so two that ask at once (a
// periodic job and a requested one) start MinInterval apart, not together.
// It is false when ctx ended first. rest false skips Duty's rest (a cycle
// that continues its predecessor's deferred starts).
func (w *ScheduleWorker) spaceOut(ctx context.Context, rest bool) bool {
	now := time.Now() // real time: a pause, not business time
	w.mu.Lock()
	prev, start := w.lastCycle, w.earliest(now, rest)
	w.lastCycle = start
	w.mu.Unlock()
	if wait := start.Sub(now); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			// Give the slot back unless a later caller reserved after it.
			w.mu.Lock()
			if w.lastCycle.Equal(start) {
				w.lastCycle = prev
			}
			w.mu.Unlock()
			return false
		case <-t.C:
		}
	}
	return true
}

// earliest is when a cycle asked for at now may start (w.mu held); rest:
// with Duty's rest.
func (w *ScheduleWorker) earliest(now time.Time, rest bool) time.Time {
	start := now
	if w.MinInterval > 0 && !w.lastCycle.IsZero() {
		start = later(start, w.lastCycle.Add(w.MinInterval))
	}
	if rest && w.Duty > 0 && w.Duty < 1 && !w.lastEnd.IsZero() {
		// In floating point first: a tiny Duty would overflow a Duration.
		r := MaxMinCycleInterval
		if f := float64(w.lastTook) * (1 - w.Duty) / w.Duty; f < float64(MaxMinCycleInterval) {
			r = time.Duration(f)
		}
		start = later(start, w.lastEnd.Add(r))
	}
	return start
}

// ranFor records a cycle that began at began and has just ended, for
// Duty's rest.
func (w *ScheduleWorker) ranFor(began time.Time) {
	end := time.Now() // real time
	w.mu.Lock()
	w.lastEnd, w.lastTook = end, end.Sub(began)
	w.mu.Unlock()
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// due says whether a periodic cycle should run now: the current policy's
// Cycle has passed since the last cycle started (within half a tick, so
// that a period that is a whole number of ticks is kept, not rounded up
// by one tick), or no cycle ran yet.
func (w *ScheduleWorker) due(ctx context.Context) (bool, error) {
	st := w.Scheduler.Store
	p, err := st.CurrentPolicy(ctx)
	if err != nil {
		return false, err
	}
	last, err := st.LastCycleAt(ctx)
	if err != nil || last.IsZero() {
		return err == nil, err
	}
	tick := w.Tick
	if tick <= 0 {
		tick = time.Second
	}
	return st.Now().Sub(last) >= p.Cycle-tick/2, nil
}

// followUps asks, after a cycle that ran with a new policy version, for
// the work whose settings changed with it to run now instead of at its
// next period: a budget check for the budget thresholds, a burst
// evaluation for the burst settings. (Everything else the policy sets is
// read by each cycle, heartbeat or sweep.)
func (w *ScheduleWorker) followUps(ctx context.Context, p allot.Policy) error {
	w.mu.Lock()
	prev := w.policy
	w.policy = &p
	w.mu.Unlock()
	if prev == nil || prev.Version == p.Version {
		return nil
	}
	var args []river.JobArgs
	if prev.BudgetWarnPct != p.BudgetWarnPct || prev.BudgetDemotePct != p.BudgetDemotePct {
		args = append(args, BudgetCheckArgs{})
	}
	if w.Burst && burst.FromPolicy(*prev) != burst.FromPolicy(p) {
		args = append(args, BurstEvaluateArgs{})
	}
	if len(args) == 0 {
		return nil
	}
	client := river.ClientFromContext[pgx.Tx](ctx)
	for _, a := range args {
		if _, err := client.Insert(ctx, a, nil); err != nil {
			return fmt.Errorf("asking for %s after policy version %d: %w", a.Kind(), p.Version, err)
		}
	}
	return nil
}

// Timeout lets Work run its cycles past River's default job timeout (1
// min): 50 cycles over a large queue, each followed by Duty's rest, can
// take longer, and a timeout would cancel the cycle in flight (its plan
// rolled back) and retry the whole job.
func (w *ScheduleWorker) Timeout(*river.Job[ScheduleArgs]) time.Duration { return 15 * time.Minute }

// Work runs cycles until no request arrived during the last one. The last
// check and the job's completion share one transaction: River completes
// jobs asynchronously, and a request folded into this job while it is
// finishing would otherwise be lost until the next periodic cycle. With the
// completion committed together with the check, a concurrent insert either
// came before the check (and is seen) or waits for the commit and then
// inserts a new job.
//
// A periodic job (Args.Periodic) runs a cycle only when one is due (see
// due); otherwise it completes without one.
func (w *ScheduleWorker) Work(ctx context.Context, job *river.Job[ScheduleArgs]) error {
	st := w.Scheduler.Store
	if job.Args.Periodic {
		if due, err := w.due(ctx); err != nil || !due {
			return err
		}
	}
	deferred := false
	for tries := 0; tries < 50; tries++ {
		if !w.spaceOut(ctx, !deferred) {
			return ctx.Err()
		}
		deferred = false
		seen, err := st.LastScheduleRequest(ctx)
		if err != nil {
			return err
		}
		began := time.Now() // real time, as spaceOut's
		res, err := w.Scheduler.Cycle(ctx)
		if res.Ran {
			w.ranFor(began)
		}
		if code := allot.ErrorCode(err); code == allot.EConflict || code == allot.EUnavailable {
			w.Scheduler.Logger.Info("scheduling plan was stale; retrying", "err", err)
			continue
		}
		if err != nil {
			return err
		}
		if !res.Ran {
			return nil // another cycle holds the lock; it re-checks the requests when it ends
		}
		if err := w.followUps(ctx, res.Policy); err != nil {
			w.Scheduler.Logger.Warn("policy changed, but its follow-up work was not queued; it runs at its next period", "err", err)
		}
		if res.Deferred > 0 && res.Started > 0 {
			// More starts are ready: the next cycle runs at once (once
			// MinInterval has passed, when set; without Duty's rest, which
			// would halve how fast a backlog of starts drains), and does
			// not count against the requests' bound below.
			tries--
			deferred = true
			continue
		}
		done := false
		err = st.InPgxTx(ctx, func(tx pgx.Tx, s *store.Store) error {
			now, err := s.LastScheduleRequest(ctx)
			if err != nil || now != seen {
				return err
			}
			if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
				return err
			}
			done = true
			return nil
		})
		if err != nil || done {
			return err
		}
	}
	return errors.New("scheduling requests kept arriving for 50 cycles in a row")
}
