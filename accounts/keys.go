package accounts

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go/jetstream"
)

// Scopes a key can be limited to.
const (
	ScopeGenerate = "generate" // /v1/chat/completions, /v1/responses, /v1/models
	ScopeClassify = "classify" // /v1/classify, /v1/tag, /v1/score, /v1/match
	ScopeBatch    = "batch"    // /v1/batch
	ScopeConsole  = "console"  // the web console
)

// AllScopes lists every scope; a key with no scopes has all of them.
var AllScopes = []string{ScopeGenerate, ScopeClassify, ScopeBatch, ScopeConsole}

// TokenPrefix starts every API key, so leaked keys are easy to grep for.
const TokenPrefix = "tg-"

// ErrInvalidKey is wrapped by every verification failure; the message after
// it says why. Create a new key if the key was revoked, expired or issued by
// another deployment (whose signing.key differs).
var ErrInvalidKey = errors.New("invalid API key")

// ErrRevoked is Verify's error for a key that was revoked (wrapping
// ErrInvalidKey); the gateway answers it too to a stream whose key was
// revoked before any of its answer went out.
var ErrRevoked = fmt.Errorf("%w: revoked", ErrInvalidKey)

// Prebuilt so that refusing a key, which attackers can make us do at will,
// allocates nothing. A bad signature names its likeliest cause for a key
// that was good: another gateway's, or another data_dir's; "bad signature"
// alone sent a new user looking for a corrupted key.
var (
	errMissingPrefix  = fmt.Errorf("%w: missing %q prefix", ErrInvalidKey, TokenPrefix)
	errMalformed      = fmt.Errorf("%w: malformed", ErrInvalidKey)
	errBadSignature   = fmt.Errorf("%w: bad signature (a key made by another gateway or data_dir, whose signing.key differs, or a key copied incompletely)", ErrInvalidKey)
	errWrongAlgorithm = fmt.Errorf("%w: wrong algorithm", ErrInvalidKey)
	errExpired        = fmt.Errorf("%w: expired", ErrInvalidKey)
	errNotYetValid    = fmt.Errorf("%w: not valid yet", ErrInvalidKey)
	errWrongIssuer    = fmt.Errorf("%w: wrong issuer", ErrInvalidKey)
	errBadClaims      = fmt.Errorf("%w: invalid claims", ErrInvalidKey)
	errUnknownKey     = fmt.Errorf("%w: unknown key", ErrInvalidKey)
)

// Key is a verified API key. It is shared between requests and with the
// verification cache: never modify it or its slices.
type Key struct {
	ID, Account, Name string
	Scopes            []string  // empty = all scopes
	Models            []string  // empty = every catalog model
	RPM, TPM          int64     // 0 = no per-key limit
	ExpiresAt         time.Time // zero = never
}

// HasScope reports whether the key may be used for scope s.
func (k *Key) HasScope(s string) bool {
	return len(k.Scopes) == 0 || slices.Contains(k.Scopes, s)
}

// AllowsModel reports whether the key may call catalog model id.
func (k *Key) AllowsModel(id string) bool { return ModelsAllow(k.Models, id) }

// ModelsAllow reports whether a key's model list allows catalog model id:
// an empty list allows every model. Callers that hold the list without
// the key (a batch job records its key's) use it directly.
func ModelsAllow(models []string, id string) bool {
	return len(models) == 0 || slices.Contains(models, id)
}

// Logging is a key's opt-in logging of generation inputs and outputs.
type Logging struct {
	Enabled       bool `json:"enabled"`
	RetentionDays int  `json:"retention_days"` // 0 = kept with no expiry (deleting the key leaves them)
}

// KeyRequest describes a key to create.
type KeyRequest struct {
	Name           string
	Scopes, Models []string
	RPM, TPM       int64
	ExpiresIn      time.Duration // 0 = never expires
	Logging        Logging
	// MaxKeys is the most keys not revoked the account may hold, this one
	// included (auth.max_keys_per_account, which the caller reads from
	// the config in force); 0 or less = no cap. An expired key counts
	// until it is revoked: it is still stored, listed and held in every
	// gateway's memory.
	MaxKeys int
	// MaxCreatedPerHour is the most keys the account may make in an hour
	// through the path asking (auth.max_keys_created_per_hour, for the
	// console); 0 or less = no limit, and the key is not counted: the
	// admin API and the CLI are the operator's.
	MaxCreatedPerHour int
	// IdempotencyKey, when set, makes the request one that makes at most
	// one key however often it is sent, on any gateway: the key's id is
	// derived from it and the account, so that the key store itself
	// refuses a second key of that id, and a request sent again gets a
	// *KeyMadeError naming the key. The console passes its key form's
	// one-time token: a note of the key a form made can be lost (NATS
	// failing after the key was shown), the key cannot.
	IdempotencyKey string
}

