package web

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/labstack/echo/v4"
	"golang.org/x/oauth2"
)

// OIDCConfig is single sign-on through an OpenID Connect provider with the
// authorization-code flow, PKCE (S256), state and nonce.
type OIDCConfig struct {
	// Issuer is the provider's issuer URL; discovery is read from
	// Issuer/.well-known/openid-configuration. Empty: no SSO.
	Issuer       string
	ClientID     string
	ClientSecret string
	CLIClientID  string // allot login's public client with the device grant (oidc_cli.go); empty: no allot login
	// RedirectURL is this server's callback, …/oidc/callback, as
	// registered with the provider.
	RedirectURL string
	// Scopes asked for besides openid. Empty: profile and email, and
	// groups when the provider's discovery lists it in scopes_supported
	// (Okta and Dex send the groups claim only for that scope; Keycloak
	// and Entra ID refuse scopes they do not know, and do not list it).
	Scopes []string
	Claims ClaimMapping
	// LinkEmailIssuers are the issuers whose verified email may link a
	// first sign-in to an account that never signed in (the bootstrap
	// admin, people recorded before SSO). Empty: none; an admin links
	// such sign-ins (POST /api/v1/users/{user}/oidc-link, /admin/identity).
	LinkEmailIssuers []string
}

// linkByEmail says whether issuer may link sign-ins by verified email.
func (c OIDCConfig) linkByEmail(issuer string) bool {
	return issuer != "" && slices.ContainsFunc(c.LinkEmailIssuers, func(i string) bool {
		return strings.TrimSuffix(i, "/") == strings.TrimSuffix(issuer, "/")
	})
}

// Enabled says whether SSO is configured.
func (c OIDCConfig) Enabled() bool { return c.Issuer != "" }

// ClaimMapping turns the provider's groups claim into Allot roles.
type ClaimMapping struct {
	// GroupsClaim is the claim holding the groups (default "groups"): a
	// list of strings, or one space- or comma-separated string.
	GroupsClaim string
	// AdminGroup makes its members admins (default "allot-admins").
	AdminGroup string
	// FinanceGroup makes its members finance (default "allot-finance").
	FinanceGroup string
	// TeamPrefix + <team> makes an engineer of the team (default "team:");
	// TeamPrefix + <team> + LeadSuffix makes a lead (default ":lead").
	TeamPrefix string
	LeadSuffix string
	// AccountClaim is the claim whose value is the person's POSIX account
	// (e.g. "uid" or "preferred_username"), stored at each sign-in; the
	// person's jobs run as it unless an admin mapped them to another. ""
	// (the default): no claim is read.
	AccountClaim string
}

// WithDefaults fills in the default claim names.
func (m ClaimMapping) WithDefaults() ClaimMapping {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&m.GroupsClaim, "groups")
	def(&m.AdminGroup, "allot-admins")
	def(&m.FinanceGroup, "allot-finance")
	def(&m.TeamPrefix, "team:")
	def(&m.LeadSuffix, ":lead")
	return m
}

// Map returns the roles the groups give with the built-in mapping
// (DefaultRules): admin, finance and team memberships (a lead group wins
// over a member group of the same team). Groups that mean nothing to
// Allot are ignored.
func (m ClaimMapping) Map(groups []string) (admin, finance bool, ms []allot.Membership) {
	m = m.WithDefaults()
	res := store.ApplyRules(m.DefaultRules(), func(c string) []string {
		if c == m.GroupsClaim {
			return groups
		}
		return nil
	})
	return res.Admin, res.Finance, res.Memberships
}

// oidcClient discovers the provider on first use (so the server starts
// while the provider is down) and keeps what it found.
type oidcClient struct {
	cfg OIDCConfig

	mu         sync.Mutex
	provider   *oidc.Provider
	verifier   *oidc.IDTokenVerifier
	oauth      *oauth2.Config
	endSession string
	// autoScopes: the configuration named no scopes, so groups is added
	// when the provider lists it.
	autoScopes bool
}

func newOIDCClient(cfg OIDCConfig) *oidcClient {
	cfg.Claims = cfg.Claims.WithDefaults()
	auto := len(cfg.Scopes) == 0
	if auto {
		cfg.Scopes = []string{"profile", "email"}
	}
	return &oidcClient{cfg: cfg, autoScopes: auto}
}

