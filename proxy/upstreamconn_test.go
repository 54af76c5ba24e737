package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
)

// rawUpstream answers each request on a connection with the next of its
// scripted byte strings, written as they are; an empty one closes the
// connection without answering.
type rawUpstream struct {
	ln       net.Listener
	accepted atomic.Int32
}

func startRawUpstream(t *testing.T, answer func(conn int, req int, c net.Conn) bool) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := int(u.accepted.Add(1))
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for req := 1; ; req++ {
					if !readRequest(br) || !answer(n, req, c) {
						return
					}
				}
			}()
		}
	}()
	return u
}

// serveConns accepts connections on a loopback port until the test ends,
// serving each with handle on a goroutine of its own and closing it once
// handle returns. It returns the listener's address.
func serveConns(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// readRequest reads one request with a Content-Length body.
func readRequest(br *bufio.Reader) bool {
	length := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return false
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, "Content-Length") {
			for _, c := range strings.TrimSpace(v) {
				length = length*10 + int(c-'0')
			}
		}
	}
	_, err := io.CopyN(io.Discard, br, int64(length))
	return err == nil
}

func testPool(t *testing.T, addr string, maxConns int) *connPool {
	up := &upstream{}
	up.cfg.ConnectTimeout, up.cfg.FirstByteTimeout, up.cfg.IdleTimeout, up.cfg.WriteTimeout = time.Second, 2*time.Second, 2*time.Second, time.Second
	return newConnPool(addr, false, maxConns, 300*time.Millisecond, up.dialContext)
}

var testRequest = appendRequest(nil, []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"), nil, []byte(`{"model":"m"}`), false)

func readBodyAll(t *testing.T, r *upstreamResponse) string {
	t.Helper()
	b, err := r.readAll(nil, 1<<20)
	if err != nil {
		t.Fatalf("reading body: %v (got %q)", err, b)
	}
	return string(b)
}

func TestUpstreamBodyFramings(t *testing.T) {
	answers := []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nhel\r\n2\r\nlo\r\n0\r\nX-Trailer: t\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 204 No Content\r\n\r\n",
	}
	u := startRawUpstream(t, func(_, req int, c net.Conn) bool {
		_, err := io.WriteString(c, answers[req-1])
		return err == nil
	})
	p := testPool(t, u.ln.Addr().String(), 4)
	for i, want := range []string{"hello", "hello", "hello", ""} {
		r, err := p.roundTrip(testRequest, 0, nil, false)
		if err != nil {
			t.Fatalf("answer %d: %v", i+1, err)
		}
		if got := readBodyAll(t, r); got != want {
			t.Fatalf("answer %d: body %q, want %q", i+1, got, want)
		}
		r.Close()
	}
	if n := u.accepted.Load(); n != 1 {
		t.Fatalf("%d connections for four keep-alive answers, want 1", n)
	}
}

func TestUpstreamBodyUntilCloseIsNotReused(t *testing.T) {
	u := startRawUpstream(t, func(_, _ int, c net.Conn) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\nuntil the end")
		return false
	})
	p := testPool(t, u.ln.Addr().String(), 4)
	for range 2 {
		r, err := p.roundTrip(testRequest, 0, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := readBodyAll(t, r); got != "until the end" {
			t.Fatalf("body %q", got)
		}
		r.Close()
	}
	if n := u.accepted.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: a body ended by closing cannot be followed by another", n)
	}
}

func TestUpstreamChunkedBodyCutIsAnError(t *testing.T) {
	u := startRawUpstream(t, func(_, _ int, c net.Conn) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")
		return false
	})
	p := testPool(t, u.ln.Addr().String(), 4)
	r, err := p.roundTrip(testRequest, 0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.readAll(nil, 1<<20); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v, want unexpected EOF", err)
	}
}

