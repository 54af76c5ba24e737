package proxy_test

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// A stream the upstream reported no usage for is billed on the
// tokenizer's count, about a second a megabyte. The events that came
// with the terminal one waited for that count: the last words of an
// answer reached the client seconds after the upstream sent them. They
// now go out first; only the terminal event waits for the bill.
func TestStreamEventsBeforeTheTerminalOneDoNotWaitForTheCount(t *testing.T) {
	clientGotAll := make(chan struct{})
	waitedInVain := make(chan bool, 1)
	h := newHarness(t, harnessOptions{
		upstream: proxytest.Options{OmitUsage: true, OneWrite: true, Chunks: 5},
		recorded: func(*meter.Event) {
			select {
			case <-clientGotAll:
				waitedInVain <- false
			case <-time.After(5 * time.Second):
				waitedInVain <- true
			}
		},
	})
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	defer resp.Body.Close()
	sr := &streamReader{br: bufio.NewReader(resp.Body)}
	for {
		ev, err := sr.next()
		if err != nil {
			t.Fatalf("stream ended before its finish_reason: %v", err)
		}
		if strings.Contains(ev, `"finish_reason":"stop"`) {
			break
		}
	}
	close(clientGotAll)
	if rest, _ := io.ReadAll(sr.br); !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("after the finish chunk: %q", rest)
	}
	if <-waitedInVain {
		t.Fatal("the answer's last events reached the client only after its usage was counted and recorded")
	}
}
