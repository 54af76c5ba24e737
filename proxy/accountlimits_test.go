package proxy_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// setLimits sets account's limits and waits until the gateway has them.
func (h *harness) setLimits(account string, limits accounts.Limits) {
	h.t.Helper()
	if _, err := h.svc.SetLimits(h.t.Context(), account, func(l *accounts.Limits) { *l = limits }); err != nil {
		h.t.Fatal(err)
	}
	if err := h.svc.WaitSynced(h.t.Context()); err != nil {
		h.t.Fatal(err)
	}
}

// An account holder got around the operator's per-key rpm by making more
// keys (the console makes keys without limits): an account's own rpm and
// tpm hold for all its keys together, beside each key's own.
func TestAccountLimitsHoldAcrossItsKeys(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{PromptTokens: 10, CompletionTokens: 20}})
	h.setLimits("acme", accounts.Limits{RPM: 3})
	other := h.g.CreateKey("acme", accounts.KeyRequest{Name: "second"})
	limited := h.g.CreateKey("acme", accounts.KeyRequest{Name: "own rpm", RPM: 10})
	for i, key := range []string{h.key, other, limited} {
		resp := h.post("/v1/chat/completions", chatBody, key)
		if readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("call %d: %d", i, resp.StatusCode)
		}
		// The headers tell of the limit with the least left: the
		// account's 3, not the third key's own 10.
		if got, want := resp.Header.Get("x-ratelimit-remaining-requests"), []string{"2", "1", "0"}[i]; got != want || resp.Header.Get("x-ratelimit-limit-requests") != "3" {
			t.Errorf("call %d: x-ratelimit-limit-requests %q, remaining %q, want 3 and %s", i, resp.Header.Get("x-ratelimit-limit-requests"), got, want)
		}
	}
	for _, key := range []string{other, limited} {
		resp := h.post("/v1/chat/completions", chatBody, key)
		e := wantError(t, resp, 429, "rate_limit_exceeded")
		if msg := e["message"].(string); !strings.Contains(msg, "account acme (all its keys together) may make 3 per minute") {
			t.Errorf("message %q", msg)
		}
		if resp.Header.Get("Retry-After") == "" || resp.Header.Get("x-ratelimit-limit-requests") != "3" || resp.Header.Get("x-ratelimit-remaining-requests") != "0" {
			t.Errorf("429 headers %v", resp.Header)
		}
	}
	// A refusal by the account takes nothing from the key's own limit: of
	// its 10 a minute, the one admitted call is gone.
	h.setLimits("acme", accounts.Limits{TPM: 45})
	resp := h.post("/v1/chat/completions", chatBody, limited)
	if readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-remaining-requests") != "8" {
		t.Fatalf("after the account's rpm was lifted: %d, remaining requests %q, want 200 and 8", resp.StatusCode, resp.Header.Get("x-ratelimit-remaining-requests"))
	}
	// The tokens count across keys too: 30 a call, settled from the
	// estimate, against 45 a minute.
	resp = h.post("/v1/chat/completions", chatBody, other)
	e := wantError(t, resp, 429, "rate_limit_exceeded")
	if msg := e["message"].(string); !strings.Contains(msg, "account acme (all its keys together) may use 45 tokens per minute") {
		t.Errorf("message %q", msg)
	}
	// Lifted (0), the account is unlimited again, as before limits.
	h.setLimits("acme", accounts.Limits{})
	for range 5 {
		resp := h.post("/v1/chat/completions", chatBody, other)
		if readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-limit-requests") != "" {
			t.Fatalf("unlimited again: %d %v", resp.StatusCode, resp.Header)
		}
	}
}

