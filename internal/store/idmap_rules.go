package store

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// The identity-provider mapping: rules from claim values to Allot roles
// (issue 17). A rule reads one claim of the ID token (or userinfo), matches
// each of its values, and grants a role when one matches.

// Match kinds.
const (
	MatchExact = "exact" // the value, case-sensitive
	MatchPath  = "path"  // a Keycloak group path, /teams/{team}/lead; * is any one segment
	MatchGUID  = "guid"  // an Entra ID object id, case-insensitive
	MatchGlob  = "glob"  // * any run, ? one character, {team} captures the team
	MatchRegex = "regex" // RE2, anchored; {team} or (?P<team>…) captures the team
)

// Grants.
const (
	GrantAdmin   = "admin"
	GrantFinance = "finance"
	GrantMember  = "member"
	GrantLead    = "lead"
)

// MatchKinds and Grants list the allowed values in the order the portal
// offers them.
var (
	MatchKinds = []string{MatchExact, MatchPath, MatchGUID, MatchGlob, MatchRegex}
	Grants     = []string{GrantAdmin, GrantFinance, GrantMember, GrantLead}
)

// IdPMapping is one rule.
type IdPMapping struct {
	ID      int64  `json:"id"`
	Claim   string `json:"claim"`
	Match   string `json:"match"`
	Pattern string `json:"pattern"`
	Grant   string `json:"grant"`
	// Team is the team a member/lead rule grants; "" when the pattern
	// captures it ({team}).
	Team      string    `json:"team"`
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by"`
}

// Rule is a checked, compiled rule.
type Rule struct {
	IdPMapping
	re      *regexp.Regexp // glob and regex
	segs    []string       // path
	capture bool           // the pattern captures the team
}

const teamToken = "{team}"

var (
	guidRE      = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	claimNameRE = regexp.MustCompile(`^[\x21-\x7e]{1,200}$`) // printable ASCII, no spaces
)

// Normalize trims the fields and lowercases what is case-insensitive.
func (m IdPMapping) Normalize() IdPMapping {
	m.Claim, m.Match, m.Pattern = strings.TrimSpace(m.Claim), strings.ToLower(strings.TrimSpace(m.Match)), strings.TrimSpace(m.Pattern)
	m.Grant, m.Team = strings.ToLower(strings.TrimSpace(m.Grant)), strings.TrimSpace(m.Team)
	if m.Match == MatchGUID {
		m.Pattern = strings.ToLower(m.Pattern)
	}
	if m.Match == MatchPath && m.Pattern != "/" {
		m.Pattern = strings.TrimSuffix(m.Pattern, "/")
	}
	return m
}

// Compile checks the rule and prepares its matcher; problems are field
// errors (claim, match, pattern, grant, team).
func (m IdPMapping) Compile() (*Rule, error) {
	m = m.Normalize()
	f := allot.FieldErrors{}
	if !claimNameRE.MatchString(m.Claim) {
		f.Add("claim", "is required: the claim's name, e.g. groups or roles (printable characters, no spaces, at most 200)")
	}
	if !slices.Contains(Grants, m.Grant) {
		f.Add("grant", "must be one of %s", strings.Join(Grants, ", "))
	}
	r := &Rule{IdPMapping: m}
	switch {
	case !slices.Contains(MatchKinds, m.Match):
		f.Add("match", "must be one of %s", strings.Join(MatchKinds, ", "))
	case m.Pattern == "":
		f.Add("pattern", "is required")
	case len(m.Pattern) > 500:
		f.Add("pattern", "is too long (at most 500 characters)")
	case strings.Count(m.Pattern, teamToken) > 1:
		f.Add("pattern", "may capture the team ({team}) only once")
	default:
		if msg := r.compile(); msg != "" {
			f.Add("pattern", "%s", msg)
		}
	}
	if _, bad := f["pattern"]; !bad && f["grant"] == "" {
		team := m.Grant == GrantMember || m.Grant == GrantLead
		switch {
		case !team && r.capture:
			f.Add("pattern", "captures a team, but %s is not a team role: remove {team}, or grant member or lead", m.Grant)
		case !team && m.Team != "":
			f.Add("team", "must be empty for %s (only member and lead rules name a team)", m.Grant)
		case team && r.capture && m.Team != "":
			f.Add("team", "must be empty: the pattern's {team} names the team")
		case team && !r.capture && m.Team == "":
			f.Add("team", "is required for %s, unless the pattern captures it with {team}", m.Grant)
		case team && !r.capture && !allot.ValidSlug(m.Team):
			f.Add("team", "%q is not a team slug", m.Team)
		}
	}
	if len(f) > 0 {
		return nil, f.Err()
	}
	return r, nil
}

