package accounts

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/money"
)

func TestKeyRoundTrip(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 5*money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	req := KeyRequest{
		Name:      "ci",
		Scopes:    []string{ScopeGenerate, ScopeBatch, ScopeGenerate},
		Models:    []string{"small", "big"},
		RPM:       60,
		TPM:       100_000,
		ExpiresIn: time.Hour,
		Logging:   Logging{Enabled: true, RetentionDays: 7},
	}
	info, token, err := s.CreateKey(ctx, "acme", req)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(token, TokenPrefix) {
		t.Fatalf("token %q lacks the %s prefix", token, TokenPrefix)
	}
	if !strings.HasPrefix(info.KeyID, "key_") || len(info.KeyID) != len("key_")+16 {
		t.Errorf("key id %q, want key_ and 16 characters", info.KeyID)
	}

	k, err := s.Verify([]byte(token))
	if err != nil {
		t.Fatalf("Verify of a fresh key: %v", err)
	}
	if k.ID != info.KeyID || k.Account != "acme" || k.Name != "ci" || k.RPM != 60 || k.TPM != 100_000 {
		t.Errorf("verified key = %+v, want id %s account acme name ci rpm 60 tpm 100000", k, info.KeyID)
	}
	if !slices.Equal(k.Scopes, []string{ScopeBatch, ScopeGenerate}) {
		t.Errorf("scopes = %v, want [batch generate] (sorted, deduplicated)", k.Scopes)
	}
	if !k.HasScope(ScopeGenerate) || k.HasScope(ScopeClassify) {
		t.Errorf("HasScope wrong for scopes %v", k.Scopes)
	}
	if !k.AllowsModel("big") || k.AllowsModel("other") {
		t.Errorf("AllowsModel wrong for models %v", k.Models)
	}
	if info.ExpiresAt == nil || !k.ExpiresAt.Equal(*info.ExpiresAt) {
		t.Errorf("key expires %v, metadata says %v", k.ExpiresAt, info.ExpiresAt)
	}
	if until := time.Until(k.ExpiresAt); until < 58*time.Minute || until > time.Hour+time.Second {
		t.Errorf("key expires in %s, want about 1h", until)
	}

	again, err := s.Verify([]byte(token))
	if err != nil || again != k {
		t.Errorf("second Verify = %p, %v; want the cached %p", again, err, k)
	}

	got, ok := s.KeyInfo(info.KeyID)
	if !ok || got.Logging != (Logging{Enabled: true, RetentionDays: 7}) || got.Account != "acme" {
		t.Errorf("KeyInfo = %+v, %v", got, ok)
	}
	// The token is stored nowhere.
	entry, err := s.keys.Get(ctx, info.KeyID)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(entry.Value()), strings.Split(token, ".")[2]) {
		t.Error("stored key metadata contains the token's signature")
	}

	all := &Key{}
	if !all.HasScope(ScopeConsole) || !all.AllowsModel("anything") {
		t.Error("a key without scopes or models must allow everything")
	}
}

