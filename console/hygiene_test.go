package console

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
)

// fasthttp logs a request it cannot parse with a snippet of its headers
// unless told not to: a client's key must not reach the gateway log that
// way.
func TestMalformedRequestDoesNotLogTheKey(t *testing.T) {
	g := startGateway(t, "")
	_, token, err := g.svc.CreateKey(t.Context(), "acme", accounts.KeyRequest{Name: "leak-check"})
	if err != nil {
		t.Fatal(err)
	}
	malformed := []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + "\r\nContent-Length: abc\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + "\r\nTransfer-Encoding: bogus\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer " + token + "\r\nbroken header line\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization Bearer " + token + "\r\n\r\n",
	}
	for _, raw := range malformed {
		conn, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte(raw)); err != nil {
			t.Fatal(err)
		}
		// The server logs the error, then closes: EOF means it has logged.
		answer, err := io.ReadAll(conn)
		conn.Close()
		if err != nil || !strings.HasPrefix(string(answer), "HTTP/1.1 400") {
			t.Fatalf("answer %q, %v; want 400 then close", answer, err)
		}
		if strings.Contains(string(answer), token[len(token)-40:]) {
			t.Errorf("the 400 quotes the key back: %q", answer)
		}
	}
	if logs := g.log.String(); strings.Contains(logs, token[len(token)-40:]) {
		t.Fatalf("the key reached the log:\n%s", logs)
	}
}
