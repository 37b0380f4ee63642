package allot_test

import (
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/google/go-cmp/cmp"
)

func intp(v int) *int { return &v }

func TestLeaseStates(t *testing.T) {
	t.Parallel()
	for _, s := range allot.LeaseStates {
		if got, ok := allot.ParseLeaseState(string(s)); !ok || got != s {
			t.Errorf("ParseLeaseState(%q) = %q, %v", s, got, ok)
		}
		if s.Open() == (s == allot.LeaseExited) {
			t.Errorf("%s.Open() = %v", s, s.Open())
		}
	}
	if _, ok := allot.ParseLeaseState("lost"); ok {
		t.Error(`"lost" parsed as a lease state`)
	}
}

// TestBoundExit: an agent's exit time is kept only inside what the server
// saw: a forged old time bills up to the last time the server saw the lease
// alive, a future one up to the report's arrival.
func TestBoundExit(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	seen, recv := at(100), at(130)
	tests := []struct {
		name                   string
		reported, lower, upper time.Time
		want                   time.Time
	}{
		{"inside the bounds", at(120), seen, recv, at(120)},
		{"forged far in the past", time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), seen, recv, seen},
		{"just before the last heartbeat", at(99), seen, recv, seen},
		{"in the future", at(9999), seen, recv, recv},
		{"no time given", time.Time{}, seen, recv, recv},
		{"at the lower bound", seen, seen, recv, seen},
		{"at the upper bound", recv, seen, recv, recv},
		{"crossed bounds: the server saw it later than the report arrived", at(110), at(140), recv, at(140)},
		{"no lower bound", at(5), time.Time{}, recv, at(5)},
	}
	for _, tt := range tests {
		if got := allot.BoundExit(tt.reported, tt.lower, tt.upper); !got.Equal(tt.want) {
			t.Errorf("%s: BoundExit = %v, want %v", tt.name, got, tt.want)
		}
	}
	if got := allot.Latest(time.Time{}, at(3), at(1), time.Time{}); !got.Equal(at(3)) {
		t.Errorf("Latest = %v", got)
	}
	if got := allot.Latest(); !got.IsZero() {
		t.Errorf("Latest() = %v", got)
	}
}

