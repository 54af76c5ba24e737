package proxy

import (
	"net"
	"testing"
	"time"

	"golang.org/x/net/http/httpproxy"
)

// UpstreamsRetired reports whether every upstream of w is retired, for
// the tests of package proxy_test.
func UpstreamsRetired(w *World) bool {
	for _, up := range w.upstreams {
		if !up.retired.Load() {
			return false
		}
	}
	return len(w.upstreams) > 0
}

// StartRawUpstream is startRawUpstream for the tests of package
// proxy_test; it returns the upstream's base URL.
func StartRawUpstream(t *testing.T, answer func(conn, req int, c net.Conn) bool) string {
	return "http://" + startRawUpstream(t, answer).ln.Addr().String() + "/v1"
}

// ServeConns is serveConns for the tests of package proxy_test.
func ServeConns(t *testing.T, handle func(c net.Conn)) (addr string) {
	t.Helper()
	return serveConns(t, handle)
}

// PromptEstimate is promptEstimate for the tests of package proxy_test.
func PromptEstimate(body []byte, limit int64) int64 { return promptEstimate(body, limit) }

// SetRequestReadTimeout sets how long servers made from now on wait for a
// request, until the test ends.
func SetRequestReadTimeout(t *testing.T, d time.Duration) {
	old := requestReadTimeout
	requestReadTimeout = d
	t.Cleanup(func() { requestReadTimeout = old })
}

// SetClientConnectionCap sets how many client connections servers made
// from now on serve at once, until the test ends.
func SetClientConnectionCap(t *testing.T, n int) {
	old := clientConnections
	clientConnections = func() int { return n }
	t.Cleanup(func() { clientConnections = old })
}

// ConnectProxy is connectProxy for the tests of package proxy_test.
type ConnectProxy = connectProxy

// StartConnectProxy is startConnectProxy for the tests of package
// proxy_test.
func StartConnectProxy(t *testing.T, user, password string, routes map[string]string) *ConnectProxy {
	return startConnectProxy(t, user, password, routes)
}

// SetEgressProxy makes upstreams built from now on, until the test ends,
// see httpsProxy as HTTPS_PROXY. Call it before the gateway starts.
func SetEgressProxy(t *testing.T, httpsProxy string) {
	setEgressEnvironment(t, httpproxy.Config{HTTPSProxy: httpsProxy})
}

// Addr is the proxy's host:port.
func (p *connectProxy) Addr() string { return p.ln.Addr().String() }
