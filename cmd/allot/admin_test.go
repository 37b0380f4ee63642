package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// policyCounts returns the number of policy versions and audit entries.
func (e *env) policyCounts() [2]int {
	e.t.Helper()
	var v, a int
	if err := e.m.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM policy_versions), (SELECT count(*) FROM audit_log)`).Scan(&v, &a); err != nil {
		e.t.Fatal(err)
	}
	return [2]int{v, a}
}

// wantChanges checks that exactly n changes (versions + entries) happened
// since start.
func (e *env) wantChanges(start [2]int, n int, what string) {
	e.t.Helper()
	if got := e.policyCounts(); got != [2]int{start[0] + n, start[1] + n} {
		e.t.Errorf("%s: versions/audit entries %v → %v, want +%d each", what, start, got, n)
	}
}

func decodeChange(t *testing.T, body []byte) web.AdminChangeJSON {
	t.Helper()
	var r web.AdminChangeJSON
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return r
}

func problemFields(t *testing.T, body []byte) map[string]string {
	t.Helper()
	var p web.Problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return p.Errors
}

// TestAdminAPIEdits drives every admin edit through the JSON API: a valid
// change makes one version and one audit entry, the same values again make
// none, bad input is a 422 with field errors (or 404/409) and changes
// nothing, and only admins may change the policy.
func TestAdminAPIEdits(t *testing.T) {
	e := boot(t)
	start := e.policyCounts()
	changes := 0
	type call struct {
		method, path, body string
		status             int
		field              string // a field error expected (422)
		changed            bool   // a successful call that changes something
	}
	closeLastMonth := func() {
		prev := billing.Month(e.m.Store.Now()).Start().AddDate(0, -1, 0)
		if err := e.m.Store.CloseMonth(context.Background(), billing.Month(prev), "finn@example.com"); err != nil {
			t.Fatal(err)
		}
	}
	closeLastMonth()
	for _, c := range []call{
		{"PUT", "/api/v1/tiers/3", `{"multiplier":"1.1","note":"experiments cost more"}`, 200, "", true},
		{"PUT", "/api/v1/tiers/3", `{"multiplier":"1.1"}`, 200, "", false},
		{"PUT", "/api/v1/tiers/3", `{"multiplier":"abc"}`, 422, "multiplier", false},
		{"PUT", "/api/v1/tiers/3", `{"multiplier":"11"}`, 422, "multiplier", false},
		{"PUT", "/api/v1/tiers/3", `{"class_order":1}`, 422, "class_order", false},
		{"PUT", "/api/v1/tiers/3", `{"max_runtime_s":0}`, 422, "max_runtime_s", false},
		{"PUT", "/api/v1/tiers/3", `{"may_preempt":["1"]}`, 422, "may_preempt", false},
		// Seconds that would wrap around as a duration (2e10 s wraps to a
		// positive ~49 years) are refused before any arithmetic.
		{"PUT", "/api/v1/tiers/3", `{"max_runtime_s":20000000000}`, 422, "max_runtime_s", false},
		{"PUT", "/api/v1/tiers/3", `{"max_runtime_s":9223372036854775807}`, 422, "max_runtime_s", false},
		{"PUT", "/api/v1/tiers/3", `{"max_runtime_s":31708800}`, 422, "max_runtime_s", false}, // 367 days
		{"PUT", "/api/v1/tiers/3", `{"colour":"red"}`, 422, "colour", false},
		{"PUT", "/api/v1/tiers/9", `{"multiplier":"1"}`, 404, "", false},
		{"PUT", "/api/v1/tiers/4", `{"max_runtime_s":86400,"reserved_gpus":2,"may_preempt":["preemptible"]}`, 422, "may_preempt", false}, // tier right is for production tiers
		{"PUT", "/api/v1/tiers/2", `{"may_preempt":["4","preemptible"]}`, 200, "", true},
		{"PUT", "/api/v1/tiers/4", `{"max_runtime_s":86400,"reserved_gpus":2}`, 200, "", true},

		{"PUT", "/api/v1/rates/T4", `{"rate":"0.40"}`, 200, "", true},
		{"PUT", "/api/v1/rates/T4", `{"rate":"0.4"}`, 200, "", false},
		{"PUT", "/api/v1/rates/T4", `{"rate":"cheap"}`, 422, "rate", false},
		{"PUT", "/api/v1/rates/T4", `{"rate":"0.50","currency":"EUR"}`, 422, "currency", false},
		{"PUT", "/api/v1/rates/T4", `{"rate":"0.50","effective_from":"2020-01-01T00:00:00Z"}`, 409, "", false},
		{"PUT", "/api/v1/rates/H100", `{"rate":"2.00"}`, 404, "", false},

		{"POST", "/api/v1/teams", `{"slug":"vision","name":"Vision","cost_center":"CC-9","monthly_budget_gpu_hours":300,"guarantees":{"T4":4},"fair_share_weight":2,"webhook_url":"https://hooks.example.com/vision"}`, 201, "", true},
		{"POST", "/api/v1/teams", `{"slug":"vision","name":"Vision","cost_center":"CC-9"}`, 422, "slug", false},
		{"POST", "/api/v1/teams", `{"slug":"Bad Slug","name":"x","cost_center":"y"}`, 422, "slug", false},
		{"POST", "/api/v1/teams", `{"slug":"speech","name":"Speech","cost_center":"CC-1","webhook_url":"http://10.0.0.8/hook"}`, 422, "webhook_url", false},
		{"POST", "/api/v1/teams", `{"slug":"speech","name":"Speech","cost_center":"CC-1","guarantees":{"H100":2}}`, 422, "guarantees", false},
		{"PUT", "/api/v1/teams/nlp", `{"monthly_budget_gpu_hours":1234,"guarantees":{"A100-80GB":8},"note":"new quarter"}`, 200, "", true},
		{"PUT", "/api/v1/teams/nlp", `{"monthly_budget_gpu_hours":1234}`, 200, "", false},
		{"PUT", "/api/v1/teams/nlp", `{"fair_share_weight":0}`, 422, "fair_share_weight", false},
		{"PUT", "/api/v1/teams/nlp", `{"monthly_budget_gpu_hours":-5}`, 422, "monthly_budget_gpu_hours", false},
		{"PUT", "/api/v1/teams/nlp", `{"webhook_url":"ftp://example.com"}`, 422, "webhook_url", false},
		{"PUT", "/api/v1/teams/ghost", `{"fair_share_weight":2}`, 404, "", false},

		{"PUT", "/api/v1/policy", `{"max_loss_requeues":2,"note":"fewer requeues after losses"}`, 200, "", true},
		{"PUT", "/api/v1/policy", `{"grace_period_s":300,"burst_monthly_budget":"5000.00","note":"longer grace"}`, 200, "", true},
		{"PUT", "/api/v1/policy", `{"grace_period_s":300}`, 200, "", false},
		{"PUT", "/api/v1/policy", `{"budget_warn_pct":150}`, 422, "budget_warn_pct", false},
		{"PUT", "/api/v1/policy", `{"half_life_s":"7d"}`, 422, "half_life_s", false},
		{"PUT", "/api/v1/policy", `{"grace_period_s":20000000000}`, 422, "grace_period_s", false},
		{"PUT", "/api/v1/policy", `{"grace_period_s":9223372036854775807}`, 422, "grace_period_s", false},
		{"PUT", "/api/v1/policy", `{"auto_undrain_after_s":20000000000}`, 422, "auto_undrain_after_s", false},
		{"PUT", "/api/v1/policy", `{"half_life_s":9223372036854775807}`, 422, "half_life_s", false},
		{"PUT", "/api/v1/policy", `{"burst_monthly_budget":"a lot"}`, 422, "burst_monthly_budget", false},
		{"PUT", "/api/v1/policy", `{"health_rules":[]}`, 422, "health_rules", false},
		{"PUT", "/api/v1/policy", `{"max_loss_requeues":-1}`, 422, "max_loss_requeues", false},
		{"PUT", "/api/v1/policy", `{"max_loss_requeues":1001}`, 422, "max_loss_requeues", false},
		{"PUT", "/api/v1/policy", `{"max_loss_requeues":"many"}`, 422, "max_loss_requeues", false},
	} {
		status, _, body := e.api(c.method, c.path, demo.Admin, c.body)
		if status != c.status {
			t.Errorf("%s %s %s: status %d, want %d: %s", c.method, c.path, c.body, status, c.status, body)
			continue
		}
		if c.field != "" && problemFields(t, body)[c.field] == "" {
			t.Errorf("%s %s %s: no %s field error: %s", c.method, c.path, c.body, c.field, body)
		}
		if status < 300 {
			if r := decodeChange(t, body); r.Changed != c.changed || (c.changed && (r.PolicyVersion == 0 || r.AuditID == 0)) {
				t.Errorf("%s %s %s: %+v, want changed=%v", c.method, c.path, c.body, r, c.changed)
			}
		}
		if c.changed {
			changes++
		}
		e.wantChanges(start, changes, c.method+" "+c.path+" "+c.body)
	}

	// Only admins change policy; everyone reads it.
	for _, persona := range []string{demo.Engineer, demo.Lead, demo.Finance} {
		if status, _, body := e.api("PUT", "/api/v1/tiers/3", persona, `{"multiplier":"0.1"}`); status != http.StatusForbidden {
			t.Errorf("%s changing a tier: %d %s", persona, status, body)
		}
		if status, _, _ := e.api("GET", "/api/v1/audit", persona, ""); status != http.StatusForbidden {
			t.Errorf("%s reading the audit log: %d", persona, status)
		}
	}
	if status, _, _ := e.api("PUT", "/api/v1/policy", "", `{"grace_period_s":1}`); status != http.StatusUnauthorized {
		t.Errorf("no token: %d", status)
	}
	e.wantChanges(start, changes, "refused callers")

	status, _, body := e.api("GET", "/api/v1/policy", demo.Engineer, "")
	var p web.PolicyJSON
	if err := json.Unmarshal(body, &p); status != 200 || err != nil || p.GracePeriodS != 300 || p.BurstMonthlyBudget != "5000.00" || len(p.HealthRules) == 0 {
		t.Errorf("GET policy: %d %s", status, body)
	}
	status, _, body = e.api("GET", "/api/v1/tiers", demo.Engineer, "")
	if status != 200 || !strings.Contains(string(body), `"multiplier": "1.1"`) {
		t.Errorf("GET tiers: %d %s", status, body)
	}
	status, _, body = e.api("GET", "/api/v1/rates", demo.Engineer, "")
	if status != 200 || !strings.Contains(string(body), `"rate": "0.40"`) {
		t.Errorf("GET rates: %d %s", status, body)
	}

	status, _, body = e.api("GET", "/api/v1/teams", demo.Admin, "")
	if status != 200 || !strings.Contains(string(body), `"webhook_url": "https://hooks.example.com/vision"`) || !strings.Contains(string(body), `"monthly_budget_gpu_hours": 1234`) {
		t.Errorf("GET teams: %d %s", status, body)
	}

	// The audit log has every change, newest first, with readable diffs.
	status, _, body = e.api("GET", "/api/v1/audit", demo.Admin, "")
	var log struct{ Entries []web.AuditEntryJSON }
	if err := json.Unmarshal(body, &log); status != 200 || err != nil || len(log.Entries) != changes {
		t.Fatalf("audit: %d, %d entries, want %d: %s", status, len(log.Entries), changes, body)
	}
	if first := log.Entries[0]; first.Action != "policy.update" || first.Actor != "ada@example.com" || first.Note != "longer grace" ||
		len(first.Changes) != 2 || first.Changes[1] != (web.FieldChangeJSON{Field: "grace_period_s", Before: "120 (2m)", After: "300 (5m)"}) {
		t.Errorf("newest entry: %+v", first)
	}
	last := log.Entries[len(log.Entries)-1]
	if last.Action != "tier.update" || last.Object != "tier:3" || len(last.Changes) != 1 ||
		last.Changes[0] != (web.FieldChangeJSON{Field: "multiplier", Before: "1", After: "1.1"}) {
		t.Errorf("oldest entry: %+v", last)
	}
	status, _, body = e.api("GET", "/api/v1/audit?kind=team", demo.Admin, "")
	if err := json.Unmarshal(body, &log); status != 200 || err != nil || len(log.Entries) != 2 || log.Entries[0].Action != "team.update" ||
		log.Entries[1].Action != "team.create" || string(log.Entries[1].Before) != "null" {
		t.Errorf("audit by kind: %d %s", status, body)
	}
	if status, _, body = e.api("GET", "/api/v1/audit?since=yesterday", demo.Admin, ""); status != 422 || problemFields(t, body)["since"] == "" {
		t.Errorf("bad date filter: %d %s", status, body)
	}

	status, _, body = e.api("GET", "/api/v1/policy/versions", demo.Admin, "")
	var versions struct{ Versions []web.PolicyVersionJSON }
	if err := json.Unmarshal(body, &versions); status != 200 || err != nil || len(versions.Versions) != start[0]+changes {
		t.Fatalf("versions: %d %s", status, body)
	}
	if v := versions.Versions[0]; len(v.AuditIDs) != 1 || len(v.Changes) != 2 || v.Changes[1].Field != "grace_period_s" {
		t.Errorf("newest version: %+v", v)
	}
}

// TestAdminFormsWithoutJavaScript posts the admin forms as a browser
// without JavaScript would: bad input re-renders the page (422) with the
// error next to the field and what was typed kept, changing nothing; good
// input redirects to the page with a confirmation.
func TestAdminFormsWithoutJavaScript(t *testing.T) {
	e := boot(t)
	br := e.login(demo.Admin)
	start := e.policyCounts()
	doc := func(html string) *goquery.Document {
		t.Helper()
		d, err := goquery.NewDocumentFromReader(strings.NewReader(html))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// formValues returns the current values of the form inside sel.
	formValues := func(d *goquery.Document, sel string) url.Values {
		v := url.Values{}
		d.Find(sel + " input").Each(func(_ int, in *goquery.Selection) {
			name, _ := in.Attr("name")
			typ, _ := in.Attr("type")
			val, _ := in.Attr("value")
			if name == "" || name == "_csrf" || (typ == "checkbox" && in.AttrOr("checked", "-") == "-") {
				return
			}
			v.Add(name, val)
		})
		d.Find(sel + " select").Each(func(_ int, in *goquery.Selection) { // what a browser posts: the selected option
			opt := in.Find("option[selected]").First()
			if opt.Length() == 0 {
				opt = in.Find("option").First()
			}
			v.Add(in.AttrOr("name", ""), opt.AttrOr("value", ""))
		})
		return v
	}

	status, page := br.get("/admin/tiers")
	if status != 200 {
		t.Fatalf("tiers page: %d", status)
	}
	d := doc(page)
	form := formValues(d, `[data-testid="tier-form-3"]`)
	if form.Get("multiplier") != "1" || form.Get("max_runtime_s") != "7d" || form.Get("class_order") != "3" {
		t.Fatalf("tier 3 form: %v", form)
	}
	form.Set("multiplier", "lots")
	form.Set("max_runtime_s", "3x")
	status, page = br.post("/admin/tiers/3", page, form)
	d = doc(page)
	if status != 422 || d.Find(`[data-testid="tier-form-3"] [data-testid="error-multiplier"]`).Length() != 1 ||
		d.Find(`[data-testid="tier-form-3"] [data-testid="error-max_runtime_s"]`).Length() != 1 ||
		d.Find(`#tier-3-multiplier`).AttrOr("value", "") != "lots" || d.Find(`#tier-3-multiplier`).AttrOr("aria-invalid", "") != "true" {
		t.Errorf("bad tier form: %d\n%s", status, page)
	}
	if d.Find(`[data-testid="tier-form-4"] [data-testid^="error-"]`).Length() != 0 {
		t.Error("errors shown on another tier's form")
	}
	e.wantChanges(start, 0, "bad tier form")
	form.Set("multiplier", "1.25")
	form.Set("max_runtime_s", "5d")
	form.Set("note", "pricier experiments")
	status, page = br.post("/admin/tiers/3", page, form)
	d = doc(page)
	if saved := d.Find(`[data-testid="tier-form-3"] [data-testid="saved"]`).Text(); status != 200 || !strings.Contains(saved, "Saved tier 3 as policy version") ||
		d.Find(`#tier-3-multiplier`).AttrOr("value", "") != "1.25" || d.Find(`#tier-3-max_runtime_s`).AttrOr("value", "") != "5d" {
		t.Errorf("good tier form: %d saved=%q", status, saved)
	}
	e.wantChanges(start, 1, "good tier form")
	status, page = br.post("/admin/tiers/3", page, form)
	if saved := doc(page).Find(`[data-testid="tier-form-3"] [data-testid="saved"]`).Text(); status != 200 || !strings.Contains(saved, "No change") {
		t.Errorf("same tier form again: %d saved=%q", status, saved)
	}
	e.wantChanges(start, 1, "same tier form again")

	// Rate card.
	_, page = br.get("/admin/rates")
	status, page = br.post("/admin/rates/T4", page, url.Values{"rate": {"0,40"}, "effective_from": {""}})
	d = doc(page)
	if status != 422 || d.Find(`[data-testid="rate-form-T4"] [data-testid="error-rate"]`).Length() != 1 || d.Find(`#rate-T4-rate`).AttrOr("value", "") != "0,40" {
		t.Errorf("bad rate form: %d", status)
	}
	status, page = br.post("/admin/rates/T4", page, url.Values{"rate": {"0.45"}, "effective_from": {"2031-01-01T00:00"}})
	d = doc(page)
	if status != 200 || !strings.Contains(d.Find(`[data-testid="rate-form-T4"] [data-testid="rate-history"]`).Text(), "2031-01-01 00:00 UTC") ||
		d.Find(`[data-testid="rate-form-T4"] [data-testid="current-rate"]`).Text() != "0.35 USD" {
		t.Errorf("scheduled rate: %d\n%s", status, d.Find(`[data-testid="rate-form-T4"]`).Text())
	}
	e.wantChanges(start, 2, "rate forms")

	// Teams: create with a bad webhook, then right; edit a budget.
	_, page = br.get("/admin/teams")
	create := url.Values{"slug": {"vision"}, "name": {"Vision"}, "cost_center": {"CC-9"}, "monthly_budget_gpu_hours": {"200"},
		"fair_share_weight": {"1"}, "guarantee_T4": {"2"}, "guarantee_A100-80GB": {"0"}, "webhook_url": {"http://localhost/hook"}}
	status, page = br.post("/admin/teams", page, create)
	d = doc(page)
	if status != 422 || d.Find(`[data-testid="team-form-new"] [data-testid="error-webhook_url"]`).Length() != 1 ||
		d.Find(`#team-new-slug`).AttrOr("value", "") != "vision" {
		t.Errorf("bad team: %d", status)
	}
	create.Set("webhook_url", "")
	status, page = br.post("/admin/teams", page, create)
	d = doc(page)
	if status != 200 || d.Find(`[data-testid="team-form-vision"] [data-testid="saved"]`).Length() != 1 {
		t.Errorf("create team: %d", status)
	}
	edit := formValues(d, `[data-testid="team-form-nlp"]`)
	edit.Set("monthly_budget_gpu_hours", "many")
	status, page = br.post("/admin/teams/nlp", page, edit)
	if status != 422 || doc(page).Find(`[data-testid="team-form-nlp"] [data-testid="error-monthly_budget_gpu_hours"]`).Length() != 1 {
		t.Errorf("bad budget: %d", status)
	}
	edit.Set("monthly_budget_gpu_hours", "999")
	if status, _ = br.post("/admin/teams/nlp", page, edit); status != 200 {
		t.Errorf("edit team: %d", status)
	}
	e.wantChanges(start, 4, "team forms")

	// Policy weights: durations as people write them.
	_, page = br.get("/admin/policy")
	pol := formValues(doc(page), `[data-testid="policy-form"]`)
	if pol.Get("grace_period_s") != "2m" || pol.Get("half_life_s") != "7d" || pol.Get("auto_undrain_after_s") != "0s" {
		t.Fatalf("policy form: %v", pol)
	}
	if pol.Get("queue_order") != "response" {
		t.Errorf("policy form's queue order: %q, want the default response", pol.Get("queue_order"))
	}
	pol.Set("queue_order", "sjf")
	status, page = br.post("/admin/policy", page, pol)
	if status != 422 || doc(page).Find(`[data-testid="error-queue_order"]`).Length() != 1 {
		t.Errorf("unknown queue order: %d", status)
	}
	pol.Set("queue_order", "response")
	pol.Set("grace_period_s", "soon")
	pol.Set("budget_warn_pct", "120")
	status, page = br.post("/admin/policy", page, pol)
	d = doc(page)
	if status != 422 || d.Find(`[data-testid="error-grace_period_s"]`).Length() != 1 || d.Find(`#policy-grace_period_s`).AttrOr("value", "") != "soon" {
		t.Errorf("bad policy form: %d", status)
	}
	pol.Set("grace_period_s", "5m")
	status, page = br.post("/admin/policy", page, pol)
	if status != 422 || doc(page).Find(`[data-testid="error-budget_warn_pct"]`).Length() != 1 {
		t.Errorf("warn above demote: %d", status)
	}
	pol.Set("budget_warn_pct", "75")
	status, page = br.post("/admin/policy", page, pol)
	if status != 200 || doc(page).Find(`#policy-grace_period_s`).AttrOr("value", "") != "5m" {
		t.Errorf("good policy form: %d", status)
	}
	e.wantChanges(start, 5, "policy forms")

	// The audit page and the versions page show them.
	status, page = br.get("/admin/audit?kind=tier")
	d = doc(page)
	if status != 200 || d.Find(`[data-testid="audit-table"] tbody tr`).Length() != 1 ||
		!strings.Contains(d.Find(`[data-testid="change-multiplier"]`).Text(), "1 → 1.25") ||
		d.Find(`[data-testid="note"]`).Text() != "pricier experiments" {
		t.Errorf("audit page: %d\n%s", status, d.Find("main").Text())
	}
	status, page = br.get("/admin/audit?since=2020-13-01")
	if status != 422 || !strings.Contains(page, `data-testid="filter-error"`) {
		t.Errorf("bad audit filter: %d", status)
	}
	status, page = br.get("/admin/versions")
	if status != 200 || !strings.Contains(doc(page).Find(`main article`).First().Text(), "budget_warn_pct") {
		t.Errorf("versions page: %d", status)
	}
	if status, page = br.get("/admin"); status != 200 || doc(page).Find(`[data-testid="audit-table"] tbody tr`).Length() != 5 {
		t.Errorf("overview: %d", status)
	}

	// An engineer is refused every admin page with a clear message.
	eng := e.login(demo.Engineer)
	for _, path := range []string{"/admin", "/admin/tiers", "/admin/audit", "/admin/versions"} {
		status, page := eng.get(path)
		if msg := doc(page).Find(`[data-testid="error-message"]`).Text(); status != http.StatusForbidden || msg != "only admins may do this" {
			t.Errorf("engineer GET %s: %d %q", path, status, msg)
		}
	}
}

