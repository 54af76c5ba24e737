package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// send is a request with the harness key (or key) to base (h.url unless
// set), returning status and body.
func (h *harness) send(base, method, path, body, key string) (int, []byte) {
	h.t.Helper()
	if base == "" {
		base = h.url
	}
	if key == "" {
		key = h.key
	}
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.StatusCode, readAll(h.t, resp)
}

func jsonField(t *testing.T, body []byte, path ...string) any {
	t.Helper()
	var cur any
	if err := json.Unmarshal(body, &cur); err != nil {
		t.Fatalf("not JSON: %s", body)
	}
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("no %v in %s", path, body)
		}
		cur = m[p]
	}
	return cur
}

// create makes a response through the gateway (streamed or not) and
// returns its id and the index of the pool member that holds it.
func (h *poolHarness) create(base, body, key string) (string, int) {
	h.t.Helper()
	status, got := h.send(base, "POST", "/v1/responses", body, key)
	if status != 200 {
		h.t.Fatalf("creating: %d %s", status, got)
	}
	var id string
	if strings.Contains(body, `"stream":true`) {
		created := sseEvents(got)[0]
		_, data, _ := strings.Cut(created, "data: ")
		id, _ = jsonField(h.t, []byte(data), "response", "id").(string)
	} else {
		id, _ = jsonField(h.t, got, "id").(string)
	}
	return id, h.holder(id)
}

// holder is the index of the pool member that stores id, or -1.
func (h *poolHarness) holder(id string) int {
	h.t.Helper()
	at := -1
	for i, up := range h.ups {
		if up.Stored(id) {
			if at >= 0 {
				h.t.Fatalf("%s is stored on p%d and p%d", id, at, i)
			}
			at = i
		}
	}
	return at
}

// calls counts the requests each pool member received on path.
func (h *poolHarness) calls(path string) []int {
	n := make([]int, len(h.ups))
	for i, up := range h.ups {
		for _, r := range up.Requests() {
			if r.Path == path {
				n[i]++
			}
		}
	}
	return n
}

const createResp = `{"model":"small","input":"hello"}`

func notFoundBody(id string) string {
	return `{"error":{"message":"Response with id '` + id + `' not found.","type":"invalid_request_error","param":null,"code":null}}`
}

func TestResponsesStateReachesTheUpstreamThatCreatedIt(t *testing.T) {
	h := newPoolHarness(t, 3, "  balance: round_robin")
	type made struct {
		id     string
		holder int
	}
	var all []made
	seen := map[int]bool{}
	for i := range 6 {
		body := createResp
		if i%2 == 1 {
			body = `{"model":"small","input":"hello","stream":true}`
		}
		id, at := h.create("", body, "")
		if at < 0 {
			t.Fatalf("%s is stored on no upstream", id)
		}
		all = append(all, made{id, at})
		seen[at] = true
	}
	if len(seen) < 2 {
		t.Fatalf("round robin put every response on one upstream: %v", seen)
	}
	h.events(6)
	for _, m := range all {
		path := "/v1/responses/" + m.id
		status, body := h.send("", "GET", path, "", "")
		if status != 200 || jsonField(t, body, "id") != m.id || jsonField(t, body, "status") != "completed" {
			t.Fatalf("GET %s: %d %s", m.id, status, body)
		}
		status, body = h.send("", "GET", path+"/input_items?limit=1&order=asc", "", "")
		if status != 200 || jsonField(t, body, "object") != "list" {
			t.Fatalf("input_items %s: %d %s", m.id, status, body)
		}
		reqs := h.ups[m.holder].Requests()
		if last := reqs[len(reqs)-1]; last.Path != path+"/input_items" || last.RawQuery != "limit=1&order=asc" ||
			last.Method != "GET" {
			t.Fatalf("p%d got %s %s?%s", m.holder, last.Method, last.Path, last.RawQuery)
		}
		// ?stream=true: the holder's event stream, relayed as it comes.
		status, body = h.send("", "GET", path+"?stream=true", "", "")
		if ev := sseEvents(body); status != 200 || len(ev) != 1 || !strings.HasPrefix(ev[0], "event: response.completed\n") ||
			!strings.Contains(ev[0], `"id":"`+m.id+`"`) {
			t.Fatalf("GET %s?stream=true: %d %s", m.id, status, body)
		}
		// A completed response cannot be cancelled: the holder says so.
		status, body = h.send("", "POST", path+"/cancel", "", "")
		if status != 400 || !strings.Contains(string(body), "Cannot cancel a synchronous response.") {
			t.Fatalf("cancel %s: %d %s", m.id, status, body)
		}
		for i := range h.ups {
			if n := h.calls(path)[i]; (i == m.holder) != (n > 0) {
				t.Fatalf("%s held by p%d, but p%d got %d calls for it", m.id, m.holder, i, n)
			}
		}
	}
	// (Background responses, the ones a cancel stops, are refused: see
	// TestResponsesBackgroundIsRefused.)
	bg := all[1].id
	// DELETE: the holder forgets it, and so does the gateway.
	id := all[0].id
	status, body := h.send("", "DELETE", "/v1/responses/"+id, "", "")
	if status != 200 || jsonField(t, body, "deleted") != true || h.ups[all[0].holder].Stored(id) {
		t.Fatalf("DELETE %s: %d %s", id, status, body)
	}
	status, body = h.send("", "GET", "/v1/responses/"+id, "", "")
	if status != 404 || string(body) != notFoundBody(id) {
		t.Fatalf("GET after DELETE: %d %s", status, body)
	}
	if n := h.calls("/v1/responses/" + id)[all[0].holder]; n != 3 {
		t.Fatalf("the holder got %d GET/DELETE calls for %s, want 3 (the GET after DELETE is answered by the gateway)", n, id)
	}
	// State calls are not billed: still the 6 creations only.
	time.Sleep(100 * time.Millisecond)
	if n := len(h.rec.Events()); n != 6 {
		t.Fatalf("%d usage events, want 6", n)
	}
	// Wrong methods and paths.
	for _, c := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"POST", "/v1/responses/" + bg, 404, "not_found"},
		{"POST", "/v1/responses/input_tokens", 404, "not_found"},
		{"GET", "/v1/responses/" + bg + "/cancel", 405, "method_not_allowed"},
		{"DELETE", "/v1/responses/" + bg + "/input_items", 405, "method_not_allowed"},
		{"GET", "/v1/responses/" + bg + "/nope", 404, "not_found"},
		{"GET", "/v1/responses/", 404, "not_found"},
	} {
		req, _ := http.NewRequest(c.method, h.url+c.path, nil)
		req.Header.Set("Authorization", "Bearer "+h.key)
		resp, err := h.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		wantError(t, resp, c.status, c.code)
	}
}

