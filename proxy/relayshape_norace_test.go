//go:build !race

package proxy_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/tokens"
)

// Not under the race detector: counting the 6 MiB of text before the
// terminal event takes it about 23 s there (3 s without), past the test
// client's timeout, and the stream then ended unread. make test runs it
// in its first pass.

// An event carrying more than 4 MiB of text, and no usage, was held back
// while the tokenizer counted its text (about 3 s per 4 MiB): 6 MiB the
// upstream sent at once reached the client seconds later. It goes out
// first now, and is counted after, while the upstream is quiet; the
// count, and the bill, are the same.
func TestLargeEventGoesOutBeforeItsTextIsCounted(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	text := randomBase64(6 << 20)
	const stall = time.Second
	var stallEnded atomic.Int64
	big := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		writeSSE(c, chatChunk("", ""), chatChunk(text, ""))
		time.Sleep(stall)
		stallEnded.Store(time.Now().UnixNano())
		writeChunk(c, chatChunk("", "stop")+"data: [DONE]\n\n")
		fmt.Fprint(c, "0\r\n\r\n")
		return true
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, big, 1))
	body := `{"model":"small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", body)
		defer resp.Body.Close()
		events := &streamReader{br: bufio.NewReaderSize(resp.Body, 1<<20)}
		var arrived time.Time
		var usage string
		for {
			ev, err := events.next()
			if err != nil {
				break
			}
			if strings.Contains(ev, text) {
				arrived = time.Now()
			}
			if strings.Contains(ev, `"usage"`) {
				usage = ev
			}
		}
		if arrived.IsZero() {
			return fmt.Errorf("the large event never came (not yet the new upstream?)")
		}
		if ended := time.Unix(0, stallEnded.Load()); !arrived.Before(ended) {
			t.Errorf("the large event arrived %s after the upstream's stall of %s ended: held back while counted", arrived.Sub(ended), stall)
		}
		if got, want := gjson.Get(strings.TrimPrefix(usage, "data: "), "usage.completion_tokens").Int(), int64(tokens.Count(text)); got != want {
			t.Errorf("usage chunk %.200s: %d completion tokens, want the %d of the text", usage, got, want)
		}
		return nil
	})
}
