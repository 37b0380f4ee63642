package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/chromedp/chromedp"
)

// clippedCellsJS lists every visible table cell of main whose content does
// not show in full: content wider than the cell (scrollWidth beyond
// clientWidth), or a cell that reaches past the viewport or past an
// ancestor that clips or scrolls it (a cell one has to scroll sideways to
// find counts as clipped too). It also reports a page that scrolls
// sideways. Each entry names the table, the row, the column and the text.
const clippedCellsJS = `(() => {
	const vw = document.documentElement.clientWidth;
	const out = [];
	if (document.documentElement.scrollWidth > vw + 1) {
		out.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " px wide in a " + vw + " px viewport");
	}
	const name = c => {
		const t = c.closest("table");
		const id = t && (t.dataset.testid || t.id || t.className) || "table";
		const tr = c.closest("tr");
		const head = t && t.tHead && t.tHead.rows[0] && t.tHead.rows[0].cells[c.cellIndex];
		const col = (c.dataset.label || (head && head.innerText) || "column " + (c.cellIndex + 1)).trim();
		return id + " row " + (tr ? tr.rowIndex : "?") + " [" + col + "] " + JSON.stringify(c.innerText.trim().slice(0, 60));
	};
	for (const c of document.querySelectorAll("main td, main th")) {
		const r = c.getBoundingClientRect();
		if (r.width === 0 || r.height === 0 || getComputedStyle(c).visibility === "hidden") continue;
		if (c.scrollWidth > c.clientWidth + 1) {
			out.push(name(c) + ": content " + c.scrollWidth + " px wide in a " + c.clientWidth + " px cell");
			continue;
		}
		let right = vw, left = 0;
		for (let p = c.parentElement; p && p !== document.documentElement; p = p.parentElement) {
			if (getComputedStyle(p).overflowX !== "visible") {
				const b = p.getBoundingClientRect();
				right = Math.min(right, b.left + p.clientWidth);
				left = Math.max(left, b.left);
			}
		}
		if (r.right > right + 1 || r.left < left - 1) {
			out.push(name(c) + ": spans " + Math.round(r.left) + "–" + Math.round(r.right) + " px, visible " + Math.round(left) + "–" + Math.round(right) + " px");
		}
	}
	return out;
})()`

// fullShot saves the whole page (not just the viewport) as
// $ALLOT_SCREENSHOTS/name.png when the variable is set, like pageShot.
func fullShot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	saveShot(t, name, func() ([]byte, error) { return chromedp.Run(ctx, chromedp.FullScreenshot(100)) })
}

