package meter

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tollgate/tollgate/internal/durable"
	"github.com/tollgate/tollgate/internal/utf8cut"
)

// The outbox keeps usage events on local disk from the moment the request
// path hands them over until JetStream has acknowledged them, so a NATS
// outage or a crash loses nothing that reached the outbox.
//
// Appending is a copy into a shared memory map of the active segment file,
// under a short lock: no system call, no wait. What is copied is in the
// kernel's page cache at once, so a killed process (SIGKILL included)
// loses none of it; a syncer goroutine writes it to disk in the background
// (durability "process"), or at once with the caller waiting on it
// (durability "fsync"). Segments are preallocated, so a full disk shows
// when a segment is created, as refused events, never as a SIGBUS.
//
// On disk, <dir> holds segment files (<n>.seg), each a header followed by
// records:
//
//	header:    magic "TGOUTBX2" | uint64 LE first sequence (0: never used)
//	uint32 LE  body length n
//	uint32 LE  CRC-32C of the body
//	body:      uint64 LE outbox sequence | uint64 LE batch | uvarint len |
//	           event id | uvarint len | account | event JSON
//
// then zeros up to the preallocated size. Events of one batch go to
// JetStream as one message; the batch number is fixed when the event is
// appended, so a batch published again after a crash is the same batch,
// under the same message id, and JetStream drops it as a duplicate.
// Segments of the first format ("TGOUTBX1", named by their first sequence,
// no batch numbers) are still read: each of their events is its own batch.
//
// The file "acked" holds the sequence through which every record has been
// acknowledged by JetStream (uint64 LE, CRC-32C), replaced atomically;
// the file "written", in the same form, the last record on disk when the
// outbox was last closed.
// A crash can leave a torn record at the end of a segment; its length or
// CRC gives it away and opening the outbox cuts it off.

// Durability says what a record must reach before an answer may go out.
type Durability string

const (
	// DurabilityProcess: the page cache (survives a killed process; a
	// power loss loses the last fsync interval).
	DurabilityProcess Durability = "process"
	// DurabilityFsync: the disk (survives a power loss); each answer waits
	// for a group-committed fsync.
	DurabilityFsync Durability = "fsync"
)

// OutboxOptions configures an outbox; zero values take the defaults.
type OutboxOptions struct {
	MaxBytes      int64 // bound on the segment files; default DefaultOutboxMaxBytes
	Durability    Durability
	FsyncInterval time.Duration // process durability: how often written records are synced; default 100ms
	// A batch (one JetStream message) closes at BatchMaxEvents events or
	// BatchMaxBytes of event JSON, whichever comes first.
	BatchMaxEvents int // default 1000
	BatchMaxBytes  int // default 512 KiB; at most 768 KiB
}

const (
	outboxMagicV1      = "TGOUTBX1"
	outboxMagic        = "TGOUTBX2"
	outboxHeaderSize   = len(outboxMagic) + 8
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
	// outboxSegmentBytes is the size of a segment (or an eighth of the
	// byte bound, if smaller): a segment is deleted whole once
	// acknowledged, and its mapping is resident while it is active, so
	// smaller ones free disk and memory sooner.
	outboxSegmentBytes = 4 << 20
	// outboxAckPersistEvery paces rewriting the acked file. After a crash
	// at most this much acknowledged work is published again, which
	// JetStream drops as duplicates.
	outboxAckPersistEvery = 100 * time.Millisecond
	// DefaultOutboxMaxBytes is the disk bound used when OpenOutbox gets 0:
	// about 2.5 million events, two hours at 350 events/s.
	DefaultOutboxMaxBytes = 1 << 30
	// outboxSpareRetry is how often a segment is tried again after one
	// could not be made (a full disk): meanwhile events that need one are
	// refused at once.
	outboxSpareRetry = 100 * time.Millisecond
	// DefaultFsyncInterval is how often process durability syncs.
	DefaultFsyncInterval = 100 * time.Millisecond
	// DefaultBatchMaxEvents and DefaultBatchMaxBytes bound a batch.
	DefaultBatchMaxEvents = 1000
	DefaultBatchMaxBytes  = 512 << 10
	// MaxBatchBytes keeps a batch, framing included, under NATS's default
	// 1 MB max_payload.
	MaxBatchBytes = 768 << 10
)

// outboxWrittenFile holds the last record on disk when the outbox was
// closed (uint64 LE, CRC-32C, as the acked file): the records up to it
// were written, so the next start can tell the newest ones went missing.
const outboxWrittenFile = "written"

var (
	// ErrOutboxFull is returned by Append when no segment has room: the
	// outbox reached its byte bound because JetStream has been unreachable
	// for long, or the disk is full. Fix the NATS connection or free disk;
	// raise the bound for longer outages.
	ErrOutboxFull = errors.New("outbox full")
	// ErrOutboxUnwritable is returned by Append while the outbox's last
	// sync to disk failed (an I/O error, a file system remounted
	// read-only): a record copied in then could not be kept. Fix the disk;
	// events are taken again once a sync succeeds.
	ErrOutboxUnwritable = errors.New("the outbox cannot write to its disk")
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
	batch   uint64 // 0 in segments of the first format: a batch of its own
	id      []byte
	account []byte
	data    []byte // the event as JSON
}

// outboxSegment is one segment file. first never changes; last and size
// are guarded by Outbox.mu and count durable records only.
type outboxSegment struct {
	first   uint64
	last    uint64 // 0 while it holds no record
	size    int64  // bytes written: header and records
	path    string
	skip    bool // moved aside by recover
	version int  // 1 or 2: its format
	// damageKept: recover left damaged bytes past its records for a
	// person to look at (the disk had no room to copy them aside).
	damageKept bool
	// damage: recover cut whole records not all acknowledged off it
	// after a damaged one. The LOST line is worded once the records
	// after it are known to end (recover), so that it is the only one.
	damage *segmentDamage
}

// segmentDamage is what recoverSegment cut off a segment after a damaged
// record.
type segmentDamage struct {
	cut     string // what was cut, from where
	intact  int    // whole records after the damaged one
	unacked int    // of which JetStream had not acknowledged
	acked   uint64 // the acked file's record
	kept    string // where the bytes are
}

// OutboxStats is a point-in-time view of the outbox.
type OutboxStats struct {
	Queued        int    // always 0: appending writes the record at once
	Unacked       uint64 // events written and not yet acknowledged by JetStream
	Bytes         int64  // size of the segment files
	Segments      int
	WriteFailures uint64 // failed writes or fsyncs, each retried
	LastWriteErr  error  // the last of them
	// Lost counts events the outbox took but could not write to disk,
	// each logged with its JSON: a JetStream on another disk may still
	// have taken them from memory.
	Lost uint64
	// Unwritable: the last sync failed, and appends are refused until
	// one succeeds.
	Unwritable bool
}

// OutboxRecovery says what OpenOutbox found on disk.
type OutboxRecovery struct {
	Unacked        uint64 // records to publish again
	TruncatedBytes int64  // torn or corrupt tails cut off
	Notes          []string
	// Missing is the records the outbox wrote and holds no more that
	// nothing on disk says JetStream acknowledged: the batches JetStream
	// stored decide whether they are lost (publishLoop.reportMissing).
	Missing []MissingRecords
}

// MissingRecords is records from From to To an outbox wrote and found on
// no segment at its start. Where says how it knows they were written.
type MissingRecords struct {
	From, To uint64
	Where    string
}

// mappedSegment is a segment file mapped for appending.
type mappedSegment struct {
	seg    *outboxSegment // nil for a spare not yet in use
	file   *os.File
	mem    []byte
	synced int // bytes of mem known to be on disk
}

