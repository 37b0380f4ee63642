package web

import (
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

func jobRow(j *allot.Job) views.JobRow {
	return views.JobRow{ID: j.ID, Name: j.Name, Team: j.Team, User: j.User, Tier: string(j.Tier), GPUs: j.GPUs, GPUType: j.GPUType,
		TimeLimit: allot.FormatDuration(j.TimeLimit), State: string(j.State), Submitted: fmtTime(j.SubmittedAt),
		PendingReason: j.PendingReason, Preemptible: j.Preemptible, QuotaWarning: quotaWarning(j)}
}

// quotaWarning is the job's submission-time budget warning, worded for
// where the job is now (never "will run" once it has ended).
func quotaWarning(j *allot.Job) string {
	return allot.QuotaWarningAt(j.QuotaWarning, j.State, !j.StartedAt.IsZero())
}

// latestAlerts keeps one budget alert per team and month, the highest
// threshold (the 100 % alert says all the 80 % one does, and more), in the
// order given.
func latestAlerts(alerts []store.BudgetAlert) []store.BudgetAlert {
	type key struct {
		team  string
		month time.Time
	}
	best := map[key]int{}
	for i, a := range alerts {
		k := key{a.Team, a.Month}
		if j, ok := best[k]; !ok || a.ThresholdPct > alerts[j].ThresholdPct {
			best[k] = i
		}
	}
	var out []store.BudgetAlert
	for i, a := range alerts {
		if best[key{a.Team, a.Month}] == i {
			out = append(out, a)
		}
	}
	return out
}

// teamOptions lists the teams u may act for (all teams for admins).
func (s *Server) teamOptions(c echo.Context, u *allot.User, forSubmit bool) ([]views.Option, error) {
	teams, err := s.st.ListTeams(c.Request().Context())
	if err != nil {
		return nil, err
	}
	var out []views.Option
	for _, t := range teams {
		if u.Admin || (!forSubmit && u.Finance) || u.MemberOf(t.Slug) {
			out = append(out, views.Option{Value: t.Slug, Label: t.Name + " (" + t.Slug + ")"})
		}
	}
	return out, nil
}

func (s *Server) jobsPage(c echo.Context) error {
	u, f, jobs, err := s.listJobs(c)
	if err != nil {
		return err
	}
	teams, err := s.teamOptions(c, u, false)
	if err != nil {
		return err
	}
	l := views.JobsList{Page: s.page(c, "Jobs"), Teams: teams, Team: f.Team, State: string(f.State), CanSubmit: u.Admin || len(u.Memberships) > 0,
		Tier: string(f.Tier), Query: f.NameContains, Mine: f.UserID != 0}
	for _, st := range allot.JobStates {
		l.States = append(l.States, views.Option{Value: string(st), Label: string(st)})
	}
	for _, t := range allot.Tiers {
		l.Tiers = append(l.Tiers, views.Option{Value: string(t), Label: "tier " + string(t)})
	}
	l.Filtered = describeFilter(f)
	for i := range jobs {
		l.Rows = append(l.Rows, jobRow(&jobs[i]))
	}
	alerts, err := s.alertsFor(c, u, 10)
	if err != nil {
		return err
	}
	thisMonth := store.MonthStart(s.st.Now())
	for _, a := range latestAlerts(alerts) {
		if a.Month.Equal(thisMonth) && (u.MemberOf(a.Team) || u.Admin) {
			l.Alerts = append(l.Alerts, a.Message)
		}
	}
	return render(c, http.StatusOK, views.JobsListView(l))
}

func (s *Server) jobPage(c echo.Context) error {
	u, j, err := s.visibleJob(c)
	if err != nil {
		return err
	}
	d := views.JobDetail{Page: s.page(c, j.Name), Job: jobRow(&j), Command: allot.JoinCommand(j.Command), WorkDir: j.WorkDir,
		GPUsPerNode: j.GPUsPerNode, Checkpointable: j.Checkpointable, Demoted: j.Demoted, Started: fmtTime(j.StartedAt), Ended: fmtTime(j.EndedAt),
		Priority:  FormatPriority(&j),
		CanCancel: (j.State == allot.JobPending || j.State == allot.JobRunning) && (u.Admin || u.ID == j.UserID || u.LeadOf(j.Team))}
	if j.ExitCode != nil {
		d.ExitCode = strconv.Itoa(*j.ExitCode)
	}
	d.Live = j.State == allot.JobPending || j.State == allot.JobRunning
	x, err := s.jobExplain(c, u, &j)
	if err != nil {
		return err
	}
	explainView(&d, &j, x)
	if u.CanSubmitFor(j.Team) {
		d.ResubmitURL = fmt.Sprintf("/jobs/new?copy=%d", j.ID)
	}
	d.Segment, d.Preemptions, d.EndReason, d.RunAs = j.Segment, j.Preemptions, j.EndReason, string(j.RunAs)
	if d.Log, err = s.st.JobLog(c.Request().Context(), j.ID); err != nil {
		return err
	}
	keys := make([]string, 0, len(j.Env))
	for k := range j.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		d.Env = append(d.Env, views.Option{Value: k, Label: j.Env[k]})
	}
	d.EnvRedacted, d.SecretEnv = j.EnvRedacted, j.SecretEnvKeys
	d.RunAsUser, d.Image, d.Memory, d.CPUs = j.RunAsUser, j.Image, allot.FormatMemory(j.MemoryBytes), allot.FormatCPUs(j.MilliCPUs)
	if j.Backend != allot.BackendNative && j.Backend != "" {
		if d.Engine, err = s.engineView(c, &j); err != nil {
			return err
		}
	}
	if c.Request().Header.Get("HX-Request") == "true" {
		return render(c, http.StatusOK, views.JobLiveFragment(d)) // the page's own refresh
	}
	return render(c, http.StatusOK, views.JobDetailView(d))
}