// layoutFixture fills the pages whose tables the layout test reads: a week
// of activity with right-sizing findings, a pending job with a long
// scheduler reason, and burst events (one failed with a long error) with a
// burst node alive.
func layoutFixture(t *testing.T, e *env) {
	t.Helper()
	ctx := context.Background()
	st := e.m.Store
	if err := demo.SeedActivity(ctx, st); err != nil {
		t.Fatal(err)
	}
	dashboardFixture(t, e)
	e.exec(`UPDATE nodes SET state = 'up' WHERE name IN ('gpu03', 'gpu04', 'gpu05', 'gpu09', 'gpu10', 'gpu15', 'gpu16')`)
	if _, err := jobs.Rollup(ctx, st, st.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	noah, err := st.UserByEmail(ctx, demo.PersonaEmail[demo.Engineer])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.SubmitJob(ctx, &noah, allot.JobSpec{Name: "pretrain-48-with-a-rather-long-descriptive-name", Team: "nlp", Tier: allot.Tier3, GPUs: 48,
		GPUType: "A100-80GB", TimeLimit: 24 * time.Hour, Command: []string{"torchrun", "--nnodes", "6", "pretrain.py"}, Checkpointable: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := (&jobs.Scheduler{Store: st}).Cycle(ctx); err != nil {
		t.Fatal(err)
	}

	if err := ensureBurstGPUType(ctx, st, "A100-spot"); err != nil {
		t.Fatal(err)
	}
	req := store.BurstEvent{Kind: store.BurstRequest, Provider: "exec", NodesWanted: 2, GPUType: "A100-spot", GPUsPerNode: 8,
		Reason:            "pending work 412.0 GPU-h over 50 GPU-h and mean wait 3h12m over 2h: 2 nodes of 8 × A100-spot",
		PendingGPUSeconds: 412 * 3600, MeanWaitS: 3*3600 + 12*60, PendingJobs: 9}
	if err := st.CreateBurstEvent(ctx, &req); err != nil {
		t.Fatal(err)
	}
	if err := st.BurstProvisioned(ctx, req.ID, []string{"burst-spot-0a1b2c3d", "burst-spot-4e5f6a7b"}, []string{"tok-one-" + strings.Repeat("x", 24), "tok-two-" + strings.Repeat("y", 24)},
		allot.Money{Micros: 1_400_000, Currency: "USD"}, 1); err != nil {
		t.Fatal(err)
	}
	bad := store.BurstEvent{Kind: store.BurstRequest, Provider: "exec", NodesWanted: 4, GPUType: "A100-spot", GPUsPerNode: 8,
		Reason: "pending work 530.5 GPU-h over 50 GPU-h and mean wait 2h40m over 2h: 4 nodes of 8 × A100-spot", PendingGPUSeconds: 530 * 3600,
		MeanWaitS: 160 * 60, PendingJobs: 12}
	if err := st.CreateBurstEvent(ctx, &bad); err != nil {
		t.Fatal(err)
	}
	if err := st.BurstAttemptFailed(ctx, bad.ID, 3, "provider exited 1: Error: creating instance: InsufficientInstanceCapacity: We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone you requested (us-east-1a).", true); err != nil {
		t.Fatal(err)
	}
}

// TestBrowserTablesFit: the jobs list, the lead's team page, the
// right-sizing report and the burst page show every table cell in full at
// a laptop's 1280 px and on a 390 px phone: no cell's content overflows
// it, none lies past the viewport or inside a sideways scroll, and the
// page itself does not scroll sideways. With ALLOT_SCREENSHOTS set it
// saves each page's first screen at both widths (layout-<page>-<width>.png)
// and the whole page (…-full.png; for the long jobs list, its table's first
// screen: …-table.png).
func TestBrowserTablesFit(t *testing.T) {
	e := bootQuiet(t)
	layoutFixture(t, e)
	b := browse(t)
	b.login(e.url+"/login", demo.Lead, `[data-testid="whoami"]`)
	pages := []struct{ name, path, wait string }{
		{"jobs", "/jobs", `[data-testid="jobs-table"]`},
		{"team", "/teams/nlp", `[data-testid="fairshare"]`},
		{"rightsizing", "/rightsizing?period=month", `[data-testid="rightsizing-teams"]`},
		{"rightsizing-week", "/rightsizing?period=week", `[data-testid="rightsizing-teams"]`},
		{"burst", "/burst", `[data-testid="burst-events"]`},
	}
	for _, width := range []int{1280, 1024, 768, 390} {
		for _, p := range pages {
			b.do(chromedp.EmulateViewport(int64(width), 900), chromedp.Navigate(e.url+p.path), chromedp.WaitVisible(css(p.wait)))
			cells, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`document.querySelectorAll("main td, main th").length`))
			if err != nil {
				t.Fatal(err)
			}
			if cells < 10 {
				t.Errorf("%s: only %d table cells; the fixture should fill the tables", p.path, cells)
			}
			if p.name == "team" {
				checkBurnDownShows(t, b, width)
			}
			clipped, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](clippedCellsJS))
			if err != nil {
				t.Fatal(err)
			}
			pageShot(t, b.ctx, fmt.Sprintf("layout-%s-%d", p.name, width))
			if p.name == "jobs" { // a hundred rows long: its table's first screen
				if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`window.scrollTo(0, document.querySelector('[data-testid="jobs-table"]').getBoundingClientRect().top + window.scrollY); true`)); err != nil {
					t.Fatal(err)
				}
				pageShot(t, b.ctx, fmt.Sprintf("layout-%s-%d-table", p.name, width))
			} else {
				fullShot(t, b.ctx, fmt.Sprintf("layout-%s-%d-full", p.name, width))
			}
			for _, c := range clipped {
				t.Errorf("%s at %d px: %s", p.path, width, c)
			}
		}
	}
}

// burnDownLooks is what the browser drew of the team page's burn-down.
type burnDownLooks struct {
	Stroke      string   `json:"stroke"`
	StrokeWidth float64  `json:"strokeWidth"`
	Dates       []string `json:"dates"`
	YTicks      int      `json:"yTicks"`
	Budget      bool     `json:"budget"`
	Forecast    string   `json:"forecast"`
	Legend      []string `json:"legend"`
	ChartWidth  float64  `json:"chartWidth"`
	Label       string   `json:"label"`
}

// checkBurnDownShows: the burn-down chart is drawn at a readable size with
// a visible usage line, dated axis, budget, forecast and legend.
func checkBurnDownShows(t *testing.T, b browserSteps, width int) {
	t.Helper()
	got, err := chromedp.Run(b.ctx, chromedp.Evaluate[burnDownLooks](`(() => {
		const q = s => document.querySelector(s), all = s => [...document.querySelectorAll(s)];
		const used = getComputedStyle(q('[data-testid="burndown-used"]'));
		const svg = q('svg[data-testid="burndown"]');
		return {
			stroke: used.stroke, strokeWidth: parseFloat(used.strokeWidth),
			dates: all('[data-testid="x-tick"]').map(e => e.textContent),
			yTicks: all('[data-testid="y-tick"]').length,
			budget: !!q('[data-testid="burndown-budget"]'),
			forecast: getComputedStyle(q('[data-testid="burndown-forecast"]')).strokeDasharray,
			legend: all('[data-testid="burndown-legend"] > span').filter(e => e.getBoundingClientRect().height > 0).map(e => e.innerText.trim()),
			chartWidth: svg.getBoundingClientRect().width,
			label: svg.getAttribute("aria-labelledby") && q("#" + svg.getAttribute("aria-labelledby")).textContent,
		};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if got.Stroke == "none" || got.Stroke == "" || got.StrokeWidth < 2 {
		t.Errorf("at %d px the usage line is drawn with stroke %q, width %.1f", width, got.Stroke, got.StrokeWidth)
	}
	if len(got.Dates) < 4 || got.YTicks < 3 || !got.Budget || got.Forecast == "none" || len(got.Legend) != 4 ||
		got.ChartWidth < float64(width)/2 || !strings.Contains(got.Label, "cumulative GPU-hours") {
		t.Errorf("at %d px the burn-down shows %+v", width, got)
	}
}
