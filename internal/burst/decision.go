// Package burst grows the cluster with cloud nodes when the queue is deep
// and shrinks it when the queue is short: the pure decision (Decide, shared
// by the live worker in package jobs and by the simulator), the exact cost
// of burst node time, and the providers that create and remove the nodes
// (ExecProvider runs an admin's command; LocalProvider starts in-process
// agents with fake GPUs for the demo and the tests).
//
// # The rule
//
// Every minute the worker measures the pending work that burst nodes could
// take (Measure): jobs of non-production tiers (not 1–2) whose GPU type is
// the burst node type or unconstrained, and whose gang fits on the burst
// nodes allowed (GPUs ≤ BurstMaxNodes × GPUs per node; GPUs per node, when
// set, ≤ the node's GPUs). Pending work P = Σ GPUs × time limit of those
// jobs; W = their mean wait (now − submit time). With the policy's
// thresholds:
//
//   - P > BurstPendingGPUHours and W > BurstMeanWait → request nodes;
//   - P < BurstReleaseGPUHours → release every idle, registered burst node;
//   - otherwise nothing (hysteresis: between the two thresholds nodes are
//     neither requested nor released, so a queue that oscillates there
//     does not make nodes flap).
//
// How many: enough for the pending work within the planning horizon H
// (Input.Horizon, default 4 h):
//
//	want = ceil(P / (GPUs per node × H))
//	n    = want − capacity already coming
//
// where the capacity already coming is every node requested but not yet
// returned by the provider (in flight), every node the provider returned
// that has not registered yet, and every registered burst node that is up
// and idle (each of those will take pending work within a cycle, so the
// next minute does not ask again). A node that is down (spot reclaim, no
// heartbeat: the worker releases it as lost) or drained by an admin or a
// health check takes no work and is not capacity. n is then capped by
// BurstMaxNodes − nodes alive (not down), being released (billed until
// the provider confirms) or in flight, and by the month's remaining burst
// budget: each new node is
// counted at the cost of one horizon, GPUs × H at the burst rate, and
// n ≤ floor((BurstMonthlyBudget − spent this month) / that cost). A budget
// of 0 means no cap. Busy nodes are never released. When the month's budget
// is spent, or more nodes are alive than BurstMaxNodes (an admin lowered
// it; 0 turns burst off), idle nodes are released whatever the queue.
package burst

import (
	"fmt"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
)

// DefaultHorizon is the planning horizon of Decide when Input.Horizon is 0.
const DefaultHorizon = 4 * time.Hour

// Shape is what one burst node is.
type Shape struct {
	GPUType string
	GPUs    int
	// Rate is the price of one GPU-hour on a burst node (the spot price in
	// the rate card).
	Rate allot.Money
}

// Job is one pending job as burst sees it.
type Job struct {
	GPUs        int
	GPUType     string // "" = any type
	GPUsPerNode int    // 0 = scheduler decides
	TimeLimit   time.Duration
	Submit      time.Time
	Production  bool // tier 1 or 2: never runs on burst nodes
}

// Eligible reports whether j could run on burst nodes of shape s when at
// most maxNodes of them exist.
func Eligible(j Job, s Shape, maxNodes int) bool {
	if j.Production || j.GPUs <= 0 || s.GPUs <= 0 {
		return false
	}
	if j.GPUType != "" && j.GPUType != s.GPUType {
		return false
	}
	if j.GPUsPerNode > s.GPUs {
		return false
	}
	return j.GPUs <= maxNodes*s.GPUs
}

// Queue is the pending work burst nodes could take.
type Queue struct {
	Jobs       int
	GPUSeconds int64
	MeanWait   time.Duration
}

// GPUHours is the pending work in GPU-hours.
func (q Queue) GPUHours() float64 { return float64(q.GPUSeconds) / 3600 }

