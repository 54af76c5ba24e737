package meter_test

import (
	"testing"
	"time"

	"github.com/tollgate/tollgate/meter"
)

// gatedDisk is a DurableRecorder whose events are safe once the test
// closes safe.
type gatedDisk struct {
	*meter.Memory
	durable int
	safe    chan struct{}
}

func (d *gatedDisk) RecordDurable(ev *meter.Event) <-chan struct{} {
	d.Record(ev)
	d.durable++
	return d.safe
}

// TestRecordAndWaitWaitsForTheDiskWithinItsBound: a plugin's answer and
// a batch job's completion wait for their event to be safe, and no
// longer than the bound when the disk is stuck.
func TestRecordAndWaitWaitsForTheDiskWithinItsBound(t *testing.T) {
	plain := meter.NewMemory(nil)
	if !meter.RecordAndWait(plain, &meter.Event{ID: "a"}) || len(plain.Events()) != 1 {
		t.Fatalf("a plain recorder: want the event recorded and no wait")
	}

	stuck := &gatedDisk{Memory: meter.NewMemory(nil), safe: make(chan struct{})}
	start := time.Now()
	if meter.RecordAndWait(stuck, &meter.Event{ID: "b"}) {
		t.Fatal("a disk that never syncs: want false after the bound")
	}
	if waited := time.Since(start); waited < meter.DurableWait || waited > meter.DurableWait+5*time.Second {
		t.Errorf("waited %s for a stuck disk, want the bound, %s", waited, meter.DurableWait)
	}
	if stuck.durable != 1 || len(stuck.Events()) != 1 {
		t.Errorf("RecordDurable called %d times, %d events: want the event recorded durably once", stuck.durable, len(stuck.Events()))
	}

	syncs := &gatedDisk{Memory: meter.NewMemory(nil), safe: make(chan struct{})}
	time.AfterFunc(20*time.Millisecond, func() { close(syncs.safe) })
	if !meter.RecordAndWait(syncs, &meter.Event{ID: "c"}) {
		t.Fatal("a disk that syncs within the bound: want true")
	}
	select {
	case <-syncs.safe:
	default:
		t.Fatal("returned before the event was safe")
	}
}
