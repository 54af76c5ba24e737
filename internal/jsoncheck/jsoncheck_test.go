package jsoncheck

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestTooDeep(t *testing.T) {
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, tc := range []struct {
		name  string
		data  string
		limit int
		want  bool
	}{
		{"flat", `{"a":[1,2,{"b":3}]}`, 3, false},
		{"at the limit", nest(5), 5, false},
		{"one past", nest(6), 5, true},
		{"unclosed", strings.Repeat("[", 6), 5, true},
		{"objects", `{"a":{"b":{"c":{}}}}`, 3, true},
		{"many shallow", strings.Repeat("[],", 50), 5, false},
		{"brackets in strings", `["[[[[[[[[", "{{{{{{{{{{"]`, 5, false},
		{"escaped quote in string", `["\"[[[[[[[[[["]`, 5, false},
		{"deep after a string", `["\\",` + nest(6) + `]`, 5, true},
	} {
		if got := TooDeep([]byte(tc.data), tc.limit); got != tc.want {
			t.Errorf("%s: TooDeep(%.40q, %d) = %v, want %v", tc.name, tc.data, tc.limit, got, tc.want)
		}
	}
}

func BenchmarkTooDeepTypicalRequest(b *testing.B) {
	body := []byte(`{"model":"m","stream":true,"max_tokens":64,"messages":[` +
		strings.Repeat(`{"role":"user","content":"Say hello in one short sentence, please."},`, 20) +
		`{"role":"user","content":"hi"}]}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		TooDeep(body, MaxDepth)
	}
}

func TestDuplicateMember(t *testing.T) {
	many := func(n int, last string) string {
		var b strings.Builder
		b.WriteString("{")
		for i := range n {
			fmt.Fprintf(&b, `"k%d":%d,`, i, i)
		}
		b.WriteString(`"` + last + `":true}`)
		return b.String()
	}
	for _, tc := range []struct{ name, obj, want string }{
		{"none", `{"a":1,"b":2}`, ""},
		{"small", `{"include_usage":false,"include_usage":true}`, "include_usage"},
		{"escaped spelling", `{"a":1,"\u0061":2}`, "a"},
		{"past the small array, none", many(100, "k100"), ""},
		{"past the small array", many(100, "k3"), "k3"},
		{"among the first, found after", many(100, "k99"), "k99"},
		// Keys compared as Python's json reads them: gjson read every lone
		// surrogate as U+FFFD, and {"\ud800":1,"\udc00":2}, two keys to
		// vLLM, was refused as one written twice.
		{"two lone surrogates", `{"\ud800":1,"\udc00":2}`, ""},
		{"two lone surrogates past the small array", strings.Replace(many(100, `\udc00`), `"k50"`, `"\ud800"`, 1), ""},
		{"a lone surrogate and U+FFFD", `{"\ud800":1,"\ufffd":2,"` + "\uFFFD" + `x":3}`, ""},
		{"a high surrogate and the escape after it", `{"\ud800\u0041":1,"\ud800\u0042":2}`, ""},
		{"an escaped backslash, not a surrogate", `{"\\ud800":1,"\\udc00":2}`, ""},
		{"one lone surrogate twice", `{"\ud800":1,"\uD800":2}`, "\ufffd"},
		{"one lone surrogate, spelled two ways", `{"\ud800\u0041":1,"\ud800A":2}`, "\ufffdA"},
		{"a pair and its character", `{"\ud83d\ude00":1,"😀":2}`, "😀"},
		{"a lone low surrogate before a pair", `{"\udc00\ud83d\ude00":1,"\udc00😀":2}`, "\ufffd😀"},
	} {
		if got := DuplicateMember(gjson.Parse(tc.obj)); got != tc.want {
			t.Errorf("%s: DuplicateMember = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestDuplicateDecodedMember: keys compare as encoding/json decodes them,
// into the map a plugin body fills. "x\ud800" and "x\udc00" (distinct to
// Python) and two bytes that are not UTF-8 both read as U+FFFD, and the
// map kept the last silently.
func TestDuplicateDecodedMember(t *testing.T) {
	for _, tc := range []struct{ name, obj, want string }{
		{"none", `{"a":1,"b":2}`, ""},
		{"plain", `{"a":1,"a":2}`, "a"},
		{"escaped spelling", `{"a":1,"\u0061":2}`, "a"},
		{"two lone surrogates", `{"x\ud800":1,"x\udc00":2}`, "x\ufffd"},
		{"a lone surrogate and U+FFFD", `{"\ud800":1,"\ufffd":2}`, "\ufffd"},
		{"two bytes that are not UTF-8", "{\"a\xff\":1,\"a\xfe\":2}", "a\ufffd"},
		{"a high surrogate and the escape after it", `{"\ud800\u0041":1,"\ud800\u0042":2}`, ""},
		{"a pair and its character", `{"\ud83d\ude00":1,"😀":2}`, "😀"},
		{"an escaped backslash, not a surrogate", `{"\\ud800":1,"\\udc00":2}`, ""},
	} {
		if got := DuplicateDecodedMember(gjson.Parse(tc.obj)); got != tc.want {
			t.Errorf("%s: DuplicateDecodedMember = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestLoneSurrogate(t *testing.T) {
	for data, want := range map[string]bool{
		`{"name":"a\ud800b"}`:            true,
		`{"name":"a\udc00b"}`:            true,
		`{"name":"\ud800"}`:              true,
		`"\ud800\u0041"`:                 true,
		`"\udc00\ud800"`:                 true,
		`"\ud83d\ude00\ud83d"`:           true,
		`{"name":"\ud83d\ude00"}`:        false,
		`{"name":"\uD83D\uDE00 \u00e9"}`: false,
		`{"name":"\\ud800"}`:             false, // an escaped backslash, then text
		`{"name":"plain"}`:               false,
		`"\\"`:                           false,
	} {
		if got := LoneSurrogate([]byte(data)); got != want {
			t.Errorf("%s: %v, want %v", data, got, want)
		}
	}
}
