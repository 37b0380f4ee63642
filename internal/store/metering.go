package store

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"sort"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/jackc/pgx/v5"
)

// meteringLock serializes metering rollups and retention.
const meteringLock = 7_401_223_030

// hourRange widens [from, to) to whole UTC hours.
func hourRange(from, to time.Time) (time.Time, time.Time) {
	h0 := from.UTC().Truncate(time.Hour)
	h1 := to.UTC().Truncate(time.Hour)
	if h1.Before(to) {
		h1 = h1.Add(time.Hour)
	}
	return h0, h1
}

// RollupJobUsage recomputes job_usage_hours (and the per-GPU
// job_gpu_usage_hours) for every UTC hour that overlaps [from, to), from the
// allocations and the agents' gpu_samples, and replaces the hours' rows in
// one transaction under a lock: running it twice, or again after a crash in
// the middle, gives the same rows. It returns the job-hour rows written.
//
// Per job run segment and hour:
//   - gpu_seconds: the GPU-seconds held, on the UTC second grid like billing
//     (floor(end) − floor(start) per allocation, cut at the hour); a running
//     allocation counts up to s.Now(), a lost node's up to its last
//     heartbeat (its release time);
//   - samples: the samples of the job's GPUs taken while the segment held
//     them, [started_at, released_at);
//   - mean_util_pct, mean_mem_used_mib: their means (every GPU's samples
//     weigh the same; agents sample at a fixed interval); peak_mem_used_mib
//     the largest reading; mem_total_mib the GPUs' memory. NULL without
//     samples.
//
// Hours that had ended when they were rolled up are recorded in
// metering_hours: only their raw samples may be deleted (DeleteRawSamples).
// Hours whose samples were deleted are left as they are.
func (s *Store) RollupJobUsage(ctx context.Context, from, to time.Time) (int, error) {
	h0, h1 := hourRange(from, to)
	if !h0.Before(h1) {
		return 0, nil
	}
	now := s.Now().UTC()
	n := 0
	err := s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, meteringLock); err != nil {
			return mapErr("taking the metering lock", err)
		}
		for _, t := range []string{"job_usage_hours", "job_gpu_usage_hours"} {
			if _, err := tx.db.Exec(ctx, `DELETE FROM `+t+` WHERE hour >= $1 AND hour < $2
				AND hour NOT IN (SELECT hour FROM metering_hours WHERE purged_at IS NOT NULL AND hour >= $1 AND hour < $2)`, h0, h1); err != nil {
				return mapErr("replacing usage rollups", err)
			}
		}
		tag, err := tx.db.Exec(ctx, `
			WITH hours AS (
				SELECT h AS hour FROM generate_series($1::timestamptz, $2::timestamptz - interval '1 hour', interval '1 hour') h
				WHERE NOT EXISTS (SELECT 1 FROM metering_hours m WHERE m.hour = h AND m.purged_at IS NOT NULL)
			), alloc AS (
				SELECT a.job_id, a.segment, a.node, a.gpu_index, n.gpu_type, h.hour,
					greatest(a.started_at, h.hour) AS s,
					least(coalesce(a.released_at, $3), h.hour + interval '1 hour') AS e,
					least(coalesce(a.released_at, 'infinity'), h.hour + interval '1 hour') AS se
				FROM allocations a
				JOIN nodes n ON n.name = a.node
				JOIN hours h ON a.started_at < h.hour + interval '1 hour' AND coalesce(a.released_at, $3) > h.hour
				WHERE a.started_at < $2 AND coalesce(a.released_at, $3) > $1
			), gpu AS (
				SELECT x.job_id, x.segment, x.hour, x.node, x.gpu_index, min(x.gpu_type) AS gpu_type,
					sum(floor(extract(epoch FROM x.e)) - floor(extract(epoch FROM x.s)))::bigint AS secs,
					coalesce(sum(g.n), 0)::bigint AS n, sum(g.util) AS util, sum(g.mem) AS mem, max(g.peak) AS peak, max(g.total) AS total
				FROM alloc x
				LEFT JOIN LATERAL (
					SELECT count(*) AS n, sum(util_pct::float8) AS util, sum(mem_used_mib::float8) AS mem,
						max(mem_used_mib) AS peak, max(mem_total_mib) AS total
					FROM gpu_samples g
					WHERE g.node = x.node AND g.gpu_index = x.gpu_index AND g.job_id = x.job_id AND g.at >= x.s AND g.at < x.se
				) g ON true
				WHERE x.e > x.s
				GROUP BY x.job_id, x.segment, x.hour, x.node, x.gpu_index
			), ins AS (
				INSERT INTO job_gpu_usage_hours (job_id, segment, hour, node, gpu_index, gpu_seconds, samples, mean_util_pct)
				SELECT job_id, segment, hour, node, gpu_index, secs, n, CASE WHEN n > 0 THEN util / n END FROM gpu
			)
			INSERT INTO job_usage_hours (job_id, segment, hour, gpu_type, gpus, gpu_seconds, samples, mean_util_pct, mean_mem_used_mib,
				peak_mem_used_mib, mem_total_mib)
			SELECT job_id, segment, hour, min(gpu_type), count(*), sum(secs), sum(n),
				CASE WHEN sum(n) > 0 THEN sum(util) / sum(n) END, CASE WHEN sum(n) > 0 THEN sum(mem) / sum(n) END,
				CASE WHEN sum(n) > 0 THEN max(peak) END, CASE WHEN sum(n) > 0 THEN max(total) END
			FROM gpu
			GROUP BY job_id, segment, hour`, h0, h1, now)
		if err != nil {
			return mapErr("rolling up usage", err)
		}
		n = int(tag.RowsAffected())
		_, err = tx.db.Exec(ctx, `
			INSERT INTO metering_hours (hour, rolled_up_at)
			SELECT h, $3 FROM generate_series($1::timestamptz, $2::timestamptz - interval '1 hour', interval '1 hour') h
			WHERE h + interval '1 hour' <= $3
			ON CONFLICT (hour) DO UPDATE SET rolled_up_at = EXCLUDED.rolled_up_at WHERE metering_hours.purged_at IS NULL`, h0, h1, now)
		return mapErr("recording rolled-up hours", err)
	})
	return n, err
}

