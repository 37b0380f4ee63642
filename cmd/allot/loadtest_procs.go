package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/allotlabs/allot/internal/apf"
	"github.com/allotlabs/allot/internal/devdb"
	"github.com/allotlabs/allot/internal/loadtest"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

// loadtestChild makes the command of one of `allot loadtest --processes`'
// processes: this binary with args (a test replaces it with its own
// stand-in for the allot binary).
var loadtestChild = defaultLoadtestChild

func defaultLoadtestChild(args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return exec.Command(exe, args...), nil
}

// procOptions are what `allot loadtest` gives the server and worker it
// boots (in its own process, or as processes with --processes).
type procOptions struct {
	agentConns int
	minCycle   time.Duration
	duty       float64
	// agentNice is the agent API server's nice value (0: as the tool's):
	// on shared cores, a priority the OS gives the process that hears the
	// agents over the portal's and the worker's.
	agentNice int
	admission apf.Config
}

// loadtestProcesses is loadtestSelfHosted with the control plane in
// processes of its own, as production runs it: `allot server --serve
// users` for the API and the portal, `allot server --serve agents` for the
// node agents (at agentNice), and `allot worker`, each started from this
// binary on a fresh database. The tool reads their /metrics (the servers'
// with the admin's token) for the server-side figures and cycle phases.
// Their logs go to files in a temporary folder, shown when one fails.
func loadtestProcesses(ctx context.Context, adminURL string, keep bool, o procOptions, cfg loadtest.Config, logger *slog.Logger, stderr io.Writer) (*loadtest.Report, error) {
	dbURL, drop, err := loadtestDatabase(ctx, adminURL, keep, stderr)
	if err != nil {
		return nil, err
	}
	defer drop()
	pool, err := store.Open(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := store.Migrate(ctx, pool, nil); err != nil {
		return nil, err
	}
	st := store.New(pool)
	if cfg.Token, err = loadtestSeed(ctx, st); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "allot-loadtest-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var addrs [3]string
	for i := range addrs {
		if addrs[i], err = freeLoopbackAddr(); err != nil {
			return nil, err
		}
	}
	common := append([]string{"--database-url", dbURL, "--log-level", "error",
		"--api-rate", "0", "--ip-rate", "0", "--agent-rate", "0"}, // one token and one address load it all
		admissionArgs(o.admission)...)
	if o.agentConns > 0 {
		common = append(common, "--agent-db-conns", strconv.Itoa(o.agentConns))
	}
	procs := []struct {
		name string
		args []string
		nice int
		url  string // what answers once it is up
	}{
		{"server-users", append([]string{"server", "--serve", web.ServeUsers, "--addr", addrs[0]}, common...), 0, "http://" + addrs[0] + "/readyz"},
		{"server-agents", append([]string{"server", "--serve", web.ServeAgents, "--addr", addrs[1]}, common...), o.agentNice, "http://" + addrs[1] + "/readyz"},
		{"worker", []string{"worker", "--database-url", dbURL, "--log-level", "error", "--metrics-addr", addrs[2], "--min-cycle-interval", o.minCycle.String(),
			"--cycle-duty", strconv.FormatFloat(o.duty, 'g', -1, 64)},
			0, "http://" + addrs[2] + "/metrics"},
	}
	var running []*child
	defer func() {
		// SIGTERM to all first, then wait for each: they stop together.
		for _, c := range running {
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range running {
			c.stop(logger)
		}
	}()
	for _, p := range procs {
		cmd, err := loadtestChild(p.args...)
		if err != nil {
			return nil, err
		}
		if p.nice != 0 {
			// nice(1) sets it before the exec, so every thread of the
			// process has it (setpriority on a running Go process would
			// reach one thread).
			env := cmd.Env
			cmd = exec.Command("nice", append([]string{"-n", strconv.Itoa(p.nice), cmd.Path}, cmd.Args[1:]...)...)
			cmd.Env = env
		}
		logPath := filepath.Join(dir, p.name+".log")
		f, err := os.Create(logPath)
		if err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = f, f
		err = cmd.Start()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("starting allot %s: %w", p.args[0], err)
		}
		c := &child{cmd: cmd, exited: make(chan error, 1)}
		go func() { c.exited <- cmd.Wait() }()
		running = append(running, c)
		if err := c.waitAnswers(ctx, p.url, 60*time.Second); err != nil {
			return nil, fmt.Errorf("allot %s (%s): %w\n%s", p.args[0], p.name, err, devdb.LogTail(logPath, 30))
		}
	}
	cfg.URL, cfg.AgentURL = "http://"+addrs[0], "http://"+addrs[1]
	cfg.DB, cfg.Store = pool, st
	cfg.Gather = loadtest.Scrapes{{URL: "http://" + addrs[0] + "/metrics", Token: cfg.Token}, {URL: "http://" + addrs[1] + "/metrics", Token: cfg.Token},
		{URL: "http://" + addrs[2] + "/metrics"}}
	return loadtest.Run(ctx, cfg)
}

// freeLoopbackAddr is a loopback address with a port nothing listens on
// now.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// child is one of the processes, with its end.
type child struct {
	cmd    *exec.Cmd
	exited chan error // its Wait's result, once it has ended
}

// waitAnswers waits until url answers 200, at most d; a process that
// ends meanwhile fails it at once.
func (c *child) waitAnswers(ctx context.Context, url string, d time.Duration) error {
	deadline := time.Now().Add(d) // deadline
	var last error
	for time.Now().Before(deadline) {
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req, err := http.NewRequestWithContext(tctx, http.MethodGet, url, nil)
		if err != nil {
			cancel()
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				cancel()
				return nil
			}
			err = errors.New(resp.Status)
		}
		cancel()
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-c.exited:
			c.exited <- err // for stop
			return fmt.Errorf("it ended before it answered: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not answer within %v: %v", url, d, last)
}

// stop waits for the process to end after its SIGTERM; after 20 s it is
// killed.
func (c *child) stop(logger *slog.Logger) {
	select {
	case <-c.exited:
	case <-time.After(20 * time.Second):
		logger.Warn("a process did not stop on SIGTERM; killing it", "pid", c.cmd.Process.Pid)
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}
