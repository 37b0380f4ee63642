package web

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/labstack/echo/v4"
)

// Read-only views for the Slurm-like CLI (`allot prio`, `allot nodes`):
// the pending queue with each job's priority factors, like sprio, and
// every node's GPUs allocated and idle, like sinfo.

// PrioritiesJSON is the body of GET /api/v1/priorities.
type PrioritiesJSON struct {
	// Order is the policy's queue order (allot.QueueOrderResponse or
	// allot.QueueOrderMultifactor); each job's factors say which order its
	// priority was computed under.
	Order string `json:"order"`
	// Tier1FIFO is the policy's tier1_fifo: tier-1 jobs are served
	// oldest first whatever their priority (true, the default), or by
	// priority like the other classes.
	Tier1FIFO bool `json:"tier1_fifo"`
	// Weights are the policy's multifactor weights (used by the
	// multifactor order only).
	Weights PriorityWeightsJSON `json:"weights"`
	MaxAgeS int64               `json:"max_age_s"`
	Method  string              `json:"method"`
	Jobs    []JobPriorityJSON   `json:"jobs"`
	// CycleID and DecidedAt name the scheduling cycle the order, reasons
	// and estimates are from (null: none has run yet); QueueLength counts
	// its queue (all teams).
	CycleID     *int64     `json:"cycle_id"`
	DecidedAt   *time.Time `json:"decided_at"`
	QueueLength int        `json:"queue_length"`
}

// PriorityWeightsJSON is the policy's weights.
type PriorityWeightsJSON struct {
	FairShare int `json:"fair_share"`
	Size      int `json:"size"`
	Age       int `json:"age"`
}

// JobPriorityJSON is one pending job's priority as the last scheduling
// cycle computed it.
type JobPriorityJSON struct {
	ID    int64  `json:"id"`
	Name  string `json:"name"`
	Team  string `json:"team"`
	User  string `json:"user"`
	Tier  string `json:"tier"`
	GPUs  int    `json:"gpus"`
	Class string `json:"class"` // the tier the job competes in (preemptible when demoted or preemptible)
	// ClassOrder ranks the class (lower first), as admins set it.
	ClassOrder int `json:"class_order"`
	// Priority is the stored total: under the multifactor order
	// W_fs·fair_share + W_size·size + W_age·age (Points), under the
	// response order response_ratio × fair_share_multiplier (Points 0).
	Priority            float64                 `json:"priority"`
	Factors             allot.PriorityBreakdown `json:"factors"`
	Points              PriorityPointsJSON      `json:"points"`
	FairShareMultiplier float64                 `json:"fair_share_multiplier,omitempty"`
	SubmittedAt         time.Time               `json:"submitted_at"`
	Reason              string                  `json:"pending_reason"`
	// Rank is the job's place in the scheduler's order over the whole
	// queue at the last cycle (0: not through a cycle yet, listed last).
	Rank int `json:"rank"`
	// EstStart is that cycle's start estimate (null: unknown); EstKind
	// says what it rests on: reservation, preemption, projection ("").
	EstStart *time.Time `json:"est_start"`
	EstKind  string     `json:"est_kind"`
}

// PriorityPointsJSON is each factor times its weight (0.1 rounded).
type PriorityPointsJSON struct {
	FairShare float64 `json:"fair_share"`
	Size      float64 `json:"size"`
	Age       float64 `json:"age"`
}

const prioritiesMethod = "Pending jobs in the scheduler's order as its last cycle decided it (rank), with that cycle's reasons and start estimates: " +
	"class first (" + tier1OldestFirst + "; a preemptible or budget-demoted job competes as preemptible), then priority, with the starvation guard serving tier 3-4 jobs " +
	"that have waited 20 minutes right after the production classes. Priority = W_fs·F + W_size·S + W_age·A, with F = the team's fair-share factor 2^(−U/S), " +
	"S = GPUs ÷ cluster GPUs, A = wait ÷ max age (at most 1), as that cycle computed them. Jobs not yet through a cycle come last, by submission, with priority 0."

const prioritiesMethodResponse = "Pending jobs in the scheduler's order as its last cycle decided it (rank), with that cycle's reasons and start estimates: " +
	"class first (" + tier1OldestFirst + "; a preemptible or budget-demoted job competes as preemptible), then priority = response ratio × fair-share multiplier: " +
	"(wait + T) ÷ T with T the time limit, times max(2F, 1/32) with F = the team's fair-share factor 2^(−U/S), as that cycle computed them " +
	"(the response order: short jobs first, every job passing newer ones once it has waited about its own length). " +
	"Jobs not yet through a cycle come last, by submission, with priority 0."

// tier1OldestFirst is the methods' tier-1 clause; tier1ByPriority replaces
// it when the policy's tier1_fifo is off.
const (
	tier1OldestFirst = "tier 1 first, served oldest first whatever its priority"
	tier1ByPriority  = "tier 1 first, by priority like the other classes (the policy's tier1_fifo is off)"
)

// prioritiesMethodFor is the method text for policy p: its queue order,
// and how tier 1 is served.
func prioritiesMethodFor(p allot.Policy) string {
	m := prioritiesMethod
	if p.QueueOrder == allot.QueueOrderResponse {
		m = prioritiesMethodResponse
	}
	if !p.Tier1FIFO {
		m = strings.Replace(m, tier1OldestFirst, tier1ByPriority, 1)
	}
	return m
}

