-- A production install starts from an empty database: after `allot migrate`
-- the five tiers of DESIGN.md and the default policy exist (nothing else:
-- no people, teams, GPU types or nodes), so `allot bootstrap-admin`, GPU
-- types, teams and node tokens are all an operator needs. Each insert runs
-- only where the table is still empty, so a database that has its own tiers
-- or policy keeps them, and running this twice changes nothing.

INSERT INTO tiers (id, name, description, class_order, may_preempt, reserved_gpus, multiplier_bp, max_runtime_s)
SELECT * FROM (VALUES
    ('1', 'Production incident', 'Production incident retraining: dedicated reservation, may preempt tiers 3–4 and preemptible work.',
        1, ARRAY['3', '4', 'preemptible']::text[], 0, 15000, 48 * 3600::bigint),
    ('2', 'Scheduled production', 'Scheduled production retraining: dedicated reservation, may preempt preemptible work.',
        2, ARRAY['preemptible']::text[], 0, 12500, 72 * 3600::bigint),
    ('3', 'Experiment', 'Experiment development and validation: fair share.',
        3, ARRAY[]::text[], 0, 10000, 7 * 24 * 3600::bigint),
    ('4', 'Exploration', 'Exploratory research and sweeps: fair share.',
        4, ARRAY[]::text[], 0, 10000, 7 * 24 * 3600::bigint),
    ('preemptible', 'Preemptible', 'Runs on idle GPUs only and is killed first; 70 % off.',
        5, ARRAY[]::text[], 0, 3000, 3 * 24 * 3600::bigint)
) AS d (id, name, description, class_order, may_preempt, reserved_gpus, multiplier_bp, max_runtime_s)
WHERE NOT EXISTS (SELECT 1 FROM tiers);

-- A tier's first multiplier is in force since always (as UpsertTier does).
INSERT INTO tier_multipliers (tier, multiplier_bp, effective_from)
SELECT t.id, t.multiplier_bp, '1970-01-01'::timestamptz FROM tiers t
WHERE NOT EXISTS (SELECT 1 FROM tier_multipliers m WHERE m.tier = t.id);

-- allot.DefaultPolicy() (a store test keeps the two equal); health_rules is
-- json.Marshal(allot.DefaultHealthRules()), as in 0010.
INSERT INTO policy_versions (created_by, comment, weight_fair_share, weight_size, weight_age, max_age_s, half_life_s,
    grace_period_s, min_runtime_s, cycle_s, budget_warn_pct, budget_demote_pct, burst_pending_gpu_hours,
    burst_mean_wait_s, burst_release_gpu_hours, heartbeat_missed_after_s, burst_max_nodes,
    burst_monthly_budget_micros, health_rules, auto_undrain_after_s)
SELECT 'system', 'defaults from DESIGN.md', 10000, 1000, 500, 604800, 604800,
    120, 600, 10, 80, 100, 50,
    7200, 20, 60, 4,
    0, '[{"name":"ecc-double-bit","metric":"ecc_dbe","match":null,"over":0,"for":0,"severity":"critical","action":"drain"},{"name":"xid-fatal","metric":"xid","match":[48,79,94,95],"over":0,"for":0,"severity":"critical","action":"drain"},{"name":"throttle-warn","metric":"throttle","match":null,"over":0,"for":600000000000,"severity":"warning","action":"warn"},{"name":"throttle-drain","metric":"throttle","match":null,"over":0,"for":3600000000000,"severity":"critical","action":"drain"},{"name":"gpu-missing","metric":"gpu_missing","match":null,"over":0,"for":0,"severity":"critical","action":"drain"},{"name":"health-check","metric":"health_check","match":null,"over":0,"for":0,"severity":"critical","action":"drain"}]'::jsonb, 0
WHERE NOT EXISTS (SELECT 1 FROM policy_versions);

-- Nodes: the GPUs the admin declared (node-token create --gpus), kept
-- apart from gpu_count (what the agent registered), and what the last
-- registration found that differs from the declaration.
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS declared_gpus integer CHECK (declared_gpus BETWEEN 1 AND 64);
ALTER TABLE nodes ADD COLUMN IF NOT EXISTS inventory_note text NOT NULL DEFAULT '';

-- GPU types are retired, never deleted: usage and rates keep naming them.
ALTER TABLE gpu_types ADD COLUMN IF NOT EXISTS retired_at timestamptz;
