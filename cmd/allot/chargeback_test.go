package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/web"
)

func micros(t *testing.T, s string) int64 {
	t.Helper()
	m, err := allot.ParseMoney(s, "USD")
	if err != nil {
		t.Fatalf("amount %q: %v", s, err)
	}
	return m.Micros
}

// TestChargebackAddsUp: the sum of lines = the team totals = the total =
// the CSV, to the cent; access and bad months are refused clearly.
func TestChargebackAddsUp(t *testing.T) {
	e := boot(t)
	ctx := context.Background()
	// A job name a spreadsheet would run as a formula.
	if _, err := e.m.Pool.Exec(ctx, `UPDATE jobs SET name = '=HYPERLINK("http://x")' WHERE id = (SELECT min(job_id) FROM allocations)`); err != nil {
		t.Fatal(err)
	}
	// Last month: complete at every instant of this one (the demo's
	// oldest job, renamed above, ran then).
	if _, err := jobs.Rollup(ctx, e.m.Store, clock.Now()); err != nil {
		t.Fatal(err)
	}
	current := billing.Month(clock.Now()).String()
	month := billing.Month(clock.Now()).Prev().String()
	code, _, b := e.api("GET", "/api/v1/chargeback?month="+month, demo.Finance, "")
	if code != 200 {
		t.Fatalf("chargeback: %d %s", code, b)
	}
	var cb web.ChargebackJSON
	if err := json.Unmarshal(b, &cb); err != nil {
		t.Fatal(err)
	}
	total := micros(t, cb.Total.Amount)
	var teams, lines, tiers, users int64
	for _, g := range cb.Teams {
		teams += micros(t, g.Amount)
	}
	for _, g := range cb.ByTier {
		tiers += micros(t, g.Amount)
	}
	for _, g := range cb.ByUser {
		users += micros(t, g.Amount)
	}
	for _, l := range cb.Lines {
		lines += micros(t, l.Amount)
	}
	if total <= 0 || teams != total || lines != total || tiers != total || users != total || len(cb.Teams) != 3 {
		t.Errorf("total %d, teams %d, lines %d, tiers %d, users %d (%d teams)", total, teams, lines, tiers, users, len(cb.Teams))
	}
	// The CSV, streamed, says the same.
	req, _ := http.NewRequest("GET", e.url+"/api/v1/chargeback.csv?month="+month, nil)
	req.Header.Set("Authorization", "Bearer "+e.tokens[demo.Finance])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(resp.Body).ReadAll()
	resp.Body.Close()
	if err != nil || resp.Header.Get("Content-Type") != "text/csv; charset=utf-8" {
		t.Fatalf("CSV: %v %s", err, resp.Header.Get("Content-Type"))
	}
	if strings.Join(rows[0], ",") != strings.Join(web.CSVColumns, ",") {
		t.Errorf("CSV header %q", rows[0])
	}
	var csvSum int64
	formulas := 0
	for _, r := range rows[1:] {
		csvSum += micros(t, r[14])
		if strings.HasPrefix(r[4], "=") {
			t.Errorf("job name %q would run as a formula", r[4])
		}
		if r[4] == `'=HYPERLINK("http://x")` {
			formulas++
		}
	}
	if formulas == 0 {
		t.Error("the job named like a formula is not in the CSV, neutralised")
	}
	if csvSum != total || len(rows)-1 != len(cb.Lines) {
		t.Errorf("CSV: %d rows summing to %d; API: %d lines summing to %d", len(rows)-1, csvSum, len(cb.Lines), total)
	}
	// A lead sees only the teams they lead.
	code, _, b = e.api("GET", "/api/v1/chargeback?month="+month, demo.Lead, "")
	var mine web.ChargebackJSON
	json.Unmarshal(b, &mine) //nolint:errcheck
	if code != 200 || len(mine.Teams) != 1 || mine.Teams[0].Team != "nlp" {
		t.Errorf("lead's chargeback: %d %+v", code, mine.Teams)
	}
	future := billing.Month(clock.Now()).Next().Next().String()
	for _, tt := range []struct {
		name, path, persona string
		status              int
		detail              string
	}{
		{"engineer export", "/api/v1/chargeback.csv?month=" + month, demo.Engineer, 403, "finance, admins and team leads"},
		{"engineer JSON", "/api/v1/chargeback?month=" + month, demo.Engineer, 403, "finance, admins and team leads"},
		{"lead of another team", "/api/v1/chargeback?team=fraud", demo.Lead, 403, `you do not lead team "fraud"`},
		{"month 13", "/api/v1/chargeback?month=2026-13", demo.Finance, 422, "invalid input"},
		{"garbage month", "/api/v1/chargeback.csv?month=last", demo.Finance, 422, "invalid input"},
		{"future month", "/api/v1/chargeback?month=" + future, demo.Finance, 422, "invalid input"},
		{"month without data", "/api/v1/chargeback?month=2020-01", demo.Finance, 404, "no charges for 2020-01"},
		{"month without data, CSV", "/api/v1/chargeback.csv?month=2020-01", demo.Finance, 404, "no charges for 2020-01"},
		{"close the current month", "/api/v1/chargeback/" + current + "/close", demo.Finance, 422, "invalid input"},
		{"engineer closes", "/api/v1/chargeback/2020-01/close", demo.Engineer, 403, "only finance and admins"},
	} {
		method := "GET"
		if strings.HasSuffix(tt.path, "/close") {
			method = "POST"
		}
		code, hdr, b := e.api(method, tt.path, tt.persona, "")
		var p web.Problem
		json.Unmarshal(b, &p) //nolint:errcheck
		if code != tt.status || !strings.Contains(p.Detail, tt.detail) || hdr.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s, want %d %q", tt.name, code, b, tt.status, tt.detail)
		}
	}
	// The portal page shows the same total and offers the CSV; any other
	// month's page points at last month while it is open.
	br := e.login(demo.Finance)
	if _, page := br.get("/finance?month=" + current); !strings.Contains(page, `data-testid="open-month"`) || !strings.Contains(page, "/finance?month="+month) {
		t.Errorf("this month's finance page does not point at last month, open")
	}
	status, page := br.get("/finance?month=" + month)
	if status != 200 || !strings.Contains(page, "<strong>"+cb.Total.Amount+"</strong>") || !strings.Contains(page, `data-testid="export"`) {
		t.Errorf("finance page: %d, total %s missing or no export link", status, cb.Total.Amount)
	}
	var jobsSum int64
	for _, g := range cb.ByJob {
		jobsSum += micros(t, g.Amount)
	}
	if jobsSum != total {
		t.Errorf("by job %d != total %d", jobsSum, total)
	}
	if _, page := br.get("/finance?month=" + month + "&team=nlp"); !strings.Contains(page, `data-testid="finance-jobs"`) {
		t.Errorf("no per-job drill-down for a team")
	}
	if status, _ := e.login(demo.Engineer).get("/finance"); status != 403 {
		t.Errorf("engineer on the finance page: %d, want 403", status)
	}
	_, page = br.get("/finance?month=2020-02")
	if status, page := br.post("/finance/close", page, map[string][]string{"month": {"2020-02"}, "confirm": {"yes"}}); status != 200 || !strings.Contains(page, `data-testid="closed"`) {
		t.Errorf("closing from the page: %d", status)
	}
	// Closing a past month works once.
	if code, _, b := e.api("POST", "/api/v1/chargeback/2020-01/close", demo.Finance, ""); code != 200 {
		t.Errorf("close: %d %s", code, b)
	}
	if code, _, _ := e.api("POST", "/api/v1/chargeback/2020-01/close", demo.Admin, ""); code != 409 {
		t.Errorf("second close: %d, want 409", code)
	}
}