// GET /v1/responses/{id}/ answered the response, as without the slash,
// but GET .../input_items/ was a 404 "no route": the same trailing slash
// is taken on the routes under an id too, and the upstream is asked
// without it.
func TestResponsesStateRoutesTakeATrailingSlash(t *testing.T) {
	h := newPoolHarness(t, 1, "")
	id, at := h.create("", createResp, "")
	h.events(1)
	path := "/v1/responses/" + id
	for _, c := range []struct {
		method, path, upstreamPath string
		status                     int
		want                       string
	}{
		{"GET", path + "/", path, 200, `"id":"` + id + `"`},
		{"GET", path + "/input_items/?limit=1", path + "/input_items", 200, `"object":"list"`},
		{"POST", path + "/cancel/", path + "/cancel", 400, "Cannot cancel a synchronous response."},
	} {
		status, body := h.send("", c.method, c.path, "", "")
		reqs := h.ups[at].Requests()
		if last := reqs[len(reqs)-1]; status != c.status || !strings.Contains(string(body), c.want) || last.Path != c.upstreamPath {
			t.Errorf("%s %s: %d %s; the upstream got %s", c.method, c.path, status, body, last.Path)
		}
	}
}

func TestPreviousResponseIDLandsOnItsUpstream(t *testing.T) {
	h := newPoolHarness(t, 3, "  balance: round_robin")
	id, at := h.create("", createResp, "")
	before := h.calls("/v1/responses")
	for i := range 6 {
		body := `{"model":"small","input":"more","previous_response_id":"` + id + `"}`
		if i%2 == 1 {
			body = `{"model":"small","input":"more","stream":true,"previous_response_id":"` + id + `"}`
		}
		// proxytest answers 404 for a previous response it does not hold.
		next, nextAt := h.create("", body, "")
		if nextAt != at {
			t.Fatalf("call %d continuing %s (on p%d) made %s on p%d", i, id, at, next, nextAt)
		}
	}
	after := h.calls("/v1/responses")
	for i := range h.ups {
		if got := after[i] - before[i]; (i == at) != (got == 6) || i != at && got != 0 {
			t.Fatalf("p%d got %d of the calls continuing a response on p%d", i, got, at)
		}
	}

	// An id the gateway never saw is refused as OpenAI refuses it (400),
	// no upstream asked: every account reaches the upstreams with one
	// api_key, so theirs cannot tell whose it is.
	calls := h.calls("/v1/responses")
	status, body := h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","previous_response_id":"resp_never"}`, "")
	if status != 400 || jsonField(t, body, "error", "code") != "previous_response_not_found" || !slices.Equal(h.calls("/v1/responses"), calls) {
		t.Fatalf("unknown previous_response_id: %d %s", status, body)
	}
	// request_id would let a client choose the id vLLM gives the response.
	status, body = h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","request_id":"`+id+`"}`, "")
	if status != 400 || jsonField(t, body, "error", "param") != "request_id" || !slices.Equal(h.calls("/v1/responses"), calls) {
		t.Fatalf("request_id: %d %s", status, body)
	}
	// An id the gateway knows but its upstream lost: the upstream's 404.
	h.ups[at].Forget(id)
	status, body = h.send("", "GET", "/v1/responses/"+id, "", "")
	if status != 404 || h.calls("/v1/responses/" + id)[at] != 1 {
		t.Fatalf("lost response: %d %s, holder calls %v", status, body, h.calls("/v1/responses/"+id))
	}
	before = h.calls("/v1/responses")
	status, _ = h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","previous_response_id":"`+id+`"}`, "")
	if status != 404 || h.calls("/v1/responses")[at]-before[at] != 1 {
		t.Fatalf("continuing a lost response: %d, calls %v", status, h.calls("/v1/responses"))
	}
	// A previous_response_id that is not a string is refused.
	status, body = h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","previous_response_id":5}`, "")
	if status != 400 || jsonField(t, body, "error", "param") != "previous_response_id" {
		t.Fatalf("numeric previous_response_id: %d %s", status, body)
	}
	// A second previous_response_id could pass the owner check while the
	// upstream reads it: refused.
	status, body = h.send("", "POST", "/v1/responses", `{"model":"small","previous_response_id":"`+id+`","previous_response_id":"resp_x"}`, "")
	if status != 400 || jsonField(t, body, "error", "param") != "previous_response_id" {
		t.Fatalf("duplicated previous_response_id: %d %s", status, body)
	}
	// store:false responses are not remembered: nothing holds them.
	status, body = h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","store":false}`, "")
	if status != 200 {
		t.Fatalf("store:false: %d %s", status, body)
	}
	unstored, _ := jsonField(t, body, "id").(string)
	if status, body = h.send("", "GET", "/v1/responses/"+unstored, "", ""); status != 404 || string(body) != notFoundBody(unstored) {
		t.Fatalf("GET of a store:false response: %d %s", status, body)
	}
}

