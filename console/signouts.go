package console

import (
	"context"
	"strconv"
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

	mu    sync.Mutex
	ended map[string]time.Time // nonce → the session's expiry
}

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
	s := &signOuts{kv: kv, now: time.Now, cancel: cancel, done: make(chan struct{}), ended: map[string]time.Time{}}
	go func() {
		defer close(s.done)
		for e := range w.Updates() {
			if e == nil { // the entries there were at the start are read
				continue
			}
			if exp, err := strconv.ParseInt(string(e.Value()), 10, 64); err == nil {
				s.note(e.Key(), time.Unix(exp, 0))
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

// signedOut reports whether sess was signed out.
func (s *signOuts) signedOut(sess session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ended[sess.nonce]
	return ok
}

// signOut ends sess on this gateway at once and, through the bucket, on
// every other.
func (s *signOuts) signOut(ctx context.Context, sess session) error {
	s.note(sess.nonce, sess.Expires)
	_, err := s.kv.Put(ctx, sess.nonce, []byte(strconv.FormatInt(sess.Expires.Unix(), 10)))
	return err
}
