package proxy_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
	"github.com/tollgate/tollgate/tokens"
)

const chatBody = `{"model":"small","messages":[{"role":"user","content":"Say hello"}]}`

func TestChatNonStreamPassesThroughAndMeters(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{PromptTokens: 1234, CompletionTokens: 567, CachedTokens: 200, ReasoningTokens: 0}})
	resp := h.post("/v1/chat/completions", chatBody)
	body := readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	want := h.direct("/v1/chat/completions", `{"model":"proxytest-small","messages":[{"role":"user","content":"Say hello"}]}`)
	if normalize(string(body)) != normalize(string(want)) {
		t.Fatalf("body differs from the upstream's:\n got %s\nwant %s", body, want)
	}
	reqs := h.up.Requests()
	if got := string(reqs[0].Body); got != `{"model":"proxytest-small","messages":[{"role":"user","content":"Say hello"}]}` {
		t.Fatalf("upstream got %s: only the model may change", got)
	}
	ev := h.events(1)[0]
	if ev.ID != resp.Header.Get("x-request-id") || ev.ID == "" {
		t.Fatalf("event id %q, x-request-id %q", ev.ID, resp.Header.Get("x-request-id"))
	}
	// (1234-200)*0.0000001 + 200*0.00000005 + 567*0.0000003 = 0.0001034+0.00001+0.0001701 = 0.0002835 USD
	if ev.PromptTokens != 1234 || ev.CachedTokens != 200 || ev.CompletionTokens != 567 || ev.CostNanos != 283500 {
		t.Fatalf("event %+v", ev)
	}
	if ev.UsageSource != meter.SourceUpstream || ev.Model != "small" || ev.Upstream != "local" || ev.Stream || ev.Account != "acme" || ev.Status != 200 {
		t.Fatalf("event %+v", ev)
	}
}

func TestChatStreamWithoutUsageLooksLikeUpstream(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 5, PromptTokens: 7, CompletionTokens: 5}})
	for _, variant := range []struct {
		name string
		body string
	}{
		{"absent", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"false", `{"model":"small","stream":true,"stream_options":{"include_usage":false},"messages":[]}`},
		{"null", `{"model":"small","stream":true,"stream_options":null,"messages":[]}`},
		{"empty", `{"model":"small","stream":true,"stream_options":{},"messages":[]}`},
	} {
		t.Run(variant.name, func(t *testing.T) {
			h.up.Reset()
			resp := h.post("/v1/chat/completions", variant.body)
			got := readAll(t, resp)
			if resp.Header.Get("Content-Type") != "text/event-stream" && !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("content type %q", resp.Header.Get("Content-Type"))
			}
			if !gjson.GetBytes(h.up.Requests()[0].Body, "stream_options.include_usage").Bool() {
				t.Fatalf("gateway did not ask upstream for usage: %s", h.up.Requests()[0].Body)
			}
			want := h.direct("/v1/chat/completions", strings.Replace(variant.body, `"small"`, `"proxytest-small"`, 1))
			if normalize(string(got)) != normalize(string(want)) {
				t.Fatalf("client stream differs from what upstream sends without include_usage:\n got %s\nwant %s", got, want)
			}
			if strings.Contains(string(got), "usage") {
				t.Fatalf("client saw usage it did not ask for: %s", got)
			}
		})
	}
	evs := h.events(4)
	for _, ev := range evs {
		if ev.PromptTokens != 7 || ev.CompletionTokens != 5 || ev.UsageSource != meter.SourceUpstream || !ev.Stream || ev.TTFB <= 0 {
			t.Fatalf("event %+v", ev)
		}
	}
}

func TestChatStreamUsageAskedIsRelayedUnchanged(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 4, PromptTokens: 9, CompletionTokens: 4}})
	body := `{"model":"small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	got := readAll(t, h.post("/v1/chat/completions", body))
	want := h.direct("/v1/chat/completions", strings.Replace(body, `"small"`, `"proxytest-small"`, 1))
	if normalize(string(got)) != normalize(string(want)) {
		t.Fatalf("stream differs:\n got %s\nwant %s", got, want)
	}
	if !strings.Contains(string(got), `"prompt_tokens":9`) {
		t.Fatalf("usage chunk missing: %s", got)
	}
	if ev := h.events(1)[0]; ev.PromptTokens != 9 || ev.CompletionTokens != 4 {
		t.Fatalf("event %+v", ev)
	}
}

// vLLM puts usage on the finish_reason chunk rather than a chunk of its
// own: the gateway must strip it there and keep the chunk's content.
func TestChatStreamVLLMStyleUsageIsStripped(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 3, UsageOnLastContentChunk: true, PromptTokens: 3, CompletionTokens: 3}})
	body := `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	got := readAll(t, h.post("/v1/chat/completions", body))
	want := h.direct("/v1/chat/completions", strings.Replace(body, `"small"`, `"proxytest-small"`, 1))
	if normalize(string(got)) != normalize(string(want)) {
		t.Fatalf("stream differs:\n got %s\nwant %s", got, want)
	}
	if strings.Contains(string(got), "usage") || !strings.Contains(string(got), `"finish_reason":"stop"`) {
		t.Fatalf("got %s", got)
	}
	if ev := h.events(1)[0]; ev.PromptTokens != 3 || ev.UsageSource != meter.SourceUpstream {
		t.Fatalf("event %+v", ev)
	}
}

func TestResponsesStreamAndNot(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 6, PromptTokens: 100, CompletionTokens: 50, ReasoningTokens: 20, CachedTokens: 40}})
	body := `{"model":"large","input":"Tell me a story"}`
	resp := h.post("/v1/responses", body)
	got := readAll(t, resp)
	want := h.direct("/v1/responses", strings.Replace(body, `"large"`, `"proxytest-large"`, 1))
	if resp.StatusCode != 200 || normalize(string(got)) != normalize(string(want)) {
		t.Fatalf("non-stream differs:\n got %s\nwant %s", got, want)
	}
	sbody := `{"model":"large","input":"Tell me a story","stream":true}`
	got = readAll(t, h.post("/v1/responses", sbody))
	if gjson.GetBytes(h.up.Requests()[1].Body, "stream_options").Exists() {
		t.Fatalf("responses requests need no stream_options: %s", h.up.Requests()[1].Body)
	}
	want = h.direct("/v1/responses", strings.Replace(sbody, `"large"`, `"proxytest-large"`, 1))
	if normalize(string(got)) != normalize(string(want)) {
		t.Fatalf("stream differs:\n got %s\nwant %s", got, want)
	}
	if !strings.Contains(string(got), "event: response.completed") {
		t.Fatalf("no response.completed: %s", got)
	}
	// (100-40)*0.0000005 + 40*0.00000025 + 50*0.000002 + request 0.0001 = 0.00003+0.00001+0.0001+0.0001 = 0.00024
	for _, ev := range h.events(2) {
		if ev.PromptTokens != 100 || ev.CachedTokens != 40 || ev.CompletionTokens != 50 || ev.ReasoningTokens != 20 || ev.CostNanos != 240000 || ev.Endpoint != "/v1/responses" {
			t.Fatalf("event %+v", ev)
		}
	}
}

func TestImagesAreBilledAtTheImagePrice(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{PromptTokens: 10, CompletionTokens: 10}})
	body := `{"model":"large","messages":[{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"image_url","image_url":{"url":"data:image/png;base64,BBBB"}}]}]}`
	readAll(t, h.post("/v1/chat/completions", body))
	// 10*0.0000005 + 10*0.000002 + 2*0.001 + 0.0001 = 0.000005+0.00002+0.002+0.0001
	if ev := h.events(1)[0]; ev.Images != 2 || ev.CostNanos != 2125000 {
		t.Fatalf("event %+v", ev)
	}
}

// A Responses tool's output may hold images: a function's or custom
// tool's output list of input_image parts, a computer call's screenshot.
// Only a message's content was looked at: an image there was billed at
// the model's image price, the same image a tool returned was free.
func TestImagesInToolOutputsAreBilledAtTheImagePrice(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{PromptTokens: 10, CompletionTokens: 10}})
	const png = `"data:image/png;base64,iVBORw0KGgo="`
	for i, tc := range []struct {
		name, item string
		images     int64
	}{
		{"in a message", `{"role":"user","content":[{"type":"input_image","image_url":` + png + `}]}`, 1},
		{"a function's output list", `{"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"the chart"},{"type":"input_image","image_url":` + png + `},{"type":"input_image","file_id":"file-1"}]}`, 2},
		{"a custom tool's output list", `{"type":"custom_tool_call_output","call_id":"c1","output":[{"type":"input_image","image_url":` + png + `}]}`, 1},
		{"a computer call's screenshot", `{"type":"computer_call_output","call_id":"c1","output":{"type":"computer_screenshot","image_url":` + png + `}}`, 1},
		{"a function's output as text", `{"type":"function_call_output","call_id":"c1","output":"{\"type\":\"input_image\"}"}`, 0},
	} {
		readAll(t, h.post("/v1/responses", `{"model":"large","input":[`+tc.item+`]}`))
		// 10*0.0000005 + 10*0.000002 + images*0.001 + 0.0001
		if ev := h.events(i + 1)[i]; ev.Images != tc.images || ev.CostNanos != money.Nanos(125000+tc.images*1_000_000) {
			t.Errorf("%s: billed %d images, %d nano-USD; want %d, %d", tc.name, ev.Images, ev.CostNanos, tc.images, 125000+tc.images*1_000_000)
		}
	}
}

// manyKeys is n distinct members k0 … k(n-1), for a body of many keys.
func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":%d`, i, i)
	}
	return b.String()
}

