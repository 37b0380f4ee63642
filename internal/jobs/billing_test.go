package jobs_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
)

func billingSetup(t *testing.T) (*store.Store, time.Time, *allot.User) {
	t.Helper()
	t.Parallel()
	st := storetest.New(t)
	now := time.Date(2026, 11, 20, 12, 30, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	ctx := context.Background()
	if err := demo.Seed(ctx, st); err != nil {
		t.Fatal(err)
	}
	u, err := st.UserByEmail(ctx, "felix@example.com")
	if err != nil {
		t.Fatal(err)
	}
	return st, now, &u
}

func TestRollupIsExactAndIdempotent(t *testing.T) {
	st, now, _ := billingSetup(t)
	ctx := context.Background()
	nov := billing.Month(now)
	res, err := jobs.Rollup(ctx, st, now)
	if err != nil {
		t.Fatal(err)
	}
	// The demo seeds last month complete and this month's history.
	if len(res.Months) != 2 || res.Months[0] != nov.Prev() || res.Months[1] != nov || res.Lines == 0 {
		t.Fatalf("rollup = %+v", res)
	}
	first, err := st.ChargeLines(ctx, nov)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := billing.Totals(first)
	if err != nil {
		t.Fatal(err)
	}
	// The demo's history: fraud used 35 % of 2000 GPU-h at 3.20 USD/h, at
	// tier multipliers ×1 (tiers 3, 4) and ×1.25 (tier 2, every 4th job).
	var teamSum int64
	for _, tot := range sum.ByTeam {
		teamSum += tot.Amount
	}
	if teamSum != sum.Total.Amount || sum.Total.Amount <= 0 {
		t.Errorf("team totals %d != total %d", teamSum, sum.Total.Amount)
	}
	if got := sum.ByTeam["fraud"].GPUSeconds; got != 700*3600 {
		t.Errorf("fraud billed %d GPU-seconds, want %d", got, 700*3600)
	}
	// Running it again, or after crashes in the middle, changes nothing.
	for i := range 20 {
		cctx, cancel := context.WithTimeout(ctx, time.Duration(i)*time.Millisecond)
		jobs.Rollup(cctx, st, now) //nolint:errcheck // some of these die midway on purpose
		cancel()
	}
	if _, err := jobs.Rollup(ctx, st, now); err != nil {
		t.Fatal(err)
	}
	again, err := st.ChargeLines(ctx, nov)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(first, again); d != "" {
		t.Errorf("re-running the rollup changed lines (-first +again)\n%s", d)
	}
}

func TestClosedMonthGetsAdjustmentsNotChanges(t *testing.T) {
	st, now, felix := billingSetup(t)
	ctx := context.Background()
	oct, nov := billing.YearMonth{Year: 2026, Month: time.October}, billing.Month(now)
	spec := allot.JobSpec{Name: "october", Team: "fraud", Tier: allot.Tier3, GPUs: 2, GPUType: "A100-80GB", TimeLimit: 8 * time.Hour, Command: []string{"true"}}
	// October already holds the demo's last month.
	if _, err := jobs.Rollup(ctx, st, now); err != nil {
		t.Fatal(err)
	}
	demoLines, _ := st.ChargeLines(ctx, oct)
	start := time.Date(2026, 10, 30, 10, 0, 0, 0, time.UTC)
	if err := st.RecordFinishedJob(ctx, felix, spec, allot.JobCompleted, start, start, start.Add(2*time.Hour), "gpu01", []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.Rollup(ctx, st, now); err != nil {
		t.Fatal(err)
	}
	before, _ := st.ChargeLines(ctx, oct)
	if len(before) != len(demoLines)+2 { // two hours × one job
		t.Fatalf("october lines: %d", len(before))
	}
	if err := st.CloseMonth(ctx, oct, "finn@example.com"); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseMonth(ctx, oct, "finn@example.com"); allot.ErrorCode(err) != allot.EConflict {
		t.Errorf("closing twice: %v", err)
	}
	// Late data for October: a job that ran then, reported only now.
	late := time.Date(2026, 10, 31, 22, 0, 0, 0, time.UTC)
	spec.Name = "late"
	if err := st.RecordFinishedJob(ctx, felix, spec, allot.JobCompleted, late, late, late.Add(3*time.Hour), "gpu02", []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.Rollup(ctx, st, now); err != nil {
		t.Fatal(err)
	}
	after, _ := st.ChargeLines(ctx, oct)
	if d := cmp.Diff(before, after); d != "" {
		t.Errorf("a closed month changed (-before +after)\n%s", d)
	}
	novLines, _ := st.ChargeLines(ctx, nov)
	var adj []billing.Line
	for _, l := range novLines {
		if l.Kind == billing.KindAdjustment {
			adj = append(adj, l)
		}
	}
	// 2 GPUs from 22:00 to 00:00 on Oct 31 are October's: two hourly
	// adjustment lines in November, 2 × 2 h × 3.20 USD = 12.80 USD.
	var seconds, amount int64
	for _, l := range adj {
		seconds += l.GPUSeconds
		amount += l.Amount.Micros
	}
	if len(adj) != 2 || seconds != 2*2*3600 || amount != 12_800_000 {
		t.Errorf("adjustments: %d lines, %d GPU-s, %d micros", len(adj), seconds, amount)
	}
	// The database itself refuses to touch a closed month.
	if err := st.InTx(ctx, func(tx *store.Store) error { return tx.ReplaceMonthLines(ctx, oct, nil) }); err == nil {
		t.Error("replacing a closed month's lines was allowed")
	}
	// A rate change backdated into the closed month is refused.
	if err := st.SetRateChecked(ctx, "A100-80GB", allot.Money{Micros: 1, Currency: "USD"}, time.Date(2026, 10, 15, 0, 0, 0, 0, time.UTC)); allot.ErrorCode(err) != allot.EConflict {
		t.Errorf("backdated rate: %v", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// storePool reopens a pool on the store's database for River.
func storePool(t *testing.T, st *store.Store) *pgxpool.Pool {
	t.Helper()
	return st.Pool()
}

// TestPreemptionCreditFromLastCheckpoint: a preempted checkpointable
// segment is charged in full and credited only for the work after its last
// checkpoint, as the agent reported it. A job stopped because its node was
// drained (drain-and-requeue) loses work through no fault of its team: it
// is credited the same way.
func TestPreemptionCreditFromLastCheckpoint(t *testing.T) {
	for _, reason := range []string{"preempted", "drain"} {
		t.Run(reason, func(t *testing.T) { testStopCredit(t, reason) })
	}
}

func testStopCredit(t *testing.T, reason string) {
	st, now, felix := billingSetup(t)
	ctx := context.Background()
	start := time.Date(2026, 11, 19, 10, 0, 0, 0, time.UTC)
	end := start.Add(2 * time.Hour)
	spec := allot.JobSpec{Name: "ckpt", Team: "fraud", Tier: allot.Tier3, GPUs: 2, GPUType: "A100-80GB", TimeLimit: 8 * time.Hour, Command: []string{"true"}, Checkpointable: true}
	if err := st.RecordFinishedJob(ctx, felix, spec, allot.JobCompleted, start, start, end, "gpu03", []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	pool := st.Pool()
	var id int64
	if err := pool.QueryRow(ctx, `UPDATE jobs SET checkpointable = true WHERE name = 'ckpt' RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO leases (job_id, segment, node, rank, gpu_indices, env, state, offered_at, started_at, exited_at, stop_reason, last_checkpoint)
		VALUES ($1, 1, 'gpu03', 0, '{0,1}', '{}', 'exited', $2, $2, $3, $5, $4)`, id, start, end, end.Add(-30*time.Minute), reason); err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.Rollup(ctx, st, now); err != nil {
		t.Fatal(err)
	}
	lines, err := st.ChargeLines(ctx, billing.Month(now))
	if err != nil {
		t.Fatal(err)
	}
	var charged, credited int64
	for _, l := range lines {
		if l.JobID != id {
			continue
		}
		switch l.Kind {
		case billing.KindCharge:
			charged += l.GPUSeconds
		case billing.KindPreemptionCredit:
			credited += l.GPUSeconds
		}
	}
	if charged != 2*2*3600 || credited != -2*30*60 {
		t.Errorf("charged %d GPU-s, credited %d; want %d and %d", charged, credited, 2*2*3600, -2*30*60)
	}
}
