package scheduler

import (
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestPropertySortEventsMatchesSortFunc: the radix sort orders any events
// exactly as slices.SortFunc(cmpEvent) does (distinct ids, as running jobs
// have), across short slices, times and ids on both sides of zero, ids
// spread over all of int64, time spreads up to 61 bits (the widest the
// radix path takes) and of 62, 63 and 64 bits (the fallback), duplicate
// times, and a scratch buffer long enough to reuse and full of other
// events.
func TestPropertySortEventsMatchesSortFunc(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 3000).Draw(t, "n")
		atSpan := rapid.SampledFrom([]int64{1, 60, 1 << 20, 1 << 40, 1 << 60, 1 << 61, 1 << 62, math.MaxInt64}).Draw(t, "atSpan")
		atBase := rapid.Int64Range(-1<<40, 1<<40).Draw(t, "atBase")
		idBase := rapid.SampledFrom([]int64{0, 1, -5000, 1 << 40, math.MaxInt64 - 10000}).Draw(t, "idBase")
		// Multiplying by an odd number is one-to-one modulo 2^64, so the
		// ids stay distinct while spreading over the whole range.
		idMul := rapid.SampledFrom([]uint64{1, 0x9e3779b97f4a7c15}).Draw(t, "idMul")
		// With the widest spread, half the times from the bottom of int64
		// (a 64-bit spread) or none (63 bits).
		signMix := rapid.Bool().Draw(t, "signMix")
		seed := rapid.Uint64().Draw(t, "seed")
		evs := make([]event, n)
		ids := rapid.Permutation(seqInt64(n)).Draw(t, "ids")
		x := seed | 1
		for i := range evs {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			at := atBase + int64(x%uint64(atSpan))
			if atSpan == math.MaxInt64 && signMix && x&1 == 0 {
				at = math.MinInt64 + int64(x>>1)
			}
			id := int64(uint64(ids[i])*idMul + uint64(idBase))
			evs[i] = event{at: at, kind: evKind(x >> 60 & 3), idx: i, id: id}
		}
		want := slices.Clone(evs)
		slices.SortFunc(want, cmpEvent)
		var tmp []event
		if rapid.Bool().Draw(t, "dirtyScratch") {
			tmp = make([]event, n, 2*n+1)
			for i := range tmp {
				tmp[i] = event{at: int64(i), kind: evGrace, idx: -i, id: -int64(i)}
			}
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
