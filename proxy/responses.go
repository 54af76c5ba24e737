package proxy

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
)

// Responses state lives on the upstream that created a response: a
// previous_response_id, GET/DELETE /v1/responses/{id}, .../cancel and
// .../input_items must reach that upstream, and only the account that
// created it may use it. The gateway remembers response id -> {upstream,
// account} in a JetStream KV bucket shared by every gateway, with the
// bucket's max age as TTL, and in a bounded map of recent ids.
//
// Remembering never waits on NATS: the id goes into the local map at once
// (so this gateway finds it on the very next call) and onto a bounded
// queue that one goroutine writes to KV, in order, trying a failed write
// again through an election (see apply); a full queue drops the write,
// counted and logged. Looking up an id the map lacks asks KV, bounded by
// kvLookupTimeout; only calls that name an id wait for that.
//
// The output items of a stored response (msg_…, fc_…, rs_…) are kept
// upstream with it, and a later call can name them as input items
// ({"type":"item_reference","id":…}): each is remembered too, under its
// own key (itemKey), with its response's upstream and account, so that
// such a call is checked and routed as a previous_response_id is.
//
// A gateway trusts what its memory holds until the TTL, without asking
// KV: a response deleted through another gateway would stay reachable
// through this one. So a delete is also said on subjectResponseDeleted,
// which every gateway follows into its memory (deletedElsewhere); nothing
// on the request path waits for it.

// BucketResponses is the KV bucket of response mappings; key: the response
// id (see mappingKey), or "item." and an output item's id (see itemKey);
// value: JSON responseMapping.
const BucketResponses = "TOLLGATE_RESPONSES"

// subjectResponseDeleted is the core NATS subject on which a gateway says
// a response was deleted through it; the message is the id. Core NATS,
// not a stream: a gateway that misses it (NATS down, the gateway not yet
// started) either has no memory of the id, and reads KV, or keeps sending
// it to its upstream, which answers its own 404, until its memory of it
// is past the TTL or has made room for newer ids.
const subjectResponseDeleted = "tollgate.responses.deleted"

const (
	// mappingQueue bounds the KV writes waiting for the writer.
	mappingQueue = 4096
	// kvWriteTimeout bounds one KV write; a NATS that is down fills the
	// queue, and what does not fit is dropped.
	kvWriteTimeout = 2 * time.Second
	// kvRetryFor is how long KV may fail before the writer gives a write
	// up (see apply): past an election, which takes 4-8 s.
	kvRetryFor = time.Minute
	// kvRetryFirst and kvRetryMax bound the writer's waits between tries.
	// The longest wait is how long after an election another gateway may
	// still find an id missing that this one is about to write.
	kvRetryFirst = 100 * time.Millisecond
	kvRetryMax   = time.Second
	// kvLookupTimeout bounds a KV read on the request path.
	kvLookupTimeout = 500 * time.Millisecond
	// cacheGeneration is how many ids one generation of the recent-ids
	// map holds; two generations are kept.
	cacheGeneration = 1 << 15
	// maxResponseID bounds the ids remembered (OpenAI's and vLLM's are
	// about 50 bytes).
	maxResponseID = 256
	// maxItemIDs bounds the output item ids remembered of one response.
	maxItemIDs = 256
)

// responseMapping is who holds a response and whom it belongs to.
type responseMapping struct {
	Upstream string `json:"upstream"`
	Account  string `json:"account"`
	Model    string `json:"model,omitempty"`
	// At is when the gateway saw the response created, unix ns.
	At int64 `json:"at"`
	// Tokens is the response's prompt and output tokens, as billed: what
	// a call continuing it feeds the model before its own input. 0 until
	// the response's call has ended.
	Tokens int64 `json:"tokens,omitempty"`
}

// mappingKV is what the store needs of jetstream.KeyValue.
type mappingKV interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Put(ctx context.Context, key string, value []byte) (uint64, error)
	Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error
}

