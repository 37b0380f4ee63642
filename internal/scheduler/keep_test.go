package scheduler

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// TestPropertyKeepMatchesRebuild: a sequence of cycles whose running jobs
// change (appended, swap-removed, preempted, moved, sharing a GPU with
// another job, reported by Changed) plans with a RunningKeep exactly as
// without one; so do cycles after the nodes or teams change.
func TestPropertyKeepMatchesRebuild(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		s := genSnapshot(t)
		p := genPolicy(t)
		keep := new(RunningKeep)
		now := t0
		s.NodesSame = false
		for step := range rapid.IntRange(1, 6).Draw(t, "steps") {
			s.Keep = nil
			want := Schedule(s, now, p)
			s.Keep = keep
			got := Schedule(s, now, p)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("step %d: with the keep (-without +with):\n%s", step, diff)
			}
			s.NodesSame = true
			now = now.Add(time.Duration(rapid.IntRange(0, 600).Draw(t, "dt")) * time.Second)
			for range rapid.IntRange(0, 3).Draw(t, "changes") {
				switch op := rapid.IntRange(0, 6).Draw(t, "op"); {
				case op == 0 && len(s.Running) > 0: // swap-remove
					k := rapid.IntRange(0, len(s.Running)-1).Draw(t, "k")
					last := len(s.Running) - 1
					if k != last {
						s.Running[k] = s.Running[last]
						keep.Changed(k)
					}
					s.Running = s.Running[:last]
				case op == 1 && len(s.Running) > 0: // preempt
					k := rapid.IntRange(0, len(s.Running)-1).Draw(t, "k")
					s.Running[k].Terminating = true
					s.Running[k].GraceEnd = now.Add(2 * time.Minute)
					keep.Changed(k)
					keep.Changed(k) // twice: applied once
				case op == 2 && len(want.Starts) > 0: // a start of the plan comes to run
					st := want.Starts[0]
					for _, pj := range s.Pending {
						if pj.ID == st.JobID {
							pj.Placement, pj.Start, pj.RunAs = st.Placement, now, st.RunAs
							keep.Changed(len(s.Running))
							s.Running = append(s.Running, pj)
							break
						}
					}
				case op == 3 && len(s.Running) > 0: // a copy: two jobs on the same GPUs
					r := s.Running[rapid.IntRange(0, len(s.Running)-1).Draw(t, "k")]
					r.ID += 1000
					keep.Changed(len(s.Running))
					s.Running = append(s.Running, r)
				case op == 4 && len(s.Running) > 0: // moved to other GPUs, a longer limit
					k := rapid.IntRange(0, len(s.Running)-1).Draw(t, "k")
					r := &s.Running[k]
					n := rapid.IntRange(0, len(s.Nodes)-1).Draw(t, "node")
					r.Placement = []Slot{{Node: n, GPUs: seq(rapid.IntRange(0, 7).Draw(t, "g0"), 1)}}
					r.TimeLimit += time.Hour
					keep.Changed(k)
				case op == 5: // the nodes change (no longer the same slice)
					s.Nodes = append([]Node(nil), s.Nodes...)
					s.Nodes[0].State = NodeDown
					s.NodesSame = false
				case op == 6 && len(s.Teams) > 0: // a team renamed
					s.Teams = append([]Team(nil), s.Teams...)
					s.Teams[0].Name = "renamed"
				}
			}
		}
	})
}

// A position reported twice is not read as two jobs on the same GPUs
// (which would make the keep recompute the node from every job).
func TestKeepChangedTwice(t *testing.T) {
	t.Parallel()
	s := Snapshot{Nodes: cluster(2, 8), NodesSame: true,
		Running: []Job{job(100, 4, limit(time.Hour), on(time.Minute, slot(0, seq(0, 4)...)))}}
	keep := new(RunningKeep)
	s.Keep = keep
	Schedule(s, t0, allot())
	s.Running[0].Terminating, s.Running[0].GraceEnd = true, t0.Add(time.Minute)
	keep.Changed(0)
	keep.Changed(0)
	Schedule(s, t0, allot())
	if keep.shared[0] {
		t.Error("node 0 marked as holding a GPU twice")
	}
	s.Running = append(s.Running, job(101, 1, on(0, slot(0, 3))))
	keep.Changed(1)
	Schedule(s, t0, allot())
	if !keep.shared[0] {
		t.Error("node 0, where two jobs hold GPU 3, not marked")
	}
}