// ownerAndStranger creates, beside the harness key of account acme, a
// second key of acme, which owns what acme stored too, and a key of
// another account.
func ownerAndStranger(t *testing.T, h *poolHarness) (sameAccount, otherKey string) {
	t.Helper()
	ctx := context.Background()
	if _, err := h.svc.CreateAccount(ctx, "other", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := h.svc.CreateKey(ctx, "other", accounts.KeyRequest{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	_, sameAccount, err = h.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "second"})
	if err != nil {
		t.Fatal(err)
	}
	return sameAccount, otherKey
}

func TestResponsesStateIsTheOwningAccountsOnly(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin")
	ctx := context.Background()
	sameAccount, otherKey := ownerAndStranger(t, h)
	_, classifyOnly, err := h.svc.CreateKey(ctx, "acme", accounts.KeyRequest{Name: "c", Scopes: []string{accounts.ScopeClassify}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	id, at := h.create("", createResp, "")
	unknown := "resp_000000000000000000000000"
	for _, c := range []struct{ method, suffix string }{
		{"GET", ""}, {"GET", "/input_items"}, {"POST", "/cancel"}, {"DELETE", ""},
	} {
		status, body := h.send("", c.method, "/v1/responses/"+id+c.suffix, "", otherKey)
		if status != 404 || string(body) != notFoundBody(id) {
			t.Fatalf("%s %s with another account's key: %d %s", c.method, c.suffix, status, body)
		}
		// Exactly what an id nobody made gets.
		status, body = h.send("", c.method, "/v1/responses/"+unknown+c.suffix, "", otherKey)
		if status != 404 || string(body) != notFoundBody(unknown) {
			t.Fatalf("%s %s of an unknown id: %d %s", c.method, c.suffix, status, body)
		}
	}
	if n := h.calls("/v1/responses/" + id)[at]; n != 0 || !h.ups[at].Stored(id) {
		t.Fatalf("another account's calls reached the holder (%d) or deleted it", n)
	}
	status, body := h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","previous_response_id":"`+id+`"}`, otherKey)
	if status != 400 || jsonField(t, body, "error", "code") != "previous_response_not_found" ||
		jsonField(t, body, "error", "param") != "previous_response_id" {
		t.Fatalf("previous_response_id of another account: %d %s", status, body)
	}
	if status, body := h.send("", "GET", "/v1/responses/"+id, "", sameAccount); status != 200 {
		t.Fatalf("another key of the owning account: %d %s", status, body)
	}
	if status, body := h.send("", "GET", "/v1/responses/"+id, "", classifyOnly); status != 403 {
		t.Fatalf("a key without generate: %d %s", status, body)
	}
	if status, _ := h.send("", "GET", "/v1/responses/"+id, "", "tg-forged"); status != 401 {
		t.Fatalf("a forged key: %d", status)
	}
}

func TestPinnedUpstreamDownIs503NamingIt(t *testing.T) {
	h := newPoolHarness(t, 3, "  balance: round_robin\n  eject_after: 1\n  eject_for: 30s")
	id, at := h.create("", createResp, "")
	name := fmt.Sprintf("p%d", at)
	h.ups[at].Close()
	for i := range 2 { // unreachable, then ejected
		resp := h.post("/v1/responses", `{"model":"small","input":"x","previous_response_id":"`+id+`"}`)
		status, body := resp.StatusCode, readAll(t, resp)
		if status != 503 || !strings.Contains(string(body), "upstream "+name) {
			t.Fatalf("continuing a response on a stopped upstream: %d %s", status, body)
		}
		// Why no other upstream was tried.
		if i == 0 && !strings.Contains(string(body), "which holds the previous_response_id") {
			t.Fatalf("the 503 does not say the call was pinned: %s", body)
		}
		// Ejected, it says when to come back, as a pool all out does.
		if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); i == 1 && (ra < 25 || ra > 30) {
			t.Fatalf("the 503 of an ejected holder has Retry-After %q, want about 30", resp.Header.Get("Retry-After"))
		}
	}
	status, body := h.send("", "GET", "/v1/responses/"+id, "", "")
	if status != 503 || !strings.Contains(string(body), "upstream "+name) {
		t.Fatalf("GET of a response on a stopped upstream: %d %s", status, body)
	}
	// Calls without state still go to the others.
	if status, body := h.send("", "POST", "/v1/responses", createResp, ""); status != 200 {
		t.Fatalf("a call without state: %d %s", status, body)
	}
}

// A holder resting after another caller's 429 still takes the calls
// that continue its responses: it is their only upstream, and their
// callers were not the ones limited. They got 503s for the whole
// Retry-After.
func TestPinnedUpstreamRestingStillContinuesItsResponses(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin\n  retries: 1")
	id, at := h.create("", createResp, "")
	name := fmt.Sprintf("p%d", at)
	h.ups[at].SetOptions(proxytest.Options{Status: 429, RetryAfter: "30"})
	checkFor(t, 3*time.Second, 0, func() error {
		if status, body := h.send("", "POST", "/v1/responses", createResp, ""); status != 200 {
			return fmt.Errorf("a call without state: %d %s", status, body)
		}
		if st := h.statuses()[name]; st.State != "resting" {
			return fmt.Errorf("%s is %s", name, st.State)
		}
		return nil
	})
	h.ups[at].SetOptions(proxytest.Options{})
	for _, stream := range []string{"false", "true"} {
		status, body := h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","stream":`+stream+`,"previous_response_id":"`+id+`"}`, "")
		if status != 200 {
			t.Fatalf("continuing a response on a resting holder, stream %s: %d %s", stream, status, body)
		}
	}
	if st := h.statuses()[name]; st.State != "resting" {
		t.Fatalf("the continued calls ended %s's rest: %+v", name, st)
	}
}

// TestResponsesStateRefusalsCostNoQuota: the /v1/responses/{id} routes
// counted the call against the key's rpm before looking the id up, so
// the gateway's own 404 (an id it does not know, or another account's)
// used a request though no upstream was asked, as did the 503 of a
// holder that refused the connection. They cost nothing now, as a
// generation call refused before its upstream does not; a call the
// holder answered costs its request.
func TestResponsesStateRefusalsCostNoQuota(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin")
	_, key, err := h.svc.CreateKey(t.Context(), "acme", accounts.KeyRequest{Name: "rpm", RPM: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	call := func(method, path string, status int, remaining string) {
		t.Helper()
		req, err := http.NewRequest(method, h.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := h.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != status {
			t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, body, status)
		}
		if got := resp.Header.Get("x-ratelimit-remaining-requests"); got != remaining {
			t.Errorf("%s %s: x-ratelimit-remaining-requests %q, want %s", method, path, got, remaining)
		}
	}
	kept, keptAt := h.create("", createResp, "")
	lost, lostAt := h.create("", createResp, "")
	if keptAt == lostAt || keptAt < 0 || lostAt < 0 {
		t.Fatalf("round_robin put both responses on p%d and p%d", keptAt, lostAt)
	}
	unknown := "resp_000000000000000000000000"
	for _, c := range []struct{ method, suffix string }{
		{"GET", ""}, {"GET", "/input_items"}, {"POST", "/cancel"}, {"DELETE", ""}, {"GET", ""},
	} {
		call(c.method, "/v1/responses/"+unknown+c.suffix, 404, "3")
	}
	h.ups[lostAt].Close()
	call("GET", "/v1/responses/"+lost, 503, "3")
	call("GET", "/v1/responses/"+kept, 200, "2")
}

// another starts another gateway with the harness's config, accounts and
// NATS, and nothing in memory; it returns its base URL.
func (h *poolHarness) another() string {
	t := h.t
	t.Helper()
	cfg, err := config.Load(h.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	store, err := proxy.OpenResponseStore(context.Background(), h.broker.JetStream(), 1, cfg.Routing.ResponseTTL, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	gw, err := proxy.New(cfg, proxy.Options{Accounts: h.svc, Recorder: h.rec, Responses: store, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	return gatewaytest.Serve(t, gw)
}

// TestResponsesStateAcrossGateways: a second gateway on the same NATS,
// with nothing in memory, finds the mapping in KV.
func TestResponsesStateAcrossGateways(t *testing.T) {
	h := newPoolHarness(t, 3, "  balance: round_robin")
	second := h.another
	gw2 := second()
	id, at := h.create("", createResp, "")
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if status, body := h.send(gw2, "GET", "/v1/responses/"+id, "", ""); status != 200 {
			return fmt.Errorf("GET through the second gateway: %d %s", status, body)
		}
		return nil
	})
	for i := range 3 { // round robin would send one of these elsewhere
		body := `{"model":"small","input":"x","previous_response_id":"` + id + `"}`
		if i == 1 {
			body = `{"model":"small","input":"x","stream":true,"previous_response_id":"` + id + `"}`
		}
		if _, nextAt := h.create(gw2, body, ""); nextAt != at {
			t.Fatalf("second gateway sent the continuation to p%d, the response is on p%d", nextAt, at)
		}
	}
	if status, body := h.send(gw2, "DELETE", "/v1/responses/"+id, "", ""); status != 200 {
		t.Fatalf("DELETE through the second gateway: %d %s", status, body)
	}
	// A third gateway finds no mapping any more (for the first, which
	// remembered it, see TestResponseDeletedThroughAnotherGateway).
	gw3 := second()
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if status, body := h.send(gw3, "GET", "/v1/responses/"+id, "", ""); status != 404 || string(body) != notFoundBody(id) {
			return fmt.Errorf("GET through a third gateway after DELETE: %d %s", status, body)
		}
		return nil
	})
}

// TestResponseDeletedThroughAnotherGateway: a response deleted through
// one gateway is gone from the memory of the one that made it too. Until
// 2026-11-27 that one trusted its memory until routing.response_ttl: it
// sent a previous_response_id to the holder, whose own 404 the SDKs
// raised as NotFoundError instead of the 400 previous_response_not_found,
// and a GET asked the holder and used a request of the key's rpm.
func TestResponseDeletedThroughAnotherGateway(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin")
	other := h.another()
	id, _ := h.create("", createResp, "")
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error { // its mapping is in KV as its call ends
		if status, body := h.send(other, "DELETE", "/v1/responses/"+id, "", ""); status != 200 {
			return fmt.Errorf("DELETE through the other gateway: %d %s", status, body)
		}
		return nil
	})
	chain := `{"model":"small","input":"x","previous_response_id":"` + id + `"}`
	notFound := func(base string) error {
		status, body := h.send(base, "POST", "/v1/responses", chain, "")
		if status != 400 || jsonField(t, body, "error", "code") != "previous_response_not_found" {
			return fmt.Errorf("continuing a deleted response: %d %s", status, body)
		}
		return nil
	}
	// The delete reaches the first gateway over NATS, a moment later.
	checkFor(t, 2*time.Second, 10*time.Millisecond, func() error { return notFound("") })
	upstreamCalls := func() int {
		n := 0
		for _, up := range h.ups {
			n += len(up.Requests())
		}
		return n
	}
	before := upstreamCalls()
	for _, base := range []string{"", other} {
		if err := notFound(base); err != nil {
			t.Fatal(err)
		}
		if status, body := h.send(base, "GET", "/v1/responses/"+id, "", ""); status != 404 || string(body) != notFoundBody(id) {
			t.Fatalf("GET after DELETE: %d %s", status, body)
		}
	}
	if n := upstreamCalls() - before; n != 0 {
		t.Fatalf("%d calls on a deleted response reached an upstream; the gateways know it is gone", n)
	}
}

// TestStateRoutesFindAMappingStillBeingWritten: a response made through
// one gateway is found by the state routes of another that asks while its
// mapping is still on its way to KV, as a previous_response_id is. Until
// 2026-11-28 they answered 404 at once (a black-box probe, creating on
// one gateway and calling the route at once on another, 10 times in 60):
// the SDKs raised NotFoundError, and a DELETE so refused left the
// response stored upstream, where every gateway then found it.
func TestStateRoutesFindAMappingStillBeingWritten(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin")
	other := h.another()
	ctx := context.Background()
	// The test's own reads and writes of the bucket, on a connection of
	// its own, whose replies are told apart from the gateways'.
	const ownInboxes = "_TEST_INBOX"
	nc, js := testutil.ConnectJetStream(t, h.broker.ClientURL(), nats.CustomInboxPrefix(ownInboxes))
	kv, err := js.KeyValue(ctx, proxy.BucketResponses)
	if err != nil {
		t.Fatal(err)
	}
	// The gateways' reads of the bucket, seen as they are asked.
	asked := make(chan string, 64)
	sub, err := nc.Subscribe("$JS.API.DIRECT.GET.KV_"+proxy.BucketResponses+".>", func(msg *nats.Msg) {
		if !strings.HasPrefix(msg.Reply, ownInboxes) {
			asked <- msg.Subject[strings.LastIndexByte(msg.Subject, '.')+1:]
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	for _, c := range []struct{ method, suffix string }{{"GET", ""}, {"GET", "/input_items"}, {"DELETE", ""}} {
		id, at := h.create("", createResp, "")
		// The mapping the first gateway wrote, taken out of the bucket
		// and put back as soon as the other gateway has missed it: the
		// write that lands a few milliseconds after the client has its
		// answer.
		var mapping []byte
		checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
			e, err := kv.Get(ctx, id)
			if err != nil {
				return err
			}
			mapping = e.Value()
			return nil
		})
		if err := kv.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		missed := make(chan struct{})
		go func() {
			defer close(missed)
			for key := ""; key != id; {
				select {
				case key = <-asked:
				case <-time.After(5 * time.Second):
					t.Errorf("the other gateway never looked %s up in KV", id)
					return
				}
			}
			// Its first look answered by now (a miss); well before a
			// second one 100 ms later.
			time.Sleep(20 * time.Millisecond)
			if _, err := kv.Put(ctx, id, mapping); err != nil {
				t.Error(err)
			}
		}()
		began := time.Now()
		status, body := h.send(other, c.method, "/v1/responses/"+id+c.suffix, "", "")
		took := time.Since(began)
		<-missed
		if status != 200 {
			t.Errorf("%s /v1/responses/{id}%s through another gateway while its mapping is being written: %d %s (in %v)",
				c.method, c.suffix, status, body, took.Round(time.Millisecond))
		}
		if c.method == "DELETE" && h.ups[at].Stored(id) {
			t.Errorf("%s still stored on p%d after its DELETE", id, at)
		}
	}
	// A known id is not held back, and an unknown one is the same 404.
	id, _ := h.create(other, createResp, "")
	began := time.Now()
	if status, body := h.send(other, "GET", "/v1/responses/"+id, "", ""); status != 200 {
		t.Fatalf("GET of a known id: %d %s", status, body)
	}
	if took := time.Since(began); took >= 100*time.Millisecond {
		t.Errorf("GET of an id the gateway knows took %v: it waited as for an unknown one", took)
	}
	unknown := "resp_000000000000000000000000"
	if status, body := h.send(other, "GET", "/v1/responses/"+unknown, "", ""); status != 404 || string(body) != notFoundBody(unknown) {
		t.Fatalf("GET of an unknown id: %d %s", status, body)
	}
}

// TestResponsesWithNATSGone: without KV, a gateway still serves what it
// remembers itself, creating responses never waits on NATS, and a gateway
// that cannot look an id up says so (503), for a previous_response_id too:
// passed on, anyone who knew an id could continue it.
func TestResponsesWithNATSGone(t *testing.T) {
	h := newPoolHarness(t, 3, "  balance: round_robin")
	gw2 := h.another()
	id, _ := h.create("", createResp, "")
	deleted, _ := h.create("", createResp, "")
	item, _ := h.createItem("", createResp, "")
	h.broker.Close()

	began := time.Now()
	for range 5 {
		h.create("", createResp, "")
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("5 responses took %v with NATS gone", took)
	}
	if status, body := h.send("", "GET", "/v1/responses/"+id, "", ""); status != 200 {
		t.Fatalf("GET through the gateway that made it: %d %s", status, body)
	}
	// A delete cannot be said to the other gateways; it holds here.
	if status, body := h.send("", "DELETE", "/v1/responses/"+deleted, "", ""); status != 200 {
		t.Fatalf("DELETE through the gateway that made it: %d %s", status, body)
	}
	if status, body := h.send("", "GET", "/v1/responses/"+deleted, "", ""); status != 404 || string(body) != notFoundBody(deleted) {
		t.Fatalf("GET after DELETE: %d %s", status, body)
	}
	status, body := h.send(gw2, "GET", "/v1/responses/"+id, "", "")
	if status != 503 || jsonField(t, body, "error", "code") != "state_unavailable" {
		t.Fatalf("GET through a gateway that cannot look it up: %d %s", status, body)
	}
	status, body = h.send(gw2, "POST", "/v1/responses", `{"model":"small","input":"x","previous_response_id":"`+id+`"}`, "")
	if status != 503 || jsonField(t, body, "error", "code") != "state_unavailable" {
		t.Fatalf("continuation through a gateway that cannot look it up: %d %s", status, body)
	}
	// So does an item named in input.
	status, body = h.send(gw2, "POST", "/v1/responses", withItem(item, ""), "")
	if status != 503 || jsonField(t, body, "error", "code") != "state_unavailable" {
		t.Fatalf("an item_reference through a gateway that cannot look it up: %d %s", status, body)
	}
	if status, body := h.send("", "POST", "/v1/responses", withItem(item, ""), ""); status != 200 {
		t.Fatalf("an item_reference through the gateway that made it: %d %s", status, body)
	}
	// Counted as failed calls: the dashboards showed no error at all.
	if _, metrics := h.send(gw2, "GET", "/metrics", "", ""); !strings.Contains(string(metrics), `tollgate_requests_total{model="small",upstream="",endpoint="/v1/responses",status="503"} 2`) {
		t.Fatalf("the 503 is not in /metrics:\n%s", metrics)
	}
	if status, body := h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","previous_response_id":"`+id+`"}`, ""); status != 200 {
		t.Fatalf("continuation through the gateway that made it: %d %s", status, body)
	}
}

// TestResponseTTLReloads: routing.response_ttl is the bucket's max age. A
// longer one reloads; a shorter one would make nats-server delete every
// older mapping of every gateway on this NATS, for good, and a slip saved
// in an editor (72m for 72h) did so two seconds later: a reload refuses
// it, and a start that shortens it says how many mappings went.
func TestResponseTTLReloads(t *testing.T) {
	var gatewayLog testutil.Log
	h := newPoolHarnessWith(t, harnessOptions{logf: gatewayLog.Logf}, 1, "  balance: round_robin")
	ctx := context.Background()
	status := func() jetstream.KeyValueStatus {
		kv, err := h.broker.JetStream().KeyValue(ctx, proxy.BucketResponses)
		if err != nil {
			t.Fatal(err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if got := status().TTL(); got != config.DefaultResponseTTL {
		t.Fatalf("bucket TTL %s, want the default %s", got, config.DefaultResponseTTL)
	}
	h.create("", createResp, "")
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if n := status().Values(); n == 0 {
			return errors.New("the response's mapping is not in the bucket yet")
		}
		return nil
	})
	held := status().Values()

	h.setPool("  balance: round_robin\n  response_ttl: 1000h", "p0")
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if got := status().TTL(); got != 1000*time.Hour {
			return fmt.Errorf("bucket TTL %s after the reload, want 1000h", got)
		}
		return nil
	})

	h.setPool("  balance: round_robin\n  response_ttl: 1m", "p0")
	line := strings.Count(readFile(t, h.cfgPath)[:strings.Index(readFile(t, h.cfgPath), "response_ttl: 1m")], "\n") + 1
	time.Sleep(200 * time.Millisecond) // the writer would apply it by now
	if got := status().TTL(); got != 1000*time.Hour {
		t.Fatalf("bucket TTL %s after a reload shortening it, want 1000h kept", got)
	}
	if n := status().Values(); n != held {
		t.Fatalf("the bucket holds %d mappings after a reload shortening its TTL, held %d", n, held)
	}
	want := fmt.Sprintf("config reload not supported for routing.response_ttl (line %d): 1m0s is shorter than the 1000h0m0s in force, and would delete the stored responses older than 1m0s", line)
	if refused := gatewayLog.Matching(want, "for every gateway on this NATS", "restart required"); len(refused) != 1 {
		t.Errorf("no refusal logged %q; log:\n%s", want, strings.Join(gatewayLog.Matching(), "\n"))
	}

	// Nor does a reload that lengthens this gateway's value shorten what
	// another gateway set since.
	other, err := proxy.OpenResponseStore(ctx, h.broker.JetStream(), 1, 2000*time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
	h.setPool("  balance: round_robin\n  response_ttl: 1500h", "p0")
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if kept := gatewayLog.Matching("routing.response_ttl 1500h0m0s is not applied", "keeps response mappings for 2000h0m0s"); len(kept) != 1 {
			return fmt.Errorf("no word that 1500h is not applied; log:\n%s", strings.Join(gatewayLog.Matching("responses:"), "\n"))
		}
		return nil
	})
	if got := status().TTL(); got != 2000*time.Hour {
		t.Fatalf("bucket TTL %s after a reload under another gateway's, want 2000h kept", got)
	}

	// The bucket is every gateway's: one started with a shorter TTL
	// deletes the older mappings of all, on purpose, and says how many.
	time.Sleep(1100 * time.Millisecond)
	var log testutil.Log
	other, err = proxy.OpenResponseStore(ctx, h.broker.JetStream(), 1, time.Second, log.Logf)
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
	logged := log.Matching()
	want = fmt.Sprintf("now keeps response mappings for 1s, not 2000h0m0s, for every gateway on this NATS: %d of its %d mappings, those older than 1s, were deleted", held, held)
	if len(logged) != 1 || !strings.Contains(logged[0], want) {
		t.Errorf("a second gateway with a shorter response_ttl logged %q, want %q", logged, want)
	}
}

// A background response is generated after the call has ended, where the
// gateway sees no answer to bill: it was billed a prompt estimate and its
// output went free. It is refused before the upstream is asked.
func TestResponsesBackgroundIsRefused(t *testing.T) {
	h := newPoolHarness(t, 1, "")
	before := len(h.rec.Events())
	for _, body := range []string{
		`{"model":"small","input":"write a long essay","background":true}`,
		`{"model":"small","input":"write a long essay","background":true,"stream":true}`,
	} {
		status, resp := h.send("", "POST", "/v1/responses", body, "")
		if status != 400 || jsonField(t, resp, "error", "param") != "background" {
			t.Fatalf("%s: %d %s", body, status, resp)
		}
	}
	status, resp := h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","background":"yes"}`, "")
	if status != 400 || jsonField(t, resp, "error", "param") != "background" {
		t.Fatalf("background as a string: %d %s", status, resp)
	}
	if n := len(h.rec.Events()) - before; n != 0 {
		t.Fatalf("%d refused calls recorded", n)
	}
	if status, resp = h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","background":false}`, ""); status != 200 {
		t.Fatalf("background false: %d %s", status, resp)
	}
}

