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
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// nginxPlainHTTPToHTTPSPort is what nginx answers a plain HTTP request on
// a port it serves https on: an upstream whose base_url says http:// for
// an https port.
const nginxPlainHTTPToHTTPSPort = "<html>\r\n<head><title>400 The plain HTTP request was sent to HTTPS port</title></head>\r\n<body>\r\n<center><h1>400 Bad Request</h1></center>\r\n<center>The plain HTTP request was sent to HTTPS port</center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"

// An upstream behind nginx, with an http:// base_url on its https port,
// had every call answered 400 with nginx's HTML page: the client was
// blamed for the gateway's setting, the member stayed healthy, and
// nothing was logged. It is a 502 upstream_bad_answer that quotes none of
// the page, not billed, and the log names the upstream.
func TestUpstreamHTMLPageWith400IsABadAnswerNotTheClients(t *testing.T) {
	var log testutil.Log
	h := newHarness(t, harnessOptions{logf: log.Logf})
	h.useRawUpstream(func(c net.Conn) bool {
		fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\nServer: nginx\r\nContent-Type: text/html\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			len(nginxPlainHTTPToHTTPSPort), nginxPlainHTTPToHTTPSPort)
		return false // nginx closes the connection after it
	})
	before := len(h.rec.Events())
	for _, body := range []string{smallChat, strings.Replace(smallChat, `{`, `{"stream":true,`, 1)} {
		e := wantError(t, h.post("/v1/chat/completions", body), 502, "upstream_bad_answer")
		msg := e["message"].(string)
		if e["type"] != "upstream_error" || !strings.Contains(msg, "answered 400 with a body that is not a JSON object") ||
			strings.Contains(msg, "plain HTTP") || strings.Contains(msg, "<") {
			t.Fatalf("%v", e)
		}
	}
	if n := len(h.rec.Events()); n != before {
		t.Fatalf("%d events recorded for an answer not passed on", n-before)
	}
	if got := log.Matching("upstream local", "answered 400"); len(got) != 1 || strings.Contains(got[0], "plain HTTP") {
		t.Fatalf("logged %q; want one line naming the upstream, quoting nothing of the page", got)
	}
}

// In a pool, the page is not counted against the member, which may be
// about this request alone (a front's 413 for a large body, a firewall's
// 403 for a prompt's words): counted, one client's requests would eject
// every member fronted alike. Another member is tried, so a member whose
// front is misconfigured costs its calls a second try, not an error.
func TestUpstreamHTMLPageWith4xxMovesOnAndEjectsNoMember(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin", proxytest.Options{Status: 413, ErrorBody: "<html><body>413 Request Entity Too Large</body></html>"})
	h.answeredAll(6) // the other member's answers
	for name, s := range h.statuses() {
		if s.Ejections != 0 || s.State != "healthy" {
			t.Fatalf("%s %+v; want a page that may be the request's counted against no member", name, s)
		}
	}
}

// An upstream's 4xx in JSON (the OpenAI shape, or any other) is the
// request's error, passed on unchanged and not counted against it.
func TestUpstreamJSON4xxIsPassedOnUnchanged(t *testing.T) {
	const refusal = `{"error":{"message":"temperature must be at most 2","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}`
	for _, status := range []int{400, 404, 422} {
		h := newPoolHarness(t, 1, "", proxytest.Options{Status: status, ErrorBody: refusal})
		for range 4 {
			resp := h.post("/v1/chat/completions", smallChat)
			if got := string(readAll(t, resp)); resp.StatusCode != status || got != refusal {
				t.Fatalf("%d %s; want %d %s", resp.StatusCode, got, status, refusal)
			}
		}
		if s := h.statuses()["p0"]; s.Ejections != 0 || s.LastError != "" {
			t.Fatalf("p0 %+v; want a JSON 4xx not counted against it", s)
		}
	}
}

// useRawUpstream puts a raw upstream that answers each request with
// answer (see proxy.StartRawUpstream) in place of h's upstream, and
// waits until a call reaches it.
func (h *harness) useRawUpstream(answer func(c net.Conn) bool) {
	h.t.Helper()
	var hit atomic.Bool
	raw := proxy.StartRawUpstream(h.t, func(_, _ int, c net.Conn) bool {
		hit.Store(true)
		return answer(c)
	})
	h.writeConfig(strings.Replace(readFile(h.t, h.cfgPath), h.up.URL, raw, 1))
	checkFor(h.t, 3*time.Second, 20*time.Millisecond, func() error {
		readAll(h.t, h.post("/v1/chat/completions", smallChat))
		if !hit.Load() {
			return fmt.Errorf("the raw upstream is not in force yet")
		}
		return nil
	})
}
