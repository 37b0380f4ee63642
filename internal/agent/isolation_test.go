package agent

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
)

// These tests run jobs the way a hostile engineer would write them, on a
// real agent (root, real accounts, real cgroups, fake GPUs with real
// device nodes), and check that nothing escapes.

func needRoot(t *testing.T) {
	t.Helper()
	if !isRoot() {
		t.Skip("needs root: jobs run as other accounts in cgroups only when the agent is root")
	}
}

func logOf(p *peer, r agentproto.LeaseRef) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.logs[r], "\n")
}

func uidOf(t *testing.T, name string) string {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return u.Uid
}

func TestJobRunsAsItsAccountNeverRoot(t *testing.T) {
	needRoot(t)
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	// The lease's account wins over the agent's --job-user.
	l := shLease(101, []int{0}, `echo "uid=$(id -u) gid=$(id -g) user=$USER"; cat /proc/self/cgroup | grep -c job-101-1`)
	l.User = otherUser
	ta.run(t, l)
	if e := p.waitExit(ref(101), 5*time.Second); e.ExitCode != 0 {
		t.Fatalf("exit = %+v: %s", e, logOf(p, ref(101)))
	}
	out := logOf(p, ref(101))
	if !strings.Contains(out, "uid="+uidOf(t, otherUser)+" ") || !strings.Contains(out, "user="+otherUser) {
		t.Errorf("job ran as %q, want %s", out, otherUser)
	}
	if strings.Contains(out, "uid=0 ") {
		t.Errorf("job ran as root: %q", out)
	}

	// A lease naming root, or an account the node lacks, does not start.
	for i, u := range []string{"root", "no-such-account-x"} {
		id := int64(102 + i)
		l := shLease(id, []int{1}, "id")
		l.User = u
		p.push(agentproto.Orders{Offer: []agentproto.Lease{l}})
		p.waitFor("take", 5*time.Second, func() bool { return len(p.takes) >= 2+i })
		p.push(agentproto.Orders{Start: []agentproto.LeaseRef{ref(id)}})
		e := p.waitExit(ref(id), 5*time.Second)
		if e.Reason != ReasonStartFailed || e.ExitCode != 127 {
			t.Errorf("user %s: exit = %+v, want start_failed", u, e)
		}
		if !strings.Contains(e.Message, u) {
			t.Errorf("user %s: message %q does not name the account", u, e.Message)
		}
	}
}

