//go:build !race

package proxy

import (
	"context"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/catalog"
)

func TestRewriteAllocatesNothing(t *testing.T) {
	for _, body := range [][]byte{
		[]byte(`{"model":"small","stream":true,"messages":[{"role":"user","content":"hello"}]}`),
		[]byte(`{"model":"small","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"hello"}]}`),
	} {
		dst := make([]byte, 0, 4096)
		n := testing.AllocsPerRun(200, func() {
			f, _ := scanRequest(body)
			dst, _ = rewriteRequest(dst[:0], body, &f, `"Qwen/Qwen2.5-14B-Instruct-1M"`, true)
		})
		if n != 0 {
			t.Fatalf("%v allocations per rewrite of %s", n, body)
		}
	}
}

func TestSSEReaderAllocatesNothingPerEvent(t *testing.T) {
	src := strings.NewReader(streamBody)
	rd := newSSEReader(src, 4096, 0)
	for { // warm the buffers
		if _, err := rd.Next(); err != nil {
			break
		}
	}
	n := testing.AllocsPerRun(100, func() {
		src.Reset(streamBody)
		rd.reset(src)
		for {
			if _, err := rd.Next(); err != nil {
				break
			}
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per 22-event stream", n)
	}
}

// TestResponsesRelayAllocatesNothingPerEvent: remembering the response id
// and its output item's costs one copy of each per stream, whatever its
// length; the events themselves allocate nothing.
func TestResponsesRelayAllocatesNothingPerEvent(t *testing.T) {
	stream := func(deltas int) string {
		s := `event: response.created` + "\n" + `data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_0123456789abcdef","object":"response","status":"in_progress","usage":null}}` + "\n\n"
		s += strings.Repeat(`event: response.output_text.delta`+"\n"+`data: {"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":" tok","logprobs":[]}`+"\n\n", deltas)
		return s + `event: response.completed` + "\n" + `data: {"type":"response.completed","sequence_number":2,"response":{"id":"resp_0123456789abcdef","object":"response","status":"completed","output":[{"id":"msg_1","type":"message","status":"completed","content":[{"type":"output_text","text":" tok"}],"role":"assistant"}],"usage":{"input_tokens":10,"output_tokens":20,"total_tokens":30}}}` + "\n\n"
	}
	s := &Server{responses: newResponseStore(nil, 0, nil)}
	up := &upstream{}
	up.cfg.Name = "gpu-a"
	c := &generationCall{server: s, ep: endpointResponses, upstream: up, key: &accounts.Key{Account: "acme"}, entry: &catalog.Entry{ID: "small"}}
	allocs := func(body string) float64 {
		src := strings.NewReader(body)
		rd := newSSEReader(src, 4096, 0)
		run := func() {
			src.Reset(body)
			rd.reset(src)
			c.haveUsage, c.finished, c.text, c.remember = false, false, c.text[:0], true
			inspectAll(c, rd)
		}
		run() // warm the buffers
		return testing.AllocsPerRun(100, run)
	}
	short, long := allocs(stream(20)), allocs(stream(400))
	if short > 2 || long > short {
		t.Fatalf("%v allocations per 20-delta stream, %v per 400-delta stream; want at most 2 for both", short, long)
	}
	if m, ok, _ := s.responses.lookup(context.Background(), "resp_0123456789abcdef"); !ok || m.Upstream != "gpu-a" || m.Account != "acme" {
		t.Fatalf("the id was not remembered: %+v", m)
	}
	if m, ok, _ := s.responses.lookupItem(context.Background(), "msg_1"); !ok || m.Upstream != "gpu-a" || m.Account != "acme" {
		t.Fatalf("the output item was not remembered: %+v", m)
	}
}

// TestResponsesEstimateAllocatesNothingPerEvent: a stream without usage
// keeps the text it forwards, tool names, custom tools' input, MCP calls
// and reasoning summaries included, in buffers it reuses; an event name
// longer than 32 bytes (response.function_call_arguments.delta) was
// copied on every event.
func TestResponsesEstimateAllocatesNothingPerEvent(t *testing.T) {
	src := strings.NewReader(responsesToolStream)
	rd := newSSEReader(src, 4096, 0)
	c := &generationCall{ep: endpointResponses}
	run := func() {
		src.Reset(responsesToolStream)
		rd.reset(src)
		c.haveUsage, c.finished, c.text, c.textTokens, c.toolOutput, c.items = false, false, c.text[:0], 0, c.toolOutput[:0], [outputItemSlots]outputItem{}
		inspectAll(c, rd)
	}
	run() // warm the buffers
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("%v allocations per stream of 34 events", n)
	}
	want := strings.Repeat(" think", 10) + "get_weather" + strings.Repeat("city", 10) + "apply_patch" + strings.Repeat("+line", 10) + "search_codeusage"
	if got := string(c.text); got != want {
		t.Fatalf("kept %q, want %q", got, want)
	}
	if got := string(c.toolOutput); got != "found" {
		t.Fatalf("kept %q of the tools' output, want the MCP call's", got)
	}
}

// An account's limits beside the key's cost a generation call no
// allocation of their own: one admission holds both parts, and callers
// are named without joining strings. (The rest are the x-ratelimit-*
// headers' values.)
func TestAccountLimitsAllocateNothingMore(t *testing.T) {
	l := newLimiter()
	key := &accounts.Key{ID: "key_1", Account: "acme", RPM: 1 << 40, TPM: 1 << 40}
	ctx := limitCtx("127.0.0.1")
	live := new(accounts.Live)
	run := func(key *accounts.Key, acct accounts.Limits) float64 {
		return testing.AllocsPerRun(200, func() {
			a := l.generationAdmission(key, acct, live, true)
			if err := a.admit(ctx, 100); err != nil {
				t.Fatal(err)
			}
			a.charge(120)
			a.done()
		})
	}
	keyOnly := run(key, accounts.Limits{})
	both := run(key, accounts.Limits{RPM: 1 << 40, TPM: 1 << 40, MaxConcurrent: 1 << 20})
	if both != keyOnly {
		t.Errorf("%v allocations a call with the key's limits and the account's, %v with the key's alone", both, keyOnly)
	}
	// Nor do the account's calls in flight, counted for every call: the
	// admission is a value the call keeps, and Live is the account's.
	unlimited := &accounts.Key{ID: "key_2", Account: "acme"}
	if n := run(unlimited, accounts.Limits{MaxConcurrent: 4}); n != 0 {
		t.Errorf("%v allocations a call under max_concurrent alone (no headers to write), want 0", n)
	}
	if n := run(unlimited, accounts.Limits{}); n != 0 {
		t.Errorf("%v allocations a call without limits, want 0", n)
	}
}

// TestChatRelayAllocatesNothingPerChunk: a chat stream's chunks cost no
// allocation, whether its usage comes last (OpenAI), in every chunk
// (vLLM's continuous usage stats) or first, with the output after it
// kept for the estimate, and whether the usage is stripped or relayed.
// Usage in every chunk keeps no text: each report counts its chunk's.
func TestChatRelayAllocatesNothingPerChunk(t *testing.T) {
	chunk := func(content, usage string) string {
		return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` +
			content + `"},"finish_reason":null}],"usage":` + usage + "}\n\n"
	}
	const report = `{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}`
	for _, tc := range []struct {
		name, body string
		keeps      bool // text after the last report
	}{
		{"usage last", streamBody, false},
		{"usage in every chunk", strings.Repeat(chunk(" tok", report), 20) + "data: [DONE]\n\n", false},
		{"usage first", chunk("", report) + strings.Repeat(chunk(" tok", "null"), 20) + "data: [DONE]\n\n", true},
	} {
		for _, injected := range []bool{false, true} {
			src := strings.NewReader(tc.body)
			rd := newSSEReader(src, 4096, 0)
			c := &generationCall{injected: injected, ep: endpointChat}
			run := func() {
				src.Reset(tc.body)
				rd.reset(src)
				c.haveUsage, c.finished, c.text, c.textTokens, c.rawChunks = false, false, c.text[:0], 0, c.rawChunks[:0]
				for {
					ev, err := rd.Next()
					if err != nil {
						break
					}
					c.inspectChat(&ev)
				}
			}
			run() // warm the buffers
			if n := testing.AllocsPerRun(100, run); n != 0 {
				t.Errorf("%s (injected %v): %v allocations per stream", tc.name, injected, n)
			}
			if kept := len(c.text)+len(c.rawChunks) > 0; !c.haveUsage || kept != tc.keeps {
				t.Errorf("%s (injected %v): usage %v, text after it kept: %v, want %v", tc.name, injected, c.haveUsage, kept, tc.keeps)
			}
		}
	}
}

