package web_test

// Live tests of what the server checks of its agents (issue 12): a real
// PostgreSQL, the real HTTP server, and agents played by the test through
// agentproto.Client, so each report is exactly the one a hostile job with
// a stolen node token could send.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/allotlabs/allot/web"
	"github.com/jackc/pgx/v5/pgxpool"
)

// logBuffer collects the server's log.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// rig is a server on a fresh demo database whose clock the test moves.
type rig struct {
	t    *testing.T
	ctx  context.Context
	st   *store.Store
	pool *pgxpool.Pool
	url  string
	logs *logBuffer
	now  atomic.Int64 // product time, Unix nanoseconds
}

func newRig(t *testing.T) *rig {
	t.Helper()
	t.Parallel()
	r := &rig{t: t, ctx: context.Background(), logs: &logBuffer{}}
	r.now.Store(clock.Now().Truncate(time.Second).UnixNano())
	r.pool = storetest.Pool(t)
	r.st = store.New(r.pool)
	r.st.Now = func() time.Time { return time.Unix(0, r.now.Load()).UTC() }
	if err := demo.Seed(r.ctx, r.st); err != nil {
		t.Fatal(err)
	}
	// The demo's queue would take the GPUs the tests count on.
	admin, err := r.st.UserByEmail(r.ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	queued, err := r.st.ListJobs(r.ctx, store.JobFilter{State: allot.JobPending, Limit: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range queued {
		if _, err := r.st.CancelJob(r.ctx, &admin, j.ID); err != nil {
			t.Fatal(err)
		}
	}
	srv := web.New(web.Config{Store: r.st, Logger: slog.New(slog.NewTextHandler(r.logs, nil)), HeartbeatInterval: time.Second})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	r.url = ts.URL
	return r
}

func (r *rig) at() time.Time              { return time.Unix(0, r.now.Load()).UTC() }
func (r *rig) advance(d time.Duration)    { r.now.Add(int64(d)) }
func (r *rig) exec(q string, args ...any) { r.must(r.pool.Exec(r.ctx, q, args...)) }

func (r *rig) must(_ any, err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatal(err)
	}
}

// inventory is an 8-GPU T4 node (gpu13–gpu16 in the demo).
func inventory(node string, running ...agentproto.LeaseRef) agentproto.Inventory {
	inv := agentproto.Inventory{Hostname: node, Protocol: agentproto.Version, GPUBackend: "fake"}
	for i := range 8 {
		inv.GPUs = append(inv.GPUs, agentproto.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", node, i), Model: "T4", MemoryMiB: 16384})
	}
	for _, l := range running {
		inv.Running = append(inv.Running, agentproto.RunningJob{JobID: l.JobID, Segment: l.Segment, PID: 4242})
	}
	return inv
}

// agent registers node and returns a client with its token.
func (r *rig) agent(node string) *agentproto.Client {
	r.t.Helper()
	tok, err := r.st.CreateNodeToken(r.ctx, node, "test")
	if err != nil {
		r.t.Fatal(err)
	}
	c := agentproto.NewClient(r.url, tok)
	if _, err := c.Register(r.ctx, inventory(node)); err != nil {
		r.t.Fatal(err)
	}
	return c
}

// submit queues a T4 job of gpus GPUs and runs a scheduling cycle.
func (r *rig) submit(gpus int) int64 {
	r.t.Helper()
	u, err := r.st.UserByEmail(r.ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		r.t.Fatal(err)
	}
	j, err := r.st.SubmitJob(r.ctx, &u, allot.JobSpec{Team: "recs", Tier: allot.Tier3, GPUs: gpus, GPUType: "T4", TimeLimit: time.Hour, Command: []string{"sleep", "600"}})
	if err != nil {
		r.t.Fatal(err)
	}
	r.cycle()
	return j.ID
}

func (r *rig) cycle() {
	r.t.Helper()
	if _, err := (&jobs.Scheduler{Store: r.st}).Cycle(r.ctx); err != nil {
		r.t.Fatal(err)
	}
}

// start walks job's lease on c's node through offer, take and start, as an
// agent does, and returns it.
func (r *rig) start(c *agentproto.Client, job int64) agentproto.LeaseRef {
	r.t.Helper()
	o, err := c.Orders(r.ctx, 0)
	if err != nil || len(o.Offer) != 1 || o.Offer[0].JobID != job {
		r.t.Fatalf("offer of job %d: %+v %v", job, o, err)
	}
	ref := agentproto.LeaseRef{JobID: job, Segment: o.Offer[0].Segment}
	if err := c.TakeLease(r.ctx, ref); err != nil {
		r.t.Fatal(err)
	}
	if o, err = c.Orders(r.ctx, 0); err != nil || len(o.Start) != 1 {
		r.t.Fatalf("start order of job %d: %+v %v", job, o, err)
	}
	if err := c.Started(r.ctx, agentproto.JobStarted{JobID: job, Segment: ref.Segment, PID: 4242, Time: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)}); err != nil {
		r.t.Fatal(err)
	}
	return ref
}

func (r *rig) heartbeat(c *agentproto.Client, listed ...agentproto.LeaseRef) agentproto.HeartbeatReply {
	r.t.Helper()
	hb := agentproto.Heartbeat{Time: r.at()}
	for i := range 8 {
		hb.GPUs = append(hb.GPUs, agentproto.GPUMetrics{Index: i, UtilPct: 90, MemTotalMiB: 16384})
	}
	for _, l := range listed {
		hb.Jobs = append(hb.Jobs, agentproto.JobStats{JobID: l.JobID, Segment: l.Segment, PID: 4242})
	}
	rep, err := c.Heartbeat(r.ctx, hb)
	if err != nil {
		r.t.Fatal(err)
	}
	return rep
}

// open returns how many of job's allocations are open.
func (r *rig) open(job int64) int {
	var n int
	r.must(nil, r.pool.QueryRow(r.ctx, `SELECT count(*) FROM allocations WHERE job_id = $1 AND released_at IS NULL`, job).Scan(&n))
	return n
}

func (r *rig) jobState(job int64) allot.Job {
	r.t.Helper()
	j, err := r.st.GetJob(r.ctx, job)
	if err != nil {
		r.t.Fatal(err)
	}
	return j
}

// TestForgedExitBillsUpToLastHeartbeat: a job with the node's token reports
// its own exit at 2000-01-01 to erase its usage; the server bills it up to
// the last heartbeat that listed it, not less. A start's time is when the
// report arrived; an exit time in the future is the report's arrival.
func TestForgedExitBillsUpToLastHeartbeat(t *testing.T) {
	r := newRig(t)
	c := r.agent("gpu13")
	job := r.submit(4)
	offered := r.at()
	r.advance(time.Minute)
	startedAt := r.at()
	ref := r.start(c, job)
	var started, seen time.Time
	r.must(nil, r.pool.QueryRow(r.ctx, `SELECT started_at, seen_at FROM leases WHERE job_id = $1`, job).Scan(&started, &seen))
	if !started.Equal(startedAt) || !seen.Equal(startedAt) {
		t.Errorf("start recorded at %v (seen %v), want the report's arrival %v, not the agent's 2000-01-01", started, seen, startedAt)
	}
	r.advance(10 * time.Minute)
	hbAt := r.at()
	if rep := r.heartbeat(c, ref); len(rep.Kill) != 0 {
		t.Fatalf("a running lease was killed: %+v", rep)
	}
	r.advance(time.Minute)
	forged := agentproto.JobExited{JobID: job, Segment: ref.Segment, ExitCode: 0, Time: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)}
	if err := c.Exited(r.ctx, forged); err != nil {
		t.Fatal(err)
	}
	var released, allocStart time.Time
	r.must(nil, r.pool.QueryRow(r.ctx, `SELECT max(released_at), min(started_at) FROM allocations WHERE job_id = $1`, job).Scan(&released, &allocStart))
	if released.Before(hbAt) {
		t.Errorf("forged exit at 2000-01-01 released the GPUs at %v, before the heartbeat at %v that listed the job", released, hbAt)
	}
	if !released.Equal(hbAt) || !allocStart.Equal(offered) {
		t.Errorf("allocation %v..%v, want %v..%v", allocStart, released, offered, hbAt)
	}
	var leaseEnd time.Time
	r.must(nil, r.pool.QueryRow(r.ctx, `SELECT exited_at FROM leases WHERE job_id = $1`, job).Scan(&leaseEnd))
	if !leaseEnd.Equal(hbAt) {
		t.Errorf("lease ended at %v, want %v", leaseEnd, hbAt)
	}

	// The real agent still runs it: its next heartbeat is answered with a
	// kill, and the GPUs stay allocated until it stops listing the job.
	r.advance(5 * time.Second)
	rep := r.heartbeat(c, ref)
	if len(rep.Kill) != 1 || rep.Kill[0] != ref {
		t.Fatalf("heartbeat listing an ended lease: kill %+v, want %+v", rep.Kill, ref)
	}
	if n := r.open(job); n != 4 {
		t.Errorf("%d GPUs held for the orphan, want 4", n)
	}
	if !strings.Contains(r.logs.String(), "told to kill it") {
		t.Errorf("orphan not logged:\n%s", r.logs.String())
	}
	r.advance(5 * time.Second)
	if rep := r.heartbeat(c); len(rep.Kill) != 0 || r.open(job) != 0 {
		t.Errorf("after the kill: kill %+v, %d GPUs still held", rep.Kill, r.open(job))
	}

	// An exit time in the future is the report's arrival.
	job2 := r.submit(2)
	ref2 := r.start(c, job2)
	r.advance(30 * time.Second)
	arrival := r.at()
	if err := c.Exited(r.ctx, agentproto.JobExited{JobID: job2, Segment: ref2.Segment, ExitCode: 0, Time: arrival.Add(24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	r.must(nil, r.pool.QueryRow(r.ctx, `SELECT max(released_at) FROM allocations WHERE job_id = $1`, job2).Scan(&released))
	if !released.Equal(arrival) {
		t.Errorf("future exit time: released at %v, want the arrival %v", released, arrival)
	}
}

// TestRefusedAgentReports: reports about a lease the node does not hold
// (another node's, an unknown job) are refused and logged at warn with the
// node, job, segment and endpoint; an exit for a lease never taken is 409.
func TestRefusedAgentReports(t *testing.T) {
	r := newRig(t)
	a := r.agent("gpu13")
	b := r.agent("gpu14")
	r.exec(`UPDATE nodes SET state = 'drained', drain_source = 'admin' WHERE name = 'gpu14'`) // the job goes to gpu13
	job := r.submit(8)
	ref := agentproto.LeaseRef{JobID: job, Segment: 1}
	calls := []struct {
		name     string
		endpoint string
		call     func(c *agentproto.Client, ref agentproto.LeaseRef) error
	}{
		{"take", "/api/agent/v1/leases/take", func(c *agentproto.Client, ref agentproto.LeaseRef) error { return c.TakeLease(r.ctx, ref) }},
		{"started", "/api/agent/v1/jobs/started", func(c *agentproto.Client, ref agentproto.LeaseRef) error {
			return c.Started(r.ctx, agentproto.JobStarted{JobID: ref.JobID, Segment: ref.Segment, PID: 1, Time: r.at()})
		}},
		{"exited", "/api/agent/v1/jobs/exited", func(c *agentproto.Client, ref agentproto.LeaseRef) error {
			return c.Exited(r.ctx, agentproto.JobExited{JobID: ref.JobID, Segment: ref.Segment, ExitCode: 0, Time: r.at()})
		}},
		{"log", "/api/agent/v1/jobs/log", func(c *agentproto.Client, ref agentproto.LeaseRef) error {
			return c.Log(r.ctx, agentproto.JobLog{JobID: ref.JobID, Segment: ref.Segment, Lines: []string{"pwned"}})
		}},
		// Batched reports: the request succeeds, the lease is refused in
		// its result, logged the same way.
		{"take batch", "/api/agent/v1/leases/take-batch", func(c *agentproto.Client, ref agentproto.LeaseRef) error {
			rep, err := c.TakeLeases(r.ctx, []agentproto.LeaseRef{ref})
			if err != nil || len(rep.Start) != 0 {
				return fmt.Errorf("the request: %v, starts %v", err, rep.Start)
			}
			return rep.Results[0].Err()
		}},
		{"started batch", "/api/agent/v1/jobs/started-batch", func(c *agentproto.Client, ref agentproto.LeaseRef) error {
			res, err := c.StartedBatch(r.ctx, []agentproto.JobStarted{{JobID: ref.JobID, Segment: ref.Segment, PID: 1, Time: r.at()}})
			if err != nil {
				return fmt.Errorf("the request: %v", err)
			}
			return res[0].Err()
		}},
	}
	logged := func(node string, ref agentproto.LeaseRef, endpoint string) bool {
		for _, line := range strings.Split(r.logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "agent report refused") && strings.Contains(line, "node="+node+" ") &&
				strings.Contains(line, fmt.Sprintf("job=%d segment=%d ", ref.JobID, ref.Segment)) && strings.Contains(line, "endpoint="+endpoint) {
				return true
			}
		}
		return false
	}
	for _, c := range calls {
		for _, target := range []agentproto.LeaseRef{ref, {JobID: 999999, Segment: 1}} {
			err := c.call(b, target)
			if agentproto.ErrorStatus(err) != 404 {
				t.Errorf("%s by gpu14 for %+v: %v, want 404", c.name, target, err)
			}
			if !logged("gpu14", target, c.endpoint) {
				t.Errorf("%s by gpu14 for %+v not logged at warn with node, job, segment and endpoint:\n%s", c.name, target, r.logs.String())
			}
		}
	}
	// gpu13's own lease, still offered: an exit for it is a conflict.
	err := calls[2].call(a, ref)
	if agentproto.ErrorStatus(err) != 409 || !strings.Contains(err.Error(), "never took") {
		t.Errorf("exit of a lease never taken: %v, want 409", err)
	}
	if !logged("gpu13", ref, "/api/agent/v1/jobs/exited") {
		t.Errorf("the refused exit is not logged:\n%s", r.logs.String())
	}
	var state string
	r.must(nil, r.pool.QueryRow(r.ctx, `SELECT state FROM leases WHERE job_id = $1`, job).Scan(&state))
	if j := r.jobState(job); state != "offered" || j.State != allot.JobRunning || r.open(job) != 8 {
		t.Errorf("refused reports changed things: lease %s, job %s, %d GPUs allocated", state, j.State, r.open(job))
	}
	lines, _ := r.st.JobLog(r.ctx, job)
	if len(lines) != 0 {
		t.Errorf("another node wrote the job's log: %q", lines)
	}
}

// TestMetricsErrorDoesNotDrain: a heartbeat whose agent could not read its
// GPUs says so (MetricsError, no GPUs): the node stays up and says why,
// the admins hear it once, nothing is sampled; GPUs missing from a
// heartbeat without MetricsError still drain the node.
func TestMetricsErrorDoesNotDrain(t *testing.T) {
	r := newRig(t)
	c := r.agent("gpu13")
	samples := func() int {
		var n int
		r.must(nil, r.pool.QueryRow(r.ctx, `SELECT count(*) FROM gpu_samples WHERE node = 'gpu13'`).Scan(&n))
		return n
	}
	node := func() (state, reason, metricsErr string, events, notices int) {
		r.must(nil, r.pool.QueryRow(r.ctx, `SELECT state, state_reason, metrics_error,
			(SELECT count(*) FROM health_events WHERE node = 'gpu13'), (SELECT count(*) FROM notifications WHERE subject = 'node:gpu13')
			FROM nodes WHERE name = 'gpu13'`).Scan(&state, &reason, &metricsErr, &events, &notices))
		return
	}
	r.heartbeat(c)
	before := samples()
	for i := range 3 {
		r.advance(10 * time.Second)
		// A GPU reading sent along with the error is not taken for one.
		hb := agentproto.Heartbeat{Time: r.at(), MetricsError: "nvml: Driver Not Loaded", GPUs: []agentproto.GPUMetrics{{Index: 0, ECCDoubleVol: 9}}}
		rep, err := c.Heartbeat(r.ctx, hb)
		if err != nil {
			t.Fatal(err)
		}
		state, reason, merr, events, notices := node()
		if rep.NodeState != allot.NodeUp || state != allot.NodeUp || reason != "GPU metrics unavailable: nvml: Driver Not Loaded" ||
			merr != "nvml: Driver Not Loaded" || events != 0 || notices != 1 {
			t.Fatalf("heartbeat %d with a metrics error: reply %s; node %s %q (metrics error %q), %d health events, %d notices",
				i, rep.NodeState, state, reason, merr, events, notices)
		}
	}
	if n := samples(); n != before {
		t.Errorf("a heartbeat without metrics stored %d samples", n-before)
	}
	if !strings.Contains(r.logs.String(), "node cannot read its GPU metrics") {
		t.Errorf("metrics failure not logged:\n%s", r.logs.String())
	}
	// Metrics are back: the note goes.
	r.advance(10 * time.Second)
	r.heartbeat(c)
	if state, reason, merr, _, _ := node(); state != allot.NodeUp || reason != "" || merr != "" {
		t.Errorf("metrics back: node %s %q (metrics error %q)", state, reason, merr)
	}
	// No GPUs and no error: they are missing, as before.
	r.advance(10 * time.Second)
	rep, err := c.Heartbeat(r.ctx, agentproto.Heartbeat{Time: r.at()})
	if err != nil {
		t.Fatal(err)
	}
	if state, reason, _, events, _ := node(); rep.NodeState != allot.NodeDrained || state != allot.NodeDrained || events != 1 || !strings.Contains(reason, "gpu-missing") {
		t.Errorf("GPUs absent without a metrics error: reply %s, node %s %q, %d events", rep.NodeState, state, reason, events)
	}
}

// TestOrphansNeverShareGPUs: an agent comes back still running a job whose
// lease the server ended while it was away (its node was marked lost): it
// is told to kill it (Registration.UnknownLeases), and no other job gets
// those GPUs until the agent confirms the kill; a job it re-adopted and
// the server still runs stays running; a heartbeat listing a lease the
// node never held is answered with a kill.
func TestOrphansNeverShareGPUs(t *testing.T) {
	r := newRig(t)
	c := r.agent("gpu13")
	job := r.submit(8)
	ref := r.start(c, job)

	// An agent restart that re-adopts the job: it runs on.
	r.advance(time.Minute)
	reg, err := c.Register(r.ctx, inventory("gpu13", ref))
	if err != nil || len(reg.Unknown) != 0 || len(reg.UnknownLeases) != 0 {
		t.Fatalf("re-adopting a running job: %+v %v", reg, err)
	}
	if j := r.jobState(job); j.State != allot.JobRunning || r.open(job) != 8 {
		t.Fatalf("after re-adoption: job %s, %d GPUs", j.State, r.open(job))
	}
	var seen time.Time
	r.must(nil, r.pool.QueryRow(r.ctx, `SELECT seen_at FROM leases WHERE job_id = $1`, job).Scan(&seen))
	if !seen.Equal(r.at()) {
		t.Errorf("registration listing the job: seen at %v, want %v", seen, r.at())
	}

	// The agent goes silent; the node is marked lost: the lease ends and
	// the job fails (not checkpointable); the GPUs are released.
	r.advance(5 * time.Minute)
	if lost, err := r.st.MarkLostNodes(r.ctx, r.at()); err != nil || len(lost) != 1 {
		t.Fatalf("MarkLostNodes = %v, %v", lost, err)
	}
	if j := r.jobState(job); j.State != allot.JobFailed || j.EndReason != "node_lost" || r.open(job) != 0 {
		t.Fatalf("after the node was lost: job %s %q, %d GPUs", j.State, j.EndReason, r.open(job))
	}
	// Another job waits for those GPUs (there is no other T4 node up).
	next := r.submit(8)
	// The agent comes back still running the old job.
	r.advance(time.Minute)
	comeback := r.at()
	reg, err = c.Register(r.ctx, inventory("gpu13", ref))
	if err != nil {
		t.Fatal(err)
	}
	if len(reg.UnknownLeases) != 1 || reg.UnknownLeases[0] != ref || len(reg.Unknown) != 1 || reg.Unknown[0] != job {
		t.Fatalf("registration with an orphan: %+v", reg)
	}
	if n := r.open(job); n != 8 {
		t.Fatalf("%d GPUs held for the orphan, want 8", n)
	}
	var orphaned *time.Time
	r.must(nil, r.pool.QueryRow(r.ctx, `SELECT orphaned_at FROM leases WHERE job_id = $1`, job).Scan(&orphaned))
	if orphaned == nil || !orphaned.Equal(comeback) {
		t.Errorf("orphaned_at = %v, want %v", orphaned, comeback)
	}
	r.cycle()
	if j := r.jobState(next); j.State != allot.JobPending || r.open(next) != 0 {
		t.Fatalf("a new job got the orphan's GPUs: %s, %d GPUs", j.State, r.open(next))
	}
	// Until the agent confirms, every heartbeat listing it is a kill.
	r.advance(10 * time.Second)
	if rep := r.heartbeat(c, ref); len(rep.Kill) != 1 || rep.Kill[0] != ref {
		t.Fatalf("heartbeat with the orphan: kill %+v", rep.Kill)
	}
	r.cycle()
	if j := r.jobState(next); j.State != allot.JobPending {
		t.Fatalf("a new job got the orphan's GPUs: %s", j.State)
	}
	// The kill is confirmed (the heartbeat no longer lists it): the GPUs
	// are free, billed up to then, and the waiting job gets them.
	r.advance(10 * time.Second)
	confirmed := r.at()
	if rep := r.heartbeat(c); len(rep.Kill) != 0 {
		t.Errorf("kill %+v after the orphan ended", rep.Kill)
	}
	var held time.Duration
	var heldFrom, heldTo time.Time
	r.must(nil, r.pool.QueryRow(r.ctx, `SELECT min(started_at), max(released_at) FROM allocations WHERE job_id = $1 AND started_at >= $2`, job, comeback).Scan(&heldFrom, &heldTo))
	if held = heldTo.Sub(heldFrom); r.open(job) != 0 || !heldFrom.Equal(comeback) || !heldTo.Equal(confirmed) {
		t.Errorf("orphan's hold %v..%v (%v), want %v..%v, %d still open", heldFrom, heldTo, held, comeback, confirmed, r.open(job))
	}
	r.cycle()
	if j := r.jobState(next); j.State != allot.JobRunning || r.open(next) != 8 {
		t.Errorf("after the kill was confirmed the waiting job is %s with %d GPUs", j.State, r.open(next))
	}

	// A heartbeat listing a job the node never held: kill it, log it.
	stranger := agentproto.LeaseRef{JobID: 987654, Segment: 3}
	r.advance(10 * time.Second)
	rep := r.heartbeat(c, stranger)
	if len(rep.Kill) != 1 || rep.Kill[0] != stranger {
		t.Errorf("heartbeat with an unknown job: kill %+v", rep.Kill)
	}
	if !strings.Contains(r.logs.String(), "job=987654 segment=3") {
		t.Errorf("unknown job in a heartbeat not logged:\n%s", r.logs.String())
	}
}

// TestOrphanOutlivesItsStop: a lease asked to stop whose agent keeps
// listing it after the stop's deadline is ended by EndUnconfirmedStops
// (billing and the job move on) but keeps its GPUs until the agent confirms
// the kill, here by its exit report.
func TestOrphanOutlivesItsStop(t *testing.T) {
	r := newRig(t)
	c := r.agent("gpu13")
	job := r.submit(8)
	ref := r.start(c, job)
	admin, err := r.st.UserByEmail(r.ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.st.CancelJob(r.ctx, &admin, job); err != nil {
		t.Fatal(err)
	}
	// Far past the grace, the agent still lists it.
	r.advance(time.Hour)
	if rep := r.heartbeat(c, ref); len(rep.Kill) != 0 {
		t.Fatalf("a lease still open was killed: %+v", rep.Kill)
	}
	r.advance(time.Minute)
	if n, err := r.st.EndUnconfirmedStops(r.ctx, r.at()); err != nil || n != 1 {
		t.Fatalf("EndUnconfirmedStops = %d, %v", n, err)
	}
	if n := r.open(job); n != 8 {
		t.Fatalf("the lease outlived its stop, but %d of its 8 GPUs are held", n)
	}
	next := r.submit(8)
	if j := r.jobState(next); j.State != allot.JobPending {
		t.Fatalf("a new job got the GPUs of a process still running: %s", j.State)
	}
	if rep := r.heartbeat(c, ref); len(rep.Kill) != 1 {
		t.Fatalf("heartbeat with the ended lease: kill %+v", rep.Kill)
	}
	// The agent reports the exit after all: the kill is confirmed.
	r.advance(time.Second)
	if err := c.Exited(r.ctx, agentproto.JobExited{JobID: job, Segment: ref.Segment, ExitCode: -1, Signal: "SIGKILL", Time: r.at()}); err != nil {
		t.Fatal(err)
	}
	if n := r.open(job); n != 0 {
		t.Errorf("after the exit report %d GPUs are still held", n)
	}
	r.cycle()
	if j := r.jobState(next); j.State != allot.JobRunning {
		t.Errorf("the waiting job is %s", j.State)
	}
}

// TestResentLogBatchKeptOnce: an agent killed after the server took a
// batch of output but before it recorded so resends the batch: lines that
// end at or before what the server has are dropped, new ones kept, and
// lines without an offset (the agent's own) always kept. A batch whose
// ends do not match its lines is taken as it is.
func TestResentLogBatchKeptOnce(t *testing.T) {
	r := newRig(t)
	a := r.agent("gpu13")
	r.exec(`UPDATE nodes SET state = 'drained', drain_source = 'admin' WHERE name = 'gpu14'`)
	job := r.submit(8)
	ref := r.start(a, job)
	send := func(lines []string, ends []int64) {
		t.Helper()
		if err := a.Log(r.ctx, agentproto.JobLog{JobID: ref.JobID, Segment: ref.Segment, Lines: lines, Ends: ends}); err != nil {
			t.Fatal(err)
		}
	}
	send([]string{"start"}, []int64{6})
	send([]string{"a", "b"}, []int64{8, 10})
	// The restarted agent read the file from 0 again.
	send([]string{"start", "a", "b", "c", "allot: note"}, []int64{6, 8, 10, 12, 0})
	send([]string{"c"}, []int64{12})
	send([]string{"x", "y"}, []int64{1}) // mismatched: kept as sent
	lines, err := r.st.JobLog(r.ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"start", "a", "b", "c", "allot: note", "x", "y"}
	if !slices.Equal(lines, want) {
		t.Errorf("log = %q, want %q", lines, want)
	}
	var end int64
	r.must(nil, r.pool.QueryRow(r.ctx, `SELECT log_end FROM leases WHERE job_id = $1`, job).Scan(&end))
	if end != 12 {
		t.Errorf("log_end = %d, want 12", end)
	}
}

// TestCheckpointableJobRequeuedWhenItsAgentLostIt: an agent that comes back
// from a crash without a job's process (agent_restarted) lost it through no
// fault of the job: a checkpointable job goes back to the queue with its
// reason, as after a lost node; any other fails, as before.
func TestCheckpointableJobRequeuedWhenItsAgentLostIt(t *testing.T) {
	r := newRig(t)
	c := r.agent("gpu13")
	u, err := r.st.UserByEmail(r.ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, ckpt := range []bool{true, false} {
		j, err := r.st.SubmitJob(r.ctx, &u, allot.JobSpec{Team: "recs", Tier: allot.Tier3, GPUs: 4, GPUType: "T4", TimeLimit: time.Hour,
			Command: []string{"sleep", "600"}, Checkpointable: ckpt})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	r.cycle()
	o, err := c.Orders(r.ctx, 0)
	if err != nil || len(o.Offer) != 2 {
		t.Fatalf("offers: %+v %v", o, err)
	}
	var refs []agentproto.LeaseRef
	for _, off := range o.Offer {
		ref := agentproto.LeaseRef{JobID: off.JobID, Segment: off.Segment}
		if err := c.TakeLease(r.ctx, ref); err != nil {
			t.Fatal(err)
		}
		if err := c.Started(r.ctx, agentproto.JobStarted{JobID: ref.JobID, Segment: ref.Segment, PID: 4242, Time: r.at()}); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	r.advance(time.Minute)
	r.heartbeat(c, refs...)
	r.advance(time.Minute)
	// The agent crashed and came back without either process: the server
	// orders both stopped, and ends the leases when no exit report comes
	// (the worker's lost-nodes job, 30 s after the stop).
	if _, err := c.Register(r.ctx, inventory("gpu13")); err != nil {
		t.Fatal(err)
	}
	if o, err := c.Orders(r.ctx, 0); err != nil || len(o.Stop) != 2 || o.Stop[0].Reason != "agent_restarted" {
		t.Fatalf("orders after the restart: %+v %v; want both stopped (agent_restarted)", o, err)
	}
	r.advance(31 * time.Second)
	if n, err := r.st.EndUnconfirmedStops(r.ctx, r.at().Add(-30*time.Second)); err != nil || n != 2 {
		t.Fatalf("EndUnconfirmedStops = %d, %v; want 2", n, err)
	}
	ck, plain := r.jobState(ids[0]), r.jobState(ids[1])
	if ck.State != allot.JobPending || ck.PendingReason != "requeued: the agent on node gpu13 restarted without it" {
		t.Errorf("checkpointable job: %s, %q; want pending, requeued", ck.State, ck.PendingReason)
	}
	if plain.State != allot.JobFailed || plain.EndReason != "agent_restarted" {
		t.Errorf("other job: %s, %q; want failed, agent_restarted", plain.State, plain.EndReason)
	}
	for _, id := range ids {
		if n := r.open(id); n != 0 {
			t.Errorf("job %d: %d open allocations after its lease ended", id, n)
		}
	}
	// The requeued job runs again as its next segment.
	r.cycle()
	if o, err = c.Orders(r.ctx, 0); err != nil || len(o.Offer) != 1 || o.Offer[0].JobID != ids[0] || o.Offer[0].Segment != refs[0].Segment+1 {
		t.Fatalf("offer after the requeue: %+v %v; want job %d, segment %d", o, err, ids[0], refs[0].Segment+1)
	}
}
