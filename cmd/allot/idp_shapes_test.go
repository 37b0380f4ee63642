package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/oidcdev"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

// Identity-provider shapes (issue 17): the development provider configured
// as Keycloak (group paths, realm roles), Entra ID (group GUIDs, app roles,
// the groups overage marker), Okta/Dex (groups only with the groups
// scope), and zitadel's example provider, each mapped with the admins'
// rules.

// providerUsers writes users for `allot oidc-provider --users-json` and
// returns the file's path.
func providerUsers(t *testing.T, users []map[string]any) string {
	t.Helper()
	b, err := json.Marshal(users)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "users.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// bootSSOConfig is bootSSO with the SSO configuration changed by mod.
func bootSSOConfig(t *testing.T, issuer string, devMode bool, mod func(*web.OIDCConfig)) *env {
	t.Helper()
	c := web.OIDCConfig{Issuer: issuer, ClientID: testClientID, ClientSecret: testClientSecret}
	if mod != nil {
		mod(&c)
	}
	return bootMain(t, &Main{Config: Config{Worker: true, DevMode: devMode, OIDC: c}})
}

// ssoMe signs username in through the provider and returns /api/v1/me, and
// the browser with its session.
func ssoMe(t *testing.T, e *env, username string) (web.MeJSON, *ssoBrowser) {
	t.Helper()
	b := newSSOBrowser(t)
	if to := b.login(e, username, ""); to != e.url+"/jobs" {
		t.Fatalf("%s landed on %q", username, to)
	}
	s := b.do("GET", e.url+"/api/v1/me", nil)
	var me web.MeJSON
	if err := json.Unmarshal([]byte(s.body), &me); s.status != http.StatusOK || err != nil {
		t.Fatalf("%s /api/v1/me: %d %s", username, s.status, s.body)
	}
	return me, b
}

// wantRoles checks me's roles: admin, finance and teams (team → role).
func wantRoles(t *testing.T, who string, me web.MeJSON, admin, finance bool, teams map[string]string) {
	t.Helper()
	if me.Admin != admin || me.Finance != finance || len(me.Teams) != len(teams) {
		t.Errorf("%s: admin=%v finance=%v teams=%v, want admin=%v finance=%v teams=%v", who, me.Admin, me.Finance, me.Teams, admin, finance, teams)
		return
	}
	for team, role := range teams {
		if me.Teams[team] != role {
			t.Errorf("%s: %s in %s, want %s", who, me.Teams[team], team, role)
		}
	}
}

// addRules adds rules through the API as the admin persona.
func addRules(t *testing.T, e *env, rules ...string) {
	t.Helper()
	for _, r := range rules {
		if code, _, b := e.api("POST", "/api/v1/idp-mappings", demo.Admin, r); code != http.StatusCreated {
			t.Fatalf("POST idp-mappings %s: %d %s", r, code, b)
		}
	}
}

func signIns(t *testing.T, e *env) web.IdPSignInsJSON {
	t.Helper()
	var out web.IdPSignInsJSON
	e.getJSON("/api/v1/idp-sign-ins", demo.Admin, &out)
	return out
}

func hasWarning(s web.IdPSignInsJSON, kind string) bool {
	return slices.ContainsFunc(s.Warnings, func(w web.IdPWarning) bool { return w.Kind == kind })
}

// TestIdPShapeKeycloak: Keycloak sends group paths (/allot-admins,
// /teams/nlp/lead) and realm roles under realm_access.roles. The built-in
// mapping matches none of them (a warning says so); path rules and a
// nested-claim rule made through the API (audited, bad input refused)
// give the roles; the portal page lists them and refuses a bad rule with
// a field error.
func TestIdPShapeKeycloak(t *testing.T) {
	users := providerUsers(t, []map[string]any{
		{"username": "kc-ada", "subject": "kc-0001", "email": "kc-ada@example.com", "groups": []string{"/allot-admins", "/staff"}},
		{"username": "kc-nadia", "subject": "kc-0002", "email": "kc-nadia@example.com", "groups": []string{"/teams/nlp/lead", "/teams/nlp"}},
		{"username": "kc-noah", "subject": "kc-0003", "email": "kc-noah@example.com", "groups": []string{"/teams/nlp", "/teams/recs/"}},
		{"username": "kc-finn", "subject": "kc-0004", "email": "kc-finn@example.com", "groups": []string{},
			"claims": map[string]any{"realm_access": map[string]any{"roles": []string{"allot-finance", "offline_access"}}}},
	})
	e := bootSSOConfig(t, startProvider(t, "--users-json", users), false, nil).withTokens()
	ctx := context.Background()

	// No rules: the built-in mapping (exact allot-admins, team:<slug>)
	// matches no path, and the admin page says so.
	me, _ := ssoMe(t, e, "kc-nadia")
	wantRoles(t, "kc-nadia without rules", me, false, false, nil)
	si := signIns(t, e)
	if !hasWarning(si, "no_match") || len(si.SignIns) != 1 || si.SignIns[0].ClaimCounts["groups"] != 2 || si.SignIns[0].Matched != 0 ||
		!slices.Contains(si.SignIns[0].ClaimNames, "groups") || si.SignIns[0].Outcome != "signed_in" {
		t.Errorf("sign-ins without rules: %+v", si)
	}
	var list web.IdPMappingsJSON
	e.getJSON("/api/v1/idp-mappings", demo.Admin, &list)
	if !list.Defaults || len(list.Rules) != 0 || len(list.DefaultRules) != 4 {
		t.Errorf("defaults: %+v", list)
	}

	// Bad rules: field errors, nothing stored or audited.
	audits := func() int {
		var n int
		if err := e.m.Pool.QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE action LIKE 'idp_mapping.%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for body, field := range map[string]string{
		`{"claim":"groups","match":"path","pattern":"teams/{team}","grant":"member"}`:       "pattern",
		`{"claim":"groups","match":"path","pattern":"/teams/{team}","grant":"admin"}`:       "pattern",
		`{"claim":"groups","match":"exact","pattern":"/x","grant":"lead","team":"nowhere"}`: "team",
		`{"claim":"","match":"exact","pattern":"/x","grant":"admin"}`:                       "claim",
		`{"claim":"groups","match":"soundex","pattern":"/x","grant":"admin"}`:               "match",
	} {
		code, _, b := e.api("POST", "/api/v1/idp-mappings", demo.Admin, body)
		if code != http.StatusUnprocessableEntity || !strings.Contains(string(b), `"`+field+`"`) {
			t.Errorf("%s: %d %s, want 422 on %s", body, code, b, field)
		}
	}
	if code, _, _ := e.api("POST", "/api/v1/idp-mappings", demo.Engineer, `{"claim":"groups","match":"exact","pattern":"x","grant":"admin"}`); code != http.StatusForbidden {
		t.Errorf("an engineer adding a rule: %d", code)
	}
	if n := audits(); n != 0 {
		t.Errorf("refused rules wrote %d audit entries", n)
	}

	addRules(t, e,
		`{"claim":"groups","match":"path","pattern":"/allot-admins","grant":"admin","note":"keycloak"}`,
		`{"claim":"groups","match":"path","pattern":"/teams/{team}","grant":"member"}`,
		`{"claim":"groups","match":"path","pattern":"/teams/{team}/lead","grant":"lead"}`,
		`{"claim":"realm_access.roles","match":"exact","pattern":"allot-finance","grant":"finance"}`)
	if n := audits(); n != 4 {
		t.Errorf("audit entries for 4 rules: %d", n)
	}
	// Trying the rules on a token's claims changes nothing.
	var try web.IdPTryJSON
	code, _, b := e.api("POST", "/api/v1/idp-mappings/try", demo.Admin,
		`{"claims":{"groups":["/teams/vision/lead","/other"],"realm_access":{"roles":["allot-finance"]}}}`)
	if err := json.Unmarshal(b, &try); code != http.StatusOK || err != nil || !try.Finance || try.Admin || try.Roles != "finance, lead of vision" ||
		try.Matched != 2 || try.ClaimCounts["groups"] != 2 || try.BuiltIn {
		t.Errorf("try: %d %s", code, b)
	}
	if code, _, b := e.api("POST", "/api/v1/idp-mappings/try", demo.Admin, `{"claims":null}`); code != http.StatusUnprocessableEntity || !strings.Contains(string(b), `"claims"`) {
		t.Errorf("try without claims: %d %s", code, b)
	}
	if n := audits(); n != 4 {
		t.Errorf("trying wrote audit entries: %d", n)
	}
	for _, c := range []struct {
		user           string
		admin, finance bool
		teams          map[string]string
	}{
		{"kc-ada", true, false, nil},
		{"kc-nadia", false, false, map[string]string{"nlp": "lead"}},
		{"kc-noah", false, false, map[string]string{"nlp": "member", "recs": "member"}},
		{"kc-finn", false, true, nil},
	} {
		me, _ := ssoMe(t, e, c.user)
		wantRoles(t, c.user, me, c.admin, c.finance, c.teams)
	}
	if si := signIns(t, e); hasWarning(si, "no_match") || hasWarning(si, "no_claims") || !slices.Contains(si.Reads, "realm_access.roles") {
		t.Errorf("warnings with rules that match: %+v", si.Warnings)
	}

	// Change and delete through the API, audited.
	e.getJSON("/api/v1/idp-mappings", demo.Admin, &list)
	if list.Defaults || len(list.Rules) != 4 {
		t.Fatalf("rules: %+v", list)
	}
	var finance store.IdPMapping
	for _, r := range list.Rules {
		if r.Grant == "finance" {
			finance = r
		}
	}
	path := fmt.Sprintf("/api/v1/idp-mappings/%d", finance.ID)
	if code, _, b := e.api("PUT", path, demo.Admin, `{"claim":"realm_access.roles","match":"glob","pattern":"allot-fin*","grant":"finance"}`); code != http.StatusOK ||
		!strings.Contains(string(b), `"changed": true`) {
		t.Errorf("PUT: %d %s", code, b)
	}
	if code, _, b := e.api("PUT", path, demo.Admin, `{"claim":"realm_access.roles","match":"regex","pattern":"(","grant":"finance"}`); code != http.StatusUnprocessableEntity {
		t.Errorf("bad PUT: %d %s", code, b)
	}
	if code, _, _ := e.api("PUT", "/api/v1/idp-mappings/999999", demo.Admin, `{"claim":"groups","match":"exact","pattern":"x","grant":"admin"}`); code != http.StatusNotFound {
		t.Errorf("PUT of no rule: %d", code)
	}
	me, _ = ssoMe(t, e, "kc-finn")
	wantRoles(t, "kc-finn after the glob", me, false, true, nil)
	if code, _, b := e.api("DELETE", path+"?note=gone", demo.Admin, ""); code != http.StatusOK {
		t.Errorf("DELETE: %d %s", code, b)
	}
	if n := e.auditActions("idp_mapping.delete", fmt.Sprintf("idp_mapping:%d", finance.ID)); n != 1 || audits() != 6 {
		t.Errorf("audit after update and delete: %d delete, %d in all", n, audits())
	}
	me, _ = ssoMe(t, e, "kc-finn")
	wantRoles(t, "kc-finn without the rule", me, false, false, nil)

	// The portal, as kc-ada (admin through /allot-admins).
	_, ada := ssoMe(t, e, "kc-ada")
	s := ada.do("GET", e.url+"/admin/identity", nil)
	if s.status != http.StatusOK || strings.Count(s.body, `data-testid="idp-rule"`) != 3 || !strings.Contains(s.body, `data-testid="idp-sign-ins"`) ||
		!strings.Contains(s.body, "kc-nadia@example.com") || strings.Contains(s.body, `data-testid="idp-defaults"`) {
		t.Fatalf("admin page: %d\n%s", s.status, s.body)
	}
	for _, p := range pageProblems(t, s.body) {
		t.Errorf("/admin/identity: %s", p)
	}
	csrf := csrfRE.FindStringSubmatch(s.body)[1]
	s = ada.do("POST", e.url+"/admin/identity/rules", url.Values{"_csrf": {csrf}, "claim": {"groups"}, "match": {"guid"}, "pattern": {"not-a-guid"}, "grant": {"admin"}})
	if s.status != http.StatusUnprocessableEntity || !strings.Contains(s.body, `data-testid="error-pattern"`) || !strings.Contains(s.body, `value="not-a-guid"`) {
		t.Errorf("bad rule in the portal: %d\n%s", s.status, s.body)
	}
	s = ada.do("POST", e.url+"/admin/identity/rules", url.Values{"_csrf": {csrf}, "claim": {"groups"}, "match": {"path"}, "pattern": {"/finance"}, "grant": {"finance"}, "note": {"via portal"}})
	if s.status != http.StatusSeeOther || !strings.HasPrefix(s.location, e.url+"/admin/identity?done=created") {
		t.Errorf("rule in the portal: %d %q %s", s.status, s.location, s.body)
	}
	if n := audits(); n != 7 {
		t.Errorf("audit entries after the portal's rule: %d", n)
	}
	s = ada.do("POST", e.url+"/admin/identity/try", url.Values{"_csrf": {csrf}, "claims": {`{"groups": "/finance"`}})
	if s.status != http.StatusUnprocessableEntity || !strings.Contains(s.body, `data-testid="error-claims"`) {
		t.Errorf("try bad JSON in the portal: %d\n%s", s.status, s.body)
	}
	s = ada.do("POST", e.url+"/admin/identity/try", url.Values{"_csrf": {csrf}, "claims": {`{"groups": ["/finance", "/teams/nlp"]}`}})
	if s.status != http.StatusOK || !strings.Contains(s.body, "finance, member of nlp (2 values matched; groups: 2") {
		t.Errorf("try in the portal: %d\n%s", s.status, s.body)
	}
}

// Entra ID group object ids of the test tenant.
const (
	entraAdmins  = "3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e6f"
	entraNLPLead = "8d1e2f3a-4b5c-4d6e-8f70-a1b2c3d4e5f6"
)

// TestIdPShapeEntra: Entra ID sends group object ids (any case), app roles
// in roles, no email_verified and no groups scope; a person in more than
// 200 groups gets _claim_names.groups instead of the groups. GUID rules
// and role rules map them; the overage is recorded and warned about, and
// the person still gets what their app roles give.
func TestIdPShapeEntra(t *testing.T) {
	users := providerUsers(t, []map[string]any{
		{"username": "en-ada", "subject": "AAAAAAAAAAAAAAAAAAAAAGdh", "email": "en-ada@example.com", "no_email_verified": true,
			"claims": map[string]any{"groups": []string{strings.ToUpper(entraAdmins), "0b0b0b0b-0000-4000-8000-000000000000"}}},
		{"username": "en-nadia", "subject": "AAAAAAAAAAAAAAAAAAAAAG5h", "email": "en-nadia@example.com", "no_email_verified": true,
			"claims": map[string]any{"groups": []string{entraNLPLead}}},
		{"username": "en-finn", "subject": "AAAAAAAAAAAAAAAAAAAAAGZp", "email": "en-finn@example.com", "no_email_verified": true,
			"claims": map[string]any{"roles": []string{"Allot.Finance"}}},
		{"username": "en-big", "subject": "AAAAAAAAAAAAAAAAAAAAAGJp", "email": "en-big@example.com", "no_email_verified": true,
			"claims": map[string]any{
				"_claim_names":   map[string]any{"groups": "src1"},
				"_claim_sources": map[string]any{"src1": map[string]any{"endpoint": "https://graph.microsoft.com/v1.0/users/x/getMemberObjects"}},
				"roles":          []string{"Allot.Team.Recs.Member"},
			}},
	})
	// Entra ID has no groups scope (and refuses unknown scopes): groups
	// come as the app registration says, here always.
	e := bootSSOConfig(t, startProvider(t, "--users-json", users, "--groups-need-scope"), false, func(c *web.OIDCConfig) {
		c.Scopes = []string{"profile", "email"}
	}).withTokens()
	addRules(t, e,
		`{"claim":"groups","match":"guid","pattern":"`+entraAdmins+`","grant":"admin"}`,
		`{"claim":"groups","match":"guid","pattern":"`+strings.ToUpper(entraNLPLead)+`","grant":"lead","team":"nlp"}`,
		`{"claim":"roles","match":"exact","pattern":"Allot.Finance","grant":"finance"}`,
		`{"claim":"roles","match":"regex","pattern":"Allot\\.Team\\.{team}\\.Member","grant":"member"}`,
		// Entra ID's email is not verified (anyone in any tenant may set
		// it): a rule on it grants nothing.
		`{"claim":"email","match":"glob","pattern":"en-finn@*","grant":"lead","team":"recs"}`)
	for _, c := range []struct {
		user           string
		admin, finance bool
		teams          map[string]string
	}{
		{"en-ada", true, false, nil},
		{"en-nadia", false, false, map[string]string{"nlp": "lead"}},
		{"en-finn", false, true, nil},
		{"en-big", false, false, map[string]string{"recs": "member"}},
	} {
		me, _ := ssoMe(t, e, c.user)
		wantRoles(t, c.user, me, c.admin, c.finance, c.teams)
	}
	si := signIns(t, e)
	if !hasWarning(si, "overage") || si.SignIns[0].Email != "en-big@example.com" || !si.SignIns[0].Overage || si.SignIns[1].Overage {
		t.Errorf("overage: %+v", si)
	}
	if _, ok := si.SignIns[0].ClaimCounts["groups"]; ok || si.SignIns[0].ClaimCounts["roles"] != 1 {
		t.Errorf("en-big's counts: %v", si.SignIns[0].ClaimCounts)
	}
	// The admin page shows the warning (as the demo admin's token cannot
	// open pages, en-ada's session).
	_, ada := ssoMe(t, e, "en-ada")
	s := ada.do("GET", e.url+"/admin/identity", nil)
	if s.status != http.StatusOK || !strings.Contains(s.body, `data-testid="idp-warning-overage"`) || !strings.Contains(s.body, "Microsoft Graph") ||
		!strings.Contains(s.body, `data-testid="idp-overage"`) {
		t.Errorf("admin page: %d\n%s", s.status, s.body)
	}
}

// TestIdPShapeOktaDex: Okta and Dex send groups only for the groups scope.
// With the default scopes Allot asks for groups, since the provider lists
// it, and the built-in mapping works; with --oidc-scopes "profile email"
// the groups never come, and the admin page warns that the provider sends
// nothing the mapping reads.
func TestIdPShapeOktaDex(t *testing.T) {
	issuer := startProvider(t, "--groups-need-scope")
	e := bootSSO(t, issuer)
	b := newSSOBrowser(t)
	au, err := url.Parse(b.start(e, ""))
	if err != nil || !slices.Contains(strings.Fields(au.Query().Get("scope")), "groups") {
		t.Fatalf("authorize URL without the groups scope: %v %v", au, err)
	}
	me, _ := ssoMe(t, e, "nadia")
	wantRoles(t, "nadia with the groups scope", me, false, false, map[string]string{"nlp": "lead"})
	me, _ = ssoMe(t, e, "ada")
	wantRoles(t, "ada with the groups scope", me, true, false, nil)

	t.Run("scopes without groups", func(t *testing.T) {
		noGroups := bootSSOConfig(t, issuer, false, func(c *web.OIDCConfig) {
			c.Scopes, c.LinkEmailIssuers = []string{"profile", "email"}, []string{issuer}
		}).withTokens()
		me, _ := ssoMe(t, noGroups, "nadia")
		wantRoles(t, "nadia without the groups scope", me, false, false, nil)
		si := signIns(t, noGroups)
		if !hasWarning(si, "no_claims") || len(si.SignIns) != 1 || len(si.SignIns[0].ClaimCounts) != 0 || slices.Contains(si.Scopes, "groups") {
			t.Errorf("sign-ins without groups: %+v", si)
		}
	})
}

// TestIdPProviderRefusesScope: a provider that refuses a scope it does not
// know (as Keycloak and Entra ID do) but lists groups: the sign-in fails
// with a page that names the scopes asked for and --oidc-scopes.
func TestIdPProviderRefusesScope(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	issuer := "http://" + ln.Addr().String()
	p, err := oidcdev.New(oidcdev.Config{Issuer: issuer, Users: oidcdev.DemoUsers(testPassword),
		Clients: []oidcdev.Client{{ID: testClientID, Secret: testClientSecret, RedirectURIs: []string{"http://127.0.0.1/oidc/callback"}}}})
	if err != nil {
		t.Fatal(err)
	}
	h := p.Handler()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if r.URL.Path == "/authorize" && slices.Contains(strings.Fields(q.Get("scope")), "groups") {
			back, _ := url.Parse(q.Get("redirect_uri"))
			v := url.Values{"error": {"invalid_scope"}, "error_description": {"Invalid scopes: " + q.Get("scope")}, "state": {q.Get("state")}}
			back.RawQuery = v.Encode()
			http.Redirect(w, r, back.String(), http.StatusFound)
			return
		}
		h.ServeHTTP(w, r)
	})}
	go srv.Serve(ln) //nolint:errcheck // closed below
	t.Cleanup(func() { srv.Close() })

	e := bootSSO(t, issuer)
	b := newSSOBrowser(t)
	s := b.do("GET", b.start(e, ""), nil)
	if s.status != http.StatusFound {
		t.Fatalf("provider: %d %s", s.status, s.body)
	}
	s = b.do("GET", s.location, nil)
	if s.status != http.StatusForbidden || !strings.Contains(s.body, "invalid_scope") || !strings.Contains(s.body, "openid profile email groups") ||
		!strings.Contains(s.body, "--oidc-scopes") {
		t.Errorf("refused scope: %d\n%s", s.status, s.body)
	}
}

