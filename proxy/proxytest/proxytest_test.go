package proxytest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
)

// checkFor polls fn until it returns nil or total passes.
var checkFor = testutil.CheckFor

func newServer(t *testing.T, o Options) *Server {
	t.Helper()
	s := NewServer(o)
	t.Cleanup(s.Close)
	return s
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-test")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

type sseEvent struct {
	name string // the event: line, if any
	data string
}

// readSSE parses events until the body ends; err is what ended it (nil for
// a clean end).
func readSSE(r io.Reader) ([]sseEvent, error) {
	var events []sseEvent
	var cur sseEvent
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line == "" {
				err = nil
			}
			return events, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			events = append(events, cur)
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		default:
			return events, fmt.Errorf("unexpected SSE line %q", line)
		}
	}
}

func decode(t *testing.T, data string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		t.Fatalf("decoding %s: %v", data, err)
	}
	return m
}

// field walks m along a path of keys and indexes, e.g. "choices", 0, "delta".
func field(t *testing.T, m any, path ...any) any {
	t.Helper()
	cur := m
	for _, p := range path {
		switch k := p.(type) {
		case string:
			obj, ok := cur.(map[string]any)
			if !ok {
				t.Fatalf("at %v: %T is not an object", p, cur)
			}
			v, ok := obj[k]
			if !ok {
				t.Fatalf("no field %q in %v", k, obj)
			}
			cur = v
		case int:
			arr, ok := cur.([]any)
			if !ok || k >= len(arr) {
				t.Fatalf("at %v: no element in %v", p, cur)
			}
			cur = arr[k]
		}
	}
	return cur
}

func num(t *testing.T, m any, path ...any) int {
	t.Helper()
	f, ok := field(t, m, path...).(float64)
	if !ok {
		t.Fatalf("%v is not a number", path)
	}
	return int(f)
}

const chatReq = `{"model":"m-\u00e9","messages":[{"role":"user","content":"hello"}]}`

