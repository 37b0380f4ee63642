package health

import (
	"slices"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"pgregory.net/rapid"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func healthyGPUs(n int) []GPU {
	g := make([]GPU, n)
	for i := range g {
		g[i].Index = i
	}
	return g
}

func indices(n int) []int {
	v := make([]int, n)
	for i := range v {
		v[i] = i
	}
	return v
}

func TestEvaluateDefaultRules(t *testing.T) {
	rules := allot.DefaultHealthRules()
	cases := []struct {
		name    string
		mutate  func(r *Report)
		action  string
		firing  []string
		passing bool
	}{
		{"healthy", func(*Report) {}, "", nil, true},
		{"double-bit ECC drains", func(r *Report) { r.GPUs[3].ECCDBE = 1 }, allot.HealthDrain, []string{"ecc-double-bit"}, false},
		{"fatal XID drains", func(r *Report) { r.GPUs[1].XIDs = []int{79} }, allot.HealthDrain, []string{"xid-fatal"}, false},
		{"harmless XID does not", func(r *Report) { r.GPUs[1].XIDs = []int{13, 31} }, "", nil, true},
		{"missing GPU drains", func(r *Report) { r.GPUs = r.GPUs[:7] }, allot.HealthDrain, []string{"gpu-missing"}, false},
		{"failed health check drains", func(r *Report) { r.HealthCheck = "nvlink down" }, allot.HealthDrain, []string{"health-check"}, false},
		{"fresh throttling does not fire yet", func(r *Report) { r.GPUs[0].Throttle = allot.ThrottleHWThermal }, "", nil, false},
		{"power cap alone is not throttling", func(r *Report) { r.GPUs[0].Throttle = allot.ThrottleSWPowerCap }, "", nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Report{At: t0, GPUs: healthyGPUs(8), Expected: indices(8)}
			c.mutate(&r)
			res := Evaluate(rules, r, nil)
			var firing []string
			for _, f := range res.Firing() {
				firing = append(firing, f.Rule.Name)
			}
			if res.Action != c.action || len(firing) != len(c.firing) || (len(firing) > 0 && firing[0] != c.firing[0]) || res.Passing != c.passing {
				t.Errorf("action %q firing %v passing %v; want %q %v %v", res.Action, firing, res.Passing, c.action, c.firing, c.passing)
			}
		})
	}
	r := Report{At: t0, GPUs: healthyGPUs(8), Expected: indices(8)}
	r.GPUs[2].ECCDBE = 2
	r.GPUs[5].ECCDBE = 1
	f := Evaluate(rules, r, nil).Firing()[0]
	if f.Value != 2 || len(f.GPUs) != 2 || f.GPUs[0] != 2 || f.GPUs[1] != 5 || f.Detail != "GPU 2: 2 double-bit ECC errors; GPU 5: 1 double-bit ECC errors" {
		t.Errorf("finding = %+v", f)
	}
}

// TestThrottleWarnThenDrain walks a fake clock: throttling warns after 10
// minutes and drains after an hour; a break resets the clock.
func TestThrottleWarnThenDrain(t *testing.T) {
	rules := allot.DefaultHealthRules()
	var since map[string]time.Time
	step := func(at time.Duration, mask uint64) Result {
		r := Report{At: t0.Add(at), GPUs: healthyGPUs(2), Expected: indices(2)}
		r.GPUs[1].Throttle = mask
		res := Evaluate(rules, r, since)
		since = res.Since
		return res
	}
	for _, s := range []struct {
		at     time.Duration
		mask   uint64
		action string
	}{
		{0, allot.ThrottleSWThermal, ""},
		{9 * time.Minute, allot.ThrottleSWThermal, ""},
		{10 * time.Minute, allot.ThrottleHWThermal, allot.HealthWarn},
		{59 * time.Minute, allot.ThrottleSWThermal, allot.HealthWarn},
		{60 * time.Minute, allot.ThrottleHWPowerBrake, allot.HealthDrain},
		{61 * time.Minute, 0, ""},                                     // a break…
		{62 * time.Minute, allot.ThrottleSWThermal, ""},               // …restarts the clock
		{72 * time.Minute, allot.ThrottleSWThermal, allot.HealthWarn}, // 10 minutes after the restart
	} {
		res := step(s.at, s.mask)
		if res.Action != s.action {
			t.Errorf("at %v: action %q, want %q (since %v)", s.at, res.Action, s.action, res.Since)
		}
	}
}

