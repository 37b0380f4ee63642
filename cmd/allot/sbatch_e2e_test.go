package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/demo"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

// slurmScript is a batch script as a Slurm user has it: a shebang,
// multi-line #SBATCH directives with a typed GRES, an account, a
// D-HH:MM:SS time, an export list, and some that Allot ignores.
const slurmScript = `#!/bin/bash
#
# Fine-tune on two A100s.
#SBATCH --job-name=llm-finetune
#SBATCH --account=nlp
#SBATCH --gres=gpu:a100:2
#SBATCH --nodes=1
#SBATCH --time=0-00:05:00        # five minutes
#SBATCH --qos=Experiment
#SBATCH --chdir=%s
#SBATCH --export=WANDB_MODE=offline,SBATCH_E2E_FROM_SHELL
#SBATCH --output=slurm-%%j.out
#SBATCH --mail-type=END,FAIL

set -euo pipefail
echo "args=$* pwd=$(pwd) wandb=$WANDB_MODE shell=$SBATCH_E2E_FROM_SHELL"
echo "gpus=$CUDA_VISIBLE_DEVICES team=$ALLOT_TEAM bash=${BASH_VERSION:+yes}"
`

func writeScript(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSbatchScriptRunsOnANode submits a Slurm batch script to a real
// server with a real agent: the job has the script's team, GPUs, type,
// limit, name, workdir and env, and the node runs the script (its output
// is the job's log). Bad directives exit non-zero and submit nothing.
func TestSbatchScriptRunsOnANode(t *testing.T) {
	l := bootLive(t, "gpu01")
	work := jobTempDir(t)
	// --export=NAME takes $NAME from here: a name no other test uses, set
	// without t.Setenv (this test is parallel).
	os.Setenv("SBATCH_E2E_FROM_SHELL", "from my shell") //nolint:errcheck
	t.Cleanup(func() { os.Unsetenv("SBATCH_E2E_FROM_SHELL") })
	script := writeScript(t, t.TempDir(), "finetune.sh", fmt.Sprintf(slurmScript, work))

	rc, out, errOut := l.cli(demo.Engineer, "submit", "--parsable", script, "--lr", "3e-4")
	if rc != 0 {
		t.Fatalf("submit: rc=%d out=%q err=%q", rc, out, errOut)
	}
	var id int64
	if _, err := fmt.Sscanf(out, "%d\n", &id); err != nil || out != fmt.Sprintf("%d\n", id) {
		t.Fatalf("--parsable printed %q", out)
	}
	for _, w := range []string{
		"allot submit: warning: #SBATCH --output (line 12) ignored: Allot keeps the job's output itself",
		"allot submit: warning: #SBATCH --mail-type (line 13) ignored",
	} {
		if !strings.Contains(errOut, w) {
			t.Errorf("stderr lacks %q:\n%s", w, errOut)
		}
	}
	j := l.job(id)
	if j.Team != "nlp" || j.GPUs != 2 || j.GPUType == nil || *j.GPUType != "A100-80GB" || j.TimeLimitS != 300 || j.Name != "llm-finetune" ||
		j.Tier != "3" || j.WorkDir != work || j.Env["WANDB_MODE"] != "offline" || j.Env["SBATCH_E2E_FROM_SHELL"] != "from my shell" || j.Checkpointable {
		t.Errorf("job = %+v", j)
	}
	got := l.waitJob(id, 30*time.Second, func(j web.JobJSON) bool { return j.State == "completed" || j.State == "failed" }, "done")
	code, _, b := l.api("GET", fmt.Sprintf("/api/v1/jobs/%d/log", id), demo.Engineer, "")
	var lg web.JobLogJSON
	json.Unmarshal(b, &lg) //nolint:errcheck
	want := []string{
		fmt.Sprintf("args=--lr 3e-4 pwd=%s wandb=offline shell=from my shell", work),
		"gpus=0,1 team=nlp bash=yes",
	}
	if got.State != "completed" || code != 200 || strings.Join(lg.Lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("job %s (%s), log %d:\n%s\nwant:\n%s", got.State, got.EndReason, code, strings.Join(lg.Lines, "\n"), strings.Join(want, "\n"))
	}

	// --wrap, as sbatch.
	rc, out, errOut = l.cli(demo.Engineer, "submit", "--json", "--team", "nlp", "--time", "5", "--wrap", "echo wrapped $((6*7))")
	var wj web.JobJSON
	if rc != 0 || json.Unmarshal([]byte(out), &wj) != nil || wj.Name != "wrap" || wj.TimeLimitS != 300 {
		t.Fatalf("--wrap: rc=%d %s %s", rc, out, errOut)
	}
	l.waitJob(wj.ID, 30*time.Second, func(j web.JobJSON) bool { return j.State == "completed" }, "completed")
	if lines, _ := l.m.Store.JobLog(t.Context(), wj.ID); len(lines) != 1 || !strings.Contains(fmt.Sprint(lines[0]), "wrapped 42") {
		t.Errorf("--wrap log %v", lines)
	}

	// Bad directives: a clear error, exit 2, nothing submitted.
	before := l.jobCount()
	dir := t.TempDir()
	for _, c := range []struct{ script, say string }{
		{"#!/bin/sh\n#SBATCH -A nlp -t 10\n#SBATCH --array=0-9\necho x\n", "#SBATCH --array (line 3) cannot be honoured: Allot has no job arrays"},
		{"#!/bin/sh\n#SBATCH -A nlp --time=1-99\necho x\n", "#SBATCH --time (line 2): invalid time limit"},
		{"#!/bin/sh\n#SBATCH -A nlp --time=UNLIMITED\n", "Allot jobs need a time limit"},
		{"#!/bin/sh\n#SBATCH -A nlp -t 10 --qos=platinum\n", "#SBATCH --qos=platinum (line 2): no such tier; the tiers are 1 (Production incident), 2"},
		{"#!/bin/sh\n#SBATCH -A nlp -t 10 --nodes=2\n", "say how many GPUs each node needs"},
		{"echo no shebang\n", "the first line must start with #!"},
		{"#!/bin/sh\n#SBATCH -t 10\n", "--team is required (or #SBATCH --account)"},
	} {
		p := writeScript(t, dir, "bad.sh", c.script)
		if rc, out, errOut := l.cli(demo.Engineer, "submit", p); rc != 2 || out != "" || !strings.Contains(errOut, c.say) {
			t.Errorf("%q: rc=%d out=%q err=%q, want 2 and %q", c.script, rc, out, errOut, c.say)
		}
	}
	// The server's checks still apply: above the tier's maximum.
	p := writeScript(t, dir, "long.sh", "#!/bin/sh\n#SBATCH -A nlp --time=8-00:00:00\n")
	if rc, _, errOut := l.cli(demo.Engineer, "submit", p); rc != 1 || !strings.Contains(errOut, "time_limit_s: at most 7d for tier 3") {
		t.Errorf("8 days: rc=%d %s", rc, errOut)
	}
	if rc, _, errOut := l.cli(demo.Engineer, "submit", filepath.Join(dir, "missing.sh")); rc != 2 || !strings.Contains(errOut, "no such batch script") {
		t.Errorf("missing script: rc=%d %s", rc, errOut)
	}
	if after := l.jobCount(); after != before {
		t.Errorf("bad directives submitted %d jobs", after-before)
	}
}

// fakeSubmitServer answers the calls allot submit makes and keeps the
// job requests.
type fakeSubmitServer struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []web.JobRequest
}

