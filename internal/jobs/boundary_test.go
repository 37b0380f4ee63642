package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
)

// TestMonthBoundaryBilledInBothMonths: a 2-GPU job running from 22:30 on
// the last day of a month to 00:30 on the first of the next is billed 1.5
// GPU-hours × 2 in the old month and 0.5 × 2 in the new, to the micro-unit,
// through rollups before, at and after midnight and a close of the old
// month; nothing is billed twice or lost. The boundaries: the test clock's
// own month end (ALLOT_TEST_NOW), a leap day's and a year's.
func TestMonthBoundaryBilledInBothMonths(t *testing.T) {
	ends := map[string]time.Time{
		"test clock": store.MonthStart(clock.Now()).AddDate(0, 1, 0),
		"leap day":   time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC),
		"year end":   time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	for name, midnight := range ends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testBoundary(t, midnight)
		})
	}
}

func testBoundary(t *testing.T, midnight time.Time) {
	ctx := context.Background()
	st := storetest.New(t)
	now := midnight.Add(-3 * time.Hour)
	st.Now = func() time.Time { return now }
	if err := demo.Seed(ctx, st); err != nil {
		t.Fatal(err)
	}
	felix, err := st.UserByEmail(ctx, "felix@example.com")
	if err != nil {
		t.Fatal(err)
	}
	start, end := midnight.Add(-90*time.Minute), midnight.Add(30*time.Minute)
	spec := allot.JobSpec{Name: "across-midnight", Team: "fraud", Tier: allot.Tier3, GPUs: 2, GPUType: "A100-80GB", TimeLimit: 4 * time.Hour, Command: []string{"true"}}
	// On two GPUs of an A100 node (the demo's history never runs
	// anything there at the end of a month).
	if err := st.RecordFinishedJob(ctx, &felix, spec, allot.JobCompleted, start, start, end, "gpu01", []int{6, 7}); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := st.Pool().QueryRow(ctx, `SELECT id FROM jobs WHERE name = 'across-midnight'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	// While it runs the allocation is open.
	if _, err := st.Pool().Exec(ctx, `UPDATE allocations SET released_at = NULL WHERE job_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	old, next := billing.Month(start), billing.Month(end)
	if old == next || old.Next() != next {
		t.Fatalf("months %s and %s", old, next)
	}
	jobLines := func(m billing.YearMonth) (secs, micros int64) {
		t.Helper()
		lines, err := st.ChargeLines(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			if l.JobID == id {
				secs += l.GPUSeconds
				micros += l.Amount.Micros
			}
		}
		return secs, micros
	}
	rollup := func(at time.Time) {
		t.Helper()
		now = at
		if _, err := jobs.Rollup(ctx, st, at); err != nil {
			t.Fatal(err)
		}
	}
	const rate = 3_200_000 // A100-80GB, per GPU-hour, tier 3 ×1
	// 23:50: the full hour 22:00–23:00 holds its half hour.
	rollup(midnight.Add(-10 * time.Minute))
	if s, m := jobLines(old); s != 2*1800 || m != rate {
		t.Errorf("at 23:50: %d GPU-s, %d micros in %s; want 3600, %d", s, m, old, rate)
	}
	// Midnight and a second after it: the last hour of the old month is
	// complete and the new month has nothing yet.
	rollup(midnight)
	rollup(midnight.Add(time.Second))
	if s, m := jobLines(old); s != 2*5400 || m != 3*rate {
		t.Errorf("at midnight: %d GPU-s, %d micros in %s; want 10800, %d", s, m, old, 3*rate)
	}
	if s, _ := jobLines(next); s != 0 {
		t.Errorf("at midnight: %d GPU-s already in %s", s, next)
	}
	// The job ends at 00:30; at 02:00 both months are complete.
	if _, err := st.Pool().Exec(ctx, `UPDATE allocations SET released_at = $2 WHERE job_id = $1`, id, end); err != nil {
		t.Fatal(err)
	}
	rollup(midnight.Add(2 * time.Hour))
	rollup(midnight.Add(2 * time.Hour))
	os, om := jobLines(old)
	ns, nm := jobLines(next)
	if os != 2*5400 || om != 3*rate || ns != 2*1800 || nm != rate {
		t.Errorf("%s: %d GPU-s %d micros; %s: %d GPU-s %d micros; want 10800/%d and 3600/%d", old, os, om, next, ns, nm, 3*rate, rate)
	}
	if os+ns != int64(end.Sub(start)/time.Second)*2 {
		t.Errorf("billed %d GPU-s in all, the job used %d", os+ns, int64(end.Sub(start)/time.Second)*2)
	}
	// Finance closes the old month; later rollups change neither month.
	if err := st.CloseMonth(ctx, old, "finn@example.com"); err != nil {
		t.Fatal(err)
	}
	rollup(midnight.Add(26 * time.Hour))
	if s, m := jobLines(old); s != os || m != om {
		t.Errorf("closed %s changed: %d GPU-s %d micros", old, s, m)
	}
	if s, m := jobLines(next); s != ns || m != nm {
		t.Errorf("%s changed after the close: %d GPU-s %d micros", next, s, m)
	}
}
