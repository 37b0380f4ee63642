package store

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// MonthStart returns the first instant of t's month in UTC.
func MonthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// usageSQL is the one definition of "GPU-seconds used in [from, to)": the
// allocations (a, joined to their jobs j) overlapping the window, each
// clipped to it, running ones counted up to the window's end. from and to
// are SQL placeholders; teamFilter is an extra condition ("" for none);
// byTeam groups the sum by team (and selects the team first).
func usageSQL(from, to, teamFilter string, byTeam bool) string {
	q := `SELECT `
	if byTeam {
		q += `j.team, `
	}
	q += `coalesce(sum(floor(extract(epoch FROM least(coalesce(a.released_at, ` + to + `), ` + to + `) - greatest(a.started_at, ` + from + `)))), 0)::bigint
		FROM allocations a JOIN jobs j ON j.id = a.job_id
		WHERE a.started_at < ` + to + ` AND coalesce(a.released_at, 'infinity'::timestamptz) > ` + from
	if teamFilter != "" {
		q += ` AND ` + teamFilter
	}
	if byTeam {
		q += ` GROUP BY j.team`
	}
	return q
}

// TeamUsageBetween returns the GPU-seconds allocated to team's jobs in
// [from, to) (running allocations count up to to).
func (s *Store) TeamUsageBetween(ctx context.Context, team string, from, to time.Time) (int64, error) {
	var used int64
	err := s.db.QueryRow(ctx, usageSQL("$2", "$3", "j.team = $1", false), team, from, to).Scan(&used)
	return used, mapErr(fmt.Sprintf("computing usage of team %q", team), err)
}

// TeamMonthUsage returns the GPU-seconds allocated to team's jobs in the
// month containing s.Now(), up to now (running allocations count up to now).
func (s *Store) TeamMonthUsage(ctx context.Context, team string) (int64, error) {
	now := s.Now()
	var used int64
	err := s.db.QueryRow(ctx, usageSQL("$2", "$3", "j.team = $1", false), team, MonthStart(now), now).Scan(&used)
	return used, mapErr(fmt.Sprintf("computing usage of team %q", team), err)
}

// monthUsage is a team's usage of one month as submitContext last summed
// it: at business time asOf, with the allocations as they were at epoch
// (allocations_epoch, moved on by every committed change to allocations).
type monthUsage struct {
	epoch   int64
	asOf    time.Time
	used    int64 // GPU-seconds
	running int64 // of its allocations, those still running at asOf
	stored  time.Time
}

// at is the usage at the last whole second after asOf that is not after
// now, exactly, while the allocations are unchanged: the finished ones
// count the same, each running one a whole number of seconds more (the
// sum floors each allocation's seconds). So a cached sum is at most a
// second older than a fresh one.
func (m monthUsage) at(now time.Time) int64 {
	return m.used + m.running*int64(now.Sub(m.asOf)/time.Second)
}

// monthUsageTTL bounds how long a cached sum is used at all: the epoch is
// moved on as a change commits, so a sum read in that instant could miss
// it; this bounds that.
const monthUsageTTL = 5 * time.Second

type monthUsageKey struct {
	db    DBTX // the pool: one database
	team  string
	month time.Time
}

// monthUsages are the sums of every Store of this process, by pool (a
// Store in a transaction keeps none: its db is the transaction).
var monthUsages poolCache[monthUsageKey, monthUsage]

func (s *Store) cachedMonthUsage(team string, month, now time.Time) (monthUsage, bool) {
	if s.Pool() == nil {
		return monthUsage{}, false
	}
	m, ok := monthUsages.get(monthUsageKey{s.db, team, month})
	if !ok || now.Before(m.asOf) || time.Since(m.stored) > monthUsageTTL {
		return monthUsage{}, false
	}
	return m, true
}

func (s *Store) cacheMonthUsage(team string, month time.Time, m monthUsage) {
	if s.Pool() == nil {
		return
	}
	m.stored = time.Now()
	monthUsages.put(monthUsageKey{s.db, team, month}, m)
}

