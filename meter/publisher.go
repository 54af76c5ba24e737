package meter

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
)

// The USAGE stream carries every usage event from the gateways to billing.
const (
	UsageStream        = "USAGE"
	UsageSubjectPrefix = "usage." // followed by the account id
	// UsageDuplicatesWindow is how long JetStream remembers event ids and
	// drops a republished event. The outbox republishes what was not
	// acknowledged when a publish failed, and, after a crash, what the
	// publisher's start-up look-up (publishLoop.resume) cannot vouch was
	// stored: an event first stored longer ago than this and republished
	// is stored twice, and debited twice (ClickHouse still counts it once,
	// by id).
	// The server keeps every id of the window in memory, about 150 bytes
	// each. Two minutes: the cases the window still has to cover alone
	// republish within seconds (a failed publish, after its backoff of at
	// most maxPublishBackoff; a cluster's leader change), and a restart,
	// however late, is covered by resume, whose chain spans what was
	// stored and not yet marked acknowledged: at most one acked-file
	// interval and publishMaxInFlight batches. At 20 batches a second
	// (max_delay 50ms under load) the window holds 2,400 ids, under half
	// a MiB; at 15 minutes and 10ms batches it held 45 times that, and the
	// gateway's RSS grew for a quarter of an hour before it levelled off.
	UsageDuplicatesWindow = 2 * time.Minute

	// publishMaxInFlight bounds batches published and not yet
	// acknowledged, and with them the memory a slow JetStream (a disk
	// stall) makes the gateway hold: at most this many batches of up to
	// publish_batch.max_bytes. 32 batches of up to 1000 events keep tens of
	// thousands of events in flight, far above what an ack's latency needs.
	publishMaxInFlight = 32
	// UsageBatchSubject carries batches: one message, many events of
	// any accounts, one per line (NDJSON), on usage.batch.<outbox id>
	// (usage.batch itself in earlier versions). Billing also reads the
	// one-event messages of earlier versions on usage.<account>.
	UsageBatchSubject = UsageSubjectPrefix + "batch"
	// OutboxRangeHeader, on every batch, names the outbox records it
	// holds: "<first> <last> <last event id>", what a restarted publisher
	// reads to skip what JetStream already has (publishLoop.resume).
	OutboxRangeHeader = "Tollgate-Outbox-Range"
	// resumeLookupTimeout bounds the look-up of the last stored batch,
	// and resumeMaxTries how often it is tried before publishing anyway.
	resumeLookupTimeout = 5 * time.Second
	resumeMaxTries      = 3
	// publishAckTimeout turns a PubAck that never comes (a reply lost in
	// a cluster failover) into an error, which republishes the event.
	publishAckTimeout = 10 * time.Second
	maxPublishBackoff = 5 * time.Second
	// invalidAccountSubject takes events whose account is not a valid
	// subject token sequence; billing reads the account from the event.
	// '~' never appears in account ids.
	invalidAccountSubject = UsageSubjectPrefix + "~invalid"
)

