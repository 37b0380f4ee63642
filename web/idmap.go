package web

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// The identity-provider mapping (issue 17): the admins' table of rules from
// claim values (groups, roles, any claim) to Allot roles, what recent
// sign-ins sent, and the explicit link of a sign-in to an account.

// DefaultRules is the built-in mapping of the --oidc-* flags as rules: in
// force while the table has none.
func (m ClaimMapping) DefaultRules() []*store.Rule {
	m = m.WithDefaults()
	team := func(grant, pattern string) store.IdPMapping {
		if strings.ContainsAny(m.TeamPrefix+m.LeadSuffix, "*?") {
			// A glob would read them as wildcards.
			return store.IdPMapping{Claim: m.GroupsClaim, Match: store.MatchRegex, Grant: grant,
				Pattern: strings.ReplaceAll(regexp.QuoteMeta(strings.ReplaceAll(pattern, "{team}", "\x00")), "\x00", "{team}")}
		}
		return store.IdPMapping{Claim: m.GroupsClaim, Match: store.MatchGlob, Pattern: pattern, Grant: grant}
	}
	ms := []store.IdPMapping{
		{Claim: m.GroupsClaim, Match: store.MatchExact, Pattern: m.AdminGroup, Grant: store.GrantAdmin},
		{Claim: m.GroupsClaim, Match: store.MatchExact, Pattern: m.FinanceGroup, Grant: store.GrantFinance},
		team(store.GrantLead, m.TeamPrefix+"{team}"+m.LeadSuffix),
		team(store.GrantMember, m.TeamPrefix+"{team}"),
	}
	var out []*store.Rule
	for _, x := range ms {
		if r, err := x.Compile(); err == nil {
			out = append(out, r)
		}
	}
	return out
}

// idpRules are the rules in force: the table's, or the built-in ones.
func (s *Server) idpRules(ctx context.Context, m ClaimMapping) ([]*store.Rule, error) {
	rules, err := s.st.IdPRules(ctx)
	if err != nil || len(rules) > 0 {
		return rules, err
	}
	return m.DefaultRules(), nil
}

// ruleClaims are the claims the rules read, each once.
func ruleClaims(rules []*store.Rule) []string {
	var out []string
	for _, r := range rules {
		if !slices.Contains(out, r.Claim) {
			out = append(out, r.Claim)
		}
	}
	return out
}

// claimValues reads claim name: a top-level claim, else a dotted path into
// objects (realm_access.roles, resource_access.allot.roles: Keycloak's
// roles). A list gives its strings; one string is split on commas and
// spaces; a number or boolean is its text. ok is false when the claim is
// absent.
func claimValues(claims map[string]any, name string) (vals []string, ok bool) {
	v, ok := claims[name]
	if !ok && strings.Contains(name, ".") {
		parts := strings.Split(name, ".")
		var cur any = claims
		for _, p := range parts {
			obj, isObj := cur.(map[string]any)
			if !isObj {
				return nil, false
			}
			if cur, ok = obj[p]; !ok {
				return nil, false
			}
		}
		v = cur
	}
	if !ok {
		return nil, false
	}
	one := func(x any) (string, bool) {
		switch x := x.(type) {
		case string:
			return x, x != ""
		case float64, bool:
			return fmt.Sprint(x), true
		}
		return "", false
	}
	switch x := v.(type) {
	case []any:
		for _, e := range x {
			if s, ok := one(e); ok {
				vals = append(vals, s)
			}
		}
	case string:
		vals = strings.FieldsFunc(x, func(r rune) bool { return r == ',' || r == ' ' })
	default:
		if s, ok := one(x); ok {
			vals = []string{s}
		}
	}
	return vals, true
}

