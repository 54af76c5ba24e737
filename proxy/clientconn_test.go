package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// A client that pipelined calls and then left is gone for all of them:
// the 499 of the first closes its connection. Kept open, fasthttp served
// the next request from its buffer, sent it upstream after the gateway
// had found the client gone, and billed it a second 499.
func TestClientGoneEndsItsPipelinedCalls(t *testing.T) {
	h := newHarness(t, harnessOptions{firstByteTimeout: "20s",
		upstream: proxytest.Options{FirstByteDelay: 3 * time.Second}})
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + h.key + "\r\nContent-Type: application/json\r\n" +
		"Content-Length: " + strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody
	conn := rawRequest(t, h.url, strings.Repeat(head, 4), "")
	time.Sleep(300 * time.Millisecond)
	conn.Close()
	evs := h.events(1)
	if evs[0].Status != 499 {
		t.Fatalf("event %+v, want a 499", evs[0])
	}
	time.Sleep(2500 * time.Millisecond) // a second call would have found its client gone within a second
	if n := len(h.rec.Events()); n != 1 {
		t.Fatalf("%d events after the client left, want 1", n)
	}
	if n := len(h.up.Requests()); n > 1 {
		t.Fatalf("%d calls reached the upstream after the client left with the first, want 1", n)
	}
}

// tenKiBChat is a chat body past fasthttp's 8 KiB prefetch, which the
// gateway reads from the connection itself.
var tenKiBChat = `{"model":"small","messages":[{"role":"user","content":"` + strings.Repeat("x", 10<<10) + `"}]}`

// answerAndClose reads the gateway's answer on conn, and then that the
// gateway closed the connection.
func answerAndClose(t *testing.T, conn net.Conn) (int, string) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after a %d, the connection is still open (%v)", resp.StatusCode, err)
	}
	return resp.StatusCode, string(body)
}

// A body whose client closed its connection (or its writing side) before
// the length it announced was forwarded and billed as if whole: fasthttp
// ends such a body with a plain io.EOF. It is refused, nothing upstream.
func TestBodyCutShortByTheClientIsRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	auth := "Authorization: Bearer " + h.key + "\r\n"
	for name, c := range map[string]struct{ head, body string }{
		"100 bytes short":   {fmt.Sprintf("Content-Length: %d\r\n", len(tenKiBChat)+100), tenKiBChat},
		"5000 bytes short":  {fmt.Sprintf("Content-Length: %d\r\n", len(tenKiBChat)+5000), tenKiBChat},
		"inside a chunk":    {"Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s", len(tenKiBChat)+100, tenKiBChat)},
		"inside the prefix": {fmt.Sprintf("Content-Length: %d\r\n", len(chatBody)+100), chatBody},
	} {
		conn := rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+auth+c.head+"\r\n", c.body)
		_ = conn.(*net.TCPConn).CloseWrite()
		status, body := answerAndClose(t, conn)
		if status != 400 {
			t.Errorf("%s: %d %s, want 400", name, status, body)
		}
		if strings.Contains(body, "127.0.0.1") {
			t.Errorf("%s: the answer names an address: %s", name, body)
		}
	}
	if n := len(h.up.Requests()); n != 0 {
		t.Fatalf("%d bodies cut short reached the upstream", n)
	}
	if n := len(h.rec.Events()); n != 0 {
		t.Fatalf("%d bodies cut short were billed", n)
	}
}

// A chunked body whose framing is broken was refused as "not valid JSON",
// the call having read an empty body: the answer says what is wrong.
func TestBrokenChunkedFramingSaysSo(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	auth := "Authorization: Bearer " + h.key + "\r\n"
	for name, body := range map[string]string{
		"a negative size":  "-5\r\n" + chatBody + "\r\n0\r\n\r\n",
		"a size too large": "ffffffffffffffffff\r\n" + chatBody + "\r\n0\r\n\r\n",
		"a size too small": fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(chatBody)-10, chatBody),
		"bare line feeds":  fmt.Sprintf("%x\n%s\n0\n\n", len(chatBody), chatBody),
		"no size":          "\r\n" + chatBody + "\r\n0\r\n\r\n",
	} {
		conn := rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+auth+"Transfer-Encoding: chunked\r\n\r\n", body)
		status, answer := answerAndClose(t, conn)
		if status != 400 || !strings.Contains(answer, "chunked") || strings.Contains(answer, "not valid JSON") {
			t.Errorf("%s: %d %s, want a 400 about the chunked framing", name, status, answer)
		}
	}
	if n := len(h.up.Requests()); n != 0 {
		t.Fatalf("%d broken bodies reached the upstream", n)
	}
}

