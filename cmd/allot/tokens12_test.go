package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// Issue 12, tokens: node tokens (API, CLI, portal), tokens made with a
// token, the API token lifetime, disabled people. Real PostgreSQL, real
// HTTP; times from the store's clock.

// agentCall calls the agents' API with a node token and returns status
// and body.
func (e *env) agentCall(method, path, token, body string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body) //nolint:errcheck
	return resp.StatusCode, b.String()
}

const testInventory = `{"hostname":"gpu01","agent_version":"test","gpu_backend":"fake","gpus":[{"index":0,"uuid":"GPU-t0","model":"A100-80GB","memory_mib":81920}]}`

func (e *env) heartbeat(token string) (int, string) {
	e.t.Helper()
	return e.agentCall("POST", "/api/agent/v1/heartbeat", token, `{"time":"`+e.m.Store.Now().UTC().Format(time.RFC3339)+`","gpus":[],"jobs":[]}`)
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.m.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (e *env) adminJSON(method, path, body string, wantStatus int, v any) {
	e.t.Helper()
	code, _, b := e.api(method, path, demo.Admin, body)
	if code != wantStatus {
		e.t.Fatalf("%s %s: %d, want %d\n%s", method, path, code, wantStatus, b)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			e.t.Fatalf("%s %s: %v\n%s", method, path, err, b)
		}
	}
}

