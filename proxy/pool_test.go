package proxy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// poolHarness is the harness with model "small" served by a pool of extra
// proxytest upstreams named p0, p1, …, put in place by a config reload.
type poolHarness struct {
	*harness
	ups []*proxytest.Server
	// settings, when set for an upstream p<i>, are its settings in the
	// config instead of first_byte_timeout: 2s.
	settings map[int]string
}

func newPoolHarness(t *testing.T, n int, routing string, opts ...proxytest.Options) *poolHarness {
	t.Helper()
	return newPoolHarnessWith(t, harnessOptions{}, n, routing, opts...)
}

func newPoolHarnessWith(t *testing.T, ho harnessOptions, n int, routing string, opts ...proxytest.Options) *poolHarness {
	t.Helper()
	h := &poolHarness{harness: newHarness(t, ho)}
	for i := range n {
		var o proxytest.Options
		if i < len(opts) {
			o = opts[i]
		}
		up := proxytest.NewServer(o)
		t.Cleanup(up.Close)
		h.ups = append(h.ups, up)
	}
	h.setPool(routing, h.names()...)
	return h
}

func (h *poolHarness) names() []string {
	var names []string
	for i := range h.ups {
		names = append(names, fmt.Sprintf("p%d", i))
	}
	return names
}

// setPool rewrites the config so that model small is served by members
// (names of the p upstreams), and waits until the gateway runs it.
func (h *poolHarness) setPool(routing string, members ...string) {
	h.t.Helper()
	cfg := readFile(h.t, h.cfgPath)
	if i := strings.Index(cfg, "routing:"); i >= 0 {
		cfg = cfg[:i]
	} else {
		cfg = cfg[:strings.Index(cfg, "upstreams:")]
	}
	cfg += "routing:\n" + routing + "\nupstreams:\n  - {name: local, base_url: " + h.up.URL + "}\n"
	for i, up := range h.ups {
		settings := "first_byte_timeout: 2s"
		if s, ok := h.settings[i]; ok {
			settings = s
		}
		cfg += fmt.Sprintf("  - {name: p%d, base_url: %s, %s}\n", i, up.URL, settings)
	}
	cfg += "models:\n  - id: small\n    upstream_model: proxytest-small\n    context_length: 1000\n    max_output_length: 100\n" +
		"    upstreams: [" + strings.Join(members, ", ") + "]\n"
	h.writeConfig(cfg)
	checkFor(h.t, 3*time.Second, 10*time.Millisecond, func() error {
		got := map[string]bool{}
		for _, s := range h.statuses() {
			for _, m := range s.Models {
				if m == "small" {
					got[s.Name] = true
				}
			}
		}
		for _, m := range members {
			if !got[m] {
				return fmt.Errorf("pool not in force yet: %v", got)
			}
		}
		if len(got) != len(members) {
			return fmt.Errorf("pool not in force yet: %v", got)
		}
		return nil
	})
}

type poolStatus struct {
	Name      string   `json:"name"`
	Models    []string `json:"models"`
	State     string   `json:"state"`
	LastError string   `json:"last_error"`
	// EjectedUntil is kept as text: the test only needs to see it is there.
	EjectedUntil string `json:"ejected_until"`
	Calls        uint64 `json:"calls"`
	Ejections    uint64 `json:"ejections"`
	InFlight     int64  `json:"in_flight"`
	Retries      uint64 `json:"retries"`
}

