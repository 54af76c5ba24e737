package rawconn

import (
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// failingListener answers Accept with errs first, then accepts.
type failingListener struct {
	net.Listener
	mu   sync.Mutex
	errs []error
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		l.mu.Unlock()
		return nil, err
	}
	l.mu.Unlock()
	return l.Listener.Accept()
}

// A full file table is waited out, not returned: fasthttp's server gave
// up on it, and the gateway exited with its streams unbilled when
// idle connections used up its descriptors. Other errors still return.
func TestListenerWaitsOutAFullFileTable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	enfile := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.ENFILE)}
	var logged []string
	l := NewListener(&failingListener{Listener: ln, errs: []error{emfile, emfile, enfile}}, func(f string, a ...any) {
		logged = append(logged, fmt.Sprintf(f, a...))
	})
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			_, _ = c.Write([]byte("x"))
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("Accept: %v; want the connection after the file table had room again", err)
	}
	c.Close()
	if len(logged) != 1 || !strings.Contains(logged[0], "too many open files") || !strings.Contains(logged[0], "LimitNOFILE") {
		t.Fatalf("logged %q, want one line naming the error and the limit", logged)
	}

	closed := NewListener(&failingListener{Listener: ln, errs: []error{net.ErrClosed}}, nil)
	if _, err := closed.Accept(); err != net.ErrClosed {
		t.Fatalf("a closed listener's Accept: %v", err)
	}
}

// The listeners beside the API one get a share of the reserve the API's
// clients leave, at least 4 connections each.
func TestSideListenerCapIsAShareOfTheReserve(t *testing.T) {
	for _, c := range []struct {
		limit uint64
		known bool
		share uint64
		want  int
	}{
		{400, true, 4, 25}, // reserve 100
		{400, true, 2, 12},
		{400, true, 1, 6},
		{65536, true, 4, 1024}, // reserve 4096
		{100, true, 1, 4},      // reserve 64: the floor
		{0, false, 4, 64},      // unknown limit
	} {
		if got := SideListenerCap(c.limit, c.known, c.share); got != c.want {
			t.Errorf("file limit %d, share %d/16: %d connections, want %d", c.limit, c.share, got, c.want)
		}
	}
}

// A capped listener hands a connection past its cap to refuse, not to
// Accept's caller, and a connection closed, however many times, frees one
// place.
func TestCappedListenerRefusesPastItsCap(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan net.Conn, 4)
	l := NewListener(ln, nil).Capped(2, func(c net.Conn) { c.Close(); refused <- c })
	defer l.Close()
	dial := func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	for range 3 {
		dial()
	}
	a, _ := l.Accept()
	b, _ := l.Accept()
	if _, ok := a.(*Conn); !ok {
		t.Fatalf("accepted %T; want *rawconn.Conn", a)
	}
	accepted := make(chan net.Conn)
	go func() {
		c, _ := l.Accept() // refuses the third, waits for another
		accepted <- c
	}()
	select {
	case <-refused:
	case <-time.After(5 * time.Second):
		t.Fatal("no connection refused past the cap")
	}
	a.Close()
	a.Close() // frees its place once
	dial()
	c := <-accepted
	if c == nil {
		t.Fatal("no connection accepted in the place of one closed")
	}
	if n := l.conns.open.Load(); n != 2 {
		t.Fatalf("%d connections counted open, want 2", n)
	}
	c.Close()
	b.Close()
	if n := l.conns.open.Load(); n != 0 {
		t.Fatalf("%d connections counted open after all were closed", n)
	}
}
