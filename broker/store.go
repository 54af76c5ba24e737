package broker

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tollgate/tollgate/internal/loglimit"
)

// How the embedded server's store is watched. Variables, not constants,
// so a test can use a small disk and not wait seconds for a check.
var (
	// storeCheckEvery is how often the embedded server is asked whether
	// a stream of its store refuses writes.
	storeCheckEvery = 5 * time.Second
	// storeRoomToRestart is the free space the store's disk must have
	// again before JetStream is restarted: restarted with a few blocks'
	// worth free, it would fill again at once and refuse writes for
	// another storeRestartEvery.
	storeRoomToRestart int64 = 64 << 20
	// storeRestartEvery spaces restarts: each one makes every client start
	// its watchers and pulls over.
	storeRestartEvery = time.Minute
	// storeWaitLogEvery spaces the lines saying a restart still waits for
	// room: one is logged when the free space changed since the last,
	// so an operator freeing space sees how far it is, and one every
	// storeWaitRemindEvery without a change.
	storeWaitLogEvery    = time.Minute
	storeWaitRemindEvery = 10 * time.Minute
)

// StoreWriteError says that streams of the embedded server's JetStream
// store refuse every write. nats-server keeps a stream's first write
// error (a full disk, a read-only remount) and refuses each later write
// to that stream with it, answering the publisher nothing (it waits out
// its timeout), until the stream's store is opened again. The gateway
// opens it again by restarting JetStream once the disk has room (see
// storeWatch).
type StoreWriteError struct {
	Dir     string   // the store's directory, data_dir/nats
	Streams []string // the streams refusing writes, sorted; none when JetStream is off
	Cause   string   // the first write error, as nats-server words it
}

func (e *StoreWriteError) Error() string {
	if len(e.Streams) == 0 {
		return fmt.Sprintf("the embedded JetStream store under %s is off (%s)", e.Dir, e.Cause)
	}
	return fmt.Sprintf("the embedded JetStream store under %s cannot write (%s): streams %s refuse every write",
		e.Dir, e.Cause, strings.Join(e.Streams, ", "))
}

// StoreError asks the embedded server whether its store refuses writes:
// nil when it writes, and always with an external NATS, whose store is its
// operator's to watch. It reads the store's directory, no NATS request;
// cheap enough for every scrape of /metrics.
func (b *Broker) StoreError() error {
	if b.embedded == nil {
		return nil
	}
	if e := storeWriteError(b.embedded, b.storeDir); e != nil {
		return e
	}
	return nil
}

func storeWriteError(srv *server.Server, dir string) *StoreWriteError {
	if !srv.JetStreamEnabled() {
		return &StoreWriteError{Dir: dir, Cause: "nats-server turned JetStream off, or it did not start again"}
	}
	health := srv.Healthz(&server.HealthzOptions{Details: true})
	var e *StoreWriteError
	for _, he := range health.Errors {
		if he.Type != server.HealthzErrorStream {
			continue
		}
		// "JetStream stream '$G > USAGE' write error: write …/1.blk: no space left on device"
		_, cause, ok := strings.Cut(he.Error, " write error: ")
		if !ok {
			continue // not recovered, which a restart does not mend
		}
		if e == nil {
			e = &StoreWriteError{Dir: dir, Cause: cause}
		}
		e.Streams = append(e.Streams, he.Stream)
	}
	if e != nil {
		slices.Sort(e.Streams)
	}
	return e
}

// storeWatch restarts the embedded server's JetStream when a stream of
// its store refuses writes and the disk has room again. Restarting opens
// every store from disk, as a process restart does: a failed write left
// nothing acknowledged behind (a standalone store writes a message before
// its acknowledgement), and what a stream holds on disk is what it holds
// after. The client connection is then made to reconnect, so the
// watchers and pulls of this process start over at once instead of after
// their missed heartbeats (10 s to 30 s): their consumers went with the
// old JetStream (ordered ones) or lost their waiting pulls (durable ones).
// Other processes' clients (tollgate billing, tollgate worker) start over
// after their heartbeats.
type storeWatch struct {
	srv       *server.Server
	dir       string
	logf      func(string, ...any)
	reconnect func() error

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	// The rest belongs to the run goroutine.
	failing   *StoreWriteError // as last logged; nil while the store writes
	restarted time.Time        // the last restart; zero before one
	// roomLog spaces the lines saying a restart was put off for want of
	// room; their state is the free MiB they say.
	roomLog loglimit.Limiter
}

