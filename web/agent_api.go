package web

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/health"
	"github.com/allotlabs/allot/internal/store"
	"github.com/labstack/echo/v4"
)

// The agent API: node agents register, send heartbeats, long-poll for
// orders and report what their jobs do. Authenticated by node token.

const ctxNode = "node"

func isAgentAPI(c echo.Context) bool { return strings.HasPrefix(c.Request().URL.Path, "/api/agent/") }

// agentNode authenticates the node token of the request.
func (s *Server) agentNode(c echo.Context) (string, error) {
	if n, ok := c.Get(ctxNode).(string); ok {
		return n, nil
	}
	tok, ok := strings.CutPrefix(c.Request().Header.Get("Authorization"), "Bearer ")
	if !ok || !strings.HasPrefix(strings.TrimSpace(tok), store.NodeTokenPrefix) {
		return "", allot.Errorf(allot.EUnauthorized, "agents authenticate with a node token: Authorization: Bearer %s…", store.NodeTokenPrefix)
	}
	st := s.agentSt
	if strings.HasSuffix(c.Request().URL.Path, "/heartbeat") {
		st = s.hbSt
	}
	tokenID, node, err := st.NodeTokenByToken(c.Request().Context(), strings.TrimSpace(tok))
	if err != nil {
		if allot.ErrorCode(err) == allot.EUnauthorized {
			s.contacts.forgetToken(c.Request())
		}
		return "", err
	}
	s.contacts.learn(c.Request(), node, tokenID, s.st.Now())
	c.Set(ctxNode, node)
	return node, nil
}

// decodeStrict reads a body that must be one JSON object into v: unknown
// and wrongly typed fields are field errors, each under its own name (see
// readObject).
func decodeStrict(body io.Reader, v any) error {
	f, err := readObject(body, v)
	if err != nil {
		return err
	}
	return f.Err()
}

func (s *Server) trigger(c echo.Context) { s.jobEvent(c.Request().Context()) }

func (s *Server) agentRegister(c echo.Context) error {
	node, err := s.agentNode(c)
	if err != nil {
		return err
	}
	var inv agentproto.Inventory
	if err := decodeStrict(c.Request().Body, &inv); err != nil {
		return err
	}
	if inv.Protocol != 0 && inv.Protocol != agentproto.Version {
		return (allot.FieldErrors{"protocol": "this server speaks agent protocol " + strconv.Itoa(agentproto.Version)}).Err()
	}
	si := store.NodeInventory{Hostname: inv.Hostname, AgentVersion: inv.AgentVersion, Backend: inv.GPUBackend, Driver: inv.DriverVersion, Domain: inv.Domain}
	for _, g := range inv.GPUs {
		si.GPUs = append(si.GPUs, store.NodeGPU{Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryMiB: g.MemoryMiB, NVLinkPeers: g.NVLinkPeers})
	}
	for _, r := range inv.Running {
		si.Running = append(si.Running, store.LeaseRef{JobID: r.JobID, Segment: r.Segment})
	}
	orphans, err := s.agentSt.RegisterNode(c.Request().Context(), node, si)
	if err != nil {
		return err
	}
	s.trigger(c)
	reg := agentproto.Registration{Node: node, HeartbeatInterval: s.cfg.HeartbeatInterval}
	for _, o := range orphans {
		reg.Unknown = append(reg.Unknown, o.JobID)
		reg.UnknownLeases = append(reg.UnknownLeases, agentproto.LeaseRef{JobID: o.JobID, Segment: o.Segment})
	}
	s.logOrphans(c, node, orphans)
	return writeJSON(c, http.StatusOK, reg)
}

// logOrphans warns about jobs an agent reported running that its node does
// not hold: it is told to kill them.
func (s *Server) logOrphans(c echo.Context, node string, orphans []store.Orphan) {
	for _, o := range orphans {
		what := "the node holds no such lease"
		if o.Ended {
			what = "its lease has ended on the server"
		}
		s.log.Warn("agent runs a job its node does not hold: told to kill it", "node", node, "job", o.JobID, "segment", o.Segment,
			"endpoint", c.Request().URL.Path, "why", what, "gpus_held", o.Held, "gpus_shared", o.Shared)
	}
}

