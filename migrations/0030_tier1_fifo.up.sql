-- Whether tier-1 (incident) jobs are served oldest first (allot.Policy
-- Tier1FIFO, scheduler.Policy.Tier1FIFO): true (the default, what the live
-- scheduler always did before this column) serves them by submission time
-- whatever their priority, and a tier-1 job whose victims are still in
-- their grace period keeps its turn, so the GPUs coming free reach tier-1
-- jobs in the order they came; false orders tier 1 by priority like the
-- other tiers, with its preemptors in flight ahead of the queue. Every
-- existing version gets true: the behaviour it was scheduled by.
ALTER TABLE policy_versions ADD COLUMN tier1_fifo boolean NOT NULL DEFAULT true;

COMMENT ON COLUMN policy_versions.tier1_fifo IS
    'tier-1 jobs served oldest first, a tier-1 preemptor waiting on its victims'' grace keeps its turn (true, the default); false: by priority';