func TestJobCannotReadTheAgentsTokenOrEnvironment(t *testing.T) {
	needRoot(t)
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	tokenFile := filepath.Join(t.TempDir(), "node-token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(filepath.Dir(tokenFile), 0o755)
	// What the attack in issue 12 did, and the other places a token could
	// be read from: the parent's environ (the shim), the agent's environ
	// and command line, the token file.
	script := `
for f in /proc/$PPID/environ /proc/` + strconv.Itoa(os.Getpid()) + `/environ ` + tokenFile + `; do
  if tr '\0' '\n' < "$f" >/dev/null 2>&1; then echo "READ $f"; tr '\0' '\n' < "$f"; else echo "DENIED $f"; fi
done
env`
	ta.run(t, shLease(111, []int{0}, script))
	p.waitExit(ref(111), 5*time.Second)
	out := logOf(p, ref(111))
	if strings.Contains(out, testToken) || strings.Contains(out, "READ ") {
		t.Errorf("the job read something of the agent's:\n%s", out)
	}
	if strings.Count(out, "DENIED") != 3 {
		t.Errorf("want 3 denials:\n%s", out)
	}
}

func TestCheckpointsOfAnotherAccountAreUnreadable(t *testing.T) {
	needRoot(t)
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	root := sharedTempDir(t)
	mine := filepath.Join(root, "team-a", "job-121")
	l := shLease(121, []int{0}, `echo secret-weights > "$ALLOT_CHECKPOINT_DIR/model.pt" && echo saved`)
	l.CheckpointDir = mine
	l.Env["ALLOT_CHECKPOINT_DIR"] = mine
	ta.run(t, l)
	if e := p.waitExit(ref(121), 5*time.Second); e.ExitCode != 0 {
		t.Fatalf("writer: %+v %s", e, logOf(p, ref(121)))
	}
	// Another team's job (another account) tries to read, list, replace.
	l2 := shLease(122, []int{1}, `cat `+mine+`/model.pt; ls `+mine+`; echo x > `+mine+`/model.pt; rm -rf `+mine+`; echo end`)
	l2.User = otherUser
	ta.run(t, l2)
	p.waitExit(ref(122), 5*time.Second)
	if out := logOf(p, ref(122)); strings.Contains(out, "secret-weights") || strings.Contains(out, "model.pt\n") {
		t.Errorf("another account read the checkpoint:\n%s", out)
	}
	b, err := os.ReadFile(filepath.Join(mine, "model.pt"))
	if err != nil || string(b) != "secret-weights\n" {
		t.Errorf("checkpoint after the other job: %q %v", b, err)
	}
}

func TestSetsidAndDoubleForkDieWithTheJob(t *testing.T) {
	needRoot(t)
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	dir := jobDir(t)
	// The reproduction from issue 12, and a double fork that closes its
	// output: both must die when the main process exits.
	script := escapeesScript(dir)
	ta.run(t, shLease(131, []int{2}, script))
	if e := p.waitExit(ref(131), 5*time.Second); e.ExitCode != 0 {
		t.Fatalf("exit = %+v", e)
	}
	checkEscapeesDead(t, dir)
}

func TestGPUDeviceFence(t *testing.T) {
	needRoot(t)
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	// The job holds GPU 1; it opens its own device, GPU 2's, and
	// nvidiactl. The devices cgroup answers EPERM for a GPU it was not
	// given; its own and nvidiactl pass the fence (and, with no driver
	// behind the fake nodes, fail with ENXIO).
	script := `d=$(dirname ${ALLOT_GPU_DEVICES%%,*}); for n in nvidia1 nvidia2 nvidia3 nvidiactl; do cat $d/$n >/dev/null 2>/tmp/err.$$ && echo "$n: opened" || echo "$n: $(sed 's/.*: //' /tmp/err.$$)"; done; rm -f /tmp/err.$$`
	ta.run(t, shLease(141, []int{1}, script))
	p.waitExit(ref(141), 5*time.Second)
	out := logOf(p, ref(141))
	for _, want := range []string{"nvidia1: No such device or address", "nvidia2: Operation not permitted", "nvidia3: Operation not permitted", "nvidiactl: No such device or address"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %q in:\n%s", want, out)
		}
	}
}

func TestMemoryLimitIsEnforced(t *testing.T) {
	needRoot(t)
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	// 64 MiB allowed; the job holds 256 MB in a shell variable.
	l := shLease(151, []int{0}, `x=$(head -c 268435456 /dev/zero | tr '\0' x); echo survived ${#x}`)
	l.MemoryBytes = 64 << 20
	ta.run(t, l)
	e := p.waitExit(ref(151), 20*time.Second)
	if strings.Contains(logOf(p, ref(151)), "survived") {
		t.Errorf("the job used 256 MB under a 64 MiB limit: %+v", e)
	}
	if e.ExitCode == 0 {
		t.Errorf("exit = %+v, want the OOM kill to fail the job", e)
	}
}

func TestServerKillOrderEndsAnOrphanAtOnce(t *testing.T) {
	needRoot(t)
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	ta.run(t, shLease(161, []int{3}, `trap '' TERM; echo trapped; sleep 300`))
	// The kill order comes once the job ignores SIGTERM: sent before the
	// shell had set its trap, the agent's SIGTERM would end it first.
	p.waitLogLine(ref(161), "trapped", 10*time.Second)
	p.mu.Lock()
	p.kill = []agentproto.LeaseRef{ref(161)}
	p.mu.Unlock()
	e := p.waitExit(ref(161), 5*time.Second)
	if e.Reason != ReasonOrphaned || e.Signal != "SIGKILL" {
		t.Errorf("exit = %+v, want killed as orphaned", e)
	}
}

// keepJobs configures agents that share one state directory and cgroup
// parent and leave their jobs running when they stop: a restart.
func keepJobs(t *testing.T) func(*Config) {
	state, parent := sharedTempDir(t), testCgroupParent(t)
	return func(c *Config) { c.StateDir, c.CgroupParent, c.KeepJobsOnExit = state, parent, true }
}

