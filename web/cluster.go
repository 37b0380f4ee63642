package web

import (
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// clusterDays is the span of the dashboard's history and wait statistics.
const clusterDays = 7

// ClusterJSON is the body of GET /api/v1/cluster: the same figures as the
// cluster page. GPU-hours are exact decimal strings; percentages are
// rounded to 0.1.
type ClusterJSON struct {
	AsOf        time.Time         `json:"as_of"`
	GPUs        ClusterGPUsJSON   `json:"gpus"`
	ByGPUType   []GPUTypeNowJSON  `json:"by_gpu_type"`
	Jobs        ClusterJobsJSON   `json:"jobs"`
	Queue       []QueueDepthJSON  `json:"queue"`
	QueueHours  string            `json:"queue_gpu_hours"`
	Waits       []TierWaitJSON    `json:"waits"`
	Nodes       []NodeStateJSON   `json:"nodes"`
	Hourly      []HourPointJSON   `json:"hourly"`
	Definitions map[string]string `json:"definitions"`
	WindowDays  int               `json:"window_days"`
}

// ClusterGPUsJSON is the cluster's GPU count now.
type ClusterGPUsJSON struct {
	Total        int     `json:"total"`
	InService    int     `json:"in_service"`
	Allocated    int     `json:"allocated"`
	AllocatedPct float64 `json:"allocated_pct"`
}

// GPUTypeNowJSON is one GPU type now.
type GPUTypeNowJSON struct {
	GPUType   string `json:"gpu_type"`
	GPUs      int    `json:"gpus"`
	InService int    `json:"in_service"`
	Allocated int    `json:"allocated"`
}

// ClusterJobsJSON counts jobs now.
type ClusterJobsJSON struct {
	Running int `json:"running"`
	Pending int `json:"pending"`
}

// QueueDepthJSON is the pending work for one GPU type ("any": no type asked).
type QueueDepthJSON struct {
	GPUType  string `json:"gpu_type"`
	Jobs     int    `json:"jobs"`
	GPUHours string `json:"gpu_hours"`
}

// TierWaitJSON is one tier's waits, in seconds.
type TierWaitJSON struct {
	Tier          string `json:"tier"`
	Started       int    `json:"started"`
	P50WaitS      int64  `json:"p50_wait_s"`
	P95WaitS      int64  `json:"p95_wait_s"`
	Pending       int    `json:"pending"`
	PendingP50S   int64  `json:"pending_p50_age_s"`
	OldestPending int64  `json:"oldest_pending_age_s"`
}

// NodeStateJSON counts a site's nodes in one state.
type NodeStateJSON struct {
	Site  string `json:"site"`
	State string `json:"state"`
	Nodes int    `json:"nodes"`
	GPUs  int    `json:"gpus"`
}

// HourPointJSON is one hour of the utilization series.
type HourPointJSON struct {
	Hour          time.Time `json:"hour"`
	AllocatedGPUH string    `json:"allocated_gpu_hours"`
	AllocatedPct  float64   `json:"allocated_pct"`
	MeanUtilPct   *float64  `json:"mean_util_pct"`
}

var clusterDefinitions = map[string]string{
	"allocated_pct":        "GPUs in active allocations ÷ GPUs on nodes that are up or draining",
	"hourly.allocated_pct": "GPU-seconds held by allocations in the hour ÷ (GPUs registered now × seconds of the hour; the current hour up to as_of)",
	"hourly.mean_util_pct": "GPU-seconds-weighted mean compute utilization sampled by the agents on allocated GPUs (hourly metering rollup); null without samples",
	"queue.gpu_hours":      "Σ GPUs × time limit of pending jobs",
	"waits":                "wait = first start − submission of jobs first started in the window, by requested tier; pending age = as_of − submission",
}

func round1(f float64) float64 { return math.Round(f*10) / 10 }

func pctOf(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return round1(a * 100 / b)
}

// hourCapacity is the GPU-seconds the registered GPUs offer in hour h up to now.
func hourCapacity(o *store.ClusterOverview, h time.Time) float64 {
	end := h.Add(time.Hour)
	if end.After(o.Now) {
		end = o.Now
	}
	return float64(o.TotalGPU) * end.Sub(h).Seconds()
}

func clusterJSON(o *store.ClusterOverview) ClusterJSON {
	out := ClusterJSON{AsOf: o.Now, Jobs: ClusterJobsJSON{Running: o.Running, Pending: o.Pending}, Definitions: clusterDefinitions,
		WindowDays: clusterDays, ByGPUType: []GPUTypeNowJSON{}, Queue: []QueueDepthJSON{}, Waits: []TierWaitJSON{}, Nodes: []NodeStateJSON{},
		Hourly: []HourPointJSON{}}
	out.GPUs.Total = o.TotalGPU
	for _, t := range o.Types {
		out.GPUs.InService += t.InService
		out.GPUs.Allocated += t.Allocated
		out.ByGPUType = append(out.ByGPUType, GPUTypeNowJSON{GPUType: t.GPUType, GPUs: t.GPUs, InService: t.InService, Allocated: t.Allocated})
	}
	out.GPUs.AllocatedPct = pctOf(float64(out.GPUs.Allocated), float64(out.GPUs.InService))
	var q int64
	for _, d := range o.Queue {
		name := d.GPUType
		if name == "" {
			name = "any"
		}
		q += d.GPUSeconds
		out.Queue = append(out.Queue, QueueDepthJSON{GPUType: name, Jobs: d.Jobs, GPUHours: gpuHours(d.GPUSeconds)})
	}
	out.QueueHours = gpuHours(q)
	for _, w := range o.Waits {
		out.Waits = append(out.Waits, TierWaitJSON{Tier: string(w.Tier), Started: w.Started, P50WaitS: int64(w.P50 / time.Second),
			P95WaitS: int64(w.P95 / time.Second), Pending: w.Pending, PendingP50S: int64(w.PendingP50 / time.Second), OldestPending: int64(w.Oldest / time.Second)})
	}
	for _, n := range o.Nodes {
		out.Nodes = append(out.Nodes, NodeStateJSON{Site: n.Site, State: n.State, Nodes: n.Nodes, GPUs: n.GPUs})
	}
	for _, h := range o.Hourly {
		p := HourPointJSON{Hour: h.Hour, AllocatedGPUH: gpuHours(h.AllocatedGPUSeconds),
			AllocatedPct: pctOf(float64(h.AllocatedGPUSeconds), hourCapacity(o, h.Hour))}
		if h.MeanUtilPct != nil {
			v := round1(*h.MeanUtilPct)
			p.MeanUtilPct = &v
		}
		out.Hourly = append(out.Hourly, p)
	}
	return out
}

// waitText formats a wait for a table ("—" without data).
func waitText(d time.Duration, n int) string {
	if n == 0 {
		return "—"
	}
	return allot.FormatDuration(d.Round(time.Second))
}

// clusterLive builds the dashboard's fragment from the JSON figures, so
// the page and the API cannot disagree.
func clusterLive(o *store.ClusterOverview, j ClusterJSON) views.ClusterLive {
	l := views.ClusterLive{AsOf: fmtTime(o.Now), AllocatedPct: strconv.FormatFloat(j.GPUs.AllocatedPct, 'f', 1, 64) + " %",
		Allocated: j.GPUs.Allocated, InService: j.GPUs.InService, Total: j.GPUs.Total, Running: j.Jobs.Running, Pending: j.Jobs.Pending,
		QueueGPUHours: trimHours(j.QueueHours), HistoryDays: clusterDays}
	l.Types = views.BarChart{ID: "chart-types", Title: "GPUs by type: allocated, idle in service, out of service"}
	for _, t := range j.ByGPUType {
		l.Types.Bars = append(l.Types.Bars, views.Bar{Label: t.GPUType, Text: fmt.Sprintf("%d / %d allocated", t.Allocated, t.InService),
			Parts: []views.BarPart{
				{Value: float64(t.Allocated), Class: "b-alloc", Title: fmt.Sprintf("%d allocated", t.Allocated)},
				{Value: float64(t.InService - t.Allocated), Class: "b-idle", Title: fmt.Sprintf("%d idle in service", t.InService-t.Allocated)},
				{Value: float64(t.GPUs - t.InService), Class: "b-out", Title: fmt.Sprintf("%d out of service", t.GPUs-t.InService)},
			}})
	}
	l.Queue = views.BarChart{ID: "chart-queue", Title: "pending GPU-hours by GPU type"}
	for _, d := range j.Queue {
		h, _ := strconv.ParseFloat(d.GPUHours, 64) // bar length only; the text is exact
		l.Queue.Bars = append(l.Queue.Bars, views.Bar{Label: d.GPUType, Text: fmt.Sprintf("%s GPU-h · %d jobs", trimHours(d.GPUHours), d.Jobs),
			Parts: []views.BarPart{{Value: h, Class: "b-queue"}}})
	}
	rows := map[string]*views.NodeStateRow{}
	var sites []string
	for _, n := range j.Nodes {
		r := rows[n.Site]
		if r == nil {
			r = &views.NodeStateRow{Site: n.Site}
			rows[n.Site] = r
			sites = append(sites, n.Site)
		}
		switch n.State {
		case "up":
			r.Up += n.Nodes
		case "draining":
			r.Draining += n.Nodes
		case "drained":
			r.Drained += n.Nodes
		default:
			r.Down += n.Nodes
		}
		r.Total += n.Nodes
		r.GPUs += n.GPUs
	}
	sort.Strings(sites)
	l.Nodes = views.BarChart{ID: "chart-nodes", Title: "nodes by site and state"}
	for _, s := range sites {
		r := rows[s]
		l.NodeRows = append(l.NodeRows, *r)
		l.Nodes.Bars = append(l.Nodes.Bars, views.Bar{Label: s, Text: fmt.Sprintf("%d up of %d", r.Up, r.Total), Parts: []views.BarPart{
			{Value: float64(r.Up), Class: "n-up", Title: fmt.Sprintf("%d up", r.Up)},
			{Value: float64(r.Draining), Class: "n-draining", Title: fmt.Sprintf("%d draining", r.Draining)},
			{Value: float64(r.Drained), Class: "n-drained", Title: fmt.Sprintf("%d drained", r.Drained)},
			{Value: float64(r.Down), Class: "n-down", Title: fmt.Sprintf("%d down", r.Down)},
		}})
	}
	for _, w := range o.Waits {
		l.Waits = append(l.Waits, views.WaitRow{Tier: string(w.Tier), Started: w.Started, P50: waitText(w.P50, w.Started), P95: waitText(w.P95, w.Started),
			Pending: w.Pending, PendingP50: waitText(w.PendingP50, w.Pending), OldestPending: waitText(w.Oldest, w.Pending)})
	}
	l.History = historyChart(o, j)
	return l
}

// historyChart plots the hourly allocation and utilization percentages.
func historyChart(o *store.ClusterOverview, j ClusterJSON) views.LineChart {
	c := views.LineChart{ID: "chart-history", Title: fmt.Sprintf("allocated and busy GPUs, percent, hourly over %d days", clusterDays),
		YUnit: "%", YMax: 100, XMin: float64(o.From.Unix()), XMax: float64(o.Now.Unix())}
	alloc := views.ChartSeries{Name: "allocated", Class: "s1"}
	busy := views.ChartSeries{Name: "busy (sampled utilization)", Class: "s2"}
	for _, h := range j.Hourly {
		x := float64(h.Hour.Unix())
		alloc.Points = append(alloc.Points, views.ChartPoint{X: x, Y: h.AllocatedPct})
		y := views.NoValue
		if h.MeanUtilPct != nil {
			y = *h.MeanUtilPct
		}
		busy.Points = append(busy.Points, views.ChartPoint{X: x, Y: y})
	}
	c.Series = []views.ChartSeries{alloc, busy}
	for d := o.From.Truncate(24 * time.Hour).Add(24 * time.Hour); d.Before(o.Now); d = d.Add(24 * time.Hour) {
		c.XTicks = append(c.XTicks, views.ChartTick{At: float64(d.Unix()), Label: d.Format("Jan 2")})
	}
	return c
}

// trimHours shows GPU-hours with one decimal (the JSON keeps them exact).
func trimHours(exact string) string {
	f, err := strconv.ParseFloat(exact, 64)
	if err != nil {
		return exact
	}
	return strconv.FormatFloat(f, 'f', 1, 64)
}

func (s *Server) clusterOverview(c echo.Context) (*store.ClusterOverview, ClusterJSON, error) {
	o, err := s.st.ClusterOverview(c.Request().Context(), clusterDays)
	if err != nil {
		return nil, ClusterJSON{}, err
	}
	return &o, clusterJSON(&o), nil
}

// clusterPage is GET /cluster; ?fragment=live returns only the refreshing
// part (the HTMX poll).
func (s *Server) clusterPage(c echo.Context) error {
	o, j, err := s.clusterOverview(c)
	if err != nil {
		return err
	}
	live := clusterLive(o, j)
	if c.QueryParam("fragment") == "live" {
		return render(c, http.StatusOK, views.ClusterLiveView(live))
	}
	return render(c, http.StatusOK, views.ClusterView(views.ClusterPage{Page: s.page(c, "Cluster"), Live: live}))
}

// apiCluster is GET /api/v1/cluster.
func (s *Server) apiCluster(c echo.Context) error {
	_, j, err := s.clusterOverview(c)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, j)
}