// maxGangs is the largest gang per GPU type as submitContext last read
// it, with the nodes at epoch (nodes_epoch).
type maxGangs struct {
	epoch  int64
	types  []string
	gangs  []int32
	stored time.Time
}

// gangsByPool are the maxGangs of every pool of this process.
var gangsByPool poolCache[DBTX, maxGangs]

func (s *Store) cachedGangs() (maxGangs, bool) {
	if s.Pool() == nil {
		return maxGangs{}, false
	}
	g, ok := gangsByPool.get(s.db)
	if !ok || time.Since(g.stored) > monthUsageTTL {
		return maxGangs{}, false
	}
	return g, true
}

func (s *Store) cacheGangs(g maxGangs) {
	if s.Pool() == nil {
		return
	}
	g.stored = time.Now()
	gangsByPool.put(s.db, g)
}

// submitEpochs are the three sequences moved on by every committed change
// to what a submission is judged on: allocations (a team's usage), nodes
// (the largest gang) and the configuration (budgets, tiers, GPU types,
// POSIX accounts; migration 0034). ok: they were read.
type submitEpochs struct {
	allocations, nodes, config int64
	ok                         bool
}

// epochSQL reads epoch sequence seq's current value (a scalar subquery).
func epochSQL(seq string) string {
	return `(SELECT last_value + is_called::int FROM ` + seq + `)`
}

// submitEpochsSQL reads the three epochs (three columns).
var submitEpochsSQL = epochSQL("allocations_epoch") + ", " + epochSQL("nodes_epoch") + ", " + epochSQL("config_epoch")

// epochsKey keys the submitEpochs a request's token was read with
// (UserByAPITokenContext).
type epochsKey struct{}

// judged is everything submitContext read for one team, tier, submitter
// and month, at epochs ep.
type judged struct {
	ep                           submitEpochs
	budget, maxRuntime           *int64
	types, engineTypes           []string
	nativeTypes                  int64
	gangTypes                    []string
	gangs                        []int32
	mapped, claimed, teamAccount string
	usage                        monthUsage
	stored                       time.Time // when its oldest part was read (a stopwatch)
	keep                         bool      // read at a settled configuration epoch
}

type judgedKey struct {
	db         DBTX
	team, tier string
	user       int64
	month      time.Time
}

// judgedContexts are the contexts of every pool of this process. A
// request whose token was read with the same three epochs reuses one (for
// at most monthUsageTTL: a change read in the instant its epoch moves is
// missed until then, as for the month usage).
var judgedContexts poolCache[judgedKey, *judged]

func (s *Store) cachedJudged(k judgedKey, ep submitEpochs, now time.Time) (*judged, bool) {
	if s.Pool() == nil || !ep.ok {
		return nil, false
	}
	r, _ := judgedContexts.get(k)
	// A stopwatch for the cache, not product time.
	if r == nil || r.ep != ep || now.Before(r.usage.asOf) || time.Since(r.stored) > monthUsageTTL {
		return nil, false
	}
	return r, true
}

func (s *Store) cacheJudged(k judgedKey, r *judged) {
	if s.Pool() == nil || !r.keep || r.budget == nil || r.maxRuntime == nil {
		return // only what an accepted submission is judged on is kept
	}
	judgedContexts.put(k, r)
}

// configSeen is, per pool, the newest configuration epoch this process
// has read and when it first read it.
var configSeen poolCache[DBTX, seenEpoch]

type seenEpoch struct {
	epoch int64
	at    time.Time
}

// configSettled notes that epoch was read now and reports whether this
// process has seen it for at least ConfigSettle: a change commits within
// a moment of moving the epoch, so a context read at a settled epoch holds
// every change up to it.
func (s *Store) configSettled(epoch int64) bool {
	settle := s.ConfigSettle
	if settle == 0 {
		settle = time.Second
	}
	settled := false
	configSeen.update(s.db, func(e seenEpoch, ok bool) (seenEpoch, bool) {
		if !ok || epoch > e.epoch {
			settled = settle < 0
			// A stopwatch, not product time.
			return seenEpoch{epoch: epoch, at: time.Now()}, true
		}
		settled = epoch == e.epoch && (settle < 0 || time.Since(e.at) >= settle)
		return e, false
	})
	return settled
}