// TestAuditCSVExport checks the streamed RFC 4180 export: a header, one
// row per entry newest first, CRLF line ends, quoting of commas, quotes and
// newlines in notes, and the page's filters.
func TestAuditCSVExport(t *testing.T) {
	e := boot(t)
	note := "budget cut, \"per finance\"\nsee ticket 42"
	for _, c := range [][2]string{
		{"/api/v1/tiers/4", `{"multiplier":"0.9"}`},
		{"/api/v1/teams/recs", `{"monthly_budget_gpu_hours":700,"note":` + strings.TrimSpace(mustJSON(t, note)) + `}`},
		{"/api/v1/policy", `{"weight_age":900}`},
	} {
		if status, _, body := e.api("PUT", c[0], demo.Admin, c[1]); status != 200 {
			t.Fatalf("PUT %s: %d %s", c[0], status, body)
		}
	}
	status, hdr, body := e.api("GET", "/api/v1/audit.csv", demo.Admin, "")
	if status != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/csv") || !strings.Contains(hdr.Get("Content-Disposition"), "attachment") {
		t.Fatalf("export: %d %v", status, hdr)
	}
	if !bytes.HasSuffix(body, []byte("\r\n")) || bytes.Count(body, []byte("\r\n")) < 4 {
		t.Errorf("not CRLF-terminated records: %q", body)
	}
	rows, err := csv.NewReader(bytes.NewReader(body)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 || strings.Join(rows[0], ",") != strings.Join(web.AuditCSVColumns, ",") {
		t.Fatalf("rows: %q", rows)
	}
	col := map[string]int{}
	for i, c := range rows[0] {
		col[c] = i
	}
	if r := rows[1]; r[col["action"]] != "policy.update" || r[col["changes"]] != "weight_age: 500 → 900" || r[col["actor"]] != "ada@example.com" {
		t.Errorf("newest row: %q", r)
	}
	if r := rows[2]; r[col["object"]] != "team:recs" || r[col["note"]] != note || !strings.Contains(r[col["after"]], `"monthly_budget_gpu_hours":700`) {
		t.Errorf("team row: %q", r)
	}
	if r := rows[3]; r[col["changes"]] != "multiplier: 1 → 0.9" || r[col["policy_version"]] == "" {
		t.Errorf("tier row: %q", r)
	}
	_, _, body = e.api("GET", "/api/v1/audit.csv?kind=team", demo.Admin, "")
	if rows, err := csv.NewReader(bytes.NewReader(body)).ReadAll(); err != nil || len(rows) != 2 {
		t.Errorf("filtered export: %q %v", rows, err)
	}
	if status, _, _ := e.api("GET", "/api/v1/audit.csv", demo.Finance, ""); status != http.StatusForbidden {
		t.Errorf("finance export: %d", status)
	}

	// Text a spreadsheet would run as a formula starts with an apostrophe;
	// numbers in the numeric columns stay as they are.
	formulas := []string{`=HYPERLINK("http://evil.example","x")`, "+1+2", "-2+3", "@SUM(A1:A2)", "plain note", "-1"}
	for i, n := range formulas {
		if status, _, body := e.api("PUT", "/api/v1/policy", demo.Admin, fmt.Sprintf(`{"weight_age":%d,"note":%s}`, 1000+i, mustJSON(t, n))); status != 200 {
			t.Fatalf("PUT policy with note %q: %d %s", n, status, body)
		}
	}
	_, _, body = e.api("GET", "/api/v1/audit.csv", demo.Admin, "")
	if rows, err = csv.NewReader(bytes.NewReader(body)).ReadAll(); err != nil || len(rows) < 1+len(formulas) {
		t.Fatalf("export: %q %v", rows, err)
	}
	for i, n := range formulas {
		r := rows[len(formulas)-i] // newest first
		want := "'" + n
		if n == "plain note" {
			want = n
		}
		if r[col["note"]] != want {
			t.Errorf("note %q exported as %q, want %q", n, r[col["note"]], want)
		}
		if _, err := strconv.ParseInt(r[col["id"]], 10, 64); err != nil {
			t.Errorf("id %q is not a number", r[col["id"]])
		}
		if _, err := strconv.ParseInt(r[col["policy_version"]], 10, 64); err != nil {
			t.Errorf("policy_version %q is not a number", r[col["policy_version"]])
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDocsFollowTheLivePolicy reads the policy documentation as an
// engineer, changes tier 3's multiplier and the grace period as the admin,
// and finds both, and the recomputed worked example, at once.
func TestDocsFollowTheLivePolicy(t *testing.T) {
	e := boot(t)
	eng := e.login(demo.Engineer)
	read := func() *goquery.Document {
		t.Helper()
		status, page := eng.get("/docs")
		if status != 200 {
			t.Fatalf("docs: %d", status)
		}
		d, err := goquery.NewDocumentFromReader(strings.NewReader(page))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := read()
	version := d.Find(`[data-testid="docs-version"]`).Text()
	// 8 × A100-80GB for 3h30m = 28 GPU-hours at 3.20 USD.
	if m := d.Find(`[data-testid="docs-tier-3"] [data-testid="multiplier"]`).Text(); m != "×1" {
		t.Errorf("tier 3 multiplier %q", m)
	}
	if a := d.Find(`[data-testid="docs-example-3"] td`).Last().Text(); a != "89.60 USD" {
		t.Errorf("tier 3 example %q", a)
	}
	if a := d.Find(`[data-testid="docs-example-preemptible"] td`).Last().Text(); a != "26.88 USD" {
		t.Errorf("preemptible example %q", a)
	}
	if g := d.Find(`[data-testid="grace"]`).Text(); g != "2m" {
		t.Errorf("grace %q", g)
	}
	if curl := d.Find(`[data-testid="docs-curl"]`).Text(); !strings.Contains(curl, "curl -X POST "+e.url+"/api/v1/jobs") {
		t.Errorf("curl example: %q", curl)
	}
	if d.Find(`[data-testid="docs-health-rules"] tbody tr`).Length() == 0 || !strings.Contains(d.Find(`[data-testid="docs-pytorch"]`).Text(), "ALLOT_CHECKPOINT_DIR") {
		t.Error("health rules or checkpoint example missing")
	}

	for _, c := range [][2]string{{"/api/v1/tiers/3", `{"multiplier":"1.5"}`}, {"/api/v1/policy", `{"grace_period_s":300}`}} {
		if status, _, body := e.api("PUT", c[0], demo.Admin, c[1]); status != 200 {
			t.Fatalf("PUT %s: %d %s", c[0], status, body)
		}
	}
	d = read()
	if m := d.Find(`[data-testid="docs-tier-3"] [data-testid="multiplier"]`).Text(); m != "×1.5" {
		t.Errorf("tier 3 multiplier after the change %q", m)
	}
	if a := d.Find(`[data-testid="docs-example-3"] td`).Last().Text(); a != "134.40 USD" {
		t.Errorf("tier 3 example after the change %q", a)
	}
	if g := d.Find(`[data-testid="grace"]`).Text(); g != "5m" {
		t.Errorf("grace after the change %q", g)
	}
	if v := d.Find(`[data-testid="docs-version"]`).Text(); v == version {
		t.Errorf("policy version unchanged: %q", v)
	}
	status, _, body := e.api("GET", "/api/v1/policy", demo.Engineer, "")
	if status != 200 || !strings.Contains(string(body), `"grace_period_s": 300`) {
		t.Errorf("policy API after the change: %d %s", status, body)
	}
}

// TestAdminPolicyTier1FIFO: the policy's tier1_fifo (tier-1 jobs oldest
// first) is on by default, read and set through GET/PUT /api/v1/policy and
// the /admin/policy checkbox, audited, kept when a change leaves it out,
// and refused with a tier1_fifo field error, changing nothing, when it is
// not true or false. /docs, /api/v1/priorities and a tier-1 job's page say
// how tier 1 is served under the setting in force.
func TestAdminPolicyTier1FIFO(t *testing.T) {
	e := boot(t)
	start := e.policyCounts()
	policy := func() web.PolicyJSON {
		t.Helper()
		status, _, body := e.api("GET", "/api/v1/policy", demo.Engineer, "")
		var p web.PolicyJSON
		if err := json.Unmarshal(body, &p); status != 200 || err != nil {
			t.Fatalf("GET policy: %d %v %s", status, err, body)
		}
		if !strings.Contains(string(body), `"tier1_fifo": `) {
			t.Errorf("GET policy has no tier1_fifo: %s", body)
		}
		return p
	}
	priorities := func() web.PrioritiesJSON {
		t.Helper()
		status, _, body := e.api("GET", "/api/v1/priorities", demo.Admin, "")
		var p web.PrioritiesJSON
		if err := json.Unmarshal(body, &p); status != 200 || err != nil {
			t.Fatalf("GET priorities: %d %v %s", status, err, body)
		}
		return p
	}
	status, _, body := e.api("POST", "/api/v1/jobs", demo.Admin, `{"team":"fraud","tier":1,"gpus":8,"gpu_type":"A100-80GB","time_limit":"1h","command":["true"]}`)
	if status != http.StatusCreated {
		t.Fatalf("submitting a tier-1 job: %d %s", status, body)
	}
	var job web.JobJSON
	if err := json.Unmarshal(body, &job); err != nil {
		t.Fatal(err)
	}
	eng := e.login(demo.Admin)
	jobPage := func() string {
		t.Helper()
		status, page := eng.get(fmt.Sprintf("/jobs/%d", job.ID))
		if status != 200 {
			t.Fatalf("job page: %d", status)
		}
		return page
	}
	const pageFIFO = "tier 1 is served oldest first"

	p := policy()
	if !p.Tier1FIFO || p.QueueOrder != "response" || p.GracePeriodS != 120 {
		t.Fatalf("default policy: tier1_fifo %v, queue_order %q, grace %d", p.Tier1FIFO, p.QueueOrder, p.GracePeriodS)
	}
	if f := e.docsText("docs-tier1-fifo"); !strings.Contains(f, "served oldest first") || !strings.Contains(f, "tier1_fifo") {
		t.Errorf("/docs on tier 1 by default: %q", f)
	}
	if pr := priorities(); !pr.Tier1FIFO || !strings.Contains(pr.Method, "served oldest first whatever its priority") {
		t.Errorf("priorities by default: tier1_fifo %v, method %q", pr.Tier1FIFO, pr.Method)
	}
	if !strings.Contains(jobPage(), pageFIFO) {
		t.Errorf("the tier-1 job's page does not say tier 1 is served oldest first")
	}

	// Not true or false: a 422 naming the field; nothing changes, not
	// even the valid field beside it.
	for _, bad := range []string{`{"tier1_fifo":"no"}`, `{"tier1_fifo":"false"}`, `{"tier1_fifo":0}`, `{"tier1_fifo":[]}`, `{"tier1_fifo":"off","grace_period_s":300}`} {
		status, _, body := e.api("PUT", "/api/v1/policy", demo.Admin, bad)
		if status != http.StatusUnprocessableEntity || !strings.Contains(problemFields(t, body)["tier1_fifo"], "true or false") {
			t.Errorf("PUT %s: %d %s, want 422 with a tier1_fifo error", bad, status, body)
		}
	}
	e.wantChanges(start, 0, "bad tier1_fifo values")
	if p := policy(); !p.Tier1FIFO || p.GracePeriodS != 120 {
		t.Errorf("after refused changes: tier1_fifo %v, grace %d", p.Tier1FIFO, p.GracePeriodS)
	}

	// Off, through the API: one version, one audit entry.
	status, _, body = e.api("PUT", "/api/v1/policy", demo.Admin, `{"tier1_fifo":false,"note":"incidents by priority"}`)
	if status != 200 || !decodeChange(t, body).Changed {
		t.Fatalf("PUT tier1_fifo false: %d %s", status, body)
	}
	e.wantChanges(start, 1, "tier1_fifo off")
	if status, _, body = e.api("PUT", "/api/v1/policy", demo.Admin, `{"tier1_fifo":false}`); status != 200 || decodeChange(t, body).Changed {
		t.Errorf("the same value again: %d %s, want unchanged", status, body)
	}
	if p := policy(); p.Tier1FIFO || p.QueueOrder != "response" || p.GracePeriodS != 120 {
		t.Errorf("after tier1_fifo false: tier1_fifo %v, queue_order %q, grace %d", p.Tier1FIFO, p.QueueOrder, p.GracePeriodS)
	}
	status, _, body = e.api("GET", "/api/v1/audit?kind=policy", demo.Admin, "")
	var log struct{ Entries []web.AuditEntryJSON }
	if err := json.Unmarshal(body, &log); status != 200 || err != nil || len(log.Entries) == 0 {
		t.Fatalf("audit: %d %s", status, body)
	}
	if first := log.Entries[0]; first.Note != "incidents by priority" || len(first.Changes) != 1 ||
		first.Changes[0] != (web.FieldChangeJSON{Field: "tier1_fifo", Before: "true", After: "false"}) {
		t.Errorf("audit entry: %+v", first)
	}
	// A change that leaves it out keeps it.
	if status, _, body = e.api("PUT", "/api/v1/policy", demo.Admin, `{"grace_period_s":300}`); status != 200 {
		t.Fatalf("PUT grace: %d %s", status, body)
	}
	e.wantChanges(start, 2, "grace")
	if p := policy(); p.Tier1FIFO || p.GracePeriodS != 300 {
		t.Errorf("after a grace change: tier1_fifo %v, grace %d", p.Tier1FIFO, p.GracePeriodS)
	}
	if f := e.docsText("docs-tier1-fifo"); !strings.Contains(f, "served by priority") || strings.Contains(f, "oldest first, by submission") {
		t.Errorf("/docs on tier 1 with tier1_fifo off: %q", f)
	}
	if pr := priorities(); pr.Tier1FIFO || strings.Contains(pr.Method, "oldest first") || !strings.Contains(pr.Method, "tier1_fifo is off") {
		t.Errorf("priorities with tier1_fifo off: tier1_fifo %v, method %q", pr.Tier1FIFO, pr.Method)
	}
	if strings.Contains(jobPage(), pageFIFO) {
		t.Errorf("the tier-1 job's page says tier 1 is served oldest first with tier1_fifo off")
	}

	// The form: an unticked checkbox (with its hidden "false"); ticking
	// it turns the setting back on, unticking it off again.
	_, page := eng.get("/admin/policy")
	d, err := goquery.NewDocumentFromReader(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	box := d.Find(`[data-testid="policy-form"] input#policy-tier1_fifo`)
	if box.AttrOr("type", "") != "checkbox" || box.AttrOr("value", "") != "true" || box.AttrOr("checked", "-") != "-" {
		t.Fatalf("policy form's tier1_fifo box: %d found, type %q value %q checked %q", box.Length(), box.AttrOr("type", ""), box.AttrOr("value", ""), box.AttrOr("checked", "-"))
	}
	form := url.Values{}
	d.Find(`[data-testid="policy-form"] input, [data-testid="policy-form"] select`).Each(func(_ int, in *goquery.Selection) {
		name := in.AttrOr("name", "")
		if name == "" || name == "_csrf" || (in.AttrOr("type", "") == "checkbox" && in.AttrOr("checked", "-") == "-") {
			return
		}
		if goquery.NodeName(in) == "select" {
			form.Add(name, in.Find("option[selected]").AttrOr("value", ""))
			return
		}
		form.Add(name, in.AttrOr("value", ""))
	})
	if got := form["tier1_fifo"]; len(got) != 1 || got[0] != "false" {
		t.Fatalf("the form posts tier1_fifo %q unticked, want the hidden false alone", got)
	}
	form.Add("tier1_fifo", "true") // ticked
	if status, page = eng.post("/admin/policy", page, form); status != 200 {
		t.Fatalf("policy form ticked: %d", status)
	}
	if !policy().Tier1FIFO {
		t.Error("the ticked form left tier1_fifo off")
	}
	if d, _ := goquery.NewDocumentFromReader(strings.NewReader(page)); d.Find(`input#policy-tier1_fifo`).AttrOr("checked", "-") == "-" {
		t.Error("the saved form shows the box unticked")
	}
	form.Set("tier1_fifo", "maybe")
	if status, page = eng.post("/admin/policy", page, form); status != 422 ||
		!strings.Contains(page, `data-testid="error-tier1_fifo"`) {
		t.Errorf("policy form tier1_fifo=maybe: %d", status)
	}
	form.Set("tier1_fifo", "false") // unticked
	if status, _ = eng.post("/admin/policy", page, form); status != 200 {
		t.Fatalf("policy form unticked: %d", status)
	}
	if policy().Tier1FIFO {
		t.Error("the unticked form left tier1_fifo on")
	}
	e.wantChanges(start, 4, "policy form")
}
