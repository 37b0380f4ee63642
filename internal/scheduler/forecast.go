package scheduler

import (
	"cmp"
	"math"
	"slices"
)

// forecastDepth bounds the blocked jobs per cycle that get a forecast start
// (ETAForecast); maxForecastDepth bounds those of Policy.EstimateFor (the
// projection runs through every blocked job ahead of them). Each costs
// O(eligible nodes).
const (
	forecastDepth    = 256
	maxForecastDepth = 512
)

// fcast is the start forecast's working state: for every node taking work,
// each allocatable GPU's projection, sorted by free time.
type fcast struct {
	at  []gpuSlot // flat: node n's GPUs are at[off[n]:off[n+1]]
	off []int32
	gap []bool   // node n has a GPU with a gap
	win []gpuWin // scratch
	// The single-node index (see fcFast): per pool, per GPU count g, a
	// min tree over the pool's nodes without a gap, built on first use;
	// the nodes with a gap, per pool, are scanned.
	trees  [][]fcTree
	gaps   [][]int
	listed []bool // node n is in its pool's gaps
	stack  []int  // tree walk scratch
}

// fcKey ranks a node without a gap for a single-node job of g GPUs: when
// its g-th earliest GPU comes free, how many of its GPUs are free then,
// its index (forecastPlace's best fit, lexicographic).
type fcKey struct {
	t int64
	c int32
	n int32
}

var noKey = fcKey{t: never, c: math.MaxInt32, n: math.MaxInt32}

func (a fcKey) less(b fcKey) bool {
	return a.t < b.t || a.t == b.t && (a.c < b.c || a.c == b.c && a.n < b.n)
}

// fcTree is a min tree of fcKeys over a pool's node positions: leaves at
// k[size+pos], k[i] = min(k[2i], k[2i+1]).
type fcTree struct {
	built bool
	size  int
	k     []fcKey
}

// fcFast switches on the forecast's shortcuts, which change no result:
// the single-node index, the multi-node domains' filter and
// preemptTable's skip. Off, every eligible node is scanned (a test
// compares the two).
var fcFast = true

// gpuSlot is one GPU in the projection: free from fa on (never if
// unavailable), and idle in the gap [gs, ge) before a projected job (a
// shorter job may use it: backfill).
type gpuSlot struct{ fa, gs, ge int64 }

// gpuWin is the earliest window on GPU k (index into the node's slots) a
// job may start in: from s, free until e.
type gpuWin struct {
	s, e int64
	k    int
	gap  bool
}

func cmpSlot(a, b gpuSlot) int { return cmp.Compare(a.fa, b.fa) }

// expectedRun is a job's expected run time for the forecast: Expected,
// else Estimate (capped at the time limit), else the time limit (never
// when it has none).
func expectedRun(j *Job) int64 {
	lim := never
	if j.TimeLimit > 0 {
		lim = int64(j.TimeLimit)
	}
	e := j.Expected
	if e <= 0 {
		e = j.Estimate
	}
	if e <= 0 {
		return lim
	}
	return min(int64(e), lim)
}

// expectedEnd is when running job r is expected to release its GPUs.
func (st *state) expectedEnd(r *runJob) int64 {
	if r.term {
		return r.end // grace end (or its limit, if earlier)
	}
	e := expectedRun(r.j)
	if e == never || r.end == never {
		if e == never {
			return r.end
		}
		return max(addSat(r.startRel, e), 0)
	}
	if x := addSat(r.startRel, e); x > 0 {
		return min(x, r.end)
	}
	// Past its expected run time: halfway to its time limit.
	return r.end / 2
}

