package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/broker"
)

// BucketLogins holds pending console sign-in tokens, keyed by the hex
// SHA-256 of the token: the token itself is stored nowhere, so reading the
// bucket signs no one in.
const BucketLogins = "TOLLGATE_CONSOLE_LOGINS"

// LoginTTL is how long a sign-in link works.
const LoginTTL = 15 * time.Minute

// loginTokenPrefix marks sign-in tokens, so one pasted where an API key is
// expected (or found in a log) is recognised at a glance.
const loginTokenPrefix = "tgl-"

const loginTokenBytes = 32

// ErrLoginInvalid is returned for a sign-in token that is malformed,
// unknown, expired or already used. Fix: ask the operator for a new link
// (`tollgate accounts login ACCOUNT`); each link works once, for 15 minutes.
var ErrLoginInvalid = errors.New("console sign-in link is invalid, expired or already used")

// Logins issues and redeems one-time console sign-in tokens. They live in a
// JetStream KV bucket, so a link issued through one gateway can be redeemed
// on any other. Safe for concurrent use.
type Logins struct {
	kv jetstream.KeyValue
	js jetstream.JetStream // confirms kv's misses with its stream leader
	// replicated: kv has replicas, whose gets may answer behind the leader.
	replicated bool
	now        func() time.Time
}

type loginRecord struct {
	Account   string    `json:"account"`
	ExpiresAt time.Time `json:"expires_at"`
}

// OpenLogins declares the bucket (idempotent; every gateway calls it).
func OpenLogins(ctx context.Context, js jetstream.JetStream, replicas int) (*Logins, error) {
	kv, err := broker.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketLogins,
		Description: "tollgate console sign-in tokens (SHA-256 only, one use each)",
		History:     1,
		TTL:         LoginTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, err
	}
	return &Logins{kv: kv, js: js, replicated: replicas > 1, now: time.Now}, nil
}

// IssueLogin returns a new sign-in token for account, valid once until
// expiresAt. The caller must check that the account exists; the token is
// returned to the caller only and must not be logged.
func (l *Logins) IssueLogin(ctx context.Context, account string) (token string, expiresAt time.Time, err error) {
	if err := accounts.ValidateAccountID(account); err != nil {
		return "", time.Time{}, err
	}
	var random [loginTokenBytes]byte
	if _, err := rand.Read(random[:]); err != nil {
		return "", time.Time{}, fmt.Errorf("generating sign-in token: %w", err)
	}
	token = loginTokenPrefix + base64.RawURLEncoding.EncodeToString(random[:])
	expiresAt = l.now().Add(LoginTTL).UTC().Truncate(time.Second)
	data, err := json.Marshal(loginRecord{Account: account, ExpiresAt: expiresAt})
	if err != nil {
		return "", time.Time{}, err
	}
	if _, err := l.kv.Create(ctx, loginKey(token), data); err != nil {
		return "", time.Time{}, fmt.Errorf("storing sign-in token: %w", err)
	}
	return token, expiresAt, nil
}

// Cancel deletes the account's pending sign-in links and says how many.
// The bucket holds only the links of the last LoginTTL, so reading it
// whole is cheap.
func (l *Logins) Cancel(ctx context.Context, account string) (int, error) {
	keys, err := l.kv.ListKeys(ctx)
	if err != nil {
		return 0, fmt.Errorf("listing sign-in links: %w", err)
	}
	n := 0
	for key := range keys.Keys() {
		entry, err := l.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // redeemed or expired meanwhile
		}
		if err != nil {
			return n, fmt.Errorf("reading sign-in link: %w", err)
		}
		var rec loginRecord
		if json.Unmarshal(entry.Value(), &rec) != nil || rec.Account != account {
			continue
		}
		if err := l.kv.Delete(ctx, key, jetstream.LastRevision(entry.Revision())); err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return n, fmt.Errorf("cancelling sign-in link: %w", err)
		}
		n++
	}
	return n, nil
}

// Peek returns the account a valid token signs in, without using it up:
// the GET of a sign-in link only shows a button, so link previewers and
// mail scanners that fetch it do not burn the token.
func (l *Logins) Peek(ctx context.Context, token string) (string, error) {
	rec, _, err := l.lookup(ctx, token)
	return rec.Account, err
}

// Redeem uses the token up and returns its account. Of two concurrent
// redeems of one token (on any gateways) exactly one succeeds: the delete
// is conditional on the revision that was read.
func (l *Logins) Redeem(ctx context.Context, token string) (string, error) {
	rec, rev, err := l.lookup(ctx, token)
	if err != nil {
		return "", err
	}
	err = l.kv.Delete(ctx, loginKey(token), jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return "", ErrLoginInvalid // redeemed meanwhile
	}
	if err != nil {
		return "", fmt.Errorf("using up sign-in token: %w", err)
	}
	return rec.Account, nil
}

func (l *Logins) lookup(ctx context.Context, token string) (loginRecord, uint64, error) {
	if !wellFormedLoginToken(token) {
		return loginRecord{}, 0, ErrLoginInvalid
	}
	// A link made through another gateway and opened at once was
	// "invalid", read from a replica behind the leader, until sent again.
	entry, err := broker.GetLatest(ctx, l.js, l.kv, loginKey(token), l.replicated)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return loginRecord{}, 0, ErrLoginInvalid
	}
	if err != nil {
		return loginRecord{}, 0, fmt.Errorf("reading sign-in token: %w", err)
	}
	var rec loginRecord
	if err := json.Unmarshal(entry.Value(), &rec); err != nil {
		return loginRecord{}, 0, fmt.Errorf("decoding sign-in token record: %w", err)
	}
	// The bucket's TTL removes old entries eventually, not to the second.
	if !l.now().Before(rec.ExpiresAt) {
		return loginRecord{}, 0, ErrLoginInvalid
	}
	return rec, entry.Revision(), nil
}

func loginKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func wellFormedLoginToken(token string) bool {
	raw, ok := strings.CutPrefix(token, loginTokenPrefix)
	if !ok || len(raw) != base64.RawURLEncoding.EncodedLen(loginTokenBytes) {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(raw)
	return err == nil
}
