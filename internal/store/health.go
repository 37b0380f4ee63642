package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/health"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// HealthOutcome is what one heartbeat's health evaluation did.
type HealthOutcome struct {
	State    string  // the node's state afterwards
	Fired    []int64 // new health events
	Requeued []int64 // jobs asked to stop and go back to the queue
	Changed  bool    // the node's state changed (worth a scheduling cycle)
}

// healthSampleWindow is how much GPU history before a rule started to
// hold is copied into its event.
const healthSampleWindow = 10 * time.Minute

// maxHealthOutput bounds the stored output of a failed --health-cmd.
const maxHealthOutput = 4096

// EvaluateHealth applies the policy's health rules to one heartbeat of
// node (call it after Heartbeat). In one transaction it keeps each rule's
// "since" state, records an event (with the GPU history that triggered it)
// and an admin notification for every rule that starts firing, drains the
// node (drain, drain-and-requeue: its running jobs are stopped with the
// policy's grace and requeued), closes events whose condition cleared,
// finishes draining when the node's jobs are gone, and undrains a node a
// health rule drained once it has passed its checks for the policy's
// AutoUndrainAfter. Every state change is audited (actor "system").
func (s *Store) EvaluateHealth(ctx context.Context, node string, gpus []health.GPU, check string) (HealthOutcome, error) {
	return s.EvaluateHeartbeatHealth(ctx, node, gpus, check, "")
}

// EvaluateHeartbeatHealth is EvaluateHealth for a heartbeat that may say
// the agent could not read its GPUs (metricsError): then rules over GPU
// metrics are unknown (see health.Report.MetricsError), so GPUs absent
// from the heartbeat do not drain the node as missing.
func (s *Store) EvaluateHeartbeatHealth(ctx context.Context, node string, gpus []health.GPU, check, metricsError string) (HealthOutcome, error) {
	if metricsError != "" {
		gpus = nil
	}
	if len(check) > maxHealthOutput {
		check = check[:maxHealthOutput]
	}
	check = strings.ToValidUTF8(check, "?")
	// Most heartbeats change nothing: a read-only pass without a
	// transaction settles them. The first write it would make sends the
	// evaluation into a transaction that locks the node and does it all:
	// with a lock that a scheduling cycle placing work on the node (FOR KEY
	// SHARE) does not hold up when only the health bookkeeping changes (a
	// node's first heartbeat, a rule starting or ceasing to hold, the check
	// output), else with one that waits for such a cycle, so a drain sees
	// the lease it commits (as an admin's drain does). A cycle that starts
	// thousands of jobs holds its locks for seconds: every new node's
	// first heartbeat waited for it.
	out, err := s.evaluateHealth(ctx, node, gpus, check, metricsError, healthRead, nil)
	if err != errHealthWrite {
		return out, err
	}
	return s.evaluateHealthWrites(ctx, node, gpus, check, metricsError)
}

// evaluateHealthWrites is the evaluation of a heartbeat whose read-only
// pass found something to write: in a transaction, bookkeeping first.
func (s *Store) evaluateHealthWrites(ctx context.Context, node string, gpus []health.GPU, check, metricsError string) (HealthOutcome, error) {
	var out HealthOutcome
	var err error
	for _, mode := range []healthMode{healthBookkeeping, healthStateChange} {
		err = s.InTx(ctx, func(tx *Store) error {
			var err error
			out, err = tx.evaluateHealth(ctx, node, gpus, check, metricsError, mode, nil)
			return err
		})
		if err != errHealthStateChange {
			break
		}
	}
	return out, err
}

// nodeHealthSQL is the one read of a node's health evaluation: its state,
// the GPUs it registered, the rules holding, the open events, and the
// policy's health part ($1 the node; a lock clause may follow).
const nodeHealthSQL = `
			SELECT state, drain_source, health_ok_since, health_output,
				coalesce((SELECT array_agg(gpu_index ORDER BY gpu_index) FROM node_gpus WHERE node = $1), '{}'),
				coalesce((SELECT array_agg(rule ORDER BY rule) FROM node_health_state WHERE node = $1), '{}'),
				coalesce((SELECT array_agg(since ORDER BY rule) FROM node_health_state WHERE node = $1), '{}'),
				coalesce((SELECT jsonb_agg(jsonb_build_object('rule', rule_name, 'gpus', gpus, 'values', gpu_values))
					FROM health_events WHERE node = $1 AND resolved_at IS NULL), '[]'),
				lost_gpus,
				EXISTS (SELECT 1 FROM leases WHERE node = $1 AND state <> 'exited'),
				pv.version IS NOT NULL, coalesce(pv.health_rules, '[]'), coalesce(pv.grace_period_s, 0), coalesce(pv.auto_undrain_after_s, 0)
			FROM nodes LEFT JOIN (SELECT version, health_rules, grace_period_s, auto_undrain_after_s FROM policy_versions ORDER BY version DESC LIMIT 1) pv ON true
			WHERE name = $1`

// healthMode is what an evaluation may write.
type healthMode int

const (
	healthRead        healthMode = iota // nothing: no transaction, no lock
	healthBookkeeping                   // rule states, events resolved, passing-since, check output (FOR NO KEY UPDATE of the node)
	healthStateChange                   // also events fired, drains, requeues, undrains (FOR UPDATE of the node)
)

