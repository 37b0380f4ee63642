package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/allotlabs/allot/internal/allot"
)

// The store's side of an external engine (issue 14; the reconciler is in
// internal/backend). The engine's view comes in as allot.Engine* values;
// these functions write it into Allot's own tables — jobs, nodes,
// allocations, leases — so the portal, budgets, fair share and the bill
// read a Slurm job exactly as a native one. One cluster per Allot
// installation: Slurm job ids are unique in slurm_jobs.

// EngineMapping says how engine names map to Allot's.
type EngineMapping struct {
	Backend string // allot.BackendSlurm
	// DefaultGPUType is the Allot GPU type (of this backend) for engine
	// nodes and jobs whose GPU type names none of Allot's.
	DefaultGPUType string
	// ImportBatch is how many accounting runs one transaction imports (0:
	// DefaultImportBatch).
	ImportBatch int
}

// errUnmapped marks engine data Allot cannot place (an account that is no
// team, a node of no GPU type): counted and shown, never guessed.
var errUnmapped = errors.New("unmapped")

// NodeDrain is a drain Allot must push to the engine.
type NodeDrain struct{ Node, Reason string }

// NodeActions are what the engine must be told after a node sync.
type NodeActions struct {
	Drain    []NodeDrain
	Undrain  []string
	Unmapped []string // "node x: why"
}

