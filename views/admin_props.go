package views

// Props of the admin pages (policy editing, audit log, policy versions) and
// of the policy documentation. Package web builds them from the store.

// AdminTab is one tab of the admin section.
type AdminTab struct {
	Href, Label, Key string
}

// AdminTabs lists the admin section's tabs in order. Nodes are edited on
// /nodes.
var AdminTabs = []AdminTab{
	{"/admin", "Overview", "overview"},
	{"/admin/tiers", "Tiers", "tiers"},
	{"/admin/gpu-types", "GPU types", "gpu-types"},
	{"/admin/rates", "Rate card", "rates"},
	{"/admin/teams", "Teams", "teams"},
	{"/admin/policy", "Policy weights", "policy"},
	{"/admin/health", "Health rules", "health"},
	{"/admin/users", "People", "users"},
	{"/admin/accounts", "Accounts", "accounts"},
	{"/admin/identity", "Identity", "identity"},
	{"/admin/node-tokens", "Node tokens", "node-tokens"},
	{"/admin/slurm", "Slurm", "slurm"},
	{"/admin/audit", "Audit log", "audit"},
	{"/admin/versions", "Policy versions", "versions"},
	{"/nodes", "Nodes", "nodes"},
}

// AdminOverview is /admin.
type AdminOverview struct {
	Page
	Version   int64
	VersionAt string
	VersionBy string
	Comment   string
	Tiers     int
	GPUTypes  int
	Teams     int
	Recent    []AuditRow
}

// TierForm is one tier's edit form with what was typed and its errors.
type TierForm struct {
	ID         string
	Name       string // as stored (the heading)
	Multiplier string // as stored
	Values     TierFormValues
	Errors     map[string]string
	Saved      string // a confirmation after a save
	Since      string // the current multiplier is in force since
	Preempts   []Option
}

// TierFormValues are a tier form's fields as typed.
type TierFormValues struct {
	Name, Description, ClassOrder, Multiplier, MaxRuntime, ReservedGPUs, Note string
	MayPreempt                                                                map[string]bool
}

// AdminTiers is /admin/tiers.
type AdminTiers struct {
	Page
	Tiers []TierForm
}

// RateRow is one rate version.
type RateRow struct {
	Rate, EffectiveFrom, Recorded string
	InForce, Future               bool
}

// RateForm is one GPU type's rate form and history.
type RateForm struct {
	GPUType  string
	Current  string // the rate in force now, with currency
	Values   RateFormValues
	Errors   map[string]string
	Saved    string
	History  []RateRow
	Currency string
}

// RateFormValues are a rate form's fields as typed.
type RateFormValues struct {
	Rate, EffectiveFrom, Note string
}

// AdminRates is /admin/rates.
type AdminRates struct {
	Page
	Types []RateForm
}

// TeamForm is one team's edit form (or the create form when Slug is "").
type TeamForm struct {
	Slug   string
	Name   string
	Values TeamFormValues
	Errors map[string]string
	Saved  string
}

// TeamFormValues are a team form's fields as typed.
type TeamFormValues struct {
	Slug, Name, CostCenter, Budget, Weight, Webhook, Note string
	Guarantees                                            []Option // Value: GPU type, Label: GPUs as typed
	PosixAccount                                          string   // the team's service account
}

// AdminTeams is /admin/teams.
type AdminTeams struct {
	Page
	Teams []TeamForm
	New   TeamForm
}

// PolicyField is one input of the policy-weights form.
type PolicyField struct {
	Name  string // the form and JSON name, e.g. grace_period_s
	Label string
	Help  string
	Value string // as typed or as stored ("2m" for durations)
	Kind  string // "int", "duration", "money", "choice", "bool" (Value "true" or "false")
	// Options are a choice's values.
	Options []string
}

// PolicyGroup is a fieldset of the policy-weights form.
type PolicyGroup struct {
	Legend string
	Fields []PolicyField
}

// AdminPolicy is /admin/policy.
type AdminPolicy struct {
	Page
	Version int64
	Groups  []PolicyGroup
	Note    string
	Errors  map[string]string
	Saved   string
}