// buildForecast sets up the per-GPU free times after this cycle's starts
// and preemptions.
func (st *state) buildForecast() *fcast {
	f := &st.fc
	f.off = resize(f.off, len(st.nodes)+1)
	total := 0
	for i := range st.nodes {
		f.off[i] = int32(total)
		if st.nodes[i].pool >= 0 {
			total += st.nodes[i].cap
		}
	}
	f.off[len(st.nodes)] = int32(total)
	f.at = resize(f.at, total)
	f.gap = resize(f.gap, len(st.nodes))
	f.listed = resize(f.listed, len(st.nodes))
	f.trees = grow(f.trees, len(st.pools))
	f.gaps = grow(f.gaps, len(st.pools))
	for pi := range st.pools {
		f.trees[pi] = grow(f.trees[pi], st.pools[pi].maxCap+1)
		for g := range f.trees[pi] {
			f.trees[pi][g].built = false
		}
		f.gaps[pi] = f.gaps[pi][:0]
	}
	// Free now: 0; unavailable: never. Running GPUs are set below.
	for i := range st.nodes {
		ns := &st.nodes[i]
		if ns.pool < 0 {
			continue
		}
		g := f.at[f.off[i]:f.off[i+1]]
		unavail := st.unavailable(i)
		for k := range g {
			if unavail&(1<<uint(k)) != 0 {
				g[k].fa = never
			}
		}
	}
	set := func(slots []Slot, end int64) {
		for _, sl := range slots {
			if sl.Node < 0 || sl.Node >= len(st.nodes) || st.nodes[sl.Node].pool < 0 {
				continue
			}
			g := f.at[f.off[sl.Node]:f.off[sl.Node+1]]
			for _, k := range sl.GPUs {
				if k >= 0 && k < len(g) {
					g[k].fa = end
				}
			}
		}
	}
	for i := range st.runs() {
		r := &st.runs()[i]
		set(r.j.Placement, st.expectedEnd(r))
	}
	for i := range st.starts {
		s := &st.starts[i]
		set(s.slots, expectedRun(s.p.j))
	}
	for i := range st.nodes {
		if st.nodes[i].pool >= 0 {
			slices.SortFunc(f.at[f.off[i]:f.off[i+1]], cmpSlot)
		}
	}
	return f
}

// unavailable is the bit set of node n's GPUs that are out of service
// (Node.Unavailable).
func (st *state) unavailable(n int) uint64 {
	var m uint64
	for _, u := range st.s.Nodes[n].Unavailable {
		if u >= 0 && u < maxNodeGPUs {
			m |= 1 << uint(u)
		}
	}
	return m
}

// take marks the k earliest-free GPUs of node n busy from t until end;
// the idle time before t becomes the GPU's gap if longer than its gap.
func (f *fcast) take(n, k int, t, end int64) {
	g := f.at[f.off[n]:f.off[n+1]]
	for i := 0; i < k && i < len(g); i++ {
		occupy(&g[i], t, end, false)
		f.gap[n] = f.gap[n] || g[i].ge > g[i].gs
	}
	slices.SortFunc(g, cmpSlot)
}

// occupy puts a job on GPU x from t to end, in its gap or after fa.
func occupy(x *gpuSlot, t, end int64, inGap bool) {
	if inGap {
		x.gs = end // what is left of the gap after the job
		return
	}
	if t-x.fa > x.ge-x.gs {
		x.gs, x.ge = x.fa, t
	}
	x.fa = end
}

// fit is the earliest time (not before lo) g GPUs of node n are free
// together for run, using gaps; never if not. With apply, it takes them.
func (f *fcast) fit(n, g int, run, lo int64, apply bool) int64 {
	slots := f.at[f.off[n]:f.off[n+1]]
	if len(slots) < g {
		return never
	}
	w := f.win[:0]
	for k := range slots {
		x := &slots[k]
		if x.ge > x.gs {
			if s := max(x.gs, lo); addSat(s, run) <= x.ge {
				w = append(w, gpuWin{s: s, e: x.ge, k: k, gap: true})
				continue
			}
		}
		w = append(w, gpuWin{s: max(x.fa, lo), e: never, k: k})
	}
	f.win = w
	slices.SortFunc(w, func(a, b gpuWin) int { return cmp.Or(cmp.Compare(a.s, b.s), cmp.Compare(b.e, a.e)) })
	t := w[g-1].s
	ok := t != never
	for _, x := range w[:g] {
		if addSat(t, run) > x.e {
			ok = false
		}
	}
	if !ok {
		// Without gaps: the g-th earliest free time.
		t = max(slots[g-1].fa, lo)
		if t == never {
			return never
		}
		if apply {
			f.take(n, g, t, addSat(t, run))
		}
		return t
	}
	if apply {
		end := addSat(t, run)
		for _, x := range w[:g] {
			occupy(&slots[x.k], t, end, x.gap)
			f.gap[n] = f.gap[n] || slots[x.k].ge > slots[x.k].gs
		}
		slices.SortFunc(slots, cmpSlot)
	}
	return t
}

