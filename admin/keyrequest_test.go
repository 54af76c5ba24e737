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
		// Inside a name they broke the line wherever keys were listed.
		{"line\u2028break", "name must not contain line or paragraph separators (U+2028, U+2029)"},
		{"para\u2029break", "name must not contain line or paragraph separators (U+2028, U+2029)"},
		{"end\u2028", "name must not contain line or paragraph separators (U+2028, U+2029)"},
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

// "prod\u200bbackend" listed as "prodbackend": zero-width and other
// format characters passed the check, so two keys could show the same
// name in the console. They are refused anywhere in a name, but a zero
// width joiner that joins two emoji (the technologist, a skin-toned one,
// the rainbow flag) is kept.
func TestCheckKeyRequestRefusesInvisibleCharacters(t *testing.T) {
	const refused = "name must not contain invisible characters"
	for _, tc := range []struct{ name, want string }{
		{"prod\u200bbackend", refused + " (it has U+200B)"},
		{"\u200bprod", refused},
		{"prod\ufeff", refused + " (it has U+FEFF)"},
		{"prod\u2060backend", refused + " (it has U+2060)"},
		{"soft\u00adhyphen", refused},
		{"non\u200cjoiner", refused},
		{"hangul\u3164filler", refused + " (it has U+3164)"},
		{"cgj\u034fx", refused},
		{"tag\U000E0041", refused},
		{"prod\u200dbackend", refused + " (it has U+200D)"},
		{"\u200d\U0001F4BB", refused},
		{"\U0001F469\u200d", refused},
		{"\U0001F469\u200d\u200d\U0001F4BB", refused},
		{"laptop \U0001F469\u200d\U0001F4BB", ""},
		{"\U0001F469\U0001F3FD\u200d\U0001F4BB dev", ""},
		{"\U0001F3F3\ufe0f\u200d\U0001F308 team", ""},
		{"\U0001F468\u200d\U0001F469\u200d\U0001F467", ""},
		{"\u2764\ufe0f prod", ""},
		// Variation selectors but U+FE0E and U+FE0F right after a
		// pictograph (or a keycap's base) and a joiner but between two
		// emoji showed as nothing (found by a re-test session).
		{"prod\ufe0fbackend", refused + " (it has U+FE0F)"},
		{"prod\ufe0ebackend", refused + " (it has U+FE0E)"},
		{"prod\ufe00backend", refused + " (it has U+FE00)"},
		{"prod\U000E0100backend", refused + " (it has U+E0100)"},
		{"\u2764\ufe0f\ufe0f prod", refused + " (it has U+FE0F)"},
		{"\U0001F469\U0001F3FD\ufe0f", refused + " (it has U+FE0F)"},
		{"\u2605\u200d\u2605", refused + " (it has U+200D)"},
		{"\u2500\u200d\u2500", refused + " (it has U+200D)"},
		{"a\u200d\U0001F4BB", refused + " (it has U+200D)"},
		{"\u2764\u200d\U0001F525", refused + " (it has U+200D)"},
		{"\u2764\ufe0f\u200d\U0001F525 hot", ""},
		{"\u2601\ufe0e weather", ""},
		{"\u26F9\U0001F3FB\u200d\u2640\ufe0f", ""},
		{"\U0001F441\ufe0f\u200d\U0001F5E8\ufe0f", ""},
		{"\U0001F9D1\u200d\U0001F91D\u200d\U0001F9D1", ""},
		{"team 1\ufe0f\u20e3", ""},
		{"team 1\ufe0f", refused + " (it has U+FE0F)"},
		// A name of nothing but invisible characters shows as no name.
		{"\u200b", refused + " (it has U+200B)"},
		{"\ufeff\ufeff", refused + " (it has U+FEFF)"},
		{"\u00ad", refused + " (it has U+00AD)"},
		{"\u200b\ufeff\u00ad", refused + " (it has U+200B)"},
	} {
		p := admin.CheckKeyRequest(accounts.KeyRequest{Name: tc.name}, nil)
		switch {
		case tc.want == "" && p != nil:
			t.Errorf("%+q refused: %s", tc.name, p.Message)
		case tc.want != "" && (p == nil || p.Field != "name" || !strings.HasPrefix(p.Message, tc.want)):
			t.Errorf("%+q: %+v, want name: %s…", tc.name, p, tc.want)
		}
	}
}
