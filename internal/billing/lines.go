package billing

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// LineKey identifies a charge line: a rollup upserts lines on it. Times are
// UTC whole seconds (use Line.Key to get a normalized key).
type LineKey struct {
	Kind Kind
	// Adjusts is, on an adjustment line, the kind of line it corrects
	// (charge or preemption_credit); "" otherwise.
	Adjusts Kind
	// Month is the billing month the line belongs to: the month of Hour,
	// except for adjustments, which are dated in the first open month.
	Month          YearMonth
	Hour           time.Time // UTC start of the hour the usage happened in
	JobID          int64
	Segment        int
	Team           string
	CostCenter     string
	User           string
	Tier           allot.TierID
	GPUType        string
	RateFrom       time.Time // rate version
	MultiplierFrom time.Time // multiplier version
}

// Line is a charge line: usage of one job segment in one hour under one rate
// and multiplier version, priced once.
type Line struct {
	LineKey
	// From and To bound the usage the line covers (earliest piece start,
	// latest piece end); informational, not part of the key.
	From, To time.Time
	// GPUSeconds is negative on credit lines; on adjustments it is the
	// correction (either sign).
	GPUSeconds   int64
	RateMicros   int64 // per GPU-hour at ×1
	MultiplierBP int
	// Amount is in micro-units, always a whole number of RoundingUnit:
	// positive on charges, negative on credits, either sign on adjustments.
	Amount allot.Money
}

// Key returns the line's key with its times normalized to UTC seconds.
func (l *Line) Key() LineKey {
	k := l.LineKey
	k.Hour = floorSecond(k.Hour)
	k.RateFrom = floorSecond(k.RateFrom)
	k.MultiplierFrom = floorSecond(k.MultiplierFrom)
	return k
}

// String renders the key deterministically, e.g.
// charge|2026-03|2026-03-01T05:00:00Z|42/1|"ml"|"cc-7"|"ada@x"|3|"H100"|<rate>|<mult>.
func (k LineKey) String() string {
	var b strings.Builder
	b.WriteString(string(k.Kind))
	if k.Adjusts != "" {
		b.WriteString(":" + string(k.Adjusts))
	}
	ts := func(t time.Time) string { return floorSecond(t).Format(time.RFC3339) }
	fmt.Fprintf(&b, "|%s|%s|%d/%d|%s|%s|%s|%s|%s|%s|%s", k.Month, ts(k.Hour), k.JobID, k.Segment,
		strconv.Quote(k.Team), strconv.Quote(k.CostCenter), strconv.Quote(k.User), k.Tier,
		strconv.Quote(k.GPUType), ts(k.RateFrom), ts(k.MultiplierFrom))
	return b.String()
}

// Lines aggregates pieces (from Split) into lines: GPU-seconds are summed per
// LineKey, then each line is priced once (see LineAmount). The result is
// sorted by CompareLines and does not depend on the order of pieces or on
// how segments were cut within one key.
func Lines(pieces []Piece) ([]Line, error) {
	idx := make(map[LineKey]int, len(pieces)/2+1)
	out := make([]Line, 0, len(pieces)/2+1)
	for i := range pieces {
		p := &pieces[i]
		if p.Seg == nil || p.Rate == nil || p.Multiplier == nil {
			return nil, allot.Errorf(allot.EInvalid, "piece %d: not made by Split", i)
		}
		a, b := p.Start.Unix(), p.End.Unix()
		hour := floorDiv(a, 3600)
		if b <= a || floorDiv(b-1, 3600) != hour || (p.Kind != KindCharge && p.Kind != KindPreemptionCredit) {
			return nil, allot.Errorf(allot.EInvalid, "piece %d: not made by Split", i)
		}
		s := p.Seg
		h := time.Unix(hour*3600, 0).UTC()
		k := LineKey{
			Kind: p.Kind, Month: Month(h), Hour: h,
			JobID: s.JobID, Segment: s.Segment, Team: s.Team, CostCenter: s.CostCenter, User: s.User,
			Tier: s.TierAsRun, GPUType: s.GPUType,
			RateFrom: p.Rate.EffectiveFrom, MultiplierFrom: p.Multiplier.EffectiveFrom,
		}
		gs := (b - a) * int64(s.GPUs)
		j, ok := idx[k]
		if !ok {
			idx[k] = len(out)
			out = append(out, Line{
				LineKey: k, From: p.Start, To: p.End, GPUSeconds: gs,
				RateMicros: p.Rate.Micros, MultiplierBP: p.Multiplier.BP,
				Amount: allot.Money{Currency: p.Rate.Currency},
			})
			continue
		}
		l := &out[j]
		sum, carry := bits.Add64(uint64(l.GPUSeconds), uint64(gs), 0)
		if carry != 0 || sum > math.MaxInt64 {
			return nil, allot.Errorf(allot.EInvalid, "line %s: GPU-seconds overflow", k)
		}
		l.GPUSeconds = int64(sum)
		if p.Start.Before(l.From) {
			l.From = p.Start
		}
		if p.End.After(l.To) {
			l.To = p.End
		}
	}
	for i := range out {
		l := &out[i]
		if l.Kind == KindPreemptionCredit {
			l.GPUSeconds = -l.GPUSeconds
		}
		m, err := LineAmount(l.GPUSeconds, l.RateMicros, l.MultiplierBP, l.Amount.Currency)
		if err != nil {
			return nil, fmt.Errorf("line %s: %w", l.LineKey, err)
		}
		l.Amount = m
	}
	slices.SortFunc(out, CompareLines)
	return out, nil
}

