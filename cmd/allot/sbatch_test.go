package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/web"
)

func TestParseBatchScript(t *testing.T) {
	s, err := parseBatchScript(`#!/bin/bash -l
# a comment
#SBATCH --job-name=train-llm
#SBATCH -A nlp
#SBATCH --gres=gpu:a100:4   # four per node
#SBATCH -N2 --time 1-12:00:00
  #SBATCH --export="WANDB_MODE=offline,HOME"
##SBATCH --array=1-10
# SBATCH --dependency=afterok:1
#SBATCH --frobnicate=yes
#SBATCHX --qos=1

#SBATCH --qos tier1
set -e
#SBATCH --account=after-the-first-command
echo hi
`)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(s.interpreter, "|") != "/bin/bash|-l" {
		t.Errorf("interpreter %q", s.interpreter)
	}
	var got []string
	for _, d := range s.directives {
		got = append(got, fmt.Sprintf("%s=%s@%d", d.opt.long, d.value, d.line))
	}
	want := "job-name=train-llm@3 account=nlp@4 gres=gpu:a100:4@5 nodes=2@6 time=1-12:00:00@6 export=WANDB_MODE=offline,HOME@7 qos=tier1@13"
	if strings.Join(got, " ") != want {
		t.Errorf("directives:\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	if len(s.warnings) != 1 || !strings.Contains(s.warnings[0], "#SBATCH --frobnicate (line 10) ignored") {
		t.Errorf("warnings %q", s.warnings)
	}
	for in, msg := range map[string]string{
		"echo hi\n":                          "first line must start with #!",
		"#!bash\n":                           "absolute path",
		"#!/bin/sh\n#SBATCH --job-name\n":    "#SBATCH --job-name (line 2) needs a value",
		"#!/bin/sh\n#SBATCH --requeue=yes\n": "takes no value",
		"#!/bin/sh\n#SBATCH -J 'open\n":      "line 2: unterminated ' quote",
		"#!/bin/sh\n#SBATCH nodes=2\n":       "is not an option",
	} {
		if _, err := parseBatchScript(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: %v, want %q", in, err, msg)
		}
	}
}

func directivesOf(t *testing.T, lines ...string) []directive {
	t.Helper()
	s, err := parseBatchScript("#!/bin/sh\n#SBATCH " + strings.Join(lines, "\n#SBATCH ") + "\n")
	if err != nil {
		t.Fatal(err)
	}
	return s.directives
}

func TestApplyDirectives(t *testing.T) {
	env := func(k string) (string, bool) {
		v, ok := map[string]string{"HOME": "/home/noah", "EMPTY": ""}[k]
		return v, ok
	}
	tests := []struct {
		lines []string
		check func(batchJob) bool
		warn  string
	}{
		{[]string{"--gres=gpu:a100:4", "--nodes=2"}, func(j batchJob) bool { return j.gpus == 8 && j.gpusPerNode == 4 && j.gpuType == "a100" }, ""},
		{[]string{"--gres=gpu:2"}, func(j batchJob) bool { return j.gpus == 2 && j.gpusPerNode == 2 && j.gpuType == "" }, ""},
		{[]string{"--gres=gpu"}, func(j batchJob) bool { return j.gpus == 1 && j.gpusPerNode == 1 }, ""},
		{[]string{"--gres=gpu:h100"}, func(j batchJob) bool { return j.gpus == 1 && j.gpuType == "h100" }, ""},
		{[]string{"--gres=gpu:2,shard:1"}, func(j batchJob) bool { return j.gpus == 2 }, "#SBATCH --gres=shard:1 (line 2) ignored: Allot schedules GPUs only"},
		{[]string{"-G a100:16", "-N 2"}, func(j batchJob) bool { return j.gpus == 16 && j.gpusPerNode == 8 && j.gpuType == "a100" }, ""},
		{[]string{"--gpus=4"}, func(j batchJob) bool { return j.gpus == 4 && j.gpusPerNode == 0 }, ""},
		{[]string{"--gpus-per-node=8", "--nodes=3-3"}, func(j batchJob) bool { return j.gpus == 24 && j.gpusPerNode == 8 }, ""},
		{[]string{"--ntasks-per-node=8", "--gpus-per-task=1", "--nodes=2", "--cpus-per-task=6"},
			func(j batchJob) bool { return j.gpus == 16 && j.gpusPerNode == 8 && j.cpus == "48" }, ""},
		{[]string{"--ntasks=4", "--gpus-per-task=t4:2"}, func(j batchJob) bool { return j.gpus == 8 && j.gpusPerNode == 0 && j.gpuType == "t4" }, ""},
		{[]string{"--gpus=16", "--gpus-per-node=8"}, func(j batchJob) bool { return j.gpus == 16 && j.gpusPerNode == 8 }, ""},
		{[]string{"-J a", "--job-name=b"}, func(j batchJob) bool { return j.name == "b" }, ""}, // the later wins
		{[]string{"--requeue"}, func(j batchJob) bool { return j.requeue != nil && *j.requeue }, ""},
		{[]string{"--requeue", "--no-requeue"}, func(j batchJob) bool { return j.requeue != nil && !*j.requeue }, ""},
		{[]string{"--chdir=runs/a"}, func(j batchJob) bool { return j.workdir == "/work/here/runs/a" }, ""},
		{[]string{"-D /scratch/x/"}, func(j batchJob) bool { return j.workdir == "/scratch/x" }, ""},
		{[]string{"--mem=64G"}, func(j batchJob) bool { return j.memory == "64GiB" }, ""},
		{[]string{"--mem=500"}, func(j batchJob) bool { return j.memory == "500MiB" }, ""},
		{[]string{"--mem=0"}, func(j batchJob) bool { return j.memory == "" }, ""},
		{[]string{"--mem-per-gpu=40G", "--gres=gpu:4", "-N 2"}, func(j batchJob) bool { return j.memory == "160GiB" }, ""},
		{[]string{"--mem-per-gpu=500", "--gpus=2", "--nodes=1"}, func(j batchJob) bool { return j.memory == "1000MiB" }, ""},
		{[]string{"--container-image=nvcr.io#nvidia/pytorch:24.05-py3"}, func(j batchJob) bool { return j.image == "nvcr.io/nvidia/pytorch:24.05-py3" }, ""},
		{[]string{"--export=A=1,HOME,EMPTY", "--export=B=x=y"},
			func(j batchJob) bool {
				return j.env["A"] == "1" && j.env["HOME"] == "/home/noah" && j.env["B"] == "x=y" && j.env["EMPTY"] == "" && strings.Join(j.envOrder, ",") == "A,HOME,EMPTY,B"
			}, ""},
		{[]string{"--export=NONE"}, func(j batchJob) bool { return len(j.env) == 0 }, ""},
		{[]string{"--export=ALL,A=1"}, func(j batchJob) bool { return j.env["A"] == "1" && len(j.env) == 1 }, "#SBATCH --export=ALL (line 2) ignored"},
		{[]string{"--export=UNSET_HERE"}, func(j batchJob) bool { return len(j.env) == 0 }, "$UNSET_HERE is not set here"},
		{[]string{"--output=slurm-%j.out"}, func(j batchJob) bool { return true }, "#SBATCH --output (line 2) ignored: Allot keeps the job's output itself"},
		{[]string{"--mail-type=END"}, func(j batchJob) bool { return true }, "ignored: Allot sends no mail"},
		{[]string{"--exclusive"}, func(j batchJob) bool { return true }, "--exclusive (line 2) ignored"},
		{[]string{"--qos=tier1", "-p gpu", "-t 4:00:00", "-A nlp", "--parsable"},
			func(j batchJob) bool {
				return j.qos == "tier1" && j.partition == "gpu" && j.timeLimit == "4:00:00" && j.team == "nlp" && j.parsable
			}, ""},
	}
	for _, tt := range tests {
		j, warns, err := applyDirectives(directivesOf(t, tt.lines...), env, "/work/here")
		if err != nil || !tt.check(j) {
			t.Errorf("%q: %+v, %v", tt.lines, j, err)
		}
		if w := strings.Join(warns, "\n"); tt.warn == "" && w != "" || !strings.Contains(w, tt.warn) {
			t.Errorf("%q: warnings %q, want %q", tt.lines, w, tt.warn)
		}
	}
	refused := []struct {
		lines []string
		msg   string
	}{
		{[]string{"--array=1-10"}, "#SBATCH --array (line 2) cannot be honoured: Allot has no job arrays"},
		{[]string{"--dependency=afterok:12"}, "no job dependencies"},
		{[]string{"-H"}, "cannot hold a job"},
		{[]string{"--begin=now+1hour"}, "cannot be honoured"},
		{[]string{"--nodes=1-4"}, "a range of node counts cannot be honoured"},
		{[]string{"--nodes=0"}, "at least 1"},
		{[]string{"--gres=gpu:0"}, "at least 1 GPU"},
		{[]string{"--gres=gpu:a:b:c"}, "want gpu[:type]:N"},
		{[]string{"--gres=gpu:a100:x"}, "want gpu[:type]:N"},
		{[]string{"--gpus=a100:2,v100:1"}, "one GPU type per job"},
		{[]string{"--gpus=many"}, "want [type:]N"},
		{[]string{"--gres=gpu:a100:2", "--gpus-per-node=h100:2"}, "the GPU type is given twice"},
		{[]string{"--gpus=10", "--nodes=4"}, "do not divide evenly over 4 nodes"},
		{[]string{"--gpus=16", "--gpus-per-node=8", "--nodes=3"}, "16 GPUs in all do not make 8 per node on 3 nodes"},
		{[]string{"--nodes=2"}, "say how many GPUs each node needs"},
		{[]string{"--mem=lots"}, "want a size such as 64G"},
		{[]string{"--mem=1.5G"}, "want a size"},
		{[]string{"--mem=1G", "--mem-per-gpu=1G"}, "give --mem or --mem-per-gpu, not both"},
		{[]string{"--mem-per-gpu=1G", "--gpus=8"}, "#SBATCH --mem-per-gpu=1G (line 2): the GPUs per node are not known"},
		{[]string{"--cpus-per-task=0"}, "at least 1"},
		{[]string{"--export==x"}, "a variable without a name"},
		{[]string{"--chdir=''"}, "an empty directory"},
	}
	for _, tt := range refused {
		_, _, err := applyDirectives(directivesOf(t, tt.lines...), env, "/")
		if err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%q: %v, want %q", tt.lines, err, tt.msg)
		}
	}
}