// scopes are the scopes sign-ins ask for ("" until the provider was
// discovered), for the admin page.
func (o *oidcClient) scopes() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.oauth == nil {
		return nil
	}
	return slices.Clone(o.oauth.Scopes)
}

// errIdP is the provider being unreachable or misconfigured.
var errIdP = errors.New("identity provider")

func (o *oidcClient) get(ctx context.Context) (*oidcClient, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.provider != nil {
		return o, nil
	}
	if o.cfg.RedirectURL == "" {
		return nil, fmt.Errorf("%w: the redirect URL (ALLOT_OIDC_REDIRECT_URL) is not set", errIdP)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(ctx, o.cfg.Issuer)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errIdP, err)
	}
	var extra struct {
		EndSession string   `json:"end_session_endpoint"`
		Scopes     []string `json:"scopes_supported"`
	}
	if err := p.Claims(&extra); err != nil {
		return nil, fmt.Errorf("%w: reading discovery: %v", errIdP, err)
	}
	o.provider, o.endSession = p, extra.EndSession
	o.verifier = p.Verifier(&oidc.Config{ClientID: o.cfg.ClientID})
	scopes := append([]string{oidc.ScopeOpenID}, o.cfg.Scopes...)
	if o.autoScopes && slices.Contains(extra.Scopes, "groups") {
		scopes = append(scopes, "groups")
	}
	o.oauth = &oauth2.Config{ClientID: o.cfg.ClientID, ClientSecret: o.cfg.ClientSecret, RedirectURL: o.cfg.RedirectURL,
		Endpoint: p.Endpoint(), Scopes: scopes}
	return o, nil
}

const (
	oidcStateCookie = "allot_oidc_state"
	oidcLoginTTL    = 10 * time.Minute
)

// safeNext returns next if it is a path on this server, else "/jobs": a
// sign-in must never send anyone to another site.
func safeNext(next string) string {
	const home = "/jobs"
	if next == "" || len(next) > 2000 || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") ||
		strings.ContainsAny(next, "\\\r\n\t") {
		return home
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || !strings.HasPrefix(u.Path, "/") {
		return home
	}
	// Going back to the login pages after logging in makes no sense.
	if u.Path == "/login" || strings.HasPrefix(u.Path, "/login/") || strings.HasPrefix(u.Path, "/oidc/") {
		return home
	}
	return next
}

// oidcStart begins a sign-in: it stores state, nonce and PKCE verifier
// server-side for 10 minutes, binds the state to this browser with a
// short-lived cookie and sends the browser to the provider.
func (s *Server) oidcStart(c echo.Context) error {
	if s.oidc == nil {
		return allot.Errorf(allot.ENotFound, "single sign-on is not configured on this server")
	}
	ctx := c.Request().Context()
	o, err := s.oidc.get(ctx)
	if err != nil {
		return s.loginError(c, http.StatusBadGateway, "Single sign-on is unavailable: "+err.Error())
	}
	state, nonce, verifier := store.RandomSecret(), store.RandomSecret(), oauth2.GenerateVerifier()
	if err := s.st.SaveOIDCLogin(ctx, state, store.OIDCLogin{Nonce: nonce, Verifier: verifier, Next: safeNext(c.QueryParam("next"))}, oidcLoginTTL); err != nil {
		return err
	}
	c.SetCookie(&http.Cookie{Name: oidcStateCookie, Value: state, Path: "/oidc/", HttpOnly: true, Secure: s.cfg.SecureCookies,
		SameSite: http.SameSiteLaxMode, MaxAge: int(oidcLoginTTL.Seconds())})
	return c.Redirect(http.StatusSeeOther, o.oauth.AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier)))
}