// LineAmount prices gpuSeconds at rateMicros per GPU-hour and multiplierBP:
//
//	gpuSeconds × rateMicros × multiplierBP / (3600 × 10000)
//
// in exact 128-bit integer arithmetic, rounded once, half up (ties away from
// zero), to RoundingUnit(currency) micro-units. Negative gpuSeconds give the
// negated amount of the magnitude. Errors only on overflow or negative rate
// or multiplier.
func LineAmount(gpuSeconds, rateMicros int64, multiplierBP int, currency string) (allot.Money, error) {
	if rateMicros < 0 || multiplierBP < 0 {
		return allot.Money{}, allot.Errorf(allot.EInvalid, "rate and multiplier must not be negative")
	}
	neg := gpuSeconds < 0
	n := uint64(gpuSeconds)
	if neg {
		n = -n // two's complement magnitude, correct for MinInt64 too
	}
	unit := RoundingUnit(currency)
	q, ok := mulDivRound(n, uint64(rateMicros), uint64(multiplierBP), uint64(3600*10000*unit))
	if !ok || q > uint64(math.MaxInt64/unit) {
		return allot.Money{}, allot.Errorf(allot.EInvalid, "amount overflows")
	}
	v := int64(q) * unit
	if neg {
		v = -v
	}
	return allot.Money{Micros: v, Currency: currency}, nil
}

// mulDivRound returns round_half_up(a×b×c / d) for d > 0, or false when the
// product or the quotient does not fit.
func mulDivRound(a, b, c, d uint64) (uint64, bool) {
	h1, l1 := bits.Mul64(a, b)
	h2, l2 := bits.Mul64(l1, c)
	h3, l3 := bits.Mul64(h1, c)
	if h3 != 0 {
		return 0, false
	}
	hi, carry := bits.Add64(h2, l3, 0)
	if carry != 0 || hi >= d {
		return 0, false
	}
	q, r := bits.Div64(hi, l2, d)
	if r >= d-r { // 2r >= d without overflow
		if q == math.MaxUint64 {
			return 0, false
		}
		q++
	}
	return q, true
}

var kindRank = map[Kind]int{KindCharge: 0, KindPreemptionCredit: 1, KindAdjustment: 2}

func compareKind(a, b Kind) int {
	ra, oka := kindRank[a]
	rb, okb := kindRank[b]
	if oka && okb {
		return cmp.Compare(ra, rb)
	}
	if oka != okb {
		if oka {
			return -1
		}
		return 1
	}
	return strings.Compare(string(a), string(b))
}

// CompareKeys is a total order on keys: month, hour, team, cost center,
// user, job, segment, tier, GPU type, rate and multiplier versions, kind.
func CompareKeys(a, b LineKey) int {
	if c := a.Month.Compare(b.Month); c != 0 {
		return c
	}
	if c := a.Hour.Compare(b.Hour); c != 0 {
		return c
	}
	if c := cmp.Or(
		strings.Compare(a.Team, b.Team),
		strings.Compare(a.CostCenter, b.CostCenter),
		strings.Compare(a.User, b.User),
		cmp.Compare(a.JobID, b.JobID),
		cmp.Compare(a.Segment, b.Segment),
		strings.Compare(string(a.Tier), string(b.Tier)),
		strings.Compare(a.GPUType, b.GPUType),
		a.RateFrom.Compare(b.RateFrom),
		a.MultiplierFrom.Compare(b.MultiplierFrom),
		compareKind(a.Kind, b.Kind),
	); c != 0 {
		return c
	}
	return compareKind(a.Adjusts, b.Adjusts)
}

// CompareLines orders lines by key, then by the remaining fields, so that
// sorting any slice of lines is deterministic.
func CompareLines(a, b Line) int {
	if c := CompareKeys(a.LineKey, b.LineKey); c != 0 {
		return c
	}
	return cmp.Or(
		cmp.Compare(a.GPUSeconds, b.GPUSeconds),
		cmp.Compare(a.Amount.Micros, b.Amount.Micros),
		strings.Compare(a.Amount.Currency, b.Amount.Currency),
		cmp.Compare(a.RateMicros, b.RateMicros),
		cmp.Compare(a.MultiplierBP, b.MultiplierBP),
		a.From.Compare(b.From),
		a.To.Compare(b.To),
	)
}