// jobClass is the tier a pending job competes in: the last cycle's class,
// else its tier's (preemptible when submitted so).
func jobClass(j *allot.Job) allot.TierID {
	if t, ok := allot.TierOfClass(j.Breakdown.Class); ok {
		return t
	}
	if j.Preemptible {
		return allot.TierPreemptible
	}
	return j.Tier
}

// apiPriorities is GET /api/v1/priorities: the pending jobs the caller can
// see, in the scheduler's order, with their factors. Filters: team,
// mine=1 (or user=me), limit (1–1000, default 100).
func (s *Server) apiPriorities(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	f := store.PriorityFilter{Teams: visibleTeams(u), Team: c.QueryParam("team")}
	errs := allot.FieldErrors{}
	if m := c.QueryParam("mine"); m == "1" || m == "true" || c.QueryParam("user") == "me" {
		f.UserID = u.ID
	} else if v := c.QueryParam("user"); v != "" {
		errs.Add("user", "only user=me is supported here")
	}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			errs.Add("limit", "must be between 1 and 1000")
		}
		f.Limit = n
	}
	if err := errs.Err(); err != nil {
		return err
	}
	p, err := s.st.CurrentPolicy(ctx)
	if err != nil {
		return err
	}
	tiers, err := s.st.ListTiers(ctx)
	if err != nil {
		return err
	}
	order := map[allot.TierID]int{}
	for _, t := range tiers {
		order[t.ID] = t.ClassOrder
	}
	jobs, cyc, err := s.st.QueueList(ctx, f)
	if err != nil {
		return err
	}
	pts := func(w int, x float64) float64 { return math.Round(float64(w)*x*10) / 10 }
	out := PrioritiesJSON{Order: p.QueueOrder, Tier1FIFO: p.Tier1FIFO, Weights: PriorityWeightsJSON{FairShare: p.WeightFairShare, Size: p.WeightSize, Age: p.WeightAge},
		MaxAgeS: int64(p.MaxAge / time.Second), Method: prioritiesMethodFor(p), Jobs: make([]JobPriorityJSON, 0, len(jobs)), QueueLength: cyc.Pending}
	if cyc.ID != 0 {
		id, at := cyc.ID, cyc.DecidedAt.UTC()
		out.CycleID, out.DecidedAt = &id, &at
	}
	for i := range jobs {
		j := &jobs[i].Job
		cl := jobClass(j)
		b := j.Breakdown
		row := JobPriorityJSON{ID: j.ID, Name: j.Name, Team: j.Team, User: j.User, Tier: string(j.Tier), GPUs: j.GPUs,
			Class: string(cl), ClassOrder: order[cl], Priority: j.Priority, Factors: b,
			SubmittedAt: j.SubmittedAt.UTC(), Reason: j.PendingReason}
		if b.Order == allot.QueueOrderResponse {
			row.FairShareMultiplier = math.Round(allot.FairShareMultiplier(b.FairShare)*1e4) / 1e4
		} else {
			row.Points = PriorityPointsJSON{FairShare: pts(p.WeightFairShare, b.FairShare), Size: pts(p.WeightSize, b.Size), Age: pts(p.WeightAge, b.Age)}
		}
		if d := jobs[i].Decision; d != nil {
			row.Rank, row.Reason, row.EstKind = d.Rank, d.Reason, d.EstKind
			if d.RunAs != "" {
				row.Class, row.ClassOrder = string(d.RunAs), order[d.RunAs]
			}
			if !d.EstStart.IsZero() {
				t := d.EstStart.UTC()
				row.EstStart = &t
			}
		}
		out.Jobs = append(out.Jobs, row)
	}
	return writeJSON(c, http.StatusOK, out)
}

// NodeUsageJSON is the body of GET /api/v1/node-usage.
type NodeUsageJSON struct {
	AsOf  time.Time          `json:"as_of"`
	Nodes []NodeUsageRowJSON `json:"nodes"`
}

// NodeUsageRowJSON is one node's GPUs now. Idle counts free GPUs of a
// node that takes jobs (up); a draining, drained or down node's free GPUs
// are out of service ("other").
type NodeUsageRowJSON struct {
	Name        string `json:"name"`
	GPUType     string `json:"gpu_type"`
	State       string `json:"state"` // up, draining, drained, down
	Reason      string `json:"reason"`
	Site        string `json:"site"`
	Domain      string `json:"domain"`
	GPUs        int    `json:"gpus"`
	Allocated   int    `json:"allocated"`
	Idle        int    `json:"idle"`
	Other       int    `json:"other"`
	RunningJobs int    `json:"running_jobs"`
}

// apiNodeUsage is GET /api/v1/node-usage, for every signed-in person.
func (s *Server) apiNodeUsage(c echo.Context) error {
	ctx := c.Request().Context()
	ns, err := s.st.NodeInfos(ctx)
	if err != nil {
		return err
	}
	alloc, err := s.st.NodeAllocatedGPUs(ctx)
	if err != nil {
		return err
	}
	out := NodeUsageJSON{AsOf: s.st.Now().UTC(), Nodes: make([]NodeUsageRowJSON, 0, len(ns))}
	for _, n := range ns {
		a := min(alloc[n.Name], n.GPUCount)
		r := NodeUsageRowJSON{Name: n.Name, GPUType: n.GPUType, State: n.State, Reason: n.StateReason, Site: n.Site, Domain: n.Domain,
			GPUs: n.GPUCount, Allocated: a, RunningJobs: n.RunningJobs}
		if n.State == allot.NodeUp {
			r.Idle = n.GPUCount - a
		} else {
			r.Other = n.GPUCount - a
		}
		out.Nodes = append(out.Nodes, r)
	}
	return writeJSON(c, http.StatusOK, out)
}