func TestBadRequests(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	cases := []struct {
		name, body, param, inMessage string
	}{
		{"missing model", `{"messages":[]}`, "model", "small"},
		{"unknown model", `{"model":"gpt-9","messages":[]}`, "model", "small, large"}, // GET /v1/models's order
		{"model not a string", `{"model":42}`, "model", "must be a string"},
		{"model null", `{"model":null}`, "model", "you must provide a model"},
		{"store not a boolean", `{"model":"small","store":"false"}`, "store", "expected a boolean"},
		{"malformed JSON", `{"model":"small",`, "", "not valid JSON"},
		{"not an object", `["small"]`, "", "JSON object"},
		{"duplicate model", `{"model":"small","model":"large"}`, "model", "duplicate"},
		// The prompt's estimate read the first, an upstream prefilled the
		// last: a client that left early paid for two tokens of 40,000.
		{"duplicate messages", `{"model":"small","messages":[{"role":"user","content":"Hi"}],"messages":[]}`, "messages", "duplicate"},
		{"duplicate escaped key", `{"model":"small","tools":[],"t\u006fols":[]}`, "tools", "duplicate"},
		{"duplicate past 32 keys", `{"model":"small",` + manyKeys(40) + `,"k3":1}`, "k3", "duplicate"},
		{"empty body", ``, "", "not valid JSON"},
		// Windows tools write these; the message named no reason.
		{"byte order mark", "\ufeff" + `{"model":"small"}`, "", "not valid JSON: it starts with a UTF-8 byte order mark (EF BB BF); send the JSON without it"},
		{"UTF-16", "\xff\xfe{\x00}\x00", "", "not valid JSON: it is UTF-16 little-endian; send the JSON in UTF-8"},
		// gjson validates recursively: a few million '[' overflowed the
		// stack and killed the gateway with every call in flight.
		{"nested too deep", `{"model":"small","x":` + strings.Repeat("[", 10001) + `}`, "", "more than 10000 deep"},
		// An upstream keeping the last include_usage would send no usage
		// after the gateway rewrote the first one to true.
		{"duplicate include_usage", `{"model":"small","stream":true,"stream_options":{"include_usage":false,"include_usage":false}}`,
			"stream_options.include_usage", "duplicate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := wantError(t, h.post("/v1/chat/completions", c.body), 400, "invalid_request_error")
			if e["type"] != "invalid_request_error" {
				t.Fatalf("type %v", e["type"])
			}
			if c.param != "" && e["param"] != c.param {
				t.Fatalf("param %v, want %s", e["param"], c.param)
			}
			if !strings.Contains(e["message"].(string), c.inMessage) {
				t.Fatalf("message %q lacks %q", e["message"], c.inMessage)
			}
		})
	}
	if len(h.up.Requests()) != 0 {
		t.Fatalf("bad requests reached the upstream")
	}
	resp := h.post("/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"`+strings.Repeat("x", 70<<10)+`"}]}`)
	wantError(t, resp, 413, "request_too_large")
	if len(h.rec.Events()) != 0 {
		t.Fatal("refused requests were metered")
	}
}

// stream and stream_options of the wrong type were read as "not streaming"
// or rewritten into something the client never sent; now they are refused
// as OpenAI refuses them, before the upstream is called. null stays absent.
func TestStreamFieldsOfTheWrongTypeAreRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	cases := []struct {
		field, param, message string
	}{
		{`"stream":"true"`, "stream", "Invalid type for 'stream': expected a boolean, but got a string instead."},
		{`"stream":1`, "stream", "Invalid type for 'stream': expected a boolean, but got a number instead."},
		{`"stream":{}`, "stream", "Invalid type for 'stream': expected a boolean, but got an object instead."},
		{`"stream":[true]`, "stream", "Invalid type for 'stream': expected a boolean, but got an array instead."},
		{`"stream":true,"stream_options":true`, "stream_options", "Invalid type for 'stream_options': expected an object, but got a boolean instead."},
		{`"stream":true,"stream_options":"include_usage"`, "stream_options", "Invalid type for 'stream_options': expected an object, but got a string instead."},
		{`"stream":true,"stream_options":[]`, "stream_options", "Invalid type for 'stream_options': expected an object, but got an array instead."},
		{`"stream":true,"stream_options":{"include_usage":"false"}`, "stream_options.include_usage", "Invalid type for 'stream_options.include_usage': expected a boolean, but got a string instead."},
		{`"stream":true,"stream_options":{"include_usage":0}`, "stream_options.include_usage", "Invalid type for 'stream_options.include_usage': expected a boolean, but got a number instead."},
		{`"stream_options":{"include_usage":{}}`, "stream_options.include_usage", "Invalid type for 'stream_options.include_usage': expected a boolean, but got an object instead."},
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/responses"} {
		for _, c := range cases {
			e := wantError(t, h.post(path, `{"model":"small",`+c.field+`,"messages":[],"input":"hi"}`), 400, "invalid_request_error")
			if e["param"] != c.param || e["message"] != c.message {
				t.Errorf("%s %s: param %v, message %q; want %s, %q", path, c.field, e["param"], e["message"], c.param, c.message)
			}
		}
	}
	if n := len(h.up.Requests()); n != 0 {
		t.Fatalf("%d refused requests reached the upstream", n)
	}

	// null is absent, as at OpenAI: no stream, or no usage asked for.
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":null,"messages":[]}`)
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("stream null: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	resp = h.post("/v1/chat/completions", `{"model":"small","stream":true,"stream_options":{"include_usage":null},"messages":[]}`)
	body := readAll(t, resp)
	if resp.StatusCode != 200 || strings.Contains(string(body), "usage") {
		t.Fatalf("include_usage null: %d %s", resp.StatusCode, body)
	}
	if sent := h.up.Requests()[1].Body; !gjson.GetBytes(sent, "stream_options.include_usage").Bool() {
		t.Fatalf("gateway did not ask upstream for usage: %s", sent)
	}
}

func TestUpstreamErrorsPassThrough(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Status: 429, ErrorBody: `{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`}})
	resp := h.post("/v1/chat/completions", chatBody)
	body := readAll(t, resp)
	if resp.StatusCode != 429 || string(body) != `{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}` {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	h.up.SetOptions(proxytest.Options{Status: 500, ErrorBody: "upstream exploded"})
	resp = h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[]}`)
	if body := readAll(t, resp); resp.StatusCode != 500 || string(body) != "upstream exploded" {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
	time.Sleep(50 * time.Millisecond)
	if n := len(h.rec.Events()); n != 0 {
		t.Fatalf("%d events for upstream errors", n)
	}
}

func TestUnreachableUpstreamIs503(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.up.Close()
	resp := h.post("/v1/chat/completions", chatBody)
	e := wantError(t, resp, 503, "upstream_unavailable")
	if !strings.Contains(e["message"].(string), "unreachable") {
		t.Fatalf("message %v", e["message"])
	}
	// A client is told why, not where the upstream lives.
	if strings.Contains(e["message"].(string), "127.0.0.1") {
		t.Errorf("the message names the upstream's address: %v", e["message"])
	}
	// An upstream on the gateway's own machine that refuses: the Quick
	// start's user, with no upstream started, read "upstream default is
	// unreachable: connection refused" and had no idea what to start.
	if !strings.Contains(e["message"].(string), "nothing listens at its base_url on the gateway's machine") {
		t.Errorf("a refused loopback upstream gives no hint: %v", e["message"])
	}
	// the rest of the gateway still works
	r, err := http.Get(h.url + "/v1/models")
	if err != nil || r.StatusCode != 200 {
		t.Fatalf("models: %v %v", err, r)
	}
	readAll(t, r)
}

func TestSlowFirstByteIs503(t *testing.T) {
	h := newHarness(t, harnessOptions{firstByteTimeout: "300ms", upstream: proxytest.Options{FirstByteDelay: 2 * time.Second}})
	start := time.Now()
	e := wantError(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[]}`), 503, "upstream_unavailable")
	if !strings.Contains(e["message"].(string), "first_byte_timeout") {
		t.Fatalf("message %v", e["message"])
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("took %s; first_byte_timeout is 300ms", d)
	}
}

// A stream that keeps producing for longer than idle_timeout in total is
// never cut: the timeout is per gap, not per stream.
func TestLongStreamOutlivesIdleTimeout(t *testing.T) {
	h := newHarness(t, harnessOptions{idleTimeout: "300ms", upstream: proxytest.Options{Chunks: 10, ChunkDelay: 100 * time.Millisecond}})
	got := readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[]}`))
	if !strings.HasSuffix(string(got), "data: [DONE]\n\n") || strings.Contains(string(got), "error") {
		t.Fatalf("stream was cut: %s", got)
	}
}

func TestStreamCutMidwayEndsCleanlyAndIsMetered(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 10, DropAfter: 4}})
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}]}`)
	got := readAll(t, resp) // must not fail: the gateway ends the chunked body properly
	evs := sseEvents(got)
	last := evs[len(evs)-1]
	if len(evs) != 5 || !strings.Contains(last, `"code":"stream_interrupted"`) || !strings.HasPrefix(last, "data: {\"error\"") {
		t.Fatalf("want 4 relayed events and an error event, got %d: %s", len(evs), got)
	}
	if typ := errorEventType(last); typ != "upstream_error" {
		t.Fatalf("an upstream's cut typed %q, want upstream_error", typ)
	}
	ev := h.events(1)[0]
	if ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens < 2 || ev.PromptTokens < 3 || ev.CostNanos <= 0 {
		t.Fatalf("event %+v", ev)
	}
}

func TestResponsesStreamCutSendsErrorEvent(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 10, DropAfter: 6}})
	got := readAll(t, h.post("/v1/responses", `{"model":"small","stream":true,"input":"hello there"}`))
	evs := sseEvents(got)
	if last := evs[len(evs)-1]; !strings.HasPrefix(last, "event: error\ndata: ") || !strings.Contains(last, `"type":"error"`) {
		t.Fatalf("last event %q", last)
	}
	// Numbered after the upstream's last event, as every responses event
	// is: the SDKs' stream helpers expect sequence_number on each.
	lastData := func(ev string) string { return ev[strings.Index(ev, "data: ")+len("data: "):] }
	prev, last := gjson.Get(lastData(evs[len(evs)-2]), "sequence_number"), gjson.Get(lastData(evs[len(evs)-1]), "sequence_number")
	if prev.Type != gjson.Number || last.Type != gjson.Number || last.Int() != prev.Int()+1 {
		t.Fatalf("sequence_number %v after %v, want the next", last, prev)
	}
	if ev := h.events(1)[0]; ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens == 0 {
		t.Fatalf("event %+v", ev)
	}
}

// An upstream whose responses events carry no sequence_number (some
// compatible servers leave it out) cut its stream after 9 events: the
// gateway's error event said sequence_number 0, before the events the
// client got, and SDKs that sort or check the numbers put it first. It
// is numbered after the events relayed, as the upstream would have.
func TestResponsesStreamCutWithoutSequenceNumbersNumbersTheErrorNext(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	var stream strings.Builder
	stream.WriteString("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n")
	for range 8 {
		stream.WriteString("event: response.output_text.delta\ndata: " +
			`{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"word "}` + "\n\n")
	}
	answerWith(t, h, stream.String())
	var evs []string
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		evs = sseEvents(readAll(t, h.post("/v1/responses", `{"model":"small","stream":true,"input":"hello there"}`)))
		if len(evs) != 10 || !strings.Contains(evs[1], "word ") {
			return fmt.Errorf("want the 9 events and an error, got %q", evs)
		}
		return nil
	})
	last := evs[len(evs)-1]
	seq := gjson.Get(last[strings.Index(last, "data: ")+len("data: "):], "sequence_number")
	if !strings.Contains(last, `"code":"stream_interrupted"`) || seq.Type != gjson.Number || seq.Int() != 9 {
		t.Fatalf("error event %q after 9 events, want sequence_number 9", last)
	}
}

