package views

import (
	"math"
	"strconv"
	"strings"
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
