package jobs

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestSpaceOutSpacesConcurrentCycles: cycles that ask to start at once (a
// periodic one and requested ones) start at least MinInterval apart, each
// after the one before; a caller whose context ends while it waits does
// not start; without MinInterval none waits.
func TestSpaceOutSpacesConcurrentCycles(t *testing.T) {
	t.Parallel()
	const interval = 40 * time.Millisecond
	w := &ScheduleWorker{MinInterval: interval}
	ctx := context.Background()
	t0 := time.Now() // real clock: the waits are real pauses
	var mu sync.Mutex
	var starts []time.Time
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if !w.spaceOut(ctx, true) {
				t.Error("spaceOut refused with a live context")
			}
			mu.Lock()
			starts = append(starts, time.Now()) // real clock, as t0
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	// Timers never fire early: the i-th start (from 0) is at least i
	// intervals after the calls, however late a goroutine woke.
	for i, at := range starts {
		if d := at.Sub(t0); d < time.Duration(i)*interval {
			t.Errorf("cycle %d started %v after the calls, want at least %v", i, d, time.Duration(i)*interval)
		}
	}

	// A caller whose context ends while it waits does not start, and gives
	// its slot back.
	w.mu.Lock()
	reserved := time.Now().Add(time.Hour) // real clock: a slot far ahead
	w.lastCycle = reserved
	w.mu.Unlock()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if w.spaceOut(cancelled, true) {
		t.Error("spaceOut started a cycle whose context had ended while it waited")
	}
	w.mu.Lock()
	if !w.lastCycle.Equal(reserved) {
		t.Errorf("after the cancelled wait the last start is %v, want the one before it (%v)", w.lastCycle, reserved)
	}
	w.mu.Unlock()

	// Without MinInterval nothing waits: even a caller whose context has
	// ended starts (it never waits on it).
	free := &ScheduleWorker{}
	for range 3 {
		if !free.spaceOut(cancelled, true) {
			t.Fatal("without MinInterval spaceOut waited")
		}
	}
}

// TestSpaceOutDutyRests: with Duty, a cycle that took d is followed by a
// pause of d × (1 − Duty) / Duty before the next starts (at most
// MaxMinCycleInterval); Duty 1 (or unset) never pauses.
func TestSpaceOutDutyRests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const took = 60 * time.Millisecond
	w := &ScheduleWorker{Duty: 0.5}
	w.ranFor(time.Now().Add(-took)) // real clock: a cycle of 60 ms that just ended
	t0 := time.Now()                // real clock: the pause is real
	if !w.spaceOut(ctx, true) {
		t.Fatal("spaceOut refused with a live context")
	}
	if d := time.Since(t0); d < took-5*time.Millisecond {
		t.Errorf("the next cycle started %v after the last ended, want about %v (Duty 0.5)", d, took)
	}
	// A quarter duty rests three times as long as the cycle took; a cycle
	// of an hour rests MaxMinCycleInterval at most; Duty 1 or 0 never.
	for _, c := range []struct {
		duty       float64
		took, rest time.Duration
	}{{0.25, took, 3 * took}, {0.5, time.Hour, MaxMinCycleInterval}, {1e-12, 10 * time.Second, MaxMinCycleInterval}, {1, time.Hour, 0}, {0, time.Hour, 0}} {
		w := &ScheduleWorker{Duty: c.duty}
		end := time.Now() // real clock
		w.lastEnd, w.lastTook = end, c.took
		if got := w.earliest(end, true); !got.Equal(end.Add(c.rest)) {
			t.Errorf("Duty %v after a cycle of %v: next start %v after it ended, want %v", c.duty, c.took, got.Sub(end), c.rest)
		}
		// A cycle continuing deferred starts does not rest.
		if got := w.earliest(end, false); !got.Equal(end) {
			t.Errorf("Duty %v, deferred starts: next start %v after the last ended, want at once", c.duty, got.Sub(end))
		}
	}
}
