package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// idleMisbehaver is a raw-TCP upstream that stores one response,
// resp_abc123, answers its state calls, and does something to every
// connection left idle for idleFor: what its keep-alive deadline does
// to it.
type idleMisbehaver struct {
	ln      net.Listener
	idleFor time.Duration
	onIdle  func(c *net.TCPConn)

	mu       sync.Mutex
	requests map[string]int // "METHOD path" → how many were read
}

func startIdleMisbehaver(t *testing.T, idleFor time.Duration, onIdle func(c *net.TCPConn)) *idleMisbehaver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	u := &idleMisbehaver{ln: ln, idleFor: idleFor, onIdle: onIdle, requests: map[string]int{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go u.serve(c.(*net.TCPConn))
		}
	}()
	return u
}

const storedResponse = `{"id":"resp_abc123","object":"response","created_at":1,"status":"completed","model":"proxytest-small",` +
	`"output":[{"type":"message","id":"msg_abc123","role":"assistant","status":"completed","content":[{"type":"output_text","text":"hi","annotations":[]}]}],` +
	`"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}`

func (u *idleMisbehaver) serve(c *net.TCPConn) {
	defer c.Close()
	br := bufio.NewReader(c)
	var idle *time.Timer
	for {
		method, path, ok := readRawRequest(br)
		if idle != nil && !idle.Stop() {
			return // the upstream already acted on this connection
		}
		if !ok {
			return
		}
		u.mu.Lock()
		u.requests[method+" "+path]++
		u.mu.Unlock()
		body := `{"error":{"message":"no such route","type":"invalid_request_error"}}`
		status := "404 Not Found"
		switch method + " " + path {
		case "POST /v1/responses", "GET /v1/responses/resp_abc123", "POST /v1/responses/resp_abc123/cancel":
			body, status = storedResponse, "200 OK"
		case "GET /v1/responses/resp_abc123/input_items":
			body, status = `{"object":"list","data":[],"first_id":null,"last_id":null,"has_more":false}`, "200 OK"
		case "DELETE /v1/responses/resp_abc123":
			body, status = `{"id":"resp_abc123","object":"response","deleted":true}`, "200 OK"
		}
		fmt.Fprintf(c, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", status, len(body), body)
		idle = time.AfterFunc(u.idleFor, func() { u.onIdle(c) })
	}
}

func (u *idleMisbehaver) count(call string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.requests[call]
}

// readRawRequest reads one request and returns its method and path.
func readRawRequest(br *bufio.Reader) (method, path string, ok bool) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", "", false
	}
	fields := strings.Fields(line)
	if len(fields) != 3 {
		return "", "", false
	}
	method = fields[0]
	path, _, _ = strings.Cut(fields[1], "?")
	length := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return "", "", false
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, "Content-Length") {
			fmt.Sscan(strings.TrimSpace(v), &length)
		}
	}
	if _, err := io.CopyN(io.Discard, br, int64(length)); err != nil {
		return "", "", false
	}
	return method, path, true
}

// The state calls of a stored response (GET, DELETE, cancel, input_items)
// go on the upstream's kept connections under the rules of generation
// calls. They went through a client of their own that took a connection
// kept past the upstream's keep-alive as it was: an unasked `408
// Connection: close` written on it was the client's answer (Request
// Timeout 408), and a reset one a 503 "connection reset by peer", on the
// first call after every lull.
func TestResponseStateOnAConnectionTheUpstreamClosedWhileIdle(t *testing.T) {
	for name, onIdle := range map[string]func(c *net.TCPConn){
		"unasked 408": func(c *net.TCPConn) {
			io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
			c.Close()
		},
		"reset": func(c *net.TCPConn) {
			c.SetLinger(0)
			c.Close()
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{})
			const idleFor = 150 * time.Millisecond
			up := startIdleMisbehaver(t, idleFor, onIdle)
			h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, "http://"+up.ln.Addr().String()+"/v1", 1))
			checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
				status, body := h.send("", "POST", "/v1/responses", `{"model":"small","input":"hi"}`, "")
				if id := gjson.GetBytes(body, "id").Str; status != 200 || id != "resp_abc123" {
					return fmt.Errorf("creating the response through the fake upstream: %d %s", status, body)
				}
				return nil
			})
			for _, c := range []struct{ method, suffix, want string }{
				{"GET", "", `"id":"resp_abc123"`},
				{"POST", "/cancel", `"id":"resp_abc123"`},
				{"GET", "/input_items", `"object":"list"`},
				{"DELETE", "", `"deleted":true`}, // last: it forgets the id
			} {
				call := c.method + " /v1/responses/resp_abc123" + c.suffix
				before := up.count(call)
				// One GET leaves a kept connection; the upstream acts on it
				// while it is idle.
				if status, body := h.send("", "GET", "/v1/responses/resp_abc123", "", ""); status != 200 {
					t.Fatalf("GET to keep a connection: %d %s", status, body)
				}
				time.Sleep(3 * idleFor)
				status, body := h.send("", c.method, "/v1/responses/resp_abc123"+c.suffix, "", "")
				if status != 200 || !strings.Contains(string(body), c.want) {
					t.Fatalf("%s on a connection idle past the upstream's keep-alive: %d %s", call, status, body)
				}
				want := 1
				if c.method == "GET" && c.suffix == "" {
					want = 2 // the GET that kept the connection
				}
				if n := up.count(call) - before; n != want {
					t.Fatalf("the upstream read %s %d times, want %d", call, n, want)
				}
			}
		})
	}
}
