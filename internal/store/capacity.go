package store

import (
	"context"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/jackc/pgx/v5"
)

// Capacity: what the cluster's GPUs did in a month, per GPU type and site,
// in exact GPU-seconds, from node_state_history (migration 0025) and the
// allocations. Every registered GPU-second is exactly one of
//
//   - allocated: an allocation held the GPU (whatever the node's state:
//     a draining node's jobs still run, and are billed);
//   - drained/down: not allocated, the node draining, drained or down;
//   - idle: not allocated, the node up.
//
// so registered = allocated + idle + drained/down, per row and in total.
// Instants are whole seconds (allocations are stored floored to the
// second, the history is written so), so the sums are exact integers.

// CapacityRow is one GPU type at one site in a month.
type CapacityRow struct {
	GPUType                string
	Site                   string
	RegisteredGPUSeconds   int64
	AllocatedGPUSeconds    int64
	IdleGPUSeconds         int64
	DrainedDownGPUSeconds  int64
	CostPerGPUHour         *allot.Money // owned capacity's cost; nil: not set, or a cloud row
	CapacityCost           allot.Money  // registered × cost (zero without a cost)
	UnrecoveredCost        allot.Money  // (registered − allocated) × cost
	UnrecoveredGPUSeconds  int64        // registered − allocated
	capacityCostMicrosNull *int64
}

// Capacity is a month's capacity report.
type Capacity struct {
	Month    billing.YearMonth
	From, To time.Time // the period covered: the month, up to now for this month
	Currency string
	Rows     []CapacityRow
	Total    CapacityRow // sums of the rows (GPUType, Site empty)
	// AllocatedOutsideGPUSeconds are allocations in the month on GPUs no
	// registered capacity covered (a burst node after its release started,
	// a node before its first registration, a GPU index beyond the node's
	// count, history from before migration 0025): billed, but not in Rows.
	AllocatedOutsideGPUSeconds int64
}

// CapacityOf computes month m's capacity up to the store's now (a future
// month has no rows).
func (s *Store) CapacityOf(ctx context.Context, m billing.YearMonth) (Capacity, error) {
	now := s.Now().UTC().Truncate(time.Second)
	out := Capacity{Month: m, From: m.Start(), To: m.End()}
	if now.Before(out.To) {
		out.To = now
	}
	if err := s.db.QueryRow(ctx, `SELECT coalesce((SELECT currency FROM gpu_rates ORDER BY id LIMIT 1), 'USD')`).Scan(&out.Currency); err != nil {
		return out, mapErr("loading currency", err)
	}
	if !out.From.Before(out.To) {
		out.To = out.From
		return out, nil
	}
	rows, err := s.db.Query(ctx, `
		WITH h AS (
			SELECT node, at, state, gpu_type, gpus, site, registered,
				lead(at) OVER (PARTITION BY node ORDER BY at, id) AS until
			FROM node_state_history WHERE at < $2
		), iv AS (
			SELECT node, state, gpu_type, gpus, site, greatest(at, $1) AS f, least(coalesce(until, $2), $2) AS t
			FROM h WHERE registered AND gpus > 0 AND coalesce(until, $2) > $1
		), cap AS (
			SELECT gpu_type, site, state = 'up' AS up, sum(gpus * extract(epoch FROM t - f))::bigint AS secs
			FROM iv WHERE t > f GROUP BY 1, 2, 3
		), used AS (
			SELECT iv.gpu_type, iv.site, iv.state = 'up' AS up,
				sum(extract(epoch FROM least(coalesce(a.released_at, $2), iv.t) - greatest(a.started_at, iv.f)))::bigint AS secs
			FROM iv JOIN allocations a ON a.node = iv.node AND a.gpu_index < iv.gpus
				AND a.started_at < iv.t AND coalesce(a.released_at, 'infinity') > iv.f
			WHERE iv.t > iv.f
			GROUP BY 1, 2, 3
		)
		SELECT c.gpu_type, c.site,
			coalesce(sum(c.secs), 0)::bigint,
			coalesce(sum(u.secs), 0)::bigint,
			coalesce(sum(c.secs - coalesce(u.secs, 0)) FILTER (WHERE c.up), 0)::bigint,
			coalesce(sum(c.secs - coalesce(u.secs, 0)) FILTER (WHERE NOT c.up), 0)::bigint,
			(SELECT g.capacity_cost_micros FROM gpu_types g WHERE g.name = c.gpu_type)
		FROM cap c LEFT JOIN used u USING (gpu_type, site, up)
		GROUP BY 1, 2 ORDER BY 1, 2`, out.From, out.To)
	if err != nil {
		return out, mapErr("computing capacity", err)
	}
	out.Rows, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (CapacityRow, error) {
		var c CapacityRow
		err := r.Scan(&c.GPUType, &c.Site, &c.RegisteredGPUSeconds, &c.AllocatedGPUSeconds, &c.IdleGPUSeconds, &c.DrainedDownGPUSeconds,
			&c.capacityCostMicrosNull)
		return c, err
	})
	if err != nil {
		return out, mapErr("computing capacity", err)
	}
	var all int64
	err = s.db.QueryRow(ctx, `
		SELECT coalesce(sum(extract(epoch FROM least(coalesce(released_at, $2), $2) - greatest(started_at, $1))), 0)::bigint
		FROM allocations WHERE started_at < $2 AND coalesce(released_at, 'infinity') > $1`, out.From, out.To).Scan(&all)
	if err != nil {
		return out, mapErr("computing capacity", err)
	}
	t := CapacityRow{CapacityCost: allot.Money{Currency: out.Currency}, UnrecoveredCost: allot.Money{Currency: out.Currency}}
	for i := range out.Rows {
		c := &out.Rows[i]
		c.UnrecoveredGPUSeconds = c.RegisteredGPUSeconds - c.AllocatedGPUSeconds
		c.CapacityCost, c.UnrecoveredCost = allot.Money{Currency: out.Currency}, allot.Money{Currency: out.Currency}
		if c.capacityCostMicrosNull != nil && c.Site == string(allot.SiteOnPrem) {
			cost := allot.Money{Micros: *c.capacityCostMicrosNull, Currency: out.Currency}
			c.CostPerGPUHour = &cost
			if c.CapacityCost, err = billing.LineAmount(c.RegisteredGPUSeconds, cost.Micros, 10000, out.Currency); err != nil {
				return out, err
			}
			if c.UnrecoveredCost, err = billing.LineAmount(c.UnrecoveredGPUSeconds, cost.Micros, 10000, out.Currency); err != nil {
				return out, err
			}
		}
		c.capacityCostMicrosNull = nil
		t.RegisteredGPUSeconds += c.RegisteredGPUSeconds
		t.AllocatedGPUSeconds += c.AllocatedGPUSeconds
		t.IdleGPUSeconds += c.IdleGPUSeconds
		t.DrainedDownGPUSeconds += c.DrainedDownGPUSeconds
		t.UnrecoveredGPUSeconds += c.UnrecoveredGPUSeconds
		t.CapacityCost.Micros += c.CapacityCost.Micros
		t.UnrecoveredCost.Micros += c.UnrecoveredCost.Micros
	}
	out.Total = t
	out.AllocatedOutsideGPUSeconds = all - t.AllocatedGPUSeconds
	return out, nil
}

