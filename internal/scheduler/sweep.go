package scheduler

import (
	"cmp"
	"slices"
)

// evKind is what an event is; sortEvents keys it in two bits, so there
// are at most four.
type evKind uint8

const (
	evRun     evKind = iota // a running job reaches its time limit
	evGrace                 // a preempted job's grace period ends
	evStart                 // a job started this cycle reaches its time limit
	evPhantom               // a reserved job's (projected) run ends
)

// event is a projected GPU release.
type event struct {
	at   int64
	kind evKind
	idx  int // into state.run, state.starts or state.resvs
	id   int64
}

func cmpEvent(a, b event) int {
	switch {
	case a.at != b.at:
		return cmp.Compare(a.at, b.at)
	case a.kind != b.kind:
		return cmp.Compare(a.kind, b.kind)
	}
	return cmp.Compare(a.id, b.id)
}

// sweepResult is the earliest time a job fits, by time limits.
type sweepResult struct {
	ok     bool
	at     int64
	claims []Claim
	spares []int // GPUs of each claimed node left for others at `at`
	cause  event
	causeN bool // cause is meaningful (the job did not fit at once)
	pred   bool // by predicted ends (sweepBy)
}

func (st *state) sortRunEvents() {
	if st.runSorted {
		return
	}
	st.runSorted = true
	st.runEvents, st.runRel, st.runRelOff = st.buildRunEvents(false, st.runEvents, st.runRel, st.runRelOff)
}

// sortPredEvents is sortRunEvents with running jobs ending at their
// predicted ends (Policy.PredictedBackfill, predictedEnd).
func (st *state) sortPredEvents() {
	if st.predSorted {
		return
	}
	st.predSorted = true
	st.predEvents, st.predRel, st.predRelOff = st.buildRunEvents(true, st.predEvents, st.predRel, st.predRelOff)
}

// buildRunEvents fills evs (sorted) with the running jobs' releases, at
// their time limits (grace ends), or with pred at their predicted ends,
// and rel/off with the GPUs each releases per node.
func (st *state) buildRunEvents(pred bool, evs []event, rels []nodeRel, off []int32) ([]event, []nodeRel, []int32) {
	evs, rels = evs[:0], rels[:0]
	runs := st.runs()
	// Each job's releases first, in the running jobs' order: the
	// placements are read in the order they lie in memory, and the sorted
	// pass below copies from this compact list.
	byRun, byRunOff := st.relTmp[:0], resize(st.relTmpOff, len(runs)+1)
	for i := range runs {
		r := &runs[i]
		byRunOff[i] = int32(len(byRun))
		if r.end == never || r.victim {
			continue
		}
		k := evRun
		if r.term {
			k = evGrace
		}
		at := r.end
		if pred && !r.term {
			at = st.predictedEnd(r)
		}
		evs = append(evs, event{at: at, kind: k, idx: i, id: r.j.ID})
		for _, sl := range r.j.Placement {
			if sl.Node >= 0 && sl.Node < len(st.nodes) && len(sl.GPUs) > 0 {
				byRun = append(byRun, nodeRel{node: int32(sl.Node), gpus: int32(len(sl.GPUs))})
			}
		}
	}
	byRunOff[len(runs)] = int32(len(byRun))
	st.relTmp, st.relTmpOff = byRun, byRunOff
	st.evTmp = sortEvents(evs, st.evTmp)
	// Flatten the releases so that sweeps read contiguous memory.
	off = resize(off, len(evs)+1)
	for i, ev := range evs {
		rels = append(rels, byRun[byRunOff[ev.idx]:byRunOff[ev.idx+1]]...)
		off[i+1] = int32(len(rels))
	}
	return evs, rels, off
}

// predictedEnd is when running job r is predicted to end for
// reservations and backfill (Policy.PredictedBackfill): Start +
// Job.Predicted, capped at its time limit; a job that has run that long
// and still runs is predicted twice as long, again, until the end is
// after now (at most its time limit), as Tsafrir, Etsion and Feitelson
// correct underpredictions. No prediction: its time limit.
func (st *state) predictedEnd(r *runJob) int64 {
	p := int64(r.j.Predicted)
	if p <= 0 || r.term {
		return r.end
	}
	e := addSat(r.startRel, p)
	for e <= 0 && e < r.end {
		p = addSat(p, p)
		e = addSat(r.startRel, p)
	}
	return max(min(e, r.end), 0)
}

// nodeRel is a release of gpus GPUs on a node.
type nodeRel struct{ node, gpus int32 }

