package proxy_test

import (
	"io"
	"strings"
	"testing"
)

// A client whose base URL lacks /v1, or has it twice, is told so: both
// got a bare "no route for POST /chat/completions", which did not say
// the base URL was the cause.
func TestWrongBaseURLIsHinted(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	body := `{"model":"small","messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct{ path, want string }{
		{"/chat/completions", "(the base URL ends in /v1: " + h.url + "/v1)"},
		{"/v1/v1/chat/completions", "(/v1 is in the path twice: the base URL ends in one /v1: " + h.url + "/v1)"},
		{"/responses", "(the base URL ends in /v1: " + h.url + "/v1)"},
		{"/nothing/here", ""},
	} {
		resp := h.post(c.path, body)
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("%s: status %d, want 404", c.path, resp.StatusCode)
		}
		if c.want == "" && strings.Contains(string(msg), "base URL") || !strings.Contains(string(msg), c.want) {
			t.Errorf("%s: %s\nwant %q", c.path, msg, c.want)
		}
	}
}
