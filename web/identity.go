package web

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// Who jobs run as: admins map people to POSIX accounts (the first place a
// job's account comes from; then the identity provider's account claim,
// then the team's service account, which is edited with the team).

// AccountsJSON is the body of GET /api/v1/accounts.
type AccountsJSON struct {
	Users []store.PosixMapping `json:"users"`
}

func (s *Server) apiListAccounts(c echo.Context) error {
	users, err := s.st.ListPosixMappings(c.Request().Context())
	if err != nil {
		return err
	}
	if users == nil {
		users = []store.PosixMapping{}
	}
	return writeJSON(c, http.StatusOK, AccountsJSON{Users: users})
}

// AccountPutJSON is the body of PUT /api/v1/users/{user}/account ({user}:
// an id or an email address): the POSIX account the user's jobs run as (""
// removes the mapping).
type AccountPutJSON struct {
	PosixUser *string `json:"posix_user"`
	Note      string  `json:"note"`
}

// apiSetAccount maps the user named by :user (an id or an email address) to a POSIX
// account, audited as user.posix_user.
func (s *Server) apiSetAccount(c echo.Context) error {
	u, p, err := userAndBody[AccountPutJSON](c)
	if err != nil {
		return err
	}
	if p.PosixUser == nil {
		return (allot.FieldErrors{"posix_user": "is required: the POSIX account, or \"\" to remove the mapping"}).Err()
	}
	m, r, err := s.st.SetPosixUser(c.Request().Context(), u.Email, c.Param("user"), *p.PosixUser, p.Note)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, changeJSON(r, m))
}

// ---- Portal: /admin/accounts

func (s *Server) adminAccountsPage(c echo.Context) error {
	a := views.AdminAccounts{}
	if who := c.QueryParam("saved"); who != "" {
		a.Saved = "Saved the account of " + who + "."
		if c.QueryParam("v") == "0" {
			a.Saved = "No change: " + who + " already had this account."
		}
	}
	return s.renderAccounts(c, http.StatusOK, a, 0, nil, "", "")
}

// renderAccounts shows the page; the row of user edited (0: none) keeps
// what was typed and shows errs.
func (s *Server) renderAccounts(c echo.Context, status int, a views.AdminAccounts, edited int64, errs map[string]string, value, note string) error {
	ctx := c.Request().Context()
	users, err := s.st.ListPosixMappings(ctx)
	if err != nil {
		return err
	}
	teams, err := s.st.ListTeams(ctx)
	if err != nil {
		return err
	}
	a.Page = s.page(c, "Accounts · Admin")
	a.Require = s.st.RequirePOSIXAccount
	if s.cfg.OIDC.Enabled() {
		a.Claim = s.cfg.OIDC.Claims.AccountClaim
	}
	for _, u := range users {
		r := views.AccountRow{ID: u.ID, Email: u.Email, Name: u.Name, Teams: strings.Join(u.Teams, ", "), Mapped: u.PosixUser, Claimed: u.OIDCPosixUser,
			Value: u.PosixUser, Errors: map[string]string{}}
		if u.ID == edited {
			r.Value, r.Note, r.Errors = value, note, errs
		}
		a.Users = append(a.Users, r)
	}
	for _, t := range teams {
		a.Teams = append(a.Teams, views.Option{Value: t.Slug, Label: t.PosixAccount})
	}
	return render(c, status, views.AdminAccountsView(a))
}

// adminAccountForm maps one person to a POSIX account from the page.
func (s *Server) adminAccountForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	value, note := c.FormValue("posix_user"), c.FormValue("note")
	m, r, err := s.st.SetPosixUser(c.Request().Context(), u.Email, c.Param("user"), value, note)
	if err == nil {
		v := "0"
		if r.Changed {
			v = strconv.FormatInt(r.Entry.ID, 10)
		}
		return redirect(c, fmt.Sprintf("/admin/accounts?saved=%s&v=%s#account-%d", url.QueryEscape(m.Email), v, m.ID))
	}
	errs, err := formErrors(err)
	if err != nil {
		return err
	}
	target, lerr := s.st.PosixMappingOf(c.Request().Context(), c.Param("user"))
	if lerr != nil {
		return lerr
	}
	return s.renderAccounts(c, http.StatusUnprocessableEntity, views.AdminAccounts{}, target.ID, errs, value, note)
}
