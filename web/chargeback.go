package web

import (
	"encoding/csv"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/store"
	"github.com/labstack/echo/v4"
)

// chargebackScope decides whose charges u may read: nil = every team
// (finance, admin), else the teams u leads. Engineers get EForbidden.
func chargebackScope(u *allot.User, team string) ([]string, error) {
	var teams []string
	if !u.Admin && !u.Finance {
		for _, m := range u.Memberships {
			if m.Role == allot.TeamRoleLead {
				teams = append(teams, m.Team)
			}
		}
		if len(teams) == 0 {
			return nil, allot.Errorf(allot.EForbidden, "chargeback is for finance, admins and team leads")
		}
	}
	if team == "" {
		return teams, nil
	}
	if teams != nil && !u.LeadOf(team) {
		return nil, allot.Errorf(allot.EForbidden, "you do not lead team %q", team)
	}
	return []string{team}, nil
}

// chargebackMonth parses ?month= (default: this month) and refuses future
// months.
func (s *Server) chargebackMonth(c echo.Context) (billing.YearMonth, error) {
	v := c.QueryParam("month")
	if v == "" {
		return billing.Month(s.st.Now()), nil
	}
	m, err := billing.CheckMonth(v, s.st.Now())
	if err != nil {
		return m, (allot.FieldErrors{"month": allot.ErrorMessage(err)}).Err()
	}
	return m, nil
}

// chargebackPeriod parses what a statement or export covers: ?month=
// (default: this month; see chargebackMonth) or ?from=&to=, a half-open
// UTC period of whole hours, at most billing.MaxPeriod long, that may not
// start in the future (billing.CheckPeriod). Empty from and to are as if
// absent; month together with from or to is refused.
func (s *Server) chargebackPeriod(c echo.Context) (billing.Period, error) {
	from, to := c.QueryParam("from"), c.QueryParam("to")
	if from == "" && to == "" {
		m, err := s.chargebackMonth(c)
		return billing.MonthPeriod(m), err
	}
	if c.QueryParam("month") != "" {
		return billing.Period{}, (allot.FieldErrors{"month": "give either month or from and to, not both"}).Err()
	}
	return billing.CheckPeriod(from, to, s.st.Now())
}

// periodName names p in messages and file names: the month, or
// FROM–TO in RFC 3339.
func periodName(p billing.Period) string {
	if m, ok := p.Month(); ok {
		return m.String()
	}
	return p.From.Format(time.RFC3339) + " to " + p.To.Format(time.RFC3339)
}

func noCharges(p billing.Period) error {
	if m, ok := p.Month(); ok {
		return allot.Errorf(allot.ENotFound, "no charges for %s: no usage was recorded then, or the hourly rollup has not run yet", m)
	}
	return allot.Errorf(allot.ENotFound, "no charges from %s to %s: no usage was recorded then, or the hourly rollup has not run yet",
		p.From.Format(time.RFC3339), p.To.Format(time.RFC3339))
}

func gpuHours(seconds int64) string {
	return new(big.Rat).SetFrac64(seconds, 3600).FloatString(4)
}

func multiplier(bp int) string {
	return new(big.Rat).SetFrac64(int64(bp), 10000).FloatString(2)
}

// ChargeTotalJSON is an exact total; amounts are decimal strings.
type ChargeTotalJSON struct {
	GPUHours    string `json:"gpu_hours"`
	Charges     string `json:"charges"`
	Credits     string `json:"credits"`
	Adjustments string `json:"adjustments"`
	Amount      string `json:"amount"`
}

// ChargeGroupJSON is one team's (or team × GPU type × tier, or user) total.
type ChargeGroupJSON struct {
	Team       string `json:"team"`
	CostCenter string `json:"cost_center,omitempty"`
	GPUType    string `json:"gpu_type,omitempty"`
	Tier       string `json:"tier,omitempty"`
	User       string `json:"user,omitempty"`
	JobID      int64  `json:"job_id,omitempty"`
	JobName    string `json:"job_name,omitempty"`
	ChargeTotalJSON
}

