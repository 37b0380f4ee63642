package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/google/go-cmp/cmp"
)

// TestIdPRuleMatching: each match kind against the shapes providers send.
func TestIdPRuleMatching(t *testing.T) {
	rule := func(claim, match, pattern, grant, team string) *store.Rule {
		t.Helper()
		r, err := store.IdPMapping{Claim: claim, Match: match, Pattern: pattern, Grant: grant, Team: team}.Compile()
		if err != nil {
			t.Fatalf("%s %s %q: %v", claim, match, pattern, err)
		}
		return r
	}
	for _, c := range []struct {
		r     *store.Rule
		value string
		ok    bool
		team  string
	}{
		{rule("groups", "exact", "allot-admins", "admin", ""), "allot-admins", true, ""},
		{rule("groups", "exact", "allot-admins", "admin", ""), "Allot-Admins", false, ""},
		{rule("groups", "path", "/allot-admins", "admin", ""), "/allot-admins", true, ""},
		{rule("groups", "path", "/allot-admins/", "admin", ""), "/allot-admins/", true, ""},
		{rule("groups", "path", "/allot-admins", "admin", ""), "allot-admins", false, ""},
		{rule("groups", "path", "/teams/{team}/lead", "lead", ""), "/teams/nlp/lead", true, "nlp"},
		{rule("groups", "path", "/teams/{team}/lead", "lead", ""), "/teams/nlp", false, ""},
		{rule("groups", "path", "/teams/{team}", "member", ""), "/teams/NLP", true, "nlp"},
		{rule("groups", "path", "/teams/{team}", "member", ""), "/teams/nlp/lead", false, ""},
		{rule("groups", "path", "/*/ml/{team}", "member", ""), "/org/ml/vision", true, "vision"},
		{rule("groups", "path", "/teams/{team}", "member", ""), "/teams/bad slug", false, ""},
		{rule("groups", "guid", "6F1C5D3A-2B4E-4C8D-9A7B-1E2F3A4B5C6D", "lead", "nlp"), "6f1c5d3a-2b4e-4c8d-9a7b-1e2f3a4b5c6d", true, "nlp"},
		{rule("groups", "guid", "6f1c5d3a-2b4e-4c8d-9a7b-1e2f3a4b5c6d", "lead", "nlp"), "6f1c5d3a-2b4e-4c8d-9a7b-1e2f3a4b5c6e", false, ""},
		{rule("groups", "glob", "team:{team}:lead", "lead", ""), "team:fraud:lead", true, "fraud"},
		{rule("groups", "glob", "team:{team}", "member", ""), "team:fraud:lead", false, ""},
		{rule("groups", "glob", "gpu-*-users", "member", "nlp"), "gpu-eu-users", true, "nlp"},
		{rule("groups", "glob", "gpu-?", "finance", ""), "gpu-12", false, ""},
		{rule("roles", "regex", `Allot\.Team\.{team}\.Lead`, "lead", ""), "Allot.Team.Recs.Lead", true, "recs"},
		{rule("roles", "regex", `allot-(?P<team>[a-z]+)-eng`, "member", ""), "allot-nlp-eng", true, "nlp"},
		{rule("roles", "regex", `allot-(?P<team>[a-z]+)-eng`, "member", ""), "xallot-nlp-eng", false, ""}, // anchored
		{rule("roles", "regex", `Allot\.Admin|Allot\.Root`, "admin", ""), "Allot.Root", true, ""},
	} {
		ok, team := c.r.Matches(c.value)
		if ok != c.ok || team != c.team {
			t.Errorf("%s %q on %q: %v %q, want %v %q", c.r.Match, c.r.Pattern, c.value, ok, team, c.ok, c.team)
		}
	}

	// Bad rules are field errors naming the field.
	for _, c := range []struct {
		m     store.IdPMapping
		field string
	}{
		{store.IdPMapping{Claim: "", Match: "exact", Pattern: "x", Grant: "admin"}, "claim"},
		{store.IdPMapping{Claim: "my groups", Match: "exact", Pattern: "x", Grant: "admin"}, "claim"},
		{store.IdPMapping{Claim: "groups", Match: "fuzzy", Pattern: "x", Grant: "admin"}, "match"},
		{store.IdPMapping{Claim: "groups", Match: "exact", Pattern: "", Grant: "admin"}, "pattern"},
		{store.IdPMapping{Claim: "groups", Match: "exact", Pattern: "x", Grant: "owner"}, "grant"},
		{store.IdPMapping{Claim: "groups", Match: "guid", Pattern: "not-a-guid", Grant: "admin"}, "pattern"},
		{store.IdPMapping{Claim: "groups", Match: "path", Pattern: "teams/{team}", Grant: "member"}, "pattern"},
		{store.IdPMapping{Claim: "groups", Match: "path", Pattern: "/teams/x{team}", Grant: "member"}, "pattern"},
		{store.IdPMapping{Claim: "groups", Match: "path", Pattern: "/teams//x", Grant: "member", Team: "nlp"}, "pattern"},
		{store.IdPMapping{Claim: "groups", Match: "regex", Pattern: "(unclosed", Grant: "admin"}, "pattern"},
		{store.IdPMapping{Claim: "groups", Match: "glob", Pattern: "{team}-{team}", Grant: "member"}, "pattern"},
		{store.IdPMapping{Claim: "groups", Match: "glob", Pattern: "t:{team}", Grant: "admin"}, "pattern"},
		{store.IdPMapping{Claim: "groups", Match: "exact", Pattern: "x", Grant: "admin", Team: "nlp"}, "team"},
		{store.IdPMapping{Claim: "groups", Match: "exact", Pattern: "x", Grant: "member"}, "team"},
		{store.IdPMapping{Claim: "groups", Match: "glob", Pattern: "t:{team}", Grant: "member", Team: "nlp"}, "team"},
		{store.IdPMapping{Claim: "groups", Match: "exact", Pattern: "x", Grant: "lead", Team: "Not A Slug"}, "team"},
	} {
		_, err := c.m.Compile()
		if f := allot.Fields(err); f[c.field] == "" {
			t.Errorf("%+v: %v, want an error on %s", c.m, err, c.field)
		}
	}

	// ApplyRules: lead wins; a value that makes a lead is no membership.
	rules := []*store.Rule{
		rule("groups", "path", "/allot-admins", "admin", ""),
		rule("groups", "path", "/teams/{team}", "member", ""),
		rule("groups", "path", "/teams/{team}/lead", "lead", ""),
		rule("roles", "exact", "Allot.Finance", "finance", ""),
		rule("groups", "glob", "*", "member", "fraud"),
	}
	vals := map[string][]string{"groups": {"/teams/nlp", "/teams/nlp/lead", "/teams/recs"}, "roles": {"Allot.Finance", "Other"}}
	res := store.ApplyRules(rules, func(c string) []string { return vals[c] })
	want := []allot.Membership{{Team: "fraud", Role: "member"}, {Team: "nlp", Role: "lead"}, {Team: "recs", Role: "member"}}
	if res.Admin || !res.Finance || !cmp.Equal(res.Memberships, want) || res.Matched != 4 {
		t.Errorf("ApplyRules = %+v", res)
	}
}

