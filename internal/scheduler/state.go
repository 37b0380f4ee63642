package scheduler

import (
	"cmp"
	"maps"
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"
)

// Internal times are int64 nanoseconds relative to now (now = 0); never is
// +inf. time.Time.Sub saturates, so relative times never overflow.
const never = int64(math.MaxInt64)

// noVictimLimit: any running job's submit time qualifies it as a victim.
const noVictimLimit = int64(math.MinInt64)

// maxNodeGPUs is the most GPUs per node the scheduler can allocate; GPU
// indices at or above it are ignored.
const maxNodeGPUs = 64

func rel(t, now time.Time) int64 {
	if t.IsZero() {
		return math.MinInt64 / 2
	}
	// As t.Sub(now), saturating, without Sub's overflow check (an Add and
	// an Equal), which cost more than the rest of a running job's setup.
	const maxSec = math.MaxInt64/int64(time.Second) - 1
	ds := t.Unix() - now.Unix()
	switch {
	case ds > maxSec:
		return math.MaxInt64
	case ds < -maxSec:
		return math.MinInt64
	}
	return ds*int64(time.Second) + int64(t.Nanosecond()-now.Nanosecond())
}

func abs(x int64, now time.Time) time.Time {
	if x == never {
		return time.Time{}
	}
	return now.Add(time.Duration(x))
}

// addSat adds a duration to a relative time, saturating at never.
func addSat(t, d int64) int64 {
	if t == never || d == never {
		return never
	}
	if d > 0 && t > never-d {
		return never
	}
	return t + d
}

// nodeState is the working state of one node during a cycle.
type nodeState struct {
	cap    int    // allocatable GPUs (0 if the node takes no new work)
	used   uint64 // GPUs in use, unavailable or out of range
	free   int
	pool   int32 // index into state.pools; -1 if no new work starts here
	group  int32 // index into state.groups; -1 if none
	pos    int32 // position in pool.nodes
	claims []claimRef
	// until is when the node's last running (or started) job reaches its
	// time limit (relative; 0 if none): the earliest the node can be
	// wholly free by time limits.
	until int64
}

// claimRef is one reservation's hold on a node: a job ending after the
// reservation's time may use at most spare GPUs of the node.
type claimRef struct {
	res   int
	spare int
}

// pool is a set of nodes with the same GPU type, site and (in
// ModeFIFOPartitioned) owning team, indexed by free-GPU count.
type pool struct {
	gpuType string
	onprem  bool
	owner   int // team index in ModeFIFOPartitioned, else -1
	maxCap  int
	nodes   []int      // node indices, ascending
	buckets [][]uint64 // buckets[f]: bitset over positions of unclaimed nodes with f free GPUs
	counts  []int
	words   []uint64 // backing array of buckets
	groups  []int    // groups of this pool
}

// group is an interconnect domain inside a pool.
type group struct {
	pool   int
	domain string
	nodes  []int // ascending
	capSum int
	wf     int // GPUs of unclaimed whole-free nodes
}

// runJob is a running job of the snapshot.
type runJob struct {
	j        *Job
	team     int
	class    Tier
	end      int64 // expected release time (time limit, or grace end)
	term     bool  // terminating (in the snapshot or preempted this cycle)
	victim   bool  // preempted this cycle
	gpus     int
	startRel int64
	lost     float64 // GPU-seconds lost if preempted now (set by buildNodeRun)
	vprio    float64 // priority as a victim (set by buildNodeRun)
	requeued float64 // OrderResponse priority once requeued (set by buildNodeRun; see requeuedPriority)
}

// pjob is a pending job.
type pjob struct {
	idx   int // index into Snapshot.Pending
	j     *Job
	team  int
	class Tier
	limit int64 // time limit, never if none
	// run is the run time reservations and backfill assume: the time
	// limit, or under Policy.PredictedBackfill Job.Predicted (capped at
	// the limit) when set.
	run      int64
	submit   int64
	elig     []int // eligible pools
	maxCap   int
	groupCap int  // largest eligible domain capacity
	multi    bool // needs several nodes
	q        int  // GPUs per node in multi mode, 0 = whole nodes
	never    bool // can never run on this cluster
	// outcome
	started   bool
	resv      int  // reservation index or -1
	resvCause bool // the reservation waits for a release (not only for other reservations)
	preempts  int  // victims this job preempted this cycle
	inflight  bool // its victims are in their grace period
	early     bool // served among the in-flight preemptors, before the queue
	reclaim   bool // it takes its class's reserved GPUs back (Policy.Reserved)
	starving  bool // served by the starvation guard this cycle
	// starvedTeam: it may preempt because its team is starved
	// (Policy.StarvedTeamPreempt); it then takes only younger work.
	starvedTeam bool
	fcPreempt   bool // its forecast start comes from preemption
	blocker     string
}

// started is a job started this cycle.
type startRec struct {
	p     *pjob
	slots []Slot
	end   int64
	pend  int64 // predicted end (pjob.run)
}

