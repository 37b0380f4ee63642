package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/clock"
)

// Version is reported in the inventory.
const Version = "0.1.0"

// Stop and exit reasons the agent itself uses in JobExited.Reason (besides
// the Reason of a server Stop order, which it passes through).
const (
	ReasonTimeLimit     = "time_limit"     // Lease.TimeLimit elapsed
	ReasonStartFailed   = "start_failed"   // the process could not be started (ExitCode 127)
	ReasonOrphaned      = "orphaned"       // listed in Registration.Unknown
	ReasonAgentShutdown = "agent_shutdown" // the agent was asked to exit
)

// Config configures an Agent. Zero values take the documented defaults.
type Config struct {
	Server   string // base URL of the Allot server
	Token    string // node token (allot_node_…)
	Hostname string // default os.Hostname()
	Domain   string // interconnect domain label reported in the inventory
	Backend  GPUBackend

	HeartbeatInterval time.Duration // default 10s; the server's Registration value wins when set
	OrdersWait        time.Duration // long-poll wait, default 25s
	Logger            *slog.Logger  // default slog.Default()
	// BaseEnv is every job's environment before the lease's Env is applied
	// (KEY=VALUE). Default: PATH, HOME, LANG, USER and TMPDIR from the
	// agent's own environment.
	BaseEnv []string
	// WorkDir is the working directory of a job that names none
	// (JobSpec.WorkDir). Default: the agent's own working directory.
	WorkDir string

	StopGrace      time.Duration // grace of a Stop order without one, default 120s
	TimeLimitGrace time.Duration // grace after the time limit, default 30s
	ShutdownGrace  time.Duration // grace for running jobs when the agent stops, default 10s
	RetryMax       time.Duration // cap of the reconnect/retry backoff, default 30s
	LogFlush       time.Duration // batch interval for log lines after the first, default 500ms
	LogTail        int           // lines of each job's output kept locally, default 200
	// HTTPClient overrides the client's transport (tests); Timeout must be 0.
	HTTPClient *http.Client
	// HealthCmd is the node's health check program (--health-cmd), run
	// every HealthInterval (default 60s) with a timeout of the interval (at
	// most 5 minutes): a non-zero exit, a timeout or a failure to start
	// reports the node unhealthy with its output. "" = none.
	HealthCmd      string
	HealthInterval time.Duration

	// StateDir keeps the agent's leases on disk (root-only), so a restarted
	// agent re-adopts running jobs. Default /var/lib/allot/agent/<hostname>
	// as root, else a directory under the user's cache.
	StateDir string
	// JobUser is the POSIX account of jobs whose lease names none.
	JobUser string
	// RunAsAgent runs jobs as the agent's own account, without cgroups:
	// for development on a machine where the agent cannot be root. Jobs can
	// then read the agent's token; never use it on a shared node.
	RunAsAgent bool
	// Cgroups: "auto" (default: a cgroup per job when the agent is root;
	// an agent that is root and cannot make cgroups refuses to start),
	// "off" (development only).
	Cgroups string
	// CgroupParent is the parent of the job cgroups, default
	// "allot/<hostname>".
	CgroupParent string
	// Limits of a job that sets none, per GPU it holds: memory (default:
	// the node's memory / its GPUs) and milli-CPUs (default: the node's
	// CPUs / its GPUs). PidsMax is every job's pids limit (default 16384).
	MemoryPerGPU    int64
	MilliCPUsPerGPU int64
	PidsMax         int64
	// ContainerRuntime runs jobs with an image: "podman" or "docker" (""
	// = none: such jobs fail to start here). ContainerRuntimePath
	// overrides the program (default: the name, from PATH).
	ContainerRuntime     string
	ContainerRuntimePath string
	// ContainerRuntimeArgs are global flags put before the runtime's
	// subcommand, e.g. ["-H", "unix:///run/docker.sock"] or ["--root", …].
	ContainerRuntimeArgs []string
	// KeepJobsOnExit leaves running jobs alone when the agent stops (the
	// next agent adopts them); otherwise the agent stops them first.
	KeepJobsOnExit bool
	// ShimPath is the program run as `PATH job-shim DIR` to supervise each
	// job; default this executable (allot). A test binary must call
	// MaybeShim first thing in TestMain.
	ShimPath string

	removeState bool // Local: remove StateDir when Run returns without jobs
}

