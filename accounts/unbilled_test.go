package accounts

import (
	"testing"

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
