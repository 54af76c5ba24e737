package meter

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/money"
)

func outboxTestEvent(i int) *Event {
	return &Event{
		ID:               fmt.Sprintf("ev-%07d", i),
		Time:             time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second),
		Account:          fmt.Sprintf("acct-%d", i%3),
		Model:            "small",
		PromptTokens:     int64(100 + i),
		CompletionTokens: int64(i % 50),
		CostNanos:        money.Nanos(1_000 + i),
		UsageSource:      SourceUpstream,
		Status:           200,
	}
}

// checkFor polls fn until it returns nil or total passes.
var checkFor = testutil.CheckFor

func openTestOutbox(t testing.TB, dir string, maxBytes int64) *Outbox {
	t.Helper()
	ob, err := OpenOutbox(dir, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	return ob
}

func appendEvents(t testing.TB, ob *Outbox, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := ob.Append(outboxTestEvent(i)); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
}

func waitDurable(t testing.TB, ob *Outbox, seq uint64) {
	t.Helper()
	checkFor(t, 10*time.Second, time.Millisecond, func() error {
		if got := ob.durableState(); got < seq {
			return fmt.Errorf("durable through %d, want %d", got, seq)
		}
		return nil
	})
}

// readAll reads every durable record after `after` and checks they are
// the events wantFrom, wantFrom+1, … in order.
func readAll(t testing.TB, ob *Outbox, after uint64, wantFrom int) []outboxRecord {
	t.Helper()
	r := ob.newReader(after)
	defer r.close()
	var all []outboxRecord
	for {
		recs, err := r.next(1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			break
		}
		for _, rec := range recs {
			all = append(all, rec.clone())
		}
	}
	for i, rec := range all {
		want := outboxTestEvent(wantFrom + i)
		var got Event
		if err := json.Unmarshal(rec.data, &got); err != nil {
			t.Fatalf("record %d: %v", rec.seq, err)
		}
		if string(rec.id) != want.ID || string(rec.account) != want.Account || got.ID != want.ID || got.CostNanos != want.CostNanos || !got.Time.Equal(want.Time) {
			t.Fatalf("record %d (#%d read) is %s/%s %+v, want %+v", rec.seq, i, rec.id, rec.account, got, want)
		}
		if i > 0 && rec.seq != all[i-1].seq+1 {
			t.Fatalf("sequence jumps from %d to %d", all[i-1].seq, rec.seq)
		}
	}
	return all
}

func TestOutboxReplaysUnackedEventsAfterReopen(t *testing.T) {
	dir := t.TempDir()
	ob, err := OpenOutbox(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	appendEvents(t, ob, 0, 1000)
	waitDurable(t, ob, 1000)
	if got := readAll(t, ob, 0, 0); len(got) != 1000 {
		t.Fatalf("read %d records, want 1000", len(got))
	}
	ob.ack(400)
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}

	ob = openTestOutbox(t, dir, 0)
	if rec := ob.Recovery(); rec.Unacked != 600 || rec.TruncatedBytes != 0 {
		t.Fatalf("recovery %+v, want 600 unacked and nothing cut", rec)
	}
	if got := readAll(t, ob, ob.ackedSeq(), 400); len(got) != 600 || got[0].seq != 401 {
		t.Fatalf("replay has %d records from %d, want 600 from 401", len(got), got[0].seq)
	}
	// New events continue the sequence.
	appendEvents(t, ob, 1000, 1010)
	waitDurable(t, ob, 1010)
	if got := readAll(t, ob, 1000, 1000); len(got) != 10 || got[0].seq != 1001 {
		t.Fatalf("after reopen: %d new records from %d", len(got), got[0].seq)
	}
}

// writtenSegments writes events 0..n-1 into a new outbox in dir, bounded
// at maxBytes, closes it, and returns its segment files in order.
func writtenSegments(t *testing.T, dir string, maxBytes int64, n int) []string {
	t.Helper()
	ob, err := OpenOutbox(dir, maxBytes)
	if err != nil {
		t.Fatal(err)
	}
	appendEvents(t, ob, 0, n)
	waitDurable(t, ob, uint64(n))
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	return segs
}

// recordsEnd is the offset in the segment file at path where its records
// end: the last segment is not cut to them.
func recordsEnd(t *testing.T, path string) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off := outboxHeaderSize
	for {
		_, n, err := decodeOutboxRecord(data[off:], 2)
		if err != nil {
			return int64(off)
		}
		off += n
	}
}

