package scheduler

import "time"

// Schedule computes one scheduling cycle. It is a pure function of its
// arguments and never mutates s.
func Schedule(s Snapshot, now time.Time, p Policy) Plan {
	return Plan{}
}