// A call continuing a response is fed that response's whole conversation
// before its own input. Where the upstream reports no usage (or cuts the
// stream), the estimate counts that history too: it used to count the new
// input only, and a cut stream on a long chain was billed a few tokens.
func TestResponsesEstimateCountsTheChain(t *testing.T) {
	h := newPoolHarness(t, 1, "", proxytest.Options{OmitUsage: true})
	lastEvent := func() *meter.Event {
		t.Helper()
		var ev *meter.Event
		checkFor(t, 2*time.Second, 10*time.Millisecond, func() error {
			evs := h.rec.Events()
			if len(evs) == 0 {
				return errors.New("no event")
			}
			ev = evs[len(evs)-1]
			return nil
		})
		return ev
	}
	first, _ := h.create("", `{"model":"small","input":"`+strings.Repeat("history ", 300)+`"}`, "")
	ev1 := lastEvent()
	if ev1.UsageSource != meter.SourceEstimated || ev1.PromptTokens < 300 {
		t.Fatalf("first call: %+v", ev1)
	}
	second, _ := h.create("", `{"model":"small","input":"more","previous_response_id":"`+first+`"}`, "")
	ev2 := lastEvent()
	chain := ev1.PromptTokens + ev1.CompletionTokens
	if ev2.PromptTokens < chain+1 || ev2.PromptTokens > chain+5 {
		t.Fatalf("second call estimated %d prompt tokens; the chain before it had %d, its own input 1 or 2", ev2.PromptTokens, chain)
	}
	// And so on down the chain, streamed too.
	h.create("", `{"model":"small","input":"again","stream":true,"previous_response_id":"`+second+`"}`, "")
	ev3 := lastEvent()
	if want := ev2.PromptTokens + ev2.CompletionTokens; ev3.PromptTokens < want+1 {
		t.Fatalf("third call estimated %d prompt tokens, want over %d", ev3.PromptTokens, want)
	}
}

