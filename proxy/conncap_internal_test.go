package proxy

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// Client connections leave the process a reserve of descriptors: a few
// hundred idle connections under a low file limit took them all, and the
// embedded NATS server failed its writes until a restart.
func TestClientConnectionCapLeavesDescriptorsForTheRest(t *testing.T) {
	for _, c := range []struct {
		limit uint64
		known bool
		want  int
	}{
		{400, true, 150},     // reserve 100
		{1024, true, 384},    // reserve 256
		{65536, true, 30720}, // reserve 4096
		{1 << 20, true, fasthttp.DefaultConcurrency},
		{100, true, 18}, // reserve 64
		{90, true, 16},  // too low to keep a reserve: a few calls still
		{0, false, 0},   // unknown: fasthttp's default
	} {
		if got := clientConnectionCap(c.limit, c.known); got != c.want {
			t.Errorf("file limit %d: %d client connections, want %d", c.limit, got, c.want)
		}
	}
}
