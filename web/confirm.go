package web

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/allotlabs/allot/internal/allot"
	"github.com/allotlabs/allot/internal/billing"
	"github.com/allotlabs/allot/internal/store"
	"github.com/allotlabs/allot/views"
	"github.com/labstack/echo/v4"
)

// Destructive portal forms (cancel a job, close a month, drain a node)
// happen only with confirm=yes. Without it — a browser without <dialog>
// invokers, or without JavaScript, or a stray POST — the handler checks
// what it can, changes nothing and answers with the question as a page,
// whose form sends the same values again with confirm=yes. The JSON API
// is explicit already and asks nothing.

// confirmed reports whether a form said yes to its question.
func confirmed(c echo.Context) bool { return c.FormValue("confirm") == "yes" }

// confirmPage answers a destructive form sent without confirm=yes: the
// question, and a form that sends fields to action again with it.
func (s *Server) confirmPage(c echo.Context, q views.Question, action string, fields []views.Option, back string) error {
	return render(c, http.StatusOK, views.ConfirmView(views.Confirm{Page: s.page(c, q.Heading), Question: q, Action: action, Fields: fields, Back: back}))
}

// monthBill is a whole month's bill, every team, as the chargeback shows
// it.
type monthBill struct {
	Money    views.Money
	Currency string
	Teams    int
}

// billOf totals month from st's charge lines; currency is the bill's when
// the month has no lines.
func billOf(ctx context.Context, st *store.Store, m billing.YearMonth, currency string) (monthBill, error) {
	lines, err := st.ChargeLines(ctx, m)
	if err != nil {
		return monthBill{}, err
	}
	sum, err := billing.Totals(lines)
	if err != nil {
		return monthBill{}, err
	}
	if sum.Currency != "" {
		currency = sum.Currency
	}
	money := func(micros int64) string { return allot.Money{Micros: micros, Currency: currency}.Decimal() }
	t := sum.Total
	return monthBill{Currency: currency, Teams: len(sum.ByTeam),
		Money: views.Money{GPUHours: gpuHours(t.GPUSeconds), Charges: money(t.Charges), Credits: money(t.Credits), Adjustments: money(t.Adjustments), Amount: money(t.Amount)}}, nil
}

func (b monthBill) question(m billing.YearMonth) views.Question {
	return views.CloseMonthQuestion(m.String(), b.Currency, b.Teams, b.Money)
}

// closeAudit is the audit entry of closing month m with bill b.
func closeAudit(actor string, m billing.YearMonth, b monthBill) (*allot.AuditEntry, error) {
	after, err := json.Marshal(map[string]any{"month": m.String(), "closed": true, "teams": b.Teams, "gpu_hours": b.Money.GPUHours,
		"charges": b.Money.Charges, "preemption_credits": b.Money.Credits, "adjustments": b.Money.Adjustments, "amount": b.Money.Amount, "currency": b.Currency})
	if err != nil {
		return nil, err
	}
	return &allot.AuditEntry{Actor: actor, Action: "month.close", Object: "month:" + m.String(), After: after,
		Note: fmt.Sprintf("closed %s: %d team(s), %s GPU-hours, %s %s (charges %s, preemption credits %s, adjustments %s)",
			m, b.Teams, b.Money.GPUHours, b.Money.Amount, b.Currency, b.Money.Charges, b.Money.Credits, b.Money.Adjustments)}, nil
}