// ChargeLineJSON is one line: the CSV's columns.
type ChargeLineJSON struct {
	Month string `json:"month"`
	Kind  string `json:"kind"`
	// ChargeCategory is usage, credit, usage_correction or
	// credit_correction (billing.Category).
	ChargeCategory string   `json:"charge_category"`
	Team           string   `json:"team"`
	CostCenter     string   `json:"cost_center"`
	JobID          int64    `json:"job_id"`
	JobName        string   `json:"job_name"`
	User           string   `json:"user"`
	Tier           string   `json:"tier"`
	GPUType        string   `json:"gpu_type"`
	GPUs           int64    `json:"gpus"`
	StartedAt      string   `json:"started_at"`
	EndedAt        string   `json:"ended_at"`
	GPUHours       string   `json:"gpu_hours"`
	Rate           string   `json:"rate"`
	Multiplier     string   `json:"multiplier"`
	Amount         string   `json:"amount"`
	Currency       string   `json:"currency"`
	MeanGPUUtil    *float64 `json:"mean_gpu_util"`
}

// ChargebackJSON is the body of GET /api/v1/chargeback.
type ChargebackJSON struct {
	// Month is the statement's month; "" for a period of ?from=&to=
	// that is not exactly one month.
	Month string `json:"month"`
	// From and To bound the period, [From, To), in RFC 3339 UTC.
	From     string `json:"from"`
	To       string `json:"to"`
	Currency string `json:"currency"`
	// Closed: every month the period touches is closed (ClosedAt: the
	// latest close).
	Closed   bool              `json:"closed"`
	ClosedAt *time.Time        `json:"closed_at"`
	Total    ChargeTotalJSON   `json:"total"`
	Teams    []ChargeGroupJSON `json:"teams"`
	ByTier   []ChargeGroupJSON `json:"by_team_gpu_type_tier"`
	ByUser   []ChargeGroupJSON `json:"by_user"`
	ByJob    []ChargeGroupJSON `json:"by_job"`
	Lines    []ChargeLineJSON  `json:"lines"`
}

func lineJSON(r *store.ChargeRow) ChargeLineJSON {
	cur := r.Amount.Currency
	return ChargeLineJSON{Month: r.Month, Kind: r.Kind, ChargeCategory: string(billing.CategoryOf(billing.Kind(r.Kind), billing.Kind(r.Adjusts))), Team: r.Team, CostCenter: r.CostCenter, JobID: r.JobID, JobName: r.JobName, User: r.User,
		Tier: r.Tier, GPUType: r.GPUType, GPUs: r.GPUs, StartedAt: r.From.Format(time.RFC3339), EndedAt: r.To.Format(time.RFC3339),
		GPUHours: gpuHours(r.GPUSeconds), Rate: allot.Money{Micros: r.RateMicros, Currency: cur}.Decimal(), Multiplier: multiplier(r.MultiplierBP),
		Amount: r.Amount.Decimal(), Currency: cur, MeanGPUUtil: r.MeanGPUUtil}
}

