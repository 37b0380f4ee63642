package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// The OIDC tests run the development provider as its own OS process: the
// test binary re-executes itself as `allot oidc-provider` when this
// variable holds the arguments.
const providerEnv = "ALLOT_TEST_OIDC_PROVIDER_ARGS"

func init() {
	if args, ok := os.LookupEnv(providerEnv); ok {
		os.Exit(run(append([]string{"oidc-provider"}, strings.Fields(args)...), os.Stdout, os.Stderr))
	}
}

const (
	testClientID     = "allot-test"
	testClientSecret = "test-secret-0123456789"
	testPassword     = "s3cret-demo"
)

// startProvider starts `allot oidc-provider` as a separate process and
// returns its issuer URL.
func startProvider(t *testing.T, extraArgs ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), providerEnv+"=--addr 127.0.0.1:0 --watch-stdin --client-id "+testClientID+
		" --client-secret "+testClientSecret+" --password "+testPassword+" --redirect-uri http://127.0.0.1/oidc/callback "+strings.Join(extraArgs, " "))
	issuer := startProcess(t, cmd, "OIDC provider")
	if !strings.HasPrefix(issuer, "http://127.0.0.1:") {
		t.Fatalf("provider printed %q", issuer)
	}
	return issuer
}

// startProcess starts cmd, a provider that prints its issuer URL on a line
// of stdout and exits when its stdin closes, and returns that line. The
// test's cleanup closes stdin and expects a clean exit within 10 s.
func startProcess(t *testing.T, cmd *exec.Cmd, name string) string {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close() // the provider exits
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s exited: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill() //nolint:errcheck
			t.Errorf("%s did not stop when its stdin closed", name)
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the %s's issuer: %v", name, err)
	}
	return strings.TrimSpace(line)
}

// bootSSO is boot with single sign-on against issuer and without dev mode.
func bootSSO(t *testing.T, issuer string) *env {
	t.Helper()
	return bootMain(t, &Main{Config: Config{Worker: true,
		OIDC: web.OIDCConfig{Issuer: issuer, ClientID: testClientID, ClientSecret: testClientSecret,
			// The demo's people never signed in: link them by verified email.
			LinkEmailIssuers: []string{issuer}}}})
}

// ssoBrowser is a cookie-keeping client that does not follow redirects,
// so each step of the flow can be checked.
type ssoBrowser struct {
	t   *testing.T
	c   *http.Client
	jar *cookiejar.Jar
}