// submitContext loads what a submission is judged on: from the context
// judged for an earlier submission of the same team, tier and submitter
// when ctx carries the epochs read with this request's token and none of
// them moved since (no round trip), else with one query.
func (s *Store) submitContext(ctx context.Context, u *allot.User, spec *allot.JobSpec) (allot.SubmitContext, int64, int64, error) {
	now := s.Now()
	userID := int64(-1) // no submitter: no account to resolve
	if u != nil {
		userID = u.ID
	}
	k := judgedKey{db: s.db, team: spec.Team, tier: string(spec.Tier), user: userID, month: MonthStart(now)}
	ep, _ := ctx.Value(epochsKey{}).(submitEpochs)
	r, ok := s.cachedJudged(k, ep, now)
	if !ok {
		var err error
		if r, err = s.loadJudged(ctx, spec, userID, k.month, now); err != nil {
			return allot.SubmitContext{Submitter: u, MaxGang: map[string]int{"": 0}}, 0, 0, err
		}
		s.cacheJudged(k, r)
	}
	return r.context(s, u, spec, now)
}

// loadJudged reads what a submission of spec by userID is judged on.
func (s *Store) loadJudged(ctx context.Context, spec *allot.JobSpec, userID int64, month, now time.Time) (*judged, error) {
	// One round trip: the team's budget and this month's usage, the tier,
	// the GPU types, the largest gang per type, and the POSIX accounts the
	// job could run as (resolveAccount's three, read here to save a round
	// trip per submission: keep the two in step).
	// A stopwatch for the caches, not product time.
	r := &judged{ep: submitEpochs{ok: true}, stored: time.Now()}
	var used *int64
	var running int64
	cached, haveCache := s.cachedMonthUsage(spec.Team, month, now)
	wantEpoch := int64(-1)
	if haveCache {
		wantEpoch = cached.epoch
	}
	gang, haveGang := s.cachedGangs()
	wantNodes := int64(-1)
	if haveGang {
		wantNodes = gang.epoch
	}
	err := s.db.QueryRow(ctx, `
		SELECT
			(SELECT monthly_budget_gpu_hours FROM teams WHERE slug = $1),
			us.used, us.running, ep.v, ne.v, `+epochSQL("config_epoch")+`,
			(SELECT max_runtime_s FROM tiers WHERE id = $2),
			(SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM gpu_types),
			(SELECT coalesce(array_agg(name ORDER BY name) FILTER (WHERE backend <> 'native' AND retired_at IS NULL), '{}') FROM gpu_types),
			(SELECT count(*) FILTER (WHERE backend = 'native' AND retired_at IS NULL) FROM gpu_types),
			g.types, g.gangs,
			`+accountSourcesSQL("$5", "$1")+`
		FROM (SELECT `+epochSQL("nodes_epoch")+` AS v) ne
		-- The largest gang per GPU type, only when a node changed since
		-- the cached one ($7).
		CROSS JOIN LATERAL (SELECT coalesce(array_agg(gpu_type ORDER BY gpu_type), '{}') AS types, coalesce(array_agg(m ORDER BY gpu_type), '{}') AS gangs
			FROM (SELECT gpu_type, max(total)::int AS m FROM (
				SELECT gpu_type, CASE WHEN domain = '' THEN gpu_count ELSE sum(gpu_count) OVER (PARTITION BY gpu_type, domain) END AS total
				FROM nodes WHERE ne.v <> $7) d GROUP BY gpu_type) x) g
		CROSS JOIN (SELECT `+epochSQL("allocations_epoch")+` AS v) ep
		-- The month's usage (usageSQL's sum, and how many of its
		-- allocations still run), only when an allocation changed since the
		-- cached sum ($6): otherwise the scan is skipped.
		CROSS JOIN LATERAL (
			SELECT coalesce(sum(floor(extract(epoch FROM least(coalesce(a.released_at, $4), $4) - greatest(a.started_at, $3)))), 0)::bigint AS used,
				count(*) FILTER (WHERE a.released_at IS NULL) AS running
			FROM allocations a JOIN jobs j ON j.id = a.job_id
			WHERE ep.v <> $6 AND a.started_at < $4 AND coalesce(a.released_at, 'infinity'::timestamptz) > $3 AND j.team = $1) us`,
		spec.Team, string(spec.Tier), month, now, userID, wantEpoch, wantNodes).Scan(&r.budget, &used, &running, &r.ep.allocations, &r.ep.nodes, &r.ep.config,
		&r.maxRuntime, &r.types, &r.engineTypes, &r.nativeTypes, &r.gangTypes, &r.gangs, &r.mapped, &r.claimed, &r.teamAccount)
	if err != nil {
		return nil, mapErr("loading the submission context", err)
	}
	r.keep = s.configSettled(r.ep.config)
	if haveGang && r.ep.nodes == wantNodes {
		r.gangTypes, r.gangs = gang.types, gang.gangs
		if gang.stored.Before(r.stored) {
			r.stored = gang.stored
		}
	} else {
		s.cacheGangs(maxGangs{epoch: r.ep.nodes, types: r.gangTypes, gangs: r.gangs})
	}
	switch {
	case haveCache && r.ep.allocations == wantEpoch:
		r.usage = cached
		if cached.stored.Before(r.stored) {
			r.stored = cached.stored
		}
	case r.budget != nil:
		r.usage = monthUsage{epoch: r.ep.allocations, asOf: now, used: *used, running: running}
		s.cacheMonthUsage(spec.Team, month, r.usage)
	default:
		r.usage = monthUsage{asOf: now} // no such team: nothing used
	}
	return r, nil
}