// overageClaims are the claims the rules read that the token names in
// _claim_names (Entra ID's "too many to send, ask Microsoft Graph"; the
// claim itself is then left out). "groups" counts even when no rule reads
// it by that name.
func overageClaims(claims map[string]any, read []string) []string {
	names, _ := claims["_claim_names"].(map[string]any)
	var out []string
	for k := range names {
		if k == "groups" || slices.Contains(read, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// emailVerified says whether the provider vouches for the email address
// (email_verified true; some providers send it as a string).
func emailVerified(claims map[string]any) bool {
	return claims["email_verified"] == true || claims["email_verified"] == "true"
}

// mappableClaims are the claims the rules may read: without the email
// address when the provider does not vouch for it (emailVerified), since
// on a multi-tenant provider anyone may claim any email (the "nOAuth"
// pattern), so a rule on email grants nothing from an unverified one.
func mappableClaims(claims map[string]any) map[string]any {
	if _, ok := claims["email"]; !ok || emailVerified(claims) {
		return claims
	}
	out := maps.Clone(claims)
	delete(out, "email")
	return out
}

// mapClaims applies rules to a token's claims: the roles, the number of
// values of each claim the rules read that was present, and the claims
// the token marks as overage.
func mapClaims(rules []*store.Rule, claims map[string]any) (store.RoleResult, map[string]int, []string) {
	read := ruleClaims(rules)
	values, counts := map[string][]string{}, map[string]int{}
	for _, c := range read {
		if v, ok := claimValues(claims, c); ok {
			values[c], counts[c] = v, len(v)
		}
	}
	res := store.ApplyRules(rules, func(c string) []string { return values[c] })
	return res, counts, overageClaims(claims, read)
}

// rolesSummary is what a sign-in gave, in words.
func rolesSummary(u *allot.User) string {
	var parts []string
	if u.Admin {
		parts = append(parts, "admin")
	}
	if u.Finance {
		parts = append(parts, "finance")
	}
	for _, m := range u.Memberships {
		parts = append(parts, m.Role+" of "+m.Team)
	}
	if len(parts) == 0 {
		return "no roles"
	}
	return strings.Join(parts, ", ")
}

// ---- What recent sign-ins say

// warnWindow is how many recent sign-ins the warnings look at.
const warnWindow = 20

// IdPWarning is one thing admins should fix at the identity provider.
type IdPWarning struct {
	Kind    string `json:"kind"` // overage, no_claims, no_match
	Message string `json:"message"`
}

// idpWarnings looks at the latest sign-ins (newest first): Entra ID's
// overage marker, none of the claims the mapping reads, no value that
// matched.
func idpWarnings(signIns []store.OIDCSignIn, read []string) []IdPWarning {
	var recent []store.OIDCSignIn
	for _, x := range signIns {
		if x.Outcome == "signed_in" || x.Outcome == "link_required" {
			recent = append(recent, x)
		}
		if len(recent) == warnWindow {
			break
		}
	}
	if len(recent) == 0 {
		return nil
	}
	var out []IdPWarning
	overage, noClaims, noMatch := 0, 0, 0
	for _, x := range recent {
		if x.Overage {
			overage++
		}
		if len(x.ClaimCounts) == 0 {
			noClaims++
		} else if x.Matched == 0 {
			noMatch++
		}
	}
	n := len(recent)
	if overage > 0 {
		out = append(out, IdPWarning{Kind: "overage", Message: fmt.Sprintf(
			"%d of the last %d sign-ins carried Entra ID's groups overage marker (_claim_names.groups: the person is in more than 200 groups) instead of the groups. "+
				"Allot does not fetch groups from Microsoft Graph, so those people got no roles from groups. "+
				"Fix it in the app registration: assign app roles and map the roles claim, or emit only the groups assigned to the application (groupMembershipClaims: ApplicationGroup) or a filtered set.",
			overage, n)})
	}
	claims := strings.Join(read, ", ")
	if noClaims == n {
		out = append(out, IdPWarning{Kind: "no_claims", Message: fmt.Sprintf(
			"The last %d sign-ins sent none of the claims the mapping reads (%s), so nobody gets admin, finance or team roles from the identity provider. "+
				"Okta and Dex send groups only for the groups scope (see the scopes below); Keycloak needs a Group Membership or role mapper on the client; Entra ID needs groupMembershipClaims or app roles. "+
				"The table of recent sign-ins shows the claim names the provider did send.", n, claims)})
	} else if noClaims+noMatch == n {
		out = append(out, IdPWarning{Kind: "no_match", Message: fmt.Sprintf(
			"The last %d sign-ins sent %s, but no value matched a rule, so nobody got a role from them. Check the rules' patterns against what the provider sends (Keycloak sends group paths such as /teams/nlp, Entra ID group object ids).",
			n, claims)})
	} else if noClaims > 0 {
		out = append(out, IdPWarning{Kind: "no_claims", Message: fmt.Sprintf(
			"%d of the last %d sign-ins sent none of the claims the mapping reads (%s): those people got no roles from the identity provider.", noClaims, n, claims)})
	}
	return out
}

// ---- JSON API

// IdPMappingRequest is the body of POST and PUT /api/v1/idp-mappings.
type IdPMappingRequest struct {
	Claim   string `json:"claim"`
	Match   string `json:"match"`
	Pattern string `json:"pattern"`
	Grant   string `json:"grant"`
	Team    string `json:"team"`
	Note    string `json:"note"`
}

func (r IdPMappingRequest) mapping() store.IdPMapping {
	return store.IdPMapping{Claim: r.Claim, Match: r.Match, Pattern: r.Pattern, Grant: r.Grant, Team: r.Team}
}

// IdPMappingsJSON is the body of GET /api/v1/idp-mappings: the table's
// rules, and, while it has none, the built-in ones in force.
type IdPMappingsJSON struct {
	Rules []store.IdPMapping `json:"rules"`
	// Defaults: the table is empty and the --oidc-* flags' built-in
	// mapping (DefaultRules) is in force.
	Defaults     bool               `json:"defaults_in_force"`
	DefaultRules []store.IdPMapping `json:"default_rules"`
}

func (s *Server) idpMappingsJSON(ctx context.Context) (IdPMappingsJSON, error) {
	rules, err := s.st.ListIdPMappings(ctx)
	if err != nil {
		return IdPMappingsJSON{}, err
	}
	out := IdPMappingsJSON{Rules: rules, Defaults: len(rules) == 0, DefaultRules: []store.IdPMapping{}}
	for _, r := range s.cfg.OIDC.Claims.DefaultRules() {
		out.DefaultRules = append(out.DefaultRules, r.IdPMapping)
	}
	return out, nil
}

func (s *Server) apiListIdPMappings(c echo.Context) error {
	out, err := s.idpMappingsJSON(c.Request().Context())
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, out)
}

func (s *Server) apiCreateIdPMapping(c echo.Context) error {
	u, req, err := userAndBody[IdPMappingRequest](c)
	if err != nil {
		return err
	}
	m, r, err := s.st.CreateIdPMapping(c.Request().Context(), u.Email, req.mapping(), req.Note)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Location", "/api/v1/idp-mappings/"+strconv.FormatInt(m.ID, 10))
	return writeJSON(c, http.StatusCreated, changeJSON(r, m))
}

// idpMappingID reads the :id of the path; anything but a positive number
// is a rule that does not exist.
func idpMappingID(c echo.Context) (int64, error) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id < 1 {
		return 0, allot.Errorf(allot.ENotFound, "no identity-provider mapping %q", c.Param("id"))
	}
	return id, nil
}

func (s *Server) apiUpdateIdPMapping(c echo.Context) error {
	u, req, err := userAndBody[IdPMappingRequest](c)
	if err != nil {
		return err
	}
	id, err := idpMappingID(c)
	if err != nil {
		return err
	}
	m, r, err := s.st.UpdateIdPMapping(c.Request().Context(), u.Email, id, req.mapping(), req.Note)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, changeJSON(r, m))
}

