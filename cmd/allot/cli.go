package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/web"
)

type envFlag map[string]string

func (e envFlag) String() string { return "" }
func (e envFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=value, got %q", s)
	}
	e[k] = v
	return nil
}

// secretEnvFlag is --secret-env: KEY=value, or KEY alone to take the value
// from the environment of the same name, so that the secret is not on the
// command line (which every user of the machine can read in ps).
type secretEnvFlag map[string]string

func (e secretEnvFlag) String() string { return "" }
func (e secretEnvFlag) Set(s string) error {
	if !strings.Contains(s, "=") {
		v, ok := os.LookupEnv(s)
		if s == "" || !ok {
			return fmt.Errorf("want KEY=value, or KEY with $%s set in the environment", s)
		}
		e[s] = v
		return nil
	}
	return envFlag(e).Set(s)
}

// reportErr prints a CLI error and returns the exit code: 1 for errors the
// server reported (bad input, not found, not allowed) or transport errors.
func reportErr(stderr io.Writer, cmd string, err error) int {
	var p *client.Error
	if errors.As(err, &p) {
		fmt.Fprintf(stderr, "allot %s: %s\n", cmd, p.Error())
		return 1
	}
	fmt.Fprintf(stderr, "allot %s: %v\n", cmd, err)
	return 1
}

func cmdSubmit(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: allot submit --team T --tier N --gpus N --time 4h [flags] -- COMMAND [ARGS...]")
		fs.PrintDefaults()
	}
	newClient := clientFlags(fs)
	team := fs.String("team", "", "team to submit for (required)")
	tier := fs.String("tier", "3", "tier: 1, 2, 3, 4 or preemptible")
	gpus := fs.Int("gpus", 1, "number of GPUs")
	gpuType := fs.String("gpu-type", "", "GPU type, e.g. A100-80GB (default: any)")
	perNode := fs.Int("gpus-per-node", 0, "GPUs per node for multi-node jobs (default: scheduler decides)")
	limit := fs.String("time", "", "time limit, e.g. 4h, 90m, 2d (required)")
	name := fs.String("name", "", "job name (default: from the command)")
	workdir := fs.String("workdir", "", "absolute working directory on the node")
	preemptible := fs.Bool("preemptible", false, "run as preemptible (idle GPUs only, 70 % cheaper)")
	checkpointable := fs.Bool("checkpointable", false, "the job checkpoints to ALLOT_CHECKPOINT_DIR and can resume")
	asJSON := fs.Bool("json", false, "print the job as JSON")
	env := envFlag{}
	fs.Var(env, "env", "KEY=value environment variable (repeatable; the submitter, the team's leads and admins see the values)")
	secretEnv := secretEnvFlag{}
	fs.Var(secretEnv, "secret-env", "KEY=value, or KEY to take the value from $KEY (keeps it out of ps): secret environment variable (repeatable; passed to the job, never shown again)")
	image := fs.String("image", "", "OCI image to run the command in, e.g. nvcr.io/nvidia/pytorch:24.05-py3 (default: on the node's host)")
	memory := fs.String("memory", "", "memory per node, e.g. 64GiB or 512MiB (default: the node's)")
	cpus := fs.String("cpus", "", "CPUs per node, e.g. 8 or 0.5 (default: the node's)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var problems []string
	if *team == "" {
		problems = append(problems, "--team is required")
	}
	var timeLimit time.Duration
	if *limit == "" {
		problems = append(problems, "--time is required (e.g. --time 4h)")
	} else if d, err := allot.ParseDuration(*limit); err != nil {
		problems = append(problems, "--time: "+err.Error())
	} else {
		timeLimit = d
	}
	if fs.NArg() == 0 {
		problems = append(problems, "the command is missing: put it after --, e.g. -- python train.py")
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(stderr, "allot submit: %s\n", p)
		}
		return 2
	}
	tierJSON, _ := json.Marshal(*tier)
	secs := int64(timeLimit / time.Second)
	req := web.JobRequest{Name: *name, Team: *team, Tier: tierJSON, GPUs: gpus, GPUType: *gpuType, GPUsPerNode: *perNode,
		TimeLimitS: &secs, Command: fs.Args(), WorkDir: *workdir, Preemptible: *preemptible, Checkpointable: *checkpointable}
	if len(env) > 0 {
		req.Env = env
	}
	if len(secretEnv) > 0 {
		req.SecretEnv = secretEnv
	}
	// Memory and CPUs go as typed: the server parses them (one rule set).
	req.Image, req.Memory = *image, *memory
	if *cpus != "" {
		req.CPUs, _ = json.Marshal(*cpus)
	}
	j, err := newClient().Submit(context.Background(), req)
	if err != nil {
		return reportErr(stderr, "submit", err)
	}
	if *asJSON {
		return printJSON(stdout, j)
	}
	fmt.Fprintf(stdout, "submitted job %d (%s): %d GPUs, tier %s, state %s\n", j.ID, j.Name, j.GPUs, j.Tier, j.State)
	if j.RunAsUser != "" {
		fmt.Fprintf(stdout, "runs as %s\n", j.RunAsUser)
	}
	if j.QuotaWarning != "" {
		fmt.Fprintf(stdout, "warning: %s\n", j.QuotaWarning)
	}
	return 0
}

func printJSON(w io.Writer, v any) int {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return 1
	}
	return 0
}