func (h *poolHarness) statuses() map[string]poolStatus {
	h.t.Helper()
	req, _ := http.NewRequest("GET", h.url+"/admin/v1/upstreams", nil)
	req.Header.Set("Authorization", "Bearer admin-secret")
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	body := readAll(h.t, resp)
	if resp.StatusCode != 200 {
		h.t.Fatalf("GET /admin/v1/upstreams: %d %s", resp.StatusCode, body)
	}
	var out struct {
		Data []poolStatus `json:"data"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		h.t.Fatal(err)
	}
	m := map[string]poolStatus{}
	for _, s := range out.Data {
		m[s.Name] = s
	}
	return m
}

const smallChat = `{"model":"small","messages":[{"role":"user","content":"hi"}]}`

func TestPoolSpreadsByWeightAndReleasesInFlight(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin")
	cfg := readFile(t, h.cfgPath)
	h.writeConfig(strings.Replace(cfg, "upstreams: [p0, p1]", "upstreams: [p0, {name: p1, weight: 3}]", 1))
	time.Sleep(700 * time.Millisecond) // the watcher checks every 500ms
	before := h.statuses()
	for range 400 {
		resp := h.post("/v1/chat/completions", smallChat)
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	after := h.statuses()
	p0 := after["p0"].Calls - before["p0"].Calls
	p1 := after["p1"].Calls - before["p1"].Calls
	if p0+p1 != 400 || p1 < 2*p0 {
		t.Fatalf("weights 1:3 gave p0 %d, p1 %d calls", p0, p1)
	}
	if after["p0"].InFlight != 0 || after["p1"].InFlight != 0 {
		t.Fatalf("in flight after all calls ended: %+v", after)
	}
}

func TestPoolAllDownAnswers503NamingThemAtOnce(t *testing.T) {
	h := newPoolHarness(t, 2, "  eject_for: 30s\n  eject_after: 1")
	h.ups[0].Close()
	h.ups[1].Close()
	// The first call finds both down (each is tried once) and ejects them.
	resp := h.post("/v1/chat/completions", smallChat)
	wantError(t, resp, 503, "upstream_unavailable")
	began := time.Now()
	resp = h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[]}`)
	env := wantError(t, resp, 503, "upstream_unavailable")
	if took := time.Since(began); took > 500*time.Millisecond {
		t.Fatalf("503 took %v with every upstream ejected", took)
	}
	msg, _ := env["message"].(string)
	if !strings.Contains(msg, "every upstream of model \"small\"") || !strings.Contains(msg, "p0: ejected") || !strings.Contains(msg, "p1: ejected") {
		t.Fatalf("503 does not name the ejected upstreams: %q", msg)
	}
	// Why, in words a client may read: the addresses are the operator's
	// (the admin API's last_error), as in every other client message.
	if !strings.Contains(msg, "connection refused") || strings.Contains(msg, "127.0.0.1") || strings.Contains(msg, "dial tcp") {
		t.Fatalf("503 does not say why without the upstreams' addresses: %q", msg)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "30" && ra != "29" || resp.Header.Get("x-should-retry") != "" {
		t.Fatalf("Retry-After %q, x-should-retry %q; want when the first upstream is back (30s), retried", ra, resp.Header.Get("x-should-retry"))
	}
	if st := h.statuses()["p0"]; st.State != "ejected" || !strings.Contains(st.LastError, h.ups[0].Addr) {
		t.Fatalf("p0 is %+v, want ejected with its error, address included", st)
	}
}

// A pool whose every upstream is ejected for over a minute says not to
// retry, as a 429 with such a wait does: openai-node 6 slept the whole
// wait inside create(), and the SDKs that honour at most a minute asked
// again at once, twice, into the same 503.
func TestPoolEjectedOverAMinuteTellsTheSDKsNotToRetry(t *testing.T) {
	h := newPoolHarness(t, 2, "  eject_for: 2m\n  eject_max: 2m\n  eject_after: 1")
	h.ups[0].Close()
	h.ups[1].Close()
	readAll(t, h.post("/v1/chat/completions", smallChat))
	resp := h.post("/v1/chat/completions", smallChat)
	wantError(t, resp, 503, "upstream_unavailable")
	if ra := resp.Header.Get("Retry-After"); (ra != "120" && ra != "119") || resp.Header.Get("x-should-retry") != "false" {
		t.Fatalf("Retry-After %q, x-should-retry %q; want the ejection left (120s) and false", ra, resp.Header.Get("x-should-retry"))
	}
}

// Upstreams answering 429 with Retry-After rest until then; calls in the
// meantime got 503 with no Retry-After, which SDKs raise as a server error
// rather than the rate limit it is.
func TestPoolOfRestingUpstreamsAnswers429WithRetryAfter(t *testing.T) {
	limited := proxytest.Options{Status: 429, RetryAfter: "30"}
	h := newPoolHarness(t, 2, "  retries: 1", limited, limited)
	resp := h.post("/v1/chat/completions", smallChat)
	if body := readAll(t, resp); resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "30" {
		t.Fatalf("the upstreams' own 429: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	resp = h.post("/v1/chat/completions", smallChat)
	env := wantError(t, resp, 429, "rate_limit_exceeded")
	if ra := resp.Header.Get("Retry-After"); ra != "30" && ra != "29" || resp.Header.Get("x-should-retry") != "" {
		t.Fatalf("Retry-After %q, x-should-retry %q; want the rest left (30s), retried", ra, resp.Header.Get("x-should-retry"))
	}
	if msg, _ := env["message"].(string); !strings.Contains(msg, "rate limited (p0: resting for") || !strings.Contains(msg, "p1: resting for") {
		t.Fatalf("message %q", msg)
	}
	if n := len(h.ups[0].Requests()) + len(h.ups[1].Requests()); n != 2 {
		t.Fatalf("the resting upstreams got %d calls, want 2", n)
	}
}

// The gateway's own 429 for upstreams resting longer than a minute says
// not to retry, as every limit's 429 with such a wait does: the OpenAI
// SDKs do not wait so long, and retried at once into the same 429.
func TestPoolRestingOverAMinuteTellsTheSDKsNotToRetry(t *testing.T) {
	limited := proxytest.Options{Status: 429, RetryAfter: "120"}
	h := newPoolHarness(t, 2, "  retries: 1", limited, limited)
	readAll(t, h.post("/v1/chat/completions", smallChat))
	resp := h.post("/v1/chat/completions", smallChat)
	wantError(t, resp, 429, "rate_limit_exceeded")
	if ra := resp.Header.Get("Retry-After"); (ra != "120" && ra != "119") || resp.Header.Get("x-should-retry") != "false" {
		t.Fatalf("Retry-After %q, x-should-retry %q; want the rest left (120s) and false", ra, resp.Header.Get("x-should-retry"))
	}
}

// A model's only upstream is not rested by its 429: each caller gets the
// upstream's own answer. Resting it made one caller's 429 (a request too
// large for a hosted provider's limit) refuse every caller of the model,
// and of every other model on that upstream, for up to 10 minutes.
func TestOnlyUpstreamIsNotRestedBy429(t *testing.T) {
	h := newPoolHarness(t, 1, "", proxytest.Options{Status: 429, RetryAfter: "30"})
	for i := range 3 {
		resp := h.post("/v1/chat/completions", smallChat)
		if body := readAll(t, resp); resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "30" || !strings.Contains(string(body), "Too Many Requests") {
			t.Fatalf("call %d: %d %q %s, want the upstream's own 429", i, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
	}
	if n := len(h.ups[0].Requests()); n != 3 {
		t.Fatalf("the only upstream got %d of 3 calls", n)
	}
	if st := h.statuses()["p0"]; st.State == "resting" {
		t.Errorf("p0 is %+v, want not resting", st)
	}
}

// The upstream's own retry advice reaches the client: the OpenAI SDKs
// read retry-after-ms first and follow x-should-retry over their rule of
// retrying every 5xx.
func TestUpstreamRetryAdviceIsPassedOn(t *testing.T) {
	h := newPoolHarness(t, 1, "", proxytest.Options{Status: 500, StatusHeaders: map[string]string{"retry-after-ms": "300", "x-should-retry": "false"}})
	resp := h.post("/v1/chat/completions", smallChat)
	readAll(t, resp)
	if resp.StatusCode != 500 || resp.Header.Get("retry-after-ms") != "300" || resp.Header.Get("x-should-retry") != "false" {
		t.Fatalf("%d, retry-after-ms %q, x-should-retry %q", resp.StatusCode, resp.Header.Get("retry-after-ms"), resp.Header.Get("x-should-retry"))
	}
	// An upstream that says retry-after-ms alone gets a Retry-After
	// beside it, rounded up: LangChain JS reads only Retry-After, and did
	// not retry such a 429 at all. One of its own is passed on as it came.
	for _, tc := range []struct{ ms, own, want string }{{"1500", "", "2"}, {"300", "", "1"}, {"1500", "7", "7"}, {"soon", "", ""}} {
		headers := map[string]string{"retry-after-ms": tc.ms}
		if tc.own != "" {
			headers["Retry-After"] = tc.own
		}
		h.ups[0].SetOptions(proxytest.Options{Status: 429, StatusHeaders: headers})
		resp := h.post("/v1/chat/completions", smallChat)
		readAll(t, resp)
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != tc.want || resp.Header.Get("retry-after-ms") != tc.ms {
			t.Errorf("retry-after-ms %s, Retry-After %q: %d, Retry-After %q, want %q", tc.ms, tc.own, resp.StatusCode, resp.Header.Get("Retry-After"), tc.want)
		}
	}
}

// A success status with a body that is not a JSON object (a proxy's HTML
// page in front of the upstream) is a 502, not billed: relayed, it was a
// 200 the SDKs could not parse, billed on the prompt.
func TestSuccessWithoutAJSONBodyIs502(t *testing.T) {
	h := newPoolHarness(t, 1, "", proxytest.Options{Status: 200, ErrorBody: "<html><body>502 Bad Gateway</body></html>"})
	for _, body := range []string{smallChat, strings.Replace(smallChat, `{`, `{"stream":true,`, 1)} {
		before := len(h.rec.Events())
		resp := h.post("/v1/chat/completions", body)
		e := wantError(t, resp, 502, "upstream_bad_answer")
		if e["type"] != "upstream_error" || !strings.Contains(e["message"].(string), "not a JSON object") {
			t.Fatalf("%v", e)
		}
		if n := len(h.rec.Events()); n != before {
			t.Fatalf("%d events recorded for an answer not passed on", n-before)
		}
	}
}

// Such a body is the upstream's failure, found before anything was
// passed on: another member of the pool takes the call. It was the
// client's 502 with a healthy member beside it.
func TestSuccessWithoutAJSONBodyMovesOnToAnotherUpstream(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin", proxytest.Options{Status: 200, ErrorBody: "<html><body>502 Bad Gateway</body></html>"})
	h.answeredAll(6)
	for _, ev := range h.events(6) {
		if ev.Upstream != "p1" {
			t.Fatalf("billed for %s: %+v", ev.Upstream, ev)
		}
	}
}

func TestPoolRetriesBeforeTheFirstByteStreamedOrNot(t *testing.T) {
	// p0 refuses connections, p1 answers 429 with Retry-After, p2 serves.
	// Round robin, so every member gets its turn (p2c would settle on p2).
	h := newPoolHarness(t, 3, "  retries: 2\n  balance: round_robin", proxytest.Options{}, proxytest.Options{Status: 429, RetryAfter: "30"})
	h.ups[0].Close()
	for i := range 20 {
		body := smallChat
		if i%2 == 1 {
			body = `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		}
		resp := h.post("/v1/chat/completions", body)
		got := readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, got)
		}
		if i%2 == 1 && !strings.HasSuffix(strings.TrimSpace(string(got)), "data: [DONE]") {
			t.Fatalf("stream %d did not end with [DONE]: %s", i, got)
		}
	}
	st := h.statuses()
	if st["p1"].State != "resting" || st["p1"].EjectedUntil == "" || !strings.Contains(st["p1"].LastError, "429") {
		t.Fatalf("p1 answered 429 with Retry-After 30 and is %+v", st["p1"])
	}
	if st["p2"].Calls < 20 {
		t.Fatalf("p2 served %d calls, want all 20", st["p2"].Calls)
	}
	// Each call was billed once, by p2.
	events := h.events(20)
	for _, ev := range events {
		if ev.Upstream != "p2" {
			t.Fatalf("event billed for upstream %s, want p2: %+v", ev.Upstream, ev)
		}
	}
}

func TestPoolReloadUnderLoadFailsNoCall(t *testing.T) {
	h := newPoolHarness(t, 3, "  balance: p2c")
	var calls, failed atomic.Int64
	var first atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp := h.post("/v1/chat/completions", smallChat)
				body := readAll(t, resp)
				calls.Add(1)
				if resp.StatusCode != 200 {
					failed.Add(1)
					first.CompareAndSwap(nil, fmt.Sprintf("%d %s", resp.StatusCode, body))
				}
			}
		}()
	}
	// Each pool serves some calls before the next reload: the reload is
	// synchronous in the harness, and three of them back to back ran while
	// hardly any call did.
	served := func() {
		t.Helper()
		from := calls.Load()
		checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
			if n := calls.Load() - from; n < 10 {
				return fmt.Errorf("%d calls since the reload", n)
			}
			return nil
		})
	}
	served()
	h.setPool("  balance: p2c", "p0", "p1")
	served()
	h.setPool("  balance: least_in_flight", "p2")
	served()
	h.setPool("  balance: round_robin", "p0", "p1", "p2")
	served()
	close(stop)
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d calls failed across reloads; first: %v", failed.Load(), calls.Load(), first.Load())
	}
	if calls.Load() < 20 {
		t.Fatalf("only %d calls ran across the reloads", calls.Load())
	}
}

// A streaming server that sends its header at once and then nothing (vLLM
// with a request still queued) has not answered: at first_byte_timeout the
// stream goes to another upstream, and is billed there once. (A
// non-streamed call waits response_timeout: its silence may be the
// generation; TestNonStreamedWaitIsResponseTimeout.)
func TestPoolRetriesAnUpstreamSilentAfterItsHeader(t *testing.T) {
	h := newPoolHarnessWith(t, harnessOptions{firstByteTimeout: "300ms"}, 2, "  retries: 1\n  balance: round_robin",
		proxytest.Options{FirstByteDelay: time.Hour, HeaderFlushThenDelay: true})
	for i := range 4 {
		body := `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		start := time.Now()
		resp := h.post("/v1/chat/completions", body)
		got := readAll(t, resp)
		if resp.StatusCode != 200 || strings.Contains(string(got), `"error"`) {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, got)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("call %d took %s; first_byte_timeout is 300ms", i, d)
		}
	}
	if st := h.statuses()["p0"]; !strings.Contains(st.LastError, "timeout") {
		t.Fatalf("p0 sent only its header and is %+v", st)
	}
	for _, ev := range h.events(4) {
		if ev.Upstream != "p1" {
			t.Fatalf("event billed for upstream %s, want p1: %+v", ev.Upstream, ev)
		}
	}
}

// A replica that cuts every answer after its first bytes (it crashes or
// hangs while generating) is ejected after eject_after such answers in a
// row, although each of them began as an answer.
func TestPoolEjectsAnUpstreamThatCutsItsAnswers(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_for: 30s",
		proxytest.Options{Chunks: 10, DropAfter: 3})
	const stream = `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	cut := 0
	for range 12 {
		if strings.Contains(string(readAll(t, h.post("/v1/chat/completions", stream))), "stream_interrupted") {
			cut++
		}
	}
	st := h.statuses()["p0"]
	if st.State != "ejected" || !strings.Contains(st.LastError, "interrupted") {
		t.Fatalf("p0 cut %d streams and is %+v", cut, st)
	}
	if cut != 3 {
		t.Errorf("%d streams cut, want 3: the third ejects p0", cut)
	}
}

// A call that every member of its pool failed in turn is answered with
// a 503 naming each and why, as the one for a pool whose members are all
// out does. It named the last one alone: "upstream p2 did not answer
// within first_byte_timeout", though p0 and p1 had held the call as long.
func TestPoolFinal503NamesEveryUpstreamTried(t *testing.T) {
	slow := proxytest.Options{FirstByteDelay: time.Second}
	h := newPoolHarness(t, 3, "  balance: round_robin", slow, slow, slow)
	h.settings = map[int]string{0: "first_byte_timeout: 200ms", 1: "first_byte_timeout: 200ms", 2: "first_byte_timeout: 200ms"}
	h.setPool("  retries: 2\n  balance: round_robin\n  eject_after: 100", h.names()...)
	const stream = `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	e := wantError(t, h.post("/v1/chat/completions", stream), 503, "upstream_unavailable")
	msg := e["message"].(string)
	for _, name := range h.names() {
		if !strings.Contains(msg, name+": did not answer within first_byte_timeout (200ms)") {
			t.Fatalf("the 503 after every member failed does not say why %s did: %s", name, msg)
		}
	}
	if !strings.HasPrefix(msg, `every upstream tried for model "small" failed (`) {
		t.Fatalf("the 503 after every member failed: %s", msg)
	}
}

// A call whose last try answers 502 or 503 with no retry left, after
// earlier tries failed, gets the 503 naming each, with the last one's
// Retry-After: it got that upstream's own 502 ("Bad Gateway"), as if no
// other upstream had held it. A final 429 stays the upstream's own (see
// TestPoolOfRestingUpstreamsAnswers429WithRetryAfter).
func TestPoolFinal502AfterFailedTriesNamesEveryTry(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin", proxytest.Options{Status: 502, RetryAfter: "7"})
	h.setPool("  retries: 1\n  balance: round_robin\n  eject_after: 100", h.names()...)
	h.ups[1].Close()
	lastAnswered := 0
	for i := range 4 {
		resp := h.post("/v1/chat/completions", smallChat)
		e := wantError(t, resp, 503, "upstream_unavailable")
		msg := e["message"].(string)
		if !strings.HasPrefix(msg, `every upstream tried for model "small" failed (`) || !strings.Contains(msg, "p0: answered 502") || !strings.Contains(msg, "p1: ") {
			t.Fatalf("call %d: %s", i, msg)
		}
		if strings.HasSuffix(msg, "p0: answered 502)") {
			lastAnswered++
			if ra := resp.Header.Get("Retry-After"); ra != "7" {
				t.Fatalf("call %d: Retry-After %q, want the last upstream's 7", i, ra)
			}
		}
	}
	if lastAnswered == 0 {
		t.Fatal("no call tried p1 first, then p0")
	}
	if st := h.statuses(); st["p0"].InFlight != 0 || st["p1"].InFlight != 0 {
		t.Fatalf("in flight after every call ended: %+v", st)
	}
}

// The 503 after every try failed says when the first upstream tried may
// take a call again: the least Retry-After of the tries, whichever answered
// last. It carried the last try's alone, and none when the last try could
// not connect, so an SDK retried at once a pool that had asked for 2 s.
func TestPoolEveryTryFailedRetryAfterIsTheLeast(t *testing.T) {
	refused := proxytest.Options{} // closed below
	// Round robin tries p1, p2, p0 in turn: the last try answers with
	// Retry-After 30 in the first pool, and cannot connect in the second.
	for _, members := range [][3]proxytest.Options{
		{{Status: 503, RetryAfter: "30"}, {Status: 503, RetryAfter: "2"}, refused},
		{refused, {Status: 503, RetryAfter: "30"}, {Status: 503, RetryAfter: "2"}},
	} {
		h := newPoolHarness(t, 3, "  balance: round_robin", members[:]...)
		for i, o := range members {
			if o.Status == 0 {
				h.ups[i].Close()
			}
		}
		h.setPool("  retries: 2\n  balance: round_robin\n  eject_after: 100", h.names()...)
		for i := range 3 {
			resp := h.post("/v1/chat/completions", smallChat)
			e := wantError(t, resp, 503, "upstream_unavailable")
			msg := e["message"].(string)
			if strings.Count(msg, "answered 503") != 2 || !strings.Contains(msg, "is unreachable") {
				t.Fatalf("call %d: %s", i, msg)
			}
			if ra := resp.Header.Get("Retry-After"); ra != "2" {
				t.Fatalf("call %d: Retry-After %q, want the least of the tries, 2 (%s)", i, ra, msg)
			}
		}
	}
}

// A healthy replica whose max_connections connections are all in use is
// busy, not failing: the call moves on to another member, and the
// replica stays in service. Counted as a failure, such a replica was
// ejected ("every connection is busy (max_connections reached)") with a
// recent error rate of 0.4.
func TestPoolMemberAtMaxConnectionsIsBusyNotFailing(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin", proxytest.Options{}, proxytest.Options{Chunks: 4, ChunkDelay: 300 * time.Millisecond})
	h.settings = map[int]string{1: "first_byte_timeout: 200ms, max_connections: 1"}
	h.setPool("  retries: 1\n  balance: round_robin\n  eject_after: 1", h.names()...)
	const stream = `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range 8 {
		wg.Go(func() {
			resp := h.post("/v1/chat/completions", stream)
			if body := readAll(t, resp); resp.StatusCode != 200 || strings.Contains(string(body), "error") {
				failed.Add(1)
				t.Logf("%d %s", resp.StatusCode, body)
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of 8 calls failed", n)
	}
	st := h.statuses()["p1"]
	if st.State != "healthy" || st.Ejections != 0 || st.LastError != "" {
		t.Fatalf("p1, at max_connections, is %+v, want healthy and never ejected", st)
	}
	if st.Retries == 0 {
		t.Fatalf("no call moved on from p1 at max_connections: %+v", st)
	}
	if m := scrape(t, h.harness); !strings.Contains(m, `tollgate_upstream_busy_total{upstream="p1"} `) ||
		strings.Contains(m, `tollgate_upstream_busy_total{upstream="p1"} 0`+"\n") {
		t.Fatalf("/metrics does not count p1's busy attempts:\n%s", m)
	}
}

// A replica that cuts every stream, back from an ejection, is ejected for
// twice as long by the next stream it cuts, and its probe's answer no
// longer brings it back early. Its trial was judged at the first byte, so
// it passed: such a replica was ejected for eject_for every 1 to 2 s, and
// 10 to 15 % of the streams were cut for good.
func TestPoolEscalatesAnUpstreamThatKeepsCuttingItsAnswers(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_after: 1\n  eject_for: 500ms\n  eject_max: 10s\n  probe_interval: 100ms",
		proxytest.Options{}, proxytest.Options{Chunks: 10, DropAfter: 3})
	const stream = `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	var st poolStatus
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		readAll(t, h.post("/v1/chat/completions", stream))
		if st = h.statuses()["p1"]; st.Ejections < 2 {
			return fmt.Errorf("p1 cuts its streams and is %+v", st)
		}
		return nil
	})
	until, err := time.Parse(time.RFC3339Nano, st.EjectedUntil)
	if err != nil {
		t.Fatalf("p1 ejected again: %+v (%v)", st, err)
	}
	if left := time.Until(until); left < 750*time.Millisecond {
		t.Fatalf("p1 cut a stream after its return and is ejected for %s more, want twice eject_for (1s)", left)
	}
	time.Sleep(600 * time.Millisecond) // past eject_for, and several probes
	if st := h.statuses()["p1"]; st.State != "ejected" {
		t.Fatalf("p1 is %+v before its doubled ejection ran out", st)
	}
}

// One burst of 5xx ejects a replica once, for eject_for, and the probe
// brings it back once it answers. Each call in flight when it was ejected
// failed after the ejection and ejected it again for twice as long: 6
// calls held by a replica that answered 500 for a moment kept it out for
// 8 s, and 24 for eject_max, with the probe given up although it answered.
func TestPoolBurstOf5xxEjectsOnce(t *testing.T) {
	h := newPoolHarness(t, 2, "  balance: round_robin\n  eject_for: 5s\n  eject_max: 60s\n  probe_interval: 100ms")
	for range 4 { // p1 has answered: no slow start holds its calls back
		readAll(t, h.post("/v1/chat/completions", smallChat))
	}
	h.ups[1].SetOptions(proxytest.Options{Status: 500, FirstByteDelay: 300 * time.Millisecond})
	var wg sync.WaitGroup
	for range 12 { // 6 of them wait on p1 when it answers 500
		wg.Go(func() { readAll(t, h.post("/v1/chat/completions", smallChat)) })
	}
	wg.Wait()
	st := h.statuses()["p1"]
	if st.State != "ejected" || st.Ejections != 1 {
		t.Fatalf("p1 after one burst of 500s: %+v, want ejected once", st)
	}
	h.ups[1].SetOptions(proxytest.Options{})
	// Its probe answers within 100 ms; the next call is the trial.
	checkFor(t, 2*time.Second, 50*time.Millisecond, func() error {
		readAll(t, h.post("/v1/chat/completions", smallChat))
		if st := h.statuses()["p1"]; st.State != "healthy" {
			return fmt.Errorf("p1 answers again and is %+v", st)
		}
		return nil
	})
}

// A trial that decides nothing (the upstream answered 429 without
// Retry-After, or the client left) frees its slot for the next call. Held,
// it left the upstream half-open with no call let through and its probe
// asking /models for good.
func TestPoolUndecidedTrialLetsTheNextCallTry(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_after: 1\n  eject_for: 200ms\n  probe_interval: 100ms",
		proxytest.Options{}, proxytest.Options{Status: 500})
	checkFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		readAll(t, h.post("/v1/chat/completions", smallChat))
		if st := h.statuses()["p1"]; st.State != "ejected" {
			return fmt.Errorf("p1 answers 500 and is %+v", st)
		}
		return nil
	})
	h.ups[1].SetOptions(proxytest.Options{Status: 429})
	checkFor(t, 2*time.Second, 20*time.Millisecond, func() error {
		readAll(t, h.post("/v1/chat/completions", smallChat))
		if n := len(h.ups[1].Requests()); n < 2 || h.ups[1].Requests()[n-1].Method != "POST" {
			return fmt.Errorf("no trial call reached p1 yet")
		}
		return nil
	})
	h.ups[1].SetOptions(proxytest.Options{})
	checkFor(t, 2*time.Second, 20*time.Millisecond, func() error {
		readAll(t, h.post("/v1/chat/completions", smallChat))
		if st := h.statuses()["p1"]; st.State != "healthy" {
			return fmt.Errorf("p1 answers again and is %+v", st)
		}
		return nil
	})
}