// createItem makes a response through the gateway (streamed or not) and
// returns the id of its output item (msg_…) and the pool member holding it.
func (h *poolHarness) createItem(base, body, key string) (string, int) {
	h.t.Helper()
	status, got := h.send(base, "POST", "/v1/responses", body, key)
	if status != 200 {
		h.t.Fatalf("creating: %d %s", status, got)
	}
	output := []string{"output"}
	if strings.Contains(body, `"stream":true`) {
		evs := sseEvents(got)
		_, data, _ := strings.Cut(evs[len(evs)-1], "data: ")
		got, output = []byte(data), []string{"response", "output"}
	}
	items, _ := jsonField(h.t, got, output...).([]any)
	if len(items) == 0 {
		h.t.Fatalf("no output item in %s", got)
	}
	id, _ := items[0].(map[string]any)["id"].(string)
	at := -1
	for i, up := range h.ups {
		if up.StoredItem(id) {
			at = i
		}
	}
	if at < 0 {
		h.t.Fatalf("item %s is stored on no upstream", id)
	}
	return id, at
}

// withItem is a two-turn request whose assistant turn is a reference to
// the stored item id, as the Vercel AI SDK's default OpenAI provider
// (Responses API, store: true) sends it.
func withItem(id, extra string) string {
	return `{"model":"small"` + extra + `,"input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},` +
		`{"type":"item_reference","id":"` + id + `"},{"role":"user","content":[{"type":"input_text","text":"and then?"}]}]}`
}

