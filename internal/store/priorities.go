package store

import (
	"context"
)

// PriorityFilter selects pending jobs for QueueList. Zero fields
// match everything.
type PriorityFilter struct {
	Teams  []string // restrict to these teams; nil = all teams
	Team   string
	UserID int64
	Limit  int // default 100, at most 1000
}

// NodeAllocatedGPUs returns, per node, how many of its GPUs active
// allocations hold now (each GPU once, also when an orphan's hold is a
// second row for it).
func (s *Store) NodeAllocatedGPUs(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.Query(ctx, `SELECT node, count(DISTINCT gpu_index)::int FROM allocations WHERE released_at IS NULL GROUP BY node`)
	return collectMap[string, int](rows, err, "counting allocated GPUs")
}
