package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/clock"
)

// MaybeShim runs the job shim and exits when this process was started as
// one (`PROGRAM job-shim DIR`). Programs that run agents in-process from a
// binary other than allot (test binaries) call it first thing in main or
// TestMain, since the agent starts its own executable as the shim.
func MaybeShim() {
	if len(os.Args) >= 2 && os.Args[1] == ShimCommand {
		os.Exit(ShimMain(os.Args[2:], os.Stderr))
	}
}

func (a *Agent) leasesDir() string { return filepath.Join(a.cfg.StateDir, "leases") }

// prepare checks how this agent can confine jobs and makes its state
// directory: root-only leases, and for the fake backend fake GPU device
// nodes.
func (a *Agent) prepare() error {
	if a.cfg.ShimPath == "" {
		return errors.New("agent: cannot find its own executable to supervise jobs (set ShimPath)")
	}
	a.shimPath = a.cfg.ShimPath
	root := os.Geteuid() == 0
	if !root && !a.cfg.RunAsAgent {
		return errors.New("agent: jobs run as their users, which needs root; run the agent as root (see deploy/allot-agent.service), or for development only --insecure-run-as-agent")
	}
	if root && a.cfg.RunAsAgent {
		return errors.New("agent: --insecure-run-as-agent would run jobs as root; it is for agents that are not root")
	}
	if err := os.MkdirAll(a.leasesDir(), 0o700); err != nil {
		return fmt.Errorf("agent: state directory: %w", err)
	}
	_ = os.Chmod(a.cfg.StateDir, 0o711)
	_ = os.Chmod(a.leasesDir(), 0o700)
	switch a.cfg.Cgroups {
	case "auto":
		if !a.cfg.RunAsAgent {
			d, err := newCgroupDriver(a.cfg.CgroupParent)
			if err != nil {
				return fmt.Errorf("agent: cannot give jobs their own cgroups (%v); fix the node or, for development only, --cgroups off", err)
			}
			a.cgd = d
			if d.v2 {
				if ok, why := cloneIntoCgroupWorks(); !ok {
					a.log.Warn("clone3 with CLONE_INTO_CGROUP is not available here: job shims move each job into its cgroup through cgroup.procs instead", "err", why)
				}
			}
		}
	case "off":
	default:
		return fmt.Errorf("agent: cgroups %q: use auto or off", a.cfg.Cgroups)
	}
	if a.inv.Backend == "fake" && a.cgd != nil && a.inv.DevDir == "" {
		dir := filepath.Join(a.cfg.StateDir, "dev")
		if err := makeFakeDevices(dir, len(a.inv.GPUs)); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		a.inv.DevDir = dir
	}
	if a.cfg.ContainerRuntime != "" {
		rt, err := newContainerRT(a.cfg.ContainerRuntime, a.cfg.ContainerRuntimePath, a.cfg.ContainerRuntimeArgs)
		if err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		a.runtime = rt
	}
	return nil
}

// isolation describes the confinement for the inventory.
func (a *Agent) isolation() string {
	if a.cfg.RunAsAgent {
		return "none"
	}
	parts := []string{"uid"}
	if a.cgd != nil {
		parts = append(parts, a.cgd.Version(), "devices", "memory", "cpu", "pids")
	}
	return strings.Join(parts, ",")
}

// jobLimits are job l's cgroup limits: its own, or the node's share per
// GPU.
func (a *Agent) jobLimits(l agentproto.Lease) jobLimits {
	lim := jobLimits{MemoryBytes: l.MemoryBytes, MilliCPUs: l.MilliCPUs, PidsMax: a.cfg.PidsMax, Devices: a.jobDevices(l)}
	n := int64(max(len(l.GPUs), 1))
	gpus := int64(max(len(a.inv.GPUs), 1))
	if lim.MemoryBytes <= 0 {
		per := a.cfg.MemoryPerGPU
		if per <= 0 {
			var si unix.Sysinfo_t
			if unix.Sysinfo(&si) == nil {
				per = int64(si.Totalram) * int64(si.Unit) / gpus
			}
		}
		lim.MemoryBytes = per * n
	}
	if lim.MilliCPUs <= 0 {
		per := a.cfg.MilliCPUsPerGPU
		if per <= 0 {
			per = max(int64(runtime.NumCPU())*1000/gpus, 100)
		}
		lim.MilliCPUs = per * n
	}
	return lim
}

