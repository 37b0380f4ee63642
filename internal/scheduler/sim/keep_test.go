package sim

import (
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/burst"
	"github.com/allotlabs/allot/internal/scheduler"
)

// TestKeepChangesNothing: keeping the running jobs' state between cycles
// (scheduler.RunningKeep, the default) gives the replay of reading every
// running job each cycle, in every mode, with preemptions, multi-node
// jobs, the ETA measurement and burst nodes (which change the nodes).
func TestKeepChangesNothing(t *testing.T) {
	t.Parallel()
	trace := randomTrace(400, 3) // TestDeterministic's: it preempts
	teams := []TeamSpec{{"a", 8}, {"b", 16}, {"c", 24}}
	ignore := cmpopts.IgnoreFields(Result{}, "CycleMeanUS", "CycleP99US", "SimWallS")
	for _, m := range []scheduler.Mode{scheduler.ModeAllot, scheduler.ModeEASY, scheduler.ModeFIFO, scheduler.ModeFIFOPartitioned} {
		cfg := Config{Nodes: 6, GPUsPerNode: 8, DomainNodes: 2, Teams: teams, Policy: policy(m),
			Cycle: 10 * time.Second, WalltimeFactor: 2, CheckpointFraction: 0.5, ETA: true, Schedule: scheduler.Schedule}
		kept := run(t, cfg, trace)
		cfg.NoKeep = true
		every := run(t, cfg, trace)
		if d := gocmp.Diff(every, kept, ignore); d != "" {
			t.Errorf("%s: keeping the running state changed the replay (-every cycle +kept):\n%s", m, d)
		}
		if m == scheduler.ModeAllot && kept.Preemptions == 0 {
			t.Errorf("%s: no preemption; the test should exercise one", m)
		}
	}
	// Learned run times for backfill and order (running jobs' Job.Predicted).
	pcfg := Config{Nodes: 6, GPUsPerNode: 8, DomainNodes: 2, Teams: teams, Policy: policy(scheduler.ModeAllot),
		Cycle: 10 * time.Second, WalltimeFactor: 1.5, WalltimeFactorMax: 5, CheckpointFraction: 0.5, LearnedOrder: true, Schedule: scheduler.Schedule}
	pcfg.Policy.PredictedBackfill = true
	pkept := run(t, pcfg, trace)
	pcfg.NoKeep = true
	if d := gocmp.Diff(run(t, pcfg, trace), pkept, ignore); d != "" {
		t.Errorf("predicted backfill: keeping the running state changed the replay (-every cycle +kept):\n%s", d)
	}
	// Burst nodes come and go: the nodes change, and the keep is rebuilt.
	rate := allot.Money{Micros: 1_400_000, Currency: "USD"}
	bc := &BurstConfig{Shape: burst.Shape{GPUType: "A100-spot", GPUs: 8, Rate: rate}, Thresholds: burst.FromPolicy(allot.DefaultPolicy()), Delay: 5 * time.Minute}
	cfg := burstCfg(bc)
	kept := run(t, cfg, burstTrace())
	cfg.NoKeep = true
	if d := gocmp.Diff(run(t, cfg, burstTrace()), kept, ignore, cmpopts.IgnoreUnexported(BurstResult{})); d != "" || kept.Burst.Nodes == 0 {
		t.Errorf("burst: keeping the running state changed the replay (-every cycle +kept):\n%s", d)
	}
}

// TestIdleCyclesChangeNothing: the cycles the core returns from at once
// (scheduler.Plan.Idle: every GPU busy, no pending job that may preempt)
// give exactly the replay of running every cycle in full, with guarantee
// reclaims, tier 1-2 preemption and the ETA measurement in play.
func TestIdleCyclesChangeNothing(t *testing.T) {
	t.Parallel()
	trace := randomTrace(400, 11)
	for i := range trace {
		trace[i].Submit /= 4 // four times the arrival rate: the cluster stays full
	}
	ignore := cmpopts.IgnoreFields(Result{}, "CycleMeanUS", "CycleP99US", "SimWallS")
	// Small guarantees (every team above its own: the idle cycles end
	// when a tier 1-2 job arrives); one team mostly under its guarantee
	// (idle cycles between its reclaims); the starvation guard, dedicated
	// production reservations and narrowed rights; and held reservations,
	// which carry each cycle's reservations to the next, so that no cycle
	// may return at once.
	starving := policy(scheduler.ModeAllot)
	starving.StarvationWait, starving.MinRuntime = 20*time.Minute, time.Minute
	starving.Reserved = map[scheduler.Tier]int{scheduler.Tier1: 8, scheduler.Tier2: 8}
	starving.MayPreempt = map[scheduler.Tier][]scheduler.Tier{scheduler.Tier2: {scheduler.Tier4, scheduler.TierPreemptible}}
	hold := policy(scheduler.ModeAllot)
	hold.HoldReservations = true
	for _, c := range []struct {
		teams []TeamSpec
		eta   bool
		p     scheduler.Policy
	}{
		{[]TeamSpec{{"a", 4}, {"b", 4}, {"c", 4}}, false, policy(scheduler.ModeAllot)},
		{[]TeamSpec{{"a", 32}, {"b", 8}, {"c", 8}}, true, policy(scheduler.ModeAllot)},
		{[]TeamSpec{{"a", 4}, {"b", 8}, {"c", 4}}, false, starving},
		{[]TeamSpec{{"a", 4}, {"b", 4}, {"c", 4}}, false, hold},
	} {
		teams, eta := c.teams, c.eta
		idle := 0
		fast := func(s scheduler.Snapshot, now time.Time, p scheduler.Policy) scheduler.Plan {
			plan := scheduler.Schedule(s, now, p)
			if plan.Idle {
				idle++
			}
			return plan
		}
		// Pending info for every job: no cycle may return at once, and
		// the decisions are the same.
		full := func(s scheduler.Snapshot, now time.Time, p scheduler.Policy) scheduler.Plan {
			if len(p.EstimateFor) == 0 {
				p.NoPendingInfo = false
			}
			return scheduler.Schedule(s, now, p)
		}
		cfg := Config{Nodes: 6, GPUsPerNode: 8, DomainNodes: 2, Teams: teams, Policy: c.p,
			Cycle: 10 * time.Second, WalltimeFactor: 2, CheckpointFraction: 0.5, ETA: eta, Schedule: fast,
			TierMix: []TierWeight{{1, 5}, {2, 10}, {3, 45}, {4, 35}, {5, 5}}}
		got := run(t, cfg, trace)
		cfg.Schedule = full
		want := run(t, cfg, trace)
		if d := gocmp.Diff(want, got, ignore); d != "" {
			t.Errorf("eta %v: idle cycles changed the replay (-every cycle in full +idle ones returned at once):\n%s", eta, d)
		}
		if c.p.HoldReservations {
			if idle > 0 {
				t.Errorf("held reservations: %d cycles returned at once", idle)
			}
		} else if idle < 100 || got.Preemptions == 0 {
			t.Errorf("eta %v: %d of %d cycles idle, %d preemptions: the test should exercise both", eta, idle, got.Cycles, got.Preemptions)
		}
		t.Logf("eta %v, hold %v: %d of %d cycles idle", eta, c.p.HoldReservations, idle, got.Cycles)
	}
}
