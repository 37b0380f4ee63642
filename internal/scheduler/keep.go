package scheduler

import (
	"math/bits"
	"slices"
	"time"
)

// RunningKeep keeps the running jobs' part of a cycle's working state
// (GPUs in use per node, the free-GPU index, each job's team, class and
// placement) between the cycles of one caller whose running jobs change
// little from one cycle to the next (the simulator), so that a cycle
// applies the changes instead of reading every running job again.
//
// Contract, between two Schedule calls passing the same keep in
// Snapshot.Keep: Running may grow or shrink at its end, and the caller
// calls Changed(i) for every position i it writes: a job appended at i, a
// job moved or put into i, a job at i whose Team, Tier, RunAs,
// Preemptible, Start, TimeLimit, Terminating, GraceEnd or Placement it
// modified. (Removing the last job needs no report; positions past the
// previous call's length are read as new anyway.) Other fields (Expected,
// LastCheckpoint, PreemptedBy, …) are read every cycle and need no
// report. Whenever the nodes (with
// Snapshot.NodesSame false), the team names or the mode differ from the
// last call's, the keep is rebuilt from scratch, so it is never wrong to
// pass a keep; not passing one is always correct. A keep must not be used
// by two Schedule calls at once.
type RunningKeep struct {
	valid   bool
	src     *Node // &Snapshot.Nodes[0]
	nNodes  int
	mode    Mode
	owners  []int
	names   []string // team names in st.teams order
	entries []keptRun
	dirty   []int
	nodes   []nodeState // the topology's nodes with the running jobs' GPUs used, free set; until 0
	free    int
	words   [][]uint64 // per pool: its bucket words
	counts  [][]int    // per pool: its bucket counts
	wf      []int      // per group
	touched []int
	gone    []keptSlot // scratch: slots of jobs that left this cycle
	came    []keptSlot // and of jobs that came
	mark    []bool
	until   []int64 // scratch
	alloc   []int   // per team (st.teams order): GPUs of its running jobs not terminating
	terms   int     // entries terminating
	// shared[n]: two kept jobs hold the same GPU of node n (bad input):
	// its GPUs in use are recomputed from every job when one leaves.
	shared []bool
}

// Changed reports that the job at position i of Running was replaced or
// modified (see RunningKeep).
func (k *RunningKeep) Changed(i int) {
	if k != nil {
		k.dirty = append(k.dirty, i)
	}
}

// keptRun is what a running job contributes, independent of now.
type keptRun struct {
	team       int
	class      Tier
	classFixed bool // RunAs is a class: class does not depend on the team's budget
	gpus       int
	term       bool
	start      time.Time
	graceEnd   time.Time
	limit      time.Duration
	slots      []keptSlot
}

// keptSlot is a job's GPUs on one node (in range).
type keptSlot struct {
	node int
	mask uint64
	any  bool // the slot lists GPUs (it extends the node's until)
}

// keptOf derives job j's entry (as buildRunning does).
func (st *state) keptOf(j *Job, e *keptRun) {
	slots := e.slots[:0]
	*e = keptRun{team: -1}
	if st.p.Mode == ModeAllot || st.p.Mode == ModeFIFOPartitioned {
		e.team, _ = st.team(j.Team)
	}
	e.class = j.RunAs
	e.classFixed = e.class >= Tier1 && e.class <= TierPreemptible
	e.start, e.graceEnd, e.limit, e.term = j.Start, j.GraceEnd, j.TimeLimit, j.Terminating
	for _, sl := range j.Placement {
		if sl.Node < 0 || sl.Node >= len(st.nodes) {
			continue
		}
		var m uint64
		for _, g := range sl.GPUs {
			if g >= 0 && g < maxNodeGPUs {
				m |= 1 << uint(g)
			}
		}
		slots = append(slots, keptSlot{node: sl.Node, mask: m, any: len(sl.GPUs) > 0})
		e.gpus += len(sl.GPUs)
	}
	e.slots = slots
}

// keepUsable reports whether k was built for this cycle's nodes, teams
// and mode.
func (st *state) keepUsable(k *RunningKeep, owners []int) bool {
	if !k.valid || k.mode != st.p.Mode || len(st.s.Nodes) != k.nNodes || !slices.Equal(owners, k.owners) {
		return false
	}
	if len(st.s.Nodes) > 0 && (!st.s.NodesSame || &st.s.Nodes[0] != k.src) {
		return false
	}
	return slices.Equal(k.names, st.teamNames)
}