// EnsureUsageStream creates the USAGE stream or updates its configuration;
// every gateway and billing process may call it at start-up. retention is
// how long the stream keeps events, billed or not (events not billed
// within it are lost to billing; it bounds the stream's disk and its
// block index in memory). It must exceed UsageDuplicatesWindow, because
// the server rebuilds its dedup memory after a restart from the events it
// still stores: 0, or anything not above the window, means
// config.DefaultUsageRetention (config refuses less than an hour).
// Shortening it drops older events at once, billed or not.
//
// Limits retention, not work-queue: acknowledged events must stay stored
// for the duplicates window, because after a server restart JetStream
// rebuilds its dedup memory from stored messages only.
func EnsureUsageStream(ctx context.Context, js jetstream.JetStream, replicas int, retention time.Duration) (jetstream.Stream, error) {
	if retention <= UsageDuplicatesWindow {
		retention = config.DefaultUsageRetention
	}
	return broker.EnsureStream(ctx, js, jetstream.StreamConfig{
		Name:        UsageStream,
		Description: "tollgate usage events in batches (NDJSON), batch id in Nats-Msg-Id",
		Subjects:    []string{UsageSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      retention,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
		Duplicates:  UsageDuplicatesWindow,
		// No limit in practice. A per-subject limit is the one way to have
		// JetStream size this stream's blocks at 4 MiB instead of 8, and a
		// block's write cache is a buffer of the block's size in the heap,
		// two or three at a time: 6-7 MiB less RSS under load (paired
		// runs, same throughput).
		MaxMsgsPerSubject: 1 << 62,
	})
}

// PublisherStats are the publisher's counters, for the metrics endpoint.
type PublisherStats struct {
	// OutboxDepth is events taken by Record and not yet acknowledged by
	// JetStream: queued in memory or on disk.
	OutboxDepth int64
	OutboxBytes int64
	// Published counts events acknowledged by JetStream, Duplicates those
	// of them it already had (republished after a failure or restart).
	Published  uint64
	Duplicates uint64
	// Failures counts failed publishes and outbox writes; each is retried.
	Failures uint64
	// Dropped (outbox_dropped_total) counts events Record could not keep:
	// they are logged and never billed.
	Dropped uint64
	// LastPublishLatency is from publishing to the PubAck of the last
	// acknowledged event.
	LastPublishLatency time.Duration
	// Connected: the connection to NATS is up. While it is down nothing
	// is tried (Failures stays still) and OutboxDepth grows.
	Connected bool
}

// Publisher is the Recorder of a gateway with durable metering: Record
// appends to the outbox and a goroutine publishes the outbox to the USAGE
// stream, a batch of events per message with Nats-Msg-Id set to the
// batch's id, acknowledging records in order as PubAcks arrive. NATS being
// down loses nothing: events wait in the outbox and go out when it is back.
type Publisher struct {
	js     jetstream.JetStream // own context: own async window and ack timeout
	nc     *nats.Conn
	outbox *Outbox
	logf   func(string, ...any)
	// batchSubject is usage.batch.<outbox id>: the last message on it is
	// the last batch of this outbox that JetStream stored.
	batchSubject string

	published   atomic.Uint64
	duplicates  atomic.Uint64
	failures    atomic.Uint64
	dropped     atomic.Uint64
	lastLatency atomic.Int64

	maxDelay time.Duration // how long an open batch waits for more events

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// NewPublisher starts publishing ob, beginning with the records it kept
// from before (see OpenOutbox). The stream must exist (EnsureUsageStream);
// until it does, publishing is retried. logf may be nil. The Publisher owns
// ob from here: Close closes it.
func NewPublisher(js jetstream.JetStream, ob *Outbox, logf func(string, ...any)) *Publisher {
	return NewPublisherWith(js, ob, config.DefaultBatchMaxDelay, logf)
}

// NewPublisherWith is NewPublisher with the longest wait of an open batch
// for more events (billing.publish_batch.max_delay).
func NewPublisherWith(js jetstream.JetStream, ob *Outbox, maxDelay time.Duration, logf func(string, ...any)) *Publisher {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if maxDelay <= 0 {
		maxDelay = config.DefaultBatchMaxDelay
	}
	p := &Publisher{
		js:           js,
		nc:           js.Conn(),
		outbox:       ob,
		logf:         logf,
		batchSubject: UsageBatchSubject + "." + ob.id,
		maxDelay:     maxDelay,
		stop:         make(chan struct{}),
		done:         make(chan struct{}),
	}
	// A context of its own: the async publish window and the ack timeout
	// are per context, and the shared one has no timeout.
	if own, err := jetstream.New(js.Conn(),
		jetstream.WithPublishAsyncMaxPending(publishMaxInFlight),
		jetstream.WithPublishAsyncTimeout(publishAckTimeout),
	); err == nil {
		p.js = own
	} else {
		logf("meter: publishing without an ack timeout: %v", err)
	}
	ob.setLogf(logf)
	rec := ob.Recovery()
	for _, note := range rec.Notes {
		logf("meter: outbox: %s", note)
	}
	if rec.Unacked > 0 {
		logf("meter: outbox holds %d usage events not acknowledged before; publishing them again (JetStream drops the ones it has)", rec.Unacked)
	}
	go p.run()
	go p.watchOutboxWrites()
	return p
}

// Record hands ev to the outbox without waiting on the disk or NATS. It
// drops ev only when the outbox refuses it (full: see ErrOutboxFull, or
// closed); the drop is counted in Dropped and logged with the event, so it
// can be billed by hand.
func (p *Publisher) Record(ev *Event) {
	if ev.ID == "" {
		// The id is the dedup key all the way to ClickHouse, which
		// refuses events without one.
		if id, err := uuid.NewV7(); err == nil {
			ev.ID = id.String()
		}
	}
	if err := p.outbox.Append(ev); err != nil {
		p.dropped.Add(1)
		logDropped(p.logf, err, ev)
	}
}

// RecordDurable is Record that returns a channel closed once ev is on disk
// in the outbox, or at once if ev was dropped (the drop is counted and
// logged as in Record).
func (p *Publisher) RecordDurable(ev *Event) <-chan struct{} {
	if ev.ID == "" {
		if id, err := uuid.NewV7(); err == nil {
			ev.ID = id.String()
		}
	}
	done, err := p.outbox.AppendDurable(ev)
	if err != nil {
		p.dropped.Add(1)
		logDropped(p.logf, err, ev)
		return closedChan
	}
	return done
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Refusal says why the outbox refuses new usage events, or is about to
// (Outbox.Refusal); "" while it takes them. It takes no lock.
func (p *Publisher) Refusal() string { return p.outbox.Refusal() }

// Stats returns the current counters.
func (p *Publisher) Stats() PublisherStats {
	ob := p.outbox.Stats()
	return PublisherStats{
		OutboxDepth:        int64(ob.Unacked) + int64(ob.Queued),
		OutboxBytes:        ob.Bytes,
		Published:          p.published.Load(),
		Duplicates:         p.duplicates.Load(),
		Failures:           p.failures.Load() + ob.WriteFailures,
		Dropped:            p.dropped.Load() + ob.Lost,
		LastPublishLatency: time.Duration(p.lastLatency.Load()),
		Connected:          p.nc != nil && p.nc.IsConnected(),
	}
}

// Close stops taking events, writes the queued ones to the outbox and
// publishes until JetStream has acknowledged all of them or ctx ends, then
// closes the outbox. What is left is published at the next start; the
// error says how many.
func (p *Publisher) Close(ctx context.Context) error {
	p.closeOnce.Do(func() {
		p.outbox.closeInput()
		final, _, _ := p.outbox.writtenState()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
	wait:
		for p.outbox.ackedSeq() < final {
			select {
			case <-ctx.Done():
				break wait
			case <-p.done:
				break wait
			case <-tick.C:
			}
		}
		close(p.stop)
		<-p.done
		acked := p.outbox.ackedSeq()
		if err := p.outbox.Close(); err != nil {
			p.closeErr = fmt.Errorf("closing outbox: %w", err)
		}
		// Records past the last sync that succeeded are not on disk: each
		// was logged with its JSON when its sync failed, and the next
		// start will not find it. Said to stay in the outbox, they were
		// lost without a word after a disk remounted read-only.
		onDisk := min(max(p.outbox.durableState(), acked), final)
		if kept := onDisk - min(acked, onDisk); kept > 0 {
			p.closeErr = errors.Join(p.closeErr, fmt.Errorf("%d usage events not acknowledged by JetStream stay in the outbox for the next start: %w", kept, cmp.Or(context.Cause(ctx), context.DeadlineExceeded)))
		}
		if unwritten := final - onDisk; unwritten > 0 {
			p.closeErr = errors.Join(p.closeErr, fmt.Errorf("%d usage events not acknowledged by JetStream could not be written to disk and are not kept for the next start: each is logged above with its JSON (DROPPED usage event, not on disk)", unwritten))
		}
	})
	return p.closeErr
}

// inflight is one published batch waiting for its PubAck.
type inflight struct {
	last   uint64 // sequence of its last event
	events int
	fut    jetstream.PubAckFuture
	sent   time.Time
}

// pendingBatch gathers the events of one batch as they are read.
type pendingBatch struct {
	batch   uint64
	firstID string
	first   uint64 // outbox sequence of the first event
	last    uint64
	lastID  []byte // the last event's id, copied: records' bytes are the reader's
	events  int
	data    []byte // NDJSON
	started time.Time
}

func (b *pendingBatch) add(rec outboxRecord) {
	if b.events == 0 {
		b.batch, b.firstID, b.first, b.started = rec.batch, string(rec.id), rec.seq, time.Now()
	} else {
		b.data = append(b.data, '\n')
	}
	b.data = append(b.data, rec.data...)
	b.last, b.lastID = rec.seq, append(b.lastID[:0], rec.id...)
	b.events++
}

// id is the batch's Nats-Msg-Id: the same events make the same id, so a
// batch published again after a failure or a crash is a duplicate.
func (b *pendingBatch) id() string {
	if b.batch == 0 {
		return b.firstID // first-format records: one event per message, as then
	}
	return b.firstID + "+" + strconv.Itoa(b.events)
}

// run publishes the outbox in order, a batch per message, with up to
// publishMaxInFlight batches in flight. A batch goes out once it is sealed:
// full, or open for maxDelay. Records are acknowledged in the outbox in
// sequence order, so after the first failure later PubAcks cannot count:
// the window is let drain, and after a backoff publishing starts over from
// the first unacknowledged record, rebuilding the same batches. JetStream
// drops the ones it has as duplicates.
func (p *Publisher) run() {
	defer close(p.done)
	l := &publishLoop{p: p, reader: p.outbox.newReader(p.outbox.ackedSeq())}
	defer func() { l.reader.close() }() // the reader is replaced after each failure
	for {
		written, openBatch, more := p.outbox.writtenState()
		connected := p.nc.IsConnected()
		canPublish := !l.failing && connected && len(l.window) < publishMaxInFlight
		if canPublish && !l.resumed {
			l.resume()
			continue
		}
		if canPublish && written > l.reader.after && l.readIntoBatches() {
			continue // read on until caught up or the window is full
		}
		var linger <-chan time.Time
		if canPublish && l.cur.events > 0 && l.reader.after >= written {
			if l.closeCaughtUpBatch(openBatch) {
				continue
			}
			linger = l.lingerTimer()
		}
		if l.failing && len(l.window) == 0 {
			if !l.restartAfterBackoff() {
				return
			}
			continue
		}
		if !canPublish {
			// Nothing can be read now: the 1-buffered wake-up stays
			// pending for when something can.
			more = nil
		}
		if !l.wait(more, connected, linger) {
			return
		}
	}
}

// outboxWriteReport is how often watchOutboxWrites may log.
const outboxWriteReport = 10 * time.Second

// watchOutboxWrites logs, at most every outboxWriteReport, that the
// outbox failed to write to disk. A full or read-only disk shows there
// first (a spare segment or the acked file that cannot be written), long
// before events are refused, and it showed nowhere but in a counter.
func (p *Publisher) watchOutboxWrites() {
	tick := time.NewTicker(outboxWriteReport)
	defer tick.Stop()
	var seen uint64
	for {
		select {
		case <-p.done:
			return
		case <-tick.C:
		}
		st := p.outbox.Stats()
		if st.WriteFailures <= seen {
			continue
		}
		then := "it takes events while its current segment has room or acknowledged segments can be deleted or reused, then refuses them"
		if st.Unwritable {
			then = "it refuses new usage events, each logged with its JSON, until a sync succeeds"
		}
		p.logf("meter: the outbox failed to write to disk %d times in the last %s (last: %v); %s",
			st.WriteFailures-seen, outboxWriteReport, st.LastWriteErr, then)
		seen = st.WriteFailures
	}
}

// publishLoop is the state of the publisher's goroutine (run), kept in one
// place so that each step of the loop can be a method. Only that goroutine
// touches it.
type publishLoop struct {
	p           *Publisher
	reader      *outboxReader
	window      []inflight // published batches, oldest first, awaiting PubAcks
	cur         pendingBatch
	spareData   [][]byte // data of acknowledged batches, for new ones
	failing     bool     // a publish failed: let the window drain, then start over
	resumed     bool     // resume found where JetStream's copy of this outbox ends
	resumeTries int
	backoff     time.Duration
	errLogged   time.Time
	lingering   *time.Timer // reused for every open batch's max_delay
}

// readIntoBatches reads the next records into the current batch,
// publishing each batch as soon as a record of a later one shows it whole,
// and reports whether it read any. On a corrupt record it logs the loss,
// publishes the batch gathered so far and skips the rest of the segment.
func (l *publishLoop) readIntoBatches() bool {
	recs, err := l.reader.next(1024)
	for _, rec := range recs {
		if l.cur.events > 0 && (rec.batch != l.cur.batch || rec.batch == 0) {
			l.publish() // a later batch began: this one is whole
		}
		l.cur.add(rec)
	}
	var unreadable outboxReadError
	if errors.As(err, &unreadable) {
		// Nothing is damaged: the reader starts over from the last
		// acknowledged record after a pause, as after a failed publish
		// (what it sends again, JetStream's duplicate window drops).
		l.failing = true
		if time.Since(l.errLogged) > 5*time.Second {
			l.errLogged = time.Now()
			l.p.logf("meter: reading the outbox: %v; reading it again shortly, events wait in the outbox", err)
		}
		return false
	}
	if err != nil {
		// The records before the damage, of this read and of earlier ones,
		// are whole: what the batch holds goes out as it is (read again
		// after a restart, it is the same batch with the same id), and
		// only the rest of the segment is lost.
		l.p.logf("meter: LOST usage events: outbox corrupt, skipping the rest of a segment: %v", err)
		l.reader.skipSegment()
		if l.cur.events > 0 {
			l.publish()
		}
	}
	return len(recs) > 0
}

// resume skips the records an earlier process published but did not live
// to mark acknowledged (a crash between PubAcks and the acked file).
// Published again, they would be kept from a second debit only by
// JetStream's duplicate window, which a gateway down for longer than
// UsageDuplicatesWindow outlasts. Each batch names the outbox records it
// holds (OutboxRangeHeader); the records skipped are those of an unbroken
// chain of stored batches from the first unacknowledged record on, ending
// at a record this outbox holds with the same event id. A batch JetStream
// lost (a leader change) breaks the chain, and everything from it on is
// published again; so does any doubt (no header, another event at that
// sequence).
func (l *publishLoop) resume() {
	ctx, cancel := context.WithTimeout(context.Background(), resumeLookupTimeout)
	defer cancel()
	acked := l.p.outbox.ackedSeq()
	stored, end, err := l.storedRanges(ctx, acked)
	if err != nil {
		// NATS flapping or the stream not made yet: tried again after a
		// backoff. A deployment whose NATS user may publish but not read
		// the stream must still publish, as before this look-up existed.
		if l.resumeTries++; l.resumeTries < resumeMaxTries {
			l.fail("looking up the batches JetStream stored: %v", err)
			return
		}
		l.p.logf("meter: cannot look up the batches JetStream stored (%v); publishing the outbox from record %d, JetStream's duplicate window drops what it has", err, acked+1)
	}
	l.resumed = true
	l.reportMissing(end)
	ob := l.p.outbox
	chain := chainOf(acked, stored)
	// The chain's end is skipped when the outbox holds its last event;
	// else the end of an earlier batch of the chain that it holds: a
	// record cut at start (damaged) and written anew with another event
	// breaks the chain's tail only, and publishing again from acked+1
	// debited twice every event before the damage.
	through := acked
	for i := len(chain) - 1; i >= 0; i-- {
		r := chain[i]
		// Only records an earlier process wrote can be in JetStream already.
		if r.last <= ob.recoveredThrough && ob.holds(r.last, r.lastID) {
			through = r.last
			break
		}
	}
	if len(chain) > 0 && through != chain[len(chain)-1].last {
		end := chain[len(chain)-1]
		l.p.logf("meter: JetStream's batches of this outbox end at record %d, event %s, which this outbox does not hold; publishing from %d", end.last, end.lastID, through+1)
	}
	if through <= acked {
		return
	}
	ob.ack(through)
	l.p.published.Add(through - acked)
	l.p.duplicates.Add(through - acked)
	l.reader.close()
	l.reader = ob.newReader(through)
	l.p.logf("meter: JetStream already has this outbox's records %d to %d; not publishing them again", acked+1, through)
}

// storedEnd is where JetStream's batches of this outbox end: the last
// record of the last one stored, 0 when none is; err says why that is
// not known.
type storedEnd struct {
	last uint64
	err  error
}

// reportMissing says which records the outbox found on no segment at its
// start (OutboxRecovery.Missing) are lost: those past the last batch
// JetStream stored of this outbox, which never reached it. The ones
// before were acknowledged, and the acked file, which could not be
// written (a full disk), did not say so. Until 2026-11-27 nothing was
// said: a segment deleted, emptied or damaged while the gateway was
// stopped lost its events to billing without a line, unless others
// followed it.
func (l *publishLoop) reportMissing(end storedEnd) {
	ob := l.p.outbox
	missing := ob.Recovery().Missing
	if len(missing) == 0 {
		return
	}
	for _, m := range missing {
		switch lost := max(m.From, end.last+1); {
		case end.err != nil:
			l.p.logf("meter: outbox: LOST usage events: records %d to %d (%d) are in no segment, %s; not billed unless JetStream stored them, which could not be asked (%v)",
				m.From, m.To, m.To-m.From+1, m.Where, end.err)
		case lost > m.To:
			l.p.logf("meter: outbox: records %d to %d are in no segment, %s, but JetStream stored them (its batches of this outbox reach record %d): nothing is lost",
				m.From, m.To, m.Where, end.last)
		default:
			l.p.logf("meter: outbox: LOST usage events: records %d to %d (%d) are in no segment, %s, and JetStream's batches of this outbox end at record %d: not billed",
				lost, m.To, m.To-lost+1, m.Where, end.last)
		}
	}
	ob.missingReported()
}

// outboxRange is the records one stored batch holds.
type outboxRange struct {
	first, last uint64
	lastID      string
}

// parseOutboxRange reads an OutboxRangeHeader: "<first> <last> <last event id>".
func parseOutboxRange(v string) (outboxRange, bool) {
	f := strings.Fields(v)
	if len(f) != 3 {
		return outboxRange{}, false
	}
	first, err1 := strconv.ParseUint(f[0], 10, 64)
	last, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil || first == 0 || last < first {
		return outboxRange{}, false
	}
	return outboxRange{first, last, f[2]}, true
}

// chainOf is the stored batches of the chain from record acked+1, each
// reaching further than the one before, in order.
func chainOf(acked uint64, stored []outboxRange) []outboxRange {
	slices.SortFunc(stored, func(a, b outboxRange) int { return cmp.Compare(a.first, b.first) })
	through := acked
	var chain []outboxRange
	for _, r := range stored {
		if r.first > through+1 {
			break // a gap: a batch JetStream does not have
		}
		if r.last > through {
			through = r.last
			chain = append(chain, r)
		}
	}
	return chain
}

// storedRanges returns the ranges of this outbox's batches that JetStream
// stored and that may lie past acked: the last one, and when it does not
// reach back to acked+1, the headers of those stored in the duplicate
// window before it (a gateway's batches in flight at a crash were all
// published within that window of its last one; older ones were either
// acknowledged or are published again). It also returns where the last
// one ends.
func (l *publishLoop) storedRanges(ctx context.Context, acked uint64) ([]outboxRange, storedEnd, error) {
	stream, err := l.p.js.Stream(ctx, UsageStream)
	if err != nil {
		return nil, storedEnd{err: err}, err
	}
	last, err := stream.GetLastMsgForSubject(ctx, l.p.batchSubject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, storedEnd{}, nil // nothing of this outbox stored yet
	}
	if err != nil {
		return nil, storedEnd{err: err}, err
	}
	r, ok := parseOutboxRange(last.Header.Get(OutboxRangeHeader))
	if !ok {
		// A batch of an earlier version: nothing to vouch for.
		return nil, storedEnd{err: fmt.Errorf("the last batch JetStream stored of this outbox has no %s header", OutboxRangeHeader)}, nil
	}
	end := storedEnd{last: r.last}
	if r.last <= acked || r.first <= acked+1 {
		return []outboxRange{r}, end, nil // the last batch alone settles it
	}
	firstUnacked, known := l.p.outbox.eventTime(acked + 1)
	start := resumeLookFrom(last.Time, firstUnacked, known)
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{l.p.batchSubject},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &start,
		HeadersOnly:    true,
	})
	if err != nil {
		return nil, end, err
	}
	var out []outboxRange
	for {
		msgs, err := cons.Fetch(1000, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, end, err
		}
		n := 0
		for msg := range msgs.Messages() {
			n++
			if r, ok := parseOutboxRange(msg.Headers().Get(OutboxRangeHeader)); ok {
				out = append(out, r)
			}
			if meta, err := msg.Metadata(); err == nil && meta.Sequence.Stream >= last.Sequence {
				return out, end, nil
			}
		}
		if err := msgs.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, end, err
		}
		if n == 0 {
			return nil, end, fmt.Errorf("reading this outbox's batches stopped before stream sequence %d", last.Sequence)
		}
	}
}

