package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

var allModes = []Mode{ModeAllot, ModeFIFO, ModeEASY, ModeFIFOPartitioned}

// genSnapshot draws a consistent random snapshot: running jobs hold free
// GPUs only, some are terminating.
func genSnapshot(t *rapid.T) Snapshot {
	var s Snapshot
	nNodes := rapid.IntRange(1, 8).Draw(t, "nodes")
	for i := range nNodes {
		n := Node{
			Name:    fmt.Sprintf("n%d", i),
			GPUType: rapid.SampledFrom([]string{"A100", "H100"}).Draw(t, "type"),
			GPUs:    rapid.SampledFrom([]int{1, 2, 4, 8}).Draw(t, "gpus"),
			Site:    rapid.SampledFrom([]string{SiteOnPrem, SiteOnPrem, SiteCloud}).Draw(t, "site"),
			Domain:  rapid.SampledFrom([]string{"", "d0", "d1"}).Draw(t, "domain"),
			State:   rapid.SampledFrom([]NodeState{NodeUp, NodeUp, NodeUp, NodeDraining, NodeDown}).Draw(t, "state"),
		}
		if rapid.IntRange(0, 5).Draw(t, "unavail") == 0 {
			n.Unavailable = []int{rapid.IntRange(0, n.GPUs-1).Draw(t, "bad")}
		}
		s.Nodes = append(s.Nodes, n)
	}
	teams := []string{"a", "b", "c", "zz"} // zz has no Team row
	for _, name := range teams[:3] {
		s.Teams = append(s.Teams, Team{
			Name:       name,
			Weight:     float64(rapid.IntRange(0, 3).Draw(t, "weight")),
			Guarantee:  map[string]int{"": rapid.IntRange(0, 12).Draw(t, "guarantee")},
			Usage:      float64(rapid.IntRange(0, 1000).Draw(t, "usage")),
			OverBudget: rapid.IntRange(0, 4).Draw(t, "over") == 0,
		})
	}
	tiers := []Tier{Tier1, Tier2, Tier3, Tier4, TierPreemptible}
	used := make([]uint64, nNodes)
	for i, n := range s.Nodes {
		for _, u := range n.Unavailable {
			used[i] |= 1 << uint(u)
		}
	}
	id := int64(1)
	nRun := rapid.IntRange(0, 12).Draw(t, "running")
	for range nRun {
		n := rapid.IntRange(0, nNodes-1).Draw(t, "node")
		var free []int
		for g := range s.Nodes[n].GPUs {
			if used[n]&(1<<uint(g)) == 0 {
				free = append(free, g)
			}
		}
		if len(free) == 0 {
			continue
		}
		k := rapid.IntRange(1, len(free)).Draw(t, "k")
		slots := []Slot{{Node: n, GPUs: free[:k]}}
		for _, g := range free[:k] {
			used[n] |= 1 << uint(g)
		}
		// Sometimes a second node, whole, for a multi-node job.
		if m := rapid.IntRange(0, nNodes-1).Draw(t, "node2"); m != n && used[m] == 0 && rapid.Bool().Draw(t, "multi") {
			slots = append(slots, Slot{Node: m, GPUs: seq(0, s.Nodes[m].GPUs)})
			used[m] = ^uint64(0)
		}
		gpus := 0
		for _, sl := range slots {
			gpus += len(sl.GPUs)
		}
		tr := rapid.SampledFrom(tiers).Draw(t, "tier")
		j := Job{
			ID:        id,
			Team:      rapid.SampledFrom(teams).Draw(t, "team"),
			Tier:      tr,
			RunAs:     tr,
			GPUs:      gpus,
			TimeLimit: time.Duration(rapid.IntRange(0, 600).Draw(t, "limit")) * time.Minute,
			Start:     t0.Add(-time.Duration(rapid.IntRange(0, 300).Draw(t, "ago")) * time.Minute),
			Placement: slots,
		}
		if rapid.IntRange(0, 5).Draw(t, "term") == 0 {
			j.Terminating = true
			j.GraceEnd = t0.Add(time.Duration(rapid.IntRange(0, 120).Draw(t, "grace")) * time.Second)
		}
		s.Running = append(s.Running, j)
		id++
	}
	nPend := rapid.IntRange(0, 15).Draw(t, "pending")
	for range nPend {
		j := Job{
			ID:          id,
			Team:        rapid.SampledFrom(teams).Draw(t, "team"),
			Tier:        rapid.SampledFrom(tiers).Draw(t, "tier"),
			GPUs:        rapid.SampledFrom([]int{1, 1, 2, 3, 4, 8, 12, 16, 40}).Draw(t, "gpus"),
			TimeLimit:   time.Duration(rapid.IntRange(0, 600).Draw(t, "limit")) * time.Minute,
			Submit:      t0.Add(-time.Duration(rapid.IntRange(0, 600).Draw(t, "wait")) * time.Minute),
			Preemptible: rapid.IntRange(0, 6).Draw(t, "pre") == 0,
		}
		if rapid.IntRange(0, 4).Draw(t, "typed") == 0 {
			j.GPUType = "H100"
		}
		if rapid.IntRange(0, 6).Draw(t, "pernode") == 0 {
			j.GPUsPerNode = rapid.IntRange(1, 4).Draw(t, "q")
		}
		j.Reserved = rapid.IntRange(0, 3).Draw(t, "reserved") == 0
		if rapid.IntRange(0, 3).Draw(t, "estimated") == 0 {
			j.Estimate = time.Duration(rapid.IntRange(0, 600).Draw(t, "estimate")) * time.Minute
		}
		s.Pending = append(s.Pending, j)
		id++
	}
	return s
}

