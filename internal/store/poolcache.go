package store

import "sync"

// poolCache is what this process's Stores keep between calls, keyed by
// something that holds their pool (a Store in a transaction keeps
// nothing: see Store.Pool). It is bounded: when full it is emptied, which
// only tests, a pool each, reach.
type poolCache[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]V
}

const poolCacheMax = 10000

func (c *poolCache[K, V]) get(k K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	return v, ok
}

func (c *poolCache[K, V]) put(k K, v V) {
	c.update(k, func(V, bool) (V, bool) { return v, true })
}

// update calls f with k's entry under the lock and stores what f returns
// when f says so.
func (c *poolCache[K, V]) update(k K, f func(v V, ok bool) (V, bool)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[k]
	v, store := f(v, ok)
	if !store {
		return
	}
	if c.m == nil {
		c.m = map[K]V{}
	}
	if len(c.m) >= poolCacheMax {
		clear(c.m)
	}
	c.m[k] = v
}
