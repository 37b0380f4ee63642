package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/web"
)

// cmdLogin is `allot login`: the OAuth device authorization grant (RFC
// 8628) at the server's identity provider, then the ID token traded for a
// short-lived Allot API token, stored with the provider's refresh token in
// the user's config (client.CredentialsPath). Commands use it when no
// --token is given and renew it when it expires (clientFlags).
func cmdLogin(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("login", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: allot login [--server URL] [--browser]\n\nSigns in through the server's single sign-on from any shell (the OAuth device flow):\nit shows a link and a code to enter in a browser on any device.\n\n")
		fs.PrintDefaults()
	}
	server := fs.String("server", os.Getenv("ALLOT_URL"), "Allot server URL (env ALLOT_URL; default: the one you signed in to last, else "+defaultServer+")")
	browser := fs.Bool("browser", false, "sign in with a browser on this machine instead (a loopback redirect, RFC 8252; opens $BROWSER or xdg-open)")
	if err := cliflag.Parse(fs, args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "allot login: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	path, err := client.CredentialsPath()
	if err != nil {
		fmt.Fprintf(stderr, "allot login: %v\n", err)
		return 1
	}
	old, _ := client.LoadCredentials(path) // replaced below, whatever it holds
	srv := strings.TrimRight(strings.TrimSpace(*server), "/")
	if srv == "" {
		srv = defaultServer
		if old != nil {
			srv = old.Server
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fail := func(err error) int {
		if errors.Is(err, context.Canceled) {
			err = errors.New("cancelled")
		}
		fmt.Fprintf(stderr, "allot login: %v\n", err)
		return 1
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	cfg, err := client.CLIConfig(ctx, srv)
	if err != nil {
		return fail(err)
	}
	p, err := client.Discover(ctx, hc, cfg.Issuer)
	if err != nil {
		return fail(err)
	}
	var t *client.Tokens
	if *browser {
		bctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		t, err = p.BrowserLogin(bctx, hc, cfg.ClientID, cfg.Scopes, func(u string) {
			fmt.Fprintf(stdout, "To sign in to %s, open this address in a browser on this machine (opening it now):\n    %s\nWaiting for the sign-in…\n", srv, u)
			openBrowser(u)
		})
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			err = errors.New("the browser did not come back within 10 minutes: run allot login again")
		}
	} else {
		t, err = deviceLogin(ctx, p, hc, cfg, srv, stdout)
	}
	if err != nil {
		return fail(err)
	}
	tok, err := client.Exchange(ctx, srv, t, "")
	if err != nil {
		return fail(fmt.Errorf("the server refused the sign-in: %w", err))
	}
	creds := &client.Credentials{Server: srv, Token: tok.Token, TokenID: tok.ID, ExpiresAt: client.LocalExpiry(tok.TokenJSON), Email: tok.Email,
		Issuer: cfg.Issuer, ClientID: cfg.ClientID, Scopes: cfg.Scopes, RefreshToken: t.RefreshToken}
	if err := client.SaveCredentials(path, creds); err != nil {
		return fail(fmt.Errorf("storing the token: %w", err))
	}
	if old != nil && old.Token != creds.Token {
		signOut(ctx, old, hc) // best effort: the sign-in it replaces
	}
	until := creds.ExpiresAt.Local().Format("2006-01-02 15:04 MST")
	fmt.Fprintf(stdout, "Signed in to %s as %s. The token lasts until %s", srv, tok.Email, until)
	if creds.RefreshToken != "" {
		fmt.Fprintf(stdout, " and renews itself")
	}
	fmt.Fprintf(stdout, "; it is kept in %s (allot logout removes it).\n", path)
	if creds.RefreshToken == "" {
		fmt.Fprintf(stderr, "allot login: the identity provider gave no refresh token (the offline_access scope), so run allot login again after %s\n", until)
	}
	return 0
}

// deviceLogin is the device authorization grant: it shows the address
// and the code, and polls until the person answers.
func deviceLogin(ctx context.Context, p *client.Provider, hc *http.Client, cfg web.CLIConfigJSON, srv string, stdout io.Writer) (*client.Tokens, error) {
	d, err := p.DeviceAuth(ctx, hc, cfg.ClientID, cfg.Scopes)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "To sign in to %s, open\n    %s\nin a browser (on any device) and enter the code\n    %s\n", srv, d.VerificationURI, d.UserCode)
	if d.VerificationURIComplete != "" {
		fmt.Fprintf(stdout, "or open %s\n", d.VerificationURIComplete)
	}
	if d.ExpiresIn > 0 {
		fmt.Fprintf(stdout, "Waiting for the sign-in (the code expires in %s)…\n", (time.Duration(d.ExpiresIn) * time.Second).String())
	}
	return p.PollDevice(ctx, hc, cfg.ClientID, d, client.Sleep)
}

// openBrowser opens u with $BROWSER, else xdg-open (open on macOS), if
// there is one; the address is printed anyway.
func openBrowser(u string) {
	name := os.Getenv("BROWSER")
	if name == "" {
		name = "xdg-open"
		if runtime.GOOS == "darwin" {
			name = "open"
		}
	}
	cmd := exec.Command(name, u)
	cmd.Stdout, cmd.Stderr = nil, nil
	if cmd.Start() == nil {
		go cmd.Wait() //nolint:errcheck // whatever the browser says
	}
}

// signOut revokes the stored Allot token at its server and the refresh
// token at the provider, as far as they can be reached; it returns what
// failed.
func signOut(ctx context.Context, c *client.Credentials, hc *http.Client) []error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var errs []error
	if c.TokenID != 0 {
		err := client.New(c.Server, c.Token).RevokeToken(ctx, c.TokenID)
		var p *client.Error
		if err != nil && !(errors.As(err, &p) && p.Status == http.StatusUnauthorized) { // 401: expired or revoked already
			errs = append(errs, fmt.Errorf("revoking the API token at %s: %w", c.Server, err))
		}
	}
	if c.RefreshToken != "" && c.Issuer != "" {
		p, err := client.Discover(ctx, hc, c.Issuer)
		if err == nil {
			err = p.Revoke(ctx, hc, c.ClientID, c.RefreshToken)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("revoking the refresh token at %s: %w", c.Issuer, err))
		}
	}
	return errs
}