func TestCustomRules(t *testing.T) {
	rules := []allot.HealthRule{
		{Name: "ecc-many", Metric: allot.MetricECCDoubleBit, Over: 3, Severity: "warning", Action: allot.HealthWarn},
		{Name: "nvlink", Metric: allot.MetricXID, Match: []int{74}, Severity: "critical", Action: allot.HealthDrainAndRequeue},
		{Name: "any-xid", Metric: allot.MetricXID, Severity: "info", Action: allot.HealthWarn},
	}
	r := Report{At: t0, GPUs: healthyGPUs(4), Expected: indices(4)}
	r.GPUs[0].ECCDBE = 3
	r.GPUs[2].XIDs = []int{13}
	res := Evaluate(rules, r, nil)
	if res.Action != allot.HealthWarn || len(res.Findings) != 1 || res.Findings[0].Rule.Name != "any-xid" || !res.Passing {
		t.Errorf("3 DBE under over=3 and XID 13: %+v", res)
	}
	r.GPUs[0].ECCDBE = 4
	r.GPUs[2].XIDs = []int{13, 74}
	res = Evaluate(rules, r, nil)
	if res.Action != allot.HealthDrainAndRequeue || len(res.Findings) != 3 || res.Passing {
		t.Errorf("strongest action wins: %+v", res)
	}
}

// Properties: the state only holds rules whose condition holds; a
// finding fires exactly when it has held for its For; since never moves
// forward while a condition keeps holding; the action is the strongest
// firing one.
func TestEvaluateProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		metrics := []string{allot.MetricECCDoubleBit, allot.MetricXID, allot.MetricThrottle, allot.MetricGPUMissing, allot.MetricHealthCheck}
		nr := rapid.IntRange(1, 6).Draw(t, "rules")
		var rules []allot.HealthRule
		for i := range nr {
			m := rapid.SampledFrom(metrics).Draw(t, "metric")
			rules = append(rules, allot.HealthRule{Name: string(rune('a' + i)), Metric: m,
				For:      time.Duration(rapid.IntRange(0, 4).Draw(t, "for")) * time.Minute,
				Severity: "critical", Action: rapid.SampledFrom(allot.HealthActions).Draw(t, "action")})
		}
		var since map[string]time.Time
		now := t0
		for range rapid.IntRange(1, 12).Draw(t, "steps") {
			now = now.Add(time.Duration(rapid.IntRange(1, 120).Draw(t, "dt")) * time.Second)
			n := 4
			r := Report{At: now, Expected: indices(n)}
			for i := range n {
				if rapid.IntRange(0, 9).Draw(t, "missing") == 0 {
					continue
				}
				g := GPU{Index: i, ECCDBE: int64(rapid.IntRange(0, 1).Draw(t, "dbe")), Throttle: uint64(rapid.SampledFrom([]int{0, 0, allot.ThrottleHWThermal}).Draw(t, "thr"))}
				if rapid.IntRange(0, 4).Draw(t, "xid") == 0 {
					g.XIDs = []int{rapid.SampledFrom([]int{13, 79}).Draw(t, "code")}
				}
				r.GPUs = append(r.GPUs, g)
			}
			if rapid.Bool().Draw(t, "check") {
				r.HealthCheck = "bad"
			}
			res := Evaluate(rules, r, since)
			if len(res.Since) != len(res.Findings) {
				t.Fatalf("state %v vs findings %d", res.Since, len(res.Findings))
			}
			best := 0
			passing := true
			for _, f := range res.Findings {
				if prev, ok := since[f.Rule.Name]; ok && !f.Since.Equal(prev) {
					t.Fatalf("rule %s: since moved from %v to %v while holding", f.Rule.Name, prev, f.Since)
				}
				if f.Fires != (now.Sub(f.Since) >= f.Rule.For) {
					t.Fatalf("rule %s fires=%v after %v (for %v)", f.Rule.Name, f.Fires, now.Sub(f.Since), f.Rule.For)
				}
				if f.Fires {
					best = max(best, allot.HealthActionRank(f.Rule.Action))
				}
				if allot.HealthActionRank(f.Rule.Action) >= 2 {
					passing = false
				}
			}
			if allot.HealthActionRank(res.Action) != best || res.Passing != passing {
				t.Fatalf("action %q passing %v, want rank %d passing %v", res.Action, res.Passing, best, passing)
			}
			since = res.Since
		}
	})
}