func (s *Server) agentHeartbeat(c echo.Context) error {
	node, err := s.agentNode(c)
	if err != nil {
		return err
	}
	var hb agentproto.Heartbeat
	if err := decodeStrict(c.Request().Body, &hb); err != nil {
		return err
	}
	samples := make([]store.GPUSample, 0, len(hb.GPUs))
	readings := make([]health.GPU, 0, len(hb.GPUs))
	f := allot.FieldErrors{}
	if hb.MetricsError != "" {
		hb.GPUs = nil // reading the GPUs failed: there is nothing to read here
	}
	for _, g := range hb.GPUs {
		if g.Index < 0 || g.Index >= allot.MaxGPUsPerNode || g.UtilPct < 0 || g.UtilPct > 100 || g.MemUsedMiB < 0 || g.MemTotalMiB < 0 ||
			g.ECCDoubleVol < 0 || g.ECCSingleVol < 0 || len(g.XIDs) > 64 {
			f.Add("gpus", "GPU %d: index must be 0..63, util 0..100, memory and ECC counts not negative, at most 64 XIDs", g.Index)
			continue
		}
		readings = append(readings, health.GPU{Index: g.Index, ECCDBE: g.ECCDoubleVol, XIDs: g.XIDs, Throttle: g.ThrottleReasons})
		samples = append(samples, store.GPUSample{Index: g.Index, UtilPct: g.UtilPct, TempC: g.TempC, PowerW: g.PowerW, MemUsedMiB: g.MemUsedMiB,
			MemTotalMiB: g.MemTotalMiB, ECCSingle: g.ECCSingleVol, ECCDouble: g.ECCDoubleVol, XIDs: g.XIDErrors, ThrottleReasons: g.ThrottleReasons})
	}
	if err := f.Err(); err != nil {
		return err
	}
	stats := make([]store.JobStat, 0, len(hb.Jobs))
	for _, j := range hb.Jobs {
		stats = append(stats, store.JobStat{JobID: j.JobID, Segment: j.Segment, CPUSeconds: j.CPUSeconds, RSSBytes: j.RSSBytes, LastCheckpoint: j.LastCheckpoint})
	}
	var state string
	var orphans []store.Orphan
	if strings.TrimSpace(hb.MetricsError) == "" {
		// The node row, its samples and the reads of its leases and health
		// in one round trip that commits without waiting for the disk (see
		// RecordHeartbeatRound).
		round, err := s.hbSt.RecordHeartbeatRound(c.Request().Context(), node, samples, stats, readings, hb.Health)
		if err != nil {
			return err
		}
		if round.Beat.MetricsBack {
			s.log.Info("node reads its GPU metrics again", "node", node)
		}
		orphans = round.Orphans
		s.logOrphans(c, node, orphans)
		state = s.heartbeatHealth(c, node, round.Health)
	} else {
		// Telemetry commits without waiting for the disk (see RecordHeartbeatAsync).
		beat, err := s.hbSt.RecordHeartbeatAsync(c.Request().Context(), node, samples, hb.MetricsError)
		if err != nil {
			return err
		}
		switch {
		case beat.MetricsFailed:
			s.log.Warn("node cannot read its GPU metrics; not counting its GPUs missing", "node", node, "err", beat.MetricsError)
		case beat.MetricsBack:
			s.log.Info("node reads its GPU metrics again", "node", node)
		}
		state = beat.State
		if orphans, err = s.hbSt.HeartbeatJobsAsync(c.Request().Context(), node, stats); err != nil {
			return err
		}
		s.logOrphans(c, node, orphans)
		if state != allot.NodeDown {
			out, err := s.hbSt.EvaluateHeartbeatHealth(c.Request().Context(), node, readings, hb.Health, beat.MetricsError)
			if err != nil {
				return err
			}
			state = s.heartbeatHealth(c, node, out)
		}
	}
	reply := agentproto.HeartbeatReply{NodeState: state}
	for _, o := range orphans {
		reply.Kill = append(reply.Kill, agentproto.LeaseRef{JobID: o.JobID, Segment: o.Segment})
	}
	return writeJSON(c, http.StatusOK, reply)
}

