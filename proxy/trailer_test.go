package proxy_test

import (
	"fmt"
	"strings"
	"testing"
)

// A chunked body whose trailer carries a field a trailer may not (one
// that frames, routes or authorizes the request) was a 400 saying the
// body was cut short, the connection having failed: the answer says
// which field is not allowed there.
func TestForbiddenTrailerFieldSaysSo(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	auth := "Authorization: Bearer " + h.key + "\r\n"
	for _, field := range []string{"Authorization: Bearer x", "Host: y", "Content-Length: 5"} {
		body := fmt.Sprintf("%x\r\n%s\r\n0\r\n%s\r\n\r\n", len(chatBody), chatBody, field)
		conn := rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+auth+"Transfer-Encoding: chunked\r\n\r\n", body)
		status, answer := answerAndClose(t, conn)
		name, _, _ := strings.Cut(field, ":")
		if status != 400 || !strings.Contains(answer, "trailer") || !strings.Contains(answer, name) || strings.Contains(answer, "cut short") {
			t.Errorf("trailer %q: %d %s, want a 400 saying %s is not allowed in the trailer", field, status, answer, name)
		}
		if strings.Contains(answer, "Bearer x") {
			t.Errorf("trailer %q: the answer quotes its value: %s", field, answer)
		}
	}
	// A trailer of allowed fields is read as before.
	body := fmt.Sprintf("%x\r\n%s\r\n0\r\nX-Checksum: abc\r\n\r\n", len(chatBody), chatBody)
	conn := rawRequest(t, h.url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+auth+"Transfer-Encoding: chunked\r\n\r\n", body)
	if st := readStatus(t, conn); st != 200 {
		t.Fatalf("an allowed trailer field: %d, want 200", st)
	}
	if n := len(h.up.Requests()); n != 1 {
		t.Fatalf("%d calls reached the upstream, want the one with an allowed trailer", n)
	}
}
