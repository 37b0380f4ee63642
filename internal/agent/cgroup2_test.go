package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"

	"github.com/allotlabs/allot/internal/agentproto"
)

// The cgroup v2 path, run for real: a job started by the real shim
// (CLONE_INTO_CGROUP) in a v2 job cgroup, fenced by its eBPF device
// filter, killed with cgroup.kill; then the same through a whole agent. On a unified host the hierarchy is
// /sys/fs/cgroup; on a hybrid one (v1 controllers, with a cgroup2
// hierarchy at /sys/fs/cgroup/unified) it is the latter: there the kernel
// runs the v2 cgroup's device program as well as the v1 devices
// controller, and cgroup.procs, cgroup.kill and CLONE_INTO_CGROUP work
// without any controller, so only the limits (memory, cpu, pids: bound to
// v1 there) are skipped.

// v2TestDriver is a v2 driver on the host's cgroup2 hierarchy, under a
// parent of the test's own; whatever the test leaves there is killed and
// removed when it ends, and a cgroup left behind fails the test.
func v2TestDriver(t *testing.T) *cgroupDriver {
	t.Helper()
	needRoot(t)
	var root string
	switch cgroups.Mode() {
	case cgroups.Unified:
		root = cgroupRoot
	case cgroups.Hybrid:
		root = cgroupRoot + "/unified"
	default:
		t.Skip("no cgroup2 hierarchy: /sys/fs/cgroup is cgroup v1 only, with no cgroup2 at /sys/fs/cgroup/unified")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		t.Skipf("%s is not a cgroup2 filesystem (%v)", root, err)
	}
	// Two levels of the test's own (as allot-local/NAME is), so that the
	// cleanup checks removeParent removes the parent's parent too.
	own := path.Clean("/" + testCgroupParent(t) + "-v2")
	d := &cgroupDriver{v2: true, root: root, parent: own + "/node-a"}
	if err := os.MkdirAll(path.Join(root, d.parent), 0o755); err != nil {
		t.Skipf("cannot make cgroups in %s: %v", root, err)
	}
	t.Cleanup(func() {
		for _, n := range d.children() {
			if cg, err := d.load(n); err == nil {
				_ = cg.Kill()
				_ = cg.Delete()
			}
		}
		d.removeParent()
		if _, err := os.Stat(path.Join(root, own)); err == nil {
			t.Errorf("cgroup %s is left behind", path.Join(root, own))
		}
	})
	return d
}

// v2Job is a job started by the real shim in cg.
type v2Job struct {
	shim *exec.Cmd
	pid  int
	dir  string
	done chan struct{}
}

// startV2Job starts argv as testUser through the shim (this test binary,
// as the agent would start it) in cg, and returns once the job runs.
func startV2Job(t *testing.T, d *cgroupDriver, cg *jobCgroup, argv ...string) *v2Job {
	t.Helper()
	return startV2JobWith(t, d, cg, nil, nil, argv...)
}

// startV2JobWith is startV2Job where via, unless nil, calls start (the
// start of the shim), e.g. from a thread of its own, and mod, unless nil,
// changes the shim's spec.
func startV2JobWith(t *testing.T, d *cgroupDriver, cg *jobCgroup, via func(start func() (*exec.Cmd, int, error)) (*exec.Cmd, int, error), mod func(*shimSpec), argv ...string) *v2Job {
	t.Helper()
	u, err := user.Lookup(testUser)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := shimSpec{Argv: argv, Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/", UID: uint32(uid), GID: uint32(gid),
		Groups: []uint32{uint32(gid)}, Output: filepath.Join(dir, "output.log"),
		Cgroup: cg.Path(), CgroupV2: true, CgroupRoot: d.root}
	if mod != nil {
		mod(&spec)
	}
	if via == nil {
		via = func(start func() (*exec.Cmd, int, error)) (*exec.Cmd, int, error) { return start() }
	}
	cmd, pid, err := via(func() (*exec.Cmd, int, error) { return startShim(exe, dir, spec, []string{"PATH=/usr/bin:/bin"}) })
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "shim.log"))
		t.Fatalf("starting the job through the shim: %v\nshim.log:\n%s", err, log)
	}
	j := &v2Job{shim: cmd, pid: pid, dir: dir, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(j.done)
	}()
	t.Cleanup(func() {
		_ = cg.Kill()
		j.wait(t)
	})
	return j
}

// wait waits for the shim to end (it ends once the job's main process did
// and it killed the rest) and returns the job's exit record.
func (j *v2Job) wait(t *testing.T) exitRecord {
	t.Helper()
	select {
	case <-j.done:
	case <-time.After(20 * time.Second):
		_ = j.shim.Process.Kill()
		t.Fatal("the job's shim did not end within 20 s")
	}
	var rec exitRecord
	if err := readJSONFile(filepath.Join(j.dir, "exit.json"), &rec); err != nil {
		t.Fatalf("the shim wrote no exit status: %v", err)
	}
	return rec
}

