package accounts

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

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
//
// Counting only its own charges left every gateway blind to the others':
// behind two gateways, an account of 0.03 USD with no grace made 50
// calls of 0.0012 USD and went to -0.03, each gateway spending the whole
// balance on its own. So every process also tells the others, over core
// NATS (UnbilledSubject), what it charged each account, within
// shareEvery of the charge, and counts theirs as it counts its own.

// UnbilledSubject carries, on core NATS, each process's charges per account
// (an unbilledMessage): no stream keeps them, a process that misses one
// has the next within a second.
const UnbilledSubject = "tollgate.unbilled"

const (
	// shareEvery is the least time between two messages of a process's
	// new charges: the charges of a busy gateway go out together, and
	// the first one after a quiet spell at once. Every millisecond a
	// charge waits, the other gateways admit calls on a balance without
	// it: two gateways on a credit of 10 calls of about 1 ms paid for 13
	// to 20 at 10 ms, 11 to 14 at 1 ms; at most 1,000 messages a second
	// keeps the cost of sending them small.
	shareEvery = time.Millisecond
	// heartbeatEvery is how often a process that has charged anything
	// says it is alive, repeating the totals of the accounts it has charges
	// of that are not debited yet (so a lost message, or a process started
	// since, is caught up).
	heartbeatEvery = time.Second
	// peerSilence is how long a process may stay silent before the others
	// forget its charges: it is dead or cut off from NATS. Its charges
	// then count nowhere until debited (published, they wait in
	// JetStream while the billing consumer or ClickHouse is down): the
	// README's "How far an account can overspend" says what that costs.
	peerSilence = 5 * time.Second
	// maxAccountsPerMessage keeps a message well under NATS's 1 MB
	// default max_payload (an entry is at most about 110 bytes).
	maxAccountsPerMessage = 2000
)

// unbilledMessage is one process's charges: per account, the total it
// charged since it started and what of that is not debited yet as far as
// it can tell.
type unbilledMessage struct {
	Process string `json:"process"` // first: a process skips its own unread (sharing.own)
	// Listening: the process reads balances (a gateway admitting calls),
	// so the others send it their charges as they come, not only in
	// heartbeats.
	Listening bool                     `json:"listening,omitempty"`
	Accounts  map[string]unbilledTotal `json:"accounts,omitempty"`
}

type unbilledTotal struct {
	Total   int64 `json:"total_nanos"`
	Pending int64 `json:"pending_nanos"`
}

// unbilled is what the processes charged one account since the account's
// debits stood at debitedAt, this one's (charged) and the others' (peers).
//
// Debits carry no process: a debit beyond debitedAt is matched against
// the charges of every process together, and once the debits cover them
// all, counting starts afresh from there (settle). Matched against this
// process's charges alone, as it was before processes shared them, the
// debit of another gateway's charge was taken for this one's and lowered
// the count twice (this process's share, and the other's once it saw the
// debit too): erring towards admitting, for as long as this gateway's own
// debits took to land. Matched against all, a debit lowers the count once.
// What can still be taken too early are debits of charges no live process
// reports (a process silent for peerSilence, bills older than the
// processes): they let through at most their amount more.
//
// A total this process missed (core NATS drops a message now and then)
// and heard of only after its debit landed and counting started afresh
// would be counted as not debited for good. So the count is also capped
// by what each process says of its own charges not debited yet, which
// it repeats every heartbeatEvery while it changes: the cap is never
// below the truth (each says at least its own), and heals such a count
// within a second.
type unbilled struct {
	mu        sync.Mutex
	charged   money.Nanos // by this process since debitedAt
	total     money.Nanos // by this process since it started: what it tells the others
	debitedAt money.Nanos
	sent      money.Nanos             // the pending this process last told the others
	peers     map[string]*peerCharges // process id → its charges
}

// peerCharges is what another process said it charged an account.
type peerCharges struct {
	total   money.Nanos // the last total it sent
	base    money.Nanos // its total when the debits stood at debitedAt
	pending money.Nanos // the last of its own charges it said were not debited
}

// charges is every charge counted since debitedAt. Lock u.mu on entry.
func (u *unbilled) charges() money.Nanos {
	sum := u.charged
	for _, p := range u.peers {
		sum += p.total - p.base
	}
	return sum
}

// settle starts counting afresh from debited once the debits cover every
// charge counted, so that debits nobody here counted (bills older than
// the processes) cannot build up a credit that hides later charges. Lock
// u.mu on entry.
func (u *unbilled) settle(debited money.Nanos) {
	if debited-u.debitedAt < u.charges() {
		return
	}
	u.charged, u.debitedAt = 0, debited
	for _, p := range u.peers {
		p.base = p.total
	}
}

// outstanding is what of the charges the debits, standing at debited, do
// not show yet.
func (u *unbilled) outstanding(debited money.Nanos) money.Nanos {
	u.mu.Lock()
	o := u.outstandingLocked(debited)
	u.mu.Unlock()
	return o
}

