package proxy_test

import (
	"bufio"
	"bytes"
	"io"
	"net/textproto"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy/proxytest"
)

// http10Answer is the gateway's answer to an HTTP/1.0 request, read from
// the wire: its status line and headers, its body as sent, and whether
// the gateway closed the connection after it.
type http10Answer struct {
	status string
	header textproto.MIMEHeader
	body   []byte
	closed bool
}

func http10Head(h *harness, method, path, body string) string {
	return method + " " + path + " HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer " + h.key +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
}

func http10Request(t *testing.T, h *harness, method, path, body string) http10Answer {
	t.Helper()
	conn := rawRequest(t, h.url, http10Head(h, method, path, body), body)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	tp := textproto.NewReader(bufio.NewReader(conn))
	var a http10Answer
	var err error
	if a.status, err = tp.ReadLine(); err != nil {
		t.Fatalf("reading the status line: %v", err)
	}
	if a.header, err = tp.ReadMIMEHeader(); err != nil {
		t.Fatalf("reading the headers: %v", err)
	}
	a.body, err = io.ReadAll(tp.R) // to the connection's close
	a.closed = err == nil
	return a
}

// http10FirstEvent sends a POST as an HTTP/1.0 client and reads the
// answer's status line, headers and first event, then hangs up.
func http10FirstEvent(t *testing.T, h *harness, path, body string) (status, event string) {
	t.Helper()
	conn := rawRequest(t, h.url, http10Head(h, "POST", path, body), body)
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	tp := textproto.NewReader(bufio.NewReader(conn))
	var err error
	if status, err = tp.ReadLine(); err != nil {
		t.Fatalf("%s: reading the status line: %v", path, err)
	}
	if _, err := tp.ReadMIMEHeader(); err != nil {
		t.Fatalf("%s: reading the headers: %v", path, err)
	}
	for !strings.HasSuffix(event, "\n\n") {
		line, err := tp.R.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: reading the first event, %q so far: %v", path, event+line, err)
		}
		event += line
	}
	return status, event
}