// reservation is an internal reservation.
type reservation struct {
	p      *pjob
	at     int64
	end    int64 // at + limit
	pend   int64 // at + run (predicted end)
	claims []Claim
	cause  event
	pred   bool // at is by predicted run times (Policy.PredictedBackfill)
}

type teamState struct {
	t         *Team
	guarantee int
	alloc     int // GPUs of non-terminating running + started jobs (+ preemption reservations)
	share     TeamShare
	// Policy.TeamWaitBoost: the summed wait (ns) and count of the team's
	// pending tier 3-4 jobs, and the boost they give its priority.
	waitSum float64
	waitN   int
	boost   float64
}

// state is the working state of one cycle.
type state struct {
	s     *Snapshot
	now   time.Time
	p     Policy
	nodes []nodeState
	pools []pool
	// offline counts nodes not up (draining, drained, down): a job that
	// fits none of the nodes up may still fit when they come back.
	offline int
	grps    []group

	teams   []teamState
	teamIdx map[string]int

	run []runJob // read through runs()
	// runLazy: run is not filled yet; runs() fills it from keep.
	runLazy bool
	keep    *RunningKeep
	pend    []pjob
	order   []*pjob
	starts  []startRec
	resvs   []reservation
	claimed []int // claimed node indices
	free    int   // free GPUs on nodes taking work
	total   int   // cluster GPUs (lazy)

	eligCache   map[eligKey]*eligInfo
	lastEligKey eligKey
	lastElig    *eligInfo

	runEvents []event // sorted lazily
	runSorted bool
	runRel    []nodeRel // releases of runEvents[i] are runRel[runRelOff[i]:runRelOff[i+1]]
	runRelOff []int32
	evTmp     []event   // sortEvents' scratch
	relTmp    []nodeRel // buildRunEvents' scratch: releases by running job
	relTmpOff []int32
	keyBuf    []orderKey // the queue's sort keys without an OrderMemory
	// The same by predicted ends (Policy.PredictedBackfill).
	predEvents []event
	predSorted bool
	predRel    []nodeRel
	predRelOff []int32
	nodeRun    [][]int // node -> running job indices, built lazily
	victims    []int   // running jobs preempted this cycle
	taken      []int   // per team: GPUs a victim set takes (countVictim), zero between uses
	isVictim   []bool  // by running job index

	// sweep scratch
	sf       []int
	mark     []int
	lastEv   []event
	eligMask []bool
	gsum     []int
	extraBuf []event
	touched  []int

	head *pjob // first blocked job (baselines)

	starving []*pjob // the starvation guard's jobs, oldest first (ModeAllot)
	fc       fcast   // start forecast scratch (finish)
	tc       topoCache
	rawTotal int // clusterGPUs, when rawKnown (from the topology)
	rawKnown bool
	preTabs  map[preemptKey][][]int64 // preemptStart's tables, this cycle
	pc       partCache
	// buffers kept between cycles
	teamPtrs  []*Team
	teamNames []string // team names in st.teams order, as indexed by teamIdx
	teamsBuf  []teamState
	teamsSame bool       // this cycle's team names are the last cycle's
	runTeams  []teamMemo // buildRunning's memo, by position

	// victimAfter: while a research-class job looks for victims, only
	// running jobs submitted after this (relative) time qualify (see
	// tryPreempt); noVictimLimit otherwise.
	victimAfter int64
	// victimBelow: while a research-class job looks for victims under
	// OrderResponse, only running jobs of its class whose priority once
	// requeued would be below this qualify (see tryPreempt); +Inf
	// otherwise.
	victimBelow float64

	plan Plan
}

type eligKey struct {
	gpuType string
	onprem  bool
	owner   int
}

func nodeUp(n *Node) bool { return n.State == NodeUp || n.State == "" }

func onprem(site string) bool { return site == SiteOnPrem || site == "" }

// effClass is a job's effective class: explicit preemptible and budget
// demotion applied.
func effClass(j *Job, t *Team) Tier {
	c := j.Tier
	if c < Tier1 || c > TierPreemptible {
		c = Tier4
	}
	if j.Preemptible {
		return TierPreemptible
	}
	if t != nil && t.OverBudget && c.Research() {
		return TierPreemptible
	}
	return c
}

// statePool recycles the working state's buffers between cycles: a cycle
// on a small queue is dominated by allocating them otherwise. Nothing in a
// returned Plan points into a pooled buffer.
var statePool = sync.Pool{New: func() any { return new(state) }}

// resize returns xs with length n, zeroed, reusing its array when it can.
func resize[T any](xs []T, n int) []T {
	if cap(xs) < n {
		return make([]T, n)
	}
	xs = xs[:n]
	clear(xs)
	return xs
}

// teamMemo is a running job's team name and index (buildRunning).
type teamMemo struct {
	name string
	idx  int // -2: none
}

// grow returns xs with length n, reusing its array when it can; the
// elements are not cleared (the caller sets every one).
func grow[T any](xs []T, n int) []T {
	if cap(xs) < n {
		return make([]T, n)
	}
	return xs[:n]
}

