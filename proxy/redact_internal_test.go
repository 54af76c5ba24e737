package proxy

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestRedactSecrets(t *testing.T) {
	for in, want := range map[string]string{
		`invalid header value "Bearer tg-eyJhbGciOi.abc"`:                           `invalid header value "Bearer tg-[redacted]"`,
		`token tga-0123456789abcdef`:                                                `token tga-[redacted]`,
		`invalid header value "tollgate_console=YWxpY2U.1795691508.abc.SIGSIG\x01"`: `invalid header value "tollgate_console=[redacted]"`,
		`cookie: a=1; tollgate_console=abc.def; b=2`:                                `cookie: [redacted]`,
		`nothing secret here`:                                                       `nothing secret here`,
		// An admin token needs no prefix; the header says what it is.
		`missing colon: "Authorization Bearer admintoken-SECRET": buffer size=101`: `missing colon: "Authorization Bearer [redacted]": buffer size=101`,
		`missing colon: "AUTHORIZATION: basic dXNlcjpwYXNz"`:                       `missing colon: "AUTHORIZATION: basic [redacted]"`,
		`missing colon: "proxy-authorization Negotiate abc def"`:                   `missing colon: "proxy-authorization [redacted]"`,
		`missing colon: "X-Api-Key 0123456789abcdef"`:                              `missing colon: "X-Api-Key [redacted]"`,
		`missing colon: "api-key:0123456789abcdef"`:                                `missing colon: "api-key:[redacted]"`,
		`missing colon: "Authorization Bearer tga-0123456789abcdef"`:               `missing colon: "Authorization Bearer tga-[redacted]"`,
		`missing colon: "Cookie session=ab\"cd; other=x"`:                          `missing colon: "Cookie [redacted]"`,
		`missing colon: "Bearer 0123456789abcdef"`:                                 `missing colon: "Bearer [redacted]"`,
		// A key without its tg- prefix is still a key; cut off, it may be.
		`missing colon: "Token eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl"`: `missing colon: "Token [redacted]"`,
		`missing colon: "X eyJhbGciOiJFZERTQSJ9.eyJzdWIiOi"`:                       `missing colon: "X [redacted]"`,
		`header eyJhbGciOiJFZERTQSJ9 alone is no token`:                            `header eyJhbGciOiJFZERTQSJ9 alone is no token`,
	} {
		if got := redactSecrets(in); got != want {
			t.Errorf("redactSecrets(%q) = %q, want %q", in, got, want)
		}
	}
}

// fasthttp's lines come at most one every fasthttpLogEvery after the
// first, saying how many were left out: a malformed request, which needs
// no key, wrote a line each, 6,000 a second from one client.
func TestFasthttpLinesAreThrottled(t *testing.T) {
	var lines []string
	at := time.Unix(1000, 0)
	l := newFasthttpLogger(func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) })
	l.now = func() time.Time { return at }
	for range 1000 {
		l.Printf("error when reading request headers: %s", "malformed mime header: missing colon: \"Bearer tg-abcdefgh12345\"")
	}
	at = at.Add(fasthttpLogEvery)
	l.Printf("error when reading request headers: %s", "the last one")
	if len(lines) != 2 || !strings.Contains(lines[1], "the last one (and 999 more lines of fasthttp's since the last, of any kind, not logged") {
		t.Fatalf("logged %d lines: %q", len(lines), lines)
	}
	if strings.Contains(lines[0], "abcdefgh12345") {
		t.Fatalf("a key reached the log: %q", lines[0])
	}
}
