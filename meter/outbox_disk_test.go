package meter

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// logLines is a logf that keeps what it is given, for any goroutine.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

// with returns the lines holding every one of parts.
func (l *logLines) with(parts ...string) []string {
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

// A disk remounted read-only after an I/O error keeps the outbox's mapped
// pages dirty for good: the events copied into them never reach the disk,
// and the next start does not find them. Each one is logged with its JSON
// for billing by hand, once, and new events are refused (and logged, as
// on a full disk) until a sync succeeds again. They were taken, counted
// as waiting for JetStream, and lost without a line.
func TestOutboxLogsWhatItCouldNotSyncAndRefusesUntilASyncSucceeds(t *testing.T) {
	ob := openTestOutbox(t, t.TempDir(), 0)
	var log logLines
	ob.setLogf(log.logf)
	appendEvents(t, ob, 0, 10)
	waitDurable(t, ob, 10)

	FailOutboxSyncs(ob, syscall.EROFS)
	appendEvents(t, ob, 10, 20)
	checkFor(t, 10*time.Second, time.Millisecond, func() error {
		if got := log.with("DROPPED usage event, not on disk", "read-only file system", "check ClickHouse"); len(got) < 10 {
			return fmt.Errorf("%d events logged as not on disk, want 10: %q", len(got), log.with())
		}
		return nil
	})
	for i := 10; i < 20; i++ {
		id := outboxTestEvent(i).ID
		if got := log.with(`"id":"` + id + `"`); len(got) != 1 {
			t.Errorf("event %s is in %d lines, want 1 with its JSON", id, len(got))
		}
	}
	if err := ob.Append(outboxTestEvent(20)); !errors.Is(err, ErrOutboxUnwritable) {
		t.Fatalf("append while the disk takes nothing: %v, want ErrOutboxUnwritable", err)
	}
	// The failed syncs are retried; what they cover is not logged twice.
	failures := ob.Stats().WriteFailures
	checkFor(t, 10*time.Second, time.Millisecond, func() error {
		if got := ob.Stats().WriteFailures; got < failures+2 {
			return fmt.Errorf("%d failed writes, want %d", got, failures+2)
		}
		return nil
	})
	if got := log.with("DROPPED usage event, not on disk"); len(got) != 10 {
		t.Errorf("%d lines about events not on disk after the syncs were retried, want 10", len(got))
	}
	if st := ob.Stats(); st.Lost != 10 {
		t.Errorf("stats %+v: want the 10 events not on disk counted", st)
	}

	FailOutboxSyncs(ob, nil)
	checkFor(t, 10*time.Second, time.Millisecond, func() error {
		return ob.Append(outboxTestEvent(21))
	})
	if got := log.with("writing to disk again"); len(got) != 1 {
		t.Errorf("lines %q, want one saying the disk takes writes again", log.with())
	}
}

// Under fsync durability an answer waits for its event to be on disk. On
// a disk that takes no write it waited DurableWait (2 s) for nothing,
// every answer, and the gateway logged only the event's id, which cannot
// be billed by hand. The wait ends once the event is logged with its
// JSON.
func TestOutboxReleasesAnFsyncWaitOnceTheEventIsLoggedAsNotOnDisk(t *testing.T) {
	ob, err := OpenOutboxWith(t.TempDir(), OutboxOptions{Durability: DurabilityFsync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	var log logLines
	ob.setLogf(log.logf)
	FailOutboxSyncs(ob, syscall.EIO)
	ev := outboxTestEvent(1)
	done, err := ob.AppendDurable(ev)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the answer still waits for an event its disk will not take; log: %q", log.with())
	}
	if got := log.with("DROPPED usage event, not on disk", `"id":"`+ev.ID+`"`); len(got) != 1 {
		t.Fatalf("released with the event in %d lines, want 1 with its JSON first: %q", len(got), log.with())
	}
}
