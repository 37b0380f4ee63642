package client

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// The OAuth side of `allot login`: discovery, the device authorization
// grant (RFC 8628), refresh and revocation against the server's OpenID
// provider, as a public client (client_id, no secret).

// Provider is what discovery says about an OpenID provider.
type Provider struct {
	Issuer              string `json:"issuer"`
	Authorization       string `json:"authorization_endpoint"`
	Token               string `json:"token_endpoint"`
	DeviceAuthorization string `json:"device_authorization_endpoint"`
	Revocation          string `json:"revocation_endpoint"`
}

// OAuthError is an error answer of the provider (RFC 6749 §5.2).
type OAuthError struct {
	Code        string `json:"error"`
	Description string `json:"error_description"`
	Status      int    `json:"-"`
}

func (e *OAuthError) Error() string {
	if e.Description != "" {
		return e.Code + ": " + e.Description
	}
	return e.Code
}

// Errors of the device flow a person can act on.
var (
	ErrDeviceDenied  = errors.New("the sign-in was denied at the identity provider")
	ErrDeviceExpired = errors.New("the code expired before the sign-in was approved: run allot login again")
)

// ProviderUnreachable wraps a failure to reach the identity provider.
type ProviderUnreachable struct {
	Issuer string
	Err    error
}

func (e *ProviderUnreachable) Error() string {
	return fmt.Sprintf("cannot reach the identity provider %s: %v", e.Issuer, e.Err)
}

func (e *ProviderUnreachable) Unwrap() error { return e.Err }

// Discover reads issuer's discovery document and checks that it names
// issuer (OpenID Connect Discovery §4.3).
func Discover(ctx context.Context, hc *http.Client, issuer string) (*Provider, error) {
	issuer = strings.TrimSuffix(issuer, "/")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, issuer+"/.well-known/openid-configuration", nil)
	if err != nil {
		return nil, fmt.Errorf("bad issuer URL %q: %w", issuer, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, &ProviderUnreachable{Issuer: issuer, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, &ProviderUnreachable{Issuer: issuer, Err: err}
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &ProviderUnreachable{Issuer: issuer, Err: fmt.Errorf("discovery answered %s", resp.Status)}
	}
	var p Provider
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, &ProviderUnreachable{Issuer: issuer, Err: fmt.Errorf("reading discovery: %w", err)}
	}
	if strings.TrimSuffix(p.Issuer, "/") != issuer {
		return nil, fmt.Errorf("the identity provider at %s says its issuer is %q: the server's SSO configuration is wrong", issuer, p.Issuer)
	}
	if p.Token == "" {
		return nil, fmt.Errorf("the identity provider %s has no token endpoint", issuer)
	}
	return &p, nil
}