// reset prepares a pooled state for a new cycle, keeping its buffers.
func (st *state) reset(s *Snapshot, now time.Time, p Policy) {
	old := *st
	*st = state{s: s, now: now, p: p, victimAfter: noVictimLimit, victimBelow: math.Inf(1)}
	st.nodes, st.run, st.pend, st.order = old.nodes, old.run, old.pend, old.order
	st.teamIdx, st.eligCache = old.teamIdx, old.eligCache
	if st.teamIdx == nil {
		st.teamIdx = map[string]int{}
	}
	if st.eligCache == nil {
		st.eligCache = map[eligKey]*eligInfo{}
	}
	st.sf, st.mark, st.lastEv = old.sf, old.mark, old.lastEv
	st.runEvents, st.runRel, st.runRelOff = old.runEvents[:0], old.runRel[:0], old.runRelOff[:0]
	st.predEvents, st.predRel, st.predRelOff = old.predEvents[:0], old.predRel[:0], old.predRelOff[:0]
	st.extraBuf, st.touched, st.evTmp = old.extraBuf[:0], old.touched[:0], old.evTmp
	st.relTmp, st.relTmpOff, st.keyBuf = old.relTmp, old.relTmpOff, old.keyBuf
	st.fc, st.tc, st.pc = old.fc, old.tc, old.pc
	st.teamPtrs, st.teamNames, st.teamsBuf, st.runTeams = old.teamPtrs, old.teamNames, old.teamsBuf, old.runTeams
}

// release returns st to the pool, dropping references to the snapshot.
func (st *state) release() {
	clear(st.run)
	clear(st.pend)
	clear(st.order)
	// st.nodes holds nothing of the snapshot (claims are indices): not cleared.
	clear(st.teamPtrs)
	clear(st.teamsBuf)
	st.s, st.plan, st.pools, st.grps, st.teams = nil, Plan{}, nil, nil, nil
	st.keep, st.runLazy = nil, false
	st.starts, st.resvs, st.victims, st.isVictim, st.nodeRun = nil, nil, nil, nil, nil
	st.head, st.lastElig, st.starving = nil, nil, nil
	statePool.Put(st)
}

// newState builds the working state. owners maps node -> owning team index
// (ModeFIFOPartitioned) or is nil.
func newState(s *Snapshot, now time.Time, p Policy) *state {
	st := statePool.Get().(*state)
	st.reset(s, now, p)
	st.buildTeams()
	owners := []int(nil)
	if p.Mode == ModeFIFOPartitioned {
		owners = st.partitionCached()
	}
	// A usable keep has the nodes with the running jobs applied: the
	// topology's are not copied first.
	kept := s.Keep != nil && st.keepUsable(s.Keep, owners)
	st.buildNodes(owners, kept)
	if p.Mode == ModeAllot && !p.RawGuarantees {
		st.scaleGuarantees()
	}
	if s.Keep != nil {
		st.buildRunningKept(s.Keep, owners, kept)
	} else {
		st.buildRunning()
		st.buildIndex()
	}
	return st
}

func cmpTeam(a, b *Team) int {
	return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Weight, b.Weight), cmp.Compare(a.Usage, b.Usage))
}

func (st *state) buildTeams() {
	ts := st.teamPtrs[:0]
	for i := range st.s.Teams {
		ts = append(ts, &st.s.Teams[i])
	}
	// Total order so that input order never matters.
	if !slices.IsSortedFunc(ts, cmpTeam) {
		slices.SortFunc(ts, cmpTeam)
	}
	st.teamPtrs = ts
	// The first of each name, in name order; the index is rebuilt only
	// when the names differ from the last cycle's.
	k := 0
	same := true
	for i, t := range ts {
		if i > 0 && t.Name == ts[i-1].Name {
			continue
		}
		if k >= len(st.teamNames) || st.teamNames[k] != t.Name {
			same = false
		}
		k++
	}
	same = same && k == len(st.teamNames)
	st.teamsSame = same
	if !same {
		clear(st.teamIdx)
		st.teamNames = st.teamNames[:0]
	}
	st.teams = st.teamsBuf[:0]
	for i, t := range ts {
		if i > 0 && t.Name == ts[i-1].Name {
			continue
		}
		if !same {
			st.teamIdx[t.Name] = len(st.teams)
			st.teamNames = append(st.teamNames, t.Name)
		}
		st.teams = append(st.teams, teamState{t: t, guarantee: guaranteeSum(t.Guarantee)})
	}
	st.teamsBuf = st.teams
	st.computeShares()
}

// guaranteeSum is the sum of a team's positive guarantees. A map of one
// untyped guarantee (the simulator's) is read without
// iterating it: an iteration costs more than the rest of a team's setup.
func guaranteeSum(m map[string]int) int {
	switch len(m) {
	case 0:
		return 0
	case 1:
		if v, ok := m[""]; ok {
			return max(v, 0)
		}
	}
	g := 0
	for _, v := range m {
		if v > 0 {
			g += v
		}
	}
	return g
}

