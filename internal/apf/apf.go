// Package apf is the server's admission control by priority level, after
// Kubernetes' API Priority and Fairness (issue 16: 1,000 agents'
// heartbeats waited behind 32 concurrent submissions on a CPU-bound
// server, p99 891 ms).
//
// Every request is classified, before authentication and before any
// database work, into one of three priority levels or exempted:
//
//   - heartbeat: the node agents' heartbeats (POST
//     /api/agent/v1/heartbeat), a node's proof of life;
//   - agent: the rest of the agents' API (/api/agent/v1: lease reports,
//     registration, job logs). With the heartbeats' level it has its own
//     in-flight limit and queue, so no amount of user traffic takes their
//     slots, and lease reports that wait on a job's row lock (a cycle
//     starting work) never take a heartbeat's;
//   - write: the user API's and the portal's writes (POST, PUT, DELETE…:
//     submissions, cancels, admin edits);
//   - read: the user API's and the portal's reads (GET, HEAD);
//   - exempt, never counted nor queued: /healthz, /readyz, /metrics,
//     static files, the agents' orders long poll (it waits up to a minute
//     for work; a slot held while it waits would starve the level, and
//     each node has one), and the CSV exports, which stream for as long as
//     the client reads and are bounded by their own database pool.
//
// A level runs at most MaxInFlight requests at once. A request past that
// waits in the level's queue (QueueLength requests at most, QueueWait at
// most), and when a slot frees the level takes the next request round
// robin across flows: a flow is one API token, portal session or node
// token (a client IP without one), so one heavy token shares the slots
// equally with every other caller that waits. When the queue is full, a
// request whose flow has fewer requests queued than the longest flow
// takes the place of that flow's newest request (which is refused): one
// token can fill an idle queue but not keep others out of it. A request
// refused (queue full, or waited QueueWait) gets 429 with Retry-After, a
// problem JSON body on the API, like the rate limits' refusals.
package apf

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/allotlabs/allot/web"
	"github.com/prometheus/client_golang/prometheus"
)

// Level names, as the metrics' level label shows them.
const (
	Heartbeat = "heartbeat"
	Agent     = "agent"
	Write     = "write"
	Read      = "read"
)

// Limits is one priority level's bounds. A zero MaxInFlight admits every
// request at once (no limit, no queue).
type Limits struct {
	MaxInFlight int           // requests executing at once (0: no limit)
	QueueLength int           // requests waiting at most (0: none wait; past MaxInFlight they are refused)
	QueueWait   time.Duration // longest a request waits for a slot
}

// Config is the server's levels. The zero value admits everything (tests;
// `allot server` sets Default).
type Config struct {
	Heartbeat, Agent, Write, Read Limits
}

// Default is `allot server`'s: 8 user writes and 16 reads at once (more
// lengthens heartbeats and every other request on a CPU-bound server, see
// the README's figures), 64 heartbeats and 64 other agent requests, a
// queue of 256 per user level and 4,096 per agent level (every node at
// once after a restart), 10 s of waiting at most.
var Default = Config{
	Heartbeat: Limits{MaxInFlight: 64, QueueLength: 4096, QueueWait: 10 * time.Second},
	Agent:     Limits{MaxInFlight: 64, QueueLength: 4096, QueueWait: 10 * time.Second},
	Write:     Limits{MaxInFlight: 8, QueueLength: 256, QueueWait: 10 * time.Second},
	Read:      Limits{MaxInFlight: 16, QueueLength: 256, QueueWait: 10 * time.Second},
}

// Validate says what is wrong with c, if anything.
func (c Config) Validate() error {
	for _, l := range []struct {
		name string
		l    Limits
	}{{Heartbeat, c.Heartbeat}, {Agent, c.Agent}, {Write, c.Write}, {Read, c.Read}} {
		if l.l.MaxInFlight < 0 || l.l.QueueLength < 0 || l.l.QueueWait < 0 {
			return fmt.Errorf("the %s level's in-flight limit, queue length and queue wait must be 0 or more", l.name)
		}
	}
	return nil
}

// Enabled reports whether any level limits anything.
func (c Config) Enabled() bool {
	return c.Heartbeat.MaxInFlight > 0 || c.Agent.MaxInFlight > 0 || c.Write.MaxInFlight > 0 || c.Read.MaxInFlight > 0
}

// Rejection reasons, as the rejected counter's reason label shows them.
const (
	reasonQueueFull = "queue_full" // the queue was full and this flow had the most waiting
	reasonEvicted   = "evicted"    // queued, then its place went to a flow with fewer waiting
	reasonTimeout   = "timeout"    // waited QueueWait
	reasonCanceled  = "canceled"   // the client went away while it waited
)

// Controller admits requests by level. Build it with New.
type Controller struct {
	levels map[string]*level
	m      *metrics
	// RefusedAgent, when set, is told of every request of the two agent
	// levels refused (or whose client left while it waited): the server
	// counts one with a node token it knows as its node's sign of life, so
	// an overloaded control plane does not mark live nodes down
	// (web.Server.RefusedAgentRequest). Set it before serving.
	RefusedAgent func(r *http.Request)
}

