package console

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
)

// BucketSignOuts holds the console sessions signed out before they
// expired, keyed by their nonce, each until its expiry. The cookie carries
// a session whole and gateways keep no session state, so without it a
// copied cookie stayed valid for its full 8 hours after "Sign out".
const BucketSignOuts = "TOLLGATE_CONSOLE_SIGNOUTS"

// signOuts is every gateway's view of the bucket: a watch keeps a map of
// ended sessions in memory, so checking a cookie never waits on NATS.
type signOuts struct {
	kv     jetstream.KeyValue
	now    func() time.Time
	cancel context.CancelFunc
	done   chan struct{}

	ttl time.Duration // a session's lifetime

	mu    sync.Mutex
	ended map[string]time.Time // nonce → the session's expiry
	// accounts holds the operator's sign-outs of whole accounts: every
	// session of the account begun at or before the time is ended.
	accounts map[string]time.Time
}

// accountKeyPrefix marks an account-wide sign-out in the bucket; session
// nonces are hex and never start with it.
const accountKeyPrefix = "account."

// openSignOuts declares the bucket (entries live as long as a session can)
// and starts watching it.
func openSignOuts(ctx context.Context, js jetstream.JetStream, replicas int, sessionTTL time.Duration) (*signOuts, error) {
	kv, err := broker.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketSignOuts,
		Description: "tollgate console sessions signed out before they expired (nonce → expiry)",
		History:     1,
		TTL:         sessionTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	w, err := kv.WatchAll(wctx, jetstream.IgnoreDeletes())
	if err != nil {
		cancel()
		return nil, err
	}
	s := &signOuts{kv: kv, now: time.Now, ttl: sessionTTL, cancel: cancel, done: make(chan struct{}),
		ended: map[string]time.Time{}, accounts: map[string]time.Time{}}
	go func() {
		defer close(s.done)
		for e := range w.Updates() {
			if e == nil { // the entries there were at the start are read
				continue
			}
			unix, err := strconv.ParseInt(string(e.Value()), 10, 64)
			if err != nil {
				continue
			}
			if account, ok := strings.CutPrefix(e.Key(), accountKeyPrefix); ok {
				s.noteAccount(account, time.Unix(0, unix)) // ns: see signOutAccount
			} else {
				s.note(e.Key(), time.Unix(unix, 0))
			}
		}
	}()
	return s, nil
}

func (s *signOuts) close() {
	s.cancel()
	<-s.done
}

// note records a session as ended, and forgets those past their expiry,
// which their cookies' own expiry refuses from then on.
func (s *signOuts) note(nonce string, expires time.Time) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended[nonce] = expires
	for n, exp := range s.ended {
		if !now.Before(exp) {
			delete(s.ended, n)
		}
	}
}

// noteAccount records that every session of account begun at or before
// at is ended.
func (s *signOuts) noteAccount(account string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.accounts[account]; !ok || at.After(prev) {
		s.accounts[account] = at
	}
	// Sessions begun before now-ttl have expired by themselves.
	for a, t := range s.accounts {
		if t.Add(s.ttl).Before(s.now()) {
			delete(s.accounts, a)
		}
	}
}

// signedOut reports whether sess was signed out, by itself or with its
// whole account. A session began its ttl before it expires.
func (s *signOuts) signedOut(sess session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ended[sess.nonce]; ok {
		return true
	}
	at, ok := s.accounts[sess.Account]
	return ok && !sess.Expires.Add(-s.ttl).After(at)
}

// accountSignedOutAt is when the latest sign-out of account that still
// holds was made, zero if none: the sessions begun at or before it are
// ended.
func (s *signOuts) accountSignedOutAt(account string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accounts[account]
}

// signOutAccount ends every session of account begun until now, on this
// gateway at once and, through the bucket (unix ns), on every other. The
// entry expires with the bucket's TTL, when those sessions would have. A
// session's start is known to the second: one begun after it in its same
// second is dated the next (sessions.issue).
func (s *signOuts) signOutAccount(ctx context.Context, account string) (time.Time, error) {
	at := s.now()
	s.noteAccount(account, at)
	_, err := s.kv.Put(ctx, accountKeyPrefix+account, []byte(strconv.FormatInt(at.UnixNano(), 10)))
	return at, err
}

// signOut ends sess on this gateway at once and, through the bucket, on
// every other.
func (s *signOuts) signOut(ctx context.Context, sess session) error {
	s.note(sess.nonce, sess.Expires)
	_, err := s.kv.Put(ctx, sess.nonce, []byte(strconv.FormatInt(sess.Expires.Unix(), 10)))
	return err
}