// ChargeSum is the amount of a month's charge lines (charges, credits and
// adjustments) of one team, GPU type and tier.
type ChargeSum struct {
	Month   billing.YearMonth
	Team    string
	GPUType string
	Tier    string
	Micros  int64
}

// ChargeSums sums the charge lines of months from..to (inclusive) by
// month, team, GPU type and tier, for teams (nil: every team), and says
// the lines' currency ("" when there are none).
func (s *Store) ChargeSums(ctx context.Context, from, to billing.YearMonth, teams []string) ([]ChargeSum, string, error) {
	rows, err := s.db.Query(ctx, `
		SELECT month, team, gpu_type, tier, sum(amount_micros)::bigint, min(currency)
		FROM charge_lines WHERE month BETWEEN $1 AND $2 AND ($3::text[] IS NULL OR team = ANY($3))
		GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4`, from.Start(), to.Start(), teams)
	if err != nil {
		return nil, "", mapErr("summing charges", err)
	}
	cur := ""
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ChargeSum, error) {
		var c ChargeSum
		var month time.Time
		var cc string
		err := r.Scan(&month, &c.Team, &c.GPUType, &c.Tier, &c.Micros, &cc)
		c.Month, cur = billing.Month(month), cc
		return c, err
	})
	return out, cur, mapErr("summing charges", err)
}

// SeedNodeHistory replaces the named nodes' recorded history with one
// state: up, registered capacity since at. It is for a seeded cluster (the
// demo) whose usage history starts before the seed created its nodes:
// they were there all along. Their agents' registrations are recorded
// after it as usual.
func (s *Store) SeedNodeHistory(ctx context.Context, nodes []string, at time.Time) error {
	_, err := s.db.Exec(ctx, `WITH gone AS (DELETE FROM node_state_history WHERE node = ANY($1))
		INSERT INTO node_state_history (node, at, state, gpu_type, gpus, site, registered)
		SELECT n.name, date_trunc('second', $2::timestamptz), 'up', n.gpu_type, n.gpu_count, n.site, true
		FROM nodes n WHERE n.name = ANY($1) ORDER BY n.name`, nodes, at)
	return mapErr("seeding node history", err)
}
