package accounts

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/money"
)

// KV buckets owned by this package.
const (
	BucketAccounts = "TOLLGATE_ACCOUNTS" // key: account id; value: JSON accountRecord
	BucketKeys     = "TOLLGATE_KEYS"     // key: key id; value: JSON KeyInfo (never the token)
	// BucketSigning holds the public half of the signing key every
	// gateway on this NATS must share (key "public"), so that one started
	// with another is refused at start instead of refusing, and issuing,
	// keys the others do not accept.
	BucketSigning = "TOLLGATE_SIGNING"
	// KeysCreatedStream holds a marker of every key made through a limited
	// path (the console) in the last hour, subject keys.created.<account>:
	// what the per-hour limit counts (see broker.CreationLog).
	KeysCreatedStream = "KEYS_CREATED"
	keysCreatedPrefix = "keys.created."
)

var (
	// ErrNotFound is returned for an account or key id that does not exist:
	// check the id, or create the account first.
	ErrNotFound = errors.New("not found")
	// ErrExists is returned when creating an account whose id is taken:
	// pick another id, or credit the existing account instead.
	ErrExists = errors.New("already exists")
	// ErrAlreadyUsed ends CreditOnce's error when the idempotency key was
	// used for a credit of another amount; errors.Is finds ErrExists in it
	// too (a 409). The message began "already exists: ", which told the
	// payment integration nothing of what to do.
	ErrAlreadyUsed error = alreadyUsed{}
	// ErrInvalidInput wraps every rejected argument (account id, amount,
	// scope, limit); the rest of the message says what to change.
	ErrInvalidInput = errors.New("invalid input")
	// ErrTooManyKeys is returned when creating a key for an account that
	// holds auth.max_keys_per_account keys not revoked: revoke the ones it
	// no longer uses (expired keys count until revoked), or raise the
	// setting.
	ErrTooManyKeys = errors.New("too many keys")
	// ErrKeysCreatedTooFast is wrapped by the *KeyRateError of a key
	// refused because its account made auth.max_keys_created_per_hour
	// keys in the last hour: wait what it says, or raise the setting.
	ErrKeysCreatedTooFast = errors.New("too many keys created in the last hour")
)

// KeyRateError refuses a key past the account's keys per hour; Wait is
// how long until one more fits (see broker.CreationLog.Take).
type KeyRateError struct {
	Account     string
	Made, Limit int
	Wait        time.Duration
}

func (e *KeyRateError) Error() string {
	return fmt.Sprintf("%v: account %s made %d keys in the last hour, and auth.max_keys_created_per_hour is %d; the next can be made in %s",
		ErrKeysCreatedTooFast, e.Account, e.Made, e.Limit, e.Wait.Round(time.Second))
}

func (e *KeyRateError) Unwrap() error { return ErrKeysCreatedTooFast }

type alreadyUsed struct{}

func (alreadyUsed) Error() string {
	return "send the same amount again to be told it was applied, or another key for another credit"
}

func (alreadyUsed) Is(target error) bool { return target == ErrExists }

// Account is an account's balance, its lifetime totals and its limits.
// Balance = Credited - Debited; it goes negative within the grace buffer.
type Account struct {
	ID        string
	Balance   money.Nanos
	Credited  money.Nanos
	Debited   money.Nanos
	CreatedAt time.Time
	Limits    Limits
}

// Limits are what the operator allows an account as a whole, on every
// gateway, beside each key's own rpm and tpm: a call must pass both. 0 is
// no limit. Keys can be made by the account holder in the console, so a
// key's limits alone bound nothing the holder wants to get around.
type Limits struct {
	RPM int64 `json:"rpm"`
	TPM int64 `json:"tpm"`
	// MaxConcurrent bounds the generation and plugin calls in flight at
	// once on one gateway: the balance is checked when a call starts, so
	// it bounds how far calls started together can overspend it.
	MaxConcurrent int64 `json:"max_concurrent"`
}

// Live is what the request path keeps of one account between its calls on
// this gateway: how many are in flight, counted whatever the account's
// limits, and its tokens per minute as they are now. A max_concurrent or
// tpm set while calls run must count them: counted only while the account
// had limits, 3 streams open when max_concurrent 2 was set were not
// counted, and 5 ran at once under it. There is one per account, made when
// the gateway first sees it and kept while the process runs, and Standing
// answers it with the balance, so a call finds it without a look-up of
// its own.
type Live struct {
	inFlight atomic.Int64
	tpm      atomic.Int64
}

