package web

import (
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// Node pages and API: the nodes with their state and health, a node's
// health events with the GPU history that triggered them, admin drain,
// undrain and labels, and the health rules.

// NodeJSON is a node in the API.
type NodeJSON struct {
	Name          string            `json:"name"`
	State         string            `json:"state"`
	Reason        string            `json:"reason"`
	DrainSource   string            `json:"drain_source,omitempty"` // admin or health
	GPUType       string            `json:"gpu_type"`
	GPUs          int               `json:"gpus"`
	Site          string            `json:"site"`
	Domain        string            `json:"domain,omitempty"`
	Labels        map[string]string `json:"labels"`
	LastHeartbeat *time.Time        `json:"last_heartbeat"`
	RunningJobs   int               `json:"running_jobs"`
	OpenEvents    int               `json:"open_health_events"`
	HealthOutput  string            `json:"health_check_output,omitempty"`
	HealthOKSince *time.Time        `json:"health_ok_since,omitempty"`
	// InventoryNote: how what the agent registered differs from the
	// declared GPU type and count, e.g. "registered 4 GPUs of NVIDIA
	// A100-PCIE-40GB (40 GB); declared 8 × H100 (80 GB)"; absent when not.
	InventoryNote string `json:"inventory_note,omitempty"`
}

// HealthEventJSON is a health event in the API.
type HealthEventJSON struct {
	ID         int64            `json:"id"`
	Node       string           `json:"node"`
	At         time.Time        `json:"at"`
	Since      time.Time        `json:"since"`
	Rule       HealthRuleJSON   `json:"rule"`
	Value      float64          `json:"value"`
	GPUs       []int            `json:"gpus"`
	Detail     string           `json:"detail"`
	Action     string           `json:"action"`
	NodeState  string           `json:"node_state"`
	Requeued   []int64          `json:"requeued"`
	ResolvedAt *time.Time       `json:"resolved_at"`
	Samples    []MetricSampleJS `json:"samples,omitempty"`
}

// MetricSampleJS is one GPU reading kept with a health event.
type MetricSampleJS struct {
	GPU      int       `json:"gpu"`
	At       time.Time `json:"at"`
	UtilPct  float64   `json:"util_pct"`
	TempC    float64   `json:"temp_c"`
	PowerW   float64   `json:"power_w"`
	ECCDBE   int64     `json:"ecc_dbe_vol"`
	Throttle uint64    `json:"throttle_reasons"`
	XIDs     int64     `json:"xid_errors"`
}

// NodeDetailJSON is GET /api/v1/nodes/:name.
type NodeDetailJSON struct {
	NodeJSON
	Events []HealthEventJSON `json:"health_events"`
}

// HealthRuleJSON is a rule in the API. Its duration is shown in the
// duration form ("for": "10m", "0s" for at once), like every duration in
// the portal; a client may send it so or as whole seconds ("for_s": 600),
// as it sends a job's time_limit or time_limit_s.
type HealthRuleJSON struct {
	Name     string  `json:"name"`
	Metric   string  `json:"metric"`
	Match    []int   `json:"match"`
	Over     float64 `json:"over"`
	For      string  `json:"for"`
	ForS     *int64  `json:"for_s,omitempty"` // input only: the duration in seconds
	Severity string  `json:"severity"`
	Action   string  `json:"action"`
}

// HealthRulesJSON is GET/PUT /api/v1/health/rules. auto_undrain_after is
// a duration ("30m", "0s" = never); PUT also takes auto_undrain_after_s
// (seconds) instead.
type HealthRulesJSON struct {
	Version           int64            `json:"version,omitempty"`
	Rules             []HealthRuleJSON `json:"rules"`
	AutoUndrainAfter  string           `json:"auto_undrain_after"`
	AutoUndrainAfterS *int64           `json:"auto_undrain_after_s,omitempty"`
	Note              string           `json:"note,omitempty"`
}

func ruleJSON(r allot.HealthRule) HealthRuleJSON {
	d := allot.HealthRuleDocs([]allot.HealthRule{r})[0]
	return HealthRuleJSON{Name: d.Name, Metric: d.Metric, Match: d.Match, Over: d.Over, For: d.For, Severity: d.Severity, Action: d.Action}
}

// rulesJSON is rules as the API shows them (never nil).
func rulesJSON(rules []allot.HealthRule) []HealthRuleJSON {
	out := make([]HealthRuleJSON, 0, len(rules))
	for _, r := range rules {
		out = append(out, ruleJSON(r))
	}
	return out
}

// durationField reads a duration given as text (the "10m" form, or plain
// seconds) or as whole seconds; name is the text field's key, name+"_s"
// the seconds'. Neither given: 0, false.
func durationField(f allot.FieldErrors, name, text string, secs *int64) (time.Duration, bool) {
	text = strings.TrimSpace(text)
	switch {
	case secs != nil && text != "":
		f.Add(name, "give %s or %s_s, not both", name, name)
	case secs != nil:
		if *secs < 0 || *secs > int64(30*24*time.Hour/time.Second) {
			f.Add(name+"_s", "must be between 0 and 2592000 seconds (30 days)")
			return 0, false
		}
		return time.Duration(*secs) * time.Second, true
	case text != "":
		d, err := allot.ParseDuration(text)
		if err != nil {
			f.Add(name, "must be a duration such as 10m, 1h30m or 0s (or %s_s in seconds): %v", name, err)
			return 0, false
		}
		return d, true
	}
	return 0, false
}

// parseRules turns API/form rules into domain rules; duration errors are
// field errors rules[i].for.
func parseRules(in []HealthRuleJSON) ([]allot.HealthRule, allot.FieldErrors) {
	f := allot.FieldErrors{}
	out := make([]allot.HealthRule, 0, len(in))
	for i, r := range in {
		d, _ := durationField(f, fmt.Sprintf("rules[%d].for", i), r.For, r.ForS)
		out = append(out, allot.HealthRule{Name: strings.TrimSpace(r.Name), Metric: strings.TrimSpace(r.Metric), Match: r.Match, Over: r.Over, For: d,
			Severity: strings.TrimSpace(r.Severity), Action: strings.TrimSpace(r.Action)})
	}
	if err := allot.ValidateHealthRules(out); err != nil {
		for k, v := range allot.Fields(err) {
			f.Add(k, "%s", v) // the first message for a field stands
		}
	}
	return out, f
}

func nodeJSON(n store.NodeInfo) NodeJSON {
	j := NodeJSON{Name: n.Name, State: n.State, Reason: n.StateReason, DrainSource: n.DrainSource, GPUType: n.GPUType, GPUs: n.GPUCount,
		Site: n.Site, Domain: n.Domain, Labels: n.Labels, RunningJobs: n.RunningJobs, OpenEvents: n.OpenEvents, HealthOutput: n.HealthOutput,
		HealthOKSince: n.HealthOKSince, InventoryNote: n.InventoryNote}
	if !n.LastHeartbeat.IsZero() {
		hb := n.LastHeartbeat
		j.LastHeartbeat = &hb
	}
	return j
}

func eventJSON(e store.HealthEvent) HealthEventJSON {
	return HealthEventJSON{ID: e.ID, Node: e.Node, At: e.At, Since: e.Since, Rule: ruleJSON(e.Rule), Value: e.Value, GPUs: e.GPUs,
		Detail: e.Detail, Action: e.Action, NodeState: e.NodeState, Requeued: e.Requeued, ResolvedAt: e.ResolvedAt}
}

func (s *Server) apiListNodes(c echo.Context) error {
	ns, err := s.st.NodeInfos(c.Request().Context())
	if err != nil {
		return err
	}
	out := make([]NodeJSON, 0, len(ns))
	for _, n := range ns {
		out = append(out, nodeJSON(n))
	}
	return writeJSON(c, http.StatusOK, map[string]any{"nodes": out})
}

func (s *Server) apiGetNode(c echo.Context) error {
	ctx := c.Request().Context()
	n, err := s.st.NodeInfoByName(ctx, c.Param("name"))
	if err != nil {
		return err
	}
	evs, err := s.st.HealthEvents(ctx, n.Name, false, 50)
	if err != nil {
		return err
	}
	out := NodeDetailJSON{NodeJSON: nodeJSON(n), Events: []HealthEventJSON{}}
	for i, e := range evs {
		j := eventJSON(e)
		if i == 0 {
			pts, err := s.st.HealthEventSamples(ctx, e.ID)
			if err != nil {
				return err
			}
			for _, p := range pts {
				j.Samples = append(j.Samples, MetricSampleJS{GPU: p.GPU, At: p.At, UtilPct: p.UtilPct, TempC: p.TempC, PowerW: p.PowerW,
					ECCDBE: p.ECCDBE, Throttle: p.Throttle, XIDs: p.XIDs})
			}
		}
		out.Events = append(out.Events, j)
	}
	return writeJSON(c, http.StatusOK, out)
}

// DrainJSON is POST /api/v1/nodes/:name/drain.
type DrainJSON struct {
	Reason  string `json:"reason"`
	Requeue bool   `json:"requeue"`
}

// UndrainJSON is POST /api/v1/nodes/:name/undrain.
type UndrainJSON struct {
	Note string `json:"note"`
}

// LabelsJSON is PUT /api/v1/nodes/:name/labels.
type LabelsJSON struct {
	Labels map[string]string `json:"labels"`
	Note   string            `json:"note"`
}

// InventoryJSON is PUT /api/v1/nodes/:name/inventory: the node declared
// again as GPUs × GPUType.
type InventoryJSON struct {
	GPUType string `json:"gpu_type"`
	GPUs    int    `json:"gpus"`
	Note    string `json:"note"`
}

func (s *Server) apiDrainNode(c echo.Context) error {
	u, in, err := userAndBody[DrainJSON](c)
	if err != nil {
		return err
	}
	res, err := s.st.DrainNode(c.Request().Context(), u.Email, c.Param("name"), in.Reason, in.Requeue)
	if err != nil {
		return err
	}
	s.trigger(c)
	n, err := s.st.NodeInfoByName(c.Request().Context(), c.Param("name"))
	if err != nil {
		return err
	}
	req := res.Requeued
	if req == nil {
		req = []int64{}
	}
	return writeJSON(c, http.StatusOK, map[string]any{"node": nodeJSON(n), "requeued": req})
}

func (s *Server) apiUndrainNode(c echo.Context) error {
	u, in, err := userAndBody[UndrainJSON](c)
	if err != nil {
		return err
	}
	if err := s.st.UndrainNode(c.Request().Context(), u.Email, c.Param("name"), in.Note); err != nil {
		return err
	}
	s.trigger(c)
	n, err := s.st.NodeInfoByName(c.Request().Context(), c.Param("name"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, map[string]any{"node": nodeJSON(n)})
}

func (s *Server) apiSetNodeLabels(c echo.Context) error {
	u, in, err := userAndBody[LabelsJSON](c)
	if err != nil {
		return err
	}
	if _, err := s.st.SetNodeLabels(c.Request().Context(), u.Email, c.Param("name"), in.Labels, in.Note); err != nil {
		return err
	}
	n, err := s.st.NodeInfoByName(c.Request().Context(), c.Param("name"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, map[string]any{"node": nodeJSON(n)})
}

func (s *Server) apiSetNodeInventory(c echo.Context) error {
	u, in, err := userAndBody[InventoryJSON](c)
	if err != nil {
		return err
	}
	changed, err := s.st.SetNodeInventory(c.Request().Context(), u.Email, c.Param("name"), in.GPUType, in.GPUs, in.Note)
	if err != nil {
		return err
	}
	if changed {
		s.trigger(c) // capacity changed: the scheduler sees it now
	}
	n, err := s.st.NodeInfoByName(c.Request().Context(), c.Param("name"))
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, map[string]any{"node": nodeJSON(n), "changed": changed})
}

func (s *Server) apiHealthRules(c echo.Context) error {
	p, err := s.st.CurrentPolicy(c.Request().Context())
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, HealthRulesJSON{Version: p.Version, Rules: rulesJSON(p.HealthRules), AutoUndrainAfter: allot.FormatDuration(p.AutoUndrainAfter)})
}

func (s *Server) apiSetHealthRules(c echo.Context) error {
	u, in, err := userAndBody[HealthRulesJSON](c)
	if err != nil {
		return err
	}
	if in.Rules == nil {
		return (allot.FieldErrors{"rules": "is required (an empty list removes every rule)"}).Err()
	}
	rules, f := parseRules(in.Rules)
	var undrain *time.Duration
	if d, ok := durationField(f, "auto_undrain_after", in.AutoUndrainAfter, in.AutoUndrainAfterS); ok {
		undrain = &d
	}
	if err := f.Err(); err != nil {
		return err
	}
	if _, err := s.st.SetHealthRules(c.Request().Context(), u.Email, rules, undrain, in.Note); err != nil {
		return err
	}
	return s.apiHealthRules(c)
}

func (s *Server) apiNotifications(c echo.Context) error {
	ns, err := s.st.Notifications(c.Request().Context(), c.QueryParam("unread") == "true", 200)
	if err != nil {
		return err
	}
	type nj struct {
		ID       int64      `json:"id"`
		At       time.Time  `json:"at"`
		Kind     string     `json:"kind"`
		Severity string     `json:"severity"`
		Subject  string     `json:"subject"`
		Link     string     `json:"link"`
		Message  string     `json:"message"`
		ReadAt   *time.Time `json:"read_at"`
	}
	out := []nj{}
	for _, n := range ns {
		out = append(out, nj{n.ID, n.At, n.Kind, n.Severity, n.Subject, n.Link, n.Message, n.ReadAt})
	}
	return writeJSON(c, http.StatusOK, map[string]any{"notifications": out})
}

// ---- pages ----

func labelsText(l allot.NodeLabels, sep string) string {
	keys := slices.Sorted(maps.Keys(l))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, sep)
}

