package agent

import (
	"bufio"
	"net/http/httptest"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/allotlabs/allot/internal/agentproto"
)

func TestRegisterReportsInventory(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	startAgent(t, p)
	p.mu.Lock()
	inv := p.regs[0]
	p.mu.Unlock()
	if inv.Hostname != "node-a" || inv.GPUBackend != "fake" || inv.Protocol != agentproto.Version || inv.Domain != "nvl-a" || inv.AgentVersion == "" {
		t.Errorf("inventory header = %+v", inv)
	}
	if len(inv.GPUs) != 4 {
		t.Fatalf("got %d GPUs, want 4", len(inv.GPUs))
	}
	uuid := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for i, g := range inv.GPUs {
		if g.Index != i || g.Model != "A100-80GB" || g.MemoryMiB != 81920 || !uuid.MatchString(g.UUID) || seen[g.UUID] {
			t.Errorf("GPU %d = %+v", i, g)
		}
		seen[g.UUID] = true
		if len(g.NVLinkPeers) != 3 {
			t.Errorf("GPU %d NVLink peers = %v", i, g.NVLinkPeers)
		}
	}
	if len(inv.Running) != 0 {
		t.Errorf("running = %v, want none", inv.Running)
	}
}

func TestHeartbeatShowsLoadOnBusyGPUsOnly(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	s := ta.run(t, shLease(11, []int{1, 2}, "echo up; exec sleep 30"))
	// A heartbeat sampled while the shim was still placing the job in its
	// cgroup lists the job with no processes yet (CI saw RSS 0 once), so
	// wait for the job's own line, then for a heartbeat that counts its
	// memory (they come every 50 ms here).
	p.waitLogLine(ref(11), "up", 5*time.Second)
	var hb agentproto.Heartbeat
	p.waitFor("heartbeat with the job's memory", 5*time.Second, func() bool {
		for _, h := range p.hbs {
			if len(h.Jobs) == 1 && h.Jobs[0].JobID == 11 && h.Jobs[0].RSSBytes > 0 {
				hb = h
				return true
			}
		}
		return false
	})
	if len(hb.GPUs) != 4 {
		t.Fatalf("heartbeat has %d GPUs", len(hb.GPUs))
	}
	for _, g := range hb.GPUs {
		busy := g.Index == 1 || g.Index == 2
		if busy && (g.UtilPct < 85 || g.UtilPct > 99 || g.MemUsedMiB < g.MemTotalMiB*8/10 || g.TempC < 65 || g.PowerW < 300) {
			t.Errorf("busy GPU %d shows no load: %+v", g.Index, g)
		}
		if !busy && (g.UtilPct > 3 || g.MemUsedMiB > g.MemTotalMiB/50 || g.TempC > 40 || g.PowerW > 70) {
			t.Errorf("idle GPU %d shows load: %+v", g.Index, g)
		}
		if g.MemTotalMiB != 81920 || g.UUID == "" {
			t.Errorf("GPU %d = %+v", g.Index, g)
		}
	}
	js := hb.Jobs[0]
	if js.PID != s.PID || js.Segment != 1 || js.RSSBytes <= 0 {
		t.Errorf("job stats = %+v (pid %d)", js, s.PID)
	}
	p.push(agentproto.Orders{Stop: []agentproto.Stop{{JobID: 11, Segment: 1, Grace: time.Second, Reason: "cancelled"}}})
	p.waitExit(ref(11), 5*time.Second)
}