// TestRestartedAgentAdoptsItsJobs stops an agent that keeps its jobs (as
// a restart or an upgrade does), starts a new one on the same state: the
// job runs on, is reported running at registration, and its exit is
// reported once, with its real exit code.
func TestRestartedAgentAdoptsItsJobs(t *testing.T) {
	needRoot(t)
	t.Parallel()
	p := newPeer(t)
	keep := keepJobs(t)
	ta := startAgent(t, p, keep)
	dir := jobDir(t)
	ta.run(t, shLease(171, []int{0, 1}, `echo before; while [ ! -e `+dir+`/go ]; do sleep 0.05; done; echo after; exit 7`))
	p.waitLogLine(ref(171), "before", 5*time.Second)
	ta.stop()
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the job ends while no agent runs

	startAgent(t, p, keep, func(c *Config) { c.KeepJobsOnExit = false })
	e := p.waitExit(ref(171), 5*time.Second)
	if e.ExitCode != 7 {
		t.Errorf("exit = %+v, want the job's own code 7", e)
	}
	p.waitLogLine(ref(171), "after", 5*time.Second)
	time.Sleep(300 * time.Millisecond)
	p.mu.Lock()
	n := 0
	for _, x := range p.exited {
		if x.JobID == 171 {
			n++
		}
	}
	p.mu.Unlock()
	if n != 1 {
		t.Errorf("exit reported %d times, want once", n)
	}
}

func TestRestartedAgentReportsRunningJobs(t *testing.T) {
	needRoot(t)
	t.Parallel()
	p := newPeer(t)
	keep := keepJobs(t)
	ta := startAgent(t, p, keep)
	s := ta.run(t, shLease(181, []int{2}, `echo up; exec sleep 300`))
	ta.stop()
	ta2 := startAgent(t, p, keep, func(c *Config) { c.KeepJobsOnExit = false })
	p.mu.Lock()
	reg := p.regs[len(p.regs)-1]
	p.mu.Unlock()
	if len(reg.Running) != 1 || reg.Running[0].JobID != 181 || reg.Running[0].PID != s.PID {
		t.Fatalf("registration after the restart lists %+v, want job 181 pid %d", reg.Running, s.PID)
	}
	// The adopted job holds its GPU: a lease for it is not taken.
	p.push(agentproto.Orders{Offer: []agentproto.Lease{shLease(182, []int{2}, "true")}})
	time.Sleep(300 * time.Millisecond)
	p.mu.Lock()
	for _, r := range p.takes {
		if r.JobID == 182 {
			t.Errorf("took a lease on the adopted job's GPU")
		}
	}
	p.mu.Unlock()
	p.push(agentproto.Orders{Stop: []agentproto.Stop{{JobID: 181, Segment: 1, Grace: time.Second, Reason: "cancelled"}}})
	if e := p.waitExit(ref(181), 5*time.Second); e.Reason != "cancelled" {
		t.Errorf("exit = %+v", e)
	}
	ta2.stop()
}

func TestOrphanCgroupIsKilledAtStart(t *testing.T) {
	needRoot(t)
	t.Parallel()
	parent := testCgroupParent(t)
	d, err := newCgroupDriver(parent)
	if err != nil {
		t.Fatal(err)
	}
	cg, err := d.create("job-999-1", jobLimits{PidsMax: 100})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	add := func() error {
		if cg.v1 != nil {
			return cg.v1.AddProc(uint64(cmd.Process.Pid))
		}
		return cg.v2.AddProc(uint64(cmd.Process.Pid))
	}
	if err := add(); err != nil {
		t.Fatal(err)
	}
	p := newPeer(t)
	startAgent(t, p, func(c *Config) { c.CgroupParent = parent })
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the orphan in a job cgroup without a lease survived the agent's start")
	}
}

// testImageTB builds a tiny OCI image locally (there is no registry here):
// Debian's busybox-static as /bin, imported into podman's store, removed
// after the test.
func testImageTB(t testing.TB, podman string, global ...string) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox (Debian package busybox-static, which .ci/run installs) to build the test image from")
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"sh", "id", "ls", "cat", "grep", "echo", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", c)); err != nil {
			t.Fatal(err)
		}
	}
	tar := filepath.Join(t.TempDir(), "rootfs.tar")
	if out, err := exec.Command("tar", "-C", root, "-cf", tar, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	name := "localhost/allot-test-busybox:" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command(podman, append(slices.Clone(global), "import", tar, name)...).CombinedOutput(); err != nil {
		t.Skipf("%s cannot import an image here: %v %s", filepath.Base(podman), err, out)
	}
	t.Cleanup(func() { _ = exec.Command(podman, append(slices.Clone(global), "rmi", "--force", name)...).Run() })
	return name
}

