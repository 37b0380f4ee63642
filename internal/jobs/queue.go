package jobs

import (
	"strings"

	"github.com/allotlabs/allot/internal/scheduler"
	"github.com/allotlabs/allot/internal/store"
)

// EstKind says what a pending job's start estimate (PendingInfo.EstStart)
// rests on, from the scheduler's own account of it: a reservation whose
// GPUs come from preemption (the job preempted victims for it, or waits for
// its victims' grace period to end) is store.EstPreemption; another
// reservation is store.EstReservation; an estimate without one (the
// earliest time enough GPUs come free by time limits, the jobs ahead
// placed first) is store.EstProjection; no estimate is "".
//
// The core says which case it took only in the reason's words (see
// scheduler's finish); the marks below are the ones finish writes.
func EstKind(p scheduler.PendingInfo) string {
	switch r := p.Reason; {
	case p.EstStart.IsZero():
		return ""
	case strings.Contains(r, " job(s) for it;"), strings.Contains(r, "ends its preemption grace period"):
		return store.EstPreemption
	case strings.Contains(r, "holds a backfill reservation"), strings.Contains(r, "holds the backfill reservation"):
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