func (s *Store) engineGPUTypes(ctx context.Context, backend string) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT name FROM gpu_types WHERE backend = $1 AND retired_at IS NULL ORDER BY name`, backend)
	if err != nil {
		return nil, mapErr("listing GPU types", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, mapErr("listing GPU types", err)
}

// engineType maps an engine GPU type name to an Allot GPU type of the
// backend: the type of that name (any case), else the default.
// EngineGPUTypes lists the GPU types in service that another engine
// (Slurm, the only one) runs.
func (s *Store) EngineGPUTypes(ctx context.Context) ([]string, error) {
	return s.engineGPUTypes(ctx, allot.BackendSlurm)
}

func engineType(types []string, name, def string) string {
	for _, t := range types {
		if strings.EqualFold(t, name) {
			return t
		}
	}
	if slices.Contains(types, def) {
		return def
	}
	return ""
}

// SyncEngineNodes writes the engine's nodes into Allot's nodes table and
// reconciles drains both ways. A drain done in Allot (an admin, a health
// rule) is pushed to the engine (returned in Drain) and remembered as
// pushed; a resume of that node done in the engine undrains it in Allot. A
// drain done in the engine shows in Allot with its reason (source slurm);
// an undrain in Allot of a node Allot drained resumes it in the engine.
func (s *Store) SyncEngineNodes(ctx context.Context, m EngineMapping, nodes []allot.EngineNode) (NodeActions, error) {
	var out NodeActions
	err := s.InTx(ctx, func(tx *Store) error {
		types, err := tx.engineGPUTypes(ctx, m.Backend)
		if err != nil {
			return err
		}
		now := tx.Now()
		seen := make([]string, 0, len(nodes))
		for _, n := range nodes {
			typ := engineType(types, n.GPUType, m.DefaultGPUType)
			switch {
			case typ == "":
				out.Unmapped = append(out.Unmapped, fmt.Sprintf("node %s: GPU type %q is no %s GPU type of Allot's and no default is set", n.Name, n.GPUType, m.Backend))
				continue
			case n.GPUs < 1 || n.GPUs > allot.MaxGPUsPerNode:
				out.Unmapped = append(out.Unmapped, fmt.Sprintf("node %s: %d GPUs", n.Name, n.GPUs))
				continue
			}
			a, err := tx.syncEngineNode(ctx, m, n, typ, now)
			if errors.Is(err, errUnmapped) {
				out.Unmapped = append(out.Unmapped, fmt.Sprintf("node %s: %v", n.Name, err))
				continue
			}
			if err != nil {
				return err
			}
			seen = append(seen, n.Name)
			if a.drain != "" {
				out.Drain = append(out.Drain, NodeDrain{Node: n.Name, Reason: a.drain})
			}
			if a.undrain {
				out.Undrain = append(out.Undrain, n.Name)
			}
		}
		// Nodes the engine no longer lists are down.
		if _, err := tx.db.Exec(ctx, `UPDATE nodes SET state = 'down', state_reason = 'not listed by '||$1
			WHERE backend = $1 AND NOT (name = ANY($2)) AND state <> 'down'`, m.Backend, seen); err != nil {
			return mapErr("syncing nodes", err)
		}
		return nil
	})
	return out, err
}

type nodeAction struct {
	drain   string
	undrain bool
}

func (s *Store) syncEngineNode(ctx context.Context, m EngineMapping, n allot.EngineNode, typ string, now time.Time) (nodeAction, error) {
	var a nodeAction
	engineReason := strings.TrimSpace(n.Reason)
	fromAllot := strings.HasPrefix(engineReason, "allot:")
	var backend, state, source, reason string
	var pushed bool
	err := s.db.QueryRow(ctx, `SELECT backend, state, drain_source, drain_reason, slurm_drain_pushed FROM nodes WHERE name = $1 FOR UPDATE`, n.Name).
		Scan(&backend, &state, &source, &reason, &pushed)
	if errors.Is(err, pgx.ErrNoRows) {
		st, src, why := "up", "", ""
		switch {
		case n.Drained:
			st, src, why = allot.NodeDrained, "slurm", "Slurm: "+engineReason
			if n.Draining {
				st = allot.NodeDraining
			}
		case n.Down:
			st, why = allot.NodeDown, "Slurm: "+engineReason
		}
		_, err := s.db.Exec(ctx, `INSERT INTO nodes (name, gpu_type, gpu_count, site, state, state_reason, backend, hostname, registered_at,
				drain_source, drain_reason, drained_at, slurm_drain_pushed)
			VALUES ($1, $2, $3, 'onprem', $4, $5, $6, $1, $7, $8, $9, CASE WHEN $4 = 'drained' THEN $7::timestamptz END, $10)`,
			n.Name, typ, n.GPUs, st, why, m.Backend, now, src, why, fromAllot && n.Drained)
		return a, mapErr("adding node", err)
	}
	if err != nil {
		return a, mapErr("loading node", err)
	}
	if backend != m.Backend {
		return a, fmt.Errorf("%w: a %s node of that name exists", errUnmapped, backend)
	}
	if _, err := s.db.Exec(ctx, `UPDATE nodes SET gpu_type = $2, gpu_count = $3 WHERE name = $1 AND (gpu_type <> $2 OR gpu_count <> $3)`,
		n.Name, typ, n.GPUs); err != nil {
		return a, mapErr("updating node", err)
	}
	allotDrained := state == allot.NodeDraining || state == allot.NodeDrained
	allotOwn := allotDrained && (source == allot.DrainByAdmin || source == allot.DrainByHealth)
	drainedState := allot.NodeDrained
	if n.Draining {
		drainedState = allot.NodeDraining
	}
	set := func(st, src, why string, push bool) error {
		_, err := s.db.Exec(ctx, `UPDATE nodes SET state = $2, state_reason = $4, drain_source = $3, drain_reason = CASE WHEN $3 = '' THEN '' ELSE $4 END,
				drained_at = CASE WHEN $2 = 'drained' THEN coalesce(drained_at, $5) END, slurm_drain_pushed = $6
			WHERE name = $1 AND (state, state_reason, drain_source, slurm_drain_pushed) IS DISTINCT FROM ($2, $4, $3, $6)`,
			n.Name, st, src, why, now, push)
		return mapErr("syncing node state", err)
	}
	switch {
	case allotOwn && !pushed && !n.Drained:
		// Drained in Allot, not yet in the engine: push it.
		a.drain = "allot: " + reason
		return a, nil
	case allotOwn && n.Drained:
		return a, set(drainedState, source, reason, true)
	case allotOwn && pushed && !n.Drained:
		// Allot pushed the drain and the engine resumed the node: the
		// engine's admin undrained it.
		if err := s.undrain(ctx, m.Backend, n.Name, state, "resumed in "+m.Backend); err != nil {
			return a, err
		}
		return a, set(allot.NodeUp, "", "", false)
	case n.Drained && fromAllot && !allotDrained:
		// Undrained in Allot: resume it in the engine.
		a.undrain = true
		return a, nil
	case n.Drained:
		return a, set(drainedState, "slurm", "Slurm: "+engineReason, false)
	case n.Down:
		return a, set(allot.NodeDown, "", "Slurm: "+engineReason, false)
	default:
		return a, set(allot.NodeUp, "", "", false)
	}
}

// MarkEngineDrain records that a drain was pushed to the engine (true) or
// that a resume was (false).
func (s *Store) MarkEngineDrain(ctx context.Context, node string, pushed bool) error {
	_, err := s.db.Exec(ctx, `UPDATE nodes SET slurm_drain_pushed = $2 WHERE name = $1`, node, pushed)
	return mapErr("recording drain", err)
}

// EngineCancel is a cancel Allot must send to the engine.
type EngineCancel struct {
	JobID, ExternalID int64
	User              string
}

// EngineDemote is a queued engine job to move to the preemptible class.
type EngineDemote struct {
	JobID, ExternalID int64
	Team              string
}

// JobActions are what the engine must be told after a job sync.
type JobActions struct {
	Cancel   []EngineCancel
	Demote   []EngineDemote
	Imported int
	Unmapped []string
}

func terminal(st allot.JobState) bool {
	return st == allot.JobCompleted || st == allot.JobFailed || st == allot.JobCancelled
}

// SyncEngineJobs writes what the engine says about its jobs now: state,
// reason in Allot's words, expected start. Jobs submitted to the engine
// directly (sbatch) are imported. It returns the cancels Allot owes the
// engine (jobs cancelled in Allot) and the queued jobs of teams over
// budget (overBudget) to demote.
func (s *Store) SyncEngineJobs(ctx context.Context, m EngineMapping, jobs []allot.EngineJob, overBudget []string) (JobActions, error) {
	var out JobActions
	err := s.InTx(ctx, func(tx *Store) error {
		types, err := tx.engineGPUTypes(ctx, m.Backend)
		if err != nil {
			return err
		}
		for i := range jobs {
			j := &jobs[i]
			id, imported, err := tx.engineJobID(ctx, m, types, engineJobRef{ext: j.ExternalID, allotID: j.AllotJobID, name: j.Name, account: j.Account,
				user: j.User, tier: j.Tier, gpus: j.GPUs, gpuType: j.GPUType, nodes: len(j.Nodes), limit: j.TimeLimit, submit: j.Submit})
			if errors.Is(err, errUnmapped) {
				out.Unmapped = append(out.Unmapped, fmt.Sprintf("job %d: %v", j.ExternalID, err))
				continue
			}
			if err != nil {
				return err
			}
			if imported {
				out.Imported++
			}
			var estimate *time.Time
			if j.State == allot.EnginePending && !j.Start.IsZero() {
				estimate = &j.Start
			}
			nodes := j.Nodes
			if nodes == nil {
				nodes = []string{}
			}
			var cancelSent, demoteSent *time.Time
			if err := tx.db.QueryRow(ctx, `UPDATE slurm_jobs SET state = $2, reason = $3, start_estimate = $4, qos = $5, partition = $6, nodes = $7,
					account = $8, slurm_user = $9, updated_at = $10
				WHERE job_id = $1 RETURNING cancel_sent_at, demote_sent_at`,
				id, j.Code, j.Reason, estimate, j.QOS, j.Partition, nodes, j.Account, j.User, tx.Now()).Scan(&cancelSent, &demoteSent); err != nil {
				return mapErr("syncing engine job", err)
			}
			var st allot.JobState
			var team, tier, runAsUser string
			var demoted bool
			if err := tx.db.QueryRow(ctx, `SELECT state, team, tier, run_as_user, demoted FROM jobs WHERE id = $1 FOR UPDATE`, id).
				Scan(&st, &team, &tier, &runAsUser, &demoted); err != nil {
				return mapErr("loading job", err)
			}
			active := j.State == allot.EnginePending || j.State == allot.EngineRunning
			if st == allot.JobCancelled && active && cancelSent == nil {
				user := runAsUser
				if user == "" {
					user = j.User
				}
				out.Cancel = append(out.Cancel, EngineCancel{JobID: id, ExternalID: j.ExternalID, User: user})
				continue
			}
			if j.State == allot.EnginePending && !j.Demoted && !demoted && demoteSent == nil && slices.Contains(overBudget, team) &&
				(j.Tier == "3" || j.Tier == "4") {
				out.Demote = append(out.Demote, EngineDemote{JobID: id, ExternalID: j.ExternalID, Team: team})
			}
			if j.Demoted && !demoted {
				if _, err := tx.db.Exec(ctx, `UPDATE jobs SET demoted = true, preemptible = true,
						quota_warning = CASE WHEN quota_warning = '' THEN $2 ELSE quota_warning END WHERE id = $1`,
					id, "team "+team+" is over its GPU-hour budget: the job runs as preemptible"); err != nil {
					return mapErr("recording demotion", err)
				}
			}
			if terminal(st) {
				continue
			}
			if err := tx.setEngineJobState(ctx, id, j.State, j.Why, j.Start, j.End, j.ExitCode, j.Code); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// setEngineJobState moves a job that is not terminal in Allot to the
// engine's state.
func (s *Store) setEngineJobState(ctx context.Context, id int64, st allot.EngineState, why string, start, end time.Time, exit int, code string) error {
	var err error
	switch st {
	case allot.EnginePending, allot.EnginePreempted:
		if why == "" {
			why = "queued in Slurm"
		}
		_, err = s.db.Exec(ctx, `UPDATE jobs SET state = 'pending', pending_reason = $2, updated_at = $3
			WHERE id = $1 AND (state, pending_reason) IS DISTINCT FROM ('pending', $2)`, id, why, s.Now())
	case allot.EngineRunning:
		if start.IsZero() {
			start = s.Now()
		}
		_, err = s.db.Exec(ctx, `UPDATE jobs SET state = 'running', pending_reason = '', started_at = coalesce(started_at, greatest($2, submitted_at)), updated_at = $3
			WHERE id = $1 AND state <> 'running'`, id, start, s.Now())
	case allot.EngineCompleted, allot.EngineFailed, allot.EngineCancelled:
		if end.IsZero() {
			end = s.Now()
		}
		reason := strings.ToLower(code)
		if st == allot.EngineFailed && exit != 0 {
			reason = fmt.Sprintf("%s (exit code %d)", reason, exit)
		}
		_, err = s.db.Exec(ctx, `UPDATE jobs SET state = $2, pending_reason = '', ended_at = greatest($3, submitted_at), exit_code = $4,
				end_reason = $5, updated_at = $6
			WHERE id = $1`, id, string(st), end, exit, "Slurm: "+reason, s.Now())
	}
	return mapErr("updating job state", err)
}

// RecordEngineSent records that a cancel ("cancel") or demotion
// ("demote") was sent to the engine.
func (s *Store) RecordEngineSent(ctx context.Context, jobID int64, what string) error {
	var q string
	switch what {
	case "cancel":
		q = `UPDATE slurm_jobs SET cancel_sent_at = $2 WHERE job_id = $1`
	case "demote":
		q = `WITH d AS (UPDATE slurm_jobs SET demote_sent_at = $2 WHERE job_id = $1 RETURNING job_id)
			UPDATE jobs j SET demoted = true, preemptible = true,
				quota_warning = 'team ' || j.team || ' is over its GPU-hour budget: the queued job was moved to preemptible'
			FROM d WHERE j.id = d.job_id`
	default:
		return fmt.Errorf("unknown engine action %q", what)
	}
	_, err := s.db.Exec(ctx, q, jobID, s.Now())
	return mapErr("recording engine action", err)
}

type engineJobRef struct {
	ext, allotID  int64
	name, account string
	user          string
	tier          allot.TierID
	gpus          int
	gpuType       string
	nodes         int
	limit         time.Duration
	submit        time.Time
}

// engineJobID finds the Allot job of an engine job, linking a job Allot
// submitted (its comment names it) and importing one submitted to the
// engine directly.
func (s *Store) engineJobID(ctx context.Context, m EngineMapping, types []string, r engineJobRef) (int64, bool, error) {
	var id int64
	err := s.db.QueryRow(ctx, `SELECT job_id FROM slurm_jobs WHERE slurm_job_id = $1`, r.ext).Scan(&id)
	if err == nil {
		return id, false, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, false, mapErr("finding engine job", err)
	}
	if r.allotID > 0 {
		// Allot submitted it (the record of the submission may have been
		// lost to a crash): link it.
		// Only a Slurm job of the same team and POSIX account: a comment
		// copied into someone else's sbatch job links nothing.
		tag, err := s.db.Exec(ctx, `INSERT INTO slurm_jobs (job_id, slurm_job_id, origin, submitted_at)
			SELECT id, $2, 'allot', $3 FROM jobs WHERE id = $1 AND backend = $4 AND team = $5 AND run_as_user = $6 AND run_as_user <> ''
			ON CONFLICT (job_id) DO UPDATE SET slurm_job_id = EXCLUDED.slurm_job_id WHERE slurm_jobs.slurm_job_id IS NULL`,
			r.allotID, r.ext, s.Now(), m.Backend, r.account, r.user)
		if err != nil {
			return 0, false, mapErr("linking engine job", err)
		}
		if tag.RowsAffected() == 1 {
			return r.allotID, false, nil
		}
		// A comment naming a job that is not this one's (another team or
		// account, or linked already): imported as an sbatch job of its own.
	}
	if r.gpus < 1 {
		return 0, false, fmt.Errorf("%w: no GPUs (Allot bills GPU jobs only)", errUnmapped)
	}
	var team string
	if err := s.db.QueryRow(ctx, `SELECT slug FROM teams WHERE slug = $1`, r.account).Scan(&team); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, false, fmt.Errorf("%w: account %q is no Allot team", errUnmapped, r.account)
		}
		return 0, false, mapErr("finding team", err)
	}
	if allot.POSIXAccountProblem(r.user) != "" {
		return 0, false, fmt.Errorf("%w: user %q", errUnmapped, r.user)
	}
	userID, err := s.engineUser(ctx, m, r.user)
	if err != nil {
		return 0, false, err
	}
	tier := r.tier
	if tier == "" {
		tier = "3"
	}
	typ := engineType(types, r.gpuType, m.DefaultGPUType)
	var gpuType *string
	if typ != "" {
		gpuType = &typ
	}
	var perNode *int
	if r.nodes > 0 && r.gpus%r.nodes == 0 {
		p := r.gpus / r.nodes
		perNode = &p
	}
	limit := int64(r.limit / time.Second)
	if limit <= 0 {
		if err := s.db.QueryRow(ctx, `SELECT max_runtime_s FROM tiers WHERE id = $1`, string(tier)).Scan(&limit); err != nil {
			return 0, false, mapErr("finding tier", err)
		}
	}
	submit := r.submit
	if submit.IsZero() {
		submit = s.Now()
	}
	name := strings.TrimSpace(r.name)
	if name == "" {
		name = fmt.Sprintf("slurm-%d", r.ext)
	}
	if len(name) > 128 {
		name = name[:128]
	}
	err = s.db.QueryRow(ctx, `INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, gpus_per_node, time_limit_s, command, submitted_at,
			backend, run_as_user, pending_reason)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'queued in Slurm') RETURNING id`,
		name, team, userID, string(tier), r.gpus, gpuType, perNode, limit, []string{fmt.Sprintf("sbatch (Slurm job %d)", r.ext)}, submit,
		m.Backend, r.user).Scan(&id)
	if err != nil {
		return 0, false, mapErr("importing engine job", err)
	}
	if _, err := s.db.Exec(ctx, `INSERT INTO slurm_jobs (job_id, slurm_job_id, origin, account, slurm_user, submitted_at) VALUES ($1, $2, 'sbatch', $3, $4, $5)`,
		id, r.ext, r.account, r.user, submit); err != nil {
		return 0, false, mapErr("importing engine job", err)
	}
	if _, err := s.db.Exec(ctx, `UPDATE slurm_sync SET jobs_imported = jobs_imported + 1`); err != nil {
		return 0, false, mapErr("counting imports", err)
	}
	return id, true, nil
}

// engineUser returns the Allot user of a POSIX account: the user mapped
// to it (by an admin, then by the identity provider's claim), or a user
// made for it (it signs in once its identity provider account maps to
// the same POSIX account).
func (s *Store) engineUser(ctx context.Context, m EngineMapping, posix string) (int64, error) {
	var id int64
	err := s.db.QueryRow(ctx, `SELECT id FROM users WHERE posix_user = $1 OR oidc_posix_user = $1
		ORDER BY (posix_user = $1) DESC, id LIMIT 1`, posix).Scan(&id)
	if err == nil {
		return id, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, mapErr("finding user", err)
	}
	err = s.db.QueryRow(ctx, `INSERT INTO users (oidc_issuer, oidc_subject, email, name, posix_user) VALUES ($1, $2, $3, $4, $2)
		ON CONFLICT (email) DO UPDATE SET posix_user = users.posix_user RETURNING id`,
		m.Backend, posix, posix+"@"+m.Backend+".local", posix).Scan(&id)
	return id, mapErr("adding user for "+posix, err)
}

// EngineSubmitJob is a job waiting to be submitted to its engine.
type EngineSubmitJob struct {
	Job       allot.Job
	SecretEnv map[string]string
	// SecretErr: its secret values do not decrypt here (no
	// --secret-key-file, or not the key that sealed them); SecretEnv is
	// then nil and the job must wait.
	SecretErr string
}

// PendingEngineSubmits returns up to limit jobs of backend not yet
// submitted, oldest first.
func (s *Store) PendingEngineSubmits(ctx context.Context, backend string, limit int) ([]EngineSubmitJob, error) {
	var out []EngineSubmitJob
	rows, err := s.db.Query(ctx, jobSelect+`
		WHERE j.backend = $1 AND j.state = 'pending' AND NOT EXISTS (SELECT 1 FROM slurm_jobs s WHERE s.job_id = j.id)
		ORDER BY j.id LIMIT $2`, backend, limit)
	if err != nil {
		return nil, mapErr("listing jobs to submit", err)
	}
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (allot.Job, error) { return scanJob(r) })
	if err != nil {
		return nil, mapErr("listing jobs to submit", err)
	}
	// Their secrets (jobSelect never loads them), in one query.
	ids := make([]int64, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
	}
	rows, err = s.db.Query(ctx, `SELECT id, secret_env FROM jobs WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, mapErr("loading secrets", err)
	}
	secrets := map[int64]map[string]string{}
	unreadable := map[int64]string{}
	var id int64
	var raw []byte
	if _, err := pgx.ForEachRow(rows, []any{&id, &raw}, func() error {
		sec := map[string]string{}
		if err := json.Unmarshal(raw, &sec); err != nil {
			return fmt.Errorf("decoding secrets of job %d: %w", id, err)
		}
		if err := openSecrets(s.Secrets, sec); err != nil {
			unreadable[id] = err.Error()
			return nil
		}
		secrets[id] = sec
		return nil
	}); err != nil {
		return nil, mapErr("loading secrets", err)
	}
	for _, j := range jobs {
		out = append(out, EngineSubmitJob{Job: j, SecretEnv: secrets[j.ID], SecretErr: unreadable[j.ID]})
	}
	return out, nil
}

