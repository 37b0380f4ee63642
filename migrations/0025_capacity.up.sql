-- Idle and unallocated capacity (issue 17): what the cluster's GPUs did
-- over time, so finance can reconcile the bill with what the cluster costs.
--
-- node_state_history: one row per change of what a node contributes to
-- capacity (its state, GPU type, GPU count, site, and whether it counts as
-- registered). A row holds from its instant until the node's next row
-- (by at, then id). Rows are written by triggers on nodes and burst_nodes,
-- so every code path that changes a node is recorded; instants are whole
-- seconds on Allot's clock (allot_now(): the database's clock shifted by
-- the offset the API server's connections set, allot.clock_offset_us, so a
-- demo or test at a chosen instant records that instant). The history has
-- no foreign key: it outlives a node row.
--
-- A node counts as registered capacity from its agent's first registration
-- (or, for a node created up without an agent, from its creation) until a
-- burst release starts: a lost (down) or drained node is still registered
-- capacity, only not usable; a node declared but never registered is not.
CREATE TABLE node_state_history (
    id          bigserial PRIMARY KEY,
    node        text NOT NULL,
    at          timestamptz NOT NULL CHECK (at = date_trunc('second', at)),
    state       text NOT NULL,
    gpu_type    text NOT NULL,
    gpus        integer NOT NULL CHECK (gpus >= 0),
    site        text NOT NULL,
    registered  boolean NOT NULL
);
CREATE INDEX node_state_history_node_idx ON node_state_history (node, at, id);
CREATE INDEX node_state_history_at_idx ON node_state_history (at);

-- Allot's clock in the database, floored to the second.
CREATE FUNCTION allot_now() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT date_trunc('second', statement_timestamp()
        + coalesce(nullif(current_setting('allot.clock_offset_us', true), ''), '0')::bigint * interval '1 microsecond')
$$;

-- Whether node n counts as registered capacity (see above).
CREATE FUNCTION node_counts_registered(n nodes) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT (n.registered_at IS NOT NULL OR n.state <> 'down')
        AND NOT coalesce((SELECT b.release_event_id IS NOT NULL FROM burst_nodes b WHERE b.node = n.name
                          ORDER BY b.provisioned_at DESC, b.event_id DESC LIMIT 1), false)
$$;

CREATE FUNCTION node_state_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO node_state_history (node, at, state, gpu_type, gpus, site, registered)
    VALUES (NEW.name, allot_now(), NEW.state, NEW.gpu_type, NEW.gpu_count, NEW.site, node_counts_registered(NEW));
    RETURN NULL;
END $$;
CREATE TRIGGER node_state_insert AFTER INSERT ON nodes
    FOR EACH ROW EXECUTE FUNCTION node_state_note();
CREATE TRIGGER node_state_update AFTER UPDATE OF state, gpu_type, gpu_count, site, registered_at ON nodes
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.gpu_type IS DISTINCT FROM NEW.gpu_type
        OR OLD.gpu_count IS DISTINCT FROM NEW.gpu_count OR OLD.site IS DISTINCT FROM NEW.site
        OR (OLD.registered_at IS NULL) <> (NEW.registered_at IS NULL))
    EXECUTE FUNCTION node_state_note();

-- A burst node whose release starts leaves capacity then (it takes no more
-- work; its cloud cost is on the burst page until the provider confirms).
CREATE FUNCTION burst_release_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO node_state_history (node, at, state, gpu_type, gpus, site, registered)
    SELECT n.name, allot_now(), n.state, n.gpu_type, n.gpu_count, n.site, false FROM nodes n WHERE n.name = NEW.node;
    RETURN NULL;
END $$;
CREATE TRIGGER burst_release_history AFTER UPDATE OF release_event_id ON burst_nodes
    FOR EACH ROW WHEN (OLD.release_event_id IS NULL AND NEW.release_event_id IS NOT NULL)
    EXECUTE FUNCTION burst_release_note();

-- Nodes that exist already: their present state since they were created
-- (the best the database knew before this history).
INSERT INTO node_state_history (node, at, state, gpu_type, gpus, site, registered)
SELECT n.name, date_trunc('second', n.created_at), n.state, n.gpu_type, n.gpu_count, n.site, node_counts_registered(n)
FROM nodes n ORDER BY n.name;

-- What one GPU-hour of a GPU type's owned (on-premises) capacity costs,
-- in micro-units of the rate card's currency; NULL: not set (no
-- unrecovered cost for the type). Set by admins (gpu_type.update, audited).
ALTER TABLE gpu_types ADD COLUMN capacity_cost_micros bigint CHECK (capacity_cost_micros BETWEEN 0 AND 1000000000000);
