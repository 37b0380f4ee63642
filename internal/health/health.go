// Package health evaluates the policy's node health rules over what an
// agent reports in a heartbeat. It is pure: the store keeps the per-node,
// per-rule "since" state between heartbeats and acts on the result
// (warn, drain, drain and requeue). Standard library and internal/allot
// only.
package health

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// GPU is one GPU's health readings in a heartbeat.
type GPU struct {
	Index    int
	ECCDBE   int64  // volatile double-bit ECC error total
	XIDs     []int  // XID codes seen since the previous heartbeat
	Throttle uint64 // NVML clocks-event reason bitmask
}

// Report is one heartbeat's health input.
type Report struct {
	At time.Time
	// GPUs are the GPUs the agent reported (present on the bus).
	GPUs []GPU
	// Expected are the GPU indices registered for the node.
	Expected []int
	// Lost are GPUs the node had that its agent did not report when it
	// registered again (they count as missing until they are back).
	Lost []LostGPU
	// HealthCheck is the output of the node's failed --health-cmd, "" when
	// it passed (or none is configured).
	HealthCheck string
	// MetricsError is set when the agent could not read its GPUs (the
	// driver did not answer): GPUs is then empty and says nothing. Rules
	// over GPU metrics are unknown: one that held keeps holding (it does not
	// fire anew; its open event stays open), one that did not stays clear,
	// and GPUs absent from the report are not counted missing (GPUs lost
	// at a registration still are).
	MetricsError string
}

// LostGPU is a GPU a node's agent no longer reports since it registered
// again: its index and UUID in the inventory it had before.
type LostGPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
}

// Finding is a rule whose condition holds now.
type Finding struct {
	Rule   allot.HealthRule
	Value  float64   // the metric's worst value over the node's GPUs
	GPUs   []int     // the GPUs that meet the condition (none for node-level metrics)
	Values []float64 // the metric's value on each of GPUs (per-GPU metrics)
	Detail string    // human-readable: what was seen
	Since  time.Time // when the condition started to hold without a break
	Fires  bool      // it has held for at least Rule.For
}

// Result is the evaluation of one report.
type Result struct {
	// Since is the new per-rule state to keep: rules whose condition holds,
	// with the time it started holding. Rules absent from it do not hold.
	Since map[string]time.Time
	// Findings are the rules that hold (firing or not yet), in rule order.
	Findings []Finding
	// Action is the strongest action of the firing findings ("" if none).
	Action string
	// Passing reports that no drain or drain-and-requeue rule's condition
	// holds: the node passes its checks (for auto-undrain).
	Passing bool
}

// Firing returns the findings that fire.
func (r Result) Firing() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Fires {
			out = append(out, f)
		}
	}
	return out
}

// Evaluate applies rules to a report. since is the state returned by the
// previous evaluation for this node (nil at first).
func Evaluate(rules []allot.HealthRule, r Report, since map[string]time.Time) Result {
	res := Result{Since: map[string]time.Time{}, Passing: true}
	for _, rule := range rules {
		value, gpus, values, detail, holds := condition(rule, r)
		start, ok := since[rule.Name]
		unknown := false
		if !holds && ok && r.MetricsError != "" && GPUMetric(rule.Metric) {
			// No readings: a condition that held is not known to have cleared.
			holds, unknown = true, true
			detail = "GPU metrics unavailable: " + r.MetricsError
		}
		if !holds {
			continue
		}
		if !ok || start.After(r.At) {
			start = r.At
		}
		res.Since[rule.Name] = start
		f := Finding{Rule: rule, Value: value, GPUs: gpus, Values: values, Detail: detail, Since: start, Fires: !unknown && r.At.Sub(start) >= rule.For}
		res.Findings = append(res.Findings, f)
		if allot.HealthActionRank(rule.Action) >= allot.HealthActionRank(allot.HealthDrain) {
			res.Passing = false
		}
		if f.Fires && allot.HealthActionRank(rule.Action) > allot.HealthActionRank(res.Action) {
			res.Action = rule.Action
		}
	}
	return res
}

// ThrottleMask is the reason bits a throttle rule counts.
func ThrottleMask(rule allot.HealthRule) uint64 {
	if len(rule.Match) == 0 {
		return allot.ThrottleDefaultMask
	}
	var m uint64
	for _, b := range rule.Match {
		m |= uint64(b)
	}
	return m
}

