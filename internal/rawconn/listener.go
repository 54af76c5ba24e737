package rawconn

import (
	"errors"
	"net"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/internal/loglimit"
)

// Listener wraps what a TCP listener accepts.
//
// It also waits out a full file table. fasthttp's server gives up on
// every accept error but a timeout, so a process out of file descriptors
// (EMFILE, ENFILE: a few hundred idle connections against a low ulimit,
// which anyone who can connect can open) returned from Serve, and the
// gateway exited with its streams unbilled. Such an error is retried
// after a pause that doubles from 5 ms to 1 s, as net/http does, while
// the connections already open go on; once descriptors are freed, the
// waiting connections are taken from the kernel's backlog.
type Listener struct {
	net.Listener
	// Logf, if set, is told when accepting waits for descriptors, at most
	// once every logEvery.
	Logf func(format string, args ...any)

	waits *loglimit.Limiter // the lines saying so
}

const logEvery = 10 * time.Second

// NewListener wraps ln; logf may be nil.
func NewListener(ln net.Listener, logf func(format string, args ...any)) Listener {
	return Listener{Listener: ln, Logf: logf, waits: new(loglimit.Limiter)}
}

func (l Listener) Accept() (net.Conn, error) {
	var pause time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			limitUnsent(c)
			return Wrap(c), nil
		}
		if !outOfDescriptors(err) {
			return nil, err
		}
		if pause == 0 {
			pause = 5 * time.Millisecond
		} else {
			pause = min(2*pause, time.Second)
		}
		l.logWait(err, pause)
		time.Sleep(pause)
	}
}

func (l Listener) logWait(err error, pause time.Duration) {
	if l.Logf == nil || l.waits == nil {
		return
	}
	if ok, _ := l.waits.Allow(time.Now(), logEvery); !ok {
		return
	}
	l.Logf("accepting connections on %s: %v; new connections wait in the kernel's backlog (retrying in %s) until descriptors are freed: raise the process's file limit (LimitNOFILE, ulimit -n)", l.Addr(), err, pause)
}

// outOfDescriptors reports whether err says the process or the system
// has no file descriptor left for a new connection.
func outOfDescriptors(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// Reserve is how many of limit open files the API listener's clients may
// not take (proxy's client connection cap): a quarter of the limit,
// between 64 and 4096, kept for the embedded NATS server's files, the
// outbox, and the other listeners, whose connections are capped within
// it (SideListenerCap).
func Reserve(limit uint64) uint64 { return min(max(limit/4, 64), 4096) }

// SideListenerCap is how many connections a listener other than the API
// one (storage.local.listen, server.metrics_listen, debug_listen) serves
// at once, given the file limit: share/16 of the reserve, at least 4.
// Uncapped, idle connections to the metrics listener took every
// descriptor, and the embedded NATS server failed its writes until a
// restart, as the API listener's had.
func SideListenerCap(limit uint64, known bool, share uint64) int {
	if !known || limit == 0 {
		return 64
	}
	return int(max(Reserve(limit)*share/16, 4))
}
