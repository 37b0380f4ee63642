package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/slurmtest"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/allotlabs/allot/web"
)

// Allot on a real Slurm 22.05 cluster (internal/slurmtest), through real
// processes: `allot migrate`, `allot server`, `allot worker --slurm-url …`,
// `allot slurm render|apply|check|sync`, and Slurm's own sbatch/squeue/sacct.

const (
	seEng    = "allot-se1" // the engineer of TestSlurmEndToEnd (and the figures)
	seBad    = "allot-se2" // unused by jobs: TestSlurmBadConfig's cluster account
	seImport = "allot-se3" // the sbatch user of TestSlurmImportSurvivesKill
)

func needSlurm(t *testing.T) {
	t.Helper()
	if ok, why := slurmtest.Available(); !ok {
		t.Skip(why)
	}
}

// slurmArgs are the worker's / `allot slurm`'s flags for cluster c.
func slurmArgs(c *slurmtest.Cluster, extra ...string) []string {
	return append([]string{"--slurm-url", c.RestURL, "--slurm-jwt-key", c.JWTKeyFile, "--slurm-user", c.SlurmUser,
		"--slurm-conf", c.SlurmConf, "--slurm-gpu-type", "h100"}, extra...)
}

// slurmStack is Allot (server + worker) over a private Slurm cluster whose
// accounts, QOS and job_submit.lua Allot rendered, with one engineer of
// team ml mapped to the POSIX account seEng.
type slurmStack struct {
	z         *zero
	c         *slurmtest.Cluster
	pool      *store.Store
	engToken  string
	workerLog string
	serverLog string
}

