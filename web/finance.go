package web

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

func moneyView(t ChargeTotalJSON) views.Money {
	return views.Money{GPUHours: t.GPUHours, Charges: t.Charges, Credits: t.Credits, Adjustments: t.Adjustments, Amount: t.Amount}
}

// financePage is the chargeback statement for finance, admins and leads.
func (s *Server) financePage(c echo.Context) error {
	u, err := currentUser(c)
	if err != nil {
		return err
	}
	cb, err := s.chargeback(c, false)
	f := views.Finance{Page: s.page(c, "Chargeback"), Month: cb.Month, Currency: cb.Currency, Team: c.QueryParam("team"),
		CanClose: (u.Admin || u.Finance) && !cb.Closed}
	switch {
	case allot.ErrorCode(err) == allot.ENotFound:
		f.Empty = allot.ErrorMessage(err)
	case err != nil:
		return err
	}
	m, perr := billing.ParseMonth(cb.Month)
	if perr == nil && !m.Before(billing.Month(s.st.Now())) {
		f.CanClose = false
	}
	if f.CanClose && perr == nil {
		bill, err := billOf(c.Request().Context(), s.st, m, cb.Currency)
		if err != nil {
			return err
		}
		f.CloseQuestion = bill.question(m)
	}
	if cb.ClosedAt != nil {
		f.Closed = "Closed on " + fmtTime(*cb.ClosedAt) + "."
	}
	if u.Admin || u.Finance {
		if err := s.openLastMonth(c, &f); err != nil {
			return err
		}
	}
	if f.Empty == "" {
		q := url.Values{"month": {cb.Month}}
		if f.Team != "" {
			q.Set("team", f.Team)
		}
		f.CSVURL = "/api/v1/chargeback.csv?" + q.Encode()
	}
	f.Total = moneyView(cb.Total)
	for _, g := range cb.Teams {
		f.Teams = append(f.Teams, views.FinanceRow{Team: g.Team, CostCenter: g.CostCenter, Money: moneyView(g.ChargeTotalJSON)})
	}
	for _, g := range cb.ByTier {
		f.ByTier = append(f.ByTier, views.FinanceRow{Team: g.Team, GPUType: g.GPUType, Tier: g.Tier, Money: moneyView(g.ChargeTotalJSON)})
	}
	for _, g := range cb.ByUser {
		f.ByUser = append(f.ByUser, views.FinanceRow{User: g.User, Money: moneyView(g.ChargeTotalJSON)})
	}
	if f.Team != "" {
		for _, g := range cb.ByJob {
			f.ByJob = append(f.ByJob, views.FinanceRow{JobID: g.JobID, User: g.User, Money: moneyView(g.ChargeTotalJSON)})
		}
	}
	fp := views.FinancePage{Finance: f}
	if perr == nil {
		if f.Empty == "" {
			q := url.Values{"month": {cb.Month}, "format": {"focus"}}
			if f.Team != "" {
				q.Set("team", f.Team)
			}
			fp.FOCUSURL = "/api/v1/chargeback.csv?" + q.Encode()
		}
		fp.RangeFrom, fp.RangeTo = m.Start().Format(time.DateOnly), m.End().Format(time.DateOnly)
		if err := s.financeCharts(c, u, m, &fp); err != nil {
			return err
		}
		if u.Admin || u.Finance {
			cp, err := s.capacity(c, m)
			if err != nil {
				return err
			}
			fp.Capacity = capacityView(cp)
		}
	}
	return render(c, http.StatusOK, views.FinanceView(fp))
}

// financeChartMonths is how far back the cost-by-team chart reaches.
const financeChartMonths = 12

// financeChartSeries is the most lines (and bars' colours) a chart has:
// the series classes s1…s8 of the style sheet; more teams than that are
// summed as "other teams".
const financeChartSeries = 8