func (c *Config) defaults() {
	if c.Hostname == "" {
		c.Hostname, _ = os.Hostname()
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = agentproto.DefaultHeartbeatInterval
	}
	if c.OrdersWait <= 0 {
		c.OrdersWait = 25 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.BaseEnv == nil {
		c.BaseEnv = DefaultBaseEnv()
	}
	if c.StopGrace <= 0 {
		c.StopGrace = 120 * time.Second
	}
	if c.TimeLimitGrace <= 0 {
		c.TimeLimitGrace = 30 * time.Second
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 30 * time.Second
	}
	if c.LogFlush <= 0 {
		c.LogFlush = 500 * time.Millisecond
	}
	if c.LogTail <= 0 {
		c.LogTail = 200
	}
	if c.HealthInterval <= 0 {
		c.HealthInterval = 60 * time.Second
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir(c.Hostname)
	}
	if c.Cgroups == "" {
		c.Cgroups = "auto"
	}
	if c.CgroupParent == "" {
		c.CgroupParent = "allot/" + c.Hostname
	}
	if c.PidsMax <= 0 {
		c.PidsMax = 16384
	}
	if c.ShimPath == "" {
		c.ShimPath, _ = os.Executable()
	}
}

// DefaultStateDir is where an agent for hostname keeps its leases.
func DefaultStateDir(hostname string) string {
	if os.Geteuid() == 0 {
		return filepath.Join("/var/lib/allot/agent", hostname)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "allot", "agent", hostname)
}

// DefaultBaseEnv returns PATH, HOME, LANG, USER and TMPDIR from the
// agent's environment (those that are set).
func DefaultBaseEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "LANG", "USER", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// Agent is one node's agent. Create it with New and run it with Run.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	client *agentproto.Client
	inv    GPUInventory
	gpuSet map[int]bool

	sess    session
	hbEvery atomic.Int64 // heartbeat interval in ns
	// noBatch: the server takes no batched takes or start reports (it
	// predates them); learnt at the first 404, forgotten at each
	// registration (the server may have been upgraded meanwhile).
	noBatch  atomic.Bool
	out      *outbox
	jobsDone sync.WaitGroup

	mu   sync.Mutex
	jobs map[agentproto.LeaseRef]*job

	// XID counts per GPU that the server has accepted in a heartbeat.
	xidMu   sync.Mutex
	xidSent map[int]int64
	// health is the last failed health check's report ("" = passing).
	health atomic.Pointer[string]

	cgd      *cgroupDriver // nil: no cgroups
	runtime  *containerRT  // nil: no container runtime
	shimPath string
	// detached is set when the agent exits leaving its jobs running; quit
	// is closed when Run returns.
	detached atomic.Bool
	quit     chan struct{}
}

// New returns an agent for cfg. Nothing happens until Run.
func New(cfg Config) *Agent {
	cfg.defaults()
	a := &Agent{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "agent", "host", cfg.Hostname),
		client:  agentproto.NewClient(cfg.Server, cfg.Token),
		jobs:    make(map[agentproto.LeaseRef]*job),
		gpuSet:  make(map[int]bool),
		xidSent: make(map[int]int64),
		quit:    make(chan struct{}),
	}
	if cfg.HTTPClient != nil {
		a.client.HTTP = cfg.HTTPClient
	}
	a.hbEvery.Store(int64(cfg.HeartbeatInterval))
	a.sess.init()
	a.out = newOutbox(a)
	return a
}

