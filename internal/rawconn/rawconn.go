//go:build linux

// Package rawconn gives TCP connections reads and writes that enter the
// kernel without telling the Go scheduler.
//
// A net.Conn's Read and Write go through syscall.Syscall, which marks the
// goroutine's P as in a system call. On loopback and fast networks a write
// runs the receiver's TCP stack inline and takes several microseconds, so
// sysmon often finds the P still in that call, takes it away, wakes another
// thread to run it and keeps polling every 20 µs instead of backing off to
// 10 ms. Under load that was a sixth of the gateway's CPU (runtime.sysmon,
// usleep, futex wake-ups), none of it proxying. The sockets are
// non-blocking, so a read or write never waits in the kernel: when it
// would, it returns EAGAIN and the goroutine parks in the netpoller as
// usual (syscall.RawConn), with the connection's deadlines.
package rawconn

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Conn is a *net.TCPConn whose Read and Write use raw system calls; every
// other method is the TCPConn's. Like a TCPConn it may be read from one
// goroutine while another writes, but not read (or written) from two at
// once, which no HTTP client or server here does.
type Conn struct {
	*net.TCPConn
	raw syscall.RawConn

	// The operation in progress, kept here so the callbacks handed to the
	// RawConn are built once per connection and not per call.
	r, w            op
	readDo, writeDo func(fd uintptr) bool

	// place, for a connection a capped Listener accepted, is freed by
	// its Close.
	place capPlace
}

type op struct {
	buf []byte
	n   int
	err error
}

// Wrap returns c with raw reads and writes when it is a *net.TCPConn, and
// c itself otherwise.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	rc := &Conn{TCPConn: tc, raw: raw}
	rc.readDo, rc.writeDo = rc.read, rc.write
	return rc
}

// counted has a capped Listener's c free its place when it is closed.
func counted(c net.Conn, conns *connCap) net.Conn {
	if rc, ok := c.(*Conn); ok {
		rc.place.conns = conns
		return rc
	}
	return &countedConn{Conn: c, place: capPlace{conns: conns}}
}

// Close closes the connection and, the first time, frees its place under
// the cap of the Listener that accepted it.
func (c *Conn) Close() error {
	err := c.TCPConn.Close()
	c.place.free()
	return err
}

func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.r = op{buf: p}
	err := c.raw.Read(c.readDo)
	n := c.r.n
	if err == nil {
		err = c.r.err
	}
	c.r = op{}
	if err != nil && err != io.EOF {
		err = c.opError("read", err)
	}
	return n, err
}

func (c *Conn) read(fd uintptr) bool {
	buf := c.r.buf
	for {
		n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
		switch errno {
		case 0:
			c.r.n = int(n)
			if n == 0 {
				c.r.err = io.EOF
			}
			return true
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.r.err = os.NewSyscallError("read", errno)
			return true
		}
	}
}

func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.w = op{buf: p}
	err := c.raw.Write(c.writeDo)
	n := c.w.n
	if err == nil {
		err = c.w.err
	}
	c.w = op{}
	if err != nil {
		err = c.opError("write", err)
	}
	return n, err
}

func (c *Conn) write(fd uintptr) bool {
	for c.w.n < len(c.w.buf) {
		rest := c.w.buf[c.w.n:]
		n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&rest[0])), uintptr(len(rest)))
		switch errno {
		case 0:
			c.w.n += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.w.err = os.NewSyscallError("write", errno)
			return true
		}
	}
	return true
}

// opError words err as net.TCPConn would: a closed connection or a passed
// deadline from the RawConn loses its "raw-read" wording.
func (c *Conn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Quiet reports whether c has nothing waiting to be read and its peer has
// not closed it, looking without taking any byte (MSG_PEEK) and without
// waiting: whether a kept connection can take a request whose answer is
// the next thing read. One that is not a TCP connection always is.
func Quiet(c net.Conn) bool {
	_, ok, err := peek(c)
	return !ok || err == syscall.EAGAIN
}

// PeerClosed reports whether the other end of c closed or reset the
// connection, looking without taking any byte (MSG_PEEK) and without
// waiting. A caller must not read c meanwhile. A connection with data
// waiting (a pipelined request) is not closed; one that is not a TCP
// connection never is.
func PeerClosed(c net.Conn) bool {
	n, ok, err := peek(c)
	return ok && (n == 0 && err == nil || err != nil && err != syscall.EAGAIN && err != syscall.EINTR)
}

// peek is a non-blocking recv of one byte of c with MSG_PEEK: 0 and no
// error at the peer's close, EAGAIN when nothing waits. ok is false when c
// is no socket. It goes through RawConn.Control, not Read: Read gives up
// without calling its function once the connection's read deadline has
// passed, which fasthttp leaves set on a client connection while its
// handler runs and a timed read leaves on an upstream connection; n 0
// with no error then read as the peer's close. A connection closed here
// already is reported as closed.
func peek(c net.Conn) (n int, ok bool, err error) {
	sc, isSocket := c.(syscall.Conn)
	if !isSocket {
		return 0, false, nil
	}
	raw, rerr := sc.SyscallConn()
	if rerr != nil {
		return 0, true, rerr
	}
	if cerr := raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); cerr != nil {
		return 0, true, cerr
	}
	return n, true, err
}

// UnsentLimit is how many bytes of a client connection's send queue may
// wait unsent before a write blocks (TCP_NOTSENT_LOWAT, set by
// Listener.Accept); a blocked write wakes when less than half of it is
// left. Without it the kernel grows the queue to 4 MiB and, once full,
// wakes a blocked writer only when about a third has drained: a client
// reading a stream steadily at 8 KiB/s took no byte of a write for a
// minute as the kernel saw it, and the relay's idle_timeout on writes cut
// it. Limited, a write goes out once the client takes a few KiB (16 KiB
// is what HTTP/2 servers use to keep their queues short), and what sits
// in the kernel, billed as relayed when a stream ends early, stays near
// what the client's own window holds.
const UnsentLimit = 16 << 10

// limitUnsent sets c's TCP_NOTSENT_LOWAT to UnsentLimit: one system call
// per accepted connection, none per call. An error leaves the kernel's
// default, as on a system without the option.
func limitUnsent(c net.Conn) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpNotSentLowat, UnsentLimit)
	})
}

// tcpNotSentLowat is Linux's TCP_NOTSENT_LOWAT, which package syscall
// does not name.
const tcpNotSentLowat = 25
