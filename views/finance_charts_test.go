package views

import (
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
)

func TestNiceTicks(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		max  float64
		top  float64
		want string
	}{
		{150, 150, "0 50 100 150"},
		{100, 100, "0 25 50 75 100"},
		{0, 1, "0 0.25 0.5 0.75 1"},
		{9518.75, 10000, "0 2500 5000 7500 10000"},
	} {
		top, ticks := NiceTicks(tt.max, 4, nil)
		var got []string
		for _, k := range ticks {
			got = append(got, k.Label)
		}
		if top != tt.top || strings.Join(got, " ") != tt.want {
			t.Errorf("NiceTicks(%v) = %v %q, want %v %q", tt.max, top, got, tt.top, tt.want)
		}
	}
}

// TestCapacitySectionView: the capacity chart is an SVG with a name, one
// bar per GPU type stacked allocated / idle / drained, and the table.
func TestCapacitySectionView(t *testing.T) {
	t.Parallel()
	c := FinanceCapacity{Period: "p", Currency: "EUR", JSONURL: "/j", CSVURL: "/c",
		Chart: BarChart{ID: "chart-capacity", Title: "capacity", Bars: []Bar{{Label: "H100", Text: "25.0 %",
			Parts: []BarPart{{Value: 1, Class: "b-alloc"}, {Value: 2, Class: "b-idle"}, {Value: 1, Class: "b-out"}}}}},
		Rows:  []CapacityRow{{GPUType: "H100", Site: "onprem", Registered: "4.0000", UnrecoveredCost: "7.50"}},
		Total: CapacityRow{GPUType: "Total", Registered: "4.0000", UnrecoveredCost: "7.50"}}
	_, d := render(t, capacitySection(c))
	svg := testid(d, "chart-capacity").Find("svg")
	if svg.AttrOr("role", "") != "img" || svg.AttrOr("aria-label", "") != "capacity" {
		t.Errorf("capacity chart svg: role %q label %q", svg.AttrOr("role", ""), svg.AttrOr("aria-label", ""))
	}
	var parts []string
	svg.Find("rect.chart-bar").Each(func(_ int, s *goquery.Selection) {
		parts = append(parts, s.AttrOr("class", "")+"@"+s.AttrOr("width", ""))
	})
	if strings.Join(parts, " ") != "chart-bar b-alloc@95 chart-bar b-idle@190 chart-bar b-out@95" {
		t.Errorf("bars %q", parts)
	}
	if got := testid(d, "capacity-row").Find(`[data-testid="unrecovered"]`).Text(); got != "7.50" {
		t.Errorf("unrecovered cell %q", got)
	}
}
