package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
)

const testToken = "allot_node_test"

// peer is a scripted stand-in for the Allot server's agent API: it records
// what the agent sends and hands out the orders a test pushes.
type peer struct {
	t   *testing.T
	srv *httptest.Server

	mu         sync.Mutex
	regs       []agentproto.Inventory
	hbs        []agentproto.Heartbeat
	takes      []agentproto.LeaseRef
	started    []agentproto.JobStarted
	exited     []agentproto.JobExited
	logs       map[agentproto.LeaseRef][]string
	ends       map[agentproto.LeaseRef][]int64
	logBodies  []int // each log request's body size
	tooLarge   int   // log requests refused with 413
	firstLog   map[agentproto.LeaseRef]time.Time
	orders     []agentproto.Orders
	unknown    []int64               // answered in the next registration
	failHB     int                   // answer this many heartbeats with 401
	busyTakes  int                   // answer this many takes with 429
	refused    int                   // takes answered with 429
	kill       []agentproto.LeaseRef // answered in the next heartbeat
	changed    chan struct{}
	closing    chan struct{}
	closedOnce sync.Once
}

func newPeer(t *testing.T) *peer { return newPeerAt(t, "127.0.0.1:0") }

// newPeerAt starts a peer listening on addr (to "restart" a server on the
// same address).
func newPeerAt(t *testing.T, addr string) *peer {
	t.Helper()
	p := &peer{
		t:        t,
		logs:     map[agentproto.LeaseRef][]string{},
		ends:     map[agentproto.LeaseRef][]int64{},
		firstLog: map[agentproto.LeaseRef]time.Time{},
		changed:  make(chan struct{}),
		closing:  make(chan struct{}),
	}
	var ln net.Listener
	var err error
	deadline := time.Now().Add(5 * time.Second) // deadline (real time)
	for {
		ln, err = net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) { // deadline (real time)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/agent/v1/register", p.register)
	mux.HandleFunc("POST /api/agent/v1/heartbeat", p.heartbeat)
	mux.HandleFunc("GET /api/agent/v1/orders", p.serveOrders)
	mux.HandleFunc("POST /api/agent/v1/leases/take", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		busy := p.busyTakes > 0
		if busy {
			p.busyTakes--
			p.refused++
			p.notifyLocked()
		}
		p.mu.Unlock()
		if busy {
			w.Header().Set("Retry-After", "1")
			problem(w, http.StatusTooManyRequests, "too many agent requests at once")
			return
		}
		record(p, &p.takes)(w, r)
	})
	mux.HandleFunc("POST /api/agent/v1/jobs/started", record(p, &p.started))
	mux.HandleFunc("POST /api/agent/v1/jobs/exited", record(p, &p.exited))
	mux.HandleFunc("POST /api/agent/v1/jobs/log", p.log)
	p.srv = httptest.NewUnstartedServer(p.auth(mux))
	p.srv.Listener.Close()
	p.srv.Listener = ln
	p.srv.Start()
	t.Cleanup(p.close)
	return p
}

func (p *peer) URL() string  { return p.srv.URL }
func (p *peer) Addr() string { return p.srv.Listener.Addr().String() }

// close stops the peer, dropping open long polls.
func (p *peer) close() {
	p.closedOnce.Do(func() {
		close(p.closing)
		p.srv.CloseClientConnections()
		p.srv.Close()
	})
}

func (p *peer) auth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testToken {
			problem(w, http.StatusUnauthorized, "unknown node token")
			return
		}
		h.ServeHTTP(w, r)
	})
}

func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(agentproto.Problem{Title: http.StatusText(status), Status: status, Detail: detail})
}

func decode[T any](p *peer, w http.ResponseWriter, r *http.Request) (T, bool) {
	var v T
	if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		p.t.Errorf("%s: bad body: %v", r.URL.Path, err)
		return v, false
	}
	return v, true
}

func (p *peer) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func record[T any](p *peer, into *[]T) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, ok := decode[T](p, w, r)
		if !ok {
			return
		}
		p.mu.Lock()
		*into = append(*into, v)
		p.notifyLocked()
		p.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}
}