// TestIdPShapeZitadel: zitadel's example provider sends no groups at all
// and its ID token no email (Allot reads userinfo); a rule on another
// claim (email) gives nadia the lead of nlp.
func TestIdPShapeZitadel(t *testing.T) {
	issuer, startOP := startZitadelOP(t)
	e := bootSSO(t, issuer).withTokens()
	startOP(e.url + "/oidc/callback")
	nadiaEmail := demo.PersonaEmail[demo.Lead]
	addRules(t, e, `{"claim":"email","match":"exact","pattern":"`+nadiaEmail+`","grant":"lead","team":"nlp"}`)

	b := newSSOBrowser(t)
	_, id := zitadelLoginPage(t, b, e, issuer)
	s := b.do("POST", issuer+"/login/username", url.Values{"id": {id}, "username": {zitadelUsername}, "password": {testPassword}})
	if s.status != http.StatusFound {
		t.Fatalf("login: %d %s", s.status, s.body)
	}
	s = b.do("GET", s.location, nil) // the OP's callback
	s = b.do("GET", s.location, nil) // Allot's
	if s.status != http.StatusSeeOther || s.location != e.url+"/jobs" {
		t.Fatalf("Allot callback: %d → %q\n%s", s.status, s.location, s.body)
	}
	s = b.do("GET", e.url+"/api/v1/me", nil)
	var me web.MeJSON
	if err := json.Unmarshal([]byte(s.body), &me); err != nil {
		t.Fatal(err)
	}
	wantRoles(t, "nadia through zitadel", me, false, false, map[string]string{"nlp": "lead"})
	si := signIns(t, e)
	if len(si.SignIns) != 1 || si.SignIns[0].ClaimCounts["email"] != 1 || si.SignIns[0].Matched != 1 || si.SignIns[0].Subject != zitadelSubject ||
		si.SignIns[0].Issuer != issuer || si.SignIns[0].Roles != "lead of nlp" || len(si.Warnings) != 0 {
		t.Errorf("sign-ins: %+v", si)
	}
}

