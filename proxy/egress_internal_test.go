package proxy

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/testutil"
)

// connectProxy is an HTTP proxy that serves CONNECT alone, as a
// corporate egress proxy does for https: it wants its credentials when
// it has some (407 without them), and tunnels to the address routes maps
// the requested host:port to (502 for any other).
type connectProxy struct {
	ln             net.Listener
	user, password string
	routes         map[string]string
	// answer, when not 0, is the status every CONNECT gets in place of a
	// tunnel; -1: none, the proxy reads the request and says nothing.
	answer atomic.Int32
	mu     sync.Mutex
	seen   []string // each CONNECT's target, and " authorized" when its credentials were right
}

func startConnectProxy(t *testing.T, user, password string, routes map[string]string) *connectProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &connectProxy{ln: ln, user: user, password: password, routes: routes}
	var conns sync.WaitGroup
	t.Cleanup(func() { ln.Close(); conns.Wait() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				p.serve(c)
			}()
		}
	}()
	return p
}

func (p *connectProxy) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	authorized := p.user == "" ||
		req.Header.Get("Proxy-Authorization") == "Basic "+base64.StdEncoding.EncodeToString([]byte(p.user+":"+p.password))
	p.mu.Lock()
	seen := req.Method + " " + req.Host
	if authorized {
		seen += " authorized"
	}
	p.seen = append(p.seen, seen)
	p.mu.Unlock()
	status := int(p.answer.Load())
	switch {
	case status == -1:
		_, _ = io.Copy(io.Discard, br)
		return
	case status == 0 && !authorized:
		status = http.StatusProxyAuthRequired
	case status == 0 && p.routes[req.Host] == "":
		status = http.StatusBadGateway
	}
	if req.Method != http.MethodConnect {
		status = http.StatusMethodNotAllowed
	}
	if status != 0 {
		_, _ = io.WriteString(c, "HTTP/1.1 "+strconv.Itoa(status)+" "+http.StatusText(status)+
			"\r\nProxy-Authenticate: Basic realm=\"egress\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	up, err := net.Dial("tcp", p.routes[req.Host])
	if err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	go func() {
		_, _ = io.Copy(up, br)
		up.(*net.TCPConn).CloseWrite()
	}()
	_, _ = io.Copy(c, up)
}

// ProxyURL is the proxy's URL, with its credentials when it has some.
func (p *connectProxy) ProxyURL() string {
	u := &url.URL{Scheme: "http", Host: p.ln.Addr().String()}
	if p.user != "" {
		u.User = url.UserPassword(p.user, p.password)
	}
	return u.String()
}

// Seen is each CONNECT's target so far, " authorized" after those whose
// credentials were right.
func (p *connectProxy) Seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

// AnswerWith makes the proxy answer every CONNECT from now on with
// status (0: tunnel as configured; -1: say nothing).
func (p *connectProxy) AnswerWith(status int) { p.answer.Store(int32(status)) }

// setEgressEnvironment makes upstreams built from now on, until the test
// ends, see env as the proxy environment. Call it before the gateway
// starts: upstreams built meanwhile read it unlocked.
func setEgressEnvironment(t *testing.T, env httpproxy.Config) {
	old := egressEnvironment
	egressEnvironment = func() *httpproxy.Config { return &env }
	t.Cleanup(func() { egressEnvironment = old })
}

// An https upstream goes through HTTPS_PROXY unless NO_PROXY names it or
// it is on loopback, as net/http decides; the proxy's credentials go in
// Proxy-Authorization and nowhere else; a value that is not a proxy URL,
// or a proxy that is not http://, is refused when the upstream is built,
// without quoting the value.
func TestEgressForFollowsTheEnvironment(t *testing.T) {
	env := httpproxy.Config{HTTPSProxy: "http://ops:p%40ss@proxy.example:3128", HTTPProxy: "proxy.example:3129", NoProxy: "internal.example"}
	for _, tc := range []struct {
		env                  httpproxy.Config
		target               string
		addr, name, bypassed string
		err                  string
	}{
		{env: env, target: "https://api.openai.com/v1", addr: "proxy.example:3128", name: "http://proxy.example:3128"},
		{env: env, target: "https://llm.internal.example/v1"},
		{env: env, target: "https://127.0.0.1:8443/v1"},
		{env: env, target: "https://localhost/v1"},
		{env: env, target: "http://gpu-7.example:8000/v1", bypassed: "http://proxy.example:3129"},
		{env: env, target: "http://127.0.0.1:8000/v1"},
		{env: httpproxy.Config{HTTPSProxy: "proxy.example:3128"}, target: "https://api.groq.com/openai/v1", addr: "proxy.example:3128", name: "http://proxy.example:3128"},
		{env: httpproxy.Config{HTTPSProxy: "http://proxy.example"}, target: "https://openrouter.ai/api/v1", addr: "proxy.example:80", name: "http://proxy.example"},
		{env: httpproxy.Config{HTTPSProxy: "socks5://ops:s3cret@proxy.example:1080"}, target: "https://api.openai.com/v1", err: "only http:// proxies"},
		{env: httpproxy.Config{HTTPSProxy: "http://ops:s3cret@[proxy.example"}, target: "https://api.openai.com/v1", err: "is not a proxy URL"},
	} {
		target, _ := url.Parse(tc.target)
		addr := target.Host
		if target.Port() == "" {
			addr += ":443"
		}
		eg, bypassed, err := egressFor(&tc.env, target, addr)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%s with %q: %v, want an error saying %q without the password", tc.target, tc.env.HTTPSProxy, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.target, err)
		}
		if bypassed != tc.bypassed {
			t.Errorf("%s: bypassed %q, want %q", tc.target, bypassed, tc.bypassed)
		}
		if tc.addr == "" {
			if eg != nil {
				t.Errorf("%s goes through %s, want directly", tc.target, eg.name)
			}
			continue
		}
		if eg == nil || eg.addr != tc.addr || eg.name != tc.name {
			t.Errorf("%s: egress %+v, want %s named %s", tc.target, eg, tc.addr, tc.name)
			continue
		}
		connect := string(eg.request)
		if !strings.HasPrefix(connect, "CONNECT "+addr+" HTTP/1.1\r\nHost: "+addr+"\r\n") || !strings.HasSuffix(connect, "\r\n\r\n") {
			t.Errorf("%s: CONNECT request %q", tc.target, connect)
		}
		wantAuth := tc.env.HTTPSProxy == env.HTTPSProxy
		if got := strings.Contains(connect, "Proxy-Authorization: Basic "+base64.StdEncoding.EncodeToString([]byte("ops:p@ss"))+"\r\n"); got != wantAuth {
			t.Errorf("%s: CONNECT request %q, want its credentials %v", tc.target, connect, wantAuth)
		}
	}
}