// heartbeatHealth logs and acts on a heartbeat's health evaluation and
// returns the node's state after it.
func (s *Server) heartbeatHealth(c echo.Context, node string, out store.HealthOutcome) string {
	if len(out.Fired) > 0 {
		s.log.Warn("node health rules fired", "node", node, "events", out.Fired, "state", out.State, "requeued", out.Requeued)
	}
	if out.Changed {
		s.trigger(c)
	}
	return out.State
}

// agentOrders long-polls: it answers at once when there are orders, else
// when a notification for the node arrives or ?wait= (default 25 s, at most
// 60 s) passes.
func (s *Server) agentOrders(c echo.Context) error {
	node, err := s.agentNode(c)
	if err != nil {
		return err
	}
	wait := 25 * time.Second
	if v := c.QueryParam("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > 60*time.Second {
			return (allot.FieldErrors{"wait": "must be a duration between 0s and 60s"}).Err()
		}
		wait = d
	}
	// The poll outlives the server's WriteTimeout (which runs from the
	// request's start): its answer must still get out.
	if err := http.NewResponseController(c.Response()).SetWriteDeadline(time.Now().Add(wait + 30*time.Second)); err != nil &&
		!errors.Is(err, http.ErrNotSupported) {
		return err
	}
	ctx := c.Request().Context()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		woken, done := s.notifier.Subscribe(node)
		o, err := s.agentSt.TakeOrders(ctx, node)
		if err != nil {
			done()
			return err
		}
		for _, u := range o.Unreadable {
			s.log.Error("offer held back: its job's secrets do not decrypt on this server (give every server and worker the same --secret-key-file)",
				"node", node, "job", u.JobID, "segment", u.Segment, "err", u.Err)
		}
		if !o.Empty() || s.notifier.Closed() {
			done()
			return writeJSON(c, http.StatusOK, protoOrders(o))
		}
		select {
		case <-woken:
			done()
			// A token revoked while the poll waited (the revocation wakes
			// it) is refused now, not at the next request.
			tok, _ := strings.CutPrefix(c.Request().Header.Get("Authorization"), "Bearer ")
			if _, err := s.agentSt.NodeByToken(ctx, strings.TrimSpace(tok)); err != nil {
				return err
			}
		case <-timer.C:
			done()
			return writeJSON(c, http.StatusOK, agentproto.Orders{})
		case <-ctx.Done():
			done()
			return nil
		}
	}
}

func protoOrders(o store.Orders) agentproto.Orders {
	var out agentproto.Orders
	for _, l := range o.Offer {
		out.Offer = append(out.Offer, agentproto.Lease{JobID: l.JobID, Segment: l.Segment, Team: l.Team, Command: l.Command, Env: l.Env,
			WorkDir: l.WorkDir, GPUs: l.GPUs, TimeLimit: l.TimeLimit, CheckpointDir: l.CheckpointDir,
			User: l.User, Submitter: l.Submitter, Image: l.Image, MemoryBytes: l.MemoryBytes, MilliCPUs: l.MilliCPUs})
	}
	for _, r := range o.Start {
		out.Start = append(out.Start, agentproto.LeaseRef{JobID: r.JobID, Segment: r.Segment})
	}
	for _, st := range o.Stop {
		out.Stop = append(out.Stop, agentproto.Stop{JobID: st.JobID, Segment: st.Segment, Grace: st.Grace, Reason: st.Reason})
	}
	return out
}

