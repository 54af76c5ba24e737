package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
)

// `tollgate batch reindex` said "of 1 accounts".
func TestBatchReindexCountsAccounts(t *testing.T) {
	t.Setenv("TOLLGATE_CONFIG", "")
	dir := t.TempDir()
	b, err := broker.Start(context.Background(), config.NATS{EmbeddedListen: "127.0.0.1:0"}, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	kv, err := b.JetStream().CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: batch.NewestBucket})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gateway.yaml")
	yaml := fmt.Sprintf("server:\n  data_dir: %s\nnats:\n  url: %s\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\nmodels:\n  - id: m1\n    context_length: 100\n    max_output_length: 10\n", dir, b.ClientURL())
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		accounts []string
		want     string
	}{
		{[]string{"acme"}, "deleted the index of newest batch jobs of 1 account: its next GET /v1/batch rebuilds it\n"},
		{[]string{"acme", "beta"}, "deleted the index of newest batch jobs of 2 accounts: the next GET /v1/batch of each rebuilds it\n"},
	} {
		for _, account := range tc.accounts {
			if _, err := kv.Put(t.Context(), account, []byte(`{"ids":[]}`)); err != nil {
				t.Fatal(err)
			}
		}
		out, err := stdoutOf(t, func() error { return runBatch([]string{"reindex", path}) })
		if err != nil || out != tc.want {
			t.Errorf("batch reindex of %d accounts printed %q, %v; want %q", len(tc.accounts), out, err, tc.want)
		}
	}
}