// apiDeleteIdPMapping removes a rule; the note for the audit log is the
// note query parameter or an optional {"note": …} body.
func (s *Server) apiDeleteIdPMapping(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	body, err := optionalBody[struct {
		Note string `json:"note"`
	}](c)
	if err != nil {
		return err
	}
	id, err := idpMappingID(c)
	if err != nil {
		return err
	}
	note := body.Note
	if note == "" {
		note = c.QueryParam("note")
	}
	m, r, err := s.st.DeleteIdPMapping(c.Request().Context(), u.Email, id, note)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, changeJSON(r, m))
}

// IdPSignInsJSON is the body of GET /api/v1/idp-sign-ins: the warnings
// and what the latest sign-ins sent (claim names and counts, not values).
type IdPSignInsJSON struct {
	Warnings []IdPWarning       `json:"warnings"`
	Reads    []string           `json:"claims_read"`
	Scopes   []string           `json:"scopes"`
	SignIns  []store.OIDCSignIn `json:"sign_ins"`
}

func (s *Server) idpSignIns(ctx context.Context) (IdPSignInsJSON, error) {
	signIns, err := s.st.RecentOIDCSignIns(ctx, 50)
	if err != nil {
		return IdPSignInsJSON{}, err
	}
	rules, err := s.idpRules(ctx, s.cfg.OIDC.Claims)
	if err != nil {
		return IdPSignInsJSON{}, err
	}
	out := IdPSignInsJSON{Reads: ruleClaims(rules), SignIns: signIns, Scopes: []string{}}
	out.Warnings = idpWarnings(signIns, out.Reads)
	if out.Warnings == nil {
		out.Warnings = []IdPWarning{}
	}
	if s.oidc != nil {
		out.Scopes = s.oidc.scopes()
	}
	return out, nil
}

