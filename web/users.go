package web

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// People, for admins: /admin/users and /api/v1/users. An admin can
// disable a person (their API tokens are revoked, their sessions end,
// they cannot sign in) and enable them again; both are audited. The
// :user of a path is a user's ID or email address.

// UserJSON is a person as the admin API shows them.
type UserJSON struct {
	ID           int64      `json:"id"`
	Email        string     `json:"email"`
	Name         string     `json:"name"`
	Admin        bool       `json:"admin"`
	Finance      bool       `json:"finance"`
	Teams        []string   `json:"teams"`
	Disabled     bool       `json:"disabled"`
	DisabledAt   *time.Time `json:"disabled_at"`
	DisabledBy   string     `json:"disabled_by,omitempty"`
	ActiveTokens int        `json:"active_tokens"`
	CreatedAt    time.Time  `json:"created_at"`
}

// UserList is the body of GET /api/v1/users.
type UserList struct {
	Users []UserJSON `json:"users"`
}

// UserAccessRequest is the optional body of POST
// /api/v1/users/{user}/disable and …/enable.
type UserAccessRequest struct {
	Note string `json:"note"` // for the audit log
}

// UserAccessJSON is the answer to disabling or enabling a person.
type UserAccessJSON struct {
	User          UserJSON `json:"user"`
	Changed       bool     `json:"changed"` // false: they already were
	TokensRevoked int64    `json:"tokens_revoked"`
	SessionsEnded int64    `json:"sessions_ended"`
	AuditID       int64    `json:"audit_id,omitempty"`
}

func userJSON(a *store.UserAccount) UserJSON {
	teams := a.Teams
	if teams == nil {
		teams = []string{}
	}
	return UserJSON{ID: a.ID, Email: a.Email, Name: a.Name, Admin: a.Admin, Finance: a.Finance, Teams: teams, Disabled: a.Disabled(),
		DisabledAt: optTime(a.DisabledAt), DisabledBy: a.DisabledBy, ActiveTokens: a.ActiveTokens, CreatedAt: a.CreatedAt.UTC()}
}

func (s *Server) apiListUsers(c echo.Context) error {
	list, err := s.st.ListUserAccounts(c.Request().Context())
	if err != nil {
		return err
	}
	out := UserList{Users: []UserJSON{}}
	for i := range list {
		out.Users = append(out.Users, userJSON(&list[i]))
	}
	return writeJSON(c, http.StatusOK, out)
}

func (s *Server) apiDisableUser(c echo.Context) error { return s.apiUserAccess(c, true) }
func (s *Server) apiEnableUser(c echo.Context) error  { return s.apiUserAccess(c, false) }

func (s *Server) apiUserAccess(c echo.Context, disable bool) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	req, err := optionalBody[UserAccessRequest](c)
	if err != nil {
		return err
	}
	change := s.st.EnableUser
	if disable {
		change = s.st.DisableUser
	}
	res, err := change(c.Request().Context(), c.Param("user"), u, req.Note)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, UserAccessJSON{User: userJSON(&res.User), Changed: res.Changed, TokensRevoked: res.TokensRevoked,
		SessionsEnded: res.SessionsEnded, AuditID: res.AuditID})
}

// ---- Portal

func (s *Server) adminUsersPage(c echo.Context) error {
	a := views.AdminUsers{}
	switch c.QueryParam("done") {
	case "disabled":
		a.Saved = "Disabled " + c.QueryParam("user") + ": their API tokens are revoked and their sessions ended."
	case "enabled":
		a.Saved = "Enabled " + c.QueryParam("user") + ": they can sign in again."
	}
	return s.renderUsers(c, http.StatusOK, a)
}

func (s *Server) renderUsers(c echo.Context, status int, a views.AdminUsers) error {
	me, err := currentUser(c)
	if err != nil {
		return err
	}
	list, err := s.st.ListUserAccounts(c.Request().Context())
	if err != nil {
		return err
	}
	a.Page = s.page(c, "People")
	for i := range list {
		u := &list[i]
		var roles []string
		if u.Admin {
			roles = append(roles, "admin")
		}
		if u.Finance {
			roles = append(roles, "finance")
		}
		if len(u.Teams) > 0 {
			roles = append(roles, "teams "+strings.Join(u.Teams, ", "))
		}
		row := views.UserRow{ID: u.ID, Email: u.Email, Name: u.Name, Roles: strings.Join(roles, "; "), Tokens: u.ActiveTokens,
			Disabled: u.Disabled(), Status: "active", Self: u.ID == me.ID, Created: fmtTime(u.CreatedAt),
			DisableQ: views.DisableUserQuestion(u.ID, u.Email, u.ActiveTokens)}
		row.ActionURL = "/admin/users/" + url.PathEscape(u.Email) + "/disable"
		if u.Disabled() {
			row.Status = "disabled " + fmtTime(u.DisabledAt) + " by " + u.DisabledBy
			row.ActionURL = "/admin/users/" + url.PathEscape(u.Email) + "/enable"
		}
		a.Users = append(a.Users, row)
	}
	return render(c, status, views.AdminUsersView(a))
}

// adminUserAccessForm disables (after the confirm step) or enables the
// person in the path.
func (s *Server) adminUserAccessForm(disable bool) echo.HandlerFunc {
	return func(c echo.Context) error {
		u, err := currentUser(c)
		if err != nil {
			return err
		}
		ref := c.Param("user")
		if disable && !confirmed(c) {
			a, err := s.st.UserAccountByRef(c.Request().Context(), ref)
			if err != nil {
				return s.userFormError(c, err)
			}
			return s.confirmPage(c, views.DisableUserQuestion(a.ID, a.Email, a.ActiveTokens), "/admin/users/"+url.PathEscape(ref)+"/disable", nil, "/admin/users")
		}
		change, done := s.st.EnableUser, "enabled"
		if disable {
			change, done = s.st.DisableUser, "disabled"
		}
		res, err := change(c.Request().Context(), ref, u, c.FormValue("note"))
		if err != nil {
			return s.userFormError(c, err)
		}
		return redirect(c, fmt.Sprintf("/admin/users?done=%s&user=%s", done, url.QueryEscape(res.User.Email)))
	}
}

// userFormError shows the people page with a refusal (yourself, a bad
// reference); a missing person and other errors are errors.
func (s *Server) userFormError(c echo.Context, err error) error {
	errs, ferr := formErrors(err)
	if ferr != nil {
		return ferr
	}
	msg := errs["_form"]
	for k, v := range errs {
		if k != "_form" {
			msg = strings.TrimSpace(msg + " " + k + ": " + v)
		}
	}
	return s.renderUsers(c, http.StatusUnprocessableEntity, views.AdminUsers{Error: msg})
}
