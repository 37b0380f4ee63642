package scheduler

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

// TestOrderMemorySorts: over cycles in which jobs leave, arrive, drift in
// priority, swap classes and come in any order, sortOrder returns exactly
// the plain sort's order; a queue that barely moved is finished by the
// insertion sort, one turned upside down by the full sort, both right.
func TestOrderMemorySorts(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	m := new(OrderMemory)
	var keys []orderKey
	nextID := int64(1)
	for cycle := range 200 {
		// Some leave, some arrive, every priority drifts a little.
		keys = slices.DeleteFunc(keys, func(orderKey) bool { return r.IntN(20) == 0 })
		for range r.IntN(30) {
			keys = append(keys, orderKey{class: Tier(1 + r.IntN(4)), prio: r.Float64(), submit: -r.Int64N(1e6), id: nextID})
			nextID++
		}
		for i := range keys {
			keys[i].prio += (r.Float64() - 0.5) * 0.01
			if r.IntN(500) == 0 {
				keys[i].class = Tier(1 + r.IntN(4))
			}
			if r.IntN(1000) == 0 {
				keys[i].id = keys[r.IntN(len(keys))].id // a duplicated ID (bad input)
			}
		}
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		upsideDown := cycle == 150
		if upsideDown {
			for i := range keys {
				keys[i].prio = -keys[i].prio
			}
		}
		for i := range keys {
			keys[i].idx = i
		}
		want := slices.Clone(keys)
		slices.SortFunc(want, cmpOrderKey)
		full := m.Full
		got := m.sortOrder(slices.Clone(keys))
		if !slices.Equal(got, want) {
			t.Fatalf("cycle %d: order with the memory differs from the plain sort", cycle)
		}
		if upsideDown && m.Full == full {
			t.Fatalf("cycle %d: a reversed queue was insertion-sorted", cycle)
		}
		if !upsideDown && cycle > 0 && cycle != 151 && m.Full != full {
			t.Fatalf("cycle %d: a queue that barely moved fell back to the full sort", cycle)
		}
	}
	// IDs spanning far more than the queue are not remembered, and still sort.
	wide := []orderKey{{id: 1, prio: 1}, {id: 1 << 40, prio: 2, idx: 1}}
	got := m.sortOrder(slices.Clone(wide))
	if got[0].id != 1<<40 || m.n != 0 {
		t.Fatalf("wide IDs: got %v, remembered %d", got, m.n)
	}
}

// TestPropertyOrderMemoryMatchesPlainSort: a sequence of cycles whose queue
// changes (jobs start, arrive, come in another order) plans with an
// OrderMemory exactly as without one.
func TestPropertyOrderMemoryMatchesPlainSort(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		s := genSnapshot(t)
		p := genPolicy(t)
		mem := new(OrderMemory)
		now := t0
		nextID := int64(1000)
		for step := range rapid.IntRange(1, 6).Draw(t, "steps") {
			s.Order = nil
			want := Schedule(s, now, p)
			s.Order = mem
			got := Schedule(s, now, p)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("step %d: with the order memory (-without +with):\n%s", step, diff)
			}
			now = now.Add(time.Duration(rapid.IntRange(0, 3600).Draw(t, "dt")) * time.Second)
			started := map[int64]bool{}
			for _, st := range want.Starts {
				started[st.JobID] = true
			}
			pending := slices.DeleteFunc(slices.Clone(s.Pending), func(j Job) bool { return started[j.ID] })
			if len(s.Pending) > 0 {
				for range rapid.IntRange(0, 2).Draw(t, "arrivals") {
					j := s.Pending[rapid.IntRange(0, len(s.Pending)-1).Draw(t, "like")]
					j.ID, j.Submit = nextID, now
					nextID++
					pending = append(pending, j)
				}
			}
			if rapid.Bool().Draw(t, "reverse") {
				slices.Reverse(pending)
			}
			s.Pending = pending
		}
	})
}