// A balance of 0.00001 USD with no grace was overspent 3,100 times over by
// 100 streams started together: the balance is checked when a call
// starts. max_concurrent admits that many at once, so the overspend is
// at most max_concurrent calls.
func TestAccountMaxConcurrentBoundsOverspend(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{FirstByteDelay: 300 * time.Millisecond, PromptTokens: 100, CompletionTokens: 100}})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), `grace_usd: "0.50"`, `grace_usd: "0"`, 1))
	h.g.CreateAccount("tiny", 10_000) // 0.00001 USD
	h.setLimits("tiny", accounts.Limits{MaxConcurrent: 2})
	key := h.g.CreateKey("tiny", accounts.KeyRequest{Name: "k"})
	var wg sync.WaitGroup
	var served, refused atomic.Int32
	var message atomic.Value
	for i := range 20 {
		body := chatBody
		if i%2 == 0 {
			body = strings.Replace(chatBody, `{`, `{"stream":true,`, 1)
		}
		wg.Go(func() {
			resp := h.post("/v1/chat/completions", body, key)
			b := readAll(t, resp)
			switch resp.StatusCode {
			case 200:
				served.Add(1)
			case 429:
				refused.Add(1)
				if resp.Header.Get("Retry-After") != "1" {
					t.Errorf("Retry-After %q on the concurrency 429", resp.Header.Get("Retry-After"))
				}
				message.Store(string(b))
			default:
				t.Errorf("%d %s", resp.StatusCode, b)
			}
		})
	}
	wg.Wait()
	if served.Load() != 2 || refused.Load() != 18 {
		t.Fatalf("%d served and %d refused of 20 calls started together on max_concurrent 2; want 2 and 18", served.Load(), refused.Load())
	}
	if msg, _ := message.Load().(string); !strings.Contains(msg, "account tiny (all its keys together) may have 2 in flight") {
		t.Errorf("429 %s", msg)
	}
	// Each call costs 100 × 0.0000001 + 100 × 0.0000003 = 0.00004 USD.
	perCall := money.Nanos(40_000)
	bal, _ := h.svc.Balance("tiny")
	if bal >= 0 || bal < 10_000-2*perCall {
		t.Errorf("balance %s USD, want below 0 and at least %s (credit less 2 calls)", bal, 10_000-2*perCall)
	}
	// The slots are free again, and the balance refuses the next call.
	wantError(t, h.post("/v1/chat/completions", chatBody, key), 402, "INSUFFICIENT_BALANCE")
}

// Behind two gateways an account overspent by about its whole balance per
// extra gateway: each counted its own calls not yet debited, and the
// other's reached it only as debits, a second or more later and never
// while the billing consumer was down (0.03 USD of credit went to -0.03).
// No consumer runs here, so no debit lands: only the calls each gateway
// tells the other of stop the account.
func TestTwoGatewaysTogetherSpendTheBalanceOnce(t *testing.T) {
	upstream := proxytest.Options{FirstByteDelay: 9 * time.Millisecond, PromptTokens: 100, CompletionTokens: 100}
	first := newHarness(t, harnessOptions{upstream: upstream})
	second := newHarness(t, harnessOptions{upstream: upstream, join: first})
	for _, h := range []*harness{first, second} {
		h.writeConfig(strings.Replace(readFile(t, h.cfgPath), `grace_usd: "0.50"`, `grace_usd: "0"`, 1))
	}
	// A call costs 100 × 0.0000001 + 100 × 0.0000003 = 0.00004 USD: the
	// credit pays 10, the 10th leaves the balance below 0.
	const perCall, paid = money.Nanos(40_000), 10
	first.g.CreateAccount("pair", paid*perCall-perCall/4)
	first.setLimits("pair", accounts.Limits{MaxConcurrent: 1})
	key := first.g.CreateKey("pair", accounts.KeyRequest{Name: "k"})
	if err := second.svc.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}

	var served [2]atomic.Int32
	var wg sync.WaitGroup
	deadline := time.Now().Add(20 * time.Second)
	for i, h := range []*harness{first, second} {
		for range 4 {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					resp := h.post("/v1/chat/completions", chatBody, key)
					b := readAll(t, resp)
					switch resp.StatusCode {
					case 200:
						served[i].Add(1)
					case 429: // the account's one slot on this gateway is taken
					case 402:
						return
					default:
						t.Errorf("%d %s", resp.StatusCode, b)
						return
					}
				}
				t.Error("still admitted after 20 s")
			})
		}
	}
	wg.Wait()
	// Beyond what the credit pays, each gateway may start one call
	// (max_concurrent) while the other's last one is in flight, and one
	// more in the milliseconds the other's charge takes to reach it.
	total := served[0].Load() + served[1].Load()
	if total > paid+4 {
		t.Errorf("%d and %d calls served, %d in all, on a credit that pays %d; want at most %d", served[0].Load(), served[1].Load(), total, paid, paid+4)
	}
	t.Logf("%d and %d calls served", served[0].Load(), served[1].Load())
}

// patchAccount sets account's limits through the admin API, as an
// operator does.
func (h *harness) patchAccount(account, body string) {
	h.t.Helper()
	req, _ := http.NewRequest("PATCH", h.url+"/admin/v1/accounts/"+account, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+gatewaytest.DefaultAdminToken)
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	if b := readAll(h.t, resp); resp.StatusCode != 200 {
		h.t.Fatalf("PATCH /admin/v1/accounts/%s: %d %s", account, resp.StatusCode, b)
	}
}

// startStreams starts n streams with key and returns once the upstream
// has them all; wait waits for their ends.
func (h *harness) startStreams(n int, key string) (wait func()) {
	h.t.Helper()
	before := h.up.Active()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp := h.post("/v1/chat/completions", strings.Replace(chatBody, `{`, `{"stream":true,`, 1), key)
			if b := readAll(h.t, resp); resp.StatusCode != 200 {
				h.t.Errorf("stream: %d %s", resp.StatusCode, b)
			}
		})
	}
	testutil.CheckFor(h.t, 5*time.Second, 10*time.Millisecond, func() error {
		if got := h.up.Active() - before; got < n {
			return fmt.Errorf("%d of %d streams at the upstream", got, n)
		}
		return nil
	})
	return wg.Wait
}