// Outbox is a bounded, durable, append-only queue of usage events. Append
// copies a record into the mapped active segment and returns; the syncer
// goroutine writes the pages to disk. Records stay until they are
// acknowledged (ack) and the segment holding them is done.
type Outbox struct {
	dir      string
	opts     OutboxOptions
	lock     *os.File
	recovery OutboxRecovery
	// id names this outbox for good (the file "id" in its directory): its
	// batches go to usage.batch.<id>, so that after a restart the last one
	// JetStream stored can be found (see Publisher).
	id string
	// recoveredThrough is the last sequence written before this open: only
	// records up to it can have been published by an earlier process.
	recoveredThrough uint64

	segmentBytes int64 // size of a preallocated segment

	mu           sync.Mutex
	closed       bool
	active       *mappedSegment // nil until one could be made
	spare        *mappedSegment // made ahead by the syncer, so Append never creates files
	retired      []*mappedSegment
	nextSeq      uint64
	nextFile     uint64 // number of the next segment file
	writtenSeq   uint64 // last sequence copied into a segment
	durableSeq   uint64 // last sequence synced to disk
	openBatch    uint64 // batch new events join
	openCount    int
	openBytes    int
	waiters      []durableWaiter  // fsync durability: appends waiting for the disk
	segments     []*outboxSegment // by first sequence; the last may be active
	acked        uint64           // in memory; persisted trails it
	persisted    uint64
	bytes        int64
	written      chan struct{} // 1-buffered: records were appended
	syncNow      chan struct{} // 1-buffered: wake the syncer
	lastWriteErr error
	// spareErr is why the last segment could not be made, nil once one
	// is. While it is set, an append that needs a segment is refused at
	// once, and the syncer tries again from spareRetry on, or as soon as
	// compaction deleted a segment. (Until 2026-11-27 every refused event
	// made, preallocated and deleted a segment file with ob.mu held: on a
	// full disk, over a hundred failures a second, each append waiting.)
	spareErr   error
	spareRetry time.Time
	// diskErr is why the last sync of appended records failed, nil once
	// one succeeds. While it is set appends are refused: on a file system
	// remounted read-only after an I/O error the mapped pages can never be
	// written back, and the records copied into them were lost at the
	// next start, unbilled and unlogged, while the outbox counted them as
	// waiting for JetStream. Each record a failed sync covered is logged
	// with its JSON once: reportedSeq is the last one dealt with.
	diskErr     error
	reportedSeq uint64
	// syncMem writes a mapped range to disk: syncMapped, or the failing
	// stand-in of a test. logf says what could not be written. Both are
	// read under mu.
	syncMem func([]byte) error
	logf    func(string, ...any)

	writeFailures atomic.Uint64
	lost          atomic.Uint64
	// refusal mirrors refusalLocked, set under mu wherever what it reads
	// changes, so that Refusal, which a readiness probe asks, reads it
	// without the lock: mu is held across the making of a segment file.
	refusal atomic.Int32

	stopSyncer    chan struct{}
	syncerDone    chan struct{}
	stopCompactor chan struct{}
	compactorDone chan struct{}
	closeOnce     sync.Once
	closeErr      error
}

type durableWaiter struct {
	seq  uint64
	done chan struct{}
}

// encodeBufPool holds the buffers events are encoded in before the copy.
var encodeBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// OpenOutbox opens or creates the outbox in dir with default options
// but for the byte bound (0: DefaultOutboxMaxBytes).
func OpenOutbox(dir string, maxBytes int64) (*Outbox, error) {
	return OpenOutboxWith(dir, OutboxOptions{MaxBytes: maxBytes})
}

// OpenOutboxWith opens or creates the outbox in dir (for a gateway,
// <data_dir>/outbox), cutting off torn records a crash left behind.
// Records not acknowledged before are read first by the publisher.
//
// One process at a time may have dir open; Close releases it.
func OpenOutboxWith(dir string, opts OutboxOptions) (*Outbox, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultOutboxMaxBytes
	}
	if opts.Durability == "" {
		opts.Durability = DurabilityProcess
	}
	if opts.FsyncInterval <= 0 {
		opts.FsyncInterval = DefaultFsyncInterval
	}
	if opts.BatchMaxEvents <= 0 {
		opts.BatchMaxEvents = DefaultBatchMaxEvents
	}
	if opts.BatchMaxBytes <= 0 {
		opts.BatchMaxBytes = DefaultBatchMaxBytes
	}
	opts.BatchMaxBytes = min(opts.BatchMaxBytes, MaxBatchBytes)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating outbox dir: %w", err)
	}
	lock, err := lockDir(filepath.Join(dir, outboxLockFile))
	if err != nil {
		return nil, err
	}
	ob := &Outbox{
		dir:           dir,
		opts:          opts,
		segmentBytes:  max(min(opts.MaxBytes/8, outboxSegmentBytes), 64<<10),
		lock:          lock,
		written:       make(chan struct{}, 1),
		syncNow:       make(chan struct{}, 1),
		stopSyncer:    make(chan struct{}),
		syncerDone:    make(chan struct{}),
		stopCompactor: make(chan struct{}),
		compactorDone: make(chan struct{}),
		syncMem:       syncMapped,
		logf:          func(string, ...any) {},
	}
	if err := ob.recover(); err != nil {
		unlockDir(lock)
		return nil, err
	}
	if ob.id, err = readOrCreateOutboxID(dir); err != nil {
		unlockDir(lock)
		return nil, err
	}
	ob.recoveredThrough = ob.writtenSeq
	// A full disk, or an outbox at its byte bound, opens all the same,
	// without a segment to append to: what it holds must reach JetStream,
	// which is what frees it. Until then it refuses new events, as it does
	// when the disk fills while running. (Until 2026-11-27 the open
	// failed, and a gateway stopped after the outbox had filled its disk
	// could not start to publish the events it held.)
	spare, err := ob.newSpare()
	recycled := err != nil && ob.recycleLast()
	ob.mu.Lock()
	if err != nil {
		ob.spareFailedLocked(err)
		if recycled {
			ob.recovery.Notes = append(ob.recovery.Notes, fmt.Sprintf("no new segment could be made (%v): the last one, acknowledged, is reused", err))
		} else {
			ob.recovery.Notes = append(ob.recovery.Notes, fmt.Sprintf("no new segment could be made (%v): new usage events are refused, and logged, until the disk has room or JetStream has acknowledged what the outbox holds", err))
		}
	} else {
		ob.spare = spare
		if err := ob.rotateLocked(); err != nil {
			ob.recovery.Notes = append(ob.recovery.Notes, fmt.Sprintf("%v: new usage events are refused, and logged, until JetStream has acknowledged some", err))
		}
	}
	ob.cutToRecordsLocked()
	ob.noteRefusalLocked()
	ob.mu.Unlock()
	go ob.syncer()
	go ob.compact()
	return ob, nil
}

// recover reads the acked file and the segments, cuts torn tails, deletes
// what is fully acknowledged and sets the next sequence, batch and file.
func (ob *Outbox) recover() error {
	_ = os.Remove(filepath.Join(ob.dir, outboxAckedFile+".tmp"))
	_ = os.Remove(filepath.Join(ob.dir, outboxWrittenFile+".tmp"))
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
		n, err := strconv.ParseUint(strings.TrimSuffix(name, outboxSegmentExt), 10, 64)
		if err != nil || n == 0 {
			ob.recovery.Notes = append(ob.recovery.Notes, fmt.Sprintf("ignored %s: not a segment name", name))
			continue
		}
		ob.nextFile = max(ob.nextFile, n+1)
		// A first-format segment is named by its first sequence; a
		// second-format one says it in its header (read below).
		segments = append(segments, &outboxSegment{first: n, path: filepath.Join(ob.dir, name)})
	}
	var maxBatch uint64
	kept := segments[:0]
	for _, seg := range segments {
		batch, err := ob.recoverSegment(seg)
		if err != nil {
			return err
		}
		maxBatch = max(maxBatch, batch)
		if !seg.skip {
			kept = append(kept, seg)
		}
	}
	segments = kept
	slices.SortFunc(segments, func(a, b *outboxSegment) int { return cmp.Compare(a.first, b.first) })
	written, writtenNote := readSeqFile(filepath.Join(ob.dir, outboxWrittenFile))
	if writtenNote != "" {
		ob.recovery.Notes = append(ob.recovery.Notes, writtenNote)
	}
	// Records go from one segment to the next without a gap: one is a
	// segment deleted or cut, whose events are lost to billing. Those cut
	// after a damaged record are said once, with the damage: they were
	// said twice, counted once as whole records after the damage and
	// once as records in no segment.
	damageToWritten := false
	for i, seg := range segments {
		end := seg.last
		if end == 0 {
			end = seg.first - 1 // the header says where it started
		}
		from := max(end+1, acked+1)
		var to uint64 // the record before the next one known given
		last := i == len(segments)-1
		switch {
		case !last:
			to = segments[i+1].first - 1
		case seg.damage != nil && written > end:
			// Records of the last segment: as far as the written file
			// says, or the whole ones after the damage if they go
			// further (written since the last stop).
			to = max(written, end+1+uint64(seg.damage.intact))
		}
		switch {
		case seg.damage != nil && to >= from:
			d := seg.damage
			ob.recovery.Notes = append(ob.recovery.Notes, fmt.Sprintf("LOST usage events: records %d to %d (%d), not billed unless JetStream had them: %s; they are the damaged record, the %d intact records after it (the bytes are in %s) and any the segment held after those",
				from, to, to-from+1, d.cut, d.intact, d.kept))
			damageToWritten = last
		case seg.damage != nil:
			d := seg.damage
			ob.recovery.Notes = append(ob.recovery.Notes, fmt.Sprintf("LOST usage events: %s; the damaged record, and at least %d intact records after it, %d of them after the last acknowledged record (%d), are not billed unless JetStream had them (the bytes are in %s)",
				d.cut, d.intact, d.unacked, d.acked, d.kept))
		case !last && to >= from:
			ob.recovery.Notes = append(ob.recovery.Notes, fmt.Sprintf("LOST usage events: records %d to %d (%d) are in no segment (one deleted or cut), not billed",
				from, to, to-from+1))
		}
	}

	// Records before the first one on disk were acknowledged (compaction
	// deleted them for it) or are lost: either way none is replayed. An
	// acked file that says less (lost, unreadable, or not replaced while
	// the disk was full) would start the publisher's look-up of what
	// JetStream holds at a record the outbox no longer has: it found no
	// batch there and published the whole outbox again, and past
	// JetStream's duplicate window every call of it was debited twice.
	// From the first record held, it looks back from that record's time.
	// A segment of the second format without records still counts: its
	// header's first sequence was the next one when it became active, so
	// every record before it was written before, and those not on disk
	// were deleted acknowledged. That is all a segment reused in place
	// (restartSegmentLocked) says after a crash cut its reuse short.
	var first, maxSeq uint64
	for _, seg := range segments {
		used := seg.last != 0 || seg.version == 2
		if used && (first == 0 || seg.first < first) {
			first = seg.first
		}
		maxSeq = max(maxSeq, seg.last)
		if seg.version == 2 {
			maxSeq = max(maxSeq, seg.first-1)
		}
	}
	// The records before the first one on disk were written (sequences
	// are given in order from 1, and the segment holding the first says
	// where it starts); those the acked file does not cover may be lost
	// (a segment deleted, emptied or damaged while the gateway was
	// stopped) or may have been acknowledged while the file could not be
	// written. Only JetStream can tell; the publisher asks it. They were
	// taken for acknowledged without a word.
	if first > acked+1 {
		ob.recovery.Missing = append(ob.recovery.Missing, MissingRecords{From: acked + 1, To: first - 1,
			Where: fmt.Sprintf("before the first record on disk (%d), after the last the acked file says JetStream acknowledged (%d)", first, acked)})
		acked = first - 1
		ob.acked, ob.persisted = acked, acked
	}
	// The records after the last one on disk, up to the last the outbox
	// had on disk when it was closed: the newest segment deleted or
	// emptied while it was stopped.
	given := max(maxSeq, written) // the last sequence given
	if from := max(maxSeq, acked) + 1; written >= from && !damageToWritten {
		ob.recovery.Missing = append(ob.recovery.Missing, MissingRecords{From: from, To: written,
			Where: fmt.Sprintf("after the last record on disk (%d), up to the last the outbox had written when it was closed (%d)", maxSeq, written)})
	}
	// The numbers of records past the last on disk are not given again:
	// JetStream may hold batches naming them (stored before the acked
	// file could be written), which the start-up look-up would take for
	// the new records'.
	maxSeq = max(maxSeq, acked)
	given = max(given, maxSeq)
	for i, seg := range segments {
		if seg.last == 0 || seg.last <= acked {
			// The last segment is kept, even acknowledged or empty. When
			// the acked file is older (a full disk refused it), nothing
			// else on disk says how far the sequence went: deleted, the
			// next start would number new events from the acked file on,
			// again, and a restart after that could take JetStream's
			// batches of the old records for the new ones: skipped
			// unpublished, or published twice. And on a full disk it is
			// the outbox's only room: closing and recoverSegment leave
			// its preallocated end, and when no new segment can be made
			// it is reused in place (recycleLast). (Until 2026-11-27 it
			// was deleted when the acked file covered it, and a start
			// on a disk something else had filled since refused every
			// event.) Once a new segment is active, compactOnce deletes
			// it.
			if i < len(segments)-1 {
				if err := os.Remove(seg.path); err != nil {
					return fmt.Errorf("removing outbox segment: %w", err)
				}
				continue
			}
		} else {
			ob.recovery.Unacked += seg.last - max(acked, seg.first-1)
		}
		ob.segments = append(ob.segments, seg)
		ob.bytes += seg.size
	}
	ob.nextSeq = given + 1
	ob.nextFile = max(ob.nextFile, 1)
	ob.writtenSeq, ob.durableSeq = maxSeq, maxSeq // what is on disk is synced above
	ob.openBatch = maxBatch + 1
	return nil
}