// KeyMadeError is CreateKey's answer to a request whose IdempotencyKey
// made a key before: no other key was made, and KeyID is the one made.
type KeyMadeError struct {
	Account, KeyID string
}

func (e *KeyMadeError) Error() string {
	return fmt.Sprintf("%v: account %s made key %s with this idempotency key before", ErrExists, e.Account, e.KeyID)
}

func (e *KeyMadeError) Unwrap() error { return ErrExists }

// KeyStoreError is CreateKey's error when storing the key failed. The key
// may have been made all the same (a write that timed out can land, with
// 2 of 3 NATS nodes down it did once they were back), its secret never
// shown: KeyID names it, for the caller to say where to look.
type KeyStoreError struct {
	KeyID string
	Err   error
}

func (e *KeyStoreError) Error() string { return fmt.Sprintf("storing key %s: %v", e.KeyID, e.Err) }

func (e *KeyStoreError) Unwrap() error { return e.Err }

// KeyInfo is a key's metadata as stored in TOLLGATE_KEYS. It never holds the
// token: a lost key cannot be recovered, only replaced.
type KeyInfo struct {
	KeyID     string     `json:"key_id"`
	Account   string     `json:"account"`
	Name      string     `json:"name"`
	Scopes    []string   `json:"scopes"`
	Models    []string   `json:"models"`
	RPM       int64      `json:"rpm"`
	TPM       int64      `json:"tpm"`
	Logging   Logging    `json:"logging"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at"`
	RevokedAt *time.Time `json:"revoked_at"`
}

// keyClaims is the token payload: the registered claims (iss, sub = account,
// jti = key id, iat, exp) plus the key's limits, so a gateway needs only the
// token and the revocation list to serve a request.
type keyClaims struct {
	jwt.RegisteredClaims
	Name   string   `json:"name,omitempty"`
	Scopes []string `json:"scp,omitempty"`
	Models []string `json:"mdl,omitempty"`
	RPM    int64    `json:"rpm,omitempty"`
	TPM    int64    `json:"tpm,omitempty"`
}

// The bounds of a key request. CreateKey enforces them for every caller;
// the admin API and the console check them first (admin.CheckKeyRequest)
// so a person sees which field to fix.
const (
	// MaxKeyNameLen is the longest key name, in bytes: the name travels in
	// every key's token.
	MaxKeyNameLen = 200
	// MaxRetentionDays is the longest request-log retention (100 years);
	// 0 keeps logged calls with no expiry: deleting the key leaves them.
	MaxRetentionDays = 36_500
	// MaxKeyLifetime is the longest a key may be asked to live (about 292
	// years): whole hours below the longest time.Duration, so that the
	// expiry, rounded up to a second, cannot overflow. Up to a second
	// below the longest, it did: "2562047h47m16s" made a key that
	// expired in 1734, refused at once yet counted against
	// auth.max_keys_per_account.
	MaxKeyLifetime = 2_562_047 * time.Hour
)

const (
	maxCacheSize   = 10_000
	keyIDRandBytes = 10 // 16 base32 characters, 80 bits
	// unseenKeyWait bounds how long Verify waits for the watch to deliver
	// a key this gateway has not seen (milliseconds, normally).
	unseenKeyWait = time.Second
)

var keyIDEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// CreateKey issues a key for an existing account and returns its metadata
// and the token. The token is shown to the caller once and stored nowhere.
// An account holding req.MaxKeys keys not revoked gets ErrTooManyKeys;
// one that made req.MaxCreatedPerHour keys so limited in the last hour,
// a *KeyRateError; one whose req.IdempotencyKey made a key before, a
// *KeyMadeError.
func (s *Service) CreateKey(ctx context.Context, account string, req KeyRequest) (KeyInfo, string, error) {
	if s.signer == nil {
		return KeyInfo{}, "", errNoSigningKey
	}
	if err := validateKeyRequest(&req); err != nil {
		return KeyInfo{}, "", err
	}
	if _, _, err := s.getAccount(ctx, account); err != nil {
		return KeyInfo{}, "", err
	}
	// One creation at a time in this process, so that keys asked for at
	// once through this gateway cannot all pass the count before any is
	// stored; other gateways' keys count once the watch delivers them
	// (milliseconds), so the cap can be passed by about one key per
	// gateway creating keys of the account at that moment.
	s.createKeyMu.Lock()
	defer s.createKeyMu.Unlock()
	keyID, err := newKeyID(account, req.IdempotencyKey)
	if err != nil {
		return KeyInfo{}, "", err
	}
	// Before the caps: the request sent again is told of its key, not
	// that the account may make no more.
	if req.IdempotencyKey != "" {
		if made, ok := s.snap.key(keyID); ok && made.Account == account {
			return KeyInfo{}, "", &KeyMadeError{Account: account, KeyID: keyID}
		}
	}
	if held := s.snap.keysNotRevoked(account); req.MaxKeys > 0 && held >= req.MaxKeys {
		return KeyInfo{}, "", fmt.Errorf("%w: account %s holds %d keys not revoked, and auth.max_keys_per_account is %d", ErrTooManyKeys, account, held, req.MaxKeys)
	}
	// Revoked keys stay stored: the count cap alone let a loop of
	// create and revoke grow the keys bucket, and every gateway's copy of
	// it, without end.
	if req.MaxCreatedPerHour > 0 {
		made, wait, err := s.keysCreated.Take(ctx, account, req.MaxCreatedPerHour)
		if err != nil {
			return KeyInfo{}, "", err
		}
		if wait > 0 {
			return KeyInfo{}, "", &KeyRateError{Account: account, Made: made, Limit: req.MaxCreatedPerHour, Wait: wait}
		}
	}
	// JWT times have whole seconds; the metadata carries the same instants.
	calledAt := time.Now().UTC()
	now := calledAt.Truncate(time.Second)
	info := KeyInfo{
		KeyID:     keyID,
		Account:   account,
		Name:      req.Name,
		Scopes:    req.Scopes,
		Models:    req.Models,
		RPM:       req.RPM,
		TPM:       req.TPM,
		Logging:   req.Logging,
		CreatedAt: now,
	}
	claims := keyClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:   s.issuer,
			Subject:  account,
			ID:       info.KeyID,
			IssuedAt: jwt.NewNumericDate(now),
		},
		Name:   req.Name,
		Scopes: req.Scopes,
		Models: req.Models,
		RPM:    req.RPM,
		TPM:    req.TPM,
	}
	if req.ExpiresIn > 0 {
		exp := keyExpiry(calledAt, req.ExpiresIn)
		info.ExpiresAt = &exp
		claims.ExpiresAt = jwt.NewNumericDate(exp)
	}
	signed, err := jwt.NewWithClaims(jwt.SigningMethodEdDSA, claims).SignedString(s.signer)
	if err != nil {
		return KeyInfo{}, "", fmt.Errorf("signing key: %w", err)
	}
	data, err := json.Marshal(&info)
	if err != nil {
		return KeyInfo{}, "", fmt.Errorf("encoding key %s: %w", info.KeyID, err)
	}
	// The metadata is stored before the token is handed out: a token whose
	// metadata is missing would be refused as an unknown key.
	rev, err := s.keys.Create(ctx, info.KeyID, data)
	if errors.Is(err, jetstream.ErrKeyExists) && req.IdempotencyKey != "" {
		// Made through another gateway, not seen here yet, or by a send of
		// this request that gave up waiting for the store but landed.
		return KeyInfo{}, "", &KeyMadeError{Account: account, KeyID: info.KeyID}
	}
	if err != nil {
		return KeyInfo{}, "", &KeyStoreError{KeyID: info.KeyID, Err: err}
	}
	stored := info
	s.snap.putKey(info.KeyID, rev, &stored, false)
	return info, TokenPrefix + signed, nil
}

// newKeyID is a random key id, or with an idempotency key one derived
// from it and the account: the same request always names the same key,
// and the id tells nothing of the idempotency key.
func newKeyID(account, idempotencyKey string) (string, error) {
	if idempotencyKey != "" {
		sum := sha256.Sum256([]byte("tollgate key id\x00" + account + "\x00" + idempotencyKey))
		return "key_" + keyIDEncoding.EncodeToString(sum[:keyIDRandBytes]), nil
	}
	var random [keyIDRandBytes]byte
	if _, err := rand.Read(random[:]); err != nil {
		return "", fmt.Errorf("generating key id: %w", err)
	}
	return "key_" + keyIDEncoding.EncodeToString(random[:]), nil
}

