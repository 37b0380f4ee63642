package scheduler

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// Per-cycle work caps (see the package doc).
const (
	// maxPreemptAttempts bounds the blocked jobs per cycle that look for
	// victims (each look costs O(nodes + running jobs)).
	maxPreemptAttempts = 8
	// detailedReasons bounds the blocked jobs per cycle, beyond those holding
	// a reservation, that get a pending reason with an estimated start.
	detailedReasons = 16
	// maxStarvationResv bounds the extra reservations of Policy.StarvationWait.
	maxStarvationResv = 8
	// guaranteeLostRatio: see tryPreempt.
	guaranteeLostRatio = 0.03
)

// Schedule computes one scheduling cycle. It is a pure function of its
// arguments and never mutates s. A Policy with an empty Mode is ModeAllot;
// zero weights (all three) and a zero MaxAge take DefaultPolicy's values.
func Schedule(s Snapshot, now time.Time, p Policy) Plan {
	d := DefaultPolicy()
	if p.Mode == "" {
		p.Mode = ModeAllot
	}
	if p.WeightFairShare == 0 && p.WeightSize == 0 && p.WeightAge == 0 {
		p.WeightFairShare, p.WeightSize, p.WeightAge = d.WeightFairShare, d.WeightSize, d.WeightAge
	}
	if p.MaxAge <= 0 {
		p.MaxAge = d.MaxAge
	}
	st := newState(&s, now, p)
	if st.idleCycle() {
		st.release()
		return Plan{Idle: true}
	}
	st.preparePendingAll()
	switch p.Mode {
	case ModeFIFO:
		st.runFIFO()
	case ModeEASY:
		st.runEASY()
	case ModeFIFOPartitioned:
		st.runPartitioned()
	default:
		st.runAllot()
	}
	st.finish()
	plan := st.plan
	st.release()
	return plan
}

// idleCycle reports whether this cycle provably starts and preempts
// nothing, so that a caller that reads nothing else (Policy.NoPendingInfo
// without EstimateFor: the simulator) can skip it: ModeAllot, no GPU free
// on any usable node, no job in its grace period, and no pending job that
// could preempt. A job may preempt when it has the right (a production
// class: any research work; a research job of a team that would stay
// within its guarantee: work above guarantees) and a running job it could
// take has passed the minimum runtime.
//
// What a cycle does before such a job's turn cannot give it a victim it
// lacked at the start: with no GPU free nothing starts; a research job
// with the right reserves GPUs (counted against its team's guarantee) only
// while its team stays within its guarantee, so none of that team's jobs
// becomes work above guarantees; a production job's reservation may push
// its team above, but a production job waiting with any victim at all
// makes the cycle run anyway. A preemptor in flight (its victims in their
// grace period) reserves the GPUs coming free without that check, which
// can make a victim of its team's other jobs: hence no job in its grace
// period. Starved-team preemption (Policy.StarvedTeamPreempt) gives rights
// this test does not know, and HoldReservations carries each cycle's
// reservations to the next: with either, every cycle runs. The guarantee
// patience and admins' narrowed rights are ignored, which errs on the side
// of running the cycle. An idle cycle's reservations are not computed.
//
// On a replay far past its cluster nearly every periodic cycle is such a
// cycle, and ordering a queue of thousands was all of its cost.
func (st *state) idleCycle() bool {
	p := &st.p
	if p.Mode != ModeAllot || !p.NoPendingInfo || len(p.EstimateFor) > 0 || p.HoldReservations || p.StarvedTeamPreempt ||
		st.free > 0 || len(st.s.Pending) == 0 || st.terminating() {
		return false
	}
	// The victims a preemptor could take: any research work past the
	// minimum runtime (tier 1-2), or only work above guarantees.
	anyVictim, aboveVictim := false, false
	for i := range st.runs() {
		if g := st.victimGroup(&st.runs()[i], vgAnyResearch); g >= 0 {
			anyVictim = true
			if g <= vgAboveGuarantee {
				aboveVictim = true
				break
			}
		}
	}
	lastTeam, ti, t := "", -1, (*Team)(nil)
	for i := range st.s.Pending {
		j := &st.s.Pending[i]
		if j.GPUs <= 0 {
			return false
		}
		if i == 0 || j.Team != lastTeam {
			lastTeam = j.Team
			ti, t = st.team(j.Team)
		}
		switch c := effClass(j, t); {
		case c.Production() && anyVictim:
			return false
		case c.Research() && aboveVictim && ti >= 0 && st.teams[ti].alloc+j.GPUs <= st.teams[ti].guarantee:
			return false
		}
	}
	return true
}