// copyValues fills the submit form from j's spec. A job demoted for budget
// is copied as asked (the budget check runs again); one whose tier is
// preemptible stays preemptible. Values the viewer may not see (a redacted
// env, every secret variable) are copied as names with empty values, to
// fill in again.
func copyValues(j *allot.Job) views.JobFormValues {
	keys := make([]string, 0, len(j.Env))
	for k := range j.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := make([]string, len(keys))
	for i, k := range keys {
		if j.EnvRedacted {
			env[i] = k + "="
		} else {
			env[i] = k + "=" + j.Env[k]
		}
	}
	secret := make([]string, len(j.SecretEnvKeys))
	for i, k := range j.SecretEnvKeys {
		secret[i] = k + "="
	}
	v := views.JobFormValues{Name: j.Name, Team: j.Team, Tier: string(j.Tier), GPUs: strconv.Itoa(j.GPUs), GPUType: j.GPUType,
		TimeLimit: allot.FormatDuration(j.TimeLimit), Command: allot.JoinCommand(j.Command), Env: strings.Join(env, "\n"), WorkDir: j.WorkDir,
		Checkpointable: j.Checkpointable, Preemptible: j.Preemptible && !j.Demoted,
		SecretEnv: strings.Join(secret, "\n"), Image: j.Image, Memory: allot.FormatMemory(j.MemoryBytes), CPUs: allot.FormatCPUs(j.MilliCPUs)}
	if j.GPUsPerNode > 0 {
		v.GPUsPerNode = strconv.Itoa(j.GPUsPerNode)
	}
	return v
}

// describeFilter says in words which filters the jobs list applies.
func describeFilter(f store.JobFilter) string {
	var parts []string
	if f.Team != "" {
		parts = append(parts, "team "+f.Team)
	}
	if f.State != "" {
		parts = append(parts, string(f.State)+" jobs")
	}
	if f.Tier != "" {
		parts = append(parts, "tier "+string(f.Tier))
	}
	if f.NameContains != "" {
		parts = append(parts, fmt.Sprintf("names containing %q", f.NameContains))
	}
	if f.UserID != 0 {
		parts = append(parts, "only your jobs")
	}
	return strings.Join(parts, ", ")
}

// formSpec parses the submit form. Problems that stop a field from being
// parsed at all come back as field errors.
func formSpec(c echo.Context) (views.JobFormValues, allot.JobSpec, error) {
	v := views.JobFormValues{Name: c.FormValue("name"), Team: c.FormValue("team"), Tier: c.FormValue("tier"), GPUs: c.FormValue("gpus"),
		GPUType: c.FormValue("gpu_type"), GPUsPerNode: c.FormValue("gpus_per_node"), TimeLimit: c.FormValue("time_limit"),
		Command: c.FormValue("command"), Env: c.FormValue("env"), WorkDir: c.FormValue("workdir"),
		Checkpointable: c.FormValue("checkpointable") == "true", Preemptible: c.FormValue("preemptible") == "true",
		SecretEnv: c.FormValue("secret_env"), Image: c.FormValue("image"), Memory: c.FormValue("memory"), CPUs: c.FormValue("cpus")}
	spec := allot.JobSpec{Name: strings.TrimSpace(v.Name), Team: v.Team, GPUType: v.GPUType, WorkDir: strings.TrimSpace(v.WorkDir),
		Checkpointable: v.Checkpointable, Preemptible: v.Preemptible, Image: strings.TrimSpace(v.Image)}
	f := allot.FieldErrors{}
	if t, ok := allot.ParseTier(v.Tier); ok {
		spec.Tier = t
	} else {
		spec.Tier = allot.TierID(v.Tier)
	}
	if strings.TrimSpace(v.GPUs) != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v.GPUs))
		if err != nil {
			f.Add("gpus", "must be a whole number")
		}
		spec.GPUs = n
	}
	if strings.TrimSpace(v.GPUsPerNode) != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v.GPUsPerNode))
		if err != nil {
			f.Add("gpus_per_node", "must be a whole number")
		}
		spec.GPUsPerNode = n
	}
	if strings.TrimSpace(v.TimeLimit) != "" {
		d, err := allot.ParseDuration(v.TimeLimit)
		if err != nil {
			f.Add("time_limit_s", "%v", err)
		}
		spec.TimeLimit = d
	}
	cmd, err := allot.SplitCommand(v.Command)
	if err != nil {
		f.Add("command", "%v", err)
	}
	spec.Command = cmd
	env, err := allot.ParseEnvLines(v.Env)
	if err != nil {
		f.Add("env", "%v", err)
	}
	spec.Env = env
	secret, err := allot.ParseEnvLines(v.SecretEnv)
	if err != nil {
		f.Add("secret_env", "%v", err)
	}
	spec.SecretEnv = secret
	if strings.TrimSpace(v.Memory) != "" {
		b, err := allot.ParseMemory(v.Memory)
		if err != nil {
			f.Add("memory", "%v", err)
		}
		spec.MemoryBytes = b
	}
	if strings.TrimSpace(v.CPUs) != "" {
		m, err := allot.ParseCPUs(v.CPUs)
		if err != nil {
			f.Add("cpus", "%v", err)
		}
		spec.MilliCPUs = m
	}
	return v, spec, f.Err()
}

