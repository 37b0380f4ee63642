package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/apf"
	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/loadtest"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/allotlabs/allot/internal/testlock"
	"github.com/jackc/pgx/v5"
)

// TestLoadtestSelfHosted runs `allot loadtest` for 3 s (after 1 s of
// warm-up, not counted) in its self-hosted
// mode (its own server and worker on a fresh database of the test
// PostgreSQL) with a little of everything: paced submitters, simulated
// agents that run the jobs, seeded pending jobs and busy nodes, the pages
// with some history. The report must be well-formed, every operation must
// have run, nothing may have failed, and the fresh database must be gone
// afterwards. It checks no speed: figures come from full-size runs.
func TestLoadtestSelfHosted(t *testing.T) {
	testlock.Exclusive(t) // its figures are bounded by time: not beside Slurm clusters
	loadtestNeedsDB(t)
	var out, errb bytes.Buffer
	code := cmdLoadtest([]string{"--database-url", storetest.AdminURL(), "--warmup", "1s", "--duration", "3s", "--submitters", "4", "--submit-rate", "40",
		"--agents", "6", "--heartbeat", "300ms", "--job-runtime", "500ms", "--pending", "200", "--nodes", "20", "--pages",
		"--history-jobs", "300", "--page-interval", "200ms", "--json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
	}
	var rep loadtest.Report
	dec := json.NewDecoder(&out)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("report is not the JSON of a Report: %v\n%s", err, out.String())
	}
	// The window ends when the last call in flight has; a call may wait
	// for a slot of the booted server's admission control for up to its
	// queue wait (apf.Default: 10 s) on a loaded machine.
	if most := 3 + apf.Default.Write.QueueWait.Seconds(); rep.DurationS < 2.9 || rep.DurationS > most {
		t.Errorf("measured window %.1f s, want 3 s to %.0f s", rep.DurationS, most)
	}
	if rep.Config.WarmupS != 1 || rep.Config.Agents != 6 || rep.Config.Submitters != 4 || rep.Config.Pending != 200 || rep.Config.Nodes != 20 || !rep.Config.Pages {
		t.Errorf("config echo: %+v", rep.Config)
	}
	for _, name := range []string{"submit job", "agent register", "agent heartbeat", "agent orders (long poll)", "agent take leases (batch)",
		"agent started (batch)", "agent exited", "page GET /cluster", "page GET /teams/fraud"} {
		o := rep.Op(name)
		if o.Count == 0 {
			t.Errorf("%s: never succeeded: %+v", name, o)
			continue
		}
		if name == "agent orders (long poll)" {
			continue
		}
		if o.P50 <= 0 || o.P50 > o.P90 || o.P90 > o.P95 || o.P95 > o.P99 || o.P99 > o.Max || o.Rate <= 0 {
			t.Errorf("%s: percentiles out of order or no rate: %+v", name, o)
		}
	}
	if n := rep.Errors(); n != 0 {
		var b strings.Builder
		rep.WriteText(&b) //nolint:errcheck
		t.Errorf("%d errors:\n%s", n, b.String())
	}
	// 40/s for about 3 s: about 120 submissions, all accepted. Paced
	// calls catch up when they fall behind, so a loaded machine may add
	// what the warm-up owed, and the window may run a little long: at most
	// 40/s over the window and the warm-up. A loaded machine may also run
	// fewer (the server and worker share its cores; this checks pacing,
	// not speed): at least half a second's worth.
	if s, most := rep.Op("submit job"), 40*(rep.DurationS+rep.Config.WarmupS); s.Count < 20 || float64(s.Count) > most {
		t.Errorf("submissions: %d, want about 120 at 40/s (at most %.0f over a %.1f s window after %.0f s of warm-up)", s.Count, most, rep.DurationS, rep.Config.WarmupS)
	}
	// Jobs really ran (agent started and agent exited succeeded above; the
	// submitted ones wait behind the seeded queue); every submitted job is
	// accounted for.
	total := 0
	for _, n := range rep.Jobs {
		total += n
	}
	if total < rep.Op("submit job").Count {
		t.Errorf("submitted jobs by state %v: fewer than the %d submitted", rep.Jobs, rep.Op("submit job").Count)
	}
	if rep.Cycles == nil || rep.Cycles.Count == 0 || rep.Cycles.MaxPending < 150 || rep.Cycles.Started == 0 {
		t.Errorf("worker's cycles: %+v", rep.Cycles)
	}
	// The agents' nodes at the end: all 6 up (none silent for 60 s).
	if len(rep.Nodes) != 1 || rep.Nodes["up"] != 6 {
		t.Errorf("the agents' nodes by state: %v, want up 6", rep.Nodes)
	}
	// The probe saw the seeded cluster: 6 agents + 20 busy nodes (+ the
	// demo's 16 and the history node), 200 pending less what the worker's
	// cycles may have started on the agents' 48 GPUs already.
	if p := rep.Probe; p == nil || p.Pending < 150 || p.Nodes < 26 || p.CycleMS <= 0 || p.LoadMS <= 0 {
		t.Errorf("cycle probe: %+v", rep.Probe)
	}
	if len(rep.Seeding) < 5 {
		t.Errorf("seeding steps: %+v", rep.Seeding)
	}
	// The text form carries the same table.
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "agent heartbeat") || !strings.Contains(text.String(), "0 errors in all") {
		t.Errorf("text report (%v):\n%s", err, text.String())
	}
	// The fresh database was dropped.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, storetest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx) //nolint:errcheck
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE 'allot_loadtest_%\_' || $1`, strconv.Itoa(os.Getpid())).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d loadtest databases of this process left behind", left)
	}
}

// TestLoadtestAgainstURL runs the tool against a server it did not boot
// (--url and --token), seeding its agents through that server's database
// (--database-url): the other mode. Again no speed is checked.
func TestLoadtestAgainstURL(t *testing.T) {
	loadtestNeedsDB(t)
	m := &Main{Config: Config{Worker: true, HeartbeatInterval: 300 * time.Millisecond, CheckpointRoot: t.TempDir()}}
	startSeeded(t, &m)
	ctx := context.Background()
	admin, err := m.Store.UserByEmail(ctx, demo.PersonaEmail[demo.Admin])
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := m.Store.CreateAPIToken(ctx, admin.ID, "loadtest")
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := cmdLoadtest([]string{"--url", m.URL(), "--token", tok, "--database-url", m.DatabaseURL, "--duration", "2s", "--submitters", "2",
		"--submit-rate", "20", "--agents", "3", "--heartbeat", "300ms", "--job-runtime", "300ms", "--json", "--metrics-url", m.URL() + "/metrics"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
	}
	var rep loadtest.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, out.String())
	}
	if n := rep.Errors(); n != 0 || rep.Op("submit job").Count < 20 || rep.Op("agent heartbeat").Count < 10 || rep.Cycles == nil {
		var b strings.Builder
		rep.WriteText(&b) //nolint:errcheck
		t.Errorf("%d errors, or too little done:\n%s", n, b.String())
	}
	// --metrics-url: the server's own time for the agent API and
	// submissions, read from its /metrics with the admin's token.
	served := map[string]int{}
	for _, o := range rep.Server {
		served[o.Route] = o.Count
	}
	if served["POST /api/v1/jobs"] < 20 || served["POST /api/agent/v1/heartbeat"] < 10 {
		t.Errorf("server-side figures %+v, want the submissions and heartbeats", rep.Server)
	}
	// Its nodes and tokens are named so they are easy to find.
	var n int
	if err := m.Pool.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE name LIKE 'lt-agent-%'`).Scan(&n); err != nil || n != 3 {
		t.Errorf("%d lt-agent nodes (%v), want 3", n, err)
	}
}