func TestLeaseRunsWithExactEnvironment(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	dir := jobDir(t)
	l := shLease(42, []int{2, 3}, `env > "$OUT/env"; echo done; exit 3`)
	l.Env = map[string]string{
		"CUDA_VISIBLE_DEVICES": "2,3",
		"MASTER_ADDR":          "node-a",
		"MASTER_PORT":          "29500",
		"WORLD_SIZE":           "4",
		"RANK":                 "0",
		"NODE_RANK":            "0",
		"LOCAL_WORLD_SIZE":     "2",
		"ALLOT_JOB_ID":         "42",
		"ALLOT_TEAM":           "vision",
		"ALLOT_CHECKPOINT_DIR": filepath.Join(dir, "ckpt"),
		"HOME":                 "/home/alice", // the lease wins over BaseEnv
		"OUT":                  dir,
	}
	l.CheckpointDir = filepath.Join(dir, "ckpt")
	l.WorkDir = dir
	s := ta.run(t, l)
	if s.PID <= 0 {
		t.Errorf("started pid = %d", s.PID)
	}
	e := p.waitExit(ref(42), 5*time.Second)
	if e.ExitCode != 3 || e.Signal != "" || e.Reason != "" {
		t.Errorf("exit = %+v, want code 3", e)
	}

	got := readEnv(t, filepath.Join(dir, "env"))
	for _, k := range []string{"PWD", "SHLVL", "_", "OLDPWD"} { // added by the shell
		delete(got, k)
	}
	// The job's account names itself; it has a private TMPDIR (gone with
	// the job) and the device files of its GPUs.
	// Its own /tmp (TestJobsHaveTheirOwnTmp checks it is private).
	if want := "/tmp"; isRoot() && got["TMPDIR"] != want {
		t.Errorf("TMPDIR = %q, want %s", got["TMPDIR"], want)
	}
	if g := got["ALLOT_GPU_DEVICES"]; !strings.Contains(g, "/nvidia2,") || !strings.HasSuffix(g, "/nvidia3") {
		t.Errorf("ALLOT_GPU_DEVICES = %q", g)
	}
	delete(got, "TMPDIR")
	delete(got, "ALLOT_GPU_DEVICES")
	want := map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "USER": testUser, "LOGNAME": testUser}
	if !isRoot() {
		want["USER"], want["LOGNAME"] = got["USER"], got["USER"]
	}
	for k, v := range l.Env {
		want[k] = v
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("job environment (-want +got):\n%s", d)
	}
	// The checkpoint directory belongs to the job's account, mode 0700.
	fi, err := os.Stat(l.CheckpointDir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("checkpoint dir: %v %v", fi, err)
	} else if isRoot() {
		u, _ := user.Lookup(testUser)
		if st := fi.Sys().(*syscall.Stat_t); strconv.Itoa(int(st.Uid)) != u.Uid {
			t.Errorf("checkpoint dir owned by uid %d, want %s (%s)", st.Uid, u.Uid, testUser)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.Contains(p.logs[ref(42)], "done") {
		t.Errorf("log = %q", p.logs[ref(42)])
	}
}

func readEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		env[k] = v
	}
	return env
}

func TestLogLinesArriveAndTheFirstFast(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	// Batches go every 3 s: the first line must not wait for one.
	ta := startAgent(t, p, func(c *Config) { c.LogFlush = 3 * time.Second })
	l := shLease(5, []int{0}, `echo first; sleep 1; echo second; echo third >&2; for i in $(seq 1 300); do echo "line $i"; done`)
	ref := ref(5)
	p.push(agentproto.Orders{Offer: []agentproto.Lease{l}})
	p.waitFor("take", 5*time.Second, func() bool { return len(p.takes) == 1 })
	startAt := time.Now() // a stopwatch
	p.push(agentproto.Orders{Start: []agentproto.LeaseRef{ref}})
	p.waitLogLine(ref, "first", 5*time.Second)
	p.mu.Lock()
	lat := p.firstLog[ref].Sub(startAt)
	p.mu.Unlock()
	// The first line must not wait for the batch interval (how fast it
	// is, is measured by BenchmarkJobStartHost and BenchmarkSubmitToFirstOutput).
	t.Logf("start order → first log line at the server: %s", lat)
	if lat >= 2*time.Second {
		t.Errorf("start order → first log line at the server took %s: it waited for a batch (3 s)", lat)
	}
	if tail := ta.Tail(5, 1); len(tail) == 0 || tail[0] != "first" {
		t.Errorf("local tail = %q", tail)
	}
	p.waitExit(ref, 10*time.Second)
	p.mu.Lock()
	defer p.mu.Unlock()
	lines := p.logs[ref]
	want := []string{"first", "second", "third"}
	for i := 1; i <= 300; i++ {
		want = append(want, "line "+strconv.Itoa(i))
	}
	if d := cmp.Diff(want, lines); d != "" {
		t.Errorf("log lines (-want +got):\n%s", d)
	}
}