func TestOutboxCutsATornTailOnOpen(t *testing.T) {
	dir := t.TempDir()
	segs := writtenSegments(t, dir, 0, 50)
	if len(segs) != 1 {
		t.Fatalf("segments %v, want 1", segs)
	}
	intact := recordsEnd(t, segs[0])
	// A crash in the middle of writing the 51st record: its header and
	// half its body reached the disk.
	body, err := encodeOutboxPayload(outboxTestEvent(50))
	if err != nil {
		t.Fatal(err)
	}
	torn := appendOutboxRecord(nil, 51, 1, body)
	f, err := os.OpenFile(segs[0], os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(torn[:len(torn)/2], intact); err != nil {
		t.Fatal(err)
	}
	f.Close()

	ob := openTestOutbox(t, dir, 0)
	if rec := ob.Recovery(); rec.Unacked != 50 || rec.TruncatedBytes != int64(len(torn)/2) {
		t.Fatalf("recovery %+v, want 50 unacked and %d bytes cut", rec, len(torn)/2)
	}
	// No longer the last segment, it is cut to its records.
	if st, _ := os.Stat(segs[0]); st.Size() != intact {
		t.Fatalf("segment is %d bytes after open, want %d", st.Size(), intact)
	}
	if got := readAll(t, ob, 0, 0); len(got) != 50 {
		t.Fatalf("replay has %d records, want 50", len(got))
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}

	// A complete last record whose bytes are damaged fails its CRC.
	data, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-3] ^= 0x20
	if err := os.WriteFile(segs[0], data, 0o600); err != nil {
		t.Fatal(err)
	}
	ob2 := openTestOutbox(t, dir, 0)
	if rec := ob2.Recovery(); rec.Unacked != 49 || rec.TruncatedBytes == 0 {
		t.Fatalf("recovery %+v, want the damaged 50th record cut", rec)
	}
	if got := readAll(t, ob2, 0, 0); len(got) != 49 {
		t.Fatalf("replay has %d records, want 49", len(got))
	}
	// The open before made a segment from 51 on, empty: its header says
	// 50 was given, and numbers are not given twice.
	appendEvents(t, ob2, 100, 101)
	waitDurable(t, ob2, 51)
	if got := readAll(t, ob2, 49, 100); len(got) != 1 || got[0].seq != 51 {
		t.Fatalf("the next event got sequence %d, want 51 (after the cut one's)", got[0].seq)
	}
}

func TestOutboxRefusesPastItsBoundAndTakesAgainOnceAcknowledged(t *testing.T) {
	dir := t.TempDir()
	const maxBytes = 512 << 10 // segments of 64 KiB, about 200 events each
	ob := openTestOutbox(t, dir, maxBytes)
	n := 0
	for ; n < 100_000; n++ {
		err := ob.Append(outboxTestEvent(n))
		if errors.Is(err, ErrOutboxFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	st := ob.Stats()
	if n == 100_000 || st.Bytes < maxBytes || st.Bytes > maxBytes+ob.segmentBytes {
		t.Fatalf("took %d events, %d bytes: want refusals past the %d-byte bound, within a segment of it", n, st.Bytes, maxBytes)
	}

	// A publisher acknowledging as it reads drains it all.
	r := ob.newReader(0)
	defer r.close()
	read := 0
	checkFor(t, 20*time.Second, time.Millisecond, func() error {
		recs, err := r.next(500)
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			if string(rec.id) != outboxTestEvent(read).ID {
				t.Fatalf("record %d is %s, want %s", rec.seq, rec.id, outboxTestEvent(read).ID)
			}
			read++
		}
		if len(recs) > 0 {
			ob.ack(recs[len(recs)-1].seq)
		}
		if read < n {
			return fmt.Errorf("read %d of %d", read, n)
		}
		return nil
	})
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
		// The active segment and the spare made ahead.
		if st := ob.Stats(); st.Unacked != 0 || st.Segments != 1 || len(segs) != 2 {
			return fmt.Errorf("stats %+v, %d segment files; want only the active one and a spare left", st, len(segs))
		}
		return nil
	})
	if err := ob.Append(outboxTestEvent(n)); err != nil {
		t.Fatalf("after draining: %v", err)
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ob.Append(outboxTestEvent(0)); !errors.Is(err, ErrOutboxClosed) {
		t.Fatalf("append after close: %v", err)
	}
	ob = openTestOutbox(t, dir, maxBytes)
	if rec := ob.Recovery(); rec.Unacked != 1 {
		t.Fatalf("after acknowledging all but one, reopening replays %d", rec.Unacked)
	}
}

