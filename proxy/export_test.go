package proxy

import (
	"net"
	"testing"
	"time"
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
