package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// A job's cgroup holds every process of the job: what it forks, double
// forks or daemonises with setsid stays in it, so ending the job kills all
// of it, and after an agent restart the cgroup says what still runs. Its
// limits are the job's memory, CPU and pids; its device rules let it open
// only its own GPUs.

// jobLimits are one job's cgroup limits. Zero values leave a limit unset.
type jobLimits struct {
	MemoryBytes int64
	MilliCPUs   int64
	PidsMax     int64
	// Devices are the character devices (major:minor) the job may open
	// besides the standard ones (null, zero, random, tty, pts…). nil means
	// devices are not controlled.
	Devices []devNum
}

// devNum is a character device; Minor -1 means every minor of Major.
type devNum struct{ Major, Minor int64 }

// stdDevices are what every job may use, as container runtimes allow:
// null, zero, full, random, urandom, tty, console, ptmx, the pts and tun
// (which needs CAP_NET_ADMIN, which jobs lack).
var stdDevices = []devNum{{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}, {5, 1}, {5, 2}, {136, -1}, {10, 200}}

func deviceRules(devs []devNum) []specs.LinuxDeviceCgroup {
	// Deny all, then allow mknod (not open) of any node, as container
	// runtimes do: a runtime making its container's /dev needs it, and a
	// node made is still fenced when opened.
	rules := []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}, {Allow: true, Type: "c", Access: "m"}, {Allow: true, Type: "b", Access: "m"}}
	for _, d := range slices.Concat(stdDevices, devs) {
		maj := d.Major
		r := specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &maj, Access: "rw"}
		if d.Minor >= 0 {
			mi := d.Minor
			r.Minor = &mi
		}
		rules = append(rules, r)
	}
	return rules
}

// v2Devices is rules in the form the cgroup v2 eBPF device filter
// takes: every rule with a type ("a" for all) and a major and minor (-1
// for any). The filter (cgroup2.DeviceFilter) dereferences Major and Minor
// and knows no empty type: given deviceRules as v1 takes them, it panics.
func v2Devices(rules []specs.LinuxDeviceCgroup) []specs.LinuxDeviceCgroup {
	out := make([]specs.LinuxDeviceCgroup, len(rules))
	for i, r := range rules {
		if r.Type == "" {
			r.Type = "a"
		}
		any := int64(-1)
		if r.Major == nil {
			r.Major = &any
		}
		if r.Minor == nil {
			r.Minor = &any
		}
		out[i] = r
	}
	return out
}

// cgroupRoot is where the cgroup filesystems are mounted: the unified
// (v2) hierarchy itself, or the v1 hierarchies under it.
const cgroupRoot = "/sys/fs/cgroup"

// v2Leaf is the cgroup under a v2 job cgroup that the shim starts the
// job's processes in; the job cgroup itself holds none. cgroup v2 lets a
// cgroup give controllers to cgroups below it (cgroup.subtree_control)
// only while it holds no process itself: a container runtime, started in
// the job cgroup, makes its container's cgroup under it (the job cgroup is
// its --cgroup-parent) and would get EBUSY enabling memory, pids or cpu
// there. With the runtime client (or a host job) in the leaf, the job
// cgroup is free to, and its limits and device program still cover
// everything under it. v1 has no such rule and no leaf.
const v2Leaf = "main"

// cgroupDriver makes and finds job cgroups under one parent (one per
// agent, so several agents on one host stay apart).
type cgroupDriver struct {
	v2 bool
	// root is where the v2 hierarchy is mounted: "" is cgroupRoot (a
	// unified host, the agent's only choice); tests use a hybrid host's
	// cgroupRoot/unified.
	root string
	// without are the v2 limits (memory, cpu, pids) this driver leaves
	// unset, their controller missing from its hierarchy: only a test's
	// driver on a hybrid host's cgroup2, where they are bound to v1. An
	// agent's own driver has them all (newCgroupDriver checks).
	without []string
	parent  string // e.g. "/allot/node-a"
}

