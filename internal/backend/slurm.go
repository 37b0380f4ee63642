package backend

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/clock"
	"github.com/allotlabs/allot/internal/slurm"
	"github.com/allotlabs/allot/internal/slurmpolicy"
	"github.com/allotlabs/allot/internal/store"
)

// SlurmEngine is allot.Engine over slurmrestd. Teams are Slurm accounts of
// the same name; tiers are the QOS slurmpolicy renders (allot-t1 …
// allot-preemptible); a job Allot submits carries "allot:job=<id>" in its
// comment.
type SlurmEngine struct {
	Client *slurm.Client
	// Partition to submit to ("" = the cluster's default).
	Partition string
	// WorkDir is where a job without a working directory of its own runs
	// ("" = /tmp); its output goes to allot-<Allot id>-<Slurm id>.out there.
	WorkDir string

	mu       sync.Mutex
	gres     map[string]string // lower-case GRES type → as Slurm spells it
	comments map[int64]string  // job → its comment, from the last Jobs
}

var _ allot.Engine = (*SlurmEngine)(nil)

// Name is "slurm".
func (e *SlurmEngine) Name() string { return allot.BackendSlurm }

// Check pings slurmrestd (and slurmctld behind it).
func (e *SlurmEngine) Check(ctx context.Context) error {
	_, err := e.Client.Ping(ctx)
	return err
}

// Slurm keeps the real time; Allot's business time is the real time
// shifted by the process clock's offset (a demo or test at a chosen
// instant; 0 in production). Times cross the seam translated, so Slurm's
// runs land on Allot's timeline like native usage.
func toAllot(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(clock.Offset())
}

func toSlurm(t time.Time) time.Time { return t.Add(-clock.Offset()) }

// AllotTag is the comment that names the Allot job of a Slurm job.
func AllotTag(id int64) string { return fmt.Sprintf("allot:job=%d", id) }

var allotTagRE = regexp.MustCompile(`\ballot:job=(\d+)\b`)

func allotJobOf(comment string) int64 {
	m := allotTagRE.FindStringSubmatch(comment)
	if m == nil {
		return 0
	}
	id, _ := strconv.ParseInt(m[1], 10, 64)
	return id
}

// DemotedTag marks a job moved to preemptible for budget (job_submit.lua
// writes the same).
const DemotedTag = "allot:demoted-over-budget"

// ShellQuote quotes argv for /bin/sh.
func ShellQuote(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r == '-' || r == '_' || r == '.' || r == '/' || r == '=' || r == ':' || r == ',' || r == '+' || r == '@' ||
				('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9'))
		}) < 0 {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

// jobScript runs argv as the batch script, with HOME the account's home
// (a REST submission carries no login environment).
func jobScript(argv []string) string {
	return "#!/bin/sh\n" +
		"[ -n \"$HOME\" ] || HOME=$(getent passwd \"$(id -un)\" | cut -d: -f6); export HOME\n" +
		"exec " + ShellQuote(argv) + "\n"
}

// rejected turns Slurm's refusals into allot.ErrEngineRejected (a retry
// cannot fix them); being unreachable or unauthorized stays as it is.
func rejected(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, slurm.ErrRejected) || errors.Is(err, slurm.ErrNotFound) {
		return fmt.Errorf("%w: %w", allot.ErrEngineRejected, err)
	}
	return err
}

// Submit submits j as asUser (the engineer's POSIX account).
func (e *SlurmEngine) Submit(ctx context.Context, asUser string, j allot.EngineSubmit) (int64, string, error) {
	s := slurm.JobSubmit{
		Name:      j.Name,
		Account:   j.Account,
		QOS:       slurmpolicy.QOSName(string(j.Tier)),
		Partition: e.Partition,
		Comment:   AllotTag(j.AllotJobID),
		Workdir:   j.WorkDir,
		Script:    jobScript(j.Command),
		Env:       map[string]string{},
		TimeLimit: j.TimeLimit,
		Requeue:   true,
		Output:    fmt.Sprintf("allot-%d-%%j.out", j.AllotJobID),
	}
	if s.Workdir == "" {
		s.Workdir = e.WorkDir
	}
	if s.Workdir == "" {
		s.Workdir = "/tmp"
	}
	// Slurm starts a REST job with exactly the environment given: the
	// login variables sbatch would have passed are the engineer's.
	s.Env["USER"], s.Env["LOGNAME"] = asUser, asUser
	for k, v := range j.Env {
		s.Env[k] = v
	}
	if j.GPUsPerNode > 0 && j.GPUsPerNode < j.GPUs {
		s.Nodes, s.GPUsPerNode = j.GPUs/j.GPUsPerNode, j.GPUsPerNode
	} else {
		s.GPUs = j.GPUs
		if j.GPUsPerNode > 0 {
			s.Nodes, s.GPUsPerNode = 1, j.GPUsPerNode
		}
	}
	e.mu.Lock()
	s.GRESType = e.gres[strings.ToLower(j.GPUType)]
	e.mu.Unlock()
	id, msg, err := e.Client.Submit(ctx, asUser, s)
	return id, msg, rejected(err)
}

// Cancel cancels a Slurm job as asUser.
func (e *SlurmEngine) Cancel(ctx context.Context, asUser string, id int64) error {
	return rejected(e.Client.Cancel(ctx, asUser, id))
}

// Demote moves a queued job to the preemptible QOS, tagging its comment.
func (e *SlurmEngine) Demote(ctx context.Context, id int64, why string) error {
	q := slurmpolicy.QOSName(string(allot.TierPreemptible))
	e.mu.Lock()
	c := strings.TrimSpace(e.comments[id])
	e.mu.Unlock()
	if !strings.Contains(c, DemotedTag) {
		c = strings.TrimSpace(c + " " + DemotedTag)
	}
	return rejected(e.Client.UpdateJob(ctx, id, slurm.JobUpdate{QOS: &q, Comment: &c}))
}

