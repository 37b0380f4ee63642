package slurmtest

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The reaper: every daemon of a cluster runs as the only child of a copy of the
// test binary itself, re-executed with reaperEnv set. That copy makes itself a
// child subreaper (PR_SET_CHILD_SUBREAPER), so everything the daemon forks
// (slurmd's double-forked slurmstepd, the job scripts under it, slurmctld's
// slurmscriptd) stays below it even after its parent exits, instead of being
// re-parented to PID 1 (which, in these sandboxes, never reaps). It
//
//   - reaps every orphan that exits (no zombies),
//   - forwards SIGTERM/SIGINT to the daemon; on SIGUSR1 kills it at once,
//   - treats EOF on its stdin (a pipe whose write end only the test process
//     holds) as "the test process is gone": the daemon is stopped, so a test
//     binary killed by `go test -timeout` leaves nothing running,
//   - when the daemon has exited, kills every remaining descendant (TERM, then
//     KILL) and exits with the daemon's status.
//
// The switch is in this package's init, so a test binary that imports
// slurmtest needs no TestMain: the re-executed copy never reaches the testing
// framework.
const (
	reaperEnv      = "ALLOT_SLURMTEST_REAPER"       // "1" in the re-executed copy
	reaperGraceEnv = "ALLOT_SLURMTEST_REAPER_GRACE" // ms the daemon has after SIGTERM before it is killed
	reaperRmdirEnv = "ALLOT_SLURMTEST_REAPER_RMDIR" // a directory to remove once all is stopped
)

func init() { MaybeReap() }

// MaybeReap turns the current process into a cluster daemon's reaper and never
// returns when the process was started as one (environment switch); otherwise
// it returns at once. It already runs from this package's init, so no TestMain
// needs to call it; calling it first thing in a TestMain is harmless.
func MaybeReap() {
	if os.Getenv(reaperEnv) != "1" {
		return
	}
	os.Exit(reap(os.Args[1:]))
}

func reap(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "slurmtest reaper: no command")
		return 2
	}
	grace := 5 * time.Second
	if ms, err := strconv.Atoi(os.Getenv(reaperGraceEnv)); err == nil && ms > 0 {
		grace = time.Duration(ms) * time.Millisecond
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "slurmtest reaper: PR_SET_CHILD_SUBREAPER: %v\n", err)
		return 2
	}
	// No PR_SET_PDEATHSIG: it fires when the *thread* that forked us exits,
	// which the Go runtime may do at any time; the stdin pipe is exact.

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGCHLD, syscall.SIGUSR1)
	stdinEOF := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinEOF)
	}()

	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, reaperEnv+"=") && !strings.HasPrefix(e, reaperGraceEnv+"=") &&
			!strings.HasPrefix(e, reaperRmdirEnv+"=") {
			env = append(env, e)
		}
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		fmt.Fprintf(os.Stderr, "slurmtest reaper: %v\n", err)
		return 2
	}
	p, err := os.StartProcess(args[0], args, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{devnull, os.Stdout, os.Stderr},
	})
	devnull.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "slurmtest reaper: start %s: %v\n", args[0], err)
		return 127
	}
	child := p.Pid
	fmt.Fprintf(os.Stderr, "slurmtest reaper %d: started %s as pid %d\n", os.Getpid(), args[0], child)

	status := -1
	childDone := false
	leftWait := 2 * time.Second // how long what is left gets after SIGTERM
	var termAt time.Time        // when SIGTERM was forwarded; zero until then
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	stop := func(why string) {
		if termAt.IsZero() && !childDone {
			fmt.Fprintf(os.Stderr, "slurmtest reaper %d: %s: SIGTERM to %d\n", os.Getpid(), why, child)
			_ = syscall.Kill(child, syscall.SIGTERM)
			termAt = time.Now() // stopwatch for the grace period
		}
	}
	for !childDone {
		select {
		case s := <-sigs:
			switch s {
			case syscall.SIGCHLD:
			case syscall.SIGUSR1: // fast stop: the cluster is being thrown away
				fmt.Fprintf(os.Stderr, "slurmtest reaper %d: SIGUSR1: SIGKILL to %d\n", os.Getpid(), child)
				_ = syscall.Kill(child, syscall.SIGKILL)
				leftWait = 0
			default:
				stop("signal " + s.String())
			}
		case <-stdinEOF:
			stdinEOF = nil
			stop("parent gone")
		case <-tick.C:
			if !termAt.IsZero() && time.Since(termAt) > grace {
				fmt.Fprintf(os.Stderr, "slurmtest reaper %d: %d still running after %v: SIGKILL\n", os.Getpid(), child, grace)
				_ = syscall.Kill(child, syscall.SIGKILL)
			}
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			if pid == child {
				childDone = true
				switch {
				case ws.Exited():
					status = ws.ExitStatus()
				case ws.Signaled():
					status = 128 + int(ws.Signal())
				}
			}
		}
	}
	fmt.Fprintf(os.Stderr, "slurmtest reaper %d: pid %d exited (%d); killing what is left\n", os.Getpid(), child, status)
	killDescendants(os.Getpid(), leftWait)
	if d := os.Getenv(reaperRmdirEnv); d != "" && filepath.IsAbs(d) && d != "/" {
		if err := os.RemoveAll(d); err != nil {
			fmt.Fprintf(os.Stderr, "slurmtest reaper %d: %v\n", os.Getpid(), err)
		}
	}
	return status
}

// killDescendants sends SIGTERM to every live descendant of root, reaps, and
// after wait SIGKILLs whatever is still there, until none is left.
func killDescendants(root int, wait time.Duration) {
	deadline := time.Now().Add(wait) // stopwatch
	sig := syscall.SIGTERM
	for {
		pids := descendants(root)
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			sig = syscall.SIGKILL
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, sig)
		}
		time.Sleep(50 * time.Millisecond)
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// descendants lists the live (non-zombie) processes below root, from /proc.
func descendants(root int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	zombie := map[int]bool{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, state, ok := procStat(pid)
		if !ok {
			continue
		}
		children[ppid] = append(children[ppid], pid)
		if state == 'Z' {
			zombie[pid] = true
		}
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			queue = append(queue, c)
			if !zombie[c] {
				out = append(out, c)
			}
		}
	}
	return out
}

// procStat returns the parent pid and state letter of pid.
func procStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// comm may contain spaces and parentheses: the fields follow the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+4 > len(s) {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, false
	}
	return ppid, f[0][0], true
}