// TestBilledUsageAllocatesNothing: the usage a stream's client asked for
// and its upstream did not send, which the gateway writes at the end
// (appendTerminal), goes into buffers the call reuses: a chat stream's
// usage chunk, a responses stream's terminal event with its usage set.
func TestBilledUsageAllocatesNothing(t *testing.T) {
	const delta = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}` + "\n\n"
	chat := strings.Repeat(delta, 20) + `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n" +
		"data: [DONE]\n\n"
	responses := `event: response.created` + "\n" + `data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","usage":null}}` + "\n\n" +
		strings.Repeat(`event: response.output_text.delta`+"\n"+`data: {"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":" tok"}`+"\n\n", 20) +
		`event: response.completed` + "\n" + `data: {"type":"response.completed","sequence_number":2,"response":{"id":"resp_1","object":"response","status":"completed","usage":null}}` + "\n\n"
	for _, tc := range []struct {
		name, body, want string
		ep               endpoint
	}{
		{"chat", chat, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":20,"total_tokens":27,` +
			`"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}` + "\n\ndata: [DONE]\n\n", endpointChat},
		{"responses", responses, `event: response.completed` + "\n" + `data: {"type":"response.completed","sequence_number":2,"response":{"id":"resp_1","object":"response","status":"completed",` +
			`"usage":{"input_tokens":7,"input_tokens_details":{"cached_tokens":0},"output_tokens":20,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":27}}}` + "\n\n", endpointResponses},
	} {
		src := strings.NewReader(tc.body)
		rd := newSSEReader(src, 4096, 0)
		c := &generationCall{ep: tc.ep, stream: true, billed: catalog.Usage{PromptTokens: 7, CompletionTokens: 20}}
		var out []byte
		run := func() {
			src.Reset(tc.body)
			rd.reset(src)
			c.finished, c.usageShown, c.text, c.rawChunks = false, false, c.text[:0], c.rawChunks[:0]
			for {
				ev, err := rd.Next()
				if err != nil {
					return
				}
				if tc.ep == endpointChat {
					c.inspectChat(&ev)
				} else {
					c.inspectResponses(&ev)
				}
				if c.finished && c.terminal(&ev) {
					c.terminalEvent = ev
					out = c.appendTerminal(out[:0], ev.Raw)
				}
			}
		}
		run() // warm the buffers
		if n := testing.AllocsPerRun(100, run); n != 0 {
			t.Errorf("%s: %v allocations per stream", tc.name, n)
		}
		if string(out) != tc.want {
			t.Errorf("%s: ended with\n%s\nwant\n%s", tc.name, out, tc.want)
		}
	}
}
