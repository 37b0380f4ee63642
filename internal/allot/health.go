package allot

import "time"

// Health-rule actions.
const (
	HealthWarn            = "warn"
	HealthDrain           = "drain"
	HealthDrainAndRequeue = "drain-and-requeue"
)

// HealthRule is one admin-editable rule over the agents' metrics, stored
// with the policy version.
type HealthRule struct {
	Name     string        `json:"name"`
	Metric   string        `json:"metric"`   // what the rule watches (see the health docs)
	Match    []int         `json:"match"`    // e.g. XID codes; empty = any
	Over     float64       `json:"over"`     // threshold the metric must exceed
	For      time.Duration `json:"for"`      // how long the condition must hold (0 = at once)
	Severity string        `json:"severity"` // info, warning, critical
	Action   string        `json:"action"`   // HealthWarn, HealthDrain, HealthDrainAndRequeue
}

// Health-rule metrics the agents report.
const (
	MetricECCDoubleBit = "ecc_dbe"      // double-bit (uncorrectable) ECC errors since the last report
	MetricXID          = "xid"          // XID error codes seen since the last report
	MetricThrottle     = "throttle"     // thermal or power throttling active
	MetricGPUMissing   = "gpu_missing"  // a GPU registered for the node is not in the inventory
	MetricHealthCheck  = "health_check" // the node's --health-cmd exited non-zero
)

// DefaultHealthRules are the rules a new cluster starts with.
func DefaultHealthRules() []HealthRule {
	return []HealthRule{
		{Name: "ecc-double-bit", Metric: MetricECCDoubleBit, Severity: "critical", Action: HealthDrain},
		{Name: "xid-fatal", Metric: MetricXID, Match: []int{48, 79, 94, 95}, Severity: "critical", Action: HealthDrain},
		{Name: "throttle-warn", Metric: MetricThrottle, For: 10 * time.Minute, Severity: "warning", Action: HealthWarn},
		{Name: "throttle-drain", Metric: MetricThrottle, For: time.Hour, Severity: "critical", Action: HealthDrain},
		{Name: "gpu-missing", Metric: MetricGPUMissing, Severity: "critical", Action: HealthDrain},
		{Name: "health-check", Metric: MetricHealthCheck, Severity: "critical", Action: HealthDrain},
	}
}
