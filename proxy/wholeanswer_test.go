package proxy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/proxy"
)

// wholeAnswerBody is a non-streamed chat answer with the upstream's usage.
const wholeAnswerBody = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"proxytest-small",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"hello there"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":9,"completion_tokens":500,"total_tokens":509}}`

// pausingUpstream answers a request whose body holds "pause" with the
// header and the first `first` bytes of body, then the rest after pause,
// unless the gateway closes the connection first, which it reports on
// closed; any other request gets body at once.
func pausingUpstream(t *testing.T, body string, first int, pause time.Duration) (baseURL string, closed <-chan time.Duration) {
	t.Helper()
	closedc := make(chan time.Duration, 16)
	addr := proxy.ServeConns(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := readUpstreamRequest(br)
			if err != nil {
				return
			}
			head := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
			if !strings.Contains(req, "pause") {
				if _, err := io.WriteString(c, head+body); err != nil {
					return
				}
				continue
			}
			if _, err := io.WriteString(c, head+body[:first]); err != nil {
				return
			}
			paused := time.Now()
			_ = c.SetReadDeadline(paused.Add(pause))
			if _, err := br.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
				closedc <- time.Since(paused) // the gateway closed it (or sent more, which it must not)
				return
			}
			_ = c.SetReadDeadline(time.Time{})
			if _, err := io.WriteString(c, body[first:]); err != nil {
				return
			}
		}
	})
	return "http://" + addr + "/v1", closedc
}

// readUpstreamRequest reads one request and returns its body.
func readUpstreamRequest(br *bufio.Reader) (string, error) {
	length := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return "", err
		}
		if line == "\r\n" {
			break
		}
		if name, value, ok := strings.Cut(line, ":"); ok && strings.EqualFold(name, "Content-Length") {
			length, _ = strconv.Atoi(strings.TrimSpace(value))
		}
	}
	b := make([]byte, length)
	_, err := io.ReadFull(br, b)
	return string(b), err
}

// useUpstream points the harness's model at baseURL and waits until the
// reload took.
func useUpstream(t *testing.T, h *harness, baseURL string) {
	t.Helper()
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, baseURL, 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", chatBody)
		body := readAll(t, resp)
		if resp.StatusCode != 200 || gjson.GetBytes(body, "usage.completion_tokens").Int() != 500 {
			return fmt.Errorf("got %d %s", resp.StatusCode, body)
		}
		return nil
	})
}

const pauseBody = `{"model":"small","messages":[{"role":"user","content":"pause"}]}`

// A client that gave up on a non-streamed call after the upstream had
// sent its header and a few bytes of body was billed the whole answer,
// 500 completion tokens at the upstream's count, and the upstream's
// connection stayed open until it sent the rest: the gateway looked at
// the client only until the first byte of body. It is billed as a client
// gone before the answer (499, the prompt on estimate), and the upstream
// connection is closed within a second or so.
func TestClientGoneMidWholeAnswerStopsTheCall(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	const pause = 4 * time.Second
	baseURL, closed := pausingUpstream(t, wholeAnswerBody, 20, pause)
	useUpstream(t, h, baseURL)
	before := len(h.rec.Events())

	client := &http.Client{Timeout: time.Second}
	req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(pauseBody))
	req.Header.Set("Authorization", "Bearer "+h.key)
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the client got %d during the upstream's pause", resp.StatusCode)
	}
	select {
	case after := <-closed:
		if after > pause*3/4 {
			t.Errorf("the upstream connection was closed %s into the pause", after)
		}
	case <-time.After(pause + time.Second):
		t.Fatal("the upstream connection was left open after its client left")
	}
	checkFor(t, 2*time.Second, 20*time.Millisecond, func() error {
		evs := h.rec.Events()
		if len(evs) != before+1 {
			return fmt.Errorf("%d events, want one", len(evs)-before)
		}
		if ev := evs[len(evs)-1]; ev.Status != 499 || ev.UsageSource != meter.SourceEstimated || ev.PromptTokens == 0 || ev.CompletionTokens != 0 {
			return fmt.Errorf("event %+v, want 499 billed its prompt on estimate", ev)
		}
		return nil
	})
}

// Some upstreams send whitespace first to keep the connection of a long
// non-streamed generation open. The body was timed by idle_timeout from
// its first byte, and an answer whose rest came later than that was cut
// with a 502 "the connection timed out", unbilled; it is due within
// response_timeout, as its header was.
func TestWholeAnswerPausingPastIdleTimeoutIsRelayed(t *testing.T) {
	h := newHarness(t, harnessOptions{idleTimeout: "1s"})
	padded := "  \n" + wholeAnswerBody
	baseURL, closed := pausingUpstream(t, padded, 3, 2500*time.Millisecond)
	useUpstream(t, h, baseURL)
	before := len(h.rec.Events())

	resp := h.post("/v1/chat/completions", pauseBody)
	body := readAll(t, resp)
	if resp.StatusCode != 200 || string(body) != padded {
		t.Fatalf("got %d %s, want the whole answer", resp.StatusCode, body)
	}
	select {
	case after := <-closed:
		t.Fatalf("the upstream connection was closed %s into the pause", after)
	default:
	}
	evs := h.events(before + 1)
	if ev := evs[len(evs)-1]; ev.Status != 200 || ev.UsageSource != meter.SourceUpstream || ev.CompletionTokens != 500 {
		t.Fatalf("event %+v, want 200 billed the upstream's usage", ev)
	}
}

// A body not finished within response_timeout is the 504 of an answer not
// generated in time, as a header that did not come is, and not billed.
func TestWholeAnswerUnfinishedWithinResponseTimeoutIs504(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	baseURL, _ := pausingUpstream(t, wholeAnswerBody, 20, 4*time.Second)
	useUpstream(t, h, baseURL)
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), "idle_timeout: 5s", "idle_timeout: 5s\n    response_timeout: 2s", 1))
	before := len(h.rec.Events())
	start := time.Now()
	resp := h.post("/v1/chat/completions", pauseBody)
	wantError(t, resp, 504, "upstream_timeout")
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the 504 came after %s, response_timeout 2s", took)
	}
	if resp.Header.Get("x-should-retry") != "false" {
		t.Errorf("x-should-retry %q, want false", resp.Header.Get("x-should-retry"))
	}
	time.Sleep(50 * time.Millisecond)
	if n := len(h.rec.Events()); n != before {
		t.Fatalf("%d events for an answer not finished in time", n-before)
	}
}