// A model's only upstream is never ejected: one client's failing calls
// (an SDK retries a 500 twice) would otherwise be a 503 for everyone.
func TestPoolNeverEjectsAnUpstreamAloneInItsPool(t *testing.T) {
	h := newPoolHarness(t, 1, "  eject_after: 2", proxytest.Options{Status: 500})
	for i := range 5 {
		resp := h.post("/v1/chat/completions", smallChat)
		if body := readAll(t, resp); resp.StatusCode != 500 {
			t.Fatalf("call %d: %d %s, want the upstream's own 500 every time", i, resp.StatusCode, body)
		}
	}
	// Not out, and not said to be well either (failing: see
	// TestPoolOfOneFailingShowsInStateAndGauge).
	if st := h.statuses()["p0"]; st.State != "failing" || st.Ejections != 0 || !strings.Contains(st.LastError, "500") {
		t.Fatalf("p0 is %+v, want failing, never ejected, with the 500 as last error", st)
	}
}

// A model's only upstream that fails is said once in the log, with its
// base_url: never ejected, it was never logged, and the Quick start's
// gateway with no upstream running answered 503s with a silent log.
func TestPoolLogsAnUpstreamAloneThatFailsOnce(t *testing.T) {
	var log testutil.Log
	h := newPoolHarnessWith(t, harnessOptions{logf: log.Logf}, 1, "  eject_after: 2", proxytest.Options{Status: 500})
	var first string
	for i := range 3 {
		resp := h.post("/v1/chat/completions", smallChat)
		if i == 0 {
			first = resp.Header.Get("x-request-id")
		}
		readAll(t, resp)
	}
	failed := log.Matching("upstream p0 (", "failed")
	if len(failed) != 1 || !strings.Contains(failed[0], "("+h.ups[0].URL) {
		t.Fatalf("logged %q, want one line naming p0's base_url %s", failed, h.ups[0].URL)
	}
	// The id the client got leads to the line: an operator asked about a
	// failed call had only the time to go by.
	if first == "" || !strings.Contains(failed[0], "failed on request "+first+":") {
		t.Fatalf("logged %q, want it to name the failed call's request %q", failed[0], first)
	}
}

