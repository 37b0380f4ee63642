-- Budget alerts: once per team, month and threshold; an optional per-team
-- Slack-compatible webhook, with a delivery log.
ALTER TABLE teams ADD COLUMN webhook_url text NOT NULL DEFAULT ''
    CHECK (webhook_url = '' OR webhook_url ~ '^https?://');

CREATE TABLE budget_alerts (
    team               text NOT NULL REFERENCES teams(slug) ON DELETE CASCADE,
    month              date NOT NULL CHECK (extract(day FROM month) = 1),
    threshold_pct      integer NOT NULL CHECK (threshold_pct > 0),
    fired_at           timestamptz NOT NULL,
    used_gpu_seconds   bigint NOT NULL,
    budget_gpu_hours   bigint NOT NULL,
    message            text NOT NULL,
    PRIMARY KEY (team, month, threshold_pct)
);

CREATE TABLE webhook_deliveries (
    id           bigserial PRIMARY KEY,
    team         text NOT NULL REFERENCES teams(slug) ON DELETE CASCADE,
    url          text NOT NULL,
    attempt      integer NOT NULL,
    status_code  integer,
    error        text NOT NULL DEFAULT '',
    at           timestamptz NOT NULL
);
CREATE INDEX webhook_deliveries_team_idx ON webhook_deliveries (team, at DESC);
