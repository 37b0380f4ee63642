package web

import (
	"net/http"
	"slices"
	"testing"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/google/go-cmp/cmp"
	"github.com/labstack/echo/v4"
)

func TestSafeNext(t *testing.T) {
	for next, want := range map[string]string{
		"":                          "/jobs",
		"/teams/nlp?tab=alerts":     "/teams/nlp?tab=alerts",
		"/jobs/42":                  "/jobs/42",
		"https://evil.example/":     "/jobs",
		"//evil.example/x":          "/jobs",
		"/\\evil.example":           "/jobs",
		"http:/evil.example":        "/jobs",
		"javascript:alert(1)":       "/jobs",
		"evil.example":              "/jobs",
		"/jobs\r\nSet-Cookie: x=1":  "/jobs",
		"/login":                    "/jobs",
		"/login/oidc?next=/admin":   "/jobs",
		"/oidc/callback?state=s":    "/jobs",
		"/%2F%2Fevil.example":       "/%2F%2Fevil.example", // a path on this site
		"/ok?next=https://evil.com": "/ok?next=https://evil.com",
	} {
		if got := safeNext(next); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}

func TestClaimMapping(t *testing.T) {
	m := ClaimMapping{}.WithDefaults()
	admin, finance, ms := m.Map([]string{"staff", "team:nlp", "team:fraud:lead", "team:fraud", "team:Bad Slug", "allot-finance", "team:"})
	want := []allot.Membership{{Team: "fraud", Role: allot.TeamRoleLead}, {Team: "nlp", Role: allot.TeamRoleMember}}
	if admin || !finance || !cmp.Equal(ms, want) {
		t.Errorf("default mapping: admin=%v finance=%v %v", admin, finance, ms)
	}
	custom := ClaimMapping{AdminGroup: "gpu-admins", FinanceGroup: "fin", TeamPrefix: "allot-team-", LeadSuffix: "-leads"}
	admin, finance, ms = custom.Map([]string{"gpu-admins", "allot-team-recs-leads", "allot-admins", "team:nlp"})
	if !admin || finance || !cmp.Equal(ms, []allot.Membership{{Team: "recs", Role: allot.TeamRoleLead}}) {
		t.Errorf("custom mapping: admin=%v finance=%v %v", admin, finance, ms)
	}
	if admin, finance, ms = m.Map(nil); admin || finance || ms != nil {
		t.Errorf("no groups: admin=%v finance=%v %v", admin, finance, ms)
	}
}

// TestUnguarded: a route added to the router directly, bypassing route and
// its rule, is reported (the authorization-matrix test needs none).
func TestUnguarded(t *testing.T) {
	s := New(Config{})
	if u := s.Unguarded(); len(u) != 0 {
		t.Fatalf("routes without a rule: %v", u)
	}
	s.e.GET("/sneaky", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	s.e.Any("/sneaky/any", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	u := s.Unguarded()
	if !slices.Contains(u, "GET /sneaky") || !slices.Contains(u, "POST /sneaky/any") {
		t.Errorf("Unguarded() = %v, want the sneaky routes", u)
	}
}
