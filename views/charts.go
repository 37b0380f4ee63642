package views

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// Charts are plain SVG drawn on the server: no script, no chart library,
// so pages work offline and in tests. The geometry lives here; the markup
// in charts.templ.

// Chart geometry: a LineChart's viewBox is chartW × chartH with the plot
// area inside the margins.
const (
	chartW, chartH         = 640.0, 220.0
	padL, padR, padT, padB = 44.0, 12.0, 10.0, 24.0
	plotW, plotH           = chartW - padL - padR, chartH - padT - padB
	barChartW              = 640.0
	barRowH                = 26.0
	barLabelW, barValueW   = 150.0, 110.0
	barAreaW               = barChartW - barLabelW - barValueW
	barChartTop            = 4.0
	barChartBottom         = 4.0
	chartBarInnerPad       = 4.0
	chartTextSize          = 11
	chartYTickCount        = 4
	chartDefaultYMax       = 1.0
	chartDefaultBarMax     = 1.0
	defaultSeriesClass     = "s1"
	noValue                = -1.0
)

// ChartPoint is one value; Y < 0 (NoValue) breaks the line.
type ChartPoint struct {
	X, Y float64
}

// NoValue marks a point without a value: the line breaks there.
const NoValue = noValue

// ChartSeries is one line of a LineChart.
type ChartSeries struct {
	Name   string
	Class  string // CSS class for the stroke: s1, s2, s3 …
	Dashed bool
	Points []ChartPoint
}

// ChartTick is a labelled position on an axis.
type ChartTick struct {
	At    float64
	Label string
}

// LineChart is a time series chart with a shared y axis from 0 to YMax.
type LineChart struct {
	ID     string // data-testid
	Title  string // accessible name
	YUnit  string
	XMin   float64
	XMax   float64
	YMax   float64
	Series []ChartSeries
	XTicks []ChartTick
	// YTicks default to 0, ¼, ½, ¾ and all of YMax.
	YTicks []ChartTick
}

func (c LineChart) x(v float64) float64 {
	if c.XMax <= c.XMin {
		return padL
	}
	return padL + (v-c.XMin)/(c.XMax-c.XMin)*plotW
}

func (c LineChart) y(v float64) float64 {
	m := c.YMax
	if m <= 0 {
		m = chartDefaultYMax
	}
	return padT + plotH - math.Min(v, m)/m*plotH
}

func num(f float64) string { return strconv.FormatFloat(math.Round(f*10)/10, 'f', -1, 64) }

// lines returns the series' polylines' points, broken at missing values.
func (c LineChart) lines(s ChartSeries) []string {
	var out []string
	var cur []string
	flush := func() {
		if len(cur) > 1 { // a lone point is drawn as a dot
			out = append(out, strings.Join(cur, " "))
		}
		cur = nil
	}
	for _, p := range s.Points {
		if p.Y < 0 || math.IsNaN(p.Y) {
			flush()
			continue
		}
		cur = append(cur, num(c.x(p.X))+","+num(c.y(p.Y)))
	}
	flush()
	return out
}

// dots are the points of one-point runs, which a polyline cannot show.
func (c LineChart) dots(s ChartSeries) [][2]string {
	var out [][2]string
	for i, p := range s.Points {
		if p.Y < 0 || math.IsNaN(p.Y) {
			continue
		}
		prev := i > 0 && s.Points[i-1].Y >= 0
		next := i+1 < len(s.Points) && s.Points[i+1].Y >= 0
		if !prev && !next {
			out = append(out, [2]string{num(c.x(p.X)), num(c.y(p.Y))})
		}
	}
	return out
}

func (c LineChart) yTicks() []ChartTick {
	if len(c.YTicks) > 0 {
		return c.YTicks
	}
	m := c.YMax
	if m <= 0 {
		m = chartDefaultYMax
	}
	var out []ChartTick
	for i := 0; i <= chartYTickCount; i++ {
		v := m * float64(i) / chartYTickCount
		out = append(out, ChartTick{At: v, Label: num(v)})
	}
	return out
}

func (c LineChart) empty() bool {
	for _, s := range c.Series {
		for _, p := range s.Points {
			if p.Y >= 0 {
				return false
			}
		}
	}
	return true
}

func seriesClass(s ChartSeries) string {
	if s.Class == "" {
		return "chart-line " + defaultSeriesClass
	}
	return "chart-line " + s.Class
}

// BarPart is one stacked part of a bar.
type BarPart struct {
	Value float64
	Class string // CSS class for the fill
	Title string // tooltip
}

// Bar is one row of a BarChart.
type Bar struct {
	Label string
	Text  string // the value as shown at the right
	Parts []BarPart
}

