package slurm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// CLIEnv is the environment for Slurm commands run by this package and by
// callers of SacctArgs: SLURM_CONF from Config (when set), TZ=UTC and
// SLURM_TIME_FORMAT=standard so that sacct prints times as
// 2006-01-02T15:04:05 in UTC.
func (c *Client) CLIEnv() []string {
	env := []string{"TZ=UTC", "SLURM_TIME_FORMAT=standard"}
	if c.cfg.SlurmConf != "" {
		env = append(env, "SLURM_CONF="+c.cfg.SlurmConf)
	}
	return env
}

func (c *Client) runCLI(ctx context.Context, name string, args ...string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("slurm: %s is not installed here (needed on REST %s): %w", name, c.Version(), err)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), c.CLIEnv()...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		var ee *exec.ExitError
		if errors.As(err, &ee) && msg != "" {
			return msg, fmt.Errorf("slurm: %s %s: %s", name, strings.Join(args, " "), msg)
		}
		return msg, fmt.Errorf("slurm: %s %s: %w", name, strings.Join(args, " "), err)
	}
	return string(out), nil
}

// scontrolNode drains or resumes a node with scontrol (REST v0.0.38 has no
// node update). scontrol needs a munge key for the cluster on this host.
func (c *Client) scontrolNode(ctx context.Context, node string, drain bool, reason string) error {
	args := []string{"update", "nodename=" + node}
	if drain {
		args = append(args, "state=drain", "reason="+reason)
	} else {
		args = append(args, "state=resume")
	}
	out, err := c.runCLI(ctx, "scontrol", args...)
	if err != nil {
		if strings.Contains(out, "Invalid node name") {
			return fmt.Errorf("%w: %w", err, ErrNotFound)
		}
		if strings.Contains(out, "Invalid node state") && !drain {
			// resuming a node that is not drained/down: nothing to do
			return nil
		}
		return err
	}
	return nil
}

// SacctFields is the field list ParseSacct reads, in order. It extends
// XDMoD's shredder list with what Allot bills by (AllocTRES for gres/gpu,
// QOS for the tier, Comment for allot:job=) and TRESUsageInAve for
// right-sizing (filled on step lines only). Comment is last so that a "|"
// in it (parsable2 does not escape) cannot shift the other fields.
func SacctFields() []string {
	return []string{"JobIDRaw", "JobName", "Account", "User", "QOS", "Partition", "State",
		"Submit", "Eligible", "Start", "End", "Timelimit", "AllocTRES", "ReqTRES", "NodeList",
		"ExitCode", "TRESUsageInAve", "Comment"}
}

// SacctArgs is the sacct argument list for runs overlapping [from, to):
// all users, allocations only (-X), duplicates (-D: each requeued run is its
// own record), parsable, unconverted. Run it with CLIEnv (TZ=UTC). Without
// -X the step lines are printed too; ParseSacct then folds their
// TRESUsageInAve (gres/gpuutil, gres/gpumem) into the runs.
func SacctArgs(from, to time.Time) []string {
	return []string{"-a", "-X", "-D", "--parsable2", "--noheader", "--noconvert",
		"-S", from.UTC().Format("2006-01-02T15:04:05"), "-E", to.UTC().Format("2006-01-02T15:04:05"),
		"-o", strings.Join(SacctFields(), ",")}
}

// Sacct runs sacct with SacctArgs and CLIEnv and parses it: the CLI
// fallback for Accounting.
func (c *Client) Sacct(ctx context.Context, from, to time.Time) ([]Run, error) {
	out, err := c.runCLI(ctx, "sacct", SacctArgs(from, to)...)
	if err != nil {
		return nil, err
	}
	return ParseSacct(strings.NewReader(out))
}

