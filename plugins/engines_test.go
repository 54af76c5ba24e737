package plugins_test

import (
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// TestEngineSelection: "model" picks the engine per request; without it
// plugins.engine decides, and auto follows the upstream's health.
func TestEngineSelection(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: `
  engine: auto
  llm_model: small
  pricing: {score: "0.000001"}`})

	// auto, upstream up: llm with plugins.llm_model.
	r := h.keyed("/v1/score", `{"source": "Server is down!", "attribute": "urgency"}`)
	m := r.ok(t)
	if m["engine"] != "llm" || m["model"] != "small" {
		t.Fatalf("auto with the upstream up: %v", m)
	}
	total := checkUsage(t, m)
	if h.up.ChatCalls() != 1 {
		t.Errorf("%d chat calls upstream, want 1", h.up.ChatCalls())
	}
	ev := h.events(1)[0]
	var cost money.Atto
	cost.Add(total, money.Price(1_000_000_000_000)) // 0.000001 USD per token
	if ev.Model != "small" || ev.Upstream != "local" || ev.UsageSource != meter.SourceUpstream ||
		ev.PromptTokens+ev.CompletionTokens != total || ev.CostNanos != cost.Nanos() || ev.Endpoint != "/v1/score" {
		t.Errorf("llm event %+v, want model small, upstream local, %d tokens, cost %s", ev, total, cost.Nanos())
	}

	// model names the engine, or a catalog model for llm.
	m = h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "lexical"}`).ok(t)
	if m["engine"] != "lexical" || m["model"] != nil {
		t.Errorf("model lexical: %v", m)
	}
	m = h.keyed("/v1/match", `{"source": "x", "query": "y", "model": "large"}`).ok(t)
	if m["engine"] != "llm" || m["model"] != "large" {
		t.Errorf("model large: %v", m)
	}
	m = h.keyed("/v1/tag", `{"text": "x y z", "model": "llm"}`).ok(t)
	if m["engine"] != "llm" || m["model"] != "small" {
		t.Errorf("model llm: %v", m)
	}
	if h.up.ChatCalls() != 3 {
		t.Errorf("%d chat calls upstream, want 3", h.up.ChatCalls())
	}

	// The upstream goes away: an llm call fails, auto falls back to
	// lexical and says so; the next call goes lexical at once, saying why
	// the model was not asked.
	h.up.Close()
	m = h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"]}`).ok(t)
	if m["engine"] != "lexical" || !strings.Contains(fmt.Sprint(m["fallback"]), "llm model small failed (upstream local is unavailable)") {
		t.Errorf("auto with the upstream gone: %v", m)
	}
	m = h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"]}`).ok(t)
	if m["engine"] != "lexical" || !strings.Contains(fmt.Sprint(m["fallback"]), "llm model small not asked: a call to it failed at ") {
		t.Errorf("auto after a failed call: %v", m)
	}
	// Asked for by name, the llm is not replaced: 503.
	e := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "small"}`).apiError(t, 503, "upstream_unavailable")
	if msg := e["message"].(string); !strings.Contains(msg, `send "model": "lexical"`) || strings.Contains(msg, "127.0.0.1") {
		t.Errorf("503 message %q: want advice, and no internal address", msg)
	}
}

// TestAutoWithUpstreamDown: when the upstream fails its health probe, auto
// answers with lexical without trying the model, and says so (it said
// nothing, and was taken for the llm's answer).
func TestAutoWithUpstreamDown(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Status: 503}, plugins: "  engine: auto"})
	m := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"]}`).ok(t)
	if m["engine"] != "lexical" || !strings.Contains(fmt.Sprint(m["fallback"]), "llm model small not asked: its upstream failed its probe (GET /models) at ") {
		t.Errorf("auto with the upstream down: %v", m)
	}
	if n := h.up.ChatCalls(); n != 0 {
		t.Errorf("%d chat calls to a down upstream", n)
	}
	if len(h.up.Requests()) != 1 {
		t.Errorf("upstream requests %v, want one GET /models", h.up.Requests())
	}
	// Until a probe (due a second after the last while it is down) finds
	// it back, explicit llm requests are refused, without asking the model.
	h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "llm"}`).apiError(t, 503, "upstream_unavailable")
	if n := h.up.ChatCalls(); n != 0 {
		t.Errorf("%d chat calls to a down upstream", n)
	}
}

// A base_url with a query (Azure's ?api-version=) was probed at
// GET /v1?api-version=1/models, which no upstream serves, so auto took
// the upstream for down and answered offline.
func TestAutoProbesABaseURLWithAQuery(t *testing.T) {
	h := newHarness(t, harnessOptions{baseURLQuery: "?api-version=1", plugins: "  engine: auto\n  llm_model: small"})
	m := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"]}`).ok(t)
	if m["engine"] != "llm" {
		t.Errorf("auto with the upstream up: %v", m)
	}
	for _, r := range h.up.Requests() {
		if r.RawQuery != "api-version=1" || r.Path != "/v1/models" && r.Path != "/v1/chat/completions" {
			t.Errorf("the upstream got %s %s?%s", r.Method, r.Path, r.RawQuery)
		}
	}
}

