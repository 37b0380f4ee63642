package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/allotlabs/allot/internal/scheduler"
)

func sec(s float64) time.Duration { return secs(s) }

// tj builds a trace job: name, submit s, duration s, GPUs, team.
func tj(name string, submit, dur float64, gpus int, team string) TraceJob {
	return TraceJob{Name: name, Submit: sec(submit), Duration: sec(dur), GPUs: gpus, User: team, Team: team}
}

func policy(m scheduler.Mode) scheduler.Policy {
	p := scheduler.DefaultPolicy()
	p.Mode = m
	return p
}

func run(t *testing.T, cfg Config, trace []TraceJob) *Result {
	t.Helper()
	if cfg.Schedule == nil {
		cfg.Schedule = refSchedule
	}
	r, err := Run(cfg, trace)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var approx = cmpopts.EquateApprox(0, 1e-9)

// metricView is the subset of Result the hand-computed tests compare.
type metricView struct {
	Jobs, Dropped                          int
	MakespanS, Utilization, OfferedLoad    float64
	UtilizationSpan, OfferedLoadSpan       float64
	WaitMeanS, WaitP50S, WaitP95S, JCTMean float64
	BSLD, Jain, Lost                       float64
	Preemptions                            int
}

func view(r *Result) metricView {
	return metricView{r.Jobs, r.Dropped, r.MakespanS, r.Utilization, r.OfferedLoad, r.UtilizationSpan,
		r.OfferedLoadSpan, r.WaitMeanS, r.WaitP50S, r.WaitP95S, r.JCTMeanS, r.BoundedSlowdownMean,
		r.JainFairness, r.GPUSLostToPreemption, r.Preemptions}
}

// TestMetricsByHand replays three jobs on one 2-GPU node under FIFO and
// checks every metric against values worked out on paper:
//
//	A (team x, 2 GPUs) 0-100; B (y, 1 GPU) submitted 50, runs 100-200;
//	C (y, 1 GPU, 10 s) submitted 60, runs 100-110.
func TestMetricsByHand(t *testing.T) {
	t.Parallel()
	trace := []TraceJob{tj("A", 0, 100, 2, "x"), tj("B", 50, 100, 1, "y"), tj("C", 60, 10, 1, "y")}
	r := run(t, Config{Nodes: 1, GPUsPerNode: 2, Policy: policy(scheduler.ModeFIFO)}, trace)

	// Fair shares (capacity 2): [0,50) x=2; [50,60) x=1,y=1; [60,100) 1,1;
	// [100,110) y=2; [110,200) y=1. F_x=150, R_x=200; F_y=160, R_y=110.
	rx, ry := 200.0/150, 110.0/160
	want := metricView{
		Jobs: 3, MakespanS: 200,
		Utilization: 310.0 / 400, OfferedLoad: 310.0 / 400,
		UtilizationSpan: 1, OfferedLoadSpan: 130.0 / 120, // span = [0, 60]
		WaitMeanS: 30, WaitP50S: 40, WaitP95S: 40 + 0.9*10,
		JCTMean: 100, BSLD: (1 + 1.5 + 5) / 3,
		Jain: (rx + ry) * (rx + ry) / (2 * (rx*rx + ry*ry)),
	}
	if d := gocmp.Diff(want, view(r), approx); d != "" {
		t.Errorf("metrics (-want +got):\n%s", d)
	}
	wantTeams := map[string]Group{
		"x": {Jobs: 1, GPUS: 200, ShareRatio: rx},
		"y": {Jobs: 2, WaitMeanS: 45, WaitP95S: 40 + 0.95*10, WaitP99S: 40 + 0.99*10, GPUS: 110, ShareRatio: ry},
	}
	if d := gocmp.Diff(wantTeams, r.ByTeam, approx); d != "" {
		t.Errorf("by_team (-want +got):\n%s", d)
	}
}

// TestIdleWhilePending works the idle GPU-time out by hand: two nodes of
// 4 GPUs under FIFO. A (3 GPUs) and B (4) start at 0 on nodes 0 and 1
// until 100; C (4) waits from 10 while node 0's last GPU idles (no
// pending job fits: fragmentation); D (1), submitted at 20, would fit on
// it but waits behind C (held by the policy's order) until 100. E at 110
// ends the span [0, 110].
func TestIdleWhilePending(t *testing.T) {
	t.Parallel()
	trace := []TraceJob{tj("A", 0, 100, 3, "x"), tj("B", 0, 100, 4, "x"), tj("C", 10, 10, 4, "x"),
		tj("D", 20, 10, 1, "x"), tj("E", 110, 1, 1, "x")}
	r := run(t, Config{Nodes: 2, GPUsPerNode: 4, Policy: policy(scheduler.ModeFIFO)}, trace)
	capacity := 8.0 * 110
	if d := gocmp.Diff([]float64{90 / capacity, 80 / capacity}, []float64{r.IdlePendingSpan, r.IdleHeldSpan}, approx); d != "" {
		t.Errorf("idle while pending, held (-want +got):\n%s", d)
	}
	if d := gocmp.Diff([]float64{0, 0, 0, 80, 90}, r.Waits); d != "" {
		t.Errorf("waits (-want +got):\n%s", d)
	}
}

// TestFinishBeforeArrival: at equal times finishes are processed before
// arrivals, then the cycle runs, so a job submitted exactly when the GPU
// frees starts at once.
func TestFinishBeforeArrival(t *testing.T) {
	t.Parallel()
	trace := []TraceJob{tj("A", 0, 10, 1, "x"), tj("B", 10, 5, 1, "x"), tj("C", 10, 5, 1, "x")}
	r := run(t, Config{Nodes: 1, GPUsPerNode: 1, Policy: policy(scheduler.ModeFIFO)}, trace)
	if d := gocmp.Diff([]float64{0, 0, 5}, r.Waits); d != "" {
		t.Errorf("waits (-want +got):\n%s", d)
	}
	if r.MakespanS != 20 {
		t.Errorf("makespan = %v, want 20", r.MakespanS)
	}
}

// TestCycles counts Schedule calls: events only with --cycle 0; periodic
// ticks while jobs are pending for allot; baselines skip ticks (provably
// no-ops) and cycles with no free GPU.
func TestCycles(t *testing.T) {
	t.Parallel()
	trace := []TraceJob{tj("A", 0, 100, 1, "x"), tj("B", 5, 10, 1, "x")}
	for _, c := range []struct {
		mode  scheduler.Mode
		cycle time.Duration
		want  int
	}{
		{scheduler.ModeAllot, 0, 3},                 // t=0, 5, 100
		{scheduler.ModeAllot, 10 * time.Second, 12}, // + ticks 10..90 while B waits
		{scheduler.ModeEASY, 10 * time.Second, 2},   // t=0, 100 (t=5: no free GPU)
	} {
		r := run(t, Config{Nodes: 1, GPUsPerNode: 1, Policy: policy(c.mode), Cycle: c.cycle}, trace)
		if r.Cycles != c.want {
			t.Errorf("%s cycle %v: %d cycles, want %d", c.mode, c.cycle, r.Cycles, c.want)
		}
		if d := gocmp.Diff([]float64{0, 95}, r.Waits); d != "" {
			t.Errorf("%s cycle %v: waits (-want +got):\n%s", c.mode, c.cycle, d)
		}
	}
}

// preemptingSched is refSchedule's FIFO plus one rule: when job 2 is pending
// and nothing is terminating, preempt the running job 1. It records the
// pending jobs it saw and the PreemptedBy of the terminating jobs it saw.
type preemptingSched struct {
	seen   []scheduler.Job
	termBy []int64
}

func (p *preemptingSched) schedule(s scheduler.Snapshot, now time.Time, pol scheduler.Policy) scheduler.Plan {
	p.seen = append(p.seen, s.Pending...)
	for _, r := range s.Running {
		if r.Terminating {
			p.termBy = append(p.termBy, r.PreemptedBy)
		}
	}
	// While job 2 waits, nothing else may start.
	if i := slices.IndexFunc(s.Pending, func(j scheduler.Job) bool { return j.ID == 2 }); i >= 0 {
		s.Pending = s.Pending[i : i+1]
	}
	pol.Mode = scheduler.ModeFIFO
	plan := refSchedule(s, now, pol)
	started := map[int64]bool{}
	for _, st := range plan.Starts {
		started[st.JobID] = true
	}
	urgent := slices.ContainsFunc(s.Pending, func(j scheduler.Job) bool { return j.ID == 2 }) && !started[2]
	if urgent && !slices.ContainsFunc(s.Running, func(j scheduler.Job) bool { return j.Terminating }) {
		for _, r := range s.Running {
			if r.ID == 1 {
				plan.Preemptions = append(plan.Preemptions, scheduler.Preemption{JobID: 1, By: 2, Reason: "test"})
			}
		}
	}
	return plan
}

// TestPreemptionGraceAndRequeue: A (checkpointable, checkpoint every 100 s)
// runs from 0; B arrives at 250 and preempts it; A holds its GPU through the
// 120 s grace period, is requeued at 370 with its original submit time and
// the progress of its checkpoint at 300; the 70 s since are lost. B runs
// 370-470, A resumes with 700 s left and ends at 1170.
func TestPreemptionGraceAndRequeue(t *testing.T) {
	t.Parallel()
	ps := &preemptingSched{}
	trace := []TraceJob{tj("A", 0, 1000, 1, "x"), tj("B", 250, 100, 1, "y")}
	r := run(t, Config{
		Nodes: 1, GPUsPerNode: 1, Policy: policy(scheduler.ModeAllot),
		CheckpointFraction: 1, CheckpointInterval: 100 * time.Second, Schedule: ps.schedule,
		JobWaits: true,
	}, trace)
	want := metricView{
		Jobs: 2, MakespanS: 1170,
		Utilization: 1100.0 / 1170, OfferedLoad: 1100.0 / 1170,
		UtilizationSpan: 1, OfferedLoadSpan: 1,
		WaitMeanS: 60, WaitP50S: 60, WaitP95S: 114, JCTMean: (1170 + 220) / 2.0,
		BSLD: (1.17 + 2.2) / 2, Lost: 70, Preemptions: 1,
	}
	got := view(r)
	got.Jain = 0
	if d := gocmp.Diff(want, got, approx); d != "" {
		t.Errorf("metrics (-want +got):\n%s", d)
	}
	// A is pending at 0, at 370 (requeued) and at 470, always with its
	// original submit time.
	var requeued []time.Time
	for _, j := range ps.seen {
		if j.ID == 1 {
			requeued = append(requeued, j.Submit)
		}
	}
	if d := gocmp.Diff([]time.Time{Epoch, Epoch, Epoch}, requeued); d != "" {
		t.Errorf("A's submit times seen pending (-want +got):\n%s", d)
	}
	wantWaits := []JobWait{
		{ID: 1, Name: "A", Team: "x", Tier: r.JobWaits[0].Tier, GPUs: 1, SubmitS: 0, FirstStartS: 0, WaitS: 0, Preemptions: 1},
		{ID: 2, Name: "B", Team: "y", Tier: r.JobWaits[1].Tier, GPUs: 1, SubmitS: 250, FirstStartS: 370, WaitS: 120},
	}
	if d := gocmp.Diff(wantWaits, r.JobWaits, approx); d != "" {
		t.Errorf("job waits (-want +got):\n%s", d)
	}
}

// TestPreemptedBy: while A is in its grace period, every snapshot (here the
// periodic cycles) names its preemptor in Job.PreemptedBy, as the live loop
// does, so that the core holds the GPUs coming free for B.
func TestPreemptedBy(t *testing.T) {
	t.Parallel()
	ps := &preemptingSched{}
	trace := []TraceJob{tj("A", 0, 1000, 1, "x"), tj("B", 250, 100, 1, "y")}
	run(t, Config{Nodes: 1, GPUsPerNode: 1, Policy: policy(scheduler.ModeAllot), Cycle: 10 * time.Second, Schedule: ps.schedule}, trace)
	if len(ps.termBy) != 11 || slices.ContainsFunc(ps.termBy, func(by int64) bool { return by != 2 }) {
		t.Errorf("PreemptedBy of the terminating job in cycles 260..360: %v, want 11 × 2", ps.termBy)
	}
}

// TestPreemptionWithoutCheckpoint: a job that does not checkpoint loses
// everything since its start and reruns in full.
func TestPreemptionWithoutCheckpoint(t *testing.T) {
	t.Parallel()
	ps := &preemptingSched{}
	trace := []TraceJob{tj("A", 0, 1000, 1, "x"), tj("B", 250, 100, 1, "y")}
	r := run(t, Config{Nodes: 1, GPUsPerNode: 1, Policy: policy(scheduler.ModeAllot), Schedule: ps.schedule}, trace)
	if r.GPUSLostToPreemption != 370 || r.MakespanS != 1470 {
		t.Errorf("lost %v GPU-s, makespan %v; want 370 and 1470", r.GPUSLostToPreemption, r.MakespanS)
	}
}

// TestTimeLimitKill: with a walltime factor below 1 a job is killed at its
// time limit.
func TestTimeLimitKill(t *testing.T) {
	t.Parallel()
	r := run(t, Config{Nodes: 1, GPUsPerNode: 1, Policy: policy(scheduler.ModeFIFO), WalltimeFactor: 0.5},
		[]TraceJob{tj("A", 0, 100, 1, "x"), tj("B", 0, 100, 1, "x")})
	if r.MakespanS != 100 || r.TimeLimitKills != 2 {
		t.Errorf("makespan %v, kills %d; want 100, 2", r.MakespanS, r.TimeLimitKills)
	}
}

func TestDropped(t *testing.T) {
	t.Parallel()
	trace := []TraceJob{
		tj("big", 0, 10, 64, "a"),   // larger than the cluster (32 GPUs)
		tj("span", 0, 10, 24, "a"),  // 3 whole nodes; domains have 2
		tj("fits", 0, 10, 16, "a"),  // 2 whole nodes in one domain
		tj("nog", 0, 10, 1, "zzz"),  // team without a guarantee
		tj("over", 0, 10, 16, "b"),  // more than b's 8-GPU partition
		tj("small", 0, 10, 1, "b"),  // fine everywhere
		tj("alsook", 5, 10, 4, "a"), // fine everywhere
	}
	teams := []TeamSpec{{"a", 24}, {"b", 8}}
	for _, c := range []struct {
		mode scheduler.Mode
		want int
	}{
		{scheduler.ModeEASY, 2},
		{scheduler.ModeFIFOPartitioned, 4},
	} {
		r := run(t, Config{Nodes: 4, GPUsPerNode: 8, DomainNodes: 2, Teams: teams, Policy: policy(c.mode)}, trace)
		if r.Dropped != c.want || r.Jobs != len(trace) || len(r.Waits) != len(trace)-c.want {
			t.Errorf("%s: dropped %d of %d, %d ran; want %d dropped", c.mode, r.Dropped, r.Jobs, len(r.Waits), c.want)
		}
	}
}

// TestStuckJobsEnd: a scheduler that never starts anything cannot hang the
// replay; the jobs count as dropped.
func TestStuckJobsEnd(t *testing.T) {
	t.Parallel()
	never := func(scheduler.Snapshot, time.Time, scheduler.Policy) scheduler.Plan { return scheduler.Plan{} }
	r := run(t, Config{Nodes: 1, GPUsPerNode: 1, Policy: policy(scheduler.ModeAllot), Cycle: time.Second, Schedule: never},
		[]TraceJob{tj("A", 0, 10, 1, "x"), tj("B", 3, 10, 1, "x")})
	if r.Dropped != 2 || r.DroppedNeverStartable != 2 {
		t.Errorf("dropped %d (stuck %d), want 2", r.Dropped, r.DroppedNeverStartable)
	}
}

// TestBadPlans: the simulator rejects plans that double-book GPUs or start
// jobs that are not pending.
func TestBadPlans(t *testing.T) {
	t.Parallel()
	for name, plan := range map[string]scheduler.Plan{
		"double booked": {Starts: []scheduler.Start{
			{JobID: 1, Placement: []scheduler.Slot{{Node: 0, GPUs: []int{0}}}},
			{JobID: 2, Placement: []scheduler.Slot{{Node: 0, GPUs: []int{0}}}},
		}},
		"short gang":  {Starts: []scheduler.Start{{JobID: 1, Placement: nil}}},
		"unknown job": {Starts: []scheduler.Start{{JobID: 99}}},
		"bad node":    {Starts: []scheduler.Start{{JobID: 1, Placement: []scheduler.Slot{{Node: 7, GPUs: []int{0}}}}}},
		"not running": {Preemptions: []scheduler.Preemption{{JobID: 1}}},
	} {
		f := func(scheduler.Snapshot, time.Time, scheduler.Policy) scheduler.Plan { return plan }
		_, err := Run(Config{Nodes: 1, GPUsPerNode: 2, Policy: policy(scheduler.ModeAllot), Schedule: f},
			[]TraceJob{tj("A", 0, 10, 1, "x"), tj("B", 0, 10, 1, "x")})
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestWaterFill(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		capacity int
		demand   []int
		want     []float64
	}{
		{10, []int{2, 0, 20, 20}, []float64{2, 0, 4, 4}},
		{10, []int{1, 2, 3}, []float64{1, 2, 3}},
		{9, []int{10, 10, 10}, []float64{3, 3, 3}},
		{12, []int{1, 4, 100, 5}, []float64{1, 11.0 / 3, 11.0 / 3, 11.0 / 3}},
		{12, []int{1, 3, 100, 5}, []float64{1, 3, 4, 4}},
		{12, []int{0, 0}, []float64{0, 0}},
	} {
		got := make([]float64, len(c.demand))
		var buf []int
		waterFill(c.capacity, c.demand, got, &buf)
		if d := gocmp.Diff(c.want, got, approx); d != "" {
			t.Errorf("waterFill(%d, %v) (-want +got):\n%s", c.capacity, c.demand, d)
		}
	}
}

func TestPercentileAndJain(t *testing.T) {
	t.Parallel()
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	got := []float64{Percentile(xs, 0), Percentile(xs, 50), Percentile(xs, 95), Percentile(xs, 99), Percentile(xs, 100),
		Percentile([]float64{7}, 95), Percentile(nil, 50)}
	if d := gocmp.Diff([]float64{1, 5.5, 9.55, 9.91, 10, 7, 0}, got, approx); d != "" {
		t.Errorf("percentiles (-want +got):\n%s", d)
	}
	jain := []float64{Jain([]float64{1, 1, 1}), Jain([]float64{1, 0}), Jain([]float64{2, 1}), Jain(nil)}
	if d := gocmp.Diff([]float64{1, 0.5, 9.0 / 10, 1}, jain, approx); d != "" {
		t.Errorf("jain (-want +got):\n%s", d)
	}
}

func TestPrepareWindowAndScale(t *testing.T) {
	t.Parallel()
	all := []TraceJob{tj("a", 90, 5, 1, "x"), tj("b", 100, 5, 1, "x"), tj("c", 110, 7, 1, "y"),
		tj("d", 130, 5, 1, "x"), tj("e", 200, 5, 1, "x")}
	got := Prepare(all, Window{Start: sec(100), End: sec(200), Set: true}, "", 2)
	want := []TraceJob{tj("b", 0, 5, 1, "x"), tj("c", 5, 7, 1, "y"), tj("d", 15, 5, 1, "x")}
	if d := gocmp.Diff(want, got); d != "" {
		t.Errorf("window + scale (-want +got):\n%s", d)
	}
	got = Prepare(all, Window{}, "x", 1)
	if len(got) != 4 || got[0].Submit != sec(90) {
		t.Errorf("team filter: %+v", got)
	}
	if all[1].Submit != sec(100) {
		t.Error("Prepare modified its input")
	}
}

func TestTierMixDeterministic(t *testing.T) {
	t.Parallel()
	mix, err := ParseTierMix("1:1,2:4,3:45,4:50")
	if err != nil {
		t.Fatal(err)
	}
	count := map[scheduler.Tier]int{}
	differ := 0
	const n = 20000
	for i := range n {
		name := fmt.Sprintf("philly-%06d", i)
		a, b := TierOf(mix, 1, name), TierOf(mix, 1, name)
		if a != b {
			t.Fatalf("TierOf(%q) not deterministic: %d then %d", name, a, b)
		}
		if TierOf(mix, 2, name) != a {
			differ++
		}
		count[a]++
	}
	for tier, w := range map[scheduler.Tier]float64{1: 0.01, 2: 0.04, 3: 0.45, 4: 0.50} {
		got := float64(count[tier]) / n
		if math.Abs(got-w) > 0.01 {
			t.Errorf("tier %d: share %.3f, want %.2f ± 0.01", tier, got, w)
		}
	}
	if differ < n/4 {
		t.Errorf("another seed changed only %d of %d tiers", differ, n)
	}
	for _, bad := range []string{"", "1", "0:5", "6:1", "1:x", "1:0,2:0", "1:1,1:2"} {
		if _, err := ParseTierMix(bad); err == nil {
			t.Errorf("ParseTierMix(%q): no error", bad)
		}
	}
}

func TestReadTeams(t *testing.T) {
	t.Parallel()
	got, err := ReadTeams(strings.NewReader("cluster,nodes,gpus_per_node\nc1,2,8\nc2,1,4\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d := gocmp.Diff([]TeamSpec{{"c1", 16}, {"c2", 4}}, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

// TestCLI runs allot sim end to end on a tiny trace with the test-local
// scheduler: table on stdout, JSON with exactly the keys, an SVG.
func TestCLI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	jsonPath, plotPath := filepath.Join(dir, "out.json"), filepath.Join(dir, "out.svg")
	waitsPath := filepath.Join(dir, "waits.csv")
	var stdout, stderr bytes.Buffer
	code := main([]string{"--trace", "testdata/tiny.csv", "--teams", "testdata/teams.csv", "--domain-nodes", "0",
		"--json", jsonPath, "--plot", plotPath, "--waits", waitsPath}, &stdout, &stderr, refSchedule)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr not empty:\n%s", stderr.String())
	}
	for _, m := range []string{"| allot ", "| easy ", "| fifo ", "| fifo-partitioned ", "3 nodes × 8 GPUs = 24 GPUs", "start estimates:"} {
		if !strings.Contains(stdout.String(), m) {
			t.Errorf("stdout lacks %q:\n%s", m, stdout.String())
		}
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]map[string]json.RawMessage
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("bad JSON: %v\n%s", err, raw)
	}
	wantKeys := strings.Fields(`jobs dropped total_gpus makespan_s utilization offered_load utilization_span
		offered_load_span idle_pending_span idle_held_span wait_mean_s wait_p50_s wait_p95_s wait_p99_s jct_mean_s bounded_slowdown_mean
		preemptions gpu_s_lost_to_preemption jain_fairness by_tier by_team cycles cycle_mean_us cycle_p99_us sim_wall_s
		eta_at_submit eta_at_1h`)
	slices.Sort(wantKeys)
	if d := gocmp.Diff([]string{"allot", "easy", "fifo", "fifo-partitioned"}, sortedKeys(out)); d != "" {
		t.Errorf("policies (-want +got):\n%s", d)
	}
	for p, m := range out {
		if d := gocmp.Diff(wantKeys, sortedKeys(m)); d != "" {
			t.Errorf("%s keys (-want +got):\n%s", p, d)
		}
		var teams map[string]map[string]any
		if err := json.Unmarshal(m["by_team"], &teams); err != nil {
			t.Fatal(err)
		}
		for team, g := range teams {
			if d := gocmp.Diff([]string{"gpu_s", "jobs", "share_ratio", "wait_mean_s", "wait_p95_s"}, sortedKeys(g)); d != "" {
				t.Errorf("%s by_team %s keys (-want +got):\n%s", p, team, d)
			}
		}
	}
	// j6 (64 GPUs) is larger than the cluster; in fifo-partitioned also j5
	// (team c has no guarantee).
	var dropped map[string]int
	for p, m := range out {
		var n int
		json.Unmarshal(m["dropped"], &n)
		if dropped == nil {
			dropped = map[string]int{}
		}
		dropped[p] = n
	}
	if d := gocmp.Diff(map[string]int{"allot": 1, "easy": 1, "fifo": 1, "fifo-partitioned": 2}, dropped); d != "" {
		t.Errorf("dropped (-want +got):\n%s", d)
	}
	// --waits: a header and one row per job that ran and policy (5 + 5 + 5
	// + 4), in --policy then trace order.
	wb, err := os.ReadFile(waitsPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(wb)), "\n")
	if len(lines) != 1+19 || lines[0] != "policy,job_id,team,tier,gpus,submit_s,first_start_s,wait_s,preemptions" {
		t.Errorf("waits CSV: %d lines, header %q", len(lines), lines[0])
	}
	if f := strings.Split(lines[1], ","); len(f) != 9 || f[0] != "allot" || f[1] != "j1" || f[2] != "a" || f[4] != "8" || f[5] != "0" {
		t.Errorf("first waits row %q", lines[1])
	}
	svg, err := os.ReadFile(plotPath)
	if err != nil || !bytes.Contains(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("wait-time CDF")) {
		t.Errorf("plot: err %v, %d bytes", err, len(svg))
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestCLIBadInput(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{nil, "--trace is required"},
		{[]string{"--trace", "testdata/nope.csv", "--nodes", "2"}, "no such file"},
		{[]string{"--trace", "testdata/bad_header.csv", "--nodes", "2"}, `trace header "id,submit`},
		{[]string{"--trace", "testdata/bad_gpus.csv", "--nodes", "2"}, `trace line 3: gpus "zero"`},
		{[]string{"--trace", "testdata/bad_duration.csv", "--nodes", "2"}, "duration_s"},
		{[]string{"--trace", "testdata/short_row.csv", "--nodes", "2"}, "wrong number of fields"},
		{[]string{"--trace", "testdata/tiny.csv", "--teams", "testdata/bad_teams.csv"}, "gpus column"},
		{[]string{"--trace", "testdata/tiny.csv", "--teams", "testdata/nope.csv"}, "--teams"},
		{[]string{"--trace", "testdata/tiny.csv"}, "--nodes is required without --teams"},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "--policy", "fifo,lottery"}, `unknown policy "lottery"`},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "--window", "10:5"}, "--window"},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "--window", "1000:2000"}, "no jobs to replay"},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "--tier-mix", "1:1,7:2"}, "tier must be 1..5"},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "--time-scale", "0"}, "--time-scale"},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "--cycle", "soon"}, "bad flags"},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "--gpus-per-node", "128"}, "--gpus-per-node"},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "extra"}, "unexpected argument"},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "--walltime-factor", "5:2"}, "want A:B with 0 < A < B"},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "--walltime-factor", "-1"}, "want a number > 0"},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "--allot-size-exponent", "3"}, "--allot-size-exponent 3: want -2..2"},
		{[]string{"--trace", "testdata/tiny.csv", "--nodes", "2", "--allot-size-exponent", "NaN"}, "--allot-size-exponent NaN: want -2..2"},
	} {
		var stdout, stderr bytes.Buffer
		code := main(c.args, &stdout, &stderr, refSchedule)
		if code != 2 || !strings.Contains(stderr.String(), c.msg) || stdout.Len() != 0 {
			t.Errorf("allot sim %v: exit %d, stderr %q; want exit 2 and %q", c.args, code, stderr.String(), c.msg)
		}
	}
}

