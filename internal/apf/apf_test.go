package apf

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// gated is a server behind c whose handler tells admitted the caller's
// token and then waits for a value on proceed: the test decides when each
// admitted request ends.
type gated struct {
	t        *testing.T
	c        *Controller
	reg      *prometheus.Registry
	srv      *httptest.Server
	admitted chan string
	proceed  chan struct{}
}

func newGated(t *testing.T, cfg Config) *gated {
	t.Helper()
	reg := prometheus.NewRegistry()
	g := &gated{t: t, c: New(cfg, reg), reg: reg, admitted: make(chan string, 100), proceed: make(chan struct{})}
	g.srv = httptest.NewServer(g.c.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			g.admitted <- r.Header.Get("X-Request")
			<-g.proceed
		}
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(g.srv.Close)
	return g
}

type answer struct {
	token  string
	status int
	retry  string
	ctype  string
	body   string
}

// send makes a request named token in the background, with the token
// its name's first letter (its flow); its answer comes on the channel
// returned.
func (g *gated) send(method, path, token string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(method, g.srv.URL+path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+token[:1])
		req.Header.Set("X-Request", token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- answer{token: token, body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- answer{token: token, status: resp.StatusCode, retry: resp.Header.Get("Retry-After"), ctype: resp.Header.Get("Content-Type"), body: string(b)}
	}()
	return out
}

// waitState waits until level's state is want.
func (g *gated) waitState(level string, want Snapshot) {
	g.t.Helper()
	deadline := time.Now().Add(20 * time.Second) // a deadline for the server's goroutines, not product time
	for g.c.State(level) != want {
		if time.Now().After(deadline) { // the same deadline
			g.t.Fatalf("%s level: %+v, want %+v", level, g.c.State(level), want)
		}
		time.Sleep(time.Millisecond)
	}
}

func (g *gated) counter(name string, labels ...string) float64 {
	g.t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		g.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i, lp := range m.GetLabel() {
				if i < len(labels) && lp.GetValue() != labels[i] {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func checkRefused(t *testing.T, a answer, why string) {
	t.Helper()
	var p struct {
		Type   string
		Status int
		Detail string
	}
	json.Unmarshal([]byte(a.body), &p) //nolint:errcheck
	if a.status != http.StatusTooManyRequests || a.retry != "1" || a.ctype != "application/problem+json" || p.Status != 429 ||
		!strings.HasSuffix(p.Type, "/too_many_requests") || !strings.Contains(p.Detail, why) || !strings.Contains(p.Detail, "retry in 1 s") {
		t.Errorf("%s's request: %d Retry-After %q %s %s; want 429, a problem saying %q", a.token, a.status, a.retry, a.ctype, a.body, why)
	}
}

// TestFairQueue: past the slot, requests wait; a full queue refuses the
// heaviest flow's request, and a lighter flow's takes the place of the
// heaviest flow's newest; slots go round robin across flows, not first
// come first served.
func TestFairQueue(t *testing.T) {
	g := newGated(t, Config{Write: Limits{MaxInFlight: 1, QueueLength: 4, QueueWait: time.Minute}})
	running := g.send("POST", "/api/v1/jobs", "a1")
	if got := <-g.admitted; got != "a1" {
		t.Fatalf("admitted %s", got)
	}
	var answers []<-chan answer
	for i, tok := range []string{"a2", "a3", "a4", "b1"} {
		answers = append(answers, g.send("POST", "/api/v1/jobs", tok))
		g.waitState(Write, Snapshot{InFlight: 1, Queued: i + 1})
	}
	// Full: b2 (its flow has 1 waiting, a's 3) takes a4's place.
	b2 := g.send("POST", "/api/v1/jobs", "b2")
	checkRefused(t, <-answers[2], "went to a caller with fewer requests waiting")
	g.waitState(Write, Snapshot{InFlight: 1, Queued: 4})
	// a5: a and b have 2 waiting each; a5 is refused.
	checkRefused(t, <-g.send("POST", "/api/v1/jobs", "a5"), "1 in flight and the queue is full")
	// Exempt paths are not held.
	if a := <-g.send("GET", "/healthz", "a6"); a.status != http.StatusCreated {
		t.Errorf("an exempt request: %+v", a)
	}

	var order []string
	for range 5 {
		g.proceed <- struct{}{}
		if len(order) < 4 {
			order = append(order, <-g.admitted)
		}
	}
	if strings.Join(order, " ") != "a2 b1 a3 b2" {
		t.Errorf("admitted in order %v, want a2 b1 a3 b2 (round robin over the flows)", order)
	}
	for _, ch := range []<-chan answer{running, answers[0], answers[1], answers[3], b2} {
		if a := <-ch; a.status != http.StatusCreated {
			t.Errorf("%s: %+v", a.token, a)
		}
	}
	if q, e := g.counter("allot_admission_rejected_total", Write, reasonQueueFull), g.counter("allot_admission_rejected_total", Write, reasonEvicted); q != 1 || e != 1 {
		t.Errorf("rejected: queue full %v, evicted %v; want 1 and 1", q, e)
	}
	if n := g.counter("allot_admission_dispatched_total", Write); n != 5 {
		t.Errorf("dispatched %v, want 5", n)
	}
	g.waitState(Write, Snapshot{})
}

// TestQueueWait: a request that waits its level's QueueWait for a slot
// gets 429 with Retry-After; one whose client goes away leaves the queue;
// the heartbeat level is untouched by a full write level.
func TestQueueWait(t *testing.T) {
	g := newGated(t, Config{Write: Limits{MaxInFlight: 1, QueueLength: 8, QueueWait: 200 * time.Millisecond},
		Heartbeat: Limits{MaxInFlight: 1, QueueLength: 1, QueueWait: time.Minute}})
	running := g.send("POST", "/api/v1/jobs", "u1")
	<-g.admitted
	checkRefused(t, <-g.send("POST", "/api/v1/jobs", "u2"), "waited 200ms for one of 1 slots")
	if n := g.counter("allot_admission_rejected_total", Write, reasonTimeout); n != 1 {
		t.Errorf("rejected for waiting: %v", n)
	}
	g.waitState(Write, Snapshot{InFlight: 1})

	// The heartbeats' level has its own slot.
	hb := g.send("POST", "/api/agent/v1/heartbeat", "node1")
	if got := <-g.admitted; got != "node1" {
		t.Fatalf("admitted %s", got)
	}
	g.waitState(Heartbeat, Snapshot{InFlight: 1})
	g.proceed <- struct{}{}
	g.proceed <- struct{}{}
	for _, ch := range []<-chan answer{running, hb} {
		if a := <-ch; a.status != http.StatusCreated {
			t.Errorf("%s: %+v", a.token, a)
		}
	}
	g.waitState(Write, Snapshot{})
	g.waitState(Heartbeat, Snapshot{})
}

// TestCanceledWhileQueued: a client that gives up while it waits leaves
// the queue (and is not counted against its level as served).
func TestCanceledWhileQueued(t *testing.T) {
	g := newGated(t, Config{Read: Limits{MaxInFlight: 1, QueueLength: 8, QueueWait: time.Minute}})
	running := g.send("GET", "/api/v1/jobs", "r1")
	<-g.admitted
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest("GET", g.srv.URL+"/api/v1/jobs", nil)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(done)
		resp, err := (&http.Client{Transport: tr}).Do(req.WithContext(cancelOn(t, g)))
		if err == nil {
			resp.Body.Close()
			t.Errorf("the canceled request was answered %d", resp.StatusCode)
		}
	})
	<-done
	wg.Wait()
	g.waitState(Read, Snapshot{InFlight: 1})
	if n := g.counter("allot_admission_rejected_total", Read, reasonCanceled); n != 1 {
		t.Errorf("canceled: %v", n)
	}
	g.proceed <- struct{}{}
	<-running
	g.waitState(Read, Snapshot{})
}

// TestNoLimits: the zero Config admits everything at once.
func TestNoLimits(t *testing.T) {
	g := newGated(t, Config{})
	var chans []<-chan answer
	for _, p := range []string{"/api/v1/jobs", "/api/agent/v1/heartbeat", "/cluster"} {
		for range 5 {
			chans = append(chans, g.send("POST", p, "x"))
		}
	}
	for range chans {
		<-g.admitted
	}
	for range chans {
		g.proceed <- struct{}{}
	}
	for _, ch := range chans {
		if a := <-ch; a.status != http.StatusCreated {
			t.Errorf("%+v", a)
		}
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct{ method, path, level string }{
		{"POST", "/api/agent/v1/heartbeat", Heartbeat},
		{"POST", "/api/agent/v1/register", Agent},
		{"POST", "/api/agent/v1/jobs/exited", Agent},
		{"GET", "/api/agent/v1/slurm/over-budget", Agent},
		{"GET", "/api/agent/v1/orders", ""}, // the long poll
		{"POST", "/api/v1/jobs", Write},
		{"DELETE", "/api/v1/tokens/3", Write},
		{"PUT", "/api/v1/policy", Write},
		{"POST", "/jobs", Write},
		{"GET", "/api/v1/jobs", Read},
		{"GET", "/cluster", Read},
		{"GET", "/api/v1/audit.csv", ""},
		{"GET", "/api/v1/chargeback.csv", ""},
		{"GET", "/healthz", ""},
		{"GET", "/readyz", ""},
		{"GET", "/metrics", ""},
		{"GET", "/static/app.css", ""},
	} {
		r := httptest.NewRequest(c.method, c.path, nil)
		if got, _ := Classify(r); got != c.level {
			t.Errorf("%s %s: level %q, want %q", c.method, c.path, got, c.level)
		}
	}
	a := httptest.NewRequest("GET", "/api/v1/jobs", nil)
	a.Header.Set("Authorization", "Bearer one")
	b := httptest.NewRequest("GET", "/api/v1/jobs", nil)
	b.Header.Set("Authorization", "Bearer two")
	c := httptest.NewRequest("GET", "/api/v1/jobs", nil)
	c.AddCookie(&http.Cookie{Name: "allot_session", Value: "s"})
	_, fa := Classify(a)
	_, fb := Classify(b)
	_, fc := Classify(c)
	_, fd := Classify(httptest.NewRequest("GET", "/api/v1/jobs", nil))
	if fa == fb || fa == fc || fc == fd || strings.Contains(fa, "one") || fd != "ip:192.0.2.1" {
		t.Errorf("flows: %q %q %q %q", fa, fb, fc, fd)
	}
}

func TestValidate(t *testing.T) {
	if err := Default.Validate(); err != nil {
		t.Error(err)
	}
	for _, c := range []Config{{Write: Limits{MaxInFlight: -1}}, {Read: Limits{QueueLength: -1}}, {Agent: Limits{QueueWait: -time.Second}}, {Heartbeat: Limits{MaxInFlight: -1}}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// cancelOn is a context canceled once g's read level has a request
// waiting.
func cancelOn(t *testing.T, g *gated) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		defer cancel()
		deadline := time.Now().Add(20 * time.Second)                     // a deadline for the server's goroutines, not product time
		for g.c.State(Read).Queued == 0 && time.Now().Before(deadline) { // the same deadline
			time.Sleep(time.Millisecond)
		}
	}()
	return ctx
}