func newFakeSubmitServer(t *testing.T) *fakeSubmitServer {
	f := &fakeSubmitServer{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.Method + " " + r.URL.Path {
		case "GET /api/v1/tiers":
			json.NewEncoder(w).Encode(map[string]any{"tiers": []store.TierValues{{ID: "1", Name: "Production incident"}, {ID: "3", Name: "Experiment"}, {ID: "preemptible", Name: "Preemptible"}}}) //nolint:errcheck
		case "GET /api/v1/gpu-types":
			json.NewEncoder(w).Encode(web.GPUTypeList{GPUTypes: []web.GPUTypeJSON{{Name: "A100-80GB"}, {Name: "T4"}}}) //nolint:errcheck
		case "POST /api/v1/jobs":
			var req web.JobRequest
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				t.Error(err)
			}
			f.mu.Lock()
			f.reqs = append(f.reqs, req)
			n := len(f.reqs)
			f.mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(web.JobJSON{ID: int64(100 + n), Name: req.Name, State: "pending"}) //nolint:errcheck
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeSubmitServer) submit(args ...string) (int, string, string, *web.JobRequest) {
	f.mu.Lock()
	n := len(f.reqs)
	f.mu.Unlock()
	var out, errb bytes.Buffer
	rc := run(append([]string{"submit", "--server", f.URL, "--token", "t"}, args...), &out, &errb)
	f.mu.Lock()
	defer f.mu.Unlock()
	var req *web.JobRequest
	if len(f.reqs) > n {
		req = &f.reqs[len(f.reqs)-1]
	}
	return rc, out.String(), errb.String(), req
}

func tierOf(r *web.JobRequest) string {
	var s string
	json.Unmarshal(r.Tier, &s) //nolint:errcheck
	return s
}

// TestSubmitFlagsEnvAndDirectives: the command line wins over ALLOT_*
// variables (ALLOT_SUBMIT_<FLAG> over ALLOT_<FLAG>), which win over
// #SBATCH lines; the job's own variables (ALLOT_TEAM) are not read; a bad
// variable is an error naming it. Not parallel: it sets the environment.
func TestSubmitFlagsEnvAndDirectives(t *testing.T) {
	f := newFakeSubmitServer(t)
	dir := t.TempDir()
	script := writeScript(t, dir, "job.sh", "#!/bin/bash\n#SBATCH --job-name=from-script -A script-team\n#SBATCH --gres=gpu:t4:2 --time=10 -p tier1\necho hi\n")

	rc, out, errOut, req := f.submit(script)
	if rc != 0 || req == nil || req.Name != "from-script" || req.Team != "script-team" || *req.GPUs != 2 || req.GPUType != "T4" ||
		req.GPUsPerNode != 2 || *req.TimeLimitS != 600 || tierOf(req) != "1" || req.Command[0] != "/bin/sh" || req.Command[3] != "job.sh" {
		t.Fatalf("script only: rc=%d %s %s %+v", rc, out, errOut, req)
	}
	t.Setenv("ALLOT_TEAM", "a-jobs-team") // set inside jobs: never read
	t.Setenv("ALLOT_NAME", "not-read")    // only the shared flags (--server ...) read ALLOT_<FLAG>
	t.Setenv("ALLOT_SUBMIT_TIME", "1:00:00")
	rc, _, errOut, req = f.submit(script)
	if rc != 0 || req.Name != "from-script" || req.Team != "script-team" || *req.TimeLimitS != 3600 {
		t.Fatalf("env over script: rc=%d %s %+v", rc, errOut, req)
	}
	t.Setenv("ALLOT_SUBMIT_NAME", "from-submit-env")
	if rc, _, errOut, req = f.submit(script); rc != 0 || req.Name != "from-submit-env" {
		t.Fatalf("ALLOT_SUBMIT_NAME: rc=%d %s %+v", rc, errOut, req)
	}
	// An sbatch spelling from the environment: below the command line.
	t.Setenv("ALLOT_SUBMIT_ACCOUNT", "acct-env")
	if rc, _, errOut, req = f.submit(script); rc != 0 || req.Team != "acct-env" {
		t.Fatalf("ALLOT_SUBMIT_ACCOUNT: rc=%d %s %+v", rc, errOut, req)
	}
	if rc, _, errOut, req = f.submit("-A", "acct-cmdline", script); rc != 0 || req.Team != "acct-cmdline" {
		t.Fatalf("-A over ALLOT_SUBMIT_ACCOUNT: rc=%d %s %+v", rc, errOut, req)
	}
	t.Setenv("ALLOT_SUBMIT_ACCOUNT", "")
	// -t and -G are sbatch's: over the variables and the script, under --time and --gpus.
	if rc, _, errOut, req = f.submit("-t", "5", "-G", "t4:3", script); rc != 0 || *req.TimeLimitS != 300 || *req.GPUs != 3 || req.GPUType != "T4" {
		t.Fatalf("-t over ALLOT_SUBMIT_TIME: rc=%d %s %+v", rc, errOut, req)
	}
	if rc, _, errOut, req = f.submit("-t", "5", "--time", "7", "-G", "3", "--gpus", "4", script); rc != 0 || *req.TimeLimitS != 420 || *req.GPUs != 4 {
		t.Fatalf("--time over -t: rc=%d %s %+v", rc, errOut, req)
	}
	t.Setenv("ALLOT_SUBMIT_TEAM", "env-team")
	rc, _, errOut, req = f.submit("--name", "from-cmdline", "--time", "240", "--gpus", "4", "-q", "preemptible", script)
	if rc != 0 || req.Name != "from-cmdline" || req.Team != "env-team" || *req.TimeLimitS != 4*3600 || *req.GPUs != 4 || req.GPUType != "T4" ||
		req.GPUsPerNode != 2 || tierOf(req) != "preemptible" {
		t.Fatalf("command line over env: rc=%d %s %+v", rc, errOut, req)
	}
	t.Setenv("ALLOT_SUBMIT_GPUS", "lots")
	if rc, _, errOut, req := f.submit(script); rc != 2 || req != nil || !strings.Contains(errOut, `$ALLOT_SUBMIT_GPUS="lots" for --gpus`) {
		t.Errorf("bad variable: rc=%d %q %+v", rc, errOut, req)
	}
	t.Setenv("ALLOT_SUBMIT_GPUS", "")

	// The other forms: -- COMMAND and --wrap; sbatch spellings on the
	// command line; the tier by name; a partition that is no tier.
	rc, _, errOut, req = f.submit("-J", "x", "--time", "4h", "--qos=experiment", "--gres", "gpu:a100:8", "-N", "2", "--export", "A=1,B", "--env", "A=2", "--", "python", "train.py")
	if rc != 0 || req.Name != "x" || strings.Join(req.Command, " ") != "python train.py" || tierOf(req) != "3" || *req.GPUs != 16 || req.GPUsPerNode != 8 ||
		req.GPUType != "A100-80GB" || req.Env["A"] != "2" || len(req.Env) != 1 || !strings.Contains(errOut, "--export=B ignored: $B is not set here") {
		t.Fatalf("-- command: rc=%d %s %+v", rc, errOut, req)
	}
	t.Setenv("ALLOT_SUBMIT_NAME", "")
	rc, out, errOut, req = f.submit("--parsable", "--time", "1-0", "--partition", "gpu", "--wrap", "nvidia-smi && echo ok")
	if rc != 0 || out != fmt.Sprintf("%d\n", 100+len(f.reqs)) || req.Name != "wrap" || strings.Join(req.Command, "|") != "/bin/sh|-c|nvidia-smi && echo ok" || *req.TimeLimitS != 86400 ||
		tierOf(req) != "3" || !strings.Contains(errOut, "--partition=gpu ignored: it names no tier") {
		t.Fatalf("--wrap: rc=%d %q %s %+v", rc, out, errOut, req)
	}

	// Refused before anything is sent.
	big := writeScript(t, dir, "big.sh", "#!/bin/sh\n"+strings.Repeat("# padding padding padding\n", 700))
	for _, c := range []struct {
		args []string
		say  string
	}{
		{[]string{"--time", "0", "--", "x"}, "--time: Allot jobs need a time limit"},
		{[]string{"--time", "-5", "--", "x"}, "must be positive"},
		{[]string{"--time", "soon", "--", "x"}, "--time: invalid time limit \"soon\": use MINUTES, MM:SS, HH:MM:SS"},
		{[]string{"--time", "10", "--wrap", "x", "--", "y"}, "--wrap and a command after --: give one"},
		{[]string{"--time", "10", "--array", "1-3", "--", "y"}, "flag provided but not defined: -array"},
		{[]string{"--time", "10", big}, "too long to send with the job"},
		{[]string{"--time", "10", "--nodes", "1-2", "--", "x"}, "--nodes=1-2: a range of node counts cannot be honoured"},
		{[]string{"--time", "10", "python", "train.py"}, "python: no such batch script (to run a program, put it after --"},
		{[]string{"--time", "10"}, "the command is missing"},
	} {
		rc, _, errOut, req := f.submit(c.args...)
		if rc != 2 || req != nil || !strings.Contains(errOut, c.say) {
			t.Errorf("%q: rc=%d %q %+v, want exit 2 with %q", c.args, rc, errOut, req, c.say)
		}
	}
	// A script on stdin.
	submitStdin = strings.NewReader("#!/bin/sh\n#SBATCH -t 5\necho from stdin\n")
	defer func() { submitStdin = os.Stdin }()
	if rc, _, errOut, req := f.submit("-"); rc != 0 || req.Name != "stdin" || !strings.Contains(req.Command[2], "echo from stdin") {
		t.Errorf("stdin: rc=%d %s %+v", rc, errOut, req)
	}
}
