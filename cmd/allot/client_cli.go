package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"time"

	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/internal/clock"
)

// defaultServer is the server the CLI talks to without --server,
// ALLOT_URL or a stored `allot login`.
const defaultServer = "http://localhost:8080"

// renewMargin: a stored token this close to its expiry counts as expired,
// for clock differences between this machine and the server.
const renewMargin = 5 * time.Minute

// clientFlags adds --server and --token (defaults from ALLOT_URL and
// ALLOT_TOKEN) to fs. Without a token it uses the one `allot login`
// stored, for the server it signed in to (and that server when neither
// --server nor ALLOT_URL says another), renewing it when it has expired.
func clientFlags(fs *flag.FlagSet) func() *client.Client {
	server := fs.String("server", os.Getenv("ALLOT_URL"), "Allot server URL (env ALLOT_URL; default: the one allot login signed in to, else "+defaultServer+")")
	token := cliflag.Secret(fs, "token", "ALLOT_TOKEN", "API `token` (default: the one allot login stored)")
	return func() *client.Client { return storedClient(*server, token()) }
}

// storedClient is a client for server (empty: not chosen) with token, or
// with the stored `allot login` token when token is empty.
func storedClient(server, token string) *client.Client {
	path, err := client.CredentialsPath()
	var creds *client.Credentials
	if err == nil {
		creds, err = client.LoadCredentials(path)
	}
	if server == "" {
		server = defaultServer
		if creds != nil {
			server = creds.Server
		}
	}
	if token != "" {
		return client.New(server, token)
	}
	c := client.New(server, "")
	// Without a usable stored token the server's 401 becomes the reason.
	fail := func(err error) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { return "", err }
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.Renew = fail(fmt.Errorf("not signed in: run allot login --server %s, or pass an API token with --token or ALLOT_TOKEN", server))
	case err != nil:
		c.Renew = fail(err)
	case !client.SameServer(server, creds.Server):
		c.Renew = fail(fmt.Errorf("allot login signed in to %s, not %s: run allot login --server %s, or pass an API token with --token or ALLOT_TOKEN",
			creds.Server, server, server))
	case !creds.ExpiresAt.IsZero() && !clock.Now().Add(renewMargin).Before(creds.ExpiresAt):
		// Expired: the first request goes without it, and its 401 renews.
		c.Renew = client.Renewer(path, &http.Client{Timeout: 30 * time.Second}, creds.Token)
	default:
		c.Token = creds.Token
		c.Renew = fail(fmt.Errorf("the server refused the token allot login stored (revoked, or this machine's clock is far from the server's; it expires at %s): run allot login again",
			creds.ExpiresAt.Local().Format(time.RFC3339)))
	}
	return c
}
