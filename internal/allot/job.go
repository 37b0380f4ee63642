package allot

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// JobState is where a job is in its life.
//
// A job stopped for a higher claim (preemption, a drain with requeue) or
// whose node stopped answering is not in a state of its own: in the same
// transaction it goes back to pending (checkpointable, or preempted) or
// ends failed with end reason node_lost. What happened is kept on its run
// segments (stop reason, who preempted it) and its preemption count, and
// the job's timeline shows it.
type JobState string

const (
	JobPending   JobState = "pending"
	JobRunning   JobState = "running"
	JobCompleted JobState = "completed"
	JobFailed    JobState = "failed"
	JobCancelled JobState = "cancelled"
)

// JobStates lists every state a job is ever in.
var JobStates = []JobState{JobPending, JobRunning, JobCompleted, JobFailed, JobCancelled}

// ParseJobState returns the state named s.
func ParseJobState(s string) (JobState, bool) {
	for _, st := range JobStates {
		if string(st) == s {
			return st, true
		}
	}
	return "", false
}

var transitions = map[JobState][]JobState{
	JobPending: {JobRunning, JobCancelled},
	// Running → pending: requeued after a preemption, a drain with requeue
	// or a lost node.
	JobRunning: {JobCompleted, JobFailed, JobCancelled, JobPending},
}

// CanTransition reports whether a job may move from one state to another.
func CanTransition(from, to JobState) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Terminal reports whether s is a final state.
func (s JobState) Terminal() bool {
	return s == JobCompleted || s == JobFailed || s == JobCancelled
}

// JobSpec is what a user asks for.
type JobSpec struct {
	Name           string
	Team           string
	Tier           TierID
	GPUs           int
	GPUType        string // "" = any
	GPUsPerNode    int    // 0 = scheduler decides
	TimeLimit      time.Duration
	Command        []string // argv: program and arguments
	Env            map[string]string
	WorkDir        string
	Checkpointable bool
	Preemptible    bool // explicitly preemptible
	// Image is an OCI image reference to run the command in ("" = on the
	// node's host system).
	Image string
	// MemoryBytes and MilliCPUs limit each node's part of the job (its
	// cgroup); 0 = the node's default.
	MemoryBytes int64
	MilliCPUs   int64
	// SecretEnv is passed to the job like Env but never shown after
	// submission, to anyone: it is only set on a spec being submitted (a
	// stored job has SecretEnvKeys).
	SecretEnv map[string]string
}

// RequestedGPUHours is GPUs × time limit, in hours (rounded up to whole
// seconds; exact as a fraction SecondsGPU/3600).
func (s *JobSpec) RequestedGPUSeconds() int64 {
	return int64(s.GPUs) * int64(s.TimeLimit/time.Second)
}

// PriorityBreakdown is the priority as last computed: its factors, and
// under the response order (Order "response") the response ratio, of which
// the priority is ResponseRatio × FairShareMultiplier(FairShare). Under
// the multifactor order (Order "") it is W_fs·FairShare + W_size·Size +
// W_age·Age.
type PriorityBreakdown struct {
	Class         int     `json:"class"`
	Order         string  `json:"order,omitempty"` // "response", or "" for multifactor
	ResponseRatio float64 `json:"response_ratio,omitempty"`
	FairShare     float64 `json:"fair_share"`
	Size          float64 `json:"size"`
	Age           float64 `json:"age"`
}

// FairShareMultiplier is the response order's fair-share term,
// max(2F, 1/32): 1 for a team at its share (F = 1/2), up to 2 for one
// that used nothing, down to 1/32 for one far above its share.
func FairShareMultiplier(f float64) float64 { return max(2*f, 1.0/32) }

