package rawconn

import (
	"errors"
	"net"
	"sync/atomic"
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
	conns *connCap          // nil: as many connections as come
}

// connCap counts the connections a capped Listener accepted that are not
// closed yet.
type connCap struct {
	limit  int64
	open   atomic.Int64
	refuse func(net.Conn)
}

// release frees the place of a connection closed.
func (c *connCap) release() { c.open.Add(-1) }

// capPlace is a connection's place under the cap of the Listener that
// accepted it; conns is nil for one no capped Listener accepted.
type capPlace struct {
	conns    *connCap
	released atomic.Bool
}

// free frees the place, the first time it is called: a connection
// closed twice frees one.
func (p *capPlace) free() {
	if p.conns != nil && !p.released.Swap(true) {
		p.conns.release()
	}
}

// countedConn is a connection not wrapped for raw calls (not a TCP
// connection, or not on Linux) that a capped Listener accepted.
type countedConn struct {
	net.Conn
	place capPlace
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.place.free()
	return err
}

const logEvery = 10 * time.Second

// NewListener wraps ln; logf may be nil.
func NewListener(ln net.Listener, logf func(format string, args ...any)) Listener {
	return Listener{Listener: ln, Logf: logf, waits: new(loglimit.Limiter)}
}

// Capped returns l holding at most limit connections open at once: one
// accepted past it is handed to refuse, which answers it and closes it,
// and Accept waits for the next. The count is one atomic add as a
// connection is accepted and one as it is closed, nothing per request.
// A limit of 0 or less leaves l uncapped.
func (l Listener) Capped(limit int, refuse func(net.Conn)) Listener {
	if limit > 0 {
		l.conns = &connCap{limit: int64(limit), refuse: refuse}
	}
	return l
}

func (l Listener) Accept() (net.Conn, error) {
	var pause time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if l.conns == nil {
				limitUnsent(c)
				return Wrap(c), nil
			}
			if l.conns.open.Add(1) > l.conns.limit {
				l.conns.release()
				l.conns.refuse(c)
				continue
			}
			limitUnsent(c)
			return counted(Wrap(c), l.conns), nil
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