// outstandingLocked is outstanding with u.mu held.
func (u *unbilled) outstandingLocked(debited money.Nanos) money.Nanos {
	said := u.charged
	for _, p := range u.peers {
		said += p.pending
	}
	return max(min(u.charges()-(debited-u.debitedAt), said), 0)
}

// pending is what this process tells the others of its own charges not
// debited yet: its charges since debitedAt, or all that is outstanding
// if less. It is more than the truth when other processes' charges were
// debited first, which a process that starts counting this one's charges
// from it (a process started since) takes as refusing too much, never
// too little.
// Lock u.mu on entry.
func (u *unbilled) pending(debited money.Nanos) money.Nanos {
	return min(u.charged, u.outstandingLocked(debited))
}

// unbilledOf is account's unbilled, created counting from debited.
func (s *Service) unbilledOf(account string, debited money.Nanos) *unbilled {
	v, found := s.unbilled.Load(account)
	if !found {
		v, _ = s.unbilled.LoadOrStore(account, &unbilled{debitedAt: debited})
	}
	return v.(*unbilled)
}

// NoteCharge counts cost, metered by this process for account, against
// the balance Balance returns, on this gateway at once and on the others
// within a few milliseconds, until the account's debits show it.
func (s *Service) NoteCharge(account string, cost money.Nanos) {
	if cost <= 0 {
		return
	}
	e, ok := s.snap.account(account)
	if !ok {
		return // not an account the consumer can debit: nothing to wait for
	}
	u := s.unbilledOf(account, e.debited)
	u.mu.Lock()
	u.settle(e.debited)
	u.charged += cost
	u.total += cost
	u.mu.Unlock()
	s.share.changed(account)
}

// sharing is this process's side of UnbilledSubject.
//
// Charges go out as they come only while another process that reads
// balances listens: a gateway alone on its NATS sent a message a
// millisecond under load and decoded each again when it came back, 4 % of
// its CPU for nobody. Alone, it says only its heartbeat; a gateway that
// starts reading balances announces itself at once, and the others answer
// with their totals.
type sharing struct {
	process string // random, new at every start
	own     []byte // how this process's own messages begin

	listening atomic.Bool // this process reads balances (Standing)
	heard     atomic.Bool // another that does was heard within peerSilence
	charged   atomic.Bool // this process charged anything: then it sends heartbeats
	announce  atomic.Bool // the next message is a heartbeat, at once

	mu        sync.Mutex
	dirty     map[string]struct{}  // accounts charged since the last message
	seen      map[string]time.Time // other processes, when last heard
	listeners map[string]time.Time // those of them that read balances
	kick      chan struct{}
}

func (sh *sharing) init() {
	sh.process = rand.Text()
	sh.own = []byte(`{"process":"` + sh.process + `"`)
	sh.dirty = make(map[string]struct{})
	sh.seen = make(map[string]time.Time)
	sh.listeners = make(map[string]time.Time)
	sh.kick = make(chan struct{}, 1)
}

// changed has account's total sent with the next message, when another
// process listens; the heartbeats carry it otherwise.
func (sh *sharing) changed(account string) {
	if !sh.charged.Load() {
		sh.charged.Store(true)
	}
	if !sh.heard.Load() {
		return
	}
	sh.mu.Lock()
	sh.dirty[account] = struct{}{}
	sh.mu.Unlock()
	sh.wake()
}

// readsBalances marks this process as one that admits calls on balances:
// from its first read, the others send it their charges as they come.
func (sh *sharing) readsBalances() {
	if !sh.listening.Load() && sh.listening.CompareAndSwap(false, true) {
		sh.heartbeatNow()
	}
}

// heartbeatNow has the next message be a heartbeat, sent at once.
func (sh *sharing) heartbeatNow() {
	sh.announce.Store(true)
	sh.wake()
}

func (sh *sharing) wake() {
	select {
	case sh.kick <- struct{}{}:
	default:
	}
}

// shareUnbilled sends this process's charges and takes the others' until
// ctx ends. With NATS down nothing is sent or received: each gateway
// counts its own charges only, as before they were shared, and peers
// silent for peerSilence are forgotten.
func (s *Service) shareUnbilled(ctx context.Context) {
	defer s.stopped.Done()
	sub, err := s.conn.Subscribe(UnbilledSubject, s.receiveUnbilled)
	if err == nil {
		defer func() { _ = sub.Unsubscribe() }()
	}
	heartbeat := time.NewTicker(heartbeatEvery)
	defer heartbeat.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.share.kick:
			s.sendUnbilled(s.share.announce.Swap(false))
			select {
			case <-ctx.Done():
				return
			case <-time.After(shareEvery):
			}
		case now := <-heartbeat.C:
			s.sendUnbilled(true)
			s.forgetSilentPeers(now)
		}
	}
}

