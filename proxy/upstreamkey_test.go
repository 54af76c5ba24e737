package proxy_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// upstreamKey is the api_key the gateway holds for its upstream, and
// maskedUpstreamKey how an error passed on may show it.
const (
	upstreamKey       = "sk-UPSTREAM-SECRET-abcdef123456"
	maskedUpstreamKey = "sk-...3456"
)

// withUpstreamKey gives the harness's upstream local the api_key
// upstreamKey.
func withUpstreamKey(h *harness) {
	h.t.Helper()
	cfg := readFile(h.t, h.cfgPath)
	h.writeConfig(strings.Replace(cfg, "    base_url: "+h.up.URL+"\n", "    base_url: "+h.up.URL+"\n    api_key: "+upstreamKey+"\n", 1))
	awaitAPIKey(h)
}

// awaitAPIKey waits until the upstream gets the key: the config is in
// force.
func awaitAPIKey(h *harness) {
	h.t.Helper()
	for range 200 {
		readAll(h.t, h.post("/v1/chat/completions", smallChat))
		reqs := h.up.Requests()
		if len(reqs) > 0 && reqs[len(reqs)-1].Header.Get("Authorization") == "Bearer "+upstreamKey {
			return
		}
	}
	h.t.Fatal("the upstream never got the api_key")
}

// An upstream's error that echoed the gateway's api_key (OpenAI's 401
// "Incorrect API key provided", a proxy's 500 quoting the request's
// headers, an error event, a stored response's 404) reached the client
// with the key in it. Every error passed on has it masked.
func TestUpstreamErrorsPassedOnMaskTheGatewaysKey(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	withUpstreamKey(h)
	echo := "request had Authorization: Bearer " + upstreamKey
	check := func(what string, status, want int, body []byte) {
		t.Helper()
		if status != want || strings.Contains(string(body), "SECRET") || !strings.Contains(string(body), maskedUpstreamKey) {
			t.Fatalf("%s: %d %s; want %d with the key masked as %s", what, status, body, want, maskedUpstreamKey)
		}
	}

	h.up.SetOptions(proxytest.Options{Status: 500, ErrorBody: echo})
	resp := h.post("/v1/chat/completions", smallChat)
	check("a 500 in text", resp.StatusCode, 500, readAll(t, resp))

	h.up.SetOptions(proxytest.Options{Status: 400, ErrorBody: `{"error":{"message":"` + echo + `","type":"invalid_request_error","code":null}}`})
	resp = h.post("/v1/chat/completions", smallChat)
	check("a 400 in JSON", resp.StatusCode, 400, readAll(t, resp))

	// A success status whose body is an error, quoted in the 502.
	h.up.SetOptions(proxytest.Options{Status: 200, ErrorBody: `{"error":{"message":"` + echo + `","type":"server_error"}}`})
	resp = h.post("/v1/chat/completions", smallChat)
	check("a 200 whose body is an error", resp.StatusCode, 502, readAll(t, resp))

	// The upstream's own error event, ending a stream under way.
	h.up.SetOptions(proxytest.Options{ErrorEventAfter: 2,
		ErrorEvent: `data: {"error":{"message":"` + echo + `","type":"server_error"}}` + "\n\n"})
	resp = h.post("/v1/chat/completions", strings.Replace(smallChat, `{`, `{"stream":true,`, 1))
	check("an error event", resp.StatusCode, 200, readAll(t, resp))

	h.up.SetOptions(proxytest.Options{})
	status, body := h.send("", "POST", "/v1/responses", createResp, "")
	if status != 200 {
		t.Fatalf("creating: %d %s", status, body)
	}
	id, _ := jsonField(t, body, "id").(string)
	h.up.SetOptions(proxytest.Options{Status: 404, ErrorBody: `{"error":{"message":"` + echo + `"}}`})
	status, body = h.send("", "GET", "/v1/responses/"+id, "", "")
	check("a stored response's 404", status, 404, body)
}

// openAIIncorrectKey is OpenAI's 401 for a key it does not know.
const openAIIncorrectKey = `{"error":{"message":"Incorrect API key provided: Authorization: Bearer ` + upstreamKey +
	`. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`

