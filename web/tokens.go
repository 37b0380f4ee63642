package web

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// parseExpiry reads a token expiry: empty (none asked: the server's
// default lifetime applies, see tokenExpiry), an RFC 3339 time, or a date
// (valid until the end of that day, UTC).
func parseExpiry(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.Parse(time.DateOnly, s); err == nil {
		return d.AddDate(0, 0, 1).Add(-time.Second), nil // the end of that day
	}
	return time.Time{}, (allot.FieldErrors{"expires_at": "must be a date (2026-12-31) or an RFC 3339 time (2026-12-31T18:00:00Z)"}).Err()
}

func tokenStatus(t *store.APIToken, now time.Time) string {
	switch {
	case !t.RevokedAt.IsZero():
		return "revoked"
	case !t.Active(now):
		return "expired"
	}
	return "active"
}

// tokensPage lists the caller's tokens and offers a form for a new one.
func (s *Server) tokensPage(c echo.Context) error {
	return s.renderTokens(c, http.StatusOK, views.Tokens{})
}

// callerTokens lists the caller's own API tokens.
func (s *Server) callerTokens(c echo.Context) ([]store.APIToken, error) {
	u, err := currentUser(c)
	if err != nil {
		return nil, err
	}
	return s.st.ListAPITokens(c.Request().Context(), u.ID)
}

func (s *Server) renderTokens(c echo.Context, status int, t views.Tokens) error {
	list, err := s.callerTokens(c)
	if err != nil {
		return err
	}
	now := s.st.Now()
	t.Page = s.page(c, "API tokens")
	t.MinDate = now.UTC().Format(time.DateOnly)
	if ttl := s.cfg.APITokenTTL; ttl > 0 {
		t.MaxDate = now.Add(ttl).UTC().Format(time.DateOnly)
		t.DefaultExpiry = "empty: " + fmtTTL(ttl) + " from now, the longest a token may last here"
	}
	for i := range list {
		tk := &list[i]
		row := views.TokenRow{ID: tk.ID, Name: tk.Name, Prefix: tk.Prefix, Created: fmtTime(tk.CreatedAt), LastUsed: fmtTime(tk.LastUsedAt),
			Expires: "never", Status: tokenStatus(tk, now), Active: tk.Active(now)}
		if !tk.ExpiresAt.IsZero() {
			row.Expires = fmtTime(tk.ExpiresAt)
		}
		t.Tokens = append(t.Tokens, row)
	}
	return render(c, status, views.TokensView(t))
}

// createTokenForm makes a token from the form and shows its secret once.
func (s *Server) createTokenForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	name, expires := c.FormValue("name"), c.FormValue("expires")
	exp, err := parseExpiry(expires)
	if err == nil {
		exp, err = s.tokenExpiry(exp)
	}
	var secret string
	var tok store.APIToken
	if err == nil {
		secret, tok, err = s.st.CreateAPITokenExpiring(c.Request().Context(), u.ID, name, exp)
	}
	if f := allot.Fields(err); f != nil {
		return s.renderTokens(c, http.StatusUnprocessableEntity, views.Tokens{Name: name, Expires: expires, Errors: f})
	}
	if err != nil {
		return err
	}
	return s.renderTokens(c, http.StatusCreated, views.Tokens{NewSecret: secret, NewName: tok.Name})
}

// revokeTokenForm revokes one of the caller's tokens.
func (s *Server) revokeTokenForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	if err := s.revokeToken(c, &allot.User{ID: u.ID, Email: u.Email}); err != nil {
		return err
	}
	return redirect(c, "/tokens")
}

// revokeToken revokes the token the path names, as by.
func (s *Server) revokeToken(c echo.Context, by *allot.User) error {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil {
		return allot.Errorf(allot.ENotFound, "no API token %q", c.Param("id"))
	}
	_, err = s.st.RevokeAPIToken(c.Request().Context(), id, by)
	return err
}

