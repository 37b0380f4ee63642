package views_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/a-h/templ"
	"github.com/allotlabs/allot/views"
)

// -update rewrites the golden files. The flag is registered once even if
// another test file of the package registers it too.
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite testdata/*.golden.html")
	}
}

func updateGolden() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

func renderDoc(t *testing.T, c templ.Component) (*goquery.Document, string) {
	t.Helper()
	var buf bytes.Buffer
	if err := c.Render(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	d, err := goquery.NewDocumentFromReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	return d, buf.String()
}

var adminPage = views.Page{Title: "Admin", CSRF: "tok", User: &views.UserBadge{Name: "Ada Admin", Roles: "admin", Admin: true}}

func TestTierFormShowsErrorsAndKeepsWhatWasTyped(t *testing.T) {
	a := views.AdminTiers{Page: adminPage, Tiers: []views.TierForm{
		{ID: "3", Name: "Experiment", Multiplier: "1", Since: "the start", Errors: map[string]string{"multiplier": "must be between 0 and 10"},
			Values:   views.TierFormValues{Name: "Experiment", ClassOrder: "3", Multiplier: "12", MaxRuntime: "7d", ReservedGPUs: "0", MayPreempt: map[string]bool{"4": true}},
			Preempts: []views.Option{{Value: "3", Label: "tier 3"}, {Value: "4", Label: "tier 4"}}},
		{ID: "4", Name: "Exploration", Multiplier: "1", Errors: map[string]string{}, Saved: "Saved tier 4 as policy version 7.",
			Values: views.TierFormValues{Name: "Exploration", ClassOrder: "4", Multiplier: "1", MaxRuntime: "7d", ReservedGPUs: "0", MayPreempt: map[string]bool{}}},
	}}
	d, _ := renderDoc(t, views.AdminTiersView(a))
	form3 := d.Find(`[data-testid="tier-form-3"]`)
	if msg := form3.Find(`[data-testid="error-multiplier"]`).Text(); msg != "must be between 0 and 10" {
		t.Errorf("error %q", msg)
	}
	in := form3.Find(`input[name="multiplier"]`)
	if in.AttrOr("value", "") != "12" || in.AttrOr("aria-invalid", "") != "true" ||
		in.AttrOr("aria-describedby", "") != form3.Find(`[data-testid="error-multiplier"]`).AttrOr("id", "-") {
		t.Errorf("multiplier input %v", in.Nodes[0].Attr)
	}
	if !strings.Contains(form3.Find("header").Text(), "×1 since the start") {
		t.Errorf("header %q shows the typed value, not the stored one", form3.Find("header").Text())
	}
	if form3.Find(`input[name="may_preempt"][value="4"]`).AttrOr("checked", "-") == "-" || form3.Find(`input[name="may_preempt"][value="3"]`).AttrOr("checked", "-") != "-" {
		t.Error("may_preempt boxes do not match the values")
	}
	if d.Find(`[data-testid="tier-form-4"] [data-testid^="error-"]`).Length() != 0 || d.Find(`[data-testid="tier-form-4"] [data-testid="saved"]`).Text() != "Saved tier 4 as policy version 7." {
		t.Error("tier 4's form shows tier 3's errors or lacks its confirmation")
	}
	if d.Find(`[data-testid="tab-tiers"]`).AttrOr("aria-current", "") != "page" {
		t.Error("the tiers tab is not marked current")
	}
	// Every visible input has a label pointing at it, and every id is unique.
	ids := map[string]bool{}
	d.Find(`main input:not([type="hidden"])`).Each(func(_ int, s *goquery.Selection) {
		id := s.AttrOr("id", "")
		if id == "" || d.Find(`label[for="`+id+`"]`).Length() != 1 {
			t.Errorf("input %s (%s) has no label", s.AttrOr("name", ""), id)
		}
		if ids[id] {
			t.Errorf("duplicate id %s", id)
		}
		ids[id] = true
	})
	if d.Find(`main form input[name="_csrf"][value="tok"]`).Length() != 2 {
		t.Error("forms lack the CSRF token")
	}
}

func TestTeamAndPolicyForms(t *testing.T) {
	g := []views.Option{{Value: "A100-80GB", Label: "8"}, {Value: "T4", Label: "0"}}
	a := views.AdminTeams{Page: adminPage,
		Teams: []views.TeamForm{{Slug: "nlp", Name: "NLP", Errors: map[string]string{"webhook_url": "must be an http(s) URL"},
			Values: views.TeamFormValues{Budget: "1000", Weight: "1", Webhook: "ftp://x", Guarantees: g}}},
		New: views.TeamForm{Errors: map[string]string{}, Values: views.TeamFormValues{Budget: "0", Weight: "1", Guarantees: g}}}
	d, _ := renderDoc(t, views.AdminTeamsView(a))
	if d.Find(`[data-testid="team-form-nlp"] [data-testid="error-webhook_url"]`).Length() != 1 ||
		d.Find(`[data-testid="team-form-nlp"] input[name="webhook_url"]`).AttrOr("value", "") != "ftp://x" ||
		d.Find(`[data-testid="team-form-nlp"] input[name="guarantee_A100-80GB"]`).AttrOr("value", "") != "8" {
		t.Error("team form lacks its error, typed webhook or guarantee")
	}
	if d.Find(`[data-testid="team-form-new"] input[name="slug"]`).Length() != 1 || d.Find(`[data-testid="team-form-nlp"] input[name="slug"]`).Length() != 0 {
		t.Error("only the create form asks for a slug")
	}

	p := views.AdminPolicy{Page: adminPage, Version: 12, Errors: map[string]string{"grace_period_s": "invalid duration"},
		Groups: []views.PolicyGroup{{Legend: "Preemption", Fields: []views.PolicyField{
			{Name: "grace_period_s", Label: "Grace period", Value: "2x", Kind: "duration"},
			{Name: "weight_age", Label: "Age weight", Value: "500", Kind: "int"}}}}}
	d, _ = renderDoc(t, views.AdminPolicyView(p))
	if d.Find(`#policy-grace_period_s`).AttrOr("type", "") != "text" || d.Find(`#policy-weight_age`).AttrOr("type", "") != "number" ||
		d.Find(`[data-testid="error-grace_period_s"]`).Text() != "invalid duration" || d.Find(`#policy-grace_period_s`).AttrOr("value", "") != "2x" {
		t.Error("policy form fields")
	}
}

func TestAuditViewShowsBeforeAndAfter(t *testing.T) {
	a := views.AuditPage{Page: adminPage, Filter: views.AuditFilterValues{Kind: "tier"}, CSVURL: "/api/v1/audit.csv?kind=tier", JSONURL: "/api/v1/audit?kind=tier",
		Kinds: []views.Option{{Value: "team", Label: "team"}, {Value: "tier", Label: "tier"}},
		Entries: []views.AuditRow{{ID: 9, At: "2026-11-30 04:00 UTC", Actor: "ada@example.com", Action: "tier.update", Object: "tier:3", PolicyVersion: 12,
			Changes: []views.FieldChange{{Field: "multiplier", Before: "1", After: "1.5"}}, Note: "pricier"}}, Truncated: true}
	d, _ := renderDoc(t, views.AuditView(a))
	row := d.Find(`[data-testid="audit-9"]`)
	if got := row.Find(`[data-testid="change-multiplier"]`).Text(); got != "multiplier: 1 → 1.5" {
		t.Errorf("change %q", got)
	}
	if row.Find(`[data-testid="actor"]`).Text() != "ada@example.com" || row.Find(`[data-testid="note"]`).Text() != "pricier" ||
		!strings.Contains(row.Text(), "12") {
		t.Errorf("row %q", row.Text())
	}
	if d.Find(`select[name="kind"] option[selected]`).AttrOr("value", "") != "tier" || d.Find(`[data-testid="audit-csv"]`).AttrOr("href", "") != "/api/v1/audit.csv?kind=tier" {
		t.Error("filters not kept or export link wrong")
	}
	if d.Find(`[data-testid="truncated"]`).Length() != 1 {
		t.Error("no truncation notice")
	}
}

// docsProps are fixed documentation props for the golden and component
// tests.
func docsProps() views.Docs {
	return views.Docs{Page: views.Page{Title: "Policy documentation", CSRF: "tok", User: &views.UserBadge{Name: "Noah Kim", Roles: "engineer in nlp", Teams: []string{"nlp"}, Submitter: true}},
		Version: 7, VersionAt: "2026-11-30 04:00 UTC", ServerURL: "https://allot.example.com", Currency: "USD",
		Tiers: []views.DocTier{
			{ID: "1", Name: "Production incident", Description: "Incident retraining.", ClassOrder: 1, Production: true, MayPreempt: []string{"tier 3", "tier 4", "tier preemptible"}, MaxRuntime: "2d", Multiplier: "1.5", ReservedGPUs: 16},
			{ID: "3", Name: "Experiment", Description: "Fair share.", ClassOrder: 3, PreemptedBy: []string{"tier 1"}, MaxRuntime: "7d", Multiplier: "1.2"},
			{ID: "preemptible", Name: "Preemptible", ClassOrder: 5, PreemptedBy: []string{"tier 1", "tier 2"}, MaxRuntime: "3d", Multiplier: "0.3"},
		},
		Rates:       []views.DocRate{{GPUType: "A100-80GB", MemoryGB: 80, Rate: "3.20 USD", Since: "2025-10-01 00:00 UTC", Next: "3.50 USD from 2027-01-01 00:00 UTC"}},
		GracePeriod: "2m", MinRuntime: "10m", Cycle: "10s",
		Weights:       views.DocWeights{Order: "response", Tier1FIFO: true, FairShare: 10000, Size: 1000, Age: 500, HalfLife: "7d", MaxAge: "7d"},
		BudgetWarnPct: 80, BudgetDemotePct: 100,
		Teams: []views.DocTeam{{Slug: "nlp", Name: "NLP", Budget: "1000", WarnAt: "800 h", DemoteAt: "1000 h", Guarantees: "8 × A100-80GB", Weight: 1, HasBudget: true, BudgetHours: 1000}},
		Example: views.DocExample{GPUs: 8, GPUType: "A100-80GB", Duration: "3h30m", GPUHours: "28", Rate: "3.20 USD",
			Lines: []views.DocExampleLine{{Tier: "3", Multiplier: "1.2", Amount: "107.52 USD"}, {Tier: "preemptible", Multiplier: "0.3", Amount: "26.88 USD"}}},
		Burst:                views.DocBurst{PendingGPUHours: 50, ReleaseGPUHours: 20, MeanWait: "2h", MaxNodes: 4, MonthlyBudget: "5000.00 USD", Every: "1m"},
		HealthRules:          []views.DocHealthRule{{Name: "xid-fatal", Metric: "xid", Match: "48, 79", Over: "—", For: "at once", Severity: "critical", Action: "drain"}},
		HeartbeatMissedAfter: "1m",
	}
}

func TestDocsViewFigures(t *testing.T) {
	d, _ := renderDoc(t, views.DocsView(docsProps()))
	for sel, want := range map[string]string{
		`[data-testid="docs-tier-3"] [data-testid="multiplier"]`: "×1.2",
		`[data-testid="grace"]`:                                  "2m",
		`[data-testid="min-runtime"]`:                            "10m",
		`[data-testid="warn-pct"]`:                               "80 %",
		`[data-testid="docs-example-3"] td:last-child`:           "107.52 USD",
	} {
		if got := d.Find(sel).Text(); got != want {
			t.Errorf("%s = %q, want %q", sel, got, want)
		}
	}
	if got := d.Find(`[data-testid="docs-tier-1"]`).Text(); !strings.Contains(got, "never (production)") {
		t.Errorf("tier 1 row %q", got)
	}
	if got := d.Find(`[data-testid="docs-curl"]`).Text(); !strings.Contains(got, "curl -X POST https://allot.example.com/api/v1/jobs") || !strings.Contains(got, `"gpu_type":"A100-80GB"`) {
		t.Errorf("curl %q", got)
	}
	if got := d.Find(`[data-testid="docs-version"]`).Text(); !strings.Contains(got, "policy version 7") || !strings.Contains(got, "2026-11-30 04:00 UTC") {
		t.Errorf("version line %q", got)
	}
	if got := d.Find(`[data-testid="docs-pytorch"]`).Text(); !strings.Contains(got, `os.environ["ALLOT_CHECKPOINT_DIR"]`) || !strings.Contains(got, "signal.SIGTERM") {
		t.Errorf("checkpoint example %q", got)
	}
}

// TestDocsGolden pins the documentation page for fixed props; run
// with -update after an intended change and review the diff.
func TestDocsGolden(t *testing.T) {
	// The page's own content: the layout around it (navigation, static
	// URLs with content hashes) belongs to other tests.
	d, _ := renderDoc(t, views.DocsView(docsProps()))
	html, err := d.Find("main").Html()
	if err != nil {
		t.Fatal(err)
	}
	html = strings.TrimSpace(html) + "\n"
	path := filepath.Join("testdata", "docs.golden.html")
	if updateGolden() {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(html), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./views -run TestDocsGolden -update)", err)
	}
	if string(want) != html {
		t.Errorf("docs page differs from %s (run with -update if intended):\n got: %s", path, html)
	}
}