// forecastOrder is the order the cycle served the blocked jobs in:
// preemptors whose victims are in their grace period, jobs that preempted
// this cycle, production classes, the starvation guard's jobs (oldest
// first), then the rest in queue order.
func (st *state) forecastOrder() []*pjob {
	out := make([]*pjob, 0, len(st.order))
	blocked := func(pj *pjob) bool { return !pj.started && !pj.never }
	for _, pj := range st.order {
		if blocked(pj) && (pj.inflight || pj.preempts > 0) {
			out = append(out, pj)
		}
	}
	rest := func(pj *pjob) bool { return blocked(pj) && !pj.inflight && pj.preempts == 0 }
	i := 0
	for ; i < len(st.order); i++ {
		pj := st.order[i]
		if pj.class >= Tier3 && len(st.starving) > 0 {
			break
		}
		if rest(pj) {
			out = append(out, pj)
		}
	}
	for _, pj := range st.starving {
		if rest(pj) {
			out = append(out, pj)
		}
	}
	for ; i < len(st.order); i++ {
		if pj := st.order[i]; rest(pj) && !pj.starving {
			out = append(out, pj)
		}
	}
	return out
}

// forecast returns the forecast start (relative; never = unknown) of each
// blocked job that want selects, indexed by pjob.idx, projecting at most
// forecastDepth blocked jobs beyond the last wanted one that is deeper.
func (st *state) forecast(want func(*pjob) bool, all bool) []int64 {
	est := make([]int64, len(st.pend))
	for i := range est {
		est[i] = never
	}
	order := st.forecastOrder()
	last := -1
	for i, pj := range order {
		if all && i < forecastDepth || i < maxForecastDepth && want(pj) {
			last = i
		}
	}
	if last < 0 {
		return est
	}
	f := st.buildForecast()
	fifo := st.p.Mode == ModeFIFO || st.p.Mode == ModeFIFOPartitioned
	floor := int64(0)
	var teamFloor map[int]int64
	if st.p.Mode == ModeFIFOPartitioned {
		teamFloor = map[int]int64{}
	}
	for _, pj := range order[:last+1] {
		lo := int64(0)
		if fifo {
			lo = floor
			if teamFloor != nil {
				lo = teamFloor[pj.team]
			}
		}
		if pj.resv >= 0 && (pj.inflight || pj.preempts > 0) {
			// GPUs freed by preemption are held for it.
			lo = max(lo, st.resvs[pj.resv].at)
		}
		at := st.forecastPlace(f, pj, lo)
		pj.fcPreempt = pj.inflight || pj.preempts > 0
		if pj.class.Production() && st.p.Mode == ModeAllot && !pj.inflight && pj.preempts == 0 {
			if t := st.preemptStart(pj); t < at {
				at, pj.fcPreempt = t, true
			}
		}
		est[pj.idx] = at
		if fifo && at != never {
			if teamFloor != nil {
				teamFloor[pj.team] = at
			} else {
				floor = at
			}
		}
	}
	return est
}

