package main

import (
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/chromedp/chromedp"
)

// pageShot saves the 1280 × 900 viewport (not the whole page, to keep the
// PNG small) as $ALLOT_SCREENSHOTS/name.png when the variable is set. A
// relative directory is taken from the repository root, so
// `ALLOT_SCREENSHOTS=static/screenshots go test ./cmd/allot` writes there.
func pageShot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	saveShot(t, name, func() ([]byte, error) { return chromedp.Run(ctx, chromedp.CaptureScreenshot()) })
}

// saveShot writes what take captures as $ALLOT_SCREENSHOTS/name.png when
// the variable is set (a relative directory is taken from the repository
// root); take runs only then.
func saveShot(t *testing.T, name string, take func() ([]byte, error)) {
	t.Helper()
	dir := os.Getenv("ALLOT_SCREENSHOTS")
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join("..", "..", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	buf, err := take()
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBrowserPendingExplained: an engineer submits a job with an invalid
// value, gets the field error, fixes it, and finds the job pending on its
// page with the scheduler's reason and its queue position.
func TestBrowserPendingExplained(t *testing.T) {
	e := boot(t)
	b := browse(t)
	b.login(e.url+"/login", demo.Engineer, `[data-testid="jobs-table"]`)
	before := e.jobCount()
	b.do(chromedp.Navigate(e.url+"/jobs/new"),
		chromedp.WaitVisible(css(`[data-testid="job-form"]`)),
		chromedp.SetValue(css(`select[name="gpu_type"]`), "T4"),
		chromedp.SetValue(css(`input[name="gpus"]`), "40"),
		chromedp.SetValue(css(`input[name="time_limit"]`), "1h"),
		chromedp.SendKeys(css(`input[name="command"]`), "python probe.py"),
		chromedp.SendKeys(css(`input[name="name"]`), "browser-pending"),
		chromedp.Click(css(`[data-testid="submit"]`)),
		chromedp.WaitVisible(css(`[data-testid="error-gpus"]`)))
	if msg := b.text(`[data-testid="error-gpus"]`); !strings.Contains(msg, "at most 32 GPUs") {
		t.Errorf("GPUs error: %q", msg)
	}
	if e.jobCount() != before {
		t.Fatalf("the invalid job was stored: %d → %d jobs", before, e.jobCount())
	}
	b.do(chromedp.SetValue(css(`input[name="gpus"]`), "2"),
		chromedp.Click(css(`[data-testid="submit"]`)),
		chromedp.WaitVisible(css(`[data-testid="queue-position"]`)))
	if title, state := b.text(`h1`), b.text(`[data-testid="state"]`); !strings.Contains(title, "browser-pending") || state != "pending" {
		t.Errorf("job page: title %q state %q", title, state)
	}
	// No agent runs in this test, so no node is up: the page says why it
	// waits once a cycle has looked at it (the page refreshes itself).
	b.do(chromedp.Poll[chromedp.Void](
		`!document.querySelector('[data-testid="pending-reason"]').innerText.includes('next scheduling cycle')`,
		chromedp.WithPollingTimeout(30*time.Second)))
	reason := b.text(`[data-testid="pending-reason"]`)
	if !strings.Contains(reason, "2 GPUs") || !strings.Contains(reason, "T4") {
		t.Errorf("pending reason: %q", reason)
	}
	// The same refresh shows the cycle's rank in its queue (the demo's
	// four jobs and this one) and, with no node up, no estimate but why.
	pos, _ := strconv.Atoi(b.text(`[data-testid="queue-position"]`))
	of, _ := strconv.Atoi(b.text(`[data-testid="queue-of"]`))
	if pos < 1 || of != 5 || pos > of {
		t.Errorf("queue: #%q of %q", b.text(`[data-testid="queue-position"]`), b.text(`[data-testid="queue-of"]`))
	}
	if eta := b.text(`[data-testid="eta"]`); !strings.HasPrefix(eta, "unknown: ") || !strings.Contains(eta, "T4") {
		t.Errorf("estimate: %q", eta)
	}
	pageShot(t, b.ctx, "engineer-pending-job")
}

// TestBrowserChargebackCSV: finance follows the finance page's pointer to
// last month (complete, and open, at every instant of this one), downloads
// its CSV from the link with the browser's session, and the CSV's amounts
// add up to the total the page shows, to the cent.
func TestBrowserChargebackCSV(t *testing.T) {
	e := boot(t)
	ctx := context.Background()
	if _, err := jobs.Rollup(ctx, e.m.Store, clock.Now()); err != nil {
		t.Fatal(err)
	}
	b := browse(t)
	b.login(e.url+"/login", demo.Finance, `[data-testid="whoami"]`)
	b.do(chromedp.Navigate(e.url+"/finance"), chromedp.WaitVisible(chromedp.CSS(`[data-testid="open-month"] a`)))
	// Last month as the page saw it (a test may start before a month's
	// midnight and load the page after it).
	pointer, err := chromedp.Run(b.ctx, chromedp.AttributeValue(chromedp.CSS(`[data-testid="open-month"] a`), "href"))
	last := strings.TrimPrefix(pointer.Value, "/finance?month=")
	if err != nil || (last != billing.Month(e.m.Store.Now()).Prev().String() && last != billing.Month(e.m.Store.Now()).Prev().Prev().String()) {
		t.Fatalf("the finance page points at %q (%v), not last month", pointer.Value, err)
	}
	b.do(chromedp.Click(chromedp.CSS(`[data-testid="open-month"] a`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid="export"]`)))
	shown := b.text(`[data-testid="finance-teams"] tfoot td:last-child`)
	href, err := chromedp.Run(b.ctx, chromedp.AttributeValue(chromedp.CSS(`[data-testid="export"]`), "href"))
	if err != nil || !strings.Contains(href.Value, "month="+last) {
		t.Fatalf("export link %q: %v", href.Value, err)
	}
	body, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`fetch(document.querySelector('[data-testid="export"]').href, {credentials: "same-origin"})
		.then(r => r.ok ? r.text() : Promise.reject(new Error("HTTP " + r.status)))`, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if err != nil || len(rows) < 2 {
		t.Fatalf("CSV: %v (%d rows)", err, len(rows))
	}
	var sum allot.Money
	for _, r := range rows[1:] {
		sum.Micros += micros(t, r[14])
	}
	sum.Currency = "USD"
	if got := sum.Decimal(); got != shown || micros(t, shown) <= 0 {
		t.Errorf("CSV adds up to %s; the page shows %s", got, shown)
	}
	pageShot(t, b.ctx, "finance-csv-download")
}

// TestBrowserPages opens each persona's main page in Chromium over a demo
// with a week of activity: the engineer's job page, the lead's team page,
// finance's chargeback and the admin's cluster dashboard. With
// ALLOT_SCREENSHOTS set it saves one PNG of each (the README's).
func TestBrowserPages(t *testing.T) {
	e := bootQuiet(t)
	ctx := context.Background()
	if err := demo.SeedActivity(ctx, e.m.Store); err != nil {
		t.Fatal(err)
	}
	dashboardFixture(t, e)
	e.exec(`UPDATE nodes SET state = 'up' WHERE name IN ('gpu03', 'gpu04', 'gpu05', 'gpu09', 'gpu10', 'gpu15', 'gpu16')`)
	if _, err := jobs.Rollup(ctx, e.m.Store, clock.Now()); err != nil {
		t.Fatal(err)
	}
	// A job too wide for the nodes that are up (6 whole A100 nodes of
	// ib-a; 5 are up), then one real scheduling cycle: it stays pending
	// with the scheduler's reason while the seeded queue starts.
	noah, err := e.m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Engineer])
	if err != nil {
		t.Fatal(err)
	}
	wide, err := e.m.Store.SubmitJob(ctx, &noah, allot.JobSpec{Name: "pretrain-48", Team: "nlp", Tier: allot.Tier3, GPUs: 48, GPUType: "A100-80GB",
		TimeLimit: 24 * time.Hour, Command: []string{"torchrun", "--nnodes", "6", "pretrain.py"}, Checkpointable: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&jobs.Scheduler{Store: e.m.Store}).Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		persona, path, wait, shot string
	}{
		{demo.Engineer, "/jobs/" + strconv.FormatInt(wide.ID, 10), `[data-testid="queue-position"]`, "engineer-job"},
		{demo.Lead, "/teams/nlp", `[data-testid="fairshare"]`, "lead-team"},
		// This month's bill, or in a month's first hour (nothing rolled up
		// yet) the pointer to last month's.
		{demo.Finance, "/finance", `[data-testid="finance-teams"], [data-testid="open-month"]`, "finance-chargeback"},
		{demo.Admin, "/cluster", `[data-testid="chart-history"]`, "admin-cluster"},
	} {
		t.Run(tt.persona, func(t *testing.T) {
			b := browse(t)
			b.do(chromedp.EmulateViewport(1280, 900))
			b.login(e.url+"/login", tt.persona, `[data-testid="whoami"]`)
			path := tt.path
			b.do(chromedp.Navigate(e.url+path), chromedp.WaitVisible(css(tt.wait)))
			if strings.Contains(b.text("main"), "Internal Server Error") {
				t.Errorf("%s: error page", path)
			}
			pageShot(t, b.ctx, tt.shot)
		})
	}
}