// compile prepares the matcher, returning a problem with the pattern.
func (r *Rule) compile() string {
	p := r.Pattern
	switch r.Match {
	case MatchExact:
		// {team} in an exact name is literal.
	case MatchGUID:
		if !guidRE.MatchString(p) {
			return "is not a GUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx), as Entra ID names groups and app roles by object id"
		}
	case MatchPath:
		if !strings.HasPrefix(p, "/") {
			return "a group path starts with /, e.g. /teams/{team}/lead"
		}
		r.segs = strings.Split(strings.TrimPrefix(p, "/"), "/")
		for _, s := range r.segs {
			if s == "" {
				return "has an empty segment (//)"
			}
			if s == teamToken {
				r.capture = true
			} else if strings.Contains(s, teamToken) {
				return "{team} must be a whole segment of the path, e.g. /teams/{team}"
			}
		}
	case MatchGlob:
		var b strings.Builder
		b.WriteString("^")
		for i := 0; i < len(p); {
			switch {
			case strings.HasPrefix(p[i:], teamToken):
				b.WriteString(`(?P<team>.+?)`)
				r.capture = true
				i += len(teamToken)
			case p[i] == '*':
				b.WriteString(`.*`)
				i++
			case p[i] == '?':
				b.WriteString(`.`)
				i++
			default:
				j := i + 1
				for j < len(p) && p[j] != '*' && p[j] != '?' && !strings.HasPrefix(p[j:], teamToken) {
					j++
				}
				b.WriteString(regexp.QuoteMeta(p[i:j]))
				i = j
			}
		}
		b.WriteString("$")
		r.re = regexp.MustCompile(b.String())
	case MatchRegex:
		src := strings.Replace(p, teamToken, `(?P<team>[^/:]+)`, 1)
		re, err := regexp.Compile(`^(?:` + src + `)$`)
		if err != nil {
			return "is not a valid regular expression: " + strings.TrimPrefix(err.Error(), "error parsing regexp: ")
		}
		n := 0
		for _, name := range re.SubexpNames() {
			if name == "team" {
				n++
			}
		}
		if n > 1 {
			return "may have only one team group"
		}
		r.re, r.capture = re, n == 1
	}
	return ""
}

// Matches says whether value matches and, for a pattern that captures the
// team, which team (lowercased; "" when it is not a team slug, which is no
// match).
func (r *Rule) Matches(value string) (ok bool, team string) {
	switch r.Match {
	case MatchExact, MatchGUID:
		if value == r.Pattern || r.Match == MatchGUID && strings.EqualFold(strings.TrimSpace(value), r.Pattern) {
			return true, r.Team
		}
		return false, ""
	case MatchPath:
		v := strings.TrimPrefix(strings.TrimSuffix(value, "/"), "/")
		if !strings.HasPrefix(value, "/") {
			return false, ""
		}
		got := strings.Split(v, "/")
		if len(got) != len(r.segs) {
			return false, ""
		}
		team = r.Team
		for i, s := range r.segs {
			switch s {
			case "*":
			case teamToken:
				team = got[i]
			default:
				if got[i] != s {
					return false, ""
				}
			}
		}
	case MatchGlob, MatchRegex:
		m := r.re.FindStringSubmatch(value)
		if m == nil {
			return false, ""
		}
		team = r.Team
		if r.capture {
			team = m[r.re.SubexpIndex("team")]
		}
	default:
		return false, ""
	}
	if r.capture {
		team = strings.ToLower(team)
		if !allot.ValidSlug(team) {
			return false, ""
		}
	}
	return true, team
}

// RoleResult is what a set of rules gives a person.
type RoleResult struct {
	Admin, Finance bool
	Memberships    []allot.Membership
	// Matched counts the claim values that matched at least one rule.
	Matched int
}

// ApplyRules grants what the rules say for the values of each claim
// (values(claim)); a lead grant wins over a member grant of the same team,
// and a value that grants a lead grants no membership.
func ApplyRules(rules []*Rule, values func(claim string) []string) RoleResult {
	var res RoleResult
	roles := map[string]string{}
	byClaim := map[string][]*Rule{}
	var claims []string
	for _, r := range rules {
		if _, ok := byClaim[r.Claim]; !ok {
			claims = append(claims, r.Claim)
		}
		byClaim[r.Claim] = append(byClaim[r.Claim], r)
	}
	for _, c := range claims {
		for _, v := range values(c) {
			hit, lead := false, false
			var members []string
			for _, r := range byClaim[c] {
				ok, team := r.Matches(v)
				if !ok {
					continue
				}
				hit = true
				switch r.Grant {
				case GrantAdmin:
					res.Admin = true
				case GrantFinance:
					res.Finance = true
				case GrantLead:
					roles[team], lead = allot.TeamRoleLead, true
				case GrantMember:
					members = append(members, team)
				}
			}
			// A value that makes a lead is not also a membership (team:nlp:lead
			// is not team "nlp:lead" under team:{team}).
			for _, team := range members {
				if !lead && roles[team] != allot.TeamRoleLead {
					roles[team] = allot.TeamRoleMember
				}
			}
			if hit {
				res.Matched++
			}
		}
	}
	for team, role := range roles {
		res.Memberships = append(res.Memberships, allot.Membership{Team: team, Role: role})
	}
	slices.SortFunc(res.Memberships, func(a, b allot.Membership) int { return strings.Compare(a.Team, b.Team) })
	return res
}

// String is the rule in one line, for logs and the audit log.
func (m IdPMapping) String() string {
	to := m.Grant
	if m.Grant == GrantMember || m.Grant == GrantLead {
		team := m.Team
		if team == "" {
			team = teamToken
		}
		to = fmt.Sprintf("%s of %s", m.Grant, team)
	}
	return fmt.Sprintf("%s %s %q → %s", m.Claim, m.Match, m.Pattern, to)
}