// ctlDevicePaths are the driver's control devices a container job needs.
func (a *Agent) ctlDevicePaths() []string {
	var out []string
	for _, n := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} {
		p := filepath.Join(a.devDir(), n)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			out = append(out, p)
		}
	}
	return out
}

// shimEnv is the shim's environment: nothing of the agent's (its token
// never reaches a job's process tree), only a PATH and the clock offset.
func (a *Agent) shimEnv() []string {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if off := clock.Offset(); off != 0 {
		env = append(env, "ALLOT_CLOCK_OFFSET="+off.String())
	}
	return env
}

// adopt takes over the jobs an earlier agent on this node left running
// (restart, upgrade, kill -9), before the first registration lists them:
// a job whose shim still runs is supervised again; one that ended while no
// agent ran is reported with its exit status; one whose shim is gone is
// killed. Job cgroups that no lease on disk explains are orphans: killed.
func (a *Agent) adopt() {
	ents, _ := os.ReadDir(a.leasesDir())
	known := map[string]bool{}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(a.leasesDir(), e.Name())
		var rec leaseRecord
		if err := readJSONFile(filepath.Join(dir, "lease.json"), &rec); err != nil {
			a.log.Warn("dropping an unreadable lease record", "dir", dir, "err", err)
			_ = os.RemoveAll(dir)
			continue
		}
		known[e.Name()] = true
		ref := agentproto.LeaseRef{JobID: rec.Lease.JobID, Segment: rec.Lease.Segment}
		var cg *jobCgroup
		if rec.Cgroup != "" && a.cgd != nil {
			if c, err := a.cgd.load(rec.Cgroup); err == nil {
				cg = c
			}
		}
		j := &job{ref: ref, lease: rec.Lease, state: stateStarting}
		a.mu.Lock()
		a.jobs[ref] = j
		a.mu.Unlock()
		alive := false
		if st, ok := procStartTime(rec.ShimPID); ok && st == rec.ShimStart {
			alive = true
		}
		log := a.log.With("job", ref.JobID, "segment", ref.Segment)
		if alive {
			log.Info("adopted a running job", "pid", rec.PID, "shim", rec.ShimPID)
		} else {
			log.Info("a job ended while no agent ran; reporting it")
		}
		pid, start := rec.ShimPID, rec.ShimStart
		a.run(j, rec, cg, readOffset(filepath.Join(dir, "log.offset")), func() {
			if alive {
				waitPID(pid, start)
			}
		}, nil)
	}
	if a.cgd == nil {
		return
	}
	for _, name := range a.cgd.children() {
		if known[name] {
			continue
		}
		cg, err := a.cgd.load(name)
		if err != nil {
			continue
		}
		if procs := cg.Procs(); len(procs) > 0 {
			a.log.Warn("killing processes of a job this agent has no lease for", "cgroup", cg.Path(), "pids", procs)
		}
		if err := cg.Kill(); err == nil {
			_ = cg.Delete()
		}
	}
}

// containerRT runs images: podman or docker, whose `run` share the flags
// Allot needs.
type containerRT struct {
	name string // podman, docker
	path string
	// global are podman's global flags for this node: cgroupfs without
	// systemd, runc where crun cannot run (cgroup v1 and v2 both mounted).
	global []string
	// initPath is podman's --init-path where its default init,
	// catatonit, is not installed but tini-static is (Debian's podman is
	// satisfied by tini, which docker.io brings).
	initPath string
}

