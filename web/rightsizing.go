package web

import (
	"encoding/csv"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// maxRightSizingPeriod bounds a report's period.
const maxRightSizingPeriod = 93 * 24 * time.Hour

// rightSizingPeriod reads the report's period [from, to):
//   - ?from= and ?to= as RFC 3339 dates (2026-11-01, midnight UTC) or
//     date-times; to is exclusive; a missing to is now, a missing from is 7
//     days before to;
//   - else ?period=week (the default: the last 7 days) or ?period=month
//     (this month so far).
//
// from must be before to, and the period at most 93 days.
func (s *Server) rightSizingPeriod(c echo.Context) (time.Time, time.Time, string, error) {
	now := s.st.Now().UTC()
	f := allot.FieldErrors{}
	parse := func(field string) time.Time {
		v := strings.TrimSpace(c.QueryParam(field))
		if v == "" {
			return time.Time{}
		}
		for _, layout := range []string{time.RFC3339Nano, time.DateOnly} {
			if t, err := time.Parse(layout, v); err == nil {
				return t.UTC()
			}
		}
		f.Add(field, "must be an RFC 3339 date (2026-11-01) or date-time (2026-11-01T00:00:00Z), not %q", v)
		return time.Time{}
	}
	from, to := parse("from"), parse("to")
	period := ""
	if from.IsZero() && to.IsZero() && len(f) == 0 {
		switch period = c.QueryParam("period"); period {
		case "", "week":
			period = "week"
			from, to = now.Add(-7*24*time.Hour), now
		case "month":
			to = now
			from = time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
		default:
			f.Add("period", "must be week or month, not %q", period)
		}
	}
	if err := f.Err(); err != nil {
		return from, to, period, err
	}
	if to.IsZero() {
		to = now
	}
	if from.IsZero() {
		from = to.Add(-7 * 24 * time.Hour)
	}
	switch {
	case !from.Before(to):
		f.Add("to", "must be after from (%s)", from.Format(time.RFC3339))
	case to.Sub(from) > maxRightSizingPeriod:
		f.Add("to", "the period may be at most 93 days; it is %d days", int(math.Ceil(to.Sub(from).Hours()/24)))
	}
	return from, to, period, f.Err()
}

// rightSizingScope decides whose usage u may see. Finance and admins see
// every team, leads the teams they lead (as for chargeback). Everyone else
// in a team sees their own jobs only: a report on your own waste is yours
// to read. A ?team= the caller may not see, or a caller in no team, gets
// EForbidden.
func rightSizingScope(u *allot.User, team string) (store.RightSizingScope, string, error) {
	teams, err := chargebackScope(u, team)
	if err == nil {
		switch {
		case teams == nil:
			return store.RightSizingScope{}, "All teams", nil
		case team != "":
			return store.RightSizingScope{Teams: teams}, "Team " + team, nil
		}
		return store.RightSizingScope{Teams: teams}, "Teams you lead: " + strings.Join(teams, ", "), nil
	}
	if allot.ErrorCode(err) != allot.EForbidden {
		return store.RightSizingScope{}, "", err
	}
	if team != "" && !u.MemberOf(team) {
		return store.RightSizingScope{}, "", allot.Errorf(allot.EForbidden, "you are not in team %q", team)
	}
	mine := u.Teams()
	if team != "" {
		mine = []string{team}
	}
	if len(mine) == 0 {
		return store.RightSizingScope{}, "", allot.Errorf(allot.EForbidden, "right-sizing reports are for team members, leads, finance and admins")
	}
	return store.RightSizingScope{Teams: mine, UserID: u.ID}, "Your jobs", nil
}

// RightSizingGroupJSON is a team's or a user's usage; amounts are decimal strings.
type RightSizingGroupJSON struct {
	Team        string   `json:"team,omitempty"`
	User        string   `json:"user,omitempty"`
	GPUHours    string   `json:"gpu_hours"`
	MeanUtilPct *float64 `json:"mean_gpu_util_pct"`
	MeanMemPct  *float64 `json:"mean_memory_util_pct"`
	Cost        string   `json:"cost"`
	Jobs        int      `json:"jobs"`
	Flagged     int      `json:"flagged_jobs"`
	Savings     string   `json:"could_have_saved"`
}

// RightSizingFlagJSON is one reason a job is flagged.
type RightSizingFlagJSON struct {
	Rule       string `json:"rule"`
	Suggestion string `json:"suggestion"`
	Savings    string `json:"could_have_saved"`
}

// RightSizingJobJSON is a flagged job.
type RightSizingJobJSON struct {
	JobID       int64                 `json:"job_id"`
	Name        string                `json:"job_name"`
	Team        string                `json:"team"`
	User        string                `json:"user"`
	Tier        string                `json:"tier"`
	GPUType     string                `json:"gpu_type"`
	GPUs        int                   `json:"gpus"`
	GPUHours    string                `json:"gpu_hours"`
	MeanUtilPct *float64              `json:"mean_gpu_util_pct"`
	PeakMemMiB  *int64                `json:"peak_memory_mib"`
	Cost        string                `json:"cost"`
	Savings     string                `json:"could_have_saved"`
	Flags       []RightSizingFlagJSON `json:"flags"`
}

// RightSizingThresholdsJSON states the rules' thresholds.
type RightSizingThresholdsJSON struct {
	LowUtilPct         int `json:"low_util_pct"`
	LowUtilMinRuntimeS int `json:"low_util_min_runtime_s"`
	IdleGPUPct         int `json:"idle_gpu_pct"`
}

// RightSizingJSON is the body of GET /api/v1/rightsizing.
type RightSizingJSON struct {
	From       string                    `json:"from"`
	To         string                    `json:"to"`
	Scope      string                    `json:"scope"`
	Currency   string                    `json:"currency"`
	Thresholds RightSizingThresholdsJSON `json:"thresholds"`
	Total      RightSizingGroupJSON      `json:"total"`
	Teams      []RightSizingGroupJSON    `json:"teams"`
	Users      []RightSizingGroupJSON    `json:"users"`
	Jobs       []RightSizingJobJSON      `json:"flagged_jobs"`
}

func round2(v *float64) *float64 {
	if v == nil {
		return nil
	}
	r := math.Round(*v*100) / 100
	return &r
}

func groupJSON(g store.UsageSummary) RightSizingGroupJSON {
	return RightSizingGroupJSON{Team: g.Team, User: g.User, GPUHours: gpuHours(g.GPUSeconds), MeanUtilPct: round2(g.MeanUtilPct),
		MeanMemPct: round2(g.MeanMemPct), Cost: g.Cost.Decimal(), Jobs: g.Jobs, Flagged: g.Flagged, Savings: g.Savings.Decimal()}
}

func rightSizingJobJSON(j store.FlaggedJob) RightSizingJobJSON {
	out := RightSizingJobJSON{JobID: j.JobID, Name: j.Name, Team: j.Team, User: j.User, Tier: string(j.Tier), GPUType: j.GPUType, GPUs: j.GPUs,
		GPUHours: gpuHours(j.GPUSeconds), MeanUtilPct: round2(j.MeanUtilPct), PeakMemMiB: j.PeakMemMiB, Cost: j.Cost.Decimal(),
		Savings: j.Savings.Decimal(), Flags: []RightSizingFlagJSON{}}
	for _, f := range j.Flags {
		out.Flags = append(out.Flags, RightSizingFlagJSON{Rule: f.Rule, Suggestion: f.Suggestion, Savings: f.Savings.Decimal()})
	}
	return out
}

// rightSizingReport checks access and the period and builds the report.
func (s *Server) rightSizingReport(c echo.Context) (*store.RightSizingReport, string, string, error) {
	u, err := currentUser(c)
	if err != nil {
		return nil, "", "", err
	}
	scope, who, err := rightSizingScope(u, c.QueryParam("team"))
	if err != nil {
		return nil, "", "", err
	}
	from, to, period, err := s.rightSizingPeriod(c)
	if err != nil {
		return nil, "", "", err
	}
	rep, err := s.st.RightSizing(c.Request().Context(), from, to, scope)
	return rep, who, period, err
}

func rightSizingJSON(rep *store.RightSizingReport, who string) RightSizingJSON {
	out := RightSizingJSON{From: rep.From.Format(time.RFC3339), To: rep.To.Format(time.RFC3339), Scope: who, Currency: rep.Currency,
		Thresholds: RightSizingThresholdsJSON{LowUtilPct: store.LowUtilPct, LowUtilMinRuntimeS: int(store.LowUtilMinRuntime / time.Second),
			IdleGPUPct: store.IdleGPUPct},
		Total: groupJSON(rep.Total), Teams: []RightSizingGroupJSON{}, Users: []RightSizingGroupJSON{}, Jobs: []RightSizingJobJSON{}}
	for _, t := range rep.Teams {
		out.Teams = append(out.Teams, groupJSON(t))
	}
	for _, u := range rep.Users {
		out.Users = append(out.Users, groupJSON(u))
	}
	for _, j := range rep.Jobs {
		out.Jobs = append(out.Jobs, rightSizingJobJSON(j))
	}
	return out
}

// apiRightSizing is GET /api/v1/rightsizing: usage, utilization, cost and
// flagged jobs per team and user for a period (?from=&to=, or
// ?period=week|month; ?team= narrows it).
func (s *Server) apiRightSizing(c echo.Context) error {
	rep, who, _, err := s.rightSizingReport(c)
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, rightSizingJSON(rep, who))
}