// TestLoadtestBadFlags: bad flags exit 2 with a message that names the
// problem, before anything is created.
func TestLoadtestBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "give --database-url"},
		{[]string{"--database-url", "postgres://x/y", "--duration", "0s"}, "--duration must be positive"},
		{[]string{"--database-url", "postgres://x/y", "--agents", "-1"}, "--agents must not be negative"},
		{[]string{"--database-url", "postgres://x/y", "--warmup", "-1s"}, "--warmup must be 0..1h"},
		{[]string{"--database-url", "postgres://x/y", "--gpus-per-agent", "65"}, "--gpus-per-agent must be 1..64"},
		{[]string{"--database-url", "postgres://x/y", "--heartbeat", "1ms"}, "--heartbeat must be"},
		{[]string{"--database-url", "postgres://x/y", "--submit-rate", "-5"}, "--submit-rate must not be negative"},
		{[]string{"--database-url", "postgres://x/y", "--submitters", "0", "--agents", "0"}, "nothing to do"},
		{[]string{"--database-url", "postgres://x/y", "--teams", ","}, "--teams must name"},
		{[]string{"--url", "ftp://x", "--token", "t", "--agents", "0"}, "--url must start with http"},
		{[]string{"--url", "http://x", "--agents", "0"}, "submitters need a --token"},
		{[]string{"--url", "http://x", "--token", "t", "--agents", "5"}, "give --database-url"},
		{[]string{"--url", "http://x", "--token", "t", "--keep-db"}, "--keep-db, --agent-conns, --min-cycle-interval and --cycle-duty are for a booted server"},
		{[]string{"--url", "http://x", "--token", "t", "--cycle-duty", "1"}, "--cycle-duty are for a booted server"},
		{[]string{"--database-url", "postgres://x/y", "--cycle-duty", "0"}, "--cycle-duty must be more than 0 and at most 1 (no pause), not 0"},
		{[]string{"--database-url", "postgres://x/y", "--min-cycle-interval", "1m"}, "--min-cycle-interval must be 0 (none) to 10s"},
		{[]string{"--database-url", "postgres://x/y", "--agent-conns", "-3"}, "--agent-conns must be 0..1000"},
		{[]string{"--database-url", "postgres://x/y", "extra"}, `unexpected argument "extra"`},
		{[]string{"--database-url", "postgres://x/y", "--metrics-url", "http://x/metrics"}, "--metrics-url is for a running server"},
		{[]string{"--url", "http://x", "--token", "t", "--agents", "0", "--metrics-url", "ftp://x/metrics"}, "is not an http(s) URL"},
		{[]string{"--duration", "soon"}, "invalid value"},
	} {
		var out, errb bytes.Buffer
		start := time.Now() // stopwatch
		code := cmdLoadtest(c.args, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 saying %q", c.args, code, errb.String(), c.want)
		}
		if time.Since(start) > 2*time.Second {
			t.Errorf("%q: took %v: flags must be checked before connecting", c.args, time.Since(start))
		}
	}
}