func (j *v2Job) output(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(j.dir, "output.log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// parallelV2Cgroup makes a parallel test's job cgroup name on a v2 test
// driver.
func parallelV2Cgroup(t *testing.T, name string, lim jobLimits) (*cgroupDriver, *jobCgroup) {
	t.Helper()
	d := v2TestDriver(t)
	t.Parallel()
	cg, err := d.create(name, lim)
	if err != nil {
		t.Fatal(err)
	}
	return d, cg
}

// removeV2Cgroup removes the job's cgroup and checks it is gone.
func removeV2Cgroup(t *testing.T, d *cgroupDriver, cg *jobCgroup) {
	t.Helper()
	if err := cg.Delete(); err != nil || !gone(d, cg) {
		t.Errorf("deleting the job cgroup and what is under it: %v", err)
	}
}

// killAndRemove kills the job's cgroup, checks that every process of ps is
// gone and the job died of SIGKILL, then removes the cgroup (with its leaf
// and whatever was made under it) and checks it is gone.
func killAndRemove(t *testing.T, d *cgroupDriver, cg *jobCgroup, j *v2Job, ps []int) {
	t.Helper()
	if err := cg.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range ps {
		if _, ok := procStartTime(pid); ok {
			t.Errorf("pid %d outlived Kill", pid)
		}
	}
	if e := j.wait(t); e.Signal != "SIGKILL" {
		t.Errorf("exit = %+v, want SIGKILL", e)
	}
	removeV2Cgroup(t, d, cg)
}

// gone reports whether cg's directory is gone from the hierarchy.
func gone(d *cgroupDriver, cg *jobCgroup) bool {
	_, err := os.Stat(path.Join(d.v2Root(), cg.Path()))
	return os.IsNotExist(err)
}

// waitProcs waits until cg holds at least n processes.
func waitProcs(t *testing.T, cg *jobCgroup, n int) []int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second) // a test deadline, not product time
	for {
		ps := cg.Procs()
		if len(ps) >= n {
			return ps
		}
		if time.Now().After(deadline) { // a test deadline, not product time
			t.Fatalf("cgroup %s holds %v, want %d processes", cg.Path(), ps, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCgroupV2DeviceRulesCompile: the rules a job gets compile into the
// eBPF device program (the filter panicked on the v1 form of the rules,
// whose wildcards have no major or minor).
func TestCgroupV2DeviceRulesCompile(t *testing.T) {
	t.Parallel()
	rules := v2Devices(deviceRules([]devNum{{nvidiaMajor, 1}, {nvidiaMajor, nvidiaCtlMinor}, {511, -1}}))
	if _, _, err := cgroup2.DeviceFilter(rules); err != nil {
		t.Fatalf("compiling the device rules: %v", err)
	}
	for _, r := range rules {
		if r.Type == "" || r.Major == nil || r.Minor == nil {
			t.Errorf("rule %+v is not complete", r)
		}
	}
	// The v1 rules are left as they were.
	if v1 := deviceRules(nil); v1[0].Type != "" || v1[0].Major != nil {
		t.Errorf("v2Devices changed the v1 rules: %+v", v1[0])
	}
}

// TestCgroupDriverPicksTheHostsVersion: the agent's driver is v1 on a
// hybrid host and v2, on /sys/fs/cgroup, on a unified one.
func TestCgroupDriverPicksTheHostsVersion(t *testing.T) {
	needRoot(t)
	t.Parallel()
	d, err := newCgroupDriver(testCgroupParent(t))
	if err != nil {
		t.Skipf("this host gives jobs no cgroups: %v", err)
	}
	if want := cgroups.Mode() == cgroups.Unified; d.v2 != want || d.root != "" || d.v2Root() != "/sys/fs/cgroup" {
		t.Errorf("driver v2=%v root=%q on a host in mode %v", d.v2, d.v2Root(), cgroups.Mode())
	}
}

// TestCgroupV2DeviceFence: a job in a v2 job cgroup opens its own GPU and
// nvidiactl (ENXIO: no driver behind the fake nodes) and /dev/null; the
// eBPF program answers EPERM for another GPU.
func TestCgroupV2DeviceFence(t *testing.T) {
	d := v2TestDriver(t)
	t.Parallel()
	dev := filepath.Join(sharedTempDir(t), "dev")
	if err := makeFakeDevices(dev, 4); err != nil {
		t.Fatal(err)
	}
	cg, err := d.create("job-1-1", jobLimits{Devices: []devNum{{nvidiaMajor, 1}, {nvidiaMajor, nvidiaCtlMinor}}})
	if err != nil {
		t.Fatal(err)
	}
	// The program outlives the agent's file descriptor of it (closed by
	// its finalizer): the attachment holds it, as it must across agent
	// restarts.
	runtime.GC()
	runtime.GC()
	script := `for n in nvidia1 nvidia2 nvidia3 nvidiactl; do cat ` + dev + `/$n 2>&1 >/dev/null | sed "s/.*: /$n: /"; done; echo x > /dev/null && echo null: written`
	j := startV2Job(t, d, cg, "/bin/sh", "-c", script)
	if e := j.wait(t); e.ExitCode != 0 {
		t.Errorf("exit = %+v", e)
	}
	out := j.output(t)
	for _, want := range []string{"nvidia1: No such device or address", "nvidia2: Operation not permitted",
		"nvidia3: Operation not permitted", "nvidiactl: No such device or address", "null: written"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}
	removeV2Cgroup(t, d, cg)
}

// TestCgroupV2SetsidAndDoubleForkDieWithTheJob: what a job starts with
// setsid or a double fork stays in its cgroup; the shim kills it (v2:
// cgroup.kill) when the main process exits, and the empty cgroup is
// removed.
func TestCgroupV2SetsidAndDoubleForkDieWithTheJob(t *testing.T) {
	d, cg := parallelV2Cgroup(t, "job-2-1", jobLimits{})
	dir := jobDir(t)
	script := escapeesScript(dir)
	j := startV2Job(t, d, cg, "/bin/sh", "-c", script)
	if e := j.wait(t); e.ExitCode != 0 {
		t.Fatalf("exit = %+v: %s", e, j.output(t))
	}
	checkEscapeesDead(t, dir)
	if ps := cg.Procs(); len(ps) != 0 {
		t.Errorf("cgroup still holds %v", ps)
	}
	removeV2Cgroup(t, d, cg)
}

// TestCgroupV2KillEndsARunningJob: Kill (cgroup.kill) ends a running job,
// its setsid'ed and double-forked processes with it, at once.
func TestCgroupV2KillEndsARunningJob(t *testing.T) {
	d, cg := parallelV2Cgroup(t, "job-3-1", jobLimits{})
	j := startV2Job(t, d, cg, "/bin/sh", "-c", `trap '' TERM; setsid sleep 300 & (sleep 300 </dev/null >/dev/null 2>&1 &); sleep 300`)
	ps := waitProcs(t, cg, 4)
	if !slices.Contains(ps, j.pid) {
		t.Errorf("the job's main process %d is not in its cgroup %v", j.pid, ps)
	}
	killAndRemove(t, d, cg, j, ps)
}

// TestCgroupV2JobStartsInItsCgroup: the shim starts the job with
// CLONE_INTO_CGROUP: the job is in its cgroup from its first instruction
// and the shim itself never enters it.
func TestCgroupV2JobStartsInItsCgroup(t *testing.T) {
	d, cg := parallelV2Cgroup(t, "job-4-1", jobLimits{})
	// cat is the job's process itself (exec): what it reads is where it
	// was when it ran its first instruction, or nearly.
	j := startV2Job(t, d, cg, "/bin/sh", "-c", `exec /bin/cat /proc/self/cgroup`)
	j.wait(t)
	if out, want := j.output(t), "0::"+cg.Path()+"/"+v2Leaf; !slices.Contains(strings.Split(out, "\n"), want) {
		t.Errorf("the job ran in\n%s\nwant %s", out, want)
	}
	if err := cg.Delete(); err != nil {
		t.Fatal(err)
	}
	// A fresh cgroup: the shim killed the first once its job ended, and a
	// killed v2 cgroup kills what is started into it.
	cg, err := d.create("job-4-2", jobLimits{})
	if err != nil {
		t.Fatal(err)
	}
	j = startV2Job(t, d, cg, "/bin/sleep", "300")
	waitProcs(t, cg, 1)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", j.shim.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), cg.Path()) {
		t.Errorf("the shim is in the job's cgroup:\n%s", b)
	}
	if ps := cg.Procs(); !slices.Equal(ps, []int{j.pid}) {
		t.Errorf("cgroup holds %v, want only the job %d", ps, j.pid)
	}
	// All of it in the leaf: the job cgroup itself holds no process (v2's
	// rule for a cgroup that gives controllers to cgroups below it).
	if own := readProcs(t, path.Join(d.v2Root(), cg.Path())); len(own) != 0 {
		t.Errorf("the job cgroup itself holds %v", own)
	}
	if err := cg.Kill(); err != nil {
		t.Fatal(err)
	}
	j.wait(t)
}

// readProcs is the processes in the cgroup dir itself (not below it).
func readProcs(t *testing.T, dir string) []int {
	t.Helper()
	b, err := os.ReadFile(path.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		out = append(out, pid)
	}
	return out
}

// TestCgroupV2KillAndDeleteReachNestedCgroups: what a container runtime
// makes under the job cgroup (its --cgroup-parent), next to the job's
// leaf, is listed, killed and removed with it.
func TestCgroupV2KillAndDeleteReachNestedCgroups(t *testing.T) {
	d, cg := parallelV2Cgroup(t, "job-9-1", jobLimits{Devices: []devNum{}})
	j := startV2Job(t, d, cg, "/bin/sleep", "300")
	waitProcs(t, cg, 1)
	// As a runtime puts its container: in a cgroup of its own under the
	// job's.
	inner := path.Join(d.v2Root(), cg.Path(), "libpod-x")
	if err := os.Mkdir(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeProcs(inner, j.pid); err != nil {
		t.Fatal(err)
	}
	if ps := cg.Procs(); !slices.Equal(ps, []int{j.pid}) || !slices.Equal(readProcs(t, inner), []int{j.pid}) {
		t.Errorf("the job cgroup lists %v, want the nested job %d", ps, j.pid)
	}
	if err := cg.Delete(); err == nil {
		t.Error("deleted a cgroup with a running job in it")
	}
	killAndRemove(t, d, cg, j, nil)
}

// TestCgroupV2RestartedAgentFindsItsJobs: a new driver (an agent started
// again) lists the job cgroup, loads it, sees the job's processes and
// kills and removes them; an unknown name does not load.
func TestCgroupV2RestartedAgentFindsItsJobs(t *testing.T) {
	d, cg := parallelV2Cgroup(t, "job-5-1", jobLimits{Devices: []devNum{{nvidiaMajor, 0}}})
	j := startV2Job(t, d, cg, "/bin/sleep", "300")
	waitProcs(t, cg, 1)

	again := &cgroupDriver{v2: true, root: d.root, parent: d.parent}
	if got := again.children(); !slices.Equal(got, []string{"job-5-1"}) {
		t.Fatalf("children = %v, want [job-5-1]", got)
	}
	found, err := again.load("job-5-1")
	if err != nil {
		t.Fatal(err)
	}
	if found.Path() != cg.Path() || !slices.Equal(found.Procs(), []int{j.pid}) {
		t.Errorf("loaded %s with %v, want %s with [%d]", found.Path(), found.Procs(), cg.Path(), j.pid)
	}
	if _, err := again.load("job-6-1"); err == nil {
		t.Error("a cgroup that does not exist loaded")
	}
	if err := found.Kill(); err != nil {
		t.Fatal(err)
	}
	if e := j.wait(t); e.Signal != "SIGKILL" {
		t.Errorf("exit = %+v, want SIGKILL", e)
	}
	if err := found.Delete(); err != nil || !gone(d, cg) {
		t.Errorf("deleting the job cgroup: %v", err)
	}
	if got := again.children(); len(got) != 0 {
		t.Errorf("children after the delete = %v", got)
	}
}

// TestCgroupV2StaleCgroupIsNotReused: a job cgroup left from an earlier
// start of the same lease is made anew (its device program must not stay
// next to the new one, and, killed, it would kill the new job at its
// start), and one that still has processes is refused.
func TestCgroupV2StaleCgroupIsNotReused(t *testing.T) {
	d := v2TestDriver(t)
	t.Parallel()
	dev := filepath.Join(sharedTempDir(t), "dev")
	if err := makeFakeDevices(dev, 3); err != nil {
		t.Fatal(err)
	}
	old, err := d.create("job-7-1", jobLimits{Devices: []devNum{{nvidiaMajor, 1}}})
	if err != nil {
		t.Fatal(err)
	}
	j := startV2Job(t, d, old, "/bin/sleep", "300")
	waitProcs(t, old, 1)
	if _, err := d.create("job-7-1", jobLimits{Devices: []devNum{{nvidiaMajor, 2}}}); err == nil || !strings.Contains(err.Error(), "still there") {
		t.Errorf("creating over a cgroup with a running job: err = %v", err)
	}
	if ps := old.Procs(); !slices.Equal(ps, []int{j.pid}) || gone(d, old) {
		t.Errorf("the refused create touched the running job's cgroup: %v", ps)
	}
	if err := old.Kill(); err != nil {
		t.Fatal(err)
	}
	j.wait(t)
	// The old cgroup (empty, with its program allowing GPU 1) is left;
	// the new one allows GPU 2 only.
	cg, err := d.create("job-7-1", jobLimits{Devices: []devNum{{nvidiaMajor, 2}}})
	if err != nil {
		t.Fatal(err)
	}
	// And it is not the killed one, which would kill the job at its start.
	j = startV2Job(t, d, cg, "/bin/sh", "-c", `for n in nvidia1 nvidia2; do cat `+dev+`/$n 2>&1 >/dev/null | sed "s/.*: /$n: /"; done`)
	if e := j.wait(t); e.ExitCode != 0 {
		t.Errorf("exit = %+v, want 0", e)
	}
	out := j.output(t)
	for _, want := range []string{"nvidia1: Operation not permitted", "nvidia2: No such device or address"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}
	if err := cg.Delete(); err != nil {
		t.Error(err)
	}
}

// TestCgroupV2Limits: memory, CPU and pids limits on v2, where the host
// has those controllers in its v2 hierarchy (on a hybrid host they are
// bound to v1: skipped, saying so).
func TestCgroupV2Limits(t *testing.T) {
	d := v2TestDriver(t)
	t.Parallel()
	b, err := os.ReadFile(path.Join(d.v2Root(), "cgroup.controllers"))
	if err != nil {
		t.Fatal(err)
	}
	have := strings.Fields(string(b))
	need := func(t *testing.T, c string) {
		if !slices.Contains(have, c) {
			t.Skipf("the %s controller is not in %s/cgroup.controllers (%q): on this host it is bound to cgroup v1", c, d.v2Root(), have)
		}
	}
	read := func(t *testing.T, cg *jobCgroup, file string) string {
		b, err := os.ReadFile(path.Join(d.v2Root(), cg.Path(), file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	t.Run("memory", func(t *testing.T) {
		need(t, "memory")
		cg, err := d.create("job-8-1", jobLimits{MemoryBytes: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if got := read(t, cg, "memory.max"); got != strconv.Itoa(64<<20) {
			t.Errorf("memory.max = %s", got)
		}
		j := startV2Job(t, d, cg, "/bin/sh", "-c", `x=$(head -c 268435456 /dev/zero | tr '\0' x); echo survived ${#x}`)
		if e := j.wait(t); e.ExitCode == 0 || strings.Contains(j.output(t), "survived") {
			t.Errorf("the job used 256 MB under a 64 MiB limit: %+v %s", e, j.output(t))
		}
		if err := cg.Delete(); err != nil {
			t.Error(err)
		}
	})
	t.Run("cpu", func(t *testing.T) {
		need(t, "cpu")
		cg, err := d.create("job-8-2", jobLimits{MilliCPUs: 500})
		if err != nil {
			t.Fatal(err)
		}
		if got := read(t, cg, "cpu.max"); got != "50000 100000" {
			t.Errorf("cpu.max = %s, want 50000 100000", got)
		}
		if err := cg.Delete(); err != nil {
			t.Error(err)
		}
	})
	t.Run("pids", func(t *testing.T) {
		need(t, "pids")
		cg, err := d.create("job-8-3", jobLimits{PidsMax: 16})
		if err != nil {
			t.Fatal(err)
		}
		if got := read(t, cg, "pids.max"); got != "16" {
			t.Errorf("pids.max = %s", got)
		}
		// 40 forks: those over the limit fail (pids.events counts them).
		j := startV2Job(t, d, cg, "/bin/sh", "-c", `i=0; while [ $i -lt 40 ]; do sleep 5 & i=$((i+1)); done 2>/dev/null; exit 0`)
		j.wait(t)
		if got := read(t, cg, "pids.events"); got == "max 0" {
			t.Errorf("40 processes under a pids limit of 16: pids.events = %q", got)
		}
		if err := cg.Delete(); err != nil {
			t.Error(err)
		}
	})
}

// v2Agent has the agents of the test use a v2 driver on the host's
// cgroup2 hierarchy (on a hybrid host: without the limits bound to v1
// there), under the test's own parent: the whole path of a job, from the
// agent's start through the shim to the end and the cleanup, on v2.
func v2Agent(t *testing.T) func(*Config) {
	t.Helper()
	d := v2TestDriver(t)
	b, err := os.ReadFile(path.Join(d.v2Root(), "cgroup.controllers"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"memory", "cpu", "pids"} {
		if !slices.Contains(strings.Fields(string(b)), c) {
			d.without = append(d.without, c)
		}
	}
	v2TestDrivers.Store(d.parent, *d)
	t.Cleanup(func() { v2TestDrivers.Delete(d.parent) })
	return func(c *Config) { c.CgroupParent = strings.TrimPrefix(d.parent, "/") }
}

// TestCgroupV2AgentFencesGPUsAndKillsEscapees: the agent's jobs on v2:
// in their own cgroup, fenced to their GPUs by the eBPF program, and what
// they start with setsid or a double fork dies with them.
func TestCgroupV2AgentFencesGPUsAndKillsEscapees(t *testing.T) {
	v2 := v2Agent(t)
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p, v2)
	if iso := ta.isolation(); !strings.Contains(iso, "cgroup-v2") {
		t.Errorf("isolation = %q, want cgroup-v2", iso)
	}
	script := `grep '^0::' /proc/self/cgroup; d=$(dirname ${ALLOT_GPU_DEVICES%%,*}); for n in nvidia1 nvidia2 nvidia3 nvidiactl; do cat $d/$n 2>&1 >/dev/null | sed "s/.*: /$n: /"; done`
	ta.run(t, shLease(201, []int{1}, script))
	if e := p.waitExit(ref(201), 5*time.Second); e.ExitCode != 0 {
		t.Errorf("exit = %+v: %s", e, logOf(p, ref(201)))
	}
	out := logOf(p, ref(201))
	for _, want := range []string{"0::/" + ta.cfg.CgroupParent + "/job-201-1/" + v2Leaf + "\n", "nvidia1: No such device or address", "nvidia2: Operation not permitted",
		"nvidia3: Operation not permitted", "nvidiactl: No such device or address"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}

	dir := jobDir(t)
	script = escapeesScript(dir)
	ta.run(t, shLease(202, []int{2}, script))
	if e := p.waitExit(ref(202), 5*time.Second); e.ExitCode != 0 {
		t.Fatalf("exit = %+v", e)
	}
	checkEscapeesDead(t, dir)
}

// TestCgroupV2AgentRestartAdoptsJobsAndKillsOrphans: an agent restarted
// on v2 finds its running job by its cgroup and lease, kills a job cgroup
// no lease explains, and ends the adopted job on a stop order.
func TestCgroupV2AgentRestartAdoptsJobsAndKillsOrphans(t *testing.T) {
	v2 := v2Agent(t)
	t.Parallel()
	p := newPeer(t)
	state := sharedTempDir(t)
	keep := func(c *Config) { c.StateDir, c.KeepJobsOnExit = state, true }
	ta := startAgent(t, p, v2, keep)
	s := ta.run(t, shLease(211, []int{2}, `echo up; exec sleep 300`))
	ta.stop()
	// An orphan: a job cgroup with a process and no lease.
	d, err := newCgroupDriver(ta.cfg.CgroupParent)
	if err != nil || !d.v2 {
		t.Fatalf("driver %+v: %v", d, err)
	}
	orphan, err := d.create("job-999-1", jobLimits{})
	if err != nil {
		t.Fatal(err)
	}
	oj := startV2Job(t, d, orphan, "/bin/sleep", "300")
	waitProcs(t, orphan, 1)

	ta2 := startAgent(t, p, v2, keep, func(c *Config) { c.KeepJobsOnExit = false })
	p.mu.Lock()
	reg := p.regs[len(p.regs)-1]
	p.mu.Unlock()
	if len(reg.Running) != 1 || reg.Running[0].JobID != 211 || reg.Running[0].PID != s.PID {
		t.Errorf("registration after the restart lists %+v, want job 211 pid %d", reg.Running, s.PID)
	}
	if e := oj.wait(t); e.Signal != "SIGKILL" {
		t.Errorf("orphan exit = %+v, want SIGKILL", e)
	}
	if !gone(d, orphan) {
		t.Errorf("the orphan's cgroup %s is left", orphan.Path())
	}
	p.push(agentproto.Orders{Stop: []agentproto.Stop{{JobID: 211, Segment: 1, Grace: time.Second, Reason: "cancelled"}}})
	if e := p.waitExit(ref(211), 5*time.Second); e.Reason != "cancelled" {
		t.Errorf("exit = %+v", e)
	}
	ta2.stop()
	if got := d.children(); len(got) != 0 {
		t.Errorf("job cgroups left after the agent stopped: %v", got)
	}
}

// enableV2Controller enables a domain controller (hugetlb, else pids or
// memory) in cgroup.subtree_control from the root of d's hierarchy down to
// d's parent, so that d's job cgroups have it, and disables it again at
// the end of the test where it was not enabled before (the root
// included: a host-wide change, so the caller is not parallel).
func enableV2Controller(t *testing.T, d *cgroupDriver) string {
	t.Helper()
	root := d.v2Root()
	b, err := os.ReadFile(path.Join(root, "cgroup.controllers"))
	if err != nil {
		t.Fatal(err)
	}
	var ctrl string
	for _, c := range []string{"hugetlb", "pids", "memory"} {
		if slices.Contains(strings.Fields(string(b)), c) {
			ctrl = c
			break
		}
	}
	if ctrl == "" {
		t.Skipf("no domain controller to enable in %s (cgroup.controllers: %q)", root, b)
	}
	enabled := func(dir string) bool {
		b, err := os.ReadFile(path.Join(dir, "cgroup.subtree_control"))
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(strings.Fields(string(b)), ctrl)
	}
	subtree := func(dir, op string) error { return subtreeControl(dir, op+ctrl) }
	// The root, then each parent down to the agent's.
	dirs := []string{root}
	var parts []string
	for _, p := range strings.Split(strings.Trim(d.parent, "/"), "/") {
		parts = append(parts, p)
		dirs = append(dirs, path.Join(root, path.Join(parts...)))
	}
	var mine []string // where this test enabled it
	t.Cleanup(func() {
		// Before the driver's cleanup (which removes the parents): no job
		// cgroup left that enabled it, then deepest first.
		for _, n := range d.children() {
			if cg, err := d.load(n); err == nil {
				_ = cg.Kill()
				_ = cg.Delete()
			}
		}
		for i := len(mine) - 1; i >= 0; i-- {
			if err := subtree(mine[i], "-"); err != nil {
				t.Errorf("putting back %s/cgroup.subtree_control (without %s): %v", mine[i], ctrl, err)
			}
		}
	})
	for _, dir := range dirs {
		if enabled(dir) {
			continue
		}
		if err := subtree(dir, "+"); err != nil {
			t.Skipf("cannot enable %s in %s/cgroup.subtree_control: %v", ctrl, dir, err)
		}
		mine = append(mine, dir)
		if dir == root {
			t.Logf("enabled %s in %s/cgroup.subtree_control for the test (a host-wide change, undone at its end)", ctrl, root)
		}
	}
	return ctrl
}

// subtreeControl writes change (e.g. "+hugetlb") to the cgroup dir's
// cgroup.subtree_control.
func subtreeControl(dir, change string) error {
	return os.WriteFile(path.Join(dir, "cgroup.subtree_control"), []byte(change), 0)
}

// TestCgroupV2RuntimeCanEnableControllersUnderTheJob: what a container
// runtime does with its --cgroup-parent (the job cgroup): enable a
// controller in the job cgroup's cgroup.subtree_control for the
// container's cgroup. v2 refuses that (EBUSY) while the job cgroup holds a
// process itself, as it did when the shim started the runtime client in
// it; with the shim's processes in the job's leaf it works. The controller
// is hugetlb on a hybrid host (the only one in its cgroup2 hierarchy),
// and it must be enabled down the test's own parents, from the root
// (which is put back as it was).
func TestCgroupV2RuntimeCanEnableControllersUnderTheJob(t *testing.T) {
	d := v2TestDriver(t) // not parallel: it changes the hierarchy's root
	root := d.v2Root()
	ctrl := enableV2Controller(t, d)
	cg, err := d.create("job-10-1", jobLimits{Devices: []devNum{}})
	if err != nil {
		t.Fatal(err)
	}
	j := startV2Job(t, d, cg, "/bin/sleep", "300")
	waitProcs(t, cg, 1)
	dir := path.Join(root, cg.Path())
	leaf := path.Join(dir, v2Leaf)
	if own, inLeaf := readProcs(t, dir), readProcs(t, leaf); len(own) != 0 || !slices.Equal(inLeaf, []int{j.pid}) {
		t.Fatalf("the job cgroup holds %v and its leaf %v, want nothing and [%d]", own, inLeaf, j.pid)
	}

	// Before: the job's process in the job cgroup itself.
	if err := writeProcs(dir, j.pid); err != nil {
		t.Fatal(err)
	}
	err = subtreeControl(dir, "+"+ctrl)
	if !errors.Is(err, unix.EBUSY) {
		t.Errorf("enabling %s under a job cgroup that holds a process: err = %v, want EBUSY", ctrl, err)
	}
	t.Logf("with the job's process in the job cgroup itself: %v", err)
	if err := writeProcs(leaf, j.pid); err != nil {
		t.Fatal(err)
	}

	// After: the process in the leaf, as the shim starts it.
	if err := subtreeControl(dir, "+"+ctrl); err != nil {
		t.Fatalf("enabling %s under the job cgroup with its process in the leaf: %v", ctrl, err)
	}
	ctr := path.Join(dir, "libpod-x") // the runtime's container cgroup
	if err := os.Mkdir(ctr, 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path.Join(ctr, "cgroup.controllers")); err != nil || !slices.Contains(strings.Fields(string(b)), ctrl) {
		t.Errorf("the container's cgroup has controllers %q (%v), want %s", b, err, ctrl)
	}
	if err := writeProcs(ctr, j.pid); err != nil {
		t.Fatalf("moving the job into the container's cgroup: %v", err)
	}
	if ps := cg.Procs(); !slices.Equal(ps, []int{j.pid}) {
		t.Errorf("the job cgroup lists %v, want [%d]", ps, j.pid)
	}
	killAndRemove(t, d, cg, j, nil)
}

// clone3Refused returns a via for startV2JobWith that starts the shim
// from a thread of its own where clone3 fails with errno, as under a
// seccomp profile that refuses it (Docker's and containerd's give ENOSYS,
// older ones EPERM): the shim and its job inherit the filter.
func clone3Refused(t *testing.T, errno unix.Errno) func(start func() (*exec.Cmd, int, error)) (*exec.Cmd, int, error) {
	t.Helper()
	var arch uint32
	switch runtime.GOARCH {
	case "amd64":
		arch = unix.AUDIT_ARCH_X86_64
	case "arm64":
		arch = unix.AUDIT_ARCH_AARCH64
	default:
		t.Skipf("no seccomp filter written for %s", runtime.GOARCH)
	}
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4}, // seccomp_data.arch
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 3, K: arch},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_CLONE3},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(errno)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	return func(start func() (*exec.Cmd, int, error)) (*exec.Cmd, int, error) {
		type res struct {
			cmd *exec.Cmd
			pid int
			err error
		}
		ch := make(chan res, 1)
		go func() {
			// Never unlocked: the thread ends with the goroutine, its
			// filter with it.
			runtime.LockOSThread()
			fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
			if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fp)), 0, 0); err != nil {
				ch <- res{err: fmt.Errorf("installing the seccomp filter: %w", err)}
				return
			}
			if ok, err := cloneIntoCgroupWorks(); ok || !errors.Is(err, errno) {
				ch <- res{err: fmt.Errorf("under the filter, the clone3 probe says %v, %v; want false, %v", ok, err, errno)}
				return
			}
			cmd, pid, err := start()
			ch <- res{cmd, pid, err}
		}()
		r := <-ch
		return r.cmd, r.pid, r.err
	}
}

// TestCgroupV2StartsWithoutClone3: where clone3 (and so
// CLONE_INTO_CGROUP) is refused with ENOSYS (Linux before 5.3; the seccomp
// profiles of Docker 20.10 and later and of containerd, which refuse it so
// that libc falls back to clone), the shim starts the job as on v1: it
// moves itself into the job's leaf while it forks, then out. The job is
// in its cgroup from its first instruction, fenced to its GPU, and killed
// with the cgroup; the shim is not left in it and says once in its log
// that it fell back.
func TestCgroupV2StartsWithoutClone3(t *testing.T) {
	d := v2TestDriver(t)
	t.Parallel()
	via := clone3Refused(t, unix.ENOSYS)
	dev := filepath.Join(sharedTempDir(t), "dev")
	if err := makeFakeDevices(dev, 3); err != nil {
		t.Fatal(err)
	}
	cg, err := d.create("job-11-1", jobLimits{Devices: []devNum{{nvidiaMajor, 1}}})
	if err != nil {
		t.Fatal(err)
	}
	script := `grep '^0::' /proc/self/cgroup; for n in nvidia1 nvidia2; do cat ` + dev + `/$n 2>&1 >/dev/null | sed "s/.*: /$n: /"; done; echo ready; setsid sleep 300 & exec sleep 300`
	j := startV2JobWith(t, d, cg, via, nil, "/bin/sh", "-c", script)
	deadline := time.Now().Add(10 * time.Second) // a test deadline, not product time
	for !strings.Contains(j.output(t), "ready") {
		if time.Now().After(deadline) { // a test deadline, not product time
			t.Fatalf("the job did not get ready:\n%s", j.output(t))
		}
		time.Sleep(20 * time.Millisecond)
	}
	ps := waitProcs(t, cg, 2)
	if !slices.Contains(ps, j.pid) {
		t.Errorf("the job %d is not in its cgroup %v", j.pid, ps)
	}
	out := j.output(t)
	for _, want := range []string{"0::" + cg.Path() + "/" + v2Leaf + "\n", "nvidia1: No such device or address", "nvidia2: Operation not permitted"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", j.shim.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), cg.Path()) {
		t.Errorf("the shim stayed in the job's cgroup:\n%s", b)
	}
	log, _ := os.ReadFile(filepath.Join(j.dir, "shim.log"))
	if n := strings.Count(string(log), "clone3 with CLONE_INTO_CGROUP is not available (function not implemented)"); n != 1 {
		t.Errorf("the shim's log says %d times that it fell back:\n%s", n, log)
	}
	killAndRemove(t, d, cg, j, ps)
}

// TestCgroupV2Clone3Probe: the probe finds clone3 with CLONE_INTO_CGROUP
// where the kernel has it (5.7 and later), and not where clone3 fails:
// ENOSYS, EPERM (older seccomp profiles) or E2BIG (Linux 5.3 to 5.6, whose
// clone3 has no cgroup field), each given here by a seccomp filter on a
// thread of the test's own. (A shim under EPERM cannot be run here: the
// test binary uses cgo, and glibc's pthread_create, which uses clone3,
// falls back to clone only on ENOSYS.)
func TestCgroupV2Clone3Probe(t *testing.T) {
	needRoot(t) // a seccomp filter without no_new_privs
	t.Parallel()
	var u unix.Utsname
	_ = unix.Uname(&u)
	if ok, err := cloneIntoCgroupWorks(); !ok {
		t.Skipf("clone3 with CLONE_INTO_CGROUP is not available here (kernel %s): %v", unix.ByteSliceToString(u.Release[:]), err)
	}
	for _, errno := range []unix.Errno{unix.ENOSYS, unix.EPERM, unix.E2BIG} {
		// clone3Refused's via checks the probe, under the filter, before it
		// would start anything.
		_, _, err := clone3Refused(t, errno)(func() (*exec.Cmd, int, error) { return nil, 0, nil })
		if err != nil {
			t.Errorf("%s: %v", unix.ErrnoName(errno), err)
		}
	}
	for _, e := range []unix.Errno{unix.ENOSYS, unix.EPERM, unix.E2BIG, unix.EINVAL} {
		if !cloneUnsupported(&os.PathError{Op: "fork/exec", Path: "/bin/true", Err: e}) {
			t.Errorf("a start failing with %s is not taken as clone3 missing", unix.ErrnoName(e))
		}
	}
	if cloneUnsupported(&os.PathError{Op: "fork/exec", Path: "/bin/true", Err: unix.ENOENT}) {
		t.Error("a start failing with ENOENT is taken as clone3 missing")
	}
}

// TestCgroupV2ContainerRuntimeGetsControllersUnderTheJob: real podman
// (with runc) on v2, started by the real shim as the agent starts an
// image job (as root, with containerRT's own command line, the job cgroup
// as its --cgroup-parent). With the podman client in the job's leaf,
// podman makes conmon's cgroup and runc the container's under the job
// cgroup, and the controller the job cgroup has reaches the container.
// With the client in the job cgroup itself (as before the leaf), v2
// refuses: podman logs EBUSY for conmon's cgroup, and runc, which
// ignores the same error, starts the container without the controller.
// On a hybrid host podman sees cgroup v1 at /sys/fs/cgroup: the job runs
// podman in a mount namespace of its own where the cgroup2 hierarchy is
// bind-mounted there.
func TestCgroupV2ContainerRuntimeGetsControllersUnderTheJob(t *testing.T) {
	d := v2TestDriver(t) // not parallel: enableV2Controller changes the hierarchy's root
	bin, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("podman is not installed (.ci/run installs it from Debian)")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare (util-linux)")
	}
	ctrl := enableV2Controller(t, d)
	rt, err := newContainerRT("podman", bin, nil)
	if err != nil {
		t.Fatal(err)
	}
	img := testImageTB(t, bin, rt.global...)
	u, err := user.Lookup(testUser)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	b, err := os.ReadFile(path.Join(d.v2Root(), "cgroup.controllers"))
	if err != nil {
		t.Fatal(err)
	}
	hasPids := slices.Contains(strings.Fields(string(b)), "pids")
	// run runs the image job in a new job cgroup; inJobItself moves the
	// podman client from the leaf into the job cgroup first.
	run := func(name string, inJobItself bool) (exitRecord, string, *jobCgroup) {
		cg, err := d.create(name, jobLimits{})
		if err != nil {
			t.Fatal(err)
		}
		state := t.TempDir()
		argv, _, err := rt.command(containerJob{Name: fmt.Sprintf("allot-test-%d-%s", os.Getpid(), name),
			Lease: agentproto.Lease{Image: img, Command: []string{"sh", "-c", "echo controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"}},
			ID:    identity{Name: testUser, UID: uint32(uid), GID: uint32(gid), Groups: []uint32{uint32(gid)}},
			Tmp:   jobDir(t), Cgroup: cg.Path(), Dir: state})
		if err != nil {
			t.Fatal(err)
		}
		if !hasPids {
			// podman's default pids limit (2048) would have runc write a
			// pids.max that the container's v2 cgroup lacks here (pids is
			// bound to v1): no pids limit for the container.
			i := slices.Index(argv, "run")
			argv = slices.Insert(argv, i+1, "--pids-limit", "-1")
		}
		move := ""
		if inJobItself {
			move = path.Join(cgroupRoot, cg.Path(), "cgroup.procs") // inside the namespace
		}
		wrapper := []string{unshare, "--mount", "--propagation", "private", "/bin/sh", "-c",
			`mount --bind "$0" ` + cgroupRoot + ` && { [ -z "$MOVE" ] || echo $$ > "$MOVE"; } && exec "$@"`, d.v2Root()}
		j := startV2JobWith(t, d, cg, nil, func(s *shimSpec) {
			s.AsRoot, s.Dir = true, state
			s.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "MOVE=" + move}
		}, append(wrapper, argv...)...)
		e := j.wait(t)
		return e, j.output(t), cg
	}
	containerHas := func(out string) (bool, bool) {
		for _, l := range strings.Split(out, "\n") {
			if f, ok := strings.CutPrefix(l, "controllers:"); ok {
				return true, slices.Contains(strings.Fields(f), ctrl)
			}
		}
		return false, false
	}

	// Before: the client in the job cgroup itself.
	e, out, cg := run("job-12-1", true)
	ran, has := containerHas(out)
	if !strings.Contains(out, "device or resource busy") || has {
		t.Errorf("with podman in the job cgroup itself: exit %+v, the container ran %v with %s %v; want EBUSY from podman and no %s:\n%s", e, ran, ctrl, has, ctrl, out)
	}
	t.Logf("podman in the job cgroup itself (exit %d):\n%s", e.ExitCode, out)
	removeV2Cgroup(t, d, cg)

	// After: the client in the leaf, as the shim starts it.
	e, out, cg = run("job-12-2", false)
	if ran, has := containerHas(out); e.ExitCode != 0 || !ran || !has || strings.Contains(out, "resource busy") {
		t.Errorf("with podman in the job's leaf: exit %+v, the container ran %v with %s %v; want it to run with %s:\n%s", e, ran, ctrl, has, ctrl, out)
	}
	t.Logf("podman in the job's leaf (exit %d):\n%s", e.ExitCode, out)
	dir := path.Join(d.v2Root(), cg.Path())
	if b, err := os.ReadFile(path.Join(dir, "cgroup.subtree_control")); err != nil || !slices.Contains(strings.Fields(string(b)), ctrl) {
		t.Errorf("the job cgroup's subtree_control is %q (%v), want %s enabled by the runtime", b, err, ctrl)
	}
	if _, err := os.Stat(path.Join(dir, "conmon")); err != nil {
		t.Errorf("podman made no cgroup for conmon under the job's: %v", err)
	}
	if ps := cg.Procs(); len(ps) != 0 {
		t.Errorf("processes left in the job cgroup: %v", ps)
	}
	if err := cg.Delete(); err != nil || !gone(d, cg) {
		t.Errorf("deleting the job cgroup and what the runtime made under it: %v", err)
	}
}
