package meter

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tollgate/tollgate/internal/testutil"
)

// The disks of these tests: a tmpfs to fill, as make test runs as root.
var (
	smallDisk = testutil.SmallDisk
	fillDisk  = func(t *testing.T, dir string) { testutil.FillDisk(t, dir) }
)

// A gateway stopped after its outbox had filled the disk (NATS down under
// load) could not start again: the open failed making its first segment
// ("reserving 4194304 bytes for an outbox segment: no space left on
// device"), so the events the outbox held were never published, and the
// disk was freed only by deleting something, maybe them. It opens, refuses
// new events as it does when the disk fills while running, publishes what
// it holds, and takes events again once that freed the disk.
func TestOutboxOpensOnAFullDiskAndPublishesWhatItHolds(t *testing.T) {
	disk := smallDisk(t, 2<<20)
	dir := filepath.Join(disk, "outbox")
	// 512 KiB segments: the bound is not what fills up.
	opts := OutboxOptions{MaxBytes: 4 << 20, FsyncInterval: 10 * time.Millisecond}
	ob, err := OpenOutboxWith(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	n := fillOutbox(t, ob)
	if st := ob.Stats(); st.Bytes >= 4<<20 || !errors.Is(st.LastWriteErr, unix.ENOSPC) {
		t.Fatalf("after %d events, stats %+v: want the disk full, not the byte bound", n, st)
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, disk) // what closing freed (the spare, the preallocated end)

	ob, err = OpenOutboxWith(dir, opts)
	if err != nil {
		t.Fatalf("opening on a full disk: %v", err)
	}
	t.Cleanup(func() { ob.Close() })
	rec := ob.Recovery()
	if rec.Unacked != uint64(n) || !strings.Contains(strings.Join(rec.Notes, "\n"), "no new segment could be made") {
		t.Fatalf("recovery %+v: want %d events to publish, and a note that new ones are refused", rec, n)
	}
	if err := ob.Append(outboxTestEvent(n)); !errors.Is(err, ErrOutboxFull) {
		t.Fatalf("append on a full disk: %v, want ErrOutboxFull", err)
	}
	publishAll(t, ob, n)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return ob.Append(outboxTestEvent(n))
	})
	waitDurable(t, ob, uint64(n+1))
	readAll(t, ob, uint64(n), n)
}

// On a full disk every refused event tried to make a segment again (a
// file created, preallocated and deleted, with the outbox's lock held):
// "the outbox failed to write to disk 1263 times in the last 10s" for
// about 1,160 refused events. Refusals are now at once, a segment is
// tried again every outboxSpareRetry, and events are taken again soon
// after the disk has room.
func TestOutboxOnAFullDiskRefusesWithoutRetryingForEachEvent(t *testing.T) {
	disk := smallDisk(t, 2<<20)
	ob, err := OpenOutbox(filepath.Join(disk, "outbox"), 4<<20) // 512 KiB segments
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	// The spare is made ahead, off the lock: filled while it was being
	// preallocated, the disk got its room back when that failed, and a
	// later try made a segment (an append taken amid the refusals, in a
	// run on a loaded machine).
	waitSpare(t, ob)
	fillDisk(t, disk)
	n := fillOutbox(t, ob)
	before := ob.Stats().WriteFailures
	start := time.Now()
	for i := range 2000 {
		if err := ob.Append(outboxTestEvent(n + i)); !errors.Is(err, ErrOutboxFull) {
			t.Fatalf("append on a full disk: %v, want ErrOutboxFull", err)
		}
	}
	tries := ob.Stats().WriteFailures - before
	if most := uint64(time.Since(start)/outboxSpareRetry) + 2; tries > most {
		t.Fatalf("2000 refused events tried to make a segment %d times in %s, want at most %d", tries, time.Since(start), most)
	}

	if err := os.Remove(filepath.Join(disk, "filler")); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 2*time.Second, time.Millisecond, func() error {
		return ob.Append(outboxTestEvent(n))
	})
	waitDurable(t, ob, uint64(n+1))
	readAll(t, ob, 0, 0)
}