// leaderReadingKV is a mappingKV of a replicated bucket, which can read a
// key from the bucket's stream leader (see find).
type leaderReadingKV interface {
	mappingKV
	// GetFromLeader returns key's value as the leader holds it, or
	// jetstream.ErrKeyNotFound.
	GetFromLeader(ctx context.Context, key string) ([]byte, error)
}

type mappingOp struct {
	key    string
	del    bool
	record responseMapping
}

// stateKey is what the memory map is keyed by: a response id, or an
// output item id. Apart, so that an item's id is never taken for a
// response's (a GET, a previous_response_id) nor the other way round.
type stateKey struct {
	id   string
	item bool
}

// ResponseStore remembers which upstream created each response. Open it
// with OpenResponseStore and pass it in Options.Responses; without one, a
// Server remembers in memory only, which a single gateway that is never
// restarted can live with.
type ResponseStore struct {
	kv     mappingKV  // nil: memory only
	nc     *nats.Conn // says and hears deletes; nil: memory only
	sub    *nats.Subscription
	retune func(ctx context.Context, ttl time.Duration) error
	logf   func(string, ...any)
	ttl    atomic.Int64 // ns
	// readLeader reads key from the bucket's stream leader, for a miss on
	// a replicated bucket (see find); nil with one replica.
	readLeader func(ctx context.Context, key string) ([]byte, error)

	mu       sync.Mutex
	cur, old map[stateKey]responseMapping

	ops      chan mappingOp
	ttlCh    chan time.Duration // a new TTL for the bucket; latest wins
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	// writes bounds the writer's KV calls and waits; Close cancels it
	// when the writes queued at shutdown take too long.
	writes       context.Context
	cancelWrites context.CancelFunc
	// failingSince is when KV began failing the writer's writes, zero
	// while they go through; the writer's own.
	failingSince time.Time

	stored, dropped, failed atomic.Uint64
	lastLog                 atomic.Int64 // unix ns, of logSometimes
}

