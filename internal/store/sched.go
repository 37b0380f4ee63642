package store

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// cycleLock is the advisory lock that makes scheduling cycles run one at a
// time across every worker process.
const cycleLock = 7_401_223_010

// TryCycleLock takes the scheduling-cycle lock for the current transaction.
// It returns false when another cycle holds it.
func (s *Store) TryCycleLock(ctx context.Context) (bool, error) {
	var ok bool
	err := s.db.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, cycleLock).Scan(&ok)
	return ok, mapErr("taking the cycle lock", err)
}

// RequestSchedule records a request for a scheduling cycle and returns its
// number.
func (s *Store) RequestSchedule(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.QueryRow(ctx, `SELECT nextval('schedule_requests')`).Scan(&n)
	return n, mapErr("requesting a scheduling cycle", err)
}

// LastScheduleRequest returns the number of the newest request.
func (s *Store) LastScheduleRequest(ctx context.Context) (int64, error) {
	var n int64
	var called bool
	err := s.db.QueryRow(ctx, `SELECT last_value, is_called FROM schedule_requests`).Scan(&n, &called)
	if !called {
		n = 0
	}
	return n, mapErr("reading schedule requests", err)
}

// NodeGPUs is a set of GPUs on one node.
type NodeGPUs struct {
	Node string
	GPUs []int
}

// RunningJob is a running job with where it runs and whether it is being
// stopped.
type RunningJob struct {
	allot.Job
	Parts          []NodeGPUs
	AllocStart     time.Time // when this segment's GPUs were allocated
	StopRequested  time.Time // zero unless a stop (preemption, cancel) is under way
	Grace          time.Duration
	PreemptedBy    int64
	LastCheckpoint time.Time // newest checkpoint the agents saw this segment (zero: none)
}

// SchedState is everything a scheduling cycle reads, loaded in one
// transaction.
type SchedState struct {
	Now       time.Time
	Policy    allot.Policy
	Tiers     []allot.Tier // class order and preemption rights as admins set them
	Nodes     []allot.Node
	Teams     []allot.Team
	Usage     map[string]float64 // decayed GPU-seconds by team
	MonthUsed map[string]int64   // GPU-seconds this month by team
	// Running and Pending are the native jobs in ListJobs' order, with
	// only what a cycle plans with (jobsForCycle: no command, env, image
	// or secrets).
	Running []RunningJob
	Pending []allot.Job
	// Held are GPUs in active allocations of jobs that no longer run
	// (their processes are still stopping); nobody may take them.
	Held []NodeGPUs
}

// LoadSchedState reads the cluster, queue, usage and policy.
func (s *Store) LoadSchedState(ctx context.Context) (SchedState, error) {
	return s.LoadSchedStateCached(ctx, nil)
}

// SchedCache is what a scheduler keeps between its cycles so that a cycle
// does not re-read what cannot have changed (LoadSchedStateCached): the
// open allocations and this month's usage of every team, kept with the
// allocations epoch they were read at, and the pending and running jobs,
// kept with their rows' versions. The zero value is empty. A cache
// serves one database, and one load at a time.
type SchedCache struct {
	// epoch is the allocations epoch of what is kept; settled says that
	// every change to allocations up to it was visible when it was read.
	epoch   int64
	settled bool
	month   monthSums
	allocs  []allocGroup // ok with allocsOK
	allocOK bool
	// pendingRows and runningRows are the jobs as read, by row version
	// (jobsForCycle).
	pendingRows, runningRows jobCache
	// MonthSums and AllocReads count the loads that summed this month's
	// usage, and read the open allocations, from the database (the others
	// carried the kept ones on).
	MonthSums, AllocReads int
}

// JobRows counts the job rows the loads read whole.
func (c *SchedCache) JobRows() int { return c.pendingRows.reads + c.runningRows.reads }

