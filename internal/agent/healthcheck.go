package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// maxHealthOutput bounds what the agent reports of a failed health check
// (the end of its output is kept: that is where errors usually are).
const maxHealthOutput = 2048

// healthLoop runs the health check program now and then every
// HealthInterval, and keeps the report the heartbeats carry.
func (a *Agent) healthLoop(ctx context.Context) {
	for {
		report := runHealthCheck(ctx, a.cfg.HealthCmd, min(a.cfg.HealthInterval, 5*time.Minute))
		if ctx.Err() != nil {
			return
		}
		prev := a.health.Load()
		switch {
		case report != "" && (prev == nil || *prev == ""):
			a.log.Warn("health check failed; reporting the node unhealthy", "cmd", a.cfg.HealthCmd, "report", report)
		case report == "" && prev != nil && *prev != "":
			a.log.Info("health check passes again", "cmd", a.cfg.HealthCmd)
		}
		a.health.Store(&report)
		if !sleepCtx(ctx, a.cfg.HealthInterval) {
			return
		}
	}
}

// HealthReport is the last failed health check's report ("" when it
// passed or has not run).
func (a *Agent) HealthReport() string {
	if h := a.health.Load(); h != nil {
		return *h
	}
	return ""
}

// runHealthCheck runs cmd (a program path, run without a shell) with a
// timeout. It returns "" when it exits 0, else "exit status N: <output>"
// (or why it could not run), truncated to maxHealthOutput bytes.
func runHealthCheck(ctx context.Context, cmd string, timeout time.Duration) string {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := exec.CommandContext(ctx, cmd)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = time.Second
	var out lockedBuffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	if err == nil {
		return ""
	}
	what := err.Error()
	var ee *exec.ExitError
	switch {
	case ctx.Err() == context.DeadlineExceeded:
		what = fmt.Sprintf("timed out after %s", timeout)
	case errors.As(err, &ee):
		what = ee.ProcessState.String()
	}
	text := strings.TrimSpace(strings.ToValidUTF8(out.String(), "?"))
	if len(text) > maxHealthOutput {
		text = "…" + text[len(text)-maxHealthOutput:]
	}
	if text == "" {
		return what
	}
	return what + ": " + text
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 1<<20 {
		return len(p), nil // enough: keep the process from blocking
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