// post sends a form to the provider and reads the JSON answer into out;
// an error answer is an *OAuthError.
func (p *Provider) post(ctx context.Context, hc *http.Client, endpoint string, form url.Values, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return &ProviderUnreachable{Issuer: p.Issuer, Err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return &ProviderUnreachable{Issuer: p.Issuer, Err: err}
	}
	if resp.StatusCode != http.StatusOK {
		e := &OAuthError{Status: resp.StatusCode}
		if json.Unmarshal(data, e) != nil || e.Code == "" {
			return &ProviderUnreachable{Issuer: p.Issuer, Err: fmt.Errorf("%s answered %s", endpoint, resp.Status)}
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("reading the identity provider's answer: %w", err)
	}
	return nil
}

// DeviceCode is a device authorization response (RFC 8628 §3.2).
type DeviceCode struct {
	DeviceCode              string `json:"device_code"`
	UserCode                string `json:"user_code"`
	VerificationURI         string `json:"verification_uri"`
	VerificationURIComplete string `json:"verification_uri_complete"`
	ExpiresIn               int64  `json:"expires_in"`
	Interval                int64  `json:"interval"`
}

// DeviceAuth asks for a device code and a user code.
func (p *Provider) DeviceAuth(ctx context.Context, hc *http.Client, clientID string, scopes []string) (*DeviceCode, error) {
	if p.DeviceAuthorization == "" {
		return nil, fmt.Errorf("the identity provider %s does not offer the device authorization grant (no device_authorization_endpoint in its discovery): enable it for the CLI's client", p.Issuer)
	}
	var d DeviceCode
	err := p.post(ctx, hc, p.DeviceAuthorization, url.Values{"client_id": {clientID}, "scope": {strings.Join(scopes, " ")}}, &d)
	var oe *OAuthError
	if errors.As(err, &oe) {
		return nil, fmt.Errorf("the identity provider refused to start the sign-in (%v): its client %q must be public and allowed the device authorization grant", oe, clientID)
	}
	if err != nil {
		return nil, err
	}
	if d.DeviceCode == "" || d.UserCode == "" || d.VerificationURI == "" {
		return nil, errors.New("the identity provider's device authorization answer lacks device_code, user_code or verification_uri")
	}
	return &d, nil
}

// Tokens is a token response.
type Tokens struct {
	AccessToken  string `json:"access_token"`
	IDToken      string `json:"id_token"`
	RefreshToken string `json:"refresh_token"`
	ExpiresIn    int64  `json:"expires_in"`
}

// PollDevice polls the token endpoint until the user answers (RFC 8628
// §3.4–3.5): every interval (5 s if the provider says none), 5 s more
// after slow_down, until the code expires. sleep waits (a test may pass a
// faster one); it returns ctx's error when ctx ends.
func (p *Provider) PollDevice(ctx context.Context, hc *http.Client, clientID string, d *DeviceCode, sleep func(context.Context, time.Duration) error) (*Tokens, error) {
	interval := time.Duration(d.Interval) * time.Second
	if interval <= 0 {
		interval = 5 * time.Second
	}
	var deadline time.Time
	if d.ExpiresIn > 0 {
		deadline = time.Now().Add(time.Duration(d.ExpiresIn) * time.Second)
	}
	form := url.Values{"grant_type": {"urn:ietf:params:oauth:grant-type:device_code"}, "device_code": {d.DeviceCode}, "client_id": {clientID}}
	for {
		if err := sleep(ctx, interval); err != nil {
			return nil, err
		}
		var t Tokens
		err := p.post(ctx, hc, p.Token, form, &t)
		var oe *OAuthError
		switch {
		case err == nil:
			if t.IDToken == "" {
				return nil, errors.New("the identity provider sent no ID token: the CLI's client must ask for the openid scope")
			}
			return &t, nil
		case !errors.As(err, &oe):
			return nil, err
		case oe.Code == "authorization_pending":
		case oe.Code == "slow_down":
			interval += 5 * time.Second
		case oe.Code == "access_denied":
			return nil, ErrDeviceDenied
		case oe.Code == "expired_token":
			return nil, ErrDeviceExpired
		default:
			return nil, fmt.Errorf("the identity provider refused the sign-in: %w", oe)
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			return nil, ErrDeviceExpired
		}
	}
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Refresh renews the tokens with a refresh token (RFC 6749 §6).
func (p *Provider) Refresh(ctx context.Context, hc *http.Client, clientID, refreshToken string) (*Tokens, error) {
	var t Tokens
	if err := p.post(ctx, hc, p.Token, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refreshToken}, "client_id": {clientID}}, &t); err != nil {
		return nil, err
	}
	if t.IDToken == "" {
		return nil, errors.New("the identity provider's refresh gave no ID token")
	}
	return &t, nil
}

// Revoke revokes a refresh token (RFC 7009), if the provider offers
// revocation; without it, it does nothing.
func (p *Provider) Revoke(ctx context.Context, hc *http.Client, clientID, token string) error {
	if p.Revocation == "" || token == "" {
		return nil
	}
	return p.post(ctx, hc, p.Revocation, url.Values{"token": {token}, "token_type_hint": {"refresh_token"}, "client_id": {clientID}}, nil)
}