// settle reads the allocations epoch. When it moved since c's, what c
// keeps is dropped, and what this load reads may be kept only if no other
// session holds a write lock on allocations now: a change moves the epoch
// on at its commit, a moment before it is visible, and holds the lock
// until it is, so with none held every change up to the epoch read is
// visible to the statements that follow (the team page reads its sums the
// same way, teamPageSumsFor). A change after the read moves the epoch on
// again.
func (s *Store) settle(ctx context.Context, c *SchedCache) error {
	var epoch int64
	if err := s.db.QueryRow(ctx, `SELECT last_value + is_called::int FROM allocations_epoch`).Scan(&epoch); err != nil {
		return mapErr("reading the allocations epoch", err)
	}
	if c.settled && c.epoch == epoch {
		return nil
	}
	c.epoch, c.settled, c.month, c.allocs, c.allocOK = epoch, false, monthSums{}, nil, false
	var writing bool
	err := s.db.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_locks l
			WHERE l.locktype = 'relation' AND l.relation = 'allocations'::regclass
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND l.mode IN ('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
				AND l.pid <> pg_backend_pid())`).Scan(&writing)
	c.settled = err == nil && !writing
	return mapErr("reading the allocations epoch", err)
}

// monthSums is every team's usage of one month at asOf (a whole second
// of business time), with the allocations as they were at epoch.
type monthSums struct {
	ok    bool
	month time.Time
	asOf  time.Time
	used  map[string]int64 // GPU-seconds in [month, asOf)
	open  map[string]int64 // of them, allocations still open at asOf
}

// at is the usage at now (not before asOf, in the same month), exactly,
// while the allocations are as they were: the released ones count the
// same, and each open one (started on a whole second, or before the
// month) adds one GPU-second per whole second, as usageSQL floors it.
func (m *monthSums) at(now time.Time) map[string]int64 {
	out := make(map[string]int64, len(m.used))
	d := now.Unix() - m.asOf.Unix()
	for team, used := range m.used {
		out[team] = used + m.open[team]*d
	}
	return out
}

// monthUsageSQL is usageSQL's sum by team over [$1, $2), with how many of
// each team's allocations are still open, and whether the sum can be
// carried on in time (no allocation starts or ends after $2, the open ones
// start on whole seconds).
const monthUsageSQL = `
	SELECT j.team,
		coalesce(sum(floor(extract(epoch FROM least(coalesce(a.released_at, $2), $2) - greatest(a.started_at, $1)))) FILTER (WHERE a.started_at < $2), 0)::bigint,
		count(*) FILTER (WHERE a.started_at < $2),
		count(*) FILTER (WHERE a.started_at < $2 AND a.released_at IS NULL),
		bool_and(a.started_at < $2 AND coalesce(a.released_at, $2) <= $2 AND (a.released_at IS NOT NULL OR a.started_at = date_trunc('second', a.started_at)))
	FROM allocations a JOIN jobs j ON j.id = a.job_id
	WHERE coalesce(a.released_at, 'infinity'::timestamptz) > $1 GROUP BY j.team`

// monthUsed returns every team's GPU-seconds this month up to now, as
// usageSQL sums them. With a cache, sums kept from an earlier load at the
// same allocations epoch (see settle) are carried on to now; else they are
// summed again, and kept when settled.
func (s *Store) monthUsed(ctx context.Context, now time.Time, c *SchedCache) (map[string]int64, error) {
	month := MonthStart(now)
	if c != nil {
		if m := &c.month; m.ok && m.month.Equal(month) && !now.Before(m.asOf) {
			return m.at(now), nil
		}
		c.month.ok = false
		c.MonthSums++
	}
	rows, err := s.db.Query(ctx, monthUsageSQL, month, now)
	if err != nil {
		return nil, mapErr("loading this month's usage", err)
	}
	used, open := map[string]int64{}, map[string]int64{}
	carry := true
	var team string
	var sum, n, nOpen int64
	var exact *bool
	if _, err := pgx.ForEachRow(rows, []any{&team, &sum, &n, &nOpen, &exact}, func() error {
		carry = carry && exact != nil && *exact
		if n > 0 {
			used[team], open[team] = sum, nOpen
		}
		return nil
	}); err != nil {
		return nil, mapErr("loading this month's usage", err)
	}
	if c != nil && c.settled && carry {
		c.month = monthSums{ok: true, month: month, asOf: now, used: used, open: open}
		return c.month.at(now), nil
	}
	return used, nil
}

// LoadSchedStateCached is LoadSchedState with what c kept from earlier
// loads (nil: none): the same state, reading less.
func (s *Store) LoadSchedStateCached(ctx context.Context, c *SchedCache) (SchedState, error) {
	st := SchedState{Now: s.Now(), Usage: map[string]float64{}}
	var err error
	if st.Policy, err = s.CurrentPolicy(ctx); err != nil {
		return st, err
	}
	if st.Tiers, err = s.ListTiers(ctx); err != nil {
		return st, err
	}
	if st.Nodes, err = s.ListNodes(ctx); err != nil {
		return st, err
	}
	// Nodes and jobs of another engine (Slurm) are that engine's to place.
	st.Nodes = slices.DeleteFunc(st.Nodes, func(n allot.Node) bool { return n.Backend != allot.BackendNative })
	if st.Teams, err = s.ListTeams(ctx); err != nil {
		return st, err
	}
	rows, err := s.db.Query(ctx, `SELECT team, gpu_seconds FROM team_usage`)
	if err != nil {
		return st, mapErr("loading usage", err)
	}
	var team string
	var used float64
	if _, err := pgx.ForEachRow(rows, []any{&team, &used}, func() error { st.Usage[team] = used; return nil }); err != nil {
		return st, mapErr("loading usage", err)
	}
	if c != nil {
		if err := s.settle(ctx, c); err != nil {
			return st, err
		}
	}
	if st.MonthUsed, err = s.monthUsed(ctx, st.Now, c); err != nil {
		return st, err
	}
	// Sized for the last load's jobs, and a little more.
	var pendingRows, runningRows *jobCache
	var pendingHint, runningHint int
	if c != nil {
		pendingRows, runningRows = &c.pendingRows, &c.runningRows
		pendingHint, runningHint = len(c.pendingRows.rows), len(c.runningRows.rows)
	}
	emails, err := s.userEmails(ctx)
	if err != nil {
		return st, err
	}
	if st.Pending, err = s.jobsForCycle(ctx, allot.JobPending, pendingHint+pendingHint/16, pendingRows, emails); err != nil {
		return st, err
	}
	running, err := s.jobsForCycle(ctx, allot.JobRunning, runningHint+runningHint/16, runningRows, emails)
	if err != nil {
		return st, err
	}
	byID := make(map[int64]int, len(running))
	st.Running = make([]RunningJob, len(running))
	for i, j := range running {
		byID[j.ID] = i
		st.Running[i] = RunningJob{Job: j}
	}
	if err := s.loadAllocations(ctx, &st, byID, c); err != nil {
		return st, err
	}
	rows, err = s.db.Query(ctx, `
		SELECT l.job_id, coalesce(min(l.stop_requested_at), '-infinity'), coalesce(max(l.stop_grace_s), 0), coalesce(max(l.preempted_by), 0),
			coalesce(max(l.last_checkpoint) FILTER (WHERE l.last_checkpoint >= l.offered_at), '-infinity')
		FROM leases l JOIN jobs j ON j.id = l.job_id AND j.segment = l.segment AND j.state = 'running'
		WHERE l.stop_requested_at IS NOT NULL OR l.last_checkpoint IS NOT NULL GROUP BY l.job_id`)
	if err != nil {
		return st, mapErr("loading stops", err)
	}
	var jobID int64
	var stopAt, checkpoint pgtype.Timestamptz
	var grace, by int64
	_, err = pgx.ForEachRow(rows, []any{&jobID, &stopAt, &grace, &by, &checkpoint}, func() error {
		i, ok := byID[jobID]
		if !ok {
			return nil
		}
		if stopAt.InfinityModifier == pgtype.Finite {
			st.Running[i].StopRequested, st.Running[i].Grace, st.Running[i].PreemptedBy = stopAt.Time, time.Duration(grace)*time.Second, by
		}
		if checkpoint.InfinityModifier == pgtype.Finite {
			st.Running[i].LastCheckpoint = checkpoint.Time
		}
		return nil
	})
	if err != nil {
		return st, mapErr("loading stops", err)
	}
	return st, nil
}

// allocGroup is one job segment's open allocations on one node.
type allocGroup struct {
	job     int64
	seg     int
	node    string
	gpus    []int     // in order
	started time.Time // the earliest
}

// openAllocations reads the open allocations, grouped by job, node and
// segment, in that order. They are read row by row and grouped here:
// grouping and joining them in SQL (80,000 rows) took several times as
// long as reading them.
func (s *Store) openAllocations(ctx context.Context) ([]allocGroup, error) {
	rows, err := s.db.Query(ctx, `SELECT job_id, segment, node, gpu_index, started_at FROM allocations WHERE released_at IS NULL`)
	if err != nil {
		return nil, mapErr("loading allocations", err)
	}
	type key struct {
		job  int64
		seg  int
		node string
	}
	groups := map[key]int{}
	var out []allocGroup
	var k key
	var gpu int
	var started time.Time
	_, err = pgx.ForEachRow(rows, []any{&k.job, &k.seg, &k.node, &gpu, &started}, func() error {
		i, ok := groups[k]
		if !ok {
			i = len(out)
			groups[k] = i
			out = append(out, allocGroup{job: k.job, seg: k.seg, node: k.node, started: started})
		}
		g := &out[i]
		g.gpus = append(g.gpus, gpu)
		if started.Before(g.started) {
			g.started = started
		}
		return nil
	})
	if err != nil {
		return nil, mapErr("loading allocations", err)
	}
	for i := range out {
		slices.Sort(out[i].gpus)
	}
	slices.SortFunc(out, func(a, b allocGroup) int {
		return cmp.Or(cmp.Compare(a.job, b.job), strings.Compare(a.node, b.node), cmp.Compare(a.seg, b.seg))
	})
	return out, nil
}

// loadAllocations sets the running jobs' (st.Running, indexed by id in
// byID) parts from the open allocations of this segment, by node in name
// order, with AllocStart the earliest start on the last node; the open
// allocations of other native jobs (or of an earlier segment) are Held, in
// job then node order. With a cache, the open allocations kept at the same
// allocations epoch (see settle) are used.
func (s *Store) loadAllocations(ctx context.Context, st *SchedState, byID map[int64]int, c *SchedCache) error {
	var groups []allocGroup
	if c != nil && c.allocOK {
		groups = c.allocs
	} else {
		var err error
		if groups, err = s.openAllocations(ctx); err != nil {
			return err
		}
		if c != nil {
			c.AllocReads++
			if c.settled {
				c.allocs, c.allocOK = groups, true
			}
		}
	}
	var others []int64 // jobs not running here: held if native
	for i := range groups {
		if _, ok := byID[groups[i].job]; !ok && (len(others) == 0 || others[len(others)-1] != groups[i].job) {
			others = append(others, groups[i].job)
		}
	}
	native := map[int64]bool{}
	if len(others) > 0 {
		rows, err := s.db.Query(ctx, `SELECT id FROM jobs WHERE id = ANY($1) AND backend = 'native'`, others)
		if err != nil {
			return mapErr("loading allocations", err)
		}
		var id int64
		if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { native[id] = true; return nil }); err != nil {
			return mapErr("loading allocations", err)
		}
	}
	for i := range groups {
		g := &groups[i]
		// A copy: the kept groups serve the next cycles too.
		p := NodeGPUs{Node: g.node, GPUs: slices.Clone(g.gpus)}
		j, ok := byID[g.job]
		switch {
		case ok && st.Running[j].Segment == g.seg:
			st.Running[j].Parts = append(st.Running[j].Parts, p)
			st.Running[j].AllocStart = g.started
		case ok || native[g.job]:
			st.Held = append(st.Held, p)
		}
	}
	return nil
}

// LeasePart is one node's share of a job start.
type LeasePart struct {
	Node string
	Rank int
	GPUs []int
	Env  map[string]string
}

// StartOrder starts a pending job on exactly these GPUs.
type StartOrder struct {
	JobID         int64
	Parts         []LeasePart
	RunAs         allot.TierID
	Priority      float64
	Breakdown     allot.PriorityBreakdown
	CheckpointDir string
}

// PreemptOrder stops a running job so it goes back to the queue.
type PreemptOrder struct {
	JobID  int64
	By     int64
	Reason string
	Grace  time.Duration
}

// PendingUpdate is what a cycle decided for a job that still waits: its
// priority and why it waits (also written to its jobs row), and its start
// estimate. ApplyPlan stores the list, in its order (the scheduler's), as
// the queue (see JobQueueOf, QueueList).
type PendingUpdate struct {
	JobID     int64
	Priority  float64
	Breakdown allot.PriorityBreakdown
	Reason    string
	EstStart  time.Time // zero: unknown
	EstKind   string    // EstReservation, EstPreemption, EstProjection ("" with no estimate)
	// RowCurrent: the job's row already holds a recent copy of its
	// priority, breakdown and reason (the caller knows what it wrote):
	// ApplyPlan stores this update in the queue only, not in the row.
	RowCurrent bool
}

// ApplyResult counts what a plan did.
type ApplyResult struct {
	Started, Preempted, Skipped int
}

// ApplyPlan writes a cycle's decisions. It must run in the transaction that
// holds the cycle lock. pending, the jobs that still wait in the
// scheduler's order, replaces the stored queue whole. A start whose job is
// no longer pending is skipped;
// a GPU that is already taken, or a node that is not up, aborts the whole
// plan with EConflict (it was built on stale state; the next cycle retries).
func (s *Store) ApplyPlan(ctx context.Context, starts []StartOrder, preempts []PreemptOrder, pending []PendingUpdate) (ApplyResult, error) {
	var res ApplyResult
	now := s.Now()
	if err := s.applyStarts(ctx, starts, now, &res); err != nil {
		return res, err
	}
	for _, p := range preempts {
		var seg int
		err := s.db.QueryRow(ctx, `SELECT segment FROM jobs WHERE id = $1 AND state = 'running' FOR UPDATE`, p.JobID).Scan(&seg)
		if err == pgx.ErrNoRows {
			continue
		}
		if err != nil {
			return res, mapErr("preempting job", err)
		}
		if _, err := s.db.Exec(ctx, `UPDATE leases SET preempted_by = $3 WHERE job_id = $1 AND segment = $2`, p.JobID, seg, p.By); err != nil {
			return res, mapErr("preempting job", err)
		}
		if err := s.requestStop(ctx, p.JobID, seg, "preempted", p.Grace); err != nil {
			return res, err
		}
		if _, err := s.db.Exec(ctx, `UPDATE jobs SET pending_reason = $2 WHERE id = $1`, p.JobID, "being preempted: "+p.Reason); err != nil {
			return res, mapErr("preempting job", err)
		}
		res.Preempted++
	}
	rows := 0
	for i := range pending {
		if !pending[i].RowCurrent {
			rows++
		}
	}
	if rows > 0 && pendingToJobRows {
		ids, prio, reasons := make([]int64, 0, rows), make([]float64, 0, rows), make([]string, 0, rows)
		bds := make([]string, 0, rows)
		for _, p := range pending {
			if p.RowCurrent {
				continue
			}
			b, _ := json.Marshal(p.Breakdown)
			ids, prio, reasons, bds = append(ids, p.JobID), append(prio, p.Priority), append(reasons, p.Reason), append(bds, string(b))
		}
		_, err := s.db.Exec(ctx, `
			UPDATE jobs j SET priority = u.p, priority_breakdown = u.b::jsonb, pending_reason = u.r
			FROM unnest($1::bigint[], $2::float8[], $3::text[], $4::text[]) AS u(id, p, r, b)
			WHERE j.id = u.id AND j.state = 'pending' AND (j.priority, j.pending_reason, j.priority_breakdown) IS DISTINCT FROM (u.p, u.r, u.b::jsonb)`,
			ids, prio, reasons, bds)
		if err != nil {
			return res, mapErr("recording pending reasons", err)
		}
	}
	return res, s.recordQueue(ctx, pending, now)
}

// pendingToJobRows makes ApplyPlan also write each pending job's priority,
// breakdown and reason to its jobs row, when they changed: the job lists
// (jobSelect: ListJobs, GetJob) read them there, per job, which the stored
// queue's arrays do not serve cheaply. It compares the rows it is given
// (BenchmarkQueueApply50k: about 400 ms of the apply at 50,000 pending
// when given all); the scheduler marks RowCurrent the rows whose reason
// and class are as it last wrote them a short while ago, so a priority
// that moves with every cycle's wait (the response order's) is refreshed
// in the rows about once a minute, not every cycle.
const pendingToJobRows = true

// jobsForCycle lists the native jobs in state as ListJobs does (same
// order), with only what a cycle plans with: not their command, workdir,
// image, secrets or env (PendingEnvs reads the env of those that start).
// At 50,000 pending jobs decoding every env was a large part of the
// cycle's load phase, and reading them in ListJobs' order (an index scan
// with a join per row) several times sorting them here. hint is how many
// there may be.
//
// With a cache (kept by a scheduler between its cycles), only the rows
// that changed since the last load are read whole: first every job's id
// and row version (its xmin, the transaction that wrote the visible
// version: any write to the row, committed since, gives it another), then
// the rows whose version the cache does not hold. The users' emails are
// read apart (emails, by user id: a small table), so a changed email
// shows at once. A row version identifies what a transaction wrote last
// only once it committed: a transaction that loads with a cache must not
// have written the jobs before (a cycle writes them after its load). A job
// that left the state between the two reads is left out (the next cycle
// sees it as it is then); one that entered it is seen by the next cycle,
// as a full read just after this one would.
func (s *Store) jobsForCycle(ctx context.Context, state allot.JobState, hint int, c *jobCache, emails map[int64]string) ([]allot.Job, error) {
	const where = `j.state = $1 AND j.backend = 'native'`
	if c == nil || c.rows == nil || c.loads >= jobCacheFullEvery {
		jobs, vers, err := s.readJobRows(ctx, emails, where, hint, string(state))
		if err != nil {
			return nil, err
		}
		out := make([]*allot.Job, len(jobs))
		for i := range jobs {
			out[i] = &jobs[i]
		}
		if c != nil {
			c.rows = make(map[int64]*cachedJob, len(jobs))
			for i := range jobs {
				c.rows[jobs[i].ID] = &cachedJob{ver: vers[i], job: jobs[i]}
			}
			c.loads, c.reads = 1, c.reads+len(jobs)
		}
		return sortForCycle(out), nil
	}
	c.loads++
	c.gen++
	what := "listing " + string(state) + " jobs"
	rows, err := s.db.Query(ctx, `SELECT j.id, j.xmin FROM jobs j WHERE `+where, string(state))
	if err != nil {
		return nil, mapErr(what, err)
	}
	type idVer struct {
		id  int64
		ver uint32
	}
	list, err := pgx.AppendRows(make([]idVer, 0, hint), rows, func(r pgx.CollectableRow) (idVer, error) {
		var v idVer
		return v, r.Scan(&v.id, &v.ver)
	})
	if err != nil {
		return nil, mapErr(what, err)
	}
	var stale []int64
	for _, v := range list {
		if k, ok := c.rows[v.id]; !ok || k.ver != v.ver {
			stale = append(stale, v.id)
		}
	}
	if len(stale) > 0 {
		// By key alone (an index scan of the primary key), the state
		// checked here: with the state in the query, PostgreSQL (its
		// statistics behind a growing queue) scanned the state's index
		// and searched the list for each row, 150 ms for 1,600 rows.
		read, vers, err := s.readJobRows(ctx, emails, `j.id = ANY($1)`, len(stale), stale)
		if err != nil {
			return nil, err
		}
		for i := range read {
			if read[i].State == state && read[i].Backend == allot.BackendNative {
				c.rows[read[i].ID] = &cachedJob{ver: vers[i], job: read[i], gen: c.gen}
			}
		}
		c.reads += len(read)
	}
	out := make([]*allot.Job, 0, len(list))
	for _, v := range list {
		k, ok := c.rows[v.id]
		// A row read again is as fresh as that read (its version may be
		// newer still); one that was not found there left the state.
		if !ok || k.ver != v.ver && k.gen != c.gen {
			continue
		}
		k.gen = c.gen
		k.job.User = emails[k.job.UserID]
		out = append(out, &k.job)
	}
	for id, k := range c.rows {
		if k.gen != c.gen {
			delete(c.rows, id)
		}
	}
	return sortForCycle(out), nil
}

// jobCache is what jobsForCycle keeps of one state's jobs between loads:
// each job as read, with the version of its row it was read from.
type jobCache struct {
	rows  map[int64]*cachedJob
	gen   uint64 // the current load's number
	loads int    // loads since the last full read
	reads int    // rows read whole, all loads together
}

// cachedJob is a job as jobsForCycle read it, from the row version ver
// (the row's xmin), listed by load gen last.
type cachedJob struct {
	ver uint32
	gen uint64
	job allot.Job
}

// jobCacheFullEvery is how many loads a jobCache serves before a full read
// replaces it: a row version is a 32-bit transaction id, which comes round
// again after four billion transactions; a full read now and then bounds
// what a version seen again by chance could hide.
const jobCacheFullEvery = 500

// readJobRows reads the native jobs jobsForCycle lists that match where
// (over jobs j, with args), in no order, with their row versions and
// their users' emails (by user id).
func (s *Store) readJobRows(ctx context.Context, emails map[int64]string, where string, hint int, args ...any) ([]allot.Job, []uint32, error) {
	what := "listing jobs for the scheduling cycle"
	rows, err := s.db.Query(ctx, `
		SELECT j.id, j.name, j.team, j.user_id, j.tier, j.gpus, coalesce(j.gpu_type, ''), coalesce(j.gpus_per_node, 0),
			j.time_limit_s, j.checkpointable, j.preemptible, j.demoted, j.submitted_at, j.priority, j.run_as, j.segment, j.state, j.backend, j.xmin
		FROM jobs j WHERE `+where, args...)
	if err != nil {
		return nil, nil, mapErr(what, err)
	}
	// Read into a slice as large as the last load's (a job is 552 bytes:
	// growing and sorting a slice of 50,000 by value moved and cleared
	// tens of megabytes).
	vers := make([]uint32, 0, hint)
	jobs, err := pgx.AppendRows(make([]allot.Job, 0, hint), rows, func(r pgx.CollectableRow) (allot.Job, error) {
		var j allot.Job
		var tier, runAs, state string
		var limit int64
		var ver uint32
		err := r.Scan(&j.ID, &j.Name, &j.Team, &j.UserID, &tier, &j.GPUs, &j.GPUType, &j.GPUsPerNode,
			&limit, &j.Checkpointable, &j.Preemptible, &j.Demoted, &j.SubmittedAt, &j.Priority, &runAs, &j.Segment, &state, &j.Backend, &ver)
		j.Tier, j.RunAs, j.TimeLimit, j.State = allot.TierID(tier), allot.TierID(runAs), time.Duration(limit)*time.Second, allot.JobState(state)
		vers = append(vers, ver)
		return j, err
	})
	if err != nil {
		return nil, nil, mapErr(what, err)
	}
	for i := range jobs {
		jobs[i].User = emails[jobs[i].UserID]
	}
	return jobs, vers, nil
}

// userEmails returns every user's email by id.
func (s *Store) userEmails(ctx context.Context) (map[int64]string, error) {
	rows, err := s.db.Query(ctx, `SELECT id, email FROM users`)
	return collectMap[int64, string](rows, err, "loading users' emails")
}

// sortForCycle lays jobs out in ListJobs' order (newest submission
// first), copying each job once.
func sortForCycle(jobs []*allot.Job) []allot.Job {
	slices.SortFunc(jobs, func(a, b *allot.Job) int {
		return cmp.Or(b.SubmittedAt.Compare(a.SubmittedAt), cmp.Compare(b.ID, a.ID))
	})
	out := make([]allot.Job, len(jobs))
	for i, j := range jobs {
		out[i] = *j
	}
	return out
}

// PendingEnvs returns the env of the jobs ids (a cycle's starts).
func (s *Store) PendingEnvs(ctx context.Context, ids []int64) (map[int64]map[string]string, error) {
	out := make(map[int64]map[string]string, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.db.Query(ctx, `SELECT id, env FROM jobs WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, mapErr("loading the env of starting jobs", err)
	}
	var id int64
	var env []byte
	_, err = pgx.ForEachRow(rows, []any{&id, &env}, func() error {
		var m map[string]string
		if err := json.Unmarshal(env, &m); err != nil {
			return fmt.Errorf("decoding env of job %d: %w", id, err)
		}
		out[id] = m
		return nil
	})
	return out, mapErr("loading the env of starting jobs", err)
}

