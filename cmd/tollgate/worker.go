package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/plugins"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/storage"
	"github.com/tollgate/tollgate/tokens"
)

// runWorker is `tollgate worker`: the batch worker of serve without the
// API, for more batch capacity beside the gateways. It needs the NATS and
// the object storage the gateways use, so storage.backend must be s3: the
// local backend's files live on the gateway's machine.
func runWorker(args []string) error {
	path, err := commandConfigArg(workerUsage, args)
	if err != nil {
		return err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return fmt.Errorf("loading %s:\n%w", path, err)
	}
	if cfg.Storage.Backend != "s3" {
		return errors.New("tollgate worker needs storage.backend s3 (shared by every gateway); with the local backend, tollgate serve runs the batch jobs itself")
	}
	ignoreBrokenPipe()
	logf := log.New(os.Stderr, "", log.LstdFlags).Printf
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := config.CatchSIGHUP() // a reload sent while starting waits for the watcher
	if err := os.MkdirAll(cfg.Server.DataDir, 0o700); err != nil {
		return fmt.Errorf("creating data_dir: %w", err)
	}
	go func() { _ = tokens.Preload() }()
	b, err := connectNATS(ctx, cfg, logf)
	if err != nil {
		return err
	}
	defer b.Close()
	// Its own outbox: a worker beside serve on one machine shares data_dir.
	if err := declareUsageStream(ctx, cfg, b, logf); err != nil {
		return err
	}
	ob, err := meter.OpenOutboxWith(filepath.Join(cfg.Server.DataDir, "outbox-worker"), outboxOptions(cfg))
	if err != nil {
		return fmt.Errorf("opening the usage outbox: %w", err)
	}
	rec := meter.NewPublisherWith(b.JetStream(), ob, cfg.Billing.PublishBatch.MaxDelay, logf)
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), publisherCloseWait(b.Conn(), b.StoreError()))
		defer cancel()
		if err := rec.Close(c); err != nil {
			logf("meter: closing the publisher: %v", err) // it says which events stay in the outbox, and which could not be written
		}
	}()
	store, err := storage.FromConfig(ctx, cfg, logf)
	if err != nil {
		return fmt.Errorf("opening object storage: %w", err)
	}
	// Balances, so that a job the account cannot pay for fails before it
	// runs (batch.Runtime.CanPay) on a worker as on a gateway.
	svc, err := openAccountStore(ctx, cfg, b, "")
	if err != nil {
		return err
	}
	defer svc.Close()
	// The engines prompt models through a gateway's upstream client and
	// choose them as its plugins module does; this gateway never listens.
	jobs := &batchJobs{b: b, store: store, rec: rec, logf: logf}
	srv, err := proxy.New(cfg, proxy.Options{Accounts: svc, Recorder: rec, Logf: logf,
		Modules: []proxy.Module{plugins.Module(plugins.Options{Batch: &plugins.Batch{Open: jobs.open}})}})
	if err != nil {
		return err
	}
	defer srv.Close()
	go config.NewWatcher(path, cfg, srv.Apply, logf).RunOn(ctx, hup)
	logf("tollgate %s batch worker (config %s, NATS %s, %d jobs at a time)", version(), path, b.ClientURL(), cfg.Batch.MaxJobs)
	return jobs.svc.RunWorker(ctx)
}

// runBatch is `tollgate batch reindex [FILE]`: it deletes every account's
// index of its newest jobs (batch.ForgetNewest), which the next listing
// of each account builds again from its job records. A gateway of the
// release before this one creates jobs without indexing them, and a
// listing cannot tell cheaply that an account has such jobs.
func runBatch(args []string) error {
	switch {
	case len(args) == 0:
		return usageErrorf("batch needs a subcommand\n\n%s", batchUsage)
	case args[0] == "help" || isHelp(args[0]):
		fmt.Print(batchUsage)
		return nil
	case args[0] != "reindex":
		return usageErrorf("unknown batch subcommand %q\n\n%s", args[0], batchUsage)
	}
	path, err := commandConfigArg(batchUsage, args[1:])
	if err != nil {
		return err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return fmt.Errorf("loading %s:\n%w", path, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, err := connectNATS(ctx, cfg, nil)
	if err != nil {
		return err
	}
	defer b.Close()
	forgotten, err := batch.ForgetNewest(ctx, b.JetStream())
	if err != nil {
		return err
	}
	if forgotten == 1 {
		fmt.Println("deleted the index of newest batch jobs of 1 account: its next GET /v1/batch rebuilds it")
		return nil
	}
	fmt.Printf("deleted the index of newest batch jobs of %d accounts: the next GET /v1/batch of each rebuilds it\n", forgotten)
	return nil
}