// DeleteRawSamples deletes the raw gpu_samples of the whole UTC hours that
// ended by olderThan and have been rolled up after they ended
// (metering_hours); the samples of an hour not yet rolled up are kept
// whatever their age. Rollups are never deleted, and a purged hour's rollups
// are final: RollupJobUsage no longer recomputes them (their samples are
// gone). It returns the samples deleted.
func (s *Store) DeleteRawSamples(ctx context.Context, olderThan time.Time) (int64, error) {
	var n int64
	err := s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, meteringLock); err != nil {
			return mapErr("taking the metering lock", err)
		}
		tag, err := tx.db.Exec(ctx, `
			DELETE FROM gpu_samples g USING metering_hours m
			WHERE m.hour + interval '1 hour' <= $1 AND m.purged_at IS NULL AND g.at >= m.hour AND g.at < m.hour + interval '1 hour'`, olderThan)
		if err != nil {
			return mapErr("deleting raw samples", err)
		}
		n = tag.RowsAffected()
		_, err = tx.db.Exec(ctx, `UPDATE metering_hours SET purged_at = $2 WHERE hour + interval '1 hour' <= $1 AND purged_at IS NULL`,
			olderThan, tx.Now())
		return mapErr("deleting raw samples", err)
	})
	return n, err
}

// JobUsageHour is one row of job_usage_hours.
type JobUsageHour struct {
	JobID          int64
	Segment        int
	Hour           time.Time
	GPUType        string
	GPUs           int
	GPUSeconds     int64
	Samples        int64
	MeanUtilPct    *float64
	MeanMemUsedMiB *float64
	PeakMemUsedMiB *int64
	MemTotalMiB    *int64
}