// fillOutbox appends events until the outbox refuses one, and returns how
// many it took.
func fillOutbox(t *testing.T, ob *Outbox) int {
	t.Helper()
	for n := 0; n < 1_000_000; n++ {
		err := ob.Append(outboxTestEvent(n))
		if errors.Is(err, ErrOutboxFull) {
			waitDurable(t, ob, uint64(n))
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("the outbox never refused an event")
	return 0
}

// publishAll reads the outbox's n records, as the publisher does, and
// acknowledges them, as JetStream does.
func publishAll(t *testing.T, ob *Outbox, n int) {
	t.Helper()
	all := readAll(t, ob, 0, 0)
	if len(all) != n {
		t.Fatalf("the outbox holds %d records, want %d", len(all), n)
	}
	ob.ack(all[len(all)-1].seq)
}

// An outbox at its byte bound (billing.outbox_max_bytes: NATS down for
// long) failed to open the same way, with ErrOutboxFull.
func TestOutboxOpensAtItsByteBound(t *testing.T) {
	dir := t.TempDir()
	const maxBytes = 512 << 10
	ob := openTestOutbox(t, dir, maxBytes)
	n := fillOutbox(t, ob)
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	ob, err := OpenOutbox(dir, maxBytes)
	if err != nil {
		t.Fatalf("opening at the byte bound: %v", err)
	}
	t.Cleanup(func() { ob.Close() })
	if err := ob.Append(outboxTestEvent(n)); !errors.Is(err, ErrOutboxFull) {
		t.Fatalf("append at the byte bound: %v, want ErrOutboxFull", err)
	}
	publishAll(t, ob, n)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return ob.Append(outboxTestEvent(n))
	})
	waitDurable(t, ob, uint64(n+1))
	readAll(t, ob, uint64(n), n)
}

func TestOutboxIsLockedWhileOpen(t *testing.T) {
	dir := t.TempDir()
	openTestOutbox(t, dir, 0)
	if _, err := OpenOutbox(dir, 0); !errors.Is(err, ErrOutboxLocked) {
		t.Fatalf("second open: %v, want ErrOutboxLocked", err)
	}
}

const outboxChildEnv = "TOLLGATE_TEST_OUTBOX_CHILD"

