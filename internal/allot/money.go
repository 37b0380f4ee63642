package allot

import (
	"fmt"
	"strconv"
	"strings"
)

// Money is an exact amount in micro-units (millionths) of a currency. It is
// never a float: rates, charges and totals are integer arithmetic.
type Money struct {
	Micros   int64
	Currency string // ISO 4217, e.g. "USD"
}

// MicrosPerUnit is the number of micro-units in one currency unit.
const MicrosPerUnit = 1_000_000

// ParseMoney parses "2.50" or "2.5 USD" style decimal text into Money with
// at most six decimal places. currency is used when s names none.
func ParseMoney(s, currency string) (Money, error) {
	s = strings.TrimSpace(s)
	if f := strings.Fields(s); len(f) == 2 {
		s, currency = f[0], f[1]
	}
	if !validCurrency(currency) {
		return Money{}, fmt.Errorf("currency must be a three-letter ISO 4217 code, got %q", currency)
	}
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" || len(frac) > 6 || !digits(whole) || (frac != "" && !digits(frac)) {
		return Money{}, fmt.Errorf("amount must be a decimal number with at most 6 decimal places, got %q", s)
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > (1<<62)/MicrosPerUnit {
		return Money{}, fmt.Errorf("amount %q is too large", s)
	}
	frac += strings.Repeat("0", 6-len(frac))
	fr, _ := strconv.ParseInt(frac, 10, 64)
	m := w*MicrosPerUnit + fr
	if neg {
		m = -m
	}
	return Money{Micros: m, Currency: strings.ToUpper(currency)}, nil
}

func digits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

func validCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for _, r := range strings.ToUpper(c) {
		if r < 'A' || r > 'Z' {
			return false
		}
	}
	return true
}

// String formats the amount with two decimals when exact, else all needed
// decimals: "2.50 USD", "0.123456 USD".
func (m Money) String() string {
	return m.Decimal() + " " + m.Currency
}

// Decimal formats the amount without currency, keeping at least 2 decimals.
func (m Money) Decimal() string {
	v := m.Micros
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	frac := fmt.Sprintf("%06d", v%MicrosPerUnit)
	frac = strings.TrimRight(frac, "0")
	for len(frac) < 2 {
		frac += "0"
	}
	return fmt.Sprintf("%s%d.%s", sign, v/MicrosPerUnit, frac)
}
