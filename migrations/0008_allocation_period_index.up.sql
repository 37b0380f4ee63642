-- Usage queries ask "which allocations overlap [from, to)": released after
-- from (or still held) and started before to. This index answers the first
-- half, so a month's usage does not scan a year of history.
CREATE INDEX allocations_release_idx ON allocations ((coalesce(released_at, 'infinity'::timestamptz)), started_at);