// TestOutboxChild is the process TestOutboxSurvivesSIGKILL kills: it
// appends events as fast as it can, acknowledges half of what is written,
// and prints the written sequence as it grows. Written is not synced: what
// a killed process copied into the page cache must survive it.
func TestOutboxChild(t *testing.T) {
	dir := os.Getenv(outboxChildEnv)
	if dir == "" {
		return // only runs as the child
	}
	ob, err := OpenOutbox(dir, 0)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	go func() {
		// Enough to pass the parent's mark; more only makes it read longer.
		for i := range 50_000 {
			for ob.Append(outboxTestEvent(i)) != nil {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	for {
		seq, _, _ := ob.writtenState()
		ob.ack(seq / 2)
		fmt.Printf("durable %d\n", seq)
		time.Sleep(5 * time.Millisecond)
	}
}

func TestOutboxSurvivesSIGKILL(t *testing.T) {
	dir := t.TempDir()
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestOutboxChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), outboxChildEnv+"="+dir)
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Round 0 dies before the acked file is first written, the later
		// ones after the compactor has run a few times.
		started := time.Now()
		var durable uint64
		lines := bufio.NewScanner(stdout)
		for lines.Scan() && (durable < uint64(20_000*(round+1)) || round > 0 && time.Since(started) < 5*outboxAckPersistEvery) {
			if seq, ok := strings.CutPrefix(lines.Text(), "durable "); ok {
				durable, _ = strconv.ParseUint(seq, 10, 64)
			} else {
				t.Fatalf("child: %s", lines.Text())
			}
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, stdout)
		_ = cmd.Wait()

		ob, err := OpenOutbox(dir, 0)
		if err != nil {
			t.Fatalf("round %d: reopening after SIGKILL: %v", round, err)
		}
		acked := ob.ackedSeq()
		if round > 0 && acked == 0 {
			t.Fatalf("round %d: the acked sequence was never persisted", round)
		}
		recs := readAllRecords(t, ob, acked)
		if len(recs) == 0 || recs[0].seq != acked+1 || recs[len(recs)-1].seq < durable {
			t.Fatalf("round %d: replay from %d holds %d records; want from %d through at least %d", round, acked, len(recs), acked+1, durable)
		}
		for i, rec := range recs {
			if i > 0 && rec.seq != recs[i-1].seq+1 {
				t.Fatalf("round %d: sequence jumps from %d to %d", round, recs[i-1].seq, rec.seq)
			}
			var ev Event
			if err := json.Unmarshal(rec.data, &ev); err != nil || ev.ID != string(rec.id) {
				t.Fatalf("round %d: record %d: %v, id %q vs %q", round, rec.seq, err, ev.ID, rec.id)
			}
		}
		t.Logf("round %d: killed at durable %d, acked %d; replay %d-%d, %d bytes of torn tail cut", round, durable, acked, recs[0].seq, recs[len(recs)-1].seq, ob.Recovery().TruncatedBytes)
		if err := ob.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func readAllRecords(t testing.TB, ob *Outbox, after uint64) []outboxRecord {
	t.Helper()
	r := ob.newReader(after)
	defer r.close()
	var all []outboxRecord
	for {
		recs, err := r.next(4096)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			return all
		}
		for _, rec := range recs {
			all = append(all, rec.clone())
		}
	}
}

func FuzzDecodeOutboxRecord(f *testing.F) {
	body, _ := encodeOutboxPayload(outboxTestEvent(7))
	valid := appendOutboxRecord(nil, 7, 3, body)
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add(append(valid, valid...))
	f.Add([]byte{})
	f.Add([]byte{10, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, n, err := decodeOutboxRecord(b, 2)
		if err != nil {
			if n != 0 {
				t.Fatalf("error %v with length %d", err, n)
			}
			return
		}
		if n < outboxRecordHeader || n > len(b) || rec.seq == 0 {
			t.Fatalf("decoded length %d of %d bytes, sequence %d", n, len(b), rec.seq)
		}
		// What decodes survives encoding and decoding again.
		again, m, err := decodeOutboxRecord(appendOutboxRecord(nil, rec.seq, rec.batch, binaryPayload(rec)), 2)
		if err != nil || m > n || again.seq != rec.seq || again.batch != rec.batch || string(again.id) != string(rec.id) || string(again.account) != string(rec.account) || string(again.data) != string(rec.data) {
			t.Fatalf("round trip of %+v gave %+v, %v", rec, again, err)
		}
	})
}

func binaryPayload(rec outboxRecord) []byte {
	var out []byte
	for _, field := range []string{string(rec.id), string(rec.account)} {
		out = appendUvarint(out, uint64(len(field)))
		out = append(out, field...)
	}
	return append(out, rec.data...)
}

func appendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// clone copies rec out of the reader's buffer, which the next read reuses.
func (rec outboxRecord) clone() outboxRecord {
	rec.id, rec.account, rec.data = slices.Clone(rec.id), slices.Clone(rec.account), slices.Clone(rec.data)
	return rec
}

// A restarted publisher's look-up reaches back to the first unacknowledged
// event's time when the acked file is older than the duplicate window (it
// could not be replaced on a full disk while batches were still stored):
// reading only the window, it republished the records stored before it,
// and JetStream, past its window, stored and billing debited them twice.
func TestResumeLooksBackToTheFirstUnacknowledgedEvent(t *testing.T) {
	ob := openTestOutbox(t, t.TempDir(), 0)
	for i := range 5 {
		if err := ob.Append(outboxTestEvent(i)); err != nil {
			t.Fatal(err)
		}
	}
	first, ok := ob.eventTime(3)
	if want := outboxTestEvent(2).Time; !ok || !first.Equal(want) {
		t.Fatalf("eventTime(3) = %v, %v; want %v", first, ok, want)
	}
	if _, ok := ob.eventTime(6); ok {
		t.Fatal("eventTime of a record not written yet")
	}

	lastStored := first.Add(10 * time.Minute)
	if got, want := resumeLookFrom(lastStored, first, true), first.Add(-time.Minute); !got.Equal(want) {
		t.Errorf("acked file 10 minutes stale: look from %v, want %v", got, want)
	}
	if got, want := resumeLookFrom(lastStored, lastStored.Add(-time.Second), true), lastStored.Add(-UsageDuplicatesWindow); !got.Equal(want) {
		t.Errorf("acked file a second stale: look from %v, want the window, %v", got, want)
	}
	if got, want := resumeLookFrom(lastStored, time.Time{}, false), lastStored.Add(-UsageDuplicatesWindow); !got.Equal(want) {
		t.Errorf("first event unknown: look from %v, want the window, %v", got, want)
	}
}

// An outbox whose acked file is lost counts as acknowledged what came
// before its first record on disk (compaction deleted it for being
// acknowledged): from record 1, the publisher's look-up of what JetStream
// holds found no batch there and published every record again.
func TestOutboxWithoutItsAckedFileStartsAtItsFirstRecord(t *testing.T) {
	dir := t.TempDir()
	ob, err := OpenOutbox(dir, 1<<20) // 128 KiB segments
	if err != nil {
		t.Fatal(err)
	}
	appendEvents(t, ob, 0, 2000)
	waitDurable(t, ob, 2000)
	ob.ack(1500)
	var first uint64
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		ob.mu.Lock()
		first = ob.segments[0].first
		ob.mu.Unlock()
		if first <= 1 {
			return fmt.Errorf("the first segment held starts at %d", first)
		}
		return nil
	})
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, outboxAckedFile)); err != nil {
		t.Fatal(err)
	}
	ob = openTestOutbox(t, dir, 1<<20)
	if got := ob.ackedSeq(); got != first-1 {
		t.Fatalf("acknowledged through %d without the acked file, want %d (the record before the first held)", got, first-1)
	}
	if _, known := ob.eventTime(first); !known {
		t.Fatal("the first record held has no time to look back from")
	}
}