// randomTrace is a deterministic synthetic trace of n jobs with bursts, a
// mix of sizes and three teams.
func randomTrace(n int, seed uint64) []TraceJob {
	rng := rand.New(rand.NewPCG(seed, 1))
	sizes := []int{1, 1, 1, 1, 2, 4, 8, 16}
	teams := []string{"a", "b", "c"}
	var t float64
	out := make([]TraceJob, n)
	for i := range out {
		if rng.IntN(4) == 0 {
			t += float64(rng.IntN(300))
		}
		out[i] = tj(fmt.Sprintf("r%04d", i), t, float64(10+rng.IntN(2000)), sizes[rng.IntN(len(sizes))], teams[rng.IntN(3)])
	}
	return out
}

// TestSkippingChangesNothing: skipping provably idle baseline cycles gives
// exactly the replay of calling Schedule on every event.
func TestSkippingChangesNothing(t *testing.T) {
	t.Parallel()
	trace := randomTrace(600, 7)
	teams := []TeamSpec{{"a", 16}, {"b", 16}, {"c", 16}}
	for name, sched := range map[string]ScheduleFunc{"ref": refSchedule, "core": scheduler.Schedule} {
		for _, m := range []scheduler.Mode{scheduler.ModeFIFO, scheduler.ModeEASY, scheduler.ModeFIFOPartitioned} {
			cfg := Config{Nodes: 6, GPUsPerNode: 8, Teams: teams, Policy: policy(m), Cycle: 10 * time.Second, Schedule: sched}
			skipped := run(t, cfg, trace)
			cfg.EveryEvent = true
			every := run(t, cfg, trace)
			if skipped.Cycles >= every.Cycles {
				t.Errorf("%s %s: %d cycles with skipping, %d without", name, m, skipped.Cycles, every.Cycles)
			}
			ignore := cmpopts.IgnoreFields(Result{}, "Cycles", "CycleMeanUS", "CycleP99US", "SimWallS")
			if d := gocmp.Diff(every, skipped, ignore); d != "" {
				t.Errorf("%s %s: skipping changed the replay (-every +skipped):\n%s", name, m, d)
			}
		}
	}
}