func TestValidateHealthRules(t *testing.T) {
	good := allot.DefaultHealthRules()
	if err := allot.ValidateHealthRules(good); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := []allot.HealthRule{
		{Name: "x", Metric: "temperature", Severity: "critical", Action: allot.HealthDrain},
		{Name: "x", Metric: allot.MetricXID, Severity: "fatal", Action: "reboot", Match: []int{0}},
		{Name: "Bad Name", Metric: allot.MetricECCDoubleBit, Severity: "info", Action: allot.HealthWarn, Match: []int{1}, Over: -1, For: -time.Second},
	}
	fields := allot.Fields(allot.ValidateHealthRules(bad))
	for _, k := range []string{"rules[0].metric", "rules[1].name", "rules[1].severity", "rules[1].action", "rules[1].match",
		"rules[2].name", "rules[2].match", "rules[2].over", "rules[2].for"} {
		if fields[k] == "" {
			t.Errorf("no error for %s: %v", k, fields)
		}
	}
}

func TestThrottleReasons(t *testing.T) {
	if got := ThrottleReasons(allot.ThrottleHWThermal | allot.ThrottleSWPowerCap | 0x400); got != "power cap, hardware thermal slowdown, 0x400" {
		t.Errorf("got %q", got)
	}
}

// A counter metric (ecc_dbe) fires again when a GPU's total changes or
// another GPU meets the condition; other metrics fire once per episode.
func TestRefires(t *testing.T) {
	rules := allot.DefaultHealthRules()
	finding := func(mutate func(r *Report), rule string) Finding {
		r := Report{At: t0, GPUs: healthyGPUs(8), Expected: indices(8)}
		mutate(&r)
		for _, f := range Evaluate(rules, r, nil).Firing() {
			if f.Rule.Name == rule {
				return f
			}
		}
		t.Fatalf("%s does not fire", rule)
		return Finding{}
	}
	first := finding(func(r *Report) { r.GPUs[5].ECCDBE = 1 }, "ecc-double-bit")
	if len(first.Values) != 1 || first.Values[0] != 1 {
		t.Fatalf("values = %v", first.Values)
	}
	for _, c := range []struct {
		name   string
		now    Finding
		refire bool
	}{
		{"same total", first, false},
		{"total rose", finding(func(r *Report) { r.GPUs[5].ECCDBE = 2 }, "ecc-double-bit"), true},
		{"another GPU", finding(func(r *Report) { r.GPUs[5].ECCDBE, r.GPUs[2].ECCDBE = 1, 1 }, "ecc-double-bit"), true},
		{"xid again", finding(func(r *Report) { r.GPUs[5].XIDs = []int{79} }, "xid-fatal"), false},
		{"another GPU missing", finding(func(r *Report) { r.GPUs = r.GPUs[:6] }, "gpu-missing"), false},
	} {
		if got := Refires(c.now, first.GPUs, first.Values); got != c.refire {
			t.Errorf("%s: refires %v, want %v", c.name, got, c.refire)
		}
	}
}

