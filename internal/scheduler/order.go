package scheduler

import (
	"cmp"
	"slices"
)

// OrderMemory remembers the order in which one caller's last cycle served
// its queue (Snapshot.Order), so that the next cycle sorts a queue that is
// nearly sorted already: between two cycles a few jobs arrive or leave and
// priorities drift, but most pairs keep their order. The jobs are laid out
// in the last order, the new ones sorted apart and merged in, and an
// insertion sort (falling back to a full sort when the queue moved much)
// finishes the job. The order produced is exactly the full sort's: the
// memory is a hint, never a decision, so nil or a memory from another
// queue is always correct, only slower. On a loaded replay with thousands
// of jobs waiting the sort was two thirds of every cycle.
//
// It is not safe for concurrent use: one memory per caller that schedules
// one cycle at a time.
type OrderMemory struct {
	base  int64   // job ID of rank[0]
	rank  []int32 // by job ID − base: 1 + the job's position in the last order; 0: not in it
	n     int     // jobs in the last order
	keys  []orderKey
	old   []orderKey // scratch: the jobs of the last order, in it
	fresh []orderKey // scratch: the others
	pos   []int32    // scratch: by last position, the index in keys or -1
	// Full counts the cycles that fell back to a full sort (tests).
	Full int
}

// maxRankSpan bounds the rank table: job IDs spanning more than this many
// times the queue's length, plus 4,096 (a job pending for months among
// new ones, say), are not remembered.
const maxRankSpan = 4

func (m *OrderMemory) rankOf(id int64) int32 {
	if i := id - m.base; i >= 0 && i < int64(len(m.rank)) {
		return m.rank[i]
	}
	return 0
}

// buf returns a key buffer of length n for preparePendingAll to fill:
// m's own, else (m nil) the pooled state's scratch *scratch.
func (m *OrderMemory) buf(n int, scratch *[]orderKey) []orderKey {
	if m == nil {
		*scratch = resize(*scratch, n)
		return *scratch
	}
	m.keys = resize(m.keys, n)
	return m.keys
}

// cmpOrderKey is the queue order: class, held reservations first, higher
// priority first, then submit time, id and (for duplicated IDs, bad input)
// the position in Snapshot.Pending, so that no two keys compare equal and
// every sort gives the same order. As cmp.Or of the comparisons, without
// computing the later ones when an earlier one decides.
func cmpOrderKey(a, b orderKey) int {
	if a.class != b.class {
		return cmp.Compare(a.class, b.class)
	}
	if a.held != b.held {
		return cmp.Compare(b.held, a.held)
	}
	if c := cmp.Compare(b.prio, a.prio); c != 0 {
		return c
	}
	if a.submit != b.submit {
		return cmp.Compare(a.submit, b.submit)
	}
	if a.id != b.id {
		return cmp.Compare(a.id, b.id)
	}
	return cmp.Compare(a.idx, b.idx)
}

// sortOrder sorts keys by cmpOrderKey, using and then updating m (nil:
// a plain sort). It returns the sorted keys, which are keys itself.
func (m *OrderMemory) sortOrder(keys []orderKey) []orderKey {
	if m == nil {
		slices.SortFunc(keys, cmpOrderKey)
		return keys
	}
	m.pos = slices.Grow(m.pos[:0], m.n)[:m.n]
	for i := range m.pos {
		m.pos[i] = -1
	}
	fresh := m.fresh[:0]
	for i := range keys {
		r := m.rankOf(keys[i].id)
		if r == 0 || int(r) > m.n || m.pos[r-1] >= 0 {
			fresh = append(fresh, keys[i])
			continue
		}
		m.pos[r-1] = int32(i)
	}
	old := m.old[:0]
	for _, p := range m.pos {
		if p >= 0 {
			old = append(old, keys[p])
		}
	}
	if !insertionSortBounded(old, 4*len(old)+64) {
		m.Full++
		slices.SortFunc(old, cmpOrderKey)
	}
	slices.SortFunc(fresh, cmpOrderKey)
	// Merge the two sorted runs back into keys.
	i, j, k := 0, 0, 0
	for i < len(old) && j < len(fresh) {
		if cmpOrderKey(old[i], fresh[j]) <= 0 {
			keys[k] = old[i]
			i++
		} else {
			keys[k] = fresh[j]
			j++
		}
		k++
	}
	k += copy(keys[k:], old[i:])
	copy(keys[k:], fresh[j:])
	m.old, m.fresh = old, fresh
	m.remember(keys)
	return keys
}

// remember records the order of keys for the next cycle.
func (m *OrderMemory) remember(keys []orderKey) {
	m.n = 0
	if len(keys) == 0 {
		m.rank = m.rank[:0]
		return
	}
	lo, hi := keys[0].id, keys[0].id
	for _, k := range keys[1:] {
		lo, hi = min(lo, k.id), max(hi, k.id)
	}
	span := hi - lo + 1
	if span <= 0 || span > int64(maxRankSpan*len(keys)+4096) {
		m.rank = m.rank[:0]
		return
	}
	m.base = lo
	m.rank = resize(m.rank, int(span))
	for i, k := range keys {
		m.rank[k.id-lo] = int32(i + 1)
	}
	m.n = len(keys)
}

// insertionSortBounded sorts a by cmpOrderKey by insertion, and gives up
// (reporting false, a still a permutation of itself) once it has moved
// more than limit elements.
func insertionSortBounded(a []orderKey, limit int) bool {
	moves := 0
	for i := 1; i < len(a); i++ {
		if cmpOrderKey(a[i-1], a[i]) <= 0 {
			continue
		}
		x := a[i]
		j := i
		for j > 0 && cmpOrderKey(a[j-1], x) > 0 {
			a[j] = a[j-1]
			j--
		}
		a[j] = x
		if moves += i - j; moves > limit {
			return false
		}
	}
	return true
}