// ParseSacct reads `sacct --parsable2 -o <SacctFields>` output (TZ=UTC; a
// header line is skipped). Step lines ("5.batch", "5.0") are folded into
// the run before them.
func ParseSacct(r io.Reader) ([]Run, error) {
	fields := SacctFields()
	idx := map[string]int{}
	for i, f := range fields {
		idx[f] = i
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	var runs []Run
	var steps []stepUsage
	flush := func() {
		if len(runs) > 0 && len(steps) > 0 {
			rightSize(&runs[len(runs)-1], steps)
		}
		steps = nil
	}
	line := 0
	for sc.Scan() {
		line++
		t := sc.Text()
		if strings.TrimSpace(t) == "" {
			continue
		}
		f := strings.Split(t, "|")
		if len(f) > len(fields) { // a "|" inside the comment
			f = append(f[:len(fields)-1], strings.Join(f[len(fields)-1:], "|"))
		}
		if len(f) != len(fields) {
			return nil, fmt.Errorf("slurm: sacct line %d has %d fields, want %d (%s)", line, len(f), len(fields), strings.Join(fields, ","))
		}
		get := func(k string) string { return f[idx[k]] }
		if line == 1 && get("JobIDRaw") == "JobIDRaw" {
			continue
		}
		id := get("JobIDRaw")
		if jobPart, _, isStep := strings.Cut(id, "."); isStep {
			if len(runs) == 0 || itoa(runs[len(runs)-1].JobID) != jobPart {
				continue // a step whose job line is outside the window
			}
			var u stepUsage
			if v, ok := tresValue(get("TRESUsageInAve"), "gres/gpuutil"); ok {
				u.util, u.hasUtil = v, true
			}
			if v, ok := tresValue(get("TRESUsageInAve"), "gres/gpumem"); ok {
				u.mem, u.hasMem = v, true
			}
			steps = append(steps, u)
			continue
		}
		flush()
		jid, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("slurm: sacct line %d: job id %q: %w", line, id, err)
		}
		state, _, _ := strings.Cut(get("State"), " ") // "CANCELLED by 0"
		run := Run{JobID: jid, Name: get("JobName"), Account: get("Account"), User: get("User"),
			QOS: get("QOS"), Partition: get("Partition"), State: strings.ToUpper(state), Comment: get("Comment")}
		for _, tf := range []struct {
			k string
			p *time.Time
		}{{"Submit", &run.Submit}, {"Eligible", &run.Eligible}, {"Start", &run.Start}, {"End", &run.End}} {
			if *tf.p, err = sacctTime(get(tf.k)); err != nil {
				return nil, fmt.Errorf("slurm: sacct line %d: %s: %w", line, tf.k, err)
			}
		}
		if run.State == "RUNNING" || run.State == "PENDING" {
			run.End = time.Time{}
		}
		run.TimeLimit = sacctDuration(get("Timelimit"))
		run.GPUs, run.GRESType = tresGPUs(get("AllocTRES"))
		if run.GPUs == 0 && run.Start.IsZero() {
			run.GPUs, run.GRESType = tresGPUs(get("ReqTRES"))
		}
		if run.GRESType == "" {
			_, run.GRESType = tresGPUs(get("ReqTRES"))
		}
		if !run.Start.IsZero() {
			run.Nodes = ExpandHostlist(get("NodeList"))
		}
		code, sig, _ := strings.Cut(get("ExitCode"), ":")
		c, _ := strconv.Atoi(code)
		if s, _ := strconv.Atoi(sig); s > 0 {
			c = 128 + s
		}
		run.ExitCode = c
		runs = append(runs, run)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	flush()
	sortRuns(runs)
	return runs, nil
}

func sacctTime(s string) (time.Time, error) {
	switch s {
	case "", "Unknown", "None", "N/A":
		return time.Time{}, nil
	}
	t, err := time.Parse("2006-01-02T15:04:05", s)
	if err != nil {
		return time.Time{}, err
	}
	return t.UTC(), nil
}

// sacctDuration reads [D-]HH:MM:SS, MM:SS or minutes; UNLIMITED/Partition_Limit → 0.
func sacctDuration(s string) time.Duration {
	days := 0
	if d, rest, ok := strings.Cut(s, "-"); ok {
		days, _ = strconv.Atoi(d)
		s = rest
	}
	parts := strings.Split(s, ":")
	var h, m, sec int
	var err error
	switch len(parts) {
	case 3:
		h, _ = strconv.Atoi(parts[0])
		m, _ = strconv.Atoi(parts[1])
		sec, err = strconv.Atoi(parts[2])
	case 2:
		m, _ = strconv.Atoi(parts[0])
		sec, err = strconv.Atoi(parts[1])
	case 1:
		m, err = strconv.Atoi(parts[0])
	}
	if err != nil {
		return 0
	}
	return time.Duration(days)*24*time.Hour + time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(sec)*time.Second
}

// JobsCLI lists jobs with `squeue --json` (data_parser output of the
// version in use; 22.05 prints the v0.0.38 shape of GET /jobs): the CLI
// fallback for Jobs when slurmrestd is down but slurmctld is not. It needs
// the munge key on this host.
func (c *Client) JobsCLI(ctx context.Context) ([]Job, error) {
	ad := c.cliAdapter()
	out, err := c.runCLI(ctx, "squeue", "--all", "--json")
	if err != nil {
		return nil, err
	}
	return ad.decodeJobs([]byte(out))
}

// cliAdapter is the adapter in use, or v0.0.38 before detection.
func (c *Client) cliAdapter() adapter {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ad != nil {
		return c.ad
	}
	return v0038{}
}
