package meter_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
)

func testContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls fn every `every` until it returns nil, failing the test
// with fn's last error once total has passed.
var waitFor = testutil.CheckFor

// natsServer is an embedded nats-server that a test can stop and start
// again on the same port and store, as a restart of the machine would.
type natsServer struct {
	t       testing.TB
	dataDir string
	listen  string
	b       *broker.Broker
}

func startNATSServer(t testing.TB) *natsServer {
	t.Helper()
	s := &natsServer{t: t, dataDir: t.TempDir(), listen: "127.0.0.1:0"}
	s.start()
	u, err := url.Parse(s.b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	s.listen = net.JoinHostPort("127.0.0.1", u.Port())
	t.Cleanup(s.stop)
	return s
}

func (s *natsServer) start() {
	s.t.Helper()
	b, err := broker.Start(testContext(s.t), config.NATS{EmbeddedListen: s.listen}, s.dataDir, nil)
	if err != nil {
		s.t.Fatalf("starting nats: %v", err)
	}
	s.b = b
}

func (s *natsServer) stop() {
	if s.b != nil {
		s.b.Close()
		s.b = nil
	}
}

func (s *natsServer) url() string { return "nats://" + s.listen }

// connectNATS is a gateway's own connection, which outlives server
// restarts by reconnecting.
func connectNATS(t testing.TB, url string) *broker.Broker {
	t.Helper()
	b, err := broker.Start(testContext(t), config.NATS{URL: url}, t.TempDir(), nil)
	if err != nil {
		t.Fatalf("connecting to %s: %v", url, err)
	}
	t.Cleanup(b.Close)
	return b
}

func usageEvent(i int) *meter.Event {
	return &meter.Event{
		ID:               fmt.Sprintf("evt-%07d", i),
		Time:             time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Millisecond),
		Account:          fmt.Sprintf("acct-%d", i%5),
		KeyID:            "key-1",
		Endpoint:         "/v1/chat/completions",
		Model:            "small",
		Upstream:         "local",
		PromptTokens:     int64(10 + i%1000),
		CompletionTokens: int64(1 + i%97),
		CostNanos:        money.Nanos(1_000_003 + int64(i%7919)*13),
		UsageSource:      meter.SourceUpstream,
		Status:           200,
		Latency:          time.Duration(i%500) * time.Millisecond,
	}
}

// usageStream returns the USAGE stream and its state.
func usageStream(t testing.TB, js jetstream.JetStream) (jetstream.Stream, *jetstream.StreamInfo) {
	t.Helper()
	ctx := testContext(t)
	stream, err := js.Stream(ctx, meter.UsageStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream, info
}

// streamEvents reads every message of the USAGE stream and returns how
// often each event id occurs.
func streamEvents(t testing.TB, js jetstream.JetStream) map[string]int {
	t.Helper()
	ctx := testContext(t)
	stream, info := usageStream(t, js)
	seen := map[string]int{}
	if info.State.Msgs == 0 {
		return seen
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for read := uint64(0); read < info.State.Msgs; {
		batch, err := cons.Fetch(int(min(1000, info.State.Msgs-read)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			lines := strings.Split(string(msg.Data()), "\n")
			for i, line := range lines {
				var ev meter.Event
				if err := json.Unmarshal([]byte(line), &ev); err != nil {
					t.Fatalf("message on %s, line %d: %v", msg.Subject(), i, err)
				}
				// A batch's id is its first event's and its size, so the
				// same batch published again has the same id.
				wantID := fmt.Sprintf("%s+%d", ev.ID, len(lines))
				if i == 0 && (msg.Headers().Get(jetstream.MsgIDHeader) != wantID || !strings.HasPrefix(msg.Subject(), meter.UsageBatchSubject+".")) {
					t.Fatalf("batch of %s went to %s with id header %q, want %q", ev.ID, msg.Subject(), msg.Headers().Get(jetstream.MsgIDHeader), wantID)
				}
				seen[ev.ID]++
			}
			n++
		}
		if n == 0 {
			t.Fatalf("read %d of %d stream messages, then nothing: %v", read, info.State.Msgs, batch.Error())
		}
		read += uint64(n)
	}
	return seen
}

func checkEachEventOnce(t testing.TB, seen map[string]int, n int) {
	t.Helper()
	missing, doubled := 0, 0
	for i := range n {
		switch seen[usageEvent(i).ID] {
		case 0:
			missing++
		case 1:
		default:
			doubled++
		}
	}
	if missing > 0 || doubled > 0 || len(seen) != n {
		t.Fatalf("stream holds %d distinct events of %d: %d missing, %d more than once", len(seen), n, missing, doubled)
	}
}

// syncLog is a logf that may be called from any goroutine until the test
// ends.
func syncLog(t testing.TB) func(string, ...any) {
	var mu sync.Mutex
	done := false
	t.Cleanup(func() { mu.Lock(); done = true; mu.Unlock() })
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			t.Logf(format, args...)
		}
	}
}

func openPublisher(t testing.TB, js jetstream.JetStream, outboxDir string) *meter.Publisher {
	t.Helper()
	ob, err := meter.OpenOutbox(outboxDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	return publisherOn(t, js, ob)
}

// publisherOn starts a publisher on ob, closed when the test ends.
func publisherOn(t testing.TB, js jetstream.JetStream, ob *meter.Outbox) *meter.Publisher {
	t.Helper()
	p := meter.NewPublisher(js, ob, syncLog(t))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	return p
}

// usageJetStream is an embedded NATS server holding the USAGE stream.
func usageJetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	js := startNATSServer(t).b.JetStream()
	if _, err := meter.EnsureUsageStream(testContext(t), js, 1, 0); err != nil {
		t.Fatal(err)
	}
	return js
}

// publishThenLoseAcked publishes events 0..n-1 from a new outbox in dir,
// then removes its acked file: as if the gateway crashed after JetStream
// stored every batch but before the acked file was ever written.
func publishThenLoseAcked(t testing.TB, js jetstream.JetStream, dir string, n int) {
	t.Helper()
	ob, err := meter.OpenOutbox(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := meter.NewPublisher(js, ob, syncLog(t))
	for i := range n {
		p.Record(usageEvent(i))
	}
	if err := p.Close(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "acked")); err != nil {
		t.Fatal(err)
	}
}

// waitDrained waits until p's outbox is empty.
func waitDrained(t testing.TB, p *meter.Publisher) {
	t.Helper()
	waitFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if st := p.Stats(); st.OutboxDepth != 0 {
			return fmt.Errorf("stats %+v", st)
		}
		return nil
	})
}