// resumeLookFrom is where resume starts reading stored batches: the
// duplicate window before the last one, where a crash's batches in flight
// all are, or a minute before the first unacknowledged event's time, if
// earlier. The acked file can be older than the window: it could not be
// replaced for a while (a full disk) while batches were still stored, and
// the chain must reach back to the batch holding that event, which
// JetStream stored after the event's time. Reading only the window, the
// records stored before it were published again and, past the duplicate
// window, debited twice.
func resumeLookFrom(lastStored, firstUnacked time.Time, known bool) time.Time {
	start := lastStored.Add(-UsageDuplicatesWindow)
	if known && firstUnacked.Add(-time.Minute).Before(start) {
		start = firstUnacked.Add(-time.Minute)
	}
	return start
}

// closeCaughtUpBatch decides about the current batch once every event
// written so far is read into it: sealed by the outbox (full, or a later
// batch opened) or of the first format (one event a message), it is whole
// and goes out; open for max_delay, it is sealed here, and the loop reads
// what was appended before the seal. It reports whether it did either; if
// not, the batch lingers (lingerTimer).
func (l *publishLoop) closeCaughtUpBatch(openBatch uint64) bool {
	switch {
	case l.cur.batch < openBatch || l.cur.batch == 0:
		l.publish() // sealed, and every event of it read
		return true
	case time.Since(l.cur.started) >= l.p.maxDelay:
		l.p.outbox.seal(l.cur.batch)
		return true // read what was appended before the seal
	}
	return false
}

