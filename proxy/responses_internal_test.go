package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// stuckKV is a KV whose writes hang until released and whose reads answer
// from values or fail with err.
type stuckKV struct {
	release chan struct{}
	puts    atomic.Int64
	gets    atomic.Int64
	values  map[string][]byte
	err     error
}

func (k *stuckKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	select {
	case <-k.release:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	k.puts.Add(1)
	return 1, nil
}

func (k *stuckKV) Delete(context.Context, string, ...jetstream.KVDeleteOpt) error { return nil }

func (k *stuckKV) Get(_ context.Context, key string) (jetstream.KeyValueEntry, error) {
	k.gets.Add(1)
	if k.err != nil {
		return nil, k.err
	}
	v, ok := k.values[key]
	if !ok {
		return nil, jetstream.ErrKeyNotFound
	}
	return entry(v), nil
}

type entry []byte

func (e entry) Bucket() string                  { return BucketResponses }
func (e entry) Key() string                     { return "" }
func (e entry) Value() []byte                   { return e }
func (e entry) Revision() uint64                { return 1 }
func (e entry) Created() time.Time              { return time.Now() }
func (e entry) Delta() uint64                   { return 0 }
func (e entry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }

// TestRememberNeverWaitsOnKV: with KV writes stuck, remembering stays
// immediate; what does not fit the queue is dropped and counted, and this
// gateway still finds every id in memory.
func TestRememberNeverWaitsOnKV(t *testing.T) {
	kv := &stuckKV{release: make(chan struct{})}
	r := newResponseStore(kv, time.Hour, t.Logf)
	r.start()
	const n = mappingQueue + 1000
	began := time.Now()
	for i := range n {
		r.remember("resp_"+strconv.Itoa(i), "gpu-a", "acme", "small", true)
	}
	// 0.3-0.6 s under the race detector on a busy machine; remembers
	// that waited 10 ms each for room in the queue took 10 s over the
	// 1000 dropped.
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("%d remembers took %v with KV stuck", n, took)
	}
	if d := r.dropped.Load(); d < 900 {
		t.Fatalf("%d dropped, want about 1000", d)
	}
	m, found, err := r.lookup(context.Background(), "resp_0")
	if err != nil || !found || m.Upstream != "gpu-a" || m.Account != "acme" || kv.gets.Load() != 0 {
		t.Fatalf("lookup from memory: %+v %v %v, %d KV reads", m, found, err, kv.gets.Load())
	}
	close(kv.release)
	r.Close()
	if got := kv.puts.Load() + int64(r.dropped.Load()); got != n {
		t.Fatalf("%d written + dropped, want %d", got, n)
	}
}

func TestLookupAsksKVAndKeepsWhatItFound(t *testing.T) {
	kv := &stuckKV{values: map[string][]byte{
		"resp_1":               []byte(`{"upstream":"gpu-b","account":"acme","at":` + itoa(time.Now().UnixNano()) + `}`),
		"resp_old":             []byte(`{"upstream":"gpu-b","account":"acme","at":` + itoa(time.Now().Add(-2*time.Hour).UnixNano()) + `}`),
		mappingKey("odd.id/1"): []byte(`{"upstream":"gpu-c","account":"acme","at":` + itoa(time.Now().UnixNano()) + `}`),
	}}
	r := newResponseStore(kv, time.Hour, t.Logf)
	for i := range 2 {
		m, found, err := r.lookup(context.Background(), "resp_1")
		if err != nil || !found || m.Upstream != "gpu-b" || kv.gets.Load() != 1 {
			t.Fatalf("lookup %d: %+v %v %v, %d KV reads", i, m, found, err, kv.gets.Load())
		}
	}
	if m, found, _ := r.lookup(context.Background(), "odd.id/1"); !found || m.Upstream != "gpu-c" {
		t.Fatalf("an id that is not a plain KV key: %+v %v", m, found)
	}
	if _, found, err := r.lookup(context.Background(), "resp_old"); found || err != nil {
		t.Fatalf("a mapping past the TTL: %v %v", found, err)
	}
	if _, found, err := r.lookup(context.Background(), "resp_none"); found || err != nil {
		t.Fatalf("an unknown id: %v %v", found, err)
	}
	kv.err = errors.New("nats: timeout")
	if _, found, err := r.lookup(context.Background(), "resp_2"); found || !errors.Is(err, errMappingsUnavailable) {
		t.Fatalf("KV failing: %v %v", found, err)
	}
	if _, found, err := r.lookup(context.Background(), "resp_1"); !found || err != nil {
		t.Fatalf("a cached id with KV failing: %v %v", found, err)
	}
	r.forget("resp_1")
	kv.err = nil
	delete(kv.values, "resp_1")
	if _, found, _ := r.lookup(context.Background(), "resp_1"); found {
		t.Fatal("a forgotten id was found")
	}
}

