package store

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The team page's usage, kept between page views.
//
// Most of what the team page sums never changes once written: an
// allocation released before now contributes the same GPU-seconds to this
// month and last at every later instant of the month. What does change
// between two views is the allocations still open (or released after the
// instant the sums were taken) and how the jobs are classified (a pending
// job's run-as class, a demotion; the user's e-mail, a node's GPU type),
// none of which moves the allocations epoch.
//
// So a server keeps, per team and month, the sums of the allocations that
// were released by an instant T — per job and node (last month, this
// month) and per job and day — with the allocations epoch they were read
// at; a view then reads, in one statement, the epoch, the allocations open
// or released after T (live, like before), and how each job and node is
// classified now, and adds them up in Go. Money is not cached (the charge
// lines are read every time) and every figure is an integer sum of the
// same per-allocation terms the single query added, so the numbers are
// the same, to the second.
//
// The epoch moves on at the commit of every change to allocations
// (migration 0022's deferred trigger), but just before that commit
// becomes visible: a read between the two would see the new epoch without
// the change. The sums are therefore taken only when, just before their
// snapshot, no other session held a write lock on allocations (a writer
// holds it until its commit is visible) and the epoch read then is the
// one the sums' own statement reads: any change the sums miss was either
// in progress then (seen, not kept) or moves the epoch on later (kept
// sums dropped).

// teamPageKey is one pool's cache entry for a team's month.
type teamPageKey struct {
	db    DBTX
	team  string
	month time.Time
}

// teamPageSums are the sums of a team's allocations released by asOf, at
// epoch: last month's GPU-seconds and each day's of this month (they need
// no job's class), and this month's per job and node (a job is listed
// when one of its allocations overlaps the month, even for 0 s).
type teamPageSums struct {
	epoch int64
	asOf  time.Time
	last  int64
	days  map[int]int64 // by day index of the month
	month map[jobNode]int64
}

type jobNode struct {
	job  int64
	node string
}

func newTeamPageSums() *teamPageSums {
	return &teamPageSums{days: map[int]int64{}, month: map[jobNode]int64{}}
}

// add takes one row of teamPageSumsSQL.
func (t *teamPageSums) add(section string, job int64, node string, day *time.Time, v int64, month time.Time) {
	switch section {
	case "last":
		t.last += v
	case "month":
		t.month[jobNode{job, node}] += v
	case "day":
		t.days[int(day.Sub(month)/(24*time.Hour))] += v
	}
}

// teamPageKeptViews counts the views served from kept sums (for tests).
var teamPageKeptViews atomic.Int64

var teamPageCache = struct {
	sync.Mutex
	m map[teamPageKey]*teamPageSums
}{m: map[teamPageKey]*teamPageSums{}}

// teamPageSumsSQL sums, per job and node and per job and day, the team's
// allocations that overlap [$2, $4) — last month and this month up to upTo
// — and match the extra filter (%s: which allocations), with the single
// query's terms: per gang row, n × floor(seconds) of its clipped span.
// Sections: 'last' (job, node, seconds of last month), 'month' (job, node,
// seconds of this month), 'day' (job, day, seconds). $1 team, $2 last
// month's start, $3 this month's start, $4 upTo.
const teamPageSumsSQL = `
	WITH g AS MATERIALIZED (
		SELECT a.job_id, a.node, a.started_at AS st, a.released_at AS rel, count(*) AS n
		FROM allocations a
		WHERE a.started_at < $4 AND coalesce(a.released_at, 'infinity'::timestamptz) > $2 AND %s
		GROUP BY 1, 2, 3, 4),
	a AS MATERIALIZED (
		-- The team's: each job looked up by its key (the OFFSET 0 keeps the
		-- planner from hashing every job the team ever ran).
		SELECT g.* FROM g JOIN LATERAL (SELECT 1 FROM jobs j WHERE j.id = g.job_id AND j.team = $1 OFFSET 0) j ON true),
	m AS MATERIALIZED (
		SELECT job_id, node, greatest(st, $3) AS s, least(coalesce(rel, $4), $4) AS e, n
		FROM a WHERE coalesce(rel, 'infinity'::timestamptz) > $3)
	SELECT 'last' AS section, job_id, node, NULL::timestamptz AS day,
		coalesce(sum(n * floor(extract(epoch FROM least(coalesce(rel, $3), $3) - greatest(st, $2)))), 0)::bigint AS v
		FROM a WHERE st < $3 GROUP BY job_id, node
	UNION ALL
	SELECT 'month', job_id, node, NULL, coalesce(sum(n * floor(extract(epoch FROM e - s))), 0)::bigint FROM m GROUP BY job_id, node
	UNION ALL
	SELECT 'day', m.job_id, '', dd, sum(m.n * floor(extract(epoch FROM least(m.e, dd + interval '24 hours') - greatest(m.s, dd))))::bigint
		FROM m, generate_series(date_bin('24 hours', m.s, $3), m.e - interval '1 microsecond', interval '24 hours') dd
		GROUP BY m.job_id, dd`