func genPolicy(t *rapid.T) Policy {
	p := DefaultPolicy()
	p.Mode = rapid.SampledFrom(allModes).Draw(t, "mode")
	p.ReservationDepth = rapid.IntRange(0, 3).Draw(t, "depth")
	p.GuaranteePatience = time.Duration(rapid.IntRange(0, 60).Draw(t, "patience")) * time.Minute
	p.Order = rapid.SampledFrom([]Order{OrderMultifactor, OrderResponse}).Draw(t, "order")
	p.StarvationWait = rapid.SampledFrom([]time.Duration{0, 20 * time.Minute}).Draw(t, "starvation")
	p.HoldReservations = rapid.Bool().Draw(t, "hold")
	if rapid.Bool().Draw(t, "admin-tiers") {
		// Tiers as an admin may set them: reservations, narrowed rights,
		// another class order.
		p.Reserved = map[Tier]int{Tier1: rapid.IntRange(0, 32).Draw(t, "resv1"), Tier2: rapid.IntRange(0, 32).Draw(t, "resv2")}
		p.MayPreempt = map[Tier][]Tier{
			Tier1: rapid.SliceOfDistinct(rapid.SampledFrom([]Tier{Tier3, Tier4, TierPreemptible}), func(x Tier) Tier { return x }).Draw(t, "rights1"),
			Tier2: rapid.SliceOfDistinct(rapid.SampledFrom([]Tier{Tier3, Tier4, TierPreemptible}), func(x Tier) Tier { return x }).Draw(t, "rights2"),
		}
		if rapid.Bool().Draw(t, "swap34") {
			p.ClassOrder = map[Tier]int{Tier1: 1, Tier2: 2, Tier4: 3, Tier3: 4, TierPreemptible: 5}
		}
	}
	return p
}

