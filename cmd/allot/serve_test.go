package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// TestServeRoles: `allot server --serve agents` and `--serve users` on one
// database split the work: the agent server answers node agents (and
// health and metrics) and sends users elsewhere with a 404 that says so;
// the users server answers the portal and API and sends agents elsewhere.
// Only the server that hears agents announces itself, so agents' silence
// counts against no users-only server. A bad role exits 2.
func TestServeRoles(t *testing.T) {
	e := bootMain(t, &Main{Config: Config{Worker: true, Serve: web.ServeUsers}}).withTokens()
	agents := &Main{Config: Config{DatabaseURL: e.m.DatabaseURL, Addr: "127.0.0.1:0", Serve: web.ServeAgents}}
	ctx := context.Background()
	if err := agents.Run(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agents.Close() }) //nolint:errcheck
	nodeTok, err := e.m.Store.CreateNodeToken(ctx, "gpu01", "serve roles test")
	if err != nil {
		t.Fatal(err)
	}
	call := func(base, method, path, token, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	register := `{"hostname":"gpu01","protocol":1,"gpu_backend":"fake","gpus":[{"index":0,"uuid":"GPU-r0","model":"NVIDIA A100-SXM4-80GB","memory_mib":81920}]}`
	admin := e.tokens[demo.Admin]
	for _, c := range []struct {
		name, base, method, path, token, body string
		status                                int
		says                                  string
	}{
		{"agent registers with the agent server", agents.URL(), "POST", "/api/agent/v1/register", nodeTok, register, 200, `"gpu01"`},
		{"agent heartbeats with the agent server", agents.URL(), "POST", "/api/agent/v1/heartbeat", nodeTok, `{"time":"2026-01-01T00:00:00Z","gpus":[{"index":0,"util_pct":10}],"jobs":[]}`, 200, `node_state`},
		{"agent server: health", agents.URL(), "GET", "/healthz", "", "", 200, ""},
		{"agent server: metrics", agents.URL(), "GET", "/metrics", admin, "", 200, "allot_http_requests_total"},
		{"agent server sends the API elsewhere", agents.URL(), "GET", "/api/v1/me", admin, "", 404, "answers only node agents"},
		{"agent server sends the portal elsewhere", agents.URL(), "GET", "/login", "", "", 404, "answers only node agents"},
		{"users server: the API", e.url, "GET", "/api/v1/me", admin, "", 200, demo.PersonaEmail[demo.Admin]},
		{"users server sends agents elsewhere", e.url, "POST", "/api/agent/v1/heartbeat", nodeTok, `{}`, 404, "does not answer node agents"},
		{"users server: health", e.url, "GET", "/readyz", "", "", 200, ""},
	} {
		status, body := call(c.base, c.method, c.path, c.token, c.body)
		if status != c.status || !strings.Contains(body, c.says) {
			t.Errorf("%s: %d %.300s; want %d saying %q", c.name, status, body, c.status, c.says)
		}
	}
	var announced []string
	rows, err := e.m.Pool.Query(ctx, `SELECT id FROM api_servers`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		rows.Scan(&id) //nolint:errcheck
		announced = append(announced, id)
	}
	if len(announced) != 1 || announced[0] != agents.serverID {
		t.Errorf("api_servers %v, want only the agent server %q", announced, agents.serverID)
	}
	var stderr bytes.Buffer
	if code := run([]string{"server", "--database-url", "postgres://nobody@127.0.0.1:1/none", "--serve", "both"}, io.Discard, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), `--serve must be all, agents or users, not "both"`) {
		t.Errorf("--serve both: exit %d, %q", code, stderr.String())
	}
}
