package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy/proxytest"
)

// startFloor serves mode on a random port in front of a fake upstream of
// 5-word answers and returns the floor's base URL. The floor runs until
// the test binary exits: it has no stop, as the benchmark needs none.
func startFloor(t *testing.T, serve func(net.Listener, string) error) string {
	t.Helper()
	up := proxytest.NewServer(proxytest.Options{Chunks: 5})
	t.Cleanup(up.Close)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = serve(ln, up.Addr) }()
	return "http://" + ln.Addr().String() + "/v1"
}

// Both hops relay whole answers and streams, many in turn over one
// keep-alive connection (a hop that got a response's end wrong would
// hang, cut or mix them up), and accept new connections after a GC.
func TestFloorsRelayAnswersAndStreams(t *testing.T) {
	for name, serve := range map[string]func(net.Listener, string) error{"fasthttp": serveFasthttp, "epoll": serveEpoll} {
		t.Run(name, func(t *testing.T) {
			base := startFloor(t, serve)
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1}}
			for i := range 20 {
				if i == 10 {
					// A collected listener must not close the socket
					// under the loop: the next call needs a new connection.
					runtime.GC()
					runtime.GC()
					time.Sleep(20 * time.Millisecond)
					client.CloseIdleConnections()
				}
				stream := i%2 == 1
				body := `{"model":"proxytest-small","stream":` + map[bool]string{true: "true", false: "false"}[stream] +
					`,"messages":[{"role":"user","content":"hi"}]}`
				resp, err := client.Post(base+"/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("request %d: status %d, %v: %s", i, resp.StatusCode, err, got)
				}
				if stream {
					if n := strings.Count(string(got), "data: "); !strings.HasSuffix(string(got), "data: [DONE]\n\n") || n < 6 {
						t.Fatalf("stream %d: %d events, not ended by [DONE]:\n%s", i, n, got)
					}
					continue
				}
				var answer struct {
					Choices []struct{ Message struct{ Content string } }
				}
				if err := json.Unmarshal(got, &answer); err != nil || len(answer.Choices) != 1 || len(strings.Fields(answer.Choices[0].Message.Content)) != 5 {
					t.Fatalf("answer %d: %v: %s", i, err, got)
				}
			}
		})
	}
}

// The end of a response is found however its bytes are split.
func TestResponseEndByteByByte(t *testing.T) {
	for _, tc := range []struct{ name, resp string }{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"},
		{"empty", "HTTP/1.1 204 No Content\r\n\r\n"},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n10;ext=1\r\n0123456789abcdef\r\n0\r\n\r\n"},
		{"chunked with trailer", "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r responseEnd
			for i := range len(tc.resp) {
				done, err := r.feed([]byte{tc.resp[i]})
				if err != nil {
					t.Fatalf("byte %d: %v", i, err)
				}
				if done != (i == len(tc.resp)-1) {
					t.Fatalf("byte %d of %d: done %v", i, len(tc.resp), done)
				}
			}
		})
	}
	var r responseEnd
	if _, err := r.feed([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabc")); err == nil {
		t.Fatal("bytes past the end were taken")
	}
	var untilClose responseEnd
	if done, _ := untilClose.feed([]byte("HTTP/1.1 200 OK\r\n\r\nsome")); done || !untilClose.close {
		t.Fatal("a response without length must end when the upstream closes")
	}
}

func TestRequestSize(t *testing.T) {
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-length: 4\r\n\r\n"
	if n, err := requestSize([]byte(head + "ab")); err != nil || n != len(head)+4 {
		t.Fatalf("size %d, %v", n, err)
	}
	if n, err := requestSize([]byte(head[:20])); err != nil || n != -1 {
		t.Fatalf("incomplete head: %d, %v", n, err)
	}
	if _, err := requestSize([]byte("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")); err == nil {
		t.Fatal("a chunked request body was accepted")
	}
}

// An upstream that closes a kept-alive connection after answering: the
// epoll hop must drop it from its idle connections, or the next request
// is written to a closed socket.
func TestEpollDropsAnIdleConnectionTheUpstreamClosed(t *testing.T) {
	up, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	go func() {
		for {
			conn, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				buf := make([]byte, 4096)
				if _, err := conn.Read(buf); err != nil {
					return
				}
				_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				time.Sleep(50 * time.Millisecond) // after the answer, not with it
			}()
		}
	}()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = serveEpoll(ln, up.Addr().String()) }()
	client := &http.Client{Timeout: 10 * time.Second}
	for i := range 3 {
		// POST: a client would retry a GET on a connection that closed
		// without an answer, and hide the fault.
		resp, err := client.Post("http://"+ln.Addr().String()+"/", "text/plain", strings.NewReader("hi"))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "ok" {
			t.Fatalf("request %d: %q", i, body)
		}
		time.Sleep(100 * time.Millisecond) // the upstream closes its side meanwhile
	}
}