// cutToRecordsLocked cuts the files of the segments recover kept to their
// records, but for the one appended to, or else the last: its
// preallocated room is what recycleLast reuses on a full disk. The others
// are read, then deleted, and their room held for nothing. ob.mu must be
// held.
func (ob *Outbox) cutToRecordsLocked() {
	for i, seg := range ob.segments {
		if seg.damageKept || ob.active != nil && seg == ob.active.seg || ob.active == nil && i == len(ob.segments)-1 {
			continue
		}
		_ = os.Truncate(seg.path, seg.size)
	}
}

// recoverSegment scans a segment, zeroing what follows its last valid
// record, and fsyncs it: what a crashed process left in the page cache is
// durable from here on. It returns the highest batch number in it.
//
// The file keeps its size: on a full disk the preallocated room past the
// records is all the outbox may get (recycleLast reuses it), and the
// reader stops at seg.size, the records' end, anyway.
func (ob *Outbox) recoverSegment(seg *outboxSegment) (uint64, error) {
	f, err := os.OpenFile(seg.path, os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("opening outbox segment: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return 0, fmt.Errorf("reading outbox segment %s: %w", seg.path, err)
	}
	off := 0
	switch {
	case bytes.HasPrefix(data, []byte(outboxMagicV1)):
		seg.version, off = 1, len(outboxMagicV1)
	case bytes.HasPrefix(data, []byte(outboxMagic)) && len(data) >= outboxHeaderSize:
		seg.version, off = 2, outboxHeaderSize
		seg.first = binary.LittleEndian.Uint64(data[len(outboxMagic):])
		if seg.first == 0 { // a spare never used
			seg.skip = true
			return 0, os.Remove(seg.path)
		}
	case strings.HasPrefix(outboxMagic, string(data)) || strings.HasPrefix(outboxMagicV1, string(data)) ||
		len(data) < outboxHeaderSize && bytes.HasPrefix(data, []byte(outboxMagic)):
		seg.skip = true // creation torn by a crash: no record
		return 0, os.Remove(seg.path)
	default:
		// Not written by this code, or its header is damaged: keep it out
		// of the way for a person to look at, and go on without it.
		bad := seg.path + ".corrupt"
		if err := os.Rename(seg.path, bad); err != nil {
			return 0, fmt.Errorf("outbox segment %s has no outbox header and cannot be moved aside: %w", seg.path, err)
		}
		ob.recovery.Notes = append(ob.recovery.Notes, fmt.Sprintf("moved %s aside to %s: no outbox header", filepath.Base(seg.path), filepath.Base(bad)))
		seg.skip = true
		return 0, nil
	}
	var maxBatch uint64
	leftover := false // records of the file's use before a reuse
	for off < len(data) {
		rec, n, err := decodeOutboxRecord(data[off:], seg.version)
		if err != nil {
			// The first record, its zeroing by a reuse cut short: its
			// sequence is zeroed last (restartSegmentLocked), so while
			// anything of it is left, it is there, below the header's
			// first. A fresh segment's first record, torn, has that
			// first sequence or none yet.
			if seg.version == 2 && seg.last == 0 && len(data) >= off+outboxRecordHeader+8 {
				seq := binary.LittleEndian.Uint64(data[off+outboxRecordHeader:])
				leftover = seq != 0 && seq < seg.first
			}
			break
		}
		if rec.seq < seg.first || rec.seq <= seg.last {
			// Out of order: not what the writer writes; treat as the tail.
			// Before the header's first sequence, in the second format:
			// a reuse in place cut short by a crash left it.
			leftover = seg.version == 2 && rec.seq < seg.first && seg.last == 0
			break
		}
		seg.last = rec.seq
		maxBatch = max(maxBatch, rec.batch)
		off += n
	}
	keep := false
	if tail := bytes.TrimRight(data[off:], "\x00"); len(tail) > 0 {
		ob.recovery.TruncatedBytes += int64(len(tail))
		note := fmt.Sprintf("cut %d bytes of torn or corrupt records off %s after sequence %d", len(tail), filepath.Base(seg.path), seg.last)
		intact, unacked := intactAfterDamage(tail, seg.version, seg.first, ob.acked)
		if leftover && intact == 0 {
			note = fmt.Sprintf("cut %d bytes off %s: records of its use before it was reused from sequence %d, all acknowledged by JetStream before (a crash cut the reuse short); nothing is lost",
				len(tail), filepath.Base(seg.path), seg.first)
		} else if intact > 0 {
			// Not a write torn by a crash: a damaged record with whole
			// ones after it. They are cut with it (the reader could not
			// find where they start again), but kept aside for a person.
			aside := fmt.Sprintf("%s.after-%d.corrupt", seg.path, seg.last)
			where := filepath.Base(aside)
			if err := os.WriteFile(aside, tail, 0o600); err != nil {
				// A full disk: the bytes stay where they are, past the
				// segment's end, rather than go unseen.
				_ = os.Remove(aside)
				keep = true
				where = fmt.Sprintf("%s past byte %d: they could not be copied aside (%v)", filepath.Base(seg.path), off, err)
			}
			if unacked > 0 {
				seg.damage = &segmentDamage{cut: note, intact: intact, unacked: unacked, acked: ob.acked, kept: where}
				note = "" // said by recover
			} else {
				note = fmt.Sprintf("%s; the %d intact records after the damage were acknowledged by JetStream before: nothing is lost (the bytes are in %s)",
					note, intact, where)
			}
		}
		if note != "" {
			ob.recovery.Notes = append(ob.recovery.Notes, note)
		}
	}
	if tail := len(bytes.TrimRight(data[off:], "\x00")); tail > 0 && !keep {
		// Overwritten, not cut off: the blocks are the file's already.
		// Cut only if that fails.
		if _, err := f.WriteAt(make([]byte, tail), int64(off)); err != nil {
			if err := f.Truncate(int64(off)); err != nil {
				return 0, fmt.Errorf("truncating outbox segment: %w", err)
			}
		}
	}
	seg.damageKept = keep
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("syncing outbox segment: %w", err)
	}
	seg.size = int64(off)
	return maxBatch, nil
}

