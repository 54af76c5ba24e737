package accounts

import (
	"sync"

	"github.com/tollgate/tollgate/money"
)

// A debit reaches the balance a gateway reads about a second after the
// call it bills (outbox, JetStream, the consumer's batch, the KV watch),
// and not at all while the billing consumer or ClickHouse is down. A
// balance read from the snapshot alone let an account near zero make
// every call of that second, or of the whole outage: 2,226 calls of 0.05
// USD on 0.05 of credit in 1.3 s, a balance of -111 USD against a grace
// of 0.50. So each gateway also counts what it charged itself and has not
// seen debited yet, and Balance subtracts it.

// unbilled is what this process charged one account since the account's
// debits stood at debitedAt. Charges in the account's debits beyond
// debitedAt are taken for its own, which other gateways' debits (and
// bills older than this process) make too early, never too late: it can
// let a call through that one gateway alone would refuse, never refuse one
// the debited balance would not.
type unbilled struct {
	mu        sync.Mutex
	charged   money.Nanos
	debitedAt money.Nanos
}

// NoteCharge counts cost, metered by this process for account, against
// the balance Balance returns until the account's debits show it.
func (s *Service) NoteCharge(account string, cost money.Nanos) {
	if cost <= 0 {
		return
	}
	e, ok := s.snap.account(account)
	if !ok {
		return // not an account the consumer can debit: nothing to wait for
	}
	v, found := s.unbilled.Load(account)
	if !found {
		v, _ = s.unbilled.LoadOrStore(account, &unbilled{debitedAt: e.debited})
	}
	u := v.(*unbilled)
	u.mu.Lock()
	if e.debited-u.debitedAt >= u.charged {
		// Everything charged so far is in the debits: count afresh from
		// here, so that debits of other gateways cannot build up a credit
		// that hides this one's later charges.
		u.charged, u.debitedAt = 0, e.debited
	}
	u.charged += cost
	u.mu.Unlock()
}

// outstanding is what of the charges the debits, standing at debited, do
// not show yet.
func (u *unbilled) outstanding(debited money.Nanos) money.Nanos {
	u.mu.Lock()
	o := u.charged - (debited - u.debitedAt)
	u.mu.Unlock()
	return max(o, 0)
}
