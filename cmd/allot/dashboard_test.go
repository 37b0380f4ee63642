package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

// bootQuiet is boot without the River worker: no scheduling cycle changes
// the state a test sets up, so every figure is known.
func bootQuiet(t *testing.T) *env {
	t.Helper()
	return bootMain(t, &Main{Config: Config{DevMode: true}}).withTokens()
}

// bootQuietStory is bootQuiet at noon on the 20th of the test clock's
// month (demo.StoryClock), for tests of a month's accumulated figures.
func bootQuietStory(t *testing.T) *env {
	t.Helper()
	return bootMain(t, &Main{Config: Config{DevMode: true, Now: demo.StoryClock(clock.Now)}}).withTokens()
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.m.Pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *env) getJSON(path, persona string, v any) {
	e.t.Helper()
	code, _, b := e.api("GET", path, persona, "")
	if code != http.StatusOK {
		e.t.Fatalf("GET %s as %s: %d %s", path, persona, code, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		e.t.Fatalf("GET %s: %v\n%s", path, err, b)
	}
}

func (e *env) jobID(name string) int64 {
	e.t.Helper()
	var id int64
	if err := e.m.Pool.QueryRow(context.Background(), `SELECT id FROM jobs WHERE name = $1`, name).Scan(&id); err != nil {
		e.t.Fatalf("job %s: %v", name, err)
	}
	return id
}

func doc(t *testing.T, html string) *goquery.Document {
	t.Helper()
	d, err := goquery.NewDocumentFromReader(strings.NewReader(html))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func tid(d *goquery.Document, id string) string {
	return strings.TrimSpace(d.Find(`[data-testid="` + id + `"]`).First().Text())
}

// dashboardFixture puts the demo cluster in a known state: gpu01 and gpu02
// up, gpu13 draining, gpu14 drained, the rest down (as seeded); job
// "running-4" holds 4 GPUs of gpu01 since 30 minutes ago with a 2 h limit;
// job "finished-8" ran on 8 GPUs of gpu03 as tier 2 for 1 h 30 m from a
// whole hour 5 hours ago. It returns the running allocation's start.
func dashboardFixture(t *testing.T, e *env) time.Time {
	t.Helper()
	ctx := context.Background()
	e.exec(`UPDATE nodes SET state = 'up' WHERE name IN ('gpu01', 'gpu02')`)
	e.exec(`UPDATE nodes SET state = 'draining' WHERE name = 'gpu13'`)
	e.exec(`UPDATE nodes SET state = 'drained' WHERE name = 'gpu14'`)
	noah, err := e.m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Engineer])
	if err != nil {
		t.Fatal(err)
	}
	j, err := e.m.Store.SubmitJob(ctx, &noah, allot.JobSpec{Name: "running-4", Team: "nlp", Tier: allot.Tier3, GPUs: 4, GPUType: "A100-80GB",
		TimeLimit: 2 * time.Hour, Command: []string{"python", "train.py"}})
	if err != nil {
		t.Fatal(err)
	}
	start := clock.Now().Add(-30 * time.Minute).Truncate(time.Second)
	if _, err := e.m.Store.Allocate(ctx, j.ID, "gpu01", []int{0, 1, 2, 3}, start); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE jobs SET state = 'running', started_at = $2, submitted_at = $2::timestamptz - interval '5 minutes', segment = 1, pending_reason = '' WHERE id = $1`, j.ID, start)
	h := clock.Now().UTC().Truncate(time.Hour).Add(-5 * time.Hour)
	if err := e.m.Store.RecordFinishedJob(ctx, &noah, allot.JobSpec{Name: "finished-8", Team: "nlp", Tier: allot.Tier2, GPUs: 8, GPUType: "A100-80GB",
		TimeLimit: 4 * time.Hour, Command: []string{"python", "eval.py"}}, allot.JobCompleted, h.Add(-10*time.Minute), h, h.Add(90*time.Minute),
		"gpu03", []int{0, 1, 2, 3, 4, 5, 6, 7}); err != nil {
		t.Fatal(err)
	}
	return start
}

// percentile is the linear-interpolation percentile of sorted xs (as
// PostgreSQL's percentile_cont).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	r := p * float64(len(xs)-1)
	lo := int(math.Floor(r))
	hi := int(math.Ceil(r))
	return xs[lo] + (xs[hi]-xs[lo])*(r-float64(lo))
}

func TestClusterDashboard(t *testing.T) {
	e := bootQuiet(t)
	ctx := context.Background()
	if err := demo.SeedActivity(ctx, e.m.Store); err != nil {
		t.Fatal(err)
	}
	dashboardFixture(t, e)

	var c web.ClusterJSON
	e.getJSON("/api/v1/cluster", demo.Engineer, &c)
	// GPUs: A100 on 12 nodes (96), 2 up (16 in service); T4 on 4 nodes
	// (32), gpu13 draining (8 in service). 4 allocated, all A100.
	if c.GPUs != (web.ClusterGPUsJSON{Total: 128, InService: 24, Allocated: 4, AllocatedPct: 16.7}) {
		t.Errorf("gpus = %+v", c.GPUs)
	}
	wantTypes := []web.GPUTypeNowJSON{{GPUType: "A100-80GB", GPUs: 96, InService: 16, Allocated: 4}, {GPUType: "T4", GPUs: 32, InService: 8}}
	if fmt.Sprint(c.ByGPUType) != fmt.Sprint(wantTypes) {
		t.Errorf("by type = %+v", c.ByGPUType)
	}
	// The seeded queue: llama-sft 16×A100×12h, ranker-nightly 8×A100×6h,
	// fraud-gbdt-gpu 2×any×2h, embedding-sweep 1×T4×3h.
	if c.Jobs != (web.ClusterJobsJSON{Running: 1, Pending: 4}) || c.QueueHours != "247.0000" {
		t.Errorf("jobs %+v queue %s", c.Jobs, c.QueueHours)
	}
	wantQueue := []web.QueueDepthJSON{{GPUType: "any", Jobs: 1, GPUHours: "4.0000"}, {GPUType: "A100-80GB", Jobs: 2, GPUHours: "240.0000"},
		{GPUType: "T4", Jobs: 1, GPUHours: "3.0000"}}
	sort.Slice(c.Queue, func(a, b int) bool { return c.Queue[a].GPUType < c.Queue[b].GPUType })
	sort.Slice(wantQueue, func(a, b int) bool { return wantQueue[a].GPUType < wantQueue[b].GPUType })
	if fmt.Sprint(c.Queue) != fmt.Sprint(wantQueue) {
		t.Errorf("queue = %+v", c.Queue)
	}
	nodes := map[string]int{}
	for _, n := range c.Nodes {
		nodes[n.Site+"/"+n.State] = n.Nodes
	}
	if fmt.Sprint(nodes) != "map[onprem/down:12 onprem/drained:1 onprem/draining:1 onprem/up:2]" {
		t.Errorf("nodes = %v", nodes)
	}

	// Waits: recomputed here from the jobs table.
	rows, err := e.m.Pool.Query(ctx, `SELECT tier, extract(epoch FROM started_at - submitted_at)::float8 FROM jobs
		WHERE started_at >= $1::timestamptz - interval '7 days' AND started_at <= $1 ORDER BY 2`, c.AsOf)
	if err != nil {
		t.Fatal(err)
	}
	waits := map[string][]float64{}
	for rows.Next() {
		var tier string
		var w float64
		if err := rows.Scan(&tier, &w); err != nil {
			t.Fatal(err)
		}
		waits[tier] = append(waits[tier], w)
	}
	rows.Close()
	if len(waits["4"]) < 3 || len(waits["preemptible"]) < 3 {
		t.Fatalf("the fixture should have recent starts of tiers 4 and preemptible: %v", waits)
	}
	for _, w := range c.Waits {
		xs := waits[w.Tier]
		want := TierWaitJSONFor(xs)
		if w.Started != len(xs) || w.P50WaitS != want[0] || w.P95WaitS != want[1] {
			t.Errorf("tier %s waits: %+v, want %d started, p50 %d s, p95 %d s", w.Tier, w, len(xs), want[0], want[1])
		}
	}
	byTier := map[string]web.TierWaitJSON{}
	for _, w := range c.Waits {
		byTier[w.Tier] = w
	}
	// Pending: llama-sft and fraud-gbdt-gpu (tier 3), ranker-nightly (2),
	// embedding-sweep (4).
	if byTier["3"].Pending != 2 || byTier["2"].Pending != 1 || byTier["4"].Pending != 1 || byTier["1"].Pending != 0 {
		t.Errorf("pending by tier = %+v", byTier)
	}

	// Hourly: the series' allocated GPU-seconds add up to every
	// allocation's overlap with the window, recomputed here.
	from := c.Hourly[0].Hour
	if len(c.Hourly) != 7*24+1 || !from.Equal(c.AsOf.Truncate(time.Hour).Add(-7*24*time.Hour)) {
		t.Errorf("hourly: %d points from %s", len(c.Hourly), from)
	}
	var want, got float64
	rows, err = e.m.Pool.Query(ctx, `SELECT started_at, coalesce(released_at, $1) FROM allocations WHERE coalesce(released_at, 'infinity') > $2`, c.AsOf, from)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s, en time.Time
		if err := rows.Scan(&s, &en); err != nil {
			t.Fatal(err)
		}
		if s.Before(from) {
			s = from
		}
		if en.After(c.AsOf) {
			en = c.AsOf
		}
		if en.After(s) {
			want += float64(en.Unix() - s.Unix())
		}
	}
	rows.Close()
	withUtil := 0
	for _, h := range c.Hourly {
		var x float64
		fmt.Sscan(h.AllocatedGPUH, &x) //nolint:errcheck
		got += x * 3600
		if h.MeanUtilPct != nil {
			withUtil++
		}
	}
	// Each hour's GPU-hours are shown to 4 decimals (±0.18 s).
	if math.Abs(got-want) > 0.18*float64(len(c.Hourly)) || want == 0 {
		t.Errorf("hourly allocated GPU-seconds sum to %.0f, want %.0f", got, want)
	}
	// The running job's hour: 4 GPUs since start.
	last := c.Hourly[len(c.Hourly)-1]
	if withUtil == 0 || last.MeanUtilPct != nil {
		t.Errorf("%d hours with utilization; the current hour's is %v (not rolled up yet)", withUtil, last.MeanUtilPct)
	}

	// The page shows the same figures; the fragment alone for HTMX.
	br := e.login(demo.Engineer)
	status, page := br.get("/cluster")
	d := doc(t, page)
	if status != 200 || tid(d, "allocated-pct") != "16.7 %" || tid(d, "running") != "1" || tid(d, "pending") != "4" || tid(d, "queue-gpu-hours") != "247.0" {
		t.Errorf("cluster page: %d allocated %q running %q pending %q queue %q", status, tid(d, "allocated-pct"), tid(d, "running"),
			tid(d, "pending"), tid(d, "queue-gpu-hours"))
	}
	row := d.Find(`[data-testid="nodes-row"][data-site="onprem"]`)
	if row.Find(`[data-testid="up"]`).Text() != "2" || row.Find(`[data-testid="draining"]`).Text() != "1" ||
		row.Find(`[data-testid="drained"]`).Text() != "1" || row.Find(`[data-testid="down"]`).Text() != "12" {
		t.Errorf("nodes row: %q", row.Text())
	}
	if n := d.Find(`[data-testid="chart-history"] polyline`).Length(); n < 2 {
		t.Errorf("history chart has %d lines", n)
	}
	if live := d.Find(`#cluster-live`); live.AttrOr("hx-trigger", "") != "every 10s" || live.AttrOr("hx-get", "") != "/cluster?fragment=live" {
		t.Errorf("live fragment attributes: %v", live.Nodes)
	}
	status, frag := br.get("/cluster?fragment=live")
	if status != 200 || strings.Contains(frag, "<html") || !strings.Contains(frag, `id="cluster-live"`) {
		t.Errorf("fragment: %d %.200s", status, frag)
	}
	if code, _, _ := e.api("GET", "/api/v1/cluster", "", ""); code != 401 {
		t.Errorf("anonymous cluster API: %d", code)
	}
}