// oidcCallback finishes a sign-in: the state must match this browser's and
// be unused, the code is exchanged with the PKCE verifier, and the ID
// token's signature, issuer, audience, expiry and nonce are checked before
// the person is recorded and gets a session.
func (s *Server) oidcCallback(c echo.Context) error {
	if s.oidc == nil {
		return allot.Errorf(allot.ENotFound, "single sign-on is not configured on this server")
	}
	ctx := c.Request().Context()
	q := c.QueryParams()
	state := q.Get("state")
	var browserState string
	if ck, err := c.Cookie(oidcStateCookie); err == nil {
		browserState = ck.Value
	}
	c.SetCookie(&http.Cookie{Name: oidcStateCookie, Value: "", Path: "/oidc/", HttpOnly: true, Secure: s.cfg.SecureCookies,
		SameSite: http.SameSiteLaxMode, MaxAge: -1})
	if state == "" || browserState == "" || subtle.ConstantTimeCompare([]byte(state), []byte(browserState)) != 1 {
		return s.loginError(c, http.StatusBadRequest, "This sign-in was not started in this browser, or it has expired. Start again.")
	}
	// The state is used up whatever happens next.
	login, err := s.st.TakeOIDCLogin(ctx, state)
	if err != nil {
		if allot.ErrorCode(err) == allot.EUnauthorized {
			return s.loginError(c, http.StatusBadRequest, "This sign-in was already used or has expired. Start again.")
		}
		return err
	}
	if e := q.Get("error"); e != "" {
		msg := "The identity provider did not sign you in (" + e + ")"
		if d := q.Get("error_description"); d != "" {
			msg += ": " + d
		}
		msg += "."
		if e == "invalid_scope" {
			// A provider that refuses scopes it does not know (Keycloak,
			// Entra ID): say which were asked for and where to change them.
			msg += " Allot asked for the scopes \"" + strings.Join(s.oidc.scopes(), " ") +
				"\"; an admin can set the scopes with --oidc-scopes (ALLOT_OIDC_SCOPES), e.g. \"profile email\" without groups."
			s.log.Warn("the identity provider refused the scopes Allot asked for", "scopes", s.oidc.scopes(), "description", q.Get("error_description"))
		}
		return s.loginError(c, http.StatusForbidden, msg)
	}
	code := q.Get("code")
	if code == "" {
		return s.loginError(c, http.StatusBadRequest, "The identity provider sent no authorization code.")
	}
	o, err := s.oidc.get(ctx)
	if err != nil {
		return s.loginError(c, http.StatusBadGateway, "Single sign-on is unavailable: "+err.Error())
	}
	tok, err := o.oauth.Exchange(ctx, code, oauth2.VerifierOption(login.Verifier))
	if err != nil {
		s.log.Warn("OIDC code exchange failed", "err", err)
		return s.loginError(c, http.StatusBadRequest, "The identity provider refused the sign-in code: "+exchangeError(err))
	}
	raw, ok := tok.Extra("id_token").(string)
	if !ok || raw == "" {
		return s.loginError(c, http.StatusBadGateway, "The identity provider sent no ID token.")
	}
	idt, err := o.verifier.Verify(ctx, raw)
	if err != nil {
		s.log.Warn("OIDC ID token rejected", "err", err)
		return s.loginError(c, http.StatusBadRequest, "The ID token failed verification: "+err.Error())
	}
	if subtle.ConstantTimeCompare([]byte(idt.Nonce), []byte(login.Nonce)) != 1 {
		return s.loginError(c, http.StatusBadRequest, "The ID token does not belong to this sign-in (nonce mismatch). Start again.")
	}
	u, link, err := s.signIn(ctx, o, idt, tok, "", "")
	switch {
	case link != nil:
		return s.loginError(c, http.StatusForbidden, fmt.Sprintf(
			"An Allot account exists for %s, but this sign-in is not linked to it (%s). An admin must link your identity to the account "+
				"(Admin → Identity, or POST /api/v1/users/{user}/oidc-link). Give them: issuer %s, subject %s.",
			u.Email, link.Reason, idt.Issuer, u.OIDCSubject))
	case err == nil:
	case allot.ErrorCode(err) == allot.EInternal || allot.ErrorCode(err) == allot.EUnavailable:
		return err
	case allot.ErrorCode(err) == allot.EForbidden: // no usable claims, or an admin disabled the account
		return s.loginError(c, http.StatusForbidden, allot.ErrorMessage(err))
	default:
		return s.loginError(c, http.StatusConflict, "Your account could not be recorded: "+allot.ErrorMessage(err))
	}
	s.log.Info("signed in with OIDC", "user", u.Email, "subject", u.OIDCSubject, "admin", u.Admin, "finance", u.Finance, "teams", len(u.Memberships))
	if err := s.startSession(c, u.ID); err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, safeNext(login.Next))
}

