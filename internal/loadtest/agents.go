package loadtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/allotlabs/allot/internal/agentproto"
)

// simAgent is one simulated node agent. It speaks the real agent protocol
// (internal/agentproto) with its node's token and plays the agent's part of
// the lease lifecycle without running processes:
//
//   - it registers with an inventory of GPUsPerAgent fake GPUs;
//   - it heartbeats every Heartbeat (the first one at a random point of the
//     first interval, so 1,000 agents spread evenly, as real ones do),
//     with plausible readings for every GPU and its running jobs' stats;
//   - it long-polls its orders; it takes every lease it is offered (all of a
//     poll's offers in one batched take, as the real agent does), reports
//     every lease it is told to start as started (one batched report; a
//     made-up pid),
//     and reports it exited with code 0 after JobRuntime (0: it runs until
//     the end of the run); a stop order ends the lease at once, exited by
//     SIGTERM with the stop's reason;
//   - leases the server tells it to kill (heartbeat replies) are forgotten.
//
// So jobs submitted during a run really go pending → offered → running →
// completed through the server, the worker's cycles and PostgreSQL.
type simAgent struct {
	name  string
	gpus  int
	c     *agentproto.Client
	r     *runner
	mu    sync.Mutex
	jobs  map[agentproto.LeaseRef]int // running leases → their pid
	pid   int
	timer []*time.Timer
}

func newSimAgent(r *runner, name, token string, hc *http.Client) *simAgent {
	url := r.cfg.URL
	if r.cfg.AgentURL != "" {
		url = r.cfg.AgentURL
	}
	c := agentproto.NewClient(url, token)
	c.HTTP = hc
	c.Timeout = r.cfg.RequestTimeout
	return &simAgent{name: name, gpus: r.cfg.GPUsPerAgent, c: c, r: r, jobs: map[agentproto.LeaseRef]int{}, pid: 1000}
}

func (a *simAgent) register(ctx context.Context) error {
	inv := agentproto.Inventory{Hostname: a.name, AgentVersion: "loadtest", Protocol: agentproto.Version, GPUBackend: "fake",
		Domain: "loadtest", Isolation: "none"}
	for g := range a.gpus {
		inv.GPUs = append(inv.GPUs, agentproto.GPU{Index: g, UUID: a.uuid(g), Model: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920})
	}
	t0 := time.Now()
	_, err := a.c.Register(ctx, inv)
	a.r.ops.get("agent register").record(ctx, time.Since(t0), err)
	return err
}

func (a *simAgent) uuid(g int) string { return fmt.Sprintf("GPU-%s-%d", a.name, g) }

// heartbeats sends a heartbeat every interval until ctx ends.
func (a *simAgent) heartbeats(ctx context.Context) {
	every := a.r.cfg.Heartbeat
	first := time.Duration(rand.Int64N(int64(every)))
	t := time.NewTimer(first)
	defer t.Stop()
	next := time.Now().Add(first)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.beat(ctx, next)
		next = next.Add(every)
		// A late beat does not shift the schedule: as a real agent's
		// ticker, the next one is due at its time (or at once).
		t.Reset(max(0, time.Until(next)))
	}
}

func (a *simAgent) beat(ctx context.Context, intended time.Time) {
	hb := agentproto.Heartbeat{Time: time.Now().UTC(), Jobs: []agentproto.JobStats{}}
	for g := range a.gpus {
		hb.GPUs = append(hb.GPUs, agentproto.GPUMetrics{Index: g, UUID: a.uuid(g), UtilPct: float64(rand.IntN(101)),
			MemUsedMiB: rand.Int64N(81920), MemTotalMiB: 81920, TempC: 30 + float64(rand.IntN(50)), PowerW: 60 + float64(rand.IntN(600))})
	}
	a.mu.Lock()
	for ref, pid := range a.jobs {
		hb.Jobs = append(hb.Jobs, agentproto.JobStats{JobID: ref.JobID, Segment: ref.Segment, PID: pid, CPUSeconds: 1, RSSBytes: 1 << 20})
	}
	a.mu.Unlock()
	rep, err := a.c.Heartbeat(a.r.calls, hb)
	// Latency counts from when the beat was due, so a tool (or server)
	// that falls behind shows it instead of hiding it.
	a.r.ops.get("agent heartbeat").record(a.r.calls, time.Since(intended), err)
	if err != nil {
		return
	}
	a.mu.Lock()
	for _, k := range rep.Kill {
		delete(a.jobs, k)
	}
	a.mu.Unlock()
}

