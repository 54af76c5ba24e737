package accounts

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate/tollgate/money"
)

// What this gateway charged counts against the balance at once, and only
// until the debits show it: never twice, and not hidden by other debits.
func TestBalanceCountsChargesNotYetDebited(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	balance := func(want money.Nanos, when string) {
		t.Helper()
		if got, ok := s.Balance("acme"); !ok || got != want {
			t.Fatalf("%s: balance %s (%v), want %s", when, got, ok, want)
		}
	}
	const cent = money.NanosPerUSD / 100
	balance(100*cent, "before any call")
	s.NoteCharge("acme", 30*cent)
	s.NoteCharge("acme", 20*cent)
	balance(50*cent, "two calls charged, none debited")

	if _, _, err := s.ApplyUsage(ctx, "acme", Usage{Events: []SeqCost{{Seq: 1, Cost: 30 * cent}}}); err != nil {
		t.Fatal(err)
	}
	balance(50*cent, "the first call debited")
	if _, _, err := s.ApplyUsage(ctx, "acme", Usage{Events: []SeqCost{{Seq: 2, Cost: 20 * cent}}}); err != nil {
		t.Fatal(err)
	}
	balance(50*cent, "both debited")

	// Another gateway's calls are debited too; this one's next call still
	// counts in full.
	if _, _, err := s.ApplyUsage(ctx, "acme", Usage{Events: []SeqCost{{Seq: 3, Cost: 40 * cent}}}); err != nil {
		t.Fatal(err)
	}
	balance(10*cent, "another gateway's call debited")
	s.NoteCharge("acme", 25*cent)
	balance(-15*cent, "a call charged after it")

	s.NoteCharge("nobody", 25*cent) // an account that does not exist: nothing kept
	if _, ok := s.unbilled.Load("nobody"); ok {
		t.Error("a charge kept for an account that does not exist")
	}
}

