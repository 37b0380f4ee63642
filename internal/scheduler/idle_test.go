package scheduler

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// fillCluster runs a research job on every GPU the snapshot leaves free,
// takes every running job out of its grace period and, sometimes, makes
// the pending jobs research work and drops the guarantees: the cluster is
// full, as on a replay far past its capacity, and the cycle may be idle.
func fillCluster(t *rapid.T, s *Snapshot) {
	used := make([]uint64, len(s.Nodes))
	for i, n := range s.Nodes {
		for _, u := range n.Unavailable {
			used[i] |= 1 << uint(u)
		}
	}
	for k := range s.Running {
		r := &s.Running[k]
		r.Terminating, r.GraceEnd, r.PreemptedBy = false, t0.Add(-1), 0
		for _, sl := range r.Placement {
			for _, g := range sl.GPUs {
				used[sl.Node] |= 1 << uint(g)
			}
		}
	}
	id := int64(1000)
	for n := range s.Nodes {
		for g := range s.Nodes[n].GPUs {
			if used[n]&(1<<uint(g)) != 0 {
				continue
			}
			tr := rapid.SampledFrom([]Tier{Tier3, Tier4}).Draw(t, "filler-tier")
			s.Running = append(s.Running, Job{ID: id, Team: rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, "filler-team"),
				Tier: tr, RunAs: tr, GPUs: 1, TimeLimit: 600 * time.Minute, Placement: []Slot{{Node: n, GPUs: []int{g}}},
				Start: t0.Add(-time.Duration(rapid.IntRange(0, 600).Draw(t, "filler-ran")) * time.Minute)})
			id++
		}
	}
	if rapid.Bool().Draw(t, "research-only") {
		if rapid.Bool().Draw(t, "no-preemptible-running") {
			// Only work above guarantees to take, not preemptible work.
			for k := range s.Running {
				if r := &s.Running[k]; r.RunAs == TierPreemptible || r.Preemptible {
					r.Tier, r.RunAs, r.Preemptible = Tier3, Tier3, false
				}
			}
		}
		for k := range s.Pending {
			if s.Pending[k].Tier.Production() {
				s.Pending[k].Tier = Tier3
			}
		}
		for k := range s.Teams {
			switch rapid.IntRange(0, 2).Draw(t, "guarantee") {
			case 0:
				s.Teams[k].Guarantee = nil
			case 1: // under its guarantee: it may reclaim
				s.Teams[k].Guarantee = map[string]int{"": 64}
			}
		}
	}
}

// TestPropertyIdleCycleChangesNothing: a cycle that returns at once
// (Plan.Idle, the simulator's NoPendingInfo) is one that starts and
// preempts nothing; any other cycle decides exactly as with pending info.
func TestPropertyIdleCycleChangesNothing(t *testing.T) {
	t.Parallel()
	idle, full := 0, 0
	rapid.Check(t, func(t *rapid.T) {
		// Thirty cycles a case: most cycles are not idle, and each rule
		// of idleCycle needs its own rare snapshot to be tested.
		for range 30 {
			idleCase(t, &idle, &full)
		}
	})
	t.Logf("%d idle, %d full cycles", idle, full)
	if idle == 0 || full == 0 {
		t.Fatalf("%d idle and %d full cycles: the test should exercise both", idle, full)
	}
}

func idleCase(t *rapid.T, idle, full *int) {
	s := genSnapshot(t)
	p := genPolicy(t)
	if rapid.IntRange(0, 2).Draw(t, "fill") > 0 {
		fillCluster(t, &s)
		if rapid.IntRange(0, 3).Draw(t, "simulator") > 0 {
			p.Mode, p.HoldReservations = ModeAllot, false
		}
	}
	want := Schedule(cloneSnapshot(s), t0, p)
	q := p
	q.NoPendingInfo = true
	got := Schedule(s, t0, q)
	if want.Idle {
		t.Fatal("a cycle with pending info returned at once")
	}
	if got.Idle {
		*idle++
		if len(want.Starts)+len(want.Preemptions) > 0 {
			t.Fatalf("an idle cycle: the full cycle starts %v and preempts %v", want.Starts, want.Preemptions)
		}
		return
	}
	*full++
	if d := cmp.Diff(want.Starts, got.Starts); d != "" {
		t.Fatalf("starts differ (-with pending info +without):\n%s", d)
	}
	if d := cmp.Diff(want.Preemptions, got.Preemptions); d != "" {
		t.Fatalf("preemptions differ (-with pending info +without):\n%s", d)
	}
	if d := cmp.Diff(want.Reservations, got.Reservations); d != "" {
		t.Fatalf("reservations differ (-with pending info +without):\n%s", d)
	}
}