// TestNodeTokensAPI: made through the API (admin only; bad input a
// problem with nothing stored), listed without secrets, last use
// recorded; revoking one makes the very next agent call 401, a long poll
// in progress included; rotating makes the old token 401 and the new one
// work; every change is in the audit log.
func TestNodeTokensAPI(t *testing.T) {
	e := bootQuiet(t)
	tokens, audits := e.count(`SELECT count(*) FROM node_tokens`), e.count(`SELECT count(*) FROM audit_log WHERE action LIKE 'node\_token.%'`)
	// Not an admin: refused, whoever asks.
	for _, p := range []string{demo.Engineer, demo.Lead, demo.Finance} {
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/api/v1/node-tokens", ""}, {"POST", "/api/v1/node-tokens", `{"node":"gpu01"}`},
			{"POST", "/api/v1/nodes/gpu01/rotate-token", ""}, {"DELETE", "/api/v1/node-tokens/1", ""},
			{"POST", "/api/v1/nodes/gpu01/revoke-tokens", ""},
		} {
			if code, _, b := e.api(r.method, r.path, p, r.body); code != http.StatusForbidden || !strings.Contains(string(b), "only admins") {
				t.Errorf("%s %s as %s: %d %s, want 403", r.method, r.path, p, code, b)
			}
		}
	}
	// Bad input: clear problems, nothing changes.
	for _, r := range []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"POST", "/api/v1/node-tokens", `{"node":"no-such-node"}`, 422, `unknown node \"no-such-node\"`},
		{"POST", "/api/v1/node-tokens", `{"node":""}`, 422, `"node": "is required"`},
		{"POST", "/api/v1/node-tokens", `{"nodes":"gpu01"}`, 422, `"nodes"`},
		{"POST", "/api/v1/node-tokens", ``, 400, "request body is empty"},
		{"POST", "/api/v1/nodes/no-such-node/rotate-token", ``, 422, `unknown node`},
		{"POST", "/api/v1/nodes/no-such-node/revoke-tokens", ``, 422, `unknown node`},
		{"DELETE", "/api/v1/node-tokens/999999", ``, 404, "no node token 999999"},
		{"DELETE", "/api/v1/node-tokens/allot_node_x", ``, 404, "no node token"},
		{"GET", "/api/v1/node-tokens?node=no-such-node", ``, 404, "unknown node"},
	} {
		code, hdr, b := e.api(r.method, r.path, demo.Admin, r.body)
		if code != r.status || !strings.Contains(string(b), r.want) || !strings.HasPrefix(hdr.Get("Content-Type"), "application/problem+json") {
			t.Errorf("%s %s %s: %d %s %s, want %d with %s", r.method, r.path, r.body, code, hdr.Get("Content-Type"), b, r.status, r.want)
		}
	}
	if n, a := e.count(`SELECT count(*) FROM node_tokens`), e.count(`SELECT count(*) FROM audit_log WHERE action LIKE 'node\_token.%'`); n != tokens || a != audits {
		t.Fatalf("refused requests changed something: tokens %d → %d, audit entries %d → %d", tokens, n, audits, a)
	}

	var first web.NodeTokenJSON
	e.adminJSON("POST", "/api/v1/node-tokens", `{"node":"gpu01"}`, http.StatusCreated, &first)
	if !strings.HasPrefix(first.Token, "allot_node_") || !strings.HasPrefix(first.Token, first.Prefix) || first.Status != "active" || first.CreatedBy != demo.PersonaEmail[demo.Admin] {
		t.Fatalf("created: %+v", first)
	}
	if code, b := e.agentCall("POST", "/api/agent/v1/register", first.Token, testInventory); code != http.StatusOK {
		t.Fatalf("register: %d %s", code, b)
	}
	if code, b := e.heartbeat(first.Token); code != http.StatusOK {
		t.Fatalf("heartbeat: %d %s", code, b)
	}
	// The list: prefixes, no secret; last use recorded.
	code, _, body := e.api("GET", "/api/v1/node-tokens?node=gpu01", demo.Admin, "")
	var list web.NodeTokenList
	if err := json.Unmarshal(body, &list); code != http.StatusOK || err != nil || len(list.NodeTokens) != 1 || list.NodeTokens[0].LastUsedAt == nil ||
		list.NodeTokens[0].Prefix != first.Prefix {
		t.Fatalf("list: %d %s", code, body)
	}
	if bytes.Contains(body, []byte(first.Token)) || bytes.Contains(body, []byte(`"token":`)) {
		t.Errorf("the list shows a secret: %s", body)
	}

	// Revoke: the very next call is refused.
	var rev web.NodeTokenRevoked
	e.adminJSON("DELETE", fmt.Sprintf("/api/v1/node-tokens/%d", first.ID), "", http.StatusOK, &rev)
	if !rev.Changed || len(rev.Revoked) != 1 || rev.Revoked[0].Status != "revoked" || rev.Revoked[0].RevokedBy != demo.PersonaEmail[demo.Admin] {
		t.Errorf("revoke: %+v", rev)
	}
	if code, b := e.heartbeat(first.Token); code != http.StatusUnauthorized || !strings.Contains(b, "invalid or revoked node token") {
		t.Errorf("heartbeat after revoking: %d %s, want 401", code, b)
	}
	e.adminJSON("DELETE", fmt.Sprintf("/api/v1/node-tokens/%d", first.ID), "", http.StatusOK, &rev)
	if rev.Changed {
		t.Errorf("revoking again: %+v, want changed false", rev)
	}

	// A long poll in progress ends with 401 when its token is revoked.
	var second web.NodeTokenJSON
	e.adminJSON("POST", "/api/v1/node-tokens", `{"node":"gpu01"}`, http.StatusCreated, &second)
	polled := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", e.url+"/api/agent/v1/orders?wait=30s", nil)
		req.Header.Set("Authorization", "Bearer "+second.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			polled <- 0
			return
		}
		resp.Body.Close()
		polled <- resp.StatusCode
	}()
	time.Sleep(300 * time.Millisecond) // the poll is waiting
	start := time.Now()                // stopwatch: from the rotation to the poll's end
	var rot web.NodeTokenRotated
	e.adminJSON("POST", "/api/v1/nodes/gpu01/rotate-token", "", http.StatusCreated, &rot)
	select {
	case code := <-polled:
		if code != http.StatusUnauthorized {
			t.Errorf("long poll of a rotated-out token: %d, want 401", code)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("the long poll ended %v after the rotation", d)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("the long poll of a rotated-out token did not end")
	}
	// Rotate: the old token is refused, the new one works.
	if len(rot.Revoked) != 1 || rot.Revoked[0].ID != second.ID || rot.NodeToken.Token == "" || rot.NodeToken.Node != "gpu01" {
		t.Fatalf("rotate: %+v", rot)
	}
	if code, _ := e.heartbeat(second.Token); code != http.StatusUnauthorized {
		t.Errorf("old token after rotating: %d, want 401", code)
	}
	if code, b := e.heartbeat(rot.NodeToken.Token); code != http.StatusOK {
		t.Errorf("new token after rotating: %d %s", code, b)
	}
	// Revoke all of a node's tokens.
	e.adminJSON("POST", "/api/v1/nodes/gpu01/revoke-tokens", "", http.StatusOK, &rev)
	if !rev.Changed || len(rev.Revoked) != 1 || rev.Revoked[0].ID != rot.NodeToken.ID {
		t.Errorf("revoke gpu01's tokens: %+v", rev)
	}
	if code, _ := e.heartbeat(rot.NodeToken.Token); code != http.StatusUnauthorized {
		t.Errorf("after revoking the node's tokens: %d, want 401", code)
	}
	var audit struct {
		Entries []web.AuditEntryJSON `json:"entries"`
	}
	e.adminJSON("GET", "/api/v1/audit?kind=node_token", "", http.StatusOK, &audit)
	got := map[string]int{}
	for _, a := range audit.Entries {
		got[a.Action]++
		if a.Object != "node:gpu01" || a.Actor != demo.PersonaEmail[demo.Admin] || strings.Contains(a.Note, first.Token) {
			t.Errorf("audit entry: %+v", a)
		}
	}
	if got["node_token.create"] != 2 || got["node_token.revoke"] != 2 || got["node_token.rotate"] != 1 {
		t.Errorf("audit entries: %v", got)
	}
}