func (s *Server) apiIdPSignIns(c echo.Context) error {
	out, err := s.idpSignIns(c.Request().Context())
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, out)
}

// IdPTryRequest is the body of POST /api/v1/idp-mappings/try: a token's
// claims (as a JSON object), to see what the rules in force give them.
type IdPTryRequest struct {
	Claims map[string]any `json:"claims"`
}

// IdPTryJSON is what the rules in force give the claims; nothing changes.
type IdPTryJSON struct {
	Admin       bool               `json:"admin"`
	Finance     bool               `json:"finance"`
	Memberships []allot.Membership `json:"memberships"`
	Roles       string             `json:"roles"`
	Matched     int                `json:"matched"`
	ClaimsRead  []string           `json:"claims_read"`
	ClaimCounts map[string]int     `json:"claim_counts"`
	Overage     []string           `json:"overage"`
	// BuiltIn: the table is empty and the built-in mapping was used.
	BuiltIn bool `json:"built_in"`
}

func (s *Server) tryMapping(ctx context.Context, claims map[string]any) (IdPTryJSON, error) {
	stored, err := s.st.IdPRules(ctx)
	if err != nil {
		return IdPTryJSON{}, err
	}
	rules := stored
	if len(rules) == 0 {
		rules = s.cfg.OIDC.Claims.DefaultRules()
	}
	res, counts, over := mapClaims(rules, mappableClaims(claims))
	out := IdPTryJSON{Admin: res.Admin, Finance: res.Finance, Memberships: res.Memberships, Matched: res.Matched,
		ClaimsRead: ruleClaims(rules), ClaimCounts: counts, Overage: over, BuiltIn: len(stored) == 0}
	if out.Memberships == nil {
		out.Memberships = []allot.Membership{}
	}
	if out.Overage == nil {
		out.Overage = []string{}
	}
	out.Roles = rolesSummary(&allot.User{Admin: res.Admin, Finance: res.Finance, Memberships: res.Memberships})
	return out, nil
}

// apiTryIdPMappings shows what the rules in force give a token's claims.
func (s *Server) apiTryIdPMappings(c echo.Context) error {
	_, req, err := userAndBody[IdPTryRequest](c)
	if err != nil {
		return err
	}
	if req.Claims == nil {
		return (allot.FieldErrors{"claims": "is required: the claims of an ID token, as a JSON object"}).Err()
	}
	out, err := s.tryMapping(c.Request().Context(), req.Claims)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, out)
}

// adminTryForm shows on the page what the rules give pasted claims.
func (s *Server) adminTryForm(c echo.Context) error {
	raw := c.FormValue("claims")
	a := views.AdminIdentity{Try: views.IdPTry{Claims: raw, Errors: map[string]string{}}}
	var claims map[string]any
	if err := json.Unmarshal([]byte(raw), &claims); err != nil || claims == nil {
		a.Try.Errors["claims"] = "must be a JSON object of claims, e.g. {\"groups\": [\"/teams/nlp\"]}"
		return s.renderIdentity(c, http.StatusUnprocessableEntity, a)
	}
	out, err := s.tryMapping(c.Request().Context(), claims)
	if err != nil {
		return err
	}
	var counts []string
	for _, k := range out.ClaimsRead {
		if n, ok := out.ClaimCounts[k]; ok {
			counts = append(counts, fmt.Sprintf("%s: %d", k, n))
		} else {
			counts = append(counts, k+": absent")
		}
	}
	a.Try.Result = fmt.Sprintf("%s (%d values matched; %s)", out.Roles, out.Matched, strings.Join(counts, ", "))
	if len(out.Overage) > 0 {
		a.Try.Result += "; overage marker for " + strings.Join(out.Overage, ", ") + ": those claims give nothing"
	}
	return s.renderIdentity(c, http.StatusOK, a)
}

