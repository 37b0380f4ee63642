package allot

import (
	"fmt"
	"slices"
	"time"
)

// The lease lifecycle: one home for what a job run's parts go through and
// what each event means. A job run (segment) has one lease per node of its
// gang. The functions here are pure decisions over state the store loads
// (Nomad's reconciler is the pattern): the store reads, calls one of them
// and writes what it says, in one transaction.
//
//	offered ──take──▶ taken ──start──▶ running ──exit──▶ exited
//	   │                │                 │
//	   └──stop/expire───┴──────stop───────┴──lost node, unconfirmed stop──▶ exited
//
// The server trusts no agent clock: a lease's start is when the server
// received the report; its end is the agent's time bounded by what the
// server saw (BoundExit). A lease the agent still reports after it ended
// on the server is an orphan: the agent is told to kill it and its GPUs
// stay allocated until the agent confirms (its exit report, or a heartbeat
// or registration that no longer lists it).

// LeaseState is where one node's part of a job run is.
type LeaseState string

const (
	// LeaseOffered: the server offered it; the agent has not taken it.
	LeaseOffered LeaseState = "offered"
	// LeaseTaken: the agent checked its GPUs and is ready; it starts when
	// every lease of the gang is taken.
	LeaseTaken LeaseState = "taken"
	// LeaseRunning: its process runs (reported started, or listed by the
	// agent).
	LeaseRunning LeaseState = "running"
	// LeaseExited: it ended (reported, stopped before it started, or ended
	// by the server: lost node, unconfirmed stop).
	LeaseExited LeaseState = "exited"
)

// LeaseStates lists every lease state in lifecycle order.
var LeaseStates = []LeaseState{LeaseOffered, LeaseTaken, LeaseRunning, LeaseExited}

// ParseLeaseState returns the state named s.
func ParseLeaseState(s string) (LeaseState, bool) {
	if st := LeaseState(s); slices.Contains(LeaseStates, st) {
		return st, true
	}
	return "", false
}

// Open reports whether a lease in state s still holds its GPUs by right.
func (s LeaseState) Open() bool { return s != LeaseExited }

// LeaseReason says why a lease was asked to stop (its stop reason) or why
// it ended (its exit reason; agents report the stop reason they obeyed, or
// their own: time_limit, start_failed, agent_shutdown).
type LeaseReason string

const (
	ReasonPreempted        LeaseReason = "preempted"          // a higher claim took its GPUs: back to the queue, counted as a preemption
	ReasonCancelled        LeaseReason = "cancelled"          // a person cancelled the job
	ReasonTimeLimit        LeaseReason = "time_limit"         // the agent ended it at the job's time limit
	ReasonDrain            LeaseReason = "drain"              // its node is drained with requeue: back to the queue
	ReasonNodeLost         LeaseReason = "node_lost"          // its node stopped answering
	ReasonAgentRestarted   LeaseReason = "agent_restarted"    // the agent came back without it
	ReasonGangMemberFailed LeaseReason = "gang_member_failed" // another lease of its gang failed
	ReasonOfferExpired     LeaseReason = "offer_expired"      // the gang did not take every lease in time
	ReasonStartFailed      LeaseReason = "start_failed"       // the agent could not start the process
	ReasonOrphaned         LeaseReason = "orphaned"           // the agent ran it after it ended on the server: killed
	ReasonAgentShutdown    LeaseReason = "agent_shutdown"     // the agent stopped it while shutting down
)

// Stop grace periods the server decides by itself (preemptions, cancels
// and drains use the policy's grace period).
const (
	GangStopGrace     = 30 * time.Second // the rest of a gang after one member failed
	LostNodeStopGrace = 30 * time.Second // the rest of a gang after one node was lost
)

// LeaseRef names one node's part of one run segment of a job (the node is
// implied by who asks).
type LeaseRef struct {
	JobID   int64
	Segment int
}

func (r LeaseRef) String() string { return fmt.Sprintf("job %d segment %d", r.JobID, r.Segment) }

