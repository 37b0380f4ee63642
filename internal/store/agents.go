package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/health"
	"github.com/jackc/pgx/v5"
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
type LeaseRef struct {
	JobID   int64
	Segment int
}

// scanLeaseRef maps a (job_id, segment) row.
func scanLeaseRef(r pgx.CollectableRow) (LeaseRef, error) {
	var l LeaseRef
	return l, r.Scan(&l.JobID, &l.Segment)
}

func notify(ctx context.Context, db DBTX, nodes ...string) error {
	for _, n := range nodes {
		if _, err := db.Exec(ctx, `SELECT pg_notify($1, $2)`, OrdersChannel, n); err != nil {
			return mapErr("notifying node", err)
		}
	}
	return nil
}

// RegisterNode records an agent's inventory, brings a down node up, makes
// every open order be sent again, and returns the jobs the agent reported
// running that the server no longer runs there (the agent stops them).
// A GPU the node had (by UUID; by index when it had none) that the agent
// no longer reports is kept in the node's lost GPUs: the gpu_missing health
// rule counts it until it is back or an admin undrains the node. A new
// node's first registration just sets its inventory.
func (s *Store) RegisterNode(ctx context.Context, node string, inv NodeInventory) ([]int64, error) {
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
	var unknown []int64
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
		// A started lease the agent no longer runs either ended while the
		// server was away (its exit report follows) or was lost with the
		// agent's process.
		reported := map[LeaseRef]bool{}
		for _, r := range inv.Running {
			reported[r] = true
		}
		// A taken lease it does not report was never started: offer it again,
		// unless it was meanwhile asked to stop (then it just ends).
		rows, err := tx.db.Query(ctx, `SELECT job_id, segment, stop_requested_at IS NOT NULL FROM leases WHERE node = $1 AND state = 'taken' ORDER BY job_id`, node)
		if err != nil {
			return mapErr("registering node", err)
		}
		type takenLease struct {
			ref     LeaseRef
			stopped bool
		}
		taken, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (takenLease, error) {
			var l takenLease
			return l, r.Scan(&l.ref.JobID, &l.ref.Segment, &l.stopped)
		})
		if err != nil {
			return mapErr("registering node", err)
		}
		for _, l := range taken {
			if reported[l.ref] {
				continue
			}
			if l.stopped {
				if err := tx.endLostLease(ctx, node, l.ref, now); err != nil {
					return err
				}
				continue
			}
			if _, err := tx.db.Exec(ctx, `UPDATE leases SET state = 'offered', taken_at = NULL WHERE job_id = $1 AND segment = $2 AND node = $3`,
				l.ref.JobID, l.ref.Segment, node); err != nil {
				return mapErr("registering node", err)
			}
		}
		rows, err = tx.db.Query(ctx, `SELECT job_id, segment FROM leases WHERE node = $1 AND state = 'running' ORDER BY job_id`, node)
		if err != nil {
			return mapErr("registering node", err)
		}
		open, err := pgx.CollectRows(rows, scanLeaseRef)
		if err != nil {
			return mapErr("registering node", err)
		}
		for _, r := range open {
			if reported[r] {
				continue
			}
			// Its exit report may still be queued in the agent (the job ended
			// while the server was away): give it time to arrive. If it does
			// not, EndUnconfirmedStops ends the lease.
			if _, err := tx.db.Exec(ctx, `UPDATE leases SET stop_requested_at = $4, stop_reason = 'agent_restarted', stop_grace_s = 0
				WHERE job_id = $1 AND segment = $2 AND node = $3 AND stop_requested_at IS NULL`, r.JobID, r.Segment, node, now); err != nil {
				return mapErr("registering node", err)
			}
		}
		for _, r := range inv.Running {
			var state string
			err := tx.db.QueryRow(ctx, `SELECT state FROM leases WHERE job_id = $1 AND segment = $2 AND node = $3`, r.JobID, r.Segment, node).Scan(&state)
			switch {
			case err == pgx.ErrNoRows || state == "exited" || state == "offered":
				unknown = append(unknown, r.JobID)
			case err != nil:
				return mapErr("registering node", err)
			case state == "taken":
				if _, err := tx.db.Exec(ctx, `UPDATE leases SET state = 'running', started_at = $4 WHERE job_id = $1 AND segment = $2 AND node = $3`,
					r.JobID, r.Segment, node, now); err != nil {
					return mapErr("registering node", err)
				}
			}
		}
		return notify(ctx, tx.db, node)
	})
	return unknown, err
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
	now := s.Now()
	var state string
	err := s.db.QueryRow(ctx, `UPDATE nodes SET last_heartbeat = $2 WHERE name = $1 AND state <> 'down' AND registered_at IS NOT NULL RETURNING state`, node, now).Scan(&state)
	if err == pgx.ErrNoRows {
		return "", allot.Errorf(allot.ENotFound, "node %s is not registered (or was marked down): register again", node)
	}
	if err != nil {
		return "", mapErr("recording heartbeat", err)
	}
	if len(samples) == 0 {
		return state, nil
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
	return state, mapErr("recording GPU samples", err)
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
		rows, err = tx.db.Query(ctx, `
			UPDATE leases l SET start_sent_at = $2
			WHERE l.node = $1 AND l.state = 'taken' AND l.start_sent_at IS NULL AND l.stop_requested_at IS NULL
				AND NOT EXISTS (SELECT 1 FROM leases o WHERE o.job_id = l.job_id AND o.segment = l.segment AND o.state = 'offered')
			RETURNING l.job_id, l.segment`, node, now)
		if err != nil {
			return mapErr("loading starts", err)
		}
		o.Start, err = pgx.CollectRows(rows, scanLeaseRef)
		if err != nil {
			return mapErr("loading starts", err)
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
// lease of the gang is taken, all its nodes are told to start.
func (s *Store) TakeLease(ctx context.Context, node string, r LeaseRef) error {
	return s.InTx(ctx, func(tx *Store) error {
		if _, err := tx.db.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, r.JobID); err != nil {
			return mapErr("locking job", err)
		}
		state, err := tx.lockLease(ctx, node, r)
		if err != nil {
			return err
		}
		switch state {
		case "taken", "running":
			return nil // already taken: idempotent
		case "exited":
			return allot.Errorf(allot.EConflict, "the lease for job %d segment %d has ended", r.JobID, r.Segment)
		}
		if _, err := tx.db.Exec(ctx, `UPDATE leases SET state = 'taken', taken_at = $4 WHERE job_id = $1 AND segment = $2 AND node = $3`,
			r.JobID, r.Segment, node, tx.Now()); err != nil {
			return mapErr("taking lease", err)
		}
		var nodes []string
		err = tx.db.QueryRow(ctx, `
			SELECT CASE WHEN bool_and(state <> 'offered') THEN array_agg(node ORDER BY rank) ELSE '{}' END
			FROM leases WHERE job_id = $1 AND segment = $2`, r.JobID, r.Segment).Scan(&nodes)
		if err != nil {
			return mapErr("taking lease", err)
		}
		return notify(ctx, tx.db, nodes...)
	})
}

// LeaseStarted records that the job's process runs on node.
func (s *Store) LeaseStarted(ctx context.Context, node string, r LeaseRef, pid int) error {
	return s.InTx(ctx, func(tx *Store) error {
		state, err := tx.lockLease(ctx, node, r)
		if err != nil {
			return err
		}
		switch state {
		case "running":
			return nil
		case "offered":
			return allot.Errorf(allot.EConflict, "job %d segment %d: start before the lease was taken", r.JobID, r.Segment)
		case "exited":
			return allot.Errorf(allot.EConflict, "the lease for job %d segment %d has ended", r.JobID, r.Segment)
		}
		_, err = tx.db.Exec(ctx, `UPDATE leases SET state = 'running', started_at = $4, pid = $5 WHERE job_id = $1 AND segment = $2 AND node = $3`,
			r.JobID, r.Segment, node, tx.Now(), pid)
		return mapErr("recording start", err)
	})
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
// or back to pending after a preemption. It is idempotent. It reports
// whether the job's state changed (so a scheduling cycle is worth running).
func (s *Store) LeaseExited(ctx context.Context, node string, r LeaseRef, ex LeaseExit) (bool, error) {
	changed := false
	err := s.InTx(ctx, func(tx *Store) error {
		// Lock the job first: the exits of a gang's members, cancels and
		// cycles then take locks in one order and never deadlock.
		if _, err := tx.db.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, r.JobID); err != nil {
			return mapErr("locking job", err)
		}
		state, err := tx.lockLease(ctx, node, r)
		if err != nil || state == "exited" {
			return err
		}
		now := tx.Now()
		at := ex.At
		var offered time.Time
		if err := tx.db.QueryRow(ctx, `SELECT offered_at FROM leases WHERE job_id = $1 AND segment = $2 AND node = $3`, r.JobID, r.Segment, node).Scan(&offered); err != nil {
			return mapErr("loading lease", err)
		}
		if at.IsZero() || at.After(now) {
			at = now
		}
		if at.Before(offered) {
			at = offered
		}
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
		if ex.Reason == "start_failed" && ex.Message != "" {
			if err := tx.appendLog(ctx, r.JobID, []string{"allot: " + ex.Message}); err != nil {
				return err
			}
		}
		changed, err = tx.finishSegment(ctx, r, ex)
		return err
	})
	return changed, err
}

// EndUnconfirmedStops ends leases asked to stop before cutoff (plus their
// grace) that no agent confirmed: the agent restarted and lost the process,
// or never answers. They end now as if reported, so GPUs are released,
// billing stops and the job is requeued or failed. It returns how many.
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
			if err := tx.endLostLease(ctx, l.node, l.ref, tx.Now()); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

// endLostLease settles a started lease whose process is gone without an exit
// report (its agent restarted): the lease ends now with exit code -1 and
// reason agent_restarted, as if the agent had reported it.
func (s *Store) endLostLease(ctx context.Context, node string, r LeaseRef, at time.Time) error {
	if _, err := s.db.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, r.JobID); err != nil {
		return mapErr("locking job", err)
	}
	var reason string
	if err := s.db.QueryRow(ctx, `SELECT coalesce(nullif(stop_reason, ''), 'agent_restarted') FROM leases WHERE job_id = $1 AND segment = $2 AND node = $3`,
		r.JobID, r.Segment, node).Scan(&reason); err != nil {
		return mapErr("ending lost lease", err)
	}
	ex := LeaseExit{ExitCode: -1, Reason: reason, At: at}
	if _, err := s.db.Exec(ctx, `UPDATE leases SET state = 'exited', exited_at = $4, exit_code = -1, exit_reason = $5
		WHERE job_id = $1 AND segment = $2 AND node = $3`, r.JobID, r.Segment, node, at, ex.Reason); err != nil {
		return mapErr("ending lost lease", err)
	}
	if err := s.releaseAllocations(ctx, r.JobID, r.Segment, node, at); err != nil {
		return err
	}
	_, err := s.finishSegment(ctx, r, ex)
	return err
}

