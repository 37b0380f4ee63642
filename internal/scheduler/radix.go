package scheduler

import (
	"math/bits"
	"slices"
)

// radixMin is the shortest slice sortEvents sorts by radix; shorter ones
// go to slices.SortFunc, which is faster there.
const radixMin = 256

// radixBits is the width of one digit of sortEvents' radix sort.
const radixBits = 11

// sortEvents sorts evs by cmpEvent, using tmp (grown as needed, returned
// for reuse) as scratch. A cycle sorts every running job's release
// (53,468 of them in the 50k × 10k benchmark): a stable LSD radix sort,
// first by id, then by (at, kind), takes a few linear passes where a
// comparison sort takes n log n calls of cmpEvent. Events with equal (at,
// kind, id), which only bad input gives, keep their input order on the
// radix path (and get slices.SortFunc's order, deterministic too, below
// radixMin events or in the fallback). When the spread of the times needs
// more than 61 bits, leaving no room for the kind's two, it falls back to
// slices.SortFunc.
func sortEvents(evs, tmp []event) []event {
	if len(evs) < radixMin {
		slices.SortFunc(evs, cmpEvent)
		return tmp
	}
	minAt, maxAt := evs[0].at, evs[0].at
	minID, maxID := evs[0].id, evs[0].id
	for i := range evs {
		e := &evs[i]
		minAt, maxAt = min(minAt, e.at), max(maxAt, e.at)
		minID, maxID = min(minID, e.id), max(maxID, e.id)
	}
	// uint64 subtraction gives the exact spread even across int64's sign.
	atSpan, idSpan := uint64(maxAt)-uint64(minAt), uint64(maxID)-uint64(minID)
	if bits.Len64(atSpan) > 61 {
		slices.SortFunc(evs, cmpEvent)
		return tmp
	}
	tmp = resize(tmp, len(evs))
	atKey := func(e *event) uint64 { return (uint64(e.at)-uint64(minAt))<<2 | uint64(e.kind&3) }
	idKey := func(e *event) uint64 { return uint64(e.id) - uint64(minID) }
	src, dst := evs, tmp
	var count [1 << radixBits]int
	pass := func(key func(*event) uint64, shift uint) {
		clear(count[:])
		for i := range src {
			count[key(&src[i])>>shift&(1<<radixBits-1)]++
		}
		// A digit that every event shares orders nothing.
		if count[key(&src[0])>>shift&(1<<radixBits-1)] == len(src) {
			return
		}
		sum := 0
		for d, c := range count {
			count[d] = sum
			sum += c
		}
		for i := range src {
			d := key(&src[i]) >> shift & (1<<radixBits - 1)
			dst[count[d]] = src[i]
			count[d]++
		}
		src, dst = dst, src
	}
	for shift := uint(0); shift < uint(bits.Len64(idSpan)); shift += radixBits {
		pass(idKey, shift)
	}
	for shift := uint(0); shift < uint(bits.Len64(atSpan<<2|3)); shift += radixBits {
		pass(atKey, shift)
	}
	if &src[0] != &evs[0] {
		copy(evs, src)
	}
	return tmp
}