func startStoreWatch(srv *server.Server, dir string, logf func(string, ...any), reconnect func() error) *storeWatch {
	w := &storeWatch{srv: srv, dir: dir, logf: logf, reconnect: reconnect, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// close stops the watch, waiting for a restart under way to end: the
// server must not be shut down in the middle of one. Broker.Close may be
// called more than once.
func (w *storeWatch) close() {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}

func (w *storeWatch) run() {
	defer close(w.done)
	tick := time.NewTicker(storeCheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
			w.check(time.Now())
		}
	}
}

func (w *storeWatch) check(now time.Time) {
	failing := storeWriteError(w.srv, w.dir)
	if failing == nil {
		w.failing = nil
		return
	}
	if w.failing == nil || !slices.Equal(w.failing.Streams, failing.Streams) {
		w.logf("nats error: %v until JetStream is restarted (usage events wait in the outbox; a KV_ bucket keeps its values "+
			"but cannot change, its writes time out); the gateway restarts JetStream itself once the disk has %d MiB free "+
			"and can be written", failing, storeRoomToRestart>>20)
	}
	w.failing = failing
	if !w.restarted.IsZero() && now.Sub(w.restarted) < storeRestartEvery {
		return
	}
	if err := roomToWrite(w.dir, storeRoomToRestart); err != nil {
		free, _ := freeBytes(w.dir)
		if ok, _ := w.roomLog.AllowChanged(now, storeWaitRemindEvery, storeWaitLogEvery, strconv.FormatInt(free>>20, 10)); ok {
			w.logf("nats: JetStream not restarted yet: %v (on a disk that cannot have %d MiB free, restart the gateway "+
				"once it has some room: see \"JetStream's own disk full\" in README.md)", err, storeRoomToRestart>>20)
		}
		return
	}
	w.restarted = now
	if err := w.restart(); err != nil {
		w.logf("nats error: restarting JetStream after its store's write error: %v; tried again in %s", err, storeRestartEvery)
		return
	}
	if e := storeWriteError(w.srv, w.dir); e != nil {
		w.logf("nats error: restarted JetStream, and still %v", e)
		return
	}
	w.logf("nats: restarted JetStream: its store under %s can be written again; streams %s take writes again",
		w.dir, strings.Join(failing.Streams, ", "))
	w.failing = nil
	if err := w.reconnect(); err != nil {
		w.logf("nats: reconnecting after restarting JetStream: %v", err)
	}
}

// restart stops JetStream (when nats-server has not) and starts it on the
// same store with the same settings: the store directory given here, the
// sync settings and limits as the server's options say, the store limit
// sized again from the free space plus what the store holds.
// nats-server's own config reload restarts JetStream the same way.
func (w *storeWatch) restart() error {
	if w.srv.JetStreamEnabled() {
		if err := w.srv.ShutdownJetStream(); err != nil {
			return fmt.Errorf("stopping it: %w", err)
		}
	}
	if err := w.srv.EnableJetStream(&server.JetStreamConfig{StoreDir: w.dir}); err != nil {
		return fmt.Errorf("starting it: %w", err)
	}
	return nil
}

// roomToWrite says why dir's disk cannot take a restarted store yet: less
// than room free, or a file cannot be written and synced there (a
// read-only remount, a failing disk). nil when it can.
func roomToWrite(dir string, room int64) error {
	if free, err := freeBytes(dir); err == nil && free < room {
		return fmt.Errorf("the disk of %s has %d MiB free, less than %d MiB", dir, free>>20, room>>20)
	}
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return fmt.Errorf("%s cannot be written: %w", dir, err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(make([]byte, 64<<10))
	err = errors.Join(err, f.Sync(), f.Close())
	if err != nil {
		return fmt.Errorf("%s cannot be written: %w", f.Name(), err)
	}
	return nil
}