// intactAfterDamage counts the whole records that follow the first one of
// b, when that one is damaged but its length can be trusted (a bit flipped
// in a record's body, not a write torn short), and how many of them come
// after the acknowledged record acked. Records before first, the
// segment's first sequence, are not counted: they were left by the file's
// use before a reuse in place (restartSegmentLocked), all acknowledged.
func intactAfterDamage(b []byte, version int, first, acked uint64) (intact, unacked int) {
	if len(b) < outboxRecordHeader {
		return 0, 0
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n > maxOutboxRecordBody || outboxRecordHeader+n >= len(b) {
		return 0, 0
	}
	for rest := b[outboxRecordHeader+n:]; len(rest) > 0; {
		rec, k, err := decodeOutboxRecord(rest, version)
		if err != nil {
			break
		}
		if rec.seq >= first {
			intact++
			if rec.seq > acked {
				unacked++
			}
		}
		rest = rest[k:]
	}
	return intact, unacked
}

// Recovery says what opening found: unacknowledged events and cut tails.
func (ob *Outbox) Recovery() OutboxRecovery { return ob.recovery }

// Append copies ev into the outbox. It makes no system call and waits on
// nothing but a short lock, except when a segment fills up and no spare is
// ready. An error means ev is not in the outbox: ErrOutboxFull or
// ErrOutboxClosed, or ev does not encode.
func (ob *Outbox) Append(ev *Event) error {
	_, err := ob.append(ev, false)
	return err
}

// AppendDurable is Append that also returns a channel closed once ev is
// as durable as the outbox's durability asks: at once for "process" (the
// record is in the page cache when Append returns), after the next fsync
// for "fsync". The gateway waits on it before it tells a client a call is
// complete, so a call whose answer a client received is billed even if the
// process is killed right after.
func (ob *Outbox) AppendDurable(ev *Event) (<-chan struct{}, error) {
	done, err := ob.append(ev, ob.opts.Durability == DurabilityFsync)
	if err != nil {
		return nil, err
	}
	if done == nil {
		return closedChan, nil
	}
	return done, nil
}

func (ob *Outbox) append(ev *Event, wait bool) (chan struct{}, error) {
	bufp := encodeBufPool.Get().(*[]byte)
	defer func() {
		if cap(*bufp) <= 64<<10 {
			encodeBufPool.Put(bufp)
		}
	}()
	payload, err := appendOutboxPayload((*bufp)[:0], ev, ob.maxEventBytes())
	*bufp = payload
	if err != nil {
		return nil, err
	}
	size := outboxRecordHeader + 16 + len(payload)
	var done chan struct{}
	if wait {
		done = make(chan struct{})
	}

	ob.mu.Lock()
	if ob.closed {
		ob.mu.Unlock()
		return nil, ErrOutboxClosed
	}
	if ob.diskErr != nil {
		err := ob.diskErr
		ob.mu.Unlock()
		return nil, fmt.Errorf("%w: %w", ErrOutboxUnwritable, err)
	}
	if ob.active == nil || int(ob.active.seg.size)+size > len(ob.active.mem) {
		err := ob.rotateLocked()
		ob.noteRefusalLocked()
		if err != nil {
			ob.mu.Unlock()
			return nil, err
		}
		if room := len(ob.active.mem); int(ob.active.seg.size)+size > room {
			ob.mu.Unlock()
			if room < int(ob.segmentBytes) {
				// A segment cut by an older release, reused at the size
				// it had on a full disk (recycleLast).
				return nil, fmt.Errorf("%w: a %d-byte event does not fit in the %d-byte segment reused on the full disk", ErrOutboxFull, size, room)
			}
			// Not expected: maxEventBytes keeps an event within a segment.
			return nil, fmt.Errorf("a %d-byte usage event does not fit in a %d-byte outbox segment", size, room)
		}
	}
	if ob.openCount >= ob.opts.BatchMaxEvents || ob.openCount > 0 && ob.openBytes+len(payload) > ob.opts.BatchMaxBytes {
		ob.sealLocked()
	}
	seq, batch := ob.nextSeq, ob.openBatch
	ob.nextSeq++
	ob.openCount++
	opened := ob.openCount == 1
	ob.openBytes += len(payload)
	seg := ob.active.seg
	rec := ob.active.mem[seg.size : seg.size+int64(size)]
	binary.LittleEndian.PutUint32(rec, uint32(size-outboxRecordHeader))
	binary.LittleEndian.PutUint64(rec[8:], seq)
	binary.LittleEndian.PutUint64(rec[16:], batch)
	copy(rec[24:], payload)
	binary.LittleEndian.PutUint32(rec[4:], crc32.Checksum(rec[outboxRecordHeader:], castagnoli))
	seg.size += int64(size)
	seg.last = seq
	ob.bytes += int64(size)
	ob.writtenSeq = seq
	if wait {
		ob.waiters = append(ob.waiters, durableWaiter{seq: seq, done: done})
	}
	if ob.bytes >= ob.opts.MaxBytes || ob.spareErr != nil {
		ob.noteRefusalLocked() // the next segment may be refused
	}
	ob.mu.Unlock()

	// The publisher is woken once per batch, by its first event; it then
	// reads on until the batch is sealed (full, or max_delay after it
	// opened), so a busy gateway does not wake it for every event.
	if opened {
		signal(ob.written)
	}
	if wait {
		signal(ob.syncNow)
	}
	return done, nil
}

// signal wakes the one goroutine waiting on c, if it is not awake already.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// sealLocked closes the open batch: events appended from now on go to the
// next one. ob.mu must be held.
func (ob *Outbox) sealLocked() {
	ob.openBatch++
	ob.openCount, ob.openBytes = 0, 0
}

// seal closes batch if it is still the open one, and returns the last
// sequence written: every event of batch is at or before it.
func (ob *Outbox) seal(batch uint64) uint64 {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if ob.openBatch == batch && ob.openCount > 0 {
		ob.sealLocked()
	}
	return ob.writtenSeq
}

// rotateLocked makes the spare the active segment, starting at nextSeq; the
// old one is retired for the syncer to sync and unmap. Without a spare it
// makes one here, the only system calls Append can come to, unless making
// one failed since the last was made: then it refuses at once, and leaves
// the next try to the syncer. ob.mu must be held.
func (ob *Outbox) rotateLocked() error {
	if ob.bytes >= ob.opts.MaxBytes {
		return fmt.Errorf("%w: %d bytes of events wait for JetStream (billing.outbox_max_bytes)", ErrOutboxFull, ob.bytes)
	}
	next := ob.spare
	ob.spare = nil
	if next == nil {
		err := ob.spareErr
		if err != nil {
			if !time.Now().Before(ob.spareRetry) {
				signal(ob.syncNow) // to try again, off the lock
			}
		} else if next, err = ob.newSpareLocked(); err != nil {
			ob.spareFailedLocked(err)
		}
		if next == nil {
			// The disk is full, but JetStream may have acknowledged every
			// record of the active segment: then it is reused. Kept, it
			// was all the outbox held, and every event was refused until
			// the disk had room for another segment.
			if ob.recycleActiveLocked() {
				return nil
			}
			if ob.openCount > 0 {
				// Its last batch goes out now rather than after
				// max_delay: once acknowledged, the segment is reused.
				ob.sealLocked()
				signal(ob.written)
			}
			return fmt.Errorf("%w: %w", ErrOutboxFull, err)
		}
	}
	binary.LittleEndian.PutUint64(next.mem[len(outboxMagic):], ob.nextSeq)
	next.seg = &outboxSegment{first: ob.nextSeq, size: int64(outboxHeaderSize), path: next.file.Name(), version: 2}
	if n := len(ob.segments); n > 0 && ob.segments[n-1].last == 0 && ob.segments[n-1].first == next.seg.first {
		// An empty segment (one recover kept for its first sequence, or
		// one too small for the event) starts where the new one does,
		// which says that sequence now: one segment per first sequence,
		// or segmentFor could return either.
		empty := ob.segments[n-1]
		ob.segments = ob.segments[:n-1]
		ob.bytes -= empty.size
		_ = os.Remove(empty.path)
	}
	if ob.active != nil {
		ob.retired = append(ob.retired, ob.active)
	}
	ob.active = next
	ob.segments = append(ob.segments, next.seg)
	ob.bytes += int64(outboxHeaderSize)
	signal(ob.syncNow) // to make the next spare
	return nil
}

// recycleActiveLocked reuses the active segment in place as the next one
// (restartSegmentLocked) when JetStream has acknowledged all its records,
// and reports whether it did. ob.mu must be held.
func (ob *Outbox) recycleActiveLocked() bool {
	if !ob.activeRecyclableLocked() {
		return false
	}
	return ob.restartSegmentLocked(ob.active, ob.active.seg)
}

// activeRecyclableLocked says whether JetStream has acknowledged every
// record of the active segment, which can then be reused in place.
// ob.mu must be held.
func (ob *Outbox) activeRecyclableLocked() bool {
	a := ob.active
	return a != nil && a.seg.version == 2 && a.seg.last != 0 && a.seg.last <= ob.acked
}

// recycleLast reuses the last segment in place as the next one when no
// segment is active and JetStream has acknowledged all its records: after
// a start on a full disk, once the publisher found them stored. It
// reports whether it did. It maps the file off the lock.
func (ob *Outbox) recycleLast() bool {
	ob.mu.Lock()
	seg := ob.recyclableLastLocked()
	ob.mu.Unlock()
	if seg == nil {
		return false
	}
	f, err := os.OpenFile(seg.path, os.O_RDWR, 0)
	if err != nil {
		return false
	}
	var mem []byte
	fi, err := f.Stat()
	if err == nil && seg.damageKept {
		// recoverSegment left damaged bytes past its records for a
		// person to look at: not to be overwritten.
		err = errors.New("bytes kept past its records")
	}
	if err == nil {
		// Only pages the disk has given the file are mapped: another
		// could fail to be written (a SIGBUS) on the full disk this is
		// for. Neither closing nor recover cuts the last segment, so
		// the file is a whole segment, preallocated; one cut by an
		// older release is grown back if there is room, else reused
		// at the size it has.
		size := int(ob.segmentBytes)
		if reserveDisk(f, size) != nil {
			size = int(min(fi.Size(), ob.segmentBytes))
		}
		if size <= outboxHeaderSize {
			err = errors.New("no room for a record")
		} else {
			mem, err = allocateAndMap(f, size)
		}
	}
	if err != nil {
		_ = f.Close()
		return false
	}
	_, _ = populateMapped(mem) // optional: the appends fault pages in otherwise
	m := &mappedSegment{file: f, mem: mem}
	ob.mu.Lock()
	ok := !ob.closed && ob.recyclableLastLocked() == seg && ob.restartSegmentLocked(m, seg)
	ob.mu.Unlock()
	if !ok {
		_ = unmap(mem)
		_ = f.Close()
	}
	return ok
}

// recyclableLastLocked is the last segment if no segment is active and
// all its records are acknowledged, or nil. ob.mu must be held.
func (ob *Outbox) recyclableLastLocked() *outboxSegment {
	if ob.active != nil || ob.spare != nil || len(ob.segments) == 0 {
		return nil
	}
	seg := ob.segments[len(ob.segments)-1]
	if seg.version != 2 || seg.last > ob.acked || seg.size > ob.segmentBytes {
		return nil
	}
	return seg
}

// restartSegmentLocked makes m, the mapped file of old, the last segment,
// whose records JetStream has all acknowledged, the active segment again,
// from nextSeq on: its header's first sequence is rewritten and its
// records are zeroed. Nothing else frees a disk the outbox filled while
// no new segment can be made. ob.mu must be held.
//
// Billing stays exactly once through a crash (a SIGKILL leaves the page
// cache as far as it was written) at any point, because recover finds
// either of two files:
//   - the header not yet rewritten (one aligned 8-byte store): the old
//     segment, whole, as if it had not been reused;
//   - the header saying nextSeq, followed by old records, or the first
//     one's head (its sequence kept to the last) and zeros, or zeros,
//     then perhaps new records: old records are cut as
//     leftovers (their sequences are below the header's), and the header
//     says what the acknowledged records did before: that every sequence
//     before it was written and acknowledged. recover counts a segment
//     without records by its header too, so the next start neither
//     publishes an old record again nor numbers new events from the
//     acked file, which the full disk kept from being replaced: numbers
//     JetStream's stored batches already name, which the start-up
//     look-up (publishLoop.resume) would take for the new records.
//
// The header's page is synced before the records are zeroed, so that a
// power loss cannot keep the zeros and lose the header. Readers that had
// the file open see a segment with another first sequence and move on
// (outboxReader.next).
func (ob *Outbox) restartSegmentLocked(m *mappedSegment, old *outboxSegment) bool {
	// The segments before it go first, acknowledged as it is. Left for
	// compactOnce's next tick, a crash could keep one beside the reused
	// file: the next start found a gap where the reused one's old
	// records had been, called them lost, and published the older one's
	// records again from the acked file the full disk kept old, each
	// debited twice. Gone, the reused file's header says where the
	// sequence stands, as the only segment.
	for len(ob.segments) > 1 && ob.segments[0] != old {
		older := ob.segments[0]
		if older.last > ob.acked {
			return false
		}
		if err := os.Remove(older.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			ob.writeFailures.Add(1)
			ob.lastWriteErr = fmt.Errorf("removing acknowledged outbox segment %s: %w", filepath.Base(older.path), err)
			return false
		}
		ob.bytes -= older.size
		ob.segments = slices.Delete(ob.segments, 0, 1)
	}
	header := m.mem[len(outboxMagic):outboxHeaderSize]
	was := binary.LittleEndian.Uint64(header)
	binary.LittleEndian.PutUint64(header, ob.nextSeq)
	if err := syncMapped(m.mem[:outboxHeaderSize]); err != nil {
		binary.LittleEndian.PutUint64(header, was)
		ob.writeFailures.Add(1)
		ob.lastWriteErr = fmt.Errorf("reusing outbox segment %s: %w", filepath.Base(old.path), err)
		return false
	}
	// Past its records the file is zeros, as preallocated. The first
	// record's length and CRC, then its sequence, are zeroed last, each
	// with one aligned 8-byte store: a crash in between leaves that
	// sequence, below the header's, for recoverSegment to know the rest
	// for leftovers of the old use, not damage. (Zeroed from the front
	// until 2026-11-27, a cut-short reuse was reported as "torn or
	// corrupt records".)
	if records := m.mem[outboxHeaderSize:old.size]; len(records) >= outboxRecordHeader+8 {
		clear(records[outboxRecordHeader+8:])
		binary.LittleEndian.PutUint64(records, 0)
		binary.LittleEndian.PutUint64(records[outboxRecordHeader:], 0)
	} else {
		clear(records)
	}
	seg := &outboxSegment{first: ob.nextSeq, size: int64(outboxHeaderSize), path: old.path, version: 2}
	ob.segments[len(ob.segments)-1] = seg
	ob.bytes += seg.size - old.size
	// A new mappedSegment, synced from the start: the syncer may still be
	// syncing the old one's records, and marks that on the old one.
	ob.active = &mappedSegment{seg: seg, file: m.file, mem: m.mem}
	if ob.openCount > 0 {
		ob.sealLocked()
	}
	ob.noteRefusalLocked()
	signal(ob.syncNow)
	return true
}

// newSpare makes a segment file ready for rotateLocked, with ob.mu held
// only to number it: appends never wait on its file system calls. Each of
// its pages is written once here, so the page faults of a fresh shared
// mapping happen on this goroutine rather than on the request path; the
// appends then copy into pages already dirty and writable.
func (ob *Outbox) newSpare() (*mappedSegment, error) {
	ob.mu.Lock()
	number := ob.nextFile
	ob.nextFile++
	ob.mu.Unlock()
	m, err := ob.makeSegment(number)
	if err != nil {
		return nil, err
	}
	if err := touchPages(m.mem); err != nil {
		ob.dropSpare(m)
		return nil, err
	}
	return m, nil
}

// touchPages faults in every page of mem for writing, so that appends
// never wait on a page fault. On a file system without fallocate a full
// disk shows here, as an error instead of a crash.
func touchPages(mem []byte) (err error) {
	if ok, err := populateMapped(mem); ok {
		if err != nil {
			return fmt.Errorf("writing a new outbox segment (disk full?): %w", err)
		}
		return nil
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("writing a new outbox segment (disk full?): %v", r)
		}
	}()
	page := os.Getpagesize()
	for i := outboxHeaderSize; i < len(mem); i += page {
		mem[i] = 0
	}
	return nil
}