func nodeRow(n store.NodeInfo) views.NodeRow {
	r := views.NodeRow{Name: n.Name, State: n.State, Reason: n.StateReason, GPUType: n.GPUType, Site: n.Site, GPUs: n.GPUCount,
		Labels: labelsText(n.Labels, ", "), LastHeartbeat: fmtTime(n.LastHeartbeat), Jobs: n.RunningJobs, Health: "ok", HealthClass: "ok",
		InventoryNote: n.InventoryNote}
	switch {
	case n.OpenEvents > 0:
		r.Health, r.HealthClass = fmt.Sprintf("%d open event(s), worst %s", n.OpenEvents, n.WorstOpen), n.WorstOpen
	case n.HealthOutput != "":
		r.Health, r.HealthClass = "health check failing", "critical"
	case n.LastHeartbeat.IsZero():
		r.Health, r.HealthClass = "no agent yet", "info"
	}
	return r
}

func eventRow(e store.HealthEvent) views.HealthEventRow {
	r := views.HealthEventRow{ID: e.ID, Node: e.Node, At: fmtTime(e.At), Since: fmtTime(e.Since), Rule: e.Rule.Name, Metric: e.Rule.Metric,
		Value: strconv.FormatFloat(e.Value, 'g', -1, 64), Detail: e.Detail, Severity: e.Severity, Action: e.Action, NodeState: e.NodeState,
		Link: fmt.Sprintf("/nodes/%s?event=%d", url.PathEscape(e.Node), e.ID)}
	if len(e.Requeued) > 0 {
		ids := make([]string, len(e.Requeued))
		for i, id := range e.Requeued {
			ids[i] = strconv.FormatInt(id, 10)
		}
		r.Requeued = strings.Join(ids, ", ")
	}
	if e.ResolvedAt != nil {
		r.Resolved = fmtTime(*e.ResolvedAt)
	}
	if e.AcknowledgedAt != nil {
		r.Acknowledged = "acknowledged by " + e.AcknowledgedBy + " " + fmtTime(*e.AcknowledgedAt)
	}
	return r
}