// startSlurmStack starts it with the worker syncing every sync.
func startSlurmStack(t *testing.T, sync string) *slurmStack {
	t.Helper()
	needSlurm(t)
	ctx := context.Background()
	slurmtest.EnsureUser(t, seEng)
	z := &zero{t: t, env: map[string]string{"DATABASE_URL": storetest.EmptyURL(t)}, dir: t.TempDir()}
	s := &slurmStack{z: z}
	z.must("migrate")
	token := strings.TrimSpace(z.must("bootstrap-admin", "--email", "ops@corp.example"))
	addr := freeAddr(t)
	_, s.serverLog = z.start("server", "server", "--addr", addr)
	z.env["ALLOT_URL"], z.env["ALLOT_TOKEN"] = "http://"+addr, token
	z.eventually(30*time.Second, "the server to be ready", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if out := z.must("gpu-type", "create", "h100", "--memory-gb", "80", "--rate", "3.60", "--backend", "slurm"); !strings.Contains(out, "h100") {
		t.Fatalf("gpu-type create: %q", out)
	}
	if code := z.api("POST", "/api/v1/teams", `{"slug":"ml","name":"Machine Learning","cost_center":"CC-1000","monthly_budget_gpu_hours":1000}`, &struct{}{}); code != http.StatusCreated {
		t.Fatalf("POST /api/v1/teams: %d", code)
	}
	// The engineer signs in through the identity provider (not run here):
	// the user row and a token are what that sign-in leaves.
	pool, err := store.Open(ctx, z.env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s.pool = store.New(pool)
	eng := allot.User{OIDCSubject: "eve", Email: "eve@corp.example", Name: "Eve", Memberships: []allot.Membership{{Team: "ml", Role: allot.TeamRoleMember}}}
	if err := s.pool.CreateUser(ctx, &eng); err != nil {
		t.Fatal(err)
	}
	if s.engToken, _, err = s.pool.CreateAPIToken(ctx, eng.ID, "laptop"); err != nil {
		t.Fatal(err)
	}
	if out := z.must("user", "set-account", "eve@corp.example", seEng); !strings.Contains(out, "run as "+seEng) {
		t.Fatalf("set-account: %q", out)
	}
	// Render Allot's policy into Slurm's config and start Slurm with it.
	dir := filepath.Join(z.dir, "slurm-config")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	overBudget := filepath.Join(dir, "allot-over-budget.live")
	z.must("slurm", "render", "--out", dir, "--slurm-over-budget-file", overBudget)
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	conf, lua := read("slurm-allot.conf"), read("job_submit.lua")
	if !strings.Contains(lua, overBudget) || !strings.Contains(conf, "PreemptType") {
		t.Fatalf("rendered config lacks the over-budget file or preemption:\n%s\n%s", conf, lua)
	}
	s.c = slurmtest.Start(t, slurmtest.Options{Nodes: 2, GPUsPerNode: 4, Users: []string{seEng},
		ConfExtra: conf, JobSubmitLua: lua, Enforce: "associations,limits,qos"})
	if out := z.must("slurm", "apply", "--slurm-conf", s.c.SlurmConf); !strings.Contains(out, "applied") {
		t.Fatalf("slurm apply: %q", out)
	}
	if out := z.must("slurm", "diff", "--slurm-conf", s.c.SlurmConf); !strings.Contains(out, "are what Allot's policy says") {
		t.Fatalf("slurm diff after apply: %q", out)
	}
	_, s.workerLog = z.start("worker", append([]string{"worker", "--metrics-addr", freeAddr(t)},
		slurmArgs(s.c, "--slurm-sync", sync, "--slurm-over-budget-file", overBudget)...)...)
	// The worker syncs Slurm's nodes into Allot.
	z.eventually(30*time.Second, "Slurm's nodes in Allot", func() bool {
		var nodes []string
		for _, n := range s.c.Nodes {
			var node web.NodeJSON
			code, body := z.apiAs(token, "GET", "/api/v1/nodes/"+n, "")
			if code == http.StatusOK && json.Unmarshal(body, &node) == nil && node.GPUs == 4 && node.GPUType == "h100" {
				nodes = append(nodes, n)
			}
		}
		return len(nodes) == len(s.c.Nodes)
	})
	return s
}

func (s *slurmStack) submit(name string, gpus int, cmd ...string) web.JobJSON {
	s.z.t.Helper()
	// workdir: the cluster's own job directory. Without one Allot submits
	// with workdir /tmp, where Slurm writes slurm-<id>.out: other private
	// clusters' job 1, 2 … (other users) leave theirs there.
	b, _ := json.Marshal(map[string]any{"name": name, "team": "ml", "tier": 3, "gpus": gpus, "gpu_type": "h100", "time_limit": "10m", "command": cmd,
		"workdir": s.c.JobsDir})
	code, body := s.z.apiAs(s.engToken, "POST", "/api/v1/jobs", string(b))
	var j web.JobJSON
	if err := json.Unmarshal(body, &j); code != http.StatusCreated || err != nil {
		s.z.t.Fatalf("POST /api/v1/jobs: %d %s", code, body)
	}
	return j
}

func (s *slurmStack) job(id int64) web.JobJSON {
	s.z.t.Helper()
	var j web.JobJSON
	if code := s.z.api("GET", fmt.Sprintf("/api/v1/jobs/%d", id), "", &j); code != http.StatusOK {
		s.z.t.Fatalf("GET job %d: %d", id, code)
	}
	return j
}

// slurmID is the Slurm job id of Allot job id (0: not submitted yet).
func (s *slurmStack) slurmID(id int64) int64 {
	var n int64
	_ = s.pool.Pool().QueryRow(context.Background(), `SELECT coalesce(slurm_job_id, 0) FROM slurm_jobs WHERE job_id = $1`, id).Scan(&n)
	return n
}

// slurmDebug is what Slurm says about job id, and its daemons' log tails.
func (s *slurmStack) slurmDebug(id int64) string {
	var b strings.Builder
	out, _ := s.c.Exec("sacct", "-n", "-P", "-j", strconv.FormatInt(id, 10), "-o", "JobID,User,Account,QOS,State,ExitCode,DerivedExitCode,Reason,WorkDir,NodeList")
	b.WriteString(out)
	logs, _ := filepath.Glob(filepath.Join(s.c.Dir, "log", "*"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		fmt.Fprintf(&b, "==> %s <==\n%s\n", l, strings.Join(lines[max(0, len(lines)-15):], "\n"))
	}
	return b.String()
}

var engineJobIDRe = regexp.MustCompile(`data-testid="engine-job-id">(\d+)<`)

// TestSlurmEndToEnd: from an empty database to a job submitted through
// Allot's API that runs in Slurm as the engineer, completes and is billed
// by Slurm's own accounting; and an sbatch job that shows up in Allot.
func TestSlurmEndToEnd(t *testing.T) {
	s := startSlurmStack(t, "1s")
	z, c := s.z, s.c

	j := s.submit("hello", 2, "sh", "-c", "sleep 3; echo hello from $(id -un); echo USER=$USER HOME=$HOME")
	var done web.JobJSON
	z.eventually(60*time.Second, "the Slurm job to complete in Allot", func() bool {
		done = s.job(j.ID)
		return done.State == "completed" || done.State == "failed" || done.State == "cancelled"
	})
	if done.State != "completed" || done.RunAsUser != seEng || done.StartedAt == nil || done.EndedAt == nil {
		t.Fatalf("job = %+v\nworker log:\n%s\nSlurm:\n%s", done, z.logOf(s.workerLog), s.slurmDebug(s.slurmID(j.ID)))
	}
	// The portal's job page, for the engineer: it runs on Slurm, as job N.
	code, page := z.apiAs(s.engToken, "GET", fmt.Sprintf("/jobs/%d", j.ID), "")
	m := engineJobIDRe.FindSubmatch(page)
	if code != http.StatusOK || !bytes.Contains(page, []byte(`data-testid="engine"`)) || m == nil {
		t.Fatalf("/jobs/%d: %d, no engine article with a Slurm job id", j.ID, code)
	}
	slurmID, _ := strconv.ParseInt(string(m[1]), 10, 64)
	if want := s.slurmID(j.ID); slurmID != want || slurmID == 0 {
		t.Fatalf("page shows Slurm job %d, the database %d", slurmID, want)
	}
	// Slurm's accounting names the engineer, the team's account and tier 3's QOS.
	var elapsed, gpus int64
	z.eventually(30*time.Second, "Slurm's accounting of the job", func() bool {
		out, err := c.Exec("sacct", "-n", "-X", "-P", "-j", strconv.FormatInt(slurmID, 10), "-o", "User,Account,QOS,State,ElapsedRaw,AllocTRES")
		f := strings.Split(strings.TrimSpace(out), "|")
		if err != nil || len(f) != 6 || f[3] != "COMPLETED" {
			return false
		}
		// sacct sometimes names a QOS created just before "Unknown" (its
		// id is not resolved yet); the QOS the job ran with is then what
		// slurmctld said while it was queued or running.
		qos := f[2]
		if qos == "Unknown" {
			_ = s.pool.Pool().QueryRow(context.Background(), `SELECT qos FROM slurm_jobs WHERE slurm_job_id = $1`, slurmID).Scan(&qos)
		}
		if f[0] != seEng || f[1] != "ml" || qos != "allot-t3" {
			t.Fatalf("sacct: %q (QOS %q), want user %s, account ml, QOS allot-t3", out, qos, seEng)
		}
		elapsed, _ = strconv.ParseInt(f[4], 10, 64)
		if g := regexp.MustCompile(`gres/gpu=(\d+)`).FindStringSubmatch(f[5]); g != nil {
			gpus, _ = strconv.ParseInt(g[1], 10, 64)
		}
		return true
	})
	if gpus != 2 || elapsed < 3 {
		t.Fatalf("Slurm: %d GPUs for %d s", gpus, elapsed)
	}
	// Its output, written by the job itself: it ran as the engineer.
	b, err := os.ReadFile(filepath.Join(c.JobsDir, fmt.Sprintf("allot-%d-%d.out", j.ID, slurmID)))
	if err != nil || !strings.Contains(string(b), "hello from "+seEng+"\n") {
		t.Errorf("job output: %q %v", b, err)
	}
	// A REST submission carries no login environment: Allot gives the job
	// the engineer's USER, LOGNAME and HOME, as sbatch would.
	if !strings.Contains(string(b), "USER="+seEng) || !strings.Contains(string(b), "HOME=/") {
		t.Errorf("the job's login environment: %q", b)
	}
	// The run's import: its allocations are closed.
	z.eventually(30*time.Second, "the run imported", func() bool {
		var open, closed int
		_ = s.pool.Pool().QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE released_at IS NULL), count(*) FILTER (WHERE released_at IS NOT NULL)
			FROM allocations WHERE job_id = $1`, j.ID).Scan(&open, &closed)
		return open == 0 && closed == 2
	})

	// Billed: the hourly rollup (as of an hour later, so the job's hour
	// has ended), then the chargeback statement.
	code2, out, errs := z.allotEnv([]string{clock.EnvOffset + "=" + (clock.Offset() + time.Hour).String()}, "billing", "rollup")
	if code2 != 0 {
		t.Fatalf("billing rollup: %d %s %s", code2, out, errs)
	}
	months := []string{done.StartedAt.UTC().Format("2006-01")}
	if e := done.EndedAt.UTC().Format("2006-01"); e != months[0] {
		months = append(months, e)
	}
	var billedHours float64
	var teamSeen bool
	for _, mo := range months {
		var bill web.ChargebackJSON
		if code := z.api("GET", "/api/v1/chargeback?month="+mo, "", &bill); code != http.StatusOK {
			t.Fatalf("chargeback %s: %d", mo, code)
		}
		for _, tm := range bill.Teams {
			teamSeen = teamSeen || tm.Team == "ml"
		}
		for _, l := range bill.Lines {
			if l.JobID != j.ID {
				continue
			}
			if l.Team != "ml" || l.GPUType != "h100" || l.Rate != "3.60" || l.GPUs != 2 {
				t.Errorf("line %+v", l)
			}
			h, err := strconv.ParseFloat(l.GPUHours, 64)
			if err != nil {
				t.Fatal(err)
			}
			billedHours += h
		}
	}
	// Lines give GPU-hours to 4 decimals (0.36 s): within a second of
	// Slurm's elapsed × GPUs.
	if want := float64(elapsed*gpus) / 3600; !teamSeen || math.Abs(billedHours-want)*3600 > 1 {
		t.Errorf("billed %.4f GPU-hours (team ml in the statement: %v), Slurm says %d s × %d GPUs = %.4f", billedHours, teamSeen, elapsed, gpus, want)
	}

	// sbatch directly: the job shows up in Allot's list for the team.
	direct := c.Sbatch(t, seEng, "-A", "ml", "--qos=allot-t4", "--gres=gpu:1", "-J", "direct-sbatch", "--wrap", "sleep 1")
	var found web.JobJSON
	z.eventually(60*time.Second, "the sbatch job in GET /api/v1/jobs?team=ml", func() bool {
		var list web.JobList
		if z.api("GET", "/api/v1/jobs?team=ml", "", &list) != http.StatusOK {
			return false
		}
		for _, lj := range list.Jobs {
			if lj.Name == "direct-sbatch" {
				found = lj
				return lj.State == "completed"
			}
		}
		return false
	})
	if found.Team != "ml" || found.Tier != "4" || found.GPUs != 1 || s.slurmID(found.ID) != direct {
		t.Errorf("sbatch job %d in Allot: %+v (Slurm id %d)", direct, found, s.slurmID(found.ID))
	}
	// Its page, for the engineer: Slurm's job, submitted with sbatch.
	code, page = z.apiAs(s.engToken, "GET", fmt.Sprintf("/jobs/%d", found.ID), "")
	if m := engineJobIDRe.FindSubmatch(page); code != http.StatusOK || m == nil || string(m[1]) != strconv.FormatInt(direct, 10) {
		t.Errorf("/jobs/%d: %d, no engine article with Slurm job %d", found.ID, code, direct)
	}
}

// TestSlurmBadConfig: a worker pointed at a wrong URL or with a wrong key
// stops at once with a message saying which; `allot slurm check` says the
// same, and with the right settings prints what answers.
// TestSlurmSubmitWakesSync: with a sync period of an hour, a job submitted
// through Allot still reaches Slurm at once (the submission wakes the
// sync) and runs there.
func TestSlurmSubmitWakesSync(t *testing.T) {
	t.Parallel()
	s := startSlurmStack(t, "1h")
	t0 := time.Now() // a stopwatch
	j := s.submit("woken", 1, "sleep", "1")
	s.z.eventually(20*time.Second, "the job in Slurm without waiting for the hourly sync", func() bool { return s.slurmID(j.ID) != 0 })
	t.Logf("submitted to Slurm %s after the POST", time.Since(t0).Round(time.Millisecond))
}

func TestSlurmBadConfig(t *testing.T) {
	needSlurm(t)
	slurmtest.EnsureUser(t, seBad)
	z := &zero{t: t, env: map[string]string{"DATABASE_URL": storetest.EmptyURL(t)}, dir: t.TempDir()}
	z.must("migrate")
	c := slurmtest.Start(t, slurmtest.Options{Nodes: 1, GPUsPerNode: 1, Users: []string{seBad}}) // with slurmdbd: on 22.05 only it names a rejected token
	closed := "http://" + freeAddr(t)                                                            // nothing listens there
	wrongKey := filepath.Join(z.dir, "wrong.key")
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if err := os.WriteFile(wrongKey, key, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"wrong URL", []string{"--slurm-url", closed, "--slurm-jwt-key", c.JWTKeyFile, "--slurm-user", "root"}, []string{closed, "not reachable"}},
		{"wrong key", []string{"--slurm-url", c.RestURL, "--slurm-jwt-key", wrongKey, "--slurm-user", "root"}, []string{c.RestURL, "rejected the token"}},
		{"no key", []string{"--slurm-url", c.RestURL, "--slurm-user", "root"}, []string{"--slurm-jwt-key", "--slurm-token-file"}},
	}
	for _, tc := range cases {
		for _, cmd := range [][]string{{"worker", "--metrics-addr", freeAddr(t)}, {"slurm", "check"}} {
			// A stopwatch: the error must come within seconds.
			t0 := time.Now()
			code, out, errs := z.allot(append(cmd, tc.args...)...)
			took := time.Since(t0)
			what := strings.Join(cmd[:1], " ")
			if cmd[0] == "slurm" {
				what = "slurm check"
			}
			if code == 0 || took > 20*time.Second {
				t.Errorf("%s, %s: exit %d after %s\n%s%s", what, tc.name, code, took, out, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs, w) {
					t.Errorf("%s, %s: stderr lacks %q:\n%s", what, tc.name, w, errs)
				}
			}
			t.Logf("%s, %s: exit %d in %s: %s", what, tc.name, code, took.Round(time.Millisecond), lastLine(errs))
		}
	}
	out := z.must(append([]string{"slurm", "check"}, "--slurm-url", c.RestURL, "--slurm-jwt-key", c.JWTKeyFile, "--slurm-user", "root")...)
	if !regexp.MustCompile(`REST v0\.0\.38, Slurm 22\.05\.\d+`).MatchString(out) {
		t.Errorf("slurm check: %q", out)
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// importDB is an empty database migrated by `allot migrate`, with the
// Slurm GPU type h100 and team ml (the admin's setup, written directly).
func importDB(t *testing.T) (*zero, *store.Store) {
	t.Helper()
	ctx := context.Background()
	z := &zero{t: t, env: map[string]string{"DATABASE_URL": storetest.EmptyURL(t)}, dir: t.TempDir()}
	z.must("migrate")
	pool, err := store.Open(ctx, z.env["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st := store.New(pool)
	if err := st.CreateGPUType(ctx, &allot.GPUType{Name: "h100", MemoryGB: 80, HourlyRate: allot.Money{Micros: 3_600_000, Currency: "USD"},
		Backend: allot.BackendSlurm}, st.Now().Add(-48*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTeam(ctx, &allot.Team{Slug: "ml", Name: "ML", CostCenter: "CC-1", FairShareWeight: 1, MonthlyBudgetGPUHours: 1000}); err != nil {
		t.Fatal(err)
	}
	return z, st
}

// importState is what an import leaves, keyed by Slurm's job ids (Allot's
// job ids may differ between databases: a killed transaction uses up ids).
func importState(t *testing.T, st *store.Store) (runs, allocs, jobs string, nRuns int, gpuSeconds int64) {
	t.Helper()
	ctx := context.Background()
	q := func(sql string) string {
		var s string
		if err := st.Pool().QueryRow(ctx, sql).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	runs = q(`SELECT coalesce(string_agg(format('%s@%s seg %s %s %s–%s %s GPUs %s', slurm_job_id, run_start, segment, state, run_start, run_end, gpus, nodes), E'\n'
		ORDER BY slurm_job_id, run_start), '') FROM slurm_runs`)
	allocs = q(`SELECT coalesce(string_agg(format('%s/%s %s:%s %s–%s', sj.slurm_job_id, a.segment, a.node, a.gpu_index, a.started_at, a.released_at), E'\n'
		ORDER BY sj.slurm_job_id, a.segment, a.node, a.gpu_index), '') FROM allocations a JOIN slurm_jobs sj ON sj.job_id = a.job_id`)
	jobs = q(`SELECT coalesce(string_agg(format('%s %s %s %s %s %s %s %s', sj.slurm_job_id, j.state, j.team, j.tier, j.gpus, j.started_at, j.ended_at, sj.origin), E'\n'
		ORDER BY sj.slurm_job_id), '') FROM jobs j JOIN slurm_jobs sj ON sj.job_id = j.id`)
	if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM slurm_runs`).Scan(&nRuns); err != nil {
		t.Fatal(err)
	}
	if err := st.Pool().QueryRow(ctx, `SELECT coalesce(sum(extract(epoch FROM released_at - started_at)), 0)::bigint FROM allocations`).Scan(&gpuSeconds); err != nil {
		t.Fatal(err)
	}
	return
}

var syncLineRe = regexp.MustCompile(`synced in (\S+): .* (\d+) runs \((\d+) new, (\d+) updated\)`)

// sbatchMany submits n one-GPU jobs as user to account ml (every third
// sleeps a second, so that it has GPU-seconds to bill; the others end
// within the second they start) and waits until accounting has all of them
// finished.
func sbatchMany(t *testing.T, c *slurmtest.Cluster, user string, n int) {
	t.Helper()
	t0 := time.Now() // stopwatch
	for i := 0; i < n; i++ {
		wrap := "true"
		if i%3 == 0 {
			wrap = "sleep 1"
		}
		c.Sbatch(t, user, "-A", "ml", "--gres=gpu:1", "-J", fmt.Sprintf("q%03d", i), "-o", "/dev/null", "--wrap", wrap)
	}
	submitted := time.Since(t0)
	deadline := time.Now().Add(60 * time.Second) // a deadline, not product time
	for {
		out, err := c.Exec("sacct", "-n", "-X", "-P", "-a", "-o", "State", "-S", "now-1hours")
		finished := 0
		for _, st := range strings.Fields(out) {
			if st == "COMPLETED" {
				finished++
			}
		}
		if err == nil && finished >= n {
			break
		}
		// a deadline, not product time
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs finished in accounting after 60 s", finished, n)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("%d sbatch jobs: submitted in %s, all finished in accounting after %s", n, submitted.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
}

// TestSlurmImportSurvivesKill: `allot slurm sync` killed with SIGKILL in
// the middle of an accounting import, then run again, leaves exactly what
// one uninterrupted import into a fresh database leaves; a third run
// changes nothing.
func TestSlurmImportSurvivesKill(t *testing.T) {
	needSlurm(t)
	ctx := context.Background()
	slurmtest.EnsureUser(t, seImport)
	c := slurmtest.Start(t, slurmtest.Options{Nodes: 2, GPUsPerNode: 4, Accounts: []string{"ml"}, Users: []string{seImport}})
	since := clock.Now().UTC().Add(-time.Hour).Format(time.RFC3339) // on Allot's clock, as the flag is
	const n = 150
	sbatchMany(t, c, seImport, n)
	args := append([]string{"slurm", "sync"}, slurmArgs(c, "--slurm-import-batch", "5", "--slurm-import-since", since)...)

	// A: killed mid-import, then run to the end.
	za, sta := importDB(t)
	cmd := za.command(nil, args...)
	var killedOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &killedOut, &killedOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var atKill int
	deadline := time.Now().Add(60 * time.Second) // stopwatch
poll:
	for {
		select {
		case <-exited:
			t.Fatalf("allot slurm sync ended before it could be killed mid-import (%d runs in slurm_runs):\n%s", atKill, killedOut.String())
		default:
		}
		_ = sta.Pool().QueryRow(ctx, `SELECT count(*) FROM slurm_runs`).Scan(&atKill)
		if atKill > 0 {
			_ = cmd.Process.Kill()
			<-exited
			break poll
		}
		// a deadline, not product time
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("no run imported after 60 s:\n%s", killedOut.String())
		}
		time.Sleep(time.Millisecond)
	}
	_, _, _, afterKill, _ := importState(t, sta)
	if afterKill >= n {
		t.Fatalf("the kill came too late: %d of %d runs were in", afterKill, n)
	}
	t.Logf("killed with %d runs seen, %d committed of %d", atKill, afterKill, n)
	out := za.must(args...)
	if m := syncLineRe.FindStringSubmatch(out); m == nil || m[3] != strconv.Itoa(n-afterKill) {
		t.Errorf("rerun after the kill: %q, want %d new runs", out, n-afterKill)
	}
	runsA, allocsA, jobsA, nA, gsA := importState(t, sta)

	// B: one uninterrupted import into a fresh database.
	zb, stb := importDB(t)
	t0 := time.Now() // stopwatch
	out = zb.must(args...)
	took := time.Since(t0)
	m := syncLineRe.FindStringSubmatch(out)
	if m == nil || m[3] != strconv.Itoa(n) {
		t.Fatalf("fresh import: %q, want %d new runs", out, n)
	}
	syncTook, _ := time.ParseDuration(m[1])
	t.Logf("import of %d runs in batches of 5: sync %s (%.0f runs/s), process %s", n, syncTook, float64(n)/syncTook.Seconds(), took.Round(time.Millisecond))
	runsB, allocsB, jobsB, nB, gsB := importState(t, stb)

	if nA != n || nB != n {
		t.Errorf("slurm_runs: %d after kill + rerun, %d fresh, want %d", nA, nB, n)
	}
	if gsA != gsB || gsA < int64(n/3) {
		t.Errorf("GPU-seconds: %d after kill + rerun, %d fresh", gsA, gsB)
	}
	for _, d := range []struct{ what, a, b string }{{"runs", runsA, runsB}, {"allocations", allocsA, allocsB}, {"jobs", jobsA, jobsB}} {
		if d.a != d.b {
			t.Errorf("%s differ (after kill + rerun, then fresh): %s", d.what, firstDiff(d.a, d.b))
		}
	}
	if strings.Count(allocsA, "\n")+1 != n {
		t.Errorf("%d allocations for %d one-GPU runs", strings.Count(allocsA, "\n")+1, n)
	}

	// A third run changes nothing.
	out = za.must(args...)
	if m := syncLineRe.FindStringSubmatch(out); m == nil || m[3] != "0" || m[4] != "0" {
		t.Errorf("third run: %q, want 0 new, 0 updated", out)
	}
	runs3, allocs3, jobs3, _, gs3 := importState(t, sta)
	if runs3 != runsA || allocs3 != allocsA || jobs3 != jobsA || gs3 != gsA {
		t.Errorf("the third run changed the import")
	}
}

// firstDiff shows the first differing line of two texts.
func firstDiff(a, b string) string {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < max(len(la), len(lb)); i++ {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			return fmt.Sprintf("line %d (of %d / %d):\n  %s\n  %s", i+1, len(la), len(lb), x, y)
		}
	}
	return "(same)"
}

// TestSlurmFigures measures (opt-in: ALLOT_SLURM_FIGURES=1) submit latency
// through Allot to Slurm-running next to plain sbatch, and the accounting
// import speed of `allot slurm sync`. Nothing is asserted about timings.
func TestSlurmFigures(t *testing.T) {
	if os.Getenv("ALLOT_SLURM_FIGURES") == "" {
		t.Skip("takes ~2 min; run with ALLOT_SLURM_FIGURES=1")
	}
	s := startSlurmStack(t, "5s")
	c := s.c
	const n = 50
	running := func(id int64) bool {
		out, err := c.Exec("squeue", "-h", "-j", strconv.FormatInt(id, 10), "-o", "%T")
		return err == nil && strings.TrimSpace(out) == "RUNNING"
	}
	// Wall-clock stopwatches throughout.
	var viaAllot, viaSbatch []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now() // a stopwatch
		j := s.submit(fmt.Sprintf("lat%02d", i), 1, "sleep", "2")
		var id int64
		for {
			if id == 0 {
				id = s.slurmID(j.ID)
			}
			if id != 0 && running(id) {
				break
			}
			if time.Since(t0) > 30*time.Second {
				t.Fatalf("job %d not running in Slurm after 30 s\n%s", j.ID, s.z.logOf(s.workerLog))
			}
			time.Sleep(20 * time.Millisecond)
		}
		viaAllot = append(viaAllot, time.Since(t0))
	}
	for i := 0; i < n; i++ {
		t0 := time.Now() // a stopwatch
		id := c.Sbatch(t, seEng, "-A", "ml", "--qos=allot-t3", "--gres=gpu:1", "-J", fmt.Sprintf("sb%02d", i), "-o", "/dev/null", "--wrap", "sleep 2")
		for !running(id) {
			if time.Since(t0) > 30*time.Second {
				t.Fatalf("sbatch job %d not running after 30 s", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
		viaSbatch = append(viaSbatch, time.Since(t0))
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[int(math.Ceil(p*float64(len(d))))-1].Round(time.Millisecond)
	}
	t.Logf("FIGURE submit → RUNNING (squeue), %d jobs each: through Allot (POST /api/v1/jobs, worker --slurm-sync 5s: a submission wakes the sync) p50 %s p99 %s; plain sbatch p50 %s p99 %s",
		n, pct(viaAllot, .5), pct(viaAllot, .99), pct(viaSbatch, .5), pct(viaSbatch, .99))

	// Import speed: more finished runs, then one import into a fresh database.
	sbatchMany(t, c, seEng, 200)
	deadline := time.Now().Add(60 * time.Second) // a deadline, not product time
	for {
		out, _ := c.Exec("squeue", "-h")
		if strings.TrimSpace(out) == "" {
			break
		}
		// a deadline, not product time
		if time.Now().After(deadline) {
			t.Fatalf("jobs still queued: %s", out)
		}
		time.Sleep(250 * time.Millisecond)
	}
	zb, _ := importDB(t)
	for _, batch := range []string{"200", "20"} {
		zb2, _ := importDB(t)
		if batch == "200" {
			zb2 = zb
		}
		t0 := time.Now() // a stopwatch
		out := zb2.must(append([]string{"slurm", "sync"}, slurmArgs(c, "--slurm-import-batch", batch,
			"--slurm-import-since", clock.Now().UTC().Add(-time.Hour).Format(time.RFC3339))...)...)
		took := time.Since(t0)
		m := syncLineRe.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("sync: %q", out)
		}
		d, _ := time.ParseDuration(m[1])
		runs, _ := strconv.Atoi(m[3])
		t.Logf("FIGURE import (batch %s): %d new runs in %s = %.0f runs/s (process incl. start %s); %s", batch, runs, d, float64(runs)/d.Seconds(), took.Round(time.Millisecond), strings.TrimSpace(out))
	}
}
