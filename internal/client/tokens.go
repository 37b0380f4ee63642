package client

import (
	"context"
	"fmt"

	"github.com/allotlabs/allot/web"
)

// Tokens lists the caller's personal API tokens.
func (c *Client) Tokens(ctx context.Context) ([]web.TokenJSON, error) {
	var l web.TokenList
	err := c.do(ctx, "GET", "/api/v1/tokens", nil, &l)
	return l.Tokens, err
}

// CreateToken makes a personal API token; its Token field is the secret,
// returned this once.
func (c *Client) CreateToken(ctx context.Context, r web.TokenRequest) (web.TokenJSON, error) {
	var t web.TokenJSON
	err := c.do(ctx, "POST", "/api/v1/tokens", r, &t)
	return t, err
}

// RevokeToken revokes a token (the caller's own; an admin's: anyone's).
func (c *Client) RevokeToken(ctx context.Context, id int64) error {
	return c.do(ctx, "DELETE", fmt.Sprintf("/api/v1/tokens/%d", id), nil, nil)
}
