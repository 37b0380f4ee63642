package store

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// This file holds the read models of the everyday pages: the cluster
// dashboard, a job's timeline, queue position and utilization, and the
// fair-share inputs.

// NodeStateCount is how many nodes (and their GPUs) of a site are in a state.
type NodeStateCount struct {
	Site  string
	State string
	Nodes int
	GPUs  int
}

// GPUTypeNow is one GPU type's capacity, allocation and queue right now.
type GPUTypeNow struct {
	GPUType string
	// GPUs on every registered node of the type; InService on nodes that
	// are up or draining (they hold or may finish work); Allocated in
	// active allocations.
	GPUs, InService, Allocated int
}

// QueueDepth is the pending work that asks for one GPU type ("" = any type).
type QueueDepth struct {
	GPUType string
	Jobs    int
	// GPUSeconds is Σ GPUs × time limit of the pending jobs.
	GPUSeconds int64
}

// TierWait is the queueing delay of one tier.
type TierWait struct {
	Tier allot.TierID
	// Started: jobs whose first start fell in the window; P50/P95 of their
	// wait (first start − submission).
	Started  int
	P50, P95 time.Duration
	// Pending jobs of the tier now, the median and the largest age.
	Pending            int
	PendingP50, Oldest time.Duration
}

// HourPoint is one UTC hour of the utilization series.
type HourPoint struct {
	Hour time.Time
	// AllocatedGPUSeconds held by allocations in the hour (running ones up
	// to now).
	AllocatedGPUSeconds int64
	// MeanUtilPct is the GPU-seconds-weighted mean compute utilization that
	// the agents sampled on allocated GPUs (hourly metering rollups); nil
	// when the hour has no rolled-up samples.
	MeanUtilPct *float64
}

// ClusterOverview is the cluster dashboard's data, as of Now.
type ClusterOverview struct {
	Now      time.Time
	From     time.Time // start of the hourly series
	Nodes    []NodeStateCount
	Types    []GPUTypeNow
	Queue    []QueueDepth
	Waits    []TierWait
	Hourly   []HourPoint
	Running  int
	Pending  int
	TotalGPU int // GPUs on every registered node
}

// ClusterOverview loads the dashboard: every figure comes from a query
// bounded by an index (nodes, active allocations, pending jobs, jobs
// started since from, allocations and rollups overlapping the last days).
func (s *Store) ClusterOverview(ctx context.Context, days int) (ClusterOverview, error) {
	var o ClusterOverview
	err := s.InTx(ctx, func(tx *Store) error {
		// With a large cluster the planner takes the hourly series (one
		// generate_series per allocation, guessed at 1,000 rows each) for
		// millions of rows and compiles the query (JIT) for most of a
		// second to save milliseconds.
		if _, err := tx.db.Exec(ctx, `SET LOCAL jit = off`); err != nil {
			return mapErr("loading the cluster overview", err)
		}
		var err error
		o, err = tx.clusterOverview(ctx, days)
		return err
	})
	return o, err
}