func TestPublisherLosesAndDoublesNothingAcrossANATSRestart(t *testing.T) {
	srv := startNATSServer(t)
	gw := connectNATS(t, srv.url())
	ctx := testContext(t)
	if _, err := meter.EnsureUsageStream(ctx, gw.JetStream(), 1, 0); err != nil {
		t.Fatal(err)
	}
	p := openPublisher(t, gw.JetStream(), filepath.Join(t.TempDir(), "outbox"))

	const n = 20_000
	for i := range n {
		p.Record(usageEvent(i))
		if i%100 == 0 {
			time.Sleep(time.Millisecond) // a steady load, not one burst
		}
		switch i {
		case n / 3:
			// The server goes away with events in flight, the load goes
			// on, and it comes back on the same port and store.
			srv.stop()
		case 2 * n / 3:
			if st := p.Stats(); st.OutboxDepth < n/3 || st.Connected {
				t.Errorf("NATS down, yet only %d events wait in the outbox, or it says connected: %+v", st.OutboxDepth, st)
			}
			srv.start()
		}
	}
	waitFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if st := p.Stats(); st.OutboxDepth != 0 || st.Published < n {
			return fmt.Errorf("stats %+v", st)
		}
		return nil
	})
	st := p.Stats()
	if st.Dropped != 0 || !st.Connected {
		t.Errorf("stats %+v: want nothing dropped, connected again", st)
	}
	t.Logf("stats after the restart: %+v", st)
	checkEachEventOnce(t, streamEvents(t, gw.JetStream()), n)
}

