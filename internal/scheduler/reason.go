package scheduler

import (
	"fmt"
	"strings"
	"time"
)

// Generic reasons for blocked jobs beyond the detailed ones.
const (
	reasonBehind      = "waiting behind higher-priority jobs" + reasonNoEstimate
	reasonFIFOBehind  = "strict FIFO: waiting behind the first blocked job"
	reasonEASYBehind  = "EASY backfill: does not fit now without delaying the head job's reservation"
	reasonPartBehind  = "strict FIFO inside the team's partition: waiting behind the team's first blocked job"
	reasonPreemptible = "runs as preemptible: waits for idle GPUs"
	reasonNoEstimate  = " (a start estimate is computed only for the first blocked jobs)"
)

// forecastNote follows a forecast start in a reason.
const forecastNote = " (forecast: running jobs end at their expected run time, blocked jobs ahead start first)"

// finish fills Plan.Pending and Plan.Shares (Policy.NoPendingInfo: only
// Plan.Pending, for the jobs of Policy.EstimateFor).
func (st *state) finish() {
	filter := st.p.EstimateFor
	if st.p.NoPendingInfo && len(filter) == 0 {
		return
	}
	if !st.p.NoPendingInfo {
		st.plan.Shares = make([]TeamShare, len(st.teams))
		for i := range st.teams {
			st.plan.Shares[i] = st.teams[i].share
		}
	}
	want := func(pj *pjob) bool { return !st.p.NoPendingInfo || filter[pj.j.ID] }
	n := 0
	for _, pj := range st.order {
		if !pj.started && want(pj) {
			n++
		}
	}
	if n == 0 {
		return
	}
	var fc []int64
	if st.p.ETA != ETALimits {
		fc = st.forecast(func(pj *pjob) bool { return filter[pj.j.ID] }, !st.p.NoPendingInfo)
	}
	// eta is the start estimate of pj and its clause of the reason, from
	// the limits estimate lim (zero if none) with its cause text.
	eta := func(info *PendingInfo, pj *pjob, lim time.Time, cause string, resv bool) string {
		limText := ""
		limKind := EstLimits
		if resv {
			limKind = EstReservation
			if pj.preempts > 0 || pj.inflight {
				limKind = EstPreemption
			}
		}
		if !lim.IsZero() {
			limText = "; expected start " + clock(lim, st.now) + cause
		}
		if fc == nil || fc[pj.idx] == never || !lim.IsZero() && resv && !abs(fc[pj.idx], st.now).Before(lim) {
			// No forecast, or a reservation, which holds by time limits
			// at the latest.
			if !lim.IsZero() {
				info.EstStart, info.EstKind = lim, limKind
			}
			return limText
		}
		t := abs(fc[pj.idx], st.now)
		info.EstStart, info.EstKind = t, EstForecast
		if pj.fcPreempt {
			info.EstKind = EstPreemption
		}
		if t.Equal(lim) {
			return limText
		}
		text := "; expected start " + clock(t, st.now) + forecastNote
		if !lim.IsZero() {
			text += "; by time limits " + clock(lim, st.now) + cause
		}
		return text
	}
	// generic appends the forecast, when there is one, to a generic reason.
	generic := func(info *PendingInfo, pj *pjob, reason string, ahead int) {
		info.Reason = reason
		if fc == nil || fc[pj.idx] == never {
			return
		}
		info.EstStart, info.EstKind = abs(fc[pj.idx], st.now), EstForecast
		if pj.fcPreempt {
			info.EstKind = EstPreemption
		}
		info.Reason = fmt.Sprintf("%s; %d blocked job(s) ahead; expected start %s%s", strings.TrimSuffix(reason, reasonNoEstimate), ahead, clock(info.EstStart, st.now), forecastNote)
	}
	st.plan.Pending = make([]PendingInfo, 0, n)
	budget := detailedReasons
	ahead := 0
	teamBlocked := map[int]bool{}
	for _, pj := range st.order {
		if pj.started {
			continue
		}
		w := want(pj)
		info := PendingInfo{JobID: pj.j.ID}
		if w {
			info.Priority = st.priority(pj)
		}
		switch {
		case pj.never:
			if w {
				info.Reason = st.neverReason(pj)
			}
		case pj.resv >= 0 && st.p.Mode == ModeEASY:
			if w {
				lim := st.plan.Reservations[0].At
				info.EstStartLimits = lim
				text := eta(&info, pj, lim, " when enough GPUs reach their time limits", true)
				info.Reason = fmt.Sprintf("%s; first in the FIFO queue, holds the backfill reservation%s", st.need(pj), text)
			}
		case pj.resv >= 0:
			if w {
				r := &st.resvs[pj.resv]
				lim := abs(r.at, st.now)
				info.EstStartLimits = lim
				lead := "holds a backfill reservation"
				if pj.preempts > 0 {
					lead = fmt.Sprintf("preempted %d job(s) for it", pj.preempts)
				}
				cause := st.causeText(r.cause, pj.resvCause, r.pred)
				text := eta(&info, pj, lim, cause, true)
				info.Reason = fmt.Sprintf("%s; %s; largest free block is %d%s", st.need(pj), lead, st.largestFree(pj), text)
			}
		case st.p.Mode == ModeFIFO && pj != st.head, st.p.Mode == ModeEASY:
			if w {
				reason := reasonFIFOBehind
				if st.p.Mode == ModeEASY {
					reason = reasonEASYBehind
				}
				generic(&info, pj, reason, ahead)
			}
		case st.p.Mode == ModeFIFOPartitioned && (pj.team < 0 || teamBlocked[pj.team]):
			if w {
				generic(&info, pj, reasonPartBehind, ahead)
			}
		case pj.class == TierPreemptible && st.p.Mode == ModeAllot:
			detailed := budget > 0
			if detailed {
				budget--
			}
			if w {
				reason := reasonPreemptible
				if detailed {
					reason = fmt.Sprintf("%s; %s; largest free block is %d", st.need(pj), reasonPreemptible, st.largestFree(pj))
				}
				generic(&info, pj, reason, ahead)
			}
		case budget > 0:
			budget--
			if st.p.Mode == ModeFIFOPartitioned {
				teamBlocked[pj.team] = true
				if t := &st.teams[pj.team]; t.alloc+pj.j.GPUs > t.guarantee {
					if w {
						generic(&info, pj, fmt.Sprintf("%s; team %s uses %d of its %d guaranteed GPUs (partitioned)", st.need(pj), t.t.Name, t.alloc, t.guarantee), ahead)
					}
					break
				}
			}
			if !w {
				break
			}
			lf := st.largestFree(pj)
			var b strings.Builder
			fmt.Fprintf(&b, "%s; largest free block is %d", st.need(pj), lf)
			if lf >= pj.j.GPUs && !pj.multi {
				b.WriteString("; starting now would delay a higher-priority job's reservation")
			}
			if ahead > 0 {
				fmt.Fprintf(&b, "; %d blocked job(s) ahead", ahead)
			}
			var lim time.Time
			cause := ""
			if r := st.sweep(pj, never); r.ok {
				lim = abs(r.at, st.now)
				cause = st.causeText(r.cause, r.causeN, false)
			}
			info.EstStartLimits = lim
			text := eta(&info, pj, lim, cause, false)
			if info.EstStart.IsZero() {
				text = "; expected start unknown (running jobs without time limits)"
			}
			b.WriteString(text)
			info.Reason = b.String()
		default:
			if st.p.Mode == ModeFIFOPartitioned {
				teamBlocked[pj.team] = true
				if w {
					generic(&info, pj, reasonPartBehind, ahead)
				}
			} else if w {
				generic(&info, pj, reasonBehind, ahead)
			}
		}
		if !pj.never {
			ahead++
		}
		if w {
			st.plan.Pending = append(st.plan.Pending, info)
		}
	}
}

