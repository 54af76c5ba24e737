package broker

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
)

func TestLeaderGetReadsTheLatestValueAndMissesDeletedKeys(t *testing.T) {
	ctx := testContext(t)
	b := startEmbeddedBroker(t, t.TempDir())
	defer b.Close()
	kv, err := EnsureKV(ctx, b.JetStream(), jetstream.KeyValueConfig{Bucket: "LEADER_GET", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "a.b", []byte("one")); err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, "a.b", []byte("two"))
	if err != nil {
		t.Fatal(err)
	}
	entry, err := LeaderGet(ctx, b.JetStream(), kv, "a.b")
	if err != nil {
		t.Fatalf("a key just put: %v", err)
	}
	if string(entry.Value()) != "two" || entry.Revision() != rev || entry.Key() != "a.b" || entry.Bucket() != "LEADER_GET" {
		t.Fatalf("read %q at revision %d of %s/%s, want %q at %d of LEADER_GET/a.b", entry.Value(), entry.Revision(), entry.Bucket(), entry.Key(), "two", rev)
	}
	// A revision read there updates the key, as one of kv.Get does.
	if _, err := kv.Update(ctx, "a.b", []byte("three"), entry.Revision()); err != nil {
		t.Fatalf("updating at the revision read: %v", err)
	}

	if _, err := LeaderGet(ctx, b.JetStream(), kv, "never"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a key never put: %v, want jetstream.ErrKeyNotFound", err)
	}
	if err := kv.Delete(ctx, "a.b"); err != nil {
		t.Fatal(err)
	}
	if _, err := LeaderGet(ctx, b.JetStream(), kv, "a.b"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a deleted key: %v, want jetstream.ErrKeyNotFound", err)
	}
	if _, err := kv.Put(ctx, "c", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := LeaderGet(ctx, b.JetStream(), kv, "c"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a purged key: %v, want jetstream.ErrKeyNotFound", err)
	}
}

// No answer is not "not found": the key may exist.
func TestLeaderGetUnansweredIsUnavailable(t *testing.T) {
	ctx := testContext(t)
	b := startEmbeddedBroker(t, t.TempDir())
	defer b.Close()
	kv, err := EnsureKV(ctx, b.JetStream(), jetstream.KeyValueConfig{Bucket: "LEADER_GET"})
	if err != nil {
		t.Fatal(err)
	}
	unanswered, err := jetstream.NewWithAPIPrefix(b.Conn(), "$NOBODY.API")
	if err != nil {
		t.Fatal(err)
	}
	_, err = LeaderGet(ctx, unanswered, kv, "k")
	if !errors.Is(err, ErrLeaderUnavailable) || errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a read nobody answered: %v, want ErrLeaderUnavailable", err)
	}
}

// On a cluster the leader answers a client connected to any node, and
// what a write acknowledged is read there at once.
func TestLeaderGetOnAClusterFromEveryNode(t *testing.T) {
	ctx := testContext(t)
	_, urls := testutil.StartNATSCluster(t, 3)
	var kvs []jetstream.KeyValue
	var jss []jetstream.JetStream
	for i, url := range urls {
		b, err := Start(ctx, config.NATS{URL: url, Replicas: 3}, t.TempDir(), nil)
		if err != nil {
			t.Fatalf("connecting to node %d: %v", i+1, err)
		}
		t.Cleanup(b.Close)
		kv, err := EnsureKV(ctx, b.JetStream(), jetstream.KeyValueConfig{Bucket: "LEADER_GET", History: 1, Replicas: 3})
		if err != nil {
			t.Fatal(err)
		}
		kvs, jss = append(kvs, kv), append(jss, b.JetStream())
	}
	for round := range 20 {
		writer := round % 3
		key := fmt.Sprintf("k%d", round)
		if _, err := kvs[writer].Create(ctx, key, []byte(key)); err != nil {
			t.Fatal(err)
		}
		for reader := range 3 {
			entry, err := LeaderGet(ctx, jss[reader], kvs[reader], key)
			if err != nil || string(entry.Value()) != key {
				t.Fatalf("%s written through node %d, read through node %d: %v", key, writer+1, reader+1, err)
			}
		}
	}
}
