package console

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/internal/durable"
)

// SecretFile, under data_dir, keys the session cookies. Every gateway of a
// deployment must have the same file (like signing.key): one started with
// another is refused at start (see checkSharedSecret).
const SecretFile = "console.secret"

// BucketSecret holds, under key "fingerprint", a fingerprint of the
// console.secret every gateway on this NATS must share: an HMAC of a
// fixed label under the secret, never the secret.
const BucketSecret = "TOLLGATE_CONSOLE_SECRET"

const (
	cookieName = "tollgate_console"
	cookiePath = "/console"
	secretLen  = 32
	// DefaultSessionTTL is how long a console session lasts; it does not
	// slide, so a stolen cookie is worth at most this long.
	DefaultSessionTTL = 8 * time.Hour
)

var (
	errNoSession      = errors.New("not signed in")
	errSessionExpired = errors.New("session expired")
	errSessionInvalid = errors.New("session cookie is not valid here")
)

// session is a verified console session. The cookie carries it whole,
// signed: gateways keep no session state, so any gateway of a deployment
// serves any session.
type session struct {
	Account string
	Expires time.Time
	nonce   string // random per sign-in; keys the CSRF token
}

// sessions signs and verifies session cookies with HMAC-SHA256.
type sessions struct {
	secret []byte
	ttl    time.Duration
	now    func() time.Time
}

// issue begins a session of account, whose sessions begun at or before
// signedOutAt (zero: never) the operator signed out.
//
// cookie value: base64url(account) "." expiry unix seconds "." nonce (hex)
// "." base64url(HMAC of the three).
func (s *sessions) issue(account string, signedOutAt time.Time) (value string, sess session, err error) {
	var nonce [16]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", session{}, fmt.Errorf("generating session nonce: %w", err)
	}
	// A session's start is known to the second (its expiry less the
	// ttl), so one begun after a sign-out, in its same second, read as
	// begun at or before it: a link issued just after
	// "tollgate accounts logout" signed its holder in and straight out
	// ("This session was signed out"). Such a session begins in the next
	// second instead, the sign-in waiting for it (a second at most).
	// Dated the next second without the wait, it outlived a second
	// sign-out later in the first one. (A sign-out dated ahead of this
	// gateway's clock is not waited for.)
	now := s.now()
	if wait := signedOutAt.Truncate(time.Second).Add(time.Second).Sub(now); !signedOutAt.IsZero() && wait > 0 && wait <= time.Second {
		time.Sleep(wait)
		now = s.now()
	}
	expires := now.Add(s.ttl).Truncate(time.Second)
	sess = session{Account: account, Expires: expires, nonce: hex.EncodeToString(nonce[:])}
	payload := base64.RawURLEncoding.EncodeToString([]byte(account)) + "." +
		strconv.FormatInt(sess.Expires.Unix(), 10) + "." + sess.nonce
	return payload + "." + s.mac("session", payload), sess, nil
}

func (s *sessions) verify(value string) (session, error) {
	if value == "" {
		return session{}, errNoSession
	}
	cut := strings.LastIndexByte(value, '.')
	if cut < 0 {
		return session{}, errSessionInvalid
	}
	payload, sum := value[:cut], value[cut+1:]
	if subtle.ConstantTimeCompare([]byte(sum), []byte(s.mac("session", payload))) != 1 {
		return session{}, errSessionInvalid
	}
	parts := strings.Split(payload, ".")
	if len(parts) != 3 {
		return session{}, errSessionInvalid
	}
	account, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return session{}, errSessionInvalid
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return session{}, errSessionInvalid
	}
	sess := session{Account: string(account), Expires: time.Unix(exp, 0), nonce: parts[2]}
	if !s.now().Before(sess.Expires) {
		return session{}, errSessionExpired
	}
	return sess, nil
}

// csrf is the session's anti-forgery token: derived, not stored, and
// different for every sign-in.
func (s *sessions) csrf(sess session) string { return s.mac("csrf", sess.nonce) }

