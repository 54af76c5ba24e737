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

// An upstream that keeps the connection open after the event that ends
// its answer (a Responses stream's response.completed, a chat stream's
// [DONE]) held the client's body open until idle_timeout, and the SDKs,
// which read a stream to its end, hung after the last event. The stream
// now ends for the client within endGrace of it, complete and billed
// once.
func TestStreamEndsAfterItsLastEventThoughTheUpstreamStaysOpen(t *testing.T) {
	h := newHarness(t, harnessOptions{idleTimeout: "10s"})
	completed := "event: response.completed\n" +
		`data: {"type":"response.completed","sequence_number":3,"response":{"id":"resp_open","object":"response","created_at":1,"status":"completed","model":"proxytest-small","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[]}]}],"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}}` + "\n\n"
	responses := vllmPrelude + "event: response.output_text.delta\n" +
		`data: {"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello"}` + "\n\n" + completed
	chat := chatChunk("Hello", "stop") +
		`data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}` + "\n\n" +
		"data: [DONE]\n\n"
	last := h.up.URL
	for i, tc := range []struct{ path, body, events, end string }{
		{"/v1/responses", `{"model":"small","stream":true,"store":false,"input":"hi"}`, responses, completed},
		{"/v1/chat/completions", `{"model":"small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, chat, "data: [DONE]\n\n"},
	} {
		open := scriptedUpstream(t, 0, tc.events)
		h.writeConfig(strings.Replace(readFile(t, h.cfgPath), last, open, 1))
		last = open
		time.Sleep(200 * time.Millisecond) // the reload
		start := time.Now()
		resp := h.post(tc.path, tc.body)
		got := string(readAll(t, resp))
		took := time.Since(start)
		if resp.StatusCode != 200 || !strings.HasSuffix(got, tc.end) {
			t.Fatalf("%s: got %d %s", tc.path, resp.StatusCode, got)
		}
		if took > 3*time.Second {
			t.Errorf("%s: the body ended %s after the call, its last event at once: held open by the upstream's connection", tc.path, took.Round(time.Millisecond))
		}
		if evs := h.events(i + 1); evs[i].Status != 200 || evs[i].CompletionTokens != 1 {
			t.Fatalf("%s: billed %+v", tc.path, evs[i])
		}
	}
}
