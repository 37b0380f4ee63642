package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/client"
	"github.com/allotlabs/allot/internal/cliflag"
	"github.com/allotlabs/allot/web"
)

// clientFlags adds --server and --token (defaults from ALLOT_URL and
// ALLOT_TOKEN) to fs.
func clientFlags(fs *flag.FlagSet) func() *client.Client {
	def := os.Getenv("ALLOT_URL")
	if def == "" {
		def = "http://localhost:8080"
	}
	server := fs.String("server", def, "Allot server URL (env ALLOT_URL)")
	token := cliflag.Secret(fs, "token", "ALLOT_TOKEN", "API `token`")
	return func() *client.Client { return client.New(*server, token()) }
}

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

func cmdJobs(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("jobs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	newClient := clientFlags(fs)
	team := fs.String("team", "", "only this team")
	state := fs.String("state", "", "only this state (pending, running, completed, failed, cancelled, preempted, lost)")
	limit := fs.Int("limit", 50, "at most this many jobs (1–1000)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "allot jobs: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	jobs, err := newClient().Jobs(context.Background(), client.ListOptions{Team: *team, State: *state, Limit: *limit})
	if err != nil {
		return reportErr(stderr, "jobs", err)
	}
	if *asJSON {
		return printJSON(stdout, jobs)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tTEAM\tUSER\tTIER\tGPUS\tLIMIT\tSTATE\tSUBMITTED\tREASON")
	for _, j := range jobs {
		g := strconv.Itoa(j.GPUs)
		if j.GPUType != nil {
			g += "×" + *j.GPUType
		}
		tier := j.Tier
		if j.Preemptible && tier != "preemptible" {
			tier += "(p)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, j.Name, j.Team, j.User, tier, g,
			allot.FormatDuration(time.Duration(j.TimeLimitS)*time.Second), j.State, j.SubmittedAt.Format("01-02 15:04"), j.PendingReason)
	}
	tw.Flush()
	return 0
}

func cmdCancel(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cancel", flag.ContinueOnError)
	fs.SetOutput(stderr)
	newClient := clientFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: allot cancel [--server URL] [--token T] JOB_ID")
		return 2
	}
	id, err := strconv.ParseInt(fs.Arg(0), 10, 64)
	if err != nil || id < 1 {
		fmt.Fprintf(stderr, "allot cancel: %q is not a job id\n", fs.Arg(0))
		return 2
	}
	j, err := newClient().Cancel(context.Background(), id)
	if err != nil {
		return reportErr(stderr, "cancel", err)
	}
	fmt.Fprintf(stdout, "job %d is %s\n", j.ID, j.State)
	return 0
}
