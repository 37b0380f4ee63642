package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/allotlabs/allot/internal/clock"
)

// The job shim is each job's supervisor, like slurmstepd or conmon: the
// agent starts `allot job-shim DIR` in its own session, the shim starts the
// job inside the job's cgroup as the job's user, waits for it, kills what
// is left of it, and writes the exit status to DIR/exit.json. The shim does
// not depend on the agent: when the agent is restarted, upgraded or killed
// with -9, the shim and its job go on, and the next agent finds them by
// DIR and the cgroup.

// ShimCommand is the subcommand that runs the shim (allot job-shim DIR).
const ShimCommand = "job-shim"

// shimSpec is DIR/spec.json: everything the shim needs, written by the
// agent (root-only; it holds the job's environment).
type shimSpec struct {
	Argv   []string `json:"argv"` // Argv[0] is an absolute path
	Env    []string `json:"env"`
	Dir    string   `json:"dir,omitempty"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
	// AsRoot runs Argv without dropping privileges: a container runtime,
	// which starts the container as the job's user itself.
	AsRoot bool `json:"as_root,omitempty"`
	// SameUser runs Argv as the agent's own user (an agent that cannot
	// switch users: development only).
	SameUser bool   `json:"same_user,omitempty"`
	Cgroup   string `json:"cgroup,omitempty"` // relative to the cgroup root; "" = none
	CgroupV2 bool   `json:"cgroup_v2,omitempty"`
	// CgroupRoot is where the v2 hierarchy is mounted ("" = /sys/fs/cgroup).
	CgroupRoot string `json:"cgroup_root,omitempty"`
	Output     string `json:"output"`
	// Cleanup runs (as root) after the job ended, e.g. removing a container.
	Cleanup []string `json:"cleanup,omitempty"`
	// PrivateTmp, when set, is the job's own /tmp: the job gets a mount
	// namespace where PrivateTmp is bind-mounted on /tmp and a fresh tmpfs
	// is on /dev/shm, so what it leaves there (with a umask that lets
	// others read) no other team's job sees.
	PrivateTmp string `json:"private_tmp,omitempty"`
}

// exitRecord is DIR/exit.json.
type exitRecord struct {
	ExitCode int       `json:"exit_code"` // -1 when killed by a signal
	Signal   string    `json:"signal,omitempty"`
	Time     time.Time `json:"time"`
}

// startRecord is DIR/started.json.
type startRecord struct {
	PID  int       `json:"pid"`
	Time time.Time `json:"time"`
}

// ShimMain runs the shim: args are [DIR]. File descriptor 3, when open, is
// the status pipe: the shim writes "ok PID" once the job runs, or
// "error MESSAGE" when it could not start it.
func ShimMain(args []string, stderr io.Writer) int {
	// The shim outlives signals meant for its agent or its job. (Caught,
	// not ignored: an ignored signal would stay ignored in the job.)
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGPIPE, syscall.SIGQUIT)
	go func() {
		for range sigs {
		}
	}()
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: allot job-shim DIR (started by allot agent)")
		return 2
	}
	dir := args[0]
	var status *os.File
	if _, err := unix.FcntlInt(3, unix.F_GETFD, 0); err == nil {
		unix.CloseOnExec(3) // the job must not inherit it
		status = os.NewFile(3, "status")
	}
	report := func(format string, a ...any) {
		if status != nil {
			fmt.Fprintf(status, format+"\n", a...)
		}
	}
	fail := func(err error) int {
		report("error %s", strings.ReplaceAll(err.Error(), "\n", " "))
		fmt.Fprintln(stderr, "allot job-shim:", err)
		return 1
	}
	var spec shimSpec
	b, err := os.ReadFile(filepath.Join(dir, "spec.json"))
	if err != nil {
		return fail(err)
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return fail(fmt.Errorf("reading spec: %w", err))
	}
	// The spec holds secrets; the job never needs it.
	_ = os.Remove(filepath.Join(dir, "spec.json"))
	if len(spec.Argv) == 0 || !filepath.IsAbs(spec.Argv[0]) {
		return fail(errors.New("spec: argv[0] must be an absolute path"))
	}
	out, err := os.OpenFile(spec.Output, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fail(err)
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return fail(err)
	}
	newCmd := func(attr *syscall.SysProcAttr) *exec.Cmd {
		return &exec.Cmd{Path: spec.Argv[0], Args: spec.Argv, Env: spec.Env, Dir: spec.Dir, Stdin: devnull, Stdout: out, Stderr: out, SysProcAttr: attr}
	}
	attr := &syscall.SysProcAttr{Setsid: true}
	switch {
	case spec.AsRoot, spec.SameUser:
	default:
		if spec.UID == 0 || spec.GID == 0 {
			return fail(errors.New("refusing to run a job as root"))
		}
		attr.Credential = &syscall.Credential{Uid: spec.UID, Gid: spec.GID, Groups: spec.Groups}
	}
	var cg *jobCgroup
	var leave func() error
	if spec.Cgroup != "" {
		d := &cgroupDriver{v2: spec.CgroupV2, root: spec.CgroupRoot, parent: filepath.Dir(spec.Cgroup)}
		if cg, err = d.load(filepath.Base(spec.Cgroup)); err != nil {
			return fail(fmt.Errorf("loading the job's cgroup: %w", err))
		}
		if spec.CgroupV2 {
			// Into the job's leaf from its first instruction
			// (CLONE_INTO_CGROUP); the shim itself stays out.
			fd, err := cg.dirFD()
			if err != nil {
				return fail(fmt.Errorf("opening the job's cgroup: %w", err))
			}
			attr.UseCgroupFD, attr.CgroupFD = true, fd
		} else if leave, err = cg.enter(); err != nil {
			return fail(err)
		}
	}
	if spec.AsRoot {
		fmt.Fprintln(stderr, "allot job-shim: running", strings.Join(spec.Argv, " "))
	}
	// A host job runs with no_new_privs (as container jobs do, through the
	// runtime's no-new-privileges): no setuid program (sudo, pkexec) makes
	// it root. The runtime a container job starts through runs as root.
	noNewPrivs := !spec.AsRoot
	start := func(cmd *exec.Cmd) error {
		if spec.PrivateTmp == "" && !noNewPrivs {
			return cmd.Start()
		}
		// The child inherits the mount namespace and no_new_privs of the
		// thread that forks it: set them on a goroutine's own locked
		// thread, start the child from it, and let that thread end with the
		// goroutine (it is never unlocked), so the shim itself keeps the
		// node's namespace and its privileges.
		ch := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			if noNewPrivs {
				if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
					ch <- fmt.Errorf("setting no_new_privs: %w", err)
					return
				}
			}
			if spec.PrivateTmp != "" {
				if err := privateTmp(spec.PrivateTmp); err != nil {
					ch <- fmt.Errorf("giving the job its own /tmp: %w", err)
					return
				}
			}
			ch <- cmd.Start()
		}()
		return <-ch
	}
	cmd := newCmd(attr)
	err = start(cmd)
	if err != nil && attr.UseCgroupFD && cloneUnsupported(err) {
		// No clone3 or no CLONE_INTO_CGROUP (an old kernel, a seccomp
		// profile): start it as on v1, with the shim in the job's leaf
		// while it forks, so the job is still in it from its first
		// instruction.
		if ok, why := cloneIntoCgroupWorks(); !ok {
			fmt.Fprintf(stderr, "allot job-shim: clone3 with CLONE_INTO_CGROUP is not available (%v): moving the job into its cgroup through cgroup.procs\n", why)
			plain := *attr
			plain.UseCgroupFD, plain.CgroupFD = false, 0
			cmd = newCmd(&plain)
			if leave, err = cg.enter(); err == nil {
				err = start(cmd)
			}
		}
	}
	if leave != nil {
		if lerr := leave(); lerr != nil && err == nil {
			_ = cmd.Process.Kill()
			err = fmt.Errorf("leaving the job's cgroup: %w", lerr)
		}
	}
	if err != nil {
		return fail(err)
	}
	out.Close()
	devnull.Close()
	started := startRecord{PID: cmd.Process.Pid, Time: clock.Now().UTC()}
	_ = writeJSONFile(filepath.Join(dir, "started.json"), started)
	report("ok %d", started.PID)
	if status != nil {
		status.Close()
	}

	_ = cmd.Wait()
	rec := exitRecord{Time: clock.Now().UTC()}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		rec.ExitCode, rec.Signal = -1, unix.SignalName(ws.Signal())
	} else {
		rec.ExitCode = ws.ExitStatus()
	}
	// The job is over when its main process is: nothing it started
	// (setsid, double forks, daemons) survives it.
	if cg != nil {
		if err := cg.Kill(); err != nil {
			fmt.Fprintln(stderr, "allot job-shim:", err)
		}
	} else {
		_ = syscall.Kill(-started.PID, syscall.SIGKILL)
	}
	if len(spec.Cleanup) > 0 {
		c := exec.Command(spec.Cleanup[0], spec.Cleanup[1:]...)
		c.Stdout, c.Stderr = stderr, stderr
		_ = c.Run()
	}
	if err := writeJSONFile(filepath.Join(dir, "exit.json"), rec); err != nil {
		fmt.Fprintln(stderr, "allot job-shim:", err)
		return 1
	}
	return 0
}

// privateTmp moves the calling thread into a new mount namespace with dir
// on /tmp, a new tmpfs on /dev/shm and a /proc that hides other accounts'
// processes.
func privateTmp(dir string) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	if err := unix.Mount(dir, "/tmp", "", unix.MS_BIND, ""); err != nil {
		return err
	}
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if err := unix.Mount("tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return err
		}
	}
	// Its own /proc, showing only its account's processes: other teams'
	// command lines and environments, the agent and the shims are out of
	// its sight (a procfs mount has its own hidepid since Linux 5.8).
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "hidepid=invisible"); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	return nil
}

// writeJSONFile writes v to path atomically (root-only).
func writeJSONFile(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readJSONFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// startShim starts the shim for the job in dir and waits for it to start
// the job. It returns the shim's command (the agent reaps it) and the job's
// PID.
func startShim(shimPath, dir string, spec shimSpec, env []string) (*exec.Cmd, int, error) {
	if err := writeJSONFile(filepath.Join(dir, "spec.json"), spec); err != nil {
		return nil, 0, fmt.Errorf("writing the job spec: %w", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, 0, err
	}
	defer pr.Close()
	logf, err := os.OpenFile(filepath.Join(dir, "shim.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		pw.Close()
		return nil, 0, err
	}
	defer logf.Close()
	cmd := exec.Command(shimPath, ShimCommand, dir)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{pw}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		return nil, 0, fmt.Errorf("starting the job shim: %w", err)
	}
	type answer struct {
		line string
		err  error
	}
	ch := make(chan answer, 1)
	go func() {
		l, err := bufio.NewReader(pr).ReadString('\n')
		ch <- answer{strings.TrimSpace(l), err}
	}()
	var a answer
	select {
	case a = <-ch:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, 0, errors.New("the job shim did not start the job within 30 s")
	}
	if msg, ok := strings.CutPrefix(a.line, "error "); ok {
		_ = cmd.Wait()
		return nil, 0, errors.New(msg)
	}
	pidStr, ok := strings.CutPrefix(a.line, "ok ")
	pid, err := strconv.Atoi(pidStr)
	if !ok || err != nil {
		_ = cmd.Wait()
		tail, _ := os.ReadFile(filepath.Join(dir, "shim.log"))
		return nil, 0, fmt.Errorf("the job shim failed: %s", strings.TrimSpace(lastLines(string(tail), 3)))
	}
	return cmd, pid, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// procStartTime is a process's start time in clock ticks since boot
// (/proc/PID/stat field 22): with the PID it names a process uniquely, so
// a recycled PID is not mistaken for the shim.
func procStartTime(pid int) (uint64, bool) {
	f, ok := procStat(pid)
	if !ok || len(f) < 20 || f[0] == "Z" {
		return 0, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	return v, err == nil
}

// waitPID waits until the process pid (not necessarily a child) exits.
func waitPID(pid int, start uint64) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // already gone
	}
	defer unix.Close(fd)
	if st, ok := procStartTime(pid); !ok || st != start {
		return
	}
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 500)
		if n > 0 {
			return
		}
		if err != nil && err != unix.EINTR {
			return
		}
	}
}