// FieldChange is one changed field of an audit entry or a policy version.
type FieldChange struct {
	Field, Before, After string
}

// AuditRow is one audit-log entry as shown.
type AuditRow struct {
	ID            int64
	At            string
	Actor         string
	Action        string
	Object        string
	PolicyVersion int64
	Changes       []FieldChange
	Note          string
}

// AuditFilterValues are the audit page's filters as typed.
type AuditFilterValues struct {
	Kind, Actor, Since, Until string
}

// AuditPage is /admin/audit.
type AuditPage struct {
	Page
	Filter    AuditFilterValues
	Kinds     []Option
	Actors    []Option
	Entries   []AuditRow
	Error     string // a filter that could not be read
	Truncated bool   // more entries than shown: narrow the filters or export
	JSONURL   string
	CSVURL    string
}

// VersionRow is one policy version and what made it.
type VersionRow struct {
	Version int64
	At, By  string
	Comment string
	Changes []FieldChange // policy settings changed from the version before
	Entries []AuditRow    // the audit entries that name this version
}

// PolicyVersions is /admin/versions.
type PolicyVersions struct {
	Page
	Versions []VersionRow
}

// Docs is the policy documentation, generated from the live policy.
type Docs struct {
	Page
	Version   int64
	VersionAt string
	ServerURL string
	Currency  string

	Tiers []DocTier
	Rates []DocRate

	GracePeriod string
	MinRuntime  string
	Cycle       string
	Weights     DocWeights

	BudgetWarnPct   int
	BudgetDemotePct int
	Teams           []DocTeam

	Example DocExample

	Burst DocBurst

	HealthRules []DocHealthRule
	// HeartbeatMissedAfter is the silence after which a node is marked
	// down, as applied (Policy.LostAfter).
	HeartbeatMissedAfter string
	// MaxLossRequeues bounds a checkpointable job's requeues after a lost
	// node or process (the policy's max_loss_requeues; 0: no limit).
	MaxLossRequeues  int
	AutoUndrainAfter string // "" = admins undrain by hand
	// Slurm is the configuration rendered for a Slurm cluster.
	Slurm SlurmFiles
}

// DocTier is one tier as the documentation explains it.
type DocTier struct {
	ID, Name, Description string
	ClassOrder            int
	Production            bool
	MayPreempt            []string // tiers it may preempt
	PreemptedBy           []string // tiers that may preempt it
	MaxRuntime            string
	Multiplier            string
	ReservedGPUs          int
}

// DocRate is one GPU type's current rate.
type DocRate struct {
	GPUType  string
	MemoryGB int
	Rate     string // per GPU-hour, with currency
	Since    string
	Next     string // a scheduled change, if any
}

// DocTeam is one team's budget and guarantees.
type DocTeam struct {
	Slug, Name  string
	Budget      string // GPU-hours per month, or "none"
	Guarantees  string
	Weight      int
	WarnAt      string // GPU-hours at the warning threshold
	DemoteAt    string
	HasBudget   bool
	BudgetHours int64
}

// DocWeights are the priority weights and their parameters.
type DocWeights struct {
	Order                string // allot.QueueOrderResponse or allot.QueueOrderMultifactor
	Tier1FIFO            bool   // tier-1 jobs oldest first (the policy's tier1_fifo)
	FairShare, Size, Age int
	HalfLife, MaxAge     string
}

// DocExample is a worked billing example computed by internal/billing.
type DocExample struct {
	GPUs     int
	GPUType  string
	Duration string
	GPUHours string
	Rate     string
	Lines    []DocExampleLine
}

// DocExampleLine is the example's charge at one tier.
type DocExampleLine struct {
	Tier, Multiplier, Amount string
}

// DocBurst are the cloud-burst thresholds.
type DocBurst struct {
	PendingGPUHours, ReleaseGPUHours int
	MeanWait                         string
	MaxNodes                         int
	MonthlyBudget                    string // "" = no cap
	NoProvider                       bool   // burst is not configured on this cluster
	Every                            string // how often the rule is evaluated
}

// DocHealthRule is one node health rule, rendered generically.
type DocHealthRule struct {
	Name, Metric, Match, For, Severity, Action, Over string
}
