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
	// The segment identity fields (job, segment, team, cost center, user,
	// tier, GPU type) are interned once per segment and ranked in key order;
	// pieces then become integer records, sorted by key (counting sort by
	// hour, then within the hour) and merged where keys are equal.
	type ident struct {
		job       int64
		seg       int
		team, cc  string
		user, gpu string
		tier      allot.TierID
	}
	type rec struct {
		hour, rateFrom, multFrom int64
		gs, from, to             int64
		id                       int32 // ident, then its rank
		piece                    int32
		credit                   bool
	}
	if len(pieces) > math.MaxInt32 {
		return nil, allot.Errorf(allot.EInvalid, "too many pieces")
	}
	nseg := 0
	for i := range pieces {
		if i == 0 || pieces[i].Seg != pieces[i-1].Seg {
			nseg++
		}
	}
	identIdx := make(map[ident]int32, nseg)
	idents := make([]ident, 0, nseg)
	recs := make([]rec, len(pieces))
	var lastSeg *Segment
	var id int32
	minHour, maxHour := int64(math.MaxInt64), int64(math.MinInt64)
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
		if s := p.Seg; s != lastSeg {
			ik := ident{s.JobID, s.Segment, s.Team, s.CostCenter, s.User, s.GPUType, s.TierAsRun}
			var ok bool
			if id, ok = identIdx[ik]; !ok {
				id = int32(len(idents))
				identIdx[ik] = id
				idents = append(idents, ik)
			}
			lastSeg = s
		}
		recs[i] = rec{hour: hour, rateFrom: rateFrom(*p.Rate), multFrom: multFrom(*p.Multiplier),
			gs: (b - a) * int64(p.Seg.GPUs), from: a, to: b, id: id, piece: int32(i), credit: p.Kind == KindPreemptionCredit}
		minHour, maxHour = min(minHour, hour), max(maxHour, hour)
	}
	order := make([]int32, len(idents))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(x, y int32) int {
		a, b := &idents[x], &idents[y]
		return cmp.Or(
			strings.Compare(a.team, b.team), strings.Compare(a.cc, b.cc), strings.Compare(a.user, b.user),
			cmp.Compare(a.job, b.job), cmp.Compare(a.seg, b.seg),
			strings.Compare(string(a.tier), string(b.tier)), strings.Compare(a.gpu, b.gpu))
	})
	rank := make([]int32, len(idents))
	for r, i := range order {
		rank[i] = int32(r)
	}
	for i := range recs {
		recs[i].id = rank[recs[i].id]
	}
	// Within an hour: identity rank, versions, kind (charge first): the
	// order of CompareKeys.
	within := func(x, y rec) int {
		c := cmp.Or(cmp.Compare(x.id, y.id), cmp.Compare(x.rateFrom, y.rateFrom), cmp.Compare(x.multFrom, y.multFrom))
		if c == 0 && x.credit != y.credit {
			if x.credit {
				return 1
			}
			return -1
		}
		return c
	}
	if n := len(recs); n > 0 && uint64(maxHour-minHour) < uint64(4*n+1024) {
		// Counting sort by hour, then sort each hour.
		start := make([]int, maxHour-minHour+2)
		for i := range recs {
			start[recs[i].hour-minHour+1]++
		}
		for h := 1; h < len(start); h++ {
			start[h] += start[h-1]
		}
		sorted := make([]rec, n)
		next := slices.Clone(start)
		for i := range recs {
			h := recs[i].hour - minHour
			sorted[next[h]] = recs[i]
			next[h]++
		}
		recs = sorted
		for h := 0; h+1 < len(start); h++ {
			slices.SortFunc(recs[start[h]:start[h+1]], within)
		}
	} else {
		slices.SortFunc(recs, func(x, y rec) int { return cmp.Or(cmp.Compare(x.hour, y.hour), within(x, y)) })
	}
	// Merge equal keys.
	n := 0
	for i := range recs {
		if n > 0 {
			g, r := &recs[n-1], &recs[i]
			if g.hour == r.hour && g.id == r.id && g.rateFrom == r.rateFrom && g.multFrom == r.multFrom && g.credit == r.credit {
				sum, ok := addInt(g.gs, r.gs)
				if !ok {
					return nil, allot.Errorf(allot.EInvalid, "job %d segment %d: GPU-seconds overflow", idents[order[g.id]].job, idents[order[g.id]].seg)
				}
				g.gs, g.from, g.to = sum, min(g.from, r.from), max(g.to, r.to)
				continue
			}
		}
		recs[n] = recs[i]
		n++
	}
	out := make([]Line, n)
	for i := range out {
		g := &recs[i]
		in := &idents[order[g.id]]
		p := &pieces[g.piece]
		h := time.Unix(g.hour*3600, 0).UTC()
		l := &out[i]
		l.LineKey = LineKey{
			Kind: KindCharge, Month: Month(h), Hour: h,
			JobID: in.job, Segment: in.seg, Team: in.team, CostCenter: in.cc, User: in.user,
			Tier: in.tier, GPUType: in.gpu,
			RateFrom: p.Rate.EffectiveFrom, MultiplierFrom: p.Multiplier.EffectiveFrom,
		}
		l.From, l.To = time.Unix(g.from, 0).UTC(), time.Unix(g.to, 0).UTC()
		l.GPUSeconds, l.RateMicros, l.MultiplierBP = g.gs, p.Rate.Micros, p.Multiplier.BP
		if g.credit {
			l.Kind, l.GPUSeconds = KindPreemptionCredit, -g.gs
		}
		m, err := LineAmount(l.GPUSeconds, l.RateMicros, l.MultiplierBP, p.Rate.Currency)
		if err != nil {
			return nil, fmt.Errorf("line %s: %w", l.LineKey, err)
		}
		l.Amount = m
	}
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