// TierWaitJSONFor returns the p50 and p95 of xs (seconds, sorted) rounded
// to whole seconds, as the API reports them.
func TierWaitJSONFor(xs []float64) [2]int64 {
	return [2]int64{int64(math.Round(percentile(xs, 0.5))), int64(math.Round(percentile(xs, 0.95)))}
}

func TestJobPageExplains(t *testing.T) {
	e := bootQuiet(t)
	ctx := context.Background()
	start := dashboardFixture(t, e)
	llama, gbdt, ranker, sweep := e.jobID("llama-sft"), e.jobID("fraud-gbdt-gpu"), e.jobID("ranker-nightly"), e.jobID("embedding-sweep")
	// What a scheduling cycle stores: the queue in its order, with its
	// estimates (ranker-nightly, class 2, first; embedding-sweep, T4,
	// with none: no T4 node is up).
	resv := start.Add(2 * time.Hour)
	err := e.m.Store.InTx(ctx, func(tx *store.Store) error {
		if _, err := tx.ApplyPlan(ctx, nil, nil, []store.PendingUpdate{
			{JobID: ranker, Priority: 100, Breakdown: allot.PriorityBreakdown{Class: 2, FairShare: 0.01}, Reason: "waiting", EstStart: start.Add(time.Hour), EstKind: store.EstProjection},
			{JobID: gbdt, Priority: 9000, Breakdown: allot.PriorityBreakdown{Class: 3, FairShare: 0.9}, Reason: "waiting"},
			{JobID: llama, Priority: 5175, Breakdown: allot.PriorityBreakdown{Class: 3, FairShare: 0.5, Size: 0.125, Age: 0.1},
				Reason: "waiting for 16 GPUs in one interconnect domain; holds a backfill reservation", EstStart: resv, EstKind: store.EstReservation},
			{JobID: sweep, Breakdown: allot.PriorityBreakdown{Class: 3}, Reason: "cannot run on the nodes up now: needs 8 GPUs of type T4"},
		}); err != nil {
			return err
		}
		return tx.RecordCycle(ctx, e.m.Store.Now(), time.Millisecond, 4, store.ApplyResult{}, "applied")
	})
	if err != nil {
		t.Fatal(err)
	}
	var cycleID int64
	var cycleAt time.Time
	e.m.Pool.QueryRow(ctx, `SELECT id, started_at FROM scheduling_cycles ORDER BY id DESC LIMIT 1`).Scan(&cycleID, &cycleAt) //nolint:errcheck

	var j web.JobDetailJSON
	e.getJSON(fmt.Sprintf("/api/v1/jobs/%d", llama), demo.Engineer, &j)
	// Third in the cycle's order of 4; among the jobs that may use A100s
	// (embedding-sweep wants T4s and does not compete) also third, behind
	// ranker-nightly (8 × 6 h) and fraud-gbdt-gpu (any type, 4 × 1 h).
	if q := j.Queue; q == nil || q.Position != 3 || q.Rank != 3 || q.Of != 4 || q.TypeRank != 3 || q.TypeOf != 3 || q.AheadGPUHours != "52.0000" ||
		!q.Ranked || q.RunAs != "3" || q.CycleID == nil || *q.CycleID != cycleID || q.DecidedAt == nil || !q.DecidedAt.Equal(cycleAt) {
		t.Fatalf("queue = %+v", j.Queue)
	}
	if j.Queue.EstimatedStart == nil || !j.Queue.EstimatedStart.Equal(resv) || j.Queue.EstKind != store.EstReservation ||
		!strings.Contains(j.Queue.Reason, "holds a backfill reservation") {
		t.Errorf("estimated start %v (%s), want the cycle's %v (reservation)", j.Queue.EstimatedStart, j.Queue.EstKind, resv)
	}
	wantF := []web.PriorityFactorJSON{{Name: "fair-share", Factor: 0.5, Weight: 10000, Points: 5000}, {Name: "size", Factor: 0.125, Weight: 1000, Points: 125},
		{Name: "age", Factor: 0.1, Weight: 500, Points: 50}}
	if fmt.Sprint(j.PriorityFactors) != fmt.Sprint(wantF) || j.Priority != 5175 {
		t.Errorf("factors = %+v, priority %v", j.PriorityFactors, j.Priority)
	}
	if j.Cost.Amount != "0.00" || len(j.Runs) != 0 {
		t.Errorf("a job that never ran: cost %+v runs %+v", j.Cost, j.Runs)
	}
	// The T4 job: the cycle had no estimate, and says why.
	var sw web.JobDetailJSON
	e.getJSON(fmt.Sprintf("/api/v1/jobs/%d", sweep), "admin", &sw)
	if sw.Queue == nil || sw.Queue.EstimatedStart != nil || sw.Queue.EstKind != "" || sw.Queue.Rank != 4 ||
		!strings.Contains(sw.Queue.Unknown, "cannot run on the nodes up now") {
		t.Errorf("T4 job queue = %+v", sw.Queue)
	}

	// The page says the same in words.
	br := e.login(demo.Engineer)
	_, page := br.get(fmt.Sprintf("/jobs/%d", llama))
	d := doc(t, page)
	if tid(d, "queue-position") != "3" || tid(d, "queue-of") != "4" || !strings.Contains(tid(d, "eta"), fmtUTC(resv)+" (reserved GPUs") ||
		!strings.Contains(tid(d, "eta-method"), "As of the scheduling cycle at "+cycleAt.UTC().Format("15:04:05 UTC")) {
		t.Errorf("queue box: %q / %q / %q / %q", tid(d, "queue-position"), tid(d, "queue-of"), tid(d, "eta"), tid(d, "eta-method"))
	}

	// A job submitted after the cycle has not been through one, and says so.
	noah, err := e.m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Engineer])
	if err != nil {
		t.Fatal(err)
	}
	late, err := e.m.Store.SubmitJob(ctx, &noah, allot.JobSpec{Name: "late", Team: "nlp", Tier: allot.Tier3, GPUs: 1, TimeLimit: time.Hour, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	var lj web.JobDetailJSON
	e.getJSON(fmt.Sprintf("/api/v1/jobs/%d", late.ID), demo.Engineer, &lj)
	if q := lj.Queue; q == nil || q.Ranked || q.Position != 0 || q.Of != 4 || q.EstimatedStart != nil || !strings.Contains(q.Unknown, "not yet through a scheduling cycle") {
		t.Errorf("late job queue = %+v", lj.Queue)
	}
	_, lpage := br.get(fmt.Sprintf("/jobs/%d", late.ID))
	if ld := doc(t, lpage); tid(ld, "queue-position") != "Not ranked yet" || !strings.Contains(tid(ld, "eta"), "after the last one (at "+cycleAt.UTC().Format("15:04:05 UTC")) {
		t.Errorf("late job's page: %q / %q", tid(ld, "queue-position"), tid(ld, "eta"))
	}
	if !strings.Contains(tid(d, "pending-reason"), "waiting for 16 GPUs") {
		t.Errorf("reason: %q", tid(d, "pending-reason"))
	}
	fs := d.Find(`[data-testid="priority-factor"][data-factor="fair-share"]`)
	if fs.Find(`[data-testid="factor"]`).Text() != "0.5000" || fs.Find(`[data-testid="points"]`).Text() != "5000.0" ||
		d.Find(`[data-factor="total"] [data-testid="points"]`).Text() != "5175" {
		t.Errorf("priority table: %q", d.Find(`[data-testid="priority-table"]`).Text())
	}
	if href := d.Find(`[data-testid="resubmit"]`).AttrOr("href", ""); href != fmt.Sprintf("/jobs/new?copy=%d", llama) {
		t.Errorf("resubmit link %q", href)
	}

	// A finished job: 8 A100 × 1.5 h as tier 2 = 12 GPU-h × 3.20 × 1.25.
	fin := e.jobID("finished-8")
	var f web.JobDetailJSON
	e.getJSON(fmt.Sprintf("/api/v1/jobs/%d", fin), demo.Engineer, &f)
	if f.Cost.Amount != "48.00" || f.Cost.GPUHours != "12.0000" || f.Cost.Currency != "USD" || f.Queue != nil {
		t.Errorf("finished job: cost %+v queue %+v", f.Cost, f.Queue)
	}
	if len(f.Runs) != 1 || fmt.Sprint(f.Runs[0].Nodes) != "[gpu03]" || f.Runs[0].GPUs != 8 || f.Runs[0].End == nil {
		t.Errorf("runs = %+v", f.Runs)
	}
	_, page = br.get(fmt.Sprintf("/jobs/%d", fin))
	d = doc(t, page)
	var kinds []string
	d.Find(`[data-testid="timeline-event"]`).Each(func(_ int, s *goquery.Selection) { kinds = append(kinds, s.AttrOr("data-kind", "")) })
	if strings.Join(kinds, ",") != "submitted,started,ended" || tid(d, "cost") != "48.00 USD" {
		t.Errorf("finished job page: timeline %v cost %q", kinds, tid(d, "cost"))
	}
	if !strings.Contains(d.Find(`[data-kind="started"]`).Text(), "8 GPUs on gpu03") {
		t.Errorf("start event: %q", d.Find(`[data-kind="started"]`).Text())
	}

	// A preempted and requeued job: two run segments.
	run := e.jobID("running-4")
	pre := start.Add(-2 * time.Hour)
	e.exec(`UPDATE allocations SET segment = 2 WHERE job_id = $1`, run)
	e.exec(`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at) SELECT $1, 1, 'gpu02', g, $2, $3 FROM generate_series(0, 3) g`,
		run, pre, pre.Add(time.Hour))
	e.exec(`INSERT INTO leases (job_id, segment, node, rank, gpu_indices, env, state, offered_at, exited_at, stop_reason, preempted_by)
		VALUES ($1, 1, 'gpu02', 0, '{0,1,2,3}', '{}', 'exited', $2, $3, 'preempted', $4)`, run, pre, pre.Add(time.Hour), ranker)
	e.exec(`UPDATE jobs SET segment = 2, preemptions = 1, submitted_at = $2::timestamptz - interval '1 minute' WHERE id = $1`, run, pre)
	_, page = br.get(fmt.Sprintf("/jobs/%d", run))
	d = doc(t, page)
	kinds = nil
	d.Find(`[data-testid="timeline-event"]`).Each(func(_ int, s *goquery.Selection) { kinds = append(kinds, s.AttrOr("data-kind", "")) })
	if strings.Join(kinds, ",") != "submitted,started,preempted,started,running" {
		t.Errorf("requeued job timeline: %v", kinds)
	}
	if txt := d.Find(`[data-kind="preempted"]`).Text(); !strings.Contains(txt, fmt.Sprintf("by job %d", ranker)) {
		t.Errorf("preempted event: %q", txt)
	}

	// GPU utilization from the agents' raw samples: GPU 0 at 90 %, GPU 3
	// at 10 %, every 10 s over the last 10 minutes (4 GPUs held).
	e.exec(`INSERT INTO gpu_samples (node, gpu_index, at, job_id, util_pct, mem_used_mib, mem_total_mib, temp_c, power_w, ecc_sbe_vol, ecc_dbe_vol,
			throttle_reasons, xid_errors)
		SELECT 'gpu01', g, $2::timestamptz - i * interval '10 seconds', $1, CASE g WHEN 0 THEN 90 WHEN 3 THEN 10 ELSE 50 END, 1000, 81920, 40, 200, 0, 0, 0, 0
		FROM generate_series(0, 3) g, generate_series(1, 60) i`, run, e.m.Store.Now())
	var r web.JobDetailJSON
	e.getJSON(fmt.Sprintf("/api/v1/jobs/%d", run), demo.Engineer, &r)
	perGPU := map[string][]float64{}
	for _, p := range r.GPUUtil {
		perGPU[p.GPU] = append(perGPU[p.GPU], p.UtilPct)
	}
	if len(perGPU) != 4 || len(perGPU["gpu01/0"]) == 0 {
		t.Fatalf("gpu util = %+v", r.GPUUtil)
	}
	for _, u := range perGPU["gpu01/0"] {
		if u != 90 {
			t.Errorf("GPU 0 bucket at %v %%, want 90", u)
		}
	}
	for _, u := range perGPU["gpu01/3"] {
		if u != 10 {
			t.Errorf("GPU 3 bucket at %v %%, want 10", u)
		}
	}
	_, page = br.get(fmt.Sprintf("/jobs/%d", run))
	if n := doc(t, page).Find(`[data-testid="chart-util"] polyline`).Length(); n != 4 {
		t.Errorf("utilization chart has %d lines, want one per GPU", n)
	}

	// Resubmit as a copy: the form comes pre-filled; submitting makes a new job.
	_, form := br.get(fmt.Sprintf("/jobs/new?copy=%d", fin))
	fd := doc(t, form)
	if fd.Find(`input[name="gpus"]`).AttrOr("value", "") != "8" || fd.Find(`input[name="command"]`).AttrOr("value", "") != "python eval.py" ||
		fd.Find(`select[name="tier"] option[selected]`).AttrOr("value", "") != "2" || fd.Find(`input[name="time_limit"]`).AttrOr("value", "") != "4h" {
		t.Errorf("copy form not pre-filled: %q", fd.Find(`[data-testid="job-form"]`).Text())
	}
	before := e.jobCount()
	status, _ := br.post("/jobs", form, url.Values{"team": {"nlp"}, "tier": {"3"}, "gpus": {"8"}, "gpu_type": {"A100-80GB"}, "time_limit": {"4h"},
		"command": {"python eval.py"}, "name": {"finished-8"}})
	if status != 200 || e.jobCount() != before+1 {
		t.Errorf("resubmitting the copy: %d, jobs %d → %d", status, before, e.jobCount())
	}
	if code, _, _ := e.api("GET", "/jobs/new?copy=999999", demo.Engineer, ""); code != 404 {
		t.Errorf("copy of a missing job: %d", code)
	}
}

func TestJobsListFilters(t *testing.T) {
	e := bootQuiet(t)
	br := e.login(demo.Lead)
	names := func(path string) []string {
		t.Helper()
		status, page := br.get(path)
		if status != 200 {
			t.Fatalf("%s: %d", path, status)
		}
		var out []string
		doc(t, page).Find(`[data-testid="job-row"] td:nth-child(2)`).Each(func(_ int, s *goquery.Selection) { out = append(out, s.Text()) })
		sort.Strings(out)
		return out
	}
	// Seeded queue in nlp: llama-sft (noah). The lead sees nlp only.
	if got := names("/jobs?state=pending"); fmt.Sprint(got) != "[llama-sft]" {
		t.Errorf("pending = %v", got)
	}
	if got := names("/jobs?state=pending&mine=1"); len(got) != 0 {
		t.Errorf("lead's own pending = %v", got)
	}
	fin := e.login(demo.Finance)
	_, page := fin.get("/jobs?state=pending&tier=4&q=SWEEP")
	d := doc(t, page)
	var got []string
	d.Find(`[data-testid="job-row"] td:nth-child(2)`).Each(func(_ int, s *goquery.Selection) { got = append(got, s.Text()) })
	if fmt.Sprint(got) != "[embedding-sweep]" || !strings.Contains(tid(d, "filtered"), `names containing "SWEEP"`) ||
		d.Find(`input[name="q"]`).AttrOr("value", "") != "SWEEP" || d.Find(`select[name="tier"] option[selected]`).AttrOr("value", "") != "4" {
		t.Errorf("finance, tier 4 and name: %v, %q", got, tid(d, "filtered"))
	}
	// A "%" is a character, not a wildcard.
	_, page = fin.get("/jobs?q=" + url.QueryEscape("%"))
	if n := doc(t, page).Find(`[data-testid="job-row"]`).Length(); n != 0 {
		t.Errorf("q=%% matched %d jobs", n)
	}
	var list web.JobList
	e.getJSON("/api/v1/jobs?tier=preemptible&mine=1", demo.Engineer, &list)
	if len(list.Jobs) != 0 {
		t.Errorf("API filter: %+v", list.Jobs)
	}
	e.getJSON("/api/v1/jobs?q=llama&user=me", demo.Engineer, &list)
	if len(list.Jobs) != 1 || list.Jobs[0].Name != "llama-sft" {
		t.Errorf("API q + user=me: %+v", list.Jobs)
	}
	if code, _, b := e.api("GET", "/api/v1/jobs?tier=7", demo.Engineer, ""); code != 422 || !strings.Contains(string(b), "tier") {
		t.Errorf("bad tier: %d %s", code, b)
	}
}

func TestTeamPageStanding(t *testing.T) {
	e := bootQuietStory(t)
	ctx := context.Background()
	// Known fair-share inputs: weights fraud 1, nlp 2, recs 1 (the demo's);
	// decayed usage 1000, 3000 and 0 GPU-hours.
	for team, h := range map[string]float64{"fraud": 1000, "nlp": 3000, "recs": 0} {
		e.exec(`INSERT INTO team_usage (team, gpu_seconds, updated_at) VALUES ($1, $2, $3)
			ON CONFLICT (team) DO UPDATE SET gpu_seconds = EXCLUDED.gpu_seconds`, team, h*3600, e.m.Store.Now())
	}
	var fs web.FairShareJSON
	// Before any cycle: the inputs, and no computed figure.
	e.getJSON("/api/v1/fairshare", demo.Engineer, &fs)
	if len(fs.Teams) != 3 || fs.CycleID != nil || !strings.Contains(fs.Method, "No scheduling cycle has recorded them yet") {
		t.Fatalf("fair share before any cycle = %+v", fs)
	}
	for _, r := range fs.Teams {
		if r.Computed || r.FairShare != 0 || r.RawShares == 0 {
			t.Errorf("%s before any cycle: %+v", r.Team, r)
		}
	}
	// A cycle computes and stores them; the table reads the cycle's.
	if _, err := (&jobs.Scheduler{Store: e.m.Store}).Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	var cycleID int64
	e.m.Pool.QueryRow(ctx, `SELECT max(id) FROM scheduling_cycles`).Scan(&cycleID) //nolint:errcheck
	e.getJSON("/api/v1/fairshare", demo.Engineer, &fs)
	// S = 1/4, 2/4, 1/4; U = 0.25, 0.75, 0; F = 2^(-U/S).
	want := map[string][3]float64{"fraud": {0.25, 0.25, 0.5}, "nlp": {0.5, 0.75, math.Exp2(-1.5)}, "recs": {0.25, 0, 1}}
	if len(fs.Teams) != 3 || fs.HalfLifeS != 7*24*3600 || fs.CycleID == nil || *fs.CycleID != cycleID || !strings.Contains(fs.Method, "As of the scheduling cycle") {
		t.Fatalf("fair share = %+v", fs)
	}
	for _, r := range fs.Teams {
		if !r.Computed {
			t.Errorf("%s: not computed by the cycle", r.Team)
		}
		w := want[r.Team]
		// (The cycle decayed the usage over the seconds since it was set:
		// U moves by about 1e-9.)
		if math.Abs(r.NormShares-w[0]) > 1e-12 || math.Abs(r.EffectiveUsage-w[1]) > 1e-6 || math.Abs(r.FairShare-w[2]) > 1e-6 {
			t.Errorf("%s: %+v, want S %v U %v F %v", r.Team, r, w[0], w[1], w[2])
		}
	}

	// Usage by job type: the demo's nlp history (tiers 2, 3, 4 on A100) plus
	// a known preemptible T4 job this month.
	nadia, err := e.m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Lead])
	if err != nil {
		t.Fatal(err)
	}
	now := e.m.Store.Now().UTC()
	s := now.Truncate(time.Minute).Add(-30 * time.Minute)
	if err := e.m.Store.RecordFinishedJob(ctx, &nadia, allot.JobSpec{Name: "t4-probe", Team: "nlp", Tier: allot.TierPreemptible, GPUs: 2, GPUType: "T4",
		TimeLimit: time.Hour, Command: []string{"true"}}, allot.JobCompleted, s, s, s.Add(18*time.Minute), "gpu16", []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	var b web.BudgetJSON
	e.getJSON("/api/v1/teams/nlp/budget", demo.Lead, &b)
	var sum float64
	found := false
	for _, k := range b.ByKind {
		var h float64
		fmt.Sscan(k.GPUHours, &h) //nolint:errcheck
		sum += h
		if k.Tier == "preemptible" && k.GPUType == "T4" {
			found = k.GPUHours == "0.6" // 2 GPUs × 18 min
		}
	}
	var used float64
	fmt.Sscan(b.UsedGPUHours, &used) //nolint:errcheck
	if !found || math.Abs(sum-used) > 0.05*float64(len(b.ByKind)) {
		t.Errorf("by kind %+v (sum %.1f) vs used %s", b.ByKind, sum, b.UsedGPUHours)
	}

	br := e.login(demo.Lead)
	status, page := br.get("/teams/nlp")
	d := doc(t, page)
	if status != 200 {
		t.Fatalf("team page: %d", status)
	}
	row := d.Find(`[data-testid="fairshare-row"][data-team="nlp"]`)
	if row.Find(`[data-testid="norm-shares"]`).Text() != "0.5000" || row.Find(`[data-testid="raw-usage"]`).Text() != "3000.0" ||
		row.Find(`[data-testid="effective-usage"]`).Text() != "0.7500" || row.Find(`[data-testid="fairshare-factor"]`).Text() != "0.3536" ||
		!row.HasClass("this-team") {
		t.Errorf("nlp fair-share row: %q", row.Text())
	}
	if d.Find(`[data-testid="fairshare-row"]`).Length() != 3 {
		t.Error("every team's standing should be shown")
	}
	k := d.Find(`[data-testid="kind-row"][data-tier="preemptible"][data-gpu-type="T4"] [data-testid="gpu-hours"]`)
	if k.Text() != "0.6" {
		t.Errorf("preemptible T4 row: %q", k.Text())
	}
	// The demo's nlp is over budget: its alerts are listed.
	if d.Find(`[data-testid="burndown"]`).Length() != 1 {
		t.Error("burn-down chart missing")
	}
	if d.Find(`[data-testid="findings"]`).Length() != 1 {
		t.Error("findings table missing")
	}
}