func (s *Server) nodesPage(c echo.Context) error {
	ctx := c.Request().Context()
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	ns, err := s.st.NodeInfos(ctx)
	if err != nil {
		return err
	}
	l := views.NodesList{Page: s.page(c, "Nodes"), Admin: u.Admin}
	counts := map[string]int{}
	for _, n := range ns {
		l.Rows = append(l.Rows, nodeRow(n))
		counts[n.State]++
	}
	for _, st := range []string{allot.NodeUp, allot.NodeDraining, allot.NodeDrained, allot.NodeDown} {
		l.Counts = append(l.Counts, views.Option{Value: st, Label: strconv.Itoa(counts[st])})
	}
	evs, err := s.st.HealthEvents(ctx, "", true, 100)
	if err != nil {
		return err
	}
	for _, e := range evs {
		l.OpenEvents = append(l.OpenEvents, eventRow(e))
	}
	if u.Admin {
		nots, err := s.st.Notifications(ctx, false, 30)
		if err != nil {
			return err
		}
		for _, n := range nots {
			l.Notifications = append(l.Notifications, views.NotificationRow{At: fmtTime(n.At), Severity: n.Severity, Kind: n.Kind,
				Message: n.Message, Link: n.Link, Unread: n.ReadAt == nil})
			if n.ReadAt == nil {
				l.Unread++
			}
		}
	}
	return render(c, http.StatusOK, views.NodesView(l))
}

