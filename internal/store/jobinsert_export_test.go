package store

import (
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
		group[i] = &jobInsert{row: &jobRow{Name: r.Name, Team: r.Team, UserID: r.UserID, Tier: r.Tier, GPUs: 1, TimeLimitS: 60,
			Command: r.Command, Env: json.RawMessage(`{"K":"v"}`), SecretEnv: json.RawMessage(`{}`), SubmittedAt: r.SubmittedAt,
			PendingReason: "waiting"}, done: make(chan struct{})}
	}
	in.write(group)
	ids, errs := make([]int64, len(rows)), make([]error, len(rows))
	for i, r := range group {
		ids[i], errs[i] = r.out.ID, r.err
	}
	return ids, errs
}

// GroupedRows is how many rows this process wrote in statements of more
// than one.
func GroupedRows() int64 { return groupedRows.Load() }