// spareFailedLocked records that a segment could not be made, and puts
// off the next try. ob.mu must be held.
func (ob *Outbox) spareFailedLocked(err error) {
	ob.writeFailures.Add(1)
	ob.lastWriteErr = err
	ob.spareErr = err
	ob.spareRetry = time.Now().Add(outboxSpareRetry)
}

// newSpareLocked makes a segment when rotateLocked finds no spare (the
// syncer could not make one in time, and none failed since the last one
// made), with ob.mu held.
func (ob *Outbox) newSpareLocked() (*mappedSegment, error) {
	number := ob.nextFile
	ob.nextFile++
	return ob.makeSegment(number)
}

// makeSegment creates, preallocates and maps segment file number.
func (ob *Outbox) makeSegment(number uint64) (*mappedSegment, error) {
	path := filepath.Join(ob.dir, fmt.Sprintf("%020d%s", number, outboxSegmentExt))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating outbox segment: %w", err)
	}
	mem, err := allocateAndMap(f, int(ob.segmentBytes))
	if err == nil {
		copy(mem, outboxMagic)
		err = syncMapped(mem[:outboxHeaderSize])
		if err == nil {
			err = syncDir(ob.dir)
		}
		if err != nil {
			_ = unmap(mem)
		}
	}
	if err != nil {
		f.Close()
		_ = os.Remove(path)
		return nil, err
	}
	return &mappedSegment{file: f, mem: mem, synced: outboxHeaderSize}, nil
}