// context is the submission context r gives for u's spec at now, with the
// team's budget and its month usage up to now.
func (r *judged) context(s *Store, u *allot.User, spec *allot.JobSpec, now time.Time) (allot.SubmitContext, int64, int64, error) {
	c := allot.SubmitContext{Submitter: u, MaxGang: map[string]int{"": 0}}
	c.TeamFound = r.budget != nil
	c.RequireAccount = s.RequirePOSIXAccount
	// An external engine (Slurm) runs every job as its submitter's account:
	// a job without one is refused here, not by the engine later.
	if slices.Contains(r.engineTypes, spec.GPUType) || (spec.GPUType == "" && len(r.engineTypes) > 0 && r.nativeTypes == 0) {
		c.RequireAccount = true
	}
	if u != nil && c.TeamFound {
		c.Account, c.AccountSource = allot.ResolveAccount(r.mapped, r.claimed, r.teamAccount)
	}
	if r.maxRuntime != nil {
		c.Tier = &allot.Tier{ID: spec.Tier, MaxRuntime: time.Duration(*r.maxRuntime) * time.Second}
	}
	c.GPUTypes = slices.Clone(r.types)
	for i, t := range r.gangTypes {
		c.MaxGang[t] = int(r.gangs[i])
		if int(r.gangs[i]) > c.MaxGang[""] {
			c.MaxGang[""] = int(r.gangs[i])
		}
	}
	var b int64
	if r.budget != nil {
		b = *r.budget
	}
	return c, b, r.usage.at(now), nil
}

// QuotaPreview validates spec for u and returns what the budget check would
// say, without writing anything. It is what the form shows before submit.
func (s *Store) QuotaPreview(ctx context.Context, u *allot.User, spec *allot.JobSpec) (allot.QuotaOutcome, error) {
	if err := textErrors(spec); err != nil {
		return allot.QuotaOutcome{}, err
	}
	c, budget, used, err := s.submitContext(ctx, u, spec)
	if err != nil {
		return allot.QuotaOutcome{}, err
	}
	if err := allot.ValidateSubmission(spec, c); err != nil {
		return allot.QuotaOutcome{}, err
	}
	return allot.CheckQuota(spec, budget, used), nil
}