// orders long-polls and acts on orders until ctx ends. Calls run on
// the runner's call context: one in flight when the window closes
// finishes (and counts); no new one starts.
func (a *simAgent) orders(ctx context.Context) {
	for ctx.Err() == nil {
		wait := 25 * time.Second
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, max(0, time.Until(dl)))
		}
		o, err := a.c.Orders(a.r.calls, wait)
		if err != nil {
			if ctx.Err() == nil {
				a.r.ops.get("agent orders (long poll)").record(a.r.calls, 0, err)
				sleep(ctx, time.Second) // do not spin on a failing server
			}
			continue
		}
		if o.Empty() {
			continue
		}
		a.r.ops.get("agent orders (long poll)").record(a.r.calls, 0, nil)
		starts := o.Start
		if len(o.Offer) > 0 {
			// All of a poll's offers in one batched take, whose answer
			// carries the starts now due, as the real agent does.
			refs := make([]agentproto.LeaseRef, len(o.Offer))
			for i, l := range o.Offer {
				refs[i] = agentproto.LeaseRef{JobID: l.JobID, Segment: l.Segment}
			}
			t0 := time.Now()
			rep, err := a.c.TakeLeases(a.r.calls, refs)
			a.r.ops.get("agent take leases (batch)").record(a.r.calls, time.Since(t0), batchErr(rep.Results, err))
			starts = append(starts, rep.Start...)
		}
		if len(starts) > 0 {
			started := make([]agentproto.JobStarted, len(starts))
			a.mu.Lock()
			for i, ref := range starts {
				a.pid++
				started[i] = agentproto.JobStarted{JobID: ref.JobID, Segment: ref.Segment, PID: a.pid, Time: time.Now().UTC()}
			}
			a.mu.Unlock()
			t0 := time.Now()
			results, err := a.c.StartedBatch(a.r.calls, started)
			a.r.ops.get("agent started (batch)").record(a.r.calls, time.Since(t0), batchErr(results, err))
			if err == nil {
				a.mu.Lock()
				for i, st := range started {
					if results[i].Status != 0 {
						continue
					}
					ref := starts[i]
					a.jobs[ref] = st.PID
					if rt := a.r.cfg.JobRuntime; rt > 0 {
						a.timer = append(a.timer, time.AfterFunc(rt, func() { a.exit(ctx, ref, 0, "", "") }))
					}
				}
				a.mu.Unlock()
			}
		}
		for _, s := range o.Stop {
			a.exit(ctx, agentproto.LeaseRef{JobID: s.JobID, Segment: s.Segment}, -1, "SIGTERM", s.Reason)
		}
	}
}

// exit reports a lease's process ended, once.
func (a *simAgent) exit(ctx context.Context, ref agentproto.LeaseRef, code int, signal, reason string) {
	if ctx.Err() != nil {
		return
	}
	a.mu.Lock()
	_, running := a.jobs[ref]
	delete(a.jobs, ref)
	a.mu.Unlock()
	if !running && signal == "" {
		return // killed or stopped already
	}
	t0 := time.Now()
	err := a.c.Exited(a.r.calls, agentproto.JobExited{JobID: ref.JobID, Segment: ref.Segment, ExitCode: code, Signal: signal, Reason: reason,
		Time: time.Now().UTC()})
	a.r.ops.get("agent exited").record(a.r.calls, time.Since(t0), err)
}

func (a *simAgent) stopTimers() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, t := range a.timer {
		t.Stop()
	}
}

// batchErr is a batched call's error, else its first refused lease's.
func batchErr(results []agentproto.LeaseResult, err error) error {
	if err != nil {
		return err
	}
	for _, r := range results {
		if e := r.Err(); e != nil {
			return e
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
