package batch_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/plugins"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/storage"
)

// The test binary is also the worker process TestWorkerProcessKilled
// kills: run with BATCH_TEST_WORKER set, it runs a batch worker only.
func TestMain(m *testing.M) {
	if os.Getenv("BATCH_TEST_WORKER") != "" {
		if err := workerProcess(); err != nil {
			fmt.Fprintln(os.Stderr, "worker process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// workerProcess is `tollgate worker` as the test needs it: config, NATS
// and the data directory of the test's gateway, slowed down by a
// millisecond per chunk so the test can kill it mid-job.
func workerProcess() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg, err := config.Load(os.Getenv("BATCH_TEST_CONFIG"))
	if err != nil {
		return err
	}
	b, err := broker.Start(ctx, config.NATS{URL: os.Getenv("BATCH_TEST_NATS")}, cfg.Server.DataDir, nil)
	if err != nil {
		return err
	}
	defer b.Close()
	store, err := storage.NewLocal(storage.LocalOptions{DataDir: cfg.Server.DataDir, PublicBaseURL: "http://127.0.0.1:1", SecretKey: os.Getenv("BATCH_TEST_SECRET")})
	if err != nil {
		return err
	}
	var svc *batch.Service
	open := func(ctx context.Context, rt batch.Runtime) (*batch.Service, error) {
		var err error
		svc, err = batch.Open(ctx, b.JetStream(), store, batch.WithTuning(batch.Options{
			Runtime: rt, Recorder: meter.NewMemory(nil), AckWait: 2 * time.Second, Name: "doomed",
		}, batch.Tuning{Hook: func(p string) bool {
			if p == "chunk" {
				time.Sleep(time.Millisecond)
			}
			return false
		}}))
		return svc, err
	}
	gw, err := proxy.New(cfg, proxy.Options{Recorder: meter.NewMemory(nil),
		Modules: []proxy.Module{plugins.Module(plugins.Options{Batch: &plugins.Batch{Open: open}})}})
	if err != nil {
		return err
	}
	defer gw.Close()
	return svc.RunWorker(ctx)
}

// TestWorkerProcessKilled SIGKILLs a worker process in the middle of a
// job. The gateway's own worker takes the job over once AckWait has
// passed and finishes it: every line once, in order, the same results as
// an undisturbed run, counters exact, billed once.
func TestWorkerProcessKilled(t *testing.T) {
	e := newEnv(t, envOptions{batch: "  checkpoint_lines: 500\n  concurrency: 4"})
	svc := e.service(2*time.Second, batch.Tuning{})
	const n = 10_000
	input := inputLines(n, 333)
	ref := e.create(svc, "reference", input, "")
	id := e.create(svc, "acme", input, "")

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BATCH_TEST_WORKER=1", "BATCH_TEST_CONFIG="+e.cfgPath,
		"BATCH_TEST_NATS="+e.broker.ClientURL(), "BATCH_TEST_SECRET="+e.secret)
	var stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	if _, err := svc.Start(e.ctx, "acme", id); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 60*time.Second, 5*time.Millisecond, func() error {
		j, err := svc.Get(e.ctx, "acme", id)
		if err != nil {
			return err
		}
		if j.Worker != "doomed" || j.Progress.Lines < 1000 {
			return fmt.Errorf("the worker process is at line %d (%s); output:\n%s", j.Progress.Lines, j.Worker, stderr.String())
		}
		return nil
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	j, err := svc.Get(e.ctx, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != batch.StatusProcessing || j.Progress.Lines >= n {
		t.Fatalf("killed at line %d of %d, job %s: the kill came too late to test anything", j.Progress.Lines, n, j.Status)
	}
	killedAt := j.Progress.Lines
	e.work(svc)
	j = e.waitEnd(svc, "acme", id, 60*time.Second)
	if j.Attempt != 2 || j.Worker == "doomed" {
		t.Fatalf("attempt %d by %s, want the second attempt, by the gateway", j.Attempt, j.Worker)
	}
	got := e.results(j)
	_, tokens := checkResults(t, got, n)
	if j.RequestsTotal != n || j.RequestsCompleted != n-n/333 || j.RequestsFailed != n/333 {
		t.Fatalf("total %d completed %d failed %d; want %d, %d, %d", j.RequestsTotal, j.RequestsCompleted, j.RequestsFailed, n, n-n/333, n/333)
	}
	wantBilled(t, e, j, tokens)
	if len(e.jobEvents(id)) != 1 {
		t.Fatalf("%d usage events, want 1", len(e.jobEvents(id)))
	}
	e.wantOnlyInputAndResults("acme", id)

	if _, err := svc.Start(e.ctx, "reference", ref); err != nil {
		t.Fatal(err)
	}
	if want := e.results(e.waitEnd(svc, "reference", ref, 60*time.Second)); !bytes.Equal(got, want) {
		t.Fatal("results differ from an undisturbed run of the same input")
	}
	t.Logf("killed at line %d of %d; the replacement finished the job", killedAt, n)
}

// lockedBuffer collects a child's output, written by exec's goroutine
// while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