// OIDCLinkRequest is the body of POST /api/v1/users/{user}/oidc-link: the
// identity (the ID token's iss and sub) that signs in as the user.
type OIDCLinkRequest struct {
	Issuer  string `json:"issuer"`
	Subject string `json:"subject"`
	Note    string `json:"note"`
}

// apiLinkOIDC binds an identity to the user named by :user (id or email),
// audited as user.oidc_link.
func (s *Server) apiLinkOIDC(c echo.Context) error {
	u, req, err := userAndBody[OIDCLinkRequest](c)
	if err != nil {
		return err
	}
	id, r, err := s.st.LinkOIDCIdentity(c.Request().Context(), u.Email, c.Param("user"), req.Issuer, req.Subject, req.Note)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, changeJSON(r, id))
}

// ---- Portal: /admin/identity

func (s *Server) adminIdentityPage(c echo.Context) error {
	a := views.AdminIdentity{}
	switch c.QueryParam("done") {
	case "created":
		a.Saved = "Added the rule."
	case "updated":
		a.Saved = "Saved the rule."
	case "same":
		a.Saved = "No change: the rule already had these values."
	case "deleted":
		a.Saved = "Deleted the rule."
	case "linked":
		a.Saved = "Linked the identity to " + c.QueryParam("who") + "; their sessions were ended."
	case "unchanged-link":
		a.Saved = "No change: " + c.QueryParam("who") + " already signs in with this identity."
	}
	return s.renderIdentity(c, http.StatusOK, a)
}

// renderIdentity shows the page; a.Edit/a.New/a.Link keep what was typed
// after an error.
func (s *Server) renderIdentity(c echo.Context, status int, a views.AdminIdentity) error {
	ctx := c.Request().Context()
	a.Page = s.page(c, "Identity · Admin")
	a.SSO = s.cfg.OIDC.Enabled()
	a.Issuer = s.cfg.OIDC.Issuer
	a.LinkIssuers = s.cfg.OIDC.LinkEmailIssuers
	a.MatchKinds, a.Grants = store.MatchKinds, store.Grants
	ms, err := s.idpMappingsJSON(ctx)
	if err != nil {
		return err
	}
	a.Defaults = ms.Defaults
	for _, r := range ms.DefaultRules {
		a.DefaultRules = append(a.DefaultRules, ruleRow(r))
	}
	for _, r := range ms.Rules {
		row := ruleRow(r)
		if a.Edit != nil && a.Edit.ID == r.ID {
			row = *a.Edit
		}
		a.Rules = append(a.Rules, row)
	}
	if a.New.Errors == nil {
		a.New = views.IdPRuleRow{Claim: s.cfg.OIDC.Claims.WithDefaults().GroupsClaim, Match: store.MatchExact, Grant: store.GrantMember, Errors: map[string]string{}}
	}
	si, err := s.idpSignIns(ctx)
	if err != nil {
		return err
	}
	a.Scopes = strings.Join(si.Scopes, " ")
	a.Reads = strings.Join(si.Reads, ", ")
	for _, w := range si.Warnings {
		a.Warnings = append(a.Warnings, views.IdPWarningRow{Kind: w.Kind, Message: w.Message})
	}
	for _, x := range si.SignIns {
		var counts []string
		for _, k := range si.Reads {
			if n, ok := x.ClaimCounts[k]; ok {
				counts = append(counts, fmt.Sprintf("%s: %d", k, n))
			} else {
				counts = append(counts, k+": absent")
			}
		}
		row := views.IdPSignInRow{ID: x.ID, At: x.At.UTC().Format("2006-01-02 15:04:05"), Email: x.Email, Issuer: x.Issuer, Subject: x.Subject,
			Outcome: x.Outcome, Detail: x.Detail, Claims: strings.Join(x.ClaimNames, ", "), Counts: strings.Join(counts, ", "),
			Matched: x.Matched, Overage: x.Overage, Roles: x.Roles, LinkTo: x.Email, Errors: map[string]string{}}
		if a.Link != nil && a.Link.ID == x.ID {
			row.LinkTo, row.Note, row.Errors = a.Link.LinkTo, a.Link.Note, a.Link.Errors
		}
		a.SignIns = append(a.SignIns, row)
	}
	return render(c, status, views.AdminIdentityView(a))
}