func (st *state) preparePendingAll() {
	s := st.s
	st.pend = resize(st.pend, len(s.Pending))
	st.order = resize(st.order, len(s.Pending))
	lastTeam, ti, t := "", -1, (*Team)(nil)
	pred := st.predicted()
	waitBoost := st.p.Mode == ModeAllot && st.p.Order == OrderResponse && (st.p.TeamWaitBoost || st.p.StarvedTeamPreempt)
	for i := range s.Pending {
		j := &s.Pending[i]
		pj := &st.pend[i]
		if i == 0 || j.Team != lastTeam {
			lastTeam = j.Team
			ti, t = st.team(j.Team)
		}
		*pj = pjob{idx: i, j: j, team: ti, class: effClass(j, t), resv: -1}
		pj.limit = never
		if j.TimeLimit > 0 {
			pj.limit = int64(j.TimeLimit)
		}
		pj.run = pj.limit
		if pred && j.Predicted > 0 {
			pj.run = min(int64(j.Predicted), pj.limit)
		}
		pj.submit = min(rel(j.Submit, st.now), 0)
		if j.Submit.IsZero() {
			pj.submit = 0
		}
		owner := -1
		if st.p.Mode == ModeFIFOPartitioned {
			owner = ti
			if ti < 0 {
				owner = -2 // matches no pool
			}
		}
		st.preparePending(pj, owner)
		if waitBoost && ti >= 0 && !pj.never && pj.class.Research() {
			st.teams[ti].waitSum += float64(-pj.submit)
			st.teams[ti].waitN++
		}
		st.order[i] = pj
	}
	if st.p.Mode == ModeAllot {
		if waitBoost {
			st.teamWaitBoosts()
		}
		// Class, then priority, then submit time, then id. Sorting compact
		// keys by value is several times faster than chasing pointers.
		keys := st.s.Order.buf(len(st.pend), &st.keyBuf)
		for i := range st.pend {
			pj := &st.pend[i]
			keys[i] = orderKey{class: st.classRank(pj.class), prio: st.priorityTotal(pj), submit: pj.submit, id: pj.j.ID, idx: i}
			if pj.class == Tier1 && st.p.Tier1FIFO {
				keys[i].prio = 0 // oldest first
			}
			if pj.j.Reserved && st.p.HoldReservations {
				keys[i].held = 1
			}
		}
		keys = st.s.Order.sortOrder(keys)
		for i, k := range keys {
			st.order[i] = &st.pend[k.idx]
		}
	} else {
		if !slices.IsSortedFunc(st.order, cmpFIFO) {
			slices.SortFunc(st.order, cmpFIFO)
		}
	}
}

// classRank is the queue position of class c (Policy.ClassOrder).
func (st *state) classRank(c Tier) Tier {
	if r, ok := st.p.ClassOrder[c]; ok {
		return Tier(r)
	}
	return c
}

// cmpFIFO orders by submit time, then id.
func cmpFIFO(a, b *pjob) int {
	return cmp.Or(cmp.Compare(a.submit, b.submit), cmp.Compare(a.j.ID, b.j.ID))
}

type orderKey struct {
	class  Tier
	held   int // Job.Reserved under Policy.HoldReservations
	prio   float64
	submit int64
	id     int64
	idx    int
}

// shapeKey identifies jobs that place alike; a failed placement of one
// shape fails for every later job of that shape with a run (pjob.run: the
// time limit, or the predicted run time) at least as long, since capacity
// only shrinks during a cycle.
type shapeKey struct {
	gpus    int
	q       int
	gpuType string
	prod    bool
}