// TestItemReferenceLandsOnItsUpstream: an item_reference goes to the
// upstream that stored the item. On a pool of two it went round robin,
// and every second turn of a Vercel AI SDK chat was the other upstream's
// 404 "Item with id … not found".
func TestItemReferenceLandsOnItsUpstream(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin")
	for _, first := range []string{createResp, `{"model":"small","input":"hello","stream":true}`} {
		item, at := h.createItem("", first, "")
		before := h.calls("/v1/responses")
		for i := range 10 {
			extra := ""
			if i%2 == 1 {
				extra = `,"stream":true`
			}
			status, body := h.send("", "POST", "/v1/responses", withItem(item, extra), "")
			if status != 200 {
				t.Fatalf("call %d naming %s (on p%d): %d %s", i, item, at, status, body)
			}
		}
		after := h.calls("/v1/responses")
		for i := range h.ups {
			if got := after[i] - before[i]; (i == at) != (got == 10) || i != at && got != 0 {
				t.Fatalf("p%d got %d of the 10 calls naming an item on p%d", i, got, at)
			}
		}
	}
	// Through another gateway, which finds the item in KV.
	gw2 := h.another()
	item, at := h.createItem("", createResp, "")
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		before := h.calls("/v1/responses")[at]
		if status, body := h.send(gw2, "POST", "/v1/responses", withItem(item, ""), ""); status != 200 || h.calls("/v1/responses")[at] != before+1 {
			return fmt.Errorf("through the second gateway: %d %s", status, body)
		}
		return nil
	})
	// With previous_response_id on the same upstream: served; on the
	// other, refused (a call reaches one upstream).
	prev, prevAt := h.create("", createResp, "")
	for prevAt != at {
		prev, prevAt = h.create("", createResp, "")
	}
	if status, body := h.send("", "POST", "/v1/responses", withItem(item, `,"previous_response_id":"`+prev+`"`), ""); status != 200 {
		t.Fatalf("previous_response_id and an item on one upstream: %d %s", status, body)
	}
	other, otherAt := h.createItem("", createResp, "")
	for otherAt == at {
		other, otherAt = h.createItem("", createResp, "")
	}
	calls := h.calls("/v1/responses")
	status, body := h.send("", "POST", "/v1/responses", withItem(other, `,"previous_response_id":"`+prev+`"`), "")
	if status != 400 || jsonField(t, body, "error", "param") != "input" || !strings.Contains(string(body), "another upstream") {
		t.Fatalf("previous_response_id and an item on two upstreams: %d %s", status, body)
	}
	two := strings.Replace(withItem(item, ""), `{"type":"item_reference"`, `{"type":"item_reference","id":"`+other+`"},{"type":"item_reference"`, 1)
	status, body = h.send("", "POST", "/v1/responses", two, "")
	if status != 400 || jsonField(t, body, "error", "param") != "input" || !strings.Contains(string(body), "different upstreams") {
		t.Fatalf("two items on two upstreams: %d %s", status, body)
	}
	if !slices.Equal(h.calls("/v1/responses"), calls) {
		t.Fatalf("a refused call reached an upstream")
	}
}