func leaseRef(jobID int64, segment int) (store.LeaseRef, error) {
	f := allot.FieldErrors{}
	if jobID < 1 {
		f.Add("job_id", "must be a job id")
	}
	if segment < 1 {
		f.Add("segment", "must be at least 1")
	}
	return store.LeaseRef{JobID: jobID, Segment: segment}, f.Err()
}

// leaseReport authenticates the node, decodes a report about one of its
// leases into body, and returns the node and the lease. Every agent report
// (take, started, exited, log) goes through it.
func leaseReport[T any](s *Server, c echo.Context, ref func(*T) (int64, int)) (string, *T, store.LeaseRef, error) {
	node, err := s.agentNode(c)
	if err != nil {
		return "", nil, store.LeaseRef{}, err
	}
	body := new(T)
	if err := decodeStrict(c.Request().Body, body); err != nil {
		return "", nil, store.LeaseRef{}, err
	}
	r, err := leaseRef(ref(body))
	return node, body, r, err
}

// refused logs an agent report the server refused because the node does
// not hold the lease (another node's, an unknown job) or because of the
// lease's state (a lease never taken, one that has ended): a job may have
// stolen the node's token, so every such report is worth a look.
func (s *Server) refused(c echo.Context, node string, ref store.LeaseRef, err error) error {
	if code := allot.ErrorCode(err); code == allot.ENotFound || code == allot.EConflict {
		s.log.Warn("agent report refused", "node", node, "job", ref.JobID, "segment", ref.Segment, "endpoint", c.Request().URL.Path,
			"code", code, "err", allot.ErrorMessage(err))
	}
	return err
}

