package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/clock"
)

type jobState int

const (
	stateTaken    jobState = iota // lease taken, GPUs held, waiting for Start
	stateStarting                 // Start received, process being started
	stateRunning                  // process alive
)

// job is one lease on this node. Fields other than ref and lease are
// guarded by Agent.mu.
type job struct {
	ref   agentproto.LeaseRef
	lease agentproto.Lease
	state jobState

	pid     int // the job's main process
	started time.Time
	logs    *logStream

	// Set once the agent decided to stop the job.
	stopReason string
	lastSignal syscall.Signal
	killTimer  *time.Timer
	killAt     time.Time
	limitTimer *time.Timer
	pending    *pendingStop // stop requested while starting

	// How it runs: its state directory, cgroup (nil without cgroups) and
	// supervisor (the job shim).
	dir       string
	cg        *jobCgroup
	shimPID   int
	shimStart uint64
	tmpDir    string
}

type pendingStop struct {
	grace  time.Duration
	reason string
}

// leaseRecord is DIR/lease.json: what a restarted agent needs to adopt the
// job.
type leaseRecord struct {
	Lease     agentproto.Lease `json:"lease"`
	PID       int              `json:"pid"`
	Started   time.Time        `json:"started"`
	ShimPID   int              `json:"shim_pid"`
	ShimStart uint64           `json:"shim_start"`
	Cgroup    string           `json:"cgroup,omitempty"` // name under the agent's cgroup parent
	TmpDir    string           `json:"tmp_dir,omitempty"`
}

func leaseName(ref agentproto.LeaseRef) string {
	return fmt.Sprintf("job-%d-%d", ref.JobID, ref.Segment)
}