// syncer writes appended records to disk: at once when an fsync-durable
// append waits, else every FsyncInterval. It also makes the next spare
// segment and unmaps retired ones.
func (ob *Outbox) syncer() {
	defer close(ob.syncerDone)
	tick := time.NewTicker(ob.opts.FsyncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ob.syncNow:
		case <-tick.C:
		case <-ob.stopSyncer:
			ob.syncOnce()
			return
		}
		ob.syncOnce()
		ob.mu.Lock()
		needSpare := ob.spare == nil && !ob.closed && (ob.spareErr == nil || !time.Now().Before(ob.spareRetry))
		ob.mu.Unlock()
		if needSpare {
			spare, err := ob.newSpare()
			if err != nil {
				// No segment is active after a start on a full disk: the
				// last one is reused once JetStream has acknowledged it.
				ob.recycleLast()
			}
			ob.mu.Lock()
			if err != nil {
				ob.spareFailedLocked(err)
			} else {
				ob.spareErr = nil
				if ob.spare == nil && !ob.closed {
					ob.spare, spare = spare, nil
				}
			}
			ob.noteRefusalLocked()
			ob.mu.Unlock()
			if spare != nil {
				ob.dropSpare(spare)
			}
		}
	}
}

// syncOnce syncs what was written since the last time, releases the
// waiters it covers, and unmaps retired segments. When a sync fails, the
// records it covered are logged with their JSON (reportUnwritten) and
// appends are refused until one succeeds.
func (ob *Outbox) syncOnce() {
	ob.mu.Lock()
	through := ob.writtenSeq
	if through == ob.durableSeq && len(ob.retired) == 0 {
		ob.mu.Unlock()
		return
	}
	var work []pendingSync
	for _, m := range ob.retired {
		work = append(work, pendingSync{m, m.synced, int(m.seg.size)})
	}
	retired := ob.retired
	ob.retired = nil
	if a := ob.active; a != nil && int(a.seg.size) > a.synced {
		work = append(work, pendingSync{a, a.synced, int(a.seg.size)})
	}
	syncMem := ob.syncMem
	ob.mu.Unlock()

	var syncErr error
	var failed []pendingSync
	for _, w := range work {
		if w.to > w.from {
			// msync wants a page-aligned start.
			from := w.from &^ (os.Getpagesize() - 1)
			if err := syncMem(w.m.mem[from:w.to]); err != nil {
				syncErr = fmt.Errorf("syncing outbox segment %s: %w", filepath.Base(w.m.seg.path), err)
				failed = append(failed, w)
				continue
			}
		}
		w.m.synced = w.to
	}
	for _, m := range retired {
		if m.synced >= int(m.seg.size) {
			_ = unmap(m.mem)
			// Cut the unused preallocated end: the file's size is then
			// its records' (and the reader never meets the zeros).
			_ = m.file.Truncate(m.seg.size)
			_ = m.file.Close()
		}
	}

	ob.mu.Lock()
	for _, m := range retired {
		if m.synced < int(m.seg.size) {
			ob.retired = append(ob.retired, m) // retried next time
		}
	}
	logf := ob.logf
	if syncErr != nil {
		ob.writeFailures.Add(1)
		ob.lastWriteErr = syncErr
		began := ob.diskErr == nil
		ob.diskErr = syncErr
		ob.noteRefusalLocked()
		unwritten := ob.unwrittenLocked(failed)
		// An answer waiting for its event to be on disk goes out once the
		// event is logged instead: waiting could not help, and made each
		// answer under fsync durability take DurableWait (2 s) with a
		// line that gave no JSON to bill it by.
		logged := ob.takeWaitersLocked(ob.reportedSeq)
		ob.mu.Unlock()
		if began {
			logf("meter: outbox: %v; new usage events are refused and logged with their JSON until a sync succeeds, and those it held that did not reach the disk are logged now", syncErr)
		}
		reportUnwritten(logf, unwritten, syncErr)
		for _, w := range logged {
			close(w.done)
		}
		return
	}
	recovered := ob.diskErr != nil
	ob.diskErr = nil
	if recovered {
		ob.noteRefusalLocked()
	}
	ob.durableSeq = max(ob.durableSeq, through)
	released := ob.takeWaitersLocked(ob.durableSeq)
	ob.mu.Unlock()
	for _, w := range released {
		close(w.done)
	}
	if recovered {
		logf("meter: outbox: writing to disk again; new usage events are taken again")
	}
}

// pendingSync is a range of a mapped segment syncOnce writes to disk.
type pendingSync struct {
	m    *mappedSegment
	from int
	to   int
}

// takeWaitersLocked removes the waiters of records through seq and
// returns them, for their channels to be closed off the lock. ob.mu must
// be held.
func (ob *Outbox) takeWaitersLocked(seq uint64) []durableWaiter {
	var taken []durableWaiter
	keep := ob.waiters[:0]
	for _, w := range ob.waiters {
		if w.seq <= seq {
			taken = append(taken, w)
		} else {
			keep = append(keep, w)
		}
	}
	clear(ob.waiters[len(keep):])
	ob.waiters = keep
	return taken
}

// unwrittenRecord is a record a failed sync covered, copied out of the
// mapping.
type unwrittenRecord struct {
	seq  uint64
	data []byte // the event as JSON
}

// unwrittenLocked copies out the records of the ranges a sync failed to
// write that were neither dealt with before nor acknowledged by JetStream
// (those are billed), counts them as lost, and moves reportedSeq past
// every record of the ranges. ob.mu must be held: a segment reused in
// place (restartSegmentLocked) zeroes its records under it. Copying,
// rather than logging from the mapping, keeps the lock for a memory copy
// only.
func (ob *Outbox) unwrittenLocked(failed []pendingSync) []unwrittenRecord {
	var out []unwrittenRecord
	for _, w := range failed {
		b := w.m.mem[max(w.from, outboxHeaderSize):w.to]
		for len(b) > 0 {
			rec, n, err := decodeOutboxRecord(b, 2)
			if err != nil {
				break // zeroed by a reuse: every record was acknowledged
			}
			b = b[n:]
			if rec.seq <= ob.reportedSeq {
				continue
			}
			ob.reportedSeq = rec.seq
			if rec.seq > ob.acked {
				out = append(out, unwrittenRecord{seq: rec.seq, data: slices.Clone(rec.data)})
			}
		}
	}
	ob.lost.Add(uint64(len(out)))
	return out
}

// reportUnwritten logs each record a failed sync could not write, with
// its JSON, for billing by hand: as a refused event is (logDropped), but
// saying that JetStream may have it still, for the publisher reads the
// outbox from memory and a JetStream on another disk takes what it sends.
func reportUnwritten(logf func(string, ...any), recs []unwrittenRecord, err error) {
	for _, rec := range recs {
		logf("meter: DROPPED usage event, not on disk (%v): billed only if JetStream took it from memory; check ClickHouse for its id before billing it by hand: %s", err, billableJSON(rec.data))
	}
}

// billableJSON is an event's JSON without its request log: a logged
// request's text goes to request_logs or nowhere, never into the
// gateway's own log.
func billableJSON(data []byte) []byte {
	if !gjson.GetBytes(data, "log").Exists() {
		return data
	}
	out, err := sjson.DeleteBytes(data, "log")
	if err != nil {
		return data
	}
	return out
}

func (ob *Outbox) dropSpare(m *mappedSegment) {
	_ = unmap(m.mem)
	_ = m.file.Close()
	_ = os.Remove(m.file.Name())
}

// Stats reports the outbox's current state.
func (ob *Outbox) Stats() OutboxStats {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return OutboxStats{
		Unacked:       ob.writtenSeq - min(ob.acked, ob.writtenSeq),
		Bytes:         ob.bytes,
		Segments:      len(ob.segments),
		WriteFailures: ob.writeFailures.Load(),
		LastWriteErr:  ob.lastWriteErr,
		Lost:          ob.lost.Load(),
		Unwritable:    ob.diskErr != nil,
	}
}

// outboxRefusal is why the outbox refuses new events (refusalLocked).
type outboxRefusal int32

const (
	refusesNothing outboxRefusal = iota
	refusesClosed
	refusesUnwritable
	refusesAtBound
	refusesNoSegment
)

// outboxRefusalReasons are Refusal's answers: short and fixed, so that
// what a probe shows does not change with every byte (the log has the
// details).
var outboxRefusalReasons = [...]string{
	refusesClosed:     "closed",
	refusesUnwritable: "its last write to disk failed",
	refusesAtBound:    "billing.outbox_max_bytes reached, waiting for JetStream",
	refusesNoSegment:  "no room on its disk for a new segment",
}

