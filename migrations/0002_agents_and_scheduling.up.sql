-- Node agents, leases and the live scheduling loop.

-- Node tokens authenticate agents; stored as SHA-256 hashes. A token is
-- bound to one node name.
CREATE TABLE node_tokens (
    id          bigserial PRIMARY KEY,
    node        text NOT NULL CHECK (node ~ '^[a-z0-9]([a-z0-9.-]{0,62}[a-z0-9])?$'),
    prefix      text NOT NULL,
    token_hash  bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_by  text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- What the agent reported at registration.
ALTER TABLE nodes
    ADD COLUMN hostname        text NOT NULL DEFAULT '',
    ADD COLUMN agent_version   text NOT NULL DEFAULT '',
    ADD COLUMN gpu_backend     text NOT NULL DEFAULT '',
    ADD COLUMN driver_version  text NOT NULL DEFAULT '',
    ADD COLUMN registered_at   timestamptz,
    ADD COLUMN state_reason    text NOT NULL DEFAULT '';

CREATE TABLE node_gpus (
    node          text NOT NULL REFERENCES nodes(name) ON DELETE CASCADE,
    gpu_index     integer NOT NULL CHECK (gpu_index >= 0 AND gpu_index < 64),
    uuid          text NOT NULL,
    model         text NOT NULL,
    memory_mib    bigint NOT NULL CHECK (memory_mib >= 0),
    nvlink_peers  integer[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (node, gpu_index)
);

-- Latest reading per GPU (raw samples go to gpu_samples).
CREATE TABLE gpu_samples (
    node              text NOT NULL REFERENCES nodes(name) ON DELETE CASCADE,
    gpu_index         integer NOT NULL,
    at                timestamptz NOT NULL,
    job_id            bigint,
    util_pct          real NOT NULL,
    mem_used_mib      bigint NOT NULL,
    mem_total_mib     bigint NOT NULL,
    temp_c            real NOT NULL,
    power_w           real NOT NULL,
    ecc_sbe_vol       bigint NOT NULL,
    ecc_dbe_vol       bigint NOT NULL,
    throttle_reasons  bigint NOT NULL,
    xid_errors        bigint NOT NULL
);
CREATE INDEX gpu_samples_node_at_idx ON gpu_samples (node, at);
CREATE INDEX gpu_samples_job_idx ON gpu_samples (job_id, at) WHERE job_id IS NOT NULL;

-- A job's current run segment (1, then +1 after every requeue), and why it
-- ended if it did.
ALTER TABLE jobs
    ADD COLUMN segment        integer NOT NULL DEFAULT 0 CHECK (segment >= 0),
    ADD COLUMN end_reason     text NOT NULL DEFAULT '',
    ADD COLUMN preemptions    integer NOT NULL DEFAULT 0 CHECK (preemptions >= 0),
    ADD COLUMN checkpoint_dir text NOT NULL DEFAULT '',
    ADD COLUMN log_tail       text[] NOT NULL DEFAULT '{}',
    ADD COLUMN run_as         text NOT NULL DEFAULT '' CHECK (run_as IN ('', '1', '2', '3', '4', 'preemptible'));

-- One lease per node of a job's gang per segment. offered → taken → running
-- → exited. A gang starts only when every lease of the segment is taken.
CREATE TABLE leases (
    job_id          bigint NOT NULL REFERENCES jobs(id),
    segment         integer NOT NULL CHECK (segment >= 1),
    node            text NOT NULL REFERENCES nodes(name),
    rank            integer NOT NULL CHECK (rank >= 0),
    gpu_indices     integer[] NOT NULL CHECK (cardinality(gpu_indices) > 0),
    env             jsonb NOT NULL,
    state           text NOT NULL DEFAULT 'offered' CHECK (state IN ('offered', 'taken', 'running', 'exited')),
    offered_at      timestamptz NOT NULL DEFAULT now(),
    taken_at        timestamptz,
    started_at      timestamptz,
    exited_at       timestamptz,
    pid             integer,
    exit_code       integer,
    exit_signal     text NOT NULL DEFAULT '',
    exit_reason     text NOT NULL DEFAULT '',
    stop_reason     text NOT NULL DEFAULT '',
    stop_grace_s    integer,
    stop_requested_at timestamptz,
    preempted_by    bigint,
    PRIMARY KEY (job_id, segment, node)
);
CREATE INDEX leases_node_open_idx ON leases (node) WHERE state <> 'exited';

-- Fair-share usage, decayed with the policy's half-life by a periodic job.
CREATE TABLE team_usage (
    team         text PRIMARY KEY REFERENCES teams(slug) ON DELETE CASCADE,
    gpu_seconds  double precision NOT NULL DEFAULT 0 CHECK (gpu_seconds >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- One row per scheduling cycle, for the portal and for debugging.
CREATE TABLE scheduling_cycles (
    id           bigserial PRIMARY KEY,
    started_at   timestamptz NOT NULL,
    duration_us  bigint NOT NULL,
    pending      integer NOT NULL,
    started      integer NOT NULL,
    preempted    integer NOT NULL,
    outcome      text NOT NULL
);

-- Delivery markers: an order is sent once; a re-registering agent gets
-- everything again.
ALTER TABLE leases
    ADD COLUMN offer_sent_at timestamptz,
    ADD COLUMN start_sent_at timestamptz,
    ADD COLUMN stop_sent_at  timestamptz;

-- Every request for a scheduling cycle takes a number; a cycle that sees a
-- newer number when it finishes runs again, so no request is lost while a
-- cycle is running (River's unique jobs coalesce the rest).
CREATE SEQUENCE schedule_requests;
