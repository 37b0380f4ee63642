-- The team page (and budget API) sums a team's allocations over this month
-- and last: with a year of history that was 0.5 s at mid-month. These
-- indexes let it read only indexes: the period's allocations with the
-- columns it needs (the same keys as allocations_release_idx, which this
-- one replaces), and a team's jobs with the columns that classify them.
CREATE INDEX allocations_release_cover_idx ON allocations ((coalesce(released_at, 'infinity'::timestamptz)), started_at)
    INCLUDE (job_id, node, released_at);
DROP INDEX allocations_release_idx;
CREATE INDEX jobs_team_usage_idx ON jobs (team, id) INCLUDE (user_id, tier, run_as, preemptible);
