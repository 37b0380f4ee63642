package store

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// NodeInfo is a node as the node pages show it.
type NodeInfo struct {
	allot.Node
	Labels        allot.NodeLabels
	DrainSource   string // allot.DrainByAdmin, allot.DrainByHealth or ""
	DrainReason   string
	DrainedAt     *time.Time
	HealthOKSince *time.Time
	HealthOutput  string // last failed --health-cmd output
	OpenEvents    int    // health events whose condition still holds
	WorstOpen     string // worst severity among them ("" if none)
	RunningJobs   int
	AgentVersion  string
	GPUBackend    string
	Driver        string
	// InventoryNote says how the agent's last registration differs from
	// the node's declared GPU type and count ("" when it does not).
	InventoryNote string
}

const nodeInfoSelect = `
	SELECT n.name, n.gpu_type, n.gpu_count, n.site, n.domain, n.rack, n.state, n.state_reason, n.last_heartbeat, n.hostname,
		n.labels, n.drain_source, n.drain_reason, n.drained_at, n.health_ok_since, n.health_output,
		(SELECT count(*) FROM health_events e WHERE e.node = n.name AND e.resolved_at IS NULL)::int,
		coalesce((SELECT e.severity FROM health_events e WHERE e.node = n.name AND e.resolved_at IS NULL
			ORDER BY array_position(ARRAY['info','warning','critical'], e.severity) DESC LIMIT 1), ''),
		(SELECT count(DISTINCT l.job_id) FROM leases l WHERE l.node = n.name AND l.state <> 'exited')::int,
		n.agent_version, n.gpu_backend, n.driver_version, n.inventory_note
	FROM nodes n`

func scanNodeInfo(r pgx.CollectableRow) (NodeInfo, error) {
	var n NodeInfo
	var hb *time.Time
	var labels []byte
	err := r.Scan(&n.Name, &n.GPUType, &n.GPUCount, &n.Site, &n.Domain, &n.Rack, &n.State, &n.StateReason, &hb, &n.Hostname,
		&labels, &n.DrainSource, &n.DrainReason, &n.DrainedAt, &n.HealthOKSince, &n.HealthOutput, &n.OpenEvents, &n.WorstOpen,
		&n.RunningJobs, &n.AgentVersion, &n.GPUBackend, &n.Driver, &n.InventoryNote)
	if hb != nil {
		n.LastHeartbeat = *hb
	}
	n.Labels = allot.NodeLabels{}
	if err == nil && len(labels) > 0 {
		err = json.Unmarshal(labels, &n.Labels)
	}
	return n, err
}

// NodeInfos returns every node, by name, but released burst nodes (no
// longer part of the cluster; NodeInfoByName still finds them).
func (s *Store) NodeInfos(ctx context.Context) ([]NodeInfo, error) {
	rows, err := s.db.Query(ctx, nodeInfoSelect+` WHERE NOT `+releasedBurstNode+` ORDER BY n.name`)
	if err != nil {
		return nil, mapErr("listing nodes", err)
	}
	out, err := pgx.CollectRows(rows, scanNodeInfo)
	return out, mapErr("listing nodes", err)
}

// NodeInfoByName returns one node (ENotFound if unknown).
func (s *Store) NodeInfoByName(ctx context.Context, name string) (NodeInfo, error) {
	rows, err := s.db.Query(ctx, nodeInfoSelect+` WHERE n.name = $1`, name)
	if err != nil {
		return NodeInfo{}, mapErr("loading node", err)
	}
	n, err := pgx.CollectExactlyOneRow(rows, scanNodeInfo)
	if err == pgx.ErrNoRows {
		return n, allot.Errorf(allot.ENotFound, "node %q does not exist", name)
	}
	return n, mapErr("loading node", err)
}

// HealthEvent is a health rule that fired on a node.
type HealthEvent struct {
	ID             int64
	Node           string
	At             time.Time
	Since          time.Time
	Rule           allot.HealthRule
	Value          float64
	GPUs           []int
	Detail         string
	Severity       string
	Action         string
	NodeState      string
	Requeued       []int64
	ResolvedAt     *time.Time
	AcknowledgedBy string
	AcknowledgedAt *time.Time
}

