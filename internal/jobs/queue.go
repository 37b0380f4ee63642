package jobs

import (
	"github.com/allotlabs/allot/internal/scheduler"
	"github.com/allotlabs/allot/internal/store"
)

// EstKind says what a pending job's start estimate (PendingInfo.EstStart)
// rests on, in the store's words (the scheduler's PendingInfo.EstKind):
//   - store.EstPreemption: GPUs freed by preemption (the job preempted
//     victims for it, or waits for their grace period to end);
//   - store.EstReservation: GPUs reserved for the job from then on;
//   - store.EstProjection: the queue forecast, or the earliest fit by time
//     limits;
//   - "": no estimate.
func EstKind(p scheduler.PendingInfo) string {
	if p.EstStart.IsZero() {
		return ""
	}
	switch p.EstKind {
	case scheduler.EstPreemption:
		return store.EstPreemption
	case scheduler.EstReservation:
		return store.EstReservation
	}
	return store.EstProjection
}

// TeamShares converts the plan's fair-share standing for the store.
func TeamShares(shares []scheduler.TeamShare) []store.TeamShare {
	out := make([]store.TeamShare, len(shares))
	for i, s := range shares {
		out[i] = store.TeamShare{Team: s.Team, NormShares: s.NormShares, RawUsage: s.RawUsage, EffectiveUsage: s.EffectiveUsage, FairShare: s.FairShare}
	}
	return out
}
