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

// TeamChange is the answer to creating or editing a team.
type TeamChange struct {
	Changed       bool             `json:"changed"`
	PolicyVersion int64            `json:"policy_version"`
	AuditID       int64            `json:"audit_id"`
	Value         store.TeamValues `json:"value"`
}

// Teams lists every team as admins edit it.
func (c *Client) Teams(ctx context.Context) ([]store.TeamValues, error) {
	var l struct {
		Teams []store.TeamValues `json:"teams"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/teams", nil, &l)
	return l.Teams, err
}

// CreateTeam adds a team (admin).
func (c *Client) CreateTeam(ctx context.Context, r web.TeamJSON) (TeamChange, error) {
	var out TeamChange
	err := c.do(ctx, http.MethodPost, "/api/v1/teams", r, &out)
	return out, err
}

// UpdateTeam edits a team's fields that r sets (admin).
func (c *Client) UpdateTeam(ctx context.Context, team string, r web.TeamJSON) (TeamChange, error) {
	var out TeamChange
	err := c.do(ctx, http.MethodPut, "/api/v1/teams/"+url.PathEscape(team), r, &out)
	return out, err
}
