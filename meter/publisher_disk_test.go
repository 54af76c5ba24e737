package meter_test

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/meter"
)

// A gateway whose data dir went read-only, with NATS unreachable, said at
// shutdown that the events it could not write "stay in the outbox for the
// next start", which did not find them: billed nowhere, logged nowhere.
// Each is logged with its JSON when its sync fails, later ones are refused
// and logged, and the shutdown says they are not kept.
func TestPublisherOnAReadOnlyDiskLogsEveryEventAndKeepsNoneForTheNextStart(t *testing.T) {
	srv, gw := externalUsageStream(t)
	srv.stop()
	ob, err := meter.OpenOutbox(filepath.Join(t.TempDir(), "outbox"), 0)
	if err != nil {
		t.Fatal(err)
	}
	var log testutil.Log
	p := meter.NewPublisher(gw.JetStream(), ob, log.Logf)
	meter.FailOutboxSyncs(ob, syscall.EROFS)
	for i := range 5 {
		p.Record(usageEvent(i))
	}
	// The writer may sync the first event before the others are queued:
	// those are then refused rather than held, so each of the five is in
	// exactly one DROPPED line of either kind, and only the held ones are
	// counted at shutdown.
	waitFor(t, 10*time.Second, time.Millisecond, func() error {
		if n := log.Count("DROPPED usage event"); n < 5 {
			return fmt.Errorf("%d events logged as dropped, want 5:\n%s", n, &log)
		}
		return nil
	})
	for i := range 5 {
		if n := log.Count("DROPPED usage event", usageEvent(i).ID+`"`); n != 1 {
			t.Errorf("event %d is in %d DROPPED lines, want 1:\n%s", i, n, &log)
		}
	}
	held := log.Count("DROPPED usage event, not on disk")
	if held < 1 {
		t.Fatalf("no event logged as not on disk:\n%s", &log)
	}
	p.Record(usageEvent(5))
	if n := log.Count("DROPPED usage event, not billed", "cannot write to its disk", usageEvent(5).ID); n != 1 {
		t.Errorf("the event recorded after the failed sync is in %d refusal lines, want 1:\n%s", n, &log)
	}
	if st := p.Stats(); st.Dropped != 6 {
		t.Errorf("stats %+v: want the 6 events counted as dropped", st)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = p.Close(ctx)
	want := fmt.Sprintf("%d usage events not acknowledged by JetStream could not be written to disk", held)
	if err == nil || strings.Contains(err.Error(), "stay in the outbox") || !strings.Contains(err.Error(), want) {
		t.Fatalf("closing said %v; want the %d held events said not to be kept", err, held)
	}
}

// outboxAfterAnOutage leaves in a new outbox dir, closed as a SIGTERM
// closes it, 900 events in 128 KiB segments: JetStream acknowledged the
// first 100, and NATS was down for the other 800. It returns the NATS
// server (stopped), the gateway's connection, the dir and its segment
// files in order.
func outboxAfterAnOutage(t *testing.T) (*natsServer, *broker.Broker, string, []string) {
	t.Helper()
	srv, gw, dir, p := drainedPublisher(t, 100)
	srv.stop()
	waitFor(t, 10*time.Second, time.Millisecond, func() error {
		if p.Stats().Connected {
			return errors.New("still connected to the stopped server")
		}
		return nil
	})
	for i := 100; i < 900; i++ {
		p.Record(usageEvent(i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := p.Close(ctx); err == nil || !strings.Contains(err.Error(), "800 usage events not acknowledged by JetStream stay in the outbox") {
		t.Fatalf("closing said %v, want the 800 events kept", err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(segs) < 3 {
		t.Fatalf("segments %v, want 3 or more", segs)
	}
	// Files are numbered as they are made, not always in the order they
	// take records (a spare made off the lock can lose the race).
	slices.SortFunc(segs, func(a, b string) int { return cmp.Compare(segmentFirst(t, a), segmentFirst(t, b)) })
	return srv, gw, dir, segs
}

// drainedPublisher starts a NATS server of its own with the USAGE stream
// and a publisher on a new outbox dir with 1 MiB of segments, records n
// events and waits until JetStream acknowledged them all. It returns the
// server, the gateway's connection, the dir and the publisher.
func drainedPublisher(t *testing.T, n int) (*natsServer, *broker.Broker, string, *meter.Publisher) {
	t.Helper()
	srv, gw := externalUsageStream(t)
	dir := filepath.Join(t.TempDir(), "outbox")
	ob, err := meter.OpenOutbox(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	p := meter.NewPublisher(gw.JetStream(), ob, syncLog(t))
	for i := range n {
		p.Record(usageEvent(i))
	}
	waitDrained(t, p)
	return srv, gw, dir, p
}

// segmentFirst is the first record the segment file at path was made for.
func segmentFirst(t *testing.T, path string) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 16 {
		t.Fatalf("reading %s: %v (%d bytes)", path, err, len(b))
	}
	return binary.LittleEndian.Uint64(b[8:])
}

// startedAgain starts NATS and a publisher on the outbox in dir, and
// waits until it logged want.
func startedAgain(t *testing.T, srv *natsServer, gw *broker.Broker, dir, want string) *testutil.Log {
	t.Helper()
	srv.start()
	ob, err := meter.OpenOutbox(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var log testutil.Log
	p := meter.NewPublisher(gw.JetStream(), ob, log.Logf)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	waitFor(t, 20*time.Second, 5*time.Millisecond, func() error {
		if log.Count(want) == 0 {
			return fmt.Errorf("no line says %q:\n%s", want, &log)
		}
		return nil
	})
	return &log
}

// The oldest segment with records JetStream never acknowledged, deleted,
// emptied or overwritten while the gateway was stopped, lost its events
// without a line: a start took the records before the first on disk for
// acknowledged, though the acked file said they were not. So did the
// newest segment, which nothing on disk said had been. Each is now a
// LOST line naming the records, once JetStream's batches show it never
// had them.
func TestPublisherSaysWhichRecordsASegmentLostWhileStoppedHeld(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, segs []string) (from, to uint64)
	}{
		{"oldest deleted", func(t *testing.T, segs []string) (uint64, uint64) {
			to := segmentFirst(t, segs[1]) - 1
			if err := os.Remove(segs[0]); err != nil {
				t.Fatal(err)
			}
			return 101, to
		}},
		{"oldest emptied", func(t *testing.T, segs []string) (uint64, uint64) {
			to := segmentFirst(t, segs[1]) - 1
			if err := os.Truncate(segs[0], 0); err != nil {
				t.Fatal(err)
			}
			return 101, to
		}},
		{"oldest header overwritten", func(t *testing.T, segs []string) (uint64, uint64) {
			to := segmentFirst(t, segs[1]) - 1
			f, err := os.OpenFile(segs[0], os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte("garbage, not a header"), 0); err != nil {
				t.Fatal(err)
			}
			return 101, to
		}},
		{"newest deleted", func(t *testing.T, segs []string) (uint64, uint64) {
			last := segs[len(segs)-1]
			from := segmentFirst(t, last)
			if err := os.Remove(last); err != nil {
				t.Fatal(err)
			}
			return from, 900
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, gw, dir, segs := outboxAfterAnOutage(t)
			from, to := tc.damage(t, segs)
			want := fmt.Sprintf("LOST usage events: records %d to %d (%d) are in no segment", from, to, to-from+1)
			log := startedAgain(t, srv, gw, dir, want)
			if n := log.Count("LOST"); n != 1 {
				t.Fatalf("%d LOST lines, want 1:\n%s", n, log)
			}
		})
	}
}

// An acked file that could not be written while JetStream acknowledged
// (a full disk) says less than what was acknowledged and deleted: the
// records before the first on disk are no loss, and JetStream's batches
// show it.
func TestPublisherTakesRecordsJetStreamStoredForNoLossAfterAStaleAckedFile(t *testing.T) {
	srv, gw, dir, p := drainedPublisher(t, 900)
	if err := p.Close(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if err := meter.WriteAckedFile(dir, 100); err != nil {
		t.Fatal(err)
	}
	srv.stop()
	log := startedAgain(t, srv, gw, dir, "but JetStream stored them (its batches of this outbox reach record 900): nothing is lost")
	if n := log.Count("LOST"); n != 0 {
		t.Fatalf("%d LOST lines, want none:\n%s", n, log)
	}
}

// externalUsageStream is a NATS server of its own, as an external one,
// with the USAGE stream, and the gateway's connection to it: stopping
// the server leaves the gateway's outbox to hold what it records.
func externalUsageStream(t *testing.T) (*natsServer, *broker.Broker) {
	t.Helper()
	srv := startNATSServer(t)
	gw := connectNATS(t, srv.url())
	if _, err := meter.EnsureUsageStream(testContext(t), gw.JetStream(), 1, 0); err != nil {
		t.Fatal(err)
	}
	return srv, gw
}
