package proxy_test

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy"
)

// jsonUpstream answers every request with status 200 and body as
// application/json, counting the requests in asked.
func jsonUpstream(t *testing.T, body string, asked *atomic.Int32) string {
	t.Helper()
	return proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		asked.Add(1)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		return true
	})
}

// A 200 whose body is an OpenAI error object, not an answer, is the
// upstream failing the call: relayed as it was, the client got a 200
// (to a stream, an SDK read an empty stream that succeeded) and the
// call was billed its prompt and per-request price. It is a 502
// upstream_bad_answer with the upstream's message, unbilled, and
// another member of the pool is tried first.
func TestSuccessStatusWithAnErrorBodyIsNoAnswer(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin")
	var asked atomic.Int32
	overloaded := jsonUpstream(t, `{"error":{"message":"model overloaded","type":"server_error","param":null,"code":null}}`, &asked)
	cfg := readFile(t, h.cfgPath)
	h.writeConfig(strings.Replace(strings.Replace(cfg, h.ups[0].URL, overloaded, 1), "upstreams: [p0, p1]", "upstreams: [p0]", 1))
	for _, body := range []string{
		`{"model":"small","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		awaitBadAnswer(t, h.harness, "/v1/chat/completions", body, "model overloaded")
	}
	time.Sleep(100 * time.Millisecond) // an event would be recorded before the answer went out
	if evs := h.rec.Events(); len(evs) != 0 {
		t.Fatalf("an error answered with 200 was billed: %+v", evs[0])
	}

	// In a pool, the next member answers; only that answer is billed.
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), "upstreams: [p0]", "upstreams: [p0, p1]", 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		before := asked.Load()
		for range 2 { // round robin: one of the two starts at p0
			resp := h.post("/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`)
			got := string(readAll(t, resp))
			if resp.StatusCode != 200 || !strings.Contains(got, `"choices"`) {
				return fmt.Errorf("got %d %s", resp.StatusCode, got)
			}
		}
		if asked.Load() == before {
			return fmt.Errorf("p0 was not asked: the pool is not in force yet")
		}
		return nil
	})
	for _, ev := range h.rec.Events() {
		if ev.Upstream != "p1" {
			t.Errorf("billed an answer of %s: %+v", ev.Upstream, ev)
		}
	}

	// An error that blames the request is not the upstream's failure,
	// and another upstream would answer it the same: not retried, and the
	// SDKs are told not to retry it either. It is the 400 it means, with
	// the upstream's type and code, which clients branch on: as a 502
	// upstream_bad_answer the code was lost.
	tooLong := jsonUpstream(t, `{"error":{"message":"This model's maximum context length is 1000 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}`, &asked)
	cfg = readFile(t, h.cfgPath)
	h.writeConfig(strings.Replace(strings.Replace(cfg, overloaded, tooLong, 1), "upstreams: [p0, p1]", "upstreams: [p0]", 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`)
		got := string(readAll(t, resp))
		if resp.StatusCode != 400 || !strings.Contains(got, "maximum context length") || resp.Header.Get("x-should-retry") != "false" ||
			!strings.Contains(got, `"type":"invalid_request_error"`) || !strings.Contains(got, `"code":"context_length_exceeded"`) {
			return fmt.Errorf("got %d (x-should-retry %q) %s", resp.StatusCode, resp.Header.Get("x-should-retry"), got)
		}
		return nil
	})

	// A rate limit is a 429 and blames no upstream's health either: taken
	// for a server error, it was counted as the upstream's failure.
	limited := jsonUpstream(t, `{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}`, &asked)
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), tooLong, limited, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`)
		got := string(readAll(t, resp))
		if resp.StatusCode != 429 || !strings.Contains(got, `"code":"rate_limit_exceeded"`) {
			return fmt.Errorf("got %d %s", resp.StatusCode, got)
		}
		return nil
	})
	if st := h.statuses()["p0"]; strings.Contains(st.LastError, "slow down") {
		t.Fatalf("a rate limit counted against the upstream: %+v", st)
	}

	// A failed response carries an error and its output: it is an
	// answer, passed on as it came.
	failed := `{"id":"resp_1","object":"response","status":"failed","error":{"code":"server_error","message":"boom"},"output":[],"usage":{"input_tokens":3,"output_tokens":0,"total_tokens":3}}`
	failedResponse := jsonUpstream(t, failed, &asked)
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), limited, failedResponse, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/responses", `{"model":"small","input":"hi","store":false}`)
		got := string(readAll(t, resp))
		if resp.StatusCode != 200 || got != failed {
			return fmt.Errorf("got %d %s", resp.StatusCode, got)
		}
		return nil
	})
}

