package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/google/go-cmp/cmp"
)

func TestSignInOIDCRecords(t *testing.T) {
	b := setup(t)
	const iss = "https://idp.example.com"
	users := b.count(t, "users")
	// A person the demo created, found by email: subject adopted, roles
	// and memberships replaced; unknown teams skipped and reported.
	nadia := &allot.User{OIDCSubject: "idp|42", Email: "Nadia@Example.com", Name: "Nadia P.", Finance: true,
		Memberships: []allot.Membership{{Team: "recs", Role: allot.TeamRoleMember}, {Team: "ghost", Role: allot.TeamRoleLead}}}
	unknown, err := b.st.SignInOIDC(b.ctx, nadia, iss, true, true)
	if err != nil || !cmp.Equal(unknown, []string{"ghost"}) {
		t.Fatalf("upsert: %v %v", unknown, err)
	}
	got := b.user(t, "Nadia@Example.com")
	if got.ID != nadia.ID || got.OIDCSubject != "idp|42" || got.Name != "Nadia P." || !got.Finance || got.Admin ||
		!cmp.Equal(got.Memberships, []allot.Membership{{Team: "recs", Role: allot.TeamRoleMember}}) {
		t.Errorf("after upsert: %+v", got)
	}
	// Next time found by subject, even with a new email.
	again := &allot.User{OIDCSubject: "idp|42", Email: "nadia.petrova@example.com", Name: "Nadia Petrova"}
	if _, err := b.st.SignInOIDC(b.ctx, again, iss, true, true); err != nil || again.ID != nadia.ID {
		t.Fatalf("second upsert: id %d, %v", again.ID, err)
	}
	if got := b.user(t, "nadia.petrova@example.com"); got.Finance || len(got.Memberships) != 0 {
		t.Errorf("roles the IdP no longer gives stayed: %+v", got)
	}
	// Someone new is created.
	newcomer := &allot.User{OIDCSubject: "idp|7", Email: "zoe@example.com", Name: "Zoe", Memberships: []allot.Membership{{Team: "nlp", Role: allot.TeamRoleLead}}}
	if _, err := b.st.SignInOIDC(b.ctx, newcomer, iss, false, true); err != nil || newcomer.ID == 0 {
		t.Fatal(err)
	}
	if n := b.count(t, "users"); n != users+1 {
		t.Errorf("users %d → %d, want one more", users, n)
	}
	// Bad claims are refused and change nothing.
	if _, err := b.st.SignInOIDC(b.ctx, &allot.User{OIDCSubject: "idp|8", Email: "not-an-email", Name: "X"}, iss, true, true); allot.ErrorCode(err) != allot.EInvalid {
		t.Errorf("bad email: %v", err)
	}
	if n := b.count(t, "users"); n != users+1 {
		t.Errorf("a refused upsert changed users: %d", n)
	}
}

// TestSignInOIDCPlaceholder: a sign-in is linked by email (from an
// allow-listed issuer) only to a user who never signed in through SSO (a
// placeholder subject) and only with a verified email; another provider account claiming the email of a linked
// user, or an unverified email, is refused and changes nothing.
func TestSignInOIDCPlaceholder(t *testing.T) {
	b := setup(t)
	const iss = "https://idp.example.com"
	var link *store.LinkRequiredError
	users := b.count(t, "users")
	if s := b.user(t, "noah@example.com").OIDCSubject; !store.NeverSignedIn(s) {
		t.Fatalf("the demo's noah has subject %q, want a placeholder", s)
	}
	// First SSO sign-in links the pre-created user.
	nadia := &allot.User{OIDCSubject: "idp|42", Email: "nadia@example.com", Name: "Nadia"}
	if _, err := b.st.SignInOIDC(b.ctx, nadia, iss, true, true); err != nil {
		t.Fatal(err)
	}
	// A second provider account with the same email is refused.
	other := &allot.User{OIDCSubject: "idp|666", Email: "NADIA@example.com", Name: "Mallory", Admin: true}
	if _, err := b.st.SignInOIDC(b.ctx, other, iss, true, true); !errors.As(err, &link) {
		t.Errorf("second account with nadia's email: %v, want a link required", err)
	}
	if got := b.user(t, "nadia@example.com"); got.OIDCSubject != "idp|42" || got.Name != "Nadia" || got.Admin {
		t.Errorf("nadia after a refused takeover: %+v", got)
	}
	// A placeholder user is not linked on an unverified (false or missing)
	// email.
	noah := &allot.User{OIDCSubject: "idp|5", Email: "noah@example.com", Name: "Noah", Admin: true}
	if _, err := b.st.SignInOIDC(b.ctx, noah, iss, false, true); !errors.As(err, &link) || !strings.Contains(link.Reason, "verified") {
		t.Errorf("unverified email: %v, want a link required", err)
	}
	if got := b.user(t, "noah@example.com"); !store.NeverSignedIn(got.OIDCSubject) || got.Admin {
		t.Errorf("noah after an unverified sign-in: %+v", got)
	}
	// A provider cannot send a placeholder subject.
	if _, err := b.st.SignInOIDC(b.ctx, &allot.User{OIDCSubject: store.PlaceholderSubjectPrefix + "noah@example.com", Email: "noah@example.com", Name: "N"}, iss, true, true); allot.ErrorCode(err) != allot.EInvalid {
		t.Errorf("placeholder subject from the provider: %v", err)
	}
	// Verified: linked.
	if _, err := b.st.SignInOIDC(b.ctx, noah, iss, true, true); err != nil || b.user(t, "noah@example.com").OIDCSubject != "idp|5" {
		t.Errorf("verified link: %v", err)
	}
	if n := b.count(t, "users"); n != users {
		t.Errorf("users %d → %d", users, n)
	}
}

