package meter

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The outbox keeps usage events on local disk from the moment the request
// path hands them over until JetStream has acknowledged them, so a NATS
// outage or a crash loses nothing that reached the disk.
//
// On disk, <dir> holds segment files named by the sequence number of their
// first record (00000000000000000001.seg), each a magic header followed by
// records:
//
//	uint32 LE  body length n
//	uint32 LE  CRC-32C of the body
//	body:      uint64 LE outbox sequence | uvarint len | event id |
//	           uvarint len | account | event JSON
//
// and the file "acked", the sequence through which every record has been
// acknowledged by JetStream (uint64 LE, CRC-32C), replaced atomically.
// A crash can leave a torn record at the end of a segment; its length or
// CRC gives it away and opening the outbox cuts it off.

const (
	outboxMagic        = "TGOUTBX1"
	outboxSegmentExt   = ".seg"
	outboxAckedFile    = "acked"
	outboxLockFile     = "LOCK"
	outboxRecordHeader = 8 // length + CRC
	// maxOutboxRecordBody bounds a record, so a corrupt length is caught
	// before it turns into a huge allocation.
	maxOutboxRecordBody = 1 << 20
	// maxOutboxEventBytes bounds an event Append takes: far above a real
	// one (under 4 KiB), far below NATS's default 1 MB max_payload, so a
	// record always publishes.
	maxOutboxEventBytes = 256 << 10
	// outboxSegmentBytes is where the writer starts a new segment (or at
	// an eighth of the byte bound, if smaller): a segment is deleted whole
	// once acknowledged, so smaller ones free space sooner.
	outboxSegmentBytes = 8 << 20
	// outboxQueueLen is how many events wait in memory for the writer:
	// enough for about three seconds of a stalled disk at 20,000 events/s.
	outboxQueueLen = 65536
	// outboxMaxBatch bounds the records written with one fsync; so does
	// the segment size, which keeps the byte bound's overshoot small.
	outboxMaxBatch = 4096
	// outboxCloseAttempts is how often a closing outbox tries to write
	// what is queued before it gives it up.
	outboxCloseAttempts = 5
	// outboxAckPersistEvery paces rewriting the acked file. After a crash
	// at most this much acknowledged work is published again, which
	// JetStream drops as duplicates.
	outboxAckPersistEvery = 100 * time.Millisecond
	// DefaultOutboxMaxBytes is the disk bound used when OpenOutbox gets 0:
	// about 2.5 million events, two hours at 350 events/s.
	DefaultOutboxMaxBytes = 1 << 30
)

