package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/chtest"
	"github.com/tollgate/tollgate/money"
)

// TestGatewaySIGKILLMidLoadLosesNoBilledAnswer kills a whole deployment
// process — gateway, embedded NATS and billing consumer in one — twice
// under load, with streams half sent, and restarts it on the same data dir
// and ports. Every answer a client received whole must be billed exactly
// once: the gateway sends an answer's last byte only after its usage event
// is fsync'ed in the outbox, republishes the outbox after the restart
// (JetStream drops what it already has), and the consumer's redelivered
// batches are neither stored twice under FINAL nor debited twice.
//
// What a SIGKILL cuts is the process, not the page cache: an event written
// to the outbox survives it even before the fsync. So this test checks the
// recovery path (outbox replay, deduplication, redelivery, idempotent
// debits) end to end; the window a missing wait-for-disk would open before
// the last byte is microseconds wide here and not what it can catch.
func TestGatewaySIGKILLMidLoadLosesNoBilledAnswer(t *testing.T) {
	t.Parallel()
	ch := chtest.Start(t)
	up := startUpstream(t)
	perCall := callCost(t, filepath.Join(repoRoot, "gateway.yaml"))
	gw := startGateway(t, gatewayOptions{
		name:           "gateway",
		upstreamURL:    up.URL,
		clickhouseDSN:  ch.DSN(),
		consumeInServe: true,
		adminToken:     "tga-e2e-gateway-kill",
	})
	const account, credit = "kill-load", "50.00"
	_, key := newAccount(t, gw, account, credit)

	ld := startLoad(t, []*gateway{gw}, key, 4, 100_000)
	ld.completedAtLeast(150, 30*time.Second)
	for kill := 1; kill <= 2; kill++ {
		// Kill while the upstream is answering, so streams are cut.
		checkFor(t, 10*time.Second, time.Millisecond, func() error {
			if up.Active() == 0 {
				return fmt.Errorf("no request in flight")
			}
			return nil
		})
		inFlight := up.Active()
		gw.kill()
		done, failed := ld.res.counts()
		t.Logf("kill %d: SIGKILLed the gateway with %d upstream requests in flight (%d answers completed, %d failed so far)", kill, inFlight, done, failed)
		gw.restart()
		ld.completedAtLeast(done+150, 30*time.Second)
	}
	res := ld.finish()

	l := openLedger(t, ch.DSN(), "nats://"+gw.natsAddr)
	l.settle(gw)
	_, failed := res.counts()
	// A request whose event reached the outbox but whose answer the kill
	// cut is billed without having completed: at most one per failure.
	checkBilled(t, l, gw, account, parseUSD(t, credit), perCall, res, failed)
}

