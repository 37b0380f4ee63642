package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/oidcdev"
	"github.com/allotlabs/allot/web"
)

// oidcFlags registers the single sign-on flags on fs, each defaulting to
// its environment variable, and returns a function that reads and checks
// them after parsing.
func oidcFlags(fs *flag.FlagSet) func() (web.OIDCConfig, error) {
	env := func(name, def string) string {
		if v := os.Getenv(name); v != "" {
			return v
		}
		return def
	}
	var c web.OIDCConfig
	var scopes string
	fs.StringVar(&c.Issuer, "oidc-issuer", env("ALLOT_OIDC_ISSUER", ""), "OIDC issuer URL; empty: no single sign-on (env ALLOT_OIDC_ISSUER)")
	fs.StringVar(&c.ClientID, "oidc-client-id", env("ALLOT_OIDC_CLIENT_ID", ""), "OIDC client ID (env ALLOT_OIDC_CLIENT_ID)")
	clientSecret := cliflag.Secret(fs, "oidc-client-secret", "ALLOT_OIDC_CLIENT_SECRET", "OIDC client `secret`; prefer the env")
	fs.StringVar(&c.CLIClientID, "oidc-cli-client-id", env("ALLOT_OIDC_CLI_CLIENT_ID", ""),
		"client ID of allot login at the provider: a public client (no secret) with the device authorization grant; empty: no allot login (env ALLOT_OIDC_CLI_CLIENT_ID)")
	fs.StringVar(&c.RedirectURL, "oidc-redirect-url", env("ALLOT_OIDC_REDIRECT_URL", ""),
		"this server's callback as registered at the provider, https://allot.example.com/oidc/callback (env ALLOT_OIDC_REDIRECT_URL; default: the listen URL)")
	fs.StringVar(&scopes, "oidc-scopes", env("ALLOT_OIDC_SCOPES", ""),
		"scopes besides openid, space-separated (env ALLOT_OIDC_SCOPES; default: profile email, and groups when the provider's discovery lists it, as Okta and Dex do)")
	var linkIssuers string
	fs.StringVar(&linkIssuers, "oidc-link-email-issuers", env("ALLOT_OIDC_LINK_EMAIL_ISSUERS", ""),
		"issuers, comma- or space-separated, whose verified email links a first sign-in to an account that never signed in (the bootstrap admin); default none: an admin links it at /admin/identity (env ALLOT_OIDC_LINK_EMAIL_ISSUERS)")
	fs.StringVar(&c.Claims.GroupsClaim, "oidc-groups-claim", env("ALLOT_OIDC_GROUPS_CLAIM", "groups"), "claim that lists the user's groups (env ALLOT_OIDC_GROUPS_CLAIM)")
	fs.StringVar(&c.Claims.AdminGroup, "oidc-admin-group", env("ALLOT_OIDC_ADMIN_GROUP", "allot-admins"), "group whose members are admins (env ALLOT_OIDC_ADMIN_GROUP)")
	fs.StringVar(&c.Claims.FinanceGroup, "oidc-finance-group", env("ALLOT_OIDC_FINANCE_GROUP", "allot-finance"), "group whose members are finance (env ALLOT_OIDC_FINANCE_GROUP)")
	fs.StringVar(&c.Claims.TeamPrefix, "oidc-team-prefix", env("ALLOT_OIDC_TEAM_PREFIX", "team:"), "group prefix + team slug = engineer in the team (env ALLOT_OIDC_TEAM_PREFIX)")
	fs.StringVar(&c.Claims.LeadSuffix, "oidc-lead-suffix", env("ALLOT_OIDC_LEAD_SUFFIX", ":lead"), "prefix + team + this suffix = lead of the team (env ALLOT_OIDC_LEAD_SUFFIX)")
	fs.StringVar(&c.Claims.AccountClaim, "oidc-account-claim", env("ALLOT_OIDC_ACCOUNT_CLAIM", ""),
		"claim whose value is the person's POSIX account, stored at each sign-in, e.g. uid or preferred_username; their jobs run as it unless an admin mapped them (env ALLOT_OIDC_ACCOUNT_CLAIM; default: none)")
	return func() (web.OIDCConfig, error) {
		c.Scopes = strings.Fields(scopes)
		c.ClientSecret = clientSecret()
		c.LinkEmailIssuers = strings.FieldsFunc(linkIssuers, func(r rune) bool { return r == ',' || r == ' ' })
		return c, checkOIDC(c)
	}
}

