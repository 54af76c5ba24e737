package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func rewrite(t testing.TB, body, model string, force bool) (string, bool) {
	t.Helper()
	f, apiErr := scanRequest([]byte(body))
	if apiErr != nil {
		t.Fatalf("scan %s: %v", body, apiErr)
	}
	out, injected := rewriteRequest(nil, []byte(body), &f, `"`+model+`"`, force)
	return string(out), injected
}

func TestRewriteRequest(t *testing.T) {
	cases := []struct {
		in, want string
		force    bool
		injected bool
	}{
		{`{"model":"a","messages":[]}`, `{"model":"up/a","messages":[]}`, false, false},
		{`{"model":"a","stream":true}`, `{"model":"up/a","stream":true,"stream_options":{"include_usage":true}}`, true, true},
		{`{ "model" : "a" , "stream":true }`, `{ "model" : "up/a" , "stream":true ,"stream_options":{"include_usage":true}}`, true, true},
		{`{"stream_options":{"include_usage":true},"model":"a"}`, `{"stream_options":{"include_usage":true},"model":"up/a"}`, true, false},
		{`{"stream_options":{"include_usage":false},"model":"a"}`, `{"stream_options":{"include_usage":true},"model":"up/a"}`, true, true},
		{`{"model":"a","stream_options":{}}`, `{"model":"up/a","stream_options":{"include_usage":true}}`, true, true},
		{`{"model":"a","stream_options":{"x":1}}`, `{"model":"up/a","stream_options":{"include_usage":true,"x":1}}`, true, true},
		{`{"model":"a","stream_options":null}`, `{"model":"up/a","stream_options":{"include_usage":true}}`, true, true},
		{`{"model":"a","stream_options":{"include_usage":null}}`, `{"model":"up/a","stream_options":{"include_usage":true}}`, true, true},
		{`{"model":"up/a"}`, `{"model":"up/a"}`, false, false},
	}
	for _, c := range cases {
		got, injected := rewrite(t, c.in, "up/a", c.force)
		if got != c.want || injected != c.injected {
			t.Errorf("rewrite(%s)\n got %s (injected %v)\nwant %s (injected %v)", c.in, got, injected, c.want, c.injected)
		}
	}
}

func TestAppendWithoutMember(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":1,"usage":null}`:            `{"a":1}`,
		`{"usage":null,"a":1}`:            `{"a":1}`,
		`{"usage":null}`:                  `{}`,
		`{"a":1, "usage" : null , "b":2}`: `{"a":1 , "b":2}`,
		`{"a":1,"usage":{"x":[1,2]}}`:     `{"a":1}`,
	} {
		v := gjson.Get(in, "usage")
		got, ok := appendWithoutMember(nil, []byte(in), v, "usage")
		if !ok || string(got) != want || !gjson.ValidBytes(got) {
			t.Errorf("%s: got %s (%v), want %s", in, got, ok, want)
		}
	}
	if _, ok := appendWithoutMember(nil, []byte(`{"us\u0061ge":null}`), gjson.Get(`{"us\u0061ge":null}`, "usage"), "usage"); ok {
		t.Error("escaped key should be left alone")
	}
}

// FuzzRewriteRequest: for any JSON object with a string model, the rewritten
// body is valid JSON with the upstream model, usage asked for when forced,
// and every other top-level member exactly as the client sent it.
func FuzzRewriteRequest(f *testing.F) {
	f.Add(`{"model":"a","stream":true,"messages":[{"role":"user","content":"hi"}]}`, true)
	f.Add(`{"stream_options":{"include_usage":false,"x":[1]},"model":"a"}`, true)
	f.Add(`{"model":"a","stream_options":{}}`, false)
	f.Add(" {\"model\" :\"\\u0061\"}\n", true)
	f.Fuzz(func(t *testing.T, body string, force bool) {
		fields, apiErr := scanRequest([]byte(body))
		if apiErr != nil || fields.Model.Type != gjson.String {
			return
		}
		out, _ := rewriteRequest(nil, []byte(body), &fields, `"up/model"`, force)
		if !gjson.ValidBytes(out) {
			t.Fatalf("invalid JSON out of %q: %q", body, out)
		}
		if m := gjson.GetBytes(out, "model"); m.Str != "up/model" {
			t.Fatalf("model %q in %q", m.Str, out)
		}
		if force && !gjson.GetBytes(out, "stream_options.include_usage").Bool() {
			t.Fatalf("include_usage not set in %q", out)
		}
		gjson.Parse(body).ForEach(func(k, v gjson.Result) bool {
			if k.Str == "model" || k.Str == "stream_options" && force {
				return true
			}
			if got := gjson.GetBytes(out, gjson.Escape(k.Str)); got.Raw != v.Raw && !k.Exists() {
				t.Fatalf("member %s changed: %s -> %s", k.Str, v.Raw, got.Raw)
			}
			return true
		})
	})
}

// Past the 32 keys the array holds, a map finds the duplicates, a key
// written twice far apart included.
func TestDuplicatesAmongManyTopLevelKeys(t *testing.T) {
	body := manyKeysBody(2000) + `,"k7":2}`
	if _, apiErr := scanRequest([]byte(body)); apiErr == nil || apiErr.Param != "k7" {
		t.Fatalf("2,000 keys and k7 again: %v", apiErr)
	}
	if _, apiErr := scanRequest([]byte(manyKeysBody(2000) + `}`)); apiErr != nil {
		t.Fatalf("2,000 distinct keys: %v", apiErr)
	}
}

// manyKeysBody is a chat body of model and n keys k0 … k(n-1), unclosed.
func manyKeysBody(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"small"`)
	for i := range n {
		fmt.Fprintf(&b, `,"k%d":1`, i)
	}
	return b.String()
}

// Checking a body's keys is linear in their number: compared pairwise,
// a body of 100,000 keys took 20 s of a core (make bench runs it).
func BenchmarkScanRequestManyKeys(b *testing.B) {
	body := []byte(manyKeysBody(100_000) + `}`)
	for b.Loop() {
		if _, apiErr := scanRequest(body); apiErr != nil {
			b.Fatal(apiErr)
		}
	}
}

// Lone surrogates are distinct keys to Python's json (vLLM, SGLang):
// gjson read them all as U+FFFD, and such a body got a 400 "duplicate
// key" though the upstream would have taken it.
func TestLoneSurrogateKeysAreNotDuplicates(t *testing.T) {
	if _, apiErr := scanRequest([]byte(`{"model":"small","messages":[],"\ud800":1,"\udc00":2}`)); apiErr != nil {
		t.Errorf("two lone surrogate keys: %v", apiErr)
	}
	if _, apiErr := scanRequest([]byte(`{"model":"small","\ud800":1,"\uD800":2}`)); apiErr == nil {
		t.Error("one lone surrogate key twice was taken")
	}
	items := gjson.Parse(`[{"type":"message","role":"user","content":"hi","\ud800":1,"\udc00":2}]`)
	if _, apiErr := itemReferences(items); apiErr != nil {
		t.Errorf("an input item with two lone surrogate keys: %v", apiErr)
	}
}