// An upstream that sends a Responses answer's text whole, in
// response.output_text.done and the item's done, with no deltas, then
// cuts the stream: the client got all 500 words and stream_interrupted,
// and the call was billed 0 completion tokens.
func TestResponsesStreamCutAfterTextSentWholeBillsTheText(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	event := func(typ string, seq int, data string) string {
		return fmt.Sprintf("event: %s\ndata: {\"type\":%q,\"sequence_number\":%d,%s}\n\n", typ, typ, seq, data)
	}
	words := strings.TrimSpace(strings.Repeat(" word", 500))
	text := `{"type":"output_text","annotations":[],"text":"` + words + `"}`
	cut := resettingUpstream(t,
		event("response.created", 0, `"response":{"id":"resp_w","object":"response","status":"in_progress","output":[]}`),
		event("response.output_item.added", 1, `"output_index":0,"item":{"id":"msg_w","type":"message","role":"assistant","content":[]}`),
		event("response.content_part.added", 2, `"output_index":0,"content_index":0,"part":{"type":"output_text","annotations":[],"text":""}`),
		event("response.output_text.done", 3, `"output_index":0,"content_index":0,"text":"`+words+`"`),
		event("response.content_part.done", 4, `"output_index":0,"content_index":0,"part":`+text),
		event("response.output_item.done", 5, `"output_index":0,"item":{"id":"msg_w","type":"message","role":"assistant","content":[`+text+`]}`))
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, cut, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		got := string(readAll(t, h.post("/v1/responses", `{"model":"small","stream":true,"store":false,"input":"hi"}`)))
		if !strings.Contains(got, words) || !strings.Contains(got, `"code":"stream_interrupted"`) {
			return fmt.Errorf("got %s", got)
		}
		return nil
	})
	evs := h.events(1)
	if ev := evs[len(evs)-1]; ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens != int64(tokens.Count(words)) {
		t.Fatalf("event %+v, want the %d completion tokens of the text relayed", ev, tokens.Count(words))
	}
}

func TestStreamWithoutDoneEndsAndIsMetered(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 3, OmitDone: true, PromptTokens: 5, CompletionTokens: 3}})
	got := readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[]}`))
	if strings.Contains(string(got), "[DONE]") || strings.Contains(string(got), "error") || strings.Contains(string(got), "usage") {
		t.Fatalf("got %s", got)
	}
	if ev := h.events(1)[0]; ev.UsageSource != meter.SourceUpstream || ev.PromptTokens != 5 {
		t.Fatalf("event %+v", ev)
	}
}

// With n above 1 each choice ends with its own finish_reason: a stream
// cut after the first one's was relayed as complete, and a client took the
// other choices' halves for whole answers.
func TestStreamOfTwoChoicesCutAfterOneIsInterrupted(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 3, OmitDone: true, PromptTokens: 5, CompletionTokens: 3}})
	got := string(readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"n":2,"messages":[]}`)))
	if !strings.Contains(got, `"finish_reason":"stop"`) || !strings.Contains(got, `"code":"stream_interrupted"`) {
		t.Fatalf("got %s", got)
	}
	wantError(t, h.post("/v1/chat/completions", `{"model":"small","n":2,"n":1,"messages":[]}`), 400, "invalid_request_error")
}

func TestStalledUpstreamHitsIdleTimeout(t *testing.T) {
	h := newHarness(t, harnessOptions{idleTimeout: "300ms", upstream: proxytest.Options{Chunks: 5, Stall: true}})
	start := time.Now()
	got := readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[]}`))
	if !strings.Contains(string(got), "idle_timeout") {
		t.Fatalf("got %s", got)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %s", d)
	}
	if ev := h.events(1)[0]; ev.UsageSource != meter.SourceEstimated {
		t.Fatalf("event %+v", ev)
	}
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if h.up.Active() != 0 {
			return fmt.Errorf("upstream still has %d requests open", h.up.Active())
		}
		return nil
	})
}

func TestClientDisconnectAbortsUpstream(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 200, ChunkDelay: 20 * time.Millisecond}})
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", h.key, len(body), body)
	br := bufio.NewReader(conn)
	seen := 0
	for seen < 3 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "data: ") {
			seen++
		}
	}
	conn.Close()
	checkFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if h.up.Canceled() != 1 {
			return fmt.Errorf("upstream saw %d cancellations", h.up.Canceled())
		}
		return nil
	})
	ev := h.events(1)[0]
	if ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens < 1 || ev.CompletionTokens > 150 {
		t.Fatalf("event %+v", ev)
	}
}

// Each event reaches the client when the upstream sends it, not when the
// stream ends.
func TestStreamIsRelayedEventByEvent(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 5, ChunkDelay: 300 * time.Millisecond}})
	start := time.Now()
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[]}`)
	defer resp.Body.Close()
	sr := &streamReader{br: bufio.NewReader(resp.Body)}
	first, err := sr.next()
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("first event after %s; the stream takes ~2s: it was buffered (%q)", d, first)
	}
	second, _ := sr.next()
	if second == "" {
		t.Fatal("no second event")
	}
	io.Copy(io.Discard, resp.Body)
}

func TestAuthFailures(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := t.Context()
	wantError(t, h.post("/v1/chat/completions", chatBody, ""), 401, "INVALID_API_KEY")
	wantError(t, h.post("/v1/chat/completions", chatBody, "tg-not.a.jwt"), 401, "INVALID_API_KEY")
	tampered := h.key[:len(h.key)-4] + "AAAA"
	wantError(t, h.post("/v1/chat/completions", chatBody, tampered), 401, "INVALID_API_KEY")
	// alg none with the same claims
	parts := strings.Split(strings.TrimPrefix(h.key, "tg-"), ".")
	none := "tg-eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0." + parts[1] + "."
	wantError(t, h.post("/v1/chat/completions", chatBody, none), 401, "INVALID_API_KEY")

	info, key2, err := h.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "to-revoke"})
	if err != nil {
		t.Fatal(err)
	}
	if resp := h.post("/v1/chat/completions", chatBody, key2); resp.StatusCode != 200 {
		t.Fatalf("fresh key: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	if _, err := h.svc.RevokeKey(ctx, info.KeyID); err != nil {
		t.Fatal(err)
	}
	checkFor(t, time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", chatBody, key2)
		readAll(t, resp)
		if resp.StatusCode != 401 {
			return fmt.Errorf("revoked key answered %d", resp.StatusCode)
		}
		return nil
	})

	_, classifyOnly, _ := h.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "c", Scopes: []string{accounts.ScopeClassify}})
	e := wantError(t, h.post("/v1/chat/completions", chatBody, classifyOnly), 403, "permission_denied")
	if !strings.Contains(e["message"].(string), "generate") {
		t.Fatalf("403 message should name the scope: %v", e["message"])
	}
	_, smallOnly, _ := h.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "s", Models: []string{"small"}})
	if err := h.svc.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	e = wantError(t, h.post("/v1/chat/completions", `{"model":"large","messages":[]}`, smallOnly), 403, "permission_denied")
	if !strings.Contains(e["message"].(string), "large") {
		t.Fatalf("403 message should name the model: %v", e["message"])
	}
	// The 400 for an unknown model lists only the models the key may use.
	e = wantError(t, h.post("/v1/chat/completions", `{"model":"gpt-4o","messages":[]}`, smallOnly), 400, "invalid_request_error")
	if msg := e["message"].(string); !strings.HasSuffix(msg, "valid models: small") {
		t.Fatalf("400 for a key limited to small: %v", msg)
	}
}

// A key limited to models that all left the catalog (removed from
// gateway.yaml and reloaded) got, on every call, a 400 "does not exist or
// is not allowed; valid models: " listing nothing. It is a 403 that names
// the models gone and says an admin must replace the key.
func TestKeyWhoseModelsLeftTheCatalogIsToldSo(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := t.Context()
	_, stranded, err := h.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "old", Models: []string{"retired", "retired-2"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`{"model":"retired","messages":[]}`, `{"model":"small","messages":[]}`, `{"messages":[]}`} {
		e := wantError(t, h.post("/v1/chat/completions", body, stranded), 403, "permission_denied")
		want := "this API key may use only models no longer served (retired, retired-2): an admin must replace it " +
			"(revoke it, and create the account a key for models served)"
		if msg := e["message"].(string); msg != want {
			t.Fatalf("%s with a key whose models all left the catalog: %q, want %q", body, msg, want)
		}
	}
}

func TestBalanceBelowGraceIs402UntilTopUp(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := t.Context()
	// grace is 0.50: 10.00 - 10.40 = -0.40 still serves, -0.60 does not
	if _, err := h.svc.Debit(ctx, "acme", 10*money.NanosPerUSD+400_000_000); err != nil {
		t.Fatal(err)
	}
	if err := h.svc.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	resp := h.post("/v1/chat/completions", chatBody)
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("within grace: %d", resp.StatusCode)
	}
	if _, err := h.svc.Debit(ctx, "acme", 200_000_000); err != nil {
		t.Fatal(err)
	}
	checkFor(t, time.Second, 10*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", chatBody)
		body := readAll(t, resp)
		if resp.StatusCode != 402 || gjson.GetBytes(body, "error.code").Str != "INSUFFICIENT_BALANCE" {
			return fmt.Errorf("got %d %s", resp.StatusCode, body)
		}
		return nil
	})
	if _, err := h.svc.Credit(ctx, "acme", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	checkFor(t, time.Second, 10*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", chatBody)
		if readAll(t, resp); resp.StatusCode != 200 {
			return fmt.Errorf("after top-up: %d", resp.StatusCode)
		}
		return nil
	})
}

// The balance calls are admitted on counts what this gateway charged at
// once: its debits come back a second later, or never while the billing
// consumer is down (the harness has none), and until then an account near
// zero could make every call of that second (-111 USD on 0.05 of credit).
func TestBalanceCountsCallsNotYetDebited(t *testing.T) {
	// Each call costs 1.00 USD: 10,000,000 prompt tokens at 0.0000001.
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{PromptTokens: 10_000_000, CompletionTokens: 1}})
	served := 0
	for range 20 {
		resp := h.post("/v1/chat/completions", chatBody)
		body := readAll(t, resp)
		if resp.StatusCode == 402 {
			break
		}
		if resp.StatusCode != 200 {
			t.Fatalf("call %d: %d %s", served+1, resp.StatusCode, body)
		}
		served++
	}
	// 10.00 USD of credit and a grace of 0.50: the eleventh call starts at
	// 0.00 and ends at -1.00, and the twelfth is refused.
	if served != 11 {
		t.Fatalf("%d calls served on 10 USD of credit with a grace of 0.50; want 11", served)
	}
}