// checkPlan checks the invariants every plan must keep.
func checkPlan(t *rapid.T, s Snapshot, p Policy, plan Plan) {
	used := make([]uint64, len(s.Nodes))
	for i, n := range s.Nodes {
		for _, u := range n.Unavailable {
			used[i] |= 1 << uint(u)
		}
	}
	tierOf := map[int64]Job{}
	for _, j := range s.Running {
		tierOf[j.ID] = j
		for _, sl := range j.Placement {
			for _, g := range sl.GPUs {
				used[sl.Node] |= 1 << uint(g)
			}
		}
	}
	pending := map[int64]Job{}
	for _, j := range s.Pending {
		pending[j.ID] = j
	}
	seen := map[int64]bool{}
	for _, st := range plan.Starts {
		j, ok := pending[st.JobID]
		if !ok || seen[st.JobID] {
			t.Fatalf("start of unknown or duplicate job %d", st.JobID)
		}
		seen[st.JobID] = true
		sum := 0
		nodes := map[int]bool{}
		for _, sl := range st.Placement {
			n := s.Nodes[sl.Node]
			if n.State != NodeUp {
				t.Fatalf("job %d placed on %s node %d", j.ID, n.State, sl.Node)
			}
			if nodes[sl.Node] {
				t.Fatalf("job %d uses node %d twice", j.ID, sl.Node)
			}
			nodes[sl.Node] = true
			if j.GPUType != "" && n.GPUType != j.GPUType {
				t.Fatalf("job %d wants %s, got node of %s", j.ID, j.GPUType, n.GPUType)
			}
			if p.Mode == ModeAllot && st.RunAs.Production() && n.Site != SiteOnPrem {
				t.Fatalf("production job %d on site %s", j.ID, n.Site)
			}
			if n.Domain != s.Nodes[st.Placement[0].Node].Domain || n.GPUType != s.Nodes[st.Placement[0].Node].GPUType {
				t.Fatalf("job %d spans domains or GPU types: %v", j.ID, st.Placement)
			}
			for _, g := range sl.GPUs {
				if g < 0 || g >= n.GPUs {
					t.Fatalf("job %d: GPU %d out of range on node %d", j.ID, g, sl.Node)
				}
				if used[sl.Node]&(1<<uint(g)) != 0 {
					t.Fatalf("GPU %d of node %d over-committed by job %d", g, sl.Node, j.ID)
				}
				used[sl.Node] |= 1 << uint(g)
			}
			sum += len(sl.GPUs)
		}
		if sum != j.GPUs {
			t.Fatalf("gang: job %d asked %d GPUs, placement has %d", j.ID, j.GPUs, sum)
		}
		if len(st.Placement) > 1 && j.GPUsPerNode == 0 {
			for _, sl := range st.Placement[:len(st.Placement)-1] {
				if len(sl.GPUs) != s.Nodes[sl.Node].GPUs {
					t.Fatalf("multi-node job %d does not take whole nodes: %v", j.ID, st.Placement)
				}
			}
		}
	}
	for _, v := range plan.Preemptions {
		j, ok := tierOf[v.JobID]
		if !ok {
			t.Fatalf("preemption of unknown job %d", v.JobID)
		}
		if j.Terminating {
			t.Fatalf("job %d preempted twice", v.JobID)
		}
		if j.RunAs.Production() {
			t.Fatalf("production job %d (tier %d) preempted", j.ID, j.RunAs)
		}
		if t0.Sub(j.Start) < p.MinRuntime {
			t.Fatalf("job %d preempted before its minimum runtime", j.ID)
		}
		if p.Mode != ModeAllot {
			t.Fatalf("baseline %s preempted", p.Mode)
		}
	}
	if p.Mode == ModeAllot {
		checkReservations(t, s, p, plan)
	}
	if !p.NoPendingInfo && len(plan.Pending)+len(plan.Starts) != len(s.Pending) {
		t.Fatalf("pending %d + starts %d != %d pending jobs", len(plan.Pending), len(plan.Starts), len(s.Pending))
	}
}