// condition computes a rule's metric over the report and whether it
// exceeds the rule's threshold.
func condition(rule allot.HealthRule, r Report) (value float64, gpus []int, values []float64, detail string, holds bool) {
	perGPU := func(v func(GPU) (float64, string)) {
		var parts []string
		for _, g := range r.GPUs {
			x, d := v(g)
			if x > value {
				value = x
			}
			if x > rule.Over {
				gpus, values = append(gpus, g.Index), append(values, x)
				parts = append(parts, fmt.Sprintf("GPU %d: %s", g.Index, d))
			}
		}
		holds = len(gpus) > 0
		detail = strings.Join(parts, "; ")
	}
	switch rule.Metric {
	case allot.MetricECCDoubleBit:
		perGPU(func(g GPU) (float64, string) {
			return float64(g.ECCDBE), fmt.Sprintf("%d double-bit ECC errors", g.ECCDBE)
		})
	case allot.MetricXID:
		perGPU(func(g GPU) (float64, string) {
			var codes []string
			for _, x := range g.XIDs {
				if len(rule.Match) == 0 || slices.Contains(rule.Match, x) {
					codes = append(codes, fmt.Sprint(x))
				}
			}
			return float64(len(codes)), "XID " + strings.Join(codes, ", ")
		})
	case allot.MetricThrottle:
		mask := ThrottleMask(rule)
		perGPU(func(g GPU) (float64, string) {
			if g.Throttle&mask == 0 {
				return 0, ""
			}
			return 1, "throttled (" + ThrottleReasons(g.Throttle&mask) + ")"
		})
	case allot.MetricGPUMissing:
		present := map[int]bool{}
		for _, g := range r.GPUs {
			present[g.Index] = true
		}
		for _, i := range r.Expected {
			if !present[i] && r.MetricsError == "" {
				gpus = append(gpus, i)
			}
		}
		var parts []string
		if len(gpus) > 0 {
			parts = append(parts, fmt.Sprintf("GPU %s missing from the inventory", joinInts(gpus)))
		}
		for _, l := range r.Lost {
			gpus = append(gpus, l.Index)
			parts = append(parts, fmt.Sprintf("GPU %d (%s) missing since the agent registered again", l.Index, l.UUID))
		}
		value = float64(len(gpus))
		holds = value > rule.Over
		if holds {
			detail = strings.Join(parts, "; ")
		}
	case allot.MetricHealthCheck:
		if r.HealthCheck != "" {
			value = 1
		}
		holds = value > rule.Over
		if holds {
			detail = "health check failed: " + r.HealthCheck
		}
	}
	return value, gpus, values, detail, holds
}

// GPUMetric reports whether metric is read from the GPUs' metrics (unknown
// when reading them failed).
func GPUMetric(metric string) bool {
	switch metric {
	case allot.MetricECCDoubleBit, allot.MetricXID, allot.MetricThrottle, allot.MetricGPUMissing:
		return true
	}
	return false
}

// Counter reports whether metric is a running total per GPU (ecc_dbe: the
// volatile double-bit ECC count only grows until the driver reloads): its
// condition keeps holding after one fault, so a new fault shows only as a
// higher value or another GPU.
func Counter(metric string) bool { return metric == allot.MetricECCDoubleBit }

// Refires reports whether a firing finding is a new fault although its
// rule already has an open event that recorded gpus with values: for a
// counter metric, a GPU that meets the condition now and did not then, or
// whose total changed (rose; or fell and is still over the threshold,
// which takes a counter reset and new errors). Other metrics fire once per
// episode: an XID holds only for the heartbeat that reported it, a
// throttled or missing GPU holds until it recovers.
func Refires(f Finding, gpus []int, values []float64) bool {
	if !Counter(f.Rule.Metric) {
		return false
	}
	was := make(map[int]float64, len(gpus))
	for i, g := range gpus {
		if i < len(values) {
			was[g] = values[i]
		} else {
			was[g] = -1 // recorded without its value: any value now is news
		}
	}
	for i, g := range f.GPUs {
		v, ok := was[g]
		if !ok || i >= len(f.Values) || f.Values[i] != v {
			return true
		}
	}
	return false
}

var throttleNames = map[uint64]string{
	0x01: "gpu idle", 0x02: "applications clocks", allot.ThrottleSWPowerCap: "power cap",
	allot.ThrottleHWSlowdown: "hardware slowdown", 0x10: "sync boost", allot.ThrottleSWThermal: "software thermal slowdown",
	allot.ThrottleHWThermal: "hardware thermal slowdown", allot.ThrottleHWPowerBrake: "hardware power brake", 0x100: "display clocks",
}

// ThrottleReasons names the bits of an NVML clocks-event reason mask.
func ThrottleReasons(mask uint64) string {
	var bits []uint64
	for b := range throttleNames {
		if mask&b != 0 {
			bits = append(bits, b)
		}
	}
	sort.Slice(bits, func(i, j int) bool { return bits[i] < bits[j] })
	var names []string
	for _, b := range bits {
		names = append(names, throttleNames[b])
	}
	if rest := mask &^ 0x1ff; rest != 0 {
		names = append(names, fmt.Sprintf("0x%x", rest))
	}
	return strings.Join(names, ", ")
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}