// cmdLogout is `allot logout`: the stored token is revoked at the server,
// the refresh token at the provider (where it offers revocation), and the
// file removed.
func cmdLogout(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("logout", flag.ContinueOnError)
	flags.SetOutput(stderr)
	if err := cliflag.Parse(flags, args); err != nil {
		return 2
	}
	if flags.NArg() > 0 {
		fmt.Fprintf(stderr, "allot logout: unexpected argument %q\n", flags.Arg(0))
		return 2
	}
	path, err := client.CredentialsPath()
	if err != nil {
		fmt.Fprintf(stderr, "allot logout: %v\n", err)
		return 1
	}
	creds, err := client.LoadCredentials(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		fmt.Fprintf(stdout, "Not signed in (no %s).\n", path)
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "allot logout: %v; removing it\n", err)
	default:
		for _, e := range signOut(context.Background(), creds, &http.Client{Timeout: 15 * time.Second}) {
			fmt.Fprintf(stderr, "allot logout: %v\n", e)
		}
	}
	if err := client.RemoveCredentials(path); err != nil {
		fmt.Fprintf(stderr, "allot logout: %v\n", err)
		return 1
	}
	client.RemoveCredentials(path + ".lock") //nolint:errcheck // an empty lock file does no harm
	if creds != nil {
		fmt.Fprintf(stdout, "Signed out of %s (%s removed).\n", creds.Server, path)
	} else {
		fmt.Fprintf(stdout, "Removed %s.\n", path)
	}
	return 0
}
