-- Allot on Slurm (issue 14): a GPU type is a node pool and names the
-- engine that runs its jobs. 'native': Allot's scheduler places the jobs on
-- Allot's agents (as before). 'slurm': the jobs are submitted to a Slurm
-- cluster through slurmrestd, Slurm places and runs them, and Allot imports
-- what ran from Slurm's accounting into the same allocations the bill,
-- budgets and fair share read. Slurm's nodes are Allot nodes of a Slurm
-- GPU type, with backend 'slurm': the native scheduler never offers them,
-- and they are never "lost" for want of agent heartbeats.
ALTER TABLE gpu_types ADD COLUMN backend text NOT NULL DEFAULT 'native' CHECK (backend IN ('native', 'slurm'));
ALTER TABLE nodes ADD COLUMN backend text NOT NULL DEFAULT 'native' CHECK (backend IN ('native', 'slurm'));
ALTER TABLE jobs ADD COLUMN backend text NOT NULL DEFAULT 'native' CHECK (backend IN ('native', 'slurm'));

-- A job's backend is its GPU type's; a job for any type runs on Slurm only
-- when every GPU type in service is a Slurm one (a cluster that is all
-- Slurm). Set by the database so that no insert path can get it wrong.
CREATE FUNCTION jobs_backend() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.backend = 'native' THEN
        IF NEW.gpu_type IS NOT NULL THEN
            NEW.backend := coalesce((SELECT backend FROM gpu_types WHERE name = NEW.gpu_type), 'native');
        ELSIF EXISTS (SELECT 1 FROM gpu_types WHERE backend = 'slurm' AND retired_at IS NULL)
            AND NOT EXISTS (SELECT 1 FROM gpu_types WHERE backend = 'native' AND retired_at IS NULL) THEN
            NEW.backend := 'slurm';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER jobs_backend BEFORE INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION jobs_backend();
CREATE INDEX jobs_backend_pending_idx ON jobs (backend, id) WHERE state = 'pending' AND backend <> 'native';

-- The Slurm side of an Allot job: which Slurm job it is, what Slurm says
-- about it (state, reason code, expected start), and why a submission
-- failed. A job Allot submitted carries "allot:job=<id>" in its Slurm
-- comment; a job submitted with sbatch is imported (origin 'sbatch').
CREATE TABLE slurm_jobs (
    job_id          bigint PRIMARY KEY REFERENCES jobs(id),
    slurm_job_id    bigint UNIQUE CHECK (slurm_job_id > 0),
    origin          text NOT NULL CHECK (origin IN ('allot', 'sbatch')),
    account         text NOT NULL DEFAULT '',
    slurm_user      text NOT NULL DEFAULT '',
    qos             text NOT NULL DEFAULT '',
    partition       text NOT NULL DEFAULT '',
    state           text NOT NULL DEFAULT '',
    reason          text NOT NULL DEFAULT '',
    start_estimate  timestamptz,
    nodes           text[] NOT NULL DEFAULT '{}',
    submit_error    text NOT NULL DEFAULT '',
    submitted_at    timestamptz,
    cancel_sent_at  timestamptz,
    demote_sent_at  timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- One row per run of a Slurm job as accounting reports it (a requeued job
-- has several: the preempted run and the next one). Key: the Slurm job and
-- the run's start; the run is the Allot job's segment of that number.
-- Re-importing a run updates it in place: import is idempotent.
CREATE TABLE slurm_runs (
    slurm_job_id  bigint NOT NULL,
    run_start     timestamptz NOT NULL,
    job_id        bigint NOT NULL REFERENCES jobs(id),
    segment       integer NOT NULL CHECK (segment >= 1),
    state         text NOT NULL,
    run_end       timestamptz,
    gpus          integer NOT NULL CHECK (gpus >= 0),
    nodes         text[] NOT NULL,
    qos           text NOT NULL DEFAULT '',
    gpu_util_pct  double precision,
    gpu_mem_mib   bigint,
    imported_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (slurm_job_id, run_start),
    UNIQUE (job_id, segment),
    CHECK (run_end IS NULL OR run_end >= run_start)
);

-- The importer's place in Slurm's accounting and the last word from Slurm
-- (one row: the cluster Allot is pointed at).
CREATE TABLE slurm_sync (
    id               boolean PRIMARY KEY DEFAULT true CHECK (id),
    cluster          text NOT NULL DEFAULT '',
    version          text NOT NULL DEFAULT '',
    import_cursor    timestamptz,
    last_ok_at       timestamptz,
    last_error       text NOT NULL DEFAULT '',
    last_error_at    timestamptz,
    down_since       timestamptz,
    runs_imported    bigint NOT NULL DEFAULT 0,
    jobs_imported    bigint NOT NULL DEFAULT 0,
    unmapped         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(unmapped) = 'object'),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- A drain Allot pushed to Slurm (so a resume done in Slurm is seen as an
-- undrain, and a drain done in Slurm as a drain of Slurm's own).
ALTER TABLE nodes ADD COLUMN slurm_drain_pushed boolean NOT NULL DEFAULT false;
ALTER TABLE nodes DROP CONSTRAINT nodes_drain_source_check;
ALTER TABLE nodes ADD CONSTRAINT nodes_drain_source_check CHECK (drain_source IN ('', 'admin', 'health', 'slurm'));
