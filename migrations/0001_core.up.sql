-- Allot core schema: teams, users, GPU types and rates, tiers, nodes, jobs,
-- allocations, versioned policy, API tokens and portal sessions.

CREATE TABLE gpu_types (
    name        text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$'),
    memory_gb   integer NOT NULL CHECK (memory_gb > 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Rates are versioned: a charge uses the rate in force when usage happened.
CREATE TABLE gpu_rates (
    id              bigserial PRIMARY KEY,
    gpu_type        text NOT NULL REFERENCES gpu_types(name),
    rate_micros     bigint NOT NULL CHECK (rate_micros >= 0),
    currency        char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    effective_from  timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (gpu_type, effective_from)
);

CREATE TABLE tiers (
    id             text PRIMARY KEY CHECK (id IN ('1', '2', '3', '4', 'preemptible')),
    name           text NOT NULL CHECK (name <> ''),
    description    text NOT NULL DEFAULT '',
    class_order    integer NOT NULL UNIQUE CHECK (class_order >= 1),
    may_preempt    text[] NOT NULL DEFAULT '{}' CHECK (may_preempt <@ ARRAY['3', '4', 'preemptible']::text[]),
    reserved_gpus  integer NOT NULL DEFAULT 0 CHECK (reserved_gpus >= 0),
    multiplier_bp  integer NOT NULL CHECK (multiplier_bp BETWEEN 0 AND 100000),
    max_runtime_s  bigint NOT NULL CHECK (max_runtime_s > 0)
);

CREATE TABLE teams (
    slug                      text PRIMARY KEY CHECK (slug ~ '^[a-z][a-z0-9-]{0,30}[a-z0-9]$'),
    name                      text NOT NULL CHECK (name <> ''),
    cost_center               text NOT NULL CHECK (cost_center <> ''),
    monthly_budget_gpu_hours  bigint NOT NULL DEFAULT 0 CHECK (monthly_budget_gpu_hours >= 0),
    fair_share_weight         integer NOT NULL DEFAULT 1 CHECK (fair_share_weight >= 1),
    created_at                timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE team_guarantees (
    team      text NOT NULL REFERENCES teams(slug) ON DELETE CASCADE,
    gpu_type  text NOT NULL REFERENCES gpu_types(name),
    gpus      integer NOT NULL CHECK (gpus >= 0),
    PRIMARY KEY (team, gpu_type)
);

CREATE TABLE users (
    id            bigserial PRIMARY KEY,
    oidc_subject  text NOT NULL UNIQUE CHECK (oidc_subject <> ''),
    email         text NOT NULL UNIQUE CHECK (email LIKE '_%@_%'),
    name          text NOT NULL CHECK (name <> ''),
    is_admin      boolean NOT NULL DEFAULT false,
    is_finance    boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE memberships (
    user_id  bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    team     text NOT NULL REFERENCES teams(slug) ON DELETE CASCADE,
    role     text NOT NULL CHECK (role IN ('member', 'lead')),
    PRIMARY KEY (user_id, team)
);

-- API tokens are stored as SHA-256 hashes; the prefix helps people tell them apart.
CREATE TABLE api_tokens (
    id            bigserial PRIMARY KEY,
    user_id       bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name          text NOT NULL CHECK (name <> ''),
    prefix        text NOT NULL,
    token_hash    bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz
);

CREATE TABLE sessions (
    id_hash     bytea PRIMARY KEY CHECK (length(id_hash) = 32),
    user_id     bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

CREATE TABLE nodes (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z0-9]([a-z0-9.-]{0,62}[a-z0-9])?$'),
    gpu_type        text NOT NULL REFERENCES gpu_types(name),
    gpu_count       integer NOT NULL CHECK (gpu_count BETWEEN 1 AND 64),
    site            text NOT NULL CHECK (site IN ('onprem', 'cloud')),
    domain          text NOT NULL DEFAULT '',
    rack            text NOT NULL DEFAULT '',
    state           text NOT NULL DEFAULT 'up' CHECK (state IN ('up', 'draining', 'drained', 'down')),
    last_heartbeat  timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE jobs (
    id                  bigserial PRIMARY KEY,
    name                text NOT NULL,
    team                text NOT NULL REFERENCES teams(slug),
    user_id             bigint NOT NULL REFERENCES users(id),
    tier                text NOT NULL REFERENCES tiers(id),
    gpus                integer NOT NULL CHECK (gpus > 0),
    gpu_type            text REFERENCES gpu_types(name),
    gpus_per_node       integer CHECK (gpus_per_node > 0 AND gpus % gpus_per_node = 0),
    time_limit_s        bigint NOT NULL CHECK (time_limit_s > 0),
    command             text[] NOT NULL CHECK (cardinality(command) > 0 AND command[1] <> ''),
    env                 jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(env) = 'object'),
    workdir             text NOT NULL DEFAULT '',
    checkpointable      boolean NOT NULL DEFAULT false,
    preemptible         boolean NOT NULL DEFAULT false,
    demoted             boolean NOT NULL DEFAULT false,
    state               text NOT NULL DEFAULT 'pending'
                        CHECK (state IN ('pending', 'running', 'completed', 'failed', 'cancelled', 'preempted', 'lost')),
    submitted_at        timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    ended_at            timestamptz,
    exit_code           integer,
    priority            double precision NOT NULL DEFAULT 0,
    priority_breakdown  jsonb NOT NULL DEFAULT '{}',
    pending_reason      text NOT NULL DEFAULT '',
    quota_warning       text NOT NULL DEFAULT '',
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK (ended_at IS NULL OR state IN ('completed', 'failed', 'cancelled')),
    CHECK (started_at IS NULL OR started_at >= submitted_at),
    CHECK (ended_at IS NULL OR ended_at >= submitted_at)
);
CREATE INDEX jobs_state_idx ON jobs (state, submitted_at, id);
CREATE INDEX jobs_team_idx ON jobs (team, submitted_at DESC);

-- One row per GPU held by a job in one run segment. A GPU is active while
-- released_at is NULL; the unique partial index makes the database refuse a
-- GPU in two active allocations, whatever the code does.
CREATE TABLE allocations (
    id           bigserial PRIMARY KEY,
    job_id       bigint NOT NULL REFERENCES jobs(id),
    segment      integer NOT NULL DEFAULT 1 CHECK (segment >= 1),
    node         text NOT NULL REFERENCES nodes(name),
    gpu_index    integer NOT NULL CHECK (gpu_index >= 0 AND gpu_index < 64),
    started_at   timestamptz NOT NULL,
    released_at  timestamptz,
    CHECK (released_at IS NULL OR released_at >= started_at)
);
CREATE UNIQUE INDEX allocations_one_active_per_gpu ON allocations (node, gpu_index) WHERE released_at IS NULL;
CREATE INDEX allocations_job_idx ON allocations (job_id);
CREATE INDEX allocations_period_idx ON allocations (started_at, released_at);

-- Versioned policy: every change inserts a row; the newest is in force.
CREATE TABLE policy_versions (
    version                   bigserial PRIMARY KEY,
    created_at                timestamptz NOT NULL DEFAULT now(),
    created_by                text NOT NULL,
    comment                   text NOT NULL DEFAULT '',
    weight_fair_share         integer NOT NULL CHECK (weight_fair_share BETWEEN 0 AND 1000000),
    weight_size               integer NOT NULL CHECK (weight_size BETWEEN 0 AND 1000000),
    weight_age                integer NOT NULL CHECK (weight_age BETWEEN 0 AND 1000000),
    max_age_s                 bigint NOT NULL CHECK (max_age_s > 0),
    half_life_s               bigint NOT NULL CHECK (half_life_s > 0),
    grace_period_s            bigint NOT NULL CHECK (grace_period_s >= 0),
    min_runtime_s             bigint NOT NULL CHECK (min_runtime_s >= 0),
    cycle_s                   bigint NOT NULL CHECK (cycle_s > 0),
    budget_warn_pct           integer NOT NULL CHECK (budget_warn_pct > 0),
    budget_demote_pct         integer NOT NULL CHECK (budget_demote_pct >= budget_warn_pct),
    burst_pending_gpu_hours   integer NOT NULL CHECK (burst_pending_gpu_hours >= 0),
    burst_mean_wait_s         bigint NOT NULL CHECK (burst_mean_wait_s > 0),
    burst_release_gpu_hours   integer NOT NULL CHECK (burst_release_gpu_hours >= 0 AND burst_release_gpu_hours < burst_pending_gpu_hours),
    heartbeat_missed_after_s  bigint NOT NULL CHECK (heartbeat_missed_after_s > 0)
);