func (s *Store) clusterOverview(ctx context.Context, days int) (ClusterOverview, error) {
	now := s.Now().UTC()
	o := ClusterOverview{Now: now}
	// The series covers the last days×24 whole hours and the current one.
	o.From = now.Truncate(time.Hour).Add(-time.Duration(days*24) * time.Hour)

	// Released burst nodes (their rows stay, for a reused name) are not
	// part of the cluster.
	rows, err := s.db.Query(ctx, `SELECT site, state, count(*)::int, sum(gpu_count)::int FROM nodes n
		WHERE NOT `+releasedBurstNode+` GROUP BY site, state ORDER BY site, state`)
	if err != nil {
		return o, mapErr("counting nodes", err)
	}
	if o.Nodes, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeStateCount, error) {
		var x NodeStateCount
		return x, r.Scan(&x.Site, &x.State, &x.Nodes, &x.GPUs)
	}); err != nil {
		return o, mapErr("counting nodes", err)
	}
	for _, n := range o.Nodes {
		o.TotalGPU += n.GPUs
	}

	rows, err = s.db.Query(ctx, `
		SELECT n.gpu_type, sum(n.gpu_count)::int,
			coalesce(sum(n.gpu_count) FILTER (WHERE n.state IN ('up', 'draining')), 0)::int,
			coalesce(sum(a.held), 0)::int
		FROM nodes n
		LEFT JOIN (SELECT node, count(*) AS held FROM allocations WHERE released_at IS NULL GROUP BY node) a ON a.node = n.name
		WHERE NOT `+releasedBurstNode+`
		GROUP BY n.gpu_type ORDER BY n.gpu_type`)
	if err != nil {
		return o, mapErr("counting GPUs", err)
	}
	if o.Types, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (GPUTypeNow, error) {
		var x GPUTypeNow
		return x, r.Scan(&x.GPUType, &x.GPUs, &x.InService, &x.Allocated)
	}); err != nil {
		return o, mapErr("counting GPUs", err)
	}

	err = s.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'running'), count(*) FILTER (WHERE state = 'pending')
		FROM jobs WHERE state IN ('running', 'pending')`).Scan(&o.Running, &o.Pending)
	if err != nil {
		return o, mapErr("counting jobs", err)
	}

	rows, err = s.db.Query(ctx, `
		SELECT coalesce(gpu_type, ''), count(*)::int, sum(gpus::bigint * time_limit_s)::bigint
		FROM jobs WHERE state = 'pending' GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return o, mapErr("measuring the queue", err)
	}
	if o.Queue, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueDepth, error) {
		var x QueueDepth
		return x, r.Scan(&x.GPUType, &x.Jobs, &x.GPUSeconds)
	}); err != nil {
		return o, mapErr("measuring the queue", err)
	}

	// Waits: jobs first started since from (jobs_started_idx), and the
	// pending jobs' ages now (jobs_state_idx).
	waits := map[allot.TierID]*TierWait{}
	for _, t := range allot.Tiers {
		waits[t] = &TierWait{Tier: t}
	}
	var tier string
	var n int
	var p50, p95 float64
	rows, err = s.db.Query(ctx, `
		SELECT tier, count(*)::int,
			percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - submitted_at))::float8,
			percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - submitted_at))::float8
		FROM jobs WHERE started_at >= $1 AND started_at <= $2 GROUP BY tier`, now.Add(-time.Duration(days*24)*time.Hour), now)
	if err != nil {
		return o, mapErr("measuring waits", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&tier, &n, &p50, &p95}, func() error {
		if w := waits[allot.TierID(tier)]; w != nil {
			w.Started, w.P50, w.P95 = n, secs(p50), secs(p95)
		}
		return nil
	}); err != nil {
		return o, mapErr("measuring waits", err)
	}
	rows, err = s.db.Query(ctx, `
		SELECT tier, count(*)::int,
			percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM $1 - submitted_at))::float8,
			max(extract(epoch FROM $1 - submitted_at))::float8
		FROM jobs WHERE state = 'pending' GROUP BY tier`, now)
	if err != nil {
		return o, mapErr("measuring pending ages", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&tier, &n, &p50, &p95}, func() error {
		if w := waits[allot.TierID(tier)]; w != nil {
			w.Pending, w.PendingP50, w.Oldest = n, secs(p50), secs(p95)
		}
		return nil
	}); err != nil {
		return o, mapErr("measuring pending ages", err)
	}
	for _, t := range allot.Tiers {
		o.Waits = append(o.Waits, *waits[t])
	}

	// Allocated GPU-seconds per hour: each allocation overlapping the window
	// (allocations_release_idx) clipped to it and cut at hour boundaries.
	hourly := map[int64]*HourPoint{}
	for h := o.From; !h.After(now); h = h.Add(time.Hour) {
		p := &HourPoint{Hour: h}
		hourly[h.Unix()] = p
		o.Hourly = append(o.Hourly, HourPoint{Hour: h})
	}
	var hour time.Time
	var gpuSec int64
	rows, err = s.db.Query(ctx, `
		WITH a AS (
			-- A gang's GPUs share their start and release: one row each,
			-- with their count, is up to 8× fewer to cut into hours.
			SELECT greatest(started_at, $1) AS s, least(coalesce(released_at, $2), $2) AS e, count(*) AS n
			FROM allocations
			WHERE coalesce(released_at, 'infinity'::timestamptz) > $1 AND started_at < $2
			GROUP BY 1, 2
		)
		SELECT h, sum(a.n * (floor(extract(epoch FROM least(a.e, h + interval '1 hour'))) - floor(extract(epoch FROM greatest(a.s, h)))))::bigint
		FROM a, generate_series(date_bin('1 hour', a.s, 'epoch'::timestamptz), a.e - interval '1 microsecond', interval '1 hour') h
		WHERE a.e > a.s
		GROUP BY h`, o.From, now)
	if err != nil {
		return o, mapErr("loading hourly allocation", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&hour, &gpuSec}, func() error {
		if p := hourly[hour.Unix()]; p != nil {
			p.AllocatedGPUSeconds = gpuSec
		}
		return nil
	}); err != nil {
		return o, mapErr("loading hourly allocation", err)
	}
	var util *float64
	rows, err = s.db.Query(ctx, `
		SELECT hour, (sum(mean_util_pct * gpu_seconds) / nullif(sum(gpu_seconds), 0))::float8
		FROM job_usage_hours WHERE hour >= $1 AND hour <= $2 AND samples > 0 GROUP BY hour`, o.From, now)
	if err != nil {
		return o, mapErr("loading hourly utilization", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&hour, &util}, func() error {
		if p := hourly[hour.Unix()]; p != nil && util != nil {
			v := *util
			p.MeanUtilPct = &v
		}
		return nil
	}); err != nil {
		return o, mapErr("loading hourly utilization", err)
	}
	for i := range o.Hourly {
		o.Hourly[i] = *hourly[o.Hourly[i].Hour.Unix()]
	}
	return o, nil
}

