// Package metric defines Allot's Prometheus metrics. They are registered on
// a registry passed in from main, never on the global default.
package metric

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// HTTP holds the HTTP server's request metrics.
type HTTP struct {
	Requests *prometheus.CounterVec
	Duration *prometheus.HistogramVec
	InFlight prometheus.Gauge
	// KnownRefusedAgent counts agent requests (heartbeats, lease reports)
	// admission control refused with a node token this server knew: signs
	// of their nodes' life.
	KnownRefusedAgent prometheus.Counter
}

// NewHTTP creates the HTTP metrics and registers them on reg.
func NewHTTP(reg prometheus.Registerer) *HTTP {
	m := &HTTP{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_http_requests_total", Help: "HTTP requests by route, method and status code.",
		}, []string{"route", "method", "code"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "allot_http_request_duration_seconds", Help: "HTTP request latency by route and method.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route", "method"}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "allot_http_requests_in_flight", Help: "HTTP requests being served.",
		}),
		KnownRefusedAgent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "allot_refused_agent_requests_counted_total",
			Help: "Agent requests (heartbeats, lease reports, logs) refused by admission control (the server was overloaded) with a node token that authenticated here in the last 10 minutes: counted as their node's sign of life, so it is not marked down.",
		}),
	}
	reg.MustRegister(m.Requests, m.Duration, m.InFlight, m.KnownRefusedAgent)
	return m
}

// NewRegistry returns a registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
