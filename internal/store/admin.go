package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/jackc/pgx/v5"
)

// Admin policy edits. Each one runs through ChangePolicy (the change, a new
// policy version and an audit entry in one transaction), and each one that
// would leave everything as it was changes nothing: no version, no entry.
// The *Values types are both the audit log's before/after documents and the
// JSON API's bodies, so the two can never disagree.

// AdminResult is what an admin edit did.
type AdminResult struct {
	Changed bool             // false: the values were already in force
	Entry   allot.AuditEntry // the audit entry (zero when !Changed)
}

var errNoChange = errors.New("no change")

// changeIfAny is ChangePolicy that rolls back and reports Changed=false when
// fn's before and after are the same document.
func (s *Store) changeIfAny(ctx context.Context, c PolicyChange, fn func(tx *Store, p *allot.Policy) (before, after any, err error)) (AdminResult, error) {
	e, err := s.ChangePolicy(ctx, c, func(tx *Store, p *allot.Policy) (any, any, error) {
		before, after, err := fn(tx, p)
		if err != nil {
			return nil, nil, err
		}
		b, err := json.Marshal(before)
		if err != nil {
			return nil, nil, err
		}
		a, err := json.Marshal(after)
		if err != nil {
			return nil, nil, err
		}
		if bytes.Equal(b, a) {
			return nil, nil, errNoChange
		}
		if before == nil {
			return nil, json.RawMessage(a), nil // a creation
		}
		return json.RawMessage(b), json.RawMessage(a), nil
	})
	if errors.Is(err, errNoChange) {
		return AdminResult{}, nil
	}
	if err != nil {
		return AdminResult{}, err
	}
	return AdminResult{Changed: true, Entry: e}, nil
}

// TierValues is a tier as admins edit it and the audit log records it.
type TierValues struct {
	ID           string   `json:"id"`
	Name         string   `json:"name"`
	Description  string   `json:"description"`
	ClassOrder   int      `json:"class_order"`
	MayPreempt   []string `json:"may_preempt"`
	ReservedGPUs int      `json:"reserved_gpus"`
	Multiplier   string   `json:"multiplier"` // decimal, e.g. "0.3"
	MaxRuntimeS  int64    `json:"max_runtime_s"`
}

// TierValuesOf returns t's values.
func TierValuesOf(t allot.Tier) TierValues {
	mp := make([]string, 0, len(t.MayPreempt))
	for _, v := range t.MayPreempt {
		mp = append(mp, string(v))
	}
	return TierValues{ID: string(t.ID), Name: t.Name, Description: t.Description, ClassOrder: t.ClassOrder, MayPreempt: mp,
		ReservedGPUs: t.ReservedGPUs, Multiplier: t.Multiplier(), MaxRuntimeS: int64(t.MaxRuntime / time.Second)}
}

// UpdateTier edits tier id with apply (which only assigns fields; parse
// input before). A multiplier change is a new multiplier version in force
// from now; it is refused if now lies in a closed month.
func (s *Store) UpdateTier(ctx context.Context, c PolicyChange, id allot.TierID, apply func(*allot.Tier)) (AdminResult, error) {
	return s.changeIfAny(ctx, c, func(tx *Store, _ *allot.Policy) (any, any, error) {
		old, err := tx.GetTier(ctx, id)
		if err != nil {
			return nil, nil, err
		}
		t := old
		t.MayPreempt = slices.Clone(old.MayPreempt)
		apply(&t)
		t.ID = old.ID
		if err := t.Validate(); err != nil {
			return nil, nil, err
		}
		if !t.ID.Production() && len(t.MayPreempt) > 0 {
			return nil, nil, (allot.FieldErrors{"may_preempt": "only production tiers (1–2) preempt by tier right; a tier 3–4 job preempts only to take back its team's guarantee"}).Err()
		}
		for _, v := range t.MayPreempt {
			if v == t.ID {
				return nil, nil, (allot.FieldErrors{"may_preempt": "a tier cannot preempt itself"}).Err()
			}
		}
		if t.ClassOrder != old.ClassOrder {
			var other string
			err := tx.db.QueryRow(ctx, `SELECT id FROM tiers WHERE class_order = $1 AND id <> $2`, t.ClassOrder, string(id)).Scan(&other)
			if err == nil {
				return nil, nil, (allot.FieldErrors{"class_order": fmt.Sprintf("tier %s already has order %d: move it first", other, t.ClassOrder)}).Err()
			}
			if err != pgx.ErrNoRows {
				return nil, nil, mapErr("checking tier order", err)
			}
		}
		if t.MultiplierBP != old.MultiplierBP {
			if err := tx.checkNotClosed(ctx, tx.Now()); err != nil {
				return nil, nil, err
			}
		}
		if err := tx.UpsertTier(ctx, &t); err != nil {
			return nil, nil, err
		}
		return TierValuesOf(old), TierValuesOf(t), nil
	})
}

