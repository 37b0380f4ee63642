package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// jobJSON decodes a job body.
func jobJSON(t *testing.T, body []byte) web.JobDetailJSON {
	t.Helper()
	var j web.JobDetailJSON
	if err := json.Unmarshal(body, &j); err != nil {
		t.Fatalf("not a job: %v: %s", err, body)
	}
	return j
}

// personaToken gives the person with email an API token under name in
// e.tokens (for people who are not one of the demo's four personas).
func (e *env) personaToken(name, email string) {
	e.t.Helper()
	ctx := context.Background()
	u, err := e.m.Store.UserByEmail(ctx, email)
	if err != nil {
		e.t.Fatal(err)
	}
	if e.tokens[name], _, err = e.m.Store.CreateAPIToken(ctx, u.ID, "test"); err != nil {
		e.t.Fatal(err)
	}
}

// TestAccountRequiredAtSubmit: with accounts required, a job for which no
// POSIX account resolves is refused with a field error on run_as_user in
// the API (problem+json), the portal form (the field's message) and the
// CLI (message, exit 1), and nothing is created; once an admin maps the
// person (CLI), their jobs run as that account; the team's service
// account (CLI) covers a submitter with none. Names that are no POSIX
// account, or root, are refused everywhere.
func TestAccountRequiredAtSubmit(t *testing.T) {
	e := bootMain(t, &Main{Config: Config{Worker: true, DevMode: true, RequirePOSIXAccount: true}}).withTokens()
	ctx := context.Background()
	// Noah has no account of his own, and nlp no service account.
	code, _, body := e.api("PUT", "/api/v1/users/noah@example.com/account", demo.Admin, `{"posix_user":"","note":"test"}`)
	if code != 200 || !strings.Contains(string(body), `"changed": true`) {
		t.Fatalf("unmapping noah: %d %s", code, body)
	}
	if code, _, body := e.api("PUT", "/api/v1/teams/nlp", demo.Admin, `{"posix_account":""}`); code != 200 {
		t.Fatalf("clearing nlp's service account: %d %s", code, body)
	}
	before := e.jobCount()
	const job = `{"team":"nlp","tier":3,"gpus":1,"command":["python","train.py"],"time_limit":"1h"}`

	code, _, body = e.api("POST", "/api/v1/jobs", demo.Engineer, job)
	if p := problem(t, body); code != http.StatusUnprocessableEntity || len(p.Errors) != 1 || !strings.Contains(p.Errors["run_as_user"], "no POSIX account") {
		t.Errorf("API: %d %v, want 422 with only run_as_user", code, p.Errors)
	}
	br := e.login(demo.Engineer)
	_, form := br.get("/jobs/new")
	status, page := br.post("/jobs", form, url.Values{"team": {"nlp"}, "tier": {"3"}, "gpus": {"1"}, "time_limit": {"1h"}, "command": {"python train.py"}})
	if status != http.StatusUnprocessableEntity || !strings.Contains(page, `data-testid="error-run_as_user"`) || !strings.Contains(page, "no POSIX account") {
		t.Errorf("form: %d, no run_as_user error on the page", status)
	}
	rc, out, errOut := e.cli(demo.Engineer, "submit", "--team", "nlp", "--time", "1h", "--", "python", "train.py")
	if rc != 1 || !strings.Contains(errOut, "run_as_user: no POSIX account") || strings.Contains(out, "submitted") {
		t.Errorf("CLI: rc=%d out=%q err=%q", rc, out, errOut)
	}
	if n := e.jobCount(); n != before {
		t.Fatalf("refused submissions created jobs: %d → %d", before, n)
	}

	// Bad names: mapping, service account, CLI.
	for _, bad := range []string{"root", "Noah", "no ah", "toor"} {
		b, _ := json.Marshal(map[string]string{"posix_user": bad})
		code, _, body := e.api("PUT", "/api/v1/users/noah@example.com/account", demo.Admin, string(b))
		if p := problem(t, body); code != http.StatusUnprocessableEntity || p.Errors["posix_user"] == "" {
			t.Errorf("mapping to %q: %d %v", bad, code, p.Errors)
		}
		b, _ = json.Marshal(map[string]string{"posix_account": bad})
		code, _, body = e.api("PUT", "/api/v1/teams/nlp", demo.Admin, string(b))
		if p := problem(t, body); code != http.StatusUnprocessableEntity || p.Errors["posix_account"] == "" {
			t.Errorf("service account %q: %d %v", bad, code, p.Errors)
		}
	}
	if rc, _, errOut := e.cli(demo.Admin, "user", "set-account", "noah@example.com", "root"); rc != 1 || !strings.Contains(errOut, "posix_user") {
		t.Errorf("CLI set-account root: rc=%d %q", rc, errOut)
	}
	if code, _, _ := e.api("PUT", "/api/v1/users/noah@example.com/account", demo.Engineer, `{"posix_user":"noah"}`); code != http.StatusForbidden {
		t.Errorf("an engineer maps himself: %d", code)
	}
	if code, _, _ := e.api("PUT", "/api/v1/users/nobody@example.com/account", demo.Admin, `{"posix_user":"x"}`); code != http.StatusNotFound {
		t.Errorf("an unknown person: %d", code)
	}

	// An admin maps noah (CLI): his jobs run as noah, and say so.
	rc, out, errOut = e.cli(demo.Admin, "user", "set-account", "--note", "HR-7", "noah@example.com", "noah")
	if rc != 0 || !strings.Contains(out, "jobs noah@example.com submits run as noah") {
		t.Fatalf("CLI set-account: rc=%d out=%q err=%q", rc, out, errOut)
	}
	if n := e.auditActions("user.posix_user", "user:noah@example.com"); n != 2 {
		t.Errorf("audit entries user.posix_user for noah: %d, want 2 (unmapped, mapped)", n)
	}
	rc, out, _ = e.cli(demo.Engineer, "submit", "--team", "nlp", "--time", "1h", "--", "python", "train.py")
	if rc != 0 || !strings.Contains(out, "runs as noah") {
		t.Errorf("CLI submit after the mapping: rc=%d %q", rc, out)
	}
	rc, out, _ = e.cli(demo.Admin, "user", "accounts")
	if rc != 0 || !strings.Contains(out, "noah@example.com") || !strings.Contains(out, "nadia") {
		t.Errorf("allot user accounts: rc=%d %q", rc, out)
	}

	// The admin herself has no account: her jobs for nlp need its service
	// account, which the CLI sets.
	code, _, body = e.api("POST", "/api/v1/jobs", demo.Admin, job)
	if p := problem(t, body); code != http.StatusUnprocessableEntity || p.Errors["run_as_user"] == "" {
		t.Errorf("admin without account: %d %v", code, p.Errors)
	}
	if rc, out, errOut := e.cli(demo.Admin, "team", "set-account", "nlp", "svc-nlp"); rc != 0 || !strings.Contains(out, "service account is svc-nlp") {
		t.Fatalf("CLI team set-account: rc=%d out=%q err=%q", rc, out, errOut)
	}
	code, _, body = e.api("POST", "/api/v1/jobs", demo.Admin, job)
	if j := jobJSON(t, body); code != http.StatusCreated || j.RunAsUser != "svc-nlp" {
		t.Errorf("admin with the team's account: %d run_as_user=%q", code, j.RunAsUser)
	}
	// The job page and JSON say who it runs as.
	code, _, body = e.api("POST", "/api/v1/jobs", demo.Engineer, job)
	j := jobJSON(t, body)
	if code != http.StatusCreated || j.RunAsUser != "noah" {
		t.Fatalf("noah's job: %d %s", code, body)
	}
	if _, page := br.get(fmt.Sprintf("/jobs/%d", j.ID)); !strings.Contains(page, `data-testid="run-as-user"><code>noah</code>`) {
		t.Errorf("the job page does not say it runs as noah")
	}
	if n := e.jobCount(); n != before+3 {
		t.Errorf("jobs %d → %d, want +3", before, n)
	}

	// The admin page: a bad name is the field's error, a good one saved.
	ad := e.login(demo.Admin)
	status, page = ad.get("/admin/accounts")
	if status != 200 || !strings.Contains(page, `data-email="nina@example.com"`) || !strings.Contains(page, "<code>svc-nlp</code>") {
		t.Fatalf("/admin/accounts: %d", status)
	}
	var nina int64
	if err := e.m.Pool.QueryRow(ctx, `SELECT id FROM users WHERE email = 'nina@example.com'`).Scan(&nina); err != nil {
		t.Fatal(err)
	}
	status, page = ad.post(fmt.Sprintf("/admin/users/%d/account", nina), page, url.Values{"posix_user": {"Nina R"}})
	if status != http.StatusUnprocessableEntity || !strings.Contains(page, `data-testid="error-posix_user"`) || !strings.Contains(page, `value="Nina R"`) {
		t.Errorf("bad name in the form: %d", status)
	}
	status, page = ad.post(fmt.Sprintf("/admin/users/%d/account", nina), page, url.Values{"posix_user": {"nrossi"}, "note": {"from HR"}})
	if status != 200 || !strings.Contains(page, "Saved the account of nina@example.com") || !strings.Contains(page, `value="nrossi"`) {
		t.Errorf("good name in the form: %d", status)
	}
	code, _, body = e.api("GET", "/api/v1/accounts", demo.Admin, "")
	if code != 200 || !strings.Contains(string(body), `"posix_user": "nrossi"`) {
		t.Errorf("GET /api/v1/accounts: %d %s", code, body)
	}
}