func (s *Server) readNotificationsForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	if _, err := s.st.MarkNotificationsRead(c.Request().Context(), u.Email); err != nil {
		return err
	}
	return redirect(c, "/nodes")
}

// historyCharts draws per-GPU lines over [from, to]: temperature,
// utilization, and the metric of the rule that fired (metric "" = none).
func historyCharts(pts []store.MetricPoint, from, to time.Time, metric string) []views.LineChart {
	span := to.Sub(from)
	if span <= 0 {
		span = time.Second // a degenerate window: plot it as one second
	}
	type chartDef struct {
		id, title, unit string
		ymax            float64
		val             func(store.MetricPoint) float64
	}
	defs := []chartDef{
		{"chart-temp", "GPU temperature (°C)", "°C", 100, func(p store.MetricPoint) float64 { return p.TempC }},
		{"chart-util", "GPU utilization (%)", "%", 100, func(p store.MetricPoint) float64 { return p.UtilPct }},
	}
	switch metric {
	case allot.MetricECCDoubleBit:
		defs = append([]chartDef{{"chart-metric", "Double-bit ECC errors (volatile total)", "errors", 4, func(p store.MetricPoint) float64 { return float64(p.ECCDBE) }}}, defs...)
	case allot.MetricXID:
		defs = append([]chartDef{{"chart-metric", "XID errors seen (count)", "XIDs", 4, func(p store.MetricPoint) float64 { return float64(p.XIDs) }}}, defs...)
	case allot.MetricThrottle:
		defs = append([]chartDef{{"chart-metric", "Clocks throttled (thermal or power)", "on", 1, func(p store.MetricPoint) float64 {
			if p.Throttle&allot.ThrottleDefaultMask != 0 {
				return 1
			}
			return 0
		}}}, defs...)
	}
	byGPU := map[int][]store.MetricPoint{}
	var gpus []int
	for _, p := range pts {
		if _, ok := byGPU[p.GPU]; !ok {
			gpus = append(gpus, p.GPU)
		}
		byGPU[p.GPU] = append(byGPU[p.GPU], p)
	}
	slices.Sort(gpus)
	layout := "15:04"
	if span < 10*time.Minute {
		layout = "15:04:05"
	}
	if span < 10*time.Second {
		layout = "15:04:05.0"
	}
	var ticks []views.ChartTick
	for i := 0; i <= 4; i++ {
		at := from.Add(span * time.Duration(i) / 4)
		ticks = append(ticks, views.ChartTick{At: at.Sub(from).Seconds(), Label: at.UTC().Format(layout)})
	}
	var out []views.LineChart
	for _, d := range defs {
		c := views.LineChart{ID: d.id, Title: d.title, YUnit: d.unit, XMin: 0, XMax: span.Seconds(), YMax: d.ymax, XTicks: ticks}
		for i, g := range gpus {
			sr := views.ChartSeries{Name: fmt.Sprintf("GPU %d", g), Class: fmt.Sprintf("s%d", i%6+1)}
			for _, p := range byGPU[g] {
				v := d.val(p)
				if v > c.YMax {
					c.YMax = math.Ceil(v*1.1/5) * 5
				}
				sr.Points = append(sr.Points, views.ChartPoint{X: p.At.Sub(from).Seconds(), Y: v})
			}
			c.Series = append(c.Series, sr)
		}
		out = append(out, c)
	}
	return out
}