func (s *Server) jobForm(c echo.Context, u *allot.User, v views.JobFormValues) (views.JobForm, error) {
	ctx := c.Request().Context()
	teams, err := s.teamOptions(c, u, true)
	if err != nil {
		return views.JobForm{}, err
	}
	tiers, err := s.st.ListTiers(ctx)
	if err != nil {
		return views.JobForm{}, err
	}
	types, err := s.st.ListGPUTypes(ctx)
	if err != nil {
		return views.JobForm{}, err
	}
	f := views.JobForm{Page: s.page(c, "Submit a job"), Teams: teams, Values: v, Errors: map[string]string{},
		Quota: views.Quota{Kind: "none", Message: "Fill in GPUs, time limit and command to see the budget check before you submit."}}
	for _, t := range tiers {
		f.Tiers = append(f.Tiers, views.Option{Value: string(t.ID), Label: fmt.Sprintf("%s — %s (max %s)", t.ID, t.Name, allot.FormatDuration(t.MaxRuntime))})
	}
	for _, g := range types {
		f.GPUTypes = append(f.GPUTypes, views.Option{Value: g.Name, Label: fmt.Sprintf("%s (%d GB, %s/h)", g.Name, g.MemoryGB, g.HourlyRate)})
	}
	return f, nil
}

func (s *Server) newJobPage(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	v := views.JobFormValues{Tier: "3", GPUs: "1", TimeLimit: "4h"}
	title := ""
	if id := c.QueryParam("copy"); id != "" {
		// Resubmit as a copy: the form pre-filled from the job's spec; what
		// is submitted is a new job.
		c.SetParamNames("id")
		c.SetParamValues(id)
		j, err := s.loadJob(c, u)
		if err != nil {
			return err
		}
		v = copyValues(&j)
		title = fmt.Sprintf("Copy of job %d: check the values and submit to create a new job.", j.ID)
		if len(j.SecretEnvKeys) > 0 || j.EnvRedacted {
			title += " Values that are not shown (secret variables, and an environment only its submitter, the team's leads and admins see) are copied empty: fill them in again."
		}
	}
	f, err := s.jobForm(c, u, v)
	if err != nil {
		return err
	}
	if title != "" {
		f.Flash = title
	}
	return render(c, http.StatusOK, views.JobFormView(f))
}

// quotaMessage runs the budget check for a (possibly incomplete) form.
func (s *Server) quotaMessage(c echo.Context, u *allot.User, spec allot.JobSpec, parseErr error) (views.Quota, error) {
	if parseErr != nil {
		return views.Quota{Kind: "none", Message: "Fix the highlighted fields to see the budget check."}, nil
	}
	q, err := s.st.QuotaPreview(c.Request().Context(), u, &spec)
	if allot.ErrorCode(err) == allot.EInvalid {
		return views.Quota{Kind: "none", Message: "Budget check waits for a valid job: " + allot.Fields(err).String()}, nil
	}
	if err != nil {
		return views.Quota{}, err
	}
	requested := allot.Hours(spec.RequestedGPUSeconds())
	if q.Warning != "" {
		return views.Quota{Kind: "warn", Message: q.Warning + fmt.Sprintf(" (this job asks for %s GPU-hours).", requested)}, nil
	}
	team, err := s.st.GetTeam(c.Request().Context(), spec.Team)
	if err != nil {
		return views.Quota{}, err
	}
	if team.MonthlyBudgetGPUHours == 0 {
		return views.Quota{Kind: "ok", Message: fmt.Sprintf("Team %s has no budget set; this job asks for %s GPU-hours.", spec.Team, requested)}, nil
	}
	return views.Quota{Kind: "ok", Message: fmt.Sprintf("Within budget: this job asks for %s GPU-hours; %s h of %d h remain this month. It runs at normal priority.",
		requested, allot.Hours(q.RemainingGPUSeconds), team.MonthlyBudgetGPUHours)}, nil
}

