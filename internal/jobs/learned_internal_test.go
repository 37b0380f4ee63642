package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
)

// TestExpectRunTimesFromHistory: a cycle's snapshot carries each job's
// expected run time for the start forecast: its user's learned ratio ×
// its time limit, else its team's, else none (the forecast then uses the
// limit); learning is cached for learnEvery of business time.
func TestExpectRunTimesFromHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := storetest.Pool(t)
	st := store.New(pool)
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	if err := demo.Seed(ctx, st); err != nil {
		t.Fatal(err)
	}
	// Only this history counts: the demo's own is moved out of the window.
	if _, err := pool.Exec(ctx, `UPDATE jobs SET submitted_at = $1::timestamptz - interval '90 days' WHERE state = 'completed'`, now); err != nil {
		t.Fatal(err)
	}
	noah := demo.PersonaEmail[demo.Engineer]
	for i := range 3 { // noah's jobs ran a quarter of their limits
		if _, err := pool.Exec(ctx, `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command, state, submitted_at, started_at, ended_at, segment)
			VALUES ('done', 'nlp', (SELECT id FROM users WHERE email = $1), '3', 1, 14400, '{true}', 'completed', $2, $2, $2::timestamptz + interval '1 hour', 1)`,
			noah, now.Add(-time.Duration(i+2)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	s := &Scheduler{Store: st}
	state, err := st.LoadSchedState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := Snapshot(state)
	s.expectRunTimes(ctx, st, state, &snap)
	mine, team, others := 0, 0, 0
	for i, j := range snap.Pending {
		p := &state.Pending[i]
		switch want := j.TimeLimit / 4; {
		case p.User == noah:
			mine++
			if j.Expected != max(want, time.Minute) {
				t.Errorf("noah's job %d: expected %v of a %v limit, want a quarter", j.ID, j.Expected, j.TimeLimit)
			}
		case p.Team == "nlp":
			team++ // the team's ratio is noah's: the only nlp history
			if j.Expected != max(want, time.Minute) {
				t.Errorf("nlp job %d of %s: expected %v of a %v limit, want the team's quarter", j.ID, p.User, j.Expected, j.TimeLimit)
			}
		default:
			others++
			if j.Expected != 0 {
				t.Errorf("job %d of team %s with no history: expected %v, want 0 (the limit)", j.ID, p.Team, j.Expected)
			}
		}
	}
	if mine == 0 || others == 0 {
		t.Fatalf("the demo's queue has %d of noah's pending jobs, %d other nlp, %d of other teams: want some of each", mine, team, others)
	}
	// Cached: a new completion within learnEvery changes nothing yet.
	if _, err := pool.Exec(ctx, `UPDATE jobs SET ended_at = started_at + interval '4 hours' WHERE name = 'done'`); err != nil {
		t.Fatal(err)
	}
	snap, _ = Snapshot(state)
	s.expectRunTimes(ctx, st, state, &snap)
	for i, j := range snap.Pending {
		if state.Pending[i].User == noah && j.Expected != max(j.TimeLimit/4, time.Minute) {
			t.Errorf("within %v of learning, noah's job %d expected %v: relearned too soon", learnEvery, j.ID, j.Expected)
		}
	}
	state.Now = state.Now.Add(learnEvery)
	snap, _ = Snapshot(state)
	s.expectRunTimes(ctx, st, state, &snap)
	for i, j := range snap.Pending {
		if state.Pending[i].User == noah && j.Expected != j.TimeLimit {
			t.Errorf("after %v, noah's job %d expected %v, want its whole limit %v (the history now ran to the limits)", learnEvery, j.ID, j.Expected, j.TimeLimit)
		}
	}
}
