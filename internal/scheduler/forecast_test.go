package scheduler

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

func expected(d time.Duration) jobOpt { return func(j *Job) { j.Expected = d } }

// The forecast counts the blocked jobs ahead and ends running jobs at
// their expected run time; the limits estimate does neither.
func TestForecastQueueAhead(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Nodes: cluster(1, 8),
		// Ends by its limit at 15:00, expected at 14:20.
		Running: []Job{job(100, 8, limit(2*time.Hour), expected(80*time.Minute), on(time.Hour, slot(0, seq(0, 8)...)))},
		Pending: []Job{
			job(1, 8, limit(time.Hour), expected(30*time.Minute), submitted(2*time.Hour)),
			job(2, 8, limit(time.Hour), expected(30*time.Minute), submitted(time.Hour)),
			job(3, 8, limit(time.Hour), submitted(30*time.Minute)),
		},
	}
	p := Schedule(s, t0, allot())
	got := map[int64][2]time.Time{}
	for _, pi := range p.Pending {
		got[pi.JobID] = [2]time.Time{pi.EstStart, pi.EstStartLimits}
	}
	want := map[int64][2]time.Time{
		1: {t0.Add(20 * time.Minute), t0.Add(time.Hour)},     // reservation by limits at 15:00
		2: {t0.Add(50 * time.Minute), t0.Add(2 * time.Hour)}, // behind job 1 (its reservation held until 16:00)
		3: {t0.Add(80 * time.Minute), t0.Add(2 * time.Hour)}, // behind 1 and 2
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("EstStart, EstStartLimits (-want +got):\n%s", diff)
	}
	if r := pendingInfo(p, 2).Reason; !strings.Contains(r, "expected start 14:50 (forecast") || !strings.Contains(r, "by time limits 16:00") {
		t.Errorf("reason of job 2 = %q", r)
	}
	for _, id := range []int64{1, 2, 3} {
		if k := pendingInfo(p, id).EstKind; k != EstForecast {
			t.Errorf("EstKind of job %d = %q, want forecast", id, k)
		}
	}

	// ETALimits keeps the earlier estimate.
	lp := allot()
	lp.ETA = ETALimits
	lpl := Schedule(s, t0, lp)
	if got := pendingInfo(lpl, 2); !got.EstStart.Equal(t0.Add(2*time.Hour)) || got.EstKind != EstLimits {
		t.Errorf("ETALimits job 2: EstStart %v kind %q, want 16:00, limits", got.EstStart, got.EstKind)
	}
	if got := pendingInfo(lpl, 1); !got.EstStart.Equal(t0.Add(time.Hour)) || got.EstKind != EstReservation {
		t.Errorf("ETALimits job 1: EstStart %v kind %q, want 15:00, reservation", got.EstStart, got.EstKind)
	}

	// EstimateFor with NoPendingInfo: the same entry, for that job only.
	fp := allot()
	fp.NoPendingInfo, fp.EstimateFor = true, map[int64]bool{3: true}
	fpl := Schedule(s, t0, fp)
	if len(fpl.Pending) != 1 || len(fpl.Shares) != 0 {
		t.Fatalf("EstimateFor: pending %+v shares %+v", fpl.Pending, fpl.Shares)
	}
	if diff := cmp.Diff(pendingInfo(p, 3), fpl.Pending[0]); diff != "" {
		t.Errorf("EstimateFor entry (-full +filtered):\n%s", diff)
	}
}

// A tier-1 job whose only victims are younger than MinRuntime is expected
// when they pass it, plus the grace period: the job-page bug was a tier-1
// job told the time limits' estimate and started by preemption an hour
// earlier.
func TestForecastPreemptionStart(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Nodes:   cluster(1, 8),
		Running: []Job{job(100, 8, tier(Tier4), team("b"), limit(10*time.Hour), on(4*time.Minute, slot(0, seq(0, 8)...)))},
		Pending: []Job{job(1, 8, tier(Tier1), limit(time.Hour))},
		Teams:   teamsAB(4, 4),
	}
	p := Schedule(s, t0, allot())
	if len(p.Preemptions) != 0 {
		t.Fatalf("preempted a job younger than MinRuntime: %+v", p.Preemptions)
	}
	// MinRuntime 10 min: eligible at 14:06, plus 2 min grace.
	if got := pendingInfo(p, 1); !got.EstStart.Equal(t0.Add(8*time.Minute)) || got.EstKind != EstPreemption {
		t.Errorf("EstStart = %v (%q), want 14:08 (victim past MinRuntime + grace), preemption", got.EstStart, got.EstKind)
	}
	// Six minutes later it preempts, and its reservation is the grace end.
	p = Schedule(s, t0.Add(6*time.Minute), allot())
	if len(p.Preemptions) != 1 {
		t.Fatalf("preemptions = %+v", p.Preemptions)
	}
	if got := pendingInfo(p, 1); !got.EstStart.Equal(t0.Add(8*time.Minute)) || got.EstKind != EstPreemption {
		t.Errorf("after preempting: EstStart = %v (%q), want the grace end 14:08, preemption", got.EstStart, got.EstKind)
	}
}

