-- Admin policy editing: every change makes a new policy version and an
-- audit-log entry (who, when, before → after). Health rules and burst
-- limits are part of the policy; nodes carry admin labels.

ALTER TABLE policy_versions
    ADD COLUMN health_rules          jsonb   NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(health_rules) = 'array'),
    ADD COLUMN burst_max_nodes       integer NOT NULL DEFAULT 4 CHECK (burst_max_nodes >= 0),
    ADD COLUMN burst_monthly_budget_micros bigint NOT NULL DEFAULT 0 CHECK (burst_monthly_budget_micros >= 0),
    ADD COLUMN auto_undrain_after_s  bigint  NOT NULL DEFAULT 0 CHECK (auto_undrain_after_s >= 0);

-- Policies stored before health rules existed get the default rules
-- (json.Marshal(allot.DefaultHealthRules()); "for" is in nanoseconds), so
-- an upgraded cluster drains faulty nodes like a new one. A store test
-- keeps this literal equal to the Go defaults.
UPDATE policy_versions SET health_rules = '[{"name":"ecc-double-bit","metric":"ecc_dbe","match":null,"over":0,"for":0,"severity":"critical","action":"drain"},{"name":"xid-fatal","metric":"xid","match":[48,79,94,95],"over":0,"for":0,"severity":"critical","action":"drain"},{"name":"throttle-warn","metric":"throttle","match":null,"over":0,"for":600000000000,"severity":"warning","action":"warn"},{"name":"throttle-drain","metric":"throttle","match":null,"over":0,"for":3600000000000,"severity":"critical","action":"drain"},{"name":"gpu-missing","metric":"gpu_missing","match":null,"over":0,"for":0,"severity":"critical","action":"drain"},{"name":"health-check","metric":"health_check","match":null,"over":0,"for":0,"severity":"critical","action":"drain"}]';

CREATE TABLE audit_log (
    id              bigserial PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text NOT NULL CHECK (actor <> ''),      -- user email, or "system"
    action          text NOT NULL CHECK (action ~ '^[a-z_]+\.[a-z_]+$'), -- e.g. tier.update, node.drain
    object          text NOT NULL DEFAULT '',               -- e.g. tier:3, node:gpu01
    policy_version  bigint REFERENCES policy_versions(version),
    before          jsonb,
    after           jsonb,
    note            text NOT NULL DEFAULT ''
);
CREATE INDEX audit_log_at_idx ON audit_log (at DESC, id DESC);
CREATE INDEX audit_log_object_idx ON audit_log (object, at DESC);

ALTER TABLE nodes ADD COLUMN labels jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object');