func newSSOBrowser(t *testing.T) *ssoBrowser {
	jar, _ := cookiejar.New(nil)
	return &ssoBrowser{t: t, jar: jar, c: &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type step struct {
	status   int
	location string
	body     string
	cookies  []*http.Cookie
}

func (b *ssoBrowser) do(method, u string, form url.Values) step {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	loc := resp.Header.Get("Location")
	if loc != "" {
		if l, err := resp.Request.URL.Parse(loc); err == nil {
			loc = l.String()
		}
	}
	return step{status: resp.StatusCode, location: loc, body: string(raw), cookies: resp.Cookies()}
}

var hiddenRE = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// loginForm reads the provider's login form: the hidden fields.
func loginForm(t *testing.T, page string) url.Values {
	t.Helper()
	v := url.Values{}
	for _, m := range hiddenRE.FindAllStringSubmatch(page, -1) {
		v.Set(html.UnescapeString(m[1]), html.UnescapeString(m[2]))
	}
	if v.Get("client_id") == "" {
		t.Fatalf("no login form on the provider's page:\n%s", page)
	}
	return v
}

// start begins a sign-in at Allot and returns the provider's authorize URL.
func (b *ssoBrowser) start(e *env, next string) string {
	b.t.Helper()
	s := b.do("GET", e.url+"/login/oidc?next="+url.QueryEscape(next), nil)
	if s.status != http.StatusSeeOther {
		b.t.Fatalf("GET /login/oidc: %d %s", s.status, s.body)
	}
	return s.location
}

// authorize shows the provider's form at authURL and submits it with
// action ("login" or "deny"); it returns the callback URL the provider
// sends the browser to.
func (b *ssoBrowser) authorize(authURL, username, password, action string) string {
	b.t.Helper()
	s := b.do("GET", authURL, nil)
	if s.status != http.StatusOK {
		b.t.Fatalf("GET authorize: %d %s", s.status, s.body)
	}
	form := loginForm(b.t, s.body)
	form.Set("username", username)
	form.Set("password", password)
	form.Set("action", action)
	u, _ := url.Parse(authURL)
	s = b.do("POST", u.Scheme+"://"+u.Host+"/authorize", form)
	if s.status != http.StatusFound {
		b.t.Fatalf("POST authorize as %s: %d %s", username, s.status, s.body)
	}
	return s.location
}

// login signs in through the provider and returns where Allot sent the
// browser afterwards.
func (b *ssoBrowser) login(e *env, username, next string) string {
	b.t.Helper()
	cb := b.authorize(b.start(e, next), username, testPassword, "login")
	s := b.do("GET", cb, nil)
	if s.status != http.StatusSeeOther {
		b.t.Fatalf("callback as %s: %d %s", username, s.status, s.body)
	}
	return s.location
}

func sessionCount(t *testing.T, e *env) int {
	t.Helper()
	var n int
	if err := e.m.Pool.QueryRow(context.Background(), "SELECT count(*) FROM sessions").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOIDCLoginMapsRoles signs in each demo person through the real
// provider process and checks the roles Allot gives them from the groups
// claim, that IdP memberships replace the old ones, and the cookies.
func TestOIDCLoginMapsRoles(t *testing.T) {
	issuer := startProvider(t)
	e := bootSSO(t, issuer)
	ctx := context.Background()
	// nadia has an extra membership the IdP does not know about: it goes.
	if _, err := e.m.Pool.Exec(ctx, `INSERT INTO memberships (user_id, team, role) SELECT id, 'fraud', 'member' FROM users WHERE email = $1`,
		demo.PersonaEmail[demo.Lead]); err != nil {
		t.Fatal(err)
	}
	var usersBefore int
	e.m.Pool.QueryRow(ctx, "SELECT count(*) FROM users").Scan(&usersBefore) //nolint:errcheck

	// Each step of one flow, with its cookies.
	b := newSSOBrowser(t)
	s := b.do("GET", e.url+"/login/oidc?next="+url.QueryEscape("/jobs?state=pending"), nil)
	au, err := url.Parse(s.location)
	if s.status != http.StatusSeeOther || err != nil || !strings.HasPrefix(s.location, issuer+"/authorize?") {
		t.Fatalf("start: %d → %q", s.status, s.location)
	}
	q := au.Query()
	if q.Get("code_challenge_method") != "S256" || len(q.Get("code_challenge")) != 43 || q.Get("state") == "" || q.Get("nonce") == "" ||
		q.Get("client_id") != testClientID || q.Get("redirect_uri") != e.url+"/oidc/callback" || !strings.Contains(q.Get("scope"), "openid") {
		t.Errorf("authorize request lacks PKCE/state/nonce: %v", q)
	}
	var stateCookie *http.Cookie
	for _, c := range s.cookies {
		if c.Name == "allot_oidc_state" {
			stateCookie = c
		}
	}
	if stateCookie == nil || !stateCookie.HttpOnly || stateCookie.SameSite != http.SameSiteLaxMode || stateCookie.MaxAge <= 0 || stateCookie.MaxAge > 600 {
		t.Errorf("state cookie = %+v", stateCookie)
	}
	cb := b.authorize(s.location, "noah", testPassword, "login")
	s = b.do("GET", cb, nil)
	if s.status != http.StatusSeeOther || s.location != e.url+"/jobs?state=pending" {
		t.Fatalf("callback: %d → %q %s", s.status, s.location, s.body)
	}
	var session *http.Cookie
	for _, c := range s.cookies {
		if c.Name == "allot_session" {
			session = c
		}
	}
	if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteLaxMode || session.Value == "" {
		t.Errorf("session cookie = %+v", session)
	}
	if s := b.do("GET", e.url+"/jobs", nil); s.status != http.StatusOK || !strings.Contains(s.body, "Noah Kim") {
		t.Errorf("portal after sign-in: %d", s.status)
	}

	want := map[string]web.MeJSON{
		"noah":  {Email: demo.PersonaEmail[demo.Engineer], Name: "Noah Kim", Teams: map[string]string{"nlp": "member"}},
		"nadia": {Email: demo.PersonaEmail[demo.Lead], Name: "Nadia Petrova", Teams: map[string]string{"nlp": "lead"}},
		"finn":  {Email: demo.PersonaEmail[demo.Finance], Name: "Finn Finance", Finance: true, Teams: map[string]string{}},
		"ada":   {Email: demo.PersonaEmail[demo.Admin], Name: "Ada Admin", Admin: true, Teams: map[string]string{}},
	}
	for _, name := range []string{"noah", "nadia", "finn", "ada"} {
		b := newSSOBrowser(t)
		if to := b.login(e, name, ""); to != e.url+"/jobs" {
			t.Errorf("%s landed on %q", name, to)
		}
		s := b.do("GET", e.url+"/api/v1/me", nil)
		var me web.MeJSON
		if err := json.Unmarshal([]byte(s.body), &me); s.status != 200 || err != nil {
			t.Fatalf("%s /api/v1/me: %d %s", name, s.status, s.body)
		}
		w := want[name]
		if me.Email != w.Email || me.Name != w.Name || me.Admin != w.Admin || me.Finance != w.Finance || len(me.Teams) != len(w.Teams) {
			t.Errorf("%s: me = %+v, want %+v", name, me, w)
		}
		for team, role := range w.Teams {
			if me.Teams[team] != role {
				t.Errorf("%s: role in %s = %q, want %q", name, team, me.Teams[team], role)
			}
		}
		var subject string
		if err := e.m.Pool.QueryRow(ctx, "SELECT oidc_subject FROM users WHERE email = $1", w.Email).Scan(&subject); err != nil || subject != "dev-"+name {
			t.Errorf("%s: subject %q (%v), want the provider's", name, subject, err)
		}
	}
	var usersAfter int
	e.m.Pool.QueryRow(ctx, "SELECT count(*) FROM users").Scan(&usersAfter) //nolint:errcheck
	if usersAfter != usersBefore {
		t.Errorf("users %d → %d: sign-in must find people by email, not duplicate them", usersBefore, usersAfter)
	}

	// Logout (with the CSRF token) ends the session and signs out at the
	// provider, which sends the browser back to the login page.
	s = b.do("GET", e.url+"/jobs", nil)
	m := csrfRE.FindStringSubmatch(s.body)
	if m == nil {
		t.Fatal("no CSRF token on the jobs page")
	}
	s = b.do("POST", e.url+"/logout", url.Values{"_csrf": {m[1]}})
	if s.status != http.StatusSeeOther || !strings.HasPrefix(s.location, issuer+"/end_session?") {
		t.Fatalf("logout: %d → %q", s.status, s.location)
	}
	if s = b.do("GET", s.location, nil); s.status != http.StatusFound || s.location != e.url+"/login" {
		t.Errorf("end session: %d → %q", s.status, s.location)
	}
	if s = b.do("GET", e.url+"/jobs", nil); s.status != http.StatusSeeOther || !strings.HasPrefix(s.location, e.url+"/login") {
		t.Errorf("after logout /jobs: %d → %q", s.status, s.location)
	}
}

// TestOIDCRefusals: replayed state, a state from another browser, an ID
// token with another nonce, the IdP refusing, a wrong password, and
// open-redirect attempts; none creates a session.
func TestOIDCRefusals(t *testing.T) {
	issuer := startProvider(t)
	e := bootSSO(t, issuer)
	refused := func(name string, s step, status int, msg string) {
		t.Helper()
		if s.status != status || !strings.Contains(s.body, msg) || !strings.Contains(s.body, `data-testid="login-error"`) {
			t.Errorf("%s: %d, want %d with %q\n%s", name, s.status, status, msg, s.body)
		}
		for _, c := range s.cookies {
			if c.Name == "allot_session" && c.Value != "" {
				t.Errorf("%s: a session cookie was set", name)
			}
		}
	}

	// A completed sign-in's callback, replayed.
	b := newSSOBrowser(t)
	authURL := b.start(e, "")
	state, _ := url.Parse(authURL)
	cb := b.authorize(authURL, "noah", testPassword, "login")
	if s := b.do("GET", cb, nil); s.status != http.StatusSeeOther {
		t.Fatalf("first callback: %d", s.status)
	}
	before := sessionCount(t, e)
	refused("replay, state cookie gone", b.do("GET", cb, nil), http.StatusBadRequest, "not started in this browser")
	// Even with the state cookie put back, the state works once.
	u, _ := url.Parse(e.url + "/oidc/")
	b.jar.SetCookies(u, []*http.Cookie{{Name: "allot_oidc_state", Value: state.Query().Get("state"), Path: "/oidc/"}})
	refused("replay with the cookie", b.do("GET", cb, nil), http.StatusBadRequest, "already used or has expired")

	// A callback for a sign-in another browser started (login CSRF).
	victim, attacker := newSSOBrowser(t), newSSOBrowser(t)
	cb = attacker.authorize(attacker.start(e, ""), "ada", testPassword, "login")
	victim.start(e, "")
	refused("state of another browser", victim.do("GET", cb, nil), http.StatusBadRequest, "not started in this browser")

	// An ID token minted for another nonce (injected into this sign-in):
	// PKCE passes, the nonce check does not.
	b = newSSOBrowser(t)
	au, _ := url.Parse(b.start(e, ""))
	q := au.Query()
	q.Set("nonce", "attacker-chosen-nonce")
	au.RawQuery = q.Encode()
	refused("wrong nonce", b.do("GET", b.authorize(au.String(), "noah", testPassword, "login"), nil), http.StatusBadRequest, "nonce mismatch")

	// A tampered code challenge: the provider refuses the verifier.
	b = newSSOBrowser(t)
	au, _ = url.Parse(b.start(e, ""))
	q = au.Query()
	q.Set("code_challenge", strings.Repeat("A", 43))
	au.RawQuery = q.Encode()
	refused("PKCE mismatch", b.do("GET", b.authorize(au.String(), "noah", testPassword, "login"), nil), http.StatusBadRequest, "PKCE")

	// The person cancels at the provider.
	b = newSSOBrowser(t)
	refused("IdP error", b.do("GET", b.authorize(b.start(e, ""), "noah", "", "deny"), nil), http.StatusForbidden, "access_denied")

	// A wrong password stays at the provider.
	b = newSSOBrowser(t)
	s := b.do("GET", b.start(e, ""), nil)
	form := loginForm(t, s.body)
	form.Set("username", "noah")
	form.Set("password", "wrong")
	form.Set("action", "login")
	if s = b.do("POST", issuer+"/authorize", form); s.status != http.StatusUnauthorized || !strings.Contains(s.body, "Wrong username or password") {
		t.Errorf("wrong password: %d", s.status)
	}
	// A made-up code with a real state.
	b = newSSOBrowser(t)
	au, _ = url.Parse(b.start(e, ""))
	refused("made-up code", b.do("GET", e.url+"/oidc/callback?code=nope&state="+url.QueryEscape(au.Query().Get("state")), nil),
		http.StatusBadRequest, "invalid_grant")
	if after := sessionCount(t, e); after != before {
		t.Errorf("sessions %d → %d: a refused sign-in made one", before, after)
	}

	// next= never leaves the site.
	for _, next := range []string{"https://evil.example/x", "//evil.example/x", "/\\evil.example", "http:/evil.example", "javascript:alert(1)", "/login"} {
		b := newSSOBrowser(t)
		if to := b.login(e, "noah", next); to != e.url+"/jobs" {
			t.Errorf("next=%q: landed on %q", next, to)
		}
	}
	if to := newSSOBrowser(t).login(e, "noah", "/teams/nlp?tab=alerts"); to != e.url+"/teams/nlp?tab=alerts" {
		t.Errorf("a local next: landed on %q", to)
	}
	// The login page passes a safe next to the SSO link only.
	s = newSSOBrowser(t).do("GET", e.url+"/login?next="+url.QueryEscape("//evil.example"), nil)
	if !strings.Contains(s.body, `href="/login/oidc?next=%2Fjobs"`) {
		t.Errorf("login page SSO link with an external next:\n%s", s.body)
	}
}

// TestOIDCEmailLinking: a first SSO sign-in links the account Allot
// created for the person by email; a second provider account with the same
// email, or one whose provider does not say the email is verified, is
// refused (403: an admin must link it, no session) and changes nothing.
func TestOIDCEmailLinking(t *testing.T) {
	nadiaEmail, finnEmail := demo.PersonaEmail[demo.Lead], demo.PersonaEmail[demo.Finance]
	issuer := startProvider(t, "--user", "mallory:idp-mallory:"+nadiaEmail, "--user", "zed:idp-zed:"+finnEmail+":unverified")
	e := bootSSO(t, issuer)
	ctx := context.Background()
	subject := func(email string) string {
		var s string
		if err := e.m.Pool.QueryRow(ctx, "SELECT oidc_subject FROM users WHERE email = $1", email).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	var users int
	e.m.Pool.QueryRow(ctx, "SELECT count(*) FROM users").Scan(&users) //nolint:errcheck
	refused := func(name, username, msg string) {
		t.Helper()
		before := sessionCount(t, e)
		b := newSSOBrowser(t)
		s := b.do("GET", b.authorize(b.start(e, ""), username, testPassword, "login"), nil)
		if s.status != http.StatusForbidden || !strings.Contains(s.body, msg) || !strings.Contains(s.body, "An admin must link") ||
			!strings.Contains(s.body, `data-testid="login-error"`) {
			t.Errorf("%s: %d, want 403 with %q\n%s", name, s.status, msg, s.body)
		}
		for _, c := range s.cookies {
			if c.Name == "allot_session" && c.Value != "" {
				t.Errorf("%s: a session cookie was set", name)
			}
		}
		if after := sessionCount(t, e); after != before {
			t.Errorf("%s: sessions %d → %d", name, before, after)
		}
	}

	// nadia's first sign-in links the demo's account.
	if to := newSSOBrowser(t).login(e, "nadia", ""); to != e.url+"/jobs" || subject(nadiaEmail) != "dev-nadia" {
		t.Fatalf("nadia's first sign-in: landed on %q, subject %q", to, subject(nadiaEmail))
	}
	// Another account at the provider with nadia's (verified) email.
	refused("second account", "mallory", "signs in with another identity-provider account")
	if s := subject(nadiaEmail); s != "dev-nadia" {
		t.Errorf("nadia's subject is now %q", s)
	}
	// No email_verified claim: finn's account, never signed in, is not linked.
	refused("unverified email", "zed", "does not say this email address is verified")
	if s := subject(finnEmail); !strings.HasPrefix(s, "demo|") {
		t.Errorf("finn's subject is now %q", s)
	}
	// finn himself, verified, is linked.
	if to := newSSOBrowser(t).login(e, "finn", ""); to != e.url+"/jobs" || subject(finnEmail) != "dev-finn" {
		t.Errorf("finn's sign-in: landed on %q, subject %q", to, subject(finnEmail))
	}
	var after int
	e.m.Pool.QueryRow(ctx, "SELECT count(*) FROM users").Scan(&after) //nolint:errcheck
	if after != users {
		t.Errorf("users %d → %d", users, after)
	}
}

// TestDevLoginOnlyInDevMode: without dev mode the persona login is 404
// and the login page offers SSO only.
func TestDevLoginOnlyInDevMode(t *testing.T) {
	issuer := startProvider(t)
	e := bootSSO(t, issuer)
	b := newSSOBrowser(t)
	s := b.do("GET", e.url+"/login", nil)
	if s.status != 200 || !strings.Contains(s.body, `data-testid="sso-login"`) || strings.Contains(s.body, `data-testid="persona-`) {
		t.Fatalf("login page without dev mode: %d\n%s", s.status, s.body)
	}
	m := csrfRE.FindStringSubmatch(s.body)
	if m == nil {
		// The SSO-only page has no form; take the token from the cookie.
		for _, c := range b.jar.Cookies(mustURL(t, e.url)) {
			if c.Name == "_csrf" {
				m = []string{"", c.Value}
			}
		}
	}
	if m == nil {
		t.Fatal("no CSRF token")
	}
	before := sessionCount(t, e)
	s = b.do("POST", e.url+"/login/dev", url.Values{"_csrf": {m[1]}, "persona": {demo.Admin}})
	if s.status != http.StatusNotFound {
		t.Errorf("dev login without dev mode: %d, want 404", s.status)
	}
	if sessionCount(t, e) != before {
		t.Error("dev login made a session")
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestOIDCProviderDown: SSO configured but the provider unreachable: the
// portal still serves, and starting a sign-in says why it cannot.
func TestOIDCProviderDown(t *testing.T) {
	e := bootSSO(t, "http://127.0.0.1:1") // nothing listens on port 1
	b := newSSOBrowser(t)
	if s := b.do("GET", e.url+"/login", nil); s.status != 200 || !strings.Contains(s.body, `data-testid="sso-login"`) {
		t.Fatalf("login page: %d", s.status)
	}
	s := b.do("GET", e.url+"/login/oidc", nil)
	if s.status != http.StatusBadGateway || !strings.Contains(s.body, "Single sign-on is unavailable") {
		t.Errorf("sign-in with the provider down: %d\n%s", s.status, s.body)
	}
	if code, _, _ := e.api("GET", "/api/v1/me", "", ""); code != http.StatusUnauthorized {
		t.Errorf("API without a token: %d", code)
	}
}

// TestOIDCFlags: the server's SSO settings come from flags or ALLOT_OIDC_*
// and a half-done or unsafe configuration is refused.
func TestOIDCFlags(t *testing.T) {
	parse := func(args ...string) (web.OIDCConfig, error) {
		fs := flag.NewFlagSet("server", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		get := oidcFlags(fs)
		if err := fs.Parse(args); err != nil {
			return web.OIDCConfig{}, err
		}
		return get()
	}
	if c, err := parse(); err != nil || c.Enabled() {
		t.Errorf("no flags: %+v %v", c, err)
	}
	t.Setenv("ALLOT_OIDC_ISSUER", "https://idp.example.com/realms/acme")
	t.Setenv("ALLOT_OIDC_CLIENT_ID", "allot")
	t.Setenv("ALLOT_OIDC_CLIENT_SECRET", "s")
	t.Setenv("ALLOT_OIDC_GROUPS_CLAIM", "roles")
	c, err := parse("--oidc-redirect-url", "https://allot.example.com/oidc/callback", "--oidc-admin-group", "gpu-admins")
	if err != nil || c.Issuer != "https://idp.example.com/realms/acme" || c.ClientID != "allot" || c.ClientSecret != "s" ||
		c.Claims.GroupsClaim != "roles" || c.Claims.AdminGroup != "gpu-admins" || c.Claims.FinanceGroup != "allot-finance" ||
		len(c.Scopes) != 0 || len(c.LinkEmailIssuers) != 0 {
		t.Errorf("from env and flags: %+v %v", c, err)
	}
	for _, args := range [][]string{
		{"--oidc-client-id", ""},
		{"--oidc-issuer", "http://idp.example.com"},
		{"--oidc-redirect-url", "http://allot.example.com/oidc/callback"},
		{"--oidc-issuer", "idp.example.com"},
		{"--oidc-groups-claim", ""},
	} {
		if _, err := parse(args...); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	if _, err := parse("--oidc-issuer", "http://127.0.0.1:8081"); err != nil {
		t.Errorf("plain http on localhost: %v", err)
	}
	// An issuer elsewhere needs an explicit https callback: the default (the
	// listen address, plain http) would leave the session cookie non-Secure.
	for _, redirect := range []string{"", "http://127.0.0.1:8080/oidc/callback", "http://localhost/oidc/callback"} {
		if _, err := parse("--oidc-redirect-url", redirect); err == nil || !strings.Contains(err.Error(), "--oidc-redirect-url") {
			t.Errorf("issuer %s with redirect %q: %v, want refused", os.Getenv("ALLOT_OIDC_ISSUER"), redirect, err)
		}
	}
	if rc := run([]string{"server", "--database-url", "postgres://nowhere"}, io.Discard, io.Discard); rc != 2 {
		t.Errorf("allot server with a remote issuer and no redirect URL: exit %d, want 2", rc)
	}
	t.Setenv("ALLOT_OIDC_ISSUER", "http://localhost:8081")
	if c, err := parse(); err != nil || c.RedirectURL != "" {
		t.Errorf("localhost issuer without a redirect URL: %+v %v", c, err)
	}
	if rc := run([]string{"server", "--oidc-issuer", "http://idp.example.com", "--database-url", "postgres://nowhere"}, io.Discard, io.Discard); rc != 2 {
		t.Errorf("allot server with an http issuer: exit %d, want 2", rc)
	}
}