// quotaPreview answers the form's HTMX request with the budget check.
func (s *Server) quotaPreview(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	_, spec, perr := formSpec(c)
	q, err := s.quotaMessage(c, u, spec, perr)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.QuotaView(q))
}

func (s *Server) submitJobForm(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	v, spec, perr := formSpec(c)
	j, err := s.submit(c, u, spec, perr)
	if err == nil {
		return redirect(c, fmt.Sprintf("/jobs/%d", j.ID))
	}
	fields := allot.Fields(err)
	if fields == nil {
		return err
	}
	f, ferr := s.jobForm(c, u, v)
	if ferr != nil {
		return ferr
	}
	f.Errors = fields
	f.Quota, _ = s.quotaMessage(c, u, spec, err)
	return render(c, http.StatusUnprocessableEntity, views.JobFormView(f))
}

// cancelJobForm cancels a job from its page once the form says
// confirm=yes; before, it only asks (see confirmPage), after the checks
// the cancel itself makes.
func (s *Server) cancelJobForm(c echo.Context) error {
	if !confirmed(c) {
		u, j, err := s.visibleJob(c)
		if err != nil {
			return err
		}
		if !store.CanManageJob(u, &j) {
			return allot.Errorf(allot.EForbidden, "only the submitter, a lead of team %s or an admin can cancel job %d", j.Team, j.ID)
		}
		probe := j // Transition changes the job it is called on
		if err := probe.Transition(allot.JobCancelled, s.st.Now()); err != nil {
			return err // what the cancel would say: it has ended
		}
		back := fmt.Sprintf("/jobs/%d", j.ID)
		return s.confirmPage(c, views.CancelQuestion(j.ID, j.Name, string(j.State)), back+"/cancel", nil, back)
	}
	j, err := s.cancel(c)
	if err != nil {
		return err
	}
	return redirect(c, fmt.Sprintf("/jobs/%d", j.ID))
}

// jobExplanation is what the job page and GET /api/v1/jobs/{id} explain
// beyond the job's own row.
type jobExplanation struct {
	Now      time.Time
	Policy   allot.Policy
	Segments []store.RunSegment
	// Queue is what the last scheduling cycle decided for a pending job
	// of the native scheduler (nil otherwise).
	Queue    *store.JobQueue
	Cost     billing.Total
	Currency string
	Util     []store.GPUUtilPoint
}

// queueMethod says where a pending job's rank and start estimate come from
// (shown on the page and in the API).
const queueMethod = "The scheduler's own decision at its last cycle, stored by that cycle: the rank is the job's place in the order it serves the whole queue " +
	"(class, then priority, with its starvation guard), and the estimate is the one it computed: a reservation (it holds GPUs for the job from then on), " +
	"a start by preemption (when its victims' grace period ends), or a projection (when enough GPUs come free by the running jobs' time limits, the jobs ahead placed first). " +
	"Each cycle replaces it."

// jobExplain loads the timeline, queue position, start estimate, cost so
// far and utilization of j.
func (s *Server) jobExplain(c echo.Context, u *allot.User, j *allot.Job) (jobExplanation, error) {
	ctx := c.Request().Context()
	x := jobExplanation{Now: s.st.Now().UTC()}
	var err error
	if x.Policy, err = s.st.CurrentPolicy(ctx); err != nil {
		return x, err
	}
	if x.Segments, err = s.st.JobSegments(ctx, j.ID); err != nil {
		return x, err
	}
	if j.State == allot.JobPending && j.Backend == allot.BackendNative {
		q, err := s.st.JobQueueOf(ctx, j.ID)
		if err != nil {
			return x, err
		}
		x.Queue = &q
	}
	card, err := s.st.RateCard(ctx)
	if err != nil {
		return x, err
	}
	x.Currency = card.Currency()
	segs, err := s.st.JobUsageSegments(ctx, j.ID, x.Now)
	if err != nil {
		return x, err
	}
	if len(segs) > 0 {
		pieces, err := billing.Split(card, segs)
		if err != nil {
			return x, err
		}
		lines, err := billing.Lines(pieces)
		if err != nil {
			return x, err
		}
		sum, err := billing.Totals(lines)
		if err != nil {
			return x, err
		}
		x.Cost = sum.Total
	}
	if x.Util, err = s.st.JobGPUUtil(ctx, j.ID); err != nil {
		return x, err
	}
	return x, nil
}

// PriorityFactorJSON is one row of the sprio-like breakdown: the factor in
// 0..1, its weight in the policy and the points it gives (weight × factor).
type PriorityFactorJSON struct {
	Name   string  `json:"name"`
	Factor float64 `json:"factor"`
	Weight int     `json:"weight"`
	Points float64 `json:"points"`
}

