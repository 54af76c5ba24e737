package proxy_test

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/tokens"
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

// randomBase64 is n bytes of base64 text of random bytes, which the
// tokenizer counts slowest: about 4 s for 6 MiB on a test machine.
func randomBase64(n int) string {
	b := make([]byte, n*3/4+3)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return base64.StdEncoding.EncodeToString(b)[:n]
}

// vLLM writes `data:{…}`, without the space, in some versions. A chunk the
// gateway stripped of the usage the client did not ask for came out as
// `data: {…}`, and every line of an event whose data spans several as
// `data: …`: the upstream's own prefix stays now.
func TestStrippedChunkKeepsTheUpstreamsDataPrefix(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	const usage = `"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}`
	events := []string{
		`data:{"id":"chatcmpl-v","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}],` + usage + "}\n\n",
		"data:{\"id\":\"chatcmpl-v\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\ndata:\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"finish_reason\":null}],\ndata:" +
			usage + "}\n\n",
		`data:{"id":"chatcmpl-v","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],` + usage + "}\n\n",
		"data:[DONE]\n\n",
	}
	up := endingUpstream(t, events...)
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, up, 1))
	want := `data:{"id":"chatcmpl-v","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}` + "\n\n" +
		"data:{\"id\":\"chatcmpl-v\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\ndata:\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"finish_reason\":null}]}\n\n" +
		`data:{"id":"chatcmpl-v","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n" +
		"data:[DONE]\n\n"
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		got := string(readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`)))
		if !strings.Contains(got, "chatcmpl-v") {
			return fmt.Errorf("not yet the new upstream: %s", got)
		}
		if got != want {
			t.Errorf("got\n%s\nwant\n%s", got, want)
		}
		return nil
	})
}

// Reasoning streamed without usage (a chat stream's reasoning_content, a
// response's reasoning summary) was counted into the estimate's
// completion, and its reasoning tokens reported as 0: in the client's
// usage and in the usage event. They are the reasoning text's tokens
// now, part of the completion, which is billed as before.
func TestEstimatedUsageCountsReasoningTokens(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	reasoning := strings.Repeat(" Let me think about the weather in Paris.", 20)
	answer := strings.Repeat(" It is sunny.", 10)
	reasoningChunk := func(s string) string {
		return `data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"` + s + `"},"finish_reason":null}]}` + "\n\n"
	}
	chat := endingUpstream(t, reasoningChunk(reasoning[:len(reasoning)/2]), reasoningChunk(reasoning[len(reasoning)/2:]),
		chatChunk(answer, ""), chatChunk("", "stop"), "data: [DONE]\n\n")
	event := func(typ string, seq int, data string) string {
		return fmt.Sprintf("event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,%s}\n\n", typ, typ, seq, data)
	}
	responses := endingUpstream(t,
		event("response.created", 0, `"response":{"id":"resp_r","object":"response","status":"in_progress","output":[]}`),
		event("response.output_item.added", 1, `"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}`),
		event("response.reasoning_summary_text.delta", 2, `"item_id":"rs_1","output_index":0,"summary_index":0,"delta":"`+reasoning+`"`),
		event("response.output_item.added", 3, `"output_index":1,"item":{"id":"msg_1","type":"message","role":"assistant","content":[]}`),
		event("response.output_text.delta", 4, `"item_id":"msg_1","output_index":1,"content_index":0,"delta":"`+answer+`"`),
		event("response.completed", 5, `"response":{"id":"resp_r","object":"response","status":"completed","output":[]}`))
	wantReasoning, wantCompletion := int64(tokens.Count(reasoning)), int64(tokens.Count(reasoning+answer))
	url := h.up.URL
	for i, tc := range []struct {
		upstream, path, request, usage, completion, reasoning string
	}{
		{chat, "/v1/chat/completions", `{"model":"small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
			"usage", "completion_tokens", "completion_tokens_details.reasoning_tokens"},
		{responses, "/v1/responses", `{"model":"small","stream":true,"store":false,"input":"hi"}`,
			"response.usage", "output_tokens", "output_tokens_details.reasoning_tokens"},
	} {
		h.writeConfig(strings.Replace(readFile(t, h.cfgPath), url, tc.upstream, 1))
		url = tc.upstream
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
			got := string(readAll(t, h.post(tc.path, tc.request)))
			if !strings.Contains(got, "sunny") {
				return fmt.Errorf("not yet the new upstream: %s", got)
			}
			events := sseEvents([]byte(got))
			var usage gjson.Result
			for _, ev := range events {
				_, data, _ := strings.Cut(ev, "data: ")
				if u := gjson.Get(data, tc.usage); u.IsObject() {
					usage = u
				}
			}
			if usage.Get(tc.completion).Int() != wantCompletion || usage.Get(tc.reasoning).Int() != wantReasoning {
				t.Errorf("%s: usage %s; want %d completion tokens, %d of them reasoning", tc.path, usage.Raw, wantCompletion, wantReasoning)
			}
			return nil
		})
		evs := h.events(i + 1)
		if ev := evs[i]; ev.CompletionTokens != wantCompletion || ev.ReasoningTokens != wantReasoning {
			t.Errorf("%s: event %+v; want %d completion tokens, %d of them reasoning", tc.path, ev, wantCompletion, wantReasoning)
		}
	}
}

// An upstream whose events end in CRLF got the gateway's own events (the
// usage chunk of a client that asked for usage, the error event of a cut
// stream) ending in LF among them. They end as the upstream's do now.
func TestAddedEventsEndAsTheUpstreamsDo(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	crlf := func(ev string) string { return strings.ReplaceAll(ev, "\n", "\r\n") }
	chatRequest := `{"model":"small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	url := h.up.URL
	for _, tc := range []struct {
		name, path, request string
		events              []string
		added               string // the start of the gateway's event
	}{
		{"usage chunk", "/v1/chat/completions", chatRequest,
			[]string{crlf(chatChunk("Hello", "")), crlf(chatChunk("", "stop")), "data: [DONE]\r\n\r\n"}, `data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage"`},
		{"chat error event", "/v1/chat/completions", chatRequest,
			[]string{crlf(chatChunk("Hello", ""))}, `data: {"error"`},
		{"responses error event", "/v1/responses", `{"model":"small","stream":true,"store":false,"input":"hi"}`,
			[]string{"event: response.created\r\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_c\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\r\n\r\n",
				"event: response.output_text.delta\r\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"output_index\":0,\"content_index\":0,\"delta\":\"Hello\"}\r\n\r\n"},
			"event: error"},
	} {
		up := endingUpstream(t, tc.events...)
		h.writeConfig(strings.Replace(readFile(t, h.cfgPath), url, up, 1))
		url = up
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
			got := string(readAll(t, h.post(tc.path, tc.request)))
			if !strings.Contains(got, "Hello") || !strings.Contains(got, "\r\n") {
				return fmt.Errorf("not yet the new upstream: %q", got)
			}
			i := strings.Index(got, tc.added)
			if i < 0 {
				t.Fatalf("%s: no event of the gateway's in %q", tc.name, got)
			}
			added := got[i:]
			if end := strings.Index(added, "\n\n"); end >= 0 || !strings.Contains(added, "}\r\n\r\n") {
				t.Errorf("%s: the gateway's event %q does not end as the upstream's do (CRLF)", tc.name, added)
			}
			return nil
		})
	}
}
