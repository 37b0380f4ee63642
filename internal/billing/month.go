package billing

import (
	"fmt"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// YearMonth is a UTC calendar month. Its zero value is not a valid month.
type YearMonth struct {
	Year  int
	Month time.Month
}

// Month returns the UTC month that contains t.
func Month(t time.Time) YearMonth {
	y, m, _ := t.UTC().Date()
	return YearMonth{y, m}
}

// ParseMonth parses a strict "YYYY-MM" month key (year 0001–9999, month
// 01–12). The error is an allot.EInvalid error that says what is wrong.
func ParseMonth(s string) (YearMonth, error) {
	bad := func(why string) (YearMonth, error) {
		return YearMonth{}, allot.Errorf(allot.EInvalid, "month %q: %s", s, why)
	}
	if s == "" {
		return bad("is required (YYYY-MM)")
	}
	if len(s) != 7 || s[4] != '-' || !digits(s[:4]) || !digits(s[5:]) {
		return bad("must be YYYY-MM, e.g. 2026-03")
	}
	y := atoi(s[:4])
	m := atoi(s[5:])
	if y < 1 {
		return bad("year must be 0001 to 9999")
	}
	if m < 1 || m > 12 {
		return bad("month must be 01 to 12")
	}
	return YearMonth{y, time.Month(m)}, nil
}

// CheckMonth parses s like ParseMonth and also rejects a month that starts
// after now (a future month has no usage yet).
func CheckMonth(s string, now time.Time) (YearMonth, error) {
	m, err := ParseMonth(s)
	if err != nil {
		return m, err
	}
	if m.IsFuture(now) {
		return YearMonth{}, allot.Errorf(allot.EInvalid, "month %s is in the future", m)
	}
	return m, nil
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

func atoi(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		n = n*10 + int(s[i]-'0')
	}
	return n
}

// String returns "YYYY-MM".
func (m YearMonth) String() string { return fmt.Sprintf("%04d-%02d", m.Year, int(m.Month)) }

// IsZero reports whether m is the zero value.
func (m YearMonth) IsZero() bool { return m == YearMonth{} }

// Start returns the first instant of the month (UTC).
func (m YearMonth) Start() time.Time { return time.Date(m.Year, m.Month, 1, 0, 0, 0, 0, time.UTC) }

// End returns the first instant after the month (UTC).
func (m YearMonth) End() time.Time { return m.Next().Start() }

// Next returns the following month.
func (m YearMonth) Next() YearMonth {
	if m.Month == time.December {
		return YearMonth{m.Year + 1, time.January}
	}
	return YearMonth{m.Year, m.Month + 1}
}

// Compare returns -1, 0 or +1 as m is before, equal to or after o.
// Prev is the month before m.
func (m YearMonth) Prev() YearMonth { return Month(m.Start().Add(-time.Second)) }

func (m YearMonth) Compare(o YearMonth) int {
	switch {
	case m.Year != o.Year:
		return sign(m.Year - o.Year)
	default:
		return sign(int(m.Month) - int(o.Month))
	}
}

// Before reports whether m is before o.
func (m YearMonth) Before(o YearMonth) bool { return m.Compare(o) < 0 }

// Contains reports whether t lies within the month.
func (m YearMonth) Contains(t time.Time) bool { return Month(t) == m }

// IsFuture reports whether m starts after now, i.e. is later than now's month.
func (m YearMonth) IsFuture(now time.Time) bool { return Month(now).Before(m) }

func sign(n int) int {
	switch {
	case n < 0:
		return -1
	case n > 0:
		return 1
	}
	return 0
}