// Job is a submitted job and its state.
type Job struct {
	ID     int64
	UserID int64
	User   string // email of the submitter
	JobSpec
	State         JobState
	SubmittedAt   time.Time
	StartedAt     time.Time // zero until first start
	EndedAt       time.Time // zero until terminal
	ExitCode      *int
	Priority      float64
	Breakdown     PriorityBreakdown
	PendingReason string
	// QuotaWarning is shown to the user when the budget check at submission
	// made the job preemptible (or would have, for production tiers).
	QuotaWarning string
	// Demoted is true when the job runs as preemptible because of budget.
	Demoted   bool
	UpdatedAt time.Time
	// RunAs is the class the current or last run started in ("" before the
	// first start).
	RunAs TierID
	// Segment counts starts: 1 for the first run, +1 after each requeue.
	Segment int
	// EndReason says why a job failed or was requeued ("time_limit",
	// "node_lost", "exit code 3", ...).
	EndReason   string
	Preemptions int
	// RunAsUser is the POSIX account the job runs as on its nodes, resolved
	// at submission ("" for jobs from before accounts: the agent's default).
	RunAsUser string
	// SecretEnvKeys are the names of the secret variables (their values are
	// never loaded with the job).
	SecretEnvKeys []string
	// EnvRedacted is set when Env's values were replaced by Redacted for
	// the viewer (RedactFor).
	EnvRedacted bool
	// Backend is the engine that runs it (BackendNative, BackendSlurm):
	// its GPU type's.
	Backend string
}

// Transition moves j to state to at time at, or returns a conflict error.
func (j *Job) Transition(to JobState, at time.Time) error {
	if !CanTransition(j.State, to) {
		return Errorf(EConflict, "job %d cannot go from %s to %s", j.ID, j.State, to)
	}
	switch to {
	case JobRunning:
		if j.StartedAt.IsZero() {
			j.StartedAt = at
		}
	case JobCompleted, JobFailed, JobCancelled:
		j.EndedAt = at
	}
	j.State = to
	return nil
}