// chargeback loads the caller's statement for ?month= or ?from=&to=
// (chargebackPeriod).
func (s *Server) chargeback(c echo.Context, withLines bool) (ChargebackJSON, error) {
	u, err := currentUser(c)
	if err != nil {
		return ChargebackJSON{}, err
	}
	teams, err := chargebackScope(u, c.QueryParam("team"))
	if err != nil {
		return ChargebackJSON{}, err
	}
	p, err := s.chargebackPeriod(c)
	if err != nil {
		return ChargebackJSON{}, err
	}
	ctx := c.Request().Context()
	out := ChargebackJSON{From: p.From.Format(time.RFC3339), To: p.To.Format(time.RFC3339), Teams: []ChargeGroupJSON{}, ByTier: []ChargeGroupJSON{},
		ByUser: []ChargeGroupJSON{}, ByJob: []ChargeGroupJSON{}, Lines: []ChargeLineJSON{}}
	if m, ok := p.Month(); ok {
		out.Month = m.String()
	}
	out.Closed = true
	for _, m := range p.Months() {
		at, _, err := s.st.MonthClosed(ctx, m)
		if err != nil {
			return out, err
		}
		if at.IsZero() {
			out.Closed, out.ClosedAt = false, nil
			break
		}
		if out.ClosedAt == nil || at.After(*out.ClosedAt) {
			out.ClosedAt = &at
		}
	}
	var lines []billing.Line
	if m, ok := p.Month(); ok {
		lines, err = s.exportSt.ChargeLinesOfTeams(ctx, m, teams)
	} else {
		lines, err = s.exportSt.ChargeLinesIn(ctx, p, teams)
	}
	if err != nil {
		return out, err
	}
	costCenter := map[string]string{}
	for _, l := range lines {
		costCenter[l.Team] = l.CostCenter
	}
	sum, err := billing.Totals(lines)
	if err != nil {
		return out, err
	}
	out.Currency = sum.Currency
	money := func(micros int64) string { return allot.Money{Micros: micros, Currency: sum.Currency}.Decimal() }
	total := func(t billing.Total) ChargeTotalJSON {
		return ChargeTotalJSON{GPUHours: gpuHours(t.GPUSeconds), Charges: money(t.Charges), Credits: money(t.Credits),
			Adjustments: money(t.Adjustments), Amount: money(t.Amount)}
	}
	out.Total = total(sum.Total)
	for team, t := range sum.ByTeam {
		out.Teams = append(out.Teams, ChargeGroupJSON{Team: team, CostCenter: costCenter[team], ChargeTotalJSON: total(t)})
	}
	sort.Slice(out.Teams, func(i, j int) bool { return out.Teams[i].Team < out.Teams[j].Team })
	for k, t := range sum.ByTeamGPUTier {
		out.ByTier = append(out.ByTier, ChargeGroupJSON{Team: k.Team, GPUType: k.GPUType, Tier: string(k.Tier), ChargeTotalJSON: total(t)})
	}
	sort.Slice(out.ByTier, func(i, j int) bool {
		a, b := out.ByTier[i], out.ByTier[j]
		return a.Team+"\x00"+a.GPUType+"\x00"+a.Tier < b.Team+"\x00"+b.GPUType+"\x00"+b.Tier
	})
	for user, t := range sum.ByUser {
		out.ByUser = append(out.ByUser, ChargeGroupJSON{User: user, ChargeTotalJSON: total(t)})
	}
	sort.Slice(out.ByUser, func(i, j int) bool { return out.ByUser[i].User < out.ByUser[j].User })
	jobTeam, jobUser := map[int64]string{}, map[int64]string{}
	for _, l := range lines {
		jobTeam[l.JobID], jobUser[l.JobID] = l.Team, l.User
	}
	for id, t := range sum.ByJob {
		out.ByJob = append(out.ByJob, ChargeGroupJSON{JobID: id, Team: jobTeam[id], User: jobUser[id], ChargeTotalJSON: total(t)})
	}
	sort.Slice(out.ByJob, func(i, j int) bool { return out.ByJob[i].JobID < out.ByJob[j].JobID })
	if len(lines) == 0 {
		return out, noCharges(p)
	}
	if withLines {
		for _, m := range p.Months() {
			err = s.exportSt.EachChargeRowIn(ctx, m, p, teams, func(r *store.ChargeRow) error {
				out.Lines = append(out.Lines, lineJSON(r))
				return nil
			})
			if err != nil {
				break
			}
		}
	}
	return out, err
}

func (s *Server) apiChargeback(c echo.Context) error {
	out, err := s.chargeback(c, c.QueryParam("lines") != "false")
	if err != nil {
		return err
	}
	return writeJSON(c, http.StatusOK, out)
}