// scaleGuarantees shrinks oversubscribed guarantees: when they add up to
// more than the cluster's GPUs, each team's guarantee becomes its
// proportional part of the cluster (rounded down). Otherwise every team
// is "under its guarantee", nobody is above it, and neither tier-2 jobs nor
// teams reclaiming their guarantee find a victim.
func (st *state) scaleGuarantees() {
	sum := 0
	for i := range st.teams {
		sum += st.teams[i].guarantee
	}
	total := st.clusterGPUs()
	if sum <= total || sum == 0 {
		return
	}
	for i := range st.teams {
		t := &st.teams[i]
		t.guarantee = int(int64(t.guarantee) * int64(total) / int64(sum))
	}
}

func (st *state) team(name string) (int, *Team) {
	if i, ok := st.teamIdx[name]; ok {
		return i, st.teams[i].t
	}
	return -1, nil
}

// partCache keeps the last partition: it depends only on the nodes and
// the teams' guarantees (in name order).
type partCache struct {
	src    *Node
	n      int
	guar   []map[string]int // copies, in st.teams order
	names  []string
	owners []int
}

// partitionCached is partition, reused while Snapshot.NodesSame holds and
// the teams and their guarantees are unchanged.
func (st *state) partitionCached() []int {
	c := &st.pc
	if st.s.NodesSame && len(st.s.Nodes) > 0 && &st.s.Nodes[0] == c.src && len(st.s.Nodes) == c.n && len(st.teams) == len(c.guar) {
		same := true
		for i := range st.teams {
			t := st.teams[i].t
			if t.Name != c.names[i] || !maps.Equal(t.Guarantee, c.guar[i]) {
				same = false
				break
			}
		}
		if same {
			return c.owners
		}
	}
	owners := st.partition()
	c.src, c.n, c.owners = nil, len(st.s.Nodes), owners
	if len(st.s.Nodes) > 0 {
		c.src = &st.s.Nodes[0]
	}
	c.guar, c.names = c.guar[:0], c.names[:0]
	for i := range st.teams {
		c.guar = append(c.guar, maps.Clone(st.teams[i].t.Guarantee))
		c.names = append(c.names, st.teams[i].t.Name)
	}
	return owners
}

// partition assigns nodes to teams for ModeFIFOPartitioned: teams in name
// order, typed guarantees (type name order) before untyped ones, each
// taking the lowest-index unassigned nodes until its guarantee is covered.
func (st *state) partition() []int {
	owners := make([]int, len(st.s.Nodes))
	for i := range owners {
		owners[i] = -1
	}
	take := func(ti int, gpuType string, want int) {
		got := 0
		for i := range st.s.Nodes {
			if got >= want {
				return
			}
			n := &st.s.Nodes[i]
			if owners[i] >= 0 || (gpuType != "" && n.GPUType != gpuType) {
				continue
			}
			owners[i] = ti
			got += n.GPUs
		}
	}
	for ti := range st.teams {
		g := st.teams[ti].t.Guarantee
		types := make([]string, 0, len(g))
		for k := range g {
			types = append(types, k)
		}
		slices.Sort(types)
		for _, k := range types {
			if k != "" && g[k] > 0 {
				take(ti, k, g[k])
			}
		}
		if g[""] > 0 {
			take(ti, "", g[""])
		}
	}
	return owners
}

// topoCache keeps what buildNodes derives from the nodes (and, in
// ModeFIFOPartitioned, their owners) for the next cycle run by the same
// pooled state: when that cycle's nodes are equal (compared field by
// field), only the per-cycle parts are reset. On a replay, where the
// nodes never change, this was the largest cost of a cycle.
type topoCache struct {
	valid   bool
	src     *Node // &Snapshot.Nodes[0] of the cycle that built it
	nodes   []Node
	owners  []int
	base    []nodeState // pool, group, pos, cap, used (unavailable GPUs)
	pools   []pool
	grps    []group
	offline int
	raw     int // clusterGPUs
}

func (c *topoCache) matches(ns []Node, same bool, owners []int) bool {
	if !c.valid || len(ns) != len(c.nodes) || !slices.Equal(owners, c.owners) {
		return false
	}
	if same && len(ns) > 0 && &ns[0] == c.src {
		return true // Snapshot.NodesSame
	}
	for i := range ns {
		a, b := &ns[i], &c.nodes[i]
		// Name is not compared: nothing depends on it.
		if a.GPUs != b.GPUs || len(a.Unavailable) != len(b.Unavailable) || a.State != b.State || a.Domain != b.Domain ||
			a.GPUType != b.GPUType || a.Site != b.Site || !slices.Equal(a.Unavailable, b.Unavailable) {
			return false
		}
	}
	return true
}