// A pooled connection the upstream closed while it sat idle is replaced
// once, without the caller noticing; the request reached nobody.
func TestUpstreamStaleConnectionIsReplacedOnce(t *testing.T) {
	u := startRawUpstream(t, func(_, req int, c net.Conn) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return false // close after each answer, without saying so
	})
	p := testPool(t, u.ln.Addr().String(), 4)
	for i := range 3 {
		r, err := p.roundTrip(testRequest, 0, nil, false)
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		if got := readBodyAll(t, r); got != "ok" {
			t.Fatalf("body %q", got)
		}
		r.Close()
		time.Sleep(20 * time.Millisecond) // let the close arrive
	}
}

// An upstream that takes a request on a kept connection, works on it and
// then closes without answering (a crash, a restart) is not sent it again
// on a new connection: it was, and generated it twice.
func TestUpstreamCloseAfterWorkingOnAReusedConnectionIsNotRetried(t *testing.T) {
	u := startRawUpstream(t, func(_, req int, c net.Conn) bool {
		if req == 1 {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		time.Sleep(200 * time.Millisecond) // generating, then gone
		return false
	})
	p := testPool(t, u.ln.Addr().String(), 4)
	r, err := p.roundTrip(testRequest, 0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	readBodyAll(t, r)
	r.Close()
	if _, err := p.roundTrip(testRequest, 0, nil, false); err == nil {
		t.Fatal("want an error")
	}
	if n := u.accepted.Load(); n != 1 {
		t.Fatalf("%d connections: the request was sent again", n)
	}
}

// An upstream that fails after reading a request on a fresh connection is
// not sent the request again: it may have started generating.
func TestUpstreamFailureOnFreshConnectionIsNotRetried(t *testing.T) {
	u := startRawUpstream(t, func(_, _ int, c net.Conn) bool { return false })
	p := testPool(t, u.ln.Addr().String(), 4)
	if _, err := p.roundTrip(testRequest, 0, nil, false); err == nil {
		t.Fatal("want an error")
	}
	if n := u.accepted.Load(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
}

func TestUpstreamMaxConnectionsWaitsThenRefuses(t *testing.T) {
	release := make(chan struct{})
	u := startRawUpstream(t, func(_, _ int, c net.Conn) bool {
		<-release
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	defer close(release)
	p := testPool(t, u.ln.Addr().String(), 1)
	held := make(chan *upstreamResponse)
	go func() {
		r, _ := p.roundTrip(testRequest, 0, nil, false)
		held <- r
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if _, err := p.roundTrip(testRequest, 0, nil, false); !errors.Is(err, errNoFreeConns) {
		t.Fatalf("err %v, want errNoFreeConns", err)
	}
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Fatalf("refused after %s, want it to wait for a free connection first", waited)
	}
	release <- struct{}{}
	if r := <-held; r != nil {
		r.Close()
	}
}

// Events that arrived together come out of one Read; an event still
// arriving is not waited for while others are ready.
func TestUpstreamReadHandsOutWhatArrivedWithoutWaiting(t *testing.T) {
	more := make(chan struct{})
	u := startRawUpstream(t, func(_, _ int, c net.Conn) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"4\r\none\n\r\n4\r\ntwo\n\r\n6\r\nthr")
		<-more
		io.WriteString(c, "ee\n\r\n0\r\n\r\n")
		return true
	})
	p := testPool(t, u.ln.Addr().String(), 4)
	r, err := p.roundTrip(testRequest, 0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 4096)
	var got []byte
	deadline := time.Now().Add(2 * time.Second)
	for !bytes.Contains(got, []byte("thr")) && time.Now().Before(deadline) {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if string(got) != "one\ntwo\nthr" {
		t.Fatalf("before the rest was sent: %q", got)
	}
	close(more)
	rest := readBodyAll(t, r)
	if rest != "ee\n" {
		t.Fatalf("rest %q", rest)
	}
}

func TestMayFinish(t *testing.T) {
	for _, c := range []struct {
		chunk string
		want  bool
	}{
		{`{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`, false},
		{`{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason": null}]}`, false},
		{`{"choices":[{"index":0,"delta":{"content":"hi"}}]}`, false},
		{`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, true},
		{`{"choices":[{"index":0,"delta":{},"finish_reason" : "length"}]}`, true},
		{`{"choices":[],"usage":{"prompt_tokens":1}}`, false},
		{`{"choices":[{"delta":{"content":"x"},"finish_reason":null}],"usage":null}`, false},
		{`{"choices":[{"finish_reason":null},{"finish_reason":"stop"}]}`, true},
	} {
		if got := mayFinish([]byte(c.chunk)); got != c.want {
			t.Errorf("%s: got %v, want %v", c.chunk, got, c.want)
		}
	}
}

// bytesConn is a connection whose reads come from a fixed byte string and
// whose writes go nowhere, for fuzzing the response reader.
type bytesConn struct {
	net.Conn
	r *bytes.Reader
}

func (c *bytesConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *bytesConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *bytesConn) Close() error                { return nil }

// FuzzUpstreamResponse feeds arbitrary bytes as an upstream's answer: the
// reader must never panic, never return more body than arrived, and
// either end the body or report an error.
func FuzzUpstreamResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nhel\r\n2\r\nlo\r\n0\r\nT: 1\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nx"))
	f.Add([]byte("HTTP/1.1 200 OK\r\n\r\nuntil close"))
	f.Fuzz(func(t *testing.T, data []byte) {
		conn := &bytesConn{r: bytes.NewReader(data)}
		p := &connPool{busy: make(chan struct{}, 1)}
		p.busy <- struct{}{}
		r := &upstreamResponse{pool: p, uc: &upstreamConn{conn: conn, br: bufio.NewReaderSize(conn, 64)}}
		if err := r.exchange(nil); err != nil {
			return
		}
		body, err := r.readAll(nil, 1<<20)
		if len(body) > len(data) {
			t.Fatalf("%d body bytes out of %d input bytes", len(body), len(data))
		}
		if err == nil && !r.done {
			t.Fatal("no error and the body not done")
		}
		r.Close()
	})
}

// When the upstream's keep-alive closed several kept connections at once,
// the one retry goes to a new connection: it took the next kept one,
// closed as well, and the call after a lull was a 503.
func TestUpstreamStaleConnectionsAreAllReplaced(t *testing.T) {
	var mu sync.Mutex
	var conns []net.Conn
	u := startRawUpstream(t, func(_, _ int, c net.Conn) bool {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	p := testPool(t, u.ln.Addr().String(), 4)
	// Four calls at once leave four kept connections.
	var held []*upstreamResponse
	for range 4 {
		r, err := p.roundTrip(testRequest, 0, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
	}
	for _, r := range held {
		readBodyAll(t, r)
		r.Close()
	}
	mu.Lock()
	for _, c := range conns { // the upstream's keep-alive runs out
		c.Close()
	}
	mu.Unlock()
	time.Sleep(20 * time.Millisecond) // let the closes arrive
	r, err := p.roundTrip(testRequest, 0, nil, false)
	if err != nil {
		t.Fatalf("the call after every kept connection was closed: %v", err)
	}
	readBodyAll(t, r)
	r.Close()
}

// A kept connection that sat idle is looked at when taken: an upstream
// that half-closed it (still reading) took the next request, worked on
// it and could not answer, and the request was generated again on a new
// connection; one that wrote an unasked 408 on it had that 408 taken for
// the next call's answer.
// A 408 on a kept connection is the upstream closing it at its idle
// deadline, racing the request: the request goes again, once, on a new
// connection. Taken for the call's answer, it reached clients under load
// (9 of 24,373 calls with a 100 ms keep-alive); on a new connection it is
// the answer.
func TestUpstream408OnAKeptConnectionIsSentAgainOnce(t *testing.T) {
	const answer408 = "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
	for name, c := range map[string]struct {
		always408 bool // every connection answers its second request so, and new ones their first
		want      int
	}{
		"kept connection": {false, 200},
		"new one too":     {true, 408},
	} {
		t.Run(name, func(t *testing.T) {
			var requests atomic.Int32
			u := startRawUpstream(t, func(conn, req int, w net.Conn) bool {
				requests.Add(1)
				if req > 1 || c.always408 && conn > 1 {
					io.WriteString(w, answer408)
					return false
				}
				io.WriteString(w, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				return true
			})
			p := testPool(t, u.ln.Addr().String(), 4)
			r, err := p.roundTrip(testRequest, 0, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			readBodyAll(t, r)
			r.Close()
			r, err = p.roundTrip(testRequest, 0, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			if st := r.Header.StatusCode(); st != c.want {
				t.Fatalf("the call on the kept connection got %d, want %d", st, c.want)
			}
			readBodyAll(t, r)
			r.Close()
			if n, a := requests.Load(), u.accepted.Load(); n != 3 || a != 2 {
				t.Fatalf("%d requests on %d connections, want 3 on 2: sent again once, on a new one", n, a)
			}
		})
	}
}

func TestUpstreamIdleConnectionIsLookedAtWhenTaken(t *testing.T) {
	for name, goIdle := range map[string]func(c net.Conn){
		"half-closed": func(c net.Conn) { c.(*net.TCPConn).CloseWrite() },
		"unasked 408": func(c net.Conn) {
			io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
			c.Close()
		},
	} {
		t.Run(name, func(t *testing.T) {
			var requests atomic.Int32
			u := startRawUpstream(t, func(conn, req int, c net.Conn) bool {
				requests.Add(1)
				if req > 1 {
					return true // read, worked on, no way to answer
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				time.AfterFunc(50*time.Millisecond, func() { goIdle(c) })
				return true
			})
			p := testPool(t, u.ln.Addr().String(), 4)
			for i := range 2 {
				r, err := p.roundTrip(testRequest, 0, nil, false)
				if err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
				if st, body := r.Header.StatusCode(), readBodyAll(t, r); st != 200 || body != "ok" {
					t.Fatalf("call %d: %d %q, want the upstream's answer to it", i+1, st, body)
				}
				r.Close()
				time.Sleep(200 * time.Millisecond) // idle past quietCheckIdle; the upstream acts
			}
			if n := requests.Load(); n != 2 {
				t.Fatalf("the upstream read %d requests for 2 calls", n)
			}
		})
	}
}

// A reload that edits an upstream at the same address hands the slots of
// its connections still in use to the new pool, along any number of
// edits and whatever the new max_connections: an edit of a timeout gave
// the upstream a whole new cap beside its calls still running, and each
// further edit one more.
func TestReloadedPoolCountsItsPredecessorsConnections(t *testing.T) {
	u := startRawUpstream(t, func(int, int, net.Conn) bool { return true })
	addr := u.ln.Addr().String()
	inUse := func(p *connPool) int { p.mu.Lock(); defer p.mu.Unlock(); return len(p.busy) }
	first := testPool(t, addr, 2)
	a, _, err := first.acquire(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := first.acquire(nil)
	if err != nil {
		t.Fatal(err)
	}
	// max_connections 2 to 1: full while either call of the first runs.
	second := testPool(t, addr, 1)
	second.inheritSlots(first)
	if _, _, err := second.acquire(nil); !errors.Is(err, errNoFreeConns) {
		t.Fatalf("a call went out beside the two of the pool before, over max_connections 1: %v", err)
	}
	// And 1 to 3: one more may go out now.
	third := testPool(t, addr, 3)
	third.inheritSlots(second)
	c, _, err := third.acquire(nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := inUse(third); n != 2 {
		t.Fatalf("the third pool counts %d connections in use, want 2 (one of its own, one of the first's)", n)
	}
	first.release(a) // the first still holds one: the second's slot stays
	if n := inUse(third); n != 2 {
		t.Fatalf("with one call of the first still running the third counts %d in use, want 2", n)
	}
	first.discard(b)
	if n, m := inUse(second), inUse(third); n != 0 || m != 1 {
		t.Fatalf("after the first's calls ended the second counts %d in use, the third %d; want 0 and 1", n, m)
	}
	third.release(c)
	if n := inUse(third); n != 0 {
		t.Fatalf("with every call ended the third counts %d connections in use", n)
	}
	// Another address is another server: its connections do not count.
	moved := testPool(t, "localhost"+addr[strings.LastIndexByte(addr, ':'):], 1)
	d, _, err := third.acquire(nil)
	if err != nil {
		t.Fatal(err)
	}
	moved.inheritSlots(third)
	if n := inUse(moved); n != 0 {
		t.Fatalf("a pool at another address counts %d connections of the one before", n)
	}
	third.discard(d)
}

// An upstream that sends bytes after an answer's end (a second response
// after a sized body, more after a chunked body's last chunk, a body
// after a 204) had them taken for the answer to the next call on the
// connection, and every call after it got the answer to the call before,
// billed on its usage, while calls came less than a second apart.
func TestUpstreamBytesAfterAnAnswerAreNotTakenForTheNext(t *testing.T) {
	const smuggled = "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"
	for name, c := range map[string]struct{ answer, body string }{
		"after a sized body":   {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst" + smuggled, "first"},
		"after a chunked body": {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n0\r\n\r\n" + smuggled, "first"},
		"after a 204":          {"HTTP/1.1 204 No Content\r\n\r\n" + smuggled, ""},
		"after an empty line":  {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst\r\n" + smuggled, "first"},
	} {
		t.Run(name, func(t *testing.T) {
			var requests atomic.Int32
			u := startRawUpstream(t, func(_, _ int, w net.Conn) bool {
				answer := "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond"
				if requests.Add(1) == 1 {
					answer = c.answer
				}
				_, err := io.WriteString(w, answer)
				return err == nil
			})
			p := testPool(t, u.ln.Addr().String(), 4)
			var overruns atomic.Int32
			p.overran = func(int) { overruns.Add(1) }
			for i, want := range []string{c.body, "second"} {
				r, err := p.roundTrip(testRequest, 0, nil, false)
				if err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
				if got := readBodyAll(t, r); got != want {
					t.Fatalf("call %d got %q, want %q", i+1, got, want)
				}
				r.Close()
			}
			if n := u.accepted.Load(); n != 2 {
				t.Fatalf("%d connections, want 2: the one with bytes after its answer is not kept", n)
			}
			if n := overruns.Load(); n != 1 {
				t.Fatalf("%d overruns reported, want 1", n)
			}
		})
	}
}

// A success status with no body is no answer (awaitBody): its connection
// is not kept, as any other failed exchange's is; bytes the upstream
// sends after it in a later packet were the next call's answer.
func TestUpstreamEmptyAnswerConnectionIsNotReused(t *testing.T) {
	u := startRawUpstream(t, func(_, _ int, c net.Conn) bool {
		_, err := io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
		return err == nil
	})
	p := testPool(t, u.ln.Addr().String(), 4)
	for range 2 {
		r, err := p.roundTrip(testRequest, 0, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.awaitBody(false); !errors.Is(err, errEmptyAnswer) {
			t.Fatalf("awaitBody: %v, want errEmptyAnswer", err)
		}
		r.Close()
	}
	if n := u.accepted.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// An interim (1xx) response is not the answer's first byte: an upstream
// sending 103 Early Hints every half second, 80 times, then its answer,
// held a call 40 s past a first_byte_timeout of 10 s (its first 103
// counted as the first byte, each later read waited idle_timeout), and a
// client that left meanwhile was billed in full, since only a wait for
// the first byte looks at the client.
func TestUpstreamInterimResponsesAreNoFirstByte(t *testing.T) {
	hints := func(c net.Conn, d time.Duration) bool {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if _, err := io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"); err != nil {
				return false
			}
		}
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return err == nil
	}
	t.Run("first byte's deadline", func(t *testing.T) {
		u := startRawUpstream(t, func(_, _ int, c net.Conn) bool { return hints(c, 1500*time.Millisecond) })
		p := testPool(t, u.ln.Addr().String(), 4) // idle_timeout 2s
		start := time.Now()
		r, err := p.roundTrip(testRequest, 500*time.Millisecond, nil, false)
		if err == nil {
			r.Close()
			t.Fatalf("answered after %v of 103s, past a first byte's deadline of 500ms", time.Since(start).Round(time.Millisecond))
		}
		if !isTimeout(err) || time.Since(start) > time.Second {
			t.Fatalf("after %v: %v, want the first byte's timeout at 500ms", time.Since(start).Round(time.Millisecond), err)
		}
	})
	t.Run("client gone", func(t *testing.T) {
		u := startRawUpstream(t, func(_, _ int, c net.Conn) bool { return hints(c, 4*time.Second) })
		p := testPool(t, u.ln.Addr().String(), 4)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		gone, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		client, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		gone.Close()
		start := time.Now()
		r, err := p.roundTrip(testRequest, 10*time.Second, client, false)
		if err == nil {
			r.Close()
			t.Fatalf("answered after %v for a client gone at once", time.Since(start).Round(time.Millisecond))
		}
		if !errors.Is(err, errClientGone) || time.Since(start) > 2500*time.Millisecond {
			t.Fatalf("after %v: %v, want errClientGone within about clientCheckEvery", time.Since(start).Round(time.Millisecond), err)
		}
	})
	t.Run("too many", func(t *testing.T) {
		u := startRawUpstream(t, func(_, _ int, c net.Conn) bool {
			io.WriteString(c, strings.Repeat("HTTP/1.1 102 Processing\r\n\r\n", maxInterimResponses+1))
			return true
		})
		p := testPool(t, u.ln.Addr().String(), 4)
		if r, err := p.roundTrip(testRequest, 0, nil, false); !errors.Is(err, errTooManyInterim) {
			if err == nil {
				r.Close()
			}
			t.Fatalf("err %v, want errTooManyInterim", err)
		}
	})
}

// fasthttp's errors for a response header quote what was read, the
// answer's body included: none of it is kept. A header it cannot parse
// is errBadHeader; a read cut short keeps its cause.
func TestUpstreamHeaderErrorsQuoteNothing(t *testing.T) {
	for answer, want := range map[string]string{
		"HTTP/1.1 2x0 OK\r\nContent-Length: 6\r\n\r\nSECRET":         "sent an invalid response header (invalid response status code)",
		"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nSECRET":       "sent an invalid response header (cannot parse content-length: unexpected first char found: expecting 0-9)",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: SECRET\r\n\r\nSECRET": "sent an invalid response header (unsupported transfer-encoding)",
		"SECRET\r\n\r\n": "sent an invalid response header (cannot find whitespace in the first line of response)",
		"HTTP/1.1 200 OK\r\nX-SECRET: 1\r\nContent-Le": "error when reading response headers: EOF",
	} {
		u := startRawUpstream(t, func(_, _ int, c net.Conn) bool { io.WriteString(c, answer); return false })
		p := testPool(t, u.ln.Addr().String(), 4)
		r, err := p.roundTrip(testRequest, 0, nil, false)
		if err == nil {
			r.Close()
			t.Fatalf("%q: no error", answer)
		}
		if err.Error() != want {
			t.Errorf("%q: %q, want %q", answer, err, want)
		}
		if want == "error when reading response headers: EOF" && !errors.Is(err, io.EOF) {
			t.Errorf("%q: %v does not unwrap to io.EOF", answer, err)
		}
	}
}

// A kept connection whose answer came in one read still has that read's
// deadline (a second on) when it is put back; taken again after the
// deadline passed, it was found not quiet (a peek that gave up at the
// deadline read as bytes waiting) and closed: a new connection, and a
// new TLS handshake, for every call more than a second after the one
// before.
func TestUpstreamConnectionIdlePastItsReadDeadlineIsReused(t *testing.T) {
	u := startRawUpstream(t, func(_, _ int, c net.Conn) bool {
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return err == nil
	})
	p := testPool(t, u.ln.Addr().String(), 4)
	client, peer := net.Pipe() // watched for being gone, never closed
	defer client.Close()
	defer peer.Close()
	for i := range 2 {
		r, err := p.roundTrip(testRequest, 0, client, false)
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		if got := readBodyAll(t, r); got != "ok" {
			t.Fatalf("body %q", got)
		}
		r.Close()
		if i == 0 {
			time.Sleep(clientCheckEvery + 300*time.Millisecond)
		}
	}
	if n := u.accepted.Load(); n != 1 {
		t.Fatalf("%d connections for two answers %v apart, want 1", n, clientCheckEvery+300*time.Millisecond)
	}
}

// An upstream that ended each sized body with a stray CRLF (or a few) had
// every connection closed, counted as an overrun and logged, and a new
// one dialled, call after call. RFC 9112 (2.2) has a recipient ignore
// empty lines before a start line: the connection is kept, and the next
// answer on it read whole.
func TestUpstreamEmptyLinesAfterAnAnswerKeepTheConnection(t *testing.T) {
	sized := func(after string) func(int32) string {
		return func(n int32) string {
			return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nanswer%d%s", n, after)
		}
	}
	for name, answer := range map[string]func(n int32) string{
		"a CRLF":         sized("\r\n"),
		"a few CRLFs":    sized("\r\n\r\n\r\n"),
		"a bare LF":      sized("\n"),
		"half of a CRLF": sized("\r"),
		"a CRLF after a chunked body": func(n int32) string {
			return fmt.Sprintf("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n7\r\nanswer%d\r\n0\r\n\r\n\r\n", n)
		},
	} {
		t.Run(name, func(t *testing.T) {
			var requests atomic.Int32
			u := startRawUpstream(t, func(_, _ int, w net.Conn) bool {
				_, err := io.WriteString(w, answer(requests.Add(1)))
				return err == nil
			})
			p := testPool(t, u.ln.Addr().String(), 4)
			var overruns atomic.Int32
			p.overran = func(int) { overruns.Add(1) }
			for i := 1; i <= 3; i++ {
				r, err := p.roundTrip(testRequest, 0, nil, false)
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if got, want := readBodyAll(t, r), fmt.Sprintf("answer%d", i); got != want {
					t.Fatalf("call %d got %q, want %q", i, got, want)
				}
				r.Close()
			}
			if n := u.accepted.Load(); n != 1 {
				t.Fatalf("%d connections, want 1: empty lines after an answer are no reason to close it", n)
			}
			if n := overruns.Load(); n != 0 {
				t.Fatalf("%d overruns reported, want none", n)
			}
		})
	}
}

// Idle connections were only skipped once idlePoolTime old, never
// closed: one stayed open 70 s after its last call, and 6 of a burst's 8
// were open 15 s after it, until the upstream's own keep-alive closed
// them (an upstream with a long one kept max_connections TLS
// connections per gateway for good). They are closed once that old.
func TestUpstreamIdleConnectionsAreClosedOnceTooOld(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var requests, open atomic.Int32
	allIn := make(chan struct{})
	const burst = 3
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			open.Add(1)
			go func() {
				defer open.Add(-1)
				defer c.Close()
				br := bufio.NewReader(c)
				for readRequest(br) {
					if requests.Add(1) == burst {
						close(allIn)
					}
					<-allIn // the burst's calls hold a connection each
					if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
						return
					}
				}
			}()
		}
	}()
	p := testPool(t, ln.Addr().String(), burst)
	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			r, err := p.roundTrip(testRequest, 0, nil, false)
			if err != nil {
				t.Error(err)
				return
			}
			readBodyAll(t, r)
			r.Close()
		})
	}
	wg.Wait()
	if n := open.Load(); n != burst {
		t.Fatalf("%d connections open after the burst, want %d kept", n, burst)
	}
	testutil.CheckFor(t, idlePoolTime+3*time.Second, 50*time.Millisecond, func() error {
		if n := open.Load(); n != 0 {
			return fmt.Errorf("%d connections still open, idle since the burst", n)
		}
		return nil
	})
}