// scanTeamPageSums reads teamPageSumsSQL's rows into sums.
func scanTeamPageSums(rows pgx.Rows, month time.Time, sums *teamPageSums) error {
	var section, node string
	var job, v int64
	var day *time.Time
	_, err := pgx.ForEachRow(rows, []any{&section, &job, &node, &day, &v}, func() error {
		sums.add(section, job, node, day, v, month)
		return nil
	})
	return err
}

// TeamPageUsage loads team's usage of the month containing upTo and of
// the month before: the team page and GET /api/v1/teams/:team/budget. It
// gives what teamPageUsageQuery (one query over every allocation of the
// two months) gives, from the kept sums of released allocations (see the
// top of this file) and, in one statement, what changed since; when sums
// cannot be kept (another session is writing allocations) it runs that
// query.
func (s *Store) TeamPageUsage(ctx context.Context, team string, upTo time.Time) (TeamPageUsage, error) {
	if _, ok := s.db.(*pgxpool.Pool); !ok {
		// In a transaction: its own snapshot, nothing to keep.
		return s.teamPageUsageQuery(ctx, team, upTo)
	}
	key := teamPageKey{s.db, team, MonthStart(upTo)}
	teamPageCache.Lock()
	kept := teamPageCache.m[key]
	teamPageCache.Unlock()
	if kept != nil && !upTo.Before(kept.asOf) {
		u, epoch, err := s.teamPageView(ctx, team, upTo, kept)
		if err != nil || epoch == kept.epoch {
			if err == nil {
				teamPageKeptViews.Add(1)
			}
			return u, err
		}
	}
	// Nothing kept, or an allocation changed since: sum again.
	kept, err := s.teamPageSums(ctx, team, upTo)
	if err != nil || kept == nil {
		if err == nil {
			return s.teamPageUsageQuery(ctx, team, upTo)
		}
		return TeamPageUsage{}, err
	}
	u, epoch, err := s.teamPageView(ctx, team, upTo, kept)
	if err != nil || epoch == kept.epoch {
		return u, err
	}
	return s.teamPageUsageQuery(ctx, team, upTo)
}

