package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/store"
	"github.com/google/go-cmp/cmp"
)

// Issue 16: the exports read a page of store.ExportPageRows per statement.
// The pages, put together, are what one statement returned before (same
// rows, same order, ties included), and a set that changes under an export
// either stays out (the audit log's new entries) or stops it (a rollup
// replacing an open month's lines).

// exportLines writes n lines for October 2026 over the demo's jobs and
// three teams, with many rows sharing team, job and hour so the order's
// later columns (kind, line key) decide.
func exportLines(t *testing.T, b bundle, n int) billing.YearMonth {
	t.Helper()
	m := billing.Month(b.now).Prev()
	_, err := b.pool.Exec(b.ctx, `
		INSERT INTO charge_lines (line_key, month, kind, usage_hour, job_id, segment, team, cost_center, user_email, tier, gpu_type,
			rate_from, multiplier_from, from_at, to_at, gpu_seconds, rate_micros, multiplier_bp, amount_micros, currency)
		SELECT 'x|' || i, $1::date, CASE WHEN i % 7 = 0 THEN 'preemption_credit' ELSE 'charge' END,
			$1::timestamptz + (i % 5) * interval '1 hour', ids[1 + i % 3], i, (ARRAY['nlp', 'recs', 'vision'])[1 + i % 3], 'CC', 'a@example.com', '3',
			'A100-80GB', '2025-01-01', '1970-01-01', $1::timestamptz + (i % 5) * interval '1 hour', $1::timestamptz + (i % 5 + 1) * interval '1 hour',
			CASE WHEN i % 7 = 0 THEN -60 ELSE 3600 END, 3200000, 10000, CASE WHEN i % 7 = 0 THEN -1000 ELSE 3200000 + i END, 'USD'
		FROM generate_series(1, $2::int) i, (SELECT array_agg(id ORDER BY id) AS ids FROM jobs) j`, m.Start(), n)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestChargeRowPagesAreOneStatement16(t *testing.T) {
	b := setup(t)
	n := 2*store.ExportPageRows + 123
	m := exportLines(t, b, n)
	// The order and the rows of one statement, as the export read before.
	rows, err := b.pool.Query(b.ctx, `
		SELECT l.team, l.job_id, l.usage_hour, l.kind, l.amount_micros FROM charge_lines l JOIN jobs j ON j.id = l.job_id
		WHERE l.month = $1 AND ($2::text[] IS NULL OR l.team = ANY($2))
		ORDER BY l.team, l.job_id, l.usage_hour, l.kind, l.line_key`, m.Start(), []string{"nlp", "vision"})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for rows.Next() {
		var team, kind string
		var job, amount int64
		var hour time.Time
		if err := rows.Scan(&team, &job, &hour, &kind, &amount); err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprint(team, job, hour.UTC(), kind, amount))
	}
	rows.Close()
	var got []string
	if err := b.st.EachChargeRow(b.ctx, m, []string{"nlp", "vision"}, func(r *store.ChargeRow) error {
		got = append(got, fmt.Sprint(r.Team, r.JobID, r.From, r.Kind, r.Amount.Micros))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(want) <= store.ExportPageRows {
		t.Fatalf("only %d rows: one page", len(want))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the pages differ from one statement (-statement +pages):\n%s", diff)
	}

	// A rollup replacing the month's lines between two pages stops the
	// export (here: every line rewritten, as ReplaceMonthLines does).
	seen := 0
	err = b.st.EachChargeRow(b.ctx, m, nil, func(r *store.ChargeRow) error {
		if seen++; seen == 10 {
			if _, err := b.pool.Exec(b.ctx, `UPDATE charge_lines SET amount_micros = amount_micros + 1 WHERE month = $1`, m.Start()); err != nil {
				t.Fatal(err)
			}
		}
		return nil
	})
	if allot.ErrorCode(err) != allot.EConflict || seen != store.ExportPageRows {
		t.Errorf("a rollup between pages: %v after %d rows, want a conflict after the first page", err, seen)
	}
	// A closed month is never rewritten: its export never stops so.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO billing_months (month, closed_at, closed_by) VALUES ($1, now(), 'test')`, m.Start()); err != nil {
		t.Fatal(err)
	}
	count := 0
	if err := b.st.EachChargeRow(b.ctx, m, nil, func(*store.ChargeRow) error { count++; return nil }); err != nil || count != n {
		t.Errorf("closed month: %d rows, %v; want %d", count, err, n)
	}
}

func TestAuditPagesAreOneStatement16(t *testing.T) {
	b := setup(t)
	n := store.ExportPageRows + 777
	// Entries with equal times (the keyset's tie on at breaks on id).
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO audit_log (actor, action, object, note, at)
		SELECT 'bulk@example.com', 'bulk.test', 'bulk:' || (i % 10), '', '2026-11-01'::timestamptz + (i / 3) * interval '1 second'
		FROM generate_series(1, $1::int) i`, n); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(b.ctx, `SELECT id FROM audit_log WHERE action = 'bulk.test' ORDER BY at DESC, id DESC`)
	if err != nil {
		t.Fatal(err)
	}
	var want []int64
	for rows.Next() {
		var id int64
		rows.Scan(&id) //nolint:errcheck
		want = append(want, id)
	}
	rows.Close()
	var got []int64
	added := false
	if err := b.st.EachAudit(b.ctx, store.AuditFilter{Action: "bulk."}, func(e *allot.AuditEntry) error {
		got = append(got, e.ID)
		if !added {
			// Written after the export began: not in it.
			added = true
			if err := b.st.Audit(b.ctx, &allot.AuditEntry{Actor: "late@example.com", Action: "bulk.test", Object: "bulk:late"}); err != nil {
				t.Fatal(err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("paged: %d entries; one statement: %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entry %d: id %d, want %d", i, got[i], want[i])
		}
	}
	// AuditLog's limit spans pages too.
	log, err := b.st.AuditLog(b.ctx, store.AuditFilter{Action: "bulk.", Limit: store.ExportPageRows + 10})
	if err != nil || len(log) != store.ExportPageRows+10 || log[0].Object != "bulk:late" {
		t.Errorf("AuditLog over two pages: %d entries, %v", len(log), err)
	}
}