// RecordEngineSubmit records that the engine accepted a job as ext, with
// the engine's message to the user (e.g. Slurm's job_submit demotion).
func (s *Store) RecordEngineSubmit(ctx context.Context, jobID, ext int64, message string) error {
	return s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `INSERT INTO slurm_jobs (job_id, slurm_job_id, origin, submitted_at) VALUES ($1, $2, 'allot', $3)
			ON CONFLICT (job_id) DO UPDATE SET slurm_job_id = EXCLUDED.slurm_job_id, submit_error = ''`, jobID, ext, tx.Now()); err != nil {
			return mapErr("recording submission", err)
		}
		why := fmt.Sprintf("submitted to Slurm as job %d", ext)
		_, err := tx.db.Exec(ctx, `UPDATE jobs SET pending_reason = $2,
				demoted = demoted OR $3, preemptible = preemptible OR $3,
				quota_warning = CASE WHEN $3 AND quota_warning = '' THEN $4 ELSE quota_warning END
			WHERE id = $1 AND state = 'pending'`, jobID, why, strings.Contains(message, "over its GPU-hour budget"), message)
		return mapErr("recording submission", err)
	})
}

// RecordEngineSubmitError records a failed submission: a refusal fails
// the job with the engine's words; anything else (the engine is down)
// leaves it queued, to be submitted when the engine answers.
func (s *Store) RecordEngineSubmitError(ctx context.Context, jobID int64, cause error) error {
	msg := cause.Error()
	if len(msg) > 500 {
		msg = msg[:500]
	}
	if !errors.Is(cause, allot.ErrEngineRejected) {
		_, err := s.db.Exec(ctx, `UPDATE jobs SET pending_reason = $2 WHERE id = $1 AND state = 'pending'`, jobID, "not yet submitted to Slurm: "+msg)
		return mapErr("recording submission error", err)
	}
	return s.InTx(ctx, func(tx *Store) error {
		now := tx.Now()
		if _, err := tx.db.Exec(ctx, `INSERT INTO slurm_jobs (job_id, origin, submit_error) VALUES ($1, 'allot', $2)
			ON CONFLICT (job_id) DO UPDATE SET submit_error = EXCLUDED.submit_error`, jobID, msg); err != nil {
			return mapErr("recording submission error", err)
		}
		_, err := tx.db.Exec(ctx, `UPDATE jobs SET state = 'failed', pending_reason = '', ended_at = greatest($2, submitted_at), end_reason = $3, updated_at = $2
			WHERE id = $1 AND state = 'pending'`, jobID, now, "Slurm refused the job: "+msg)
		return mapErr("recording submission error", err)
	})
}

