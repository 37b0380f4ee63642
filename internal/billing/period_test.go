package billing

import (
	"strings"
	"testing"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

func utc(y int, m time.Month, d, h int) time.Time { return time.Date(y, m, d, h, 0, 0, 0, time.UTC) }

func TestParseInstant(t *testing.T) {
	for in, want := range map[string]time.Time{
		"2028-02-29":                utc(2028, 2, 29, 0), // leap day
		"2026-12-31T23:00:00Z":      utc(2026, 12, 31, 23),
		"2027-01-01T01:00:00+01:00": utc(2027, 1, 1, 0), // year end, from an offset
		" 2026-03-01 ":              utc(2026, 3, 1, 0),
		"2026-03-01T00:00:00.000Z":  utc(2026, 3, 1, 0),
	} {
		got, err := ParseInstant(in)
		if err != nil || !got.Equal(want) || got.Location() != time.UTC {
			t.Errorf("ParseInstant(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, why := range map[string]string{
		"":                          "is required",
		"2027-02-29":                "not an RFC 3339 time",
		"2026-13-01":                "not an RFC 3339 time",
		"yesterday":                 "not an RFC 3339 time",
		"2026-03-01T00:30:00Z":      "not on a whole UTC hour",
		"2026-03-01T05:00:00+05:30": "not on a whole UTC hour",
		"2026-03-01T00:00:00.5Z":    "not on a whole UTC hour",
		"2026-03-01 00:00":          "not an RFC 3339 time",
	} {
		_, err := ParseInstant(in)
		if allot.ErrorCode(err) != allot.EInvalid || !strings.Contains(allot.ErrorMessage(err), why) {
			t.Errorf("ParseInstant(%q): %v, want %q", in, err, why)
		}
	}
}

func TestCheckPeriod(t *testing.T) {
	now := time.Date(2028, 3, 1, 0, 0, 1, 0, time.UTC) // a month's first second
	p, err := CheckPeriod("2028-02-01", "2028-03-01", now)
	if err != nil || p != MonthPeriod(YearMonth{2028, time.February}) {
		t.Fatalf("February 2028: %v %v", p, err)
	}
	if m, ok := p.Month(); !ok || m.String() != "2028-02" || p.To.Sub(p.From) != 29*24*time.Hour {
		t.Errorf("leap February: %v %v, %v", m, ok, p.To.Sub(p.From))
	}
	// A period may end after now (this quarter so far) but not start then.
	if _, err := CheckPeriod("2028-01-01", "2028-04-01", now); err != nil {
		t.Errorf("quarter to date: %v", err)
	}
	// 366 days (a leap year) is the most.
	if _, err := CheckPeriod("2027-03-01", "2028-03-01", now); err != nil {
		t.Errorf("a leap year: %v", err)
	}
	for _, tt := range []struct{ from, to, field, why string }{
		{"2028-02-10", "2028-02-10", "to", "must be after from"},
		{"2028-02-10", "2028-02-01", "to", "must be after from"},
		{"2028-03-01T01:00:00Z", "2028-03-02", "from", "in the future"},
		{"2026-01-01", "2028-01-01", "to", "at most 366 days"},
		{"2027-02-28T23:00:00Z", "2028-03-01T01:00:00Z", "to", "366 days 2 hours"},
		{"", "2028-01-01", "from", "is required"},
		{"2028-01-01", "", "to", "is required"},
		{"2028-01-01T00:15:00Z", "nope", "from", "whole UTC hour"},
		{"2028-01-01T00:15:00Z", "nope", "to", "not an RFC 3339"},
	} {
		_, err := CheckPeriod(tt.from, tt.to, now)
		var fe allot.FieldErrors
		if e, ok := err.(*allot.Error); ok {
			fe = e.Fields
		}
		if allot.ErrorCode(err) != allot.EInvalid || !strings.Contains(fe[tt.field], tt.why) {
			t.Errorf("CheckPeriod(%q, %q): %v %v, want %s: %q", tt.from, tt.to, err, fe, tt.field, tt.why)
		}
	}
}

func TestPeriodMonthsAndAdjustments(t *testing.T) {
	// The last quarter of a year and into the next.
	p := Period{From: utc(2026, 11, 15, 6), To: utc(2027, 1, 1, 1)}
	ms := p.Months()
	if len(ms) != 3 || ms[0].String() != "2026-11" || ms[2].String() != "2027-01" {
		t.Fatalf("months %v", ms)
	}
	if w := p.Within(ms[0]); w.From != p.From || w.To != utc(2026, 12, 1, 0) {
		t.Errorf("within November: %v", w)
	}
	if w := p.Within(ms[2]); w.From != utc(2027, 1, 1, 0) || w.To != p.To {
		t.Errorf("within January: %v", w)
	}
	if p.HoldsAdjustmentsOf(ms[0]) || !p.HoldsAdjustmentsOf(ms[1]) || !p.HoldsAdjustmentsOf(ms[2]) {
		t.Errorf("adjustments: a period holds those of the months whose first instant it holds")
	}
	if got := (Period{From: utc(2026, 12, 1, 0), To: utc(2027, 1, 1, 0)}).Months(); len(got) != 1 {
		t.Errorf("a month's period is one month: %v", got)
	}
}

// TestPeriodsPartitionLines: split a month at any hours, every line lies in
// exactly one part, by its billing instant; so the parts' totals add up.
func TestPeriodsPartitionLines(t *testing.T) {
	feb := YearMonth{2028, time.February}
	type line struct {
		kind Kind
		hour time.Time
	}
	var lines []line
	for h := feb.Start(); h.Before(feb.End()); h = h.Add(7 * time.Hour) {
		lines = append(lines, line{KindCharge, h}, line{KindPreemptionCredit, h})
	}
	// Adjustments billed in February for January's (closed) usage.
	lines = append(lines, line{KindAdjustment, utc(2028, 1, 31, 23)}, line{KindAdjustment, utc(2028, 1, 3, 4)})
	for _, cut := range []time.Time{utc(2028, 2, 1, 1), utc(2028, 2, 15, 0), utc(2028, 2, 29, 0), utc(2028, 2, 29, 23)} {
		parts := []Period{{feb.Start(), cut}, {cut, feb.End()}}
		for _, l := range lines {
			n := 0
			for _, p := range parts {
				if p.Contains(BillingInstant(l.kind, feb, l.hour)) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("cut at %v: %s line at %v lies in %d parts", cut, l.kind, l.hour, n)
			}
		}
	}
}

func TestCategoryOf(t *testing.T) {
	for _, tt := range []struct {
		kind, adjusts Kind
		want          Category
	}{
		{KindCharge, "", CategoryUsage},
		{KindPreemptionCredit, "", CategoryCredit},
		{KindAdjustment, KindCharge, CategoryUsageCorrection},
		{KindAdjustment, KindPreemptionCredit, CategoryCreditCorrection},
	} {
		if got := CategoryOf(tt.kind, tt.adjusts); got != tt.want || got.IsCorrection() != (tt.kind == KindAdjustment) {
			t.Errorf("CategoryOf(%s, %s) = %s", tt.kind, tt.adjusts, got)
		}
	}
}