func TestBudgetAlertsInAPIAndPortal(t *testing.T) {
	e := bootStory(t)
	if _, err := jobs.BudgetCheck(context.Background(), e.m.Store, nil); err != nil {
		t.Fatal(err)
	}
	code, _, b := e.api("GET", "/api/v1/alerts", demo.Engineer, "")
	var out struct{ Alerts []web.AlertJSON }
	json.Unmarshal(b, &out) //nolint:errcheck
	// This month's two, newest first, then last month's history.
	this := billing.Month(e.m.Store.Now()).String()
	if code != 200 || len(out.Alerts) != 4 || out.Alerts[0].Team != "nlp" || out.Alerts[1].Team != "nlp" ||
		out.Alerts[0].Month != this || out.Alerts[1].Month != this || out.Alerts[2].Month == this {
		t.Errorf("engineer's alerts: %d %+v", code, out.Alerts)
	}
	// The jobs page shows one banner for the team, the higher threshold's
	// (it says what the 80 % one does, and more), not two near-identical ones.
	if _, page := e.login(demo.Engineer).get("/jobs"); strings.Count(page, `data-testid="budget-alert"`) != 1 || !strings.Contains(page, "now run as preemptible") {
		t.Errorf("the jobs page does not show the team's one, 100 %%, alert")
	}
	for _, tt := range []struct {
		persona, body string
		status        int
	}{
		{demo.Engineer, `{"url":"https://hooks.example.com/x"}`, 403},
		{demo.Lead, `{"url":"ftp://nope"}`, 422},
		{demo.Lead, `{"url":"https://hooks.example.com/x","extra":1}`, 422},
		{demo.Lead, `{"url":"https://hooks.example.com/x"}`, 200},
	} {
		if code, _, b := e.api("PUT", "/api/v1/teams/nlp/webhook", tt.persona, tt.body); code != tt.status {
			t.Errorf("%s sets webhook %s: %d %s, want %d", tt.persona, tt.body, code, b, tt.status)
		}
	}
}

