package web

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"

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
	return render(c, http.StatusOK, views.FinanceView(f))
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
