package loadtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
)

// op collects one operation's outcomes: the latency of every success and
// the failures by status ("503", "network" for no answer at all).
type op struct {
	name string
	off  *atomic.Bool
	mu   sync.Mutex
	lat  []time.Duration
	errs map[string]int
	// first keeps the first failure's text, so a report can say why.
	first string
}

// ops is the set of operations a run records, in the order they were
// first used (the report keeps that order).
type ops struct {
	mu    sync.Mutex
	order []*op
	by    map[string]*op
	// off, while set, drops what calls record (the warm-up).
	off atomic.Bool
}

func newOps() *ops { return &ops{by: map[string]*op{}} }

func (o *ops) get(name string) *op {
	o.mu.Lock()
	defer o.mu.Unlock()
	if p, ok := o.by[name]; ok {
		return p
	}
	p := &op{name: name, errs: map[string]int{}, off: &o.off}
	o.by[name] = p
	o.order = append(o.order, p)
	return p
}

// record notes one call that took d. A call cut short because the run
// ended (its context is done) is not counted either way: it says nothing
// about the server.
func (p *op) record(ctx context.Context, d time.Duration, err error) {
	if err != nil && ctx.Err() != nil || p.off.Load() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		p.lat = append(p.lat, d)
		return
	}
	p.errs[errorClass(err)]++
	if p.first == "" {
		p.first = err.Error()
	}
}

// errorClass is the HTTP status an error carries, or "network" when the
// server gave no answer.
func errorClass(err error) string {
	var s *statusError
	if errors.As(err, &s) {
		return fmt.Sprint(s.status)
	}
	if st := agentproto.ErrorStatus(err); st != 0 {
		return fmt.Sprint(st)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "network"
}

// statusError is a non-2xx answer to one of the tool's own HTTP calls.
type statusError struct {
	status int
	body   string
}

func (e *statusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.status, e.body) }

// OpReport is one operation's figures over the run. Latencies are in
// milliseconds, over the successful calls; Rate is successes per second
// of the measured window.
type OpReport struct {
	Name       string         `json:"name"`
	Count      int            `json:"count"` // successful calls
	Errors     int            `json:"errors"`
	ByStatus   map[string]int `json:"errors_by_status,omitempty"`
	FirstError string         `json:"first_error,omitempty"`
	Rate       float64        `json:"rate_per_s"`
	P50        float64        `json:"p50_ms"`
	P90        float64        `json:"p90_ms"`
	P95        float64        `json:"p95_ms"`
	P99        float64        `json:"p99_ms"`
	Max        float64        `json:"max_ms"`
}

func (p *op) report(window time.Duration) OpReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	lat := slices.Clone(p.lat)
	slices.Sort(lat)
	r := OpReport{Name: p.name, Count: len(lat), FirstError: p.first}
	for k, n := range p.errs {
		if r.ByStatus == nil {
			r.ByStatus = map[string]int{}
		}
		r.ByStatus[k] = n
		r.Errors += n
	}
	if window > 0 {
		r.Rate = round1(float64(len(lat)) / window.Seconds())
	}
	r.P50, r.P90, r.P95, r.P99, r.Max = pct(lat, .50), pct(lat, .90), pct(lat, .95), pct(lat, .99), pct(lat, 1)
	return r
}

// pct is the nearest-rank percentile q of sorted, in ms to 0.1.
func pct(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	i = max(0, min(i, len(sorted)-1))
	return ms(sorted[i])
}

func ms(d time.Duration) float64 { return round1(float64(d) / float64(time.Millisecond)) }

func round1(x float64) float64 {
	if x < 0 {
		return -round1(-x)
	}
	return float64(int64(x*10+0.5)) / 10
}

// sortedKeys returns m's keys in order (for stable text output).
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