// TestDeterministic: the same replay twice gives identical metrics, with
// the real core and preemption in play.
func TestDeterministic(t *testing.T) {
	t.Parallel()
	trace := randomTrace(400, 3)
	teams := []TeamSpec{{"a", 8}, {"b", 16}, {"c", 24}}
	cfg := Config{Nodes: 6, GPUsPerNode: 8, DomainNodes: 2, Teams: teams, Policy: policy(scheduler.ModeAllot),
		Cycle: 10 * time.Second, WalltimeFactor: 2, CheckpointFraction: 0.5, Schedule: scheduler.Schedule}
	a, b := run(t, cfg, trace), run(t, cfg, trace)
	ignore := cmpopts.IgnoreFields(Result{}, "CycleMeanUS", "CycleP99US", "SimWallS")
	if d := gocmp.Diff(a, b, ignore); d != "" {
		t.Errorf("two replays differ (-first +second):\n%s", d)
	}
	if a.Preemptions == 0 {
		t.Error("no preemption in this replay; the test should exercise one")
	}
}

// TestLivelockIsAnError: a scheduler that preempts the same job on every
// cycle fails the replay instead of running forever.
func TestLivelockIsAnError(t *testing.T) {
	t.Parallel()
	thrash := func(s scheduler.Snapshot, now time.Time, p scheduler.Policy) scheduler.Plan {
		p.Mode = scheduler.ModeFIFO
		plan := refSchedule(s, now, p)
		for _, r := range s.Running {
			if !r.Terminating {
				plan.Preemptions = append(plan.Preemptions, scheduler.Preemption{JobID: r.ID, Reason: "thrash"})
			}
		}
		return plan
	}
	_, err := Run(Config{Nodes: 1, GPUsPerNode: 1, Policy: policy(scheduler.ModeAllot), Schedule: thrash, MaxPreemptions: 5,
		Cycle: 10 * time.Second}, []TraceJob{tj("A", 0, 1000, 1, "x"), tj("B", 0, 1000, 1, "x")})
	if err == nil || !strings.Contains(err.Error(), "livelock") {
		t.Errorf("err = %v, want a livelock error", err)
	}
}

