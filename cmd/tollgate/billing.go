package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
)

// runBilling is `tollgate billing`: the billing consumer on its own, for
// deployments where gateways only publish (clickhouse.consume_in_serve:
// false). Several may run; they share one durable consumer.
func runBilling(args []string) error {
	path, err := commandConfigArg(billingUsage, args)
	if err != nil {
		return err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	ignoreBrokenPipe()
	logf := log.New(os.Stderr, "", log.LstdFlags).Printf
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGHUP's default ends the process, and an exit by SIGHUP is clean to
	// systemd: a reload sent to every tollgate unit stopped billing.
	hup := config.CatchSIGHUP()
	defer signal.Stop(hup)
	go func() {
		for range hup {
			logf("SIGHUP: tollgate billing reads %s only when it starts; restart it to apply a change", path)
		}
	}()
	b, err := connectNATS(ctx, cfg, logf)
	if err != nil {
		return err
	}
	defer b.Close()
	// No data dir: the consumer debits balances and holds no signing key.
	svc, err := accounts.Open(ctx, b.JetStream(), b.Replicas(), "", cfg.Auth)
	if err != nil {
		return fmt.Errorf("opening accounts: %w", err)
	}
	defer svc.Close()
	if err := declareUsageStream(ctx, cfg, b, logf); err != nil {
		return err
	}
	logf("billing: consuming USAGE from %s into %s", b.ClientURL(), config.RedactURL(cfg.ClickHouse.DSN))
	if err := billingLoop(ctx, cfg, b, svc, logf, exitOnRefusedDSN); err != nil {
		// The process exists to bill: a DSN it can never bill with is a
		// configuration error, for the supervisor to show, like a file
		// that does not load.
		return fmt.Errorf("billing: %w", err)
	}
	// A batch not acknowledged yet is delivered again to the next
	// consumer, and neither stored nor debited twice.
	logf("billing: stopped; a batch in hand, if any, is redelivered to the next consumer")
	return nil
}

// connectNATS connects to nats.url or, when it is empty, to the embedded
// server of a `tollgate serve` on this machine (nats.embedded_listen).
func connectNATS(ctx context.Context, cfg *config.Config, logf func(string, ...any)) (*broker.Broker, error) {
	nc := cfg.NATS
	if nc.URL == "" {
		nc.URL = "nats://" + nc.EmbeddedListen
	}
	b, err := broker.Start(ctx, nc, cfg.Server.DataDir, logf)
	if err != nil && cfg.NATS.URL == "" {
		return nil, fmt.Errorf("connecting to the embedded NATS of `tollgate serve` at %s (is it running?): %w", nc.URL, err)
	}
	if err != nil {
		return nil, err // it names the servers, without their credentials
	}
	return b, nil
}

// onRefusedDSN is what billingLoop does when ClickHouse refuses
// clickhouse.dsn: its settings (billing.DSNSettingsError) or its user and
// password (billing.DSNCredentialsError).
type onRefusedDSN int

const (
	// exitOnRefusedDSN returns the error: tollgate billing exits.
	exitOnRefusedDSN onRefusedDSN = iota
	// waitOnRefusedDSN logs the error once and tries again every
	// refusedDSNRetry without a word: serve keeps serving, its events
	// wait in JetStream, and a ClickHouse that comes to accept the DSN
	// (a profile or user changed) is billed into.
	waitOnRefusedDSN
)

// refusedDSNRetry is how often a DSN ClickHouse refused is tried again;
// a variable for tests.
var refusedDSNRetry = 5 * time.Minute

// billingLoop opens ClickHouse (waiting while it is down), applies the
// migrations and runs the consumer until ctx ends. Nothing is acknowledged
// while ClickHouse is unreachable, so events wait in JetStream. A DSN
// ClickHouse refuses (its settings, its user and password) is no outage,
// and retrying it each 30 s logged the same error forever: what happens
// is onRefused's choice, and the error is returned only with
// exitOnRefusedDSN. Connecting after a failed attempt is logged: the last
// line said ClickHouse was down or refusing while billing ran.
func billingLoop(ctx context.Context, cfg *config.Config, b *broker.Broker, svc *accounts.Service, logf func(string, ...any), onRefused onRefusedDSN) error {
	backoff := time.Second
	refused := ""
	// resumed is what to say when an attempt connects, "" at the first
	// and after one that connected.
	resumed := ""
	for ctx.Err() == nil {
		connected := false
		err := runBillingOnce(ctx, cfg, b, svc, logf, func() {
			connected = true
			if resumed != "" {
				logf("billing: ClickHouse at %s %s; billing resumed", config.RedactURL(cfg.ClickHouse.DSN), resumed)
			}
		})
		if ctx.Err() != nil {
			return nil
		}
		wait := backoff
		refusedDSN := billing.IsDSNRefused(err)
		switch {
		case connected:
			resumed = ""
		case refusedDSN:
			resumed = "accepts clickhouse.dsn now"
		default:
			resumed = "answers again"
		}
		switch {
		case refusedDSN && onRefused == exitOnRefusedDSN:
			return err
		case refusedDSN:
			wait = refusedDSNRetry
			if err.Error() != refused {
				refused = err.Error()
				logf("billing: %v; billing waits for a corrected clickhouse.dsn (restart serve to apply it; trying again every %s meanwhile)", err, wait)
			}
		default:
			refused = ""
			logf("billing: %v; retrying in %s", err, backoff)
			backoff = min(2*backoff, 30*time.Second)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	return nil
}

// runBillingOnce bills until ctx ends or something fails, calling
// connected once ClickHouse is open and migrated.
func runBillingOnce(ctx context.Context, cfg *config.Config, b *broker.Broker, svc *accounts.Service, logf func(string, ...any), connected func()) error {
	sink, err := billing.OpenClickHouse(ctx, cfg.ClickHouse.DSN)
	if billing.IsDSNRefused(err) {
		return err // reachable, and it says what it refuses
	}
	if err != nil {
		return fmt.Errorf("ClickHouse at %s unreachable: %w", config.RedactURL(cfg.ClickHouse.DSN), err)
	}
	defer sink.Close()
	if applied, err := sink.Migrate(ctx); err != nil {
		return fmt.Errorf("migrating ClickHouse: %w", err)
	} else if len(applied) > 0 {
		logf("billing: applied ClickHouse migrations %v", applied)
	}
	connected()
	purgeCtx, stopPurge := context.WithCancel(ctx)
	defer stopPurge()
	go purgeExpiredLogs(purgeCtx, sink, logf)
	return billing.Run(ctx, b.JetStream(), sink, svc.ApplyUsage, billing.Options{Logf: logf})
}

// purgeExpiredLogs enforces request-log retention windows: hourly, it drops
// the request_logs partitions whose expiry day has passed.
func purgeExpiredLogs(ctx context.Context, sink *billing.ClickHouseSink, logf func(string, ...any)) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if n, err := sink.PurgeExpiredLogs(ctx, time.Now()); err != nil {
			logf("billing: %v", err)
		} else if n > 0 {
			logf("billing: removed %d expired days of request logs", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// runMigrate is `tollgate migrate`: apply pending ClickHouse migrations.
func runMigrate(args []string) error {
	path, err := commandConfigArg(migrateUsage, args)
	if err != nil {
		return err
	}
	cfg, err := config.LoadNotConnecting(path)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sink, err := billing.OpenClickHouse(ctx, cfg.ClickHouse.DSN)
	var credentialsErr *billing.DSNCredentialsError
	if errors.As(err, &credentialsErr) {
		return err // it names the DSN
	}
	if err != nil {
		return fmt.Errorf("ClickHouse at %s: %w", config.RedactURL(cfg.ClickHouse.DSN), err)
	}
	defer sink.Close()
	applied, err := sink.Migrate(ctx)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		fmt.Println("ClickHouse schema is up to date")
	}
	for _, m := range applied {
		fmt.Println("applied", m)
	}
	return nil
}