// QueueJSON is a pending job's place in the queue and start estimate, as
// the last scheduling cycle decided them (see queueMethod).
type QueueJSON struct {
	// Position is the rank (0 before the job's first cycle); Of counts the
	// jobs of that cycle's queue.
	Position int `json:"position"`
	Of       int `json:"of"`
	// AheadGPUHours is Σ GPUs × time limit of the jobs ahead of it that
	// compete for the same GPUs (TypeRank − 1 of them, of TypeOf).
	AheadGPUHours  string     `json:"ahead_gpu_hours"`
	EstimatedStart *time.Time `json:"estimated_start"` // null: unknown
	Unknown        string     `json:"estimate_unknown_because,omitempty"`
	Method         string     `json:"estimate_method"`
	// Rank is the job's place in the scheduler's order over the whole
	// queue (as Position); TypeRank and TypeOf among the jobs competing
	// for the same GPUs (same GPU type, or either side taking any).
	Rank     int `json:"rank"`
	TypeRank int `json:"type_rank"`
	TypeOf   int `json:"type_of"`
	// RunAs is the class it competes in; Reason is why it waits.
	RunAs  string `json:"run_as"`
	Reason string `json:"reason"`
	// EstKind: reservation, preemption, projection, or "" (unknown).
	EstKind string `json:"est_kind"`
	// Ranked is false while the job has not been through a cycle.
	Ranked bool `json:"ranked"`
	// CycleID and DecidedAt name the cycle (null: none has run yet).
	CycleID   *int64     `json:"cycle_id"`
	DecidedAt *time.Time `json:"decided_at"`
}

// queueJSON is what the API says of q.
func queueJSON(q *store.JobQueue) *QueueJSON {
	out := &QueueJSON{Of: q.Cycle.Pending, AheadGPUHours: gpuHours(0), Method: queueMethod}
	if q.Cycle.ID != 0 {
		id, at := q.Cycle.ID, q.Cycle.DecidedAt.UTC()
		out.CycleID, out.DecidedAt = &id, &at
	}
	d := q.Decision
	if d == nil {
		out.Unknown = notRankedText(q)
		return out
	}
	out.Ranked, out.Position, out.Rank, out.TypeRank, out.TypeOf = true, d.Rank, d.Rank, q.TypeRank, q.TypeOf
	out.AheadGPUHours, out.RunAs, out.Reason, out.EstKind = gpuHours(q.AheadGPUSeconds), string(d.RunAs), d.Reason, d.EstKind
	if d.EstStart.IsZero() {
		out.Unknown = "the scheduler has no estimate: " + d.Reason
	} else {
		t := d.EstStart.UTC()
		out.EstimatedStart = &t
	}
	return out
}

// notRankedText says why a pending job has no stored decision.
func notRankedText(q *store.JobQueue) string {
	if q.Cycle.ID == 0 {
		return "not yet through a scheduling cycle: none has run since the database started; the next one ranks it"
	}
	return fmt.Sprintf("not yet through a scheduling cycle: it came to the queue after the last one (at %s); the next one ranks it",
		q.Cycle.DecidedAt.UTC().Format("15:04:05 UTC"))
}

// estKindText words an estimate's kind for the page.
func estKindText(kind string) string {
	switch kind {
	case store.EstReservation:
		return "reserved GPUs"
	case store.EstPreemption:
		return "by preemption, when its victims' grace period ends"
	case store.EstProjection:
		return "projected from the running jobs' time limits"
	}
	return ""
}

// CostJSON is what a job has cost so far, by the billing rules.
type CostJSON struct {
	Amount   string `json:"amount"`
	Charges  string `json:"charges"`
	Credits  string `json:"preemption_credits"`
	GPUHours string `json:"gpu_hours"`
	Currency string `json:"currency"`
	UpTo     string `json:"up_to"`
}

// RunJSON is one run segment.
type RunJSON struct {
	Segment     int        `json:"segment"`
	Nodes       []string   `json:"nodes"`
	GPUs        int        `json:"gpus"`
	Start       time.Time  `json:"start"`
	End         *time.Time `json:"end"`
	StopReason  string     `json:"stop_reason"`
	PreemptedBy int64      `json:"preempted_by,omitempty"`
}

// GPUUtilJSON is one GPU's mean utilization over [at, at + width_s).
type GPUUtilJSON struct {
	GPU     string    `json:"gpu"`
	At      time.Time `json:"at"`
	WidthS  int64     `json:"width_s"`
	UtilPct float64   `json:"util_pct"`
}

// JobDetailJSON is the body of GET /api/v1/jobs/{id}: the job and what its
// page explains.
type JobDetailJSON struct {
	JobJSON
	PriorityFactors []PriorityFactorJSON `json:"priority_factors"`
	Queue           *QueueJSON           `json:"queue"`
	Cost            CostJSON             `json:"cost_so_far"`
	Runs            []RunJSON            `json:"runs"`
	GPUUtil         []GPUUtilJSON        `json:"gpu_util"`
}