// start starts a taken lease's process.
func (a *Agent) start(ref agentproto.LeaseRef) {
	log := a.log.With("job", ref.JobID, "segment", ref.Segment)
	a.mu.Lock()
	j := a.jobs[ref]
	if j == nil {
		a.mu.Unlock()
		log.Warn("start order for a lease this agent has not taken")
		a.out.exited(agentproto.JobExited{JobID: ref.JobID, Segment: ref.Segment, ExitCode: 127, Reason: ReasonStartFailed,
			Message: "the agent holds no lease for this job (not taken or lost by an agent restart)", Time: clock.Now().UTC()})
		return
	}
	if j.state != stateTaken {
		a.mu.Unlock()
		return // duplicate start
	}
	j.state = stateStarting
	a.mu.Unlock()

	l := j.lease
	var cg *jobCgroup
	var tmp string
	dir := filepath.Join(a.leasesDir(), leaseName(ref))
	fail := func(err error) {
		log.Warn("job failed to start", "err", err)
		if tmp != "" {
			_ = os.RemoveAll(tmp)
		}
		if cg != nil {
			_ = cg.Kill()
			_ = cg.Delete()
		}
		_ = os.RemoveAll(dir)
		a.mu.Lock()
		delete(a.jobs, ref)
		a.mu.Unlock()
		a.out.exited(agentproto.JobExited{JobID: ref.JobID, Segment: ref.Segment, ExitCode: 127, Reason: ReasonStartFailed,
			Message: err.Error(), Time: clock.Now().UTC()})
	}
	if len(l.Command) == 0 {
		fail(errors.New("the lease has an empty command"))
		return
	}
	id, err := a.jobIdentity(l)
	if err != nil {
		fail(err)
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		fail(err)
		return
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		fail(fmt.Errorf("creating the lease directory: %w", err))
		return
	}
	if l.CheckpointDir != "" {
		if err := ownedDir(l.CheckpointDir, id); err != nil {
			fail(fmt.Errorf("creating checkpoint dir: %w", err))
			return
		}
	}
	tmp, err = os.MkdirTemp("", "allot-"+leaseName(ref)+"-")
	if err == nil {
		err = ownedDir(tmp, id)
	}
	if err != nil {
		fail(fmt.Errorf("creating the job's TMPDIR: %w", err))
		return
	}
	workdir := l.WorkDir
	if workdir == "" {
		workdir = a.cfg.WorkDir
	}
	// The account's HOME and a private TMPDIR, unless the job sets its
	// own; USER and LOGNAME are the account's.
	// A host job gets its own /tmp (a mount namespace), unless its working
	// or checkpoint directory lies under /tmp: it could not reach them.
	ownTmp := !id.Same && l.Image == "" && !underTmp(l.WorkDir) && !underTmp(a.cfg.WorkDir) && !underTmp(l.CheckpointDir)
	jobTmp := tmp
	if ownTmp {
		jobTmp = "/tmp"
	}
	base := setEnv(slices.Clone(a.cfg.BaseEnv), "HOME", id.Home, "TMPDIR", jobTmp)
	env := jobEnv(base, l.Env)
	env = setEnv(env, "USER", id.Name, "LOGNAME", id.Name, "ALLOT_GPU_DEVICES", strings.Join(a.gpuDevicePaths(l.GPUs), ","))
	if a.cgd != nil {
		lim := a.jobLimits(l)
		if cg, err = a.cgd.create(leaseName(ref), lim); err != nil {
			fail(err)
			return
		}
	}
	spec := shimSpec{Env: env, Dir: workdir, UID: id.UID, GID: id.GID, Groups: id.Groups, SameUser: id.Same,
		Output: filepath.Join(dir, "output.log")}
	if ownTmp {
		spec.PrivateTmp = tmp // the job's own directory is its /tmp
	}
	if cg != nil {
		spec.Cgroup, spec.CgroupV2, spec.CgroupRoot = cg.Path(), a.cgd.v2, a.cgd.root
	}
	if l.Image != "" {
		if a.runtime == nil {
			fail(fmt.Errorf("the job asks for image %s but node %s has no container runtime (allot agent --container-runtime)", l.Image, a.cfg.Hostname))
			return
		}
		// The runtime (root) mounts what it is given: only what the
		// account could reach on the node.
		src, err := reachableDir(workdir, id)
		if err != nil {
			fail(err)
			return
		}
		argv, cleanup, err := a.runtime.command(containerJob{Name: filepath.Base(tmp), Lease: l, ID: id,
			Env: env, Workdir: workdir, WorkdirSource: src, Tmp: tmp, Cgroup: spec.Cgroup, Devices: a.gpuDevicePaths(l.GPUs), Ctl: a.ctlDevicePaths(), Dir: dir, PidsMax: a.cfg.PidsMax})
		if err != nil {
			fail(err)
			return
		}
		spec.Argv, spec.Cleanup, spec.AsRoot = argv, cleanup, true
		spec.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
		spec.Dir = dir
	} else {
		p := l.Command[0]
		switch {
		case !strings.Contains(p, "/"):
			// Resolve a bare name with the job's PATH, not the agent's.
			if q, ok := lookPathAs(p, env, id); ok {
				p = q
			} else {
				fail(fmt.Errorf("exec: %q: executable file not found in the job's PATH", p))
				return
			}
		case !filepath.IsAbs(p):
			p = filepath.Join(workdir, p)
		}
		spec.Argv = append([]string{p}, l.Command[1:]...)
	}
	cmd, pid, err := startShim(a.shimPath, dir, spec, a.shimEnv())
	if err != nil {
		fail(err)
		return
	}
	now := time.Now()
	shimStart, _ := procStartTime(cmd.Process.Pid)
	// The record on disk needs no environment (it may hold secrets).
	stored := l
	stored.Env = nil
	rec := leaseRecord{Lease: stored, PID: pid, Started: now, ShimPID: cmd.Process.Pid, ShimStart: shimStart, TmpDir: tmp}
	if cg != nil {
		rec.Cgroup = leaseName(ref)
	}
	if err := writeJSONFile(filepath.Join(dir, "lease.json"), rec); err != nil {
		log.Warn("could not record the lease on disk; an agent restart will not re-adopt it", "err", err)
	}
	log.Info("job started", "pid", pid, "user", id.Name, "command", l.Command, "image", l.Image)
	a.run(j, rec, cg, 0, func() { _ = cmd.Wait() }, func() {
		a.out.started(agentproto.JobStarted{JobID: ref.JobID, Segment: ref.Segment, PID: pid, Time: now.UTC()})
	})
}