func TestChatNonStream(t *testing.T) {
	s := newServer(t, Options{Chunks: 3, PromptTokens: 7, CachedTokens: 3, ReasoningTokens: 2})
	resp := post(t, context.Background(), s.URL+"/chat/completions", chatReq)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	body, _ := io.ReadAll(resp.Body)
	m := decode(t, string(body))
	if id := field(t, m, "id").(string); !strings.HasPrefix(id, "chatcmpl-") {
		t.Errorf("id %q", id)
	}
	if field(t, m, "object") != "chat.completion" || field(t, m, "model") != "m-é" {
		t.Errorf("object/model wrong: %s", body)
	}
	if got := field(t, m, "choices", 0, "message", "content"); got != "tok0 tok1 tok2" {
		t.Errorf("content %q", got)
	}
	if got := field(t, m, "choices", 0, "finish_reason"); got != "stop" {
		t.Errorf("finish_reason %v", got)
	}
	want := map[string]int{"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
	for k, v := range want {
		if got := num(t, m, "usage", k); got != v {
			t.Errorf("usage.%s = %d, want %d", k, got, v)
		}
	}
	if got := num(t, m, "usage", "prompt_tokens_details", "cached_tokens"); got != 3 {
		t.Errorf("cached_tokens %d", got)
	}
	if got := num(t, m, "usage", "completion_tokens_details", "reasoning_tokens"); got != 2 {
		t.Errorf("reasoning_tokens %d", got)
	}
}

func TestChatNonStreamOmitUsage(t *testing.T) {
	s := newServer(t, Options{OmitUsage: true})
	body, _ := io.ReadAll(post(t, context.Background(), s.URL+"/chat/completions", chatReq).Body)
	if _, ok := decode(t, string(body))["usage"]; ok {
		t.Fatalf("usage sent although OmitUsage: %s", body)
	}
}

// postChatStream posts a chat stream request and returns its events.
func postChatStream(t *testing.T, s *Server, includeUsage bool) []sseEvent {
	t.Helper()
	req := `{"model":"m1","stream":true,"messages":[]}`
	if includeUsage {
		req = `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[]}`
	}
	resp := post(t, context.Background(), s.URL+"/chat/completions", req)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	events, err := readSSE(resp.Body)
	if err != nil {
		t.Fatalf("reading stream: %v", err)
	}
	return events
}

// checkChatContent checks the role chunk, word chunks and finish chunk at the
// start of events and returns the events after them.
func checkChatContent(t *testing.T, events []sseEvent, words int) []sseEvent {
	t.Helper()
	if len(events) < words+2 {
		t.Fatalf("%d events, want at least %d", len(events), words+2)
	}
	first := decode(t, events[0].data)
	id := field(t, first, "id").(string)
	if !strings.HasPrefix(id, "chatcmpl-") || field(t, first, "choices", 0, "delta", "role") != "assistant" {
		t.Fatalf("first chunk %s", events[0].data)
	}
	var text strings.Builder
	for i, ev := range events[:words+2] {
		m := decode(t, ev.data)
		if field(t, m, "id") != id || field(t, m, "object") != "chat.completion.chunk" || field(t, m, "model") != "m1" {
			t.Fatalf("chunk %d: %s", i, ev.data)
		}
		if ev.name != "" {
			t.Fatalf("chat chunks carry no event: line, got %q", ev.name)
		}
		if c, ok := field(t, m, "choices", 0, "delta").(map[string]any)["content"]; ok {
			text.WriteString(c.(string))
		}
		finish := field(t, m, "choices", 0, "finish_reason")
		if last := i == words+1; (finish == "stop") != last {
			t.Fatalf("chunk %d finish_reason %v", i, finish)
		}
	}
	if want := "tok0 tok1 tok2 tok3"; text.String() != want {
		t.Errorf("streamed text %q, want %q", text.String(), want)
	}
	return events[words+2:]
}

func TestChatStreamWithoutIncludeUsageSendsNoUsage(t *testing.T) {
	s := newServer(t, Options{Chunks: 4})
	events := postChatStream(t, s, false)
	rest := checkChatContent(t, events, 4)
	if len(rest) != 1 || rest[0].data != "[DONE]" {
		t.Fatalf("after content: %+v", rest)
	}
	for _, ev := range events {
		if strings.Contains(ev.data, "usage") {
			t.Fatalf("usage appears without include_usage: %s", ev.data)
		}
	}
}

func TestChatStreamIncludeUsage(t *testing.T) {
	s := newServer(t, Options{Chunks: 4, PromptTokens: 5, CompletionTokens: 9, CachedTokens: 1})
	events := postChatStream(t, s, true)
	rest := checkChatContent(t, events, 4)
	for i, ev := range events[:6] {
		if v, ok := decode(t, ev.data)["usage"]; !ok || v != nil {
			t.Fatalf("chunk %d lacks \"usage\":null: %s", i, ev.data)
		}
	}
	if len(rest) != 2 || rest[1].data != "[DONE]" {
		t.Fatalf("after content: %+v", rest)
	}
	u := decode(t, rest[0].data)
	if choices := field(t, u, "choices").([]any); len(choices) != 0 {
		t.Fatalf("usage chunk has choices: %s", rest[0].data)
	}
	if num(t, u, "usage", "prompt_tokens") != 5 || num(t, u, "usage", "completion_tokens") != 9 ||
		num(t, u, "usage", "total_tokens") != 14 || num(t, u, "usage", "prompt_tokens_details", "cached_tokens") != 1 {
		t.Fatalf("usage chunk %s", rest[0].data)
	}
}

func TestChatStreamUsageOnLastContentChunk(t *testing.T) {
	s := newServer(t, Options{Chunks: 4, UsageOnLastContentChunk: true})
	events := postChatStream(t, s, true)
	rest := checkChatContent(t, events, 4)
	if len(rest) != 1 || rest[0].data != "[DONE]" {
		t.Fatalf("after content: %+v", rest)
	}
	finish := decode(t, events[5].data)
	if num(t, finish, "usage", "completion_tokens") != 4 || num(t, finish, "usage", "prompt_tokens") != 10 {
		t.Fatalf("finish chunk %s", events[5].data)
	}
}

func TestChatStreamOmitUsageIgnoresIncludeUsage(t *testing.T) {
	s := newServer(t, Options{Chunks: 4, OmitUsage: true})
	events := postChatStream(t, s, true)
	rest := checkChatContent(t, events, 4)
	if len(rest) != 1 || rest[0].data != "[DONE]" {
		t.Fatalf("after content: %+v", rest)
	}
	for _, ev := range events {
		if strings.Contains(ev.data, "usage") {
			t.Fatalf("usage sent although OmitUsage: %s", ev.data)
		}
	}
}

func TestChatStreamOmitDoneStillSendsUsage(t *testing.T) {
	s := newServer(t, Options{Chunks: 4, OmitDone: true})
	events := postChatStream(t, s, true)
	rest := checkChatContent(t, events, 4)
	if len(rest) != 1 || num(t, decode(t, rest[0].data), "usage", "total_tokens") != 14 {
		t.Fatalf("after content: %+v", rest)
	}
	if got := len(postChatStream(t, s, false)); got != 6 {
		t.Fatalf("without include_usage: %d events, want 6 (no [DONE])", got)
	}
}

const responsesReq = `{"model":"r1","input":"hello"}`

func TestResponsesNonStream(t *testing.T) {
	s := newServer(t, Options{Chunks: 2, PromptTokens: 4, CachedTokens: 2, ReasoningTokens: 1})
	resp := post(t, context.Background(), s.URL+"/responses", responsesReq)
	body, _ := io.ReadAll(resp.Body)
	m := decode(t, string(body))
	if id := field(t, m, "id").(string); !strings.HasPrefix(id, "resp_") || resp.StatusCode != 200 {
		t.Fatalf("status %d, body %s", resp.StatusCode, body)
	}
	if field(t, m, "object") != "response" || field(t, m, "status") != "completed" || field(t, m, "model") != "r1" {
		t.Fatalf("body %s", body)
	}
	item := field(t, m, "output", 0)
	if field(t, item, "type") != "message" || field(t, item, "role") != "assistant" ||
		field(t, item, "content", 0, "type") != "output_text" || field(t, item, "content", 0, "text") != "tok0 tok1" {
		t.Fatalf("output %v", item)
	}
	if num(t, m, "usage", "input_tokens") != 4 || num(t, m, "usage", "input_tokens_details", "cached_tokens") != 2 ||
		num(t, m, "usage", "output_tokens") != 2 || num(t, m, "usage", "output_tokens_details", "reasoning_tokens") != 1 ||
		num(t, m, "usage", "total_tokens") != 6 {
		t.Fatalf("usage %v", m["usage"])
	}
}

func TestResponsesStream(t *testing.T) {
	s := newServer(t, Options{Chunks: 3})
	resp := post(t, context.Background(), s.URL+"/responses", `{"model":"r1","input":"hi","stream":true}`)
	events, err := readSSE(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added",
		"response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.delta", "response.output_text.done", "response.content_part.done",
		"response.output_item.done", "response.completed"}
	if len(events) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(events), len(want), events)
	}
	var text strings.Builder
	for i, ev := range events {
		m := decode(t, ev.data)
		if ev.name != want[i] || field(t, m, "type") != want[i] || num(t, m, "sequence_number") != i {
			t.Fatalf("event %d: %s %s", i, ev.name, ev.data)
		}
		if ev.name == "response.output_text.delta" {
			text.WriteString(field(t, m, "delta").(string))
		}
	}
	if text.String() != "tok0 tok1 tok2" {
		t.Fatalf("deltas %q", text.String())
	}
	created := decode(t, events[0].data)
	completed := decode(t, events[len(events)-1].data)
	if field(t, created, "response", "id") != field(t, completed, "response", "id") ||
		field(t, completed, "response", "status") != "completed" || field(t, completed, "response", "model") != "r1" {
		t.Fatalf("created %s / completed %s", events[0].data, events[len(events)-1].data)
	}
	if num(t, completed, "response", "usage", "output_tokens") != 3 || num(t, completed, "response", "usage", "total_tokens") != 13 {
		t.Fatalf("completed usage %s", events[len(events)-1].data)
	}
	if field(t, completed, "response", "output", 0, "content", 0, "text") != "tok0 tok1 tok2" {
		t.Fatalf("completed output %s", events[len(events)-1].data)
	}
}