// podmanCatatonit is where podman looks for its --init by default.
const podmanCatatonit = "/usr/libexec/podman/catatonit"

func newContainerRT(name, path string, extra []string) (*containerRT, error) {
	if name != "podman" && name != "docker" {
		return nil, fmt.Errorf("--container-runtime %q: use podman or docker", name)
	}
	if path == "" {
		path = name
	}
	p, err := lookPathEnv(path)
	if err != nil {
		return nil, fmt.Errorf("--container-runtime %s: %s not found", name, path)
	}
	rt := &containerRT{name: name, path: p}
	if name == "podman" {
		if !systemdRunning() {
			rt.global = append(rt.global, "--cgroup-manager", "cgroupfs")
		}
		if _, err := os.Stat("/sys/fs/cgroup/unified"); err == nil {
			if r, err := lookPathEnv("runc"); err == nil {
				rt.global = append(rt.global, "--runtime", r)
			}
		}
		if _, err := os.Stat(podmanCatatonit); err != nil {
			// The init runs inside the image, which may have no libc: the
			// static build.
			if t, err := lookPathEnv("tini-static"); err == nil {
				rt.initPath = t
			}
		}
	}
	rt.global = append(rt.global, extra...)
	return rt, nil
}

func lookPathEnv(name string) (string, error) {
	if strings.Contains(name, "/") {
		if fi, err := os.Stat(name); err != nil || fi.IsDir() {
			return "", errors.New("not found")
		}
		return name, nil
	}
	p, ok := lookPath(name, []string{"PATH=" + os.Getenv("PATH") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
	if !ok {
		return "", errors.New("not found")
	}
	return p, nil
}

func systemdRunning() bool {
	fi, err := os.Stat("/run/systemd/system")
	return err == nil && fi.IsDir()
}

// containerJob is what a runtime needs to run one job.
type containerJob struct {
	Name    string
	Lease   agentproto.Lease
	ID      identity
	Env     []string
	Workdir string
	// WorkdirSource is the host directory mounted at Workdir: Workdir
	// with its symlinks resolved, checked reachable by the job's account
	// ("" = Workdir).
	WorkdirSource string
	Tmp           string
	Cgroup        string   // cgroup parent ("" = none)
	Devices       []string // the job's GPU device files
	Ctl           []string // nvidiactl, nvidia-uvm…
	Dir           string   // the lease's state directory (root-only)
	PidsMax       int64
}

// command returns the runtime's argv for j and the cleanup argv. The
// environment travels in a root-only file in j.Dir, not on the command
// line where every user of the node could read it.
func (rt *containerRT) command(j containerJob) (argv, cleanup []string, err error) {
	envFile := filepath.Join(j.Dir, "container.env")
	var b strings.Builder
	for _, kv := range j.Env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "PATH", "HOME", "TMPDIR", "ALLOT_GPU_DEVICES", "NVIDIA_VISIBLE_DEVICES":
			continue // the image's own, or set below (never the job's choice)
		}
		if strings.ContainsAny(kv, "\n") {
			return nil, nil, fmt.Errorf("environment variable %s holds a newline, which %s env files cannot carry", k, rt.name)
		}
		b.WriteString(kv + "\n")
	}
	b.WriteString("ALLOT_GPU_DEVICES=" + strings.Join(j.Devices, ",") + "\n")
	// Where the NVIDIA container toolkit's hook runs, it gives the
	// container the GPUs named here: the job's, whatever the job asked for
	// (the cgroup fence holds either way).
	idx := make([]string, len(j.Lease.GPUs))
	for i, g := range j.Lease.GPUs {
		idx[i] = strconv.Itoa(g)
	}
	b.WriteString("NVIDIA_VISIBLE_DEVICES=" + strings.Join(idx, ",") + "\n")
	b.WriteString("TMPDIR=/tmp\n")
	if err := os.WriteFile(envFile, []byte(b.String()), 0o600); err != nil {
		return nil, nil, err
	}
	argv = append([]string{rt.path}, rt.global...)
	argv = append(argv, "run", "--rm", "--name", j.Name, "--init")
	if rt.initPath != "" {
		argv = append(argv, "--init-path", rt.initPath)
	}
	argv = append(argv, "--user", strconv.Itoa(int(j.ID.UID))+":"+strconv.Itoa(int(j.ID.GID)),
		"--env-file", envFile, "--network", "host", "--ipc", "host",
		"--security-opt", "no-new-privileges", "--cap-drop", "ALL",
		"--volume", j.Tmp+":/tmp")
	for _, g := range j.ID.Groups {
		if g != j.ID.GID {
			argv = append(argv, "--group-add", strconv.Itoa(int(g)))
		}
	}
	if j.Cgroup != "" {
		argv = append(argv, "--cgroup-parent", j.Cgroup)
	}
	// The container gets the job's GPU devices (and the driver's control
	// devices) at their host paths: /dev/nvidiaN on a GPU node. (With a CDI
	// spec on the node, podman could name them nvidia.com/gpu=N instead.)
	for _, d := range slices.Concat(j.Devices, j.Ctl) {
		argv = append(argv, "--device", d)
	}
	if rt.name == "podman" {
		// podman's defaults (1048576 files, processes) may exceed what an
		// agent without CAP_SYS_RESOURCE can grant: files as the agent has,
		// processes as the job's pids limit allows (the cgroup enforces it).
		var rl unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Max != unix.RLIM_INFINITY {
			n := strconv.FormatUint(rl.Max, 10)
			argv = append(argv, "--ulimit", "nofile="+n+":"+n)
		}
		nproc := uint64(max(j.PidsMax, 1024))
		if unix.Getrlimit(unix.RLIMIT_NPROC, &rl) == nil && rl.Max < nproc {
			nproc = rl.Max
		}
		n := strconv.FormatUint(nproc, 10)
		argv = append(argv, "--ulimit", "nproc="+n+":"+n)
	}
	if j.Workdir != "" {
		src := j.WorkdirSource
		if src == "" {
			src = j.Workdir
		}
		argv = append(argv, "--volume", src+":"+j.Workdir, "--workdir", j.Workdir)
	}
	if cp := j.Lease.CheckpointDir; cp != "" {
		argv = append(argv, "--volume", cp+":"+cp)
	}
	argv = append(argv, "--", j.Lease.Image)
	argv = append(argv, j.Lease.Command...)
	cleanup = append([]string{rt.path}, rt.global...)
	cleanup = append(cleanup, "rm", "--force", j.Name)
	return argv, cleanup, nil
}

var (
	localMu      sync.Mutex
	localJobUser string
	localSeq     int
)

// SetLocalJobUser sets the account that jobs of Local agents run as when
// their lease names none (allot dev's demo account, a test's account).
func SetLocalJobUser(name string) {
	localMu.Lock()
	defer localMu.Unlock()
	localJobUser = name
}

// Local adapts cfg for an agent that runs inside another Allot process
// (allot dev, the local burst provider, tests), next to other such agents:
// its state directory and cgroup parent are its own (removed when it
// stops), jobs whose lease names no account run as the SetLocalJobUser
// account, and where the process is not root, jobs run as the process's
// own account without cgroups (development only).
func Local(cfg Config) Config {
	localMu.Lock()
	localSeq++
	n := localSeq
	if cfg.JobUser == "" {
		cfg.JobUser = localJobUser
	}
	localMu.Unlock()
	name := fmt.Sprintf("%d-%d-%s", os.Getpid(), n, cfg.Hostname)
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(os.TempDir(), "allot-local-agents", name)
		cfg.removeState = true
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "allot-local/" + name
	}
	if os.Geteuid() != 0 {
		cfg.RunAsAgent = true
	}
	return cfg
}