// signIn maps the ID token's claims to the person (oidcUser), records
// them (SignInOIDC: the account linking rules) and their "allot login"
// or portal sign-in for the admin page (RecordOIDCSignIn), and stores what
// the account claim says: what the portal's callback and allot login
// share. detail starts the sign-in record's detail of a refusal ("" at the
// portal); signedIn is the detail of a sign-in that worked.
//
// A link an admin must make returns the user (for its email and subject)
// and link. Other refusals, also recorded, are allot errors: EForbidden
// (claims without a usable user, a disabled account) or another code (the
// account could not be recorded); EInternal and EUnavailable are not
// refusals and are not recorded.
func (s *Server) signIn(ctx context.Context, o *oidcClient, idt *oidc.IDToken, tok *oauth2.Token, detail, signedIn string) (*allot.User, *store.LinkRequiredError, error) {
	via := "portal"
	if detail != "" {
		via = strings.TrimSuffix(detail, ": ")
	}
	u, verified, report, err := s.oidcUser(ctx, o, idt, tok)
	record := func(outcome, d string) {
		report.Outcome, report.Detail = outcome, d
		if err := s.st.RecordOIDCSignIn(ctx, report); err != nil {
			s.log.Warn("recording the sign-in failed", "err", err)
		}
	}
	if err != nil {
		// Shown on the admin page too (a provider that sends no email).
		record("refused", detail+err.Error())
		return nil, nil, allot.Errorf(allot.EForbidden, "%s", err.Error())
	}
	unknown, err := s.st.SignInOIDC(ctx, u, idt.Issuer, verified, o.cfg.linkByEmail(idt.Issuer))
	var link *store.LinkRequiredError
	switch {
	case errors.As(err, &link):
		// Never link by email by itself here: the "nOAuth" takeover is a
		// second identity-provider account claiming a known email.
		s.log.Warn("OIDC sign-in not linked to the existing account: an admin must link it", "via", via,
			"user", u.Email, "issuer", idt.Issuer, "subject", u.OIDCSubject, "reason", link.Reason)
		record("link_required", detail+link.Reason)
		return u, link, err
	case err != nil:
		if allot.ErrorCode(err) == allot.EInternal || allot.ErrorCode(err) == allot.EUnavailable {
			return nil, nil, err
		}
		record("refused", detail+allot.ErrorMessage(err))
		if allot.ErrorCode(err) == allot.EForbidden { // an admin disabled the account
			s.log.Warn("OIDC sign-in of a disabled user refused", "via", via, "user", u.Email, "subject", u.OIDCSubject)
		} else {
			s.log.Warn("OIDC sign-in refused", "via", via, "user", u.Email, "subject", u.OIDCSubject, "err", err)
		}
		return nil, nil, err
	}
	report.Roles = rolesSummary(u)
	record("signed_in", signedIn)
	if len(unknown) > 0 {
		s.log.Warn("OIDC groups name teams Allot does not know", "user", u.Email, "teams", unknown)
	}
	// What the account claim says now ("" when it is off or says nothing).
	if err := s.st.SetOIDCPosixUser(ctx, u.ID, u.OIDCPosixUser); err != nil {
		return nil, nil, err
	}
	return u, nil, nil
}

// exchangeError is the provider's error code and description, when it sent
// them.
func exchangeError(err error) string {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) && re.ErrorCode != "" {
		if re.ErrorDescription != "" {
			return re.ErrorCode + ": " + re.ErrorDescription
		}
		return re.ErrorCode
	}
	return "the token request failed"
}