// sweep projects GPU releases by time limits (running jobs, jobs started
// this cycle, reservations already made — the latter conservatively held
// from now until their projected end) and returns the first time and place
// pj fits, looking no further than horizon. Cost: O(nodes + running jobs).
func (st *state) sweep(pj *pjob, horizon int64) sweepResult {
	return st.sweepBy(pj, horizon, false)
}

// resvSweep is the sweep that places a reservation: by predicted run
// times under Policy.PredictedBackfill (ModeAllot), else by time limits.
func (st *state) resvSweep(pj *pjob) sweepResult {
	return st.sweepBy(pj, never, st.predicted())
}

// predicted reports whether reservations and backfill use predicted run
// times (Policy.PredictedBackfill, ModeAllot only).
func (st *state) predicted() bool {
	return st.p.PredictedBackfill && st.p.Mode == ModeAllot
}

// sweepBy is sweep, by predicted ends (running jobs: predictedEnd; jobs
// started this cycle and reserved jobs: their predicted run) when pred.
func (st *state) sweepBy(pj *pjob, horizon int64, pred bool) sweepResult {
	var runEv []event
	var runRel []nodeRel
	var runRelOff []int32
	if pred {
		st.sortPredEvents()
		runEv, runRel, runRelOff = st.predEvents, st.predRel, st.predRelOff
	} else {
		st.sortRunEvents()
		runEv, runRel, runRelOff = st.runEvents, st.runRel, st.runRelOff
	}
	if len(st.sf) != len(st.nodes) {
		st.sf = resize(st.sf, len(st.nodes))
		st.mark = resize(st.mark, len(st.nodes))
		st.lastEv = resize(st.lastEv, len(st.nodes))
	}
	if len(st.eligMask) != len(st.pools) || len(st.gsum) != len(st.grps) {
		st.eligMask = make([]bool, len(st.pools))
		st.gsum = make([]int, len(st.grps))
	}
	sf, mark := st.sf, st.mark
	for i := range st.nodes {
		sf[i] = st.nodes[i].free
		mark[i] = 0
	}
	for _, r := range st.resvs {
		for _, c := range r.claims {
			sf[c.Node] -= c.GPUs
		}
	}
	for i := range st.eligMask {
		st.eligMask[i] = false
	}
	for _, pi := range pj.elig {
		st.eligMask[pi] = true
	}
	g := pj.j.GPUs
	okNode := func(n int) bool {
		ns := &st.nodes[n]
		return ns.pool >= 0 && st.eligMask[ns.pool] && ns.cap >= min(g, max(pj.q, 1))
	}
	res := sweepResult{pred: pred}
	// A single-node job that could not be placed now cannot fit in the
	// projection's initial state either (it subtracts every reservation's
	// claims), so only multi-node jobs need the initial check, which also
	// sets up the per-domain sums.
	if pj.multi {
		for gi := range st.gsum {
			st.gsum[gi] = 0
		}
		for n := range st.nodes {
			if okNode(n) {
				ns := &st.nodes[n]
				st.gsum[ns.group] += contrib(sf[n], ns.cap, pj.q)
			}
		}
		if gi := st.bestGroup(pj, nil); gi >= 0 {
			r := st.sweepDone(pj, 0, []int{gi}, event{}, false)
			r.pred = pred
			return r
		}
	}
	// Extra events: this cycle's starts and victims, reservations.
	extra := st.extraBuf[:0]
	for i := range st.starts {
		e := st.starts[i].end
		if pred {
			e = st.starts[i].pend
		}
		if e != never {
			extra = append(extra, event{at: e, kind: evStart, idx: i, id: st.starts[i].p.j.ID})
		}
	}
	for _, vi := range st.victims {
		extra = append(extra, event{at: st.runs()[vi].end, kind: evGrace, idx: vi, id: st.runs()[vi].j.ID})
	}
	for i := range st.resvs {
		e := st.resvs[i].end
		if pred {
			e = st.resvs[i].pend
		}
		if e != never {
			extra = append(extra, event{at: e, kind: evPhantom, idx: i, id: st.resvs[i].p.j.ID})
		}
	}
	slices.SortFunc(extra, cmpEvent)
	st.extraBuf = extra
	touched := st.touched[:0]
	a, b := 0, 0
	for a < len(runEv) || b < len(extra) {
		var ev event
		fromRun := b >= len(extra) || (a < len(runEv) && cmpEvent(runEv[a], extra[b]) <= 0)
		if fromRun {
			ev = runEv[a]
			a++
		} else {
			ev = extra[b]
			b++
		}
		if ev.at > horizon {
			break
		}
		if fromRun && len(st.victims) > 0 && st.isVictim[ev.idx] {
			continue
		}
		release := func(n, k int) {
			ns := &st.nodes[n]
			if ns.pool < 0 || k <= 0 {
				return
			}
			old := sf[n]
			sf[n] = min(old+k, ns.cap)
			st.lastEv[n] = ev
			if mark[n] != -1 {
				mark[n] = -1
				touched = append(touched, n)
			}
			if pj.multi && okNode(n) {
				st.gsum[ns.group] += contrib(sf[n], ns.cap, pj.q) - contrib(old, ns.cap, pj.q)
			}
		}
		switch ev.kind {
		case evRun, evGrace:
			if fromRun {
				rel := runRel[runRelOff[a-1]:runRelOff[a]]
				for _, x := range rel {
					release(int(x.node), int(x.gpus))
				}
				break
			}
			for _, sl := range st.runs()[ev.idx].j.Placement {
				if sl.Node >= 0 && sl.Node < len(st.nodes) {
					release(sl.Node, len(sl.GPUs))
				}
			}
		case evStart:
			for _, sl := range st.starts[ev.idx].slots {
				release(sl.Node, len(sl.GPUs))
			}
		case evPhantom:
			for _, c := range st.resvs[ev.idx].claims {
				release(c.Node, c.GPUs)
			}
		}
		// Check after the last event of this instant.
		if a < len(runEv) && runEv[a].at == ev.at || b < len(extra) && extra[b].at == ev.at {
			continue
		}
		if !pj.multi {
			best := -1
			for _, n := range touched {
				if okNode(n) && sf[n] >= g && (best < 0 || sf[n] < sf[best] || sf[n] == sf[best] && n < best) {
					best = n
				}
			}
			if best >= 0 {
				st.touched = touched
				r := st.sweepDone(pj, ev.at, []int{best}, st.lastEv[best], true)
				r.pred = pred
				return r
			}
		} else if gi := st.bestGroup(pj, touched); gi >= 0 {
			st.touched = touched
			r := st.sweepDone(pj, ev.at, []int{gi}, ev, true)
			r.pred = pred
			return r
		}
		for _, n := range touched {
			mark[n] = 0
		}
		touched = touched[:0]
	}
	st.touched = touched
	return res
}