// errHealthWrite stops a read-only evaluation that has something to
// write, errHealthStateChange a bookkeeping one that has more.
var (
	errHealthWrite       = errors.New("health evaluation needs a write")
	errHealthStateChange = errors.New("health evaluation changes the node's state")
)

// evaluateHealth evaluates one heartbeat's health in mode; pre, when not
// nil, is nodeHealthSQL's row already sent (healthRead only).
func (s *Store) evaluateHealth(ctx context.Context, node string, gpus []health.GPU, check, metricsError string, mode healthMode, pre pgx.Row) (HealthOutcome, error) {
	var out HealthOutcome
	lock := map[healthMode]string{healthBookkeeping: " FOR NO KEY UPDATE OF nodes", healthStateChange: " FOR UPDATE OF nodes"}[mode]
	// needs stops a pass that may not make a write of what.
	needs := func(what healthMode) error {
		switch {
		case mode >= what:
			return nil
		case mode == healthRead:
			return errHealthWrite
		default:
			return errHealthStateChange
		}
	}
	err := func(tx *Store) error {
		now := tx.Now()
		// One read for the node: its state, the GPUs it registered, the
		// rules holding and the open events.
		var state, source, oldOutput string
		var okSince *time.Time
		var expected []int
		var holding []string
		var holdingSince []time.Time
		var open []openEvent
		var lost []health.LostGPU
		var busy, hasPolicy bool
		var graceS, undrainS int64
		var p allot.Policy // the policy's health part, read with the node
		row := pre
		if row == nil {
			row = tx.db.QueryRow(ctx, nodeHealthSQL+lock, node)
		}
		err := row.Scan(&state, &source, &okSince, &oldOutput, &expected, &holding, &holdingSince, &open, &lost, &busy,
			&hasPolicy, &p.HealthRules, &graceS, &undrainS)
		if err != nil {
			return mapErr("evaluating node health", err)
		}
		out.State = state
		if state == allot.NodeDown {
			return nil
		}
		if hasPolicy {
			p.GracePeriod, p.AutoUndrainAfter = time.Duration(graceS)*time.Second, time.Duration(undrainS)*time.Second
		} else {
			p = allot.DefaultPolicy()
		}
		since := make(map[string]time.Time, len(holding))
		for i, r := range holding {
			since[r] = holdingSince[i]
		}
		res := health.Evaluate(p.HealthRules, health.Report{At: now, GPUs: gpus, Expected: expected, Lost: lost, HealthCheck: check, MetricsError: metricsError}, since)

		// Keep the state of the rules that hold (written only when it changed).
		changed := len(res.Since) != len(since)
		for n, t := range res.Since {
			if old, ok := since[n]; !ok || !old.Equal(t) {
				changed = true
			}
		}
		names, starts := make([]string, 0, len(res.Since)), make([]time.Time, 0, len(res.Since))
		for n, t := range res.Since {
			names, starts = append(names, n), append(starts, t)
		}
		if changed {
			if err := needs(healthBookkeeping); err != nil {
				return err
			}
			if _, err := tx.db.Exec(ctx, `DELETE FROM node_health_state WHERE node = $1 AND rule <> ALL($2)`, node, names); err != nil {
				return mapErr("saving health state", err)
			}
			if _, err := tx.db.Exec(ctx, `INSERT INTO node_health_state (node, rule, since) SELECT $1, r, s FROM unnest($2::text[], $3::timestamptz[]) AS u(r, s)
				ON CONFLICT (node, rule) DO UPDATE SET since = excluded.since`, node, names, starts); err != nil {
				return mapErr("saving health state", err)
			}
		}
		// Events whose rule no longer holds are resolved.
		isOpen := map[string]openEvent{}
		resolve := false
		for _, e := range open {
			if _, holds := res.Since[e.Rule]; holds {
				isOpen[e.Rule] = e
			} else {
				resolve = true
			}
		}
		if resolve {
			if err := needs(healthBookkeeping); err != nil {
				return err
			}
			if _, err := tx.db.Exec(ctx, `UPDATE health_events SET resolved_at = $3 WHERE node = $1 AND resolved_at IS NULL AND rule_name <> ALL($2)`,
				node, names, now); err != nil {
				return mapErr("resolving health events", err)
			}
		}
		for _, f := range res.Firing() {
			e, fired := isOpen[f.Rule.Name]
			if fired && !health.Refires(f, e.GPUs, e.Values) {
				continue // fired before and still holds: one event per episode
			}
			if err := needs(healthStateChange); err != nil {
				return err
			}
			if fired {
				// A new fault of a counter (another double-bit error): it
				// fires again, even after an admin undrained the node; the
				// new event takes over from the old one.
				if _, err := tx.db.Exec(ctx, `UPDATE health_events SET resolved_at = $3 WHERE node = $1 AND rule_name = $2 AND resolved_at IS NULL`,
					node, f.Rule.Name, now); err != nil {
					return mapErr("superseding health event", err)
				}
			}
			before := state
			var requeued []int64
			switch f.Rule.Action {
			case allot.HealthDrain, allot.HealthDrainAndRequeue:
				if state == allot.NodeUp {
					reason := fmt.Sprintf("health rule %s: %s", f.Rule.Name, f.Detail)
					if state, err = tx.startDrain(ctx, node, allot.DrainByHealth, reason, now); err != nil {
						return err
					}
					source = allot.DrainByHealth
				}
				if f.Rule.Action == allot.HealthDrainAndRequeue {
					if requeued, err = tx.requeueNodeJobs(ctx, node, p.GracePeriod); err != nil {
						return err
					}
				}
			}
			id, err := tx.recordHealthEvent(ctx, node, f, state, requeued, now)
			if err != nil {
				return err
			}
			out.Fired = append(out.Fired, id)
			out.Requeued = append(out.Requeued, requeued...)
			verb := map[string]string{allot.HealthWarn: "warning", allot.HealthDrain: "drained", allot.HealthDrainAndRequeue: "drained, jobs requeued"}[f.Rule.Action]
			msg := fmt.Sprintf("Node %s: health rule %s (%s) fired: %s. Action: %s; node is %s.", node, f.Rule.Name, f.Rule.Severity, f.Detail, verb, state)
			if len(requeued) > 0 {
				msg += fmt.Sprintf(" Jobs requeued with %s grace: %v.", p.GracePeriod, requeued)
			}
			if err := tx.Notify(ctx, Notification{Kind: "health." + strings.ReplaceAll(f.Rule.Action, "-", "_"), Severity: f.Rule.Severity,
				Subject: "node:" + node, Link: "/nodes/" + node, Message: msg}); err != nil {
				return err
			}
			if state != before {
				out.Changed = true
				if err := tx.auditNodeState(ctx, allot.ActorSystem, "node.drain", node, before, state,
					fmt.Sprintf("health rule %s (%s): %s", f.Rule.Name, f.Rule.Severity, f.Detail), map[string]any{"event": id, "requeued": requeued}); err != nil {
					return err
				}
			}
		}
		// Passing the drain rules since…
		oldOK := okSince
		switch {
		case !res.Passing:
			okSince = nil
		case okSince == nil:
			okSince = &now
		}
		if (oldOK == nil) != (okSince == nil) || oldOutput != check {
			if err := needs(healthBookkeeping); err != nil {
				return err
			}
			if _, err := tx.db.Exec(ctx, `UPDATE nodes SET health_ok_since = $2, health_output = $3 WHERE name = $1`, node, okSince, check); err != nil {
				return mapErr("saving node health", err)
			}
		}
		// Auto-undrain a node a health rule drained once it passed long enough.
		if p.AutoUndrainAfter > 0 && source == allot.DrainByHealth && okSince != nil && now.Sub(*okSince) >= p.AutoUndrainAfter &&
			(state == allot.NodeDraining || state == allot.NodeDrained) {
			if err := needs(healthStateChange); err != nil {
				return err
			}
			note := fmt.Sprintf("passed its health checks for %s (policy: undrain automatically after %s)", now.Sub(*okSince).Round(time.Second), p.AutoUndrainAfter)
			if err := tx.undrain(ctx, allot.ActorSystem, node, state, note); err != nil {
				return err
			}
			if err := tx.Notify(ctx, Notification{Kind: "node.undrain", Severity: "info", Subject: "node:" + node, Link: "/nodes/" + node,
				Message: fmt.Sprintf("Node %s was undrained automatically: it %s.", node, note)}); err != nil {
				return err
			}
			state, out.Changed = allot.NodeUp, true
		}
		if state == allot.NodeDraining && (mode == healthStateChange || !busy) {
			if err := needs(healthStateChange); err != nil {
				return err
			}
			drained, err := tx.finishDrain(ctx, node, now)
			if err != nil {
				return err
			}
			if drained {
				state = allot.NodeDrained
			}
		}
		out.State = state
		return nil
	}(s)
	return out, err
}