// An HTTP/1.0 client (nginx's default proxy_http_version, curl -0) cannot
// read a chunked body, which RFC 9112 forbids sending one: its stream is
// the events as they come, unframed, the connection closed at its end,
// relayed event by event and billed as the same stream to an HTTP/1.1
// client. fasthttp chunked it, and the client read chunk sizes among the
// events.
func TestHTTP10ClientGetsItsStreamUnframed(t *testing.T) {
	var responseID string
	const chunks, delay = 6, 80 * time.Millisecond
	// The idle timeout far off: a stream held back would not be let go
	// by it while the client waits for its first event (below).
	h := newHarness(t, harnessOptions{idleTimeout: "60s", upstream: proxytest.Options{Chunks: chunks, ChunkDelay: delay}})
	streams := []struct{ path, body, last string }{
		{"/v1/chat/completions", `{"model":"small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Say hello"}]}`, "data: [DONE]\n\n"},
		{"/v1/responses", `{"model":"small","stream":true,"input":"Say hello"}`, "\n\n"},
	}
	for _, c := range streams {
		// The same stream to an HTTP/1.1 client, for its bill.
		n := len(h.rec.Events())
		resp := h.post(c.path, c.body)
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("%s over HTTP/1.1: %d %s", c.path, resp.StatusCode, body)
		}
		want := *h.events(n + 1)[n]

		a := http10Request(t, h, "POST", c.path, c.body)
		if !strings.Contains(a.status, " 200 ") {
			t.Fatalf("%s: %s\n%s", c.path, a.status, a.body)
		}
		if te := a.header.Get("Transfer-Encoding"); te != "" {
			t.Errorf("%s: Transfer-Encoding %q to an HTTP/1.0 client", c.path, te)
		}
		if cl := a.header.Get("Content-Length"); cl != "" {
			t.Errorf("%s: Content-Length %q on a stream", c.path, cl)
		}
		if got := a.header.Get("Connection"); !strings.EqualFold(got, "close") {
			t.Errorf("%s: Connection %q, want close", c.path, got)
		}
		if !a.closed {
			t.Errorf("%s: the connection was not closed after the stream", c.path)
		}
		if !bytes.HasPrefix(a.body, []byte("data: ")) && !bytes.HasPrefix(a.body, []byte("event: ")) || !bytes.HasSuffix(a.body, []byte(c.last)) {
			t.Errorf("%s: body is not the bare events:\n%q", c.path, a.body)
		}
		got := *h.events(n + 2)[n+1]
		if got.Status != want.Status || got.Stream != want.Stream || got.PromptTokens != want.PromptTokens ||
			got.CompletionTokens != want.CompletionTokens || got.CostNanos != want.CostNanos || got.UsageSource != want.UsageSource {
			t.Errorf("%s: billed %+v over HTTP/1.0, %+v over HTTP/1.1", c.path, got, want)
		}
		if want.Status != 200 || want.CompletionTokens != chunks {
			t.Errorf("%s: billed %+v, want the stream's 200 with its %d tokens", c.path, want, chunks)
		}
		if m := regexp.MustCompile(`"id":"(resp_[^"]+)"`).FindSubmatch(a.body); m != nil {
			responseID = string(m[1])
		}
	}

	// A stored response's stream, relayed from its upstream, likewise.
	if responseID == "" {
		t.Fatal("no response id in the responses stream")
	}
	a := http10Request(t, h, "GET", "/v1/responses/"+responseID+"?stream=true", "")
	if !strings.Contains(a.status, " 200 ") || a.header.Get("Transfer-Encoding") != "" || !a.closed ||
		!bytes.HasPrefix(a.body, []byte("event: response.completed\n")) || !bytes.HasSuffix(a.body, []byte("\n\n")) {
		t.Errorf("GET %s?stream=true over HTTP/1.0: %s %v, closed %v\n%q", responseID, a.status, a.header, a.closed, a.body)
	}

	// Relayed event by event, not held back to the stream's end: with
	// the upstream stalled after its first event, that event reaches the
	// client.
	h.up.SetOptions(proxytest.Options{Stall: true})
	t.Cleanup(h.up.Close) // ends the stalled streams before the gateway's shutdown waits for them
	for _, c := range streams {
		status, event := http10FirstEvent(t, h, c.path, c.body)
		if !strings.Contains(status, " 200 ") || !strings.HasPrefix(event, "data: ") && !strings.HasPrefix(event, "event: ") {
			t.Errorf("%s with the upstream stalled after its first event: %s, first event %q", c.path, status, event)
		}
	}
}

// A non-streamed answer to an HTTP/1.0 client carries its length.
func TestHTTP10ClientGetsContentLength(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	a := http10Request(t, h, "POST", "/v1/chat/completions", chatBody)
	if !strings.Contains(a.status, " 200 ") {
		t.Fatalf("%s\n%s", a.status, a.body)
	}
	if te := a.header.Get("Transfer-Encoding"); te != "" {
		t.Errorf("Transfer-Encoding %q to an HTTP/1.0 client", te)
	}
	if cl := a.header.Get("Content-Length"); cl != strconv.Itoa(len(a.body)) {
		t.Errorf("Content-Length %q for a body of %d bytes", cl, len(a.body))
	}
}

// A stream an HTTP/1.0 client pipelined behind another request on a kept
// connection comes after that request's answer: the stream is written to
// the connection itself, and overtook an answer fasthttp still held.
func TestHTTP10StreamPipelinedAfterAnAnswerComesAfterIt(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	stream := `{"model":"small","stream":true,"messages":[{"role":"user","content":"Say hello"}]}`
	conn := rawRequest(t, h.url, "GET /v1/models HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nAuthorization: Bearer "+h.key+"\r\n\r\n"+
		"POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer "+h.key+
		"\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(stream))+"\r\n\r\n"+stream, "")
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	all, _ := io.ReadAll(conn)
	models, rest, ok := bytes.Cut(all, []byte(`"object":"list"`))
	if !ok || !bytes.HasPrefix(models, []byte("HTTP/1.1 200 ")) || bytes.Contains(models, []byte("data: ")) {
		t.Fatalf("the first answer is not GET /v1/models's alone:\n%s", all)
	}
	if !bytes.Contains(rest, []byte("HTTP/1.1 200 ")) || !bytes.HasSuffix(rest, []byte("data: [DONE]\n\n")) {
		t.Fatalf("the stream did not follow the first answer:\n%s", all)
	}
}