// An upstream whose rest after a 429 is over takes calls again, as the
// admin API and the health gauge say, though no call came since: it once
// showed half_open and 0 until a call happened to land on it.
func TestPoolRestEndsWithoutATrial(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin", proxytest.Options{Status: 429, RetryAfter: "1"})
	for range 2 {
		readAll(t, h.post("/v1/chat/completions", smallChat))
	}
	if st := h.statuses()["p0"]; st.State != "resting" {
		t.Fatalf("p0 answered 429 with Retry-After 1 and is %+v", st)
	}
	time.Sleep(1200 * time.Millisecond)
	if st := h.statuses()["p0"]; st.State != "healthy" {
		t.Fatalf("p0's rest is over and it is %+v", st)
	}
	if m := scrape(t, h.harness); !strings.Contains(m, `tollgate_upstream_healthy{upstream="p0"} 1`) {
		t.Fatalf("p0's rest is over and the gauge says otherwise:\n%s", m)
	}
}

// A success status with an empty body is no answer: the call moves on to
// another upstream, or gets a 503 saying so, instead of an empty 200 that
// was billed.
func TestPoolRetriesAnEmptyAnswer(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin", proxytest.Options{Status: 204})
	for i := range 4 {
		resp := h.post("/v1/chat/completions", smallChat)
		if body := readAll(t, resp); resp.StatusCode != 200 || len(body) == 0 {
			t.Fatalf("call %d: %d %q", i, resp.StatusCode, body)
		}
	}
	alone := newPoolHarness(t, 1, "", proxytest.Options{Status: 204})
	e := wantError(t, alone.post("/v1/chat/completions", smallChat), 503, "upstream_unavailable")
	if msg := e["message"].(string); !strings.Contains(msg, "empty body") {
		t.Fatalf("503 message %q", msg)
	}
	if n := len(alone.rec.Events()); n != 0 {
		t.Fatalf("%d events for an empty answer", n)
	}
}

