package web

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/burst"
	"github.com/allotlabs/allot/internal/jobs"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// burstEventsShown is how many recent burst events the page and the API
// list.
const burstEventsShown = 100

// burstJSON is GET /api/v1/burst: the rule's settings, its live inputs,
// the burst nodes alive and the recent events with their cost.
type burstJSON struct {
	Enabled    bool               `json:"enabled"`
	Provider   string             `json:"provider"`
	Shape      burstShapeJSON     `json:"node_shape"`
	Thresholds burstThresholdJSON `json:"thresholds"`
	Now        burstNowJSON       `json:"now"`
	MonthSpent string             `json:"month_spent"`
	Nodes      []burstNodeJSON    `json:"nodes"`
	Events     []burstEventJSON   `json:"events"`
}

type burstShapeJSON struct {
	GPUType        string `json:"gpu_type"`
	GPUs           int    `json:"gpus"`
	RatePerGPUHour string `json:"rate_per_gpu_hour"` // "" when the rate card lacks the type
}

type burstThresholdJSON struct {
	PendingGPUHours int    `json:"pending_gpu_hours"`
	MeanWaitS       int64  `json:"mean_wait_s"`
	ReleaseGPUHours int    `json:"release_gpu_hours"`
	MaxNodes        int    `json:"max_nodes"`
	MonthlyBudget   string `json:"monthly_budget"` // "" = no cap
	HorizonS        int64  `json:"horizon_s"`
	PolicyVersion   int64  `json:"policy_version"`
}

type burstNowJSON struct {
	PendingGPUHours float64  `json:"pending_gpu_hours"`
	PendingJobs     int      `json:"pending_jobs"`
	MeanWaitS       int64    `json:"mean_wait_s"`
	InFlightNodes   int      `json:"in_flight_nodes"`
	Decision        string   `json:"decision"`
	Count           int      `json:"count,omitempty"`
	Release         []string `json:"release,omitempty"`
	Reason          string   `json:"reason"`
}

type burstNodeJSON struct {
	store.BurstNode
	CostSoFar string `json:"cost_so_far"`
}

type burstEventJSON struct {
	store.BurstEvent
	PendingGPUHours float64 `json:"pending_gpu_hours"`
	CostSoFar       string  `json:"cost_so_far"`
}

func (s *Server) burstReport(c echo.Context) (burstJSON, error) {
	ctx := c.Request().Context()
	cfg := s.cfg.Burst
	if cfg.GPUType == "" {
		cfg.GPUType = "A100-spot"
	}
	u, _ := c.Get(ctxUser).(*allot.User)
	admin := u != nil && u.Admin
	v, err := jobs.LoadBurstView(ctx, s.st, cfg)
	if err != nil {
		return burstJSON{}, err
	}
	now := s.st.Now()
	cur := v.Shape.Rate.Currency
	money := func(m allot.Money) string {
		if m.Currency == "" {
			m.Currency = cur
		}
		if m.Currency == "" {
			m.Currency = "USD"
		}
		return m.String()
	}
	horizon := cfg.Horizon
	if horizon <= 0 {
		horizon = burst.DefaultHorizon
	}
	out := burstJSON{Enabled: v.Enabled, Provider: v.Provider, MonthSpent: money(v.MonthSpent),
		Shape: burstShapeJSON{GPUType: v.Shape.GPUType, GPUs: v.Shape.GPUs},
		Thresholds: burstThresholdJSON{PendingGPUHours: v.Policy.BurstPendingGPUHours, MeanWaitS: int64(v.Policy.BurstMeanWait / time.Second),
			ReleaseGPUHours: v.Policy.BurstReleaseGPUHours, MaxNodes: v.Policy.BurstMaxNodes, HorizonS: int64(horizon / time.Second),
			PolicyVersion: v.Policy.Version},
		Now: burstNowJSON{PendingGPUHours: v.Queue.GPUHours(), PendingJobs: v.Queue.Jobs, MeanWaitS: int64(v.Queue.MeanWait / time.Second),
			InFlightNodes: v.InFlight, Decision: string(v.Decision.Action), Count: v.Decision.Count, Release: v.Decision.Release, Reason: v.Decision.Reason},
		Nodes: []burstNodeJSON{}, Events: []burstEventJSON{}}
	if v.Shape.Rate.Currency != "" {
		out.Shape.RatePerGPUHour = v.Shape.Rate.String()
	}
	if v.Policy.BurstMonthlyBudget.Micros > 0 {
		out.Thresholds.MonthlyBudget = money(v.Policy.BurstMonthlyBudget)
	}
	for _, n := range v.Nodes {
		c, err := jobs.BurstCost([]store.BurstNode{n}, n.ProvisionedAt, now, cur)
		if err != nil {
			return out, err
		}
		out.Nodes = append(out.Nodes, burstNodeJSON{BurstNode: n, CostSoFar: money(c)})
	}
	events, err := s.st.ListBurstEvents(ctx, burstEventsShown)
	if err != nil {
		return out, err
	}
	ids := make([]int64, len(events))
	for i, e := range events {
		ids[i] = e.ID
	}
	nodes, err := s.st.BurstNodesOfEvents(ctx, ids)
	if err != nil {
		return out, err
	}
	for _, e := range events {
		var mine []store.BurstNode
		for _, n := range nodes {
			if (e.Kind == store.BurstRequest && n.EventID == e.ID) || (e.Kind == store.BurstRelease && n.ReleaseEventID == e.ID) {
				mine = append(mine, n)
			}
		}
		c, err := jobs.BurstCost(mine, time.Time{}, now, cur)
		if err != nil {
			return out, err
		}
		if !admin {
			e.Error = publicBurstError(e.Error)
		}
		out.Events = append(out.Events, burstEventJSON{BurstEvent: e, PendingGPUHours: float64(e.PendingGPUSeconds) / 3600, CostSoFar: money(c)})
	}
	return out, nil
}

