package store

import (
	"context"
	"strconv"
	"time"
)

// RunTimeRatios is how long recently completed jobs ran against their time
// limits: the median of run time / time limit over each user's, and each
// team's, last Last completed jobs (at least Least of them), submitted
// since a given instant. Users' limits are 2–5× their run times, so the
// scheduler's start forecast projects running and queued jobs by these
// ratios (scheduler.Job.Expected) rather than by their limits. Only jobs
// that completed in their first run segment count (a requeued job's
// started_at..ended_at holds its waits), and a ratio is at most 1.
type RunTimeRatios struct {
	ByUser map[int64]float64
	ByTeam map[string]float64
}

// RunTimeRatios computes the ratios over jobs submitted since since.
func (s *Store) RunTimeRatios(ctx context.Context, since time.Time, last, least int) (RunTimeRatios, error) {
	out := RunTimeRatios{ByUser: map[int64]float64{}, ByTeam: map[string]float64{}}
	rows, err := s.db.Query(ctx, `
		WITH done AS (
			SELECT user_id, team, least(extract(epoch FROM ended_at - started_at) / time_limit_s, 1)::float8 AS r,
				row_number() OVER (PARTITION BY user_id ORDER BY ended_at DESC, id DESC) AS nu,
				row_number() OVER (PARTITION BY team ORDER BY ended_at DESC, id DESC) AS nt
			FROM jobs
			WHERE state = 'completed' AND submitted_at >= $1 AND segment = 1 AND time_limit_s > 0
				AND started_at IS NOT NULL AND ended_at > started_at)
		SELECT true, user_id::text, percentile_cont(0.5) WITHIN GROUP (ORDER BY r) FROM done WHERE nu <= $2 GROUP BY user_id HAVING count(*) >= $3
		UNION ALL
		SELECT false, team, percentile_cont(0.5) WITHIN GROUP (ORDER BY r) FROM done WHERE nt <= $2 GROUP BY team HAVING count(*) >= $3`,
		since, last, least)
	if err != nil {
		return out, mapErr("learning run times", err)
	}
	defer rows.Close()
	for rows.Next() {
		var user bool
		var key string
		var r float64
		if err := rows.Scan(&user, &key, &r); err != nil {
			return out, mapErr("learning run times", err)
		}
		if !user {
			out.ByTeam[key] = r
			continue
		}
		id, err := strconv.ParseInt(key, 10, 64)
		if err != nil {
			return out, err
		}
		out.ByUser[id] = r
	}
	return out, mapErr("learning run times", rows.Err())
}
