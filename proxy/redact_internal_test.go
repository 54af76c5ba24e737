package proxy

import "testing"

func TestRedactSecrets(t *testing.T) {
	for in, want := range map[string]string{
		`invalid header value "Bearer tg-eyJhbGciOi.abc"`:                           `invalid header value "Bearer tg-[redacted]"`,
		`token tga-0123456789abcdef`:                                                `token tga-[redacted]`,
		`invalid header value "tollgate_console=YWxpY2U.1795691508.abc.SIGSIG\x01"`: `invalid header value "tollgate_console=[redacted]"`,
		`cookie: a=1; tollgate_console=abc.def; b=2`:                                `cookie: a=1; tollgate_console=[redacted]; b=2`,
		`nothing secret here`:                                                       `nothing secret here`,
	} {
		if got := redactSecrets(in); got != want {
			t.Errorf("redactSecrets(%q) = %q, want %q", in, got, want)
		}
	}
}
