package proxy_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

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