// ImportResult counts what an accounting import did.
type ImportResult struct {
	Runs, NewRuns, UpdatedRuns, Skipped int
	Unmapped                            []string
}

// DefaultImportBatch is how many runs one transaction imports: a crash
// loses at most one batch's work, which the next import redoes.
const DefaultImportBatch = 200

// ImportEngineRuns writes runs from the engine's accounting into Allot's
// usage: one segment per run, its GPUs as allocations (the GPU indices the
// engine reported for a running job in live, else the lowest free), a
// preempted run's leases marked preempted (the preemption credit), and the
// job's state and class as run. Importing the same runs again changes
// nothing. Runs are imported in batches, each in its own transaction.
func (s *Store) ImportEngineRuns(ctx context.Context, m EngineMapping, runs []allot.EngineRun, live map[int64]map[string][]int) (ImportResult, error) {
	var res ImportResult
	batchSize := m.ImportBatch
	if batchSize <= 0 {
		batchSize = DefaultImportBatch
	}
	sorted := slices.Clone(runs)
	sort.SliceStable(sorted, func(a, b int) bool {
		if sorted[a].ExternalID != sorted[b].ExternalID {
			return sorted[a].ExternalID < sorted[b].ExternalID
		}
		return sorted[a].Start.Before(sorted[b].Start)
	})
	for lo := 0; lo < len(sorted); lo += batchSize {
		batch := sorted[lo:min(lo+batchSize, len(sorted))]
		var br ImportResult
		err := s.InTx(ctx, func(tx *Store) error {
			br = ImportResult{}
			types, err := tx.engineGPUTypes(ctx, m.Backend)
			if err != nil {
				return err
			}
			for i := range batch {
				if err := tx.importRun(ctx, m, types, &batch[i], live[batch[i].ExternalID], &br); err != nil {
					return err
				}
			}
			_, err = tx.db.Exec(ctx, `UPDATE slurm_sync SET runs_imported = runs_imported + $1`, br.NewRuns)
			return mapErr("counting runs", err)
		})
		if err != nil {
			return res, err
		}
		res.Runs += br.Runs
		res.NewRuns += br.NewRuns
		res.UpdatedRuns += br.UpdatedRuns
		res.Skipped += br.Skipped
		res.Unmapped = append(res.Unmapped, br.Unmapped...)
	}
	return res, nil
}