func (s *Server) agentTakeLease(c echo.Context) error {
	node, _, ref, err := leaseReport(s, c, func(r *agentproto.LeaseRef) (int64, int) { return r.JobID, r.Segment })
	if err != nil {
		return err
	}
	if err := s.agentSt.TakeLease(c.Request().Context(), node, ref); err != nil {
		return s.refused(c, node, ref, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// agentTakeBatch takes several leases in one request and transaction
// (store.TakeLeases): each lease's result, and the start orders now due.
func (s *Server) agentTakeBatch(c echo.Context) error {
	node, _, refs, err := batchReport(s, c, "leases", func(b *agentproto.TakeBatch) []agentproto.LeaseRef { return b.Leases })
	if err != nil {
		return err
	}
	results, starts, err := s.agentSt.TakeLeases(c.Request().Context(), node, refs)
	if err != nil {
		return err
	}
	reply := agentproto.TakeBatchReply{Results: s.batchResults(c, node, refs, results)}
	for _, r := range starts {
		reply.Start = append(reply.Start, agentproto.LeaseRef{JobID: r.JobID, Segment: r.Segment})
	}
	return writeJSON(c, http.StatusOK, reply)
}

// agentStartedBatch records several starts in one request and
// transaction (store.LeasesStarted), each as agentStarted does.
func (s *Server) agentStartedBatch(c echo.Context) error {
	node, b, refs, err := batchReport(s, c, "started", func(b *agentproto.StartedBatch) []agentproto.LeaseRef {
		refs := make([]agentproto.LeaseRef, len(b.Started))
		for i, st := range b.Started {
			refs[i] = agentproto.LeaseRef{JobID: st.JobID, Segment: st.Segment}
		}
		return refs
	})
	if err != nil {
		return err
	}
	starts := make([]store.StartReport, len(refs))
	for i, r := range refs {
		starts[i] = store.StartReport{LeaseRef: r, PID: b.Started[i].PID}
	}
	results, err := s.agentSt.LeasesStarted(c.Request().Context(), node, starts)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, agentproto.BatchReply{Results: s.batchResults(c, node, refs, results)})
}

// batchReport authenticates the node, decodes a batched report into body
// and checks its leases (batchRefs): the batched take and start reports go
// through it, as the single ones go through leaseReport.
func batchReport[T any](s *Server, c echo.Context, field string, list func(*T) []agentproto.LeaseRef) (string, *T, []store.LeaseRef, error) {
	node, err := s.agentNode(c)
	if err != nil {
		return "", nil, nil, err
	}
	body := new(T)
	if err := decodeStrict(c.Request().Body, body); err != nil {
		return "", nil, nil, err
	}
	refs, err := batchRefs(list(body), field)
	return node, body, refs, err
}

// batchRefs checks a batched report's leases: 1 to agentproto.MaxBatch
// (the agent splits its batches by the same bound), each a lease
// reference, none twice. Any fault refuses the whole request (a field
// error naming the list) and changes nothing.
func batchRefs(list []agentproto.LeaseRef, field string) ([]store.LeaseRef, error) {
	n := len(list)
	if n == 0 || n > agentproto.MaxBatch {
		return nil, allot.FieldErrors{field: fmt.Sprintf("must list 1 to %d leases, not %d", agentproto.MaxBatch, n)}.Err()
	}
	refs := make([]store.LeaseRef, n)
	seen := make(map[store.LeaseRef]bool, n)
	for i, l := range list {
		r, err := leaseRef(l.JobID, l.Segment)
		if err != nil {
			return nil, allot.FieldErrors{field: fmt.Sprintf("entry %d: %s", i, allot.ErrorMessage(err))}.Err()
		}
		if seen[r] {
			return nil, allot.FieldErrors{field: fmt.Sprintf("job %d segment %d is listed twice", r.JobID, r.Segment)}.Err()
		}
		seen[r] = true
		refs[i] = r
	}
	return refs, nil
}

// batchResults turns a batch's per-lease outcomes into the reply's, and
// logs each refusal as a single report's would be (s.refused).
func (s *Server) batchResults(c echo.Context, node string, refs []store.LeaseRef, errs []error) []agentproto.LeaseResult {
	out := make([]agentproto.LeaseResult, len(refs))
	for i, r := range refs {
		out[i] = agentproto.LeaseResult{JobID: r.JobID, Segment: r.Segment}
		if err := errs[i]; err != nil {
			_ = s.refused(c, node, r, err)
			out[i].Status, out[i].Detail = statusOf[allot.ErrorCode(err)], allot.ErrorMessage(err)
		}
	}
	return out
}

// agentStarted records a start; its time is when the report arrives (the
// report's own time is not trusted).
func (s *Server) agentStarted(c echo.Context) error {
	node, ev, ref, err := leaseReport(s, c, func(e *agentproto.JobStarted) (int64, int) { return e.JobID, e.Segment })
	if err != nil {
		return err
	}
	if err := s.agentSt.LeaseStarted(c.Request().Context(), node, ref, ev.PID); err != nil {
		return s.refused(c, node, ref, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// agentExited records an exit; its time is bounded by what the server saw
// (store.LeaseExited).
func (s *Server) agentExited(c echo.Context) error {
	node, ev, ref, err := leaseReport(s, c, func(e *agentproto.JobExited) (int64, int) { return e.JobID, e.Segment })
	if err != nil {
		return err
	}
	if _, err := s.agentSt.LeaseExited(c.Request().Context(), node, ref, store.LeaseExit{ExitCode: ev.ExitCode, Signal: ev.Signal,
		Reason: ev.Reason, Message: ev.Message, At: ev.Time, LastCheckpoint: ev.LastCheckpoint}); err != nil {
		return s.refused(c, node, ref, err)
	}
	// GPUs came free either way: worth a cycle.
	s.trigger(c)
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) agentLog(c echo.Context) error {
	node, l, ref, err := leaseReport(s, c, func(l *agentproto.JobLog) (int64, int) { return l.JobID, l.Segment })
	if err != nil {
		return err
	}
	if err := s.agentSt.AppendLog(c.Request().Context(), node, ref, l.Lines, l.Ends); err != nil {
		return s.refused(c, node, ref, err)
	}
	return c.NoContent(http.StatusNoContent)
}