// CSVColumns are the chargeback CSV's columns, in order. charge_category
// (billing.Category) says what the line is; tier is the plain tier.
var CSVColumns = []string{"month", "team", "cost_center", "job_id", "job_name", "user", "tier", "gpu_type", "gpus", "started_at", "ended_at",
	"gpu_hours", "rate", "multiplier", "amount", "currency", "mean_gpu_util", "charge_category"}

// allotCSVRecord is a line as a row of CSVColumns.
func allotCSVRecord(r *store.ChargeRow) []string {
	l := lineJSON(r)
	util := ""
	if l.MeanGPUUtil != nil {
		util = strconv.FormatFloat(*l.MeanGPUUtil, 'f', 1, 64)
	}
	return []string{l.Month, l.Team, csvText(l.CostCenter), strconv.FormatInt(l.JobID, 10), csvText(l.JobName), csvText(l.User), l.Tier, l.GPUType,
		strconv.FormatInt(l.GPUs, 10), l.StartedAt, l.EndedAt, l.GPUHours, l.Rate, l.Multiplier, l.Amount, l.Currency, util, l.ChargeCategory}
}

// apiChargebackCSV streams RFC 4180 CSV in constant memory: a page of
// lines per short query (store.EachChargeRowIn), no database connection
// held while the client reads, and a client that takes nothing for
// ExportStallTimeout is dropped (exportWriter). ?format= picks the
// columns: allot (the default, CSVColumns) or focus (FOCUS 1.2,
// FOCUSColumns); ?month= or ?from=&to= the period (chargebackPeriod),
// read a month at a time. A failure before the first line answers a
// problem; after it, the download is cut off, never ended short as if
// complete.
func (s *Server) apiChargebackCSV(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	teams, err := chargebackScope(u, c.QueryParam("team"))
	if err != nil {
		return err
	}
	header, record, prefix := CSVColumns, allotCSVRecord, "allot-chargeback"
	switch c.QueryParam("format") {
	case "", "allot":
	case "focus":
		header, record, prefix = FOCUSColumns, focusRecord, "allot-focus"
	default:
		return (allot.FieldErrors{"format": fmt.Sprintf(`%q: must be "allot" (Allot's columns, the default) or "focus" (FOCUS 1.2)`,
			c.QueryParam("format"))}).Err()
	}
	p, err := s.chargebackPeriod(c)
	if err != nil {
		return err
	}
	name := prefix + "-" + p.From.Format("2006-01-02T15") + "_" + p.To.Format("2006-01-02T15") + ".csv"
	if m, ok := p.Month(); ok {
		name = prefix + "-" + m.String() + ".csv"
	}
	h := c.Response().Header()
	w := csv.NewWriter(c.Response())
	w.UseCRLF = true // RFC 4180
	out := s.exportWriter(c, w)
	started := false
	each := func(r *store.ChargeRow) error {
		if !started {
			h.Set(echo.HeaderContentType, "text/csv; charset=utf-8")
			h.Set(echo.HeaderContentDisposition, fmt.Sprintf(`attachment; filename="%s"`, name))
			c.Response().WriteHeader(http.StatusOK)
			started = true
			if err := out.write(header); err != nil {
				return err
			}
		}
		return out.write(record(r))
	}
	for _, m := range p.Months() {
		if err = s.exportSt.EachChargeRowIn(c.Request().Context(), m, p, teams, each); err != nil {
			break
		}
	}
	if err != nil {
		if !started {
			return err
		}
		s.log.Error("chargeback CSV export broke off", "period", periodName(p), "err", err)
		panic(http.ErrAbortHandler) // the client sees a cut download, not a short file
	}
	if !started {
		return noCharges(p)
	}
	return out.flush()
}