// BoundExit is the time a lease ended, from the time an agent reported
// (which the server does not trust: a job may have stolen the node's token)
// and what the server saw itself: never before lower (the latest moment the
// server saw the lease alive: offered, taken, started, listed in a heartbeat
// or registration), never after upper (when the report arrived). A zero
// report is upper. When the bounds cross (lower is later than upper, e.g.
// two servers' clocks), lower wins: a job is never billed less than the
// server saw it run.
func BoundExit(reported, lower, upper time.Time) time.Time {
	at := reported
	if at.IsZero() || at.After(upper) {
		at = upper
	}
	if at.Before(lower) {
		at = lower
	}
	return at
}

// Latest returns the latest of ts (zero times are ignored; zero when all are).
func Latest(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}

// LeaseEnd is how the server ends a lease by itself.
type LeaseEnd struct {
	At       time.Time
	ExitCode int
	Reason   LeaseReason
}

// LostLeaseEnd ends a lease of a node that stopped answering: at the node's
// last heartbeat (billing stops there; never before the lease was offered,
// never after now), exit code -1, reason node_lost. A start report that
// arrived after the last heartbeat does not extend it: the node's silence
// is what the server saw.
func LostLeaseEnd(lastHeartbeat, offered, now time.Time) LeaseEnd {
	return LeaseEnd{At: BoundExit(lastHeartbeat, offered, now), ExitCode: -1, Reason: ReasonNodeLost}
}

// UnconfirmedLeaseEnd ends a started lease whose process is gone without
// an exit report (its agent restarted without it, or never confirmed a
// stop): now, exit code -1, with the stop reason it was asked to stop for
// (agent_restarted when none).
func UnconfirmedLeaseEnd(stop LeaseReason, now time.Time) LeaseEnd {
	if stop == "" {
		stop = ReasonAgentRestarted
	}
	return LeaseEnd{At: now, ExitCode: -1, Reason: stop}
}

// StillRunsAfterStop reports whether the agent listed a lease alive (last
// seen) after the deadline of the stop it was asked for (stop requested
// plus grace): the process outlived its stop, so when the server ends the
// lease its GPUs stay held until the agent confirms it is gone.
func StillRunsAfterStop(lastSeen, stopRequested time.Time, grace time.Duration) bool {
	return !lastSeen.IsZero() && !stopRequested.IsZero() && lastSeen.After(stopRequested.Add(grace))
}

// SegmentLease is one lease of a run segment as settling needs it.
type SegmentLease struct {
	Node       string
	State      LeaseState
	ExitCode   int         // when exited
	ExitReason LeaseReason // when exited ("" = it ended by itself)
	StopReason LeaseReason // "" unless a stop was requested
	ExitedAt   time.Time   // when exited
}

// Stopping reports whether the lease was asked to stop.
func (l SegmentLease) Stopping() bool { return l.StopReason != "" }

// failed reports whether an exited lease ended badly (a non-zero exit, or
// ended for a reason).
func (l SegmentLease) failed() bool {
	return l.State == LeaseExited && (l.ExitCode != 0 || l.ExitReason != "")
}

// Segment is a job run segment to settle after one of its leases ended.
type Segment struct {
	JobState       JobState // the job's state now
	JobSegment     int      // the job's current segment
	Segment        int      // the segment being settled
	Checkpointable bool
	// Leases are every lease of the segment (one per node of the gang),
	// in the order ends are reported (exit time, then rank).
	Leases []SegmentLease
	// LossRequeues is how many of the job's earlier segments ended by a
	// lost node or process (and so went back to the queue), and
	// MaxLossRequeues the policy's bound on them (0: none). The store
	// loads them only when a settlement is such a requeue (Settlement.Loss).
	LossRequeues, MaxLossRequeues int
}

// JobOutcome is what settling does to the job.
type JobOutcome string

const (
	OutcomeNone     JobOutcome = ""          // the job stays as it is
	OutcomeComplete JobOutcome = "completed" // every lease exited 0 by itself
	OutcomeFail     JobOutcome = "failed"
	OutcomeRequeue  JobOutcome = "requeued" // back to pending, keeping its submission time
)

