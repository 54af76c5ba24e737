package proxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
)

// startSilentTCP accepts connections and never writes a byte on them, as
// a host whose TLS terminator hangs: a client's ClientHello gets no answer.
func startSilentTCP(t *testing.T) (addr string, accepted chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = make(chan struct{}, 16)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case accepted <- struct{}{}:
			default:
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return ln.Addr().String(), accepted
}

func testHTTPSUpstream(t *testing.T, addr string, connectTimeout time.Duration) *upstream {
	t.Helper()
	up, err := newUpstream(config.Upstream{Name: "u", BaseURL: "https://" + addr + "/v1", ConnectTimeout: connectTimeout,
		FirstByteTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second, WriteTimeout: time.Second,
		ResponseTimeout: 10 * time.Second, MaxConnections: 4, MaxResponseBody: 1 << 20}, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	return up
}

// The TLS handshake is part of opening a connection, bounded by
// connect_timeout, and its failure is a connection not opened: no request
// went out. It ran inside the first request's write, under the call's
// first_byte_timeout (a non-streamed call's response_timeout), and failed
// as a request sent and not answered: a member whose TLS hung held each
// non-streamed call for response_timeout, no other member tried.
func TestTLSHandshakeIsPartOfTheDial(t *testing.T) {
	addr, accepted := startSilentTCP(t)
	up := testHTTPSUpstream(t, addr, 200*time.Millisecond)
	done := make(chan error, 1)
	go func() {
		resp, err := up.pool.roundTrip(testRequest, 10*time.Second, nil, false)
		if resp != nil {
			resp.Close()
		}
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the handshake with a server that never answers was not bounded by connect_timeout (200ms)")
	}
	<-accepted
	if err == nil || !connectFailed(err) || sentUpstream(err) {
		t.Fatalf("a handshake that timed out: %v, want a connection not opened (connectFailed)", err)
	}
	if got := reasonForClient(err); got != "the TLS handshake timed out" {
		t.Errorf("a client is told %q", got)
	}
	if got := unreachableReason(up, err); got != "is unreachable: the TLS handshake timed out" {
		t.Errorf("the reason is %q", got)
	}
	if !strings.Contains(err.Error(), "TLS handshake with "+addr) || !strings.Contains(err.Error(), "connect_timeout (200ms)") {
		t.Errorf("operators read %q", err)
	}
}

// A certificate the gateway does not trust fails the dial, with the x509
// reason kept for operators and "the TLS handshake failed" for clients.
func TestTLSHandshakeFailureIsAConnectFailure(t *testing.T) {
	cert := testutil.NewTLSCertificate(t)
	addr := serveConns(t, func(c net.Conn) {
		_ = tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert.Cert}}).Handshake()
	})
	up := testHTTPSUpstream(t, addr, 2*time.Second)
	_, err := up.pool.roundTrip(testRequest, 10*time.Second, nil, false)
	if err == nil || !connectFailed(err) || sentUpstream(err) {
		t.Fatalf("an untrusted certificate: %v, want a connection not opened", err)
	}
	if !strings.Contains(err.Error(), "x509") {
		t.Errorf("operators read %q, without the x509 reason", err)
	}
	if got := reasonForClient(err); got != "the TLS handshake failed" {
		t.Errorf("a client is told %q", got)
	}
}

// A TCP connect that timed out is no wait for an answer: it was told as
// "did not answer within first_byte_timeout", and a non-streamed call
// took it for a generation past response_timeout (a 504, not retried).
func TestConnectTimeoutIsNoFirstByteTimeout(t *testing.T) {
	up := testHTTPSUpstream(t, "127.0.0.1:1", time.Second)
	err := &connectError{err: &net.OpError{Op: "dial", Net: "tcp", Err: timeoutError{}}}
	if sentUpstream(err) {
		t.Error("a connect that timed out counts as sent")
	}
	if got := unreachableReason(up, err); got != "is unreachable: the connection timed out" {
		t.Errorf("the reason is %q", got)
	}
}

