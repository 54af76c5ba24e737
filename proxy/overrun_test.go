package proxy_test

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/proxy"
)

// An upstream that followed an answer with a second response on the same
// write: back-to-back calls then each got the answer to the call before
// ("alice got: SMUGGLED / bob got: answer for alice / carol got: answer
// for bob"), billed on its usage. Each call gets its own answer; the
// overrun is counted and logged, without the bytes.
func TestUpstreamAnswerOverrunDoesNotShiftAnswers(t *testing.T) {
	var log testutil.Log
	h := newHarness(t, harnessOptions{logf: log.Logf})
	answer := func(who string) string {
		body := fmt.Sprintf(`{"id":"chatcmpl-%s","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"answer for %s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}`, who, who)
		return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	var overran atomic.Bool
	raw := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		a := answer("caller")
		if overran.CompareAndSwap(false, true) {
			a += answer("SMUGGLED")
		}
		_, err := fmt.Fprint(c, a)
		return err == nil
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, raw, 1))
	const request = `{"model":"small","messages":[{"role":"user","content":"hi"}]}`
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if got := string(readAll(t, h.post("/v1/chat/completions", request))); !strings.Contains(got, "chatcmpl-caller") {
			return fmt.Errorf("got %s", got)
		}
		if !overran.Load() {
			return fmt.Errorf("the raw upstream is not in force yet")
		}
		return nil
	})
	for i := range 5 {
		if got := string(readAll(t, h.post("/v1/chat/completions", request))); !strings.Contains(got, "chatcmpl-caller") {
			t.Fatalf("call %d after the overrun got %s", i+1, got)
		}
	}
	if m := scrape(t, h); !strings.Contains(m, "tollgate_upstream_overruns_total{upstream=\"local\"} 1\n") {
		t.Fatalf("the overrun is not counted:\n%s", m)
	}
	lines := log.Matching("after the end of an answer")
	if len(lines) != 1 || strings.Contains(lines[0], "SMUGGLED") {
		t.Fatalf("logged %q, want one line without the bytes", lines)
	}
}

// An upstream whose response header fasthttp cannot read (a
// Content-Length twice, a header over 16 KiB): the client got a 503
// "upstream p0 is unreachable: the connection failed", and the log and
// the admin API's last_error quoted fasthttp's buffer, the model's answer
// included, for keys with logging off too. The client is told the header
// was invalid, nothing quotes the answer, and another member answers.
func TestUpstreamInvalidHeaderIsSaidWithoutTheAnswer(t *testing.T) {
	var log testutil.Log
	h := newPoolHarnessWith(t, harnessOptions{logf: log.Logf}, 2, "  retries: 1\n  balance: round_robin")
	const request = `{"model":"small","messages":[{"role":"user","content":"hi"}]}`
	p0 := h.ups[0].URL
	for header, says := range map[string]string{
		"Content-Length: 13\r\nContent-Length: 13\r\n":                         "sent an invalid response header (Content-Length twice)",
		"X-Big: " + strings.Repeat("b", 17<<10) + "\r\nContent-Length: 13\r\n": "sent an invalid response header (over 16 KiB)",
		"Content-Length: 13\r\nX-Bad\x01Name: SECRET\r\n":                      "sent an invalid response header (malformed mime header line)",
	} {
		bad := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"+header+"\r\nSECRET ANSWER")
			return false
		})
		cfg := strings.Replace(readFile(t, h.cfgPath), "name: p0, base_url: "+p0, "name: p0, base_url: "+bad, 1)
		p0 = bad
		h.writeConfig(strings.Replace(cfg, "upstreams: [p0, p1]", "upstreams: [p0]", 1))
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
			resp := h.post("/v1/chat/completions", request)
			got := string(readAll(t, resp))
			if resp.StatusCode != 503 || !strings.Contains(got, "upstream p0 "+says) {
				return fmt.Errorf("got %d %s", resp.StatusCode, got)
			}
			return nil
		})
		if st := h.statuses()["p0"]; !strings.Contains(st.LastError, says) || strings.Contains(st.LastError, "SECRET") {
			t.Fatalf("last_error %q", st.LastError)
		}
		// In a pool, the next member answers.
		h.writeConfig(strings.Replace(readFile(t, h.cfgPath), "upstreams: [p0]", "upstreams: [p0, p1]", 1))
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
			for range 2 {
				resp := h.post("/v1/chat/completions", request)
				if got := string(readAll(t, resp)); resp.StatusCode != 200 || !strings.Contains(got, `"choices"`) {
					return fmt.Errorf("got %d %s", resp.StatusCode, got)
				}
			}
			return nil
		})
	}
	if lines := log.Matching("SECRET"); len(lines) > 0 {
		t.Fatalf("the log quotes the answer: %q", lines)
	}
}
