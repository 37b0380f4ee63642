package web

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// BudgetJSON is the body of GET /api/v1/teams/{team}/budget.
type BudgetJSON struct {
	Team           string            `json:"team"`
	Month          string            `json:"month"`
	BudgetGPUHours int64             `json:"budget_gpu_hours"`
	UsedGPUHours   string            `json:"used_gpu_hours"`
	UsedPct        int64             `json:"used_pct"`
	ByJobType      map[string]string `json:"by_job_type_gpu_hours"`
	ByUser         []UserHoursJSON   `json:"by_user"`
	Daily          []DayHoursJSON    `json:"daily"`
	Forecast       ForecastJSON      `json:"forecast"`
	Cost           string            `json:"cost"`
	Currency       string            `json:"currency"`
	Alerts         []AlertJSON       `json:"alerts"`
	// LastMonth is the month before, complete (early in a month it tells
	// more than the month begun); null before any usage then.
	LastMonth *MonthUsedJSON `json:"last_month"`
	// ByKind is this month's usage by job type: the tier the jobs ran as
	// and the GPU type they held.
	ByKind []KindHoursJSON `json:"by_tier_and_gpu_type"`
	kinds  []store.KindUsage
	alerts []store.BudgetAlert // the team's recent alerts, for the page
}

// teamAlertHistory is how many of a team's alerts the team page lists.
const teamAlertHistory = 24

// KindHoursJSON is one job type's GPU-hours.
type KindHoursJSON struct {
	Tier     string `json:"tier"`
	GPUType  string `json:"gpu_type"`
	GPUHours string `json:"gpu_hours"`
}

// UserHoursJSON is one user's GPU-hours.
type UserHoursJSON struct {
	User     string `json:"user"`
	GPUHours string `json:"gpu_hours"`
}

// DayHoursJSON is one day's and the month's cumulative GPU-hours.
type DayHoursJSON struct {
	Day        string `json:"day"`
	GPUHours   string `json:"gpu_hours"`
	Cumulative string `json:"cumulative_gpu_hours"`
}

// ForecastJSON projects the month at the recent rate.
type ForecastJSON struct {
	RateGPUHoursPerDay  string  `json:"rate_gpu_hours_per_day"`
	ProjectedMonthEnd   string  `json:"projected_month_end_gpu_hours"`
	ProjectedPct        int64   `json:"projected_pct"`
	ReachesBudgetOn     *string `json:"reaches_budget_on"` // date, when within the month
	Summary             string  `json:"summary"`
	BasedOnTrailingDays int     `json:"based_on_trailing_days"`
}

// forecast projects usage at the rate of the last 7 days (or the month so
// far when younger).
func forecast(u *store.TeamUsage) ForecastJSON {
	monthEnd := u.Month.AddDate(0, 1, 0)
	n := min(7, len(u.Daily))
	var recent int64
	for _, d := range u.Daily[len(u.Daily)-n:] {
		recent += d.GPUSeconds
	}
	// Days covered by the trailing window: whole days plus today's part.
	windowStart := u.UpTo.AddDate(0, 0, -n+1).Truncate(24 * time.Hour)
	if windowStart.Before(u.Month) {
		windowStart = u.Month
	}
	days := u.UpTo.Sub(windowStart).Hours() / 24
	f := ForecastJSON{BasedOnTrailingDays: n}
	if days <= 0 {
		days = 1.0 / 24
	}
	rate := float64(recent) / days // GPU-seconds per day (display only, not money)
	f.RateGPUHoursPerDay = fmt.Sprintf("%.1f", rate/3600)
	left := monthEnd.Sub(u.UpTo).Hours() / 24
	projected := float64(u.UsedGPUSeconds) + rate*left
	f.ProjectedMonthEnd = fmt.Sprintf("%.1f", projected/3600)
	budget := float64(u.BudgetGPUHours * 3600)
	if budget <= 0 {
		f.Summary = "No budget is set for this team."
		return f
	}
	f.ProjectedPct = int64(projected * 100 / budget)
	switch {
	case float64(u.UsedGPUSeconds) >= budget:
		var cum int64
		for _, d := range u.Daily {
			cum += d.GPUSeconds
			if float64(cum) >= budget {
				day := d.Day.Format("2006-01-02")
				f.ReachesBudgetOn = &day
				f.Summary = fmt.Sprintf("Over budget since %s; at this rate: %d %% at month end.", d.Day.Format("Jan 2"), f.ProjectedPct)
				return f
			}
		}
		f.Summary = fmt.Sprintf("Over budget; at this rate: %d %% at month end.", f.ProjectedPct)
	case rate > 0 && u.UpTo.Add(time.Duration((budget-float64(u.UsedGPUSeconds))/rate*24*float64(time.Hour))).Before(monthEnd):
		at := u.UpTo.Add(time.Duration((budget - float64(u.UsedGPUSeconds)) / rate * 24 * float64(time.Hour)))
		day := at.Format("2006-01-02")
		f.ReachesBudgetOn = &day
		f.Summary = fmt.Sprintf("At this rate: 100 %% on %s.", at.Format("Jan 2"))
	default:
		f.Summary = fmt.Sprintf("At this rate: %d %% at month end.", f.ProjectedPct)
	}
	return f
}

