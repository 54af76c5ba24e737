package proxy_test

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// setUpstreamOf rewrites member p<i>'s entry of a pool harness's config
// to base_url and settings, and waits until the gateway runs it.
func (h *poolHarness) setUpstreamOf(i int, baseURL, settings string) {
	h.t.Helper()
	old := fmt.Sprintf("{name: p%d, base_url: %s, first_byte_timeout: 2s}", i, h.ups[i].URL)
	cfg := readFile(h.t, h.cfgPath)
	if !strings.Contains(cfg, old) {
		h.t.Fatalf("no %s in the config", old)
	}
	h.writeConfig(strings.Replace(cfg, old, fmt.Sprintf("{name: p%d, base_url: %s, %s}", i, baseURL, settings), 1))
	checkFor(h.t, 3*time.Second, 10*time.Millisecond, func() error {
		for _, u := range h.gw.World().Config.Upstreams {
			if u.Name == fmt.Sprintf("p%d", i) && u.BaseURL == baseURL {
				return nil
			}
		}
		return fmt.Errorf("p%d's base_url is not %s yet", i, baseURL)
	})
}

// editUpstream replaces old by new in the config, and waits until the
// gateway runs an upstream p0 inForce says is the edited one.
func (h *poolHarness) editUpstream(old, new string, inForce func(config.Upstream) bool) {
	h.t.Helper()
	cfg := readFile(h.t, h.cfgPath)
	if !strings.Contains(cfg, old) {
		h.t.Fatalf("no %q in the config", old)
	}
	h.writeConfig(strings.Replace(cfg, old, new, 1))
	checkFor(h.t, 3*time.Second, 10*time.Millisecond, func() error {
		for _, u := range h.gw.World().Config.Upstreams {
			if u.Name == "p0" && inForce(u) {
				return nil
			}
		}
		return fmt.Errorf("%q is not in force yet", new)
	})
}

// writeCAFile writes cert's CA to a file for tls_ca, and names it.
func writeCAFile(t *testing.T, cert *testutil.TLSCertificate) string {
	t.Helper()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, cert.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return caFile
}

