package oidcdev

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// grantDeviceCode is the device authorization grant's grant type (RFC 8628
// §3.4).
const grantDeviceCode = "urn:ietf:params:oauth:grant-type:device_code"

// deviceAuth is one device authorization (RFC 8628) waiting for its user,
// or answered.
type deviceAuth struct {
	client   string
	scopes   []string
	userCode string // normalized: 8 letters, no dash
	expires  time.Time
	interval time.Duration
	lastPoll time.Time
	state    deviceState
	user     User
	authTime time.Time
}

type deviceState int

const (
	devicePending deviceState = iota
	deviceApproved
	deviceDenied
)

// refreshToken is a refresh token: the grant it renews, and its family
// (every token rotated from one sign-in). A used one is kept until it
// expires: presenting it again means it leaked, and revokes the family.
type refreshToken struct {
	grant   grant
	family  string
	expires time.Time
	used    bool
}

// userCodeAlphabet is RFC 8628 §6.1's: consonants only, no vowels to spell
// words, nothing that looks like a digit.
const userCodeAlphabet = "BCDFGHJKLMNPQRSTVWXZ"

// newUserCode is 8 letters of userCodeAlphabet (20^8, about 2^34.6).
func newUserCode() string {
	var out []byte
	b := make([]byte, 1)
	for len(out) < 8 {
		if _, err := rand.Read(b); err != nil {
			panic(err) // crypto/rand does not fail on supported platforms
		}
		if b[0] >= 240 { // keeps b%20 uniform
			continue
		}
		out = append(out, userCodeAlphabet[b[0]%20])
	}
	return string(out)
}

// normUserCode is a user code as typed: case, dashes and spaces do not
// matter.
func normUserCode(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '-', ' ', '\t':
			return -1
		}
		return r
	}, strings.ToUpper(strings.TrimSpace(s)))
}

// showUserCode is a normalized code as shown: XXXX-XXXX.
func showUserCode(c string) string {
	if len(c) != 8 {
		return c
	}
	return c[:4] + "-" + c[4:]
}

// deviceAuthorization is RFC 8628 §3.1–3.2: a client that may use the
// device grant gets a device code to poll with and a user code for its
// user to enter at the verification URI.
func (p *Provider) deviceAuthorization(w http.ResponseWriter, r *http.Request) {
	c, ok := p.formClient(w, r)
	if !ok {
		return
	}
	if !c.DeviceGrant {
		oauthError(w, http.StatusBadRequest, "unauthorized_client", fmt.Sprintf("client %q may not use the device authorization grant", c.ID))
		return
	}
	scopes := strings.Fields(r.PostForm.Get("scope"))
	if !slices.Contains(scopes, "openid") {
		oauthError(w, http.StatusBadRequest, "invalid_scope", "the openid scope is required")
		return
	}
	now := p.now()
	code, user := random(), newUserCode()
	d := &deviceAuth{client: c.ID, scopes: scopes, userCode: user, expires: now.Add(p.cfg.DeviceCodeTTL), interval: p.cfg.DeviceInterval}
	p.mu.Lock()
	p.purge(now)
	for p.userCodes[user] != "" { // 2^34 codes: a clash is rare, but not impossible
		user = newUserCode()
		d.userCode = user
	}
	p.devices[code] = d
	p.userCodes[user] = code
	p.mu.Unlock()
	verify := p.cfg.Issuer + "/device"
	writeJSON(w, http.StatusOK, map[string]any{
		"device_code":               code,
		"user_code":                 showUserCode(user),
		"verification_uri":          verify,
		"verification_uri_complete": verify + "?user_code=" + url.QueryEscape(showUserCode(user)),
		"expires_in":                int(p.cfg.DeviceCodeTTL.Seconds()),
		"interval":                  int(d.interval.Seconds()),
	})
}

// pendingDevice is the device authorization waiting under the user code,
// if any.
func (p *Provider) pendingDevice(userCode string, now time.Time) (*deviceAuth, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.devices[p.userCodes[normUserCode(userCode)]]
	if !ok || d.state != devicePending || !d.expires.After(now) {
		return nil, false
	}
	return d, true
}

// device is the verification page (RFC 8628 §3.3): the user enters the
// code (or follows verification_uri_complete, which fills it in), signs in
// and allows the device, or denies it.
func (p *Provider) device(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		p.page(w, http.StatusBadRequest, formPage{Error: "The request could not be read: " + err.Error()})
		return
	}
	now := p.now()
	typed := strings.TrimSpace(r.Form.Get("user_code"))
	form := formPage{Device: true, Hint: p.cfg.Hint, UserCode: typed}
	d, found := p.pendingDevice(typed, now)
	if found {
		form.Client, form.UserCode = d.client, showUserCode(d.userCode)
	}
	if r.Method == http.MethodGet {
		if typed != "" && !found {
			form.Error = "This code is unknown, used or expired: start again on your device."
		}
		p.page(w, http.StatusOK, form)
		return
	}
	if !found {
		form.Error = "This code is unknown, used or expired: check it, or start again on your device."
		form.Username = r.Form.Get("username")
		p.page(w, http.StatusBadRequest, form)
		return
	}
	if r.Form.Get("action") == "deny" {
		p.mu.Lock()
		if d.state == devicePending {
			d.state = deviceDenied
		}
		p.mu.Unlock()
		p.page(w, http.StatusOK, formPage{Message: "Denied: the device was not signed in. You can close this page."})
		return
	}
	u, ok := p.check(r.Form.Get("username"), r.Form.Get("password"))
	if !ok {
		form.Error = "Wrong username or password."
		form.Username = r.Form.Get("username")
		p.page(w, http.StatusUnauthorized, form)
		return
	}
	p.mu.Lock()
	approved := d.state == devicePending
	if approved {
		d.state, d.user, d.authTime = deviceApproved, u, now
	}
	p.mu.Unlock()
	if !approved {
		p.page(w, http.StatusBadRequest, formPage{Error: "This code was answered meanwhile: start again on your device."})
		return
	}
	p.page(w, http.StatusOK, formPage{Message: fmt.Sprintf("Signed in as %s: %s on your device may go on. You can close this page.", u.Username, d.client)})
}