func TestServerEndedLeases(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	tests := []struct {
		name string
		got  allot.LeaseEnd
		want allot.LeaseEnd
	}{
		{"lost: ends at the last heartbeat", allot.LostLeaseEnd(at(50), at(40), at(90)), allot.LeaseEnd{At: at(50), ExitCode: -1, Reason: allot.ReasonNodeLost}},
		{"lost: never before it was offered (offered after the last heartbeat)", allot.LostLeaseEnd(at(50), at(60), at(90)), allot.LeaseEnd{At: at(60), ExitCode: -1, Reason: allot.ReasonNodeLost}},
		{"lost: never after now", allot.LostLeaseEnd(at(95), at(10), at(90)), allot.LeaseEnd{At: at(90), ExitCode: -1, Reason: allot.ReasonNodeLost}},
		{"unconfirmed stop without a reason", allot.UnconfirmedLeaseEnd("", at(90)), allot.LeaseEnd{At: at(90), ExitCode: -1, Reason: allot.ReasonAgentRestarted}},
		{"unconfirmed preemption", allot.UnconfirmedLeaseEnd(allot.ReasonPreempted, at(90)), allot.LeaseEnd{At: at(90), ExitCode: -1, Reason: allot.ReasonPreempted}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, tt.got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
	stillRuns := []struct {
		name       string
		seen, stop time.Time
		grace      time.Duration
		want       bool
	}{
		{"listed after the stop's deadline", at(200), at(100), 60 * time.Second, true},
		{"listed inside the grace", at(150), at(100), 60 * time.Second, false},
		{"last seen before the stop", at(90), at(100), 0, false},
		{"never seen", time.Time{}, at(100), 0, false},
		{"no stop", at(200), time.Time{}, 0, false},
	}
	for _, tt := range stillRuns {
		if got := allot.StillRunsAfterStop(tt.seen, tt.stop, tt.grace); got != tt.want {
			t.Errorf("StillRunsAfterStop %s = %v", tt.name, got)
		}
	}
}

// TestSettleSegment: what a lease's end means for its job, for every shape
// of a segment the store can load.
func TestSettleSegment(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	exited := func(node string, code int, reason, stop allot.LeaseReason, s int) allot.SegmentLease {
		return allot.SegmentLease{Node: node, State: allot.LeaseExited, ExitCode: code, ExitReason: reason, StopReason: stop, ExitedAt: at(s)}
	}
	running := func(node string, stop allot.LeaseReason) allot.SegmentLease {
		return allot.SegmentLease{Node: node, State: allot.LeaseRunning, StopReason: stop}
	}
	seg := func(ls ...allot.SegmentLease) allot.Segment {
		return allot.Segment{JobState: allot.JobRunning, JobSegment: 2, Segment: 2, Leases: ls}
	}
	withState := func(s allot.Segment, st allot.JobState) allot.Segment { s.JobState = st; return s }
	ckpt := func(s allot.Segment) allot.Segment { s.Checkpointable = true; return s }
	lossRequeues := func(s allot.Segment, n, max int) allot.Segment { s.LossRequeues, s.MaxLossRequeues = n, max; return s }
	old := seg(exited("a", 1, "", "", 1))
	old.JobSegment = 3

	tests := []struct {
		name string
		in   allot.Segment
		want allot.Settlement
	}{
		{"completed", seg(exited("a", 0, "", "", 1)), allot.Settlement{Outcome: allot.OutcomeComplete, ExitCode: intp(0)}},
		{"gang completed", seg(exited("a", 0, "", "", 2), exited("b", 0, "", "", 1)), allot.Settlement{Outcome: allot.OutcomeComplete, ExitCode: intp(0)}},
		{"failed with its exit code", seg(exited("a", 3, "", "", 1)), allot.Settlement{Outcome: allot.OutcomeFail, ExitCode: intp(3), EndReason: "exit code 3"}},
		{"time limit", seg(exited("a", -1, allot.ReasonTimeLimit, "", 1)), allot.Settlement{Outcome: allot.OutcomeFail, ExitCode: intp(-1), EndReason: "time_limit"}},
		{"start failed", seg(exited("a", 127, allot.ReasonStartFailed, "", 1)), allot.Settlement{Outcome: allot.OutcomeFail, ExitCode: intp(127), EndReason: "start_failed"}},
		{"a reason with exit 0 still fails", seg(exited("a", 0, allot.ReasonAgentShutdown, "", 1)), allot.Settlement{Outcome: allot.OutcomeFail, ExitCode: intp(0), EndReason: "agent_shutdown"}},
		{"agent restarted without it", seg(exited("a", -1, allot.ReasonAgentRestarted, "", 1)), allot.Settlement{Outcome: allot.OutcomeFail, ExitCode: intp(-1), EndReason: "agent_restarted"}},
		{"agent restarted without it, checkpointable: requeued", ckpt(seg(exited("a", -1, allot.ReasonAgentRestarted, "", 1))),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: "requeued: the agent on node a restarted without it", Loss: true}},
		{"agent shut down, checkpointable, exit 0 in its grace: requeued", ckpt(seg(exited("a", 0, allot.ReasonAgentShutdown, "", 1))),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: "requeued: the agent on node a stopped it while shutting down", Loss: true}},
		{"agent restarted without a gang member, checkpointable: requeued, the others stopped", ckpt(seg(exited("b", -1, allot.ReasonAgentRestarted, "", 1), running("a", ""))),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: allot.PendingAfterLostProcess("b", allot.ReasonAgentRestarted), StopOthers: allot.ReasonGangMemberFailed, StopGrace: allot.GangStopGrace, Loss: true}},
		{"agent restarted without it, checkpointable, preempted: a preemption", ckpt(seg(exited("a", -1, allot.ReasonAgentRestarted, allot.ReasonPreempted, 1))),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: allot.PendingAfterPreemption, Preemption: true}},
		{"the agent restarted as the server asked (agent_restarted stop), checkpointable: requeued", ckpt(seg(exited("a", -1, allot.ReasonAgentRestarted, allot.ReasonAgentRestarted, 1))),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: allot.PendingAfterLostProcess("a", allot.ReasonAgentRestarted), Loss: true}},
		{"gang member failed first, another's agent shut down during its stop, checkpointable: fails", ckpt(seg(exited("a", 3, "", "", 1), exited("b", 0, allot.ReasonAgentShutdown, allot.ReasonGangMemberFailed, 2))),
			allot.Settlement{Outcome: allot.OutcomeFail, ExitCode: intp(3), EndReason: "exit code 3"}},
		{"gang member failed first, another's agent shut down on its own later, checkpointable: fails", ckpt(seg(exited("a", 3, "", "", 1), exited("b", -1, allot.ReasonAgentShutdown, "", 2))),
			allot.Settlement{Outcome: allot.OutcomeFail, ExitCode: intp(3), EndReason: "exit code 3"}},
		{"checkpointable job that failed by itself still fails", ckpt(seg(exited("a", 3, "", "", 1))), allot.Settlement{Outcome: allot.OutcomeFail, ExitCode: intp(3), EndReason: "exit code 3"}},
		{"stop reason when the agent gave none", seg(exited("a", -1, "", allot.ReasonGangMemberFailed, 1)), allot.Settlement{Outcome: allot.OutcomeFail, ExitCode: intp(-1), EndReason: "gang_member_failed"}},
		{"gang: the first failure by time names the failure",
			seg(exited("a", -1, allot.ReasonGangMemberFailed, allot.ReasonGangMemberFailed, 9), exited("b", 2, "", "", 5)),
			allot.Settlement{Outcome: allot.OutcomeFail, ExitCode: intp(2), EndReason: "exit code 2"}},
		{"preempted", seg(exited("a", -1, allot.ReasonPreempted, allot.ReasonPreempted, 1)),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: allot.PendingAfterPreemption, Preemption: true}},
		{"preempted, it exited 0 in its grace", seg(exited("a", 0, "", allot.ReasonPreempted, 1)),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: allot.PendingAfterPreemption, Preemption: true}},
		{"drained", seg(exited("a", -1, allot.ReasonDrain, allot.ReasonDrain, 1)), allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: allot.PendingAfterDrain}},
		{"drained and preempted: a preemption", seg(exited("a", -1, "", allot.ReasonDrain, 1), exited("b", -1, "", allot.ReasonPreempted, 2)),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: allot.PendingAfterPreemption, Preemption: true}},
		{"gang member failed: stop the others", seg(exited("a", 1, "", "", 1), running("b", "")),
			allot.Settlement{StopOthers: allot.ReasonGangMemberFailed, StopGrace: allot.GangStopGrace}},
		{"gang member failed before the others started: they end", seg(exited("a", 127, allot.ReasonStartFailed, "", 1), allot.SegmentLease{Node: "b", State: allot.LeaseOffered}),
			allot.Settlement{StopOthers: allot.ReasonGangMemberFailed, StopGrace: allot.GangStopGrace}},
		{"gang member finished: wait for the others", seg(exited("a", 0, "", "", 1), running("b", "")), allot.Settlement{}},
		{"gang member failed, the others already stopping", seg(exited("a", 1, "", "", 1), running("b", allot.ReasonGangMemberFailed)), allot.Settlement{}},
		{"gang preempted: a member's end stops nobody", seg(exited("a", -1, allot.ReasonPreempted, allot.ReasonPreempted, 1), running("b", allot.ReasonPreempted)), allot.Settlement{}},
		{"gang drained: a member's end stops nobody", seg(exited("a", -1, allot.ReasonDrain, allot.ReasonDrain, 1), running("b", allot.ReasonDrain)), allot.Settlement{}},
		{"node lost, not checkpointable: fails at once and stops the gang", seg(exited("a", -1, allot.ReasonNodeLost, "", 1), running("b", "")),
			allot.Settlement{Outcome: allot.OutcomeFail, EndReason: "node_lost", StopOthers: allot.ReasonNodeLost, StopGrace: allot.LostNodeStopGrace}},
		{"node lost, checkpointable: requeued", ckpt(seg(exited("a", -1, allot.ReasonNodeLost, "", 1))),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: allot.PendingAfterLostNode("a"), Loss: true}},
		{"node lost while preempted: still lost", ckpt(seg(exited("a", -1, allot.ReasonNodeLost, allot.ReasonPreempted, 1), running("b", allot.ReasonPreempted))),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: allot.PendingAfterLostNode("a"), StopOthers: allot.ReasonNodeLost, StopGrace: allot.LostNodeStopGrace, Loss: true}},
		{"node lost, checkpointable, below the requeue bound: requeued", lossRequeues(ckpt(seg(exited("a", -1, allot.ReasonNodeLost, "", 1))), 1, 2),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: allot.PendingAfterLostNode("a"), Loss: true}},
		{"node lost, checkpointable, requeued as often as the policy allows: fails", lossRequeues(ckpt(seg(exited("a", -1, allot.ReasonNodeLost, "", 1), running("b", ""))), 2, 2),
			allot.Settlement{Outcome: allot.OutcomeFail, EndReason: "node_lost", StopOthers: allot.ReasonNodeLost, StopGrace: allot.LostNodeStopGrace}},
		{"node lost, checkpointable, no bound (0): requeued however often", lossRequeues(ckpt(seg(exited("a", -1, allot.ReasonNodeLost, "", 1))), 100, 0),
			allot.Settlement{Outcome: allot.OutcomeRequeue, PendingReason: allot.PendingAfterLostNode("a"), Loss: true}},
		{"agent restarted without it, checkpointable, requeues spent: fails as any job", lossRequeues(ckpt(seg(exited("a", -1, allot.ReasonAgentRestarted, "", 1))), 3, 3),
			allot.Settlement{Outcome: allot.OutcomeFail, ExitCode: intp(-1), EndReason: "agent_restarted"}},
		{"cancelled job: only the GPUs mattered", withState(seg(exited("a", -1, allot.ReasonCancelled, allot.ReasonCancelled, 1)), allot.JobCancelled), allot.Settlement{}},
		{"already requeued", withState(seg(exited("a", -1, allot.ReasonNodeLost, "", 1)), allot.JobPending), allot.Settlement{}},
		{"failed job", withState(seg(exited("a", 1, "", "", 1), running("b", "")), allot.JobFailed), allot.Settlement{}},
		{"an older segment of a job running again", old, allot.Settlement{}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, allot.SettleSegment(tt.in)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
	if got := allot.ExpiredOffer(); got.Outcome != allot.OutcomeRequeue || got.Preemption || got.StopOthers != allot.ReasonOfferExpired || got.StopGrace != 0 {
		t.Errorf("ExpiredOffer = %+v", got)
	}
}

