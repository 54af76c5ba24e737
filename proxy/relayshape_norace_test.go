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
	// What counting the text takes on this machine, now: held back, the
	// event came that much after it was sent; sent at once, far less.
	// Timed here, the bound moves with the machine's load as the
	// gateway's count would (a fixed bound failed on a busy machine).
	began := time.Now()
	want := int64(tokens.Count(text))
	counting := time.Since(began)
	const stall = time.Second
	var sent atomic.Int64
	big := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		writeSSE(c, chatChunk("", ""), chatChunk(text, ""))
		sent.Store(time.Now().UnixNano())
		time.Sleep(stall)
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
		if late := arrived.Sub(time.Unix(0, sent.Load())); late > counting/2 {
			t.Errorf("the large event arrived %s after the upstream sent it; counting its text takes %s: held back while counted", late, counting)
		}
		if got := gjson.Get(strings.TrimPrefix(usage, "data: "), "usage.completion_tokens").Int(); got != want {
			t.Errorf("usage chunk %.200s: %d completion tokens, want the %d of the text", usage, got, want)
		}
		return nil
	})
}