func secs(f float64) time.Duration { return time.Duration(f * float64(time.Second)).Round(time.Second) }

// RunSegment is one run of a job: where and when it held GPUs, and how it
// ended.
type RunSegment struct {
	Segment    int
	Nodes      []string
	GPUs       int
	Start      time.Time
	End        time.Time // zero while running
	StopReason string    // "preempted", "cancelled", ... ("" when it ended by itself)
	// PreemptedBy is the job that preempted it (0: none).
	PreemptedBy int64
	ExitCode    *int
	ExitReason  string
}

// JobSegments returns a job's run segments, oldest first.
func (s *Store) JobSegments(ctx context.Context, jobID int64) ([]RunSegment, error) {
	rows, err := s.db.Query(ctx, `
		SELECT a.segment, array_agg(DISTINCT a.node ORDER BY a.node), count(DISTINCT (a.node, a.gpu_index))::int, min(a.started_at),
			CASE WHEN bool_or(a.released_at IS NULL) THEN NULL ELSE max(a.released_at) END,
			coalesce(l.stop, ''), coalesce(l.by, 0), l.code, coalesce(l.reason, '')
		FROM allocations a
		LEFT JOIN (
			SELECT segment, string_agg(DISTINCT nullif(stop_reason, ''), ', ') AS stop, max(preempted_by) AS by,
				max(exit_code) AS code, string_agg(DISTINCT nullif(exit_reason, ''), '; ') AS reason
			FROM leases WHERE job_id = $1 GROUP BY segment
		) l ON l.segment = a.segment
		WHERE a.job_id = $1
		GROUP BY a.segment, l.stop, l.by, l.code, l.reason ORDER BY a.segment`, jobID)
	if err != nil {
		return nil, mapErr("loading run segments", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RunSegment, error) {
		var x RunSegment
		var end *time.Time
		err := r.Scan(&x.Segment, &x.Nodes, &x.GPUs, &x.Start, &end, &x.StopReason, &x.PreemptedBy, &x.ExitCode, &x.ExitReason)
		x.Start = x.Start.UTC()
		if end != nil {
			x.End = end.UTC()
		}
		return x, err
	})
	return out, mapErr("loading run segments", err)
}