// The 400 for a model that does not exist lists the valid models in one
// order on every endpoint, GET /v1/models's (the config's): chat and
// responses sorted them, the plugin and batch endpoints did not, so the
// same catalog read "large, small" on one and "small, large" on another.
func TestUnknownModelListsTheModelsInCatalogOrderEverywhere(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	resp, err := h.client.Get(h.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, id := range gjson.GetBytes(body, "data.#.id").Array() {
		ids = append(ids, id.Str)
	}
	listed := strings.Join(ids, ", ")
	if listed != "small, large" {
		t.Fatalf("GET /v1/models lists %q, want the config's order", listed)
	}
	for path, body := range map[string]string{
		"/v1/chat/completions": `{"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}`,
		"/v1/classify":         `{"text": "x", "labels": ["a", "b"], "model": "gpt-5"}`,
	} {
		e := h.keyed(path, body).apiError(t, 400, "invalid_request_error")
		if msg, _ := e["message"].(string); !strings.HasSuffix(msg, ": "+listed) {
			t.Errorf("%s: %q, want the models listed as GET /v1/models lists them: %s", path, msg, listed)
		}
	}
}

// TestKeyModelAllowList: a key limited to some models cannot name others,
// and auto skips an llm model the key may not use.
func TestKeyModelAllowList(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: auto\n  llm_model: small"})
	key := h.newKey("acme", accounts.KeyRequest{Name: "limited", Models: []string{"large"}})
	m := h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"]}`, key: key}).ok(t)
	if m["engine"] != "lexical" {
		t.Errorf("auto with llm_model outside the key's models: %v", m)
	}
	denied := h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"], "model": "small"}`, key: key}).apiError(t, 403, "permission_denied")
	if msg, _ := denied["message"].(string); !strings.Contains(msg, `"lexical"`) {
		t.Errorf("the 403 should name the offline engine there is (no vectors here) as the way out: %q", msg)
	}
	if denied["param"] != "model" {
		t.Errorf("the 403's param %v, want model, the field to change", denied["param"])
	}
	unknown := h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"], "model": "gpt-5"}`, key: key}).apiError(t, 400, "invalid_request_error")
	if msg, _ := unknown["message"].(string); !strings.HasSuffix(msg, "a catalog model: large") {
		t.Errorf("the 400 should list only the key's models: %q", msg)
	}
	m = h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"], "model": "large"}`, key: key}).ok(t)
	if m["engine"] != "llm" || m["model"] != "large" {
		t.Errorf("allowed model: %v", m)
	}
}

// TestSavedClassifierReload: a classifier added to gateway.yaml is usable
// within 2 s, without a restart; one removed is gone as fast.
func TestSavedClassifierReload(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	body := `{"text": "WIN A FREE PRIZE NOW", "classifier": "spam-check"}`
	e := h.keyed("/v1/classify", body).apiError(t, 400, "invalid_request_error")
	if !strings.Contains(e["message"].(string), "saved classifiers: support-intent") {
		t.Errorf("message %q", e["message"])
	}
	opts := h.opts
	opts.classifiers = `
  spam-check:
    labels: [spam, ham]
    mode: multi
    threshold: 0.2
`
	h.writeConfig(opts)
	start := time.Now()
	var m map[string]any
	checkFor(t, 2*time.Second, 20*time.Millisecond, func() error {
		r := h.keyed("/v1/classify", body)
		if r.status != 200 {
			return fmt.Errorf("%s", r)
		}
		m = r.ok(t)
		return nil
	})
	t.Logf("new classifier served %s after the write", time.Since(start).Round(time.Millisecond))
	if m["classifier"] != "spam-check" || m["mode"] != "multi" || m["threshold"] != 0.2 {
		t.Errorf("answer %v", m)
	}
	checkScores(t, m["scores"], "scores", 2)
	h.keyed("/v1/classify", `{"text": "x", "classifier": "support-intent"}`).apiError(t, 400, "invalid_request_error")
}

// A model that refuses logprobs (OpenAI's reasoning models answer 400)
// costs one refused call, not one before every request: the module
// remembers the refusal until the next reload, and asks without them.
func TestLLMRefusingLogprobsIsAskedWithoutThemFromThenOn(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{RefuseLogprobs: true}, plugins: "  engine: llm\n  llm_model: small"})
	body := `{"text": "Where is my parcel? The delivery is late.", "labels": ["billing", "shipping"]}`
	for i := range 3 {
		if m := h.keyed("/v1/classify", body).ok(t); m["engine"] != "llm" || m["no_logprobs"] != true {
			t.Fatalf("classify %d: %v", i, m)
		}
	}
	count := func() (calls, withLogprobs int) {
		for _, r := range h.up.Requests() {
			if r.Path != "/v1/chat/completions" {
				continue
			}
			calls++
			if gjson.GetBytes(r.Body, "logprobs").Bool() {
				withLogprobs++
			}
		}
		return calls, withLogprobs
	}
	if calls, withLogprobs := count(); calls != 4 || withLogprobs != 1 {
		t.Fatalf("3 classify calls made %d model calls, %d asking for logprobs; want 4 and 1", calls, withLogprobs)
	}
	// A reload forgets the refusal (the model behind the id may have
	// changed): the next call asks for logprobs again.
	h.writeConfig(harnessOptions{plugins: "  engine: llm\n  llm_model: small\n  # reloaded", classifiers: defaultClassifiers})
	checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if m := h.keyed("/v1/classify", body).ok(t); m["engine"] != "llm" {
			return fmt.Errorf("after the reload: %v", m)
		}
		if _, withLogprobs := count(); withLogprobs < 2 {
			return fmt.Errorf("no call asked for logprobs again after the reload")
		}
		return nil
	})
}

