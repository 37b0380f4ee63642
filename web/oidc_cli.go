package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/labstack/echo/v4"
	"golang.org/x/oauth2"
)

// `allot login`: the CLI signs in at the same OpenID provider as the
// portal, with its own public client (OIDCConfig.CLIClientID) and the
// device authorization grant (RFC 8628), then trades the ID token it got
// for a short-lived Allot API token here. The person is recorded exactly as
// at a portal sign-in (oidcUser, SignInOIDC).

// CLITokenTTL is how long an API token from `allot login` lasts (less when
// --api-token-ttl is shorter); the CLI renews it with its refresh token.
const CLITokenTTL = 12 * time.Hour

// CLITokenNamePrefix starts the name of every API token `allot login`
// makes ("allot login: <host>"): one per person and host, the next login
// from that host revokes the last, and an admin's link of another identity
// to the account revokes them all (store.LinkOIDCIdentity).
const CLITokenNamePrefix = store.CLITokenNamePrefix

// CLIConfigJSON is GET /api/v1/auth/cli: where and as whom the CLI signs
// in.
type CLIConfigJSON struct {
	Issuer   string   `json:"issuer"`
	ClientID string   `json:"client_id"`
	Scopes   []string `json:"scopes"`
	// TokenTTLSeconds is the lifetime of the API token the exchange gives.
	TokenTTLSeconds int64 `json:"token_ttl_seconds"`
}

// CLITokenRequest is the body of POST /api/v1/auth/cli/token.
type CLITokenRequest struct {
	// IDToken is the provider's ID token, issued to the CLI client.
	IDToken string `json:"id_token"`
	// AccessToken, if sent, reads userinfo when the ID token lacks the
	// groups claim, as at a portal sign-in.
	AccessToken string `json:"access_token"`
	// Host names the machine the token is for (the token's name).
	Host string `json:"host"`
	// PreviousToken, on a renewal, is the API token being renewed: one
	// that was revoked before it expired ends the sign-in (the person, or
	// an admin, revoked it on purpose).
	PreviousToken string `json:"previous_token,omitempty"`
}

// CLITokenJSON is the answer: the API token (its secret in Token) and who
// it is for.
type CLITokenJSON struct {
	TokenJSON
	Email string `json:"email"`
	Name  string `json:"user_name"`
}

// cliClient is the SSO client and the CLI's client ID, or a problem saying
// why `allot login` does not work on this server.
func (s *Server) cliClient(c echo.Context) (*oidcClient, string, error) {
	if s.oidc == nil {
		return nil, "", allot.Errorf(allot.ENotFound, "single sign-on is not configured on this server, so allot login cannot work here: use an API token (--token or ALLOT_TOKEN) from the portal's API tokens page")
	}
	id := s.oidc.cfg.CLIClientID
	if id == "" {
		return nil, "", allot.Errorf(allot.ENotFound, "this server has single sign-on but no client for the CLI (allot server --oidc-cli-client-id, ALLOT_OIDC_CLI_CLIENT_ID), so allot login cannot work here: use an API token (--token or ALLOT_TOKEN)")
	}
	o, err := s.oidc.get(c.Request().Context())
	if err != nil {
		return nil, "", allot.Errorf(allot.EUnavailable, "single sign-on is unavailable: %v", err)
	}
	return o, id, nil
}

// cliTokenTTL is CLITokenTTL, or the server's API token lifetime if
// shorter.
func (s *Server) cliTokenTTL() time.Duration {
	if ttl := s.cfg.APITokenTTL; ttl > 0 && ttl < CLITokenTTL {
		return ttl
	}
	return CLITokenTTL
}

// apiCLIConfig tells the CLI the issuer, its client ID and the scopes to
// ask for: the portal's (groups where the provider needs it) and
// offline_access for a refresh token. Public: the CLI asks before it has
// any token.
func (s *Server) apiCLIConfig(c echo.Context) error {
	if s.oidc == nil || s.oidc.cfg.CLIClientID == "" {
		_, _, err := s.cliClient(c) // says why not
		return err
	}
	// The portal's scopes as discovery settled them (groups added where
	// the provider lists it); the configured ones if it is unreachable
	// now (the CLI will say so when it gets there).
	base := s.oidc.cfg.Scopes
	if o, err := s.oidc.get(c.Request().Context()); err == nil && len(o.scopes()) > 0 {
		base = o.scopes()
	}
	scopes := []string{oidc.ScopeOpenID}
	for _, sc := range append(slices.Clone(base), oidc.ScopeOfflineAccess) {
		if !slices.Contains(scopes, sc) {
			scopes = append(scopes, sc)
		}
	}
	return writeJSON(c, http.StatusOK, CLIConfigJSON{Issuer: s.oidc.cfg.Issuer, ClientID: s.oidc.cfg.CLIClientID, Scopes: scopes,
		TokenTTLSeconds: int64(s.cliTokenTTL().Seconds())})
}

