package rawconn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// pair returns a wrapped client connection and the server's plain end.
func pair(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server := <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	rc, ok := Wrap(c).(*Conn)
	if !ok {
		t.Fatalf("Wrap(%T) did not wrap", c)
	}
	t.Cleanup(func() { rc.Close(); server.Close() })
	return rc, server
}

func TestReadWriteRoundTrip(t *testing.T) {
	c, server := pair(t)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(server, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("server read %q, %v", buf, err)
	}
	if _, err := server.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("client read %q, %v", buf, err)
	}
	server.Close()
	if n, err := c.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after the peer closed: %d, %v; want 0, io.EOF", n, err)
	}
}

// A write bigger than the socket buffers must wait for the reader
// (EAGAIN, then the netpoller) and still deliver every byte in order.
func TestLargeWriteWaitsForTheReader(t *testing.T) {
	c, server := pair(t)
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB
	done := make(chan error, 1)
	go func() {
		n, err := c.Write(want)
		if err == nil && n != len(want) {
			err = errors.New("short write")
		}
		done <- err
	}()
	got, err := io.ReadAll(io.LimitReader(server, int64(len(want))))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, %v; want the %d written", len(got), err, len(want))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Deadlines hold as on a plain TCPConn, and the error is a net.Error
// that says timeout, with net's wording.
func TestReadDeadline(t *testing.T) {
	c, _ := pair(t)
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := c.Read(make([]byte, 8))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v; want a timeout", err)
	}
	if !strings.HasPrefix(err.Error(), "read tcp ") {
		t.Errorf("error %q; want net's wording, read tcp …", err)
	}
}

func TestUseAfterClose(t *testing.T) {
	c, _ := pair(t)
	c.Close()
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v; want net.ErrClosed", err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after close: %v; want net.ErrClosed", err)
	}
}

func TestWriteToAResetPeer(t *testing.T) {
	c, server := pair(t)
	server.(*net.TCPConn).SetLinger(0) // close sends RST
	server.Close()
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = c.Write([]byte("after the reset"))
		time.Sleep(time.Millisecond)
	}
	if err == nil || !strings.HasPrefix(err.Error(), "write tcp ") {
		t.Fatalf("writes to a reset peer: %v; want a write tcp error", err)
	}
}

func TestListenerWrapsWhatItAccepts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wl := Listener{Listener: ln}
	defer wl.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			c.Close()
		}
	}()
	c, err := wl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*Conn); !ok {
		t.Fatalf("accepted %T; want *rawconn.Conn", c)
	}
}

// PeerClosed tells a connection its peer closed from one still open, with
// or without data waiting, and takes no byte of it.
func TestPeerClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	server := Wrap(accepted)
	defer server.Close()
	if PeerClosed(server) {
		t.Fatal("an open connection is closed")
	}
	client.Write([]byte("x"))
	time.Sleep(20 * time.Millisecond)
	if PeerClosed(server) {
		t.Fatal("a connection with data waiting is closed")
	}
	var b [1]byte
	if n, _ := server.Read(b[:]); n != 1 || b[0] != 'x' {
		t.Fatalf("PeerClosed took the byte waiting: read %d %q", n, b[:n])
	}
	client.Close()
	time.Sleep(20 * time.Millisecond)
	if !PeerClosed(server) {
		t.Fatal("a connection its peer closed is open")
	}
}

// TestPeekLooksPastAnExpiredReadDeadline: fasthttp leaves a client
// connection's read deadline (server.read_timeout's 60 s) set while the
// handler runs, and a read under a deadline leaves it on an upstream
// connection put back idle. A peek through RawConn.Read fails once such a
// deadline has passed, without looking: every client waiting over 60 s was
// taken for gone (a 499 to a client still there), and every upstream
// connection idle over a second for one with bytes waiting (closed, a new
// one dialled per call).
func TestPeekLooksPastAnExpiredReadDeadline(t *testing.T) {
	rc, server := pair(t)
	if err := rc.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if PeerClosed(rc) {
		t.Error("PeerClosed: an open connection whose read deadline passed is taken for closed")
	}
	if !Quiet(rc) {
		t.Error("Quiet: an idle connection whose read deadline passed is taken for one with bytes waiting")
	}
	server.Write([]byte("x"))
	time.Sleep(20 * time.Millisecond)
	if Quiet(rc) {
		t.Error("Quiet: a connection with a byte waiting is quiet")
	}
	if PeerClosed(rc) {
		t.Error("PeerClosed: a connection with a byte waiting is closed")
	}
	rc.SetReadDeadline(time.Time{})
	var b [1]byte
	if n, err := rc.Read(b[:]); n != 1 {
		t.Fatalf("reading the byte waiting: %d, %v", n, err)
	}
	rc.SetReadDeadline(time.Now().Add(-time.Second))
	server.Close()
	time.Sleep(20 * time.Millisecond)
	if !PeerClosed(rc) {
		t.Error("PeerClosed: a connection its peer closed, read deadline passed, is open")
	}
	if Quiet(rc) {
		t.Error("Quiet: a connection its peer closed, read deadline passed, is quiet")
	}
	rc.Close()
	if !PeerClosed(rc) || Quiet(rc) {
		t.Error("a connection closed here is open")
	}
}
