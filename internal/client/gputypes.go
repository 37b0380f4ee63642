package client

import (
	"context"
	"net/url"

	"github.com/allotlabs/allot/web"
)

// GPUTypeChange is the answer to creating or editing a GPU type.
type GPUTypeChange struct {
	Changed       bool            `json:"changed"`
	PolicyVersion int64           `json:"policy_version"`
	AuditID       int64           `json:"audit_id"`
	Value         web.GPUTypeJSON `json:"value"`
}

// GPUTypes lists the GPU types, retired ones too.
func (c *Client) GPUTypes(ctx context.Context) ([]web.GPUTypeJSON, error) {
	var l web.GPUTypeList
	err := c.do(ctx, "GET", "/api/v1/gpu-types", nil, &l)
	return l.GPUTypes, err
}

// CreateGPUType adds a GPU type (admin).
func (c *Client) CreateGPUType(ctx context.Context, r web.GPUTypeRequest) (GPUTypeChange, error) {
	var out GPUTypeChange
	err := c.do(ctx, "POST", "/api/v1/gpu-types", r, &out)
	return out, err
}

// UpdateGPUType edits, retires or reinstates a GPU type (admin).
func (c *Client) UpdateGPUType(ctx context.Context, name string, r web.GPUTypeRequest) (GPUTypeChange, error) {
	var out GPUTypeChange
	err := c.do(ctx, "PUT", "/api/v1/gpu-types/"+url.PathEscape(name), r, &out)
	return out, err
}
