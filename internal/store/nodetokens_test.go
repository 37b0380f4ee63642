package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

func (b bundle) audits(t *testing.T, action string) []allot.AuditEntry {
	t.Helper()
	l, err := b.st.AuditLog(b.ctx, store.AuditFilter{Action: action})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestNodeTokens: issue (audited; an unknown node is a field error and
// changes nothing), use recorded at most once a minute, list without
// secrets, rotate (old refused at once, new works), revoke by prefix, ID
// and node, each audited, unknown ones clear errors.
func TestNodeTokens(t *testing.T) {
	b := setup(t)
	now := b.now
	b.st.Now = func() time.Time { return now }
	before := b.count(t, "node_tokens")
	if _, err := b.st.IssueNodeToken(b.ctx, "no-such-node", "ada@example.com", false); allot.Fields(err)["node"] == "" {
		t.Errorf("unknown node: %v, want a field error on node", err)
	}
	if _, err := b.st.IssueNodeToken(b.ctx, "no-such-node", "ada@example.com", true); allot.Fields(err)["node"] == "" {
		t.Errorf("rotate unknown node: %v", err)
	}
	if n := b.count(t, "node_tokens"); n != before || len(b.audits(t, "node_token.")) != 0 {
		t.Fatalf("refused issues changed something: %d → %d tokens", before, n)
	}

	first, err := b.st.IssueNodeToken(b.ctx, "gpu01", "ada@example.com", false)
	if err != nil || !strings.HasPrefix(first.Secret, store.NodeTokenPrefix) || !strings.HasPrefix(first.Secret, first.Token.Prefix) || first.Token.CreatedBy != "ada@example.com" {
		t.Fatalf("issue: %+v %v", first, err)
	}
	if a := b.audits(t, "node_token.create"); len(a) != 1 || a[0].Object != "node:gpu01" || a[0].Actor != "ada@example.com" || !strings.Contains(a[0].Note, first.Token.Prefix) ||
		strings.Contains(a[0].Note, first.Secret) {
		t.Errorf("create audit: %+v", a)
	}
	lastUsed := func(id int64) time.Time {
		var at *time.Time
		if err := b.pool.QueryRow(b.ctx, `SELECT last_used_at FROM node_tokens WHERE id = $1`, id).Scan(&at); err != nil {
			t.Fatal(err)
		}
		if at == nil {
			return time.Time{}
		}
		return at.UTC()
	}
	if node, err := b.st.NodeByToken(b.ctx, first.Secret); err != nil || node != "gpu01" {
		t.Fatalf("NodeByToken: %q %v", node, err)
	}
	if at := lastUsed(first.Token.ID); !at.Equal(now) {
		t.Errorf("last used %v, want %v", at, now)
	}
	now = now.Add(30 * time.Second)
	if _, err := b.st.NodeByToken(b.ctx, first.Secret); err != nil {
		t.Fatal(err)
	}
	if at := lastUsed(first.Token.ID); !at.Equal(b.now) {
		t.Errorf("used again within the minute: last used %v, want it kept at %v", at, b.now)
	}
	now = now.Add(time.Minute)
	if _, err := b.st.NodeByToken(b.ctx, first.Secret); err != nil {
		t.Fatal(err)
	}
	if at := lastUsed(first.Token.ID); !at.Equal(now) {
		t.Errorf("used after a minute: last used %v, want %v", at, now)
	}

	list, err := b.st.ListNodeTokens(b.ctx, "gpu01")
	if err != nil || len(list) != 1 || list[0].ID != first.Token.ID || list[0].LastUsedAt.IsZero() || !list[0].Active() {
		t.Errorf("list gpu01: %+v %v", list, err)
	}
	if _, err := b.st.ListNodeTokens(b.ctx, "no-such-node"); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("list unknown node: %v", err)
	}

	// Rotate: the new one works, the old one is refused at once.
	rot, err := b.st.IssueNodeToken(b.ctx, "gpu01", "ada@example.com", true)
	if err != nil || len(rot.Revoked) != 1 || rot.Revoked[0].ID != first.Token.ID || rot.Revoked[0].RevokedBy != "ada@example.com" {
		t.Fatalf("rotate: %+v %v", rot, err)
	}
	if _, err := b.st.NodeByToken(b.ctx, first.Secret); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("rotated-out token: %v, want EUnauthorized", err)
	}
	if node, err := b.st.NodeByToken(b.ctx, rot.Secret); err != nil || node != "gpu01" {
		t.Errorf("rotated-in token: %q %v", node, err)
	}
	if a := b.audits(t, "node_token.rotate"); len(a) != 1 || !strings.Contains(a[0].Note, first.Token.Prefix) {
		t.Errorf("rotate audit: %+v", a)
	}

	// Revoke by prefix (as the list shows it), by ID, by node.
	if _, _, err := b.st.RevokeNodeTokenPrefix(b.ctx, "allot_", "ada@example.com"); allot.Fields(err)["prefix"] == "" {
		t.Errorf("bad prefix: %v", err)
	}
	if _, _, err := b.st.RevokeNodeTokenPrefix(b.ctx, store.NodeTokenPrefix+"zzzzzz", "ada@example.com"); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("unknown prefix: %v", err)
	}
	tok, changed, err := b.st.RevokeNodeTokenPrefix(b.ctx, rot.Token.Prefix+"…", "ada@example.com")
	if err != nil || !changed || tok.ID != rot.Token.ID || tok.Active() {
		t.Fatalf("revoke by prefix: %+v %v %v", tok, changed, err)
	}
	if _, err := b.st.NodeByToken(b.ctx, rot.Secret); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("revoked token: %v", err)
	}
	if _, changed, err := b.st.RevokeNodeToken(b.ctx, rot.Token.ID, "ada@example.com"); err != nil || changed {
		t.Errorf("revoking again: %v %v, want no change", changed, err)
	}
	audits := len(b.audits(t, "node_token.revoke"))
	if _, _, err := b.st.RevokeNodeToken(b.ctx, 999999, "ada@example.com"); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("unknown id: %v", err)
	}
	if _, err := b.st.RevokeNodeTokensOf(b.ctx, "no-such-node", "ada@example.com"); allot.Fields(err)["node"] == "" {
		t.Errorf("revoke unknown node: %v", err)
	}
	if n := len(b.audits(t, "node_token.revoke")); n != audits || audits != 1 {
		t.Errorf("revoke audits %d → %d, want 1 and no more", audits, n)
	}
	two, err := b.st.IssueNodeToken(b.ctx, "gpu02", "ada@example.com", false)
	if err != nil {
		t.Fatal(err)
	}
	three, err := b.st.IssueNodeToken(b.ctx, "gpu02", "ada@example.com", false)
	if err != nil {
		t.Fatal(err)
	}
	// A whole secret names exactly its token.
	if tok, changed, err := b.st.RevokeNodeTokenPrefix(b.ctx, three.Secret, "ada@example.com"); err != nil || !changed || tok.ID != three.Token.ID {
		t.Errorf("revoke by whole secret: %+v %v %v", tok, changed, err)
	}
	gone, err := b.st.RevokeNodeTokensOf(b.ctx, "gpu02", "ada@example.com")
	if err != nil || len(gone) != 1 || gone[0].ID != two.Token.ID {
		t.Errorf("revoke gpu02's tokens: %+v %v", gone, err)
	}
	if _, err := b.st.NodeByToken(b.ctx, two.Secret); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("gpu02's token after revoking the node's: %v", err)
	}
	all, err := b.st.ListNodeTokens(b.ctx, "")
	if err != nil || len(all) < 4 {
		t.Errorf("list all: %d %v", len(all), err)
	}
}

