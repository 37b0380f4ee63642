-- How the scheduler orders the pending jobs inside a tier (allot.Policy
-- QueueOrder): 'response' (response ratio × fair share, the default since
-- it beat EASY backfill on every loaded replay of the simulator's suite) or
-- 'multifactor' (Slurm's weights × factors, the order before this). A
-- database whose policy an admin has edited keeps the order it was
-- scheduled by; a fresh install (only the default policy of 0020) gets the
-- new default, which allot.DefaultPolicy() is.
ALTER TABLE policy_versions ADD COLUMN queue_order text NOT NULL DEFAULT 'multifactor'
    CHECK (queue_order IN ('response', 'multifactor'));

UPDATE policy_versions SET queue_order = 'response'
WHERE created_by = 'system' AND (SELECT count(*) FROM policy_versions) = 1;

ALTER TABLE policy_versions ALTER COLUMN queue_order SET DEFAULT 'response';
