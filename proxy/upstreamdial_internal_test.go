package proxy

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"strings"
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
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert.Cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}()
		}
	}()
	up := testHTTPSUpstream(t, ln.Addr().String(), 2*time.Second)
	_, err = up.pool.roundTrip(testRequest, 10*time.Second, nil, false)
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
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert.Cert}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	resumed = make(chan bool, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				if tc.Handshake() != nil {
					return
				}
				resumed <- tc.ConnectionState().DidResume
				if readRequest(bufio.NewReader(c)) {
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
				}
			}()
		}
	}()
	return ln.Addr().String(), resumed
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