// Acknowledged segments are deleted even when the acked file cannot be
// written (a full disk, where replacing it needs a new file): kept, they
// filled the disk and the outbox refused every event although JetStream
// had them all.
func TestOutboxDeletesAcknowledgedSegmentsWhenItsAckedFileCannotBeWritten(t *testing.T) {
	dir := t.TempDir()
	ob := openTestOutbox(t, dir, 1<<20) // 128 KiB segments
	// A directory where the acked file's replacement is written: every
	// write of the acked file fails from here on.
	if err := os.MkdirAll(filepath.Join(dir, outboxAckedFile+".tmp", "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	appendEvents(t, ob, 0, 2000)
	waitDurable(t, ob, 2000)
	ob.ack(2000)
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		ob.mu.Lock()
		n := len(ob.segments)
		ob.mu.Unlock()
		if n > 1 {
			return fmt.Errorf("%d segments kept, all acknowledged but the current one", n)
		}
		return nil
	})
	if st := ob.Stats(); st.WriteFailures == 0 {
		t.Fatalf("stats %+v: the acked file's failure went uncounted", st)
	}
}

// A record damaged in the middle of a segment (a bit flipped on disk, not
// a write torn by a crash) is cut with the whole records after it, which
// the reader cannot find again: they are counted as lost, logged, and
// kept aside for a person. So is a segment missing between two others.
func TestOutboxSaysWhatDamageLost(t *testing.T) {
	dir := t.TempDir()
	segs := writtenSegments(t, dir, 0, 50)
	data, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	off := outboxHeaderSize
	for range 24 { // to the 25th record
		_, n, err := decodeOutboxRecord(data[off:], 2)
		if err != nil {
			t.Fatal(err)
		}
		off += n
	}
	data[off+outboxRecordHeader+20] ^= 0x20
	if err := os.WriteFile(segs[0], data, 0o600); err != nil {
		t.Fatal(err)
	}
	ob := openTestOutbox(t, dir, 0)
	notes := strings.Join(ob.Recovery().Notes, "\n")
	if !strings.Contains(notes, "LOST usage events: records 25 to 50 (26)") || !strings.Contains(notes, "the 25 intact records after it") {
		t.Fatalf("notes %q, want the damaged record and the 25 whole ones after it counted as lost", notes)
	}
	if aside, _ := filepath.Glob(filepath.Join(dir, "*.corrupt")); len(aside) != 1 {
		t.Fatalf("kept aside: %v", aside)
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}

	// A segment missing between two others.
	dir = t.TempDir()
	segs = writtenSegments(t, dir, 1<<20, 2000) // 128 KiB segments
	if len(segs) < 3 {
		t.Fatalf("segments %v, want 3 or more", segs)
	}
	if err := os.Remove(segs[1]); err != nil {
		t.Fatal(err)
	}
	ob = openTestOutbox(t, dir, 1<<20)
	if notes := strings.Join(ob.Recovery().Notes, "\n"); !strings.Contains(notes, "LOST usage events: records ") || !strings.Contains(notes, "are in no segment") {
		t.Fatalf("notes %q, want the missing segment's records counted as lost", notes)
	}
}