func ruleRow(r store.IdPMapping) views.IdPRuleRow {
	return views.IdPRuleRow{ID: r.ID, Claim: r.Claim, Match: r.Match, Pattern: r.Pattern, Grant: r.Grant, Team: r.Team,
		UpdatedBy: r.UpdatedBy, Errors: map[string]string{}}
}

func ruleForm(c echo.Context) (store.IdPMapping, string) {
	return store.IdPMapping{Claim: c.FormValue("claim"), Match: c.FormValue("match"), Pattern: c.FormValue("pattern"),
		Grant: c.FormValue("grant"), Team: c.FormValue("team")}, c.FormValue("note")
}

func (s *Server) adminIdPRuleCreateForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	m, note := ruleForm(c)
	_, _, err = s.st.CreateIdPMapping(c.Request().Context(), u.Email, m, note)
	if err == nil {
		return redirect(c, "/admin/identity?done=created#rules")
	}
	errs, err := formErrors(err)
	if err != nil {
		return err
	}
	row := ruleRow(m)
	row.Note, row.Errors = note, errs
	return s.renderIdentity(c, http.StatusUnprocessableEntity, views.AdminIdentity{New: row})
}

func (s *Server) adminIdPRuleUpdateForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	id, err := idpMappingID(c)
	if err != nil {
		return err
	}
	m, note := ruleForm(c)
	_, r, err := s.st.UpdateIdPMapping(c.Request().Context(), u.Email, id, m, note)
	if err == nil {
		done := "updated"
		if !r.Changed {
			done = "same"
		}
		return redirect(c, fmt.Sprintf("/admin/identity?done=%s#rule-%d", done, id))
	}
	errs, err := formErrors(err)
	if err != nil {
		return err
	}
	m.ID = id
	row := ruleRow(m)
	row.Note, row.Errors = note, errs
	return s.renderIdentity(c, http.StatusUnprocessableEntity, views.AdminIdentity{Edit: &row})
}

func (s *Server) adminIdPRuleDeleteForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	id, err := idpMappingID(c)
	if err != nil {
		return err
	}
	if _, _, err := s.st.DeleteIdPMapping(c.Request().Context(), u.Email, id, c.FormValue("note")); err != nil {
		return err
	}
	return redirect(c, "/admin/identity?done=deleted#rules")
}

// adminLinkForm links a sign-in to the account named by the form's user
// field (an email address or id), from the page's list of sign-ins.
func (s *Server) adminLinkForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	issuer, subject, note := c.FormValue("issuer"), c.FormValue("subject"), c.FormValue("note")
	target := strings.TrimSpace(c.FormValue("user"))
	var id store.OIDCIdentity
	var r store.AdminResult
	if target == "" {
		err = (allot.FieldErrors{"user": "is required: the email address of the Allot account to link"}).Err()
	} else {
		id, r, err = s.st.LinkOIDCIdentity(c.Request().Context(), u.Email, target, issuer, subject, note)
		if allot.ErrorCode(err) == allot.ENotFound {
			err = (allot.FieldErrors{"user": fmt.Sprintf("no Allot account %q", target)}).Err()
		}
	}
	if err == nil {
		done := "linked"
		if !r.Changed {
			done = "unchanged-link"
		}
		return redirect(c, "/admin/identity?done="+done+"&who="+url.QueryEscape(id.Email)+"#sign-ins")
	}
	errs, err := formErrors(err)
	if err != nil {
		return err
	}
	signIn, _ := strconv.ParseInt(c.FormValue("sign_in"), 10, 64)
	return s.renderIdentity(c, http.StatusUnprocessableEntity, views.AdminIdentity{Link: &views.IdPSignInRow{ID: signIn, LinkTo: target, Issuer: issuer, Subject: subject, Note: note, Errors: errs}})
}