// Measure sums the eligible jobs' GPUs × time limit and their mean wait at
// now.
func Measure(jobs []Job, s Shape, maxNodes int, now time.Time) Queue {
	var q Queue
	var wait time.Duration
	for _, j := range jobs {
		if !Eligible(j, s, maxNodes) {
			continue
		}
		q.Jobs++
		q.GPUSeconds += int64(j.GPUs) * int64(j.TimeLimit/time.Second)
		if w := now.Sub(j.Submit); w > 0 {
			wait += w
		}
	}
	if q.Jobs > 0 {
		q.MeanWait = wait / time.Duration(q.Jobs)
	}
	return q
}

// Thresholds are the policy's burst settings.
type Thresholds struct {
	PendingGPUHours int           // request above this pending work…
	MeanWait        time.Duration // …when the mean wait is also above this
	ReleaseGPUHours int           // release idle nodes below this
	MaxNodes        int           // burst nodes alive at once (0 = burst off)
	MonthlyBudget   allot.Money   // 0 = no cap
}

// FromPolicy takes the burst settings of p.
func FromPolicy(p allot.Policy) Thresholds {
	return Thresholds{PendingGPUHours: p.BurstPendingGPUHours, MeanWait: p.BurstMeanWait, ReleaseGPUHours: p.BurstReleaseGPUHours,
		MaxNodes: p.BurstMaxNodes, MonthlyBudget: p.BurstMonthlyBudget}
}

// Node is one burst node not yet released (nor being released).
type Node struct {
	Name       string
	Registered bool // its agent has registered
	Idle       bool // registered and holds no job
	// Down: registered, then lost (spot reclaim, no heartbeat). It takes
	// no work, is neither capacity nor counted toward MaxNodes; the worker
	// releases it as failed.
	Down bool
	// Drained: draining or drained (admin, health check). It takes no new
	// work, so it is not capacity; it still counts toward MaxNodes and is
	// released when idle like any other.
	Drained bool
}

// usable reports whether n takes (or will take, once registered) work.
func (n Node) usable() bool { return !n.Down && !n.Drained }

// Input is everything Decide looks at.
type Input struct {
	Queue      Queue
	Thresholds Thresholds
	Shape      Shape
	Horizon    time.Duration // 0 = DefaultHorizon
	Nodes      []Node        // burst nodes alive (provisioned, release not started)
	// InFlight is how many nodes were requested from the provider and not
	// yet returned by it (or refused for good).
	InFlight int
	// Releasing is how many nodes are being released: they take no work
	// but count toward MaxNodes until the provider confirms.
	Releasing int
	// MonthSpent is the cost of burst node time this month so far.
	MonthSpent allot.Money
}

// Action is what Decide tells the caller to do.
type Action string

const (
	ActNone    Action = "none"
	ActRequest Action = "request"
	ActRelease Action = "release"
)

// Decision is Decide's answer.
type Decision struct {
	Action  Action
	Count   int      // nodes to request (Request)
	Release []string // idle nodes to release (Release), by name order of Input.Nodes
	Reason  string   // why, for people
}

func idleNodes(nodes []Node, limit int) []string {
	var out []string
	for _, n := range nodes {
		if n.Registered && n.Idle && !n.Down && len(out) < limit {
			out = append(out, n.Name)
		}
	}
	return out
}

