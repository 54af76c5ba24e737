package proxy_test

import (
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// nginxMovedPermanently is what nginx answers on port 80 of a provider
// that serves its API on https alone: an upstream whose base_url says
// http://.
const nginxMovedPermanently = "<html>\r\n<head><title>301 Moved Permanently</title></head>\r\n<body>\r\n<center><h1>301 Moved Permanently</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"

// An upstream's redirect reached the client as it came, without its
// Location: a 301 with nginx's page, a 307 with nothing, on chat
// streamed or not and on responses, with nothing logged. It is a 502
// upstream_bad_answer naming where the redirect points (the operator's
// fix of base_url), without the Location's userinfo or query, not billed,
// and logged once.
func TestUpstreamRedirectIsABadAnswerNamingItsLocation(t *testing.T) {
	var log testutil.Log
	h := newHarness(t, harnessOptions{logf: log.Logf})
	var status atomic.Int32
	status.Store(301)
	h.useRawUpstream(func(c net.Conn) bool {
		const location = "https://ops:hunter2@api.example.com/v1/chat/completions?sig=s3cret#x"
		if status.Load() == 307 {
			fmt.Fprintf(c, "HTTP/1.1 307 Temporary Redirect\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n", location)
			return true
		}
		fmt.Fprintf(c, "HTTP/1.1 301 Moved Permanently\r\nServer: nginx\r\nContent-Type: text/html\r\nLocation: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			location, len(nginxMovedPermanently), nginxMovedPermanently)
		return false
	})
	before := len(h.rec.Events())
	for _, st := range []int32{301, 307} {
		status.Store(st)
		for _, c := range []struct{ path, body string }{
			{"/v1/chat/completions", smallChat},
			{"/v1/chat/completions", strings.Replace(smallChat, `{`, `{"stream":true,`, 1)},
			{"/v1/responses", `{"model":"small","input":"hi"}`},
		} {
			e := wantError(t, h.post(c.path, c.body), 502, "upstream_bad_answer")
			msg := e["message"].(string)
			if e["type"] != "upstream_error" ||
				!strings.Contains(msg, fmt.Sprintf("answered %d with a redirect to https://api.example.com/v1/chat/completions;", st)) ||
				strings.Contains(msg, "hunter2") || strings.Contains(msg, "s3cret") || strings.Contains(msg, "<") {
				t.Fatalf("%d on %s: %v", st, c.path, e)
			}
		}
	}
	if n := len(h.rec.Events()); n != before {
		t.Fatalf("%d events recorded for a redirect not passed on", n-before)
	}
	got := log.Matching("upstream local", "answered 301 with a redirect to https://api.example.com/v1/chat/completions", "base_url")
	if len(got) != 1 || strings.Contains(got[0], "hunter2") || strings.Contains(got[0], "s3cret") {
		t.Fatalf("logged %q; want one line naming the upstream and where its redirect points", got)
	}
}

// In a pool, a member that redirects is passed over for another, and
// counted against none: the call is answered, and no member is ejected.
func TestUpstreamRedirectMovesOnAndEjectsNoMember(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin",
		proxytest.Options{Status: 301, ErrorBody: nginxMovedPermanently, StatusHeaders: map[string]string{"Location": "https://api.example.com/v1/chat/completions"}})
	h.answeredAll(6) // the other member's answers
	for name, s := range h.statuses() {
		if s.Ejections != 0 || s.State != "healthy" || s.LastError != "" {
			t.Fatalf("%s %+v; want a redirect counted against no member", name, s)
		}
	}
}

// The routes of a stored response (GET, DELETE, cancel, input_items)
// relayed the holder's redirect too, without its Location.
func TestResponsesStateRedirectIsABadAnswer(t *testing.T) {
	h := newPoolHarness(t, 1, "")
	id, at := h.create("", createResp, "")
	h.ups[at].SetOptions(proxytest.Options{Status: 302, ErrorBody: nginxMovedPermanently,
		StatusHeaders: map[string]string{"Location": "/elsewhere/v1/responses/" + id + "?token=s3cret"}})
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/responses/" + id},
		{"GET", "/v1/responses/" + id + "/input_items"},
		{"POST", "/v1/responses/" + id + "/cancel"},
		{"DELETE", "/v1/responses/" + id},
	} {
		status, body := h.send("", c.method, c.path, "", "")
		msg, _ := jsonField(t, body, "error", "message").(string)
		if status != 502 || jsonField(t, body, "error", "code") != "upstream_bad_answer" ||
			!strings.Contains(msg, "answered 302 with a redirect to http://127.0.0.1:") ||
			!strings.Contains(msg, "/elsewhere/v1/responses/"+id+";") || strings.Contains(msg, "s3cret") {
			t.Fatalf("%s %s: %d %s", c.method, c.path, status, body)
		}
	}
	// Not deleted by a DELETE that did not reach it: still the holder's.
	h.ups[at].SetOptions(proxytest.Options{})
	if status, body := h.send("", "GET", "/v1/responses/"+id, "", ""); status != 200 {
		t.Fatalf("GET after the redirects: %d %s", status, body)
	}
}

// A 304 Not Modified is no redirect, and the gateway asks nothing
// conditionally: it was a 502 "answered 304 with a redirect with no
// Location", and the log said to set base_url to where the redirect
// points. A 300 without a Location reads as such.
func TestUpstream304IsAnUnexpectedNotModifiedNotARedirect(t *testing.T) {
	var log testutil.Log
	h := newHarness(t, harnessOptions{logf: log.Logf})
	var status atomic.Int32
	status.Store(304)
	h.useRawUpstream(func(c net.Conn) bool {
		if status.Load() == 304 {
			fmt.Fprint(c, "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n")
			return true
		}
		const choices = "<html><a href=\"/v1/a\">a</a> <a href=\"/v1/b\">b</a></html>"
		fmt.Fprintf(c, "HTTP/1.1 300 Multiple Choices\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s", len(choices), choices)
		return true
	})
	e := wantError(t, h.post("/v1/chat/completions", smallChat), 502, "upstream_bad_answer")
	if msg := e["message"].(string); !strings.Contains(msg, "upstream local answered 304 with an unexpected Not Modified") || strings.Contains(msg, "redirect") {
		t.Fatalf("304: %v", e)
	}
	if got := log.Matching("upstream local answered 304"); len(got) != 1 || strings.Contains(got[0], "redirect") || !strings.Contains(got[0], "Not Modified") {
		t.Fatalf("logged %q; want one line saying it answered an unexpected Not Modified", got)
	}
	status.Store(300)
	e = wantError(t, h.post("/v1/chat/completions", smallChat), 502, "upstream_bad_answer")
	if msg := e["message"].(string); !strings.Contains(msg, "upstream local answered 300 with a redirect that names no Location;") {
		t.Fatalf("300: %v", e)
	}
}
