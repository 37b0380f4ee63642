package web

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

func jobRow(j *allot.Job) views.JobRow {
	return views.JobRow{ID: j.ID, Name: j.Name, Team: j.Team, User: j.User, Tier: string(j.Tier), GPUs: j.GPUs, GPUType: j.GPUType,
		TimeLimit: allot.FormatDuration(j.TimeLimit), State: string(j.State), Submitted: fmtTime(j.SubmittedAt),
		PendingReason: j.PendingReason, Preemptible: j.Preemptible, QuotaWarning: j.QuotaWarning}
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
	l := views.JobsList{Page: s.page(c, "Jobs"), Teams: teams, Team: f.Team, State: string(f.State), CanSubmit: u.Admin || len(u.Memberships) > 0}
	for _, st := range allot.JobStates {
		l.States = append(l.States, views.Option{Value: string(st), Label: string(st)})
	}
	for i := range jobs {
		l.Rows = append(l.Rows, jobRow(&jobs[i]))
	}
	alerts, err := s.alertsFor(c, u, 10)
	if err != nil {
		return err
	}
	thisMonth := store.MonthStart(s.st.Now())
	for _, a := range alerts {
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
		Priority:  strconv.FormatFloat(j.Priority, 'f', 0, 64),
		Breakdown: fmt.Sprintf("class %d · fair share %.3f · size %.3f · age %.3f", j.Breakdown.Class, j.Breakdown.FairShare, j.Breakdown.Size, j.Breakdown.Age),
		CanCancel: (j.State == allot.JobPending || j.State == allot.JobRunning) && (u.Admin || u.ID == j.UserID || u.LeadOf(j.Team))}
	if j.ExitCode != nil {
		d.ExitCode = strconv.Itoa(*j.ExitCode)
	}
	d.Live = j.State == allot.JobPending || j.State == allot.JobRunning
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
	return render(c, http.StatusOK, views.JobDetailView(d))
}

// formSpec parses the submit form. Problems that stop a field from being
// parsed at all come back as field errors.
func formSpec(c echo.Context) (views.JobFormValues, allot.JobSpec, error) {
	v := views.JobFormValues{Name: c.FormValue("name"), Team: c.FormValue("team"), Tier: c.FormValue("tier"), GPUs: c.FormValue("gpus"),
		GPUType: c.FormValue("gpu_type"), GPUsPerNode: c.FormValue("gpus_per_node"), TimeLimit: c.FormValue("time_limit"),
		Command: c.FormValue("command"), Env: c.FormValue("env"), WorkDir: c.FormValue("workdir"),
		Checkpointable: c.FormValue("checkpointable") == "true", Preemptible: c.FormValue("preemptible") == "true"}
	spec := allot.JobSpec{Name: strings.TrimSpace(v.Name), Team: v.Team, GPUType: v.GPUType, WorkDir: strings.TrimSpace(v.WorkDir),
		Checkpointable: v.Checkpointable, Preemptible: v.Preemptible}
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
	f, err := s.jobForm(c, u, views.JobFormValues{Tier: "3", GPUs: "1", TimeLimit: "4h"})
	if err != nil {
		return err
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

func (s *Server) cancelJobForm(c echo.Context) error {
	j, err := s.cancel(c)
	if err != nil {
		return err
	}
	return redirect(c, fmt.Sprintf("/jobs/%d", j.ID))
}
