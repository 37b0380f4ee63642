package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
)

// meterSetup seeds the demo as of Nov 20 2026 12:30 UTC. The demo's
// history ends early in November, so Nov 19 holds only a test's own jobs.
func meterSetup(t *testing.T) (*store.Store, *pgxpool.Pool, time.Time) {
	t.Helper()
	t.Parallel()
	pool := storetest.Pool(t)
	st := store.New(pool)
	now := time.Date(2026, 11, 20, 12, 30, 0, 0, time.UTC)
	st.Now = func() time.Time { return now }
	if err := demo.Seed(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	return st, pool, now
}

func nov19(h, m int) time.Time { return time.Date(2026, 11, 19, h, m, 0, 0, time.UTC) }

// meterJob records a finished job (segment 1) on node's GPUs and returns its id.
func meterJob(t *testing.T, st *store.Store, pool *pgxpool.Pool, email, name, team, gpuType, node string, gpus []int, start, end time.Time) int64 {
	t.Helper()
	ctx := context.Background()
	u, err := st.UserByEmail(ctx, email)
	if err != nil {
		t.Fatal(err)
	}
	spec := allot.JobSpec{Name: name, Team: team, Tier: allot.Tier3, GPUs: len(gpus), GPUType: gpuType, TimeLimit: 8 * time.Hour, Command: []string{"true"}}
	if err := st.RecordFinishedJob(ctx, &u, spec, allot.JobCompleted, start, start, end, node, gpus); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := pool.QueryRow(ctx, `SELECT id FROM jobs WHERE name = $1`, name).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// meterSamples inserts one sample every 10 minutes in [from, to) for a GPU
// (jobID 0: no job), as heartbeats would.
func meterSamples(t *testing.T, pool *pgxpool.Pool, node string, gpu int, jobID int64, from, to time.Time, util float64, memUsed, memTotal int64) {
	t.Helper()
	var job *int64
	if jobID != 0 {
		job = &jobID
	}
	_, err := pool.Exec(context.Background(), `
		INSERT INTO gpu_samples (node, gpu_index, at, job_id, util_pct, mem_used_mib, mem_total_mib, temp_c, power_w, ecc_sbe_vol, ecc_dbe_vol, throttle_reasons, xid_errors)
		SELECT $1, $2, g, $3, $4, $5, $6, 50, 200, 0, 0, 0, 0
		FROM generate_series($7::timestamptz, $8::timestamptz - interval '1 second', interval '10 minutes') g`,
		node, gpu, job, util, memUsed, memTotal, from, to)
	if err != nil {
		t.Fatal(err)
	}
}

type gpuRow struct {
	JobID      int64
	Segment    int
	Hour       time.Time
	GPU        string
	GPUSeconds int64
	Samples    int64
	Util       *float64
}

// meterRows dumps both rollup tables.
func meterRows(t *testing.T, st *store.Store, pool *pgxpool.Pool, jobIDs ...int64) ([]store.JobUsageHour, []gpuRow) {
	t.Helper()
	ctx := context.Background()
	var hours []store.JobUsageHour
	var gpus []gpuRow
	for _, id := range jobIDs {
		h, err := st.JobUsageHours(ctx, id, time.Unix(0, 0), time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC))
		if err != nil {
			t.Fatal(err)
		}
		hours = append(hours, h...)
		rows, err := pool.Query(ctx, `SELECT job_id, segment, hour, node || '/' || gpu_index, gpu_seconds, samples, mean_util_pct
			FROM job_gpu_usage_hours WHERE job_id = $1 ORDER BY segment, hour, node, gpu_index`, id)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var r gpuRow
			if err := rows.Scan(&r.JobID, &r.Segment, &r.Hour, &r.GPU, &r.GPUSeconds, &r.Samples, &r.Util); err != nil {
				t.Fatal(err)
			}
			r.Hour = r.Hour.UTC()
			gpus = append(gpus, r)
		}
		rows.Close()
	}
	return hours, gpus
}