// Run registers the node, then heartbeats, polls for orders and runs jobs
// until ctx is cancelled. On cancellation it stops its running jobs
// (SIGTERM, ShutdownGrace, SIGKILL; reason "agent_shutdown"), tries for a
// few seconds to deliver the remaining reports, and returns nil. It returns
// an error when the configuration is unusable or the server refuses the
// first registration (e.g. an unknown token).
func (a *Agent) Run(ctx context.Context) error {
	if a.cfg.Server == "" {
		return errors.New("agent: no server URL")
	}
	if a.cfg.Token == "" {
		return errors.New("agent: no node token")
	}
	if a.cfg.Backend == nil {
		return errors.New("agent: no GPU backend")
	}
	inv, err := a.cfg.Backend.Inventory()
	if err != nil {
		return fmt.Errorf("agent: reading GPU inventory: %w", err)
	}
	a.inv = inv
	for _, g := range inv.GPUs {
		a.gpuSet[g.Index] = true
	}
	if err := a.prepare(); err != nil {
		return err
	}
	defer func() {
		if a.detached.Load() {
			return
		}
		if a.cgd != nil {
			a.cgd.removeParent()
		}
		if a.cfg.removeState {
			_ = os.RemoveAll(a.cfg.StateDir)
			_ = os.Remove(filepath.Dir(a.cfg.StateDir))
		}
	}()
	a.adopt()

	if err := a.register(ctx, true); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	var wg sync.WaitGroup
	wg.Go(func() { a.registrar(ctx) })
	wg.Go(func() { a.heartbeatLoop(ctx) })
	wg.Go(func() { a.ordersLoop(ctx) })
	if a.cfg.HealthCmd != "" {
		wg.Go(func() { a.healthLoop(ctx) })
	}
	outCtx, stopOut := context.WithCancel(context.WithoutCancel(ctx))
	outDone := make(chan struct{})
	go func() { a.out.run(outCtx); close(outDone) }()

	<-ctx.Done()
	wg.Wait()
	if a.cfg.KeepJobsOnExit {
		a.detached.Store(true)
		close(a.quit)
		a.mu.Lock()
		n := len(a.jobs)
		a.mu.Unlock()
		a.log.Info("agent exiting; its jobs keep running and the next agent adopts them", "jobs", n)
	} else {
		a.shutdownJobs()
	}
	// Give queued reports (the exits just produced) a short chance to go out.
	if !a.out.waitEmpty(5 * time.Second) {
		a.log.Warn("exiting with undelivered reports", "count", a.out.len())
	}
	stopOut()
	<-outDone
	if !a.detached.Load() {
		close(a.quit)
	}
	return nil
}

// session tracks whether the node is registered with the server.
type session struct {
	mu    sync.Mutex
	ready chan struct{} // closed while registered
	up    bool
	kick  chan struct{}
}

func (s *session) init() {
	s.ready = make(chan struct{})
	s.kick = make(chan struct{}, 1)
}

func (s *session) wait(ctx context.Context) error {
	s.mu.Lock()
	ch := s.ready
	s.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *session) setUp() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.up {
		s.up = true
		close(s.ready)
	}
}

// lost marks the session as needing a new registration.
func (s *session) lost() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.up {
		s.up = false
		s.ready = make(chan struct{})
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// connectionLost reacts to a failed call: no answer, 401, or a 404 on a
// node-level call (heartbeat, orders) means the server restarted, lost the
// node or the network broke, so the agent registers again (re-reporting its
// running jobs). A 404 on a job report means the job is unknown, not the node.
func (a *Agent) connectionLost(what string, err error) bool {
	st := agentproto.ErrorStatus(err)
	if st == 0 || st == http.StatusUnauthorized || (st == http.StatusNotFound && (what == "heartbeat" || what == "orders")) {
		a.sess.mu.Lock()
		wasUp := a.sess.up
		a.sess.mu.Unlock()
		if wasUp {
			a.log.Warn("lost the server; registering again", "during", what, "err", err)
		}
		a.sess.lost()
		return true
	}
	return false
}

func (a *Agent) registrar(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.sess.kick:
		}
		if err := a.register(ctx, false); err != nil {
			return // ctx done
		}
	}
}

