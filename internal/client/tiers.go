package client

import (
	"context"
	"net/http"

	"github.com/allotlabs/allot/internal/store"
)

// Tiers lists the tiers in force (GET /api/v1/tiers).
func (c *Client) Tiers(ctx context.Context) ([]store.TierValues, error) {
	var out struct {
		Tiers []store.TierValues `json:"tiers"`
	}
	err := c.do(ctx, http.MethodGet, "/api/v1/tiers", nil, &out)
	return out.Tiers, err
}