func TestEveryResponseCarriesRequestID(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, resp := range []*http.Response{
		h.post("/v1/chat/completions", chatBody),
		h.post("/v1/chat/completions", `{}`),
		h.post("/v1/chat/completions", chatBody, ""),
	} {
		readAll(t, resp)
		if id := resp.Header.Get("x-request-id"); len(id) != 36 || id[14] != '7' {
			t.Fatalf("x-request-id %q is not a UUIDv7", id)
		}
	}
}

func TestModelsListing(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	resp, err := http.Get(h.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID              string            `json:"id"`
			HuggingFaceID   string            `json:"hugging_face_id"`
			ContextLength   int               `json:"context_length"`
			MaxOutputLength int               `json:"max_output_length"`
			Pricing         map[string]string `json:"pricing"`
			Features        []string          `json:"supported_features"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 2 || list.Data[1].ID != "large" || list.Data[1].Pricing["completion"] != "0.000002" || list.Data[1].Pricing["input_cache_read"] != "0.00000025" {
		t.Fatalf("got %s", body)
	}
	if strings.Contains(string(body), "proxytest-") || strings.Contains(string(body), "upstream") {
		t.Fatalf("catalog leaks upstream mapping: %s", body)
	}
}

func TestAllowListReloadTakesEffect(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	cfg := fmt.Sprintf(gatewayYAML, h.up.URL, h.t.TempDir(), "5s", "5s")
	_ = cfg
	orig := readFile(t, h.cfgPath)
	// remove "large" from the allow-list
	trimmed := orig[:strings.Index(orig, "  - id: large")]
	h.writeConfig(trimmed)
	start := time.Now()
	checkFor(t, 2*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", `{"model":"large","messages":[]}`)
		if readAll(t, resp); resp.StatusCode != 400 {
			return fmt.Errorf("large still served: %d", resp.StatusCode)
		}
		return nil
	})
	t.Logf("removal took effect after %s", time.Since(start))
	h.writeConfig(orig)
	checkFor(t, 2*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", `{"model":"large","messages":[]}`)
		if readAll(t, resp); resp.StatusCode != 200 {
			return fmt.Errorf("large not back: %d", resp.StatusCode)
		}
		return nil
	})
	// an invalid edit keeps the old config serving
	h.writeConfig(orig + "\nbogus_key: 1\n")
	time.Sleep(1200 * time.Millisecond)
	resp := h.post("/v1/chat/completions", `{"model":"large","messages":[]}`)
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("invalid edit broke serving: %d", resp.StatusCode)
	}
}

// Requests keep flowing, none failing, while the allow-list changes under
// them: in-flight requests finish on the config they started with.
func TestReloadUnderLoadFailsNoRequest(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 5, ChunkDelay: 5 * time.Millisecond}})
	orig := readFile(t, h.cfgPath)
	var failures, done atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				body := chatBody
				if i%2 == 0 {
					body = `{"model":"small","stream":true,"messages":[]}`
				}
				resp := h.post("/v1/chat/completions", body)
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || strings.Contains(string(b), "error") {
					failures.Add(1)
				}
				done.Add(1)
			}
		}(i)
	}
	for i := 0; i < 6; i++ {
		// toggle a model the load does not use, and the price of the one it does
		next := orig
		if i%2 == 0 {
			next = strings.Replace(orig[:strings.Index(orig, "  - id: large")], `prompt: "0.0000001"`, `prompt: "0.0000002"`, 1)
		}
		h.writeConfig(next)
		time.Sleep(700 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if failures.Load() != 0 || done.Load() < 50 {
		t.Fatalf("%d of %d requests failed during reloads", failures.Load(), done.Load())
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := readFileBytes(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRequestLoggingOnlyForLoggingKeys(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 4}})
	ctx := t.Context()
	_, logged, err := h.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "logged", Logging: accounts.Logging{Enabled: true, RetentionDays: 7}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	body := `{"model":"small","messages":[{"role":"user","content":"secret question"}]}`
	got := readAll(t, h.post("/v1/chat/completions", body, logged))
	sbody := `{"model":"small","stream":true,"messages":[{"role":"user","content":"another"}]}`
	readAll(t, h.post("/v1/chat/completions", sbody, logged))
	readAll(t, h.post("/v1/chat/completions", body)) // the harness key logs nothing
	evs := h.events(3)
	byKey := map[bool][]*meter.Event{}
	for _, ev := range evs {
		byKey[ev.KeyID == h.keyID(t)] = append(byKey[ev.KeyID == h.keyID(t)], ev)
	}
	if len(byKey[true]) != 1 || byKey[true][0].Log != nil {
		t.Fatalf("a key without logging logged: %+v", byKey[true])
	}
	for _, ev := range byKey[false] {
		if ev.Log == nil || ev.Log.RetentionDays != 7 {
			t.Fatalf("no log on a logging key: %+v", ev)
		}
		if ev.Stream {
			if ev.Log.Request != sbody || ev.Log.Response != "tok0 tok1 tok2 tok3" {
				t.Fatalf("stream log %+v", ev.Log)
			}
		} else if ev.Log.Request != body || ev.Log.Response != string(got) {
			t.Fatalf("log %+v, answer %s", ev.Log, got)
		}
	}
}

// A key's own rpm and tpm hold for generation too: requests count at once,
// tokens as the prompt's estimate at once and settled to the usage once it
// is known.
func TestKeyLimitsHoldForGeneration(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{PromptTokens: 10, CompletionTokens: 20}})
	ctx := t.Context()
	_, rpmKey, err := h.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "rpm", RPM: 2})
	if err != nil {
		t.Fatal(err)
	}
	_, tpmKey, err := h.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "tpm", TPM: 60})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		resp := h.post("/v1/chat/completions", chatBody, rpmKey)
		if readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	resp := h.post("/v1/chat/completions", chatBody, rpmKey)
	wantError(t, resp, 429, "rate_limit_exceeded")
	if resp.Header.Get("Retry-After") == "" || resp.Header.Get("x-ratelimit-limit-requests") != "2" {
		t.Fatalf("headers %v", resp.Header)
	}
	// The wait to the millisecond too: a Retry-After of 60 s for a wait
	// of 59.4, which the Vercel AI SDK does not honour (only under 60 s),
	// had it retry after 2 s into a certain 429.
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	ms, err := strconv.Atoi(resp.Header.Get("retry-after-ms"))
	if err != nil || ms < 1 || ms > ra*1000 || ms <= (ra-1)*1000 {
		t.Fatalf("retry-after-ms %q beside Retry-After %q", resp.Header.Get("retry-after-ms"), resp.Header.Get("Retry-After"))
	}
	// 30 tokens a call against 60 a minute, each admitted on an estimate
	// of 11 (47 bytes): the second call is admitted (the first used 30 s of
	// the minute), the third waits.
	for i := range 2 {
		resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[]}`, tpmKey)
		if readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("tpm request %d: %d", i, resp.StatusCode)
		}
	}
	resp = h.post("/v1/chat/completions", chatBody, tpmKey)
	e := wantError(t, resp, 429, "rate_limit_exceeded")
	if msg := e["message"].(string); !strings.Contains(msg, "would pass them") {
		t.Errorf("a generation call refused for the tokens of the calls before it: %q", msg)
	}
	// A wait the SDKs honour (a minute or less): they may retry.
	if resp.Header.Get("x-should-retry") != "" {
		t.Errorf("x-should-retry %q on a wait of %s s", resp.Header.Get("x-should-retry"), resp.Header.Get("Retry-After"))
	}
	// the harness key has no limits of its own
	for range 5 {
		resp := h.post("/v1/chat/completions", chatBody)
		if readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("unlimited key: %d", resp.StatusCode)
		}
	}
}

// A generation whose prompt alone is above its key's whole tpm is never
// refused as one that can never pass: its estimate counts at most the
// whole limit, so it is admitted on a full bucket, and after its usage
// the next call waits as any does (found by a session with the OpenAI
// Node SDK: a 140-token prompt on tpm 50 was answered). That wait is
// 3 minutes, over what the SDKs honour, so it carries x-should-retry:
// false as any such wait does, not as a refusal for good.
func TestGenerationAboveTheWholeTPMIsAdmittedOnAFullBucket(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{PromptTokens: 140, CompletionTokens: 10}})
	_, key, err := h.svc.CreateKey(t.Context(), "acme", accounts.KeyRequest{Name: "tpm", TPM: 50})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	// About 560 bytes: an estimate of 140 tokens, counted as 50.
	body := `{"model":"small","messages":[{"role":"user","content":"` + strings.Repeat("word ", 100) + `"}]}`
	resp := h.post("/v1/chat/completions", body, key)
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("a prompt above the whole tpm on a full bucket: %d, want 200", resp.StatusCode)
	}
	resp = h.post("/v1/chat/completions", body, key)
	e := wantError(t, resp, 429, "rate_limit_exceeded")
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra <= 60 || resp.Header.Get("x-should-retry") != "false" || !strings.Contains(e["message"].(string), "would pass them") {
		t.Fatalf("the call after it: x-should-retry %q, Retry-After %q, %q; want a wait, not a refusal for good",
			resp.Header.Get("x-should-retry"), resp.Header.Get("Retry-After"), e["message"])
	}
}