func (s *Server) nodeDetail(c echo.Context, name string) (views.NodeDetail, error) {
	ctx := c.Request().Context()
	u, err := currentUser(c)
	if err != nil {
		return views.NodeDetail{}, err
	}
	n, err := s.st.NodeInfoByName(ctx, name)
	if err != nil {
		return views.NodeDetail{}, err
	}
	d := views.NodeDetail{Page: s.page(c, "Node "+n.Name), Node: nodeRow(n), HealthOutput: n.HealthOutput, Hostname: n.Hostname,
		Agent: strings.TrimSpace(fmt.Sprintf("agent %s %s %s", n.AgentVersion, n.GPUBackend, n.Driver)), LabelsText: labelsText(n.Labels, "\n"),
		Admin: u.Admin, CanDrain: u.Admin && (n.State == allot.NodeUp || n.State == allot.NodeDraining),
		CanUndrain: u.Admin && (n.State == allot.NodeDraining || n.State == allot.NodeDrained), Errors: map[string]string{}, Form: map[string]string{}}
	if n.GPUBackend == "" {
		d.Agent = "no agent registered yet"
	}
	if n.HealthOKSince != nil {
		d.HealthOKSince = fmtTime(*n.HealthOKSince)
	}
	switch n.State {
	case allot.NodeDraining, allot.NodeDrained:
		d.Why = n.DrainReason
		d.DrainedBy = "Drained by an admin"
		if n.DrainSource == allot.DrainByHealth {
			d.DrainedBy = "Drained by a health rule"
		}
		if n.DrainedAt != nil {
			d.DrainedBy += "; no jobs left on it since " + fmtTime(*n.DrainedAt)
		}
		d.DrainedBy += "."
		if n.State == allot.NodeDraining {
			d.Why += fmt.Sprintf(" — no new jobs; %d job(s) still running", n.RunningJobs)
		}
	case allot.NodeDown:
		d.Why = n.StateReason
	}
	evs, err := s.st.HealthEvents(ctx, n.Name, false, 50)
	if err != nil {
		return d, err
	}
	for _, e := range evs {
		d.Events = append(d.Events, eventRow(e))
	}
	// The history: the chosen event's (default the newest), else the last hour.
	var chosen *store.HealthEvent
	if id, err := strconv.ParseInt(c.QueryParam("event"), 10, 64); err == nil {
		for i := range evs {
			if evs[i].ID == id {
				chosen = &evs[i]
			}
		}
	} else if len(evs) > 0 {
		chosen = &evs[0]
	}
	var pts []store.MetricPoint
	var from, to time.Time
	if chosen != nil {
		if pts, err = s.st.HealthEventSamples(ctx, chosen.ID); err != nil {
			return d, err
		}
		from, to = chosen.Since.Add(-10*time.Minute), chosen.At
		if len(pts) > 0 {
			from, to = pts[0].At, pts[0].At
			for _, p := range pts {
				from = minTime(from, p.At)
				to = maxTime(to, p.At)
			}
		}
		d.ChartEvent = chosen.ID
		d.ChartNote = fmt.Sprintf("The readings kept with event %d (rule %s: %s): from %s until it fired at %s; the condition held from %s. One line per GPU.",
			chosen.ID, chosen.Rule.Name, chosen.Detail, fmtSec(from), fmtSec(chosen.At), fmtSec(chosen.Since))
		d.Charts = historyCharts(pts, from, to, chosen.Rule.Metric)
	} else {
		to = s.st.Now()
		from = to.Add(-time.Hour)
		if pts, err = s.st.NodeSamples(ctx, n.Name, from, to); err != nil {
			return d, err
		}
		d.ChartNote = "The last hour of readings. One line per GPU."
		d.Charts = historyCharts(pts, from, to, "")
	}
	audit, err := s.st.AuditLog(ctx, store.AuditFilter{Object: "node:" + n.Name, Limit: 20})
	if err != nil {
		return d, err
	}
	for _, a := range audit {
		d.Audit = append(d.Audit, views.AuditLine{At: fmtTime(a.At), Actor: a.Actor, Action: a.Action, Note: a.Note})
	}
	return d, nil
}

