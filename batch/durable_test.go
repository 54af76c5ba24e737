package batch_test

import (
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/meter"
)

// slowDisk is a meter.DurableRecorder whose events are safe from a crash
// delay after they are recorded, as under billing.durability fsync;
// before each is, it calls beforeSafe.
type slowDisk struct {
	*meter.Memory
	delay      time.Duration
	beforeSafe func(ev *meter.Event)
}

func (d *slowDisk) RecordDurable(ev *meter.Event) <-chan struct{} {
	d.Record(ev)
	safe := make(chan struct{})
	time.AfterFunc(d.delay, func() {
		d.beforeSafe(ev)
		close(safe)
	})
	return safe
}

// TestJobIsCompletedOnlyOnceItsBillIsOnDisk: a job was recorded completed
// (in JetStream, which under billing.durability fsync syncs every
// message) as soon as its bill was handed to the outbox, before the
// outbox's fsync: a power loss in between kept the completed job and lost
// its bill. The completion now waits, as a chat answer does.
func TestJobIsCompletedOnlyOnceItsBillIsOnDisk(t *testing.T) {
	e := newEnv(t, envOptions{})
	var (
		mu           sync.Mutex
		statusOnDisk []batch.Status // the job's status when its bill reached the disk
		svc          *batch.Service
	)
	disk := &slowDisk{Memory: meter.NewMemory(nil), delay: 300 * time.Millisecond}
	disk.beforeSafe = func(ev *meter.Event) {
		j, err := svc.Get(e.ctx, "acme", ev.JobID)
		if err != nil {
			t.Errorf("reading job %s: %v", ev.JobID, err)
			return
		}
		mu.Lock()
		statusOnDisk = append(statusOnDisk, j.Status)
		mu.Unlock()
	}
	var err error
	svc, err = batch.Open(e.ctx, e.broker.JetStream(), e.store, batch.Options{Runtime: e.rt, Recorder: disk, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	e.work(svc)
	id := e.create(svc, "acme", inputLines(20, 0), "")
	if j := e.startAndWait(svc, "acme", id); j.Status != batch.StatusCompleted {
		t.Fatalf("job %s: %q", j.Status, j.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(disk.Events()) != 1 || len(statusOnDisk) != 1 || statusOnDisk[0] != batch.StatusProcessing {
		t.Fatalf("%d bills; the job was %v when its bill reached the disk: want one bill, on disk while the job was processing",
			len(disk.Events()), statusOnDisk)
	}
}
