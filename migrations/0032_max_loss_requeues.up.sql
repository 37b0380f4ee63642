-- How many times a checkpointable job goes back to the queue after losing
-- its node or its process (the node went silent, the agent crashed or shut
-- down without it) before such a loss fails it (allot.Policy
-- MaxLossRequeues): a job that keeps taking its node or its agent down
-- moves from node to node at most this often. 0: no limit, what the
-- scheduler did before this column. A database whose policy an admin has
-- edited keeps no limit, the behaviour it was scheduled by; a fresh install
-- (only the default policy of 0020) gets 5, which allot.DefaultPolicy() is
-- (Kueue's requeue backoff limit and Slurm's MaxBatchRequeue bound the same
-- loop).
ALTER TABLE policy_versions ADD COLUMN max_loss_requeues integer NOT NULL DEFAULT 0
    CHECK (max_loss_requeues BETWEEN 0 AND 1000);

UPDATE policy_versions SET max_loss_requeues = 5
WHERE created_by = 'system' AND (SELECT count(*) FROM policy_versions) = 1;

ALTER TABLE policy_versions ALTER COLUMN max_loss_requeues SET DEFAULT 5;

COMMENT ON COLUMN policy_versions.max_loss_requeues IS
    'requeues after a lost node or process before the next such loss fails the job (0: no limit)';
