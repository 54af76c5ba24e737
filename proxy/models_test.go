package proxy_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// get sends a request without a body; key "" sends no Authorization.
func (h *harness) get(method, path, key string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.url+path, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

// listed returns the elements of GET /v1/models' data as sent.
func (h *harness) listed() []json.RawMessage {
	h.t.Helper()
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(readAll(h.t, h.get("GET", "/v1/models", "")), &list); err != nil {
		h.t.Fatal(err)
	}
	return list.Data
}

// GET /v1/models/{id} (the SDKs' models.retrieve) answers the list's own
// element for id, with the list's auth rule: no key needed, and a header
// that is not a valid key changes nothing.
func TestModelRetrieve(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	data := h.listed()
	for i, id := range []string{"small", "large"} {
		for _, key := range []string{"", h.key, "sk-wrong"} {
			resp := h.get("GET", "/v1/models/"+id, key)
			body := readAll(t, resp)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || string(body) != string(data[i]) {
				t.Fatalf("%s with key %q: %d %s %s\nlisted: %s", id, key, resp.StatusCode, resp.Header.Get("Content-Type"), body, data[i])
			}
		}
	}
	resp := h.get("GET", "/v1/models", "sk-wrong")
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("list with a wrong key: %d; retrieve must follow the same rule", resp.StatusCode)
	}
	resp = h.get("HEAD", "/v1/models/small", "")
	if body := readAll(t, resp); resp.StatusCode != 200 || len(body) != 0 {
		t.Fatalf("HEAD: %d %s", resp.StatusCode, body)
	}
	for _, m := range []string{"POST", "DELETE"} {
		resp := h.get(m, "/v1/models/small", h.key)
		wantError(t, resp, 405, "method_not_allowed")
		if resp.Header.Get("Allow") != "GET, HEAD" {
			t.Fatalf("%s: Allow %q", m, resp.Header.Get("Allow"))
		}
	}
}

// An id the catalog does not serve gets OpenAI's own 404, byte for byte, so
// code that checks for model_not_found works against the gateway.
func TestModelRetrieveUnknownIsOpenAIsNotFound(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for path, id := range map[string]string{
		"/v1/models/gpt-9":              "gpt-9",
		"/v1/models/small/":             "small/",
		"/v1/models/test/small":         "test/small", // the hugging_face_id is not an id
		"/v1/models/proxytest-small":    "proxytest-small",
		"/v1/models/it%27s%20%22quoted": `it's "quoted`,
	} {
		resp := h.get("GET", path, "")
		body := readAll(t, resp)
		msg, _ := json.Marshal("The model '" + id + "' does not exist")
		want := `{"error":{"message":` + string(msg) + `,"type":"invalid_request_error","param":"model","code":"model_not_found"}}`
		if resp.StatusCode != 404 || string(body) != want {
			t.Errorf("%s: %d %s\nwant 404 %s", path, resp.StatusCode, body, want)
		}
	}
	// "/v1/models/" names no model: it is no route at all.
	wantError(t, h.get("GET", "/v1/models/", ""), 404, "not_found")
}

// Hugging Face style ids hold a slash: the id is the whole rest of the path,
// sent as is or percent-escaped as the SDKs send it.
func TestModelRetrieveIDWithSlash(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.writeConfig(readFile(t, h.cfgPath) + `  - id: Qwen/Qwen2.5-7B
    upstream: local
    context_length: 32768
    max_output_length: 8192
`)
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.get("GET", "/v1/models/Qwen/Qwen2.5-7B", "")
		if readAll(t, resp); resp.StatusCode != 200 {
			return fmt.Errorf("not served yet: %d", resp.StatusCode)
		}
		return nil
	})
	data := h.listed()
	if len(data) != 3 || !strings.Contains(string(data[2]), `"id":"Qwen/Qwen2.5-7B"`) {
		t.Fatalf("list: %s", data)
	}
	for _, path := range []string{"/v1/models/Qwen/Qwen2.5-7B", "/v1/models/Qwen%2FQwen2.5-7B"} {
		resp := h.get("GET", path, "")
		if body := readAll(t, resp); resp.StatusCode != 200 || string(body) != string(data[2]) {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
	}
	wantError(t, h.get("GET", "/v1/models/Qwen", ""), 404, "model_not_found")
}

// TestEveryResponseCarriesARequestID: the README promises x-request-id on
// every response; the model list, 404s, 405s and a 413 on chat had none.
func TestEveryResponseCarriesARequestID(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	get := func(path string) *http.Response {
		resp, err := h.client.Get(h.url + path)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	big := `{"model":"small","messages":[{"role":"user","content":"` + strings.Repeat("x", 70<<10) + `"}]}`
	for name, resp := range map[string]*http.Response{
		"model list":        get("/v1/models"),
		"one model":         get("/v1/models/small"),
		"unknown model":     get("/v1/models/nope"),
		"unknown route":     get("/v1/nope"),
		"wrong method":      h.post("/v1/models", "{}"),
		"health, posted":    h.post("/healthz", "{}"),
		"metrics, posted":   h.post("/metrics", "{}"),
		"body too large":    h.post("/v1/chat/completions", big),
		"chat, bad request": h.post("/v1/chat/completions", `{}`),
	} {
		readAll(t, resp)
		if id := resp.Header.Get("x-request-id"); len(id) != 36 {
			t.Errorf("%s (%d): x-request-id %q", name, resp.StatusCode, id)
		}
	}
}

// /healthz, /readyz and /metrics answer GET and HEAD only, with 405 and
// Allow for the rest, like every other fixed route; they answered 200 to
// anything.
func TestHealthAndMetricsRefuseOtherMethods(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp := h.post(path, "{}")
		readAll(t, resp)
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("POST %s: %d, Allow %q; want 405, GET, HEAD", path, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
}
