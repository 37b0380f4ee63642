package jobs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/burst"
	"github.com/allotlabs/allot/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
)

// BurstConfig turns cloud burst on (package burst has the rule).
type BurstConfig struct {
	Provider    burst.Provider // nil: burst is off
	GPUType     string         // of the burst nodes; must have a rate (the spot price)
	GPUsPerNode int            // default 8
	// Horizon is the planning horizon of the node count (default 4 h).
	Horizon time.Duration
	// Interval is the period of the evaluation (default 1 min).
	Interval time.Duration
	// RegisterTimeout: a node the provider returned whose agent has not
	// registered this long after is released and marked failed (default
	// 15 min).
	RegisterTimeout time.Duration
	// Server is the URL put in provider requests for the nodes' agents.
	Server string
	// RetryBackoff is the delay before the second attempt of a failed
	// provider call; it doubles each attempt (default 30 s).
	RetryBackoff time.Duration
	// MaxAttempts of a provider call (default 5).
	MaxAttempts int
	// StuckAfter: an event still pending or retrying this long after it
	// was created (its provider job died, or its outcome could not be
	// written) is marked failed by the next evaluation (default: every
	// attempt at the provider job's timeout, plus the backoffs, plus 10
	// min).
	StuckAfter time.Duration
}

func (c *BurstConfig) defaults() {
	if c.GPUsPerNode <= 0 {
		c.GPUsPerNode = 8
	}
	if c.Horizon <= 0 {
		c.Horizon = burst.DefaultHorizon
	}
	if c.Interval <= 0 {
		c.Interval = time.Minute
	}
	if c.RegisterTimeout <= 0 {
		c.RegisterTimeout = 15 * time.Minute
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = 30 * time.Second
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.StuckAfter <= 0 {
		c.StuckAfter = time.Duration(c.MaxAttempts)*providerCallTimeout + c.RetryBackoff<<min(c.MaxAttempts, 16) + 10*time.Minute
	}
}

// Every is how often the burst rule is evaluated (Interval or its
// default); a saved change of the policy's burst settings also evaluates
// it at once.
func (c BurstConfig) Every() time.Duration {
	c.defaults()
	return c.Interval
}

// providerCallTimeout bounds one provider call (the River job's timeout).
const providerCallTimeout = 30 * time.Minute

// BurstEvaluateArgs runs one burst evaluation.
type BurstEvaluateArgs struct{}

// Kind names the job in River's table.
func (BurstEvaluateArgs) Kind() string { return "burst_evaluate" }

// BurstProviderArgs calls the provider for one burst event (a request or
// a release); River retries it with backoff.
type BurstProviderArgs struct {
	EventID int64 `json:"event_id"`
}

// Kind names the job in River's table.
func (BurstProviderArgs) Kind() string { return "burst_provider" }

// Burster evaluates the burst rule and calls the provider.
type Burster struct {
	Store  *store.Store
	Logger *slog.Logger
	Config BurstConfig
}

// NewBurster applies cfg's defaults.
func NewBurster(st *store.Store, log *slog.Logger, cfg BurstConfig) *Burster {
	cfg.defaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Burster{Store: st, Logger: log, Config: cfg}
}

// BurstView is the live burst state: what the rule sees now.
type BurstView struct {
	Policy     allot.Policy
	Shape      burst.Shape
	Queue      burst.Queue
	Nodes      []store.BurstNode // not released (alive, or being released)
	InFlight   int
	MonthSpent allot.Money
	Decision   burst.Decision
	Enabled    bool
	Provider   string
}

// LoadBurstView measures the queue and the burst nodes on st at st.Now()
// and runs the rule (without acting on it). shape.Rate is filled from the
// rate card (zero when the GPU type has none).
func LoadBurstView(ctx context.Context, st *store.Store, cfg BurstConfig) (BurstView, error) {
	cfg.defaults()
	v := BurstView{Enabled: cfg.Provider != nil}
	if v.Enabled {
		v.Provider = cfg.Provider.Name()
	}
	now := st.Now()
	var err error
	if v.Policy, err = st.CurrentPolicy(ctx); err != nil {
		return v, err
	}
	v.Shape = burst.Shape{GPUType: cfg.GPUType, GPUs: cfg.GPUsPerNode}
	if cfg.GPUType != "" {
		v.Shape.Rate, err = st.RateAt(ctx, cfg.GPUType, now)
		if err != nil && allot.ErrorCode(err) != allot.ENotFound {
			return v, err
		}
	}
	pending, err := st.ListJobs(ctx, store.JobFilter{State: allot.JobPending, Limit: -1})
	if err != nil {
		return v, err
	}
	jobs := make([]burst.Job, len(pending))
	for i, j := range pending {
		jobs[i] = burst.Job{GPUs: j.GPUs, GPUType: j.GPUType, GPUsPerNode: j.GPUsPerNode, TimeLimit: j.TimeLimit, Submit: j.SubmittedAt,
			Production: j.Tier.Production()}
	}
	th := burst.FromPolicy(v.Policy)
	v.Queue = burst.Measure(jobs, v.Shape, th.MaxNodes, now)
	if v.InFlight, err = st.BurstInFlight(ctx); err != nil {
		return v, err
	}
	month := store.MonthStart(now)
	nodes, err := st.BurstNodes(ctx, month)
	if err != nil {
		return v, err
	}
	if v.MonthSpent, err = BurstCost(nodes, month, now, v.Shape.Rate.Currency); err != nil {
		return v, err
	}
	in := burst.Input{Queue: v.Queue, Thresholds: th, Shape: v.Shape, Horizon: cfg.Horizon, InFlight: v.InFlight, MonthSpent: v.MonthSpent}
	for _, n := range nodes {
		if !n.ReleasedAt.IsZero() {
			continue
		}
		v.Nodes = append(v.Nodes, n)
		if n.Releasing {
			in.Releasing++
			continue
		}
		in.Nodes = append(in.Nodes, burst.Node{Name: n.Node, Registered: n.Registered, Idle: n.Registered && n.Idle,
			Down: n.Registered && n.State == allot.NodeDown, Drained: n.State == allot.NodeDraining || n.State == allot.NodeDrained})
	}
	v.Decision = burst.Decide(in)
	return v, nil
}

// BurstCost is the exact cost of the burst nodes' time inside [from, to)
// (alive nodes up to to), each node priced at its own rate, in currency
// ("" = USD when there is nothing to price).
func BurstCost(nodes []store.BurstNode, from, to time.Time, currency string) (allot.Money, error) {
	if currency == "" {
		currency = "USD"
	}
	total := allot.Money{Currency: currency}
	for _, n := range nodes {
		a, b := n.ProvisionedAt, to
		if !n.ReleasedAt.IsZero() && n.ReleasedAt.Before(b) {
			b = n.ReleasedAt
		}
		if a.Before(from) {
			a = from
		}
		if !b.After(a) {
			continue
		}
		c, err := burst.Cost(n.GPUs, b.Sub(a), n.Rate)
		if err != nil {
			return total, err
		}
		if n.Rate.Currency != "" {
			total.Currency = n.Rate.Currency
		}
		total.Micros += c.Micros
	}
	return total, nil
}

// Evaluation says what one Evaluate did.
type Evaluation struct {
	Ran      bool // false when another evaluation held the lock
	View     BurstView
	Events   []int64 // burst events created
	Released []string
	Failed   []int64 // open events given up on (StuckAfter)
}

// Evaluate applies the burst rule once: events stuck open longer than
// StuckAfter are marked failed; nodes that never registered or were lost
// (down) are released as failed; nodes whose release failed are released
// again; then the rule's request or release is stored as a burst event
// (audited) with a provider job enqueued in the same transaction. The
// provider is called by that job, not here.
func (b *Burster) Evaluate(ctx context.Context, client *river.Client[pgx.Tx]) (Evaluation, error) {
	var ev Evaluation
	if b.Config.Provider == nil {
		return ev, nil
	}
	err := b.Store.InPgxTx(ctx, func(tx pgx.Tx, st *store.Store) error {
		ev = Evaluation{}
		ok, err := st.TryBurstLock(ctx)
		if err != nil || !ok {
			return err
		}
		ev.Ran = true
		stuck, err := st.FailStuckBurstEvents(ctx, st.Now().Add(-b.Config.StuckAfter))
		if err != nil {
			return err
		}
		if len(stuck) > 0 {
			b.Logger.Warn("burst events without an outcome marked failed", "events", stuck, "after", b.Config.StuckAfter)
			ev.Failed = stuck
		}
		v, err := LoadBurstView(ctx, st, b.Config)
		if err != nil {
			return err
		}
		ev.View = v
		base := store.BurstEvent{Provider: b.Config.Provider.Name(), PendingGPUSeconds: v.Queue.GPUSeconds,
			MeanWaitS: int64(v.Queue.MeanWait / time.Second), PendingJobs: v.Queue.Jobs, GPUType: b.Config.GPUType, GPUsPerNode: b.Config.GPUsPerNode}
		enqueue := func(e *store.BurstEvent) error {
			ev.Events = append(ev.Events, e.ID)
			_, err := client.InsertTx(ctx, tx, BurstProviderArgs{EventID: e.ID}, &river.InsertOpts{MaxAttempts: b.Config.MaxAttempts})
			return err
		}
		// Nodes that never registered, and nodes lost (down: spot
		// reclaim, no heartbeat).
		var late, lost []string
		for _, n := range v.Nodes {
			switch {
			case n.Releasing:
			case !n.Registered && st.Now().Sub(n.ProvisionedAt) > b.Config.RegisterTimeout:
				late = append(late, n.Node)
			case n.Registered && n.State == allot.NodeDown:
				lost = append(lost, n.Node)
			}
		}
		if len(late)+len(lost) > 0 {
			e := base
			e.Kind = store.BurstRelease
			var why []string
			if len(late) > 0 {
				why = append(why, fmt.Sprintf("%d node(s) with no agent registered within %s of provisioning", len(late), b.Config.RegisterTimeout))
			}
			if len(lost) > 0 {
				why = append(why, fmt.Sprintf("%d node(s) lost (down: reclaimed or no heartbeat)", len(lost)))
			}
			e.Reason = strings.Join(why, " and ") + "; releasing them as failed"
			rel, err := st.ReleaseBurstNodes(ctx, &e, append(late, lost...), true)
			if err != nil {
				return err
			}
			if len(rel) > 0 {
				b.Logger.Warn("burst nodes never registered or lost; releasing", "nodes", rel, "event", e.ID)
				ev.Released = append(ev.Released, rel...)
				if err := enqueue(&e); err != nil {
					return err
				}
				return nil // re-evaluate next time, on the new state
			}
		}
		// Releases that failed for good: the nodes may still run (and are
		// billed); ask the provider again.
		retry, err := st.BurstReleasesToRetry(ctx)
		if err != nil {
			return err
		}
		if len(retry) > 0 {
			e := base
			e.Kind = store.BurstRelease
			e.Reason = fmt.Sprintf("the provider did not confirm the release of %d node(s); releasing them again", len(retry))
			rel, err := st.RetryBurstRelease(ctx, &e, retry)
			if err != nil {
				return err
			}
			if len(rel) > 0 {
				b.Logger.Warn("retrying a failed burst release", "nodes", rel, "event", e.ID)
				ev.Released = append(ev.Released, rel...)
				if err := enqueue(&e); err != nil {
					return err
				}
			}
		}
		d := v.Decision
		switch d.Action {
		case burst.ActRequest:
			if v.Shape.Rate.Currency == "" {
				return allot.Errorf(allot.EInvalid, "burst GPU type %q has no rate in the rate card: add it (the spot price) before bursting", b.Config.GPUType)
			}
			e := base
			e.Kind, e.Reason, e.NodesWanted = store.BurstRequest, d.Reason, d.Count
			if err := st.CreateBurstEvent(ctx, &e); err != nil {
				return err
			}
			b.Logger.Info("requesting burst nodes", "count", d.Count, "event", e.ID, "why", d.Reason)
			return enqueue(&e)
		case burst.ActRelease:
			e := base
			e.Kind, e.Reason = store.BurstRelease, d.Reason
			rel, err := st.ReleaseBurstNodes(ctx, &e, d.Release, false)
			if err != nil || len(rel) == 0 {
				return err
			}
			b.Logger.Info("releasing idle burst nodes", "nodes", rel, "event", e.ID, "why", d.Reason)
			ev.Released = append(ev.Released, rel...)
			return enqueue(&e)
		}
		return nil
	})
	return ev, err
}

// Call makes the provider call of event id, attempt attempt of
// maxAttempts: a request provisions nodes and records them (nodes, tokens
// and the event in one transaction, only after the provider succeeded); a
// release removes them. A failure is recorded on the event (retrying, or
// failed at the last attempt), logged, and returned.
func (b *Burster) Call(ctx context.Context, id int64, attempt, maxAttempts int) error {
	e, err := b.Store.BurstEventByID(ctx, id)
	if err != nil {
		return err
	}
	if e.Status == store.BurstDone || e.Status == store.BurstFailed {
		return nil
	}
	p := b.Config.Provider
	if p == nil {
		return errors.New("burst: no provider configured")
	}
	final := attempt >= maxAttempts
	// The outcome is written even when ctx is cancelled (the job timed
	// out, the worker stops): otherwise the event stays open and its nodes
	// count as in flight. A sweep (StuckAfter) covers a worker that dies.
	wctx := context.WithoutCancel(ctx)
	fail := func(err error) error {
		b.Logger.Warn("burst provider call failed", "event", id, "kind", e.Kind, "provider", p.Name(), "attempt", attempt, "of", maxAttempts, "err", err)
		if rerr := b.Store.BurstAttemptFailed(wctx, id, attempt, err.Error(), final); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	switch e.Kind {
	case store.BurstRequest:
		rate, err := b.Store.RateAt(ctx, e.GPUType, b.Store.Now())
		if err != nil {
			return fail(err)
		}
		tokens := make([]string, e.NodesWanted)
		for i := range tokens {
			tokens[i] = store.NewNodeTokenSecret()
		}
		req := burst.Request{EventID: id, Count: e.NodesWanted, GPUType: e.GPUType, GPUsPerNode: e.GPUsPerNode, Site: allot.SiteCloud,
			Server: b.Config.Server, NodeTokens: tokens}
		names, err := p.Provision(ctx, req)
		if err == nil {
			err = burst.CheckNames(req, names)
		}
		if err == nil {
			err = b.Store.BurstProvisioned(wctx, id, names, tokens, rate, attempt)
		}
		if err != nil {
			if len(names) > 0 {
				// The provider may have created them: never leave them behind.
				if rerr := p.Release(context.WithoutCancel(ctx), names); rerr != nil {
					err = fmt.Errorf("%w (and releasing %v failed: %v)", err, names, rerr)
				}
			}
			return fail(err)
		}
		b.Logger.Info("burst nodes provisioned", "event", id, "nodes", names, "provider", p.Name())
		return nil
	case store.BurstRelease:
		if err := p.Release(ctx, e.NodeNames); err != nil {
			return fail(err)
		}
		b.Logger.Info("burst nodes released", "event", id, "nodes", e.NodeNames, "provider", p.Name())
		return b.Store.BurstReleaseDone(wctx, id, attempt)
	}
	return fmt.Errorf("burst event %d has unknown kind %q", id, e.Kind)
}

// BurstEvaluateWorker works BurstEvaluateArgs.
type BurstEvaluateWorker struct {
	river.WorkerDefaults[BurstEvaluateArgs]
	Burster *Burster
}

// Work evaluates the burst rule.
func (w *BurstEvaluateWorker) Work(ctx context.Context, _ *river.Job[BurstEvaluateArgs]) error {
	_, err := w.Burster.Evaluate(ctx, river.ClientFromContext[pgx.Tx](ctx))
	return err
}

// BurstProviderWorker works BurstProviderArgs.
type BurstProviderWorker struct {
	river.WorkerDefaults[BurstProviderArgs]
	Burster *Burster
}

// Work makes the provider call; River retries a failure.
func (w *BurstProviderWorker) Work(ctx context.Context, job *river.Job[BurstProviderArgs]) error {
	return w.Burster.Call(ctx, job.Args.EventID, job.Attempt, job.MaxAttempts)
}

// NextRetry backs off exponentially from RetryBackoff.
func (w *BurstProviderWorker) NextRetry(job *river.Job[BurstProviderArgs]) time.Time {
	n := min(max(job.Attempt-1, 0), 16)
	return time.Now().Add(w.Burster.Config.RetryBackoff << n)
}

// Timeout allows slow cloud APIs.
func (w *BurstProviderWorker) Timeout(*river.Job[BurstProviderArgs]) time.Duration {
	return providerCallTimeout
}
