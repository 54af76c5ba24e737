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
//
// A process that stops, or goes silent, leaves charges nobody debited
// yet: while the billing consumer or ClickHouse is down they wait in
// JetStream (or its outbox), and no live process counted them any more.
// Forgotten after peerSilence, they let every account spend its whole
// balance again: 11 calls on a credit of 10, refused on three gateways,
// then 11 more once one of them was restarted, the balance at -0.000084
// USD on 0.00007 of credit. So the others keep a silent process's
// charges until the account's debits show them (see peerCharges.gone),
// and a gateway keeps its own across a restart (unbilledfile.go).
//
// A gateway killed (SIGKILL, a crash) leaves a file without the charges
// of its last second. Restarted, it said it replaces the process that
// wrote it, and the others dropped that process's charges for the new
// one's, fewer: killed and restarted, a gateway gave an account back the
// charges the others had counted right (4 calls more). So the others
// take out of the old process's charges only what the new one took from
// the file (unbilledTotal.Restored), and keep the rest as a gone
// process's (unbilled.replaced).
//
// A gateway learnt the others' charges only once its first balance read
// announced it, or from their heartbeats: restarted, it admitted the
// calls of its first half second on its own charges alone, one more call
// per max_concurrent slot at every restart (an account with credit for 10
// calls ended at 18 billed). So a gateway asks the others for theirs
// before it serves (askPeers).

// UnbilledSubject carries, on core NATS, each process's charges per account
// (an unbilledMessage): no stream keeps them, a process that misses one
// has the next within a second.
const UnbilledSubject = "tollgate.unbilled"

// UnbilledHelloSubject is where a gateway starting asks the others for
// their charges (an unbilledMessage saying who asks); each answers on the
// request's inbox with its own (see askPeers).
const UnbilledHelloSubject = "tollgate.unbilled.hello"

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
	// take it for gone: it is dead, or cut off from NATS. Its charges
	// still count until the debits show them (peerCharges.gone).
	peerSilence = 5 * time.Second
	// maxAccountsPerMessage keeps a message well under NATS's 1 MB
	// default max_payload (an entry is at most about 110 bytes).
	maxAccountsPerMessage = 2000
	// helloWait bounds how long a start waits for the first answer of the
	// others (askPeers): their heartbeats bring their charges within it
	// anyway. Alone, or among processes of an earlier release, which do
	// not answer, NATS says at once that nobody listens.
	helloWait = heartbeatEvery
	// helloLinger is how long a start goes on taking answers after the
	// first: each process answers as soon as it reads the question.
	helloLinger = 100 * time.Millisecond
)

// unbilledMessage is one process's charges: per account, the total it
// charged since it started and what of that is not debited yet as far as
// it can tell.
type unbilledMessage struct {
	Process string `json:"process"` // first: a process skips its own unread (sharing.own)
	// Listening: the process reads balances (a gateway admitting calls),
	// so the others send it their charges as they come, not only in
	// heartbeats.
	Listening bool `json:"listening,omitempty"`
	// Replaces is the process this one took the charges of at its start
	// (a gateway restarted on its data_dir): the others stop counting
	// that one's charges of an account once this one speaks of it, so
	// that they are not counted twice.
	Replaces string `json:"replaces,omitempty"`
	// Relayed: not Process speaking, but another telling a process
	// starting what it counts of Process's charges (answerHello): Process
	// may be gone, and is taken for gone until it speaks itself.
	Relayed  bool                     `json:"relayed,omitempty"`
	Accounts map[string]unbilledTotal `json:"accounts,omitempty"`
}

type unbilledTotal struct {
	Total   int64 `json:"total_nanos"`
	Pending int64 `json:"pending_nanos"`
	// Restored is what of Total the process took from the one it
	// replaces (unbilledMessage.Replaces), from its data_dir.
	Restored int64 `json:"restored_nanos,omitempty"`
	// Replaced, in a relayed message: the process after it took its
	// charges from its file, and Pending is without those already.
	Replaced bool `json:"replaced,omitempty"`
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
// What can still be taken too early are debits of charges no process
// reports (bills older than the processes), and those of a gone process
// once debits as large as what it said it had pending landed, which may
// be other processes' (see peerCharges.gone): they let through at most
// their amount more, while the debits flow.
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
	restored  money.Nanos             // of total, what this process took from its data_dir at start
}

