package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/health"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// NodeTokenPrefix starts every node token.
const NodeTokenPrefix = "allot_node_"

// OrdersChannel is the PostgreSQL NOTIFY channel that wakes the agents'
// long polls; the payload is the node name.
const OrdersChannel = "allot_orders"

// NodeGPU is one GPU of a node's inventory.
type NodeGPU struct {
	Index       int
	UUID        string
	Model       string
	MemoryMiB   int64
	NVLinkPeers []int
}

// NodeInventory is what an agent reports at registration.
type NodeInventory struct {
	Hostname, AgentVersion, Backend, Driver, Domain string
	GPUs                                            []NodeGPU
	Running                                         []LeaseRef // jobs the agent still runs
}

// LeaseRef names one node's part of one run segment of a job.
type LeaseRef = allot.LeaseRef

// scanLeaseRef maps a (job_id, segment) row.
func scanLeaseRef(r pgx.CollectableRow) (LeaseRef, error) {
	var l LeaseRef
	return l, r.Scan(&l.JobID, &l.Segment)
}

func notify(ctx context.Context, db DBTX, nodes ...string) error {
	if len(nodes) == 0 {
		return nil
	}
	// One statement for them all (PostgreSQL folds repeats within a
	// transaction).
	if _, err := db.Exec(ctx, `SELECT pg_notify($1, n) FROM unnest($2::text[]) n`, OrdersChannel, nodes); err != nil {
		return mapErr("notifying node", err)
	}
	return nil
}

// RegisterNode records an agent's inventory, brings a down node up, makes
// every open order be sent again, and reconciles the leases the agent
// reports running with the node's leases (allot.ReconcileRegistration):
// reported leases run on (seen now; a taken one runs from now), a taken
// lease it does not report is offered again (or ends, when asked to stop),
// a running one it does not report is asked to stop (its exit report may
// follow; EndUnconfirmedStops ends it otherwise). It returns the leases the
// agent reported that the node does not hold (ended on the server, never
// taken, unknown): the agent kills them. One that ended on the server keeps
// its GPUs allocated until the agent confirms the kill, so no other job
// gets GPUs its process still uses.
// A GPU the node had (by UUID; by index when it had none) that the agent
// no longer reports is kept in the node's lost GPUs: the gpu_missing health
// rule counts it until it is back or an admin undrains the node. A new
// node's first registration just sets its inventory.
func (s *Store) RegisterNode(ctx context.Context, node string, inv NodeInventory) ([]Orphan, error) {
	f := allot.FieldErrors{}
	if len(inv.GPUs) == 0 || len(inv.GPUs) > allot.MaxGPUsPerNode {
		f.Add("gpus", "must list 1 to %d GPUs", allot.MaxGPUsPerNode)
	}
	seen := map[int]bool{}
	for _, g := range inv.GPUs {
		if g.Index < 0 || g.Index >= len(inv.GPUs) || seen[g.Index] {
			f.Add("gpus", "GPU indices must be 0..%d, each once", len(inv.GPUs)-1)
		}
		seen[g.Index] = true
	}
	if err := f.Err(); err != nil {
		return nil, err
	}
	var orphans []Orphan
	err := s.InTx(ctx, func(tx *Store) error {
		now := tx.Now()
		_, err := tx.db.Exec(ctx, `
			UPDATE nodes SET hostname = $2, agent_version = $3, gpu_backend = $4, driver_version = $5, registered_at = $6,
				last_heartbeat = $6, gpu_count = $7, domain = CASE WHEN $8 = '' THEN domain ELSE $8 END,
				state = CASE WHEN state <> 'down' THEN state WHEN drain_source <> '' THEN 'drained' ELSE 'up' END,
				state_reason = CASE WHEN state <> 'down' THEN state_reason ELSE drain_reason END
			WHERE name = $1`, node, inv.Hostname, inv.AgentVersion, inv.Backend, inv.Driver, now, len(inv.GPUs), inv.Domain)
		if err != nil {
			return mapErr("registering node", err)
		}
		if err := tx.noteInventory(ctx, node, inv.GPUs); err != nil {
			return err
		}
		if err := tx.keepLostGPUs(ctx, node, inv.GPUs); err != nil {
			return err
		}
		if _, err := tx.db.Exec(ctx, `DELETE FROM node_gpus WHERE node = $1`, node); err != nil {
			return mapErr("registering node", err)
		}
		for _, g := range inv.GPUs {
			peers := g.NVLinkPeers
			if peers == nil {
				peers = []int{}
			}
			if _, err := tx.db.Exec(ctx, `INSERT INTO node_gpus (node, gpu_index, uuid, model, memory_mib, nvlink_peers) VALUES ($1, $2, $3, $4, $5, $6)`,
				node, g.Index, g.UUID, g.Model, g.MemoryMiB, peers); err != nil {
				return mapErr("registering node GPUs", err)
			}
		}
		if _, err := tx.db.Exec(ctx, `UPDATE leases SET offer_sent_at = NULL, start_sent_at = NULL, stop_sent_at = NULL WHERE node = $1 AND state <> 'exited'`, node); err != nil {
			return mapErr("registering node", err)
		}
		leases, err := tx.nodeLeases(ctx, node, inv.Running)
		if err != nil {
			return err
		}
		for _, d := range allot.ReconcileRegistration(leases, inv.Running) {
			r := d.Ref
			switch d.Action {
			case allot.ActSeen:
				_, err = tx.db.Exec(ctx, `UPDATE leases SET seen_at = $4 WHERE job_id = $1 AND segment = $2 AND node = $3`, r.JobID, r.Segment, node, now)
			case allot.ActAdopt:
				_, err = tx.db.Exec(ctx, `UPDATE leases SET state = 'running', started_at = $4, seen_at = $4 WHERE job_id = $1 AND segment = $2 AND node = $3`,
					r.JobID, r.Segment, node, now)
			case allot.ActReoffer:
				_, err = tx.db.Exec(ctx, `UPDATE leases SET state = 'offered', taken_at = NULL WHERE job_id = $1 AND segment = $2 AND node = $3`,
					r.JobID, r.Segment, node)
			case allot.ActEnd:
				err = tx.endLostLease(ctx, node, r, now, false)
			case allot.ActAwaitExit:
				_, err = tx.db.Exec(ctx, `UPDATE leases SET stop_requested_at = $4, stop_reason = $5, stop_grace_s = 0
					WHERE job_id = $1 AND segment = $2 AND node = $3 AND stop_requested_at IS NULL`, r.JobID, r.Segment, node, now, string(allot.ReasonAgentRestarted))
			case allot.ActKill:
				orphans = append(orphans, Orphan{LeaseRef: r})
			case allot.ActKillAndHold:
				var o Orphan
				o, err = tx.holdOrphan(ctx, node, r, now)
				orphans = append(orphans, o)
			case allot.ActRelease:
				err = tx.releaseOrphan(ctx, node, r, now)
			}
			if err != nil {
				return mapErr("registering node", err)
			}
		}
		return notify(ctx, tx.db, node)
	})
	return orphans, err
}

// Orphan is a lease a node's agent reported running that the node does not
// hold on the server: the agent must kill its process.
type Orphan struct {
	LeaseRef
	// Ended: the lease ended on the server (lost node, unconfirmed stop,
	// cancel); else the node never held it, or only as an offer.
	Ended bool
	// Held are its GPUs kept allocated to it until the agent confirms the
	// kill; Shared are GPUs of it that another job's allocation already
	// holds (they were given away before the agent reported it).
	Held, Shared []int
}