// A max_concurrent set on an account without limits ignored the calls
// already running, which were counted only while it had limits: with 3
// streams open, max_concurrent 2 admitted more, 5 at once. Every call is
// counted now, so the limit sees them at once.
func TestAccountMaxConcurrentSetLaterCountsCallsInFlight(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 5, ChunkDelay: 300 * time.Millisecond}})
	wait := h.startStreams(3, h.key)
	h.patchAccount("acme", `{"max_concurrent":2}`)
	e := wantError(t, h.post("/v1/chat/completions", chatBody), 429, "rate_limit_exceeded")
	if msg := e["message"].(string); !strings.Contains(msg, "account acme (all its keys together) may have 2 in flight") {
		t.Errorf("message %q", msg)
	}
	wait()
	// Their ends gave their slots back: two fit again, not a third.
	wait = h.startStreams(2, h.key)
	wantError(t, h.post("/v1/chat/completions", chatBody), 429, "rate_limit_exceeded")
	wait()
	if resp := h.post("/v1/chat/completions", chatBody); resp.StatusCode != 200 {
		t.Fatalf("after the streams ended: %d %s", resp.StatusCode, readAll(t, resp))
	}
}

// A tpm set on an account while its calls ran did not count their usage:
// they were admitted with nothing to charge it to.
func TestAccountTPMSetLaterCountsCallsInFlight(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 3, ChunkDelay: 300 * time.Millisecond, PromptTokens: 100, CompletionTokens: 100}})
	wait := h.startStreams(3, h.key)
	h.patchAccount("acme", `{"tpm":500}`)
	wait()
	// 600 tokens used on a tpm of 500: the next call waits.
	e := wantError(t, h.post("/v1/chat/completions", chatBody), 429, "rate_limit_exceeded")
	if msg := e["message"].(string); !strings.Contains(msg, "account acme (all its keys together) may use 500 tokens per minute") {
		t.Errorf("message %q", msg)
	}
}

// A tpm 429 whose wait is over a minute had no x-should-retry: false,
// which the batch's 429 has: the OpenAI SDKs do not wait so long, and
// retried at once, twice, into the same 429. Every limit's 429 carries it
// when its wait is over a minute, the key's and the account's.
func TestLimitWaitOverAMinuteTellsTheSDKsNotToRetry(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{PromptTokens: 140, CompletionTokens: 10}})
	keyLimited := h.g.CreateKey("acme", accounts.KeyRequest{Name: "tpm", TPM: 50})
	h.g.CreateAccount("limited", money.NanosPerUSD)
	h.setLimits("limited", accounts.Limits{TPM: 50})
	accountLimited := h.g.CreateKey("limited", accounts.KeyRequest{Name: "k"})
	for _, key := range []string{keyLimited, accountLimited} {
		// 150 tokens on 50 a minute: the next call waits 2 minutes and
		// more (its own estimate).
		if resp := h.post("/v1/chat/completions", chatBody, key); resp.StatusCode != 200 {
			t.Fatalf("first call: %d %s", resp.StatusCode, readAll(t, resp))
		}
		resp := h.post("/v1/chat/completions", chatBody, key)
		wantError(t, resp, 429, "rate_limit_exceeded")
		if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra <= 60 || resp.Header.Get("x-should-retry") != "false" {
			t.Errorf("Retry-After %q, x-should-retry %q; want over 60 and false", resp.Header.Get("Retry-After"), resp.Header.Get("x-should-retry"))
		}
	}
}

// The 402 printed the grace as negative ("below the grace buffer of
// -0.001000000 USD" with grace_usd "0.001"); it says it as the console
// does, an allowance past zero.
func TestInsufficientBalanceSaysTheGraceAsAnAllowance(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), `grace_usd: "0.50"`, `grace_usd: "0.001"`, 1))
	h.g.CreateAccount("race", 0)
	if _, err := h.svc.Debit(t.Context(), "race", 2_220_000); err != nil {
		t.Fatal(err)
	}
	if err := h.svc.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	key := h.g.CreateKey("race", accounts.KeyRequest{Name: "k"})
	e := wantError(t, h.post("/v1/chat/completions", chatBody, key), 402, "INSUFFICIENT_BALANCE")
	if want := "account race has a balance of -0.002220000 USD, past the grace allowance of 0.001000000 USD; a top-up resumes service at once"; e["message"] != want {
		t.Errorf("message %q, want %q", e["message"], want)
	}
}
