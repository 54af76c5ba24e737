package proxy_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/gatewaytest"
)

// An admin token is any string of 16 bytes or more (the README suggests
// openssl rand -hex 16), so the tg-/tga- prefixes did not find it: a
// request line "Authorization Bearer <token>" without its colon reached
// the log whole in fasthttp's "missing colon" error. Whatever the value,
// the credential headers' values are redacted, as is any Bearer or Basic
// credential, in the log and in the 400; and so is a bare JWT, a key
// without its tg- prefix.
func TestMalformedHeaderDoesNotLogAnyCredential(t *testing.T) {
	var mu sync.Mutex
	var log strings.Builder
	g := gatewaytest.Start(t, gatewaytest.Options{
		Config: func(_, dir string) string {
			return "server:\n  listen: 127.0.0.1:0\n  data_dir: " + dir + "\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n" +
				"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"
		},
		Logf: func(format string, args ...any) {
			mu.Lock()
			fmt.Fprintf(&log, format+"\n", args...)
			mu.Unlock()
		},
	})
	const secret = "SECRET0123456789abcdef"
	for _, line := range []string{
		"Authorization Bearer admintoken-" + secret,
		"authorization bearer " + secret,
		"Proxy-Authorization Basic " + secret,
		"Cookie session=" + secret,
		"X-Api-Key " + secret,
		"api-key " + secret,
		"Bearer " + secret,
		// A key without its tg- prefix, under a header name of no
		// credential: the JWT is the key, tg- added back.
		"Token eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhY21lIn0." + secret,
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(g.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte("POST /admin/v1/accounts HTTP/1.1\r\nHost: x\r\n" + line + "\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		// The server logs the error, then answers and closes.
		answer, err := io.ReadAll(conn)
		conn.Close()
		if err != nil || !strings.HasPrefix(string(answer), "HTTP/1.1 400") {
			t.Fatalf("%q: answer %q, %v; want 400 then close", line, answer, err)
		}
		if strings.Contains(string(answer), secret) {
			t.Errorf("%q: the 400 quotes the secret back: %q", line, answer)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(log.String(), "missing colon") {
		t.Fatalf("no malformed header was logged:\n%s", log.String())
	}
	if strings.Contains(log.String(), secret) {
		t.Fatalf("a secret reached the log:\n%s", log.String())
	}
}
