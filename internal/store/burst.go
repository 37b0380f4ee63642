package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/jackc/pgx/v5"
)

// burstLock makes one burst evaluation run at a time across workers.
const burstLock = 7_401_223_051

// Burst event kinds and statuses (burst_events.kind, .status).
const (
	BurstRequest  = "request"
	BurstRelease  = "release"
	BurstPending  = "pending"
	BurstRetrying = "retrying"
	BurstDone     = "done"
	BurstFailed   = "failed"
)

// BurstEvent is one request for burst nodes or one release.
type BurstEvent struct {
	ID                int64     `json:"id"`
	At                time.Time `json:"at"`
	Kind              string    `json:"kind"`
	Status            string    `json:"status"`
	Provider          string    `json:"provider"`
	Reason            string    `json:"reason"`
	PendingGPUSeconds int64     `json:"pending_gpu_seconds"`
	MeanWaitS         int64     `json:"mean_wait_s"`
	PendingJobs       int       `json:"pending_jobs"`
	NodesWanted       int       `json:"nodes"`
	GPUType           string    `json:"gpu_type"`
	GPUsPerNode       int       `json:"gpus_per_node"`
	NodeNames         []string  `json:"node_names"`
	Attempts          int       `json:"attempts"`
	Error             string    `json:"error"`
	FinishedAt        time.Time `json:"finished_at,omitzero"`
}

// BurstNode is one node a provider returned.
type BurstNode struct {
	Node           string      `json:"node"`
	EventID        int64       `json:"event_id"`
	Provider       string      `json:"provider"`
	GPUType        string      `json:"gpu_type"`
	GPUs           int         `json:"gpus"`
	Rate           allot.Money `json:"-"`
	ProvisionedAt  time.Time   `json:"provisioned_at"`
	ReleasedAt     time.Time   `json:"released_at,omitzero"`
	ReleaseEventID int64       `json:"release_event_id,omitempty"`
	// Releasing: the release started (the node takes no work, its tokens
	// are revoked) and the provider has not confirmed it yet; the node is
	// billed until it does (ReleasedAt).
	Releasing  bool   `json:"releasing"`
	Failed     bool   `json:"failed"`
	Registered bool   `json:"registered"`
	Idle       bool   `json:"idle"` // holds no job (allocation or open lease)
	State      string `json:"state"`
}

// TryBurstLock takes the burst lock for the current transaction; false
// when another evaluation holds it.
func (s *Store) TryBurstLock(ctx context.Context) (bool, error) {
	var ok bool
	err := s.db.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, burstLock).Scan(&ok)
	return ok, mapErr("taking the burst lock", err)
}

const burstEventCols = `id, at, kind, status, provider, reason, pending_gpu_seconds, mean_wait_s, pending_jobs, nodes_wanted,
	gpu_type, gpus_per_node, node_names, attempts, error, finished_at`

func scanBurstEvent(r pgx.Row) (BurstEvent, error) {
	var e BurstEvent
	var fin *time.Time
	err := r.Scan(&e.ID, &e.At, &e.Kind, &e.Status, &e.Provider, &e.Reason, &e.PendingGPUSeconds, &e.MeanWaitS, &e.PendingJobs,
		&e.NodesWanted, &e.GPUType, &e.GPUsPerNode, &e.NodeNames, &e.Attempts, &e.Error, &fin)
	if fin != nil {
		e.FinishedAt = *fin
	}
	return e, err
}

// CreateBurstEvent stores e (status pending) with its audit entry
// (burst.request or burst.release, actor system) and sets e.ID and e.At.
func (s *Store) CreateBurstEvent(ctx context.Context, e *BurstEvent) error {
	e.At, e.Status = s.Now(), BurstPending
	if e.NodeNames == nil {
		e.NodeNames = []string{}
	}
	err := s.db.QueryRow(ctx, `
		INSERT INTO burst_events (at, kind, status, provider, reason, pending_gpu_seconds, mean_wait_s, pending_jobs, nodes_wanted,
			gpu_type, gpus_per_node, node_names)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id`,
		e.At, e.Kind, e.Status, e.Provider, e.Reason, e.PendingGPUSeconds, e.MeanWaitS, e.PendingJobs, e.NodesWanted,
		e.GPUType, e.GPUsPerNode, e.NodeNames).Scan(&e.ID)
	if err != nil {
		return mapErr("storing burst event", err)
	}
	after, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return s.Audit(ctx, &allot.AuditEntry{Actor: allot.ActorSystem, Action: "burst." + e.Kind,
		Object: fmt.Sprintf("burst_event:%d", e.ID), After: after, Note: e.Reason})
}