func fp(v float64) *float64 { return &v }
func ip(v int64) *int64     { return &v }

// twoGPUJob: 2 A100 GPUs on gpu01 from 10:30 to 12:15 on Nov 19. GPU 0 runs
// at 80 % with 10000 MiB (20000 at 11:20), GPU 1 at 20 % with 30000 MiB.
// Samples outside the allocation or of other GPUs must not count.
func twoGPUJob(t *testing.T, st *store.Store, pool *pgxpool.Pool) int64 {
	t.Helper()
	id := meterJob(t, st, pool, "felix@example.com", "two-gpus", "fraud", "A100-80GB", "gpu01", []int{0, 1}, nov19(10, 30), nov19(12, 15))
	meterSamples(t, pool, "gpu01", 0, id, nov19(10, 30), nov19(11, 20), 80, 10000, 81920)
	meterSamples(t, pool, "gpu01", 0, id, nov19(11, 20), nov19(11, 21), 80, 20000, 81920)
	meterSamples(t, pool, "gpu01", 0, id, nov19(11, 30), nov19(12, 15), 80, 10000, 81920)
	meterSamples(t, pool, "gpu01", 1, id, nov19(10, 30), nov19(12, 15), 20, 30000, 81920)
	// Not the job's: before its start, after its end, another GPU.
	meterSamples(t, pool, "gpu01", 0, id, nov19(10, 20), nov19(10, 21), 0, 77777, 81920)
	meterSamples(t, pool, "gpu01", 1, id, nov19(12, 20), nov19(12, 21), 0, 77777, 81920)
	meterSamples(t, pool, "gpu01", 2, 0, nov19(10, 0), nov19(13, 0), 0, 0, 81920)
	return id
}

func TestRollupJobUsageMath(t *testing.T) {
	st, pool, _ := meterSetup(t)
	ctx := context.Background()
	id := twoGPUJob(t, st, pool)
	n, err := st.RollupJobUsage(ctx, nov19(0, 0), nov19(23, 0))
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("rows = %d, want 3", n)
	}
	hours, gpus := meterRows(t, st, pool, id)
	row := func(h int, secs, samples int64, mem float64) store.JobUsageHour {
		return store.JobUsageHour{JobID: id, Segment: 1, Hour: nov19(h, 0), GPUType: "A100-80GB", GPUs: 2, GPUSeconds: secs, Samples: samples,
			MeanUtilPct: fp(50), MeanMemUsedMiB: fp(mem), PeakMemUsedMiB: ip(30000), MemTotalMiB: ip(81920)}
	}
	want := []store.JobUsageHour{
		row(10, 2*1800, 6, 20000),                         // 10:30, 10:40, 10:50 × 2 GPUs
		row(11, 2*3600, 12, (5*10000+20000+6*30000)/12.0), // the 11:20 reading of GPU 0 is 20000
		row(12, 2*900, 4, 20000),                          // 12:00, 12:10
	}
	if d := cmp.Diff(want, hours); d != "" {
		t.Errorf("job_usage_hours (-want +got)\n%s", d)
	}
	var wantGPU []gpuRow
	for _, h := range []struct {
		hour          int
		secs, samples int64
	}{{10, 1800, 3}, {11, 3600, 6}, {12, 900, 2}} {
		wantGPU = append(wantGPU,
			gpuRow{JobID: id, Segment: 1, Hour: nov19(h.hour, 0), GPU: "gpu01/0", GPUSeconds: h.secs, Samples: h.samples, Util: fp(80)},
			gpuRow{JobID: id, Segment: 1, Hour: nov19(h.hour, 0), GPU: "gpu01/1", GPUSeconds: h.secs, Samples: h.samples, Util: fp(20)})
	}
	if d := cmp.Diff(wantGPU, gpus); d != "" {
		t.Errorf("job_gpu_usage_hours (-want +got)\n%s", d)
	}
}