// JobUsageHours returns the rollup rows of job in [from, to), by segment and hour.
func (s *Store) JobUsageHours(ctx context.Context, jobID int64, from, to time.Time) ([]JobUsageHour, error) {
	rows, err := s.db.Query(ctx, `
		SELECT job_id, segment, hour, gpu_type, gpus, gpu_seconds, samples, mean_util_pct, mean_mem_used_mib, peak_mem_used_mib, mem_total_mib
		FROM job_usage_hours WHERE job_id = $1 AND hour >= $2 AND hour < $3 ORDER BY segment, hour`, jobID, from, to)
	if err != nil {
		return nil, mapErr("loading usage rollups", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (JobUsageHour, error) {
		var x JobUsageHour
		err := r.Scan(&x.JobID, &x.Segment, &x.Hour, &x.GPUType, &x.GPUs, &x.GPUSeconds, &x.Samples, &x.MeanUtilPct, &x.MeanMemUsedMiB,
			&x.PeakMemUsedMiB, &x.MemTotalMiB)
		x.Hour = x.Hour.UTC()
		return x, err
	})
	return out, mapErr("loading usage rollups", err)
}

// Right-sizing thresholds.
const (
	// LowUtilPct: a job whose mean compute utilization is below it over
	// more than LowUtilMinRuntime of sampled runtime is flagged.
	LowUtilPct        = 40
	LowUtilMinRuntime = time.Hour
	// IdleGPUPct: a GPU of a job whose mean utilization is below it, while
	// another GPU of the same run segment is at or above it, is idle.
	IdleGPUPct = 5
)

// Right-sizing rules.
const (
	RuleLowUtilization = "low_utilization"
	RuleIdleGPUs       = "idle_gpus"
	RuleCheaperGPUType = "cheaper_gpu_type"
)

// RightSizingScope restricts a report: Teams nil = every team; UserID 0 =
// every user.
type RightSizingScope struct {
	Teams  []string
	UserID int64
}

// UsageSummary is a team's or a user's usage in a report.
type UsageSummary struct {
	Team       string
	User       string // "" for a team
	GPUSeconds int64
	// MeanUtilPct and MeanMemPct are weighted by GPU-seconds over the hours
	// with samples; nil when there were none.
	MeanUtilPct *float64
	MeanMemPct  *float64
	Cost        allot.Money
	Jobs        int
	Flagged     int
	Savings     allot.Money
	// weights for the means
	utilW, utilSum, memW, memSum float64
}

// Flag is one reason a job is flagged, with the suggestion and the money it
// would have saved in the period.
type Flag struct {
	Rule       string
	Suggestion string
	Savings    allot.Money
}

// FlaggedJob is a job the report flags as underutilized.
type FlaggedJob struct {
	JobID       int64
	Name        string
	Team        string
	User        string
	Tier        allot.TierID // as run
	GPUType     string
	GPUs        int // GPUs requested
	GPUSeconds  int64
	MeanUtilPct *float64
	PeakMemMiB  *int64
	Cost        allot.Money
	Flags       []Flag
	// Savings is the largest of the flags' savings: the rules overlap (an
	// idle GPU also lowers the mean), so they are not added up.
	Savings allot.Money
}

// RightSizingReport is usage, utilization, cost and waste in [From, To).
type RightSizingReport struct {
	From, To time.Time
	Currency string
	Total    UsageSummary
	Teams    []UsageSummary
	Users    []UsageSummary // by team, then user: each team's users add up to the team
	Jobs     []FlaggedJob   // flagged jobs, largest savings first
}

type reportJob struct {
	FlaggedJob
	hours []JobUsageHour
	gpus  []gpuHour
}

type gpuHour struct {
	segment    int
	hour       time.Time
	gpu        string // node/index
	gpuSeconds int64
	samples    int64
	util       *float64
}

// RightSizing builds the right-sizing report of [from, to) from the usage
// rollups. An hour belongs to the period when it starts in [from, to).
//
// Cost is GPU-hours × rate × multiplier (the tier as run, like billing),
// priced with the rate card in force in each hour and rounded once per job
// run segment and hour (internal/billing.LineAmount): the charge lines'
// amounts before preemption credits, exact to the cent.
//
// Flags, and the money each would have saved:
//   - low_utilization: mean compute utilization (GPU-seconds weighted) below
//     40 % over more than one hour of sampled runtime. Savings = cost ×
//     (40 % − util) ÷ 40 %: the GPU-time beyond what the same work would have
//     needed at the 40 % bar, which stays a conservative figure (a job at
//     10 % saves 75 %, not the 90 % a 100 % target would claim); util is
//     rounded to 0.01 % first and the product rounded half up to the cent.
//   - idle_gpus: in a run segment, GPUs with mean utilization below 5 %
//     while another GPU of the segment is at or above 5 %. Savings = the
//     idle GPUs' GPU-seconds priced like the job's, per hour.
//   - cheaper_gpu_type: the peak memory used fits a GPU type with a lower
//     rate (peak ≤ memory_gb × 1024 MiB; a type of the same or more memory
//     only when its rate is lower) that the job's tier may run on: the
//     cluster's nodes of that type at the sites the tier may use hold the
//     job's GPUs (production tiers 1–2 never run on burst nodes, so a type
//     only burst nodes have is not for them). The cheapest such type is
//     suggested. Savings = per hour, the job's cost minus the same
//     GPU-seconds at that type's rate then (hours when it had none count 0).
//
// A job's savings is the largest of its flags' (they overlap); team, user
// and total savings add those up.
func (s *Store) RightSizing(ctx context.Context, from, to time.Time, scope RightSizingScope) (*RightSizingReport, error) {
	from, to = from.UTC(), to.UTC()
	card, err := s.RateCard(ctx)
	if err != nil {
		return nil, err
	}
	types, err := s.ListGPUTypes(ctx)
	if err != nil {
		return nil, err
	}
	sites, err := s.GPUTypeSiteCapacity(ctx)
	if err != nil {
		return nil, err
	}
	rep := &RightSizingReport{From: from, To: to, Currency: card.Currency(), Teams: []UsageSummary{}, Users: []UsageSummary{}, Jobs: []FlaggedJob{}}
	jobs := map[int64]*reportJob{}
	var order []int64
	// The period's hours come from job_usage_hours_hour_idx. For up to a
	// month (the team page, the monthly report) each looks its job up by
	// primary key: a team with most of a year's jobs made the planner hash
	// every job (a 50,000-row scan for the few hundred of the month); the
	// OFFSET 0 keeps it from flattening the lookup. Longer periods join.
	jobsOf := `JOIN jobs j ON j.id = h.job_id`
	if to.Sub(from) <= 32*24*time.Hour {
		jobsOf = `JOIN LATERAL (SELECT * FROM jobs j WHERE j.id = h.job_id OFFSET 0) j ON true`
	}
	rows, err := s.db.Query(ctx, `
		SELECT h.job_id, j.name, j.team, u.email,
			CASE WHEN j.run_as <> '' THEN j.run_as WHEN j.preemptible THEN 'preemptible' ELSE j.tier END, j.gpus,
			h.segment, h.hour, h.gpu_type, h.gpus, h.gpu_seconds,
			-- A Slurm run has no agent samples: its mean utilization and
			-- memory come from Slurm's accounting (gres/gpuutil,
			-- gres/gpumem), one value for the whole run.
			CASE WHEN h.samples = 0 AND sr.gpu_util_pct IS NOT NULL THEN 1 ELSE h.samples END,
			coalesce(h.mean_util_pct, sr.gpu_util_pct), coalesce(h.mean_mem_used_mib, sr.gpu_mem_mib::float8),
			coalesce(h.peak_mem_used_mib, sr.gpu_mem_mib), coalesce(h.mem_total_mib, CASE WHEN sr.gpu_util_pct IS NOT NULL THEN gt.memory_gb * 1024::bigint END)
		FROM job_usage_hours h
		`+jobsOf+`
		JOIN users u ON u.id = j.user_id
		LEFT JOIN slurm_runs sr ON sr.job_id = h.job_id AND sr.segment = h.segment
		LEFT JOIN gpu_types gt ON gt.name = h.gpu_type
		WHERE h.hour >= $1 AND h.hour < $2 AND ($3::text[] IS NULL OR j.team = ANY($3)) AND ($4 = 0 OR j.user_id = $4)
		ORDER BY h.job_id, h.segment, h.hour`, from, to, scope.Teams, scope.UserID)
	if err != nil {
		return nil, mapErr("loading usage rollups", err)
	}
	for rows.Next() {
		var id int64
		var name, team, user, tier string
		var gpus int
		var h JobUsageHour
		if err := rows.Scan(&id, &name, &team, &user, &tier, &gpus, &h.Segment, &h.Hour, &h.GPUType, &h.GPUs, &h.GPUSeconds, &h.Samples,
			&h.MeanUtilPct, &h.MeanMemUsedMiB, &h.PeakMemUsedMiB, &h.MemTotalMiB); err != nil {
			rows.Close()
			return nil, mapErr("loading usage rollups", err)
		}
		h.JobID, h.Hour = id, h.Hour.UTC()
		j := jobs[id]
		if j == nil {
			j = &reportJob{FlaggedJob: FlaggedJob{JobID: id, Name: name, Team: team, User: user, Tier: allot.TierID(tier), GPUs: gpus}}
			jobs[id] = j
			order = append(order, id)
		}
		j.hours = append(j.hours, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, mapErr("loading usage rollups", err)
	}
	rows, err = s.db.Query(ctx, `
		SELECT g.job_id, g.segment, g.hour, g.node || '/' || g.gpu_index, g.gpu_seconds, g.samples, g.mean_util_pct
		FROM job_gpu_usage_hours g `+strings.ReplaceAll(jobsOf, "h.job_id", "g.job_id")+`
		WHERE g.hour >= $1 AND g.hour < $2 AND ($3::text[] IS NULL OR j.team = ANY($3)) AND ($4 = 0 OR j.user_id = $4)
		ORDER BY g.job_id, g.segment, g.hour, g.node, g.gpu_index`, from, to, scope.Teams, scope.UserID)
	if err != nil {
		return nil, mapErr("loading usage rollups", err)
	}
	for rows.Next() {
		var id int64
		var g gpuHour
		if err := rows.Scan(&id, &g.segment, &g.hour, &g.gpu, &g.gpuSeconds, &g.samples, &g.util); err != nil {
			rows.Close()
			return nil, mapErr("loading usage rollups", err)
		}
		g.hour = g.hour.UTC()
		if j := jobs[id]; j != nil {
			j.gpus = append(j.gpus, g)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, mapErr("loading usage rollups", err)
	}

	teams := map[string]*UsageSummary{}
	users := map[[2]string]*UsageSummary{}
	zero := allot.Money{Currency: rep.Currency}
	rep.Total = UsageSummary{Cost: zero, Savings: zero}
	for _, id := range order {
		j := jobs[id]
		if err := evaluate(card, types, sites, j, zero); err != nil {
			return nil, err
		}
		t := teams[j.Team]
		if t == nil {
			t = &UsageSummary{Team: j.Team, Cost: zero, Savings: zero}
			teams[j.Team] = t
		}
		u := users[[2]string{j.Team, j.User}]
		if u == nil {
			u = &UsageSummary{Team: j.Team, User: j.User, Cost: zero, Savings: zero}
			users[[2]string{j.Team, j.User}] = u
		}
		for _, sum := range []*UsageSummary{&rep.Total, t, u} {
			if err := sum.add(j); err != nil {
				return nil, err
			}
		}
		if len(j.Flags) > 0 {
			rep.Jobs = append(rep.Jobs, j.FlaggedJob)
		}
	}
	rep.Total.finish()
	for _, t := range teams {
		t.finish()
		rep.Teams = append(rep.Teams, *t)
	}
	for _, u := range users {
		u.finish()
		rep.Users = append(rep.Users, *u)
	}
	sort.Slice(rep.Teams, func(a, b int) bool { return rep.Teams[a].Team < rep.Teams[b].Team })
	sort.Slice(rep.Users, func(a, b int) bool {
		x, y := rep.Users[a], rep.Users[b]
		return x.Team < y.Team || x.Team == y.Team && x.User < y.User
	})
	sort.SliceStable(rep.Jobs, func(a, b int) bool {
		x, y := rep.Jobs[a], rep.Jobs[b]
		return x.Savings.Micros > y.Savings.Micros || x.Savings.Micros == y.Savings.Micros && x.JobID < y.JobID
	})
	return rep, nil
}

func (u *UsageSummary) add(j *reportJob) error {
	var ok bool
	if u.Cost.Micros, ok = addMicros(u.Cost.Micros, j.Cost.Micros); !ok {
		return allot.Errorf(allot.EInternal, "report cost overflows")
	}
	if u.Savings.Micros, ok = addMicros(u.Savings.Micros, j.Savings.Micros); !ok {
		return allot.Errorf(allot.EInternal, "report savings overflow")
	}
	u.GPUSeconds += j.GPUSeconds
	u.Jobs++
	if len(j.Flags) > 0 {
		u.Flagged++
	}
	for _, h := range j.hours {
		if h.MeanUtilPct != nil {
			u.utilW += float64(h.GPUSeconds)
			u.utilSum += float64(h.GPUSeconds) * *h.MeanUtilPct
		}
		if h.MeanMemUsedMiB != nil && h.MemTotalMiB != nil && *h.MemTotalMiB > 0 {
			u.memW += float64(h.GPUSeconds)
			u.memSum += float64(h.GPUSeconds) * 100 * *h.MeanMemUsedMiB / float64(*h.MemTotalMiB)
		}
	}
	return nil
}

func (u *UsageSummary) finish() {
	if u.utilW > 0 {
		v := u.utilSum / u.utilW
		u.MeanUtilPct = &v
	}
	if u.memW > 0 {
		v := u.memSum / u.memW
		u.MeanMemPct = &v
	}
}

func addMicros(a, b int64) (int64, bool) {
	c := a + b
	return c, (c > a) == (b > 0) || b == 0
}

// hourCost prices gpuSeconds of gpuType run as tier in hour h.
func hourCost(card *billing.RateCard, gpuType string, tier allot.TierID, h time.Time, gpuSeconds int64) (allot.Money, bool, error) {
	r, ok := card.RateAt(gpuType, h)
	if !ok {
		return allot.Money{}, false, nil
	}
	m, ok := card.MultiplierAt(tier, h)
	if !ok {
		return allot.Money{}, false, allot.Errorf(allot.EInternal, "no multiplier for tier %s at %s", tier, h.Format(time.RFC3339))
	}
	amt, err := billing.LineAmount(gpuSeconds, r.Micros, m.BP, card.Currency())
	return amt, true, err
}

// evaluate computes a job's cost, means and flags; sites says where each
// GPU type's nodes are (GPUTypeSiteCapacity).
func evaluate(card *billing.RateCard, types []allot.GPUType, sites map[string]GPUTypeSites, j *reportJob, zero allot.Money) error {
	j.Cost, j.Savings = zero, zero
	cost := map[[2]int64]allot.Money{} // (segment, hour) → cost
	typeSeconds := map[string]int64{}
	var utilW, utilSum, runtime float64
	for _, h := range j.hours {
		c, ok, err := hourCost(card, h.GPUType, j.Tier, h.Hour, h.GPUSeconds)
		if err != nil {
			return err
		}
		if !ok {
			return allot.Errorf(allot.EInternal, "no rate for GPU type %s at %s", h.GPUType, h.Hour.Format(time.RFC3339))
		}
		cost[[2]int64{int64(h.Segment), h.Hour.Unix()}] = c
		var okAdd bool
		if j.Cost.Micros, okAdd = addMicros(j.Cost.Micros, c.Micros); !okAdd {
			return allot.Errorf(allot.EInternal, "job cost overflows")
		}
		j.GPUSeconds += h.GPUSeconds
		typeSeconds[h.GPUType] += h.GPUSeconds
		if h.MeanUtilPct != nil && h.GPUs > 0 {
			utilW += float64(h.GPUSeconds)
			utilSum += float64(h.GPUSeconds) * *h.MeanUtilPct
			runtime += float64(h.GPUSeconds) / float64(h.GPUs)
		}
		if h.PeakMemUsedMiB != nil && (j.PeakMemMiB == nil || *h.PeakMemUsedMiB > *j.PeakMemMiB) {
			p := *h.PeakMemUsedMiB
			j.PeakMemMiB = &p
		}
	}
	for t, sec := range typeSeconds {
		if sec > typeSeconds[j.GPUType] || sec == typeSeconds[j.GPUType] && (j.GPUType == "" || t < j.GPUType) {
			j.GPUType = t
		}
	}
	if utilW > 0 {
		v := utilSum / utilW
		j.MeanUtilPct = &v
	}

	// (a) low compute utilization.
	if j.MeanUtilPct != nil && *j.MeanUtilPct < LowUtilPct && runtime > LowUtilMinRuntime.Seconds() {
		utilBP := int64(math.Round(*j.MeanUtilPct * 100))
		utilBP = max(0, min(utilBP, LowUtilPct*100))
		saved := mulDivRound(j.Cost.Micros, LowUtilPct*100-utilBP, LowUtilPct*100, billing.RoundingUnit(zero.Currency))
		j.Flags = append(j.Flags, Flag{Rule: RuleLowUtilization, Savings: allot.Money{Micros: saved, Currency: zero.Currency},
			Suggestion: fmt.Sprintf("mean GPU utilization %.1f %% over %s of runtime: profile the input pipeline or request fewer GPUs",
				*j.MeanUtilPct, allot.FormatDuration(time.Duration(runtime)*time.Second))})
	}

	// (b) idle GPUs: per run segment, per GPU, over the period.
	type gstat struct {
		samples int64
		util    float64
	}
	per := map[int]map[string]*gstat{}
	for _, g := range j.gpus {
		if per[g.segment] == nil {
			per[g.segment] = map[string]*gstat{}
		}
		st := per[g.segment][g.gpu]
		if st == nil {
			st = &gstat{}
			per[g.segment][g.gpu] = st
		}
		if g.util != nil {
			st.samples += g.samples
			st.util += float64(g.samples) * *g.util
		}
	}
	idle := map[int]map[string]bool{}
	maxIdle, segGPUs := 0, 0
	for seg, gs := range per {
		busy := false
		var idl []string
		for name, st := range gs {
			if st.samples == 0 {
				continue
			}
			if st.util/float64(st.samples) >= IdleGPUPct {
				busy = true
			} else {
				idl = append(idl, name)
			}
		}
		if busy && len(idl) > 0 {
			idle[seg] = map[string]bool{}
			for _, n := range idl {
				idle[seg][n] = true
			}
			if len(idl) > maxIdle {
				maxIdle, segGPUs = len(idl), len(gs)
			}
		}
	}
	if maxIdle > 0 {
		idleSeconds := map[[2]int64]int64{}
		var hourKeys [][2]int64
		for _, g := range j.gpus {
			if idle[g.segment][g.gpu] {
				k := [2]int64{int64(g.segment), g.hour.Unix()}
				if _, seen := idleSeconds[k]; !seen {
					hourKeys = append(hourKeys, k)
				}
				idleSeconds[k] += g.gpuSeconds
			}
		}
		saved := zero
		for _, k := range hourKeys {
			h := j.hourOf(k)
			c, _, err := hourCost(card, h.GPUType, j.Tier, h.Hour, idleSeconds[k])
			if err != nil {
				return err
			}
			saved.Micros += c.Micros
		}
		want := max(j.GPUs, segGPUs)
		j.Flags = append(j.Flags, Flag{Rule: RuleIdleGPUs, Savings: saved,
			Suggestion: fmt.Sprintf("request %d GPUs instead of %d: %d of its GPUs stayed below %d %% utilization while the others worked",
				want-maxIdle, want, maxIdle, IdleGPUPct)})
	}

	// (c) a cheaper GPU type fits the peak memory, and the job's tier may
	// run on it.
	if j.PeakMemMiB != nil {
		cur, ok := card.RateAt(j.GPUType, j.hours[len(j.hours)-1].Hour)
		var best *allot.GPUType
		var bestRate int64
		for i := range types {
			t := &types[i]
			if t.Name == j.GPUType || int64(t.MemoryGB)*1024 < *j.PeakMemMiB || !sites[t.Name].Fits(j.Tier, j.GPUs) {
				continue
			}
			r, rok := card.RateAt(t.Name, j.hours[len(j.hours)-1].Hour)
			if !ok || !rok || r.Micros >= cur.Micros {
				continue
			}
			if best == nil || r.Micros < bestRate {
				best, bestRate = t, r.Micros
			}
		}
		if best != nil {
			saved := zero
			for _, h := range j.hours {
				if h.GPUType == best.Name {
					continue
				}
				alt, aok, err := hourCost(card, best.Name, j.Tier, h.Hour, h.GPUSeconds)
				if err != nil {
					return err
				}
				if d := cost[[2]int64{int64(h.Segment), h.Hour.Unix()}].Micros - alt.Micros; aok && d > 0 {
					saved.Micros += d
				}
			}
			if saved.Micros > 0 {
				where := ""
				if sites[best.Name].BurstOnly() {
					where = " (on burst nodes: tiers 3, 4 and preemptible only)"
				}
				j.Flags = append(j.Flags, Flag{Rule: RuleCheaperGPUType, Savings: saved,
					Suggestion: fmt.Sprintf("use gpu_type %s%s: peak memory %s GB fits its %d GB", best.Name, where, gb(*j.PeakMemMiB), best.MemoryGB)})
			}
		}
	}
	for _, f := range j.Flags {
		if f.Savings.Micros > j.Savings.Micros {
			j.Savings = f.Savings
		}
	}
	return nil
}

func (j *reportJob) hourOf(k [2]int64) JobUsageHour {
	for _, h := range j.hours {
		if int64(h.Segment) == k[0] && h.Hour.Unix() == k[1] {
			return h
		}
	}
	return JobUsageHour{}
}

// gb formats MiB as GB (GiB, as gpu_types.memory_gb counts them) with one
// decimal.
func gb(mib int64) string {
	s := new(big.Rat).SetFrac64(mib, 1024).FloatString(1)
	return strings.TrimSuffix(s, ".0")
}

// mulDivRound returns a × b ÷ c rounded half up (away from zero) to a
// multiple of unit, exactly.
func mulDivRound(a, b, c, unit int64) int64 {
	n := new(big.Int).Mul(big.NewInt(a), big.NewInt(b))
	d := new(big.Int).Mul(big.NewInt(c), big.NewInt(unit))
	neg := n.Sign() < 0
	n.Abs(n)
	q, r := new(big.Int).QuoRem(n, d, new(big.Int))
	if r.Mul(r, big.NewInt(2)).Cmp(d) >= 0 {
		q.Add(q, big.NewInt(1))
	}
	v := q.Int64() * unit
	if neg {
		v = -v
	}
	return v
}
