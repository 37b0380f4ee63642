package web

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
)

// burnDownUsage is a month of hoursPerDay every day up to upTo (today's
// share pro rata).
func burnDownUsage(month, upTo time.Time, budget int64, hoursPerDay float64) store.TeamUsage {
	u := store.TeamUsage{Team: "nlp", BudgetGPUHours: budget, Month: month, UpTo: upTo}
	for d := month; d.Before(upTo); d = d.AddDate(0, 0, 1) {
		part := min(upTo.Sub(d), 24*time.Hour)
		s := int64(hoursPerDay * 3600 * part.Hours() / 24)
		u.Daily = append(u.Daily, store.DayUsage{Day: d, GPUSeconds: s})
		u.UsedGPUSeconds += s
	}
	return u
}

func renderBurnDown(t *testing.T, c views.BurnDownChart) (string, *goquery.Document) {
	t.Helper()
	var b bytes.Buffer
	if err := views.BurnDownView(c).Render(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	d, err := goquery.NewDocumentFromReader(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return b.String(), d
}

func points(t *testing.T, s string) [][2]float64 {
	t.Helper()
	var out [][2]float64
	for _, p := range strings.Fields(s) {
		x, y, ok := strings.Cut(p, ",")
		fx, err1 := strconv.ParseFloat(x, 64)
		fy, err2 := strconv.ParseFloat(y, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("point %q of %q", p, s)
		}
		out = append(out, [2]float64{fx, fy})
	}
	return out
}

func attrF(t *testing.T, s *goquery.Selection, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s.AttrOr(name, "?"), 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s.AttrOr(name, ""), err)
	}
	return v
}