// TestTeamFindings: the team page lists the team's right-sizing findings
// (from the demo's sampled history) and an engineer sees only their own.
func TestTeamFindings(t *testing.T) {
	e := bootQuietStory(t)
	ctx := context.Background()
	if err := demo.SeedActivity(ctx, e.m.Store); err != nil {
		t.Fatal(err)
	}
	var rep web.RightSizingJSON
	now := e.m.Store.Now().UTC()
	from := store.MonthStart(now)
	e.getJSON("/api/v1/rightsizing?team=nlp&from="+from.Format(time.RFC3339)+"&to="+now.Add(time.Minute).Format(time.RFC3339), demo.Lead, &rep)
	lead := e.login(demo.Lead)
	_, page := lead.get("/teams/nlp")
	d := doc(t, page)
	shown := map[string]bool{}
	d.Find(`[data-testid="finding"]`).Each(func(_ int, s *goquery.Selection) {
		shown[s.AttrOr("data-job-id", "")+"/"+s.AttrOr("data-rule", "")] = true
	})
	want := 0
	for _, j := range rep.Jobs {
		for _, f := range j.Flags {
			want++
			if !shown[fmt.Sprintf("%d/%s", j.JobID, f.Rule)] {
				t.Errorf("finding %d/%s not on the team page", j.JobID, f.Rule)
			}
		}
	}
	if want == 0 || len(shown) != want {
		t.Errorf("team page shows %d findings, the report has %d", len(shown), want)
	}
	eng := e.login(demo.Engineer)
	_, page = eng.get("/teams/nlp")
	d = doc(t, page)
	d.Find(`[data-testid="finding"] td:nth-child(2)`).Each(func(_ int, s *goquery.Selection) {
		if s.Text() != demo.PersonaEmail[demo.Engineer] {
			t.Errorf("engineer sees a finding of %s", s.Text())
		}
	})
	if !strings.Contains(page, "Your jobs, ") {
		t.Error("engineer's findings scope should say it is their jobs")
	}
}