// Damage to records JetStream acknowledged loses nothing, and says so: it
// was reported as lost and not billed, and billing them by hand from the
// bytes kept aside would have charged them twice.
func TestOutboxDamageToAcknowledgedRecordsIsNoLoss(t *testing.T) {
	dir := t.TempDir()
	ob := openTestOutbox(t, dir, 0)
	appendEvents(t, ob, 0, 50)
	waitDurable(t, ob, 50)
	ob.ack(50)
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	if err := DamageRecord(dir, 25); err != nil {
		t.Fatal(err)
	}
	ob = openTestOutbox(t, dir, 0)
	notes := strings.Join(ob.Recovery().Notes, "\n")
	if strings.Contains(notes, "LOST") || !strings.Contains(notes, "nothing is lost") {
		t.Fatalf("notes %q, want the damage to acknowledged records reported as no loss", notes)
	}
}

// A logging key's event whose request and answer are megabytes is kept
// with its log cut, never dropped: the log is not what decides the bill.
func TestOutboxCutsAnOversizedLogAndKeepsTheEvent(t *testing.T) {
	ob := openTestOutbox(t, t.TempDir(), 0)
	ev := outboxTestEvent(0)
	request := strings.Repeat("\x01é", 200_000) // 600 KB, 6 bytes of JSON each control byte
	response := strings.Repeat("answer ", 100_000)
	ev.Log = &RequestLog{Request: request, Response: response, RetentionDays: 7}
	if err := ob.Append(ev); err != nil {
		t.Fatalf("append: %v; want the event kept with its log cut", err)
	}
	waitDurable(t, ob, 1)
	recs := readAllRecords(t, ob, 0)
	if len(recs) != 1 || len(recs[0].data) > maxOutboxEventBytes {
		t.Fatalf("%d records, the first of %d bytes; want one within %d", len(recs), len(recs[0].data), maxOutboxEventBytes)
	}
	var got Event
	if err := json.Unmarshal(recs[0].data, &got); err != nil {
		t.Fatal(err)
	}
	if got.CostNanos != ev.CostNanos || got.PromptTokens != ev.PromptTokens || got.Log == nil || got.Log.RetentionDays != 7 {
		t.Fatalf("event %+v; want its usage and log kept", got)
	}
	for _, c := range []struct{ name, got, whole string }{{"request", got.Log.Request, request}, {"response", got.Log.Response, response}} {
		i := strings.Index(c.got, "\n[tollgate: cut here, ")
		if i <= 0 || !strings.HasPrefix(c.whole, c.got[:i]) || !utf8.ValidString(c.got) {
			t.Errorf("%s logged as %.60q… (%d bytes); want its start and a cut line", c.name, c.got, len(c.got))
			continue
		}
		if want := fmt.Sprintf("\n[tollgate: cut here, %d more bytes not logged]", len(c.whole)-i); c.got[i:] != want {
			t.Errorf("%s ends %q; want %q", c.name, c.got[i:], want)
		}
	}
}