// BarChart is a horizontal (stacked) bar chart on a shared scale.
type BarChart struct {
	ID    string
	Title string
	Max   float64 // scale; default: the largest bar
	Bars  []Bar
}

func (b BarChart) height() string {
	return num(barChartTop + barChartBottom + barRowH*float64(max(len(b.Bars), 1)))
}

func (b BarChart) scale() float64 {
	m := b.Max
	for _, bar := range b.Bars {
		var t float64
		for _, p := range bar.Parts {
			t += math.Max(p.Value, 0)
		}
		m = math.Max(m, t)
	}
	if m <= 0 {
		m = chartDefaultBarMax
	}
	return m
}

// barRect is a drawn part.
type barRect struct {
	X, Y, W, H, Class, Title string
}

func (b BarChart) rects(i int) []barRect {
	m := b.scale()
	x := barLabelW
	y := barChartTop + barRowH*float64(i) + chartBarInnerPad
	var out []barRect
	for _, p := range b.Bars[i].Parts {
		w := math.Max(p.Value, 0) / m * barAreaW
		if w <= 0 {
			continue
		}
		out = append(out, barRect{X: num(x), Y: num(y), W: num(w), H: num(barRowH - 2*chartBarInnerPad), Class: "chart-bar " + p.Class, Title: p.Title})
		x += w
	}
	return out
}

func (b BarChart) rowY(i int) string {
	return num(barChartTop + barRowH*float64(i) + barRowH/2 + chartTextSize/2 - 1)
}

// Burn-down chart geometry: a BurnDownChart's viewBox is bdW × bdH with
// the plot inside the margins (room for GPU-hour labels at the left and
// dates below).
const (
	bdW, bdH             = 640.0, 280.0
	bdPadL, bdPadR       = 60.0, 16.0
	bdPadT, bdPadB       = 28.0, 44.0
	bdPlotW, bdPlotH     = bdW - bdPadL - bdPadR, bdH - bdPadT - bdPadB
	bdYTicks             = 4
	bdHeadroom           = 1.08 // the y axis reaches a little above the highest line
	bdDateEvery          = 7    // a date label every week: the 1st, 8th, 15th, 22nd, 29th
	bdLabelGap           = 6.0
	bdTextH              = 12.0
	bdMarkerR            = 4.0
	bdLegendW, bdLegendH = 28.0, 10.0
	bdMinLabelX          = bdPadL + 16
)

// BurnDownRow is one day of the burn-down chart's data table.
type BurnDownRow struct {
	Day, GPUHours, Cumulative string
}

// BurnDownChart is the team page's burn-down: cumulative GPU-hours this
// month against the budget, with the forecast to the month's end. X is in
// days since the month's first instant, Y in GPU-hours.
type BurnDownChart struct {
	Title string // accessible name
	Desc  string // the chart in words (its text alternative)
	Month time.Time
	Days  float64 // the month's length in days
	Now   float64 // days since the month's start: where the usage line ends
	// Used is cumulative usage from (0, 0) to (Now, used so far).
	Used      []ChartPoint
	Budget    float64 // GPU-hours; 0: no budget line
	Projected float64 // GPU-hours at the month's end at the recent rate
	// Cross is when the usage (past) or the forecast (future) reaches the
	// budget, in days; < 0 when it does not within the month.
	Cross float64
	// ForecastLabel names the forecast's rate in the legend ("at the last
	// 7 days' rate").
	ForecastLabel string
	Rows          []BurnDownRow
}

// scale is the y axis: its top and the step between its labels, a round
// number, at most bdYTicks steps up to a little above the highest line.
func (b BurnDownChart) scale() (top, step float64) {
	m := b.Budget
	for _, p := range b.Used {
		m = math.Max(m, p.Y)
	}
	m = math.Max(m, b.Projected) * bdHeadroom
	if m <= 0 || math.IsNaN(m) || math.IsInf(m, 0) {
		return bdYTicks, 1
	}
	step = niceStep(m / bdYTicks)
	return math.Ceil(m/step) * step, step
}

func (b BurnDownChart) top() float64 {
	t, _ := b.scale()
	return t
}

// niceStep rounds v up to 1, 2, 2.5 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func (b BurnDownChart) x(day float64) float64 {
	if b.Days <= 0 {
		return bdPadL
	}
	return bdPadL + math.Max(0, math.Min(day, b.Days))/b.Days*bdPlotW
}

func (b BurnDownChart) y(v float64) float64 {
	return bdPadT + bdPlotH - math.Max(0, math.Min(v, b.top()))/b.top()*bdPlotH
}

func (b BurnDownChart) xs(day float64) string { return num(b.x(day)) }
func (b BurnDownChart) ys(v float64) string   { return num(b.y(v)) }