// bestGroup picks, among the groups of the touched nodes (all groups when
// touched is nil), the one with the least sufficient capacity, then the
// lowest index.
func (st *state) bestGroup(pj *pjob, touched []int) int {
	g := pj.j.GPUs
	best := -1
	consider := func(gi int) {
		if st.gsum[gi] >= g && (best < 0 || st.gsum[gi] < st.gsum[best] || st.gsum[gi] == st.gsum[best] && gi < best) {
			best = gi
		}
	}
	if touched == nil {
		for gi := range st.gsum {
			consider(gi)
		}
		return best
	}
	for _, n := range touched {
		if gi := st.nodes[n].group; gi >= 0 && st.eligMask[st.nodes[n].pool] {
			consider(int(gi))
		}
	}
	return best
}

// sweepDone builds the result: for a single-node job where[0] is the node,
// for a multi-node job it is the group.
func (st *state) sweepDone(pj *pjob, at int64, where []int, cause event, hasCause bool) sweepResult {
	res := sweepResult{ok: true, at: at, cause: cause, causeN: hasCause}
	g := pj.j.GPUs
	if !pj.multi {
		n := where[0]
		res.claims = []Claim{{Node: n, GPUs: g}}
		res.spares = []int{st.sf[n] - g}
		return res
	}
	left := g
	for _, n := range st.grps[where[0]].nodes {
		ns := &st.nodes[n]
		c := min(contrib(st.sf[n], ns.cap, pj.q), left)
		if c > 0 {
			res.claims = append(res.claims, Claim{Node: n, GPUs: c})
			res.spares = append(res.spares, st.sf[n]-c)
			left -= c
			if left == 0 {
				break
			}
		}
	}
	return res
}

// reserve records a reservation for pj from a sweep result.
func (st *state) reserve(pj *pjob, r sweepResult) {
	k := len(st.resvs)
	st.resvs = append(st.resvs, reservation{p: pj, at: r.at, end: addSat(r.at, pj.limit), pend: addSat(r.at, pj.run), claims: r.claims, cause: r.cause, pred: r.pred})
	for i, c := range r.claims {
		st.claimNode(c.Node, k, r.spares[i])
	}
	pj.resv = k
	pj.resvCause = r.causeN
	st.plan.Reservations = append(st.plan.Reservations, Reservation{JobID: pj.j.ID, At: abs(r.at, st.now), Claims: r.claims})
}
