package money

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestParseUSD(t *testing.T) {
	for in, want := range map[string]Nanos{
		"10.00": 10 * NanosPerUSD, "0.000000001": 1, "-1.5": -1_500_000_000, "5": 5 * NanosPerUSD,
		".25": 250_000_000, "0": 0, "1.100000000": 1_100_000_000,
	} {
		got, err := ParseUSD(in)
		if err != nil || got != want {
			t.Errorf("ParseUSD(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "abc", "1e3", "1,000", "0.0000000001", "1.2.3", "99999999999999999999", "-", "."} {
		if _, err := ParseUSD(bad); err == nil {
			t.Errorf("ParseUSD(%q) accepted", bad)
		}
	}
}

func TestNanosString(t *testing.T) {
	for n, want := range map[Nanos]string{0: "0.000000000", 1: "0.000000001", -1_500_000_000: "-1.500000000", 12 * NanosPerUSD: "12.000000000"} {
		if got := n.String(); got != want {
			t.Errorf("%d.String() = %s, want %s", n, got, want)
		}
	}
}

func TestPriceRoundTrip(t *testing.T) {
	for _, s := range []string{"0.00000015", "0.0000000375", "2", "0.000000000000000001", "18"} {
		p, err := ParsePrice(s)
		if err != nil || p.String() != s {
			t.Errorf("%s -> %d %v -> %s", s, p, err, p.String())
		}
	}
	if _, err := ParsePrice("-1"); err == nil {
		t.Error("negative price accepted")
	}
	if _, err := ParsePrice("19"); err == nil {
		t.Error("price above 18.4 USD per unit accepted")
	}
}

// A price over the ceiling said only "too large": 18.5 USD per unit was
// refused without saying what would be accepted.
func TestPriceTooLargeNamesTheLargest(t *testing.T) {
	if p, err := ParsePrice("18.446744073709551615"); err != nil || p != MaxPrice {
		t.Fatalf("the largest price: %d %v, want %d", p, err, MaxPrice)
	}
	for _, s := range []string{"18.446744073709551616", "18.5", "19", "100000000000000000000"} {
		_, err := ParsePrice(s)
		want := fmt.Sprintf("price %q: too large: the largest price is 18.446744073709551615 USD per unit", s)
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("ParsePrice(%q): %v, want %q…", s, err, want)
		}
	}
}

// Sub-nano remainders add up exactly before the one rounding: three tokens
// at 0.0375 USD per 1M cost 112.5 nano-USD, rounded half up to 113.
func TestAttoSumsExactlyAndRoundsOnce(t *testing.T) {
	p, _ := ParsePrice("0.0000000375")
	var a Atto
	a.Add(3, p)
	if got := a.Nanos(); got != 113 {
		t.Fatalf("got %d", got)
	}
	var b Atto
	for range 1000 {
		b.Add(1, p) // 37.5 nano-USD each
	}
	if got := b.Nanos(); got != 37_500 {
		t.Fatalf("got %d", got)
	}
	var big Atto
	big.Add(math.MaxInt64, Price(math.MaxUint64))
	if big.Nanos() != math.MaxInt64 {
		t.Fatal("overflow does not saturate")
	}
}

// LargestPrice is what config names as the largest price of a term of a
// call's cost: count units at it stay within the budget, and at one
// atto-USD more they exceed it, before rounding.
func TestLargestPriceFitsTheBudget(t *testing.T) {
	for _, tc := range []struct {
		budget Nanos
		count  int64
		want   string
	}{
		{MaxEventCost, 100_000_000, "0.01"},
		{MaxEventCost, 419_430, "2.384188064754547838"},
		{10 * NanosPerUSD, 3, "3.333333333333333333"},
		{1, 1, "0.000000001"},
		{0, 5, "0"},
		{-1, 5, "0"},
		{MaxEventCost, 1, MaxPrice.String()}, // beyond any price
		{MaxEventCost, 0, MaxPrice.String()},
	} {
		if got := LargestPrice(tc.budget, tc.count).String(); got != tc.want {
			t.Errorf("LargestPrice(%s, %d) = %s, want %s", tc.budget, tc.count, got, tc.want)
		}
	}
}
