package sim

import (
	"cmp"
	"slices"
	"time"

	"github.com/allotlabs/allot/internal/scheduler"
)

// refSchedule is a small, test-local implementation of the baselines with
// the rules of the independent reference, so the simulator can be
// tested (and cross-checked against the reference's figures) without the
// real core:
//   - a job of ≤ GPUsPerNode GPUs runs on one node, best fit (fewest free
//     GPUs that still fit, then lowest node index); a larger one takes
//     ceil(gpus/per) whole free nodes, lowest indices first (domains ignored);
//   - fifo: strict submit order (then ID); the first job that does not fit
//     stops the pass;
//   - easy: the first blocked job gets a reservation at the earliest time it
//     fits as running jobs reach their time limits; a later job starts now
//     only if it fits and the reserved job still fits at that time;
//   - fifo-partitioned: strict FIFO per team, each team limited to its
//     guaranteed GPUs on the shared nodes; allot is treated as easy.
func refSchedule(s scheduler.Snapshot, now time.Time, p scheduler.Policy) scheduler.Plan {
	per := 0
	for _, n := range s.Nodes {
		per = max(per, n.GPUs)
	}
	free := make([]int, len(s.Nodes))
	mask := make([]uint64, len(s.Nodes))
	for i, n := range s.Nodes {
		free[i] = n.GPUs
	}
	teamUsed := map[string]int{}
	for _, r := range s.Running {
		for _, sl := range r.Placement {
			free[sl.Node] -= len(sl.GPUs)
			for _, g := range sl.GPUs {
				mask[sl.Node] |= 1 << g
			}
		}
		teamUsed[r.Team] += r.GPUs
	}
	quota := map[string]int{}
	for _, t := range s.Teams {
		quota[t.Name] = t.Guarantee[""]
	}
	order := make([]int, len(s.Pending))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		ja, jb := &s.Pending[a], &s.Pending[b]
		if c := ja.Submit.Compare(jb.Submit); c != 0 {
			return c
		}
		return cmp.Compare(ja.ID, jb.ID)
	})

	var plan scheduler.Plan
	var startedNow []scheduler.Job
	take := func(j *scheduler.Job, nodes []int) {
		var pl []scheduler.Slot
		left := j.GPUs
		for _, n := range nodes {
			k := min(left, free[n])
			var gs []int
			for g := 0; g < s.Nodes[n].GPUs && len(gs) < k; g++ {
				if mask[n]&(1<<g) == 0 {
					gs = append(gs, g)
					mask[n] |= 1 << g
				}
			}
			free[n] -= k
			left -= k
			pl = append(pl, scheduler.Slot{Node: n, GPUs: gs})
		}
		teamUsed[j.Team] += j.GPUs
		startedNow = append(startedNow, scheduler.Job{ID: j.ID, Start: now, TimeLimit: j.TimeLimit, Placement: pl})
		plan.Starts = append(plan.Starts, scheduler.Start{JobID: j.ID, Placement: pl, RunAs: j.Tier})
	}

	blockedTeam := map[string]bool{}
	reserved := false
	var shadow time.Time
	var freeAtShadow []int
	var headGPUs int
	for _, i := range order {
		j := &s.Pending[i]
		if p.Mode == scheduler.ModeFIFOPartitioned {
			if blockedTeam[j.Team] {
				continue
			}
			if teamUsed[j.Team]+j.GPUs > quota[j.Team] {
				blockedTeam[j.Team] = true
				continue
			}
		}
		nodes := fit(free, s.Nodes, per, j.GPUs)
		if p.Mode == scheduler.ModeFIFOPartitioned && physicalPartitions {
			nodes = fitPartition(free, s, per, j)
		}
		switch {
		case p.Mode == scheduler.ModeFIFO:
			if nodes == nil {
				return plan
			}
			take(j, nodes)
		case p.Mode == scheduler.ModeFIFOPartitioned:
			if nodes == nil {
				blockedTeam[j.Team] = true
				continue
			}
			take(j, nodes)
		case !reserved:
			if nodes != nil {
				take(j, nodes)
				continue
			}
			reserved = true
			shadow, freeAtShadow = reservation(slices.Concat(s.Running, startedNow), s.Nodes, free, per, j.GPUs)
			headGPUs = j.GPUs
			plan.Reservations = append(plan.Reservations, scheduler.Reservation{JobID: j.ID, At: shadow})
		default:
			if nodes == nil {
				continue
			}
			if !now.Add(j.TimeLimit).After(shadow) {
				take(j, nodes)
				continue
			}
			// Would the head still fit at the shadow time?
			trial := slices.Clone(freeAtShadow)
			left := j.GPUs
			for _, n := range nodes {
				k := min(left, free[n])
				trial[n] -= k
				left -= k
			}
			if fit(trial, s.Nodes, per, headGPUs) == nil {
				continue
			}
			freeAtShadow = trial
			take(j, nodes)
		}
	}
	return plan
}

// fit returns the nodes a job of g GPUs would use given free GPUs per node,
// or nil.
func fit(free []int, nodes []scheduler.Node, per, g int) []int {
	if g <= per {
		best := -1
		for n, f := range free {
			if f >= g && (best < 0 || f < free[best]) {
				best = n
			}
		}
		if best < 0 {
			return nil
		}
		return []int{best}
	}
	need := (g + per - 1) / per
	var out []int
	for n, f := range free {
		if f == nodes[n].GPUs {
			out = append(out, n)
			if len(out) == need {
				return out
			}
		}
	}
	return nil
}

// reservation returns the earliest time a job of g GPUs fits as running jobs
// reach their time limits, and the free GPUs per node at that time.
func reservation(running []scheduler.Job, nodes []scheduler.Node, free []int, per, g int) (time.Time, []int) {
	ends := make([]int, len(running))
	for i := range ends {
		ends[i] = i
	}
	end := func(r *scheduler.Job) time.Time { return r.Start.Add(r.TimeLimit) }
	slices.SortFunc(ends, func(a, b int) int {
		ra, rb := &running[a], &running[b]
		if c := end(ra).Compare(end(rb)); c != 0 {
			return c
		}
		return cmp.Compare(ra.ID, rb.ID)
	})
	f := slices.Clone(free)
	for k := 0; k < len(ends); {
		t := end(&running[ends[k]])
		for ; k < len(ends) && end(&running[ends[k]]).Equal(t); k++ {
			for _, sl := range running[ends[k]].Placement {
				f[sl.Node] += len(sl.GPUs)
			}
		}
		if fit(f, nodes, per, g) != nil {
			return t, f
		}
	}
	return time.Time{}.Add(1<<63 - 1), f
}

var physicalPartitions = true

// fitPartition places j only on its team's own nodes: teams own contiguous
// node ranges in name order, guarantee/per nodes each.
func fitPartition(free []int, s scheduler.Snapshot, per int, j *scheduler.Job) []int {
	lo := 0
	for _, t := range s.Teams {
		n := t.Guarantee[""] / per
		if t.Name == j.Team {
			sub := fit(free[lo:lo+n], s.Nodes[lo:lo+n], per, j.GPUs)
			for i := range sub {
				sub[i] += lo
			}
			return sub
		}
		lo += n
	}
	return nil
}
