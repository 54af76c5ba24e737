package proxy_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/proxy"
)

// A connection past the client connection cap is answered in the error
// envelope, as every other error is, with a time to retry: fasthttp's own
// answer was plain text ("The connection cannot be served because
// Server.Concurrency limit exceeded"), which an OpenAI SDK showed as an
// unparsed body. A connection closed frees its place.
func TestConnectionPastTheCapIsAnsweredInTheEnvelope(t *testing.T) {
	const limit = 2
	proxy.SetClientConnectionCap(t, limit)
	h := newHarness(t, harnessOptions{})
	models := "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + h.key + "\r\n\r\n"
	var held []net.Conn
	for range limit {
		c := rawRequest(t, h.url, models, "")
		if status := readStatus(t, c); status != http.StatusOK {
			t.Fatalf("a connection under the cap was answered %d", status)
		}
		held = append(held, c) // kept alive: it holds its place
	}

	c := rawRequest(t, h.url, models, "") // sent at once, as an SDK does
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer past the cap: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("past the cap: %d %q, want 503", resp.StatusCode, body)
	}
	var env struct {
		Error struct {
			Message, Type string
			Code          *string
		}
	}
	if err := json.Unmarshal(body, &env); err != nil || env.Error.Code == nil {
		t.Fatalf("past the cap: body %q (%s), want the error envelope", body, resp.Header.Get("Content-Type"))
	}
	if env.Error.Type != "service_unavailable_error" || *env.Error.Code != "server_overloaded" || !strings.Contains(env.Error.Message, "(2)") {
		t.Errorf("past the cap: %+v, want service_unavailable_error server_overloaded naming the cap", env.Error)
	}
	for name, want := range map[string]string{
		"Content-Type": "application/json", "Retry-After": "1", "Retry-After-Ms": "1000",
	} {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("past the cap: %s %q, want %q", name, got, want)
		}
	}
	if !resp.Close {
		t.Error("past the cap: no Connection: close")
	}
	if resp.Header.Get("x-request-id") == "" {
		t.Error("past the cap: no x-request-id")
	}
	if n, err := br.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("past the cap: the connection stayed open (%d, %v)", n, err)
	}

	held[0].Close()
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		c := rawRequest(t, h.url, models, "")
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errStatus(resp.StatusCode)
		}
		return nil
	})
}

type errStatus int

func (e errStatus) Error() string { return "answered " + http.StatusText(int(e)) }
