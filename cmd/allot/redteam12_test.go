package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// Issue 12 red team: a hostile engineer of another team against job
// identity, env secrets and input checks, through the API, the portal and
// the CLI.

// TestRedteam12NoChosenAccount: a submitter cannot pick who the job runs
// as: run_as_user or user in the API body are unknown fields (422, nothing
// created), a run_as_user field added to the form is ignored, and only
// admins change a team's service account or a person's mapping (a lead of
// the team gets 403).
func TestRedteam12NoChosenAccount(t *testing.T) {
	e := boot(t)
	before := e.jobCount()
	for _, extra := range []string{`"run_as_user":"root"`, `"run_as_user":"svc-recs"`, `"user":"nadia@example.com"`, `"RUN_AS_USER":"svc-recs"`} {
		code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, `{"team":"nlp","tier":4,"gpus":1,"command":["x"],"time_limit":"1h",`+extra+`}`)
		if code != http.StatusUnprocessableEntity || strings.Contains(string(body), `"run_as_user": "svc-recs"`) {
			t.Errorf("API with %s: %d %s", extra, code, body)
		}
	}
	if n := e.jobCount(); n != before {
		t.Fatalf("spoofed submissions created jobs: %d → %d", before, n)
	}
	br := e.login(demo.Engineer)
	_, form := br.get("/jobs/new")
	status, _ := br.post("/jobs", form, url.Values{"team": {"nlp"}, "tier": {"4"}, "gpus": {"1"}, "time_limit": {"1h"}, "command": {"x"},
		"run_as_user": {"svc-recs"}, "user": {"root"}})
	var runAs string
	if err := e.m.Pool.QueryRow(context.Background(), `SELECT run_as_user FROM jobs ORDER BY id DESC LIMIT 1`).Scan(&runAs); err != nil {
		t.Fatal(err)
	}
	if status != http.StatusOK || runAs != "noah" {
		t.Errorf("form with run_as_user=svc-recs: %d, runs as %q, want noah", status, runAs)
	}
	for _, who := range []string{demo.Engineer, demo.Lead} {
		if code, _, _ := e.api("PUT", "/api/v1/teams/nlp", who, `{"posix_account":"svc-recs"}`); code != http.StatusForbidden {
			t.Errorf("%s sets nlp's service account: %d, want 403", who, code)
		}
		if code, _, _ := e.api("PUT", "/api/v1/users/noah@example.com/account", who, `{"posix_user":"svc-recs"}`); code != http.StatusForbidden {
			t.Errorf("%s maps noah: %d, want 403", who, code)
		}
	}
	var acct string
	if err := e.m.Pool.QueryRow(context.Background(), `SELECT posix_account FROM teams WHERE slug = 'nlp'`).Scan(&acct); err != nil || acct != "svc-nlp" {
		t.Errorf("nlp's service account is now %q (%v)", acct, err)
	}
}

// TestRedteam12ClaimCannotTakeAnotherAccount: the identity provider's
// account claim (e.g. preferred_username, which OIDC says is not unique and
// many providers let people edit) never makes a job run as an account
// Allot already gives to someone else: a team's service account or
// another person's mapped account. Such a claim is ignored (the job falls
// back to the team's service account); a claim nobody else has still
// works.
func TestRedteam12ClaimCannotTakeAnotherAccount(t *testing.T) {
	e := boot(t)
	ctx := context.Background()
	noah, err := e.m.Store.UserByEmail(ctx, "noah@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.m.Store.SetPosixUser(ctx, "ada@example.com", "noah@example.com", "", ""); err != nil {
		t.Fatal(err)
	}
	const job = `{"team":"nlp","tier":4,"gpus":1,"command":["x"],"time_limit":"1h"}`
	for _, tt := range []struct{ claim, want string }{
		{"svc-recs", "svc-nlp"}, // another team's service account
		{"svc-nlp", "svc-nlp"},  // a team's service account, even his own team's
		{"nadia", "svc-nlp"},    // the account an admin mapped nadia to
		{"noah-k", "noah-k"},    // his own: nobody else has it
	} {
		// What a sign-in stores from the provider's claim.
		if err := e.m.Store.SetOIDCPosixUser(ctx, noah.ID, tt.claim); err != nil {
			t.Fatal(err)
		}
		code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, job)
		if j := jobJSON(t, body); code != http.StatusCreated || j.RunAsUser != tt.want {
			t.Errorf("claim %q: %d, the job runs as %q, want %q", tt.claim, code, j.RunAsUser, tt.want)
		}
	}
}

