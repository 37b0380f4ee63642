package agentproto

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client calls the server's agent API with a node token. It is safe for
// concurrent use.
type Client struct {
	base  string
	token string
	// HTTP is the client used for every call. Its own Timeout should be
	// zero (the default): each call sets a deadline on its context instead,
	// so a long poll can outlive Timeout.
	HTTP *http.Client
	// Timeout bounds every call except Orders, whose deadline is its wait
	// plus OrdersSlack.
	Timeout     time.Duration
	OrdersSlack time.Duration
}

// NewClient returns a client for the server at baseURL (e.g.
// "https://allot.example.com") that authenticates with nodeToken.
func NewClient(baseURL, nodeToken string) *Client {
	return &Client{
		base:        strings.TrimRight(baseURL, "/"),
		token:       nodeToken,
		HTTP:        &http.Client{},
		Timeout:     30 * time.Second,
		OrdersSlack: 15 * time.Second,
	}
}

// HTTPError is a non-2xx answer whose body is not a problem document.
type HTTPError struct {
	Status int
	Body   string
}

func (e *HTTPError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("HTTP %d %s", e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, http.StatusText(e.Status), e.Body)
}

// ErrorStatus returns the HTTP status carried by err (a *Problem or
// *HTTPError anywhere in its chain), or 0 when the server gave no answer
// (connection refused, reset, timeout …).
func ErrorStatus(err error) int {
	var p *Problem
	if errors.As(err, &p) {
		return p.Status
	}
	var h *HTTPError
	if errors.As(err, &h) {
		return h.Status
	}
	return 0
}

// Register reports the node's inventory and returns the server's registration.
func (c *Client) Register(ctx context.Context, inv Inventory) (Registration, error) {
	var reg Registration
	err := c.do(ctx, c.Timeout, http.MethodPost, "/api/agent/v1/register", inv, &reg)
	return reg, err
}

// Heartbeat sends one heartbeat.
func (c *Client) Heartbeat(ctx context.Context, hb Heartbeat) (HeartbeatReply, error) {
	var rep HeartbeatReply
	err := c.do(ctx, c.Timeout, http.MethodPost, "/api/agent/v1/heartbeat", hb, &rep)
	return rep, err
}

// Orders long-polls for orders: the server answers as soon as there is
// something to do, or with empty orders after wait.
func (c *Client) Orders(ctx context.Context, wait time.Duration) (Orders, error) {
	var o Orders
	path := "/api/agent/v1/orders?wait=" + url.QueryEscape(wait.String())
	err := c.do(ctx, wait+c.OrdersSlack, http.MethodGet, path, nil, &o)
	return o, err
}

// TakeLease tells the server the agent is ready to run its part of a job.
func (c *Client) TakeLease(ctx context.Context, ref LeaseRef) error {
	return c.do(ctx, c.Timeout, http.MethodPost, "/api/agent/v1/leases/take", ref, nil)
}

// TakeLeases takes several leases in one request and returns each one's
// result with the start orders now due. A server without the batched
// request (older than this client) answers ErrNoBatch: take one by one.
func (c *Client) TakeLeases(ctx context.Context, refs []LeaseRef) (TakeBatchReply, error) {
	var rep TakeBatchReply
	err := c.do(ctx, c.Timeout, http.MethodPost, "/api/agent/v1/leases/take-batch", TakeBatch{Leases: refs}, &rep)
	if err == nil && len(rep.Results) != len(refs) {
		err = fmt.Errorf("POST /api/agent/v1/leases/take-batch: %d results for %d leases", len(rep.Results), len(refs))
	}
	return rep, noBatch(err)
}

// StartedBatch reports several starts in one request and returns each
// one's result. A server without the batched request answers ErrNoBatch.
func (c *Client) StartedBatch(ctx context.Context, started []JobStarted) ([]LeaseResult, error) {
	var rep BatchReply
	err := c.do(ctx, c.Timeout, http.MethodPost, "/api/agent/v1/jobs/started-batch", StartedBatch{Started: started}, &rep)
	if err == nil && len(rep.Results) != len(started) {
		err = fmt.Errorf("POST /api/agent/v1/jobs/started-batch: %d results for %d starts", len(rep.Results), len(started))
	}
	return rep.Results, noBatch(err)
}

// ErrNoBatch says the server does not know a batched request (it predates
// them): send the reports one by one.
var ErrNoBatch = errors.New("the server does not take batched reports")

func noBatch(err error) error {
	if st := ErrorStatus(err); st == http.StatusNotFound || st == http.StatusMethodNotAllowed {
		return fmt.Errorf("%w (%v)", ErrNoBatch, err)
	}
	return err
}

// Started reports that a job's process started.
func (c *Client) Started(ctx context.Context, s JobStarted) error {
	return c.do(ctx, c.Timeout, http.MethodPost, "/api/agent/v1/jobs/started", s, nil)
}

// Exited reports that a job's process ended.
func (c *Client) Exited(ctx context.Context, e JobExited) error {
	return c.do(ctx, c.Timeout, http.MethodPost, "/api/agent/v1/jobs/exited", e, nil)
}

// Log sends new lines of a job's output.
func (c *Client) Log(ctx context.Context, l JobLog) error {
	return c.do(ctx, c.Timeout, http.MethodPost, "/api/agent/v1/jobs/log", l, nil)
}

func (c *Client) do(ctx context.Context, timeout time.Duration, method, path string, in, out any) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: encoding request: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json, application/problem+json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s %s: %w", method, path, decodeError(resp))
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decoding answer: %w", method, path, err)
	}
	return nil
}

func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if ct := resp.Header.Get("Content-Type"); strings.Contains(ct, "json") {
		var p Problem
		if err := json.Unmarshal(b, &p); err == nil && (p.Title != "" || p.Detail != "" || p.Type != "") {
			if p.Status == 0 {
				p.Status = resp.StatusCode
			}
			return &p
		}
	}
	text := strings.TrimSpace(string(b))
	if len(text) > 200 {
		text = text[:200] + "…"
	}
	return &HTTPError{Status: resp.StatusCode, Body: text}
}