// TestAPITokenTree: a token made with a token is revoked with it, down
// the generations; other tokens are not; a parent that is someone
// else's or no longer works makes nothing.
func TestAPITokenTree(t *testing.T) {
	b := setup(t)
	noah, nadia := b.user(t, "noah@example.com"), b.user(t, "nadia@example.com")
	ps, parent, err := b.st.CreateAPIToken(b.ctx, noah.ID, "parent")
	if err != nil {
		t.Fatal(err)
	}
	cs, child, err := b.st.CreateAPITokenWith(b.ctx, noah.ID, store.NewAPIToken{Name: "child", ParentID: parent.ID})
	if err != nil || child.ParentID != parent.ID {
		t.Fatalf("child: %+v %v", child, err)
	}
	gs, _, err := b.st.CreateAPITokenWith(b.ctx, noah.ID, store.NewAPIToken{Name: "grandchild", ParentID: child.ID})
	if err != nil {
		t.Fatal(err)
	}
	ss, _, err := b.st.CreateAPIToken(b.ctx, noah.ID, "sibling")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.st.CreateAPITokenWith(b.ctx, nadia.ID, store.NewAPIToken{Name: "stolen", ParentID: parent.ID}); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("someone else's parent: %v", err)
	}
	list, err := b.st.ListAPITokens(b.ctx, noah.ID)
	if err != nil || len(list) != 4 {
		t.Fatalf("list: %d %v", len(list), err)
	}
	if _, err := b.st.RevokeAPIToken(b.ctx, parent.ID, noah); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]string{"parent": ps, "child": cs, "grandchild": gs} {
		if _, err := b.st.UserByAPIToken(b.ctx, s); allot.ErrorCode(err) != allot.EUnauthorized {
			t.Errorf("%s after revoking the parent: %v, want EUnauthorized", name, err)
		}
	}
	if _, err := b.st.UserByAPIToken(b.ctx, ss); err != nil {
		t.Errorf("sibling: %v", err)
	}
	before := b.count(t, "api_tokens")
	if _, _, err := b.st.CreateAPITokenWith(b.ctx, noah.ID, store.NewAPIToken{Name: "late", ParentID: child.ID}); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("child of a revoked token: %v", err)
	}
	if n := b.count(t, "api_tokens"); n != before {
		t.Errorf("a refused child was stored: %d → %d", before, n)
	}
	// Revoking by name (allot dev replacing its tokens) takes the children too.
	_, named, err := b.st.CreateAPIToken(b.ctx, noah.ID, "named")
	if err != nil {
		t.Fatal(err)
	}
	ns, _, err := b.st.CreateAPITokenWith(b.ctx, noah.ID, store.NewAPIToken{Name: "made by named", ParentID: named.ID})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.st.RevokeAPITokensNamed(b.ctx, noah.ID, "named"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.UserByAPIToken(b.ctx, ns); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("child of a token revoked by name: %v", err)
	}
}
