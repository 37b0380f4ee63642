package sim

import (
	"strconv"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/burst"
	"github.com/allotlabs/allot/internal/scheduler"
)

// BurstConfig models cloud burst in a replay (allot sim --burst) with the
// live worker's rule, burst.Decide: every Interval of virtual time the
// pending work burst nodes could take is measured; a request brings its
// nodes up Delay later (site cloud, GPU type Shape.GPUType, Domain ""); an
// idle burst node released goes down at once. Burst nodes are priced from
// the moment they come up to their release (or the end of the replay) at
// Shape.Rate per GPU-hour, exactly. Utilization and the fair-share
// baselines stay relative to the on-premise GPUs.
type BurstConfig struct {
	Shape      burst.Shape
	Thresholds burst.Thresholds
	Horizon    time.Duration // 0 = burst.DefaultHorizon
	Delay      time.Duration // provisioning delay
	Interval   time.Duration // evaluation period, default 1 min
}

// BurstResult is what burst did in one replay.
type BurstResult struct {
	Requests int     `json:"requests"`
	Nodes    int     `json:"nodes_provisioned"`
	Releases int     `json:"releases"`
	MaxAlive int     `json:"max_alive"`
	GPUHours float64 `json:"gpu_hours"`
	Cost     string  `json:"cost"`
	// Against the same replay without burst (allot sim --burst):
	WaitMeanSavedS float64 `json:"wait_mean_saved_s"`
	WaitP95SavedS  float64 `json:"wait_p95_saved_s"`
	WaitP99SavedS  float64 `json:"wait_p99_saved_s"`
	JobHoursSaved  float64 `json:"job_hours_of_wait_saved"`
	costMoney      allot.Money
}

type burstNode struct {
	idx      int // into state.nodes
	up, down time.Duration
	alive    bool
}

type burstRequest struct {
	at    time.Duration // when the nodes come up
	count int
}

type burstState struct {
	cfg      BurstConfig
	nodes    []burstNode
	inflight []burstRequest // by at
	alive    int
	res      BurstResult
	jobs     []burst.Job // buffer
}

func newBurstState(cfg BurstConfig) *burstState {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Minute
	}
	return &burstState{cfg: cfg}
}

func (b *burstState) inFlight() int {
	n := 0
	for _, r := range b.inflight {
		n += r.count
	}
	return n
}

// next is the next time burst has something to do, given whether the
// replay has anything else left (events, arrivals, running jobs).
func (b *burstState) next(now time.Duration, pending int, busy bool) time.Duration {
	t := time.Duration(1<<63 - 1)
	if len(b.inflight) > 0 {
		t = b.inflight[0].at
	}
	if (pending > 0 || b.alive > 0) && (busy || len(b.inflight) > 0) {
		iv := b.cfg.Interval
		t = min(t, (now/iv+1)*iv)
	}
	return t
}

// step brings up the nodes due at s.now and, on an evaluation tick,
// applies the rule. It reports whether nodes came up.
func (s *state) burstStep() bool {
	b := s.burst
	came := false
	for len(b.inflight) > 0 && b.inflight[0].at <= s.now {
		r := b.inflight[0]
		b.inflight = b.inflight[1:]
		for range r.count {
			n := scheduler.Node{Name: "burst-" + strconv.Itoa(len(b.nodes)), GPUType: b.cfg.Shape.GPUType, GPUs: b.cfg.Shape.GPUs,
				Site: scheduler.SiteCloud, State: scheduler.NodeUp}
			b.nodes = append(b.nodes, burstNode{idx: len(s.nodes), up: s.now, alive: true})
			s.nodes = append(s.nodes, n)
			s.nodesChanged = true
			s.used = append(s.used, 0)
			s.nodeUsed = append(s.nodeUsed, 0)
			s.free += n.GPUs
			b.alive++
			b.res.Nodes++
			came = true
		}
		b.res.MaxAlive = max(b.res.MaxAlive, b.alive)
	}
	if s.now%b.cfg.Interval != 0 {
		return came
	}
	now := Epoch.Add(s.now)
	b.jobs = b.jobs[:0]
	for i := range s.pending {
		p := &s.pending[i]
		b.jobs = append(b.jobs, burst.Job{GPUs: p.GPUs, GPUType: p.GPUType, GPUsPerNode: p.GPUsPerNode, TimeLimit: p.TimeLimit, Submit: p.Submit,
			Production: p.Tier.Production()})
	}
	in := burst.Input{Queue: burst.Measure(b.jobs, b.cfg.Shape, b.cfg.Thresholds.MaxNodes, now), Thresholds: b.cfg.Thresholds,
		Shape: b.cfg.Shape, Horizon: b.cfg.Horizon, InFlight: b.inFlight()}
	if budget := b.cfg.Thresholds.MonthlyBudget.Micros; budget > 0 {
		in.MonthSpent = s.burstCost(s.now) // the whole replay counts as one month
	}
	byName := map[string]int{}
	for k, n := range b.nodes {
		if n.alive {
			name := s.nodes[n.idx].Name
			byName[name] = k
			in.Nodes = append(in.Nodes, burst.Node{Name: name, Registered: true, Idle: s.nodeUsed[n.idx] == 0})
		}
	}
	d := burst.Decide(in)
	switch d.Action {
	case burst.ActRequest:
		b.res.Requests++
		b.inflight = append(b.inflight, burstRequest{at: s.now + b.cfg.Delay, count: d.Count})
	case burst.ActRelease:
		b.res.Releases++
		for _, name := range d.Release {
			k := byName[name]
			n := &b.nodes[k]
			n.alive, n.down = false, s.now
			s.nodes[n.idx].State = scheduler.NodeDown
			s.nodesChanged = true
			s.free -= s.nodes[n.idx].GPUs
			b.alive--
		}
	}
	return came
}

// burstCost is the exact cost of burst node time up to t.
func (s *state) burstCost(t time.Duration) allot.Money {
	b := s.burst
	total := allot.Money{Currency: b.cfg.Shape.Rate.Currency}
	for _, n := range b.nodes {
		end := t
		if !n.alive {
			end = n.down
		}
		if end <= n.up {
			continue
		}
		c, err := burst.Cost(s.nodes[n.idx].GPUs, end-n.up, b.cfg.Shape.Rate)
		if err == nil {
			total.Micros += c.Micros
			total.Currency = c.Currency
		}
	}
	return total
}

// burstFinish releases what is still alive at the end and fills the result.
func (s *state) burstFinish() *BurstResult {
	b := s.burst
	var gpuSec int64
	for k := range b.nodes {
		n := &b.nodes[k]
		if n.alive {
			n.alive, n.down = false, s.now
			b.alive--
		}
		gpuSec += int64(s.nodes[n.idx].GPUs) * int64((n.down-n.up)/time.Second)
	}
	b.res.GPUHours = float64(gpuSec) / 3600
	b.res.costMoney = s.burstCost(s.now)
	b.res.Cost = b.res.costMoney.String()
	r := b.res
	return &r
}
