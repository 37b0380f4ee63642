package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/web"
)

// Credentials is what `allot login` keeps in the user's config: the
// server, the short-lived Allot API token it gave, and what renews it
// (the provider's refresh token).
type Credentials struct {
	Server    string    `json:"server"`
	Token     string    `json:"token"`
	TokenID   int64     `json:"token_id"`
	ExpiresAt time.Time `json:"expires_at"`
	Email     string    `json:"email"`
	// The identity provider and allot login's client there.
	Issuer       string   `json:"issuer"`
	ClientID     string   `json:"client_id"`
	Scopes       []string `json:"scopes,omitempty"`
	RefreshToken string   `json:"refresh_token,omitempty"`
}

// CredentialsPath is $XDG_CONFIG_HOME/allot/credentials.json, or
// ~/.config/allot/credentials.json.
func CredentialsPath() (string, error) {
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" || !filepath.IsAbs(dir) { // the XDG spec: a relative value is ignored
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding where to keep the credentials: %w (set XDG_CONFIG_HOME)", err)
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "allot", "credentials.json"), nil
}

// LoadCredentials reads path; a missing file is an error that
// errors.Is(err, fs.ErrNotExist). A file others may read is refused, as
// ssh refuses a private key others may read.
func LoadCredentials(path string) (*Credentials, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s is readable by other users (mode %04o): run chmod 600 %s, or allot login again", path, st.Mode().Perm(), path)
	}
	var c Credentials
	if err := json.NewDecoder(f).Decode(&c); err != nil {
		return nil, fmt.Errorf("reading %s: %w (allot logout removes it)", path, err)
	}
	if c.Server == "" || c.Token == "" {
		return nil, fmt.Errorf("%s has no server or token (allot logout removes it)", path)
	}
	return &c, nil
}

// SaveCredentials writes c to path, mode 0600, in a directory of mode 0700
// (made if missing), replacing the file in one rename.
func SaveCredentials(path string, c *Credentials) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil { // allot's own directory: nobody else's business
		return err
	}
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".credentials-*.json")
	if err != nil {
		return fmt.Errorf("writing the credentials: %w", err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("writing the credentials: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// RemoveCredentials deletes path; a missing file is no error.
func RemoveCredentials(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// lockCredentials holds an exclusive lock next to path until the returned
// function runs, so that two commands renewing at once do not both spend
// the same refresh token (with rotation the second use would revoke the
// sign-in).
func lockCredentials(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing unlocks too
		f.Close()
	}, nil
}

// SameServer says whether two server URLs are the same server (scheme,
// host and path, a trailing slash and the host's case aside).
func SameServer(a, b string) bool {
	norm := func(s string) string { return strings.ToLower(strings.TrimRight(strings.TrimSpace(s), "/")) }
	return norm(a) == norm(b)
}

// Exchange trades the provider's tokens for an Allot API token at server
// (POST /api/v1/auth/cli/token).
// previous is the API token a renewal replaces ("" at a login).
func Exchange(ctx context.Context, server string, t *Tokens, previous string) (web.CLITokenJSON, error) {
	host, _ := os.Hostname()
	var out web.CLITokenJSON
	err := New(server, "").do(ctx, http.MethodPost, "/api/v1/auth/cli/token",
		web.CLITokenRequest{IDToken: t.IDToken, AccessToken: t.AccessToken, Host: host, PreviousToken: previous}, &out)
	return out, err
}

// CLIConfig asks server where `allot login` signs in (GET
// /api/v1/auth/cli).
func CLIConfig(ctx context.Context, server string) (web.CLIConfigJSON, error) {
	var out web.CLIConfigJSON
	return out, New(server, "").do(ctx, http.MethodGet, "/api/v1/auth/cli", nil, &out)
}

// Renewer renews the stored sign-in at path, for Client.Renew: the
// provider's refresh token gives new provider tokens, the server trades
// them for a new API token, and the file is rewritten. When another
// command renewed the file since stale (the token the client used) was
// read, it takes that token instead.
func Renewer(path string, hc *http.Client, stale string) func(ctx context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		unlock, err := lockCredentials(path)
		if err != nil {
			return "", fmt.Errorf("locking %s: %w", path, err)
		}
		defer unlock()
		c, err := LoadCredentials(path)
		if err != nil {
			return "", err
		}
		if c.Token != stale {
			return c.Token, nil
		}
		return renew(ctx, path, hc, c)
	}
}

func renew(ctx context.Context, path string, hc *http.Client, c *Credentials) (string, error) {
	if c.RefreshToken == "" {
		return "", fmt.Errorf("your allot login token for %s has expired and the identity provider gave no refresh token to renew it: run allot login again", c.Server)
	}
	p, err := Discover(ctx, hc, c.Issuer)
	if err != nil {
		return "", fmt.Errorf("your allot login token has expired and cannot be renewed now: %w", err)
	}
	t, err := p.Refresh(ctx, hc, c.ClientID, c.RefreshToken)
	var oe *OAuthError
	if errors.As(err, &oe) {
		// The refresh token is spent, revoked or expired: the sign-in is
		// over, and the file says nothing useful any more.
		c.RefreshToken = ""
		SaveCredentials(path, c) //nolint:errcheck // the message below matters more
		return "", fmt.Errorf("your allot login session has ended (the identity provider said %v): run allot login again", oe)
	}
	if err != nil {
		return "", fmt.Errorf("your allot login token has expired and cannot be renewed now: %w", err)
	}
	// With rotation the old refresh token is spent now: keep the new one
	// even if the exchange fails.
	if t.RefreshToken != "" {
		c.RefreshToken = t.RefreshToken
		if err := SaveCredentials(path, c); err != nil {
			return "", err
		}
	}
	tok, err := Exchange(ctx, c.Server, t, c.Token)
	if err != nil {
		return "", fmt.Errorf("renewing your allot login token: %w", err)
	}
	c.Token, c.TokenID, c.ExpiresAt, c.Email = tok.Token, tok.ID, LocalExpiry(tok.TokenJSON), tok.Email
	if err := SaveCredentials(path, c); err != nil {
		return "", err
	}
	return c.Token, nil
}

// LocalExpiry is when a token the server just made expires, on this
// machine's clock: its lifetime from now (the server's clock may differ,
// `allot dev --now` shifts it on purpose). Zero: never.
func LocalExpiry(t web.TokenJSON) time.Time {
	if t.ExpiresAt == nil {
		return time.Time{}
	}
	return clock.Now().Add(t.ExpiresAt.Sub(t.CreatedAt)).Truncate(time.Second)
}