var (
	// ErrOutboxFull is returned by Append when the in-memory queue in front
	// of the disk is full: the disk is slower than the traffic, or the
	// outbox reached its byte bound because JetStream has been unreachable
	// for long. Fix the NATS connection or the disk; raise the bound for
	// longer outages.
	ErrOutboxFull = errors.New("outbox full")
	// ErrOutboxClosed is returned by Append after Close.
	ErrOutboxClosed = errors.New("outbox closed")
	// ErrOutboxLocked is returned by OpenOutbox when another process has
	// the directory open: give each gateway process its own data_dir.
	ErrOutboxLocked = errors.New("outbox directory in use by another process")
	// errOutboxCorrupt marks a record that fails its checks.
	errOutboxCorrupt = errors.New("corrupt outbox record")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// outboxRecord is one event as the publisher needs it.
type outboxRecord struct {
	seq     uint64
	id      string
	account string
	data    []byte // the event as JSON
}

// outboxSegment is one segment file. first never changes; last and size
// are guarded by Outbox.mu and count durable records only.
type outboxSegment struct {
	first uint64
	last  uint64 // 0 while it holds no record
	size  int64
	path  string
	skip  bool // moved aside by recover
}

// OutboxStats is a point-in-time view of the outbox.
type OutboxStats struct {
	Queued        int    // events waiting in memory for the writer
	Unacked       uint64 // events on disk not yet acknowledged by JetStream
	Bytes         int64  // size of the segment files
	Segments      int
	WriteFailures uint64 // failed writes or fsyncs, each retried
	LastWriteErr  error  // the last of them
	// Lost counts events given up because the disk kept failing while the
	// outbox was closing.
	Lost uint64
}

// OutboxRecovery says what OpenOutbox found on disk.
type OutboxRecovery struct {
	Unacked        uint64 // records to publish again
	TruncatedBytes int64  // torn or corrupt tails cut off
	Notes          []string
}

// queuedRecord is an encoded record body, without its sequence, and the
// channel to close once it is on disk (nil when nobody waits).
type queuedRecord struct {
	body    []byte
	durable chan struct{}
}

// Outbox is a bounded, durable, append-only queue of usage events. Append
// never waits on the disk: a writer goroutine writes what has queued up
// and fsyncs it, one batch per fsync (group commit). Records stay until
// they are acknowledged (ack) and the segment holding them is done.
type Outbox struct {
	dir      string
	maxBytes int64
	lock     *os.File
	recovery OutboxRecovery

	inMu     sync.RWMutex // guards sending on queue against closing it
	inClosed bool
	queue    chan queuedRecord

	segmentBytes int64 // where the writer starts a new segment

	// Owned by the writer goroutine (and by OpenOutbox before it starts).
	active  *os.File
	nextSeq uint64

	mu           sync.Mutex
	segments     []*outboxSegment // by first sequence; the last is active
	durableSeq   uint64           // last sequence fsynced
	acked        uint64           // in memory; persisted trails it
	persisted    uint64
	bytes        int64
	durable      chan struct{} // closed and replaced when durableSeq grows
	space        chan struct{} // closed and replaced when segments are deleted
	lastWriteErr error

	writeFailures atomic.Uint64
	lost          atomic.Uint64

	writerDone    chan struct{}
	stopCompactor chan struct{}
	compactorDone chan struct{}
	closeOnce     sync.Once
	closeErr      error
}

// OpenOutbox opens or creates the outbox in dir (for a gateway,
// <data_dir>/outbox), cutting off torn records a crash left behind.
// Records not acknowledged before are read first by the publisher.
// maxBytes bounds the segment files (0: DefaultOutboxMaxBytes); past it,
// events wait in memory, then Append refuses them.
//
// One process at a time may have dir open; Close releases it.
func OpenOutbox(dir string, maxBytes int64) (*Outbox, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultOutboxMaxBytes
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating outbox dir: %w", err)
	}
	lock, err := lockDir(filepath.Join(dir, outboxLockFile))
	if err != nil {
		return nil, err
	}
	ob := &Outbox{
		dir:           dir,
		maxBytes:      maxBytes,
		segmentBytes:  max(min(maxBytes/8, outboxSegmentBytes), 1),
		lock:          lock,
		queue:         make(chan queuedRecord, outboxQueueLen),
		durable:       make(chan struct{}),
		space:         make(chan struct{}),
		writerDone:    make(chan struct{}),
		stopCompactor: make(chan struct{}),
		compactorDone: make(chan struct{}),
	}
	if err := ob.recover(); err != nil {
		unlockDir(lock)
		return nil, err
	}
	if err := ob.startSegment(ob.nextSeq); err != nil {
		ob.closeFiles()
		return nil, err
	}
	go ob.write()
	go ob.compact()
	return ob, nil
}

// recover reads the acked file and the segments, cuts torn tails, deletes
// what is fully acknowledged and sets the next sequence.
func (ob *Outbox) recover() error {
	_ = os.Remove(filepath.Join(ob.dir, outboxAckedFile+".tmp"))
	acked, note := readAcked(filepath.Join(ob.dir, outboxAckedFile))
	if note != "" {
		ob.recovery.Notes = append(ob.recovery.Notes, note)
	}
	ob.acked, ob.persisted = acked, acked

	entries, err := os.ReadDir(ob.dir)
	if err != nil {
		return fmt.Errorf("reading outbox dir: %w", err)
	}
	var segments []*outboxSegment
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, outboxSegmentExt) {
			continue
		}
		first, err := strconv.ParseUint(strings.TrimSuffix(name, outboxSegmentExt), 10, 64)
		if err != nil || first == 0 {
			ob.recovery.Notes = append(ob.recovery.Notes, fmt.Sprintf("ignored %s: not a segment name", name))
			continue
		}
		segments = append(segments, &outboxSegment{first: first, path: filepath.Join(ob.dir, name)})
	}
	slices.SortFunc(segments, func(a, b *outboxSegment) int { return cmp.Compare(a.first, b.first) })

	maxSeq := acked
	for _, seg := range segments {
		if err := ob.recoverSegment(seg); err != nil {
			return err
		}
		if seg.skip {
			continue
		}
		if seg.last == 0 || seg.last <= acked {
			if err := os.Remove(seg.path); err != nil {
				return fmt.Errorf("removing outbox segment: %w", err)
			}
			continue
		}
		maxSeq = max(maxSeq, seg.last)
		ob.segments = append(ob.segments, seg)
		ob.bytes += seg.size
		ob.recovery.Unacked += seg.last - max(acked, seg.first-1)
	}
	ob.nextSeq = maxSeq + 1
	ob.durableSeq = maxSeq // what is on disk is synced above
	return nil
}