// run makes j a running job supervised by its shim: it follows the job's
// output from logOffset, arms the time limit, and settles the job once
// wait returns (the shim exited). started, when set, reports the start:
// once the job counts as running (its GPUs busy in heartbeats and
// metrics) and before its end can be reported.
func (a *Agent) run(j *job, rec leaseRecord, cg *jobCgroup, logOffset int64, wait func(), started func()) {
	ref := j.ref
	logs := newLogStream(a, ref, a.cfg.LogTail, a.cfg.LogFlush)
	a.mu.Lock()
	j.pid = rec.PID
	j.started = rec.Started
	j.state = stateRunning
	j.logs = logs
	j.dir = filepath.Join(a.leasesDir(), leaseName(ref))
	j.cg = cg
	j.shimPID, j.shimStart = rec.ShimPID, rec.ShimStart
	j.tmpDir = rec.TmpDir
	if l := j.lease; l.TimeLimit > 0 {
		left := max(l.TimeLimit-time.Since(rec.Started), 0)
		j.limitTimer = time.AfterFunc(left, func() {
			a.log.Info("time limit reached", "job", ref.JobID, "segment", ref.Segment, "limit", l.TimeLimit)
			a.stopJob(ref.JobID, ref.Segment, a.cfg.TimeLimitGrace, ReasonTimeLimit)
		})
	}
	pend := j.pending
	j.pending = nil
	a.mu.Unlock()
	if started != nil {
		started()
	}

	stopTail := make(chan struct{})
	tailDone := make(chan struct{})
	go func() {
		logs.follow(filepath.Join(j.dir, "output.log"), filepath.Join(j.dir, "log.offset"), logOffset, stopTail, a.quit)
		close(tailDone)
	}()
	a.jobsDone.Add(1)
	go func() {
		defer a.jobsDone.Done()
		wait()
		if a.detached.Load() {
			return // the agent exits and leaves its jobs running
		}
		close(stopTail)
		<-tailDone
		a.settle(j)
	}()
	if pend != nil {
		a.stopJob(ref.JobID, ref.Segment, pend.grace, pend.reason)
	}
}

// settle reports the end of a job whose shim exited: its exit status
// (DIR/exit.json), with nothing of it left running, and forgets the lease
// once the server has the report.
func (a *Agent) settle(j *job) {
	j.logs.close()
	var rec exitRecord
	e := agentproto.JobExited{JobID: j.ref.JobID, Segment: j.ref.Segment, LastCheckpoint: lastCheckpoint(j.lease.CheckpointDir)}
	if err := readJSONFile(filepath.Join(j.dir, "exit.json"), &rec); err != nil {
		e.ExitCode, e.Time = -1, clock.Now().UTC()
		e.Message = "the job's supervisor (allot job-shim) ended without an exit status; the job was killed"
	} else {
		e.ExitCode, e.Signal, e.Time = rec.ExitCode, rec.Signal, rec.Time
	}
	// The shim killed what was left; make sure of it (a shim killed with
	// -9 could not).
	if j.cg != nil {
		if err := j.cg.Kill(); err != nil {
			a.log.Error("job processes survive their end", "job", e.JobID, "err", err)
		} else {
			_ = j.cg.Delete()
		}
	} else if j.pid > 0 {
		_ = syscall.Kill(-j.pid, syscall.SIGKILL)
	}
	if j.tmpDir != "" {
		_ = os.RemoveAll(j.tmpDir)
	}
	a.mu.Lock()
	if j.killTimer != nil {
		j.killTimer.Stop()
	}
	if j.limitTimer != nil {
		j.limitTimer.Stop()
	}
	e.Reason = j.stopReason
	if e.Signal == "" && j.lastSignal != 0 {
		e.Signal = unix.SignalName(j.lastSignal)
	}
	delete(a.jobs, j.ref)
	a.mu.Unlock()
	a.log.Info("job exited", "job", e.JobID, "segment", e.Segment, "exit_code", e.ExitCode, "signal", e.Signal, "reason", e.Reason)
	dir := j.dir
	a.out.exitedThen(e, func() {
		if os.Getenv("ALLOT_KEEP_LEASE_DIRS") == "" {
			_ = os.RemoveAll(dir)
		}
	})
}

