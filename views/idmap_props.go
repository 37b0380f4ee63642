package views

// AdminIdentity is /admin/identity: the identity-provider mapping, what
// recent sign-ins sent, and linking a sign-in to an account.
type AdminIdentity struct {
	Page
	SSO          bool
	Issuer       string
	Scopes       string   // the scopes sign-ins ask for ("" until discovered)
	LinkIssuers  []string // --oidc-link-email-issuers
	Reads        string   // the claims the mapping reads
	MatchKinds   []string
	Grants       []string
	Defaults     bool // the table is empty: the built-in rules are in force
	DefaultRules []IdPRuleRow
	Rules        []IdPRuleRow
	New          IdPRuleRow
	Edit         *IdPRuleRow   // the rule whose form had errors
	Link         *IdPSignInRow // the link form that had errors
	Try          IdPTry
	Warnings     []IdPWarningRow
	SignIns      []IdPSignInRow
	Saved        string
}

// IdPRuleRow is one rule and its form.
type IdPRuleRow struct {
	ID                                 int64
	Claim, Match, Pattern, Grant, Team string
	UpdatedBy, Note                    string
	Errors                             map[string]string
}

// IdPWarningRow is a warning about what the provider sends.
type IdPWarningRow struct{ Kind, Message string }

// IdPSignInRow is one recent sign-in.
type IdPSignInRow struct {
	ID                                     int64
	At, Email, Issuer, Subject             string
	Outcome, Detail, Claims, Counts, Roles string
	Matched                                int
	Overage                                bool
	LinkTo, Note                           string // the link form
	Errors                                 map[string]string
}

// linkForm is the bottom link form: what was typed after an error there
// (Link with ID 0), else empty with the configured issuer.
func (a AdminIdentity) linkForm() IdPSignInRow {
	if a.Link != nil && a.Link.ID == 0 {
		return *a.Link
	}
	return IdPSignInRow{Issuer: a.Issuer, Errors: map[string]string{}}
}

// IdPTry is the form that shows what the rules give pasted claims.
type IdPTry struct {
	Claims, Result string
	Errors         map[string]string
}