// RightSizingCSVColumns are the right-sizing CSV's columns: one row per
// flag of a flagged job.
var RightSizingCSVColumns = []string{"from", "to", "job_id", "job_name", "team", "user", "tier", "gpu_type", "gpus", "gpu_hours",
	"mean_gpu_util", "peak_memory_gb", "cost", "rule", "suggestion", "could_have_saved", "currency"}

// apiRightSizingCSV streams the flagged jobs as RFC 4180 CSV.
func (s *Server) apiRightSizingCSV(c echo.Context) error {
	rep, _, _, err := s.rightSizingReport(c)
	if err != nil {
		return err
	}
	from, to := rep.From.Format(time.RFC3339), rep.To.Format(time.RFC3339)
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "text/csv; charset=utf-8")
	h.Set(echo.HeaderContentDisposition, fmt.Sprintf(`attachment; filename="allot-rightsizing-%s-%s.csv"`,
		rep.From.Format("20060102T1504Z"), rep.To.Format("20060102T1504Z")))
	c.Response().WriteHeader(http.StatusOK)
	w := csv.NewWriter(c.Response())
	w.UseCRLF = true // RFC 4180
	if err := w.Write(RightSizingCSVColumns); err != nil {
		return nil //nolint:nilerr // the client went away
	}
	n := 0
	for _, j := range rep.Jobs {
		util, peak := "", ""
		if j.MeanUtilPct != nil {
			util = strconv.FormatFloat(*j.MeanUtilPct, 'f', 1, 64)
		}
		if j.PeakMemMiB != nil {
			peak = strconv.FormatFloat(float64(*j.PeakMemMiB)/1024, 'f', 1, 64)
		}
		for _, f := range j.Flags {
			if err := writeStreamed(w, &n, []string{from, to, strconv.FormatInt(j.JobID, 10), csvText(j.Name), j.Team, csvText(j.User), string(j.Tier), j.GPUType,
				strconv.Itoa(j.GPUs), gpuHours(j.GPUSeconds), util, peak, j.Cost.Decimal(), f.Rule, f.Suggestion, f.Savings.Decimal(),
				rep.Currency}); err != nil {
				s.log.Warn("right-sizing CSV export broke off", "err", err)
				return nil
			}
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		s.log.Warn("right-sizing CSV export broke off", "err", err)
	}
	return nil
}