// TestItemReferenceIsTheOwningAccountsOnly: every account reaches the
// upstream with one api_key, and the upstream returned account A's stored
// text to account B for A's item id (found by a black-box session). An
// item the gateway cannot place, or another account's, is refused before
// any upstream is asked.
func TestItemReferenceIsTheOwningAccountsOnly(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin")
	ctx := context.Background()
	sameAccount, otherKey := ownerAndStranger(t, h)
	if err := h.svc.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	item, _ := h.createItem("", createResp, "")
	// store:false: its item is kept nowhere, so not remembered either.
	unstored, _ := jsonField(t, func() []byte {
		status, body := h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","store":false}`, "")
		if status != 200 {
			t.Fatalf("store:false: %d %s", status, body)
		}
		return body
	}(), "output").([]any)[0].(map[string]any)["id"].(string)
	calls := h.calls("/v1/responses")
	for _, c := range []struct{ why, body, key, id string }{
		{"another account's item", withItem(item, ""), otherKey, item},
		{"an unknown item", withItem("msg_000000000000000000000000", ""), "", "msg_000000000000000000000000"},
		{"a store:false response's item", withItem(unstored, ""), "", unstored},
		// The type is optional in OpenAI's item reference.
		{"another account's item without a type", `{"model":"small","input":[{"id":"` + item + `"}]}`, otherKey, item},
		{"another account's item streamed", withItem(item, `,"stream":true`), otherKey, item},
		// OpenAI resolves a reasoning item sent without its
		// encrypted_content from its store, by id.
		{"another account's reasoning item by id", `{"model":"small","input":[{"type":"reasoning","id":"` + item + `","summary":[]}]}`, otherKey, item},
		{"another account's item with a status, no role", `{"model":"small","input":[{"id":"` + item + `","status":"completed"}]}`, otherKey, item},
	} {
		status, body := h.send("", "POST", "/v1/responses", c.body, c.key)
		if status != 400 || jsonField(t, body, "error", "param") != "input" ||
			!strings.Contains(jsonField(t, body, "error", "message").(string), "Item with id '"+c.id+"' not found.") {
			t.Fatalf("%s: %d %s", c.why, status, body)
		}
	}
	for _, c := range []struct{ why, body, param string }{
		// The upstream keeps the last of two keys, gjson finds the first.
		{"a duplicated id", `{"model":"small","input":[{"type":"item_reference","id":"` + item + `","id":"msg_x"}]}`, "input"},
		{"a reference behind a message type", `{"model":"small","input":[{"type":"message","type":"item_reference","id":"` + item + `"}]}`, "input"},
		{"encrypted_content written twice", `{"model":"small","input":[{"type":"reasoning","id":"` + item + `","encrypted_content":"x","encrypted_content":null}]}`, "input"},
		{"a duplicated input", `{"model":"small","input":"hi","input":[{"type":"item_reference","id":"` + item + `"}]}`, "input"},
		{"a numeric id", `{"model":"small","input":[{"type":"item_reference","id":5}]}`, "input[0].id"},
		{"too many references", `{"model":"small","input":[` + manyReferences(257) + `]}`, "input"},
	} {
		status, body := h.send("", "POST", "/v1/responses", c.body, "")
		if status != 400 || jsonField(t, body, "error", "param") != c.param {
			t.Fatalf("%s: %d %s", c.why, status, body)
		}
	}
	if !slices.Equal(h.calls("/v1/responses"), calls) {
		t.Fatalf("a refused call reached an upstream: %v, before %v", h.calls("/v1/responses"), calls)
	}
	// Items that carry their own content name nothing: a message with an
	// id the gateway never saw (the Vercel AI SDK's earlier turns with
	// store false), a reasoning item with its encrypted_content, and the
	// same reference many times over.
	for _, body := range []string{
		`{"model":"small","store":false,"input":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"output_text","text":"hello"}],"id":"msg_client_1"},{"role":"user","content":"next"}]}`,
		`{"model":"small","input":[{"type":"reasoning","id":"rs_client_1","summary":[],"encrypted_content":"gAAAA"}]}`,
		`{"model":"small","input":[` + strings.Repeat(`{"type":"item_reference","id":"`+item+`"},`, 300) + `{"role":"user","content":"next"}]}`,
	} {
		if status, body := h.send("", "POST", "/v1/responses", body, ""); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
	}
	// An item's id is no response's id.
	if status, body := h.send("", "GET", "/v1/responses/"+item, "", ""); status != 404 || string(body) != notFoundBody(item) {
		t.Fatalf("GET of an item's id: %d %s", status, body)
	}
	status, body := h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","previous_response_id":"`+item+`"}`, "")
	if status != 400 || jsonField(t, body, "error", "code") != "previous_response_not_found" {
		t.Fatalf("an item's id as previous_response_id: %d %s", status, body)
	}
	// Another key of the owning account is the owner too.
	if status, body := h.send("", "POST", "/v1/responses", withItem(item, ""), sameAccount); status != 200 {
		t.Fatalf("another key of the owning account: %d %s", status, body)
	}
}

// withReasoning is a store:false call whose input holds a reasoning item
// of the given id with its own text, as vLLM returns them and the OpenAI
// SDK's input: [...input, ...r.output, next] sends them back.
func withReasoning(id, extra string) string {
	return `{"model":"small","store":false` + extra + `,"input":[{"role":"user","content":"hi"},` +
		`{"id":"` + id + `","type":"reasoning","summary":[{"type":"summary_text","text":"Thinking."}],` +
		`"content":[{"type":"reasoning_text","text":"hmm"}],"encrypted_content":null},{"role":"user","content":"more"}]}`
}