// nodeLeases loads the leases of node that a registration or heartbeat
// reconciles: open ones, exited ones whose GPUs are still held, and those
// reported.
func (s *Store) nodeLeases(ctx context.Context, node string, reported []LeaseRef) ([]allot.NodeLease, error) {
	jobs, segs := make([]int64, len(reported)), make([]int32, len(reported))
	for i, r := range reported {
		jobs[i], segs[i] = r.JobID, int32(r.Segment)
	}
	rows, err := s.db.Query(ctx, nodeLeasesSQL, node, jobs, segs)
	return collectNodeLeases(rows, err)
}

// nodeLeasesSQL is nodeLeases' query: $1 the node, $2 and $3 the jobs and
// segments reported. It gathers the keys first (the open leases, the
// reported ones, those with open allocations on the node) and reads each
// lease once: a union of whole lease rows hashed every column.
const nodeLeasesSQL = `
		WITH k AS (
			SELECT job_id, segment FROM leases WHERE node = $1 AND state <> 'exited'
			UNION
			SELECT j, s FROM unnest($2::bigint[], $3::int[]) AS r(j, s)
			UNION
			SELECT job_id, segment FROM allocations WHERE node = $1 AND released_at IS NULL)
		SELECT l.job_id, l.segment, l.state, l.stop_requested_at IS NOT NULL,
			l.state = 'exited' AND EXISTS (SELECT 1 FROM allocations a WHERE a.node = $1 AND a.job_id = l.job_id AND a.segment = l.segment AND a.released_at IS NULL)
		FROM k JOIN leases l ON l.job_id = k.job_id AND l.segment = k.segment AND l.node = $1
		ORDER BY l.job_id, l.segment`