// v2TestDrivers are drivers (by cleaned parent) that agents with that
// cgroup parent use instead of the host's choice: a test registers one to
// run the agent's v2 path on a hybrid host's cgroup2 hierarchy. Nothing
// else registers any.
var v2TestDrivers sync.Map

// v2Root is the v2 hierarchy's mount point.
func (d *cgroupDriver) v2Root() string {
	if d.root == "" {
		return cgroupRoot
	}
	return d.root
}

// v1Subsystems are the v1 controllers a job cgroup uses: the limits,
// devices for the GPU fence, freezer to kill without races, cpuacct for
// statistics.
var v1Subsystems = []cgroup1.Name{cgroup1.Memory, cgroup1.Cpu, cgroup1.Cpuacct, cgroup1.Pids, cgroup1.Devices, cgroup1.Freezer}

func v1Hierarchy() ([]cgroup1.Subsystem, error) {
	all, err := cgroup1.Default()
	if err != nil {
		return nil, err
	}
	var out []cgroup1.Subsystem
	for _, s := range all {
		if slices.Contains(v1Subsystems, s.Name()) {
			out = append(out, s)
		}
	}
	for _, want := range []cgroup1.Name{cgroup1.Devices, cgroup1.Freezer, cgroup1.Memory, cgroup1.Pids} {
		if !slices.ContainsFunc(out, func(s cgroup1.Subsystem) bool { return s.Name() == want }) {
			return nil, fmt.Errorf("the cgroup v1 %s controller is not mounted", want)
		}
	}
	return out, nil
}

// newCgroupDriver detects the cgroup version; it fails when the agent
// cannot make cgroups (not root, no cgroup filesystem, a controller
// missing). parent is relative to the cgroup root.
func newCgroupDriver(parent string) (*cgroupDriver, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("making job cgroups needs root")
	}
	d := &cgroupDriver{parent: path.Clean("/" + parent)}
	if t, ok := v2TestDrivers.Load(d.parent); ok {
		td := t.(cgroupDriver)
		return &td, nil
	}
	switch cgroups.Mode() {
	case cgroups.Unified:
		d.v2 = true
		b, err := os.ReadFile(cgroupRoot + "/cgroup.controllers")
		if err != nil {
			return nil, fmt.Errorf("reading cgroup v2 controllers: %w", err)
		}
		for _, c := range []string{"memory", "pids", "cpu"} {
			if !slices.Contains(strings.Fields(string(b)), c) {
				return nil, fmt.Errorf("the cgroup v2 %s controller is not available", c)
			}
		}
	case cgroups.Legacy, cgroups.Hybrid:
		if _, err := v1Hierarchy(); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("no cgroup filesystem at /sys/fs/cgroup")
	}
	return d, nil
}

// Version names the cgroup version for the inventory.
func (d *cgroupDriver) Version() string {
	if d.v2 {
		return "cgroup-v2"
	}
	return "cgroup-v1"
}

func (d *cgroupDriver) groupPath(name string) string { return path.Join(d.parent, name) }

