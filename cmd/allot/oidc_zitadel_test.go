package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"golang.org/x/text/language"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// zitadelOPEnv, when set (to Allot's callback URL), re-executes the test
// binary as zitadel/oidc's example OpenID provider: an OP written by
// others, to check Allot's relying party against. The parent opens the
// provider's listening socket and hands it to the child as file
// descriptor 3, so the issuer URL is known before Allot boots and Allot's
// callback URL before the provider starts, without racing for a port.
const zitadelOPEnv = "ALLOT_TEST_ZITADEL_OP_REDIRECT_URI"

const (
	zitadelUsername = "nadia"
	zitadelSubject  = "zitadel-nadia-7"
)

func init() {
	if redirect, ok := os.LookupEnv(zitadelOPEnv); ok {
		os.Exit(runZitadelOP(redirect))
	}
}

// zitadelUsers is the example OP's user store: one person, nadia of the
// demo org, with a verified email.
type zitadelUsers struct{ nadia *storage.User }

func (u zitadelUsers) GetUserByID(id string) *storage.User {
	if id == u.nadia.ID {
		return u.nadia
	}
	return nil
}

func (u zitadelUsers) GetUserByUsername(name string) *storage.User {
	if name == u.nadia.Username {
		return u.nadia
	}
	return nil
}

func (u zitadelUsers) ExampleClientID() string { return storage.ServiceUserID }

// runZitadelOP serves zitadel's example OP on the listener inherited as
// fd 3, prints its issuer and exits when stdin closes.
func runZitadelOP(redirectURI string) int {
	f := os.NewFile(3, "zitadel-op-listener")
	ln, err := net.FileListener(f)
	if err != nil {
		fmt.Fprintf(os.Stderr, "zitadel OP: %v\n", err)
		return 1
	}
	f.Close()
	issuer := "http://" + ln.Addr().String()
	users := zitadelUsers{nadia: &storage.User{ID: zitadelSubject, Username: zitadelUsername, Password: testPassword,
		FirstName: "Nadia", LastName: "Petrova", Email: demo.PersonaEmail[demo.Lead], EmailVerified: true,
		PreferredLanguage: language.English}}
	st := storage.NewStorageWithClients(users, map[string]*storage.Client{
		testClientID: storage.WebClient(testClientID, testClientSecret, redirectURI),
	})
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	router := exampleop.SetupServer(issuer, st, logger, false)
	go func() {
		io.Copy(io.Discard, os.Stdin) //nolint:errcheck // EOF or error: the parent is gone
		os.Exit(0)
	}()
	fmt.Println(issuer)
	srv := &http.Server{Handler: router, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintf(os.Stderr, "zitadel OP: %v\n", err)
		return 1
	}
	return 0
}

// startZitadelOP opens the provider's socket and returns its issuer URL
// and a function that starts the provider process with Allot's callback.
func startZitadelOP(t *testing.T) (issuer string, start func(redirectURI string)) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // the child has its own copy
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	issuer = "http://" + ln.Addr().String()
	return issuer, func(redirectURI string) {
		t.Helper()
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), zitadelOPEnv+"="+redirectURI)
		cmd.ExtraFiles = []*os.File{f}
		got := startProcess(t, cmd, "zitadel OP")
		f.Close() // the child has its own copy now
		if got != issuer {
			t.Fatalf("zitadel OP printed %q, want %q", got, issuer)
		}
	}
}

var zitadelIDRE = regexp.MustCompile(`<input type="hidden" name="id" value="([^"]+)">`)

// zitadelLoginPage follows Allot's /login/oidc to the example OP's login
// page and returns the page and its auth request id.
func zitadelLoginPage(t *testing.T, b *ssoBrowser, e *env, issuer string) (page, id string) {
	t.Helper()
	s := b.do("GET", e.url+"/login/oidc", nil)
	if s.status != http.StatusSeeOther || !strings.HasPrefix(s.location, issuer+"/auth?") {
		t.Fatalf("GET /login/oidc: %d → %q %s", s.status, s.location, s.body)
	}
	s = b.do("GET", s.location, nil)
	if s.status != http.StatusFound || !strings.HasPrefix(s.location, issuer+"/login/username?") {
		t.Fatalf("OP authorize endpoint: %d → %q %s", s.status, s.location, s.body)
	}
	s = b.do("GET", s.location, nil)
	m := zitadelIDRE.FindStringSubmatch(s.body)
	if s.status != http.StatusOK || m == nil || !strings.Contains(s.body, `name="password"`) {
		t.Fatalf("OP login page: %d\n%s", s.status, s.body)
	}
	return s.body, m[1]
}