// TestOIDCTakeoverNeedsAdminLink: without --oidc-link-email-issuers no
// sign-in is linked by email. A person the demo recorded is refused with a
// page saying an admin must link them; an admin links them (API, audited,
// bad input refused; the portal from the list of waiting sign-ins), and
// they sign in. A second identity-provider account with the admin's
// verified email (the "nOAuth" takeover) is refused and changes nothing.
func TestOIDCTakeoverNeedsAdminLink(t *testing.T) {
	adaEmail, noahEmail := demo.PersonaEmail[demo.Admin], demo.PersonaEmail[demo.Engineer]
	issuer := startProvider(t, "--user", "mallory:idp-mallory:"+adaEmail)
	e := bootSSOConfig(t, issuer, true, nil).withTokens()
	ctx := context.Background()
	identity := func(email string) (iss, sub string) {
		if err := e.m.Pool.QueryRow(ctx, "SELECT oidc_issuer, oidc_subject FROM users WHERE email = $1", email).Scan(&iss, &sub); err != nil {
			t.Fatal(err)
		}
		return iss, sub
	}
	refused := func(username, email string) {
		t.Helper()
		before := sessionCount(t, e)
		b := newSSOBrowser(t)
		s := b.do("GET", b.authorize(b.start(e, ""), username, testPassword, "login"), nil)
		if s.status != http.StatusForbidden || !strings.Contains(s.body, "An admin must link") || !strings.Contains(s.body, email) ||
			!strings.Contains(s.body, issuer) {
			t.Errorf("%s: %d, want 403 with the admin-link page\n%s", username, s.status, s.body)
		}
		if after := sessionCount(t, e); after != before {
			t.Errorf("%s: sessions %d → %d", username, before, after)
		}
	}
	var users int
	e.m.Pool.QueryRow(ctx, "SELECT count(*) FROM users").Scan(&users) //nolint:errcheck

	// noah never signed in; his verified email does not link him here.
	refused("noah", noahEmail)
	if _, sub := identity(noahEmail); !store.NeverSignedIn(sub) {
		t.Fatalf("noah linked by email: %q", sub)
	}
	si := signIns(t, e)
	if len(si.SignIns) != 1 || si.SignIns[0].Outcome != "link_required" || si.SignIns[0].Subject != "dev-noah" || si.SignIns[0].Email != noahEmail {
		t.Fatalf("waiting sign-ins: %+v", si.SignIns)
	}
	// The admin links him through the API; bad input is refused.
	linkPath := "/api/v1/users/" + noahEmail + "/oidc-link"
	if code, _, b := e.api("POST", linkPath, demo.Admin, `{"issuer":"not a url","subject":""}`); code != http.StatusUnprocessableEntity ||
		!strings.Contains(string(b), `"issuer"`) || !strings.Contains(string(b), `"subject"`) {
		t.Errorf("bad link: %d %s", code, b)
	}
	if code, _, _ := e.api("POST", "/api/v1/users/nobody@example.com/oidc-link", demo.Admin, `{"issuer":"`+issuer+`","subject":"dev-noah"}`); code != http.StatusNotFound {
		t.Errorf("link of nobody: %d", code)
	}
	if code, _, _ := e.api("POST", linkPath, demo.Lead, `{"issuer":"`+issuer+`","subject":"dev-noah"}`); code != http.StatusForbidden {
		t.Errorf("a lead linking: %d", code)
	}
	if code, _, b := e.api("POST", linkPath, demo.Admin, `{"issuer":"`+issuer+`","subject":"dev-noah","note":"ticket 7"}`); code != http.StatusOK || !strings.Contains(string(b), `"changed": true`) {
		t.Fatalf("link: %d %s", code, b)
	}
	if n := e.auditActions("user.oidc_link", "user:"+noahEmail); n != 1 {
		t.Errorf("link audit entries: %d", n)
	}
	me, _ := ssoMe(t, e, "noah")
	wantRoles(t, "noah after the link", me, false, false, map[string]string{"nlp": "member"})

	// ada: refused, then linked from the admin page's list (a dev-mode
	// admin session: nobody can sign in as an admin through SSO yet).
	refused("ada", adaEmail)
	admin := e.login(demo.Admin)
	status, page := admin.get("/admin/identity")
	if status != http.StatusOK || !strings.Contains(page, `data-outcome="link_required" data-email="`+adaEmail+`"`) {
		t.Fatalf("admin page: %d\n%s", status, page)
	}
	var waiting int64
	for _, x := range signIns(t, e).SignIns {
		if x.Outcome == "link_required" && x.Email == adaEmail {
			waiting = x.ID
		}
	}
	status, page = admin.post("/admin/identity/link", page, url.Values{"user": {"nobody@example.com"}, "issuer": {issuer}, "subject": {"dev-ada"},
		"sign_in": {fmt.Sprint(waiting)}})
	if status != http.StatusUnprocessableEntity || !strings.Contains(page, `data-testid="error-user"`) {
		t.Errorf("link to nobody in the portal: %d\n%s", status, page)
	}
	status, page = admin.post("/admin/identity/link", page, url.Values{"user": {adaEmail}, "issuer": {issuer}, "subject": {"dev-ada"},
		"sign_in": {fmt.Sprint(waiting)}})
	// Linking ends the person's sessions: here the admin's own.
	if status != http.StatusOK || !strings.Contains(page, "<h1>Log in</h1>") {
		t.Errorf("link in the portal: %d\n%s", status, page)
	}
	if iss, sub := identity(adaEmail); iss != issuer || sub != "dev-ada" || e.auditActions("user.oidc_link", "user:"+adaEmail) != 1 {
		t.Errorf("after the portal's link: %s %s", iss, sub)
	}
	if x := signIns(t, e).SignIns; x[0].ID != waiting || x[0].Outcome != "linked" {
		t.Errorf("the waiting sign-in: %+v", x[0])
	}
	me, _ = ssoMe(t, e, "ada")
	wantRoles(t, "ada after the link", me, true, false, nil)

	// mallory: another account at the provider with ada's verified email.
	refused("mallory", adaEmail)
	if iss, sub := identity(adaEmail); iss != issuer || sub != "dev-ada" {
		t.Errorf("ada's identity is now %s %s", iss, sub)
	}
	var after int
	e.m.Pool.QueryRow(ctx, "SELECT count(*) FROM users").Scan(&after) //nolint:errcheck
	if after != users {
		t.Errorf("users %d → %d", users, after)
	}
}