func TestStopWithGraceLetsTheJobCheckpoint(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	dir := jobDir(t)
	marker := filepath.Join(dir, "checkpointed")
	script := `trap 'echo saved > "` + marker + `"; exit 0' TERM; echo ready; while :; do sleep 0.05; done`
	ta.run(t, shLease(7, []int{0, 1}, script))
	p.waitLogLine(ref(7), "ready", 5*time.Second)
	at := time.Now() // a stopwatch: how long the stop takes
	p.push(agentproto.Orders{Stop: []agentproto.Stop{{JobID: 7, Segment: 1, Grace: 5 * time.Second, Reason: "preempted"}}})
	e := p.waitExit(ref(7), 10*time.Second)
	if took := time.Since(at); took > 4*time.Second {
		t.Errorf("stop took %s: the job was not given SIGTERM first", took)
	}
	want := agentproto.JobExited{JobID: 7, Segment: 1, ExitCode: 0, Signal: "SIGTERM", Reason: "preempted"}
	e.Time = time.Time{}
	if d := cmp.Diff(want, e); d != "" {
		t.Errorf("exit (-want +got):\n%s", d)
	}
	if b, err := os.ReadFile(marker); err != nil || strings.TrimSpace(string(b)) != "saved" {
		t.Errorf("marker: %q %v", b, err)
	}
}

func TestStopKillsAJobThatIgnoresSIGTERM(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	s := ta.run(t, shLease(8, []int{3}, `trap '' TERM; echo ready; while :; do sleep 0.05; done`))
	p.waitLogLine(ref(8), "ready", 5*time.Second)
	at := time.Now() // a stopwatch: how long the stop takes
	p.push(agentproto.Orders{Stop: []agentproto.Stop{{JobID: 8, Segment: 1, Grace: 300 * time.Millisecond, Reason: "cancelled"}}})
	e := p.waitExit(ref(8), 10*time.Second)
	if took := time.Since(at); took < 300*time.Millisecond {
		t.Errorf("killed after %s, before the grace", took)
	}
	if e.ExitCode != -1 || e.Signal != "SIGKILL" || e.Reason != "cancelled" {
		t.Errorf("exit = %+v, want SIGKILL cancelled", e)
	}
	// SIGKILL is delivered at once but a process takes a moment to go.
	deadline := time.Now().Add(3 * time.Second)                       // a deadline (real time), not product time
	for liveGroupMembers(s.PID) != 0 && time.Now().Before(deadline) { // the same deadline
		time.Sleep(10 * time.Millisecond)
	}
	if n := liveGroupMembers(s.PID); n != 0 {
		t.Errorf("process group %d still has %d live processes", s.PID, n)
	}
}

func TestTimeLimitIsEnforced(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	l := shLease(9, []int{0}, `echo ready; exec sleep 30`)
	l.TimeLimit = 200 * time.Millisecond
	ta.run(t, l)
	e := p.waitExit(ref(9), 10*time.Second)
	if e.ExitCode != -1 || e.Signal != "SIGTERM" || e.Reason != ReasonTimeLimit {
		t.Errorf("exit = %+v, want SIGTERM time_limit", e)
	}
}

