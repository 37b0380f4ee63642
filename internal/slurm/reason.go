package slurm

import (
	"strconv"
	"strings"
)

// ExplainReason turns a Slurm pending/state reason code (Job.Reason, the
// state_reason of GET /jobs) into a few words in Allot's voice. Unknown codes
// come back as "Slurm: <code>". "" and "None" give "".
//
// A job whose comment carries allot:demoted-over-budget (set by Allot's
// job_submit.lua) is prefixed "over budget: runs as preemptible".
func ExplainReason(reason string, j Job) string {
	w := explain(strings.TrimSpace(reason), j)
	if strings.Contains(j.Comment, "allot:demoted-over-budget") && j.State != "RUNNING" && !finished(j.State) {
		if w == "" {
			return "over budget: runs as preemptible"
		}
		return "over budget: runs as preemptible; " + w
	}
	return w
}

func explain(reason string, j Job) string {
	if reason == "" || reason == "None" {
		return ""
	}
	// "ReqNodeNotAvail, UnavailableNodes:sn02" and the like carry detail after a comma.
	code, detail, _ := strings.Cut(reason, ",")
	detail = strings.TrimSpace(detail)
	gpus := "GPUs"
	if j.GPUs == 1 {
		gpus = "1 GPU"
	} else if j.GPUs > 1 {
		gpus = strconv.Itoa(j.GPUs) + " GPUs"
	}
	if j.GRESType != "" && j.GPUs > 0 {
		gpus = strings.Replace(gpus, "GPU", j.GRESType+" GPU", 1)
	}
	switch code {
	case "Resources":
		switch {
		case j.Switches == 1:
			return "waiting for " + gpus + " in one IB domain"
		case j.Switches > 1:
			return "waiting for " + gpus + " in at most " + strconv.Itoa(j.Switches) + " IB domains"
		case j.Constraints != "":
			return "waiting for " + gpus + " on nodes with " + j.Constraints
		case j.GPUs > 0:
			return "waiting for " + gpus + " to be free"
		}
		return "waiting for free GPUs"
	case "Priority":
		return "held by priority: other jobs go first"
	case "Dependency":
		return "waiting for the jobs it depends on"
	case "DependencyNeverSatisfied":
		return "will not start: a job it depends on failed"
	case "BeginTime":
		if j.Restarts > 0 {
			return "requeued after preemption: eligible again shortly"
		}
		return "waiting for its start time"
	case "JobHeldUser":
		return "held by its owner"
	case "JobHeldAdmin":
		return "held by an administrator"
	case "JobHoldMaxRequeue":
		return "held: requeued too many times"
	case "launch failed requeued held":
		return "held: launch failed, requeued"
	case "PartitionDown", "PartitionInactive":
		return "the partition is down"
	case "PartitionNodeLimit":
		return "asks for more nodes than the partition allows"
	case "PartitionTimeLimit":
		return "time limit longer than the partition allows"
	case "PartitionConfig":
		return "the partition does not fit the request"
	case "ReqNodeNotAvail":
		if n, ok := strings.CutPrefix(detail, "UnavailableNodes:"); ok && n != "" {
			return "waiting for nodes that are down or drained (" + n + ")"
		}
		return "waiting for nodes that are down, drained or reserved"
	case "NodeDown":
		return "a node it needs is down"
	case "Reservation":
		return "waiting for its reservation to start"
	case "ReservationDeleted":
		return "its reservation was deleted"
	case "Licenses":
		return "waiting for licenses"
	case "BadConstraints":
		return "can never run: no node matches the request"
	case "InvalidAccount", "AccountNotAllowed":
		return "its account (team) may not use this partition"
	case "InvalidQOS", "QOSNotAllowed":
		return "its tier (QOS) is not allowed here"
	case "Prolog":
		return "starting: node prolog running"
	case "Cleaning":
		return "finishing: nodes are cleaning up"
	case "SchedDefer":
		return "waiting for the next scheduling pass"
	case "FrontEndDown", "SystemFailure":
		return "Slurm is unhealthy"
	case "JobLaunchFailure":
		return "failed to launch"
	case "NonZeroExitCode":
		return "exited with an error"
	case "TimeLimit":
		return "ran out of time"
	case "OutOfMemory":
		return "ran out of memory"
	case "DeadLine":
		return "missed its deadline"
	case "JobArrayTaskLimit":
		return "waiting: array task limit"
	case "BurstBufferResources", "BurstBufferStageIn", "BurstBufferOperation":
		return "waiting for burst buffer"
	case "AssocGrpBillingMinutes", "AssocGrpGRESMinutes", "AssocGrpCPUMinutesLimit":
		return "team's Slurm budget (GrpTRESMins) is used up"
	case "AccountingPolicy":
		return "held by a Slurm accounting limit"
	}
	switch {
	case strings.HasPrefix(code, "QOSGrp"):
		if strings.Contains(code, "Minutes") {
			return "tier's Slurm usage limit is used up (" + code + ")"
		}
		return "tier is at its GPU limit (" + code + ")"
	case strings.HasPrefix(code, "QOSMax") && strings.Contains(code, "PerUser"):
		return "you are at your limit for this tier (" + code + ")"
	case strings.HasPrefix(code, "QOSMax"), strings.HasPrefix(code, "QOSMin"):
		return "the request is outside this tier's per-job limits (" + code + ")"
	case strings.HasPrefix(code, "AssocGrp"):
		if strings.Contains(code, "Minutes") {
			return "team's Slurm usage limit is used up (" + code + ")"
		}
		return "team is at its GPU limit (" + code + ")"
	case strings.HasPrefix(code, "AssocMax"):
		return "the request is outside the team's per-job limits (" + code + ")"
	case strings.HasPrefix(code, "Max") && strings.HasSuffix(code, "PerAccount"):
		return "team is at its limit (" + code + ")"
	case code == "QOSJobLimit" || code == "QOSResourceLimit" || code == "QOSTimeLimit" || code == "QOSUsageThreshold":
		return "tier is at a limit (" + code + ")"
	case code == "AssociationJobLimit" || code == "AssociationResourceLimit" || code == "AssociationTimeLimit":
		return "team is at a limit (" + code + ")"
	}
	return "Slurm: " + reason
}