// Settlement is the decision for a segment.
type Settlement struct {
	Outcome JobOutcome
	// ExitCode is the job's exit code (complete: 0; fail: the first
	// non-zero exit, 0 when it failed for a reason with exit 0; nil: none,
	// e.g. its node was lost).
	ExitCode *int
	// EndReason is why it failed ("time_limit", "exit code 3", "node_lost").
	EndReason string
	// PendingReason is what a requeued job's page says.
	PendingReason string
	// Preemption: the requeue counts as a preemption.
	Preemption bool
	// StopOthers, when set, asks every unfinished lease of the segment to
	// stop with this reason and grace (leases not started end at once).
	StopOthers LeaseReason
	StopGrace  time.Duration
	// Loss: the job is requeued because its node or process was lost
	// (bounded by Segment.MaxLossRequeues).
	Loss bool
}

// Pending reasons of requeued jobs.
const (
	PendingAfterDrain      = "requeued: its node was drained; waiting for the next scheduling cycle"
	PendingAfterPreemption = "requeued after preemption; waiting for the next scheduling cycle"
	PendingOfferExpired    = "a node did not take its part of the job in time; it goes back to the queue"
)

// PendingAfterLostNode is a requeued job's reason after node stopped answering.
func PendingAfterLostNode(node string) string { return "requeued: node " + node + " stopped answering" }

// PendingAfterLostProcess is a requeued checkpointable job's reason after
// the agent on node lost its process: it came back from a crash without it
// (agent_restarted) or stopped it while shutting down (agent_shutdown).
func PendingAfterLostProcess(node string, why LeaseReason) string {
	if why == ReasonAgentShutdown {
		return "requeued: the agent on node " + node + " stopped it while shutting down"
	}
	return "requeued: the agent on node " + node + " restarted without it"
}

// lossRequeuesSpent: the job has gone back to the queue after a lost node
// or process as often as the policy allows.
func (s Segment) lossRequeuesSpent() bool {
	return s.MaxLossRequeues > 0 && s.LossRequeues >= s.MaxLossRequeues
}

