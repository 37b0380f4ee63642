package scheduler

import (
	"cmp"
	"fmt"
	"slices"
)

// Victim groups, in the order they are taken.
const (
	vgPreemptible    = 0 // running as preemptible (explicit or budget-demoted)
	vgAboveGuarantee = 1 // tier 3-4 of a team running above its guarantee
	vgAnyResearch    = 2 // any tier 3-4 (tier-1 preemptors only)
)

// preemptRight returns the last victim group pj may take, or -1.
func (st *state) preemptRight(pj *pjob) int {
	pj.reclaim, pj.starvedTeam = false, false
	if r := st.p.Reserved[pj.class]; r > 0 && pj.class.Production() && st.classGPUs(pj.class)+pj.j.GPUs <= r {
		pj.reclaim = true
		return vgAnyResearch
	}
	if rights, ok := st.p.MayPreempt[pj.class]; ok && len(rights) == 0 {
		return -1
	}
	switch pj.class {
	case Tier1:
		return vgAnyResearch
	case Tier2:
		return vgAboveGuarantee
	case Tier3, Tier4:
		if pj.team >= 0 && -pj.submit >= int64(st.p.GuaranteePatience) {
			t := &st.teams[pj.team]
			if t.alloc+pj.j.GPUs <= t.guarantee {
				return vgAboveGuarantee
			}
			if st.p.StarvedTeamPreempt && t.boost >= starvedTeamRatio {
				pj.starvedTeam = true
				return vgAboveGuarantee
			}
		}
	}
	return -1
}

// classGPUs is the GPUs held by running jobs of class c that are not
// stopping, and by jobs of c started this cycle.
func (st *state) classGPUs(c Tier) int {
	n := 0
	for i := range st.runs() {
		if r := &st.runs()[i]; r.class == c && !r.term {
			n += r.gpus
		}
	}
	for _, s := range st.starts {
		if s.p.class == c {
			n += s.p.j.GPUs
		}
	}
	return n
}

// mayPreempt applies the admin-set preemption rights (Policy.MayPreempt).
func (st *state) mayPreempt(by, victim Tier) bool {
	rights, ok := st.p.MayPreempt[by]
	return !ok || slices.Contains(rights, victim)
}

// victimGroup classifies running job r as a victim for a preemptor allowed
// groups up to maxGroup; -1 if it may not be preempted.
func (st *state) victimGroup(r *runJob, maxGroup int) int {
	if r.term || r.class.Production() || r.gpus == 0 {
		return -1
	}
	if r.startRel > -int64(st.p.MinRuntime) {
		return -1 // anti-thrash
	}
	if g := st.runGroup(r); g <= maxGroup {
		return g
	}
	return -1
}

// runGroup is the victim group of research or preemptible running job r,
// whatever its run time: preemptible, above its team's guarantee, or any
// research work.
func (st *state) runGroup(r *runJob) int {
	switch {
	case r.class == TierPreemptible:
		return vgPreemptible
	case r.team < 0 || st.teams[r.team].alloc-r.gpus >= st.teams[r.team].guarantee:
		return vgAboveGuarantee
	}
	return vgAnyResearch
}

func (st *state) buildNodeRun() {
	if st.nodeRun != nil {
		return
	}
	st.nodeRun = make([][]int, len(st.nodes))
	for i := range st.runs() {
		r := &st.runs()[i]
		r.lost, r.vprio = st.lostWork(r), st.runPrio(r)
		if st.p.Mode == ModeAllot && st.p.Order == OrderResponse {
			r.requeued = st.requeuedPriority(r)
		}
		for _, sl := range st.runs()[i].j.Placement {
			if sl.Node >= 0 && sl.Node < len(st.nodes) && len(sl.GPUs) > 0 {
				st.nodeRun[sl.Node] = append(st.nodeRun[sl.Node], i)
			}
		}
	}
}

type victimCand struct {
	ri    int
	group int
	gpus  int // on this node
}

// gpusOn counts the GPUs r holds on node n.
func (r *runJob) gpusOn(n int) int {
	k := 0
	for _, sl := range r.j.Placement {
		if sl.Node == n {
			k += len(sl.GPUs)
		}
	}
	return k
}

