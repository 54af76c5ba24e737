package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
)

// brokerOnFullDisk starts an embedded broker on a small disk, fills the
// disk and writes to a bucket until the store refuses: from then on
// nats-server refuses every write to that stream.
func brokerOnFullDisk(t *testing.T) *broker.Broker {
	t.Helper()
	dataDir := testutil.SmallDisk(t, 16<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := broker.Start(ctx, config.NATS{EmbeddedListen: "127.0.0.1:0"}, dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	kv, err := broker.EnsureKV(ctx, b.JetStream(), jetstream.KeyValueConfig{Bucket: "FULL"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.StoreError(); err != nil {
		t.Fatalf("StoreError before the disk filled: %v", err)
	}
	testutil.FillDisk(t, dataDir)
	testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		c, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := kv.Put(c, "k", make([]byte, 64<<10)); err == nil {
			return errors.New("every write taken on the full disk")
		}
		if b.StoreError() == nil {
			return errors.New("a write refused, and StoreError nil")
		}
		return nil
	})
	return b
}

// Once the embedded store failed a write it refused every later one, and
// /metrics showed it only as the outbox growing while
// tollgate_nats_connected was 1 (and not at all for the KV buckets).
func TestMetricsSayTheEmbeddedStoreCannotWrite(t *testing.T) {
	b := brokerOnFullDisk(t)
	text := string(storeMetrics(b))
	if !strings.Contains(text, "\ntollgate_nats_store_writable 0\n") {
		t.Errorf("metrics with the store refusing writes:\n%s\nwant tollgate_nats_store_writable 0", text)
	}
}

func TestMetricsSayTheEmbeddedStoreWrites(t *testing.T) {
	b, err := broker.Start(context.Background(), config.NATS{EmbeddedListen: "127.0.0.1:0"}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if text := string(storeMetrics(b)); !strings.Contains(text, "\ntollgate_nats_store_writable 1\n") {
		t.Errorf("metrics with the store writing:\n%s\nwant tollgate_nats_store_writable 1", text)
	}
}

// Closing the publisher waited 10 s for acknowledgements while the
// embedded store refused writes, which nats-server answers with nothing:
// a gateway SIGTERMed with its store's disk full took 11 to 14 s to exit,
// and docker stop's 10 s ended in a SIGKILL. It waits a second, as with
// NATS down; what is not acknowledged stays in the outbox.
func TestPublisherCloseWaitsLittleWhileTheStoreRefusesWrites(t *testing.T) {
	b := brokerOnFullDisk(t)
	if got := publisherCloseWait(b.Conn(), b.StoreError()); got != time.Second {
		t.Errorf("store refusing writes: %s, want 1s", got)
	}
}