func (p *peer) register(w http.ResponseWriter, r *http.Request) {
	inv, ok := decode[agentproto.Inventory](p, w, r)
	if !ok {
		return
	}
	p.mu.Lock()
	p.regs = append(p.regs, inv)
	reg := agentproto.Registration{Node: inv.Hostname, Unknown: p.unknown}
	p.unknown = nil
	p.notifyLocked()
	p.mu.Unlock()
	_ = json.NewEncoder(w).Encode(reg)
}

func (p *peer) heartbeat(w http.ResponseWriter, r *http.Request) {
	hb, ok := decode[agentproto.Heartbeat](p, w, r)
	if !ok {
		return
	}
	p.mu.Lock()
	if p.failHB > 0 {
		p.failHB--
		p.mu.Unlock()
		problem(w, http.StatusUnauthorized, "node not registered")
		return
	}
	p.hbs = append(p.hbs, hb)
	rep := agentproto.HeartbeatReply{NodeState: "up", Kill: p.kill}
	p.kill = nil
	p.notifyLocked()
	p.mu.Unlock()
	_ = json.NewEncoder(w).Encode(rep)
}

// peerBodyLimit is the server's request body limit (web/server.go,
// BodyLimit("1M")): the peer refuses larger log batches with a 413 as the
// server does.
const peerBodyLimit = 1 << 20

func (p *peer) log(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, peerBodyLimit))
	if err != nil {
		p.mu.Lock()
		p.tooLarge++
		p.mu.Unlock()
		problem(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	}
	var l agentproto.JobLog
	if err := json.Unmarshal(b, &l); err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		p.t.Errorf("%s: bad body: %v", r.URL.Path, err)
		return
	}
	ref := agentproto.LeaseRef{JobID: l.JobID, Segment: l.Segment}
	p.mu.Lock()
	p.logBodies = append(p.logBodies, len(b))
	if len(l.Ends) != 0 && len(l.Ends) != len(l.Lines) {
		p.t.Errorf("log batch of %d lines with %d ends", len(l.Lines), len(l.Ends))
	}
	p.ends[ref] = append(p.ends[ref], l.Ends...)
	if _, seen := p.firstLog[ref]; !seen {
		p.firstLog[ref] = time.Now() // a stopwatch: start to first output line
	}
	p.logs[ref] = append(p.logs[ref], l.Lines...)
	p.notifyLocked()
	p.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (p *peer) serveOrders(w http.ResponseWriter, r *http.Request) {
	wait, err := time.ParseDuration(r.URL.Query().Get("wait"))
	if err != nil {
		problem(w, http.StatusBadRequest, "wait: "+err.Error())
		return
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		p.mu.Lock()
		if len(p.orders) > 0 {
			o := p.orders[0]
			p.orders = p.orders[1:]
			p.mu.Unlock()
			_ = json.NewEncoder(w).Encode(o)
			return
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			_ = json.NewEncoder(w).Encode(agentproto.Orders{})
			return
		case <-r.Context().Done():
			return
		case <-p.closing:
			return
		}
	}
}

// push queues orders for the agent's next poll.
func (p *peer) push(o agentproto.Orders) {
	p.mu.Lock()
	p.orders = append(p.orders, o)
	p.notifyLocked()
	p.mu.Unlock()
}

// waitFor polls cond (under the peer's lock) until it holds or the
// deadline passes.
func (p *peer) waitFor(what string, d time.Duration, cond func() bool) {
	p.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		ok := cond()
		ch := p.changed
		p.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
		case <-deadline.C:
			p.t.Fatalf("timed out after %s waiting for %s", d, what)
		}
	}
}

func (p *peer) exitOf(ref agentproto.LeaseRef) (agentproto.JobExited, bool) {
	for _, e := range p.exited {
		if e.JobID == ref.JobID && e.Segment == ref.Segment {
			return e, true
		}
	}
	return agentproto.JobExited{}, false
}