// A member whose host takes connections and never answers a TLS
// handshake is a connection that could not be opened, within
// connect_timeout: calls move on to the other member, a non-streamed one
// too, and it is ejected as one that refuses connections. The handshake
// ran inside the first request's write: a non-streamed call waited
// response_timeout and got a 504, not tried elsewhere (it read as sent),
// and streams moved on only after first_byte_timeout.
func TestPoolMovesOnFromAnUpstreamWhoseTLSHandshakeHangs(t *testing.T) {
	hang := newSilentUpstream(t)
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_after: 2\n  eject_for: 30s\n  probe_interval: 1m")
	h.setUpstreamOf(0, strings.Replace(hang.URL, "http://", "https://", 1),
		"connect_timeout: 300ms, first_byte_timeout: 8s, response_timeout: 8s")
	for i := range 4 {
		body := smallChat
		if i%2 == 1 {
			body = `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		}
		resp := h.post("/v1/chat/completions", body)
		if got := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, got)
		}
	}
	if hang.calls.Load() == 0 {
		t.Fatal("p0 was never tried")
	}
	st := h.statuses()
	if st["p0"].State != "ejected" || !strings.Contains(st["p0"].LastError, "TLS handshake with") ||
		!strings.Contains(st["p0"].LastError, "connect_timeout (300ms)") {
		t.Fatalf("p0, whose handshakes hang, is %+v", st["p0"])
	}
	if st["p1"].Calls != 4 {
		t.Fatalf("p1 answered %d calls, want all 4", st["p1"].Calls)
	}
}

// startFullBacklog listens with an accept queue of one, fills it and
// accepts nothing: a connect to it gets no SYN-ACK, as to a host whose
// packets are dropped. It returns its address.
func startFullBacklog(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Skip("this system completes connects past a full accept queue")
	}
	return addr
}

// A TCP connect that timed out (connect_timeout) is a connection not
// opened, for a non-streamed call too: it was taken for a wait for the
// answer, and the call got a 504 saying the answer was not finished
// within response_timeout, after connect_timeout, with no other member
// tried.
func TestPoolMovesOnFromAnUpstreamWhoseConnectTimesOut(t *testing.T) {
	addr := startFullBacklog(t)
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_after: 2\n  eject_for: 30s\n  probe_interval: 1m")
	h.setUpstreamOf(0, "http://"+addr+"/v1", "connect_timeout: 300ms, first_byte_timeout: 8s, response_timeout: 8s")
	for i := range 4 {
		resp := h.post("/v1/chat/completions", smallChat)
		if got := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, got)
		}
	}
	if st := h.statuses(); st["p0"].State != "ejected" || !strings.Contains(st["p0"].LastError, "i/o timeout") || st["p1"].Calls != 4 {
		t.Fatalf("p0, whose connects time out, is %+v; p1 answered %d calls, want 4", st["p0"], st["p1"].Calls)
	}
}

// resumeListener is a TLS listener that tells, for each connection whose
// handshake succeeded, whether it resumed a session.
type resumeListener struct {
	net.Listener
	resumed chan bool
}

func (l resumeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc := c.(*tls.Conn); tc.Handshake() == nil {
		select {
		case l.resumed <- tc.ConnectionState().DidResume:
		default:
		}
	}
	return c, nil
}

// startTLSProxytest serves a proxytest upstream over TLS with a
// certificate of a CA made for the test; it returns its base URL.
func startTLSProxytest(t *testing.T, cert *testutil.TLSCertificate) (string, chan bool) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := resumeListener{Listener: tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert.Cert}}), resumed: make(chan bool, 64)}
	up := proxytest.NewServerOn(rl, proxytest.Options{})
	t.Cleanup(up.Close)
	return "https://" + up.Addr + "/v1", rl.resumed
}

// An upstream's tls_ca names the CA its certificate chains to: without
// it a private CA's certificate fails the handshake (the x509 reason in
// last_error), with it calls are answered, and a reload that edits the
// upstream keeps resuming its TLS sessions.
func TestUpstreamTLSCATrustsAPrivateCA(t *testing.T) {
	cert := testutil.NewTLSCertificate(t)
	url, resumed := startTLSProxytest(t, cert)
	h := newPoolHarness(t, 1, "  retries: 0")
	h.setUpstreamOf(0, url, "first_byte_timeout: 2s")
	e := wantError(t, h.post("/v1/chat/completions", smallChat), 503, "upstream_unavailable")
	if msg := e["message"].(string); !strings.Contains(msg, "the TLS handshake failed") {
		t.Fatalf("an untrusted certificate: %q", msg)
	}
	if st := h.statuses()["p0"]; !strings.Contains(st.LastError, "x509") {
		t.Fatalf("p0's last_error %q lacks the x509 reason", st.LastError)
	}

	caFile := writeCAFile(t, cert)
	h.editUpstream("first_byte_timeout: 2s}", "first_byte_timeout: 2s, connect_timeout: 2s, tls_ca: "+caFile+"}",
		func(u config.Upstream) bool { return u.TLSCA == caFile })
	if resp := h.post("/v1/chat/completions", smallChat); resp.StatusCode != 200 {
		t.Fatalf("with tls_ca: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	if <-resumed {
		t.Fatal("the first trusted connection resumed a session")
	}
	h.editUpstream("connect_timeout: 2s", "connect_timeout: 3s", func(u config.Upstream) bool { return u.ConnectTimeout == 3*time.Second })
	if resp := h.post("/v1/chat/completions", smallChat); resp.StatusCode != 200 {
		t.Fatalf("after an edit: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	if !<-resumed {
		t.Fatal("after a reload that edited connect_timeout, the upstream's new connection did not resume its TLS session")
	}
}

// An https upstream goes through the egress proxy HTTPS_PROXY names, in
// a CONNECT tunnel with the proxy's credentials, TLS to the upstream
// inside it; the log says so once, naming the proxy without them. A
// proxy that refuses the tunnel is a connection not opened, which the
// client is told and last_error names. The gateway dialled every
// upstream itself: behind an egress proxy, each was "unreachable".
func TestUpstreamThroughAnEgressProxy(t *testing.T) {
	cert := testutil.NewTLSCertificate(t, "upstream.test")
	upURL, _ := startTLSProxytest(t, cert)
	egress := proxy.StartConnectProxy(t, "ops", "s3cret", map[string]string{
		"upstream.test:443": strings.TrimSuffix(strings.TrimPrefix(upURL, "https://"), "/v1"),
	})
	proxy.SetEgressProxy(t, egress.ProxyURL())
	var log testutil.Log
	h := newPoolHarnessWith(t, harnessOptions{logf: log.Logf}, 1, "  retries: 0")
	h.setUpstreamOf(0, "https://upstream.test/v1", "first_byte_timeout: 2s, connect_timeout: 2s, tls_ca: "+writeCAFile(t, cert))
	for _, body := range []string{smallChat, `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`} {
		resp := h.post("/v1/chat/completions", body)
		if got := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("through the proxy: %d %s", resp.StatusCode, got)
		}
	}
	if seen := egress.Seen(); len(seen) == 0 || seen[0] != "CONNECT upstream.test:443 authorized" {
		t.Fatalf("the proxy saw %q", seen)
	}
	said := "upstream p0 (https://upstream.test/v1) goes through the egress proxy http://" + egress.Addr()
	if got := log.Matching(said); len(got) != 1 {
		t.Fatalf("logged %q, want one line saying %q", got, said)
	}

	egress.AnswerWith(407)
	h.editUpstream("connect_timeout: 2s", "connect_timeout: 3s", func(u config.Upstream) bool { return u.ConnectTimeout == 3*time.Second })
	e := wantError(t, h.post("/v1/chat/completions", smallChat), 503, "upstream_unavailable")
	if msg := e["message"].(string); !strings.Contains(msg, "the egress proxy refused the tunnel (407 Proxy Authentication Required)") ||
		strings.Contains(msg, egress.Addr()) {
		t.Fatalf("a client is told %q", msg)
	}
	if st := h.statuses()["p0"]; !strings.Contains(st.LastError, "through egress proxy http://"+egress.Addr()+": it answered 407") || strings.Contains(st.LastError, "s3cret") {
		t.Fatalf("p0's last_error %q", st.LastError)
	}
	if got := log.Matching("s3cret"); len(got) != 0 {
		t.Fatalf("the log holds the proxy's password: %q", got)
	}
	if got := log.Matching("goes through the egress proxy"); len(got) != 1 {
		t.Fatalf("the edit logged the proxy again: %q", got)
	}
}
