package billing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/chtest"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
)

// billingRig is NATS with the USAGE stream, ClickHouse with the schema,
// and accounts acct-0 … acct-4 with no credit.
type billingRig struct {
	t     testing.TB
	nats  *broker.Broker
	js    jetstream.JetStream
	ch    *chtest.Server
	sink  *billing.ClickHouseSink
	accts *accounts.Service
}

const rigAccounts = 5 // usageEvent spreads events over acct-0 … acct-4

func newBillingRig(t testing.TB) *billingRig {
	t.Helper()
	r := &billingRig{t: t, nats: startNATS(t)}
	r.js = r.nats.JetStream()
	ctx := testContext(t)
	if _, err := meter.EnsureUsageStream(ctx, r.js, 1, 0); err != nil {
		t.Fatal(err)
	}
	r.ch = chtest.Start(t)
	r.sink = openClickHouseSink(t, r.ch)
	accts, err := accounts.Open(ctx, r.js, 1, t.TempDir(), config.Auth{Algorithm: "EdDSA", Issuer: "tollgate-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(accts.Close)
	r.accts = accts
	for i := range rigAccounts {
		if _, err := accts.CreateAccount(ctx, fmt.Sprintf("acct-%d", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// publish puts events into USAGE as the publisher does: batches of up to
// 100 events, one per line, the batch id in Nats-Msg-Id.
func (r *billingRig) publish(events []*meter.Event) {
	r.t.Helper()
	for len(events) > 0 {
		batch := events[:min(100, len(events))]
		events = events[len(batch):]
		var data []byte
		for i, ev := range batch {
			if i > 0 {
				data = append(data, '\n')
			}
			data = ev.AppendJSON(data)
		}
		msg := &nats.Msg{Subject: meter.UsageBatchSubject, Data: data, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s+%d", batch[0].ID, len(batch)))
		if _, err := r.js.PublishMsgAsync(msg); err != nil {
			r.t.Fatal(err)
		}
	}
	r.waitPublished()
}

func (r *billingRig) waitPublished() {
	select {
	case <-r.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		r.t.Fatal("publishing timed out")
	}
}

// publishSingles puts events into USAGE as gateways before batching did:
// one message per event on usage.<account>, its id in Nats-Msg-Id.
func (r *billingRig) publishSingles(events []*meter.Event) {
	r.t.Helper()
	for _, ev := range events {
		data, err := json.Marshal(ev)
		if err != nil {
			r.t.Fatal(err)
		}
		msg := &nats.Msg{Subject: meter.UsageSubjectPrefix + ev.Account, Data: data, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, ev.ID)
		if _, err := r.js.PublishMsgAsync(msg); err != nil {
			r.t.Fatal(err)
		}
	}
	select {
	case <-r.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		r.t.Fatal("publishing timed out")
	}
}

// billingProcess is one RunBilling.
type billingProcess struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	result error
}

// run starts a billing process, stopped when the test ends.
func (r *billingRig) run(opts billing.Options) *billingProcess {
	ctx, cancel := context.WithCancel(context.Background())
	if opts.Logf == nil {
		opts.Logf = syncLog(r.t)
	}
	p := &billingProcess{cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- billing.Run(ctx, r.js, r.sink, r.accts.ApplyUsage, opts) }()
	r.t.Cleanup(func() { _ = p.stop() })
	return p
}

// wait returns RunBilling's result once it has returned on its own.
func (p *billingProcess) wait(t testing.TB, within time.Duration) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.once.Do(func() { p.cancel(); p.result = err })
		return err
	case <-time.After(within):
		t.Fatalf("RunBilling still running after %s", within)
		return nil
	}
}

// stop ends the process and returns RunBilling's result.
func (p *billingProcess) stop() error {
	p.once.Do(func() { p.cancel(); p.result = <-p.done })
	return p.result
}

type usageTotals struct {
	Count uint64
	Cost  int64
}

func (r *billingRig) totals(from string) usageTotals {
	r.t.Helper()
	var got usageTotals
	if err := r.sink.Conn().QueryRow(context.Background(), "SELECT count(), sum(cost_nanos) FROM "+from).Scan(&got.Count, &got.Cost); err != nil {
		r.t.Fatalf("totals of %s: %v", from, err)
	}
	return got
}

func (r *billingRig) waitForTotals(want usageTotals, within time.Duration) {
	r.t.Helper()
	testutil.CheckFor(r.t, within, 50*time.Millisecond, func() error {
		if got := r.totals("usage_events FINAL"); got != want {
			return fmt.Errorf("ClickHouse FINAL holds %+v, want %+v", got, want)
		}
		return nil
	})
}

// checkBalances waits until the stream's messages are all acked, so all
// debited, then checks that each account was debited exactly the cost of
// its events, and ClickHouse agrees.
func (r *billingRig) checkBalances(events []*meter.Event) {
	r.t.Helper()
	r.waitAllAcked()
	want := map[string]money.Nanos{}
	for _, ev := range events {
		want[ev.Account] += ev.CostNanos
	}
	ctx := testContext(r.t)
	for i := range rigAccounts {
		id := fmt.Sprintf("acct-%d", i)
		acct, err := r.accts.Account(ctx, id)
		if err != nil {
			r.t.Fatal(err)
		}
		if acct.Debited != want[id] || acct.Balance != -want[id] {
			r.t.Errorf("%s: debited %s, balance %s; want %s debited exactly once", id, acct.Debited, acct.Balance, want[id])
		}
		var inClickHouse int64
		if err := r.sink.Conn().QueryRow(ctx, "SELECT sum(cost_nanos) FROM usage_events FINAL WHERE account = ?", id).Scan(&inClickHouse); err != nil {
			r.t.Fatal(err)
		}
		if money.Nanos(inClickHouse) != want[id] {
			r.t.Errorf("%s: ClickHouse has %s USD, want %s", id, money.Nanos(inClickHouse), want[id])
		}
	}
}

// waitAllAcked waits until the billing consumer has acked every message
// of the stream.
func (r *billingRig) waitAllAcked() {
	r.t.Helper()
	ctx := testContext(r.t)
	stream, err := r.js.Stream(ctx, meter.UsageStream)
	if err != nil {
		r.t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	testutil.CheckFor(r.t, 30*time.Second, 20*time.Millisecond, func() error {
		if floor, pending := r.consumerState(); floor != info.State.LastSeq || pending != 0 {
			return fmt.Errorf("ack floor %d with %d pending, want all %d messages acked", floor, pending, info.State.LastSeq)
		}
		return nil
	})
}

// consumerState is the billing consumer's ack floor and unacked count.
func (r *billingRig) consumerState() (ackFloor uint64, pending int) {
	r.t.Helper()
	ctx := testContext(r.t)
	cons, err := r.js.Consumer(ctx, meter.UsageStream, billing.ConsumerName)
	if err != nil {
		r.t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	return info.AckFloor.Stream, info.NumAckPending
}

func eventsFrom(from, to int) []*meter.Event {
	events := make([]*meter.Event, 0, to-from)
	for i := from; i < to; i++ {
		events = append(events, usageEvent(i))
	}
	return events
}

func totalsOf(events []*meter.Event) usageTotals {
	var t usageTotals
	for _, ev := range events {
		t.Count++
		t.Cost += int64(ev.CostNanos)
	}
	return t
}

func TestBillingStoresAndChargesEveryEventExactly(t *testing.T) {
	r := newBillingRig(t)
	events := eventsFrom(0, 12_000)
	r.publish(events[:5000])
	r.publishSingles(events[5000:7000]) // from gateways before batches
	// Poison: not JSON, and a negative cost. Neither may block the stream.
	if _, err := r.js.Publish(testContext(t), "usage.acct-1", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	negative := usageEvent(99_999)
	negative.CostNanos = -5
	r.publish([]*meter.Event{negative})
	// A batch with a line that does not decode and an event whose cost is
	// out of range, of the same account as the others: the others count
	// (summed with them, the huge cost once overflowed and voided them).
	mixed := eventsFrom(50_000, 50_003)
	data := append(mixed[0].AppendJSON(nil), "\n{broken\n"...)
	data = append(mixed[1].AppendJSON(data), '\n')
	huge := usageEvent(100_001)
	huge.Account, huge.CostNanos = mixed[2].Account, math.MaxInt64
	data = append(huge.AppendJSON(data), '\n')
	data = mixed[2].AppendJSON(data)
	if _, err := r.js.Publish(testContext(t), meter.UsageBatchSubject, data); err != nil {
		t.Fatal(err)
	}

	// An account that does not exist: stored, not charged.
	ghost := usageEvent(100_000)
	ghost.Account = "ghost"
	r.publish([]*meter.Event{ghost})
	r.publish(events[7000:])

	proc := r.run(billing.Options{Batch: 3000})
	charged := append(slices.Clone(events), mixed...)
	want := totalsOf(append(slices.Clone(charged), ghost))
	r.waitForTotals(want, 30*time.Second)
	r.checkBalances(charged)
	if err := proc.stop(); err != nil {
		t.Fatal(err)
	}
	if got := r.totals("usage_events"); got != want {
		t.Errorf("without FINAL: %+v, want %+v (nothing was redelivered here)", got, want)
	}
}

// A batch job's one event published twice, in messages JetStream does not
// take for duplicates (a worker that died after billing the job publishes
// it again when it restarts, in a batch of its own, after the worker that
// finished the job billed it): one row, one debit. ClickHouse kept one
// row, but the account was debited twice.
func TestBillingChargesABatchJobOnceFromTwoMessages(t *testing.T) {
	r := newBillingRig(t)
	events := eventsFrom(0, 300)
	job := usageEvent(500)
	job.JobID = job.ID
	// In the middle of a message, among calls of its account: the calls
	// around it are charged in one entry.
	r.publish(slices.Concat(events[:50], []*meter.Event{job}, events[50:99]))
	r.publish(slices.Concat([]*meter.Event{job}, events[100:199])) // another batch id: not a JetStream duplicate
	r.publish(events[200:])
	want := slices.Concat(events[:99], events[100:199], events[200:], []*meter.Event{job})
	r.run(billing.Options{Batch: 1000, MaxWait: 100 * time.Millisecond})
	r.waitForTotals(totalsOf(want), 20*time.Second)
	r.checkBalances(want)
}

// A batch job stopped by a balance that could not pay bills its lines done
// under the job id and ".1", and its completion the rest under the job id:
// two bills of one job, each charged once however often it comes.
func TestBillingChargesEachBillOfABatchJobOnce(t *testing.T) {
	r := newBillingRig(t)
	events := eventsFrom(0, 100)
	stop, done := usageEvent(500), usageEvent(501)
	stop.JobID, done.JobID = done.ID, done.ID
	stop.ID, stop.Account = done.ID+".1", done.Account
	r.publish(slices.Concat(events[:50], []*meter.Event{stop}))
	r.publish([]*meter.Event{stop}) // its repeat, by a worker taking over
	r.publish(slices.Concat([]*meter.Event{done}, events[50:]))
	want := slices.Concat(events, []*meter.Event{stop, done})
	r.run(billing.Options{Batch: 1000, MaxWait: 100 * time.Millisecond})
	r.waitForTotals(totalsOf(want), 20*time.Second)
	r.checkBalances(want)
}

func TestBillingWaitsOutAClickHouseOutage(t *testing.T) {
	r := newBillingRig(t)
	events := eventsFrom(0, 6000)
	r.publish(events[:2000])
	r.run(billing.Options{Batch: 1000, MaxWait: 100 * time.Millisecond})
	r.waitForTotals(totalsOf(events[:2000]), 20*time.Second)

	r.ch.Stop()
	r.publish(events[2000:])
	floorBefore, _ := r.consumerState()
	time.Sleep(time.Second) // inserts fail and are retried meanwhile
	floor, pending := r.consumerState()
	if floor != floorBefore || pending == 0 {
		t.Fatalf("with ClickHouse down the ack floor moved %d → %d (%d pending): acked before inserting", floorBefore, floor, pending)
	}
	r.ch.Restart()
	r.waitForTotals(totalsOf(events), 30*time.Second)
	r.checkBalances(events)
}

func TestBillingRedeliveryAfterACrashChargesOnce(t *testing.T) {
	for _, crashAfter := range []string{"insert", "debit"} {
		t.Run("crash after "+crashAfter, func(t *testing.T) {
			r := newBillingRig(t)
			events := eventsFrom(0, 4000)
			r.publish(events)

			crashed := errors.New("killed before the ack")
			var opts billing.Options
			opts.Batch, opts.AckWait = 15, time.Second // messages of 100 events
			hook := func() error { return crashed }
			if crashAfter == "insert" {
				billing.SetHooks(&opts, hook, nil)
			} else {
				billing.SetHooks(&opts, nil, hook)
			}
			if err := r.run(opts).wait(t, 20*time.Second); !errors.Is(err, crashed) {
				t.Fatalf("RunBilling returned %v, want the hook's error", err)
			}
			if got := r.totals("usage_events"); got.Count != 1500 {
				t.Fatalf("first batch: %d rows, want 1500", got.Count)
			}
			if _, pending := r.consumerState(); pending != 15 {
				t.Fatalf("%d messages pending after the crash, want the unacked fetch of 15", pending)
			}

			// Another process takes over once AckWait has passed.
			r.run(billing.Options{Batch: 15, AckWait: time.Second})
			r.waitForTotals(totalsOf(events), 30*time.Second)
			r.checkBalances(events)
			if got := r.totals("usage_events"); got.Count <= uint64(len(events)) {
				t.Errorf("%d rows without FINAL: the crashed batch was not inserted twice, so this proves nothing", got.Count)
			}
		})
	}
}

// Several billing processes share the consumer, with small batches, so
// their batches interleave and debits arrive out of stream order.
func TestBillingProcessesSharingTheConsumerChargeExactly(t *testing.T) {
	r := newBillingRig(t)
	events := eventsFrom(0, 6000)
	for range 3 {
		r.run(billing.Options{Batch: 200, MaxWait: 50 * time.Millisecond})
	}
	for i := 0; i < len(events); i += 1000 {
		r.publish(events[i : i+1000])
	}
	r.waitForTotals(totalsOf(events), 40*time.Second)
	r.checkBalances(events)
}

func TestRunBillingWithoutTheStreamSaysHowToFixIt(t *testing.T) {
	b := startNATS(t)
	err := billing.Run(testContext(t), b.JetStream(), nil, nil, billing.Options{})
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("got %v, want ErrStreamNotFound", err)
	}
}

// BenchmarkBillingThroughput measures events/s from JetStream into
// ClickHouse and balances, the goal being 20,000/s on 2 cores. Events are
// published before the clock starts.
func BenchmarkBillingThroughput(b *testing.B) {
	r := newBillingRig(b)
	n := max(b.N, 50000)
	events := eventsFrom(0, n)
	r.publish(events)
	stream, err := r.js.Stream(testContext(b), meter.UsageStream)
	if err != nil {
		b.Fatal(err)
	}
	messages := stream.CachedInfo().State.Msgs
	b.ResetTimer()
	r.run(billing.Options{Batch: 5000, MaxWait: 100 * time.Millisecond, Logf: func(string, ...any) {}})
	cons, err := r.js.Consumer(testContext(b), meter.UsageStream, billing.ConsumerName)
	for err != nil {
		time.Sleep(time.Millisecond) // until RunBilling has created it
		cons, err = r.js.Consumer(testContext(b), meter.UsageStream, billing.ConsumerName)
	}
	for {
		info, err := cons.Info(testContext(b))
		if err != nil {
			b.Fatal(err)
		}
		if info.AckFloor.Stream == messages && info.NumAckPending == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
	if got := r.totals("usage_events FINAL"); got != totalsOf(events) {
		b.Fatalf("ClickHouse holds %+v, want %+v", got, totalsOf(events))
	}
}

// A fetch that finds nothing allocates little. Fetched by bytes alone,
// nats.go sized its channels for a million messages, about 30 MB a
// fetch, once a second on an idle gateway: a tenth of a core and a heap
// peak the gateway's memory goal pays for.
func TestIdleFetchAllocatesLittle(t *testing.T) {
	ctx := testContext(t)
	js := startNATS(t).JetStream()
	if _, err := meter.EnsureUsageStream(ctx, js, 1, 0); err != nil {
		t.Fatal(err)
	}
	opts := billing.Options{MaxWait: 50 * time.Millisecond}
	if _, err := billing.FetchOnce(ctx, js, opts); err != nil { // warm up
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n, err := billing.FetchOnce(ctx, js, opts)
	runtime.ReadMemStats(&after)
	if err != nil || n != 0 {
		t.Fatalf("fetch on an empty stream: %d messages, %v", n, err)
	}
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 4<<20 {
		t.Fatalf("an idle fetch allocated %d bytes; want well under 4 MiB", allocated)
	}
}
