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
	var mu sync.Mutex
	var starts []time.Time
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if !w.spaceOut(ctx) {
				t.Error("spaceOut refused with a live context")
			}
			mu.Lock()
			starts = append(starts, time.Now()) // real clock: the waits are real pauses
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	// Timers never fire early: each start is at least an interval after
	// the one before (the first may go at once).
	for i := 1; i < len(starts); i++ {
		if d := starts[i].Sub(starts[i-1]); d < interval-time.Millisecond {
			t.Errorf("cycles %d and %d started %v apart, want at least %v", i-1, i, d, interval)
		}
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if w.spaceOut(cancelled) {
		t.Error("spaceOut started a cycle whose context had ended while it waited")
	}

	// Without MinInterval nothing waits: even a caller whose context has
	// ended starts (it never waits on it).
	free := &ScheduleWorker{}
	for range 3 {
		if !free.spaceOut(cancelled) {
			t.Fatal("without MinInterval spaceOut waited")
		}
	}
}
