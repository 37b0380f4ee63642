package billing

import (
	"slices"

	"github.com/allotlabs/allot/internal/allot"
)

// Adjust bills late data for a closed month. billed are the lines already
// billed for usage in closed: its own lines, and adjustments for it dated in
// later closed months; adjustments dated in open or later months are not
// final and are ignored (the result replaces them). recomputed are the lines
// Lines gives for the closed month's usage now. The result is adjustment
// lines, dated in open (the first open month, after closed), one per usage
// key and corrected kind whose GPU-seconds or amount differ, carrying the
// exact difference, so that for every key, every total and in all:
//
//	billed + adjustments = recomputed
//
// No rounding happens: differences of whole-unit amounts are whole units.
func Adjust(closed YearMonth, billed, recomputed []Line, open YearMonth) ([]Line, error) {
	if !closed.Before(open) {
		return nil, allot.Errorf(allot.EInvalid, "adjustments for %s must be dated in a later month, not %s", closed, open)
	}
	type acc struct {
		line Line
		seen bool // a recomputed line set the rate fields
	}
	idx := map[LineKey]int{}
	var accs []acc
	currency := ""
	add := func(l *Line, sign int64, recomputed bool) error {
		k := l.Key()
		if Month(k.Hour) != closed {
			return allot.Errorf(allot.EInvalid, "line %s: usage is not in %s", k, closed)
		}
		origin := k.Kind
		switch {
		case k.Kind == KindAdjustment && !recomputed:
			if k.Month.Compare(open) >= 0 {
				return nil // not final: replaced by this result
			}
			if !closed.Before(k.Month) {
				return allot.Errorf(allot.EInvalid, "line %s: an adjustment must be dated after %s", k, closed)
			}
			origin = k.Adjusts
		case k.Kind != KindCharge && k.Kind != KindPreemptionCredit:
			return allot.Errorf(allot.EInvalid, "line %s: recomputed lines must be charges or credits", k)
		case k.Month != closed:
			return allot.Errorf(allot.EInvalid, "line %s: billing month is not %s", k, closed)
		}
		if origin != KindCharge && origin != KindPreemptionCredit {
			return allot.Errorf(allot.EInvalid, "line %s: adjusts unknown kind %q", k, origin)
		}
		switch {
		case currency == "":
			currency = l.Amount.Currency
		case l.Amount.Currency != currency:
			return allot.Errorf(allot.EInvalid, "lines mix currencies %s and %s", currency, l.Amount.Currency)
		}
		k.Kind, k.Adjusts, k.Month = KindAdjustment, origin, open
		i, ok := idx[k]
		if !ok {
			i = len(accs)
			idx[k] = i
			accs = append(accs, acc{line: Line{LineKey: k, Amount: allot.Money{Currency: currency}}})
		}
		a := &accs[i]
		var ok1, ok2 bool
		a.line.GPUSeconds, ok1 = addInt(a.line.GPUSeconds, sign*l.GPUSeconds)
		a.line.Amount.Micros, ok2 = addInt(a.line.Amount.Micros, sign*l.Amount.Micros)
		if !ok1 || !ok2 {
			return allot.Errorf(allot.EInvalid, "line %s: adjustment overflows", k)
		}
		// Rate fields come from the recomputed line, else from the billed
		// original; From/To span every contributing line.
		if recomputed || (!a.seen && (!ok || l.Kind != KindAdjustment)) {
			a.line.RateMicros, a.line.MultiplierBP = l.RateMicros, l.MultiplierBP
			a.seen = a.seen || recomputed
		}
		if !l.From.IsZero() && (a.line.From.IsZero() || l.From.Before(a.line.From)) {
			a.line.From = l.From
		}
		if l.To.After(a.line.To) {
			a.line.To = l.To
		}
		return nil
	}
	for i := range billed {
		if err := add(&billed[i], -1, false); err != nil {
			return nil, err
		}
	}
	for i := range recomputed {
		if err := add(&recomputed[i], 1, true); err != nil {
			return nil, err
		}
	}
	out := make([]Line, 0, len(accs))
	for _, a := range accs {
		if a.line.GPUSeconds != 0 || a.line.Amount.Micros != 0 {
			out = append(out, a.line)
		}
	}
	slices.SortFunc(out, CompareLines)
	return out, nil
}
