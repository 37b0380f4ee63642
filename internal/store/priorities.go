package store

import (
	"context"

	"github.com/jackc/pgx/v5"
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
	if err != nil {
		return nil, mapErr("counting allocated GPUs", err)
	}
	out := map[string]int{}
	var node string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&node, &n}, func() error { out[node] = n; return nil })
	return out, mapErr("counting allocated GPUs", err)
}