// priorityFactors is the breakdown of j's priority as the last cycle
// computed it. Under the response order the priority is a product: the
// response ratio (its points are the ratio) times the fair-share
// multiplier max(2F, 1/32) (its points are the multiplier); weights are 0.
func priorityFactors(j *allot.Job, p allot.Policy) []PriorityFactorJSON {
	b := j.Breakdown
	if b.Order == allot.QueueOrderResponse {
		return []PriorityFactorJSON{
			{Name: "response-ratio", Factor: b.ResponseRatio, Points: b.ResponseRatio},
			{Name: "fair-share", Factor: b.FairShare, Points: math.Round(allot.FairShareMultiplier(b.FairShare)*1e4) / 1e4},
		}
	}
	pts := func(w int, f float64) float64 { return math.Round(float64(w)*f*10) / 10 }
	return []PriorityFactorJSON{
		{Name: "fair-share", Factor: b.FairShare, Weight: p.WeightFairShare, Points: pts(p.WeightFairShare, b.FairShare)},
		{Name: "size", Factor: b.Size, Weight: p.WeightSize, Points: pts(p.WeightSize, b.Size)},
		{Name: "age", Factor: b.Age, Weight: p.WeightAge, Points: pts(p.WeightAge, b.Age)},
	}
}

func money(micros int64, currency string) string {
	return allot.Money{Micros: micros, Currency: currency}.Decimal()
}

func jobDetailJSON(j *allot.Job, x jobExplanation) JobDetailJSON {
	out := JobDetailJSON{JobJSON: toJSON(j), PriorityFactors: priorityFactors(j, x.Policy), Runs: []RunJSON{}, GPUUtil: []GPUUtilJSON{},
		Cost: CostJSON{Amount: money(x.Cost.Amount, x.Currency), Charges: money(x.Cost.Charges, x.Currency), Credits: money(x.Cost.Credits, x.Currency),
			GPUHours: gpuHours(x.Cost.GPUSeconds), Currency: x.Currency, UpTo: x.Now.Format(time.RFC3339)}}
	if x.Queue != nil {
		out.Queue = queueJSON(x.Queue)
	}
	for _, r := range x.Segments {
		out.Runs = append(out.Runs, RunJSON{Segment: r.Segment, Nodes: r.Nodes, GPUs: r.GPUs, Start: r.Start, End: timePtr(r.End),
			StopReason: r.StopReason, PreemptedBy: r.PreemptedBy})
	}
	for _, p := range x.Util {
		out.GPUUtil = append(out.GPUUtil, GPUUtilJSON{GPU: p.GPU, At: p.At, WidthS: int64(p.Width / time.Second), UtilPct: round1(p.UtilPct)})
	}
	return out
}

// nodeWords names a run segment's node(s) in a sentence.
func nodeWords(nodes []string) string {
	switch len(nodes) {
	case 0:
		return "its node"
	case 1:
		return "node " + nodes[0]
	}
	return "a node of its gang (" + strings.Join(nodes, ", ") + ")"
}

// stopReasonText words a run segment's stop reason for the timeline.
func stopReasonText(reason string, nodes []string) string {
	node := nodeWords(nodes)
	switch reason {
	case "":
		return node + " was lost"
	case store.StopDrain:
		return node + " was drained and its jobs requeued (credited like a preemption)"
	case "agent_restarted":
		return "the agent on " + strings.TrimPrefix(node, "node ") + " restarted without it"
	case "gang_member_failed":
		return "another member of its gang failed"
	case "offer_expired":
		return "the agent on " + strings.TrimPrefix(node, "node ") + " did not take it in time"
	}
	return reason
}