// TestWrongLLMAnswersAreBilled: a model that answers something else than
// asked, twice, was paid for upstream. Asked by name the call is a 502
// billed those tokens; with auto the offline engine answers and the
// call's usage, and its bill, include them. Both went unbilled.
//
// The 502 says x-should-retry: false and does not advise to retry: the
// OpenAI SDKs retried it twice, so one SDK call was three billed 502s,
// each for the same answer at temperature 0.
func TestWrongLLMAnswersAreBilled(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{BadAnswerTimes: 1 << 30}, plugins: `
  engine: auto
  llm_model: small
  pricing: {classify: "0.000001"}`})

	resp := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "llm"}`)
	e := resp.apiError(t, 502, "upstream_error")
	if resp.header.Get("x-should-retry") != "false" || strings.Contains(e["message"].(string), "retry") {
		t.Errorf("billed 502: x-should-retry %q, message %q: want false, and no advice to retry", resp.header.Get("x-should-retry"), e["message"])
	}
	if n := h.up.ChatCalls(); n != 2 {
		t.Fatalf("%d chat calls, want the question and its reminder", n)
	}
	ev := h.events(1)[0]
	if ev.Model != "small" || ev.Upstream != "local" || ev.Status != 502 || ev.PromptTokens <= 0 || ev.CompletionTokens <= 0 || ev.CostNanos <= 0 {
		t.Fatalf("event of the 502 %+v: want the two calls' tokens billed to small", ev)
	}
	llmTokens := ev.PromptTokens + ev.CompletionTokens

	m := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"]}`).ok(t)
	if m["engine"] != "lexical" || !strings.Contains(fmt.Sprint(m["fallback"]), "not the answer asked") {
		t.Fatalf("auto after two wrong answers: %v", m)
	}
	total := checkUsage(t, m)
	evs := h.events(2)
	if ev := evs[1]; ev.PromptTokens+ev.CompletionTokens != total || total <= llmTokens {
		t.Errorf("fallback event %+v and usage %d: want the llm's %d tokens and lexical's", ev, total, llmTokens)
	}
}

// An llm engine's upstream that reports usage out of range, or none, is
// billed on the tokenizer's count of the prompt and answer, marked
// estimated, as a client's chat call is: a reported 4e18 prompt tokens
// cost 8 USD a classify (clamped to 100 million), a missing report
// nothing.
func TestLLMUsageNotReportedIsEstimated(t *testing.T) {
	for name, up := range map[string]proxytest.Options{
		"out of range": {PromptTokens: 4_000_000_000_000_000_000},
		"missing":      {OmitUsage: true},
		"no counts":    {RawUsage: `{"total_tokens":9}`},
	} {
		h := newHarness(t, harnessOptions{upstream: up, plugins: "  engine: llm\n  llm_model: small"})
		m := h.keyed("/v1/classify", `{"text": "I was charged twice this month", "labels": ["billing", "bug"]}`).ok(t)
		total := checkUsage(t, m)
		ev := h.events(1)[0]
		if ev.UsageSource != meter.SourceEstimated || ev.PromptTokens < 20 || ev.PromptTokens > 2000 || ev.CompletionTokens < 1 ||
			ev.PromptTokens+ev.CompletionTokens != total {
			t.Errorf("%s usage: answer's usage %d tokens, event %+v", name, total, ev)
		}
	}
}

