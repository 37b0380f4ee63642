-- The newest checkpoint the agent saw in a job's ALLOT_CHECKPOINT_DIR, per
-- lease: preemption credits and victim choice count lost work from it.
ALTER TABLE leases ADD COLUMN last_checkpoint timestamptz;
