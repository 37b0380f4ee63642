package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// PriorityFilter selects pending jobs for PendingByPriority. Zero fields
// match everything.
type PriorityFilter struct {
	Teams  []string // restrict to these teams; nil = all teams
	Team   string
	UserID int64
	Limit  int // default 100, at most 1000
}

// PendingByPriority returns pending jobs in the scheduler's order: class
// (as the last cycle ran it, ranked by its tier's class_order), priority
// (highest first), submission, id — the order QueuePositionOf ranks in.
// Priority and breakdown are what the last scheduling cycle stored.
func (s *Store) PendingByPriority(ctx context.Context, f PriorityFilter) ([]allot.Job, error) {
	where, args := JobFilter{Teams: f.Teams, Team: f.Team, State: allot.JobPending, UserID: f.UserID}.where()
	switch {
	case f.Limit <= 0:
		f.Limit = 100
	case f.Limit > 1000:
		f.Limit = 1000
	}
	args = append(args, f.Limit)
	q := jobSelect + " WHERE " + strings.Join(where, " AND ") +
		fmt.Sprintf(" ORDER BY %s, j.priority DESC, j.submitted_at, j.id LIMIT $%d", classSQL, len(args))
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, mapErr("listing pending jobs by priority", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (allot.Job, error) { return scanJob(r) })
	return out, mapErr("listing pending jobs by priority", err)
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
