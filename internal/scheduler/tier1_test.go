package scheduler

import (
	"slices"

	"github.com/google/go-cmp/cmp"
	"testing"
	"time"
)

// TestTier1FIFO: under Policy.Tier1FIFO (the default) tier-1 jobs are
// served oldest first, and a tier-1 preemptor whose victims are in their
// grace period takes its turn instead of coming ahead of the queue, so
// that the GPUs an older tier-1 job's victims freed go to that job.
func TestTier1FIFO(t *testing.T) {
	t.Parallel()
	// Node 0's GPU was freed a moment ago by job 1's victim (gone from
	// Running); node 1's job is job 2's victim, in its grace period for
	// another minute.
	robbed := Snapshot{
		Nodes: cluster(2, 1),
		Running: []Job{func() Job {
			j := job(101, 1, tier(Tier4), team("b"), on(time.Hour, slot(1, 0)))
			j.Terminating, j.GraceEnd, j.PreemptedBy = true, t0.Add(time.Minute), 2
			return j
		}()},
		Pending: []Job{
			job(1, 1, tier(Tier1), team("a"), submitted(2*time.Minute)),
			job(2, 1, tier(Tier1), team("b"), submitted(time.Minute)),
		},
		Teams: teamsAB(1, 1),
	}
	// One free GPU, one tier-4 victim past MinRuntime; team a has used
	// far more than its share, so its older job has the lower priority.
	share := Snapshot{
		Nodes:   cluster(2, 1),
		Running: []Job{job(100, 1, tier(Tier4), team("b"), on(time.Hour, slot(1, 0)))},
		Pending: []Job{
			job(1, 1, tier(Tier1), team("a"), submitted(2*time.Minute)),
			job(3, 1, tier(Tier1), team("b"), submitted(0)),
		},
		Teams: teamsAB(1, 1),
	}
	share.Teams[0].Usage = 1e9
	cases := []struct {
		name     string
		s        Snapshot
		fifo     bool
		starts   []int64
		victims  []int64
		reserved []int64 // jobs holding a reservation
	}{
		{name: "victims' GPUs go to the job they were freed for", s: robbed, fifo: true,
			starts: []int64{1}, victims: []int64{}, reserved: []int64{2}},
		{name: "by priority, the younger preemptor in flight takes them", s: robbed, fifo: false,
			starts: []int64{2}, victims: []int64{}, reserved: []int64{1}},
		{name: "oldest first, whatever the fair share", s: share, fifo: true,
			starts: []int64{1}, victims: []int64{100}, reserved: []int64{3}},
		{name: "by priority, the team under its share first", s: share, fifo: false,
			starts: []int64{3}, victims: []int64{100}, reserved: []int64{1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := allot()
			if !p.Tier1FIFO {
				t.Fatal("DefaultPolicy().Tier1FIFO is false; the default is true")
			}
			p.Tier1FIFO = c.fifo
			before := cloneSnapshot(c.s)
			pl := Schedule(c.s, t0, p)
			if got := startIDs(pl); !slices.Equal(got, c.starts) {
				t.Errorf("starts = %v, want %v", got, c.starts)
			}
			if got := victimIDs(pl); !slices.Equal(got, c.victims) {
				t.Errorf("victims = %v, want %v", got, c.victims)
			}
			var resv []int64
			for _, r := range pl.Reservations {
				resv = append(resv, r.JobID)
			}
			if !slices.Equal(resv, c.reserved) {
				t.Errorf("reservations for %v, want %v", resv, c.reserved)
			}
			if diff := cmp.Diff(before, c.s); diff != "" {
				t.Errorf("Schedule mutated its snapshot: %s", diff)
			}
		})
	}
}