// keyExpiry is when a key asked to live for d, issued at calledAt, expires.
// JWT expiry is in whole seconds: rounded up from the call's own instant,
// not from its whole second, so a key lasts at least what was asked ("1s"
// once lasted under a second, and was sometimes dead on arrival).
func keyExpiry(calledAt time.Time, d time.Duration) time.Time {
	return calledAt.Add(d + time.Second - 1).Truncate(time.Second)
}

func validateKeyRequest(req *KeyRequest) error {
	if len(req.Name) > MaxKeyNameLen {
		return fmt.Errorf("%w: key name longer than %d bytes", ErrInvalidInput, MaxKeyNameLen)
	}
	for _, sc := range req.Scopes {
		if !slices.Contains(AllScopes, sc) {
			return fmt.Errorf("%w: unknown scope %q, want one of %s", ErrInvalidInput, sc, strings.Join(AllScopes, ", "))
		}
	}
	for _, m := range req.Models {
		if m == "" {
			return fmt.Errorf("%w: empty model id in models", ErrInvalidInput)
		}
	}
	if req.RPM < 0 || req.TPM < 0 {
		return fmt.Errorf("%w: rpm and tpm must not be negative (0 = no per-key limit)", ErrInvalidInput)
	}
	if req.ExpiresIn < 0 {
		return fmt.Errorf("%w: expiry must not be negative (0 = never expires)", ErrInvalidInput)
	}
	if req.ExpiresIn > MaxKeyLifetime {
		return fmt.Errorf("%w: a key lives at most %s (about 292 years), asked for %s", ErrInvalidInput, MaxKeyLifetime, req.ExpiresIn)
	}
	if len(req.IdempotencyKey) > MaxIdempotencyKey {
		return fmt.Errorf("%w: the idempotency key has %d bytes, at most %d", ErrInvalidInput, len(req.IdempotencyKey), MaxIdempotencyKey)
	}
	if req.Logging.RetentionDays < 0 || req.Logging.RetentionDays > MaxRetentionDays {
		return fmt.Errorf("%w: logging retention_days must be 0-%d", ErrInvalidInput, MaxRetentionDays)
	}
	// Sorted and deduplicated so equal requests give equal keys; copied so
	// the caller's slices are not shared with the stored key.
	req.Scopes = sortedUnique(req.Scopes)
	req.Models = sortedUnique(req.Models)
	return nil
}

func sortedUnique(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	out := slices.Clone(in)
	slices.Sort(out)
	return slices.Compact(out)
}

// ListKeys returns the account's keys, revoked ones included, oldest first.
// It waits until this gateway has seen every key written before the call.
func (s *Service) ListKeys(ctx context.Context, account string) ([]KeyInfo, error) {
	if err := ValidateAccountID(account); err != nil {
		return nil, err
	}
	if err := s.WaitSynced(ctx); err != nil {
		return nil, fmt.Errorf("listing keys of %s: %w", account, err)
	}
	keys := s.snap.keysOf(account)
	slices.SortFunc(keys, func(a, b KeyInfo) int { return byCreation(&a, &b) })
	return keys, nil
}

// byCreation orders keys as they are listed: oldest first, by id within
// one instant.
func byCreation(a, b *KeyInfo) int {
	if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
		return c
	}
	return strings.Compare(a.KeyID, b.KeyID)
}