func (s *sessions) checkCSRF(sess session, got string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf(sess))) == 1
}

// mac separates its uses by purpose, so a CSRF token is never a valid
// session signature or the other way round.
func (s *sessions) mac(purpose, data string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("tollgate console v1 " + purpose + "\x00"))
	m.Write([]byte(data))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// fingerprint names the secret to other gateways and in messages without
// giving it away; its own purpose keeps it from being a session signature
// or a CSRF token.
func (s *sessions) fingerprint() string { return s.mac("secret fingerprint", "") }

// checkSharedSecret publishes the fingerprint of this gateway's secret as
// that of the gateways on this NATS, or, if one is published already,
// refuses this secret unless it is that one. A gateway given a copy of
// signing.key but not of console.secret made a secret of its own and
// refused every cookie the others issued ("its console secret differs"):
// behind a load balancer, account holders were signed out at random.
func (s *sessions) checkSharedSecret(ctx context.Context, js jetstream.JetStream, replicas int, dataDir string) error {
	kv, err := broker.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketSecret,
		Description: "a fingerprint of the console.secret every gateway shares (never the secret)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return err
	}
	mine := []byte(s.fingerprint())
	published, err := broker.PublishOrRead(ctx, kv, "fingerprint", mine)
	if err != nil {
		return fmt.Errorf("checking the shared console secret: %w", err)
	}
	if bytes.Equal(published, mine) {
		return nil
	}
	// Gateways of an earlier version ran with different secrets unchecked:
	// the first one upgraded published its own, and the message says
	// which one to copy.
	return fmt.Errorf("%s (fingerprint %.12s) is not the console secret of the gateways on this NATS (fingerprint %.12s, in KV bucket %s, published by the first to start): "+
		"console sessions begun on one are refused by the other, and account holders behind a load balancer are signed out at random. "+
		"Copy console.secret into %s from the data_dir of a gateway that started without this error, not from one started before the upgrade "+
		"that brought this check (it may hold another); the sessions begun on this gateway end. "+
		"Or, to replace the console secret on purpose (everyone is signed out), stop every gateway, put one new console.secret in each data_dir "+
		"and delete the published fingerprint (nats kv del %s fingerprint)",
		filepath.Join(dataDir, SecretFile), mine, published, BucketSecret, dataDir, BucketSecret)
}

// loadOrCreateSecret reads <dataDir>/console.secret, creating it with a new
// random secret on first use. Creation is exclusive (link of a finished
// temporary file), so gateways starting together on one data dir agree.
func loadOrCreateSecret(dataDir string) ([]byte, error) {
	path := filepath.Join(dataDir, SecretFile)
	for attempt := 0; ; attempt++ {
		text, err := os.ReadFile(path)
		if err == nil {
			secret, err := hex.DecodeString(strings.TrimSpace(string(text)))
			if err != nil || len(secret) < secretLen {
				return nil, fmt.Errorf("%s must hold at least %d hex-encoded random bytes: copy console.secret from another gateway's data_dir; "+
					"or delete it, and the published fingerprint (nats kv del %s fingerprint), to have a new one made (signs everyone out)", path, secretLen, BucketSecret)
			}
			return secret, nil
		}
		if !errors.Is(err, os.ErrNotExist) || attempt > 0 {
			return nil, fmt.Errorf("reading console secret: %w", err)
		}
		if err := createSecret(path); err != nil {
			return nil, err
		}
	}
}

func createSecret(path string) error {
	secret := make([]byte, secretLen)
	if _, err := rand.Read(secret); err != nil {
		return fmt.Errorf("generating console secret: %w", err)
	}
	// Of two processes starting at once, one creates it and both read
	// that one. The directory's sync matters: a power loss soon after a
	// first start lost console.secret, and the next start made another,
	// which the fingerprint published in NATS refused.
	if _, err := durable.CreateFile(path, []byte(hex.EncodeToString(secret)+"\n")); err != nil {
		return fmt.Errorf("writing console secret: %w", err)
	}
	return nil
}