// SubmitJob applies the one submission rule set (validation against the
// cluster, then the budget check, which never blocks) and stores the job
// as pending. It writes nothing when the spec is invalid.
func (s *Store) SubmitJob(ctx context.Context, u *allot.User, spec allot.JobSpec) (allot.Job, error) {
	var job allot.Job
	// No transaction: one read (validation and the advisory budget check)
	// and one insert; nothing needs them to be atomic.
	err := func(tx *Store) error {
		if spec.Name == "" && len(spec.Command) > 0 {
			spec.Name = defaultJobName(spec.Command)
		}
		// Usage comes from allocations, which submissions do not change, so
		// concurrent submits need no lock to see the same budget.
		if err := textErrors(&spec); err != nil {
			return err
		}
		c, budget, used, err := tx.submitContext(ctx, u, &spec)
		if err != nil {
			return err
		}
		if err := allot.ValidateSubmission(&spec, c); err != nil {
			return err
		}
		q := allot.CheckQuota(&spec, budget, used)
		env := spec.Env
		if env == nil {
			env = map[string]string{}
		}
		envJSON, _ := json.Marshal(env)
		secret := spec.SecretEnv
		if secret == nil {
			secret = map[string]string{}
		}
		secretJSON, _ := json.Marshal(sealSecrets(s.Secrets, secret))
		var gpuType *string
		if spec.GPUType != "" {
			gpuType = &spec.GPUType
		}
		var perNode *int
		if spec.GPUsPerNode > 0 {
			perNode = &spec.GPUsPerNode
		}
		const reason = "waiting for the next scheduling cycle"
		job = allot.Job{UserID: u.ID, User: u.Email, JobSpec: spec, State: allot.JobPending, PendingReason: reason,
			QuotaWarning: q.Warning, Demoted: q.Preemptible}
		job.Preemptible = spec.Preemptible || q.Preemptible
		job.Env = env
		job.RunAsUser = c.Account
		job.SecretEnv, job.SecretEnvKeys = nil, slices.Sorted(maps.Keys(secret))
		out, err := tx.insertJob(ctx, &jobRow{Name: spec.Name, Team: spec.Team, UserID: u.ID, Tier: string(spec.Tier), GPUs: spec.GPUs,
			GPUType: gpuType, GPUsPerNode: perNode, TimeLimitS: int64(spec.TimeLimit / time.Second), Command: spec.Command, Env: envJSON,
			WorkDir: spec.WorkDir, Checkpointable: spec.Checkpointable, Preemptible: job.Preemptible, Demoted: q.Preemptible,
			QuotaWarning: q.Warning, PendingReason: reason, SubmittedAt: s.Now(), RunAsUser: c.Account, Image: spec.Image,
			MemoryBytes: spec.MemoryBytes, MilliCPUs: spec.MilliCPUs, SecretEnv: secretJSON})
		job.ID, job.SubmittedAt, job.UpdatedAt, job.Backend = out.ID, out.SubmittedAt, out.UpdatedAt, out.Backend
		if err != nil {
			return mapErr("creating job", err)
		}
		if job.Backend != allot.BackendNative {
			// Another engine (Slurm) places it: the reconciler submits it.
			job.PendingReason = "waiting to be submitted to Slurm"
			_, err = tx.db.Exec(ctx, `UPDATE jobs SET pending_reason = $2 WHERE id = $1`, job.ID, job.PendingReason)
		}
		return mapErr("creating job", err)
	}(s)
	return job, err
}

func defaultJobName(cmd []string) string {
	name := cmd[0]
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	for _, a := range cmd[1:] {
		if !strings.HasPrefix(a, "-") {
			if i := strings.LastIndex(a, "/"); i >= 0 {
				a = a[i+1:]
			}
			name += " " + a
			break
		}
	}
	var b strings.Builder
	for _, r := range name {
		if r < 128 && (r == ' ' || r == '.' || r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9')) {
			b.WriteRune(r)
		}
	}
	out := strings.TrimLeft(b.String(), " .-_")
	if len(out) > 128 {
		out = out[:128]
	}
	if out == "" {
		out = "job"
	}
	return out
}