func TestPublisherClosedWhileNATSIsDownPublishesAtTheNextStart(t *testing.T) {
	srv := startNATSServer(t)
	gw := connectNATS(t, srv.url())
	ctx := testContext(t)
	if _, err := meter.EnsureUsageStream(ctx, gw.JetStream(), 1, 0); err != nil {
		t.Fatal(err)
	}
	outboxDir := filepath.Join(t.TempDir(), "outbox")
	ob, err := meter.OpenOutbox(outboxDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := meter.NewPublisher(gw.JetStream(), ob, syncLog(t))
	for i := range 100 {
		p.Record(usageEvent(i))
	}
	waitFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if st := p.Stats(); st.Published < 100 {
			return fmt.Errorf("published %d", st.Published)
		}
		return nil
	})
	srv.stop()
	for i := 100; i < 1000; i++ {
		p.Record(usageEvent(i))
	}
	closeCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = p.Close(closeCtx)
	cancel()
	if err == nil {
		t.Fatal("Close reported everything published while NATS was down")
	}
	t.Logf("close while NATS is down: %v", err)
	p.Record(usageEvent(5000)) // after Close: dropped and counted
	if st := p.Stats(); st.Dropped != 1 {
		t.Fatalf("Record after Close: dropped %d, want 1", st.Dropped)
	}

	// The gateway starts again, NATS with it.
	srv.start()
	p2 := openPublisher(t, gw.JetStream(), outboxDir)
	waitFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if st := p2.Stats(); st.OutboxDepth != 0 {
			return fmt.Errorf("stats %+v", st)
		}
		return nil
	})
	checkEachEventOnce(t, streamEvents(t, gw.JetStream()), 1000)
}

// A crash between a PubAck and the acked file being written leaves
// published events in the outbox; the next start publishes them again.
func TestPublisherReplayOfPublishedEventsIsDeduplicated(t *testing.T) {
	js := usageJetStream(t)
	outboxDir := t.TempDir()
	publishThenLoseAcked(t, js, outboxDir, 500)
	p := openPublisher(t, js, outboxDir)
	waitFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if st := p.Stats(); st.OutboxDepth != 0 || st.Duplicates != 500 {
			return fmt.Errorf("stats %+v, want all 500 republished and dropped as duplicates", st)
		}
		return nil
	})
	checkEachEventOnce(t, streamEvents(t, js), 500)
}

// The stream is declared by every process at start-up: declaring it again
// changes nothing, and a process started with another
// billing.usage_retention sets it.
func TestEnsureUsageStreamIsIdempotentAndTakesTheRetention(t *testing.T) {
	srv := startNATSServer(t)
	ctx := testContext(t)
	for i, retention := range []time.Duration{0, 0, 3 * time.Hour} {
		st, err := meter.EnsureUsageStream(ctx, srv.b.JetStream(), 1, retention)
		if err != nil {
			t.Fatal(err)
		}
		cfg := st.CachedInfo().Config
		if cfg.Duplicates != meter.UsageDuplicatesWindow || cfg.Retention != jetstream.LimitsPolicy || cfg.Storage != jetstream.FileStorage {
			t.Fatalf("declaration %d: stream config %+v", i, cfg)
		}
		if want := cmp.Or(retention, config.DefaultUsageRetention); cfg.MaxAge != want {
			t.Fatalf("declaration %d with retention %s: MaxAge %s, want %s", i, retention, cfg.MaxAge, want)
		}
	}
}

// Events of any account share batches: an account that would not make a
// valid subject token costs nothing, and an event without id gets one.
func TestPublisherBatchesEventsOfUnusableAccounts(t *testing.T) {
	js := usageJetStream(t)
	p := openPublisher(t, js, t.TempDir())
	accountsUsed := []string{"", "a b", "a.*", "x..y", "ok.sub"}
	for i, account := range accountsUsed {
		ev := usageEvent(i)
		ev.Account = account
		p.Record(ev)
	}
	noID := usageEvent(9)
	noID.ID = ""
	p.Record(noID)
	waitFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if st := p.Stats(); st.Published != 6 {
			return fmt.Errorf("stats %+v", st)
		}
		return nil
	})
	if noID.ID == "" {
		t.Fatal("an event without id was published without one")
	}
	seen := streamEvents(t, js)
	if len(seen) != 6 || seen[noID.ID] != 1 {
		t.Fatalf("stream holds %v", seen)
	}
	if _, info := usageStream(t, js); info.State.Msgs >= 6 {
		t.Fatalf("%d messages for 6 events recorded together: want them batched", info.State.Msgs)
	}
}

