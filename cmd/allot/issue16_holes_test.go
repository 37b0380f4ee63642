package main

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

// Issue 16, part 5: small holes.

// TestLeadWebhookChangeIsAudited: a lead's change of the team webhook is
// in the audit log as an admin's edit of the team is (who, the team's
// values before and after, a policy version); setting the URL in force
// again writes nothing, and a refused URL writes nothing.
func TestLeadWebhookChangeIsAudited(t *testing.T) {
	e := boot(t)
	ctx := context.Background()
	count := func() int {
		t.Helper()
		log, err := e.m.Store.AuditLog(ctx, store.AuditFilter{Object: "team:nlp"})
		if err != nil {
			t.Fatal(err)
		}
		return len(log)
	}
	before := count()
	if code, _, b := e.api("PUT", "/api/v1/teams/nlp/webhook", demo.Lead, `{"url":"https://hooks.example.com/nlp","note":"new channel"}`); code != 200 {
		t.Fatalf("lead sets webhook: %d %s", code, b)
	}
	log, err := e.m.Store.AuditLog(ctx, store.AuditFilter{Object: "team:nlp", Limit: 1})
	if err != nil || len(log) != 1 {
		t.Fatalf("audit log: %v %v", log, err)
	}
	a := log[0]
	var was, now store.TeamValues
	json.Unmarshal(a.Before, &was) //nolint:errcheck
	json.Unmarshal(a.After, &now)  //nolint:errcheck
	if a.Actor != demo.PersonaEmail[demo.Lead] || a.Action != "team.webhook" || a.Note != "new channel" || a.PolicyVersion == 0 ||
		was.WebhookURL != "" || now.WebhookURL != "https://hooks.example.com/nlp" || now.Slug != "nlp" {
		t.Errorf("audit entry %+v (before %s, after %s)", a, a.Before, a.After)
	}
	if hook, _ := e.m.Store.TeamWebhook(ctx, "nlp"); hook != "https://hooks.example.com/nlp" {
		t.Errorf("webhook is %q", hook)
	}
	// The same URL again: no entry. A refused URL: no entry, no change.
	e.api("PUT", "/api/v1/teams/nlp/webhook", demo.Lead, `{"url":"https://hooks.example.com/nlp"}`)
	if code, _, _ := e.api("PUT", "/api/v1/teams/nlp/webhook", demo.Lead, `{"url":"http://127.1/x"}`); code != 422 {
		t.Errorf("127.1: %d", code)
	}
	if n := count(); n != before+1 {
		t.Errorf("%d entries after a no-op and a refusal, want %d", n, before+1)
	}
	// Clearing it is audited too.
	e.api("PUT", "/api/v1/teams/nlp/webhook", demo.Lead, `{"url":""}`)
	if n := count(); n != before+2 {
		t.Errorf("clearing: %d entries, want %d", n, before+2)
	}
}

// TestWebhookOddAddressesAreFieldErrors: the address forms the old check
// let through are a field error on every path that sets a webhook (the
// lead's API, the admin's team API, the team form, the admin health
// webhook form), and nothing changes.
func TestWebhookOddAddressesAreFieldErrors(t *testing.T) {
	e := boot(t)
	ctx := context.Background()
	bad := []string{"http://0/", "http://2130706433/", "http://127.1/", "http://0x7f000001/", "http://100.64.0.1/hook",
		"http://198.18.0.1/", "http://127.0.0.1.nip.io/x", "http://[64:ff9b::7f00:1]/", "http://[::ffff:10.0.0.1]/", "http://240.0.0.1/"}
	for _, hook := range bad {
		b, _ := json.Marshal(map[string]string{"url": hook})
		code, _, body := e.api("PUT", "/api/v1/teams/nlp/webhook", demo.Lead, string(b))
		var p web.Problem
		json.Unmarshal(body, &p) //nolint:errcheck
		if code != 422 || !strings.Contains(p.Errors["url"], "must not point at this machine or a private network") {
			t.Errorf("lead PUT webhook %s: %d %s", hook, code, body)
		}
		b, _ = json.Marshal(map[string]string{"webhook_url": hook})
		code, _, body = e.api("PUT", "/api/v1/teams/nlp", demo.Admin, string(b))
		json.Unmarshal(body, &p) //nolint:errcheck
		if code != 422 || p.Errors["webhook_url"] == "" {
			t.Errorf("admin PUT team %s: %d %s", hook, code, body)
		}
	}
	if hook, _ := e.m.Store.TeamWebhook(ctx, "nlp"); hook != "" {
		t.Errorf("webhook is %q", hook)
	}
	// The admin's health webhook form.
	br := e.login(demo.Admin)
	for _, hook := range []string{"http://2130706433/", "http://100.64.0.1/"} {
		if code, page := br.post("/admin/health", healthPage(t, br), url.Values{"rules": {"1"}, "name_0": {"x"}, "metric_0": {"ecc_dbe"},
			"severity_0": {"critical"}, "action_0": {"drain"}, "auto_undrain_after": {"0s"}, "webhook": {hook}}); code != 422 ||
			!strings.Contains(page, `data-testid="error-webhook"`) {
			t.Errorf("admin health webhook %s: %d", hook, code)
		}
	}
}