const jobSelect = `
	SELECT j.id, j.name, j.team, j.user_id, u.email, j.tier, j.gpus, coalesce(j.gpu_type, ''), coalesce(j.gpus_per_node, 0),
		j.time_limit_s, j.command, j.env, j.workdir, j.checkpointable, j.preemptible, j.demoted, j.state,
		j.submitted_at, j.started_at, j.ended_at, j.exit_code, j.priority, j.priority_breakdown, j.pending_reason,
		j.quota_warning, j.updated_at, j.run_as, j.segment, j.end_reason, j.preemptions,
		j.run_as_user, j.image, j.memory_bytes, j.milli_cpus,
		ARRAY(SELECT jsonb_object_keys(j.secret_env) ORDER BY 1), j.backend
	FROM jobs j JOIN users u ON u.id = j.user_id`

func scanJob(r pgx.Row) (allot.Job, error) {
	var j allot.Job
	var tier, state, runAs string
	var limit int64
	var env, breakdown []byte
	var started, ended *time.Time
	err := r.Scan(&j.ID, &j.Name, &j.Team, &j.UserID, &j.User, &tier, &j.GPUs, &j.GPUType, &j.GPUsPerNode,
		&limit, &j.Command, &env, &j.WorkDir, &j.Checkpointable, &j.Preemptible, &j.Demoted, &state,
		&j.SubmittedAt, &started, &ended, &j.ExitCode, &j.Priority, &breakdown, &j.PendingReason,
		&j.QuotaWarning, &j.UpdatedAt, &runAs, &j.Segment, &j.EndReason, &j.Preemptions,
		&j.RunAsUser, &j.Image, &j.MemoryBytes, &j.MilliCPUs, &j.SecretEnvKeys, &j.Backend)
	if err != nil {
		return j, err
	}
	j.RunAs = allot.TierID(runAs)
	j.Tier, j.State = allot.TierID(tier), allot.JobState(state)
	j.TimeLimit = time.Duration(limit) * time.Second
	if started != nil {
		j.StartedAt = *started
	}
	if ended != nil {
		j.EndedAt = *ended
	}
	if err := json.Unmarshal(env, &j.Env); err != nil {
		return j, fmt.Errorf("decoding env: %w", err)
	}
	if err := json.Unmarshal(breakdown, &j.Breakdown); err != nil {
		return j, fmt.Errorf("decoding priority breakdown: %w", err)
	}
	return j, nil
}

// GetJob returns one job.
func (s *Store) GetJob(ctx context.Context, id int64) (allot.Job, error) {
	j, err := scanJob(s.db.QueryRow(ctx, jobSelect+` WHERE j.id = $1`, id))
	return j, mapErr(fmt.Sprintf("loading job %d", id), err)
}

// JobFilter selects jobs for ListJobs. Zero fields match everything.
type JobFilter struct {
	Teams  []string // restrict to these teams; nil = all teams
	Team   string
	State  allot.JobState
	States []allot.JobState // any of these (with State: State too)
	UserID int64
	// UserEmails: jobs submitted by any of these people (case-insensitive).
	UserEmails []string
	Tier       allot.TierID // as submitted
	// NameContains matches a substring of the name, case-insensitively.
	NameContains string
	BeforeID     int64 // for paging: only jobs after job BeforeID in the list's order (none if there is no such job)
	Limit        int   // default 100, at most 1000; negative: no limit (internal use)
}

// where is f's conditions on jobSelect (joined with AND) and their
// arguments ($1…), without the limit.
func (f JobFilter) where() (where []string, args []any) {
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if f.Teams != nil {
		add("j.team = ANY($%d)", f.Teams)
	}
	if f.Team != "" {
		add("j.team = $%d", f.Team)
	}
	if f.State != "" {
		add("j.state = $%d", string(f.State))
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = string(st)
		}
		add("j.state = ANY($%d)", states)
	}
	if f.UserID != 0 {
		add("j.user_id = $%d", f.UserID)
	}
	if len(f.UserEmails) > 0 {
		emails := make([]string, len(f.UserEmails))
		for i, e := range f.UserEmails {
			emails[i] = strings.ToLower(e)
		}
		add("lower(u.email) = ANY($%d)", emails)
	}
	if f.Tier != "" {
		add("j.tier = $%d", string(f.Tier))
	}
	if f.NameContains != "" {
		add(`j.name ILIKE '%%' || $%d || '%%' ESCAPE '\'`, strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(f.NameContains))
	}
	if f.BeforeID > 0 {
		add("(j.submitted_at, j.id) < (SELECT b.submitted_at, b.id FROM jobs b WHERE b.id = $%d)", f.BeforeID)
	}
	return where, args
}