func (s *Store) importRun(ctx context.Context, m EngineMapping, types []string, r *allot.EngineRun, live map[string][]int, res *ImportResult) error {
	if r.Start.IsZero() || len(r.Nodes) == 0 || r.GPUs < 1 {
		res.Skipped++ // never ran, or ran no GPU: nothing to bill
		return nil
	}
	r.Start = r.Start.Truncate(time.Second)
	if !r.End.IsZero() {
		r.End = r.End.Truncate(time.Second)
		if r.End.Before(r.Start) {
			r.End = r.Start
		}
	}
	id, _, err := s.engineJobID(ctx, m, types, engineJobRef{ext: r.ExternalID, allotID: r.AllotJobID, name: r.Name, account: r.Account,
		user: r.User, tier: r.Tier, gpus: r.GPUs, gpuType: r.GPUType, nodes: len(r.Nodes), limit: r.TimeLimit, submit: r.Submit})
	if errors.Is(err, errUnmapped) {
		res.Unmapped = append(res.Unmapped, fmt.Sprintf("job %d: %v", r.ExternalID, err))
		res.Skipped++
		return nil
	}
	if err != nil {
		return err
	}
	res.Runs++
	var end *time.Time
	if !r.End.IsZero() {
		end = &r.End
	}
	var seg int
	var oldEnd *time.Time
	var oldState string
	err = s.db.QueryRow(ctx, `SELECT segment, run_end, state FROM slurm_runs WHERE slurm_job_id = $1 AND run_start = $2`, r.ExternalID, r.Start).Scan(&seg, &oldEnd, &oldState)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if err := s.db.QueryRow(ctx, `SELECT coalesce(max(segment), 0) + 1 FROM slurm_runs WHERE job_id = $1`, id).Scan(&seg); err != nil {
			return mapErr("numbering run", err)
		}
		res.NewRuns++
	case err != nil:
		return mapErr("finding run", err)
	default:
		if oldState == r.Code && ((oldEnd == nil) == (end == nil)) && (end == nil || oldEnd.Equal(*end)) {
			return nil // imported already, unchanged
		}
		res.UpdatedRuns++
	}
	if _, err := s.db.Exec(ctx, `INSERT INTO slurm_runs (slurm_job_id, run_start, job_id, segment, state, run_end, gpus, nodes, qos, gpu_util_pct, gpu_mem_mib, imported_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
		ON CONFLICT (slurm_job_id, run_start) DO UPDATE SET state = EXCLUDED.state, run_end = EXCLUDED.run_end, gpus = EXCLUDED.gpus,
			nodes = EXCLUDED.nodes, qos = EXCLUDED.qos, gpu_util_pct = EXCLUDED.gpu_util_pct, gpu_mem_mib = EXCLUDED.gpu_mem_mib, imported_at = EXCLUDED.imported_at`,
		r.ExternalID, r.Start, id, seg, r.Code, end, r.GPUs, r.Nodes, r.QOS, r.GPUUtilPct, r.GPUMemMiB, s.Now()); err != nil {
		return mapErr("importing run", err)
	}
	if err := s.runAllocations(ctx, m, id, seg, r, end, live); err != nil {
		return err
	}
	if r.State == allot.EnginePreempted && end != nil {
		for rank, node := range r.Nodes {
			var gpus []int32
			if err := s.db.QueryRow(ctx, `SELECT coalesce(array_agg(gpu_index ORDER BY gpu_index), '{}') FROM allocations WHERE job_id = $1 AND segment = $2 AND node = $3`,
				id, seg, node).Scan(&gpus); err != nil {
				return mapErr("loading run GPUs", err)
			}
			if len(gpus) == 0 {
				continue
			}
			if _, err := s.db.Exec(ctx, `INSERT INTO leases (job_id, segment, node, rank, gpu_indices, env, state, offered_at, taken_at, started_at, exited_at,
					exit_reason, stop_reason, seen_at)
				VALUES ($1, $2, $3, $4, $5, '{}', 'exited', $6, $6, $6, $7, 'preempted', 'preempted', $7)
				ON CONFLICT (job_id, segment, node) DO UPDATE SET exited_at = EXCLUDED.exited_at`, id, seg, node, rank, gpus, r.Start, *end); err != nil {
				return mapErr("recording preemption", err)
			}
		}
	}
	// The job: its segments, preemptions, the class it ran as, and its
	// state from its latest run (Allot's own terminal states stay).
	var latest int
	if err := s.db.QueryRow(ctx, `SELECT max(segment) FROM slurm_runs WHERE job_id = $1`, id).Scan(&latest); err != nil {
		return mapErr("loading runs", err)
	}
	runAs := string(r.Tier)
	if !slices.Contains([]string{"1", "2", "3", "4", "preemptible"}, runAs) {
		runAs = ""
	}
	if _, err := s.db.Exec(ctx, `UPDATE jobs SET segment = greatest(segment, $2),
			preemptions = (SELECT count(*) FROM slurm_runs WHERE job_id = $1 AND state = 'PREEMPTED'),
			run_as = CASE WHEN $3 = '' OR $2 < segment THEN run_as ELSE $3 END,
			demoted = demoted OR ($3 = 'preemptible' AND tier <> 'preemptible' AND NOT preemptible)
		WHERE id = $1`, id, seg, runAs); err != nil {
		return mapErr("updating job", err)
	}
	if seg != latest {
		return nil
	}
	var st allot.JobState
	if err := s.db.QueryRow(ctx, `SELECT state FROM jobs WHERE id = $1 FOR UPDATE`, id).Scan(&st); err != nil {
		return mapErr("loading job", err)
	}
	if terminal(st) {
		return nil
	}
	switch {
	case end == nil:
		return s.setEngineJobState(ctx, id, allot.EngineRunning, "", r.Start, time.Time{}, 0, r.Code)
	case r.State == allot.EnginePreempted:
		return s.setEngineJobState(ctx, id, allot.EnginePending, "preempted; requeued by Slurm", time.Time{}, time.Time{}, 0, r.Code)
	case r.State == allot.EngineCompleted || r.State == allot.EngineFailed || r.State == allot.EngineCancelled:
		if err := s.setEngineJobState(ctx, id, allot.EngineRunning, "", r.Start, time.Time{}, 0, r.Code); err != nil {
			return err
		}
		return s.setEngineJobState(ctx, id, r.State, "", time.Time{}, r.End, r.ExitCode, r.Code)
	}
	return nil
}