// cliSignIn records the person as a portal sign-in does (signIn): the
// same claims mapping, account linking rules and sign-in record.
func (s *Server) cliSignIn(ctx context.Context, o *oidcClient, idt *oidc.IDToken, accessToken, host string) (*allot.User, error) {
	u, link, err := s.signIn(ctx, o, idt, &oauth2.Token{AccessToken: accessToken, TokenType: "Bearer"}, "allot login: ", "allot login from "+host)
	switch {
	case link != nil:
		return nil, allot.Errorf(allot.EForbidden, "an Allot account exists for %s, but this sign-in is not linked to it (%s); an admin must link your identity to the account (Admin → Identity); give them issuer %s, subject %s",
			u.Email, link.Reason, idt.Issuer, u.OIDCSubject)
	case err == nil:
		return u, nil
	case allot.ErrorCode(err) == allot.EInternal || allot.ErrorCode(err) == allot.EUnavailable || allot.ErrorCode(err) == allot.EForbidden:
		return nil, err
	}
	return nil, allot.Errorf(allot.EConflict, "your account could not be recorded: %s", allot.ErrorMessage(err))
}

// cliHost checks the host name the CLI sends: printable, at most 60
// characters; empty is "unknown host".
func cliHost(h string) (string, error) {
	h = strings.TrimSpace(h)
	if h == "" {
		return "unknown host", nil
	}
	if len([]rune(h)) > 60 || strings.IndexFunc(h, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return "", (allot.FieldErrors{"host": "must be printable text of at most 60 characters"}).Err()
	}
	return h, nil
}

// apiCLIToken verifies the provider's ID token (signature, issuer,
// audience = the CLI's client, expiry), records the person as a portal
// sign-in does, revokes the API token an earlier `allot login` from the
// same host made, and returns a new one lasting CLITokenTTL. Public: the
// ID token is the credential. Audited (token.cli_login).
func (s *Server) apiCLIToken(c echo.Context) error {
	o, clientID, err := s.cliClient(c)
	if err != nil {
		return err
	}
	var req CLITokenRequest
	if err := decodeStrict(c.Request().Body, &req); err != nil {
		return err
	}
	req.IDToken = strings.TrimSpace(req.IDToken)
	if req.IDToken == "" {
		return (allot.FieldErrors{"id_token": "is required: the ID token the identity provider gave allot login"}).Err()
	}
	host, err := cliHost(req.Host)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	// o.provider's key set is shared: a verifier per request is cheap.
	idt, err := o.provider.Verifier(&oidc.Config{ClientID: clientID}).Verify(ctx, req.IDToken)
	if err != nil {
		s.log.Warn("allot login: ID token rejected", "err", err)
		var expired *oidc.TokenExpiredError
		if errors.As(err, &expired) {
			return allot.Errorf(allot.EUnauthorized, "the ID token expired at %s: run allot login again", expired.Expiry.UTC().Format(time.RFC3339))
		}
		return allot.Errorf(allot.EUnauthorized, "the ID token failed verification: %v", err)
	}
	u, err := s.cliSignIn(ctx, o, idt, strings.TrimSpace(req.AccessToken), host)
	if err != nil {
		return err
	}
	if prev := strings.TrimSpace(req.PreviousToken); prev != "" {
		t, err := s.st.APITokenBySecret(ctx, prev)
		if err == nil && t.UserID == u.ID && !t.RevokedAt.IsZero() && (t.ExpiresAt.IsZero() || t.RevokedAt.Before(t.ExpiresAt)) {
			s.log.Warn("allot login renewal of a revoked token refused", "user", u.Email, "token", t.ID)
			return allot.Errorf(allot.EUnauthorized, "the API token of this allot login (%s…) was revoked: run allot login again", t.Prefix)
		}
	}
	name := CLITokenNamePrefix + host
	if n := len([]rune(name)); n > store.MaxTokenNameLen {
		name = string([]rune(name)[:store.MaxTokenNameLen])
	}
	// One transaction: the old token goes, the new one comes, audited.
	var secret string
	var tok store.APIToken
	err = s.st.InTx(ctx, func(tx *store.Store) error {
		if err := tx.RevokeAPITokensNamed(ctx, u.ID, name); err != nil {
			return err
		}
		var err error
		if secret, tok, err = tx.CreateAPITokenWith(ctx, u.ID, store.NewAPIToken{Name: name, ExpiresAt: tx.Now().Add(s.cliTokenTTL())}); err != nil {
			return err
		}
		return tx.Audit(ctx, &allot.AuditEntry{Actor: u.Email, Action: "token.cli_login", Object: fmt.Sprintf("token:%d", tok.ID),
			Note: fmt.Sprintf("allot login from %s: API token %s… until %s (identity-provider subject %s)", host, tok.Prefix,
				tok.ExpiresAt.UTC().Format(time.RFC3339), u.OIDCSubject)})
	})
	if err != nil {
		return err
	}
	s.log.Info("signed in with allot login", "user", u.Email, "subject", u.OIDCSubject, "host", host, "token", tok.ID,
		"admin", u.Admin, "finance", u.Finance, "teams", len(u.Memberships))
	out := CLITokenJSON{TokenJSON: tokenJSON(&tok, s.st.Now()), Email: u.Email, Name: u.Name}
	out.Token = secret
	return writeJSON(c, http.StatusCreated, out)
}