// refusalLocked is why an event appended now, or soon, is refused: the
// outbox is closed, or its last sync failed; or the active segment is
// in its last eighth (or there is none) and the next cannot be had: the
// outbox is at its byte bound, or no segment could be made (a full disk)
// and JetStream has not acknowledged all of the active one, which would
// be reused. Told only once the segment is full, a probe would see the
// gateway refuse before it saw it not ready; told as soon as no next
// segment can be made, a gateway on a full disk whose JetStream keeps up
// (each segment reused once acknowledged) would leave its load
// balancer's rotation under load and come back idle. ob.mu must be held.
func (ob *Outbox) refusalLocked() outboxRefusal {
	switch {
	case ob.closed:
		return refusesClosed
	case ob.diskErr != nil:
		return refusesUnwritable
	case ob.active != nil && int64(len(ob.active.mem))-ob.active.seg.size > ob.segmentBytes/8:
		return refusesNothing
	case ob.bytes >= ob.opts.MaxBytes:
		return refusesAtBound
	case ob.spare == nil && ob.spareErr != nil && !ob.activeRecyclableLocked():
		return refusesNoSegment
	}
	return refusesNothing
}

// noteRefusalLocked publishes refusalLocked for Refusal. ob.mu must be
// held.
func (ob *Outbox) noteRefusalLocked() {
	if r := int32(ob.refusalLocked()); ob.refusal.Load() != r {
		ob.refusal.Store(r)
	}
}

// Refusal says why the outbox refuses new usage events, or will once its
// active segment is full; "" while it takes them. It takes no lock, for
// a readiness probe.
func (ob *Outbox) Refusal() string {
	return outboxRefusalReasons[ob.refusal.Load()]
}

// setLogf has the outbox say with logf what it could not write to disk.
func (ob *Outbox) setLogf(logf func(string, ...any)) {
	ob.mu.Lock()
	ob.logf = logf
	ob.mu.Unlock()
}

// missingReported says the publisher reported the records recover found
// missing (Recovery().Missing): the acked file takes the acknowledged
// sequence recover raised over those before the first on disk, so that
// the next start does not report them again.
func (ob *Outbox) missingReported() {
	ob.mu.Lock()
	ob.persisted = 0 // the acked file is written at the next compaction
	ob.mu.Unlock()
}

// ack records that JetStream has acknowledged every record through seq.
func (ob *Outbox) ack(seq uint64) {
	ob.mu.Lock()
	ob.acked = max(ob.acked, seq)
	ob.noteRefusalLocked() // the active segment may be reusable now
	ob.mu.Unlock()
}

// holds reports whether record seq is in the outbox with event id id.
func (ob *Outbox) holds(seq uint64, id string) bool {
	r := ob.newReader(seq - 1)
	defer r.close()
	recs, err := r.next(1)
	return err == nil && len(recs) == 1 && recs[0].seq == seq && string(recs[0].id) == id
}

// ackedSeq is the sequence through which every record is acknowledged.
func (ob *Outbox) ackedSeq() uint64 {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return ob.acked
}

// writtenState returns the last sequence written, the batch new events
// join, and a channel that receives when more is written. Every event of
// a batch below openBatch is at or before the sequence returned.
func (ob *Outbox) writtenState() (seq, openBatch uint64, more <-chan struct{}) {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return ob.writtenSeq, ob.openBatch, ob.written
}

// durableState returns the last durable sequence (synced to disk).
func (ob *Outbox) durableState() uint64 {
	ob.mu.Lock()
	defer ob.mu.Unlock()
	return ob.durableSeq
}

// closeInput refuses further Appends and syncs what was written.
func (ob *Outbox) closeInput() {
	ob.mu.Lock()
	if ob.closed {
		ob.mu.Unlock()
		return
	}
	ob.closed = true
	ob.noteRefusalLocked()
	ob.mu.Unlock()
	close(ob.stopSyncer)
	<-ob.syncerDone
}