// TokenJSON is an API token as the API shows it; Token (the secret) is
// only in the answer to its creation.
type TokenJSON struct {
	ID         int64      `json:"id"`
	Name       string     `json:"name"`
	Prefix     string     `json:"prefix"`
	Status     string     `json:"status"` // active, expired, revoked
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	ExpiresAt  *time.Time `json:"expires_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
	// ParentID is the token whose request made this one (omitted: made in
	// the portal); revoking that one revokes this one too.
	ParentID int64  `json:"parent_id,omitempty"`
	Token    string `json:"token,omitempty"`
}

// TokenList is the body of GET /api/v1/tokens.
type TokenList struct {
	Tokens []TokenJSON `json:"tokens"`
}

// TokenRequest is the body of POST /api/v1/tokens.
type TokenRequest struct {
	Name string `json:"name"`
	// ExpiresAt is an RFC 3339 time or a date; empty: the server's
	// default lifetime (--api-token-ttl, 90 days unless set; never when
	// it is 0), or the expiry of the token making the request if earlier.
	ExpiresAt string `json:"expires_at"`
}

func tokenJSON(t *store.APIToken, now time.Time) TokenJSON {
	opt := func(v time.Time) *time.Time {
		if v.IsZero() {
			return nil
		}
		return &v
	}
	return TokenJSON{ID: t.ID, Name: t.Name, Prefix: t.Prefix, Status: tokenStatus(t, now), CreatedAt: t.CreatedAt,
		LastUsedAt: opt(t.LastUsedAt), ExpiresAt: opt(t.ExpiresAt), RevokedAt: opt(t.RevokedAt), ParentID: t.ParentID}
}

func (s *Server) apiListTokens(c echo.Context) error {
	list, err := s.callerTokens(c)
	if err != nil {
		return err
	}
	out := TokenList{Tokens: []TokenJSON{}}
	for i := range list {
		out.Tokens = append(out.Tokens, tokenJSON(&list[i], s.st.Now()))
	}
	return writeJSON(c, http.StatusOK, out)
}

func (s *Server) apiCreateToken(c echo.Context) error {
	u, req, err := userAndBody[TokenRequest](c)
	if err != nil {
		return err
	}
	exp, err := parseExpiry(req.ExpiresAt)
	if err != nil {
		return err
	}
	asked := !exp.IsZero()
	if exp, err = s.tokenExpiry(exp); err != nil {
		return err
	}
	parent, err := s.callingToken(c)
	if err != nil {
		return err
	}
	if exp, err = capByParent(parent, exp, asked); err != nil {
		return err
	}
	// A token made with a token is revoked with it (ParentID).
	secret, tok, err := s.st.CreateAPITokenWith(c.Request().Context(), u.ID, store.NewAPIToken{Name: req.Name, ExpiresAt: exp, ParentID: parent.ID})
	if err != nil {
		return err
	}
	out := tokenJSON(&tok, s.st.Now())
	out.Token = secret
	c.Response().Header().Set("Location", "/api/v1/tokens/"+strconv.FormatInt(tok.ID, 10))
	return writeJSON(c, http.StatusCreated, out)
}

// fmtTTL says a token lifetime in days (or hours, under a day).
func fmtTTL(d time.Duration) string {
	if d >= 24*time.Hour && d%(24*time.Hour) == 0 {
		if n := d / (24 * time.Hour); n != 1 {
			return strconv.FormatInt(int64(n), 10) + " days"
		}
		return "1 day"
	}
	return d.String()
}

// tokenExpiry applies the server's API token lifetime (Config.APITokenTTL)
// to an asked expiry: none asked becomes now + the lifetime, and one
// later than that is a field error. Without a lifetime (0) it is as
// asked.
func (s *Server) tokenExpiry(exp time.Time) (time.Time, error) {
	ttl := s.cfg.APITokenTTL
	if ttl <= 0 {
		return exp, nil
	}
	limit := s.st.Now().Add(ttl)
	if exp.IsZero() {
		return limit, nil
	}
	if exp.After(limit) && exp.UTC().Format(time.DateOnly) == limit.UTC().Format(time.DateOnly) {
		return limit, nil // the last day the form offers: until the limit
	}
	if exp.After(limit) {
		return time.Time{}, (allot.FieldErrors{"expires_at": "must be at most " + fmtTTL(ttl) + " from now (" +
			limit.UTC().Format(time.RFC3339) + "), the longest an API token may last on this server"}).Err()
	}
	return exp, nil
}

// callingToken is the API token the request came with (its ID 0 when it
// came with a browser session).
func (s *Server) callingToken(c echo.Context) (store.APIToken, error) {
	secret, ok := strings.CutPrefix(c.Request().Header.Get("Authorization"), "Bearer ")
	if !ok {
		return store.APIToken{}, nil
	}
	return s.st.APITokenBySecret(c.Request().Context(), strings.TrimSpace(secret))
}

// capByParent keeps a token made with a bearer token (parent; ID 0: none)
// from outliving it: an expiry the request did not ask for (asked false:
// none, or the server's default) becomes the parent's expiry when that
// is earlier, and a later one it asked for is a field error.
func capByParent(parent store.APIToken, exp time.Time, asked bool) (time.Time, error) {
	switch {
	case parent.ID == 0 || parent.ExpiresAt.IsZero():
		return exp, nil
	case !asked && (exp.IsZero() || exp.After(parent.ExpiresAt)):
		return parent.ExpiresAt, nil
	case exp.After(parent.ExpiresAt):
		return time.Time{}, (allot.FieldErrors{"expires_at": "must not be later than " + parent.ExpiresAt.UTC().Format(time.RFC3339) +
			", when the token making this request expires"}).Err()
	}
	return exp, nil
}

// apiRevokeToken revokes a token, and the tokens made with it: the
// caller's own, or anyone's for an admin. Someone else's token is 404 to others, as if it did not exist.
func (s *Server) apiRevokeToken(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	if err := s.revokeToken(c, u); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