func TestRollupJobUsageIdempotentAndCrashSafe(t *testing.T) {
	st, pool, now := meterSetup(t)
	ctx := context.Background()
	id := twoGPUJob(t, st, pool)
	// A job still running at now counts up to now.
	running := meterJob(t, st, pool, "noah@example.com", "still-running", "nlp", "T4", "gpu13", []int{0}, nov19(23, 0), nov19(23, 1))
	if _, err := pool.Exec(ctx, `UPDATE allocations SET released_at = NULL WHERE job_id = $1`, running); err != nil {
		t.Fatal(err)
	}
	meterSamples(t, pool, "gpu13", 0, running, nov19(23, 0), now, 60, 4000, 15360)
	if _, err := st.RollupJobUsage(ctx, nov19(0, 0), now); err != nil {
		t.Fatal(err)
	}
	firstH, firstG := meterRows(t, st, pool, id, running)
	if len(firstH) != 3+14 { // Nov 19 23:00 … Nov 20 12:00
		t.Fatalf("rows: %d", len(firstH))
	}
	if last := firstH[len(firstH)-1]; last.Hour != now.Truncate(time.Hour) || last.GPUSeconds != 1800 {
		t.Errorf("running job's current hour: %+v", last)
	}
	for i := range 25 {
		cctx, cancel := context.WithTimeout(ctx, time.Duration(i)*time.Millisecond)
		st.RollupJobUsage(cctx, nov19(0, 0), now) //nolint:errcheck // some of these die midway on purpose
		cancel()
	}
	// A narrower re-run replaces only its hours.
	if _, err := st.RollupJobUsage(ctx, nov19(11, 0), nov19(11, 30)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RollupJobUsage(ctx, nov19(0, 0), now); err != nil {
		t.Fatal(err)
	}
	againH, againG := meterRows(t, st, pool, id, running)
	if d := cmp.Diff(firstH, againH); d != "" {
		t.Errorf("re-running changed job_usage_hours (-first +again)\n%s", d)
	}
	if d := cmp.Diff(firstG, againG); d != "" {
		t.Errorf("re-running changed job_gpu_usage_hours (-first +again)\n%s", d)
	}
}

func TestDeleteRawSamplesOnlyRolledUpHours(t *testing.T) {
	st, pool, _ := meterSetup(t)
	ctx := context.Background()
	id := twoGPUJob(t, st, pool)
	count := func(from, to time.Time) int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM gpu_samples WHERE at >= $1 AND at < $2`, from, to).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Only 10:00–11:00 is rolled up.
	if _, err := st.RollupJobUsage(ctx, nov19(10, 0), nov19(11, 0)); err != nil {
		t.Fatal(err)
	}
	before, _ := meterRows(t, st, pool, id)
	in11, in12 := count(nov19(11, 0), nov19(12, 0)), count(nov19(12, 0), nov19(13, 0))
	// 11:00 is old enough but not rolled up; 10:00 is.
	n, err := st.DeleteRawSamples(ctx, nov19(12, 0))
	if err != nil {
		t.Fatal(err)
	}
	// Hour 10: the job's 3 + 3 samples, the stray 10:20 one and GPU 2's 6.
	if n != 13 || count(nov19(10, 0), nov19(11, 0)) != 0 {
		t.Errorf("deleted %d samples, %d left in the rolled-up hour", n, count(nov19(10, 0), nov19(11, 0)))
	}
	if count(nov19(11, 0), nov19(12, 0)) != in11 || count(nov19(12, 0), nov19(13, 0)) != in12 {
		t.Error("samples of hours not rolled up were deleted")
	}
	after, _ := meterRows(t, st, pool, id)
	if d := cmp.Diff(before, after); d != "" {
		t.Errorf("retention changed rollups (-before +after)\n%s", d)
	}
	// Rolling up everything now keeps the purged hour's rollup as it was.
	if _, err := st.RollupJobUsage(ctx, nov19(0, 0), nov19(23, 0)); err != nil {
		t.Fatal(err)
	}
	all, _ := meterRows(t, st, pool, id)
	if len(all) != 3 || !cmp.Equal(all[0], before[0]) {
		t.Errorf("after purge and re-rollup: %+v", all)
	}
	// An hour rolled up before it ended keeps its samples.
	if _, err := st.RollupJobUsage(ctx, nov19(11, 0), nov19(12, 0)); err != nil {
		t.Fatal(err)
	}
	if n, err := st.DeleteRawSamples(ctx, nov19(11, 59)); err != nil || n != 0 {
		t.Errorf("deleted %d samples of an hour that had not ended by the cutoff (%v)", n, err)
	}
	if n, err := st.DeleteRawSamples(ctx, nov19(12, 0)); err != nil || n != int64(in11) {
		t.Errorf("deleted %d samples, want %d (%v)", n, in11, err)
	}
}

func usd(micros int64) allot.Money { return allot.Money{Micros: micros, Currency: "USD"} }

func TestRightSizingRules(t *testing.T) {
	st, pool, _ := meterSetup(t)
	ctx := context.Background()
	const a100, t4 = "A100-80GB", "T4"
	// Low utilization: 1 A100 for 2 h at 10 % → 6.40 USD, saves 6.40 × 30/40 = 4.80.
	low := meterJob(t, st, pool, "felix@example.com", "low-util", "fraud", a100, "gpu02", []int{0}, nov19(8, 0), nov19(10, 0))
	meterSamples(t, pool, "gpu02", 0, low, nov19(8, 0), nov19(10, 0), 10, 40000, 81920)
	// Idle GPUs: 4 A100 for 1 h, two at 90 %, two at 1 % → request 2; saves 2 GPU-h = 6.40.
	idle := meterJob(t, st, pool, "fiona@example.com", "idle-gpus", "fraud", a100, "gpu03", []int{0, 1, 2, 3}, nov19(8, 0), nov19(9, 0))
	for g, u := range []float64{90, 90, 1, 1} {
		meterSamples(t, pool, "gpu03", g, idle, nov19(8, 0), nov19(9, 0), u, 40000, 81920)
	}
	// Cheaper type: 1 A100 for 3 h peaking at 9318 MiB (9.1 GB) fits a T4:
	// 9.60 USD against 3 × 0.35 = 1.05, saves 8.55.
	small := meterJob(t, st, pool, "noah@example.com", "small-mem", "nlp", a100, "gpu04", []int{0}, nov19(8, 0), nov19(11, 0))
	meterSamples(t, pool, "gpu04", 0, small, nov19(8, 0), nov19(11, 0), 90, 8000, 81920)
	meterSamples(t, pool, "gpu04", 0, small, nov19(9, 5), nov19(9, 6), 90, 9318, 81920)
	// Fine: busy, big.
	fine := meterJob(t, st, pool, "nina@example.com", "fine", "nlp", a100, "gpu05", []int{0, 1}, nov19(8, 0), nov19(10, 0))
	for g := range 2 {
		meterSamples(t, pool, "gpu05", g, fine, nov19(8, 0), nov19(10, 0), 85, 50000, 81920)
	}
	// Low but short (30 min): not flagged; a single GPU is never "idle
	// while others work".
	short := meterJob(t, st, pool, "ravi@example.com", "short-low", "recs", a100, "gpu06", []int{0}, nov19(8, 0), nov19(8, 30))
	meterSamples(t, pool, "gpu06", 0, short, nov19(8, 0), nov19(8, 30), 5, 40000, 81920)
	// Already on the cheapest type that fits.
	onT4 := meterJob(t, st, pool, "ravi@example.com", "on-t4", "recs", t4, "gpu13", []int{0}, nov19(8, 0), nov19(10, 0))
	meterSamples(t, pool, "gpu13", 0, onT4, nov19(8, 0), nov19(10, 0), 90, 9000, 15360)
	if _, err := st.RollupJobUsage(ctx, nov19(0, 0), nov19(23, 0)); err != nil {
		t.Fatal(err)
	}
	rep, err := st.RightSizing(ctx, nov19(0, 0), nov19(0, 0).Add(24*time.Hour), store.RightSizingScope{})
	if err != nil {
		t.Fatal(err)
	}
	type flag struct {
		Job        int64
		Rule       string
		Suggestion string
		Savings    allot.Money
	}
	var got []flag
	for _, j := range rep.Jobs {
		for _, f := range j.Flags {
			got = append(got, flag{j.JobID, f.Rule, f.Suggestion, f.Savings})
		}
	}
	want := []flag{
		{small, store.RuleCheaperGPUType, "use gpu_type T4: peak memory 9.1 GB fits its 16 GB", usd(8_550_000)},
		{idle, store.RuleIdleGPUs, "request 2 GPUs instead of 4: 2 of its GPUs stayed below 5 % utilization while the others worked", usd(6_400_000)},
		{low, store.RuleLowUtilization, "mean GPU utilization 10.0 % over 2h of runtime: profile the input pipeline or request fewer GPUs", usd(4_800_000)},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("flags (-want +got)\n%s", d)
	}
	costs := map[int64]allot.Money{}
	for _, j := range rep.Jobs {
		costs[j.JobID] = j.Cost
	}
	if costs[low] != usd(6_400_000) || costs[idle] != usd(12_800_000) || costs[small] != usd(9_600_000) {
		t.Errorf("costs: %v", costs)
	}

	// Totals: teams add up to the total, users to their team, exactly.
	var teamSum store.UsageSummary
	for _, tm := range rep.Teams {
		var u store.UsageSummary
		for _, x := range rep.Users {
			if x.Team == tm.Team {
				u.Cost.Micros += x.Cost.Micros
				u.Savings.Micros += x.Savings.Micros
				u.GPUSeconds += x.GPUSeconds
				u.Flagged += x.Flagged
				u.Jobs += x.Jobs
			}
		}
		if u.Cost.Micros != tm.Cost.Micros || u.Savings.Micros != tm.Savings.Micros || u.GPUSeconds != tm.GPUSeconds ||
			u.Flagged != tm.Flagged || u.Jobs != tm.Jobs {
			t.Errorf("team %s: %+v, its users add up to %+v", tm.Team, tm, u)
		}
		teamSum.Cost.Micros += tm.Cost.Micros
		teamSum.Savings.Micros += tm.Savings.Micros
		teamSum.GPUSeconds += tm.GPUSeconds
	}
	if teamSum.Cost.Micros != rep.Total.Cost.Micros || teamSum.Savings.Micros != rep.Total.Savings.Micros || teamSum.GPUSeconds != rep.Total.GPUSeconds {
		t.Errorf("teams add up to %+v, total is %+v", teamSum, rep.Total)
	}
	// fraud: 2 + 4 GPU-h of A100 = 19.20 USD; savings 4.80 + 6.40.
	for _, tm := range rep.Teams {
		if tm.Team == "fraud" && (tm.Cost != usd(19_200_000) || tm.Savings != usd(11_200_000) || tm.Flagged != 2 || tm.GPUSeconds != 6*3600) {
			t.Errorf("fraud: %+v", tm)
		}
		if tm.Team == "fraud" && (tm.MeanUtilPct == nil || *tm.MeanUtilPct != (10*2+90*2+1*2)/6.0) {
			t.Errorf("fraud mean util: %v", tm.MeanUtilPct)
		}
	}

	// Scope: one user sees only their jobs.
	noah, _ := st.UserByEmail(ctx, "noah@example.com")
	mine, err := st.RightSizing(ctx, nov19(0, 0), nov19(0, 0).Add(24*time.Hour), store.RightSizingScope{UserID: noah.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(mine.Users) != 1 || mine.Users[0].User != "noah@example.com" || len(mine.Jobs) != 1 || mine.Jobs[0].JobID != small {
		t.Errorf("noah's report: %+v", mine)
	}
}