// A client that stops reading a long stream held its upstream, and a slot
// of its key's concurrency, for as long as it kept the connection open:
// the relay waited in a write no timeout ended. A write the client takes
// none of for idle_timeout ends the stream, as a client gone: billed what
// was relayed, the upstream's connection closed.
func TestClientThatStopsReadingEndsItsStream(t *testing.T) {
	h := newHarness(t, harnessOptions{idleTimeout: "1s"})
	body := strings.Replace(chatBody, `{`, `{"stream":true,`, 1)
	// The deadline ends with its stream: the next answer on the kept
	// connection, after longer than idle_timeout, goes out.
	if resp := h.post("/v1/chat/completions", body); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	time.Sleep(1500 * time.Millisecond)
	if resp := h.post("/v1/chat/completions", chatBody); resp.StatusCode != 200 {
		t.Fatalf("the call after a stream: %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	before := len(h.rec.Events())
	h.up.SetOptions(proxytest.Options{Chunks: 100_000})
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", h.key, len(body), body)
	if _, err := io.ReadFull(conn, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	// Then nothing more is read, and the connection stays open.
	evs := func() []*meter.Event {
		var evs []*meter.Event
		checkFor(t, 15*time.Second, 50*time.Millisecond, func() error {
			if evs = h.rec.Events()[before:]; len(evs) != 1 {
				return fmt.Errorf("%d events while the client reads nothing, want its stream ended and billed", len(evs))
			}
			return nil
		})
		return evs
	}()
	if ev := evs[0]; ev.UsageSource != meter.SourceEstimated || ev.CompletionTokens == 0 || ev.CompletionTokens >= 100_000 {
		t.Fatalf("event %+v, want what was relayed, estimated", ev)
	}
	checkFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		if n := h.up.Active(); n != 0 {
			return fmt.Errorf("the upstream still generates %d answers", n)
		}
		return nil
	})
}

// A client reading a long stream slowly but steadily is not cut: the
// kernel grew the send queue to 4 MiB and woke a blocked write only once
// about a third of it had drained, so a client reading less than 1.4 MB
// per idle_timeout took "nothing" of a write for all that time, and the
// stream ended (rawconn.UnsentLimit).
func TestClientReadingSteadilyKeepsItsStream(t *testing.T) {
	h := newHarness(t, harnessOptions{idleTimeout: "3s"})
	body := strings.Replace(chatBody, `{`, `{"stream":true,`, 1)
	h.up.SetOptions(proxytest.Options{Chunks: 100_000})
	before := len(h.rec.Events())
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", h.key, len(body), body)
	// 160 KiB a second for two idle_timeouts, in reads every 50 ms: before,
	// a write waited for about 1.4 MB to drain, 9 s at this rate. (On
	// loopback the client's window opens in steps of its 64 KiB segment,
	// so a slower reader would take "nothing" for a second between them;
	// on a network the step is a 1.5 KB segment.)
	buf := make([]byte, 8<<10)
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Fatalf("reading the stream: %v", err)
		}
		if evs := h.rec.Events()[before:]; len(evs) != 0 {
			t.Fatalf("the stream of a client reading 160 KiB/s ended and was billed: %+v", evs[0])
		}
	}
}

// A client still connected when its call has waited past the request read
// timeout (fasthttp's deadline on the connection, 60 s in production) is
// still there: every call whose first byte took over a minute was
// answered 499 "the client closed its connection" and billed, because
// the look at the client's connection gave up at that deadline and read
// as a close.
func TestClientWaitingPastTheRequestReadTimeoutIsNotGone(t *testing.T) {
	proxy.SetRequestReadTimeout(t, 300*time.Millisecond)
	h := newHarness(t, harnessOptions{firstByteTimeout: "20s",
		upstream: proxytest.Options{FirstByteDelay: 1500 * time.Millisecond}})
	for _, body := range []string{chatBody, strings.Replace(chatBody, `"model"`, `"stream":true,"model"`, 1)} {
		resp := h.post("/v1/chat/completions", body)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || strings.Contains(string(got), "client_closed_request") {
			t.Fatalf("%d %s; want the answer", resp.StatusCode, got)
		}
	}
	for _, ev := range h.events(2) {
		if ev.Status != 200 {
			t.Errorf("event %+v; want status 200", ev)
		}
	}
}