// MonthUsedJSON is a team's usage in one whole month.
type MonthUsedJSON struct {
	Month          string `json:"month"`
	UsedGPUHours   string `json:"used_gpu_hours"`
	UsedPct        int64  `json:"used_pct"` // of the team's budget today
	BudgetGPUHours int64  `json:"budget_gpu_hours"`
}

// teamBudget loads the budget view of :team for the caller.
func (s *Server) teamBudget(c echo.Context) (BudgetJSON, *store.TeamUsage, error) {
	team := c.Param("team") // RuleTeamMember has checked the caller
	// One query for the month's detail, its kinds and last month's total.
	page, err := s.st.TeamPageUsage(c.Request().Context(), team, s.st.Now())
	usage := page.TeamUsage
	if allot.ErrorCode(err) == allot.ENotFound {
		return BudgetJSON{}, nil, allot.Errorf(allot.ENotFound, "no team %q", team)
	}
	if err != nil {
		return BudgetJSON{}, nil, err
	}
	out := BudgetJSON{Team: team, Month: usage.Month.Format("2006-01"), BudgetGPUHours: usage.BudgetGPUHours,
		UsedGPUHours: allot.Hours(usage.UsedGPUSeconds), ByJobType: map[string]string{}, ByUser: []UserHoursJSON{}, Daily: []DayHoursJSON{},
		Forecast: forecast(&usage), Currency: usage.Currency, Alerts: []AlertJSON{}}
	if usage.BudgetGPUHours > 0 {
		out.UsedPct = usage.UsedGPUSeconds * 100 / (usage.BudgetGPUHours * 3600)
	}
	out.Cost = allot.Money{Micros: usage.CostMicros, Currency: usage.Currency}.Decimal()
	for k, v := range usage.ByJobType {
		out.ByJobType[k] = allot.Hours(v)
	}
	for _, x := range usage.ByUser {
		out.ByUser = append(out.ByUser, UserHoursJSON{User: x.User, GPUHours: allot.Hours(x.GPUSeconds)})
	}
	var cum int64
	for _, d := range usage.Daily {
		cum += d.GPUSeconds
		out.Daily = append(out.Daily, DayHoursJSON{Day: d.Day.Format("2006-01-02"), GPUHours: allot.Hours(d.GPUSeconds), Cumulative: allot.Hours(cum)})
	}
	kinds := page.Kinds
	out.ByKind, out.kinds = []KindHoursJSON{}, kinds
	for _, k := range kinds {
		out.ByKind = append(out.ByKind, KindHoursJSON{Tier: string(k.Tier), GPUType: k.GPUType, GPUHours: allot.Hours(k.GPUSeconds)})
	}
	alerts, err := s.st.BudgetAlerts(c.Request().Context(), []string{team}, teamAlertHistory)
	if err != nil {
		return out, nil, err
	}
	out.alerts = alerts
	prev := usage.Month.AddDate(0, -1, 0)
	lastUsed := page.LastMonthGPUSeconds
	if lastUsed > 0 {
		out.LastMonth = &MonthUsedJSON{Month: prev.Format("2006-01"), UsedGPUHours: allot.Hours(lastUsed), BudgetGPUHours: usage.BudgetGPUHours}
		if usage.BudgetGPUHours > 0 {
			out.LastMonth.UsedPct = lastUsed * 100 / (usage.BudgetGPUHours * 3600)
		}
	}
	for _, a := range alerts[:min(len(alerts), 20)] {
		if a.Month.Equal(usage.Month) {
			out.Alerts = append(out.Alerts, AlertJSON{Team: a.Team, Month: a.Month.Format("2006-01"), ThresholdPct: a.ThresholdPct,
				FiredAt: a.FiredAt.UTC(), UsedGPUHours: allot.Hours(a.UsedGPUSeconds), BudgetGPUHours: a.BudgetGPUHours, Message: a.Message})
		}
	}
	return out, &usage, nil
}