// GPUUtilPoint is one GPU's mean utilization over [At, At+Width).
type GPUUtilPoint struct {
	GPU     string // node/index
	At      time.Time
	Width   time.Duration
	UtilPct float64
}

// JobGPUUtil returns each GPU's utilization over a job's life: the hourly
// metering rollups for the hours whose raw samples are gone or that came
// before the first raw sample still kept, and the raw samples averaged into
// buckets (about 60 over the raw span, at least a minute) after that.
func (s *Store) JobGPUUtil(ctx context.Context, jobID int64) ([]GPUUtilPoint, error) {
	var first, last *time.Time
	if err := s.db.QueryRow(ctx, `SELECT min(at), max(at) FROM gpu_samples WHERE job_id = $1`, jobID).Scan(&first, &last); err != nil {
		return nil, mapErr("loading samples", err)
	}
	cut := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if first != nil {
		cut = first.UTC().Truncate(time.Hour)
	}
	rows, err := s.db.Query(ctx, `
		SELECT node || '/' || gpu_index, hour, (sum(mean_util_pct * samples) / sum(samples))::float8
		FROM job_gpu_usage_hours WHERE job_id = $1 AND hour < $2 AND samples > 0
		GROUP BY node, gpu_index, hour ORDER BY node, gpu_index, hour`, jobID, cut)
	if err != nil {
		return nil, mapErr("loading GPU rollups", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (GPUUtilPoint, error) {
		x := GPUUtilPoint{Width: time.Hour}
		err := r.Scan(&x.GPU, &x.At, &x.UtilPct)
		x.At = x.At.UTC()
		return x, err
	})
	if err != nil {
		return nil, mapErr("loading GPU rollups", err)
	}
	if first == nil {
		return out, nil
	}
	width := max(time.Minute, last.Sub(cut)/60).Truncate(time.Minute)
	if width < time.Minute {
		width = time.Minute
	}
	rows, err = s.db.Query(ctx, `
		SELECT node || '/' || gpu_index, date_bin(make_interval(secs => $3), at, $2), avg(util_pct)::float8
		FROM gpu_samples WHERE job_id = $1 AND at >= $2
		GROUP BY node, gpu_index, 2 ORDER BY node, gpu_index, 2`, jobID, cut, width.Seconds())
	if err != nil {
		return nil, mapErr("loading samples", err)
	}
	raw, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (GPUUtilPoint, error) {
		x := GPUUtilPoint{Width: width}
		err := r.Scan(&x.GPU, &x.At, &x.UtilPct)
		x.At = x.At.UTC()
		return x, err
	})
	if err != nil {
		return nil, mapErr("loading samples", err)
	}
	out = append(out, raw...)
	sort.SliceStable(out, func(a, b int) bool {
		return out[a].GPU < out[b].GPU || out[a].GPU == out[b].GPU && out[a].At.Before(out[b].At)
	})
	return out, nil
}

// TeamShareInput is what the scheduler's fair share reads for a team: its
// weight (raw shares) and its decayed usage.
type TeamShareInput struct {
	Team        string
	Weight      int
	UsageGPUSec float64
	UsageAsOf   time.Time // when the decay last ran (zero: never)
}

// TeamShareInputs returns every team's fair-share inputs, by team.
func (s *Store) TeamShareInputs(ctx context.Context) ([]TeamShareInput, error) {
	rows, err := s.db.Query(ctx, `
		SELECT t.slug, t.fair_share_weight, coalesce(u.gpu_seconds, 0), u.updated_at
		FROM teams t LEFT JOIN team_usage u ON u.team = t.slug ORDER BY t.slug`)
	if err != nil {
		return nil, mapErr("loading fair-share inputs", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TeamShareInput, error) {
		var x TeamShareInput
		var at *time.Time
		err := r.Scan(&x.Team, &x.Weight, &x.UsageGPUSec, &at)
		if at != nil {
			x.UsageAsOf = at.UTC()
		}
		return x, err
	})
	return out, mapErr("loading fair-share inputs", err)
}