// runAllocations writes a run's GPUs as allocations (per node, an equal
// share of its GPUs), or moves their times to what the engine says now.
func (s *Store) runAllocations(ctx context.Context, m EngineMapping, id int64, seg int, r *allot.EngineRun, end *time.Time, live map[string][]int) error {
	var have int
	if err := s.db.QueryRow(ctx, `SELECT count(*) FROM allocations WHERE job_id = $1 AND segment = $2`, id, seg).Scan(&have); err != nil {
		return mapErr("loading allocations", err)
	}
	if have > 0 {
		_, err := s.db.Exec(ctx, `UPDATE allocations SET started_at = $3, released_at = $4
			WHERE job_id = $1 AND segment = $2 AND (started_at <> $3 OR released_at IS DISTINCT FROM $4)`, id, seg, r.Start, end)
		return mapErr("updating allocations", err)
	}
	per, extra := r.GPUs/len(r.Nodes), r.GPUs%len(r.Nodes)
	for i, node := range r.Nodes {
		k := per
		if i < extra {
			k++
		}
		if k == 0 {
			continue
		}
		size, err := s.ensureEngineNode(ctx, m, node, k, r.GPUType)
		if err != nil {
			return err
		}
		idx := live[node]
		if len(idx) != k {
			idx, err = s.freeGPUs(ctx, node, k, size, end == nil)
			if err != nil {
				return err
			}
		}
		for _, g := range idx {
			if _, err := s.db.Exec(ctx, `INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at) VALUES ($1, $2, $3, $4, $5, $6)`,
				id, seg, node, g, r.Start, end); err != nil {
				return mapErr(fmt.Sprintf("allocating GPU %d of %s to Slurm job %d", g, node, r.ExternalID), err)
			}
		}
	}
	return nil
}