// openEvent is an open health event as evaluation needs it.
type openEvent struct {
	Rule   string    `json:"rule"`
	GPUs   []int     `json:"gpus"`
	Values []float64 `json:"values"`
}

// startDrain moves an up node to draining (drained at once when it runs
// nothing) and returns the new state.
func (s *Store) startDrain(ctx context.Context, node, source, reason string, now time.Time) (string, error) {
	var state string
	err := s.db.QueryRow(ctx, `
		UPDATE nodes SET state = CASE WHEN EXISTS (SELECT 1 FROM leases WHERE node = $1 AND state <> 'exited') THEN 'draining' ELSE 'drained' END,
			state_reason = $3, drain_source = $2, drain_reason = $3,
			drained_at = CASE WHEN EXISTS (SELECT 1 FROM leases WHERE node = $1 AND state <> 'exited') THEN NULL ELSE $4::timestamptz END
		WHERE name = $1 RETURNING state`, node, source, reason, now).Scan(&state)
	return state, mapErr("draining node", err)
}

// finishDrain marks a draining node drained once no lease is open on it.
func (s *Store) finishDrain(ctx context.Context, node string, now time.Time) (bool, error) {
	tag, err := s.db.Exec(ctx, `UPDATE nodes SET state = 'drained', drained_at = $2
		WHERE name = $1 AND state = 'draining' AND NOT EXISTS (SELECT 1 FROM leases WHERE node = $1 AND state <> 'exited')`, node, now)
	if err != nil {
		return false, mapErr("finishing drain", err)
	}
	return tag.RowsAffected() == 1, nil
}

