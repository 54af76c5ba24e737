package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/chtest"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/meter"
)

// A DSN whose settings ClickHouse refuses (?sekure=true) was retried
// every 30 s forever, logging "code: 115, Unknown setting sekure;
// retrying…" each time; a user or password it refuses was logged as
// "ClickHouse … unreachable" and retried the same way. tollgate billing
// now exits with the error; serve logs it once and keeps trying, slowly
// and silently.
func TestBillingLoopOnARefusedDSN(t *testing.T) {
	srv := chtest.Start(t)
	for _, c := range []struct {
		name, dsn, refusal string
	}{
		{"setting", srv.DSN() + "?sekure=true", "Unknown setting sekure"},
		{"password", strings.Replace(srv.DSN(), "clickhouse://", "clickhouse://default:not-its-password@", 1),
			"Wrong password for user default"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := &config.Config{ClickHouse: config.ClickHouse{DSN: c.dsn}}

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := billingLoop(ctx, cfg, nil, nil, t.Logf, exitOnRefusedDSN)
			if !billing.IsDSNRefused(err) || !strings.Contains(fmt.Sprint(err), c.refusal) {
				t.Fatalf("tollgate billing: got %v, want ClickHouse refusing the DSN: %s", err, c.refusal)
			}
			if strings.Contains(err.Error(), "unreachable") || strings.Contains(err.Error(), "not-its-password") {
				t.Errorf("tollgate billing: %v", err)
			}

			defer func(was time.Duration) { refusedDSNRetry = was }(refusedDSNRetry)
			refusedDSNRetry = 20 * time.Millisecond
			var log testutil.Log
			ctx, stop := context.WithTimeout(context.Background(), time.Second)
			defer stop()
			if err := billingLoop(ctx, cfg, nil, nil, log.Logf, waitOnRefusedDSN); err != nil {
				t.Fatalf("serve's loop returned %v", err)
			}
			logged := log.Matching()
			// Once, but again after another error came between (a ping that
			// timed out on a loaded machine says "unreachable", and the refusal
			// after it is news again): a line every 20 ms would fail this.
			refusals := log.Count(c.refusal, "restart serve")
			others := len(logged) - refusals
			if refusals == 0 || refusals > others+1 {
				t.Fatalf("serve logged %q, want the refusal once (and once more after each other error)", logged)
			}
		})
	}
}

// ClickHouse down as billing started was logged ("… unreachable …;
// retrying in 8s"), and its return was not: billing ran, the backlog
// drained, and the last line still said ClickHouse was down. Its return
// is said once, and a first start that connects says nothing of it.
func TestBillingLoopSaysWhenClickHouseAnswersAgain(t *testing.T) {
	srv := chtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	b, err := broker.Start(ctx, config.NATS{EmbeddedListen: "127.0.0.1:0"}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cfg := &config.Config{ClickHouse: config.ClickHouse{DSN: srv.DSN()}}
	svc, err := accounts.Open(ctx, b.JetStream(), 1, "", cfg.Auth)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if err := declareUsageStream(ctx, cfg, b, t.Logf); err != nil {
		t.Fatal(err)
	}

	var log testutil.Log
	// count is how many lines logged so far say want; with until, it
	// first waits (up to 30 s) for one to.
	count := func(want string, until bool) int {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			n := log.Count(want)
			if n > 0 || !until {
				return n
			}
			if time.Now().After(deadline) {
				t.Fatalf("no line says %q in 30s: %q", want, log.Matching())
			}
		}
	}
	start := func() (stop func()) {
		loopCtx, stopLoop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = billingLoop(loopCtx, cfg, b, svc, log.Logf, waitOnRefusedDSN)
		}()
		return func() { stopLoop(); <-done }
	}
	const resumed = "answers again; billing resumed"

	stop := start()
	// The consumer is made after billing connected and said what it had to.
	for {
		if _, err := b.JetStream().Consumer(ctx, meter.UsageStream, billing.ConsumerName); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("billing never made its consumer")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if count(resumed, false) != 0 {
		t.Fatalf("a first start that connected logged %q", log.Matching())
	}

	srv.Stop()
	stop = start()
	defer func() { stop() }()
	count("unreachable", true)
	srv.Restart()
	count(resumed, true)
	if n := count("billing: ClickHouse at "+srv.DSN()+" "+resumed, false); n != 1 {
		t.Errorf("ClickHouse's return logged %d times, want once naming it: %q", n, log.Matching())
	}
}
