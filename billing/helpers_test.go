package billing_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
)

func testContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startNATS is an embedded nats-server with JetStream on a random
// loopback port, stopped when the test ends.
func startNATS(t testing.TB) *broker.Broker {
	t.Helper()
	b, err := broker.Start(testContext(t), config.NATS{EmbeddedListen: "127.0.0.1:0"}, t.TempDir(), nil)
	if err != nil {
		t.Fatalf("starting nats: %v", err)
	}
	t.Cleanup(b.Close)
	return b
}

// syncLog is a logf that may be called from any goroutine until the test
// ends: billing logs from its own goroutines, which may outlive t.
func syncLog(t testing.TB) func(string, ...any) {
	var mu sync.Mutex
	done := false
	t.Cleanup(func() { mu.Lock(); done = true; mu.Unlock() })
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			t.Logf(format, args...)
		}
	}
}

// usageEvent is event i of a reproducible series spread over the accounts
// acct-0 … acct-4, with costs that are not round numbers.
func usageEvent(i int) *meter.Event {
	return &meter.Event{
		ID:               fmt.Sprintf("evt-%07d", i),
		Time:             time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Millisecond),
		Account:          fmt.Sprintf("acct-%d", i%5),
		KeyID:            "key-1",
		Endpoint:         "/v1/chat/completions",
		Model:            "small",
		Upstream:         "local",
		PromptTokens:     int64(10 + i%1000),
		CompletionTokens: int64(1 + i%97),
		CostNanos:        money.Nanos(1_000_003 + int64(i%7919)*13),
		UsageSource:      meter.SourceUpstream,
		Status:           200,
		Latency:          time.Duration(i%500) * time.Millisecond,
	}
}