// GPUs lost at a re-registration count as missing.
func TestLostGPUsAreMissing(t *testing.T) {
	r := Report{At: t0, GPUs: healthyGPUs(7), Expected: indices(7), Lost: []LostGPU{{Index: 7, UUID: "GPU-h"}}}
	res := Evaluate(allot.DefaultHealthRules(), r, nil)
	if res.Action != allot.HealthDrain || len(res.Firing()) != 1 {
		t.Fatalf("result = %+v", res)
	}
	if f := res.Firing()[0]; f.Rule.Name != "gpu-missing" || f.Value != 1 || f.Detail != "GPU 7 (GPU-h) missing since the agent registered again" {
		t.Errorf("finding = %+v", f)
	}
}

// TestMetricsErrorIsNotMissingGPUs: a heartbeat whose agent could not read
// its GPUs (MetricsError, no GPUs) does not count the node's GPUs missing;
// rules over GPU metrics that held keep holding without firing anew (their
// events stay open), rules that did not hold stay clear; GPUs lost at a
// registration and a failed health check still count.
func TestMetricsErrorIsNotMissingGPUs(t *testing.T) {
	rules := allot.DefaultHealthRules()
	const driver = "nvml: driver not loaded"
	throttling := map[string]time.Time{"throttle-warn": t0.Add(-time.Hour), "throttle-drain": t0.Add(-time.Hour)}
	cases := []struct {
		name    string
		report  Report
		since   map[string]time.Time
		firing  []string
		holding []string
		passing bool
	}{
		{"no readings: nothing is missing", Report{At: t0, Expected: indices(8), MetricsError: driver}, nil, nil, nil, true},
		{"no readings and no error: every GPU is missing (as before)", Report{At: t0, Expected: indices(8)}, nil, []string{"gpu-missing"}, []string{"gpu-missing"}, false},
		{"a GPU lost at registration still counts", Report{At: t0, Expected: indices(7), Lost: []LostGPU{{Index: 7, UUID: "GPU-7"}}, MetricsError: driver},
			nil, []string{"gpu-missing"}, []string{"gpu-missing"}, false},
		{"a failed health check still fires", Report{At: t0, Expected: indices(8), MetricsError: driver, HealthCheck: "nvlink down"},
			nil, []string{"health-check"}, []string{"health-check"}, false},
		{"throttling that held is not known to have cleared", Report{At: t0, Expected: indices(8), MetricsError: driver},
			throttling, nil, []string{"throttle-drain", "throttle-warn"}, false},
		{"a missing GPU that held stays held, not fired again", Report{At: t0, Expected: indices(8), MetricsError: driver},
			map[string]time.Time{"gpu-missing": t0.Add(-time.Minute)}, nil, []string{"gpu-missing"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := Evaluate(rules, c.report, c.since)
			var firing, holding []string
			for _, f := range res.Firing() {
				firing = append(firing, f.Rule.Name)
			}
			for _, f := range res.Findings {
				holding = append(holding, f.Rule.Name)
			}
			slices.Sort(holding)
			if !slices.Equal(firing, c.firing) || !slices.Equal(holding, c.holding) || res.Passing != c.passing {
				t.Errorf("firing %v holding %v passing %v; want %v %v %v", firing, holding, res.Passing, c.firing, c.holding, c.passing)
			}
			for _, f := range res.Findings {
				if old, ok := c.since[f.Rule.Name]; ok && !res.Since[f.Rule.Name].Equal(old) {
					t.Errorf("%s: since moved from %v to %v", f.Rule.Name, old, res.Since[f.Rule.Name])
				}
			}
		})
	}
	if GPUMetric(allot.MetricHealthCheck) || !GPUMetric(allot.MetricGPUMissing) {
		t.Error("GPUMetric")
	}
}
