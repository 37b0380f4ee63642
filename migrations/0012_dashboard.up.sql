-- The cluster dashboard's wait times read the jobs first started in the
-- last days; without this index that is a scan of a year of jobs.
CREATE INDEX jobs_started_idx ON jobs (started_at) WHERE started_at IS NOT NULL;