// TestContainerJobGetsItsGPUsAndUser runs a job in an image through real
// podman and real Docker (a private dockerd): it runs as the job's account
// (not root), inside the job's cgroup, sees only its own GPU's device
// (plus nvidiactl), and its checkpoint and working directories are
// mounted.
func TestContainerJobGetsItsGPUsAndUser(t *testing.T) {
	needRoot(t)
	for _, rt := range []string{"podman", "docker"} {
		t.Run(rt, func(t *testing.T) {
			bin, err := exec.LookPath(rt)
			if err != nil {
				t.Skipf("%s is not installed (.ci/run installs it from Debian)", rt)
			}
			t.Parallel()
			var global []string
			if rt == "docker" {
				global = startDockerd(t)
			}
			img := testImageTB(t, bin, global...)
			p := newPeer(t)
			ta := startAgent(t, p, func(c *Config) { c.ContainerRuntime, c.ContainerRuntimeArgs = rt, global })
			if got := p.regs[len(p.regs)-1].Runtimes; len(got) != 1 || got[0] != rt {
				t.Errorf("inventory runtimes = %v", got)
			}
			work := jobDir(t)
			ckpt := filepath.Join(sharedTempDir(t), "ckpt")
			l := shLease(191, []int{1}, `echo "uid=$(id -u)"; ls $(dirname $ALLOT_GPU_DEVICES) | grep nvidia; grep -c job-191-1 /proc/self/cgroup; echo w > `+work+`/out; echo c > `+ckpt+`/c; echo "gpus=$ALLOT_GPU_DEVICES nv=$NVIDIA_VISIBLE_DEVICES"`)
			l.Image, l.WorkDir, l.CheckpointDir = img, work, ckpt
			l.Env["NVIDIA_VISIBLE_DEVICES"] = "all" // the job's wish is not the toolkit's order
			ta.run(t, l)
			e := p.waitExit(ref(191), 60*time.Second)
			out := logOf(p, ref(191))
			if e.ExitCode != 0 {
				t.Fatalf("exit = %+v\n%s", e, out)
			}
			if !strings.Contains(out, "uid="+uidOf(t, testUser)+"\n") {
				t.Errorf("container job ran as the wrong user:\n%s", out)
			}
			if !strings.Contains(out, "\nnvidia1\nnvidiactl\n") || strings.Contains(out, "nvidia0") || strings.Contains(out, "nvidia2") {
				t.Errorf("container job sees the wrong GPUs:\n%s", out)
			}
			if !strings.Contains(out, "gpus="+filepath.Join(ta.cfg.StateDir, "dev", "nvidia1")+" nv=1") || strings.Contains(out, "nv=all") {
				t.Errorf("ALLOT_GPU_DEVICES inside the container:\n%s", out)
			}
			for _, f := range []string{filepath.Join(work, "out"), filepath.Join(ckpt, "c")} {
				if _, err := os.Stat(f); err != nil {
					t.Errorf("the container did not write through its mount: %v", err)
				}
			}
		})
	}
}

