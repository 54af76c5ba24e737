package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/proxy"
)

// A request its headers refuse (no key or a bad one, a path no route
// serves, a method its route does not take) is answered from them, at
// once and without its body: read first, 16 connections each announcing
// 8 MiB without a key held 150 MB of the gateway's memory for the 60 s
// read timeout. A client that asks first (Expect: 100-continue) is told
// the refusal instead of "100 Continue".
func TestRefusedFromItsHeadersBeforeItsBody(t *testing.T) {
	h := newHarness(t, harnessOptions{maxRequestBody: "8MiB"})
	const announced = "Content-Length: 8388608\r\n"
	sent := strings.Repeat(" ", 16<<10) // past fasthttp's 8 KiB prefetch; the rest is withheld
	for name, c := range map[string]struct {
		head   string
		status int
		code   string
	}{
		"no key":             {"POST /v1/chat/completions HTTP/1.1\r\n", 401, "INVALID_API_KEY"},
		"a forged key":       {"POST /v1/responses HTTP/1.1\r\nAuthorization: Bearer tg-xxx\r\n", 401, "INVALID_API_KEY"},
		"not a bearer":       {"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Basic eHh4\r\n", 401, "INVALID_API_KEY"},
		"no route":           {"POST /v1/nope HTTP/1.1\r\n", 404, "not_found"},
		"a wrong method":     {"PUT /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer " + h.key + "\r\n", 405, "method_not_allowed"},
		"a read-only path":   {"POST /v1/models HTTP/1.1\r\n", 405, "method_not_allowed"},
		"a response, no key": {"POST /v1/responses/resp_1/cancel HTTP/1.1\r\n", 401, "INVALID_API_KEY"},
	} {
		conn := rawRequest(t, h.url, c.head+"Host: x\r\n"+announced+"\r\n", sent)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Errorf("%s: no answer while the body is withheld: %v", name, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.Contains(string(body), `"code":"`+c.code+`"`) {
			t.Errorf("%s: %d %s, want %d %s", name, resp.StatusCode, body, c.status, c.code)
		}
		if !resp.Close || resp.Header.Get("x-request-id") == "" {
			t.Errorf("%s: Connection: close %v, x-request-id %q", name, resp.Close, resp.Header.Get("x-request-id"))
		}
	}

	// Asked first, the refusal is the answer, in the envelope.
	for name, c := range map[string]struct {
		head   string
		status int
	}{
		"no key":             {"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 1000\r\n", 401},
		"no route":           {"POST /v1/nope HTTP/1.1\r\nContent-Length: 1000\r\n", 404},
		"over the limit too": {"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100000000\r\n", 413},
	} {
		conn := rawRequest(t, h.url, c.head+"Host: x\r\nExpect: 100-continue\r\n\r\n", "")
		status, body := answerAndClose(t, conn)
		if status != c.status || !strings.Contains(body, `"error"`) {
			t.Errorf("Expect: 100-continue, %s: %d %s, want %d in the envelope", name, status, body, c.status)
		}
	}

	// A call with a valid key still reads its body and is served, asked
	// first or not.
	chat := fmt.Sprintf(`{"model":"small","messages":[{"role":"user","content":"%s"}]}`, strings.Repeat("x", 20<<10))
	for _, expect := range []string{"", "Expect: 100-continue\r\n"} {
		conn := rawRequest(t, h.url, fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n%sContent-Length: %d\r\n\r\n", h.key, expect, len(chat)), "")
		br := bufio.NewReader(conn)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if expect != "" {
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 100 {
				t.Fatalf("Expect: 100-continue with a valid key: %v %v, want 100", resp, err)
			}
		}
		if _, err := conn.Write([]byte(chat)); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("a valid call (%q): %d %s", expect, resp.StatusCode, body)
		}
	}
	if n := len(h.up.Requests()); n != 2 {
		t.Fatalf("%d calls reached the upstream, want the 2 valid ones", n)
	}
}

// A client that sends its whole body before it reads, as the SDKs do,
// reads its refusal: closed with a body of more than 256 KiB still
// arriving, the socket reset, and the SDKs said "Connection error" and
// sent the body twice more instead of raising the 401. A body up to
// 256 KiB keeps its connection for the next request.
func TestRefusalWithoutAKeyIsReadAfterTheWholeBody(t *testing.T) {
	h := newHarness(t, harnessOptions{maxRequestBody: "8MiB"})
	for _, size := range []int{100 << 10, 1 << 20, 6 << 20} {
		body := fmt.Sprintf(`{"model":"small","messages":[{"role":"user","content":"%s"}]}`, strings.Repeat("x", size))
		req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("%d KiB without a key: %v, want its 401", size>>10, err)
			continue
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.Contains(string(answer), "missing API key") {
			t.Errorf("%d KiB without a key: %d %s, want 401", size>>10, resp.StatusCode, answer)
		}
		if kept := !resp.Close; kept != (size <= 256<<10) {
			t.Errorf("%d KiB without a key: connection kept %v", size>>10, kept)
		}
	}
}

// withheld sends head with 16 KiB of a body its Content-Length says is
// 8 MiB, the rest withheld, and returns the answer: read whole first,
// the body is a 408 at the read timeout.
func withheld(t *testing.T, url, head string) (int, string, error) {
	t.Helper()
	conn := rawRequest(t, url, head+"Host: x\r\nContent-Length: 8388608\r\n\r\n", strings.Repeat(" ", 16<<10))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "", err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(body), nil
}

// No client without a key makes the gateway hold more than a small bound
// of body per connection. The routes that read no body (GET /v1/models,
// /healthz, /metrics) answer without it; /admin/ and a route with its own
// cap (the console's) refuse a Content-Length over that cap from the
// headers; a public call over its address's rate is its 429 before its
// body. Each waited for the whole body first: 16 connections announcing
// 8 MiB, the last bytes withheld, took GET /v1/models from 88 to 265 MB
// for the 60 s read timeout, and Expect: 100-continue got 100 Continue.
// A 413 reads and drops the rest of the body first, holding none of it.
func TestNoKeyHoldsABodyPastItsRoutesNeed(t *testing.T) {
	proxy.SetRequestReadTimeout(t, time.Second)
	h := newHarness(t, harnessOptions{maxRequestBody: "8MiB"})
	for head, want := range map[string]int{
		"GET /v1/models HTTP/1.1\r\n":          200,
		"GET /v1/models/small HTTP/1.1\r\n":    200,
		"HEAD /v1/models HTTP/1.1\r\n":         200,
		"GET /healthz HTTP/1.1\r\n":            200,
		"GET /metrics HTTP/1.1\r\n":            200,
		"POST /admin/v1/accounts HTTP/1.1\r\n": 413,
	} {
		if status, body, err := withheld(t, h.url, head); err != nil || status != want {
			t.Errorf("%q, the body withheld: %d %s %v, want %d", head, status, body, err, want)
		}
	}
	conn := rawRequest(t, h.url, "GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\nExpect: 100-continue\r\n\r\n", "")
	if status, body := answerAndClose(t, conn); status != 200 || !strings.Contains(body, `"small"`) {
		t.Errorf("GET /v1/models under Expect: 100-continue: %d %s, want the list, the body never asked for", status, body)
	}

	cfg, err := config.Parse("gateway.yaml", []byte(fmt.Sprintf(moduleYAML, "0")))
	if err != nil {
		t.Fatal(err)
	}
	ok := func(ctx *fasthttp.RequestCtx, _ *proxy.Call) { ctx.SetBodyString(fmt.Sprint(len(ctx.PostBody()))) }
	public := func(ctx *fasthttp.RequestCtx, call *proxy.Call) {
		if apiErr := call.Admit(ctx, 1); apiErr != nil {
			proxy.WriteError(ctx, apiErr)
			return
		}
		ok(ctx, call)
	}
	m := proxy.Module{ID: "test", New: func(proxy.Host, *proxy.World) (proxy.Provisioned, error) {
		return proxy.Provisioned{Routes: []proxy.Route{
			{Method: "POST", Path: "/test/form", Auth: proxy.AuthNone, MaxBody: 64 << 10, Handler: ok,
				MethodNotAllowed: func(ctx *fasthttp.RequestCtx, allow string) { ctx.SetStatusCode(405) }},
			{Method: "POST", Path: "/test/public", Auth: proxy.AuthOptional, Limits: proxy.LimitCaller, Handler: public},
		}}, nil
	}}
	gw, err := proxy.New(cfg, proxy.Options{Recorder: meter.NewMemory(nil), Modules: []proxy.Module{m}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	url := gatewaytest.Serve(t, gw)
	if status, body, err := withheld(t, url, "POST /test/form HTTP/1.1\r\n"); err != nil || status != 413 || !strings.Contains(body, "65536") {
		t.Errorf("8 MiB announced to a route that takes 64 KiB: %d %s %v, want its 413", status, body, err)
	}
	conn = rawRequest(t, url, "POST /test/form HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n", "")
	if status, body := answerAndClose(t, conn); status != 413 {
		t.Errorf("100 kB under Expect to a route that takes 64 KiB: %d %s, want 413, not 100 Continue", status, body)
	}
	// A method the route answers itself (the console's 405 page) is under
	// its cap too: POST /console with 8 MiB was read whole.
	for _, head := range []string{"PUT /test/form HTTP/1.1\r\n", "OPTIONS /test/form HTTP/1.1\r\n"} {
		if status, body, err := withheld(t, url, head); err != nil || status != 413 {
			t.Errorf("%q, 8 MiB announced to a route that takes 64 KiB: %d %s %v, want its 413", head, status, body, err)
		}
		conn = rawRequest(t, url, head+"Host: x\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n", "")
		if status, body := answerAndClose(t, conn); status != 413 {
			t.Errorf("%q, 100 kB under Expect to a route that takes 64 KiB: %d %s, want 413, not 100 Continue", head, status, body)
		}
	}
	resp, err := http.Post(url+"/test/public", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a first public call: %d", resp.StatusCode)
	}
	if status, body, err := withheld(t, url, "POST /test/public HTTP/1.1\r\n"); err != nil || status != 429 {
		t.Errorf("a public call over its address's rate, the body withheld: %d %s %v, want its 429", status, body, err)
	}
}

// A refused request without a key whose chunked body came whole keeps
// its connection, and the request pipelined after it is answered: it
// had Connection: close, and the next request was never read.
func TestRefusedChunkedBodyKeepsItsConnection(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	body := `{"model":"small","messages":[]}`
	conn := rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
		fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", len(body), body))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	for _, want := range []int{401, 200} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("reading the answer that should be %d: %v", want, err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || resp.Close {
			t.Fatalf("%d, Connection: close %v; want %d, the connection kept", resp.StatusCode, resp.Close, want)
		}
	}
}
