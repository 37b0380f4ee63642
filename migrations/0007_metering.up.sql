-- Metering: per job run segment and UTC hour, the GPU-seconds held and the
-- agents' samples rolled up (mean utilization, mean and peak memory), so raw
-- gpu_samples can be deleted on a retention schedule while the rollups stay.

CREATE TABLE job_usage_hours (
    job_id             bigint NOT NULL REFERENCES jobs(id),
    segment            integer NOT NULL CHECK (segment >= 1),
    hour               timestamptz NOT NULL CHECK (extract(epoch FROM hour)::bigint % 3600 = 0),
    gpu_type           text NOT NULL,
    gpus               integer NOT NULL CHECK (gpus >= 0),       -- distinct GPUs held in the hour
    gpu_seconds        bigint NOT NULL CHECK (gpu_seconds >= 0 AND gpu_seconds <= gpus * 3600),
    samples            bigint NOT NULL CHECK (samples >= 0),
    mean_util_pct      double precision CHECK (samples > 0 OR mean_util_pct IS NULL),
    mean_mem_used_mib  double precision CHECK (samples > 0 OR mean_mem_used_mib IS NULL),
    peak_mem_used_mib  bigint CHECK (samples > 0 OR peak_mem_used_mib IS NULL),
    mem_total_mib      bigint CHECK (samples > 0 OR mem_total_mib IS NULL),
    PRIMARY KEY (job_id, segment, hour)
);
CREATE INDEX job_usage_hours_hour_idx ON job_usage_hours (hour, job_id);

-- The same per GPU, for the "fewer GPUs than allocated" rule.
CREATE TABLE job_gpu_usage_hours (
    job_id             bigint NOT NULL REFERENCES jobs(id),
    segment            integer NOT NULL CHECK (segment >= 1),
    hour               timestamptz NOT NULL CHECK (extract(epoch FROM hour)::bigint % 3600 = 0),
    node               text NOT NULL,
    gpu_index          integer NOT NULL,
    gpu_seconds        bigint NOT NULL CHECK (gpu_seconds BETWEEN 0 AND 3600),
    samples            bigint NOT NULL CHECK (samples >= 0),
    mean_util_pct      double precision CHECK (samples > 0 OR mean_util_pct IS NULL),
    PRIMARY KEY (job_id, segment, hour, node, gpu_index)
);
CREATE INDEX job_gpu_usage_hours_hour_idx ON job_gpu_usage_hours (hour, job_id);

-- UTC hours whose rollup ran after the hour had ended: only their raw
-- samples may be deleted. Once they are (purged_at), the hour's rollups are
-- final: a later rollup leaves them as they are.
CREATE TABLE metering_hours (
    hour          timestamptz PRIMARY KEY CHECK (extract(epoch FROM hour)::bigint % 3600 = 0),
    rolled_up_at  timestamptz NOT NULL,
    purged_at     timestamptz
);

-- Samples arrive in time order: a BRIN index finds an hour's samples cheaply
-- without slowing heartbeats down.
CREATE INDEX gpu_samples_at_brin ON gpu_samples USING brin (at);
