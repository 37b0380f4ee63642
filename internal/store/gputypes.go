package store

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/jackc/pgx/v5"
)

// GPU types as admins manage them: created with their memory and hourly
// rate, edited, retired (never deleted: usage, rates and nodes keep naming
// them). Every change runs through changeIfAny (a policy version and an
// audit entry); a rate change is SetRatePolicy's.

// GPUTypeInfo is a GPU type with its rate in force now, whether it is
// retired, and how many nodes are of it.
type GPUTypeInfo struct {
	allot.GPUType
	RetiredAt time.Time // zero: in use
	Nodes     int
	// CapacityCost is one GPU-hour of owned capacity's cost, in the rate
	// card's currency (capacity report); nil: not set.
	CapacityCost *allot.Money
}

// Retired says whether the type is retired.
func (g *GPUTypeInfo) Retired() bool { return !g.RetiredAt.IsZero() }

// GPUTypeValues is one GPU type as the audit log records it.
type GPUTypeValues struct {
	Name     string `json:"name"`
	MemoryGB int    `json:"memory_gb"`
	Rate     string `json:"hourly_rate,omitempty"` // per GPU-hour at multiplier 1, decimal (creation only)
	Currency string `json:"currency,omitempty"`
	Retired  bool   `json:"retired"`
	Backend  string `json:"backend,omitempty"` // creation only
	// CapacityCost per GPU-hour of owned capacity, decimal; "" not set.
	CapacityCost string `json:"capacity_cost,omitempty"`
}