// An edit of an upstream's settings keeps what the gateway learned of it:
// an unrelated change (first_byte_timeout) used to put an ejected upstream
// back in the pool and reset its counters on /metrics. A new address is a
// new server: its breaker starts afresh, its counters still carry.
func TestPoolEditOfAnUpstreamKeepsItsHealth(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_for: 30s",
		proxytest.Options{Chunks: 10, DropAfter: 3})
	const stream = `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for range 12 {
		readAll(t, h.post("/v1/chat/completions", stream))
	}
	before := h.statuses()["p0"]
	if before.State != "ejected" || before.Calls == 0 {
		t.Fatalf("p0 not ejected: %+v", before)
	}
	edit := func(from, to string) {
		t.Helper()
		cfg := readFile(t, h.cfgPath)
		if !strings.Contains(cfg, from) {
			t.Fatalf("no %q in the config", from)
		}
		h.writeConfig(strings.Replace(cfg, from, to, 1))
	}
	edit("p0, base_url: "+h.ups[0].URL+", first_byte_timeout: 2s", "p0, base_url: "+h.ups[0].URL+", first_byte_timeout: 3s")
	after := h.statuses()["p0"]
	if after.State != "ejected" || after.Calls != before.Calls || after.LastError != before.LastError {
		t.Fatalf("after an edit of first_byte_timeout p0 is %+v, was %+v", after, before)
	}
	// The same server under another address (localhost for 127.0.0.1).
	moved := strings.Replace(h.ups[0].URL, "127.0.0.1", "localhost", 1)
	edit("p0, base_url: "+h.ups[0].URL, "p0, base_url: "+moved)
	if st := h.statuses()["p0"]; st.State == "ejected" || st.Calls != before.Calls {
		t.Fatalf("after a new base_url p0 is %+v (calls before %d)", st, before.Calls)
	}
}

// An upstream still ejected when a reload edits it is probed again and
// comes back as soon as it answers: the probe of its old self ended with
// the reload, and it stayed out until its ejection ran out.
func TestPoolEditOfAnEjectedUpstreamKeepsProbingIt(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_after: 1\n  eject_for: 30s\n  probe_interval: 200ms")
	addr := strings.TrimPrefix(strings.TrimSuffix(h.ups[0].URL, "/v1"), "http://")
	h.ups[0].Close()
	for range 4 {
		readAll(t, h.post("/v1/chat/completions", smallChat))
	}
	if st := h.statuses()["p0"]; st.State != "ejected" {
		t.Fatalf("p0 is %+v, want ejected", st)
	}
	cfg := readFile(t, h.cfgPath)
	h.writeConfig(strings.Replace(cfg, "name: p0, base_url: "+h.ups[0].URL+", first_byte_timeout: 2s", "name: p0, base_url: "+h.ups[0].URL+", first_byte_timeout: 3s", 1))
	if st := h.statuses()["p0"]; st.State != "ejected" {
		t.Fatalf("after the edit p0 is %+v, want still ejected", st)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening on p0's address again: %v", err)
	}
	back := proxytest.NewServerOn(ln, proxytest.Options{})
	t.Cleanup(back.Close)
	// The probe's answer makes its next call the trial, which closes the
	// breaker.
	checkFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		if st := h.statuses()["p0"]; st.State != "half_open" {
			return fmt.Errorf("p0 is %s, its address answers again", st.State)
		}
		return nil
	})
	for range 2 {
		readAll(t, h.post("/v1/chat/completions", smallChat))
	}
	if st := h.statuses()["p0"]; st.State != "healthy" {
		t.Fatalf("after its trial p0 is %+v", st)
	}
}

// A reload of routing.probe_interval reaches an upstream ejected before
// it: its probe slept the interval it started with, an hour here, and
// the upstream stayed out that long after it answered again.
func TestPoolProbeIntervalReloadReachesAnEjectedUpstream(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_after: 1\n  eject_for: 30s\n  probe_interval: 1h")
	addr := strings.TrimPrefix(strings.TrimSuffix(h.ups[0].URL, "/v1"), "http://")
	h.ups[0].Close()
	for range 4 {
		readAll(t, h.post("/v1/chat/completions", smallChat))
	}
	if st := h.statuses()["p0"]; st.State != "ejected" {
		t.Fatalf("p0 is %+v, want ejected", st)
	}
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), "probe_interval: 1h", "probe_interval: 100ms", 1))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening on p0's address again: %v", err)
	}
	back := proxytest.NewServerOn(ln, proxytest.Options{})
	t.Cleanup(back.Close)
	checkFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		if st := h.statuses()["p0"]; st.State != "half_open" {
			return fmt.Errorf("p0 is %s, its address answers again and probe_interval is 100ms", st.State)
		}
		return nil
	})
}

// A non-streamed answer comes in one piece once it is generated, so its
// wait is response_timeout, not first_byte_timeout: a generation longer
// than first_byte_timeout once failed with a 503 on every member of the
// pool, each of which had generated the answer. Past response_timeout it
// is a 504, and no other member is asked to generate it again.
func TestNonStreamedWaitIsResponseTimeout(t *testing.T) {
	slow := proxytest.Options{FirstByteDelay: 600 * time.Millisecond}
	h := newPoolHarness(t, 2, "  retries: 2", slow, slow)
	h.writeConfig(strings.ReplaceAll(readFile(t, h.cfgPath), "first_byte_timeout: 2s}", "first_byte_timeout: 200ms, response_timeout: 5s}"))
	requests := func() int { return len(h.ups[0].Requests()) + len(h.ups[1].Requests()) }

	resp := h.post("/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`)
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("a non-streamed answer generated in 600 ms with first_byte_timeout 200ms: %d %s", resp.StatusCode, body)
	}
	if n := requests(); n != 1 {
		t.Errorf("%d upstream requests for one call, want 1", n)
	}
	// A stream's first event is still due within first_byte_timeout.
	wantError(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[]}`), 503, "upstream_unavailable")

	h.writeConfig(strings.ReplaceAll(readFile(t, h.cfgPath), "response_timeout: 5s}", "response_timeout: 300ms}"))
	before := requests()
	resp = h.post("/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`)
	if got := resp.Header.Get("x-should-retry"); got != "false" {
		t.Errorf("x-should-retry %q, want false: the SDKs retry a 504 otherwise, and pay for the generation again", got)
	}
	e := wantError(t, resp, 504, "upstream_timeout")
	if msg := e["message"].(string); !strings.Contains(msg, "response_timeout (300ms)") {
		t.Errorf("message %q", msg)
	}
	if n := requests() - before; n != 1 {
		t.Errorf("a call past response_timeout was sent %d times, want once", n)
	}
}