// An upstream's 401 or 403 refuses the gateway's api_key, not the
// client's: passed on, the SDKs raised AuthenticationError and the user
// took their own Tollgate key for bad, while the member stayed healthy
// and nothing was logged. It is a 502 upstream_credentials_refused naming
// the upstream, the key masked, logged, not billed.
func TestUpstream401IsTheGatewaysCredentialsNotTheClients(t *testing.T) {
	var log testutil.Log
	h := newHarness(t, harnessOptions{logf: log.Logf})
	withUpstreamKey(h)
	before := len(h.rec.Events())
	for _, status := range []int{401, 403} {
		h.up.SetOptions(proxytest.Options{Status: status, ErrorBody: openAIIncorrectKey})
		for _, body := range []string{smallChat, strings.Replace(smallChat, `{`, `{"stream":true,`, 1)} {
			e := wantError(t, h.post("/v1/chat/completions", body), 502, "upstream_credentials_refused")
			msg := e["message"].(string)
			if e["type"] != "upstream_error" || !strings.Contains(msg, "upstream local refused the gateway's credentials") ||
				!strings.Contains(msg, "Incorrect API key provided: Authorization: Bearer "+maskedUpstreamKey) || strings.Contains(msg, "SECRET") {
				t.Fatalf("%d: %v", status, e)
			}
		}
	}
	if n := len(h.rec.Events()); n != before {
		t.Fatalf("%d events recorded for a refusal", n-before)
	}
	if got := log.Matching("upstream local", "answered 401, refusing the gateway's credentials", maskedUpstreamKey); len(got) != 1 || strings.Contains(got[0], "SECRET") {
		t.Fatalf("logged %q; want one line naming the upstream, the key masked", got)
	}
	// A stored response's routes, asked of its holder with the same key.
	h.up.SetOptions(proxytest.Options{})
	status, body := h.send("", "POST", "/v1/responses", createResp, "")
	if status != 200 {
		t.Fatalf("creating: %d %s", status, body)
	}
	id, _ := jsonField(t, body, "id").(string)
	h.up.SetOptions(proxytest.Options{Status: 401, ErrorBody: openAIIncorrectKey})
	status, body = h.send("", "GET", "/v1/responses/"+id, "", "")
	if status != 502 || jsonField(t, body, "error", "code") != "upstream_credentials_refused" || strings.Contains(string(body), "SECRET") {
		t.Fatalf("GET %s: %d %s", id, status, body)
	}
}

// In a pool, the member whose key is refused is passed over for another,
// and counted against: every call to it would fail.
func TestUpstream401MovesOnAndCountsAgainstTheMember(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin", proxytest.Options{Status: 401, ErrorBody: openAIIncorrectKey})
	h.settings = map[int]string{0: "first_byte_timeout: 2s, api_key: " + upstreamKey}
	h.setPool("  retries: 1\n  balance: round_robin", h.names()...)
	h.answeredAll(6) // the other member's answers
	s := h.statuses()["p0"]
	if !strings.Contains(s.LastError, "refused the gateway's credentials (answered 401") || strings.Contains(s.LastError, "SECRET") {
		t.Fatalf("p0 %+v; want the refusal counted against it, the key masked", s)
	}
}

// An error that echoed the api_key with JSON escapes in it (sk\u002d…,
// PHP's \/ for a '/') was passed on unmasked: the bytes were not the
// key's, but every JSON parser read the key whole out of them.
func TestUpstreamErrorsPassedOnMaskTheGatewaysKeyEscaped(t *testing.T) {
	const key = "sk-proj/UPSTREAM-SECRET-abcdef123456"
	h := newHarness(t, harnessOptions{})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), "    base_url: "+h.up.URL+"\n", "    base_url: "+h.up.URL+"\n    api_key: "+key+"\n", 1))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		readAll(t, h.post("/v1/chat/completions", smallChat))
		if reqs := h.up.Requests(); len(reqs) == 0 || reqs[len(reqs)-1].Header.Get("Authorization") != "Bearer "+key {
			return fmt.Errorf("the upstream has not got the api_key yet")
		}
		return nil
	})
	// decoded is what a client's JSON parser reads of data: every string.
	decoded := func(data []byte) string {
		var v any
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatalf("not JSON: %s", data)
		}
		s, _ := json.Marshal(v)
		return strings.NewReplacer(`\u003c`, "<", `\u003e`, ">", `\u0026`, "&").Replace(string(s))
	}
	check := func(what string, data []byte) {
		t.Helper()
		if got := decoded(data); strings.Contains(got, "SECRET") || strings.Count(got, maskedUpstreamKey) != 2 {
			t.Fatalf("%s: %s reads %s; want the key masked as %s twice", what, data, got, maskedUpstreamKey)
		}
	}
	for _, echo := range []string{
		`sk\u002dproj\/UPSTREAM\u002dSECRET\u002dabcdef123456`,
		`sk-proj\/UPSTREAM-SECRET-abcdef123456`,
		`sk-proj/UPSTREAM-\u0053ECRET-abcdef123456`,
	} {
		// A plain copy beside it, and a quote escaped before it.
		errorJSON := `{"error":{"message":"bad key \"` + echo + `\"","type":"server_error","param":"` + key + `"}}`
		h.up.SetOptions(proxytest.Options{Status: 500, ErrorBody: errorJSON})
		resp := h.post("/v1/chat/completions", smallChat)
		if body := readAll(t, resp); resp.StatusCode != 500 {
			t.Fatalf("%s: %d %s", echo, resp.StatusCode, body)
		} else {
			check("a 500 in JSON with "+echo, body)
		}

		h.up.SetOptions(proxytest.Options{ErrorEventAfter: 2, ErrorEvent: "data: " + errorJSON + "\n\n"})
		stream := string(readAll(t, h.post("/v1/chat/completions", strings.Replace(smallChat, `{`, `{"stream":true,`, 1))))
		i := strings.Index(stream, `data: {"error"`)
		if i < 0 {
			t.Fatalf("no error event in %s", stream)
		}
		event, _, _ := strings.Cut(stream[i+len("data: "):], "\n")
		check("an error event with "+echo, []byte(event))
	}
}