// loadtestNeedsDB skips when no PostgreSQL answers (as requireDB does for
// the benchmarks).
func loadtestNeedsDB(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, storetest.AdminURL())
	if err != nil {
		t.Skipf("skipping: no PostgreSQL at %s: %v", storetest.AdminURL(), err)
	}
	c.Close(ctx) //nolint:errcheck
}

// TestLoadtestProcesses: --processes runs the control plane as production
// does, in processes of its own (allot server --serve users, allot server
// --serve agents, allot worker: here the test binary standing in for
// allot): submissions go to the users server, the simulated agents to the
// agent server, jobs run through the worker's cycles, the server-side
// figures come from both servers' /metrics and the cycle phases from the
// worker's. Every process has ended when the tool returns. Again no speed
// is checked.
func TestLoadtestProcesses(t *testing.T) {
	loadtestNeedsDB(t)
	var started []*exec.Cmd
	loadtestChild = func(args ...string) (*exec.Cmd, error) {
		b, _ := json.Marshal(args)
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), cliArgsEnv+"="+string(b))
		started = append(started, cmd)
		return cmd, nil
	}
	t.Cleanup(func() { loadtestChild = defaultLoadtestChild })
	var out, errb bytes.Buffer
	code := cmdLoadtest([]string{"--database-url", storetest.AdminURL(), "--processes", "--duration", "3s", "--submitters", "2", "--submit-rate", "20",
		"--agents", "3", "--heartbeat", "300ms", "--job-runtime", "300ms", "--json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
	}
	var rep loadtest.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, out.String())
	}
	served := map[string]int{}
	for _, o := range rep.Server {
		served[o.Route] = o.Count
	}
	if n := rep.Errors(); n != 0 || rep.Op("submit job").Count < 20 || rep.Op("agent heartbeat").Count < 10 || rep.Cycles == nil ||
		rep.Jobs["completed"] == 0 || served["POST /api/v1/jobs"] < 20 || served["POST /api/agent/v1/heartbeat"] < 10 || len(rep.Cycles.Phases) == 0 {
		var b strings.Builder
		rep.WriteText(&b) //nolint:errcheck
		t.Errorf("%d errors, or too little done, or figures missing:\n%s", n, b.String())
	}
	if len(started) != 3 {
		t.Fatalf("%d processes started, want 3", len(started))
	}
	for _, c := range started {
		if c.ProcessState == nil {
			t.Errorf("%v: still running (never waited for)", c.Args)
		}
	}
}