// yTicks are 0 to the top a round step apart, labelled in GPU-hours.
func (b BurnDownChart) yTicks() []ChartTick {
	top, step := b.scale()
	var out []ChartTick
	for i := 0.0; i*step <= top*(1+1e-9); i++ {
		v := i * step
		out = append(out, ChartTick{At: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return out
}

// dateTicks label the start of every week's first day: Dec 1, Dec 8 …
func (b BurnDownChart) dateTicks() []ChartTick {
	var out []ChartTick
	for d := 0.0; d < b.Days; d += bdDateEvery {
		out = append(out, ChartTick{At: d, Label: b.Month.AddDate(0, 0, int(d)).Format("Jan 2")})
	}
	return out
}

func (b BurnDownChart) last() ChartPoint {
	if len(b.Used) == 0 {
		return ChartPoint{X: b.Now}
	}
	return b.Used[len(b.Used)-1]
}

func (b BurnDownChart) usedPoints() string {
	pts := make([]string, 0, len(b.Used))
	for _, p := range b.Used {
		pts = append(pts, b.xs(p.X)+","+b.ys(p.Y))
	}
	return strings.Join(pts, " ")
}

// area is the usage line closed down to the x axis, shaded so a line near
// the axis still shows.
func (b BurnDownChart) area() string {
	if len(b.Used) == 0 {
		return ""
	}
	base := b.ys(0)
	return b.usedPoints() + " " + b.xs(b.last().X) + "," + base + " " + b.xs(b.Used[0].X) + "," + base
}

func (b BurnDownChart) forecast() string {
	l := b.last()
	return b.xs(l.X) + "," + b.ys(l.Y) + " " + b.xs(b.Days) + "," + b.ys(b.Projected)
}

// usedLabel sits above the usage line's end, on the side with room.
func (b BurnDownChart) usedLabel() (x, y, anchor, text string) {
	l := b.last()
	px, py := b.x(l.X), b.y(l.Y)-bdLabelGap-bdMarkerR
	anchor = "start"
	if px > bdPadL+bdPlotW/2 {
		anchor = "end"
	} else {
		px = math.Max(px, bdPadL) + bdLabelGap
	}
	if py < bdPadT+bdTextH {
		py = b.y(l.Y) + bdTextH + bdMarkerR
	}
	return num(px), num(py), anchor, strconv.FormatFloat(l.Y, 'f', 1, 64) + " GPU-h used"
}

// forecastLabel sits at the right end of the forecast, above it.
func (b BurnDownChart) forecastLabel() (x, y, text string) {
	py := b.y(b.Projected) - bdLabelGap
	if py < bdPadT+bdTextH/2 {
		py = b.y(b.Projected) + bdTextH + bdLabelGap/2
	}
	return num(bdW - bdPadR), num(py), "forecast " + strconv.FormatFloat(b.Projected, 'f', 0, 64) + " GPU-h"
}

func (b BurnDownChart) crossLabel() (x, y, anchor, text string) {
	px := b.x(b.Cross)
	anchor = "middle"
	switch {
	case px > bdW-bdPadR-40:
		anchor = "end"
	case px < bdMinLabelX+40:
		anchor = "start"
	}
	return num(px), num(b.y(b.Budget) + bdTextH + bdLabelGap), anchor, "100 % on " + b.Month.Add(time.Duration(b.Cross*24*float64(time.Hour))).Format("Jan 2")
}

// The plot area's edges, for the markup.
var (
	bdLeft   = num(bdPadL)
	bdRight  = num(bdW - bdPadR)
	bdTop    = num(bdPadT)
	bdBottom = num(bdPadT + bdPlotH)
	bdTickY  = num(bdPadT + bdPlotH + 5)  // the end of a date tick
	bdDateY  = num(bdPadT + bdPlotH + 18) // date labels' baseline
	bdMonthY = num(bdH - 4)
	bdMidX   = num(bdPadL + bdPlotW/2)
)

// NiceTicks is a value axis from 0 to a round top at or above max, with
// at most n steps of 1, 2, 2.5 or 5 times a power of ten, labelled by
// label (nil: the number).
func NiceTicks(max float64, n int, label func(float64) string) (top float64, ticks []ChartTick) {
	if n < 1 {
		n = chartYTickCount
	}
	if max <= 0 || math.IsNaN(max) || math.IsInf(max, 0) {
		max = chartDefaultYMax
	}
	step := niceStep(max / float64(n))
	top = math.Ceil(max/step-1e-9) * step
	for i := 0.0; i*step <= top*(1+1e-9); i++ {
		v := i * step
		l := strconv.FormatFloat(v, 'f', -1, 64)
		if label != nil {
			l = label(v)
		}
		ticks = append(ticks, ChartTick{At: v, Label: l})
	}
	return top, ticks
}
