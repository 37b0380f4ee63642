// Package oidcdev is a small OpenID Connect provider for development and
// tests: discovery, a JWKS with an RS256 key made at start, an authorize
// endpoint with a username/password form, a token endpoint for the
// authorization-code grant with PKCE (S256 only), the device authorization
// grant (RFC 8628, device.go) and refresh tokens with rotation, token
// revocation (RFC 7009), userinfo and an end-session endpoint. It keeps
// everything in memory and has no single sign-on session: every
// authorization shows the form.
//
// `allot dev` runs one next to the portal with the demo personas as users,
// and tests start one as a separate process (`allot oidc-provider`).
package oidcdev

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// User is a person who can sign in.
type User struct {
	Subject  string
	Username string
	Password string
	Email    string
	Name     string
	Groups   []string
	// NoEmailVerified leaves the email_verified claim out, as some
	// providers do (otherwise it is true).
	NoEmailVerified bool
	// Claims are extra claims sent in the ID token and from userinfo, as
	// other providers shape them: "roles" (Entra app roles), group GUIDs,
	// or Entra's overage marker ("_claim_names"/"_claim_sources").
	Claims map[string]any
}

// Client is a registered relying party.
type Client struct {
	ID     string
	Secret string
	// RedirectURIs are matched exactly, except that a loopback URI
	// (127.0.0.1, [::1] or localhost) matches any port (RFC 8252 §7.3), so
	// a test server on :0 can be registered before it listens.
	RedirectURIs []string
	// DeviceGrant lets the client use the device authorization grant, as
	// Keycloak's per-client switch does. A client with no Secret is public
	// (a CLI): it names itself with client_id and proves nothing else.
	DeviceGrant bool
}

// Config is what a Provider serves.
type Config struct {
	Issuer  string // the base URL, e.g. http://127.0.0.1:8081 (no trailing slash)
	Clients []Client
	Users   []User
	// GroupsNeedScope sends the groups claim only when the groups scope
	// was asked for, as Okta and Dex do (otherwise profile gives it too).
	GroupsNeedScope bool
	// Hint, if set, is shown under the login form (the demo passwords).
	Hint string
	// CodeTTL is how long an authorization code stays valid (default 1 min).
	CodeTTL time.Duration
	// TokenTTL is the lifetime of ID and access tokens (default 1 h).
	TokenTTL time.Duration
	// RefreshTTL is the lifetime of a refresh token (default 7 days); each
	// use replaces it with a new one (rotation).
	RefreshTTL time.Duration
	// DeviceCodeTTL is how long a device code waits for its user (default
	// 10 min); DeviceInterval is the least time between two polls of it
	// (default 5 s, whole seconds).
	DeviceCodeTTL  time.Duration
	DeviceInterval time.Duration
	// Now is the provider's clock (default time.Now).
	Now func() time.Time
}

// Provider is the OpenID provider; Handler serves it.
type Provider struct {
	cfg    Config
	key    *rsa.PrivateKey
	kid    string
	signer jose.Signer
	now    func() time.Time

	mu        sync.Mutex
	codes     map[string]*grant
	tokens    map[string]*grant
	refresh   map[string]*refreshToken
	devices   map[string]*deviceAuth // by device code
	userCodes map[string]string      // normalized user code → device code
}

// grant is one successful authorization: first as a code, then as an
// access token.
type grant struct {
	client, redirectURI, nonce, challenge string
	scopes                                []string
	user                                  User
	authTime, expires                     time.Time
	groupsNeedScope                       bool
}