// need describes what a job waits for.
func (st *state) need(pj *pjob) string {
	var b strings.Builder
	g := pj.j.GPUs
	switch {
	case !pj.multi:
		fmt.Fprintf(&b, "waiting for %d GPU%s on one node", g, plural(g))
	case pj.q > 0:
		fmt.Fprintf(&b, "waiting for %d GPUs, %d per node, in one interconnect domain", g, pj.q)
	default:
		fmt.Fprintf(&b, "waiting for %d GPUs in one interconnect domain", g)
	}
	if pj.j.GPUType != "" {
		fmt.Fprintf(&b, " of type %s", pj.j.GPUType)
	}
	if pj.class.Production() && st.p.Mode == ModeAllot {
		b.WriteString(" on-premise")
	}
	return b.String()
}

func (st *state) neverReason(pj *pjob) string {
	if pj.j.GPUs <= 0 {
		return "can never run: asks for no GPUs"
	}
	if st.p.Mode == ModeFIFOPartitioned {
		g := 0
		if pj.team >= 0 {
			g = st.teams[pj.team].guarantee
		}
		return fmt.Sprintf("can never run in the partitioned cluster: needs %d GPUs, team %s is guaranteed %d", pj.j.GPUs, pj.j.Team, g)
	}
	what := strings.TrimPrefix(st.need(pj), "waiting for ")
	if st.offline > 0 {
		largest, unit := pj.maxCap, "node"
		if pj.multi {
			largest, unit = pj.groupCap, "domain"
		}
		return fmt.Sprintf("cannot run on the nodes up now: needs %s; the largest eligible %s up has %d GPUs (nodes draining, drained or down: %d)",
			what, unit, largest, st.offline)
	}
	if !pj.multi {
		return fmt.Sprintf("can never run: needs %s; the largest eligible node has %d GPUs", what, pj.maxCap)
	}
	return fmt.Sprintf("can never run: needs %s; the largest eligible domain has %d GPUs", what, pj.groupCap)
}