// startDockerd runs a private Docker daemon for the test (its own data
// root, socket and cgroup parent) and returns the global flags that reach
// it. It is stopped, and its mounts removed, when the test ends.
func startDockerd(t *testing.T) []string {
	t.Helper()
	dockerd, err := exec.LookPath("dockerd")
	if err != nil {
		t.Skip("no dockerd (.ci/run installs Debian's docker.io)")
	}
	dir, err := os.MkdirTemp("", "allot-dockerd-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	cmd := exec.Command(dockerd, "--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "exec"),
		"--pidfile", filepath.Join(dir, "pid"), "-H", "unix://"+sock, "--iptables=false", "--ip6tables=false", "--bridge=none",
		"--cgroup-parent", "/allot-test/dockerd-"+strconv.Itoa(os.Getpid()))
	logf, _ := os.Create(filepath.Join(dir, "log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		logf.Close()
		unmountUnder(dir)
		_ = os.RemoveAll(dir)
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/allot-test/dockerd-" + strconv.Itoa(os.Getpid()))
		for _, d := range dirs {
			_ = os.Remove(d)
		}
	})
	for i := 0; ; i++ {
		if exec.Command("docker", "-H", "unix://"+sock, "version").Run() == nil {
			break
		}
		if i > 300 {
			b, _ := os.ReadFile(filepath.Join(dir, "log"))
			t.Skipf("dockerd did not come up here: %s", lastLines(string(b), 5))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return []string{"-H", "unix://" + sock}
}

// unmountUnder detaches every mount below dir (deepest first).
func unmountUnder(dir string) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var mps []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mps = append(mps, f[4])
		}
	}
	slices.SortFunc(mps, func(a, b string) int { return len(b) - len(a) })
	for _, m := range mps {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// TestJobsHaveTheirOwnTmp: what a job leaves in /tmp or /dev/shm (with a
// umask that lets everyone read) another team's job on the node does not
// see, and the node's /tmp keeps none of it.
func TestJobsHaveTheirOwnTmp(t *testing.T) {
	needRoot(t)
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	mark := "allot-private-tmp-" + strconv.Itoa(os.Getpid())
	ta.run(t, shLease(195, []int{0}, `umask 022; echo weights > /tmp/`+mark+` && echo shm > /dev/shm/`+mark+` && ls /tmp/`+mark+` /dev/shm/`+mark))
	if e := p.waitExit(ref(195), 5*time.Second); e.ExitCode != 0 {
		t.Fatalf("writer: %+v %s", e, logOf(p, ref(195)))
	}
	l := shLease(196, []int{1}, `cat /tmp/`+mark+` /dev/shm/`+mark+`; echo end`)
	l.User = otherUser
	ta.run(t, l)
	p.waitExit(ref(196), 5*time.Second)
	if out := logOf(p, ref(196)); strings.Contains(out, "weights") || strings.Contains(out, "shm\n") {
		t.Errorf("another team's job read the first one's /tmp:\n%s", out)
	}
	for _, f := range []string{"/tmp/" + mark, "/dev/shm/" + mark} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s leaked onto the node", f)
			_ = os.Remove(f)
		}
	}
}

// TestJobsSeeOnlyTheirOwnProcesses: another team's job cannot list or read
// a job's processes (command line, environment) in /proc, nor the agent's
// or the shims'.
func TestJobsSeeOnlyTheirOwnProcesses(t *testing.T) {
	needRoot(t)
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	s := ta.run(t, shLease(197, []int{0}, `exec sleep 300 --secret-flag-197`))
	l := shLease(198, []int{1}, `ls /proc | grep -c '^[0-9]'; cat /proc/`+strconv.Itoa(s.PID)+`/cmdline; cat /proc/`+strconv.Itoa(os.Getpid())+`/cmdline; grep -l secret-flag-197 /proc/[0-9]*/cmdline; echo end`)
	l.User = otherUser
	ta.run(t, l)
	p.waitExit(ref(198), 5*time.Second)
	out := logOf(p, ref(198))
	if strings.Contains(out, "secret-flag-197") || strings.Contains(out, ".test") {
		t.Errorf("another team's job read processes that are not its own:\n%s", out)
	}
	// It sees its own few processes only (sh, ls, grep, maybe cat).
	if n, _ := strconv.Atoi(strings.SplitN(out, "\n", 2)[0]); n == 0 || n > 6 {
		t.Errorf("the job sees %d processes in /proc:\n%s", n, out)
	}
	p.push(agentproto.Orders{Stop: []agentproto.Stop{{JobID: 197, Segment: 1, Grace: time.Second, Reason: "cancelled"}}})
	p.waitExit(ref(197), 5*time.Second)
}

// escapeesScript starts a setsid'ed process and a double-forked one that
// closes its output, each writing its PID to dir/a and dir/b, then exits 0
// once both run: both must die with the job.
func escapeesScript(dir string) string {
	return `setsid sh -c 'echo $$ > ` + dir + `/a; exec sleep 300' & (sh -c 'echo $$ > ` + dir + `/b; exec sleep 300' </dev/null >/dev/null 2>&1 &) ; ` +
		`while [ ! -s ` + dir + `/a ] || [ ! -s ` + dir + `/b ]; do sleep 0.05; done; exit 0`
}

// checkEscapeesDead fails unless both escapees of escapeesScript ran and
// are gone.
func checkEscapeesDead(t *testing.T, dir string) {
	t.Helper()
	for _, f := range []string{"a", "b"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatalf("escapee %s never ran: %v", f, err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if _, ok := procStartTime(pid); ok {
			t.Errorf("escapee %s (pid %d) outlived its job", f, pid)
		}
	}
}
