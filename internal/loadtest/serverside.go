package loadtest

import (
	"math"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// ServerOp is one route's time inside the server over the window, from its
// allot_http_request_duration_seconds histogram: from when admission
// control let the request in to the answer written (the wait for a slot is
// apart: AdmissionWait). What the tool's own figures add to both is the
// network, the kernel's accept queue and this process's own wait for a
// core (on one machine with the server, the simulated agents and clients
// share its cores).
type ServerOp struct {
	Route string  `json:"route"` // "POST /api/agent/v1/heartbeat"
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"` // interpolated within the histogram's buckets
	P99   float64 `json:"p99_ms"`
	// Over is how many took longer than the largest finite bucket (5 s).
	Over int `json:"over_largest_bucket"`
}

// serverHist is one route's cumulative bucket counts.
type serverHist struct {
	bounds []float64 // seconds, ascending, finite
	counts []float64 // cumulative, one per bound
	total  float64
}

// serverTimesOf reads the server's per-route latency histograms, keyed
// "METHOD route", and admission control's wait per level, keyed
// "admission wait: LEVEL".
func serverTimesOf(fams []*dto.MetricFamily) map[string]serverHist {
	out := map[string]serverHist{}
	for _, f := range fams {
		if f.GetName() != "allot_http_request_duration_seconds" && f.GetName() != "allot_admission_wait_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			route, _ := labelOf(m, "route")
			method, _ := labelOf(m, "method")
			level, _ := labelOf(m, "level")
			h := m.GetHistogram()
			var sh serverHist
			for _, b := range h.GetBucket() {
				if math.IsInf(b.GetUpperBound(), 1) {
					continue
				}
				sh.bounds = append(sh.bounds, b.GetUpperBound())
				sh.counts = append(sh.counts, float64(b.GetCumulativeCount()))
			}
			sh.total = float64(h.GetSampleCount())
			key := method + " " + route
			if level != "" {
				key = admissionKey + level
			}
			if prev, ok := out[key]; ok && len(prev.counts) == len(sh.counts) {
				// Another process's series of the same route or level
				// (two servers of one role): the same buckets, summed.
				for i := range sh.counts {
					sh.counts[i] += prev.counts[i]
				}
				sh.total += prev.total
			}
			out[key] = sh
		}
	}
	return out
}

// serverOpsIn is, for the routes the load used (the agent API but its
// long poll, and job submission), what the server spent on them between
// two readings.
func serverOpsIn(before, after map[string]serverHist) []ServerOp {
	var out []ServerOp
	for key, a := range after {
		if !strings.HasPrefix(key, admissionKey) && (!strings.Contains(key, "/api/agent/v1/") && key != "POST /api/v1/jobs" || strings.HasSuffix(key, "/orders")) {
			continue // a long poll's time is how long the server had nothing to say
		}
		b := before[key]
		d := serverHist{bounds: a.bounds, counts: make([]float64, len(a.counts)), total: a.total - b.total}
		for i := range a.counts {
			d.counts[i] = a.counts[i]
			if i < len(b.counts) {
				d.counts[i] -= b.counts[i]
			}
		}
		if d.total <= 0 {
			continue
		}
		op := ServerOp{Route: key, Count: int(d.total), P50: round1(d.quantile(0.50) * 1000), P99: round1(d.quantile(0.99) * 1000)}
		if n := len(d.counts); n > 0 {
			op.Over = int(d.total - d.counts[n-1])
		}
		out = append(out, op)
	}
	slices.SortFunc(out, func(x, y ServerOp) int { return strings.Compare(x.Route, y.Route) })
	return out
}

// admissionKey prefixes the levels of admission control's wait
// (allot_admission_wait_seconds: the admitted requests' wait for a slot).
const admissionKey = "admission wait: "

// quantile interpolates linearly inside the bucket the quantile falls in,
// as Prometheus' histogram_quantile does; past the largest finite bucket
// it answers that bucket's bound.
func (h serverHist) quantile(q float64) float64 {
	rank := q * h.total
	lo, prev := 0.0, 0.0
	for i, c := range h.counts {
		if c >= rank {
			if c == prev {
				return h.bounds[i]
			}
			return lo + (h.bounds[i]-lo)*(rank-prev)/(c-prev)
		}
		lo, prev = h.bounds[i], c
	}
	if len(h.bounds) == 0 {
		return 0
	}
	return h.bounds[len(h.bounds)-1]
}
