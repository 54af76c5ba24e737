package main

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
)

// Closing the publisher waited 10 s for acknowledgements no NATS could
// send: a gateway SIGTERMed with NATS down took 16 s to exit, past
// docker stop's 10 s. Down, it waits a second.
func TestPublisherCloseWaitsLittleWithNATSDown(t *testing.T) {
	b, err := broker.Start(context.Background(), config.NATS{EmbeddedListen: "127.0.0.1:0"}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := publisherCloseWait(b.Conn(), b.StoreError()); got != 10*time.Second {
		t.Errorf("connected: %s, want 10s", got)
	}
	nc, err := nats.Connect(b.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	b.Close() // the server goes; nc is left reconnecting
	deadline := time.Now().Add(5 * time.Second)
	for nc.IsConnected() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := publisherCloseWait(nc, nil); got != time.Second {
		t.Errorf("NATS down: %s, want 1s", got)
	}
}