// timeline turns the job and its run segments into the steps of its life:
// a preemption or a lost node shows as its own step (the job itself goes
// straight back to pending, or fails).
func timeline(j *allot.Job, segs []store.RunSegment, now time.Time) []views.TimelineEvent {
	ev := []views.TimelineEvent{{At: fmtTime(j.SubmittedAt), Kind: "submitted", What: "Submitted",
		Detail: fmt.Sprintf("by %s, tier %s, %d GPUs", j.User, j.Tier, j.GPUs)}}
	for i, r := range segs {
		nodes := strings.Join(r.Nodes, ", ")
		ev = append(ev, views.TimelineEvent{At: fmtTime(r.Start), Kind: "started", What: fmt.Sprintf("Run %d started", r.Segment),
			Detail: fmt.Sprintf("%d GPUs on %s", r.GPUs, nodes)})
		last := i == len(segs)-1
		requeued := !last || j.State == allot.JobPending || j.State == allot.JobRunning
		switch {
		case r.End.IsZero():
			ev = append(ev, views.TimelineEvent{At: "now", Kind: "running", What: fmt.Sprintf("Run %d running", r.Segment),
				Detail: "for " + allot.FormatDuration(now.Sub(r.Start).Round(time.Second))})
		case strings.Contains(r.StopReason, "preempted"):
			d := "requeued with its original submit time"
			if r.PreemptedBy > 0 {
				d = fmt.Sprintf("by job %d; ", r.PreemptedBy) + d
			}
			ev = append(ev, views.TimelineEvent{At: fmtTime(r.End), Kind: "preempted", What: fmt.Sprintf("Run %d preempted", r.Segment), Detail: d})
		case strings.Contains(r.StopReason, "node_lost"):
			d := "requeued with its original submit time; being checkpointable, it resumes from its last checkpoint"
			if !requeued {
				d = "not checkpointable, so it cannot resume elsewhere: the job failed"
			}
			ev = append(ev, views.TimelineEvent{At: fmtTime(r.End), Kind: "lost",
				What: fmt.Sprintf("Run %d lost: %s stopped answering", r.Segment, nodeWords(r.Nodes)), Detail: d})
		case requeued:
			ev = append(ev, views.TimelineEvent{At: fmtTime(r.End), Kind: "requeued", What: fmt.Sprintf("Run %d stopped, requeued", r.Segment),
				Detail: stopReasonText(r.StopReason, r.Nodes)})
		default:
			if j.EndedAt.IsZero() {
				ev = append(ev, views.TimelineEvent{At: fmtTime(r.End), Kind: "ended", What: fmt.Sprintf("Run %d released its GPUs", r.Segment), Detail: r.StopReason})
			}
		}
	}
	if !j.EndedAt.IsZero() {
		d := j.EndReason
		if j.ExitCode != nil {
			d = strings.TrimPrefix(strings.Join([]string{d, fmt.Sprintf("exit code %d", *j.ExitCode)}, "; "), "; ")
		}
		ev = append(ev, views.TimelineEvent{At: fmtTime(j.EndedAt), Kind: "ended", What: "Ended: " + string(j.State), Detail: d})
	} else if j.State == allot.JobPending {
		ev = append(ev, views.TimelineEvent{At: "now", Kind: "pending", What: "Waiting in the queue",
			Detail: "for " + allot.FormatDuration(now.Sub(j.SubmittedAt).Round(time.Second))})
	}
	return ev
}

// utilChart draws each GPU's utilization over the job's life.
func utilChart(j *allot.Job, pts []store.GPUUtilPoint, now time.Time) views.LineChart {
	c := views.LineChart{ID: "chart-util", Title: "GPU utilization of this job, percent, per GPU", YUnit: "%", YMax: 100}
	from, to := j.StartedAt, j.EndedAt
	if to.IsZero() {
		to = now
	}
	for _, p := range pts {
		if from.IsZero() || p.At.Before(from) {
			from = p.At
		}
		if e := p.At.Add(p.Width); e.After(to) {
			to = e
		}
	}
	if from.IsZero() || !to.After(from) {
		return c
	}
	c.XMin, c.XMax = float64(from.Unix()), float64(to.Unix())
	classes := []string{"s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"}
	idx := map[string]int{}
	for _, p := range pts {
		i, ok := idx[p.GPU]
		if !ok {
			i = len(c.Series)
			idx[p.GPU] = i
			c.Series = append(c.Series, views.ChartSeries{Name: "GPU " + p.GPU, Class: classes[i%len(classes)]})
		}
		s := &c.Series[i]
		// A gap longer than two buckets breaks the line (between run segments).
		if n := len(s.Points); n > 0 && float64(p.At.Unix())-s.Points[n-1].X > 2*p.Width.Seconds() {
			s.Points = append(s.Points, views.ChartPoint{X: s.Points[n-1].X + 1, Y: views.NoValue})
		}
		s.Points = append(s.Points, views.ChartPoint{X: float64(p.At.Add(p.Width / 2).Unix()), Y: p.UtilPct})
	}
	span := to.Sub(from)
	step := []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute, time.Hour, 3 * time.Hour, 6 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour}
	st := step[len(step)-1]
	for _, d := range step {
		if span/d <= 6 {
			st = d
			break
		}
	}
	layout := "15:04"
	if st >= 24*time.Hour {
		layout = "Jan 2"
	}
	for t := from.Truncate(st).Add(st); t.Before(to); t = t.Add(st) {
		c.XTicks = append(c.XTicks, views.ChartTick{At: float64(t.Unix()), Label: t.UTC().Format(layout)})
	}
	return c
}

// FormatPriority is a job's stored priority as people read it: a whole
// number of points under the multifactor order, three decimals of the
// response order's product.
func FormatPriority(j *allot.Job) string {
	if j.Breakdown.Order == allot.QueueOrderResponse {
		return strconv.FormatFloat(j.Priority, 'f', 3, 64)
	}
	return strconv.FormatFloat(j.Priority, 'f', 0, 64)
}

// multifactorView fills the priority table of a job the multifactor
// order ranked: weights × factors, summed.
func multifactorView(d *views.JobDetail, j *allot.Job, x jobExplanation) {
	total := 0.0
	for _, f := range priorityFactors(j, x.Policy) {
		meaning := map[string]string{
			"fair-share": "2^(−U/S): the team's share of decayed cluster usage U against its normalized share S",
			"size":       "GPUs ÷ cluster GPUs",
			"age":        "wait ÷ " + allot.FormatDuration(x.Policy.MaxAge) + ", capped at 1",
		}[f.Name]
		d.Factors = append(d.Factors, views.PriorityFactor{Name: f.Name, Factor: strconv.FormatFloat(f.Factor, 'f', 4, 64), Weight: strconv.Itoa(f.Weight),
			Points: strconv.FormatFloat(f.Points, 'f', 1, 64), Meaning: meaning})
		total += f.Points
	}
	d.Factors = append(d.Factors, views.PriorityFactor{Name: "total", Points: strconv.FormatFloat(math.Round(total), 'f', 0, 64),
		Meaning: "the sum; jobs of the same class are ordered by it, highest first"})
}