// TestRedteam12EnvInputRefusedAtSubmit: environment values a node could
// never start are field errors at submit (API, form, CLI), not failures on
// the node: a value over the limit (execve refuses a string over 128 KiB
// with E2BIG), a newline in an image job's variable (env files cannot
// carry it). Nothing is created.
func TestRedteam12EnvInputRefusedAtSubmit(t *testing.T) {
	e := boot(t)
	before := e.jobCount()
	huge := strings.Repeat("x", 200<<10)
	for _, tt := range []struct {
		field string
		body  map[string]any
	}{
		{"env", map[string]any{"env": map[string]string{"BIG": huge}}},
		{"secret_env", map[string]any{"secret_env": map[string]string{"BIG": huge}}},
		{"env", map[string]any{"image": "busybox", "env": map[string]string{"A": "x\nLD_PRELOAD=/tmp/x.so"}}},
		{"secret_env", map[string]any{"image": "busybox", "secret_env": map[string]string{"A": "x\ny"}}},
		// A name in both, names Allot sets, names that are no names.
		{"secret_env", map[string]any{"env": map[string]string{"K": "1"}, "secret_env": map[string]string{"K": "sv-marker"}}},
		{"secret_env", map[string]any{"secret_env": map[string]string{"ALLOT_NODE_TOKEN": "sv-marker"}}},
		{"secret_env", map[string]any{"secret_env": map[string]string{"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}}},
		{"env", map[string]any{"env": map[string]string{"KÉY": "sv-marker"}}},
		{"env", map[string]any{"env": map[string]string{"K Y": "sv-marker"}}},
		{"secret_env", map[string]any{"secret_env": map[string]string{"K": "a\x00b"}}},
		// A working directory an image job's runtime could not mount.
		{"workdir", map[string]any{"image": "busybox", "workdir": "/home/alice/x:/usr/bin"}},
	} {
		b := map[string]any{"team": "nlp", "tier": 4, "gpus": 1, "command": []string{"x"}, "time_limit": "1h"}
		for k, v := range tt.body {
			b[k] = v
		}
		raw, _ := json.Marshal(b)
		code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, string(raw))
		if p := problem(t, body); code != http.StatusUnprocessableEntity || p.Errors[tt.field] == "" || strings.Contains(p.Errors[tt.field], "xxxx") {
			t.Errorf("%s: %d %v, want a %s error (without the value)", tt.field, code, p.Errors, tt.field)
		}
		if strings.Contains(string(body), "sv-marker") {
			t.Errorf("the refusal shows a value: %s", body)
		}
	}
	br := e.login(demo.Engineer)
	_, form := br.get("/jobs/new")
	status, page := br.post("/jobs", form, url.Values{"team": {"nlp"}, "tier": {"4"}, "gpus": {"1"}, "time_limit": {"1h"}, "command": {"x"},
		"env": {"BIG=" + huge}})
	if status != http.StatusUnprocessableEntity || !strings.Contains(page, `data-testid="error-env"`) {
		t.Errorf("form with a huge value: %d", status)
	}
	if rc, _, errOut := e.cli(demo.Engineer, "submit", "--team", "nlp", "--time", "1h", "--env", "BIG="+huge, "--", "x"); rc != 1 || !strings.Contains(errOut, "env") {
		t.Errorf("CLI with a huge value: rc=%d", rc)
	}
	if n := e.jobCount(); n != before {
		t.Fatalf("refused submissions created jobs: %d → %d", before, n)
	}
	// A value under the limit, and a newline in a host job, are fine.
	code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, `{"team":"nlp","tier":4,"gpus":1,"command":["x"],"time_limit":"1h",
		"env":{"OK":"`+strings.Repeat("y", 16<<10)+`","ML":"a\nb"}}`)
	if code != http.StatusCreated {
		t.Errorf("fine env: %d %.300s", code, body)
	}
}

// TestRedteam12CLISecretFromEnvironment: allot submit --secret-env KEY
// takes the value from $KEY, so the secret is not on the command line,
// which every user of a shared login node reads with ps; an unset KEY is
// a usage error (exit 2) and submits nothing.
func TestRedteam12CLISecretFromEnvironment(t *testing.T) {
	e := boot(t)
	const name, secret = "RT12_TEST_SECRET_SRC", "from-env-s3cr3t"
	// Not t.Setenv: the test runs in parallel; the name is this test's own.
	os.Setenv(name, secret) //nolint:errcheck
	defer os.Unsetenv(name)
	before := e.jobCount()
	if rc, out, errOut := e.cli(demo.Engineer, "submit", "--team", "nlp", "--time", "1h", "--secret-env", "RT12_UNSET_VAR_X", "--", "x"); rc != 2 || !strings.Contains(errOut, "RT12_UNSET_VAR_X") {
		t.Errorf("unset variable: rc=%d out=%q err=%q, want a usage error", rc, out, errOut)
	}
	if n := e.jobCount(); n != before {
		t.Fatalf("a refused submission created a job")
	}
	rc, out, errOut := e.cli(demo.Engineer, "submit", "--json", "--team", "nlp", "--time", "1h", "--secret-env", name, "--secret-env", "B=typed", "--", "x")
	if rc != 0 || strings.Contains(out, secret) {
		t.Fatalf("submit: rc=%d out=%q err=%q", rc, out, errOut)
	}
	j := jobJSON(t, []byte(out))
	var fromEnv, typed string
	if err := e.m.Pool.QueryRow(context.Background(), `SELECT secret_env->>$2, secret_env->>'B' FROM jobs WHERE id = $1`, j.ID, name).Scan(&fromEnv, &typed); err != nil {
		t.Fatal(err)
	}
	if fromEnv != secret || typed != "typed" {
		t.Errorf("stored secrets: %q %q", fromEnv, typed)
	}
}

// TestRedteam12RevokedNodeTokenEverywhere: a revoked node token is refused
// (401) on every agent endpoint, before the body is even read, and a node
// token is no API token.
func TestRedteam12RevokedNodeTokenEverywhere(t *testing.T) {
	e := boot(t)
	var tok web.NodeTokenJSON
	e.adminJSON("POST", "/api/v1/node-tokens", `{"node":"gpu01"}`, http.StatusCreated, &tok)
	if code, b := e.agentCall("POST", "/api/agent/v1/register", tok.Token, testInventory); code != http.StatusOK {
		t.Fatalf("register with the new token: %d %s", code, b)
	}
	if code := e.bearer("GET", "/api/v1/jobs", tok.Token); code != http.StatusUnauthorized {
		t.Errorf("a node token on the user API: %d, want 401", code)
	}
	e.adminJSON("DELETE", fmt.Sprintf("/api/v1/node-tokens/%d", tok.ID), "", http.StatusOK, nil)
	ref := `{"job_id":1,"segment":1}`
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/api/agent/v1/register", testInventory},
		{"POST", "/api/agent/v1/heartbeat", `{"gpus":[],"jobs":[]}`},
		{"GET", "/api/agent/v1/orders?wait=0s", ""},
		{"POST", "/api/agent/v1/leases/take", ref},
		{"POST", "/api/agent/v1/jobs/started", `{"job_id":1,"segment":1,"pid":1}`},
		{"POST", "/api/agent/v1/jobs/exited", `{"job_id":1,"segment":1,"exit_code":0,"time":"2000-01-01T00:00:00Z"}`},
		{"POST", "/api/agent/v1/jobs/log", `{"job_id":1,"segment":1,"lines":["forged"]}`},
	} {
		if code, b := e.agentCall(c.method, c.path, tok.Token, c.body); code != http.StatusUnauthorized {
			t.Errorf("%s %s with a revoked token: %d %s, want 401", c.method, c.path, code, b)
		}
	}
}