// A stream keeps no more of its answer than an event carries and counts
// the rest (RequestLog.ResponseLeftOut): the cut line reports every byte
// left out, whether the outbox cuts the log further or the event fits.
func TestOutboxCountsTheAnswerAStreamNeverKept(t *testing.T) {
	ob := openTestOutbox(t, t.TempDir(), 0)
	kept := strings.Repeat("answer ", MaxLogBytes/len("answer "))
	const leftOut = 5 << 20
	for i, c := range []struct{ request, response string }{
		{`{"model":"small"}`, kept},                 // over the bound: cut further
		{strings.Repeat("question ", 40_000), kept}, // the request cut too
		{`{"model":"small"}`, kept[:1000]},          // fits, and still says what is missing
	} {
		ev := outboxTestEvent(i)
		ev.Log = &RequestLog{Request: c.request, Response: c.response, ResponseLeftOut: leftOut, RetentionDays: 7}
		if err := ob.Append(ev); err != nil {
			t.Fatalf("append: %v", err)
		}
	}
	waitDurable(t, ob, 3)
	recs := readAllRecords(t, ob, 0)
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	for i, rec := range recs {
		var got Event
		if err := json.Unmarshal(rec.data, &got); err != nil {
			t.Fatal(err)
		}
		response := got.Log.Response
		at := strings.Index(response, "\n[tollgate: cut here, ")
		if at < 0 || !strings.HasPrefix(kept, response[:at]) {
			t.Errorf("event %d: answer logged as %.60q… (%d bytes); want its start and a cut line", i, response, len(response))
			continue
		}
		whole := len(kept)
		if i == 2 {
			whole = 1000
		}
		if want := fmt.Sprintf("\n[tollgate: cut here, %d more bytes not logged]", whole+leftOut-at); response[at:] != want {
			t.Errorf("event %d: answer ends %q; want %q", i, response[at:], want)
		}
	}
}

