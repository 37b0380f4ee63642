package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

func (e *env) tokenCount() int {
	e.t.Helper()
	var n int
	if err := e.m.Pool.QueryRow(context.Background(), "SELECT count(*) FROM api_tokens").Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// bearer calls the API with a raw token.
func (e *env) bearer(method, path, token string) int {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

var secretRE = regexp.MustCompile(`data-testid="token-secret">(allot_[A-Za-z0-9_-]+)<`)

// TestTokensPage: create (bad input refused with field errors, nothing
// stored), the secret shown once and working, listed, revoked from the
// page and refused afterwards.
func TestTokensPage(t *testing.T) {
	e := boot(t)
	br := e.login(demo.Engineer)
	_, page := br.get("/tokens")
	if !strings.Contains(page, `data-testid="token-form"`) || !strings.Contains(page, "dev persona") && !strings.Contains(page, "test") {
		t.Fatalf("tokens page:\n%s", page)
	}
	before := e.tokenCount()
	for _, tc := range []struct{ name, expires, field, msg string }{
		{"", "", "name", "is required"},
		{"   ", "", "name", "is required"},
		{strings.Repeat("x", 101), "", "name", "at most 100"},
		{"laptop", "2020-01-01", "expires_at", "must be in the future"},
		{"laptop", "next week", "expires_at", "must be a date"},
	} {
		status, body := br.post("/tokens", page, url.Values{"name": {tc.name}, "expires": {tc.expires}})
		if status != http.StatusUnprocessableEntity || !strings.Contains(body, `data-testid="error-`+tc.field+`"`) || !strings.Contains(body, tc.msg) {
			t.Errorf("name %q expires %q: %d, want 422 with %s %q", tc.name, tc.expires, status, tc.field, tc.msg)
		}
	}
	if n := e.tokenCount(); n != before {
		t.Fatalf("bad input stored tokens: %d → %d", before, n)
	}
	tomorrow := clock.Now().UTC().AddDate(0, 0, 1).Format(time.DateOnly)
	status, body := br.post("/tokens", page, url.Values{"name": {"laptop CLI"}, "expires": {tomorrow}})
	m := secretRE.FindStringSubmatch(body)
	if status != http.StatusCreated || m == nil {
		t.Fatalf("create: %d\n%s", status, body)
	}
	secret := m[1]
	if code := e.bearer("GET", "/api/v1/me", secret); code != http.StatusOK {
		t.Fatalf("new token: %d", code)
	}
	_, page = br.get("/tokens")
	if strings.Contains(page, secret) || !strings.Contains(page, "laptop CLI") || !strings.Contains(page, tomorrow) {
		t.Errorf("list after create shows the secret again or lacks the token")
	}
	var id int64
	if err := e.m.Pool.QueryRow(context.Background(), "SELECT id FROM api_tokens WHERE name = 'laptop CLI'").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if status, _ := br.post(fmt.Sprintf("/tokens/%d/revoke", id), page, url.Values{}); status != http.StatusOK {
		t.Fatalf("revoke: %d", status)
	}
	if code := e.bearer("GET", "/api/v1/me", secret); code != http.StatusUnauthorized {
		t.Errorf("revoked token: %d, want 401", code)
	}
	_, page = br.get("/tokens")
	if !regexp.MustCompile(fmt.Sprintf(`(?s)data-testid="token-%d".*?data-testid="token-status">revoked<`, id)).MatchString(page) {
		t.Errorf("revoked token not shown as revoked")
	}
	// Someone else's token cannot be revoked from the page.
	var nadiaTok int64
	if err := e.m.Pool.QueryRow(context.Background(), "SELECT t.id FROM api_tokens t JOIN users u ON u.id = t.user_id WHERE u.email = $1",
		demo.PersonaEmail[demo.Lead]).Scan(&nadiaTok); err != nil {
		t.Fatal(err)
	}
	if status, _ := br.post(fmt.Sprintf("/tokens/%d/revoke", nadiaTok), page, url.Values{}); status != http.StatusNotFound {
		t.Errorf("revoking nadia's token as noah: %d, want 404", status)
	}
	if code, _, _ := e.api("GET", "/api/v1/me", demo.Lead, ""); code != http.StatusOK {
		t.Errorf("nadia's token after noah's attempt: %d", code)
	}
}

// TestTokensAPI: create, list (own only), revoke (own; admin any, audited),
// bad input 422 with nothing stored, expired and revoked tokens 401.
func TestTokensAPI(t *testing.T) {
	e := boot(t)
	before := e.tokenCount()
	for _, body := range []struct{ json, field string }{
		{`{"name":""}`, "name"},
		{`{"name":"` + strings.Repeat("n", 101) + `"}`, "name"},
		{`{"name":"ci","expires_at":"2001-01-01T00:00:00Z"}`, "expires_at"},
		{`{"name":"ci","expires_at":"soon"}`, "expires_at"},
		{`{"name":"ci","scopes":["all"]}`, "scopes"},
		{`{"name":7}`, "name"},
	} {
		code, _, b := e.api("POST", "/api/v1/tokens", demo.Engineer, body.json)
		var p web.Problem
		if err := json.Unmarshal(b, &p); code != http.StatusUnprocessableEntity || err != nil || p.Errors[body.field] == "" {
			t.Errorf("%s: %d %s, want 422 on %s", body.json, code, b, body.field)
		}
	}
	if n := e.tokenCount(); n != before {
		t.Fatalf("bad input stored tokens: %d → %d", before, n)
	}
	exp := clock.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
	code, hdr, b := e.api("POST", "/api/v1/tokens", demo.Engineer, `{"name":"ci","expires_at":"`+exp.Format(time.RFC3339)+`"}`)
	var tok web.TokenJSON
	if err := json.Unmarshal(b, &tok); code != http.StatusCreated || err != nil || !strings.HasPrefix(tok.Token, "allot_") ||
		tok.Status != "active" || tok.ExpiresAt == nil || !tok.ExpiresAt.Equal(exp) || hdr.Get("Location") != fmt.Sprintf("/api/v1/tokens/%d", tok.ID) {
		t.Fatalf("create: %d %s", code, b)
	}
	if c := e.bearer("GET", "/api/v1/jobs", tok.Token); c != http.StatusOK {
		t.Errorf("new token: %d", c)
	}
	// Lists are per person, and never show secrets.
	code, _, b = e.api("GET", "/api/v1/tokens", demo.Engineer, "")
	var list web.TokenList
	if err := json.Unmarshal(b, &list); code != 200 || err != nil || len(list.Tokens) != 2 || strings.Contains(string(b), tok.Token) {
		t.Fatalf("noah's list: %d %s", code, b)
	}
	code, _, b = e.api("GET", "/api/v1/tokens", demo.Lead, "")
	if err := json.Unmarshal(b, &list); code != 200 || err != nil || len(list.Tokens) != 1 || list.Tokens[0].ID == tok.ID {
		t.Fatalf("nadia's list: %d %s", code, b)
	}
	// Nadia cannot revoke noah's token; an admin can, and it is audited.
	path := fmt.Sprintf("/api/v1/tokens/%d", tok.ID)
	if code, _, _ := e.api("DELETE", path, demo.Lead, ""); code != http.StatusNotFound {
		t.Errorf("nadia revoking noah's token: %d, want 404", code)
	}
	if c := e.bearer("GET", "/api/v1/jobs", tok.Token); c != http.StatusOK {
		t.Errorf("token after nadia's attempt: %d", c)
	}
	if code, _, b := e.api("DELETE", path, demo.Admin, ""); code != http.StatusNoContent {
		t.Errorf("admin revoke: %d %s", code, b)
	}
	if c := e.bearer("GET", "/api/v1/jobs", tok.Token); c != http.StatusUnauthorized {
		t.Errorf("revoked token: %d, want 401", c)
	}
	var audited int
	e.m.Pool.QueryRow(context.Background(), "SELECT count(*) FROM audit_log WHERE action = 'token.revoke' AND actor = $1 AND object = $2", //nolint:errcheck
		demo.PersonaEmail[demo.Admin], fmt.Sprintf("token:%d", tok.ID)).Scan(&audited)
	if audited != 1 {
		t.Errorf("admin revoke audited %d times, want 1", audited)
	}
	// Own revoke; then the revoked token cannot revoke anything.
	code, _, b = e.api("POST", "/api/v1/tokens", demo.Lead, `{"name":"short-lived"}`)
	var own web.TokenJSON
	if err := json.Unmarshal(b, &own); code != http.StatusCreated || err != nil {
		t.Fatalf("create: %d %s", code, b)
	}
	if c := e.bearer("DELETE", fmt.Sprintf("/api/v1/tokens/%d", own.ID), own.Token); c != http.StatusNoContent {
		t.Errorf("revoking itself: %d", c)
	}
	if c := e.bearer("GET", "/api/v1/tokens", own.Token); c != http.StatusUnauthorized {
		t.Errorf("self-revoked token: %d, want 401", c)
	}
	// An expired token is refused.
	code, _, b = e.api("POST", "/api/v1/tokens", demo.Finance, `{"name":"expiring","expires_at":"`+clock.Now().Add(time.Hour).UTC().Format(time.RFC3339)+`"}`)
	var expiring web.TokenJSON
	if err := json.Unmarshal(b, &expiring); code != http.StatusCreated || err != nil {
		t.Fatalf("create: %d %s", code, b)
	}
	if c := e.bearer("GET", "/api/v1/me", expiring.Token); c != http.StatusOK {
		t.Fatalf("before expiry: %d", c)
	}
	if _, err := e.m.Pool.Exec(context.Background(), "UPDATE api_tokens SET expires_at = $2::timestamptz - interval '1 second' WHERE id = $1", expiring.ID, e.m.Store.Now()); err != nil {
		t.Fatal(err)
	}
	if c := e.bearer("GET", "/api/v1/me", expiring.Token); c != http.StatusUnauthorized {
		t.Errorf("expired token: %d, want 401", c)
	}
	code, _, b = e.api("GET", "/api/v1/tokens", demo.Finance, "")
	if err := json.Unmarshal(b, &list); code != 200 || err != nil || list.Tokens[0].Status != "expired" {
		t.Errorf("expired token listed as: %s", b)
	}
	// A browser session may read the API but not create tokens through it
	// (no CSRF exposure): that needs a token.
	br := e.login(demo.Engineer)
	resp, err := br.c.Post(e.url+"/api/v1/tokens", "application/json", strings.NewReader(`{"name":"via cookie"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /api/v1/tokens with a session cookie: %d, want 401", resp.StatusCode)
	}
}

// TestTokenCLI: `allot token create/list/revoke`, bad input a non-zero
// exit with the field named, and nothing stored.
func TestTokenCLI(t *testing.T) {
	e := boot(t)
	before := e.tokenCount()
	// The `token` command's flags follow its subcommand.
	full := func(persona string, sub string, args ...string) (int, string, string) {
		var out, errb strings.Builder
		rc := run(append([]string{"token", sub, "--server", e.url, "--token", e.tokens[persona]}, args...), &out, &errb)
		return rc, out.String(), errb.String()
	}
	for _, args := range [][]string{{"--name", ""}, {"--name", "x", "--expires", "2001-01-01"}, {"--name", "x", "--expires", "someday"}} {
		rc, _, errOut := full(demo.Engineer, "create", args...)
		if rc != 1 || !strings.Contains(errOut, "name: is required") && !strings.Contains(errOut, "expires_at: must be") {
			t.Errorf("token create %v: rc %d %q", args, rc, errOut)
		}
	}
	if e.tokenCount() != before {
		t.Fatal("bad input stored a token")
	}
	rc, out, errOut := full(demo.Engineer, "create", "--name", "laptop", "--expires", clock.Now().UTC().AddDate(0, 1, 0).Format(time.DateOnly))
	secret := strings.TrimSpace(out)
	if rc != 0 || !strings.HasPrefix(secret, "allot_") || !strings.Contains(errOut, "shown only this once") {
		t.Fatalf("token create: rc %d %q %q", rc, out, errOut)
	}
	if c := e.bearer("GET", "/api/v1/me", secret); c != http.StatusOK {
		t.Fatalf("new token: %d", c)
	}
	rc, out, _ = full(demo.Engineer, "list")
	if rc != 0 || !strings.Contains(out, "laptop") || !strings.Contains(out, "active") || strings.Contains(out, secret) {
		t.Fatalf("token list: rc %d\n%s", rc, out)
	}
	var id int64
	if err := e.m.Pool.QueryRow(context.Background(), "SELECT id FROM api_tokens WHERE name = 'laptop'").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if rc, _, errOut := full(demo.Lead, "revoke", fmt.Sprint(id)); rc != 1 || !strings.Contains(errOut, "no API token") {
		t.Errorf("nadia revoking noah's token: rc %d %q", rc, errOut)
	}
	if rc, out, _ := full(demo.Engineer, "revoke", fmt.Sprint(id)); rc != 0 || !strings.Contains(out, "revoked") {
		t.Errorf("token revoke: rc %d %q", rc, out)
	}
	if c := e.bearer("GET", "/api/v1/me", secret); c != http.StatusUnauthorized {
		t.Errorf("revoked token: %d", c)
	}
	if rc, _, _ := full(demo.Engineer, "revoke", "abc"); rc != 2 {
		t.Errorf("revoke abc: rc %d, want 2", rc)
	}
}

// TestTokensDoNotOutliveTheirMaker: a token made with an expiring token
// expires with it at the latest (no expiry becomes the parent's, a later
// one is a 422 that stores nothing); a token without expiry may make
// tokens without expiry.
func TestTokensDoNotOutliveTheirMaker(t *testing.T) {
	e := boot(t)
	post := func(token, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest("POST", e.url+"/api/v1/tokens", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	exp := clock.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
	code, _, b := e.api("POST", "/api/v1/tokens", demo.Engineer, `{"name":"parent","expires_at":"`+exp.Format(time.RFC3339)+`"}`)
	var parent web.TokenJSON
	if err := json.Unmarshal(b, &parent); code != http.StatusCreated || err != nil {
		t.Fatalf("parent: %d %s", code, b)
	}
	before := e.tokenCount()
	for _, body := range []string{
		`{"name":"later","expires_at":"` + exp.Add(time.Second).Format(time.RFC3339) + `"}`,
		`{"name":"much later","expires_at":"2099-01-01"}`,
	} {
		code, b := post(parent.Token, body)
		var p web.Problem
		if err := json.Unmarshal(b, &p); code != http.StatusUnprocessableEntity || err != nil || !strings.Contains(p.Errors["expires_at"], "when the token making this request expires") {
			t.Errorf("%s: %d %s, want 422 on expires_at", body, code, b)
		}
	}
	if n := e.tokenCount(); n != before {
		t.Fatalf("refused requests stored tokens: %d → %d", before, n)
	}
	var child web.TokenJSON
	code, b = post(parent.Token, `{"name":"forever"}`)
	if err := json.Unmarshal(b, &child); code != http.StatusCreated || err != nil || child.ExpiresAt == nil || !child.ExpiresAt.Equal(exp) {
		t.Errorf("no expiry asked: %d %s, want the parent's expiry %s", code, b, exp)
	}
	earlier := exp.Add(-time.Hour)
	code, b = post(parent.Token, `{"name":"earlier","expires_at":"`+earlier.Format(time.RFC3339)+`"}`)
	if err := json.Unmarshal(b, &child); code != http.StatusCreated || err != nil || child.ExpiresAt == nil || !child.ExpiresAt.Equal(earlier) {
		t.Errorf("earlier expiry: %d %s", code, b)
	}
	// The persona's token never expires: so may the tokens it makes.
	code, _, b = e.api("POST", "/api/v1/tokens", demo.Engineer, `{"name":"unbounded"}`)
	if err := json.Unmarshal(b, &child); code != http.StatusCreated || err != nil || child.ExpiresAt != nil {
		t.Errorf("from a token without expiry: %d %s", code, b)
	}
}
