package admin_test

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/admin"
)

// The console trimmed a key name and the admin API did not, so "trail\n"
// passed there and "  " here; both took C1 controls, bidi overrides that
// show "c1\u0085x\u202egpj.exe" as another name, and (through the form)
// invalid UTF-8, stored as U+FFFD. One check refuses them all, for both.
func TestCheckKeyRequestRefusesNamesThatDoNotShowAsTheyAre(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"", "name is required"},
		{"  ", "name is required"},
		{" pad ", "name must not begin or end with a space"},
		{"lead", ""},
		{"\u00a0nbsp", "name must not begin or end with a space"},
		{"trail\n", "name must not contain control characters"},
		{"tab\there", "name must not contain control characters"},
		{"del\x7f", "name must not contain control characters"},
		{"c1\u0085x", "name must not contain control characters"},
		{"c1\u009bx", "name must not contain control characters"},
		{"x\u202egpj.exe", "name must not contain bidirectional formatting characters"},
		{"x\u202ay", "name must not contain bidirectional formatting characters"},
		{"x\u2066y\u2069", "name must not contain bidirectional formatting characters"},
		{"x\u200fy", "name must not contain bidirectional formatting characters"},
		{"x\u200ey", "name must not contain bidirectional formatting characters"},
		{"x\u061cy", "name must not contain bidirectional formatting characters"},
		{"bad\xffutf8", "name must be valid UTF-8"},
		{"prod backend", ""},
		{"ünïcödé-名前", ""},
	} {
		p := admin.CheckKeyRequest(accounts.KeyRequest{Name: tc.name}, nil)
		switch {
		case tc.want == "" && p != nil:
			t.Errorf("%q refused: %s", tc.name, p.Message)
		case tc.want != "" && (p == nil || p.Field != "name" || !strings.HasPrefix(p.Message, tc.want)):
			t.Errorf("%q: %+v, want name: %s…", tc.name, p, tc.want)
		}
	}
}