// exportWriter writes a streamed CSV export: it flushes every 1000
// records, so the download streams as it is read, and keeps the
// connection's write deadline ExportStallTimeout ahead while the client
// takes what it is sent, so a long download from a client that reads
// lasts as long as it needs while one that stops reading is dropped (its
// blocked write fails) instead of being kept for good. The server's own
// WriteTimeout, from the start of the request, would cut both.
type exportWriter struct {
	w        *csv.Writer
	rc       *http.ResponseController
	stall    time.Duration
	n        int
	extended time.Time
}

func (s *Server) exportWriter(c echo.Context, w *csv.Writer) *exportWriter {
	capSendBuffer(c.Request())
	return &exportWriter{w: w, rc: http.NewResponseController(c.Response()), stall: s.cfg.ExportStallTimeout}
}

func (x *exportWriter) write(record []string) error {
	if x.stall > 0 {
		// At most once a second: the deadline moves with time, not rows.
		if now := time.Now(); now.Sub(x.extended) >= time.Second {
			if err := x.rc.SetWriteDeadline(now.Add(x.stall)); err != nil && !errors.Is(err, http.ErrNotSupported) {
				return err
			}
			x.extended = now
		}
	}
	if err := x.w.Write(record); err != nil {
		return err
	}
	if x.n++; x.n%1000 == 0 {
		return x.flush()
	}
	return nil
}

func (x *exportWriter) flush() error {
	x.w.Flush()
	return x.w.Error()
}

// apiCloseMonth closes a finished month (finance, admin).
func (s *Server) apiCloseMonth(c echo.Context) error {
	if err := s.closeMonth(c); err != nil {
		return err
	}
	out, err := s.chargeback(c, false)
	if err != nil && allot.ErrorCode(err) != allot.ENotFound {
		return err
	}
	return writeJSON(c, http.StatusOK, out)
}

// closableMonth returns the caller and the month named by :month if the
// caller may close it (finance, admin) and it has ended.
func (s *Server) closableMonth(c echo.Context) (*allot.User, billing.YearMonth, error) {
	u, err := currentUser(c)
	if err != nil {
		return nil, billing.YearMonth{}, err
	}
	if !u.Admin && !u.Finance {
		return nil, billing.YearMonth{}, allot.Errorf(allot.EForbidden, "only finance and admins close months")
	}
	m, err := billing.ParseMonth(c.Param("month"))
	if err != nil {
		return nil, m, (allot.FieldErrors{"month": allot.ErrorMessage(err)}).Err()
	}
	if !m.Before(billing.Month(s.st.Now())) {
		return nil, m, (allot.FieldErrors{"month": fmt.Sprintf("%s has not ended yet; only past months can be closed", m)}).Err()
	}
	return u, m, nil
}

// closeMonth closes the month named by :month after a last rollup, and
// records the close and the month's totals in the audit log, in the same
// transaction.
func (s *Server) closeMonth(c echo.Context) error {
	u, m, err := s.closableMonth(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	if s.cfg.Rollup != nil {
		if err := s.cfg.Rollup(ctx); err != nil {
			return err
		}
	}
	cur, err := s.cardCurrency(c)
	if err != nil {
		return err
	}
	err = s.st.InTx(ctx, func(tx *store.Store) error {
		if err := tx.CloseMonth(ctx, m, u.Email); err != nil {
			return err
		}
		bill, err := billOf(ctx, tx, m, cur)
		if err != nil {
			return err
		}
		e, err := closeAudit(u.Email, m, bill)
		if err != nil {
			return err
		}
		return tx.Audit(ctx, e)
	})
	if err != nil {
		return err
	}
	c.QueryParams().Set("month", m.String())
	return nil
}

// writeStreamed writes record to w and, every 1000 records (n counts
// them), flushes, so a long export streams out as it is read.
func writeStreamed(w *csv.Writer, n *int, record []string) error {
	if err := w.Write(record); err != nil {
		return err
	}
	if *n++; *n%1000 == 0 {
		w.Flush()
		return w.Error()
	}
	return nil
}
