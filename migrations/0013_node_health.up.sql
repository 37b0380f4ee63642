-- Node health: per-node per-rule "since" state, health events with the
-- metric history that triggered them, admin notifications, and the
-- cluster's admin webhook.

ALTER TABLE nodes
    ADD COLUMN drain_source     text NOT NULL DEFAULT '' CHECK (drain_source IN ('', 'admin', 'health')),
    ADD COLUMN drain_reason     text NOT NULL DEFAULT '',
    ADD COLUMN drained_at       timestamptz,
    ADD COLUMN health_ok_since  timestamptz,   -- passing its drain rules since (null: failing or never checked)
    ADD COLUMN health_output    text NOT NULL DEFAULT '',  -- the last failed --health-cmd output ("" when passing)
    -- GPUs the node had that its agent did not report when it registered
    -- again ([{"index", "uuid"}] of the inventory before): missing until back.
    ADD COLUMN lost_gpus        jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(lost_gpus) = 'array');

-- A rule whose condition holds on a node, and since when (kept between
-- heartbeats so "for 10 minutes" survives restarts and load-balanced
-- servers).
CREATE TABLE node_health_state (
    node   text NOT NULL REFERENCES nodes(name) ON DELETE CASCADE,
    rule   text NOT NULL,
    since  timestamptz NOT NULL,
    PRIMARY KEY (node, rule)
);

-- A rule that fired on a node. Open (resolved_at null) while its condition
-- holds; a rule with an open event does not fire again, except a counter
-- (ecc_dbe) whose value changed or that another GPU meets: that new event
-- resolves the old one.
CREATE TABLE health_events (
    id            bigserial PRIMARY KEY,
    node          text NOT NULL REFERENCES nodes(name) ON DELETE CASCADE,
    at            timestamptz NOT NULL,
    since         timestamptz NOT NULL,           -- when the condition started to hold
    rule          jsonb NOT NULL,                 -- the rule as it was
    rule_name     text NOT NULL,
    metric        text NOT NULL,
    value         double precision NOT NULL,
    gpus          integer[] NOT NULL DEFAULT '{}',
    gpu_values    double precision[] NOT NULL DEFAULT '{}', -- the metric on each of gpus (a counter fires again when it changes)
    detail        text NOT NULL,
    severity      text NOT NULL,
    action        text NOT NULL CHECK (action IN ('warn', 'drain', 'drain-and-requeue')),
    node_state    text NOT NULL,                  -- the node's state after the action
    requeued      bigint[] NOT NULL DEFAULT '{}', -- jobs asked to stop and requeue
    resolved_at   timestamptz,
    acknowledged_by text NOT NULL DEFAULT '',
    acknowledged_at timestamptz
);
CREATE INDEX health_events_node_idx ON health_events (node, at DESC);
CREATE UNIQUE INDEX health_events_open_idx ON health_events (node, rule_name) WHERE resolved_at IS NULL;

-- The GPU readings around an event, copied when it fires (gpu_samples are
-- pruned by retention; the evidence stays).
CREATE TABLE health_event_samples (
    event_id          bigint NOT NULL REFERENCES health_events(id) ON DELETE CASCADE,
    gpu_index         integer NOT NULL,
    at                timestamptz NOT NULL,
    util_pct          real NOT NULL,
    temp_c            real NOT NULL,
    power_w           real NOT NULL,
    ecc_dbe_vol       bigint NOT NULL,
    throttle_reasons  bigint NOT NULL,
    xid_errors        bigint NOT NULL
);
CREATE INDEX health_event_samples_idx ON health_event_samples (event_id, gpu_index, at);

-- Portal notifications for admins; webhook_sent_at marks the admin-webhook
-- delivery as enqueued.
CREATE TABLE notifications (
    id               bigserial PRIMARY KEY,
    at               timestamptz NOT NULL,
    kind             text NOT NULL,              -- e.g. health.drain, health.warn, node.undrain
    severity         text NOT NULL DEFAULT 'info',
    subject          text NOT NULL DEFAULT '',   -- e.g. node:gpu01
    link             text NOT NULL DEFAULT '',
    message          text NOT NULL,
    webhook_sent_at  timestamptz,
    read_at          timestamptz,
    read_by          text NOT NULL DEFAULT ''
);
CREATE INDEX notifications_at_idx ON notifications (at DESC);
CREATE INDEX notifications_unsent_idx ON notifications (id) WHERE webhook_sent_at IS NULL;

-- Cluster-level settings (one row).
CREATE TABLE cluster_settings (
    id                 boolean PRIMARY KEY DEFAULT true CHECK (id),
    admin_webhook_url  text NOT NULL DEFAULT '' CHECK (admin_webhook_url = '' OR admin_webhook_url ~ '^https?://')
);
INSERT INTO cluster_settings DEFAULT VALUES;

-- Deliveries to the admin webhook have no team.
ALTER TABLE webhook_deliveries ALTER COLUMN team DROP NOT NULL;
