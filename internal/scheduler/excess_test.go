package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestVictimsWithinTeamExcess: a preemptor whose right is to work above
// guarantees (here tier 2) takes at most a team's excess over its
// guarantee, counted over the whole victim set. Team a runs 4 GPUs above
// its guarantee of 8 in 4-GPU jobs: each alone may go, two together would
// leave it below its guarantee, so the cheaper node holding two of them is
// passed over, on one node and across the nodes of a multi-node start.
func TestVictimsWithinTeamExcess(t *testing.T) {
	t.Parallel()
	teams := []Team{
		{Name: "a", Weight: 1, Guarantee: map[string]int{"": 8}},
		{Name: "b", Weight: 1, Guarantee: map[string]int{"": 0}},
		{Name: "p", Weight: 1, Guarantee: map[string]int{"": 0}},
	}
	prod := job(1, 8, team("p"), tier(Tier2), submitted(time.Minute))
	s := Snapshot{Nodes: cluster(2, 8), Teams: teams, Pending: []Job{prod}, Running: []Job{
		job(100, 4, team("a"), tier(Tier4), on(30*time.Minute, slot(0, 0, 1, 2, 3))),
		job(101, 4, team("a"), tier(Tier4), on(30*time.Minute, slot(0, 4, 5, 6, 7))),
		job(102, 4, team("a"), tier(Tier4), on(2*time.Hour, slot(1, 0, 1, 2, 3))),
		job(103, 4, team("b"), tier(Tier4), on(2*time.Hour, slot(1, 4, 5, 6, 7))),
	}}
	p := Schedule(s, t0, allot())
	if diff := cmp.Diff([]int64{102, 103}, victimIDs(p)); diff != "" {
		t.Errorf("one node: victims (-want +got):\n%s", diff)
	}
	for _, v := range p.Preemptions {
		if !strings.Contains(v.Reason, "above its guarantee") {
			t.Errorf("victim %d: reason %q, want one above its guarantee", v.JobID, v.Reason)
		}
	}

	// Two whole nodes: team a's two 8-GPU jobs are each within its excess
	// alone, not together.
	prod.GPUs = 16
	s = Snapshot{Nodes: cluster(3, 8), Teams: teams, Pending: []Job{prod}, Running: []Job{
		job(100, 8, team("a"), tier(Tier4), on(30*time.Minute, slot(0, seq(0, 8)...))),
		job(101, 8, team("a"), tier(Tier4), on(30*time.Minute, slot(1, seq(0, 8)...))),
		job(102, 8, team("b"), tier(Tier4), on(2*time.Hour, slot(2, seq(0, 8)...))),
	}}
	s.Teams[0].Guarantee = map[string]int{"": 8}
	if diff := cmp.Diff([]int64{100, 102}, victimIDs(Schedule(s, t0, allot()))); diff != "" {
		t.Errorf("two nodes: victims (-want +got):\n%s", diff)
	}

	// A preemptible job counts in its team's GPUs too: with it gone, team
	// a is at its guarantee and its tier-4 job stays.
	prod.GPUs = 8
	s = Snapshot{Nodes: cluster(1, 8), Teams: teams, Pending: []Job{prod}, Running: []Job{
		job(100, 4, team("a"), tier(Tier4), runAs(TierPreemptible), on(30*time.Minute, slot(0, 0, 1, 2, 3))),
		job(101, 4, team("a"), tier(Tier4), on(30*time.Minute, slot(0, 4, 5, 6, 7))),
	}}
	s.Teams = []Team{{Name: "a", Weight: 1, Guarantee: map[string]int{"": 4}}, teams[1], teams[2]}
	p = Schedule(s, t0, allot())
	if len(p.Preemptions) != 0 {
		t.Errorf("preemptible and tier-4 job of a team 4 GPUs above its guarantee: preempted %v", victimIDs(p))
	}
	// Nor does the start forecast count on that preemption.
	if info := pendingInfo(p, 1); info.EstKind == EstPreemption {
		t.Errorf("forecast: %s at %v, by a preemption the scheduler refuses", info.EstKind, info.EstStart)
	}
	// In either order, and with the preemptible job due later than the
	// other (it has not run its minimum runtime yet), so that the
	// forecast meets it second.
	for _, running := range [][]Job{
		{s.Running[1], s.Running[0]},
		{job(101, 4, team("a"), tier(Tier4), on(time.Hour, slot(0, 4, 5, 6, 7))),
			job(100, 4, team("a"), tier(Tier4), runAs(TierPreemptible), on(5*time.Minute, slot(0, 0, 1, 2, 3)))},
	} {
		s.Running = running
		p = Schedule(s, t0, allot())
		if info := pendingInfo(p, 1); len(p.Preemptions) != 0 || info.EstKind == EstPreemption {
			t.Errorf("running %d then %d: preempted %v, forecast %s at %v", running[0].ID, running[1].ID, victimIDs(p), info.EstKind, info.EstStart)
		}
	}
	s.Teams = teams

	// Tier 1 may take any research work: the cheaper node, both of a's jobs.
	prod.Tier = Tier1
	s = Snapshot{Nodes: cluster(2, 8), Teams: teams, Pending: []Job{prod}, Running: []Job{
		job(100, 4, team("a"), tier(Tier4), on(30*time.Minute, slot(0, 0, 1, 2, 3))),
		job(101, 4, team("a"), tier(Tier4), on(30*time.Minute, slot(0, 4, 5, 6, 7))),
		job(102, 4, team("a"), tier(Tier4), on(2*time.Hour, slot(1, 0, 1, 2, 3))),
		job(103, 4, team("b"), tier(Tier4), on(2*time.Hour, slot(1, 4, 5, 6, 7))),
	}}
	if diff := cmp.Diff([]int64{100, 101}, victimIDs(Schedule(s, t0, allot()))); diff != "" {
		t.Errorf("tier 1: victims (-want +got):\n%s", diff)
	}
}
