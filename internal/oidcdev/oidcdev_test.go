package oidcdev

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/coreos/go-oidc/v3/oidc"
)

type fixture struct {
	t      *testing.T
	srv    *httptest.Server
	c      *http.Client
	verify string // PKCE verifier
}

func newFixture(t *testing.T) *fixture {
	var p *Provider
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.Handler().ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	var err error
	p, err = New(Config{Issuer: srv.URL, Users: DemoUsers("pw"),
		Clients: []Client{{ID: "app", Secret: "s3", RedirectURIs: []string{"http://127.0.0.1/cb", "https://app.example/cb"}}}})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, srv: srv, verify: strings.Repeat("v", 50),
		c: &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (f *fixture) challenge() string {
	s := sha256.Sum256([]byte(f.verify))
	return base64.RawURLEncoding.EncodeToString(s[:])
}

func (f *fixture) authParams() url.Values {
	return url.Values{"response_type": {"code"}, "client_id": {"app"}, "redirect_uri": {"http://127.0.0.1:5555/cb"},
		"scope": {"openid email profile"}, "state": {"st"}, "nonce": {"no"}, "code_challenge": {f.challenge()}, "code_challenge_method": {"S256"}}
}

func (f *fixture) do(method, path string, v url.Values, auth ...string) (*http.Response, string) {
	f.t.Helper()
	var body io.Reader
	u := f.srv.URL + path
	if method == "GET" && v != nil {
		u += "?" + v.Encode()
	} else if v != nil {
		body = strings.NewReader(v.Encode())
	}
	req, _ := http.NewRequest(method, u, body)
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if len(auth) == 2 {
		req.SetBasicAuth(auth[0], auth[1])
	}
	resp, err := f.c.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// code signs in as noah and returns the authorization code.
func (f *fixture) code() string {
	f.t.Helper()
	v := f.authParams()
	v.Set("username", "noah")
	v.Set("password", "pw")
	v.Set("action", "login")
	resp, _ := f.do("POST", "/authorize", v)
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusFound || loc.Query().Get("state") != "st" || loc.Query().Get("code") == "" {
		f.t.Fatalf("login: %d %s", resp.StatusCode, loc)
	}
	return loc.Query().Get("code")
}

func TestAuthorizeChecks(t *testing.T) {
	f := newFixture(t)
	// Unknown client and unregistered redirect URI: an error page, never a
	// redirect.
	for name, edit := range map[string]func(url.Values){
		"unknown client":     func(v url.Values) { v.Set("client_id", "evil") },
		"foreign redirect":   func(v url.Values) { v.Set("redirect_uri", "https://evil.example/cb") },
		"other path":         func(v url.Values) { v.Set("redirect_uri", "http://127.0.0.1:5555/other") },
		"https port differs": func(v url.Values) { v.Set("redirect_uri", "https://app.example:8443/cb") },
	} {
		v := f.authParams()
		edit(v)
		resp, body := f.do("GET", "/authorize", v)
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Location") != "" || !strings.Contains(body, "idp-error") {
			t.Errorf("%s: %d %q", name, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	// Protocol errors go back to the client.
	for name, tc := range map[string]struct {
		edit func(url.Values)
		code string
	}{
		"implicit flow": {func(v url.Values) { v.Set("response_type", "token") }, "unsupported_response_type"},
		"no openid":     {func(v url.Values) { v.Set("scope", "email") }, "invalid_scope"},
		"no PKCE":       {func(v url.Values) { v.Del("code_challenge") }, "invalid_request"},
		"plain PKCE":    {func(v url.Values) { v.Set("code_challenge_method", "plain") }, "invalid_request"},
	} {
		v := f.authParams()
		tc.edit(v)
		resp, _ := f.do("GET", "/authorize", v)
		loc, _ := url.Parse(resp.Header.Get("Location"))
		if resp.StatusCode != http.StatusFound || loc.Query().Get("error") != tc.code || loc.Query().Get("state") != "st" {
			t.Errorf("%s: %d %s", name, resp.StatusCode, loc)
		}
	}
	if resp, body := f.do("GET", "/authorize", f.authParams()); resp.StatusCode != 200 || !strings.Contains(body, `name="password"`) {
		t.Errorf("login form: %d", resp.StatusCode)
	}
}

func TestTokenEndpoint(t *testing.T) {
	f := newFixture(t)
	exchange := func(code, verifier, redirect string, auth ...string) (int, map[string]any) {
		t.Helper()
		v := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "code_verifier": {verifier}, "redirect_uri": {redirect}}
		if len(auth) == 0 {
			auth = []string{"app", "s3"}
		}
		resp, body := f.do("POST", "/token", v, auth...)
		var m map[string]any
		json.Unmarshal([]byte(body), &m) //nolint:errcheck
		return resp.StatusCode, m
	}
	const redirect = "http://127.0.0.1:5555/cb"
	if st, m := exchange(f.code(), f.verify, redirect, "app", "wrong"); st != 401 || m["error"] != "invalid_client" {
		t.Errorf("wrong secret: %d %v", st, m)
	}
	if st, m := exchange(f.code(), strings.Repeat("w", 50), redirect); st != 400 || m["error"] != "invalid_grant" {
		t.Errorf("wrong verifier: %d %v", st, m)
	}
	if st, m := exchange(f.code(), f.verify, "http://127.0.0.1:6666/cb"); st != 400 || m["error"] != "invalid_grant" {
		t.Errorf("other redirect: %d %v", st, m)
	}
	code := f.code()
	st, m := exchange(code, f.verify, redirect)
	if st != 200 || m["token_type"] != "Bearer" {
		t.Fatalf("exchange: %d %v", st, m)
	}
	if st, m := exchange(code, f.verify, redirect); st != 400 || m["error"] != "invalid_grant" {
		t.Errorf("code reused: %d %v", st, m)
	}
	// The ID token verifies against discovery and the JWKS.
	ctx := context.Background()
	p, err := oidc.NewProvider(ctx, f.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	idt, err := p.Verifier(&oidc.Config{ClientID: "app"}).Verify(ctx, m["id_token"].(string))
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Email    string   `json:"email"`
		Verified bool     `json:"email_verified"`
		Groups   []string `json:"groups"`
	}
	if err := idt.Claims(&claims); err != nil || idt.Subject != "dev-noah" || idt.Nonce != "no" || claims.Email != "noah@example.com" ||
		!claims.Verified || strings.Join(claims.Groups, ",") != "staff,team:nlp" {
		t.Errorf("ID token: sub %q nonce %q %+v %v", idt.Subject, idt.Nonce, claims, err)
	}
	if _, err := p.Verifier(&oidc.Config{ClientID: "other"}).Verify(ctx, m["id_token"].(string)); err == nil {
		t.Error("ID token accepted for another audience")
	}
	// Userinfo with the access token, and not without.
	req, _ := http.NewRequest("GET", f.srv.URL+"/userinfo", nil)
	req.Header.Set("Authorization", "Bearer "+m["access_token"].(string))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("userinfo: %v %v", resp, err)
	}
	resp.Body.Close()
	req.Header.Set("Authorization", "Bearer nope")
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Errorf("userinfo with a bad token: %v %v", resp, err)
	}
	resp.Body.Close()
}
