package main

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/apf"
	"github.com/allotlabs/allot/internal/demo"
)

// TestRefusedAgentRequestsKeepTheirNodeUp16: a heartbeat (or another agent
// request) that an overloaded server refuses before authentication, with a
// node token that authenticated here before, is a sign of its node's life:
// the node is
// not marked down (its jobs not failed) while its agent keeps knocking.
// A token never seen, or revoked, keeps nothing alive, and once the knocks
// stop too the node is marked down, saying why.
func TestRefusedAgentRequestsKeepTheirNodeUp16(t *testing.T) {
	e := bootMain(t, &Main{Config: Config{DevMode: true, HTTP: HTTPLimits{BodyTimeout: 5 * time.Minute}, Admission: apf.Config{
		Heartbeat: apf.Limits{MaxInFlight: 1, QueueLength: 0, QueueWait: time.Minute},
		Agent:     apf.Limits{MaxInFlight: 1, QueueLength: 0, QueueWait: time.Minute}}}})
	e.withTokens()
	ctx := context.Background()
	knocking := fakeAgent(t, e, "ctc01")  // keeps knocking, refused
	fakeAgent(t, e, "ctc02")              // silent
	revoked := fakeAgent(t, e, "ctc03")   // knocks with a token revoked through this server
	elsewhere := fakeAgent(t, e, "ctc06") // knocks with a token revoked elsewhere (the CLI, another server)
	holder := fakeAgent(t, e, "ctc04")    // its requests hold the levels' one slot each
	fakeAgent(t, e, "ctc05")              // a lease report of its, refused
	reportTok, err := e.m.Store.CreateNodeToken(ctx, "ctc05", "its refused log batch")
	if err != nil {
		t.Fatal(err)
	}
	e.tokens["ctc05"] = reportTok
	reporter := agentproto.NewClient(e.url, reportTok)
	for _, c := range []*agentproto.Client{knocking, revoked, holder, reporter, elsewhere} {
		if _, err := c.Heartbeat(ctx, beatOf("ctc")); err != nil { // authenticated here: the token is known
			t.Fatal(err)
		}
	}
	holdTok, err := e.m.Store.CreateNodeToken(ctx, "ctc04", "holds the heartbeat and agent slots")
	if err != nil {
		t.Fatal(err)
	}
	e.tokens["hold"] = holdTok
	if code, _, b := e.api("POST", "/api/v1/nodes/ctc03/revoke-tokens", demo.Admin, ""); code != http.StatusOK {
		t.Fatalf("revoking ctc03's tokens: %d %s", code, b)
	}
	if _, err := e.m.Store.RevokeNodeTokensOf(ctx, "ctc06", "ops@example.com"); err != nil { // as allot node-token revoke does
		t.Fatal(err)
	}

	// Every node was last heard ten minutes ago.
	now := e.m.Store.Now()
	if _, err := e.m.Pool.Exec(ctx, `UPDATE nodes SET last_heartbeat = $1 WHERE name LIKE 'ctc%'`, now.Add(-10*time.Minute)); err != nil {
		t.Fatal(err)
	}

	held, pw := apfSend(e, "POST", "/api/agent/v1/heartbeat", "hold", nil)
	waitLevel(t, e, apf.Heartbeat, 1, 0)
	stranger := agentproto.NewClient(e.url, "alnode_"+strings.Repeat("x", 40))
	for name, c := range map[string]*agentproto.Client{"ctc01": knocking, "ctc03 (revoked)": revoked, "ctc06 (revoked elsewhere)": elsewhere, "a token never seen": stranger} {
		if _, err := c.Heartbeat(ctx, beatOf("ctc")); agentproto.ErrorStatus(err) != http.StatusTooManyRequests {
			t.Fatalf("%s: heartbeat with the level full: %v, want 429", name, err)
		}
	}
	// The other agent requests' level: ctc05's log batch is refused.
	heldLog, logPipe := apfSend(e, "POST", "/api/agent/v1/jobs/log", "hold", nil)
	waitLevel(t, e, apf.Agent, 1, 0)
	refused, _ := apfSend(e, "POST", "/api/agent/v1/jobs/log", "ctc05", []byte(`{}`))
	if a := <-refused; a.code != http.StatusTooManyRequests {
		t.Fatalf("ctc05's log batch with the agent level full: %d %s, want 429", a.code, a.body)
	}
	// Counted here: ctc01's and ctc06's heartbeats, ctc05's log batch
	// (this server cannot know ctc06's token was revoked elsewhere: the
	// write below checks).
	if n := admission(t, e, "allot_refused_agent_requests_counted_total"); n != 3 {
		t.Errorf("refused agent requests counted: %v, want 3", n)
	}
	if err := e.m.Server.RecordContacts(ctx); err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(beatOf("ctc04"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pw.Write(body); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if a := <-held; a.code != http.StatusOK {
		t.Fatalf("the held heartbeat: %d %s", a.code, a.body)
	}
	logPipe.Close() // an empty batch: refused by the handler, not by admission
	if a := <-heldLog; a.code == http.StatusTooManyRequests || a.code == 0 {
		t.Fatalf("the held log batch: %d %s", a.code, a.body)
	}

	contact := func(node string) *time.Time {
		var at *time.Time
		if err := e.m.Pool.QueryRow(ctx, `SELECT last_contact FROM nodes WHERE name = $1`, node).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	at := contact("ctc01")
	if at == nil || at.Before(now) {
		t.Fatalf("ctc01's last contact = %v, want at or after %v", at, now)
	}
	if c := contact("ctc05"); c == nil || c.Before(*at) {
		t.Fatalf("ctc05's last contact = %v, want at or after ctc01's %v", c, at)
	}
	for _, n := range []string{"ctc02", "ctc03", "ctc06"} {
		if c := contact(n); c != nil {
			t.Errorf("%s's last contact = %v, want none", n, c)
		}
	}

	// Silent for the lost window: ctc02, ctc03 and ctc06 are marked down,
	// ctc01 and ctc05 (knocking a moment ago) are not.
	lost, err := e.m.Store.MarkLostNodes(ctx, at.Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if lost = ctcNodes(lost); strings.Join(lost, ",") != "ctc02,ctc03,ctc06" {
		t.Errorf("marked down %v, want ctc02, ctc03 and ctc06", lost)
	}
	// The knocks stop too: ctc01 is marked down, and its reason says that
	// its last heartbeat was refused.
	// (ctc04's held heartbeat came a moment after the knock: it may go too.)
	if lost, err = e.m.Store.MarkLostNodes(ctx, at.Add(time.Second)); err != nil || !slices.Contains(lost, "ctc01") {
		t.Fatalf("marked down %v (%v), want ctc01 among them", lost, err)
	}
	var reason string
	if err := e.m.Pool.QueryRow(ctx, `SELECT state_reason FROM nodes WHERE name = 'ctc01'`).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(reason, "no heartbeat since ") || !strings.Contains(reason, "last request refused by an overloaded server at ") {
		t.Errorf("ctc01's state reason = %q", reason)
	}
}

// ctcNodes is this test's nodes among names, sorted (the demo's own nodes
// may be marked down beside them).
func ctcNodes(names []string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "ctc") {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