// collectNodeLeases reads nodeLeasesSQL's rows.
func collectNodeLeases(rows pgx.Rows, err error) ([]allot.NodeLease, error) {
	if err != nil {
		return nil, mapErr("loading the node's leases", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (allot.NodeLease, error) {
		var l allot.NodeLease
		var state string
		err := r.Scan(&l.Ref.JobID, &l.Ref.Segment, &state, &l.Stopping, &l.Held)
		l.State = allot.LeaseState(state)
		return l, err
	})
	return out, mapErr("loading the node's leases", err)
}

// holdOrphan keeps the GPUs of an ended lease that node's agent still runs
// allocated to it from now (those no other allocation holds) and records
// the orphan; the agent is told to kill it.
func (s *Store) holdOrphan(ctx context.Context, node string, r LeaseRef, now time.Time) (Orphan, error) {
	o := Orphan{LeaseRef: r, Ended: true}
	if _, err := s.db.Exec(ctx, `UPDATE leases SET orphaned_at = coalesce(orphaned_at, $4) WHERE job_id = $1 AND segment = $2 AND node = $3 AND state = 'exited'`,
		r.JobID, r.Segment, node, now); err != nil {
		return o, mapErr("recording orphan", err)
	}
	if _, err := s.db.Exec(ctx, `
		INSERT INTO allocations (job_id, segment, node, gpu_index, started_at)
		SELECT l.job_id, l.segment, l.node, g, $4 FROM leases l, unnest(l.gpu_indices) AS g
		WHERE l.job_id = $1 AND l.segment = $2 AND l.node = $3 AND l.state = 'exited'
		ON CONFLICT (node, gpu_index) WHERE released_at IS NULL DO NOTHING`, r.JobID, r.Segment, node, now); err != nil {
		return o, mapErr("holding the GPUs of an orphan", err)
	}
	rows, err := s.db.Query(ctx, `
		SELECT g, a.job_id = l.job_id AND a.segment = l.segment FROM leases l, unnest(l.gpu_indices) AS g
		JOIN allocations a ON a.node = $3 AND a.gpu_index = g AND a.released_at IS NULL
		WHERE l.job_id = $1 AND l.segment = $2 AND l.node = $3 ORDER BY g`, r.JobID, r.Segment, node)
	if err != nil {
		return o, mapErr("holding the GPUs of an orphan", err)
	}
	var g int
	var own bool
	_, err = pgx.ForEachRow(rows, []any{&g, &own}, func() error {
		if own {
			o.Held = append(o.Held, g)
		} else {
			o.Shared = append(o.Shared, g)
		}
		return nil
	})
	return o, mapErr("holding the GPUs of an orphan", err)
}

// releaseOrphan releases the GPUs held for an ended lease whose process the
// agent confirmed gone.
func (s *Store) releaseOrphan(ctx context.Context, node string, r LeaseRef, now time.Time) error {
	var state string
	err := s.db.QueryRow(ctx, `SELECT state FROM leases WHERE job_id = $1 AND segment = $2 AND node = $3`, r.JobID, r.Segment, node).Scan(&state)
	if err != nil || state != string(allot.LeaseExited) {
		return mapErr("releasing an orphan", err)
	}
	return s.releaseAllocations(ctx, r.JobID, r.Segment, node, now)
}

// keepLostGPUs updates node's lost GPUs for a registration reporting now:
// those it had (registered before, or already lost) that are not in now.
// A node without an inventory (new, or a burst node's name reused for a
// new machine) loses nothing.
func (s *Store) keepLostGPUs(ctx context.Context, node string, now []NodeGPU) error {
	var lost []health.LostGPU
	err := s.db.QueryRow(ctx, `
		SELECT coalesce((SELECT jsonb_agg(jsonb_build_object('index', gpu_index, 'uuid', uuid) ORDER BY gpu_index) FROM node_gpus WHERE node = $1)
			|| lost_gpus, '[]')
		FROM nodes WHERE name = $1`, node).Scan(&lost)
	if err != nil {
		return mapErr("registering node", err)
	}
	uuids, indices := map[string]bool{}, map[int]bool{}
	for _, g := range now {
		uuids[g.UUID], indices[g.Index] = true, true
	}
	keep := []health.LostGPU{}
	seen := map[health.LostGPU]bool{}
	for _, g := range lost {
		present := uuids[g.UUID]
		if g.UUID == "" {
			present = indices[g.Index]
		}
		if present || seen[g] {
			continue
		}
		seen[g] = true
		keep = append(keep, g)
	}
	_, err = s.db.Exec(ctx, `UPDATE nodes SET lost_gpus = $2 WHERE name = $1 AND lost_gpus <> $2::jsonb`, node, keep)
	return mapErr("registering node", err)
}

// GPUSample is one GPU's reading in a heartbeat.
type GPUSample struct {
	Index                      int
	UtilPct, TempC, PowerW     float64
	MemUsedMiB, MemTotalMiB    int64
	ECCSingle, ECCDouble, XIDs int64
	ThrottleReasons            uint64
}

// Heartbeat records that node is alive and stores its GPU samples,
// attributed to the jobs holding the GPUs. It returns the node's state. A
// node marked down must register again (ENotFound).
func (s *Store) Heartbeat(ctx context.Context, node string, samples []GPUSample) (string, error) {
	out, err := s.RecordHeartbeat(ctx, node, samples, "")
	return out.State, err
}

// MetricsUnavailable starts the state reason of an up node whose agent
// cannot read its GPUs.
const MetricsUnavailable = "GPU metrics unavailable: "

// maxMetricsError bounds the stored metrics error.
const maxMetricsError = 512

// HeartbeatOutcome is what recording one heartbeat found.
type HeartbeatOutcome struct {
	State string
	// MetricsError is the agent's error reading its GPUs ("" when it read
	// them); MetricsFailed and MetricsBack say it started or stopped with
	// this heartbeat.
	MetricsError               string
	MetricsFailed, MetricsBack bool
}

// RecordHeartbeat records that node is alive and stores its GPU samples,
// attributed to the jobs holding the GPUs. metricsError is set when the
// agent could not read its GPUs (then there are no samples): the node keeps
// it (nodes.metrics_error) and an up node says so in its state reason
// ("GPU metrics unavailable: …") until its metrics are back; the first such
// heartbeat tells the admins. A node marked down must register again
// (ENotFound).
func (s *Store) RecordHeartbeat(ctx context.Context, node string, samples []GPUSample, metricsError string) (HeartbeatOutcome, error) {
	now := s.Now()
	var out HeartbeatOutcome
	metricsError = strings.ToValidUTF8(strings.TrimSpace(metricsError), "?")
	if len(metricsError) > maxMetricsError {
		metricsError = strings.ToValidUTF8(metricsError[:maxMetricsError], "")
	}
	if metricsError != "" {
		samples = nil // whatever came with it is not a reading
	}
	var old string
	err := s.db.QueryRow(ctx, `
		UPDATE nodes n SET last_heartbeat = $2, metrics_error = $3,
			metrics_error_since = CASE WHEN $3 = '' THEN NULL ELSE coalesce(n.metrics_error_since, $2) END,
			state_reason = CASE
				WHEN n.state = 'up' AND $3 <> '' AND (n.state_reason = '' OR starts_with(n.state_reason, $4)) THEN $4 || $3
				WHEN n.state = 'up' AND $3 = '' AND starts_with(n.state_reason, $4) THEN ''
				ELSE n.state_reason END
		FROM (SELECT name, metrics_error FROM nodes WHERE name = $1) o
		WHERE n.name = o.name AND n.state <> 'down' AND n.registered_at IS NOT NULL RETURNING n.state, o.metrics_error`,
		node, now, metricsError, MetricsUnavailable).Scan(&out.State, &old)
	if err == pgx.ErrNoRows {
		return out, allot.Errorf(allot.ENotFound, "node %s is not registered (or was marked down): register again", node)
	}
	if err != nil {
		return out, mapErr("recording heartbeat", err)
	}
	out.MetricsError, out.MetricsFailed, out.MetricsBack = metricsError, metricsError != "" && old == "", metricsError == "" && old != ""
	if out.MetricsFailed {
		if err := s.Notify(ctx, Notification{Kind: "node.metrics_unavailable", Severity: "warning", Subject: "node:" + node, Link: "/nodes/" + node,
			Message: fmt.Sprintf("Node %s: the agent cannot read its GPUs (%s). Its health rules over GPU metrics are unknown until they are back; the node is not drained for it.", node, metricsError)}); err != nil {
			return out, err
		}
	}
	if len(samples) == 0 {
		return out, nil
	}
	n := len(samples)
	idx, util, temp, power := make([]int32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	used, total, sbe, dbe, thr, xid := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, g := range samples {
		idx[i], util[i], temp[i], power[i] = int32(g.Index), float32(g.UtilPct), float32(g.TempC), float32(g.PowerW)
		used[i], total[i], sbe[i], dbe[i], thr[i], xid[i] = g.MemUsedMiB, g.MemTotalMiB, g.ECCSingle, g.ECCDouble, int64(g.ThrottleReasons), g.XIDs
	}
	_, err = s.db.Exec(ctx, `
		INSERT INTO gpu_samples (node, gpu_index, at, job_id, util_pct, mem_used_mib, mem_total_mib, temp_c, power_w, ecc_sbe_vol, ecc_dbe_vol, throttle_reasons, xid_errors)
		SELECT $1, s.i, $2, a.job_id, s.u, s.mu, s.mt, s.t, s.p, s.sbe, s.dbe, s.thr, s.xid
		FROM unnest($3::int[], $4::real[], $5::bigint[], $6::bigint[], $7::real[], $8::real[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[])
			AS s(i, u, mu, mt, t, p, sbe, dbe, thr, xid)
		LEFT JOIN allocations a ON a.node = $1 AND a.gpu_index = s.i AND a.released_at IS NULL`,
		node, now, idx, util, used, total, temp, power, sbe, dbe, thr, xid)
	return out, mapErr("recording GPU samples", err)
}

// Lease is an order for an agent: run this part of a job.
type Lease struct {
	JobID         int64
	Segment       int
	Team          string
	Command       []string
	Env           map[string]string
	WorkDir       string
	GPUs          []int
	TimeLimit     time.Duration
	CheckpointDir string
	// User is the POSIX account the job runs as ("" = the agent's default
	// job user: jobs from before accounts), Submitter the submitter's email.
	User      string
	Submitter string
	// Image is the OCI image to run in ("" = on the host); MemoryBytes and
	// MilliCPUs limit this node's part (0 = the node's default).
	Image       string
	MemoryBytes int64
	MilliCPUs   int64
}

// StopOrder tells an agent to stop a job.
type StopOrder struct {
	JobID   int64
	Segment int
	Grace   time.Duration
	Reason  string
}

// Orders are what an agent must do.
type Orders struct {
	Offer []Lease
	Start []LeaseRef
	Stop  []StopOrder
	// Unreadable are offers held back because their job's secret values
	// do not decrypt here (no --secret-key-file, or not the key that
	// sealed them): they stay unsent, for a server that has the key, or
	// expire and go back to the queue; the node's other orders go out.
	Unreadable []UnreadableOffer
}

// UnreadableOffer is an offer TakeOrders held back, and why.
type UnreadableOffer struct {
	LeaseRef
	Err string
}

// Empty reports whether there is nothing to do.
func (o *Orders) Empty() bool { return len(o.Offer) == 0 && len(o.Start) == 0 && len(o.Stop) == 0 }

// TakeOrders returns node's unsent orders and marks them sent.
func (s *Store) TakeOrders(ctx context.Context, node string) (Orders, error) {
	var o Orders
	err := s.InTx(ctx, func(tx *Store) error {
		now := tx.Now()
		rows, err := tx.db.Query(ctx, `
			UPDATE leases l SET offer_sent_at = $2
			FROM jobs j JOIN users u ON u.id = j.user_id
			WHERE j.id = l.job_id AND l.node = $1 AND l.state = 'offered' AND l.offer_sent_at IS NULL
			RETURNING l.job_id, l.segment, j.team, j.command, l.env, j.workdir, l.gpu_indices, j.time_limit_s, j.checkpoint_dir,
				j.run_as_user, u.email, j.image, j.memory_bytes, j.milli_cpus, j.secret_env`, node, now)
		if err != nil {
			return mapErr("loading offers", err)
		}
		o.Offer, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Lease, error) {
			var l Lease
			var env, secret []byte
			var gpus []int32
			var limit int64
			err := r.Scan(&l.JobID, &l.Segment, &l.Team, &l.Command, &env, &l.WorkDir, &gpus, &limit, &l.CheckpointDir,
				&l.User, &l.Submitter, &l.Image, &l.MemoryBytes, &l.MilliCPUs, &secret)
			if err != nil {
				return l, err
			}
			for _, g := range gpus {
				l.GPUs = append(l.GPUs, int(g))
			}
			l.TimeLimit = time.Duration(limit) * time.Second
			if err := json.Unmarshal(env, &l.Env); err != nil {
				return l, err
			}
			// The job's secret variables are only ever read here, into the
			// order: the lease row keeps the visible environment. A name
			// Allot sets itself (MASTER_ADDR, RANK, …) keeps Allot's value.
			var sec map[string]string
			if err := json.Unmarshal(secret, &sec); err != nil {
				return l, err
			}
			if err := openSecrets(tx.Secrets, sec); err != nil {
				o.Unreadable = append(o.Unreadable, UnreadableOffer{LeaseRef: LeaseRef{JobID: l.JobID, Segment: l.Segment}, Err: err.Error()})
				return l, nil
			}
			if len(sec) > 0 && l.Env == nil {
				l.Env = map[string]string{}
			}
			for k, v := range sec {
				if _, set := l.Env[k]; !set {
					l.Env[k] = v
				}
			}
			return l, nil
		})
		if err != nil {
			return mapErr("loading offers", err)
		}
		if len(o.Unreadable) > 0 {
			// Held back, all in one statement: unsent again, for a poll
			// after the keys are mended.
			held := map[LeaseRef]bool{}
			jobs, segs := make([]int64, len(o.Unreadable)), make([]int32, len(o.Unreadable))
			for i, u := range o.Unreadable {
				held[u.LeaseRef] = true
				jobs[i], segs[i] = u.JobID, int32(u.Segment)
			}
			if _, err := tx.db.Exec(ctx, `
				UPDATE leases l SET offer_sent_at = NULL FROM unnest($2::bigint[], $3::int[]) AS h(j, s)
				WHERE l.job_id = h.j AND l.segment = h.s AND l.node = $1`, node, jobs, segs); err != nil {
				return mapErr("holding back offers", err)
			}
			o.Offer = slices.DeleteFunc(o.Offer, func(l Lease) bool { return held[LeaseRef{JobID: l.JobID, Segment: l.Segment}] })
		}
		if o.Start, err = tx.sendStarts(ctx, node, now); err != nil {
			return err
		}
		rows, err = tx.db.Query(ctx, `
			UPDATE leases SET stop_sent_at = $2
			WHERE node = $1 AND state IN ('taken', 'running') AND stop_requested_at IS NOT NULL AND stop_sent_at IS NULL
			RETURNING job_id, segment, coalesce(stop_grace_s, 0), stop_reason`, node, now)
		if err != nil {
			return mapErr("loading stops", err)
		}
		o.Stop, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (StopOrder, error) {
			var st StopOrder
			var grace int64
			err := r.Scan(&st.JobID, &st.Segment, &grace, &st.Reason)
			st.Grace = time.Duration(grace) * time.Second
			return st, err
		})
		return mapErr("loading stops", err)
	})
	return o, err
}

