package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/web"
)

// focusColumn is one column of testdata/focus-1.2-columns.csv: the FOCUS
// 1.2 specification's columns (name, data type, feature level, allows
// nulls), then Allot's custom x_ columns.
type focusColumn struct {
	name, dataType, level string
	nullable              bool
}

func focusSpecColumns(t *testing.T) []focusColumn {
	t.Helper()
	f, err := os.Open("testdata/focus-1.2-columns.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []focusColumn
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := sc.Text(); line != "" && !strings.HasPrefix(line, "#") {
			p := strings.Split(line, ",")
			out = append(out, focusColumn{p[0], p[1], p[2], p[3] == "True"})
		}
	}
	if len(out) != 57+2 {
		t.Fatalf("testdata lists %d columns, want FOCUS 1.2's 57 and 2 of Allot's", len(out))
	}
	return out
}

// focusAllowed are the FOCUS 1.2 allowed values of the columns that have
// them (specification/columns/*.md), for the values Allot can emit.
var focusAllowed = map[string][]string{
	"ChargeCategory":     {"Usage", "Purchase", "Tax", "Credit", "Adjustment"},
	"ChargeClass":        {"Correction"},
	"ChargeFrequency":    {"One-Time", "Recurring", "Usage-Based"},
	"PricingCategory":    {"Standard", "Dynamic", "Committed", "Other"},
	"ServiceCategory":    {"AI and Machine Learning", "Analytics", "Business Applications", "Compute", "Databases", "Developer Tools", "Multicloud", "Identity", "Integration", "Internet of Things", "Management and Governance", "Media", "Migration", "Mobile", "Networking", "Security", "Storage", "Web", "Other"},
	"ServiceSubcategory": {"AI Platforms", "Bots", "Generative AI", "Machine Learning", "Natural Language Processing", "Other (AI and Machine Learning)"},
}

