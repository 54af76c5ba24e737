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
)

// What a client is told of a failed connection names no host, address
// or DNS server.
func TestReasonForClientNamesNoAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var d net.Dialer
	_, dnsErr := d.DialContext(ctx, "tcp", "gpu-secret-7.invalid:8000")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	_, refused := d.DialContext(ctx, "tcp", addr)
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

// A member at its max_connections is busy, not failing, and the 503
// after every try says so. It said "b: is unreachable: every connection
// is busy (max_connections reached)", as if b had failed.
func TestBusyMemberIsNotCalledUnreachable(t *testing.T) {
	got := unreachableReason(&upstream{}, fmt.Errorf("attempt: %w", errNoFreeConns))
	if want := "is busy: every connection is in use (max_connections)"; got != want {
		t.Fatalf("a busy member's reason is %q, want %q", got, want)
	}
}