func TestModels(t *testing.T) {
	s := newServer(t, Options{Models: []string{"a", "b", "c"}})
	resp, err := http.Get(s.URL + "/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := decode(t, string(body))
	if field(t, m, "object") != "list" || field(t, m, "data", 2, "id") != "c" || field(t, m, "data", 0, "object") != "model" {
		t.Fatalf("models %s", body)
	}
}

func TestStatusAnswersEveryRequest(t *testing.T) {
	s := newServer(t, Options{Status: http.StatusTooManyRequests})
	for _, path := range []string{"/chat/completions", "/responses"} {
		resp := post(t, context.Background(), s.URL+path, `{"model":"x","stream":true}`)
		body, _ := io.ReadAll(resp.Body)
		m := decode(t, string(body))
		if resp.StatusCode != 429 || field(t, m, "error", "type") != "rate_limit_error" ||
			field(t, m, "error", "code") != "rate_limit_exceeded" || field(t, m, "error", "message") == "" {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
	}
	s.SetOptions(Options{Status: http.StatusBadGateway, ErrorBody: "<html>bad gateway</html>"})
	resp, err := http.Get(s.URL + "/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 502 || string(body) != "<html>bad gateway</html>" {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

func TestBadRequests(t *testing.T) {
	s := newServer(t, Options{})
	cases := []struct {
		method, path, body string
		status             int
	}{
		{"POST", "/chat/completions", `{"model":`, 400},
		{"POST", "/chat/completions", `{"messages":[]}`, 400},
		{"GET", "/chat/completions", ``, 405},
		{"POST", "/models", `{}`, 405},
		{"POST", "/embeddings", `{"model":"x"}`, 404},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, s.URL+c.path, strings.NewReader(c.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s %s %s: status %d, want %d", c.method, c.path, c.body, resp.StatusCode, c.status)
		}
		if field(t, decode(t, string(body)), "error", "message") == "" {
			t.Errorf("%s %s: empty error message", c.method, c.path)
		}
	}
}

func TestRequestsAreRecordedAndReset(t *testing.T) {
	s := newServer(t, Options{})
	post(t, context.Background(), s.URL+"/chat/completions", chatReq)
	got := s.Requests()
	if len(got) != 1 {
		t.Fatalf("%d requests recorded", len(got))
	}
	r := got[0]
	if r.Method != "POST" || r.Path != "/v1/chat/completions" || string(r.Body) != chatReq ||
		r.Header.Get("Authorization") != "Bearer sk-test" {
		t.Fatalf("recorded %+v", r)
	}
	s.Reset()
	if len(s.Requests()) != 0 {
		t.Fatal("Reset kept requests")
	}
	s.SetOptions(Options{NoRecord: true})
	post(t, context.Background(), s.URL+"/chat/completions", chatReq)
	if len(s.Requests()) != 0 {
		t.Fatal("NoRecord recorded a request")
	}
}

// TestDropAfterCutsConnection reads the raw bytes: after DropAfter events the
// connection must end without the chunked terminator, and a client must see
// an unexpected EOF, not a clean end.
func TestDropAfterCutsConnection(t *testing.T) {
	s := newServer(t, Options{Chunks: 10, DropAfter: 3})
	conn, err := net.Dial("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"m1","stream":true}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("connection not closed: %v (read %q)", err, raw)
	}
	if !bytes.Contains(raw, []byte("Transfer-Encoding: chunked")) {
		t.Fatalf("not chunked: %q", raw)
	}
	if n := bytes.Count(raw, []byte("data: ")); n != 3 {
		t.Fatalf("%d events before the cut, want 3", n)
	}
	if bytes.HasSuffix(raw, []byte("0\r\n\r\n")) {
		t.Fatal("stream ended with the chunked terminator")
	}

	resp := post(t, context.Background(), s.URL+"/chat/completions", body)
	events, err := readSSE(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) || len(events) != 3 {
		t.Fatalf("client got %d events and %v, want 3 and unexpected EOF", len(events), err)
	}
	if s.Canceled() != 0 {
		t.Fatalf("a drop counted as %d cancellations", s.Canceled())
	}
}

func TestDropAfterResponsesStream(t *testing.T) {
	s := newServer(t, Options{DropAfter: 5})
	resp := post(t, context.Background(), s.URL+"/responses", `{"model":"r","stream":true}`)
	events, err := readSSE(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) || len(events) != 5 {
		t.Fatalf("client got %d events and %v, want 5 and unexpected EOF", len(events), err)
	}
}

func TestStallIsCancelable(t *testing.T) {
	s := newServer(t, Options{Stall: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := post(t, ctx, s.URL+"/chat/completions", `{"model":"m","stream":true}`)
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event: %q %v", line, err)
	}
	// Nothing more may arrive while stalled.
	got := make(chan error, 1)
	go func() {
		_, _ = br.ReadString('\n') // the blank line ending the first event
		_, err := br.ReadString('\n')
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("stalled stream produced more data (err %v)", err)
	case <-time.After(150 * time.Millisecond):
	}
	if s.Active() != 1 {
		t.Fatalf("Active() = %d while stalled", s.Active())
	}
	cancel()
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if s.Canceled() != 1 || s.Active() != 0 {
			return fmt.Errorf("canceled %d, active %d", s.Canceled(), s.Active())
		}
		return nil
	})
}

func TestClientGoneDuringChunkDelayIsCanceled(t *testing.T) {
	s := newServer(t, Options{Chunks: 100, ChunkDelay: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	resp := post(t, ctx, s.URL+"/responses", `{"model":"m","stream":true}`)
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if s.Canceled() != 1 || s.Active() != 0 {
			return fmt.Errorf("canceled %d, active %d", s.Canceled(), s.Active())
		}
		return nil
	})
}

func TestCompletedStreamsAreNotCanceled(t *testing.T) {
	s := newServer(t, Options{})
	for range 20 {
		postChatStream(t, s, true)
	}
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if s.Active() != 0 {
			return fmt.Errorf("active %d", s.Active())
		}
		return nil
	})
	if s.Canceled() != 0 {
		t.Fatalf("Canceled() = %d after complete streams", s.Canceled())
	}
}

func TestFirstByteDelay(t *testing.T) {
	const delay = 100 * time.Millisecond
	s := newServer(t, Options{FirstByteDelay: delay})
	for _, body := range []string{`{"model":"m","stream":true}`, `{"model":"m"}`} {
		start := time.Now()
		resp := post(t, context.Background(), s.URL+"/chat/completions", body)
		if took := time.Since(start); took < delay {
			t.Fatalf("%s: headers after %v, want at least %v", body, took, delay)
		}
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFirstByteDelayOrder uses a delay no test outlives, so what arrives
// first does not depend on how loaded the machine is: without
// HeaderFlushThenDelay nothing comes, with it the headers come and the body
// does not. Either way the client may give up, and that is counted.
func TestFirstByteDelayOrder(t *testing.T) {
	s := newServer(t, Options{})
	for i, c := range []struct {
		headersFirst bool
		body         string
	}{
		{false, `{"model":"m","stream":true}`},
		{false, `{"model":"m"}`},
		{true, `{"model":"m","stream":true}`},
		{true, `{"model":"m"}`},
	} {
		s.SetOptions(Options{FirstByteDelay: time.Hour, HeaderFlushThenDelay: c.headersFirst})
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", s.URL+"/chat/completions", strings.NewReader(c.body))
		type answer struct {
			resp *http.Response
			err  error
		}
		headers := make(chan answer, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			headers <- answer{resp, err}
		}()
		if !c.headersFirst {
			select {
			case a := <-headers:
				t.Fatalf("%s: headers before the first-byte delay (err %v)", c.body, a.err)
			case <-time.After(100 * time.Millisecond):
			}
			cancel()
			if a := <-headers; a.err == nil {
				a.resp.Body.Close()
				t.Fatalf("%s: request succeeded after cancel", c.body)
			}
		} else {
			var a answer
			select {
			case a = <-headers:
			case <-time.After(5 * time.Second):
				cancel()
				t.Fatalf("%s: no headers within 5s although HeaderFlushThenDelay", c.body)
			}
			if a.err != nil || a.resp.StatusCode != 200 {
				cancel()
				t.Fatalf("%s: no headers: %v", c.body, a.err)
			}
			read := make(chan int, 1)
			go func() {
				n, _ := a.resp.Body.Read(make([]byte, 1))
				read <- n
			}()
			select {
			case n := <-read:
				t.Fatalf("%s: %d body bytes before the first-byte delay", c.body, n)
			case <-time.After(100 * time.Millisecond):
			}
			cancel()
			<-read
			a.resp.Body.Close()
		}
		checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
			if s.Canceled() != i+1 || s.Active() != 0 {
				return fmt.Errorf("%s: canceled %d, active %d", c.body, s.Canceled(), s.Active())
			}
			return nil
		})
	}
}

func TestChunkDelay(t *testing.T) {
	s := newServer(t, Options{Chunks: 5, ChunkDelay: 20 * time.Millisecond})
	start := time.Now()
	events := postChatStream(t, s, false)
	// 8 events, 7 gaps.
	if took := time.Since(start); took < 7*20*time.Millisecond || len(events) != 8 {
		t.Fatalf("%d events in %v", len(events), took)
	}
}

func TestCloseWakesStalledHandlers(t *testing.T) {
	s := NewServer(Options{Stall: true})
	resp := post(t, context.Background(), s.URL+"/chat/completions", `{"model":"m","stream":true}`)
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung on a stalled handler")
	}
	if s.Active() != 0 || s.Canceled() != 0 {
		t.Fatalf("after Close: active %d, canceled %d", s.Active(), s.Canceled())
	}
	s.Close()
}