var (
	focusDecimal  = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)
	focusInteger  = regexp.MustCompile(`^-?[0-9]+$`)
	focusDateTime = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$`)
)

func dec(t *testing.T, s string) *big.Rat {
	t.Helper()
	r, ok := new(big.Rat).SetString(s)
	if !ok || !focusDecimal.MatchString(s) {
		t.Fatalf("%q is not a plain decimal", s)
	}
	return r
}

// csvGet downloads a CSV as persona and parses it.
func (e *env) csvGet(path, persona string) [][]string {
	e.t.Helper()
	req, _ := http.NewRequest("GET", e.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+e.tokens[persona])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/csv; charset=utf-8" {
		e.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	rows, err := csv.NewReader(resp.Body).ReadAll()
	if err != nil || len(rows) < 2 {
		e.t.Fatalf("GET %s: %v (%d rows)", path, err, len(rows))
	}
	return rows
}

// column sums column name of rows (a header and records) exactly.
func column(t *testing.T, rows [][]string, name string) *big.Rat {
	t.Helper()
	i := slices.Index(rows[0], name)
	if i < 0 {
		t.Fatalf("no column %s in %q", name, rows[0])
	}
	sum := new(big.Rat)
	for _, r := range rows[1:] {
		sum.Add(sum, dec(t, r[i]))
	}
	return sum
}

// TestFOCUSExport: a month with usage, a preemption credit and late usage
// for a closed month (adjustments) is the same total, to the cent, on the
// finance page, in the JSON, in Allot's CSV and as FOCUS BilledCost; the
// FOCUS header is the specification's column list and every value parses
// as its column's type; periods of ?from=&to= split a month or join two
// and add up; bad periods are refused. It runs at the test clock and at
// the first seconds of March in a leap year (February 2028's 29 days, and
// a period across the year end).
func TestFOCUSExport(t *testing.T) {
	t.Run("now", func(t *testing.T) { testFOCUSExport(t, nil) })
	t.Run("leap", func(t *testing.T) {
		testFOCUSExport(t, func() time.Time { return time.Date(2028, 3, 1, 0, 0, 5, 0, time.UTC) })
	})
}

func testFOCUSExport(t *testing.T, now func() time.Time) {
	var e *env
	if now == nil {
		e = boot(t)
	} else {
		e = bootMain(t, &Main{Config: Config{Worker: true, DevMode: true, Now: now}}).withTokens()
	}
	ctx := context.Background()
	st := e.m.Store
	cur := billing.Month(st.Now())
	prev, old := cur.Prev(), cur.Prev().Prev()
	felix, err := st.UserByEmail(ctx, "felix@example.com")
	if err != nil {
		t.Fatal(err)
	}
	spec := allot.JobSpec{Name: "old", Team: "fraud", Tier: allot.Tier3, GPUs: 2, GPUType: "A100-80GB", TimeLimit: 8 * time.Hour, Command: []string{"true"}}
	// Usage two months ago, billed and closed.
	start := old.Start().Add(9*24*time.Hour + 10*time.Hour)
	if err := st.RecordFinishedJob(ctx, &felix, spec, allot.JobCompleted, start, start, start.Add(2*time.Hour), "gpu01", []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.Rollup(ctx, st, st.Now()); err != nil {
		t.Fatal(err)
	}
	if code, _, b := e.api("POST", "/api/v1/chargeback/"+old.String()+"/close", demo.Finance, ""); code != 200 {
		t.Fatalf("closing %s: %d %s", old, code, b)
	}
	// Late usage for it, reported now: 2 h in the closed month (an
	// adjustment billed last month), 1 h in last month.
	late := old.End().Add(-2 * time.Hour)
	spec.Name = "late"
	if err := st.RecordFinishedJob(ctx, &felix, spec, allot.JobCompleted, late, late, late.Add(3*time.Hour), "gpu02", []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	// A preempted job last month: charged, and credited its last 30 min.
	spec.Name, spec.Checkpointable = "ckpt", true
	ck := prev.Start().Add(3*24*time.Hour + 10*time.Hour)
	if err := st.RecordFinishedJob(ctx, &felix, spec, allot.JobCompleted, ck, ck, ck.Add(2*time.Hour), "gpu03", []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Pool.Exec(ctx, `INSERT INTO leases (job_id, segment, node, rank, gpu_indices, env, state, offered_at, started_at, exited_at, stop_reason, last_checkpoint)
		SELECT id, 1, 'gpu03', 0, '{0,1}', '{}', 'exited', $1, $1, $2, 'preempted', $3 FROM jobs WHERE name = 'ckpt'`, ck, ck.Add(2*time.Hour), ck.Add(90*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Pool.Exec(ctx, `UPDATE jobs SET checkpointable = true WHERE name = 'ckpt'`); err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.Rollup(ctx, st, st.Now()); err != nil {
		t.Fatal(err)
	}

	// A job name a spreadsheet would run as a formula.
	if _, err := e.m.Pool.Exec(ctx, `UPDATE jobs SET name = '=ckpt;@x' WHERE name = 'ckpt'`); err != nil {
		t.Fatal(err)
	}

	month := prev.String()
	var cb web.ChargebackJSON
	e.getJSON("/api/v1/chargeback?month="+month, demo.Finance, &cb)
	total := dec(t, cb.Total.Amount)
	if micros(t, cb.Total.Credits) >= 0 || micros(t, cb.Total.Adjustments) <= 0 || total.Sign() <= 0 || cb.Closed {
		t.Fatalf("%s: total %s, credits %s, adjustments %s, closed %v: want usage, a credit and an adjustment, open", month, cb.Total.Amount, cb.Total.Credits, cb.Total.Adjustments, cb.Closed)
	}
	if cb.Month != month || cb.From != prev.Start().Format(time.RFC3339) || cb.To != prev.End().Format(time.RFC3339) {
		t.Errorf("statement of %s covers %q %s–%s", month, cb.Month, cb.From, cb.To)
	}
	cats := map[string]int{}
	for _, l := range cb.Lines {
		cats[l.ChargeCategory]++
		if strings.Contains(l.Tier, "(") {
			t.Errorf("tier %q is not a plain tier", l.Tier)
		}
	}
	if cats["usage"] == 0 || cats["credit"] == 0 || cats["usage_correction"] != 2 || len(cats) != 3 {
		t.Errorf("charge categories of the lines: %v", cats)
	}

	// Allot's CSV: its columns, charge_category, the plain tier, the total.
	own := e.csvGet("/api/v1/chargeback.csv?month="+month, demo.Finance)
	if strings.Join(own[0], ",") != strings.Join(web.CSVColumns, ",") {
		t.Errorf("CSV header %q", own[0])
	}
	ti, ci := slices.Index(own[0], "tier"), slices.Index(own[0], "charge_category")
	ownCats := map[string]int{}
	for _, r := range own[1:] {
		ownCats[r[ci]]++
		if !slices.Contains([]string{"1", "2", "3", "4", "preemptible"}, r[ti]) {
			t.Errorf("CSV tier %q", r[ti])
		}
	}
	if !maps(ownCats, cats) {
		t.Errorf("CSV charge categories %v, JSON %v", ownCats, cats)
	}
	if got := column(t, own, "amount"); got.Cmp(total) != 0 {
		t.Errorf("CSV total %s, statement %s", got.FloatString(2), cb.Total.Amount)
	}

	// The FOCUS export: the spec's columns, typed values, the same total.
	focus := e.csvGet("/api/v1/chargeback.csv?month="+month+"&format=focus", demo.Finance)
	cols := focusSpecColumns(t)
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = c.name
	}
	if strings.Join(focus[0], ",") != strings.Join(names, ",") || strings.Join(web.FOCUSColumns, ",") != strings.Join(names, ",") {
		t.Fatalf("FOCUS header\n%q\nwant the FOCUS 1.2 columns\n%q", focus[0], names)
	}
	checkFOCUSRows(t, cols, focus, prev)
	formulas := 0
	for _, r := range focus[1:] {
		name := r[slices.Index(web.FOCUSColumns, "ResourceName")]
		if strings.HasPrefix(name, "=") {
			t.Errorf("ResourceName %q would run as a formula", name)
		}
		if name == "'=ckpt;'@x" {
			formulas++
		}
	}
	if formulas == 0 {
		t.Error("the job named like a formula is not in the FOCUS export, neutralised")
	}
	if got := column(t, focus, "BilledCost"); got.Cmp(total) != 0 {
		t.Errorf("FOCUS BilledCost total %s, statement %s", got.FloatString(2), cb.Total.Amount)
	}
	for _, c := range []string{"EffectiveCost", "ListCost", "ContractedCost"} {
		if got := column(t, focus, c); got.Cmp(total) != 0 {
			t.Errorf("FOCUS %s total %s, statement %s", c, got.FloatString(2), cb.Total.Amount)
		}
	}
	if len(focus) != len(own) || len(own)-1 != len(cb.Lines) {
		t.Errorf("rows: FOCUS %d, CSV %d, JSON %d lines", len(focus)-1, len(own)-1, len(cb.Lines))
	}
	// The finance page shows the same total.
	if status, page := e.login(demo.Finance).get("/finance?month=" + month); status != 200 || !strings.Contains(page, "<strong>"+cb.Total.Amount+"</strong>") {
		t.Errorf("finance page: %d, total %s missing", status, cb.Total.Amount)
	}
	// A lead's FOCUS export is their team's.
	for _, r := range e.csvGet("/api/v1/chargeback.csv?format=focus&month="+month, demo.Lead)[1:] {
		if r[slices.Index(web.FOCUSColumns, "SubAccountId")] != "nlp" {
			t.Fatalf("lead's FOCUS row of team %q", r[slices.Index(web.FOCUSColumns, "SubAccountId")])
		}
	}

	// Periods: halves of the month at several cuts (the first hour holds
	// the month's adjustments) add up to it in every format.
	for _, cut := range []time.Time{prev.Start().Add(time.Hour), prev.Start().Add(15 * 24 * time.Hour), prev.End().Add(-time.Hour)} {
		first := url.Values{"from": {prev.Start().Format(time.DateOnly)}, "to": {cut.Format(time.RFC3339)}}
		// The second half as a date when it is one, else with an offset.
		secondFrom := cut.In(time.FixedZone("", 2*3600)).Format(time.RFC3339)
		if cut.Hour() == 0 {
			secondFrom = cut.Format(time.DateOnly)
		}
		second := url.Values{"from": {secondFrom}, "to": {prev.End().Format(time.RFC3339)}}
		sum, csvSum, focusSum := new(big.Rat), new(big.Rat), new(big.Rat)
		for _, q := range []url.Values{first, second} {
			// A part may have no charges (404), as a month may.
			if code, _, b := e.api("GET", "/api/v1/chargeback.csv?format=focus&"+q.Encode(), demo.Finance, ""); code == 404 {
				if c2, _, _ := e.api("GET", "/api/v1/chargeback?"+q.Encode(), demo.Finance, ""); c2 != 404 || !strings.Contains(string(b), "no charges from") {
					t.Errorf("%s: FOCUS %d %s, JSON %d", q.Encode(), code, b, c2)
				}
				continue
			}
			var part web.ChargebackJSON
			e.getJSON("/api/v1/chargeback?"+q.Encode(), demo.Finance, &part)
			if part.Month != "" {
				t.Errorf("a part of a month is a month: %q", part.Month)
			}
			sum.Add(sum, dec(t, part.Total.Amount))
			csvSum.Add(csvSum, column(t, e.csvGet("/api/v1/chargeback.csv?"+q.Encode(), demo.Finance), "amount"))
			fr := e.csvGet("/api/v1/chargeback.csv?format=focus&"+q.Encode(), demo.Finance)
			focusSum.Add(focusSum, column(t, fr, "BilledCost"))
			ps := slices.Index(fr[0], "ChargePeriodStart")
			cl := slices.Index(fr[0], "ChargeClass")
			for _, r := range fr[1:] {
				at, _ := time.Parse(time.RFC3339, r[ps])
				from, _ := time.Parse(time.RFC3339, part.From)
				to, _ := time.Parse(time.RFC3339, part.To)
				if r[cl] == "" && (at.Before(from) || !at.Before(to)) {
					t.Errorf("period %s–%s holds a line of %s", part.From, part.To, r[ps])
				}
			}
		}
		if sum.Cmp(total) != 0 || csvSum.Cmp(total) != 0 || focusSum.Cmp(total) != 0 {
			t.Errorf("cut at %v: halves add up to %s (JSON), %s (CSV), %s (FOCUS); the month is %s", cut, sum.FloatString(2), csvSum.FloatString(2), focusSum.FloatString(2), cb.Total.Amount)
		}
	}
	// Two months at once: the closed one and last month.
	var oldCB, both web.ChargebackJSON
	e.getJSON("/api/v1/chargeback?month="+old.String(), demo.Finance, &oldCB)
	e.getJSON("/api/v1/chargeback?from="+old.Start().Format(time.DateOnly)+"&to="+prev.End().Format(time.DateOnly), demo.Finance, &both)
	want := new(big.Rat).Add(dec(t, oldCB.Total.Amount), total)
	if !oldCB.Closed || both.Closed || dec(t, both.Total.Amount).Cmp(want) != 0 {
		t.Errorf("%s (closed %v) + %s = %s; the two months: %s (closed %v)", oldCB.Total.Amount, oldCB.Closed, cb.Total.Amount, want.FloatString(2), both.Total.Amount, both.Closed)
	}
	if got := column(t, e.csvGet("/api/v1/chargeback.csv?format=focus&from="+old.Start().Format(time.DateOnly)+"&to="+prev.End().Format(time.DateOnly), demo.Finance), "BilledCost"); got.Cmp(want) != 0 {
		t.Errorf("FOCUS over two months: %s, want %s", got.FloatString(2), want.FloatString(2))
	}
	// A period across the end of a year (at some clocks) that holds only
	// the closed month's usage.
	var across web.ChargebackJSON
	e.getJSON("/api/v1/chargeback?from="+old.Start().AddDate(0, 0, -10).Format(time.DateOnly)+"&to="+prev.Start().Format(time.RFC3339), demo.Finance, &across)
	if across.Total.Amount != oldCB.Total.Amount {
		t.Errorf("%s–%s: %s, want %s's %s", across.From, across.To, across.Total.Amount, old, oldCB.Total.Amount)
	}

	// Bad input: a problem naming the field, nothing else.
	future := cur.Next().Start().Format(time.DateOnly)
	for _, tt := range []struct{ name, query, field, detail string }{
		{"from = to", "from=" + month + "-01&to=" + month + "-01", "to", "must be after from"},
		{"from > to", "from=" + prev.End().Format(time.DateOnly) + "&to=" + month + "-01", "to", "must be after from"},
		{"future", "from=" + future + "&to=" + cur.Next().End().Format(time.DateOnly), "from", "in the future"},
		{"unparsable", "from=last-week&to=" + month + "-02", "from", "not an RFC 3339 time"},
		{"not on the hour", "from=" + url.QueryEscape(prev.Start().Add(30*time.Minute).Format(time.RFC3339)) + "&to=" + prev.End().Format(time.DateOnly), "from", "whole UTC hour"},
		{"month and a period", "month=" + month + "&from=" + month + "-01&to=" + month + "-02", "month", "not both"},
		{"from only", "from=" + month + "-01", "to", "is required"},
		{"too long", "from=" + old.Start().AddDate(-1, 0, 0).Format(time.DateOnly) + "&to=" + prev.End().Format(time.DateOnly), "to", "at most 366 days"},
		{"format", "month=" + month + "&format=xlsx", "format", `must be "allot"`},
	} {
		for _, path := range []string{"/api/v1/chargeback.csv?", "/api/v1/chargeback?"} {
			if tt.field == "format" && !strings.Contains(path, ".csv") {
				continue
			}
			code, hdr, b := e.api("GET", path+tt.query, demo.Finance, "")
			var p web.Problem
			json.Unmarshal(b, &p) //nolint:errcheck
			if code != 422 || hdr.Get("Content-Type") != "application/problem+json" || !strings.Contains(p.Errors[tt.field], tt.detail) {
				t.Errorf("%s (%s): %d %s, want 422 with %s: %q", tt.name, path, code, b, tt.field, tt.detail)
			}
		}
	}
	code, _, b := e.api("GET", "/api/v1/chargeback.csv?format=focus&from=2020-01-01&to=2020-01-15", demo.Finance, "")
	if code != 404 || !strings.Contains(string(b), "no charges from 2020-01-01T00:00:00Z to 2020-01-15T00:00:00Z") {
		t.Errorf("a period without charges: %d %s", code, b)
	}
}

func maps(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// checkFOCUSRows checks every value of a FOCUS export of month against its
// column's type, nullability and allowed values, and the FOCUS rules that
// tie columns together.
func checkFOCUSRows(t *testing.T, cols []focusColumn, rows [][]string, month billing.YearMonth) {
	t.Helper()
	idx := map[string]int{}
	for i, c := range cols {
		idx[c.name] = i
	}
	classes := map[string]int{}
	for n, r := range rows[1:] {
		if len(r) != len(cols) {
			t.Fatalf("row %d has %d values", n+1, len(r))
		}
		get := func(c string) string { return r[idx[c]] }
		for i, c := range cols {
			v := r[i]
			if v == "" {
				if !c.nullable {
					t.Errorf("row %d: %s (not nullable) is null", n+1, c.name)
				}
				continue
			}
			switch c.dataType {
			case "Decimal":
				dec(t, v)
			case "Integer":
				if !focusInteger.MatchString(v) {
					t.Errorf("row %d: %s = %q is not an integer", n+1, c.name, v)
				}
			case "Date/Time":
				if _, err := time.Parse(time.RFC3339, v); err != nil || !focusDateTime.MatchString(v) {
					t.Errorf("row %d: %s = %q is not YYYY-MM-DDTHH:mm:ssZ", n+1, c.name, v)
				}
			case "JSON":
				var obj map[string]any
				if err := json.Unmarshal([]byte(v), &obj); err != nil {
					t.Errorf("row %d: %s = %q is not a JSON object: %v", n+1, c.name, v, err)
				}
				for k, x := range obj {
					switch x.(type) {
					case map[string]any, []any:
						t.Errorf("row %d: %s key %s holds an object or array", n+1, c.name, k)
					}
				}
			case "String":
			default:
				t.Fatalf("column %s: unknown type %s", c.name, c.dataType)
			}
			if allowed, ok := focusAllowed[c.name]; ok && !slices.Contains(allowed, v) {
				t.Errorf("row %d: %s = %q is not an allowed value", n+1, c.name, v)
			}
		}
		cat, class := get("ChargeCategory"), get("ChargeClass")
		classes[cat+"/"+class]++
		if get("BillingPeriodStart") != month.Start().Format(time.RFC3339) || get("BillingPeriodEnd") != month.End().Format(time.RFC3339) {
			t.Errorf("row %d: billing period %s–%s", n+1, get("BillingPeriodStart"), get("BillingPeriodEnd"))
		}
		ps, _ := time.Parse(time.RFC3339, get("ChargePeriodStart"))
		pe, _ := time.Parse(time.RFC3339, get("ChargePeriodEnd"))
		if pe.Sub(ps) != time.Hour || (class == "" && !billing.MonthPeriod(month).Contains(ps)) || (class != "" && !ps.Before(month.Start())) {
			t.Errorf("row %d (%s %s): charge period %v–%v", n+1, cat, class, ps, pe)
		}
		if get("ServiceCategory") != "AI and Machine Learning" || get("ConsumedUnit") != "" && get("ConsumedUnit") != "GPU-Hours" {
			t.Errorf("row %d: service %q, unit %q", n+1, get("ServiceCategory"), get("ConsumedUnit"))
		}
		var tags map[string]string
		json.Unmarshal([]byte(get("Tags")), &tags) //nolint:errcheck
		if tags["allot/user"] == "" || tags["allot/tier"] == "" || tags["allot/gpu_type"] == "" || tags["allot/job_name"] == "" {
			t.Errorf("row %d: tags %s", n+1, get("Tags"))
		}
		if get("SkuId") != tags["allot/gpu_type"]+"/tier-"+tags["allot/tier"] || get("SubAccountId") == "" || get("ResourceId") == "" {
			t.Errorf("row %d: SKU %q, sub account %q, resource %q", n+1, get("SkuId"), get("SubAccountId"), get("ResourceId"))
		}
		billed := dec(t, get("BilledCost"))
		for _, c := range []string{"EffectiveCost", "ListCost", "ContractedCost"} {
			if dec(t, get(c)).Cmp(billed) != 0 {
				t.Errorf("row %d: %s %s != BilledCost %s", n+1, c, get(c), get("BilledCost"))
			}
		}
		// Usage (not a correction) has a quantity, unit prices and a
		// pricing category, and ListUnitPrice × PricingQuantity is
		// ListCost to within the line's rounding to the cent.
		switch {
		case cat == "Usage" && class == "":
			for _, c := range []string{"ConsumedQuantity", "PricingQuantity", "PricingUnit", "ListUnitPrice", "ContractedUnitPrice", "PricingCategory", "SkuPriceId"} {
				if get(c) == "" {
					t.Errorf("row %d: usage without %s", n+1, c)
				}
			}
			q, price := dec(t, get("PricingQuantity")), dec(t, get("ListUnitPrice"))
			diff := new(big.Rat).Sub(new(big.Rat).Mul(q, price), billed)
			tol := new(big.Rat).Add(big.NewRat(1, 200), new(big.Rat).Mul(price, big.NewRat(1, 1_000_000)))
			if diff.Abs(diff).Cmp(tol) > 0 {
				t.Errorf("row %d: %s × %s is not %s to the cent", n+1, get("PricingQuantity"), get("ListUnitPrice"), get("BilledCost"))
			}
			secs := dec(t, get("x_GPUSeconds"))
			if d := new(big.Rat).Sub(new(big.Rat).Mul(q, big.NewRat(3600, 1)), secs); d.Abs(d).Cmp(big.NewRat(1, 100)) > 0 {
				t.Errorf("row %d: %s GPU-hours is not %s GPU-seconds", n+1, get("PricingQuantity"), get("x_GPUSeconds"))
			}
		case cat == "Credit":
			if get("ConsumedQuantity") != "" || billed.Sign() > 0 && class == "" {
				t.Errorf("row %d: credit with a consumed quantity or a positive cost", n+1)
			}
		}
	}
	if classes["Usage/"] == 0 || classes["Credit/"] == 0 || classes["Usage/Correction"] != 2 {
		t.Errorf("FOCUS rows by category/class: %v", classes)
	}
}