func fmtSec(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (s *Server) nodePage(c echo.Context) error {
	d, err := s.nodeDetail(c, c.Param("name"))
	if err != nil {
		return err
	}
	d.Saved = c.QueryParam("saved")
	return render(c, http.StatusOK, views.NodeDetailView(d))
}

// nodeFormResult redirects after a successful admin form, or shows the
// node page again with the errors (422) and what was typed.
func (s *Server) nodeFormResult(c echo.Context, name, saved string, err error, typed map[string]string) error {
	if err == nil {
		return redirect(c, "/nodes/"+url.PathEscape(name)+"?saved="+url.QueryEscape(saved))
	}
	errs, ferr := formErrors(err)
	if ferr != nil {
		return ferr
	}
	d, derr := s.nodeDetail(c, name)
	if derr != nil {
		return derr
	}
	d.Form, d.Errors = typed, errs
	status := http.StatusUnprocessableEntity
	if allot.ErrorCode(err) == allot.EConflict {
		status = http.StatusConflict
	}
	return render(c, status, views.NodeDetailView(d))
}

func (s *Server) drainNodeForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	name, reason, requeue := c.Param("name"), c.FormValue("reason"), c.FormValue("requeue") != ""
	if !confirmed(c) {
		// Check what DrainNode checks, then ask (see confirmPage).
		n, err := s.st.NodeInfoByName(c.Request().Context(), name)
		if err != nil {
			return err
		}
		if err := store.CheckDrainReason(reason); err != nil {
			return s.nodeFormResult(c, name, "", err, map[string]string{"reason": reason})
		}
		if err := store.CheckDrainable(name, n.State); err != nil {
			return s.nodeFormResult(c, name, "", err, map[string]string{"reason": reason})
		}
		fields, how := []views.Option{{Value: "reason", Label: reason}}, "no"
		if requeue {
			fields, how = append(fields, views.Option{Value: "requeue", Label: "1"}), "yes"
		}
		q := views.DrainQuestion(name, n.RunningJobs, how)
		q.Lines = append(q.Lines, "Reason (in the audit log): "+strings.TrimSpace(reason))
		return s.confirmPage(c, q, "/nodes/"+url.PathEscape(name)+"/drain", fields, "/nodes/"+url.PathEscape(name))
	}
	res, err := s.st.DrainNode(c.Request().Context(), u.Email, name, reason, requeue)
	if err == nil {
		s.trigger(c)
	}
	msg := "Node " + res.State + "."
	if len(res.Requeued) > 0 {
		msg += fmt.Sprintf(" %d job(s) are being requeued.", len(res.Requeued))
	}
	return s.nodeFormResult(c, name, msg, err, map[string]string{"reason": reason})
}

