package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/allotlabs/allot/web"
)

// env is a real Allot (server + River worker) on :0 over its own database,
// seeded with the demo organisation.
type env struct {
	t      *testing.T
	m      *Main
	url    string
	tokens map[string]string // persona → API token
}

func boot(t *testing.T) *env {
	t.Helper()
	return bootMain(t, &Main{Config: Config{Worker: true, DevMode: true}}).withTokens()
}

// bootStory is boot for tests of the demo's budget story (recs past 80 %,
// nlp past 100 % this month): their cluster runs at noon on the 20th of
// the test clock's month (demo.StoryClock), when demo.Seed gives every
// team its whole share of the month. Tests that only need a team short of
// budget use boot and tightBudget, and run at the test clock itself.
func bootStory(t *testing.T) *env {
	t.Helper()
	return bootMain(t, &Main{Config: Config{Worker: true, DevMode: true, Now: demo.StoryClock(clock.Now)}}).withTokens()
}

// tightBudget cuts team's monthly budget to one GPU-hour, so that any job
// asking for more than that runs as preemptible at every instant of a
// month. The warning says "Budget exceeded by …" once the team has used
// its hour, "Only … remaining" before (a month's first minutes).
func (e *env) tightBudget(team string) {
	e.t.Helper()
	if _, err := e.m.Pool.Exec(context.Background(), `UPDATE teams SET monthly_budget_gpu_hours = 1 WHERE slug = $1`, team); err != nil {
		e.t.Fatal(err)
	}
}

// startSeeded runs *m on a port of 127.0.0.1 over its own database (it
// sets DatabaseURL and Addr) and seeds the demo organisation. When tb ends
// it closes the Main *m is then (a test may restart the server).
func startSeeded(tb testing.TB, m **Main) {
	tb.Helper()
	ctx := context.Background()
	(*m).DatabaseURL, (*m).Addr = storetest.URL(tb), "127.0.0.1:0"
	if err := (*m).Run(ctx); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := (*m).Close(); err != nil {
			tb.Errorf("closing: %v", err)
		}
	})
	if err := demo.Seed(ctx, (*m).Store); err != nil {
		tb.Fatal(err)
	}
}

// bootMain is startSeeded in a parallel test, as an env with no API tokens
// yet.
func bootMain(t *testing.T, m *Main) *env {
	t.Helper()
	t.Parallel()
	e := &env{t: t, m: m, tokens: map[string]string{}}
	startSeeded(t, &e.m)
	e.url = m.URL()
	return e
}

// withTokens gives every demo persona an API token (e.tokens).
func (e *env) withTokens() *env {
	e.t.Helper()
	ctx := context.Background()
	for _, p := range demo.Personas {
		u, err := e.m.Store.UserByEmail(ctx, demo.PersonaEmail[p])
		if err != nil {
			e.t.Fatal(err)
		}
		if e.tokens[p], _, err = e.m.Store.CreateAPIToken(ctx, u.ID, "test"); err != nil {
			e.t.Fatal(err)
		}
	}
	return e
}

