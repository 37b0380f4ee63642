package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
	"github.com/chromedp/chromedp"
)

// TestBrowserConfirmDialog: with JavaScript (static/allot.js, allowed by
// the portal's CSP: no inline script) the cancel button asks in a modal
// <dialog> instead of the server's confirm page: "No" leaves the job
// alone, "Yes" cancels it (the form posts confirm=yes).
func TestBrowserConfirmDialog(t *testing.T) {
	e := boot(t)
	code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, `{"name":"dialog-job","team":"nlp","tier":4,"gpus":1,"command":["sleep","60"],"time_limit":"1h"}`)
	var j web.JobJSON
	if err := json.Unmarshal(body, &j); code != http.StatusCreated || err != nil {
		t.Fatalf("submit: %d %s", code, body)
	}
	state := func() string {
		var s string
		if err := e.m.Pool.QueryRow(context.Background(), `SELECT state FROM jobs WHERE id = $1`, j.ID).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	b := browse(t)
	b.login(e.url+"/", demo.Engineer, `[data-testid="jobs-table"]`)
	b.do(chromedp.Navigate(fmt.Sprintf("%s/jobs/%d", e.url, j.ID)),
		chromedp.WaitVisible(css(`[data-testid="cancel"]`)),
		chromedp.Click(css(`[data-testid="cancel"]`)),
		chromedp.WaitVisible(css(`[data-testid="cancel-dialog"]`)))
	screenshot(t, b.ctx, "confirm-cancel-dialog")
	if q := b.text(`[data-testid="cancel-dialog"] h2`); !strings.Contains(q, fmt.Sprintf("Cancel job %d", j.ID)) {
		t.Errorf("dialog asks %q", q)
	}
	b.do(chromedp.Click(css(`[data-testid="cancel-no"]`)),
		chromedp.Sleep(300*time.Millisecond))
	if s := state(); s != "pending" {
		t.Fatalf("after No: %s", s)
	}
	// The page refreshes itself every 10 s while the job waits, but not
	// over an open question.
	b.do(chromedp.Click(css(`[data-testid="cancel"]`)),
		chromedp.WaitVisible(css(`[data-testid="cancel-yes"]`)),
		chromedp.Sleep(11*time.Second))
	if open, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`document.getElementById("confirm-cancel").open`)); err != nil || !open {
		t.Fatalf("the dialog did not survive the page's refresh: open=%v %v", open, err)
	}
	b.do(chromedp.Click(css(`[data-testid="cancel-yes"]`)))
	deadline := time.Now().Add(10 * time.Second)                // deadline (real time)
	for state() != "cancelled" && time.Now().Before(deadline) { // deadline (real time)
		time.Sleep(100 * time.Millisecond)
	}
	if s := state(); s != "cancelled" {
		t.Fatalf("after Yes: %s", s)
	}
	b.do(chromedp.WaitVisible(css(`[data-testid="resubmit"]`)))
	if s := b.text(`[data-testid="state"]`); s != "cancelled" {
		t.Errorf("the page after Yes shows %q", s)
	}
}