// A call refused before it reached an upstream (not JSON, an unknown
// model, a model its key may not use) costs its key no request: on rpm 3,
// two bodies that were not JSON and an unknown model left the valid call
// after them a 429 (found by a black-box session).
func TestRefusedGenerationCostsNoRequest(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, path := range []string{"/v1/chat/completions", "/v1/responses"} {
		_, key, err := h.svc.CreateKey(t.Context(), "acme", accounts.KeyRequest{Name: "rpm", RPM: 3, TPM: 100_000, Models: []string{"small"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.svc.WaitSynced(t.Context()); err != nil {
			t.Fatal(err)
		}
		for _, refused := range []struct {
			body   string
			status int
		}{
			{"notjson", 400},
			{"notjson", 400},
			{`{"model":"nope","messages":[],"input":"hi"}`, 400},
			{`{"model":"large","messages":[],"input":"hi"}`, 403},
		} {
			resp := h.post(path, refused.body, key)
			if body := readAll(t, resp); resp.StatusCode != refused.status {
				t.Fatalf("%s %s: %d %s", path, refused.body, resp.StatusCode, body)
			}
			if got := resp.Header.Get("x-ratelimit-remaining-requests"); got != "3" {
				t.Errorf("%s %s: x-ratelimit-remaining-requests %q after a refusal, want 3", path, refused.body, got)
			}
		}
		for i := range 3 {
			resp := h.post(path, `{"model":"small","messages":[],"input":"hi"}`, key)
			if body := readAll(t, resp); resp.StatusCode != 200 {
				t.Fatalf("%s: call %d after the refusals: %d %s", path, i, resp.StatusCode, body)
			}
		}
		wantError(t, h.post(path, `{"model":"small","messages":[],"input":"hi"}`, key), 429, "rate_limit_exceeded")
	}
}

// A call that ends with the gateway's own 503, no attempt having reached
// an upstream (the only one refused the connection), costs its key no
// request, as one refused before its upstream does: the OpenAI SDKs
// retry a 503 twice, and one SDK call used three of its key's rpm
// (found by a re-test session). A call an upstream took, and did not
// answer in time, costs its request.
func TestUnreachableUpstreamCostsNoRequest(t *testing.T) {
	h := newHarness(t, harnessOptions{firstByteTimeout: "300ms"})
	_, key, err := h.svc.CreateKey(t.Context(), "acme", accounts.KeyRequest{Name: "rpm", RPM: 3, TPM: 100_000})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	remaining := func(resp *http.Response, want string) {
		t.Helper()
		if got := resp.Header.Get("x-ratelimit-remaining-requests"); got != want {
			t.Errorf("x-ratelimit-remaining-requests %q, want %s", got, want)
		}
	}
	h.up.SetOptions(proxytest.Options{FirstByteDelay: time.Second})
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`, key)
	wantError(t, resp, 503, "upstream_unavailable")
	remaining(resp, "2")

	h.up.Close() // nothing listens on its port any more
	for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/chat/completions", "/v1/responses"} {
		resp := h.post(path, `{"model":"small","messages":[{"role":"user","content":"hi"}],"input":"hi"}`, key)
		wantError(t, resp, 503, "upstream_unavailable")
		remaining(resp, "2")
	}
}

// Calls in flight together count their prompts at once: counting a
// generation's tokens only once its usage came let 100 concurrent streams
// take 10M tokens on a key's tpm of 1,000.
func TestKeyTokenLimitHoldsForConcurrentGenerations(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{FirstByteDelay: 300 * time.Millisecond}})
	ctx := t.Context()
	_, key, err := h.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "tpm", TPM: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	// About 1,960 bytes: an estimate of 490 tokens, so two fit the minute.
	body := `{"model":"small","messages":[{"role":"user","content":"` + strings.Repeat("word ", 380) + `"}]}`
	var wg sync.WaitGroup
	var served, refused atomic.Int32
	for range 10 {
		wg.Go(func() {
			resp := h.post("/v1/chat/completions", body, key)
			readAll(t, resp)
			switch resp.StatusCode {
			case 200:
				served.Add(1)
			case 429:
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if served.Load() != 2 || refused.Load() != 8 {
		t.Fatalf("%d served and %d refused of 10 concurrent calls of about 490 tokens on tpm 1000; want 2 and 8", served.Load(), refused.Load())
	}
	// An image's base64 counts nothing before the usage: a megabyte of it
	// is not 250,000 tokens.
	image := `{"model":"small","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("A", 40_000) + `"}}]}]}`
	if got := proxy.PromptEstimate([]byte(image), 1_000_000); got > 40 {
		t.Errorf("an image of 40,000 base64 bytes estimated at %d tokens", got)
	}
	// The marker in a message's text is no data URL: the text after it
	// counts (it let 60 calls of 45,000 tokens through on tpm 100,000).
	text := `{"model":"small","messages":[{"role":"user","content":"Explain the string ;base64, in this log: ` + strings.Repeat("word ", 8000) + `"}]}`
	if got := proxy.PromptEstimate([]byte(text), 1_000_000); got < int64(len(text)/4-10) {
		t.Errorf("a text naming ;base64, estimated at %d tokens, want about %d", got, len(text)/4)
	}
	// Nor is text after an escaped quote and a data URL's prefix, nor a
	// text part that is a data URL itself: only image, file and audio
	// fields hold payloads (109,000 tokens went through tpm 10,000).
	for name, body := range map[string]string{
		"escaped quote": `{"model":"small","messages":[{"role":"user","content":"note \"data:;base64,` + strings.Repeat("abcdefgh", 1000) + `"}]}`,
		"text data URL": `{"model":"small","messages":[{"role":"user","content":[{"type":"text","text":"data:text/plain;base64,` + strings.Repeat("QUJD", 2000) + `"}]}]}`,
	} {
		if got := proxy.PromptEstimate([]byte(body), 1_000_000); got < int64(len(body)/4-10) {
			t.Errorf("%s: estimated at %d tokens, want about %d", name, got, len(body)/4)
		}
	}
	for name, body := range map[string]string{
		"responses image": `{"model":"small","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/jpeg;base64,` + strings.Repeat("A", 40_000) + `"}]}]}`,
		"chat file":       `{"model":"small","messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"data:application/pdf;base64,` + strings.Repeat("A", 40_000) + `"}}]}]}`,
		"chat audio":      `{"model":"small","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"` + strings.Repeat("A", 40_000) + `","format":"wav"}}]}]}`,
	} {
		if got := proxy.PromptEstimate([]byte(body), 1_000_000); got > 60 {
			t.Errorf("%s: 40,000 base64 bytes estimated at %d tokens", name, got)
		}
	}
	// Nor is text written with \u escapes after a data URL's prefix.
	escaped := `{"model":"small","messages":[{"role":"user","content":"data:text/plain;base64,the` + strings.Repeat(`\u0020quick`, 4000) + `"}]}`
	if got := proxy.PromptEstimate([]byte(escaped), 1_000_000); got < int64(len(escaped)/4-10) {
		t.Errorf("escaped text after a data URL's prefix estimated at %d tokens, want about %d", got, len(escaped)/4)
	}
}

// An upstream that promises a body and closes the connection halfway is a
// 502, not a 200 carrying fasthttp's error text (what Response.Body does).
// A client that gives up on a non-streamed call while the upstream is
// still generating (an SDK's timeout) stops the upstream's work within a
// second or so, and the call is billed its prompt on estimate: it ran to
// its end and was billed in full, once per retry of the SDK, for answers
// nobody received.
// A stream queued upstream (its header sent, no event yet) likewise.
func TestClientGoneBeforeTheAnswerStopsTheCall(t *testing.T) {
	for name, body := range map[string]string{"whole": chatBody, "stream": strings.Replace(chatBody, `{`, `{"stream":true,`, 1)} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{firstByteTimeout: "20s",
				upstream: proxytest.Options{FirstByteDelay: 8 * time.Second, HeaderFlushThenDelay: name == "stream", CompletionTokens: 500}})
			refused := regexp.MustCompile(`tollgate_requests_refused_total\{endpoint="/v1/chat/completions",status="4xx"\} (\d+)`)
			refusedBefore := refused.FindStringSubmatch(scrape(t, h))
			client := &http.Client{Timeout: 1500 * time.Millisecond}
			req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+h.key)
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
				t.Fatalf("the client got %d before the upstream answered", resp.StatusCode)
			}
			gaveUp := time.Now()
			checkFor(t, 4*time.Second, 50*time.Millisecond, func() error {
				evs := h.rec.Events()
				if len(evs) == 0 {
					return fmt.Errorf("no event %s after the client gave up", time.Since(gaveUp))
				}
				if ev := evs[len(evs)-1]; ev.Status != 499 || ev.UsageSource != meter.SourceEstimated || ev.PromptTokens == 0 || ev.CompletionTokens != 0 {
					return fmt.Errorf("event %+v, want 499 billed its prompt on estimate", ev)
				}
				return nil
			})
			// Counted once in the metrics, as its event.
			if m := regexp.MustCompile(`tollgate_requests_total\{[^}]*status="499"\} (\d+)`).FindStringSubmatch(scrape(t, h)); m == nil || m[1] != "1" {
				t.Fatalf("499s counted %v, want 1", m)
			}
			// And not as a refusal of the gateway's (until 2026-11-26 it
			// was in both), which WriteError counts just after the event.
			for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if m := refused.FindStringSubmatch(scrape(t, h)); fmt.Sprint(m) != fmt.Sprint(refusedBefore) {
					t.Fatalf("refusals with status 4xx went from %v to %v", refusedBefore, m)
				}
			}
		})
	}
}

func TestNonStreamCutIs502(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	cut := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"id\":\"chatcmpl-1\",\"choices\":[")
		return false
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, cut, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", chatBody)
		body := readAll(t, resp)
		if resp.StatusCode != 502 || gjson.GetBytes(body, "error.code").Str != "upstream_response_cut" {
			return fmt.Errorf("got %d %s", resp.StatusCode, body)
		}
		return nil
	})
	before := len(h.rec.Events()) // answers the old upstream gave until the reload
	resp := h.post("/v1/chat/completions", chatBody)
	wantError(t, resp, 502, "upstream_response_cut")
	time.Sleep(50 * time.Millisecond)
	if n := len(h.rec.Events()); n != before {
		t.Fatalf("%d events for a cut answer", n-before)
	}
	// Counted in the request metrics like any other answer: the cut ones
	// were missing from them.
	if m := scrape(t, h); !strings.Contains(m, `tollgate_requests_total{model="small",upstream="local",endpoint="/v1/chat/completions",status="502"}`) {
		t.Fatalf("no 502 series in /metrics:\n%s", m)
	}
}

// An upstream's usage out of range (a buggy or hostile server) is not
// believed: the call is billed on the tokenizer's estimate, never at a
// saturated cost that would void the debits of the calls billed with it.
func TestUsageOutOfRangeIsEstimated(t *testing.T) {
	for _, prompt := range []int{4_000_000_000_000_000_000, -1000} {
		h := newHarness(t, harnessOptions{upstream: proxytest.Options{PromptTokens: prompt}})
		for _, stream := range []string{"false", "true"} {
			readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":`+stream+`,"messages":[{"role":"user","content":"one two three"}]}`))
		}
		for _, ev := range h.events(2) {
			// The answer's text is counted, streamed or not: a non-streamed
			// answer once billed 0 completion tokens.
			if ev.UsageSource != meter.SourceEstimated || ev.PromptTokens <= 0 || ev.PromptTokens > 100 || ev.CompletionTokens < 10 ||
				ev.CostNanos <= 0 || ev.CostNanos > 1_000_000 {
				t.Errorf("upstream reported %d prompt tokens; event %+v", prompt, ev)
			}
		}
	}
}