// TestBillingConsumerSIGKILLedRecovers kills the billing consumer, a
// process of its own, between a batch's INSERT into ClickHouse and its
// acks, three times under load: twice after the batch's debit (its
// redelivery must not debit again) and once before it (its redelivery must
// debit). To land there the test freezes the process (SIGSTOP) as soon as
// ClickHouse gains rows, reads where the batch is, and steps it forward in
// short runs (SIGCONT, SIGSTOP) until it is in the wanted window, or lets
// it go on and waits for the next batch if it went past. The cut batches
// are delivered again after the consumer's AckWait: ClickHouse must hold
// each event once under FINAL, and the account be debited once per event.
func TestBillingConsumerSIGKILLedRecovers(t *testing.T) {
	t.Parallel()
	ch := chtest.Start(t)
	up := startUpstream(t)
	perCall := callCost(t, filepath.Join(repoRoot, "gateway.yaml"))
	gw := startGateway(t, gatewayOptions{
		name:           "gateway",
		upstreamURL:    up.URL,
		clickhouseDSN:  ch.DSN(),
		consumeInServe: false,
		adminToken:     "tga-e2e-billing-kill",
	})
	bill := startBilling(t, "billing", "", "", gw.natsAddr, ch.DSN())
	const account, credit = "billing-kill-load", "50.00"
	_, key := newAccount(t, gw, account, credit)
	l := openLedger(t, ch.DSN(), "nats://"+gw.natsAddr)
	progress := func() billingProgress { return l.progress(gw, account, perCall) }

	ld := startLoad(t, []*gateway{gw}, key, 4, 100_000)
	ld.completedAtLeast(100, 30*time.Second)
	const attemptsPerKill = 20
	// stranded is what killed processes left: inserted events not
	// acknowledged, and of them those not debited. A running batch shows
	// as more than that.
	var stranded billingProgress
	for kill, afterDebit := range []bool{true, false, true} {
		window := "after its debit"
		if !afterDebit {
			window = "before its debit"
		}
		hit, attempt := false, 0
		for attempt < attemptsPerKill && !hit {
			attempt++
			l.waitForInsert(30 * time.Second)
			bill.freeze()
			p := progress()
			for afterDebit && p.unacked > stranded.unacked && p.undebited > stranded.undebited {
				bill.step(200 * time.Microsecond) // inserted, not debited yet
				p = progress()
			}
			hit = p.unacked > stranded.unacked && (p.undebited > stranded.undebited) != afterDebit
			if !hit {
				bill.signal(syscall.SIGCONT) // went past the window: the next batch
			}
		}
		bill.kill()
		before := stranded
		stranded = progress()
		done, _ := ld.res.counts()
		t.Logf("kill %d: SIGKILLed billing between a batch's INSERT and its acks, %s: %v (batch %d); it left %d inserted events unacknowledged, %d of them not debited",
			kill+1, window, hit, attempt, stranded.unacked-before.unacked, stranded.undebited-before.undebited)
		if !hit {
			t.Errorf("kill %d did not land between a batch's INSERT and its acks, %s, in %d batches", kill+1, window, attemptsPerKill)
		}
		ld.completedAtLeast(done+100, 30*time.Second) // the gateway goes on without billing
		bill.start()
	}
	done, _ := ld.res.counts()
	ld.completedAtLeast(done+100, 30*time.Second)
	res := ld.finish()
	if _, failed := res.counts(); failed > 0 {
		t.Errorf("the gateway never went down, yet %d requests failed: %s", failed, res.summary())
	}

	l.settle(gw)
	checkBilled(t, l, gw, account, parseUSD(t, credit), perCall, res, 0)
}

// waitForInsert waits until usage_events gains rows (without FINAL, so a
// redelivered batch counts too): billing has just inserted a batch and is
// about to debit and acknowledge it.
func (l *ledger) waitForInsert(within time.Duration) {
	l.t.Helper()
	count := func() (uint64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var n uint64
		err := l.ch.QueryRow(ctx, "SELECT count() FROM usage_events").Scan(&n)
		return n, err
	}
	before, _ := count() // the table may not exist yet: 0
	checkFor(l.t, within, time.Millisecond, func() error {
		n, err := count()
		if err != nil {
			return err
		}
		if n <= before {
			return fmt.Errorf("usage_events still holds %d rows", n)
		}
		return nil
	})
}

// billingProgress is how far billing got with the events in ClickHouse.
type billingProgress struct {
	unacked   int64 // inserted, message not acknowledged
	undebited int64 // inserted, not debited
}

// progress reads billingProgress of account, the only account with
// traffic, on a fresh stream whose sequences run 1, 2, … without gaps:
// every message up to Delivered.Stream was delivered, and all but
// NumAckPending of them acknowledged; every event costs perCall. Exact only
// while no billing process runs or the one that does is frozen: nothing
// else inserts, debits or acks.
func (l *ledger) progress(g *gateway, account string, perCall money.Nanos) billingProgress {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var inserted uint64
	if err := l.ch.QueryRow(ctx, "SELECT uniqExact(id) FROM usage_events").Scan(&inserted); err != nil {
		l.t.Fatalf("ClickHouse: %v", err)
	}
	info, err := l.consumerInfo()
	if err != nil {
		l.t.Fatal(err)
	}
	var acc struct {
		Debited string `json:"debited_usd"`
	}
	g.admin("GET", "/admin/v1/accounts/"+account, nil, 200, &acc)
	debited := parseUSD(l.t, acc.Debited)
	if debited%perCall != 0 {
		l.t.Fatalf("account %s debited %s USD, not a whole number of calls at %s USD", account, debited, perCall)
	}
	acked := int64(info.Delivered.Stream) - int64(info.NumAckPending)
	return billingProgress{
		unacked:   int64(inserted) - acked,
		undebited: int64(inserted) - int64(debited/perCall),
	}
}