// A base_url with a query (Azure's ?api-version=) kept it on chat calls,
// but the breaker's probe and the /v1/responses state calls glued their
// path after it: GET /v1?api-version=1/models, which no upstream serves.
func TestBaseURLQueryStaysAQueryOnEveryUpstreamCall(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_after: 1\n  eject_for: 30s\n  probe_interval: 100ms")
	cfg := readFile(t, h.cfgPath)
	for _, up := range h.ups {
		cfg = strings.Replace(cfg, "base_url: "+up.URL+",", `base_url: "`+up.URL+`?api-version=1",`, 1)
	}
	h.writeConfig(cfg)
	last := func(up *proxytest.Server) proxytest.Recorded { reqs := up.Requests(); return reqs[len(reqs)-1] }
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		readAll(t, h.post("/v1/chat/completions", smallChat))
		readAll(t, h.post("/v1/chat/completions", smallChat))
		for i, up := range h.ups {
			if r := last(up); r.Path != "/v1/chat/completions" || r.RawQuery != "api-version=1" {
				return fmt.Errorf("p%d's chat call went to %s?%s", i, r.Path, r.RawQuery)
			}
		}
		return nil
	})

	id, at := h.create("", createResp, "")
	status, body := h.send("", "GET", "/v1/responses/"+id+"/input_items?limit=1", "", "")
	if r := last(h.ups[at]); status != 200 || r.Path != "/v1/responses/"+id+"/input_items" || r.RawQuery != "api-version=1&limit=1" {
		t.Fatalf("input_items: %d %s; the upstream got %s?%s", status, body, r.Path, r.RawQuery)
	}

	h.ups[0].SetOptions(proxytest.Options{Status: 500})
	for range 2 {
		readAll(t, h.post("/v1/chat/completions", smallChat))
	}
	if st := h.statuses()["p0"]; st.State != "ejected" {
		t.Fatalf("p0 is %+v, want ejected", st)
	}
	h.ups[0].SetOptions(proxytest.Options{})
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if r := last(h.ups[0]); r.Method != "GET" || r.Path != "/v1/models" || r.RawQuery != "api-version=1" {
			return fmt.Errorf("no probe yet; p0's last request %s %s?%s", r.Method, r.Path, r.RawQuery)
		}
		return nil
	})
}

// silentUpstream is a replica stopped before it ever answered: it takes
// connections and reads what comes, and answers nothing. Closed at the end
// of the test, which fails the calls it holds.
type silentUpstream struct {
	URL   string
	calls atomic.Int32 // connections a request came on: one a call
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newSilentUpstream(t *testing.T) *silentUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentUpstream{URL: "http://" + ln.Addr().String() + "/v1", ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			go func() {
				buf := make([]byte, 4096)
				if _, err := c.Read(buf); err != nil {
					return
				}
				s.calls.Add(1)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.conns {
			c.Close()
		}
	})
	return s
}

// A replica that never answered takes one call at a time even when the
// others are new too: p0 and p2, stopped before their first answer, hold
// one call each, and every call after goes to p1. Until 2026-11-26 two
// members holding their first calls cost the same and tied when drawn
// together, the first drawn taking the call, so 2 to 3 of 8 clients got
// stuck on a stopped replica once every member of the pool was new.
func TestPoolSlowStartWhenEveryMemberIsNew(t *testing.T) {
	h := newPoolHarness(t, 3, "  balance: p2c")
	s0, s2 := newSilentUpstream(t), newSilentUpstream(t)
	held := func() int32 { return s0.calls.Load() + s2.calls.Load() }
	// New addresses: new upstreams, which never answered.
	cfg := readFile(t, h.cfgPath)
	cfg = strings.Replace(cfg, "base_url: "+h.ups[0].URL+",", "base_url: "+s0.URL+",", 1)
	cfg = strings.Replace(cfg, "base_url: "+h.ups[2].URL+",", "base_url: "+s2.URL+",", 1)
	h.writeConfig(strings.Replace(cfg, "upstreams: [p0, p1, p2]", "upstreams: [p0, p2]", 1))
	checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
		if m := h.statuses()["p1"].Models; len(m) != 0 {
			return fmt.Errorf("p1 still serves %v", m)
		}
		return nil
	})
	call := func(body string) <-chan int {
		done := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+h.key)
			resp, err := h.client.Do(req)
			if err != nil {
				done <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		return done
	}
	// One call to each: the second goes to the member the first did not.
	for n := range int32(2) {
		call(smallChat)
		checkFor(t, 3*time.Second, 5*time.Millisecond, func() error {
			if held() != n+1 {
				return fmt.Errorf("%d calls held, want %d", held(), n+1)
			}
			return nil
		})
	}
	if s0.calls.Load() != 1 || s2.calls.Load() != 1 {
		t.Fatalf("p0 holds %d calls and p2 %d, want 1 each", s0.calls.Load(), s2.calls.Load())
	}
	h.writeConfig(cfg) // p1, new too, joins
	checkFor(t, 3*time.Second, 10*time.Millisecond, func() error {
		if m := h.statuses()["p1"].Models; len(m) != 1 {
			return fmt.Errorf("p1 serves %v", m)
		}
		return nil
	})
	streamed := `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for i := range 40 {
		body := smallChat
		if i%2 == 1 {
			body = streamed
		}
		done := call(body)
		for status := -1; status < 0; {
			select {
			case status = <-done:
				if status != 200 {
					t.Fatalf("call %d: %d", i, status)
				}
			default:
				if held() > 2 {
					t.Fatalf("call %d went to a replica that never answered and holds a call (p0 %d calls, p2 %d)", i, s0.calls.Load(), s2.calls.Load())
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
	}
}

// A replica whose streams end with its own error event (vLLM's engine
// died mid-generation: a few chunks, then {"error":…}, then [DONE] or
// not) is ejected as one that cuts them is, and the streams count as
// interrupted. The error event ended the answer and counted as a
// completed one: a re-test saw 466 of 933 streams get the error while
// the member stayed healthy, its error rate near 0.
func TestPoolEjectsAnUpstreamWhoseStreamsEndInItsOwnError(t *testing.T) {
	const engineDead = `data: {"error":{"object":"error","message":"EngineDeadError: background loop has errored","type":"InternalServerError","param":null,"code":500}}` + "\n\n"
	for _, tc := range []struct {
		name, path, body, event string
	}{
		{"chat then [DONE]", "/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`, engineDead + "data: [DONE]\n\n"},
		{"chat", "/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`, engineDead},
		// OpenRouter's: the error after the choices, which finish with "error".
		{"chat, error after choices", "/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			`data: {"id":"gen-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}],"error":{"code":"server_error","message":"EngineDeadError: provider disconnected"}}` + "\n\ndata: [DONE]\n\n"},
		{"responses error", "/v1/responses", `{"model":"small","stream":true,"input":"hi"}`,
			"event: error\ndata: " + `{"type":"error","code":"server_error","message":"EngineDeadError: background loop has errored","param":null,"sequence_number":4}` + "\n\n"},
		{"responses failed", "/v1/responses", `{"model":"small","stream":true,"input":"hi"}`,
			"event: response.failed\ndata: " + `{"type":"response.failed","sequence_number":4,"response":{"id":"resp_1","object":"response","status":"failed","error":{"code":"server_error","message":"EngineDeadError: background loop has errored"},"output":[]}}` + "\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_for: 30s",
				proxytest.Options{Chunks: 10, ErrorEventAfter: 3, ErrorEvent: tc.event})
			failed := 0
			for range 12 {
				if strings.Contains(string(readAll(t, h.post(tc.path, tc.body))), "EngineDeadError") {
					failed++
				}
			}
			st := h.statuses()["p0"]
			if st.State != "ejected" || !strings.Contains(st.LastError, "EngineDeadError") {
				t.Fatalf("p0 ended %d streams with its own error and is %+v", failed, st)
			}
			if failed != 3 {
				t.Errorf("%d streams ended in p0's error, want 3: the third ejects p0", failed)
			}
			want := fmt.Sprintf(`tollgate_requests_interrupted_total{model="small",upstream="p0",endpoint="%s",status="200"} 3`, tc.path)
			if m := scrape(t, h.harness); !strings.Contains(m, want+"\n") {
				t.Errorf("/metrics does not count p0's error-ended streams as interrupted (want %s):\n%s", want, m)
			}
		})
	}
}

// An error event that blames the request, and a response that ends
// incomplete (max_output_tokens, a content filter), are normal ends: the
// member stays in service with nothing counted against it.
func TestPoolKeepsAnUpstreamWhoseStreamsEndInTheRequestsError(t *testing.T) {
	for _, tc := range []struct {
		name, path, body, event string
	}{
		{"chat 400", "/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			`data: {"error":{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}}` + "\n\ndata: [DONE]\n\n"},
		{"responses incomplete", "/v1/responses", `{"model":"small","stream":true,"input":"hi"}`,
			"event: response.incomplete\ndata: " + `{"type":"response.incomplete","sequence_number":4,"response":{"id":"resp_1","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[]}}` + "\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_after: 1\n  eject_for: 30s",
				proxytest.Options{Chunks: 10, ErrorEventAfter: 3, ErrorEvent: tc.event})
			for range 4 {
				readAll(t, h.post(tc.path, tc.body))
			}
			if st := h.statuses()["p0"]; st.State != "healthy" || st.LastError != "" || st.Calls != 2 {
				t.Fatalf("p0 ended 2 streams normally and is %+v", st)
			}
		})
	}
}

