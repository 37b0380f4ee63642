package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

// postBadCSRF posts v to path with a made-up CSRF token.
func (b *browser) postBadCSRF(path string, v url.Values) int {
	b.e.t.Helper()
	v.Set("_csrf", "not-the-token")
	resp, err := b.c.PostForm(b.e.url+path, v)
	if err != nil {
		b.e.t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	return resp.StatusCode
}

// auditActions counts the audit entries of action on object.
func (e *env) auditActions(action, object string) int {
	e.t.Helper()
	var n int
	if err := e.m.Pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log WHERE action = $1 AND object = $2`, action, object).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// confirmForm checks a confirm page: the question, its form posting to
// action with confirm=yes and the hidden fields.
func confirmForm(t *testing.T, what, page, action string, fields map[string]string) {
	t.Helper()
	if !strings.Contains(page, `data-testid="confirm"`) || !strings.Contains(page, `action="`+action+`"`) ||
		!strings.Contains(page, `name="confirm" value="yes"`) || !strings.Contains(page, `data-testid="confirm-no"`) {
		t.Errorf("%s: no confirm step posting to %s:\n%s", what, action, page)
	}
	for k, v := range fields {
		if !strings.Contains(page, fmt.Sprintf(`name="%s" value="%s"`, k, v)) {
			t.Errorf("%s: the confirm form does not send %s=%s again", what, k, v)
		}
	}
}

// TestPortalConfirmsDestructiveActions: cancelling a job, draining a node
// and closing a month ask first — a <dialog> on the page, and without it
// (no JavaScript, an old browser) the server's confirm page: a POST
// without confirm=yes changes nothing and shows the question; with it the
// action happens; CSRF is still checked; a month's close is audited with
// its totals.
func TestPortalConfirmsDestructiveActions(t *testing.T) {
	e := boot(t)
	ctx := context.Background()

	// Cancel a job (an engineer's own).
	code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, `{"name":"to-cancel","team":"nlp","tier":4,"gpus":1,"command":["sleep","60"],"time_limit":"1h"}`)
	if code != http.StatusCreated {
		t.Fatalf("submit: %d %s", code, body)
	}
	var j web.JobJSON
	json.Unmarshal(body, &j) //nolint:errcheck
	jobPath := fmt.Sprintf("/jobs/%d", j.ID)
	state := func() string {
		var s string
		if err := e.m.Pool.QueryRow(ctx, `SELECT state FROM jobs WHERE id = $1`, j.ID).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	br := e.login(demo.Engineer)
	_, page := br.get(jobPath)
	if !strings.Contains(page, `type="submit" class="secondary" data-testid="cancel" aria-haspopup="dialog" data-confirm="confirm-cancel"`) || !strings.Contains(page, `id="confirm-cancel"`) ||
		!strings.Contains(page, `data-testid="cancel-dialog"`) || !strings.Contains(page, `name="confirm" value="yes" data-testid="cancel-yes"`) {
		t.Errorf("the job page's cancel button opens no dialog:\n%s", page)
	}
	status, confirmPage := br.post(jobPath+"/cancel", page, url.Values{})
	if status != http.StatusOK || state() != "pending" {
		t.Fatalf("cancel without confirm: %d, state %s; want the question and nothing done", status, state())
	}
	confirmForm(t, "cancel", confirmPage, jobPath+"/cancel", nil)
	if !strings.Contains(confirmPage, fmt.Sprintf("Cancel job %d (to-cancel)?", j.ID)) {
		t.Errorf("the question does not name the job")
	}
	if code := br.postBadCSRF(jobPath+"/cancel", url.Values{"confirm": {"yes"}}); code != http.StatusForbidden || state() != "pending" {
		t.Errorf("cancel with a bad CSRF token: %d, state %s", code, state())
	}
	if status, page := br.post(jobPath+"/cancel", confirmPage, url.Values{"confirm": {"yes"}}); status != http.StatusOK || state() != "cancelled" ||
		!strings.Contains(page, `data-testid="state">cancelled`) {
		t.Errorf("cancel confirmed: %d, state %s", status, state())
	}
	if status, _ := br.post(jobPath+"/cancel", page, url.Values{}); status != http.StatusConflict {
		t.Errorf("asking to cancel a cancelled job: %d, want 409 and no question", status)
	}

	// Drain a node (admin).
	var node string
	if err := e.m.Pool.QueryRow(ctx, `UPDATE nodes SET state = 'up', state_reason = '' WHERE name = 'gpu03' RETURNING name`).Scan(&node); err != nil {
		t.Fatal(err)
	}
	nodePath := "/nodes/" + node
	nodeState := func() string { return e.nodeState(node) }
	admin := e.login(demo.Admin)
	_, page = admin.get(nodePath)
	if !strings.Contains(page, `data-testid="drain-dialog"`) || !strings.Contains(page, `data-confirm="confirm-drain"`) {
		t.Errorf("the node page's drain button opens no dialog")
	}
	if status, page := admin.post(nodePath+"/drain", page, url.Values{"reason": {"  "}}); status != http.StatusUnprocessableEntity || !strings.Contains(page, `data-testid="error-reason"`) {
		t.Errorf("drain without a reason: %d, want the field error before any question", status)
	}
	status, confirmPage = admin.post(nodePath+"/drain", page, url.Values{"reason": {"fan noise"}, "requeue": {"1"}})
	if status != http.StatusOK || nodeState() != "up" || e.auditActions("node.drain", "node:"+node) != 0 {
		t.Fatalf("drain without confirm: %d, node %s; want the question and nothing done", status, nodeState())
	}
	confirmForm(t, "drain", confirmPage, nodePath+"/drain", map[string]string{"reason": "fan noise", "requeue": "1"})
	if !strings.Contains(confirmPage, "Drain "+node+"?") || !strings.Contains(confirmPage, "stopped now") {
		t.Errorf("the drain question does not say what happens to the jobs")
	}
	if code := admin.postBadCSRF(nodePath+"/drain", url.Values{"reason": {"fan noise"}, "confirm": {"yes"}}); code != http.StatusForbidden || nodeState() != "up" {
		t.Errorf("drain with a bad CSRF token: %d, node %s", code, nodeState())
	}
	if status, _ := admin.post(nodePath+"/drain", confirmPage, url.Values{"reason": {"fan noise"}, "requeue": {"1"}, "confirm": {"yes"}}); status != http.StatusOK ||
		(nodeState() != "drained" && nodeState() != "draining") || e.auditActions("node.drain", "node:"+node) != 1 {
		t.Errorf("drain confirmed: %d, node %s", status, nodeState())
	}

	// Close last month (finance), audited with its totals.
	month := billing.Month(clock.Now()).Prev()
	m := month.String()
	closed := func() bool {
		at, _, err := e.m.Store.MonthClosed(ctx, month)
		if err != nil {
			t.Fatal(err)
		}
		return !at.IsZero()
	}
	fin := e.login(demo.Finance)
	_, page = fin.get("/finance?month=" + m)
	if !strings.Contains(page, `data-testid="close-month-dialog"`) || !strings.Contains(page, "Close "+m+"?") {
		t.Errorf("the finance page's close button opens no dialog")
	}
	status, confirmPage = fin.post("/finance/close", page, url.Values{"month": {m}})
	if status != http.StatusOK || closed() || e.auditActions("month.close", "month:"+m) != 0 {
		t.Fatalf("close without confirm: %d, closed %v; want the question and nothing done", status, closed())
	}
	confirmForm(t, "close", confirmPage, "/finance/close", map[string]string{"month": m})
	if !regexp.MustCompile(`\d+ team\(s\), [0-9.]+ GPU-hours, [0-9.]+ USD`).MatchString(confirmPage) {
		t.Errorf("the close question gives no totals:\n%s", confirmPage)
	}
	if code := fin.postBadCSRF("/finance/close", url.Values{"month": {m}, "confirm": {"yes"}}); code != http.StatusForbidden || closed() {
		t.Errorf("close with a bad CSRF token: %d, closed %v", code, closed())
	}
	if status, page := fin.post("/finance/close", confirmPage, url.Values{"month": {m}, "confirm": {"yes"}}); status != http.StatusOK || !closed() ||
		!strings.Contains(page, `data-testid="closed"`) {
		t.Errorf("close confirmed: %d, closed %v", status, closed())
	}
	if status, _ := fin.post("/finance/close", page, url.Values{"month": {m}}); status != http.StatusConflict {
		t.Errorf("asking to close a closed month: %d, want 409", status)
	}
	var cb web.ChargebackJSON
	e.getJSON("/api/v1/chargeback?month="+m+"&lines=false", demo.Finance, &cb)
	code, _, body = e.api("GET", "/api/v1/audit?kind=month", demo.Admin, "")
	var audit struct {
		Entries []web.AuditEntryJSON `json:"entries"`
	}
	json.Unmarshal(body, &audit) //nolint:errcheck
	entries := audit.Entries
	if code != 200 || len(entries) != 1 {
		t.Fatalf("audit of month closes: %d %s", code, body)
	}
	a := entries[0]
	var after map[string]any
	json.Unmarshal(a.After, &after) //nolint:errcheck
	if a.Action != "month.close" || a.Object != "month:"+m || a.Actor != demo.PersonaEmail[demo.Finance] || after["amount"] != cb.Total.Amount ||
		after["gpu_hours"] != cb.Total.GPUHours || !strings.Contains(a.Note, "closed "+m) || !strings.Contains(a.Note, cb.Total.Amount+" "+cb.Currency) {
		t.Errorf("audit entry %+v (after %s), want finance's close of %s with total %s %s", a, a.After, m, cb.Total.Amount, cb.Currency)
	}
	// The API closes in one step (it is explicit) and is audited too.
	if code, _, b := e.api("POST", "/api/v1/chargeback/2020-01/close", demo.Admin, ""); code != 200 || e.auditActions("month.close", "month:2020-01") != 1 {
		t.Errorf("API close: %d %s, audited %d", code, b, e.auditActions("month.close", "month:2020-01"))
	}
}

// TestJobsListAndPageTellTheTruth: the list is newest first by submission
// time (not id), paging included; an ended job does not say it "will run
// as preemptible"; one budget banner per team.
func TestJobsListAndPageTellTheTruth(t *testing.T) {
	e := boot(t)
	ctx := context.Background()
	// A budget this job cannot fit: it is demoted at submission.
	if code, _, b := e.api("PUT", "/api/v1/teams/nlp", demo.Admin, `{"monthly_budget_gpu_hours":1,"note":"test"}`); code != 200 {
		t.Fatalf("lower the budget: %d %s", code, b)
	}
	var ids []int64
	for i := range 3 {
		code, _, body := e.api("POST", "/api/v1/jobs", demo.Engineer, fmt.Sprintf(`{"name":"order-%d","team":"nlp","tier":3,"gpus":1,"command":["x"],"time_limit":"4h"}`, i))
		var j web.JobJSON
		if err := json.Unmarshal(body, &j); code != 201 || err != nil {
			t.Fatalf("submit: %d %s", code, body)
		}
		if !strings.Contains(j.QuotaWarning, "this job will run as preemptible") || !j.Demoted {
			t.Fatalf("a job over budget: warning %q, demoted %v", j.QuotaWarning, j.Demoted)
		}
		ids = append(ids, j.ID)
	}
	// Submitted in the order 1, 2, 0 (ids 0 < 1 < 2).
	base := e.m.Store.Now().Add(-time.Hour)
	for i, at := range []time.Time{base.Add(3 * time.Minute), base.Add(time.Minute), base.Add(2 * time.Minute)} {
		e.exec(`UPDATE jobs SET submitted_at = $2 WHERE id = $1`, ids[i], at)
	}
	want := []int64{ids[0], ids[2], ids[1]} // newest submission first
	var page1, page2 web.JobList
	e.getJSON("/api/v1/jobs?q=order-&limit=2", demo.Engineer, &page1)
	if len(page1.Jobs) != 2 || page1.Jobs[0].ID != want[0] || page1.Jobs[1].ID != want[1] || page1.NextBefore == nil {
		t.Fatalf("page 1: %+v", page1)
	}
	e.getJSON(fmt.Sprintf("/api/v1/jobs?q=order-&limit=2&before=%d", *page1.NextBefore), demo.Engineer, &page2)
	if len(page2.Jobs) != 1 || page2.Jobs[0].ID != want[2] {
		t.Errorf("page 2: %+v", page2)
	}
	br := e.login(demo.Engineer)
	_, list := br.get("/jobs?q=order-")
	rows := regexp.MustCompile(`data-testid="job-row" data-job-id="(\d+)"`).FindAllStringSubmatch(list, -1)
	if len(rows) != 3 || rows[0][1] != fmt.Sprint(want[0]) || rows[1][1] != fmt.Sprint(want[1]) || rows[2][1] != fmt.Sprint(want[2]) {
		t.Errorf("jobs page order %v, want %v", rows, want)
	}

	// Pending, it will run as preemptible; cancelled, it never did.
	id := ids[0]
	_, page := br.get(fmt.Sprintf("/jobs/%d", id))
	if !strings.Contains(page, "this job will run as preemptible") {
		t.Errorf("a pending demoted job's warning is gone")
	}
	if status, _ := br.post(fmt.Sprintf("/jobs/%d/cancel", id), page, url.Values{"confirm": {"yes"}}); status != 200 {
		t.Fatalf("cancel: %d", status)
	}
	_, page = br.get(fmt.Sprintf("/jobs/%d", id))
	if strings.Contains(page, "will run as preemptible") || strings.Contains(page, "runs as preemptible") ||
		!strings.Contains(page, "At submission: ") || !strings.Contains(page, "so it was to run as preemptible (it never started)") ||
		!strings.Contains(page, "(demoted to preemptible at submission: over budget)") {
		t.Errorf("an ended job's page still speaks of the future:\n%s", page)
	}
	var got web.JobJSON
	e.getJSON(fmt.Sprintf("/api/v1/jobs/%d", id), demo.Engineer, &got)
	if strings.Contains(got.QuotaWarning, "will run") || !strings.HasPrefix(got.QuotaWarning, "At submission: ") {
		t.Errorf("API quota_warning of an ended job: %q", got.QuotaWarning)
	}

	// One banner per team: the 100 % alert says what the 80 % one does.
	month := store.MonthStart(e.m.Store.Now())
	for _, pct := range []int{80, 100} {
		if _, err := e.m.Store.FireBudgetAlert(ctx, &store.BudgetAlert{Team: "nlp", Month: month, ThresholdPct: pct, FiredAt: e.m.Store.Now(),
			UsedGPUSeconds: int64(pct) * 36, BudgetGPUHours: 1, Message: fmt.Sprintf("Team nlp has used %d %% of its monthly GPU budget (test).", pct)}); err != nil {
			t.Fatal(err)
		}
	}
	alerts, err := e.m.Store.BudgetAlerts(ctx, []string{"nlp"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	var top string
	for _, a := range alerts {
		if a.Month.Equal(month) && a.ThresholdPct == 100 {
			top = a.Message
		}
	}
	_, list = br.get("/jobs")
	banners := regexp.MustCompile(`data-testid="budget-alert">([^<]*)<`).FindAllStringSubmatch(list, -1)
	if len(banners) != 1 || !strings.Contains(htmlUnescape(banners[0][1]), top) {
		t.Errorf("budget banners %v, want only the 100 %% one (%q)", banners, top)
	}
}

func htmlUnescape(s string) string {
	return strings.NewReplacer("&#34;", `"`, "&#39;", "'", "&lt;", "<", "&gt;", ">", "&amp;", "&").Replace(s)
}
