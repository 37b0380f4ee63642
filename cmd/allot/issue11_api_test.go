package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// problem decodes an API error body.
func problem(t *testing.T, body []byte) web.Problem {
	t.Helper()
	var p web.Problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("not a problem body: %v: %s", err, body)
	}
	return p
}

// TestAPIBadInputSaysWhatIsWrong: the API's errors name what is wrong and
// nothing else, and bad input changes nothing. One wrongly typed field is
// reported alone (the others were sent and are read); a body that is not
// an object is "body"; finance is told who may cancel; the never-written
// states are refused with why; repeated duration units are refused; health
// rule durations are durations ("10m") or seconds, never nanoseconds.
func TestAPIBadInputSaysWhatIsWrong(t *testing.T) {
	e := boot(t)
	jobsBefore := e.jobCount()
	versions := e.policyCounts()
	gpu07 := e.nodeState("gpu07")

	// 1. Job submission: only the wrong field.
	for _, tt := range []struct {
		name, body string
		want       map[string]string // field → part of its message; exactly these fields
	}{
		{"gpus as a string", `{"name":"x","team":"nlp","tier":3,"gpus":"8","command":["python","t.py"],"time_limit":"4h"}`,
			map[string]string{"gpus": "must be a whole number"}},
		{"command as a string", `{"team":"nlp","tier":3,"gpus":1,"command":"python t.py","time_limit":"4h"}`,
			map[string]string{"command": "must be a list of strings"}},
		{"two wrong fields", `{"team":"nlp","tier":3,"gpus":true,"command":["x"],"time_limit_s":"1h"}`,
			map[string]string{"gpus": "must be a whole number", "time_limit_s": "must be a whole number"}},
		{"wrong type and an unknown field", `{"team":"nlp","tier":3,"gpus":"8","command":["x"],"time_limit":"4h","gpu":1}`,
			map[string]string{"gpus": "must be a whole number", "gpu": "unknown field"}},
		{"a list", `[]`, map[string]string{"body": "must be a JSON object"}},
		{"a string", `"x"`, map[string]string{"body": "not a string"}},
		{"a number", `42`, map[string]string{"body": "not a number"}},
		{"null", `null`, map[string]string{"body": "not null"}},
		{"repeated unit", `{"team":"nlp","tier":3,"gpus":1,"command":["x"],"time_limit":"1h1h"}`,
			map[string]string{"time_limit_s": `the unit "h" appears twice`}},
		{"units out of order", `{"team":"nlp","tier":3,"gpus":1,"command":["x"],"time_limit":"30m1h"}`,
			map[string]string{"time_limit_s": "largest first"}},
	} {
		code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, tt.body)
		p := problem(t, body)
		if code != http.StatusUnprocessableEntity || len(p.Errors) != len(tt.want) {
			t.Errorf("%s: %d %v, want 422 with exactly %v", tt.name, code, p.Errors, tt.want)
			continue
		}
		for f, msg := range tt.want {
			if !strings.Contains(p.Errors[f], msg) {
				t.Errorf("%s: %s = %q, want %q", tt.name, f, p.Errors[f], msg)
			}
		}
		if _, ok := p.Errors[""]; ok {
			t.Errorf("%s: an error under the empty key", tt.name)
		}
	}
	if got := e.jobCount(); got != jobsBefore {
		t.Errorf("bad submissions wrote jobs: %d → %d", jobsBefore, got)
	}

	// The other JSON endpoints share the decoder.
	for _, tt := range []struct {
		method, path, body, field, msg string
	}{
		{"PUT", "/api/v1/policy", `[]`, "body", "must be a JSON object"},
		{"PUT", "/api/v1/policy", `{"weight_age":"x","grace_period_s":31}`, "weight_age", "must be a whole number"},
		{"PUT", "/api/v1/policy", `{"health_rules":[]}`, "health_rules", "PUT /api/v1/health/rules"},
		{"PUT", "/api/v1/health/rules", `"x"`, "body", "not a string"},
		{"PUT", "/api/v1/health/rules", `{"rules":[{"name":"a","metric":"xid","over":"high","severity":"info","action":"warn"}]}`, "rules.over", "must be a number"},
		{"PUT", "/api/v1/teams/nlp", `42`, "body", "not a number"},
		{"POST", "/api/v1/nodes/gpu07/drain", `["x"]`, "body", "not a list"},
		{"POST", "/api/v1/tokens", `{"name":7}`, "name", "must be a string"},
	} {
		code, _, body := e.api(tt.method, tt.path, demo.Admin, tt.body)
		p := problem(t, body)
		if code != http.StatusUnprocessableEntity || len(p.Errors) != 1 || !strings.Contains(p.Errors[tt.field], tt.msg) {
			t.Errorf("%s %s %s: %d %v, want 422 with only %s %q", tt.method, tt.path, tt.body, code, p.Errors, tt.field, tt.msg)
		}
	}
	e.wantChanges(versions, 0, "bad policy, rules and team bodies")
	if n := e.nodeState("gpu07"); n != gpu07 {
		t.Errorf("gpu07 went %s → %s on a bad drain body", gpu07, n)
	}

	// 2. Finance cancelling is told about cancelling, not submitting.
	code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, `{"name":"mine","team":"nlp","tier":4,"gpus":1,"command":["sleep","1"],"time_limit":"1h"}`)
	if code != http.StatusCreated {
		t.Fatalf("submit: %d %s", code, body)
	}
	var j web.JobJSON
	json.Unmarshal(body, &j) //nolint:errcheck
	code, _, body = e.api("POST", fmt.Sprintf("/api/v1/jobs/%d/cancel", j.ID), demo.Finance, "")
	if p := problem(t, body); code != http.StatusForbidden || !strings.Contains(p.Detail, "can cancel it") || strings.Contains(p.Detail, "submit jobs") {
		t.Errorf("finance cancels: %d %q, want 403 about who may cancel", code, p.Detail)
	}
	br := e.login(demo.Finance)
	_, page := br.get(fmt.Sprintf("/jobs/%d", j.ID))
	if status, page := br.post(fmt.Sprintf("/jobs/%d/cancel", j.ID), page, url.Values{}); status != http.StatusForbidden || !strings.Contains(page, "can cancel it") {
		t.Errorf("finance cancels in the portal: %d", status)
	}
	if code, _, body := e.api("GET", fmt.Sprintf("/api/v1/jobs/%d", j.ID), demo.Finance, ""); code != 200 || !strings.Contains(string(body), `"state": "pending"`) {
		t.Errorf("the job after finance's tries: %d %s", code, body)
	}

	// 5. No job is ever preempted or lost: not a filter, with why.
	for _, st := range []string{"preempted", "lost"} {
		code, _, body := e.api("GET", "/api/v1/jobs?state="+st, demo.Engineer, "")
		if p := problem(t, body); code != http.StatusUnprocessableEntity || !strings.Contains(p.Errors["state"], "goes back to pending") {
			t.Errorf("state=%s: %d %v", st, code, p.Errors)
		}
	}
	_, page = e.login(demo.Engineer).get("/jobs")
	for _, st := range []string{"preempted", "lost"} {
		if strings.Contains(page, `<option value="`+st+`"`) {
			t.Errorf("the jobs page still offers state %s", st)
		}
	}

	// 3. Health-rule durations: "10m" or seconds in, "10m" out; never
	// nanoseconds, in the rules API, the policy API or the audit log.
	for _, path := range []string{"/api/v1/health/rules", "/api/v1/policy"} {
		_, _, body := e.api("GET", path, demo.Admin, "")
		if !strings.Contains(string(body), `"for": "10m"`) || strings.Contains(string(body), "600000000000") {
			t.Errorf("GET %s: throttle-warn's duration is not \"10m\":\n%s", path, body)
		}
	}
	code, _, body = e.api("PUT", "/api/v1/health/rules", demo.Admin,
		`{"rules":[{"name":"hot","metric":"throttle","for_s":5400,"severity":"critical","action":"drain"},{"name":"warm","metric":"throttle","for":"10m","severity":"warning","action":"warn"}],"auto_undrain_after_s":1800}`)
	if code != 200 || !strings.Contains(string(body), `"for": "1h30m"`) || !strings.Contains(string(body), `"for": "10m"`) || !strings.Contains(string(body), `"auto_undrain_after": "30m"`) {
		t.Errorf("rules in seconds: %d %s", code, body)
	}
	code, _, body = e.api("GET", "/api/v1/audit?kind=health", demo.Admin, "")
	if code != 200 || !strings.Contains(string(body), `1h30m`) || strings.Contains(string(body), "5400000000000") || strings.Contains(string(body), "30m0s") {
		t.Errorf("audit of the rules change: %d %s", code, body)
	}
	versions = e.policyCounts()
	for _, tt := range []struct{ body, field, msg string }{
		{`{"rules":[{"name":"a","metric":"throttle","for":"10m","for_s":600,"severity":"info","action":"warn"}]}`, "rules[0].for", "not both"},
		{`{"rules":[{"name":"a","metric":"throttle","for":"1h1h","severity":"info","action":"warn"}]}`, "rules[0].for", "appears twice"},
		{`{"rules":[{"name":"a","metric":"throttle","for_s":-1,"severity":"info","action":"warn"}]}`, "rules[0].for_s", "between 0 and"},
		{`{"rules":[{"name":"a","metric":"throttle","for":"1500ms","severity":"info","action":"warn"}]}`, "rules[0].for", "whole seconds"},
		{`{"rules":[],"auto_undrain_after":"1m","auto_undrain_after_s":60}`, "auto_undrain_after", "not both"},
	} {
		code, _, body := e.api("PUT", "/api/v1/health/rules", demo.Admin, tt.body)
		if p := problem(t, body); code != http.StatusUnprocessableEntity || !strings.Contains(p.Errors[tt.field], tt.msg) {
			t.Errorf("%s: %d %v, want %s %q", tt.body, code, p.Errors, tt.field, tt.msg)
		}
	}
	e.wantChanges(versions, 0, "bad health rules")
}

// nodeState returns the state of node name.
func (e *env) nodeState(name string) string {
	e.t.Helper()
	var st string
	if err := e.m.Pool.QueryRow(e.t.Context(), `SELECT state FROM nodes WHERE name = $1`, name).Scan(&st); err != nil {
		e.t.Fatal(err)
	}
	return st
}
