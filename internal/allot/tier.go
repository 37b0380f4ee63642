package allot

import (
	"strconv"
	"strings"
	"time"
)

// TierID names a tier: "1", "2", "3", "4" or "preemptible".
type TierID string

const (
	Tier1           TierID = "1" // production incident retraining
	Tier2           TierID = "2" // scheduled production retraining
	Tier3           TierID = "3" // experiment development/validation
	Tier4           TierID = "4" // exploratory research, sweeps
	TierPreemptible TierID = "preemptible"
)

// Tiers lists every tier in class order.
var Tiers = []TierID{Tier1, Tier2, Tier3, Tier4, TierPreemptible}

// ParseTier accepts "1".."4", "tier3", "preemptible" (any case).
func ParseTier(s string) (TierID, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "tier")
	s = strings.TrimSpace(s)
	for _, t := range Tiers {
		if string(t) == s {
			return t, true
		}
	}
	return "", false
}

// Production reports whether t is a production tier (1 or 2).
func (t TierID) Production() bool { return t == Tier1 || t == Tier2 }

// Class returns the class order: 1..4, and 5 for preemptible.
func (t TierID) Class() int {
	if t == TierPreemptible {
		return 5
	}
	n, _ := strconv.Atoi(string(t))
	return n
}

// TierOfClass is Class's inverse: the tier of class 1..4, preemptible for
// 5; false for any other number.
func TierOfClass(class int) (TierID, bool) {
	switch {
	case class == 5:
		return TierPreemptible, true
	case class >= 1 && class <= 4:
		return TierID(strconv.Itoa(class)), true
	}
	return "", false
}

// Tier is a job class with its rights and price.
type Tier struct {
	ID          TierID
	Name        string
	Description string
	ClassOrder  int // 1 is the most important
	// MayPreempt lists the tiers this tier's jobs may preempt.
	MayPreempt []TierID
	// ReservedGPUs is the GPUs held back for this tier (dedicated reservation).
	ReservedGPUs int
	// MultiplierBP is the billing multiplier in basis points (10000 = ×1.0,
	// 3000 = ×0.3).
	MultiplierBP int
	MaxRuntime   time.Duration
}

// Upper bounds of admin-edited counts. Each is far above any real value
// and well inside the database's integer columns (32 bits), so a typo such
// as 1099511627776 is a field error instead of an out-of-range failure of
// the write (a 500), and sums over a cluster cannot overflow.
const (
	// MaxGPUs bounds any GPU count an admin sets (a tier's reservation,
	// a team's guarantee): a million GPUs is 100 times the largest
	// cluster Allot is built for.
	MaxGPUs = 1_000_000
	// MaxClassOrder bounds a tier's class order (five tiers exist).
	MaxClassOrder = 1000
	// MaxGPUHours bounds GPU-hour settings (budgets, burst thresholds): a
	// billion GPU-hours is a million GPUs for over a century; in GPU-
	// seconds and micro-units of money it still fits 64 bits.
	MaxGPUHours = 1_000_000_000
	// MaxPct bounds budget percentages (a demotion at 10× the budget is
	// already no demotion).
	MaxPct = 1000
	// MaxWeight bounds a team's fair-share weight (the policy's factor
	// weights have the same bound).
	MaxWeight = 1_000_000
	// MaxMemoryGB bounds a GPU type's memory.
	MaxMemoryGB = 1_000_000
	// MaxBurstNodes bounds the burst node count.
	MaxBurstNodes = 100_000
)

// Validate checks the tier's fields.
func (t *Tier) Validate() error {
	f := FieldErrors{}
	if _, ok := ParseTier(string(t.ID)); !ok || string(t.ID) != strings.ToLower(string(t.ID)) {
		f.Add("id", "must be 1, 2, 3, 4 or preemptible")
	}
	if strings.TrimSpace(t.Name) == "" {
		f.Add("name", "is required")
	}
	if t.ClassOrder < 1 || t.ClassOrder > MaxClassOrder {
		f.Add("class_order", "must be between 1 and %d", MaxClassOrder)
	}
	for _, v := range t.MayPreempt {
		if _, ok := ParseTier(string(v)); !ok {
			f.Add("may_preempt", "unknown tier %q", v)
		} else if v.Production() {
			f.Add("may_preempt", "production tiers are never preempted")
		}
	}
	if t.ReservedGPUs < 0 || t.ReservedGPUs > MaxGPUs {
		f.Add("reserved_gpus", "must be between 0 and %d", MaxGPUs)
	}
	if t.MultiplierBP < 0 || t.MultiplierBP > 100000 {
		f.Add("multiplier", "must be between 0 and 10")
	}
	if t.MaxRuntime <= 0 {
		f.Add("max_runtime_s", "must be positive")
	}
	return f.Err()
}

// Multiplier formats MultiplierBP as a decimal, e.g. "0.3".
func (t *Tier) Multiplier() string {
	s := strconv.Itoa(t.MultiplierBP/10000) + "." + strings.TrimRight(padLeft(strconv.Itoa(t.MultiplierBP%10000), 4), "0")
	return strings.TrimSuffix(s, ".")
}

func padLeft(s string, n int) string {
	for len(s) < n {
		s = "0" + s
	}
	return s
}
