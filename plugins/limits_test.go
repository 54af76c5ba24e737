package plugins_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

const classifyBody = `{"text": "I was charged twice", "labels": ["billing", "bug"]}`

// wantRateHeaders checks the OpenAI x-ratelimit trio of one kind.
func wantRateHeaders(t *testing.T, r reply, kind, limit, remaining string) {
	t.Helper()
	if got := r.header.Get("x-ratelimit-limit-" + kind); got != limit {
		t.Errorf("x-ratelimit-limit-%s %q, want %q", kind, got, limit)
	}
	if got := r.header.Get("x-ratelimit-remaining-" + kind); got != remaining {
		t.Errorf("x-ratelimit-remaining-%s %q, want %q", kind, got, remaining)
	}
	reset, err := time.ParseDuration(r.header.Get("x-ratelimit-reset-" + kind))
	if err != nil || reset < 0 || reset > time.Minute {
		t.Errorf("x-ratelimit-reset-%s %q: want a duration such as 1s or 6m0s, up to a minute", kind, r.header.Get("x-ratelimit-reset-"+kind))
	}
}

// wantRetryAfter checks a 429's Retry-After is whole seconds in (lo, hi].
func wantRetryAfter(t *testing.T, r reply, lo, hi int) {
	t.Helper()
	n, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || n <= lo || n > hi {
		t.Errorf("Retry-After %q, want seconds in (%d, %d]", r.header.Get("Retry-After"), lo, hi)
	}
}

// TestPublicLimits: without a key, one request per minute per client
// address, the address being the last untrusted hop of X-Forwarded-For
// when the peer is a trusted proxy.
func TestPublicLimits(t *testing.T) {
	h := newHarness(t, harnessOptions{trustedProxies: "127.0.0.1"})
	first := h.do(request{path: "/v1/classify", body: classifyBody, xff: "203.0.113.5"})
	used := checkUsage(t, first.ok(t))
	wantRateHeaders(t, first, "requests", "1", "0")
	// The text's tokens were counted before the work, the engine's usage
	// after it.
	wantRateHeaders(t, first, "tokens", "10000", strconv.FormatInt(10000-max(used, 4), 10))
	if first.header.Get("Retry-After") != "" {
		t.Errorf("Retry-After on a success")
	}

	// The same address again, through tag: the limit is per caller, not per endpoint.
	again := h.do(request{path: "/v1/tag", body: `{"text": "x"}`, xff: "203.0.113.5"})
	e := again.apiError(t, 429, "rate_limit_exceeded")
	if e["type"] != "rate_limit_error" || !strings.Contains(e["message"].(string), "1 per minute") ||
		!strings.Contains(e["message"].(string), "send an API key") {
		t.Errorf("429 envelope %v", e)
	}
	wantRetryAfter(t, again, 50, 60)
	wantRateHeaders(t, again, "requests", "1", "0")

	// Another client behind the same proxy still passes; the client is the
	// last hop the trusted proxy saw, whatever the client wrote before it.
	h.do(request{path: "/v1/classify", body: classifyBody, xff: "203.0.113.6"}).ok(t)
	h.do(request{path: "/v1/classify", body: classifyBody, xff: "203.0.113.5, 198.51.100.7"}).ok(t)
	h.do(request{path: "/v1/classify", body: classifyBody, xff: "198.51.100.7, 127.0.0.1"}).apiError(t, 429, "rate_limit_exceeded")
	// IPv6 clients count per /64.
	h.do(request{path: "/v1/classify", body: classifyBody, xff: "2001:db8:1:2::1"}).ok(t)
	h.do(request{path: "/v1/classify", body: classifyBody, xff: "2001:db8:1:2::ffff"}).apiError(t, 429, "rate_limit_exceeded")

	// A key lifts the caller out of public mode.
	r := h.do(request{path: "/v1/classify", body: classifyBody, xff: "203.0.113.5", key: h.key})
	r.ok(t)
	wantRateHeaders(t, r, "requests", "600", "599")
}

// public_limits.requests_per_minute: 0 became the default 1, so public
// mode could not be turned off; now 0 turns it off (classify and tag want
// a key, as score does), and a reload turns it back on.
func TestPublicModeOff(t *testing.T) {
	off := harnessOptions{plugins: "  engine: lexical\n  public_limits:\n    requests_per_minute: 0"}
	h := newHarness(t, off)
	for path, body := range map[string]string{"/v1/classify": classifyBody, "/v1/tag": `{"text": "x"}`} {
		e := h.do(request{path: path, body: body}).apiError(t, 401, "INVALID_API_KEY")
		if !strings.Contains(e["message"].(string), "missing API key") {
			t.Errorf("%s without a key: %v", path, e)
		}
		h.do(request{path: path, body: body, key: h.key}).ok(t)
	}
	h.writeConfig(harnessOptions{plugins: "  engine: lexical"})
	h.do(request{path: "/v1/classify", body: classifyBody}).ok(t)
}

