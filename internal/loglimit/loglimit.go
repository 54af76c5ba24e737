// Package loglimit holds back log lines that repeat: the first goes out,
// then at most one an interval, with a count of those held back. An
// error that comes with every call or connection (a collector down, a
// malformed request, an upstream's bad usage report, a full file table)
// otherwise writes a line each, thousands a second.
package loglimit

import (
	"fmt"
	"sync"
	"time"
)

// Limiter lets a first line through, then at most one an interval, and
// counts those it held back. Its zero value is ready; safe for
// concurrent use.
type Limiter struct {
	mu     sync.Mutex
	logged time.Time // when the last line was logged
	next   time.Time // when the next line may be logged
	state  string    // what the last line logged said, for AllowChanged
	held   int       // lines held back since the last logged
}

// Allow reports whether a line may be logged at now, and if so how many
// were held back since the last one that was.
func (l *Limiter) Allow(now time.Time, every time.Duration) (ok bool, held int) {
	return l.AllowChanged(now, every, every, "")
}

// AllowChanged is Allow for a line that says a state (a free space, an
// outage or a mistake): besides once every, a line whose state differs
// from the last logged one's may be logged once changed has passed since
// that one (0: at once). An operator mending something then sees it
// take, and a line that repeats itself still comes only once every.
func (l *Limiter) AllowChanged(now time.Time, every, changed time.Duration, state string) (ok bool, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) && (state == l.state || now.Before(l.logged.Add(changed))) {
		l.held++
		return false, 0
	}
	held, l.held = l.held, 0
	l.logged, l.next, l.state = now, now.Add(every), state
	return true, held
}

// HeldNote is what a line let through adds for the held lines before it:
// " (and N more WHAT)", or nothing when none was held.
func HeldNote(held int, what string) string {
	if held == 0 {
		return ""
	}
	return fmt.Sprintf(" (and %d more %s)", held, what)
}