// nodeVictims picks the victims on node n that bring it to target free
// GPUs: victim groups in order, then lowest priority, fewest GPUs, newest
// start, id. ok is false when that is impossible.
func (st *state) nodeVictims(n, target, maxGroup int, class Tier, reclaim bool, buf []victimCand) (vs []victimCand, worst, freed int, lost float64, ok bool) {
	ns := &st.nodes[n]
	avail := ns.free
	vs = buf[:0]
	rank := st.classRank(class)
	for _, ri := range st.nodeRun[n] {
		r := &st.runs()[ri]
		k := r.gpusOn(n)
		if r.term {
			avail += k // freed at its grace end, within one grace period
			continue
		}
		if st.victimAfter != noVictimLimit && st.requeuedClass(r).Research() && !r.j.Submit.IsZero() && rel(r.j.Submit, st.now) <= st.victimAfter {
			// Once requeued it would be starving, served by the guard
			// (tier 3-4 jobs with a submit time) first, and take its GPUs
			// back.
			continue
		}
		if r.requeued >= st.victimBelow && st.classRank(r.class) == rank {
			continue // the same: it would come back ahead of the preemptor
		}
		if g := st.victimGroup(r, maxGroup); g >= 0 && g <= maxGroup && (r.class >= class || class.Production()) && (reclaim || st.mayPreempt(class, r.class)) {
			vs = append(vs, victimCand{ri: ri, group: g, gpus: k})
		}
	}
	if avail >= target {
		return vs[:0], -1, 0, 0, true
	}
	slices.SortFunc(vs, func(a, b victimCand) int {
		ra, rb := &st.runs()[a.ri], &st.runs()[b.ri]
		return cmp.Or(cmp.Compare(a.group, b.group), cmp.Compare(rb.class, ra.class), cmp.Compare(ra.lost, rb.lost),
			cmp.Compare(ra.vprio, rb.vprio), cmp.Compare(ra.gpus, rb.gpus), cmp.Compare(ra.j.ID, rb.j.ID))
	})
	worst = -1
	// Victims come preemptible first (group order), so an above-guarantee
	// victim is checked against every earlier victim of its team.
	var taken []int
	if maxGroup == vgAboveGuarantee {
		taken = st.takenBuf()
		defer clear(taken)
	}
	k := 0
	for _, v := range vs {
		if taken != nil && !st.takeVictim(v.ri, v.group, maxGroup, taken) {
			continue
		}
		vs[k] = v
		k++
		avail += v.gpus
		freed += st.runs()[v.ri].gpus
		if v.group != vgPreemptible {
			lost += st.runs()[v.ri].lost // preemptible work is not protected
		}
		worst = max(worst, v.group)
		if avail >= target {
			return vs[:k], worst, freed, lost, true
		}
	}
	return nil, 0, 0, 0, false
}

// requeuedClass is the class running job r would have back in the queue:
// its own, demoted if its team is over budget now (not the class it runs
// as, which may be a demotion since lifted).
func (st *state) requeuedClass(r *runJob) Tier {
	var t *Team
	if r.team >= 0 {
		t = st.teams[r.team].t
	}
	return effClass(r.j, t)
}

// A preemptor whose right is only to work above guarantees (tier 2, a
// team reclaiming its guarantee: maxGroup vgAboveGuarantee) takes at most
// each team's excess over its guarantee, counted over the whole victim
// set: victimGroup judges each job alone, so two of one team's jobs (or a
// preemptible one and another) could each pass and together leave the
// team below its guarantee, from where it would reclaim. taken counts, per
// team, the GPUs of every victim in the set (preemptible ones too: they
// count in the team's alloc); keepsGuarantee checks an above-guarantee
// victim against it. Both do nothing for other preemptors.

// countVictim adds running job ri's GPUs to its team's taken (sign -1:
// takes them off again).
func (st *state) countVictim(ri, maxGroup, sign int, taken []int) {
	if r := &st.runs()[ri]; maxGroup == vgAboveGuarantee && r.team >= 0 {
		taken[r.team] += sign * r.gpus
	}
}

