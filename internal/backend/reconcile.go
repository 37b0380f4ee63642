// Package backend connects Allot's control plane to an external execution
// engine through allot.Engine (the seam; see internal/allot/engine.go).
// The Reconciler is engine-agnostic: one Sync brings Allot and the engine
// into agreement —
//
//  1. nodes: the engine's nodes become Allot nodes of the engine's GPU
//     types; drains go both ways (Allot's admins and health rules drain
//     engine nodes; drains and resumes done in the engine show in Allot);
//  2. budgets: the teams over budget are written where the engine's
//     submit filter reads them (Slurm: the file job_submit.lua reads);
//  3. jobs: the engine's queue and running jobs update Allot's jobs (state,
//     reason in Allot's words, expected start); jobs submitted to the
//     engine directly (sbatch) are imported; jobs cancelled in Allot are
//     cancelled in the engine; queued jobs of teams over budget are moved
//     to the preemptible class;
//  4. submissions: jobs submitted to Allot for the engine's GPU types are
//     submitted to it, as their submitter;
//  5. accounting: what ran (every run segment) is imported into Allot's
//     allocations, incrementally and idempotently, so the bill, budgets
//     and fair share see it as they see native usage.
//
// SlurmEngine is the Slurm implementation (slurmrestd). A Kueue engine
// would implement allot.Engine over Workloads and reuse all of this.
package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
)

// Reconciler syncs Allot with one engine.
type Reconciler struct {
	Store   *store.Store
	Engine  allot.Engine
	Mapping store.EngineMapping
	// OverBudgetFile is where the list of teams over budget is written
	// ("" = not written; it is also served by the API).
	OverBudgetFile string
	// ImportSince is where the first accounting import starts (zero: the
	// start of the current month).
	ImportSince time.Time
	// Overlap is how far each import reaches back before the last one's
	// end (default 10 minutes): records that changed late are seen again;
	// re-importing is idempotent.
	Overlap time.Duration
	// Cluster and Version name the cluster in the sync state.
	Cluster, Version string
	Logger           *slog.Logger
	// ApplyPolicy, when set, makes the engine's accounts and classes what
	// Allot's live policy says (Slurm: sacctmgr from slurmpolicy) and
	// returns how many changes it made; it runs first in a Sync, at most
	// every PolicyEvery (default 1 minute), so a new team or member can
	// submit without anyone editing Slurm by hand.
	ApplyPolicy func(ctx context.Context) (int, error)
	PolicyEvery time.Duration
	policyAt    time.Time
}

// Report says what one Sync did.
type Report struct {
	PolicyChanges              int
	Nodes, Drained, Resumed    int
	Jobs, ImportedJobs         int
	Submitted, SubmitFailed    int
	Cancelled, Demoted         int
	Runs, NewRuns, UpdatedRuns int
	OverBudget                 []string
	Unmapped                   []string
	Took                       time.Duration
}

func (r *Reconciler) log() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.Default()
}

// Sync runs one reconciliation. When the engine cannot be reached it
// records that (the portal says so) and returns the error; the next Sync
// catches up: submissions wait, and the import reads from where the last
// one that worked ended.
func (r *Reconciler) Sync(ctx context.Context) (Report, error) { return r.run(ctx, false) }

// SyncJobs is the part of Sync a job event needs at once: the engine's
// queue (which also links a submission whose record a crash lost, so
// nothing is submitted twice), cancels, demotions and submissions; not
// nodes, the policy or the accounting import.
func (r *Reconciler) SyncJobs(ctx context.Context) (Report, error) { return r.run(ctx, true) }

func (r *Reconciler) run(ctx context.Context, jobsOnly bool) (Report, error) {
	start := time.Now() // a stopwatch for the report, not product time
	rep, err := r.sync(ctx, jobsOnly)
	rep.Took = time.Since(start)
	if rerr := r.Store.RecordEngineSync(ctx, r.Cluster, r.Version, err, rep.cursor, rep.Unmapped); rerr != nil && err == nil {
		err = rerr
	}
	return rep.Report, err
}

type syncReport struct {
	Report
	cursor time.Time
}

