package proxy_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy"
)

// rawRequest sends head (and body) on a new connection and returns it.
func rawRequest(t *testing.T, url, head, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.Write([]byte(head + body)); err != nil {
		t.Fatal(err)
	}
	return conn
}

func readStatus(t *testing.T, conn net.Conn) int {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A request announcing a large body costs memory only as its bytes come:
// fasthttp once allocated the announced Content-Length before the body's
// first byte, so a hundred bytes of headers without a key held the whole
// limit for the read timeout, on as many connections as were opened.
func TestAnnouncedBodyCostsNoMemoryUntilItArrives(t *testing.T) {
	h := newHarness(t, harnessOptions{maxRequestBody: "8MiB"})
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const conns = 8
	for range conns {
		rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 8000000\r\n\r\n", "{")
	}
	time.Sleep(500 * time.Millisecond)
	// Collected first, so that only what the connections hold counts: the
	// harness's own garbage once grew the heap by 18 MiB on a loaded CI.
	// Allocating the announced lengths holds 61 MiB, twice the bound.
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 30<<20 {
		t.Fatalf("%d connections announcing 8 MB bodies and sending one byte grew the heap by %d MiB", conns, grew>>20)
	}
}

// A body over max_request_body is a 413 in the OpenAI envelope, whether
// its length is announced (answered before the body is read) or chunked.
func TestBodyOverTheLimitIs413(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	// fasthttp reads the first 8 KiB of a body before the handler runs.
	// Past what is drained for the 413 (64 MiB), it is not waited for.
	conn := rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n", strings.Repeat(" ", 8<<10))
	if st := readStatus(t, conn); st != 413 {
		t.Fatalf("announced 100 MB against 64 KiB: %d, want 413 before the rest of the body", st)
	}
	chunk := strings.Repeat("x", 32<<10)
	var body strings.Builder
	for range 3 {
		fmt.Fprintf(&body, "%x\r\n%s\r\n", len(chunk), chunk)
	}
	body.WriteString("0\r\n\r\n")
	// With a key: without one, the headers are refused first (401).
	conn = rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+h.key+"\r\nTransfer-Encoding: chunked\r\n\r\n", body.String())
	if st := readStatus(t, conn); st != 413 {
		t.Fatalf("96 KiB chunked against 64 KiB: %d, want 413", st)
	}
	// A chunked body within the limit is read whole.
	small := `{"model":"small","messages":[{"role":"user","content":"hi"}]}`
	conn = rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+h.key+"\r\nTransfer-Encoding: chunked\r\n\r\n",
		fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(small), small))
	if st := readStatus(t, conn); st != 200 {
		t.Fatalf("a small chunked chat: %d, want 200", st)
	}
}

// Bodies just under, at and over fasthttp's prefetch arrive whole: a
// small body is taken from the buffer fasthttp read it into, a larger one
// from the stream.
func TestBodiesAroundThePrefetchArriveWhole(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, size := range []int{100, 8<<10 - 1, 8 << 10, 8<<10 + 1, 40 << 10} {
		const head, tail = `{"model":"small","messages":[{"role":"user","content":"`, `"}]}`
		content := strings.Repeat("x", size-len(head)-len(tail))
		body := head + content + tail
		resp := h.post("/v1/chat/completions", body)
		if got := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("a %d-byte body: %d %s", len(body), resp.StatusCode, got)
		}
		reqs := h.up.Requests()
		if last := reqs[len(reqs)-1]; !strings.Contains(string(last.Body), content) {
			t.Fatalf("the upstream got a %d-byte body for %d sent", len(last.Body), len(body))
		}
	}
}