// leaseState returns one lease's state, locking its row when forUpdate.
// A lease the node does not hold is ENotFound.
func (s *Store) leaseState(ctx context.Context, node string, r LeaseRef, forUpdate bool) (string, error) {
	q := `SELECT state FROM leases WHERE job_id = $1 AND segment = $2 AND node = $3`
	if forUpdate {
		q += ` FOR UPDATE`
	}
	var state string
	err := s.db.QueryRow(ctx, q, r.JobID, r.Segment, node).Scan(&state)
	if err == pgx.ErrNoRows {
		return "", allot.Errorf(allot.ENotFound, "node %s holds no lease for job %d segment %d", node, r.JobID, r.Segment)
	}
	return state, mapErr("loading lease", err)
}

// lockLease loads one lease's state for update.
func (s *Store) lockLease(ctx context.Context, node string, r LeaseRef) (string, error) {
	return s.leaseState(ctx, node, r, true)
}

// TakeLease records that node's agent is ready to run its part. When every
// lease of the gang is taken, its other nodes are woken to fetch their
// start orders (the taking node fetches its own with its next poll).
//
// It commits without waiting for the WAL to reach the disk (synchronous
// commit off for its own transaction): a take lost with a PostgreSQL crash
// leaves the lease offered, which is what the server had before; the
// offer is sent again (ExpireStaleOffers' resend for a node that still
// heartbeats, or the agent's next registration) and the agent, which
// still holds the lease as taken, takes it again (taking is idempotent).
// No process runs on a lost take: start orders go out only from
// TakeOrders, whose commit is synchronous when it sends one and so makes
// every take it saw durable first (the WAL is flushed in order). It
// touches no allocation: GPUs and billing are the cycle's (synchronous).
func (s *Store) TakeLease(ctx context.Context, node string, r LeaseRef) error {
	return s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return mapErr("taking lease", err)
		}
		if _, err := tx.db.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, r.JobID); err != nil {
			return mapErr("locking job", err)
		}
		others, err := tx.takeLocked(ctx, node, r)
		if err != nil {
			return err
		}
		return notify(ctx, tx.db, others...)
	})
}

// takeLocked takes one lease inside a transaction that holds its job's
// row lock, and returns the gang's other nodes to wake when this take
// completed the gang (none otherwise, and none for a single-node job).
func (s *Store) takeLocked(ctx context.Context, node string, r LeaseRef) ([]string, error) {
	state, err := s.lockLease(ctx, node, r)
	if err != nil {
		return nil, err
	}
	switch state {
	case "taken", "running":
		return nil, nil // already taken: idempotent
	case "exited":
		return nil, allot.Errorf(allot.EConflict, "the lease for job %d segment %d has ended", r.JobID, r.Segment)
	}
	if _, err := s.db.Exec(ctx, `UPDATE leases SET state = 'taken', taken_at = $4 WHERE job_id = $1 AND segment = $2 AND node = $3`,
		r.JobID, r.Segment, node, s.Now()); err != nil {
		return nil, mapErr("taking lease", err)
	}
	var nodes []string
	err = s.db.QueryRow(ctx, `
		SELECT CASE WHEN bool_and(state <> 'offered') THEN array_agg(node ORDER BY rank) ELSE '{}' END
		FROM leases WHERE job_id = $1 AND segment = $2`, r.JobID, r.Segment).Scan(&nodes)
	if err != nil {
		return nil, mapErr("taking lease", err)
	}
	// The taking node is not woken: its agent takes while handling an
	// answer of its orders poll and polls again after, which finds the
	// start (at worst its long poll's wait later, never lost). A
	// notifying commit holds PostgreSQL's one notification lock: a
	// single-node job's take (most of them) then takes none.
	others := nodes[:0:0]
	for _, n := range nodes {
		if n != node {
			others = append(others, n)
		}
	}
	return others, nil
}

// LeaseStarted records that the job's process runs on node. Its start is
// when the report arrived (the agent's clock is not trusted).
//
// It commits without waiting for the WAL to reach the disk: a start lost
// with a PostgreSQL crash leaves the lease taken, and the agent's next
// heartbeat (or registration), which lists the process, makes it running
// from then (allot.ActAdopt). Billing does not depend on it (allocations
// start in the cycle and end with the exit, both synchronous).
func (s *Store) LeaseStarted(ctx context.Context, node string, r LeaseRef, pid int) error {
	return s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return mapErr("recording start", err)
		}
		return tx.startedIn(ctx, node, r, pid)
	})
}

// startedIn records one start inside a transaction.
func (s *Store) startedIn(ctx context.Context, node string, r LeaseRef, pid int) error {
	state, err := s.lockLease(ctx, node, r)
	if err != nil {
		return err
	}
	switch allot.LeaseState(state) {
	case allot.LeaseRunning:
		// Already running (a repeated report, or a heartbeat adopted
		// it first): only the pid is news.
		_, err = s.db.Exec(ctx, `UPDATE leases SET pid = $4 WHERE job_id = $1 AND segment = $2 AND node = $3 AND pid IS NULL`,
			r.JobID, r.Segment, node, pid)
		return mapErr("recording start", err)
	case allot.LeaseOffered:
		return allot.Errorf(allot.EConflict, "job %d segment %d: start before the lease was taken", r.JobID, r.Segment)
	case allot.LeaseExited:
		return allot.Errorf(allot.EConflict, "the lease for job %d segment %d has ended", r.JobID, r.Segment)
	}
	now := s.Now()
	_, err = s.db.Exec(ctx, `UPDATE leases SET state = 'running', started_at = $4, seen_at = $4, pid = $5 WHERE job_id = $1 AND segment = $2 AND node = $3`,
		r.JobID, r.Segment, node, now, pid)
	return mapErr("recording start", err)
}

