// Package views holds the portal's templ components and the typed props
// they render. Views never see the store or echo: package web builds the
// props.
package views

// Page is what every page's layout needs.
type Page struct {
	Title   string
	User    *UserBadge // nil when logged out
	CSRF    string
	DevMode bool
	Flash   string
}

// UserBadge is the logged-in person as shown in the header.
type UserBadge struct {
	Name  string
	Email string
	Roles string   // "admin", "lead of nlp", ...
	Teams []string // the teams whose budget pages they see
	// What the navigation offers.
	Admin, Finance, Lead, Submitter bool
}

// Option is one choice of a select.
type Option struct {
	Value, Label string
}

// JobRow is one line of the jobs list.
type JobRow struct {
	ID            int64
	Name          string
	Team          string
	User          string
	Tier          string
	GPUs          int
	GPUType       string
	TimeLimit     string
	State         string
	Submitted     string
	PendingReason string
	Preemptible   bool
	QuotaWarning  string
}

// JobsList is the jobs page.
type JobsList struct {
	Page
	Rows      []JobRow
	Teams     []Option
	States    []Option
	Team      string
	State     string
	CanSubmit bool
	Alerts    []string // this month's budget alerts of the user's teams
	// More filters; all of them stay in the URL (a GET form).
	Tiers []Option
	Tier  string
	Query string // name contains
	Mine  bool
	// Filtered says which filters are on, in words ("" for none).
	Filtered string
}

// JobDetail is a job's own page.
type JobDetail struct {
	Page
	Job JobRow
	// Engine is the Slurm side of a job Slurm runs (nil: a native job).
	Engine *EngineView

	Command        string
	Env            []Option
	WorkDir        string
	GPUsPerNode    int
	Checkpointable bool
	Demoted        bool
	Started        string
	Ended          string
	ExitCode       string
	Priority       string
	CanCancel      bool
	Live           bool // pending or running: the page refreshes itself
	Segment        int
	Preemptions    int
	EndReason      string
	RunAs          string
	// RunAsUser is the POSIX account the job runs as ("" for jobs from
	// before accounts); Image, Memory and CPUs what it asked of a node
	// ("" = the node's default).
	RunAsUser, Image, Memory, CPUs string
	// EnvRedacted: Env's values are "***" for this viewer. SecretEnv names
	// the secret variables (values never shown).
	EnvRedacted bool
	SecretEnv   []string
	Log         []string
	// What the job page explains (see web/jobs.go for the methods).
	Timeline []TimelineEvent
	Factors  []PriorityFactor
	// ProductOrder: the factors multiply (the response order: response
	// ratio × fair-share multiplier) instead of adding weighted points.
	ProductOrder bool
	ClassText    string
	Queue        *QueueInfo // pending jobs only
	Util         LineChart
	UtilNote     string
	Cost         string
	CostNote     string
	ResubmitURL  string // "" when the viewer may not submit for the team
}

// TimelineEvent is one step of a job's life.
type TimelineEvent struct {
	At     string
	Kind   string // submitted, started, preempted, requeued, ended, running
	What   string
	Detail string
}

// PriorityFactor is one row of the sprio-like breakdown.
type PriorityFactor struct {
	Name, Factor, Weight, Points, Meaning string
}

// QueueInfo is a pending job's place in the queue and start estimate.
type QueueInfo struct {
	Position, Of  int
	AheadGPUHours string
	ETA           string // "unknown" when it cannot be estimated
	ETAMethod     string
}

// JobForm is the submit form with its current values and errors.
type JobForm struct {
	Page
	Teams    []Option
	Tiers    []Option
	GPUTypes []Option
	Values   JobFormValues
	Errors   map[string]string
	Quota    Quota
}

// JobFormValues are the form's fields as typed.
type JobFormValues struct {
	Name, Team, Tier, GPUs, GPUType, GPUsPerNode, TimeLimit, Command, Env, WorkDir string
	Checkpointable, Preemptible                                                    bool
	// SecretEnv is KEY=value lines like Env; Image, Memory ("64GiB") and
	// CPUs ("4") as typed.
	SecretEnv, Image, Memory, CPUs string
}