// TestSetOptionsWhileServing runs under -race: options swap while requests
// are in flight, and each request must stay self-consistent.
func TestSetOptionsWhileServing(t *testing.T) {
	s := newServer(t, Options{})
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			s.SetOptions(Options{Chunks: 1 + i%7, OmitDone: i%2 == 0, NoRecord: i%3 == 0})
			_ = s.Options()
			_ = s.Requests()
		}
	}()
	var readers sync.WaitGroup
	for range 4 {
		readers.Go(func() {
			for range 25 {
				req, _ := http.NewRequest("POST", s.URL+"/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				events, err := readSSE(resp.Body)
				resp.Body.Close()
				if err != nil || len(events) < 3 {
					t.Errorf("%d events, %v", len(events), err)
				}
			}
		})
	}
	readers.Wait()
	close(stop)
	<-writerDone
}

func BenchmarkChatStream(b *testing.B) {
	benchmarkEndpoint(b, "/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`)
}

func BenchmarkChatNonStream(b *testing.B) {
	benchmarkEndpoint(b, "/chat/completions", `{"model":"m"}`)
}

func BenchmarkResponsesStream(b *testing.B) {
	benchmarkEndpoint(b, "/responses", `{"model":"m","stream":true}`)
}

func benchmarkEndpoint(b *testing.B, path, body string) {
	s := NewServer(Options{NoRecord: true})
	defer s.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(s.URL+path, "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || n == 0 {
				b.Errorf("status %d, %d bytes", resp.StatusCode, n)
				return
			}
		}
	})
}
