package meter

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// smallDisk mounts a tmpfs of size bytes for the test: a disk the outbox
// can fill. Where mounting is not allowed (not root) the test fails: make
// test runs as root (it installs its servers), and a skip there would let
// the full-disk start go untested in CI without a word.
func smallDisk(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Fatalf("mounting a %d-byte tmpfs: %v (needs root, as make test has)", size, err)
	}
	// Registered after TempDir's removal, so it runs before it; and
	// after the outbox's Close, which the test registers later.
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting the test's tmpfs: %v", err)
			_ = unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	return dir
}

// fillDisk writes a file in dir until the disk it is on is full.
func fillDisk(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, chunk := range []int{64 << 10, 4 << 10} {
		buf := make([]byte, chunk)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, unix.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
}

// A gateway stopped after its outbox had filled the disk (NATS down under
// load) could not start again: the open failed making its first segment
// ("reserving 4194304 bytes for an outbox segment: no space left on
// device"), so the events the outbox held were never published, and the
// disk was freed only by deleting something, maybe them. It opens, refuses
// new events as it does when the disk fills while running, publishes what
// it holds, and takes events again once that freed the disk.
func TestOutboxOpensOnAFullDiskAndPublishesWhatItHolds(t *testing.T) {
	disk := smallDisk(t, 2<<20)
	dir := filepath.Join(disk, "outbox")
	// 512 KiB segments: the bound is not what fills up.
	opts := OutboxOptions{MaxBytes: 4 << 20, FsyncInterval: 10 * time.Millisecond}
	ob, err := OpenOutboxWith(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	n := fillOutbox(t, ob)
	if st := ob.Stats(); st.Bytes >= 4<<20 || !errors.Is(st.LastWriteErr, unix.ENOSPC) {
		t.Fatalf("after %d events, stats %+v: want the disk full, not the byte bound", n, st)
	}
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	fillDisk(t, disk) // what closing freed (the spare, the preallocated end)

	ob, err = OpenOutboxWith(dir, opts)
	if err != nil {
		t.Fatalf("opening on a full disk: %v", err)
	}
	t.Cleanup(func() { ob.Close() })
	rec := ob.Recovery()
	if rec.Unacked != uint64(n) || !strings.Contains(strings.Join(rec.Notes, "\n"), "no new segment could be made") {
		t.Fatalf("recovery %+v: want %d events to publish, and a note that new ones are refused", rec, n)
	}
	if err := ob.Append(outboxTestEvent(n)); !errors.Is(err, ErrOutboxFull) {
		t.Fatalf("append on a full disk: %v, want ErrOutboxFull", err)
	}
	publishAll(t, ob, n)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		return ob.Append(outboxTestEvent(n))
	})
	waitDurable(t, ob, uint64(n+1))
	readAll(t, ob, uint64(n), n)
}

// On a full disk every refused event tried to make a segment again (a
// file created, preallocated and deleted, with the outbox's lock held):
// "the outbox failed to write to disk 1263 times in the last 10s" for
// about 1,160 refused events. Refusals are now at once, a segment is
// tried again every outboxSpareRetry, and events are taken again soon
// after the disk has room.
func TestOutboxOnAFullDiskRefusesWithoutRetryingForEachEvent(t *testing.T) {
	disk := smallDisk(t, 2<<20)
	ob, err := OpenOutbox(filepath.Join(disk, "outbox"), 4<<20) // 512 KiB segments
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	fillDisk(t, disk)
	n := fillOutbox(t, ob)
	before := ob.Stats().WriteFailures
	start := time.Now()
	for i := range 2000 {
		if err := ob.Append(outboxTestEvent(n + i)); !errors.Is(err, ErrOutboxFull) {
			t.Fatalf("append on a full disk: %v, want ErrOutboxFull", err)
		}
	}
	tries := ob.Stats().WriteFailures - before
	if most := uint64(time.Since(start)/outboxSpareRetry) + 2; tries > most {
		t.Fatalf("2000 refused events tried to make a segment %d times in %s, want at most %d", tries, time.Since(start), most)
	}

	if err := os.Remove(filepath.Join(disk, "filler")); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 2*time.Second, time.Millisecond, func() error {
		return ob.Append(outboxTestEvent(n))
	})
	waitDurable(t, ob, uint64(n+1))
	readAll(t, ob, 0, 0)
}