// forecastPlace finds the earliest time (not before lo) pj's GPUs are
// free in the projection, takes them for pj's expected run and returns
// that time (never if it never fits).
func (st *state) forecastPlace(f *fcast, pj *pjob, lo int64) int64 {
	g := pj.j.GPUs
	run := expectedRun(pj.j)
	if !pj.multi && fcFast {
		best := noKey
		for _, pi := range pj.elig {
			if g > st.pools[pi].maxCap {
				continue
			}
			if k := st.fcQuery(f, pi, g, lo); k.less(best) {
				best = k
			}
			// Nodes with a gap: a shorter job may fit in it.
			for _, n := range f.gaps[pi] {
				gs := f.at[f.off[n]:f.off[n+1]]
				if len(gs) < g {
					continue
				}
				t := f.fit(n, g, run, lo, false)
				if t == never || t > best.t {
					continue
				}
				free := 0
				for free < len(gs) && gs[free].fa <= t {
					free++
				}
				if k := (fcKey{t, int32(free), int32(n)}); k.less(best) {
					best = k
				}
			}
		}
		if best.t == never {
			return never
		}
		f.fit(int(best.n), g, run, lo, true)
		st.fcTouch(f, int(best.n))
		return best.t
	}
	if !pj.multi {
		bestT, bestFree, bestN := never, 0, -1
		for _, pi := range pj.elig {
			for _, n := range st.pools[pi].nodes {
				gs := f.at[f.off[n]:f.off[n+1]]
				if len(gs) < g {
					continue
				}
				var t int64
				if f.gap[n] {
					t = f.fit(n, g, run, lo, false)
				} else {
					t = max(gs[g-1].fa, lo) // no gap: the g-th earliest free time
				}
				if t > bestT || t == never {
					continue
				}
				// Best fit: the fewest GPUs free at that time.
				free := 0
				for free < len(gs) && gs[free].fa <= t {
					free++
				}
				if t < bestT || free < bestFree || free == bestFree && n < bestN {
					bestT, bestFree, bestN = t, free, n
				}
			}
		}
		if bestN < 0 || bestT == never {
			return never
		}
		f.fit(bestN, g, run, lo, true)
		return bestT
	}
	// Multi-node: whole nodes (or q GPUs per node) of one domain, taken in
	// the order they come free.
	type nodeAt struct {
		t int64
		n int
	}
	var buf []nodeAt
	bestT, bestG := never, -1
	var bestNodes []nodeAt
	for _, pi := range pj.elig {
		for _, gi := range st.pools[pi].groups {
			gr := &st.grps[gi]
			if gr.capSum < g {
				continue
			}
			buf = buf[:0]
			for _, n := range gr.nodes {
				gs := f.at[f.off[n]:f.off[n+1]]
				k := len(gs)
				if pj.q > 0 {
					k = pj.q
				}
				if k == 0 || len(gs) < k {
					continue
				}
				// Only a node free before the best domain's time can
				// make this domain better: the others sort after them.
				if t := max(gs[k-1].fa, lo); t < bestT || !fcFast {
					buf = append(buf, nodeAt{t, n})
				}
			}
			slices.SortFunc(buf, func(a, b nodeAt) int { return cmp.Or(cmp.Compare(a.t, b.t), cmp.Compare(a.n, b.n)) })
			got := 0
			for i, x := range buf {
				if pj.q > 0 {
					got += pj.q
				} else {
					got += f.len(x.n)
				}
				if got >= g {
					if x.t < bestT {
						bestT, bestG = x.t, gi
						bestNodes = append(bestNodes[:0], buf[:i+1]...)
					}
					break
				}
			}
		}
	}
	if bestG < 0 || bestT == never {
		return never
	}
	end := addSat(bestT, run)
	left := g
	for _, x := range bestNodes {
		k := f.len(x.n)
		if pj.q > 0 {
			k = pj.q
		}
		k = min(k, left)
		f.take(x.n, k, bestT, end)
		if fcFast {
			st.fcTouch(f, x.n)
		}
		left -= k
	}
	return bestT
}