// buildRunningKept is buildRunning and buildIndex from the keep: the
// changed jobs are applied to the kept nodes and index, which are copied
// into the cycle; every running job's entry is then read from the keep.
func (st *state) buildRunningKept(k *RunningKeep, owners []int, usable bool) {
	if !usable {
		st.buildRunning()
		st.buildIndex()
		st.keepSave(k, owners)
		return
	}
	st.keepApply(k)
	// The cycle's nodes and index: the kept ones.
	st.nodes = grow(st.nodes, len(k.nodes))
	copy(st.nodes, k.nodes)
	for pi := range st.pools {
		st.pools[pi].allocIndex()
		copy(st.pools[pi].words, k.words[pi])
		copy(st.pools[pi].counts, k.counts[pi])
	}
	for gi := range st.grps {
		st.grps[gi].wf = k.wf[gi]
	}
	st.free = k.free
	for i := range st.teams {
		st.teams[i].alloc = k.alloc[i]
	}
	st.keep = k
	// The running jobs are read when a job is blocked (or one is
	// terminating, in ModeAllot): runs() fills them then.
	st.runLazy = true
	if st.p.Mode != ModeAllot {
		return // only ModeAllot reads the nodes' until (placePacked)
	}
	// The nodes' until, in a compact array first (the node states are
	// larger than a cache).
	until := resize(k.until, len(st.nodes))
	k.until = until
	for i := range k.entries {
		e := &k.entries[i]
		end := keptEnd(e, st.now)
		for _, sl := range e.slots {
			if sl.any {
				until[sl.node] = max(until[sl.node], end)
			}
		}
	}
	for i, u := range until {
		if u != 0 {
			st.nodes[i].until = u
		}
	}
}

// keptEnd is a kept job's runJob.end (as buildRunning sets it).
func keptEnd(e *keptRun, now time.Time) int64 {
	switch {
	case e.term:
		return max(rel(e.graceEnd, now), 0)
	case e.limit > 0:
		return max(addSat(rel(e.start, now), int64(e.limit)), 0)
	}
	return never
}

// terminating reports whether a running job is in its grace period.
func (st *state) terminating() bool {
	if st.runLazy {
		return st.keep.terms > 0
	}
	for i := range st.run {
		if st.run[i].term {
			return true
		}
	}
	return false
}

// runs is the running jobs' working state, filled from the keep on first
// use when the cycle deferred it.
func (st *state) runs() []runJob {
	if st.runLazy {
		st.runLazy = false
		st.fillRunKept()
	}
	return st.run
}

// fillRunKept sets st.run from the keep's entries as buildRunning does
// (the teams' alloc and the nodes' until come from buildRunningKept).
func (st *state) fillRunKept() {
	k := st.keep
	st.run = grow(st.run, len(st.s.Running))
	for i := range st.s.Running {
		e := &k.entries[i]
		r := &st.run[i]
		*r = runJob{j: &st.s.Running[i], team: e.team, class: e.class, gpus: e.gpus}
		if !e.classFixed {
			var t *Team
			if r.team >= 0 {
				t = st.teams[r.team].t
			}
			r.class = effClass(r.j, t)
		}
		r.startRel = rel(e.start, st.now)
		r.term = e.term
		r.end = keptEnd(e, st.now)
	}
}

// keepSave stores this cycle's running state (just built) in k.
func (st *state) keepSave(k *RunningKeep, owners []int) {
	k.valid = true
	k.mode, k.nNodes = st.p.Mode, len(st.s.Nodes)
	k.src = nil
	if len(st.s.Nodes) > 0 {
		k.src = &st.s.Nodes[0]
	}
	k.owners = append(k.owners[:0], owners...)
	k.names = append(k.names[:0], st.teamNames...)
	k.entries = grow(k.entries, len(st.s.Running))
	for i := range st.s.Running {
		st.keptOf(&st.s.Running[i], &k.entries[i])
	}
	k.dirty = k.dirty[:0]
	k.nodes = append(k.nodes[:0], st.nodes...)
	for i := range k.nodes {
		k.nodes[i].until = 0
	}
	k.free = st.free
	k.terms = 0
	for i := range k.entries {
		if k.entries[i].term {
			k.terms++
		}
	}
	k.alloc = k.alloc[:0]
	for i := range st.teams {
		k.alloc = append(k.alloc, st.teams[i].alloc)
	}
	k.words = grow(k.words, len(st.pools))
	k.counts = grow(k.counts, len(st.pools))
	for pi := range st.pools {
		k.words[pi] = append(k.words[pi][:0], st.pools[pi].words...)
		k.counts[pi] = append(k.counts[pi][:0], st.pools[pi].counts...)
	}
	k.wf = k.wf[:0]
	for gi := range st.grps {
		k.wf = append(k.wf, st.grps[gi].wf)
	}
	k.mark = resize(k.mark, len(st.nodes))
	// Which nodes have a GPU held twice (by two jobs, or by a job and the
	// node's unavailable or out-of-range GPUs).
	k.shared = resize(k.shared, len(st.nodes))
	used := resize(k.until, len(st.nodes)) // scratch, as masks
	for i := range used {
		used[i] = int64(st.tc.base[i].used)
	}
	for i := range k.entries {
		for _, sl := range k.entries[i].slots {
			if uint64(used[sl.node])&sl.mask != 0 {
				k.shared[sl.node] = true
			}
			used[sl.node] |= int64(sl.mask)
		}
	}
	k.until = used
}

