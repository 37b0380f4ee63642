package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
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

	pid     int
	started time.Time
	logs    *logStream

	// Set once the agent decided to stop the job.
	stopReason string
	lastSignal syscall.Signal
	killTimer  *time.Timer
	killAt     time.Time
	limitTimer *time.Timer
	pending    *pendingStop // stop requested while starting
}

type pendingStop struct {
	grace  time.Duration
	reason string
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
	fail := func(err error) {
		log.Warn("job failed to start", "err", err)
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
	if l.CheckpointDir != "" {
		if err := os.MkdirAll(l.CheckpointDir, 0o750); err != nil {
			fail(fmt.Errorf("creating checkpoint dir: %w", err))
			return
		}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		fail(fmt.Errorf("creating output pipe: %w", err))
		return
	}
	cmd := exec.Command(l.Command[0], l.Command[1:]...)
	cmd.Env = jobEnv(a.cfg.BaseEnv, l.Env)
	cmd.Dir = l.WorkDir
	if cmd.Dir == "" {
		cmd.Dir = a.cfg.WorkDir
	}
	cmd.Stdout = pw
	cmd.Stderr = pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// exec.Command resolves a bare name with the agent's PATH; resolve it
	// with the job's PATH instead.
	if !strings.Contains(l.Command[0], "/") {
		if p, ok := lookPath(l.Command[0], cmd.Env); ok {
			cmd.Path = p
			cmd.Err = nil
		}
	}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		fail(err)
		return
	}
	now := time.Now()
	logs := newLogStream(a, ref, a.cfg.LogTail, a.cfg.LogFlush)

	a.mu.Lock()
	j.pid = cmd.Process.Pid
	j.started = now
	j.state = stateRunning
	j.logs = logs
	if l.TimeLimit > 0 {
		j.limitTimer = time.AfterFunc(l.TimeLimit, func() {
			log.Info("time limit reached", "limit", l.TimeLimit)
			a.stopJob(ref.JobID, ref.Segment, a.cfg.TimeLimitGrace, ReasonTimeLimit)
		})
	}
	pend := j.pending
	j.pending = nil
	a.mu.Unlock()

	a.out.started(agentproto.JobStarted{JobID: ref.JobID, Segment: ref.Segment, PID: j.pid, Time: now.UTC()})
	log.Info("job started", "pid", j.pid, "command", l.Command)

	readDone := make(chan struct{})
	go func() { logs.read(pr); close(readDone) }()
	a.jobsDone.Add(1)
	go a.wait(j, cmd, pr, readDone)
	if pend != nil {
		a.stopJob(ref.JobID, ref.Segment, pend.grace, pend.reason)
	}
}

// wait reaps the job, kills what is left of its process group, flushes its
// output and reports the exit.
func (a *Agent) wait(j *job, cmd *exec.Cmd, pr *os.File, readDone chan struct{}) {
	defer a.jobsDone.Done()
	_ = cmd.Wait()
	// The job is over when its main process is: take down anything it left
	// running in its group so the GPUs are really free.
	_ = syscall.Kill(-j.pid, syscall.SIGKILL)
	select {
	case <-readDone:
	case <-time.After(2 * time.Second):
		pr.Close() // a daemonised child holds the pipe open
		<-readDone
	}
	pr.Close()
	j.logs.close()

	e := agentproto.JobExited{JobID: j.ref.JobID, Segment: j.ref.Segment, Time: clock.Now().UTC(),
		LastCheckpoint: lastCheckpoint(j.lease.CheckpointDir)}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	a.mu.Lock()
	if j.killTimer != nil {
		j.killTimer.Stop()
	}
	if j.limitTimer != nil {
		j.limitTimer.Stop()
	}
	e.Reason = j.stopReason
	switch {
	case ws.Signaled():
		e.ExitCode = -1
		e.Signal = unix.SignalName(ws.Signal())
	default:
		e.ExitCode = ws.ExitStatus()
		if j.lastSignal != 0 {
			e.Signal = unix.SignalName(j.lastSignal)
		}
	}
	delete(a.jobs, j.ref)
	a.mu.Unlock()
	a.log.Info("job exited", "job", e.JobID, "segment", e.Segment, "exit_code", e.ExitCode, "signal", e.Signal, "reason", e.Reason)
	a.out.exited(e)
}

// stopJob stops a job: SIGTERM to its process group, then SIGKILL after
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
				_ = syscall.Kill(-j.pid, syscall.SIGTERM)
				pid := j.pid
				j.killAt = time.Now().Add(grace)
				j.killTimer = time.AfterFunc(grace, func() { a.kill(j, pid) })
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

func (a *Agent) kill(j *job, pid int) {
	a.mu.Lock()
	if cur := a.jobs[j.ref]; cur != j {
		a.mu.Unlock()
		return
	}
	j.lastSignal = syscall.SIGKILL
	a.mu.Unlock()
	a.log.Info("grace period over; killing job", "job", j.ref.JobID, "segment", j.ref.Segment)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
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
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for dir := range strings.SplitSeq(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
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
	first   bool
	timer   *time.Timer
	closed  bool
}

func newLogStream(a *Agent, ref agentproto.LeaseRef, tail int, flush time.Duration) *logStream {
	return &logStream{a: a, ref: ref, max: tail, flush: flush}
}

const maxLineBytes = 16 << 10

func (s *logStream) read(pr *os.File) {
	r := bufio.NewReaderSize(pr, maxLineBytes)
	for {
		b, err := r.ReadSlice('\n')
		if len(b) > 0 {
			s.add(trimLine(b))
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

func (s *logStream) add(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
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
		s.a.out.log(s.ref, []string{line})
		return
	}
	s.pending = append(s.pending, line)
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
		s.a.out.log(s.ref, s.pending)
		s.pending = nil
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