// Behind two gateways each counted only its own charges: an account of
// 0.03 USD made 50 calls of 0.0012 and went to -0.03, each gateway
// spending the whole balance on its own. The charges of one count on the
// other within milliseconds, and a debit lowers them once whichever
// gateway charged it.
func TestPeersChargesCountUntilDebited(t *testing.T) {
	first, b, dir := gateway(t)
	second := secondGateway(t, b, dir)
	ctx := testContext(t)
	if _, err := first.CreateAccount(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	if err := second.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	const cent = money.NanosPerUSD / 100
	balances := func(want money.Nanos, when string) {
		t.Helper()
		checkFor(t, 3*time.Second, 5*time.Millisecond, func() error {
			for i, s := range []*Service{first, second} {
				if got, _ := s.Balance("acme"); got != want {
					return fmt.Errorf("%s: gateway %d: balance %s, want %s", when, i+1, got, want)
				}
			}
			return nil
		})
	}
	debit := func(seq uint64, cost money.Nanos) {
		t.Helper()
		if _, _, err := first.ApplyUsage(ctx, "acme", Usage{Events: []SeqCost{{Seq: seq, Cost: cost}}}); err != nil {
			t.Fatal(err)
		}
		if err := second.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
	}

	first.NoteCharge("acme", 30*cent)
	balances(70*cent, "the first gateway charged")
	second.NoteCharge("acme", 20*cent)
	balances(50*cent, "both charged")

	// The first gateway's charge is debited first: the second must not
	// take it for its own as well.
	debit(1, 30*cent)
	balances(50*cent, "the first gateway's charge debited")
	debit(2, 20*cent)
	balances(50*cent, "both debited")

	// Counting starts afresh once all is debited: a debit nobody here
	// charged (an older bill) hides no charge after it.
	debit(3, 10*cent)
	balances(40*cent, "an older bill debited")
	second.NoteCharge("acme", 5*cent)
	balances(35*cent, "the second gateway charged after it")

	// Its own messages come back to each process: they count nothing.
	message := func(process, account string, total, pending money.Nanos) *nats.Msg {
		data, err := json.Marshal(unbilledMessage{Process: process, Accounts: map[string]unbilledTotal{account: {Total: int64(total), Pending: int64(pending)}}})
		if err != nil {
			t.Fatal(err)
		}
		return &nats.Msg{Data: data}
	}
	first.receiveUnbilled(message(first.share.process, "acme", money.NanosPerUSD, money.NanosPerUSD))
	balances(35*cent, "a process's own message taken")

	// A process silent for peerSilence is taken for gone, but its charge,
	// not debited, still counts; the second gateway, alive, counts as
	// before from its next heartbeat.
	first.forgetSilentPeers(time.Now().Add(peerSilence + time.Second))
	if got, _ := first.Balance("acme"); got != 35*cent {
		t.Errorf("the second gateway taken for gone: balance %s on the first, want 35 cents", got)
	}
	balances(35*cent, "the second gateway's heartbeat")

	// A total heard only after its charge was debited (the message before
	// it lost) is not counted for good: the process says none of its
	// charges wait.
	if _, err := first.CreateAccount(ctx, "late", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	first.receiveUnbilled(message("another", "late", 0, 0))
	if _, _, err := first.ApplyUsage(ctx, "late", Usage{Events: []SeqCost{{Seq: 1, Cost: 4 * cent}}}); err != nil {
		t.Fatal(err)
	}
	first.receiveUnbilled(message("another", "late", 4*cent, 0))
	if got, _ := first.Balance("late"); got != 96*cent {
		t.Errorf("a charge heard of after its debit: balance %s, want 96 cents", got)
	}
}

// A gateway alone on its NATS sends its charges in its heartbeat only: it
// sent one message a millisecond under load and decoded each again when it
// came back, 4 % of its CPU for nobody. A process that reads balances
// announces itself, is answered with the totals at once, and from then
// on gets each charge as it comes.
func TestChargesGoOutAsTheyComeOnlyToAListener(t *testing.T) {
	s, b, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msgs := make(chan unbilledMessage, 1024)
	if _, err := nc.Subscribe(UnbilledSubject, func(m *nats.Msg) {
		var msg unbilledMessage
		if json.Unmarshal(m.Data, &msg) == nil && msg.Process == s.share.process {
			msgs <- msg
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	s.Balance("acme") // it admits calls: it says so at once
	select {
	case msg := <-msgs:
		if !msg.Listening {
			t.Fatalf("its first message %+v does not say it listens", msg)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a gateway that reads balances did not announce itself")
	}
	const cent = money.NanosPerUSD / 100
	for range 20 {
		s.NoteCharge("acme", cent)
		time.Sleep(5 * time.Millisecond)
	}
	// 100 ms of charges with nobody listening: at most a heartbeat.
	if n := len(msgs); n > 1 {
		t.Fatalf("%d messages of charges with nobody listening, want the heartbeat's at most", n)
	}
	for len(msgs) > 0 {
		<-msgs
	}

	// A listener appears: it gets the totals at once, then each charge.
	peer, _ := json.Marshal(unbilledMessage{Process: "peer", Listening: true})
	if err := nc.Publish(UnbilledSubject, peer); err != nil {
		t.Fatal(err)
	}
	want := func(total money.Nanos, when string) {
		t.Helper()
		deadline := time.After(500 * time.Millisecond)
		for {
			select {
			case msg := <-msgs:
				if msg.Accounts["acme"].Total == int64(total) {
					return
				}
			case <-deadline:
				t.Fatalf("%s: no message with acme's total %s within 500 ms", when, total)
			}
		}
	}
	want(20*cent, "a listener appeared")
	s.NoteCharge("acme", cent)
	want(21*cent, "charged with a listener")
}

// gatewayOn opens a Service on its own connection to the NATS at url,
// on dataDir (which holds the first gateway's signing key); stop closes
// it, at most once, and the test's end does if stop was not called.
func gatewayOn(t *testing.T, url, dataDir string) (s *Service, stop func()) {
	t.Helper()
	b := connectBroker(t, url)
	s = openService(t, b, dataDir)
	var once sync.Once
	stop = func() { once.Do(func() { s.Close(); b.Close() }) }
	t.Cleanup(stop)
	return s, stop
}

// A gateway that stopped while the debits stalled (ClickHouse down, or the
// billing consumer stopped) left its charges waiting in JetStream, and the
// others forgot them after peerSilence: refused on three gateways after
// its credit of 10 calls, an account made 11 more once one gateway was
// restarted. They count until the debits show them, once.
func TestGonePeersChargesCountUntilDebited(t *testing.T) {
	first, b, dir := gateway(t)
	ctx := testContext(t)
	const cent = money.NanosPerUSD / 100
	if _, err := first.CreateAccount(ctx, "acme", 10*cent); err != nil {
		t.Fatal(err)
	}
	second, stopSecond := gatewayOn(t, b.ClientURL(), copySigningKey(t, dir))
	if err := second.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	balance := func(want money.Nanos, when string) {
		t.Helper()
		checkFor(t, 3*time.Second, 5*time.Millisecond, func() error {
			if got, _ := first.Balance("acme"); got != want {
				return fmt.Errorf("%s: balance %s on the first gateway, want %s", when, got, want)
			}
			return nil
		})
	}
	second.NoteCharge("acme", 10*cent)
	balance(0, "the second gateway spent the credit")

	// Nothing debits: the second gateway stops, and stays silent past
	// peerSilence.
	stopSecond()
	first.forgetSilentPeers(time.Now().Add(peerSilence + time.Second))
	if got, _ := first.Balance("acme"); got != 0 {
		t.Fatalf("the second gateway gone for peerSilence, its charges not debited: balance %s on the first, want 0", got)
	}
	first.forgetSilentPeers(time.Now().Add(2*peerSilence + time.Second))
	if got, _ := first.Balance("acme"); got != 0 {
		t.Fatalf("a round later: balance %s on the first, want 0", got)
	}

	// Its charges are debited: they count once, then no more.
	if _, _, err := first.ApplyUsage(ctx, "acme", Usage{Events: []SeqCost{{Seq: 1, Cost: 10 * cent}}}); err != nil {
		t.Fatal(err)
	}
	balance(0, "its charges debited")
	first.forgetSilentPeers(time.Now().Add(3*peerSilence + time.Second))
	balance(0, "its charges debited, a round later")
	if _, err := first.Credit(ctx, "acme", 10*cent); err != nil {
		t.Fatal(err)
	}
	balance(10*cent, "credited again")
	if v, ok := first.unbilled.Load("acme"); ok && len(v.(*unbilled).peers) > 0 {
		t.Errorf("the gone gateway's charges are kept after their debit: %d peers", len(v.(*unbilled).peers))
	}

	// A process cut off from NATS, not dead, comes back under its id: it
	// counts as before.
	message := func(process string, total, pending money.Nanos) *nats.Msg {
		data, err := json.Marshal(unbilledMessage{Process: process, Accounts: map[string]unbilledTotal{"acme": {Total: int64(total), Pending: int64(pending)}}})
		if err != nil {
			t.Fatal(err)
		}
		return &nats.Msg{Data: data}
	}
	first.receiveUnbilled(message("cut-off", 3*cent, 3*cent))
	balance(7*cent, "a third process charged")
	first.forgetSilentPeers(time.Now().Add(4*peerSilence + time.Second))
	balance(7*cent, "the third process gone")
	first.receiveUnbilled(message("cut-off", 5*cent, 5*cent))
	balance(5*cent, "the third process back, and charged")
	if _, _, err := first.ApplyUsage(ctx, "acme", Usage{Events: []SeqCost{{Seq: 2, Cost: 5 * cent}}}); err != nil {
		t.Fatal(err)
	}
	first.receiveUnbilled(message("cut-off", 5*cent, 0))
	balance(5*cent, "the third process's charges debited")
}

// A gateway restarted while the debits stalled started counting from
// nothing: every account it had charged could spend its whole balance
// again, on it alone. It counts them again from its data_dir, and the
// others, which counted them under its old process, count them once.
func TestRestartedGatewayKeepsItsCharges(t *testing.T) {
	first, b, dir := gateway(t)
	ctx := testContext(t)
	const cent = money.NanosPerUSD / 100
	if _, err := first.CreateAccount(ctx, "acme", 10*cent); err != nil {
		t.Fatal(err)
	}
	if _, err := first.CreateAccount(ctx, "other", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	first.NoteCharge("acme", 10*cent)
	secondDir := copySigningKey(t, dir)
	second, stopSecond := gatewayOn(t, b.ClientURL(), secondDir)
	if err := second.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	second.NoteCharge("other", 30*cent)
	balances := func(s *Service, account string, want money.Nanos, when string) {
		t.Helper()
		checkFor(t, 3*time.Second, 5*time.Millisecond, func() error {
			if got, _ := s.Balance(account); got != want {
				return fmt.Errorf("%s: %s's balance %s, want %s", when, account, got, want)
			}
			return nil
		})
	}
	balances(first, "other", 70*cent, "the second gateway charged")

	// Nothing debits; the first gateway, which charged acme's whole
	// credit, is restarted on its data_dir.
	first.Close()
	first = openService(t, b, dir)
	t.Cleanup(first.Close)
	if got, _ := first.Balance("acme"); got != 0 {
		t.Fatalf("restarted, its charges not debited: acme's balance %s, want 0", got)
	}
	balances(first, "other", 70*cent, "the first gateway restarted")

	// So is the second: the first counts its charges once, not under its
	// old process and its new one, and after peerSilence too.
	old := second.share.process
	stopSecond()
	second, _ = gatewayOn(t, b.ClientURL(), secondDir)
	if got, _ := second.Balance("other"); got != 70*cent {
		t.Fatalf("the second gateway restarted: other's balance %s on it, want 70 cents", got)
	}
	checkFor(t, 3*time.Second, 5*time.Millisecond, func() error {
		first.share.mu.Lock()
		_, heard := first.share.seen[second.share.process]
		first.share.mu.Unlock()
		if !heard {
			return fmt.Errorf("the first gateway has not heard the restarted second (it was %s)", old)
		}
		return nil
	})
	balances(first, "other", 70*cent, "the second gateway restarted")
	first.forgetSilentPeers(time.Now().Add(peerSilence + time.Second))
	balances(first, "other", 70*cent, "both second gateways silent")

	// Debited, the charges count no more.
	for i, account := range []string{"acme", "other"} {
		cost := []money.Nanos{10 * cent, 30 * cent}[i]
		if _, _, err := first.ApplyUsage(ctx, account, Usage{Events: []SeqCost{{Seq: 1, Cost: cost}}}); err != nil {
			t.Fatal(err)
		}
	}
	balances(first, "acme", 0, "debited")
	balances(second, "other", 70*cent, "debited")
}

// A gateway learnt the others' charges only once its first balance read
// announced it and they answered, or from their heartbeats: restarted
// while the debits stalled, it admitted the calls of its first half
// second on its own charges alone, one more call per max_concurrent slot
// at every restart. Open returns once it heard them; alone on its NATS
// it waits for nobody.
func TestStartingGatewayCountsOthersChargesBeforeItServes(t *testing.T) {
	dir := t.TempDir()
	b := startBroker(t, dir)
	t.Cleanup(b.Close)
	started := time.Now()
	first := openService(t, b, dir)
	t.Cleanup(first.Close)
	if took := time.Since(started); took > helloWait/2 {
		t.Errorf("alone on its NATS, Open took %s: it waited for answers (helloWait is %s)", took, helloWait)
	}
	ctx := testContext(t)
	const cent = money.NanosPerUSD / 100
	if _, err := first.CreateAccount(ctx, "acme", 10*cent); err != nil {
		t.Fatal(err)
	}
	first.Balance("acme") // it admits calls
	first.NoteCharge("acme", 10*cent)

	second, _ := gatewayOn(t, b.ClientURL(), copySigningKey(t, dir))
	if got, _ := second.Balance("acme"); got != 0 {
		t.Fatalf("read as Open returned: acme's balance %s on the gateway started after the first charged it all, want 0", got)
	}
}

// A gateway killed (SIGKILL, a crash) leaves a file without the charges
// of its last second. Restarted, it said it replaces the process that
// wrote it, and the others dropped that process's charges for the new
// one's, fewer: the account could spend the charges the file lacked
// again (4 calls more). The others still count them until debited, and
// the restarted gateway too, told of them at its start (it counted them
// nowhere: with all calls on it, 11 more on a credit of 10).
func TestKilledGatewayRestartedLowersNoCount(t *testing.T) {
	first, b, dir := gateway(t)
	ctx := testContext(t)
	const cent = money.NanosPerUSD / 100
	if _, err := first.CreateAccount(ctx, "acme", 10*cent); err != nil {
		t.Fatal(err)
	}
	secondDir := copySigningKey(t, dir)
	second, stopSecond := gatewayOn(t, b.ClientURL(), secondDir)
	if err := second.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	balance := func(want money.Nanos, when string) {
		t.Helper()
		checkFor(t, 3*time.Second, 5*time.Millisecond, func() error {
			if got, _ := first.Balance("acme"); got != want {
				return fmt.Errorf("%s: balance %s on the first gateway, want %s", when, got, want)
			}
			return nil
		})
	}
	second.NoteCharge("acme", 4*cent)
	if err := second.keepUnbilled(true); err != nil {
		t.Fatal(err)
	}
	lastWritten, err := os.ReadFile(filepath.Join(secondDir, UnbilledFile))
	if err != nil {
		t.Fatal(err)
	}
	second.NoteCharge("acme", 3*cent) // its last second: killed before the file has it
	balance(3*cent, "the second gateway charged 7 cents")

	// Nothing debits; the second gateway is killed (its file as written
	// before its last charge) and restarted on its data_dir.
	stopSecond()
	if err := os.WriteFile(filepath.Join(secondDir, UnbilledFile), lastWritten, 0o600); err != nil {
		t.Fatal(err)
	}
	second, _ = gatewayOn(t, b.ClientURL(), secondDir)
	checkFor(t, 3*time.Second, 5*time.Millisecond, func() error {
		first.share.mu.Lock()
		_, heard := first.share.seen[second.share.process]
		first.share.mu.Unlock()
		if !heard {
			return fmt.Errorf("the first gateway has not heard the restarted second")
		}
		return nil
	})
	if got, _ := first.Balance("acme"); got != 3*cent {
		t.Fatalf("the killed gateway restarted: balance %s on the first, want 3 cents (its 7 cents not debited)", got)
	}
	if got, _ := second.Balance("acme"); got != 3*cent {
		t.Fatalf("the killed gateway restarted: balance %s on it, want 3 cents (the first counted the 3 cents its file lacks)", got)
	}
	time.Sleep(heartbeatEvery + 200*time.Millisecond) // its heartbeats say it has 4 cents pending
	first.forgetSilentPeers(time.Now().Add(peerSilence + time.Second))
	second.forgetSilentPeers(time.Now().Add(peerSilence + time.Second))
	for i, s := range []*Service{first, second} {
		if got, _ := s.Balance("acme"); got != 3*cent {
			t.Fatalf("a heartbeat later, and a round of forgetting: balance %s on gateway %d, want 3 cents", got, i+1)
		}
	}

	// Debited, the charges count once, then no more.
	if _, _, err := first.ApplyUsage(ctx, "acme", Usage{Events: []SeqCost{{Seq: 1, Cost: 7 * cent}}}); err != nil {
		t.Fatal(err)
	}
	balance(3*cent, "debited")
	first.forgetSilentPeers(time.Now().Add(2*peerSilence + time.Second))
	if _, err := first.Credit(ctx, "acme", 7*cent); err != nil {
		t.Fatal(err)
	}
	balance(10*cent, "debited, then credited again")
}

// An unbilled.json the gateway cannot read stops its start, naming the
// file once (it said `reading …/unbilled.json: read …/unbilled.json: is a
// directory`), and one it cannot decode too.
func TestUnreadableUnbilledFileStopsTheStart(t *testing.T) {
	for _, c := range []struct {
		name  string
		make  func(path string) error
		cause string
	}{
		{"a directory", func(path string) error { return os.Mkdir(path, 0o700) }, "is a directory"},
		{"not JSON", func(path string) error { return os.WriteFile(path, []byte("{"), 0o600) }, "unexpected end of JSON input"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dataDir := t.TempDir()
			path := filepath.Join(dataDir, UnbilledFile)
			if err := c.make(path); err != nil {
				t.Fatal(err)
			}
			var s Service
			s.share.init()
			err := s.restoreUnbilled(dataDir)
			if err == nil {
				t.Fatal("restored from an unreadable file")
			}
			want := "reading " + path + ": " + c.cause + " ("
			if got := err.Error(); !strings.HasPrefix(got, want) || strings.Count(got, path) != 1 {
				t.Fatalf("error %q, want it to begin %q and name the file once", got, want)
			}
		})
	}
}

// A gateway restarted while another stayed down counted the live ones'
// charges (their answers) and its own (its file), not the one down's,
// which only the others held, gone: with ClickHouse down, three gateways
// refusing an account, the restarted one admitted exactly the stopped
// one's share at once, and a rolling restart of all would have forgotten
// it entirely. Its file keeps every process's charges it counts, and the
// others tell a gateway starting the gone ones' too.
func TestRestartedGatewayCountsAStoppedOnesCharges(t *testing.T) {
	first, b, dir := gateway(t)
	ctx := testContext(t)
	const cent = money.NanosPerUSD / 100
	if _, err := first.CreateAccount(ctx, "acme", 10*cent); err != nil {
		t.Fatal(err)
	}
	secondDir := copySigningKey(t, dir)
	second, stopSecond := gatewayOn(t, b.ClientURL(), secondDir)
	third, stopThird := gatewayOn(t, b.ClientURL(), copySigningKey(t, dir))
	for _, s := range []*Service{second, third} {
		if err := s.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
	}
	balance := func(s *Service, want money.Nanos, when string) {
		t.Helper()
		checkFor(t, 3*time.Second, 5*time.Millisecond, func() error {
			if got, _ := s.Balance("acme"); got != want {
				return fmt.Errorf("%s: balance %s, want %s", when, got, want)
			}
			return nil
		})
	}
	first.NoteCharge("acme", 2*cent)
	second.NoteCharge("acme", 3*cent)
	third.NoteCharge("acme", 4*cent)
	for _, s := range []*Service{first, second, third} {
		balance(s, cent, "each gateway charged")
	}

	// Nothing debits; the third gateway stops and stays down, the second
	// is restarted on its data_dir.
	stopThird()
	stopSecond()
	second, _ = gatewayOn(t, b.ClientURL(), secondDir)
	if got, _ := second.Balance("acme"); got != cent {
		t.Fatalf("restarted while the third gateway is down: balance %s on it, want 1 cent (the third's 4 cents not debited)", got)
	}
	heard(t, first, second)

	// The first takes the third for gone; a gateway started on a new
	// data_dir (or one whose file was lost) learns its charges from the
	// others, and the restarted second's once.
	first.forgetSilentPeers(time.Now().Add(peerSilence + time.Second))
	fourth, _ := gatewayOn(t, b.ClientURL(), copySigningKey(t, dir))
	if got, _ := fourth.Balance("acme"); got != cent {
		t.Fatalf("a gateway started with no file: balance %s on it, want 1 cent", got)
	}
	for _, s := range []*Service{first, second, fourth} {
		balance(s, cent, "a gateway started with no file")
	}
}

// heard waits until s heard from other, under other's current process.
func heard(t *testing.T, s, other *Service) {
	t.Helper()
	checkFor(t, 3*time.Second, 5*time.Millisecond, func() error {
		s.share.mu.Lock()
		_, heard := s.share.seen[other.share.process]
		s.share.mu.Unlock()
		if !heard {
			return fmt.Errorf("%s has not heard %s", s.share.process, other.share.process)
		}
		return nil
	})
}

// A gateway running the embedded NATS takes it down when it restarts:
// starting, it asked the others for their charges and nobody answered,
// and with ClickHouse down it admitted their whole share at once (7 calls
// of a credit of 10, every time). Its file holds their charges, counted
// until they speak again, and once only when one comes back restarted.
func TestGatewayRestartedWithNobodyAnsweringCountsTheOthers(t *testing.T) {
	first, b, dir := gateway(t)
	ctx := testContext(t)
	const cent = money.NanosPerUSD / 100
	if _, err := first.CreateAccount(ctx, "acme", 10*cent); err != nil {
		t.Fatal(err)
	}
	secondDir := copySigningKey(t, dir)
	second, stopSecond := gatewayOn(t, b.ClientURL(), secondDir)
	third, stopThird := gatewayOn(t, b.ClientURL(), copySigningKey(t, dir))
	for _, s := range []*Service{second, third} {
		if err := s.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
	}
	balance := func(s *Service, want money.Nanos, when string) {
		t.Helper()
		checkFor(t, 3*time.Second, 5*time.Millisecond, func() error {
			if got, _ := s.Balance("acme"); got != want {
				return fmt.Errorf("%s: balance %s, want %s", when, got, want)
			}
			return nil
		})
	}
	first.NoteCharge("acme", 2*cent)
	second.NoteCharge("acme", 3*cent)
	third.NoteCharge("acme", 4*cent)
	for _, s := range []*Service{first, second, third} {
		balance(s, cent, "each gateway charged")
	}

	// Nothing debits; the first gateway restarts while no other answers.
	first.Close()
	stopSecond()
	stopThird()
	first = openService(t, b, dir)
	t.Cleanup(first.Close)
	if got, _ := first.Balance("acme"); got != cent {
		t.Fatalf("restarted with nobody answering: balance %s, want 1 cent (the others' 7 cents not debited)", got)
	}

	// The second comes back, restarted on its data_dir: its charges count
	// once, on both.
	second, _ = gatewayOn(t, b.ClientURL(), secondDir)
	heard(t, first, second)
	if got, _ := first.Balance("acme"); got != cent {
		t.Fatalf("the second gateway back: balance %s on the first, want 1 cent", got)
	}
	balance(second, cent, "the second gateway back")
	time.Sleep(heartbeatEvery + 200*time.Millisecond) // a heartbeat each
	first.forgetSilentPeers(time.Now().Add(peerSilence + time.Second))
	second.forgetSilentPeers(time.Now().Add(peerSilence + time.Second))
	for _, s := range []*Service{first, second} {
		balance(s, cent, "a heartbeat later, and a round of forgetting")
	}

	// Debited, they count no more.
	if _, _, err := first.ApplyUsage(ctx, "acme", Usage{Events: []SeqCost{{Seq: 1, Cost: 9 * cent}}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Service{first, second} {
		balance(s, cent, "debited")
	}
	if _, err := first.Credit(ctx, "acme", 9*cent); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Service{first, second} {
		balance(s, 10*cent, "debited, then credited again")
	}
}

// A gateway killed (SIGKILL) lost the charges it had not written to
// unbilled.json, rewritten once a second: restarted, it admitted them
// again (11 calls more on a credit of 10 when all went through it), and
// more at each kill. The file is rewritten within about 100 ms of a
// charge.
func TestKilledGatewayKeepsItsLastCharges(t *testing.T) {
	s, b, dir := gateway(t)
	ctx := testContext(t)
	const cent = money.NanosPerUSD / 100
	if _, err := s.CreateAccount(ctx, "acme", 10*cent); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, UnbilledFile)
	s.NoteCharge("acme", cent)
	checkFor(t, 3*time.Second, time.Millisecond, func() error {
		if data, _ := os.ReadFile(path); !strings.Contains(string(data), "acme") {
			return fmt.Errorf("%s does not hold the first charge", path)
		}
		return nil
	})
	s.NoteCharge("acme", 5*cent) // just after a write
	time.Sleep(200 * time.Millisecond)
	kept, err := os.ReadFile(path) // the file as a SIGKILL now would leave it
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.WriteFile(path, kept, 0o600); err != nil {
		t.Fatal(err)
	}
	s = openService(t, b, dir)
	t.Cleanup(s.Close)
	if got, _ := s.Balance("acme"); got != 4*cent {
		t.Fatalf("killed 200 ms after charging 6 cents, and restarted: balance %s, want 4 cents", got)
	}
}

// A gateway restarted twice while another was down: the one down, back,
// counted from its file the charges of the first process, which it
// never heard the second say it restored, beside the third's, which hold
// them too: twice, and for good (2 cents below the truth on a credit of
// 10, after the debits too), until the processes after kept the entry
// of the one replaced, and relayed it.
func TestGatewayRestartedTwiceWhileAnotherWasDownCountsOnce(t *testing.T) {
	first, b, dir := gateway(t)
	ctx := testContext(t)
	const cent = money.NanosPerUSD / 100
	if _, err := first.CreateAccount(ctx, "acme", 10*cent); err != nil {
		t.Fatal(err)
	}
	secondDir, thirdDir := copySigningKey(t, dir), copySigningKey(t, dir)
	second, stopSecond := gatewayOn(t, b.ClientURL(), secondDir)
	third, stopThird := gatewayOn(t, b.ClientURL(), thirdDir)
	for _, s := range []*Service{second, third} {
		if err := s.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
	}
	balances := func(want money.Nanos, when string) {
		t.Helper()
		checkFor(t, 3*time.Second, 5*time.Millisecond, func() error {
			for i, s := range []*Service{first, second, third} {
				if got, _ := s.Balance("acme"); got != want {
					return fmt.Errorf("%s: gateway %d: balance %s, want %s", when, i+1, got, want)
				}
			}
			return nil
		})
	}
	first.NoteCharge("acme", 2*cent)
	second.NoteCharge("acme", 3*cent)
	third.NoteCharge("acme", 4*cent)
	balances(cent, "each gateway charged")

	// Nothing debits; the third is down while the second restarts twice.
	stopThird()
	for range 2 {
		stopSecond()
		second, stopSecond = gatewayOn(t, b.ClientURL(), secondDir)
		heard(t, first, second)
	}
	third, _ = gatewayOn(t, b.ClientURL(), thirdDir)
	if got, _ := third.Balance("acme"); got != cent {
		t.Fatalf("back after the second restarted twice: balance %s on the third, want 1 cent", got)
	}
	time.Sleep(heartbeatEvery + 200*time.Millisecond) // a heartbeat each
	for _, s := range []*Service{first, second, third} {
		s.forgetSilentPeers(time.Now().Add(peerSilence + time.Second))
	}
	balances(cent, "a heartbeat later, and a round of forgetting")

	if _, _, err := first.ApplyUsage(ctx, "acme", Usage{Events: []SeqCost{{Seq: 1, Cost: 9 * cent}}}); err != nil {
		t.Fatal(err)
	}
	balances(cent, "debited")
	if _, err := first.Credit(ctx, "acme", 9*cent); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Service{first, second, third} {
		s.forgetSilentPeers(time.Now().Add(2*peerSilence + time.Second))
	}
	balances(10*cent, "debited, then credited again")
}