// Close syncs what was written, persists the acknowledged sequence and
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
	ob.mu.Lock()
	defer ob.mu.Unlock()
	var err error
	if a := ob.active; a != nil {
		err = ob.syncMem(a.mem[:a.seg.size])
		_ = unmap(a.mem)
		// Not cut to its records, as retired segments are: the next
		// start keeps the last segment, and on a disk filled meanwhile
		// its preallocated room is the only room the outbox has
		// (recycleLast). (Until 2026-11-27 it was cut here, something
		// else could take what that freed, and the next start refused
		// every event.)
		if cerr := a.file.Close(); err == nil {
			err = cerr
		}
		ob.active = nil
	}
	for _, m := range ob.retired {
		_ = unmap(m.mem)
		_ = m.file.Truncate(m.seg.size)
		_ = m.file.Close()
	}
	ob.retired = nil
	if ob.spare != nil {
		ob.dropSpare(ob.spare)
		ob.spare = nil
	}
	for _, w := range ob.waiters {
		close(w.done) // synced above, or as good as it gets
	}
	ob.waiters = nil
	// Every record through durableSeq is on disk (those past it were
	// logged when their sync failed): should the newest be gone at the
	// next start, this says they were written. When the disk is too full
	// to write it, the next start cannot tell.
	if werr := writeSeqFile(ob.dir, outboxWrittenFile, ob.durableSeq); werr != nil {
		ob.writeFailures.Add(1)
		ob.lastWriteErr = werr
	}
	unlockDir(ob.lock)
	return err
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
	// The segment recover kept last, acknowledged, is deleted once a new
	// one is active, with no new acknowledgement to wait for.
	formerLast := len(ob.segments) > 1 && ob.segments[0].last <= acked
	ob.mu.Unlock()
	if acked == persisted && !formerLast {
		return
	}
	// The acked file goes first, so that what is on disk says what it
	// holds. When it cannot be written (a full disk: it is replaced
	// through a new file), the acknowledged segments are deleted all the
	// same: they are what frees the disk, and kept, the outbox refused
	// every event while NATS took all it was sent. A segment deleted
	// before the acked file is harmless: recover starts at the first
	// record on disk.
	var err error
	if acked != persisted {
		if err = writeAcked(ob.dir, acked); err != nil {
			ob.writeFailures.Add(1)
		}
	}
	ob.mu.Lock()
	if err != nil {
		ob.lastWriteErr = fmt.Errorf("writing the acked file: %w", err)
	} else {
		ob.persisted = acked
	}
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
	ob.noteRefusalLocked()
	ob.mu.Unlock()
	for _, seg := range done {
		if err := os.Remove(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			ob.writeFailures.Add(1)
		}
	}
	if len(done) > 0 {
		// Room, perhaps, for the segment that could not be made.
		ob.mu.Lock()
		failed := ob.spareErr != nil
		ob.spareRetry = time.Time{}
		ob.mu.Unlock()
		if failed {
			signal(ob.syncNow)
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
	buf   []byte // read but not yet decoded; within mem
	mem   []byte // reused for every read
	out   []outboxRecord
}

// eventTime is the time written in record seq's event, if the outbox
// holds that record and its event has one.
func (ob *Outbox) eventTime(seq uint64) (time.Time, bool) {
	if seq == 0 {
		return time.Time{}, false
	}
	r := ob.newReader(seq - 1)
	defer r.close()
	recs, err := r.next(1)
	if err != nil || len(recs) == 0 || recs[0].seq != seq {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, gjson.GetBytes(recs[0].data, "time").Str)
	return t, err == nil
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

// outboxReadError is a failure to open or read an outbox file (the
// process out of file descriptors, an I/O error), not damage in it:
// read again later, the same records are there. Taken for damage, a
// segment opened while a flood of connections held every descriptor
// was skipped, its events logged LOST.
type outboxReadError struct{ err error }

func (e outboxReadError) Error() string { return e.err.Error() }
func (e outboxReadError) Unwrap() error { return e.err }

// next returns up to limit durable records after the last one returned,
// none when it has caught up with the writer. The records and their bytes
// are valid until the next call: they point into the reader's buffer,
// which is reused so that steady publishing allocates nothing.
func (r *outboxReader) next(limit int) ([]outboxRecord, error) {
	out := r.out[:0]
	defer func() { r.out = out[:0] }()
	for len(out) < limit {
		if r.file == nil {
			seg, _, ok := r.ob.segmentFor(r.after + 1)
			if !ok {
				break
			}
			f, err := os.Open(seg.path)
			if err != nil {
				return out, outboxReadError{fmt.Errorf("opening outbox segment: %w", err)}
			}
			header := int64(outboxHeaderSize)
			if seg.version == 1 {
				header = int64(len(outboxMagicV1))
			}
			r.seg, r.file, r.off, r.buf = seg, f, header, nil
		}
		for len(out) < limit {
			rec, n, err := decodeOutboxRecord(r.buf, r.seg.version)
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
			if len(out) > 0 {
				break // reading on would overwrite the records in out
			}
			want := len(r.buf) + int(min(cur.size-end, 1<<20))
			if cap(r.mem) < want {
				r.mem = make([]byte, max(want, 64<<10))
			}
			kept := copy(r.mem[:cap(r.mem)], r.buf)
			n, err := r.file.ReadAt(r.mem[kept:want], end)
			r.buf = r.mem[:kept+n]
			if err != nil && !errors.Is(err, io.EOF) {
				return out, outboxReadError{fmt.Errorf("reading outbox segment: %w", err)}
			}
			if now, _, ok := r.ob.segmentFor(r.seg.first); !ok || now.first != r.seg.first {
				// Reused in place while being read (restartSegmentLocked):
				// what was read may mix its old records with zeros and new
				// ones. Every old one was acknowledged, so read on from
				// the segment holding the next sequence.
				r.close()
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

// maxEventBytes is the most an event's payload may take: what a segment
// holds after its header and the record's framing, at most
// maxOutboxEventBytes. With a small outbox_max_bytes a segment is under
// 256 KiB (128 KiB at 1 MiB), and an event as large as the bound
// allowed was refused for its size, unbilled, where cutting its log
// further keeps the bill.
func (ob *Outbox) maxEventBytes() int {
	return min(maxOutboxEventBytes, int(ob.segmentBytes)-outboxHeaderSize-outboxRecordHeader-16)
}

// appendOutboxPayload appends ev's record payload (without sequence and
// batch) to dst, its log cut so that it takes at most limit bytes.
func appendOutboxPayload(dst []byte, ev *Event, limit int) ([]byte, error) {
	start := len(dst)
	var logged RequestLog // the whole log, once it is being cut
	keepRequest, keepResponse := -1, -1
	if ev.Log != nil && ev.Log.ResponseLeftOut > 0 {
		// A stream's answer, cut where it was kept: the log says so even
		// when the event fits.
		logged = *ev.Log
		keepRequest, keepResponse = len(logged.Request), len(logged.Response)
		ev.Log = logged.cut(keepRequest, keepResponse)
	}
	for {
		dst = binary.AppendUvarint(dst, uint64(len(ev.ID)))
		dst = append(dst, ev.ID...)
		dst = binary.AppendUvarint(dst, uint64(len(ev.Account)))
		dst = append(dst, ev.Account...)
		dst = ev.AppendJSON(dst)
		if len(dst)-start <= limit {
			return dst, nil
		}
		// A logging key's request or answer can be megabytes: the log is
		// cut, never the bill (the event was dropped whole, unbilled).
		if ev.Log == nil || max(keepRequest, keepResponse) == 0 {
			return dst, fmt.Errorf("usage event %s encodes to %d bytes, over the %d an event may take", ev.ID, len(dst)-start, limit)
		}
		if keepRequest < 0 {
			logged = *ev.Log
			keepRequest, keepResponse = len(logged.Request), len(logged.Response)
		}
		// Both parts shrink by the share the event is over (less the cut
		// lines and a rune's boundary), which lands within a step or two
		// of what fits: halved until it fitted, a log kept as little as a
		// quarter of what a segment holds.
		size := int64(len(dst) - start)
		keepRequest = shrink(keepRequest, int64(limit-2*cutLineBytes), size)
		keepResponse = shrink(keepResponse, int64(limit-2*cutLineBytes), size)
		ev.Log = logged.cut(keepRequest, keepResponse)
		dst = dst[:start]
	}
}

// shrink is keep in the proportion room is of size, and at most half of
// keep when that takes nothing off.
func shrink(keep int, room, size int64) int {
	if n := int(int64(keep) * max(room, 0) / size); n < keep {
		return n
	}
	return keep / 2
}

// cutLineBytes is more than cutLogged's line and the bytes of a rune
// utf8cut.Prefix may leave out take, encoded.
const cutLineBytes = 96

// cut is l with about keepRequest bytes of its request and keepResponse of
// its answer logged.
func (l *RequestLog) cut(keepRequest, keepResponse int) *RequestLog {
	return &RequestLog{Request: cutLogged(l.Request, keepRequest, 0), Response: cutLogged(l.Response, keepResponse, l.ResponseLeftOut),
		RetentionDays: l.RetentionDays}
}

// cutLogged is the start of a logged body, about keep bytes of it, and a
// line saying how many bytes were left out: those cut from body and the
// leftOut that came after it and were never kept.
func cutLogged(body string, keep int, leftOut int64) string {
	if keep >= len(body) && leftOut == 0 {
		return body
	}
	kept := utf8cut.Prefix(body, keep)
	return kept + "\n[tollgate: cut here, " + strconv.FormatInt(int64(len(body)-len(kept))+leftOut, 10) + " more bytes not logged]"
}

// encodeOutboxPayload is appendOutboxPayload into a new slice.
func encodeOutboxPayload(ev *Event) ([]byte, error) {
	return appendOutboxPayload(nil, ev, maxOutboxEventBytes)
}

// appendOutboxRecord frames payload as the record seq of batch (the
// second format).
func appendOutboxRecord(dst []byte, seq, batch uint64, payload []byte) []byte {
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(16+len(payload)))
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint64(dst, seq)
	dst = binary.LittleEndian.AppendUint64(dst, batch)
	dst = append(dst, payload...)
	binary.LittleEndian.PutUint32(dst[start+4:], crc32.Checksum(dst[start+outboxRecordHeader:], castagnoli))
	return dst
}

// decodeOutboxRecord decodes the record at the start of b, of a segment of
// the given format, and returns its length. io.ErrUnexpectedEOF means b
// ends inside the record: at the end of a segment, a torn write. The
// returned data aliases b.
func decodeOutboxRecord(b []byte, version int) (outboxRecord, int, error) {
	if len(b) < outboxRecordHeader {
		return outboxRecord{}, 0, io.ErrUnexpectedEOF
	}
	fixed := 16 // sequence and batch
	if version == 1 {
		fixed = 8
	}
	n := binary.LittleEndian.Uint32(b)
	if n < uint32(fixed)+2 || n > maxOutboxRecordBody {
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
	if version != 1 {
		rec.batch = binary.LittleEndian.Uint64(body[8:])
	}
	rest := body[fixed:]
	var fields [2][]byte
	for i := range fields {
		l, k := binary.Uvarint(rest)
		if k <= 0 || l > uint64(len(rest)-k) {
			return outboxRecord{}, 0, fmt.Errorf("%w: field %d length", errOutboxCorrupt, i)
		}
		fields[i] = rest[k : k+int(l)]
		rest = rest[k+int(l):]
	}
	rec.id, rec.account, rec.data = fields[0], fields[1], rest
	return rec, outboxRecordHeader + int(n), nil
}

// readAcked reads the acknowledged sequence; a missing or damaged file
// reads as 0 (replay everything on disk: duplicates are dropped by
// JetStream) with a note saying so.
func readAcked(path string) (uint64, string) {
	seq, note := readSeqFile(path)
	if note != "" {
		note += ": replaying every record on disk"
	}
	return seq, note
}

// readSeqFile reads a sequence written by writeSeqFile; a missing file
// reads as 0, a damaged one as 0 with a note saying so.
func readSeqFile(path string) (uint64, string) {
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return 0, ""
	case err != nil:
		return 0, fmt.Sprintf("%s cannot be read (%v)", path, err)
	case len(b) != 12:
		// Said as "(<nil>, 14 bytes)" until 2026-11-27, which named no
		// fault.
		return 0, fmt.Sprintf("%s is damaged: it holds %d bytes, not the 12 of a record number and its checksum", path, len(b))
	case crc32.Checksum(b[:8], castagnoli) != binary.LittleEndian.Uint32(b[8:]):
		return 0, fmt.Sprintf("%s is damaged: its checksum does not match the record number it holds", path)
	}
	return binary.LittleEndian.Uint64(b), ""
}

// writeAcked replaces the acked file atomically and durably.
func writeAcked(dir string, seq uint64) error {
	return writeSeqFile(dir, outboxAckedFile, seq)
}

// writeSeqFile replaces dir/name with seq and its CRC, atomically and
// durably.
func writeSeqFile(dir, name string, seq uint64) error {
	b := binary.LittleEndian.AppendUint64(nil, seq)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	if err := durable.ReplaceFile(filepath.Join(dir, name), b, 0o600); err != nil {
		return fmt.Errorf("writing outbox %s file: %w", name, err)
	}
	return nil
}

// errNoReserve is reserveDisk's answer where the file system (or the
// system: reserveDisk is Linux's fallocate) cannot reserve disk space.
var errNoReserve = errors.New("cannot reserve disk space")

// outboxIDFile holds the outbox's id, written once.
const outboxIDFile = "id"

// readOrCreateOutboxID returns the id kept in dir, making one (16 random
// bytes, hex) the first time. It is a subject token: [0-9a-f] only.
func readOrCreateOutboxID(dir string) (string, error) {
	path := filepath.Join(dir, outboxIDFile)
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if validOutboxID(id) {
			return id, nil
		}
		return "", fmt.Errorf("outbox id file %s holds %q, not 32 hex digits: delete it to make a new one", path, id)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("reading outbox id: %w", err)
	}
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("making an outbox id: %w", err)
	}
	id := hex.EncodeToString(raw[:])
	if err := durable.ReplaceFile(filepath.Join(dir, outboxIDFile), []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("writing outbox id: %w", err)
	}
	return id, nil
}

func validOutboxID(id string) bool {
	if len(id) != 32 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// syncDir makes created, renamed and removed names in dir durable.
func syncDir(dir string) error {
	if err := durable.SyncDir(dir); err != nil {
		return fmt.Errorf("syncing outbox dir: %w", err)
	}
	return nil
}
