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

// A line whose state changed is let through once changed has passed
// since the last, one whose state is the same once every.
func TestLimiterAllowChanged(t *testing.T) {
	var l Limiter
	start := time.Unix(1000, 0)
	for i, tc := range []struct {
		at    time.Duration
		state string
		ok    bool
		held  int
	}{
		{0, "a", true, 0},
		{time.Second, "b", false, 0},     // changed, but within changed
		{2 * time.Second, "a", false, 0}, // the same as the last logged
		{3 * time.Second, "b", true, 2},
		{5 * time.Second, "b", false, 0},
		{13 * time.Second, "b", true, 1}, // every passed
		{14 * time.Second, "c", false, 0},
		{16 * time.Second, "c", true, 1},
	} {
		if ok, held := l.AllowChanged(start.Add(tc.at), 10*time.Second, 3*time.Second, tc.state); ok != tc.ok || held != tc.held {
			t.Errorf("line %d at %v (%s): %v, %d held; want %v, %d", i, tc.at, tc.state, ok, held, tc.ok, tc.held)
		}
	}
	// changed 0: a change goes out at once.
	var now Limiter
	now.AllowChanged(start, time.Minute, 0, "down")
	if ok, _ := now.AllowChanged(start.Add(time.Millisecond), time.Minute, 0, "refused"); !ok {
		t.Error("a changed state held back with changed 0")
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