// buildNodes sets up the topology; with noCopy (a keep provides them) the
// nodes' states are left to the caller when the topology is kept.
func (st *state) buildNodes(owners []int, noCopy bool) {
	c := &st.tc
	if c.matches(st.s.Nodes, st.s.NodesSame, owners) {
		if len(st.s.Nodes) > 0 {
			c.src = &st.s.Nodes[0]
		}
		st.nodes = grow(st.nodes, len(st.s.Nodes))
		if !noCopy {
			copy(st.nodes, c.base)
		}
		st.rawTotal, st.rawKnown = c.raw, true
		st.pools, st.grps, st.offline = c.pools, c.grps, c.offline
		for gi := range st.grps {
			st.grps[gi].wf = 0
		}
		return
	}
	st.buildNodesFresh(owners)
	clear(st.eligCache)
	c.valid = true
	c.nodes = slices.Grow(c.nodes[:0], len(st.s.Nodes))
	for _, n := range st.s.Nodes {
		n.Unavailable = slices.Clone(n.Unavailable)
		c.nodes = append(c.nodes, n)
	}
	c.owners = slices.Clone(owners)
	c.src = nil
	if len(st.s.Nodes) > 0 {
		c.src = &st.s.Nodes[0]
	}
	c.base = append(c.base[:0], st.nodes...)
	c.pools, c.grps, c.offline = st.pools, st.grps, st.offline
	st.rawKnown = false
	c.raw = st.clusterGPUs()
	st.rawTotal, st.rawKnown = c.raw, true
}

func (st *state) buildNodesFresh(owners []int) {
	st.nodes = resize(st.nodes, len(st.s.Nodes))
	poolIdx := map[eligKey]int{}
	var lastKey eligKey
	lastPool := -1
	st.offline = 0
	for i := range st.s.Nodes {
		n := &st.s.Nodes[i]
		ns := &st.nodes[i]
		ns.pool, ns.group = -1, -1
		c := min(max(n.GPUs, 0), maxNodeGPUs)
		if c < maxNodeGPUs {
			ns.used = ^uint64(0) << uint(c)
		}
		for _, u := range n.Unavailable {
			if u >= 0 && u < c {
				ns.used |= 1 << uint(u)
			}
		}
		owner := -1
		if owners != nil {
			owner = owners[i]
			if owner < 0 {
				continue
			}
		}
		if !nodeUp(n) || c == 0 {
			if !nodeUp(n) {
				st.offline++
			}
			continue
		}
		ns.cap = c
		key := eligKey{n.GPUType, onprem(n.Site), owner}
		if lastPool >= 0 && key == lastKey {
			ns.pool = int32(lastPool)
			continue
		}
		pi, ok := poolIdx[key]
		lastKey, lastPool = key, pi
		if !ok {
			lastPool = len(st.pools)
			pi = len(st.pools)
			poolIdx[key] = pi
			st.pools = append(st.pools, pool{gpuType: key.gpuType, onprem: key.onprem, owner: owner})
		}
		ns.pool = int32(pi)
	}
	// Domain groups, in order of first node.
	type gk struct {
		pool   int32
		domain string
	}
	grpIdx := map[gk]int{}
	var lastGK gk
	lastG, placed := -1, 0
	for i := range st.nodes {
		ns := &st.nodes[i]
		if ns.pool < 0 {
			continue
		}
		placed++
		k := gk{ns.pool, st.s.Nodes[i].Domain}
		if lastG < 0 || k.pool != lastGK.pool || k.domain != lastGK.domain {
			gi, ok := grpIdx[k]
			if !ok {
				gi = len(st.grps)
				grpIdx[k] = gi
				st.grps = append(st.grps, group{pool: int(ns.pool), domain: k.domain})
				pl := &st.pools[ns.pool]
				pl.groups = append(pl.groups, gi)
			}
			lastGK, lastG = k, gi
		}
		ns.group = int32(lastG)
		pl := &st.pools[ns.pool]
		pl.maxCap = max(pl.maxCap, ns.cap)
		st.grps[lastG].capSum += ns.cap
		st.grps[lastG].wf++ // node count for now
	}
	// Size every node list exactly, from two shared backing arrays.
	poolCount := make([]int, len(st.pools))
	for i := range st.nodes {
		if p := st.nodes[i].pool; p >= 0 {
			poolCount[p]++
		}
	}
	back := make([]int, 2*placed)
	off := 0
	for pi := range st.pools {
		st.pools[pi].nodes = back[off : off : off+poolCount[pi]]
		off += poolCount[pi]
	}
	for gi := range st.grps {
		g := &st.grps[gi]
		g.nodes = back[off : off : off+g.wf]
		off += g.wf
		g.wf = 0
	}
	for i := range st.nodes {
		ns := &st.nodes[i]
		if ns.pool < 0 {
			continue
		}
		pl := &st.pools[ns.pool]
		ns.pos = int32(len(pl.nodes))
		pl.nodes = append(pl.nodes, i)
		g := &st.grps[ns.group]
		g.nodes = append(g.nodes, i)
	}
}

