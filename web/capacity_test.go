package web_test

// Capacity and the finance page's charts (issue 17): a real PostgreSQL and
// the real HTTP server. The node history is written as migration 0025's
// triggers write it, at chosen instants; the charge lines as the rollup
// writes them.

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/allotlabs/allot/web"
	"github.com/jackc/pgx/v5/pgxpool"
)

type capRig struct {
	t       *testing.T
	ctx     context.Context
	pool    *pgxpool.Pool
	st      *store.Store
	url     string
	job     int64
	tokens  map[string]string // by role: finance, admin, lead, engineer
	session map[string]string
}

func ts(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func newCapRig(t *testing.T, now time.Time) *capRig {
	t.Helper()
	t.Parallel()
	r := &capRig{t: t, ctx: context.Background(), tokens: map[string]string{}, session: map[string]string{}}
	r.pool = storetest.Pool(t)
	r.st = store.New(r.pool)
	r.st.Now = func() time.Time { return now }
	r.exec(`INSERT INTO gpu_types (name, memory_gb) VALUES ('H100', 80), ('A100', 40)`)
	r.exec(`INSERT INTO gpu_rates (gpu_type, rate_micros, currency, effective_from) VALUES ('H100', 4000000, 'EUR', '1970-01-01'), ('A100', 2000000, 'EUR', '1970-01-01')`)
	r.exec(`INSERT INTO teams (slug, name, cost_center) VALUES ('nlp', 'NLP', 'CC-1'), ('cv', 'Vision', 'CC-2')`)
	for _, u := range []struct {
		role           string
		admin, finance bool
	}{{"finance", false, true}, {"admin", true, false}, {"lead", false, false}, {"engineer", false, false}} {
		var id int64
		if err := r.pool.QueryRow(r.ctx, `INSERT INTO users (oidc_subject, email, name, is_admin, is_finance) VALUES ($1, $1 || '@example.com', $1, $2, $3) RETURNING id`,
			u.role, u.admin, u.finance).Scan(&id); err != nil {
			t.Fatal(err)
		}
		switch u.role {
		case "lead":
			r.exec(`INSERT INTO memberships (user_id, team, role) VALUES ($1, 'nlp', 'lead')`, id)
		case "engineer":
			r.exec(`INSERT INTO memberships (user_id, team, role) VALUES ($1, 'nlp', 'member')`, id)
		}
		tok, _, err := r.st.CreateAPIToken(r.ctx, id, "test")
		if err != nil {
			t.Fatal(err)
		}
		r.tokens[u.role] = tok
		sess, err := r.st.CreateSession(r.ctx, id, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		r.session[u.role] = sess
	}
	if err := r.pool.QueryRow(r.ctx, `INSERT INTO jobs (name, team, user_id, tier, gpus, time_limit_s, command, submitted_at)
		SELECT 'j', 'nlp', id, '3', 1, 3600, '{true}', '2000-01-01' FROM users WHERE oidc_subject = 'engineer' RETURNING id`).Scan(&r.job); err != nil {
		t.Fatal(err)
	}
	srv := web.New(web.Config{Store: r.st, Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	r.url = hs.URL
	return r
}

func (r *capRig) exec(q string, args ...any) {
	r.t.Helper()
	if _, err := r.pool.Exec(r.ctx, q, args...); err != nil {
		r.t.Fatalf("%s: %v", q, err)
	}
}

// node gives a node exactly the history states ([at, state] pairs).
func (r *capRig) node(name, gpuType string, gpus int, states ...string) {
	r.t.Helper()
	r.exec(`INSERT INTO nodes (name, gpu_type, gpu_count, site, state, registered_at) VALUES ($1, $2, $3, 'onprem', 'up', '2000-01-01')`, name, gpuType, gpus)
	r.exec(`DELETE FROM node_state_history WHERE node = $1`, name)
	for i := 0; i+1 < len(states); i += 2 {
		r.exec(`INSERT INTO node_state_history (node, at, state, gpu_type, gpus, site, registered) VALUES ($1, $2, $3, $4, $5, 'onprem', true)`,
			name, ts(states[i]), states[i+1], gpuType, gpus)
	}
}

func (r *capRig) alloc(node string, gpu int, from, to string) {
	r.t.Helper()
	r.exec(`INSERT INTO allocations (job_id, node, gpu_index, started_at, released_at) VALUES ($1, $2, $3, $4, $5)`, r.job, node, gpu, ts(from), ts(to))
}

// charge adds a charge line of amount micros.
func (r *capRig) charge(key, month, team, gpuType, tier string, micros int64) {
	r.t.Helper()
	h := ts(month + "-01T00:00:00Z")
	r.exec(`INSERT INTO charge_lines (line_key, month, kind, usage_hour, job_id, segment, team, cost_center, user_email, tier, gpu_type,
		rate_from, multiplier_from, from_at, to_at, gpu_seconds, rate_micros, multiplier_bp, amount_micros, currency)
		VALUES ($1, $8::date, 'charge', $2::timestamptz, $3, 1, $4, 'CC', 'engineer@example.com', $5, $6, '1970-01-01', '1970-01-01',
			$2::timestamptz, $2::timestamptz + interval '1 hour', 3600, $7, 10000, $7, 'EUR')`, key, h, r.job, team, tier, gpuType, micros, month+"-01")
}

func (r *capRig) do(method, path, role, body string) (int, string, http.Header) {
	r.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, r.url+path, rd)
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+r.tokens[role])
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	var compact bytes.Buffer
	if json.Compact(&compact, b) == nil {
		b = compact.Bytes()
	}
	return res.StatusCode, string(b), res.Header
}

func (r *capRig) page(path, role string) (int, *goquery.Document) {
	r.t.Helper()
	req, err := http.NewRequest("GET", r.url+path, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	req.AddCookie(&http.Cookie{Name: "allot_session", Value: r.session[role]})
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer res.Body.Close()
	d, err := goquery.NewDocumentFromReader(res.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	return res.StatusCode, d
}

// capacityRig: h1 (8 H100) registered Feb 10 2028, draining then drained
// for 10 hours on Feb 12 with a job still on it; a2 (2 A100) registered
// across January's end and down from Feb 20; a leap February.
func capacityRig(t *testing.T) *capRig {
	r := newCapRig(t, ts("2028-03-05T12:00:00Z"))
	r.node("h1", "H100", 8, "2028-02-10T00:00:00Z", "up", "2028-02-12T06:00:00Z", "draining", "2028-02-12T07:00:00Z", "drained", "2028-02-12T16:00:00Z", "up")
	r.alloc("h1", 0, "2028-02-11T00:00:00Z", "2028-02-11T05:00:01Z")
	r.alloc("h1", 2, "2028-02-12T05:00:00Z", "2028-02-12T07:00:00Z")
	r.alloc("h1", 3, "2028-02-28T23:00:00Z", "2028-03-01T02:00:00Z")
	r.node("a2", "A100", 2, "2028-01-31T20:00:00Z", "up", "2028-02-20T00:00:00Z", "down")
	r.alloc("a2", 0, "2028-01-31T22:00:00Z", "2028-02-01T03:00:00Z")
	return r
}

func TestCapacityAPI(t *testing.T) {
	r := capacityRig(t)
	// The cost per GPU-hour of owned H100s, set by an admin (audited).
	code, body, _ := r.do("PUT", "/api/v1/gpu-types/H100", "admin", `{"capacity_cost": "2.50", "note": "depreciation"}`)
	if code != http.StatusOK || !strings.Contains(body, `"capacity_cost":"2.50"`) {
		t.Fatalf("set capacity cost: %d %s", code, body)
	}
	var audited int
	if err := r.pool.QueryRow(r.ctx, `SELECT count(*) FROM audit_log WHERE object = 'gpu_type:H100' AND after->>'capacity_cost' = '2.50' AND actor = 'admin@example.com'`).Scan(&audited); err != nil || audited != 1 {
		t.Errorf("capacity cost change audited %d times (%v)", audited, err)
	}
	for _, bad := range []string{`"-1"`, `"abc"`, `"2.5 USD"`, `"1.1234567"`, `"2000000"`} {
		code, body, _ := r.do("PUT", "/api/v1/gpu-types/H100", "admin", `{"capacity_cost": `+bad+`}`)
		if code != http.StatusUnprocessableEntity || !strings.Contains(body, "capacity_cost") {
			t.Errorf("capacity cost %s: %d %s, want 422 on capacity_cost", bad, code, body)
		}
	}
	code, body, _ = r.do("POST", "/api/v1/gpu-types", "admin", `{"name": "B200", "memory_gb": 192, "hourly_rate": "6", "capacity_cost": "3"}`)
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "capacity_cost") {
		t.Errorf("create with a capacity cost: %d %s, want 422 on capacity_cost", code, body)
	}
	if code, _, _ := r.do("PUT", "/api/v1/gpu-types/H100", "finance", `{"capacity_cost": "1"}`); code != http.StatusForbidden {
		t.Errorf("finance sets a capacity cost: %d, want 403", code)
	}
	code, body, _ = r.do("GET", "/api/v1/gpu-types", "admin", "")
	if code != http.StatusOK || !strings.Contains(body, `"capacity_cost":"2.50"`) || strings.Contains(body, "B200") {
		t.Errorf("bad input changed the cost or made a type: %s", body)
	}
	// "" clears the cost; setting it again is one more audited change.
	if code, body, _ := r.do("PUT", "/api/v1/gpu-types/H100", "admin", `{"capacity_cost": ""}`); code != http.StatusOK || !strings.Contains(body, `"capacity_cost":""`) {
		t.Errorf("clear capacity cost: %d %s", code, body)
	}
	if code, body, _ := r.do("PUT", "/api/v1/gpu-types/H100", "admin", `{"capacity_cost": "2.5"}`); code != http.StatusOK || !strings.Contains(body, `"capacity_cost":"2.50"`) {
		t.Errorf("set capacity cost again: %d %s", code, body)
	}

	code, body, _ = r.do("GET", "/api/v1/capacity?month=2028-02", "finance", "")
	if code != http.StatusOK {
		t.Fatalf("capacity: %d %s", code, body)
	}
	var cp web.CapacityJSON
	if err := json.Unmarshal([]byte(body), &cp); err != nil {
		t.Fatal(err)
	}
	const hour = 3600
	alloc := int64(32*hour + 1) // 5 h 1 s + 2 h + 25 h (leap day)
	want := map[string][4]int64{
		"H100": {3840 * hour, alloc, 3840*hour - 80*hour - (alloc - hour), 80*hour - hour},
		"A100": {1392 * hour, 3 * hour, 912*hour - 3*hour, 480 * hour},
	}
	if len(cp.Rows) != 2 || cp.Currency != "EUR" || cp.Month != "2028-02" || !cp.To.Equal(ts("2028-03-01T00:00:00Z")) {
		t.Fatalf("capacity: %s", body)
	}
	for _, row := range append(cp.Rows, cp.Total) {
		if row.RegisteredGPUSeconds != row.AllocatedGPUSeconds+row.IdleGPUSeconds+row.DrainedDownGPUSeconds {
			t.Errorf("%s: registered ≠ allocated + idle + drained/down: %+v", row.GPUType, row)
		}
		if row.GPUType == "" {
			continue
		}
		got := [4]int64{row.RegisteredGPUSeconds, row.AllocatedGPUSeconds, row.IdleGPUSeconds, row.DrainedDownGPUSeconds}
		if got != want[row.GPUType] {
			t.Errorf("%s: %v, want %v", row.GPUType, got, want[row.GPUType])
		}
	}
	h := cp.Rows[1]
	if h.GPUType != "H100" || h.RegisteredGPUHours != "3840.0000" || h.AllocatedGPUHours != "32.0003" || h.CostPerGPUHour != "2.50" ||
		h.CapacityCost != "9600.00" || h.UnrecoveredCost != "9520.00" {
		t.Errorf("H100 row: %+v", h)
	}
	if a := cp.Rows[0]; a.GPUType != "A100" || a.CostPerGPUHour != "" || a.UnrecoveredCost != "0.00" {
		t.Errorf("A100 row (no cost set): %+v", a)
	}
	if cp.Total.UnrecoveredCost != "9520.00" || cp.Total.RegisteredGPUSeconds != (3840+1392)*hour || cp.AllocatedOutsideGPUHours != "0.0000" {
		t.Errorf("total: %+v outside %s", cp.Total, cp.AllocatedOutsideGPUHours)
	}

	code, body, hdr := r.do("GET", "/api/v1/capacity.csv?month=2028-02", "admin", "")
	if code != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "text/csv") {
		t.Fatalf("capacity CSV: %d %s", code, body)
	}
	recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 || strings.Join(recs[0], ",") != strings.Join(web.CapacityCSVColumns, ",") {
		t.Fatalf("CSV: %q", recs)
	}
	if got := strings.Join(recs[2], ","); got != "2028-02,H100,onprem,3840.0000,32.0003,3728.9997,79.0000,3807.9997,2.50,9600.00,9520.00,EUR" {
		t.Errorf("CSV H100 line: %s", got)
	}
	if got := strings.Join(recs[3], ","); !strings.HasPrefix(got, "2028-02,TOTAL,,5232.0000,35.0003,") || !strings.HasSuffix(got, ",9600.00,9520.00,EUR") {
		t.Errorf("CSV total line: %s", got)
	}

	// Bad months: 422 with the field, for JSON and CSV alike.
	for _, m := range []string{"2028-13", "28-02", "2028-2", "abc", "2028-04", "2028-02-01"} {
		for _, p := range []string{"/api/v1/capacity", "/api/v1/capacity.csv"} {
			code, body, _ := r.do("GET", p+"?month="+m, "finance", "")
			if code != http.StatusUnprocessableEntity || !strings.Contains(body, "month") {
				t.Errorf("%s?month=%s: %d %s, want 422 on month", p, m, code, body)
			}
		}
	}
	// Leads and engineers do not see the cluster's cost.
	for _, role := range []string{"lead", "engineer"} {
		if code, _, _ := r.do("GET", "/api/v1/capacity?month=2028-02", role, ""); code != http.StatusForbidden {
			t.Errorf("%s reads capacity: %d, want 403", role, code)
		}
		if code, _, _ := r.do("GET", "/api/v1/capacity.csv?month=2028-02", role, ""); code != http.StatusForbidden {
			t.Errorf("%s reads the capacity CSV: %d, want 403", role, code)
		}
	}
	// This month runs up to now.
	code, body, _ = r.do("GET", "/api/v1/capacity", "finance", "")
	if code != http.StatusOK || !strings.Contains(body, `"month":"2028-03"`) || !strings.Contains(body, `"to":"2028-03-05T12:00:00Z"`) {
		t.Errorf("this month: %d %s", code, body)
	}
}

// TestFinancePageCharts: the finance page draws the capacity chart and
// the cost charts from the same figures as the API, links the FOCUS
// export and the date-range export, and hides capacity from leads.
func TestFinancePageCharts(t *testing.T) {
	r := capacityRig(t)
	r.exec(`UPDATE gpu_types SET capacity_cost_micros = 2500000 WHERE name = 'H100'`)
	r.charge("a", "2028-02", "nlp", "H100", "3", 100_000_000)
	r.charge("b", "2028-02", "cv", "A100", "preemptible", 30_000_000)
	r.charge("c", "2028-01", "nlp", "H100", "3", 50_000_000)
	r.charge("d", "2027-02", "cv", "A100", "3", 7_000_000) // 13 months back: not in the chart

	code, d := r.page("/finance?month=2028-02", "finance")
	if code != http.StatusOK {
		t.Fatalf("finance page: %d %s", code, d.Text())
	}
	tid := func(id string) *goquery.Selection { return d.Find(`[data-testid="` + id + `"]`) }
	if href, _ := tid("export-focus").Attr("href"); href != "/api/v1/chargeback.csv?format=focus&month=2028-02" {
		t.Errorf("FOCUS link %q", href)
	}
	form := tid("export-range-form")
	if form.AttrOr("action", "") != "/api/v1/chargeback.csv" || form.AttrOr("method", "") != "get" ||
		form.Find(`input[name="from"]`).AttrOr("value", "") != "2028-02-01" || form.Find(`input[name="to"]`).AttrOr("value", "") != "2028-03-01" ||
		form.Find(`option[value="focus"]`).Length() != 1 {
		t.Errorf("date-range form: %s", goquery.NewDocumentFromNode(form.Nodes[0]).Text())
	}

	// Cost by team, 12 months (Mar 2027 … Feb 2028): nlp first (150.00).
	teams := tid("chart-cost-teams")
	if teams.Find("svg").Length() != 1 || teams.Find("polyline.s1").Length() != 1 || teams.Find("polyline.s2").Length() != 1 {
		t.Errorf("cost by team chart: %d svg, lines %d", teams.Find("svg").Length(), teams.Find("polyline").Length())
	}
	if pts := strings.Fields(teams.Find("polyline.s1").AttrOr("points", "")); len(pts) != 12 {
		t.Errorf("nlp line has %d points, want 12 months", len(pts))
	}
	if leg := teams.Find(".chart-legend").Text(); !strings.Contains(leg, "nlp") || !strings.Contains(leg, "cv") {
		t.Errorf("legend %q", leg)
	}
	var rows []string
	tid("cost-by-team-data").Find("tbody tr").Each(func(_ int, s *goquery.Selection) {
		var cells []string
		s.Find("td").Each(func(_ int, c *goquery.Selection) { cells = append(cells, c.Text()) })
		rows = append(rows, strings.Join(cells, " "))
	})
	if len(rows) != 2 || !strings.HasPrefix(rows[0], "nlp ") || !strings.HasSuffix(rows[0], " 50.00 100.00") || !strings.HasSuffix(rows[1], " 0.00 30.00") {
		t.Errorf("cost by team figures: %q", rows)
	}
	barValues := func(id string) []string {
		var out []string
		tid(id).Find(`[data-testid="bar-value"]`).Each(func(_ int, s *goquery.Selection) { out = append(out, s.Text()) })
		return out
	}
	if got := strings.Join(barValues("chart-cost-gpu-type"), "|"); got != "100.00 EUR|30.00 EUR" {
		t.Errorf("cost by GPU type bars: %s", got)
	}
	if got := tid("chart-cost-gpu-type").Find("text.chart-label").First().Text(); got != "H100" {
		t.Errorf("first GPU type bar %q", got)
	}
	if got := tid("chart-cost-tier").Find("text.chart-label").Text(); got != "tier 3tier preemptible" {
		t.Errorf("tier bars %q", got)
	}

	// Capacity: the chart's bars and the table, as the API says.
	cpc := tid("chart-capacity")
	if cpc.Find("svg").Length() != 1 || cpc.Find("rect.b-alloc").Length() != 2 || cpc.Find("rect.b-idle").Length() != 2 || cpc.Find("rect.b-out").Length() != 2 {
		t.Errorf("capacity chart: alloc %d idle %d out %d", cpc.Find("rect.b-alloc").Length(), cpc.Find("rect.b-idle").Length(), cpc.Find("rect.b-out").Length())
	}
	if got := strings.Join(barValues("chart-capacity"), "|"); got != "0.2 % of 1392.0000 GPU-h|0.8 % of 3840.0000 GPU-h" {
		t.Errorf("capacity bar values: %s", got)
	}
	if got := cpc.Find("rect.b-idle title").Last().Text(); got != "idle 3728.9997 GPU-h" {
		t.Errorf("H100 idle part: %q", got)
	}
	h := d.Find(`[data-testid="capacity-row"][data-gpu-type="H100"]`)
	cell := func(s *goquery.Selection, id string) string { return s.Find(`[data-testid="` + id + `"]`).Text() }
	if cell(h, "registered") != "3840.0000" || cell(h, "allocated") != "32.0003" || cell(h, "idle") != "3728.9997" ||
		cell(h, "drained-down") != "79.0000" || cell(h, "unrecovered") != "9520.00" {
		t.Errorf("H100 capacity row: %s", h.Text())
	}
	if tot := tid("capacity-total"); cell(tot, "registered") != "5232.0000" || cell(tot, "unrecovered") != "9520.00" {
		t.Errorf("capacity total: %s", tot.Text())
	}
	if href, _ := tid("capacity-csv").Attr("href"); href != "/api/v1/capacity.csv?month=2028-02" {
		t.Errorf("capacity CSV link %q", href)
	}

	// A lead sees their teams' charts, not the cluster's capacity.
	code, d = r.page("/finance?month=2028-02", "lead")
	if code != http.StatusOK {
		t.Fatalf("lead's finance page: %d", code)
	}
	if d.Find(`[data-testid="capacity"]`).Length() != 0 {
		t.Error("a lead sees the capacity section")
	}
	if got := d.Find(`[data-testid="chart-cost-teams"] .chart-legend`).Text(); strings.Contains(got, "cv") {
		t.Errorf("a lead of nlp sees cv's cost: %q", got)
	}
	if d.Find(`[data-testid="chart-cost-teams"] polyline`).Length() != 1 {
		t.Errorf("lead's chart lines: %d", d.Find(`[data-testid="chart-cost-teams"] polyline`).Length())
	}
}