// sendUnbilled publishes the totals of the accounts charged since the last
// message; for a heartbeat, also those of every account with charges of
// this process not debited yet, or fewer than it last said.
func (s *Service) sendUnbilled(heartbeat bool) {
	sh := &s.share
	sh.mu.Lock()
	dirty := sh.dirty
	sh.dirty = make(map[string]struct{})
	sh.mu.Unlock()
	listening := sh.listening.Load()
	if heartbeat && !sh.charged.Load() && !listening {
		return // a process that neither charges nor admits (the billing consumer) has nothing to say
	}
	msg := unbilledMessage{Process: sh.process, Listening: listening, Accounts: make(map[string]unbilledTotal)}
	add := func(account string, u *unbilled, always bool) {
		e, ok := s.snap.account(account)
		if !ok {
			return
		}
		u.mu.Lock()
		pending, total := u.pending(e.debited), u.total
		if pending == 0 && u.sent == 0 && !always {
			u.mu.Unlock()
			return
		}
		u.sent = pending
		u.mu.Unlock()
		msg.Accounts[account] = unbilledTotal{Total: int64(total), Pending: int64(pending)}
		if len(msg.Accounts) >= maxAccountsPerMessage {
			s.publishUnbilled(&msg)
		}
	}
	for account := range dirty {
		if v, ok := s.unbilled.Load(account); ok {
			add(account, v.(*unbilled), true)
		}
	}
	if heartbeat {
		s.unbilled.Range(func(k, v any) bool {
			if _, done := dirty[k.(string)]; !done {
				add(k.(string), v.(*unbilled), false)
			}
			return true
		})
	}
	if len(msg.Accounts) > 0 || heartbeat {
		s.publishUnbilled(&msg)
	}
}

// publishUnbilled sends msg and empties its accounts. An error (NATS down,
// the connection closed) loses the message: the next heartbeat repeats
// what matters.
func (s *Service) publishUnbilled(msg *unbilledMessage) {
	data, err := json.Marshal(msg)
	if err == nil {
		_ = s.conn.Publish(UnbilledSubject, data)
	}
	clear(msg.Accounts)
}

// receiveUnbilled counts another process's charges.
func (s *Service) receiveUnbilled(m *nats.Msg) {
	if bytes.HasPrefix(m.Data, s.share.own) {
		return // its own, back from NATS: not decoded for nothing
	}
	var msg unbilledMessage
	if json.Unmarshal(m.Data, &msg) != nil || msg.Process == "" || msg.Process == s.share.process {
		return
	}
	now := time.Now()
	newListener := false
	s.share.mu.Lock()
	s.share.seen[msg.Process] = now
	if msg.Listening {
		_, known := s.share.listeners[msg.Process]
		newListener = !known
		s.share.listeners[msg.Process] = now
		s.share.heard.Store(true)
	}
	s.share.mu.Unlock()
	if newListener {
		// It learns this process's totals now, not at the next heartbeat.
		s.share.heartbeatNow()
	}
	for account, t := range msg.Accounts {
		e, ok := s.snap.account(account)
		if !ok {
			continue // not known here yet: the next heartbeat repeats it
		}
		u := s.unbilledOf(account, e.debited)
		u.mu.Lock()
		u.settle(e.debited)
		s.notePeer(u, msg.Process, money.Nanos(t.Total), money.Nanos(t.Pending))
		u.mu.Unlock()
	}
}

// notePeer records process's total for u's account. A process heard of
// for the first time (it started, or this one did) is counted from its
// own charges not debited yet. Lock u.mu on entry.
func (s *Service) notePeer(u *unbilled, process string, total, pending money.Nanos) {
	p, ok := u.peers[process]
	if !ok {
		if u.peers == nil {
			u.peers = make(map[string]*peerCharges)
		}
		pending = max(min(pending, total), 0)
		u.peers[process] = &peerCharges{total: total, base: total - pending, pending: pending}
		return
	}
	if total >= p.total { // a total only grows; an older message changes nothing
		p.total, p.pending = total, max(pending, 0)
	}
}

// forgetSilentPeers drops the charges of the processes not heard from for
// peerSilence.
func (s *Service) forgetSilentPeers(now time.Time) {
	var gone []string
	s.share.mu.Lock()
	for process, at := range s.share.seen {
		if now.Sub(at) > peerSilence {
			gone = append(gone, process)
			delete(s.share.seen, process)
			delete(s.share.listeners, process)
		}
	}
	s.share.heard.Store(len(s.share.listeners) > 0)
	s.share.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	s.unbilled.Range(func(_, v any) bool {
		u := v.(*unbilled)
		u.mu.Lock()
		for _, process := range gone {
			delete(u.peers, process)
		}
		u.mu.Unlock()
		return true
	})
}