// buildRunning marks running jobs' GPUs as used. Input order is kept; all
// later uses of st.run order by total keys ending in the job id.
func (st *state) buildRunning() {
	needTeam := st.p.Mode == ModeAllot || st.p.Mode == ModeFIFOPartitioned
	st.run = grow(st.run, len(st.s.Running))
	// The team index of the job at each position in the previous cycle:
	// a caller that keeps its running jobs in place (the simulator) mostly
	// finds the same team there, and a string comparison is cheaper than a
	// map lookup. Valid while the team names are the same.
	memo := st.runTeams
	if !st.teamsSame {
		memo = memo[:0]
	}
	for len(memo) < len(st.s.Running) {
		memo = append(memo, teamMemo{idx: -2})
	}
	st.runTeams = memo
	for i := range st.s.Running {
		j := &st.s.Running[i]
		r := &st.run[i]
		*r = runJob{j: j, team: -1}
		if needTeam {
			if m := &memo[i]; m.idx != -2 && m.name == j.Team {
				r.team = m.idx
			} else {
				r.team, _ = st.team(j.Team)
				m.name, m.idx = j.Team, r.team
			}
		}
		r.class = j.RunAs
		if r.class < Tier1 || r.class > TierPreemptible {
			var t *Team
			if r.team >= 0 {
				t = st.teams[r.team].t
			}
			r.class = effClass(j, t)
		}
		r.startRel = rel(j.Start, st.now)
		if j.Terminating {
			r.term = true
			r.end = max(rel(j.GraceEnd, st.now), 0)
		} else if j.TimeLimit > 0 {
			r.end = max(addSat(r.startRel, int64(j.TimeLimit)), 0)
		} else {
			r.end = never
		}
		for _, sl := range j.Placement {
			if sl.Node < 0 || sl.Node >= len(st.nodes) {
				continue
			}
			ns := &st.nodes[sl.Node]
			if len(sl.GPUs) > 0 {
				ns.until = max(ns.until, r.end)
			}
			for _, g := range sl.GPUs {
				if g >= 0 && g < maxNodeGPUs {
					ns.used |= 1 << uint(g)
				}
			}
			r.gpus += len(sl.GPUs)
		}
		if r.team >= 0 && !r.term {
			st.teams[r.team].alloc += r.gpus
		}
	}
}

// runPrio is the priority of a running job for victim ordering: its
// team's fair-share and its size factor (age means nothing once started).
func (st *state) runPrio(r *runJob) float64 {
	return st.p.WeightFairShare*st.fairShare(r.team) + st.p.WeightSize*st.sizeFactor(r.gpus)
}

func (st *state) buildIndex() {
	for i := range st.nodes {
		ns := &st.nodes[i]
		if ns.pool < 0 {
			continue
		}
		ns.free = maxNodeGPUs - bits.OnesCount64(ns.used) // bits >= cap are set
		st.free += ns.free
	}
	for pi := range st.pools {
		pl := &st.pools[pi]
		if !pl.allocIndex() {
			clear(pl.counts)
			clear(pl.words)
		}
		for _, n := range pl.nodes {
			st.indexAdd(n)
		}
	}
}

// allocIndex sizes pl's free-GPU index for its nodes; it reports whether
// it allocated (zeroed) arrays.
func (pl *pool) allocIndex() bool {
	w := (len(pl.nodes) + 63) / 64
	if len(pl.buckets) == pl.maxCap+1 && len(pl.words) == w*(pl.maxCap+1) {
		return false
	}
	pl.buckets = make([][]uint64, pl.maxCap+1)
	pl.counts = make([]int, pl.maxCap+1)
	pl.words = make([]uint64, w*(pl.maxCap+1))
	for f := range pl.buckets {
		pl.buckets[f] = pl.words[f*w : (f+1)*w]
	}
	return true
}

func (st *state) clusterGPUs() int {
	if st.rawKnown {
		return st.rawTotal
	}
	total := 0
	for i := range st.s.Nodes {
		total += max(st.s.Nodes[i].GPUs, 0)
	}
	return total
}

// indexAdd puts an unclaimed node into its pool's bucket and group count.
func (st *state) indexAdd(n int) {
	ns := &st.nodes[n]
	pl := &st.pools[ns.pool]
	pl.buckets[ns.free][ns.pos>>6] |= 1 << uint(ns.pos&63)
	pl.counts[ns.free]++
	if ns.free == ns.cap {
		st.grps[ns.group].wf += ns.cap
	}
}

func (st *state) indexRemove(n int) {
	ns := &st.nodes[n]
	pl := &st.pools[ns.pool]
	pl.buckets[ns.free][ns.pos>>6] &^= 1 << uint(ns.pos&63)
	pl.counts[ns.free]--
	if ns.free == ns.cap {
		st.grps[ns.group].wf -= ns.cap
	}
}

// firstIn returns the lowest node index in pool bucket f.
func (pl *pool) firstIn(f int) int {
	for w, x := range pl.buckets[f] {
		if x != 0 {
			return pl.nodes[w*64+bits.TrailingZeros64(x)]
		}
	}
	return -1
}

// eligInfo is the pools a job shape may use, with its largest node and
// domain.
type eligInfo struct {
	pools    []int
	maxCap   int
	groupCap int
}