// testProxiedUpstream is an https upstream at base_url dialled through
// the egress proxy p, trusting cert's CA.
func testProxiedUpstream(t *testing.T, p *connectProxy, baseURL string, cert *testutil.TLSCertificate) *upstream {
	t.Helper()
	setEgressEnvironment(t, httpproxy.Config{HTTPSProxy: p.ProxyURL()})
	u, _ := url.Parse(baseURL)
	up := testHTTPSUpstream(t, u.Host, 300*time.Millisecond)
	if cert != nil {
		up.tlsConfig.RootCAs = cert.Pool
	}
	if up.egress == nil {
		t.Fatalf("%s does not go through the proxy", baseURL)
	}
	return up
}

// A connection to an https upstream goes through the proxy's CONNECT
// tunnel, with TLS to the upstream inside it under the upstream's name:
// its certificate is checked for that name, not the proxy's.
func TestEgressTunnelCarriesTLSToTheUpstream(t *testing.T) {
	cert := testutil.NewTLSCertificate(t, "upstream.test")
	addr, resumed := startTLSUpstream(t, cert)
	p := startConnectProxy(t, "ops", "p@ss:word", map[string]string{"upstream.test:443": addr})
	up := testProxiedUpstream(t, p, "https://upstream.test", cert)
	callOnce(t, up)
	<-resumed
	callOnce(t, up)
	if !<-resumed {
		t.Error("the second connection through the proxy did not resume the first one's TLS session")
	}
	if seen := p.Seen(); len(seen) != 2 || seen[0] != "CONNECT upstream.test:443 authorized" {
		t.Fatalf("the proxy saw %q", seen)
	}
}