// BurstEventByID returns one event.
func (s *Store) BurstEventByID(ctx context.Context, id int64) (BurstEvent, error) {
	e, err := scanBurstEvent(s.db.QueryRow(ctx, `SELECT `+burstEventCols+` FROM burst_events WHERE id = $1`, id))
	if err == pgx.ErrNoRows {
		return e, allot.Errorf(allot.ENotFound, "burst event %d not found", id)
	}
	return e, mapErr("loading burst event", err)
}

// lockBurstEvent locks an open event for its provider call's outcome.
func (s *Store) lockBurstEvent(ctx context.Context, id int64) (BurstEvent, error) {
	e, err := scanBurstEvent(s.db.QueryRow(ctx, `SELECT `+burstEventCols+` FROM burst_events WHERE id = $1 FOR UPDATE`, id))
	if err == pgx.ErrNoRows {
		return e, allot.Errorf(allot.ENotFound, "burst event %d not found", id)
	}
	return e, mapErr("loading burst event", err)
}

// ListBurstEvents returns the newest events first.
func (s *Store) ListBurstEvents(ctx context.Context, limit int) ([]BurstEvent, error) {
	rows, err := s.db.Query(ctx, `SELECT `+burstEventCols+` FROM burst_events ORDER BY at DESC, id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, mapErr("listing burst events", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BurstEvent, error) { return scanBurstEvent(r) })
	return out, mapErr("listing burst events", err)
}

// BurstInFlight returns how many nodes open request events (pending or
// retrying) still wait for from their provider.
func (s *Store) BurstInFlight(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, `SELECT coalesce(sum(nodes_wanted), 0)::int FROM burst_events WHERE kind = 'request' AND status IN ('pending', 'retrying')`).Scan(&n)
	return n, mapErr("counting burst requests in flight", err)
}

// BurstNodes returns the burst nodes not yet released (alive, or being
// released) or, with since non-zero, also those released after since; by
// provision time.
func (s *Store) BurstNodes(ctx context.Context, since time.Time) ([]BurstNode, error) {
	var sinceArg *time.Time
	if !since.IsZero() {
		sinceArg = &since
	}
	rows, err := s.db.Query(ctx, `
		SELECT `+burstNodeColumns+`,
			NOT EXISTS (SELECT 1 FROM allocations a WHERE a.node = b.node AND a.released_at IS NULL)
				AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.node = b.node AND l.state <> 'exited')
		FROM burst_nodes b JOIN nodes n ON n.name = b.node
		WHERE b.released_at IS NULL OR ($1::timestamptz IS NOT NULL AND b.released_at > $1)
		ORDER BY b.provisioned_at, b.node, b.event_id`, sinceArg)
	return collectBurstNodes(rows, err, true)
}

// BurstNodesOfEvents returns every node requested or released by the
// given events.
func (s *Store) BurstNodesOfEvents(ctx context.Context, ids []int64) ([]BurstNode, error) {
	rows, err := s.db.Query(ctx, `
		SELECT `+burstNodeColumns+`
		FROM burst_nodes b JOIN nodes n ON n.name = b.node
		WHERE b.event_id = ANY($1) OR b.release_event_id = ANY($1) ORDER BY b.provisioned_at, b.node, b.event_id`, ids)
	return collectBurstNodes(rows, err, false)
}

// burstNodeColumns are the columns of a BurstNode (b: burst_nodes, n:
// nodes) that collectBurstNodes reads, in its order.
const burstNodeColumns = `b.node, b.event_id, b.provider, n.gpu_type, b.gpus, b.rate_micros, b.currency, b.provisioned_at, b.released_at,
			coalesce(b.release_event_id, 0), b.failed, n.registered_at IS NOT NULL, n.state`

// collectBurstNodes reads the rows of a query of burstNodeColumns and,
// withIdle, an idle flag after them.
func collectBurstNodes(rows pgx.Rows, err error, withIdle bool) ([]BurstNode, error) {
	if err != nil {
		return nil, mapErr("listing burst nodes", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BurstNode, error) {
		var b BurstNode
		var rel *time.Time
		dst := []any{&b.Node, &b.EventID, &b.Provider, &b.GPUType, &b.GPUs, &b.Rate.Micros, &b.Rate.Currency, &b.ProvisionedAt, &rel,
			&b.ReleaseEventID, &b.Failed, &b.Registered, &b.State}
		if withIdle {
			dst = append(dst, &b.Idle)
		}
		err := r.Scan(dst...)
		if rel != nil {
			b.ReleasedAt = *rel
		}
		b.Releasing = b.ReleaseEventID != 0 && rel == nil
		return b, err
	})
	return out, mapErr("listing burst nodes", err)
}

// RateAt returns the hourly rate of gpuType in force at t.
func (s *Store) RateAt(ctx context.Context, gpuType string, t time.Time) (allot.Money, error) {
	var m allot.Money
	err := s.db.QueryRow(ctx, `SELECT rate_micros, currency FROM gpu_rates WHERE gpu_type = $1 AND effective_from <= $2
		ORDER BY effective_from DESC LIMIT 1`, gpuType, t).Scan(&m.Micros, &m.Currency)
	if err == pgx.ErrNoRows {
		return m, allot.Errorf(allot.ENotFound, "GPU type %q has no rate in the rate card", gpuType)
	}
	return m, mapErr("loading rate", err)
}

// NewNodeTokenSecret makes a node token's plaintext; StoreNodeToken (or
// BurstProvisioned) stores its hash.
func NewNodeTokenSecret() string { return NodeTokenPrefix + randomSecret() }

func (s *Store) insertNodeToken(ctx context.Context, node, secret, createdBy string) error {
	_, err := s.db.Exec(ctx, `INSERT INTO node_tokens (node, prefix, token_hash, created_by, created_at) VALUES ($1, $2, $3, $4, $5)`,
		node, secret[:len(NodeTokenPrefix)+6], hashSecret(secret), createdBy, s.Now())
	return mapErr("creating node token", err)
}

// BurstProvisioned records what a provider returned for request event id,
// in one transaction: the nodes (site cloud, down until their agents
// register), their node tokens (tokens[i] for names[i]), their burst rows
// priced at rate, and the event done with the node names. A name that
// was a burst node before, released since (a provider that reuses host
// names), gets its nodes row back, reset to a new cloud node that has not
// registered; any other existing name (an on-premise node, a burst node
// still alive) is refused. Nothing is written if any of it fails.
func (s *Store) BurstProvisioned(ctx context.Context, id int64, names, tokens []string, rate allot.Money, attempt int) error {
	if len(names) != len(tokens) {
		return allot.Errorf(allot.EInvalid, "%d node names for %d tokens", len(names), len(tokens))
	}
	return s.InTx(ctx, func(tx *Store) error {
		e, err := tx.lockBurstEvent(ctx, id)
		if err != nil {
			return err
		}
		if e.Kind != BurstRequest || (e.Status != BurstPending && e.Status != BurstRetrying) {
			return allot.Errorf(allot.EConflict, "burst event %d is %s, not an open request", id, e.Status)
		}
		now := tx.Now()
		for i, name := range names {
			if err := tx.burstNodeRow(ctx, name, e); err != nil {
				return err
			}
			if _, err := tx.db.Exec(ctx, `UPDATE nodes SET state_reason = $2 WHERE name = $1`, name,
				fmt.Sprintf("burst node (event %d): waiting for its agent to register", id)); err != nil {
				return mapErr("creating burst node", err)
			}
			if err := tx.insertNodeToken(ctx, name, tokens[i], "burst"); err != nil {
				return err
			}
			if _, err := tx.db.Exec(ctx, `INSERT INTO burst_nodes (node, event_id, provider, gpus, rate_micros, currency, provisioned_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7)`, name, id, e.Provider, e.GPUsPerNode, rate.Micros, rate.Currency, now); err != nil {
				return mapErr("creating burst node", err)
			}
		}
		_, err = tx.db.Exec(ctx, `UPDATE burst_events SET status = 'done', node_names = $2, attempts = $3, finished_at = $4, error = '' WHERE id = $1`,
			id, names, attempt, now)
		return mapErr("finishing burst event", err)
	})
}

// burstNodeRow creates the nodes row of burst node name for request e,
// or reactivates it when name is a burst node released before.
func (s *Store) burstNodeRow(ctx context.Context, name string, e BurstEvent) error {
	var burstRows, open int
	err := s.db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE released_at IS NULL) FROM burst_nodes WHERE node = $1`, name).
		Scan(&burstRows, &open)
	if err != nil {
		return mapErr("checking burst node", err)
	}
	if burstRows == 0 {
		n := allot.Node{Name: name, GPUType: e.GPUType, GPUCount: e.GPUsPerNode, Site: allot.SiteCloud, State: allot.NodeDown}
		if err := s.CreateNode(ctx, &n); err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
		return nil
	}
	if open > 0 {
		return allot.Errorf(allot.EConflict, "node %s: the provider returned a burst node that is still alive or being released", name)
	}
	// Released before: the same name is a new machine. It has not
	// registered; its old tokens were revoked at its release.
	_, err = s.db.Exec(ctx, `UPDATE nodes SET gpu_type = $2, gpu_count = $3, site = 'cloud', state = 'down', registered_at = NULL,
			last_heartbeat = NULL, last_contact = NULL, hostname = '', drain_source = '', drain_reason = '', drained_at = NULL, health_ok_since = NULL, health_output = ''
		WHERE name = $1`, name, e.GPUType, e.GPUsPerNode)
	if err != nil {
		return mapErr("reactivating burst node", err)
	}
	if _, err := s.db.Exec(ctx, `DELETE FROM node_gpus WHERE node = $1`, name); err != nil {
		return mapErr("reactivating burst node", err)
	}
	_, err = s.db.Exec(ctx, `UPDATE node_tokens SET revoked_at = $2 WHERE node = $1 AND revoked_at IS NULL`, name, s.Now())
	return mapErr("reactivating burst node", err)
}