// KindUsage is GPU-seconds of one job type (tier as run × GPU type).
type KindUsage struct {
	Tier       allot.TierID
	GPUType    string
	GPUSeconds int64
}

// TeamUsageByKind breaks team's usage in [from, upTo) down by the tier its
// jobs ran as and the GPU type they held, from the allocations (running ones
// up to upTo), on the same second grid as TeamMonthUsageDetail.
func (s *Store) TeamUsageByKind(ctx context.Context, team string, from, upTo time.Time) ([]KindUsage, error) {
	// The period's allocations come from allocations_release_idx and each
	// looks its job up by primary key (the OFFSET 0 keeps the planner from
	// hashing every job the team ever ran: that grows with history, this
	// with the period).
	rows, err := s.db.Query(ctx, `
		SELECT j.kind, n.gpu_type, sum(floor(extract(epoch FROM least(coalesce(a.released_at, $3), $3) - greatest(a.started_at, $2))))::bigint
		FROM allocations a
		JOIN LATERAL (
			SELECT CASE WHEN j.run_as <> '' THEN j.run_as WHEN j.preemptible THEN 'preemptible' ELSE j.tier END AS kind
			FROM jobs j WHERE j.id = a.job_id AND j.team = $1 OFFSET 0
		) j ON true
		JOIN nodes n ON n.name = a.node
		WHERE a.started_at < $3 AND coalesce(a.released_at, 'infinity'::timestamptz) > $2
		GROUP BY 1, 2 ORDER BY 1, 2`, team, from, upTo)
	if err != nil {
		return nil, mapErr("loading usage by job type", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (KindUsage, error) {
		var x KindUsage
		var tier string
		err := r.Scan(&tier, &x.GPUType, &x.GPUSeconds)
		x.Tier = allot.TierID(tier)
		return x, err
	})
	return out, mapErr("loading usage by job type", err)
}

// SeedDemoMetering writes hourly usage rollups, as if agents had sampled
// them, for the finished allocations that overlap [from, upTo), with a
// fixed utilization pattern by job and GPU (some jobs low, some with idle
// GPUs, some with memory that fits a smaller GPU), and records those whole
// hours as rolled up with their raw samples deleted, so later rollups keep
// them. It is for demonstration data only (demo.SeedActivity): real rollups
// come from real samples (RollupJobUsage).
func (s *Store) SeedDemoMetering(ctx context.Context, from, upTo time.Time) error {
	return s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, meteringLock); err != nil {
			return mapErr("taking the metering lock", err)
		}
		_, err := tx.db.Exec(ctx, `
			WITH hours AS (
				SELECT h FROM generate_series(date_bin('1 hour', $1::timestamptz, 'epoch'::timestamptz), $2::timestamptz - interval '1 hour', interval '1 hour') h
				WHERE h + interval '1 hour' <= $2
			), alloc AS (
				SELECT a.job_id, a.segment, a.node, a.gpu_index, n.gpu_type, h.h AS hour,
					(floor(extract(epoch FROM least(a.released_at, h.h + interval '1 hour'))) - floor(extract(epoch FROM greatest(a.started_at, h.h))))::bigint AS secs
				FROM allocations a JOIN nodes n ON n.name = a.node JOIN hours h ON a.started_at < h.h + interval '1 hour' AND a.released_at > h.h
				WHERE a.released_at IS NOT NULL AND a.released_at > $1 AND a.started_at < $2
			), g AS (
				SELECT x.*, greatest(1, x.secs / 10) AS n,
					(CASE WHEN x.job_id % 7 = 3 AND x.gpu_index >= x.gpus_of_job / 2 AND x.gpus_of_job > 1 THEN 2
					      WHEN x.job_id % 5 = 0 THEN 12 + (x.job_id * 13 + x.gpu_index * 7 + extract(epoch FROM x.hour)::bigint / 3600 * 3) % 20
					      ELSE 55 + (x.job_id * 13 + x.gpu_index * 7 + extract(epoch FROM x.hour)::bigint / 3600 * 5) % 40 END)::float8 AS util,
					(CASE WHEN x.job_id % 6 = 1 THEN 11000 + x.gpu_index * 100 ELSE 9000 + (x.job_id * 97) % 5000 END) *
						(CASE WHEN x.gpu_type = 'T4' THEN 1 ELSE 5 END) AS mem,
					CASE WHEN x.gpu_type = 'T4' THEN 15360 ELSE 81920 END AS total
				FROM (SELECT a.*, count(*) OVER (PARTITION BY a.job_id, a.segment, a.hour) AS gpus_of_job FROM alloc a WHERE a.secs > 0) x
			), ins AS (
				INSERT INTO job_gpu_usage_hours (job_id, segment, hour, node, gpu_index, gpu_seconds, samples, mean_util_pct)
				SELECT job_id, segment, hour, node, gpu_index, secs, n, util FROM g
				ON CONFLICT DO NOTHING
			)
			INSERT INTO job_usage_hours (job_id, segment, hour, gpu_type, gpus, gpu_seconds, samples, mean_util_pct, mean_mem_used_mib,
				peak_mem_used_mib, mem_total_mib)
			SELECT job_id, segment, hour, min(gpu_type), count(*), sum(secs), sum(n), sum(util * n) / sum(n), sum(mem::float8 * n) / sum(n),
				max(mem) + 512, max(total)
			FROM g GROUP BY job_id, segment, hour
			ON CONFLICT DO NOTHING`, from, upTo)
		if err != nil {
			return mapErr("seeding demo metering", err)
		}
		_, err = tx.db.Exec(ctx, `
			INSERT INTO metering_hours (hour, rolled_up_at, purged_at)
			SELECT h, $2, $2 FROM generate_series(date_bin('1 hour', $1::timestamptz, 'epoch'::timestamptz), $2::timestamptz - interval '1 hour', interval '1 hour') h
			WHERE h + interval '1 hour' <= $2
			ON CONFLICT (hour) DO UPDATE SET purged_at = coalesce(metering_hours.purged_at, EXCLUDED.purged_at)`, from, upTo)
		return mapErr("seeding demo metering", err)
	})
}

