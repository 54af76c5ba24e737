package accounts

import (
	"errors"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/money"
)

func seqCosts(from, through uint64, cost money.Nanos) []SeqCost {
	var out []SeqCost
	for seq := from; seq <= through; seq++ {
		out = append(out, SeqCost{Seq: seq, Cost: cost})
	}
	return out
}

func TestApplyUsageChargesARedeliveredBatchOnce(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 10*money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	batch := Usage{Events: seqCosts(1, 10, 1_000), Covered: []SeqRange{{1, 10}}}
	acct, charged, err := s.ApplyUsage(ctx, "acme", batch)
	if err != nil || charged != 10_000 || acct.Balance != 10*money.NanosPerUSD-10_000 || acct.Debited != 10_000 {
		t.Fatalf("first apply: %+v, charged %s, %v", acct, charged, err)
	}
	// The ack was lost: the same batch comes back, and with it new events.
	redelivered := Usage{Events: append(seqCosts(1, 10, 1_000), seqCosts(11, 12, 7)...), Covered: []SeqRange{{1, 12}}}
	acct, charged, err = s.ApplyUsage(ctx, "acme", redelivered)
	if err != nil || charged != 14 || acct.Debited != 10_014 {
		t.Fatalf("redelivered: %+v, charged %s, %v; want only the 2 new events charged", acct, charged, err)
	}
	if _, charged, _ = s.ApplyUsage(ctx, "acme", redelivered); charged != 0 {
		t.Fatalf("third delivery charged %s", charged)
	}
	rec, _, err := s.getAccount(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if rec.BilledThroughSeq != 12 || len(rec.BilledRanges) != 0 {
		t.Errorf("record billed through %d with ranges %v; want 12 and none", rec.BilledThroughSeq, rec.BilledRanges)
	}
}

// A batch job's one event can reach the stream in two messages (a worker
// that died after billing the job publishes it again when it restarts,
// after the worker that took the job over billed it): it is charged once.
// A message's other events, and the job's message redelivered, as ever.
func TestApplyUsageChargesABatchJobOnceWhateverTheMessage(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 10*money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	first := Usage{Events: []SeqCost{{Seq: 1, Cost: 500, Job: "job-1"}, {Seq: 1, Cost: 7}}, Covered: []SeqRange{{1, 1}}}
	if _, charged, err := s.ApplyUsage(ctx, "acme", first); err != nil || charged != 507 {
		t.Fatalf("first message: charged %s, %v", charged, err)
	}
	if _, charged, _ := s.ApplyUsage(ctx, "acme", first); charged != 0 {
		t.Fatalf("the message redelivered: charged %s", charged)
	}
	// Another message brings job-1 again with an event of its own, and a
	// second job twice.
	again := Usage{Events: []SeqCost{{Seq: 9, Cost: 500, Job: "job-1"}, {Seq: 9, Cost: 3}, {Seq: 9, Cost: 40, Job: "job-2"}, {Seq: 10, Cost: 40, Job: "job-2"}},
		Covered: []SeqRange{{9, 10}}}
	acct, charged, err := s.ApplyUsage(ctx, "acme", again)
	if err != nil || charged != 43 || acct.Debited != 550 {
		t.Fatalf("job-1 again, job-2 twice: charged %s, debited %s, %v; want 3 + 40", charged, acct.Debited, err)
	}
}

// Two billing processes share the consumer: the second one's batch (later
// sequences) lands first. A plain "billed through" watermark would then
// skip the first batch's events.
func TestApplyUsageChargesBatchesAppliedOutOfOrder(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	later := Usage{Events: []SeqCost{{Seq: 14, Cost: 5}, {Seq: 19, Cost: 5}}, Covered: []SeqRange{{11, 20}}}
	earlier := Usage{Events: []SeqCost{{Seq: 3, Cost: 100}, {Seq: 8, Cost: 100}}, Covered: []SeqRange{{1, 10}}}
	for _, u := range []Usage{later, earlier, later, earlier} {
		if _, _, err := s.ApplyUsage(ctx, "acme", u); err != nil {
			t.Fatal(err)
		}
	}
	acct, err := s.Account(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if acct.Debited != 210 {
		t.Fatalf("debited %s, want 210 nano-USD", acct.Debited)
	}
	rec, _, _ := s.getAccount(ctx, "acme")
	if rec.BilledThroughSeq != 20 || rec.BilledRanges != nil {
		t.Errorf("adjacent batches did not fold: through %d, ranges %v", rec.BilledThroughSeq, rec.BilledRanges)
	}
}

func TestApplyUsageFoldsRangesUpToTheSettledSequence(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	// Batches with gaps between them: messages 11-20 went to another
	// process and held nothing for this account.
	for _, u := range []Usage{
		{Events: []SeqCost{{Seq: 2, Cost: 1}}, Covered: []SeqRange{{1, 10}}},
		{Events: []SeqCost{{Seq: 25, Cost: 1}}, Covered: []SeqRange{{21, 30}}},
	} {
		if _, _, err := s.ApplyUsage(ctx, "acme", u); err != nil {
			t.Fatal(err)
		}
	}
	rec, _, _ := s.getAccount(ctx, "acme")
	if rec.BilledThroughSeq != 10 || len(rec.BilledRanges) != 1 || rec.BilledRanges[0] != (SeqRange{21, 30}) {
		t.Fatalf("through %d, ranges %v; want 10 and [21-30]", rec.BilledThroughSeq, rec.BilledRanges)
	}
	// Once messages up to 30 are all acknowledged, none of them comes back.
	_, charged, err := s.ApplyUsage(ctx, "acme", Usage{Events: []SeqCost{{Seq: 31, Cost: 1}}, SettledThrough: 30})
	if err != nil || charged != 1 {
		t.Fatalf("charged %s, %v", charged, err)
	}
	rec, _, _ = s.getAccount(ctx, "acme")
	if rec.BilledThroughSeq != 31 || rec.BilledRanges != nil || rec.DebitedNanos != 3 {
		t.Fatalf("through %d, ranges %v, debited %d; want 31, none, 3", rec.BilledThroughSeq, rec.BilledRanges, rec.DebitedNanos)
	}
}

func TestApplyUsageConcurrentDeliveriesChargeOnce(t *testing.T) {
	s, b, dataDir := gateway(t)
	other := secondGateway(t, b, dataDir)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		svc := []*Service{s, other}[i%2]
		// Overlapping batches: each sequence is in several of them.
		from := uint64(i%8)*50 + 1
		u := Usage{Events: seqCosts(from, from+99, 3), Covered: []SeqRange{{from, from + 99}}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := svc.ApplyUsage(ctx, "acme", u); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	acct, err := s.Account(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if want := money.Nanos(3 * 450); acct.Debited != want || acct.Balance != -want {
		t.Fatalf("debited %s, balance %s; want %s charged once per sequence 1-450", acct.Debited, acct.Balance, want)
	}
}

func TestApplyUsageRefusesBadInputAndMissingAccounts(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	for name, u := range map[string]Usage{
		"negative cost": {Events: []SeqCost{{Seq: 1, Cost: -1}}},
		"sequence 0":    {Events: []SeqCost{{Seq: 0, Cost: 1}}},
		"two costs":     {Events: []SeqCost{{Seq: 4, Cost: 1}, {Seq: 4, Cost: 2}}},
		"empty range":   {Covered: []SeqRange{{5, 4}}},
	} {
		if _, _, err := s.ApplyUsage(ctx, "acme", u); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: %v, want ErrInvalidInput", name, err)
		}
	}
	if _, _, err := s.ApplyUsage(ctx, "nobody", Usage{Events: []SeqCost{{Seq: 1, Cost: 1}}}); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing account: %v, want ErrNotFound", err)
	}
	if acct, _ := s.Account(ctx, "acme"); acct.Debited != 0 {
		t.Errorf("refused usage debited %s", acct.Debited)
	}
}

func TestCreditAndDebitKeepTheBilledSequence(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ApplyUsage(ctx, "acme", Usage{Events: seqCosts(1, 5, 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Credit(ctx, "acme", 100); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Debit(ctx, "acme", 1); err != nil {
		t.Fatal(err)
	}
	if _, charged, err := s.ApplyUsage(ctx, "acme", Usage{Events: seqCosts(1, 5, 1)}); err != nil || charged != 0 {
		t.Fatalf("replay after credit and debit charged %s, %v", charged, err)
	}
	if acct, _ := s.Account(ctx, "acme"); acct.Balance != 94 {
		t.Fatalf("balance %s, want 94 nano-USD", acct.Balance)
	}
}