func (s *Store) releaseAllocations(ctx context.Context, jobID int64, segment int, node string, at time.Time) error {
	_, err := s.db.Exec(ctx, `UPDATE allocations SET released_at = greatest($3, started_at)
		WHERE job_id = $1 AND node = $2 AND segment = $4 AND released_at IS NULL`, jobID, node, at, segment)
	return mapErr("releasing allocations", err)
}

// finishSegment settles a job after one of its leases exited.
func (s *Store) finishSegment(ctx context.Context, r LeaseRef, ex LeaseExit) (bool, error) {
	var open []string
	var preempted, drained bool
	var firstBad int
	var badReason string
	err := s.db.QueryRow(ctx, `
		SELECT coalesce(array_agg(node) FILTER (WHERE state <> 'exited'), '{}'),
			coalesce(bool_or(stop_reason = 'preempted'), false), coalesce(bool_or(stop_reason = 'drain'), false),
			coalesce((array_agg(exit_code ORDER BY exited_at) FILTER (WHERE state = 'exited' AND exit_code <> 0))[1], 0),
			coalesce((array_agg(coalesce(nullif(exit_reason, ''), nullif(stop_reason, ''), '')) FILTER (WHERE state = 'exited' AND (exit_code <> 0 OR exit_reason <> '')))[1], '')
		FROM leases WHERE job_id = $1 AND segment = $2`, r.JobID, r.Segment).Scan(&open, &preempted, &drained, &firstBad, &badReason)
	if err != nil {
		return false, mapErr("settling job", err)
	}
	var state string
	var seg int
	if err := s.db.QueryRow(ctx, `SELECT state, segment FROM jobs WHERE id = $1 FOR UPDATE`, r.JobID).Scan(&state, &seg); err != nil {
		return false, mapErr("settling job", err)
	}
	if state != string(allot.JobRunning) || seg != r.Segment {
		return false, nil // cancelled, lost or already requeued: only the GPUs mattered
	}
	now := s.Now()
	if len(open) > 0 {
		// A gang member ended on its own: stop the others.
		if !preempted && !drained && (ex.ExitCode != 0 || ex.Reason != "") {
			if err := s.requestStop(ctx, r.JobID, r.Segment, "gang_member_failed", 30*time.Second); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	switch {
	case drained && !preempted:
		_, err = s.db.Exec(ctx, `UPDATE jobs SET state = 'pending', updated_at = $2,
			pending_reason = 'requeued: its node was drained; waiting for the next scheduling cycle' WHERE id = $1`, r.JobID, now)
	case preempted:
		_, err = s.db.Exec(ctx, `UPDATE jobs SET state = 'pending', preemptions = preemptions + 1, updated_at = $2,
			pending_reason = 'requeued after preemption; waiting for the next scheduling cycle' WHERE id = $1`, r.JobID, now)
	case firstBad == 0 && badReason == "":
		_, err = s.db.Exec(ctx, `UPDATE jobs SET state = 'completed', exit_code = 0, ended_at = $2, updated_at = $2 WHERE id = $1`, r.JobID, now)
	default:
		if badReason == "" {
			badReason = fmt.Sprintf("exit code %d", firstBad)
		}
		_, err = s.db.Exec(ctx, `UPDATE jobs SET state = 'failed', exit_code = $2, end_reason = $3, ended_at = $4, updated_at = $4 WHERE id = $1`,
			r.JobID, firstBad, badReason, now)
	}
	return true, mapErr("settling job", err)
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
func (s *Store) AppendLog(ctx context.Context, node string, r LeaseRef, lines []string) error {
	if _, err := s.leaseState(ctx, node, r, false); err != nil {
		return err
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

// ExpireOffers undoes starts whose gang did not take all its leases by
// cutoff (an agent refused or never answered): the leases end, the GPUs are
// released, and the job goes back to the queue. It returns the jobs it
// requeued.
func (s *Store) ExpireOffers(ctx context.Context, cutoff time.Time) ([]int64, error) {
	var requeued []int64
	err := s.InTx(ctx, func(tx *Store) error {
		rows, err := tx.db.Query(ctx, `
			SELECT DISTINCT l.job_id, l.segment FROM leases l JOIN jobs j ON j.id = l.job_id AND j.segment = l.segment AND j.state = 'running'
			WHERE l.state = 'offered' AND l.offered_at < $1 ORDER BY 1`, cutoff)
		if err != nil {
			return mapErr("finding expired offers", err)
		}
		refs, err := pgx.CollectRows(rows, scanLeaseRef)
		if err != nil {
			return mapErr("finding expired offers", err)
		}
		for _, r := range refs {
			tag, err := tx.db.Exec(ctx, `UPDATE jobs SET state = 'pending', updated_at = $2,
				pending_reason = 'a node did not take its part of the job in time; it goes back to the queue' WHERE id = $1 AND state = 'running'`, r.JobID, tx.Now())
			if err != nil {
				return mapErr("requeueing job", err)
			}
			if tag.RowsAffected() == 0 {
				continue
			}
			if err := tx.requestStop(ctx, r.JobID, r.Segment, "offer_expired", 0); err != nil {
				return err
			}
			requeued = append(requeued, r.JobID)
		}
		return nil
	})
	return requeued, err
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

// RecordJobStats stores the agents' per-job process statistics.
func (s *Store) RecordJobStats(ctx context.Context, node string, stats []JobStat) error {
	for _, st := range stats {
		if _, err := s.db.Exec(ctx, `UPDATE leases SET cpu_seconds = $4, rss_bytes = $5,
				last_checkpoint = CASE WHEN $6::timestamptz <= $7 THEN greatest(last_checkpoint, $6) ELSE last_checkpoint END
			WHERE job_id = $1 AND segment = $2 AND node = $3 AND state <> 'exited'`,
			st.JobID, st.Segment, node, st.CPUSeconds, st.RSSBytes, st.LastCheckpoint, s.Now()); err != nil {
			return mapErr("recording job stats", err)
		}
	}
	return nil
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

// MarkLostNodes marks down every node that has sent no heartbeat since
// before cutoff. Its unfinished leases end at the last heartbeat (usage is
// billed up to then); checkpointable jobs go back to the queue, others fail
// with reason node_lost. It returns the nodes it marked down.
func (s *Store) MarkLostNodes(ctx context.Context, cutoff time.Time) ([]string, error) {
	var lost []string
	err := s.InTx(ctx, func(tx *Store) error {
		rows, err := tx.db.Query(ctx, `
			UPDATE nodes SET state = 'down', state_reason = 'no heartbeat since ' || to_char(last_heartbeat AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS UTC')
			WHERE state IN ('up', 'draining', 'drained') AND registered_at IS NOT NULL AND last_heartbeat < $1
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
			rows, err := tx.db.Query(ctx, `
				UPDATE leases SET state = 'exited', exited_at = greatest($2, offered_at), exit_code = -1, exit_reason = 'node_lost'
				WHERE node = $1 AND state <> 'exited' RETURNING job_id, segment`, n.name, n.hb)
			if err != nil {
				return mapErr("ending leases of lost node", err)
			}
			refs, err := pgx.CollectRows(rows, scanLeaseRef)
			if err != nil {
				return mapErr("ending leases of lost node", err)
			}
			for _, r := range refs {
				if err := tx.releaseAllocations(ctx, r.JobID, r.Segment, n.name, n.hb); err != nil {
					return err
				}
				var checkpointable bool
				var state string
				if err := tx.db.QueryRow(ctx, `SELECT state, checkpointable FROM jobs WHERE id = $1 AND segment = $2 FOR UPDATE`, r.JobID, r.Segment).Scan(&state, &checkpointable); err != nil {
					if err == pgx.ErrNoRows {
						continue
					}
					return mapErr("settling job of lost node", err)
				}
				if state != string(allot.JobRunning) {
					continue
				}
				// running → lost → pending|failed, in one transaction.
				if checkpointable {
					_, err = tx.db.Exec(ctx, `UPDATE jobs SET state = 'pending', updated_at = $2,
						pending_reason = 'requeued: node ' || $3 || ' stopped answering' WHERE id = $1`, r.JobID, now, n.name)
				} else {
					_, err = tx.db.Exec(ctx, `UPDATE jobs SET state = 'failed', end_reason = 'node_lost', ended_at = $2, updated_at = $2 WHERE id = $1`, r.JobID, now)
				}
				if err != nil {
					return mapErr("settling job of lost node", err)
				}
				if err := tx.requestStop(ctx, r.JobID, r.Segment, "node_lost", 30*time.Second); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return lost, err
}
