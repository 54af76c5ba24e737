package accounts

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
)

var testAuth = config.Auth{Algorithm: "EdDSA", Issuer: "tollgate-test"}

func testContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startBroker runs an embedded nats-server on a random loopback port.
func startBroker(t testing.TB, dataDir string) *broker.Broker {
	t.Helper()
	b, err := broker.Start(testContext(t), config.NATS{EmbeddedListen: "127.0.0.1:0"}, dataDir, nil)
	if err != nil {
		t.Fatalf("starting broker: %v", err)
	}
	return b
}

// connectBroker is another gateway's own connection to a running server.
func connectBroker(t testing.TB, url string) *broker.Broker {
	t.Helper()
	b, err := broker.Start(testContext(t), config.NATS{URL: url}, t.TempDir(), nil)
	if err != nil {
		t.Fatalf("connecting to %s: %v", url, err)
	}
	return b
}

func openService(t testing.TB, b *broker.Broker, dataDir string) *Service {
	t.Helper()
	s, err := Open(testContext(t), b.JetStream(), b.Replicas(), dataDir, testAuth)
	if err != nil {
		t.Fatalf("opening accounts: %v", err)
	}
	return s
}

// gateway is one Service on its own broker, cleaned up with the test.
func gateway(t testing.TB) (*Service, *broker.Broker, string) {
	t.Helper()
	dataDir := t.TempDir()
	b := startBroker(t, dataDir)
	s := openService(t, b, dataDir)
	t.Cleanup(func() { s.Close(); b.Close() })
	return s, b, dataDir
}

// secondGateway opens another Service on its own connection to the same
// NATS, with a copy of the first gateway's signing key, as a cluster runs.
func secondGateway(t testing.TB, first *broker.Broker, firstDataDir string) *Service {
	t.Helper()
	dataDir := t.TempDir()
	key, err := os.ReadFile(filepath.Join(firstDataDir, SigningKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dataDir, SigningKeyFile), key, 0o600); err != nil {
		t.Fatal(err)
	}
	b := connectBroker(t, first.ClientURL())
	s := openService(t, b, dataDir)
	t.Cleanup(func() { s.Close(); b.Close() })
	return s
}

// checkFor polls fn until it returns nil or total passes.
var checkFor = testutil.CheckFor
