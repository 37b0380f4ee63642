package billing

import (
	"fmt"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// Period is a half-open UTC interval [From, To) of whole hours: the span a
// statement or export covers. A month is the period [Start, End) of the
// month; any other period is a run of whole hours, because charge lines
// are hourly (each lies within one usage hour, see Lines) and are priced
// and rounded once per line. A period on the hour grid therefore selects
// whole lines, so the totals of adjacent periods add up, to the cent, to
// the total of their union: nothing is prorated, nothing is rounded twice.
//
// Which lines a period holds is decided by each line's billing instant:
// its usage hour for charges and credits, and the first instant of its
// billing month for adjustments (late usage for a closed month, dated in
// the first open month; see Adjust). A period that contains the start of
// a month so holds that month's adjustments; one that starts later in the
// month does not. Every line has exactly one billing instant, so a month
// split into periods at any hours, or a quarter into its months, adds up.
type Period struct {
	From, To time.Time
}

// MaxPeriod is the longest period a statement may cover: a leap year.
const MaxPeriod = 366 * 24 * time.Hour

// MonthPeriod is the period of month m.
func MonthPeriod(m YearMonth) Period { return Period{From: m.Start(), To: m.End()} }

// String renders the period as "FROM/TO" in RFC 3339 (ISO 8601 interval).
func (p Period) String() string {
	return p.From.UTC().Format(time.RFC3339) + "/" + p.To.UTC().Format(time.RFC3339)
}

// Month returns the month p is, if it is exactly one calendar month.
func (p Period) Month() (YearMonth, bool) {
	m := Month(p.From)
	return m, p == MonthPeriod(m)
}

// Months returns the billing months p overlaps, oldest first.
func (p Period) Months() []YearMonth {
	var out []YearMonth
	for m := Month(p.From); m.Start().Before(p.To); m = m.Next() {
		out = append(out, m)
	}
	return out
}

// Within returns the part of p inside month m (possibly empty: From ≥ To).
func (p Period) Within(m YearMonth) Period {
	q := MonthPeriod(m)
	if p.From.After(q.From) {
		q.From = p.From
	}
	if p.To.Before(q.To) {
		q.To = p.To
	}
	return q
}

// HoldsAdjustmentsOf reports whether p holds the adjustments billed in m:
// whether it contains m's first instant.
func (p Period) HoldsAdjustmentsOf(m YearMonth) bool {
	return !m.Start().Before(p.From) && m.Start().Before(p.To)
}

// BillingInstant is the instant that decides which period a line of kind
// billed in month with usage hour belongs to (see Period).
func BillingInstant(kind Kind, month YearMonth, hour time.Time) time.Time {
	if kind == KindAdjustment {
		return month.Start()
	}
	return hour.UTC()
}

// Contains reports whether t lies in [From, To).
func (p Period) Contains(t time.Time) bool { return !t.Before(p.From) && t.Before(p.To) }

// ParseInstant parses a period bound: an RFC 3339 timestamp (any offset,
// converted to UTC) or a date YYYY-MM-DD (its midnight, UTC). The instant
// must lie on a whole UTC hour.
func ParseInstant(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, allot.Errorf(allot.EInvalid, "is required (an RFC 3339 time such as 2026-03-01T00:00:00Z, or a date such as 2026-03-01)")
	}
	var t time.Time
	var err error
	if len(s) == len("2006-01-02") {
		t, err = time.Parse(time.DateOnly, s)
	} else {
		t, err = time.Parse(time.RFC3339, s)
	}
	if err != nil {
		return time.Time{}, allot.Errorf(allot.EInvalid, "%q is not an RFC 3339 time (2026-03-01T00:00:00Z) or a date (2026-03-01)", s)
	}
	t = t.UTC()
	if y := t.Year(); y < 1 || y > 9999 {
		return time.Time{}, allot.Errorf(allot.EInvalid, "%q: the year must be 0001 to 9999", s)
	}
	if !t.Truncate(time.Hour).Equal(t) {
		return time.Time{}, allot.Errorf(allot.EInvalid, "%q is not on a whole UTC hour (%s): charge lines are hourly, so a period starts and ends on the hour",
			s, t.Format(time.RFC3339))
	}
	return t, nil
}

// CheckPeriod parses the bounds of a period [from, to) given as
// ParseInstant takes them, and refuses an empty or reversed period, one
// that starts after now (it has no usage yet) and one longer than
// MaxPeriod. Errors are allot.FieldErrors on "from" and "to".
func CheckPeriod(from, to string, now time.Time) (Period, error) {
	fe := allot.FieldErrors{}
	f, err := ParseInstant(from)
	if err != nil {
		fe.Add("from", "%s", allot.ErrorMessage(err))
	}
	t, err2 := ParseInstant(to)
	if err2 != nil {
		fe.Add("to", "%s", allot.ErrorMessage(err2))
	}
	if err != nil || err2 != nil {
		return Period{}, fe.Err()
	}
	switch {
	case !f.Before(t):
		fe.Add("to", "must be after from (%s): the period is [from, to)", f.Format(time.RFC3339))
	case f.After(now):
		fe.Add("from", "%s is in the future", f.Format(time.RFC3339))
	case t.Sub(f) > MaxPeriod:
		fe.Add("to", "the period is %s long; at most %d days (a leap year) at once", fmtDays(t.Sub(f)), int(MaxPeriod/(24*time.Hour)))
	}
	if err := fe.Err(); err != nil {
		return Period{}, err
	}
	return Period{From: f, To: t}, nil
}

func fmtDays(d time.Duration) string {
	h := int64(d / time.Hour)
	if h%24 == 0 {
		return fmt.Sprintf("%d days", h/24)
	}
	return fmt.Sprintf("%d days %d hours", h/24, h%24)
}

// Category is what a line is, as finance reads it: the chargeback CSV's
// charge_category column.
type Category string

const (
	// CategoryUsage is usage charged at the rate card (kind charge).
	CategoryUsage Category = "usage"
	// CategoryCredit is GPU-time lost to preemption, credited back (kind
	// preemption_credit).
	CategoryCredit Category = "credit"
	// CategoryUsageCorrection is an adjustment of usage billed for a
	// closed month: late usage, dated in the first open month.
	CategoryUsageCorrection Category = "usage_correction"
	// CategoryCreditCorrection is an adjustment of a closed month's
	// preemption credits.
	CategoryCreditCorrection Category = "credit_correction"
)

// CategoryOf returns the category of a line of kind (and, for an
// adjustment, the kind it adjusts).
func CategoryOf(kind, adjusts Kind) Category {
	switch kind {
	case KindCharge:
		return CategoryUsage
	case KindPreemptionCredit:
		return CategoryCredit
	case KindAdjustment:
		if adjusts == KindPreemptionCredit {
			return CategoryCreditCorrection
		}
		return CategoryUsageCorrection
	}
	return Category(kind)
}

// IsCorrection reports whether c corrects a closed (already invoiced)
// month.
func (c Category) IsCorrection() bool {
	return c == CategoryUsageCorrection || c == CategoryCreditCorrection
}