// teamPageSums sums team's allocations released by upTo and keeps them,
// or returns nil when another session was writing allocations (see the
// top of this file).
func (s *Store) teamPageSums(ctx context.Context, team string, upTo time.Time) (*teamPageSums, error) {
	month := MonthStart(upTo)
	sums := newTeamPageSums()
	sums.asOf = upTo
	// In this order, each its own statement: the epoch; then whether
	// another session holds a write lock on allocations (a transaction
	// that changed them holds it until its commit is visible); then the
	// sums, in a later snapshot. A change the sums do not see either moved
	// the epoch on after the first read (the kept sums are dropped at the
	// next view) or was in progress at the second (nothing is kept).
	if err := s.db.QueryRow(ctx, `SELECT last_value + is_called::int FROM allocations_epoch`).Scan(&sums.epoch); err != nil {
		return nil, mapErr("loading the team's usage", err)
	}
	var writing bool
	if err := s.db.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_locks l
			WHERE l.locktype = 'relation' AND l.relation = 'allocations'::regclass
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND l.mode IN ('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
				AND l.pid <> pg_backend_pid())`).Scan(&writing); err != nil {
		return nil, mapErr("loading the team's usage", err)
	}
	if writing {
		return nil, nil
	}
	err := s.InTx(ctx, func(tx *Store) error {
		// The planner takes the per-allocation day series for 1,000 rows
		// each and would spend most of a second compiling the query (JIT)
		// to save milliseconds.
		if _, err := tx.db.Exec(ctx, `SET LOCAL jit = off`); err != nil {
			return err
		}
		rows, err := tx.db.Query(ctx, fmt.Sprintf(teamPageSumsSQL, `a.released_at <= $4`), team, month.AddDate(0, -1, 0), month, upTo)
		if err != nil {
			return err
		}
		return scanTeamPageSums(rows, month, sums)
	})
	if err != nil {
		return nil, mapErr("loading the team's usage", err)
	}
	teamPageCache.Lock()
	if len(teamPageCache.m) >= 1000 {
		clear(teamPageCache.m)
	}
	teamPageCache.m[teamPageKey{s.db, team, month}] = sums
	teamPageCache.Unlock()
	return sums, nil
}

// teamPageView reads, in one statement, the allocations epoch, the sums
// of the team's allocations not in kept (open, or released after
// kept.asOf), how every job and node of either is classified now, the
// team's budget and the month's billed cost, and adds them up as the
// single query did. It returns the epoch it read: when it is not kept's,
// the result mixes sums from before a change and must not be used.
func (s *Store) teamPageView(ctx context.Context, team string, upTo time.Time, kept *teamPageSums) (TeamPageUsage, int64, error) {
	month := MonthStart(upTo)
	prev := month.AddDate(0, -1, 0)
	u := TeamPageUsage{TeamUsage: TeamUsage{Team: team, Month: month, UpTo: upTo,
		ByJobType: map[string]int64{"production": 0, "experiments": 0, "preemptible": 0}, ByUser: []UserUsage{}, Daily: []DayUsage{}},
		Kinds: []KindUsage{}}
	live := newTeamPageSums()
	keptJobs := make([]int64, 0, len(kept.month))
	seenJob := map[int64]bool{}
	keptNodes := []string{}
	seenNode := map[string]bool{}
	for k := range kept.month {
		if !seenJob[k.job] {
			seenJob[k.job] = true
			keptJobs = append(keptJobs, k.job)
		}
		if !seenNode[k.node] {
			seenNode[k.node] = true
			keptNodes = append(keptNodes, k.node)
		}
	}
	type jobClass struct {
		user        int64
		jtype, kind string
	}
	classes := map[int64]jobClass{}
	gpuTypes := map[string]string{}
	emails := map[int64]string{}
	typeRank, emailRank := map[string]int64{}, map[string]int64{}
	var epoch int64
	found := false
	err := s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SET LOCAL jit = off`); err != nil {
			return err
		}
		// The live allocations: open, or released after the kept sums'
		// instant.
		filter := `coalesce(a.released_at, 'infinity'::timestamptz) > $5`
		rows, err := tx.db.Query(ctx, `
		WITH l AS MATERIALIZED (`+fmt.Sprintf(teamPageSumsSQL, filter)+`),
		jobs_of AS (SELECT job_id FROM l WHERE section <> 'last' UNION SELECT unnest($6::bigint[])),
		nodes_of AS (SELECT node FROM l WHERE section = 'month' UNION SELECT unnest($7::text[])),
		jc AS MATERIALIZED (
			SELECT j.id, j.user_id,
				CASE WHEN j.run_as IN ('1', '2') OR (j.run_as = '' AND j.tier IN ('1', '2') AND NOT j.preemptible) THEN 'production'
				     WHEN j.run_as = 'preemptible' OR (j.run_as = '' AND j.preemptible) OR j.tier = 'preemptible' THEN 'preemptible'
				     ELSE 'experiments' END AS jtype,
				CASE WHEN j.run_as <> '' THEN j.run_as WHEN j.preemptible THEN 'preemptible' ELSE j.tier END AS kind
			FROM jobs_of o JOIN LATERAL (SELECT id, user_id, run_as, tier, preemptible FROM jobs j WHERE j.team = $1 AND j.id = o.job_id OFFSET 0) j ON true)
		SELECT section, job_id, node, day, v, '' AS k, '' AS k2 FROM l
		UNION ALL
		SELECT 'epoch', last_value + is_called::int, '', NULL, 0, '', '' FROM allocations_epoch
		UNION ALL
		SELECT 'budget', 0, '', NULL, monthly_budget_gpu_hours::bigint, '', '' FROM teams WHERE slug = $1
		UNION ALL
		SELECT 'cost', 0, '', NULL, coalesce(sum(amount_micros), 0)::bigint, coalesce(min(currency), ''), '' FROM charge_lines WHERE month = $3 AND team = $1
		UNION ALL
		SELECT 'job', id, '', NULL, user_id, jtype, kind FROM jc
		UNION ALL
		-- GPU types and e-mails with their rank in the database's order
		-- (the single query sorted by them).
		SELECT 'node', dense_rank() OVER (ORDER BY nd.gpu_type), nd.name, NULL, 0, nd.gpu_type, '' FROM nodes_of o JOIN nodes nd ON nd.name = o.node
		UNION ALL
		SELECT 'user', us.id, '', NULL, row_number() OVER (ORDER BY us.email), us.email, '' FROM users us
			WHERE us.id IN (SELECT user_id FROM jc)`,
			team, prev, month, upTo, kept.asOf, keptJobs, keptNodes)
		if err != nil {
			return err
		}
		var section, node, k, k2 string
		var job, v int64
		var day *time.Time
		_, err = pgx.ForEachRow(rows, []any{&section, &job, &node, &day, &v, &k, &k2}, func() error {
			switch section {
			case "last", "month", "day":
				live.add(section, job, node, day, v, month)
			case "epoch":
				epoch = job
			case "budget":
				found, u.BudgetGPUHours = true, v
			case "cost":
				u.Currency, u.CostMicros = k, v
			case "job":
				classes[job] = jobClass{user: v, jtype: k, kind: k2}
			case "node":
				gpuTypes[node], typeRank[k] = k, job
			case "user":
				emails[job], emailRank[k] = k, v
			}
			return nil
		})
		return err
	})
	if err != nil {
		return u, 0, mapErr("loading the team's usage", err)
	}
	if !found {
		return u, epoch, mapErr(fmt.Sprintf("loading team %q", team), pgx.ErrNoRows)
	}
	// Add up, as the single query's sections did: a job (user, type, kind)
	// is listed when one of its allocations overlaps the month, even for
	// 0 s (at the month's first instant).
	type kindKey struct{ tier, gpuType string }
	users := map[int64]int64{}
	kinds := map[kindKey]int64{}
	days := map[int]int64{}
	for _, sums := range []*teamPageSums{kept, live} {
		u.LastMonthGPUSeconds += sums.last
		for k, secs := range sums.month {
			c := classes[k.job]
			u.ByJobType[c.jtype] += secs
			u.UsedGPUSeconds += secs
			users[c.user] += secs
			kinds[kindKey{c.kind, gpuTypes[k.node]}] += secs
		}
		for i, v := range sums.days {
			days[i] += v
		}
	}
	for id, secs := range users {
		if email, ok := emails[id]; ok {
			u.ByUser = append(u.ByUser, UserUsage{User: email, GPUSeconds: secs})
		}
	}
	sort.Slice(u.ByUser, func(a, b int) bool {
		x, y := u.ByUser[a], u.ByUser[b]
		return x.GPUSeconds > y.GPUSeconds || x.GPUSeconds == y.GPUSeconds && emailRank[x.User] < emailRank[y.User]
	})
	for k, secs := range kinds {
		u.Kinds = append(u.Kinds, KindUsage{Tier: allot.TierID(k.tier), GPUType: k.gpuType, GPUSeconds: secs})
	}
	sort.Slice(u.Kinds, func(a, b int) bool {
		x, y := u.Kinds[a], u.Kinds[b]
		// Tiers are "1"–"4" and "preemptible": the same order in any collation.
		return x.Tier < y.Tier || x.Tier == y.Tier && typeRank[x.GPUType] < typeRank[y.GPUType]
	})
	// Days are 24-hour steps from the month's first instant up to upTo
	// (as the database has it: to the microsecond).
	end := upTo.Truncate(time.Microsecond)
	for i, d := 0, month; d.Before(end); i, d = i+1, d.Add(24*time.Hour) {
		u.Daily = append(u.Daily, DayUsage{Day: d, GPUSeconds: days[i]})
	}
	return u, epoch, nil
}