// rawChatAnswer is a whole chat answer as a raw upstream writes it.
var rawChatAnswer = func() string {
	const body = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}()

// chatRequest is a whole chat call with the harness key, as a client
// writes it on its connection.
func (h *harness) chatRequest(body string) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + h.key +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// A call waiting for a connection of an upstream whose max_connections
// were all in use went out once one was free, after its client had left
// (curl -m 3, the connection free at 10 s): the upstream generated it and
// the call was billed in full, a 200. The client is looked at while the
// call waits: a 499 within a second or so of its leaving, nothing sent,
// and the upstream's health left alone (it answered nothing wrong).
func TestClientGoneWhileWaitingForAConnectionIsNotSent(t *testing.T) {
	h := newPoolHarness(t, 1, "  retries: 0")
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	var requests atomic.Int32
	raw := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		requests.Add(1)
		<-release
		_, err := io.WriteString(c, rawChatAnswer)
		return err == nil
	})
	h.setUpstreamOf(0, raw, "first_byte_timeout: 20s, max_connections: 1")
	held := make(chan int, 1)
	go func() {
		resp := h.post("/v1/chat/completions", smallChat)
		readAll(t, resp)
		held <- resp.StatusCode
	}()
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := requests.Load(); n != 1 {
			return fmt.Errorf("the upstream has %d requests, want the first call's", n)
		}
		return nil
	})
	conn := rawRequest(t, h.url, h.chatRequest(smallChat), "")
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := h.statuses()["p0"].InFlight; n != 2 {
			return fmt.Errorf("%d calls in flight, want the second waiting for the connection", n)
		}
		return nil
	})
	h.leftUnbilled(conn, 5*time.Second)
	releaseOnce()
	if status := <-held; status != 200 {
		t.Fatalf("the first call got %d", status)
	}
	if ev := h.events(1)[0]; ev.Status != 200 {
		t.Fatalf("event %+v, want the first call's 200 alone", ev)
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("the upstream got %d requests, want 1: the call whose client left was sent", n)
	}
	if st := h.statuses()["p0"]; st.LastError != "" {
		t.Fatalf("p0 is blamed for a call it never got: %+v", st)
	}
}

// A call whose first try could not connect (a TLS handshake that hangs
// until connect_timeout) moved on to the next member after its client
// had left, which generated the answer, billed in full as a 200. The
// client is looked at before a retry: a 499, and the next member gets
// nothing.
func TestClientGoneBeforeARetryIsNotSent(t *testing.T) {
	hang := newSilentUpstream(t)
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin")
	h.setUpstreamOf(0, strings.Replace(hang.URL, "http://", "https://", 1), "connect_timeout: 1s, first_byte_timeout: 8s")
	h.p0First()
	conn := rawRequest(t, h.url, h.chatRequest(smallChat), "")
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if hang.calls.Load() == 0 {
			return fmt.Errorf("no handshake with p0 yet")
		}
		return nil
	})
	h.leftUnbilled(conn, 10*time.Second)
	if n := h.ups[1].ChatCalls(); n != 0 {
		t.Fatalf("p1 got %d calls after their client had left", n)
	}
}