// TestOverflowingIntegersAreFieldErrors: integers past what the database
// columns hold are 422 field errors naming the field, not 500s, on the
// tier, policy, team and GPU type endpoints and the tier form; nothing
// changes.
func TestOverflowingIntegersAreFieldErrors(t *testing.T) {
	e := boot(t)
	ctx := context.Background()
	p0, err := e.m.Store.CurrentPolicy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	huge := "1099511627776"
	for _, tt := range []struct{ method, path, body, field string }{
		{"PUT", "/api/v1/tiers/3", `{"reserved_gpus":` + huge + `}`, "reserved_gpus"},
		{"PUT", "/api/v1/tiers/3", `{"class_order":` + huge + `}`, "class_order"},
		{"PUT", "/api/v1/tiers/3", `{"max_runtime_s":` + huge + `}`, "max_runtime_s"},
		{"PUT", "/api/v1/tiers/3", `{"multiplier":"` + huge + `"}`, "multiplier"},
		{"PUT", "/api/v1/tiers/3", `{"multiplier":"0.` + huge + `"}`, "multiplier"},
		{"PUT", "/api/v1/policy", `{"budget_warn_pct":` + huge + `,"budget_demote_pct":` + huge + `}`, "budget_demote_pct"},
		{"PUT", "/api/v1/policy", `{"burst_pending_gpu_hours":` + huge + `}`, "burst_pending_gpu_hours"},
		{"PUT", "/api/v1/policy", `{"burst_max_nodes":` + huge + `}`, "burst_max_nodes"},
		{"PUT", "/api/v1/policy", `{"weight_age":` + huge + `}`, "weight_age"},
		{"PUT", "/api/v1/policy", `{"max_age_s":` + huge + `}`, "max_age_s"},
		{"PUT", "/api/v1/teams/nlp", `{"fair_share_weight":` + huge + `}`, "fair_share_weight"},
		{"PUT", "/api/v1/teams/nlp", `{"monthly_budget_gpu_hours":` + huge + huge + `}`, "monthly_budget_gpu_hours"},
		{"PUT", "/api/v1/teams/nlp", `{"guarantees":{"T4":` + huge + `}}`, "guarantees"},
		{"PUT", "/api/v1/gpu-types/T4", `{"memory_gb":` + huge + `}`, "memory_gb"},
	} {
		code, _, body := e.api(tt.method, tt.path, demo.Admin, tt.body)
		var p web.Problem
		json.Unmarshal(body, &p) //nolint:errcheck
		if code != 422 || (tt.field != "" && p.Errors[tt.field] == "") {
			t.Errorf("%s %s %s: %d %s, want 422 with a %q error", tt.method, tt.path, tt.body, code, body, tt.field)
		}
	}
	// The tier form.
	br := e.login(demo.Admin)
	_, page := br.get("/admin/tiers")
	code, page := br.post("/admin/tiers/3", page, url.Values{"name": {"Standard"}, "class_order": {"3"}, "multiplier": {"1"},
		"max_runtime_s": {"24h"}, "reserved_gpus": {huge}})
	if code != 422 || !strings.Contains(page, `data-testid="error-reserved_gpus"`) {
		t.Errorf("tier form with %s reserved GPUs: %d", huge, code)
	}
	if p1, err := e.m.Store.CurrentPolicy(ctx); err != nil || p1.Version != p0.Version {
		t.Errorf("policy version %d → %d (%v): something changed", p0.Version, p1.Version, err)
	}
}