// explainView fills the job page's explanations.
func explainView(d *views.JobDetail, j *allot.Job, x jobExplanation) {
	d.Timeline = timeline(j, x.Segments, x.Now)
	if j.Breakdown.Order == allot.QueueOrderResponse {
		d.ProductOrder = true
		fs := priorityFactors(j, x.Policy)
		d.Factors = []views.PriorityFactor{
			{Name: fs[0].Name, Factor: strconv.FormatFloat(fs[0].Factor, 'f', 4, 64), Points: strconv.FormatFloat(fs[0].Points, 'f', 4, 64),
				Meaning: "(wait + T) ÷ T, T = the time limit (" + allot.FormatDuration(j.TimeLimit) + "): 1 at submission, 2 once the job has waited its own length"},
			{Name: fs[1].Name, Factor: strconv.FormatFloat(fs[1].Factor, 'f', 4, 64), Weight: "×", Points: strconv.FormatFloat(fs[1].Points, 'f', 4, 64),
				Meaning: "the multiplier max(2F, 1/32), F = 2^(−U/S): 1 for a team at its share, up to 2 below it, down to 1/32 far above it"},
			{Name: "total", Points: strconv.FormatFloat(j.Priority, 'f', 3, 64),
				Meaning: "response ratio × fair-share multiplier: jobs of the same class are ordered by it, highest first (the response order; see Docs)"},
		}
	} else {
		multifactorView(d, j, x)
	}
	if jobClass(j) == allot.Tier1 && len(d.Factors) > 0 && x.Policy.Tier1FIFO {
		d.Factors[len(d.Factors)-1].Meaning = "tier 1 is served oldest first, by submission time, whatever this number; it orders only the other classes (see Docs)"
	}
	class := j.Breakdown.Class
	if class == 0 {
		class = j.Tier.Class()
	}
	d.ClassText = fmt.Sprintf("Class %d (tier %s) comes before priority: the queue serves classes in the tiers' order (see Docs), "+
		"and priority orders jobs within a class. Factors as of the last scheduling cycle that looked at this job; before the first cycle they are all 0.", class, j.Tier)
	if x.Queue != nil {
		d.Queue = queueView(x.Queue, x.Now)
	}
	d.Util = utilChart(j, x.Util, x.Now)
	d.UtilNote = "Per GPU, as sampled by the agents: averaged into up to 60 buckets while the raw samples are kept, hourly from the metering rollup after that."
	d.Cost = strings.TrimSpace(money(x.Cost.Amount, x.Currency) + " " + x.Currency)
	d.CostNote = fmt.Sprintf("%s GPU-hours × the GPU type's rate × the multiplier of the tier it ran as, priced per hour like the bill", allot.Hours(x.Cost.GPUSeconds))
	if x.Cost.Credits != 0 {
		d.CostNote += fmt.Sprintf("; includes a preemption credit of %s", money(x.Cost.Credits, x.Currency))
	}
	d.CostNote += "; up to " + fmtTime(x.Now) + "."
}

// queueView words the last cycle's decision for the job page: "#12 in the
// queue (of 340), expected start 14:20 (reserved GPUs), as of the cycle at
// 14:02:10".
func queueView(q *store.JobQueue, now time.Time) *views.QueueInfo {
	v := &views.QueueInfo{Of: q.Cycle.Pending, AheadGPUHours: allot.Hours(q.AheadGPUSeconds)}
	d := q.Decision
	if d == nil {
		v.ETA = notRankedText(q)
		v.ETAMethod = queueMethod
		return v
	}
	v.Position = d.Rank
	switch {
	case d.EstStart.IsZero():
		v.ETA = "unknown: " + d.Reason
	case !d.EstStart.After(q.Cycle.DecidedAt):
		v.ETA = fmt.Sprintf("at the next scheduling cycle (%s)", estKindText(d.EstKind))
	default:
		in := ""
		if d.EstStart.After(now) {
			in = ", in " + allot.FormatDuration(d.EstStart.Sub(now).Round(time.Minute))
		}
		v.ETA = fmt.Sprintf("%s (%s%s)", fmtTime(d.EstStart), estKindText(d.EstKind), in)
	}
	v.ETAMethod = fmt.Sprintf("As of the scheduling cycle at %s (cycle %d); %d of the jobs ahead compete for the same GPUs. %s",
		q.Cycle.DecidedAt.UTC().Format("15:04:05 UTC"), q.Cycle.ID, q.TypeRank-1, queueMethod)
	return v
}
