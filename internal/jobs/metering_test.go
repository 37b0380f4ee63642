package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
)

// meteredJob records a finished 1-GPU tier-3 job on node's GPU 0 with a
// sample every 10 minutes at util % and memMiB, and returns its id.
func meteredJob(t *testing.T, st *store.Store, u *allot.User, name, team, gpuType, node string, start, end time.Time, util float64, memMiB int64) int64 {
	t.Helper()
	ctx := context.Background()
	spec := allot.JobSpec{Name: name, Team: team, Tier: allot.Tier3, GPUs: 1, GPUType: gpuType, TimeLimit: 8 * time.Hour, Command: []string{"true"}}
	if err := st.RecordFinishedJob(ctx, u, spec, allot.JobCompleted, start, start, end, node, []int{0}); err != nil {
		t.Fatal(err)
	}
	pool := st.Pool()
	var id int64
	if err := pool.QueryRow(ctx, `SELECT id FROM jobs WHERE name = $1`, name).Scan(&id); err != nil {
		t.Fatal(err)
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO gpu_samples (node, gpu_index, at, job_id, util_pct, mem_used_mib, mem_total_mib, temp_c, power_w, ecc_sbe_vol, ecc_dbe_vol, throttle_reasons, xid_errors)
		SELECT $1, 0, g, $2, $3, $4, 81920, 50, 200, 0, 0, 0, 0
		FROM generate_series($5::timestamptz, $6::timestamptz - interval '1 second', interval '10 minutes') g`, node, id, util, memMiB, start, end)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestMeteringRollsUpRecentHoursAndKeepsUnrolledSamples(t *testing.T) {
	st, now, felix := billingSetup(t)
	ctx := context.Background()
	old := time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC) // older than the 14-day retention
	oldJob := meteredJob(t, st, felix, "old", "fraud", "T4", "gpu13", old, old.Add(time.Hour), 50, 4000)
	recent := meteredJob(t, st, felix, "recent", "fraud", "T4", "gpu14", now.Add(-2*time.Hour), now.Add(-time.Hour), 50, 4000)
	samples := func(job int64) int {
		var n int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM gpu_samples WHERE job_id = $1`, job).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	res, err := jobs.Metering(ctx, st, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	// 10:30–11:30: two hours of the recent job; the old hour is not rolled up, so its samples stay.
	if res.Rows != 2 || res.SamplesDeleted != 0 || samples(oldJob) != 6 {
		t.Errorf("first run: %+v, old samples %d", res, samples(oldJob))
	}
	if _, err := st.RollupJobUsage(ctx, old, old.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	res, err = jobs.Metering(ctx, st, now, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.SamplesDeleted != 6 || samples(oldJob) != 0 || samples(recent) != 6 {
		t.Errorf("second run: %+v, old samples %d, recent %d", res, samples(oldJob), samples(recent))
	}
	h, err := st.JobUsageHours(ctx, oldJob, old, old.Add(time.Hour))
	if err != nil || len(h) != 1 || h[0].Samples != 6 || *h[0].MeanUtilPct != 50 {
		t.Errorf("the old rollup must stay: %+v %v", h, err)
	}
}

func TestWeeklySummary(t *testing.T) {
	st, now, _ := billingSetup(t)
	ctx := context.Background()
	noah, err := st.UserByEmail(ctx, "noah@example.com")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 11, 18, 8, 0, 0, 0, time.UTC)
	id := meteredJob(t, st, &noah, "tiny-eval", "nlp", "A100-80GB", "gpu09", start, start.Add(4*time.Hour), 20, 40000)
	if _, err := st.RollupJobUsage(ctx, start, now); err != nil {
		t.Fatal(err)
	}
	msg, err := jobs.WeeklySummary(ctx, st, "nlp", now)
	if err != nil {
		t.Fatal(err)
	}
	// 4 A100-hours at 3.20 = 12.80 USD; at 20 % the rule saves half: 6.40.
	want := "Weekly GPU report for nlp (Nov 13 – Nov 20): 4.0 GPU-h, mean util 20 %, mean memory 49 %, cost 12.80 USD, " +
		"1 job flagged, ≈ 6.40 USD could have been saved: #" + itoa(int(id)) +
		" tiny-eval by noah@example.com (mean GPU utilization 20.0 % over 4h of runtime: profile the input pipeline or request fewer GPUs, 6.40 USD)"
	if msg != want {
		t.Errorf("summary:\n got %s\nwant %s", msg, want)
	}
	quiet, err := jobs.WeeklySummary(ctx, st, "recs", now)
	if err != nil || quiet != "Weekly GPU report for recs (Nov 13 – Nov 20): 0.0 GPU-h, cost 0.00 USD, no job flagged." {
		t.Errorf("quiet team: %q %v", quiet, err)
	}
}