// GPUTypeInfos lists every GPU type by name, retired ones too.
func (s *Store) GPUTypeInfos(ctx context.Context) ([]GPUTypeInfo, error) {
	rows, err := s.db.Query(ctx, `
		SELECT g.name, g.memory_gb, coalesce(r.rate_micros, 0), coalesce(r.currency, 'USD'), g.retired_at,
			(SELECT count(*) FROM nodes n WHERE n.gpu_type = g.name), g.capacity_cost_micros, g.backend
		FROM gpu_types g
		LEFT JOIN LATERAL (
			SELECT rate_micros, currency FROM gpu_rates
			WHERE gpu_type = g.name AND effective_from <= $1
			ORDER BY effective_from DESC LIMIT 1) r ON true
		ORDER BY g.name`, s.Now())
	if err != nil {
		return nil, mapErr("listing GPU types", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (GPUTypeInfo, error) {
		var g GPUTypeInfo
		var retired *time.Time
		var capCost *int64
		err := r.Scan(&g.Name, &g.MemoryGB, &g.HourlyRate.Micros, &g.HourlyRate.Currency, &retired, &g.Nodes, &capCost, &g.Backend)
		if retired != nil {
			g.RetiredAt = retired.UTC()
		}
		if capCost != nil {
			g.CapacityCost = &allot.Money{Micros: *capCost, Currency: g.HourlyRate.Currency}
		}
		return g, err
	})
	return out, mapErr("listing GPU types", err)
}

// GPUTypeInfo returns one GPU type (ENotFound if there is none).
func (s *Store) GPUTypeInfo(ctx context.Context, name string) (GPUTypeInfo, error) {
	all, err := s.GPUTypeInfos(ctx)
	if err != nil {
		return GPUTypeInfo{}, err
	}
	for _, g := range all {
		if g.Name == name {
			return g, nil
		}
	}
	return GPUTypeInfo{}, allot.Errorf(allot.ENotFound, "no GPU type %q", name)
}

// CreateGPUTypeAudited adds GPU type g with its hourly rate, in force from
// now on, as one audited policy change (gpu_type.create). A name that
// exists, bad fields, or a currency other than the rate card's are field
// errors and change nothing.
func (s *Store) CreateGPUTypeAudited(ctx context.Context, c PolicyChange, g allot.GPUType) (AdminResult, error) {
	g.Name = strings.TrimSpace(g.Name)
	f := allot.FieldErrors{}
	if err := g.Validate(); err != nil {
		for k, v := range allot.Fields(err) {
			f.Add(k, "%s", v)
		}
	}
	if g.MemoryGB > 4096 {
		f.Add("memory_gb", "must be at most 4096")
	}
	if g.HourlyRate.Micros > billing.MaxRateMicros {
		f.Add("hourly_rate", "must be between 0 and 1000000 per GPU-hour")
	}
	if err := f.Err(); err != nil {
		return AdminResult{}, err
	}
	if c.Action == "" {
		c.Action = "gpu_type.create"
	}
	if c.Object == "" {
		c.Object = "gpu_type:" + g.Name
	}
	return s.changeIfAny(ctx, c, func(tx *Store, _ *allot.Policy) (any, any, error) {
		var exists bool
		if err := tx.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM gpu_types WHERE lower(name) = lower($1))`, g.Name).Scan(&exists); err != nil {
			return nil, nil, mapErr("checking GPU type", err)
		}
		if exists {
			return nil, nil, (allot.FieldErrors{"name": fmt.Sprintf("a GPU type %q exists already: edit it instead", g.Name)}).Err()
		}
		var cur string
		err := tx.db.QueryRow(ctx, `SELECT currency FROM gpu_rates ORDER BY id LIMIT 1`).Scan(&cur)
		if err != nil && err != pgx.ErrNoRows {
			return nil, nil, mapErr("checking currency", err)
		}
		if cur != "" && cur != g.HourlyRate.Currency {
			return nil, nil, (allot.FieldErrors{"currency": fmt.Sprintf("all rates are in %s, not %s", cur, g.HourlyRate.Currency)}).Err()
		}
		if err := tx.CreateGPUType(ctx, &g, tx.Now().UTC().Truncate(time.Second)); err != nil {
			return nil, nil, err
		}
		return nil, GPUTypeValues{Name: g.Name, MemoryGB: g.MemoryGB, Rate: g.HourlyRate.Decimal(), Currency: g.HourlyRate.Currency, Backend: g.Backend}, nil
	})
}

// GPUTypeUpdate is an edit of a GPU type; nil fields keep their value.
type GPUTypeUpdate struct {
	MemoryGB *int
	Retired  *bool
	// Rate is a new hourly rate, in force from now on (from the second
	// after the newest rate's start, when that is now).
	Rate *allot.Money
	// SetCapacityCost sets the cost of one GPU-hour of owned capacity to
	// CapacityCost (nil: not set any more), in the rate card's currency.
	SetCapacityCost bool
	CapacityCost    *allot.Money
}

// UpdateGPUType edits a GPU type's memory or retires (or reinstates) it,
// as one audited policy change (gpu_type.update, gpu_type.retire). A
// retired type keeps its nodes, rates and history; no new node can be
// declared with it. Nothing to change changes nothing.
func (s *Store) UpdateGPUType(ctx context.Context, c PolicyChange, name string, u GPUTypeUpdate) (AdminResult, error) {
	if u.MemoryGB != nil && (*u.MemoryGB <= 0 || *u.MemoryGB > 4096) {
		return AdminResult{}, (allot.FieldErrors{"memory_gb": "must be between 1 and 4096"}).Err()
	}
	if u.Rate != nil && (u.Rate.Micros < 0 || u.Rate.Micros > billing.MaxRateMicros) {
		return AdminResult{}, (allot.FieldErrors{"hourly_rate": "must be between 0 and 1000000 per GPU-hour"}).Err()
	}
	if u.SetCapacityCost && u.CapacityCost != nil && (u.CapacityCost.Micros < 0 || u.CapacityCost.Micros > billing.MaxRateMicros) {
		return AdminResult{}, (allot.FieldErrors{"capacity_cost": "must be between 0 and 1000000 per GPU-hour"}).Err()
	}
	if c.Action == "" {
		c.Action = "gpu_type.update"
		if u.Retired != nil && *u.Retired && u.MemoryGB == nil {
			c.Action = "gpu_type.retire"
		}
	}
	if c.Object == "" {
		c.Object = "gpu_type:" + name
	}
	return s.changeIfAny(ctx, c, func(tx *Store, _ *allot.Policy) (any, any, error) {
		var before GPUTypeValues
		var retired *time.Time
		var capCost *int64
		err := tx.db.QueryRow(ctx, `SELECT name, memory_gb, retired_at, capacity_cost_micros FROM gpu_types WHERE name = $1 FOR UPDATE`, name).
			Scan(&before.Name, &before.MemoryGB, &retired, &capCost)
		if err == pgx.ErrNoRows {
			return nil, nil, allot.Errorf(allot.ENotFound, "no GPU type %q", name)
		}
		if err != nil {
			return nil, nil, mapErr("loading GPU type", err)
		}
		before.Retired = retired != nil
		var micros int64
		var latest time.Time
		err = tx.db.QueryRow(ctx, `SELECT rate_micros, currency, (SELECT max(effective_from) FROM gpu_rates WHERE gpu_type = $1)
			FROM gpu_rates WHERE gpu_type = $1 AND effective_from <= $2 ORDER BY effective_from DESC LIMIT 1`, name, tx.Now()).Scan(&micros, &before.Currency, &latest)
		if err != nil && err != pgx.ErrNoRows {
			return nil, nil, mapErr("loading rate", err)
		}
		before.Rate = allot.Money{Micros: micros, Currency: before.Currency}.Decimal()
		if capCost != nil {
			before.CapacityCost = allot.Money{Micros: *capCost}.Decimal()
		}
		after := before
		if u.SetCapacityCost {
			after.CapacityCost, capCost = "", nil
			if u.CapacityCost != nil {
				if before.Currency != "" && u.CapacityCost.Currency != before.Currency {
					return nil, nil, (allot.FieldErrors{"capacity_cost": fmt.Sprintf("costs are in the rate card's currency, %s, not %s", before.Currency, u.CapacityCost.Currency)}).Err()
				}
				after.CapacityCost, capCost = u.CapacityCost.Decimal(), &u.CapacityCost.Micros
			}
		}
		if u.MemoryGB != nil {
			after.MemoryGB = *u.MemoryGB
		}
		if u.Retired != nil {
			after.Retired = *u.Retired
		}
		if u.Rate != nil {
			if before.Currency != "" && u.Rate.Currency != before.Currency {
				return nil, nil, (allot.FieldErrors{"currency": fmt.Sprintf("all rates are in %s, not %s", before.Currency, u.Rate.Currency)}).Err()
			}
			after.Rate, after.Currency = u.Rate.Decimal(), u.Rate.Currency
		}
		if after == before {
			return before, after, nil
		}
		if after.Rate != before.Rate || after.Currency != before.Currency {
			from := tx.Now().UTC().Truncate(time.Second)
			if !latest.Before(from) {
				from = latest.UTC().Add(time.Second)
			}
			if err := tx.SetRateChecked(ctx, name, *u.Rate, from); err != nil {
				return nil, nil, err
			}
		}
		var at *time.Time
		if after.Retired {
			now := tx.Now()
			at = &now
			if retired != nil {
				at = retired
			}
		}
		if _, err := tx.db.Exec(ctx, `UPDATE gpu_types SET memory_gb = $2, retired_at = $3, capacity_cost_micros = $4 WHERE name = $1`, name, after.MemoryGB, at, capCost); err != nil {
			return nil, nil, mapErr("updating GPU type", err)
		}
		return before, after, nil
	})
}

// checkGPUTypeUsable says, as a field error, why gpuType cannot be
// declared for a new node: it does not exist (naming the ones that do), or
// it is retired.
func (s *Store) checkGPUTypeUsable(ctx context.Context, gpuType string) error {
	all, err := s.GPUTypeInfos(ctx)
	if err != nil {
		return err
	}
	var usable []string
	for _, g := range all {
		if g.Name == gpuType {
			if g.Retired() {
				return (allot.FieldErrors{"gpu_type": fmt.Sprintf("GPU type %q is retired", gpuType)}).Err()
			}
			return nil
		}
		if !g.Retired() {
			usable = append(usable, g.Name)
		}
	}
	msg := fmt.Sprintf("unknown GPU type %q: ", gpuType)
	if len(usable) == 0 {
		msg += "there are none yet; an admin creates one with `allot gpu-type create` or on /admin/gpu-types"
	} else {
		msg += "use one of " + strings.Join(usable, ", ") + ", or create it with `allot gpu-type create`"
	}
	return (allot.FieldErrors{"gpu_type": msg}).Err()
}

// CreateNodeDeclared adds node n (down until its agent registers), with
// the GPU type and count its admin declares, after checking that the type
// exists and is not retired; labels, when given, are set in the same
// transaction. It is audited as node.create by actor.
func (s *Store) CreateNodeDeclared(ctx context.Context, actor string, n allot.Node, labels allot.NodeLabels) error {
	if n.State == "" {
		n.State = allot.NodeDown
	}
	if err := n.Validate(); err != nil {
		return err
	}
	if err := labels.Validate(); err != nil {
		return err
	}
	if err := s.checkGPUTypeUsable(ctx, n.GPUType); err != nil {
		return err
	}
	if labels == nil {
		labels = allot.NodeLabels{}
	}
	lb, err := json.Marshal(labels)
	if err != nil {
		return err
	}
	return s.InTx(ctx, func(tx *Store) error {
		_, err := tx.db.Exec(ctx, `INSERT INTO nodes (name, gpu_type, gpu_count, declared_gpus, site, domain, rack, state, labels)
			VALUES ($1, $2, $3, $3, $4, $5, $6, $7, $8)`, n.Name, n.GPUType, n.GPUCount, n.Site, n.Domain, n.Rack, n.State, lb)
		if err != nil {
			return mapErr("creating node", err)
		}
		after := fmt.Sprintf(`{"name":%q,"gpu_type":%q,"gpus":%d,"site":%q,"domain":%q,"rack":%q}`, n.Name, n.GPUType, n.GPUCount, n.Site, n.Domain, n.Rack)
		return tx.Audit(ctx, &allot.AuditEntry{Actor: actor, Action: "node.create", Object: "node:" + n.Name, After: []byte(after)})
	})
}

// InventoryNote says how what an agent registered differs from what its
// node was declared as: another GPU count (declared > 0), or GPUs of
// another model than the declared type (by the model's name, when the
// type's name names a model such as A100 or H100, or by memory, more than
// 10 % or 2 GB off). "" when they agree.
func InventoryNote(gpuType string, typeMemGB, declared int, gpus []NodeGPU) string {
	countOff := declared > 0 && declared != len(gpus)
	modelOff := false
	var models []string
	for _, g := range gpus {
		if !slices.Contains(models, g.Model) {
			models = append(models, g.Model)
		}
		if !modelMatches(gpuType, typeMemGB, g.Model, g.MemoryMiB) {
			modelOff = true
		}
	}
	if !countOff && !modelOff {
		return ""
	}
	desc := strings.Join(models, ", ")
	if len(gpus) > 0 && gpus[0].MemoryMiB > 0 {
		desc += fmt.Sprintf(" (%d GB)", (gpus[0].MemoryMiB+512)/1024)
	}
	decl := fmt.Sprintf("%d × %s", declared, gpuType)
	if declared <= 0 {
		decl = gpuType
	}
	if typeMemGB > 0 {
		decl += fmt.Sprintf(" (%d GB)", typeMemGB)
	}
	return fmt.Sprintf("registered %d GPUs of %s; declared %s", len(gpus), desc, decl)
}

var modelTokenRE = regexp.MustCompile(`^[a-z]+[0-9]+[a-z]*$`)
var memTokenRE = regexp.MustCompile(`^[0-9]+gb$`)

func nameTokens(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') })
}

func modelMatches(gpuType string, typeMemGB int, model string, memMiB int64) bool {
	have := nameTokens(model)
	for _, t := range nameTokens(gpuType) {
		if modelTokenRE.MatchString(t) && !memTokenRE.MatchString(t) && !slices.Contains(have, t) {
			return false
		}
	}
	if typeMemGB > 0 && memMiB > 0 {
		gb := float64(memMiB) / 1024
		tol := max(2, float64(typeMemGB)/10)
		if d := gb - float64(typeMemGB); d > tol || d < -tol {
			return false
		}
	}
	return true
}

// noteInventory records, at a registration, how the agent's GPUs differ
// from what node was declared as (InventoryNote; "" when they agree).
func (s *Store) noteInventory(ctx context.Context, node string, gpus []NodeGPU) error {
	var gpuType string
	var declared, memGB int
	err := s.db.QueryRow(ctx, `SELECT n.gpu_type, coalesce(n.declared_gpus, 0), coalesce(g.memory_gb, 0)
		FROM nodes n LEFT JOIN gpu_types g ON g.name = n.gpu_type WHERE n.name = $1`, node).Scan(&gpuType, &declared, &memGB)
	if err == pgx.ErrNoRows {
		return nil
	}
	if err != nil {
		return mapErr("registering node", err)
	}
	note := InventoryNote(gpuType, memGB, declared, gpus)
	_, err = s.db.Exec(ctx, `UPDATE nodes SET inventory_note = $2 WHERE name = $1 AND inventory_note <> $2`, node, note)
	return mapErr("registering node", err)
}

// InventoryNoteOf returns node's inventory note ("" when its agent's GPUs
// are what it was declared with, or it never registered).
func (s *Store) InventoryNoteOf(ctx context.Context, node string) (string, error) {
	var note string
	err := s.db.QueryRow(ctx, `SELECT inventory_note FROM nodes WHERE name = $1`, node).Scan(&note)
	return note, mapErr("loading node", err)
}

// InventoryNotes returns every node's inventory note that is not "".
func (s *Store) InventoryNotes(ctx context.Context) (map[string]string, error) {
	rows, err := s.db.Query(ctx, `SELECT name, inventory_note FROM nodes WHERE inventory_note <> ''`)
	if err != nil {
		return nil, mapErr("listing nodes", err)
	}
	out := map[string]string{}
	for rows.Next() {
		var n, note string
		if err := rows.Scan(&n, &note); err != nil {
			rows.Close()
			return nil, mapErr("listing nodes", err)
		}
		out[n] = note
	}
	return out, mapErr("listing nodes", rows.Err())
}

// SetNodeInventory declares node again as gpus GPUs of gpuType (`allot
// node set`, PUT /api/v1/nodes/{name}/inventory), audited as
// node.inventory by actor: an admin answers an inventory note (the agent
// registered another model or count than declared) or moves a node to
// another type. The type must exist and not be retired. A node with GPUs
// allocated is refused (drain it and let its jobs end first): its jobs
// were placed, and are billed, by its type. The inventory note is worked
// out again from the GPUs its agent last registered. It reports whether
// anything changed.
func (s *Store) SetNodeInventory(ctx context.Context, actor, node, gpuType string, gpus int, note string) (bool, error) {
	f := allot.FieldErrors{}
	if gpuType == "" {
		f.Add("gpu_type", "is required")
	}
	if gpus < 1 || gpus > allot.MaxGPUsPerNode {
		f.Add("gpus", "must be 1..%d, not %d", allot.MaxGPUsPerNode, gpus)
	}
	if err := f.Err(); err != nil {
		return false, err
	}
	if err := s.checkGPUTypeUsable(ctx, gpuType); err != nil {
		return false, err
	}
	changed := false
	err := s.InTx(ctx, func(tx *Store) error {
		var oldType, backend string
		var declared int
		var registered bool
		err := tx.db.QueryRow(ctx, `SELECT gpu_type, coalesce(declared_gpus, gpu_count), registered_at IS NOT NULL, backend
			FROM nodes WHERE name = $1 FOR UPDATE`, node).Scan(&oldType, &declared, &registered, &backend)
		if err == pgx.ErrNoRows {
			return allot.Errorf(allot.ENotFound, "node %q does not exist", node)
		}
		if err != nil {
			return mapErr("loading node", err)
		}
		if backend != allot.BackendNative {
			return allot.Errorf(allot.EConflict, "node %s is a %s node: its GPUs are %s's to declare", node, backend, backend)
		}
		if oldType == gpuType && declared == gpus {
			return nil
		}
		var held int
		if err := tx.db.QueryRow(ctx, `SELECT count(*) FROM allocations WHERE node = $1 AND released_at IS NULL`, node).Scan(&held); err != nil {
			return mapErr("loading node", err)
		}
		if held > 0 {
			return allot.Errorf(allot.EConflict, "node %s has %d GPUs allocated to jobs placed and billed as %s: drain it (allot node drain %s --reason …) and let its jobs end first", node, held, oldType, node)
		}
		if _, err := tx.db.Exec(ctx, `UPDATE nodes SET gpu_type = $2, declared_gpus = $3,
			gpu_count = CASE WHEN registered_at IS NULL THEN $3 ELSE gpu_count END WHERE name = $1`, node, gpuType, gpus); err != nil {
			return mapErr("declaring node", err)
		}
		if registered {
			rows, err := tx.db.Query(ctx, `SELECT gpu_index, uuid, model, memory_mib FROM node_gpus WHERE node = $1 ORDER BY gpu_index`, node)
			if err != nil {
				return mapErr("loading node GPUs", err)
			}
			gs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeGPU, error) {
				var g NodeGPU
				return g, r.Scan(&g.Index, &g.UUID, &g.Model, &g.MemoryMiB)
			})
			if err != nil {
				return mapErr("loading node GPUs", err)
			}
			if err := tx.noteInventory(ctx, node, gs); err != nil {
				return err
			}
		}
		changed = true
		before := fmt.Sprintf(`{"gpu_type":%q,"gpus":%d}`, oldType, declared)
		after := fmt.Sprintf(`{"gpu_type":%q,"gpus":%d}`, gpuType, gpus)
		return tx.Audit(ctx, &allot.AuditEntry{Actor: actor, Action: "node.inventory", Object: "node:" + node, Before: []byte(before), After: []byte(after), Note: note})
	})
	return changed, err
}