// An llm engine's tokens cost at least what the model's own prices say:
// at a plugin price below them, a key allowed the model classified
// through it for a fraction of what a chat call pays for the same tokens.
func TestLLMEngineBillsAtLeastTheModelsPrices(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: `
  engine: llm
  llm_model: small
  pricing: {classify: "0.00000001"}`})
	m := h.keyed("/v1/classify", `{"text": "The export button crashes", "labels": ["billing", "bug"]}`).ok(t)
	if m["engine"] != "llm" {
		t.Fatalf("%v", m)
	}
	ev := h.events(1)[0]
	var model money.Atto // small: 0.0000001 a prompt token, 0.0000003 a completion token
	model.Add(ev.PromptTokens, money.Price(100_000_000_000))
	model.Add(ev.CompletionTokens, money.Price(300_000_000_000))
	if ev.CostNanos != model.Nanos() {
		t.Fatalf("cost %s for %d+%d tokens, want the model's %s", ev.CostNanos, ev.PromptTokens, ev.CompletionTokens, model.Nanos())
	}
}

// TestLLMCachedAndReasoningTokensAreBilledAsChatBillsThem: the llm
// engine dropped the upstream's cached and reasoning tokens, so a
// classify whose upstream reported 3 of its 10 prompt tokens cached was
// recorded with none and billed them at the prompt price, not at the
// model's input_cache_read. Reported above the counts they are part of,
// they are cut to them, as a chat call's are. The answer's usage showed
// none of them; it now shows them as a chat completion does, when not 0.
func TestLLMCachedAndReasoningTokensAreBilledAsChatBillsThem(t *testing.T) {
	for _, tc := range []struct {
		name                                                string
		up                                                  proxytest.Options
		wantPrompt, wantCached, wantCompletion, wantReasons int64
	}{
		{"reported", proxytest.Options{PromptTokens: 10, CompletionTokens: 20, CachedTokens: 3, ReasoningTokens: 5}, 10, 3, 20, 5},
		{"parts above their counts", proxytest.Options{PromptTokens: 10, CompletionTokens: 20, CachedTokens: 30, ReasoningTokens: 50}, 10, 10, 20, 20},
		{"none", proxytest.Options{PromptTokens: 10, CompletionTokens: 20}, 10, 0, 20, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{upstream: tc.up, plugins: `
  engine: llm
  llm_model: small
  pricing: {classify: "0.00000001"}`})
			m := h.keyed("/v1/classify", `{"text": "I was charged twice this month", "labels": ["billing", "bug"]}`).ok(t)
			if m["engine"] != "llm" {
				t.Fatalf("%v", m)
			}
			checkUsage(t, m)
			want := map[string]any{"prompt_tokens": float64(tc.wantPrompt), "completion_tokens": float64(tc.wantCompletion),
				"total_tokens": float64(tc.wantPrompt + tc.wantCompletion)}
			if tc.wantCached > 0 {
				want["prompt_tokens_details"] = map[string]any{"cached_tokens": float64(tc.wantCached)}
			}
			if tc.wantReasons > 0 {
				want["completion_tokens_details"] = map[string]any{"reasoning_tokens": float64(tc.wantReasons)}
			}
			if !reflect.DeepEqual(m["usage"], want) {
				t.Errorf("usage %v, want %v: the cached and reasoning parts as a chat completion shows them, when not 0", m["usage"], want)
			}
			ev := h.events(1)[0]
			// small: 0.0000001 a prompt token, 0.00000005 a cached one,
			// 0.0000003 a completion token.
			var model money.Atto
			model.Add(tc.wantPrompt-tc.wantCached, money.Price(100_000_000_000))
			model.Add(tc.wantCached, money.Price(50_000_000_000))
			model.Add(tc.wantCompletion, money.Price(300_000_000_000))
			if ev.PromptTokens != tc.wantPrompt || ev.CachedTokens != tc.wantCached || ev.CompletionTokens != tc.wantCompletion ||
				ev.ReasoningTokens != tc.wantReasons || ev.CostNanos != model.Nanos() {
				t.Errorf("event %+v\nwant prompt %d (cached %d), completion %d (reasoning %d), cost %s",
					*ev, tc.wantPrompt, tc.wantCached, tc.wantCompletion, tc.wantReasons, model.Nanos())
			}
		})
	}
}