// checkReservations checks that nothing started now takes GPUs a
// reservation counts on: at each reservation's time, on each node it
// claims, the GPUs still held (running jobs and starts past their time
// limits, other reservations active then) leave room for the claim.
func checkReservations(t *rapid.T, s Snapshot, p Policy, plan Plan) {
	victims := map[int64]bool{}
	for _, v := range plan.Preemptions {
		victims[v.JobID] = true
	}
	endOf := func(start time.Time, lim time.Duration) time.Time {
		if lim <= 0 {
			return time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
		}
		return start.Add(lim)
	}
	// Under Policy.PredictedBackfill jobs are held for their predicted
	// run (Job.Predicted, capped at the limit; running jobs past it:
	// doubled until after now, at most the limit).
	pred := p.PredictedBackfill && p.Mode == ModeAllot
	limitOf := map[int64]time.Duration{}
	for _, j := range s.Pending {
		limitOf[j.ID] = j.TimeLimit
		if pred && j.Predicted > 0 && (j.TimeLimit <= 0 || j.Predicted < j.TimeLimit) {
			limitOf[j.ID] = j.Predicted
		}
	}
	runEnd := func(j Job) time.Time {
		lim := endOf(j.Start, j.TimeLimit)
		if !pred || j.Predicted <= 0 {
			return lim
		}
		d := j.Predicted
		for !j.Start.Add(d).After(t0) && j.Start.Add(d).Before(lim) {
			d *= 2
		}
		if e := j.Start.Add(d); e.Before(lim) {
			return e
		}
		return lim
	}
	for k, r := range plan.Reservations {
		for _, c := range r.Claims {
			n := s.Nodes[c.Node]
			held := len(n.Unavailable)
			for _, j := range s.Running {
				end := runEnd(j)
				if j.Terminating {
					end = j.GraceEnd
				} else if victims[j.ID] && end.After(t0.Add(p.GracePeriod)) {
					end = t0.Add(p.GracePeriod)
				}
				if end.Before(t0) {
					end = t0
				}
				if end.After(r.At) {
					for _, sl := range j.Placement {
						if sl.Node == c.Node {
							held += len(sl.GPUs)
						}
					}
				}
			}
			for _, st := range plan.Starts {
				if endOf(t0, limitOf[st.JobID]).After(r.At) {
					for _, sl := range st.Placement {
						if sl.Node == c.Node {
							held += len(sl.GPUs)
						}
					}
				}
			}
			for k2, r2 := range plan.Reservations {
				if k2 == k || r2.At.After(r.At) || !endOf(r2.At, limitOf[r2.JobID]).After(r.At) {
					continue
				}
				for _, c2 := range r2.Claims {
					if c2.Node == c.Node {
						held += c2.GPUs
					}
				}
			}
			if held+c.GPUs > n.GPUs {
				t.Fatalf("reservation of job %d at %v on node %d: %d GPUs held + %d claimed > %d\nplan: %+v\nsnapshot: %+v", r.JobID, r.At, c.Node, held, c.GPUs, n.GPUs, plan, s)
			}
		}
	}
}

func TestPropertyInvariants(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		s := genSnapshot(t)
		p := genPolicy(t)
		before := cloneSnapshot(s)
		plan := Schedule(s, t0, p)
		if diff := cmp.Diff(before, s); diff != "" {
			t.Fatalf("Schedule mutated its input (-before +after):\n%s", diff)
		}
		checkPlan(t, s, p, plan)
	})
}

func TestPropertyDeterministic(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		s := genSnapshot(t)
		p := genPolicy(t)
		want := Schedule(s, t0, p)
		if diff := cmp.Diff(want, Schedule(cloneSnapshot(s), t0, p)); diff != "" {
			t.Fatalf("second run differs (-first +second):\n%s", diff)
		}
		shuffled := cloneSnapshot(s)
		r := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))
		r.Shuffle(len(shuffled.Pending), func(i, j int) { shuffled.Pending[i], shuffled.Pending[j] = shuffled.Pending[j], shuffled.Pending[i] })
		r.Shuffle(len(shuffled.Running), func(i, j int) { shuffled.Running[i], shuffled.Running[j] = shuffled.Running[j], shuffled.Running[i] })
		r.Shuffle(len(shuffled.Teams), func(i, j int) { shuffled.Teams[i], shuffled.Teams[j] = shuffled.Teams[j], shuffled.Teams[i] })
		if diff := cmp.Diff(want, Schedule(shuffled, t0, p)); diff != "" {
			t.Fatalf("shuffled input changes the plan (-sorted +shuffled):\n%s", diff)
		}
	})
}

// TestPropertyPreemptorKeepsGPUs replays the cycle after a preemption: the
// victims are terminating, and no new preemption is issued for a job
// whose victims are still in their grace period.
func TestPropertyNoOverPreemption(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		s := genSnapshot(t)
		p := DefaultPolicy()
		p.GuaranteePatience = 0
		plan := Schedule(s, t0, p)
		if len(plan.Preemptions) == 0 {
			return
		}
		next := cloneSnapshot(s)
		by := map[int64]int64{}
		for _, v := range plan.Preemptions {
			by[v.JobID] = v.By
		}
		for i := range next.Running {
			if b, ok := by[next.Running[i].ID]; ok {
				next.Running[i].Terminating = true
				next.Running[i].GraceEnd = t0.Add(p.GracePeriod)
				next.Running[i].PreemptedBy = b
			}
		}
		plan2 := Schedule(next, t0.Add(time.Second), p)
		for _, v := range plan2.Preemptions {
			for _, v1 := range plan.Preemptions {
				if v.By == v1.By {
					t.Fatalf("job %d preempts again (%d) while its victims are terminating", v.By, v.JobID)
				}
			}
		}
	})
}