// TestNodeTokenCLI: allot node-token create, list, revoke (ID, prefix,
// --node), rotate against the database; bad input exits non-zero with
// a clear message and changes nothing.
func TestNodeTokenCLI(t *testing.T) {
	e := bootQuiet(t)
	db := e.m.DatabaseURL
	nt := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(append([]string{"node-token"}, append(args, "--database-url", db, "--by", "ops@example.com")...), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, errs := nt("create", "gpu03")
	secret := strings.SplitN(out, "\n", 2)[0]
	if code != 0 || !strings.HasPrefix(secret, "allot_node_") {
		t.Fatalf("create: %d %q %q", code, out, errs)
	}
	if code, b := e.heartbeat(secret); code != http.StatusNotFound || !strings.Contains(b, "register") {
		t.Errorf("new token before registering: %d %s, want the 404 of an unregistered node", code, b)
	}
	code, out, errs = nt("list", "gpu03")
	if code != 0 || strings.Contains(out, secret) || !strings.Contains(out, secret[:17]+"…") || !strings.Contains(out, "active") || !strings.Contains(out, "ops@example.com") {
		t.Errorf("list: %d %q %q", code, out, errs)
	}
	// Bad input.
	before := e.count(`SELECT count(*) FROM node_tokens WHERE revoked_at IS NULL`)
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"rotate", "no-such-node"}, 1, `unknown node "no-such-node"`},
		{[]string{"list", "no-such-node"}, 1, `unknown node "no-such-node"`},
		{[]string{"revoke", "999999"}, 1, "no node token 999999"},
		{[]string{"revoke", "allot_node_zzzzzz"}, 1, `no node token starts with "allot_node_zzzzzz"`},
		{[]string{"revoke", "gpu03"}, 1, "must be a node token's prefix"},
		{[]string{"revoke", "--node", "no-such-node"}, 1, "unknown node"},
		{[]string{"revoke"}, 2, "usage"},
		{[]string{"revoke", "1", "--node", "gpu03"}, 2, "usage"},
		{[]string{"rotate"}, 2, "usage"},
		{[]string{"frobnicate"}, 2, "unknown subcommand"},
	} {
		code, _, errs := nt(tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.msg) {
			t.Errorf("node-token %v: exit %d %q, want %d with %q", tc.args, code, errs, tc.code, tc.msg)
		}
	}
	if n := e.count(`SELECT count(*) FROM node_tokens WHERE revoked_at IS NULL`); n != before {
		t.Fatalf("refused commands changed tokens: %d → %d active", before, n)
	}
	// Rotate, then revoke by prefix (as listed) and by node.
	code, out, errs = nt("rotate", "gpu03")
	rotated := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(rotated, "allot_node_") || !strings.Contains(errs, "revoked node token") {
		t.Fatalf("rotate: %d %q %q", code, out, errs)
	}
	if code, _ := e.heartbeat(secret); code != http.StatusUnauthorized {
		t.Errorf("rotated-out token: %d, want 401", code)
	}
	if code, out, errs := nt("revoke", rotated[:17]+"…"); code != 0 || !strings.Contains(out, "revoked node token") {
		t.Errorf("revoke by prefix: %d %q %q", code, out, errs)
	}
	if code, _ := e.heartbeat(rotated); code != http.StatusUnauthorized {
		t.Errorf("revoked token: %d, want 401", code)
	}
	if code, out, _ := nt("revoke", "--node", "gpu03"); code != 0 || !strings.Contains(out, "no active node tokens") {
		t.Errorf("revoke --node with none left: %d %q", code, out)
	}
	if n := e.count(`SELECT count(*) FROM audit_log WHERE action LIKE 'node\_token.%' AND actor = 'ops@example.com' AND object = 'node:gpu03'`); n != 3 {
		t.Errorf("audit entries of the CLI: %d, want 3 (create, rotate, revoke)", n)
	}
}

