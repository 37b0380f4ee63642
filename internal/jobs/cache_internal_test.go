package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/scheduler"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
)

// TestCachedLoadMatchesFullLoad: what a scheduler's cycles keep between
// them (the open allocations and this month's usage, carried on while no
// allocation changes) never
// changes what a cycle sees or decides: after each step (starts by the
// cycles, submissions, cancels of pending and running jobs, a completion,
// a policy edit, a budget crossed by the running jobs' own seconds, the
// last and the first second of a month, the clock set back) the
// scheduler's cached load equals a fresh full load, and so does the plan
// the core makes of it. The quiet steps do carry the sums on.
func TestCachedLoadMatchesFullLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := storetest.Pool(t)
	st := store.New(pool)
	monthEnd := store.MonthStart(clock.Now()).AddDate(0, 1, 0)
	now := monthEnd.Add(-2 * time.Hour)
	st.Now = func() time.Time { return now }
	if err := demo.Seed(ctx, st); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	exec(`UPDATE nodes SET state = 'up', registered_at = $1, last_heartbeat = $1`, now)
	admin, err := st.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	s := &Scheduler{Store: st, MaxStarts: -1}
	sums := func() int {
		s.cacheMu.Lock()
		defer s.cacheMu.Unlock()
		return s.cache.MonthSums + s.cache.AllocReads
	}
	check := func(step string) {
		t.Helper()
		var cached, full store.SchedState
		err := st.InTx(ctx, func(tx *store.Store) error {
			var err error
			if cached, err = s.load(ctx, tx); err != nil {
				return err
			}
			full, err = tx.LoadSchedState(ctx)
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if !reflect.DeepEqual(cached.MonthUsed, full.MonthUsed) {
			t.Errorf("%s: this month's usage %v cached, %v loaded", step, cached.MonthUsed, full.MonthUsed)
		}
		if !reflect.DeepEqual(cached, full) {
			t.Errorf("%s: the cached state differs from a full load", step)
		}
		plan := func(x store.SchedState) scheduler.Plan {
			snap, _ := Snapshot(x)
			return scheduler.Schedule(snap, x.Now, corePolicy(x.Policy, x.Tiers))
		}
		if a, b := plan(cached), plan(full); !reflect.DeepEqual(a, b) {
			t.Errorf("%s: the plans differ:\ncached %+v\nfull   %+v", step, a, b)
		}
	}
	cycle := func(step string, d time.Duration) {
		t.Helper()
		now = now.Add(d)
		if _, err := s.Cycle(ctx); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		check(step)
	}
	submit := func(name, team string, tier allot.TierID, gpus int) allot.Job {
		t.Helper()
		j, err := st.SubmitJob(ctx, &admin, allot.JobSpec{Name: name, Team: team, Tier: tier, GPUs: gpus, TimeLimit: time.Hour, Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}

	cycle("first cycle", 0)
	cycle("after the first cycle's starts", 10*time.Second)
	n := sums()
	cycle("quiet", 10*time.Second)
	cycle("quiet again", 1500*time.Millisecond)
	if got := sums(); got != n {
		t.Errorf("quiet cycles read the allocations or summed the month's usage %d times, want them carried on", got-n)
	}

	for i := range 6 {
		submit(fmt.Sprint("cache-", i), []string{"fraud", "recs", "nlp"}[i%3], allot.Tier3, 1+i%2)
	}
	cycle("after submissions", 10*time.Second)

	var runningID int64
	pendingID := submit("cache-cancelled", "recs", allot.Tier4, 1).ID
	if err := pool.QueryRow(ctx, `SELECT id FROM jobs WHERE state = 'running' AND backend = 'native' ORDER BY id LIMIT 1`).Scan(&runningID); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{pendingID, runningID} {
		if _, err := st.CancelJob(ctx, &admin, id); err != nil {
			t.Fatal(err)
		}
	}
	cycle("after cancelling a pending and a running job", 10*time.Second)

	// A running job completes: its allocations are released.
	exec(`WITH j AS (SELECT id FROM jobs WHERE state = 'running' AND backend = 'native' ORDER BY id DESC LIMIT 1),
		a AS (UPDATE allocations SET released_at = $1 WHERE job_id IN (SELECT id FROM j) AND released_at IS NULL)
		UPDATE jobs SET state = 'completed', ended_at = $1, exit_code = 0 WHERE id IN (SELECT id FROM j)`, now)
	cycle("after a completion", 10*time.Second)

	if _, err := st.UpdatePolicy(ctx, store.PolicyChange{Actor: admin.Email, Action: "policy.update", Object: "policy"},
		func(v *store.PolicyValues) error {
			return json.Unmarshal([]byte(`{"half_life_s": 86400, "budget_warn_pct": 40, "budget_demote_pct": 50}`), v)
		}); err != nil {
		t.Fatal(err)
	}
	cycle("after a policy edit", 10*time.Second)

	// loaded is the scheduler's cached load, with no cycle.
	loaded := func() store.SchedState {
		t.Helper()
		var x store.SchedState
		if err := st.InTx(ctx, func(tx *store.Store) (err error) { x, err = s.load(ctx, tx); return err }); err != nil {
			t.Fatal(err)
		}
		return x
	}

	// The jobs are kept by row version: a load with no write between reads
	// no job row whole; one after writes reads exactly the rows written
	// (a pending and a running job edited), not one whose write rolled
	// back, and a changed email shows without its jobs' rows.
	jobRows := func() int {
		s.cacheMu.Lock()
		defer s.cacheMu.Unlock()
		return s.cache.JobRows()
	}
	idOf := func(state string, offset int) int64 {
		t.Helper()
		var id int64
		if err := pool.QueryRow(ctx, `SELECT id FROM jobs WHERE state = $1 AND backend = 'native' ORDER BY id LIMIT 1 OFFSET $2`, state, offset).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	submit("cache-edited", "nlp", allot.Tier4, 1)
	submit("cache-rolled-back", "fraud", allot.Tier4, 1)
	loaded()
	n = jobRows()
	loaded()
	if got := jobRows() - n; got != 0 {
		t.Errorf("a load with nothing written read %d job rows whole, want 0", got)
	}
	pendingEdited, runningEdited, rolledBack := idOf("pending", 0), idOf("running", 0), idOf("pending", 1)
	exec(`UPDATE jobs SET gpus = gpus + 1, name = 'edited' WHERE id = $1`, pendingEdited)
	exec(`UPDATE jobs SET time_limit_s = time_limit_s + 60 WHERE id = $1`, runningEdited)
	exec(`UPDATE users SET email = 'renamed-' || email WHERE id = (SELECT user_id FROM jobs WHERE id = $1)`, rolledBack)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE jobs SET gpus = 7 WHERE id = $1`, rolledBack); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	n = jobRows()
	check("after a pending and a running job were edited and an email changed")
	if got := jobRows() - n; got != 2 {
		t.Errorf("the load after two jobs were edited read %d job rows whole, want 2", got)
	}
	x := loaded()
	found := 0
	for _, j := range x.Pending {
		if j.ID == pendingEdited {
			found++
			if j.Name != "edited" {
				t.Errorf("edited pending job %d loaded as %q", j.ID, j.Name)
			}
		}
		if j.ID == rolledBack {
			found++
			if !strings.HasPrefix(j.User, "renamed-") || j.GPUs == 7 {
				t.Errorf("job %d loaded with its user's old email %q or its rolled-back GPUs (%d)", j.ID, j.User, j.GPUs)
			}
		}
	}
	if found != 2 {
		t.Errorf("found %d of the edited pending job %d and job %d among the pending, want both", found, pendingEdited, rolledBack)
	}
	cycle("after the edits", 10*time.Second)

	// A budget that the running jobs' seconds cross between two quiet
	// cycles: the carried sums must see it as a fresh sum does.
	var team string
	for _, r := range loaded().Running {
		if len(r.Parts) > 0 {
			team = r.Team
			break
		}
	}
	if team == "" {
		t.Fatal("no running job")
	}
	var open int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM allocations a JOIN jobs j ON j.id = a.job_id WHERE j.team = $1 AND a.released_at IS NULL`, team).Scan(&open); err != nil {
		t.Fatal(err)
	}
	// Over 50 % of the budget (budget × 1800 GPU-seconds) a little after
	// the usage reaches used + open × 30 s.
	budget := (loaded().MonthUsed[team]+open*30)/1800 + 1
	exec(`UPDATE teams SET monthly_budget_gpu_hours = $2 WHERE slug = $1`, team, budget)
	over := func() bool {
		x := loaded()
		return x.MonthUsed[team]*100 >= budget*3600*int64(x.Policy.BudgetDemotePct)
	}
	cycle("budget set", 10*time.Second)
	wasOver := over()
	need := (budget*1800-loaded().MonthUsed[team])/open + 1
	n = sums()
	for i := range 4 {
		cycle(fmt.Sprint("towards the budget ", i), time.Duration(need/4+1)*time.Second)
	}
	if got := sums(); got-n >= 4 {
		t.Errorf("quiet cycles towards the budget read the allocations or summed the month's usage %d times, want them carried on", got-n)
	}
	if wasOver || !over() {
		t.Errorf("team %s over its budget: %v before, %v after the quiet cycles; want it crossed", team, wasOver, over())
	}

	now = monthEnd.Add(-1500 * time.Millisecond)
	cycle("the month's last seconds", 0)
	cycle("the month's last second", time.Second)
	cycle("the first second of the month", 500*time.Millisecond)
	if !now.Equal(monthEnd) {
		t.Fatalf("now %v, want %v", now, monthEnd)
	}
	cycle("within the first second", 999*time.Millisecond)
	cycle("the month's second second", time.Millisecond)
	cycle("clock set back", -time.Minute)
}

// TestDecayEveryPeriod: the cycles decay the fair-share usage (and bring
// it up to now) on the scheduler's first cycle, when DecayPeriod has
// passed since the last decay, and after a policy edit; not in between.
// DecayPeriod < 0 decays every cycle.
func TestDecayEveryPeriod(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := storetest.Pool(t)
	st := store.New(pool)
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	if err := demo.Seed(ctx, st); err != nil {
		t.Fatal(err)
	}
	admin, err := st.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	decayedAt := func() time.Time {
		var at time.Time
		if err := pool.QueryRow(ctx, `SELECT min(updated_at) FROM team_usage`).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at.UTC()
	}
	s := &Scheduler{Store: st}
	cycle := func(step string, d time.Duration, want time.Time) {
		t.Helper()
		now = now.Add(d)
		if _, err := s.Cycle(ctx); err != nil {
			t.Fatal(err)
		}
		if got := decayedAt(); !got.Equal(want) {
			t.Errorf("%s: usage as of %v, want %v", step, got, want)
		}
	}
	t0 := now
	cycle("first cycle", 0, t0)
	cycle("10 s later", 10*time.Second, t0)
	cycle("50 s later", 40*time.Second, t0)
	cycle("a minute later", 10*time.Second, t0.Add(time.Minute))
	cycle("70 s later", 10*time.Second, t0.Add(time.Minute))
	if _, err := st.UpdatePolicy(ctx, store.PolicyChange{Actor: admin.Email, Action: "policy.update", Object: "policy"},
		func(v *store.PolicyValues) error { return json.Unmarshal([]byte(`{"half_life_s": 3600}`), v) }); err != nil {
		t.Fatal(err)
	}
	cycle("after a policy edit", 10*time.Second, t0.Add(80*time.Second))
	cycle("10 s after the edit", 10*time.Second, t0.Add(80*time.Second))
	s2 := &Scheduler{Store: st}
	now = now.Add(10 * time.Second)
	if _, err := s2.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	if got := decayedAt(); !got.Equal(now) {
		t.Errorf("a new scheduler's first cycle: usage as of %v, want %v", got, now)
	}
	s.DecayPeriod = -1
	cycle("every cycle", 10*time.Second, now.Add(10*time.Second))
	cycle("every cycle again", 10*time.Second, now.Add(10*time.Second))
}
