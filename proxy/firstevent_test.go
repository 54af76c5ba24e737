package proxy_test

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy"
)

// A stream's first event is its first whole event with a data line. A
// retry: line, an id: line or half an event is none: counted as the
// first byte, it kept the call on an upstream that then closed or
// stalled, and the client got a 200 with stream_interrupted alone,
// billed its prompt. Now the call is moved on (here, with one upstream,
// a 503) and not billed. Lines before the first event are relayed with
// it, byte for byte; a ping with data is an event, relayed, and counts.
func TestStreamFirstEventHasData(t *testing.T) {
	h := newHarness(t, harnessOptions{firstByteTimeout: "300ms"})
	body := `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	last := h.up.URL
	use := func(url string) {
		h.writeConfig(strings.Replace(readFile(t, h.cfgPath), last, url, 1))
		last = url
	}
	closes := func(parts ...string) string {
		return proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
			writeSSE(c, parts...)
			return false
		})
	}
	for _, tc := range []struct{ name, url, want string }{
		{"retry then the end", closes("retry: 3000\n\n", ""), "closed the stream before its first event"},
		{"retry and id then a close", closes("retry: 3000\n\nid: 1\n\n"), "closed the stream before its first event"},
		{"half an event", closes(`data: {"id":"chatcmpl-r","obj`), "closed the stream before its first event"},
		{"retry then silence", scriptedUpstream(t, 0, "retry: 3000\n\n"), "first_byte_timeout"},
	} {
		use(tc.url)
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
			resp := h.post("/v1/chat/completions", body)
			got := string(readAll(t, resp))
			if resp.StatusCode != 503 || !strings.Contains(got, tc.want) {
				return fmt.Errorf("%s: got %d %s", tc.name, resp.StatusCode, got)
			}
			return nil
		})
		time.Sleep(50 * time.Millisecond)
		if evs := h.rec.Events(); len(evs) != 0 {
			t.Fatalf("%s: billed %+v", tc.name, evs[0])
		}
	}

	use(closes("event: ping\ndata: {}\n\n"))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", body)
		got := string(readAll(t, resp))
		if resp.StatusCode != 200 || !strings.HasPrefix(got, "event: ping\ndata: {}\n\n") || !strings.Contains(got, "stream_interrupted") {
			return fmt.Errorf("a ping with data: got %d %s", resp.StatusCode, got)
		}
		return nil
	})
	h.events(1)

	prelude := "retry: 3000\n\n: waiting\nid: 1\n\n"
	answer := chatChunk("Hello", "stop") + "data: [DONE]\n\n"
	use(scriptedUpstream(t, 0, prelude, answer))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/chat/completions", body)
		got := string(readAll(t, resp))
		if resp.StatusCode != 200 || got != prelude+answer {
			return fmt.Errorf("got %d %q", resp.StatusCode, got)
		}
		return nil
	})
	h.events(2)
}

// vllmPrelude is what vLLM's Responses stream sends before the request
// reaches its engine: response.created and response.in_progress, at
// once, however long the request then waits in its queue.
const vllmPrelude = "event: response.created\n" +
	`data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_queued","object":"response","created_at":1,"status":"in_progress","model":"proxytest-small","output":[],"usage":null}}` + "\n\n" +
	"event: response.in_progress\n" +
	`data: {"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_queued","object":"response","created_at":1,"status":"in_progress","model":"proxytest-small","output":[],"usage":null}}` + "\n\n"

// A Responses stream's response.created and response.in_progress are not
// its first byte: vLLM sends them while the request is still queued. An
// upstream that sent them and then stalled past first_byte_timeout kept
// the call: the client got a 200 with those two events and
// stream_interrupted after idle_timeout, billed its prompt, and the pool's
// other member was never tried. Now the call moves on to it, and the
// client gets its whole stream alone.
func TestResponsesPreludeIsNotTheFirstByte(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin\n  retries: 2\n  eject_after: 100")
	var asked atomic.Int32
	queued := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		asked.Add(1)
		writeSSE(c, vllmPrelude)
		time.Sleep(2 * time.Second) // past first_byte_timeout and idle_timeout both
		return false
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), "base_url: "+h.ups[0].URL+", first_byte_timeout: 2s}",
		"base_url: "+queued+", first_byte_timeout: 500ms, idle_timeout: 300ms}", 1))
	body := `{"model":"small","stream":true,"input":"hi"}`
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if asked.Load() >= 2 {
			return nil
		}
		resp := h.post("/v1/responses", body)
		got := string(readAll(t, resp))
		if resp.StatusCode != 200 || strings.Contains(got, "resp_queued") || strings.Contains(got, "stream_interrupted") ||
			!strings.Contains(got, "response.completed") {
			t.Fatalf("got %d %s, want p1's whole stream alone", resp.StatusCode, got)
		}
		return fmt.Errorf("p0 asked %d times", asked.Load())
	})
	time.Sleep(100 * time.Millisecond)
	for _, ev := range h.rec.Events() {
		if ev.Upstream != "p1" {
			t.Fatalf("billed %+v, want p1's answers alone", ev)
		}
	}
}
