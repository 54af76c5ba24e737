package billing

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
)

// ConsumerName is the durable pull consumer on USAGE that every billing
// process shares; JetStream hands each of them a part of the stream.
const ConsumerName = "billing"

// DebitFunc charges an account for usage, skipping events it was charged
// for already; (*accounts.Service).ApplyUsage is the one to use. An error
// wrapping accounts.ErrNotFound or accounts.ErrInvalidInput is final: the
// usage is logged and left uncharged. Any other error is retried.
type DebitFunc func(ctx context.Context, account string, usage accounts.Usage) (accounts.Account, money.Nanos, error)

// Options tune Run; zero values take the defaults.
type Options struct {
	// Batch is the most messages fetched, inserted and debited together
	// (default 5000). It is also the consumer's MaxAckPending, so billing
	// holds at most one fetch unacknowledged across all processes.
	Batch int
	// FetchBytes bounds the bytes of one fetch (default 4 MiB, about 8,000
	// events). It must exceed the largest message (a gateway's batch,
	// under meter.MaxBatchBytes), or that message would never be delivered.
	FetchBytes int
	// MaxWait is how long a fetch waits to fill a batch (default 1s): the
	// delay between a quiet gateway's event and its debit.
	MaxWait time.Duration
	// AckWait is how long JetStream waits for an ack before delivering a
	// batch to another process (default 20s). A live process keeps its
	// batch with progress acks while it retries.
	AckWait time.Duration
	// InsertTimeout bounds one INSERT attempt (default 30s).
	InsertTimeout time.Duration
	// Logf receives problems that do not stop billing; nil discards them.
	Logf func(string, ...any)

	// Test hooks, each run once per batch: after the INSERT and after the
	// debits. An error ends Run with no ack sent, as a crash there
	// would.
	afterInsert func() error
	afterDebit  func() error
}

