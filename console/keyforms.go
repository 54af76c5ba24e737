package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
)

// BucketKeyForms holds the one-time tokens of the key forms sent, under
// the account that sent each (keyFormKey), with the key it made. A
// browser that reloads the page answering the form sends the form again:
// without the token every reload made another key, shown once on a page
// the holder had already left. The note is a shortcut, not the guard: the
// key's id is derived from the token (accounts.KeyRequest.IdempotencyKey),
// so a form whose note was lost still cannot make a second key.
const BucketKeyForms = "TOLLGATE_CONSOLE_KEY_FORMS"

// keyFormTokenBytes is the randomness of a key form's token; the token is
// it in hex.
const keyFormTokenBytes = 16

// keyFormKey is where the bucket notes account's form of token. A token is
// the account's own: noted by token alone, a token one account had used,
// sent in another account's form, was "Key already created" with no key
// made. Account ids and hex tokens are valid KV keys as they are, and the
// token's fixed length keeps the two apart.
func keyFormKey(account, token string) string { return account + "." + token }

// errKeyFormSent is claim's answer for a form sent before.
var errKeyFormSent = errors.New("this key form was sent before")

// keyForms remembers which key forms were sent, on every gateway: a
// reload may reach another gateway behind a load balancer. Safe for
// concurrent use.
type keyForms struct {
	kv jetstream.KeyValue
}

// keyFormSent is what the bucket holds for a form sent: the account that
// sent it and, once made, the key it made.
type keyFormSent struct {
	Account string `json:"account"`
	KeyID   string `json:"key_id,omitempty"`
}

// openKeyForms declares the bucket. A form's token is good only with its
// session's CSRF token, so an entry need live no longer than a session.
func openKeyForms(ctx context.Context, js jetstream.JetStream, replicas int, sessionTTL time.Duration) (*keyForms, error) {
	kv, err := broker.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketKeyForms,
		Description: "tollgate console key forms sent (one-time token → account and the key made)",
		History:     1,
		TTL:         sessionTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, err
	}
	return &keyForms{kv: kv}, nil
}

// newKeyFormToken is the token of one rendering of the key form.
func newKeyFormToken() (string, error) {
	var random [keyFormTokenBytes]byte
	if _, err := rand.Read(random[:]); err != nil {
		return "", fmt.Errorf("generating a key form token: %w", err)
	}
	return hex.EncodeToString(random[:]), nil
}

func wellFormedKeyFormToken(token string) bool {
	if len(token) != hex.EncodedLen(keyFormTokenBytes) {
		return false
	}
	for _, c := range []byte(token) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// claim records the form as sent by account. A send of a form whose key
// is noted gets errKeyFormSent and the note; a send of a form claimed
// with no key noted claims it too, since the key store lets only one of
// them make the key and tells the others which.
func (f *keyForms) claim(ctx context.Context, token, account string) (keyFormSent, error) {
	mine := keyFormSent{Account: account}
	data, err := json.Marshal(mine)
	if err != nil {
		return keyFormSent{}, err
	}
	key := keyFormKey(account, token)
	for attempt := 0; ; attempt++ {
		_, err = f.kv.Create(ctx, key, data)
		if err == nil {
			return mine, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return keyFormSent{}, fmt.Errorf("recording a key form: %w", err)
		}
		entry, err := f.kv.Get(ctx, key)
		// Released between the two calls (its first send made no key):
		// claim it again, a few times at most.
		if errors.Is(err, jetstream.ErrKeyNotFound) && attempt < 3 {
			continue
		}
		if err != nil {
			return keyFormSent{}, fmt.Errorf("reading a key form sent before: %w", err)
		}
		var first keyFormSent
		if err := json.Unmarshal(entry.Value(), &first); err != nil {
			return keyFormSent{}, fmt.Errorf("decoding a key form sent before: %w", err)
		}
		if first.KeyID == "" && attempt < 3 { // first.Account is account: keyFormKey
			// Its send may be making the key now, may have given up (NATS
			// away, the gateway killed), or may have made and shown it and
			// then failed to note it. Refused as a reload, the first two
			// were told a key was made when none was; taken over after a
			// wait, the last made a second key.
			if _, err := f.kv.Update(ctx, key, data, entry.Revision()); err == nil {
				return mine, nil
			}
			continue // another send took it first: read what it wrote
		}
		return first, errKeyFormSent
	}
}

// made notes the key the form made, for a later send of it to name.
func (f *keyForms) made(ctx context.Context, token, account, keyID string) error {
	data, err := json.Marshal(keyFormSent{Account: account, KeyID: keyID})
	if err != nil {
		return err
	}
	if _, err := f.kv.Put(ctx, keyFormKey(account, token), data); err != nil {
		return fmt.Errorf("noting the key a form made: %w", err)
	}
	return nil
}

// release forgets a claimed form that made no key (refused at the key
// cap, the store failing), so that sending it again, after the holder
// deleted a key, is not taken for a reload.
func (f *keyForms) release(ctx context.Context, token, account string) error {
	if err := f.kv.Delete(ctx, keyFormKey(account, token)); err != nil {
		return fmt.Errorf("releasing a key form: %w", err)
	}
	return nil
}