// TestFallbackBillsTheModelsTokensAtItsPrices: an auto llm call whose
// model answered off-format twice, answered then by the offline engine,
// billed the model's tokens at the plugin price, in a row saying
// "lexical", no upstream, usage from the tokenizer; the same tokens asked
// of "llm" were a 502 billed at the model's prices to the model and its
// upstream. The fallback's row now names the model and its upstream, and
// bills the model's part at least at the model's prices, the offline
// engine's part at the plugin price.
func TestFallbackBillsTheModelsTokensAtItsPrices(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{BadAnswerTimes: 1 << 30}, plugins: `
  engine: auto
  llm_model: small
  pricing: {classify: "0.00000001"}`})
	const body = `{"text": "The export button crashes", "labels": ["billing", "bug"]`
	h.keyed("/v1/classify", body+`, "model": "llm"}`).apiError(t, 502, "upstream_error")
	failed := h.events(1)[0]
	var model money.Atto // small: 0.0000001 a prompt token, 0.0000003 a completion token
	model.Add(failed.PromptTokens, money.Price(100_000_000_000))
	model.Add(failed.CompletionTokens, money.Price(300_000_000_000))
	if failed.CostNanos != model.Nanos() {
		t.Fatalf("the 502 cost %s, want the model's %s", failed.CostNanos, model.Nanos())
	}

	m := h.keyed("/v1/classify", body+`}`).ok(t)
	if m["engine"] != "lexical" || m["fallback"] == nil {
		t.Fatalf("auto after two wrong answers: %v", m)
	}
	total := checkUsage(t, m)
	own := total - failed.PromptTokens - failed.CompletionTokens
	if own <= 0 {
		t.Fatalf("usage %d tokens: want the model's %d+%d and lexical's", total, failed.PromptTokens, failed.CompletionTokens)
	}
	var offline money.Atto // the plugin price, 0.00000001 a token
	offline.Add(own, money.Price(10_000_000_000))
	ev := h.events(2)[1]
	if ev.Model != "small" || ev.Upstream != "local" || ev.UsageSource != meter.SourceUpstream || ev.Status != 200 ||
		ev.PromptTokens+ev.CompletionTokens != total || ev.CostNanos != model.Nanos()+offline.Nanos() {
		t.Errorf("fallback event %+v: want small at local, source upstream, %d tokens, cost %s (the model's part) + %s (lexical's)",
			ev, total, model.Nanos(), offline.Nanos())
	}
}

// TestExplicitLLMWithItsUpstreamDownCostsNoQuota: "model": "llm" while
// the probe found its upstream down was a 503 that still used up the
// caller's quota, the public one request a minute too, so following the
// 503's advice (send another model) got a 429 for a minute; and the
// advice named semantic on a gateway without its vectors. The call is now
// refused before admission, naming only the engines there are.
func TestExplicitLLMWithItsUpstreamDownCostsNoQuota(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Status: 503}, plugins: "  engine: auto\n  llm_model: small"})
	// An auto call finds the upstream down.
	if m := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"]}`).ok(t); m["engine"] != "lexical" {
		t.Fatalf("auto with the upstream down: %v", m)
	}
	down := h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"], "model": "llm"}`})
	e := down.apiError(t, 503, "upstream_unavailable")
	if e["param"] != "model" {
		t.Errorf("the 503's param %v, want model, the field to change", e["param"])
	}
	if down.header.Get("x-should-retry") != "" {
		t.Errorf("x-should-retry %q on a 503 that cost nothing: a retry may find the upstream back", down.header.Get("x-should-retry"))
	}
	msg := e["message"].(string)
	if !strings.Contains(msg, `send "model": "lexical"`) || strings.Contains(msg, "semantic") {
		t.Errorf("503 message %q: want lexical as the way out, and not semantic, which has no vectors here", msg)
	}
	if n := h.up.ChatCalls(); n != 0 {
		t.Errorf("%d chat calls to an upstream the probe found down", n)
	}
	m := h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"], "model": "lexical"}`}).ok(t)
	if m["engine"] != "lexical" {
		t.Errorf("following the advice: %v", m)
	}
	if n := len(h.events(1)); n != 1 {
		t.Errorf("%d events, want the keyed call's", n)
	}
}