// A segment whose records JetStream has all acknowledged is reused in
// place on a full disk (restartSegmentLocked): its header is rewritten to
// the next sequence, then its records are zeroed. A crash (SIGKILL) can
// cut that short anywhere, on a disk whose acked file is old; the next
// start must then replay nothing, call nothing lost, and number the next
// event after the acknowledged ones. Numbered from the acked file on, it
// took numbers JetStream's stored batches already name.
func TestOutboxRecoversAReuseCutShortByACrash(t *testing.T) {
	// Bytes of records zeroed after the first record's head, which is
	// zeroed last (-2: its length and CRC too, its sequence left; -1:
	// all).
	for _, zeroed := range []int{0, 3, 100, -2, -1} {
		t.Run(strconv.Itoa(zeroed), func(t *testing.T) {
			dir := t.TempDir()
			segs := writtenSegments(t, dir, 0, 50)
			if err := writeAcked(dir, 20); err != nil { // not replaced since
				t.Fatal(err)
			}
			data, err := os.ReadFile(segs[0])
			if err != nil {
				t.Fatal(err)
			}
			binary.LittleEndian.PutUint64(data[len(outboxMagic):], 51)
			data = data[:recordsEnd(t, segs[0])]
			head := outboxHeaderSize + outboxRecordHeader + 8
			switch zeroed {
			case -1:
				clear(data[outboxHeaderSize:])
			case -2:
				clear(data[head:])
				clear(data[outboxHeaderSize : outboxHeaderSize+outboxRecordHeader])
			default:
				clear(data[head : head+zeroed])
			}
			if err := os.WriteFile(segs[0], data, 0o600); err != nil {
				t.Fatal(err)
			}

			for i := range 2 { // and once more after a start that wrote nothing
				ob := openTestOutbox(t, dir, 0)
				rec := ob.Recovery()
				notes := strings.Join(rec.Notes, "\n")
				if rec.Unacked != 0 || ob.ackedSeq() != 50 || strings.Contains(notes, "LOST") || strings.Contains(notes, "torn or corrupt") {
					t.Fatalf("recovery %+v, acknowledged through %d: want nothing to replay, through 50, nothing lost or damaged", rec, ob.ackedSeq())
				}
				if leftover := i == 0 && zeroed != -1; leftover != strings.Contains(notes, "records of its use before it was reused from sequence 51") ||
					leftover && !strings.Contains(notes, "nothing is lost") {
					t.Fatalf("recovery notes %q: want the old records called leftovers of the reuse, nothing lost (%v)", notes, leftover)
				}
				if aside, _ := filepath.Glob(filepath.Join(dir, "*.corrupt")); len(aside) != 0 {
					t.Fatalf("kept aside as damage: %v", aside)
				}
				if err := ob.Close(); err != nil {
					t.Fatal(err)
				}
			}
			ob := openTestOutbox(t, dir, 0)
			appendEvents(t, ob, 100, 101)
			waitDurable(t, ob, 51)
			if got := readAll(t, ob, 0, 100); len(got) != 1 || got[0].seq != 51 {
				t.Fatalf("the next event was read as %+v, want sequence 51 alone", got)
			}
		})
	}
}

// With outbox_max_bytes 1MiB (128 KiB segments), a logging key's call of
// 140k to 400k characters was answered and its usage event refused:
// "DROPPED usage event, not billed: outbox full: a 201241-byte event does
// not fit in a 131072-byte segment". The log is cut to what a segment
// holds, and the call billed in full.
func TestOutboxCutsALogToASmallSegmentAndKeepsTheEvent(t *testing.T) {
	ob := openTestOutbox(t, t.TempDir(), 1<<20) // 128 KiB segments
	for i, size := range []int{140_000, 400_000} {
		ev := outboxTestEvent(i)
		ev.Log = &RequestLog{Request: strings.Repeat("q", size), Response: strings.Repeat("a", size/2), RetentionDays: 7}
		if err := ob.Append(ev); err != nil {
			t.Fatalf("append of a call logging %d bytes: %v; want the event kept with its log cut", size, err)
		}
	}
	waitDurable(t, ob, 2)
	recs := readAllRecords(t, ob, 0)
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	for i, rec := range recs {
		var got Event
		if err := json.Unmarshal(rec.data, &got); err != nil {
			t.Fatal(err)
		}
		if want := outboxTestEvent(i); got.CostNanos != want.CostNanos || got.Log == nil || !strings.Contains(got.Log.Request, "\n[tollgate: cut here, ") {
			t.Fatalf("event %d: %+v; want its usage and its log cut", i, got)
		}
		// Cut to what fits, not halved until it fits: 300,000 bytes
		// kept 75,070 of the 131,032 a segment holds.
		if kept := len(got.Log.Request) + len(got.Log.Response); kept < 120_000 {
			t.Errorf("event %d: %d bytes of its log kept, want about what a 128 KiB segment holds", i, kept)
		}
	}
}
