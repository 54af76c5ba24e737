package broker

import (
	"fmt"
	"sync"
	"time"
)

// connLogEvery is how often at most a line about the client connection
// (an error, a disconnection, a reconnection) is logged.
const connLogEvery = 10 * time.Second

// connLog writes the lines about one client connection: the first at
// once, then at most one every `every`. A server that refuses each
// reconnection (a client certificate required, an authorization
// violation) had the gateway, `tollgate billing` and `tollgate worker`
// log its error about once a second for as long as it lasted.
//
// Unlike loglimit.Limiter it does not wait for a next line to say what it
// left out: at the end of a window it writes the latest line it held
// back, with how many others it left out, so the last line logged is
// always the connection's latest state (a held-back "reconnected" after a
// logged "disconnected" read as an outage that never ended). Safe for
// concurrent use.
type connLog struct {
	logf  func(string, ...any)
	every time.Duration

	mu       sync.Mutex
	next     time.Time // when a line may be written at once
	held     int       // lines left out since the last written
	latest   string    // the latest of them, written when the window ends
	latestAt time.Time // when it came: written late, it says so
	flush    *time.Timer
	closed   bool
}

func newConnLog(logf func(string, ...any), every time.Duration) *connLog {
	return &connLog{logf: logf, every: every}
}

func (c *connLog) printf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	now := time.Now()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if now.Before(c.next) {
		c.held++
		c.latest, c.latestAt = line, now
		if c.flush == nil {
			c.flush = time.AfterFunc(c.next.Sub(now), c.flushHeld)
		}
		c.mu.Unlock()
		return
	}
	c.next = now.Add(c.every)
	if c.held > 0 {
		// The window ended and its flush has not run yet: the held lines
		// are older than this one, and written after it they made the
		// log's last line an older state. This one goes out as the
		// latest of them, and the flush finds nothing.
		c.held++
		c.latest = line
		line = c.takeHeldLocked()
		if c.flush != nil {
			c.flush.Stop()
			c.flush = nil
		}
	}
	c.mu.Unlock()
	c.logf("%s", line)
}

// flushHeld writes the latest line held back, and starts a new window:
// lines that keep coming are written one a window.
func (c *connLog) flushHeld() {
	c.mu.Lock()
	if time.Now().Before(c.next) {
		// A timer printf stopped too late: that line took the held
		// ones, and a newer window may have its own timer.
		c.mu.Unlock()
		return
	}
	c.flush = nil
	line := c.takeHeldLocked()
	if line != "" {
		c.next = time.Now().Add(c.every)
	}
	c.mu.Unlock()
	if line != "" {
		c.logf("%s", line)
	}
}

// close writes what is held back at once and writes nothing after:
// a test's logf must not be called once its test ended, nor a line be
// lost when a process exits.
func (c *connLog) close() {
	c.mu.Lock()
	if c.flush != nil {
		c.flush.Stop()
		c.flush = nil
	}
	c.closed = true
	line := c.takeHeldLocked()
	c.mu.Unlock()
	if line != "" {
		c.logf("%s", line)
	}
}

// takeHeldLocked is the line to write for what is held back, empty when
// nothing is. c.mu must be held.
func (c *connLog) takeHeldLocked() string {
	if c.held == 0 {
		return ""
	}
	line := c.latest
	// A held line goes out up to a window after it came: without its own
	// time, a "reconnected" 40 ms after a node was killed read as a 10 s
	// outage in the log.
	if late := time.Since(c.latestAt); late >= time.Second {
		line += " (at " + c.latestAt.UTC().Format("2006-01-02T15:04:05.000Z07:00") + ", " + late.Round(time.Second).String() + " ago)"
	}
	if c.held > 1 {
		line += fmt.Sprintf(" (the latest of %d lines about the nats connection in the last %s, the others left out: at most one is logged every %s)", c.held, c.every, c.every)
	}
	c.held, c.latest = 0, ""
	return line
}