// TestNamedModelNoUpstreamTookCostsNoQuota: a classify call naming a
// model whose only upstream refuses connections, admitted because no
// probe had found it down yet (the first call, or the first after the
// last check went stale), was the gateway's own 503 and still used a
// request of the account's rpm 2. It costs nothing now, as the same 503
// refused before admission and a chat call no upstream took do not; a
// call an upstream took and failed still costs its request.
func TestNamedModelNoUpstreamTookCostsNoQuota(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/v1"
	ln.Close()
	h := newHarness(t, harnessOptions{deadModel: dead, upstream: proxytest.Options{Status: 500}})
	if _, err := h.svc.SetLimits(h.ctx, "acme", func(l *accounts.Limits) { *l = accounts.Limits{RPM: 2} }); err != nil {
		t.Fatal(err)
	}
	down := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "deadmodel"}`)
	down.apiError(t, 503, "upstream_unavailable")
	wantRateHeaders(t, down, "requests", "2", "2")
	failed := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "small"}`)
	failed.apiError(t, 502, "upstream_error")
	wantRateHeaders(t, failed, "requests", "2", "1")
	h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "lexical"}`).ok(t)
}

// A model served by a pool whose first member is down is not down: the
// others answered its chat calls, but named llm calls were refused for
// 30 s on the first member's probe alone, auto stayed offline, and the
// usage event named the first member whatever answered.
func TestLLMOnAPoolWhoseFirstMemberIsDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/v1"
	ln.Close()
	h := newHarness(t, harnessOptions{deadFirstMember: dead, plugins: "  engine: auto\n  llm_model: small"})
	for i := range 3 {
		m := h.keyed("/v1/classify", `{"text": "the export button crashes", "labels": ["bug", "billing"], "model": "llm"}`).ok(t)
		if m["engine"] != "llm" {
			t.Fatalf("named llm call %d with a member of the pool up: %v", i+1, m)
		}
	}
	if m := h.keyed("/v1/classify", `{"text": "the export button crashes", "labels": ["bug", "billing"]}`).ok(t); m["engine"] != "llm" {
		t.Fatalf("auto with a member of the pool up: %v", m)
	}
	for _, ev := range h.events(4) {
		if ev.Upstream != "local" {
			t.Errorf("event of model %s names upstream %q, want local, the member that answered", ev.Model, ev.Upstream)
		}
	}
}

// TestAutoAfterOneDroppedConnection: an upstream that dropped the
// connection of one call, and answered every call after it and its
// GET /models throughout, sent every auto call offline for 10 s (the
// probe interval), with no fallback saying why. A failed call now has
// the upstream probed again within a second, and until then the
// offline answers say the model was not asked, and why.
func TestAutoAfterOneDroppedConnection(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: auto\n  llm_model: small"})
	const body = `{"text": "the export button crashes", "labels": ["bug", "billing"]}`
	if m := h.keyed("/v1/classify", body).ok(t); m["engine"] != "llm" {
		t.Fatalf("auto with the upstream up: %v", m)
	}
	// A dropped connection is sent again once, on a new one (Upstream
	// pools): the call fails when both are dropped.
	opts := h.up.Options()
	opts.CutChatTimes = 2
	h.up.SetOptions(opts)
	m := h.keyed("/v1/classify", body).ok(t)
	if m["engine"] != "lexical" || !strings.Contains(fmt.Sprint(m["fallback"]), "upstream local is unavailable") {
		t.Fatalf("auto with its call dropped: %v", m)
	}
	m = h.keyed("/v1/classify", body).ok(t)
	if fb := fmt.Sprint(m["fallback"]); m["engine"] == "lexical" && !strings.Contains(fb, "llm model small not asked: a call to it failed at ") {
		t.Errorf("auto right after a failed call answered offline with fallback %q: want why the model was not asked", fb)
	}
	checkFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if m := h.keyed("/v1/classify", body).ok(t); m["engine"] != "llm" {
			return fmt.Errorf("auto after one failed call, with the upstream answering: %v", m)
		}
		return nil
	})
}

// TestAutoAcrossAnUpstreamBlink: an upstream gone for a moment (killed
// and restarted) failed a call, then the probe a second later; from then
// auto answered offline with no fallback, the failed probe having
// cleared the failed call, and probed again only 10 s later: a 0.4 s
// blink sent the rest of a 20,000-line job offline silently. Every
// answer the model was not asked for now says why, whichever failure
// took the upstream for down, and while it is down a probe is due every
// second, so the llm answers again a second or two after it is back.
func TestAutoAcrossAnUpstreamBlink(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: auto\n  llm_model: small"})
	const body = `{"text": "the export button crashes", "labels": ["bug", "billing"]}`
	if m := h.keyed("/v1/classify", body).ok(t); m["engine"] != "llm" {
		t.Fatalf("auto with the upstream up: %v", m)
	}
	opts := h.up.Options()
	h.up.Close()
	// Long enough for the probe a failed call brings forward to fail too.
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		m := h.keyed("/v1/classify", body).ok(t)
		if m["engine"] != "lexical" || m["fallback"] == nil {
			t.Fatalf("auto with the upstream gone answered %v: want lexical, with a fallback saying why", m)
		}
	}
	ln, err := net.Listen("tcp", h.up.Addr)
	if err != nil {
		t.Fatalf("listening on the upstream's address again: %v", err)
	}
	back := proxytest.NewServerOn(ln, opts)
	t.Cleanup(back.Close)
	backAt := time.Now()
	// A probe is due a second after the last while the upstream is
	// down; 6 s leaves a busy machine room, and is still short of the
	// 7.5 s or more that the upstream stayed offline when the next probe
	// came 10 s after the last.
	checkFor(t, 6*time.Second, 50*time.Millisecond, func() error {
		m := h.keyed("/v1/classify", body).ok(t)
		if m["engine"] != "llm" {
			if m["fallback"] == nil {
				t.Fatalf("auto answered %v after the upstream came back: no fallback saying why", m)
			}
			return fmt.Errorf("auto after the upstream came back: %v", m)
		}
		return nil
	})
	t.Logf("the llm answered again %v after its upstream", time.Since(backAt).Round(time.Millisecond))
}

// TestIssueLLMIsNotRefusedLabelsOnlyItTellsApart: labels the offline
// engines read as one ("C", "C++" and "C#", "rating 👍" and "rating 👎")
// or not at all ("👍") were refused for every engine, the llm's calls too,
// as labels "no engine tells apart". They are refused where an offline
// engine answers as asked, saying so and naming the llm engine; the llm
// answers them; and an offline engine standing in for auto's llm while
// its upstream is down answers them with the tie flagged. A label twice,
// in either Unicode form, is refused whatever the engine.
func TestIssueLLMIsNotRefusedLabelsOnlyItTellsApart(t *testing.T) {
	langs := `
  langs:
    labels: [C, C++, Go]
