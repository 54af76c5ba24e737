package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// serveEpoll relays on one locked thread with its own epoll loop: the
// design of nginx's worker, in Go. Reads and writes are raw system calls,
// and so is every epoll_pwait that finds sockets ready (the runtime's
// wrappers hand the processor over around a call that may block; with
// them everywhere the loop lost a fifth of its throughput here); a
// socket is read only when epoll says it has data, never to find out.
func serveEpoll(ln net.Listener, upstream string) error {
	runtime.LockOSThread()
	up, err := net.ResolveTCPAddr("tcp4", upstream)
	if err != nil {
		return err
	}
	lf, err := ln.(*net.TCPListener).File()
	if err != nil {
		return err
	}
	ln.Close()
	l := &loop{listenerFile: lf, listener: int(lf.Fd()), clients: map[int]*client{}, upstreams: map[int]*upstreamConn{},
		upstreamAddr: &syscall.SockaddrInet4{Port: up.Port}}
	copy(l.upstreamAddr.Addr[:], up.IP.To4())
	if err := syscall.SetNonblock(l.listener, true); err != nil {
		return err
	}
	if l.epoll, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return err
	}
	if err := l.watch(l.listener); err != nil {
		return err
	}
	return l.run()
}

type loop struct {
	// listenerFile owns the listening socket: were it collected, its
	// finalizer would close the socket under the loop.
	listenerFile    *os.File
	epoll, listener int
	upstreamAddr    *syscall.SockaddrInet4
	clients         map[int]*client
	upstreams       map[int]*upstreamConn
	idle            []*upstreamConn
	buf             [16 << 10]byte // every read lands here first
}

type client struct {
	fd      int
	pending []byte        // requests read and not yet sent on
	up      *upstreamConn // the upstream answering its current request
}

type upstreamConn struct {
	fd     int
	client *client
	resp   responseEnd
}

func (l *loop) run() error {
	events := make([]syscall.EpollEvent, 256)
	for {
		n, err := l.wait(events)
		if err != nil {
			return err
		}
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			switch {
			case fd == l.listener:
				l.accept()
			case l.clients[fd] != nil:
				l.clientReadable(l.clients[fd])
			case l.upstreams[fd] != nil:
				l.upstreamReadable(l.upstreams[fd])
			}
		}
	}
}

// wait returns the ready sockets. Under load some are ready at once, and
// a raw, non-blocking epoll_pwait finds them without the runtime's
// hand-off. Only when none is ready does it block, through the runtime's
// wrapper: a thread blocked in a raw call cannot be stopped, and the
// garbage collector's stop-the-world would wait for it.
func (l *loop) wait(events []syscall.EpollEvent) (int, error) {
	for {
		n, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(l.epoll),
			uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
		if errno == 0 && n > 0 {
			return int(n), nil
		}
		if errno != 0 && errno != syscall.EINTR {
			return 0, fmt.Errorf("epoll_pwait: %w", errno)
		}
		k, err := syscall.EpollWait(l.epoll, events, -1)
		if err == syscall.EINTR || (err == nil && k == 0) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("epoll_wait: %w", err)
		}
		return k, nil
	}
}

func (l *loop) watch(fd int) error {
	return syscall.EpollCtl(l.epoll, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)})
}

func (l *loop) accept() {
	for {
		fd, _, err := syscall.Accept4(l.listener, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return
		}
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		if l.watch(fd) != nil {
			syscall.Close(fd)
			continue
		}
		l.clients[fd] = &client{fd: fd}
	}
}

func (l *loop) clientReadable(c *client) {
	n, errno := rawRead(c.fd, l.buf[:])
	if errno == syscall.EAGAIN {
		return
	}
	if n <= 0 {
		l.closeClient(c)
		return
	}
	c.pending = append(c.pending, l.buf[:n]...)
	l.dispatch(c)
}

