// Package client is a small Go client for Allot's JSON API, used by the CLI
// (`allot submit`, `allot jobs`, `allot cancel`).
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/allotlabs/allot/web"
)

// Client talks to one Allot server with one API token.
type Client struct {
	BaseURL string
	Token   string
	HTTP    *http.Client
	// Renew, when set, gives a new token when the server refuses Token
	// (401): allot login's stored sign-in (credentials.go). The request
	// is then sent once more with it.
	Renew func(ctx context.Context) (string, error)
}

// New returns a client for baseURL (e.g. http://localhost:8080).
func New(baseURL, token string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: &http.Client{Timeout: 30 * time.Second}}
}

// Error is a problem response from the server.
type Error struct {
	web.Problem
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Detail)
	if e.Detail == "" {
		b.WriteString(e.Title)
	}
	keys := make([]string, 0, len(e.Errors))
	for k := range e.Errors {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %s: %s", k, e.Errors[k])
	}
	return b.String()
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	err := c.send(ctx, method, path, body, out)
	var p *Error
	if c.Renew != nil && errors.As(err, &p) && p.Status == http.StatusUnauthorized {
		renew := c.Renew
		c.Renew = nil // once
		tok, rerr := renew(ctx)
		if rerr != nil {
			return rerr
		}
		c.Token = tok
		return c.send(ctx, method, path, body, out)
	}
	return err
}

func (c *Client) send(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return fmt.Errorf("bad server URL %q: %w", c.BaseURL, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the Allot server at %s: %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("reading response: %w", err)
	}
	if resp.StatusCode >= 400 {
		var p Error
		if json.Unmarshal(data, &p.Problem) != nil || p.Status == 0 {
			return fmt.Errorf("server answered %s", resp.Status)
		}
		return &p
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decoding response: %w", err)
		}
	}
	return nil
}

// Submit submits a job.
func (c *Client) Submit(ctx context.Context, r web.JobRequest) (web.JobJSON, error) {
	var j web.JobJSON
	return j, c.do(ctx, http.MethodPost, "/api/v1/jobs", r, &j)
}

// ListOptions filters Jobs.
type ListOptions struct {
	Team, State string
	Limit       int
}

// Jobs lists jobs, newest first.
func (c *Client) Jobs(ctx context.Context, o ListOptions) ([]web.JobJSON, error) {
	q := url.Values{}
	if o.Team != "" {
		q.Set("team", o.Team)
	}
	if o.State != "" {
		q.Set("state", o.State)
	}
	if o.Limit > 0 {
		q.Set("limit", fmt.Sprint(o.Limit))
	}
	var l web.JobList
	path := "/api/v1/jobs"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return l.Jobs, c.do(ctx, http.MethodGet, path, nil, &l)
}

// Job returns one job.
func (c *Client) Job(ctx context.Context, id int64) (web.JobJSON, error) {
	var j web.JobJSON
	return j, c.do(ctx, http.MethodGet, fmt.Sprintf("/api/v1/jobs/%d", id), nil, &j)
}

// Cancel cancels a job.
func (c *Client) Cancel(ctx context.Context, id int64) (web.JobJSON, error) {
	var j web.JobJSON
	return j, c.do(ctx, http.MethodPost, fmt.Sprintf("/api/v1/jobs/%d/cancel", id), nil, &j)
}