// register registers until it succeeds or ctx ends. With first set, a 4xx
// answer (bad token, bad inventory) is returned as an error; afterwards the
// agent keeps trying.
func (a *Agent) register(ctx context.Context, first bool) error {
	bo := newBackoff(500*time.Millisecond, a.cfg.RetryMax)
	for {
		inv := agentproto.Inventory{
			Hostname:      a.cfg.Hostname,
			AgentVersion:  Version,
			Protocol:      agentproto.Version,
			GPUBackend:    a.inv.Backend,
			DriverVersion: a.inv.DriverVersion,
			GPUs:          a.inv.GPUs,
			Domain:        a.cfg.Domain,
			Running:       a.runningJobs(),
			Isolation:     a.isolation(),
		}
		if a.runtime != nil {
			inv.Runtimes = []string{a.runtime.name}
		}
		reg, err := a.client.Register(ctx, inv)
		if err == nil {
			a.noBatch.Store(false)
			if reg.HeartbeatInterval > 0 {
				a.hbEvery.Store(int64(reg.HeartbeatInterval))
			}
			a.log.Info("registered", "server", a.cfg.Server, "node", reg.Node, "gpus", len(inv.GPUs), "running", len(inv.Running), "unknown", reg.Unknown)
			if len(reg.UnknownLeases) > 0 {
				for _, r := range reg.UnknownLeases {
					a.stopJob(r.JobID, r.Segment, 0, ReasonOrphaned)
				}
			} else {
				for _, id := range reg.Unknown {
					a.stopJob(id, 0, a.cfg.StopGrace, ReasonOrphaned)
				}
			}
			a.sess.setUp()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		st := agentproto.ErrorStatus(err)
		if first && st >= 400 && st < 500 && st != http.StatusTooManyRequests && st != http.StatusRequestTimeout {
			return fmt.Errorf("agent: the server refused to register this node: %w", err)
		}
		d := bo.next()
		if st == 0 {
			a.log.Warn("server unreachable; retrying", "server", a.cfg.Server, "in", d.Round(time.Millisecond), "err", err)
		} else {
			a.log.Error("registration refused; retrying", "server", a.cfg.Server, "in", d.Round(time.Millisecond), "err", err)
		}
		if !sleepCtx(ctx, d) {
			return ctx.Err()
		}
	}
}

func (a *Agent) heartbeatLoop(ctx context.Context) {
	for {
		if a.sess.wait(ctx) != nil {
			return
		}
		hb := a.heartbeat()
		rep, err := a.client.Heartbeat(ctx, hb)
		if err == nil {
			a.xidsDelivered(hb)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !a.connectionLost("heartbeat", err) {
				a.log.Warn("heartbeat refused", "err", err)
			}
		case rep.NodeState != "" && rep.NodeState != "up":
			a.log.Debug("heartbeat", "node_state", rep.NodeState)
		}
		for _, r := range rep.Kill {
			// The server ended this lease (cancelled, lost, requeued): its
			// processes must not hold the GPUs a moment longer.
			a.log.Warn("the server ended a lease this node still runs; killing it", "job", r.JobID, "segment", r.Segment)
			a.stopJob(r.JobID, r.Segment, 0, ReasonOrphaned)
		}
		if !sleepCtx(ctx, time.Duration(a.hbEvery.Load())) {
			return
		}
	}
}

// heartbeat reads the GPUs and the running jobs' processes.
func (a *Agent) heartbeat() agentproto.Heartbeat {
	busy, _ := a.busyGPUs()
	gpus, err := a.cfg.Backend.Metrics(busy)
	hb := agentproto.Heartbeat{Time: clock.Now().UTC(), GPUs: gpus, Jobs: []agentproto.JobStats{}}
	if err != nil {
		a.log.Warn("reading GPU metrics", "err", err)
		hb.MetricsError = err.Error()
	}
	a.mu.Lock()
	var running []*job
	for _, j := range a.jobs {
		if j.pid > 0 {
			running = append(running, j)
		}
	}
	a.mu.Unlock()
	slices.SortFunc(running, func(x, y *job) int { return cmpRef(x.ref, y.ref) })
	for _, j := range running {
		var cpu float64
		var rss int64
		if j.cg != nil {
			cpu, rss = pidStats(j.cg.Procs())
		} else {
			cpu, rss = groupStats(j.pid)
		}
		hb.Jobs = append(hb.Jobs, agentproto.JobStats{JobID: j.ref.JobID, Segment: j.ref.Segment, PID: j.pid, CPUSeconds: cpu, RSSBytes: rss,
			LastCheckpoint: lastCheckpoint(j.lease.CheckpointDir)})
	}
	if hb.GPUs == nil {
		hb.GPUs = []agentproto.GPUMetrics{}
	}
	// Only the XIDs the server has not accepted yet.
	a.xidMu.Lock()
	for i := range hb.GPUs {
		m := &hb.GPUs[i]
		n := m.XIDErrors - a.xidSent[m.Index]
		switch {
		case n <= 0:
			m.XIDs = nil
		case int(n) < len(m.XIDs):
			m.XIDs = m.XIDs[len(m.XIDs)-int(n):]
		}
	}
	a.xidMu.Unlock()
	if h := a.health.Load(); h != nil {
		hb.Health = *h
	}
	return hb
}

// xidsDelivered records the XID counts of an accepted heartbeat.
func (a *Agent) xidsDelivered(hb agentproto.Heartbeat) {
	a.xidMu.Lock()
	defer a.xidMu.Unlock()
	for _, m := range hb.GPUs {
		a.xidSent[m.Index] = m.XIDErrors
	}
}

func (a *Agent) ordersLoop(ctx context.Context) {
	bo := newBackoff(100*time.Millisecond, a.cfg.RetryMax)
	for {
		if a.sess.wait(ctx) != nil {
			return
		}
		o, err := a.client.Orders(ctx, a.cfg.OrdersWait)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if !a.connectionLost("orders", err) {
				a.log.Warn("polling orders", "err", err)
			}
			if !sleepCtx(ctx, bo.next()) {
				return
			}
			continue
		}
		bo.reset()
		a.handle(ctx, o)
	}
}

