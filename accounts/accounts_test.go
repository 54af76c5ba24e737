package accounts

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/money"
)

func TestAccountLifecycle(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)

	created, err := s.CreateAccount(ctx, "acme.prod-1_x", 2*money.NanosPerUSD)
	if err != nil {
		t.Fatal(err)
	}
	if created.Balance != 2*money.NanosPerUSD || created.Credited != 2*money.NanosPerUSD || created.Debited != 0 || created.CreatedAt.IsZero() {
		t.Errorf("created = %+v", created)
	}
	if _, err := s.CreateAccount(ctx, "acme.prod-1_x", 0); !errors.Is(err, ErrExists) {
		t.Errorf("second create: %v, want ErrExists", err)
	}
	if bal, ok := s.Balance("acme.prod-1_x"); !ok || bal != 2*money.NanosPerUSD {
		t.Errorf("Balance right after create = %s, %v", bal, ok)
	}
	if _, ok := s.Balance("nobody"); ok {
		t.Error("Balance reports a missing account")
	}
	if _, err := s.Account(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Account(nobody): %v, want ErrNotFound", err)
	}

	if _, err := s.Credit(ctx, "acme.prod-1_x", 500_000_000); err != nil {
		t.Fatal(err)
	}
	after, err := s.Debit(ctx, "acme.prod-1_x", 3*money.NanosPerUSD)
	if err != nil {
		t.Fatal(err)
	}
	want := Account{ID: "acme.prod-1_x", Balance: -500_000_000, Credited: 2_500_000_000, Debited: 3 * money.NanosPerUSD, CreatedAt: created.CreatedAt}
	if !after.CreatedAt.Equal(want.CreatedAt) || after.ID != want.ID || after.Balance != want.Balance || after.Credited != want.Credited || after.Debited != want.Debited {
		t.Errorf("after credit and debit = %+v, want %+v", after, want)
	}
	read, err := s.Account(ctx, "acme.prod-1_x")
	if err != nil || read.Balance != want.Balance {
		t.Errorf("Account = %+v, %v; want balance %s", read, err, want.Balance)
	}
	if bal, _ := s.Balance("acme.prod-1_x"); bal != want.Balance {
		t.Errorf("Balance = %s, want %s at once on the writing gateway", bal, want.Balance)
	}

	if _, err := s.Credit(ctx, "nobody", 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("credit of a missing account: %v, want ErrNotFound", err)
	}
	for _, amount := range []money.Nanos{0, -1} {
		if _, err := s.Credit(ctx, "acme.prod-1_x", amount); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("Credit(%d): %v, want ErrInvalidInput", amount, err)
		}
	}
	if _, err := s.Debit(ctx, "acme.prod-1_x", -1); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("Debit(-1): %v, want ErrInvalidInput", err)
	}
	if got, err := s.Debit(ctx, "acme.prod-1_x", 0); err != nil || got.Balance != want.Balance {
		t.Errorf("Debit(0) = %+v, %v; want the account unchanged", got, err)
	}
}

func TestAccountBalanceOverflowRefused(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "rich", math.MaxInt64-1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Credit(ctx, "rich", 2); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("overflowing credit: %v, want ErrInvalidInput", err)
	}
	if a, _ := s.Account(ctx, "rich"); a.Balance != math.MaxInt64-1 {
		t.Errorf("balance changed to %s by a refused credit", a.Balance)
	}
}