func TestOIDCLoginState(t *testing.T) {
	b := setup(t)
	l := store.OIDCLogin{Nonce: "n", Verifier: "v", Next: "/jobs"}
	if err := b.st.SaveOIDCLogin(b.ctx, "state-1", l, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got, err := b.st.TakeOIDCLogin(b.ctx, "state-1"); err != nil || got != l {
		t.Fatalf("take: %+v %v", got, err)
	}
	if _, err := b.st.TakeOIDCLogin(b.ctx, "state-1"); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("second take: %v, want unauthorized", err)
	}
	if err := b.st.SaveOIDCLogin(b.ctx, "state-2", l, time.Minute); err != nil {
		t.Fatal(err)
	}
	later := *b.st
	later.Now = func() time.Time { return b.now.Add(2 * time.Minute) }
	if _, err := later.TakeOIDCLogin(b.ctx, "state-2"); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("expired take: %v, want unauthorized", err)
	}
	if n := b.count(t, "oidc_logins"); n != 0 {
		t.Errorf("%d sign-ins left", n)
	}
}

func TestAPITokenExpiryAndRevoke(t *testing.T) {
	b := setup(t)
	noah, ada := b.user(t, "noah@example.com"), b.user(t, "ada@example.com")
	before := b.count(t, "api_tokens")
	for _, tc := range []struct {
		name    string
		expires time.Time
		field   string
	}{
		{"", time.Time{}, "name"},
		{"bad\x00name", time.Time{}, "name"},
		{"old", b.now.Add(-time.Second), "expires_at"},
		{"now", b.now, "expires_at"},
	} {
		_, _, err := b.st.CreateAPITokenExpiring(b.ctx, noah.ID, tc.name, tc.expires)
		if allot.Fields(err)[tc.field] == "" {
			t.Errorf("%q %v: %v, want a field error on %s", tc.name, tc.expires, err, tc.field)
		}
	}
	if n := b.count(t, "api_tokens"); n != before {
		t.Fatalf("bad tokens stored: %d → %d", before, n)
	}
	secret, tok, err := b.st.CreateAPITokenExpiring(b.ctx, noah.ID, " ci ", b.now.Add(time.Hour))
	if err != nil || tok.Name != "ci" {
		t.Fatalf("create: %+v %v", tok, err)
	}
	if _, err := b.st.UserByAPIToken(b.ctx, secret); err != nil {
		t.Fatal(err)
	}
	later := *b.st
	later.Now = func() time.Time { return b.now.Add(time.Hour) }
	if _, err := later.UserByAPIToken(b.ctx, secret); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("expired: %v", err)
	}
	// Another engineer's token is invisible to noah; an admin's revoke is audited.
	_, adaTok, err := b.st.CreateAPIToken(b.ctx, ada.ID, "ada's")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.RevokeAPIToken(b.ctx, adaTok.ID, noah); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("noah revoking ada's token: %v", err)
	}
	audits := b.count(t, "audit_log")
	if rt, err := b.st.RevokeAPIToken(b.ctx, tok.ID, ada); err != nil || rt.RevokedAt.IsZero() {
		t.Fatalf("admin revoke: %+v %v", rt, err)
	}
	if n := b.count(t, "audit_log"); n != audits+1 {
		t.Errorf("audit entries %d → %d", audits, n)
	}
	list, err := b.st.ListAPITokens(b.ctx, noah.ID)
	if err != nil || len(list) != 1 || list[0].Active(b.now) {
		t.Errorf("noah's tokens: %+v %v", list, err)
	}
}