`
	h := newHarness(t, harnessOptions{plugins: "  engine: auto\n  llm_model: small", classifiers: defaultClassifiers + langs})
	for _, c := range []struct{ path, body string }{
		{"/v1/classify", `{"text": "I write C++ templates", "labels": ["C", "C++", "C#"], "model": "llm"}`},
		{"/v1/classify", `{"text": "great, thanks", "labels": ["rating 👍", "rating 👎"], "model": "llm"}`},
		{"/v1/classify", `{"text": "great, thanks", "labels": ["👍", "👎"], "model": "small"}`},
		{"/v1/classify", `{"text": "I write C++ templates", "classifier": "langs"}`}, // auto, upstream up: llm
		{"/v1/tag", `{"text": "I write C++ templates", "tags": ["C++", "C#"], "model": "llm"}`},
	} {
		if m := h.keyed(c.path, c.body).ok(t); m["engine"] != "llm" {
			t.Errorf("%s: engine %v, want llm", c.body, m["engine"])
		}
	}
	const offline = `the offline engines (semantic and lexical) read only words and do not tell them apart; the llm engine does (send "model": "llm")`
	for _, c := range []struct{ path, body, param, msg string }{
		{"/v1/classify", `{"text": "I write C++ templates", "labels": ["C", "C++", "C#"], "model": "lexical"}`, "labels[1]",
			`labels has "C" and "C++", which differ only in case, spacing, punctuation, symbols or invisible characters: ` + offline},
		{"/v1/tag", `{"text": "I write C++ templates", "tags": ["C++", "C#"], "model": "lexical"}`, "tags[1]", `tags has "C++" and "C#"`},
		{"/v1/classify", `{"text": "great", "labels": ["a", "👍"], "model": "lexical"}`, "labels[1]",
			`labels[1] ("👍") has no letter or digit: the offline engines (semantic and lexical) read only words and find none in it; the llm engine reads it as written (send "model": "llm")`},
		{"/v1/classify", `{"text": "I write C++ templates", "classifier": "langs", "model": "lexical"}`, "classifier", `the saved classifier "langs": labels has "C" and "C++"`},
		// One label twice is no question for any engine.
		{"/v1/classify", `{"text": "x", "labels": ["C", "C"], "model": "llm"}`, "labels[1]", `labels has "C" twice`},
		{"/v1/classify", `{"text": "x", "labels": ["caf\u00e9", "cafe\u0301"], "model": "llm"}`, "labels[1]", `one text written two ways`},
	} {
		e := h.keyed(c.path, c.body).apiError(t, 400, "invalid_request_error")
		if e["param"] != c.param || !strings.Contains(e["message"].(string), c.msg) {
			t.Errorf("%s: param %v, message %q; want %q and %q", c.body, e["param"], e["message"], c.param, c.msg)
		}
	}

	// auto with its upstream down: the offline engine stands in, and the
	// labels it reads as one tie, flagged.
	down := newHarness(t, harnessOptions{upstream: proxytest.Options{Status: 503}, plugins: "  engine: auto\n  llm_model: small", classifiers: defaultClassifiers + langs})
	for _, body := range []string{
		`{"text": "I write C++ templates", "labels": ["C", "C++", "C#"]}`,
		`{"text": "I write C++ templates", "classifier": "langs"}`,
	} {
		m := down.keyed("/v1/classify", body).ok(t)
		if m["engine"] != "lexical" || m["tie"] != true {
			t.Errorf("%s, auto offline: %v; want lexical's answer with the tie flagged", body, m)
		}
	}
}

// An llm engine's upstream that answered a redirect (an http:// base_url
// of an https-only provider) or a 401 (the gateway's api_key refused)
// was taken for down: a call naming the model was a 503 "upstream local
// is unavailable; retry later", which named neither the redirect nor the
// key. It is the 502 a chat call gets, saying what to fix.
func TestLLMEngineAnswersAnUpstreamsRedirectOrRefusalAsChatDoes(t *testing.T) {
	for _, c := range []struct {
		name     string
		upstream proxytest.Options
		code     string
		says     string
	}{
		{"redirect", proxytest.Options{Status: 301, ErrorBody: "<html>301 Moved Permanently</html>",
			StatusHeaders: map[string]string{"Location": "https://api.example.com/v1/chat/completions?sig=s3cret"}},
			"upstream_bad_answer", "upstream local answered 301 with a redirect to https://api.example.com/v1/chat/completions;"},
		{"refused key", proxytest.Options{Status: 401, ErrorBody: `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`},
			"upstream_credentials_refused", "upstream local refused the gateway's credentials for it (answered 401: Incorrect API key provided)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{})
			h.up.SetOptions(c.upstream)
			// The second is refused before it is admitted, the model
			// taken for down after the first: it says why all the same.
			for i := range 2 {
				e := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "small"}`).apiError(t, 502, c.code)
				msg := e["message"].(string)
				if e["type"] != "upstream_error" || !strings.Contains(msg, "model small: "+c.says) ||
					strings.Contains(msg, "retry later") || strings.Contains(msg, "s3cret") {
					t.Fatalf("call %d: %v; want the upstream's fault as chat words it", i+1, e)
				}
			}
			if n := h.up.ChatCalls(); n != 1 {
				t.Fatalf("%d chat calls; want the second refused without one", n)
			}
		})
	}

	// auto falls back to the offline engine, as for any failed call, its
	// fallback saying why.
	h := newHarness(t, harnessOptions{plugins: "  engine: auto\n  llm_model: small"})
	if m := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"]}`).ok(t); m["engine"] != "llm" {
		t.Fatalf("auto with the upstream up: %v", m)
	}
	h.up.SetOptions(proxytest.Options{Status: 307, StatusHeaders: map[string]string{"Location": "https://api.example.com/v1/chat/completions"}})
	m := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"]}`).ok(t)
	if m["engine"] == "llm" || !strings.Contains(fmt.Sprint(m["fallback"]), "llm model small failed (upstream local answered 307 with a redirect to https://api.example.com/v1/chat/completions;") {
		t.Fatalf("auto with the upstream redirecting: %v", m)
	}
}

// TestLLMUpstreamAtItsLimitIsNotDown: an upstream answering 429 to GET
// /models too was taken for down by its probe: a classify naming the llm
// got 503 upstream_unavailable without a wait, where a chat call passes
// the 429 and its Retry-After on, and auto's fallback said the upstream
// "failed its probe", not that it was at its limit. It is up, limited:
// asked, it answers 429, and that is what the caller hears.
func TestLLMUpstreamAtItsLimitIsNotDown(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Status: 429, RetryAfter: "7"}, plugins: "  engine: auto\n  llm_model: small"})
	// The auto call waits for the first probe, which has answered by then.
	m := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"]}`).ok(t)
	if m["engine"] != "lexical" || !strings.Contains(fmt.Sprint(m["fallback"]), "answered 429") {
		t.Errorf("auto with the upstream at its limit: %v; want lexical, and a fallback saying the upstream answered 429", m)
	}
	for i := 0; i < 3; i++ {
		r := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "llm"}`)
		if r.status != 429 || r.header.Get("Retry-After") != "7" {
			t.Fatalf("call %d naming the llm, its upstream at its limit: %s (Retry-After %q); want 429 with the upstream's Retry-After", i, r, r.header.Get("Retry-After"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
