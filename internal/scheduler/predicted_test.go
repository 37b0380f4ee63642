package scheduler

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

func predicted(d time.Duration) jobOpt { return func(j *Job) { j.Predicted = d } }

// TestPredictedBackfill: under Policy.PredictedBackfill the head job's
// reservation is placed at the running job's predicted end (doubled while
// it outlives it, at most its limit), and a later job starts on the
// reserved GPUs when its predicted run ends by then, even if its time
// limit does not.
func TestPredictedBackfill(t *testing.T) {
	t.Parallel()
	// One 8-GPU node: job 100 holds 6 GPUs (limit 3 h); job 1 (tier 3)
	// needs the whole node and blocks; job 2 (tier 4, limit 3 h) fits in
	// the 2 free GPUs, which job 1's reservation counts on.
	snap := func(running, candidate Job) Snapshot {
		return Snapshot{
			Nodes:   cluster(1, 8),
			Running: []Job{running},
			Pending: []Job{job(1, 8, submitted(10*time.Minute), limit(time.Hour)), candidate},
		}
	}
	runner := func(ago, pred time.Duration) Job {
		return job(100, 6, limit(3*time.Hour), predicted(pred), on(ago, slot(0, seq(0, 6)...)))
	}
	cand := func(pred time.Duration) Job {
		return job(2, 2, tier(Tier4), limit(3*time.Hour), predicted(pred))
	}
	cases := []struct {
		name   string
		s      Snapshot
		pred   bool
		starts []int64
		resvAt time.Duration // job 1's reservation, after t0
	}{
		// By limits: job 100 ends at +2 h, job 2's limit at +3 h.
		{name: "by limits, the candidate would delay the reservation",
			s: snap(runner(time.Hour, 90*time.Minute), cand(20*time.Minute)), pred: false,
			starts: []int64{}, resvAt: 2 * time.Hour},
		// Predicted: job 100 ends at +30 min, job 2 at +20 min.
		{name: "by prediction, it ends before the shadow time",
			s: snap(runner(time.Hour, 90*time.Minute), cand(20*time.Minute)), pred: true,
			starts: []int64{2}, resvAt: 30 * time.Minute},
		{name: "predicted run past the shadow time",
			s: snap(runner(time.Hour, 90*time.Minute), cand(40*time.Minute)), pred: true,
			starts: []int64{}, resvAt: 30 * time.Minute},
		{name: "a candidate without a prediction runs its limit",
			s: snap(runner(time.Hour, 90*time.Minute), cand(0)), pred: true,
			starts: []int64{}, resvAt: 30 * time.Minute},
		// Job 100 has run 1 h of a predicted 30 min: 1 h (ends now,
		// outlived), then 2 h: +1 h.
		{name: "a running job past its prediction is predicted twice as long",
			s: snap(runner(time.Hour, 30*time.Minute), cand(50*time.Minute)), pred: true,
			starts: []int64{2}, resvAt: time.Hour},
		{name: "the doubled prediction is still the shadow time",
			s: snap(runner(time.Hour, 30*time.Minute), cand(70*time.Minute)), pred: true,
			starts: []int64{}, resvAt: time.Hour},
		// 2 h 30 min run of a predicted 30 min: 1 h, 2 h, 4 h capped at
		// the 3 h limit: +30 min.
		{name: "doubling stops at the time limit",
			s: snap(runner(150*time.Minute, 30*time.Minute), cand(20*time.Minute)), pred: true,
			starts: []int64{2}, resvAt: 30 * time.Minute},
		{name: "a running job without a prediction ends at its limit",
			s: snap(runner(time.Hour, 0), cand(20*time.Minute)), pred: true,
			starts: []int64{2}, resvAt: 2 * time.Hour},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := DefaultPolicy()
			p.PredictedBackfill = c.pred
			plan := Schedule(c.s, t0, p)
			if got := startIDs(plan); !slices.Equal(got, c.starts) {
				t.Errorf("starts %v, want %v", got, c.starts)
			}
			// (Job 2, of another class, may hold its own.)
			k := slices.IndexFunc(plan.Reservations, func(r Reservation) bool { return r.JobID == 1 })
			if k < 0 {
				t.Fatalf("reservations %+v, want one for job 1", plan.Reservations)
			}
			if got := plan.Reservations[k].At.Sub(t0); got != c.resvAt {
				t.Errorf("job 1 reserved at +%v, want +%v", got, c.resvAt)
			}
			if len(c.starts) > 0 && !plan.Starts[0].Backfill {
				t.Errorf("job 2 started without the backfill flag")
			}
		})
	}
}

// TestPropertyPredictedAtLimitsChangesNothing: predictions equal to the
// time limits (or none) give the plan of time limits.
func TestPropertyPredictedAtLimitsChangesNothing(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		s := genSnapshot(t)
		p := genPolicy(t)
		for _, js := range [][]Job{s.Running, s.Pending} {
			for i := range js {
				if rapid.Bool().Draw(t, "predict") {
					js[i].Predicted = js[i].TimeLimit
				}
			}
		}
		want := Schedule(s, t0, p)
		p.PredictedBackfill = true
		got := Schedule(s, t0, p)
		for _, x := range []struct {
			name string
			w, g any
		}{{"starts", want.Starts, got.Starts}, {"preemptions", want.Preemptions, got.Preemptions}, {"reservations", want.Reservations, got.Reservations}} {
			if diff := cmp.Diff(x.w, x.g); diff != "" {
				t.Fatalf("%s differ (-limits +predicted):\n%s", x.name, diff)
			}
		}
	})
}

// TestPropertyPredictedInvariants: with random predictions the plan keeps
// every invariant, reservations counted by predicted ends, and does not
// depend on the input's order.
func TestPropertyPredictedInvariants(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		s := genSnapshot(t)
		p := genPolicy(t)
		p.PredictedBackfill = true
		for _, js := range [][]Job{s.Running, s.Pending} {
			for i := range js {
				js[i].Predicted = time.Duration(rapid.IntRange(0, 240).Draw(t, "predMin")) * time.Minute
			}
		}
		before := cloneSnapshot(s)
		plan := Schedule(s, t0, p)
		if diff := cmp.Diff(before, s); diff != "" {
			t.Fatalf("Schedule mutated its input (-before +after):\n%s", diff)
		}
		checkPlan(t, s, p, plan)
		shuffled := cloneSnapshot(s)
		slices.Reverse(shuffled.Pending)
		slices.Reverse(shuffled.Running)
		if diff := cmp.Diff(plan, Schedule(shuffled, t0, p)); diff != "" {
			t.Fatalf("reversed input changes the plan (-sorted +reversed):\n%s", diff)
		}
	})
}
