package web

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/allot"
)

// TestReadObjectReportsOnlyTheWrongField: one wrongly typed or unknown
// field is reported under its own name and the other fields are still
// read; a body that is not an object is reported under "body".
func TestReadObjectReportsOnlyTheWrongField(t *testing.T) {
	t.Parallel()
	var r JobRequest
	f, err := readObject(strings.NewReader(`{"team":"nlp","tier":3,"gpus":"8","command":["python","train.py"],"time_limit":"4h","env":{"A":1}}`), &r)
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != 2 || f["gpus"] != "must be a whole number" || f["env"] != "must be an object of strings" {
		t.Errorf("errors = %v, want gpus and env only", f)
	}
	if r.Team != "nlp" || string(r.Tier) != "3" || len(r.Command) != 2 || r.TimeLimit != "4h" || r.GPUs != nil {
		t.Errorf("the other fields were not read: %+v", r)
	}

	spec, err := decodeJobRequest(strings.NewReader(`{"team":"nlp","tier":3,"gpus":"8","command":["python"],"time_limit":"4h","bogus":1,"Name":["x"]}`))
	got := allot.Fields(err)
	if len(got) != 3 || got["gpus"] == "" || got["bogus"] != "unknown field" || got["name"] != "must be a string" {
		t.Errorf("job request errors = %v", got)
	}
	if spec.Team != "nlp" || spec.Tier != "3" || len(spec.Command) != 1 {
		t.Errorf("spec = %+v", spec)
	}

	for body, kind := range map[string]string{`[]`: "a list", `"x"`: "a string", `42`: "a number", `true`: "true or false", `null`: "null", ` [1,2] `: "a list"} {
		f, err := readObject(strings.NewReader(body), &JobRequest{})
		if err != nil || len(f) != 1 || !strings.Contains(f["body"], "must be a JSON object") || !strings.HasSuffix(f["body"], "not "+kind) {
			t.Errorf("%s: %v %v, want body: must be a JSON object … not %s", body, f, err, kind)
		}
		if _, ok := f[""]; ok {
			t.Errorf("%s: an error under the empty key", body)
		}
		_, err = decodeJobRequest(strings.NewReader(body))
		if got := allot.Fields(err); len(got) != 1 || got["body"] == "" {
			t.Errorf("%s: job request errors %v, want body only", body, got)
		}
	}
	for body, msg := range map[string]string{``: "request body is empty", `  `: "request body is empty", `{"team":`: "malformed JSON", `{} {}`: "more than one value", `{"a":1}x`: "more than one value"} {
		if _, err := readObject(strings.NewReader(body), &JobRequest{}); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: %v, want %q", body, err, msg)
		}
	}

	// The other bodies that share the decoder: the policy (embedded
	// fields keep their own names), health rules (nested), agents.
	var p policyPutJSON
	f, err = readObject(strings.NewReader(`{"weight_age":"x","grace_period_s":30,"note":"n"}`), &p)
	if err != nil || len(f) != 1 || f["weight_age"] != "must be a whole number" || p.Note != "n" || p.PolicyValues == nil || p.GracePeriodS != 30 {
		t.Errorf("policy: %v %v %+v", f, err, p)
	}
	var h HealthRulesJSON
	f, err = readObject(strings.NewReader(`{"rules":[{"name":"a","over":"high"}],"auto_undrain_after":"1h"}`), &h)
	if err != nil || len(f) != 1 || f["rules.over"] != "must be a number" || h.AutoUndrainAfter != "1h" {
		t.Errorf("health rules: %v %v %+v", f, err, h)
	}
	var hb agentproto.Heartbeat
	if err := decodeStrict(strings.NewReader(`[]`), &hb); allot.Fields(err)["body"] == "" {
		t.Errorf("agent heartbeat []: %v", err)
	}
}

// TestHealthRuleDurationsAreNotNanoseconds: a rule's duration is given as
// a duration ("10m") or in seconds (for_s), never both, and shown as a
// duration wherever the API shows rules (the policy too).
func TestHealthRuleDurationsAreNotNanoseconds(t *testing.T) {
	t.Parallel()
	secs := int64(5400)
	rules, f := parseRules([]HealthRuleJSON{
		{Name: "a", Metric: "throttle", For: "10m", Severity: "info", Action: "warn"},
		{Name: "b", Metric: "throttle", ForS: &secs, Severity: "info", Action: "warn"},
		{Name: "c", Metric: "throttle", Severity: "info", Action: "warn"},
	})
	if len(f) != 0 || rules[0].For != 10*time.Minute || rules[1].For != 90*time.Minute || rules[2].For != 0 {
		t.Errorf("rules %+v, errors %v", rules, f)
	}
	neg := int64(-1)
	_, f = parseRules([]HealthRuleJSON{
		{Name: "a", Metric: "throttle", For: "10m", ForS: &secs, Severity: "info", Action: "warn"},
		{Name: "b", Metric: "throttle", For: "1h1h", Severity: "info", Action: "warn"},
		{Name: "c", Metric: "throttle", ForS: &neg, Severity: "info", Action: "warn"},
		{Name: "d", Metric: "throttle", For: "90s500ms", Severity: "info", Action: "warn"},
	})
	if !strings.Contains(f["rules[0].for"], "not both") || !strings.Contains(f["rules[1].for"], "appears twice") ||
		!strings.Contains(f["rules[2].for_s"], "between 0 and") || !strings.Contains(f["rules[3].for"], "whole seconds") {
		t.Errorf("errors %v", f)
	}
	b, _ := json.Marshal(policyJSON(allot.Policy{HealthRules: allot.DefaultHealthRules()}))
	if !strings.Contains(string(b), `"for":"10m"`) || !strings.Contains(string(b), `"for":"1h"`) || strings.Contains(string(b), "600000000000") {
		t.Errorf("policy JSON shows rules as %s", b)
	}
}