func TestAccountIDValidation(t *testing.T) {
	valid := []string{"a", "acme", "A-b_c.d", "0", strings.Repeat("x", 64), "a.b.c"}
	invalid := []string{"", strings.Repeat("x", 65), "a b", "a/b", "a*", "a>", ".a", "a.", "a..b", "ü", "a\n"}
	for _, id := range valid {
		if err := ValidateAccountID(id); err != nil {
			t.Errorf("ValidateAccountID(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range invalid {
		err := ValidateAccountID(id)
		if !errors.Is(err, ErrInvalidInput) || !strings.Contains(fmt.Sprint(err), "1-64 characters") {
			t.Errorf("ValidateAccountID(%q) = %v, want ErrInvalidInput explaining the rule", id, err)
		}
	}
	s, _, _ := gateway(t)
	if _, err := s.CreateAccount(testContext(t), "a b", 0); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("CreateAccount with a space: %v, want ErrInvalidInput", err)
	}
}

func TestCreditSeenByOtherGatewayWithinASecond(t *testing.T) {
	a, brokerA, dataDirA := gateway(t)
	b := secondGateway(t, brokerA, dataDirA)
	ctx := testContext(t)
	if _, err := a.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Credit(ctx, "acme", 7*money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	checkFor(t, time.Second, 10*time.Millisecond, func() error {
		if bal, ok := b.Balance("acme"); !ok || bal != 7*money.NanosPerUSD {
			return fmt.Errorf("other gateway sees balance %s (exists %v), want 7 USD", bal, ok)
		}
		return nil
	})
}

func TestConcurrentDebitsSumExactly(t *testing.T) {
	a, brokerA, dataDirA := gateway(t)
	b := secondGateway(t, brokerA, dataDirA)
	ctx := testContext(t)
	const workers, each = 8, 50
	if _, err := a.CreateAccount(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var total money.Nanos
	errs := make(chan error, workers)
	for w := range workers {
		// Half the writers go through each gateway, so CAS conflicts span
		// connections as they would between real gateways.
		s := a
		if w%2 == 1 {
			s = b
		}
		for i := range each {
			total += money.Nanos(w*1000 + i + 1)
		}
		wg.Go(func() {
			for i := range each {
				if _, err := s.Debit(ctx, "acme", money.Nanos(w*1000+i+1)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, err := a.Account(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if got.Debited != total || got.Balance != money.NanosPerUSD-total || got.Credited != money.NanosPerUSD {
		t.Errorf("after %d debits totalling %d: %+v", workers*each, total, got)
	}
	for _, s := range []*Service{a, b} {
		if err := s.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
		if bal, _ := s.Balance("acme"); bal != got.Balance {
			t.Errorf("snapshot balance %s, bucket has %s", bal, got.Balance)
		}
	}
}

// TestWaitSyncedSeesWritesFromElsewhere writes through one gateway and
// reads another's snapshot right after WaitSynced, with no polling: a
// WaitSynced that returned early would fail here.
func TestWaitSyncedSeesWritesFromElsewhere(t *testing.T) {
	a, brokerA, dataDirA := gateway(t)
	b := secondGateway(t, brokerA, dataDirA)
	ctx := testContext(t)
	for i := range 20 {
		id := fmt.Sprintf("acct%d", i)
		if _, err := a.CreateAccount(ctx, id, money.Nanos(i+1)); err != nil {
			t.Fatal(err)
		}
		if err := b.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
		if bal, ok := b.Balance(id); !ok || bal != money.Nanos(i+1) {
			t.Fatalf("after WaitSynced, Balance(%s) = %s, %v", id, bal, ok)
		}
	}
	info, _, err := a.CreateKey(ctx, "acct0", KeyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := b.ListKeys(ctx, "acct0")
	if err != nil || len(keys) != 1 || keys[0].KeyID != info.KeyID {
		t.Errorf("other gateway's ListKeys = %v, %v; want the key just made", keys, err)
	}
}

// TestSnapshotFollowsAcrossServerRestart restarts the NATS server under two
// gateways; updates made after it is back must still reach both snapshots.
func TestSnapshotFollowsAcrossServerRestart(t *testing.T) {
	storeDir := t.TempDir()
	port := testutil.FreePort(t)
	run := func() *server.Server {
		srv, err := server.NewServer(&server.Options{
			Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: storeDir, NoSigs: true, NoLog: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		go srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats-server not ready")
		}
		return srv
	}
	srv := run()
	url := srv.ClientURL()
	// Registered first, so it runs after the gateways have closed.
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })

	dataDirA := t.TempDir()
	brokerA := connectBroker(t, url)
	a := openService(t, brokerA, dataDirA)
	t.Cleanup(func() { a.Close(); brokerA.Close() })
	b := secondGateway(t, brokerA, dataDirA)
	ctx := testContext(t)
	if _, err := a.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}

	srv.Shutdown()
	srv.WaitForShutdown()
	srv = run()

	restarted := time.Now()
	// The first writes after the restart may race the reconnect.
	checkFor(t, 10*time.Second, 100*time.Millisecond, func() error {
		_, err := a.Credit(ctx, "acme", 1)
		return err
	})
	t.Logf("first write %s after the restart", time.Since(restarted))
	want, err := a.Account(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, time.Second, 20*time.Millisecond, func() error {
		for name, s := range map[string]*Service{"writer": a, "other": b} {
			if bal, _ := s.Balance("acme"); bal != want.Balance {
				return fmt.Errorf("%s gateway sees %s, want %s", name, bal, want.Balance)
			}
		}
		return nil
	})
	t.Logf("seen everywhere %s after the restart", time.Since(restarted))
}

// TestCreditOnce: a credit sent again with its idempotency key (a retried
// CLI call, a payment webhook delivered twice) is applied once, also when
// both race; the same key with another amount is refused.
func TestCreditOnce(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var replays atomic.Int32
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, replayed, err := s.CreditOnce(ctx, "acme", 5*money.NanosPerUSD, "pay_123")
			if err != nil {
				t.Error(err)
			}
			if replayed {
				replays.Add(1)
			}
		}()
	}
	wg.Wait()
	acc, err := s.Account(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if acc.Balance != 5*money.NanosPerUSD || replays.Load() != 7 {
		t.Fatalf("8 credits of 5 USD under one key: balance %s, %d replays; want 5 USD and 7", acc.Balance, replays.Load())
	}
	if _, _, err := s.CreditOnce(ctx, "acme", 6*money.NanosPerUSD, "pay_123"); !errors.Is(err, ErrExists) {
		t.Errorf("the key again with another amount: %v, want ErrExists", err)
	}
	if acc, _, err := s.CreditOnce(ctx, "acme", 5*money.NanosPerUSD, "pay_124"); err != nil || acc.Balance != 10*money.NanosPerUSD {
		t.Errorf("another key: %v, %v", acc.Balance, err)
	}
	// Without a key, every credit counts.
	for range 2 {
		if _, err := s.Credit(ctx, "acme", money.NanosPerUSD); err != nil {
			t.Fatal(err)
		}
	}
	if acc, _ := s.Account(ctx, "acme"); acc.Balance != 12*money.NanosPerUSD {
		t.Errorf("balance %s, want 12 USD", acc.Balance)
	}
}

// An account's limits reach every gateway as its balance does, and a
// credit or a debit, which rewrite the record, keeps them.
func TestAccountLimitsSeenByOtherGatewayAndKept(t *testing.T) {
	a, brokerA, dataDirA := gateway(t)
	b := secondGateway(t, brokerA, dataDirA)
	ctx := testContext(t)
	if _, err := a.CreateAccountWithLimits(ctx, "acme", money.NanosPerUSD, Limits{RPM: 60}); err != nil {
		t.Fatal(err)
	}
	acc, err := a.SetLimits(ctx, "acme", func(l *Limits) { l.MaxConcurrent = 4 })
	if err != nil || acc.Limits != (Limits{RPM: 60, MaxConcurrent: 4}) {
		t.Fatalf("SetLimits: %+v %v", acc.Limits, err)
	}
	if _, err := a.Credit(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Debit(ctx, "acme", 1); err != nil {
		t.Fatal(err)
	}
	checkFor(t, time.Second, 10*time.Millisecond, func() error {
		if bal, limits, _, ok := b.Standing("acme"); !ok || bal != 2*money.NanosPerUSD-1 || limits != (Limits{RPM: 60, MaxConcurrent: 4}) {
			return fmt.Errorf("other gateway sees %s USD and limits %+v (exists %v)", bal, limits, ok)
		}
		return nil
	})
	if _, err := a.SetLimits(ctx, "acme", func(l *Limits) { l.TPM = -1 }); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("a negative tpm: %v, want ErrInvalidInput", err)
	}
	if _, err := a.CreateAccountWithLimits(ctx, "acme2", 0, Limits{MaxConcurrent: -1}); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("a negative max_concurrent: %v, want ErrInvalidInput", err)
	}
	if _, err := a.SetLimits(ctx, "nobody", func(l *Limits) { l.RPM = 1 }); !errors.Is(err, ErrNotFound) {
		t.Errorf("limits of a missing account: %v, want ErrNotFound", err)
	}
}

// staleReplica answers the first misses gets of a key not found, as a
// replica a few milliseconds behind the leader does to a direct get.
type staleReplica struct {
	jetstream.KeyValue
	misses atomic.Int32
}

func (r *staleReplica) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if r.misses.Add(-1) >= 0 {
		return nil, jetstream.ErrKeyNotFound
	}
	return r.KeyValue.Get(ctx, key)
}

// An account this gateway created a moment ago is found when a key is
// made for it, though the replica answering the read has not caught up:
// a cluster with a node down answered the key's creation 404, "account
// not found", right after the account's 201.
func TestAccountJustCreatedIsFoundOnAStaleReplica(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "fresh", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	stale := &staleReplica{KeyValue: s.accounts}
	stale.misses.Store(3)
	s.accounts = stale
	if _, _, err := s.CreateKey(ctx, "fresh", KeyRequest{Name: "k"}); err != nil {
		t.Fatalf("a key for an account just created, read on a stale replica: %v", err)
	}
	stale.misses.Store(100)
	if _, _, err := s.CreateKey(ctx, "nobody", KeyRequest{Name: "k"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a key for an account nobody created: %v, want not found at once", err)
	}
	if n := stale.misses.Load(); n != 99 {
		t.Fatalf("an account the snapshot does not hold was read %d times, want once", 100-n)
	}
}

// electingBucket is a bucket whose stream has no leader, as for the
// seconds of an election after its leader's node was lost: a status read
// (STREAM.INFO, which the leader answers) waits until it gives up.
type electingBucket struct{ jetstream.KeyValue }

func (electingBucket) Status(ctx context.Context) (jetstream.KeyValueStatus, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// The console's keys page hung 10 s, then was a 503 ("listing keys of
// acme: reading kv bucket TOLLGATE_KEYS status: context deadline
// exceeded"), for 10 to 15 s after each loss of the node leading the keys
// or accounts bucket: listing an account's keys asked the buckets for
// their last revision first. The keys are in the gateway's snapshot; the
// list is read there, at once.
func TestRecentKeysAreListedWhileTheBucketsElectALeader(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	kept, _, err := s.CreateKey(ctx, "acme", KeyRequest{Name: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	gone, _, err := s.CreateKey(ctx, "acme", KeyRequest{Name: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RevokeKey(ctx, gone.KeyID); err != nil {
		t.Fatal(err)
	}
	s.keys, s.accounts = electingBucket{s.keys}, electingBucket{s.accounts}
	start := time.Now()
	keys, hidden, err := s.ListRecentKeys("acme", 20)
	if err != nil {
		t.Fatalf("listing keys while the buckets elect a leader: %v", err)
	}
	// Asking the buckets waited out a 10 s bound; 2 s leaves a busy
	// machine under the race detector room.
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("listing keys took %s, want no wait", waited)
	}
	if len(keys) != 2 || hidden != 0 || keys[0].KeyID != kept.KeyID || keys[1].KeyID != gone.KeyID || keys[1].RevokedAt == nil {
		t.Fatalf("listed %+v (%d hidden), want %s then %s revoked", keys, hidden, kept.KeyID, gone.KeyID)
	}
}

// A credit typed wrong (1000 for 10.00) could not be taken back: a
// negative amount corrects it, under the same idempotency key rules, and
// never takes the credited total below zero.
func TestNegativeCreditCorrectsACredit(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreditOnce(ctx, "acme", 1000*money.NanosPerUSD, "pay_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Debit(ctx, "acme", 2*money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		acc, replayed, err := s.CreditOnce(ctx, "acme", -990*money.NanosPerUSD, "fix_pay_1")
		if err != nil || replayed != (i == 1) {
			t.Fatalf("correction %d: replayed %v, %v", i, replayed, err)
		}
		if acc.Credited != 10*money.NanosPerUSD || acc.Balance != 8*money.NanosPerUSD || acc.Debited != 2*money.NanosPerUSD {
			t.Fatalf("after correcting 1000 to 10 with 2 spent: credited %s, balance %s, debited %s", acc.Credited, acc.Balance, acc.Debited)
		}
	}
	if _, _, err := s.CreditOnce(ctx, "acme", -5*money.NanosPerUSD, "fix_pay_1"); !errors.Is(err, ErrExists) {
		t.Errorf("the correction's key with another amount: %v, want ErrExists", err)
	}
	_, _, err := s.CreditOnce(ctx, "acme", -11*money.NanosPerUSD, "")
	if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), "credited_usd would go below zero") {
		t.Errorf("a correction past what was credited: %v, want ErrInvalidInput naming credited_usd", err)
	}
	if acc, _, err := s.CreditOnce(ctx, "acme", -10*money.NanosPerUSD, ""); err != nil || acc.Credited != 0 || acc.Balance != -2*money.NanosPerUSD {
		t.Errorf("correcting every credit away: %+v, %v; want credited 0, balance -2", acc, err)
	}
	if _, _, err := s.CreditOnce(ctx, "acme", 0, ""); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("a credit of 0: %v, want ErrInvalidInput", err)
	}
}
