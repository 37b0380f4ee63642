package scheduler

import (
	"slices"
	"testing"
	"time"
)

// TestTeamWaitBoost: under Policy.TeamWaitBoost a team whose pending
// research jobs have waited far longer than all teams' on average comes
// first, though its long job's response ratio is lower.
func TestTeamWaitBoost(t *testing.T) {
	t.Parallel()
	// One free node. Team a's 48-h job has waited 10 h: ratio
	// (10+48)/48 = 1.21. Team b's 1-h job has waited 30 min: ratio 1.5.
	// Mean pending wait 5.25 h; team a's is 10 h, so its boost is 1.9.
	s := Snapshot{
		Nodes: cluster(1, 8),
		Pending: []Job{
			job(1, 8, team("a"), limit(48*time.Hour), submitted(10*time.Hour)),
			job(2, 8, team("b"), limit(time.Hour), submitted(30*time.Minute)),
		},
		Teams: teamsAB(0, 0),
	}
	for _, c := range []struct {
		boost bool
		want  []int64
	}{{false, []int64{2}}, {true, []int64{1}}} {
		p := allot()
		p.TeamWaitBoost = c.boost
		if got := startIDs(Schedule(s, t0, p)); !slices.Equal(got, c.want) {
			t.Errorf("TeamWaitBoost=%v: starts %v, want %v", c.boost, got, c.want)
		}
	}
}

// TestStarvedTeamPreempt: under Policy.StarvedTeamPreempt a research job
// of a team whose pending jobs have waited at least 3× all teams' mean may
// preempt (after GuaranteePatience) though its team is above its
// guarantee, and only work submitted after it, so that the victim, requeued,
// cannot take the GPUs back the same way.
func TestStarvedTeamPreempt(t *testing.T) {
	t.Parallel()
	snap := func(victimSubmit time.Duration) Snapshot {
		v := job(100, 8, team("b"), limit(200*time.Hour), on(time.Hour, slot(0, seq(0, 8)...)))
		v.Submit = t0.Add(-victimSubmit)
		return Snapshot{
			Nodes:   cluster(1, 8),
			Running: []Job{v},
			Pending: []Job{
				// Team a waits 20 h; team b's three jobs a minute each:
				// mean 5 h, team a at 4×.
				job(1, 8, team("a"), limit(48*time.Hour), submitted(20*time.Hour)),
				job(2, 8, team("b"), submitted(time.Minute)),
				job(3, 8, team("b"), submitted(time.Minute)),
				job(4, 8, team("b"), submitted(time.Minute)),
			},
			// No guarantees: no team is under one.
			Teams: teamsAB(0, 0),
		}
	}
	for _, c := range []struct {
		name         string
		on           bool
		victimSubmit time.Duration
		victims      []int64
	}{
		{"off: above its guarantee, no right to preempt", false, 2 * time.Hour, []int64{}},
		{"on: takes younger work", true, 2 * time.Hour, []int64{100}},
		{"on: never older work", true, 30 * time.Hour, []int64{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := allot()
			p.StarvedTeamPreempt = c.on
			pl := Schedule(snap(c.victimSubmit), t0, p)
			if got := victimIDs(pl); !slices.Equal(got, c.victims) {
				t.Errorf("victims %v, want %v", got, c.victims)
			}
		})
	}
}
