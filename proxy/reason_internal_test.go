package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/config"
)

// What a client is told of a failed connection names no host, address
// or DNS server.
func TestReasonForClientNamesNoAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var d net.Dialer
	_, dnsErr := d.DialContext(ctx, "tcp", "gpu-secret-7.invalid:8000")
	refused := refusedDial(t)
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	conn, err := tls.Dial("tcp", strings.TrimPrefix(srv.URL, "https://"), &tls.Config{ServerName: "10.255.255.1"})
	if err == nil {
		conn.Close()
		t.Fatal("a self-signed certificate was accepted")
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{dnsErr, "its host name does not resolve"},
		{refused, "connection refused"},
		{err, "the TLS handshake failed"},
	} {
		got := reasonForClient(tc.err)
		if got != tc.want || strings.Contains(got, "127.0.0.1") || strings.Contains(got, "secret") {
			t.Errorf("%v: %q, want %q", tc.err, got, tc.want)
		}
	}
}

// The hint that nothing listens on the gateway's machine is given only
// for an upstream on loopback that refused: for one elsewhere it would
// be wrong, and a timeout is not nothing listening.
func TestLoopbackHintOnlyForARefusedLocalUpstream(t *testing.T) {
	refused := refusedDial(t)
	const hint = "nothing listens at its base_url"
	for _, tc := range []struct {
		baseURL string
		err     error
		want    bool
	}{
		{"http://127.0.0.1:8000/v1", refused, true},
		{"http://localhost:8000/v1", refused, true},
		{"http://[::1]:8000/v1", refused, true},
		{"http://10.0.3.7:8000/v1", refused, false},
		{"https://api.example.com/v1", refused, false},
		{"http://127.0.0.1:8000/v1", &net.OpError{Op: "dial", Err: timeoutError{}}, false},
	} {
		up, err := newUpstream(config.Upstream{Name: "u", BaseURL: tc.baseURL}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := unreachableReason(up, tc.err); strings.Contains(got, hint) != tc.want {
			t.Errorf("%s, %v: %q", tc.baseURL, tc.err, got)
		}
	}
}

// The hint names the make command that starts the fake upstream where
// base_url points: with UPSTREAM_BASE_URL=http://127.0.0.1:31319/v1 it
// said "make demo-upstream", which, done literally, starts it on
// 127.0.0.1:8000. The client's message names no address, the log does.
func TestLoopbackHintNamesTheDemoUpstreamsAddress(t *testing.T) {
	refused := refusedDial(t)
	for _, tc := range []struct {
		baseURL, want string
	}{
		{"http://127.0.0.1:8000/v1", "e.g. make demo-upstream, or point"},
		{"http://127.0.0.1:31319/v1", "e.g. make demo-upstream ADDR=HOST:PORT (its base_url's), or point"},
		{"http://localhost/v1", "e.g. make demo-upstream ADDR=HOST:PORT (its base_url's), or point"},
		{"http://[::1]:8000/v1", "e.g. make demo-upstream ADDR=HOST:PORT (its base_url's), or point"},
	} {
		up, err := newUpstream(config.Upstream{Name: "u", BaseURL: tc.baseURL}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := unreachableReason(up, refused); !strings.Contains(got, tc.want) || strings.Contains(got, "31319") {
			t.Errorf("%s: the client reads %q, want it to hold %q", tc.baseURL, got, tc.want)
		}
	}
	// The log names the address (TestCheckUpstreamsLogsOneThatDoesNotAnswer).
}

// refusedDial is the error of a dial to a loopback port nothing listens
// on: connection refused.
func refusedDial(t *testing.T) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, refused := net.Dial("tcp", addr)
	if refused == nil {
		t.Fatal("a closed port accepted")
	}
	return refused
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// A member at its max_connections is busy, not failing, and the 503
// after every try says so. It said "b: is unreachable: every connection
// is busy (max_connections reached)", as if b had failed.
func TestBusyMemberIsNotCalledUnreachable(t *testing.T) {
	got := unreachableReason(&upstream{}, fmt.Errorf("attempt: %w", errNoFreeConns))
	if want := "is busy: every connection is in use (max_connections)"; got != want {
		t.Fatalf("a busy member's reason is %q, want %q", got, want)
	}
}

// An upstream's own error event counts against it when the fault is its
// own: a 5xx code, a server error, or nothing naming the request. One
// that blames the request (a 4xx, invalid_request_error, a rate limit)
// says nothing of its health.
func TestServerFaultOfAnErrorEvent(t *testing.T) {
	for _, tc := range []struct {
		error string
		want  bool
	}{
		{`{"object":"error","message":"EngineDeadError: background loop has errored","type":"InternalServerError","param":null,"code":500}`, true},
		{`{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}`, true},
		{`{"message":"boom"}`, true},
		{`"model runner has unexpectedly stopped"`, true},
		{`{"code":"server_error","message":"x"}`, true},
		{`{"code":"503","message":"x"}`, true},
		{`{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}`, false},
		{`{"message":"bad","type":"invalid_request_error","code":null}`, false},
		{`{"code":"rate_limit_exceeded","message":"slow down"}`, false},
		{`{"code":"context_length_exceeded","message":"too long"}`, false},
		{`{"code":"429","message":"x"}`, false},
	} {
		if got := serverFault(gjson.Parse(tc.error)); got != tc.want {
			t.Errorf("%s: server's fault %v, want %v", tc.error, got, tc.want)
		}
	}
}