// TestEnvShownByRole: a job's env values are for its submitter, the
// team's leads and admins; another member of the team and finance see the
// names with "***"; other teams' leads do not see the job. Secret
// variables are never shown to anyone, not even the submitter, in the API
// (job, list) or on the page; a copy to resubmit leaves their values
// empty.
func TestEnvShownByRole(t *testing.T) {
	e := boot(t)
	e.personaToken("nina", "nina@example.com") // another engineer in nlp
	e.personaToken("rosa", "rosa@example.com") // the lead of recs
	const secret = "sekrit-Value-42"
	code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, `{"name":"env-job","team":"nlp","tier":4,"gpus":1,"command":["python","t.py"],"time_limit":"1h",
		"env":{"WANDB_MODE":"offline","DATA":"/data/x"},"secret_env":{"WANDB_API_KEY":"`+secret+`"}}`)
	if code != http.StatusCreated || strings.Contains(string(body), secret) {
		t.Fatalf("submit: %d %s", code, body)
	}
	j := jobJSON(t, body)
	if j.Env["DATA"] != "/data/x" || j.SecretEnv["WANDB_API_KEY"] != "***" || j.EnvRedacted {
		t.Errorf("the submitter's answer: env %v secret %v", j.Env, j.SecretEnv)
	}
	path := fmt.Sprintf("/api/v1/jobs/%d", j.ID)
	for _, tt := range []struct {
		who  string
		sees bool
	}{{demo.Engineer, true}, {demo.Lead, true}, {demo.Admin, true}, {"nina", false}, {demo.Finance, false}} {
		code, _, body := e.api("GET", path, tt.who, "")
		if code != 200 || strings.Contains(string(body), secret) {
			t.Errorf("%s: %d, or the secret shown", tt.who, code)
			continue
		}
		got := jobJSON(t, body)
		want := map[bool]string{true: "offline", false: "***"}[tt.sees]
		if got.Env["WANDB_MODE"] != want || got.Env["DATA"] != map[bool]string{true: "/data/x", false: "***"}[tt.sees] || got.EnvRedacted == tt.sees {
			t.Errorf("%s sees env %v (redacted=%v), want values %q", tt.who, got.Env, got.EnvRedacted, want)
		}
		if len(got.SecretEnv) != 1 || got.SecretEnv["WANDB_API_KEY"] != "***" {
			t.Errorf("%s sees secret_env %v", tt.who, got.SecretEnv)
		}
		// The list says the same.
		_, _, lb := e.api("GET", "/api/v1/jobs?team=nlp&limit=1000", tt.who, "")
		var l web.JobList
		json.Unmarshal(lb, &l) //nolint:errcheck
		found := false
		for _, x := range l.Jobs {
			if x.ID == j.ID {
				found = true
				if x.Env["WANDB_MODE"] != want || x.SecretEnv["WANDB_API_KEY"] != "***" {
					t.Errorf("%s in the list: env %v secret %v", tt.who, x.Env, x.SecretEnv)
				}
			}
		}
		if !found || strings.Contains(string(lb), secret) {
			t.Errorf("%s: job missing from the list, or the secret in it", tt.who)
		}
	}
	if code, _, _ := e.api("GET", path, "rosa", ""); code != http.StatusNotFound {
		t.Errorf("another team's lead: %d, want 404", code)
	}

	// The page: values for the submitter, lead and admin; "***" for finance;
	// the secret for no one.
	for _, who := range []string{demo.Engineer, demo.Lead, demo.Admin, demo.Finance} {
		_, page := e.login(who).get(fmt.Sprintf("/jobs/%d", j.ID))
		sees := who != demo.Finance
		if strings.Contains(page, secret) || !strings.Contains(page, "secret WANDB_API_KEY") {
			t.Errorf("%s: the page shows the secret, or not its name", who)
		}
		if strings.Contains(page, "/data/x") != sees || strings.Contains(page, `data-testid="env-redacted"`) == sees {
			t.Errorf("%s: env values shown=%v, want %v", who, strings.Contains(page, "/data/x"), sees)
		}
	}
	// A copy to resubmit: the submitter gets env, never the secret's value.
	_, page := e.login(demo.Engineer).get(fmt.Sprintf("/jobs/new?copy=%d", j.ID))
	if strings.Contains(page, secret) || !strings.Contains(page, "WANDB_API_KEY=") || !strings.Contains(page, "DATA=/data/x") {
		t.Errorf("the copy form: secret shown, or names missing")
	}
	// The secret is stored, for the node.
	var stored string
	if err := e.m.Pool.QueryRow(context.Background(), `SELECT secret_env->>'WANDB_API_KEY' FROM jobs WHERE id = $1`, j.ID).Scan(&stored); err != nil || stored != secret {
		t.Errorf("stored secret: %q %v", stored, err)
	}
}