// fcKeyOf is node n's key for g GPUs (noKey if it has a gap, fewer GPUs,
// or never has g free).
func (f *fcast) fcKeyOf(n, g int) fcKey {
	if f.gap[n] {
		return noKey
	}
	gs := f.at[f.off[n]:f.off[n+1]]
	if len(gs) < g || gs[g-1].fa == never {
		return noKey
	}
	t := gs[g-1].fa
	c := g
	for c < len(gs) && gs[c].fa <= t {
		c++
	}
	return fcKey{t, int32(c), int32(n)}
}

// fcQuery is the best node without a gap of pool pi for g GPUs not
// before lo, as forecastPlace ranks them: the least (start, GPUs free
// then, index), the start being max(key.t, lo); noKey if none.
func (st *state) fcQuery(f *fcast, pi, g int, lo int64) fcKey {
	tr := &f.trees[pi][g]
	if !tr.built {
		nodes := st.pools[pi].nodes
		size := 1
		for size < len(nodes) {
			size *= 2
		}
		tr.size = size
		tr.k = grow(tr.k, 2*size)
		for i := range size {
			k := noKey
			if i < len(nodes) {
				k = f.fcKeyOf(nodes[i], g)
			}
			tr.k[size+i] = k
		}
		for i := size - 1; i >= 1; i-- {
			a, b := tr.k[2*i], tr.k[2*i+1]
			if b.less(a) {
				a = b
			}
			tr.k[i] = a
		}
		tr.built = true
	}
	root := tr.k[1]
	if root.t == never || root.t >= lo {
		// Every node starts when its g-th GPU comes free: the keys are
		// exact.
		return root
	}
	// Every node whose g-th GPU is free by lo starts at lo: the fewest
	// GPUs free at lo, then the lowest index. (Free times are never
	// before now, so with lo = 0, as in ModeAllot and ModeEASY but for
	// preemptors, this is not reached.)
	best := noKey
	stack := append(f.stack[:0], 1)
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if tr.k[i].t > lo {
			continue
		}
		if i < tr.size {
			stack = append(stack, 2*i+1, 2*i)
			continue
		}
		n := int(tr.k[i].n)
		gs := f.at[f.off[n]:f.off[n+1]]
		free := 0
		for free < len(gs) && gs[free].fa <= lo {
			free++
		}
		if k := (fcKey{lo, int32(free), int32(n)}); k.less(best) {
			best = k
		}
	}
	f.stack = stack
	return best
}

// fcTouch updates the index after node n's projection changed.
func (st *state) fcTouch(f *fcast, n int) {
	ns := &st.nodes[n]
	if ns.pool < 0 {
		return
	}
	pi := int(ns.pool)
	if f.gap[n] && !f.listed[n] {
		f.listed[n] = true
		f.gaps[pi] = append(f.gaps[pi], n)
	}
	for g := range f.trees[pi] {
		tr := &f.trees[pi][g]
		if !tr.built {
			continue
		}
		i := tr.size + int(ns.pos)
		tr.k[i] = f.fcKeyOf(n, g)
		for i /= 2; i >= 1; i /= 2 {
			a, b := tr.k[2*i], tr.k[2*i+1]
			if b.less(a) {
				a = b
			}
			tr.k[i] = a
		}
	}
}

func (f *fcast) len(n int) int { return int(f.off[n+1] - f.off[n]) }

// preemptStart is when a blocked production job that may preempt is
// expected to start by preemption: the earliest time some eligible node
// has enough GPUs free now or held by jobs it may take (past MinRuntime by
// then), plus one grace period; never when no node ever does (or for
// multi-node jobs, which are left to the queue forecast). The earliest
// time per pool and GPU count is computed once per cycle for each
// (class, reclaim) right, so a job costs O(pools).
func (st *state) preemptStart(pj *pjob) int64 {
	if pj.multi {
		return never
	}
	mg := st.preemptRight(pj)
	if mg < 0 {
		return never
	}
	key := preemptKey{pj.class, pj.reclaim}
	tab, ok := st.preTabs[key]
	if !ok {
		tab = st.preemptTable(pj.class, pj.reclaim, mg)
		if st.preTabs == nil {
			st.preTabs = map[preemptKey][][]int64{}
		}
		st.preTabs[key] = tab
	}
	g := pj.j.GPUs
	best := never
	for _, pi := range pj.elig {
		if g < len(tab[pi]) {
			best = min(best, tab[pi][g])
		}
	}
	return best
}