// ListJobs returns jobs matching f, newest first: by submission time, then
// id (a requeued job keeps its submission time, and jobs created with an
// earlier submission time, like the demo's history, are not listed by
// when their row was written).
func (s *Store) ListJobs(ctx context.Context, f JobFilter) ([]allot.Job, error) {
	where, args := f.where()
	switch {
	case f.Limit == 0:
		f.Limit = 100
	case f.Limit > 1000:
		f.Limit = 1000
	case f.Limit < 0:
		f.Limit = 1 << 30
	}
	q := jobSelect
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, f.Limit)
	q += fmt.Sprintf(" ORDER BY j.submitted_at DESC, j.id DESC LIMIT $%d", len(args))
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, mapErr("listing jobs", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (allot.Job, error) { return scanJob(r) })
	return out, mapErr("listing jobs", err)
}

// CanManageJob reports whether u may cancel j: its submitter, a lead of its
// team, or an admin.
func CanManageJob(u *allot.User, j *allot.Job) bool {
	return u.Admin || u.ID == j.UserID || u.LeadOf(j.Team)
}

// CancelJob cancels a pending or running job on behalf of u. A running
// job's allocations are released now; its agent stops the process.
func (s *Store) CancelJob(ctx context.Context, u *allot.User, id int64) (allot.Job, error) {
	var job allot.Job
	err := s.InTx(ctx, func(tx *Store) error {
		j, err := scanJob(tx.db.QueryRow(ctx, jobSelect+` WHERE j.id = $1 FOR UPDATE OF j`, id))
		if err != nil {
			return mapErr(fmt.Sprintf("loading job %d", id), err)
		}
		if !u.Admin && !u.MemberOf(j.Team) && !u.Finance {
			return fmt.Errorf("loading job %d: %w", id, allot.ErrNotFound)
		}
		if !CanManageJob(u, &j) {
			return allot.Errorf(allot.EForbidden, "only the submitter, a lead of team %s or an admin can cancel job %d", j.Team, id)
		}
		now := s.Now()
		wasRunning := j.State == allot.JobRunning
		if err := j.Transition(allot.JobCancelled, now); err != nil {
			return err
		}
		if _, err := tx.db.Exec(ctx, `UPDATE jobs SET state = $2, ended_at = $3, pending_reason = '', end_reason = 'cancelled by ' || $4, updated_at = $3 WHERE id = $1`,
			id, string(j.State), now, u.Email); err != nil {
			return mapErr("cancelling job", err)
		}
		release := true
		if wasRunning {
			// The agents stop the processes (SIGTERM, grace, SIGKILL); the
			// GPUs are released when each reports the exit.
			p, err := tx.CurrentPolicy(ctx)
			if err != nil {
				return err
			}
			if err := tx.requestStop(ctx, id, j.Segment, "cancelled", p.GracePeriod); err != nil {
				return err
			}
			var leases int
			if err := tx.db.QueryRow(ctx, `SELECT count(*) FROM leases WHERE job_id = $1 AND segment = $2`, id, j.Segment).Scan(&leases); err != nil {
				return mapErr("cancelling job", err)
			}
			release = leases == 0
		}
		if release {
			// Not the hold of an orphan (a lease that ended but whose process
			// its agent still reports): that goes when the agent confirms.
			if _, err := tx.db.Exec(ctx, `UPDATE allocations a SET released_at = greatest($2, a.started_at) WHERE a.job_id = $1 AND a.released_at IS NULL
				AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.job_id = a.job_id AND l.segment = a.segment AND l.node = a.node AND l.orphaned_at IS NOT NULL)`, id, now); err != nil {
				return mapErr("releasing allocations", err)
			}
		}
		job, err = tx.GetJob(ctx, id)
		return err
	})
	return job, err
}