// OpenResponseStore declares the bucket with max age ttl and starts the
// writer. Close it before the broker.
func OpenResponseStore(ctx context.Context, js jetstream.JetStream, replicas int, ttl time.Duration, logf func(string, ...any)) (*ResponseStore, error) {
	cfg := func(ttl time.Duration) jetstream.KeyValueConfig {
		return jetstream.KeyValueConfig{
			Bucket:      BucketResponses,
			Description: "tollgate responses: id -> the upstream that created it and its account",
			History:     1,
			TTL:         ttl,
			Storage:     jetstream.FileStorage,
			Replicas:    max(replicas, 1),
		}
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	// The bucket is shared: a gateway with another routing.response_ttl
	// changes how long every gateway's mappings live. Say so, as
	// billing.usage_retention does for the USAGE stream. A reload
	// (reloading) never shortens it: the config refuses a value under
	// this gateway's own, and one under what another gateway set (a
	// longer one started since) would delete the older mappings of
	// every gateway as well.
	ensure := func(ctx context.Context, ttl time.Duration, reloading bool) (jetstream.KeyValue, error) {
		var before time.Duration
		var held uint64
		if old, err := js.KeyValue(ctx, BucketResponses); err == nil {
			if st, err := old.Status(ctx); err == nil {
				before, held = st.TTL(), st.Values()
			}
		}
		if reloading && before > ttl {
			logf("responses: routing.response_ttl %s is not applied to the %s bucket, which keeps response mappings for %s (another gateway's value): shortening it would delete the older mappings of every gateway on this NATS; restart to apply it",
				ttl, BucketResponses, before)
			return nil, nil
		}
		kv, err := broker.EnsureKV(ctx, js, cfg(ttl))
		if err != nil || before == 0 || before == ttl {
			return kv, err
		}
		// A shorter max age deletes the older mappings at once (a reload
		// refuses it; a start is where it is done on purpose), and a
		// longer one later brings none back: say how many went. A
		// cluster may delete them after the update answers, and then
		// the count is not known.
		dropped := ""
		if ttl < before {
			dropped = fmt.Sprintf(": the mappings older than %s are deleted", ttl)
			if st, err := kv.Status(ctx); err == nil && st.Values() < held {
				dropped = fmt.Sprintf(": %d of its %d mappings, those older than %s, were deleted", held-st.Values(), held, ttl)
			}
		}
		logf("responses: the %s bucket now keeps response mappings for %s, not %s, for every gateway on this NATS%s (routing.response_ttl of this gateway; keep it the same in every one)",
			BucketResponses, ttl, before, dropped)
		return kv, nil
	}
	kv, err := ensure(ctx, ttl, false)
	if err != nil {
		return nil, err
	}
	if st, err := kv.Status(ctx); err == nil {
		if info, ok := st.(*jetstream.KeyValueBucketStatus); ok {
			replicas = max(replicas, info.StreamInfo().Config.Replicas) // EnsureKV never shrinks it
		}
	}
	var store mappingKV = kv
	if replicas > 1 {
		store = newReplicatedKV(kv, js)
	}
	r := newResponseStore(store, ttl, logf)
	r.retune = func(ctx context.Context, ttl time.Duration) error {
		_, err := ensure(ctx, ttl, true)
		return err
	}
	r.nc = js.Conn()
	// nats.go subscribes again after a reconnect; what was said while
	// the connection was down is lost (see subjectResponseDeleted).
	if r.sub, err = r.nc.Subscribe(subjectResponseDeleted, r.deletedElsewhere); err != nil {
		return nil, fmt.Errorf("following the responses deleted through other gateways: %w", err)
	}
	r.start()
	return r, nil
}

func newResponseStore(kv mappingKV, ttl time.Duration, logf func(string, ...any)) *ResponseStore {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if ttl <= 0 {
		ttl = config.DefaultResponseTTL
	}
	r := &ResponseStore{kv: kv, logf: logf, cur: map[stateKey]responseMapping{}}
	if l, ok := kv.(leaderReadingKV); ok {
		r.readLeader = l.GetFromLeader
	}
	r.ttl.Store(int64(ttl))
	return r
}

func (r *ResponseStore) start() {
	r.ops = make(chan mappingOp, mappingQueue)
	r.ttlCh = make(chan time.Duration, 1)
	r.stop = make(chan struct{})
	r.done = make(chan struct{})
	r.writes, r.cancelWrites = context.WithCancel(context.Background())
	go r.write()
}

// Close stops the writer after the writes already queued, waiting at most
// a few seconds for them.
func (r *ResponseStore) Close() {
	if r == nil || r.done == nil {
		return
	}
	r.stopOnce.Do(func() {
		if r.sub != nil {
			_ = r.sub.Unsubscribe()
		}
		close(r.stop)
	})
	select {
	case <-r.done:
	case <-time.After(2 * kvWriteTimeout):
		// The writer stops at once: its write and its wait end with
		// r.writes. Not left running, as it would write on into a
		// broker being closed.
		r.cancelWrites()
		<-r.done
	}
	r.cancelWrites()
}

// setTTL applies routing.response_ttl: to the map at once, and to the
// bucket's max age by the writer.
func (r *ResponseStore) setTTL(ttl time.Duration) {
	if ttl <= 0 || time.Duration(r.ttl.Swap(int64(ttl))) == ttl || r.ttlCh == nil {
		return
	}
	for {
		select {
		case r.ttlCh <- ttl:
			return
		default:
			select { // replace a TTL the writer has not taken yet
			case <-r.ttlCh:
			default:
			}
		}
	}
}

// remember records that up created response id for account. It never
// blocks: the KV write is queued, or dropped when the queue is full.
//
// share puts the mapping into KV now; without it, setTokens puts it when
// the call ends. A whole answer ends a moment later, so it is written to
// KV once; a stream is shared at once, for the other gateways while it
// lasts.
func (r *ResponseStore) remember(id, upstream, account, model string, share bool) {
	if id == "" || len(id) > maxResponseID {
		return
	}
	m := responseMapping{Upstream: upstream, Account: account, Model: model, At: time.Now().UnixNano()}
	r.cache(stateKey{id: id}, m)
	if r.kv == nil || !share {
		return
	}
	r.queue(id, mappingOp{key: mappingKey(id), record: m})
}

// rememberItem records that up created output item id (of a stored
// response) for account. Like remember, it never blocks; the id is
// written to KV at once, and once: it is known only as its call ends.
func (r *ResponseStore) rememberItem(id, upstream, account, model string) {
	if id == "" || len(id) > maxResponseID {
		return
	}
	m := responseMapping{Upstream: upstream, Account: account, Model: model, At: time.Now().UnixNano()}
	r.cache(stateKey{id: id, item: true}, m)
	if r.kv != nil {
		r.queue(id, mappingOp{key: itemKey(id), record: m})
	}
}

// setTokens records, once the call that created response id has ended,
// how many tokens it billed (see responseMapping.Tokens). A mapping no
// longer in memory is left as it is.
func (r *ResponseStore) setTokens(id string, tokens int64) {
	k := stateKey{id: id}
	r.mu.Lock()
	m, found := r.cur[k]
	if !found {
		m, found = r.old[k]
	}
	if found && m.Upstream != "" {
		m.Tokens = tokens
		r.cur[k] = m
	}
	r.mu.Unlock()
	if !found || m.Upstream == "" || r.kv == nil {
		return
	}
	r.queue(id, mappingOp{key: mappingKey(id), record: m})
}

// forget drops the mapping of a response deleted through this gateway,
// here, in KV and in the other gateways' memory.
func (r *ResponseStore) forget(id string) {
	r.tombstone(id)
	if r.kv == nil || len(id) > maxResponseID {
		return
	}
	r.queue(id, mappingOp{key: mappingKey(id), del: true})
	if r.nc == nil {
		return
	}
	// Said at once, not after the KV delete: a gateway that hears it
	// keeps a tombstone, which no KV read overrides.
	if err := r.nc.Publish(subjectResponseDeleted, []byte(id)); err != nil {
		r.logSometimes("responses: telling the other gateways that %s was deleted: %v (one that remembers it sends it to its upstream until its memory of it expires)", id, err)
	}
}

// deletedElsewhere is told of a response deleted through a gateway (this
// one's own deletes come back too) and forgets it as forget does here.
func (r *ResponseStore) deletedElsewhere(msg *nats.Msg) {
	id := string(msg.Data)
	if id == "" || len(id) > maxResponseID {
		return
	}
	r.tombstone(id)
}

// tombstone marks id deleted in memory. A tombstone, not a deletion: a
// lookup here must not find the mapping in KV and send the next call to
// the upstream again, before the KV delete is written (it is written in
// the background, by the gateway it was deleted through).
func (r *ResponseStore) tombstone(id string) {
	k := stateKey{id: id}
	r.mu.Lock()
	delete(r.old, k)
	r.cacheLocked(k, responseMapping{At: time.Now().UnixNano()})
	r.mu.Unlock()
}

// queue hands op to the KV writer without blocking: with its queue full
// (NATS slow or down) the write is dropped and counted.
func (r *ResponseStore) queue(id string, op mappingOp) {
	select {
	case r.ops <- op:
	default:
		r.drop(id)
	}
}

func (r *ResponseStore) drop(id string) {
	n := r.dropped.Add(1)
	r.logSometimes("responses: KV write queue full (NATS slow or down): mapping of %s not shared with other gateways (%d dropped so far)", id, n)
}

// logSometimes logs at most once every 10 s: what it reports happens on
// every call while NATS is down.
func (r *ResponseStore) logSometimes(format string, args ...any) {
	now := time.Now().UnixNano()
	if last := r.lastLog.Load(); now-last > int64(10*time.Second) && r.lastLog.CompareAndSwap(last, now) {
		r.logf(format, args...)
	}
}

func (r *ResponseStore) cache(k stateKey, m responseMapping) {
	r.mu.Lock()
	r.cacheLocked(k, m)
	r.mu.Unlock()
}

// cacheLocked is cache; r.mu must be held.
func (r *ResponseStore) cacheLocked(k stateKey, m responseMapping) {
	if len(r.cur) >= cacheGeneration {
		r.old, r.cur = r.cur, make(map[stateKey]responseMapping, cacheGeneration/4)
	}
	r.cur[k] = m
}

// errMappingsUnavailable wraps a KV lookup that failed (not a missing id).
var errMappingsUnavailable = errors.New("response mappings unavailable")

// lookup finds who holds response id: in memory, else in KV. found is
// false for an id never remembered or past the TTL; err is set only when
// KV could not answer.
func (r *ResponseStore) lookup(ctx context.Context, id string) (m responseMapping, found bool, err error) {
	return r.find(ctx, stateKey{id: id})
}

// lookupItem finds who holds the output item id, as lookup does a
// response.
func (r *ResponseStore) lookupItem(ctx context.Context, id string) (m responseMapping, found bool, err error) {
	return r.find(ctx, stateKey{id: id, item: true})
}

func (r *ResponseStore) find(ctx context.Context, k stateKey) (m responseMapping, found bool, err error) {
	id := k.id
	if id == "" || len(id) > maxResponseID {
		return m, false, nil
	}
	ttl := r.ttl.Load()
	r.mu.Lock()
	m, found = r.cur[k]
	if !found {
		m, found = r.old[k]
	}
	r.mu.Unlock()
	if found && time.Now().UnixNano()-m.At < ttl {
		if m.Upstream == "" {
			return responseMapping{}, false, nil // forgotten here (a tombstone)
		}
		return m, true, nil
	}
	if r.kv == nil {
		return responseMapping{}, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, kvLookupTimeout)
	defer cancel()
	key := mappingKey(id)
	if k.item {
		key = itemKey(id)
	}
	var value []byte
	e, err := r.kv.Get(ctx, key)
	if err == nil {
		value = e.Value()
	} else if errors.Is(err, jetstream.ErrKeyNotFound) && r.readLeader != nil {
		// A get on a replicated bucket is a direct get, which any replica
		// answers, behind the leader by milliseconds, or by seconds while
		// the leader is being elected: a miss there is not an answer. Only
		// the leader's is; with no leader, the mapping cannot be read,
		// and the caller is told to try again, not that the id is unknown.
		value, err = r.readLeader(ctx, key)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return responseMapping{}, false, nil
	case err != nil:
		return responseMapping{}, false, fmt.Errorf("%w: %v", errMappingsUnavailable, err)
	}
	if err := json.Unmarshal(value, &m); err != nil || m.Upstream == "" {
		r.logf("responses: mapping of %s in KV is unreadable: %q", id, value)
		return responseMapping{}, false, nil
	}
	if time.Now().UnixNano()-m.At >= ttl {
		return responseMapping{}, false, nil
	}
	r.cache(k, m)
	return m, true, nil
}

// write is the one goroutine that writes mappings to KV.
func (r *ResponseStore) write() {
	defer close(r.done)
	for {
		select {
		case op := <-r.ops:
			if !r.apply(op) {
				r.abandoned()
				return
			}
		case ttl := <-r.ttlCh:
			ctx, cancel := context.WithTimeout(r.writes, kvWriteTimeout)
			if err := r.retune(ctx, ttl); err != nil {
				r.logf("responses: setting the bucket's TTL to %s: %v", ttl, err)
			}
			cancel()
		case <-r.stop:
			for {
				select {
				case op := <-r.ops:
					if !r.apply(op) {
						r.abandoned()
						return
					}
				default:
					return
				}
			}
		}
	}
}

// abandoned says what Close left unwritten: the write it stopped and
// the queue behind it.
func (r *ResponseStore) abandoned() {
	r.logf("responses: %d mapping writes not done at shutdown", len(r.ops)+1)
}

// apply writes op to KV, and reports false only when Close stopped it
// first. A write KV fails (no stream leader during an election, a node
// down, a timeout) is tried again, at growing intervals, until KV has
// been failing for kvRetryFor: a mapping given up on is one every other
// gateway refuses as unknown for good. The writes queued behind it wait,
// so that no later write of the same id (its tokens, its delete)
// overtakes it; what does not fit the queue meanwhile is dropped, as
// when NATS is down. KV failing for longer is NATS down: each write is
// then tried once and given up, until one goes through again.
func (r *ResponseStore) apply(op mappingOp) bool {
	wait := kvRetryFirst
	for {
		err := r.put(op)
		if err == nil {
			if !r.failingSince.IsZero() {
				r.logf("responses: KV takes mapping writes again, after failing them for %s", time.Since(r.failingSince).Round(time.Millisecond))
				r.failingSince = time.Time{}
			}
			if !op.del {
				r.stored.Add(1)
			}
			return true
		}
		if r.writes.Err() != nil {
			return false
		}
		if r.failingSince.IsZero() {
			r.failingSince = time.Now()
		}
		// A closed connection is closed for good (this process closes it,
		// or it ran out of reconnects): no try would go through.
		if time.Since(r.failingSince) >= kvRetryFor || errors.Is(err, nats.ErrConnectionClosed) {
			n := r.failed.Add(1)
			r.logSometimes("responses: writing the mapping %s to KV: %v (%d failed so far)", op.key, err, n)
			return true
		}
		select {
		case <-time.After(wait):
		case <-r.writes.Done():
			return false
		}
		wait = min(2*wait, kvRetryMax)
	}
}

// put writes op to KV once.
func (r *ResponseStore) put(op mappingOp) error {
	ctx, cancel := context.WithTimeout(r.writes, kvWriteTimeout)
	defer cancel()
	if op.del {
		return r.kv.Delete(ctx, op.key)
	}
	value, err := json.Marshal(&op.record)
	if err != nil {
		return err
	}
	_, err = r.kv.Put(ctx, op.key, value)
	return err
}

// replicatedKV is the bucket with replicas > 1: a jetstream.KeyValue and
// its leader's reads.
type replicatedKV struct {
	jetstream.KeyValue
	js jetstream.JetStream
}

func newReplicatedKV(kv jetstream.KeyValue, js jetstream.JetStream) *replicatedKV {
	return &replicatedKV{KeyValue: kv, js: js}
}

// GetFromLeader returns jetstream.ErrKeyNotFound for a key the leader
// does not hold, or holds deleted (broker.LeaderGet).
func (kv *replicatedKV) GetFromLeader(ctx context.Context, key string) ([]byte, error) {
	entry, err := broker.LeaderGet(ctx, kv.js, kv.KeyValue, key)
	if err != nil {
		return nil, err
	}
	return entry.Value(), nil
}

// mappingKey is id as a KV key: as it is when it uses only letters,
// digits, '_' and '-' (every id OpenAI and vLLM make), else hex-encoded
// behind "x.", which no plain id can start with.
func mappingKey(id string) string {
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return "x." + hex.EncodeToString([]byte(id))
		}
	}
	return id
}

// itemKey is an output item's id as a KV key: "item." before its
// mappingKey, which a response's key (no '.' but in "x.") never starts with.
func itemKey(id string) string {
	return "item." + mappingKey(id)
}

// metrics appends the store's Prometheus series to b.
func (r *ResponseStore) metrics(b []byte) []byte {
	return fmt.Appendf(b, `# HELP tollgate_response_mappings_stored_total Response id mappings written to JetStream KV.
# TYPE tollgate_response_mappings_stored_total counter
tollgate_response_mappings_stored_total %d
# HELP tollgate_response_mappings_dropped_total Response id mappings not written because the queue was full (NATS slow or down).
# TYPE tollgate_response_mappings_dropped_total counter
tollgate_response_mappings_dropped_total %d
# HELP tollgate_response_mappings_failed_total Response id mapping writes JetStream KV refused or timed out.
# TYPE tollgate_response_mappings_failed_total counter
tollgate_response_mappings_failed_total %d
`, r.stored.Load(), r.dropped.Load(), r.failed.Load())
}