// keepApply applies the changed, added and removed positions to k's
// entries, nodes and index. On a node where no two kept jobs (nor an
// unavailable GPU) share a GPU, the leaving jobs' GPUs are cleared and
// the coming ones' set; on one where some do (bad input, kept as
// buildRunning reads it), its GPUs in use are recomputed from every job.
func (st *state) keepApply(k *RunningKeep) {
	n := len(st.s.Running)
	old := len(k.entries)
	k.touched, k.gone, k.came = k.touched[:0], k.gone[:0], k.came[:0]
	touch := func(e *keptRun, list *[]keptSlot) {
		d := 1
		if list == &k.gone {
			d = -1
		}
		if e.term {
			k.terms += d
		} else if e.team >= 0 {
			k.alloc[e.team] += d * e.gpus
		}
		for _, sl := range e.slots {
			if !k.mark[sl.node] {
				k.mark[sl.node] = true
				k.touched = append(k.touched, sl.node)
			}
			*list = append(*list, sl)
		}
	}
	// A position reported twice is applied once (its leaving GPUs would
	// otherwise come twice and read as shared).
	slices.Sort(k.dirty)
	k.dirty = slices.Compact(k.dirty)
	for _, i := range k.dirty {
		if i < 0 || i >= min(n, old) {
			continue // added or removed: below
		}
		e := &k.entries[i]
		touch(e, &k.gone)
		st.keptOf(&st.s.Running[i], e)
		touch(e, &k.came)
	}
	k.dirty = k.dirty[:0]
	for i := n; i < old; i++ {
		touch(&k.entries[i], &k.gone)
	}
	if n < old {
		k.entries = k.entries[:n]
	}
	for i := old; i < n; i++ {
		if i < cap(k.entries) {
			k.entries = k.entries[:i+1]
		} else {
			k.entries = append(k.entries, keptRun{})
		}
		e := &k.entries[i]
		st.keptOf(&st.s.Running[i], e)
		touch(e, &k.came)
	}
	base := st.tc.base // the topology's nodes: unavailable GPUs only
	for _, nd := range k.touched {
		k.mark[nd] = false
		ns := &k.nodes[nd]
		used := ns.used
		if !k.shared[nd] {
			for _, sl := range k.gone {
				if sl.node == nd {
					used &^= sl.mask
				}
			}
			for _, sl := range k.came {
				if sl.node == nd {
					if used&sl.mask != 0 {
						k.shared[nd] = true
					}
					used |= sl.mask
				}
			}
		}
		if k.shared[nd] {
			used = base[nd].used
			for i := range k.entries {
				for _, sl := range k.entries[i].slots {
					if sl.node == nd {
						used |= sl.mask
					}
				}
			}
		}
		ns.used = used
		if ns.pool < 0 {
			continue
		}
		f := maxNodeGPUs - bits.OnesCount64(used)
		if f == ns.free {
			continue
		}
		pi := int(ns.pool)
		w := (len(st.pools[pi].nodes) + 63) / 64
		bit := uint64(1) << uint(ns.pos&63)
		k.words[pi][ns.free*w+int(ns.pos>>6)] &^= bit
		k.counts[pi][ns.free]--
		if ns.free == ns.cap {
			k.wf[ns.group] -= ns.cap
		}
		k.free += f - ns.free
		ns.free = f
		k.words[pi][f*w+int(ns.pos>>6)] |= bit
		k.counts[pi][f]++
		if f == ns.cap {
			k.wf[ns.group] += ns.cap
		}
	}
}