// deviceGrant is the token request of RFC 8628 §3.4–3.5: pending until the
// user answers, slow_down when polled faster than the interval (which then
// grows by 5 s), expired_token after expires_in, access_denied when the
// user said no. An answered code works once.
func (p *Provider) deviceGrant(w http.ResponseWriter, r *http.Request, c Client) {
	if !c.DeviceGrant {
		oauthError(w, http.StatusBadRequest, "unauthorized_client", fmt.Sprintf("client %q may not use the device authorization grant", c.ID))
		return
	}
	now := p.now()
	code := r.PostForm.Get("device_code")
	p.mu.Lock()
	d, ok := p.devices[code]
	if !ok || d.client != c.ID {
		p.mu.Unlock()
		oauthError(w, http.StatusBadRequest, "invalid_grant", "the device code is unknown or was issued to another client")
		return
	}
	if !d.expires.After(now) {
		p.mu.Unlock()
		oauthError(w, http.StatusBadRequest, "expired_token", "the device code has expired: start again")
		return
	}
	// A little early is not too fast: a client's sleep and the network
	// jitter.
	tooFast := !d.lastPoll.IsZero() && now.Sub(d.lastPoll) < d.interval-100*time.Millisecond
	d.lastPoll = now
	if tooFast {
		d.interval += 5 * time.Second
	}
	state := d.state
	if state != devicePending { // used up, whatever the answer
		delete(p.devices, code)
		delete(p.userCodes, d.userCode)
	}
	p.mu.Unlock()
	switch {
	case state == deviceDenied:
		oauthError(w, http.StatusBadRequest, "access_denied", "the user denied the sign-in")
	case state == deviceApproved:
		p.issue(w, &grant{client: c.ID, scopes: d.scopes, user: d.user, authTime: d.authTime, groupsNeedScope: p.cfg.GroupsNeedScope}, now, "")
	case tooFast:
		oauthError(w, http.StatusBadRequest, "slow_down", fmt.Sprintf("polled too often: wait %d s between requests", int(d.interval.Seconds())))
	default:
		oauthError(w, http.StatusBadRequest, "authorization_pending", "the user has not answered yet")
	}
}

// refreshGrant renews a grant with its refresh token (RFC 6749 §6) and
// rotates it: the answer has a new refresh token and the old one is used
// up. Presenting a used one again revokes its whole family (a leaked
// token, RFC 9700 §4.14.2). A narrower scope may be asked for, never a
// wider one.
func (p *Provider) refreshGrant(w http.ResponseWriter, r *http.Request, c Client) {
	now := p.now()
	tok := r.PostForm.Get("refresh_token")
	p.mu.Lock()
	rt, ok := p.refresh[tok]
	switch {
	case !ok || !rt.expires.After(now) || rt.grant.client != c.ID:
		p.mu.Unlock()
		oauthError(w, http.StatusBadRequest, "invalid_grant", "the refresh token is unknown, revoked, expired or was issued to another client")
		return
	case rt.used:
		p.revokeFamily(rt.family)
		p.mu.Unlock()
		oauthError(w, http.StatusBadRequest, "invalid_grant", "the refresh token was already used: every token of this sign-in is revoked, sign in again")
		return
	}
	g := rt.grant
	if s := strings.Fields(r.PostForm.Get("scope")); len(s) > 0 {
		for _, x := range s {
			if !slices.Contains(g.scopes, x) {
				p.mu.Unlock()
				oauthError(w, http.StatusBadRequest, "invalid_scope", fmt.Sprintf("scope %q was not granted", x))
				return
			}
		}
		if !slices.Contains(s, "offline_access") {
			s = append(s, "offline_access") // the refresh token keeps working
		}
		g.scopes = s
	}
	rt.used = true
	p.mu.Unlock()
	g.nonce = "" // a refreshed ID token has no nonce (OIDC Core §12.2)
	p.issue(w, &g, now, rt.family)
}

// revokeFamily drops every refresh token of family and the access tokens
// are left to expire. Hold p.mu.
func (p *Provider) revokeFamily(family string) {
	for k, t := range p.refresh {
		if t.family == family {
			delete(p.refresh, k)
		}
	}
}

// revoke is RFC 7009 token revocation for refresh and access tokens: a
// refresh token's whole family goes. Unknown tokens are no error.
func (p *Provider) revoke(w http.ResponseWriter, r *http.Request) {
	c, ok := p.formClient(w, r)
	if !ok {
		return
	}
	tok := r.PostForm.Get("token")
	p.mu.Lock()
	if rt, ok := p.refresh[tok]; ok && rt.grant.client == c.ID {
		p.revokeFamily(rt.family)
	}
	if g, ok := p.tokens[tok]; ok && g.client == c.ID {
		delete(p.tokens, tok)
	}
	p.mu.Unlock()
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
}
