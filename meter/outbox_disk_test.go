package meter

import (
	"cmp"
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

	"github.com/tollgate/tollgate/internal/testutil"
)

// A disk remounted read-only after an I/O error keeps the outbox's mapped
// pages dirty for good: the events copied into them never reach the disk,
// and the next start does not find them. Each one is logged with its JSON
// for billing by hand, once, and new events are refused (and logged, as
// on a full disk) until a sync succeeds again. They were taken, counted
// as waiting for JetStream, and lost without a line.
func TestOutboxLogsWhatItCouldNotSyncAndRefusesUntilASyncSucceeds(t *testing.T) {
	ob := openTestOutbox(t, t.TempDir(), 0)
	var log testutil.Log
	ob.setLogf(log.Logf)
	appendEvents(t, ob, 0, 10)
	waitDurable(t, ob, 10)

	FailOutboxSyncs(ob, syscall.EROFS)
	appendEvents(t, ob, 10, 20)
	checkFor(t, 10*time.Second, time.Millisecond, func() error {
		if got := log.Matching("DROPPED usage event, not on disk", "read-only file system", "check ClickHouse"); len(got) < 10 {
			return fmt.Errorf("%d events logged as not on disk, want 10: %q", len(got), log.Matching())
		}
		return nil
	})
	for i := 10; i < 20; i++ {
		id := outboxTestEvent(i).ID
		if got := log.Matching(`"id":"` + id + `"`); len(got) != 1 {
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
	if got := log.Matching("DROPPED usage event, not on disk"); len(got) != 10 {
		t.Errorf("%d lines about events not on disk after the syncs were retried, want 10", len(got))
	}
	if st := ob.Stats(); st.Lost != 10 {
		t.Errorf("stats %+v: want the 10 events not on disk counted", st)
	}

	FailOutboxSyncs(ob, nil)
	checkFor(t, 10*time.Second, time.Millisecond, func() error {
		return ob.Append(outboxTestEvent(21))
	})
	if got := log.Matching("writing to disk again"); len(got) != 1 {
		t.Errorf("lines %q, want one saying the disk takes writes again", log.Matching())
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
	var log testutil.Log
	ob.setLogf(log.Logf)
	FailOutboxSyncs(ob, syscall.EIO)
	ev := outboxTestEvent(1)
	done, err := ob.AppendDurable(ev)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the answer still waits for an event its disk will not take; log: %q", log.Matching())
	}
	if got := log.Matching("DROPPED usage event, not on disk", `"id":"`+ev.ID+`"`); len(got) != 1 {
		t.Fatalf("released with the event in %d lines, want 1 with its JSON first: %q", len(got), log.Matching())
	}
}

// segmentFirstSeq is the first record the segment file at path was made
// for, from its header.
func segmentFirstSeq(t *testing.T, path string) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil || len(b) < outboxHeaderSize {
		t.Fatalf("reading %s: %v (%d bytes)", path, err, len(b))
	}
	return binary.LittleEndian.Uint64(b[len(outboxMagic):])
}

// lostLines is the recovery notes saying LOST.
func lostLines(ob *Outbox) []string {
	var out []string
	for _, n := range ob.Recovery().Notes {
		if strings.Contains(n, "LOST") {
			out = append(out, n)
		}
	}
	return out
}

// One damaged record was reported lost twice: as the damaged record and
// the whole ones after it cut off its segment, and again as records in no
// segment, up to the next one: the same events, counted twice by whoever
// added up the lines. In the newest segment, the written file's last
// record ends the range.
func TestOutboxReportsADamagedRecordLostOnce(t *testing.T) {
	dir := t.TempDir()
	segs := writtenSegments(t, dir, 1<<20, 2000) // 128 KiB segments
	if len(segs) < 3 {
		t.Fatalf("segments %v, want 3 or more", segs)
	}
	// Files are numbered as they are made, not always in the order they
	// take records (a spare made off the lock can lose the race).
	slices.SortFunc(segs, func(a, b string) int { return cmp.Compare(segmentFirstSeq(t, a), segmentFirstSeq(t, b)) })
	damaged := segmentFirstSeq(t, segs[1]) + 50
	next := segmentFirstSeq(t, segs[2])
	if err := DamageRecord(dir, damaged); err != nil {
		t.Fatal(err)
	}
	lastDamaged := segmentFirstSeq(t, segs[len(segs)-1]) + 20
	if err := DamageRecord(dir, lastDamaged); err != nil {
		t.Fatal(err)
	}
	ob := openTestOutbox(t, dir, 1<<20)
	lost := lostLines(ob)
	if len(lost) != 2 {
		t.Fatalf("LOST lines %q, want one for each damaged record", lost)
	}
	want := fmt.Sprintf("LOST usage events: records %d to %d (%d), ", damaged, next-1, next-damaged)
	if !strings.HasPrefix(lost[0], want) || !strings.Contains(lost[0], "after-") {
		t.Errorf("LOST line %q, want it to begin %q and say where the bytes are", lost[0], want)
	}
	want = fmt.Sprintf("LOST usage events: records %d to 2000 (%d), ", lastDamaged, 2000-lastDamaged+1)
	if !strings.HasPrefix(lost[1], want) {
		t.Errorf("LOST line %q, want it to begin %q", lost[1], want)
	}
	if m := ob.Recovery().Missing; len(m) != 0 {
		t.Errorf("records missing %+v, besides the damaged ones: the newest segment's are said once", m)
	}
}

// After a crash the written file says how far the outbox had written at
// the stop before: the whole records after a damaged one in the newest
// segment can go further, and the range takes them in.
func TestOutboxDamagedRecordsRangeTakesInWhatFollowedTheLastStop(t *testing.T) {
	dir := t.TempDir()
	writtenSegments(t, dir, 0, 200)
	if err := writeSeqFile(dir, outboxWrittenFile, 170); err != nil {
		t.Fatal(err)
	}
	if err := DamageRecord(dir, 150); err != nil {
		t.Fatal(err)
	}
	ob := openTestOutbox(t, dir, 0)
	lost := lostLines(ob)
	if want := "LOST usage events: records 150 to 200 (51), "; len(lost) != 1 || !strings.HasPrefix(lost[0], want) {
		t.Fatalf("LOST lines %q, want one beginning %q", lost, want)
	}
}

// An acked file that does not read says what is wrong with it: it said
// "unreadable (<nil>, 14 bytes)".
func TestOutboxSaysWhatIsWrongWithItsAckedFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content []byte
		want    string
	}{
		{"too long", []byte("not a sequence"), "holds 14 bytes, not the 12 of a record number and its checksum"},
		{"checksum", make([]byte, 12), "its checksum does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writtenSegments(t, dir, 0, 10)
			if err := os.WriteFile(filepath.Join(dir, outboxAckedFile), tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			notes := strings.Join(openTestOutbox(t, dir, 0).Recovery().Notes, "\n")
			if !strings.Contains(notes, tc.want) || strings.Contains(notes, "<nil>") {
				t.Fatalf("notes %q, want them to say %q", notes, tc.want)
			}
		})
	}
}

// An event logged because it could not reach the disk is logged without
// its request log: a logged request's text never goes into the
// gateway's own log.
func TestBillableJSONLeavesTheRequestLogOut(t *testing.T) {
	data := []byte(`{"id":"evt-1","account":"acme","cost_nanos":"0.000000120","log":{"request":"my secret prompt"}}`)
	got := string(billableJSON(data))
	if strings.Contains(got, "secret") || !strings.Contains(got, `"id":"evt-1"`) || !strings.Contains(got, `"cost_nanos":"0.000000120"`) {
		t.Fatalf("billableJSON = %s; want the event without its log", got)
	}
	if plain := `{"id":"evt-2"}`; string(billableJSON([]byte(plain))) != plain {
		t.Fatalf("an event without a log changed: %s", billableJSON([]byte(plain)))
	}
}