// TestReconcileRegistration: every (server state × reported) pair of a
// registering node's leases.
func TestReconcileRegistration(t *testing.T) {
	t.Parallel()
	ref := func(j int64) allot.LeaseRef { return allot.LeaseRef{JobID: j, Segment: 1} }
	lease := func(j int64, st allot.LeaseState, stopping, held bool) allot.NodeLease {
		return allot.NodeLease{Ref: ref(j), State: st, Stopping: stopping, Held: held}
	}
	tests := []struct {
		name     string
		lease    *allot.NodeLease
		reported bool
		want     allot.LeaseAction // "" = nothing
	}{
		{"running, reported: runs on", &allot.NodeLease{State: allot.LeaseRunning}, true, allot.ActSeen},
		{"running and stopping, reported: runs on (its stop is sent again)", &allot.NodeLease{State: allot.LeaseRunning, Stopping: true}, true, allot.ActSeen},
		{"running, not reported: wait for its exit report", &allot.NodeLease{State: allot.LeaseRunning}, false, allot.ActAwaitExit},
		{"running and stopping, not reported: its stop's deadline stands", &allot.NodeLease{State: allot.LeaseRunning, Stopping: true}, false, ""},
		{"taken, reported: it started meanwhile", &allot.NodeLease{State: allot.LeaseTaken}, true, allot.ActAdopt},
		{"taken, not reported: offer again", &allot.NodeLease{State: allot.LeaseTaken}, false, allot.ActReoffer},
		{"taken and stopping, not reported: ends", &allot.NodeLease{State: allot.LeaseTaken, Stopping: true}, false, allot.ActEnd},
		{"offered, reported: not the lease's process, kill", &allot.NodeLease{State: allot.LeaseOffered}, true, allot.ActKill},
		{"offered, not reported: the offer is sent again", &allot.NodeLease{State: allot.LeaseOffered}, false, ""},
		{"exited, reported: kill it, hold its GPUs", &allot.NodeLease{State: allot.LeaseExited}, true, allot.ActKillAndHold},
		{"exited and held, reported: still held", &allot.NodeLease{State: allot.LeaseExited, Held: true}, true, allot.ActKillAndHold},
		{"exited and held, not reported: kill confirmed, release", &allot.NodeLease{State: allot.LeaseExited, Held: true}, false, allot.ActRelease},
		{"exited, not reported: nothing", &allot.NodeLease{State: allot.LeaseExited}, false, ""},
		{"no such lease, reported: kill", nil, true, allot.ActKill},
	}
	for _, tt := range tests {
		var leases []allot.NodeLease
		if tt.lease != nil {
			l := *tt.lease
			l.Ref = ref(7)
			leases = append(leases, l)
		}
		var running []allot.LeaseRef
		if tt.reported {
			running = append(running, ref(7))
		}
		var want []allot.LeaseDecision
		if tt.want != "" {
			want = append(want, allot.LeaseDecision{Ref: ref(7), Action: tt.want})
		}
		if diff := cmp.Diff(want, allot.ReconcileRegistration(leases, running)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
	// A whole node at once, a job reported twice, and what to kill.
	got := allot.ReconcileRegistration([]allot.NodeLease{lease(1, allot.LeaseRunning, false, false), lease(2, allot.LeaseRunning, false, false),
		lease(3, allot.LeaseExited, false, false)}, []allot.LeaseRef{ref(1), ref(3), ref(9), ref(9)})
	want := []allot.LeaseDecision{{Ref: ref(1), Action: allot.ActSeen}, {Ref: ref(2), Action: allot.ActAwaitExit},
		{Ref: ref(3), Action: allot.ActKillAndHold}, {Ref: ref(9), Action: allot.ActKill}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("whole node (-want +got):\n%s", diff)
	}
	var kills []allot.LeaseRef
	for _, d := range got {
		if d.Kills() {
			kills = append(kills, d.Ref)
		}
	}
	if diff := cmp.Diff([]allot.LeaseRef{ref(3), ref(9)}, kills); diff != "" {
		t.Errorf("kills (-want +got):\n%s", diff)
	}
}

// TestReconcileHeartbeat: a heartbeat's job list marks open leases seen,
// kills what ended (holding its GPUs) and releases held GPUs of orphans it
// no longer lists; a taken lease it lists is adopted (its start report's
// commit may be lost); open leases it does not list are left alone.
func TestReconcileHeartbeat(t *testing.T) {
	t.Parallel()
	ref := func(j int64) allot.LeaseRef { return allot.LeaseRef{JobID: j, Segment: 1} }
	tests := []struct {
		name   string
		lease  *allot.NodeLease
		listed bool
		want   allot.LeaseAction
	}{
		{"running, listed", &allot.NodeLease{State: allot.LeaseRunning}, true, allot.ActSeen},
		{"taken, listed (its start report is on its way, or its commit was lost): adopt", &allot.NodeLease{State: allot.LeaseTaken}, true, allot.ActAdopt},
		{"taken and stopping, listed: adopt (its stop order stands)", &allot.NodeLease{State: allot.LeaseTaken, Stopping: true}, true, allot.ActAdopt},
		{"taken, not listed: left alone (not started yet)", &allot.NodeLease{State: allot.LeaseTaken}, false, ""},
		{"offered, listed", &allot.NodeLease{State: allot.LeaseOffered}, true, allot.ActSeen},
		{"running, not listed: left to its exit report", &allot.NodeLease{State: allot.LeaseRunning}, false, ""},
		{"taken and stopping, not listed", &allot.NodeLease{State: allot.LeaseTaken, Stopping: true}, false, ""},
		{"exited, listed: kill, hold", &allot.NodeLease{State: allot.LeaseExited}, true, allot.ActKillAndHold},
		{"exited and held, listed: kill again", &allot.NodeLease{State: allot.LeaseExited, Held: true}, true, allot.ActKillAndHold},
		{"exited and held, not listed: release", &allot.NodeLease{State: allot.LeaseExited, Held: true}, false, allot.ActRelease},
		{"exited, not listed", &allot.NodeLease{State: allot.LeaseExited}, false, ""},
		{"unknown, listed: kill", nil, true, allot.ActKill},
	}
	for _, tt := range tests {
		var leases []allot.NodeLease
		if tt.lease != nil {
			l := *tt.lease
			l.Ref = ref(7)
			leases = append(leases, l)
		}
		var listed []allot.LeaseRef
		if tt.listed {
			listed = append(listed, ref(7))
		}
		var want []allot.LeaseDecision
		if tt.want != "" {
			want = append(want, allot.LeaseDecision{Ref: ref(7), Action: tt.want})
		}
		if diff := cmp.Diff(want, allot.ReconcileHeartbeat(leases, listed)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
}