// runAllot is ModeAllot's cycle:
//  1. order pending jobs by class, priority, submit time, id;
//  2. start each job that fits now without delaying any reservation
//     (backfill when an earlier job holds a reservation);
//  3. a blocked tier-1/2 job, or one of a team under its guarantee, waits if
//     GPUs come free within one grace period, else preempts and reserves
//     the GPUs it freed;
//  4. the first ReservationDepth blocked jobs per class get a reservation
//     at the earliest time they fit by time limits.
func (st *state) runAllot() {
	depth := max(st.p.ReservationDepth, 1)
	var resvPerClass [TierPreemptible + 1]int
	failed := map[shapeKey]int64{}
	attempts := 0
	// Preemptors whose victims are still in their grace period come first:
	// they start, or reserve the GPUs coming free, before anyone else.
	// Under Policy.Tier1FIFO tier-1 preemptors are no exception: tier 1
	// comes first anyway, oldest first, so that the GPUs a tier-1 job's
	// victims free are not taken, the moment they are free, by a younger
	// tier-1 preemptor whose own victims are still in their grace period
	// (the older job is no longer "in flight" then); the others come first
	// right after tier 1.
	var preemptors map[int64]bool
	if st.terminating() {
		for i := range st.runs() {
			if r := &st.runs()[i]; r.term && r.j.PreemptedBy != 0 {
				if preemptors == nil {
					preemptors = map[int64]bool{}
				}
				preemptors[r.j.PreemptedBy] = true
			}
		}
	}
	fifo1 := st.p.Tier1FIFO
	if preemptors != nil {
		for _, pj := range st.order {
			if !pj.never && preemptors[pj.j.ID] {
				pj.inflight = true
			}
		}
	}
	servedEarly := preemptors == nil
	serveInflight := func() {
		servedEarly = true
		for _, pj := range st.order {
			if !pj.inflight || (fifo1 && pj.class == Tier1) {
				continue
			}
			pj.early = true
			if cl := st.place(pj, nil); cl != nil {
				st.commit(pj, cl, false)
				continue
			}
			if r := st.resvSweep(pj); r.ok {
				st.reserve(pj, r)
				if pj.team >= 0 {
					st.teams[pj.team].alloc += pj.j.GPUs
				}
			}
		}
	}
	if !fifo1 && !servedEarly {
		serveInflight()
	}
	// Starvation guard: the longest-waiting blocked research jobs (class
	// 3-4, waiting at least StarvationWait) come right after the
	// production classes: they start if they fit, else reserve the
	// earliest nodes they fit on, ahead of every other research job. A
	// reservation made later in the cycle would constrain nothing: each
	// cycle starts from scratch and would let newer, higher-priority jobs
	// take the GPUs first again.
	var starving []*pjob
	if st.p.StarvationWait > 0 {
		// Oldest first: sort compact keys, then pick the jobs.
		type fifoKey struct {
			submit, id int64
			pj         *pjob
		}
		var keys []fifoKey
		for _, pj := range st.order {
			if pj.never || pj.inflight || !pj.class.Research() || -pj.submit < int64(st.p.StarvationWait) {
				continue
			}
			keys = append(keys, fifoKey{pj.submit, pj.j.ID, pj})
		}
		slices.SortFunc(keys, func(a, b fifoKey) int {
			if a.submit != b.submit {
				return cmp.Compare(a.submit, b.submit)
			}
			return cmp.Compare(a.id, b.id)
		})
		starving = make([]*pjob, len(keys))
		for i, k := range keys {
			starving[i] = k.pj
		}
		st.starving = starving
	}
	// While a starving job is blocked, research jobs outside the guard do
	// not reclaim guarantees by preemption: when the grace period ends the
	// GPUs they freed would go to the starving jobs first, and the
	// preemptor would preempt again (on the loaded Philly window one
	// 32-GPU job preempted 1,981 times that way). Starving jobs with the
	// right to preempt may, in FIFO order (see tryPreempt for the victims
	// they may take).
	starved, blockedStarving := len(starving) == 0, false
	serveStarving := func() {
		starved = true
		nresv := 0
		for _, pj := range starving {
			pj.starving = true
			key := shapeKey{pj.j.GPUs, pj.q, pj.j.GPUType, false}
			if st.free >= pj.j.GPUs {
				if lim, seen := failed[key]; !seen || pj.run < lim {
					if cl := st.place(pj, nil); cl != nil {
						st.commit(pj, cl, len(st.resvs) > 0)
						continue
					}
					failed[key] = pj.run
				}
			}
			blockedStarving = true
			if st.tryPreempt(pj, &attempts) {
				continue
			}
			if nresv < maxStarvationResv {
				nresv++
				if r := st.resvSweep(pj); r.ok {
					st.reserve(pj, r)
				}
			}
		}
	}
	for _, pj := range st.order {
		if !servedEarly && pj.class != Tier1 {
			serveInflight()
		}
		if !starved && pj.class >= Tier3 {
			serveStarving()
		}
		if pj.never || pj.early || pj.starving {
			continue
		}
		if pj.inflight { // a tier-1 preemptor under Tier1FIFO, in its turn
			if cl := st.place(pj, nil); cl != nil {
				st.commit(pj, cl, false)
				continue
			}
			// Its victims' GPUs, or earlier ones, unless an older tier-1
			// job took them: then it may preempt again.
			if r := st.sweep(pj, int64(st.p.GracePeriod)); r.ok {
				st.reserve(pj, r)
				if pj.team >= 0 {
					st.teams[pj.team].alloc += pj.j.GPUs
				}
				continue
			}
			if st.tryPreempt(pj, &attempts) {
				continue
			}
			if r := st.resvSweep(pj); r.ok {
				st.reserve(pj, r)
			}
			continue
		}
		key := shapeKey{pj.j.GPUs, pj.q, pj.j.GPUType, pj.class.Production()}
		if st.free >= pj.j.GPUs {
			if lim, seen := failed[key]; !seen || pj.run < lim {
				if cl := st.place(pj, nil); cl != nil {
					st.commit(pj, cl, len(st.resvs) > 0)
					continue
				}
				failed[key] = pj.run
			}
		}
		if pj.class == TierPreemptible {
			continue // idle GPUs only: no reservation, no preemption
		}
		if (pj.class.Production() || !blockedStarving) && st.tryPreempt(pj, &attempts) {
			continue
		}
		if resvPerClass[pj.class] < depth {
			resvPerClass[pj.class]++
			if r := st.resvSweep(pj); r.ok {
				st.reserve(pj, r)
			}
		}
	}
	if !servedEarly {
		serveInflight()
	}
	if !starved {
		serveStarving()
	}
}