// TestIdPMappingsAudited: rules are added, changed and removed with an
// audit entry each; bad input and duplicates change nothing.
func TestIdPMappingsAudited(t *testing.T) {
	b := setup(t)
	m, r, err := b.st.CreateIdPMapping(b.ctx, "ada@example.com",
		store.IdPMapping{Claim: " groups ", Match: "PATH", Pattern: "/teams/{team}/lead/", Grant: "lead"}, "keycloak")
	if err != nil || !r.Changed || r.Entry.Action != "idp_mapping.create" || m.Pattern != "/teams/{team}/lead" || m.Claim != "groups" || m.UpdatedBy != "ada@example.com" {
		t.Fatalf("create: %+v %+v %v", m, r, err)
	}
	audits := b.count(t, "audit_log")
	for _, bad := range []store.IdPMapping{
		{Claim: "groups", Match: "path", Pattern: "/teams/{team}/lead", Grant: "lead"}, // the same rule
		{Claim: "groups", Match: "exact", Pattern: "x", Grant: "lead", Team: "ghost"},  // no such team
		{Claim: "groups", Match: "regex", Pattern: "(", Grant: "admin"},
	} {
		if _, _, err := b.st.CreateIdPMapping(b.ctx, "ada@example.com", bad, ""); allot.Fields(err) == nil {
			t.Errorf("%+v: %v, want field errors", bad, err)
		}
	}
	if n := b.count(t, "idp_mappings"); n != 1 {
		t.Errorf("rules: %d", n)
	}
	// The same values: no change, no entry.
	if _, r, err := b.st.UpdateIdPMapping(b.ctx, "ada@example.com", m.ID, m, ""); err != nil || r.Changed {
		t.Errorf("same update: %+v %v", r, err)
	}
	if n := b.count(t, "audit_log"); n != audits {
		t.Errorf("refusals wrote audit entries: %d → %d", audits, n)
	}
	m2 := m
	m2.Pattern = "/groups/{team}/leads"
	got, r, err := b.st.UpdateIdPMapping(b.ctx, "ada@example.com", m.ID, m2, "renamed")
	if err != nil || !r.Changed || got.Pattern != "/groups/{team}/leads" || !strings.Contains(string(r.Entry.Before), "/teams/{team}/lead") {
		t.Errorf("update: %+v %+v %v", got, r, err)
	}
	if _, _, err := b.st.UpdateIdPMapping(b.ctx, "ada@example.com", 999999, m2, ""); allot.ErrorCode(err) != allot.ENotFound {
		t.Errorf("update of no rule: %v", err)
	}
	if _, r, err := b.st.DeleteIdPMapping(b.ctx, "ada@example.com", m.ID, "gone"); err != nil || r.Entry.Action != "idp_mapping.delete" {
		t.Errorf("delete: %+v %v", r, err)
	}
	if n := b.count(t, "audit_log"); n != audits+2 {
		t.Errorf("audit entries %d → %d, want 2 more", audits, n)
	}
	if rules, err := b.st.IdPRules(b.ctx); err != nil || len(rules) != 0 {
		t.Errorf("after delete: %v %v", rules, err)
	}
}