// On a full disk the outbox's last segment was never deleted, even with
// every record in it acknowledged by JetStream, and no other could be
// made: every usage event was dropped ("DROPPED usage event, not billed:
// outbox full: reserving 131072 bytes …"), and again after a restart,
// while the outbox held nothing unpublished. The segment is now reused in
// place once acknowledged, and a restart after that numbers and
// publishes every event once.
func TestOutboxReusesItsAcknowledgedLastSegmentOnAFullDisk(t *testing.T) {
	disk := smallDisk(t, 1<<20)
	dir := filepath.Join(disk, "outbox")
	opts := OutboxOptions{MaxBytes: 1 << 20, FsyncInterval: 10 * time.Millisecond} // 128 KiB segments
	ob, err := OpenOutboxWith(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	// The acked file is never replaced, as on a disk that stays full:
	// only the segments say how far the outbox went.
	if err := os.MkdirAll(filepath.Join(dir, outboxAckedFile+".tmp", "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, disk)

	// JetStream acknowledges everything appended whenever an event is
	// refused; the next event must then be taken.
	next, refusals, reuses := 0, 0, 0
	activePath := func() string {
		ob.mu.Lock()
		defer ob.mu.Unlock()
		return ob.active.seg.path
	}
	for refused := false; next < 2000; { // about five segments
		before := activePath()
		err := ob.Append(outboxTestEvent(next))
		if errors.Is(err, ErrOutboxFull) {
			if refused {
				t.Fatalf("event %d refused after JetStream acknowledged every event before it: %v", next, err)
			}
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("event %d refused with %v, want the disk full", next, err)
			}
			refused = true
			refusals++
			waitDurable(t, ob, uint64(next))
			ob.ack(uint64(next))
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if refused && activePath() == before {
			// Reused in place: no older segment may be left beside it
			// for compactOnce's next tick. A crash then left the older
			// one and a gap of the reused one's old records, which the
			// next start took for lost and published the older one's
			// again from the acked file the full disk kept old.
			reuses++
			if segs, _ := filepath.Glob(filepath.Join(dir, "*.seg")); len(segs) != 1 {
				t.Fatalf("segment files %v beside the one reused in place, want none", segs)
			}
		}
		refused = false
		next++
	}
	if reuses == 0 {
		t.Fatal("no segment was reused in place")
	}
	// The refusals' own errors, not Stats' last one: the acked file's
	// write, failing beside them (is a directory), may come last.
	if refusals == 0 {
		t.Fatalf("no refusal, stats %+v: want the disk full", ob.Stats())
	}

	// A restart: the records JetStream has not acknowledged are replayed,
	// in order under the sequence numbers they had, and the next event
	// is numbered after them.
	appendEvents(t, ob, next, next+10)
	waitDurable(t, ob, uint64(next+10))
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, disk) // what closing freed
	ob, err = OpenOutboxWith(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	acked := ob.ackedSeq()
	if acked > uint64(next) || acked+ob.Recovery().Unacked != uint64(next+10) {
		t.Fatalf("reopened acknowledged through %d with %d to replay, want %d events in all, the last %d unacknowledged", acked, ob.Recovery().Unacked, next+10, 10)
	}
	readAll(t, ob, acked, int(acked)) // record s holds event s-1
	// The publisher's start-up look-up finds them stored up to next.
	ob.ack(uint64(next))
	if err := ob.Append(outboxTestEvent(next + 10)); !errors.Is(err, ErrOutboxFull) {
		t.Fatalf("append with ten events unacknowledged on a full disk: %v, want ErrOutboxFull", err)
	}
	ob.ack(uint64(next + 10))
	checkFor(t, 2*time.Second, time.Millisecond, func() error {
		return ob.Append(outboxTestEvent(next + 10))
	})
	waitDurable(t, ob, uint64(next+11))
	if got := readAll(t, ob, uint64(next+10), next+10); len(got) != 1 || got[0].seq != uint64(next+11) {
		t.Fatalf("after the restart the next event was read as %+v, want sequence %d alone", got, next+11)
	}
	if segs, _ := filepath.Glob(filepath.Join(dir, "*.seg")); len(segs) != 1 {
		t.Fatalf("segment files %v, want the one reused", segs)
	}
}

// A gateway stopped on a disk with less than a segment free cut its last
// segment down to its records, something else took what that freed, and
// the next start deleted the segment (the acked file covered it) or found
// it too small ("no room for a record" after a start that wrote nothing):
// the outbox had no segment and refused every event until an operator
// freed a segment's worth. The last segment now keeps its preallocated
// room through a restart, and is reused at once when acknowledged.
func TestOutboxKeepsItsLastSegmentsRoomThroughARestartOnAFullDisk(t *testing.T) {
	for _, written := range []int{0, 10} {
		t.Run(fmt.Sprint(written), func(t *testing.T) {
			disk := smallDisk(t, 1<<20)
			dir := filepath.Join(disk, "outbox")
			opts := OutboxOptions{MaxBytes: 1 << 20, FsyncInterval: 10 * time.Millisecond} // 128 KiB segments
			ob, err := OpenOutboxWith(dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			appendEvents(t, ob, 0, written)
			waitDurable(t, ob, uint64(written))
			ob.ack(uint64(written)) // and the acked file says so at Close
			if err := ob.Close(); err != nil {
				t.Fatal(err)
			}
			fillDisk(t, disk) // what closing freed (the spare)

			ob, err = OpenOutboxWith(dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ob.Close() })
			if notes := strings.Join(ob.Recovery().Notes, "\n"); !strings.Contains(notes, "is reused") {
				t.Fatalf("recovery notes %q: want the last segment reused", notes)
			}
			appendEvents(t, ob, written, written+200) // about half a segment
			waitDurable(t, ob, uint64(written+200))
			if got := readAll(t, ob, uint64(written), written); len(got) != 200 {
				t.Fatalf("read %d events after the restart, want 200", len(got))
			}
		})
	}
}

// On a full disk with JetStream unreachable the outbox refuses events
// once its segments are full: Refusal says so before the first refused
// one, and says it takes them again once the disk has room, with no
// event appended meanwhile (a gateway out of its load balancer's
// rotation gets none).
func TestOutboxRefusalOnAFullDisk(t *testing.T) {
	disk := smallDisk(t, 2<<20)
	ob, err := OpenOutboxWith(filepath.Join(disk, "outbox"), OutboxOptions{MaxBytes: 4 << 20, FsyncInterval: 10 * time.Millisecond}) // 512 KiB segments
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	waitSpare(t, ob)
	filler := testutil.FillDisk(t, disk)
	n := appendUntilRefused(t, ob, true)
	if got, want := ob.Refusal(), outboxRefusalReasons[refusesNoSegment]; got != want {
		t.Fatalf("Refusal() on the full disk = %q, want %q", got, want)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	wantRefusal(t, ob, "")
	appendEvents(t, ob, n, n+1)
}

// waitSpare waits until the syncer made ob's spare segment.
func waitSpare(t *testing.T, ob *Outbox) {
	t.Helper()
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		ob.mu.Lock()
		defer ob.mu.Unlock()
		if ob.spare == nil {
			return errors.New("no spare made yet")
		}
		return nil
	})
}
