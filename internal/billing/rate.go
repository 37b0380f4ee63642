package billing

import (
	"slices"
	"strings"
	"time"

	"github.com/allotlabs/allot/internal/allot"
)

// Rate is one version of a GPU type's price: Micros of Currency per GPU-hour
// at multiplier ×1, in force from EffectiveFrom until the next version.
type Rate struct {
	GPUType       string
	Micros        int64
	Currency      string
	EffectiveFrom time.Time
}

// Multiplier is one version of a tier's billing multiplier in basis points
// (10000 = ×1, 3000 = ×0.3), in force from EffectiveFrom.
type Multiplier struct {
	Tier          allot.TierID
	BP            int
	EffectiveFrom time.Time
}

// MaxRateMicros bounds a rate (one million currency units per GPU-hour).
const MaxRateMicros = 1_000_000 * allot.MicrosPerUnit

// MaxMultiplierBP bounds a multiplier (×10, as allot.Tier does).
const MaxMultiplierBP = 100_000

// RateCard is a validated, indexed set of rate and multiplier versions. Make
// one with NewRateCard; it is immutable and safe for concurrent use.
type RateCard struct {
	currency string
	rates    map[string][]Rate             // by GPU type, by EffectiveFrom
	mults    map[allot.TierID][]Multiplier // by tier, by EffectiveFrom
}

// NewRateCard validates and indexes rates and multipliers (copied; the
// EffectiveFrom instants are floored to the UTC second). All rates must share
// one currency; a GPU type or tier may not have two versions at one instant.
func NewRateCard(rates []Rate, mults []Multiplier) (*RateCard, error) {
	f := allot.FieldErrors{}
	c := &RateCard{rates: map[string][]Rate{}, mults: map[allot.TierID][]Multiplier{}}
	for _, r := range rates {
		r.EffectiveFrom = floorSecond(r.EffectiveFrom)
		r.Currency = strings.ToUpper(r.Currency)
		switch {
		case strings.TrimSpace(r.GPUType) == "":
			f.Add("rates.gpu_type", "is required")
		case r.Micros < 0 || r.Micros > MaxRateMicros:
			f.Add("rates.rate", "%s: must be between 0 and 1000000 per GPU-hour", r.GPUType)
		case !validCurrency(r.Currency):
			f.Add("rates.currency", "%s: must be a three-letter ISO 4217 code", r.GPUType)
		case c.currency != "" && r.Currency != c.currency:
			f.Add("rates.currency", "%s: all rates must be in one currency (%s, not %s)", r.GPUType, c.currency, r.Currency)
		case r.EffectiveFrom.IsZero():
			f.Add("rates.effective_from", "%s: is required", r.GPUType)
		}
		if c.currency == "" && validCurrency(r.Currency) {
			c.currency = r.Currency
		}
		c.rates[r.GPUType] = append(c.rates[r.GPUType], r)
	}
	for _, m := range mults {
		m.EffectiveFrom = floorSecond(m.EffectiveFrom)
		switch {
		case !validTier(m.Tier):
			f.Add("multipliers.tier", "unknown tier %q", m.Tier)
		case m.BP < 0 || m.BP > MaxMultiplierBP:
			f.Add("multipliers.multiplier", "tier %s: must be between 0 and 10", m.Tier)
		case m.EffectiveFrom.IsZero():
			f.Add("multipliers.effective_from", "tier %s: is required", m.Tier)
		}
		c.mults[m.Tier] = append(c.mults[m.Tier], m)
	}
	for g, rs := range c.rates {
		slices.SortStableFunc(rs, func(a, b Rate) int { return a.EffectiveFrom.Compare(b.EffectiveFrom) })
		for i := 1; i < len(rs); i++ {
			if rs[i].EffectiveFrom.Equal(rs[i-1].EffectiveFrom) {
				f.Add("rates.effective_from", "%s: two rates effective at %s", g, rs[i].EffectiveFrom.Format(time.RFC3339))
			}
		}
	}
	for t, ms := range c.mults {
		slices.SortStableFunc(ms, func(a, b Multiplier) int { return a.EffectiveFrom.Compare(b.EffectiveFrom) })
		for i := 1; i < len(ms); i++ {
			if ms[i].EffectiveFrom.Equal(ms[i-1].EffectiveFrom) {
				f.Add("multipliers.effective_from", "tier %s: two multipliers effective at %s", t, ms[i].EffectiveFrom.Format(time.RFC3339))
			}
		}
	}
	if err := f.Err(); err != nil {
		return nil, err
	}
	return c, nil
}

// Currency returns the rate card's currency ("" when it has no rates).
func (c *RateCard) Currency() string { return c.currency }

// RateAt returns the rate version for gpuType in force at t.
func (c *RateCard) RateAt(gpuType string, t time.Time) (Rate, bool) {
	rs := c.rates[gpuType]
	i := versionAt(rs, t.Unix(), func(r Rate) int64 { return r.EffectiveFrom.Unix() })
	if i < 0 {
		return Rate{}, false
	}
	return rs[i], true
}

// MultiplierAt returns the multiplier version for tier in force at t.
func (c *RateCard) MultiplierAt(tier allot.TierID, t time.Time) (Multiplier, bool) {
	ms := c.mults[tier]
	i := versionAt(ms, t.Unix(), func(m Multiplier) int64 { return m.EffectiveFrom.Unix() })
	if i < 0 {
		return Multiplier{}, false
	}
	return ms[i], true
}

// versionAt returns the index of the last version effective at or before
// sec, or -1.
func versionAt[T any](vs []T, sec int64, from func(T) int64) int {
	i, _ := slices.BinarySearchFunc(vs, sec+1, func(v T, s int64) int {
		f := from(v)
		switch {
		case f < s:
			return -1
		case f > s:
			return 1
		}
		return 0
	})
	// i is the first version with from >= sec+1, i.e. from > sec.
	return i - 1
}

// CheckEffective rejects a rate or multiplier change effective before the
// first open month: closed months never change, so policy may not be
// backdated into them.
func CheckEffective(effectiveFrom time.Time, firstOpen YearMonth) error {
	if effectiveFrom.Before(firstOpen.Start()) {
		return allot.Errorf(allot.EConflict, "a change effective %s would be backdated into a closed month (first open month is %s)",
			effectiveFrom.UTC().Format(time.RFC3339), firstOpen)
	}
	return nil
}

// RoundingUnit returns the micro-units in one minor unit of currency: the
// amount every line is rounded to. 10 000 (a cent) for two-decimal
// currencies, 1 000 000 for zero-decimal ones, 1 000 for three-decimal ones.
func RoundingUnit(currency string) int64 {
	switch strings.ToUpper(currency) {
	case "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND", "VUV", "XAF", "XOF", "XPF":
		return 1_000_000
	case "BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND":
		return 1_000
	}
	return 10_000
}

func validCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	return true
}

func validTier(t allot.TierID) bool {
	p, ok := allot.ParseTier(string(t))
	return ok && p == t
}

// floorSecond floors t to its UTC second (zero stays zero).
func floorSecond(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return time.Unix(t.Unix(), 0).UTC()
}