func TestResolveTierAndGPUType(t *testing.T) {
	tiers := []store.TierValues{{ID: "1", Name: "Production incident"}, {ID: "2", Name: "Scheduled production"}, {ID: "3", Name: "Experiment"},
		{ID: "4", Name: "Exploration"}, {ID: "preemptible", Name: "Preemptible"}}
	for in, want := range map[string]string{"3": "3", "tier3": "3", "Tier 3": "3", "tier-1": "1", "TIER_2": "2", "preemptible": "preemptible",
		"allot-tier4": "4", "experiment": "3", "Scheduled-Production": "2", "production_incident": "1"} {
		if got, ok := resolveTier(in, tiers); !ok || got != want {
			t.Errorf("resolveTier(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{"gpu", "normal", "", "7", "tier"} {
		if got, ok := resolveTier(in, tiers); ok {
			t.Errorf("resolveTier(%q) = %q", in, got)
		}
	}
	if _, ok := resolveTier("experiment", nil); ok {
		t.Error("a tier name resolved without the tiers")
	}
	types := []web.GPUTypeJSON{{Name: "A100-80GB"}, {Name: "A100-40GB"}, {Name: "T4"}, {Name: "H100"}, {Name: "V100", Retired: true}}
	for in, want := range map[string]string{"t4": "T4", "h100": "H100", "a100-80gb": "A100-80GB", "a100_80gb": "A100-80GB",
		"a100": "a100" /* two match: the server says which exist */, "v100": "v100", "mi300": "mi300"} {
		if got := resolveGPUType(in, types); got != want {
			t.Errorf("resolveGPUType(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestBatchCommandRunsTheScript runs the command a batch script becomes
// with /bin/sh, as a node would: the script runs under its shebang's
// interpreter, with its arguments, from a private file.
func TestBatchCommandRunsTheScript(t *testing.T) {
	script := "#!/bin/sh -e\n#SBATCH --time=5\n" +
		"echo \"args=$# [$1] [$2]\"\n" +
		"case $- in *e*) echo errexit;; esac\n" +
		"printf '%s\\n' 'ALLOT_BATCH_SCRIPT_END' \"$(ls -l \"$0\" | cut -c1-10)\"\n" +
		"cat <<'EOF'\n$HOME is not expanded; 'quotes' \"too\"\nEOF"
	cmd, err := batchCommand([]string{"/bin/sh", "-e"}, script, "job.sh", []string{"a b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if cmd[0] != "/bin/sh" || cmd[1] != "-c" || cmd[3] != "job.sh" || cmd[4] != "a b" {
		t.Fatalf("command %q", cmd)
	}
	c := exec.Command(cmd[0], cmd[1:]...)
	c.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	out, err := c.CombinedOutput()
	want := "args=2 [a b] [c]\nerrexit\nALLOT_BATCH_SCRIPT_END\n-rw-------\n$HOME is not expanded; 'quotes' \"too\"\n"
	if err != nil || string(out) != want {
		t.Errorf("ran: %v\n%s\nwant:\n%s", err, out, want)
	}
	// The script's exit code is the job's.
	cmd, _ = batchCommand([]string{"/bin/bash"}, "#!/bin/bash\nexit 7\n", "x", nil)
	c = exec.Command(cmd[0], cmd[1:]...)
	c.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	if err := c.Run(); c.ProcessState.ExitCode() != 7 {
		t.Errorf("exit: %v", err)
	}
	// Too long for the server's command limit: a clear error.
	big := "#!/bin/sh\n" + strings.Repeat("echo 0123456789abcdef\n", allot.MaxCommandBytes/20)
	if _, err := batchCommand([]string{"/bin/sh"}, big, "big.sh", nil); err == nil || !strings.Contains(err.Error(), "too long to send with the job") ||
		!strings.Contains(err.Error(), "at most 16384 bytes") {
		t.Errorf("big script: %v", err)
	}
	if _, err := batchCommand([]string{"/bin/sh"}, "#!/bin/sh\n", "x", make([]string, allot.MaxCommandArgs)); err == nil {
		t.Error("too many arguments were accepted")
	}
}
