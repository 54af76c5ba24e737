package loglimit

import (
	"testing"
	"time"
)

// A Limiter lets the first line through, then one an interval, and says
// how many it held back in between.
func TestLimiter(t *testing.T) {
	var l Limiter
	start := time.Unix(1000, 0)
	for i, tc := range []struct {
		at   time.Duration
		ok   bool
		held int
	}{
		{0, true, 0},
		{time.Second, false, 0},
		{9 * time.Second, false, 0},
		{10 * time.Second, true, 2},
		{11 * time.Second, false, 0},
		{25 * time.Second, true, 1},
		{40 * time.Second, true, 0},
	} {
		if ok, held := l.Allow(start.Add(tc.at), 10*time.Second); ok != tc.ok || held != tc.held {
			t.Errorf("line %d at %v: %v, %d held; want %v, %d", i, tc.at, ok, held, tc.ok, tc.held)
		}
	}
}

func TestHeldNote(t *testing.T) {
	if got := HeldNote(0, "calls"); got != "" {
		t.Errorf("none held: %q", got)
	}
	if got := HeldNote(3, "calls since the last such line"); got != " (and 3 more calls since the last such line)" {
		t.Errorf("3 held: %q", got)
	}
}