// financeCharts draws the cost by team over the 12 months up to m, and
// m's cost by GPU type and by tier, from the charge lines of the teams the
// caller may see (all for finance and admins, the ones they lead for
// leads; the page's team when one is chosen). The figures are exact; only
// the drawing is in floating point.
func (s *Server) financeCharts(c echo.Context, u *allot.User, m billing.YearMonth, fp *views.FinancePage) error {
	teams, err := chargebackScope(u, fp.Team)
	if err != nil {
		return err
	}
	first := m
	for range financeChartMonths - 1 {
		first = first.Prev()
	}
	sums, cur, err := s.st.ChargeSums(c.Request().Context(), first, m, teams)
	if err != nil {
		return err
	}
	if cur == "" {
		cur = fp.Currency
	}
	if cur == "" {
		if cur, err = s.cardCurrency(c); err != nil {
			return err
		}
	}
	money := func(micros int64) string { return allot.Money{Micros: micros, Currency: cur}.Decimal() }
	units := func(micros int64) float64 { return float64(micros) / allot.MicrosPerUnit }
	var months []billing.YearMonth
	for x := first; !m.Before(x); x = x.Next() {
		months = append(months, x)
	}
	idx := map[billing.YearMonth]int{}
	for i, x := range months {
		idx[x] = i
	}
	// Teams by their 12 months' amount, largest first.
	byTeam := map[string][]int64{}
	teamTotal := map[string]int64{}
	byType, byTier := map[string]int64{}, map[string]int64{}
	for _, r := range sums {
		if byTeam[r.Team] == nil {
			byTeam[r.Team] = make([]int64, len(months))
		}
		byTeam[r.Team][idx[r.Month]] += r.Micros
		teamTotal[r.Team] += r.Micros
		if r.Month == m {
			byType[r.GPUType] += r.Micros
			byTier[r.Tier] += r.Micros
		}
	}
	names := sortedByAmount(teamTotal)
	if len(names) > financeChartSeries {
		other := make([]int64, len(months))
		for _, n := range names[financeChartSeries-1:] {
			for i, v := range byTeam[n] {
				other[i] += v
			}
		}
		names = append(names[:financeChartSeries-1:financeChartSeries-1], "other teams")
		byTeam["other teams"] = other
	}
	chart := views.LineChart{ID: "chart-cost-teams", Title: fmt.Sprintf("Cost by team, %s to %s (%s)", first, m, cur), YUnit: cur,
		XMax: float64(len(months) - 1)}
	var peak float64
	for i, n := range names {
		sr := views.ChartSeries{Name: n, Class: fmt.Sprintf("s%d", i+1)}
		row := views.CostSeriesRow{Name: n}
		for j, v := range byTeam[n] {
			sr.Points = append(sr.Points, views.ChartPoint{X: float64(j), Y: units(v)})
			peak = max(peak, units(v))
			row.Amounts = append(row.Amounts, money(v))
		}
		chart.Series = append(chart.Series, sr)
		fp.CostByTeamRows = append(fp.CostByTeamRows, row)
	}
	chart.YMax, chart.YTicks = views.NiceTicks(peak, 4, nil)
	for j, x := range months {
		label := x.Start().Format("Jan")
		if j == 0 || x.Month == time.January {
			label = x.Start().Format("Jan 2006")
		}
		if j%2 == 0 || j == len(months)-1 {
			chart.XTicks = append(chart.XTicks, views.ChartTick{At: float64(j), Label: label})
		}
		fp.CostByTeamMonths = append(fp.CostByTeamMonths, x.String())
	}
	fp.CostByTeam = chart
	bars := func(id, title, prefix string, amounts map[string]int64) views.BarChart {
		b := views.BarChart{ID: id, Title: title}
		for i, k := range sortedByAmount(amounts) {
			label := prefix + k
			b.Bars = append(b.Bars, views.Bar{Label: label, Text: money(amounts[k]) + " " + cur,
				Parts: []views.BarPart{{Value: units(amounts[k]), Class: fmt.Sprintf("s%d", i%financeChartSeries+1), Title: label + ": " + money(amounts[k]) + " " + cur}}})
		}
		return b
	}
	fp.CostByGPUType = bars("chart-cost-gpu-type", fmt.Sprintf("Cost by GPU type, %s (%s)", m, cur), "", byType)
	fp.CostByTier = bars("chart-cost-tier", fmt.Sprintf("Cost by tier, %s (%s)", m, cur), "tier ", byTier)
	return nil
}

