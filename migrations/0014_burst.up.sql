-- Cloud burst: every request for burst nodes and every release is an
-- event (why, how many, provider, outcome); burst_nodes ties the nodes a
-- provider returned to their event and prices their time (rate in force
-- when they were provisioned).

CREATE TABLE burst_events (
    id                   bigserial PRIMARY KEY,
    at                   timestamptz NOT NULL,
    kind                 text NOT NULL CHECK (kind IN ('request', 'release')),
    -- pending: the provider call is due; retrying: an attempt failed and
    -- another follows; done; failed: every attempt failed.
    status               text NOT NULL CHECK (status IN ('pending', 'retrying', 'done', 'failed')),
    provider             text NOT NULL CHECK (provider <> ''),
    reason               text NOT NULL,
    pending_gpu_seconds  bigint NOT NULL CHECK (pending_gpu_seconds >= 0),
    mean_wait_s          bigint NOT NULL CHECK (mean_wait_s >= 0),
    pending_jobs         integer NOT NULL CHECK (pending_jobs >= 0),
    nodes_wanted         integer NOT NULL CHECK (nodes_wanted > 0),
    gpu_type             text NOT NULL,
    gpus_per_node        integer NOT NULL CHECK (gpus_per_node > 0),
    node_names           text[] NOT NULL DEFAULT '{}',
    attempts             integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    error                text NOT NULL DEFAULT '',
    finished_at          timestamptz
);
CREATE INDEX burst_events_at_idx ON burst_events (at DESC, id DESC);
CREATE INDEX burst_events_open_idx ON burst_events (kind) WHERE status IN ('pending', 'retrying');

-- One row per node per request event: a provider that reuses host names
-- (Terraform's burst-0) gets the same nodes row back, with a new row here.
-- A release goes in two steps: release_event_id is set when it starts
-- (the node goes down and its tokens are revoked: it takes no more work),
-- released_at only once the provider confirmed it; the node is billed
-- until then.
CREATE TABLE burst_nodes (
    event_id          bigint NOT NULL REFERENCES burst_events(id),
    node              text NOT NULL REFERENCES nodes(name),
    provider          text NOT NULL,
    gpus              integer NOT NULL CHECK (gpus > 0),
    rate_micros       bigint NOT NULL CHECK (rate_micros >= 0),
    currency          char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    provisioned_at    timestamptz NOT NULL,
    released_at       timestamptz,
    release_event_id  bigint REFERENCES burst_events(id),
    -- never registered within the timeout, or lost (down: spot reclaim,
    -- no heartbeat): released without finishing its work
    failed            boolean NOT NULL DEFAULT false,
    PRIMARY KEY (event_id, node),
    CHECK (released_at IS NULL OR released_at >= provisioned_at),
    CHECK (released_at IS NULL OR release_event_id IS NOT NULL)
);
-- A node is alive (or being released) under one event at a time.
CREATE UNIQUE INDEX burst_nodes_open_idx ON burst_nodes (node) WHERE released_at IS NULL;
CREATE INDEX burst_nodes_alive_idx ON burst_nodes (provisioned_at) WHERE released_at IS NULL;
CREATE INDEX burst_nodes_node_idx ON burst_nodes (node);
CREATE INDEX burst_nodes_release_idx ON burst_nodes (release_event_id) WHERE release_event_id IS NOT NULL;