// lingerTimer returns a channel that receives when the open batch has been
// open for max_delay. One timer serves every batch, reset each time, so
// that lingering allocates nothing.
func (l *publishLoop) lingerTimer() <-chan time.Time {
	if l.lingering == nil {
		l.lingering = time.NewTimer(l.p.maxDelay - time.Since(l.cur.started))
	} else {
		l.lingering.Reset(l.p.maxDelay - time.Since(l.cur.started))
	}
	return l.lingering.C
}

// restartAfterBackoff waits out the backoff once the window has drained
// after a failure, then reads again from the first unacknowledged record:
// the same batches are rebuilt with the same ids, and JetStream drops those
// it has. It returns false if the publisher stops meanwhile.
func (l *publishLoop) restartAfterBackoff() bool {
	l.backoff = min(max(2*l.backoff, 100*time.Millisecond), maxPublishBackoff)
	select {
	case <-l.p.stop:
		return false
	case <-time.After(l.backoff):
	}
	l.reader.close()
	l.reader = l.p.outbox.newReader(l.p.outbox.ackedSeq())
	l.cur = pendingBatch{}
	l.failing = false
	return true
}

// wait blocks until the loop can move on (new events, the open batch's
// max_delay, a moment to check the connection again, the publisher
// stopping) or the oldest batch in flight is acknowledged or failed, which
// it handles. It returns false once the publisher stops.
func (l *publishLoop) wait(more <-chan struct{}, connected bool, linger <-chan time.Time) bool {
	var recheck <-chan time.Time
	if !connected {
		recheck = time.After(100 * time.Millisecond)
	}
	// Only the oldest batch's future is watched: acks count in order.
	var acked <-chan *jetstream.PubAck
	var failed <-chan error
	if len(l.window) > 0 {
		acked, failed = l.window[0].fut.Ok(), l.window[0].fut.Err()
	}
	select {
	case <-l.p.stop:
		return false
	case <-more:
	case <-recheck:
	case <-linger:
	case ack := <-acked:
		head := l.popOldest()
		if l.failing {
			return true // after a failure, later PubAcks cannot move the watermark
		}
		l.acknowledged(head, ack)
	case err := <-failed:
		head := l.popOldest()
		l.fail("batch %s: %v", head.fut.Msg().Header.Get(jetstream.MsgIDHeader), err)
	}
	if len(l.window) == 0 {
		l.window = nil // let the backing array go
	}
	return true
}

