package allot

import (
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Who a job runs as, what it may see, and what it asks of a node besides
// GPUs (an image, memory, CPUs).
//
// A job runs on its node as a POSIX account, never root. The server picks
// the account at submission, first of: the account an admin mapped the
// submitter to (users.posix_user), the account the identity provider's
// configured claim gave at the submitter's last sign-in
// (users.oidc_posix_user), the team's service account
// (teams.posix_account). The job keeps it (jobs.run_as_user) and its
// leases carry it to the agents.

var posixNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// ReservedAccounts are account names a job never runs as: root (uid 0),
// toor (the BSD uid-0 alias) and the system accounts of common
// distributions.
var ReservedAccounts = []string{"root", "toor", "daemon", "bin", "sys", "sync", "shutdown", "halt", "operator", "adm", "nobody"}

// POSIXAccountProblem says what is wrong with name as the POSIX account a
// job runs as, "" when it is fine. The empty name is not judged here (it
// means "none").
func POSIXAccountProblem(name string) string {
	switch {
	case !posixNameRE.MatchString(name):
		return fmt.Sprintf("%q is not a POSIX account name: 1–32 lower-case letters, digits, '_' or '-', starting with a letter or '_'", name)
	case slices.Contains(ReservedAccounts, name):
		return fmt.Sprintf("%q is a system account (uid 0 or reserved): jobs never run as it", name)
	}
	return ""
}

// Where a job's account came from (AccountSource).
const (
	AccountFromUser = "user" // an admin's mapping of the submitter
	AccountFromOIDC = "oidc" // the identity provider's claim at sign-in
	AccountFromTeam = "team" // the team's service account
	AccountFromNone = ""     // nothing resolved
)

// AccountSourceText words where an account came from.
func AccountSourceText(source string) string {
	switch source {
	case AccountFromUser:
		return "the submitter's account, set by an admin"
	case AccountFromOIDC:
		return "the submitter's account, from the identity provider"
	case AccountFromTeam:
		return "the team's service account"
	}
	return "no account"
}

// ResolveAccount picks the account a job of team runs as: the admin's
// mapping of the submitter, else the identity provider's claim, else the
// team's service account. Names that are not valid POSIX accounts are
// skipped (the database refuses them; this is for rows from elsewhere).
func ResolveAccount(mapped, claimed, team string) (account, source string) {
	for _, c := range []struct{ name, source string }{{mapped, AccountFromUser}, {claimed, AccountFromOIDC}, {team, AccountFromTeam}} {
		if c.name != "" && POSIXAccountProblem(c.name) == "" {
			return c.name, c.source
		}
	}
	return "", AccountFromNone
}

// Redacted stands in for a value the viewer may not see.
const Redacted = "***"

// CanSeeEnv reports whether u may see the values of j's environment: its
// submitter, a lead of its team and admins. Everyone else who sees the job
// sees the variables' names only. Secret variables' values are never
// shown to anyone.
func CanSeeEnv(u *User, j *Job) bool {
	return u != nil && (u.Admin || u.ID == j.UserID || u.LeadOf(j.Team))
}

// RedactFor hides what u may not see of j: the environment's values
// unless CanSeeEnv. Secret variables are only ever loaded by name.
func (j *Job) RedactFor(u *User) {
	j.SecretEnv = nil
	if CanSeeEnv(u, j) || len(j.Env) == 0 {
		return
	}
	env := make(map[string]string, len(j.Env))
	for k := range j.Env {
		env[k] = Redacted
	}
	j.Env, j.EnvRedacted = env, true
}

// MaxImageLen is the longest image reference a job may name.
const MaxImageLen = 255

// imageRE is an OCI image reference: [registry[:port]/]path[:tag][@digest]
// (the grammar of the distribution reference, without normalisation). As
// there, a first part is a registry only when it has a dot or a port or is
// localhost; else it is a path component (lower case).
var imageRE = regexp.MustCompile(`^` +
	`(?:(?:localhost(?::[0-9]+)?|` + dnsLabel + `(?:\.` + dnsLabel + `)+(?::[0-9]+)?|` + dnsLabel + `:[0-9]+|\[[0-9a-fA-F:]+\](?::[0-9]+)?)/)?` +
	`[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*` +
	`(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?` +
	`(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$`)

const dnsLabel = `[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?`

// ImageProblem says what is wrong with an image reference, "" when it is
// fine ("" itself is fine: no image, the job runs on the host).
func ImageProblem(ref string) string {
	switch {
	case ref == "":
		return ""
	case len(ref) > MaxImageLen:
		return fmt.Sprintf("must be at most %d characters", MaxImageLen)
	case strings.IndexFunc(ref, func(r rune) bool { return r <= ' ' || r >= 0x7f }) >= 0:
		return "must be printable ASCII without spaces"
	case !imageRE.MatchString(ref):
		return fmt.Sprintf("%q is not an OCI image reference: use e.g. ghcr.io/acme/train:1.4, nvcr.io/nvidia/pytorch:24.05-py3 or name@sha256:<digest>", ref)
	}
	return ""
}

// Limits on a job's memory and CPUs per node.
const (
	MinJobMemory    = 16 << 20 // 16 MiB
	MaxJobMemory    = 64 << 40 // 64 TiB
	MaxJobMilliCPUs = 4096 * 1000
)

var memoryUnits = map[string]float64{
	"": 1, "b": 1,
	"kib": 1 << 10, "ki": 1 << 10, "mib": 1 << 20, "mi": 1 << 20, "gib": 1 << 30, "gi": 1 << 30, "tib": 1 << 40, "ti": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

// ParseMemory reads a memory size: bytes ("1073741824"), binary units
// ("512MiB", "64GiB", "1.5TiB"; "Gi" too) or decimal ones ("500MB",
// "64GB"). A bare "G" or "M" is refused as ambiguous (Slurm reads it as
// GiB, Kubernetes as GB). "0" is the node's default.
func ParseMemory(s string) (int64, error) {
	s = strings.TrimSpace(s)
	i := 0
	for i < len(s) && (s[i] == '.' || s[i] >= '0' && s[i] <= '9') {
		i++
	}
	num, unit := s[:i], strings.ToLower(strings.TrimSpace(s[i:]))
	mult, ok := memoryUnits[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("%q is not a memory size: use e.g. 512MiB, 64GiB or a number of bytes", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a memory size: use e.g. 512MiB, 64GiB or a number of bytes", s)
	}
	b := v * mult
	if b > MaxJobMemory {
		return 0, fmt.Errorf("%q is more than %s", s, FormatMemory(MaxJobMemory))
	}
	if b != math.Trunc(b) {
		return 0, fmt.Errorf("%q is not a whole number of bytes", s)
	}
	return int64(b), nil
}

// FormatMemory prints bytes in the largest binary unit that divides it
// ("64GiB", "1536MiB", "1000B"); 0 is "".
func FormatMemory(b int64) string {
	if b == 0 {
		return ""
	}
	for _, u := range []struct {
		n    int64
		name string
	}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if b%u.n == 0 {
			return strconv.FormatInt(b/u.n, 10) + u.name
		}
	}
	return strconv.FormatInt(b, 10) + "B"
}

// ParseCPUs reads a number of CPUs ("4", "0.5", "2.25") as milli-CPUs, to
// the thousandth.
func ParseCPUs(s string) (int64, error) {
	s = strings.TrimSpace(s)
	whole, frac, _ := strings.Cut(s, ".")
	bad := func() (int64, error) {
		return 0, fmt.Errorf("%q is not a number of CPUs: use e.g. 4 or 0.5 (to the thousandth)", s)
	}
	if !digits(whole+frac) || len(frac) > 3 {
		return bad()
	}
	if len(whole) > 7 {
		return 0, fmt.Errorf("%q CPUs is more than %d", s, MaxJobMilliCPUs/1000)
	}
	var w int64
	if whole != "" {
		w, _ = strconv.ParseInt(whole, 10, 64)
	}
	m := w * 1000
	for i, p := 0, int64(100); i < len(frac); i, p = i+1, p/10 {
		m += int64(frac[i]-'0') * p
	}
	return m, nil
}

// FormatCPUs prints milli-CPUs as a decimal number of CPUs ("4", "0.5");
// 0 is "".
func FormatCPUs(m int64) string {
	if m == 0 {
		return ""
	}
	s := strconv.FormatInt(m/1000, 10)
	if r := m % 1000; r != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%03d", r), "0")
	}
	return s
}

// validateResources checks image, memory and CPUs.
func (s *JobSpec) validateResources(f FieldErrors) {
	if msg := ImageProblem(s.Image); msg != "" {
		f.Add("image", "%s", msg)
	}
	switch {
	case s.MemoryBytes < 0:
		f.Add("memory", "must not be negative")
	case s.MemoryBytes > 0 && s.MemoryBytes < MinJobMemory:
		f.Add("memory", "must be at least %s (or 0 for the node's default)", FormatMemory(MinJobMemory))
	case s.MemoryBytes > MaxJobMemory:
		f.Add("memory", "must be at most %s", FormatMemory(MaxJobMemory))
	}
	switch {
	case s.MilliCPUs < 0:
		f.Add("cpus", "must not be negative")
	case s.MilliCPUs > 0 && s.MilliCPUs < 10:
		f.Add("cpus", "must be at least 0.01 (or 0 for the node's default)")
	case s.MilliCPUs > MaxJobMilliCPUs:
		f.Add("cpus", "must be at most %d", MaxJobMilliCPUs/1000)
	}
}

// MaxEnvVarBytes is the longest KEY=value a job's variable may be: a
// node could not start the job with much more (execve refuses any one
// string over 128 KiB).
const MaxEnvVarBytes = 32 << 10

// validateEnv checks one environment map (env or secret_env) under field.
// An image job's variables go through the runtime's env file, one line
// each, so they may not hold a newline.
func validateEnv(f FieldErrors, field string, env map[string]string, image bool) {
	if len(env) > MaxEnvVars {
		f.Add(field, "at most %d variables", MaxEnvVars)
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		v := env[k]
		if !envKeyRE.MatchString(k) {
			f.Add(field, "invalid variable name %q", k)
		}
		if strings.HasPrefix(k, "ALLOT_") || k == "CUDA_VISIBLE_DEVICES" {
			f.Add(field, "%s is set by Allot", k)
		}
		if strings.ContainsRune(v, 0) {
			f.Add(field, "value of %s must not contain NUL bytes", k)
		}
		if n := len(k) + 1 + len(v); n > MaxEnvVarBytes {
			name := k
			if len(name) > 64 {
				name = name[:64] + "…"
			}
			f.Add(field, "%s is too long: %d bytes, at most %d KiB as KEY=value", name, n, MaxEnvVarBytes>>10)
		}
		if image && strings.ContainsAny(v, "\n") {
			f.Add(field, "value of %s must not contain a newline in a job with an image (container env files hold one variable a line)", k)
		}
		if field == "secret_env" && strings.HasPrefix(v, SealedSecretPrefix) {
			// It would be read back as a sealed value, and fail to open.
			f.Add(field, "value of %s must not start with %q (the form of a value encrypted at rest)", k, SealedSecretPrefix)
		}
	}
}

// SealedSecretPrefix starts every secret value stored encrypted (see
// store.SecretKeys); no value submitted may start with it.
const SealedSecretPrefix = "allot:v1:"