// applyStarts writes a plan's starts with a handful of statements, whatever
// their number (a statement per start and part cost a cycle that started
// hundreds of jobs seconds of round trips, holding its transaction): the
// jobs still pending become running, every node of their parts must be up,
// their GPUs are allocated and their leases offered, and the nodes told.
func (s *Store) applyStarts(ctx context.Context, starts []StartOrder, now time.Time, res *ApplyResult) error {
	if len(starts) == 0 {
		return nil
	}
	ids, prio, bds, runAs, ckpt := make([]int64, len(starts)), make([]float64, len(starts)), make([]string, len(starts)),
		make([]string, len(starts)), make([]string, len(starts))
	for i, st := range starts {
		b, _ := json.Marshal(st.Breakdown)
		ids[i], prio[i], bds[i], runAs[i], ckpt[i] = st.JobID, st.Priority, string(b), string(st.RunAs), st.CheckpointDir
	}
	rows, err := s.db.Query(ctx, `
		UPDATE jobs j SET state = 'running', segment = j.segment + 1, started_at = coalesce(j.started_at, $2), pending_reason = '',
			priority = u.p, priority_breakdown = u.b::jsonb, run_as = u.r, checkpoint_dir = u.c, updated_at = $2
		FROM unnest($1::bigint[], $3::float8[], $4::text[], $5::text[], $6::text[]) AS u(id, p, b, r, c)
		WHERE j.id = u.id AND j.state = 'pending' RETURNING j.id, j.segment`, ids, now, prio, bds, runAs, ckpt)
	if err != nil {
		return mapErr("starting jobs", err)
	}
	segs := map[int64]int{}
	for rows.Next() {
		var id int64
		var seg int
		if err := rows.Scan(&id, &seg); err != nil {
			rows.Close()
			return mapErr("starting jobs", err)
		}
		segs[id] = seg
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return mapErr("starting jobs", err)
	}
	// A start whose job is no longer pending (cancelled since the
	// snapshot) is skipped; the others' parts, flattened.
	var (
		aJob               []int64
		aSeg, aGPU         []int
		aNode              []string
		lJob               []int64
		lSeg, lRank        []int
		lNode, lGPUs, lEnv []string
		nodes              []string
		seenNode           = map[string]bool{}
	)
	for _, st := range starts {
		seg, ok := segs[st.JobID]
		if !ok {
			res.Skipped++
			continue
		}
		res.Started++
		for _, p := range st.Parts {
			for _, g := range p.GPUs {
				aJob, aSeg, aNode, aGPU = append(aJob, st.JobID), append(aSeg, seg), append(aNode, p.Node), append(aGPU, g)
			}
			env, _ := json.Marshal(p.Env)
			gpus := make([]string, len(p.GPUs))
			for i, g := range p.GPUs {
				gpus[i] = strconv.Itoa(g)
			}
			lJob, lSeg, lNode, lRank = append(lJob, st.JobID), append(lSeg, seg), append(lNode, p.Node), append(lRank, p.Rank)
			lGPUs, lEnv = append(lGPUs, "{"+strings.Join(gpus, ",")+"}"), append(lEnv, string(env))
			if !seenNode[p.Node] {
				seenNode[p.Node] = true
				nodes = append(nodes, p.Node)
			}
		}
	}
	if len(nodes) == 0 {
		return nil
	}
	// Every node must be up, checked under a KEY SHARE lock on its row
	// held until the cycle commits: a drain (which locks the row FOR
	// UPDATE before it looks for leases) either ran first and this sees
	// it, or waits for this cycle and then sees its leases. Heartbeats
	// (plain updates of the row) do not wait for it.
	upRows, err := s.db.Query(ctx, `SELECT name FROM nodes WHERE name = ANY($1) AND state = 'up' ORDER BY name FOR KEY SHARE`, nodes)
	if err != nil {
		return mapErr("checking nodes", err)
	}
	up, err := pgx.CollectRows(upRows, pgx.RowTo[string])
	if err != nil {
		return mapErr("checking nodes", err)
	}
	if len(up) != len(nodes) {
		isUp := map[string]bool{}
		for _, n := range up {
			isUp[n] = true
		}
		for _, n := range nodes {
			if !isUp[n] {
				return allot.Errorf(allot.EConflict, "node %s is no longer up", n)
			}
		}
	}
	if _, err := s.db.Exec(ctx, `
		INSERT INTO allocations (job_id, segment, node, gpu_index, started_at)
		SELECT j, sg, n, g, $5 FROM unnest($1::bigint[], $2::int[], $3::text[], $4::int[]) AS u(j, sg, n, g)`,
		aJob, aSeg, aNode, aGPU, now); err != nil {
		return mapErr(fmt.Sprintf("allocating the GPUs of %d starts", res.Started), err)
	}
	if _, err := s.db.Exec(ctx, `
		INSERT INTO leases (job_id, segment, node, rank, gpu_indices, env, offered_at)
		SELECT j, sg, n, r, g::int[], e::jsonb, $7 FROM unnest($1::bigint[], $2::int[], $3::text[], $4::int[], $5::text[], $6::text[]) AS u(j, sg, n, r, g, e)`,
		lJob, lSeg, lNode, lRank, lGPUs, lEnv, now); err != nil {
		return mapErr("offering leases", err)
	}
	return notify(ctx, s.db, nodes...)
}