// SettleSegment decides what a lease's end means for its job:
//
//   - the job is no longer running this segment (cancelled, lost, already
//     requeued): nothing, only the GPUs mattered;
//   - a lease ended because its node was lost: a checkpointable job goes
//     back to the queue, any other fails with node_lost, at once; the rest
//     of the gang is stopped;
//   - a lease whose agent lost the process (agent_restarted,
//     agent_shutdown) of a checkpointable job, not preempted or drained:
//     back to the queue at once, the rest of the gang stopped; any other
//     job fails as below;
//   - either loss of a checkpointable job that has already gone back to the
//     queue after MaxLossRequeues losses (when set) fails it as it would
//     fail any other job;
//   - some leases still run: when one ended badly by itself (not in a
//     preemption or drain, which stop the whole gang anyway), the others
//     are stopped (gang_member_failed); else nothing yet;
//   - every lease ended: drained (and not preempted): requeued; preempted:
//     requeued, counted as a preemption; all exited 0 by themselves:
//     completed; else failed with the first failure's exit code and reason.
func SettleSegment(s Segment) Settlement {
	if s.JobState != JobRunning || s.JobSegment != s.Segment {
		return Settlement{}
	}
	ls := slices.Clone(s.Leases)
	slices.SortStableFunc(ls, func(a, b SegmentLease) int { return a.ExitedAt.Compare(b.ExitedAt) })
	var preempted, drained, open, idle bool
	var lost string
	var firstFailed *SegmentLease
	firstCode := 0
	for i := range ls {
		l := &ls[i]
		preempted = preempted || l.StopReason == ReasonPreempted
		drained = drained || l.StopReason == ReasonDrain
		if l.State.Open() {
			open = true
			idle = idle || !l.Stopping() || l.State == LeaseOffered
		} else if l.ExitReason == ReasonNodeLost && lost == "" {
			lost = l.Node
		}
		if l.failed() && firstFailed == nil {
			firstFailed = l
		}
		if l.State == LeaseExited && l.ExitCode != 0 && firstCode == 0 {
			firstCode = l.ExitCode
		}
	}
	if lost != "" {
		out := Settlement{Outcome: OutcomeFail, EndReason: string(ReasonNodeLost)}
		if s.Checkpointable && !s.lossRequeuesSpent() {
			out = Settlement{Outcome: OutcomeRequeue, PendingReason: PendingAfterLostNode(lost), Loss: true}
		}
		if open {
			out.StopOthers, out.StopGrace = ReasonNodeLost, LostNodeStopGrace
		}
		return out
	}
	// The node's side lost the process (the agent crashed and came back
	// without it, or stopped it at its own shutdown): not the job's doing.
	// A checkpointable job goes back to the queue at once, as after a lost
	// node, and the rest of its gang is stopped; any other fails with the
	// reason below, as before.
	// Only when the lost process is the segment's first failure and the
	// server had asked it to stop for no other reason (a restarted agent's
	// lease is asked to stop as agent_restarted): a gang whose member
	// failed by itself, and whose others were being stopped for it, still
	// fails.
	if lp := firstFailed; lp != nil && (lp.ExitReason == ReasonAgentRestarted || lp.ExitReason == ReasonAgentShutdown) &&
		s.Checkpointable && !preempted && !drained && (lp.StopReason == "" || lp.StopReason == lp.ExitReason) && !s.lossRequeuesSpent() {
		out := Settlement{Outcome: OutcomeRequeue, PendingReason: PendingAfterLostProcess(lp.Node, lp.ExitReason), Loss: true}
		if open {
			out.StopOthers, out.StopGrace = ReasonGangMemberFailed, GangStopGrace
		}
		return out
	}
	if open {
		if firstFailed != nil && !preempted && !drained && idle {
			return Settlement{StopOthers: ReasonGangMemberFailed, StopGrace: GangStopGrace}
		}
		return Settlement{}
	}
	switch {
	case drained && !preempted:
		return Settlement{Outcome: OutcomeRequeue, PendingReason: PendingAfterDrain}
	case preempted:
		return Settlement{Outcome: OutcomeRequeue, PendingReason: PendingAfterPreemption, Preemption: true}
	case firstFailed == nil:
		zero := 0
		return Settlement{Outcome: OutcomeComplete, ExitCode: &zero}
	}
	reason := string(firstFailed.ExitReason)
	if reason == "" {
		reason = string(firstFailed.StopReason)
	}
	if reason == "" {
		reason = fmt.Sprintf("exit code %d", firstCode)
	}
	return Settlement{Outcome: OutcomeFail, ExitCode: &firstCode, EndReason: reason}
}

// ExpiredOffer is the decision for a running job whose gang did not take
// every lease in time (an agent refused or never answered): back to the
// queue (not a preemption), its leases stopped at once.
func ExpiredOffer() Settlement {
	return Settlement{Outcome: OutcomeRequeue, PendingReason: PendingOfferExpired, StopOthers: ReasonOfferExpired}
}

// NodeLease is one lease of a node as the server has it, for reconciling
// what the node's agent reports.
type NodeLease struct {
	Ref      LeaseRef
	State    LeaseState
	Stopping bool // a stop was requested
	// Held: it exited on the server but its GPUs are still allocated,
	// because the agent reported it running after it ended (an orphan).
	Held bool
}

// LeaseAction is what the server does with one lease after a
// registration or a heartbeat of its node.
type LeaseAction string

