-- The jobs list is newest first by submission time (then id), with or
-- without a team or state filter (those have their own indexes).
CREATE INDEX jobs_submitted_idx ON jobs (submitted_at DESC, id DESC);

-- A job is never in state 'preempted' or 'lost': a preempted job, or one
-- whose node stopped answering, goes back to 'pending' or ends 'failed'
-- (end_reason node_lost) in the same transaction; its run segments keep
-- what happened. The check names only the states a job is ever in.
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check CHECK (state IN ('pending', 'running', 'completed', 'failed', 'cancelled'));
