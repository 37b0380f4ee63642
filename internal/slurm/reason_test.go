package slurm

import "testing"

func TestExplainReason(t *testing.T) {
	for _, c := range []struct {
		reason string
		job    Job
		want   string
	}{
		{"", Job{}, ""},
		{"None", Job{}, ""},
		{"Resources", Job{}, "waiting for free GPUs"},
		{"Resources", Job{GPUs: 8, GRESType: "h100"}, "waiting for 8 h100 GPUs to be free"},
		{"Resources", Job{GPUs: 1}, "waiting for 1 GPU to be free"},
		{"Resources", Job{GPUs: 16, Switches: 1}, "waiting for 16 GPUs in one IB domain"},
		{"Resources", Job{GPUs: 32, Switches: 2}, "waiting for 32 GPUs in at most 2 IB domains"},
		{"Resources", Job{GPUs: 4, Constraints: "ib"}, "waiting for 4 GPUs on nodes with ib"},
		{"Priority", Job{}, "held by priority: other jobs go first"},
		{"Dependency", Job{}, "waiting for the jobs it depends on"},
		{"DependencyNeverSatisfied", Job{}, "will not start: a job it depends on failed"},
		{"BeginTime", Job{}, "waiting for its start time"},
		{"BeginTime", Job{Restarts: 1}, "requeued after preemption: eligible again shortly"},
		{"JobHeldUser", Job{}, "held by its owner"},
		{"JobHeldAdmin", Job{}, "held by an administrator"},
		{"PartitionDown", Job{}, "the partition is down"},
		{"ReqNodeNotAvail", Job{}, "waiting for nodes that are down, drained or reserved"},
		{"ReqNodeNotAvail, UnavailableNodes:sn02", Job{}, "waiting for nodes that are down or drained (sn02)"},
		{"QOSGrpGRES", Job{}, "tier is at its GPU limit (QOSGrpGRES)"},
		{"QOSGrpGRESMinutes", Job{}, "tier's Slurm usage limit is used up (QOSGrpGRESMinutes)"},
		{"QOSMaxGRESPerUser", Job{}, "you are at your limit for this tier (QOSMaxGRESPerUser)"},
		{"QOSMaxWallDurationPerJobLimit", Job{}, "the request is outside this tier's per-job limits (QOSMaxWallDurationPerJobLimit)"},
		{"AssocGrpGRES", Job{}, "team is at its GPU limit (AssocGrpGRES)"},
		{"AssocGrpGRESMinutes", Job{}, "team's Slurm budget (GrpTRESMins) is used up"},
		{"AssocGrpMemRunMinutes", Job{}, "team's Slurm usage limit is used up (AssocGrpMemRunMinutes)"},
		{"AssocMaxJobsLimit", Job{}, "the request is outside the team's per-job limits (AssocMaxJobsLimit)"},
		{"MaxGRESPerAccount", Job{}, "team is at its limit (MaxGRESPerAccount)"},
		{"InvalidQOS", Job{}, "its tier (QOS) is not allowed here"},
		{"InvalidAccount", Job{}, "its account (team) may not use this partition"},
		{"BadConstraints", Job{}, "can never run: no node matches the request"},
		{"Reservation", Job{}, "waiting for its reservation to start"},
		{"NodeDown", Job{}, "a node it needs is down"},
		{"Licenses", Job{}, "waiting for licenses"},
		{"SomethingNew", Job{}, "Slurm: SomethingNew"},
		{"Priority", Job{State: "PENDING", Comment: "allot:job=4 allot:demoted-over-budget"}, "over budget: runs as preemptible; held by priority: other jobs go first"},
		{"", Job{State: "PENDING", Comment: "allot:demoted-over-budget"}, "over budget: runs as preemptible"},
		{"None", Job{State: "RUNNING", Comment: "allot:demoted-over-budget"}, ""},
	} {
		if got := ExplainReason(c.reason, c.job); got != c.want {
			t.Errorf("ExplainReason(%q, %+v) = %q, want %q", c.reason, c.job, got, c.want)
		}
	}
}

func TestAllotJobID(t *testing.T) {
	for in, want := range map[string]string{
		"allot:job=42": "42",
		"allot:job=7f3a allot:demoted-over-budget": "7f3a",
		"x,allot:job=9;y":                          "9",
		"":                                         "",
		"allot:job=":                               "",
		"sbatch by hand":                           "",
	} {
		got, ok := AllotJobID(in)
		if got != want || ok != (want != "") {
			t.Errorf("AllotJobID(%q) = %q %v", in, got, ok)
		}
	}
}
