package accounts

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/money"
)

type bucketIndex int

const (
	bucketAccounts bucketIndex = iota
	bucketKeys
	bucketCount
)

// snapshot is this gateway's copy of both buckets. Entries carry the KV
// revision they were read at, so a write applied locally (so the writer sees
// it at once) and the same write arriving later through the watcher, in
// either order, leave the newer value. Deleted entries stay as tombstones
// for the same reason.
type snapshot struct {
	mu       sync.RWMutex
	accounts map[string]accountEntry
	keys     map[string]keyEntry
	// notRevoked counts, per account, its keys in keys that are neither
	// deleted nor revoked, so that the cap on them (CreateKey) is checked
	// without a walk over every key of every account.
	notRevoked map[string]int
	// watched is, per bucket, the last revision the watcher delivered, and
	// loaded whether it has delivered the bucket's initial contents.
	watched [bucketCount]uint64
	loaded  [bucketCount]bool
	// changed, when not nil, is closed at the next watcher delivery; only
	// waiters create it, so updates cost nothing while nobody waits.
	changed chan struct{}
}

type accountEntry struct {
	rev     uint64
	deleted bool
	balance money.Nanos
	debited money.Nanos // all debits ever, for telling whether a bill is in
	limits  Limits
	live    *Live // the same for every entry of the account
}

type keyEntry struct {
	rev     uint64
	deleted bool
	info    *KeyInfo // immutable once stored
}

func (sn *snapshot) init() {
	sn.accounts = make(map[string]accountEntry)
	sn.keys = make(map[string]keyEntry)
	sn.notRevoked = make(map[string]int)
}

// account is the live entry of account; false when it does not exist.
func (sn *snapshot) account(account string) (accountEntry, bool) {
	sn.mu.RLock()
	e, ok := sn.accounts[account]
	sn.mu.RUnlock()
	if !ok || e.deleted {
		return accountEntry{}, false
	}
	return e, true
}

func (sn *snapshot) key(id string) (*KeyInfo, bool) {
	sn.mu.RLock()
	e, ok := sn.keys[id]
	sn.mu.RUnlock()
	if !ok || e.deleted {
		return nil, false
	}
	return e.info, true
}

// awaitUnseenKey waits up to d for the watch to deliver key id, when the
// snapshot holds nothing of it (a deleted key's tombstone is something),
// and says whether it came.
func (sn *snapshot) awaitUnseenKey(id string, d time.Duration) bool {
	// Under the read lock first, with no timer: a call with a deleted
	// key's token comes here every time.
	sn.mu.RLock()
	_, seen := sn.keys[id]
	sn.mu.RUnlock()
	return !seen && sn.awaitKey(id, d, func(_ keyEntry, seen bool) bool { return seen })
}

// awaitKey waits up to d for done, given key id's entry (seen false when
// the snapshot holds none) with sn.mu held, to hold, and says whether it
// did.
func (sn *snapshot) awaitKey(id string, d time.Duration, done func(e keyEntry, seen bool) bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return sn.waitUntil(ctx, func() bool {
		e, seen := sn.keys[id]
		return done(e, seen)
	}) == nil
}

// accountIDsAfter is the ids of the live accounts that sort after after,
// unsorted; after "" is all of them.
func (sn *snapshot) accountIDsAfter(after string) []string {
	sn.mu.RLock()
	defer sn.mu.RUnlock()
	var out []string
	for id, e := range sn.accounts {
		if !e.deleted && id > after {
			out = append(out, id)
		}
	}
	return out
}

func (sn *snapshot) keysOf(account string) []KeyInfo {
	sn.mu.RLock()
	defer sn.mu.RUnlock()
	var out []KeyInfo
	for _, e := range sn.keys {
		if !e.deleted && e.info.Account == account {
			out = append(out, *e.info)
		}
	}
	return out
}

// keysOfSplit is the account's keys not revoked and its revoked ones,
// shared with the snapshot (KeyInfo is immutable once stored): the
// caller keeps what it shows and copies only that.
func (sn *snapshot) keysOfSplit(account string) (live, revoked []*KeyInfo) {
	sn.mu.RLock()
	defer sn.mu.RUnlock()
	for _, e := range sn.keys {
		if e.deleted || e.info.Account != account {
			continue
		}
		if e.info.RevokedAt == nil {
			live = append(live, e.info)
		} else {
			revoked = append(revoked, e.info)
		}
	}
	return live, revoked
}

func (sn *snapshot) putAccount(id string, rev uint64, rec accountRecord, deleted bool) {
	sn.mu.Lock()
	if old, ok := sn.accounts[id]; !ok || rev > old.rev {
		live := old.live
		if live == nil {
			live = new(Live)
		}
		live.tpm.Store(rec.Limits.TPM)
		sn.accounts[id] = accountEntry{rev: rev, deleted: deleted, balance: money.Nanos(rec.BalanceNanos), debited: money.Nanos(rec.DebitedNanos),
			limits: rec.Limits, live: live}
	}
	sn.mu.Unlock()
}

func (sn *snapshot) putKey(id string, rev uint64, info *KeyInfo, deleted bool) {
	sn.mu.Lock()
	if old, ok := sn.keys[id]; !ok || rev > old.rev {
		e := keyEntry{rev: rev, deleted: deleted, info: info}
		if ok && old.notRevoked() {
			sn.notRevoked[old.info.Account]--
			if sn.notRevoked[old.info.Account] == 0 {
				delete(sn.notRevoked, old.info.Account)
			}
		}
		if e.notRevoked() {
			sn.notRevoked[info.Account]++
		}
		sn.keys[id] = e
	}
	sn.mu.Unlock()
}

func (e keyEntry) notRevoked() bool {
	return !e.deleted && e.info != nil && e.info.RevokedAt == nil
}