// TestJobSpecFieldsThreeWays: image, memory and CPUs in the API, the
// form and the CLI: good values are stored and shown; bad ones are field
// errors everywhere and create nothing.
func TestJobSpecFieldsThreeWays(t *testing.T) {
	e := boot(t)
	before := e.jobCount()
	code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, `{"team":"nlp","tier":4,"gpus":1,"command":["x"],"time_limit":"1h",
		"image":"bad image","memory":"64G","cpus":"lots"}`)
	p := problem(t, body)
	if code != http.StatusUnprocessableEntity || len(p.Errors) != 3 || !strings.Contains(p.Errors["image"], "printable") ||
		!strings.Contains(p.Errors["memory"], "64GiB") || !strings.Contains(p.Errors["cpus"], "number of CPUs") {
		t.Errorf("API, bad: %d %v", code, p.Errors)
	}
	for _, tt := range []struct{ body, field string }{
		{`"cpus":0.0001`, "cpus"},
		{`"cpus":true`, "cpus"},
		{`"memory_bytes":1024`, "memory"},
		{`"memory_bytes":1073741824,"memory":"1GiB"`, "memory"},
		{`"memory_bytes":"1GiB"`, "memory_bytes"},
		{`"image":"ghcr.io/Acme/train"`, "image"},
		{`"secret_env":{"TOKEN":"a"},"env":{"TOKEN":"b"}`, "secret_env"},
	} {
		code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, `{"team":"nlp","tier":4,"gpus":1,"command":["x"],"time_limit":"1h",`+tt.body+`}`)
		if p := problem(t, body); code != http.StatusUnprocessableEntity || len(p.Errors) != 1 || p.Errors[tt.field] == "" {
			t.Errorf("API %s: %d %v, want only %s", tt.body, code, p.Errors, tt.field)
		}
	}
	br := e.login(demo.Engineer)
	_, form := br.get("/jobs/new")
	for _, name := range []string{`name="image"`, `name="memory"`, `name="cpus"`, `name="secret_env"`} {
		if !strings.Contains(form, name) {
			t.Errorf("the form has no %s", name)
		}
	}
	status, page := br.post("/jobs", form, url.Values{"team": {"nlp"}, "tier": {"4"}, "gpus": {"1"}, "time_limit": {"1h"}, "command": {"x"},
		"image": {"UPPER/case"}, "memory": {"12 parsecs"}, "cpus": {"-2"}, "secret_env": {"no equals sign"}})
	for _, f := range []string{"image", "memory", "cpus", "secret_env"} {
		if status != http.StatusUnprocessableEntity || !strings.Contains(page, `data-testid="error-`+f+`"`) {
			t.Errorf("form: %d, no %s error", status, f)
		}
	}
	if !strings.Contains(page, `value="12 parsecs"`) {
		t.Errorf("the form does not keep what was typed")
	}
	rc, out, errOut := e.cli(demo.Engineer, "submit", "--team", "nlp", "--tier", "4", "--time", "1h", "--image", "bad image", "--memory", "64G", "--cpus", "x", "--", "x")
	if rc != 1 || !strings.Contains(errOut, "image:") || !strings.Contains(errOut, "memory:") || !strings.Contains(errOut, "cpus:") || out != "" {
		t.Errorf("CLI, bad: rc=%d out=%q err=%q", rc, out, errOut)
	}
	if n := e.jobCount(); n != before {
		t.Fatalf("bad specs created jobs: %d → %d", before, n)
	}

	// Good values, three ways.
	code, _, body = e.api("POST", "/api/v1/jobs", demo.Engineer, `{"team":"nlp","tier":4,"gpus":1,"command":["x"],"time_limit":"1h",
		"image":"nvcr.io/nvidia/pytorch:24.05-py3","memory":"64GiB","cpus":4.5}`)
	j := jobJSON(t, body)
	if code != http.StatusCreated || j.Image != "nvcr.io/nvidia/pytorch:24.05-py3" || j.MemoryBytes != 64<<30 || j.CPUs != 4.5 || j.MilliCPUs != 4500 {
		t.Errorf("API, good: %d %s", code, body)
	}
	code, _, body = e.api("POST", "/api/v1/jobs", demo.Engineer, `{"team":"nlp","tier":4,"gpus":1,"command":["x"],"time_limit":"1h","memory_bytes":536870912,"cpus":"2"}`)
	if j := jobJSON(t, body); code != http.StatusCreated || j.MemoryBytes != 512<<20 || j.MilliCPUs != 2000 {
		t.Errorf("API, memory_bytes and cpus as a string: %d %s", code, body)
	}
	status, page = br.post("/jobs", form, url.Values{"team": {"nlp"}, "tier": {"4"}, "gpus": {"1"}, "time_limit": {"1h"}, "command": {"x"},
		"image": {"ghcr.io/acme/train:1.4"}, "memory": {"512MiB"}, "cpus": {"0.5"}})
	if status != 200 || !strings.Contains(page, `data-testid="image">ghcr.io/acme/train:1.4`) || !strings.Contains(page, "512MiB memory") || !strings.Contains(page, "0.5 CPUs") {
		t.Errorf("form, good: %d", status)
	}
	rc, out, errOut = e.cli(demo.Engineer, "submit", "--json", "--team", "nlp", "--tier", "4", "--time", "1h", "--image", "ubuntu:24.04", "--memory", "2GiB",
		"--cpus", "8", "--secret-env", "API_KEY=hush-hush", "--", "x")
	var cj web.JobJSON
	if rc != 0 || json.Unmarshal([]byte(out), &cj) != nil || cj.Image != "ubuntu:24.04" || cj.MemoryBytes != 2<<30 || cj.MilliCPUs != 8000 ||
		cj.SecretEnv["API_KEY"] != "***" || strings.Contains(out, "hush-hush") || cj.RunAsUser != "noah" {
		t.Errorf("CLI, good: rc=%d out=%s err=%q", rc, out, errOut)
	}
	if n := e.jobCount(); n != before+4 {
		t.Errorf("jobs %d → %d, want +4", before, n)
	}
}