// TestSignInOIDCLinking: sign-ins are keyed by (issuer, subject); linking
// by email needs a verified email and an allow-listed issuer; a second
// identity-provider account with the same email (the "nOAuth" takeover)
// is refused until an admin links it, and the admin's link is audited.
func TestSignInOIDCLinking(t *testing.T) {
	b := setup(t)
	const iss, other = "https://idp.example.com/realms/acme", "https://login.example.net/tenant-2/v2.0"
	users := b.count(t, "users")
	nadia := func(issuer, subject string) *allot.User {
		return &allot.User{OIDCSubject: subject, Email: "nadia@example.com", Name: "Nadia",
			Memberships: []allot.Membership{{Team: "nlp", Role: allot.TeamRoleLead}}}
	}
	var link *store.LinkRequiredError
	// The demo's nadia never signed in. Verified, but the issuer is not
	// allowed to link by email: refused.
	if _, err := b.st.SignInOIDC(b.ctx, nadia(iss, "kc-1"), iss, true, false); !errors.As(err, &link) || !strings.Contains(link.Reason, "--oidc-link-email-issuers") {
		t.Fatalf("not allow-listed: %v", err)
	}
	// Allowed but unverified: refused.
	if _, err := b.st.SignInOIDC(b.ctx, nadia(iss, "kc-1"), iss, false, true); !errors.As(err, &link) || !strings.Contains(link.Reason, "verified") {
		t.Fatalf("unverified: %v", err)
	}
	if got := b.user(t, "nadia@example.com"); !store.NeverSignedIn(got.OIDCSubject) {
		t.Fatalf("a refused sign-in linked nadia: %q", got.OIDCSubject)
	}
	// Verified and allowed: linked, audited.
	u := nadia(iss, "kc-1")
	if _, err := b.st.SignInOIDC(b.ctx, u, iss, true, true); err != nil {
		t.Fatal(err)
	}
	if got := b.user(t, "nadia@example.com"); got.ID != u.ID || got.OIDCSubject != "kc-1" {
		t.Errorf("linked: %+v", got)
	}
	if a := b.audits(t, "user.oidc_link"); len(a) != 1 || !strings.Contains(string(a[0].After), iss) {
		t.Errorf("link audit: %+v", a)
	}
	// The takeover: another provider account (another issuer, or another
	// subject at the same issuer) with the same verified email.
	for _, try := range []struct{ issuer, subject string }{{other, "kc-1"}, {other, "attacker"}, {iss, "attacker"}} {
		if _, err := b.st.SignInOIDC(b.ctx, nadia(try.issuer, try.subject), try.issuer, true, true); !errors.As(err, &link) {
			t.Errorf("%s %s with nadia's email: %v, want refused", try.issuer, try.subject, err)
		}
	}
	if got := b.user(t, "nadia@example.com"); got.OIDCSubject != "kc-1" || b.count(t, "users") != users {
		t.Errorf("after takeover attempts: %+v, users %d", got, b.count(t, "users"))
	}
	// The same subject at another issuer is another person.
	zoe := &allot.User{OIDCSubject: "kc-1", Email: "zoe@example.com", Name: "Zoe"}
	if _, err := b.st.SignInOIDC(b.ctx, zoe, other, false, false); err != nil || zoe.ID == u.ID {
		t.Fatalf("same subject, other issuer: %v", err)
	}
	// An admin links the other account to nadia explicitly; her sessions
	// and the API tokens allot login made end, her other tokens stay.
	if _, err := b.st.CreateSession(b.ctx, u.ID, 3600e9); err != nil {
		t.Fatal(err)
	}
	cliSecret, _, err := b.st.CreateAPITokenWith(b.ctx, u.ID, store.NewAPIToken{Name: store.CLITokenNamePrefix + "laptop"})
	if err != nil {
		t.Fatal(err)
	}
	ownSecret, _, err := b.st.CreateAPITokenWith(b.ctx, u.ID, store.NewAPIToken{Name: "ci"})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct{ issuer, subject, field string }{
		{"not a url", "x", "issuer"}, {iss, "", "subject"}, {iss, "demo|x", "subject"}, {other, "kc-1", "subject"}, // zoe's
	} {
		if _, _, err := b.st.LinkOIDCIdentity(b.ctx, "ada@example.com", "nadia@example.com", bad.issuer, bad.subject, ""); allot.Fields(err)[bad.field] == "" {
			t.Errorf("link %q %q: %v, want an error on %s", bad.issuer, bad.subject, err, bad.field)
		}
	}
	id, r, err := b.st.LinkOIDCIdentity(b.ctx, "ada@example.com", "nadia@example.com", other, "nadia-entra", "moved to Entra")
	if err != nil || !r.Changed || id.UserID != u.ID || r.Entry.Actor != "ada@example.com" || !strings.Contains(string(r.Entry.Before), "kc-1") {
		t.Fatalf("admin link: %+v %+v %v", id, r, err)
	}
	var sessions int
	b.pool.QueryRow(b.ctx, `SELECT count(*) FROM sessions WHERE user_id = $1`, u.ID).Scan(&sessions) //nolint:errcheck
	if sessions != 0 {
		t.Errorf("sessions after the link: %d", sessions)
	}
	if _, err := b.st.UserByAPIToken(b.ctx, cliSecret); allot.ErrorCode(err) != allot.EUnauthorized {
		t.Errorf("allot login's token after the link: %v, want revoked", err)
	}
	if _, err := b.st.UserByAPIToken(b.ctx, ownSecret); err != nil {
		t.Errorf("another token after the link: %v", err)
	}
	if _, r, err := b.st.LinkOIDCIdentity(b.ctx, "ada@example.com", "nadia@example.com", other, "nadia-entra", ""); err != nil || r.Changed {
		t.Errorf("linking again: %+v %v", r, err)
	}
	again := nadia(other, "nadia-entra")
	if _, err := b.st.SignInOIDC(b.ctx, again, other, false, false); err != nil || again.ID != u.ID {
		t.Errorf("sign-in with the linked identity: %v", err)
	}
	// The old identity no longer signs in as her.
	if _, err := b.st.SignInOIDC(b.ctx, nadia(iss, "kc-1"), iss, true, true); !errors.As(err, &link) {
		t.Errorf("old identity: %v", err)
	}
	// A row from before issuers were kept is adopted when the email matches.
	if _, err := b.pool.Exec(b.ctx, `UPDATE users SET oidc_issuer = '', oidc_subject = 'legacy-9' WHERE email = 'noah@example.com'`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.SignInOIDC(b.ctx, &allot.User{OIDCSubject: "legacy-9", Email: "someone@example.com", Name: "S"}, iss, true, true); !errors.As(err, &link) {
		t.Errorf("legacy subject, other email: %v", err)
	}
	noah := &allot.User{OIDCSubject: "legacy-9", Email: "noah@example.com", Name: "Noah"}
	if _, err := b.st.SignInOIDC(b.ctx, noah, iss, false, false); err != nil || noah.ID != b.user(t, "noah@example.com").ID {
		t.Errorf("legacy adoption: %v", err)
	}
}

// TestOIDCSignInsKept: the report keeps the latest sign-ins only.
func TestOIDCSignInsKept(t *testing.T) {
	b := setup(t)
	for i := 0; i < 205; i++ {
		if err := b.st.RecordOIDCSignIn(b.ctx, store.OIDCSignIn{Issuer: "https://i", Subject: "s", Email: "e@example.com", Outcome: "signed_in",
			ClaimNames: []string{"email", "groups"}, ClaimCounts: map[string]int{"groups": i}}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.st.RecentOIDCSignIns(b.ctx, 0)
	if err != nil || len(got) != 200 || got[0].ClaimCounts["groups"] != 204 {
		t.Fatalf("%d sign-ins, newest %+v, %v", len(got), got[0], err)
	}
}