func (o Options) withDefaults() Options {
	if o.Batch <= 0 {
		o.Batch = 5000
	}
	if o.FetchBytes <= 0 {
		o.FetchBytes = 4 << 20
	}
	o.FetchBytes = max(o.FetchBytes, 2*meter.MaxBatchBytes)
	if o.MaxWait <= 0 {
		o.MaxWait = time.Second
	}
	if o.AckWait <= 0 {
		o.AckWait = 20 * time.Second
	}
	if o.InsertTimeout <= 0 {
		o.InsertTimeout = 30 * time.Second
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o
}

const (
	maxBillingBackoff = 5 * time.Second
	debitTimeout      = 10 * time.Second
	debitWorkers      = 8
	ackTimeout        = 5 * time.Second
)

// Run moves usage events from the USAGE stream into ClickHouse and
// account balances until ctx ends, then returns nil. Per batch: fetch,
// INSERT (retried while ClickHouse is down), debit each account once for
// the batch (ApplyUsage skips events already charged), then ack. Nothing
// is acked before its INSERT and debit have succeeded, so a crash anywhere
// means redelivery, and redelivery is harmless: ClickHouse keeps one row
// per event id under FINAL and debits are idempotent per stream sequence.
//
// Acks are explicit, one per message: with AckAll, acking the end of this
// process's batch would also ack messages delivered to another process
// that has not billed them yet.
//
// Messages that do not decode, events with a negative cost and events
// ClickHouse refuses (ErrInvalidEvent) are logged and terminated, so they
// never block the stream. Events of accounts that do not exist are stored
// in ClickHouse and logged, not charged.
//
// The USAGE stream must exist (meter.EnsureUsageStream). Any number of
// processes may bill the stream at once.
func Run(ctx context.Context, js jetstream.JetStream, sink *ClickHouseSink, debit DebitFunc, opts Options) error {
	opts = opts.withDefaults()
	b := &biller{js: js, sink: sink, debit: debit, opts: opts}
	var backoff time.Duration
	for {
		err := b.ensureConsumer(ctx)
		if err == nil {
			break
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		opts.Logf("billing: %v; retrying", err)
		backoff = nextBackoff(backoff)
		sleepCtx(ctx, backoff)
	}
	backoff = 0
	for ctx.Err() == nil {
		msgs, err := b.fetch()
		if err != nil {
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) {
				opts.Logf("billing: consumer %s is gone; creating it again", ConsumerName)
				if err := b.ensureConsumer(ctx); err != nil && ctx.Err() == nil {
					opts.Logf("billing: %v", err)
				}
			} else {
				opts.Logf("billing: fetching usage: %v", err)
			}
			backoff = nextBackoff(backoff)
			sleepCtx(ctx, backoff)
			continue
		}
		backoff = 0
		if len(msgs) == 0 {
			continue
		}
		if err := b.bill(ctx, msgs); err != nil {
			return err
		}
	}
	return nil
}

type biller struct {
	js    jetstream.JetStream
	sink  *ClickHouseSink
	debit DebitFunc
	opts  Options
	cons  jetstream.Consumer
}

func (b *biller) ensureConsumer(ctx context.Context) error {
	cons, err := b.js.CreateOrUpdateConsumer(ctx, meter.UsageStream, jetstream.ConsumerConfig{
		Durable:       ConsumerName,
		Description:   "tollgate billing: usage into ClickHouse and balances",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       b.opts.AckWait,
		MaxAckPending: b.opts.Batch,
		MaxDeliver:    -1, // events are money: never give up on one
	})
	if err != nil {
		return fmt.Errorf("creating consumer %s on stream %s (created by EnsureUsageStream): %w", ConsumerName, meter.UsageStream, err)
	}
	b.cons = cons
	return nil
}

// fetch waits up to MaxWait for a batch. The count is given with the
// bytes: FetchBytes alone sizes nats.go's channels for a million
// messages, about 30 MB allocated by every fetch, once a second when idle.
func (b *biller) fetch() ([]jetstream.Msg, error) {
	batch, err := b.cons.Fetch(b.opts.Batch, jetstream.FetchMaxBytes(b.opts.FetchBytes), jetstream.FetchMaxWait(b.opts.MaxWait))
	if err != nil {
		return nil, err
	}
	var msgs []jetstream.Msg
	for msg := range batch.Messages() {
		msgs = append(msgs, msg)
	}
	if err := batch.Error(); err != nil && len(msgs) == 0 && !errors.Is(err, jetstream.ErrNoMessages) {
		return nil, err
	}
	return msgs, nil
}

// delivery is one event of a fetched message; a message holds a batch of
// events (one per line), or one event from earlier gateways.
type delivery struct {
	msg jetstream.Msg
	seq uint64
	ev  *meter.Event
}

// decodeMessage returns the events of a message. A line that does not
// decode, or whose cost is out of range, is logged with its text, for billing by hand, and skipped: the
// other events of the batch are billed.
func (b *biller) decodeMessage(msg jetstream.Msg, seq uint64) []delivery {
	var out []delivery
	data := msg.Data()
	for line := 0; len(data) > 0; line++ {
		next := bytes.IndexByte(data, '\n')
		raw := data
		if next >= 0 {
			raw, data = data[:next], data[next+1:]
		} else {
			data = nil
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		ev := new(meter.Event)
		if err := json.Unmarshal(raw, ev); err != nil {
			b.opts.Logf("billing: NOT CHARGED: undecodable event %d of message %d on %s: %v: %.500q", line, seq, msg.Subject(), err, raw)
			continue
		}
		// Past money.MaxEventCost, summed with the other events of its
		// message, a cost could overflow and void their debits. Config
		// refuses prices that make one from believed usage; an estimate
		// (no usage believed) or a batch job's bill can still exceed it.
		if ev.CostNanos < 0 || ev.CostNanos > money.MaxEventCost {
			b.opts.Logf("billing: NOT CHARGED: event %s (message %d): cost %s USD is out of range (0 to %s): %.500q",
				ev.ID, seq, ev.CostNanos, money.MaxEventCost, raw)
			continue
		}
		out = append(out, delivery{msg: msg, seq: seq, ev: ev})
	}
	return out
}

// bill processes one fetch; it returns an error only from a test hook.
// When ctx ends before the acks, it returns nil and the messages go back
// to the stream.
func (b *biller) bill(ctx context.Context, msgs []jetstream.Msg) error {
	stopKeepAlive := b.keepAlive(msgs)
	defer stopKeepAlive()

	var poison []jetstream.Msg
	var seqs []uint64
	var good []jetstream.Msg
	seen := make(map[uint64]bool, len(msgs))
	var events []delivery
	for _, msg := range msgs {
		meta, err := msg.Metadata()
		if err != nil {
			b.opts.Logf("billing: terminating a message on %s without metadata: %v", msg.Subject(), err)
			poison = append(poison, msg)
			continue
		}
		seq := meta.Sequence.Stream
		seqs = append(seqs, seq)
		good = append(good, msg)
		if seen[seq] {
			continue // redelivered into the fetch that already holds it
		}
		seen[seq] = true
		events = append(events, b.decodeMessage(msg, seq)...)
	}
	slices.SortStableFunc(events, func(a, b delivery) int { return cmp.Compare(a.seq, b.seq) })

	rejected, err := b.insert(ctx, events)
	if err != nil {
		b.release(msgs)
		return nil
	}
	if b.opts.afterInsert != nil {
		if err := b.opts.afterInsert(); err != nil {
			return err
		}
	}
	if len(rejected) > 0 {
		// Logged with their JSON by insertSplitting; not charged, and the
		// rest of their batches are.
		refused := make(map[*meter.Event]bool, len(rejected))
		for _, d := range rejected {
			refused[d.ev] = true
		}
		events = slices.DeleteFunc(events, func(d delivery) bool { return refused[d.ev] })
	}

	if err := b.debitAll(ctx, events, seqs); err != nil {
		b.release(msgs)
		return nil
	}
	if b.opts.afterDebit != nil {
		if err := b.opts.afterDebit(); err != nil {
			return err
		}
	}

	stopKeepAlive()
	b.ack(good, poison)
	return nil
}

// insert writes the batch into ClickHouse, retrying until it succeeds or
// ctx ends. It returns the events ClickHouse refuses (ErrInvalidEvent),
// found by splitting the batch.
func (b *biller) insert(ctx context.Context, batch []delivery) ([]delivery, error) {
	var backoff time.Duration
	var logged time.Time
	for {
		rejected, err := b.insertSplitting(ctx, batch)
		if err == nil {
			if !logged.IsZero() {
				b.opts.Logf("billing: ClickHouse takes inserts again")
			}
			return rejected, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if time.Since(logged) > 10*time.Second {
			logged = time.Now()
			b.opts.Logf("billing: %v; retrying, nothing is acked meanwhile", err)
		}
		backoff = nextBackoff(backoff)
		sleepCtx(ctx, backoff)
	}
}

func (b *biller) insertSplitting(ctx context.Context, batch []delivery) ([]delivery, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	events := make([]*meter.Event, len(batch))
	for i, d := range batch {
		events[i] = d.ev
	}
	insertCtx, cancel := context.WithTimeout(ctx, b.opts.InsertTimeout)
	err := b.sink.Insert(insertCtx, events)
	cancel()
	if err == nil {
		return nil, nil
	}
	if !errors.Is(err, ErrInvalidEvent) {
		return nil, err
	}
	if len(batch) == 1 {
		data, _ := json.Marshal(batch[0].ev)
		b.opts.Logf("billing: NOT CHARGED: event of message %d, ClickHouse cannot store it: %v: %s", batch[0].seq, err, data)
		return batch, nil
	}
	mid := len(batch) / 2
	left, err := b.insertSplitting(ctx, batch[:mid])
	if err != nil {
		return nil, err
	}
	right, err := b.insertSplitting(ctx, batch[mid:])
	if err != nil {
		return nil, err
	}
	return append(left, right...), nil
}

// debitAll charges every account of the batch, in parallel, retrying
// failures other than a missing account or refused input until ctx ends.
// seqs are the stream sequences of every message in the batch.
func (b *biller) debitAll(ctx context.Context, batch []delivery, seqs []uint64) error {
	// One entry per account and message: a message's events of one
	// account are charged together, idempotently by its stream sequence.
	type accountEntries struct {
		usage accounts.Usage
		// plain is the index in usage.Events of the entry of the current
		// sequence's events that are not a batch job's, -1 for none yet.
		plain int
		seq   uint64
	}
	perAccount := map[string]*accountEntries{}
	for _, d := range batch { // sorted by sequence
		a := perAccount[d.ev.Account]
		if a == nil {
			a = &accountEntries{plain: -1}
			perAccount[d.ev.Account] = a
		}
		if a.seq != d.seq {
			a.seq, a.plain = d.seq, -1
		}
		// A batch job's event is charged by its id as well: two
		// processes may both have published it (see accounts.SeqCost).
		// Its id, not its job id: a job stopped by a balance that could
		// not pay bills its lines done under the job id and ".1" (…),
		// and its completion, under the job id, charges the rest.
		// Every other event of the message goes into the one entry, also
		// around a job's (two entries of one sequence were refused as an
		// event listed twice, and the account's whole fetch went
		// uncharged).
		if d.ev.JobID != "" {
			a.usage.Events = append(a.usage.Events, accounts.SeqCost{Seq: d.seq, Cost: d.ev.CostNanos, Job: d.ev.ID})
			continue
		}
		if a.plain >= 0 {
			a.usage.Events[a.plain].Cost += d.ev.CostNanos
			continue
		}
		a.plain = len(a.usage.Events)
		a.usage.Events = append(a.usage.Events, accounts.SeqCost{Seq: d.seq, Cost: d.ev.CostNanos})
	}
	if len(perAccount) == 0 {
		return nil
	}
	covered := seqRuns(seqs)
	settled := b.ackFloor(ctx)
	work := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for range min(debitWorkers, len(perAccount)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for account := range work {
				u := &perAccount[account].usage
				u.Covered, u.SettledThrough = covered, settled
				if err := b.debitOne(ctx, account, *u); err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			}
		}()
	}
	for account := range perAccount {
		work <- account
	}
	close(work)
	wg.Wait()
	return failed
}

func (b *biller) debitOne(ctx context.Context, account string, u accounts.Usage) error {
	var backoff time.Duration
	var logged time.Time
	for {
		debitCtx, cancel := context.WithTimeout(ctx, debitTimeout)
		_, _, err := b.debit(debitCtx, account, u)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, accounts.ErrNotFound), errors.Is(err, accounts.ErrInvalidInput):
			var total money.Nanos
			for _, e := range u.Events {
				total += e.Cost
			}
			b.opts.Logf("billing: NOT CHARGED: %d usage events, %s USD, of account %q: %v", len(u.Events), total, account, err)
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		}
		if time.Since(logged) > 10*time.Second {
			logged = time.Now()
			b.opts.Logf("billing: debiting %s: %v; retrying, nothing is acked meanwhile", account, err)
		}
		backoff = nextBackoff(backoff)
		sleepCtx(ctx, backoff)
	}
}

