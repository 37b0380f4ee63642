package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// The allot login tests run the CLI as its own OS process, as a person
// would: the test binary re-executes itself as `allot ARGS…` when this
// variable holds the arguments (JSON), with its own XDG_CONFIG_HOME and
// clock.
const cliEnv = "ALLOT_TEST_CLI_ARGS"

func init() {
	if v, ok := os.LookupEnv(cliEnv); ok {
		var args []string
		if err := json.Unmarshal([]byte(v), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(run(args, os.Stdout, os.Stderr))
	}
}

const testCLIClientID = "allot-cli-test"

// cliUser is one person's shell: a config directory and a clock offset
// from the test's clock.
type cliUser struct {
	t      *testing.T
	config string // XDG_CONFIG_HOME
	ahead  time.Duration
}

func newCLIUser(t *testing.T) *cliUser { return &cliUser{t: t, config: t.TempDir()} }

func (u *cliUser) credsPath() string { return filepath.Join(u.config, "allot", "credentials.json") }

func (u *cliUser) command(args ...string) *exec.Cmd {
	u.t.Helper()
	a, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), cliEnv+"="+string(a), "XDG_CONFIG_HOME="+u.config, "ALLOT_TOKEN=", "ALLOT_URL=", "BROWSER=true",
		clock.EnvOffset+"="+(clock.Offset()+u.ahead).String())
	return cmd
}

// run runs the CLI to its end.
func (u *cliUser) run(args ...string) (int, string, string) {
	u.t.Helper()
	cmd := u.command(args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		u.t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

var (
	verifyLineRE = regexp.MustCompile(`(?m)^    (http\S+/device)\n.*\n    ([A-Z]{4}-[A-Z]{4})$`)
	completeRE   = regexp.MustCompile(`(?m)^or open (http\S+)$`)
)

// login runs `allot login --server url` and, once it shows its code,
// answers at the provider as a person with a browser would (action
// "allow" as username, or "deny"); it returns the CLI's exit code and
// output.
func (u *cliUser) login(server, username, action string) (int, string, string) {
	u.t.Helper()
	cmd := u.command("login", "--server", server)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		u.t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		u.t.Fatal(err)
	}
	done := make(chan struct{})
	defer close(done)
	go func() { // no CLI outlives its test
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			cmd.Process.Kill() //nolint:errcheck
		}
	}()
	var out strings.Builder
	r := bufio.NewReader(stdout)
	for !completeRE.MatchString(out.String()) {
		line, err := r.ReadString('\n')
		out.WriteString(line)
		if err != nil {
			cmd.Wait() //nolint:errcheck
			return cliExitCode(cmd), out.String(), errb.String()
		}
	}
	m := verifyLineRE.FindStringSubmatch(out.String())
	if m == nil {
		u.t.Fatalf("allot login printed no verification URI and code:\n%s", out.String())
	}
	if action != "" {
		approveDevice(u.t, m[1], m[2], username, action)
	}
	rest, _ := io.ReadAll(r)
	out.Write(rest)
	cmd.Wait() //nolint:errcheck
	return cliExitCode(cmd), out.String(), errb.String()
}

func cliExitCode(cmd *exec.Cmd) int {
	if cmd.ProcessState == nil {
		return -1
	}
	return cmd.ProcessState.ExitCode()
}

// approveDevice opens the verification page, types the code and signs in
// (action "allow") or denies.
func approveDevice(t *testing.T, verifyURI, code, username, action string) {
	t.Helper()
	resp, err := http.Get(verifyURI)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), `name="user_code"`) {
		t.Fatalf("verification page: %d %s", resp.StatusCode, page)
	}
	resp, err = http.PostForm(verifyURI, url.Values{"user_code": {code}, "username": {username}, "password": {testPassword}, "action": {action}})
	if err != nil {
		t.Fatal(err)
	}
	page, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("answering the device code (%s): %d %s", action, resp.StatusCode, page)
	}
}

func (u *cliUser) creds() *client.Credentials {
	u.t.Helper()
	c, err := client.LoadCredentials(u.credsPath())
	if err != nil {
		u.t.Fatal(err)
	}
	return c
}

