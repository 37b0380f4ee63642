-- The server trusts no agent clock it can check (issue 12).
--
-- leases.seen_at: when the server last saw the lease alive, on its own
-- clock: a heartbeat or a registration that listed it, its start report.
-- An exit report's time is bounded to [max(started_at, seen_at), receive
-- time], so a forged old exit time cannot erase usage the server saw.
--
-- leases.orphaned_at: when the node's agent first reported running a lease
-- that had already ended on the server (ended by a lost node, an
-- unconfirmed stop, a cancel): the agent is told to kill it, and its GPUs
-- stay allocated to it (an allocation with released_at NULL) until the
-- agent confirms: its exit report, or a heartbeat or registration that no
-- longer lists it. Kept afterwards as a record.
ALTER TABLE leases
    ADD COLUMN seen_at     timestamptz,
    ADD COLUMN orphaned_at timestamptz;

-- Open allocations by lease, for the orphan checks of every heartbeat.
CREATE INDEX allocations_open_lease_idx ON allocations (node, job_id, segment) WHERE released_at IS NULL;

-- nodes.metrics_error: why the agent could not read its GPUs (the driver
-- did not answer), "" when it can; metrics_error_since: since when. A
-- heartbeat without GPU metrics is not read as GPUs missing from the node.
ALTER TABLE nodes
    ADD COLUMN metrics_error       text NOT NULL DEFAULT '',
    ADD COLUMN metrics_error_since timestamptz;