// tryPreempt lets a blocked job with a right to preempt (see
// preemptRight) either reserve GPUs coming free within one grace period or
// preempt victims and reserve the GPUs they free. It reports whether pj
// now holds a reservation. At most maxPreemptAttempts jobs try per cycle.
func (st *state) tryPreempt(pj *pjob, attempts *int) bool {
	mg := st.preemptRight(pj)
	if mg < 0 || *attempts >= maxPreemptAttempts {
		return false
	}
	*attempts++
	grace := int64(st.p.GracePeriod)
	// Only look one grace period ahead: GPUs coming free by then (from
	// earlier preemptions, say) make preempting pointless.
	if r := st.sweep(pj, grace); r.ok {
		st.reserve(pj, r)
		if pj.team >= 0 {
			st.teams[pj.team].alloc += pj.j.GPUs
		}
		return true
	}
	// A team reclaiming its guarantee preempts only when the work lost is
	// worth it: at most the GPU time the job would otherwise wait (by
	// time limits), times guaranteeLostRatio.
	maxLost := math.Inf(1)
	if !pj.class.Production() {
		maxLost = 0
		if r := st.sweep(pj, never); r.ok {
			maxLost = float64(r.at-grace) / 1e9 * float64(pj.j.GPUs) * guaranteeLostRatio
		} else {
			maxLost = math.Inf(1)
		}
	}
	// A victim requeued (with its original submit time) must not come
	// before the preemptor when the grace period ends, or it takes the
	// freed GPUs back and the preemptor preempts again: a starving
	// preemptor (served oldest first) takes only work submitted after its
	// own job, any other research job only work that will not be starving
	// by then. Production classes come first anyway.
	st.victimAfter, st.victimBelow = noVictimLimit, math.Inf(1)
	if !pj.class.Production() {
		if pj.starving || pj.starvedTeam {
			st.victimAfter = pj.submit
		} else if w := int64(st.p.StarvationWait); w > 0 {
			st.victimAfter = grace - w
		}
		// Under the response order a requeued victim keeps its original
		// submit time: one that waited or ran long would come back ahead
		// of the preemptor, take the freed GPUs back at the grace end and
		// be preempted again once past MinRuntime (a livelock: a replay
		// never tuned on preempted one 8-GPU job over 100 times). Only
		// victims that come back behind the preemptor qualify.
		if st.p.Order == OrderResponse && st.p.Mode == ModeAllot {
			st.victimBelow = st.responsePriority(pj.j, pj.team, pj.class, pj.maxCap, -pj.submit+grace)
		}
	}
	ok := st.preempt(pj, mg, maxLost)
	st.victimAfter, st.victimBelow = noVictimLimit, math.Inf(1)
	if ok {
		if r := st.resvSweep(pj); r.ok {
			st.reserve(pj, r)
		}
		return true
	}
	return false
}