// An upstream that streams without a Content-Type: the stream was
// buffered whole, the client waiting the whole generation, then refused
// as a 502 quoting a "text/plain; charset=utf-8" the upstream never
// sent. A body that begins as a stream does is relayed as one; another
// body without a Content-Type is refused saying there was none.
func TestStreamWithoutContentType(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	body := `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	events := chatChunk("Hello", "stop") + "data: [DONE]\n\n"
	bare := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
		writeChunk(c, events)
		fmt.Fprint(c, "0\r\n\r\n")
		return true
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, bare, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", body)
		got := string(readAll(t, resp))
		if resp.StatusCode != 200 || got != events || resp.Header.Get("Content-Type") != "text/event-stream" {
			return fmt.Errorf("got %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), got)
		}
		return nil
	})
	h.events(1)

	text := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
		return true
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), bare, text, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", body)
		got := string(readAll(t, resp))
		if resp.StatusCode != 502 || !strings.Contains(got, "(no Content-Type, 5 bytes)") {
			return fmt.Errorf("got %d %s", resp.StatusCode, got)
		}
		return nil
	})

	// A whole JSON answer with no Content-Type is passed on labelled
	// JSON: relayed with none, the Node SDK returned it as a string.
	answer := `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	untyped := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
		return true
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), text, untyped, 1))
	whole := `{"model":"small","messages":[{"role":"user","content":"hi"}]}`
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", whole)
		got := string(readAll(t, resp))
		if resp.StatusCode != 200 || got != answer || resp.Header.Get("Content-Type") != "application/json" {
			return fmt.Errorf("got %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), got)
		}
		return nil
	})
}