// create makes the job cgroup name with limits.
func (d *cgroupDriver) create(name string, lim jobLimits) (*jobCgroup, error) {
	p := d.groupPath(name)
	if d.v2 {
		res := &cgroup2.Resources{}
		if lim.MemoryBytes > 0 && !slices.Contains(d.without, "memory") {
			m := lim.MemoryBytes
			res.Memory = &cgroup2.Memory{Max: &m}
		}
		if lim.MilliCPUs > 0 && !slices.Contains(d.without, "cpu") {
			q := lim.MilliCPUs * 100 // µs per 100 ms period
			period := uint64(100000)
			res.CPU = &cgroup2.CPU{Max: cgroup2.NewCPUMax(&q, &period)}
		}
		if lim.PidsMax > 0 && !slices.Contains(d.without, "pids") {
			res.Pids = &cgroup2.Pids{Max: lim.PidsMax}
		}
		if lim.Devices != nil {
			res.Devices = v2Devices(deviceRules(lim.Devices))
		}
		dir := path.Join(d.v2Root(), p)
		// A cgroup left by an earlier start of this lease (an agent that
		// died before cleaning up) still has its eBPF device filter: a new
		// one would be attached next to it and both would have to allow;
		// and once killed, it kills what is started into it (see Kill).
		// Start from a fresh one; one with processes in it is not ours to
		// reuse.
		if err := rmdirTree(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("creating cgroup %s: an earlier one is still there: %w", p, err)
		}
		m, err := cgroup2.NewManager(d.v2Root(), p, res)
		if err != nil {
			_ = os.Remove(dir)
			return nil, fmt.Errorf("creating cgroup %s: %w", p, err)
		}
		// The job's processes go in a leaf under it (see v2Leaf).
		if err := os.Mkdir(path.Join(dir, v2Leaf), 0o755); err != nil {
			_ = rmdirTree(dir)
			return nil, fmt.Errorf("creating cgroup %s/%s: %w", p, v2Leaf, err)
		}
		return &jobCgroup{path: p, root: d.v2Root(), v2: m}, nil
	}
	res := &specs.LinuxResources{}
	if lim.MemoryBytes > 0 {
		m := lim.MemoryBytes
		res.Memory = &specs.LinuxMemory{Limit: &m}
	}
	if lim.MilliCPUs > 0 {
		q := lim.MilliCPUs * 100
		period := uint64(100000)
		res.CPU = &specs.LinuxCPU{Quota: &q, Period: &period}
	}
	if lim.PidsMax > 0 {
		pl := lim.PidsMax
		res.Pids = &specs.LinuxPids{Limit: &pl}
	}
	if lim.Devices != nil {
		res.Devices = deviceRules(lim.Devices)
	}
	cg, err := cgroup1.New(cgroup1.StaticPath(p), res, cgroup1.WithHierarchy(v1Hierarchy))
	if err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", p, err)
	}
	return &jobCgroup{path: p, v1: cg}, nil
}

// load finds an existing job cgroup (after an agent restart).
func (d *cgroupDriver) load(name string) (*jobCgroup, error) {
	p := d.groupPath(name)
	if d.v2 {
		m, err := cgroup2.Load(p, cgroup2.WithMountpoint(d.v2Root()))
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(path.Join(d.v2Root(), p)); err != nil {
			return nil, err
		}
		return &jobCgroup{path: p, root: d.v2Root(), v2: m}, nil
	}
	cg, err := cgroup1.Load(cgroup1.StaticPath(p), cgroup1.WithHierarchy(v1Hierarchy))
	if err != nil {
		return nil, err
	}
	return &jobCgroup{path: p, v1: cg}, nil
}