// signal sends sig to every process of the job.
func (j *job) signal(sig syscall.Signal) {
	if j.cg != nil {
		j.cg.Signal(sig)
		return
	}
	if j.pid > 0 {
		_ = syscall.Kill(-j.pid, sig)
	}
}

// stopJob stops a job: SIGTERM to all its processes, then SIGKILL after
// grace. segment 0 means any segment of the job. A second stop while one is
// in progress can only shorten the grace; the first reason stays.
func (a *Agent) stopJob(jobID int64, segment int, grace time.Duration, reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	found := false
	for ref, j := range a.jobs {
		if ref.JobID != jobID || (segment != 0 && ref.Segment != segment) {
			continue
		}
		found = true
		log := a.log.With("job", ref.JobID, "segment", ref.Segment, "reason", reason)
		switch j.state {
		case stateTaken:
			// Never started: release the GPUs and tell the server.
			delete(a.jobs, ref)
			log.Info("released a lease that had not started")
			a.out.exited(agentproto.JobExited{JobID: ref.JobID, Segment: ref.Segment, ExitCode: -1, Reason: reason,
				Message: "stopped before it started", Time: clock.Now().UTC()})
		case stateStarting:
			if j.pending == nil || grace < j.pending.grace {
				j.pending = &pendingStop{grace: grace, reason: reason}
			}
		case stateRunning:
			if j.stopReason == "" {
				j.stopReason = reason
				j.lastSignal = syscall.SIGTERM
				log.Info("stopping job", "grace", grace)
				j.signal(syscall.SIGTERM)
				j.killAt = time.Now().Add(grace)
				j.killTimer = time.AfterFunc(grace, func() { a.kill(j) })
			} else if at := time.Now().Add(grace); j.killTimer != nil && at.Before(j.killAt) {
				j.killAt = at
				j.killTimer.Reset(grace)
			}
		}
	}
	if !found {
		a.log.Debug("stop order for a job not on this node", "job", jobID, "segment", segment)
	}
}

func (a *Agent) kill(j *job) {
	a.mu.Lock()
	if cur := a.jobs[j.ref]; cur != j {
		a.mu.Unlock()
		return
	}
	j.lastSignal = syscall.SIGKILL
	a.mu.Unlock()
	a.log.Info("grace period over; killing job", "job", j.ref.JobID, "segment", j.ref.Segment)
	if j.cg != nil {
		_ = j.cg.Kill()
		return
	}
	_ = syscall.Kill(-j.pid, syscall.SIGKILL)
}

// shutdownJobs stops every job because the agent is exiting and waits for
// them (bounded by the grace).
func (a *Agent) shutdownJobs() {
	a.mu.Lock()
	var ids []agentproto.LeaseRef
	for ref := range a.jobs {
		ids = append(ids, ref)
	}
	a.mu.Unlock()
	for _, ref := range ids {
		a.stopJob(ref.JobID, ref.Segment, a.cfg.ShutdownGrace, ReasonAgentShutdown)
	}
	done := make(chan struct{})
	go func() { a.jobsDone.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(a.cfg.ShutdownGrace + 5*time.Second):
		a.log.Warn("jobs still running at agent exit")
	}
}

// setEnv sets KEY, VALUE pairs in a sorted KEY=VALUE list.
func setEnv(env []string, kv ...string) []string {
	for i := 0; i+1 < len(kv); i += 2 {
		k, v := kv[i], kv[i+1]
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") })
		if v != "" {
			env = append(env, k+"="+v)
		}
	}
	sort.Strings(env)
	return env
}