// handle carries out one batch of orders: stops first (they free GPUs),
// then offers, then starts.
func (a *Agent) handle(ctx context.Context, o agentproto.Orders) {
	for _, s := range o.Stop {
		grace := s.Grace
		if grace <= 0 {
			grace = a.cfg.StopGrace
		}
		reason := s.Reason
		if reason == "" {
			reason = "stopped"
		}
		a.stopJob(s.JobID, s.Segment, grace, reason)
	}
	var take []agentproto.LeaseRef
	for _, l := range o.Offer {
		if a.offer(l) {
			take = append(take, agentproto.LeaseRef{JobID: l.JobID, Segment: l.Segment})
		}
	}
	// The takes answer with the starts now due (a single-node job's at
	// once), which the server will not send again.
	starts := append(o.Start, a.takeAll(ctx, take)...)
	for _, ref := range starts {
		a.start(ref)
	}
}

// offer decides whether to take a lease: when its GPUs exist and no other
// job holds them (it is then held as taken), or when it is offered again
// while taken (our take may not have arrived; taking is idempotent).
func (a *Agent) offer(l agentproto.Lease) bool {
	ref := agentproto.LeaseRef{JobID: l.JobID, Segment: l.Segment}
	a.mu.Lock()
	defer a.mu.Unlock()
	if j, ok := a.jobs[ref]; ok {
		return j.state == stateTaken
	}
	if reason := a.cannotHoldLocked(l); reason != "" {
		a.log.Warn("not taking lease", "job", l.JobID, "segment", l.Segment, "gpus", l.GPUs, "why", reason)
		return false
	}
	a.jobs[ref] = &job{ref: ref, lease: l, state: stateTaken}
	return true
}

// takeAll takes refs: in batches of agentproto.MaxBatch (one request and
// one transaction each), or one by one from a server that predates them.
// It returns the start orders the batches' answers carried.
func (a *Agent) takeAll(ctx context.Context, refs []agentproto.LeaseRef) []agentproto.LeaseRef {
	var starts []agentproto.LeaseRef
	for len(refs) > 0 && !a.noBatch.Load() {
		chunk := refs[:min(len(refs), agentproto.MaxBatch)]
		rep, err := a.client.TakeLeases(ctx, chunk)
		if errors.Is(err, agentproto.ErrNoBatch) {
			a.log.Info("the server takes no batched reports; taking leases one by one", "err", err)
			a.noBatch.Store(true)
			break
		}
		refs = refs[len(chunk):]
		for i, ref := range chunk {
			if err == nil {
				a.took(ref, rep.Results[i].Err())
			} else {
				a.took(ref, err)
			}
		}
		starts = append(starts, rep.Start...)
	}
	for _, ref := range refs {
		a.took(ref, a.client.TakeLease(ctx, ref))
	}
	return starts
}