// TestETA: measuring start estimates changes no scheduling decision; the
// forecast covers every job and beats the old page's estimate in the tail.
func TestETA(t *testing.T) {
	t.Parallel()
	trace := randomTrace(600, 11)
	teams := []TeamSpec{{"a", 16}, {"b", 16}, {"c", 16}}
	for _, m := range []scheduler.Mode{scheduler.ModeAllot, scheduler.ModeFIFO, scheduler.ModeEASY} {
		for _, spread := range []float64{0, 5} {
			cfg := Config{Nodes: 6, GPUsPerNode: 8, DomainNodes: 3, Teams: teams, Policy: policy(m), Cycle: 10 * time.Second,
				WalltimeFactor: 1.5, WalltimeFactorMax: spread, Schedule: scheduler.Schedule}
			off := run(t, cfg, trace)
			cfg.ETA = true
			on := run(t, cfg, trace)
			ignore := cmpopts.IgnoreFields(Result{}, "CycleMeanUS", "CycleP99US", "SimWallS", "ETAAtSubmit", "ETAAt1h")
			if d := gocmp.Diff(off, on, ignore); d != "" {
				t.Errorf("%s spread %v: measuring ETA changed the replay (-off +on):\n%s", m, spread, d)
			}
			a := on.ETAAtSubmit
			if a == nil || on.ETAAt1h == nil || a.Jobs == 0 {
				t.Fatalf("%s spread %v: no ETA stats: %+v", m, spread, a)
			}
			if a.Jobs+a.AtOnce != on.Jobs-on.Dropped {
				t.Errorf("%s spread %v: %d pending + %d at once, want the %d jobs that ran", m, spread, a.Jobs, a.AtOnce, on.Jobs-on.Dropped)
			}
			if a.Forecast.WithEstimate != 1 {
				t.Errorf("%s spread %v: forecast for %.2f of the jobs, want all", m, spread, a.Forecast.WithEstimate)
			}
			// The old page's estimate ignores the queue: far too early
			// in the tail (and, for FIFO, almost always).
			if a.Forecast.P90S > a.Naive.P90S || m == scheduler.ModeFIFO && a.Forecast.MedianS > a.Naive.MedianS {
				t.Errorf("%s spread %v: forecast error %.0f / %.0f s (median / p90) against naive %.0f / %.0f s", m, spread,
					a.Forecast.MedianS, a.Forecast.P90S, a.Naive.MedianS, a.Naive.P90S)
			}
		}
	}
}
