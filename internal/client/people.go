package client

import (
	"context"
	"net/url"

	"github.com/allotlabs/allot/web"
)

// Users lists the people and whether they are disabled (admins).
func (c *Client) Users(ctx context.Context) ([]web.UserJSON, error) {
	var l web.UserList
	err := c.do(ctx, "GET", "/api/v1/users", nil, &l)
	return l.Users, err
}

// DisableUser disables a person (user: their ID or email address): their
// API tokens are revoked, their sessions end, they cannot sign in.
func (c *Client) DisableUser(ctx context.Context, user, note string) (web.UserAccessJSON, error) {
	var out web.UserAccessJSON
	err := c.do(ctx, "POST", "/api/v1/users/"+url.PathEscape(user)+"/disable", web.UserAccessRequest{Note: note}, &out)
	return out, err
}

// EnableUser lets a disabled person sign in again.
func (c *Client) EnableUser(ctx context.Context, user, note string) (web.UserAccessJSON, error) {
	var out web.UserAccessJSON
	err := c.do(ctx, "POST", "/api/v1/users/"+url.PathEscape(user)+"/enable", web.UserAccessRequest{Note: note}, &out)
	return out, err
}