// A usage object without numeric counts ({}, only a total, strings) is
// no report: the call is estimated, on chat and responses, streamed or
// not. Read as 0 and 0 it was billed nothing, marked as the upstream's.
func TestUsageWithoutCountsIsEstimated(t *testing.T) {
	for _, raw := range []string{`{}`, `{"total_tokens":5000}`, `{"prompt_tokens":"abc","completion_tokens":"x"}`} {
		h := newHarness(t, harnessOptions{upstream: proxytest.Options{RawUsage: raw}})
		for _, stream := range []string{"false", "true"} {
			readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":`+stream+`,"stream_options":null,"messages":[{"role":"user","content":"one two three"}]}`))
			readAll(t, h.post("/v1/responses", `{"model":"small","stream":`+stream+`,"input":"one two three"}`))
		}
		for _, ev := range h.events(4) {
			if ev.UsageSource != meter.SourceEstimated || ev.PromptTokens <= 0 || ev.CompletionTokens < 10 || ev.CostNanos <= 0 {
				t.Errorf("upstream reported usage %s; %s event %+v", raw, ev.Endpoint, ev)
			}
		}
	}
}

// A long chat stream without usage is estimated on all the text it
// forwarded: past 4 MiB of chunk JSON the later chunks were dropped, and
// a stream of any length was billed at most about 27,000 tokens.
func TestLongStreamWithoutUsageCountsEveryChunk(t *testing.T) {
	const words = 40_000 // about 7 MiB of chunks
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: words, OmitUsage: true, NoRecord: true}})
	body := readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}]}`))
	var text strings.Builder
	chunks := 0
	for _, data := range sseEvents(body) {
		if c := gjson.Get(strings.TrimPrefix(data, "data: "), "choices.0.delta.content"); c.Str != "" {
			text.WriteString(c.Str)
			chunks++
		}
	}
	if chunks != words {
		t.Fatalf("%d content chunks relayed, want %d", chunks, words)
	}
	ev := h.events(1)[0]
	if want := int64(tokens.Count(text.String())); ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens != want {
		t.Fatalf("a stream of %d chunks, %d tokens of text, billed %d completion tokens (%s)", words, want, ev.CompletionTokens, ev.UsageSource)
	}
}

// A shutdown that can wait no longer ends the streams still open as an
// upstream cut would: the client gets the error event, and the call is
// billed on estimated usage. Dropped with the process they went unbilled
// (found by a black-box session upgrading a gateway under load).
func TestCutStreamsEndsAndBillsOpenStreams(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 50, ChunkDelay: 100 * time.Millisecond}, idleTimeout: "30s"})
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}]}`)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for range 3 { // three events have come
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if n := h.gw.CutStreams(); n != 1 {
		t.Fatalf("CutStreams ended %d streams, want 1", n)
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("the cut stream did not end cleanly: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the stream ended %s after the cut", took)
	}
	evs := sseEvents(rest)
	last := evs[len(evs)-1]
	// Typed as the gateway's own 503s: upstream_error blamed the provider.
	if !strings.Contains(last, `"code":"stream_interrupted"`) || !strings.Contains(last, "shutting down") || errorEventType(last) != "service_unavailable_error" {
		t.Fatalf("last event %q", last)
	}
	ev := h.events(1)[0]
	if ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens < 1 || ev.PromptTokens < 3 || ev.CostNanos <= 0 {
		t.Fatalf("event %+v", ev)
	}
}

// A revoked key's open streams end at once with the error event, billed
// on estimated usage; another key's stream goes on. They went on to their
// end, billed to the account, for as long as the upstream generated.
func TestRevokedKeysStreamsEnd(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 30, ChunkDelay: 100 * time.Millisecond}, idleTimeout: "30s"})
	other := h.g.CreateKey("acme", accounts.KeyRequest{Name: "other"})
	open := func(key string) *bufio.Reader {
		resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}]}`, key)
		t.Cleanup(func() { resp.Body.Close() })
		br := bufio.NewReader(resp.Body)
		for range 6 { // three events have come
			if _, err := br.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		return br
	}
	revoked, kept := open(h.key), open(other)
	keyID := h.keyID(t)
	start := time.Now()
	if _, err := h.svc.RevokeKey(context.Background(), keyID); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(revoked)
	if err != nil {
		t.Fatalf("the revoked key's stream did not end cleanly: %v", err)
	}
	if took := time.Since(start); took > time.Second { // the stream lasts 3 s
		t.Fatalf("the revoked key's stream ended %s after the revocation", took)
	}
	evs := sseEvents(rest)
	// Typed as a revoked key's 401: upstream_error blamed the provider.
	if last := evs[len(evs)-1]; !strings.Contains(last, `"code":"stream_interrupted"`) || !strings.Contains(last, "revoked") || errorEventType(last) != "authentication_error" {
		t.Fatalf("last event %q", last)
	}
	ev := h.events(1)[0]
	if ev.KeyID != keyID || ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens < 1 || ev.CostNanos <= 0 {
		t.Fatalf("event %+v", ev)
	}
	if body, err := io.ReadAll(kept); err != nil || !strings.Contains(string(body), "data: [DONE]") {
		t.Fatalf("another key's stream: %v, ends %q", err, body[max(len(body)-100, 0):])
	}
	// Not counted as the upstream cutting a stream.
	if m := scrape(t, h); !strings.Contains(m, `tollgate_requests_interrupted_total{model="small",upstream="local",endpoint="/v1/chat/completions",status="200"} 0`) {
		t.Fatalf("the revoked key's stream counted as interrupted by the upstream:\n%s", m)
	}
}

// A key revoked while its stream waits for the upstream's first event:
// when that event comes, none of the answer has gone out, and the call is
// answered the 401 of a revoked key, billed as a call whose client left
// before the answer's first byte (the prompt, estimated, and the request
// price: the upstream took it). It was added to the open streams only
// after the revocation had looked for them, and ran to its end, billed in
// full (found by a black-box session); then it was a 200 carrying only
// the stream_interrupted event.
func TestRevokedKeysStreamWaitingForItsFirstEventEnds(t *testing.T) {
	revokeWhileWaitingForTheFirstEvent(t, proxytest.Options{Chunks: 30, ChunkDelay: 100 * time.Millisecond, FirstByteDelay: time.Second})
}

// The same with an answer that comes whole in one read: addStream closed
// the upstream connection, but the answer was in the read buffer already,
// and the relay went on through it to [DONE], billed in full on the
// upstream's usage (found by a re-test session, 3 streams of 6). Nothing
// of it is relayed.
func TestRevokedKeysOneReadAnswerEnds(t *testing.T) {
	revokeWhileWaitingForTheFirstEvent(t, proxytest.Options{Chunks: 5, OneWrite: true, FirstByteDelay: time.Second})
}

func revokeWhileWaitingForTheFirstEvent(t *testing.T, upstream proxytest.Options) {
	h := newHarness(t, harnessOptions{upstream: upstream, idleTimeout: "30s"})
	for i, path := range []string{"/v1/chat/completions", "/v1/responses"} {
		// The upstream may still count the call cut before: the wait for
		// it to take this one would end at once, and the key be revoked
		// before this call was admitted (a 401, not a cut stream).
		checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			if n := h.up.Active(); n != 0 {
				return fmt.Errorf("the upstream still serves %d calls", n)
			}
			return nil
		})
		info, key, err := h.svc.CreateKey(t.Context(), "acme", accounts.KeyRequest{Name: "revoked-while-waiting"})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.svc.WaitSynced(t.Context()); err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", h.url+path, strings.NewReader(`{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}],"input":"one two three"}`))
		req.Header.Set("Authorization", "Bearer "+key)
		answered := make(chan *http.Response, 1)
		go func() {
			resp, err := h.client.Do(req)
			if err != nil {
				t.Error(err)
			}
			answered <- resp
		}()
		checkFor(t, 2*time.Second, 10*time.Millisecond, func() error {
			if h.up.Active() == 0 {
				return errors.New("the upstream has not taken the call yet")
			}
			return nil
		})
		if _, err := h.svc.RevokeKey(t.Context(), info.KeyID); err != nil {
			t.Fatal(err)
		}
		resp := <-answered
		if resp == nil {
			t.FailNow()
		}
		// As a call made with the key now is answered.
		if e := wantError(t, resp, 401, "INVALID_API_KEY"); e["message"] != "invalid API key: revoked" || e["type"] != "authentication_error" {
			t.Fatalf("%s: %v", path, e)
		}
		ev := h.events(i + 1)[i]
		if ev.KeyID != info.KeyID || ev.Status != 401 || ev.UsageSource != meter.SourceEstimated || ev.PromptTokens < 1 || ev.CompletionTokens != 0 || ev.CostNanos <= 0 {
			t.Fatalf("%s: event %+v, want the prompt estimated, no completion", path, ev)
		}
	}
}

// A client that stopped reading keeps its relay blocked in a write, which
// the upstream's cut does not end: its connection is closed, and the call
// is recorded then (found by a session re-testing the shutdown cut).
func TestDropStreamClientsRecordsAStalledClient(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 200000}, idleTimeout: "30s"})
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	body := `{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", h.key, len(body), body)
	if _, err := io.ReadFull(conn, make([]byte, 300)); err != nil {
		t.Fatal(err)
	}
	// The client reads no more; the relay fills the socket and blocks.
	// The gateway's send buffer grows to 4 MiB (tcp_wmem) first: under
	// the race detector, on two busy cores, half a second was once not
	// enough to fill it, and the cut stream then ended and was recorded.
	time.Sleep(3 * time.Second)
	if n := h.gw.CutStreams(); n != 1 {
		t.Fatalf("CutStreams ended %d streams, want 1", n)
	}
	time.Sleep(300 * time.Millisecond)
	if n := len(h.rec.Events()); n != 0 {
		t.Fatalf("%d events before the client was dropped: the relay was not blocked, the test proves nothing", n)
	}
	if n := h.gw.DropStreamClients(); n != 1 {
		t.Fatalf("DropStreamClients closed %d, want 1", n)
	}
	ev := h.events(1)[0]
	if ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens < 100 {
		t.Fatalf("event %+v", ev)
	}
}

// resettingUpstream answers every request with a chunked SSE stream of
// events, then resets the connection (RST, not FIN), as a crashed or
// restarted upstream process does. It returns its base URL.
func resettingUpstream(t *testing.T, events ...string) string {
	t.Helper()
	return proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		writeSSE(c, events...)
		time.Sleep(50 * time.Millisecond) // the events are read before the reset
		_ = c.(*net.TCPConn).SetLinger(0)
		return false
	})
}