// A replica that cuts every stream but answers non-streamed calls whole
// is ejected after eject_after cut streams under mixed traffic: its
// whole answers do not end the streak of streams it cut. They did, and
// such a replica, sent a stream and a non-streamed call in turn, was
// never ejected.
func TestPoolEjectsAnUpstreamThatCutsStreamsBetweenWholeAnswers(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_for: 30s",
		proxytest.Options{Chunks: 10, DropAfter: 5})
	const stream = `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	const whole = `{"model":"small","messages":[{"role":"user","content":"hi"}]}`
	cut := 0
	for i := range 24 {
		// s, s, w, w, …: each member gets a stream and a whole call in turn.
		body := stream
		if i%4 >= 2 {
			body = whole
		}
		resp := h.post("/v1/chat/completions", body)
		if b := readAll(t, resp); resp.StatusCode != 200 || strings.Contains(string(b), "stream_interrupted") {
			cut++
		}
		if h.statuses()["p0"].State == "ejected" {
			break
		}
	}
	if st := h.statuses()["p0"]; st.State != "ejected" || cut != 3 {
		t.Fatalf("p0 cut %d streams between whole answers and is %+v, want ejected at the third", cut, st)
	}
}

// A replica that stalls every stream after its first event, back from an
// ejection, holds one stream at a time until that one's idle_timeout:
// its trial is judged at the first byte, and new calls went to it until
// the trial timed out, 4 to 5 streams of 8 clients hung each time it
// returned (a minute each, at the default idle_timeout).
func TestPoolMemberBackFromAnEjectionHoldsOneStreamAtATime(t *testing.T) {
	h := newPoolHarness(t, 2, "  retries: 1\n  balance: round_robin\n  eject_after: 1\n  eject_for: 200ms\n  eject_max: 10s\n  probe_interval: 100ms",
		proxytest.Options{Chunks: 3}, proxytest.Options{Chunks: 3, Stall: true})
	h.settings = map[int]string{1: "idle_timeout: 300ms"}
	h.setPool("  retries: 1\n  balance: round_robin\n  eject_after: 1\n  eject_for: 200ms\n  eject_max: 10s\n  probe_interval: 100ms", h.names()...)
	const stream = `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	stalled := func(body []byte) bool { return strings.Contains(string(body), "idle_timeout") }
	for range 2 { // one of them stalls on p1, which ejects it
		readAll(t, h.post("/v1/chat/completions", stream))
	}
	before := h.statuses()["p1"]
	if before.Ejections != 1 {
		t.Fatalf("p1 stalled a stream and is %+v", before)
	}
	var hung atomic.Int32
	var wg sync.WaitGroup
	stop := time.Now().Add(2500 * time.Millisecond)
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				if stalled(readAll(t, h.post("/v1/chat/completions", stream))) {
					hung.Add(1)
				}
			}
		})
	}
	wg.Wait()
	after := h.statuses()["p1"]
	returns := after.Ejections - before.Ejections + 1 // the last return's trial may have hung too
	if n := hung.Load(); n == 0 || uint64(n) > returns {
		t.Fatalf("p1 returned %d times and %d streams hung on it, want one a return", returns, n)
	}
}