func (s *Server) undrainNodeForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	name, note := c.Param("name"), c.FormValue("note")
	err = s.st.UndrainNode(c.Request().Context(), u.Email, name, note)
	if err == nil {
		s.trigger(c)
	}
	return s.nodeFormResult(c, name, "Node undrained.", err, map[string]string{"note": note})
}

// parseLabels reads key=value lines.
func parseLabels(text string) (allot.NodeLabels, error) {
	l := allot.NodeLabels{}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, (allot.FieldErrors{"labels": fmt.Sprintf("line %d: write key=value", i+1)}).Err()
		}
		l[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if err := l.Validate(); err != nil {
		return nil, (allot.FieldErrors{"labels": allot.ErrorMessage(err)}).Err()
	}
	return l, nil
}

func (s *Server) nodeLabelsForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	name := c.Param("name")
	l, err := parseLabels(c.FormValue("labels"))
	msg := "Labels saved (new policy version)."
	if err == nil {
		var res store.AdminResult
		if res, err = s.st.SetNodeLabels(c.Request().Context(), u.Email, name, l, ""); err == nil && !res.Changed {
			msg = "No change: the labels were already so."
		}
	}
	return s.nodeFormResult(c, name, msg, err, nil)
}

// ---- /admin/health ----

func (s *Server) healthRulesView(c echo.Context, rules []HealthRuleJSON, undrain, webhook string, errs map[string]string) (views.HealthRulesEdit, error) {
	ctx := c.Request().Context()
	p, err := s.st.CurrentPolicy(ctx)
	if err != nil {
		return views.HealthRulesEdit{}, err
	}
	h := views.HealthRulesEdit{Page: s.page(c, "Health rules"), Version: p.Version, Severities: allot.HealthSeverities, Actions: allot.HealthActions, Errors: errs}
	if h.Errors == nil {
		h.Errors = map[string]string{}
	}
	for _, m := range []string{allot.MetricECCDoubleBit, allot.MetricXID, allot.MetricThrottle, allot.MetricGPUMissing, allot.MetricHealthCheck} {
		h.Metrics = append(h.Metrics, views.Option{Value: m, Label: allot.HealthMetrics[m]})
	}
	if rules == nil {
		for _, r := range p.HealthRules {
			rules = append(rules, ruleJSON(r))
		}
		undrain = allot.FormatDuration(p.AutoUndrainAfter)
		if webhook, err = s.st.AdminWebhook(ctx); err != nil {
			return h, err
		}
	}
	for i, r := range rules {
		m := make([]string, len(r.Match))
		for j, x := range r.Match {
			m[j] = strconv.Itoa(x)
		}
		h.Rules = append(h.Rules, views.HealthRuleRow{Index: i, Name: r.Name, Metric: r.Metric, Match: strings.Join(m, ", "),
			Over: strconv.FormatFloat(r.Over, 'g', -1, 64), For: r.For, Severity: r.Severity, Action: r.Action})
	}
	h.Rules = append(h.Rules, views.HealthRuleRow{Index: len(rules), New: true, Over: "0", For: "0s", Severity: "warning", Action: allot.HealthWarn})
	h.AutoUndrain, h.Webhook = undrain, webhook
	ds, err := s.st.AdminDeliveries(ctx, 10)
	if err != nil {
		return h, err
	}
	for _, d := range ds {
		res := d.Error
		if d.Status != nil {
			res = strconv.Itoa(*d.Status) + " " + res
		}
		h.Deliveries = append(h.Deliveries, views.NotificationRow{At: fmtTime(d.At), Severity: fmt.Sprintf("attempt %d: %s", d.Attempt, res), Message: d.URL})
	}
	return h, nil
}