func TestTeamBudgetDashboard(t *testing.T) {
	e := bootStory(t)
	code, _, b := e.api("GET", "/api/v1/teams/nlp/budget", demo.Lead, "")
	var bj web.BudgetJSON
	if err := json.Unmarshal(b, &bj); err != nil || code != 200 {
		t.Fatalf("budget: %d %s", code, b)
	}
	var byType int64
	for _, v := range bj.ByJobType {
		byType += micros(t, v)
	}
	var byUser int64
	for _, u := range bj.ByUser {
		byUser += micros(t, u.GPUHours)
	}
	used := micros(t, bj.UsedGPUHours)
	if bj.UsedPct < 100 || byType != used || byUser != used || !strings.HasPrefix(bj.Forecast.Summary, "Over budget since") || bj.Forecast.ReachesBudgetOn == nil {
		t.Errorf("nlp budget: used %s (%d %%), by type %d, by user %d, forecast %q", bj.UsedGPUHours, bj.UsedPct, byType, byUser, bj.Forecast.Summary)
	}
	// Last month, complete: the demo's whole story (104 %).
	if l := bj.LastMonth; l == nil || l.UsedPct != 104 || l.Month != billing.Month(e.m.Store.Now()).Prev().String() {
		t.Errorf("nlp last month: %+v, want 104 %% of the month before", l)
	}
	code, _, b = e.api("GET", "/api/v1/teams/fraud/budget", demo.Finance, "")
	json.Unmarshal(b, &bj) //nolint:errcheck
	if code != 200 || bj.UsedPct != 35 || !strings.HasPrefix(bj.Forecast.Summary, "At this rate") {
		t.Errorf("fraud budget: %d %d %% %q", code, bj.UsedPct, bj.Forecast.Summary)
	}
	if code, _, _ := e.api("GET", "/api/v1/teams/fraud/budget", demo.Engineer, ""); code != 403 {
		t.Errorf("engineer of nlp reading fraud's budget: %d, want 403", code)
	}
	// This month's 80 % and 100 % alerts: one banner, the 100 % one.
	if _, err := jobs.BudgetCheck(context.Background(), e.m.Store, nil); err != nil {
		t.Fatal(err)
	}
	status, page := e.login(demo.Lead).get("/teams/nlp")
	if status != 200 || !strings.Contains(page, `data-testid="burndown"`) || !strings.Contains(page, "Over budget since") ||
		!strings.Contains(page, `data-testid="last-month"`) {
		t.Errorf("team page: %d", status)
	}
	if n := strings.Count(page, `data-testid="budget-alert"`); n != 1 || !strings.Contains(page, "run as preemptible until the month ends") {
		t.Errorf("team page: %d budget banners, want one, the 100 %% alert's", n)
	}
}