// writeSSE writes a chunked SSE response header and each event as a chunk.
func writeSSE(c net.Conn, events ...string) {
	fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	for _, ev := range events {
		writeChunk(c, ev)
	}
}

func writeChunk(c net.Conn, s string) { fmt.Fprintf(c, "%x\r\n%s\r\n", len(s), s) }

func chatChunk(content, finish string) string {
	fr := "null"
	if finish != "" {
		fr = `"` + finish + `"`
	}
	return `data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` +
		content + `"},"finish_reason":` + fr + "}]}\n\n"
}

// An upstream that resets the connection after the answer's last event
// instead of sending [DONE] has given the whole answer: the client must
// not get stream_interrupted (the SDKs raise it, and a retry pays again),
// and the call is billed on the usage the upstream sent. Cut before that,
// the error event says why without the sockets' addresses.
func TestStreamResetAfterFinishIsComplete(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	usage := `data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}` + "\n\n"
	complete := resettingUpstream(t, chatChunk("Hello", ""), chatChunk(" there", "stop"), usage)
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, complete, 1))
	body := `{"model":"small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		got := string(readAll(t, h.post("/v1/chat/completions", body)))
		if !strings.Contains(got, `"completion_tokens":2`) || strings.Contains(got, "error") {
			return fmt.Errorf("got %s", got)
		}
		return nil
	})
	evs := h.events(1)
	if ev := evs[len(evs)-1]; ev.UsageSource != meter.SourceUpstream || ev.PromptTokens != 7 || ev.CompletionTokens != 2 {
		t.Errorf("event %+v, want the upstream's usage", ev)
	}

	cut := resettingUpstream(t, chatChunk("Hello", ""))
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), complete, cut, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		got := string(readAll(t, h.post("/v1/chat/completions", body)))
		if !strings.Contains(got, `"code":"stream_interrupted"`) {
			return fmt.Errorf("got %s", got)
		}
		if strings.Contains(got, "127.0.0.1") || !strings.Contains(got, "connection reset by peer") {
			t.Errorf("the error event should say why, not where the upstream lives: %s", got)
		}
		return nil
	})
}

// scriptedUpstream answers every request with a chunked SSE stream of
// parts, sleeping pause between them, then holds the connection open
// until the test ends. It returns its base URL.
func scriptedUpstream(t *testing.T, pause time.Duration, parts ...string) string {
	t.Helper()
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	return proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		writeSSE(c)
		for _, p := range parts {
			writeChunk(c, p)
			time.Sleep(pause)
		}
		<-done
		return false
	})
}

// A comment sent while a request waits in an upstream's queue (":
// OPENROUTER PROCESSING") is not the answer's first byte: an upstream
// that stalls after one has answered nothing, and the call fails over
// (here, with one upstream, is a 503) instead of a 200 cut by an error
// event and billed its prompt. A comment before the events is dropped.
func TestStreamCommentIsNotTheFirstByte(t *testing.T) {
	h := newHarness(t, harnessOptions{firstByteTimeout: "300ms"})
	body := `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	stalls := scriptedUpstream(t, 0, ": OPENROUTER PROCESSING\n\n")
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, stalls, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", body)
		got := readAll(t, resp)
		if resp.StatusCode != 503 || !strings.Contains(string(got), "first_byte_timeout") {
			return fmt.Errorf("got %d %s", resp.StatusCode, got)
		}
		return nil
	})
	if evs := h.rec.Events(); len(evs) != 0 {
		t.Errorf("a stream that sent only a comment was billed: %+v", evs[0])
	}

	// Comments that keep coming do not move the deadline: one a tenth of
	// a second for 3 s once held the call the whole 3 s (and, sent
	// forever, for ever).
	var chatty []string
	for range 30 {
		chatty = append(chatty, ": OPENROUTER PROCESSING\n\n")
	}
	keepsTalking := scriptedUpstream(t, 100*time.Millisecond, append(chatty, chatChunk("late", "stop"), "data: [DONE]\n\n")...)
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), stalls, keepsTalking, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		began := time.Now()
		resp := h.post("/v1/chat/completions", body)
		got := readAll(t, resp)
		if resp.StatusCode != 503 || !strings.Contains(string(got), "first_byte_timeout") {
			return fmt.Errorf("got %d %s", resp.StatusCode, got)
		}
		if took := time.Since(began); took > 2*time.Second {
			t.Fatalf("comments every 100 ms held the call %v; first_byte_timeout is 300ms", took)
		}
		return nil
	})

	answers := scriptedUpstream(t, 100*time.Millisecond, ": OPENROUTER PROCESSING\n\n", ": still\n\n",
		chatChunk("Hello", "stop"), "data: [DONE]\n\n")
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), keepsTalking, answers, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", body)
		got := string(readAll(t, resp))
		if resp.StatusCode != 200 || !strings.Contains(got, `"content":"Hello"`) || !strings.HasSuffix(got, "data: [DONE]\n\n") {
			return fmt.Errorf("got %d %s", resp.StatusCode, got)
		}
		if strings.Contains(got, "OPENROUTER") {
			t.Errorf("the comment was relayed: %s", got)
		}
		return nil
	})
}

// The gateway asks upstreams for an uncompressed answer, and refuses one
// compressed anyway (it reads the usage and relays the bytes as they are):
// the client got gzip bytes labelled JSON, billed on the prompt alone.
func TestCompressedUpstreamAnswerIsRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	const chat = `{"model":"small","messages":[{"role":"user","content":"hi"}]}`
	readAll(t, h.post("/v1/chat/completions", chat))
	if ae := h.up.Requests()[0].Header.Get("Accept-Encoding"); ae != "identity" {
		t.Fatalf("upstream request Accept-Encoding %q, want identity", ae)
	}
	h.events(1)
	gzipped := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write([]byte(`{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":5,"total_tokens":16}}`))
		zw.Close()
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n", b.Len())
		c.Write(b.Bytes())
		return true
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, gzipped, 1))
	env := wantError(t, h.post("/v1/chat/completions", chat), 503, "upstream_unavailable")
	if msg, _ := env["message"].(string); !strings.Contains(msg, "Content-Encoding") {
		t.Fatalf("503 does not say why: %q", msg)
	}
	time.Sleep(50 * time.Millisecond)
	if n := len(h.rec.Events()); n != 1 {
		t.Fatalf("%d events, want only the first call's", n)
	}
}

// A Content-Type of server-sent events is told in any case and with
// parameters: "Text/Event-Stream; charset=utf-8" was relayed as one whole
// body at the end, and billed on an estimate.
func TestEventStreamContentTypeInAnyCase(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	usage := `data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}` + "\n\n"
	up := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: Text/Event-Stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n")
		for _, ev := range []string{chatChunk("Hello", ""), chatChunk(" there", "stop"), usage, "data: [DONE]\n\n"} {
			writeChunk(c, ev)
		}
		fmt.Fprint(c, "0\r\n\r\n")
		return true
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, up, 1))
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	body := readAll(t, resp)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(strings.ToLower(ct), "text/event-stream") || strings.Contains(string(body), `"usage":{`) {
		t.Fatalf("relayed as %q: %s", ct, body)
	}
	if ev := h.events(1)[0]; ev.UsageSource != meter.SourceUpstream || ev.PromptTokens != 7 || ev.CompletionTokens != 2 {
		t.Fatalf("event %+v, want the upstream's usage", ev)
	}
}

// The usage chunk the gateway asked for on the client's behalf is dropped
// only when it holds nothing else: llama.cpp moves its timings onto it
// when usage is asked for, and they were lost. Its usage still goes.
func TestUsageChunkWithMoreThanUsageIsRelayedWithoutIt(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	usage := `data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9},"timings":{"prompt_n":7,"predicted_n":2}}` + "\n\n"
	up := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		writeSSE(c, chatChunk("Hello", ""), chatChunk(" there", "stop"), usage, "data: [DONE]\n\n")
		fmt.Fprint(c, "0\r\n\r\n")
		return true
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, up, 1))
	body := string(readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`)))
	if !strings.Contains(body, `"timings":{"prompt_n":7,"predicted_n":2}`) || strings.Contains(body, `"usage"`) {
		t.Fatalf("relayed %s", body)
	}
	if ev := h.events(1)[0]; ev.UsageSource != meter.SourceUpstream || ev.PromptTokens != 7 {
		t.Fatalf("event %+v", ev)
	}
}

// closingUpstream answers with an SSE body that ends when the connection
// closes (no Content-Length, not chunked), as an HTTP/1.0 server's does:
// body is written, then the connection is closed cleanly. It returns its
// base URL.
func closingUpstream(t *testing.T, body string) string {
	t.Helper()
	return proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"+body)
		return false
	})
}

// A stream whose body ends on close, cut inside an event: the client got
// the event's first bytes and then the gateway's error event on the same
// line (`data: {"id":"chatcmpl-abc123","object":"chat.compdata:
// {"error":…}`), and the SDKs failed to parse it instead of raising
// stream_interrupted. The partial event is not relayed now, as when a
// chunked body is cut, nor billed.
func TestStreamCutMidEventOnCloseEndsWithTheErrorEvent(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	url := h.up.URL
	for _, tc := range []struct{ path, request, stream string }{
		{"/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			chatChunk("Hello", "") + `data: {"id":"chatcmpl-abc123","object":"chat.comp`},
		{"/v1/responses", `{"model":"small","stream":true,"input":"hi"}`,
			"event: response.output_text.delta\ndata: " + `{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello"}` + "\n\n" +
				"event: response.output_text.delta\ndata: " + `{"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_1","output_index":0,"content_index":0,"delta":" there`},
	} {
		cut := closingUpstream(t, tc.stream)
		h.writeConfig(strings.Replace(readFile(t, h.cfgPath), url, cut, 1))
		url = cut
		var events []string
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
			got := readAll(t, h.post(tc.path, tc.request))
			if !strings.Contains(string(got), `"code":"stream_interrupted"`) {
				return fmt.Errorf("got %s", got)
			}
			events = sseEvents(got)
			return nil
		})
		if len(events) != 2 {
			t.Fatalf("%s: %d events, want the whole one and the error: %q", tc.path, len(events), events)
		}
		for _, ev := range events {
			var data string
			for line := range strings.SplitSeq(ev, "\n") {
				if d, ok := strings.CutPrefix(line, "data: "); ok {
					data += d
				}
			}
			if !json.Valid([]byte(data)) {
				t.Errorf("%s: an event the SDKs cannot parse: %q", tc.path, ev)
			}
		}
		if !strings.Contains(events[1], "stream_interrupted") {
			t.Errorf("%s: the last event is not the error: %q", tc.path, events[1])
		}
		evs := h.events(len(h.rec.Events()))
		if ev := evs[len(evs)-1]; ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens != 1 {
			t.Errorf("%s: billed %+v, want the one token relayed, estimated", tc.path, ev)
		}
	}
}

// A cut Responses stream of a reasoning summary and a function call was
// billed the call's arguments only: the name, which comes whole in
// response.output_item.added, and the summary's deltas were left out of
// the estimate, though the client got them (found by a black-box session).
func TestCutResponsesStreamBillsToolNamesAndSummaries(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	event := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	stream := event("response.output_item.added", `{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}`) +
		event("response.reasoning_summary_text.delta", `{"type":"response.reasoning_summary_text.delta","sequence_number":2,"item_id":"rs_1","output_index":0,"summary_index":0,"delta":"The user wants the weather"}`) +
		event("response.reasoning_summary_text.delta", `{"type":"response.reasoning_summary_text.delta","sequence_number":3,"item_id":"rs_1","output_index":0,"summary_index":0,"delta":" in Paris."}`) +
		event("response.output_item.added", `{"type":"response.output_item.added","sequence_number":4,"output_index":1,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"call_1","name":"get_current_weather"}}`) +
		event("response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","sequence_number":5,"item_id":"fc_1","output_index":1,"delta":"{\"city\":"}`) +
		event("response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","sequence_number":6,"item_id":"fc_1","output_index":1,"delta":"\"Paris\"}"}`)
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, closingUpstream(t, stream), 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if got := readAll(t, h.post("/v1/responses", `{"model":"small","stream":true,"input":"weather in Paris?"}`)); !strings.Contains(string(got), `"code":"stream_interrupted"`) {
			return fmt.Errorf("got %s", got)
		}
		return nil
	})
	evs := h.events(len(h.rec.Events()))
	want := int64(tokens.Count(`The user wants the weather in Paris.get_current_weather{"city":"Paris"}`))
	if ev := evs[len(evs)-1]; ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens != want {
		t.Fatalf("billed %+v; want the %d tokens of the summary, name and arguments relayed, estimated", ev, want)
	}
}

