package scheduler

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func allot() Policy { return DefaultPolicy() }

// classic is ModeAllot as before OrderResponse: Slurm's multifactor order
// and the 20-minute starvation guard (the live loop's policy).
func classic() Policy {
	p := DefaultPolicy()
	p.Order, p.StarvationWait = OrderMultifactor, 20*time.Minute
	return p
}

func mode(m Mode) Policy {
	p := DefaultPolicy()
	p.Mode = m
	return p
}

func TestClassOrder(t *testing.T) {
	t.Parallel()
	// One free GPU; the tier-1 job wins over older tier-3/4 jobs, and the
	// tier-3 job over the tier-4 one (none has waited StarvationWait; the
	// guard is on in the classic policy only: under OrderResponse class
	// order is strict, see TestResponseOrder).
	tests := []struct {
		name    string
		pending []Job
		want    []int64
	}{
		{"tier 1 first", []Job{job(1, 1, tier(Tier4), submitted(time.Hour)), job(2, 1, tier(Tier3)), job(3, 1, tier(Tier1))}, []int64{3}},
		{"tier 3 before tier 4", []Job{job(1, 1, tier(Tier4), submitted(15*time.Minute)), job(2, 1, tier(Tier3))}, []int64{2}},
		{"starving tier 4 before tier 3", []Job{job(1, 1, tier(Tier4), submitted(time.Hour)), job(2, 1, tier(Tier3))}, []int64{1}},
		{"preemptible last", []Job{job(1, 1, tier(Tier4), preemptible(), submitted(time.Hour)), job(2, 1, tier(Tier4))}, []int64{2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := Snapshot{
				Nodes:   cluster(1, 2),
				Running: []Job{job(100, 1, on(time.Hour, slot(0, 0)))},
				Pending: tt.pending,
				Teams:   teamsAB(1, 1),
			}
			if diff := cmp.Diff(tt.want, startIDs(Schedule(s, t0, classic()))); diff != "" {
				t.Errorf("starts (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPriorityMath(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Nodes: cluster(2, 8),
		Running: []Job{
			job(100, 8, on(time.Hour, slot(0, seq(0, 8)...))),
			job(101, 8, on(time.Hour, slot(1, seq(0, 8)...))),
		},
		Pending: []Job{job(1, 4, team("a"), submitted(42*time.Hour))},
		Teams: []Team{
			{Name: "a", Weight: 1, Usage: 300},
			{Name: "b", Weight: 3, Usage: 100},
		},
	}
	p := Schedule(s, t0, classic())
	// S_a = 1/4, U_a = 300/400 = 3/4, F = 2^(-3) = 0.125; size = 4/16;
	// age = 42 h / 168 h = 0.25.
	want := Priority{Class: Tier3, FairShare: 0.125, Size: 0.25, Age: 0.25, Total: 10000*0.125 + 1000*0.25 + 500*0.25}
	got := pendingInfo(p, 1).Priority
	if diff := cmp.Diff(want, got, cmp.Comparer(func(x, y float64) bool { return math.Abs(x-y) < 1e-9 })); diff != "" {
		t.Errorf("priority (-want +got):\n%s", diff)
	}
	// OrderResponse: (wait + limit) / limit × 2F = (42 h + 1 h) / 1 h × 0.25.
	if got := pendingInfo(Schedule(s, t0, allot()), 1).Priority.Total; math.Abs(got-43*0.25) > 1e-9 {
		t.Errorf("response priority %v, want %v", got, 43*0.25)
	}
	wantShares := []TeamShare{
		{Team: "a", NormShares: 0.25, RawUsage: 300, EffectiveUsage: 0.75, FairShare: 0.125},
		{Team: "b", NormShares: 0.75, RawUsage: 100, EffectiveUsage: 0.25, FairShare: math.Exp2(-1.0 / 3)},
	}
	if diff := cmp.Diff(wantShares, p.Shares, cmp.Comparer(func(x, y float64) bool { return math.Abs(x-y) < 1e-9 })); diff != "" {
		t.Errorf("shares (-want +got):\n%s", diff)
	}
}

func TestFairShareOrdering(t *testing.T) {
	t.Parallel()
	// Same class, one free GPU: the team that used less of its share goes
	// first even though its job is younger (but not starving).
	s := Snapshot{
		Nodes:   cluster(1, 2),
		Running: []Job{job(100, 1, on(time.Hour, slot(0, 0)))},
		Pending: []Job{job(1, 1, team("a"), submitted(15*time.Minute)), job(2, 1, team("b"))},
		Teams:   []Team{{Name: "a", Weight: 1, Usage: 900}, {Name: "b", Weight: 1, Usage: 100}},
	}
	if diff := cmp.Diff([]int64{2}, startIDs(Schedule(s, t0, allot()))); diff != "" {
		t.Errorf("starts (-want +got):\n%s", diff)
	}
}

func TestBudgetDemotion(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Nodes: cluster(1, 8),
		Pending: []Job{
			job(1, 1, tier(Tier3)),
			job(2, 1, tier(Tier4)),
			job(3, 1, tier(Tier1)),
			job(4, 1, tier(Tier2), team("b")),
			job(5, 1, tier(Tier3), team("b"), preemptible()),
		},
		Teams: []Team{{Name: "a", Weight: 1, OverBudget: true}, {Name: "b", Weight: 1}},
	}
	got := map[int64]Tier{}
	for _, st := range Schedule(s, t0, allot()).Starts {
		got[st.JobID] = st.RunAs
	}
	want := map[int64]Tier{1: TierPreemptible, 2: TierPreemptible, 3: Tier1, 4: Tier2, 5: TierPreemptible}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("RunAs (-want +got):\n%s", diff)
	}
}

// fullCluster is one 8-GPU node fully used by team b's running jobs.
func fullCluster(running ...Job) Snapshot {
	return Snapshot{Nodes: cluster(1, 8), Running: running, Teams: teamsAB(4, 0)}
}

func TestGuaranteePreemption(t *testing.T) {
	t.Parallel()
	s := fullCluster(
		job(100, 4, team("b"), tier(Tier4), on(time.Hour, slot(0, 0, 1, 2, 3))),
		job(101, 4, team("b"), tier(Tier4), limit(100*time.Hour), on(20*time.Minute, slot(0, 4, 5, 6, 7))),
	)
	s.Pending = []Job{job(1, 4, team("a"), tier(Tier4), limit(10*time.Hour), submitted(time.Hour))}
	p := Schedule(s, t0, allot())
	if diff := cmp.Diff([]int64{101}, victimIDs(p)); diff != "" {
		t.Fatalf("victims (-want +got):\n%s", diff)
	}
	if p.Preemptions[0].By != 1 || len(p.Starts) != 0 {
		t.Fatalf("plan = %+v", p)
	}
	wantRes := []Reservation{{JobID: 1, At: t0.Add(2 * time.Minute), Claims: []Claim{{Node: 0, GPUs: 4}}}}
	if diff := cmp.Diff(wantRes, p.Reservations); diff != "" {
		t.Errorf("reservations (-want +got):\n%s", diff)
	}

	// Next cycle, the victim is terminating: no second preemption, and
	// the freed GPUs stay reserved for job 1 against a backfill job.
	s.Running[1].Terminating = true
	s.Running[1].GraceEnd = t0.Add(2 * time.Minute)
	s.Running[1].PreemptedBy = 1
	s.Pending = append(s.Pending, job(2, 4, team("b"), tier(Tier3), limit(time.Hour)))
	p = Schedule(s, t0.Add(10*time.Second), allot())
	if len(p.Preemptions) != 0 || len(p.Starts) != 0 {
		t.Fatalf("second cycle: preemptions %v starts %v", p.Preemptions, p.Starts)
	}
	if got := pendingInfo(p, 1).EstStart; !got.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("EstStart = %v, want grace end", got)
	}
}

// TestReclaimSparesVictimsThatComeBackFirst: under the response order a
// requeued victim keeps its original submit time, so a job that waited
// long before it started would come back ahead of the team reclaiming
// its guarantee, take the freed GPUs back at the grace end and be
// preempted again (a replay preempted one job over 100 times that way).
// Job 100 waited 30 h before it started 20 min ago (the least work to
// lose); job 101 waited two hours and has run for one: only 101 may go.
func TestReclaimSparesVictimsThatComeBackFirst(t *testing.T) {
	t.Parallel()
	x := job(1, 4, team("a"), tier(Tier4), limit(10*time.Hour), submitted(time.Hour))
	v100 := job(100, 4, team("b"), tier(Tier4), limit(50*time.Hour), submitted(30*time.Hour), on(20*time.Minute, slot(0, 0, 1, 2, 3)))
	v101 := job(101, 4, team("b"), tier(Tier4), submitted(3*time.Hour), on(time.Hour, slot(0, 4, 5, 6, 7)))
	s := fullCluster(v100, v101)
	s.Pending = []Job{x}
	if diff := cmp.Diff([]int64{101}, victimIDs(Schedule(s, t0, allot()))); diff != "" {
		t.Errorf("victims (-want +got):\n%s", diff)
	}
	// With job 100 alone on the node there is no victim to take.
	v100.GPUs, v100.Placement = 8, []Slot{slot(0, seq(0, 8)...)}
	s = fullCluster(v100)
	s.Pending = []Job{x}
	if p := Schedule(s, t0, allot()); len(p.Preemptions) != 0 {
		t.Errorf("preempted %v, which would come back first", victimIDs(p))
	}
	// The rule is the response order's: the multifactor order (without
	// the starvation guard, whose own rule spares victims submitted before
	// the guard's wait) takes job 100.
	mf := allot()
	mf.Order = OrderMultifactor
	if diff := cmp.Diff([]int64{100}, victimIDs(Schedule(s, t0, mf))); diff != "" {
		t.Errorf("multifactor victims (-want +got):\n%s", diff)
	}
}

// TestClassicReclaimSparesVictimsThatWouldStarve: under the classic order
// a victim requeued with its original submit time that would be starving
// by the grace end is served by the starvation guard first, takes the
// freed GPUs back and is preempted again (the classic order livelocked so
// on philly-48: one job over 100 times). A reclaim takes only victims that
// come back not starving, whatever part of a node they hold (the rule once
// held for whole-node victims only, and job 100 holds half a node).
func TestClassicReclaimSparesVictimsThatWouldStarve(t *testing.T) {
	t.Parallel()
	x := job(1, 4, team("a"), tier(Tier4), limit(10*time.Hour), submitted(15*time.Minute))
	v100 := job(100, 4, team("b"), tier(Tier4), limit(50*time.Hour), submitted(30*time.Minute), on(11*time.Minute, slot(0, 0, 1, 2, 3)))
	v101 := job(101, 4, team("b"), tier(Tier4), limit(50*time.Hour), submitted(12*time.Minute), on(11*time.Minute+30*time.Second, slot(0, 4, 5, 6, 7)))
	s := fullCluster(v100, v101)
	s.Pending = []Job{x}
	if diff := cmp.Diff([]int64{101}, victimIDs(Schedule(s, t0, classic()))); diff != "" {
		t.Errorf("victims (-want +got):\n%s", diff)
	}
	v101.Submit = t0.Add(-25 * time.Minute)
	s = fullCluster(v100, v101)
	s.Pending = []Job{x}
	if p := Schedule(s, t0, classic()); len(p.Preemptions) != 0 {
		t.Errorf("preempted %v, which would come back starving", victimIDs(p))
	}
	// The guard serves tier 3-4 jobs only: a job running as preemptible
	// comes back behind the preemptor whenever it was submitted.
	v100.RunAs, v100.Preemptible = TierPreemptible, true
	s = fullCluster(v100, v101)
	s.Pending = []Job{x}
	if diff := cmp.Diff([]int64{100}, victimIDs(Schedule(s, t0, classic()))); diff != "" {
		t.Errorf("preemptible victim: victims (-want +got):\n%s", diff)
	}
	// Running as preemptible only because its team was over budget, which
	// it no longer is: it comes back as tier 4, starving, so it is spared.
	v100.Preemptible = false
	v101.Submit = t0.Add(-12 * time.Minute)
	s = fullCluster(v100, v101)
	s.Pending = []Job{x}
	if diff := cmp.Diff([]int64{101}, victimIDs(Schedule(s, t0, classic()))); diff != "" {
		t.Errorf("demotion lifted: victims (-want +got):\n%s", diff)
	}
}

func TestGuaranteePatience(t *testing.T) {
	t.Parallel()
	s := fullCluster(job(100, 8, team("b"), tier(Tier4), on(time.Hour, slot(0, seq(0, 8)...))))
	s.Pending = []Job{job(1, 4, team("a"), tier(Tier4), submitted(time.Minute))}
	if p := Schedule(s, t0, allot()); len(p.Preemptions) != 0 {
		t.Errorf("preempted before the patience ran out: %v", p.Preemptions)
	}
}

func TestNoPreemptionAboveGuarantee(t *testing.T) {
	t.Parallel()
	// Team a already uses its guarantee: its job waits.
	s := fullCluster(
		job(100, 4, team("a"), tier(Tier4), on(time.Hour, slot(0, 0, 1, 2, 3))),
		job(101, 4, team("b"), tier(Tier4), on(time.Hour, slot(0, 4, 5, 6, 7))),
	)
	s.Pending = []Job{job(1, 4, team("a"), tier(Tier4), submitted(time.Hour))}
	if p := Schedule(s, t0, allot()); len(p.Preemptions) != 0 {
		t.Errorf("preemptions = %v", p.Preemptions)
	}
}

func TestVictimOrdering(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		running []Job
		want    []int64
	}{
		{
			name: "preemptible before above-guarantee",
			running: []Job{
				job(100, 4, team("b"), tier(Tier4), on(time.Hour, slot(0, 0, 1, 2, 3))),
				job(101, 4, team("b"), tier(Tier3), preemptible(), func(j *Job) { j.RunAs = TierPreemptible }, on(3*time.Hour, slot(0, 4, 5, 6, 7))),
			},
			want: []int64{101},
		},
		{
			name: "least lost work",
			running: []Job{
				// Long time limits: the wait avoided (197 h) is worth the
				// 4 GPU-h lost (guaranteeLostRatio).
				job(100, 4, team("b"), tier(Tier4), limit(200*time.Hour), on(3*time.Hour, slot(0, 0, 1, 2, 3))),
				job(101, 4, team("b"), tier(Tier4), limit(200*time.Hour), on(time.Hour, slot(0, 4, 5, 6, 7))),
			},
			want: []int64{101},
		},
		{
			name: "fewest GPUs freed",
			running: []Job{
				job(100, 6, team("b"), tier(Tier4), on(time.Hour, slot(0, seq(0, 6)...))),
				job(101, 1, team("b"), tier(Tier4), on(time.Hour, slot(0, 6))),
				job(102, 1, team("b"), tier(Tier4), on(time.Hour, slot(0, 7))),
			},
			want: []int64{101},
		},
		{
			name: "never before the minimum runtime",
			running: []Job{
				job(100, 8, team("b"), tier(Tier4), on(5*time.Minute, slot(0, seq(0, 8)...))),
			},
			want: []int64{},
		},
		{
			name: "never production",
			running: []Job{
				job(100, 8, team("b"), tier(Tier2), on(5*time.Hour, slot(0, seq(0, 8)...))),
			},
			want: []int64{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := fullCluster(tt.running...)
			s.Pending = []Job{job(1, 1, team("a"), tier(Tier3), limit(10*time.Hour), submitted(time.Hour))}
			if diff := cmp.Diff(tt.want, victimIDs(Schedule(s, t0, allot()))); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTier1Preempts(t *testing.T) {
	t.Parallel()
	// Tier 1 may preempt any tier 3-4 work, even of a team within its
	// guarantee, but never tier 1-2.
	s := Snapshot{
		Nodes: cluster(2, 4),
		Running: []Job{
			job(100, 4, team("b"), tier(Tier2), on(time.Hour, slot(0, seq(0, 4)...))),
			job(101, 4, team("b"), tier(Tier3), on(time.Hour, slot(1, seq(0, 4)...))),
		},
		Pending: []Job{job(1, 4, tier(Tier1), limit(10*time.Hour))},
		Teams:   teamsAB(0, 8),
	}
	p := Schedule(s, t0, allot())
	if diff := cmp.Diff([]int64{101}, victimIDs(p)); diff != "" {
		t.Errorf("victims (-want +got):\n%s", diff)
	}
	if !strings.Contains(p.Preemptions[0].Reason, "tier 1 job 1") {
		t.Errorf("reason = %q", p.Preemptions[0].Reason)
	}
}

func TestMayPreemptNarrowsRights(t *testing.T) {
	t.Parallel()
	// An admin took tier 3 out of tier 1's preemption rights: the tier-1
	// job takes the preemptible job's GPUs and leaves the tier-3 job alone.
	s := Snapshot{
		Nodes: cluster(2, 4),
		Running: []Job{
			job(100, 4, team("b"), tier(Tier3), on(time.Hour, slot(0, seq(0, 4)...))),
			job(101, 4, team("b"), tier(Tier4), preemptible(), on(time.Hour, slot(1, seq(0, 4)...))),
		},
		Pending: []Job{job(1, 8, tier(Tier1), limit(10*time.Hour))},
		Teams:   teamsAB(0, 8),
	}
	p := allot()
	if got := victimIDs(Schedule(s, t0, p)); !slices.Equal(got, []int64{100, 101}) {
		t.Fatalf("with full rights the victims are %v, want both", got)
	}
	p.MayPreempt = map[Tier][]Tier{Tier1: {Tier4, TierPreemptible}}
	if got := victimIDs(Schedule(s, t0, p)); len(got) != 0 {
		t.Errorf("8 GPUs need the tier-3 job too, which tier 1 may no longer preempt: victims %v", got)
	}
	s.Pending[0].GPUs = 4
	if got := victimIDs(Schedule(s, t0, p)); !slices.Equal(got, []int64{101}) {
		t.Errorf("victims %v, want the preemptible job only", got)
	}
	p.MayPreempt = map[Tier][]Tier{Tier1: {}}
	if got := victimIDs(Schedule(s, t0, p)); len(got) != 0 {
		t.Errorf("no rights at all, yet victims %v", got)
	}
}

func TestReservedGPUsReclaimed(t *testing.T) {
	t.Parallel()
	// Tier 2 may preempt only preemptible work by right, and the cluster
	// is full of tier-3 work: a tier-2 job waits, unless tier 2 has a
	// reservation it is not using, which it then takes back.
	s := Snapshot{
		Nodes: cluster(2, 4),
		Running: []Job{
			job(100, 4, team("b"), tier(Tier3), on(time.Hour, slot(0, seq(0, 4)...))),
			job(101, 4, team("b"), tier(Tier3), on(2*time.Hour, slot(1, seq(0, 4)...))),
		},
		Pending: []Job{job(1, 4, tier(Tier2), limit(10*time.Hour))},
		Teams:   teamsAB(0, 8),
	}
	p := allot()
	p.MayPreempt = map[Tier][]Tier{Tier2: {TierPreemptible}}
	if got := victimIDs(Schedule(s, t0, p)); len(got) != 0 {
		t.Fatalf("without a reservation tier 2 preempted %v", got)
	}
	p.Reserved = map[Tier]int{Tier2: 4}
	plan := Schedule(s, t0, p)
	if got := victimIDs(plan); len(got) != 1 {
		t.Fatalf("with 4 reserved GPUs the victims are %v, want one 4-GPU job", got)
	}
	if r := plan.Preemptions[0].Reason; !strings.Contains(r, "takes back its 4 reserved GPUs") {
		t.Errorf("reason %q", r)
	}
	// The reservation is used up by a running tier-2 job: no more.
	s.Running[0].Tier, s.Running[0].RunAs = Tier2, Tier2
	if got := victimIDs(Schedule(s, t0, p)); len(got) != 0 {
		t.Errorf("reservation already in use, yet victims %v", got)
	}
	// A job wider than the reservation does not reclaim either.
	s.Running[0].Tier, s.Running[0].RunAs = Tier3, Tier3
	s.Pending[0].GPUs = 8
	if got := victimIDs(Schedule(s, t0, p)); len(got) != 0 {
		t.Errorf("8 GPUs asked, 4 reserved, yet victims %v", got)
	}
}

func TestClassOrderFromPolicy(t *testing.T) {
	t.Parallel()
	// Room for one of two jobs: tier 3 goes first, unless an admin put
	// tier 4 before tier 3.
	s := Snapshot{
		Nodes:   cluster(1, 4),
		Pending: []Job{job(1, 4, tier(Tier3)), job(2, 4, tier(Tier4), submitted(5*time.Minute))},
		Teams:   teamsAB(0, 0),
	}
	p := allot()
	if got := startIDs(Schedule(s, t0, p)); !slices.Equal(got, []int64{1}) {
		t.Fatalf("natural order started %v", got)
	}
	p.ClassOrder = map[Tier]int{Tier1: 1, Tier2: 2, Tier4: 3, Tier3: 4, TierPreemptible: 5}
	if got := startIDs(Schedule(s, t0, p)); !slices.Equal(got, []int64{2}) {
		t.Errorf("tier 4 before tier 3 started %v", got)
	}
}

func TestProductionOnPremOnly(t *testing.T) {
	t.Parallel()
	nodes := cluster(2, 8)
	nodes[1].Site = SiteCloud
	s := Snapshot{
		Nodes:   nodes,
		Running: []Job{job(100, 8, on(time.Minute, slot(0, seq(0, 8)...)))},
		Pending: []Job{job(1, 1, tier(Tier1)), job(2, 1, tier(Tier2)), job(3, 1, tier(Tier3))},
		Teams:   teamsAB(0, 0),
	}
	p := Schedule(s, t0, allot())
	if diff := cmp.Diff([]int64{3}, startIDs(p)); diff != "" {
		t.Errorf("starts (-want +got):\n%s", diff)
	}
	if r := pendingInfo(p, 1).Reason; !strings.Contains(r, "on-premise") {
		t.Errorf("reason = %q", r)
	}
}

func TestGPUTypeConstraint(t *testing.T) {
	t.Parallel()
	nodes := cluster(2, 8)
	nodes[1].GPUType = "H100"
	s := Snapshot{Nodes: nodes, Pending: []Job{job(1, 2, gpuType("H100")), job(2, 2, gpuType("A100")), job(3, 2, gpuType("B200"))}}
	p := Schedule(s, t0, allot())
	want := []Start{
		{JobID: 1, Placement: []Slot{slot(1, 0, 1)}, RunAs: Tier3},
		{JobID: 2, Placement: []Slot{slot(0, 0, 1)}, RunAs: Tier3},
	}
	if diff := cmp.Diff(want, p.Starts, cmpStartsNoPrio); diff != "" {
		t.Errorf("starts (-want +got):\n%s", diff)
	}
	if r := pendingInfo(p, 3).Reason; !strings.HasPrefix(r, "can never run") {
		t.Errorf("reason = %q", r)
	}
}

var cmpStartsNoPrio = cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Priority" }, cmp.Ignore())

func TestMultiNodeOneDomain(t *testing.T) {
	t.Parallel()
	nodes := cluster(5, 8)
	nodes[2].Domain, nodes[3].Domain, nodes[4].Domain = "d1", "d1", "d1"
	s := Snapshot{
		Nodes: nodes,
		// d0 has one whole free node (1), d1 has three (2, 3, 4).
		Running: []Job{job(100, 1, on(time.Minute, slot(0, 0)))},
		Pending: []Job{job(1, 16), job(2, 12)},
	}
	p := Schedule(s, t0, allot())
	want := []Start{
		{JobID: 1, Placement: []Slot{slot(2, seq(0, 8)...), slot(3, seq(0, 8)...)}, RunAs: Tier3},
	}
	if diff := cmp.Diff(want, p.Starts, cmpStartsNoPrio); diff != "" {
		t.Errorf("starts (-want +got):\n%s", diff)
	}
	if r := pendingInfo(p, 2).Reason; !strings.HasPrefix(r, "waiting for 12 GPUs in one interconnect domain") || !strings.Contains(r, "largest free block is 8") {
		t.Errorf("reason = %q", r)
	}
}

func TestMultiNodeFlatDomain(t *testing.T) {
	t.Parallel()
	// Domain "" is one flat domain: whole free nodes, lowest index first.
	nodes := cluster(4, 8)
	for i := range nodes {
		nodes[i].Domain = ""
	}
	s := Snapshot{Nodes: nodes, Running: []Job{job(100, 1, on(time.Minute, slot(1, 0)))}, Pending: []Job{job(1, 12)}}
	want := []Slot{slot(0, seq(0, 8)...), slot(2, seq(0, 4)...)}
	for _, m := range []Mode{ModeAllot, ModeFIFO, ModeEASY} {
		p := Schedule(s, t0, mode(m))
		if len(p.Starts) != 1 {
			t.Fatalf("%s: starts = %v", m, p.Starts)
		}
		if diff := cmp.Diff(want, p.Starts[0].Placement); diff != "" {
			t.Errorf("%s placement (-want +got):\n%s", m, diff)
		}
	}
}

func TestBestFit(t *testing.T) {
	t.Parallel()
	// Free GPUs: node 0: 8, node 1: 3, node 2: 2, node 3: 2.
	s := Snapshot{
		Nodes: cluster(4, 8),
		Running: []Job{
			job(100, 5, on(time.Minute, slot(1, seq(0, 5)...))),
			job(101, 6, on(time.Minute, slot(2, seq(0, 6)...))),
			job(102, 6, on(time.Minute, slot(3, seq(2, 6)...))),
		},
	}
	tests := []struct {
		gpus int
		want Slot
	}{
		{2, slot(2, 6, 7)}, // fewest free that fit, then lowest index
		{3, slot(1, 5, 6, 7)},
		{4, slot(0, 0, 1, 2, 3)},
		{1, slot(2, 6)},
	}
	for _, tt := range tests {
		for _, m := range []Mode{ModeAllot, ModeFIFO, ModeEASY} {
			s := s
			s.Pending = []Job{job(1, tt.gpus)}
			p := Schedule(s, t0, mode(m))
			if len(p.Starts) != 1 {
				t.Fatalf("%s %d GPUs: starts = %v", m, tt.gpus, p.Starts)
			}
			if diff := cmp.Diff([]Slot{tt.want}, p.Starts[0].Placement); diff != "" {
				t.Errorf("%s %d GPUs (-want +got):\n%s", m, tt.gpus, diff)
			}
		}
	}
}

func TestBackfillDoesNotDelayReservation(t *testing.T) {
	t.Parallel()
	// Node 0 frees at 15:00; node 1 has 4 free GPUs now and frees at 16:00.
	// The 16-GPU job reserves both nodes from 16:00; a 4-GPU job may
	// backfill on node 1 only if it ends by then.
	s := Snapshot{
		Nodes: cluster(2, 8),
		Running: []Job{
			job(100, 8, on(0, slot(0, seq(0, 8)...))),
			job(101, 4, limit(2*time.Hour), on(0, slot(1, seq(0, 4)...))),
		},
		Pending: []Job{
			job(1, 16, submitted(10*time.Minute)),
			job(2, 4, limit(3*time.Hour)),
			job(3, 4, limit(90*time.Minute)),
		},
	}
	p := Schedule(s, t0, allot())
	want := []Start{{JobID: 3, Placement: []Slot{slot(1, 4, 5, 6, 7)}, RunAs: Tier3, Backfill: true}}
	if diff := cmp.Diff(want, p.Starts, cmpStartsNoPrio); diff != "" {
		t.Errorf("starts (-want +got):\n%s", diff)
	}
	wantRes := []Reservation{{JobID: 1, At: t0.Add(2 * time.Hour), Claims: []Claim{{0, 8}, {1, 8}}}}
	if diff := cmp.Diff(wantRes, p.Reservations); diff != "" {
		t.Errorf("reservations (-want +got):\n%s", diff)
	}
	wantReason := "waiting for 16 GPUs in one interconnect domain; holds a backfill reservation; largest free block is 0; expected start 16:00 when job 101 reaches its time limit"
	if diff := cmp.Diff(wantReason, pendingInfo(p, 1).Reason); diff != "" {
		t.Errorf("reason (-want +got):\n%s", diff)
	}
}

func TestPendingReasonClock(t *testing.T) {
	t.Parallel()
	if got := clock(t0.Add(20*time.Minute), t0); got != "14:20" {
		t.Errorf("same day: %q", got)
	}
	if got := clock(t0.Add(26*time.Hour), t0); got != "Dec 1 16:00" {
		t.Errorf("next day: %q", got)
	}
}

func TestFIFOHeadOfLine(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Nodes:   cluster(1, 8),
		Running: []Job{job(100, 4, on(0, slot(0, seq(0, 4)...)))},
		Pending: []Job{job(1, 8, submitted(time.Hour)), job(2, 1, limit(time.Minute))},
	}
	if p := Schedule(s, t0, mode(ModeFIFO)); len(p.Starts) != 0 {
		t.Errorf("FIFO started %v behind a blocked head", p.Starts)
	}
	// EASY backfills the short job (ends before the shadow time) but not a
	// long one that needs more than the extra GPUs.
	s.Pending = append(s.Pending, job(3, 2, limit(5*time.Hour)))
	p := Schedule(s, t0, mode(ModeEASY))
	if diff := cmp.Diff([]int64{2}, startIDs(p)); diff != "" {
		t.Errorf("EASY starts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Reservation{{JobID: 1, At: t0.Add(time.Hour)}}, p.Reservations); diff != "" {
		t.Errorf("EASY reservations (-want +got):\n%s", diff)
	}
	// Tiers mean nothing to the baselines.
	s.Pending = []Job{job(1, 2, tier(Tier4), submitted(time.Hour)), job(2, 2, tier(Tier1))}
	if diff := cmp.Diff([]int64{1, 2}, startIDs(Schedule(s, t0, mode(ModeFIFO)))); diff != "" {
		t.Errorf("FIFO order (-want +got):\n%s", diff)
	}
}

func TestPartitioned(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Nodes: cluster(3, 8),
		Pending: []Job{
			job(1, 8, team("a"), submitted(3*time.Hour)),
			job(2, 8, team("a"), submitted(2*time.Hour)), // a's partition is full
			job(3, 1, team("a"), submitted(time.Hour)),   // strict FIFO in a
			job(4, 8, team("b")),
			job(5, 1, team("c")), // no guarantee
		},
		Teams: append(teamsAB(8, 16), Team{Name: "c", Weight: 1}),
	}
	p := Schedule(s, t0, mode(ModeFIFOPartitioned))
	want := []Start{
		{JobID: 1, Placement: []Slot{slot(0, seq(0, 8)...)}, RunAs: Tier3},
		{JobID: 4, Placement: []Slot{slot(1, seq(0, 8)...)}, RunAs: Tier3},
	}
	if diff := cmp.Diff(want, p.Starts, cmpStartsNoPrio); diff != "" {
		t.Errorf("starts (-want +got):\n%s", diff)
	}
	if r := pendingInfo(p, 5).Reason; !strings.HasPrefix(r, "can never run in the partitioned cluster") {
		t.Errorf("reason = %q", r)
	}
}

func TestUnavailableAndDrained(t *testing.T) {
	t.Parallel()
	nodes := cluster(2, 2)
	nodes[0].Unavailable = []int{0}
	nodes[1].State = NodeDraining
	s := Snapshot{Nodes: nodes, Pending: []Job{job(1, 1), job(2, 1)}}
	want := []Start{{JobID: 1, Placement: []Slot{slot(0, 1)}, RunAs: Tier3}}
	if diff := cmp.Diff(want, Schedule(s, t0, allot()).Starts, cmpStartsNoPrio); diff != "" {
		t.Errorf("starts (-want +got):\n%s", diff)
	}
	// A job wider than every node up says the drained node may help later,
	// instead of "can never run".
	s.Pending = []Job{job(3, 4)}
	nodes[0].Unavailable = nil
	if r := pendingInfo(Schedule(s, t0, allot()), 3).Reason; !strings.HasPrefix(r, "cannot run on the nodes up now") || !strings.Contains(r, "nodes draining, drained or down: 1)") {
		t.Errorf("reason %q", r)
	}
}

// TestStarvationGuard (classic policy): a wide tier-4 job that has waited StarvationWait
// reserves the node it waits for before a fresh tier-3 job is placed, so
// the tier-3 job, which would end after the reservation, does not start.
func TestStarvationGuard(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Nodes:   cluster(1, 8),
		Running: []Job{job(100, 4, limit(30*time.Minute), on(0, slot(0, 0, 1, 2, 3)))},
		Pending: []Job{job(1, 8, tier(Tier4), submitted(time.Hour)), job(2, 4, tier(Tier3))},
		Teams:   teamsAB(0, 0),
	}
	p := Schedule(s, t0, classic())
	if len(p.Starts) != 0 {
		t.Errorf("starts %v, want none", startIDs(p))
	}
	// Job 2 is its class's first blocked job and reserves after job 1.
	want := []Reservation{
		{JobID: 1, At: t0.Add(30 * time.Minute), Claims: []Claim{{0, 8}}},
		{JobID: 2, At: t0.Add(90 * time.Minute), Claims: []Claim{{0, 4}}},
	}
	if diff := cmp.Diff(want, p.Reservations); diff != "" {
		t.Errorf("reservations (-want +got):\n%s", diff)
	}
	// Not yet starving: class order lets the tier-3 job start.
	s.Pending[0].Submit = t0.Add(-10 * time.Minute)
	if diff := cmp.Diff([]int64{2}, startIDs(Schedule(s, t0, classic()))); diff != "" {
		t.Errorf("starts (-want +got):\n%s", diff)
	}
}

// TestPackingByBusyPeriod: a single-node job goes where it extends a
// node's busy period the least, then best fit, then the lowest index;
// wholly free nodes come last.
func TestPackingByBusyPeriod(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Nodes: cluster(3, 8),
		Running: []Job{
			job(100, 4, limit(time.Hour), on(0, slot(0, 0, 1, 2, 3))),
			job(101, 4, limit(10*time.Hour), on(0, slot(1, 0, 1, 2, 3))),
		},
		Teams: teamsAB(0, 0),
	}
	for _, tt := range []struct {
		limit time.Duration
		node  int
	}{{5 * time.Hour, 1}, {30 * time.Minute, 0}, {20 * time.Hour, 1}} {
		s.Pending = []Job{job(1, 1, limit(tt.limit))}
		p := Schedule(s, t0, allot())
		if len(p.Starts) != 1 || p.Starts[0].Placement[0].Node != tt.node {
			t.Errorf("limit %v: starts %+v, want node %d", tt.limit, p.Starts, tt.node)
		}
	}
	// The baselines keep the reference's best fit: fewest free, lowest index.
	s.Pending = []Job{job(1, 1, limit(5*time.Hour))}
	if p := Schedule(s, t0, mode(ModeEASY)); len(p.Starts) != 1 || p.Starts[0].Placement[0].Node != 0 {
		t.Errorf("easy: starts %+v, want node 0", p.Starts)
	}
}

// TestResponseOrder: under OrderResponse a short job goes before a long
// one of the same wait, a long job that has waited long enough goes before
// a fresh short one (a fresh job's ratio is 1), and a team far above its
// share needs a proportionally longer wait.
func TestResponseOrder(t *testing.T) {
	t.Parallel()
	p := allot()
	p.Order, p.StarvationWait = OrderResponse, 0
	s := Snapshot{
		Nodes:   cluster(1, 2),
		Running: []Job{job(100, 1, on(time.Hour, slot(0, 0)))},
		Teams:   teamsAB(1, 1),
	}
	for _, tt := range []struct {
		name    string
		pending []Job
		want    int64
	}{
		{"short first", []Job{job(1, 1, limit(10*time.Hour), submitted(time.Hour)), job(2, 1, limit(time.Hour), submitted(time.Hour))}, 2},
		{"aged long job before fresh short one", []Job{job(1, 1, limit(10*time.Hour), submitted(time.Hour)), job(2, 1, limit(time.Minute), submitted(0))}, 1},
		{"estimate before limit", []Job{job(1, 1, limit(10*time.Hour), submitted(time.Hour), func(j *Job) { j.Estimate = 30 * time.Minute }), job(2, 1, limit(time.Hour), submitted(time.Hour))}, 1},
		{"team above its share waits longer", []Job{job(1, 1, team("a"), limit(time.Hour), submitted(2*time.Hour)), job(2, 1, team("b"), limit(time.Hour), submitted(time.Hour))}, 2},
	} {
		s.Pending = tt.pending
		if tt.name == "team above its share waits longer" {
			s.Teams = []Team{{Name: "a", Weight: 1, Usage: 900}, {Name: "b", Weight: 1, Usage: 100}}
		}
		if diff := cmp.Diff([]int64{tt.want}, startIDs(Schedule(s, t0, p))); diff != "" {
			t.Errorf("%s: starts (-want +got):\n%s", tt.name, diff)
		}
	}
}

// TestSizeExponent: Policy.SizeExponent multiplies the response order's
// priority by GPUs^exponent: at 0 a 1-GPU job that has waited a second
// longer than a 4-GPU job of the same limit goes first, at 1 the wider goes
// first with 4× the priority, at -1 the narrower goes first, the wider at
// a quarter; a 1-GPU job's priority never changes.
func TestSizeExponent(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Nodes:   cluster(1, 8),
		Running: []Job{job(100, 8, limit(10*time.Hour), on(time.Hour, slot(0, 0, 1, 2, 3, 4, 5, 6, 7)))},
		Teams:   teamsAB(4, 4),
		Pending: []Job{
			job(1, 1, limit(time.Hour), submitted(2*time.Hour)),
			job(2, 4, limit(time.Hour), submitted(2*time.Hour-time.Second)),
		},
	}
	var base map[int64]float64
	for _, tt := range []struct {
		exp   float64
		first int64
		scale float64 // the 4-GPU job's priority over its priority at 0
	}{{0, 1, 1}, {1, 2, 4}, {-1, 1, 0.25}, {0.5, 2, 2}} {
		p := allot()
		p.SizeExponent = tt.exp
		plan := Schedule(s, t0, p)
		if len(plan.Pending) != 2 {
			t.Fatalf("exponent %v: pending %+v, want both jobs", tt.exp, plan.Pending)
		}
		if got := plan.Pending[0].JobID; got != tt.first {
			t.Errorf("exponent %v: first in the queue is job %d, want %d", tt.exp, got, tt.first)
		}
		prio := map[int64]float64{}
		for _, pi := range plan.Pending {
			prio[pi.JobID] = pi.Priority.Total
		}
		if base == nil {
			base = prio
			continue
		}
		if prio[1] != base[1] {
			t.Errorf("exponent %v: the 1-GPU job's priority is %v, want %v as at 0", tt.exp, prio[1], base[1])
		}
		if r := prio[2] / base[2]; math.Abs(r-tt.scale) > 1e-9 {
			t.Errorf("exponent %v: the 4-GPU job's priority is %v× its priority at 0, want %v×", tt.exp, r, tt.scale)
		}
	}
}

