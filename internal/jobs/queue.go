package jobs

import (
	"strings"

	"github.com/allotlabs/allot/internal/scheduler"
	"github.com/allotlabs/allot/internal/store"
)

// EstKind says what a pending job's start estimate (PendingInfo.EstStart)
// rests on, from the scheduler's own account of it:
//   - store.EstPreemption: the job holds a reservation whose GPUs come from
//     preemption (it preempted victims for it this cycle, or waits for its
//     victims' grace period to end);
//   - store.EstReservation: another reservation, and the estimate is its
//     time (the GPUs are held for the job from then on);
//   - store.EstProjection: no reservation, or a forecast earlier than the
//     reservation (running jobs ending at their expected run time, or at
//     their time limits, the jobs ahead placed first);
//   - "": no estimate.
//
// The core says which case it took only in the reason's words (see
// scheduler's finish); the marks below are the ones finish writes. A
// PendingInfo field for it would be better (see the report of issue 15).
func EstKind(p scheduler.PendingInfo) string {
	r := p.Reason
	preempted := strings.Contains(r, " job(s) for it;")
	resv := preempted || strings.Contains(r, "holds a backfill reservation") || strings.Contains(r, "holds the backfill reservation")
	switch {
	case p.EstStart.IsZero():
		return ""
	case resv && !p.EstStartLimits.IsZero() && !p.EstStart.Equal(p.EstStartLimits):
		return store.EstProjection
	case preempted, resv && strings.Contains(r, "ends its preemption grace period"):
		return store.EstPreemption
	case resv:
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