func TestListKeysOldestFirst(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	for _, id := range []string{"a", "b"} {
		if _, err := s.CreateAccount(ctx, id, 0); err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for i := range 3 {
		info, _, err := s.CreateKey(ctx, "a", KeyRequest{Name: string(rune('x' + i))})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, info.KeyID)
	}
	if _, _, err := s.CreateKey(ctx, "b", KeyRequest{}); err != nil {
		t.Fatal(err)
	}
	keys, err := s.ListKeys(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range keys {
		got = append(got, k.KeyID)
	}
	// Keys made within one second tie on created_at (whole seconds); the
	// order then follows key ids, so compare as sets plus sortedness.
	if !sameSet(got, want) {
		t.Fatalf("ListKeys(a) = %v, want %v", got, want)
	}
	for i := 1; i < len(keys); i++ {
		if keys[i].CreatedAt.Before(keys[i-1].CreatedAt) {
			t.Errorf("keys not sorted by created_at: %v", keys)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func TestCreateKeyRefusesBadRequests(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, _, err := s.CreateKey(ctx, "nobody", KeyRequest{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("key for a missing account: %v, want ErrNotFound", err)
	}
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	for name, req := range map[string]KeyRequest{
		"unknown scope":   {Scopes: []string{"admin"}},
		"negative rpm":    {RPM: -1},
		"negative expiry": {ExpiresIn: -time.Second},
		// Its expiry overflowed into 1734: a key dead on arrival.
		"expiry past MaxKeyLifetime": {ExpiresIn: MaxKeyLifetime + time.Second},
		"longest duration":           {ExpiresIn: math.MaxInt64},
		"negative retention":         {Logging: Logging{RetentionDays: -1}},
		"empty model":                {Models: []string{""}},
	} {
		if _, _, err := s.CreateKey(ctx, "acme", req); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: %v, want ErrInvalidInput", name, err)
		}
	}
	if _, err := s.RevokeKey(ctx, "key_doesnotexist"); !errors.Is(err, ErrNotFound) {
		t.Errorf("revoking a missing key: %v, want ErrNotFound", err)
	}
}

// TestKeyCapCountsKeysNotRevoked: one console login made 29,025 keys in
// 9.5 s, every one held in every gateway's memory. An account holds at
// most MaxKeys keys that are not revoked, expired ones included (they
// stay listed and stored until revoked); revoking one frees its place.
func TestKeyCapCountsKeysNotRevoked(t *testing.T) {
	s, b, dataDir := gateway(t)
	ctx := testContext(t)
	for _, id := range []string{"acme", "other"} {
		if _, err := s.CreateAccount(ctx, id, 0); err != nil {
			t.Fatal(err)
		}
	}
	capped := KeyRequest{MaxKeys: 3}
	var first KeyInfo
	for i := range 2 {
		info, _, err := s.CreateKey(ctx, "acme", capped)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = info
		}
	}
	_, shortLived, err := s.CreateKey(ctx, "acme", KeyRequest{MaxKeys: 3, ExpiresIn: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = s.CreateKey(ctx, "acme", capped)
	if !errors.Is(err, ErrTooManyKeys) || !strings.Contains(err.Error(), "auth.max_keys_per_account") || !strings.Contains(err.Error(), "3") {
		t.Fatalf("a fourth key under a cap of 3: %v; want ErrTooManyKeys naming the setting and the cap", err)
	}
	if _, _, err := s.CreateKey(ctx, "other", capped); err != nil {
		t.Errorf("another account's first key: %v", err)
	}
	if _, _, err := s.CreateKey(ctx, "acme", KeyRequest{}); err != nil {
		t.Errorf("no cap (MaxKeys 0): %v", err)
	}
	checkFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		if _, err := s.Verify([]byte(shortLived)); !errors.Is(err, errExpired) {
			return errors.New("the short-lived key has not expired yet")
		}
		return nil
	})
	if _, _, err := s.CreateKey(ctx, "acme", KeyRequest{MaxKeys: 4}); !errors.Is(err, ErrTooManyKeys) {
		t.Errorf("an expired key not revoked must still count: %v", err)
	}
	if _, err := s.RevokeKey(ctx, first.KeyID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreateKey(ctx, "acme", KeyRequest{MaxKeys: 4}); err != nil {
		t.Errorf("after a revocation freed a place: %v", err)
	}

	// Another gateway counts the keys this one made, once its watch has
	// them.
	other := secondGateway(t, b, dataDir)
	if err := other.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.CreateKey(ctx, "acme", KeyRequest{MaxKeys: 4}); !errors.Is(err, ErrTooManyKeys) {
		t.Errorf("a second gateway: %v, want ErrTooManyKeys", err)
	}
}

// TestKeysCreatedPerHourCountRevokedOnes: a loop of create and revoke
// stayed under the count cap and grew the key store without end, since
// revoked keys stay stored. A path that asks for it (the console) may make
// at most MaxCreatedPerHour keys an hour, revoked ones included, on every
// gateway; a path that does not (the admin API) is neither limited nor
// counted.
func TestKeysCreatedPerHourCountRevokedOnes(t *testing.T) {
	s, b, dataDir := gateway(t)
	ctx := testContext(t)
	for _, id := range []string{"acme", "other"} {
		if _, err := s.CreateAccount(ctx, id, 0); err != nil {
			t.Fatal(err)
		}
	}
	limited := KeyRequest{MaxKeys: 1, MaxCreatedPerHour: 3}
	for i := range 3 {
		info, _, err := s.CreateKey(ctx, "acme", limited)
		if err != nil {
			t.Fatalf("key %d: %v", i+1, err)
		}
		if _, err := s.RevokeKey(ctx, info.KeyID); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err := s.CreateKey(ctx, "acme", limited)
	var rate *KeyRateError
	if !errors.As(err, &rate) || !errors.Is(err, ErrKeysCreatedTooFast) || rate.Made != 3 || rate.Limit != 3 ||
		rate.Wait <= 0 || rate.Wait > time.Hour || !strings.Contains(err.Error(), "auth.max_keys_created_per_hour") {
		t.Fatalf("a fourth key in the hour, the three before revoked: %v; want a KeyRateError naming the setting, with a wait within the hour", err)
	}
	if _, _, err := s.CreateKey(ctx, "other", limited); err != nil {
		t.Errorf("another account's first key: %v", err)
	}
	for range 2 {
		if _, _, err := s.CreateKey(ctx, "acme", KeyRequest{}); err != nil {
			t.Fatalf("a key without the limit (the admin API's): %v", err)
		}
	}
	other := secondGateway(t, b, dataDir)
	if _, _, err := other.CreateKey(ctx, "acme", KeyRequest{MaxCreatedPerHour: 3}); !errors.As(err, &rate) || rate.Made != 3 {
		t.Errorf("through a second gateway: %v, want the same refusal (the admin API's keys not counted)", err)
	}
}

// signingKey reads the gateway's private key, to mint tokens the service
// did not issue through CreateKey.
func signingKey(t *testing.T, dataDir string) ed25519.PrivateKey {
	t.Helper()
	key, err := readSigningKey(filepath.Join(dataDir, SigningKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func mint(t *testing.T, method jwt.SigningMethod, key any, claims jwt.Claims) string {
	t.Helper()
	signed, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return TokenPrefix + signed
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func TestForgedKeysRejected(t *testing.T) {
	s, _, dataDir := gateway(t)
	ctx := testContext(t)
	for _, id := range []string{"victim", "attacker"} {
		if _, err := s.CreateAccount(ctx, id, money.NanosPerUSD); err != nil {
			t.Fatal(err)
		}
	}
	info, token, err := s.CreateKey(ctx, "attacker", KeyRequest{Scopes: []string{ScopeClassify}})
	if err != nil {
		t.Fatal(err)
	}
	ours := signingKey(t, dataDir)
	_, stranger, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Now()
	valid := func() keyClaims {
		return keyClaims{RegisteredClaims: jwt.RegisteredClaims{
			Issuer: testAuth.Issuer, Subject: "attacker", ID: info.KeyID, IssuedAt: jwt.NewNumericDate(now),
		}}
	}
	withClaims := func(edit func(*keyClaims)) keyClaims { c := valid(); edit(&c); return c }
	parts := strings.Split(strings.TrimPrefix(token, TokenPrefix), ".")

	// Sanity: a token minted here with our key and valid claims passes, so
	// every refusal below is due to the one thing each case changes.
	if _, err := s.Verify([]byte(mint(t, jwt.SigningMethodEdDSA, ours, valid()))); err != nil {
		t.Fatalf("control token refused: %v", err)
	}

	escalated, _ := json.Marshal(withClaims(func(c *keyClaims) { c.Subject = "victim"; c.Scopes = nil }))
	cases := []struct {
		name, token, reason string
	}{
		{"tampered payload", TokenPrefix + parts[0] + "." + b64(string(escalated)) + "." + parts[2], "bad signature"},
		{"tampered signature", TokenPrefix + parts[0] + "." + parts[1] + "." + b64("0123456789012345678901234567890123456789012345678901234567890123"), "bad signature"},
		{"other ed25519 key", mint(t, jwt.SigningMethodEdDSA, stranger, valid()), "bad signature (a key made by another gateway or data_dir, whose signing.key differs"},
		{"alg none", mint(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, valid()), "wrong algorithm"},
		{"alg none, empty signature kept", TokenPrefix + b64(`{"alg":"none","typ":"JWT"}`) + "." + parts[1] + ".", "wrong algorithm"},
		{"HS256 keyed with our public key", mint(t, jwt.SigningMethodHS256, []byte(ours.Public().(ed25519.PublicKey)), valid()), "wrong algorithm"},
		{"RS256 header", TokenPrefix + b64(`{"alg":"RS256","typ":"JWT"}`) + "." + parts[1] + "." + parts[2], "wrong algorithm"},
		{"unknown alg", TokenPrefix + b64(`{"alg":"XX999","typ":"JWT"}`) + "." + parts[1] + "." + parts[2], "wrong algorithm"},
		{"expired", mint(t, jwt.SigningMethodEdDSA, ours, withClaims(func(c *keyClaims) { c.ExpiresAt = jwt.NewNumericDate(now.Add(-time.Minute)) })), "expired"},
		{"wrong issuer", mint(t, jwt.SigningMethodEdDSA, ours, withClaims(func(c *keyClaims) { c.Issuer = "someone-else" })), "wrong issuer"},
		{"no issuer", mint(t, jwt.SigningMethodEdDSA, ours, withClaims(func(c *keyClaims) { c.Issuer = "" })), "invalid claims"},
		{"not yet valid", mint(t, jwt.SigningMethodEdDSA, ours, withClaims(func(c *keyClaims) { c.NotBefore = jwt.NewNumericDate(now.Add(time.Hour)) })), "not valid yet"},
		{"unknown key id", mint(t, jwt.SigningMethodEdDSA, ours, withClaims(func(c *keyClaims) { c.ID = "key_neverissued" })), "unknown key"},
		{"key id of another account", mint(t, jwt.SigningMethodEdDSA, ours, withClaims(func(c *keyClaims) { c.Subject = "victim" })), "unknown key"},
		{"no key id", mint(t, jwt.SigningMethodEdDSA, ours, withClaims(func(c *keyClaims) { c.ID = "" })), "malformed"},
		{"missing tg- prefix", strings.TrimPrefix(token, TokenPrefix), "missing"},
		{"other prefix", "sk-" + strings.TrimPrefix(token, TokenPrefix), "missing"},
		{"garbage", TokenPrefix + "garbage", "malformed"},
		{"garbage segments", TokenPrefix + "a.b.c", "malformed"},
		{"empty", "", "missing"},
		{"prefix only", TokenPrefix, "malformed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k, err := s.Verify([]byte(c.token))
			if err == nil {
				t.Fatalf("accepted as %+v", k)
			}
			if !errors.Is(err, ErrInvalidKey) {
				t.Errorf("error %v does not wrap ErrInvalidKey", err)
			}
			if !strings.Contains(err.Error(), c.reason) {
				t.Errorf("error %q, want it to say %q", err, c.reason)
			}
		})
	}
}

// TestKeyHasOneSpelling: base64 lets the last character of a segment
// carry bits that decode to nothing, so one signed key had up to 16
// spellings, each accepted and each given its own verification-cache entry.
func TestKeyHasOneSpelling(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	_, token, err := s.CreateKey(ctx, "acme", KeyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Verify([]byte(token)); err != nil {
		t.Fatalf("the key as issued: %v", err)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, token[len(token)-1])
	// An Ed25519 signature is 64 bytes, 86 characters: the last one
	// carries 2 bits of it and 4 that must be zero.
	spellings := 0
	for i := range len(alphabet) {
		if i == last || i>>4 != last>>4 {
			continue
		}
		spellings++
		other := token[:len(token)-1] + alphabet[i:i+1]
		if k, err := s.Verify([]byte(other)); !errors.Is(err, errMalformed) {
			t.Errorf("signature ending %q instead of %q: Verify = %+v, %v; want malformed", alphabet[i], token[len(token)-1], k, err)
		}
	}
	if spellings != 15 {
		t.Fatalf("tried %d other spellings, want 15", spellings)
	}
	s.cacheMu.RLock()
	cached := len(s.cache)
	s.cacheMu.RUnlock()
	if cached != 1 {
		t.Errorf("%d tokens cached, want the one spelling issued", cached)
	}
}

func TestExpiryCheckedOnCacheHit(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	_, token, err := s.CreateKey(ctx, "acme", KeyRequest{ExpiresIn: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Expiry is in whole seconds, rounded up: the key has at least the
	// second it was given (it once had under one, rounded down).
	if _, err := s.Verify([]byte(token)); err != nil {
		t.Fatalf("fresh key with a second to live: %v", err)
	}
	checkFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		if _, err := s.Verify([]byte(token)); !errors.Is(err, errExpired) {
			return errors.New("the cached key is still accepted past its expiry")
		}
		return nil
	})
}

func TestRevokedKeyRefusedByOtherGatewayWithinASecond(t *testing.T) {
	a, brokerA, dataDirA := gateway(t)
	b := secondGateway(t, brokerA, dataDirA)
	ctx := testContext(t)
	if _, err := a.CreateAccount(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	info, token, err := a.CreateKey(ctx, "acme", KeyRequest{Name: "leaked"})
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, time.Second, 10*time.Millisecond, func() error {
		_, err := b.Verify([]byte(token))
		return err
	})
	// b now holds the token in its verification cache: revocation must
	// beat the cache.
	revoked, err := a.RevokeKey(ctx, info.KeyID)
	if err != nil {
		t.Fatal(err)
	}
	if revoked.RevokedAt == nil {
		t.Fatal("RevokeKey returned metadata without revoked_at")
	}
	if _, err := a.Verify([]byte(token)); !errors.Is(err, ErrRevoked) {
		t.Errorf("revoking gateway still accepts the key: %v", err)
	}
	checkFor(t, time.Second, 10*time.Millisecond, func() error {
		if _, err := b.Verify([]byte(token)); !errors.Is(err, ErrRevoked) {
			return errors.New("other gateway still accepts the revoked key")
		}
		return nil
	})
	if again, err := a.RevokeKey(ctx, info.KeyID); err != nil || !again.RevokedAt.Equal(*revoked.RevokedAt) {
		t.Errorf("second revoke = %v, %v; want the first revocation unchanged", again.RevokedAt, err)
	}
	if got, _ := b.KeyInfo(info.KeyID); got.RevokedAt == nil {
		t.Error("other gateway's KeyInfo lacks revoked_at")
	}
}

// A key made through one gateway and used at once through another was a
// 401 "unknown key" when the other's watch had not delivered its
// metadata yet (3 calls in 40 on a 3-node cluster). A token whose
// signature is good waits for the watch, up to a second; forged tokens
// and deleted keys are refused at once, so nobody without the signing
// key can make a call wait.
func TestKeyJustMadeElsewhereIsAcceptedOnceTheWatchDeliversIt(t *testing.T) {
	s, _, dataDir := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	claims := func(id string) keyClaims {
		return keyClaims{RegisteredClaims: jwt.RegisteredClaims{
			Issuer: testAuth.Issuer, Subject: "acme", ID: id, IssuedAt: jwt.NewNumericDate(time.Now()),
		}}
	}
	// The token is handed out by the gateway that stored its metadata; the
	// metadata reaches this one's watch 100 ms later.
	token := mint(t, jwt.SigningMethodEdDSA, signingKey(t, dataDir), claims("key_madeelsewhere"))
	stored := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		data, _ := json.Marshal(KeyInfo{KeyID: "key_madeelsewhere", Account: "acme", CreatedAt: time.Now().UTC()})
		_, err := s.keys.Create(ctx, "key_madeelsewhere", data)
		stored <- err
	}()
	if k, err := s.Verify([]byte(token)); err != nil || k.ID != "key_madeelsewhere" {
		t.Fatalf("a key whose metadata arrives 100 ms after its first call: %+v, %v", k, err)
	}
	if err := <-stored; err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if _, err := s.Verify([]byte(mint(t, jwt.SigningMethodEdDSA, signingKey(t, dataDir), claims("key_neverstored")))); !errors.Is(err, errUnknownKey) {
		t.Fatalf("a key never stored: %v, want unknown key", err)
	}
	if waited := time.Since(start); waited < unseenKeyWait || waited > unseenKeyWait+time.Second {
		t.Fatalf("a key never stored was refused after %s, want about %s", waited, unseenKeyWait)
	}

	_, stranger, _ := ed25519.GenerateKey(rand.Reader)
	forged := mint(t, jwt.SigningMethodEdDSA, stranger, claims("key_neverstored"))
	info, deleted, err := s.CreateKey(ctx, "acme", KeyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.keys.Delete(ctx, info.KeyID); err != nil {
		t.Fatal(err)
	}
	checkFor(t, time.Second, 10*time.Millisecond, func() error {
		if _, ok := s.KeyInfo(info.KeyID); ok {
			return errors.New("the deletion has not reached the snapshot")
		}
		return nil
	})
	for name, token := range map[string]string{"a forged token": forged, "a deleted key": deleted} {
		start := time.Now()
		if _, err := s.Verify([]byte(token)); err == nil {
			t.Fatalf("%s accepted", name)
		}
		// Waiting for the watch takes unseenKeyWait; half of it leaves a
		// busy machine under the race detector room.
		if waited := time.Since(start); waited > unseenKeyWait/2 {
			t.Errorf("%s was refused after %s, want at once", name, waited)
		}
	}
}

// Keys made through one gateway and used at once through another are
// accepted, every one.
func TestKeyMadeOnOneGatewayWorksAtOnceOnAnother(t *testing.T) {
	a, brokerA, dataDirA := gateway(t)
	b := secondGateway(t, brokerA, dataDirA)
	ctx := testContext(t)
	if _, err := a.CreateAccount(ctx, "beta", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		_, token, err := a.CreateKey(ctx, "beta", KeyRequest{Name: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Verify([]byte(token)); err != nil {
			t.Fatalf("key %d of 40, used at once on the other gateway: %v", i+1, err)
		}
	}
}

func TestDeletedKeyMetadataRefusesKey(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	info, token, err := s.CreateKey(ctx, "acme", KeyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Verify([]byte(token)); err != nil {
		t.Fatal(err)
	}
	// An operator removing the entry with nats tools revokes it too.
	if err := s.keys.Delete(ctx, info.KeyID); err != nil {
		t.Fatal(err)
	}
	checkFor(t, time.Second, 10*time.Millisecond, func() error {
		if _, err := s.Verify([]byte(token)); !errors.Is(err, errUnknownKey) {
			return errors.New("key still accepted after its metadata was deleted")
		}
		return nil
	})
}

func TestRestartKeepsSigningKey(t *testing.T) {
	ctx := testContext(t)
	dataDir := t.TempDir()
	b := startBroker(t, dataDir)
	s := openService(t, b, dataDir)
	if _, err := s.CreateAccount(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	_, token, err := s.CreateKey(ctx, "acme", KeyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	b.Close()

	st, err := os.Stat(filepath.Join(dataDir, SigningKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("signing key mode %v, want 0600", st.Mode().Perm())
	}

	b = startBroker(t, dataDir)
	defer b.Close()
	s = openService(t, b, dataDir)
	defer s.Close()
	// Open returns with the snapshot loaded, so no waiting here.
	if _, err := s.Verify([]byte(token)); err != nil {
		t.Fatalf("key issued before the restart: %v", err)
	}
	if bal, ok := s.Balance("acme"); !ok || bal != money.NanosPerUSD {
		t.Errorf("Balance after restart = %s, %v; want 1 USD", bal, ok)
	}
}

func TestCorruptSigningKeyRefused(t *testing.T) {
	dataDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dataDir, SigningKeyFile), []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, dataDir)
	defer b.Close()
	if s, err := Open(testContext(t), b.JetStream(), 1, dataDir, testAuth); err == nil {
		s.Close()
		t.Fatal("Open accepted a corrupt signing key (it must never silently replace it)")
	}
}

func TestOpenRefusesOtherAlgorithms(t *testing.T) {
	dataDir := t.TempDir()
	b := startBroker(t, dataDir)
	defer b.Close()
	for _, alg := range []string{"HS256", "RS256", "none"} {
		if s, err := Open(testContext(t), b.JetStream(), 1, dataDir, config.Auth{Algorithm: alg, Issuer: "x"}); err == nil {
			s.Close()
			t.Errorf("Open accepted auth.algorithm %s", alg)
		}
	}
}

// TestKeyLastsAtLeastWhatWasAsked: a "5s" key asked for at 19:15:04.924
// expired at 19:15:09 (4.08 s), and "1s" keys were refused as expired on
// their first call: the expiry was rounded up from the truncated second.
func TestKeyLastsAtLeastWhatWasAsked(t *testing.T) {
	calledAt := time.Date(2025, 1, 2, 19, 15, 4, 924_000_000, time.UTC)
	for d, want := range map[time.Duration]time.Time{
		time.Second:     time.Date(2025, 1, 2, 19, 15, 6, 0, time.UTC),
		5 * time.Second: time.Date(2025, 1, 2, 19, 15, 10, 0, time.UTC),
		time.Hour:       time.Date(2025, 1, 2, 20, 15, 5, 0, time.UTC),
	} {
		if got := keyExpiry(calledAt, d); !got.Equal(want) {
			t.Errorf("expiry of a %v key asked for at %v: %v, want %v", d, calledAt, got, want)
		}
	}
	if got, want := keyExpiry(calledAt, MaxKeyLifetime), time.Date(2317, 4, 14, 18, 15, 5, 0, time.UTC); !got.Equal(want) {
		t.Errorf("expiry of the longest key asked for at %v: %v, want %v", calledAt, got, want)
	}
	onTheSecond := time.Date(2025, 1, 2, 19, 15, 4, 0, time.UTC)
	if got, want := keyExpiry(onTheSecond, 5*time.Second), onTheSecond.Add(5*time.Second); !got.Equal(want) {
		t.Errorf("expiry of a 5s key asked for on a whole second: %v, want %v", got, want)
	}

	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	info, _, err := s.CreateKey(ctx, "acme", KeyRequest{ExpiresIn: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if info.ExpiresAt == nil || info.ExpiresAt.Before(before.Add(5*time.Second)) {
		t.Errorf("a 5s key asked for at %v expires at %v: under 5 s", before, info.ExpiresAt)
	}
	if !info.CreatedAt.Equal(info.CreatedAt.Truncate(time.Second)) {
		t.Errorf("created_at %v is not a whole second like the token's iat", info.CreatedAt)
	}
}

// An admin reading through one gateway what was just written through
// another sees it: the account listed, the key found and then revoked,
// with no WaitSynced of the test's own. (On loopback the watch is mostly
// quick enough without the methods' wait too: this pins what they
// promise, the wait keeps it on a loaded cluster.)
func TestAccountIDsAndLookupKeySeeAnotherGatewaysWrites(t *testing.T) {
	a, brokerA, dataDirA := gateway(t)
	b := secondGateway(t, brokerA, dataDirA)
	ctx := testContext(t)
	for _, id := range []string{"beta", "Zed", "alpha", "c.d"} {
		if _, err := b.CreateAccount(ctx, id, 0); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := a.AccountIDs(ctx, "")
	if err != nil || strings.Join(ids, " ") != "Zed alpha beta c.d" {
		t.Fatalf("AccountIDs: %q, %v; want them all in byte order", ids, err)
	}
	if ids, err := a.AccountIDs(ctx, "alpha"); err != nil || strings.Join(ids, " ") != "beta c.d" {
		t.Fatalf("AccountIDs after alpha: %q, %v", ids, err)
	}
	if ids, err := a.AccountIDs(ctx, "zzz"); err != nil || len(ids) != 0 {
		t.Fatalf("AccountIDs after the last: %q, %v", ids, err)
	}

	info, _, err := b.CreateKey(ctx, "beta", KeyRequest{Name: "ci"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.LookupKey(ctx, info.KeyID)
	if err != nil || got.Account != "beta" || got.Name != "ci" || got.RevokedAt != nil {
		t.Fatalf("LookupKey: %+v, %v", got, err)
	}
	if _, err := b.RevokeKey(ctx, info.KeyID); err != nil {
		t.Fatal(err)
	}
	if got, err := a.LookupKey(ctx, info.KeyID); err != nil || got.RevokedAt == nil {
		t.Fatalf("LookupKey of a revoked key: %+v, %v; want it, revoked", got, err)
	}
	if _, err := a.LookupKey(ctx, "key_nothing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("LookupKey of an unknown id: %v, want ErrNotFound", err)
	}
}

// The console's key form passes its one-time token as the idempotency
// key: a note of the key a form made can be lost (NATS failing after the
// key was shown), and a form sent again made a second key. With one,
// CreateKey makes at most one key per account and key, on any gateway,
// whether this gateway has seen the key or only the store has, and sent
// again at the key cap names the key rather than refusing it; another
// account with the same key makes its own.
func TestIdempotencyKeyMakesOneKey(t *testing.T) {
	s, b, dataDir := gateway(t)
	ctx := testContext(t)
	for _, id := range []string{"acme", "other"} {
		if _, err := s.CreateAccount(ctx, id, 0); err != nil {
			t.Fatal(err)
		}
	}
	once := KeyRequest{Name: "ci", MaxKeys: 1, IdempotencyKey: "0123456789abcdef0123456789abcdef"}
	made, _, err := s.CreateKey(ctx, "acme", once)
	if err != nil {
		t.Fatal(err)
	}
	other := secondGateway(t, b, dataDir)
	for _, tc := range []struct {
		name string
		via  *Service
		pre  func()
	}{
		{"sent again", s, func() {}},
		{"sent again through another gateway", other, func() {}},
		{"sent again to a gateway that has not seen the key", s, func() { forgetKey(s, made.KeyID) }},
	} {
		tc.pre()
		_, token, err := tc.via.CreateKey(ctx, "acme", once)
		var again *KeyMadeError
		if !errors.As(err, &again) || again.KeyID != made.KeyID || token != "" || !errors.Is(err, ErrExists) {
			t.Errorf("%s: %q, %v; want a *KeyMadeError naming %s", tc.name, token, err, made.KeyID)
		}
	}
	if _, _, err := s.CreateKey(ctx, "other", once); err != nil {
		t.Errorf("another account with the same idempotency key: %v", err)
	}
	// Listed by the gateway that did not forget it.
	if keys, err := other.ListKeys(ctx, "acme"); err != nil || len(keys) != 1 {
		t.Fatalf("%d keys, %v; want the 1 made", len(keys), err)
	}
}

// forgetKey drops a key from the gateway's snapshot, as if its watch had
// not delivered it yet.
func forgetKey(s *Service, id string) {
	s.snap.mu.Lock()
	defer s.snap.mu.Unlock()
	if e, ok := s.snap.keys[id]; ok && e.notRevoked() {
		s.snap.notRevoked[e.info.Account]--
	}
	delete(s.snap.keys, id)
}

// A full verification cache drops one token for a new one. It was
// cleared whole, so with more keys in use than it holds most calls after
// each clear paid a signature check.
func TestFullVerificationCacheDropsOneToken(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	_, token, err := s.CreateKey(ctx, "acme", KeyRequest{Name: "in use", Scopes: []string{ScopeGenerate}})
	if err != nil {
		t.Fatal(err)
	}
	k, err := s.Verify([]byte(token))
	if err != nil {
		t.Fatal(err)
	}
	s.cacheMu.Lock()
	for i := len(s.cache); i < maxCacheSize; i++ {
		s.cache[fmt.Sprintf("tg-other-%d", i)] = k
	}
	s.cacheMu.Unlock()
	_, newcomer, err := s.CreateKey(ctx, "acme", KeyRequest{Name: "new", Scopes: []string{ScopeGenerate}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Verify([]byte(newcomer)); err != nil {
		t.Fatal(err)
	}
	s.cacheMu.RLock()
	defer s.cacheMu.RUnlock()
	if len(s.cache) != maxCacheSize || s.cache[newcomer] == nil {
		t.Errorf("%d tokens cached after a new one joined a full cache (newcomer cached: %v), want %d", len(s.cache), s.cache[newcomer] != nil, maxCacheSize)
	}
}

// A key limited to models that all left gateway.yaml can call nothing; a
// reload says nothing of it unless the gateway can find such keys.
func TestKeysWithNoModelServed(t *testing.T) {
	s, _, _ := gateway(t)
	ctx := testContext(t)
	if _, err := s.CreateAccount(ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	made := map[string]string{}
	for _, req := range []KeyRequest{
		{Name: "stranded", Models: []string{"old", "older"}},
		{Name: "half", Models: []string{"old", "small"}},
		{Name: "all"},
		{Name: "revoked", Models: []string{"old"}},
		{Name: "expired", Models: []string{"old"}, ExpiresIn: time.Second},
	} {
		info, _, err := s.CreateKey(ctx, "acme", req)
		if err != nil {
			t.Fatal(err)
		}
		made[req.Name] = info.KeyID
	}
	if _, err := s.RevokeKey(ctx, made["revoked"]); err != nil {
		t.Fatal(err)
	}
	served := func(model string) bool { return model == "small" }
	checkFor(t, 3*time.Second, 50*time.Millisecond, func() error {
		got := s.KeysWithNoModelServed(served)
		if len(got) != 1 || got[0].KeyID != made["stranded"] || got[0].Account != "acme" {
			return fmt.Errorf("keys with no model served: %+v, want the one named stranded", got)
		}
		return nil
	})
}