// jobEnv is base overlaid with the lease's env (the lease wins), sorted.
func jobEnv(base []string, env map[string]string) []string {
	m := make(map[string]string, len(base)+len(env))
	for _, kv := range base {
		k, v, ok := strings.Cut(kv, "=")
		if ok {
			m[k] = v
		}
	}
	for k, v := range env {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func lookPath(name string, env []string) (string, bool) {
	return lookPathFunc(name, env, func(p string, fi os.FileInfo) bool { return fi.Mode()&0o111 != 0 })
}

// lookPathFunc finds name on env's PATH: the first regular file that ok
// accepts.
func lookPathFunc(name string, env []string, ok func(string, os.FileInfo) bool) (string, bool) {
	path := ""
	for _, kv := range env {
		if v, found := strings.CutPrefix(kv, "PATH="); found {
			path = v
		}
	}
	for dir := range strings.SplitSeq(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && ok(p, fi) {
			return p, true
		}
	}
	return "", false
}

// logStream captures a job's output line by line: it keeps the last lines
// and sends new ones to the server, the first at once, then in batches.
type logStream struct {
	a     *Agent
	ref   agentproto.LeaseRef
	flush time.Duration

	mu      sync.Mutex
	tail    []string
	max     int
	pending []string
	ends    []int64 // pending lines' end offsets in the output file (0: none)
	first   bool
	timer   *time.Timer
	closed  bool
	// offsetFile records how far into the output file the server has the
	// lines; lastOff is where the last added line ends.
	offsetFile string
	lastOff    int64
}

func newLogStream(a *Agent, ref agentproto.LeaseRef, tail int, flush time.Duration) *logStream {
	return &logStream{a: a, ref: ref, max: tail, flush: flush}
}

const maxLineBytes = 16 << 10

// follow reads the job's output file from offset, line by line, until
// stop is closed and the file is read to its end. It records how far it
// sent in offsetFile, so an agent restarted mid-job goes on from there.
// A closed quit (the agent exits, leaving the job running) ends it at once.
func (s *logStream) follow(path, offsetFile string, offset int64, stop, quit <-chan struct{}) {
	var f *os.File
	for f == nil {
		var err error
		if f, err = os.Open(path); err != nil {
			f = nil
			select {
			case <-stop:
				return
			case <-quit:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	defer f.Close()
	s.mu.Lock()
	s.offsetFile = offsetFile
	s.mu.Unlock()
	if offset > 0 {
		_, _ = f.Seek(offset, io.SeekStart)
	}
	r := bufio.NewReaderSize(f, maxLineBytes)
	var partial []byte
	stopping := false
	idle := 2 * time.Millisecond
	for {
		b, err := r.ReadSlice('\n')
		if len(b) > 0 {
			idle = 2 * time.Millisecond
			offset += int64(len(b))
			if err == nil || errors.Is(err, bufio.ErrBufferFull) {
				line := append(partial, b...)
				partial = nil
				s.addAt(trimLine(line), offset)
				continue
			}
			partial = append(partial, b...) // no newline yet
			if len(partial) >= maxLineBytes {
				s.addAt(trimLine(partial), offset)
				partial = nil
			}
		}
		if stopping {
			if len(partial) > 0 {
				s.addAt(trimLine(partial), offset)
			}
			return
		}
		select {
		case <-stop:
			stopping = true // one more read to the end
		case <-quit:
			return
		case <-time.After(idle):
		}
		// Poll fast while output flows or just after the start (first
		// output is what users feel), then back off to 50 ms.
		idle = min(idle*2, 50*time.Millisecond)
	}
}

// saveOffset returns what records off once its lines are delivered.
func (s *logStream) saveOffset(off int64) func() {
	file := s.offsetFile
	if file == "" || off < 0 {
		return nil
	}
	return func() { _ = os.WriteFile(file, []byte(strconv.FormatInt(off, 10)), 0o600) }
}

// readOffset is the output offset an earlier agent recorded for a job.
func readOffset(offsetFile string) int64 {
	b, err := os.ReadFile(offsetFile)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// addAt adds a line that ends at byte off of the job's output file (-1:
// not from a file). Once the server has the line, off is recorded in the
// offset file: a restarted agent resends nothing it has, and loses
// nothing it had not delivered.
func (s *logStream) addAt(line string, off int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if off >= 0 {
		s.lastOff = off
	}
	s.tail = append(s.tail, line)
	if len(s.tail) > s.max {
		s.tail = slices.Delete(s.tail, 0, len(s.tail)-s.max)
	}
	if s.closed {
		return
	}
	if !s.first {
		// The very first line goes out at once: submit→first output is
		// what users feel.
		s.first = true
		s.a.out.log(s.ref, []string{line}, []int64{max(off, 0)}, s.saveOffset(s.lastOff))
		return
	}
	s.pending = append(s.pending, line)
	s.ends = append(s.ends, max(off, 0))
	if s.timer == nil {
		s.timer = time.AfterFunc(s.flush, s.flushNow)
	}
}

func (s *logStream) flushNow() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
}

func (s *logStream) flushLocked() {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if len(s.pending) > 0 {
		s.a.out.log(s.ref, s.pending, s.ends, s.saveOffset(s.lastOff))
		s.pending, s.ends = nil, nil
	}
}

// close sends what is pending; later lines are only kept in the tail.
func (s *logStream) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	s.closed = true
}

func (s *logStream) tailLines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.tail)
}

// lastCheckpoint is the newest modification time of the checkpoint
// directory's entries (and of the files one level below them), or nil when
// the job has no checkpoint directory or nothing in it.
func lastCheckpoint(dir string) *time.Time {
	if dir == "" {
		return nil
	}
	var newest time.Time
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	seen := 0
	for _, e := range entries {
		if seen++; seen > 1000 {
			break
		}
		if info, err := e.Info(); err == nil && info.ModTime().After(newest) {
			newest = info.ModTime()
		}
		if e.IsDir() {
			sub, err := os.ReadDir(filepath.Join(dir, e.Name()))
			if err != nil {
				continue
			}
			for _, f := range sub {
				if seen++; seen > 1000 {
					break
				}
				if info, err := f.Info(); err == nil && info.ModTime().After(newest) {
					newest = info.ModTime()
				}
			}
		}
	}
	if newest.IsZero() {
		return nil
	}
	// File times are the real time; the agent reports on its clock.
	newest = newest.Add(clock.Offset()).UTC()
	return &newest
}

// lookPathAs is lookPath for the job's account: a candidate the account
// cannot reach or execute (e.g. under root's 0700 home on the agent's
// PATH) is skipped, as the account's own shell would skip it.
func lookPathAs(name string, env []string, id identity) (string, bool) {
	if id.Same {
		return lookPath(name, env)
	}
	return lookPathFunc(name, env, func(p string, _ os.FileInfo) bool { return canExec(p, id) })
}

// canExec reports whether account id may execute the file at p: every
// directory on the way searchable by it, the file executable by it (from
// the mode bits of owner, group and others).
func canExec(p string, id identity) bool {
	abs, err := filepath.Abs(p)
	if err != nil {
		return false
	}
	allowed := func(fi os.FileInfo, bit os.FileMode) bool {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false
		}
		m := fi.Mode().Perm()
		switch {
		case st.Uid == id.UID:
			return m&(bit<<6) != 0
		case st.Gid == id.GID || slices.Contains(id.Groups, st.Gid):
			return m&(bit<<3) != 0
		}
		return m&bit != 0
	}
	for d := filepath.Dir(abs); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || !allowed(fi, 0o1) {
			return false
		}
		if d == "/" {
			break
		}
	}
	fi, err := os.Stat(abs)
	return err == nil && allowed(fi, 0o1)
}

// reachableDir resolves dir's symlinks and checks that account id can
// reach the directory on the node: every directory on the way, and dir
// itself, searchable by it. It returns the resolved path ("" for "").
func reachableDir(dir string, id identity) (string, error) {
	if dir == "" {
		return "", nil
	}
	real, err := filepath.EvalSymlinks(dir)
	if err == nil {
		var fi os.FileInfo
		if fi, err = os.Stat(real); err == nil && !fi.IsDir() {
			err = errors.New("not a directory")
		}
	}
	if err == nil && !canExec(real, id) {
		err = fmt.Errorf("account %s cannot reach it", id.Name)
	}
	if err != nil {
		return "", fmt.Errorf("the job's working directory %s cannot be mounted: %w", dir, err)
	}
	return real, nil
}

// underTmp reports whether dir is /tmp or below it.
func underTmp(dir string) bool {
	return dir == "/tmp" || strings.HasPrefix(filepath.Clean(dir)+"/", "/tmp/")
}