// eligible returns the pools a job may use.
func (st *state) eligible(gpuType string, onpremOnly bool, owner int) *eligInfo {
	k := eligKey{gpuType, onpremOnly, owner}
	if st.lastElig != nil && k == st.lastEligKey {
		return st.lastElig
	}
	e, ok := st.eligCache[k]
	if !ok {
		e = &eligInfo{pools: []int{}}
		for pi := range st.pools {
			pl := &st.pools[pi]
			if gpuType != "" && pl.gpuType != gpuType || onpremOnly && !pl.onprem || pl.owner != owner {
				continue
			}
			e.pools = append(e.pools, pi)
			e.maxCap = max(e.maxCap, pl.maxCap)
			for _, gi := range pl.groups {
				e.groupCap = max(e.groupCap, st.grps[gi].capSum)
			}
		}
		st.eligCache[k] = e
	}
	st.lastEligKey, st.lastElig = k, e
	return e
}

// effFree is the free GPUs of node n for a job ending at end, honouring the
// reservations that hold the node.
func (st *state) effFree(n int, end int64) int {
	ns := &st.nodes[n]
	f := ns.free
	for _, c := range ns.claims {
		if end > st.resvs[c.res].at {
			f = min(f, c.spare)
		}
	}
	return max(f, 0)
}

// preparePending fills the placement shape of a pending job.
func (st *state) preparePending(pj *pjob, owner int) {
	j := pj.j
	prod := pj.class.Production() && st.p.Mode == ModeAllot
	e := st.eligible(j.GPUType, prod, owner)
	pj.elig, pj.maxCap, pj.groupCap = e.pools, e.maxCap, e.groupCap
	g := j.GPUs
	switch {
	case g <= 0:
		pj.never = true
	case j.GPUsPerNode > 0 && j.GPUsPerNode < g:
		pj.multi, pj.q = true, j.GPUsPerNode
		pj.never = pj.q > pj.maxCap || pj.groupCap < g
	case g <= pj.maxCap:
	default:
		pj.multi = true
		pj.never = pj.groupCap < g
	}
}

// contrib is what node n with f effective free GPUs contributes to a
// multi-node job (whole nodes, or q GPUs per node).
func contrib(f, capacity, q int) int {
	if q == 0 {
		if f >= capacity {
			return capacity
		}
		return 0
	}
	if f >= q {
		return q
	}
	return 0
}

// place finds a placement for pj now, honouring reservations. It returns
// node/GPU-count pairs (GPU indices are chosen at commit).
func (st *state) place(pj *pjob, buf []Claim) []Claim {
	g := pj.j.GPUs
	end := pj.run
	if !pj.multi {
		if st.p.Mode == ModeAllot {
			return st.placePacked(pj, buf)
		}
		bestF, bestN := math.MaxInt, -1
		for _, pi := range pj.elig {
			pl := &st.pools[pi]
			for f := g; f <= pl.maxCap && f <= bestF; f++ {
				if pl.counts[f] == 0 {
					continue
				}
				n := pl.firstIn(f)
				if f < bestF || n < bestN {
					bestF, bestN = f, n
				}
				break
			}
		}
		for _, n := range st.claimed {
			ns := &st.nodes[n]
			if ns.cap < g || !slices.Contains(pj.elig, int(ns.pool)) {
				continue
			}
			f := st.effFree(n, end)
			if f >= g && (f < bestF || f == bestF && n < bestN) {
				bestF, bestN = f, n
			}
		}
		if bestN < 0 {
			return nil
		}
		return append(buf, Claim{Node: bestN, GPUs: g})
	}
	// Multi-node: the domain with the least capacity that still suffices
	// (best fit), then the lowest first node; nodes in index order.
	bestG, bestAvail := -1, math.MaxInt
	for _, pi := range pj.elig {
		for _, gi := range st.pools[pi].groups {
			gr := &st.grps[gi]
			if gr.capSum < g {
				continue
			}
			avail := st.groupAvail(gi, pj)
			if avail >= g && avail < bestAvail {
				bestG, bestAvail = gi, avail
			}
		}
	}
	if bestG < 0 {
		return nil
	}
	left := g
	for _, n := range st.grps[bestG].nodes {
		ns := &st.nodes[n]
		f := ns.free
		if len(ns.claims) > 0 {
			f = st.effFree(n, end)
		}
		c := min(contrib(f, ns.cap, pj.q), left)
		if c > 0 {
			buf = append(buf, Claim{Node: n, GPUs: c})
			left -= c
			if left == 0 {
				break
			}
		}
	}
	return buf
}

// maxPackScan bounds the nodes placePacked scores per placement once it
// has a candidate.
const maxPackScan = 256

// packScore ranks the nodes a single-node job of ModeAllot may take:
// partly used nodes before wholly free ones; then the least extension of
// the node's busy period (how much later than now its last job would
// reach its time limit); then the fewest free GPUs (best fit); then the
// lowest index.
type packScore struct {
	whole int
	ext   int64
	free  int
	n     int
}

func cmpPack(a, b packScore) int {
	switch {
	case a.whole != b.whole:
		return cmp.Compare(a.whole, b.whole)
	case a.ext != b.ext:
		return cmp.Compare(a.ext, b.ext)
	case a.free != b.free:
		return cmp.Compare(a.free, b.free)
	}
	return cmp.Compare(a.n, b.n)
}

