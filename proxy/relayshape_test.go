package proxy_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy"
)

// endingUpstream answers every request with a chunked SSE stream of
// events that then ends cleanly (the terminating chunk), keeping the
// connection for the next request. It returns its base URL.
func endingUpstream(t *testing.T, events ...string) string {
	t.Helper()
	return proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		writeSSE(c, events...)
		fmt.Fprint(c, "0\r\n\r\n")
		return true
	})
}

func choiceChunk(index int, delta, finish string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return fmt.Sprintf(`data: {"id":"chatcmpl-n","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":%d,"delta":%s,"finish_reason":%s}]}`+"\n\n",
		index, delta, fr)
}

// A stream of two choices that ends, without [DONE], after one of them
// finished: the other is cut. The client got its half with no
// stream_interrupted event, and, when it asked for usage, the gateway's
// usage chunk after it, as if the answer were whole. It holds with or
// without n in the request (an upstream may be set to answer several
// choices), and for a choice cut in the middle of a tool call's arguments.
func TestStreamEndedWithAChoiceUnfinishedIsInterrupted(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	text := []string{choiceChunk(0, `{"role":"assistant","content":""}`, ""), choiceChunk(1, `{"role":"assistant","content":""}`, ""),
		choiceChunk(1, `{"content":"Short."}`, ""), choiceChunk(1, `{"content":""}`, "stop")}
	for range 8 {
		text = append(text, choiceChunk(0, `{"content":" longer"}`, ""))
	}
	tools := []string{choiceChunk(0, `{"role":"assistant","content":""}`, ""), choiceChunk(1, `{"role":"assistant","content":""}`, ""),
		choiceChunk(0, `{"content":"Done."}`, ""), choiceChunk(0, `{}`, "stop"),
		choiceChunk(1, `{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}`, ""),
		choiceChunk(1, `{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Par"}}]}`, "")}
	url := h.up.URL
	for _, tc := range []struct {
		name   string
		events []string
		n      string
	}{
		{"text, n=2", text, `"n":2,`},
		{"text, no n", text, ""},
		{"tool call, n=2", tools, `"n":2,`},
		{"tool call, no n", tools, ""},
	} {
		cut := endingUpstream(t, tc.events...)
		h.writeConfig(strings.Replace(readFile(t, h.cfgPath), url, cut, 1))
		url = cut
		for _, usage := range []string{"", `"stream_options":{"include_usage":true},`} {
			body := `{"model":"small","stream":true,` + tc.n + usage + `"messages":[{"role":"user","content":"hi"}]}`
			checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
				got := string(readAll(t, h.post("/v1/chat/completions", body)))
				if !strings.Contains(got, "longer") && !strings.Contains(got, "Par") {
					return fmt.Errorf("not yet the new upstream: %s", got)
				}
				if !strings.Contains(got, `"code":"stream_interrupted"`) || strings.Contains(got, `"usage"`) {
					t.Errorf("%s %s: got %s, want the stream_interrupted event and no usage chunk", tc.name, usage, got)
				}
				return nil
			})
		}
	}
}