// peerCharges is what another process said it charged an account.
//
// A process silent for peerSilence is gone, but not its charges: while
// the debits stall they wait in JetStream or in its outbox, and no live
// process counts them. So its entry stays, gone, remembering the debits
// of that moment (goneDebited), and counts until the debits advanced by
// the charges it last said were pending, or settle covers them: not
// sooner, its pending staying in the cap (outstandingLocked's said) too,
// and not for ever, debits that flow again ending it. Heard again (it was
// cut off from NATS, not dead), it counts as before.
type peerCharges struct {
	total   money.Nanos // the last total it sent
	base    money.Nanos // its total when the debits stood at debitedAt
	pending money.Nanos // the last of its own charges it said were not debited

	gone        bool        // silent for peerSilence, or replaced
	goneDebited money.Nanos // the account's debits when it was found gone
	replaced    bool        // the process after it took its charges from the file it left (unbilled.replaced)
	// waits is, for a process replaced, the pending it had before: its
	// entry stays until the debits pass it, even with nothing left to
	// count, so that it is relayed (answerHello) to a process that did
	// not see it replaced. Restarted twice while another gateway was
	// down, a gateway had that one count the charges its first restart
	// restored twice, for good: it never heard the process that
	// restored them say so.
	waits money.Nanos
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
	for process, p := range u.peers {
		if p.gone {
			delete(u.peers, process) // its charges are debited: nothing left to wait for
			continue
		}
		p.base = p.total
	}
}

// dropGone drops the peers gone since the account's debits advanced by
// at least what each said it had pending, as debits of their charges,
// and reports whether any gone peer stays. Lock u.mu on entry.
func (u *unbilled) dropGone(debited money.Nanos) (kept bool) {
	u.settle(debited)
	for process, p := range u.peers {
		if !p.gone {
			continue
		}
		if debited-p.goneDebited < max(p.pending, p.waits) {
			kept = true
			continue
		}
		// Its charges leave the count with the debits taken for theirs,
		// so that what is outstanding stays as it was; only the cap loses
		// its pending, which lets through at most that much more if those
		// debits were the others' after all.
		u.debitedAt += p.total - p.base
		delete(u.peers, process)
	}
	return kept
}