// BurstAttemptFailed records a failed provider call of event id: status
// retrying (another attempt follows) or, when final, failed.
func (s *Store) BurstAttemptFailed(ctx context.Context, id int64, attempt int, msg string, final bool) error {
	status, fin := BurstRetrying, (*time.Time)(nil)
	if final {
		now := s.Now()
		status, fin = BurstFailed, &now
	}
	_, err := s.db.Exec(ctx, `UPDATE burst_events SET status = $2, attempts = $3, error = $4, finished_at = $5
		WHERE id = $1 AND status IN ('pending', 'retrying')`, id, status, attempt, msg, fin)
	return mapErr("recording burst failure", err)
}

// BurstReleaseDone marks release event id done after the provider
// removed its nodes: only now are they released (released_at, which ends
// their cost). An event already failed (given up on as stuck) is done
// after all: its nodes' release, started, is confirmed whichever event
// they moved to since.
func (s *Store) BurstReleaseDone(ctx context.Context, id int64, attempt int) error {
	return s.InTx(ctx, func(tx *Store) error {
		now := tx.Now()
		var names []string
		err := tx.db.QueryRow(ctx, `UPDATE burst_events SET status = 'done', attempts = greatest(attempts, $2), error = '', finished_at = $3
			WHERE id = $1 AND kind = 'release' AND status <> 'done' RETURNING node_names`, id, attempt, now).Scan(&names)
		if err == pgx.ErrNoRows {
			return nil // done already
		}
		if err != nil {
			return mapErr("finishing burst release", err)
		}
		rows, err := tx.db.Query(ctx, `UPDATE burst_nodes SET released_at = greatest($2, provisioned_at)
			WHERE node = ANY($1) AND release_event_id IS NOT NULL AND released_at IS NULL RETURNING node`, names, now)
		if err != nil {
			return mapErr("finishing burst release", err)
		}
		if names, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return mapErr("finishing burst release", err)
		}
		_, err = tx.db.Exec(ctx, `UPDATE nodes SET state_reason = $2 WHERE name = ANY($1) AND state = 'down'`, names,
			fmt.Sprintf("burst node released (event %d)", id))
		return mapErr("finishing burst release", err)
	})
}

