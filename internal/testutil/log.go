package testutil

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// Log is a logf that keeps its lines, for any goroutine: pass its Logf
// where the code under test logs.
type Log struct {
	// T, when set, is given every line too (t.Logf), to read in the
	// test's output.
	T     testing.TB
	mu    sync.Mutex
	lines []string
}

// Logf keeps the line format and args make.
func (l *Log) Logf(format string, args ...any) {
	if l.T != nil {
		l.T.Logf(format, args...)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

// Matching is the lines holding every one of parts, in the order logged;
// with no parts, all of them.
func (l *Log) Matching(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, line := range l.lines {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// Count is how many lines hold every one of parts.
func (l *Log) Count(parts ...string) int { return len(l.Matching(parts...)) }

// String is every line, one a line.
func (l *Log) String() string { return strings.Join(l.Matching(), "\n") }