// BackfillTeamUsage sets every team's decayed fair-share usage from all its
// allocations up to now, each weighted by 0.5^(age of its midpoint ÷
// halfLife), as if the decay job had run all along. A new installation
// with imported history (and the demo) starts from it; DecayUsageEvery carries
// it on.
func (s *Store) BackfillTeamUsage(ctx context.Context, halfLife time.Duration) error {
	_, err := s.db.Exec(ctx, `
		INSERT INTO team_usage (team, gpu_seconds, updated_at)
		SELECT t.slug, coalesce(sum(u.secs * power(0.5, greatest(0, extract(epoch FROM $1 - u.mid)) / $2)), 0), $1
		FROM teams t LEFT JOIN (
			SELECT j.team, extract(epoch FROM least(coalesce(a.released_at, $1), $1) - a.started_at) AS secs,
				a.started_at + (least(coalesce(a.released_at, $1), $1) - a.started_at) / 2 AS mid
			FROM allocations a JOIN jobs j ON j.id = a.job_id WHERE a.started_at < $1
		) u ON u.team = t.slug
		GROUP BY t.slug
		ON CONFLICT (team) DO UPDATE SET gpu_seconds = EXCLUDED.gpu_seconds, updated_at = EXCLUDED.updated_at`, s.Now(), halfLife.Seconds())
	return mapErr("backfilling fair-share usage", err)
}

// GPUTypeSites is how many GPUs of one type the cluster's nodes hold on
// premises and in the cloud. Cloud nodes are burst nodes; their rows stay
// after a release, so Cloud is what burst has provided of the type, not
// only what is alive.
type GPUTypeSites struct {
	OnPrem, Cloud int
}

// Fits reports whether a job of tier asking for gpus GPUs could be placed
// on nodes of the type at all: production tiers (1–2) only on premises
// (they never run on burst nodes), every other tier on either site.
func (g GPUTypeSites) Fits(tier allot.TierID, gpus int) bool {
	if tier.Production() {
		return g.OnPrem >= gpus
	}
	return g.OnPrem+g.Cloud >= gpus
}