// checkNotClosed takes the billing lock and refuses a price change
// effective at from if from lies in a closed month.
func (s *Store) checkNotClosed(ctx context.Context, from time.Time) error {
	if err := s.LockBilling(ctx); err != nil {
		return err
	}
	closed, err := s.ClosedMonths(ctx)
	if err != nil || len(closed) == 0 {
		return err
	}
	return billing.CheckEffective(from, closed[len(closed)-1].Next())
}

// RateValues is one rate version as the audit log records it.
type RateValues struct {
	GPUType       string    `json:"gpu_type"`
	Rate          string    `json:"rate"` // per GPU-hour at multiplier 1, decimal
	Currency      string    `json:"currency"`
	EffectiveFrom time.Time `json:"effective_from"`
}

// RateVersion is one stored rate with when it was recorded.
type RateVersion struct {
	RateValues
	Micros    int64     `json:"-"`
	CreatedAt time.Time `json:"created_at"`
}

// SetRatePolicy records a new hourly rate for gpuType from effectiveFrom
// on (whole seconds), refusing a date inside a closed month (EConflict). A
// rate equal to the one already in force then, with no later version,
// changes nothing.
func (s *Store) SetRatePolicy(ctx context.Context, c PolicyChange, gpuType string, rate allot.Money, effectiveFrom time.Time) (AdminResult, error) {
	effectiveFrom = effectiveFrom.UTC().Truncate(time.Second)
	if rate.Micros < 0 || rate.Micros > billing.MaxRateMicros {
		return AdminResult{}, (allot.FieldErrors{"rate": "must be between 0 and 1000000 per GPU-hour"}).Err()
	}
	return s.changeIfAny(ctx, c, func(tx *Store, _ *allot.Policy) (any, any, error) {
		var exists bool
		if err := tx.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM gpu_types WHERE name = $1)`, gpuType).Scan(&exists); err != nil {
			return nil, nil, mapErr("checking GPU type", err)
		}
		if !exists {
			return nil, nil, fmt.Errorf("setting rate: GPU type %q: %w", gpuType, allot.ErrNotFound)
		}
		var cur string
		err := tx.db.QueryRow(ctx, `SELECT currency FROM gpu_rates ORDER BY id LIMIT 1`).Scan(&cur)
		if err != nil && err != pgx.ErrNoRows {
			return nil, nil, mapErr("checking currency", err)
		}
		if cur != "" && cur != rate.Currency {
			return nil, nil, (allot.FieldErrors{"currency": fmt.Sprintf("all rates are in %s, not %s", cur, rate.Currency)}).Err()
		}
		before := RateValues{GPUType: gpuType}
		var micros int64
		var later bool
		err = tx.db.QueryRow(ctx, `
			SELECT rate_micros, currency, effective_from,
				EXISTS (SELECT 1 FROM gpu_rates WHERE gpu_type = $1 AND effective_from > $2)
			FROM gpu_rates WHERE gpu_type = $1 AND effective_from <= $2
			ORDER BY effective_from DESC LIMIT 1`, gpuType, effectiveFrom).Scan(&micros, &before.Currency, &before.EffectiveFrom, &later)
		if err != nil && err != pgx.ErrNoRows {
			return nil, nil, mapErr("loading rate", err)
		}
		before.EffectiveFrom = before.EffectiveFrom.UTC()
		before.Rate = allot.Money{Micros: micros, Currency: before.Currency}.Decimal()
		if err == nil && micros == rate.Micros && before.Currency == rate.Currency && !later {
			return before, before, nil // already in force
		}
		var clash bool
		if err := tx.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM gpu_rates WHERE gpu_type = $1 AND effective_from = $2)`,
			gpuType, effectiveFrom).Scan(&clash); err != nil {
			return nil, nil, mapErr("checking rate", err)
		}
		if clash {
			return nil, nil, (allot.FieldErrors{"effective_from": fmt.Sprintf("a rate for %s already starts at %s", gpuType,
				effectiveFrom.Format(time.RFC3339))}).Err()
		}
		if err := tx.SetRateChecked(ctx, gpuType, rate, effectiveFrom); err != nil {
			return nil, nil, err
		}
		return before, RateValues{GPUType: gpuType, Rate: rate.Decimal(), Currency: rate.Currency, EffectiveFrom: effectiveFrom}, nil
	})
}