// ListRecentKeys is the account's keys not revoked, oldest first, then at
// most revokedShown of its revoked keys, the latest revoked first, and how
// many revoked keys it left out. Revoked keys stay stored and nothing
// bounds their number (a console user can revoke 2,400 a day); the keys
// not revoked are bounded by auth.max_keys_per_account, so what a page
// built from this shows is too.
//
// It reads the snapshot and does no I/O, so a key made or revoked through
// another gateway shows once the watch delivers it, in milliseconds (see
// AwaitKeyRevoked). Waiting for the buckets' last revisions first, as
// ListKeys does, asked each bucket's stream leader: the console's keys
// page hung 10 s and was a 503 while a lost leader was replaced.
func (s *Service) ListRecentKeys(account string, revokedShown int) ([]KeyInfo, int, error) {
	if err := ValidateAccountID(account); err != nil {
		return nil, 0, err
	}
	live, revoked := s.snap.keysOfSplit(account)
	slices.SortFunc(live, byCreation)
	slices.SortFunc(revoked, func(a, b *KeyInfo) int {
		if c := b.RevokedAt.Compare(*a.RevokedAt); c != 0 {
			return c
		}
		return strings.Compare(a.KeyID, b.KeyID)
	})
	hidden := max(len(revoked)-max(revokedShown, 0), 0)
	revoked = revoked[:len(revoked)-hidden]
	out := make([]KeyInfo, 0, len(live)+len(revoked))
	for _, k := range live {
		out = append(out, *k)
	}
	for _, k := range revoked {
		out = append(out, *k)
	}
	return out, hidden, nil
}

// KeysWithNoModelServed lists the keys neither revoked nor expired that
// are limited to models none of which served says the gateway serves:
// keys every call of which is refused, whose models left gateway.yaml.
// Oldest first. It reads the snapshot and does no I/O.
func (s *Service) KeysWithNoModelServed(served func(model string) bool) []KeyInfo {
	now := time.Now()
	var out []KeyInfo
	s.snap.mu.RLock()
	for _, e := range s.snap.keys {
		info := e.info
		if !e.notRevoked() || len(info.Models) == 0 || info.ExpiresAt != nil && !now.Before(*info.ExpiresAt) ||
			slices.ContainsFunc(info.Models, served) {
			continue
		}
		out = append(out, *info)
	}
	s.snap.mu.RUnlock()
	slices.SortFunc(out, func(a, b KeyInfo) int { return byCreation(&a, &b) })
	return out
}

// AwaitKeyRevoked waits up to d for this gateway's snapshot to show key
// keyID revoked, when it holds the key not revoked, and says whether it
// shows the key revoked then. It does no I/O: a key revoked through
// another gateway a moment ago shows so once the watch delivers the
// revocation.
func (s *Service) AwaitKeyRevoked(keyID string, d time.Duration) bool {
	if info, ok := s.snap.key(keyID); !ok || info.RevokedAt != nil {
		return ok
	}
	s.snap.awaitKey(keyID, d, func(e keyEntry, seen bool) bool {
		return !seen || e.deleted || e.info.RevokedAt != nil
	})
	info, ok := s.snap.key(keyID)
	return ok && info.RevokedAt != nil
}

// KeyInfo is the key's metadata as last seen by this gateway. It never does
// I/O. The returned slices are shared: do not modify them.
func (s *Service) KeyInfo(keyID string) (KeyInfo, bool) {
	info, ok := s.snap.key(keyID)
	if !ok {
		return KeyInfo{}, false
	}
	return *info, true
}

// LookupKey is the key's metadata, revoked or not, as ListKeys shows it:
// it waits until this gateway has seen every key written before the call,
// so a key just made or revoked through another gateway is seen as it is.
// An id no key has is ErrNotFound. The returned slices are shared: do not
// modify them.
func (s *Service) LookupKey(ctx context.Context, keyID string) (KeyInfo, error) {
	if err := s.WaitSynced(ctx); err != nil {
		return KeyInfo{}, fmt.Errorf("reading key %s: %w", keyID, err)
	}
	info, ok := s.snap.key(keyID)
	if !ok {
		return KeyInfo{}, fmt.Errorf("key %s: %w", keyID, ErrNotFound)
	}
	return *info, nil
}

// RevokeKey marks the key revoked; every gateway refuses it within a second.
// Revoking a revoked key changes nothing and is not an error.
func (s *Service) RevokeKey(ctx context.Context, keyID string) (KeyInfo, error) {
	for {
		entry, err := s.keys.Get(ctx, keyID)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
			return KeyInfo{}, fmt.Errorf("key %s: %w", keyID, ErrNotFound)
		}
		if err != nil {
			return KeyInfo{}, fmt.Errorf("reading key %s: %w", keyID, err)
		}
		var info KeyInfo
		if err := json.Unmarshal(entry.Value(), &info); err != nil {
			return KeyInfo{}, fmt.Errorf("decoding key %s: %w", keyID, err)
		}
		if info.RevokedAt != nil {
			return info, nil
		}
		now := time.Now().UTC()
		info.RevokedAt = &now
		data, err := json.Marshal(&info)
		if err != nil {
			return KeyInfo{}, fmt.Errorf("encoding key %s: %w", keyID, err)
		}
		rev, err := s.keys.Update(ctx, keyID, data, entry.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // changed meanwhile; re-read
		}
		if err != nil {
			return KeyInfo{}, fmt.Errorf("revoking key %s: %w", keyID, err)
		}
		stored := info
		s.snap.putKey(keyID, rev, &stored, false)
		return info, nil
	}
}