// Acquire counts one more call in flight, unless limit (0 = none) are in
// flight already.
func (l *Live) Acquire(limit int64) bool {
	for {
		n := l.inFlight.Load()
		if limit > 0 && n >= limit {
			return false
		}
		if l.inFlight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release ends a call Acquire counted.
func (l *Live) Release() { l.inFlight.Add(-1) }

// InFlight is how many calls are in flight.
func (l *Live) InFlight() int64 { return l.inFlight.Load() }

// TPM is the account's tokens per minute now (0 = none), which may have
// been set since a call in flight was admitted.
func (l *Live) TPM() int64 { return l.tpm.Load() }

// Check refuses negative limits; 0 is none.
func (l Limits) Check() error {
	if l.RPM < 0 || l.TPM < 0 || l.MaxConcurrent < 0 {
		return fmt.Errorf("%w: rpm, tpm and max_concurrent must not be negative (0 = no limit)", ErrInvalidInput)
	}
	return nil
}

// accountRecord is the JSON stored in TOLLGATE_ACCOUNTS.
type accountRecord struct {
	ID            string    `json:"id"`
	BalanceNanos  int64     `json:"balance_nanos"`
	CreatedAt     time.Time `json:"created_at"`
	CreditedNanos int64     `json:"credited_nanos"`
	DebitedNanos  int64     `json:"debited_nanos"`
	// BilledThroughSeq and BilledRanges say which USAGE stream messages
	// are already charged to the account; see ApplyUsage.
	BilledThroughSeq uint64     `json:"billed_through_seq"`
	BilledRanges     []SeqRange `json:"billed_ranges,omitempty"`
	// Credits are the credits (and corrections) that carried an
	// idempotency key, of the last creditKeyWindow and at most
	// maxKeyedCredits of them, so that one sent again is not applied
	// twice; kept
	// in the record, they are checked and added in the same
	// compare-and-set as the credit.
	Credits []keyedCredit `json:"keyed_credits,omitempty"`
	// BilledJobs are the batch jobs charged lately. A job's one event can
	// reach the USAGE stream twice, in two messages (a worker that died
	// after billing it, and the worker that finished the job), which the
	// sequences above cannot tell apart; see ApplyUsage.
	BilledJobs []billedJob `json:"billed_jobs,omitempty"`
	// Limits are the account's own limits. A process of a release before
	// them that rewrites the record (a credit, a debit) drops them.
	Limits Limits `json:"limits,omitzero"`
}

// billedJob is a batch job whose event was charged.
type billedJob struct {
	ID string    `json:"id"`
	At time.Time `json:"at"`
}

// Batch jobs charged are remembered this long, and at most maxBilledJobs
// of them per account: the event of a worker that died after billing is
// published again when that worker's process starts again, usually within
// minutes, and 256 ids are about 20 KB in the record.
const (
	billedJobWindow = 30 * 24 * time.Hour
	maxBilledJobs   = 256
)

// keyedCredit is a credit applied under an idempotency key.
type keyedCredit struct {
	Key   string    `json:"key"`
	Nanos int64     `json:"nanos"`
	At    time.Time `json:"at"`
}

// Idempotency keys of credits are remembered this long, and at most
// maxKeyedCredits of them per account: a week covers payment providers'
// webhook retries (Stripe's run for three days), and 500 keys (about
// 40 KB in the record) a busy account's top-ups of a week.
const (
	creditKeyWindow = 7 * 24 * time.Hour
	maxKeyedCredits = 500
	// MaxIdempotencyKey is the longest idempotency key accepted (bytes).
	MaxIdempotencyKey = 200
)

func (r *accountRecord) account() Account {
	return Account{
		ID:        r.ID,
		Balance:   money.Nanos(r.BalanceNanos),
		Credited:  money.Nanos(r.CreditedNanos),
		Debited:   money.Nanos(r.DebitedNanos),
		CreatedAt: r.CreatedAt,
		Limits:    r.Limits,
	}
}

// Service is the accounts and keys store of one gateway. All methods are
// safe for concurrent use.
type Service struct {
	conn     *nats.Conn
	accounts jetstream.KeyValue
	keys     jetstream.KeyValue

	// signer is nil in a process that only reads and debits balances
	// (Open with no dataDir): it neither issues nor verifies keys.
	signer    ed25519.PrivateKey
	verifier  ed25519.PublicKey
	issuer    string
	algorithm string
	parser    *jwt.Parser

	snap snapshot
	// unbilled holds, per account, what this process metered that the
	// account's debits do not show yet (see NoteCharge).
	unbilled sync.Map // account → *unbilled
	// share sends this process's charges to the other processes on the
	// NATS and takes theirs into unbilled (see shareUnbilled).
	share sharing

	cacheMu sync.RWMutex
	cache   map[string]*Key // verified tokens; see Verify

	// createKeyMu makes CreateKey's count and store one step in this
	// process (see CreateKey).
	createKeyMu sync.Mutex
	// keysCreated counts the keys made through the console in the last
	// hour, on every gateway (KeyRequest.MaxCreatedPerHour); nil in a
	// process that issues no keys.
	keysCreated *broker.CreationLog

	// revoked is told the id of each key the watch finds revoked (see
	// OnKeyRevoked).
	revoked atomic.Pointer[func(keyID string)]

	stop    context.CancelFunc
	stopped sync.WaitGroup
}

// Open declares the buckets, loads or creates the signing key under dataDir,
// checks it is the one the other gateways on this NATS use, starts
// watching both buckets and returns once the snapshot holds their current
// contents (or ctx ends). Close it before closing the broker. With no
// dataDir the service has no signing key: for the billing consumer and
// the batch worker, which only read and debit balances (a key of their
// own, made at their first start, once looked like one to share).
func Open(ctx context.Context, js jetstream.JetStream, replicas int, dataDir string, auth config.Auth) (*Service, error) {
	algorithm := auth.Algorithm
	if algorithm == "" {
		algorithm = config.DefaultAlgorithm
	}
	if algorithm != jwt.SigningMethodEdDSA.Alg() {
		return nil, fmt.Errorf("auth.algorithm %q: only EdDSA (Ed25519) is supported", auth.Algorithm)
	}
	issuer := auth.Issuer
	if issuer == "" {
		issuer = config.DefaultIssuer
	}
	replicas = max(replicas, 1)
	var signer ed25519.PrivateKey
	if dataDir != "" {
		var err error
		if signer, err = loadOrCreateSigningKey(dataDir); err != nil {
			return nil, err
		}
		if err := checkSharedSigningKey(ctx, js, replicas, signer.Public().(ed25519.PublicKey), dataDir); err != nil {
			return nil, err
		}
	}
	accountsKV, err := broker.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketAccounts,
		Description: "tollgate accounts and balances",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, err
	}
	keysKV, err := broker.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketKeys,
		Description: "tollgate API key metadata (no secrets)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, err
	}
	var keysCreated *broker.CreationLog
	if signer != nil {
		keysCreated, err = broker.EnsureCreationLog(ctx, js, KeysCreatedStream,
			"tollgate: a marker per key made in the console in the last hour, subject keys.created.<account>",
			keysCreatedPrefix, replicas, 0)
		if err != nil {
			return nil, err
		}
	}

	s := &Service{
		conn:      js.Conn(),
		accounts:  accountsKV,
		keys:      keysKV,
		signer:    signer,
		verifier:  publicOf(signer),
		issuer:    issuer,
		algorithm: algorithm,
		parser: jwt.NewParser(
			// The one method we sign with: this is what refuses "none",
			// and HS256 keyed with our public key bytes.
			jwt.WithValidMethods([]string{algorithm}),
			jwt.WithIssuer(issuer),
			// One spelling per key: base64's unused trailing bits must be
			// zero, so a key cannot be varied into tokens that all pass
			// and each take a place in the verification cache.
			jwt.WithStrictDecoding(),
		),
		cache:       make(map[string]*Key),
		keysCreated: keysCreated,
	}
	s.snap.init()
	s.share.init()
	watchCtx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.stopped.Add(3)
	go s.watch(watchCtx, accountsKV, bucketAccounts)
	go s.watch(watchCtx, keysKV, bucketKeys)
	go s.shareUnbilled(watchCtx)

	if err := s.snap.waitLoaded(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("loading accounts snapshot: %w", err)
	}
	return s, nil
}