// Quota is the budget check shown before submitting.
type Quota struct {
	Kind    string // "ok", "warn", "none" (nothing to check yet)
	Message string
}

// Login is the login page: single sign-on when configured, and the dev
// persona picker in development mode.
type Login struct {
	Page
	Personas []Persona
	Message  string
	// SSO offers "Sign in with SSO" (OIDC is configured).
	SSO bool
	// Next is the local path to go to after logging in.
	Next string
	// Error says why the last sign-in failed.
	Error string
}

// Persona is one demo identity on the dev login page.
type Persona struct {
	Key, Title, Name, Email, Description string
}

// ErrorPage shows an error to a person.
type ErrorPage struct {
	Page
	Status  int
	Message string
}

// Money is one total as shown: amounts are exact decimal strings.
type Money struct {
	GPUHours, Charges, Credits, Adjustments, Amount string
}

// FinanceRow is one row of a finance table.
type FinanceRow struct {
	Team, CostCenter, GPUType, Tier, User string
	JobID                                 int64
	Money
}

// Finance is the chargeback page.
type Finance struct {
	Page
	Month    string
	Currency string
	Closed   string // "closed on … by …", "" when open
	CanClose bool
	Team     string
	Total    Money
	Teams    []FinanceRow
	ByTier   []FinanceRow
	ByUser   []FinanceRow
	ByJob    []FinanceRow // shown when one team is selected
	Empty    string
	// OpenMonth is last month when it has charges and is not closed yet,
	// for finance to review and close ("" otherwise); OpenMonthURL shows it.
	OpenMonth, OpenMonthURL string
	CSVURL                  string
	// CloseQuestion is asked before closing the month (the whole month's
	// bill, whatever team the page shows).
	CloseQuestion Question
}

// TeamBudget is the team lead's budget page.
type TeamBudget struct {
	Page
	Team, Month, Used, Cost, Forecast string
	Budget, UsedPct                   int64
	ByJobType, ByUser                 []Option // Value: name, Label: GPU-hours
	Alerts                            []string
	// LastMonth is last month's figures in words ("" before any usage).
	LastMonth string
	Chart     BurnDownChart
	// Usage this month by job type (tier as run × GPU type) and by user.
	ByKind       []KindRow
	KindChart    BarChart
	UserChart    BarChart
	AlertsNote   string
	AlertHistory []string // every month's alerts, newest first, with when they fired
	// Right-sizing findings of the team this month (the viewer's own jobs
	// for engineers, as on the right-sizing page).
	Findings      []RightSizingJob
	FindingsScope string
	FindingsURL   string
	// Fair-share standing of every team, like sshare.
	FairShare     []FairShareRow
	FairShareNote string
}

// KindRow is one job type's usage.
type KindRow struct {
	Tier, GPUType, GPUHours, Pct string
}

// FairShareRow is one team's sshare-like line.
type FairShareRow struct {
	Team                                                      string
	RawShares                                                 int
	NormShares, RawUsage, EffectiveUsage, FairShare, UsageAge string
	This                                                      bool
}

// livePoll is how often a live job page refreshes: every 3 s while the job
// runs (its output), every 10 s (one scheduling cycle) while it waits.
func livePoll(d JobDetail) string {
	if d.Job.State == "running" {
		return "every 3s"
	}
	return "every 10s"
}

// EngineView is what the engine that runs a job (Slurm) says about it.
type EngineView struct {
	Engine, JobID, Origin, Account, User, QOS, Partition, State, Reason string
	// StartEstimate is Slurm's expected start (squeue --start) of a
	// pending job, "" when Slurm has none.
	StartEstimate, Nodes, SubmitError string
	// SyncProblem says Slurm has not answered Allot lately ("" = fine).
	SyncProblem string
	Runs        []EngineRunView
}

// EngineRunView is one run (segment) of an engine job from its accounting.
type EngineRunView struct {
	Segment, State, Start, End, GPUs, Nodes, QOS, GPUUtil, GPUMem string
}