// keepsGuarantee reports whether running job ri, a victim of group, leaves
// its team at or above its guarantee once the team's taken GPUs (ri's
// included) are gone.
func (st *state) keepsGuarantee(ri, group, maxGroup int, taken []int) bool {
	r := &st.runs()[ri]
	if maxGroup != vgAboveGuarantee || group != vgAboveGuarantee || r.team < 0 {
		return true
	}
	t := &st.teams[r.team]
	return t.alloc-taken[r.team] >= t.guarantee
}

// keepGuarantees reports whether every victim in the sets of running job
// indices leaves its team at or above its guarantee, with taken counting
// them all.
func (st *state) keepGuarantees(maxGroup int, taken []int, sets ...[]int) bool {
	for _, set := range sets {
		for _, ri := range set {
			if !st.keepsGuarantee(ri, st.victimGroup(&st.runs()[ri], maxGroup), maxGroup, taken) {
				return false
			}
		}
	}
	return true
}

// takeVictim counts running job ri, a victim of group, in taken, unless
// that leaves its team below its guarantee (then it reports false and
// counts nothing).
func (st *state) takeVictim(ri, group, maxGroup int, taken []int) bool {
	st.countVictim(ri, maxGroup, 1, taken)
	if !st.keepsGuarantee(ri, group, maxGroup, taken) {
		st.countVictim(ri, maxGroup, -1, taken)
		return false
	}
	return true
}

// takenBuf is the zeroed per-team counter of a set under construction;
// its users clear it when done.
func (st *state) takenBuf() []int {
	if len(st.taken) != len(st.teams) {
		st.taken = make([]int, len(st.teams))
	}
	return st.taken
}

// victimScore ranks victim sets: worst victim group, work lost, GPUs
// freed, number of victims, then node (or domain) index.
type victimScore struct {
	worst int
	lost  float64
	freed int
	count int
	at    int
}

func cmpScore(a, b victimScore) int {
	return cmp.Or(cmp.Compare(a.worst, b.worst), cmp.Compare(a.lost, b.lost), cmp.Compare(a.freed, b.freed),
		cmp.Compare(a.count, b.count), cmp.Compare(a.at, b.at))
}

// lostWork is the GPU-seconds a victim loses: its run time since its last
// checkpoint (or start).
func (st *state) lostWork(r *runJob) float64 {
	since := r.startRel
	if r.j.Checkpointable && !r.j.LastCheckpoint.IsZero() {
		since = max(since, rel(r.j.LastCheckpoint, st.now))
	}
	return float64(r.gpus) * float64(-min(since, 0)) / 1e9
}