// startTLSUpstream answers every request with a 200 and closes the
// connection (Connection: close), so each call opens a new one; resumed
// receives, for each connection, whether its handshake resumed a session.
func startTLSUpstream(t *testing.T, cert *testutil.TLSCertificate) (addr string, resumed chan bool) {
	t.Helper()
	resumed = make(chan bool, 16)
	// One config for every connection: its session ticket keys are what
	// a second connection resumes with.
	cfg := &tls.Config{Certificates: []tls.Certificate{cert.Cert}}
	addr = serveConns(t, func(c net.Conn) {
		tc := tls.Server(c, cfg)
		defer tc.Close()
		if tc.Handshake() != nil {
			return
		}
		resumed <- tc.ConnectionState().DidResume
		if readRequest(bufio.NewReader(tc)) {
			_, _ = io.WriteString(tc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		}
	})
	return addr, resumed
}

// callOnce makes one call to up and reads its answer whole.
func callOnce(t *testing.T, up *upstream) {
	t.Helper()
	resp, err := up.pool.roundTrip(testRequest, 0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := readBodyAll(t, resp); got != "ok" {
		t.Fatalf("body %q", got)
	}
	resp.Close()
}

// A new connection to an https upstream resumes the TLS session of one
// before, and so does one after a reload that rebuilt the upstream: with
// no session cache every connection was a full handshake.
func TestTLSSessionsAreResumed(t *testing.T) {
	cert := testutil.NewTLSCertificate(t)
	addr, resumed := startTLSUpstream(t, cert)
	up := testHTTPSUpstream(t, addr, 2*time.Second)
	up.tlsConfig.RootCAs = cert.Pool
	callOnce(t, up)
	if <-resumed {
		t.Fatal("the first connection resumed a session")
	}
	callOnce(t, up)
	if !<-resumed {
		t.Fatal("the second connection to the upstream did not resume the first one's TLS session")
	}
	edited := testHTTPSUpstream(t, addr, 3*time.Second) // a reload that edited connect_timeout
	edited.tlsConfig.RootCAs = cert.Pool
	edited.adoptTLSSessions(up)
	callOnce(t, edited)
	if !<-resumed {
		t.Fatal("after a reload that edited the upstream, its connection did not resume a session")
	}
}

// oneWriteConn holds what a TLS server writes on it while held, and
// sends it in one write at flush: the records of an answer and what
// follows it in one TCP segment, as a server with TCP_CORK or Nagle
// sends them.
type oneWriteConn struct {
	net.Conn
	held    bool
	pending []byte
}

func (c *oneWriteConn) Write(p []byte) (int, error) {
	if !c.held {
		return c.Conn.Write(p)
	}
	c.pending = append(c.pending, p...)
	return len(p), nil
}

// SetWriteDeadline does nothing: crypto/tls's CloseWrite sets a
// deadline of now after its close_notify, which flush would miss.
func (c *oneWriteConn) SetWriteDeadline(time.Time) error { return nil }

func (c *oneWriteConn) flush() error {
	c.held = false
	_, err := c.Conn.Write(c.pending)
	c.pending = c.pending[:0]
	return err
}

// startTLSRecordsUpstream is an https upstream (TLS version vers) that
// answers each request with answer(tc), whose writes, each a TLS record
// of its own, go out in one segment; the connection ends when it
// returns false.
func startTLSRecordsUpstream(t *testing.T, cert *testutil.TLSCertificate, vers uint16, answer func(tc *tls.Conn) bool) (addr string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int32)
	cfg := &tls.Config{Certificates: []tls.Certificate{cert.Cert}, MinVersion: vers, MaxVersion: vers}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				oc := &oneWriteConn{Conn: c}
				tc := tls.Server(oc, cfg)
				if tc.Handshake() != nil {
					return
				}
				br := bufio.NewReader(tc)
				for readRequest(br) {
					oc.held = true
					ok := answer(tc)
					if oc.flush() != nil || !ok {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), accepted
}

// Over https, a second response an upstream sent right after an answer,
// as TLS records of their own in the same TCP segment, was the next
// call's answer (3 calls of 3 in a black-box test), uncounted: crypto/tls
// had read them into its own buffer, where neither the look at the
// bufio.Reader nor rawconn.Quiet's at the socket saw them. It is counted
// as an overrun over plain http already. A close_notify after the answer
// is the upstream closing: the connection is not kept, and no overrun.
func TestUpstreamTLSRecordsAfterAnAnswerAreNotTakenForTheNext(t *testing.T) {
	cert := testutil.NewTLSCertificate(t)
	const answer = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nanswer"
	for _, vers := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		for name, c := range map[string]struct {
			after             func(tc *tls.Conn) bool // what follows the first answer
			overruns, connect int32
		}{
			"a second response": {func(tc *tls.Conn) bool {
				_, err := io.WriteString(tc, "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED")
				return err == nil
			}, 1, 2},
			"empty lines": {func(tc *tls.Conn) bool {
				_, err := io.WriteString(tc, "\r\n")
				return err == nil
			}, 0, 1},
			"a close_notify": {func(tc *tls.Conn) bool {
				tc.CloseWrite()
				return false
			}, 0, 2},
			"nothing": {func(*tls.Conn) bool { return true }, 0, 1},
		} {
			t.Run(fmt.Sprintf("%s/TLS %x", name, vers), func(t *testing.T) {
				var answered atomic.Int32
				addr, accepted := startTLSRecordsUpstream(t, cert, vers, func(tc *tls.Conn) bool {
					if _, err := io.WriteString(tc, answer); err != nil {
						return false
					}
					return answered.Add(1) > 1 || c.after(tc)
				})
				up := testHTTPSUpstream(t, addr, 2*time.Second)
				up.tlsConfig.RootCAs = cert.Pool
				var overruns atomic.Int32
				up.pool.overran = func(int) { overruns.Add(1) }
				for i := range 3 {
					r, err := up.pool.roundTrip(testRequest, 0, nil, false)
					if err != nil {
						t.Fatalf("call %d: %v", i+1, err)
					}
					if got := readBodyAll(t, r); got != "answer" {
						t.Fatalf("call %d got %q, want its own answer", i+1, got)
					}
					r.Close()
				}
				if n := overruns.Load(); n != c.overruns {
					t.Errorf("%d overruns reported, want %d", n, c.overruns)
				}
				if n := accepted.Load(); n != c.connect {
					t.Errorf("%d connections for 3 calls, want %d", n, c.connect)
				}
			})
		}
	}
}