func (r *Reconciler) sync(ctx context.Context, jobsOnly bool) (syncReport, error) {
	var rep syncReport
	st := r.Store
	e := r.Engine
	if jobsOnly {
		_, err := r.syncJobs(ctx, &rep)
		return rep, err
	}
	every := r.PolicyEvery
	if every <= 0 {
		every = time.Minute
	}
	// A stopwatch between applications, not product time.
	if r.ApplyPolicy != nil && (r.policyAt.IsZero() || time.Since(r.policyAt) >= every) {
		n, err := r.ApplyPolicy(ctx)
		if err != nil {
			return rep, fmt.Errorf("applying Allot's policy to %s: %w", e.Name(), err)
		}
		r.policyAt, rep.PolicyChanges = time.Now(), n
	}
	// 1. Nodes and drains.
	nodes, err := e.Nodes(ctx)
	if err != nil {
		return rep, fmt.Errorf("listing %s nodes: %w", e.Name(), err)
	}
	rep.Nodes = len(nodes)
	na, err := st.SyncEngineNodes(ctx, r.Mapping, nodes)
	if err != nil {
		return rep, err
	}
	rep.Unmapped = append(rep.Unmapped, na.Unmapped...)
	for _, d := range na.Drain {
		if err := e.Drain(ctx, d.Node, d.Reason); err != nil {
			return rep, fmt.Errorf("draining %s in %s: %w", d.Node, e.Name(), err)
		}
		if err := st.MarkEngineDrain(ctx, d.Node, true); err != nil {
			return rep, err
		}
		rep.Drained++
	}
	for _, n := range na.Undrain {
		if err := e.Undrain(ctx, n); err != nil {
			return rep, fmt.Errorf("resuming %s in %s: %w", n, e.Name(), err)
		}
		if err := st.MarkEngineDrain(ctx, n, false); err != nil {
			return rep, err
		}
		rep.Resumed++
	}
	jobs, err := r.syncJobs(ctx, &rep)
	if err != nil {
		return rep, err
	}
	return rep, r.importRuns(ctx, &rep, jobs)
}

// syncJobs is steps 2–4: budgets, the engine's queue, submissions. It
// returns the queue, whose running jobs' GPU indices the import uses.
func (r *Reconciler) syncJobs(ctx context.Context, rep *syncReport) ([]allot.EngineJob, error) {
	st, e := r.Store, r.Engine
	// 2. Budgets.
	over, err := st.OverBudgetTeams(ctx)
	if err != nil {
		return nil, err
	}
	rep.OverBudget = over
	if r.OverBudgetFile != "" {
		if err := WriteOverBudget(r.OverBudgetFile, over); err != nil {
			return nil, err
		}
	}
	// 3. Jobs.
	jobs, err := e.Jobs(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing %s jobs: %w", e.Name(), err)
	}
	rep.Jobs = len(jobs)
	ja, err := st.SyncEngineJobs(ctx, r.Mapping, jobs, over)
	if err != nil {
		return nil, err
	}
	rep.ImportedJobs = ja.Imported
	rep.Unmapped = append(rep.Unmapped, ja.Unmapped...)
	for _, c := range ja.Cancel {
		if err := e.Cancel(ctx, c.User, c.ExternalID); err != nil {
			return nil, fmt.Errorf("cancelling job %d (%s job %d): %w", c.JobID, e.Name(), c.ExternalID, err)
		}
		if err := st.RecordEngineSent(ctx, c.JobID, "cancel"); err != nil {
			return nil, err
		}
		rep.Cancelled++
	}
	for _, d := range ja.Demote {
		why := fmt.Sprintf("account %s is over its GPU-hour budget; job runs as preemptible", d.Team)
		if err := e.Demote(ctx, d.ExternalID, why); err != nil {
			return nil, fmt.Errorf("demoting job %d (%s job %d): %w", d.JobID, e.Name(), d.ExternalID, err)
		}
		if err := st.RecordEngineSent(ctx, d.JobID, "demote"); err != nil {
			return nil, err
		}
		rep.Demoted++
	}
	// 4. Submissions.
	subs, err := st.PendingEngineSubmits(ctx, r.Mapping.Backend, 500)
	if err != nil {
		return nil, err
	}
	for _, s := range subs {
		if s.SecretErr != "" {
			// It waits, saying why, for a worker with the key; the others go.
			if err := st.RecordEngineSubmitError(ctx, s.Job.ID, fmt.Errorf("its secret env does not decrypt on this worker (give it the servers' --secret-key-file): %s", s.SecretErr)); err != nil {
				return nil, err
			}
			rep.SubmitFailed++
			continue
		}
		if err := r.submit(ctx, s); err != nil {
			if !errors.Is(err, allot.ErrEngineRejected) {
				return nil, err // the engine is down: the rest wait too
			}
			rep.SubmitFailed++
			continue
		}
		rep.Submitted++
	}
	return jobs, nil
}

