package allot

import (
	"fmt"
	"math/big"
	"strings"
	"time"
)

// QuotaOutcome is the result of the budget check at submission.
type QuotaOutcome struct {
	// Preemptible is true when the job will run as preemptible because of
	// the budget.
	Preemptible bool
	// Warning is shown to the user before and after submitting; "" when the
	// budget covers the request.
	Warning string
	// RemainingGPUSeconds is budget − used (may be negative).
	RemainingGPUSeconds int64
}

// CheckQuota applies DESIGN.md's rule: budget left ≥ requested GPU-hours →
// normal priority; some left but less → preemptible, "Only N h remaining in
// budget"; none left → preemptible, "Budget exceeded by N h". Submission is
// never blocked. Production tiers are never demoted; they get the warning
// only. A team without a budget (0) is never demoted.
func CheckQuota(spec *JobSpec, budgetGPUHours int64, usedGPUSeconds int64) QuotaOutcome {
	if budgetGPUHours <= 0 {
		return QuotaOutcome{}
	}
	remaining := budgetGPUHours*3600 - usedGPUSeconds
	requested := spec.RequestedGPUSeconds()
	out := QuotaOutcome{RemainingGPUSeconds: remaining}
	switch {
	case remaining >= requested:
		return out
	case remaining > 0:
		out.Warning = fmt.Sprintf("Only %s h remaining in budget", Hours(remaining))
	default:
		out.Warning = fmt.Sprintf("Budget exceeded by %s h", Hours(-remaining))
	}
	if spec.Tier.Production() {
		out.Warning += warnKeepsPriority
		return out
	}
	if spec.Preemptible || spec.Tier == TierPreemptible {
		return out
	}
	out.Preemptible = true
	out.Warning += warnRunsPreemptible
	return out
}

// The endings CheckQuota gives its warning, in the future tense: the job has
// not run yet.
const (
	warnKeepsPriority   = "; production tiers are never demoted, this job keeps its priority"
	warnRunsPreemptible = "; this job will run as preemptible"
)

// QuotaWarningAt words a job's stored submission-time warning for a job now
// in state (ran: it has started at least once): as it was for a pending
// job, in the present while it runs, and as what happened at submission
// once it ended ("will run as preemptible" is wrong after the end).
func QuotaWarningAt(warning string, state JobState, ran bool) string {
	if warning == "" {
		return ""
	}
	switch {
	case state == JobRunning:
		warning = strings.Replace(warning, warnRunsPreemptible, "; this job runs as preemptible", 1)
	case state.Terminal():
		runs, keeps := "; so it ran as preemptible", "; production tiers are never demoted, so it kept its priority"
		if !ran {
			runs = "; so it was to run as preemptible (it never started)"
		}
		warning = strings.Replace(warning, warnRunsPreemptible, runs, 1)
		warning = strings.Replace(warning, warnKeepsPriority, keeps, 1)
		warning = "At submission: " + warning
	}
	return warning
}

// Hours formats GPU-seconds as hours with one decimal, rounded half up
// exactly ("12.5", "0.1").
func Hours(gpuSeconds int64) string {
	r := new(big.Rat).SetFrac64(gpuSeconds, 3600)
	return r.FloatString(1)
}

// BudgetAlertMessage is the text of a budget alert: team has used
// gpuSeconds of its budgetHours in the month of at; demote says the demotion
// threshold was crossed.
func BudgetAlertMessage(team string, gpuSeconds, budgetHours int64, at time.Time, demote bool) string {
	msg := fmt.Sprintf("Team %s has used %d %% of its monthly GPU budget: %s of %d GPU-hours in %s.",
		team, gpuSeconds*100/(budgetHours*3600), Hours(gpuSeconds), budgetHours, at.UTC().Format("January 2006"))
	if demote {
		msg += " Its tier 3–4 jobs now run as preemptible until the month ends; production tiers are not affected."
	}
	return msg
}