func (s *Server) apiTeamBudget(c echo.Context) error {
	out, _, err := s.teamBudget(c)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, out)
}

// burnDown is the team page's chart of cumulative usage this month
// against the budget, with the forecast f to the month's end, in days
// since the month's start and GPU-hours.
func burnDown(team string, u *store.TeamUsage, f ForecastJSON) views.BurnDownChart {
	const day = 24 * time.Hour
	days := u.Month.AddDate(0, 1, 0).Sub(u.Month).Hours() / 24
	now := math.Min(u.UpTo.Sub(u.Month).Hours()/24, days)
	budget := float64(u.BudgetGPUHours)
	projected, _ := strconv.ParseFloat(f.ProjectedMonthEnd, 64)
	rate, _ := strconv.ParseFloat(f.RateGPUHoursPerDay, 64)
	c := views.BurnDownChart{Title: fmt.Sprintf("Team %s: cumulative GPU-hours in %s against the budget", team, u.Month.Format("January 2006")),
		Month: u.Month, Days: days, Now: now, Budget: budget, Projected: projected, Cross: -1,
		ForecastLabel: fmt.Sprintf("at the last %d days' rate (%s GPU-h a day)", f.BasedOnTrailingDays, f.RateGPUHoursPerDay),
		Used:          []views.ChartPoint{{X: 0, Y: 0}}}
	if f.BasedOnTrailingDays == 1 {
		c.ForecastLabel = fmt.Sprintf("at today's rate (%s GPU-h a day)", f.RateGPUHoursPerDay)
	}
	var cum float64
	for i, d := range u.Daily {
		before := cum
		cum += float64(d.GPUSeconds) / 3600
		start, end := float64(i), float64(i+1)
		if i == len(u.Daily)-1 || end > now {
			end = now
		}
		c.Used = append(c.Used, views.ChartPoint{X: end, Y: cum})
		if budget > 0 && c.Cross < 0 && before < budget && cum >= budget && cum > before {
			c.Cross = start + (end-start)*(budget-before)/(cum-before)
		}
		c.Rows = append(c.Rows, views.BurnDownRow{Day: d.Day.Format("Mon Jan 2"), GPUHours: allot.Hours(d.GPUSeconds), Cumulative: fmt.Sprintf("%.1f", cum)})
	}
	if budget > 0 && c.Cross < 0 && cum < budget && rate > 0 {
		if at := now + (budget-cum)/rate; at <= days {
			c.Cross = at
		}
	}
	c.Desc = fmt.Sprintf("%.1f GPU-hours used by %s", cum, u.UpTo.UTC().Format("Jan 2, 15:04 UTC"))
	if budget > 0 {
		c.Desc += fmt.Sprintf(" of a %d GPU-hour budget (%d %%)", u.BudgetGPUHours, int64(cum*100/budget))
	}
	c.Desc += fmt.Sprintf(". Forecast %s: %.0f GPU-hours on %s", c.ForecastLabel, projected, u.Month.AddDate(0, 1, 0).Add(-day).Format("Jan 2"))
	switch {
	case budget <= 0:
		c.Desc += "; no budget is set."
	case c.Cross >= 0 && c.Cross <= now:
		c.Desc += fmt.Sprintf("; the budget was reached on %s.", u.Month.Add(time.Duration(c.Cross*float64(day))).Format("Jan 2"))
	case c.Cross >= 0:
		c.Desc += fmt.Sprintf("; it reaches the budget on %s.", u.Month.Add(time.Duration(c.Cross*float64(day))).Format("Jan 2"))
	default:
		c.Desc += fmt.Sprintf(" (%d %% of the budget).", f.ProjectedPct)
	}
	return c
}

