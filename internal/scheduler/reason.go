package scheduler

import (
	"fmt"
	"strings"
	"time"
)

// Generic reasons for blocked jobs beyond the detailed ones.
const (
	reasonBehind      = "waiting behind higher-priority jobs (a start estimate is computed only for the first blocked jobs)"
	reasonFIFOBehind  = "strict FIFO: waiting behind the first blocked job"
	reasonEASYBehind  = "EASY backfill: does not fit now without delaying the head job's reservation"
	reasonPartBehind  = "strict FIFO inside the team's partition: waiting behind the team's first blocked job"
	reasonPreemptible = "runs as preemptible: waits for idle GPUs"
)

// finish fills Plan.Pending and Plan.Shares.
func (st *state) finish() {
	if st.p.NoPendingInfo {
		return
	}
	st.plan.Shares = make([]TeamShare, len(st.teams))
	for i := range st.teams {
		st.plan.Shares[i] = st.teams[i].share
	}
	n := 0
	for _, pj := range st.order {
		if !pj.started {
			n++
		}
	}
	if n == 0 {
		return
	}
	st.plan.Pending = make([]PendingInfo, 0, n)
	budget := detailedReasons
	ahead := 0
	teamBlocked := map[int]bool{}
	for _, pj := range st.order {
		if pj.started {
			continue
		}
		info := PendingInfo{JobID: pj.j.ID, Priority: st.prioOf(pj)}
		switch {
		case pj.never:
			info.Reason = st.neverReason(pj)
		case pj.resv >= 0 && st.p.Mode == ModeEASY:
			info.EstStart = st.plan.Reservations[0].At
			info.Reason = fmt.Sprintf("%s; first in the FIFO queue, holds the backfill reservation; expected start %s when enough GPUs reach their time limits",
				st.need(pj), clock(info.EstStart, st.now))
		case pj.resv >= 0:
			r := &st.resvs[pj.resv]
			info.EstStart = abs(r.at, st.now)
			lead := "holds a backfill reservation"
			if pj.preempts > 0 {
				lead = fmt.Sprintf("preempted %d job(s) for it", pj.preempts)
			}
			info.Reason = fmt.Sprintf("%s; %s; largest free block is %d; expected start %s%s",
				st.need(pj), lead, st.largestFree(pj), clock(info.EstStart, st.now), st.causeText(r.cause, pj.resvCause))
		case st.p.Mode == ModeFIFO && pj != st.head, st.p.Mode == ModeEASY:
			info.Reason = reasonFIFOBehind
			if st.p.Mode == ModeEASY {
				info.Reason = reasonEASYBehind
			}
		case st.p.Mode == ModeFIFOPartitioned && (pj.team < 0 || teamBlocked[pj.team]):
			info.Reason = reasonPartBehind
		case pj.class == TierPreemptible && st.p.Mode == ModeAllot:
			info.Reason = reasonPreemptible
			if budget > 0 {
				budget--
				info.Reason = fmt.Sprintf("%s; %s; largest free block is %d", st.need(pj), reasonPreemptible, st.largestFree(pj))
			}
		case budget > 0:
			budget--
			if st.p.Mode == ModeFIFOPartitioned {
				teamBlocked[pj.team] = true
				if t := &st.teams[pj.team]; t.alloc+pj.j.GPUs > t.guarantee {
					info.Reason = fmt.Sprintf("%s; team %s uses %d of its %d guaranteed GPUs (partitioned)", st.need(pj), t.t.Name, t.alloc, t.guarantee)
					break
				}
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
			if r := st.sweep(pj, never); r.ok {
				info.EstStart = abs(r.at, st.now)
				fmt.Fprintf(&b, "; expected start %s%s", clock(info.EstStart, st.now), st.causeText(r.cause, r.causeN))
			} else {
				b.WriteString("; expected start unknown (running jobs without time limits)")
			}
			info.Reason = b.String()
		default:
			info.Reason = reasonBehind
			if st.p.Mode == ModeFIFOPartitioned {
				teamBlocked[pj.team] = true
				info.Reason = reasonPartBehind
			}
		}
		if !pj.never {
			ahead++
		}
		st.plan.Pending = append(st.plan.Pending, info)
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

func (st *state) causeText(ev event, ok bool) string {
	if !ok {
		return " (once GPUs held for higher-priority reservations allow)"
	}
	switch ev.kind {
	case evRun:
		return fmt.Sprintf(" when job %d reaches its time limit", ev.id)
	case evGrace:
		return fmt.Sprintf(" when job %d ends its preemption grace period", ev.id)
	case evStart:
		return fmt.Sprintf(" when job %d, started now, reaches its time limit", ev.id)
	default:
		return fmt.Sprintf(" when reserved job %d reaches its time limit", ev.id)
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