// LeaseExit is how one node's part of a job ended.
type LeaseExit struct {
	ExitCode       int
	Signal         string
	Reason         string
	Message        string
	At             time.Time
	LastCheckpoint *time.Time
}

// LeaseExited records the end of node's part of a job, releases its GPUs,
// and when the whole gang has ended, finishes the job: completed, failed,
// or back to pending after a preemption (allot.SettleSegment). The
// agent's time is bounded by what the server saw (allot.BoundExit): never
// before the lease was last seen alive (offered, taken, started, listed by
// a heartbeat or registration), never after the report arrived. An exit of
// a lease never taken is refused (EConflict). It is idempotent; the exit
// of a lease that already ended confirms that its process is gone, which
// releases GPUs held for it as an orphan. It reports whether the job's
// state changed (so a scheduling cycle is worth running).
func (s *Store) LeaseExited(ctx context.Context, node string, r LeaseRef, ex LeaseExit) (bool, error) {
	changed := false
	err := s.InTx(ctx, func(tx *Store) error {
		// Lock the job first: the exits of a gang's members, cancels and
		// cycles then take locks in one order and never deadlock.
		if _, err := tx.db.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, r.JobID); err != nil {
			return mapErr("locking job", err)
		}
		state, err := tx.lockLease(ctx, node, r)
		if err != nil {
			return err
		}
		now := tx.Now()
		switch allot.LeaseState(state) {
		case allot.LeaseExited:
			return tx.releaseOrphan(ctx, node, r, now)
		case allot.LeaseOffered:
			return allot.Errorf(allot.EConflict, "job %d segment %d: exit reported for a lease this node never took", r.JobID, r.Segment)
		}
		var offered time.Time
		var taken, started, seen *time.Time
		if err := tx.db.QueryRow(ctx, `SELECT offered_at, taken_at, started_at, seen_at FROM leases WHERE job_id = $1 AND segment = $2 AND node = $3`,
			r.JobID, r.Segment, node).Scan(&offered, &taken, &started, &seen); err != nil {
			return mapErr("loading lease", err)
		}
		at := allot.BoundExit(ex.At, allot.Latest(offered, deref(taken), deref(started), deref(seen)), now)
		_, err = tx.db.Exec(ctx, `
			UPDATE leases SET state = 'exited', exited_at = $4, exit_code = $5, exit_signal = $6, exit_reason = $7,
				last_checkpoint = CASE WHEN $8::timestamptz <= $4 THEN greatest(last_checkpoint, $8) ELSE last_checkpoint END
			WHERE job_id = $1 AND segment = $2 AND node = $3`, r.JobID, r.Segment, node, at, ex.ExitCode, ex.Signal, ex.Reason, ex.LastCheckpoint)
		if err != nil {
			return mapErr("recording exit", err)
		}
		if err := tx.releaseAllocations(ctx, r.JobID, r.Segment, node, at); err != nil {
			return err
		}
		if ex.Reason == string(allot.ReasonStartFailed) && ex.Message != "" {
			if err := tx.appendLog(ctx, r.JobID, []string{"allot: " + ex.Message}); err != nil {
				return err
			}
		}
		changed, err = tx.finishSegment(ctx, r)
		return err
	})
	return changed, err
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// EndUnconfirmedStops ends leases asked to stop before cutoff (plus their
// grace) that no agent confirmed: the agent restarted and lost the process,
// or never answers. They end now as if reported, so billing stops and the
// job is requeued or failed; their GPUs are released, except when the
// agent still listed the lease alive after its stop's deadline: then its
// process outlived the stop, the GPUs stay held until the agent confirms
// it is gone, and its heartbeats are answered with a kill. It returns how
// many.
func (s *Store) EndUnconfirmedStops(ctx context.Context, cutoff time.Time) (int, error) {
	n := 0
	err := s.InTx(ctx, func(tx *Store) error {
		rows, err := tx.db.Query(ctx, `
			SELECT job_id, segment, node FROM leases
			WHERE state IN ('taken', 'running') AND stop_requested_at IS NOT NULL
				AND stop_requested_at + coalesce(stop_grace_s, 0) * interval '1 second' < $1
			ORDER BY job_id, segment, node`, cutoff)
		if err != nil {
			return mapErr("finding unconfirmed stops", err)
		}
		type lease struct {
			ref  LeaseRef
			node string
		}
		ls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lease, error) {
			var l lease
			return l, r.Scan(&l.ref.JobID, &l.ref.Segment, &l.node)
		})
		if err != nil {
			return mapErr("finding unconfirmed stops", err)
		}
		for _, l := range ls {
			if err := tx.endLostLease(ctx, l.node, l.ref, tx.Now(), true); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

// endLostLease settles a lease whose process is gone without an exit
// report (its agent restarted, or never confirmed a stop): it ends at at
// with exit code -1 and its stop reason (allot.UnconfirmedLeaseEnd), as if
// the agent had reported it. With mayHold, a lease the agent listed alive
// after its stop's deadline keeps its GPUs until the agent confirms.
func (s *Store) endLostLease(ctx context.Context, node string, r LeaseRef, at time.Time, mayHold bool) error {
	if _, err := s.db.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, r.JobID); err != nil {
		return mapErr("locking job", err)
	}
	var stop string
	var seen, stopAt *time.Time
	var grace int64
	if err := s.db.QueryRow(ctx, `SELECT stop_reason, seen_at, stop_requested_at, coalesce(stop_grace_s, 0) FROM leases WHERE job_id = $1 AND segment = $2 AND node = $3`,
		r.JobID, r.Segment, node).Scan(&stop, &seen, &stopAt, &grace); err != nil {
		return mapErr("ending lost lease", err)
	}
	end := allot.UnconfirmedLeaseEnd(allot.LeaseReason(stop), at)
	hold := mayHold && allot.StillRunsAfterStop(deref(seen), deref(stopAt), time.Duration(grace)*time.Second)
	if _, err := s.db.Exec(ctx, `UPDATE leases SET state = 'exited', exited_at = $4, exit_code = $5, exit_reason = $6,
			orphaned_at = CASE WHEN $7 THEN $4 ELSE orphaned_at END
		WHERE job_id = $1 AND segment = $2 AND node = $3`, r.JobID, r.Segment, node, end.At, end.ExitCode, string(end.Reason), hold); err != nil {
		return mapErr("ending lost lease", err)
	}
	if !hold {
		if err := s.releaseAllocations(ctx, r.JobID, r.Segment, node, end.At); err != nil {
			return err
		}
	}
	_, err := s.finishSegment(ctx, r)
	return err
}

func (s *Store) releaseAllocations(ctx context.Context, jobID int64, segment int, node string, at time.Time) error {
	_, err := s.db.Exec(ctx, `UPDATE allocations SET released_at = greatest($3, started_at)
		WHERE job_id = $1 AND node = $2 AND segment = $4 AND released_at IS NULL`, jobID, node, at, segment)
	return mapErr("releasing allocations", err)
}

// finishSegment settles a job after one of its leases ended: it loads the
// segment, lets allot.SettleSegment decide and writes the decision. It
// reports whether the job's state changed. The caller holds the job's lock.
func (s *Store) finishSegment(ctx context.Context, r LeaseRef) (bool, error) {
	seg := allot.Segment{Segment: r.Segment}
	var state string
	if err := s.db.QueryRow(ctx, `SELECT state, segment, checkpointable FROM jobs WHERE id = $1 FOR UPDATE`, r.JobID).
		Scan(&state, &seg.JobSegment, &seg.Checkpointable); err != nil {
		return false, mapErr("settling job", err)
	}
	seg.JobState = allot.JobState(state)
	rows, err := s.db.Query(ctx, `
		SELECT node, state, coalesce(exit_code, 0), exit_reason, stop_reason, coalesce(exited_at, 'infinity')
		FROM leases WHERE job_id = $1 AND segment = $2 ORDER BY exited_at NULLS LAST, rank, node`, r.JobID, r.Segment)
	if err != nil {
		return false, mapErr("settling job", err)
	}
	seg.Leases, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (allot.SegmentLease, error) {
		var l allot.SegmentLease
		var st, exitReason, stopReason string
		var exited pgtype.Timestamptz
		err := row.Scan(&l.Node, &st, &l.ExitCode, &exitReason, &stopReason, &exited)
		l.State, l.ExitReason, l.StopReason = allot.LeaseState(st), allot.LeaseReason(exitReason), allot.LeaseReason(stopReason)
		if exited.InfinityModifier == pgtype.Finite {
			l.ExitedAt = exited.Time
		}
		return l, err
	})
	if err != nil {
		return false, mapErr("settling job", err)
	}
	d := allot.SettleSegment(seg)
	if d.Loss {
		// A requeue after a lost node or process: within the policy's
		// bound? (Loaded only now: most ends are no such requeue.)
		if err := s.db.QueryRow(ctx, `
			SELECT (SELECT count(DISTINCT segment) FROM leases WHERE job_id = $1 AND segment < $2
					AND exit_reason = ANY($3)),
				(SELECT max_loss_requeues FROM policy_versions ORDER BY version DESC LIMIT 1)`, r.JobID, r.Segment,
			[]string{string(allot.ReasonNodeLost), string(allot.ReasonAgentRestarted), string(allot.ReasonAgentShutdown)}).
			Scan(&seg.LossRequeues, &seg.MaxLossRequeues); err != nil {
			return false, mapErr("settling job", err)
		}
		d = allot.SettleSegment(seg)
	}
	return s.applySettlement(ctx, r, d)
}

