package web

import (
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// TestHealthRulesRoundTrip: rules as the API and the form show them parse
// back to the same rules, days included (shown as "2d").
func TestHealthRulesRoundTrip(t *testing.T) {
	in := allot.DefaultHealthRules()
	in[2].For = 48 * time.Hour
	shown := make([]HealthRuleJSON, len(in))
	for i, r := range in {
		shown[i] = ruleJSON(r)
	}
	if shown[2].For != "2d" {
		t.Errorf("48h shown as %q", shown[2].For)
	}
	out, f := parseRules(shown)
	if len(f) != 0 {
		t.Fatalf("the rules as shown do not parse back: %v", f)
	}
	for i := range in {
		if out[i].For != in[i].For || out[i].Name != in[i].Name {
			t.Errorf("rule %d: %+v, want %+v", i, out[i], in[i])
		}
	}
}
