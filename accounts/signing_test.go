package accounts

import (
	"errors"
	"strings"
	"testing"
)

// TestGatewaysMustShareTheSigningKey: a gateway started on the NATS of
// others with a signing key of its own is refused at start, naming the
// file to copy; started without one, it accepted only the keys it issued
// and issued keys the others refused, and nothing said why. A process
// opened without a data dir (billing, worker) holds no key and needs none.
func TestGatewaysMustShareTheSigningKey(t *testing.T) {
	_, b, dataDir := gateway(t)
	secondGateway(t, b, dataDir) // with a copy: fine

	other := t.TempDir()
	b2 := connectBroker(t, b.ClientURL())
	t.Cleanup(b2.Close)
	_, err := Open(testContext(t), b2.JetStream(), b2.Replicas(), other, testAuth)
	if err == nil || !strings.Contains(err.Error(), "is not the signing key published on this NATS") ||
		!strings.Contains(err.Error(), "Copy signing.key") || !strings.Contains(err.Error(), "nats kv del TOLLGATE_SIGNING public") {
		t.Fatalf("a gateway with its own signing key: %v, want refused", err)
	}

	billing, err := Open(testContext(t), b2.JetStream(), b2.Replicas(), "", testAuth)
	if err != nil {
		t.Fatalf("opened without a data dir: %v", err)
	}
	t.Cleanup(billing.Close)
	if _, _, err := billing.CreateKey(testContext(t), "acme", KeyRequest{Name: "x"}); !errors.Is(err, errNoSigningKey) {
		t.Errorf("CreateKey without a signing key: %v", err)
	}
	if _, err := billing.Verify([]byte(TokenPrefix + "x")); !errors.Is(err, errNoSigningKey) {
		t.Errorf("Verify without a signing key: %v", err)
	}
}