// placePacked is ModeAllot's single-node placement. A wide job waits until
// some node is wholly free; long jobs scattered over every node keep every
// node busy for days (on the loaded Philly window, 330 of 352 nodes had a
// job with more than 24 h left). So a job goes where it extends a node's
// busy period the least — long jobs join long jobs, short ones fill gaps on
// nodes that stay busy anyway — and wholly free nodes are used last.
// Candidates are visited in best-fit order (bucket by bucket, fewest free
// GPUs first); the scan stops at a candidate that fits exactly without
// extending its node, at the end of a bucket whose best candidate extends
// nothing, or after maxPackScan candidates.
func (st *state) placePacked(pj *pjob, buf []Claim) []Claim {
	// The busy-period score reads time limits; reservations, the run
	// reservations and backfill assume (pjob.run).
	g, end, run := pj.j.GPUs, pj.limit, pj.run
	best := packScore{n: -1}
	scanned := 0
	better := func(n, f int) {
		ns := &st.nodes[n]
		sc := packScore{free: f, n: n}
		if f >= ns.cap {
			sc.whole = 1
		}
		if end == never {
			if ns.until != never {
				sc.ext = never
			}
		} else if end > ns.until {
			sc.ext = end - ns.until
		}
		if best.n < 0 || cmpPack(sc, best) < 0 {
			best = sc
		}
		scanned++
	}
	// Claimed nodes are outside the buckets.
	for _, n := range st.claimed {
		ns := &st.nodes[n]
		if ns.cap < g || !slices.Contains(pj.elig, int(ns.pool)) {
			continue
		}
		if f := st.effFree(n, run); f >= g {
			better(n, f)
		}
	}
	for _, pi := range pj.elig {
		pl := &st.pools[pi]
	buckets:
		for f := g; f <= pl.maxCap; f++ {
			if pl.counts[f] == 0 {
				continue
			}
			if best.n >= 0 && (best.whole == 0 && best.ext == 0 && best.free <= f || scanned >= maxPackScan) {
				break
			}
			for w, x := range pl.buckets[f] {
				for x != 0 {
					b := bits.TrailingZeros64(x)
					x &^= 1 << uint(b)
					better(pl.nodes[w*64+b], f)
					if best.whole == 0 && best.ext == 0 && best.free == g {
						break buckets
					}
				}
			}
		}
	}
	if best.n < 0 {
		return nil
	}
	return append(buf, Claim{Node: best.n, GPUs: g})
}

// groupAvail is what group gi can give to multi-node job pj now.
func (st *state) groupAvail(gi int, pj *pjob) int {
	gr := &st.grps[gi]
	if pj.q == 0 {
		a := gr.wf
		for _, n := range st.claimed {
			ns := &st.nodes[n]
			if int(ns.group) == gi {
				a += contrib(st.effFree(n, pj.run), ns.cap, 0)
			}
		}
		return a
	}
	a := 0
	for _, n := range gr.nodes {
		ns := &st.nodes[n]
		f := ns.free
		if len(ns.claims) > 0 {
			f = st.effFree(n, pj.run)
		}
		a += contrib(f, ns.cap, pj.q)
	}
	return a
}

// commit starts pj on the given node counts.
func (st *state) commit(pj *pjob, cl []Claim, backfill bool) {
	slots := make([]Slot, len(cl))
	end, run := pj.limit, pj.run
	for i, c := range cl {
		ns := &st.nodes[c.Node]
		idx := make([]int, 0, c.GPUs)
		m := ns.used
		for len(idx) < c.GPUs {
			b := bits.TrailingZeros64(^m)
			m |= 1 << uint(b)
			idx = append(idx, b)
		}
		claimed := len(ns.claims) > 0
		if !claimed {
			st.indexRemove(c.Node)
		}
		ns.used = m
		ns.free -= c.GPUs
		st.free -= c.GPUs
		if !claimed {
			st.indexAdd(c.Node)
		}
		for k := range ns.claims {
			if run > st.resvs[ns.claims[k].res].at {
				ns.claims[k].spare -= c.GPUs
			}
		}
		slots[i] = Slot{Node: c.Node, GPUs: idx}
		ns.until = max(ns.until, end)
	}
	pj.started = true
	if pj.team >= 0 {
		st.teams[pj.team].alloc += pj.j.GPUs
	}
	st.starts = append(st.starts, startRec{p: pj, slots: slots, end: end, pend: run})
	st.plan.Starts = append(st.plan.Starts, Start{
		JobID:     pj.j.ID,
		Placement: slots,
		RunAs:     pj.class,
		Backfill:  backfill,
		Priority:  st.priority(pj),
	})
}

// claimNode takes node n out of the free index so that placements check
// its reservation claims.
func (st *state) claimNode(n int, res, spare int) {
	ns := &st.nodes[n]
	if len(ns.claims) == 0 {
		st.indexRemove(n)
		st.claimed = append(st.claimed, n)
	}
	ns.claims = append(ns.claims, claimRef{res: res, spare: spare})
}