// Verify checks an API key: "tg-" prefix, EdDSA signature by this
// deployment's signing key, issuer, expiry, and that its metadata exists and
// is not revoked in this gateway's snapshot. Failures wrap ErrInvalidKey.
//
// Verify does no I/O. A token verified once is cached (up to 10,000 of
// them, one dropped at random for each new one past that), so repeat
// calls skip the signature check and do not allocate; expiry and
// revocation are still checked on every call. token is not retained: the
// caller may reuse its buffer.
//
// A token with a valid signature whose key this gateway has not seen is
// a key made a moment ago through another gateway, whose metadata the
// watch has not delivered yet: Verify waits for it, up to a second,
// before answering "unknown key" (it did at once, to 3 calls in 40 made
// right after their key on a cluster). Only this deployment's signing
// key makes such tokens, so nobody else can make a call wait.
func (s *Service) Verify(token []byte) (*Key, error) {
	if s.verifier == nil {
		return nil, errNoSigningKey
	}
	if !bytes.HasPrefix(token, []byte(TokenPrefix)) {
		return nil, errMissingPrefix
	}
	now := time.Now()
	s.cacheMu.RLock()
	k := s.cache[string(token)]
	s.cacheMu.RUnlock()
	if k != nil {
		if err := s.checkLive(k, now); err != nil {
			return nil, err
		}
		return k, nil
	}

	k, err := s.verifySignature(string(token[len(TokenPrefix):]))
	if err != nil {
		return nil, err
	}
	err = s.checkLive(k, now)
	if err == errUnknownKey && s.snap.awaitUnseenKey(k.ID, unseenKeyWait) {
		err = s.checkLive(k, time.Now())
	}
	if err != nil {
		return nil, err
	}
	s.cacheMu.Lock()
	if len(s.cache) >= maxCacheSize {
		// One entry goes, wherever the map's iteration starts (at random).
		// Clearing it whole made a gateway with more keys in use than it
		// holds check a signature on most calls after each clear; now the
		// share of calls that hit stays about maxCacheSize/keys in use.
		for old := range s.cache {
			delete(s.cache, old)
			break
		}
	}
	s.cache[string(token)] = k
	s.cacheMu.Unlock()
	return k, nil
}

// verifySignature parses and verifies the JWT and its registered claims.
func (s *Service) verifySignature(raw string) (*Key, error) {
	var claims keyClaims
	token, err := s.parser.ParseWithClaims(raw, &claims, func(*jwt.Token) (any, error) {
		return s.verifier, nil
	})
	switch {
	case err == nil:
	case token != nil && token.Method != nil && token.Method.Alg() != s.algorithm,
		errors.Is(err, jwt.ErrTokenUnverifiable):
		return nil, errWrongAlgorithm
	case errors.Is(err, jwt.ErrTokenMalformed):
		return nil, errMalformed
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return nil, errBadSignature
	case errors.Is(err, jwt.ErrTokenExpired):
		return nil, errExpired
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return nil, errNotYetValid
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return nil, errWrongIssuer
	default:
		return nil, errBadClaims
	}
	if claims.ID == "" || claims.Subject == "" {
		return nil, errMalformed
	}
	k := &Key{
		ID:      claims.ID,
		Account: claims.Subject,
		Name:    claims.Name,
		Scopes:  claims.Scopes,
		Models:  claims.Models,
		RPM:     claims.RPM,
		TPM:     claims.TPM,
	}
	if claims.ExpiresAt != nil {
		k.ExpiresAt = claims.ExpiresAt.Time
	}
	return k, nil
}

// checkLive is the part of verification that can change after a token was
// issued: time passing and the snapshot of key metadata.
func (s *Service) checkLive(k *Key, now time.Time) error {
	if !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt) {
		return errExpired
	}
	info, ok := s.snap.key(k.ID)
	if !ok || info.Account != k.Account {
		return errUnknownKey
	}
	if info.RevokedAt != nil {
		return ErrRevoked
	}
	return nil
}