var (
	jobNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._ -]{0,127}$`)
	envKeyRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// Limits on a job spec's free-form parts.
const (
	MaxCommandArgs  = 256
	MaxCommandBytes = 16 << 10
	MaxEnvVars      = 128
)

// Validate checks the fields a spec can be judged on alone. Checks that
// need the cluster (team exists, tier maximum, gang size) are in
// ValidateSubmission.
func (s *JobSpec) Validate() error {
	f := FieldErrors{}
	s.validate(f)
	return f.Err()
}

func (s *JobSpec) validate(f FieldErrors) {
	for field, v := range map[string]string{"name": s.Name, "team": s.Team, "tier": string(s.Tier), "gpu_type": s.GPUType, "workdir": s.WorkDir, "image": s.Image} {
		if strings.ContainsRune(v, 0) || !utf8.ValidString(v) {
			f.Add(field, "must be valid text without NUL bytes")
		}
	}
	if s.Name != "" && !jobNameRE.MatchString(s.Name) {
		f.Add("name", "must be 1–128 letters, digits, spaces, dots, dashes or underscores")
	}
	if strings.TrimSpace(s.Team) == "" {
		f.Add("team", "is required")
	}
	if _, ok := ParseTier(string(s.Tier)); !ok {
		if s.Tier == "" {
			f.Add("tier", "is required")
		} else {
			f.Add("tier", "unknown tier %q: use 1, 2, 3, 4 or preemptible", s.Tier)
		}
	}
	if s.GPUs < 1 {
		f.Add("gpus", "must be at least 1")
	}
	if s.GPUsPerNode < 0 {
		f.Add("gpus_per_node", "must not be negative")
	} else if s.GPUsPerNode > 0 && s.GPUs > 0 && s.GPUs%s.GPUsPerNode != 0 {
		f.Add("gpus_per_node", "must divide gpus (%d)", s.GPUs)
	}
	if s.TimeLimit <= 0 {
		f.Add("time_limit_s", "must be positive")
	} else if s.TimeLimit%time.Second != 0 {
		f.Add("time_limit_s", "must be whole seconds")
	}
	if len(s.Command) == 0 || strings.TrimSpace(s.Command[0]) == "" {
		f.Add("command", "is required")
	} else {
		n := 0
		for _, a := range s.Command {
			n += len(a)
			if strings.ContainsRune(a, 0) {
				f.Add("command", "must not contain NUL bytes")
			}
		}
		if len(s.Command) > MaxCommandArgs || n > MaxCommandBytes {
			f.Add("command", "is too long (at most %d arguments, %d bytes)", MaxCommandArgs, MaxCommandBytes)
		}
	}
	validateEnv(f, "env", s.Env, s.Image != "")
	validateEnv(f, "secret_env", s.SecretEnv, s.Image != "")
	for _, k := range slices.Sorted(maps.Keys(s.SecretEnv)) {
		if _, both := s.Env[k]; both {
			f.Add("secret_env", "%s is also in env: give each variable once, in env or in secret_env", k)
		}
	}
	s.validateResources(f)
	if s.WorkDir != "" && !strings.HasPrefix(s.WorkDir, "/") {
		f.Add("workdir", "must be an absolute path")
	} else if s.Image != "" && strings.Contains(s.WorkDir, ":") {
		f.Add("workdir", "must not contain ':' in a job with an image (the runtime's --volume SRC:DST cannot mount it)")
	}
}

// SubmitContext is what the cluster knows that a submission is judged on.
type SubmitContext struct {
	Submitter *User
	TeamFound bool
	Tier      *Tier // nil if unknown
	// GPUTypes are the known GPU type names.
	GPUTypes []string
	// MaxGang is the largest job (in GPUs) the cluster could ever run, by
	// GPU type; the "" key is for jobs that accept any type.
	MaxGang map[string]int
	// Account is the POSIX account the job would run as (ResolveAccount)
	// and AccountSource where it came from; RequireAccount refuses a
	// submission without one.
	Account        string
	AccountSource  string
	RequireAccount bool
}

// ValidateSubmission applies the one rule set every submission path (form,
// API, CLI) uses. It returns an EInvalid error with a message per field.
func ValidateSubmission(s *JobSpec, c SubmitContext) error {
	f := FieldErrors{}
	s.validate(f)
	if s.Team != "" && !c.TeamFound {
		f.Add("team", "unknown team %q", s.Team)
	} else if s.Team != "" && c.Submitter != nil && !c.Submitter.CanSubmitFor(s.Team) {
		f.Add("team", "you are not a member of team %q", s.Team)
	}
	if _, ok := f["tier"]; !ok && c.Tier == nil {
		f.Add("tier", "unknown tier %q", s.Tier)
	}
	if s.GPUType != "" {
		known := false
		for _, g := range c.GPUTypes {
			if g == s.GPUType {
				known = true
			}
		}
		if !known {
			f.Add("gpu_type", "unknown GPU type %q (known: %s)", s.GPUType, strings.Join(c.GPUTypes, ", "))
		}
	}
	if _, bad := f["gpus"]; !bad {
		if _, bad := f["gpu_type"]; !bad {
			max := c.MaxGang[s.GPUType]
			if s.GPUs > max {
				where := "the cluster"
				if s.GPUType != "" {
					where = s.GPUType + " nodes"
				}
				f.Add("gpus", "at most %d GPUs: the largest gang %s can ever hold", max, where)
			}
		}
	}
	if c.RequireAccount && c.Account == "" && s.Team != "" && c.TeamFound {
		f.Add("run_as_user", "no POSIX account to run this job as: you have none (an admin maps you to one: allot user set-account EMAIL ACCOUNT), "+
			"the identity provider gave none, and team %s has no service account; ask an admin", s.Team)
	} else if c.Account != "" {
		if msg := POSIXAccountProblem(c.Account); msg != "" {
			f.Add("run_as_user", "%s", msg)
		}
	}
	if c.Tier != nil && s.TimeLimit > c.Tier.MaxRuntime {
		if _, bad := f["time_limit_s"]; !bad {
			f.Add("time_limit_s", "at most %s for tier %s", FormatDuration(c.Tier.MaxRuntime), c.Tier.ID)
		}
	}
	return f.Err()
}

// FormatDuration prints d compactly: "4h", "1h30m", "90s", "7d".
func FormatDuration(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	s := int64(d / time.Second)
	var b strings.Builder
	for _, u := range []struct {
		n    int64
		name string
	}{{86400, "d"}, {3600, "h"}, {60, "m"}, {1, "s"}} {
		if s >= u.n {
			fmt.Fprintf(&b, "%d%s", s/u.n, u.name)
			s %= u.n
		}
	}
	return b.String()
}

// maxDuration bounds ParseDuration: numbers that large would wrap around.
const maxDuration = int64(math.MaxInt64)

var errDurationTooLong = errors.New("duration too long")

type durationUnit struct {
	names []string
	unit  time.Duration
}

// durationUnits are the units ParseDuration accepts, largest first; a
// duration names each unit at most once, in this order ("1d2h30m").
var durationUnits = []durationUnit{
	{[]string{"d"}, 24 * time.Hour},
	{[]string{"h"}, time.Hour},
	{[]string{"m"}, time.Minute},
	{[]string{"s"}, time.Second},
	{[]string{"ms"}, time.Millisecond},
	{[]string{"us", "µs", "μs"}, time.Microsecond},
	{[]string{"ns"}, time.Nanosecond},
}

// ParseDuration accepts Go durations ("4h", "90m", "1h30m", "1.5h"), a day
// unit ("2d", "1d12h") and plain seconds ("3600"). Each unit may appear
// once, largest first: "1h1h" and "30m1h" are refused, not added up.
func ParseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty duration")
	}
	orig := s
	neg := false
	if s[0] == '-' || s[0] == '+' {
		neg, s = s[0] == '-', s[1:]
	}
	if digits(s) {
		var n int64
		if _, err := fmt.Sscan(s, &n); err != nil || n > maxDuration/int64(time.Second) {
			return 0, errDurationTooLong
		}
		d := time.Duration(n) * time.Second
		if neg {
			d = -d
		}
		return d, nil
	}
	invalid := func() error { return fmt.Errorf("invalid duration %q: use e.g. 4h, 90m, 1h30m, 2d", orig) }
	var total time.Duration
	last := -1 // index in durationUnits of the previous unit
	for s != "" {
		i := 0
		for i < len(s) && (s[i] == '.' || s[i] >= '0' && s[i] <= '9') {
			i++
		}
		j := i
		for j < len(s) && s[j] != '.' && (s[j] < '0' || s[j] > '9') {
			j++
		}
		num, name := s[:i], s[i:j]
		if num == "" || num == "." || strings.Count(num, ".") > 1 || name == "" {
			return 0, invalid()
		}
		k := slices.IndexFunc(durationUnits, func(u durationUnit) bool { return slices.Contains(u.names, name) })
		switch {
		case k < 0:
			return 0, invalid()
		case k == last:
			return 0, fmt.Errorf("invalid duration %q: the unit %q appears twice; give each unit once, largest first (e.g. 1d2h30m)", orig, name)
		case k < last:
			return 0, fmt.Errorf("invalid duration %q: %q comes after a smaller unit; write the units largest first (e.g. 1d2h30m)", orig, name)
		}
		last = k
		d, err := scaleDuration(num, durationUnits[k].unit)
		if err != nil || d > time.Duration(maxDuration)-total {
			return 0, errDurationTooLong
		}
		total += d
		s = s[j:]
	}
	if neg {
		total = -total
	}
	return total, nil
}

// scaleDuration is the decimal number num ("90", "1.5", ".25") times unit,
// exact to the nanosecond (the fraction is truncated there).
func scaleDuration(num string, unit time.Duration) (time.Duration, error) {
	whole, frac, _ := strings.Cut(num, ".")
	var w int64
	if whole != "" {
		if _, err := fmt.Sscan(whole, &w); err != nil || w > maxDuration/int64(unit) {
			return 0, errDurationTooLong
		}
	}
	d := time.Duration(w) * unit
	scale := int64(unit)
	for _, c := range frac {
		scale /= 10
		if scale == 0 {
			break
		}
		d += time.Duration(int64(c-'0') * scale)
	}
	if d < 0 {
		return 0, errDurationTooLong
	}
	return d, nil
}