// freeGPUs picks k GPU indices of node: the lowest not held by an open
// allocation when the run still runs (the database refuses a GPU in two),
// else the first k.
func (s *Store) freeGPUs(ctx context.Context, node string, k, size int, open bool) ([]int, error) {
	var held []int32
	if open {
		if err := s.db.QueryRow(ctx, `SELECT coalesce(array_agg(gpu_index), '{}') FROM allocations WHERE node = $1 AND released_at IS NULL`, node).Scan(&held); err != nil {
			return nil, mapErr("loading held GPUs", err)
		}
	}
	var out []int
	for g := 0; len(out) < k && g < allot.MaxGPUsPerNode; g++ {
		if !slices.Contains(held, int32(g)) {
			out = append(out, g)
		}
	}
	if len(out) < k || (open && out[len(out)-1] >= size) {
		return nil, allot.Errorf(allot.EConflict, "node %s has no %d free GPUs for a running Slurm job: Slurm and Allot disagree about what runs there", node, k)
	}
	return out, nil
}

// ensureEngineNode returns the GPU count of node, adding it (down: the
// engine no longer lists it) when accounting names a node Allot never saw.
func (s *Store) ensureEngineNode(ctx context.Context, m EngineMapping, node string, gpus int, gpuType string) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, `SELECT gpu_count FROM nodes WHERE name = $1`, node).Scan(&n)
	if err == nil {
		return n, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, mapErr("loading node", err)
	}
	types, err := s.engineGPUTypes(ctx, m.Backend)
	if err != nil {
		return 0, err
	}
	typ := engineType(types, gpuType, m.DefaultGPUType)
	if typ == "" {
		return 0, fmt.Errorf("node %s of a Slurm run has no Allot GPU type: set the Slurm default GPU type", node)
	}
	_, err = s.db.Exec(ctx, `INSERT INTO nodes (name, gpu_type, gpu_count, site, state, state_reason, backend)
		VALUES ($1, $2, $3, 'onprem', 'down', 'known from Slurm accounting only', $4) ON CONFLICT (name) DO NOTHING`, node, typ, max(gpus, 1), m.Backend)
	return max(gpus, 1), mapErr("adding node", err)
}

// EngineSyncState is the last word from the engine.
type EngineSyncState struct {
	Cluster, Version string
	Cursor           time.Time
	LastOK           time.Time
	LastError        string
	LastErrorAt      time.Time
	DownSince        time.Time
	RunsImported     int64
	JobsImported     int64
	Unmapped         map[string]int
}

// EngineSync returns the sync state (zero before the first sync).
func (s *Store) EngineSync(ctx context.Context) (EngineSyncState, error) {
	var st EngineSyncState
	var cursor, ok, errAt, down *time.Time
	var unmapped []byte
	err := s.db.QueryRow(ctx, `SELECT cluster, version, import_cursor, last_ok_at, last_error, last_error_at, down_since, runs_imported, jobs_imported, unmapped
		FROM slurm_sync`).Scan(&st.Cluster, &st.Version, &cursor, &ok, &st.LastError, &errAt, &down, &st.RunsImported, &st.JobsImported, &unmapped)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, mapErr("loading Slurm sync state", err)
	}
	st.Cursor, st.LastOK, st.LastErrorAt, st.DownSince = deref(cursor), deref(ok), deref(errAt), deref(down)
	_ = json.Unmarshal(unmapped, &st.Unmapped)
	return st, nil
}