// runFIFO is strict FIFO: jobs in submit order start while they fit; the
// first that does not blocks all behind it.
func (st *state) runFIFO() {
	var head *pjob
	for _, pj := range st.order {
		if pj.never {
			continue
		}
		if head == nil && st.free >= pj.j.GPUs {
			if cl := st.place(pj, nil); cl != nil {
				st.commit(pj, cl, false)
				continue
			}
		}
		if head == nil {
			head = pj
		}
	}
	st.head = head
}

// runEASY is FIFO with EASY backfill: the first blocked job (the head) gets
// a reservation at the earliest time enough GPUs are free by running jobs'
// time limits, counted cluster-wide ("shadow time"); a later job starts now
// if it fits and either ends by the shadow time or uses no more than the
// GPUs left over at the shadow time ("extra").
func (st *state) runEASY() {
	var head *pjob
	var shadow int64
	extra := 0
	for _, pj := range st.order {
		if pj.never {
			continue
		}
		if head == nil {
			if st.free >= pj.j.GPUs {
				if cl := st.place(pj, nil); cl != nil {
					st.commit(pj, cl, false)
					continue
				}
			}
			head = pj
			shadow, extra = st.shadow(pj)
			if shadow != never {
				pj.resv = 0
				st.plan.Reservations = append(st.plan.Reservations, Reservation{JobID: pj.j.ID, At: abs(shadow, st.now)})
			}
			continue
		}
		if st.free == 0 {
			continue
		}
		end := pj.limit
		if end > shadow && pj.j.GPUs > extra {
			continue
		}
		if cl := st.place(pj, nil); cl != nil {
			st.commit(pj, cl, true)
			if end > shadow {
				extra -= pj.j.GPUs
			}
		}
	}
	st.head = head
}

// shadow returns EASY's shadow time and extra GPUs for the head job,
// counting GPUs on the nodes it may use.
func (st *state) shadow(pj *pjob) (int64, int) {
	mask := make([]bool, len(st.pools))
	for _, pi := range pj.elig {
		mask[pi] = true
	}
	avail := 0
	for _, pi := range pj.elig {
		for _, n := range st.pools[pi].nodes {
			avail += st.nodes[n].free
		}
	}
	g := pj.j.GPUs
	if avail >= g {
		return 0, avail - g
	}
	type rel struct {
		at   int64
		id   int64
		gpus int
	}
	var rs []rel
	count := func(slots []Slot) int {
		k := 0
		for _, sl := range slots {
			if sl.Node >= 0 && sl.Node < len(st.nodes) && st.nodes[sl.Node].pool >= 0 && mask[st.nodes[sl.Node].pool] {
				k += len(sl.GPUs)
			}
		}
		return k
	}
	for i := range st.runs() {
		r := &st.runs()[i]
		if r.end == never {
			continue
		}
		if k := count(r.j.Placement); k > 0 {
			rs = append(rs, rel{r.end, r.j.ID, k})
		}
	}
	for i := range st.starts {
		if e := st.starts[i].end; e != never {
			rs = append(rs, rel{e, st.starts[i].p.j.ID, count(st.starts[i].slots)})
		}
	}
	slices.SortFunc(rs, func(a, b rel) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.id, b.id)) })
	for _, r := range rs {
		avail += r.gpus
		if avail >= g {
			return r.at, avail - g
		}
	}
	return never, 0
}

// runPartitioned is strict FIFO per team on the team's own nodes (see
// partition), never above its guarantee.
func (st *state) runPartitioned() {
	blocked := make([]bool, len(st.teams))
	for _, pj := range st.order {
		if pj.never || pj.team < 0 || blocked[pj.team] {
			continue
		}
		t := &st.teams[pj.team]
		if t.alloc+pj.j.GPUs > t.guarantee {
			if pj.j.GPUs > t.guarantee {
				pj.never = true
				continue
			}
			blocked[pj.team] = true
			pj.blocker = "team at its guarantee"
			continue
		}
		if cl := st.place(pj, nil); cl != nil {
			st.commit(pj, cl, false)
			continue
		}
		blocked[pj.team] = true
	}
}