// A cut Responses stream of a function call whose arguments came whole,
// in its output_item.added or in function_call_arguments.done, without
// deltas, was billed its name only, though the client got the arguments
// too (found by a black-box session). Arguments that came as deltas are
// not counted again when done repeats them.
func TestCutResponsesStreamBillsArgumentsThatCameWhole(t *testing.T) {
	event := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	added := func(args string) string {
		return event("response.output_item.added", `{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"`+args+`","call_id":"call_1","name":"get_current_weather"}}`)
	}
	delta := func(seq int, d string) string {
		return event("response.function_call_arguments.delta", fmt.Sprintf(`{"type":"response.function_call_arguments.delta","sequence_number":%d,"item_id":"fc_1","output_index":0,"delta":"%s"}`, seq, d))
	}
	const args = `{\"city\":\"Paris\",\"unit\":\"celsius\"}`
	done := event("response.function_call_arguments.done", `{"type":"response.function_call_arguments.done","sequence_number":4,"item_id":"fc_1","output_index":0,"arguments":"`+args+`"}`) +
		event("response.output_item.done", `{"type":"response.output_item.done","sequence_number":5,"output_index":0,"item":{"id":"fc_1","type":"function_call","status":"completed","arguments":"`+args+`","call_id":"call_1","name":"get_current_weather"}}`)
	want := int64(tokens.Count(`get_current_weather{"city":"Paris","unit":"celsius"}`))
	for _, tc := range []struct{ name, stream string }{
		{"whole in output_item.added", added(args) + done},
		{"whole in function_call_arguments.done", added("") + done},
		{"in deltas, repeated by done", added("") + delta(2, `{\"city\":\"Paris\",`) + delta(3, `\"unit\":\"celsius\"}`) + done},
		{"partly in deltas", added("") + delta(2, `{\"city\":\"Paris\",`) + done},
	} {
		h := newHarness(t, harnessOptions{})
		h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, closingUpstream(t, tc.stream), 1))
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
			if got := readAll(t, h.post("/v1/responses", `{"model":"small","stream":true,"input":"weather in Paris?"}`)); !strings.Contains(string(got), `"code":"stream_interrupted"`) {
				return fmt.Errorf("got %s", got)
			}
			return nil
		})
		evs := h.events(len(h.rec.Events()))
		if ev := evs[len(evs)-1]; ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens != want {
			t.Errorf("%s: billed %+v; want the %d tokens of the name and arguments relayed, estimated", tc.name, ev, want)
		}
	}
}

// A cut Responses stream of a custom tool's call or an MCP tool's was
// billed none of it: their names, a custom tool's input (its
// custom_tool_call_input deltas and done) and an MCP call's arguments
// (mcp_call_arguments) were left out of the estimate, which counted only
// function calls. They count as a function call's do, each part once
// however it came; an MCP call's output, which the hosted tool wrote and
// the model reads, counts as prompt. A call whose input came only in its
// output_item.done counts too.
func TestCutResponsesStreamBillsCustomAndMCPToolCalls(t *testing.T) {
	event := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	item := func(typ, status, item string) string {
		return event("response.output_item."+typ, `{"type":"response.output_item.`+typ+`","output_index":0,"item":{"id":"ct_1","status":"`+status+`",`+item+`}}`)
	}
	delta := func(typ, d string) string {
		return event(typ, `{"type":"`+typ+`","item_id":"ct_1","output_index":0,"delta":"`+d+`"}`)
	}
	const input = `*** Begin Patch\n*** Update File: main.go\n+fmt.Println(\"hi\")\n*** End Patch`
	custom := func(in string) string {
		return `"type":"custom_tool_call","call_id":"call_1","name":"apply_patch","input":"` + in + `"`
	}
	customDone := event("response.custom_tool_call_input.done", `{"type":"response.custom_tool_call_input.done","item_id":"ct_1","output_index":0,"input":"`+input+`"}`)
	const args = `{\"repo\":\"tollgate\",\"query\":\"usage estimate\"}`
	mcp := func(a, output string) string {
		return `"type":"mcp_call","server_label":"github","name":"search_code","arguments":"` + a + `","output":` + output
	}
	mcpDone := event("response.mcp_call_arguments.done", `{"type":"response.mcp_call_arguments.done","item_id":"ct_1","output_index":0,"arguments":"`+args+`"}`)
	const output = `main.go:12: func (c *call) estimate() int64`
	function := func(a string) string {
		return `"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"` + a + `"`
	}
	unquoted := strings.NewReplacer(`\"`, `"`, `\n`, "\n").Replace
	var request int64 // the prompt tokens of the request alone
	for _, tc := range []struct {
		name, stream, completion, toolOutput string
	}{
		{"custom, input in deltas repeated by done and output_item.done",
			item("added", "in_progress", custom("")) + delta("response.custom_tool_call_input.delta", input[:20]) + delta("response.custom_tool_call_input.delta", input[20:]) +
				customDone + item("done", "completed", custom(input)),
			"apply_patch" + input, ""},
		{"custom, input whole in custom_tool_call_input.done", item("added", "in_progress", custom("")) + customDone, "apply_patch" + input, ""},
		{"custom, input whole in output_item.done", item("added", "in_progress", custom("")) + item("done", "completed", custom(input)), "apply_patch" + input, ""},
		{"custom, only output_item.done", item("done", "completed", custom(input)), "apply_patch" + input, ""},
		{"MCP, arguments in deltas, then the output",
			item("added", "in_progress", mcp("", "null")) + delta("response.mcp_call_arguments.delta", args[:12]) + delta("response.mcp_call_arguments.delta", args[12:]) +
				mcpDone + item("done", "completed", mcp(args, `"`+output+`"`)),
			"search_code" + args, output},
		{"MCP, arguments whole in mcp_call_arguments.done, cut before the output", item("added", "in_progress", mcp("", "null")) + mcpDone, "search_code" + args, ""},
		{"function, arguments whole in output_item.done", item("added", "in_progress", function("")) + item("done", "completed", function(args)), "get_weather" + args, ""},
	} {
		h := newHarness(t, harnessOptions{})
		h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, closingUpstream(t, tc.stream), 1))
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
			if got := readAll(t, h.post("/v1/responses", `{"model":"small","stream":true,"input":"fix it"}`)); !strings.Contains(string(got), `"code":"stream_interrupted"`) {
				return fmt.Errorf("got %s", got)
			}
			return nil
		})
		evs := h.events(len(h.rec.Events()))
		ev := evs[len(evs)-1]
		if request == 0 { // the first case's stream has no tool output
			request = ev.PromptTokens
		}
		want, prompt := int64(tokens.Count(unquoted(tc.completion))), request+int64(tokens.Count(tc.toolOutput))
		if ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens != want || ev.PromptTokens != prompt {
			t.Errorf("%s: billed %d prompt and %d completion tokens (%s); want %d and %d, estimated", tc.name, ev.PromptTokens, ev.CompletionTokens, ev.UsageSource, prompt, want)
		}
	}
}

// With a big catalog the 400 for an unknown model names its first 20
// models, in GET /v1/models's order, and how many more: with 500 it was
// 6 KB of ids.
func TestUnknownModelOfABigCatalogNamesTwentyModels(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	cfg := readFile(t, h.cfgPath)
	for i := range 23 {
		cfg += fmt.Sprintf("  - {id: m%02d, upstream: local, upstream_model: proxytest-small, context_length: 1000, max_output_length: 100}\n", i)
	}
	h.writeConfig(cfg)
	checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
		resp, err := h.client.Get(h.url + "/v1/models")
		if err != nil {
			return err
		}
		if body := string(readAll(t, resp)); !strings.Contains(body, `"m22"`) {
			return fmt.Errorf("the big catalog is not in force yet: %s", body)
		}
		return nil
	})
	e := wantError(t, h.post("/v1/chat/completions", `{"model":"gpt-4o","messages":[]}`), 400, "invalid_request_error")
	want := `the model "gpt-4o" does not exist or is not allowed; valid models: small, large, m00, m01, m02, m03, m04, m05, m06, m07, m08, m09, m10, m11, m12, m13, m14, m15, m16, m17 … and 5 more (GET /v1/models lists the catalog)`
	if msg := e["message"].(string); msg != want {
		t.Fatalf("400 for an unknown model of 25:\n got %s\nwant %s", msg, want)
	}
}
