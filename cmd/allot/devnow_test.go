package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/internal/store/storetest"
	"github.com/allotlabs/allot/web"
)

// devArgsEnv makes the test binary run `allot dev` with these arguments:
// dev --now shifts the clock of its whole process, so it runs apart from
// the tests.
const devArgsEnv = "ALLOT_TEST_DEV_ARGS"

func init() {
	if args, ok := os.LookupEnv(devArgsEnv); ok {
		os.Exit(run(append([]string{"dev"}, strings.Fields(args)...), os.Stdout, os.Stderr))
	}
}

// TestDevNow: `allot dev --now` runs the whole demo — server, worker,
// in-process agents, billing — as if it were the first seconds of a month:
// the demo seeds as of that instant with the documented budgets, last
// month is billed complete, this month is the new one, and the agents
// register and heartbeat on the same timeline. A bad --now is refused.
func TestDevNow(t *testing.T) {
	t.Parallel()
	const at = "2027-03-01T00:00:20Z"
	dir := jobTempDir(t) // the demo's job accounts reach .allot/work under it
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), devArgsEnv+"=--now "+at+" --addr 127.0.0.1:0 --no-oidc --database-url "+storetest.URL(t)+
		" --data-dir "+filepath.Join(dir, "pgdata"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill() //nolint:errcheck
			t.Error("allot dev did not stop within 20 s of SIGTERM")
		}
	})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "Allot is running at "); ok {
				urls <- strings.Fields(u)[0]
			}
		}
		io.Copy(io.Discard, stdout) //nolint:errcheck
		exited <- cmd.Wait()
	}()
	var base string
	select {
	case base = <-urls:
	case err := <-exited:
		t.Fatalf("allot dev exited: %v\n%s", err, stderr.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("allot dev did not start in 90 s\n%s", stderr.String())
	}
	// The tokens file follows the "running" line.
	var env []byte
	for wait := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) { // a deadline
		env, err = os.ReadFile(filepath.Join(dir, "tokens.env"))
		if err == nil && strings.Contains(string(env), "ALLOT_URL") {
			break
		}
		if time.Now().After(wait) { // deadline (real time)
			t.Fatalf("no tokens file: %v\n%s", err, stderr.String())
		}
	}
	tokens := map[string]string{}
	for _, line := range strings.Split(string(env), "\n") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "="); ok {
			tokens[k] = strings.Trim(v, `'"`)
		}
	}
	get := func(path, token string, out any) int {
		t.Helper()
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if out != nil {
			json.NewDecoder(resp.Body).Decode(out) //nolint:errcheck
		}
		return resp.StatusCode
	}
	var budget web.BudgetJSON
	if code := get("/api/v1/teams/nlp/budget", tokens["ALLOT_TOKEN_LEAD"], &budget); code != 200 || budget.Month != "2027-03" || budget.BudgetGPUHours != 4000 {
		t.Errorf("nlp budget at %s: %d %+v; want month 2027-03 and 4000 GPU-h", at, code, budget)
	}
	// In a month's first seconds the lead still has a story: last month's.
	if l := budget.LastMonth; l == nil || l.Month != "2027-02" || l.UsedPct < 104 {
		t.Errorf("nlp last month at %s: %+v, want February 2027 at 104 %% or more", at, l)
	}
	// Last month's bill is rolled up and complete.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var cb web.ChargebackJSON
		code := get("/api/v1/chargeback?month=2027-02", tokens["ALLOT_TOKEN_FINANCE"], &cb)
		if code == 200 && len(cb.Teams) == 3 && cb.Total.Amount != "" && cb.Total.Amount != "0.00" {
			break
		}
		if time.Now().After(deadline) { // deadline (real time)
			t.Fatalf("no bill for February 2027 after 60 s: %d %+v", code, cb.Teams)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The in-process agents heartbeat on the shifted timeline: nodes come
	// up (a heartbeat stamped at the real time would be months in the past).
	deadline = time.Now().Add(60 * time.Second)
	for {
		var nodes struct {
			Nodes []struct {
				Name  string `json:"name"`
				State string `json:"state"`
			} `json:"nodes"`
		}
		get("/api/v1/nodes", tokens["ALLOT_TOKEN_ADMIN"], &nodes)
		up := 0
		for _, n := range nodes.Nodes {
			if n.State == "up" {
				up++
			}
		}
		if up == 16 {
			break
		}
		if time.Now().After(deadline) { // deadline (real time)
			t.Fatalf("%d of 16 nodes up after 60 s", up)
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The README's example runs as written: python3 train.py in the demo's
	// job directory (.allot/work next to --data-dir), its output in the log.
	if _, err := exec.LookPath("python3"); err != nil {
		t.Log("no python3: the README example is not run")
	} else {
		body := `{"team":"nlp","tier":3,"gpus":8,"gpu_type":"A100-80GB","time_limit":"4h","command":["python3","train.py","--lr","3e-4"]}`
		req, _ := http.NewRequest("POST", base+"/api/v1/jobs", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tokens["ALLOT_TOKEN"])
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var job web.JobJSON
		json.NewDecoder(resp.Body).Decode(&job) //nolint:errcheck
		resp.Body.Close()
		if resp.StatusCode != 201 {
			t.Fatalf("submitting the README example: %d", resp.StatusCode)
		}
		for wait := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) { // a deadline
			var log web.JobLogJSON
			get(fmt.Sprintf("/api/v1/jobs/%d/log", job.ID), tokens["ALLOT_TOKEN"], &log)
			if l := strings.Join(log.Lines, "\n"); strings.Contains(l, "train: args ['--lr', '3e-4']") {
				break
			} else if time.Now().After(wait) || strings.Contains(l, "can't open file") { // deadline (real time)
				t.Fatalf("the README example did not run in the demo's job directory: %q", l)
			}
		}
		if st, err := os.Stat(filepath.Join(dir, "work", "train.py")); err != nil || st.Size() == 0 {
			t.Errorf("no .allot/work/train.py: %v", err)
		}
	}
	pool, err := store.Open(context.Background(), strings.TrimSpace(cmdDatabaseURL(cmd.Env)))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	seededAt, ok, err := store.New(pool).Meta(context.Background(), demo.SeededKey)
	if err != nil || !ok || !strings.HasPrefix(seededAt, "2027-03-01T00:0") {
		t.Errorf("demo seeded as of %q (%v, %v), want the first minutes of 2027-03-01", seededAt, ok, err)
	}
}

// cmdDatabaseURL finds --database-url in the dev arguments of env.
func cmdDatabaseURL(env []string) string {
	for _, kv := range env {
		if args, ok := strings.CutPrefix(kv, devArgsEnv+"="); ok {
			f := strings.Fields(args)
			for i := range f {
				if f[i] == "--database-url" && i+1 < len(f) {
					return f[i+1]
				}
			}
		}
	}
	return ""
}

func TestDevNowRefusesBadInstant(t *testing.T) {
	t.Parallel()
	var out, errOut strings.Builder
	if rc := devMain(context.Background(), []string{"--now", "yesterday"}, &out, &errOut); rc != 2 || !strings.Contains(errOut.String(), "RFC 3339") {
		t.Errorf("dev --now yesterday: rc %d, %q", rc, errOut.String())
	}
}