// A client that sends its whole body before it reads (the SDKs do) gets
// the 413, not a connection reset: the gateway drops the rest of a body up
// to twice the limit, and at least 64 MiB, before it answers and closes.
// A 40 MiB body (a few base64 images) against 8 MiB once got a reset,
// which the SDKs call "Connection error." and upload twice more.
func TestBodyOverTheLimitSentWholeGets413(t *testing.T) {
	h := newHarness(t, harnessOptions{maxRequestBody: "8MiB"})
	for _, c := range []struct {
		chunked bool
		size    int
	}{{false, 12 << 20}, {true, 12 << 20}, {false, 40 << 20}} {
		chunked := c.chunked
		body := `{"model":"small","messages":[{"role":"user","content":"` + strings.Repeat("x", c.size) + `"}]}`
		auth := "Authorization: Bearer " + h.key + "\r\n" // without a key, the headers are refused first (401)
		head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n", auth, len(body))
		if chunked {
			head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + "Transfer-Encoding: chunked\r\n\r\n"
			body = fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
		}
		// Like an SDK: the whole body goes out before the answer is read
		// (rawRequest fails the test if the gateway hung up before).
		conn := rawRequest(t, h.url, head, body)
		if st := readStatus(t, conn); st != 413 {
			t.Fatalf("%d bytes, chunked %v: status %d, want 413", len(body), chunked, st)
		}
	}
}

// A client that asks before sending a body over the limit gets 413 at
// once, not "100 Continue" and then a 413 after the upload.
func TestExpectContinueOverTheLimitIs413(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	conn := rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1000000\r\n\r\n", "")
	if st := readStatus(t, conn); st != 413 {
		t.Fatalf("Expect: 100-continue with 1 MB against 64 KiB: %d, want 413 before the upload", st)
	}
	small := `{"model":"small","messages":[{"role":"user","content":"hi"}]}`
	conn = rawRequest(t, h.url, fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", h.key, len(small)), "")
	if st := readStatus(t, conn); st != 100 {
		t.Fatalf("Expect: 100-continue within the limit: %d, want 100", st)
	}
}

// A compressed request body is refused saying so (415), on generation and
// the other endpoints alike: read as it came, it was "not valid JSON".
func TestCompressedRequestBodyIs415(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(`{"model":"small","messages":[{"role":"user","content":"hi"}]}`))
	zw.Close()
	for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/responses/resp_1/cancel"} {
		req, _ := http.NewRequest("POST", h.url+path, bytes.NewReader(b.Bytes()))
		req.Header.Set("Authorization", "Bearer "+h.key)
		req.Header.Set("Content-Encoding", "gzip")
		env := wantError(t, mustDo(t, h.client, req), 415, "unsupported_content_encoding")
		if msg, _ := env["message"].(string); !strings.Contains(msg, `"gzip"`) {
			t.Fatalf("%s: message %q", path, msg)
		}
	}
	// identity is no encoding.
	req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(`{"model":"small","messages":[]}`))
	req.Header.Set("Authorization", "Bearer "+h.key)
	req.Header.Set("Content-Encoding", "identity")
	if resp := mustDo(t, h.client, req); resp.StatusCode != 200 {
		t.Fatalf("Content-Encoding identity: %d %s", resp.StatusCode, readAll(t, resp))
	}
}

func mustDo(t *testing.T, c *http.Client, req *http.Request) *http.Response {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// A request whose body never comes whole is answered 408 when the wait
// runs out, not 400 "malformed" with both ends' addresses.
func TestRequestNotSentWholeIs408(t *testing.T) {
	proxy.SetRequestReadTimeout(t, 300*time.Millisecond)
	h := newHarness(t, harnessOptions{})
	auth := "Authorization: Bearer " + h.key + "\r\n"
	for name, c := range map[string]struct{ head, body string }{
		// fasthttp waits for the first 8 KiB itself; past them the
		// gateway reads, and a timeout there was "not valid JSON".
		"in the first 8 KiB": {"Content-Length: 100000\r\n", `{"model":"small",`},
		"past 8 KiB":         {"Content-Length: 50000\r\n", `{"model":"small","messages":[{"role":"user","content":"` + strings.Repeat("x", 20_000)},
		"chunked":            {"Transfer-Encoding: chunked\r\n", "11\r\n{\"model\":\"small\"}\r\n"},
	} {
		conn := rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+auth+c.head+"\r\n", c.body)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: reading the answer: %v", name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 408 || !strings.Contains(string(body), `"code":"request_timeout"`) || strings.Contains(string(body), "127.0.0.1") {
			t.Errorf("%s: %d %s; want 408 request_timeout without addresses", name, resp.StatusCode, body)
		}
		if resp.Header.Get("x-request-id") == "" {
			t.Errorf("%s: the 408 carries no x-request-id", name)
		}
	}
	if len(h.up.Requests()) != 0 {
		t.Fatal("an unfinished request reached the upstream")
	}
}
