package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
)

// startOnSmallDisk starts an embedded broker on a 24 MiB disk of its own,
// logging to log, and declares the file-stored bucket FULL on it.
func startOnSmallDisk(t *testing.T, log *testutil.Log) (*Broker, jetstream.KeyValue, string) {
	t.Helper()
	dataDir := testutil.SmallDisk(t, 24<<20)
	b, err := Start(testContext(t), config.NATS{EmbeddedListen: "127.0.0.1:0"}, dataDir, log.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	kv, err := EnsureKV(testContext(t), b.JetStream(), jetstream.KeyValueConfig{Bucket: "FULL", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	return b, kv, dataDir
}

func storeWatchedEvery(t *testing.T, every time.Duration, room int64) {
	oldEvery, oldRoom := storeCheckEvery, storeRoomToRestart
	storeCheckEvery, storeRoomToRestart = every, room
	t.Cleanup(func() { storeCheckEvery, storeRoomToRestart = oldEvery, oldRoom })
}

// After the embedded JetStream's disk had been full once, nats-server kept
// each failed stream's write error: the KV buckets (accounts, batch jobs,
// responses state) refused every write, answering nothing, after the disk
// had room again too, until the gateway was restarted, and nothing but
// nats-server's own lines said so. Now the gateway says which streams
// refuse writes and restarts JetStream itself once the disk has room.
func TestStoreThatWasFullTakesWritesAgainOnceTheDiskHasRoom(t *testing.T) {
	storeWatchedEvery(t, 50*time.Millisecond, 1<<20)
	log := &testutil.Log{T: t}
	b, kv, dataDir := startOnSmallDisk(t, log)
	ctx := testContext(t)
	if _, err := kv.Put(ctx, "k", []byte("before")); err != nil {
		t.Fatal(err)
	}
	if err := b.StoreError(); err != nil {
		t.Fatalf("StoreError before the disk filled: %v", err)
	}

	filler := testutil.FillDisk(t, dataDir)
	put := func(value []byte) error {
		c, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := kv.Put(c, "k", value)
		return err
	}
	// A page the block file holds already may take a small value: write
	// until one is refused.
	testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if put(make([]byte, 64<<10)) == nil {
			return errors.New("every write taken on the full disk")
		}
		return nil
	})
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		var swe *StoreWriteError
		err := b.StoreError()
		if !errors.As(err, &swe) || len(swe.Streams) != 1 || swe.Streams[0] != "KV_FULL" ||
			!strings.Contains(err.Error(), "no space left on device") || !strings.Contains(err.Error(), filepath.Join(dataDir, "nats")) {
			return fmt.Errorf("StoreError = %v, want stream KV_FULL, the store's directory and no space left on device", err)
		}
		return nil
	})
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if log.Count("cannot write", "KV_FULL", "restarts JetStream itself") == 0 {
			return errors.New("no log line says the store cannot write")
		}
		return nil
	})

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// Before the fix every write was refused from here on.
	testutil.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error { return put([]byte("after")) })
	if err := b.StoreError(); err != nil {
		t.Errorf("StoreError after the restart: %v", err)
	}
	if log.Count("restarted JetStream", "KV_FULL") == 0 {
		t.Error("no log line says JetStream was restarted")
	}
	got, err := kv.Get(ctx, "k")
	if err != nil || string(got.Value()) != "after" {
		t.Fatalf("Get after the restart = %v, %v; want after", got, err)
	}
	// The client was made to reconnect: the watchers that start over
	// on a reconnect (the accounts snapshot's) do so at once, not after
	// the missed heartbeats of the consumers the restart removed (about
	// 20 s for a KV watcher's).
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := b.Conn().Stats().Reconnects; n != 1 || !b.Conn().IsConnected() {
			return fmt.Errorf("%d reconnections, connected %v; want 1, true", n, b.Conn().IsConnected())
		}
		return nil
	})
}

// A disk that is still full is not restarted on: the stores would fail
// again at once, and a restart makes every client start over.
func TestStoreNotRestartedWhileTheDiskIsFull(t *testing.T) {
	dir := testutil.SmallDisk(t, 4<<20)
	testutil.FillDisk(t, dir)
	if err := roomToWrite(dir, 1<<20); err == nil || !strings.Contains(err.Error(), "less than 1 MiB") {
		t.Errorf("roomToWrite on a full disk = %v, want less than 1 MiB free", err)
	}
	if err := roomToWrite(dir, 0); err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Errorf("roomToWrite on a full disk asked for no room = %v, want the write refused", err)
	}
	if err := roomToWrite(t.TempDir(), 1); err != nil {
		t.Errorf("roomToWrite with room: %v", err)
	}
}

// While JetStream waits for room to be restarted, the line saying so
// came once, then not for 10 minutes: an operator who freed 56 MiB of
// the 64 needed saw nothing saying it still waited, or how much was
// free. It is said again, at most once a minute, when the free space
// changed. A disk that cannot have that much free needs the gateway
// restarted once it has some room, which opens the stores anew.
func TestStoreWaitingForRoomSaysHowMuchIsFree(t *testing.T) {
	storeWatchedEvery(t, 50*time.Millisecond, 8<<20)
	oldLogEvery := storeWaitLogEvery
	storeWaitLogEvery = 200 * time.Millisecond
	t.Cleanup(func() { storeWaitLogEvery = oldLogEvery })
	log := &testutil.Log{T: t}
	b, kv, dataDir := startOnSmallDisk(t, log)
	ctx := testContext(t)
	filler := testutil.FillDisk(t, dataDir)
	put := func(kv jetstream.KeyValue, value []byte) error {
		c, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := kv.Put(c, "k", value)
		return err
	}
	testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if put(kv, make([]byte, 64<<10)) == nil {
			return errors.New("every write taken on the full disk")
		}
		return nil
	})
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if log.Count("JetStream not restarted yet", "has 0 MiB free, less than 8 MiB") == 0 {
			return errors.New("no line says JetStream waits for room")
		}
		return nil
	})

	// Some room, not enough: the filler cut by 4.5 MiB at once. Not by
	// 4 MiB: the full disk's few KiB on top of that are all that kept
	// the free space from reading 3 MiB, and any write of the server's
	// took them, another change of the free space to log.
	st, err := os.Stat(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filler, st.Size()-(4<<20+512<<10)); err != nil {
		t.Fatal(err)
	}
	free, err := freeBytes(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("has %d MiB free, less than 8 MiB", free>>20)
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if log.Count("JetStream not restarted yet", want, "restart the gateway once it has some room") == 0 {
			return fmt.Errorf("no line says JetStream still waits, with %q; logged:\n%s", want, log.String())
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // more than storeWaitLogEvery, with the free space the same
	if n := log.Count("JetStream not restarted yet"); n != 2 {
		t.Errorf("%d lines say JetStream waits for room, want 2 (the free space changed once)", n)
	}

	// What the line advises: a restart of the gateway on that room.
	b.Close()
	b, err = Start(testContext(t), config.NATS{EmbeddedListen: "127.0.0.1:0"}, dataDir, log.Logf)
	if err != nil {
		t.Fatalf("starting again with %d MiB free: %v", free>>20, err)
	}
	t.Cleanup(b.Close)
	kv, err = b.JetStream().KeyValue(ctx, "FULL")
	if err != nil {
		t.Fatal(err)
	}
	if err := put(kv, []byte("after")); err != nil {
		t.Fatalf("a write after the restart with %d MiB free: %v", free>>20, err)
	}
}