// OnKeyRevoked has fn called, on the watch's goroutine, with the id of
// every key this gateway learns is revoked (at start, the keys revoked
// before): the streams a key opened are not refused at admission again,
// and a caller ends them. fn must not block.
func (s *Service) OnKeyRevoked(fn func(keyID string)) {
	s.revoked.Store(&fn)
}

// Close stops watching the buckets. The service must not be used afterwards.
func (s *Service) Close() {
	s.stop()
	s.stopped.Wait()
}

// Balance is the account's balance as last seen by this gateway, less what
// this process and the others on the NATS charged the account that is not
// debited yet (NoteCharge); false when the account does not exist. It
// never does I/O.
func (s *Service) Balance(account string) (money.Nanos, bool) {
	balance, _, _, ok := s.Standing(account)
	return balance, ok
}

// Standing is Balance, the account's limits and its Live, read together
// so that admitting a call looks the account up once. It never does I/O.
func (s *Service) Standing(account string) (money.Nanos, Limits, *Live, bool) {
	s.share.readsBalances()
	e, ok := s.snap.account(account)
	if !ok {
		return 0, Limits{}, nil, false
	}
	if u, found := s.unbilled.Load(account); found {
		return e.balance - u.(*unbilled).outstanding(e.debited), e.limits, e.live, true
	}
	return e.balance, e.limits, e.live, true
}