// BurstReleasesToRetry returns the burst nodes whose release started but
// whose release event failed (every provider attempt failed): they are
// still billed and must be released again.
func (s *Store) BurstReleasesToRetry(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT b.node FROM burst_nodes b JOIN burst_events e ON e.id = b.release_event_id
		WHERE b.released_at IS NULL AND e.status = 'failed' ORDER BY b.node`)
	if err != nil {
		return nil, mapErr("listing burst releases to retry", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, mapErr("listing burst releases to retry", err)
}

// RetryBurstRelease stores release event e (with its audit entry) for the
// named nodes, whose earlier release failed, and moves them to it. Nodes
// released meanwhile or whose release is still open are skipped; with
// none left, no event is stored.
func (s *Store) RetryBurstRelease(ctx context.Context, e *BurstEvent, names []string) ([]string, error) {
	var retry []string
	err := s.InTx(ctx, func(tx *Store) error {
		rows, err := tx.db.Query(ctx, `SELECT b.node FROM burst_nodes b JOIN burst_events e ON e.id = b.release_event_id
			WHERE b.node = ANY($1) AND b.released_at IS NULL AND e.status = 'failed' ORDER BY b.node FOR UPDATE OF b`, names)
		if err != nil {
			return mapErr("retrying burst release", err)
		}
		if retry, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(retry) == 0 {
			return mapErr("retrying burst release", err)
		}
		e.NodeNames, e.NodesWanted = retry, len(retry)
		if err := tx.CreateBurstEvent(ctx, e); err != nil {
			return err
		}
		_, err = tx.db.Exec(ctx, `UPDATE burst_nodes SET release_event_id = $2 WHERE node = ANY($1) AND released_at IS NULL`, retry, e.ID)
		return mapErr("retrying burst release", err)
	})
	return retry, err
}

// FailStuckBurstEvents marks failed every open event (pending or retrying)
// created before cutoff: its provider job died or its final outcome was
// never written. A request stops counting as capacity in flight; the
// nodes of a release are released again by a later evaluation. It
// returns the events.
func (s *Store) FailStuckBurstEvents(ctx context.Context, cutoff time.Time) ([]int64, error) {
	rows, err := s.db.Query(ctx, `UPDATE burst_events SET status = 'failed', finished_at = $2,
			error = CASE WHEN error = '' THEN 'no outcome from the provider since ' || to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS UTC')
				ELSE error || ' (then no outcome since ' || to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS UTC') || ')' END
		WHERE status IN ('pending', 'retrying') AND at < $1 RETURNING id`, cutoff, s.Now())
	if err != nil {
		return nil, mapErr("failing stuck burst events", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	return out, mapErr("failing stuck burst events", err)
}

// releasedBurstNode is an SQL condition true for a node (alias n) that was
// a burst node and is released: it is no longer part of the cluster.
const releasedBurstNode = `(EXISTS (SELECT 1 FROM burst_nodes rb WHERE rb.node = n.name)
	AND NOT EXISTS (SELECT 1 FROM burst_nodes rb WHERE rb.node = n.name AND rb.released_at IS NULL))`

// ReleaseBurstNodes starts the release of the named burst nodes by
// release event e (stored here, with its audit entry): each must still be
// idle, checked under the scheduling-cycle lock (so no cycle places a job
// on it meanwhile); it goes down with a reason (it takes no more work),
// its node tokens are revoked and its burst row points at e (failed: it
// never registered, or was lost). It stays billed until the provider
// confirms (BurstReleaseDone). Nodes that are busy, already being
// released or released are skipped. It returns the nodes whose release
// started; with none, no event is stored.
func (s *Store) ReleaseBurstNodes(ctx context.Context, e *BurstEvent, names []string, failed bool) ([]string, error) {
	var released []string
	err := s.InTx(ctx, func(tx *Store) error {
		released = nil
		if _, err := tx.db.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, cycleLock); err != nil {
			return mapErr("taking the cycle lock", err)
		}
		for _, name := range names {
			var idle bool
			err := tx.db.QueryRow(ctx, `
				SELECT NOT EXISTS (SELECT 1 FROM allocations a WHERE a.node = b.node AND a.released_at IS NULL)
					AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.node = b.node AND l.state <> 'exited')
				FROM burst_nodes b JOIN nodes n ON n.name = b.node
				WHERE b.node = $1 AND b.released_at IS NULL AND b.release_event_id IS NULL FOR UPDATE OF b, n`, name).Scan(&idle)
			if err == pgx.ErrNoRows {
				continue
			}
			if err != nil {
				return mapErr("checking burst node", err)
			}
			if idle {
				released = append(released, name)
			}
		}
		if len(released) == 0 {
			return nil
		}
		e.NodeNames, e.NodesWanted = released, len(released)
		if err := tx.CreateBurstEvent(ctx, e); err != nil {
			return err
		}
		now := tx.Now()
		reason := fmt.Sprintf("burst node being released (event %d)", e.ID)
		if failed {
			reason = fmt.Sprintf("burst node failed (never registered or lost); being released (event %d)", e.ID)
		}
		if _, err := tx.db.Exec(ctx, `UPDATE nodes SET state = 'down', state_reason = $2 WHERE name = ANY($1)`, released, reason); err != nil {
			return mapErr("releasing burst nodes", err)
		}
		if _, err := tx.db.Exec(ctx, `UPDATE node_tokens SET revoked_at = $2 WHERE node = ANY($1) AND revoked_at IS NULL`, released, now); err != nil {
			return mapErr("releasing burst nodes", err)
		}
		_, err := tx.db.Exec(ctx, `UPDATE burst_nodes SET release_event_id = $2, failed = $3 WHERE node = ANY($1) AND released_at IS NULL`,
			released, e.ID, failed)
		return mapErr("releasing burst nodes", err)
	})
	return released, err
}