// TestSizeExponentInReclaimRule: a reclaim spares victims whose priority
// once requeued is above the reclaimer's, and the job-size factor counts
// for the victims too. A 2-GPU reclaimer (ratio 1.1) would take job 100
// (4 GPUs, 20 min run, requeued ratio 1.6) only if it came back behind:
// with e = -1 it does (0.4 against 0.55) and is taken; without a size term
// it is spared, and job 101 (1.02, run an hour) loses too much work; with
// e = +1 both come back first (6.4 and 4.1 against 2.2).
func TestSizeExponentInReclaimRule(t *testing.T) {
	t.Parallel()
	x := job(1, 2, team("a"), tier(Tier4), limit(10*time.Hour), submitted(time.Hour))
	v100 := job(100, 4, team("b"), tier(Tier4), limit(50*time.Hour), submitted(30*time.Hour), on(20*time.Minute, slot(0, 0, 1, 2, 3)))
	v101 := job(101, 4, team("b"), tier(Tier4), submitted(3*time.Hour), on(time.Hour, slot(0, 4, 5, 6, 7)))
	for _, tt := range []struct {
		exp  float64
		want []int64
	}{{0, nil}, {-1, []int64{100}}, {1, nil}} {
		s := fullCluster(v100, v101)
		s.Pending = []Job{x}
		p := allot()
		p.SizeExponent = tt.exp
		if diff := cmp.Diff(tt.want, victimIDs(Schedule(s, t0, p)), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("exponent %v: victims (-want +got):\n%s", tt.exp, diff)
		}
	}
}