// teamPage is the team lead's budget dashboard.
func (s *Server) teamPage(c echo.Context) error {
	b, usage, err := s.teamBudget(c)
	if err != nil {
		return err
	}
	p := views.TeamBudget{Page: s.page(c, "Team "+b.Team), Team: b.Team, Month: b.Month, Budget: b.BudgetGPUHours, Used: b.UsedGPUHours,
		UsedPct: b.UsedPct, Cost: strings.TrimSpace(b.Cost + " " + b.Currency), Forecast: b.Forecast.Summary, Chart: burnDown(b.Team, usage, b.Forecast)}
	if b.Currency == "" {
		p.Cost = "not billed yet (the hourly rollup has not run)"
	}
	for _, k := range []string{"production", "experiments", "preemptible"} {
		p.ByJobType = append(p.ByJobType, views.Option{Value: k, Label: b.ByJobType[k]})
	}
	for _, u := range b.ByUser {
		p.ByUser = append(p.ByUser, views.Option{Value: u.User, Label: u.GPUHours})
	}
	// One banner: this month's highest threshold (the history lists all).
	var this []store.BudgetAlert
	month, _ := time.Parse("2006-01", b.Month)
	for _, a := range b.alerts {
		if a.Month.Equal(month) {
			this = append(this, a)
		}
	}
	for _, a := range latestAlerts(this) {
		p.Alerts = append(p.Alerts, a.Message)
	}
	if l := b.LastMonth; l != nil {
		m, _ := time.Parse("2006-01", l.Month)
		p.LastMonth = fmt.Sprintf("%s: %s GPU-h used", m.Format("January 2006"), l.UsedGPUHours)
		if l.BudgetGPUHours > 0 {
			p.LastMonth += fmt.Sprintf(", %d %% of today's budget of %d GPU-h", l.UsedPct, l.BudgetGPUHours)
		}
	}
	if err := s.teamExtras(c, &p, b, usage); err != nil {
		return err
	}
	return render(c, http.StatusOK, views.TeamBudgetView(p))
}

// FairShareJSON is the body of GET /api/v1/fairshare: every team's
// standing, like Slurm's sshare, computed by the scheduler core from the
// inputs a scheduling cycle reads (team weights, decayed usage).
type FairShareJSON struct {
	HalfLifeS int64              `json:"half_life_s"`
	Teams     []FairShareRowJSON `json:"teams"`
	Method    string             `json:"method"`
	// CycleID and DecidedAt name the scheduling cycle the figures are
	// from (null: no cycle has recorded them yet, and the computed
	// columns are 0).
	CycleID   *int64     `json:"cycle_id"`
	DecidedAt *time.Time `json:"decided_at"`
}

// FairShareRowJSON is one team's line.
type FairShareRowJSON struct {
	Team           string     `json:"team"`
	RawShares      int        `json:"raw_shares"`
	NormShares     float64    `json:"norm_shares"`
	RawUsageGPUSec float64    `json:"raw_usage_gpu_seconds"`
	EffectiveUsage float64    `json:"effective_usage"`
	FairShare      float64    `json:"fair_share"`
	UsageAsOf      *time.Time `json:"usage_as_of"`
	// Computed is false for a team the last cycle did not see (none ran
	// yet, or the team is newer): its computed columns are 0.
	Computed bool `json:"computed"`
}

const fairShareMethod = "Raw shares = the team's fair-share weight; norm shares S = weight ÷ Σ weights; raw usage = the team's GPU-seconds, " +
	"decayed with the policy's half-life (updated by every scheduling cycle); effective usage U = raw usage ÷ Σ raw usage; fair-share factor F = 2^(−U/S). " +
	"These are the scheduler's own numbers, as the last scheduling cycle computed and stored them."

// fairShareNoCycle is the method's note before any cycle stored shares.
const fairShareNoCycle = " No scheduling cycle has recorded them yet (none ran since the database started): raw shares and raw usage are today's, " +
	"the computed columns show 0 until the next cycle."

// fairShare reads every team's standing as the last cycle stored it.
func (s *Server) fairShare(c echo.Context) (FairShareJSON, error) {
	ctx := c.Request().Context()
	in, err := s.st.TeamShareInputs(ctx)
	if err != nil {
		return FairShareJSON{}, err
	}
	p, err := s.st.CurrentPolicy(ctx)
	if err != nil {
		return FairShareJSON{}, err
	}
	last, err := s.st.LastShares(ctx)
	if err != nil {
		return FairShareJSON{}, err
	}
	out := FairShareJSON{HalfLifeS: int64(p.HalfLife / time.Second), Method: fairShareMethod, Teams: []FairShareRowJSON{}}
	if last.CycleID == 0 {
		out.Method += fairShareNoCycle
	} else {
		id, at := last.CycleID, last.DecidedAt.UTC()
		out.CycleID, out.DecidedAt = &id, &at
		out.Method += fmt.Sprintf(" As of the scheduling cycle at %s (cycle %d).", at.Format("2006-01-02 15:04:05 UTC"), id)
	}
	for _, t := range in {
		row := FairShareRowJSON{Team: t.Team, RawShares: t.Weight, RawUsageGPUSec: math.Round(t.UsageGPUSec), UsageAsOf: timePtr(t.UsageAsOf)}
		if sh, ok := last.Teams[t.Team]; ok {
			row.Computed, row.NormShares, row.RawUsageGPUSec, row.EffectiveUsage, row.FairShare = true, sh.NormShares, math.Round(sh.RawUsage), sh.EffectiveUsage, sh.FairShare
		}
		out.Teams = append(out.Teams, row)
	}
	return out, nil
}

