package store

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// sendStarts marks node's taken leases whose whole gang is taken as sent a
// start order and returns them; TakeOrders and TakeLeases send start
// orders through it alone. With none due it turns the transaction's
// synchronous commit off: what else it wrote (offers, takes, stops sent),
// lost with a PostgreSQL crash, is sent or taken again idempotently. A
// start order waits for the disk: its commit makes the takes it saw
// durable before the agent runs anything (see TakeLease).
func (s *Store) sendStarts(ctx context.Context, node string, now time.Time) ([]LeaseRef, error) {
	rows, err := s.db.Query(ctx, `
		UPDATE leases l SET start_sent_at = $2
		WHERE l.node = $1 AND l.state = 'taken' AND l.start_sent_at IS NULL AND l.stop_requested_at IS NULL
			AND NOT EXISTS (SELECT 1 FROM leases o WHERE o.job_id = l.job_id AND o.segment = l.segment AND o.state = 'offered')
		RETURNING l.job_id, l.segment`, node, now)
	if err != nil {
		return nil, mapErr("loading starts", err)
	}
	starts, err := pgx.CollectRows(rows, scanLeaseRef)
	if err != nil {
		return nil, mapErr("loading starts", err)
	}
	if len(starts) == 0 {
		if _, err := s.db.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return nil, mapErr("loading starts", err)
		}
	}
	return starts, nil
}

// TakeLeases takes several of node's leases in one transaction, as
// TakeLease does each (idempotent; an ended lease or one the node does not
// hold is refused, alone), and returns each lease's outcome (nil when
// taken) in refs' order, with the start orders that are now due on this
// node: its taken leases whose whole gang is taken, marked sent as
// TakeOrders marks them. So a single-node job goes from offer to start in
// one request, and a node taking a cycle's 8 offers sends one request and
// commits once instead of 8 times.
//
// The commit waits for the disk only when it sends a start order (as
// TakeOrders' does): the takes it saw are then durable before a process
// runs. Jobs are locked in id order, so two nodes' batches over the same
// gangs, and exits, which lock the job first too, never deadlock.
func (s *Store) TakeLeases(ctx context.Context, node string, refs []LeaseRef) ([]error, []LeaseRef, error) {
	results := make([]error, len(refs))
	var starts []LeaseRef
	err := s.InTx(ctx, func(tx *Store) error {
		ids := make([]int64, len(refs))
		for i, r := range refs {
			ids[i] = r.JobID
		}
		if _, err := tx.db.Exec(ctx, `SELECT 1 FROM jobs WHERE id = ANY($1) ORDER BY id FOR UPDATE`, ids); err != nil {
			return mapErr("locking jobs", err)
		}
		var wake []string
		for _, i := range leaseOrder(refs) {
			others, err := tx.takeLocked(ctx, node, refs[i])
			if err != nil {
				if !isRefusal(err) {
					return err
				}
				results[i] = err
				continue
			}
			wake = append(wake, others...)
		}
		var err error
		if starts, err = tx.sendStarts(ctx, node, tx.Now()); err != nil {
			return err
		}
		slices.Sort(wake)
		return notify(ctx, tx.db, slices.Compact(wake)...)
	})
	return results, starts, err
}

// StartReport is one process start in a batched report.
type StartReport struct {
	LeaseRef
	PID int
}

// LeasesStarted records several starts on node in one transaction, each
// as LeaseStarted does (its start is when the report arrived), and
// returns each one's outcome (nil when recorded) in starts' order.
func (s *Store) LeasesStarted(ctx context.Context, node string, starts []StartReport) ([]error, error) {
	results := make([]error, len(starts))
	refs := make([]LeaseRef, len(starts))
	for i, st := range starts {
		refs[i] = st.LeaseRef
	}
	err := s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return mapErr("recording starts", err)
		}
		for _, i := range leaseOrder(refs) {
			if err := tx.startedIn(ctx, node, starts[i].LeaseRef, starts[i].PID); err != nil {
				if !isRefusal(err) {
					return err
				}
				results[i] = err
			}
		}
		return nil
	})
	return results, err
}

// leaseOrder is the order to lock refs' leases in: by job, then segment
// (the order every batch takes its row locks in).
func leaseOrder(refs []LeaseRef) []int {
	order := make([]int, len(refs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(refs[a].JobID, refs[b].JobID), cmp.Compare(refs[a].Segment, refs[b].Segment))
	})
	return order
}

// isRefusal reports whether err refuses one lease of a batch (the node
// does not hold it, or its state forbids the report) without failing the
// transaction. Those refusals are the state checks' own *allot.Error,
// returned as they are; a database error, even one mapErr turns into a
// conflict (wrapped, with its action), aborts the transaction and with it
// the whole batch.
func isRefusal(err error) bool {
	e, ok := err.(*allot.Error)
	return ok && (e.Code == allot.ENotFound || e.Code == allot.EConflict)
}