// replaced takes out of the charges of process, which another one
// replaced on its data_dir, what that one took from the file it left
// (restored), once. The rest, the charges its file lacked (those of the
// last second of a process killed), counts as a gone process's does,
// until the debits show them: dropping them all for the new process's,
// as was done, lowered the count by them. It reports whether a gone
// process's charges still count. Lock u.mu on entry.
func (u *unbilled) replaced(process string, restored, debited money.Nanos) (goneKept bool) {
	p, found := u.peers[process]
	if !found || p.replaced {
		return false
	}
	p.replaced, p.waits = true, max(p.waits, p.pending)
	p.base += min(max(restored, 0), p.total-p.base)
	p.pending = max(p.pending-restored, 0)
	if !p.gone {
		p.gone, p.goneDebited = true, debited
	}
	return u.dropGone(debited)
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
	if !s.kept.changed.Load() {
		s.kept.changed.Store(true)
	}
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
	// replaces is the process whose charges this one took from its
	// data_dir at start (see unbilledMessage.Replaces).
	replaces string
	own      []byte // how this process's own messages begin

	listening atomic.Bool // this process reads balances (Standing), or asked the others at its start (askPeers)
	heard     atomic.Bool // another that does was heard within peerSilence
	goneKept  atomic.Bool // some account counts the charges of a gone process
	charged   atomic.Bool // this process charged anything: then it sends heartbeats
	announce  atomic.Bool // the next message is a heartbeat, at once

	mu        sync.Mutex
	dirty     map[string]struct{}  // accounts charged since the last message
	seen      map[string]time.Time // other processes, when last heard
	listeners map[string]time.Time // those of them that read balances
	kick      chan struct{}

	forgetting sync.Mutex // one forgetSilentPeers at a time

	answering *nats.Subscription // UnbilledHelloSubject's, from the end of Open; nil if it failed
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
// received is the subscription to UnbilledSubject, made by Open before it
// asks the others (nil if it failed).
func (s *Service) shareUnbilled(ctx context.Context, received *nats.Subscription) {
	defer s.stopped.Done()
	if received != nil {
		defer func() { _ = received.Unsubscribe() }()
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
	msg := unbilledMessage{Process: sh.process, Listening: listening, Replaces: sh.replaces, Accounts: make(map[string]unbilledTotal)}
	add := func(account string, u *unbilled, always bool) {
		e, ok := s.snap.account(account)
		if !ok {
			return
		}
		u.mu.Lock()
		pending, total, restored := u.pending(e.debited), u.total, u.restored
		if pending == 0 && u.sent == 0 && !always {
			u.mu.Unlock()
			return
		}
		u.sent = pending
		u.mu.Unlock()
		msg.Accounts[account] = unbilledTotal{Total: int64(total), Pending: int64(pending), Restored: int64(restored)}
		if len(msg.Accounts) >= maxAccountsPerMessage {
			s.publishUnbilled(UnbilledSubject, &msg)
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
		s.publishUnbilled(UnbilledSubject, &msg)
	}
}

// publishUnbilled sends msg to subject and empties its accounts. An error
// (NATS down, the connection closed) loses the message: the next
// heartbeat repeats what matters.
func (s *Service) publishUnbilled(subject string, msg *unbilledMessage) {
	data, err := json.Marshal(msg)
	if err == nil {
		_ = s.conn.Publish(subject, data)
	}
	clear(msg.Accounts)
}

// askPeers has a gateway starting count the other processes' charges
// before it admits a call: it asks them on UnbilledHelloSubject and takes
// their answers for helloLinger after the first, or until helloWait
// passes with none (a process that does not answer). NATS answers at
// once when no process listens there (a gateway alone, or among those of
// an earlier release, whose heartbeats bring their charges within a
// second). The subscription to UnbilledSubject is made before, so that
// the charges they send after answering reach this one too.
func (s *Service) askPeers(ctx context.Context) {
	sh := &s.share
	sh.listening.Store(true)
	// Those of an earlier release learn of it at once too, and all its
	// own charges (taken from its data_dir).
	defer sh.heartbeatNow()
	inbox := nats.NewInbox()
	answers, err := s.conn.SubscribeSync(inbox)
	if err != nil {
		return
	}
	defer func() { _ = answers.Unsubscribe() }()
	hello, err := json.Marshal(unbilledMessage{Process: sh.process, Listening: true, Replaces: sh.replaces})
	if err != nil || s.conn.PublishRequest(UnbilledHelloSubject, inbox, hello) != nil {
		return
	}
	deadline := time.Now().Add(helloWait)
	for answered := false; ; answered = true {
		wait, cancel := context.WithDeadline(ctx, deadline)
		m, err := answers.NextMsgWithContext(wait)
		cancel()
		if err != nil {
			return // nobody listens (nats.ErrNoResponders), or the wait is over
		}
		s.receiveUnbilled(m)
		if !answered {
			deadline = time.Now().Add(helloLinger)
		}
	}
}

// answerHello sends a process starting (askPeers) this one's charges not
// debited yet, to the inbox it asked from, and those of the other
// processes it counts (relayed, under their own ids). It is taken for a
// listener first, so that the charges made after it are sent to it as
// they come.
//
// A gone process answers nobody: answered by the live ones alone, a
// gateway restarted while another stayed down counted none of the one
// down's charges (with ClickHouse down, exactly its share admitted again
// at once), and a rolling restart of all would have forgotten them. The
// live peers are relayed too: one stopped less than peerSilence ago is
// not taken for gone yet, and one alive speaks for itself in its own
// answer, which counts as it does (notePeer) whichever comes first.
func (s *Service) answerHello(m *nats.Msg) {
	s.receiveUnbilled(m)
	if m.Reply == "" {
		return
	}
	sh := &s.share
	msg := unbilledMessage{Process: sh.process, Listening: sh.listening.Load(), Replaces: sh.replaces, Accounts: make(map[string]unbilledTotal)}
	relayed := make(map[string]*unbilledMessage)
	s.unbilled.Range(func(k, v any) bool {
		e, ok := s.snap.account(k.(string))
		if !ok {
			return true
		}
		u := v.(*unbilled)
		u.mu.Lock()
		pending, total, restored := u.pending(e.debited), u.total, u.restored
		for process, p := range u.peers {
			if p.pending <= 0 && !p.replaced {
				continue
			}
			r := relayed[process]
			if r == nil {
				r = &unbilledMessage{Process: process, Relayed: true, Accounts: make(map[string]unbilledTotal)}
				relayed[process] = r
			}
			r.Accounts[k.(string)] = unbilledTotal{Total: int64(p.total), Pending: int64(p.pending), Replaced: p.replaced}
		}
		u.mu.Unlock()
		if pending > 0 {
			msg.Accounts[k.(string)] = unbilledTotal{Total: int64(total), Pending: int64(pending), Restored: int64(restored)}
			if len(msg.Accounts) >= maxAccountsPerMessage {
				s.publishUnbilled(m.Reply, &msg)
			}
		}
		for _, r := range relayed {
			if len(r.Accounts) >= maxAccountsPerMessage {
				s.publishUnbilled(m.Reply, r)
			}
		}
		return true
	})
	for _, r := range relayed {
		if len(r.Accounts) > 0 {
			s.publishUnbilled(m.Reply, r)
		}
	}
	s.publishUnbilled(m.Reply, &msg) // an answer with none too: the one asking waits no longer for this one
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
	if msg.Relayed {
		s.receiveRelayed(&msg)
		return
	}
	now := time.Now()
	newListener := false
	s.share.mu.Lock()
	if msg.Replaces != "" {
		// Not taken for gone later: its charges are handled (unbilled.replaced).
		delete(s.share.seen, msg.Replaces)
		delete(s.share.listeners, msg.Replaces)
	}
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
	if len(msg.Accounts) > 0 && !s.kept.changed.Load() {
		s.kept.changed.Store(true)
	}
	goneKept := false
	for account, t := range msg.Accounts {
		e, ok := s.snap.account(account)
		if !ok {
			continue // not known here yet: the next heartbeat repeats it
		}
		u := s.unbilledOf(account, e.debited)
		u.mu.Lock()
		u.settle(e.debited)
		if msg.Replaces != "" && u.replaced(msg.Replaces, money.Nanos(t.Restored), e.debited) {
			goneKept = true
		}
		s.notePeer(u, msg.Process, money.Nanos(t.Total), money.Nanos(t.Pending))
		u.mu.Unlock()
	}
	if goneKept {
		// forgetSilentPeers drops them once debited; one running now
		// may not have seen them.
		s.share.forgetting.Lock()
		s.share.goneKept.Store(true)
		s.share.forgetting.Unlock()
	}
}

// receiveRelayed counts the charges of a process another one told this
// one of at its start (answerHello), as a gone process's until it speaks
// itself. Those of the process this one replaces are counted less what
// this one took from its file: the rest are the charges a process killed
// had not written there, which only the others counted (with all calls on
// a gateway killed and restarted, 11 more on a credit of 10).
func (s *Service) receiveRelayed(msg *unbilledMessage) {
	kept := false
	for account, t := range msg.Accounts {
		e, ok := s.snap.account(account)
		if !ok {
			continue
		}
		u := s.unbilledOf(account, e.debited)
		u.mu.Lock()
		u.settle(e.debited)
		u.noteRelayed(msg.Process, money.Nanos(t.Total), money.Nanos(t.Pending), t.Replaced, e.debited)
		if msg.Process == s.share.replaces {
			u.replaced(msg.Process, u.restored, e.debited)
		}
		if u.dropGone(e.debited) {
			kept = true
		}
		u.mu.Unlock()
	}
	if kept {
		s.share.forgetting.Lock()
		s.share.goneKept.Store(true)
		s.share.forgetting.Unlock()
	}
}

// noteRelayed records what another process counts of process's charges
// of u's account (receiveRelayed). A process this one counts already
// keeps its entry, which its own words made, or this one's file: only a
// larger total, which it missed, is taken, and the replacement of a gone
// one the sender knows of. Lock u.mu on entry.
func (u *unbilled) noteRelayed(process string, total, pending money.Nanos, replaced bool, debited money.Nanos) {
	pending = max(min(pending, total), 0)
	p, ok := u.peers[process]
	if !ok {
		if u.peers == nil {
			u.peers = make(map[string]*peerCharges)
		}
		u.peers[process] = &peerCharges{total: total, base: total - pending, pending: pending, gone: true, goneDebited: debited, replaced: replaced}
		return
	}
	if !p.gone {
		return
	}
	if total > p.total {
		p.total = total
		if replaced == p.replaced { // else one of the two pendings lacks what was restored
			p.pending = max(p.pending, pending)
		}
	}
	if replaced && !p.replaced {
		// The sender took out what the process after it restored; so
		// does this one, once (unbilled.replaced).
		p.replaced, p.waits = true, max(p.waits, p.pending)
		p.base = max(p.base, p.total-pending)
		p.pending = min(p.pending, pending)
	}
}

// notePeer records process's total for u's account. A process heard of
// for the first time (it started, or this one did) is counted from its
// own charges not debited yet; one taken for gone that speaks again
// counts as before. Lock u.mu on entry.
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
	p.gone = false
	if total >= p.total { // a total only grows; an older message changes nothing
		p.total, p.pending = total, max(pending, 0)
	}
}

// forgetSilentPeers takes the processes not heard from for peerSilence
// for gone, and drops the charges of those gone once the debits show
// them (see peerCharges).
func (s *Service) forgetSilentPeers(now time.Time) {
	s.share.forgetting.Lock() // goneKept says what the last round left
	defer s.share.forgetting.Unlock()
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
	if len(gone) == 0 && !s.share.goneKept.Load() {
		return
	}
	kept := false
	s.unbilled.Range(func(k, v any) bool {
		u := v.(*unbilled)
		e, ok := s.snap.account(k.(string))
		u.mu.Lock()
		for _, process := range gone {
			if p, found := u.peers[process]; found {
				p.gone, p.goneDebited = true, e.debited
			}
		}
		if !ok {
			for process, p := range u.peers {
				if p.gone {
					delete(u.peers, process) // the account is deleted: no debit will come
				}
			}
		}
		if ok && u.dropGone(e.debited) {
			kept = true
		}
		u.mu.Unlock()
		return true
	})
	s.share.goneKept.Store(kept)
}