// sortedByAmount lists amounts' keys, largest amount first (then by name).
func sortedByAmount(amounts map[string]int64) []string {
	keys := make([]string, 0, len(amounts))
	for k := range amounts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if amounts[a] != amounts[b] {
			if amounts[a] > amounts[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return keys
}

// capacityView is the capacity section of the finance page.
func capacityView(cp CapacityJSON) *views.FinanceCapacity {
	q := url.Values{"month": {cp.Month}}.Encode()
	out := &views.FinanceCapacity{Period: cp.From.Format("2006-01-02 15:04") + " – " + cp.To.Format("2006-01-02 15:04") + " UTC",
		Currency: cp.Currency, JSONURL: "/api/v1/capacity?" + q, CSVURL: "/api/v1/capacity.csv?" + q,
		Chart: views.BarChart{ID: "chart-capacity", Title: fmt.Sprintf("GPU-hours by GPU type, %s: allocated, idle, drained or down", cp.Month)}}
	row := func(r CapacityRowJSON) views.CapacityRow {
		v := views.CapacityRow{GPUType: r.GPUType, Site: r.Site, Registered: r.RegisteredGPUHours, Allocated: r.AllocatedGPUHours,
			Idle: r.IdleGPUHours, DrainedDown: r.DrainedDownGPUHours, AllocatedPct: capacityPercent(r), CostPerGPUHour: r.CostPerGPUHour}
		if r.CostPerGPUHour != "" || r.GPUType == "" { // a row with its cost set, and the total
			v.CapacityCost, v.UnrecoveredCost = r.CapacityCost, r.UnrecoveredCost
		}
		return v
	}
	hours := func(secs int64) float64 { return float64(secs) / 3600 }
	for _, r := range cp.Rows {
		out.Rows = append(out.Rows, row(r))
		label := r.GPUType
		if r.Site != allot.SiteOnPrem {
			label += " (" + r.Site + ")"
		}
		out.Chart.Bars = append(out.Chart.Bars, views.Bar{Label: label, Text: capacityPercent(r) + " of " + r.RegisteredGPUHours + " GPU-h",
			Parts: []views.BarPart{
				{Value: hours(r.AllocatedGPUSeconds), Class: "b-alloc", Title: "allocated " + r.AllocatedGPUHours + " GPU-h"},
				{Value: hours(r.IdleGPUSeconds), Class: "b-idle", Title: "idle " + r.IdleGPUHours + " GPU-h"},
				{Value: hours(r.DrainedDownGPUSeconds), Class: "b-out", Title: "drained or down " + r.DrainedDownGPUHours + " GPU-h"},
			}})
	}
	out.Total = row(cp.Total)
	out.Total.GPUType = "Total"
	if cp.AllocatedOutsideGPUHours != gpuHours(0) {
		out.Outside = cp.AllocatedOutsideGPUHours
	}
	return out
}

// closeMonthForm closes a month from the finance page once the form says
// confirm=yes; before, it only asks (see confirmPage).
func (s *Server) closeMonthForm(c echo.Context) error {
	month := c.FormValue("month")
	c.SetParamNames("month")
	c.SetParamValues(month)
	if !confirmed(c) {
		_, m, err := s.closableMonth(c)
		if err != nil {
			return err
		}
		ctx := c.Request().Context()
		if at, _, err := s.st.MonthClosed(ctx, m); err != nil {
			return err
		} else if !at.IsZero() {
			return allot.Errorf(allot.EConflict, "%s is already closed", m)
		}
		cur, err := s.cardCurrency(c)
		if err != nil {
			return err
		}
		bill, err := billOf(ctx, s.st, m, cur)
		if err != nil {
			return err
		}
		return s.confirmPage(c, bill.question(m), "/finance/close", []views.Option{{Value: "month", Label: m.String()}}, "/finance?month="+url.QueryEscape(m.String()))
	}
	if err := s.closeMonth(c); err != nil {
		return err
	}
	return redirect(c, fmt.Sprintf("/finance?month=%s", url.QueryEscape(month)))
}

// openLastMonth points finance at last month while it has charges and is
// not closed, unless the page shows it already: early in a month that is
// the bill to finish, and this month's has little in it yet.
func (s *Server) openLastMonth(c echo.Context, f *views.Finance) error {
	ctx := c.Request().Context()
	prev := billing.Month(s.st.Now()).Prev()
	if f.Month == prev.String() {
		return nil
	}
	has, err := s.st.MonthHasCharges(ctx, prev)
	if err != nil || !has {
		return err
	}
	closed, err := s.st.ClosedMonths(ctx)
	if err != nil || slices.Contains(closed, prev) {
		return err
	}
	f.OpenMonth = prev.Start().Format("January 2006")
	f.OpenMonthURL = "/finance?" + url.Values{"month": {prev.String()}}.Encode()
	return nil
}