// RecordEngineSync records a sync's outcome: its error (nil: it worked),
// the import cursor reached (zero: unchanged) and what could not be mapped.
func (s *Store) RecordEngineSync(ctx context.Context, cluster, version string, cause error, cursor time.Time, unmapped []string) error {
	now := s.Now()
	var cur *time.Time
	if !cursor.IsZero() {
		cur = &cursor
	}
	counts := map[string]int{}
	for _, u := range unmapped {
		if i := strings.Index(u, ": "); i >= 0 {
			u = u[i+2:]
		}
		counts[u]++
	}
	um, _ := json.Marshal(counts)
	msg := ""
	if cause != nil {
		msg = cause.Error()
		if len(msg) > 1000 {
			msg = msg[:1000]
		}
	}
	_, err := s.db.Exec(ctx, `INSERT INTO slurm_sync (id, cluster, version, import_cursor, last_ok_at, last_error, last_error_at, down_since, unmapped, updated_at)
		VALUES (true, $1, $2, $3, CASE WHEN $4 = '' THEN $5::timestamptz END, $4, CASE WHEN $4 <> '' THEN $5::timestamptz END,
			CASE WHEN $4 <> '' THEN $5::timestamptz END, $6, $5)
		ON CONFLICT (id) DO UPDATE SET
			cluster = CASE WHEN EXCLUDED.cluster = '' THEN slurm_sync.cluster ELSE EXCLUDED.cluster END,
			version = CASE WHEN EXCLUDED.version = '' THEN slurm_sync.version ELSE EXCLUDED.version END,
			import_cursor = coalesce(EXCLUDED.import_cursor, slurm_sync.import_cursor),
			last_ok_at = coalesce(EXCLUDED.last_ok_at, slurm_sync.last_ok_at),
			last_error = EXCLUDED.last_error,
			last_error_at = coalesce(EXCLUDED.last_error_at, slurm_sync.last_error_at),
			down_since = CASE WHEN EXCLUDED.last_error = '' THEN NULL ELSE coalesce(slurm_sync.down_since, EXCLUDED.down_since) END,
			unmapped = CASE WHEN EXCLUDED.last_error = '' THEN EXCLUDED.unmapped ELSE slurm_sync.unmapped END,
			updated_at = EXCLUDED.updated_at`,
		cluster, version, cur, msg, now, um)
	return mapErr("recording Slurm sync", err)
}

// EngineJobInfo is the engine's side of one job, for its page.
type EngineJobInfo struct {
	ExternalID    int64
	Origin        string // allot or sbatch
	Account, User string
	QOS           string
	Partition     string
	State         string
	Reason        string
	StartEstimate time.Time
	Nodes         []string
	SubmitError   string
	Runs          []EngineRunInfo
}

// EngineRunInfo is one imported run.
type EngineRunInfo struct {
	Segment    int
	State      string
	Start, End time.Time
	GPUs       int
	Nodes      []string
	QOS        string
	GPUUtilPct *float64
	GPUMemMiB  *int64
}

// EngineJob returns the engine's side of job id (ok false: a native job).
func (s *Store) EngineJob(ctx context.Context, id int64) (EngineJobInfo, bool, error) {
	var in EngineJobInfo
	var ext *int64
	var est *time.Time
	err := s.db.QueryRow(ctx, `SELECT slurm_job_id, origin, account, slurm_user, qos, partition, state, reason, start_estimate, nodes, submit_error
		FROM slurm_jobs WHERE job_id = $1`, id).Scan(&ext, &in.Origin, &in.Account, &in.User, &in.QOS, &in.Partition, &in.State, &in.Reason, &est, &in.Nodes, &in.SubmitError)
	if errors.Is(err, pgx.ErrNoRows) {
		return in, false, nil
	}
	if err != nil {
		return in, false, mapErr("loading Slurm job", err)
	}
	if ext != nil {
		in.ExternalID = *ext
	}
	in.StartEstimate = deref(est)
	rows, err := s.db.Query(ctx, `SELECT segment, state, run_start, run_end, gpus, nodes, qos, gpu_util_pct, gpu_mem_mib FROM slurm_runs WHERE job_id = $1 ORDER BY segment`, id)
	if err != nil {
		return in, true, mapErr("loading Slurm runs", err)
	}
	in.Runs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (EngineRunInfo, error) {
		var x EngineRunInfo
		var e *time.Time
		err := r.Scan(&x.Segment, &x.State, &x.Start, &e, &x.GPUs, &x.Nodes, &x.QOS, &x.GPUUtilPct, &x.GPUMemMiB)
		x.End = deref(e)
		return x, err
	})
	return in, true, mapErr("loading Slurm runs", err)
}

// EngineSyncLock takes the engine sync's lock (a PostgreSQL session lock
// on a connection of its own), so that one sync runs at a time across
// workers. With wait it waits for the sync that holds it (until ctx ends);
// without, ok is false when another sync holds it.
func (s *Store) EngineSyncLock(ctx context.Context, wait bool) (release func(), ok bool, err error) {
	p := s.Pool()
	if p == nil {
		return nil, false, errors.New("the engine sync lock needs the pool, not a transaction")
	}
	conn, err := p.Acquire(ctx)
	if err != nil {
		return nil, false, mapErr("taking the engine sync lock", err)
	}
	q := `SELECT pg_try_advisory_lock(hashtext('allot.engine_sync'))`
	if wait {
		q = `SELECT pg_advisory_lock(hashtext('allot.engine_sync')) IS NOT NULL`
	}
	if err := conn.QueryRow(ctx, q).Scan(&ok); err != nil || !ok {
		conn.Release()
		return nil, false, mapErr("taking the engine sync lock", err)
	}
	return func() {
		_, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtext('allot.engine_sync'))`)
		conn.Release()
	}, true, nil
}