// BenchmarkDashboardPagesYear measures the everyday pages with a year of
// history: 50,000 finished 8-GPU jobs of nlp (400k allocation rows, one
// usage rollup row each) and 2,000 pending jobs. It reports p50/p95 over
// 20 requests per page, then the cluster API again without
// jobs_started_idx (migration 0013). -benchtime 1x.
func BenchmarkDashboardPagesYear(b *testing.B) {
	const benchRequests = 20
	ctx := context.Background()
	m := &Main{Config: Config{DevMode: true}}
	startSeeded(b, &m)
	for _, q := range []string{
		`INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, state, submitted_at, started_at, ended_at, segment, run_as)
			SELECT 'year-' || i, 'nlp', (SELECT id FROM users WHERE email = 'noah@example.com'), (ARRAY['2','3','4','3'])[i % 4 + 1], 8, 'A100-80GB', 36000,
				'{true}', 'completed', now() - interval '365 days' + i * interval '10 minutes' - (i % 7) * interval '3 minutes',
				now() - interval '365 days' + i * interval '10 minutes', now() - interval '365 days' + i * interval '10 minutes' + interval '9 minutes', 1, '3'
			FROM generate_series(0, 49999) i`,
		`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at)
			SELECT j.id, 1, 'gpu09', g, j.started_at, j.ended_at FROM jobs j CROSS JOIN generate_series(0, 7) g WHERE j.name LIKE 'year-%'`,
		`INSERT INTO job_usage_hours (job_id, segment, hour, gpu_type, gpus, gpu_seconds, samples, mean_util_pct, mean_mem_used_mib, peak_mem_used_mib, mem_total_mib)
			SELECT id, 1, date_bin('1 hour', started_at, 'epoch'), 'A100-80GB', 8, 4320, 432, 20 + id % 70, 30000, 40000, 81920
			FROM jobs WHERE name LIKE 'year-%' ON CONFLICT DO NOTHING`,
		`INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, submitted_at, priority, priority_breakdown)
			SELECT 'queued-' || i, (ARRAY['nlp','fraud','recs'])[i % 3 + 1], (SELECT id FROM users WHERE email = 'noah@example.com'),
				(ARRAY['3','4','preemptible','2'])[i % 4 + 1], 1 + i % 8, CASE WHEN i % 5 = 0 THEN NULL ELSE 'A100-80GB' END, 3600 * (1 + i % 12),
				'{true}', now() - i * interval '1 minute', i % 9000, jsonb_build_object('class', 3, 'fair_share', 0.5)
			FROM generate_series(1, 2000) i`,
		`ANALYZE`,
	} {
		if _, err := m.Pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	var pending int64
	if err := m.Pool.QueryRow(ctx, `SELECT id FROM jobs WHERE name = 'queued-999'`).Scan(&pending); err != nil {
		b.Fatal(err)
	}
	tokens := map[string]string{}
	for _, p := range []string{demo.Lead, demo.Admin} {
		u, _ := m.Store.UserByEmail(ctx, demo.PersonaEmail[p])
		tok, _, err := m.Store.CreateAPIToken(ctx, u.ID, "bench")
		if err != nil {
			b.Fatal(err)
		}
		tokens[p] = tok
	}
	measure := func(path, persona string) (float64, float64) {
		var lat []time.Duration
		for range benchRequests {
			req, _ := http.NewRequest("GET", m.URL()+path, nil)
			req.Header.Set("Authorization", "Bearer "+tokens[persona])
			t0 := time.Now() // stopwatch
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("%s: status %d", path, resp.StatusCode)
			}
			lat = append(lat, time.Since(t0))
		}
		sortDurations(lat)
		p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
		return p(0.5), p(0.95)
	}
	b.ResetTimer()
	for range b.N {
		for _, pg := range []struct{ name, path, persona string }{
			{"cluster-api", "/api/v1/cluster", demo.Admin},
			{"cluster-page", "/cluster", demo.Admin},
			{"team-page", "/teams/nlp", demo.Lead},
			{"budget-api", "/api/v1/teams/nlp/budget", demo.Lead},
			{"rightsizing", "/api/v1/rightsizing?team=nlp&period=month", demo.Lead},
			{"fairshare", "/api/v1/fairshare", demo.Lead},
			{"job-page", fmt.Sprintf("/jobs/%d", pending), demo.Lead},
			{"job-api", fmt.Sprintf("/api/v1/jobs/%d", pending), demo.Lead},
			{"jobs-list", "/jobs?q=year-4&state=completed", demo.Lead},
		} {
			p50, p95 := measure(pg.path, pg.persona)
			b.ReportMetric(p95, pg.name+"-p95-ms")
			b.Logf("%-12s %-34s p50 %6.1f ms  p95 %6.1f ms", pg.name, pg.path, p50, p95)
		}
	}
	b.StopTimer()
	if _, err := m.Pool.Exec(ctx, `DROP INDEX jobs_started_idx`); err != nil {
		b.Fatal(err)
	}
	p50, p95 := measure("/api/v1/cluster", demo.Admin)
	b.Logf("without jobs_started_idx: cluster-api p50 %.1f ms, p95 %.1f ms", p50, p95)
}

// fmtUTC is a time as the portal writes it.
func fmtUTC(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 UTC") }