// BurstOnly reports whether the type exists only on burst (cloud) nodes.
func (g GPUTypeSites) BurstOnly() bool { return g.OnPrem == 0 && g.Cloud > 0 }

// GPUTypeSiteCapacity returns, by GPU type, the GPUs its nodes hold at each
// site (right-sizing suggests only types a job's tier may run on). A type
// without nodes is absent.
func (s *Store) GPUTypeSiteCapacity(ctx context.Context) (map[string]GPUTypeSites, error) {
	rows, err := s.db.Query(ctx, `SELECT gpu_type, site, sum(gpu_count)::int FROM nodes GROUP BY 1, 2`)
	if err != nil {
		return nil, mapErr("loading GPU capacity by site", err)
	}
	out := map[string]GPUTypeSites{}
	var typ, site string
	var gpus int
	_, err = pgx.ForEachRow(rows, []any{&typ, &site, &gpus}, func() error {
		g := out[typ]
		if site == allot.SiteCloud {
			g.Cloud += gpus
		} else {
			g.OnPrem += gpus
		}
		out[typ] = g
		return nil
	})
	return out, mapErr("loading GPU capacity by site", err)
}

// TeamPageUsage is what the team page and GET /api/v1/teams/:team/budget
// show of a team's usage: the month's detail (TeamMonthUsageDetail), its
// kinds (TeamUsageByKind) and last month's total (TeamUsageBetween), with
// the same definitions, clipping and per-allocation rounding.
type TeamPageUsage struct {
	TeamUsage
	Kinds []KindUsage
	// LastMonthGPUSeconds is the GPU-seconds of the month before Month.
	LastMonthGPUSeconds int64
}