// recoverSegment scans a segment, truncating it after its last valid
// record, and fsyncs it: what a crashed process left in the page cache is
// durable from here on.
func (ob *Outbox) recoverSegment(seg *outboxSegment) error {
	f, err := os.OpenFile(seg.path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening outbox segment: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("reading outbox segment %s: %w", seg.path, err)
	}
	if !bytes.HasPrefix(data, []byte(outboxMagic)) {
		if strings.HasPrefix(outboxMagic, string(data)) {
			return nil // creation torn by a crash: no record, removed
		}
		// Not written by this code, or its header is damaged: keep it out
		// of the way for a person to look at, and go on without it.
		bad := seg.path + ".corrupt"
		if err := os.Rename(seg.path, bad); err != nil {
			return fmt.Errorf("outbox segment %s has no outbox header and cannot be moved aside: %w", seg.path, err)
		}
		ob.recovery.Notes = append(ob.recovery.Notes, fmt.Sprintf("moved %s aside to %s: no outbox header", filepath.Base(seg.path), filepath.Base(bad)))
		seg.skip = true
		return nil
	}
	off := len(outboxMagic)
	for off < len(data) {
		rec, n, err := decodeOutboxRecord(data[off:])
		if err != nil {
			break
		}
		if rec.seq < seg.first || rec.seq <= seg.last {
			// Out of order: not what the writer writes; treat as the tail.
			break
		}
		seg.last = rec.seq
		off += n
	}
	if off < len(data) {
		ob.recovery.TruncatedBytes += int64(len(data) - off)
		ob.recovery.Notes = append(ob.recovery.Notes, fmt.Sprintf("cut %d bytes of torn or corrupt records off %s after sequence %d",
			len(data)-off, filepath.Base(seg.path), seg.last))
		if err := f.Truncate(int64(off)); err != nil {
			return fmt.Errorf("truncating outbox segment: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing outbox segment: %w", err)
	}
	seg.size = int64(off)
	return nil
}

// Recovery says what opening found: unacknowledged events and cut tails.
func (ob *Outbox) Recovery() OutboxRecovery { return ob.recovery }

// Append queues ev to be written and fsynced by the writer goroutine; it
// never waits on the disk. An error means ev is not in the outbox:
// ErrOutboxFull or ErrOutboxClosed, or ev does not encode.
func (ob *Outbox) Append(ev *Event) error {
	return ob.append(ev, nil)
}

// AppendDurable is Append that also returns a channel closed once ev is
// fsynced (or, after repeated write failures while closing, given up and
// counted as lost). The gateway waits on it before it tells a client a
// call is complete, so a call whose answer a client received is billed
// even if the process is killed right after.
func (ob *Outbox) AppendDurable(ev *Event) (<-chan struct{}, error) {
	done := make(chan struct{})
	if err := ob.append(ev, done); err != nil {
		return nil, err
	}
	return done, nil
}

func (ob *Outbox) append(ev *Event, durable chan struct{}) error {
	body, err := encodeOutboxPayload(ev)
	if err != nil {
		return err
	}
	ob.inMu.RLock()
	defer ob.inMu.RUnlock()
	if ob.inClosed {
		return ErrOutboxClosed
	}
	select {
	case ob.queue <- queuedRecord{body: body, durable: durable}:
		return nil
	default:
		return ErrOutboxFull
	}
}

// Stats reports the outbox's current state.
func (ob *Outbox) Stats() OutboxStats {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return OutboxStats{
		Queued:        len(ob.queue),
		Unacked:       ob.durableSeq - min(ob.acked, ob.durableSeq),
		Bytes:         ob.bytes,
		Segments:      len(ob.segments),
		WriteFailures: ob.writeFailures.Load(),
		LastWriteErr:  ob.lastWriteErr,
		Lost:          ob.lost.Load(),
	}
}

// ack records that JetStream has acknowledged every record through seq.
func (ob *Outbox) ack(seq uint64) {
	ob.mu.Lock()
	ob.acked = max(ob.acked, seq)
	ob.mu.Unlock()
}

// ackedSeq is the sequence through which every record is acknowledged.
func (ob *Outbox) ackedSeq() uint64 {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return ob.acked
}

// durableState returns the last durable sequence and a channel closed
// when it grows.
func (ob *Outbox) durableState() (uint64, <-chan struct{}) {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return ob.durableSeq, ob.durable
}

// closeInput refuses further Appends and lets the writer finish what is
// queued; it returns once that is on disk.
func (ob *Outbox) closeInput() {
	ob.inMu.Lock()
	if !ob.inClosed {
		ob.inClosed = true
		close(ob.queue)
	}
	ob.inMu.Unlock()
	<-ob.writerDone
}

// Close writes what is queued, persists the acknowledged sequence and
// releases the directory. Unacknowledged records stay for the next open.
func (ob *Outbox) Close() error {
	ob.closeOnce.Do(func() {
		ob.closeInput()
		close(ob.stopCompactor)
		<-ob.compactorDone
		ob.closeErr = ob.closeFiles()
	})
	return ob.closeErr
}

func (ob *Outbox) closeFiles() error {
	var err error
	if ob.active != nil {
		err = ob.active.Close()
		ob.active = nil
	}
	unlockDir(ob.lock)
	return err
}

// write is the writer goroutine: it takes what has queued up, writes it
// with one fsync, and repeats until the queue is closed and empty. It owns
// nextSeq and active.
func (ob *Outbox) write() {
	defer close(ob.writerDone)
	var backoff time.Duration
	var waiting []chan struct{}
	for {
		ob.waitForSpace()
		rec, ok := <-ob.queue
		if !ok {
			return
		}
		waiting = waiting[:0]
		if rec.durable != nil {
			waiting = append(waiting, rec.durable)
		}
		first := ob.nextSeq
		last := first
		framed := appendOutboxRecord(nil, last, rec.body)
		batchBytes := ob.segmentBytes
		if ob.closing() {
			batchBytes = math.MaxInt64 // over the bound anyway; finish quickly
		}
	drain:
		for n := 1; n < outboxMaxBatch && int64(len(framed)) < batchBytes; n++ {
			select {
			case rec, ok := <-ob.queue:
				if !ok {
					break drain
				}
				last++
				framed = appendOutboxRecord(framed, last, rec.body)
				if rec.durable != nil {
					waiting = append(waiting, rec.durable)
				}
			default:
				break drain
			}
		}
		ob.nextSeq = last + 1
		for attempt := 1; ; attempt++ {
			err := ob.commit(framed, first, last)
			if err == nil {
				backoff = 0
				break
			}
			ob.writeFailures.Add(1)
			ob.mu.Lock()
			ob.lastWriteErr = err
			ob.mu.Unlock()
			if attempt >= outboxCloseAttempts && ob.closing() {
				// Nobody is left to retry for: give the batch up, counted.
				ob.lost.Add(last - first + 1)
				break
			}
			backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
			time.Sleep(backoff)
		}
		for _, c := range waiting {
			close(c)
		}
	}
}

func (ob *Outbox) closing() bool {
	ob.inMu.RLock()
	defer ob.inMu.RUnlock()
	return ob.inClosed
}

// waitForSpace blocks while the segments are over the byte bound, so
// events wait in the queue and, once it is full, Append refuses them.
// When the outbox is closing it writes what is queued even over the bound:
// losing money to stay under a disk quota is worse.
func (ob *Outbox) waitForSpace() {
	for {
		ob.mu.Lock()
		over, space := ob.bytes >= ob.maxBytes, ob.space
		ob.mu.Unlock()
		if !over || ob.closing() {
			return
		}
		select {
		case <-space:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// commit writes the framed records first..last to the active segment and
// fsyncs it. On failure the segment is cut back to its durable size and,
// since a failed fsync leaves the file's state unknown, a fresh segment
// takes the retry.
func (ob *Outbox) commit(framed []byte, first, last uint64) error {
	if ob.active == nil {
		if err := ob.replaceActive(first); err != nil {
			return err
		}
	}
	ob.mu.Lock()
	seg := ob.segments[len(ob.segments)-1]
	offset := seg.size
	ob.mu.Unlock()
	_, err := ob.active.WriteAt(framed, offset)
	if err == nil {
		err = ob.active.Sync()
	}
	if err != nil {
		_ = ob.active.Truncate(offset)
		_ = ob.active.Close()
		ob.active = nil
		return fmt.Errorf("writing outbox segment %s: %w", filepath.Base(seg.path), err)
	}
	ob.mu.Lock()
	seg.size += int64(len(framed))
	seg.last = last
	ob.bytes += int64(len(framed))
	ob.durableSeq = last
	close(ob.durable)
	ob.durable = make(chan struct{})
	rotate := seg.size >= ob.segmentBytes
	ob.mu.Unlock()
	if rotate {
		// The batch is durable either way; a failed rotation is retried
		// by the next commit.
		_ = ob.active.Close()
		ob.active = nil
		if err := ob.startSegment(last + 1); err != nil {
			ob.writeFailures.Add(1)
		}
	}
	return nil
}

// replaceActive opens a fresh active segment for the batch starting at
// first. An active segment that never got a durable record is dropped: it
// is named after the same sequence.
func (ob *Outbox) replaceActive(first uint64) error {
	ob.mu.Lock()
	var stale *outboxSegment
	if n := len(ob.segments); n > 0 && ob.segments[n-1].last == 0 {
		stale = ob.segments[n-1]
		ob.segments = ob.segments[:n-1]
		ob.bytes -= stale.size
	}
	ob.mu.Unlock()
	if stale != nil && stale.first != first {
		_ = os.Remove(stale.path)
	}
	return ob.startSegment(first)
}

// startSegment creates the segment whose first record will be first and
// makes it the active one. A file of that name holds no durable record
// and is overwritten.
func (ob *Outbox) startSegment(first uint64) error {
	path := filepath.Join(ob.dir, fmt.Sprintf("%020d%s", first, outboxSegmentExt))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("creating outbox segment: %w", err)
	}
	if _, err := f.WriteString(outboxMagic); err != nil {
		f.Close()
		return fmt.Errorf("writing outbox segment header: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("syncing outbox segment: %w", err)
	}
	if err := syncDir(ob.dir); err != nil {
		f.Close()
		return err
	}
	ob.active = f
	ob.mu.Lock()
	ob.segments = append(ob.segments, &outboxSegment{first: first, size: int64(len(outboxMagic)), path: path})
	ob.bytes += int64(len(outboxMagic))
	ob.mu.Unlock()
	return nil
}

// compact persists the acknowledged sequence and deletes the segments it
// covers, every outboxAckPersistEvery and once more when the outbox closes.
func (ob *Outbox) compact() {
	defer close(ob.compactorDone)
	tick := time.NewTicker(outboxAckPersistEvery)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			ob.compactOnce()
		case <-ob.stopCompactor:
			ob.compactOnce()
			return
		}
	}
}

func (ob *Outbox) compactOnce() {
	ob.mu.Lock()
	acked, persisted := ob.acked, ob.persisted
	ob.mu.Unlock()
	if acked == persisted {
		return
	}
	// The acked file goes first: a segment deleted before it would be
	// missing from a replay, which is harmless, but the other order keeps
	// what is on disk consistent with what it says.
	if err := writeAcked(ob.dir, acked); err != nil {
		ob.writeFailures.Add(1)
		return
	}
	ob.mu.Lock()
	ob.persisted = acked
	var done []*outboxSegment
	keep := ob.segments[:0]
	for i, seg := range ob.segments {
		if i < len(ob.segments)-1 && seg.last <= acked {
			done = append(done, seg)
			ob.bytes -= seg.size
			continue
		}
		keep = append(keep, seg)
	}
	clear(ob.segments[len(keep):])
	ob.segments = keep
	if len(done) > 0 {
		close(ob.space)
		ob.space = make(chan struct{})
	}
	ob.mu.Unlock()
	for _, seg := range done {
		if err := os.Remove(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			ob.writeFailures.Add(1)
		}
	}
}

// segmentFor returns the segment holding seq, or else the first one
// after it, with its durable size and whether a newer segment follows.
func (ob *Outbox) segmentFor(seq uint64) (seg outboxSegment, newer, ok bool) {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	i, found := slices.BinarySearchFunc(ob.segments, seq, func(s *outboxSegment, seq uint64) int { return cmp.Compare(s.first, seq) })
	if !found && i > 0 && (ob.segments[i-1].last >= seq || i == len(ob.segments)) {
		i--
	}
	if i >= len(ob.segments) {
		return outboxSegment{}, false, false
	}
	return *ob.segments[i], i < len(ob.segments)-1, true
}

// outboxReader reads durable records in sequence order, following the
// writer. It is used by one goroutine.
type outboxReader struct {
	ob    *Outbox
	after uint64 // last sequence returned
	seg   outboxSegment
	file  *os.File
	off   int64  // file offset of buf[0]
	buf   []byte // read but not yet decoded
}

func (ob *Outbox) newReader(after uint64) *outboxReader {
	return &outboxReader{ob: ob, after: after}
}

func (r *outboxReader) close() {
	if r.file != nil {
		_ = r.file.Close()
		r.file = nil
	}
	r.buf = nil
}

// next returns up to limit durable records after the last one returned,
// none when it has caught up with the writer.
func (r *outboxReader) next(limit int) ([]outboxRecord, error) {
	var out []outboxRecord
	for len(out) < limit {
		if r.file == nil {
			seg, _, ok := r.ob.segmentFor(r.after + 1)
			if !ok {
				break
			}
			f, err := os.Open(seg.path)
			if err != nil {
				return out, fmt.Errorf("opening outbox segment: %w", err)
			}
			r.seg, r.file, r.off, r.buf = seg, f, int64(len(outboxMagic)), nil
		}
		for len(out) < limit {
			rec, n, err := decodeOutboxRecord(r.buf)
			if errors.Is(err, io.ErrUnexpectedEOF) {
				break
			}
			if err != nil {
				return out, fmt.Errorf("%s at offset %d: %w", r.seg.path, r.off, err)
			}
			r.buf = r.buf[n:]
			r.off += int64(n)
			if rec.seq <= r.after {
				continue // written again after a failed write
			}
			rec.data = slices.Clone(rec.data) // r.buf is reused
			r.after = rec.seq
			out = append(out, rec)
		}
		if len(out) >= limit {
			break
		}
		cur, newer, ok := r.ob.segmentFor(r.seg.first)
		if !ok || cur.first != r.seg.first {
			// Deleted: everything in it was acknowledged, so read on
			// from the segment holding the next sequence.
			r.close()
			continue
		}
		if end := r.off + int64(len(r.buf)); end < cur.size {
			buf := make([]byte, len(r.buf)+int(min(cur.size-end, 1<<20)))
			copy(buf, r.buf)
			n, err := r.file.ReadAt(buf[len(r.buf):], end)
			r.buf = buf[:len(r.buf)+n]
			if err != nil && !errors.Is(err, io.EOF) {
				return out, fmt.Errorf("reading outbox segment: %w", err)
			}
			continue
		}
		if !newer {
			break // caught up with the writer
		}
		if len(r.buf) > 0 {
			return out, fmt.Errorf("%s: %d bytes at its end are no record: %w", r.seg.path, len(r.buf), errOutboxCorrupt)
		}
		r.after = max(r.after, cur.last)
		r.close()
	}
	return out, nil
}

// skipSegment gives up on the rest of the segment being read, after
// corruption.
func (r *outboxReader) skipSegment() {
	if r.file != nil {
		if cur, _, ok := r.ob.segmentFor(r.seg.first); ok && cur.first == r.seg.first {
			r.after = max(r.after, cur.last)
		}
	}
	r.close()
}

// encodeOutboxPayload encodes ev as a record body without its sequence.
func encodeOutboxPayload(ev *Event) ([]byte, error) {
	data, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encoding usage event %s: %w", ev.ID, err)
	}
	body := make([]byte, 0, 2*binary.MaxVarintLen16+len(ev.ID)+len(ev.Account)+len(data))
	body = binary.AppendUvarint(body, uint64(len(ev.ID)))
	body = append(body, ev.ID...)
	body = binary.AppendUvarint(body, uint64(len(ev.Account)))
	body = append(body, ev.Account...)
	body = append(body, data...)
	if len(body) > maxOutboxEventBytes {
		return nil, fmt.Errorf("usage event %s encodes to %d bytes, over the %d an event may take", ev.ID, len(body), maxOutboxEventBytes)
	}
	return body, nil
}

// appendOutboxRecord frames payload as the record seq.
func appendOutboxRecord(dst []byte, seq uint64, payload []byte) []byte {
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(8+len(payload)))
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint64(dst, seq)
	dst = append(dst, payload...)
	binary.LittleEndian.PutUint32(dst[start+4:], crc32.Checksum(dst[start+outboxRecordHeader:], castagnoli))
	return dst
}

