package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agent"
	"github.com/allotlabs/allot/internal/agent/agenttest"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/web"
)

// agentArgsEnv makes the test binary run `allot agent` with these
// arguments (a JSON array): a real agent process to kill -9.
const agentArgsEnv = "ALLOT_TEST_AGENT_ARGS"

func init() {
	if v, ok := os.LookupEnv(agentArgsEnv); ok {
		var args []string
		if err := json.Unmarshal([]byte(v), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(agent.Main(args, os.Stdout, os.Stderr))
	}
}

// agentProc is a real `allot agent` process on a node of a live test.
type agentProc struct {
	cmd *exec.Cmd
	log string
}

func startAgentProcess(t *testing.T, l *live, node, tokenFile, stateDir string) *agentProc {
	t.Helper()
	args := []string{"--server", l.url, "--token-file", tokenFile, "--gpu", "fake", "--fake-gpus", "8", "--hostname", node,
		"--heartbeat", testHeartbeat.String(), "--metrics-addr", ""}
	// The same state directory and cgroup parent for the restarted agent.
	args = append(args, localAgentFlags(t, node)...)
	args = append(args, "--state-dir", stateDir)
	b, _ := json.Marshal(args)
	logPath := filepath.Join(t.TempDir(), "agent.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	// The token also in the environment, as an EnvironmentFile would put
	// it: the job must not find it there either.
	tok, _ := os.ReadFile(tokenFile)
	cmd.Env = append(os.Environ(), agentArgsEnv+"="+string(b), "ALLOT_NODE_TOKEN="+strings.TrimSpace(string(tok)))
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := &agentProc{cmd: cmd, log: logPath}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	})
	return p
}

func (p *agentProc) kill9(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

// TestAgentKill9JobSurvivesBilledOnce: the agent of a node running a job
// is killed with -9 and started again: the job goes on (its process never
// stops), finishes, and is billed exactly once, for its whole run. The
// job cannot read the node token from its agent, though the agent got it
// from its environment.
func TestAgentKill9JobSurvivesBilledOnce(t *testing.T) {
	l := startLive(t, func(m *Main) {})
	ctx := context.Background()
	// Nodes count as lost only after 30 s of silence: the restart is quicker.
	p, err := l.m.Store.CurrentPolicy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.HeartbeatMissedAfter, p.CreatedBy = 30*time.Second, "test"
	if err := l.m.Store.InsertPolicy(ctx, &p); err != nil {
		t.Fatal(err)
	}
	const node = "gpu01"
	tok, err := l.m.Store.CreateNodeToken(ctx, node, "test")
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "node-token")
	if err := os.WriteFile(secret, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	ap := startAgentProcess(t, l, node, secret, state)
	l.waitNode(node, "up")

	dir := jobTempDir(t)
	script := `echo start; for f in /proc/$PPID/environ /proc/` + fmt.Sprint(ap.cmd.Process.Pid) + `/environ; do (tr '\0' '\n' < $f) 2>/dev/null | grep -c ALLOT_NODE_TOKEN; done; ` +
		`while [ ! -e ` + dir + `/go ]; do sleep 0.1; done; echo end`
	j := l.submit(demo.Engineer, `{"team":"nlp","tier":3,"gpus":2,"gpu_type":"A100-80GB","time_limit":"5m","command":`+jsonCmd("sh", "-c", script)+`}`)
	l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "running" }, "running")
	var pid int
	l.eventually(10*time.Second, "lease running", func() bool {
		_ = l.m.Pool.QueryRow(ctx, `SELECT coalesce(pid, 0) FROM leases WHERE job_id = $1 AND state = 'running'`, j.ID).Scan(&pid)
		return pid > 0
	})

	ap.kill9(t)
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the job died with its agent: %v", err)
	}
	time.Sleep(2 * testHeartbeat)
	startAgentProcess(t, l, node, secret, state)
	l.waitNode(node, "up")
	// The server kept the job running through the restart and re-attached it.
	var leases int
	_ = l.m.Pool.QueryRow(ctx, `SELECT count(*) FROM leases WHERE job_id = $1`, j.ID).Scan(&leases)
	if got := l.job(j.ID); got.State != "running" || leases != 1 {
		t.Fatalf("after the restart the job is %s with %d leases; want running on its one lease", got.State, leases)
	}
	time.Sleep(500 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := l.waitJob(j.ID, 20*time.Second, func(j web.JobJSON) bool { return j.State == "completed" || j.State == "failed" }, "finished")
	if got.State != "completed" || got.ExitCode == nil || *got.ExitCode != 0 {
		b, _ := os.ReadFile(ap.log)
		t.Fatalf("job = %+v\nagent log:\n%s", got, b)
	}
	_, _, body := l.api("GET", fmt.Sprintf("/api/v1/jobs/%d/log", j.ID), demo.Engineer, "")
	var lg web.JobLogJSON
	_ = json.Unmarshal(body, &lg)
	joined := strings.Join(lg.Lines, "\n")
	if !strings.Contains(joined, "start") || !strings.Contains(joined, "end") {
		t.Errorf("log = %q", lg.Lines)
	}
	for _, line := range lg.Lines[1 : len(lg.Lines)-1] {
		if line != "0" {
			t.Errorf("the job read the node token from an environment: %q", lg.Lines)
		}
	}
	// Billed once: one allocation per GPU, released once, covering the
	// whole run (start to end), none open.
	var allocs, open int
	var billed float64
	_ = l.m.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE released_at IS NULL),
		coalesce(sum(extract(epoch FROM released_at - started_at)), 0) FROM allocations WHERE job_id = $1`, j.ID).Scan(&allocs, &open, &billed)
	run := got.EndedAt.Sub(*got.StartedAt).Seconds()
	if allocs != 2 || open != 0 || billed < 2*(run-1) || billed > 2*(run+1) {
		t.Errorf("allocations: %d (%d open), %.1f GPU-seconds billed for a %.1f s run on 2 GPUs", allocs, open, billed, run)
	}
}

// jobTempDir is a temporary directory the jobs of in-process agents (the
// account testJobUser, not root) can write.
func jobTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// localAgentFlags are the flags of an `allot agent` that runs next to
// other tests' agents on this machine: its own state directory and cgroup
// parent, the test account for jobs, and leaving no job behind when it
// stops. Not root: jobs run as the test's own account.
func localAgentFlags(t *testing.T, node string) []string {
	t.Helper()
	f := []string{"--state-dir", t.TempDir(), "--job-user", testJobUser, "--keep-jobs=false",
		"--cgroup-parent", fmt.Sprintf("allot-test/%d-%s-%s", os.Getpid(), strings.NewReplacer("/", "_").Replace(t.Name()), node)}
	if !agenttest.Root() {
		f = append(f, "--insecure-run-as-agent", "--cgroups", "off")
	}
	return f
}
