package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/agent"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/allotlabs/allot/web"
	"github.com/jackc/pgx/v5"
)

// cliArgsEnv makes the test binary run `allot` with these arguments (a
// JSON array) and exit: the test's stand-in for the allot binary, so the
// tests below run real `allot migrate`, `allot server`, `allot worker`,
// `allot agent` … processes.
const cliArgsEnv = "ALLOT_TEST_CLI_ARGS"

func init() {
	if v, ok := os.LookupEnv(cliArgsEnv); ok && (len(os.Args) < 2 || !strings.HasPrefix(os.Args[1], "job-shim")) {
		var args []string
		if err := json.Unmarshal([]byte(v), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(run(args, os.Stdout, os.Stderr))
	}
}

// zero is an operator's shell: the environment every command gets
// (DATABASE_URL, ALLOT_URL, ALLOT_TOKEN once known) and the long-running
// processes it started.
type zero struct {
	t   *testing.T
	env map[string]string
	dir string
}

func (z *zero) environ(extra ...string) []string {
	env := append([]string{}, os.Environ()...)
	// One timeline for every process (as allot dev's children share one).
	env = append(env, clock.EnvOffset+"="+clock.Offset().String())
	for k, v := range z.env {
		env = append(env, k+"="+v)
	}
	return append(env, extra...)
}

func (z *zero) command(extra []string, args ...string) *exec.Cmd {
	b, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(z.environ(extra...), cliArgsEnv+"="+string(b))
	return cmd
}

// allot runs `allot ARGS…` to its end: exit code, stdout, stderr.
func (z *zero) allot(args ...string) (int, string, string) {
	return z.allotEnv(nil, args...)
}

func (z *zero) allotEnv(extra []string, args ...string) (int, string, string) {
	z.t.Helper()
	cmd := z.command(extra, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		z.t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-done
		z.t.Fatalf("allot %s did not end; stderr:\n%s", strings.Join(args, " "), errb.String())
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// must is allot that has to succeed.
func (z *zero) must(args ...string) string {
	z.t.Helper()
	code, out, errs := z.allot(args...)
	if code != 0 {
		z.t.Fatalf("allot %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// start runs `allot ARGS…` in the background until the test ends
// (SIGTERM, then waited for); its output goes to a log file, returned.
func (z *zero) start(name string, args ...string) (*exec.Cmd, string) {
	z.t.Helper()
	cmd := z.command(nil, args...)
	logPath := filepath.Join(z.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		z.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		z.t.Fatal(err)
	}
	f.Close()
	z.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return cmd, logPath
}

func (z *zero) logOf(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// api calls the server's JSON API with the admin's token.
func (z *zero) api(method, path, body string, out any) int {
	z.t.Helper()
	code, b := z.apiAs(z.env["ALLOT_TOKEN"], method, path, body)
	if out != nil && code < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			z.t.Fatalf("%s %s: %v\n%s", method, path, err, b)
		}
	}
	if code >= 300 && out != nil {
		z.t.Logf("%s %s: %d %s", method, path, code, b)
	}
	return code
}

// apiAs calls the JSON API (or a portal page) with token: status and body.
func (z *zero) apiAs(token, method, path, body string) (int, []byte) {
	z.t.Helper()
	req, _ := http.NewRequest(method, z.env["ALLOT_URL"]+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		z.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

func (z *zero) eventually(limit time.Duration, what string, ok func() bool) {
	z.t.Helper()
	deadline := time.Now().Add(limit) // deadline (real time)
	for !ok() {
		if time.Now().After(deadline) { // deadline (real time)
			z.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestFromZeroToFirstJob follows the README's "From zero to the first job
// on a real node", step by step, with real processes on an empty database:
// migrate → bootstrap-admin → GPU type → team → node token → agent with
// --token-file (the fake GPU backend) → first job → first bill. Bad input
// on the way is refused with a clear message and changes nothing.
func TestFromZeroToFirstJob(t *testing.T) {
	t.Parallel()
	z := &zero{t: t, env: map[string]string{"DATABASE_URL": storetest.EmptyURL(t)}, dir: t.TempDir()}
	ctx := context.Background()

	// 0. Before migrating, bootstrap-admin says what to do.
	if code, _, errs := z.allot("bootstrap-admin", "--email", "ops@corp.example"); code != 1 || !strings.Contains(errs, "run `allot migrate` first") {
		t.Errorf("bootstrap-admin before migrate: exit %d, %q", code, errs)
	}

	// 1. allot migrate: tiers and policy, no people.
	z.must("migrate")

	// 2. allot bootstrap-admin.
	if code, _, errs := z.allot("bootstrap-admin"); code != 2 || !strings.Contains(errs, "--email is required") {
		t.Errorf("no email: exit %d, %q", code, errs)
	}
	if code, _, errs := z.allot("bootstrap-admin", "--email", "not-an-email"); code != 1 || !strings.Contains(errs, "email: must be an email address") {
		t.Errorf("bad email: exit %d, %q", code, errs)
	}
	out := z.must("bootstrap-admin", "--email", "ops@corp.example")
	token := strings.TrimSpace(out)
	if !strings.HasPrefix(token, "allot_") || strings.Contains(token, "\n") {
		t.Fatalf("bootstrap-admin printed %q", out)
	}
	if code, _, errs := z.allot("bootstrap-admin", "--email", "other@corp.example"); code != 1 || !strings.Contains(errs, "has an admin already (ops@corp.example)") {
		t.Errorf("second bootstrap: exit %d, %q", code, errs)
	}

	// 3. The secret key, then server and worker.
	keyFile := filepath.Join(z.dir, "secret.key")
	if err := os.WriteFile(keyFile, []byte(z.must("secret-key", "new")), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	_, serverLog := z.start("server", "server", "--addr", addr, "--secret-key-file", keyFile)
	_, workerLog := z.start("worker", "worker", "--metrics-addr", freeAddr(t), "--secret-key-file", keyFile)
	z.env["ALLOT_URL"], z.env["ALLOT_TOKEN"] = "http://"+addr, token
	z.eventually(30*time.Second, "the server to be ready", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	var me web.MeJSON
	if code := z.api("GET", "/api/v1/me", "", &me); code != http.StatusOK || !me.Admin || me.Email != "ops@corp.example" {
		t.Fatalf("GET /api/v1/me with the bootstrap token: %d %+v\nserver log:\n%s", code, me, z.logOf(serverLog))
	}

	// 4. A GPU type.
	if code, _, errs := z.allot("gpu-type", "create", "H100", "--memory-gb", "80", "--rate", "four"); code != 1 || !strings.Contains(errs, "hourly_rate: amount must be a decimal number") {
		t.Errorf("bad rate: exit %d, %q", code, errs)
	}
	if code, _, errs := z.allot("gpu-type", "create", "H100", "--rate", "4.10"); code != 1 || !strings.Contains(errs, "memory_gb: is required") {
		t.Errorf("no memory: exit %d, %q", code, errs)
	}
	if list := z.must("gpu-type", "list"); strings.Contains(list, "H100") {
		t.Fatalf("refused creations left a GPU type:\n%s", list)
	}
	if out := z.must("gpu-type", "create", "H100", "--memory-gb", "80", "--rate", "4.10"); !strings.Contains(out, "GPU type H100: 80 GB, 4.10 USD per GPU-hour") {
		t.Errorf("create: %q", out)
	}
	if list := z.must("gpu-type", "list"); !regexp.MustCompile(`H100\s+80 GB\s+4\.10 USD\s+0\s+native\s+in use`).MatchString(list) {
		t.Errorf("list:\n%s", list)
	}
	// Owned capacity's cost per GPU-hour, for the capacity report.
	if code, _, errs := z.allot("gpu-type", "set", "H100", "--capacity-cost", "-1"); code != 1 || !strings.Contains(errs, "capacity_cost: must be between 0 and 1000000") {
		t.Errorf("negative capacity cost: exit %d, %q", code, errs)
	}
	if out := z.must("gpu-type", "set", "H100", "--capacity-cost", "1.80", "--note", "depreciation"); !strings.Contains(out, "owned capacity 1.80 USD per GPU-hour") {
		t.Errorf("set capacity cost: %q", out)
	}

	// 5. A team, with allot team create; bad input is refused and
	// creates nothing.
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"team", "create", "ml", "--name", "Machine Learning", "--cost-center", "CC-1000", "--budget-gpu-hours", "-5"}, "monthly_budget_gpu_hours"},
		{[]string{"team", "create", "ML Team", "--name", "Machine Learning", "--cost-center", "CC-1000"}, "slug"},
		{[]string{"team", "create", "ml", "--name", "Machine Learning", "--cost-center", "CC-1000", "--guarantee", "A100=2"}, "guarantees"},
	} {
		if code, _, errs := z.allot(bad.args...); code != 1 || !strings.Contains(errs, bad.want) {
			t.Errorf("allot %s: exit %d, %q (want exit 1 naming %s)", strings.Join(bad.args, " "), code, errs, bad.want)
		}
	}
	if list := z.must("team", "list"); strings.Contains(list, "ml ") || strings.Contains(list, "ML Team") {
		t.Fatalf("a refused team was created:\n%s", list)
	}
	if out := z.must("team", "create", "ml", "--name", "Machine Learning", "--cost-center", "CC-1000", "--budget-gpu-hours", "1000"); !strings.Contains(out, "team ml (Machine Learning): budget 1000 GPU-h/month, weight 1") {
		t.Errorf("team create printed %q", out)
	}
	if out := z.must("team", "set", "ml", "--guarantee", "H100=2", "--fair-share-weight", "2", "--note", "two GPUs for evals"); !strings.Contains(out, "weight 2, guarantees H100=2") {
		t.Errorf("team set printed %q", out)
	}
	if list := z.must("team", "list"); !regexp.MustCompile(`ml\s+Machine Learning\s+CC-1000\s+1000\s+2\s+H100=2\s+—`).MatchString(list) {
		t.Errorf("team list:\n%s", list)
	}

	// 6. A node token; unknown GPU types are refused.
	if code, _, errs := z.allot("node-token", "create", "gpu01", "--gpu-type", "A100", "--gpus", "4"); code != 1 ||
		!strings.Contains(errs, `unknown GPU type "A100": use one of H100`) {
		t.Errorf("unknown type: exit %d, %q", code, errs)
	}
	out = z.must("node-token", "create", "gpu01", "--gpu-type", "H100", "--gpus", "4", "--label", "rack=r1")
	nodeToken := strings.SplitN(out, "\n", 2)[0]
	if !strings.HasPrefix(nodeToken, "allot_node_") || !strings.Contains(out, "--token-file /etc/allot/node-token") {
		t.Fatalf("node-token create printed %q", out)
	}
	tokenFile := filepath.Join(z.dir, "node-token")
	if err := os.WriteFile(tokenFile, []byte(nodeToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// 7. The agent, with --token-file (fake GPUs: this machine has none).
	agentArgs := append([]string{"agent", "--token-file", tokenFile, "--gpu", "fake", "--fake-gpus", "4", "--fake-model", "NVIDIA H100 80GB HBM3",
		"--fake-memory-mib", "81559", "--hostname", "gpu01", "--heartbeat", "1s", "--metrics-addr", ""}, localAgentFlags(t, "gpu01")...)
	_, agentLog := z.start("agent", agentArgs...)
	var node web.NodeJSON
	z.eventually(30*time.Second, "gpu01 up", func() bool {
		return z.api("GET", "/api/v1/nodes/gpu01", "", &node) == http.StatusOK && node.State == allot.NodeUp
	})
	if node.GPUs != 4 || node.GPUType != "H100" || node.Labels["rack"] != "r1" || node.InventoryNote != "" {
		t.Errorf("gpu01 = %+v", node)
	}

	// 8. The first job.
	// Its secret variable is stored sealed by the key and reaches the job.
	z.env["HELLO_SECRET"] = "zero-s3cr3t"
	out = z.must("submit", "--team", "ml", "--tier", "3", "--gpus", "2", "--gpu-type", "H100", "--time", "10m", "--name", "hello", "--secret-env", "HELLO_SECRET",
		"--", "sh", "-c", `echo hello from $(hostname) on GPUs $CUDA_VISIBLE_DEVICES; [ "$HELLO_SECRET" = zero-s3cr3t ] && echo the secret arrived; sleep 6`)
	m := regexp.MustCompile(`submitted job (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("submit printed %q", out)
	}
	var job web.JobJSON
	z.eventually(90*time.Second, "the job to finish", func() bool {
		return z.api("GET", "/api/v1/jobs/"+m[1], "", &job) == http.StatusOK && (job.State == "completed" || job.State == "failed")
	})
	if job.State != "completed" {
		t.Fatalf("job = %+v\nagent log:\n%s\nworker log:\n%s", job, z.logOf(agentLog), z.logOf(workerLog))
	}
	var lg web.JobLogJSON
	z.api("GET", "/api/v1/jobs/"+m[1]+"/log", "", &lg)
	if !strings.Contains(strings.Join(lg.Lines, "\n"), "hello from") || !strings.Contains(strings.Join(lg.Lines, "\n"), "the secret arrived") {
		t.Errorf("log = %q", lg.Lines)
	}
	if db, err := pgx.Connect(ctx, z.env["DATABASE_URL"]); err != nil {
		t.Error(err)
	} else {
		var stored string
		if err := db.QueryRow(ctx, `SELECT secret_env->>'HELLO_SECRET' FROM jobs WHERE id = $1::text::bigint`, m[1]).Scan(&stored); err != nil || !strings.HasPrefix(stored, "allot:v1:") {
			t.Errorf("the stored secret = %q (%v), want it sealed", stored, err)
		}
		db.Close(ctx)
	}

	// 9. The first bill. The worker bills each hour once it has ended;
	// `allot billing rollup` does it now. Run it as of an hour later, so
	// that the job's hour has ended.
	code, out, errs := z.allotEnv([]string{clock.EnvOffset + "=" + (clock.Offset() + time.Hour).String()}, "billing", "rollup")
	if code != 0 {
		t.Fatalf("billing rollup: %d %s %s", code, out, errs)
	}
	// The job may cross a month's end (the test clock can sit at one):
	// its usage is then billed in both months, one line in each.
	month := job.StartedAt.UTC().Format("2006-01")
	billMonths := []string{month}
	if end := job.EndedAt.UTC().Format("2006-01"); end != month {
		billMonths = append(billMonths, end)
	}
	var lines []web.ChargeLineJSON
	for _, mo := range billMonths {
		var bill web.ChargebackJSON
		if code := z.api("GET", "/api/v1/chargeback?month="+mo, "", &bill); code != http.StatusOK {
			t.Fatalf("chargeback %s: %d", mo, code)
		}
		if len(bill.Teams) != 1 || bill.Teams[0].Team != "ml" || bill.Teams[0].CostCenter != "CC-1000" || bill.Total.Amount == "" ||
			len(bill.Lines) != 1 || bill.Lines[0].JobID != job.ID || bill.Lines[0].Rate != "4.10" ||
			bill.Total.Amount != bill.Lines[0].Amount || bill.Teams[0].Amount != bill.Lines[0].Amount {
			t.Errorf("bill %s = %+v", mo, bill)
		}
		lines = append(lines, bill.Lines...)
	}
	// Exact money: the lines are GPU-hours × 4.10 (tier 3: × 1) of what
	// the job's allocations held.
	pool, err := store.Open(ctx, z.env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var gpuSeconds int64
	if err := pool.QueryRow(ctx, `SELECT sum(extract(epoch FROM released_at - started_at))::bigint FROM allocations WHERE job_id = $1`, job.ID).Scan(&gpuSeconds); err != nil {
		t.Fatal(err)
	}
	if gpuSeconds < 2*2 || len(lines) != len(billMonths) {
		t.Fatalf("%d GPU-seconds allocated; lines %+v", gpuSeconds, lines)
	}
	var billed int64
	for _, l := range lines {
		amount, err := allot.ParseMoney(l.Amount, "USD")
		if err != nil {
			t.Fatal(err)
		}
		billed += amount.Micros
	}
	// Lines are in whole cents: within a cent a line of it, and not nothing.
	if want, tol := gpuSeconds*4_100_000/3600, int64(10_000*len(lines)); billed <= 0 || billed < want-tol || billed > want+tol {
		t.Errorf("billed %s for %d GPU-seconds at 4.10/GPU-hour (want about %s); lines %+v", allot.Money{Micros: billed, Currency: "USD"}.Decimal(), gpuSeconds,
			allot.Money{Micros: want, Currency: "USD"}.Decimal(), lines)
	}

	// 10. Capacity: gpu01 has been registered capacity since its agent
	// registered (the database recorded it), and the job's GPU-seconds are
	// its allocated ones, in the month(s) the job ran.
	var allocated int64
	months := billMonths
	for _, mo := range months {
		var cp web.CapacityJSON
		if code := z.api("GET", "/api/v1/capacity?month="+mo, "", &cp); code != http.StatusOK {
			t.Fatalf("capacity %s: %d", mo, code)
		}
		for _, r := range cp.Rows {
			if r.GPUType != "H100" || r.Site != allot.SiteOnPrem || r.CostPerGPUHour != "1.80" ||
				r.RegisteredGPUSeconds != r.AllocatedGPUSeconds+r.IdleGPUSeconds+r.DrainedDownGPUSeconds {
				t.Errorf("capacity %s row %+v", mo, r)
			}
			if want, err := billing.LineAmount(r.RegisteredGPUSeconds-r.AllocatedGPUSeconds, 1_800_000, 10000, "USD"); err != nil || r.UnrecoveredCost != want.Decimal() {
				t.Errorf("capacity %s: unrecovered %s, want %s", mo, r.UnrecoveredCost, want.Decimal())
			}
			allocated += r.AllocatedGPUSeconds
		}
		if len(cp.Rows) != 1 && mo == month {
			t.Errorf("capacity %s: rows %+v", mo, cp.Rows)
		}
	}
	if allocated != gpuSeconds {
		var hist, allocs string
		pool.QueryRow(ctx, `SELECT string_agg(format('%s %s %s %s', node, at, state, registered), '; ' ORDER BY at, id) FROM node_state_history`).Scan(&hist) //nolint:errcheck
		pool.QueryRow(ctx, `SELECT string_agg(format('%s/%s %s–%s', node, gpu_index, started_at, released_at), '; ') FROM allocations`).Scan(&allocs)         //nolint:errcheck
		t.Errorf("capacity: %d GPU-seconds allocated in %v, the job's allocations held %d; history %s; allocations %s", allocated, months, gpuSeconds, hist, allocs)
	}
}

// TestGPUTypesPortalAndAPI: admins create, edit and retire GPU types on
// /admin/gpu-types and through /api/v1/gpu-types, audited; bad input is a
// field error and changes nothing; others cannot.
func TestGPUTypesPortalAndAPI(t *testing.T) {
	e := bootQuiet(t)
	start := e.policyCounts()
	// API: field errors, nothing changed.
	for _, body := range []string{
		`{"name":"H100","memory_gb":80}`,
		`{"name":"H100","memory_gb":0,"hourly_rate":"4.10"}`,
		`{"name":"H100","memory_gb":80,"hourly_rate":"4.1234567"}`,
		`{"name":"bad name","memory_gb":80,"hourly_rate":"4.10"}`,
		`{"name":"T4","memory_gb":16,"hourly_rate":"0.35"}`, // exists (the demo's)
		`{"name":"H100","memory_gb":80,"hourly_rate":"4.10","currency":"EUR"}`,
	} {
		code, _, b := e.api("POST", "/api/v1/gpu-types", demo.Admin, body)
		var p web.Problem
		_ = json.Unmarshal(b, &p)
		if code != http.StatusUnprocessableEntity || len(p.Errors) == 0 {
			t.Errorf("POST %s: %d %s", body, code, b)
		}
	}
	if code, _, _ := e.api("POST", "/api/v1/gpu-types", demo.Lead, `{"name":"H100","memory_gb":80,"hourly_rate":"4.10"}`); code != http.StatusForbidden {
		t.Errorf("a lead creates a GPU type: %d", code)
	}
	e.wantChanges(start, 0, "refused GPU types")
	code, _, b := e.api("POST", "/api/v1/gpu-types", demo.Admin, `{"name":"H100","memory_gb":80,"hourly_rate":"4.10","note":"new racks"}`)
	var ch struct {
		Changed bool            `json:"changed"`
		AuditID int64           `json:"audit_id"`
		Value   web.GPUTypeJSON `json:"value"`
	}
	if err := json.Unmarshal(b, &ch); code != http.StatusCreated || err != nil || !ch.Changed || ch.Value.HourlyRate != "4.10" || ch.Value.MemoryGB != 80 {
		t.Fatalf("create: %d %s", code, b)
	}
	e.wantChanges(start, 1, "a GPU type")
	if n := e.auditActions("gpu_type.create", "gpu_type:H100"); n != 1 {
		t.Errorf("%d gpu_type.create entries", n)
	}
	// PUT: a new rate (from now on) and memory; retire.
	code, _, b = e.api("PUT", "/api/v1/gpu-types/H100", demo.Admin, `{"memory_gb":94,"hourly_rate":"4.50"}`)
	if err := json.Unmarshal(b, &ch); code != http.StatusOK || err != nil || ch.Value.MemoryGB != 94 || !ch.Changed {
		t.Errorf("PUT: %d %s", code, b)
	}
	// The new rate is in force from now on (the second after the first
	// one's start, which was now too).
	var rates web.RatesJSON
	e.getJSON("/api/v1/rates", demo.Admin, &rates)
	var h100 []string
	for _, r := range rates.Rates {
		if r.GPUType == "H100" {
			h100 = append(h100, r.Rate)
		}
	}
	if strings.Join(h100, " ") != "4.50 4.10" {
		t.Errorf("H100 rates, newest first: %v", h100)
	}
	if code, _, b := e.api("PUT", "/api/v1/gpu-types/H100", demo.Admin, `{"hourly_rate":"lots"}`); code != http.StatusUnprocessableEntity || !strings.Contains(string(b), "hourly_rate") {
		t.Errorf("bad PUT: %d %s", code, b)
	}
	if code, _, _ := e.api("PUT", "/api/v1/gpu-types/nope", demo.Admin, `{"memory_gb":1}`); code != http.StatusNotFound {
		t.Errorf("PUT unknown: %d", code)
	}
	code, _, b = e.api("PUT", "/api/v1/gpu-types/H100", demo.Admin, `{"retired":true}`)
	if err := json.Unmarshal(b, &ch); code != http.StatusOK || err != nil || !ch.Value.Retired {
		t.Errorf("retire: %d %s", code, b)
	}
	var list web.GPUTypeList
	e.getJSON("/api/v1/gpu-types", demo.Engineer, &list)
	if len(list.GPUTypes) != 3 {
		t.Errorf("types = %+v", list.GPUTypes)
	}
	// The portal: the page, a create form with a field error, a good one.
	br := e.login(demo.Admin)
	status, page := br.get("/admin/gpu-types")
	if status != http.StatusOK || !strings.Contains(page, `data-testid="gpu-type-H100"`) || !strings.Contains(page, "retired") {
		t.Fatalf("page: %d", status)
	}
	for _, p := range pageProblems(t, page) {
		t.Errorf("/admin/gpu-types: %s", p)
	}
	before := e.policyCounts()
	status, page = br.post("/admin/gpu-types", page, url.Values{"name": {"L40S"}, "memory_gb": {"forty-eight"}, "hourly_rate": {"1.90"}})
	if status != http.StatusUnprocessableEntity || !strings.Contains(page, "must be a whole number of GB") || !strings.Contains(page, `value="L40S"`) {
		t.Errorf("bad form: %d", status)
	}
	for _, p := range pageProblems(t, page) {
		t.Errorf("/admin/gpu-types with an error: %s", p)
	}
	e.wantChanges(before, 0, "a refused form")
	status, page = br.post("/admin/gpu-types", page, url.Values{"name": {"L40S"}, "memory_gb": {"48"}, "hourly_rate": {"1.90"}})
	if status != http.StatusOK || !strings.Contains(page, `data-testid="gpu-type-L40S"`) || !strings.Contains(page, "Saved GPU type L40S") {
		t.Errorf("form: %d", status)
	}
	status, page = br.post("/admin/gpu-types/L40S", page, url.Values{"action": {"retire"}})
	if status != http.StatusOK || !strings.Contains(page, "Reinstate L40S") {
		t.Errorf("retire form: %d", status)
	}
	e.wantChanges(before, 2, "create and retire L40S")
}

// TestInventoryDiffersFromDeclaration: an agent that registers other GPUs
// than its node was declared with is shown to the admin (API, nodes list,
// node page), and the node still runs jobs by its registered count.
func TestInventoryDiffersFromDeclaration(t *testing.T) {
	l := startLive(t, nil)
	ctx := context.Background()
	var out, errb bytes.Buffer
	if code := run([]string{"node-token", "create", "gpu77", "--gpu-type", "A100-80GB", "--gpus", "8", "--database-url", l.m.DatabaseURL}, &out, &errb); code != 0 {
		t.Fatalf("node-token create: %d %s", code, errb.String())
	}
	tok := strings.SplitN(out.String(), "\n", 2)[0]
	a := agent.New(agent.Local(agent.Config{Server: l.url, Token: tok, Hostname: "gpu77", HeartbeatInterval: testHeartbeat,
		Backend: agent.NewFake(agent.FakeOptions{GPUs: 4, Model: "NVIDIA A100-PCIE-40GB", MemoryMiB: 40960, Hostname: "gpu77"}),
		Logger:  slog.New(slog.DiscardHandler)}))
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = a.Run(actx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	l.waitNode("gpu77", allot.NodeUp)
	const want = "registered 4 GPUs of NVIDIA A100-PCIE-40GB (40 GB); declared 8 × A100-80GB (80 GB)"
	var n web.NodeJSON
	l.getJSON("/api/v1/nodes/gpu77", demo.Admin, &n)
	if n.InventoryNote != want || n.GPUs != 4 || n.State != allot.NodeUp {
		t.Errorf("node = %+v", n)
	}
	br := l.login(demo.Admin)
	if _, page := br.get("/nodes"); !strings.Contains(page, want) {
		t.Errorf("/nodes does not show the note")
	}
	_, page := br.get("/nodes/gpu77")
	if !strings.Contains(page, "Its agent registered other GPUs than declared") || !strings.Contains(page, want) {
		t.Errorf("/nodes/gpu77 does not show the note")
	}
	for _, p := range pageProblems(t, page) {
		t.Errorf("/nodes/gpu77: %s", p)
	}

	// The admin answers the note: gpu77 is 4 PCIe A100s of 40 GB. Bad
	// input is refused and changes nothing.
	out.Reset()
	errb.Reset()
	if code := run([]string{"gpu-type", "create", "A100-40GB", "--memory-gb", "40", "--rate", "2.10", "--server", l.url, "--token", l.tokens[demo.Admin]}, &out, &errb); code != 0 {
		t.Fatalf("gpu-type create: %d %s %s", code, out.String(), errb.String())
	}
	for _, bad := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"node", "set", "gpu77", "--gpu-type", "A100-40GB"}, 2, "give --gpu-type and --gpus"},
		{[]string{"node", "set", "gpu77", "--gpu-type", "B300", "--gpus", "4"}, 1, `unknown GPU type "B300"`},
		{[]string{"node", "set", "gpu77", "--gpu-type", "A100-40GB", "--gpus", "65"}, 1, "gpus: must be 1..64"},
		{[]string{"node", "set", "gpu78", "--gpu-type", "A100-40GB", "--gpus", "4"}, 1, `node "gpu78" does not exist`},
	} {
		if code, _, errs := l.cli(demo.Admin, bad.args...); code != bad.code || !strings.Contains(errs, bad.want) {
			t.Errorf("allot %s: exit %d, %q; want %d and %q", strings.Join(bad.args, " "), code, errs, bad.code, bad.want)
		}
	}
	if code, _, errs := l.cli(demo.Engineer, "node", "set", "gpu77", "--gpu-type", "A100-40GB", "--gpus", "4"); code != 1 || !strings.Contains(errs, "admin") {
		t.Errorf("an engineer declaring a node: exit %d, %q", code, errs)
	}
	l.getJSON("/api/v1/nodes/gpu77", demo.Admin, &n)
	if n.GPUType != "A100-80GB" || n.InventoryNote != want {
		t.Fatalf("refused declarations changed gpu77: %+v", n)
	}
	if code, out, errs := l.cli(demo.Admin, "node", "set", "gpu77", "--gpu-type", "A100-40GB", "--gpus", "4", "--note", "the PCIe cards"); code != 0 || out != "node gpu77 declared as 4 × A100-40GB\n" {
		t.Errorf("node set: exit %d, %q %q", code, out, errs)
	}
	n = web.NodeJSON{} // inventory_note is left out when empty
	l.getJSON("/api/v1/nodes/gpu77", demo.Admin, &n)
	if n.GPUType != "A100-40GB" || n.GPUs != 4 || n.InventoryNote != "" {
		t.Errorf("gpu77 after node set = %+v; want 4 × A100-40GB, no note", n)
	}
	if code, out, _ := l.cli(demo.Admin, "node", "set", "gpu77", "--gpu-type", "A100-40GB", "--gpus", "4"); code != 0 || !strings.Contains(out, "already declared") {
		t.Errorf("the same again: exit %d, %q", code, out)
	}
}

// TestZeroCommandsUsage: the new commands' usage and flag errors exit 2
// with their usage, and never print the secrets of the environment.
func TestZeroCommandsUsage(t *testing.T) {
	t.Setenv("ALLOT_TOKEN", "allot_secret-api-token-value")
	t.Setenv("DATABASE_URL", "postgres://allot:secret-db-password@127.0.0.1:1/allot")
	t.Setenv("ALLOT_URL", "http://127.0.0.1:1")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"bootstrap-admin", "-h"}, 2, "usage: allot bootstrap-admin --email"},
		{[]string{"bootstrap-admin", "--email", "a@b.c", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"bootstrap-admin", "--ttl", "soon", "--email", "a@b.c"}, 2, "invalid value"},
		{[]string{"gpu-type"}, 2, "allot gpu-type create NAME --memory-gb"},
		{[]string{"gpu-type", "create", "-h"}, 2, "allot gpu-type list"},
		{[]string{"gpu-type", "frobnicate"}, 2, `unknown subcommand "frobnicate"`},
		{[]string{"gpu-type", "set", "H100"}, 2, "give --memory-gb, --rate or --capacity-cost"},
		{[]string{"gpu-type", "retire", "H100", "--rate", "1"}, 2, "allot gpu-type list"},
		{[]string{"team"}, 2, "allot team create SLUG --name NAME"},
		{[]string{"team", "create", "ml"}, 2, "give --name"},
		{[]string{"team", "create", "ml", "--name", "x", "--guarantee", "H100"}, 2, `"H100" is not TYPE=N`},
		{[]string{"team", "create", "ml", "--name", "x", "--budget-gpu-hours", "lots"}, 2, `"lots" is not a whole number`},
		{[]string{"team", "set", "ml"}, 2, "give at least one of --name"},
		{[]string{"team", "set-account", "ml"}, 2, "allot team list"},
		{[]string{"team", "frobnicate"}, 2, `unknown subcommand "frobnicate"`},
		{[]string{"team", "--server", "http://127.0.0.1:1", "list"}, 1, "cannot reach the Allot server"},
		{[]string{"team", "--server", "http://127.0.0.1:1"}, 2, "allot team create SLUG --name NAME"},
		{[]string{"team", "list"}, 1, "cannot reach the Allot server"},
		{[]string{"billing"}, 2, "usage: allot billing rollup"},
		{[]string{"billing", "rollup", "extra"}, 2, "usage: allot billing rollup"},
		{[]string{"gpu-type", "list"}, 1, "cannot reach the Allot server"},
	} {
		var out, errb bytes.Buffer
		code := run(c.args, &out, &errb)
		all := out.String() + errb.String()
		if code != c.code || !strings.Contains(all, c.want) {
			t.Errorf("allot %s: exit %d, want %d with %q:\n%s", strings.Join(c.args, " "), code, c.code, c.want, all)
		}
		if strings.Contains(all, "secret-api-token-value") || strings.Contains(all, "secret-db-password") {
			t.Errorf("allot %s prints a secret:\n%s", strings.Join(c.args, " "), all)
		}
	}
}
