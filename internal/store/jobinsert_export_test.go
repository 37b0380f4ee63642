package store

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestRow is a job row for the group-insert tests (package store_test).
type TestRow struct {
	Name, Team, Tier string
	UserID           int64
	Command          []string
	SubmittedAt      time.Time
}

// InsertGroupForTest writes rows as one group on pool's inserter, as its
// workers do, and returns each row's id and error in rows' order.
func InsertGroupForTest(pool *pgxpool.Pool, rows []TestRow) ([]int64, []error) {
	in := &jobInserter{pool: pool}
	group := make([]*jobInsert, len(rows))
	for i, r := range rows {
		group[i] = &jobInsert{row: r.row(), done: make(chan struct{})}
	}
	in.write(group)
	ids, errs := make([]int64, len(rows)), make([]error, len(rows))
	for i, r := range group {
		ids[i], errs[i] = r.out.ID, r.err
	}
	return ids, errs
}

func (r TestRow) row() *jobRow {
	return &jobRow{Name: r.Name, Team: r.Team, UserID: r.UserID, Tier: r.Tier, GPUs: 1, TimeLimitS: 60,
		Command: r.Command, Env: json.RawMessage(`{"K":"v"}`), SecretEnv: json.RawMessage(`{}`), SubmittedAt: r.SubmittedAt,
		PendingReason: "waiting"}
}

// InsertAbandonedForTest submits r on an inserter whose workers are all
// busy, gives up after 20 ms while the row is still queued, then lets a
// worker run until it idles out; it returns the submitter's error.
func InsertAbandonedForTest(pool *pgxpool.Pool, r TestRow) error {
	in := &jobInserter{pool: pool, queue: make(chan *jobInsert, 4), workers: insertWorkers} // no worker starts
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := in.insert(ctx, r.row())
	in.work() // takes the abandoned row, writes nothing, exits after insertIdle
	return err
}

// GroupedRows is how many rows this process wrote in statements of more
// than one.
func GroupedRows() int64 { return groupedRows.Load() }