// engineState maps a Slurm job state to Allot's.
func engineState(s string) allot.EngineState {
	switch strings.ToUpper(s) {
	case "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING":
		return allot.EngineRunning
	case "COMPLETED":
		return allot.EngineCompleted
	case "CANCELLED":
		return allot.EngineCancelled
	case "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED":
		return allot.EngineFailed
	case "PREEMPTED", "REQUEUED":
		return allot.EnginePreempted
	}
	return allot.EnginePending // PENDING, REQUEUE_HOLD, REQUEUE_FED, …
}

func tierOf(qos string) allot.TierID {
	if t, ok := slurmpolicy.TierOfQOS(qos); ok {
		return allot.TierID(t)
	}
	return ""
}

// Jobs lists Slurm's jobs.
func (e *SlurmEngine) Jobs(ctx context.Context) ([]allot.EngineJob, error) {
	jobs, err := e.Client.Jobs(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]allot.EngineJob, 0, len(jobs))
	comments := make(map[int64]string, len(jobs))
	for _, j := range jobs {
		comments[j.ID] = j.Comment
		st := engineState(j.State)
		x := allot.EngineJob{ExternalID: j.ID, AllotJobID: allotJobOf(j.Comment), Name: j.Name, Account: j.Account, User: j.User,
			Tier: tierOf(j.QOS), QOS: j.QOS, Partition: j.Partition, State: st, Code: j.State, Reason: j.Reason,
			Submit: toAllot(j.Submit), Start: toAllot(j.Start), End: toAllot(j.End), TimeLimit: j.TimeLimit, GPUs: j.GPUs, GPUType: j.GRESType,
			Nodes: j.Nodes, GPUIndices: j.GPUIndices, ExitCode: j.ExitCode,
			Demoted: strings.Contains(j.Comment, DemotedTag)}
		if st == allot.EnginePending {
			x.Why = slurm.ExplainReason(j.Reason, j)
		}
		out = append(out, x)
	}
	e.mu.Lock()
	e.comments = comments
	e.mu.Unlock()
	return out, nil
}

// Runs reads Slurm's accounting.
func (e *SlurmEngine) Runs(ctx context.Context, from, to time.Time) ([]allot.EngineRun, error) {
	runs, err := e.Client.Accounting(ctx, toSlurm(from), toSlurm(to))
	if err != nil {
		return nil, err
	}
	out := make([]allot.EngineRun, 0, len(runs))
	for _, r := range runs {
		out = append(out, allot.EngineRun{ExternalID: r.JobID, AllotJobID: allotJobOf(r.Comment), Name: r.Name, Account: r.Account,
			User: r.User, Tier: tierOf(r.QOS), QOS: r.QOS, State: engineState(r.State), Code: r.State, Submit: toAllot(r.Submit),
			Start: toAllot(r.Start), End: toAllot(r.End), TimeLimit: r.TimeLimit, GPUs: r.GPUs, GPUType: r.GRESType, Nodes: r.Nodes,
			ExitCode: r.ExitCode, GPUUtilPct: r.GPUUtilPct, GPUMemMiB: r.GPUMemMiB})
	}
	return out, nil
}

// Nodes lists Slurm's nodes, remembering their GRES types for submits.
func (e *SlurmEngine) Nodes(ctx context.Context) ([]allot.EngineNode, error) {
	nodes, err := e.Client.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	gres := map[string]string{}
	out := make([]allot.EngineNode, 0, len(nodes))
	for _, n := range nodes {
		if n.GRESType != "" {
			gres[strings.ToLower(n.GRESType)] = n.GRESType
		}
		st := strings.ToUpper(n.State)
		busy := st == "ALLOCATED" || st == "MIXED" || st == "COMPLETING"
		out = append(out, allot.EngineNode{Name: n.Name, GPUs: n.GPUs, GPUType: n.GRESType,
			Down:    st == "DOWN" || st == "FUTURE" || st == "UNKNOWN" || st == "ERROR",
			Drained: n.Drain, Draining: n.Drain && busy, Reason: n.Reason})
	}
	e.mu.Lock()
	e.gres = gres
	e.mu.Unlock()
	return out, nil
}

// Drain drains a node with Allot's reason.
func (e *SlurmEngine) Drain(ctx context.Context, node, reason string) error {
	return e.Client.Drain(ctx, node, reason)
}

// Undrain resumes a node.
func (e *SlurmEngine) Undrain(ctx context.Context, node string) error {
	return e.Client.Resume(ctx, node)
}

// SlurmPolicyChanges are what the cluster's accounts, users and QOS lack
// against what Allot's live policy renders to (sacctmgr with env's
// SLURM_CONF).
func SlurmPolicyChanges(ctx context.Context, st *store.Store, env []string) ([]slurmpolicy.Change, error) {
	in, err := st.SlurmPolicyInput(ctx)
	if err != nil {
		return nil, err
	}
	actual, err := slurmpolicy.ReadClusterState(ctx, env)
	if err != nil {
		return nil, err
	}
	return slurmpolicy.Diff(slurmpolicy.Render(in).Desired, actual), nil
}

// SlurmPolicyApplier is a Reconciler.ApplyPolicy for Slurm: it applies
// SlurmPolicyChanges and returns how many there were.
func SlurmPolicyApplier(st *store.Store, env []string) func(ctx context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		changes, err := SlurmPolicyChanges(ctx, st, env)
		if err != nil || len(changes) == 0 {
			return 0, err
		}
		return len(changes), slurmpolicy.Apply(ctx, env, changes)
	}
}