// applySettlement writes a settlement of a job's running segment: the
// job's new state (only while it still runs), then the stop of the
// segment's unfinished leases. It reports whether the job's state changed.
func (s *Store) applySettlement(ctx context.Context, r LeaseRef, d allot.Settlement) (bool, error) {
	now := s.Now()
	changed := false
	if d.Outcome != allot.OutcomeNone {
		var tag pgconn.CommandTag
		var err error
		switch d.Outcome {
		case allot.OutcomeRequeue:
			tag, err = s.db.Exec(ctx, `UPDATE jobs SET state = 'pending', preemptions = preemptions + CASE WHEN $3 THEN 1 ELSE 0 END, updated_at = $2,
				pending_reason = $4 WHERE id = $1 AND state = 'running' AND segment = $5`, r.JobID, now, d.Preemption, d.PendingReason, r.Segment)
		case allot.OutcomeComplete, allot.OutcomeFail:
			tag, err = s.db.Exec(ctx, `UPDATE jobs SET state = $2, exit_code = coalesce($3, exit_code), end_reason = CASE WHEN $2 = 'failed' THEN $4 ELSE end_reason END,
				ended_at = $5, updated_at = $5 WHERE id = $1 AND state = 'running' AND segment = $6`, r.JobID, string(d.Outcome), d.ExitCode, d.EndReason, now, r.Segment)
		}
		if err != nil {
			return false, mapErr("settling job", err)
		}
		if tag.RowsAffected() == 0 {
			return false, nil // no longer running this segment: nothing to settle
		}
		changed = true
	}
	if d.StopOthers != "" {
		if err := s.requestStop(ctx, r.JobID, r.Segment, string(d.StopOthers), d.StopGrace); err != nil {
			return changed, err
		}
	}
	return changed, nil
}

// requestStop asks every unfinished lease of a job segment to stop. Leases
// not started yet end at once.
func (s *Store) requestStop(ctx context.Context, jobID int64, segment int, reason string, grace time.Duration) error {
	now := s.Now()
	var nodes []string
	err := s.db.QueryRow(ctx, `
		WITH u AS (
			UPDATE leases SET stop_requested_at = $3, stop_reason = $4, stop_grace_s = $5
			WHERE job_id = $1 AND segment = $2 AND state IN ('taken', 'running') AND stop_requested_at IS NULL
			RETURNING node)
		SELECT coalesce(array_agg(node), '{}') FROM u`, jobID, segment, now, reason, int64(grace/time.Second)).Scan(&nodes)
	if err != nil {
		return mapErr("requesting stop", err)
	}
	var unstarted []string
	err = s.db.QueryRow(ctx, `
		WITH u AS (
			UPDATE leases SET state = 'exited', exited_at = $3, exit_code = -1, stop_reason = $4, exit_reason = $4
			WHERE job_id = $1 AND segment = $2 AND state = 'offered'
			RETURNING node)
		SELECT coalesce(array_agg(node), '{}') FROM u`, jobID, segment, now, reason).Scan(&unstarted)
	if err != nil {
		return mapErr("requesting stop", err)
	}
	for _, n := range unstarted {
		if err := s.releaseAllocations(ctx, jobID, segment, n, now); err != nil {
			return err
		}
	}
	return notify(ctx, s.db, append(nodes, unstarted...)...)
}

// AppendLog adds lines to the tail of a job's log (the last 200 are kept).
// Only a node holding a lease of the job may write it.
//
// ends, when it has one entry per line, are the lines' end offsets in the
// job's output file (agentproto.JobLog.Ends): lines the server already has
// for the lease are dropped, so a batch resent after an agent restart is
// kept once.
func (s *Store) AppendLog(ctx context.Context, node string, r LeaseRef, lines []string, ends []int64) error {
	if len(ends) != len(lines) {
		ends = nil
	}
	return s.InTx(ctx, func(tx *Store) error { return tx.appendLeaseLog(ctx, node, r, lines, ends) })
}

func (s *Store) appendLeaseLog(ctx context.Context, node string, r LeaseRef, lines []string, ends []int64) error {
	var logEnd int64
	err := s.db.QueryRow(ctx, `SELECT log_end FROM leases WHERE job_id = $1 AND segment = $2 AND node = $3 FOR UPDATE`,
		r.JobID, r.Segment, node).Scan(&logEnd)
	if err == pgx.ErrNoRows {
		return allot.Errorf(allot.ENotFound, "node %s holds no lease for job %d segment %d", node, r.JobID, r.Segment)
	}
	if err != nil {
		return mapErr("loading lease", err)
	}
	if ends != nil {
		kept, newEnd := lines[:0:0], logEnd
		for i, l := range lines {
			if e := ends[i]; e > 0 {
				if e <= logEnd {
					continue // already received
				}
				newEnd = max(newEnd, e)
			}
			kept = append(kept, l)
		}
		lines = kept
		if newEnd > logEnd {
			if _, err := s.db.Exec(ctx, `UPDATE leases SET log_end = $4 WHERE job_id = $1 AND segment = $2 AND node = $3`,
				r.JobID, r.Segment, node, newEnd); err != nil {
				return mapErr("recording log offset", err)
			}
		}
	}
	if len(lines) == 0 {
		return nil
	}
	var members int
	if err := s.db.QueryRow(ctx, `SELECT count(*) FROM leases WHERE job_id = $1 AND segment = $2`, r.JobID, r.Segment).Scan(&members); err != nil {
		return mapErr("loading lease", err)
	}
	if members > 1 { // label each line with its node, like srun --label
		labelled := make([]string, len(lines))
		for i, l := range lines {
			labelled[i] = node + ": " + l
		}
		lines = labelled
	}
	return s.appendLog(ctx, r.JobID, lines)
}