// requestsTotal is the tollgate_requests_total lines of model small.
func requestsTotal(t *testing.T, h *harness) string {
	t.Helper()
	var lines []string
	for _, line := range strings.Split(scrape(t, h), "\n") {
		if strings.HasPrefix(line, `tollgate_requests_total{model="small",`) {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}

// A call to a model's only upstream whose client left while a new
// connection was opening (a connect that gets no SYN-ACK) went on
// dialling to connect_timeout and then counted as a 503, though the
// README promises a 499 with nothing sent; a pooled model's call was a
// 499, looked at before its retry. The client is looked at while the
// connect takes: the dial is abandoned and the call is a 499 within a
// second or so, nothing billed, the upstream not blamed.
func TestClientGoneWhileConnectingIsA499(t *testing.T) {
	addr := startFullBacklog(t)
	h := newPoolHarness(t, 1, "  retries: 0")
	h.setUpstreamOf(0, "http://"+addr+"/v1", "connect_timeout: 3s, first_byte_timeout: 8s, response_timeout: 8s")
	var conns []net.Conn
	for _, body := range []string{smallChat, `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`} {
		conns = append(conns, rawRequest(t, h.url, h.chatRequest(body), ""))
	}
	time.Sleep(300 * time.Millisecond) // both are dialling
	for _, c := range conns {
		c.Close()
	}
	left := time.Now()
	counted := func(status string) bool {
		return strings.Contains(requestsTotal(t, h.harness), `upstream="p0",endpoint="/v1/chat/completions",status="`+status+`"} 2`)
	}
	checkFor(t, 6*time.Second, 20*time.Millisecond, func() error {
		if !counted("499") && !counted("503") {
			return fmt.Errorf("the calls are not counted yet")
		}
		return nil
	})
	if took := time.Since(left); !counted("499") || took > 2500*time.Millisecond {
		t.Fatalf("%s after their clients left, the calls are counted as\n%s\nwant two 499s, before connect_timeout (3s)", took.Round(100*time.Millisecond), requestsTotal(t, h.harness))
	}
	if evs := h.rec.Events(); len(evs) != 0 {
		t.Fatalf("event %+v for a call no upstream saw; want none billed", evs[0])
	}
	if st := h.statuses()["p0"]; st.LastError != "" {
		t.Fatalf("p0 is blamed for calls whose clients left: %+v", st)
	}
}

// A pooled call whose first try failed and whose client was found gone
// before the retry went out was counted, and billed, under the member
// the retry would have gone to, which got nothing: p0 took the prompt
// and answered 503, the client had left meanwhile, and the 499 and its
// event named p1, whose tollgate_upstream_calls_total did not move. It
// names the upstream the call last tried.
func TestClientGoneBeforeARetryCountsUnderTheUpstreamTried(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_after: 100",
		proxytest.Options{Status: 503, FirstByteDelay: 500 * time.Millisecond}, proxytest.Options{})
	h.p0First()
	conn := rawRequest(t, h.url, h.chatRequest(smallChat), "")
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if h.ups[0].ChatCalls() == 0 {
			return fmt.Errorf("p0 has not got the call yet")
		}
		return nil
	})
	conn.Close() // before p0's 503, and before the gateway looks at the client
	ev := h.events(1)[0]
	if ev.Status != 499 || ev.Upstream != "p0" {
		t.Errorf("event %+v, want a 499 under p0, which took the prompt", ev)
	}
	if got := requestsTotal(t, h.harness); !strings.Contains(got, `upstream="p0",endpoint="/v1/chat/completions",status="499"} 1`) ||
		strings.Contains(got, `upstream="p1"`) {
		t.Errorf("the call is counted as\n%s\nwant one 499 under p0", got)
	}
	if n := h.ups[1].ChatCalls(); n != 0 {
		t.Fatalf("p1 got %d calls after their client had left", n)
	}
}

// p0First gives p0 of a two-member pool harness the weight that wins
// the round robin's first turn, and waits until it is in force.
func (h *poolHarness) p0First() {
	h.t.Helper()
	h.writeConfig(strings.Replace(readFile(h.t, h.cfgPath), "upstreams: [p0, p1]", "upstreams: [{name: p0, weight: 1000}, p1]", 1))
	checkFor(h.t, 3*time.Second, 10*time.Millisecond, func() error {
		for _, m := range h.gw.World().Config.Models {
			if m.ID == "small" && len(m.Upstreams) == 2 && m.Upstreams[0].Weight == 1000 {
				return nil
			}
		}
		return fmt.Errorf("p0's weight is not in force yet")
	})
}

// leftUnbilled closes conn, the connection of a client whose call no
// upstream got, and checks that the call is counted a 499 within wait
// and billed nothing.
func (h *poolHarness) leftUnbilled(conn net.Conn, wait time.Duration) {
	h.t.Helper()
	conn.Close()
	checkFor(h.t, wait, 10*time.Millisecond, func() error {
		if !strings.Contains(scrape(h.t, h.harness), `status="499"`) {
			return fmt.Errorf("no 499 counted yet for the call whose client left")
		}
		return nil
	})
	if evs := h.rec.Events(); len(evs) != 0 {
		h.t.Fatalf("events %+v for a call no upstream saw; want none billed", evs[0])
	}
}