// Debited is the sum of every debit of account so far, from the same
// in-memory view as Balance: it grows by a bill once that bill is charged,
// which tells work billed at its end whether its bill is in the balance.
func (s *Service) Debited(account string) (money.Nanos, bool) {
	e, ok := s.snap.account(account)
	return e.debited, ok
}

// CreateAccount creates an account holding credit (which may be zero),
// without limits of its own.
func (s *Service) CreateAccount(ctx context.Context, id string, credit money.Nanos) (Account, error) {
	return s.CreateAccountWithLimits(ctx, id, credit, Limits{})
}

// CreateAccountWithLimits creates an account holding credit, under limits.
func (s *Service) CreateAccountWithLimits(ctx context.Context, id string, credit money.Nanos, limits Limits) (Account, error) {
	if err := ValidateAccountID(id); err != nil {
		return Account{}, err
	}
	if credit < 0 {
		return Account{}, fmt.Errorf("%w: initial credit must not be negative", ErrInvalidInput)
	}
	if err := limits.Check(); err != nil {
		return Account{}, err
	}
	rec := accountRecord{
		ID:            id,
		BalanceNanos:  int64(credit),
		CreditedNanos: int64(credit),
		CreatedAt:     time.Now().UTC(),
		Limits:        limits,
	}
	data, err := json.Marshal(&rec)
	if err != nil {
		return Account{}, fmt.Errorf("encoding account %s: %w", id, err)
	}
	rev, err := s.accounts.Create(ctx, id, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return Account{}, fmt.Errorf("account %s: %w", id, ErrExists)
	}
	if err != nil {
		return Account{}, fmt.Errorf("creating account %s: %w", id, err)
	}
	s.snap.putAccount(id, rev, rec, false)
	return rec.account(), nil
}

// Account reads the account from the bucket (not the snapshot).
func (s *Service) Account(ctx context.Context, id string) (Account, error) {
	rec, _, err := s.getAccount(ctx, id)
	if err != nil {
		return Account{}, err
	}
	return rec.account(), nil
}

// AccountIDs returns the ids of the accounts that sort after after (in
// byte order; "" for the first), sorted, deleted ones left out. It waits
// until this gateway has seen every account written before the call, as
// ListKeys does, so an account just made through another gateway is
// there. The balances are read with Account: the snapshot holds no
// creation time nor credited total.
func (s *Service) AccountIDs(ctx context.Context, after string) ([]string, error) {
	if err := s.WaitSynced(ctx); err != nil {
		return nil, fmt.Errorf("listing accounts: %w", err)
	}
	ids := s.snap.accountIDsAfter(after)
	slices.Sort(ids)
	return ids, nil
}