// checkOIDC refuses a half-done or unsafe SSO configuration.
func checkOIDC(c web.OIDCConfig) error {
	if !c.Enabled() {
		return nil
	}
	if c.ClientID == "" {
		return errors.New("--oidc-issuer is set but --oidc-client-id (ALLOT_OIDC_CLIENT_ID) is not")
	}
	for _, u := range []struct{ name, v string }{{"--oidc-issuer", c.Issuer}, {"--oidc-redirect-url", c.RedirectURL}} {
		if u.v == "" {
			continue
		}
		p, err := url.Parse(u.v)
		if err != nil || p.Host == "" || (p.Scheme != "https" && p.Scheme != "http") {
			return fmt.Errorf("%s %q is not an http(s) URL", u.name, u.v)
		}
		if p.Scheme == "http" && !loopbackHost(p.Hostname()) {
			return fmt.Errorf("%s %q must use https (plain http is only for localhost)", u.name, u.v)
		}
	}
	if err := checkOIDCRedirect(c); err != nil {
		return err
	}
	for _, iss := range c.LinkEmailIssuers {
		if p, err := url.Parse(iss); err != nil || p.Host == "" || (p.Scheme != "https" && p.Scheme != "http") {
			return fmt.Errorf("--oidc-link-email-issuers: %q is not an issuer URL (http(s)://…, as in the ID token's iss claim)", iss)
		}
	}
	if c.Claims.GroupsClaim == "" || c.Claims.TeamPrefix == "" {
		return errors.New("--oidc-groups-claim and --oidc-team-prefix must not be empty")
	}
	return nil
}

