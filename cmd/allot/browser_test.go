package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// chromium returns a headless Chromium context, or skips the test when no
// Chromium is installed (.ci/run installs Debian's chromium).
func chromium(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Skip("no Chromium on PATH: install it (apt-get install -y chromium) to run browser tests")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1000))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	// A bound against a hung browser, not a speed check: the longest test
	// (TestBrowserTablesFit, 20 pages and their screenshots) took 66 s on
	// a CI machine shared with other test runs.
	ctx, cancelT := context.WithTimeout(ctx, 180*time.Second)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	return ctx
}

// browserSteps wraps a Chromium context with fatal-on-error helpers.
type browserSteps struct {
	t   *testing.T
	ctx context.Context
}

// browse opens headless Chromium (see chromium) for t.
func browse(t *testing.T) browserSteps {
	t.Helper()
	return browserSteps{t, chromium(t)}
}

func (b browserSteps) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatal(err)
	}
}

// text is the visible text of the first element sel matches, trimmed,
// read in one script: an HTMX swap between finding the node and reading
// it (chromedp.Text's two protocol calls) cannot lose it. It waits up to
// 10 s for such an element.
func (b browserSteps) text(sel string) string {
	b.t.Helper()
	q, _ := json.Marshal(sel)
	deadline := time.Now().Add(10 * time.Second) // a deadline
	for {
		v, err := chromedp.Run(b.ctx, chromedp.Evaluate[*string](`(() => { const e = document.querySelector(`+string(q)+`); return e ? e.innerText : null })()`))
		if err != nil {
			b.t.Fatalf("reading %s: %v", sel, err)
		}
		if v != nil {
			return strings.TrimSpace(*v)
		}
		if time.Now().After(deadline) { // deadline (real time)
			b.t.Fatalf("reading %s: no such element after 10 s", sel)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// login opens start (a full URL that shows someone signed out the dev
// persona picker), picks persona and waits until the signed-in page shows
// who is signed in and waitFor is visible (so the next navigation does not
// abort the login's redirect).
func (b browserSteps) login(start, persona, waitFor string) {
	b.t.Helper()
	b.do(chromedp.Navigate(start),
		chromedp.Click(css(`[data-testid="persona-`+persona+`"]`)),
		chromedp.WaitVisible(css(`[data-testid="whoami"]`)),
		chromedp.WaitVisible(css(waitFor)))
}

func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

// screenshot saves the page to $ALLOT_SCREENSHOTS/name.png when set.
func screenshot(t *testing.T, ctx context.Context, name string) {
	dir := os.Getenv("ALLOT_SCREENSHOTS")
	if dir == "" {
		return
	}
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Logf("screenshot %s: %v", name, err)
		return
	}
	os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644) //nolint:errcheck
}

// TestBrowserSubmit walks the first-day path in a real browser: pick a
// persona, fill the form, see the budget check update before submitting
// (HTMX), get an inline field error, fix it, submit, and find the job.
func TestBrowserSubmit(t *testing.T) {
	e := boot(t)
	e.tightBudget("nlp")
	b := browse(t)
	b.login(e.url+"/", demo.Engineer, `[data-testid="jobs-table"]`)
	if whoami := b.text(`[data-testid="whoami"]`); !strings.Contains(whoami, "Noah Kim") {
		t.Errorf("header says %q", whoami)
	}
	b.do(chromedp.Navigate(e.url+"/jobs/new"),
		chromedp.WaitVisible(css(`[data-testid="job-form"]`)),
		chromedp.SetValue(css(`input[name="gpus"]`), "8"),
		chromedp.SetValue(css(`input[name="time_limit"]`), "4h"),
		chromedp.SendKeys(css(`input[name="command"]`), "python train.py --lr 3e-4"),
		chromedp.SendKeys(css(`input[name="name"]`), "browser-job"),
		chromedp.WaitVisible(css(`[data-testid="quota"][data-kind="warn"]`)))
	screenshot(t, b.ctx, "submit-form")
	if quota := b.text(`[data-testid="quota"]`); !strings.Contains(quota, "will run as preemptible") {
		t.Errorf("budget check before submit says %q", quota)
	}

	// A bad value gets an inline error and keeps what was typed.
	b.do(chromedp.SetValue(css(`input[name="time_limit"]`), "0"),
		chromedp.Click(css(`[data-testid="submit"]`)),
		chromedp.WaitVisible(css(`[data-testid="error-time_limit_s"]`)))
	screenshot(t, b.ctx, "submit-error")
	gpusKept, err := chromedp.Run(b.ctx, chromedp.Value(css(`input[name="gpus"]`)))
	if err != nil {
		t.Fatal(err)
	}
	if fieldErr := b.text(`[data-testid="error-time_limit_s"]`); fieldErr != "must be positive" || gpusKept != "8" {
		t.Errorf("inline error %q, gpus kept %q", fieldErr, gpusKept)
	}

	// Fixed and submitted from the keyboard alone: Enter in a field
	// submits the form.
	b.do(chromedp.SetValue(css(`input[name="time_limit"]`), "4h"),
		chromedp.Focus(css(`input[name="name"]`)),
		chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible(css(`[data-testid="quota-warning"]`)))
	screenshot(t, b.ctx, "job-page")
	if title, state := b.text(`h1`), b.text(`[data-testid="state"]`); !strings.Contains(title, "browser-job") || state != "pending" {
		t.Errorf("job page: title %q state %q", title, state)
	}
	b.do(chromedp.Navigate(e.url+"/jobs?state=pending"), chromedp.WaitVisible(css(`[data-testid="jobs-table"]`)))
	screenshot(t, b.ctx, "jobs-list")
	if listed := b.text(`[data-testid="jobs-table"] tbody`); !strings.Contains(listed, "browser-job") {
		t.Errorf("jobs list lacks the new job: %q", listed)
	}
}