// dispatch sends the client's next whole request upstream, unless one is
// still being answered (pipelined requests wait their turn).
func (l *loop) dispatch(c *client) {
	if c.up != nil {
		return
	}
	size, err := requestSize(c.pending)
	if err != nil {
		_ = writeAll(c.fd, []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
		l.closeClient(c)
		return
	}
	if size < 0 || len(c.pending) < size {
		return
	}
	u, err := l.upstream()
	if err != nil {
		_ = writeAll(c.fd, []byte("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
		l.closeClient(c)
		return
	}
	u.client, c.up = c, u
	u.resp.reset()
	if writeAll(u.fd, c.pending[:size]) != nil {
		l.closeUpstream(u)
		l.closeClient(c)
		return
	}
	c.pending = c.pending[:copy(c.pending, c.pending[size:])]
}

func (l *loop) upstreamReadable(u *upstreamConn) {
	n, errno := rawRead(u.fd, l.buf[:])
	if errno == syscall.EAGAIN {
		return
	}
	c := u.client
	if n <= 0 {
		l.closeUpstream(u)
		if c != nil {
			l.closeClient(c) // an answer cut short, or one that ends at close
		}
		return
	}
	if c == nil {
		l.closeUpstream(u) // bytes nobody asked for
		return
	}
	if writeAll(c.fd, l.buf[:n]) != nil {
		l.closeUpstream(u)
		l.closeClient(c)
		return
	}
	done, err := u.resp.feed(l.buf[:n])
	if err != nil {
		l.closeUpstream(u)
		l.closeClient(c)
		return
	}
	if done {
		u.client, c.up = nil, nil
		if u.resp.close {
			l.closeUpstream(u)
		} else {
			l.idle = append(l.idle, u)
		}
		l.dispatch(c)
	}
}

func (l *loop) upstream() (*upstreamConn, error) {
	if k := len(l.idle); k > 0 {
		u := l.idle[k-1]
		l.idle = l.idle[:k-1]
		return u, nil
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Connect(fd, l.upstreamAddr); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := l.watch(fd); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	u := &upstreamConn{fd: fd}
	l.upstreams[fd] = u
	return u, nil
}

func (l *loop) closeClient(c *client) {
	if u := c.up; u != nil {
		l.closeUpstream(u) // its answer has nowhere to go
	}
	delete(l.clients, c.fd)
	syscall.Close(c.fd)
}

func (l *loop) closeUpstream(u *upstreamConn) {
	if c := u.client; c != nil {
		c.up = nil
	}
	u.client = nil
	// An idle connection the upstream closed must not be handed out
	// again: its fd number may already be another socket's.
	l.idle = slices.DeleteFunc(l.idle, func(v *upstreamConn) bool { return v == u })
	delete(l.upstreams, u.fd)
	syscall.Close(u.fd)
}

func rawRead(fd int, p []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), errno
}

// writeAll writes p whole; a full socket buffer is waited out with poll,
// which stalls the loop: acceptable for an instrument whose clients read.
func writeAll(fd int, p []byte) error {
	for len(p) > 0 {
		n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch errno {
		case 0:
			p = p[n:]
		case syscall.EAGAIN:
			if _, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}, 1000); err != nil && err != unix.EINTR {
				return err
			}
		case syscall.EINTR:
		default:
			return errno
		}
	}
	return nil
}

// requestSize is the size of the request at the start of b, head and
// Content-Length body, or -1 while its head is incomplete.
func requestSize(b []byte) (int, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) > 64<<10 {
			return 0, fmt.Errorf("request head over 64 KiB")
		}
		return -1, nil
	}
	var size int64
	for name, value := range headerFields(b[:end]) {
		switch {
		case bytes.EqualFold(name, []byte("content-length")):
			n, err := contentLength(value)
			if err != nil {
				return 0, err
			}
			size = n
		case bytes.EqualFold(name, []byte("transfer-encoding")):
			return 0, fmt.Errorf("chunked request bodies are not relayed")
		}
	}
	return end + 4 + int(size), nil
}