// popOldest takes the oldest batch, whose future is done, out of the
// window.
func (l *publishLoop) popOldest() inflight {
	head := l.window[0]
	l.window = l.window[1:]
	l.recycle(head)
	return head
}

// acknowledged moves the outbox's watermark past a batch JetStream has
// stored, and counts it.
func (l *publishLoop) acknowledged(head inflight, ack *jetstream.PubAck) {
	l.backoff = 0
	l.p.outbox.ack(head.last)
	l.p.published.Add(uint64(head.events))
	if ack.Duplicate {
		l.p.duplicates.Add(uint64(head.events))
	}
	l.p.lastLatency.Store(int64(time.Since(head.sent)))
}

// fail counts a failed publish and marks the loop failing; it logs at most
// every 5 s, since NATS down fails every attempt.
func (l *publishLoop) fail(format string, args ...any) {
	l.p.failures.Add(1)
	l.failing = true
	if time.Since(l.errLogged) > 5*time.Second {
		l.errLogged = time.Now()
		l.p.logf("meter: publishing usage: "+format+"; retrying, events wait in the outbox", args...)
	}
}

// publish sends the current batch and starts the next one, on spare data
// if there is some.
func (l *publishLoop) publish() {
	subject := l.p.batchSubject
	header := nats.Header{jetstream.MsgIDHeader: []string{l.cur.id()}}
	if l.cur.batch == 0 {
		subject = usageSubject(gjsonAccount(l.cur.data))
	} else {
		header[OutboxRangeHeader] = []string{strconv.FormatUint(l.cur.first, 10) + " " + strconv.FormatUint(l.cur.last, 10) + " " + string(l.cur.lastID)}
	}
	fut, err := l.p.js.PublishMsgAsync(&nats.Msg{Subject: subject, Header: header, Data: l.cur.data})
	if err != nil {
		l.fail("%v", err)
	} else {
		l.window = append(l.window, inflight{last: l.cur.last, events: l.cur.events, fut: fut, sent: time.Now()})
	}
	l.cur = pendingBatch{lastID: l.cur.lastID[:0]} // the message owns data until its PubAck
	if n := len(l.spareData); n > 0 {
		l.cur.data, l.spareData = l.spareData[n-1], l.spareData[:n-1]
	}
}