// importRuns is step 5: the accounting import.
func (r *Reconciler) importRuns(ctx context.Context, rep *syncReport, jobs []allot.EngineJob) error {
	st, e := r.Store, r.Engine
	// 5. Accounting.
	sync, err := st.EngineSync(ctx)
	if err != nil {
		return err
	}
	to := st.Now().UTC().Truncate(time.Second)
	from := sync.Cursor
	if from.IsZero() {
		from = r.ImportSince
		if from.IsZero() {
			from = store.MonthStart(to)
		}
	} else {
		overlap := r.Overlap
		if overlap <= 0 {
			overlap = 10 * time.Minute
		}
		from = from.Add(-overlap)
	}
	runs, err := e.Runs(ctx, from, to)
	if err != nil {
		return fmt.Errorf("reading %s accounting: %w", e.Name(), err)
	}
	live := map[int64]map[string][]int{}
	for _, j := range jobs {
		if j.State == allot.EngineRunning && len(j.GPUIndices) > 0 {
			live[j.ExternalID] = j.GPUIndices
		}
	}
	ir, err := st.ImportEngineRuns(ctx, r.Mapping, runs, live)
	if err != nil {
		return err
	}
	rep.Runs, rep.NewRuns, rep.UpdatedRuns = ir.Runs, ir.NewRuns, ir.UpdatedRuns
	rep.Unmapped = append(rep.Unmapped, ir.Unmapped...)
	rep.cursor = to
	return nil
}

func (r *Reconciler) submit(ctx context.Context, s store.EngineSubmitJob) error {
	j := s.Job
	env := map[string]string{}
	for k, v := range j.Env {
		env[k] = v
	}
	for k, v := range s.SecretEnv {
		env[k] = v
	}
	env["ALLOT_JOB_ID"] = fmt.Sprint(j.ID)
	tier := j.Tier
	if j.Preemptible {
		tier = allot.TierPreemptible
	}
	sub := allot.EngineSubmit{AllotJobID: j.ID, Name: j.Name, Account: j.Team, Tier: tier, GPUs: j.GPUs, GPUsPerNode: j.GPUsPerNode,
		GPUType: j.GPUType, TimeLimit: j.TimeLimit, Command: j.Command, Env: env, WorkDir: j.WorkDir}
	if j.RunAsUser == "" {
		err := fmt.Errorf("%w: job %d has no POSIX account to run as", allot.ErrEngineRejected, j.ID)
		return errors.Join(err, r.Store.RecordEngineSubmitError(ctx, j.ID, err))
	}
	id, msg, err := r.Engine.Submit(ctx, j.RunAsUser, sub)
	if err != nil {
		if rerr := r.Store.RecordEngineSubmitError(ctx, j.ID, err); rerr != nil {
			return rerr
		}
		if errors.Is(err, allot.ErrEngineRejected) {
			r.log().Warn("engine refused a job", "job", j.ID, "engine", r.Engine.Name(), "err", err)
		}
		return err
	}
	return r.Store.RecordEngineSubmit(ctx, j.ID, id, msg)
}

// WriteOverBudget writes the list of teams over budget (one per line) to
// path atomically, so a reader never sees half a file.
func WriteOverBudget(path string, teams []string) error {
	var b strings.Builder
	b.WriteString("# Teams over their GPU-hour budget, written by Allot; read by job_submit.lua.\n")
	for _, t := range teams {
		b.WriteString(t)
		b.WriteByte('\n')
	}
	if old, err := os.ReadFile(path); err == nil && string(old) == b.String() {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".over-budget-*")
	if err != nil {
		return fmt.Errorf("writing the over-budget list: %w", err)
	}
	if _, err := tmp.WriteString(b.String()); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the over-budget list: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the over-budget list: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the over-budget list: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the over-budget list: %w", err)
	}
	return nil
}
