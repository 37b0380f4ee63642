package sim

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/allotlabs/allot/internal/scheduler"
)

// policyColors are fixed per policy so every plot reads the same way.
var policyColors = map[scheduler.Mode]color.RGBA{
	scheduler.ModeAllot:           {R: 0x1b, G: 0x9e, B: 0x77, A: 0xff},
	scheduler.ModeEASY:            {R: 0xd9, G: 0x5f, B: 0x02, A: 0xff},
	scheduler.ModeFIFO:            {R: 0x75, G: 0x70, B: 0xb3, A: 0xff},
	scheduler.ModeFIFOPartitioned: {R: 0xe7, G: 0x29, B: 0x8a, A: 0xff},
}

const utilBins = 300

// utilSeries averages the busy-GPU step function over utilBins equal bins
// of [from, to] (seconds) and returns (hours, utilization) points.
func utilSeries(r *Result, from, to float64) plotter.XYs {
	width := (to - from) / utilBins
	acc := make([]float64, utilBins)
	tl := r.Timeline
	for k, p := range tl {
		end := to
		if k+1 < len(tl) {
			end = tl[k+1].T
		}
		a, b := max(p.T, from), min(end, to)
		if b <= a || p.Busy == 0 {
			continue
		}
		lo := max(0, min(int((a-from)/width), utilBins-1))
		hi := max(0, min(int((b-from)/width), utilBins-1))
		for bin := lo; bin <= hi; bin++ {
			bs, be := from+float64(bin)*width, from+float64(bin+1)*width
			if ov := min(b, be) - max(a, bs); ov > 0 {
				acc[bin] += float64(p.Busy) * ov
			}
		}
	}
	xy := make(plotter.XYs, utilBins)
	for i := range acc {
		xy[i].X = (from + (float64(i)+0.5)*width) / 3600
		xy[i].Y = acc[i] / (width * float64(r.TotalGPUs))
	}
	return xy
}

// cdfSeries is the empirical CDF of the waits (log x axis: a wait below 1 s
// is drawn at 1 s).
func cdfSeries(waits []float64) plotter.XYs {
	const points = 400
	n := len(waits)
	if n == 0 {
		return plotter.XYs{{X: 1, Y: 0}}
	}
	xy := make(plotter.XYs, 0, points+1)
	for k := 0; k <= points; k++ {
		i := min(n-1, k*(n-1)/points)
		xy = append(xy, plotter.XY{X: max(1, waits[i]), Y: float64(i+1) / float64(n)})
	}
	return xy
}

// writePlot draws one SVG (or PNG, by the file's extension) with two panels: utilization over time (top) and
// the wait-time CDF (bottom), one line per policy.
func writePlot(path string, modes []scheduler.Mode, rs []*Result) error {
	// The arrival period plus a quarter of it: the tail of a heavy-tailed
	// trace (a few multi-week jobs) would squeeze everything else.
	from, to, last := math.Inf(1), 0.0, 0.0
	for _, r := range rs {
		from = min(from, r.SpanStartS)
		to = max(to, r.SpanEndS)
		last = max(last, r.SpanStartS+r.MakespanS)
	}
	to = min(last, to+(to-from)/4)
	if !(to > from) {
		to = from + 1
	}
	util := plot.New()
	util.Title.Text = "GPU utilization over time (arrival period + 25 %)"
	util.X.Label.Text = "virtual time (h)"
	util.Y.Label.Text = "busy GPUs / total"
	util.Y.Min, util.Y.Max = 0, 1.05
	util.Add(plotter.NewGrid())

	cdf := plot.New()
	cdf.Title.Text = "wait-time CDF"
	cdf.X.Label.Text = "wait (s, log scale; < 1 s drawn at 1 s)"
	cdf.Y.Label.Text = "fraction of jobs"
	cdf.X.Scale = plot.LogScale{}
	cdf.X.Tick.Marker = plot.LogTicks{Prec: -1}
	cdf.Y.Min, cdf.Y.Max = 0, 1
	cdf.Add(plotter.NewGrid())

	for i, m := range modes {
		c := policyColors[m]
		l, err := plotter.NewLine(utilSeries(rs[i], from, to))
		if err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
		l.Color = c
		util.Add(l)
		util.Legend.Add(string(m), l)

		l2, err := plotter.NewLine(cdfSeries(rs[i].Waits))
		if err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
		l2.Color = c
		l2.Width = vg.Points(1.5)
		cdf.Add(l2)
		cdf.Legend.Add(string(m), l2)
	}
	util.Legend.Top = false
	cdf.Legend.Left = true
	cdf.Legend.Top = true

	const w, h = 8 * vg.Inch, 8 * vg.Inch
	var canvas interface {
		vg.CanvasSizer
		io.WriterTo
	}
	if strings.HasSuffix(strings.ToLower(path), ".png") {
		canvas = vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
	} else {
		canvas = vgsvg.New(w, h)
	}
	dc := draw.New(canvas)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter, PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	plots := [][]*plot.Plot{{util}, {cdf}}
	canvases := plot.Align(plots, tiles, dc)
	util.Draw(canvases[0][0])
	cdf.Draw(canvases[1][0])

	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("--plot: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	return nil
}