// TestIdleCycleRules: each way a full cluster's cycle can still act keeps
// it from returning at once, and the same cluster without it is idle.
func TestIdleCycleRules(t *testing.T) {
	t.Parallel()
	p := DefaultPolicy()
	p.NoPendingInfo = true
	// Team b fills the node with jobs past the minimum runtime; team a
	// (guarantee 4) waits with one research job.
	full := func(running Tier, pending Tier, ga, gb int) Snapshot {
		s := Snapshot{Nodes: cluster(1, 8), Teams: teamsAB(ga, gb)}
		for g := range 8 {
			s.Running = append(s.Running, job(int64(10+g), 1, team("b"), tier(running), limit(10*time.Hour), on(11*time.Minute, slot(0, g))))
		}
		s.Pending = []Job{job(1, 1, tier(pending), submitted(2*time.Hour))}
		return s
	}
	young := func(s Snapshot) Snapshot {
		for k := range s.Running {
			s.Running[k].Start = t0.Add(-5 * time.Minute)
		}
		return s
	}
	for _, c := range []struct {
		name     string
		s        Snapshot
		idle     bool
		preempts bool
	}{
		{"a team under its guarantee reclaims work above guarantees", full(Tier3, Tier3, 4, 0), false, true},
		{"no guarantee to reclaim", full(Tier3, Tier3, 0, 0), true, false},
		{"nothing past the minimum runtime to reclaim", young(full(Tier3, Tier3, 4, 0)), true, false},
		{"a tier-1 job preempts research work within its guarantee", full(Tier3, Tier1, 0, 8), false, true},
		{"a tier-1 job and only production running", full(Tier2, Tier1, 0, 0), true, false},
		{"preemptible work is anyone's victim", full(TierPreemptible, Tier2, 0, 8), false, true},
	} {
		plan := Schedule(c.s, t0, p)
		if plan.Idle != c.idle || (len(plan.Preemptions) > 0) != c.preempts {
			t.Errorf("%s: idle %v, %d preemptions; want idle %v, preemptions %v", c.name, plan.Idle, len(plan.Preemptions), c.idle, c.preempts)
		}
		if full := Schedule(c.s, t0, DefaultPolicy()); len(full.Preemptions) != len(plan.Preemptions) || len(full.Starts)+len(plan.Starts) > 0 {
			t.Errorf("%s: %d preemptions and %d starts with pending info, %d and %d without", c.name, len(full.Preemptions), len(full.Starts), len(plan.Preemptions), len(plan.Starts))
		}
	}
}

// TestIdleCycleExclusions: the cycles idleCycle never returns from at
// once, each with a snapshot where the full cycle does act.
func TestIdleCycleExclusions(t *testing.T) {
	t.Parallel()
	// A job in its grace period: its in-flight preemptor (team a) reserves
	// the GPUs coming free, which counts against team a's guarantee with
	// no check, so team a's running job becomes work above guarantees and
	// team c's waiting job takes it. Nothing could be preempted at the
	// cycle's start.
	inflight := Snapshot{Nodes: cluster(2, 4), Teams: []Team{
		{Name: "a", Weight: 1, Guarantee: map[string]int{"": 4}},
		{Name: "b", Weight: 1, Guarantee: map[string]int{"": 0}},
		{Name: "c", Weight: 1, Guarantee: map[string]int{"": 4}},
	}}
	v := job(20, 4, team("b"), on(2*time.Hour, slot(0, 0, 1, 2, 3)))
	v.Terminating, v.GraceEnd, v.PreemptedBy = true, t0.Add(time.Minute), 1
	q := job(21, 4, team("a"), on(2*time.Hour, slot(1, 0, 1, 2, 3)))
	q.TimeLimit = 0 // no end in sight: nothing comes free but the victim's GPUs
	inflight.Running = []Job{v, q}
	inflight.Pending = []Job{job(1, 4, team("a"), limit(0), submitted(3*time.Hour)), job(2, 4, team("c"), limit(0), submitted(3*time.Hour))}
	// A starved team may preempt like a team under its guarantee.
	sv := job(100, 8, team("b"), limit(200*time.Hour), on(time.Hour, slot(0, seq(0, 8)...)))
	sv.Submit = t0.Add(-2 * time.Hour)
	starved := Snapshot{Nodes: cluster(1, 8), Running: []Job{sv}, Teams: teamsAB(0, 0), Pending: []Job{
		job(1, 8, team("a"), limit(48*time.Hour), submitted(20*time.Hour)),
		job(2, 8, team("b"), submitted(time.Minute)), job(3, 8, team("b"), submitted(time.Minute)), job(4, 8, team("b"), submitted(time.Minute))}}
	starvedP := DefaultPolicy()
	starvedP.StarvedTeamPreempt = true
	for _, c := range []struct {
		name string
		s    Snapshot
		p    Policy
	}{{"a preemptor in flight", inflight, DefaultPolicy()}, {"starved-team preemption", starved, starvedP}} {
		full := Schedule(cloneSnapshot(c.s), t0, c.p)
		if len(full.Preemptions) == 0 {
			t.Fatalf("%s: the full cycle preempts nothing; the case tests nothing", c.name)
		}
		q := c.p
		q.NoPendingInfo = true
		if got := Schedule(c.s, t0, q); got.Idle || len(got.Preemptions) != len(full.Preemptions) {
			t.Errorf("%s: idle %v, %d preemptions; the full cycle preempts %d", c.name, got.Idle, len(got.Preemptions), len(full.Preemptions))
		}
	}
}