// ackFloor is the stream sequence up to which the consumer has every
// message acknowledged, 0 when it cannot be read (which only makes
// ApplyUsage keep more ranges).
func (b *biller) ackFloor(ctx context.Context) uint64 {
	infoCtx, cancel := context.WithTimeout(ctx, ackTimeout)
	defer cancel()
	info, err := b.cons.Info(infoCtx)
	if err != nil {
		return 0
	}
	return info.AckFloor.Stream
}

// release hands an unfinished batch back when billing stops, so another
// process need not wait out AckWait for it. Debits already made stay,
// and are not made again on redelivery.
func (b *biller) release(msgs []jetstream.Msg) {
	for _, msg := range msgs {
		_ = msg.Nak()
	}
}

// ack acknowledges the billed messages and terminates the poison ones.
// The last ack waits for the server's confirmation, and with it the
// others sent before it on the connection. A lost ack only means a
// redelivery, which is harmless.
func (b *biller) ack(good []jetstream.Msg, poison []jetstream.Msg) {
	for _, msg := range poison {
		if err := msg.TermWithReason("tollgate billing cannot use this message"); err != nil {
			b.opts.Logf("billing: terminating message: %v", err)
		}
	}
	for i, msg := range good {
		var err error
		if i == len(good)-1 {
			ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
			err = msg.DoubleAck(ctx)
			cancel()
		} else {
			err = msg.Ack()
		}
		if err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			b.opts.Logf("billing: acking a message: %v (it will be delivered again, and not charged twice)", err)
			return
		}
	}
}

// keepAlive tells JetStream every third of AckWait that the batch is
// still being worked on, so a live process retrying a down ClickHouse
// keeps its batch. The returned stop may be called more than once.
func (b *biller) keepAlive(msgs []jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(b.opts.AckWait / 3)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				for _, msg := range msgs {
					_ = msg.InProgress()
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done); <-exited })
	}
}

// seqRuns returns the runs of consecutive sequences in seqs.
func seqRuns(seqs []uint64) []accounts.SeqRange {
	sorted := slices.Clone(seqs)
	slices.Sort(sorted)
	var runs []accounts.SeqRange
	for _, seq := range sorted {
		if n := len(runs); n > 0 && seq <= runs[n-1].Through+1 {
			runs[n-1].Through = max(runs[n-1].Through, seq)
			continue
		}
		runs = append(runs, accounts.SeqRange{From: seq, Through: seq})
	}
	return runs
}

func nextBackoff(d time.Duration) time.Duration {
	return min(max(2*d, 100*time.Millisecond), maxBillingBackoff)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