// Credit adds amount (> 0) to the account's balance. A correction, a
// negative credit, goes through CreditOnce, which says what it takes.
func (s *Service) Credit(ctx context.Context, id string, amount money.Nanos) (Account, error) {
	if amount < 0 {
		return Account{}, fmt.Errorf("%w: credit amount must be positive, got %s USD", ErrInvalidInput, amount)
	}
	acc, _, err := s.CreditOnce(ctx, id, amount, "")
	return acc, err
}

// CreditOnce is Credit under an idempotency key (a payment's id, say): a
// credit sent again with the key of one applied in the last 7 days is
// not applied again, and replayed says so; with another amount it is
// ErrExists. An empty key credits as Credit does.
//
// A negative amount corrects credits made before (1000 typed for 10.00,
// which nothing else could take back): it lowers the credited total and
// the balance, under the same key rules, and is refused past the
// credited total. The balance may go negative by it: what was spent
// stays debited.
func (s *Service) CreditOnce(ctx context.Context, id string, amount money.Nanos, key string) (acc Account, replayed bool, err error) {
	if amount == 0 {
		return Account{}, false, fmt.Errorf("%w: credit amount must not be zero", ErrInvalidInput)
	}
	if len(key) > MaxIdempotencyKey {
		return Account{}, false, fmt.Errorf("%w: the idempotency key has %d bytes, at most %d", ErrInvalidInput, len(key), MaxIdempotencyKey)
	}
	acc, err = s.updateAccount(ctx, id, func(rec *accountRecord) error {
		replayed = false
		now := time.Now().UTC()
		if key != "" {
			rec.Credits = slices.DeleteFunc(rec.Credits, func(c keyedCredit) bool { return now.Sub(c.At) > creditKeyWindow })
			for _, c := range rec.Credits {
				if c.Key != key {
					continue
				}
				if c.Nanos != int64(amount) {
					return fmt.Errorf("idempotency key %q was used at %s for a credit of %s USD, not %s: %w", key,
						c.At.Format(time.RFC3339), money.Nanos(c.Nanos), amount, ErrAlreadyUsed)
				}
				replayed = true
				return errUnchanged
			}
		}
		balance, ok1 := addNanos(rec.BalanceNanos, int64(amount))
		credited, ok2 := addNanos(rec.CreditedNanos, int64(amount))
		switch {
		case !ok2:
			// The balance is at most credited_usd: this is the total
			// that overflows, and the one to name.
			return fmt.Errorf("%w: crediting %s USD would take credited_usd (%s) past its maximum, %s USD",
				ErrInvalidInput, amount, money.Nanos(rec.CreditedNanos), money.Nanos(math.MaxInt64))
		case !ok1:
			return fmt.Errorf("%w: crediting %s USD would take the balance (%s) past its minimum, %s USD",
				ErrInvalidInput, amount, money.Nanos(rec.BalanceNanos), money.Nanos(math.MinInt64))
		}
		if credited < 0 {
			return fmt.Errorf("%w: correcting by %s USD: credited_usd would go below zero (it is %s); a correction takes back at most what was credited",
				ErrInvalidInput, amount, money.Nanos(rec.CreditedNanos))
		}
		rec.BalanceNanos, rec.CreditedNanos = balance, credited
		if key != "" {
			rec.Credits = append(rec.Credits, keyedCredit{Key: key, Nanos: int64(amount), At: now})
			if n := len(rec.Credits) - maxKeyedCredits; n > 0 {
				rec.Credits = slices.Delete(rec.Credits, 0, n)
			}
		}
		return nil
	})
	return acc, replayed, err
}

// SetLimits changes the account's limits with set, which is given the
// current ones (it may run again, when another writer changed the record
// first). Every gateway applies the new limits within a second.
func (s *Service) SetLimits(ctx context.Context, id string, set func(*Limits)) (Account, error) {
	return s.updateAccount(ctx, id, func(rec *accountRecord) error {
		limits := rec.Limits
		set(&limits)
		if err := limits.Check(); err != nil {
			return err
		}
		if limits == rec.Limits {
			return errUnchanged
		}
		rec.Limits = limits
		return nil
	})
}

