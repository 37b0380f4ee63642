package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/allotlabs/allot/internal/demo"
)

// TestPagesAreLabelled walks every portal page as the person who uses it
// and checks what screen readers and keyboard users need: a language, one
// h1, a label for every form control, a name for every button, link and
// chart, and no positive tabindex (which breaks the natural tab order).
func TestPagesAreLabelled(t *testing.T) {
	// The checks themselves catch what they look for.
	bad := `<html><main><h1>a</h1><h1>b</h1><input name="q" id="x"><select name="s"></select><button></button>` +
		`<svg></svg><a href="/x" tabindex="3"></a><p id="x"></p></main></html>`
	if got := pageProblems(t, bad); len(got) != 9 {
		t.Fatalf("the checks found %d problems in a bad page, want 9: %q", len(got), got)
	}
	e := boot(t)
	var jobID int64
	if err := e.m.Pool.QueryRow(t.Context(), `SELECT min(id) FROM jobs WHERE team = 'nlp'`).Scan(&jobID); err != nil {
		t.Fatal(err)
	}
	pages := map[string][]string{
		"": {"/login"},
		demo.Engineer: {"/jobs", "/jobs/new", fmt.Sprintf("/jobs/%d", jobID), fmt.Sprintf("/jobs/new?copy=%d", jobID),
			"/teams/nlp", "/rightsizing", "/cluster", "/nodes", "/burst", "/docs", "/tokens"},
		demo.Lead:    {"/teams/nlp", "/finance", "/rightsizing"},
		demo.Finance: {"/finance"},
		demo.Admin: {"/admin", "/admin/tiers", "/admin/rates", "/admin/teams", "/admin/policy", "/admin/health", "/admin/audit",
			"/admin/versions", "/admin/accounts", "/admin/gpu-types", "/nodes/gpu01", "/cluster", "/finance"},
	}
	for persona, paths := range pages {
		var get func(string) (int, string)
		if persona == "" {
			get = e.anon
		} else {
			b := e.login(persona)
			get = b.get
		}
		for _, path := range paths {
			code, html := get(path)
			if code != 200 {
				t.Errorf("%s as %s: %d", path, persona, code)
				continue
			}
			for _, p := range pageProblems(t, html) {
				t.Errorf("%s as %s: %s", path, persona, p)
			}
		}
	}
}

// anon fetches path without a session.
func (e *env) anon(path string) (int, string) {
	return (&browser{e: e, c: &http.Client{}}).get(path)
}

func pageProblems(t *testing.T, html string) []string {
	t.Helper()
	d, err := goquery.NewDocumentFromReader(strings.NewReader(html))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	if d.Find("html[lang]").Length() != 1 {
		out = append(out, "no <html lang>")
	}
	if n := d.Find("main h1").Length(); n != 1 {
		out = append(out, fmt.Sprintf("%d h1 in main, want 1", n))
	}
	d.Find("input, select, textarea").Each(func(_ int, s *goquery.Selection) {
		typ, _ := s.Attr("type")
		switch typ {
		case "hidden", "submit", "button", "reset", "image":
			return
		}
		if _, ok := s.Attr("aria-label"); ok {
			return
		}
		if _, ok := s.Attr("aria-labelledby"); ok {
			return
		}
		if s.ParentsFiltered("label").Length() > 0 {
			return
		}
		if id, ok := s.Attr("id"); ok && id != "" && d.Find(`label[for="`+id+`"]`).Length() > 0 {
			return
		}
		name, _ := s.Attr("name")
		out = append(out, fmt.Sprintf("%s name=%q has no label", goquery.NodeName(s), name))
	})
	d.Find("button, a[href]").Each(func(_ int, s *goquery.Selection) {
		if strings.TrimSpace(s.Text()) != "" || s.AttrOr("aria-label", "") != "" || s.AttrOr("title", "") != "" {
			return
		}
		out = append(out, fmt.Sprintf("%s %q has no accessible name", goquery.NodeName(s), s.AttrOr("href", "")))
	})
	d.Find("svg").Each(func(_ int, s *goquery.Selection) {
		if s.AttrOr("aria-hidden", "") == "true" || s.AttrOr("aria-label", "") != "" || s.Find("title").Length() > 0 {
			return
		}
		out = append(out, "an <svg> chart has no aria-label or <title>")
	})
	d.Find("[tabindex]").Each(func(_ int, s *goquery.Selection) {
		if v := s.AttrOr("tabindex", ""); v != "0" && v != "-1" {
			out = append(out, "positive tabindex "+v)
		}
	})
	ids := map[string]bool{}
	d.Find("[id]").Each(func(_ int, s *goquery.Selection) {
		id := s.AttrOr("id", "")
		if ids[id] {
			out = append(out, "duplicate id "+id)
		}
		ids[id] = true
	})
	return out
}