// A stream whose first event is an error and no answer is the same
// failure as such a whole body: relayed, the client got a 200 stream of
// one error event, and the call was billed its prompt and recorded as a
// 200. An error that blames the request is that error, unbilled; one of
// the upstream's own goes to the next member.
func TestStreamWhoseFirstEventIsAnErrorIsNoAnswer(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin")
	errorStream := func(event string) string {
		return proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
			body := "data: " + event + "\n\ndata: [DONE]\n\n"
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			return true
		})
	}
	stream := `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	tooLong := errorStream(`{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`)
	cfg := readFile(t, h.cfgPath)
	h.writeConfig(strings.Replace(strings.Replace(cfg, h.ups[0].URL, tooLong, 1), "upstreams: [p0, p1]", "upstreams: [p0]", 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", stream)
		got := string(readAll(t, resp))
		if resp.StatusCode != 400 || !strings.Contains(got, `"code":"context_length_exceeded"`) || !strings.Contains(got, `"param":"messages"`) {
			return fmt.Errorf("got %d %s", resp.StatusCode, got)
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond) // an event would be recorded before the answer went out
	if evs := h.rec.Events(); len(evs) != 0 {
		t.Fatalf("a stream of one error event was billed: %+v", evs[0])
	}

	overloaded := errorStream(`{"error":{"message":"model overloaded","type":"server_error"}}`)
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), tooLong, overloaded, 1))
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), "upstreams: [p0]", "upstreams: [p0, p1]", 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		for range 2 { // round robin: one of the two starts at p0
			resp := h.post("/v1/chat/completions", stream)
			got := string(readAll(t, resp))
			if resp.StatusCode != 200 || !strings.Contains(got, `"choices"`) || strings.Contains(got, "overloaded") {
				return fmt.Errorf("got %d %s", resp.StatusCode, got)
			}
		}
		return nil
	})
	for _, ev := range h.rec.Events() {
		if ev.Upstream != "p1" || ev.Status != 200 {
			t.Fatalf("billed %+v, want only p1's answers", ev)
		}
	}
}

// The same on /v1/responses, whose error event is OpenAI's own, its
// members flat ({"type":"error","code":…,"message":…,"param":…}) under
// "event: error": it was relayed as a 200 and billed its prompt, the
// pool's other member never tried, and the Node SDK's
// responses.stream() rejected with "expected 'response.created' event,
// got error" instead of an APIError. A response.failed is a response,
// and stays an answer.
func TestResponsesStreamWhoseFirstEventIsAnErrorIsNoAnswer(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin")
	errorStream := func(events string) string {
		return proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s", len(events), events)
			return true
		})
	}
	stream := `{"model":"small","stream":true,"store":false,"input":"hi"}`
	tooLong := errorStream("event: error\ndata: " +
		`{"type":"error","sequence_number":0,"code":"context_length_exceeded","message":"too long","param":"input"}` + "\n\n")
	cfg := readFile(t, h.cfgPath)
	h.writeConfig(strings.Replace(strings.Replace(cfg, h.ups[0].URL, tooLong, 1), "upstreams: [p0, p1]", "upstreams: [p0]", 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/responses", stream)
		got := string(readAll(t, resp))
		if resp.StatusCode != 400 || !strings.Contains(got, `"code":"context_length_exceeded"`) || !strings.Contains(got, `"param":"input"`) ||
			!strings.Contains(got, `"type":"invalid_request_error"`) || !strings.Contains(got, "too long") {
			return fmt.Errorf("got %d %s", resp.StatusCode, got)
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond) // an event would be recorded before the answer went out
	if evs := h.rec.Events(); len(evs) != 0 {
		t.Fatalf("a stream of one error event was billed: %+v", evs[0])
	}

	// The event's type alone (no "event:" line), and a server error: the
	// next member answers.
	overloaded := errorStream(`data: {"type":"error","sequence_number":0,"code":"server_error","message":"model overloaded","param":null}` + "\n\n")
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), tooLong, overloaded, 1))
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), "upstreams: [p0]", "upstreams: [p0, p1]", 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		for range 2 { // round robin: one of the two starts at p0
			resp := h.post("/v1/responses", stream)
			got := string(readAll(t, resp))
			if resp.StatusCode != 200 || !strings.Contains(got, "response.completed") || strings.Contains(got, "overloaded") {
				return fmt.Errorf("got %d %s", resp.StatusCode, got)
			}
		}
		return nil
	})
	for _, ev := range h.rec.Events() {
		if ev.Upstream != "p1" || ev.Status != 200 {
			t.Fatalf("billed %+v, want only p1's answers", ev)
		}
	}

	// Alone in the pool, the server error is a 502 naming it, unbilled.
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), "upstreams: [p0, p1]", "upstreams: [p0]", 1))
	billed := len(h.rec.Events())
	awaitBadAnswer(t, h.harness, "/v1/responses", stream, "model overloaded")

	// A failed response is an answer, relayed as it came.
	failedEvent := `{"type":"response.failed","sequence_number":0,"response":{"id":"resp_f","object":"response","status":"failed",` +
		`"error":{"code":"server_error","message":"boom"},"output":[],"usage":{"input_tokens":3,"output_tokens":0,"total_tokens":3}}}`
	failed := errorStream("event: response.failed\ndata: " + failedEvent + "\n\n")
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), overloaded, failed, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/responses", stream)
		got := string(readAll(t, resp))
		if resp.StatusCode != 200 || !strings.Contains(got, `"status":"failed"`) {
			return fmt.Errorf("got %d %s", resp.StatusCode, got)
		}
		return nil
	})
	if evs := h.rec.Events(); len(evs) != billed+1 {
		t.Fatalf("%d events after the 502s and the failed response, want %d", len(evs), billed+1)
	}
}

// vLLM and SGLang write their error flat, {"object":"error","message":…,
// "type":…,"code":500}, its code the HTTP status it means. In a 200 it
// was relayed as an answer and billed its prompt when not streamed, and
// a 502 quoting no message when streamed. It is the upstream's error, as
// {"error":…} is: a 502 upstream_bad_answer with its message, unbilled,
// or the 4xx its code says.
func TestSuccessStatusWithAFlatErrorBodyIsNoAnswer(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	var asked atomic.Int32
	dead := jsonUpstream(t, `{"object":"error","message":"engine dead","type":"InternalServerError","param":null,"code":500}`, &asked)
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, dead, 1))
	for _, body := range []string{
		`{"model":"small","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		awaitBadAnswer(t, h, "/v1/chat/completions", body, "engine dead")
	}
	tooLong := jsonUpstream(t, `{"object":"error","message":"maximum context length is 1000 tokens","type":"BadRequestError","param":null,"code":400}`, &asked)
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), dead, tooLong, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`)
		got := string(readAll(t, resp))
		if resp.StatusCode != 400 || !strings.Contains(got, "maximum context length") || !strings.Contains(got, `"type":"BadRequestError"`) {
			return fmt.Errorf("got %d %s", resp.StatusCode, got)
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond) // an event would be recorded before the answer went out
	if evs := h.rec.Events(); len(evs) != 0 {
		t.Fatalf("a flat error answered with 200 was billed: %+v", evs[0])
	}
}

// awaitBadAnswer waits (a reload is applied within a second or so) until
// body posted to path is a 502 upstream_bad_answer quoting says.
func awaitBadAnswer(t *testing.T, h *harness, path, body, says string) {
	t.Helper()
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post(path, body)
		got := string(readAll(t, resp))
		if resp.StatusCode != 502 || !strings.Contains(got, `"code":"upstream_bad_answer"`) || !strings.Contains(got, says) {
			return fmt.Errorf("got %d %s", resp.StatusCode, got)
		}
		return nil
	})
}

// An upstream's 200 whose body is an error that blames the request,
// passed on as the 400 it means, is the upstream's answer, not a call
// the gateway refused: it is counted in tollgate_requests_total, as an
// upstream's plain 400 is, and not in tollgate_requests_refused_total,
// which counted it as if the gateway had refused the call itself.
func TestUpstreamsErrorPassedOnAs400IsNoRefusal(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	var asked atomic.Int32
	tooLong := jsonUpstream(t, `{"object":"error","message":"maximum context length is 1000 tokens","type":"BadRequestError","param":null,"code":400}`, &asked)
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, tooLong, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if asked.Load() > 0 {
			return nil
		}
		readAll(t, h.post("/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`))
		return fmt.Errorf("the upstream was not asked yet")
	})
	refused := refusedCount(scrape(t, h), "/v1/chat/completions", "400")
	for range 3 {
		resp := h.post("/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`)
		if body := readAll(t, resp); resp.StatusCode != 400 {
			t.Fatalf("%d %s, want the upstream's 400", resp.StatusCode, body)
		}
	}
	m := scrape(t, h)
	if n := refusedCount(m, "/v1/chat/completions", "400") - refused; n != 0 {
		t.Errorf("tollgate_requests_refused_total{status=\"400\"} rose by %d for 3 errors of the upstream's, want 0", n)
	}
	if want := `tollgate_requests_total{model="small",upstream="local",endpoint="/v1/chat/completions",status="400"} ` + strconv.Itoa(int(asked.Load())) + "\n"; !strings.Contains(m, want) {
		t.Errorf("no %q in /metrics", want)
	}
}

