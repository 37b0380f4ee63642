package allot

import (
	"fmt"
	"regexp"
	"slices"
	"time"
)

var healthRuleNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,39}$`)

// Health-rule actions.
const (
	HealthWarn            = "warn"
	HealthDrain           = "drain"
	HealthDrainAndRequeue = "drain-and-requeue"
)

// HealthActions lists the actions, weakest first.
var HealthActions = []string{HealthWarn, HealthDrain, HealthDrainAndRequeue}

// HealthActionRank orders actions: warn 1, drain 2, drain-and-requeue 3
// (0 for anything else).
func HealthActionRank(action string) int { return slices.Index(HealthActions, action) + 1 }

// Health-rule severities.
var HealthSeverities = []string{"info", "warning", "critical"}

// HealthRule is one admin-editable rule over the agents' metrics, stored
// with the policy version.
type HealthRule struct {
	Name     string        `json:"name"`
	Metric   string        `json:"metric"`   // what the rule watches (see HealthMetrics)
	Match    []int         `json:"match"`    // xid: the XID codes that count (empty = any); throttle: the reason bits (empty = ThrottleDefaultMask)
	Over     float64       `json:"over"`     // threshold the metric must exceed
	For      time.Duration `json:"for"`      // how long the condition must hold (0 = at once)
	Severity string        `json:"severity"` // info, warning, critical
	Action   string        `json:"action"`   // HealthWarn, HealthDrain, HealthDrainAndRequeue
}

// HealthRuleDoc is a rule as people and the audit log read it: its
// duration in the "10m" form, like every duration Allot shows. (HealthRule's
// own JSON, stored with each policy version, keeps "for" in nanoseconds;
// it is not shown.)
type HealthRuleDoc struct {
	Name     string  `json:"name"`
	Metric   string  `json:"metric"`
	Match    []int   `json:"match"`
	Over     float64 `json:"over"`
	For      string  `json:"for"`
	Severity string  `json:"severity"`
	Action   string  `json:"action"`
}

// HealthRuleDocs is rules as HealthRuleDocs (never nil).
func HealthRuleDocs(rules []HealthRule) []HealthRuleDoc {
	out := make([]HealthRuleDoc, 0, len(rules))
	for _, r := range rules {
		m := r.Match
		if m == nil {
			m = []int{}
		}
		out = append(out, HealthRuleDoc{Name: r.Name, Metric: r.Metric, Match: m, Over: r.Over, For: FormatDuration(r.For), Severity: r.Severity, Action: r.Action})
	}
	return out
}

// Health-rule metrics the agents report.
const (
	MetricECCDoubleBit = "ecc_dbe"      // volatile double-bit (uncorrectable) ECC error total of a GPU (since the driver loaded)
	MetricXID          = "xid"          // XID error codes a GPU reported since the last heartbeat
	MetricThrottle     = "throttle"     // 1 while a GPU's clocks are held down by a thermal or power reason
	MetricGPUMissing   = "gpu_missing"  // how many GPUs registered for the node are not in its inventory
	MetricHealthCheck  = "health_check" // 1 while the node's --health-cmd exits non-zero
)

// HealthMetrics describes every metric a rule can watch.
var HealthMetrics = map[string]string{
	MetricECCDoubleBit: "double-bit (uncorrectable) volatile ECC errors of a GPU (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)",
	MetricXID:          "XID errors a GPU reported since the last heartbeat whose code is in match (DCGM_FI_DEV_XID_ERRORS)",
	MetricThrottle:     "1 while a GPU's clocks are throttled for a reason bit in match (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)",
	MetricGPUMissing:   "number of GPUs registered for the node that are missing from its inventory",
	MetricHealthCheck:  "1 while the node's --health-cmd exits non-zero",
}

// NVML clocks-event (throttle) reason bits.
const (
	ThrottleSWPowerCap     = 0x04
	ThrottleHWSlowdown     = 0x08
	ThrottleSWThermal      = 0x20
	ThrottleHWThermal      = 0x40
	ThrottleHWPowerBrake   = 0x80
	ThrottleDefaultMask    = ThrottleHWSlowdown | ThrottleSWThermal | ThrottleHWThermal | ThrottleHWPowerBrake
	throttleKnownReasonAll = 0x1ff
)

// FatalXIDs are the XID codes the default rule drains on: 48 double-bit
// ECC error, 79 GPU fallen off the bus, 94 contained ECC error, 95
// uncontained ECC error. Others admins often add: 13 graphics engine
// exception, 31 GPU memory page fault, 43 GPU stopped processing, 45
// preemptive cleanup, 61/62 internal micro-controller errors, 63/64 ECC page
// retirement or row remapping events, 74 NVLink error, 92 high single-bit
// ECC rate, 119/120 GSP errors.
var FatalXIDs = []int{48, 79, 94, 95}

// DefaultHealthRules are the rules a new cluster starts with.
func DefaultHealthRules() []HealthRule {
	return []HealthRule{
		{Name: "ecc-double-bit", Metric: MetricECCDoubleBit, Severity: "critical", Action: HealthDrain},
		{Name: "xid-fatal", Metric: MetricXID, Match: slices.Clone(FatalXIDs), Severity: "critical", Action: HealthDrain},
		{Name: "throttle-warn", Metric: MetricThrottle, For: 10 * time.Minute, Severity: "warning", Action: HealthWarn},
		{Name: "throttle-drain", Metric: MetricThrottle, For: time.Hour, Severity: "critical", Action: HealthDrain},
		{Name: "gpu-missing", Metric: MetricGPUMissing, Severity: "critical", Action: HealthDrain},
		{Name: "health-check", Metric: MetricHealthCheck, Severity: "critical", Action: HealthDrain},
	}
}

// ValidateHealthRules checks a rule set; field names are rules[i].field.
func ValidateHealthRules(rules []HealthRule) error {
	f := FieldErrors{}
	seen := map[string]bool{}
	if len(rules) > 100 {
		f.Add("rules", "at most 100 rules")
	}
	for i, r := range rules {
		k := func(field string) string { return fmt.Sprintf("rules[%d].%s", i, field) }
		switch {
		case !healthRuleNameRE.MatchString(r.Name):
			f.Add(k("name"), "must be 1–40 lower-case letters, digits and dashes")
		case seen[r.Name]:
			f.Add(k("name"), "%q is used by another rule", r.Name)
		}
		seen[r.Name] = true
		if _, ok := HealthMetrics[r.Metric]; !ok {
			f.Add(k("metric"), "unknown metric %q: use ecc_dbe, xid, throttle, gpu_missing or health_check", r.Metric)
		}
		if !slices.Contains(HealthSeverities, r.Severity) {
			f.Add(k("severity"), "unknown severity %q: use info, warning or critical", r.Severity)
		}
		if HealthActionRank(r.Action) == 0 {
			f.Add(k("action"), "unknown action %q: use warn, drain or drain-and-requeue", r.Action)
		}
		if r.Over < 0 {
			f.Add(k("over"), "must not be negative")
		}
		if r.For < 0 || r.For > 30*24*time.Hour {
			f.Add(k("for"), "must be between 0 and 30 days")
		} else if r.For%time.Second != 0 {
			f.Add(k("for"), "must be whole seconds")
		}
		if len(r.Match) > 0 && r.Metric != MetricXID && r.Metric != MetricThrottle {
			f.Add(k("match"), "only xid and throttle rules take a match list")
		}
		for _, m := range r.Match {
			if r.Metric == MetricXID && (m < 1 || m > 1000) {
				f.Add(k("match"), "XID codes are between 1 and 1000")
				break
			}
			if r.Metric == MetricThrottle && (m <= 0 || m&^throttleKnownReasonAll != 0 || m&(m-1) != 0) {
				f.Add(k("match"), "throttle reasons are single NVML reason bits (e.g. 8, 32, 64, 128)")
				break
			}
		}
	}
	return f.Err()
}