// New builds the levels of cfg and registers their metrics on reg (nil:
// none).
func New(cfg Config, reg prometheus.Registerer) *Controller {
	m := newMetrics(reg)
	c := &Controller{levels: map[string]*level{}, m: m}
	for name, l := range map[string]Limits{Heartbeat: cfg.Heartbeat, Agent: cfg.Agent, Write: cfg.Write, Read: cfg.Read} {
		c.levels[name] = &level{name: name, Limits: l, flows: map[string]*flow{}, m: m}
		m.limit.WithLabelValues(name).Set(float64(l.MaxInFlight))
		m.inFlight.WithLabelValues(name)
		m.queued.WithLabelValues(name)
	}
	return c
}

// Classify names r's level ("" when exempt) and its flow.
func Classify(r *http.Request) (levelName, flowKey string) {
	p := r.URL.Path
	switch {
	case p == "/healthz" || p == "/readyz" || p == "/metrics" || strings.HasPrefix(p, "/static/"):
		return "", ""
	case strings.HasPrefix(p, "/api/agent/"):
		switch {
		case r.Method == http.MethodGet && strings.HasSuffix(p, "/orders"):
			return "", "" // the long poll
		case strings.HasSuffix(p, "/heartbeat"):
			levelName = Heartbeat
		default:
			levelName = Agent
		}
	case (r.Method == http.MethodGet || r.Method == http.MethodHead) && strings.HasSuffix(p, ".csv"):
		return "", "" // a streamed export
	case r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodOptions:
		levelName = Read
	default:
		levelName = Write
	}
	return levelName, flowOf(r)
}

// flowOf is r's caller: its bearer token or session cookie (digested: no
// secret is kept), else its connection's peer address.
func flowOf(r *http.Request) string {
	if key, ok := web.CallerKey(r); ok {
		return key
	}
	return "ip:" + web.ClientIP(r)
}