// Debit subtracts amount (>= 0) from the account's balance, which may go
// negative: refusing service below the grace buffer is the proxy's job, and
// usage already served must be billed. A zero amount only reads the account.
//
// Debit is not idempotent: a caller replaying the same usage event debits
// it twice.
func (s *Service) Debit(ctx context.Context, id string, amount money.Nanos) (Account, error) {
	if amount < 0 {
		return Account{}, fmt.Errorf("%w: debit amount must not be negative, got %s USD", ErrInvalidInput, amount)
	}
	if amount == 0 {
		return s.Account(ctx, id)
	}
	return s.updateAccount(ctx, id, func(rec *accountRecord) error {
		balance, ok1 := addNanos(rec.BalanceNanos, -int64(amount))
		debited, ok2 := addNanos(rec.DebitedNanos, int64(amount))
		if !ok1 || !ok2 {
			return fmt.Errorf("%w: debiting %s USD would overflow the balance", ErrInvalidInput, amount)
		}
		rec.BalanceNanos, rec.DebitedNanos = balance, debited
		return nil
	})
}

// errUnchanged, from an updateAccount change, leaves the record as it is
// and answers the account as read.
var errUnchanged = errors.New("unchanged")

// updateAccount applies change with compare-and-set on the entry's revision,
// retrying from a fresh read whenever another writer got there first.
func (s *Service) updateAccount(ctx context.Context, id string, change func(*accountRecord) error) (Account, error) {
	for {
		rec, rev, err := s.getAccount(ctx, id)
		if err != nil {
			return Account{}, err
		}
		if err := change(&rec); errors.Is(err, errUnchanged) {
			return rec.account(), nil
		} else if err != nil {
			return Account{}, err
		}
		data, err := json.Marshal(&rec)
		if err != nil {
			return Account{}, fmt.Errorf("encoding account %s: %w", id, err)
		}
		newRev, err := s.accounts.Update(ctx, id, data, rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			// Lost the race; the loop re-reads. (ErrKeyExists matched it on
			// one replica only: replicated streams answer another code,
			// and every lost race there was a 503.)
			continue
		}
		if err != nil {
			return Account{}, fmt.Errorf("updating account %s: %w", id, err)
		}
		s.snap.putAccount(id, newRev, rec, false)
		return rec.account(), nil
	}
}

func (s *Service) getAccount(ctx context.Context, id string) (accountRecord, uint64, error) {
	if err := ValidateAccountID(id); err != nil {
		return accountRecord{}, 0, err
	}
	entry, err := s.accounts.Get(ctx, id)
	// A get on a replicated bucket is a direct get, which any replica may
	// answer, a few milliseconds behind the leader: an account created a
	// moment ago through this gateway, which its snapshot holds, was "not
	// found" when a key was made for it next (a cluster test, one node
	// down). Such a miss is asked again for up to a second.
	for wait := 10 * time.Millisecond; errors.Is(err, jetstream.ErrKeyNotFound) && wait <= 640*time.Millisecond; wait *= 2 {
		if _, known := s.snap.account(id); !known {
			break
		}
		select {
		case <-ctx.Done():
			return accountRecord{}, 0, ctx.Err()
		case <-time.After(wait):
		}
		entry, err = s.accounts.Get(ctx, id)
	}
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return accountRecord{}, 0, fmt.Errorf("account %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return accountRecord{}, 0, fmt.Errorf("reading account %s: %w", id, err)
	}
	var rec accountRecord
	if err := json.Unmarshal(entry.Value(), &rec); err != nil {
		return accountRecord{}, 0, fmt.Errorf("decoding account %s (revision %d): %w", id, entry.Revision(), err)
	}
	return rec, entry.Revision(), nil
}

// ValidateAccountID accepts 1 to 64 characters of letters, digits, '_', '-'
// and '.', where dots only separate (no leading, trailing or doubled dot:
// the id is a NATS subject token).
func ValidateAccountID(id string) error {
	const rule = "account id must be 1-64 characters of a-z, A-Z, 0-9, '_', '-', '.', not starting or ending with '.' nor containing '..'"
	if len(id) == 0 || len(id) > 64 || id[0] == '.' || id[len(id)-1] == '.' {
		return fmt.Errorf("%w: %s, got %q", ErrInvalidInput, rule, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
		if !ok || c == '.' && id[i-1] == '.' {
			return fmt.Errorf("%w: %s, got %q", ErrInvalidInput, rule, id)
		}
	}
	return nil
}

func addNanos(a, b int64) (int64, bool) {
	if b > 0 && a > math.MaxInt64-b || b < 0 && a < math.MinInt64-b {
		return 0, false
	}
	return a + b, true
}
