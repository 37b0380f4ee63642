package burst

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

var (
	now   = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	spot  = Shape{GPUType: "A100-spot", GPUs: 8, Rate: allot.Money{Micros: 1_250_000, Currency: "USD"}}
	defTh = FromPolicy(allot.DefaultPolicy()) // 50 / 2 h / 20, 4 nodes, no budget
)

// queue is pending work of gpuHours, all of it waiting wait.
func queue(gpuHours float64, wait time.Duration) Queue {
	return Queue{Jobs: 1, GPUSeconds: int64(math.Round(gpuHours * 3600)), MeanWait: wait}
}

func TestMeasure(t *testing.T) {
	t.Parallel()
	jobs := []Job{
		{GPUs: 8, TimeLimit: 4 * time.Hour, Submit: now.Add(-3 * time.Hour)},                        // 32 GPU-h, eligible
		{GPUs: 2, GPUType: "A100-spot", TimeLimit: 2 * time.Hour, Submit: now.Add(-1 * time.Hour)},  // 4 GPU-h, eligible
		{GPUs: 8, TimeLimit: 10 * time.Hour, Submit: now.Add(-9 * time.Hour), Production: true},     // tier 1-2: never
		{GPUs: 8, GPUType: "A100-80GB", TimeLimit: 10 * time.Hour, Submit: now.Add(-9 * time.Hour)}, // other type
		{GPUs: 64, TimeLimit: time.Hour, Submit: now.Add(-9 * time.Hour)},                           // more than 4 nodes
		{GPUs: 16, GPUsPerNode: 16, TimeLimit: time.Hour, Submit: now.Add(-9 * time.Hour)},          // 16 per node > 8
		{GPUs: 16, GPUsPerNode: 8, TimeLimit: 30 * time.Minute, Submit: now.Add(-5 * time.Hour)},    // 8 GPU-h, eligible
		{GPUs: 1, TimeLimit: time.Hour, Submit: now.Add(time.Minute)},                               // clock skew: wait 0
	}
	q := Measure(jobs, spot, 4, now)
	if q.Jobs != 4 || q.GPUSeconds != (32+4+8+1)*3600 {
		t.Fatalf("Measure = %+v, want 4 jobs and 45 GPU-h", q)
	}
	if want := (3*time.Hour + time.Hour + 5*time.Hour) / 4; q.MeanWait != want {
		t.Fatalf("mean wait %s, want %s", q.MeanWait, want)
	}
	if q := Measure(nil, spot, 4, now); q != (Queue{}) {
		t.Fatalf("empty queue measured %+v", q)
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	budget := defTh
	budget.MonthlyBudget = allot.Money{Micros: 100_000_000, Currency: "USD"} // 100 USD; a node for 4 h costs 8×4×1.25 = 40 USD
	idle := func(names ...string) []Node {
		var out []Node
		for _, n := range names {
			out = append(out, Node{Name: n, Registered: true, Idle: true})
		}
		return out
	}
	busy := func(names ...string) []Node {
		var out []Node
		for _, n := range names {
			out = append(out, Node{Name: n, Registered: true})
		}
		return out
	}
	cases := []struct {
		name     string
		in       Input
		action   Action
		count    int
		released []string
	}{
		{name: "deep and old queue: enough nodes for the work within the horizon",
			in: Input{Queue: queue(60, 3*time.Hour)}, action: ActRequest, count: 2}, // ceil(60 / 32)
		{name: "exactly at the threshold is not above it",
			in: Input{Queue: queue(50, 3*time.Hour)}, action: ActNone},
		{name: "deep queue but short wait",
			in: Input{Queue: queue(200, 2*time.Hour)}, action: ActNone},
		{name: "capped by the maximum",
			in: Input{Queue: queue(500, 3*time.Hour)}, action: ActRequest, count: 4},
		{name: "maximum minus alive nodes",
			in: Input{Queue: queue(500, 3*time.Hour), Nodes: busy("b1", "b2", "b3")}, action: ActRequest, count: 1},
		{name: "at the maximum",
			in: Input{Queue: queue(500, 3*time.Hour), Nodes: busy("b1", "b2", "b3", "b4")}, action: ActNone},
		{name: "requests in flight count as capacity",
			in: Input{Queue: queue(60, 3*time.Hour), InFlight: 2}, action: ActNone},
		{name: "in flight covers part",
			in: Input{Queue: queue(90, 3*time.Hour), InFlight: 1}, action: ActRequest, count: 2}, // ceil(90/32)=3
		{name: "unregistered nodes count as capacity",
			in: Input{Queue: queue(60, 3*time.Hour), Nodes: []Node{{Name: "b1"}, {Name: "b2"}}}, action: ActNone},
		{name: "idle nodes count as capacity, busy ones do not",
			in: Input{Queue: queue(60, 3*time.Hour), Nodes: append(idle("b1"), busy("b2")...)}, action: ActRequest, count: 1},
		{name: "in flight counts against the maximum",
			in: Input{Queue: queue(500, 3*time.Hour), InFlight: 3}, action: ActRequest, count: 1},
		{name: "budget caps the count",
			in: Input{Queue: queue(500, 3*time.Hour), Thresholds: budget}, action: ActRequest, count: 2}, // 100/40
		{name: "budget partly spent",
			in: Input{Queue: queue(500, 3*time.Hour), Thresholds: budget, MonthSpent: allot.Money{Micros: 60_000_001, Currency: "USD"}}, action: ActNone},
		{name: "budget spent: idle nodes go",
			in: Input{Queue: queue(500, 3*time.Hour), Thresholds: budget, MonthSpent: allot.Money{Micros: 100_000_000, Currency: "USD"},
				Nodes: append(idle("b1"), busy("b2")...)}, action: ActRelease, released: []string{"b1"}},
		{name: "short queue releases idle nodes only",
			in:     Input{Queue: queue(19.9, 5*time.Hour), Nodes: append(append(idle("b1"), busy("b2")...), Node{Name: "b3"}, Node{Name: "b4", Registered: true, Idle: true})},
			action: ActRelease, released: []string{"b1", "b4"}},
		{name: "short queue, nothing idle",
			in: Input{Queue: queue(0, 0), Nodes: busy("b1")}, action: ActNone},
		{name: "more nodes than the maximum (burst turned off): idle ones go",
			in: Input{Queue: queue(500, 3*time.Hour), Thresholds: Thresholds{PendingGPUHours: 50, MeanWait: 2 * time.Hour, ReleaseGPUHours: 20, MaxNodes: 1},
				Nodes: append(idle("b1", "b2"), busy("b3")...)}, action: ActRelease, released: []string{"b1", "b2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.in
			if in.Thresholds == (Thresholds{}) {
				in.Thresholds = defTh
			}
			in.Shape = spot
			d := Decide(in)
			if d.Action != c.action || d.Count != c.count || !slices.Equal(d.Release, c.released) {
				t.Fatalf("Decide = %+v, want %s count %d release %v", d, c.action, c.count, c.released)
			}
			if d.Reason == "" {
				t.Fatal("decision without a reason")
			}
		})
	}
}

// TestHysteresis: a queue oscillating between 25 and 45 GPU-hours (between
// the release and burst thresholds), with any wait, neither requests nor
// releases nodes, minute after minute, whether burst nodes are alive (idle
// or busy) or not.
func TestHysteresis(t *testing.T) {
	t.Parallel()
	starts := map[string][]Node{
		"no burst nodes":   nil,
		"idle burst nodes": {{Name: "b1", Registered: true, Idle: true}, {Name: "b2", Registered: true, Idle: true}},
		"busy burst nodes": {{Name: "b1", Registered: true}, {Name: "b2", Registered: true, Idle: true}},
	}
	for name, nodes := range starts {
		t.Run(name, func(t *testing.T) {
			for minute := range 24 * 60 {
				// A triangle wave 25 → 45 → 25 with a 40-minute period, and
				// waits far above the threshold.
				x := minute % 40
				if x > 20 {
					x = 40 - x
				}
				gpuH := 25 + float64(x)
				d := Decide(Input{Queue: queue(gpuH, 10*time.Hour), Thresholds: defTh, Shape: spot, Nodes: nodes})
				if d.Action != ActNone {
					t.Fatalf("minute %d, pending %.0f GPU-h: %+v, want no action", minute, gpuH, d)
				}
			}
		})
	}
	// The same queue crossing the thresholds does act, so the test can fail.
	if d := Decide(Input{Queue: queue(51, 10*time.Hour), Thresholds: defTh, Shape: spot}); d.Action != ActRequest {
		t.Fatalf("51 GPU-h: %+v, want a request", d)
	}
	if d := Decide(Input{Queue: queue(19, 10*time.Hour), Thresholds: defTh, Shape: spot, Nodes: starts["idle burst nodes"]}); d.Action != ActRelease {
		t.Fatalf("19 GPU-h: %+v, want a release", d)
	}
}

func TestCost(t *testing.T) {
	t.Parallel()
	// 8 GPUs × 1 h 0 min 1 s at 1.25 USD/GPU-h = 10.002777… → 10.00 USD.
	c, err := Cost(8, time.Hour+time.Second, spot.Rate)
	if err != nil || c.Micros != 10_000_000 {
		t.Fatalf("Cost = %v, %v", c, err)
	}
	// 1 GPU × 1,800 s at 0.01 USD/GPU-h = 0.005 → rounds half up to 0.01.
	c, _ = Cost(1, 30*time.Minute, allot.Money{Micros: 10_000, Currency: "USD"})
	if c.Micros != 10_000 {
		t.Fatalf("half-up rounding: %v", c)
	}
}

// TestDecideUnusableNodes: a burst node that is down (spot reclaim) or
// drained is not capacity coming or idle, and a down one does not count
// toward the maximum; nodes being released count toward the maximum only.
func TestDecideUnusableNodes(t *testing.T) {
	t.Parallel()
	q := queue(64, 3*time.Hour) // wants ceil(64 / 32) = 2 nodes
	down := Node{Name: "b-down", Registered: true, Idle: true, Down: true}
	drained := Node{Name: "b-drained", Registered: true, Idle: true, Drained: true}
	up := Node{Name: "b-up", Registered: true, Idle: true}

	d := Decide(Input{Queue: q, Thresholds: defTh, Shape: spot, Nodes: []Node{down, drained}})
	if d.Action != ActRequest || d.Count != 2 {
		t.Fatalf("down and drained nodes counted as capacity: %+v", d)
	}
	d = Decide(Input{Queue: q, Thresholds: defTh, Shape: spot, Nodes: []Node{down, up}})
	if d.Action != ActRequest || d.Count != 1 {
		t.Fatalf("one idle up node of 2 wanted: %+v, want a request for 1", d)
	}
	// Max 2: a down node does not take the room of a new one.
	max2 := defTh
	max2.MaxNodes = 2
	d = Decide(Input{Queue: q, Thresholds: max2, Shape: spot, Nodes: []Node{down, down}})
	if d.Action != ActRequest || d.Count != 2 {
		t.Fatalf("down nodes counted toward the maximum: %+v", d)
	}
	// …but nodes being released do (billed until the provider confirms).
	d = Decide(Input{Queue: q, Thresholds: max2, Shape: spot, Releasing: 1})
	if d.Action != ActRequest || d.Count != 1 {
		t.Fatalf("with 1 node being released and a maximum of 2: %+v, want 1", d)
	}
	// A down node is never in a release decision (the worker releases it
	// as lost); a drained idle one is released below the threshold.
	d = Decide(Input{Queue: queue(1, time.Hour), Thresholds: defTh, Shape: spot, Nodes: []Node{down, drained}})
	if d.Action != ActRelease || !slices.Equal(d.Release, []string{"b-drained"}) {
		t.Fatalf("release: %+v, want only b-drained", d)
	}
	// Over the maximum counts the live nodes only.
	max1 := defTh
	max1.MaxNodes = 1
	d = Decide(Input{Queue: q, Thresholds: max1, Shape: spot, Nodes: []Node{up}, Releasing: 1})
	if d.Action == ActRelease {
		t.Fatalf("released %v although the node over the maximum is already being released", d.Release)
	}
}