type preemptKey struct {
	class   Tier
	reclaim bool
}

// preemptTable returns, per pool and GPU count g, the earliest time a job
// of class c with victim groups up to mg could start on one node of the
// pool by preemption (see preemptStart).
func (st *state) preemptTable(c Tier, reclaim bool, mg int) [][]int64 {
	st.buildNodeRun()
	minRun := int64(st.p.MinRuntime)
	grace := int64(st.p.GracePeriod)
	tab := make([][]int64, len(st.pools))
	for pi := range st.pools {
		pl := &st.pools[pi]
		row := make([]int64, pl.maxCap+1)
		for g := range row {
			row[g] = never
		}
		tab[pi] = row
	}
	type cand struct {
		at    int64
		gpus  int
		ri    int // the victim, -1 for a terminating job
		group int // its victim group, -1 for a terminating job
	}
	var cs, due []cand
	var taken []int // per team, as preempt counts a victim set (countVictim); cleared per use
	if mg == vgAboveGuarantee {
		taken = st.takenBuf()
	}
	for n := range st.nodes {
		ns := &st.nodes[n]
		if ns.pool < 0 {
			continue
		}
		// row is nondecreasing in g, and a victim frees its GPUs a grace
		// period from now at the earliest (a terminating job may free
		// them sooner): when row[cap] is already at most that, such a
		// node only adds the GPUs free now.
		if row := tab[ns.pool]; fcFast && grace >= 0 && row[ns.cap] <= grace {
			term := false
			for _, ri := range st.nodeRun[n] {
				if st.runs()[ri].term {
					term = true
					break
				}
			}
			if !term {
				for g := 1; g <= ns.free; g++ {
					row[g] = 0
				}
				continue
			}
		}
		cs = cs[:0]
		for _, ri := range st.nodeRun[n] {
			r := &st.runs()[ri]
			k := r.gpusOn(n)
			if r.term {
				cs = append(cs, cand{max(r.end, 0), k, -1, -1}) // freed at its grace end
				continue
			}
			if r.class.Production() || r.gpus == 0 || (!reclaim && !st.mayPreempt(c, r.class)) {
				continue
			}
			if group := st.runGroup(r); group <= mg {
				cs = append(cs, cand{addSat(max(r.startRel+minRun, 0), grace), k, ri, group})
			}
		}
		slices.SortFunc(cs, func(a, b cand) int { return cmp.Compare(a.at, b.at) })
		row := tab[ns.pool]
		if taken == nil {
			avail, at, next := ns.free, int64(0), 0
			for g := 1; g <= ns.cap; g++ {
				for avail < g && next < len(cs) {
					avail += cs[next].gpus
					at = max(at, cs[next].at)
					next++
				}
				if avail < g {
					break
				}
				row[g] = min(row[g], at)
			}
			continue
		}
		// At most each team's excess, as preempt takes: at each time a
		// candidate comes due, the victims due by then are taken as
		// nodeVictims takes them (terminating jobs, then preemptible
		// ones, then work above a guarantee), each checked against its
		// team's excess.
		for i := 0; i < len(cs); i++ {
			at := cs[i].at
			for i+1 < len(cs) && cs[i+1].at == at {
				i++
			}
			due = append(due[:0], cs[:i+1]...)
			slices.SortStableFunc(due, func(a, b cand) int { return cmp.Compare(a.group, b.group) })
			avail := ns.free
			for _, c := range due {
				if c.ri < 0 || st.takeVictim(c.ri, c.group, mg, taken) {
					avail += c.gpus
				}
			}
			clear(taken)
			for g := 1; g <= min(avail, ns.cap); g++ {
				row[g] = min(row[g], at)
			}
		}
	}
	return tab
}