// HealthEvents returns a node's health events ("" = every node's), newest
// first; openOnly keeps those whose condition still holds.
func (s *Store) HealthEvents(ctx context.Context, node string, openOnly bool, limit int) ([]HealthEvent, error) {
	rows, err := s.db.Query(ctx, `
		SELECT id, node, at, since, rule, value, gpus, detail, severity, action, node_state, requeued, resolved_at, acknowledged_by, acknowledged_at
		FROM health_events WHERE ($1 = '' OR node = $1) AND (NOT $2 OR resolved_at IS NULL)
		ORDER BY at DESC, id DESC LIMIT $3`, node, openOnly, limit)
	if err != nil {
		return nil, mapErr("loading health events", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (HealthEvent, error) {
		var e HealthEvent
		var rule []byte
		err := r.Scan(&e.ID, &e.Node, &e.At, &e.Since, &rule, &e.Value, &e.GPUs, &e.Detail, &e.Severity, &e.Action, &e.NodeState,
			&e.Requeued, &e.ResolvedAt, &e.AcknowledgedBy, &e.AcknowledgedAt)
		if err == nil {
			err = json.Unmarshal(rule, &e.Rule)
		}
		return e, err
	})
	return out, mapErr("loading health events", err)
}

// MetricPoint is one GPU reading of a metric history.
type MetricPoint struct {
	GPU      int
	At       time.Time
	UtilPct  float64
	TempC    float64
	PowerW   float64
	ECCDBE   int64
	Throttle uint64
	XIDs     int64
}

// HealthEventSamples returns the GPU readings kept with an event.
func (s *Store) HealthEventSamples(ctx context.Context, eventID int64) ([]MetricPoint, error) {
	return s.metricPoints(ctx, `SELECT gpu_index, at, util_pct, temp_c, power_w, ecc_dbe_vol, throttle_reasons, xid_errors
		FROM health_event_samples WHERE event_id = $1 ORDER BY gpu_index, at`, eventID)
}

// NodeSamples returns a node's GPU readings in [from, to].
func (s *Store) NodeSamples(ctx context.Context, node string, from, to time.Time) ([]MetricPoint, error) {
	return s.metricPoints(ctx, `SELECT gpu_index, at, util_pct, temp_c, power_w, ecc_dbe_vol, throttle_reasons, xid_errors
		FROM gpu_samples WHERE node = $1 AND at >= $2 AND at <= $3 ORDER BY gpu_index, at`, node, from, to)
}

func (s *Store) metricPoints(ctx context.Context, q string, args ...any) ([]MetricPoint, error) {
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, mapErr("loading GPU history", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (MetricPoint, error) {
		var p MetricPoint
		var util, temp, power float32
		var thr int64
		err := r.Scan(&p.GPU, &p.At, &util, &temp, &power, &p.ECCDBE, &thr, &p.XIDs)
		p.UtilPct, p.TempC, p.PowerW, p.Throttle = float64(util), float64(temp), float64(power), uint64(thr)
		return p, err
	})
	return out, mapErr("loading GPU history", err)
}

// DrainResult is what an admin drain did.
type DrainResult struct {
	State    string
	Requeued []int64
}

// DrainNode drains node for an admin: no new jobs; with requeue its
// running jobs are stopped with the policy's grace and requeued. It is
// audited as node.drain. Draining a node that is down is refused.
func (s *Store) DrainNode(ctx context.Context, actor, node, reason string, requeue bool) (DrainResult, error) {
	reason = strings.TrimSpace(reason)
	if err := CheckDrainReason(reason); err != nil {
		return DrainResult{}, err
	}
	var res DrainResult
	err := s.InTx(ctx, func(tx *Store) error {
		before, err := tx.lockNode(ctx, node)
		if err != nil {
			return err
		}
		if err := CheckDrainable(node, before); err != nil {
			return err
		}
		now := tx.Now()
		if res.State, err = tx.startDrain(ctx, node, allot.DrainByAdmin, "admin: "+reason, now); err != nil {
			return err
		}
		if requeue {
			p, err := tx.CurrentPolicy(ctx)
			if err != nil {
				return err
			}
			if res.Requeued, err = tx.requeueNodeJobs(ctx, node, p.GracePeriod); err != nil {
				return err
			}
		}
		return tx.auditNodeState(ctx, actor, "node.drain", node, before, res.State, reason, map[string]any{"requeue": requeue, "requeued": res.Requeued})
	})
	return res, err
}

// CheckDrainReason checks an admin's reason for a drain, as DrainNode
// does (the portal checks before it asks to confirm).
func CheckDrainReason(reason string) error {
	switch reason = strings.TrimSpace(reason); {
	case reason == "":
		return (allot.FieldErrors{"reason": "is required: say why the node is drained"}).Err()
	case len(reason) > 500:
		return (allot.FieldErrors{"reason": "must be at most 500 characters"}).Err()
	}
	return nil
}

// CheckDrainable says why node, in state, cannot be drained (nil: it can).
func CheckDrainable(node, state string) error {
	if state == allot.NodeDown {
		return allot.Errorf(allot.EConflict, "node %s is down; it cannot be drained until its agent is back", node)
	}
	return nil
}

// UndrainNode brings a draining or drained node back up for an admin,
// with a note; audited as node.undrain.
func (s *Store) UndrainNode(ctx context.Context, actor, node, note string) error {
	note = strings.TrimSpace(note)
	if note == "" {
		return (allot.FieldErrors{"note": "is required: say why the node is fit again"}).Err()
	}
	if len(note) > 500 {
		return (allot.FieldErrors{"note": "must be at most 500 characters"}).Err()
	}
	return s.InTx(ctx, func(tx *Store) error {
		before, err := tx.lockNode(ctx, node)
		if err != nil {
			return err
		}
		if before != allot.NodeDraining && before != allot.NodeDrained {
			return allot.Errorf(allot.EConflict, "node %s is %s, not draining or drained", node, before)
		}
		return tx.undrain(ctx, actor, node, before, note)
	})
}

func (s *Store) lockNode(ctx context.Context, node string) (string, error) {
	var state string
	err := s.db.QueryRow(ctx, `SELECT state FROM nodes WHERE name = $1 FOR UPDATE`, node).Scan(&state)
	if err == pgx.ErrNoRows {
		return "", allot.Errorf(allot.ENotFound, "node %q does not exist", node)
	}
	return state, mapErr("loading node", err)
}

// SetNodeLabels replaces a node's labels: a policy change (new policy
// version, audit action node.labels); none when they are already so.
func (s *Store) SetNodeLabels(ctx context.Context, actor, node string, labels allot.NodeLabels, note string) (AdminResult, error) {
	if labels == nil {
		labels = allot.NodeLabels{}
	}
	if err := labels.Validate(); err != nil {
		return AdminResult{}, err
	}
	return s.changeIfAny(ctx, PolicyChange{Actor: actor, Action: "node.labels", Object: "node:" + node, Note: note},
		func(tx *Store, _ *allot.Policy) (any, any, error) {
			var raw []byte
			err := tx.db.QueryRow(ctx, `SELECT labels FROM nodes WHERE name = $1 FOR UPDATE`, node).Scan(&raw)
			if err == pgx.ErrNoRows {
				return nil, nil, allot.Errorf(allot.ENotFound, "node %q does not exist", node)
			}
			if err != nil {
				return nil, nil, mapErr("loading node labels", err)
			}
			old := allot.NodeLabels{}
			if err := json.Unmarshal(raw, &old); err != nil {
				return nil, nil, mapErr("loading node labels", err)
			}
			b, _ := json.Marshal(labels)
			if _, err := tx.db.Exec(ctx, `UPDATE nodes SET labels = $2 WHERE name = $1`, node, b); err != nil {
				return nil, nil, mapErr("setting node labels", err)
			}
			// Compared as documents (changeIfAny): no version when unchanged.
			return map[string]allot.NodeLabels{"labels": old}, map[string]allot.NodeLabels{"labels": labels}, nil
		})
}

// SetHealthRules replaces the policy's health rules (new policy version,
// audit action health.update); nothing when they and the auto-undrain
// delay are already so.
func (s *Store) SetHealthRules(ctx context.Context, actor string, rules []allot.HealthRule, autoUndrain *time.Duration, note string) (AdminResult, error) {
	if rules == nil {
		rules = []allot.HealthRule{}
	}
	f := allot.Fields(allot.ValidateHealthRules(rules))
	if autoUndrain != nil && (*autoUndrain < 0 || *autoUndrain%time.Second != 0) {
		if f == nil {
			f = allot.FieldErrors{}
		}
		f["auto_undrain_after"] = "must be a whole number of seconds, not negative"
	}
	if len(f) > 0 {
		return AdminResult{}, allot.FieldErrors(f).Err()
	}
	return s.changeIfAny(ctx, PolicyChange{Actor: actor, Action: "health.update", Object: "policy:health_rules", Note: note},
		func(_ *Store, p *allot.Policy) (any, any, error) {
			// The audit entry shows durations as people read them ("10m").
			type view struct {
				Rules       []allot.HealthRuleDoc `json:"rules"`
				AutoUndrain string                `json:"auto_undrain_after"`
			}
			before := view{allot.HealthRuleDocs(p.HealthRules), allot.FormatDuration(p.AutoUndrainAfter)}
			p.HealthRules = rules
			if autoUndrain != nil {
				p.AutoUndrainAfter = *autoUndrain
			}
			return before, view{allot.HealthRuleDocs(p.HealthRules), allot.FormatDuration(p.AutoUndrainAfter)}, nil
		})
}

// SetHealthSettings saves the /admin/health form in one transaction: the
// rules (as SetHealthRules) and the admin webhook (as SetAdminWebhook);
// either fails, nothing is saved. It reports whether anything changed.
func (s *Store) SetHealthSettings(ctx context.Context, actor string, rules []allot.HealthRule, autoUndrain *time.Duration, webhook, note string) (bool, error) {
	changed := false
	err := s.InTx(ctx, func(tx *Store) error {
		r, err := tx.SetHealthRules(ctx, actor, rules, autoUndrain, note)
		if err != nil {
			return err
		}
		w, err := tx.setAdminWebhook(ctx, actor, webhook)
		changed = r.Changed || w
		return err
	})
	return changed, err
}
