-- One source of truth for the queue (issue 15): what the last scheduling
-- cycle decided for every pending job it planned, written by the cycle in
-- its own transaction (store.ApplyPlan), and read by the job page, the API
-- (GET /api/v1/jobs/{id}, /api/v1/priorities), `allot jobs --start` and the
-- fair-share table, instead of a second ranking and a second estimator.
--
-- The three tables are UNLOGGED: derived data, replaced whole by every
-- cycle, so they write no WAL (the live cycle at 50,000 pending jobs is
-- WAL-bound). A crash (not a clean shutdown) empties them; the next cycle
-- (every policy cycle, 10 s by default) refills them, and until then job
-- pages say the job has not been through a cycle yet.
--
-- queue_decisions has no foreign key to jobs on purpose: the check locks
-- every referenced jobs row FOR KEY SHARE, and those row locks are
-- WAL-logged: at 50,000 pending jobs replacing the queue took 687 ms and
-- 27 MB of WAL per cycle with it, 120 ms and none without. A row whose job
-- is gone is invisible (every reader joins jobs) and goes with the next
-- cycle, which replaces them all.
CREATE UNLOGGED TABLE queue_decisions (
    job_id      bigint PRIMARY KEY,
    cycle_id    bigint NOT NULL,          -- scheduling_cycles.id of the cycle
    rank        integer NOT NULL CHECK (rank >= 1), -- 1-based, in the scheduler's order over the whole queue
    run_as      text NOT NULL,            -- the class it competes in: 1..4, preemptible (demoted or preemptible)
    reason      text NOT NULL,
    est_start   timestamptz,              -- NULL: unknown
    -- reservation: the scheduler holds GPUs for it from est_start on;
    -- preemption: it starts by preemption when its victims' grace ends;
    -- projection: when enough GPUs come free by the running jobs' time limits;
    -- '': no estimate.
    est_kind    text NOT NULL DEFAULT '' CHECK (est_kind IN ('', 'reservation', 'preemption', 'projection')),
    decided_at  timestamptz NOT NULL
);

-- The cycle the queue is from (one row; none before the first cycle).
CREATE UNLOGGED TABLE queue_cycle (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    cycle_id    bigint NOT NULL,
    decided_at  timestamptz NOT NULL,
    pending     integer NOT NULL
);

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
