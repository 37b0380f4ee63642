package scheduler

import (
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestPropertySortEventsMatchesSortFunc: the radix sort orders any events
// exactly as slices.SortFunc(cmpEvent) does (distinct ids, as running jobs
// have), across short slices, times and ids on both sides of zero, narrow
// and 62-bit spreads (the fallback), and duplicate times.
func TestPropertySortEventsMatchesSortFunc(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 3000).Draw(t, "n")
		atSpan := rapid.SampledFrom([]int64{1, 60, 1 << 20, 1 << 40, 1 << 60, math.MaxInt64}).Draw(t, "atSpan")
		atBase := rapid.Int64Range(-1<<40, 1<<40).Draw(t, "atBase")
		idBase := rapid.SampledFrom([]int64{0, 1, -5000, 1 << 40, math.MaxInt64 - 10000}).Draw(t, "idBase")
		seed := rapid.Uint64().Draw(t, "seed")
		evs := make([]event, n)
		ids := rapid.Permutation(seqInt64(n)).Draw(t, "ids")
		x := seed | 1
		for i := range evs {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			at := atBase + int64(x%uint64(atSpan))
			if atSpan == math.MaxInt64 && x&1 == 0 {
				at = math.MinInt64 + int64(x>>1)
			}
			evs[i] = event{at: at, kind: evKind(x >> 60 & 3), idx: i, id: idBase + ids[i]}
		}
		want := slices.Clone(evs)
		slices.SortFunc(want, cmpEvent)
		var tmp []event
		if rapid.Bool().Draw(t, "dirtyScratch") {
			tmp = make([]event, n/2)
		}
		sortEvents(evs, tmp)
		if !slices.Equal(evs, want) {
			for i := range evs {
				if evs[i] != want[i] {
					t.Fatalf("n=%d: position %d: got %+v, want %+v", n, i, evs[i], want[i])
				}
			}
		}
	})
}

func seqInt64(n int) []int64 {
	s := make([]int64, n)
	for i := range s {
		s[i] = int64(i)
	}
	return s
}

// TestSortEventsKeepsEqualKeysInInputOrder: bad input (two releases with
// the same time, kind and id) keeps its order, so a cycle is a function of
// its snapshot.
func TestSortEventsKeepsEqualKeysInInputOrder(t *testing.T) {
	evs := make([]event, 1000)
	for i := range evs {
		evs[i] = event{at: int64(999 - i%500), kind: evRun, idx: i, id: 7}
	}
	sortEvents(evs, nil)
	for i := 1; i < len(evs); i++ {
		a, b := evs[i-1], evs[i]
		if a.at > b.at || a.at == b.at && a.idx > b.idx {
			t.Fatalf("position %d: %+v after %+v", i, b, a)
		}
	}
}