// Allocate records that job holds gpus on node from at. The database
// refuses a GPU that is already in an active allocation (EConflict).
func (s *Store) Allocate(ctx context.Context, jobID int64, node string, gpus []int, at time.Time) (allot.Allocation, error) {
	a := allot.Allocation{JobID: jobID, Node: node, GPUIndices: gpus, StartedAt: at}
	if len(gpus) == 0 {
		return a, (allot.FieldErrors{"gpus": "at least one GPU"}).Err()
	}
	_, err := s.db.Exec(ctx, `
		INSERT INTO allocations (job_id, segment, node, gpu_index, started_at)
		SELECT $1, coalesce((SELECT max(segment) FROM allocations WHERE job_id = $1 AND released_at IS NOT NULL), 0) + 1, $2, g, $4
		FROM unnest($3::int[]) AS g`, jobID, node, gpus, at)
	if err != nil {
		return a, mapErr(fmt.Sprintf("allocating GPUs %v on %s to job %d", gpus, node, jobID), err)
	}
	return a, nil
}

// ActiveAllocations returns the active allocations, one per job and node.
func (s *Store) ActiveAllocations(ctx context.Context) ([]allot.Allocation, error) {
	rows, err := s.db.Query(ctx, `
		SELECT min(id), job_id, node, array_agg(gpu_index ORDER BY gpu_index), min(started_at)
		FROM allocations WHERE released_at IS NULL GROUP BY job_id, node ORDER BY job_id, node`)
	if err != nil {
		return nil, mapErr("listing allocations", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (allot.Allocation, error) {
		var a allot.Allocation
		var g []int32
		err := r.Scan(&a.ID, &a.JobID, &a.Node, &g, &a.StartedAt)
		for _, x := range g {
			a.GPUIndices = append(a.GPUIndices, int(x))
		}
		return a, err
	})
	return out, mapErr("listing allocations", err)
}

// RecordFinishedJob stores a job that already ran on node's gpus from start
// to end and finished in state (completed, failed or cancelled). It is used
// for imports and demo history; the allocation constraint still applies.
func (s *Store) RecordFinishedJob(ctx context.Context, u *allot.User, spec allot.JobSpec, state allot.JobState, submitted, start, end time.Time, node string, gpus []int) error {
	if !state.Terminal() {
		return allot.Errorf(allot.EInvalid, "a finished job must be completed, failed or cancelled, not %s", state)
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	return s.InTx(ctx, func(tx *Store) error {
		var gpuType *string
		if spec.GPUType != "" {
			gpuType = &spec.GPUType
		}
		var exit *int
		if code := map[allot.JobState]int{allot.JobCompleted: 0, allot.JobFailed: 1}[state]; state != allot.JobCancelled {
			exit = &code
		}
		var id int64
		err := tx.db.QueryRow(ctx, `
			INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, state, submitted_at, started_at, ended_at, exit_code, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $12) RETURNING id`,
			spec.Name, spec.Team, u.ID, string(spec.Tier), spec.GPUs, gpuType, int64(spec.TimeLimit/time.Second), spec.Command,
			string(state), submitted, start, end, exit).Scan(&id)
		if err != nil {
			return mapErr("recording job", err)
		}
		_, err = tx.db.Exec(ctx, `INSERT INTO allocations (job_id, node, gpu_index, started_at, released_at) SELECT $1, $2, g, $4, $5 FROM unnest($3::int[]) g`,
			id, node, gpus, start, end)
		return mapErr("recording allocation", err)
	})
}

// textErrors returns the spec's field errors about text that cannot even be
// looked up (NUL bytes, invalid UTF-8), before anything goes to the database.
func textErrors(spec *allot.JobSpec) error {
	f := allot.FieldErrors{}
	for k, v := range allot.Fields(spec.Validate()) {
		if strings.HasPrefix(v, "must be valid text") {
			f[k] = v
		}
	}
	return f.Err()
}