// TestForwardedForIgnoredFromUntrustedPeer: X-Forwarded-For from a peer
// that is not a trusted proxy is the client's own claim and changes nothing.
func TestForwardedForIgnoredFromUntrustedPeer(t *testing.T) {
	h := newHarness(t, harnessOptions{trustedProxies: "10.0.0.0/8"})
	h.do(request{path: "/v1/classify", body: classifyBody, xff: "203.0.113.5"}).ok(t)
	h.do(request{path: "/v1/classify", body: classifyBody, xff: "203.0.113.6"}).apiError(t, 429, "rate_limit_exceeded")
	h.do(request{path: "/v1/classify", body: classifyBody}).apiError(t, 429, "rate_limit_exceeded")
}

// TestPublicTokenLimit: text beyond tokens_per_minute is refused without
// Retry-After (it can never pass); within it, tokens add up per minute.
func TestPublicTokenLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{trustedProxies: "127.0.0.1", plugins: `
  engine: lexical
  public_limits: {requests_per_minute: 100, tokens_per_minute: 12}`})
	r := h.do(request{path: "/v1/tag", body: `{"text": "one two three four five six seven eight nine ten eleven twelve thirteen"}`, xff: "203.0.113.9"})
	e := r.apiError(t, 429, "rate_limit_exceeded")
	if !strings.Contains(e["message"].(string), "this request has 13 tokens, more than the 12 tokens per minute") {
		t.Errorf("message %q", e["message"])
	}
	if r.header.Get("Retry-After") != "" {
		t.Errorf("Retry-After %q for a request that can never pass", r.header.Get("Retry-After"))
	}
	eight := `{"text": "one two three four five six seven eight"}`
	r = h.do(request{path: "/v1/tag", body: eight, xff: "203.0.113.9"})
	r.ok(t)
	wantRateHeaders(t, r, "tokens", "12", "4")
	r = h.do(request{path: "/v1/tag", body: eight, xff: "203.0.113.9"})
	e = r.apiError(t, 429, "rate_limit_exceeded")
	if !strings.Contains(e["message"].(string), "rate limit reached for tokens") {
		t.Errorf("message %q", e["message"])
	}
	wantRetryAfter(t, r, 0, 21) // 4 more tokens of 12/min: 20s
}

// TestLabelSetCountsAtAdmission: a label set's examples count against the
// tokens limit before the work is done. Only the text counted, so one
// request carried a million tokens of examples past the limit.
func TestLabelSetCountsAtAdmission(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: `
  engine: lexical
  public_limits: {requests_per_minute: 100, tokens_per_minute: 1000}`})
	example := strings.Repeat("refund payment invoice ", 200) // 4,600 bytes
	body := `{"text": "refund", "labels": ["billing", "bug"], "examples": {"billing": ["` + example + `"], "bug": ["crash"]}}`
	e := h.do(request{path: "/v1/classify", body: body}).apiError(t, 429, "rate_limit_exceeded")
	if !strings.Contains(e["message"].(string), "more than the 1000 tokens per minute") {
		t.Errorf("message %q", e["message"])
	}
	h.do(request{path: "/v1/classify", body: classifyBody}).ok(t)
}

// TestKeyLimits: a key's own rpm and tpm replace plugins.key_limits.
func TestKeyLimits(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	key := h.newKey("acme", accounts.KeyRequest{Name: "slow", RPM: 2, TPM: 1000})
	for i, remaining := range []string{"1", "0"} {
		r := h.do(request{path: "/v1/score", body: `{"source": "x", "attribute": "spam"}`, key: key})
		r.ok(t)
		wantRateHeaders(t, r, "requests", "2", remaining)
		if r.header.Get("x-ratelimit-limit-tokens") != "1000" {
			t.Errorf("call %d: x-ratelimit-limit-tokens %q, want the key's 1000", i, r.header.Get("x-ratelimit-limit-tokens"))
		}
	}
	r := h.do(request{path: "/v1/match", body: `{"source": "x", "query": "y"}`, key: key})
	e := r.apiError(t, 429, "rate_limit_exceeded")
	if !strings.Contains(e["message"].(string), "this API key may make 2 per minute") {
		t.Errorf("message %q", e["message"])
	}
	wantRetryAfter(t, r, 0, 30)
	// Another key of the same account has its own budget.
	h.keyed("/v1/match", `{"source": "x", "query": "y"}`).ok(t)
	if n := len(h.events(3)); n != 3 {
		t.Errorf("%d events, want 3 (the refused call is not metered)", n)
	}
}

