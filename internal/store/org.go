package store

import (
	"context"
	"fmt"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// CreateGPUType stores a GPU type and its first rate, in force from
// effectiveFrom.
func (s *Store) CreateGPUType(ctx context.Context, g *allot.GPUType, effectiveFrom time.Time) error {
	if err := g.Validate(); err != nil {
		return err
	}
	return s.InTx(ctx, func(tx *Store) error {
		backend := g.Backend
		if backend == "" {
			backend = allot.BackendNative
		}
		if _, err := tx.db.Exec(ctx, `INSERT INTO gpu_types (name, memory_gb, backend) VALUES ($1, $2, $3)`, g.Name, g.MemoryGB, backend); err != nil {
			return mapErr("creating GPU type", err)
		}
		return tx.SetRate(ctx, g.Name, g.HourlyRate, effectiveFrom)
	})
}

// SetRate records a new hourly rate for a GPU type from effectiveFrom on.
// Earlier rates are kept: usage is charged at the rate in force when it ran.
func (s *Store) SetRate(ctx context.Context, gpuType string, rate allot.Money, effectiveFrom time.Time) error {
	if rate.Micros < 0 {
		return (allot.FieldErrors{"hourly_rate": "must not be negative"}).Err()
	}
	_, err := s.db.Exec(ctx, `INSERT INTO gpu_rates (gpu_type, rate_micros, currency, effective_from, created_at) VALUES ($1, $2, $3, $4, $5)`,
		gpuType, rate.Micros, rate.Currency, effectiveFrom, s.Now())
	return mapErr("setting rate", err)
}

// ListGPUTypes returns GPU types by name, with the rate in force now.
func (s *Store) ListGPUTypes(ctx context.Context) ([]allot.GPUType, error) {
	rows, err := s.db.Query(ctx, `
		SELECT g.name, g.memory_gb, coalesce(r.rate_micros, 0), coalesce(r.currency, 'USD')
		FROM gpu_types g
		LEFT JOIN LATERAL (
			SELECT rate_micros, currency FROM gpu_rates
			WHERE gpu_type = g.name AND effective_from <= $1
			ORDER BY effective_from DESC LIMIT 1) r ON true
		ORDER BY g.name`, s.Now())
	if err != nil {
		return nil, mapErr("listing GPU types", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (allot.GPUType, error) {
		var g allot.GPUType
		err := r.Scan(&g.Name, &g.MemoryGB, &g.HourlyRate.Micros, &g.HourlyRate.Currency)
		return g, err
	})
	return out, mapErr("listing GPU types", err)
}

// UpsertTier creates or replaces a tier.
func (s *Store) UpsertTier(ctx context.Context, t *allot.Tier) error {
	if err := t.Validate(); err != nil {
		return err
	}
	mp := make([]string, len(t.MayPreempt))
	for i, v := range t.MayPreempt {
		mp[i] = string(v)
	}
	_, err := s.db.Exec(ctx, `
		INSERT INTO tiers (id, name, description, class_order, may_preempt, reserved_gpus, multiplier_bp, max_runtime_s)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (id) DO UPDATE SET name = $2, description = $3, class_order = $4, may_preempt = $5,
			reserved_gpus = $6, multiplier_bp = $7, max_runtime_s = $8`,
		string(t.ID), t.Name, t.Description, t.ClassOrder, mp, t.ReservedGPUs, t.MultiplierBP, int64(t.MaxRuntime/time.Second))
	if err != nil {
		return mapErr("saving tier", err)
	}
	// Multipliers are versioned for billing: a new tier's first version is in
	// force since always; a change is in force from now on.
	_, err = s.db.Exec(ctx, `
		INSERT INTO tier_multipliers (tier, multiplier_bp, effective_from)
		SELECT $1, $2, CASE WHEN NOT EXISTS (SELECT 1 FROM tier_multipliers WHERE tier = $1) THEN '1970-01-01'::timestamptz ELSE $3 END
		WHERE (SELECT multiplier_bp FROM tier_multipliers WHERE tier = $1 ORDER BY effective_from DESC LIMIT 1) IS DISTINCT FROM $2`,
		string(t.ID), t.MultiplierBP, s.Now())
	return mapErr("versioning tier multiplier", err)
}

const tierCols = `id, name, description, class_order, may_preempt, reserved_gpus, multiplier_bp, max_runtime_s`

func scanTier(r pgx.Row) (allot.Tier, error) {
	var t allot.Tier
	var id string
	var mp []string
	var maxRun int64
	err := r.Scan(&id, &t.Name, &t.Description, &t.ClassOrder, &mp, &t.ReservedGPUs, &t.MultiplierBP, &maxRun)
	t.ID = allot.TierID(id)
	for _, v := range mp {
		t.MayPreempt = append(t.MayPreempt, allot.TierID(v))
	}
	t.MaxRuntime = time.Duration(maxRun) * time.Second
	return t, err
}

// ListTiers returns the tiers in class order.
func (s *Store) ListTiers(ctx context.Context) ([]allot.Tier, error) {
	rows, err := s.db.Query(ctx, `SELECT `+tierCols+` FROM tiers ORDER BY class_order`)
	if err != nil {
		return nil, mapErr("listing tiers", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (allot.Tier, error) { return scanTier(r) })
	return out, mapErr("listing tiers", err)
}

// GetTier returns one tier.
func (s *Store) GetTier(ctx context.Context, id allot.TierID) (allot.Tier, error) {
	t, err := scanTier(s.db.QueryRow(ctx, `SELECT `+tierCols+` FROM tiers WHERE id = $1`, string(id)))
	return t, mapErr(fmt.Sprintf("loading tier %s", id), err)
}

// CreateTeam stores a team and its guarantees.
func (s *Store) CreateTeam(ctx context.Context, t *allot.Team) error {
	if err := t.Validate(); err != nil {
		return err
	}
	return s.InTx(ctx, func(tx *Store) error {
		err := tx.db.QueryRow(ctx, `
			INSERT INTO teams (slug, name, cost_center, monthly_budget_gpu_hours, fair_share_weight, created_at, posix_account)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING created_at`,
			t.Slug, t.Name, t.CostCenter, t.MonthlyBudgetGPUHours, t.FairShareWeight, tx.Now(), t.PosixAccount).Scan(&t.CreatedAt)
		if err != nil {
			return mapErr("creating team", err)
		}
		for typ, n := range t.Guarantees {
			if _, err := tx.db.Exec(ctx, `INSERT INTO team_guarantees (team, gpu_type, gpus) VALUES ($1, $2, $3)`, t.Slug, typ, n); err != nil {
				return mapErr("creating team guarantee", err)
			}
		}
		return nil
	})
}

// ListTeams returns all teams by slug with their guarantees.
func (s *Store) ListTeams(ctx context.Context) ([]allot.Team, error) {
	rows, err := s.db.Query(ctx, `
		SELECT t.slug, t.name, t.cost_center, t.monthly_budget_gpu_hours, t.fair_share_weight, t.created_at, t.posix_account,
			coalesce(array_agg(g.gpu_type ORDER BY g.gpu_type) FILTER (WHERE g.gpu_type IS NOT NULL), '{}'),
			coalesce(array_agg(g.gpus ORDER BY g.gpu_type) FILTER (WHERE g.gpu_type IS NOT NULL), '{}')
		FROM teams t LEFT JOIN team_guarantees g ON g.team = t.slug
		GROUP BY t.slug ORDER BY t.slug`)
	if err != nil {
		return nil, mapErr("listing teams", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (allot.Team, error) {
		var t allot.Team
		var types []string
		var gpus []int32
		err := r.Scan(&t.Slug, &t.Name, &t.CostCenter, &t.MonthlyBudgetGPUHours, &t.FairShareWeight, &t.CreatedAt, &t.PosixAccount, &types, &gpus)
		t.Guarantees = map[string]int{}
		for i := range types {
			t.Guarantees[types[i]] = int(gpus[i])
		}
		return t, err
	})
	return out, mapErr("listing teams", err)
}

// GetTeam returns one team.
func (s *Store) GetTeam(ctx context.Context, slug string) (allot.Team, error) {
	teams, err := s.ListTeams(ctx)
	if err != nil {
		return allot.Team{}, err
	}
	for _, t := range teams {
		if t.Slug == slug {
			return t, nil
		}
	}
	return allot.Team{}, fmt.Errorf("loading team %q: %w", slug, allot.ErrNotFound)
}

// CreateUser stores a user and their memberships, setting u.ID.
func (s *Store) CreateUser(ctx context.Context, u *allot.User) error {
	if err := u.Validate(); err != nil {
		return err
	}
	return s.InTx(ctx, func(tx *Store) error {
		err := tx.db.QueryRow(ctx, `
			INSERT INTO users (oidc_subject, email, name, is_admin, is_finance, created_at, posix_user, oidc_posix_user)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id`,
			u.OIDCSubject, u.Email, u.Name, u.Admin, u.Finance, tx.Now(), u.PosixUser, u.OIDCPosixUser).Scan(&u.ID)
		if err != nil {
			return mapErr("creating user", err)
		}
		for _, m := range u.Memberships {
			if _, err := tx.db.Exec(ctx, `INSERT INTO memberships (user_id, team, role) VALUES ($1, $2, $3)`, u.ID, m.Team, m.Role); err != nil {
				return mapErr("adding membership", err)
			}
		}
		return nil
	})
}

const userSelect = `
	SELECT u.id, u.oidc_subject, u.email, u.name, u.is_admin, u.is_finance,
		coalesce(array_agg(m.team ORDER BY m.team) FILTER (WHERE m.team IS NOT NULL), '{}'),
		coalesce(array_agg(m.role ORDER BY m.team) FILTER (WHERE m.team IS NOT NULL), '{}'),
		u.posix_user, u.oidc_posix_user
	FROM users u LEFT JOIN memberships m ON m.user_id = u.id`

func scanUser(r pgx.Row) (allot.User, error) {
	var u allot.User
	var teams, roles []string
	err := r.Scan(&u.ID, &u.OIDCSubject, &u.Email, &u.Name, &u.Admin, &u.Finance, &teams, &roles, &u.PosixUser, &u.OIDCPosixUser)
	for i := range teams {
		u.Memberships = append(u.Memberships, allot.Membership{Team: teams[i], Role: roles[i]})
	}
	return u, err
}

// GetUser returns a user by id.
func (s *Store) GetUser(ctx context.Context, id int64) (allot.User, error) {
	u, err := scanUser(s.db.QueryRow(ctx, userSelect+` WHERE u.id = $1 GROUP BY u.id`, id))
	return u, mapErr(fmt.Sprintf("loading user %d", id), err)
}

// UserByEmail returns a user by email.
func (s *Store) UserByEmail(ctx context.Context, email string) (allot.User, error) {
	u, err := scanUser(s.db.QueryRow(ctx, userSelect+` WHERE u.email = $1 GROUP BY u.id`, email))
	return u, mapErr(fmt.Sprintf("loading user %q", email), err)
}

// ListUsers returns all users by email.
func (s *Store) ListUsers(ctx context.Context) ([]allot.User, error) {
	rows, err := s.db.Query(ctx, userSelect+` GROUP BY u.id ORDER BY u.email`)
	if err != nil {
		return nil, mapErr("listing users", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (allot.User, error) { return scanUser(r) })
	return out, mapErr("listing users", err)
}

// CreateNode registers a node.
func (s *Store) CreateNode(ctx context.Context, n *allot.Node) error {
	if n.State == "" {
		n.State = allot.NodeUp
	}
	if err := n.Validate(); err != nil {
		return err
	}
	_, err := s.db.Exec(ctx, `INSERT INTO nodes (name, gpu_type, gpu_count, declared_gpus, site, domain, rack, state) VALUES ($1, $2, $3, $3, $4, $5, $6, $7)`,
		n.Name, n.GPUType, n.GPUCount, n.Site, n.Domain, n.Rack, n.State)
	return mapErr("creating node", err)
}

// ListNodes returns all nodes by name.
func (s *Store) ListNodes(ctx context.Context) ([]allot.Node, error) {
	rows, err := s.db.Query(ctx, `SELECT name, gpu_type, gpu_count, site, domain, rack, state, state_reason, last_heartbeat, hostname, backend FROM nodes ORDER BY name`)
	if err != nil {
		return nil, mapErr("listing nodes", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (allot.Node, error) {
		var n allot.Node
		var hb *time.Time
		err := r.Scan(&n.Name, &n.GPUType, &n.GPUCount, &n.Site, &n.Domain, &n.Rack, &n.State, &n.StateReason, &hb, &n.Hostname, &n.Backend)
		if hb != nil {
			n.LastHeartbeat = *hb
		}
		return n, err
	})
	return out, mapErr("listing nodes", err)
}

// MaxGang returns, per GPU type and for "" (any type), the largest job the
// cluster could ever run: a whole node, or all nodes of one type inside one
// interconnect domain. Nodes that are down still count (they come back).
func (s *Store) MaxGang(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.Query(ctx, `
		SELECT gpu_type, max(total) FROM (
			SELECT gpu_type, CASE WHEN domain = '' THEN gpu_count ELSE sum(gpu_count) OVER (PARTITION BY gpu_type, domain) END AS total
			FROM nodes) d
		GROUP BY gpu_type`)
	if err != nil {
		return nil, mapErr("computing largest gang", err)
	}
	out := map[string]int{"": 0}
	var typ string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&typ, &n}, func() error {
		out[typ] = n
		if n > out[""] {
			out[""] = n
		}
		return nil
	})
	return out, mapErr("computing largest gang", err)
}

// InsertPolicy stores p as a new policy version and sets p.Version.
func (s *Store) InsertPolicy(ctx context.Context, p *allot.Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	rules := p.HealthRules
	if rules == nil {
		rules = []allot.HealthRule{}
	}
	sec := func(d time.Duration) int64 { return int64(d / time.Second) }
	err := s.db.QueryRow(ctx, `
		INSERT INTO policy_versions (created_by, comment, weight_fair_share, weight_size, weight_age, max_age_s, half_life_s,
			grace_period_s, min_runtime_s, cycle_s, budget_warn_pct, budget_demote_pct, burst_pending_gpu_hours,
			burst_mean_wait_s, burst_release_gpu_hours, heartbeat_missed_after_s, burst_max_nodes,
			burst_monthly_budget_micros, health_rules, auto_undrain_after_s, created_at, queue_order, tier1_fifo, max_loss_requeues)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24)
		RETURNING version, created_at`,
		p.CreatedBy, p.Comment, p.WeightFairShare, p.WeightSize, p.WeightAge, sec(p.MaxAge), sec(p.HalfLife),
		sec(p.GracePeriod), sec(p.MinRuntime), sec(p.Cycle), p.BudgetWarnPct, p.BudgetDemotePct, p.BurstPendingGPUHours,
		sec(p.BurstMeanWait), p.BurstReleaseGPUHours, sec(p.HeartbeatMissedAfter), p.BurstMaxNodes,
		p.BurstMonthlyBudget.Micros, rules, sec(p.AutoUndrainAfter), s.Now(), p.QueueOrder, p.Tier1FIFO, p.MaxLossRequeues).Scan(&p.Version, &p.CreatedAt)
	return mapErr("saving policy", err)
}

const policyCols = `version, created_at, created_by, comment, weight_fair_share, weight_size, weight_age, max_age_s, half_life_s,
	grace_period_s, min_runtime_s, cycle_s, budget_warn_pct, budget_demote_pct, burst_pending_gpu_hours,
	burst_mean_wait_s, burst_release_gpu_hours, heartbeat_missed_after_s, burst_max_nodes,
	burst_monthly_budget_micros, health_rules, auto_undrain_after_s, queue_order, tier1_fifo, max_loss_requeues`

func scanPolicy(r pgx.Row) (allot.Policy, error) {
	var p allot.Policy
	var maxAge, half, grace, minRun, cycle, burstWait, hb, undrain int64
	err := r.Scan(&p.Version, &p.CreatedAt, &p.CreatedBy, &p.Comment, &p.WeightFairShare, &p.WeightSize, &p.WeightAge,
		&maxAge, &half, &grace, &minRun, &cycle, &p.BudgetWarnPct, &p.BudgetDemotePct, &p.BurstPendingGPUHours,
		&burstWait, &p.BurstReleaseGPUHours, &hb, &p.BurstMaxNodes, &p.BurstMonthlyBudget.Micros, &p.HealthRules, &undrain, &p.QueueOrder, &p.Tier1FIFO, &p.MaxLossRequeues)
	d := func(s int64) time.Duration { return time.Duration(s) * time.Second }
	p.MaxAge, p.HalfLife, p.GracePeriod, p.MinRuntime, p.Cycle, p.BurstMeanWait, p.HeartbeatMissedAfter, p.AutoUndrainAfter =
		d(maxAge), d(half), d(grace), d(minRun), d(cycle), d(burstWait), d(hb), d(undrain)
	return p, err
}

// CurrentPolicy returns the newest policy version, or the defaults (version
// 0) when none is stored.
func (s *Store) CurrentPolicy(ctx context.Context) (allot.Policy, error) {
	p, err := scanPolicy(s.db.QueryRow(ctx, `SELECT `+policyCols+` FROM policy_versions ORDER BY version DESC LIMIT 1`))
	if err == pgx.ErrNoRows {
		return allot.DefaultPolicy(), nil
	}
	return p, mapErr("loading policy", err)
}

// PolicyHistory returns every policy version, newest first.
func (s *Store) PolicyHistory(ctx context.Context) ([]allot.Policy, error) {
	rows, err := s.db.Query(ctx, `SELECT `+policyCols+` FROM policy_versions ORDER BY version DESC`)
	if err != nil {
		return nil, mapErr("listing policy versions", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (allot.Policy, error) { return scanPolicy(r) })
	return out, mapErr("listing policy versions", err)
}
