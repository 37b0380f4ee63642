-- One source of truth for the queue (issue 15): what the last scheduling
-- cycle decided for every pending job it planned, written by the cycle in
-- its own transaction (store.ApplyPlan, RecordShares, RecordCycle), and
-- read by the job page, the API (GET /api/v1/jobs/{id},
-- /api/v1/priorities), `allot jobs --start` and the fair-share table,
-- instead of a second ranking and a second estimator.
--
-- Both tables are UNLOGGED: derived data, replaced whole by every cycle, so
-- they write no WAL (the live cycle at 50,000 pending jobs is WAL-bound). A
-- crash (not a clean shutdown) empties them; the next cycle (every policy
-- cycle, 10 s by default) refills them, and until then job pages say the
-- job has not been through a cycle yet.
--
-- The queue is one row of arrays in the scheduler's order (a job's rank is
-- its position), rewritten by one statement per cycle. A row per job was
-- measured first, at 50,000 pending jobs on the shared 2-core test machine:
-- DELETE + COPY of every row 822 ms per steady cycle (the unique checks
-- visit the dead versions earlier cycles left until autovacuum), TRUNCATE
-- + COPY 369 ms but blocking every reader until the cycle commits, and a
-- foreign key to jobs 687 ms and 27 MB of WAL on its own (the check locks
-- every referenced jobs row, WAL-logged). The view queue_decisions gives
-- the row-per-job shape to SQL readers. A job id whose job is gone is
-- dropped by the next cycle; readers join jobs. A job's priority and its
-- breakdown stay on its jobs row (written when they change), where the
-- job lists read them per job: arrays are cheap to write whole, not to
-- read one element of for many jobs.
CREATE UNLOGGED TABLE queue_cycle (
    one          boolean PRIMARY KEY DEFAULT true CHECK (one),
    cycle_id     bigint NOT NULL,       -- scheduling_cycles.id of the cycle
    decided_at   timestamptz NOT NULL,  -- the cycle's instant
    -- Element i (1-based) of each array is the job of rank i.
    job_ids      bigint[] NOT NULL,
    classes      smallint[] NOT NULL,   -- the class it competes in: 1..4, 5 = preemptible (demoted or preemptible)
    reason_ids   integer[] NOT NULL,    -- index into reasons (most jobs share a few generic ones)
    reasons      text[] NOT NULL,
    est_starts   timestamptz[] NOT NULL, -- NULL elements: no estimate
    -- reservation: the scheduler holds GPUs for the job from est_start on;
    -- preemption: it starts by preemption when its victims' grace ends;
    -- projection: when enough GPUs come free by the running jobs' time
    -- limits, the jobs ahead placed first; '': no estimate.
    est_kinds    text[] NOT NULL,
    CHECK (cardinality(job_ids) = cardinality(classes) AND cardinality(job_ids) = cardinality(reason_ids)
        AND cardinality(job_ids) = cardinality(est_starts) AND cardinality(job_ids) = cardinality(est_kinds))
);

-- Written every cycle, read far less: stored uncompressed (no pglz on
-- the cycle's path).
ALTER TABLE queue_cycle ALTER job_ids SET STORAGE EXTERNAL, ALTER classes SET STORAGE EXTERNAL,
    ALTER reason_ids SET STORAGE EXTERNAL, ALTER est_starts SET STORAGE EXTERNAL, ALTER est_kinds SET STORAGE EXTERNAL;

-- One row per queued job, in the shape of a table (the reasons joined, not
-- subscripted: a subscript would read the whole array again per row).
CREATE VIEW queue_decisions AS
    SELECT d.job_id, m.cycle_id, d.rank::integer AS rank,
        d.class, CASE d.class WHEN 5 THEN 'preemptible' ELSE d.class::text END AS run_as,
        r.reason,
        d.est_start, d.est_kind, m.decided_at
    FROM queue_cycle m
    CROSS JOIN LATERAL unnest(m.job_ids, m.classes, m.reason_ids, m.est_starts, m.est_kinds)
        WITH ORDINALITY AS d(job_id, class, reason_id, est_start, est_kind, rank)
    JOIN LATERAL unnest(m.reasons) WITH ORDINALITY AS r(reason, id) ON r.id = d.reason_id;

-- Every team's fair-share standing as the last cycle computed it
-- (scheduler.Plan.Shares, like one row of Slurm's sshare).
CREATE UNLOGGED TABLE cycle_shares (
    team            text PRIMARY KEY,
    cycle_id        bigint NOT NULL,
    decided_at      timestamptz NOT NULL,
    norm_shares     double precision NOT NULL,
    raw_usage       double precision NOT NULL, -- decayed GPU-seconds
    effective_usage double precision NOT NULL,
    fair_share      double precision NOT NULL
);
