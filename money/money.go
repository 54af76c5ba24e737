// Package money holds exact USD amounts. Nothing here touches float64: costs
// are integers of nano-USD and prices integers of atto-USD per unit, parsed
// from and printed as decimal strings.
package money

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Nanos is an amount of USD in units of 1e-9 (nano-USD). int64 holds about
// ±9.2 billion USD, far beyond any balance.
type Nanos int64

// NanosPerUSD is one dollar.
const NanosPerUSD Nanos = 1_000_000_000

// Price is USD per unit (token, image, request) in units of 1e-18 (atto-USD),
// so prices such as 0.0375 USD per 1M tokens (3.75e-8 per token) are exact.
// uint64 caps one unit's price at MaxPrice, about 18.45 USD.
type Price uint64

// MaxPrice is the largest price per unit: 2⁶⁴−1 atto-USD,
// 18.446744073709551615 USD. A larger one is refused when parsed.
const MaxPrice = Price(math.MaxUint64)

// MaxEventCost is the most one usage event may cost, a million USD. The
// billing consumer refuses a costlier event (logs it, never charges it):
// summed with the other events of its message it could overflow and void
// their debits. The prices gateway.yaml accepts keep a call under it
// (config's maxCallCost), since a refused event leaves its call unbilled.
const MaxEventCost = 1_000_000 * NanosPerUSD

const (
	nanoDigits  = 9
	attoDigits  = 18
	attoPerNano = 1_000_000_000
)

// ErrNotDecimal is returned for amounts that are not plain decimals like
// "12", "0.5" or "-3.25": write the amount as a quoted decimal string in
// gateway.yaml or the API, without exponents or thousands separators.
var ErrNotDecimal = errors.New("not a plain decimal number")

// errTooLarge is returned by parseFixed for an amount its integer cannot
// hold; each caller says what its largest amount is.
var errTooLarge = errors.New("too large")

// parseFixed parses a decimal string into an integer scaled by 10^digits.
func parseFixed(s string, digits int, allowNegative bool) (neg bool, v uint64, err error) {
	if s == "" {
		return false, 0, ErrNotDecimal
	}
	if s[0] == '-' || s[0] == '+' {
		neg = s[0] == '-'
		s = s[1:]
		if neg && !allowNegative {
			return false, 0, errors.New("must not be negative")
		}
	}
	intPart, frac, hasDot := strings.Cut(s, ".")
	if intPart == "" && frac == "" || hasDot && frac == "" && intPart == "" {
		return false, 0, ErrNotDecimal
	}
	for _, c := range intPart + frac {
		if c < '0' || c > '9' {
			return false, 0, ErrNotDecimal
		}
	}
	frac = strings.TrimRight(frac, "0")
	if len(frac) > digits {
		return false, 0, fmt.Errorf("more than %d decimal places", digits)
	}
	var whole uint64
	if intPart != "" {
		whole, err = strconv.ParseUint(intPart, 10, 64)
		if err != nil {
			return false, 0, errTooLarge
		}
	}
	scale := pow10(digits)
	hi, lo := bits.Mul64(whole, scale)
	if hi != 0 {
		return false, 0, errTooLarge
	}
	var f uint64
	if frac != "" {
		f, _ = strconv.ParseUint(frac, 10, 64)
		f *= pow10(digits - len(frac))
	}
	sum, carry := bits.Add64(lo, f, 0)
	if carry != 0 {
		return false, 0, errTooLarge
	}
	return neg, sum, nil
}

func pow10(n int) uint64 {
	p := uint64(1)
	for range n {
		p *= 10
	}
	return p
}

// ParseUSD parses a decimal USD amount with at most 9 decimal places.
func ParseUSD(s string) (Nanos, error) {
	neg, v, err := parseFixed(strings.TrimSpace(s), nanoDigits, true)
	if err != nil {
		return 0, fmt.Errorf("USD amount %q: %w", s, err)
	}
	if v > math.MaxInt64 {
		return 0, fmt.Errorf("USD amount %q: too large", s)
	}
	if neg {
		return -Nanos(v), nil
	}
	return Nanos(v), nil
}

// String prints the amount as a decimal with nine places, e.g. "-1.500000000".
func (n Nanos) String() string {
	neg := n < 0
	u := uint64(n)
	if neg {
		u = uint64(-n)
	}
	s := strconv.FormatUint(u/uint64(NanosPerUSD), 10) + "." + fmt.Sprintf("%09d", u%uint64(NanosPerUSD))
	if neg {
		return "-" + s
	}
	return s
}

// ParsePrice parses a non-negative decimal USD price per unit with at most 18
// decimal places, up to MaxPrice.
func ParsePrice(s string) (Price, error) {
	_, v, err := parseFixed(strings.TrimSpace(s), attoDigits, false)
	if errors.Is(err, errTooLarge) {
		return 0, fmt.Errorf("price %q: %w: the largest price is %s USD per unit", s, err, MaxPrice)
	}
	if err != nil {
		return 0, fmt.Errorf("price %q: %w", s, err)
	}
	return Price(v), nil
}

// String prints the price as the shortest exact decimal, e.g. "0.00000015".
func (p Price) String() string {
	whole := uint64(p) / pow10(attoDigits)
	frac := uint64(p) % pow10(attoDigits)
	if frac == 0 {
		return strconv.FormatUint(whole, 10)
	}
	fs := strings.TrimRight(fmt.Sprintf("%018d", frac), "0")
	return strconv.FormatUint(whole, 10) + "." + fs
}

// Atto accumulates exact amounts in atto-USD as a 128-bit integer, so a sum
// of count×price terms never rounds until it is converted to Nanos once.
type Atto struct{ hi, lo uint64 }

// Add adds count units at price p.
func (a *Atto) Add(count int64, p Price) {
	if count <= 0 || p == 0 {
		return
	}
	hi, lo := bits.Mul64(uint64(count), uint64(p))
	var c uint64
	a.lo, c = bits.Add64(a.lo, lo, 0)
	a.hi, _ = bits.Add64(a.hi, hi, c)
}

// Nanos converts the sum to nano-USD, rounding a remainder of half a
// nano-dollar or more up. It saturates at the largest Nanos.
func (a Atto) Nanos() Nanos {
	if a.hi >= attoPerNano {
		return math.MaxInt64
	}
	q, r := bits.Div64(a.hi, a.lo, attoPerNano)
	if r >= attoPerNano/2 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return Nanos(q)
}

// LargestPrice is the highest price per unit at which count units cost at
// most budget: rounded down to the atto-USD, so that Atto's sum of count
// units at it, rounded to the nano-dollar, stays within budget. It is 0
// for a budget below 0 and MaxPrice for count 0 or a price beyond it.
func LargestPrice(budget Nanos, count int64) Price {
	switch {
	case budget < 0:
		return 0
	case count <= 0:
		return MaxPrice
	}
	hi, lo := bits.Mul64(uint64(budget), attoPerNano)
	if hi >= uint64(count) {
		return MaxPrice
	}
	q, _ := bits.Div64(hi, lo, uint64(count))
	return Price(q)
}
