package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TeamUsage is a team's use of its monthly budget, up to an instant.
type TeamUsage struct {
	Team           string
	BudgetGPUHours int64
	Month          time.Time // first instant of the month
	UpTo           time.Time
	UsedGPUSeconds int64
	// ByJobType: "production" (tiers 1–2), "experiments" (tiers 3–4),
	// "preemptible" (explicit or demoted), as run.
	ByJobType map[string]int64
	ByUser    []UserUsage
	// Daily is the GPU-seconds used on each day of the month so far.
	Daily []DayUsage
	// CostMicros is the month's billed amount so far (charge lines).
	CostMicros int64
	Currency   string
}

// UserUsage is one user's GPU-seconds.
type UserUsage struct {
	User       string
	GPUSeconds int64
}

// DayUsage is one day's GPU-seconds.
type DayUsage struct {
	Day        time.Time
	GPUSeconds int64
}

// TeamMonthUsageDetail breaks a team's usage in the month containing upTo
// down by job type, user and day (allocations clipped to the month and to
// upTo; running ones count up to upTo).
func (s *Store) TeamMonthUsageDetail(ctx context.Context, team string, upTo time.Time) (TeamUsage, error) {
	u := TeamUsage{Team: team, Month: MonthStart(upTo), UpTo: upTo, ByJobType: map[string]int64{"production": 0, "experiments": 0, "preemptible": 0}}
	err := s.db.QueryRow(ctx, `SELECT monthly_budget_gpu_hours FROM teams WHERE slug = $1`, team).Scan(&u.BudgetGPUHours)
	if err == pgx.ErrNoRows {
		return u, mapErr(fmt.Sprintf("loading team %q", team), err)
	}
	if err != nil {
		return u, mapErr("loading team", err)
	}
	// MATERIALIZED: the daily query below reads a once per day of the
	// month; inlined, the join over the month's allocations ran 30 times.
	const usage = `
		WITH a AS MATERIALIZED (
			SELECT a.job_id, greatest(a.started_at, $2) AS s, least(coalesce(a.released_at, $3), $3) AS e,
				CASE WHEN j.run_as IN ('1', '2') OR (j.run_as = '' AND j.tier IN ('1', '2') AND NOT j.preemptible) THEN 'production'
				     WHEN j.run_as = 'preemptible' OR (j.run_as = '' AND j.preemptible) OR j.tier = 'preemptible' THEN 'preemptible'
				     ELSE 'experiments' END AS kind,
				u.email
			FROM allocations a JOIN jobs j ON j.id = a.job_id JOIN users u ON u.id = j.user_id
			WHERE j.team = $1 AND a.started_at < $3 AND coalesce(a.released_at, 'infinity'::timestamptz) > $2)`
	rows, err := s.db.Query(ctx, usage+`
		SELECT kind, coalesce(sum(floor(extract(epoch FROM e - s))), 0)::bigint FROM a GROUP BY kind`, team, u.Month, upTo)
	if err != nil {
		return u, mapErr("loading usage", err)
	}
	var kind string
	var secs int64
	if _, err := pgx.ForEachRow(rows, []any{&kind, &secs}, func() error {
		u.ByJobType[kind] = secs
		u.UsedGPUSeconds += secs
		return nil
	}); err != nil {
		return u, mapErr("loading usage", err)
	}
	rows, err = s.db.Query(ctx, usage+`
		SELECT email, coalesce(sum(floor(extract(epoch FROM e - s))), 0)::bigint FROM a GROUP BY email ORDER BY 2 DESC, 1`, team, u.Month, upTo)
	if err != nil {
		return u, mapErr("loading usage by user", err)
	}
	if u.ByUser, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (UserUsage, error) {
		var x UserUsage
		return x, r.Scan(&x.User, &x.GPUSeconds)
	}); err != nil {
		return u, mapErr("loading usage by user", err)
	}
	rows, err = s.db.Query(ctx, usage+`
		SELECT d, coalesce((SELECT sum(floor(extract(epoch FROM least(a.e, d + interval '1 day') - greatest(a.s, d))))
			FROM a WHERE a.s < d + interval '1 day' AND a.e > d), 0)::bigint
		FROM generate_series($2::timestamptz, $3::timestamptz - interval '1 microsecond', interval '1 day') d ORDER BY d`, team, u.Month, upTo)
	if err != nil {
		return u, mapErr("loading daily usage", err)
	}
	if u.Daily, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (DayUsage, error) {
		var x DayUsage
		err := r.Scan(&x.Day, &x.GPUSeconds)
		x.Day = x.Day.UTC()
		return x, err
	}); err != nil {
		return u, mapErr("loading daily usage", err)
	}
	err = s.db.QueryRow(ctx, `SELECT coalesce(sum(amount_micros), 0)::bigint, coalesce(min(currency), '') FROM charge_lines WHERE month = $1 AND team = $2`,
		u.Month, team).Scan(&u.CostMicros, &u.Currency)
	return u, mapErr("loading the month's cost", err)
}