// TestRedteam12EnvNotInCopyOrFragment: another engineer of the team gets
// neither the env values nor the secret through a copy to resubmit, the
// page's live fragment (HX-Request) or the job's log; a lead of another
// team gets 404 for the copy.
func TestRedteam12EnvNotInCopyOrFragment(t *testing.T) {
	e := boot(t)
	const value, secret = "env-value-rt12", "secret-value-rt12"
	code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, `{"team":"nlp","tier":4,"gpus":1,"command":["x"],"time_limit":"1h",
		"env":{"DATA":"`+value+`"},"secret_env":{"TOKEN":"`+secret+`"}}`)
	if code != http.StatusCreated {
		t.Fatalf("submit: %d %s", code, body)
	}
	j := jobJSON(t, body)
	session := func(email string) *http.Client {
		u, err := e.m.Store.UserByEmail(context.Background(), email)
		if err != nil {
			t.Fatal(err)
		}
		sec, err := e.m.Store.CreateSession(context.Background(), u.ID, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		jar, _ := cookiejar.New(nil)
		base, _ := url.Parse(e.url)
		jar.SetCookies(base, []*http.Cookie{{Name: "allot_session", Value: sec, Path: "/"}})
		return &http.Client{Jar: jar}
	}
	get := func(c *http.Client, path string, hx bool) (int, string) {
		req, _ := http.NewRequest("GET", e.url+path, nil)
		if hx {
			req.Header.Set("HX-Request", "true")
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	nina := session("nina@example.com")
	for _, tt := range []struct {
		path string
		hx   bool
	}{{fmt.Sprintf("/jobs/new?copy=%d", j.ID), false}, {fmt.Sprintf("/jobs/%d", j.ID), true}, {fmt.Sprintf("/jobs/%d", j.ID), false}} {
		code, page := get(nina, tt.path, tt.hx)
		if code != http.StatusOK || !strings.Contains(page, "DATA") || strings.Contains(page, value) || strings.Contains(page, secret) {
			t.Errorf("nina GET %s (hx=%v): %d, value or secret shown=%v", tt.path, tt.hx, code, strings.Contains(page, value) || strings.Contains(page, secret))
		}
	}
	if code, page := get(session("rosa@example.com"), fmt.Sprintf("/jobs/new?copy=%d", j.ID), false); code != http.StatusNotFound || strings.Contains(page, value) {
		t.Errorf("another team's lead copies the job: %d", code)
	}
}