// TestConcurrencyLimit: a caller with a request in flight is refused a
// second until the first ends.
func TestConcurrencyLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{
		upstream: proxytest.Options{FirstByteDelay: 700 * time.Millisecond},
		plugins: `
  engine: llm
  public_limits: {requests_per_minute: 100, concurrent: 1}`,
	})
	var wg sync.WaitGroup
	var slow reply
	wg.Add(1)
	go func() {
		defer wg.Done()
		slow = h.do(request{path: "/v1/classify", body: classifyBody})
	}()
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if h.up.Active() == 0 {
			return fmt.Errorf("the slow request has not reached the upstream")
		}
		return nil
	})
	r := h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"], "model": "lexical"}`})
	e := r.apiError(t, 429, "rate_limit_exceeded")
	if !strings.Contains(e["message"].(string), "may have 1 in flight") || r.header.Get("Retry-After") != "1" {
		t.Errorf("429 %v, Retry-After %q", e, r.header.Get("Retry-After"))
	}
	wg.Wait()
	if m := slow.ok(t); m["engine"] != "llm" {
		t.Errorf("slow request answered by %v", m["engine"])
	}
	h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"], "model": "lexical"}`}).ok(t)
}

// TestTagSetIsBounded: /v1/tag counted its tags but not their size, so
// 200 tags of 16 KB (3.2 MB) took 5.8 s of CPU and 1.5M tokens of a key's
// minute. Tags are held to what classify's labels are: each to
// plugins.max_text_bytes, all together to what a batch job keeps.
func TestTagSetIsBounded(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: lexical\n  max_text_bytes: 64KiB"})
	tags := make([]string, 5)
	for i := range tags {
		tags[i] = fmt.Sprintf("%q", strings.Repeat(string(rune('a'+i)), 60_000))
	}
	e := h.keyed("/v1/tag", `{"text": "x", "tags": [`+strings.Join(tags, ",")+`]}`).apiError(t, 400, "invalid_request_error")
	if e["param"] != "tags" || !strings.Contains(e["message"].(string), "tags take 300000 bytes; at most 262144 are accepted") {
		t.Errorf("5 tags of 60 KB: %v", e)
	}
	long := strings.Repeat("t", 64<<10+1)
	for path, body := range map[string]string{
		"/v1/tag":      `{"text": "x", "tags": ["a", "` + long + `"]}`,
		"/v1/classify": `{"text": "x", "labels": ["a", "` + long + `"]}`,
	} {
		e := h.keyed(path, body).apiError(t, 400, "invalid_request_error")
		field := map[string]string{"/v1/tag": "tags", "/v1/classify": "labels"}[path]
		if e["param"] != field+"[1]" || !strings.Contains(e["message"].(string), field+"[1] is 65537 bytes, longer than plugins.max_text_bytes") {
			t.Errorf("%s with a label of 64 KiB + 1: %v", path, e)
		}
	}
	if n := len(h.rec.Events()); n != 0 {
		t.Errorf("%d events recorded for refused requests", n)
	}
}

// TestAccountLimits: an account's own limits hold for the plugin calls of
// all its keys together, beside each key's (plugins.key_limits here), and
// its max_concurrent counts plugin and generation calls alike.
func TestAccountLimits(t *testing.T) {
	h := newHarness(t, harnessOptions{
		upstream: proxytest.Options{FirstByteDelay: 700 * time.Millisecond},
		plugins: `
  engine: llm`,
	})
	if _, err := h.svc.SetLimits(h.ctx, "acme", func(l *accounts.Limits) { *l = accounts.Limits{RPM: 2, MaxConcurrent: 1} }); err != nil {
		t.Fatal(err)
	}
	other := h.newKey("acme", accounts.KeyRequest{Name: "second"})
	var wg sync.WaitGroup
	var slow reply
	wg.Go(func() { slow = h.keyed("/v1/classify", classifyBody) })
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if h.up.Active() == 0 {
			return fmt.Errorf("the slow request has not reached the upstream")
		}
		return nil
	})
	for path, body := range map[string]string{
		"/v1/classify":         `{"text": "x", "labels": ["a", "b"], "model": "lexical"}`,
		"/v1/chat/completions": `{"model": "small", "messages": [{"role": "user", "content": "hi"}]}`,
	} {
		r := h.do(request{path: path, body: body, key: other})
		e := r.apiError(t, 429, "rate_limit_exceeded")
		if !strings.Contains(e["message"].(string), "account acme (all its keys together) may have 1 in flight") || r.header.Get("Retry-After") != "1" {
			t.Errorf("%s: 429 %v, Retry-After %q", path, e, r.header.Get("Retry-After"))
		}
	}
	wg.Wait()
	slow.ok(t)
	r := h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"], "model": "lexical"}`, key: other})
	r.ok(t)
	wantRateHeaders(t, r, "requests", "2", "0")
	r = h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "lexical"}`)
	e := r.apiError(t, 429, "rate_limit_exceeded")
	if !strings.Contains(e["message"].(string), "account acme (all its keys together) may make 2 per minute") {
		t.Errorf("message %q", e["message"])
	}
	wantRetryAfter(t, r, 0, 30)
}
