-- The team page (and budget API) sums a team's allocations over this month
-- and last: with a year of history that was 0.5 s at mid-month. These
-- indexes let it read only indexes: the period's allocations with the
-- columns it needs (the same keys as allocations_release_idx, which this
-- one replaces), and a team's jobs with the columns that classify them.
CREATE INDEX allocations_release_cover_idx ON allocations ((coalesce(released_at, 'infinity'::timestamptz)), started_at)
    INCLUDE (job_id, node, released_at);
DROP INDEX allocations_release_idx;
CREATE INDEX jobs_team_usage_idx ON jobs (team, id) INCLUDE (user_id, tier, run_as, preemptible);

-- Every committed change to allocations moves this sequence on (at commit:
-- a deferred trigger), so a server can keep a team's month usage between
-- submissions and know, with one cheap read, whether any allocation changed
-- since (store.submitContext): a busy cluster's usage sum took tens of
-- milliseconds per submission.
CREATE SEQUENCE allocations_epoch;
CREATE FUNCTION allocations_epoch_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('allocations_epoch');
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER allocations_epoch_bump AFTER INSERT OR UPDATE OR DELETE ON allocations
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION allocations_epoch_bump();

-- The same for what a submission reads of the nodes (the largest gang per
-- GPU type: a window over every node, 10 ms at 10,000 nodes): moved on by
-- a node added or removed or its GPUs or domain changed, not by heartbeats.
CREATE SEQUENCE nodes_epoch;
CREATE FUNCTION nodes_epoch_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('nodes_epoch');
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER nodes_epoch_bump AFTER INSERT OR DELETE OR UPDATE OF gpu_type, gpu_count, domain ON nodes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION nodes_epoch_bump();
