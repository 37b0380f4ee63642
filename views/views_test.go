package views

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/a-h/templ"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func render(t *testing.T, c templ.Component) (string, *goquery.Document) {
	t.Helper()
	var b bytes.Buffer
	if err := c.Render(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	d, err := goquery.NewDocumentFromReader(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return b.String(), d
}

func testid(d *goquery.Document, id string) *goquery.Selection {
	return d.Find(`[data-testid="` + id + `"]`)
}

func TestLineChartView(t *testing.T) {
	t.Parallel()
	c := LineChart{ID: "c", Title: "util", YMax: 100, XMin: 0, XMax: 10, Series: []ChartSeries{
		// Two runs (broken at the missing value) and a lone point.
		{Name: "a", Class: "s1", Points: []ChartPoint{{0, 0}, {1, 50}, {2, NoValue}, {3, 100}, {4, 100}, {5, NoValue}, {6, 25}}},
		{Name: "b", Class: "s2", Points: []ChartPoint{{0, 200}, {10, 10}}},
	}, XTicks: []ChartTick{{At: 5, Label: "mid"}}}
	_, d := render(t, LineChartView(c))
	fig := testid(d, "c")
	if fig.Length() != 1 || fig.Find("svg").AttrOr("aria-label", "") != "util" {
		t.Fatal("chart not found by its id, or without an accessible name")
	}
	lines := fig.Find("polyline.s1")
	if lines.Length() != 2 || lines.Eq(0).AttrOr("points", "") != "44,196 102.4,103" || lines.Eq(1).AttrOr("points", "") != "219.2,10 277.6,10" {
		var got []string
		lines.Each(func(_ int, s *goquery.Selection) { got = append(got, s.AttrOr("points", "")) })
		t.Errorf("series a lines = %q", got)
	}
	// The lone point is a dot; values above YMax are clipped to the top.
	if dot := fig.Find("circle.s1"); dot.Length() != 1 || dot.AttrOr("cx", "") != "394.4" || dot.AttrOr("cy", "") != "149.5" {
		t.Errorf("dots = %d at %s,%s", dot.Length(), dot.AttrOr("cx", ""), dot.AttrOr("cy", ""))
	}
	if p := fig.Find("polyline.s2").AttrOr("points", ""); p != "44,10 628,177.4" {
		t.Errorf("series b = %q", p)
	}
	if fig.Find(".chart-legend span").Length() != 2 || testid(d, "chart-empty").Length() != 0 {
		t.Error("legend should list both series; the chart is not empty")
	}
	if got := fig.Find("text.chart-tick").FilterFunction(func(_ int, s *goquery.Selection) bool { return s.Text() == "mid" }).AttrOr("x", ""); got != "336" {
		t.Errorf("x tick at %q", got)
	}
	_, d = render(t, LineChartView(LineChart{ID: "e", Series: []ChartSeries{{Points: []ChartPoint{{0, NoValue}}}}}))
	if testid(d, "chart-empty").Text() != "no data yet" || d.Find("polyline").Length() != 0 {
		t.Error("an empty chart says so")
	}
}

func TestBarChartView(t *testing.T) {
	t.Parallel()
	b := BarChart{ID: "b", Title: "gpus", Bars: []Bar{
		{Label: "A100", Text: "4 / 16", Parts: []BarPart{{Value: 4, Class: "b-alloc"}, {Value: 12, Class: "b-idle"}, {Value: 0, Class: "b-out"}}},
		{Label: "T4", Text: "0 / 8", Parts: []BarPart{{Value: 8, Class: "b-idle", Title: "8 idle"}}},
	}}
	_, d := render(t, BarChartView(b))
	rects := testid(d, "b").Find("rect.chart-bar")
	// Scale: the largest bar (16) spans the 380-unit track; empty parts
	// are not drawn.
	var got []string
	rects.Each(func(_ int, s *goquery.Selection) {
		got = append(got, s.AttrOr("class", "")+"@"+s.AttrOr("x", "")+"+"+s.AttrOr("width", ""))
	})
	if strings.Join(got, " ") != "chart-bar b-alloc@150+95 chart-bar b-idle@245+285 chart-bar b-idle@150+190" {
		t.Errorf("rects = %q", got)
	}
	var values []string
	testid(d, "bar-value").Each(func(_ int, s *goquery.Selection) { values = append(values, s.Text()) })
	if strings.Join(values, "|") != "4 / 16|0 / 8" || rects.Eq(2).Find("title").Text() != "8 idle" {
		t.Errorf("values %q, tooltip %q", values, rects.Eq(2).Find("title").Text())
	}
	if d.Find("svg").AttrOr("viewBox", "") != "0 0 640 60" {
		t.Errorf("height follows the bars: %q", d.Find("svg").AttrOr("viewBox", ""))
	}
	_, d = render(t, BarChartView(BarChart{ID: "e"}))
	if testid(d, "chart-empty").Length() != 1 {
		t.Error("an empty bar chart says so")
	}
}

func fixedJob() JobDetail {
	return JobDetail{
		Page: Page{Title: "llama-sft", CSRF: "csrf-token", User: &UserBadge{Name: "Noah Kim", Roles: "engineer in nlp", Teams: []string{"nlp"}, Submitter: true}},
		Job: JobRow{ID: 42, Name: "llama-sft", Team: "nlp", User: "noah@example.com", Tier: "3", GPUs: 16, GPUType: "A100-80GB", TimeLimit: "12h",
			State: "pending", Submitted: "2026-11-30 09:00 UTC", PendingReason: "waiting for 16 GPUs in one interconnect domain of type A100-80GB; largest free block is 8"},
		Command: "python train.py --lr 3e-4", Checkpointable: true, Live: true, CanCancel: true, Priority: "5175", ResubmitURL: "/jobs/new?copy=42",
		RunAsUser: "noah", Image: "nvcr.io/nvidia/pytorch:24.05-py3", Memory: "64GiB", CPUs: "8",
		Env: []Option{{Value: "WANDB_MODE", Label: "offline"}}, SecretEnv: []string{"WANDB_API_KEY"},
		Timeline: []TimelineEvent{
			{At: "2026-11-30 09:00 UTC", Kind: "submitted", What: "Submitted", Detail: "by noah@example.com, tier 3, 16 GPUs"},
			{At: "2026-11-30 09:05 UTC", Kind: "started", What: "Run 1 started", Detail: "16 GPUs on gpu01, gpu02"},
			{At: "2026-11-30 10:00 UTC", Kind: "preempted", What: "Run 1 preempted", Detail: "by job 7; requeued with its original submit time"},
			{At: "now", Kind: "pending", What: "Waiting in the queue", Detail: "for 1h30m"},
		},
		Factors: []PriorityFactor{
			{Name: "fair-share", Factor: "0.5000", Weight: "10000", Points: "5000.0", Meaning: "2^(−U/S)"},
			{Name: "size", Factor: "0.1250", Weight: "1000", Points: "125.0", Meaning: "GPUs ÷ cluster GPUs"},
			{Name: "age", Factor: "0.1000", Weight: "500", Points: "50.0", Meaning: "wait ÷ 7d"},
			{Name: "total", Points: "5175", Meaning: "the sum"},
		},
		ClassText: "Class 3 (tier 3) comes before priority.",
		Queue: &QueueInfo{Position: 3, Of: 5, AheadGPUHours: "52.0", ETA: "2026-11-30 12:00 UTC (reserved GPUs, in 1h30m)",
			ETAMethod: "As of the scheduling cycle at 10:29:50 UTC (cycle 41); 2 of the jobs ahead compete for the same GPUs. …"},
		Util: LineChart{ID: "chart-util", Title: "GPU utilization", YMax: 100, XMin: 0, XMax: 3600, Series: []ChartSeries{
			{Name: "GPU gpu01/0", Class: "s1", Points: []ChartPoint{{0, 80}, {1800, 90}, {3600, 85}}},
			{Name: "GPU gpu01/1", Class: "s2", Points: []ChartPoint{{0, 2}, {1800, 3}, {3600, 1}}},
		}},
		UtilNote: "Per GPU.", Cost: "12.80 USD", CostNote: "4.0 GPU-hours × rate × multiplier.",
		Log: []string{"sft step 5 loss 0.9994"},
	}
}

func TestJobDetailView(t *testing.T) {
	t.Parallel()
	_, d := render(t, JobDetailView(fixedJob()))
	if testid(d, "queue-position").Text() != "3" || testid(d, "queue-of").Text() != "5" || testid(d, "eta").Text() != "2026-11-30 12:00 UTC (reserved GPUs, in 1h30m)" ||
		!strings.Contains(testid(d, "queue").Text(), "#3 in the queue (of 5)") {
		t.Errorf("queue: %q", testid(d, "queue").Text())
	}
	// Before its first cycle: not ranked, and why.
	unranked := fixedJob()
	unranked.Queue = &QueueInfo{Of: 5, ETA: "not yet through a scheduling cycle: it came to the queue after the last one (at 10:29:50 UTC); the next one ranks it"}
	if _, u := render(t, JobDetailView(unranked)); testid(u, "queue-position").Text() != "Not ranked yet" ||
		!strings.HasPrefix(testid(u, "eta").Text(), "not yet through a scheduling cycle") {
		t.Errorf("unranked queue: %q", testid(u, "queue").Text())
	}
	var kinds []string
	testid(d, "timeline-event").Each(func(_ int, s *goquery.Selection) { kinds = append(kinds, s.AttrOr("data-kind", "")) })
	if strings.Join(kinds, ",") != "submitted,started,preempted,pending" {
		t.Errorf("timeline = %v", kinds)
	}
	if p := d.Find(`[data-factor="size"] [data-testid="points"]`).Text(); p != "125.0" {
		t.Errorf("size points %q", p)
	}
	if testid(d, "resubmit").AttrOr("href", "") != "/jobs/new?copy=42" || testid(d, "cancel").Length() != 1 || testid(d, "cost").Text() != "12.80 USD" {
		t.Error("actions or cost missing")
	}
	if live := d.Find("#job-live"); live.AttrOr("hx-trigger", "") != "every 10s" {
		t.Error("a pending job's page refreshes itself once a scheduling cycle")
	}
	if n := testid(d, "chart-util").Find("polyline").Length(); n != 2 {
		t.Errorf("utilization chart has %d lines, want one per GPU", n)
	}
	// A finished job seen by finance: no queue, no actions, no refresh.
	j := fixedJob()
	j.Queue, j.Live, j.CanCancel, j.ResubmitURL, j.Job.State, j.Job.PendingReason = nil, false, false, "", "completed", ""
	_, d = render(t, JobDetailView(j))
	if testid(d, "queue").Length() != 0 || testid(d, "cancel").Length() != 0 || testid(d, "resubmit").Length() != 0 ||
		d.Find("#job-live").AttrOr("hx-trigger", "") != "" || testid(d, "pending-reason").Length() != 0 {
		t.Error("a finished job shows no queue, actions or refresh")
	}
}

func fixedCluster() ClusterPage {
	return ClusterPage{
		Page: Page{Title: "Cluster", CSRF: "csrf-token", User: &UserBadge{Name: "Ada Admin", Roles: "admin", Admin: true, Submitter: true}},
		Live: ClusterLive{AsOf: "2026-11-30 12:00 UTC", AllocatedPct: "16.7 %", Allocated: 4, InService: 24, Total: 128, Running: 1, Pending: 4,
			QueueGPUHours: "247.0", HistoryDays: 7,
			Types: BarChart{ID: "chart-types", Title: "GPUs by type", Bars: []Bar{
				{Label: "A100-80GB", Text: "4 / 16 allocated", Parts: []BarPart{{Value: 4, Class: "b-alloc"}, {Value: 12, Class: "b-idle"}, {Value: 80, Class: "b-out"}}},
				{Label: "T4", Text: "0 / 8 allocated", Parts: []BarPart{{Value: 8, Class: "b-idle"}, {Value: 24, Class: "b-out"}}}}},
			History: LineChart{ID: "chart-history", Title: "allocated and busy", YUnit: "%", YMax: 100, XMin: 0, XMax: 7200, Series: []ChartSeries{
				{Name: "allocated", Class: "s1", Points: []ChartPoint{{0, 10}, {3600, 20}, {7200, 16.7}}},
				{Name: "busy", Class: "s2", Points: []ChartPoint{{0, 70}, {3600, NoValue}, {7200, NoValue}}}}},
			Queue:    BarChart{ID: "chart-queue", Title: "queue", Bars: []Bar{{Label: "A100-80GB", Text: "240.0 GPU-h · 2 jobs", Parts: []BarPart{{Value: 240, Class: "b-queue"}}}}},
			Nodes:    BarChart{ID: "chart-nodes", Title: "nodes", Bars: []Bar{{Label: "onprem", Text: "2 up of 16", Parts: []BarPart{{Value: 2, Class: "n-up"}, {Value: 14, Class: "n-down"}}}}},
			NodeRows: []NodeStateRow{{Site: "onprem", Up: 2, Draining: 1, Drained: 1, Down: 12, Total: 16, GPUs: 128}},
			Waits: []WaitRow{{Tier: "1", P50: "—", P95: "—", PendingP50: "—", OldestPending: "—"},
				{Tier: "3", Started: 12, P50: "25m", P95: "1h10m", Pending: 2, PendingP50: "3h", OldestPending: "5h"}},
		},
	}
}

func TestClusterView(t *testing.T) {
	t.Parallel()
	_, d := render(t, ClusterView(fixedCluster()))
	if testid(d, "allocated-pct").Text() != "16.7 %" || testid(d, "running").Text() != "1" || testid(d, "queue-gpu-hours").Text() != "247.0" {
		t.Error("figures missing")
	}
	w := d.Find(`[data-testid="wait-row"][data-tier="3"]`)
	if w.Find(`[data-testid="p50"]`).Text() != "25m" || w.Find(`[data-testid="oldest"]`).Text() != "5h" {
		t.Errorf("tier 3 waits: %q", w.Text())
	}
	if live := d.Find("#cluster-live"); live.AttrOr("hx-get", "") != "/cluster?fragment=live" || live.AttrOr("hx-trigger", "") != "every 10s" {
		t.Error("the live part must poll its fragment")
	}
	// The fragment alone is the same part without the layout.
	html, d := render(t, ClusterLiveView(fixedCluster().Live))
	if strings.Contains(html, "<html") || d.Find("#cluster-live").Length() != 1 {
		t.Error("fragment should be the live part only")
	}
}

// staticURL hides the content hashes of static files, which change with
// every CSS edit and are not what these pages are about.
var staticURL = regexp.MustCompile(`/static/([a-z][a-z.]*?)\.[0-9a-f]{8,}\.(css|js)`)

// TestGoldenPages renders whole pages from fixed props and compares them
// with testdata/*.golden.html (go test ./views -update rewrites them).
func TestGoldenPages(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		c    templ.Component
	}{
		{"cluster", ClusterView(fixedCluster())},
		{"job", JobDetailView(fixedJob())},
	} {
		html, _ := render(t, tt.c)
		html = staticURL.ReplaceAllString(html, "/static/$1.HASH.$2")
		path := filepath.Join("testdata", tt.name+".golden.html")
		if *update {
			if err := os.MkdirAll("testdata", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(html), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./views -run TestGoldenPages -update)", err)
		}
		if string(want) != html {
			t.Errorf("%s page differs from %s (rerun with -update if the change is intended):\n%s", tt.name, path, firstDiff(string(want), html))
		}
	}
}

func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(0, i-80)
	return "want …" + a[from:min(len(a), i+80)] + "…\n got …" + b[from:min(len(b), i+80)] + "…"
}