// BenchmarkPublisher measures Record through the outbox to PubAcks from
// an embedded server.
func BenchmarkPublisher(b *testing.B) {
	js := usageJetStream(b)
	p := openPublisher(b, js, b.TempDir())
	events := make([]*meter.Event, b.N)
	for i := range events {
		events[i] = usageEvent(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for _, ev := range events {
		p.Record(ev)
	}
	for p.Stats().Published < uint64(b.N) {
		time.Sleep(time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	if st := p.Stats(); st.Dropped > 0 {
		b.Fatalf("dropped %d", st.Dropped)
	}
}

// Damage in the middle of a segment, seen by the publisher's reader (not
// by the open-time recovery, which cuts it off): every event before it is
// published once, including those read into the current batch by an
// earlier read, and only the rest of the segment is lost.
func TestPublisherKeepsTheEventsBeforeDamageInTheOutbox(t *testing.T) {
	js := usageJetStream(t)
	outboxDir := t.TempDir()
	ob, err := meter.OpenOutbox(outboxDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Batch 1 is events 0–999 (full), batch 2 begins at 1000. The reader
	// takes 1024 records a read, so events 1000–1023 wait in the current
	// batch when its second read meets the damage at event 1200.
	const damaged = 1200
	for i := range 1500 {
		if err := ob.Append(usageEvent(i)); err != nil {
			t.Fatal(err)
		}
	}
	segs, err := filepath.Glob(filepath.Join(outboxDir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	seg, at := "", -1
	for _, path := range segs {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if at = strings.Index(string(data), `"`+usageEvent(damaged).ID+`"`); at >= 0 {
			seg = path
			break
		}
	}
	if at < 0 {
		t.Fatalf("event %d not found in the outbox segments %v", damaged, segs)
	}
	f, err := os.OpenFile(seg, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("X"), int64(at+1)); err != nil { // its checksum no longer holds
		t.Fatal(err)
	}
	f.Close()

	publisherOn(t, js, ob)
	var seen map[string]int
	waitFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if seen = streamEvents(t, js); len(seen) < damaged {
			return fmt.Errorf("stream holds %d events, want the %d before the damage", len(seen), damaged)
		}
		return nil
	})
	checkEachEventOnce(t, seen, damaged)
}

// shortDuplicateWindow makes the USAGE stream forget batch ids after a
// moment, as a gateway down for longer than UsageDuplicatesWindow would.
func shortDuplicateWindow(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	_, info := usageStream(t, js)
	cfg := info.Config
	cfg.Duplicates = 100 * time.Millisecond
	if _, err := js.UpdateStream(testContext(t), cfg); err != nil {
		t.Fatal(err)
	}
}

// A crash between PubAcks and the acked file, and a restart after the
// duplicate window has passed: the publisher finds its outbox's last
// stored batch and skips what JetStream has, so nothing is stored (and
// debited) twice.
func TestPublisherRestartedAfterTheDuplicateWindowPublishesNothingTwice(t *testing.T) {
	js := usageJetStream(t)
	shortDuplicateWindow(t, js)
	outboxDir := t.TempDir()
	publishThenLoseAcked(t, js, outboxDir, 1500)
	time.Sleep(300 * time.Millisecond) // JetStream forgets the batch ids
	p := openPublisher(t, js, outboxDir)
	waitDrained(t, p)
	if st := p.Stats(); st.Duplicates != 1500 || st.Failures != 0 {
		t.Errorf("stats %+v: want the 1500 events counted as JetStream's already", st)
	}
	checkEachEventOnce(t, streamEvents(t, js), 1500)
}

// The look-up is trusted only when the outbox holds the very event the
// stored batch ended with: an outbox that shares the id (a copied data
// directory) but holds other events publishes them all.
func TestPublisherResumesOnlyOnItsOwnEvents(t *testing.T) {
	js := usageJetStream(t)
	first := t.TempDir()
	publishThenLoseAcked(t, js, first, 500)
	id, err := os.ReadFile(filepath.Join(first, "id"))
	if err != nil {
		t.Fatal(err)
	}
	second := t.TempDir()
	if err := os.WriteFile(filepath.Join(second, "id"), id, 0o600); err != nil {
		t.Fatal(err)
	}
	ob, err := meter.OpenOutbox(second, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 500; i < 1000; i++ {
		if err := ob.Append(usageEvent(i)); err != nil {
			t.Fatal(err)
		}
	}
	// Closed and opened again, so that its records are an earlier
	// process's, which the look-up may skip.
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	if ob, err = meter.OpenOutbox(second, 0); err != nil {
		t.Fatal(err)
	}
	waitDrained(t, publisherOn(t, js, ob))
	checkEachEventOnce(t, streamEvents(t, js), 1000)
}

// A batch JetStream lost (a leader change in a cluster) breaks the chain:
// the look-up skips only up to the gap, and everything from the lost
// batch on is published again, so no event goes unbilled.
// storedWithoutAcked publishes 2500 events from a new outbox into a
// JetStream whose duplicate window is short, then loses the outbox's
// acked file (publishThenLoseAcked); it returns the JetStream, its USAGE
// stream and the outbox's dir.
func storedWithoutAcked(t *testing.T) (jetstream.JetStream, jetstream.Stream, string) {
	t.Helper()
	js := usageJetStream(t)
	shortDuplicateWindow(t, js)
	outboxDir := t.TempDir()
	publishThenLoseAcked(t, js, outboxDir, 2500)
	stream, err := js.Stream(testContext(t), meter.UsageStream)
	if err != nil {
		t.Fatal(err)
	}
	return js, stream, outboxDir
}

func TestPublisherResumeStopsAtABatchJetStreamLost(t *testing.T) {
	ctx := testContext(t)
	// Batches close at 1000 events or 10 ms, so how many there are and
	// where they split depends on timing: the third one's header says
	// where the records published twice begin.
	js, stream, outboxDir := storedWithoutAcked(t)
	third, err := stream.GetMsg(ctx, 3)
	if err != nil {
		t.Fatalf("fewer than 3 batches of 2500 events: %v", err)
	}
	var doubledFrom uint64 // outbox sequence; event i is record i+1
	if _, err := fmt.Sscan(third.Header.Get(meter.OutboxRangeHeader), &doubledFrom); err != nil {
		t.Fatalf("third batch's range header %q: %v", third.Header.Get(meter.OutboxRangeHeader), err)
	}
	if err := stream.DeleteMsg(ctx, 2); err != nil { // a batch between two stored ones
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	waitDrained(t, openPublisher(t, js, outboxDir))
	seen := streamEvents(t, js)
	for i := range 2500 {
		want := 1
		if uint64(i+1) >= doubledFrom {
			want = 2 // published again after the gap, past the duplicate window
		}
		if n := seen[usageEvent(i).ID]; n != want {
			t.Fatalf("event %d stored %d times, want %d", i, n, want)
		}
	}
}

// A record damaged on disk, cut at start, breaks only the tail of the
// chain of stored batches: the batches before the one holding it are
// skipped, not published again. Publishing again from the first
// unacknowledged record debited every event before the damage twice.
func TestPublisherResumeSkipsTheStoredBatchesBeforeADamagedRecord(t *testing.T) {
	ctx := testContext(t)
	js, stream, outboxDir := storedWithoutAcked(t)
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last, err := stream.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		t.Fatal(err)
	}
	var lastFrom uint64 // the last batch's first record
	if _, err := fmt.Sscan(last.Header.Get(meter.OutboxRangeHeader), &lastFrom); err != nil || lastFrom < 2 {
		t.Fatalf("last batch's range header %q: %v", last.Header.Get(meter.OutboxRangeHeader), err)
	}
	if err := meter.DamageRecord(outboxDir, 2400); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past the duplicate window
	waitDrained(t, openPublisher(t, js, outboxDir))
	seen := streamEvents(t, js)
	for i := range 2500 {
		record := uint64(i + 1)
		want := 1
		if record >= lastFrom && record < 2400 {
			want = 2 // the last batch, whose end the outbox lost, goes out again up to the damage
		}
		if n := seen[usageEvent(i).ID]; n != want {
			t.Fatalf("event %d (record %d; the last batch starts at %d) stored %d times, want %d", i, record, lastFrom, n, want)
		}
	}
}

// A segment that cannot be opened for a while (the process out of file
// descriptors under a flood of connections) is read again later, not
// skipped: its events were logged LOST and left unpublished while the
// gateway ran on.
func TestPublisherReadsAgainASegmentItCouldNotOpen(t *testing.T) {
	js := usageJetStream(t)
	outboxDir := t.TempDir()
	ob, err := meter.OpenOutbox(outboxDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	const events = 1500
	for i := range events {
		if err := ob.Append(usageEvent(i)); err != nil {
			t.Fatal(err)
		}
	}
	segs, err := filepath.Glob(filepath.Join(outboxDir, "*.seg"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments %v: %v", segs, err)
	}
	for _, seg := range segs {
		if err := os.Rename(seg, seg+".away"); err != nil {
			t.Fatal(err)
		}
	}
	publisherOn(t, js, ob)
	time.Sleep(300 * time.Millisecond) // the reader fails to open them, more than once
	for _, seg := range segs {
		if err := os.Rename(seg+".away", seg); err != nil {
			t.Fatal(err)
		}
	}
	var seen map[string]int
	waitFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if seen = streamEvents(t, js); len(seen) < events {
			return fmt.Errorf("stream holds %d events, want all %d", len(seen), events)
		}
		return nil
	})
	checkEachEventOnce(t, seen, events)
}
