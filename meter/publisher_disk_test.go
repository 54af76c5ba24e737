package meter_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/meter"
)

// keptLog is a logf that keeps its lines, for any goroutine.
type keptLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *keptLog) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

// count is how many lines hold every one of parts.
func (l *keptLog) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, line := range l.lines {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		n++
	}
	return n
}

func (l *keptLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// A gateway whose data dir went read-only, with NATS unreachable, said at
// shutdown that the events it could not write "stay in the outbox for the
// next start", which did not find them: billed nowhere, logged nowhere.
// Each is logged with its JSON when its sync fails, later ones are refused
// and logged, and the shutdown says they are not kept.
func TestPublisherOnAReadOnlyDiskLogsEveryEventAndKeepsNoneForTheNextStart(t *testing.T) {
	srv := startNATSServer(t)
	gw := connectNATS(t, srv.url())
	if _, err := meter.EnsureUsageStream(testContext(t), gw.JetStream(), 1, 0); err != nil {
		t.Fatal(err)
	}
	srv.stop()
	ob, err := meter.OpenOutbox(filepath.Join(t.TempDir(), "outbox"), 0)
	if err != nil {
		t.Fatal(err)
	}
	var log keptLog
	p := meter.NewPublisher(gw.JetStream(), ob, log.logf)
	meter.FailOutboxSyncs(ob, syscall.EROFS)
	for i := range 5 {
		p.Record(usageEvent(i))
	}
	waitFor(t, 10*time.Second, time.Millisecond, func() error {
		if n := log.count("DROPPED usage event, not on disk"); n < 5 {
			return fmt.Errorf("%d events logged as not on disk, want 5:\n%s", n, &log)
		}
		return nil
	})
	p.Record(usageEvent(5))
	if n := log.count("DROPPED usage event, not billed", "cannot write to its disk", usageEvent(5).ID); n != 1 {
		t.Errorf("the event recorded after the failed sync is in %d refusal lines, want 1:\n%s", n, &log)
	}
	if st := p.Stats(); st.Dropped != 6 {
		t.Errorf("stats %+v: want the 6 events counted as dropped", st)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = p.Close(ctx)
	if err == nil || strings.Contains(err.Error(), "stay in the outbox") || !strings.Contains(err.Error(), "5 usage events not acknowledged by JetStream could not be written to disk") {
		t.Fatalf("closing said %v; want the 5 events said not to be kept", err)
	}
}