// children lists the job cgroups under the parent (to find orphans).
func (d *cgroupDriver) children() []string {
	dir := path.Join(d.v2Root(), d.parent)
	if !d.v2 {
		dir = path.Join(cgroupRoot, "pids", d.parent)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), "job-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// jobCgroup is one job's cgroup.
type jobCgroup struct {
	path string // relative to the cgroup root
	root string // v2: where the hierarchy is mounted
	v1   cgroup1.Cgroup
	v2   *cgroup2.Manager
}

// Path is the cgroup's path relative to the cgroup root, e.g.
// "/allot/node-a/job-7-1" (the --cgroup-parent of a container runtime).
func (c *jobCgroup) Path() string { return c.path }

// Procs lists every process in the cgroup and below it.
func (c *jobCgroup) Procs() []int {
	var out []int
	if c.v2 != nil {
		ps, _ := c.v2.Procs(true)
		for _, p := range ps {
			out = append(out, int(p))
		}
		return out
	}
	ps, _ := c.v1.Processes(cgroup1.Pids, true)
	for _, p := range ps {
		if !slices.Contains(out, p.Pid) {
			out = append(out, p.Pid)
		}
	}
	return out
}

// Signal sends sig to every process of the job.
func (c *jobCgroup) Signal(sig syscall.Signal) {
	for _, pid := range c.Procs() {
		_ = syscall.Kill(pid, sig)
	}
}

// Kill kills every process of the job and waits (up to 10 s) until the
// cgroup is empty. v1 freezes the cgroup first, so nothing forks between
// reading the list and the signals; v2 writes cgroup.kill. A v2 cgroup
// once killed must not be used again: Linux (6.18 at least) kills every
// process started into it with CLONE_INTO_CGROUP afterwards, at once.
func (c *jobCgroup) Kill() error {
	if c.v2 != nil {
		if _, err := os.Stat(path.Join(c.root, c.path)); errors.Is(err, fs.ErrNotExist) {
			return nil // deleted: nothing in it
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c.v2 != nil {
			_ = c.v2.Kill()
		} else {
			frozen := c.v1.Freeze() == nil
			c.Signal(syscall.SIGKILL)
			if frozen {
				_ = c.v1.Thaw()
			}
		}
		if len(c.Procs()) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still has processes %v", c.path, c.Procs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Delete removes the (empty) cgroup and the cgroups under it (v2: its
// leaf and a container runtime's), and in v1 what a container runtime
// made under it in other hierarchies (blkio, cpuset, name=systemd…).
func (c *jobCgroup) Delete() error {
	if c.v2 != nil {
		if ps := c.Procs(); len(ps) > 0 {
			return fmt.Errorf("removing cgroup %s: it still has processes %v", c.path, ps)
		}
		if err := rmdirTree(path.Join(c.root, c.path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing cgroup %s: %w", c.path, err)
		}
		return nil
	}
	err := c.v1.Delete()
	removeTree(c.path)
	return err
}

// removeTree removes the cgroup path and the (empty) cgroups below it in
// every mounted v1 hierarchy, deepest first.
func removeTree(p string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, r := range roots {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(r, p), func(d string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, d)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}

// rmdirTree removes the cgroup dir and the cgroups below it, deepest
// first; it fails where one still has processes.
func rmdirTree(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(d string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			dirs = append(dirs, d)
		}
		return err
	})
	if err != nil {
		return err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := rmdirCgroup(dirs[i]); err != nil {
			return err
		}
	}
	return nil
}

// rmdirCgroup removes one empty cgroup. A process that has just exited
// can keep its cgroup busy (EBUSY) for a moment after it left
// cgroup.procs, while the kernel finishes tearing it down (runc retries
// for the same reason): it tries again for up to a second.
func rmdirCgroup(dir string) error {
	for wait := time.Millisecond; ; wait *= 2 {
		err := os.Remove(dir)
		if !errors.Is(err, syscall.EBUSY) || wait > 512*time.Millisecond {
			return err
		}
		time.Sleep(wait)
	}
}

// enter moves the calling process into the cgroup (v2: its leaf) and
// returns a function that moves it back where it was. The v1 way for a
// supervisor to start a child inside a cgroup: a fork inherits the
// cgroup, and the supervisor leaves before the child can fork anything.
// On v2 it is the fallback where clone3 with CLONE_INTO_CGROUP is not
// available (see cloneIntoCgroupWorks).
func (c *jobCgroup) enter() (leave func() error, err error) {
	pid := os.Getpid()
	if c.v2 != nil {
		orig, err := ownV2Cgroup()
		if err != nil {
			return nil, fmt.Errorf("finding the supervisor's cgroup: %w", err)
		}
		if err := writeProcs(path.Join(c.root, c.path, v2Leaf), pid); err != nil {
			return nil, fmt.Errorf("entering cgroup %s/%s: %w", c.path, v2Leaf, err)
		}
		return func() error { return writeProcs(path.Join(c.root, orig), pid) }, nil
	}
	orig, err := cgroup1.Load(cgroup1.PidPath(pid), cgroup1.WithHierarchy(v1Hierarchy))
	if err != nil {
		return nil, fmt.Errorf("finding the supervisor's cgroup: %w", err)
	}
	if err := c.v1.AddProc(uint64(pid)); err != nil {
		return nil, fmt.Errorf("entering cgroup %s: %w", c.path, err)
	}
	return func() error { return orig.AddProc(uint64(pid)) }, nil
}

// ownV2Cgroup is the calling process's cgroup in the v2 hierarchy (the
// "0::" line of /proc/self/cgroup).
func ownV2Cgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok && strings.HasPrefix(p, "/") {
			return path.Clean(p), nil
		}
	}
	return "", errors.New("no cgroup v2 line in /proc/self/cgroup")
}

// writeProcs moves process pid (all its threads) into the cgroup dir.
func writeProcs(dir string, pid int) error {
	f, err := os.OpenFile(path.Join(dir, "cgroup.procs"), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.Itoa(pid))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// dirFD opens the v2 job's leaf for SysProcAttr.CgroupFD.
func (c *jobCgroup) dirFD() (int, error) {
	return unix.Open(path.Join(c.root, c.path, v2Leaf), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// cloneIntoCgroupWorks reports whether this process can start a child
// with clone3 and CLONE_INTO_CGROUP (which SysProcAttr.UseCgroupFD
// uses), and otherwise the error clone3 gives: ENOSYS before Linux 5.3 or
// under a seccomp profile that refuses clone3 so that libc falls back to
// clone (Docker's and containerd's since 2020), EPERM under older such
// profiles, E2BIG before 5.7 (clone3 without CLONE_INTO_CGROUP). It never
// makes a process: it passes a stack size without a stack, which a kernel
// that knows every field refuses (EINVAL) only after it has checked the
// size of the arguments, and before it looks at the cgroup.
func cloneIntoCgroupWorks() (bool, error) {
	// struct clone_args, CLONE_ARGS_SIZE_VER2: flags, pidfd, child_tid,
	// parent_tid, exit_signal, stack, stack_size, tls, set_tid,
	// set_tid_size, cgroup.
	var args [11]uint64
	args[0] = unix.CLONE_INTO_CGROUP
	args[4] = uint64(unix.SIGCHLD)
	args[6] = 1 // stack_size with no stack: EINVAL
	// A cgroup fd that is not zero, so that a kernel whose clone_args end
	// before it refuses them (E2BIG) instead of ignoring it.
	args[10] = 1
	pid, _, e := unix.RawSyscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(&args[0])), unsafe.Sizeof(args), 0)
	switch {
	case e == unix.EINVAL:
		return true, nil
	case e != 0:
		return false, e
	case pid == 0:
		// Not reachable (the arguments are invalid); were it, this is the
		// child, which must not run on.
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 127, 0, 0)
	}
	var ws unix.WaitStatus
	_, _ = unix.Wait4(int(pid), &ws, 0, nil)
	return true, nil
}

// cloneUnsupported reports whether err, from starting a child with
// UseCgroupFD, may mean clone3 or CLONE_INTO_CGROUP is not available.
func cloneUnsupported(err error) bool {
	return errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.E2BIG) || errors.Is(err, unix.EINVAL)
}

// removeParent removes the agent's cgroup parent when no job is left in it
// (the agent stops and keeps no jobs).
func (d *cgroupDriver) removeParent() {
	roots := []string{d.v2Root()}
	if !d.v2 {
		roots, _ = filepath.Glob(cgroupRoot + "/*")
	}
	for _, r := range roots {
		// Remove the parent and then its own parent when that is empty too
		// (e.g. allot/<node>, then allot).
		for p := d.parent; p != "/" && p != "."; p = path.Dir(p) {
			if os.Remove(path.Join(r, p)) != nil {
				break
			}
		}
	}
}