// FIFO never backfills: the forecast keeps starts in queue order.
func TestForecastFIFOOrder(t *testing.T) {
	t.Parallel()
	s := Snapshot{
		Nodes:   cluster(1, 8),
		Running: []Job{job(100, 4, limit(2*time.Hour), on(time.Hour, slot(0, seq(0, 4)...)))},
		Pending: []Job{job(1, 8, submitted(2*time.Hour)), job(2, 1, submitted(time.Hour))},
	}
	p := Schedule(s, t0, mode(ModeFIFO))
	if got := pendingInfo(p, 2).EstStart; !got.Equal(t0.Add(2 * time.Hour)) {
		t.Errorf("FIFO: EstStart of job 2 = %v, want 16:00 (after job 1, which takes the node at 15:00)", got)
	}
	p = Schedule(s, t0, mode(ModeEASY))
	if len(p.Starts) != 1 || p.Starts[0].JobID != 2 {
		t.Fatalf("EASY starts = %+v", p.Starts)
	}
}

// The forecast's shortcuts (fcFast) choose what the scan of every
// eligible node chose: the same plans (EstStart included) with it on and
// off, on random snapshots (jobs with expected run times, so that the
// projection leaves gaps) and on a benchmark-like cluster in every mode.
// Not parallel: it switches the package-level fcFast.
func TestForecastIndexMatchesScan(t *testing.T) {
	defer func() { fcFast = true }()
	both := func(s Snapshot, now time.Time, p Policy) (Plan, Plan) {
		fcFast = true
		a := Schedule(s, now, p)
		fcFast = false
		b := Schedule(s, now, p)
		fcFast = true
		return a, b
	}
	rapid.Check(t, func(t *rapid.T) {
		s := genSnapshot(t)
		for i := range s.Running {
			if rapid.Bool().Draw(t, "run-expected") {
				s.Running[i].Expected = time.Duration(rapid.IntRange(1, 400).Draw(t, "run-exp")) * time.Minute
			}
		}
		for i := range s.Pending {
			if rapid.Bool().Draw(t, "pend-expected") {
				s.Pending[i].Expected = time.Duration(rapid.IntRange(1, 400).Draw(t, "pend-exp")) * time.Minute
			}
		}
		p := genPolicy(t)
		a, b := both(s, t0, p)
		if diff := cmp.Diff(b, a); diff != "" {
			t.Fatalf("index differs from the scan (-scan +index):\n%s", diff)
		}
	})
	r := rand.New(rand.NewPCG(7, 7))
	for _, size := range []struct{ pending, nodes int }{{3000, 300}, {800, 40}} {
		s := benchSnapshot(size.pending, size.nodes)
		for i := range s.Running {
			if r.IntN(2) == 0 {
				s.Running[i].Expected = time.Duration(1+r.IntN(600)) * time.Minute
			}
		}
		for i := range s.Pending {
			if r.IntN(2) == 0 {
				s.Pending[i].Expected = time.Duration(1+r.IntN(600)) * time.Minute
			}
		}
		for _, m := range allModes {
			p := DefaultPolicy()
			p.Mode = m
			a, b := both(s, t0, p)
			if diff := cmp.Diff(b, a); diff != "" {
				t.Fatalf("%s, %d × %d: index differs from the scan (-scan +index):\n%s", m, size.pending, size.nodes, diff)
			}
			n := 0
			for _, pi := range a.Pending {
				if pi.EstKind == EstForecast {
					n++
				}
			}
			if n == 0 {
				t.Errorf("%s, %d × %d: no forecast estimate to compare", m, size.pending, size.nodes)
			}
		}
	}
}
