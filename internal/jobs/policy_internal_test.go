package jobs

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/scheduler"
)

// TestCorePolicyFollowsTiers: the tiers' order and the production tiers'
// preemption rights, as admins edit them, reach the scheduler core.
var demoNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func TestCorePolicyFollowsTiers(t *testing.T) {
	tiers := demo.Tiers()
	cp := corePolicy(allot.DefaultPolicy(), tiers)
	if cp.ClassOrder[scheduler.Tier3] != 3 || cp.ClassOrder[scheduler.TierPreemptible] != 5 {
		t.Errorf("class order %v", cp.ClassOrder)
	}
	if got := cp.MayPreempt[scheduler.Tier1]; !slices.Equal(got, []scheduler.Tier{scheduler.Tier3, scheduler.Tier4, scheduler.TierPreemptible}) {
		t.Errorf("tier 1 may preempt %v", got)
	}
	if cp.Reserved[scheduler.Tier1] != 16 || cp.Reserved[scheduler.Tier2] != 16 || cp.Reserved[scheduler.Tier3] != 0 {
		t.Errorf("reserved %v", cp.Reserved)
	}
	if _, ok := cp.MayPreempt[scheduler.Tier3]; ok {
		t.Errorf("tier 3's guarantee reclaim must not be narrowed by tier rights: %v", cp.MayPreempt)
	}

	// An admin swaps tiers 3 and 4, takes tier 3 from tier 1's rights and
	// gives tier 1 no reservation.
	tiers[0].MayPreempt = []allot.TierID{allot.Tier4, allot.TierPreemptible}
	tiers[0].ReservedGPUs = 0
	tiers[2].ClassOrder, tiers[3].ClassOrder = 4, 3
	cp = corePolicy(allot.DefaultPolicy(), tiers)
	snap := scheduler.Snapshot{
		Nodes:   []scheduler.Node{{Name: "n1", GPUType: "A100", GPUs: 8, Site: scheduler.SiteOnPrem, State: scheduler.NodeUp}},
		Running: []scheduler.Job{{ID: 10, Team: "a", Tier: scheduler.Tier3, RunAs: scheduler.Tier3, GPUs: 8, TimeLimit: 1e15, Start: demoNow.Add(-1e12), Placement: []scheduler.Slot{{Node: 0, GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}}}}},
		Pending: []scheduler.Job{{ID: 1, Team: "a", Tier: scheduler.Tier1, GPUs: 8, TimeLimit: 3600e9, Submit: demoNow}},
		Teams:   []scheduler.Team{{Name: "a", Weight: 1}},
	}
	if p := scheduler.Schedule(snap, demoNow, cp); len(p.Preemptions) != 0 {
		t.Errorf("tier 1 preempted tier 3 after losing the right: %+v", p.Preemptions)
	}
	if p := scheduler.Schedule(snap, demoNow, corePolicy(allot.DefaultPolicy(), demo.Tiers())); len(p.Preemptions) != 1 {
		t.Errorf("with the right, preemptions %+v", p.Preemptions)
	}
	// Without the right but with an unused reservation of 8 GPUs, tier 1
	// takes them back.
	tiers[0].ReservedGPUs = 8
	if p := scheduler.Schedule(snap, demoNow, corePolicy(allot.DefaultPolicy(), tiers)); len(p.Preemptions) != 1 ||
		!strings.Contains(p.Preemptions[0].Reason, "reserved GPUs") {
		t.Errorf("reservation reclaim: %+v", p.Preemptions)
	}
}