// TestOIDCAccountClaimStoredAtSignIn: with --oidc-account-claim, the
// claim's value (here preferred_username) is stored at each sign-in and is
// what a person's jobs run as when no admin mapped them; the admin's
// mapping still wins.
func TestOIDCAccountClaimStoredAtSignIn(t *testing.T) {
	issuer := startProvider(t)
	e := bootMain(t, &Main{Config: Config{Worker: true, RequirePOSIXAccount: true,
		OIDC: web.OIDCConfig{Issuer: issuer, ClientID: testClientID, ClientSecret: testClientSecret, LinkEmailIssuers: []string{issuer},
			Claims: web.ClaimMapping{AccountClaim: "preferred_username"}}}})
	ctx := context.Background()
	if _, err := e.m.Pool.Exec(ctx, `UPDATE users SET posix_user = '' WHERE email = 'noah@example.com'; UPDATE teams SET posix_account = ''`); err != nil {
		t.Fatal(err)
	}
	claimed := func() string {
		var s string
		if err := e.m.Pool.QueryRow(ctx, `SELECT oidc_posix_user FROM users WHERE email = 'noah@example.com'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got := claimed(); got != "" {
		t.Fatalf("before signing in: %q", got)
	}
	b := newSSOBrowser(t)
	if loc := b.login(e, "noah", "/jobs"); !strings.HasSuffix(loc, "/jobs") {
		t.Fatalf("sign-in went to %q", loc)
	}
	if got := claimed(); got != "noah" {
		t.Fatalf("the claim stored: %q, want noah", got)
	}
	u, err := e.m.Store.UserByEmail(ctx, "noah@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if a, src, err := e.m.Store.ResolveAccount(ctx, &u, "nlp"); err != nil || a != "noah" || src != "oidc" {
		t.Errorf("noah resolves to %q from %q (%v), want noah from the claim", a, src, err)
	}
	// His session submits through the form: the job runs as the claim.
	s := b.do("GET", e.url+"/jobs/new", nil)
	m := csrfRE.FindStringSubmatch(s.body)
	if s.status != 200 || m == nil {
		t.Fatalf("the form: %d", s.status)
	}
	s = b.do("POST", e.url+"/jobs", url.Values{"_csrf": {m[1]}, "team": {"nlp"}, "tier": {"4"}, "gpus": {"1"}, "time_limit": {"1h"}, "command": {"x"}})
	if s.status != http.StatusSeeOther {
		t.Fatalf("submit: %d %s", s.status, s.body)
	}
	var runAs string
	if err := e.m.Pool.QueryRow(ctx, `SELECT run_as_user FROM jobs WHERE user_id = $1 ORDER BY id DESC LIMIT 1`, u.ID).Scan(&runAs); err != nil || runAs != "noah" {
		t.Errorf("the job runs as %q (%v), want noah", runAs, err)
	}
	// The admin's mapping wins over the claim, and a sign-in keeps it.
	if _, _, err := e.m.Store.SetPosixUser(ctx, "ada@example.com", "noah@example.com", "nkim", ""); err != nil {
		t.Fatal(err)
	}
	newSSOBrowser(t).login(e, "noah", "/jobs")
	if u, err := e.m.Store.UserByEmail(ctx, "noah@example.com"); err != nil || u.PosixUser != "nkim" || u.OIDCPosixUser != "noah" {
		t.Errorf("after a second sign-in: %q %q %v", u.PosixUser, u.OIDCPosixUser, err)
	}
	if a, src, _ := e.m.Store.ResolveAccount(ctx, &u, "nlp"); a != "nkim" || src != "user" {
		t.Errorf("with a mapping: %q from %q", a, src)
	}
}