// TestReasoningItemWithItsTextNeedsNoStoredItem: a reasoning item that
// carries its text was refused as a reference to an unknown stored item
// when its response was store:false (found by a black-box session with
// the OpenAI SDK), though vLLM reads that text and never looks the id up.
// Its id is still checked: another account's is refused, and the
// caller's own sends the call to the upstream holding it.
func TestReasoningItemWithItsTextNeedsNoStoredItem(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin")
	_, otherKey := ownerAndStranger(t, h)
	if err := h.svc.WaitSynced(context.Background()); err != nil {
		t.Fatal(err)
	}
	unknown := "rs_abc1"
	for _, body := range []string{
		withReasoning(unknown, ""),
		withReasoning(unknown, `,"stream":true`),
		strings.Replace(withReasoning(unknown, ""), `"content":[{"type":"reasoning_text","text":"hmm"}]`, `"content":[]`, 1),
		strings.Replace(withReasoning(unknown, ""), `"summary":[{"type":"summary_text","text":"Thinking."}]`, `"summary":[]`, 1),
	} {
		calls := h.calls("/v1/responses")
		if status, resp := h.send("", "POST", "/v1/responses", body, ""); status != 200 {
			t.Fatalf("%s: %d %s", body, status, resp)
		}
		if after := h.calls("/v1/responses"); after[0]+after[1] != calls[0]+calls[1]+1 {
			t.Fatalf("%s reached no upstream", body)
		}
	}
	// Without text it is a reference still, resolved from the store.
	empty := strings.NewReplacer(`"text":"hmm"`, `"text":""`, `{"type":"summary_text","text":"Thinking."}`, ``).Replace(withReasoning(unknown, ""))
	status, resp := h.send("", "POST", "/v1/responses", empty, "")
	if status != 400 || !strings.Contains(jsonField(t, resp, "error", "message").(string), "Item with id '"+unknown+"' not found.") {
		t.Fatalf("a reasoning item with empty text: %d %s", status, resp)
	}

	item, at := h.createItem("", createResp, "")
	calls := h.calls("/v1/responses")
	status, resp = h.send("", "POST", "/v1/responses", withReasoning(item, ""), otherKey)
	if status != 400 || jsonField(t, resp, "error", "param") != "input" || !strings.Contains(string(resp), item) {
		t.Fatalf("another account's id on a reasoning item with text: %d %s", status, resp)
	}
	if !slices.Equal(h.calls("/v1/responses"), calls) {
		t.Fatalf("a refused call reached an upstream")
	}
	for i := range 6 {
		extra := ""
		if i%2 == 1 {
			extra = `,"stream":true`
		}
		if status, resp := h.send("", "POST", "/v1/responses", withReasoning(item, extra), ""); status != 200 {
			t.Fatalf("call %d: %d %s", i, status, resp)
		}
	}
	if got := h.calls("/v1/responses")[at] - calls[at]; got != 6 {
		t.Fatalf("the holder p%d got %d of the 6 calls naming its item", at, got)
	}
	// Beside a previous_response_id on the other upstream, the item only
	// prefers its holder: the call goes where the previous response is.
	prev, prevAt := h.create("", createResp, "")
	for prevAt == at {
		prev, prevAt = h.create("", createResp, "")
	}
	calls = h.calls("/v1/responses")
	if status, resp := h.send("", "POST", "/v1/responses", withReasoning(item, `,"previous_response_id":"`+prev+`"`), ""); status != 200 {
		t.Fatalf("with a previous_response_id on the other upstream: %d %s", status, resp)
	}
	if h.calls("/v1/responses")[prevAt] != calls[prevAt]+1 {
		t.Fatalf("the call did not go to the previous response's upstream")
	}
}

// TestReasoningItemHolderDownIsNoReasonToFail: a reasoning item that
// carries its text only prefers its holder, yet a call naming one whose
// holder had just died was answered 503 "which holds the items input names
// by id, is unreachable" until the holder was ejected, and then at each
// of its half-open trials (found by a black-box re-test): the holder was
// kept as a pin, and a pinned call is never retried. It is the first
// choice now, and the call moves on like any other.
func TestReasoningItemHolderDownIsNoReasonToFail(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin\n  retries: 1\n  eject_after: 3\n  eject_for: 100ms\n  probe_interval: 1h")
	if err := h.svc.WaitSynced(context.Background()); err != nil {
		t.Fatal(err)
	}
	item, at := h.createItem("", createResp, "")
	other := 1 - at
	h.ups[at].Close()
	call := func(what string, stream bool) {
		t.Helper()
		extra := ""
		if stream {
			extra = `,"stream":true`
		}
		calls := h.calls("/v1/responses")[other]
		if status, resp := h.send("", "POST", "/v1/responses", withReasoning(item, extra), ""); status != 200 {
			t.Fatalf("%s: %d %s", what, status, resp)
		}
		if h.calls("/v1/responses")[other] != calls+1 {
			t.Fatalf("%s: the other upstream did not answer it", what)
		}
	}
	for i := range 3 { // the holder unreachable, not yet ejected
		call(fmt.Sprintf("call %d before the holder's ejection", i+1), i%2 == 1)
	}
	name := fmt.Sprintf("p%d", at)
	checkFor(t, 2*time.Second, 20*time.Millisecond, func() error {
		if s := h.statuses()[name]; s.State != "half_open" {
			return fmt.Errorf("%s is %s", name, s.State)
		}
		return nil
	})
	call("the holder's half-open trial", false)
	if s := h.statuses()[name]; s.Ejections != 2 {
		t.Fatalf("the failed trial did not eject %s again: %+v", name, s)
	}
}

// TestResponsesConversationIsRefused: the gateway does not map
// conversations to an upstream or an account, so one passed on could be
// used by any account, on whichever upstream round robin chose.
func TestResponsesConversationIsRefused(t *testing.T) {
	h := newPoolHarness(t, 1, "")
	calls := h.calls("/v1/responses")
	for _, body := range []string{
		`{"model":"small","input":"x","conversation":"conv_0123456789"}`,
		`{"model":"small","input":"x","conversation":{"id":"conv_0123456789"},"stream":true}`,
	} {
		status, resp := h.send("", "POST", "/v1/responses", body, "")
		if status != 400 || jsonField(t, resp, "error", "param") != "conversation" ||
			!strings.Contains(string(resp), "previous_response_id") {
			t.Fatalf("%s: %d %s", body, status, resp)
		}
	}
	if !slices.Equal(h.calls("/v1/responses"), calls) {
		t.Fatalf("a refused call reached the upstream")
	}
	if status, resp := h.send("", "POST", "/v1/responses", `{"model":"small","input":"x","conversation":null}`, ""); status != 200 {
		t.Fatalf("conversation null: %d %s", status, resp)
	}
}

// manyReferences is n item references to n different ids, comma-separated.
func manyReferences(n int) string {
	refs := make([]string, n)
	for i := range refs {
		refs[i] = fmt.Sprintf(`{"type":"item_reference","id":"msg_%024d"}`, i)
	}
	return strings.Join(refs, ",")
}