// decodeOutboxRecord decodes the record at the start of b and returns its
// length. io.ErrUnexpectedEOF means b ends inside the record: at the end
// of a segment, a torn write. The returned fields alias b.
func decodeOutboxRecord(b []byte) (outboxRecord, int, error) {
	if len(b) < outboxRecordHeader {
		return outboxRecord{}, 0, io.ErrUnexpectedEOF
	}
	n := binary.LittleEndian.Uint32(b)
	if n < 8+2 || n > maxOutboxRecordBody {
		return outboxRecord{}, 0, fmt.Errorf("%w: body length %d", errOutboxCorrupt, n)
	}
	if len(b) < outboxRecordHeader+int(n) {
		return outboxRecord{}, 0, io.ErrUnexpectedEOF
	}
	body := b[outboxRecordHeader : outboxRecordHeader+int(n)]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
		return outboxRecord{}, 0, fmt.Errorf("%w: checksum mismatch", errOutboxCorrupt)
	}
	rec := outboxRecord{seq: binary.LittleEndian.Uint64(body)}
	if rec.seq == 0 {
		return outboxRecord{}, 0, fmt.Errorf("%w: sequence 0", errOutboxCorrupt)
	}
	rest := body[8:]
	var fields [2]string
	for i := range fields {
		l, k := binary.Uvarint(rest)
		if k <= 0 || l > uint64(len(rest)-k) {
			return outboxRecord{}, 0, fmt.Errorf("%w: field %d length", errOutboxCorrupt, i)
		}
		fields[i] = string(rest[k : k+int(l)])
		rest = rest[k+int(l):]
	}
	rec.id, rec.account, rec.data = fields[0], fields[1], rest
	return rec, outboxRecordHeader + int(n), nil
}

// readAcked reads the acknowledged sequence; a missing or damaged file
// reads as 0 (replay everything on disk: duplicates are dropped by
// JetStream) with a note saying so.
func readAcked(path string) (uint64, string) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, ""
	}
	if err != nil || len(b) != 12 || crc32.Checksum(b[:8], castagnoli) != binary.LittleEndian.Uint32(b[8:]) {
		return 0, fmt.Sprintf("%s unreadable (%v, %d bytes): replaying every record on disk", path, err, len(b))
	}
	return binary.LittleEndian.Uint64(b), ""
}

// writeAcked replaces the acked file atomically and durably.
func writeAcked(dir string, seq uint64) error {
	b := binary.LittleEndian.AppendUint64(nil, seq)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	tmp := filepath.Join(dir, outboxAckedFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("writing outbox acked file: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, outboxAckedFile))
	}
	if err != nil {
		return fmt.Errorf("writing outbox acked file: %w", err)
	}
	return syncDir(dir)
}

// syncDir makes created, renamed and removed names in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing outbox dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing outbox dir: %w", err)
	}
	return nil
}