func (s *Server) apiFairShare(c echo.Context) error {
	f, err := s.fairShare(c)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, f)
}

// teamExtras adds the team page's usage by job type and user, alert
// history, right-sizing findings and fair-share standing.
func (s *Server) teamExtras(c echo.Context, p *views.TeamBudget, b BudgetJSON, usage *store.TeamUsage) error {
	ctx := c.Request().Context()
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	total := usage.UsedGPUSeconds
	p.KindChart = views.BarChart{ID: "chart-kind", Title: "GPU-hours this month by tier as run and GPU type"}
	for _, k := range b.kinds {
		pct := "—"
		if total > 0 {
			pct = strconv.FormatFloat(float64(k.GPUSeconds)*100/float64(total), 'f', 1, 64) + " %"
		}
		p.ByKind = append(p.ByKind, views.KindRow{Tier: string(k.Tier), GPUType: k.GPUType, GPUHours: allot.Hours(k.GPUSeconds), Pct: pct})
		p.KindChart.Bars = append(p.KindChart.Bars, views.Bar{Label: "tier " + string(k.Tier) + " · " + k.GPUType, Text: allot.Hours(k.GPUSeconds) + " GPU-h",
			Parts: []views.BarPart{{Value: float64(k.GPUSeconds), Class: "b-tier-" + string(k.Tier)}}})
	}
	p.UserChart = views.BarChart{ID: "chart-users", Title: "GPU-hours this month by user"}
	for _, x := range usage.ByUser {
		p.UserChart.Bars = append(p.UserChart.Bars, views.Bar{Label: x.User, Text: allot.Hours(x.GPUSeconds) + " GPU-h",
			Parts: []views.BarPart{{Value: float64(x.GPUSeconds), Class: "b-alloc"}}})
	}

	alerts := b.alerts
	p.AlertsNote = "Budget alerts fire once a month at the warning and demotion thresholds, to the team's webhook and here."
	if len(alerts) == 0 {
		p.AlertsNote = "No budget alert has fired for this team. " + p.AlertsNote
	}
	for _, a := range alerts {
		p.AlertHistory = append(p.AlertHistory, fmt.Sprintf("%s · %d %%: %s", fmtTime(a.FiredAt), a.ThresholdPct, a.Message))
	}

	scope, who, err := rightSizingScope(u, b.Team)
	if err != nil {
		return err
	}
	rep, err := s.st.RightSizing(ctx, usage.Month, usage.UpTo, scope)
	if err != nil {
		return err
	}
	p.FindingsScope = who + ", " + usage.Month.Format("January 2006")
	p.FindingsURL = "/rightsizing?period=month&team=" + b.Team
	// The largest savings first; the full report has the rest.
	const maxFindings = 20
	if n := len(rep.Jobs); n > maxFindings {
		p.FindingsScope += fmt.Sprintf(": the %d jobs with the largest savings of %d flagged", maxFindings, n)
		rep.Jobs = rep.Jobs[:maxFindings]
	}
	for _, j := range rep.Jobs {
		for _, f := range j.Flags {
			p.Findings = append(p.Findings, views.RightSizingJob{JobID: j.JobID, JobURL: fmt.Sprintf("/jobs/%d", j.JobID), Name: j.Name, Team: j.Team,
				User: j.User, GPUType: j.GPUType, Tier: string(j.Tier), GPUs: j.GPUs, GPUHours: gpuHours(j.GPUSeconds), MeanUtil: pct(j.MeanUtilPct),
				Cost: j.Cost.Decimal(), Rule: f.Rule, Suggestion: f.Suggestion, Savings: f.Savings.Decimal()})
		}
	}

	fs, err := s.fairShare(c)
	if err != nil {
		return err
	}
	for _, t := range fs.Teams {
		p.FairShare = append(p.FairShare, views.FairShareRow{Team: t.Team, RawShares: t.RawShares, NormShares: strconv.FormatFloat(t.NormShares, 'f', 4, 64),
			RawUsage: strconv.FormatFloat(t.RawUsageGPUSec/3600, 'f', 1, 64), EffectiveUsage: strconv.FormatFloat(t.EffectiveUsage, 'f', 4, 64),
			FairShare: strconv.FormatFloat(t.FairShare, 'f', 4, 64), This: t.Team == b.Team})
	}
	p.FairShareNote = fs.Method + fmt.Sprintf(" Half-life now: %s.", allot.FormatDuration(time.Duration(fs.HalfLifeS)*time.Second))
	return nil
}