// New makes a provider with a fresh RSA signing key.
func New(cfg Config) (*Provider, error) {
	if cfg.Issuer == "" {
		return nil, fmt.Errorf("oidcdev: the issuer URL is required")
	}
	cfg.Issuer = strings.TrimSuffix(cfg.Issuer, "/")
	if cfg.CodeTTL == 0 {
		cfg.CodeTTL = time.Minute
	}
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = time.Hour
	}
	if cfg.RefreshTTL == 0 {
		cfg.RefreshTTL = 7 * 24 * time.Hour
	}
	if cfg.DeviceCodeTTL == 0 {
		cfg.DeviceCodeTTL = 10 * time.Minute
	}
	if cfg.DeviceInterval < time.Second {
		cfg.DeviceInterval = 5 * time.Second
	}
	cfg.DeviceInterval = cfg.DeviceInterval.Truncate(time.Second)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("oidcdev: making a signing key: %w", err)
	}
	kid := random()[:16]
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: kid, Algorithm: string(jose.RS256)}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return nil, fmt.Errorf("oidcdev: making a signer: %w", err)
	}
	return &Provider{cfg: cfg, key: key, kid: kid, signer: signer, now: cfg.Now,
		codes: map[string]*grant{}, tokens: map[string]*grant{}, refresh: map[string]*refreshToken{},
		devices: map[string]*deviceAuth{}, userCodes: map[string]string{}}, nil
}

// Issuer is the provider's issuer URL.
func (p *Provider) Issuer() string { return p.cfg.Issuer }

// Handler serves the provider's endpoints.
func (p *Provider) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", p.discovery)
	mux.HandleFunc("GET /jwks", p.jwks)
	mux.HandleFunc("GET /authorize", p.authorize)
	mux.HandleFunc("POST /authorize", p.authorize)
	mux.HandleFunc("POST /token", p.token)
	mux.HandleFunc("POST /device_authorization", p.deviceAuthorization)
	mux.HandleFunc("GET /device", p.device)
	mux.HandleFunc("POST /device", p.device)
	mux.HandleFunc("POST /revoke", p.revoke)
	mux.HandleFunc("GET /userinfo", p.userinfo)
	mux.HandleFunc("POST /userinfo", p.userinfo)
	mux.HandleFunc("GET /end_session", p.endSession)
	return mux
}

func random() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client went away
}

