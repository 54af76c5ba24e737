package batch_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/meter"
)

// TestDeletedJobStaysDeletedAfterACrash: a job deleted, then the
// embedded NATS killed before it wrote its stream state (every 2-2.5
// min), came back whole after the restart, marked as being deleted: its
// earlier writes were removed by the bucket's history limit, which
// nats-server keeps only in that state, and the delete's own marker was
// purged. What the killed server leaves is its files as they are: the
// test copies them while it runs, and starts a server on the copy.
func TestDeletedJobStaysDeletedAfterACrash(t *testing.T) {
	e := newEnv(t, envOptions{})
	svc := e.service(0, batch.Tuning{})
	e.work(svc)
	kept := e.create(svc, "acme", inputLines(3, 0), "")
	e.startAndWait(svc, "acme", kept)
	deleted := e.create(svc, "acme", inputLines(3, 0), "")
	e.startAndWait(svc, "acme", deleted)
	if err := svc.Delete(e.ctx, "acme", deleted); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // for the server's writes to reach its files

	crashed := t.TempDir()
	copyTree(t, filepath.Join(e.dir, "nats"), filepath.Join(crashed, "nats"))
	b, err := broker.Start(e.ctx, config.NATS{EmbeddedListen: "127.0.0.1:0"}, crashed, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	after, err := batch.Open(e.ctx, b.JetStream(), e.store, batch.Options{Runtime: e.rt, Recorder: meter.NewMemory(nil), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if j, err := after.Get(e.ctx, "acme", kept); err != nil || j.Status != batch.StatusCompleted {
		t.Fatalf("the job kept, after the crash: %v, %v", j, err)
	}
	if j, err := after.Get(e.ctx, "acme", deleted); !errors.Is(err, batch.ErrNotFound) {
		t.Fatalf("the job deleted before the crash: %+v, %v; want it not found", j, err)
	}
	if jobs, err := after.List(e.ctx, "acme"); err != nil || len(jobs) != 1 || jobs[0].ID != kept {
		t.Fatalf("list after the crash: %d jobs, %v; want the kept job alone", len(jobs), err)
	}
}

// copyTree copies the files under from to to, as they are now.
func copyTree(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o700)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), data, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}