// TestOIDCZitadelProvider signs nadia in through zitadel's example OP: the
// authorization-code flow with PKCE, an ID token without email (Allot
// reads it from userinfo), email linking to the demo account, and a wrong
// password that stays at the provider.
func TestOIDCZitadelProvider(t *testing.T) {
	issuer, startOP := startZitadelOP(t)
	e := bootSSO(t, issuer)
	startOP(e.url + "/oidc/callback")
	ctx := context.Background()

	nadiaEmail := demo.PersonaEmail[demo.Lead]
	var nadiaID int64
	var usersBefore int
	if err := e.m.Pool.QueryRow(ctx, "SELECT id FROM users WHERE email = $1", nadiaEmail).Scan(&nadiaID); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Pool.QueryRow(ctx, "SELECT count(*) FROM users").Scan(&usersBefore); err != nil {
		t.Fatal(err)
	}
	var leads int
	if err := e.m.Pool.QueryRow(ctx, "SELECT count(*) FROM memberships WHERE user_id = $1 AND team = 'nlp' AND role = 'lead'", nadiaID).Scan(&leads); err != nil || leads != 1 {
		t.Fatalf("nadia should start as lead of nlp: %d %v", leads, err)
	}
	sessionsBefore := sessionCount(t, e)

	// A wrong password: the OP shows its login page again with an error,
	// never redirects to Allot, and no session appears.
	b := newSSOBrowser(t)
	_, id := zitadelLoginPage(t, b, e, issuer)
	s := b.do("POST", issuer+"/login/username", url.Values{"id": {id}, "username": {zitadelUsername}, "password": {"wrong"}})
	if s.status != http.StatusOK || s.location != "" || !strings.Contains(s.body, "username or password wrong") ||
		!strings.Contains(s.body, `name="password"`) {
		t.Errorf("wrong password: %d → %q\n%s", s.status, s.location, s.body)
	}
	for _, c := range b.jar.Cookies(mustURL(t, e.url)) {
		if c.Name == "allot_session" {
			t.Error("wrong password: Allot set a session cookie")
		}
	}
	if s := b.do("GET", e.url+"/api/v1/me", nil); s.status != http.StatusUnauthorized {
		t.Errorf("wrong password: /api/v1/me %d, want 401", s.status)
	}
	if n := sessionCount(t, e); n != sessionsBefore {
		t.Errorf("wrong password: sessions %d → %d", sessionsBefore, n)
	}

	// The right password, on the same auth request: the OP sends the
	// browser through its callback to Allot's with a code.
	s = b.do("POST", issuer+"/login/username", url.Values{"id": {id}, "username": {zitadelUsername}, "password": {testPassword}})
	if s.status != http.StatusFound || !strings.HasPrefix(s.location, issuer+"/auth/callback?") {
		t.Fatalf("login: %d → %q %s", s.status, s.location, s.body)
	}
	s = b.do("GET", s.location, nil)
	if s.status != http.StatusFound || !strings.HasPrefix(s.location, e.url+"/oidc/callback?") {
		t.Fatalf("OP callback: %d → %q %s", s.status, s.location, s.body)
	}
	cb, _ := url.Parse(s.location)
	if cb.Query().Get("code") == "" || cb.Query().Get("state") == "" {
		t.Fatalf("redirect to Allot without code and state: %s", s.location)
	}
	s = b.do("GET", s.location, nil)
	if s.status != http.StatusSeeOther || s.location != e.url+"/jobs" {
		t.Fatalf("Allot callback: %d → %q\n%s", s.status, s.location, s.body)
	}

	s = b.do("GET", e.url+"/api/v1/me", nil)
	var me web.MeJSON
	if err := json.Unmarshal([]byte(s.body), &me); s.status != http.StatusOK || err != nil {
		t.Fatalf("/api/v1/me after sign-in: %d %s", s.status, s.body)
	}
	// The example OP sends no groups claim, and IdP roles replace Allot's:
	// nadia keeps her account but is no longer lead of nlp (nor anything).
	if me.ID != nadiaID || me.Email != nadiaEmail || me.Name != "Nadia Petrova" || me.Admin || me.Finance || len(me.Teams) != 0 {
		t.Errorf("me = %+v, want nadia's account (id %d) with no roles", me, nadiaID)
	}
	if s := b.do("GET", e.url+"/jobs", nil); s.status != http.StatusOK || !strings.Contains(s.body, "Nadia Petrova") {
		t.Errorf("portal after sign-in: %d", s.status)
	}
	var subject string
	var usersAfter int
	if err := e.m.Pool.QueryRow(ctx, "SELECT oidc_subject FROM users WHERE id = $1", nadiaID).Scan(&subject); err != nil || subject != zitadelSubject {
		t.Errorf("nadia's subject %q (%v), want the OP's %q", subject, err, zitadelSubject)
	}
	if err := e.m.Pool.QueryRow(ctx, "SELECT count(*) FROM users").Scan(&usersAfter); err != nil || usersAfter != usersBefore {
		t.Errorf("users %d → %d (%v): sign-in must link the demo account, not add one", usersBefore, usersAfter, err)
	}
	if n := sessionCount(t, e); n != sessionsBefore+1 {
		t.Errorf("sessions %d → %d, want one more", sessionsBefore, n)
	}
}
