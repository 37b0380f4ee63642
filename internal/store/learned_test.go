package store_test

import (
	"math"
	"testing"
	"time"
)

// TestRunTimeRatios: the median run time / time limit of each user's and
// team's last completed jobs, counting only first-segment completions
// submitted in the window, capped at 1, and only with enough of them.
func TestRunTimeRatios(t *testing.T) {
	b := setup(t)
	for _, q := range []string{
		`INSERT INTO teams (slug, name, cost_center) VALUES ('learn', 'Learn', 'CC-L')`,
		`INSERT INTO users (oidc_subject, email, name) VALUES ('l1', 'l1@example.com', 'L One'), ('l2', 'l2@example.com', 'L Two'), ('l3', 'l3@example.com', 'L Three')`,
	} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// job inserts a job of user email in team learn that ran ranH of a
	// limitH-hour limit, submitted agoH hours before now.
	job := func(email, state string, segment int, ranH, limitH, agoH float64) {
		t.Helper()
		sub := b.now.Add(-time.Duration(agoH * float64(time.Hour)))
		start := sub.Add(time.Minute)
		end := start.Add(time.Duration(ranH * float64(time.Hour)))
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command, state, submitted_at, started_at, ended_at, segment)
			VALUES ('l', 'learn', (SELECT id FROM users WHERE email = $1), '3', 1, $2, '{true}', $3, $4, $5, $6, $7)`,
			email, int64(limitH*3600), state, sub, start, end, segment); err != nil {
			t.Fatal(err)
		}
	}
	// l1: four completions, ratios 0.1 0.2 0.3 0.4 (median 0.25), plus what
	// must not count: a failure, a requeued job, one from before the
	// window, one that ran past its limit counts as 1 … for l2.
	job("l1@example.com", "completed", 1, 1, 10, 5)
	job("l1@example.com", "completed", 1, 2, 10, 6)
	job("l1@example.com", "completed", 1, 3, 10, 7)
	job("l1@example.com", "completed", 1, 4, 10, 8)
	job("l1@example.com", "failed", 1, 9, 10, 9)
	job("l1@example.com", "completed", 2, 9, 10, 10)
	job("l1@example.com", "completed", 1, 9, 10, 24*40)
	// l2: two completions (fewer than 3: no ratio of its own), one over its limit.
	job("l2@example.com", "completed", 1, 12, 10, 3)
	job("l2@example.com", "completed", 1, 5, 10, 4)
	got, err := b.st.RunTimeRatios(b.ctx, b.now.Add(-30*24*time.Hour), 20, 3)
	if err != nil {
		t.Fatal(err)
	}
	var l1, l2, l3 int64
	for email, id := range map[string]*int64{"l1@example.com": &l1, "l2@example.com": &l2, "l3@example.com": &l3} {
		if err := b.pool.QueryRow(b.ctx, `SELECT id FROM users WHERE email = $1`, email).Scan(id); err != nil {
			t.Fatal(err)
		}
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if r, ok := got.ByUser[l1]; !ok || !near(r, 0.25) {
		t.Errorf("l1: %v %v, want the median of 0.1–0.4, 0.25", r, ok)
	}
	if r, ok := got.ByUser[l2]; ok {
		t.Errorf("l2 has a ratio of its own (%v) from 2 jobs, want none below 3", r)
	}
	if _, ok := got.ByUser[l3]; ok {
		t.Errorf("l3 never ran a job but has a ratio")
	}
	// The team: 0.1 0.2 0.3 0.4 0.5 1 → median 0.35.
	if r, ok := got.ByTeam["learn"]; !ok || !near(r, 0.35) {
		t.Errorf("team learn: %v %v, want 0.35", r, ok)
	}
	// The last 2 of the team only: l2's two (1 and 0.5) are its newest.
	got, err = b.st.RunTimeRatios(b.ctx, b.now.Add(-30*24*time.Hour), 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if r := got.ByTeam["learn"]; !near(r, 0.75) {
		t.Errorf("team learn, last 2: %v, want 0.75", r)
	}
}