// TestBurnDownChart: the team page's burn-down has a dated x axis, a
// GPU-hour y axis, the usage line, the forecast to the month's end, the
// budget line with where it is reached, today, a legend, an accessible name
// and description, and the figures as a table. Months of every length and
// the month's first seconds draw without a gap or a NaN.
func TestBurnDownChart(t *testing.T) {
	t.Parallel()
	const plotLeft, plotRight, plotTop, plotBottom = 60.0, 624.0, 28.0, 236.0
	for _, tt := range []struct {
		name        string
		month, upTo time.Time
		budget      int64
		perDay      float64
		dates       []string
		cross       string // "" when the budget is not reached this month
		desc        []string
	}{
		{name: "leap February, reaches the budget later", month: time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC), upTo: time.Date(2028, 2, 15, 12, 0, 0, 0, time.UTC),
			budget: 3000, perDay: 150, dates: []string{"Feb 1", "Feb 8", "Feb 15", "Feb 22", "Feb 29"}, cross: "100 % on Feb 21",
			desc: []string{"2175.0 GPU-hours used by Feb 15, 12:00 UTC of a 3000 GPU-hour budget (72 %)", "4350 GPU-hours on Feb 29", "it reaches the budget on Feb 21."}},
		{name: "over budget since the 10th", month: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), upTo: time.Date(2026, 12, 20, 12, 0, 0, 0, time.UTC),
			budget: 2000, perDay: 220, dates: []string{"Dec 1", "Dec 8", "Dec 15", "Dec 22", "Dec 29"}, cross: "100 % on Dec 10",
			desc: []string{"of a 2000 GPU-hour budget (214 %)", "the budget was reached on Dec 10."}},
		{name: "under budget all month", month: time.Date(2027, 4, 1, 0, 0, 0, 0, time.UTC), upTo: time.Date(2027, 4, 10, 6, 0, 0, 0, time.UTC),
			budget: 4000, perDay: 40, dates: []string{"Apr 1", "Apr 8", "Apr 15", "Apr 22", "Apr 29"},
			desc: []string{"(30 % of the budget)."}},
		{name: "the month's first seconds", month: time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC), upTo: time.Date(2027, 3, 1, 0, 0, 20, 0, time.UTC),
			budget: 3000, perDay: 100, dates: []string{"Mar 1", "Mar 8", "Mar 15", "Mar 22", "Mar 29"}, cross: "100 % on Mar 31",
			desc: []string{"used by Mar 1, 00:00 UTC of a 3000 GPU-hour budget (0 %)", "Forecast at today's rate"}},
		{name: "no budget", month: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), upTo: time.Date(2026, 11, 12, 0, 0, 0, 0, time.UTC),
			perDay: 10, dates: []string{"Nov 1", "Nov 8", "Nov 15", "Nov 22", "Nov 29"}, desc: []string{"no budget is set."}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			u := burnDownUsage(tt.month, tt.upTo, tt.budget, tt.perDay)
			f := forecast(&u)
			c := burnDown("nlp", &u, f)
			html, d := renderBurnDown(t, c)
			if strings.Contains(html, "NaN") || strings.Contains(html, "Inf") {
				t.Fatalf("NaN or Inf in the chart:\n%s", html)
			}
			svg := d.Find(`svg[data-testid="burndown"]`)
			if svg.Length() != 1 || svg.AttrOr("role", "") != "img" {
				t.Fatal("no burn-down svg with role img")
			}
			// Accessible name and description, and the description in words
			// under the chart.
			title := d.Find("#" + svg.AttrOr("aria-labelledby", "-"))
			desc := d.Find("#" + svg.AttrOr("aria-describedby", "-"))
			if !strings.Contains(title.Text(), "Team nlp: cumulative GPU-hours in "+tt.month.Format("January 2006")) || svg.Find("title").Text() != title.Text() {
				t.Errorf("accessible name %q", title.Text())
			}
			if desc.Text() != c.Desc || svg.Find("desc").Text() != c.Desc || c.Desc == "" {
				t.Errorf("description %q, svg desc %q", desc.Text(), svg.Find("desc").Text())
			}
			for _, w := range tt.desc {
				if !strings.Contains(c.Desc, w) {
					t.Errorf("description %q lacks %q", c.Desc, w)
				}
			}
			// The x axis: dated ticks a week apart, from the plot's left edge.
			var dates []string
			var xs []float64
			svg.Find(`[data-testid="x-axis"] [data-testid="x-tick"]`).Each(func(_ int, s *goquery.Selection) {
				dates = append(dates, s.Text())
				xs = append(xs, attrF(t, s, "x"))
			})
			if strings.Join(dates, ",") != strings.Join(tt.dates, ",") || xs[0] != plotLeft {
				t.Errorf("date ticks %q at %v", dates, xs)
			}
			if svg.Find(`[data-testid="x-axis"] line.chart-axis`).Length() < 2 || svg.Find(`[data-testid="y-axis"] line.chart-axis`).Length() != 1 {
				t.Error("axis lines missing")
			}
			// The y axis: 0 at the bottom up to at least the largest line.
			var ticks []float64
			svg.Find(`[data-testid="y-tick"]`).Each(func(_ int, s *goquery.Selection) {
				v, err := strconv.ParseFloat(s.Text(), 64)
				if err != nil {
					t.Fatalf("y tick %q", s.Text())
				}
				ticks = append(ticks, v)
			})
			if len(ticks) < 3 || len(ticks) > 5 || ticks[0] != 0 || ticks[len(ticks)-1] < float64(tt.budget) || ticks[len(ticks)-1] < c.Projected {
				t.Fatalf("y ticks %v (budget %d, projected %.1f)", ticks, tt.budget, c.Projected)
			}
			top := ticks[len(ticks)-1]
			yOf := func(v float64) float64 { return plotBottom - v/top*(plotBottom-plotTop) }
			xOf := func(day float64) float64 { return plotLeft + day/c.Days*(plotRight-plotLeft) }
			near := func(a, b float64) bool { return a-b < 0.11 && b-a < 0.11 }
			// The usage line: from the origin, one point per day, ending now
			// at the month's usage; and its marker.
			used := points(t, svg.Find(`[data-testid="burndown-used"]`).AttrOr("points", ""))
			usedH := float64(u.UsedGPUSeconds) / 3600
			now := tt.upTo.Sub(tt.month).Hours() / 24
			if len(used) != len(u.Daily)+1 || used[0] != [2]float64{plotLeft, plotBottom} ||
				!near(used[len(used)-1][0], xOf(now)) || !near(used[len(used)-1][1], yOf(usedH)) {
				t.Errorf("usage line %v: want %d points ending at %.1f,%.1f", used, len(u.Daily)+1, xOf(now), yOf(usedH))
			}
			if svg.Find("circle.bd-used-dot").Length() != 1 || svg.Find("polygon.bd-area").Length() != 1 {
				t.Error("usage marker or shading missing")
			}
			// The forecast: from now to the month's end at the projection.
			fc := points(t, svg.Find(`[data-testid="burndown-forecast"]`).AttrOr("points", ""))
			if len(fc) != 2 || fc[0] != used[len(used)-1] || fc[1][0] != plotRight || !near(fc[1][1], yOf(c.Projected)) ||
				svg.Find(`[data-testid="burndown-forecast"]`).AttrOr("stroke-dasharray", "") == "" {
				t.Errorf("forecast %v, projected %.1f", fc, c.Projected)
			}
			// Today.
			if today := svg.Find(`[data-testid="burndown-today"]`); !near(attrF(t, today, "x1"), xOf(now)) {
				t.Errorf("today at x %s, want %.1f", today.AttrOr("x1", ""), xOf(now))
			}
			// The budget line, and where the budget is reached.
			budget, cross := svg.Find(`[data-testid="burndown-budget"]`), svg.Find(`[data-testid="burndown-cross"]`)
			legend := d.Find(`[data-testid="burndown-legend"]`)
			if tt.budget == 0 {
				if budget.Length() != 0 || cross.Length() != 0 || legend.Find(`[data-testid="legend-budget"]`).Length() != 0 {
					t.Error("a budget line without a budget")
				}
			} else {
				if budget.Length() != 1 || attrF(t, budget, "y1") != attrF(t, budget, "y2") || !near(attrF(t, budget, "y1"), yOf(float64(tt.budget))) ||
					attrF(t, budget, "x1") != plotLeft || attrF(t, budget, "x2") != plotRight || !strings.Contains(html, "budget "+strconv.FormatInt(tt.budget, 10)+" GPU-h") {
					t.Errorf("budget line y=%s, want %.1f", budget.AttrOr("y1", ""), yOf(float64(tt.budget)))
				}
				if (cross.Length() == 1) != (tt.cross != "") || tt.cross != "" && !strings.Contains(html, tt.cross) {
					t.Errorf("budget reached: marker %d, want %q", cross.Length(), tt.cross)
				}
			}
			// The legend names every line.
			for _, id := range []string{"legend-used", "legend-forecast", "legend-today"} {
				if legend.Find(`[data-testid="`+id+`"] svg line`).Length() != 1 || strings.TrimSpace(legend.Find(`[data-testid="`+id+`"]`).Text()) == "" {
					t.Errorf("legend lacks %s", id)
				}
			}
			if tt.budget > 0 && legend.Find(`[data-testid="legend-budget"]`).Length() != 1 {
				t.Error("legend lacks the budget")
			}
			// The figures as a table: one row a day, the last one cumulative.
			rows := d.Find(`[data-testid="burndown-data"] tbody tr`)
			if rows.Length() != len(u.Daily) {
				t.Errorf("%d data rows, want %d", rows.Length(), len(u.Daily))
			}
			if last := strings.TrimSpace(rows.Last().Find("td").Last().Text()); last != strconv.FormatFloat(usedH, 'f', 1, 64) {
				t.Errorf("last cumulative %q, want %.1f", last, usedH)
			}
		})
	}
}
