package meter

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// wantRefusal waits until ob.Refusal says want ("" for none): it is set
// off the appends too, by the syncer and the compactor.
func wantRefusal(t *testing.T, ob *Outbox, want string) {
	t.Helper()
	checkFor(t, 10*time.Second, time.Millisecond, func() error {
		if got := ob.Refusal(); got != want {
			return fmt.Errorf("Refusal() = %q, want %q", got, want)
		}
		return nil
	})
}

// appendUntilRefused appends events from 0 until one is refused with
// ErrOutboxFull, and returns its number; it fails the test unless
// Refusal said so before that event. With pause, it sleeps a
// millisecond every 64 events until Refusal says so, for the syncer to
// try the next segment.
func appendUntilRefused(t *testing.T, ob *Outbox, pause bool) int {
	t.Helper()
	n, toldAt := 0, -1
	for ; ; n++ {
		if toldAt < 0 && ob.Refusal() != "" {
			toldAt = n
		}
		err := ob.Append(outboxTestEvent(n))
		if errors.Is(err, ErrOutboxFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if pause && toldAt < 0 && n%64 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if toldAt < 0 {
		t.Fatalf("event %d refused (outbox full), and Refusal() said nothing before", n)
	}
	t.Logf("Refusal() said so at event %d, the first refused was %d", toldAt, n)
	return n
}

// A readiness probe asks the outbox whether it takes events, with no
// lock: an outbox at billing.outbox_max_bytes says so before its first
// refused event (once the segment it fills is in its last eighth), and
// says it takes them again once JetStream's acknowledgements freed a
// segment, with no event appended meanwhile.
func TestOutboxRefusalAtItsByteBound(t *testing.T) {
	ob := openTestOutbox(t, t.TempDir(), 1<<20) // 128 KiB segments
	if got := ob.Refusal(); got != "" {
		t.Fatalf("Refusal() of a new outbox = %q, want none", got)
	}
	n := appendUntilRefused(t, ob, false)
	if got, want := ob.Refusal(), outboxRefusalReasons[refusesAtBound]; got != want {
		t.Fatalf("Refusal() at the bound = %q, want %q", got, want)
	}
	waitDurable(t, ob, uint64(n))
	publishAll(t, ob, n)
	wantRefusal(t, ob, "")
	appendEvents(t, ob, n, n+1)
}

// An outbox whose last sync failed refuses every event until one
// succeeds; Refusal says so at once, and nothing once a sync succeeded.
func TestOutboxRefusalWhileItsDiskTakesNoWrite(t *testing.T) {
	ob := openTestOutbox(t, t.TempDir(), 0)
	appendEvents(t, ob, 0, 10)
	waitDurable(t, ob, 10)
	FailOutboxSyncs(ob, syscall.EROFS)
	appendEvents(t, ob, 10, 11)
	wantRefusal(t, ob, outboxRefusalReasons[refusesUnwritable])
	if err := ob.Append(outboxTestEvent(11)); !errors.Is(err, ErrOutboxUnwritable) {
		t.Fatalf("append while Refusal() says %q: %v, want ErrOutboxUnwritable", ob.Refusal(), err)
	}
	FailOutboxSyncs(ob, nil)
	wantRefusal(t, ob, "")
	appendEvents(t, ob, 11, 12)
}

// Closed, it takes nothing.
func TestOutboxRefusalOnceClosed(t *testing.T) {
	ob := openTestOutbox(t, t.TempDir(), 0)
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	if got := ob.Refusal(); got != outboxRefusalReasons[refusesClosed] {
		t.Fatalf("Refusal() once closed = %q", got)
	}
}