// burstExitRE finds how a provider command ended in an event's error.
var burstExitRE = regexp.MustCompile(`exit status \d+|signal: [a-z ]+|timed out after [0-9hms.]+`)

// publicBurstError is what people other than admins see of a provider
// error: the provider's output (an exec command's stderr: cloud account
// details, internal host names) is for admins only.
func publicBurstError(msg string) string {
	if msg == "" {
		return ""
	}
	out := "provider failed, see admins"
	if m := burstExitRE.FindString(msg); m != "" {
		out += " (" + m + ")"
	}
	return out
}

// apiBurst is GET /api/v1/burst.
func (s *Server) apiBurst(c echo.Context) error {
	r, err := s.burstReport(c)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, r)
}

func fmtWait(d time.Duration) string {
	d = d.Round(time.Minute)
	if d < time.Hour {
		return fmt.Sprintf("%d min", int(d/time.Minute))
	}
	return fmt.Sprintf("%d h %02d min", int(d/time.Hour), int(d%time.Hour/time.Minute))
}

// burstPage is GET /burst.
func (s *Server) burstPage(c echo.Context) error {
	r, err := s.burstReport(c)
	if err != nil {
		return err
	}
	const when = "2006-01-02 15:04 UTC"
	p := views.Burst{Page: s.page(c, "Cloud burst"), Enabled: r.Enabled, Provider: r.Provider,
		PendingGPUHours: fmt.Sprintf("%.1f", r.Now.PendingGPUHours), MeanWait: fmtWait(time.Duration(r.Now.MeanWaitS) * time.Second),
		PendingJobs: r.Now.PendingJobs, InFlight: r.Now.InFlightNodes, Decision: r.Now.Decision, Reason: r.Now.Reason, MonthSpent: r.MonthSpent}
	p.Shape = fmt.Sprintf("%d × %s", r.Shape.GPUs, r.Shape.GPUType)
	if r.Shape.RatePerGPUHour != "" {
		p.Shape += " at " + r.Shape.RatePerGPUHour + " per GPU-hour"
	} else {
		p.Shape += " (no rate in the rate card: add the spot price before bursting)"
	}
	t := r.Thresholds
	budget := t.MonthlyBudget
	if budget == "" {
		budget = "no cap"
	}
	p.Thresholds = []views.BurstThreshold{
		{Name: "Request nodes above", Value: fmt.Sprintf("%d GPU-h pending", t.PendingGPUHours), Help: "and only when the mean wait is also above its threshold"},
		{Name: "Mean wait above", Value: fmtWait(time.Duration(t.MeanWaitS) * time.Second)},
		{Name: "Release idle nodes below", Value: fmt.Sprintf("%d GPU-h pending", t.ReleaseGPUHours), Help: "busy nodes are never released"},
		{Name: "Burst nodes at most", Value: fmt.Sprint(t.MaxNodes), Help: "0 turns burst off"},
		{Name: "Monthly burst budget", Value: budget, Help: "each new node is counted at the cost of one planning horizon"},
		{Name: "Planning horizon", Value: fmtWait(time.Duration(t.HorizonS) * time.Second),
			Help: "nodes requested = ceil(pending GPU-h ÷ (GPUs per node × horizon)) − nodes already coming or idle"},
	}
	if t.PolicyVersion > 0 {
		p.Thresholds = append(p.Thresholds, views.BurstThreshold{Name: "Policy version", Value: fmt.Sprint(t.PolicyVersion), Help: "admins change the thresholds in the admin policy page"})
	}
	for _, n := range r.Nodes {
		p.Nodes = append(p.Nodes, views.BurstNodeRow{Name: n.Node, State: n.State, Since: n.ProvisionedAt.UTC().Format(when), Cost: n.CostSoFar,
			EventID: n.EventID, Registered: n.Registered, Idle: n.Idle, Releasing: n.Releasing})
	}
	for _, e := range r.Events {
		p.Events = append(p.Events, views.BurstEventRow{ID: e.ID, At: e.At.UTC().Format(when), Kind: e.Kind, Status: e.Status, Provider: e.Provider,
			Reason: e.Reason, PendingGPUHours: fmt.Sprintf("%.1f", e.PendingGPUHours), MeanWait: fmtWait(time.Duration(e.MeanWaitS) * time.Second),
			Nodes: e.NodesWanted, NodeNames: strings.Join(e.NodeNames, ", "), Attempts: e.Attempts, Error: e.Error, Cost: e.CostSoFar})
	}
	return render(c, http.StatusOK, views.BurstView(p))
}