// bootCLISSO boots a server whose SSO has allot login's client, on a clock
// the test moves.
func bootCLISSO(t *testing.T, issuer, cliClient string, shift *atomic.Int64) *env {
	t.Helper()
	return bootMain(t, cliSSOMain(issuer, cliClient, shift))
}

func cliSSOMain(issuer, cliClient string, shift *atomic.Int64) *Main {
	return &Main{Config: Config{Now: func() time.Time { return clock.Now().Add(time.Duration(shift.Load())) },
		OIDC: web.OIDCConfig{Issuer: issuer, ClientID: testClientID, ClientSecret: testClientSecret, CLIClientID: cliClient,
			LinkEmailIssuers: []string{issuer}}}}
}

// anotherServer is one more server in a test that booted one (bootMain
// may run once per test).
func anotherServer(t *testing.T, m *Main) *env {
	t.Helper()
	e := &env{t: t, m: m, tokens: map[string]string{}}
	startSeeded(t, &e.m)
	e.url = m.URL()
	return e
}

func tokenRow(t *testing.T, e *env, secret string) (name string, expires time.Time, revoked bool) {
	t.Helper()
	tok, err := e.m.Store.APITokenBySecret(context.Background(), secret)
	if err != nil {
		t.Fatal(err)
	}
	return tok.Name, tok.ExpiresAt, !tok.RevokedAt.IsZero()
}