// A Responses stream whose first event is a rate limit error is the 429
// of an upstream at its limit, as the upstream's own 429 is passed on:
// rate_limit_error, its Retry-After kept. It was an invalid_request_error
// whose message said the error "blames the request", which a rate limit
// does not, and the Retry-After was lost.
func TestResponsesRateLimitErrorEventIsTheUpstreamsLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	events := "event: error\ndata: " +
		`{"type":"error","sequence_number":0,"code":"rate_limit_exceeded","message":"Slow down","param":null}` + "\n\n"
	limited := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nRetry-After: 7\r\nContent-Length: %d\r\n\r\n%s", len(events), events)
		return true
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, limited, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/responses", `{"model":"small","stream":true,"store":false,"input":"hi"}`)
		got := string(readAll(t, resp))
		if resp.StatusCode != 429 || !strings.Contains(got, `"type":"rate_limit_error"`) || !strings.Contains(got, `"code":"rate_limit_exceeded"`) ||
			!strings.Contains(got, "at its limit: Slow down") || strings.Contains(got, "blames") || resp.Header.Get("Retry-After") != "7" {
			return fmt.Errorf("got %d (Retry-After %q) %s", resp.StatusCode, resp.Header.Get("Retry-After"), got)
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond)
	if evs := h.rec.Events(); len(evs) != 0 {
		t.Fatalf("billed %+v", evs[0])
	}
}
