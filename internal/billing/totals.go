package billing

import (
	"math"

	"github.com/allotlabs/allot/internal/allot"
)

// Total is an exact sum of lines. Amounts are micro-units.
type Total struct {
	// GPUSeconds is net: charged minus credited, plus adjustments.
	GPUSeconds  int64
	Charges     int64 // sum of charge lines (≥ 0)
	Credits     int64 // sum of preemption credit lines (≤ 0)
	Adjustments int64 // sum of adjustment lines (either sign)
	Amount      int64 // Charges + Credits + Adjustments
}

// TeamGPUTier keys the per team, GPU type and tier totals.
type TeamGPUTier struct {
	Team    string
	GPUType string
	Tier    allot.TierID
}

// Summary holds the totals of a set of lines (usually one billing month).
type Summary struct {
	Currency      string // "" when there are no lines
	Total         Total
	ByTeam        map[string]Total
	ByTeamGPUTier map[TeamGPUTier]Total
	ByUser        map[string]Total
	ByJob         map[int64]Total
}

// Totals sums lines by team, by team × GPU type × tier, by user, by job and
// in all, exactly. It errors when lines mix currencies or a sum overflows.
// The caller chooses the lines (e.g. those whose Month is the statement's).
func Totals(lines []Line) (Summary, error) {
	s := Summary{
		ByTeam:        map[string]Total{},
		ByTeamGPUTier: map[TeamGPUTier]Total{},
		ByUser:        map[string]Total{},
		ByJob:         map[int64]Total{},
	}
	var ok = true
	add := func(t Total, l *Line) Total {
		var o1, o2, o3 bool
		t.GPUSeconds, o1 = addInt(t.GPUSeconds, l.GPUSeconds)
		t.Amount, o2 = addInt(t.Amount, l.Amount.Micros)
		switch l.Kind {
		case KindCharge:
			t.Charges, o3 = addInt(t.Charges, l.Amount.Micros)
		case KindPreemptionCredit:
			t.Credits, o3 = addInt(t.Credits, l.Amount.Micros)
		default:
			t.Adjustments, o3 = addInt(t.Adjustments, l.Amount.Micros)
		}
		ok = ok && o1 && o2 && o3
		return t
	}
	for i := range lines {
		l := &lines[i]
		switch {
		case s.Currency == "":
			s.Currency = l.Amount.Currency
		case l.Amount.Currency != s.Currency:
			return Summary{}, allot.Errorf(allot.EInvalid, "lines mix currencies %s and %s", s.Currency, l.Amount.Currency)
		}
		s.Total = add(s.Total, l)
		s.ByTeam[l.Team] = add(s.ByTeam[l.Team], l)
		k := TeamGPUTier{l.Team, l.GPUType, l.Tier}
		s.ByTeamGPUTier[k] = add(s.ByTeamGPUTier[k], l)
		s.ByUser[l.User] = add(s.ByUser[l.User], l)
		s.ByJob[l.JobID] = add(s.ByJob[l.JobID], l)
		if !ok {
			return Summary{}, allot.Errorf(allot.EInvalid, "totals overflow")
		}
	}
	return s, nil
}

// addInt adds with an overflow check.
func addInt(a, b int64) (int64, bool) {
	if (b > 0 && a > math.MaxInt64-b) || (b < 0 && a < math.MinInt64-b) {
		return 0, false
	}
	return a + b, true
}