func TestExecFailureReports127(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	startAgent(t, p)
	l := shLease(10, []int{0}, "")
	l.Command = []string{"/nonexistent/train.py", "--epochs", "3"}
	p.push(agentproto.Orders{Offer: []agentproto.Lease{l}})
	p.waitFor("take", 5*time.Second, func() bool { return len(p.takes) == 1 })
	p.push(agentproto.Orders{Start: []agentproto.LeaseRef{ref(10)}})
	e := p.waitExit(ref(10), 5*time.Second)
	if e.ExitCode != 127 || e.Reason != ReasonStartFailed || !strings.Contains(e.Message, "/nonexistent/train.py") {
		t.Errorf("exit = %+v", e)
	}
	// An empty command fails the same way instead of panicking.
	empty := shLease(13, []int{1}, "")
	empty.Command = nil
	p.push(agentproto.Orders{Offer: []agentproto.Lease{empty}})
	p.waitFor("take of the empty lease", 5*time.Second, func() bool { return slices.Contains(p.takes, ref(13)) })
	p.push(agentproto.Orders{Start: []agentproto.LeaseRef{ref(13)}})
	if e := p.waitExit(ref(13), 5*time.Second); e.ExitCode != 127 || e.Reason != ReasonStartFailed || !strings.Contains(e.Message, "empty command") {
		t.Errorf("exit = %+v", e)
	}
	p.mu.Lock()
	started := len(p.started)
	p.mu.Unlock()
	if started != 0 {
		t.Errorf("started reported for a job that never ran")
	}
	// The GPU is free again: a new lease on it is taken.
	p.push(agentproto.Orders{Offer: []agentproto.Lease{shLease(12, []int{0}, "true")}})
	p.waitFor("take of the next lease", 5*time.Second, func() bool { return slices.Contains(p.takes, ref(12)) })
}

func TestOfferForMissingOrBusyGPUsIsNotTaken(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	ta.run(t, shLease(20, []int{0, 1}, "exec sleep 30"))
	p.push(agentproto.Orders{Offer: []agentproto.Lease{
		shLease(21, []int{7}, "true"),    // no GPU 7 on a 4-GPU node
		shLease(22, []int{1, 2}, "true"), // GPU 1 runs job 20
		shLease(23, []int{2, 3}, "true"), // free
	}})
	p.waitFor("take of job 23", 5*time.Second, func() bool { return slices.Contains(p.takes, ref(23)) })
	// Jobs 24 and 25 want GPUs held by the taken (not yet started) job 23.
	p.push(agentproto.Orders{Offer: []agentproto.Lease{shLease(24, []int{3}, "true"), shLease(25, []int{2}, "true")}})
	p.push(agentproto.Orders{Stop: []agentproto.Stop{{JobID: 20, Segment: 1, Grace: time.Second, Reason: "cancelled"}}})
	p.waitExit(ref(20), 5*time.Second)
	p.mu.Lock()
	got := slices.Clone(p.takes)
	p.mu.Unlock()
	want := []agentproto.LeaseRef{ref(20), ref(23)}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("takes (-want +got):\n%s", d)
	}
}

func TestStopBeforeStartReleasesTheLease(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	startAgent(t, p)
	p.push(agentproto.Orders{Offer: []agentproto.Lease{shLease(30, []int{0}, "true")}})
	p.waitFor("take", 5*time.Second, func() bool { return len(p.takes) == 1 })
	p.push(agentproto.Orders{Stop: []agentproto.Stop{{JobID: 30, Segment: 1, Reason: "cancelled"}}})
	e := p.waitExit(ref(30), 5*time.Second)
	if e.ExitCode != -1 || e.Reason != "cancelled" {
		t.Errorf("exit = %+v", e)
	}
	p.push(agentproto.Orders{Offer: []agentproto.Lease{shLease(31, []int{0}, "true")}})
	p.waitFor("take of a lease on the released GPU", 5*time.Second, func() bool { return slices.Contains(p.takes, ref(31)) })
}