func TestRightSizingAPI(t *testing.T) {
	e := boot(t)
	for _, tt := range []struct {
		path, persona string
		status        int
	}{
		{"/api/v1/rightsizing", demo.Finance, 200},
		{"/api/v1/rightsizing?period=month", demo.Lead, 200},
		{"/api/v1/rightsizing", demo.Engineer, 200}, // their own jobs
		{"/api/v1/rightsizing?team=fraud", demo.Engineer, 403},
		{"/api/v1/rightsizing?from=yesterday", demo.Finance, 422},
		{"/api/v1/rightsizing?from=2026-01-01&to=2025-01-01", demo.Finance, 422},
		{"/api/v1/rightsizing?from=2025-01-01&to=2025-12-31", demo.Finance, 422},
		{"/api/v1/rightsizing.csv", demo.Finance, 200},
	} {
		if code, _, b := e.api("GET", tt.path, tt.persona, ""); code != tt.status {
			t.Errorf("%s as %s: %d %.200s, want %d", tt.path, tt.persona, code, b, tt.status)
		}
	}
	if status, page := e.login(demo.Lead).get("/rightsizing"); status != 200 || !strings.Contains(page, "Right-sizing") {
		t.Errorf("right-sizing page: %d", status)
	}
}

func TestMoreBadInput(t *testing.T) {
	e := boot(t)
	before := e.jobCount()
	for _, tt := range []struct {
		method, path, persona, body string
		status                      int
		field                       string
	}{
		{"POST", "/api/v1/jobs", demo.Engineer, `{"team":"nl\u0000p","tier":3,"gpus":1,"time_limit":"1h","command":["true"]}`, 422, "team"},
		{"POST", "/api/v1/jobs", demo.Engineer, `{"team":"nlp","tier":3,"gpus":1,"time_limit_s":-9000000000000000,"command":["true"]}`, 422, "time_limit_s"},
		{"GET", "/api/v1/jobs?team=a%00b", demo.Engineer, ``, 422, ""},
		{"PUT", "/api/v1/teams/nlp/webhook", demo.Lead, `{"url":"http://127.0.0.1:9/x"}`, 422, "url"},
		{"PUT", "/api/v1/teams/nlp/webhook", demo.Lead, `{"url":"http://169.254.169.254/latest"}`, 422, "url"},
		{"PUT", "/api/v1/teams/nlp/webhook", demo.Lead, `{"url":"http://localhost/x"}`, 422, "url"},
	} {
		code, _, b := e.api(tt.method, tt.path, tt.persona, tt.body)
		var p web.Problem
		json.Unmarshal(b, &p) //nolint:errcheck
		if code != tt.status || (tt.field != "" && p.Errors[tt.field] == "") {
			t.Errorf("%s %s %s: %d %s, want %d with a %q error", tt.method, tt.path, tt.body, code, b, tt.status, tt.field)
		}
	}
	if e.jobCount() != before {
		t.Error("bad input wrote a job")
	}
}