// keysNotRevoked is how many keys of account are neither revoked nor
// deleted, expired ones included.
func (sn *snapshot) keysNotRevoked(account string) int {
	sn.mu.RLock()
	defer sn.mu.RUnlock()
	return sn.notRevoked[account]
}

func (sn *snapshot) watchedRevision(b bucketIndex) uint64 {
	sn.mu.RLock()
	defer sn.mu.RUnlock()
	return sn.watched[b]
}

// delivered records the watcher's progress on a bucket and wakes waiters.
func (sn *snapshot) delivered(b bucketIndex, rev uint64, initialDone bool) {
	sn.mu.Lock()
	if rev > sn.watched[b] {
		sn.watched[b] = rev
	}
	if initialDone {
		sn.loaded[b] = true
	}
	if sn.changed != nil {
		close(sn.changed)
		sn.changed = nil
	}
	sn.mu.Unlock()
}

// waitUntil blocks until cond, evaluated with sn.mu held, holds.
func (sn *snapshot) waitUntil(ctx context.Context, cond func() bool) error {
	for {
		sn.mu.Lock()
		if cond() {
			sn.mu.Unlock()
			return nil
		}
		if sn.changed == nil {
			sn.changed = make(chan struct{})
		}
		ch := sn.changed
		sn.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (sn *snapshot) waitLoaded(ctx context.Context) error {
	return sn.waitUntil(ctx, func() bool { return sn.loaded[bucketAccounts] && sn.loaded[bucketKeys] })
}

// WaitSynced returns once this gateway's snapshot holds everything written
// to both buckets before the call, so a test or a start-up step can read
// Balance, KeyInfo or Verify results without polling.
func (s *Service) WaitSynced(ctx context.Context) error {
	var target [bucketCount]uint64
	for b, kv := range [bucketCount]jetstream.KeyValue{s.accounts, s.keys} {
		last, err := lastRevision(ctx, kv)
		if err != nil {
			return err
		}
		target[b] = last
	}
	return s.snap.waitUntil(ctx, func() bool {
		for b := range bucketCount {
			if !s.snap.loaded[b] || s.snap.watched[b] < target[b] {
				return false
			}
		}
		return true
	})
}

// lastRevision is the revision of the newest entry in the bucket, 0 when
// it holds none.
func lastRevision(ctx context.Context, kv jetstream.KeyValue) (uint64, error) {
	status, err := kv.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading kv bucket %s status: %w", kv.Bucket(), err)
	}
	bs, ok := status.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return 0, fmt.Errorf("kv bucket %s status: unexpected type %T", kv.Bucket(), status)
	}
	state := bs.StreamInfo().State
	if state.Msgs == 0 {
		return 0, nil // purged: nothing for the watcher to deliver
	}
	return state.LastSeq, nil
}

// watch mirrors one bucket into the snapshot until ctx ends.
//
// The watcher is an ordered consumer, which nats.go recreates after gaps,
// but it notices a server that restarted under it only after missed
// heartbeats (10 s or more). So after every reconnect the watch is started
// over at once, from the revision after the last one seen. Should the
// subscription end on its own, watching starts over the same way.
func (s *Service) watch(ctx context.Context, kv jetstream.KeyValue, b bucketIndex) {
	defer s.stopped.Done()
	reconnected := s.conn.StatusChanged(nats.CONNECTED)
	defer s.conn.RemoveStatusListener(reconnected)
	retry := 100 * time.Millisecond
	for ctx.Err() == nil {
		var opts []jetstream.WatchOpt
		if next := s.snap.watchedRevision(b) + 1; next > 1 {
			opts = append(opts, jetstream.ResumeFromRevision(next))
		}
		w, err := kv.WatchAll(ctx, opts...)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(retry):
			}
			retry = min(2*retry, 5*time.Second)
			continue
		}
		retry = 100 * time.Millisecond
		s.follow(ctx, w, b, reconnected)
		stopWatcher(w)
	}
}

// follow applies the watcher's entries until ctx ends, the watcher ends or
// the connection comes back from a disconnect.
func (s *Service) follow(ctx context.Context, w jetstream.KeyWatcher, b bucketIndex, reconnected <-chan nats.Status) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-reconnected:
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil { // end of the initial values
				s.snap.delivered(b, 0, true)
				continue
			}
			s.apply(b, e)
			s.snap.delivered(b, e.Revision(), false)
		}
	}
}

// stopWatcher unsubscribes and empties the updates channel, so nats.go's
// delivery goroutine, which may be blocked sending to it, can finish.
func stopWatcher(w jetstream.KeyWatcher) {
	_ = w.Stop()
	timeout := time.After(time.Second)
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-timeout:
			return
		}
	}
}

// apply stores one watched entry. Entries that do not decode are skipped:
// they were not written by Tollgate, and one bad value must not stop the
// gateway from seeing the rest.
func (s *Service) apply(b bucketIndex, e jetstream.KeyValueEntry) {
	deleted := e.Operation() == jetstream.KeyValueDelete || e.Operation() == jetstream.KeyValuePurge
	switch b {
	case bucketAccounts:
		var rec accountRecord
		if !deleted && json.Unmarshal(e.Value(), &rec) != nil {
			return
		}
		s.snap.putAccount(e.Key(), e.Revision(), rec, deleted)
	case bucketKeys:
		var info *KeyInfo
		if !deleted {
			info = new(KeyInfo)
			if json.Unmarshal(e.Value(), info) != nil {
				return
			}
		}
		s.snap.putKey(e.Key(), e.Revision(), info, deleted)
		if fn := s.revoked.Load(); fn != nil && (deleted || info.RevokedAt != nil) {
			(*fn)(e.Key())
		}
	}
}
