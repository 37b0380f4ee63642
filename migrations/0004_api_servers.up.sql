-- API server replicas announce themselves, so that nodes are not declared
-- lost for heartbeats that could not arrive because no server was up.
CREATE TABLE api_servers (
    id          text PRIMARY KEY,
    started_at  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL
);

-- Per-job process statistics from the agents' heartbeats.
ALTER TABLE leases
    ADD COLUMN cpu_seconds double precision NOT NULL DEFAULT 0,
    ADD COLUMN rss_bytes   bigint NOT NULL DEFAULT 0;