// largestFree is the largest block of GPUs free now that the job's shape
// could use: GPUs on one node, or GPUs on whole free nodes of one domain.
func (st *state) largestFree(pj *pjob) int {
	best := 0
	if !pj.multi || pj.q > 0 {
		for _, pi := range pj.elig {
			pl := &st.pools[pi]
			for f := pl.maxCap; f > best; f-- {
				if pl.counts[f] > 0 {
					best = f
					break
				}
			}
		}
		for _, n := range st.claimed {
			ns := &st.nodes[n]
			if ns.free > best && containsInt(pj.elig, int(ns.pool)) {
				best = ns.free
			}
		}
		return best
	}
	for _, pi := range pj.elig {
		for _, gi := range st.pools[pi].groups {
			a := st.grps[gi].wf
			for _, n := range st.claimed {
				if ns := &st.nodes[n]; int(ns.group) == gi && ns.free == ns.cap {
					a += ns.cap
				}
			}
			best = max(best, a)
		}
	}
	return best
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// causeText says when a reservation's GPUs come free: ev's end by time
// limits, or by predicted run times (pred, Policy.PredictedBackfill).
func (st *state) causeText(ev event, ok, pred bool) string {
	if !ok {
		return " (once GPUs held for higher-priority reservations allow)"
	}
	end := "reaches its time limit"
	if pred {
		end = "is predicted to end"
	}
	switch ev.kind {
	case evRun:
		return fmt.Sprintf(" when job %d %s", ev.id, end)
	case evGrace:
		return fmt.Sprintf(" when job %d ends its preemption grace period", ev.id)
	case evStart:
		return fmt.Sprintf(" when job %d, started now, %s", ev.id, end)
	default:
		return fmt.Sprintf(" when reserved job %d %s", ev.id, end)
	}
}

// clock formats t as 15:04 UTC, or "Jan 2 15:04" on another day than now.
func clock(t, now time.Time) string {
	t, now = t.UTC(), now.UTC()
	if t.YearDay() == now.YearDay() && t.Year() == now.Year() {
		return t.Format("15:04")
	}
	return t.Format("Jan 2 15:04")
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