// teamPageUsageQuery loads team's usage of the month containing upTo and
// of the month before in one query (TeamPageUsage gives the same from
// kept sums when it can): one scan of the allocations overlapping
// the two months (materialized once) feeds every breakdown. Separately,
// the month was scanned four times and last month once more, and the daily
// breakdown compared every allocation with every day of the month; with a
// year of history that made the team page take 0.5 s at mid-month. Days
// are 24-hour steps from the month's first instant (UTC).
func (s *Store) teamPageUsageQuery(ctx context.Context, team string, upTo time.Time) (TeamPageUsage, error) {
	month := MonthStart(upTo)
	prev := month.AddDate(0, -1, 0)
	u := TeamPageUsage{TeamUsage: TeamUsage{Team: team, Month: month, UpTo: upTo,
		ByJobType: map[string]int64{"production": 0, "experiments": 0, "preemptible": 0}, ByUser: []UserUsage{}, Daily: []DayUsage{}},
		Kinds: []KindUsage{}}
	found := false
	err := s.InTx(ctx, func(tx *Store) error {
		// The planner takes the per-allocation day series for 1,000 rows
		// each and would spend most of a second compiling the query (JIT)
		// to save milliseconds.
		if _, err := tx.db.Exec(ctx, `SET LOCAL jit = off`); err != nil {
			return err
		}
		rows, err := tx.db.Query(ctx, `
		WITH g AS MATERIALIZED (
			-- A gang's GPUs on a node share their start and release: one
			-- row each with their count (n) is 8× fewer rows to join.
			SELECT a.job_id, a.node, a.started_at AS st, a.released_at AS rel, count(*) AS n
			FROM allocations a
			WHERE a.started_at < $4 AND coalesce(a.released_at, 'infinity'::timestamptz) > $2
			GROUP BY 1, 2, 3, 4),
		a AS MATERIALIZED (
			SELECT g.st, g.rel, g.n, g.node, j.user_id,
				CASE WHEN j.run_as IN ('1', '2') OR (j.run_as = '' AND j.tier IN ('1', '2') AND NOT j.preemptible) THEN 'production'
				     WHEN j.run_as = 'preemptible' OR (j.run_as = '' AND j.preemptible) OR j.tier = 'preemptible' THEN 'preemptible'
				     ELSE 'experiments' END AS jtype,
				CASE WHEN j.run_as <> '' THEN j.run_as WHEN j.preemptible THEN 'preemptible' ELSE j.tier END AS kind
			FROM g JOIN jobs j ON j.id = g.job_id WHERE j.team = $1),
		m AS MATERIALIZED (
			SELECT greatest(st, $3) AS s, least(coalesce(rel, $4), $4) AS e, n, node, user_id, jtype, kind
			FROM a WHERE coalesce(rel, 'infinity'::timestamptz) > $3)
		SELECT * FROM (
		SELECT 'budget' AS section, '' AS k, '' AS k2, NULL::timestamptz AS day, monthly_budget_gpu_hours::bigint AS v FROM teams WHERE slug = $1
		UNION ALL
		SELECT 'last', '', '', NULL, coalesce(sum(n * floor(extract(epoch FROM least(coalesce(rel, $3), $3) - greatest(st, $2)))), 0)::bigint
			FROM a WHERE st < $3
		UNION ALL
		SELECT 'type', jtype, '', NULL, coalesce(sum(n * floor(extract(epoch FROM e - s))), 0)::bigint FROM m GROUP BY jtype
		UNION ALL
		SELECT 'user', us.email, '', NULL, x.secs
			FROM (SELECT user_id, coalesce(sum(n * floor(extract(epoch FROM e - s))), 0)::bigint AS secs FROM m GROUP BY user_id) x
			JOIN users us ON us.id = x.user_id
		UNION ALL
		SELECT 'kind', m.kind, nd.gpu_type, NULL, sum(m.n * floor(extract(epoch FROM m.e - m.s)))::bigint
			FROM m JOIN nodes nd ON nd.name = m.node GROUP BY m.kind, nd.gpu_type
		UNION ALL
		SELECT 'day', '', '', d, coalesce(x.secs, 0)::bigint
			FROM generate_series($3::timestamptz, $4::timestamptz - interval '1 microsecond', interval '24 hours') d
			LEFT JOIN (
				SELECT dd, sum(m.n * floor(extract(epoch FROM least(m.e, dd + interval '24 hours') - greatest(m.s, dd)))) AS secs
				FROM m, generate_series(date_bin('24 hours', m.s, $3), m.e - interval '1 microsecond', interval '24 hours') dd
				GROUP BY dd) x ON x.dd = d
		UNION ALL
		SELECT 'cost', coalesce(min(currency), ''), '', NULL, coalesce(sum(amount_micros), 0)::bigint
			FROM charge_lines WHERE month = $3 AND team = $1
		) r
		-- The orders the separate queries gave: users by usage, then e-mail;
		-- kinds by tier and GPU type; days in order.
		ORDER BY section, CASE WHEN section = 'user' THEN -v END, k, k2, day`, team, prev, month, upTo)
		if err != nil {
			return err
		}
		var section, key, key2 string
		var day *time.Time
		var v int64
		_, err = pgx.ForEachRow(rows, []any{&section, &key, &key2, &day, &v}, func() error {
			switch section {
			case "budget":
				found, u.BudgetGPUHours = true, v
			case "last":
				u.LastMonthGPUSeconds = v
			case "type":
				u.ByJobType[key] = v
				u.UsedGPUSeconds += v
			case "user":
				u.ByUser = append(u.ByUser, UserUsage{User: key, GPUSeconds: v})
			case "kind":
				u.Kinds = append(u.Kinds, KindUsage{Tier: allot.TierID(key), GPUType: key2, GPUSeconds: v})
			case "day":
				u.Daily = append(u.Daily, DayUsage{Day: day.UTC(), GPUSeconds: v})
			case "cost":
				u.Currency, u.CostMicros = key, v
			}
			return nil
		})
		return err
	})
	if err != nil {
		return u, mapErr("loading the team's usage", err)
	}
	if !found {
		return u, mapErr(fmt.Sprintf("loading team %q", team), pgx.ErrNoRows)
	}
	return u, nil
}
