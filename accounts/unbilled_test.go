package accounts

import (
	"encoding/json"
	"fmt"
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
// other within milliseconds, a debit lowers them once whichever gateway
// charged it, and a process silent for peerSilence is forgotten.
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

	// A process silent for peerSilence is forgotten; the first gateway,
	// alive, has nothing pending of its own (its heartbeats say so), so
	// the second gateway's charge counts alone, and the first gateway
	// learns it again from the second's next heartbeat.
	first.forgetSilentPeers(time.Now().Add(peerSilence + time.Second))
	if got, _ := first.Balance("acme"); got != 40*cent {
		t.Errorf("the second gateway forgotten: balance %s on the first, want 40 cents", got)
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
