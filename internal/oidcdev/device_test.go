package oidcdev

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
)

// deviceFixture is a provider with a public CLI client that may use the
// device grant ("cli"), a confidential one that may not ("app"), and a
// clock the test moves (shift).
type deviceFixture struct {
	*fixture
	p     *Provider
	shift atomic.Int64
}

func newDeviceFixture(t *testing.T) *deviceFixture {
	f := &deviceFixture{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.p.Handler().ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	var err error
	// Protocol time: token expiry is checked against the real clock by
	// whoever verifies a token (see package clock), so the provider's clock
	// is the real one, shifted forward only to expire codes and tokens.
	f.p, err = New(Config{Issuer: srv.URL, Users: DemoUsers("pw"), DeviceInterval: time.Second, DeviceCodeTTL: time.Minute,
		RefreshTTL: time.Hour, Now: func() time.Time { return time.Now().Add(time.Duration(f.shift.Load())) }, // OIDC tokens live on the real clock
		Clients: []Client{{ID: "app", Secret: "s3", RedirectURIs: []string{"http://127.0.0.1/cb"}}, {ID: "cli", DeviceGrant: true}}})
	if err != nil {
		t.Fatal(err)
	}
	f.fixture = &fixture{t: t, srv: srv, c: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	return f
}

// advance moves the provider's clock.
func (f *deviceFixture) advance(d time.Duration) { f.shift.Add(int64(d)) }

func (f *deviceFixture) post(path string, v url.Values, auth ...string) (int, map[string]any) {
	f.t.Helper()
	resp, body := f.do("POST", path, v, auth...)
	var m map[string]any
	if resp.StatusCode != http.StatusOK || path != "/revoke" {
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			f.t.Fatalf("POST %s: %d %q", path, resp.StatusCode, body)
		}
	}
	return resp.StatusCode, m
}

// start asks for a device code as cli.
func (f *deviceFixture) start(scope string) map[string]any {
	f.t.Helper()
	st, m := f.post("/device_authorization", url.Values{"client_id": {"cli"}, "scope": {scope}})
	if st != http.StatusOK {
		f.t.Fatalf("device authorization: %d %v", st, m)
	}
	return m
}

func (f *deviceFixture) poll(d map[string]any) (int, map[string]any) {
	f.t.Helper()
	return f.post("/token", url.Values{"grant_type": {grantDeviceCode}, "client_id": {"cli"}, "device_code": {d["device_code"].(string)}})
}

// answer submits the verification page as a browser would: the code as
// typed, the credentials and the button.
func (f *deviceFixture) answer(userCode, user, password, action string) (int, string) {
	f.t.Helper()
	resp, body := f.do("POST", "/device", url.Values{"user_code": {userCode}, "username": {user}, "password": {password}, "action": {action}})
	return resp.StatusCode, body
}

func TestDeviceGrant(t *testing.T) {
	f := newDeviceFixture(t)
	resp, body := f.do("GET", "/.well-known/openid-configuration", nil)
	var disc map[string]any
	json.Unmarshal([]byte(body), &disc) //nolint:errcheck
	if resp.StatusCode != 200 || disc["device_authorization_endpoint"] != f.srv.URL+"/device_authorization" ||
		!strings.Contains(body, grantDeviceCode) || !strings.Contains(body, `"refresh_token"`) || disc["revocation_endpoint"] != f.srv.URL+"/revoke" {
		t.Fatalf("discovery: %s", body)
	}

	d := f.start("openid profile email offline_access")
	code := d["user_code"].(string)
	if !regexp.MustCompile(`^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$`).MatchString(code) ||
		d["verification_uri"] != f.srv.URL+"/device" || d["verification_uri_complete"] != f.srv.URL+"/device?user_code="+code ||
		d["interval"] != 1.0 || d["expires_in"] != 60.0 || len(d["device_code"].(string)) < 40 {
		t.Fatalf("device authorization: %v", d)
	}
	if st, m := f.poll(d); st != 400 || m["error"] != "authorization_pending" {
		t.Errorf("first poll: %d %v", st, m)
	}
	// At once again: too fast, and the interval grows by 5 s.
	if st, m := f.poll(d); st != 400 || m["error"] != "slow_down" || !strings.Contains(m["error_description"].(string), "6 s") {
		t.Errorf("fast poll: %d %v", st, m)
	}

	// The page: the complete URI fills the code in and names the client;
	// a typed code may be lower case and without the dash.
	resp, body = f.do("GET", "/device", url.Values{"user_code": {code}})
	if resp.StatusCode != 200 || !strings.Contains(body, `value="`+code+`"`) || !strings.Contains(body, "<strong>cli</strong>") {
		t.Errorf("verification page: %d %s", resp.StatusCode, body)
	}
	if resp, body = f.do("GET", "/device", url.Values{"user_code": {"BBBB-BBBB"}}); resp.StatusCode != 200 || !strings.Contains(body, "unknown, used or expired") {
		t.Errorf("unknown code on the page: %d %s", resp.StatusCode, body)
	}
	if st, body := f.answer("BBBBBBBB", "noah", "pw", "allow"); st != 400 || !strings.Contains(body, "unknown, used or expired") {
		t.Errorf("unknown code: %d %s", st, body)
	}
	if st, body := f.answer(code, "noah", "wrong", "allow"); st != 401 || !strings.Contains(body, "Wrong username or password") {
		t.Errorf("wrong password: %d %s", st, body)
	}
	typed := strings.ToLower(strings.ReplaceAll(code, "-", " "))
	if st, body := f.answer(typed, "noah", "pw", "allow"); st != 200 || !strings.Contains(body, "Signed in as noah") {
		t.Fatalf("allow: %d %s", st, body)
	}
	if st, body := f.answer(code, "nadia", "pw", "allow"); st != 400 || !strings.Contains(body, "unknown, used or expired") {
		t.Errorf("code answered twice: %d %s", st, body)
	}

	f.advance(6 * time.Second)
	st, tok := f.poll(d)
	if st != 200 || tok["refresh_token"] == nil || tok["access_token"] == nil || tok["token_type"] != "Bearer" {
		t.Fatalf("approved poll: %d %v", st, tok)
	}
	ctx := context.Background()
	op, err := oidc.NewProvider(ctx, f.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	verifier := op.Verifier(&oidc.Config{ClientID: "cli", Now: func() time.Time { return f.p.now() }})
	idt, err := verifier.Verify(ctx, tok["id_token"].(string))
	var claims struct {
		Email  string   `json:"email"`
		Groups []string `json:"groups"`
	}
	if err != nil || idt.Subject != "dev-noah" || idt.Nonce != "" || idt.Claims(&claims) != nil || claims.Email != "noah@example.com" ||
		strings.Join(claims.Groups, ",") != "staff,team:nlp" {
		t.Fatalf("ID token: %v %+v %+v", err, idt, claims)
	}
	if _, err := op.Verifier(&oidc.Config{ClientID: "app"}).Verify(ctx, tok["id_token"].(string)); err == nil {
		t.Error("the CLI's ID token verified for the portal's client")
	}
	f.advance(6 * time.Second)
	if st, m := f.poll(d); st != 400 || m["error"] != "invalid_grant" {
		t.Errorf("device code used twice: %d %v", st, m)
	}

	// Denied, and expired.
	d = f.start("openid email")
	if st, _ := f.answer(d["user_code"].(string), "", "", "deny"); st != 200 {
		t.Errorf("deny: %d", st)
	}
	if st, m := f.poll(d); st != 400 || m["error"] != "access_denied" {
		t.Errorf("denied poll: %d %v", st, m)
	}
	d = f.start("openid email")
	f.advance(61 * time.Second)
	if st, m := f.poll(d); st != 400 || m["error"] != "expired_token" {
		t.Errorf("expired poll: %d %v", st, m)
	}
	if st, _ := f.answer(d["user_code"].(string), "noah", "pw", "allow"); st != 400 {
		t.Errorf("allowing an expired code: %d", st)
	}

	// Refusals at the start: a client without the grant, a public client
	// sending a secret, no openid scope, an unknown client.
	for name, tc := range map[string]struct {
		v      url.Values
		auth   []string
		status int
		code   string
	}{
		"no device grant": {url.Values{"scope": {"openid"}}, []string{"app", "s3"}, 400, "unauthorized_client"},
		"public + secret": {url.Values{"scope": {"openid"}, "client_id": {"cli"}, "client_secret": {"x"}}, nil, 401, "invalid_client"},
		"no openid":       {url.Values{"scope": {"email"}, "client_id": {"cli"}}, nil, 400, "invalid_scope"},
		"unknown client":  {url.Values{"scope": {"openid"}, "client_id": {"evil"}}, nil, 401, "invalid_client"},
	} {
		if st, m := f.post("/device_authorization", tc.v, tc.auth...); st != tc.status || m["error"] != tc.code {
			t.Errorf("%s: %d %v", name, st, m)
		}
	}
	if st, m := f.post("/token", url.Values{"grant_type": {grantDeviceCode}, "device_code": {"x"}}, "app", "s3"); st != 400 || m["error"] != "unauthorized_client" {
		t.Errorf("device grant for app: %d %v", st, m)
	}
}

// approved runs a device flow for noah to its tokens.
func (f *deviceFixture) approved(scope string) map[string]any {
	f.t.Helper()
	d := f.start(scope)
	if st, body := f.answer(d["user_code"].(string), "noah", "pw", "allow"); st != 200 {
		f.t.Fatalf("allow: %d %s", st, body)
	}
	st, tok := f.poll(d)
	if st != 200 {
		f.t.Fatalf("poll: %d %v", st, tok)
	}
	return tok
}

func TestRefreshRotation(t *testing.T) {
	f := newDeviceFixture(t)
	refresh := func(rt string, scope ...string) (int, map[string]any) {
		t.Helper()
		v := url.Values{"grant_type": {"refresh_token"}, "client_id": {"cli"}, "refresh_token": {rt}}
		if len(scope) > 0 {
			v.Set("scope", scope[0])
		}
		return f.post("/token", v)
	}
	if tok := f.approved("openid email"); tok["refresh_token"] != nil {
		t.Errorf("a refresh token without offline_access: %v", tok)
	}
	tok := f.approved("openid profile email offline_access")
	first := tok["refresh_token"].(string)
	f.advance(time.Minute)
	st, next := refresh(first)
	if st != 200 || next["refresh_token"] == nil || next["refresh_token"] == first || next["id_token"] == nil || next["id_token"] == tok["id_token"] {
		t.Fatalf("refresh: %d %v", st, next)
	}
	ctx := context.Background()
	op, err := oidc.NewProvider(ctx, f.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	idt, err := op.Verifier(&oidc.Config{ClientID: "cli", Now: func() time.Time { return f.p.now() }}).Verify(ctx, next["id_token"].(string))
	if err != nil || idt.Subject != "dev-noah" || !idt.Expiry.After(f.p.now().Add(59*time.Minute)) {
		t.Errorf("refreshed ID token: %v %+v", err, idt)
	}
	second := next["refresh_token"].(string)
	if st, m := refresh(second, "openid email groups"); st != 400 || m["error"] != "invalid_scope" {
		t.Errorf("a wider scope: %d %v", st, m)
	}
	if st, m := f.post("/token", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {second}}, "app", "s3"); st != 400 || m["error"] != "invalid_grant" {
		t.Errorf("another client's refresh token: %d %v", st, m)
	}
	// The first one again: it leaked; the whole family goes.
	if st, m := refresh(first); st != 400 || m["error"] != "invalid_grant" || !strings.Contains(m["error_description"].(string), "already used") {
		t.Errorf("reused refresh token: %d %v", st, m)
	}
	if st, m := refresh(second); st != 400 || m["error"] != "invalid_grant" {
		t.Errorf("after reuse, its successor: %d %v", st, m)
	}

	// Revocation (RFC 7009), and expiry.
	tok = f.approved("openid email offline_access")
	if st, _ := f.post("/revoke", url.Values{"client_id": {"cli"}, "token": {tok["refresh_token"].(string)}}); st != 200 {
		t.Errorf("revoke: %d", st)
	}
	if st, m := refresh(tok["refresh_token"].(string)); st != 400 || m["error"] != "invalid_grant" {
		t.Errorf("revoked refresh token: %d %v", st, m)
	}
	tok = f.approved("openid email offline_access")
	f.advance(time.Hour)
	if st, m := refresh(tok["refresh_token"].(string)); st != 400 || m["error"] != "invalid_grant" {
		t.Errorf("expired refresh token: %d %v", st, m)
	}
}
