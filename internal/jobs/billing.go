package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/metric"
	"github.com/allotlabs/allot/internal/store"
	"github.com/riverqueue/river"
)

// RollupResult says what a billing rollup wrote.
type RollupResult struct {
	Months []billing.YearMonth
	Lines  int
}

// Rollup recomputes the charge lines of every open month from the usage
// (allocations) up to the last full hour before now, and bills late usage
// of closed months as adjustment lines in the first open month. Each
// month's lines are replaced in one transaction under the billing lock, so
// running it twice, or again after a crash in the middle, gives the same
// lines, and no usage is billed twice or lost.
func Rollup(ctx context.Context, st *store.Store, now time.Time) (RollupResult, error) {
	var res RollupResult
	upTo := now.UTC().Truncate(time.Hour)
	first, err := st.FirstUsage(ctx)
	if err != nil || first.IsZero() {
		return res, err
	}
	closedList, err := st.ClosedMonths(ctx)
	if err != nil {
		return res, err
	}
	closed := map[billing.YearMonth]bool{}
	for _, m := range closedList {
		closed[m] = true
	}
	current := billing.Month(upTo.Add(-time.Second))
	firstOpen := billing.YearMonth{}
	for m := billing.Month(first); !current.Before(m); m = m.Next() {
		if closed[m] {
			continue
		}
		if firstOpen.IsZero() {
			firstOpen = m
		}
		n, err := rollupMonth(ctx, st, m, m == firstOpen, closedList, upTo)
		if err != nil {
			return res, err
		}
		res.Months = append(res.Months, m)
		res.Lines += n
	}
	return res, nil
}

// monthLines computes the lines of usage in month m from the usage.
func monthLines(ctx context.Context, st *store.Store, card *billing.RateCard, m billing.YearMonth, upTo time.Time) ([]billing.Line, error) {
	segs, err := st.UsageSegments(ctx, m.Start(), m.End(), upTo)
	if err != nil {
		return nil, err
	}
	pieces, err := billing.Split(card, segs)
	if err != nil {
		return nil, err
	}
	all, err := billing.Lines(pieces)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, l := range all {
		if l.Month == m {
			out = append(out, l)
		}
	}
	return out, nil
}

func rollupMonth(ctx context.Context, st *store.Store, m billing.YearMonth, first bool, closed []billing.YearMonth, upTo time.Time) (int, error) {
	n := 0
	err := st.InTx(ctx, func(tx *store.Store) error {
		if err := tx.LockBilling(ctx); err != nil {
			return err
		}
		card, err := tx.RateCard(ctx)
		if err != nil {
			return err
		}
		lines, err := monthLines(ctx, tx, card, m, upTo)
		if err != nil {
			return err
		}
		if first {
			for _, c := range closed {
				if !c.Before(m) {
					continue
				}
				billed, err := tx.ChargeLinesForUsage(ctx, c)
				if err != nil {
					return err
				}
				recomputed, err := monthLines(ctx, tx, card, c, upTo)
				if err != nil {
					return err
				}
				adj, err := billing.Adjust(c, billed, recomputed, m)
				if err != nil {
					return fmt.Errorf("adjusting %s: %w", c, err)
				}
				lines = append(lines, adj...)
			}
		}
		n = len(lines)
		return tx.ReplaceMonthLines(ctx, m, lines)
	})
	return n, err
}

// BillingRollupArgs runs the rollup.
type BillingRollupArgs struct{}

// Kind names the job in River's table.
func (BillingRollupArgs) Kind() string { return "billing_rollup" }

// BillingRollupWorker works BillingRollupArgs.
type BillingRollupWorker struct {
	river.WorkerDefaults[BillingRollupArgs]
	Store   *store.Store
	Metrics *metric.Billing // nil: not measured
}

// Work rolls up usage into charge lines.
func (w *BillingRollupWorker) Work(ctx context.Context, _ *river.Job[BillingRollupArgs]) error {
	start := time.Now()
	_, err := Rollup(ctx, w.Store, w.Store.Now())
	if m := w.Metrics; m != nil {
		m.Seconds.Observe(time.Since(start).Seconds())
		if err != nil {
			m.Failures.Inc()
		} else {
			m.LastSuccess.Set(float64(w.Store.Now().UnixNano()) / 1e9)
		}
	}
	return err
}
