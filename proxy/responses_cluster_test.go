package proxy

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/tollgate/tollgate/internal/testutil"
)

// The mappings of two gateways on a three-node cluster, replicas 3, while
// the node leading the bucket is shut down: every response gateway A
// makes meanwhile lands in KV, and gateway B, asked for each 50 ms after
// A made it (and once more, as previousResponse does), finds it or says
// it cannot look it up now (503), never that it does not exist (400),
// once A's write went through. (One A is still writing, the leader
// rightly does not hold yet.) A shutdown hands the leadership over,
// where a SIGKILL leaves none for seconds; the fake KVs above stand for
// that.
func TestResponseMappingsThroughAnElection(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-node cluster and an election")
	}
	servers, nodes := testutil.StartNATSCluster(t, 3)
	urls := strings.Join(nodes, ",")
	open := func(name string) *ResponseStore {
		_, js := testutil.ConnectJetStream(t, urls, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := OpenResponseStore(ctx, js, 3, time.Hour, func(f string, a ...any) { t.Logf(name+": "+f, a...) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r
	}
	a, b := open("gateway-a"), open("gateway-b")
	written := &ackTimes{mappingKV: a.kv, at: map[string]time.Time{}}
	a.kv = written // before any write: the writer reads it after a queued op
	if _, ok := b.kv.(*replicatedKV); !ok {
		t.Fatalf("a bucket of 3 replicas is read as %T", b.kv)
	}

	// The leader's own reads: what it holds, what it does not, what was
	// deleted.
	ctx := context.Background()
	a.remember("resp_kept", "gpu-a", "acme", "small", true)
	a.remember("resp_gone", "gpu-a", "acme", "small", true)
	a.forget("resp_gone")
	kv := b.kv.(*replicatedKV)
	checkWithin(t, 5*time.Second, func() bool {
		_, err := kv.GetFromLeader(ctx, "resp_gone")
		v, _ := kv.GetFromLeader(ctx, "resp_kept")
		return errors.Is(err, jetstream.ErrKeyNotFound) && strings.Contains(string(v), `"gpu-a"`)
	})
	if _, err := kv.GetFromLeader(ctx, "resp_never"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the leader asked for a key it never held: %v", err)
	}

	leader := -1
	for i, srv := range servers {
		if srv.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, "KV_"+BucketResponses) {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no node leads the bucket")
	}
	var (
		mu        sync.Mutex
		made      []string
		found     int
		said503   int
		notFound  []string
		late      int // not found, A still writing it
		stop      = make(chan struct{})
		continued sync.WaitGroup
	)
	continued.Add(1)
	go func() {
		defer continued.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			id := "resp_" + strconv.Itoa(i)
			a.remember(id, "gpu-a", "acme", "small", true)
			mu.Lock()
			made = append(made, id)
			mu.Unlock()
			continued.Add(1)
			time.AfterFunc(50*time.Millisecond, func() {
				defer continued.Done()
				asked := time.Now()
				_, ok, err := b.lookupLate(id)
				ackedBefore := written.before(id, asked)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					said503++
				case ok:
					found++
				case ackedBefore:
					notFound = append(notFound, id)
				default:
					late++
				}
			})
		}
	}()
	time.Sleep(500 * time.Millisecond)
	t.Logf("shutting down the bucket's leader, node n%d", leader+1)
	servers[leader].Shutdown()
	servers[leader].WaitForShutdown()
	time.Sleep(8 * time.Second)
	close(stop)
	continued.Wait()
	t.Logf("%d responses made; 50 ms later through gateway B: %d found, %d 503, %d not found while A was still writing them, %d not found though written",
		len(made), found, said503, late, len(notFound))
	if len(notFound) > 0 {
		t.Errorf("gateway B found no mapping of %d responses already in KV (400 previous_response_not_found): %v", len(notFound), notFound)
	}
	// Every mapping lands: B, which has not seen them, finds each in KV.
	fresh := open("gateway-c")
	checkWithin(t, 15*time.Second, func() bool {
		for _, id := range made {
			if _, ok, _ := fresh.lookup(context.Background(), id); !ok {
				return false
			}
		}
		return true
	})
	if n := a.failed.Load() + a.dropped.Load(); n != 0 {
		t.Errorf("%d mapping writes given up or dropped through the election", n)
	}
}

// ackTimes is a mappingKV that notes when each key's first write went
// through.
type ackTimes struct {
	mappingKV
	mu sync.Mutex
	at map[string]time.Time
}

func (k *ackTimes) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := k.mappingKV.Put(ctx, key, value)
	if err == nil {
		k.mu.Lock()
		if _, ok := k.at[key]; !ok {
			k.at[key] = time.Now()
		}
		k.mu.Unlock()
	}
	return rev, err
}

// before reports whether key's write went through before t.
func (k *ackTimes) before(key string, t time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	at, ok := k.at[key]
	return ok && at.Before(t)
}