// BrowserLogin is the authorization-code flow with PKCE through a
// loopback redirect (RFC 8252 §7.3): it listens on 127.0.0.1 on a free
// port, calls show with the address to open in a browser on this machine,
// waits for the provider to send the browser back with a code (state
// checked), and trades the code for tokens with the PKCE verifier. The ID
// token's nonce must be the one sent.
func (p *Provider) BrowserLogin(ctx context.Context, hc *http.Client, clientID string, scopes []string, show func(authURL string)) (*Tokens, error) {
	if p.Authorization == "" {
		return nil, fmt.Errorf("the identity provider %s has no authorization endpoint", p.Issuer)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for the browser's return: %w", err)
	}
	defer ln.Close()
	redirect := fmt.Sprintf("http://127.0.0.1:%d/callback", ln.Addr().(*net.TCPAddr).Port)
	state, nonce, verifier := randomString(), randomString(), randomString()
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{"response_type": {"code"}, "client_id": {clientID}, "redirect_uri": {redirect}, "scope": {strings.Join(scopes, " ")},
		"state": {state}, "nonce": {nonce}, "code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"}}
	sep := "?"
	if strings.Contains(p.Authorization, "?") {
		sep = "&"
	}
	type result struct {
		code string
		err  error
	}
	got := make(chan result, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /callback", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var res result
		switch {
		case subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(state)) != 1:
			http.Error(w, "This sign-in was not started by this allot login.", http.StatusBadRequest)
			return // not ours: keep waiting for the real one
		case q.Get("error") == "access_denied":
			res.err = ErrDeviceDenied
		case q.Get("error") != "":
			res.err = fmt.Errorf("the identity provider refused the sign-in: %w", &OAuthError{Code: q.Get("error"), Description: q.Get("error_description")})
		case q.Get("code") == "":
			res.err = errors.New("the identity provider sent the browser back without a code")
		default:
			res.code = q.Get("code")
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if res.err != nil {
			fmt.Fprintf(w, "allot login failed: %v\n", res.err)
		} else {
			fmt.Fprintln(w, "Signed in: you can close this tab and go back to your shell.")
		}
		// The page reaches the browser before the command may end.
		http.NewResponseController(w).Flush() //nolint:errcheck // the browser may be gone
		select {
		case got <- res:
		default: // answered already
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	defer func() {
		// Let the answer in flight finish (a denial returns at once, and
		// closing then cut the browser's page off), for a few seconds.
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		srv.Shutdown(sctx) //nolint:errcheck // a slow browser is cut off
	}()
	show(p.Authorization + sep + q.Encode())
	var res result
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case res = <-got:
	}
	if res.err != nil {
		return nil, res.err
	}
	var t Tokens
	if err := p.post(ctx, hc, p.Token, url.Values{"grant_type": {"authorization_code"}, "code": {res.code}, "redirect_uri": {redirect},
		"client_id": {clientID}, "code_verifier": {verifier}}, &t); err != nil {
		return nil, fmt.Errorf("trading the sign-in code: %w", err)
	}
	if t.IDToken == "" {
		return nil, errors.New("the identity provider sent no ID token: the CLI's client must ask for the openid scope")
	}
	// The server verifies the token's signature; the nonce ties it to this
	// sign-in.
	if n, err := idTokenNonce(t.IDToken); err != nil || subtle.ConstantTimeCompare([]byte(n), []byte(nonce)) != 1 {
		return nil, errors.New("the ID token does not belong to this sign-in (nonce mismatch)")
	}
	return &t, nil
}

func randomString() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// idTokenNonce reads the nonce claim of a JWT without verifying it.
func idTokenNonce(jwt string) (string, error) {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return "", errors.New("not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", err
	}
	var c struct {
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return "", err
	}
	return c.Nonce, nil
}
