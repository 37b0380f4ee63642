package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

// Accounts lists every user with their POSIX accounts (admins).
func (c *Client) Accounts(ctx context.Context) ([]store.PosixMapping, error) {
	var l web.AccountsJSON
	err := c.do(ctx, http.MethodGet, "/api/v1/accounts", nil, &l)
	return l.Users, err
}

// AccountChange is the answer to SetAccount and SetTeamAccount.
type AccountChange struct {
	Changed bool  `json:"changed"`
	AuditID int64 `json:"audit_id"`
}

// SetAccount maps the user named by user (an email address or id) to a
// POSIX account ("" removes the mapping), as an admin.
func (c *Client) SetAccount(ctx context.Context, user, account, note string) (AccountChange, store.PosixMapping, error) {
	var out struct {
		AccountChange
		Value store.PosixMapping `json:"value"`
	}
	err := c.do(ctx, http.MethodPut, "/api/v1/users/"+url.PathEscape(user)+"/account", web.AccountPutJSON{PosixUser: &account, Note: note}, &out)
	return out.AccountChange, out.Value, err
}

// SetTeamAccount sets team's service account ("" = none), as an admin.
func (c *Client) SetTeamAccount(ctx context.Context, team, account, note string) (AccountChange, error) {
	var out AccountChange
	err := c.do(ctx, http.MethodPut, "/api/v1/teams/"+url.PathEscape(team), web.TeamJSON{PosixAccount: &account, Note: note}, &out)
	return out, err
}