// oauthError is an RFC 6749 §5.2 error response.
func oauthError(w http.ResponseWriter, status int, code, desc string) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Basic realm="oidcdev"`)
	}
	writeJSON(w, status, map[string]string{"error": code, "error_description": desc})
}

func (p *Provider) discovery(w http.ResponseWriter, _ *http.Request) {
	iss := p.cfg.Issuer
	writeJSON(w, http.StatusOK, map[string]any{
		"issuer":                                iss,
		"authorization_endpoint":                iss + "/authorize",
		"token_endpoint":                        iss + "/token",
		"userinfo_endpoint":                     iss + "/userinfo",
		"jwks_uri":                              iss + "/jwks",
		"end_session_endpoint":                  iss + "/end_session",
		"device_authorization_endpoint":         iss + "/device_authorization",
		"revocation_endpoint":                   iss + "/revoke",
		"response_types_supported":              []string{"code"},
		"response_modes_supported":              []string{"query"},
		"grant_types_supported":                 []string{"authorization_code", grantDeviceCode, "refresh_token"},
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": []string{string(jose.RS256)},
		"scopes_supported":                      []string{"openid", "profile", "email", "groups", "offline_access"},
		"token_endpoint_auth_methods_supported": []string{"client_secret_basic", "client_secret_post", "none"},
		"code_challenge_methods_supported":      []string{"S256"},
		"claims_supported": []string{"iss", "sub", "aud", "exp", "iat", "auth_time", "nonce", "azp",
			"email", "email_verified", "name", "preferred_username", "groups"},
		"authorization_response_iss_parameter_supported": true,
	})
}

func (p *Provider) jwks(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: &p.key.PublicKey, KeyID: p.kid, Algorithm: string(jose.RS256), Use: "sig"},
	}})
}

// Register adds a client, or replaces the one with its ID.
func (p *Provider) Register(c Client) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.cfg.Clients {
		if p.cfg.Clients[i].ID == c.ID {
			p.cfg.Clients[i] = c
			return
		}
	}
	p.cfg.Clients = append(p.cfg.Clients, c)
}

func (p *Provider) client(id string) (Client, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.cfg.Clients {
		if c.ID == id {
			return c, true
		}
	}
	return Client{}, false
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// redirectAllowed matches uri against the client's registered redirect
// URIs: exactly, or on a loopback address with any port.
func redirectAllowed(c Client, uri string) bool {
	got, err := url.Parse(uri)
	if err != nil || got.Fragment != "" {
		return false
	}
	for _, r := range c.RedirectURIs {
		if r == uri {
			return true
		}
		want, err := url.Parse(r)
		if err != nil {
			continue
		}
		if isLoopback(want.Hostname()) && want.Scheme == got.Scheme && want.Hostname() == got.Hostname() &&
			want.Path == got.Path && want.RawQuery == got.RawQuery {
			return true
		}
	}
	return false
}

// authRequest is the parameters of an authorization request, carried
// through the login form.
type authRequest struct {
	ResponseType, ClientID, RedirectURI, Scope, State, Nonce, Challenge, ChallengeMethod string
}

func (a authRequest) hidden() map[string]string {
	return map[string]string{"response_type": a.ResponseType, "client_id": a.ClientID, "redirect_uri": a.RedirectURI,
		"scope": a.Scope, "state": a.State, "nonce": a.Nonce, "code_challenge": a.Challenge, "code_challenge_method": a.ChallengeMethod}
}

// redirectBack sends the browser back to the client with params (a code
// or an error) and the state.
func (p *Provider) redirectBack(w http.ResponseWriter, r *http.Request, a authRequest, params url.Values) {
	u, _ := url.Parse(a.RedirectURI) // checked by redirectAllowed
	q := u.Query()
	for k, v := range params {
		q[k] = v
	}
	if a.State != "" {
		q.Set("state", a.State)
	}
	q.Set("iss", p.cfg.Issuer)
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.String(), http.StatusFound)
}

func (p *Provider) authorize(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		p.page(w, http.StatusBadRequest, formPage{Error: "The request could not be read: " + err.Error()})
		return
	}
	f := r.Form
	a := authRequest{ResponseType: f.Get("response_type"), ClientID: f.Get("client_id"), RedirectURI: f.Get("redirect_uri"),
		Scope: f.Get("scope"), State: f.Get("state"), Nonce: f.Get("nonce"), Challenge: f.Get("code_challenge"),
		ChallengeMethod: f.Get("code_challenge_method")}
	// Errors about the client or its redirect URI are shown here: sending
	// the browser to an unchecked address would make this an open
	// redirector.
	c, ok := p.client(a.ClientID)
	if !ok {
		p.page(w, http.StatusBadRequest, formPage{Error: fmt.Sprintf("Unknown client %q.", a.ClientID)})
		return
	}
	if !redirectAllowed(c, a.RedirectURI) {
		p.page(w, http.StatusBadRequest, formPage{Error: fmt.Sprintf("The redirect URI %q is not registered for client %q.", a.RedirectURI, a.ClientID)})
		return
	}
	fail := func(code, desc string) {
		p.redirectBack(w, r, a, url.Values{"error": {code}, "error_description": {desc}})
	}
	switch {
	case a.ResponseType != "code":
		fail("unsupported_response_type", "only the authorization-code flow (response_type=code) is supported")
		return
	case !slices.Contains(strings.Fields(a.Scope), "openid"):
		fail("invalid_scope", "the openid scope is required")
		return
	case a.Challenge == "" || a.ChallengeMethod != "S256":
		fail("invalid_request", "PKCE is required: send code_challenge with code_challenge_method=S256")
		return
	case len(a.Challenge) != 43:
		fail("invalid_request", "code_challenge must be a base64url SHA-256 (43 characters)")
		return
	}
	form := formPage{Params: a.hidden(), Hint: p.cfg.Hint, Client: a.ClientID}
	if r.Method == http.MethodGet {
		p.page(w, http.StatusOK, form)
		return
	}
	if f.Get("action") == "deny" {
		fail("access_denied", "the user cancelled the sign-in")
		return
	}
	u, ok := p.check(f.Get("username"), f.Get("password"))
	if !ok {
		form.Error = "Wrong username or password."
		form.Username = f.Get("username")
		p.page(w, http.StatusUnauthorized, form)
		return
	}
	code := random()
	now := p.now()
	p.mu.Lock()
	p.purge(now)
	p.codes[code] = &grant{client: a.ClientID, redirectURI: a.RedirectURI, nonce: a.Nonce, challenge: a.Challenge,
		scopes: strings.Fields(a.Scope), user: u, authTime: now, expires: now.Add(p.cfg.CodeTTL), groupsNeedScope: p.cfg.GroupsNeedScope}
	p.mu.Unlock()
	p.redirectBack(w, r, a, url.Values{"code": {code}})
}

// check compares the password in constant time.
func (p *Provider) check(username, password string) (User, bool) {
	for _, u := range p.cfg.Users {
		if u.Username == username && subtle.ConstantTimeCompare([]byte(u.Password), []byte(password)) == 1 {
			return u, true
		}
	}
	return User{}, false
}

func (p *Provider) purge(now time.Time) {
	for k, g := range p.codes {
		if !g.expires.After(now) {
			delete(p.codes, k)
		}
	}
	for k, g := range p.tokens {
		if !g.expires.After(now) {
			delete(p.tokens, k)
		}
	}
	for k, r := range p.refresh {
		if !r.expires.After(now) {
			delete(p.refresh, k)
		}
	}
	// An expired device code is kept a while, so that its client hears
	// expired_token rather than an unknown code.
	for k, d := range p.devices {
		if !d.expires.Add(p.cfg.DeviceCodeTTL).After(now) {
			delete(p.devices, k)
			delete(p.userCodes, d.userCode)
		}
	}
}

// clientAuth authenticates the client by HTTP Basic (RFC 6749 §2.3.1,
// form-encoded id and secret) or by client_secret_post; a public client
// (no Secret) by its client_id alone, and only without a secret.
func (p *Provider) clientAuth(r *http.Request) (Client, bool) {
	id, secret, basic := r.BasicAuth()
	if basic {
		var err1, err2 error
		id, err1 = url.QueryUnescape(id)
		secret, err2 = url.QueryUnescape(secret)
		if err1 != nil || err2 != nil {
			return Client{}, false
		}
	} else {
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	}
	c, ok := p.client(id)
	if !ok || subtle.ConstantTimeCompare([]byte(c.Secret), []byte(secret)) != 1 {
		return Client{}, false
	}
	return c, true
}

// formClient parses a token-endpoint-style request's form and
// authenticates its client (clientAuth); on failure it has answered with
// the OAuth error and reports false.
func (p *Provider) formClient(w http.ResponseWriter, r *http.Request) (Client, bool) {
	if err := r.ParseForm(); err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return Client{}, false
	}
	c, ok := p.clientAuth(r)
	if !ok {
		oauthError(w, http.StatusUnauthorized, "invalid_client", "unknown client or wrong secret")
	}
	return c, ok
}

func (p *Provider) token(w http.ResponseWriter, r *http.Request) {
	c, ok := p.formClient(w, r)
	if !ok {
		return
	}
	switch gt := r.PostForm.Get("grant_type"); gt {
	case "authorization_code":
		p.codeGrant(w, r, c)
	case grantDeviceCode:
		p.deviceGrant(w, r, c)
	case "refresh_token":
		p.refreshGrant(w, r, c)
	default:
		oauthError(w, http.StatusBadRequest, "unsupported_grant_type", fmt.Sprintf("grant type %q is not supported", gt))
	}
}

func (p *Provider) codeGrant(w http.ResponseWriter, r *http.Request, c Client) {
	now := p.now()
	p.mu.Lock()
	g, ok := p.codes[r.PostForm.Get("code")]
	delete(p.codes, r.PostForm.Get("code")) // a code works once, even when the exchange fails
	p.mu.Unlock()
	switch {
	case !ok || !g.expires.After(now):
		oauthError(w, http.StatusBadRequest, "invalid_grant", "the code is unknown, used or expired")
		return
	case g.client != c.ID:
		oauthError(w, http.StatusBadRequest, "invalid_grant", "the code was issued to another client")
		return
	case r.PostForm.Get("redirect_uri") != g.redirectURI:
		oauthError(w, http.StatusBadRequest, "invalid_grant", "redirect_uri differs from the authorization request")
		return
	}
	v := r.PostForm.Get("code_verifier")
	sum := sha256.Sum256([]byte(v))
	if len(v) < 43 || len(v) > 128 || subtle.ConstantTimeCompare([]byte(base64.RawURLEncoding.EncodeToString(sum[:])), []byte(g.challenge)) != 1 {
		oauthError(w, http.StatusBadRequest, "invalid_grant", "the PKCE code_verifier does not match the code_challenge")
		return
	}
	p.issue(w, g, now, "")
}

// issue answers a token request with an access token and an ID token for
// g, and a refresh token when offline_access was granted: a new family,
// or the next of family (rotation).
func (p *Provider) issue(w http.ResponseWriter, g *grant, now time.Time, family string) {
	idToken, err := p.idToken(g, now)
	if err != nil {
		oauthError(w, http.StatusInternalServerError, "server_error", err.Error())
		return
	}
	access := random()
	out := map[string]any{"access_token": access, "token_type": "Bearer",
		"expires_in": int(p.cfg.TokenTTL.Seconds()), "id_token": idToken, "scope": strings.Join(g.scopes, " ")}
	p.mu.Lock()
	at := *g
	at.expires = now.Add(p.cfg.TokenTTL)
	p.tokens[access] = &at
	if slices.Contains(g.scopes, "offline_access") {
		if family == "" {
			family = random()
		}
		rt := random()
		rg := *g
		rg.expires = now.Add(p.cfg.RefreshTTL)
		p.refresh[rt] = &refreshToken{grant: rg, family: family, expires: rg.expires}
		out["refresh_token"] = rt
	}
	p.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// claims are the user's claims for the granted scopes.
func claims(g *grant) map[string]any {
	c := map[string]any{"sub": g.user.Subject}
	if slices.Contains(g.scopes, "email") {
		c["email"] = g.user.Email
		if !g.user.NoEmailVerified {
			c["email_verified"] = true
		}
	}
	if slices.Contains(g.scopes, "profile") {
		c["name"], c["preferred_username"] = g.user.Name, g.user.Username
	}
	// Groups are sent with the profile or groups scope, as many providers
	// do, or only with groups (Okta, Dex) when the provider says so.
	if (slices.Contains(g.scopes, "profile") && !g.groupsNeedScope) || slices.Contains(g.scopes, "groups") {
		c["groups"] = append([]string{}, g.user.Groups...)
	}
	for k, v := range g.user.Claims {
		c[k] = v
	}
	return c
}

func (p *Provider) idToken(g *grant, now time.Time) (string, error) {
	c := claims(g)
	c["iss"], c["aud"], c["azp"] = p.cfg.Issuer, g.client, g.client
	c["iat"], c["exp"], c["auth_time"] = now.Unix(), now.Add(p.cfg.TokenTTL).Unix(), g.authTime.Unix()
	if g.nonce != "" {
		c["nonce"] = g.nonce
	}
	return jwt.Signed(p.signer).Claims(c).Serialize()
}

func (p *Provider) userinfo(w http.ResponseWriter, r *http.Request) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	p.mu.Lock()
	g, found := p.tokens[strings.TrimSpace(tok)]
	p.mu.Unlock()
	if !ok || !found || !g.expires.After(p.now()) {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid_token"})
		return
	}
	writeJSON(w, http.StatusOK, claims(g))
}

// endSession ends the sign-in (there is no provider session to end) and
// goes back to post_logout_redirect_uri when the client registered its
// origin; otherwise it says the user is signed out.
func (p *Provider) endSession(w http.ResponseWriter, r *http.Request) {
	back := r.URL.Query().Get("post_logout_redirect_uri")
	if c, ok := p.client(r.URL.Query().Get("client_id")); ok && back != "" && sameOriginAsRedirect(c, back) {
		u, _ := url.Parse(back)
		if s := r.URL.Query().Get("state"); s != "" {
			q := u.Query()
			q.Set("state", s)
			u.RawQuery = q.Encode()
		}
		http.Redirect(w, r, u.String(), http.StatusFound)
		return
	}
	p.page(w, http.StatusOK, formPage{Message: "You are signed out."})
}

func sameOriginAsRedirect(c Client, uri string) bool {
	got, err := url.Parse(uri)
	if err != nil {
		return false
	}
	for _, r := range c.RedirectURIs {
		want, err := url.Parse(r)
		if err != nil || want.Scheme != got.Scheme || want.Hostname() != got.Hostname() {
			continue
		}
		if want.Port() == got.Port() || isLoopback(want.Hostname()) {
			return true
		}
	}
	return false
}

// formPage is the login page (or a message or error page).
type formPage struct {
	Params   map[string]string
	Client   string
	Username string
	Error    string
	Message  string
	Hint     string
	// Device shows the device-verification form (device.go) instead.
	Device   bool
	UserCode string
}

var pageTmpl = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in · Allot dev identity provider</title>
<style>
body{font-family:system-ui,sans-serif;background:#f3f4f6;margin:0;display:flex;justify-content:center}
main{background:#fff;margin:4rem 1rem;padding:2rem;border-radius:.5rem;box-shadow:0 1px 4px #0002;width:100%;max-width:24rem}
label{display:block;margin:.75rem 0 .25rem}input{width:100%;padding:.5rem;box-sizing:border-box;font-size:1rem}
button{margin-top:1rem;padding:.5rem 1rem;font-size:1rem}.error{color:#b91c1c}.hint{color:#4b5563;font-size:.9rem;white-space:pre-line}
</style></head><body><main>
<h1>Dev identity provider</h1>
{{if .Error}}<p class="error" role="alert" data-testid="idp-error">{{.Error}}</p>{{end}}
{{if .Message}}<p data-testid="idp-message">{{.Message}}</p>{{end}}
{{if .Params}}
<p>Sign in to continue to <strong>{{.Client}}</strong>.</p>
<form method="post" action="/authorize" data-testid="idp-login-form">
{{range $k, $v := .Params}}<input type="hidden" name="{{$k}}" value="{{$v}}">{{end}}
<label for="username">Username</label><input id="username" name="username" autocomplete="username" value="{{.Username}}" required autofocus>
<label for="password">Password</label><input id="password" name="password" type="password" autocomplete="current-password" required>
<button type="submit" name="action" value="login" data-testid="idp-submit">Sign in</button>
<button type="submit" name="action" value="deny" formnovalidate data-testid="idp-cancel">Cancel</button>
</form>
{{if .Hint}}<p class="hint" data-testid="idp-hint">{{.Hint}}</p>{{end}}
{{end}}
{{if .Device}}
{{if .Client}}<p>Sign in to let <strong>{{.Client}}</strong> on your device act as you. Check that the code is the one your device shows.</p>
{{else}}<p>Enter the code your device shows, then sign in to allow it.</p>{{end}}
<form method="post" action="/device" data-testid="idp-device-form">
<label for="user_code">Code</label><input id="user_code" name="user_code" value="{{.UserCode}}" autocomplete="off" autocapitalize="characters" spellcheck="false" required{{if not .UserCode}} autofocus{{end}}>
<label for="username">Username</label><input id="username" name="username" autocomplete="username" value="{{.Username}}" required{{if .UserCode}} autofocus{{end}}>
<label for="password">Password</label><input id="password" name="password" type="password" autocomplete="current-password" required>
<button type="submit" name="action" value="allow" data-testid="idp-allow">Sign in and allow</button>
<button type="submit" name="action" value="deny" formnovalidate data-testid="idp-deny">Deny</button>
</form>
{{if .Hint}}<p class="hint" data-testid="idp-hint">{{.Hint}}</p>{{end}}
{{end}}
</main></body></html>`))

func (p *Provider) page(w http.ResponseWriter, status int, f formPage) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Frame-Options", "DENY")
	w.WriteHeader(status)
	pageTmpl.Execute(w, f) //nolint:errcheck // the client went away
}