// oidcUser maps the ID token's claims (and userinfo's, when the ID token
// lacks a claim the mapping reads) to a user, says whether the provider
// vouches for the email address (email_verified explicitly true: only then
// may the sign-in be linked by email to an account Allot already has), and
// reports what the provider sent (claim names and counts, not values).
func (s *Server) oidcUser(ctx context.Context, o *oidcClient, idt *oidc.IDToken, tok *oauth2.Token) (*allot.User, bool, store.OIDCSignIn, error) {
	report := store.OIDCSignIn{Issuer: idt.Issuer, Subject: idt.Subject, ClaimCounts: map[string]int{}}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return nil, false, report, fmt.Errorf("the ID token's claims cannot be read: %v", err)
	}
	rules, err := s.idpRules(ctx, o.cfg.Claims)
	if err != nil {
		return nil, false, report, fmt.Errorf("the identity mapping cannot be read: %v", err)
	}
	read := ruleClaims(rules)
	missing := slices.ContainsFunc(read, func(c string) bool { _, ok := claimValues(claims, c); return !ok })
	if _, ok := claims["email"]; missing || !ok {
		info, err := o.provider.UserInfo(ctx, oauth2.StaticTokenSource(tok))
		if err == nil && info.Subject == idt.Subject {
			var more map[string]any
			if info.Claims(&more) == nil {
				for k, v := range more {
					if _, have := claims[k]; !have {
						claims[k] = v
					}
				}
			}
		}
	}
	for k := range claims {
		report.ClaimNames = append(report.ClaimNames, k)
	}
	slices.Sort(report.ClaimNames)
	str := func(k string) string { v, _ := claims[k].(string); return strings.TrimSpace(v) }
	email := str("email")
	report.Email = email
	if email == "" {
		return nil, false, report, errors.New("the identity provider sent no email address: ask for the email scope")
	}
	if v, ok := claims["email_verified"].(bool); ok && !v {
		return nil, false, report, errors.New("your email address is not verified at the identity provider")
	}
	verified := emailVerified(claims)
	name := str("name")
	if name == "" {
		name = str("preferred_username")
	}
	if name == "" {
		name = email
	}
	res, counts, over := mapClaims(rules, mappableClaims(claims))
	report.ClaimCounts = counts
	if len(over) > 0 {
		// Entra ID sends _claim_names.groups instead of the groups when a
		// person is in more than 200 (150 in SAML): Allot does not fetch
		// them from Microsoft Graph, so say so where admins look.
		report.Overage = true
		s.log.Warn("the identity provider sent a groups overage marker (_claim_names) instead of the groups: this person gets no roles from them; use app roles (the roles claim) or emit only the groups assigned to the application",
			"user", email, "claims", over)
	}
	if len(counts) == 0 {
		// Roles still follow the provider (an IdP may leave the claim out
		// for someone in no group), but a misconfigured claim strips
		// everyone's roles: say so where admins look.
		s.log.Warn("the identity provider sent none of the claims the identity mapping reads: this person gets no admin, finance or team roles",
			"user", email, "claims", read)
	}
	report.Matched = res.Matched
	u := &allot.User{OIDCSubject: idt.Subject, Email: email, Name: name, Admin: res.Admin, Finance: res.Finance, Memberships: res.Memberships}
	if claim := o.cfg.Claims.AccountClaim; claim != "" {
		account := str(claim)
		switch {
		case account == "":
			s.log.Warn("the identity provider sent no account claim: this person's jobs need an admin's mapping or their team's service account",
				"user", email, "claim", claim)
		case allot.POSIXAccountProblem(account) != "":
			s.log.Warn("the identity provider's account claim is not a POSIX account Allot runs jobs as; ignored",
				"user", email, "claim", claim, "problem", allot.POSIXAccountProblem(account))
		default:
			u.OIDCPosixUser = account
		}
	}
	return u, verified, report, nil
}

// startSession logs userID in on this browser, ending the session it had
// (a new session secret at every login).
func (s *Server) startSession(c echo.Context, userID int64) error {
	if ck, err := c.Cookie(sessionCookie); err == nil && ck.Value != "" {
		if err := s.st.DeleteSession(c.Request().Context(), ck.Value); err != nil {
			return err
		}
	}
	secret, err := s.st.CreateSession(c.Request().Context(), userID, s.cfg.SessionTTL)
	if err != nil {
		return err
	}
	c.SetCookie(&http.Cookie{Name: sessionCookie, Value: secret, Path: "/", HttpOnly: true, Secure: s.cfg.SecureCookies,
		SameSite: http.SameSiteLaxMode, Expires: time.Now().Add(s.cfg.SessionTTL)})
	return nil
}

// endSessionURL is where logout sends the browser when the provider has
// an end-session endpoint (RP-initiated logout), or "".
func (s *Server) endSessionURL(ctx context.Context) string {
	if s.oidc == nil {
		return ""
	}
	o, err := s.oidc.get(ctx)
	if err != nil || o.endSession == "" {
		return ""
	}
	u, err := url.Parse(o.endSession)
	if err != nil {
		return ""
	}
	back, err := url.Parse(o.cfg.RedirectURL)
	if err != nil {
		return ""
	}
	back.Path, back.RawQuery = "/login", ""
	q := u.Query()
	q.Set("client_id", o.cfg.ClientID)
	q.Set("post_logout_redirect_uri", back.String())
	u.RawQuery = q.Encode()
	return u.String()
}