// RecordCycle stores one cycle's figures, with the id its stored queue and
// shares carry (see cycleIDSQL). The queue's instant becomes the cycle's.
func (s *Store) RecordCycle(ctx context.Context, started time.Time, d time.Duration, pending int, res ApplyResult, outcome string) error {
	id, err := s.cycleID(ctx)
	if err != nil {
		return err
	}
	_, err = s.db.Exec(ctx, `INSERT INTO scheduling_cycles (id, started_at, duration_us, pending, started, preempted, outcome) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		id, started, d.Microseconds(), pending, res.Started, res.Preempted, outcome)
	if err != nil {
		return mapErr("recording cycle", err)
	}
	_, err = s.db.Exec(ctx, `UPDATE queue_cycle SET decided_at = $2 WHERE cycle_id = $1 AND decided_at <> $2`, id, started)
	return mapErr("recording cycle", err)
}

// LastCycleAt returns when the newest recorded scheduling cycle started
// (zero when none ran yet).
func (s *Store) LastCycleAt(ctx context.Context) (time.Time, error) {
	var at *time.Time
	err := s.db.QueryRow(ctx, `SELECT (SELECT started_at FROM scheduling_cycles ORDER BY id DESC LIMIT 1)`).Scan(&at)
	if err != nil || at == nil {
		return time.Time{}, mapErr("reading the last cycle", err)
	}
	return *at, nil
}

// DecayUsageEvery applies the half-life to every team's fair-share usage
// and adds the GPU-seconds allocated since the last decay, when that decay
// (the oldest team's) is period or more ago, as Slurm recomputes its fair-share usage every
// PriorityCalcPeriod; otherwise it only gives new teams their row (no
// usage). It reports whether it decayed. period 0 decays now; it is
// idempotent in time: decaying twice at the same instant adds nothing.
func (s *Store) DecayUsageEvery(ctx context.Context, halfLife, period time.Duration) (bool, error) {
	now := s.Now()
	_, err := s.db.Exec(ctx, `
		INSERT INTO team_usage (team, gpu_seconds, updated_at)
		SELECT slug, 0, $1 FROM teams ON CONFLICT (team) DO NOTHING`, now)
	if err != nil {
		return false, mapErr("decaying usage", err)
	}
	if period > 0 {
		var due bool
		err := s.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM team_usage WHERE updated_at <= $1)`, now.Add(-period)).Scan(&due)
		if err != nil || !due {
			return false, mapErr("decaying usage", err)
		}
	}
	tag, err := s.db.Exec(ctx, `
		UPDATE team_usage u SET
			gpu_seconds = u.gpu_seconds * power(0.5, greatest(0, extract(epoch FROM $1 - u.updated_at)) / $2)
				+ coalesce((SELECT sum(extract(epoch FROM least(coalesce(a.released_at, $1), $1) - greatest(a.started_at, u.updated_at)))
					FROM allocations a JOIN jobs j ON j.id = a.job_id
					WHERE j.team = u.team AND a.started_at < $1 AND coalesce(a.released_at, 'infinity'::timestamptz) > u.updated_at), 0),
			updated_at = $1
		WHERE u.updated_at < $1`, now, halfLife.Seconds())
	return tag.RowsAffected() > 0, mapErr("decaying usage", err)
}