// An edit of an upstream under load keeps its calls in flight and its
// max_connections: the calls still running on its old settings count
// against the cap of the new ones, and in its in_flight. A reload that
// changed a write_timeout gave it a whole new cap beside them (four
// connections to a replica capped at two) and an in_flight of 0 while
// both streamed, which least_in_flight and p2c took for idle.
func TestPoolEditOfAnUpstreamUnderLoadKeepsItsCapAndInFlight(t *testing.T) {
	h := newPoolHarness(t, 1, "  balance: least_in_flight", proxytest.Options{Chunks: 10, ChunkDelay: 80 * time.Millisecond})
	const settings = "first_byte_timeout: 5s, max_connections: 2"
	h.settings = map[int]string{0: settings}
	h.setPool("  balance: least_in_flight", "p0")
	up := h.ups[0]
	var most atomic.Int32
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			if n := int32(up.Active()); n > most.Load() {
				most.Store(n)
			}
			select {
			case <-stopWatch:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	const stream = `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	var wg sync.WaitGroup
	var failed atomic.Int32
	streams := func(n int) {
		for range n {
			wg.Go(func() {
				resp := h.post("/v1/chat/completions", stream)
				if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") {
					failed.Add(1)
					t.Logf("%d %s", resp.StatusCode, body)
				}
			})
		}
	}
	running := func(n int) {
		t.Helper()
		checkFor(t, 3*time.Second, 2*time.Millisecond, func() error {
			if a := up.Active(); a != n {
				return fmt.Errorf("%d streams with the upstream, want %d", a, n)
			}
			return nil
		})
	}
	edit := func(s string) {
		t.Helper()
		h.settings[0] = s
		h.setPool("  balance: least_in_flight", "p0")
	}

	streams(2)
	running(2)
	edit(settings + ", write_timeout: 11s")
	if st := h.statuses()["p0"]; st.InFlight != 2 {
		t.Fatalf("two streams run on p0, and after an edit of its write_timeout in_flight is %d", st.InFlight)
	}
	streams(2)
	edit(settings + ", write_timeout: 12s") // and once more, with four calls running or waiting
	wg.Wait()
	if n := most.Load(); n > 2 {
		t.Fatalf("%d connections to p0 at once across edits of its write_timeout, over its max_connections 2", n)
	}
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of 4 streams failed", n)
	}
	if st := h.statuses()["p0"]; st.InFlight != 0 {
		t.Fatalf("every call ended and p0 has %d in flight", st.InFlight)
	}

	// A new cap counts the calls still running under the old one.
	most.Store(0)
	streams(2)
	running(2)
	edit("first_byte_timeout: 5s, max_connections: 3")
	streams(2)
	wg.Wait()
	if n := most.Load(); n != 3 {
		t.Fatalf("%d connections to p0 at most after max_connections went from 2 to 3 under two calls, want 3", n)
	}
	// No slot was lost on the way: three go out at once.
	streams(3)
	running(3)
	wg.Wait()
	close(stopWatch)
	<-watched
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d streams failed", n)
	}
}

// An upstream that cannot be reached when the gateway starts is said in
// the log at start, with its base_url and, when it is on this machine and
// refuses, what to start: the Quick start's gateway with no upstream
// running said nothing until a call failed with a 503.
func TestCheckUpstreamsLogsOneThatDoesNotAnswer(t *testing.T) {
	var log testutil.Log
	lines := log.Matching
	h := newPoolHarnessWith(t, harnessOptions{logf: log.Logf}, 2, "", proxytest.Options{})
	h.ups[1].Close()
	h.gw.CheckUpstreams()
	testutil.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if len(lines("upstream p1 (")) == 0 {
			return errors.New("nothing logged of p1")
		}
		return nil
	})
	got := lines("upstream p1 (")
	// Where make demo-upstream is to listen: its default, 127.0.0.1:8000,
	// is not p1's address (TestLoopbackHintNamesTheDemoUpstreamsAddress).
	host, _, _ := strings.Cut(strings.TrimPrefix(h.ups[1].URL, "http://"), "/")
	start := "make demo-upstream ADDR=" + host + ","
	if len(got) != 1 || !strings.Contains(got[0], "("+h.ups[1].URL) || !strings.Contains(got[0], "does not answer") ||
		!strings.Contains(got[0], start) {
		t.Fatalf("logged %q, want one line naming p1's base_url %s and what to start, %s", got, h.ups[1].URL, start)
	}
	time.Sleep(100 * time.Millisecond) // p0's check has long answered
	if got := lines("upstream p0 ("); len(got) != 0 {
		t.Fatalf("p0 answers, and the log says %q", got)
	}
}

// A model's only upstream that cuts every stream was never logged: the
// log said a lone upstream's first failure only when it failed before
// its first byte. Said once, with its base_url, and once more when a
// stream of it completes.
func TestPoolLogsAnUpstreamAloneThatBreaksStreamsOnce(t *testing.T) {
	var log testutil.Log
	lines := log.Matching
	h := newPoolHarnessWith(t, harnessOptions{logf: log.Logf}, 1, "  eject_after: 2", proxytest.Options{Chunks: 10, DropAfter: 3})
	stream := `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for range 3 {
		readAll(t, h.post("/v1/chat/completions", stream))
	}
	if broke := lines("upstream p0 (", "broke"); len(broke) != 1 || !strings.Contains(broke[0], "("+h.ups[0].URL) {
		t.Fatalf("logged %q, want one line naming p0's base_url %s", broke, h.ups[0].URL)
	}
	if back := lines("upstream p0 is back"); len(back) != 0 {
		t.Fatalf("logged %q before a stream completed", back)
	}
	h.ups[0].SetOptions(proxytest.Options{})
	for range 2 {
		readAll(t, h.post("/v1/chat/completions", stream))
	}
	if back := lines("upstream p0 is back"); len(back) != 1 {
		t.Fatalf("logged %q once streams complete, want one line", back)
	}
}

// answeredAll makes n chat calls, streamed and not by turns, each of which
// must be answered 200.
func (h *poolHarness) answeredAll(n int) {
	h.t.Helper()
	for i := range n {
		body := smallChat
		if i%2 == 1 {
			body = strings.Replace(smallChat, `{`, `{"stream":true,`, 1)
		}
		resp := h.post("/v1/chat/completions", body)
		if got := readAll(h.t, resp); resp.StatusCode != 200 {
			h.t.Fatalf("call %d: %d %s", i, resp.StatusCode, got)
		}
	}
}

// A model's only upstream is never ejected, so the admin API and the
// health gauge said healthy while every call to it failed: nothing an
// operator's alert could see. Its failures in a row now show, and its
// next answer clears them.
func TestPoolOfOneFailingShowsInStateAndGauge(t *testing.T) {
	h := newPoolHarness(t, 1, "  eject_after: 2", proxytest.Options{Status: 500})
	for range 2 {
		readAll(t, h.post("/v1/chat/completions", smallChat))
	}
	if st := h.statuses()["p0"]; st.State != "failing" {
		t.Fatalf("p0, the pool's only member, failed 2 calls in a row (eject_after 2) and is %+v", st)
	}
	if m := scrape(t, h.harness); !strings.Contains(m, `tollgate_upstream_healthy{upstream="p0"} 0`) {
		t.Fatalf("p0 failed every call and the gauge says otherwise:\n%s", m)
	}
	h.ups[0].SetOptions(proxytest.Options{})
	if resp := h.post("/v1/chat/completions", smallChat); resp.StatusCode != 200 {
		t.Fatalf("p0 answers again and the call got %d %s", resp.StatusCode, readAll(t, resp))
	} else {
		readAll(t, resp)
	}
	if st := h.statuses()["p0"]; st.State != "healthy" {
		t.Fatalf("p0 answered and is %+v", st)
	}
	if m := scrape(t, h.harness); !strings.Contains(m, `tollgate_upstream_healthy{upstream="p0"} 1`) {
		t.Fatalf("p0 answered and the gauge says otherwise:\n%s", m)
	}
}

// A model's only upstream that resets every stream after its first event
// failed every call while the admin API and the health gauge said
// healthy: each answer's first byte ended its failing streak, and an
// answer broken after it counted in none. Its answers broken in a row
// now show, as failures before the first byte do, and one that
// completes clears them.
func TestPoolOfOneBreakingEveryAnswerShowsFailing(t *testing.T) {
	var cut atomic.Bool
	cut.Store(true)
	base := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		if cut.Load() {
			writeSSE(c, chatChunk("Hello", ""))
			time.Sleep(50 * time.Millisecond) // the event is read before the reset
			_ = c.(*net.TCPConn).SetLinger(0)
			return false
		}
		writeSSE(c, chatChunk("Hello", ""), chatChunk(" there", "stop"), "data: [DONE]\n\n")
		fmt.Fprint(c, "0\r\n\r\n")
		return true
	})
	h := newPoolHarness(t, 1, "  eject_after: 2")
	h.setUpstreamOf(0, base, "first_byte_timeout: 2s")
	stream := `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	state := func() (string, string) {
		gauge := "?"
		for _, line := range strings.Split(scrape(t, h.harness), "\n") {
			if v, ok := strings.CutPrefix(line, `tollgate_upstream_healthy{upstream="p0"} `); ok {
				gauge = v
			}
		}
		return h.statuses()["p0"].State, gauge
	}
	// One answer cut is no streak yet; eject_after of them are.
	for i, want := range []struct{ state, gauge string }{{"healthy", "1"}, {"failing", "0"}} {
		if got := string(readAll(t, h.post("/v1/chat/completions", stream))); !strings.Contains(got, `"code":"stream_interrupted"`) {
			t.Fatalf("call %d got %s, want the stream cut", i, got)
		}
		if st, gauge := state(); st != want.state || gauge != want.gauge {
			t.Fatalf("after %d answers cut in a row (eject_after 2) p0 is %s with tollgate_upstream_healthy %s, want %s and %s", i+1, st, gauge, want.state, want.gauge)
		}
	}
	cut.Store(false)
	if got := string(readAll(t, h.post("/v1/chat/completions", stream))); strings.Contains(got, "error") || !strings.Contains(got, "[DONE]") {
		t.Fatalf("p0 answers whole and the call got %s", got)
	}
	if st, gauge := state(); st != "healthy" || gauge != "1" {
		t.Fatalf("p0 completed an answer and is %s with tollgate_upstream_healthy %s", st, gauge)
	}
}