// checkOIDCRedirect requires an explicit https --oidc-redirect-url when
// the issuer is not on this machine: the default, the listen address +
// /oidc/callback, is plain http, so the session cookie would not be Secure.
// A localhost issuer (allot dev, tests) may keep the default.
func checkOIDCRedirect(c web.OIDCConfig) error {
	if !c.Enabled() {
		return nil
	}
	iss, err := url.Parse(c.Issuer)
	if err != nil || loopbackHost(iss.Hostname()) {
		return nil // checkOIDC reports a bad issuer
	}
	if !strings.HasPrefix(c.RedirectURL, "https://") {
		return fmt.Errorf("the OIDC issuer %s is not on localhost, so --oidc-redirect-url (ALLOT_OIDC_REDIRECT_URL) must be set to this server's https callback, e.g. https://allot.example.com/oidc/callback; got %q", c.Issuer, c.RedirectURL)
	}
	return nil
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// cmdOIDCProvider runs the development OIDC provider with the demo users
// (hidden: for `allot dev` demos and tests). It prints the issuer URL on
// the first line of stdout.
func cmdOIDCProvider(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("oidc-provider", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	clientID := fs.String("client-id", "allot", "the client ID Allot uses")
	secret := fs.String("client-secret", "allot-dev-secret", "the client secret Allot uses")
	password := fs.String("password", "demo", "password of the demo users noah, nadia, finn and ada")
	watchStdin := fs.Bool("watch-stdin", false, "exit when stdin closes (for a parent process)")
	cliClientID := fs.String("cli-client-id", "", "also register this public client with the device authorization grant, for allot login (default: none)")
	deviceInterval := fs.Duration("device-interval", 5*time.Second, "least time between two polls of a device code (whole seconds)")
	deviceCodeTTL := fs.Duration("device-code-ttl", 10*time.Minute, "how long a device code waits for its user")
	tokenTTL := fs.Duration("token-ttl", time.Hour, "lifetime of ID and access tokens")
	var redirects multiFlag
	fs.Var(&redirects, "redirect-uri", "allowed redirect URI, repeatable; loopback URIs match any port (default http://127.0.0.1/oidc/callback, http://localhost/oidc/callback)")
	var extra multiFlag
	fs.Var(&extra, "user", "one more user USERNAME:SUBJECT:EMAIL[:unverified] with the same password, repeatable; unverified: no email_verified claim")
	usersJSON := fs.String("users-json", "", "a JSON `file` of more users [{username, subject, email, name, groups, claims, no_email_verified}] with the same password, shaped like another provider's (Keycloak group paths, Entra ID GUIDs and roles)")
	groupsNeedScope := fs.Bool("groups-need-scope", false, "send the groups claim only for the groups scope, as Okta and Dex do")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if len(redirects) == 0 {
		redirects = multiFlag{"http://127.0.0.1/oidc/callback", "http://localhost/oidc/callback"}
	}
	users := oidcdev.DemoUsers(*password)
	for _, x := range extra {
		f := strings.Split(x, ":")
		if len(f) < 3 || len(f) > 4 || f[0] == "" || f[1] == "" || f[2] == "" || len(f) == 4 && f[3] != "unverified" {
			fmt.Fprintf(stderr, "allot oidc-provider: --user %q: want USERNAME:SUBJECT:EMAIL[:unverified]\n", x)
			return 2
		}
		users = append(users, oidcdev.User{Username: f[0], Subject: f[1], Email: f[2], Name: f[0], Password: *password, NoEmailVerified: len(f) == 4})
	}
	if *usersJSON != "" {
		more, err := readProviderUsers(*usersJSON, *password)
		if err != nil {
			fmt.Fprintf(stderr, "allot oidc-provider: --users-json: %v\n", err)
			return 2
		}
		users = append(users, more...)
	}
	srv, err := oidcdev.Listen(*addr, oidcdev.Config{Users: users, Hint: oidcdev.DemoHint(users), GroupsNeedScope: *groupsNeedScope,
		Clients:        providerClients(*clientID, *secret, redirects, *cliClientID),
		DeviceInterval: *deviceInterval, DeviceCodeTTL: *deviceCodeTTL, TokenTTL: *tokenTTL})
	if err != nil {
		fmt.Fprintf(stderr, "allot oidc-provider: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, srv.Issuer())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *watchStdin {
		go func() {
			io.Copy(io.Discard, bufio.NewReader(os.Stdin)) //nolint:errcheck // EOF or error: the parent is gone
			stop()
		}()
	}
	<-ctx.Done()
	if err := srv.Close(); err != nil {
		fmt.Fprintf(stderr, "allot oidc-provider: %v\n", err)
		return 1
	}
	return 0
}

// readProviderUsers reads --users-json: users shaped like another
// provider's, all with password.
func readProviderUsers(path, password string) ([]oidcdev.User, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var in []struct {
		Username        string         `json:"username"`
		Subject         string         `json:"subject"`
		Email           string         `json:"email"`
		Name            string         `json:"name"`
		Groups          []string       `json:"groups"`
		Claims          map[string]any `json:"claims"`
		NoEmailVerified bool           `json:"no_email_verified"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, err
	}
	var out []oidcdev.User
	for i, u := range in {
		if u.Username == "" || u.Subject == "" || u.Email == "" {
			return nil, fmt.Errorf("user %d: username, subject and email are required", i+1)
		}
		if u.Name == "" {
			u.Name = u.Username
		}
		out = append(out, oidcdev.User{Username: u.Username, Subject: u.Subject, Email: u.Email, Name: u.Name, Password: password,
			Groups: u.Groups, Claims: u.Claims, NoEmailVerified: u.NoEmailVerified})
	}
	return out, nil
}

// providerClients are the portal's client and, when cliID is set, allot
// login's public client with the device grant.
func providerClients(id, secret string, redirects []string, cliID string) []oidcdev.Client {
	cs := []oidcdev.Client{{ID: id, Secret: secret, RedirectURIs: redirects}}
	if cliID != "" {
		cs = append(cs, oidcdev.Client{ID: cliID, DeviceGrant: true, RedirectURIs: []string{cliRedirectURI}})
	}
	return cs
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// devCLIClientID is allot login's client at `allot dev`'s provider;
// cliRedirectURI is where `allot login --browser` listens (any port).
const (
	devCLIClientID = "allot-cli"
	cliRedirectURI = "http://127.0.0.1/callback"
)

// defaultDevOIDCAddr is where `allot dev` starts its development OIDC
// provider unless --oidc-addr says otherwise (a variable for one test,
// which must not run in parallel).
var defaultDevOIDCAddr = "127.0.0.1:8081"

// devOIDCAddr checks --oidc-addr: a loopback host and a port. An empty host
// (":8081") is 127.0.0.1; the provider is only for this machine, since its
// issuer is plain http.
func devOIDCAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--oidc-addr %q: want HOST:PORT, e.g. 127.0.0.1:8081", addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("--oidc-addr %q: %q is not a port", addr, port)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if !loopbackHost(host) {
		return "", fmt.Errorf("--oidc-addr %q: the development OIDC provider serves plain http, so it listens on this machine only (127.0.0.1, ::1 or localhost)", addr)
	}
	return net.JoinHostPort(host, port), nil
}

// devOIDC starts the development provider for `allot dev` on addr and
// returns it with the SSO configuration that points at it. When addr is
// taken and fallback is set (addr is the default, not the user's choice),
// it listens on a free port of the same host instead and says so in
// moved; otherwise a taken addr is an error.
func devOIDC(addr string, fallback bool, password string) (srv *oidcdev.Server, c web.OIDCConfig, moved string, err error) {
	users := oidcdev.DemoUsers(password)
	// With allot login's public client (the device grant).
	cfg := oidcdev.Config{Users: users, Hint: oidcdev.DemoHint(users), DeviceInterval: 2 * time.Second,
		Clients: []oidcdev.Client{{ID: devCLIClientID, DeviceGrant: true, RedirectURIs: []string{cliRedirectURI}}}}
	srv, err = oidcdev.Listen(addr, cfg)
	if err != nil {
		if !fallback {
			cause := err
			if u := errors.Unwrap(err); u != nil {
				cause = u
			}
			return nil, c, "", fmt.Errorf("the development OIDC provider cannot listen on --oidc-addr %s (%v): stop what uses it, pick another address with --oidc-addr, or pass --no-oidc", addr, cause)
		}
		host, _, _ := net.SplitHostPort(addr)
		if srv, err = oidcdev.Listen(net.JoinHostPort(host, "0"), cfg); err != nil {
			return nil, c, "", err
		}
		moved = fmt.Sprintf("%s is taken, so the development OIDC provider listens on %s instead (--oidc-addr chooses its address)", addr, strings.TrimPrefix(srv.Issuer(), "http://"))
	}
	// The demo users' preferred_username (noah, nadia, finn, ada) is their
	// POSIX account, as a company's provider would send uid.
	// The demo's people never signed in: their first sign-in links them by
	// the provider's verified email.
	c = web.OIDCConfig{Issuer: srv.Issuer(), ClientID: "allot-dev", ClientSecret: "allot-dev-secret", CLIClientID: devCLIClientID,
		Claims: web.ClaimMapping{AccountClaim: "preferred_username"}, LinkEmailIssuers: []string{srv.Issuer()}}
	return srv, c, moved, nil
}