func pct(v *float64) string {
	if v == nil {
		return "—"
	}
	return strconv.FormatFloat(*v, 'f', 1, 64) + " %"
}

func rightSizingRow(g store.UsageSummary) views.RightSizingRow {
	return views.RightSizingRow{Team: g.Team, User: g.User, GPUHours: gpuHours(g.GPUSeconds), MeanUtil: pct(g.MeanUtilPct), MeanMem: pct(g.MeanMemPct),
		Cost: g.Cost.Decimal(), Jobs: g.Jobs, Flagged: g.Flagged, Savings: g.Savings.Decimal()}
}

// rightSizingPage is the portal's right-sizing report (GET /rightsizing).
func (s *Server) rightSizingPage(c echo.Context) error {
	rep, who, period, err := s.rightSizingReport(c)
	if err != nil {
		return err
	}
	p := views.RightSizing{Page: s.page(c, "Right-sizing"), From: rep.From.Format(time.RFC3339), To: rep.To.Format(time.RFC3339),
		FromDate: rep.From.Format(time.DateOnly), ToDate: rep.To.Format(time.DateOnly), Period: period, Currency: rep.Currency, Scope: who,
		Total: rightSizingRow(rep.Total),
		Thresholds: fmt.Sprintf("Flagged: mean compute below %d %% over more than %s of runtime; GPUs below %d %% while others of the job work; "+
			"peak memory that fits a cheaper GPU type the job's tier may run on (tiers 1–2 never run on burst nodes). "+
			"A job's saving is its largest flag's, not their sum.",
			store.LowUtilPct, allot.FormatDuration(store.LowUtilMinRuntime), store.IdleGPUPct)}
	q := url.Values{"from": {p.From}, "to": {p.To}}
	if t := c.QueryParam("team"); t != "" {
		q.Set("team", t)
	}
	p.CSVURL = "/api/v1/rightsizing.csv?" + q.Encode()
	for _, t := range rep.Teams {
		p.Teams = append(p.Teams, rightSizingRow(t))
	}
	for _, u := range rep.Users {
		p.Users = append(p.Users, rightSizingRow(u))
	}
	for _, j := range rep.Jobs {
		util, peak := pct(j.MeanUtilPct), "—"
		if j.PeakMemMiB != nil {
			peak = strconv.FormatFloat(float64(*j.PeakMemMiB)/1024, 'f', 1, 64) + " GB"
		}
		for _, f := range j.Flags {
			p.Jobs = append(p.Jobs, views.RightSizingJob{JobID: j.JobID, JobURL: fmt.Sprintf("/jobs/%d", j.JobID), Name: j.Name, Team: j.Team,
				User: j.User, GPUType: j.GPUType, Tier: string(j.Tier), GPUs: j.GPUs, GPUHours: gpuHours(j.GPUSeconds), MeanUtil: util, PeakMem: peak,
				Cost: j.Cost.Decimal(), Rule: f.Rule, Suggestion: f.Suggestion, Savings: f.Savings.Decimal()})
		}
	}
	return render(c, http.StatusOK, views.RightSizingView(p))
}