// preempt looks for victims that let pj start after one grace period and
// issues the preemptions. Nodes held by reservations are left alone.
func (st *state) preempt(pj *pjob, maxGroup int, maxLost float64) bool {
	st.buildNodeRun()
	g := pj.j.GPUs
	elig := func(n int) bool {
		ns := &st.nodes[n]
		return ns.pool >= 0 && len(ns.claims) == 0 && slices.Contains(pj.elig, int(ns.pool))
	}
	var chosen []int // running job indices
	if !pj.multi {
		best := victimScore{}
		found := false
		var buf, bestVs []victimCand
		for _, pi := range pj.elig {
			for _, n := range st.pools[pi].nodes {
				if st.nodes[n].cap < g || !elig(n) {
					continue
				}
				vs, worst, freed, lost, ok := st.nodeVictims(n, g, maxGroup, pj.class, pj.reclaim, buf)
				if !ok || len(vs) == 0 {
					continue
				}
				sc := victimScore{worst, lost, freed, len(vs), n}
				if !found || cmpScore(sc, best) < 0 {
					found, best = true, sc
					bestVs = append(bestVs[:0], vs...)
				}
				buf = vs
			}
		}
		if !found || best.lost > maxLost {
			return false
		}
		for _, v := range bestVs {
			chosen = append(chosen, v.ri)
		}
	} else {
		type nodeCost struct {
			n    int
			sc   victimScore
			give int
			vs   []victimCand
		}
		var best victimScore
		found := false
		var bestSet []int
		for _, pi := range pj.elig {
			for _, gi := range st.pools[pi].groups {
				gr := &st.grps[gi]
				if gr.capSum < g {
					continue
				}
				var costs []nodeCost
				for _, n := range gr.nodes {
					if !elig(n) {
						continue
					}
					ns := &st.nodes[n]
					target := ns.cap
					if pj.q > 0 {
						target = pj.q
					}
					if ns.cap < target {
						continue
					}
					vs, worst, freed, lost, ok := st.nodeVictims(n, target, maxGroup, pj.class, pj.reclaim, nil)
					if !ok {
						continue
					}
					costs = append(costs, nodeCost{n: n, sc: victimScore{worst, lost, freed, len(vs), n}, give: min(target, ns.cap), vs: vs})
				}
				slices.SortFunc(costs, func(a, b nodeCost) int { return cmpScore(a.sc, b.sc) })
				got, sc := 0, victimScore{worst: -1, at: gi}
				var set []int
				taken := st.takenBuf()
				for _, c := range costs {
					if got >= g {
						break
					}
					// Within the teams' excess over the whole set, not
					// only node by node (countVictim).
					if maxGroup == vgAboveGuarantee {
						var added []int
						for _, v := range c.vs {
							if !slices.Contains(set, v.ri) {
								st.countVictim(v.ri, maxGroup, 1, taken)
								added = append(added, v.ri)
							}
						}
						if !st.keepGuarantees(maxGroup, taken, set, added) {
							for _, ri := range added {
								st.countVictim(ri, maxGroup, -1, taken)
							}
							continue
						}
					}
					got += c.give
					sc.worst = max(sc.worst, c.sc.worst)
					sc.freed += c.sc.freed
					sc.lost += c.sc.lost
					sc.count += c.sc.count
					for _, v := range c.vs {
						if !slices.Contains(set, v.ri) {
							set = append(set, v.ri)
						}
					}
				}
				clear(taken)
				if got < g || len(set) == 0 {
					continue
				}
				if !found || cmpScore(sc, best) < 0 {
					found, best, bestSet = true, sc, set
				}
			}
		}
		if !found || best.lost > maxLost {
			return false
		}
		chosen = bestSet
	}
	slices.SortFunc(chosen, func(a, b int) int { return cmp.Compare(st.runs()[a].j.ID, st.runs()[b].j.ID) })
	for _, ri := range chosen {
		st.markVictim(ri, pj)
	}
	pj.preempts = len(chosen)
	if pj.team >= 0 {
		st.teams[pj.team].alloc += g // counts against its guarantee from now on
	}
	return true
}

func (st *state) markVictim(ri int, by *pjob) {
	r := &st.runs()[ri]
	grp := st.victimGroup(r, vgAnyResearch)
	var why string
	switch grp {
	case vgPreemptible:
		why = "it runs as preemptible"
	case vgAboveGuarantee:
		if r.team >= 0 {
			t := &st.teams[r.team]
			why = fmt.Sprintf("team %s runs above its guarantee (%d of %d GPUs)", t.t.Name, t.alloc, t.guarantee)
		} else {
			why = fmt.Sprintf("team %s has no guarantee", r.j.Team)
		}
	default:
		why = "tier-1 work may preempt tier 3-4"
	}
	if by.reclaim {
		why = fmt.Sprintf("tier %d takes back its %d reserved GPUs", by.class, st.p.Reserved[by.class])
	}
	r.victim, r.term = true, true
	r.end = min(r.end, int64(st.p.GracePeriod)) // a job past its time limit ends anyway
	st.victims = append(st.victims, ri)
	if st.isVictim == nil {
		st.isVictim = make([]bool, len(st.runs()))
	}
	st.isVictim[ri] = true
	if r.team >= 0 {
		st.teams[r.team].alloc -= r.gpus
	}
	who := fmt.Sprintf("tier %d job %d", by.class, by.j.ID)
	if by.class >= Tier3 {
		who = fmt.Sprintf("job %d of team %s, which is under its guarantee", by.j.ID, by.j.Team)
	}
	st.plan.Preemptions = append(st.plan.Preemptions, Preemption{
		JobID:  r.j.ID,
		By:     by.j.ID,
		Reason: fmt.Sprintf("preempted for %s: %s", who, why),
	})
}