// Handler admits each request to next by its level, queueing or refusing
// it past the level's limit.
func (c *Controller) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, key := Classify(r)
		l := c.levels[name]
		if l == nil || l.MaxInFlight <= 0 {
			next.ServeHTTP(w, r)
			return
		}
		release, reason := l.acquire(r, key)
		if release == nil {
			if (name == Heartbeat || name == Agent) && c.RefusedAgent != nil {
				c.RefusedAgent(r)
			}
			if reason != reasonCanceled {
				refuse(w, r, l, reason)
			}
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// retryAfter is what a refused request is told: a second, as Kubernetes
// tells its clients (the queue moves in milliseconds; a longer wait
// would idle slots that free up).
const retryAfter = 1

func refuse(w http.ResponseWriter, r *http.Request, l *level, reason string) {
	what := map[string]string{Heartbeat: "heartbeats", Agent: "agent requests", Write: "API writes", Read: "API reads"}[l.name]
	var why string
	switch reason {
	case reasonTimeout:
		why = fmt.Sprintf("waited %s for one of %d slots", l.QueueWait, l.MaxInFlight)
	case reasonEvicted:
		why = "its place in the queue went to a caller with fewer requests waiting"
	default:
		why = fmt.Sprintf("%d in flight and the queue is full", l.MaxInFlight)
	}
	detail := fmt.Sprintf("too many %s at once (%s): retry in %d s", what, why, retryAfter)
	w.Header().Set("Retry-After", fmt.Sprint(retryAfter))
	a := r.Header.Get("Accept")
	if !strings.HasPrefix(r.URL.Path, "/api/") && !(strings.Contains(a, "json") && !strings.Contains(a, "html")) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintln(w, detail)
		return
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(http.StatusTooManyRequests)
	json.NewEncoder(w).Encode(map[string]any{ //nolint:errcheck // the client may be gone
		"type": "https://allot.dev/problems/too_many_requests", "title": http.StatusText(http.StatusTooManyRequests),
		"status": http.StatusTooManyRequests, "detail": detail,
	})
}

// level is one priority level: its slots and its fair queue.
type level struct {
	name string
	Limits
	m *metrics

	mu       sync.Mutex
	inFlight int
	queued   int
	flows    map[string]*flow // flows with requests waiting
	ring     []*flow          // the same, in round-robin order
	next     int              // ring index of the flow served next
}

type flow struct {
	key   string
	queue []*waiter // oldest first
}

type waiter struct {
	ready   chan struct{} // closed when admitted or evicted
	flow    *flow
	evicted bool
	since   time.Time
}

// acquire takes a slot for r, waiting in the queue if need be. It
// returns the slot's release, or nil and why r was refused.
func (l *level) acquire(r *http.Request, key string) (release func(), reason string) {
	l.mu.Lock()
	if l.inFlight < l.MaxInFlight && l.queued == 0 {
		l.inFlight++
		l.mu.Unlock()
		l.m.inFlight.WithLabelValues(l.name).Inc()
		l.m.admitted(l.name, 0)
		return l.release, ""
	}
	if l.QueueLength == 0 || l.QueueWait == 0 {
		l.mu.Unlock()
		l.m.rejected.WithLabelValues(l.name, reasonQueueFull).Inc()
		return nil, reasonQueueFull
	}
	f := l.flows[key]
	mine := 0
	if f != nil {
		mine = len(f.queue)
	}
	if l.queued >= l.QueueLength {
		longest := l.longest()
		if longest == nil || len(longest.queue) <= mine+1 {
			l.mu.Unlock()
			l.m.rejected.WithLabelValues(l.name, reasonQueueFull).Inc()
			return nil, reasonQueueFull
		}
		// The longest flow gives up its newest place to this one.
		out := longest.queue[len(longest.queue)-1]
		longest.queue = longest.queue[:len(longest.queue)-1]
		out.evicted = true
		l.queued--
		l.dropIfEmpty(longest)
		close(out.ready)
	}
	if f == nil {
		f = &flow{key: key}
		l.flows[key] = f
		l.ring = append(l.ring, f)
	}
	w := &waiter{ready: make(chan struct{}), flow: f, since: time.Now()}
	f.queue = append(f.queue, w)
	l.queued++
	l.m.queued.WithLabelValues(l.name).Set(float64(l.queued))
	l.mu.Unlock()

	timer := time.NewTimer(l.QueueWait)
	defer timer.Stop()
	select {
	case <-w.ready:
	case <-timer.C:
		reason = reasonTimeout
	case <-r.Context().Done():
		reason = reasonCanceled
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case w.evicted:
		reason = reasonEvicted
	case reason == "" || isClosed(w.ready):
		// Admitted (perhaps just as the wait ended: the slot is ours).
		l.m.admitted(l.name, time.Since(w.since))
		return l.release, ""
	default:
		l.remove(w)
	}
	l.m.queued.WithLabelValues(l.name).Set(float64(l.queued))
	l.m.rejected.WithLabelValues(l.name, reason).Inc()
	return nil, reason
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// release frees a slot and hands it to the next waiting request, round
// robin across flows.
func (l *level) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight--
	l.m.inFlight.WithLabelValues(l.name).Dec()
	for l.inFlight < l.MaxInFlight && l.queued > 0 {
		if l.next >= len(l.ring) {
			l.next = 0
		}
		f := l.ring[l.next]
		w := f.queue[0]
		f.queue = f.queue[1:]
		l.queued--
		l.inFlight++
		l.m.inFlight.WithLabelValues(l.name).Inc()
		if len(f.queue) == 0 {
			l.dropIfEmpty(f) // the next flow slides into l.next
		} else {
			l.next++
		}
		close(w.ready)
	}
	l.m.queued.WithLabelValues(l.name).Set(float64(l.queued))
}

// remove takes a waiter that gave up out of its flow's queue.
func (l *level) remove(w *waiter) {
	f := w.flow
	for i, x := range f.queue {
		if x == w {
			f.queue = append(f.queue[:i], f.queue[i+1:]...)
			l.queued--
			break
		}
	}
	l.dropIfEmpty(f)
}

// dropIfEmpty forgets a flow with nothing waiting.
func (l *level) dropIfEmpty(f *flow) {
	if len(f.queue) > 0 {
		return
	}
	delete(l.flows, f.key)
	for i, x := range l.ring {
		if x == f {
			l.ring = append(l.ring[:i], l.ring[i+1:]...)
			if i < l.next {
				l.next--
			}
			break
		}
	}
}

// longest is the flow with the most requests waiting.
func (l *level) longest() *flow {
	var out *flow
	for _, f := range l.ring {
		if out == nil || len(f.queue) > len(out.queue) {
			out = f
		}
	}
	return out
}

type metrics struct {
	inFlight, queued, limit *prometheus.GaugeVec
	rejected                *prometheus.CounterVec
	dispatched              *prometheus.CounterVec
	wait                    *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_admission_in_flight", Help: "Requests executing, by priority level (heartbeat, agent, write, read).",
		}, []string{"level"}),
		queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_admission_queued", Help: "Requests waiting for a slot, by priority level.",
		}, []string{"level"}),
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_admission_limit", Help: "Requests a priority level runs at once (0: no limit).",
		}, []string{"level"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_admission_rejected_total", Help: "Requests refused with 429, by priority level and reason (queue_full, evicted, timeout; canceled: the client left while waiting).",
		}, []string{"level", "reason"}),
		dispatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_admission_dispatched_total", Help: "Requests admitted, by priority level.",
		}, []string{"level"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "allot_admission_wait_seconds", Help: "Time admitted requests waited in their level's queue.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"level"}),
	}
	if reg != nil {
		reg.MustRegister(m.inFlight, m.queued, m.limit, m.rejected, m.dispatched, m.wait)
	}
	return m
}

func (m *metrics) admitted(level string, waited time.Duration) {
	m.dispatched.WithLabelValues(level).Inc()
	m.wait.WithLabelValues(level).Observe(waited.Seconds())
}

// Snapshot is a level's state now (tests, and whoever wants it without
// scraping).
type Snapshot struct{ InFlight, Queued int }

// State reports level name's requests in flight and waiting.
func (c *Controller) State(name string) Snapshot {
	l := c.levels[name]
	if l == nil {
		return Snapshot{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return Snapshot{InFlight: l.inFlight, Queued: l.queued}
}