// RateHistory returns every rate version, by GPU type, newest first.
func (s *Store) RateHistory(ctx context.Context) ([]RateVersion, error) {
	rows, err := s.db.Query(ctx, `SELECT gpu_type, rate_micros, currency, effective_from, created_at FROM gpu_rates ORDER BY gpu_type, effective_from DESC`)
	if err != nil {
		return nil, mapErr("loading rate history", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RateVersion, error) {
		var v RateVersion
		err := r.Scan(&v.GPUType, &v.Micros, &v.Currency, &v.EffectiveFrom, &v.CreatedAt)
		v.Rate = allot.Money{Micros: v.Micros, Currency: v.Currency}.Decimal()
		v.EffectiveFrom, v.CreatedAt = v.EffectiveFrom.UTC(), v.CreatedAt.UTC()
		return v, err
	})
	return out, mapErr("loading rate history", err)
}

// MultiplierVersion is one stored tier-multiplier version.
type MultiplierVersion struct {
	Tier          string    `json:"tier"`
	MultiplierBP  int       `json:"multiplier_bp"`
	EffectiveFrom time.Time `json:"effective_from"`
}

// MultiplierHistory returns every tier-multiplier version, by tier, newest
// first.
func (s *Store) MultiplierHistory(ctx context.Context) ([]MultiplierVersion, error) {
	rows, err := s.db.Query(ctx, `SELECT tier, multiplier_bp, effective_from FROM tier_multipliers ORDER BY tier, effective_from DESC`)
	if err != nil {
		return nil, mapErr("loading multiplier history", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (MultiplierVersion, error) {
		var v MultiplierVersion
		err := r.Scan(&v.Tier, &v.MultiplierBP, &v.EffectiveFrom)
		v.EffectiveFrom = v.EffectiveFrom.UTC()
		return v, err
	})
	return out, mapErr("loading multiplier history", err)
}

// TeamValues is a team as admins edit it and the audit log records it.
type TeamValues struct {
	Slug                  string         `json:"slug"`
	Name                  string         `json:"name"`
	CostCenter            string         `json:"cost_center"`
	MonthlyBudgetGPUHours int64          `json:"monthly_budget_gpu_hours"`
	Guarantees            map[string]int `json:"guarantees"`
	FairShareWeight       int            `json:"fair_share_weight"`
	WebhookURL            string         `json:"webhook_url"`
	// PosixAccount is the team's service account ("" = none): its jobs run
	// as it when their submitter has no account.
	PosixAccount string `json:"posix_account"`
}

// TeamValuesOf returns t's values with its webhook; zero guarantees are
// left out.
func TeamValuesOf(t allot.Team, webhook string) TeamValues {
	g := map[string]int{}
	for k, v := range t.Guarantees {
		if v != 0 {
			g[k] = v
		}
	}
	return TeamValues{Slug: t.Slug, Name: t.Name, CostCenter: t.CostCenter, MonthlyBudgetGPUHours: t.MonthlyBudgetGPUHours,
		Guarantees: g, FairShareWeight: t.FairShareWeight, WebhookURL: webhook, PosixAccount: t.PosixAccount}
}

// checkGuarantees refuses guarantees on GPU types that do not exist.
func (s *Store) checkGuarantees(ctx context.Context, g map[string]int) error {
	types, err := s.ListGPUTypes(ctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, t := range types {
		known[t.Name] = true
	}
	for _, k := range slices.Sorted(maps.Keys(g)) {
		if !known[k] {
			return (allot.FieldErrors{"guarantees": fmt.Sprintf("unknown GPU type %q", k)}).Err()
		}
	}
	return nil
}

// CreateTeamPolicy creates a team (with its guarantees and webhook) as a
// policy change.
func (s *Store) CreateTeamPolicy(ctx context.Context, c PolicyChange, t allot.Team, webhook string) (AdminResult, error) {
	if err := t.Validate(); err != nil {
		return AdminResult{}, err
	}
	return s.changeIfAny(ctx, c, func(tx *Store, _ *allot.Policy) (any, any, error) {
		var exists bool
		if err := tx.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM teams WHERE slug = $1)`, t.Slug).Scan(&exists); err != nil {
			return nil, nil, mapErr("checking team", err)
		}
		if exists {
			return nil, nil, (allot.FieldErrors{"slug": fmt.Sprintf("team %q already exists", t.Slug)}).Err()
		}
		if err := tx.checkGuarantees(ctx, t.Guarantees); err != nil {
			return nil, nil, err
		}
		v := TeamValuesOf(t, webhook)
		t.Guarantees = v.Guarantees
		if err := tx.CreateTeam(ctx, &t); err != nil {
			return nil, nil, err
		}
		if webhook != "" {
			if err := tx.SetTeamWebhook(ctx, t.Slug, webhook); err != nil {
				return nil, nil, err
			}
		}
		return nil, v, nil
	})
}

// UpdateTeamPolicy edits team slug with apply (which only assigns fields:
// the team and its webhook URL).
func (s *Store) UpdateTeamPolicy(ctx context.Context, c PolicyChange, slug string, apply func(t *allot.Team, webhook *string)) (AdminResult, error) {
	return s.changeIfAny(ctx, c, func(tx *Store, _ *allot.Policy) (any, any, error) {
		old, err := tx.GetTeam(ctx, slug)
		if err != nil {
			return nil, nil, err
		}
		oldHook, err := tx.TeamWebhook(ctx, slug)
		if err != nil {
			return nil, nil, err
		}
		t, hook := old, oldHook
		t.Guarantees = maps.Clone(old.Guarantees)
		apply(&t, &hook)
		t.Slug = old.Slug
		if err := t.Validate(); err != nil {
			return nil, nil, err
		}
		if err := tx.checkGuarantees(ctx, t.Guarantees); err != nil {
			return nil, nil, err
		}
		before, after := TeamValuesOf(old, oldHook), TeamValuesOf(t, hook)
		if _, err := tx.db.Exec(ctx, `
			UPDATE teams SET name = $2, cost_center = $3, monthly_budget_gpu_hours = $4, fair_share_weight = $5, webhook_url = $6, posix_account = $7
			WHERE slug = $1`, slug, t.Name, t.CostCenter, t.MonthlyBudgetGPUHours, t.FairShareWeight, hook, t.PosixAccount); err != nil {
			return nil, nil, mapErr("updating team", err)
		}
		if _, err := tx.db.Exec(ctx, `DELETE FROM team_guarantees WHERE team = $1`, slug); err != nil {
			return nil, nil, mapErr("updating team guarantees", err)
		}
		for _, typ := range slices.Sorted(maps.Keys(after.Guarantees)) {
			if _, err := tx.db.Exec(ctx, `INSERT INTO team_guarantees (team, gpu_type, gpus) VALUES ($1, $2, $3)`, slug, typ, after.Guarantees[typ]); err != nil {
				return nil, nil, mapErr("updating team guarantees", err)
			}
		}
		return before, after, nil
	})
}

// PolicyValues are the policy's scalar settings as admins edit them and the
// audit log records them. Durations are whole seconds; the JSON names are
// the field names Policy.Validate reports.
type PolicyValues struct {
	QueueOrder            string `json:"queue_order"` // allot.QueueOrderResponse or allot.QueueOrderMultifactor
	Tier1FIFO             bool   `json:"tier1_fifo"`  // tier-1 jobs oldest first (allot.Policy.Tier1FIFO)
	WeightFairShare       int    `json:"weight_fair_share"`
	WeightSize            int    `json:"weight_size"`
	WeightAge             int    `json:"weight_age"`
	MaxAgeS               int64  `json:"max_age_s"`
	HalfLifeS             int64  `json:"half_life_s"`
	GracePeriodS          int64  `json:"grace_period_s"`
	MinRuntimeS           int64  `json:"min_runtime_s"`
	CycleS                int64  `json:"cycle_s"`
	BudgetWarnPct         int    `json:"budget_warn_pct"`
	BudgetDemotePct       int    `json:"budget_demote_pct"`
	BurstPendingGPUHours  int    `json:"burst_pending_gpu_hours"`
	BurstMeanWaitS        int64  `json:"burst_mean_wait_s"`
	BurstReleaseGPUHours  int    `json:"burst_release_gpu_hours"`
	BurstMaxNodes         int    `json:"burst_max_nodes"`
	BurstMonthlyBudget    string `json:"burst_monthly_budget"` // decimal; 0 = no cap
	HeartbeatMissedAfterS int64  `json:"heartbeat_missed_after_s"`
	AutoUndrainAfterS     int64  `json:"auto_undrain_after_s"`
	MaxLossRequeues       int    `json:"max_loss_requeues"` // 0: no limit
}

func wholeSecs(d time.Duration) int64 { return int64(d / time.Second) }

// PolicyValuesOf returns p's scalar settings.
func PolicyValuesOf(p allot.Policy) PolicyValues {
	return PolicyValues{QueueOrder: p.QueueOrder, Tier1FIFO: p.Tier1FIFO, WeightFairShare: p.WeightFairShare, WeightSize: p.WeightSize, WeightAge: p.WeightAge,
		MaxAgeS: wholeSecs(p.MaxAge), HalfLifeS: wholeSecs(p.HalfLife), GracePeriodS: wholeSecs(p.GracePeriod), MinRuntimeS: wholeSecs(p.MinRuntime),
		CycleS: wholeSecs(p.Cycle), BudgetWarnPct: p.BudgetWarnPct, BudgetDemotePct: p.BudgetDemotePct,
		BurstPendingGPUHours: p.BurstPendingGPUHours, BurstMeanWaitS: wholeSecs(p.BurstMeanWait), BurstReleaseGPUHours: p.BurstReleaseGPUHours,
		BurstMaxNodes: p.BurstMaxNodes, BurstMonthlyBudget: allot.Money{Micros: p.BurstMonthlyBudget.Micros}.Decimal(),
		HeartbeatMissedAfterS: wholeSecs(p.HeartbeatMissedAfter), AutoUndrainAfterS: wholeSecs(p.AutoUndrainAfter), MaxLossRequeues: p.MaxLossRequeues}
}

// MaxDurationSecs is the most seconds any duration setting accepts (ten
// years): checked before seconds become a time.Duration, which would wrap
// around for huge values.
const MaxDurationSecs = 10 * 365 * 24 * 3600

const secsPerDay = 24 * 3600

// policyMaxSecs bounds each duration setting of the policy, in seconds.
var policyMaxSecs = map[string]int64{
	"max_age_s":                365 * secsPerDay, // the age factor saturates after this
	"half_life_s":              365 * secsPerDay, // fair-share usage decay
	"grace_period_s":           1 * secsPerDay,   // a preempted job's time to stop
	"min_runtime_s":            7 * secsPerDay,   // protection from preemption
	"cycle_s":                  3600,             // the scheduler runs at least hourly
	"burst_mean_wait_s":        30 * secsPerDay,
	"heartbeat_missed_after_s": 1 * secsPerDay,
	"auto_undrain_after_s":     30 * secsPerDay,
}

// CheckSecs adds a field error to f when secs is more than max (or
// MaxDurationSecs, whichever is less) and returns secs as a duration, or 0
// when it is out of range. Negative values pass (Validate reports them).
func CheckSecs(f allot.FieldErrors, field string, secs, max int64) time.Duration {
	max = min(max, MaxDurationSecs)
	if secs > max {
		f.Add(field, "must be at most %d (%s)", max, allot.FormatDuration(time.Duration(max)*time.Second))
		return 0
	}
	if secs < -MaxDurationSecs {
		f.Add(field, "must not be negative")
		return 0
	}
	return time.Duration(secs) * time.Second
}

// applyTo sets p's scalar settings to v.
func (v PolicyValues) applyTo(p *allot.Policy) error {
	f := allot.FieldErrors{}
	d := func(field string, s int64) time.Duration { return CheckSecs(f, field, s, policyMaxSecs[field]) }
	m, err := allot.ParseMoney(v.BurstMonthlyBudget, "USD")
	if err != nil {
		f.Add("burst_monthly_budget", "%s", err.Error())
	}
	maxAge, halfLife, grace, minRun, cycle := d("max_age_s", v.MaxAgeS), d("half_life_s", v.HalfLifeS), d("grace_period_s", v.GracePeriodS),
		d("min_runtime_s", v.MinRuntimeS), d("cycle_s", v.CycleS)
	meanWait, missed, undrain := d("burst_mean_wait_s", v.BurstMeanWaitS), d("heartbeat_missed_after_s", v.HeartbeatMissedAfterS), d("auto_undrain_after_s", v.AutoUndrainAfterS)
	if err := f.Err(); err != nil {
		return err
	}
	p.QueueOrder, p.Tier1FIFO = v.QueueOrder, v.Tier1FIFO
	p.WeightFairShare, p.WeightSize, p.WeightAge = v.WeightFairShare, v.WeightSize, v.WeightAge
	p.MaxAge, p.HalfLife, p.GracePeriod, p.MinRuntime, p.Cycle = maxAge, halfLife, grace, minRun, cycle
	p.BudgetWarnPct, p.BudgetDemotePct = v.BudgetWarnPct, v.BudgetDemotePct
	p.BurstPendingGPUHours, p.BurstMeanWait, p.BurstReleaseGPUHours = v.BurstPendingGPUHours, meanWait, v.BurstReleaseGPUHours
	p.BurstMaxNodes, p.BurstMonthlyBudget.Micros = v.BurstMaxNodes, m.Micros
	p.HeartbeatMissedAfter, p.AutoUndrainAfter = missed, undrain
	p.MaxLossRequeues = v.MaxLossRequeues
	return nil
}

// UpdatePolicy edits the policy's scalar settings with apply (health rules
// are kept as they are). An error from apply aborts the change: no
// version, no audit entry.
func (s *Store) UpdatePolicy(ctx context.Context, c PolicyChange, apply func(*PolicyValues) error) (AdminResult, error) {
	return s.changeIfAny(ctx, c, func(_ *Store, p *allot.Policy) (any, any, error) {
		before := PolicyValuesOf(*p)
		after := before
		if err := apply(&after); err != nil {
			return nil, nil, err
		}
		if err := after.applyTo(p); err != nil {
			return nil, nil, err
		}
		if err := p.Validate(); err != nil {
			return nil, nil, err
		}
		return before, PolicyValuesOf(*p), nil
	})
}

// AuditActors returns everyone who appears in the audit log, sorted.
func (s *Store) AuditActors(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT DISTINCT actor FROM audit_log ORDER BY actor`)
	if err != nil {
		return nil, mapErr("listing audit actors", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, mapErr("listing audit actors", err)
}

// AuditKinds returns the object kinds (the part of actions before the
// dot) that appear in the audit log, sorted.
func (s *Store) AuditKinds(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT DISTINCT split_part(action, '.', 1) AS kind FROM audit_log ORDER BY kind`)
	if err != nil {
		return nil, mapErr("listing audit kinds", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, mapErr("listing audit kinds", err)
}