func TestMappingKey(t *testing.T) {
	for id, want := range map[string]string{
		"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
		"resp-AbC_09": "resp-AbC_09",
		"a.b":         "x.612e62",
		"x.612e62":    "x.782e363132653632",
	} {
		if got := mappingKey(id); got != want {
			t.Errorf("mappingKey(%q) = %q, want %q", id, got, want)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// electionKV is a KV through a leader election: its writes fail, as
// nats.go's do with no stream leader, until healed; it keeps the writes
// that went through, in order.
type electionKV struct {
	mu     sync.Mutex
	healed bool
	failed int
	writes []string // "put key value" or "del key"
}

func (k *electionKV) write(w string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.healed {
		k.failed++
		return nats.ErrNoStreamResponse
	}
	k.writes = append(k.writes, w)
	return nil
}

func (k *electionKV) Put(_ context.Context, key string, value []byte) (uint64, error) {
	return 1, k.write("put " + key + " " + string(value))
}

func (k *electionKV) Delete(_ context.Context, key string, _ ...jetstream.KVDeleteOpt) error {
	return k.write("del " + key)
}

func (k *electionKV) Get(context.Context, string) (jetstream.KeyValueEntry, error) {
	return nil, jetstream.ErrKeyNotFound
}

func (k *electionKV) heal() {
	k.mu.Lock()
	k.healed = true
	k.mu.Unlock()
}

func (k *electionKV) written() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.writes)
}

// A mapping write KV failed (no stream leader: a node of a three-node
// cluster SIGKILLed) was given up at once: the responses made in the
// first seconds of the election were missing from KV for good, and every
// other gateway refused them 400 previous_response_not_found. They are
// written once the election is over, in the order they were made.
func TestMappingWritesOutlastAnElection(t *testing.T) {
	kv := &electionKV{}
	r := newResponseStore(kv, time.Hour, t.Logf)
	r.start()
	defer r.Close()
	r.remember("resp_1", "gpu-a", "acme", "small", true)
	r.setTokens("resp_1", 40)
	r.remember("resp_2", "gpu-a", "acme", "small", true)
	r.forget("resp_2")
	r.rememberItem("msg_1", "gpu-a", "acme", "small")
	checkWithin(t, 2*time.Second, func() bool { kv.mu.Lock(); defer kv.mu.Unlock(); return kv.failed >= 3 })
	time.Sleep(time.Second) // the election goes on
	kv.heal()
	want := []string{"put resp_1 0", "put resp_1 40", "put resp_2 0", "del resp_2", "put item.msg_1 0"}
	waitFor(3*time.Second, func() bool { return len(kv.written()) >= len(want) })
	var got []string
	for _, w := range kv.written() {
		fields := strings.SplitN(w, " ", 3)
		if fields[0] == "put" {
			var m responseMapping
			if err := json.Unmarshal([]byte(fields[2]), &m); err != nil || m.Upstream != "gpu-a" {
				t.Fatalf("%s: %v", w, err)
			}
			fields[2] = strconv.FormatInt(m.Tokens, 10)
		}
		got = append(got, strings.Join(fields, " "))
	}
	if !slices.Equal(got, want) {
		t.Errorf("KV was written\n%q\nwant\n%q", got, want)
	}
	if n := r.failed.Load(); n != 0 {
		t.Errorf("%d mapping writes given up during a 1 s election", n)
	}
}

// Close still waits a few seconds at most for the writes queued, however
// long KV goes on failing them, and leaves no writer behind.
func TestCloseWaitsBoundedForAFailingKV(t *testing.T) {
	kv := &electionKV{}
	r := newResponseStore(kv, time.Hour, t.Logf)
	r.start()
	for i := range 10 {
		r.remember("resp_"+strconv.Itoa(i), "gpu-a", "acme", "small", true)
	}
	began := time.Now()
	r.Close()
	if took := time.Since(began); took > 2*kvWriteTimeout+time.Second {
		t.Fatalf("Close took %v with KV failing", took)
	}
	select {
	case <-r.done:
	default:
		t.Fatal("the writer still runs after Close")
	}
}

// staleKV is a replicated bucket seen through a replica that is behind:
// every get misses; its leader answers from leader, or not at all
// (an election) when noLeader is set.
type staleKV struct {
	electionKV
	leader   map[string][]byte
	noLeader bool
	reads    atomic.Int64
}

func (k *staleKV) GetFromLeader(ctx context.Context, key string) ([]byte, error) {
	k.reads.Add(1)
	if k.noLeader {
		<-ctx.Done()
		return nil, nats.ErrTimeout
	}
	v, ok := k.leader[key]
	if !ok {
		return nil, jetstream.ErrKeyNotFound
	}
	return v, nil
}

// A miss on a replicated bucket was taken as final, though any replica
// answers a get, possibly behind the leader, and every one is behind
// while a leader is elected: previous_response_id through another
// gateway answered 400 previous_response_not_found for responses that
// existed, during every election and for as long as a quorum was lost.
// The leader's answer is final; with no leader, the mapping is
// unavailable (503 state_unavailable), not missing.
func TestAMissOnAReplicaIsAskedOfTheLeader(t *testing.T) {
	kv := &staleKV{leader: map[string][]byte{
		"resp_1":     []byte(`{"upstream":"gpu-b","account":"acme","at":` + itoa(time.Now().UnixNano()) + `}`),
		"item.msg_1": []byte(`{"upstream":"gpu-b","account":"acme","at":` + itoa(time.Now().UnixNano()) + `}`),
	}}
	r := newResponseStore(kv, time.Hour, t.Logf)
	if m, found, err := r.lookup(context.Background(), "resp_1"); err != nil || !found || m.Upstream != "gpu-b" {
		t.Errorf("an id a replica has not caught up with: %+v %v %v", m, found, err)
	}
	if m, found, err := r.lookupItem(context.Background(), "msg_1"); err != nil || !found || m.Upstream != "gpu-b" {
		t.Errorf("an item a replica has not caught up with: %+v %v %v", m, found, err)
	}
	if _, found, err := r.lookup(context.Background(), "resp_none"); found || err != nil {
		t.Errorf("an id the leader does not hold either: %v %v", found, err)
	}
	kv.noLeader = true
	began := time.Now()
	_, found, err := r.lookup(context.Background(), "resp_2")
	if found || !errors.Is(err, errMappingsUnavailable) {
		t.Errorf("an id missed while no leader answers: %v %v, want %v", found, err, errMappingsUnavailable)
	}
	if took := time.Since(began); took > kvLookupTimeout+200*time.Millisecond {
		t.Errorf("the lookup took %v, past its %v", took, kvLookupTimeout)
	}
	// A bucket of one replica has no leader to ask apart: its miss is final.
	one := newResponseStore(&electionKV{}, time.Hour, t.Logf)
	if _, found, err := one.lookup(context.Background(), "resp_none"); found || err != nil {
		t.Errorf("a miss on a bucket of one replica: %v %v", found, err)
	}
}

func checkWithin(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	if !waitFor(d, ok) {
		t.Fatalf("not so within %v", d)
	}
}

// waitFor reports whether ok holds within d.
func waitFor(d time.Duration, ok func() bool) bool {
	for deadline := time.Now().Add(d); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}