// took acts on a take's answer: done, kept for the next offer (the server
// unreachable or busy), or released (refused).
func (a *Agent) took(ref agentproto.LeaseRef, err error) {
	log := a.log.With("job", ref.JobID, "segment", ref.Segment)
	if err == nil {
		log.Info("took lease")
		return
	}
	if a.connectionLost("take lease", err) {
		// Keep the GPUs held: the server may have recorded the take. It will
		// offer again (we re-take) or stop the lease.
		return
	}
	if st := agentproto.ErrorStatus(err); st == http.StatusTooManyRequests || st >= 500 {
		// A busy server (its admission control, an overloaded database):
		// the take may yet be recorded, and a live node's untaken offer is
		// sent again; keep the GPUs held and take it then.
		log.Warn("server busy; keeping the lease until it is offered again", "status", st, "err", err)
		return
	}
	log.Warn("server refused the take; releasing the lease", "err", err)
	a.mu.Lock()
	if j := a.jobs[ref]; j != nil && j.state == stateTaken {
		delete(a.jobs, ref)
	}
	a.mu.Unlock()
}

// cannotHoldLocked says why lease l cannot run here, "" when it can.
func (a *Agent) cannotHoldLocked(l agentproto.Lease) string {
	seen := map[int]bool{}
	for _, g := range l.GPUs {
		if !a.gpuSet[g] {
			return fmt.Sprintf("GPU %d does not exist on this node", g)
		}
		if seen[g] {
			return fmt.Sprintf("GPU %d listed twice", g)
		}
		seen[g] = true
	}
	for _, j := range a.jobs {
		for _, g := range j.lease.GPUs {
			if seen[g] {
				return fmt.Sprintf("GPU %d is held by job %d segment %d", g, j.ref.JobID, j.ref.Segment)
			}
		}
	}
	return ""
}

// busyGPUs returns the GPUs of running jobs and, for each, its job.
func (a *Agent) busyGPUs() (map[int]bool, map[int]*job) {
	a.mu.Lock()
	defer a.mu.Unlock()
	busy := map[int]bool{}
	owner := map[int]*job{}
	for _, j := range a.jobs {
		if j.state != stateRunning {
			continue
		}
		for _, g := range j.lease.GPUs {
			busy[g] = true
			owner[g] = j
		}
	}
	return busy, owner
}

func (a *Agent) runningJobs() []agentproto.RunningJob {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []agentproto.RunningJob
	for _, j := range a.jobs {
		if j.state == stateRunning {
			out = append(out, agentproto.RunningJob{JobID: j.ref.JobID, Segment: j.ref.Segment, PID: j.pid, Started: j.started})
		}
	}
	slices.SortFunc(out, func(x, y agentproto.RunningJob) int {
		return cmpRef(agentproto.LeaseRef{JobID: x.JobID, Segment: x.Segment}, agentproto.LeaseRef{JobID: y.JobID, Segment: y.Segment})
	})
	return out
}

// Tail returns the last lines of a job's output that the agent still holds
// (while the job runs).
func (a *Agent) Tail(jobID int64, segment int) []string {
	a.mu.Lock()
	j := a.jobs[agentproto.LeaseRef{JobID: jobID, Segment: segment}]
	a.mu.Unlock()
	if j == nil || j.logs == nil {
		return nil
	}
	return j.logs.tailLines()
}

func cmpRef(x, y agentproto.LeaseRef) int {
	if x.JobID != y.JobID {
		if x.JobID < y.JobID {
			return -1
		}
		return 1
	}
	return x.Segment - y.Segment
}

// backoff is capped exponential backoff with jitter.
type backoff struct {
	min, max, cur time.Duration
}

func newBackoff(lo, hi time.Duration) *backoff {
	if hi < lo {
		hi = lo
	}
	return &backoff{min: lo, max: hi}
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	// ±20 % jitter so a fleet of agents does not reconnect in lockstep.
	j := time.Duration(float64(b.cur) * (0.8 + 0.4*rand.Float64()))
	return min(j, b.max)
}

func (b *backoff) reset() { b.cur = 0 }

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func trimLine(b []byte) string {
	return strings.TrimRight(string(b), "\r\n")
}
