package loadtest

import (
	"context"
	"fmt"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// Names of what the tool seeds; one prefix, so a run against a shared
// database is easy to tell apart (and to clean up).
const (
	agentPrefix   = "lt-agent-"
	nodePrefix    = "lt-node-"
	historyNode   = "lt-history"
	seededPending = "lt-pending-"
	seededRunning = "lt-running-"
	historyJob    = "lt-year-"
	submittedJob  = "lt-submit"
)

// seedAgents adds the simulated agents' nodes (down until they register)
// and one node token each, and returns the tokens.
func (r *runner) seedAgents(ctx context.Context) ([]string, error) {
	if _, err := r.cfg.DB.Exec(ctx, `
		INSERT INTO nodes (name, gpu_type, gpu_count, declared_gpus, site, domain, rack, state)
		SELECT $1 || lpad(i::text, 5, '0'), $2, $3, $3, $4, 'loadtest', 'lt-a' || (i / 32), 'down'
		FROM generate_series(0, $5 - 1) i`, agentPrefix, r.cfg.GPUType, r.cfg.GPUsPerAgent, allot.SiteOnPrem, r.cfg.Agents); err != nil {
		return nil, fmt.Errorf("seeding the agents' nodes: %w", err)
	}
	tokens := make([]string, r.cfg.Agents)
	for i := range tokens {
		var err error
		if tokens[i], err = r.cfg.Store.CreateNodeToken(ctx, agentName(i), "loadtest"); err != nil {
			return nil, fmt.Errorf("making node token %d: %w", i, err)
		}
	}
	return tokens, nil
}

func agentName(i int) string { return fmt.Sprintf("%s%05d", agentPrefix, i) }

// seedNodes adds n nodes of GPUsPerAgent GPUs that no agent serves, each
// fully busy with one running job of tier 3 (a lease, an allocation per
// GPU), the jobs spread over the teams: the rest of a large, full cluster. They stay up through the run
// because they never registered (the lost-node sweep only counts nodes
// that did), and the scheduler sees their GPUs held, so pending work
// stays pending instead of being offered to nodes nobody serves.
func (r *runner) seedNodes(ctx context.Context, n int) error {
	g, now := r.cfg.GPUsPerAgent, r.cfg.Store.Now()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO nodes (name, gpu_type, gpu_count, declared_gpus, site, domain, rack, state)
			SELECT $1 || lpad(i::text, 5, '0'), $2, $3, $3, $4, 'lt-' || (i / 512), 'lt-r' || (i / 32), 'up'
			FROM generate_series(0, $5 - 1) i`, []any{nodePrefix, r.cfg.GPUType, g, allot.SiteOnPrem, n}},
		{`INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, state, submitted_at, started_at, segment, run_as)
			SELECT $1 || lpad(i::text, 5, '0'), ($2::text[])[i % cardinality($2::text[]) + 1], $3, '3', $4, $5, 7 * 86400, '{sleep,infinity}', 'running',
				$7::timestamptz - interval '2 hours', $7::timestamptz - interval '1 hour', 1, '3'
			FROM generate_series(0, $6 - 1) i`, []any{seededRunning, r.cfg.Teams, r.userID, g, r.cfg.GPUType, n, now}},
		{`INSERT INTO leases (job_id, segment, node, rank, gpu_indices, env, state, offered_at, taken_at, started_at, pid)
			SELECT j.id, 1, $1 || substr(j.name, length($2) + 1), 0, (SELECT array_agg(g) FROM generate_series(0, $3 - 1) g), '{}',
				'running', j.started_at, j.started_at, j.started_at, 1
			FROM jobs j WHERE j.name LIKE $2 || '%' AND j.state = 'running'`, []any{nodePrefix, seededRunning, g}},
		{`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at)
			SELECT j.id, 1, $1 || substr(j.name, length($2) + 1), g, j.started_at
			FROM jobs j CROSS JOIN generate_series(0, $3 - 1) g WHERE j.name LIKE $2 || '%' AND j.state = 'running'`, []any{nodePrefix, seededRunning, g}},
	} {
		if _, err := r.cfg.DB.Exec(ctx, q.sql, q.args...); err != nil {
			return fmt.Errorf("seeding %d busy nodes: %w", n, err)
		}
	}
	return nil
}

// seedPending queues n pending jobs of every shape the scheduler sees:
// tiers 3 and 4, 1–8 GPUs, a GPU type or any, 1–12 h limits, spread over
// the teams, submitted over the last n minutes.
func (r *runner) seedPending(ctx context.Context, n int) error {
	_, err := r.cfg.DB.Exec(ctx, `
		INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, submitted_at, pending_reason)
		SELECT $1 || i, ($2::text[])[i % cardinality($2::text[]) + 1], $3, (ARRAY['3','4'])[i % 2 + 1], 1 + i % $5,
			CASE WHEN i % 5 = 0 THEN NULL ELSE $4 END, 3600 * (1 + i % 12), '{sleep,3600}', $7::timestamptz - i * interval '1 second',
			'waiting for the next scheduling cycle'
		FROM generate_series(1, $6) i`, seededPending, r.cfg.Teams, r.userID, r.cfg.GPUType, min(8, r.cfg.GPUsPerAgent), n, r.cfg.Store.Now())
	if err != nil {
		return fmt.Errorf("seeding %d pending jobs: %w", n, err)
	}
	return nil
}

// seedHistory gives the first team a year of finished work on a node of
// its own (down, so nothing is scheduled there): HistoryJobs 8-GPU jobs
// (8 allocation rows each) and their hourly usage rows, the shape
// BenchmarkDashboardPagesYear uses (50,000 jobs = 400k allocation rows).
func (r *runner) seedHistory(ctx context.Context, n int) error {
	team := r.cfg.Teams[0]
	// Spread n jobs over 365 days.
	step := time.Duration(365*24*float64(time.Hour)/float64(n)) / time.Second
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO nodes (name, gpu_type, gpu_count, declared_gpus, site, domain, rack, state) VALUES ($1, $2, 8, 8, $3, 'lt-history', 'lt-h', 'down')`,
			[]any{historyNode, r.cfg.GPUType, allot.SiteOnPrem}},
		{`INSERT INTO jobs (name, team, user_id, tier, gpus, gpu_type, time_limit_s, command, state, submitted_at, started_at, ended_at, segment, run_as, exit_code)
			SELECT $1 || i, $2, $3, (ARRAY['2','3','4','3'])[i % 4 + 1], 8, $4, 36000, '{true}', 'completed',
				$7::timestamptz - interval '365 days' + i * $5 * interval '1 second' - (i % 7) * interval '3 minutes',
				$7::timestamptz - interval '365 days' + i * $5 * interval '1 second',
				$7::timestamptz - interval '365 days' + i * $5 * interval '1 second' + interval '9 minutes', 1, (ARRAY['2','3','4','3'])[i % 4 + 1], 0
			FROM generate_series(0, $6 - 1) i`, []any{historyJob, team, r.userID, r.cfg.GPUType, int64(step), n, r.cfg.Store.Now()}},
		{`INSERT INTO allocations (job_id, segment, node, gpu_index, started_at, released_at)
			SELECT j.id, 1, $1, g, j.started_at, j.ended_at FROM jobs j CROSS JOIN generate_series(0, 7) g WHERE j.name LIKE $2 || '%'`,
			[]any{historyNode, historyJob}},
		{`INSERT INTO job_usage_hours (job_id, segment, hour, gpu_type, gpus, gpu_seconds, samples, mean_util_pct, mean_mem_used_mib, peak_mem_used_mib, mem_total_mib)
			SELECT id, 1, date_bin('1 hour', started_at, 'epoch'), $1, 8, 4320, 432, 20 + id % 70, 30000, 40000, 81920
			FROM jobs WHERE name LIKE $2 || '%' ON CONFLICT DO NOTHING`, []any{r.cfg.GPUType, historyJob}},
	} {
		if _, err := r.cfg.DB.Exec(ctx, q.sql, q.args...); err != nil {
			return fmt.Errorf("seeding a year of history: %w", err)
		}
	}
	return nil
}
