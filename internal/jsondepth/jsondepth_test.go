package jsondepth

import (
	"strings"
	"testing"
)

func TestExceeds(t *testing.T) {
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
		if got := Exceeds([]byte(tc.data), tc.limit); got != tc.want {
			t.Errorf("%s: Exceeds(%.40q, %d) = %v, want %v", tc.name, tc.data, tc.limit, got, tc.want)
		}
	}
}

func BenchmarkExceedsTypicalRequest(b *testing.B) {
	body := []byte(`{"model":"m","stream":true,"max_tokens":64,"messages":[` +
		strings.Repeat(`{"role":"user","content":"Say hello in one short sentence, please."},`, 20) +
		`{"role":"user","content":"hi"}]}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		Exceeds(body, Max)
	}
}