var nodeSecretRE = regexp.MustCompile(`data-testid="node-token-secret">(allot_node_[A-Za-z0-9_-]+)<`)

// TestNodeTokensPortal: the admin page lists tokens without secrets,
// makes one (shown once), asks before revoking and rotating, and does
// both; others are refused.
func TestNodeTokensPortal(t *testing.T) {
	e := bootQuiet(t)
	if status, _ := e.login(demo.Engineer).get("/admin/node-tokens"); status != http.StatusForbidden {
		t.Errorf("engineer: %d, want 403", status)
	}
	br := e.login(demo.Admin)
	status, page := br.get("/admin/node-tokens")
	if status != http.StatusOK || !strings.Contains(page, `data-testid="node-token-form"`) || !strings.Contains(page, `data-testid="tab-node-tokens"`) {
		t.Fatalf("page: %d\n%s", status, page)
	}
	if status, body := br.post("/admin/node-tokens", page, url.Values{"node": {"no-such-node"}}); status != http.StatusUnprocessableEntity ||
		!strings.Contains(body, `data-testid="error-node"`) {
		t.Errorf("unknown node: %d", status)
	}
	status, body := br.post("/admin/node-tokens", page, url.Values{"node": {"gpu04"}})
	m := nodeSecretRE.FindStringSubmatch(body)
	if status != http.StatusCreated || m == nil {
		t.Fatalf("create: %d\n%s", status, body)
	}
	secret := m[1]
	_, page = br.get("/admin/node-tokens")
	if strings.Contains(page, secret) || !strings.Contains(page, secret[:17]+"…") {
		t.Errorf("the list shows the secret, or not the prefix")
	}
	var id int64
	if err := e.m.Pool.QueryRow(context.Background(), `SELECT id FROM node_tokens WHERE node = 'gpu04'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	// Revoke: without confirm=yes, the question and nothing revoked.
	path := fmt.Sprintf("/admin/node-tokens/%d/revoke", id)
	status, body = br.post(path, page, url.Values{})
	if status != http.StatusOK || !strings.Contains(body, `data-testid="confirm"`) || !strings.Contains(body, "Revoke node token") {
		t.Fatalf("revoke without confirm: %d\n%s", status, body)
	}
	if code, _ := e.heartbeat(secret); code == http.StatusUnauthorized {
		t.Fatal("asking revoked the token")
	}
	status, body = br.post(path, body, url.Values{"confirm": {"yes"}})
	if status != http.StatusOK || !strings.Contains(body, fmt.Sprintf("Node token %d is revoked.", id)) {
		t.Errorf("revoke: %d", status)
	}
	if code, _ := e.heartbeat(secret); code != http.StatusUnauthorized {
		t.Errorf("revoked from the portal: %d, want 401", code)
	}
	if !regexp.MustCompile(fmt.Sprintf(`(?s)data-testid="node-token-%d".*?data-testid="node-token-status">revoked`, id)).MatchString(body) {
		t.Errorf("revoked token not shown as revoked")
	}
	// Rotate: asks, then shows the new secret once; the old one is refused.
	status, body = br.post("/admin/node-tokens", body, url.Values{"node": {"gpu04"}})
	old := nodeSecretRE.FindStringSubmatch(body)
	if status != http.StatusCreated || old == nil {
		t.Fatalf("second token: %d", status)
	}
	status, body = br.post("/admin/node-tokens/rotate", body, url.Values{"node": {"gpu04"}})
	if status != http.StatusOK || !strings.Contains(body, "Rotate the token of gpu04?") {
		t.Fatalf("rotate without confirm: %d", status)
	}
	status, body = br.post("/admin/node-tokens/rotate", body, url.Values{"node": {"gpu04"}, "confirm": {"yes"}})
	m = nodeSecretRE.FindStringSubmatch(body)
	if status != http.StatusCreated || m == nil || !strings.Contains(body, `data-testid="rotated-out"`) {
		t.Fatalf("rotate: %d", status)
	}
	if code, _ := e.heartbeat(old[1]); code != http.StatusUnauthorized {
		t.Errorf("rotated-out token: %d", code)
	}
	if code, _ := e.heartbeat(m[1]); code == http.StatusUnauthorized {
		t.Errorf("rotated-in token refused")
	}
}

// TestTokenChildrenRevokedWithParent: a token made with a token (not a
// browser session) is revoked with it, and so are the tokens made with
// that one; a token made in the portal has no parent.
func TestTokenChildrenRevokedWithParent(t *testing.T) {
	e := bootQuiet(t)
	mint := func(with, name string) web.TokenJSON {
		t.Helper()
		req, _ := http.NewRequest("POST", e.url+"/api/v1/tokens", strings.NewReader(`{"name":"`+name+`"}`))
		req.Header.Set("Authorization", "Bearer "+with)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var tok web.TokenJSON
		if err := json.NewDecoder(resp.Body).Decode(&tok); resp.StatusCode != http.StatusCreated || err != nil {
			t.Fatalf("minting %s: %d %v", name, resp.StatusCode, err)
		}
		return tok
	}
	parent := mint(e.tokens[demo.Engineer], "parent")
	child := mint(parent.Token, "child")
	grandchild := mint(child.Token, "grandchild")
	sibling := mint(e.tokens[demo.Engineer], "sibling")
	if n := e.count(`SELECT count(*) FROM api_tokens WHERE id = $1 AND parent_token_id = $2`, grandchild.ID, child.ID); n != 1 ||
		child.ParentID != parent.ID || parent.ParentID == 0 {
		t.Fatalf("parents not recorded: child's %d (want %d), parent's %d", child.ParentID, parent.ID, parent.ParentID)
	}
	if code := e.bearer("DELETE", fmt.Sprintf("/api/v1/tokens/%d", parent.ID), sibling.Token); code != http.StatusNoContent {
		t.Fatalf("revoke parent: %d", code)
	}
	for name, tok := range map[string]string{"parent": parent.Token, "child": child.Token, "grandchild": grandchild.Token} {
		if code := e.bearer("GET", "/api/v1/me", tok); code != http.StatusUnauthorized {
			t.Errorf("%s after revoking the parent: %d, want 401", name, code)
		}
	}
	for name, tok := range map[string]string{"sibling": sibling.Token, "the persona's own": e.tokens[demo.Engineer]} {
		if code := e.bearer("GET", "/api/v1/me", tok); code != http.StatusOK {
			t.Errorf("%s token: %d, want 200", name, code)
		}
	}
	// A portal token has no parent.
	br := e.login(demo.Engineer)
	_, page := br.get("/tokens")
	if status, _ := br.post("/tokens", page, url.Values{"name": {"from the portal"}}); status != http.StatusCreated {
		t.Fatalf("portal token: %d", status)
	}
	if n := e.count(`SELECT count(*) FROM api_tokens WHERE name = 'from the portal' AND parent_token_id IS NULL`); n != 1 {
		t.Errorf("portal token has a parent")
	}
}

// TestAPITokenDefaultTTL: with a lifetime (allot server's default, 90
// days), a token made without an expiry gets now + 90 days, in the API
// and the portal; a shorter one is kept; a longer one is refused and
// nothing stored. The flag reads days and 0.
func TestAPITokenDefaultTTL(t *testing.T) {
	e := bootMain(t, &Main{Config: Config{DevMode: true, APITokenTTL: defaultAPITokenTTL}}).withTokens()
	now := e.m.Store.Now()
	code, _, b := e.api("POST", "/api/v1/tokens", demo.Engineer, `{"name":"default"}`)
	var tok web.TokenJSON
	if err := json.Unmarshal(b, &tok); code != http.StatusCreated || err != nil || tok.ExpiresAt == nil {
		t.Fatalf("default: %d %s", code, b)
	}
	if d := tok.ExpiresAt.Sub(now.Add(90 * 24 * time.Hour)); d < -time.Minute || d > time.Minute {
		t.Errorf("default expiry %v, want about %v", tok.ExpiresAt, now.Add(90*24*time.Hour))
	}
	short := now.Add(7 * 24 * time.Hour).UTC().Truncate(time.Second)
	code, _, b = e.api("POST", "/api/v1/tokens", demo.Engineer, `{"name":"short","expires_at":"`+short.Format(time.RFC3339)+`"}`)
	if err := json.Unmarshal(b, &tok); code != http.StatusCreated || err != nil || tok.ExpiresAt == nil || !tok.ExpiresAt.Equal(short) {
		t.Errorf("shorter: %d %s", code, b)
	}
	before := e.tokenCount()
	long := now.Add(91 * 24 * time.Hour).UTC().Format(time.RFC3339)
	code, _, b = e.api("POST", "/api/v1/tokens", demo.Engineer, `{"name":"long","expires_at":"`+long+`"}`)
	if code != http.StatusUnprocessableEntity || !strings.Contains(string(b), "must be at most 90 days from now") {
		t.Errorf("longer: %d %s", code, b)
	}
	if e.tokenCount() != before {
		t.Errorf("a refused token was stored")
	}
	// The portal: empty expiry means 90 days, and says so.
	br := e.login(demo.Engineer)
	_, page := br.get("/tokens")
	if !strings.Contains(page, `data-testid="token-default-expiry"`) || !strings.Contains(page, "90 days from now") {
		t.Errorf("the form does not say the default lifetime")
	}
	if status, _ := br.post("/tokens", page, url.Values{"name": {"portal default"}}); status != http.StatusCreated {
		t.Fatalf("portal: %d", status)
	}
	if n := e.count(`SELECT count(*) FROM api_tokens WHERE name = 'portal default' AND expires_at > $1 AND expires_at <= $2`,
		now.Add(89*24*time.Hour), now.Add(90*24*time.Hour+time.Minute)); n != 1 {
		t.Errorf("portal token without expiry does not expire in 90 days")
	}
	// The flag.
	for in, want := range map[string]time.Duration{"90d": 90 * 24 * time.Hour, "0": 0, "720h": 720 * time.Hour, "1d": 24 * time.Hour} {
		if d, err := parseTTL(in); err != nil || d != want {
			t.Errorf("parseTTL(%q) = %v, %v; want %v", in, d, err, want)
		}
	}
	for _, in := range []string{"-1d", "soon", "-5h", ""} {
		if _, err := parseTTL(in); err == nil {
			t.Errorf("parseTTL(%q) accepted", in)
		}
	}
	if code := run([]string{"server", "--api-token-ttl", "forever"}, &bytes.Buffer{}, &bytes.Buffer{}); code != 2 {
		t.Errorf("server with a bad --api-token-ttl: exit %d, want 2", code)
	}
}

// TestDisableUser: an admin disables a person (API, CLI, portal): their
// tokens answer 401, their session cookie no longer works, they cannot
// log in again until enabled; non-admins are refused, bad references are
// clear errors, an admin cannot disable themselves; all audited.
func TestDisableUser(t *testing.T) {
	e := bootQuiet(t)
	noah := demo.PersonaEmail[demo.Engineer]
	br := e.login(demo.Engineer)
	if status, _ := br.get("/jobs"); status != http.StatusOK {
		t.Fatalf("session before: %d", status)
	}
	if code, _, b := e.api("POST", "/api/v1/users/"+noah+"/disable", demo.Lead, ""); code != http.StatusForbidden {
		t.Errorf("lead disabling: %d %s", code, b)
	}
	for _, tc := range []struct {
		path   string
		status int
		want   string
	}{
		{"/api/v1/users/nobody@example.com/disable", 404, `no user \"nobody@example.com\"`},
		{"/api/v1/users/999999/disable", 404, "no user"},
		{"/api/v1/users/noah/disable", 422, "must be a user's ID or email address"},
		{"/api/v1/users/" + demo.PersonaEmail[demo.Admin] + "/disable", 422, "you cannot disable your own account"},
	} {
		if code, _, b := e.api("POST", tc.path, demo.Admin, ""); code != tc.status || !strings.Contains(string(b), tc.want) {
			t.Errorf("POST %s: %d %s, want %d with %s", tc.path, code, b, tc.status, tc.want)
		}
	}
	if code, _, b := e.api("POST", "/api/v1/users/"+noah+"/disable", demo.Admin, `{"reason":"x"}`); code != http.StatusUnprocessableEntity {
		t.Errorf("unknown field: %d %s", code, b)
	}
	if code, _, _ := e.api("GET", "/api/v1/me", demo.Engineer, ""); code != http.StatusOK || e.count(`SELECT count(*) FROM audit_log WHERE action LIKE 'user.%'`) != 0 {
		t.Fatal("refused requests changed something")
	}

	// Disable through the CLI.
	userCLI := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(append([]string{"user"}, append(args, "--server", e.url, "--token", e.tokens[demo.Admin])...), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, errs := userCLI("disable", noah, "--note", "left the team")
	if code != 0 || !strings.Contains(out, "disabled "+noah) || !strings.Contains(out, "1 session(s) ended") {
		t.Fatalf("allot user disable: %d %q %q", code, out, errs)
	}
	if code, _, _ := e.api("GET", "/api/v1/me", demo.Engineer, ""); code != http.StatusUnauthorized {
		t.Errorf("disabled person's token: %d, want 401", code)
	}
	resp, err := (&http.Client{Jar: br.c.Jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Get(e.url + "/jobs")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
		t.Errorf("disabled person's session: %d → %q, want a redirect to the login page", resp.StatusCode, resp.Header.Get("Location"))
	}
	// They cannot log in again.
	jar, _ := cookiejar.New(nil)
	again := &browser{e: e, c: &http.Client{Jar: jar}}
	_, page := again.get("/login")
	if status, body := again.post("/login/dev", page, url.Values{"persona": {demo.Engineer}}); status != http.StatusForbidden || !strings.Contains(body, "disabled") {
		t.Errorf("login of a disabled person: %d", status)
	}
	if code, out, _ := userCLI("disable", noah); code != 0 || !strings.Contains(out, "already disabled") {
		t.Errorf("disabling again: %d %q", code, out)
	}
	if code, _, errs := userCLI("disable", "nobody@example.com"); code != 1 || !strings.Contains(errs, "no user") {
		t.Errorf("CLI unknown user: %d %q", code, errs)
	}
	// The portal's people page shows it and enables them again.
	adm := e.login(demo.Admin)
	_, page = adm.get("/admin/users")
	if !strings.Contains(page, "disabled ") || !strings.Contains(page, `data-testid="tab-users"`) {
		t.Errorf("people page does not show the disabled person")
	}
	status, body := adm.post("/admin/users/"+noah+"/enable", page, url.Values{})
	if status != http.StatusOK || !strings.Contains(body, "Enabled "+noah) {
		t.Errorf("enable from the portal: %d", status)
	}
	if status, _ := e.login(demo.Engineer).get("/jobs"); status != http.StatusOK {
		t.Errorf("login after enabling: %d", status)
	}
	if code, _, _ := e.api("GET", "/api/v1/me", demo.Engineer, ""); code != http.StatusUnauthorized {
		t.Errorf("a token revoked by disabling works again after enabling")
	}
	// Disable from the portal: it asks first.
	_, page = adm.get("/admin/users")
	status, body = adm.post("/admin/users/"+noah+"/disable", page, url.Values{})
	if status != http.StatusOK || !strings.Contains(body, "Disable "+noah+"?") {
		t.Fatalf("disable without confirm: %d", status)
	}
	if status, _ := e.login(demo.Engineer).get("/jobs"); status != http.StatusOK {
		t.Fatal("asking disabled the person")
	}
	status, body = adm.post("/admin/users/"+noah+"/disable", body, url.Values{"confirm": {"yes"}})
	if status != http.StatusOK || !strings.Contains(body, "Disabled "+noah) {
		t.Errorf("disable from the portal: %d", status)
	}
	var users web.UserList
	e.adminJSON("GET", "/api/v1/users", "", http.StatusOK, &users)
	for _, u := range users.Users {
		if (u.Email == noah) != u.Disabled {
			t.Errorf("users list: %s disabled=%v", u.Email, u.Disabled)
		}
	}
	if n := e.count(`SELECT count(*) FROM audit_log WHERE object = $1 AND action IN ('user.disable', 'user.enable')`, "user:"+noah); n != 3 {
		t.Errorf("audit entries: %d, want 3", n)
	}
	if n := e.count(`SELECT count(*) FROM audit_log WHERE action = 'user.disable' AND note LIKE '%left the team%'`); n != 1 {
		t.Errorf("the CLI's note is not in the audit log")
	}
}

// TestOIDCLoginOfDisabledUser: a disabled person signing in through the
// identity provider is refused with a clear message and gets no session.
func TestOIDCLoginOfDisabledUser(t *testing.T) {
	e := bootSSO(t, startProvider(t)).withTokens()
	if loc := newSSOBrowser(t).login(e, "noah", "/jobs"); loc != "/jobs" && !strings.HasSuffix(loc, "/jobs") {
		t.Fatalf("first sign-in went to %q", loc)
	}
	e.adminJSON("POST", "/api/v1/users/"+demo.PersonaEmail[demo.Engineer]+"/disable", `{"note":"test"}`, http.StatusOK, nil)
	sessions := sessionCount(t, e)
	b := newSSOBrowser(t)
	s := b.do("GET", b.authorize(b.start(e, "/jobs"), "noah", testPassword, "login"), nil)
	if s.status != http.StatusForbidden || !strings.Contains(s.body, "disabled") || !strings.Contains(s.body, "ask an admin") {
		t.Errorf("sign-in of a disabled person: %d\n%s", s.status, s.body)
	}
	if n := sessionCount(t, e); n != sessions {
		t.Errorf("sessions %d → %d", sessions, n)
	}
}
