package slurmtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const testUser = "allot-st1"

func need(t *testing.T) {
	t.Helper()
	if ok, why := Available(); !ok {
		t.Skip(why)
	}
}

// rest calls slurmrestd with a token and a user name header.
func rest(t *testing.T, c *Cluster, method, path, userName, token string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.RestURL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-SLURM-USER-NAME", userName)
	req.Header.Set("X-SLURM-USER-TOKEN", token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		m = map[string]any{"_raw": string(raw)}
	}
	return resp.StatusCode, m
}

func dbExists(t *testing.T, name string) bool {
	t.Helper()
	port, err := dbPort()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(mysqlClient(), "-h", dbHost, "-P", strconv.Itoa(port), "-u", dbUser, "-N", "-e",
		"SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name='"+name+"'").CombinedOutput()
	if err != nil {
		t.Fatalf("query databases: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out)) != "0"
}

// assertGone checks that nothing of a stopped cluster is left: no process
// mentioning its dir, no database, no dir.
func assertGone(t *testing.T, dir, db string) {
	t.Helper()
	if ps := processesUsing(dir); len(ps) > 0 {
		t.Errorf("processes left using %s: %v", dir, ps)
	}
	if db != "" && dbExists(t, db) {
		t.Errorf("database %s left behind", db)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("dir %s left behind (%v)", dir, err)
	}
}

// TestSmoke: a 2×4 cluster; a non-root user's sbatch --wrap with 2 GPUs runs
// as that user and completes; REST ping with a token; sacct has the job with
// gres/gpu=2; a job that leaves a double-forked orphan behind; stop leaves
// nothing.
func TestSmoke(t *testing.T) {
	need(t)
	EnsureUser(t, testUser)
	c := Start(t, Options{Accounts: []string{"nlp", "vision"}, Users: []string{testUser}})
	t.Logf("startup %v", c.StartupTime)

	id := c.Sbatch(t, testUser, "-A", "nlp", "--gres=gpu:2", "-o", "smoke-%j.out", "--wrap", "id -un; echo gpus=$CUDA_VISIBLE_DEVICES")
	if st := c.WaitJob(t, id); st != "COMPLETED" {
		t.Fatalf("job %d: %s", id, st)
	}
	out, err := os.ReadFile(filepath.Join(c.JobsDir, fmt.Sprintf("smoke-%d.out", id)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), testUser+"\n") {
		t.Errorf("job output %q: want it to have run as %s", out, testUser)
	}

	// REST ping with a token.
	code, m := rest(t, c, "GET", "/slurm/v0.0.38/ping", "root", c.Token(t, "root", time.Minute), nil)
	if code != 200 {
		t.Fatalf("ping: %d %v", code, m)
	}
	// A token minted from the key works the same.
	tok, err := c.MintToken("root", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if code, m := rest(t, c, "GET", "/slurm/v0.0.38/ping", "root", tok, nil); code != 200 {
		t.Fatalf("ping with minted token: %d %v", code, m)
	}

	// Accounting: the job with its user, account and 2 GPUs (slurmctld sends
	// the record to slurmdbd asynchronously: poll briefly).
	var acct string
	deadline := time.Now().Add(10 * time.Second) // stopwatch
	// a deadline, not product time
	for time.Now().Before(deadline) {
		acct = c.Run(t, "sacct", "-n", "-X", "-P", "-j", strconv.FormatInt(id, 10), "-o", "JobID,User,Account,State,AllocTRES")
		if strings.Contains(acct, "gres/gpu=2") && strings.Contains(acct, "COMPLETED") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if want := fmt.Sprintf("%d|%s|nlp|COMPLETED|", id, testUser); !strings.HasPrefix(acct, want) || !strings.Contains(acct, "gres/gpu=2") {
		t.Errorf("sacct: %q, want %q... with gres/gpu=2", acct, want)
	}

	// A job that leaves a daemonized grandchild behind (setsid + background):
	// the reaper must catch it at stop.
	orphan := c.Sbatch(t, testUser, "-A", "nlp", "-o", "/dev/null", "--wrap",
		"setsid sh -c 'sleep 300 & sleep 300' </dev/null >/dev/null 2>&1 & sleep 300")
	c.WaitJob(t, orphan, "RUNNING")

	dir, db := c.Dir, c.DBName
	began := time.Now() // stopwatch
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop %v", time.Since(began))
	assertGone(t, dir, db)
}

// TestTwoClustersAtOnce: two clusters started concurrently get their own
// names, ports, dirs and databases, and each runs a job.
func TestTwoClustersAtOnce(t *testing.T) {
	need(t)
	var wg sync.WaitGroup
	cs := make([]*Cluster, 2)
	errs := make([]error, 2)
	for i := range cs {
		wg.Go(func() { cs[i], errs[i] = StartErr(t, Options{Nodes: 1, GPUsPerNode: 2, NoRest: i == 1}) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	a, b := cs[0], cs[1]
	if a.Name == b.Name || a.Dir == b.Dir || a.DBName == b.DBName || a.ctldPort == b.ctldPort {
		t.Fatalf("clusters share something: %+v / %+v", a, b)
	}
	ids := []int64{
		a.Sbatch(t, "", "--gres=gpu:2", "-o", "/dev/null", "--wrap", "true"),
		b.Sbatch(t, "", "--gres=gpu:2", "-o", "/dev/null", "--wrap", "true"),
	}
	for i, c := range cs {
		if st := c.WaitJob(t, ids[i]); st != "COMPLETED" {
			t.Errorf("%s job %d: %s", c.Name, ids[i], st)
		}
		if out := c.Run(t, "scontrol", "show", "config"); !strings.Contains(out, "ClusterName             = "+c.Name) {
			t.Errorf("%s: scontrol talks to another cluster", c.Name)
		}
	}
	for _, c := range cs {
		dir, db := c.Dir, c.DBName
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
		assertGone(t, dir, db)
	}
}

// TestRestartDaemons: slurmctld and slurmrestd stop and start again; a
// running job survives the slurmctld restart.
func TestRestartDaemons(t *testing.T) {
	need(t)
	c := Start(t, Options{Nodes: 1})
	id := c.Sbatch(t, "", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 60")
	c.WaitJob(t, id, "RUNNING")

	c.StopCtld(t)
	// (no squeue here: it retries for MessageTimeout before failing)
	if conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", c.ctldPort)); err == nil {
		conn.Close()
		t.Error("slurmctld port open after StopCtld")
	}
	c.StartCtld(t)
	if st := c.WaitJob(t, id, "RUNNING"); st != "RUNNING" {
		t.Errorf("job after slurmctld restart: %s", st)
	}

	c.StopRest(t)
	if _, err := http.Get(c.RestURL + "/slurm/v0.0.38/ping"); err == nil {
		t.Error("slurmrestd answered after StopRest")
	}
	c.StartRest(t)
	if code, m := rest(t, c, "GET", "/slurm/v0.0.38/ping", "root", c.Token(t, "root", time.Minute), nil); code != 200 {
		t.Errorf("ping after StartRest: %d %v", code, m)
	}
	c.Run(t, "scancel", strconv.FormatInt(id, 10))
	c.WaitJob(t, id, "CANCELLED")
}

const helperEnv = "ALLOT_SLURMTEST_HELPER_OUT"

// TestKilledTestBinaryLeavesNoProcess: a test binary killed with SIGKILL
// (what `go test -timeout` does) while its cluster runs a job: every process
// of the cluster goes away on its own (the reapers see their stdin close).
func TestKilledTestBinaryLeavesNoProcess(t *testing.T) {
	need(t)
	out := filepath.Join(t.TempDir(), "cluster")
	// The helper test binary runs under a reaper of its own, so the cluster
	// reapers it orphans are reaped (PID 1 here does not reap).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "--", self, "-test.run=^TestHelperClusterThenHang$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+out, reaperEnv+"=1")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close() // the outer reaper kills what is left and exits
		cmd.Wait()
	}()
	var dir, db string
	helper := 0                                  // the test binary: the outer reaper's only child
	deadline := time.Now().Add(25 * time.Second) // stopwatch
	for {
		if b, err := os.ReadFile(out); err == nil {
			f := strings.Fields(string(b))
			if len(f) == 2 {
				dir, db = f[0], f[1]
				break
			}
		}
		// a deadline, not product time
		if time.Now().After(deadline) {
			t.Fatalf("helper did not start a cluster:\n%s", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// What the helper's cluster left will be cleaned here, whatever happens.
	t.Cleanup(func() {
		sweep(dir)
		dropDB(db)
		os.RemoveAll(dir)
		releasePortsOf(helper)
	})
	if len(processesUsing(dir)) == 0 {
		t.Fatal("no cluster processes found while the helper runs")
	}
	for _, pid := range descendants(cmd.Process.Pid) {
		if ppid, _, ok := procStat(pid); ok && ppid == cmd.Process.Pid {
			helper = pid
		}
	}
	if helper == 0 {
		t.Fatal("helper test binary not found")
	}
	if err := syscall.Kill(helper, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	began := time.Now() // stopwatch
	for {
		ps := processesUsing(dir)
		if len(ps) == 0 {
			break
		}
		if time.Since(began) > 15*time.Second {
			t.Fatalf("15 s after the test binary died, still running: %v", ps)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("all cluster processes gone %v after SIGKILL of the test binary", time.Since(began))
}

// TestHelperClusterThenHang is the child of TestKilledTestBinaryLeavesNoProcess.
func TestHelperClusterThenHang(t *testing.T) {
	out := os.Getenv(helperEnv)
	if out == "" {
		t.Skip("helper process only")
	}
	c := Start(t, Options{Nodes: 1})
	id := c.Sbatch(t, "", "-o", "/dev/null", "--wrap", "setsid sh -c 'sleep 300 & sleep 300' </dev/null >/dev/null 2>&1 & sleep 300")
	c.WaitJob(t, id, "RUNNING")
	if err := os.WriteFile(out+".tmp", []byte(c.Dir+" "+c.DBName), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Rename(out+".tmp", out)
	time.Sleep(time.Minute) // killed long before
}

// TestConfExtraAndLua: ConfExtra adds settings and replaces the harness's
// own (KillWait), JobSubmitLua runs on sbatch, Reconfigure changes both.
func TestConfExtraAndLua(t *testing.T) {
	need(t)
	lua := func(tag string) string {
		return `function slurm_job_submit(job_desc, part_list, submit_uid)
  job_desc.comment = "` + tag + `"
  slurm.log_user("tagged ` + tag + `")
  return slurm.SUCCESS
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
`
	}
	c := Start(t, Options{Nodes: 1, NoRest: true,
		ConfExtra:    "PreemptType=preempt/qos\nPreemptMode=REQUEUE\nPriorityWeightQOS=10000\nKillWait=3\nPartitionName=p1 Nodes={{nodes}} Default=YES State=UP",
		JobSubmitLua: lua("one")})
	cfg := c.Run(t, "scontrol", "show", "config")
	for _, want := range []string{`PreemptType\s*=\s*preempt/qos`, `KillWait\s*=\s*3 sec`, `PriorityWeightQOS\s*=\s*10000`, `JobSubmitPlugins\s*=\s*lua`} {
		if !regexp.MustCompile(want).MatchString(cfg) {
			t.Errorf("scontrol show config lacks %s", want)
		}
	}
	if p := strings.TrimSpace(c.Run(t, "sinfo", "-h", "-o", "%P")); p != "p1*" {
		t.Errorf("partitions %q, want only p1 (default)", p)
	}
	out := c.Run(t, "sbatch", "-o", "/dev/null", "--wrap", "true")
	if !strings.Contains(out, "tagged one") {
		t.Errorf("sbatch output %q lacks the Lua message", out)
	}
	c.Reconfigure(t, "KillWait=4\nPartitionName=p1 Nodes={{nodes}} Default=YES State=UP", lua("two"))
	id := c.Sbatch(t, "", "-o", "/dev/null", "--wrap", "true")
	if cm := strings.TrimSpace(c.Run(t, "squeue", "-h", "-t", "all", "-j", strconv.FormatInt(id, 10), "-o", "%k")); cm != "two" {
		t.Errorf("comment after Reconfigure: %q", cm)
	}
	if cfg := c.Run(t, "scontrol", "show", "config"); !regexp.MustCompile(`KillWait\s*=\s*4 sec`).MatchString(cfg) {
		t.Error("KillWait not 4 after Reconfigure")
	}
}

// releasePortsOf removes the port registrations of (dead) process pid.
func releasePortsOf(pid int) {
	ents, _ := os.ReadDir(portsDir)
	for _, e := range ents {
		f := filepath.Join(portsDir, e.Name())
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(pid) {
			os.Remove(f)
		}
	}
}

// TestTypedGPUs: Options.GPUType gives typed GRES (gpu:h100:4) that jobs can
// ask for by type and that accounting counts both ways.
func TestTypedGPUs(t *testing.T) {
	need(t)
	c := Start(t, Options{Nodes: 1, GPUType: "h100", NoRest: true})
	if g := strings.TrimSpace(c.Run(t, "sinfo", "-h", "-N", "-o", "%G")); g != "gpu:h100:4" {
		t.Errorf("node gres %q", g)
	}
	id := c.Sbatch(t, "", "--gres=gpu:h100:3", "-o", "/dev/null", "--wrap", "true")
	if st := c.WaitJob(t, id); st != "COMPLETED" {
		t.Fatalf("job: %s", st)
	}
	var acct string
	deadline := time.Now().Add(10 * time.Second) // stopwatch
	// a deadline, not product time
	for time.Now().Before(deadline) {
		acct = c.Run(t, "sacct", "-n", "-X", "-P", "-j", strconv.FormatInt(id, 10), "-o", "AllocTRES")
		if strings.Contains(acct, "gres/gpu:h100=3") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(acct, "gres/gpu=3") || !strings.Contains(acct, "gres/gpu:h100=3") {
		t.Errorf("AllocTRES %q, want gres/gpu=3 and gres/gpu:h100=3", acct)
	}
}
