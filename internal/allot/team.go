package allot

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"
)

var slugRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,30}[a-z0-9]$`)

// ValidSlug reports whether s is a valid team slug: 2–32 lower-case letters,
// digits and dashes, starting with a letter.
func ValidSlug(s string) bool { return slugRE.MatchString(s) }

// Team is a group that submits jobs, owns a budget and has guarantees.
type Team struct {
	Slug       string
	Name       string
	CostCenter string
	// MonthlyBudgetGPUHours is the team's monthly GPU-hour budget; 0 means
	// no budget is set (no quota warnings, never demoted).
	MonthlyBudgetGPUHours int64
	// Guarantees are the GPUs the team can always get back, by GPU type.
	Guarantees map[string]int
	// FairShareWeight is the team's raw fair-share shares (≥ 1).
	FairShareWeight int
	// PosixAccount is the team's service account: the POSIX account its
	// jobs run as when their submitter has none ("" = none).
	PosixAccount string
	CreatedAt    time.Time
}

// Validate checks the team's own fields.
func (t *Team) Validate() error {
	f := FieldErrors{}
	if !ValidSlug(t.Slug) {
		f.Add("slug", "must be 2–32 lower-case letters, digits or dashes, starting with a letter")
	}
	if strings.TrimSpace(t.Name) == "" {
		f.Add("name", "is required")
	}
	if strings.TrimSpace(t.CostCenter) == "" {
		f.Add("cost_center", "is required")
	}
	if t.MonthlyBudgetGPUHours < 0 || t.MonthlyBudgetGPUHours > MaxGPUHours {
		f.Add("monthly_budget_gpu_hours", "must be between 0 and %d", MaxGPUHours)
	}
	for _, typ := range slices.Sorted(maps.Keys(t.Guarantees)) {
		if n := t.Guarantees[typ]; n < 0 || n > MaxGPUs {
			f.Add("guarantees", "guarantee for %s must be between 0 and %d", typ, MaxGPUs)
		}
	}
	if t.FairShareWeight < 1 || t.FairShareWeight > MaxWeight {
		f.Add("fair_share_weight", "must be between 1 and %d", MaxWeight)
	}
	if t.PosixAccount != "" {
		if msg := POSIXAccountProblem(t.PosixAccount); msg != "" {
			f.Add("posix_account", "%s", msg)
		}
	}
	return f.Err()
}

// Global roles.
const (
	RoleAdmin   = "admin"
	RoleFinance = "finance"
)

// Team roles.
const (
	TeamRoleMember = "member"
	TeamRoleLead   = "lead"
)

// User is a person, identified by their OIDC subject.
type User struct {
	ID          int64
	OIDCSubject string
	Email       string
	Name        string
	Admin       bool
	Finance     bool
	Memberships []Membership
	// PosixUser is the POSIX account an admin mapped the user to ("" =
	// none); OIDCPosixUser the one the identity provider's account claim
	// gave at the last sign-in. Jobs resolve their account from these
	// (ResolveAccount); they are loaded by GetUser and UserByEmail.
	PosixUser     string
	OIDCPosixUser string
}

// Membership is a user's role in one team.
type Membership struct {
	Team string
	Role string // TeamRoleMember or TeamRoleLead
}

// Validate checks the user's own fields.
func (u *User) Validate() error {
	f := FieldErrors{}
	if strings.TrimSpace(u.OIDCSubject) == "" {
		f.Add("oidc_subject", "is required")
	}
	if at := strings.Index(u.Email, "@"); at < 1 || at == len(u.Email)-1 || strings.ContainsAny(u.Email, " \t") {
		f.Add("email", "must be an email address")
	}
	if strings.TrimSpace(u.Name) == "" {
		f.Add("name", "is required")
	}
	for field, a := range map[string]string{"posix_user": u.PosixUser, "oidc_posix_user": u.OIDCPosixUser} {
		if a != "" {
			if msg := POSIXAccountProblem(a); msg != "" {
				f.Add(field, "%s", msg)
			}
		}
	}
	for _, m := range u.Memberships {
		if !ValidSlug(m.Team) {
			f.Add("memberships", "unknown team %q", m.Team)
		}
		if m.Role != TeamRoleMember && m.Role != TeamRoleLead {
			f.Add("memberships", "role must be member or lead, got %q", m.Role)
		}
	}
	return f.Err()
}

// MemberOf reports whether u belongs to team (as member or lead).
func (u *User) MemberOf(team string) bool {
	for _, m := range u.Memberships {
		if m.Team == team {
			return true
		}
	}
	return false
}

// LeadOf reports whether u leads team.
func (u *User) LeadOf(team string) bool {
	for _, m := range u.Memberships {
		if m.Team == team && m.Role == TeamRoleLead {
			return true
		}
	}
	return false
}

// CanSubmitFor reports whether u may submit jobs for team: members and
// leads of the team, and admins.
func (u *User) CanSubmitFor(team string) bool { return u.Admin || u.MemberOf(team) }

// Teams lists the slugs of u's teams in the order stored.
func (u *User) Teams() []string {
	out := make([]string, len(u.Memberships))
	for i, m := range u.Memberships {
		out[i] = m.Team
	}
	return out
}

// GPUType is a kind of GPU with its price.
type GPUType struct {
	Name     string // e.g. "A100-80GB", "T4"
	MemoryGB int
	// HourlyRate is the current price of one GPU-hour at multiplier 1.
	HourlyRate Money
	// Backend is the engine that runs this pool's jobs: BackendNative
	// ("" means native) or BackendSlurm. Set at creation.
	Backend string
}

var gpuTypeRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$`)

// Validate checks the GPU type's fields.
func (g *GPUType) Validate() error {
	f := FieldErrors{}
	if !gpuTypeRE.MatchString(g.Name) {
		f.Add("name", "must be 1–32 letters, digits, dots, dashes or underscores")
	}
	if g.Backend != "" && g.Backend != BackendNative && g.Backend != BackendSlurm {
		f.Add("backend", "must be native (Allot's agents) or slurm (a Slurm cluster)")
	}
	if g.MemoryGB <= 0 || g.MemoryGB > MaxMemoryGB {
		f.Add("memory_gb", "must be between 1 and %d", MaxMemoryGB)
	}
	if g.HourlyRate.Micros < 0 {
		f.Add("hourly_rate", "must not be negative")
	}
	if !validCurrency(g.HourlyRate.Currency) {
		f.Add("currency", "must be a three-letter ISO 4217 code")
	}
	return f.Err()
}