const (
	// ActSeen: open and listed: it is alive now (the lower bound of its end).
	ActSeen LeaseAction = "seen"
	// ActAdopt: taken and reported running (at registration, or listed in
	// a heartbeat): it started while the server was away, or its start
	// report is on its way or was lost (it commits without waiting for the
	// disk); it runs from now.
	ActAdopt LeaseAction = "adopt"
	// ActReoffer: taken, not reported, no stop asked: it never started;
	// offer it again.
	ActReoffer LeaseAction = "reoffer"
	// ActEnd: taken, not reported, asked to stop: it ends now.
	ActEnd LeaseAction = "end"
	// ActAwaitExit: running, not reported at registration: it ended while
	// the server was away (its exit report may still come) or was lost with
	// the agent; ask it to stop (agent_restarted, no grace), so that
	// EndUnconfirmedStops ends it when no report comes.
	ActAwaitExit LeaseAction = "await_exit"
	// ActKill: reported running, but the server holds no such lease for the
	// node, or only an offer: the agent kills the process.
	ActKill LeaseAction = "kill"
	// ActKillAndHold: reported running, but it ended on the server: the
	// agent kills the process, and its GPUs stay allocated to it until the
	// agent confirms, so no other job gets them meanwhile.
	ActKillAndHold LeaseAction = "kill_and_hold"
	// ActRelease: ended with its GPUs held, and no longer reported: the
	// agent confirmed the kill; release the GPUs.
	ActRelease LeaseAction = "release"
)

// LeaseDecision is one lease's action.
type LeaseDecision struct {
	Ref    LeaseRef
	Action LeaseAction
}

// Kills reports whether the agent must kill the lease's process.
func (d LeaseDecision) Kills() bool { return d.Action == ActKill || d.Action == ActKillAndHold }

// ReconcileRegistration decides what an agent's registration means for each
// lease of its node (leases: what the server has; running: what the agent
// reports running, e.g. re-adopted after a restart). Decisions come in
// the order of leases, then of running for leases the server does not have.
func ReconcileRegistration(leases []NodeLease, running []LeaseRef) []LeaseDecision {
	return reconcile(leases, running, true)
}

// ReconcileHeartbeat decides what a heartbeat's list of running jobs means
// for each lease of its node: open leases it lists are seen alive, and a
// taken one it lists runs from now (adopted: the agent starts a process
// only on a start order, which goes out once the take is durable, so the
// listing is the start report, whose own commit may have been lost or is
// still on its way); leases it lists that ended on the server (or that
// the node never held) are killed, their GPUs held until the kill is
// confirmed; held leases it no longer lists are released. Open leases it
// does not list are left alone (a heartbeat may race a start;
// registration and exit reports settle them).
func ReconcileHeartbeat(leases []NodeLease, listed []LeaseRef) []LeaseDecision {
	return reconcile(leases, listed, false)
}

func reconcile(leases []NodeLease, reported []LeaseRef, registration bool) []LeaseDecision {
	rep := make(map[LeaseRef]bool, len(reported))
	for _, r := range reported {
		rep[r] = true
	}
	known := make(map[LeaseRef]bool, len(leases))
	var out []LeaseDecision
	add := func(r LeaseRef, a LeaseAction) { out = append(out, LeaseDecision{Ref: r, Action: a}) }
	for _, l := range leases {
		if known[l.Ref] {
			continue
		}
		known[l.Ref] = true
		r, listed := l.Ref, rep[l.Ref]
		switch {
		case l.State == LeaseExited && listed:
			add(r, ActKillAndHold)
		case l.State == LeaseExited:
			if l.Held {
				add(r, ActRelease)
			}
		case !registration:
			switch {
			case listed && l.State == LeaseTaken:
				add(r, ActAdopt)
			case listed:
				add(r, ActSeen)
			}
		case l.State == LeaseOffered:
			if listed {
				add(r, ActKill) // it never was taken: whatever runs is not the lease's
			}
		case l.State == LeaseTaken && listed:
			add(r, ActAdopt)
		case l.State == LeaseTaken && l.Stopping:
			add(r, ActEnd)
		case l.State == LeaseTaken:
			add(r, ActReoffer)
		case listed: // running
			add(r, ActSeen)
		case !l.Stopping:
			add(r, ActAwaitExit)
		}
	}
	seen := map[LeaseRef]bool{}
	for _, r := range reported {
		if !known[r] && !seen[r] {
			seen[r] = true
			add(r, ActKill)
		}
	}
	return out
}