func (e *env) actionCount(action string) int {
	e.t.Helper()
	var n int
	if err := e.m.Pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log WHERE action = $1`, action).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestCLILogin: allot login through the device flow against the real
// provider process, a CLI that then works with the stored token, its
// renewal with the refresh token once it expires, the end of the sign-in
// at the provider, logout, and stored files that are refused.
func TestCLILogin(t *testing.T) {
	issuer := startProvider(t, "--cli-client-id", testCLIClientID, "--device-interval", "1s")
	var shift atomic.Int64
	e := bootCLISSO(t, issuer, testCLIClientID, &shift)
	ctx := context.Background()
	host, _ := os.Hostname()
	u := newCLIUser(t)

	code, out, errOut := u.login(e.url, "noah", "allow")
	if code != 0 || !strings.Contains(out, "Signed in to "+e.url+" as "+demo.PersonaEmail[demo.Engineer]) || !strings.Contains(out, "renews itself") {
		t.Fatalf("allot login: %d\n%s\n%s", code, out, errOut)
	}
	if m := completeRE.FindStringSubmatch(out); m == nil || !strings.Contains(m[1], "user_code=") {
		t.Errorf("no verification_uri_complete in:\n%s", out)
	}
	for path, want := range map[string]os.FileMode{u.credsPath(): 0o600, filepath.Dir(u.credsPath()): 0o700} {
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want mode %04o", path, st.Mode(), err, want)
		}
	}
	first := u.creds()
	now := e.m.Store.Now()
	if first.Server != e.url || !strings.HasPrefix(first.Token, "allot_") || first.RefreshToken == "" || first.Issuer != issuer ||
		first.ClientID != testCLIClientID || first.ExpiresAt.Sub(clock.Now()) < 11*time.Hour || first.ExpiresAt.Sub(clock.Now()) > 12*time.Hour {
		t.Fatalf("stored credentials: %+v", first)
	}
	name, expires, revoked := tokenRow(t, e, first.Token)
	if name != web.CLITokenNamePrefix+host || revoked || expires.Sub(now) > 12*time.Hour || expires.Sub(now) < 11*time.Hour {
		t.Errorf("the API token: %q until %s (revoked %v)", name, expires, revoked)
	}
	if n := e.actionCount("token.cli_login"); n != 1 {
		t.Errorf("%d token.cli_login audit entries, want 1", n)
	}

	// Commands use it: no --server, no --token.
	code, out, errOut = u.run("jobs")
	if code != 0 || !strings.Contains(out, "nlp") {
		t.Fatalf("allot jobs with the stored token: %d\n%s\n%s", code, out, errOut)
	}
	// --token still comes first (here: a bad one).
	if code, _, errOut = u.run("jobs", "--token", "allot_nope"); code == 0 || !strings.Contains(errOut, "invalid or revoked API token") {
		t.Errorf("--token over the stored one: %d %s", code, errOut)
	}
	// Another server than the one signed in to gets no token (here the
	// same one by another name).
	other := strings.Replace(e.url, "127.0.0.1", "localhost", 1)
	if code, _, errOut = u.run("jobs", "--server", other); code == 0 || !strings.Contains(errOut, "allot login signed in to "+e.url+", not "+other) {
		t.Errorf("another server: %d %s", code, errOut)
	}

	// 13 hours later, on the server and in the shell: the token expired;
	// the command renews it with the refresh token, transparently.
	shift.Store(int64(13 * time.Hour))
	u.ahead = 13 * time.Hour
	code, out, errOut = u.run("jobs")
	if code != 0 || !strings.Contains(out, "nlp") {
		t.Fatalf("allot jobs after expiry: %d\n%s\n%s", code, out, errOut)
	}
	second := u.creds()
	if second.Token == first.Token || second.RefreshToken == first.RefreshToken || second.RefreshToken == "" || !second.ExpiresAt.After(first.ExpiresAt) {
		t.Errorf("renewal did not rewrite the credentials: %+v", second)
	}
	if _, _, revoked := tokenRow(t, e, first.Token); !revoked {
		t.Error("the old API token still works after the renewal")
	}
	if code, _, errOut = u.run("jobs"); code != 0 {
		t.Errorf("allot jobs with the renewed token: %d %s", code, errOut)
	}
	if third := u.creds(); third.Token != second.Token {
		t.Error("a token that works was renewed again")
	}
	if n := e.actionCount("token.cli_login"); n != 2 {
		t.Errorf("%d token.cli_login audit entries, want 2", n)
	}

	// Revoked on the tokens page (here: the API): refused now, and not
	// renewed once it expires either.
	if err := client.New(e.url, second.Token).RevokeToken(ctx, second.TokenID); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut = u.run("jobs"); code != 1 || !strings.Contains(errOut, "refused the token allot login stored") {
		t.Errorf("a revoked token: %d %s", code, errOut)
	}
	shift.Store(int64(26 * time.Hour))
	u.ahead = 26 * time.Hour
	if code, _, errOut = u.run("jobs"); code != 1 || !strings.Contains(errOut, "was revoked: run allot login again") {
		t.Errorf("renewing a revoked token: %d %s", code, errOut)
	}

	// The sign-in ends at the provider (its refresh token revoked): the
	// command says to log in again.
	resp, err := http.PostForm(issuer+"/revoke", url.Values{"client_id": {testCLIClientID}, "token": {u.creds().RefreshToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code, _, errOut = u.run("jobs"); code != 1 || !strings.Contains(errOut, "session has ended") || !strings.Contains(errOut, "run allot login again") {
		t.Errorf("expired with a revoked refresh token: %d %s", code, errOut)
	}

	// Logout: the file goes (the token expired already).
	if code, out, errOut = u.run("logout"); code != 0 || !strings.Contains(out, "Signed out of "+e.url) {
		t.Errorf("logout: %d %s %s", code, out, errOut)
	}
	if _, err := os.Stat(u.credsPath()); !os.IsNotExist(err) {
		t.Errorf("credentials after logout: %v", err)
	}
	if code, _, errOut = u.run("jobs", "--server", e.url); code != 1 || !strings.Contains(errOut, "not signed in: run allot login --server "+e.url) {
		t.Errorf("jobs after logout: %d %s", code, errOut)
	}
	if code, out, _ = u.run("logout"); code != 0 || !strings.Contains(out, "Not signed in") {
		t.Errorf("logout twice: %d %s", code, out)
	}

	// Log in again and log out while the token works: it is revoked at
	// once, and the refresh token at the provider.
	shift.Store(0)
	u.ahead = 0
	if code, out, errOut = u.login(e.url, "noah", "allow"); code != 0 {
		t.Fatalf("second login: %d %s %s", code, out, errOut)
	}
	live := u.creds()
	if code, _, errOut = u.run("logout"); code != 0 || errOut != "" {
		t.Errorf("logout: %d %s", code, errOut)
	}
	if _, _, revoked := tokenRow(t, e, live.Token); !revoked {
		t.Error("logout left the working API token unrevoked")
	}
	resp, err = http.PostForm(issuer+"/token", url.Values{"grant_type": {"refresh_token"}, "client_id": {testCLIClientID}, "refresh_token": {live.RefreshToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("the refresh token after logout: %d, want refused", resp.StatusCode)
	}

	// Stored files that are refused: one others may read, and a token
	// the server revoked before its expiry.
	noah, err := e.m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Engineer])
	if err != nil {
		t.Fatal(err)
	}
	secret, tok, err := e.m.Store.CreateAPITokenExpiring(ctx, noah.ID, "revoked", e.m.Store.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Store.RevokeAPIToken(ctx, tok.ID, &allot.User{ID: noah.ID}); err != nil {
		t.Fatal(err)
	}
	if err := client.SaveCredentials(u.credsPath(), &client.Credentials{Server: e.url, Token: secret, TokenID: tok.ID, ExpiresAt: clock.Now().Add(time.Hour),
		Issuer: issuer, ClientID: testCLIClientID, RefreshToken: "whatever"}); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut = u.run("jobs"); code != 1 || !strings.Contains(errOut, "refused the token allot login stored") {
		t.Errorf("a revoked stored token: %d %s", code, errOut)
	}
	if err := os.Chmod(u.credsPath(), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut = u.run("jobs", "--server", e.url); code != 1 || !strings.Contains(errOut, "readable by other users") {
		t.Errorf("a world-readable file: %d %s", code, errOut)
	}

	// A person an admin disabled gets no token.
	ada, err := e.m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Store.DisableUser(ctx, demo.PersonaEmail[demo.Engineer], &ada, "left"); err != nil {
		t.Fatal(err)
	}
	if st, p := exchange(t, e, `{"id_token":"`+deviceIDToken(t, issuer, testCLIClientID).IDToken+`"}`); st != 403 || !strings.Contains(strings.ToLower(p.Detail), "disabled") {
		t.Errorf("disabled: %d %+v", st, p)
	}
}

// deviceIDToken runs the device flow at issuer for client as noah over
// HTTP and returns the provider's tokens.
func deviceIDToken(t *testing.T, issuer, clientID string) *client.Tokens {
	t.Helper()
	ctx := context.Background()
	p, err := client.Discover(ctx, http.DefaultClient, issuer)
	if err != nil {
		t.Fatal(err)
	}
	d, err := p.DeviceAuth(ctx, http.DefaultClient, clientID, []string{"openid", "profile", "email"})
	if err != nil {
		t.Fatal(err)
	}
	approveDevice(t, d.VerificationURI, d.UserCode, "noah", "allow")
	tok, err := p.PollDevice(ctx, http.DefaultClient, clientID, d, func(context.Context, time.Duration) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// portalIDToken signs noah in at the provider with the portal's client
// (the authorization-code flow) and returns its ID token: one for another
// audience than the CLI's.
func portalIDToken(t *testing.T, issuer string) string {
	t.Helper()
	verifier := strings.Repeat("v", 50)
	sum := sha256.Sum256([]byte(verifier))
	b := newSSOBrowser(t)
	q := url.Values{"response_type": {"code"}, "client_id": {testClientID}, "redirect_uri": {"http://127.0.0.1:9/oidc/callback"},
		"scope": {"openid email profile"}, "state": {"s"}, "code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}}
	cb, err := url.Parse(b.authorize(issuer+"/authorize?"+q.Encode(), "noah", testPassword, "login"))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", issuer+"/token", strings.NewReader(url.Values{"grant_type": {"authorization_code"}, "code": {cb.Query().Get("code")},
		"code_verifier": {verifier}, "redirect_uri": {"http://127.0.0.1:9/oidc/callback"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(testClientID, testClientSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tok client.Tokens
	if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil || tok.IDToken == "" {
		t.Fatalf("portal code exchange: %d %v", resp.StatusCode, err)
	}
	return tok.IDToken
}

// exchange posts body to the server's CLI token exchange.
func exchange(t *testing.T, e *env, body string) (int, web.Problem) {
	t.Helper()
	resp, err := http.Post(e.url+"/api/v1/auth/cli/token", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p web.Problem
	json.NewDecoder(resp.Body).Decode(&p) //nolint:errcheck
	return resp.StatusCode, p
}

// TestCLILoginRefusals: servers where allot login cannot work (no SSO, no
// CLI client, the provider down), a denied and an expired code, and ID
// tokens the exchange refuses (garbage, another audience, expired, a
// disabled person); none makes a token or a file.
func TestCLILoginRefusals(t *testing.T) {
	// Short-lived codes and tokens: the expiries below take seconds.
	issuer := startProvider(t, "--cli-client-id", testCLIClientID, "--device-interval", "1s", "--device-code-ttl", "2s", "--token-ttl", "1s")
	var shift atomic.Int64
	e := bootCLISSO(t, issuer, testCLIClientID, &shift)
	noSSO := anotherServer(t, &Main{Config: Config{DevMode: true}})
	noCLI := anotherServer(t, cliSSOMain(issuer, "", &shift))
	down := anotherServer(t, cliSSOMain("http://127.0.0.1:1", testCLIClientID, &shift))
	u := newCLIUser(t)
	tokensBefore := e.tokenCount()

	for name, tc := range map[string]struct {
		server, want string
	}{
		"no SSO":        {noSSO.url, "single sign-on is not configured on this server"},
		"no CLI client": {noCLI.url, "no client for the CLI (allot server --oidc-cli-client-id"},
		"provider down": {down.url, "cannot reach the identity provider http://127.0.0.1:1"},
		"server down":   {"http://127.0.0.1:1", "cannot reach the Allot server"},
	} {
		if code, out, errOut := u.login(tc.server, "", ""); code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: %d %q %q, want %q", name, code, out, errOut, tc.want)
		}
	}
	if code, _, errOut := u.run("login", "extra"); code != 2 || !strings.Contains(errOut, "unexpected argument") {
		t.Errorf("login extra: %d %s", code, errOut)
	}

	// The person denies; the code expires (2 s) before anyone answers.
	if code, _, errOut := u.login(e.url, "", "deny"); code != 1 || !strings.Contains(errOut, "denied at the identity provider") {
		t.Errorf("denied: %d %s", code, errOut)
	}
	idt := deviceIDToken(t, issuer, testCLIClientID) // expires in 1 s
	if code, _, errOut := u.login(e.url, "", ""); code != 1 || !strings.Contains(errOut, "code expired") {
		t.Errorf("expired code: %d %s", code, errOut)
	}
	if _, err := os.Stat(u.credsPath()); !os.IsNotExist(err) {
		t.Errorf("a failed login left %s: %v", u.credsPath(), err)
	}

	// The exchange itself.
	body := func(idToken string) string {
		b, _ := json.Marshal(web.CLITokenRequest{IDToken: idToken, Host: "test"})
		return string(b)
	}
	for name, tc := range map[string]struct {
		body   string
		status int
		want   string
	}{
		"expired":        {body(idt.IDToken), 401, "the ID token expired"},
		"garbage":        {body("not.a.jwt"), 401, "failed verification"},
		"other audience": {body(portalIDToken(t, issuer)), 401, "failed verification"},
		"no ID token":    {`{"host":"x"}`, 422, ""},
		"unknown field":  {`{"id_token":"x","password":"y"}`, 422, ""},
		"bad host":       {`{"id_token":"x","host":"` + strings.Repeat("h", 61) + `"}`, 422, ""},
	} {
		if st, p := exchange(t, e, tc.body); st != tc.status || !strings.Contains(p.Detail, tc.want) {
			t.Errorf("%s: %d %+v", name, st, p)
		}
	}
	if st, p := exchange(t, noSSO, body("x")); st != 404 || !strings.Contains(p.Detail, "not configured") {
		t.Errorf("no SSO: %d %+v", st, p)
	}
	if n := e.tokenCount(); n != tokensBefore {
		t.Errorf("refused sign-ins made %d API tokens", n-tokensBefore)
	}
	if n := e.actionCount("token.cli_login"); n != 0 {
		t.Errorf("%d token.cli_login audit entries", n)
	}
}

// TestDevLogin: allot login works against `allot dev` (make run) out of
// the box, through its development provider's CLI client.
func TestDevLogin(t *testing.T) {
	t.Parallel()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	args, _ := devArgs(t, "--no-agents", "--oidc-addr", addr, "--oidc-password", testPassword)
	d := startDev(t, args...)
	m := regexp.MustCompile(`Allot is running at (http://\S+)`).FindStringSubmatch(d.Stdout.String())
	if m == nil || !strings.Contains(d.Stdout.String(), "bin/allot login --server "+m[1]) {
		t.Fatalf("allot dev does not say how to allot login:\n%s", d.Stdout)
	}
	u := newCLIUser(t)
	if code, out, errOut := u.login(m[1], "nadia", "allow"); code != 0 || !strings.Contains(out, "as "+demo.PersonaEmail[demo.Lead]) {
		t.Fatalf("allot login against allot dev: %d\n%s\n%s", code, out, errOut)
	}
	if code, out, errOut := u.run("jobs"); code != 0 || !strings.Contains(out, "nlp") {
		t.Errorf("allot jobs: %d\n%s\n%s", code, out, errOut)
	}
}

// TestCLILoginBrowser: allot login --browser, the authorization-code flow
// with PKCE through a loopback redirect (RFC 8252), with the test as the
// browser; a forged return is turned away, a denial ends it.
func TestCLILoginBrowser(t *testing.T) {
	issuer := startProvider(t, "--cli-client-id", testCLIClientID)
	var shift atomic.Int64
	e := bootCLISSO(t, issuer, testCLIClientID, &shift)
	u := newCLIUser(t)
	login := func(action string, forge bool) (int, string, string) {
		t.Helper()
		cmd := u.command("login", "--server", e.url, "--browser")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Process.Kill() //nolint:errcheck // if it is still waiting
		var out strings.Builder
		r := bufio.NewReader(stdout)
		var authURL string
		for authURL == "" {
			line, err := r.ReadString('\n')
			out.WriteString(line)
			if err != nil {
				t.Fatalf("allot login --browser printed no address:\n%s\n%s", out.String(), errb.String())
			}
			if l := strings.TrimSpace(line); strings.HasPrefix(l, issuer+"/authorize?") {
				authURL = l
			}
		}
		au, _ := url.Parse(authURL)
		q := au.Query()
		if q.Get("code_challenge_method") != "S256" || q.Get("state") == "" || q.Get("nonce") == "" || !strings.HasPrefix(q.Get("redirect_uri"), "http://127.0.0.1:") {
			t.Errorf("authorization request: %v", q)
		}
		b := newSSOBrowser(t)
		if forge {
			fake := q.Get("redirect_uri") + "?code=forged&state=other"
			if s := b.do("GET", fake, nil); s.status != http.StatusBadRequest {
				t.Errorf("a forged return: %d %s", s.status, s.body)
			}
		}
		cb := b.authorize(authURL, "noah", testPassword, action)
		if s := b.do("GET", cb, nil); s.status != http.StatusOK {
			t.Errorf("the return to allot login: %d %s", s.status, s.body)
		}
		rest, _ := io.ReadAll(r)
		out.Write(rest)
		cmd.Wait() //nolint:errcheck
		return cliExitCode(cmd), out.String(), errb.String()
	}
	if code, out, errOut := login("login", true); code != 0 || !strings.Contains(out, "Signed in to "+e.url+" as "+demo.PersonaEmail[demo.Engineer]) {
		t.Fatalf("allot login --browser: %d\n%s\n%s", code, out, errOut)
	}
	if c := u.creds(); c.RefreshToken == "" || !strings.HasPrefix(c.Token, "allot_") {
		t.Errorf("stored: %+v", c)
	}
	if code, out, errOut := u.run("jobs"); code != 0 || !strings.Contains(out, "nlp") {
		t.Errorf("allot jobs: %d %s %s", code, out, errOut)
	}
	if code, _, errOut := login("deny", false); code != 1 || !strings.Contains(errOut, "denied") {
		t.Errorf("denied: %d %s", code, errOut)
	}
}