// TestOIDCLinkIssuersFlag: --oidc-link-email-issuers (or its env) takes
// issuer URLs separated by commas or spaces and refuses anything else;
// `allot oidc-provider --users-json` refuses a bad file.
func TestOIDCLinkIssuersFlag(t *testing.T) {
	parse := func(args ...string) (web.OIDCConfig, error) {
		fs := flag.NewFlagSet("server", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		get := oidcFlags(fs)
		if err := fs.Parse(args); err != nil {
			return web.OIDCConfig{}, err
		}
		return get()
	}
	t.Setenv("ALLOT_OIDC_ISSUER", "http://127.0.0.1:8081")
	t.Setenv("ALLOT_OIDC_CLIENT_ID", "allot")
	t.Setenv("ALLOT_OIDC_LINK_EMAIL_ISSUERS", "http://127.0.0.1:8081, https://kc.example.com/realms/acme")
	c, err := parse()
	if err != nil || !slices.Equal(c.LinkEmailIssuers, []string{"http://127.0.0.1:8081", "https://kc.example.com/realms/acme"}) {
		t.Errorf("from the env: %v %v", c.LinkEmailIssuers, err)
	}
	if _, err := parse("--oidc-link-email-issuers", "kc.example.com"); err == nil || !strings.Contains(err.Error(), "--oidc-link-email-issuers") {
		t.Errorf("a bad issuer: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "users.json")
	if err := os.WriteFile(bad, []byte(`[{"username":"x","subject":"","email":"x@example.com"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	if rc := run([]string{"oidc-provider", "--users-json", bad}, io.Discard, &stderr); rc != 2 || !strings.Contains(stderr.String(), "subject") {
		t.Errorf("bad --users-json: exit %d, %s", rc, stderr.String())
	}
}