// Decide applies the burst rule (package doc) to in.
func Decide(in Input) Decision {
	t := in.Thresholds
	h := in.Horizon
	if h <= 0 {
		h = DefaultHorizon
	}
	q := in.Queue
	p := float64(q.GPUSeconds) / 3600
	live := 0 // alive and not down; those being released go anyway
	for _, n := range in.Nodes {
		if !n.Down {
			live++
		}
	}
	alive := live + in.Releasing
	where := fmt.Sprintf("pending %.1f GPU-h, mean wait %s", p, q.MeanWait.Round(time.Second))
	if live > t.MaxNodes {
		if rel := idleNodes(in.Nodes, live-t.MaxNodes); len(rel) > 0 {
			return Decision{Action: ActRelease, Release: rel,
				Reason: fmt.Sprintf("%d burst nodes alive, more than the maximum of %d; releasing idle ones (%s)", live, t.MaxNodes, where)}
		}
	}
	budget := t.MonthlyBudget.Micros
	cur := in.Shape.Rate.Currency
	if cur == "" {
		cur = "USD"
	}
	money := func(m int64) allot.Money { return allot.Money{Micros: m, Currency: cur} }
	if budget > 0 && in.MonthSpent.Micros >= budget {
		if rel := idleNodes(in.Nodes, alive); len(rel) > 0 {
			return Decision{Action: ActRelease, Release: rel,
				Reason: fmt.Sprintf("this month's burst budget of %s is spent (%s); releasing idle nodes (%s)", money(budget), money(in.MonthSpent.Micros), where)}
		}
	}
	if q.GPUSeconds < int64(t.ReleaseGPUHours)*3600 {
		rel := idleNodes(in.Nodes, alive)
		if len(rel) == 0 {
			return Decision{Action: ActNone, Reason: fmt.Sprintf("%s: below the release threshold of %d GPU-h; no idle burst node to release", where, t.ReleaseGPUHours)}
		}
		return Decision{Action: ActRelease, Release: rel,
			Reason: fmt.Sprintf("%s: below the release threshold of %d GPU-h; releasing %d idle burst node(s)", where, t.ReleaseGPUHours, len(rel))}
	}
	if q.GPUSeconds <= int64(t.PendingGPUHours)*3600 || q.MeanWait <= t.MeanWait {
		return Decision{Action: ActNone, Reason: fmt.Sprintf("%s: burst needs more than %d GPU-h and a mean wait over %s; release below %d GPU-h",
			where, t.PendingGPUHours, t.MeanWait, t.ReleaseGPUHours)}
	}
	if in.Shape.GPUs <= 0 {
		return Decision{Action: ActNone, Reason: where + ": no burst node shape configured"}
	}
	perNode := int64(in.Shape.GPUs) * int64(h/time.Second)
	want := int((q.GPUSeconds + perNode - 1) / perNode)
	coming := in.InFlight
	for _, n := range in.Nodes {
		if n.usable() && (!n.Registered || n.Idle) {
			coming++
		}
	}
	n := want - coming
	if n <= 0 {
		return Decision{Action: ActNone, Reason: fmt.Sprintf("%s: needs %d node(s) for %s; %d already coming or idle", where, want, h, coming)}
	}
	why := fmt.Sprintf("%s: above %d GPU-h and %s; %d node(s) of %d GPUs cover it within %s, %d already coming or idle",
		where, t.PendingGPUHours, t.MeanWait, want, in.Shape.GPUs, h, coming)
	if room := t.MaxNodes - alive - in.InFlight; n > room {
		n = max(room, 0)
		why += fmt.Sprintf("; capped by the maximum of %d burst nodes", t.MaxNodes)
	}
	if budget > 0 && n > 0 {
		nodeCost, err := Cost(in.Shape.GPUs, h, in.Shape.Rate)
		if err == nil && nodeCost.Micros > 0 {
			if afford := int((budget - in.MonthSpent.Micros) / nodeCost.Micros); n > afford {
				n = max(afford, 0)
				why += fmt.Sprintf("; capped by the month's burst budget (%s left, %s per node for %s)",
					money(budget-in.MonthSpent.Micros), nodeCost, h)
			}
		}
	}
	if n == 0 {
		return Decision{Action: ActNone, Reason: why}
	}
	return Decision{Action: ActRequest, Count: n, Reason: why}
}

// Cost is the exact price of d on one node of gpus GPUs at rate per
// GPU-hour: whole GPU-seconds × rate / 3600, rounded half up to the
// currency's unit (the billing package's line arithmetic).
func Cost(gpus int, d time.Duration, rate allot.Money) (allot.Money, error) {
	return GPUSecondsCost(int64(gpus)*int64(max(d, 0)/time.Second), rate)
}

// GPUSecondsCost is Cost for a number of GPU-seconds.
func GPUSecondsCost(gpuSeconds int64, rate allot.Money) (allot.Money, error) {
	cur := rate.Currency
	if cur == "" {
		cur = "USD"
	}
	return billing.LineAmount(gpuSeconds, rate.Micros, 10000, cur)
}