func (e *env) jobCount() int {
	e.t.Helper()
	var n int
	if err := e.m.Pool.QueryRow(context.Background(), "SELECT count(*) FROM jobs").Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// api sends a JSON request as persona ("" = no token) and returns status
// and body.
func (e *env) api(method, path, persona string, body string) (int, http.Header, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if persona != "" {
		req.Header.Set("Authorization", "Bearer "+e.tokens[persona])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// cli runs the allot binary's CLI in-process against the server.
func (e *env) cli(persona string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	full := append([]string{args[0], "--server", e.url, "--token", e.tokens[persona]}, args[1:]...)
	code := run(full, &out, &errb)
	return code, out.String(), errb.String()
}

// browser is a cookie-keeping HTTP client logged in as a persona through
// the dev login form, like a person with a browser.
type browser struct {
	e *env
	c *http.Client
}

var csrfRE = regexp.MustCompile(`name="_csrf" value="([^"]+)"`)

func (e *env) login(persona string) *browser {
	e.t.Helper()
	jar, _ := cookiejar.New(nil)
	b := &browser{e: e, c: &http.Client{Jar: jar}}
	_, page := b.get("/login")
	status, _ := b.post("/login/dev", page, url.Values{"persona": {persona}})
	if status != http.StatusOK {
		e.t.Fatalf("login as %s: status %d", persona, status)
	}
	return b
}

func (b *browser) get(path string) (int, string) {
	b.e.t.Helper()
	resp, err := b.c.Get(b.e.url + path)
	if err != nil {
		b.e.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// post submits a form found on page (for its CSRF token) with values.
func (b *browser) post(path, page string, v url.Values) (int, string) {
	b.e.t.Helper()
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		b.e.t.Fatalf("no CSRF token on the page before POST %s", path)
	}
	v.Set("_csrf", m[1])
	resp, err := b.c.PostForm(b.e.url+path, v)
	if err != nil {
		b.e.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestSubmitThreeWaysAndList(t *testing.T) {
	e := boot(t)
	e.tightBudget("nlp")
	before := e.jobCount()

	// 1. The portal form, as the engineer.
	br := e.login(demo.Engineer)
	_, form := br.get("/jobs/new")
	if !strings.Contains(form, `data-testid="job-form"`) {
		t.Fatal("no job form")
	}
	status, page := br.post("/jobs", form, url.Values{"team": {"nlp"}, "tier": {"4"}, "gpus": {"2"}, "time_limit": {"2h"},
		"command": {`python sweep.py --name "run a"`}, "name": {"form-job"}, "env": {"WANDB_MODE=offline"}})
	if status != http.StatusOK || !strings.Contains(page, "form-job") || !strings.Contains(page, "sweep.py --name &#39;run a&#39;") {
		t.Fatalf("form submit: status %d\n%s", status, page)
	}

	// 2. The JSON API (curl), as the engineer.
	code, hdr, body := e.api("POST", "/api/v1/jobs", demo.Engineer,
		`{"name":"api-job","team":"nlp","tier":3,"gpus":2,"gpu_type":"T4","time_limit_s":3600,"command":["python","eval.py"]}`)
	if code != http.StatusCreated || !strings.HasPrefix(hdr.Get("Location"), "/api/v1/jobs/") {
		t.Fatalf("API submit: %d %s", code, body)
	}
	var apiJob web.JobJSON
	if err := json.Unmarshal(body, &apiJob); err != nil {
		t.Fatal(err)
	}
	if apiJob.State != "pending" || apiJob.User != "noah@example.com" || *apiJob.GPUType != "T4" || apiJob.SubmittedAt.IsZero() ||
		apiJob.StartedAt != nil || !apiJob.Preemptible || !strings.Contains(apiJob.QuotaWarning, "will run as preemptible") {
		t.Errorf("API job = %+v", apiJob)
	}

	// 3. The CLI, as the lead.
	rc, out, errOut := e.cli(demo.Lead, "submit", "--team", "nlp", "--tier", "3", "--gpus", "8", "--time", "4h", "--gpu-type", "A100-80GB",
		"--checkpointable", "--name", "cli-job", "--", "python", "train.py", "--lr", "3e-4")
	if rc != 0 || !strings.Contains(out, "submitted job") || !strings.Contains(out, "warning: ") || !strings.Contains(out, "will run as preemptible") {
		t.Fatalf("CLI submit: rc=%d out=%q err=%q", rc, out, errOut)
	}

	if got := e.jobCount(); got != before+3 {
		t.Fatalf("jobs %d → %d, want +3", before, got)
	}

	// All three are listed as pending: API, CLI and the page.
	code, _, body = e.api("GET", "/api/v1/jobs?state=pending&team=nlp", demo.Engineer, "")
	var list web.JobList
	if err := json.Unmarshal(body, &list); code != 200 || err != nil {
		t.Fatalf("list: %d %s", code, body)
	}
	names := map[string]bool{}
	for _, j := range list.Jobs {
		names[j.Name] = true
		if j.State != "pending" || j.Team != "nlp" {
			t.Errorf("filter leaked %+v", j)
		}
	}
	for _, n := range []string{"form-job", "api-job", "cli-job"} {
		if !names[n] {
			t.Errorf("%s missing from the API list", n)
		}
	}
	rc, out, _ = e.cli(demo.Engineer, "jobs", "--state", "pending")
	for _, n := range []string{"form-job", "api-job", "cli-job"} {
		if rc != 0 || !strings.Contains(out, n) {
			t.Errorf("%s missing from `allot jobs`: %s", n, out)
		}
	}
	_, page = br.get("/jobs?state=pending")
	for _, n := range []string{"form-job", "api-job", "cli-job"} {
		if !strings.Contains(page, n) {
			t.Errorf("%s missing from the jobs page", n)
		}
	}

	// The engineer cancels their own job by CLI; the finance persona can
	// read it but not cancel.
	id := fmt.Sprint(apiJob.ID)
	if code, _, _ := e.api("POST", "/api/v1/jobs/"+id+"/cancel", demo.Finance, ""); code != http.StatusForbidden {
		t.Errorf("finance cancel: %d, want 403", code)
	}
	rc, out, errOut = e.cli(demo.Engineer, "cancel", id)
	if rc != 0 || !strings.Contains(out, "cancelled") {
		t.Fatalf("CLI cancel: rc=%d out=%q err=%q", rc, out, errOut)
	}
	rc, _, errOut = e.cli(demo.Engineer, "cancel", id)
	if rc == 0 || !strings.Contains(errOut, "cannot go from cancelled to cancelled") {
		t.Errorf("second cancel: rc=%d err=%q", rc, errOut)
	}
}

// TestBadInputEverywhere: each bad job spec gets its field error through
// the form, the API and the CLI, and writes nothing.
func TestBadInputEverywhere(t *testing.T) {
	e := boot(t)
	br := e.login(demo.Engineer)
	type spec struct {
		team, tier, gpus, gpuType, limit string
		command                          []string
	}
	good := spec{team: "nlp", tier: "3", gpus: "8", limit: "4h", command: []string{"python", "train.py"}}
	tests := []struct {
		name  string
		edit  func(*spec)
		field string
		msg   string
	}{
		{"zero GPUs", func(s *spec) { s.gpus = "0" }, "gpus", "must be at least 1"},
		{"negative GPUs", func(s *spec) { s.gpus = "-8" }, "gpus", "must be at least 1"},
		{"more GPUs than any gang", func(s *spec) { s.gpus = "65" }, "gpus", "at most 64 GPUs"},
		{"more GPUs than the type's gang", func(s *spec) { s.gpus, s.gpuType = "40", "T4" }, "gpus", "at most 32 GPUs"},
		{"unknown team", func(s *spec) { s.team = "robotics" }, "team", `unknown team "robotics"`},
		{"unknown tier", func(s *spec) { s.tier = "7" }, "tier", `unknown tier "7"`},
		{"unknown GPU type", func(s *spec) { s.gpuType = "H100" }, "gpu_type", `unknown GPU type "H100"`},
		{"zero time limit", func(s *spec) { s.limit = "0" }, "time_limit_s", "must be positive"},
		{"time limit above the tier's max", func(s *spec) { s.limit = "8d" }, "time_limit_s", "at most 7d for tier 3"},
		{"empty command", func(s *spec) { s.command = nil }, "command", ""},
		{"non-member", func(s *spec) { s.team = "fraud" }, "team", `you are not a member of team "fraud"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good
			tt.edit(&s)
			before := e.jobCount()

			// Form.
			_, form := br.get("/jobs/new")
			status, page := br.post("/jobs", form, url.Values{"team": {s.team}, "tier": {s.tier}, "gpus": {s.gpus}, "gpu_type": {s.gpuType},
				"time_limit": {s.limit}, "command": {strings.Join(s.command, " ")}})
			want := `data-testid="error-` + tt.field + `"`
			if status != http.StatusUnprocessableEntity || !strings.Contains(page, want) || !strings.Contains(page, htmlEscape(tt.msg)) {
				t.Errorf("form: status %d, want 422 with %s %q", status, want, tt.msg)
			}

			// API.
			gpus := s.gpus
			body := map[string]any{"team": s.team, "tier": s.tier, "gpus": json.Number(gpus), "command": s.command, "time_limit": s.limit}
			if s.gpuType != "" {
				body["gpu_type"] = s.gpuType
			}
			b, _ := json.Marshal(body)
			code, hdr, resp := e.api("POST", "/api/v1/jobs", demo.Engineer, string(b))
			var p web.Problem
			json.Unmarshal(resp, &p) //nolint:errcheck
			if code != http.StatusUnprocessableEntity || hdr.Get("Content-Type") != "application/problem+json" || !strings.Contains(p.Errors[tt.field], tt.msg) {
				t.Errorf("API: %d %s, want 422 with %s %q", code, resp, tt.field, tt.msg)
			}

			// CLI.
			args := []string{"submit", "--team", s.team, "--tier", s.tier, "--gpus", s.gpus, "--time", s.limit}
			if s.gpuType != "" {
				args = append(args, "--gpu-type", s.gpuType)
			}
			args = append(args, "--")
			args = append(args, s.command...)
			rc, _, errOut := e.cli(demo.Engineer, args...)
			wantCLI := tt.field + ": " + tt.msg
			if tt.field == "command" {
				wantCLI = "the command is missing"
			}
			if tt.name == "zero time limit" { // the CLI refuses it itself, as Slurm's "no limit"
				wantCLI = "--time: Allot jobs need a time limit"
			}
			if rc == 0 || !strings.Contains(errOut, wantCLI) {
				t.Errorf("CLI: rc=%d stderr=%q, want non-zero and %q", rc, errOut, wantCLI)
			}

			if after := e.jobCount(); after != before {
				t.Errorf("jobs %d → %d: bad input wrote something", before, after)
			}
		})
	}
}

func htmlEscape(s string) string {
	return strings.NewReplacer(`"`, "&#34;", "'", "&#39;", "<", "&lt;", ">", "&gt;").Replace(s)
}

func TestAPIErrorsAndAccess(t *testing.T) {
	e := boot(t)
	tests := []struct {
		name, method, path, persona, body string
		status                            int
		detail                            string
	}{
		{"no token", "GET", "/api/v1/jobs", "", "", 401, "missing API token"},
		{"malformed JSON", "POST", "/api/v1/jobs", demo.Engineer, `{"team":`, 400, "malformed JSON"},
		{"empty body", "POST", "/api/v1/jobs", demo.Engineer, ``, 400, ""},
		{"unknown field", "POST", "/api/v1/jobs", demo.Engineer, `{"team":"nlp","gpu":1}`, 422, "invalid input"},
		{"wrong type", "POST", "/api/v1/jobs", demo.Engineer, `{"team":"nlp","gpus":"eight"}`, 422, "invalid input"},
		{"bad state filter", "GET", "/api/v1/jobs?state=sleeping", demo.Engineer, "", 422, "invalid input"},
		{"bad limit", "GET", "/api/v1/jobs?limit=0", demo.Engineer, "", 422, "invalid input"},
		{"no such job", "GET", "/api/v1/jobs/999999", demo.Engineer, "", 404, "no job 999999"},
		{"bad job id", "GET", "/api/v1/jobs/abc", demo.Engineer, "", 404, `no job "abc"`},
		{"no such endpoint", "GET", "/api/v1/nope", demo.Engineer, "", 404, "no API endpoint"},
	}
	for _, tt := range tests {
		code, hdr, body := e.api(tt.method, tt.path, tt.persona, tt.body)
		var p web.Problem
		if err := json.Unmarshal(body, &p); err != nil || code != tt.status || p.Status != tt.status || !strings.Contains(p.Detail, tt.detail) ||
			hdr.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s %s, want %d %q", tt.name, code, hdr.Get("Content-Type"), body, tt.status, tt.detail)
		}
	}

	// A fraud engineer cannot see nlp's jobs: 404, not 403, and not listed.
	code, _, body := e.api("GET", "/api/v1/jobs?team=nlp", demo.Engineer, "")
	if code != 200 {
		t.Fatal(code)
	}
	var nlp web.JobList
	json.Unmarshal(body, &nlp) //nolint:errcheck
	if len(nlp.Jobs) == 0 {
		t.Fatal("engineer sees no nlp jobs")
	}
	ctx := context.Background()
	felix, err := e.m.Store.UserByEmail(ctx, "felix@example.com")
	if err != nil {
		t.Fatal(err)
	}
	secret, _, err := e.m.Store.CreateAPIToken(ctx, felix.ID, "t")
	if err != nil {
		t.Fatal(err)
	}
	e.tokens["felix"] = secret
	if code, _, _ := e.api("GET", fmt.Sprintf("/api/v1/jobs/%d", nlp.Jobs[0].ID), "felix", ""); code != 404 {
		t.Errorf("other team's job: %d, want 404", code)
	}
	code, _, body = e.api("GET", "/api/v1/jobs?team=nlp", "felix", "")
	var none web.JobList
	json.Unmarshal(body, &none) //nolint:errcheck
	if code != 200 || len(none.Jobs) != 0 {
		t.Errorf("felix listed %d nlp jobs", len(none.Jobs))
	}
	// Finance sees everything.
	code, _, body = e.api("GET", "/api/v1/jobs?team=fraud&limit=2", demo.Finance, "")
	var fin web.JobList
	json.Unmarshal(body, &fin) //nolint:errcheck
	if code != 200 || len(fin.Jobs) != 2 || fin.NextBefore == nil {
		t.Errorf("finance list: %d %d jobs", code, len(fin.Jobs))
	}

	// CLI errors: bad flags exit 2, unknown server token exits 1.
	var out, errb bytes.Buffer
	if rc := run([]string{"submit", "--gpus", "many"}, &out, &errb); rc != 2 {
		t.Errorf("bad flag: rc=%d", rc)
	}
	if rc := run([]string{"jobs", "--server", e.url, "--token", "allot_nope"}, &out, &errb); rc != 1 || !strings.Contains(errb.String(), "invalid or revoked API token") {
		t.Errorf("bad token: rc=%d %s", rc, errb.String())
	}
	if rc := run([]string{"cancel", "--server", e.url, "x"}, &out, &errb); rc != 2 {
		t.Errorf("bad id: rc=%d", rc)
	}
}

func TestPortalPagesAndHealth(t *testing.T) {
	e := boot(t)
	e.tightBudget("nlp")
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready"} {
		resp, err := http.Get(e.url + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Errorf("%s: %d %s", path, resp.StatusCode, b)
		}
	}
	// Logged out, pages send you to the login page.
	jar, _ := cookiejar.New(nil)
	anon := &browser{e: e, c: &http.Client{Jar: jar}}
	if _, page := anon.get("/jobs"); !strings.Contains(page, `data-testid="persona-engineer"`) {
		t.Error("logged-out /jobs did not lead to the persona login")
	}
	// A form without its CSRF token is refused and writes nothing.
	before := e.jobCount()
	br := e.login(demo.Engineer)
	resp, err := br.c.PostForm(e.url+"/jobs", url.Values{"team": {"nlp"}, "tier": {"3"}, "gpus": {"1"}, "time_limit": {"1h"}, "command": {"true"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST without CSRF: %d", resp.StatusCode)
	}
	if e.jobCount() != before {
		t.Error("POST without CSRF wrote a job")
	}
	// The quota preview answers the form's HTMX request before submitting.
	_, form := br.get("/jobs/new")
	for _, tt := range []struct {
		team, gpus, limit, kind, msg string
	}{
		{"nlp", "8", "4h", "warn", "will run as preemptible"},
		{"nlp", "x", "4h", "none", "Fix the highlighted fields"},
	} {
		_, frag := br.post("/jobs/quota", form, url.Values{"team": {tt.team}, "tier": {"3"}, "gpus": {tt.gpus}, "time_limit": {tt.limit}, "command": {"python t.py"}})
		if !strings.Contains(frag, `data-kind="`+tt.kind+`"`) || !strings.Contains(frag, tt.msg) {
			t.Errorf("quota preview %+v: %s", tt, frag)
		}
	}
	lead := e.login(demo.Admin)
	_, form = lead.get("/jobs/new")
	_, frag := lead.post("/jobs/quota", form, url.Values{"team": {"fraud"}, "tier": {"3"}, "gpus": {"1"}, "time_limit": {"1h"}, "command": {"true"}})
	if !strings.Contains(frag, `data-kind="ok"`) || !strings.Contains(frag, "Within budget") {
		t.Errorf("quota preview for fraud: %s", frag)
	}
	// Metrics count requests by route (an admin's token: metrics_auth.go).
	_, _, b := e.api("GET", "/metrics", demo.Admin, "")
	if !strings.Contains(string(b), `allot_http_requests_total{code="200",method="GET",route="/healthz"}`) {
		t.Errorf("metrics lack HTTP request counts")
	}
}