// recycle takes back a batch's data once its future is done: nats.go
// copied it into the connection's buffer when it was published, and
// no retry can send it again.
func (l *publishLoop) recycle(head inflight) {
	if data := head.fut.Msg().Data; cap(data) <= 2*MaxBatchBytes && len(l.spareData) < publishMaxInFlight {
		l.spareData = append(l.spareData, data[:0])
	}
}

// gjsonAccount reads the account of a one-event message of the first
// format, for its subject.
func gjsonAccount(event []byte) string {
	var ev struct {
		Account string `json:"account"`
	}
	_ = json.Unmarshal(event, &ev)
	return ev.Account
}

// usageSubject is usage.<account>, or invalidAccountSubject for an
// account that would not make a valid literal subject.
func usageSubject(account string) string {
	if account == "" || len(account) > 255 || account[0] == '.' || account[len(account)-1] == '.' {
		return invalidAccountSubject
	}
	for i := 0; i < len(account); i++ {
		switch c := account[i]; {
		case c <= ' ', c == '*', c == '>', c == 0x7f:
			return invalidAccountSubject
		case c == '.' && account[i-1] == '.':
			return invalidAccountSubject
		}
	}
	return UsageSubjectPrefix + account
}

// logDropped logs a dropped event with its full JSON, so it can be billed
// by hand: every one. At most 20 a second were, before, and the rest only
// counted, which left most of a full disk's refused events, paid answers,
// with no record at all. A disk that full floods the log; that is the
// price of not losing the money.
func logDropped(logf func(string, ...any), err error, ev *Event) {
	// A logged request's text goes to request_logs or nowhere: never into
	// the gateway's own log.
	billable := *ev
	billable.Log = nil
	data, _ := json.Marshal(&billable)
	logf("meter: DROPPED usage event, not billed: %v: %s", err, data)
}
