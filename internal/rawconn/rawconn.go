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
	r, w                         op
	readDo, writeDo, writeReadDo func(fd uintptr) bool

	// ahead is what WriteBeforeRead left for the next Read to send;
	// aheadErr is the error sending it met.
	ahead    []byte
	aheadErr error
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
	rc.readDo, rc.writeDo, rc.writeReadDo = rc.read, rc.write, rc.writeThenRead
	return rc
}

// WriteBeforeRead leaves p for the next Read, which writes it and then
// waits for the answer without first trying to read one.
//
// A read right after a request's write finds nothing (EAGAIN): the peer
// has not answered yet. The netpoller only parks a reader after such a
// read, because it forgets a socket's readiness when a read begins; data
// that came before would otherwise be waited for in vain. Written from
// inside the read, after the readiness was reset, the request's answer
// cannot come before it, so the read that finds nothing is skipped: one
// system call less per exchange, a microsecond and more of CPU on a VM.
//
// Only for peers that send nothing unasked: data (or an orderly close)
// that came before the write would be missed until something else
// arrives, such as the reset a closed socket answers the write with. p
// must stay unchanged until that Read returns; a Write before it sends p
// first; Close drops it unsent. The connection must be read and written
// in turn by one goroutine.
func (c *Conn) WriteBeforeRead(p []byte) {
	if len(p) == 0 {
		return
	}
	if err := c.flushAhead(); err != nil {
		c.aheadErr = err // the next Read's
		return
	}
	c.ahead = p
}

// flushAhead sends what WriteBeforeRead left, when a Write comes first.
func (c *Conn) flushAhead() error {
	if c.ahead == nil {
		return nil
	}
	p := c.ahead
	c.ahead = nil
	_, err := c.Write(p)
	return err
}

func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if c.aheadErr != nil {
		err := c.aheadErr
		c.aheadErr = nil
		return 0, err
	}
	c.r = op{buf: p}
	do := c.readDo
	if c.ahead != nil {
		do = c.writeReadDo
	}
	err := c.raw.Read(do)
	if err == nil && c.ahead != nil {
		// The socket's send buffer filled before all of it went: the
		// rest waits for room as any write does, then the answer as any
		// read does.
		rest := c.ahead
		c.ahead = nil
		if _, err := c.Write(rest); err != nil {
			c.r = op{}
			return 0, err
		}
		err = c.raw.Read(c.readDo)
	}
	c.ahead = nil
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

// writeThenRead writes what WriteBeforeRead left and then waits; woken,
// it reads. It stops early, with c.ahead still set to the rest, when the
// send buffer is full.
func (c *Conn) writeThenRead(fd uintptr) bool {
	for len(c.ahead) > 0 {
		n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&c.ahead[0])), uintptr(len(c.ahead)))
		switch errno {
		case 0:
			c.ahead = c.ahead[n:]
		case syscall.EINTR:
		case syscall.EAGAIN:
			return true
		default:
			c.ahead = nil
			c.r.err = os.NewSyscallError("write", errno)
			return true
		}
	}
	if c.ahead != nil {
		c.ahead = nil
		return false // sent: wait for the answer
	}
	return c.read(fd)
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
	if err := c.flushAhead(); err != nil {
		return 0, err
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

// PeerClosed reports whether the other end of c closed or reset the
// connection, looking without taking any byte (MSG_PEEK) and without
// waiting. A caller must not read c meanwhile. A connection with data
// waiting (a pipelined request) is not closed; one that is not a TCP
// connection never is.
func PeerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	_ = raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = n == 0 && err == nil || err != nil && err != syscall.EAGAIN && err != syscall.EINTR
		return true // never wait for readiness
	})
	return closed
}