func TestServerRestartKeepsJobsAndDeliversExits(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	dir := jobDir(t)
	wait := func(name string) string {
		return `echo ready; while [ ! -f "` + filepath.Join(dir, name) + `" ]; do sleep 0.02; done; echo bye`
	}
	ta.run(t, shLease(40, []int{0}, wait("a")+"; exit 4"))
	b := ta.run(t, shLease(41, []int{1}, wait("b")+"; exit 5"))
	addr := p.Addr()

	p.close()
	// Job 40 ends while the server is down.
	touch(t, filepath.Join(dir, "a"))
	time.Sleep(300 * time.Millisecond) // let the agent notice and retry a few times
	if err := syscall.Kill(b.PID, 0); err != nil {
		t.Fatalf("job 41 died with the server: %v", err)
	}

	p2 := newPeerAt(t, addr)
	ta.peer = p2
	p2.waitFor("re-registration with job 41 running", 10*time.Second, func() bool {
		for _, inv := range p2.regs {
			if len(inv.Running) == 1 && inv.Running[0].JobID == 41 {
				return true
			}
		}
		return false
	})
	p2.mu.Lock()
	inv := p2.regs[len(p2.regs)-1]
	p2.mu.Unlock()
	if r := inv.Running[0]; r.PID != b.PID || r.Segment != 1 || r.Started.IsZero() {
		t.Errorf("running = %+v, want pid %d", r, b.PID)
	}
	e := p2.waitExit(ref(40), 10*time.Second)
	if e.ExitCode != 4 || e.Reason != "" {
		t.Errorf("exit of job 40 = %+v", e)
	}
	touch(t, filepath.Join(dir, "b"))
	e = p2.waitExit(ref(41), 10*time.Second)
	if e.ExitCode != 5 {
		t.Errorf("exit of job 41 = %+v", e)
	}
	p2.waitLogLine(ref(41), "bye", 5*time.Second)
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestUnknownJobsAreStoppedAfterReRegistration(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	ta.run(t, shLease(50, []int{2}, "echo ready; exec sleep 30"))
	p.mu.Lock()
	p.unknown = []int64{50}
	p.failHB = 1 // 401: the server lost the node
	p.mu.Unlock()
	e := p.waitExit(ref(50), 10*time.Second)
	if e.Reason != ReasonOrphaned || e.Signal != "SIGTERM" {
		t.Errorf("exit = %+v, want SIGTERM orphaned", e)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.regs); n < 2 || len(p.regs[1].Running) != 1 {
		t.Errorf("registrations = %+v", p.regs)
	}
}

func TestShutdownStopsJobsAndReportsThem(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	ta.run(t, shLease(60, []int{0}, "echo ready; exec sleep 30"))
	ta.stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.exitOf(ref(60))
	if !ok || e.Reason != ReasonAgentShutdown || e.Signal != "SIGTERM" {
		t.Errorf("exit = %+v (reported %v)", e, ok)
	}
}

func TestMetricsUseDCGMNamesAndLabels(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	ta.run(t, shLease(42, []int{0}, "echo ready; exec sleep 30"))
	ta.fake.InjectXID(2, 79)
	ta.fake.SetECCDoubleBit(3, 2)
	ta.fake.SetThrottle(1, 0x40)

	rec := httptest.NewRecorder()
	ta.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, name := range []string{"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
		"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
		"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"} {
		if n := strings.Count(body, "\n"+name+"{"); n != 4 {
			t.Errorf("%s: %d series, want 4", name, n)
		}
	}
	inv, _ := ta.fake.Inventory()
	lbl := func(gpu int, job, team string) string {
		return `{Hostname="node-a",UUID="` + inv.GPUs[gpu].UUID + `",allot_job="` + job + `",allot_team="` + team + `",device="nvidia` +
			strconv.Itoa(gpu) + `",gpu="` + strconv.Itoa(gpu) + `",modelName="A100-80GB"}`
	}
	busyUtil := regexp.MustCompile(regexp.QuoteMeta("DCGM_FI_DEV_GPU_UTIL"+lbl(0, "42", "vision")) + ` (\d+(\.\d+)?)\n`)
	if m := busyUtil.FindStringSubmatch(body); m == nil || parseFloat(m[1]) < 85 {
		t.Errorf("busy GPU 0 utilisation series missing or low: %v\n%s", m, body)
	}
	for _, want := range []string{
		"DCGM_FI_DEV_XID_ERRORS" + lbl(2, "", "") + " 79\n",
		"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" + lbl(3, "", "") + " 2\n",
		"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" + lbl(1, "", "") + " 64\n",
		"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// No label a Prometheus target owns: job would become exported_job.
	if regexp.MustCompile(`[{,](job|team|instance)="`).MatchString(body) {
		t.Errorf("a series has a job, team or instance label:\n%s", body)
	}
}

func TestFakeIsDeterministic(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now := func() time.Time { return at }
	a := NewFake(FakeOptions{Hostname: "gpu17", Now: now})
	b := NewFake(FakeOptions{Hostname: "gpu17", Now: now})
	c := NewFake(FakeOptions{Hostname: "gpu18", Now: now})
	ia, _ := a.Inventory()
	ib, _ := b.Inventory()
	ic, _ := c.Inventory()
	if len(ia.GPUs) != 8 {
		t.Fatalf("default fake has %d GPUs, want 8", len(ia.GPUs))
	}
	if d := cmp.Diff(ia, ib); d != "" {
		t.Errorf("inventories differ for the same host:\n%s", d)
	}
	if ia.GPUs[0].UUID == ic.GPUs[0].UUID {
		t.Errorf("two hosts share UUID %s", ia.GPUs[0].UUID)
	}
	busy := map[int]bool{3: true}
	ma, _ := a.Metrics(busy)
	mb, _ := b.Metrics(busy)
	if d := cmp.Diff(ma, mb); d != "" {
		t.Errorf("metrics differ at the same time:\n%s", d)
	}
	for i := range 600 { // ten minutes, second by second
		at = at.Add(time.Second)
		ms, _ := a.Metrics(busy)
		for _, m := range ms {
			if m.Index == 3 && (m.UtilPct < 85 || m.UtilPct > 99 || m.TempC < 65 || m.TempC > 75 || m.PowerW < 300 || m.PowerW > 400) {
				t.Fatalf("t+%ds busy GPU out of range: %+v", i, m)
			}
			if m.Index != 3 && (m.UtilPct < 0 || m.UtilPct > 3 || m.PowerW > 65) {
				t.Fatalf("t+%ds idle GPU out of range: %+v", i, m)
			}
		}
	}
}

func TestNVMLWithoutDriverSaysSo(t *testing.T) {
	t.Parallel()
	b, err := NewNVML()
	if err == nil {
		b.Close()
		t.Skip("an NVIDIA driver is present")
	}
	msg := err.Error()
	if !strings.Contains(msg, "--gpu nvml:") || !strings.Contains(msg, "--gpu fake") {
		t.Errorf("error = %q", msg)
	}
	if !strings.Contains(msg, "no NVIDIA driver found (libnvidia-ml.so could not be loaded: ") && !strings.Contains(msg, "without cgo") {
		t.Errorf("error = %q", msg)
	}
}

func parseFloat(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64)
	return f
}

// TestBusyServerTakeKeepsTheLease: a take refused as busy (429: the
// server's admission control) keeps the lease's GPUs held, so another
// lease for them is not taken, and the offer sent again is taken and runs.
func TestBusyServerTakeKeepsTheLease(t *testing.T) {
	t.Parallel()
	p := newPeer(t)
	ta := startAgent(t, p)
	p.mu.Lock()
	p.busyTakes = 1
	p.mu.Unlock()
	l := shLease(61, []int{1}, `echo ran`)
	p.push(agentproto.Orders{Offer: []agentproto.Lease{l}})
	p.waitFor("the refused take", 5*time.Second, func() bool { return p.refused == 1 })
	// Another lease for GPU 1 while the first holds it: not taken.
	p.push(agentproto.Orders{Offer: []agentproto.Lease{shLease(62, []int{1}, `echo ran`)}})
	// What must not happen (the lease let go, the other taken) would
	// within milliseconds; watch for a second.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) { // deadline of an observation window
		ta.mu.Lock()
		_, held := ta.jobs[ref(61)]
		_, other := ta.jobs[ref(62)]
		ta.mu.Unlock()
		p.mu.Lock()
		took62 := slices.Contains(p.takes, ref(62))
		p.mu.Unlock()
		if !held || other || took62 {
			t.Fatalf("after a 429 on its take: lease 61 held %v, lease 62 (same GPU) held %v, taken %v; want 61 only", held, other, took62)
		}
	}
	// The server sends the offer again: taken, started, run.
	ta.run(t, l)
	if e := p.waitExit(ref(61), 5*time.Second); e.ExitCode != 0 {
		t.Errorf("exit = %+v", e)
	}
}