// waitExit waits for ref's exit report.
func (p *peer) waitExit(ref agentproto.LeaseRef, d time.Duration) agentproto.JobExited {
	p.t.Helper()
	var e agentproto.JobExited
	p.waitFor("exit of job "+refString(ref), d, func() bool {
		var ok bool
		e, ok = p.exitOf(ref)
		return ok
	})
	return e
}

func (p *peer) waitLogLine(ref agentproto.LeaseRef, line string, d time.Duration) {
	p.t.Helper()
	p.waitFor("log line "+line, d, func() bool { return slices.Contains(p.logs[ref], line) })
}

func refString(r agentproto.LeaseRef) string {
	b, _ := json.Marshal(r)
	return string(b)
}

type testAgent struct {
	*Agent
	fake *Fake
	peer *peer
	stop func() // cancels Run and waits for it
}

// startAgent runs an agent with a 4-GPU fake backend and short intervals
// against p.
func startAgent(t *testing.T, p *peer, edit ...func(*Config)) *testAgent {
	t.Helper()
	fake := NewFake(FakeOptions{GPUs: 4, Hostname: "node-a"})
	logger := discardLogger()
	cfg := Config{
		Server:            p.URL(),
		Token:             testToken,
		Hostname:          "node-a",
		Domain:            "nvl-a",
		Backend:           fake,
		HeartbeatInterval: 50 * time.Millisecond,
		OrdersWait:        2 * time.Second,
		Logger:            logger,
		BaseEnv:           []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/agent-home", "LANG=C.UTF-8"},
		StopGrace:         5 * time.Second,
		TimeLimitGrace:    300 * time.Millisecond,
		ShutdownGrace:     time.Second,
		RetryMax:          200 * time.Millisecond,
		LogFlush:          50 * time.Millisecond,
		StateDir:          sharedTempDir(t),
		JobUser:           testUser,
		CgroupParent:      testCgroupParent(t),
		RunAsAgent:        !isRoot(),
	}
	for _, e := range edit {
		e(&cfg)
	}
	a := New(cfg)
	p.mu.Lock()
	regs := len(p.regs)
	p.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	p.waitFor("registration", 5*time.Second, func() bool { return len(p.regs) > regs })
	return &testAgent{Agent: a, fake: fake, peer: p, stop: stop}
}

// run offers a lease, waits for the take, starts it and waits for Started.
func (ta *testAgent) run(t *testing.T, l agentproto.Lease) agentproto.JobStarted {
	t.Helper()
	p := ta.peer
	ref := agentproto.LeaseRef{JobID: l.JobID, Segment: l.Segment}
	p.push(agentproto.Orders{Offer: []agentproto.Lease{l}})
	p.waitFor("take of "+refString(ref), 5*time.Second, func() bool { return slices.Contains(p.takes, ref) })
	p.push(agentproto.Orders{Start: []agentproto.LeaseRef{ref}})
	var s agentproto.JobStarted
	p.waitFor("start of "+refString(ref), 5*time.Second, func() bool {
		for _, x := range p.started {
			if x.JobID == ref.JobID && x.Segment == ref.Segment {
				s = x
				return true
			}
		}
		return false
	})
	return s
}

func shLease(id int64, gpus []int, script string) agentproto.Lease {
	return agentproto.Lease{
		JobID:   id,
		Segment: 1,
		Team:    "vision",
		Command: []string{"/bin/sh", "-c", script},
		Env:     map[string]string{"CUDA_VISIBLE_DEVICES": "0"},
		GPUs:    gpus,
	}
}

func ref(id int64) agentproto.LeaseRef { return agentproto.LeaseRef{JobID: id, Segment: 1} }

// discardLogger drops the agent's logs unless ALLOT_TEST_AGENT_LOG is set.
func discardLogger() *slog.Logger {
	if os.Getenv("ALLOT_TEST_AGENT_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testCgroupParent is a cgroup parent of the test's own: parallel tests'
// agents never see each other's job cgroups.
func testCgroupParent(t *testing.T) string {
	return fmt.Sprintf("allot-test/%d-%s", os.Getpid(), strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
}