// LogTailLines is how many lines of a job's output the server keeps.
const LogTailLines = 200

func (s *Store) appendLog(ctx context.Context, jobID int64, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	if len(lines) > LogTailLines {
		lines = lines[len(lines)-LogTailLines:]
	}
	_, err := s.db.Exec(ctx, `
		UPDATE jobs SET log_tail = (log_tail || $2::text[])[greatest(1, cardinality(log_tail) + cardinality($2::text[]) - $3 + 1):],
			first_output_at = coalesce(first_output_at, $4)
		WHERE id = $1`, jobID, lines, LogTailLines, s.Now())
	return mapErr("appending log", err)
}

// JobLog returns the kept tail of a job's output.
func (s *Store) JobLog(ctx context.Context, jobID int64) ([]string, error) {
	var lines []string
	err := s.db.QueryRow(ctx, `SELECT log_tail FROM jobs WHERE id = $1`, jobID).Scan(&lines)
	return lines, mapErr(fmt.Sprintf("loading log of job %d", jobID), err)
}

// OfferDeadlines are when an offer that was not taken expires, or is sent
// again (times: offers made or sent before them).
type OfferDeadlines struct {
	// Silent: an offer made before it expires when its node has sent no
	// heartbeat since it either (a node that went quiet: its gang must not
	// wait for it; lost nodes are marked down apart).
	Silent time.Time
	// Live: an offer made before it expires even though its node still
	// heartbeats (it does not take: it refused, e.g. its GPUs are busy
	// there). Under load a live node's take may be queued for long; it is
	// not refused for that before Live.
	Live time.Time
	// Resend: an offer sent before it to a node that heartbeat since
	// Silent is sent again (zero: none): the answer of the orders poll, or
	// the take's commit (asynchronous), was lost; the agent, holding the
	// lease as taken, takes it again (idempotent), or takes it now.
	Resend time.Time
}