// FinishDrains marks every draining node whose jobs are gone drained and
// returns them.
func (s *Store) FinishDrains(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, `UPDATE nodes n SET state = 'drained', drained_at = $1
		WHERE state = 'draining' AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.node = n.name AND l.state <> 'exited') RETURNING name`, s.Now())
	if err != nil {
		return nil, mapErr("finishing drains", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, mapErr("finishing drains", err)
}

// requeueNodeJobs asks every job running on node to stop with grace
// (SIGTERM, grace, SIGKILL, as a preemption) and go back to the queue. A
// gang's other nodes stop too. It returns the jobs.
func (s *Store) requeueNodeJobs(ctx context.Context, node string, grace time.Duration) ([]int64, error) {
	rows, err := s.db.Query(ctx, `SELECT j.id, j.segment FROM jobs j
		WHERE j.state = 'running' AND EXISTS (SELECT 1 FROM leases l WHERE l.job_id = j.id AND l.segment = j.segment AND l.node = $1 AND l.state <> 'exited')
		ORDER BY j.id FOR UPDATE`, node)
	if err != nil {
		return nil, mapErr("requeueing jobs of node", err)
	}
	refs, err := pgx.CollectRows(rows, scanLeaseRef)
	if err != nil {
		return nil, mapErr("requeueing jobs of node", err)
	}
	var ids []int64
	for _, r := range refs {
		if err := s.requestStop(ctx, r.JobID, r.Segment, StopDrain, grace); err != nil {
			return nil, err
		}
		if _, err := s.db.Exec(ctx, `UPDATE jobs SET pending_reason = $2 WHERE id = $1`, r.JobID,
			"being requeued: node "+node+" is draining"); err != nil {
			return nil, mapErr("requeueing jobs of node", err)
		}
		ids = append(ids, r.JobID)
	}
	return ids, nil
}

// StopDrain is the stop reason of jobs requeued off a draining node.
const StopDrain = "drain"

func (s *Store) recordHealthEvent(ctx context.Context, node string, f health.Finding, state string, requeued []int64, now time.Time) (int64, error) {
	rule, _ := json.Marshal(f.Rule)
	gpus, values := f.GPUs, f.Values
	if gpus == nil {
		gpus = []int{}
	}
	if values == nil {
		values = []float64{}
	}
	if requeued == nil {
		requeued = []int64{}
	}
	var id int64
	err := s.db.QueryRow(ctx, `
		INSERT INTO health_events (node, at, since, rule, rule_name, metric, value, gpus, gpu_values, detail, severity, action, node_state, requeued)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING id`,
		node, now, f.Since, rule, f.Rule.Name, f.Rule.Metric, f.Value, gpus, values, f.Detail, f.Rule.Severity, f.Rule.Action, state, requeued).Scan(&id)
	if err != nil {
		return 0, mapErr("recording health event", err)
	}
	// The evidence: this node's GPU readings from a while before the
	// condition started until now.
	_, err = s.db.Exec(ctx, `
		INSERT INTO health_event_samples (event_id, gpu_index, at, util_pct, temp_c, power_w, ecc_dbe_vol, throttle_reasons, xid_errors)
		SELECT $1, gpu_index, at, util_pct, temp_c, power_w, ecc_dbe_vol, throttle_reasons, xid_errors
		FROM gpu_samples WHERE node = $2 AND at >= $3 AND at <= $4`, id, node, f.Since.Add(-healthSampleWindow), now)
	return id, mapErr("recording health event samples", err)
}

func (s *Store) auditNodeState(ctx context.Context, actor, action, node, before, after, note string, extra map[string]any) error {
	b, _ := json.Marshal(map[string]any{"state": before})
	am := map[string]any{"state": after}
	for k, v := range extra {
		am[k] = v
	}
	a, _ := json.Marshal(am)
	return s.Audit(ctx, &allot.AuditEntry{Actor: actor, Action: action, Object: "node:" + node, Before: b, After: a, Note: note})
}

// undrain brings a draining or drained node back up and audits it.
// Open health events are acknowledged (they do not fire again while their
// condition keeps holding; a new fault does, e.g. another double-bit ECC
// error).
func (s *Store) undrain(ctx context.Context, actor, node, before, note string) error {
	// GPUs lost at a re-registration are forgotten: whoever undrains
	// accepts the node's inventory as it is now.
	if _, err := s.db.Exec(ctx, `UPDATE nodes SET state = 'up', state_reason = '', drain_source = '', drain_reason = '', drained_at = NULL,
		lost_gpus = '[]' WHERE name = $1`, node); err != nil {
		return mapErr("undraining node", err)
	}
	if _, err := s.db.Exec(ctx, `UPDATE health_events SET acknowledged_by = $2, acknowledged_at = $3 WHERE node = $1 AND acknowledged_at IS NULL`,
		node, actor, s.Now()); err != nil {
		return mapErr("undraining node", err)
	}
	return s.auditNodeState(ctx, actor, "node.undrain", node, before, allot.NodeUp, note, nil)
}

// Notification is a message for the admins: shown in the portal and sent
// to the admin webhook.
type Notification struct {
	ID       int64
	At       time.Time
	Kind     string // e.g. health.drain, health.warn, node.undrain
	Severity string // info, warning, critical
	Subject  string // e.g. node:gpu01
	Link     string // portal page
	Message  string
	ReadAt   *time.Time
	ReadBy   string
}

// Notify stores a notification for the admins (the admin webhook gets it
// from DeliverNotifications).
func (s *Store) Notify(ctx context.Context, n Notification) error {
	if n.Severity == "" {
		n.Severity = "info"
	}
	_, err := s.db.Exec(ctx, `INSERT INTO notifications (at, kind, severity, subject, link, message) VALUES ($1, $2, $3, $4, $5, $6)`,
		s.Now(), n.Kind, n.Severity, n.Subject, n.Link, n.Message)
	return mapErr("storing notification", err)
}

// Notifications returns the newest notifications (unread only when
// unread is set).
func (s *Store) Notifications(ctx context.Context, unread bool, limit int) ([]Notification, error) {
	rows, err := s.db.Query(ctx, `SELECT id, at, kind, severity, subject, link, message, read_at, read_by FROM notifications
		WHERE NOT $1 OR read_at IS NULL ORDER BY at DESC, id DESC LIMIT $2`, unread, limit)
	if err != nil {
		return nil, mapErr("loading notifications", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Notification, error) {
		var n Notification
		return n, r.Scan(&n.ID, &n.At, &n.Kind, &n.Severity, &n.Subject, &n.Link, &n.Message, &n.ReadAt, &n.ReadBy)
	})
	return out, mapErr("loading notifications", err)
}

// MarkNotificationsRead marks every unread notification read by who.
func (s *Store) MarkNotificationsRead(ctx context.Context, who string) (int64, error) {
	tag, err := s.db.Exec(ctx, `UPDATE notifications SET read_at = $2, read_by = $1 WHERE read_at IS NULL`, who, s.Now())
	return tag.RowsAffected(), mapErr("marking notifications read", err)
}

// DeliverNotifications hands each notification not yet sent to deliver
// (with the admin webhook URL) and marks it sent, in one transaction with
// deliver's work (deliver enqueues the webhook job on the same
// transaction). Without an admin webhook they are marked sent unsent.
func (s *Store) DeliverNotifications(ctx context.Context, deliver func(tx pgx.Tx, url string, n Notification) error) (int, error) {
	count := 0
	err := s.InPgxTx(ctx, func(tx pgx.Tx, st *Store) error {
		url, err := st.AdminWebhook(ctx)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT id, at, kind, severity, subject, link, message FROM notifications
			WHERE webhook_sent_at IS NULL ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED`)
		if err != nil {
			return mapErr("loading notifications", err)
		}
		ns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Notification, error) {
			var n Notification
			return n, r.Scan(&n.ID, &n.At, &n.Kind, &n.Severity, &n.Subject, &n.Link, &n.Message)
		})
		if err != nil {
			return mapErr("loading notifications", err)
		}
		ids := make([]int64, 0, len(ns))
		for _, n := range ns {
			if url != "" {
				if err := deliver(tx, url, n); err != nil {
					return err
				}
				count++
			}
			ids = append(ids, n.ID)
		}
		if _, err := tx.Exec(ctx, `UPDATE notifications SET webhook_sent_at = $2 WHERE id = ANY($1)`, ids, st.Now()); err != nil {
			return mapErr("marking notifications sent", err)
		}
		return nil
	})
	return count, err
}

// AdminWebhook returns the cluster's admin webhook URL ("" if none).
func (s *Store) AdminWebhook(ctx context.Context) (string, error) {
	var url string
	err := s.db.QueryRow(ctx, `SELECT admin_webhook_url FROM cluster_settings`).Scan(&url)
	return url, mapErr("loading admin webhook", err)
}

// SetAdminWebhook sets (or clears, with "") the admin webhook and audits
// it (nothing when it is already so). Which hosts it may point at is the
// HTTP layer's check.
func (s *Store) SetAdminWebhook(ctx context.Context, actor, url string) error {
	_, err := s.setAdminWebhook(ctx, actor, url)
	return err
}

func (s *Store) setAdminWebhook(ctx context.Context, actor, url string) (bool, error) {
	if url != "" && !strings.HasPrefix(url, "https://") && !strings.HasPrefix(url, "http://") {
		return false, (allot.FieldErrors{"webhook": "must be an http:// or https:// URL"}).Err()
	}
	changed := false
	err := s.InTx(ctx, func(tx *Store) error {
		var old string
		if err := tx.db.QueryRow(ctx, `SELECT admin_webhook_url FROM cluster_settings FOR UPDATE`).Scan(&old); err != nil {
			return mapErr("loading admin webhook", err)
		}
		if old == url {
			return nil
		}
		changed = true
		if _, err := tx.db.Exec(ctx, `UPDATE cluster_settings SET admin_webhook_url = $1`, url); err != nil {
			return mapErr("setting admin webhook", err)
		}
		b, _ := json.Marshal(map[string]string{"url": old})
		a, _ := json.Marshal(map[string]string{"url": url})
		return tx.Audit(ctx, &allot.AuditEntry{Actor: actor, Action: "settings.admin_webhook", Object: "cluster", Before: b, After: a})
	})
	return changed, err
}

// AdminDeliveries returns the admin webhook's delivery log, newest first.
func (s *Store) AdminDeliveries(ctx context.Context, limit int) ([]Delivery, error) {
	rows, err := s.db.Query(ctx, `SELECT '', url, attempt, status_code, error, at FROM webhook_deliveries WHERE team IS NULL ORDER BY id DESC LIMIT $1`, limit)
	return collectDeliveries(rows, err)
}

// inAsyncTx runs fn in a transaction that commits without waiting for the
// WAL to reach the disk (synchronous_commit off for this transaction
// alone).
func (s *Store) inAsyncTx(ctx context.Context, what string, fn func(tx *Store) error) error {
	return s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return mapErr(what, err)
		}
		return fn(tx)
	})
}

// asyncCommitSQL is a CTE that turns synchronous_commit off for the
// statement's own (implicit) transaction: a statement that references it
// (FROM ac) commits without waiting for the WAL flush, in one round trip
// instead of BEGIN, SET LOCAL, the statement and COMMIT. The setting ends
// with that transaction (set_config's is_local); the connection commits
// synchronously afterwards.
const asyncCommitSQL = `ac AS (SELECT set_config('synchronous_commit', 'off', true) AS off)`

// HeartbeatJobsAsync is HeartbeatJobs (the running jobs' statistics, when
// each lease was last seen, orphans held or released) with an
// asynchronous commit, as RecordHeartbeatAsync: all of it is what the
// agent reports again at its next heartbeat, so a commit lost with a
// PostgreSQL crash is redone then. Under load the flushes of these commits
// queued behind every submission's (WALWrite).
//
// The common heartbeat only confirms the leases it lists (or lists none):
// one read of the node's leases outside a transaction, then, if there is
// anything to record, one statement that updates the listed leases and
// commits asynchronously by itself (two round trips; a transaction took
// five). The read took no locks inside the transaction either, and the
// update still skips leases that exited meanwhile. A heartbeat whose
// leases need more (an orphan held or released) takes the transactional
// path.
func (s *Store) HeartbeatJobsAsync(ctx context.Context, node string, stats []JobStat) ([]Orphan, error) {
	listed, byRef := listedStats(stats)
	leases, err := s.nodeLeases(ctx, node, listed)
	if err != nil {
		return nil, err
	}
	seen, orphans, needTx := splitReconciled(leases, listed, byRef)
	if needTx {
		return s.heartbeatJobsTx(ctx, node, stats)
	}
	if len(seen) == 0 {
		return orphans, nil
	}
	if err := s.confirmSeen(ctx, node, seen); err != nil {
		return nil, err
	}
	return orphans, nil
}

// listedStats is a heartbeat's job list as lease refs, and each one's
// statistics by its ref.
func listedStats(stats []JobStat) ([]LeaseRef, map[LeaseRef]JobStat) {
	listed := make([]LeaseRef, len(stats))
	byRef := make(map[LeaseRef]JobStat, len(stats))
	for i, st := range stats {
		listed[i] = LeaseRef{JobID: st.JobID, Segment: st.Segment}
		byRef[listed[i]] = st
	}
	return listed, byRef
}

// splitReconciled sorts allot.ReconcileHeartbeat's decisions for the
// asynchronous paths: the statistics of the listed leases seen alive, the
// leases the agent must kill, and whether one needs the transactional path
// (an orphan's GPUs held or released: heartbeatJobsTx).
func splitReconciled(leases []allot.NodeLease, listed []LeaseRef, byRef map[LeaseRef]JobStat) (seen []JobStat, orphans []Orphan, needTx bool) {
	for _, d := range allot.ReconcileHeartbeat(leases, listed) {
		switch d.Action {
		case allot.ActSeen:
			seen = append(seen, byRef[d.Ref])
		case allot.ActKill:
			orphans = append(orphans, Orphan{LeaseRef: d.Ref})
		default:
			return nil, nil, true
		}
	}
	return seen, orphans, false
}

// confirmSeen records the statistics of the leases a heartbeat lists that
// the node runs, and that they were seen now, in one statement that
// commits asynchronously by itself.
func (s *Store) confirmSeen(ctx context.Context, node string, seen []JobStat) error {
	_, err := s.db.Exec(ctx, seenSQL, seenArgs(node, s.Now(), seen)...)
	return mapErr("recording job stats", err)
}

// seenSQL is confirmSeen's statement: $1 the node, $2 now, $3 to $7 each
// lease's job, segment, CPU seconds, RSS and newest checkpoint. It updates
// only the leases that a heartbeat's reconciliation finds seen alive
// (offered or running: allot.ActSeen), and only while the node is
// registered and not down, so RecordHeartbeatRound can send it with the
// heartbeat itself, before the reconciliation (whose transactional path
// writes them again, with its own now). It runs in the heartbeat's
// implicit transaction: if it fails, the node row and samples are rolled
// back with it and the heartbeat fails as a whole, for the agent to send
// again.
const seenSQL = `
		WITH ` + asyncCommitSQL + `
		UPDATE leases l SET cpu_seconds = u.cpu, rss_bytes = u.rss, seen_at = $2,
			last_checkpoint = CASE WHEN u.ckpt <= $2 THEN greatest(l.last_checkpoint, u.ckpt) ELSE l.last_checkpoint END
		FROM ac, unnest($3::bigint[], $4::int[], $5::float8[], $6::bigint[], $7::timestamptz[]) AS u(j, s, cpu, rss, ckpt)
		WHERE l.job_id = u.j AND l.segment = u.s AND l.node = $1 AND l.state IN ('offered', 'running')
			AND EXISTS (SELECT 1 FROM nodes n WHERE n.name = $1 AND n.state <> 'down' AND n.registered_at IS NOT NULL)`

// seenArgs are seenSQL's arguments for the statistics stats.
func seenArgs(node string, now time.Time, stats []JobStat) []any {
	n := len(stats)
	jobs, segs, cpu, rss, ckpt := make([]int64, n), make([]int32, n), make([]float64, n), make([]int64, n), make([]*time.Time, n)
	for i, st := range stats {
		jobs[i], segs[i], cpu[i], rss[i], ckpt[i] = st.JobID, int32(st.Segment), st.CPUSeconds, st.RSSBytes, st.LastCheckpoint
	}
	return []any{node, now, jobs, segs, cpu, rss, ckpt}
}

// heartbeatJobsTx is HeartbeatJobs in a transaction that commits
// asynchronously when there are statistics to record (see
// HeartbeatJobsAsync), synchronously when the heartbeat lists no job.
func (s *Store) heartbeatJobsTx(ctx context.Context, node string, stats []JobStat) ([]Orphan, error) {
	if len(stats) == 0 {
		return s.HeartbeatJobs(ctx, node, stats)
	}
	var out []Orphan
	err := s.inAsyncTx(ctx, "recording the heartbeat's jobs", func(tx *Store) error {
		var err error
		out, err = tx.HeartbeatJobs(ctx, node, stats)
		return err
	})
	return out, err
}

// RecordHeartbeatAsync is RecordHeartbeat (the node's last heartbeat and
// its GPU samples) committed without waiting for the WAL to reach the
// disk (synchronous_commit off for its own transaction alone). On this
// project's machine the commits' flushes were most of a heartbeat's time
// (4 ms of 5.5). What such a commit can lose is the last fraction of a
// second of telemetry (the node's last heartbeat time, its GPU samples:
// metrics) if PostgreSQL itself crashes, never a torn or inconsistent
// state: the next heartbeat rewrites it, and nodes count as lost only
// after several intervals. Health events, drains, lease changes, exits and
// everything billed keep their synchronous commits.
//
// A heartbeat that read its GPUs (no metrics error) is one statement: the
// node row and the samples, all GPUs in one multi-row insert, committed by
// itself (one round trip instead of five). One with a metrics error (it
// may notify the admins) runs RecordHeartbeat in a transaction.
func (s *Store) RecordHeartbeatAsync(ctx context.Context, node string, samples []GPUSample, metricsError string) (HeartbeatOutcome, error) {
	var out HeartbeatOutcome
	if strings.TrimSpace(metricsError) == "" {
		return s.recordHeartbeatStatement(ctx, node, samples)
	}
	err := s.inAsyncTx(ctx, "recording heartbeat", func(tx *Store) error {
		var err error
		out, err = tx.RecordHeartbeat(ctx, node, samples, metricsError)
		return err
	})
	return out, err
}

// recordHeartbeatStatement is RecordHeartbeat of a heartbeat without a
// metrics error in one asynchronously committed statement.
func (s *Store) recordHeartbeatStatement(ctx context.Context, node string, samples []GPUSample) (HeartbeatOutcome, error) {
	sql, args := heartbeatSQL(node, s.Now(), samples)
	return scanHeartbeat(node, s.db.QueryRow(ctx, sql, args...))
}

// heartbeatSQL is recordHeartbeatStatement's statement and arguments: the
// same update as RecordHeartbeat's with an empty metrics error, and the
// samples, inserted only when the node was updated (registered, not down).
func heartbeatSQL(node string, now time.Time, samples []GPUSample) (string, []any) {
	n := len(samples)
	idx, util, temp, power := make([]int32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	used, total, sbe, dbe, thr, xid := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, g := range samples {
		idx[i], util[i], temp[i], power[i] = int32(g.Index), float32(g.UtilPct), float32(g.TempC), float32(g.PowerW)
		used[i], total[i], sbe[i], dbe[i], thr[i], xid[i] = g.MemUsedMiB, g.MemTotalMiB, g.ECCSingle, g.ECCDouble, int64(g.ThrottleReasons), g.XIDs
	}
	return `
		WITH ` + asyncCommitSQL + `,
		o AS (SELECT name, metrics_error FROM nodes WHERE name = $1),
		u AS (
			UPDATE nodes n SET last_heartbeat = $2, metrics_error = '', metrics_error_since = NULL,
				state_reason = CASE WHEN n.state = 'up' AND starts_with(n.state_reason, $3) THEN '' ELSE n.state_reason END
			FROM o, ac
			WHERE n.name = o.name AND n.state <> 'down' AND n.registered_at IS NOT NULL RETURNING n.state, o.metrics_error),
		i AS (
			INSERT INTO gpu_samples (node, gpu_index, at, job_id, util_pct, mem_used_mib, mem_total_mib, temp_c, power_w, ecc_sbe_vol, ecc_dbe_vol, throttle_reasons, xid_errors)
			SELECT $1, s.i, $2, a.job_id, s.u, s.mu, s.mt, s.t, s.p, s.sbe, s.dbe, s.thr, s.xid
			FROM unnest($4::int[], $5::real[], $6::bigint[], $7::bigint[], $8::real[], $9::real[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[])
				AS s(i, u, mu, mt, t, p, sbe, dbe, thr, xid)
			LEFT JOIN allocations a ON a.node = $1 AND a.gpu_index = s.i AND a.released_at IS NULL
			WHERE EXISTS (SELECT 1 FROM u))
		SELECT state, metrics_error FROM u`,
		[]any{node, now, MetricsUnavailable, idx, util, used, total, temp, power, sbe, dbe, thr, xid}
}

// scanHeartbeat reads heartbeatSQL's row.
func scanHeartbeat(node string, row pgx.Row) (HeartbeatOutcome, error) {
	var out HeartbeatOutcome
	var old string
	err := row.Scan(&out.State, &old)
	if err == pgx.ErrNoRows {
		return out, allot.Errorf(allot.ENotFound, "node %s is not registered (or was marked down): register again", node)
	}
	if err != nil {
		return out, mapErr("recording heartbeat", err)
	}
	out.MetricsBack = old != ""
	return out, nil
}

// HeartbeatRound is what one heartbeat did: the node row and samples
// (RecordHeartbeatAsync), the leases it lists (HeartbeatJobsAsync) and its
// health evaluation (EvaluateHeartbeatHealth).
type HeartbeatRound struct {
	Beat    HeartbeatOutcome
	Orphans []Orphan
	Health  HealthOutcome
}

// RecordHeartbeatRound is, for a heartbeat that read its GPUs (no metrics
// error), RecordHeartbeatAsync, HeartbeatJobsAsync and
// EvaluateHeartbeatHealth in one round trip: the node row and samples,
// the read of the node's leases, the read of its health and the listed
// leases that are offered or running confirmed (seen now, their
// statistics: seenSQL) go to PostgreSQL as one batch, which runs as one
// implicit transaction that commits asynchronously (the samples'
// set_config). What is left is written after it, as those do: the leases
// the reconciliation finds need more (an orphan held or released, a taken
// lease adopted) in the transaction, and any health write (its own
// synchronous transaction). Under load every round trip waits for a core
// twice; an idle node's heartbeat made four of them, in three
// transactions, and now makes one, a busy node's two.
func (s *Store) RecordHeartbeatRound(ctx context.Context, node string, samples []GPUSample, stats []JobStat, gpus []health.GPU, check string) (HeartbeatRound, error) {
	var r HeartbeatRound
	pool, ok := s.db.(*pgxpool.Pool)
	if !ok {
		// Not on a pool (a test's connection or transaction): one by one.
		var err error
		if r.Beat, err = s.RecordHeartbeatAsync(ctx, node, samples, ""); err != nil {
			return r, err
		}
		if r.Orphans, err = s.HeartbeatJobsAsync(ctx, node, stats); err != nil {
			return r, err
		}
		r.Health, err = s.EvaluateHeartbeatHealth(ctx, node, gpus, check, "")
		return r, err
	}
	if len(check) > maxHealthOutput {
		check = check[:maxHealthOutput]
	}
	check = strings.ToValidUTF8(check, "?")
	listed, byRef := listedStats(stats)
	now := s.Now()
	sql, args := heartbeatSQL(node, now, samples)
	seen := seenArgs(node, now, stats) // $3, $4: the listed leases' jobs and segments
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	b.Queue(nodeLeasesSQL, node, seen[2], seen[3])
	b.Queue(nodeHealthSQL, node)
	if len(stats) > 0 {
		// The listed leases seen alive, in the same round trip: what the
		// reconciliation below would confirm in one more.
		b.Queue(seenSQL, seen...)
	}
	br := pool.SendBatch(ctx, b)
	var err error
	var leases []allot.NodeLease
	healthErr := errHealthWrite
	if r.Beat, err = scanHeartbeat(node, br.QueryRow()); err == nil {
		if leases, err = collectNodeLeases(br.Query()); err == nil {
			r.Health, healthErr = s.evaluateHealth(ctx, node, gpus, check, "", healthRead, br.QueryRow())
			if healthErr == nil || healthErr == errHealthWrite {
				if len(stats) > 0 {
					_, err = br.Exec()
					err = mapErr("recording job stats", err)
				}
			}
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = mapErr("recording heartbeat", cerr)
	}
	if err != nil {
		return r, err
	}
	// The leases seen alive were confirmed in the batch.
	_, orphans, needTx := splitReconciled(leases, listed, byRef)
	if needTx {
		// An orphan to hold or release: the transaction, then the
		// health evaluation after it, as before.
		if r.Orphans, err = s.heartbeatJobsTx(ctx, node, stats); err != nil {
			return r, err
		}
		r.Health, err = s.EvaluateHeartbeatHealth(ctx, node, gpus, check, "")
		return r, err
	}
	r.Orphans = append(r.Orphans, orphans...)
	switch healthErr {
	case nil:
	case errHealthWrite:
		r.Health, err = s.evaluateHealthWrites(ctx, node, gpus, check, "")
	default:
		err = healthErr
	}
	return r, err
}