// A proxy that refuses the tunnel, never answers, or cannot be reached is
// a connection not opened, within connect_timeout, named for operators
// (without its credentials) and worded for clients without its address.
func TestEgressProxyFailuresAreConnectFailures(t *testing.T) {
	p := startConnectProxy(t, "ops", "s3cret", map[string]string{})
	up := testProxiedUpstream(t, p, "https://upstream.test", nil)
	for _, tc := range []struct {
		answer         int
		client, logged string
	}{
		{407, "the egress proxy refused the tunnel (407 Proxy Authentication Required)", "it answered 407 Proxy Authentication Required"},
		{403, "the egress proxy refused the tunnel (403 Forbidden)", "it answered 403 Forbidden"},
		{0, "the egress proxy refused the tunnel (502 Bad Gateway)", "it answered 502 Bad Gateway"},
		{-1, "the egress proxy did not answer in time", "no answer within connect_timeout (300ms)"},
	} {
		p.AnswerWith(tc.answer)
		done := make(chan error, 1)
		go func() {
			_, err := up.pool.roundTrip(testRequest, 10*time.Second, nil, false)
			done <- err
		}()
		var err error
		select {
		case err = <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("answer %d: the tunnel was not bounded by connect_timeout (300ms)", tc.answer)
		}
		if err == nil || !connectFailed(err) || sentUpstream(err) {
			t.Fatalf("answer %d: %v, want a connection not opened", tc.answer, err)
		}
		if got := reasonForClient(err); got != tc.client || strings.Contains(got, "127.0.0.1") {
			t.Errorf("answer %d: a client is told %q, want %q", tc.answer, got, tc.client)
		}
		want := "CONNECT upstream.test:443 through egress proxy http://" + p.ln.Addr().String() + ": " + tc.logged
		if got := err.Error(); got != want || strings.Contains(got, "s3cret") {
			t.Errorf("answer %d: operators read %q, want %q", tc.answer, got, want)
		}
	}
	p.ln.Close()
	_, err := up.pool.roundTrip(testRequest, 10*time.Second, nil, false)
	if got := reasonForClient(err); !connectFailed(err) || got != "the egress proxy is unreachable: connection refused" {
		t.Errorf("a proxy that is gone: %v, told %q", err, got)
	}
}

// The log says how an upstream is dialled when that is new: an http
// upstream HTTP_PROXY would cover is dialled directly, said once.
func TestEgressIsLoggedOnce(t *testing.T) {
	setEgressEnvironment(t, httpproxy.Config{HTTPProxy: "http://ops:s3cret@proxy.example:3129"})
	var lines []string
	build := func() *upstream {
		up, err := newUpstream(config.Upstream{Name: "gpu", BaseURL: "http://gpu-7.example:8000/v1"}, func(f string, a ...any) {
			lines = append(lines, fmt.Sprintf(f, a...))
		})
		if err != nil {
			t.Fatal(err)
		}
		return up
	}
	first := build()
	first.logEgress(nil)
	build().logEgress(first) // an edit
	want := "upstream gpu (http://gpu-7.example:8000/v1) is dialled directly, not through HTTP_PROXY (http://proxy.example:3129): only https upstreams go through a proxy"
	if len(lines) != 1 || lines[0] != want {
		t.Fatalf("logged %q, want once %q", lines, want)
	}
}