// ExpireStaleOffers sends again the offers d.Resend says, then undoes the
// starts whose gang did not take all its leases by d's deadlines: the
// leases end, the GPUs are released, and the job goes back to the queue
// (allot.ExpiredOffer). Each job is settled in its own transaction, under
// its lock, after checking again that it still has such an offer (a take
// that landed meanwhile keeps it), so a take waits for one job's
// settlement, never for all of them. It returns the jobs it requeued.
func (s *Store) ExpireStaleOffers(ctx context.Context, d OfferDeadlines) ([]int64, error) {
	if !d.Resend.IsZero() {
		var nodes []string
		err := s.db.QueryRow(ctx, `
			WITH `+asyncCommitSQL+`, u AS (
				UPDATE leases l SET offer_sent_at = NULL FROM ac, nodes n
				WHERE n.name = l.node AND l.state = 'offered' AND l.offer_sent_at < $1 AND n.last_heartbeat >= $2
				RETURNING l.node)
			SELECT coalesce(array_agg(DISTINCT node), '{}') FROM u`, d.Resend, d.Silent).Scan(&nodes)
		if err != nil {
			return nil, mapErr("sending offers again", err)
		}
		if err := notify(ctx, s.db, nodes...); err != nil {
			return nil, err
		}
	}
	// $1 Silent, $2 Live; the lease l, its node n.
	const stale = `l.state = 'offered' AND (l.offered_at < $2 OR (l.offered_at < $1 AND (n.last_heartbeat IS NULL OR n.last_heartbeat < $1)))`
	rows, err := s.db.Query(ctx, `
		SELECT DISTINCT l.job_id, l.segment FROM leases l JOIN jobs j ON j.id = l.job_id AND j.segment = l.segment AND j.state = 'running'
			JOIN nodes n ON n.name = l.node
		WHERE `+stale+` ORDER BY 1, 2`, d.Silent, d.Live)
	if err != nil {
		return nil, mapErr("finding expired offers", err)
	}
	refs, err := pgx.CollectRows(rows, scanLeaseRef)
	if err != nil {
		return nil, mapErr("finding expired offers", err)
	}
	var requeued []int64
	for _, r := range refs {
		changed := false
		err := s.InTx(ctx, func(tx *Store) error {
			if _, err := tx.db.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, r.JobID); err != nil {
				return mapErr("locking job", err)
			}
			var still bool
			if err := tx.db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM leases l JOIN nodes n ON n.name = l.node
				WHERE l.job_id = $3 AND l.segment = $4 AND `+stale+`)`, d.Silent, d.Live, r.JobID, r.Segment).Scan(&still); err != nil {
				return mapErr("finding expired offers", err)
			}
			if !still {
				return nil // taken meanwhile
			}
			var err error
			changed, err = tx.applySettlement(ctx, r, allot.ExpiredOffer())
			return err
		})
		if err != nil {
			return requeued, err
		}
		if changed {
			requeued = append(requeued, r.JobID)
		}
	}
	return requeued, nil
}

// AnnounceServer records that API server id is up (call it at start and
// then every heartbeat interval).
func (s *Store) AnnounceServer(ctx context.Context, id string) error {
	now := s.Now()
	_, err := s.db.Exec(ctx, `INSERT INTO api_servers (id, started_at, last_seen) VALUES ($1, $2, $2)
		ON CONFLICT (id) DO UPDATE SET last_seen = $2`, id, now)
	return mapErr("announcing server", err)
}

// RetireServer removes an API server that stops cleanly.
func (s *Store) RetireServer(ctx context.Context, id string) error {
	_, err := s.db.Exec(ctx, `DELETE FROM api_servers WHERE id = $1`, id)
	return mapErr("retiring server", err)
}

// HeartbeatJobs stores the per-job process statistics of a heartbeat and
// reconciles its job list with node's leases (allot.ReconcileHeartbeat):
// the open leases it lists were seen alive now (leases.seen_at, the lower
// bound of their end), a taken one it lists runs from now (its start
// report was lost or is on its way: allot.ActAdopt); held GPUs of orphans it no longer lists are
// released (the kill is confirmed). It returns the leases it lists that the
// node does not hold (ended on the server, or never the node's): the agent
// kills them; one that ended keeps its GPUs allocated until the agent
// confirms.
func (s *Store) HeartbeatJobs(ctx context.Context, node string, stats []JobStat) ([]Orphan, error) {
	var orphans []Orphan
	err := s.InTx(ctx, func(tx *Store) error {
		now := tx.Now()
		listed, byRef := listedStats(stats)
		leases, err := tx.nodeLeases(ctx, node, listed)
		if err != nil {
			return err
		}
		var seen []JobStat
		for _, d := range allot.ReconcileHeartbeat(leases, listed) {
			switch d.Action {
			case allot.ActSeen:
				seen = append(seen, byRef[d.Ref])
			case allot.ActAdopt:
				// Taken, and its process runs: the start report is on its
				// way or its (asynchronous) commit was lost. It runs from
				// now; a start report arriving later changes nothing but
				// the pid.
				if _, err := tx.db.Exec(ctx, `UPDATE leases SET state = 'running', started_at = $4, seen_at = $4
					WHERE job_id = $1 AND segment = $2 AND node = $3 AND state = 'taken'`, d.Ref.JobID, d.Ref.Segment, node, now); err != nil {
					return mapErr("adopting a started lease", err)
				}
				seen = append(seen, byRef[d.Ref])
			case allot.ActKill:
				orphans = append(orphans, Orphan{LeaseRef: d.Ref})
			case allot.ActKillAndHold:
				o, err := tx.holdOrphan(ctx, node, d.Ref, now)
				if err != nil {
					return err
				}
				orphans = append(orphans, o)
			case allot.ActRelease:
				if err := tx.releaseOrphan(ctx, node, d.Ref, now); err != nil {
					return err
				}
			}
		}
		if len(seen) == 0 {
			return nil
		}
		_, err = tx.db.Exec(ctx, `
			UPDATE leases l SET cpu_seconds = u.cpu, rss_bytes = u.rss, seen_at = $2,
				last_checkpoint = CASE WHEN u.ckpt <= $2 THEN greatest(l.last_checkpoint, u.ckpt) ELSE l.last_checkpoint END
			FROM unnest($3::bigint[], $4::int[], $5::float8[], $6::bigint[], $7::timestamptz[]) AS u(j, s, cpu, rss, ckpt)
			WHERE l.job_id = u.j AND l.segment = u.s AND l.node = $1 AND l.state <> 'exited'`, seenArgs(node, now, seen)...)
		return mapErr("recording job stats", err)
	})
	return orphans, err
}

// RecordJobStats stores the agents' per-job process statistics (and
// reconciles the node's leases with them: see HeartbeatJobs).
func (s *Store) RecordJobStats(ctx context.Context, node string, stats []JobStat) error {
	_, err := s.HeartbeatJobs(ctx, node, stats)
	return err
}

// JobStat is one job's process statistics on one node.
type JobStat struct {
	JobID          int64
	Segment        int
	CPUSeconds     float64
	RSSBytes       int64
	LastCheckpoint *time.Time // newest file in ALLOT_CHECKPOINT_DIR, if any
}

// LostNodes marks down nodes silent for longer than the current policy's
// HeartbeatMissedAfter (Policy.LostAfter: at least two of the agents'
// heartbeat intervals), counting only time when an API server was up to
// hear them: after the control plane was down, agents get that long to
// reconnect.
func (s *Store) LostNodes(ctx context.Context, interval time.Duration) ([]string, error) {
	p, err := s.CurrentPolicy(ctx)
	if err != nil {
		return nil, err
	}
	after := p.LostAfter(interval)
	now := s.Now()
	var servingSince *time.Time
	if err := s.db.QueryRow(ctx, `SELECT min(started_at) FROM api_servers WHERE last_seen > $1`, now.Add(-2*interval)).Scan(&servingSince); err != nil {
		return nil, mapErr("checking API servers", err)
	}
	if servingSince == nil || now.Sub(*servingSince) < after {
		return nil, nil // no server, or one just came up: nobody could hear the agents
	}
	return s.MarkLostNodes(ctx, now.Add(-after))
}

// Contact is a node's agent knocking at an API server that refused its
// request (a heartbeat, a lease report) before reading it, with the node
// token Token, which had authenticated as Node there before.
type Contact struct {
	Node  string
	At    time.Time
	Token int64 // node_tokens.id
}

// RecordContacts records the knocks (web.Server.RecordContacts):
// MarkLostNodes counts each as a sign of its node's life. A knock with a
// token revoked since (on any server, by any path) counts for nothing. It
// never moves a contact back.
func (s *Store) RecordContacts(ctx context.Context, cs []Contact) error {
	if len(cs) == 0 {
		return nil
	}
	nodes, at, tokens := make([]string, len(cs)), make([]time.Time, len(cs)), make([]int64, len(cs))
	for i, c := range cs {
		nodes[i], at[i], tokens[i] = c.Node, c.At, c.Token
	}
	_, err := s.db.Exec(ctx, `UPDATE nodes n SET last_contact = c.at
		FROM unnest($1::text[], $2::timestamptz[], $3::bigint[]) AS c(node, at, token)
		JOIN node_tokens t ON t.id = c.token AND t.node = c.node AND t.revoked_at IS NULL
		WHERE n.name = c.node AND (n.last_contact IS NULL OR n.last_contact < c.at)`, nodes, at, tokens)
	return mapErr("recording refused heartbeats", err)
}

// MarkLostNodes marks down every node that has sent no heartbeat since
// before cutoff, and whose refused heartbeats (RecordContacts) stopped
// before cutoff too. Its unfinished leases end at the last heartbeat (usage is
// billed up to then; allot.LostLeaseEnd); checkpointable jobs go back to
// the queue, others fail with reason node_lost (allot.SettleSegment). GPUs
// held for its orphans are released at the last heartbeat too (nobody gets
// a down node's GPUs; when its agent comes back still running them they
// are held again). It returns the nodes it marked down.
func (s *Store) MarkLostNodes(ctx context.Context, cutoff time.Time) ([]string, error) {
	var lost []string
	err := s.InTx(ctx, func(tx *Store) error {
		rows, err := tx.db.Query(ctx, `
			UPDATE nodes SET state = 'down', state_reason = 'no heartbeat since ' || to_char(last_heartbeat AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS UTC')
				|| CASE WHEN last_contact > last_heartbeat
					THEN ' (last request refused by an overloaded server at ' || to_char(last_contact AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS UTC') || ')'
					ELSE '' END
			WHERE state IN ('up', 'draining', 'drained') AND registered_at IS NOT NULL AND last_heartbeat < $1 AND backend = 'native'
				AND (last_contact IS NULL OR last_contact < $1)
			RETURNING name, last_heartbeat`, cutoff)
		if err != nil {
			return mapErr("marking lost nodes", err)
		}
		type nodeHB struct {
			name string
			hb   time.Time
		}
		nodes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (nodeHB, error) {
			var n nodeHB
			return n, r.Scan(&n.name, &n.hb)
		})
		if err != nil {
			return mapErr("marking lost nodes", err)
		}
		now := tx.Now()
		for _, n := range nodes {
			lost = append(lost, n.name)
			// Lock the jobs first, in id order, as LeaseExited does.
			if _, err := tx.db.Exec(ctx, `SELECT 1 FROM jobs WHERE id IN (SELECT job_id FROM leases WHERE node = $1 AND state <> 'exited')
				ORDER BY id FOR UPDATE`, n.name); err != nil {
				return mapErr("locking jobs of lost node", err)
			}
			rows, err := tx.db.Query(ctx, `SELECT job_id, segment, offered_at FROM leases
				WHERE node = $1 AND state <> 'exited' ORDER BY job_id, segment FOR UPDATE`, n.name)
			if err != nil {
				return mapErr("ending leases of lost node", err)
			}
			type open struct {
				ref     LeaseRef
				offered time.Time
			}
			ls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (open, error) {
				var o open
				return o, r.Scan(&o.ref.JobID, &o.ref.Segment, &o.offered)
			})
			if err != nil {
				return mapErr("ending leases of lost node", err)
			}
			for _, l := range ls {
				end := allot.LostLeaseEnd(n.hb, l.offered, now)
				if _, err := tx.db.Exec(ctx, `UPDATE leases SET state = 'exited', exited_at = $4, exit_code = $5, exit_reason = $6
					WHERE job_id = $1 AND segment = $2 AND node = $3`, l.ref.JobID, l.ref.Segment, n.name, end.At, end.ExitCode, string(end.Reason)); err != nil {
					return mapErr("ending leases of lost node", err)
				}
				if err := tx.releaseAllocations(ctx, l.ref.JobID, l.ref.Segment, n.name, end.At); err != nil {
					return err
				}
				// running → lost → pending|failed, in one transaction.
				if _, err := tx.finishSegment(ctx, l.ref); err != nil {
					return err
				}
			}
			if _, err := tx.db.Exec(ctx, `UPDATE allocations a SET released_at = greatest($2, a.started_at)
				FROM leases l WHERE a.node = $1 AND a.released_at IS NULL AND l.job_id = a.job_id AND l.segment = a.segment AND l.node = a.node AND l.state = 'exited'`,
				n.name, n.hb); err != nil {
				return mapErr("releasing orphans of lost node", err)
			}
		}
		return nil
	})
	return lost, err
}