func (s *Server) healthRulesPage(c echo.Context) error {
	h, err := s.healthRulesView(c, nil, "", "", nil)
	if err != nil {
		return err
	}
	h.Saved = c.QueryParam("saved")
	return render(c, http.StatusOK, views.HealthRulesView(h))
}

func (s *Server) healthRulesForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(c.FormValue("rules"))
	if err != nil || n < 0 || n > 101 {
		return &badRequest{"the form is incomplete; reload the page"}
	}
	f := allot.FieldErrors{}
	var rules []HealthRuleJSON
	for i := 0; i <= n; i++ {
		k := func(name string) string { return strings.TrimSpace(c.FormValue(name + "_" + strconv.Itoa(i))) }
		if k("delete") != "" || (i == n && k("name") == "") {
			continue // deleted, or the empty new-rule row
		}
		r := HealthRuleJSON{Name: k("name"), Metric: k("metric"), For: k("for"), Severity: k("severity"), Action: k("action")}
		idx := len(rules)
		if over := k("over"); over != "" {
			v, err := strconv.ParseFloat(over, 64)
			if err != nil {
				f.Add(fmt.Sprintf("rules[%d].over", idx), "must be a number")
			}
			r.Over = v
		}
		for _, m := range strings.FieldsFunc(k("match"), func(r rune) bool { return r == ',' || r == ' ' }) {
			v, err := strconv.Atoi(m)
			if err != nil {
				f.Add(fmt.Sprintf("rules[%d].match", idx), "must be whole numbers separated by commas")
				break
			}
			r.Match = append(r.Match, v)
		}
		rules = append(rules, r)
	}
	parsed, pf := parseRules(rules)
	for k, v := range pf {
		f.Add(k, "%s", v)
	}
	undrainText, webhook := strings.TrimSpace(c.FormValue("auto_undrain_after")), strings.TrimSpace(c.FormValue("webhook"))
	var undrain time.Duration
	if undrainText != "" {
		if undrain, err = allot.ParseDuration(undrainText); err != nil || undrain < 0 {
			f.Add("auto_undrain_after", "must be a duration such as 30m, or 0s for never")
		}
	}
	if msg := webhookProblem(c.Request().Context(), webhook); msg != "" {
		f.Add("webhook", "%s", msg)
	}
	ctx := c.Request().Context()
	if len(f) == 0 {
		// Rules and webhook in one transaction: both are saved or neither.
		var changed bool
		changed, err = s.st.SetHealthSettings(ctx, u.Email, parsed, &undrain, webhook, c.FormValue("note"))
		if err == nil {
			msg := "Health rules saved."
			if !changed {
				msg = "No change: the rules and the webhook were already so."
			}
			return redirect(c, "/admin/health?saved="+url.QueryEscape(msg))
		}
		if allot.ErrorCode(err) != allot.EInvalid {
			return err
		}
		f = allot.Fields(err)
		if len(f) == 0 {
			f = allot.FieldErrors{"_form": allot.ErrorMessage(err)}
		}
	}
	if rules == nil {
		rules = []HealthRuleJSON{}
	}
	h, err := s.healthRulesView(c, rules, undrainText, webhook, f)
	if err != nil {
		return err
	}
	return render(c, http.StatusUnprocessableEntity, views.HealthRulesView(h))
}
