package plugins_test

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/plugins"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// checkUsage checks the spec 2.4 usage object and returns total_tokens.
// Beside the three counts it may carry a chat completion's
// prompt_tokens_details.cached_tokens and
// completion_tokens_details.reasoning_tokens, shown when not 0.
func checkUsage(t *testing.T, m map[string]any) int64 {
	t.Helper()
	u, ok := m["usage"].(map[string]any)
	if !ok {
		t.Fatalf("no usage object in %v", m)
	}
	counts := map[string]any{}
	for k, v := range u {
		if k != "prompt_tokens_details" && k != "completion_tokens_details" {
			counts[k] = v
		}
	}
	if got := keysOf(counts); !reflect.DeepEqual(got, []string{"completion_tokens", "prompt_tokens", "total_tokens"}) {
		t.Fatalf("usage fields %v", keysOf(u))
	}
	for details, part := range map[string]string{"prompt_tokens_details": "cached_tokens", "completion_tokens_details": "reasoning_tokens"} {
		if d, ok := u[details]; ok {
			if d, ok := d.(map[string]any); !ok || len(d) != 1 || d[part].(float64) <= 0 {
				t.Fatalf("usage %v: %s is not {%q: N} with N above 0", u, details, part)
			}
		}
	}
	p, c, total := u["prompt_tokens"].(float64), u["completion_tokens"].(float64), u["total_tokens"].(float64)
	if total != p+c || total <= 0 {
		t.Fatalf("usage %v: total is not prompt + completion, or 0", u)
	}
	return int64(total)
}

// checkScores checks a sorted list of {label, confidence}.
func checkScores(t *testing.T, v any, field string, n int) []any {
	t.Helper()
	list, ok := v.([]any)
	if !ok || len(list) != n {
		t.Fatalf("%s = %v, want %d entries", field, v, n)
	}
	prev := 2.0
	for _, e := range list {
		m := e.(map[string]any)
		c, ok := m["confidence"].(float64)
		if _, isLabel := m[field[:len(field)-1]].(string); !isLabel && field != "scores" || !ok || c < 0 || c > 1 || c > prev {
			t.Fatalf("%s entry %v: want a label and a confidence in [0,1], sorted descending", field, m)
		}
		prev = c
	}
	return list
}

// TestEndpointsWithAndWithoutKey: classify and tag answer without a key
// (free, unmetered); score and match need one; with a key all four answer
// and are metered.
func TestEndpointsWithAndWithoutKey(t *testing.T) {
	h := newHarness(t, harnessOptions{trustedProxies: "127.0.0.1"})

	m := h.do(request{path: "/v1/classify", body: `{"text": "I was charged twice for billing", "labels": ["bug", "billing", "account"]}`, xff: "203.0.113.1"}).ok(t)
	if m["mode"] != "single" || m["label"] == "" || m["engine"] != "lexical" || m["latency_ms"] == nil {
		t.Errorf("classify answer %v", m)
	}
	if _, ok := m["confidence"].(float64); !ok {
		t.Errorf("classify answer has no confidence: %v", m)
	}
	if _, ok := m["model"]; ok {
		t.Errorf("lexical answer names a model: %v", m)
	}
	scores := checkScores(t, m["scores"], "scores", 3)
	if scores[0].(map[string]any)["label"] != m["label"] {
		t.Errorf("label %v is not the best of scores %v", m["label"], scores)
	}
	checkUsage(t, m)

	m = h.do(request{path: "/v1/tag", body: `{"text": "The export button does nothing", "tags": ["bug", "ui", "billing"]}`, xff: "203.0.113.2"}).ok(t)
	if _, ok := m["tags"].([]any); !ok || m["engine"] != "lexical" {
		t.Errorf("tag answer %v", m)
	}
	checkUsage(t, m)

	for _, path := range []string{"/v1/score", "/v1/match"} {
		r := h.do(request{path: path, body: `{"source": "x", "attribute": "urgency", "query": "y"}`, xff: "203.0.113.3"})
		r.apiError(t, 401, "INVALID_API_KEY")
	}
	h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a"]}`, key: "tg-forged"}).apiError(t, 401, "INVALID_API_KEY")
	// Without a key, a catalog model cannot be named: anyone could run the
	// operator's dearest model for free.
	h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"], "model": "small"}`, xff: "203.0.113.4"}).apiError(t, 403, "permission_denied")
	h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"], "model": "gpt-5"}`, xff: "203.0.113.5"}).apiError(t, 400, "invalid_request_error")
	noScope := h.newKey("acme", accounts.KeyRequest{Name: "gen", Scopes: []string{accounts.ScopeGenerate}})
	h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a"]}`, key: noScope}).apiError(t, 403, "permission_denied")
	time.Sleep(50 * time.Millisecond)
	if n := len(h.rec.Events()); n != 0 {
		t.Fatalf("%d events for public or refused calls, want 0", n)
	}

	bodies := map[string]string{
		"/v1/classify": `{"text": "Please refund the charge", "classifier": "support-intent"}`,
		"/v1/tag":      `{"text": "Dark mode please"}`,
		"/v1/score":    `{"source": "Server is down!", "attribute": "urgency", "description": "how soon someone must act"}`,
		"/v1/match":    `{"source": "Refunds take 5 days.", "query": "how long do refunds take?"}`,
	}
	for _, path := range []string{"/v1/classify", "/v1/tag", "/v1/score", "/v1/match"} {
		r := h.keyed(path, bodies[path])
		m := r.ok(t)
		total := checkUsage(t, m)
		if r.header.Get("x-request-id") == "" || r.header.Get("x-ratelimit-limit-requests") != "600" {
			t.Errorf("%s headers %v", path, r.header)
		}
		if path == "/v1/score" || path == "/v1/match" {
			if got := keysOf(m); !reflect.DeepEqual(got, []string{"engine", "latency_ms", "score", "usage"}) {
				t.Errorf("%s fields %v, want score, latency_ms, usage and engine", path, got)
			}
			if s := m["score"].(float64); s < 0 || s > 1 {
				t.Errorf("%s score %v outside [0,1]", path, s)
			}
		}
		ev := h.events(1 + indexOf(path))[indexOf(path)]
		price := money.Price(80_000_000_000) // the default 0.00000008 USD per token
		var want money.Atto
		want.Add(total, price)
		if ev.ID != r.header.Get("x-request-id") || ev.Endpoint != path || ev.Account != "acme" || ev.Model != "lexical" ||
			ev.Upstream != "" || ev.PromptTokens+ev.CompletionTokens != total || ev.CostNanos != want.Nanos() ||
			ev.UsageSource != meter.SourceTokenizer || ev.Status != 200 || ev.Latency <= 0 {
			t.Errorf("%s event %+v (total %d tokens, want cost %s)", path, ev, total, want.Nanos())
		}
	}
}

func indexOf(path string) int {
	return map[string]int{"/v1/classify": 0, "/v1/tag": 1, "/v1/score": 2, "/v1/match": 3}[path]
}

// TestClassifyModes: multi mode returns the labels at or above the
// threshold; a saved classifier supplies labels and its mode can be
// overridden per request.
func TestClassifyModes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	m := h.keyed("/v1/classify", `{"text": "billing bug", "labels": ["billing", "bug", "account"], "mode": "multi", "threshold": 0}`).ok(t)
	if m["mode"] != "multi" || m["threshold"] != 0.0 {
		t.Errorf("multi answer %v", m)
	}
	if _, ok := m["label"]; ok {
		t.Errorf("multi answer has a single label: %v", m)
	}
	checkScores(t, m["labels"], "labels", 2) // threshold 0: every label with evidence; account has none
	checkScores(t, m["scores"], "scores", 3)

	m = h.keyed("/v1/classify", `{"text": "billing", "labels": ["billing", "bug"], "mode": "multi", "threshold": 1}`).ok(t)
	labels, ok := m["labels"].([]any)
	if !ok {
		t.Fatalf("multi answer without labels array: %v", m)
	}
	for _, l := range labels {
		if l.(map[string]any)["confidence"].(float64) < 1 {
			t.Errorf("label %v under the threshold 1", l)
		}
	}

	m = h.keyed("/v1/classify", `{"text": "refund my charge", "classifier": "support-intent"}`).ok(t)
	if m["classifier"] != "support-intent" || m["mode"] != "single" {
		t.Errorf("saved classifier answer %v", m)
	}
	checkScores(t, m["scores"], "scores", 3)
	m = h.keyed("/v1/classify", `{"text": "refund my charge", "classifier": "support-intent", "mode": "multi", "threshold": 0}`).ok(t)
	checkScores(t, m["labels"], "labels", 1) // only billing shares a word with the text
	checkScores(t, m["scores"], "scores", 3)
}

// TestBalance: a keyed call of an account below the grace buffer is 402
// and uses no quota; public calls do not care.
func TestBalance(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := context.Background()
	if _, err := h.svc.CreateAccount(ctx, "broke", 0); err != nil {
		t.Fatal(err)
	}
	key := h.newKey("broke", accounts.KeyRequest{Name: "k"})
	if _, err := h.svc.Debit(ctx, "broke", money.NanosPerUSD); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		bal, _ := h.svc.Balance("broke")
		if bal != -money.NanosPerUSD {
			return fmt.Errorf("balance %s", bal)
		}
		return nil
	})
	for _, path := range []string{"/v1/classify", "/v1/score"} {
		h.do(request{path: path, body: body(path), key: key}).apiError(t, 402, "INSUFFICIENT_BALANCE")
	}
	h.do(request{path: "/v1/classify", body: body("/v1/classify")}).ok(t)
}

func body(path string) string {
	switch path {
	case "/v1/score":
		return `{"source": "x", "attribute": "spam"}`
	case "/v1/match":
		return `{"source": "x", "query": "y"}`
	case "/v1/tag":
		return `{"text": "x"}`
	}
	return `{"text": "x", "labels": ["a", "b"]}`
}

// TestClassifyTie: a text that shares no word with any label is a tie,
// flagged, with equal confidences and the same answer whatever the order
// of the labels; a text with evidence has no tie field.
func TestClassifyTie(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: lexical"})
	for _, labels := range []string{`["billing", "bug"]`, `["bug", "billing"]`} {
		m := h.keyed("/v1/classify", `{"text": "The export button crashes", "labels": `+labels+`}`).ok(t)
		scores := checkScores(t, m["scores"], "scores", 2)
		if m["tie"] != true || m["label"] != "billing" || m["confidence"] != 0.5 ||
			scores[0].(map[string]any)["label"] != "billing" || scores[1].(map[string]any)["confidence"] != 0.5 {
			t.Errorf("labels %s: %v; want tie true, billing (first by name) at 0.5", labels, m)
		}
	}
	m := h.keyed("/v1/classify", `{"text": "The export button crashes", "labels": ["billing", "bug"],
		"descriptions": {"bug": "something is broken: crashes, errors"}}`).ok(t)
	if _, ok := m["tie"]; ok || m["label"] != "bug" {
		t.Errorf("clear case %v; want bug without tie", m)
	}
	m = h.keyed("/v1/classify", `{"text": "The export button crashes", "labels": ["billing", "bug"], "mode": "multi", "threshold": 0}`).ok(t)
	checkScores(t, m["labels"], "labels", 0)
	checkScores(t, m["scores"], "scores", 2)
}

// TestTagThreshold: an explicit threshold is the client's, 0 included, for
// closed and open tags alike. 0 was read as "default" (0.5), and open tags
// ignored the threshold altogether.
func TestTagThreshold(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	key := h.newKey("acme", accounts.KeyRequest{Name: "tags"})
	tags := func(body string) []any {
		t.Helper()
		m := h.do(request{path: "/v1/tag", body: body, key: key}).ok(t)
		list, ok := m["tags"].([]any)
		if !ok {
			t.Fatalf("no tags list: %v", m)
		}
		return list
	}
	closed := `"text": "The export button crashes when I export a report", "tags": ["export", "crash", "billing", "report settings and layout options"]`
	byDefault, all := tags(`{`+closed+`}`), tags(`{`+closed+`, "threshold": 0}`)
	below := false
	for _, tg := range all {
		below = below || tg.(map[string]any)["confidence"].(float64) < 0.5
	}
	if !below || len(all) <= len(byDefault) {
		t.Fatalf("threshold 0 gave %v, the default 0.5 gave %v: want the tags below 0.5 too", all, byDefault)
	}
	open := `"text": "The export button does nothing on Safari"`
	if got := tags(`{` + open + `}`); len(got) == 0 {
		t.Fatal("open tags found nothing")
	}
	if got := tags(`{` + open + `, "threshold": 0.99}`); len(got) != 0 {
		t.Fatalf("open tags at threshold 0.99: %v", got)
	}
}

// A score the engine had nothing to measure by says so, and an ordinary
// one carries no such field.
func TestScoreNoEvidenceField(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	m := h.keyed("/v1/score", `{"source": "The meeting moved to Thursday.", "attribute": "zorblyness"}`).ok(t)
	if m["no_evidence"] != true || m["score"] != 0.0 {
		t.Errorf("unknown attribute: %v, want score 0 and no_evidence true", m)
	}
	m = h.keyed("/v1/score", `{"source": "Server is down!", "attribute": "urgency"}`).ok(t)
	if _, ok := m["no_evidence"]; ok {
		t.Errorf("urgency: %v carries no_evidence", m)
	}
}

// TestMatchNoEvidenceField: /v1/match answered {"score":0} for "🔥" as
// both query and source, as if a duplicate were unrelated; a text with no
// word to read now says no_evidence, as /v1/score does.
func TestMatchNoEvidenceField(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, body := range []string{`{"source": "🔥", "query": "🔥"}`, `{"source": "???", "query": "???"}`} {
		if m := h.keyed("/v1/match", body).ok(t); m["no_evidence"] != true || m["score"] != 0.0 {
			t.Errorf("%s: %v, want score 0 and no_evidence true", body, m)
		}
	}
	m := h.keyed("/v1/match", `{"source": "Refunds are issued within 5 days.", "query": "how long do refunds take?"}`).ok(t)
	if _, ok := m["no_evidence"]; ok {
		t.Errorf("a real match: %v carries no_evidence", m)
	}
}

// Plugin calls are counted in the request metrics under their engine, as
// generation calls are under their model: an operator saw no classify
// traffic at all.
func TestPluginCallsAreInTheRequestMetrics(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	m := h.keyed("/v1/classify", `{"text": "Please refund the charge", "labels": ["billing", "bug"]}`).ok(t)
	resp, err := h.client.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	want := fmt.Sprintf(`tollgate_requests_total{model=%q,upstream="",endpoint="/v1/classify",status="200"} 1`, m["engine"])
	if !strings.Contains(string(body), want+"\n") {
		t.Fatalf("/metrics lacks %s:\n%s", want, body)
	}
	// A plugin call has no first token: its series stayed 0 for ever.
	if strings.Contains(string(body), `tollgate_time_to_first_token_seconds_count{model=`+fmt.Sprintf("%q", m["engine"])) {
		t.Fatalf("/metrics has a time to first token for classify:\n%s", body)
	}
}

// A plugin call that fails with a 5xx (its llm's upstream down) is counted
// as a failed generation call is: the dashboards showed none.
func TestPluginFailuresAreInTheRequestMetrics(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Status: 503}, plugins: "  engine: llm\n  llm_model: small"})
	r := h.keyed("/v1/classify", `{"text": "Please refund the charge", "labels": ["billing", "bug"]}`)
	if r.status != 502 {
		t.Fatalf("classify with the llm's upstream down: %s", r)
	}
	resp, err := h.client.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `tollgate_requests_total{model="small",upstream="local",endpoint="/v1/classify",status="502"} 1`) {
		t.Fatalf("/metrics lacks the 502:\n%s", body)
	}
}

// A public classify or tag call that the engine answered is counted in the
// request metrics, with its tokens, as a keyed one is, though it records
// no usage event: /metrics showed public mode's refusals and 5xx, never
// its answers.
func TestPublicCallsAreInTheRequestMetrics(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: llm\n  llm_model: small"})
	m := h.do(request{path: "/v1/classify", body: `{"text": "Please refund the charge", "labels": ["billing", "bug"]}`}).ok(t)
	if m["model"] != "small" {
		t.Fatalf("public classify answered by %v, want the llm small", m)
	}
	prompt := int64(m["usage"].(map[string]any)["prompt_tokens"].(float64))
	resp, err := h.client.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`tollgate_requests_total{model="small",upstream="local",endpoint="/v1/classify",status="200"} 1`,
		fmt.Sprintf(`tollgate_tokens_total{model="small",upstream="local",endpoint="/v1/classify",status="200",kind="prompt"} %d`, prompt),
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
	if evs := h.rec.Events(); len(evs) != 0 {
		t.Errorf("a public call recorded %d usage events: %+v", len(evs), evs[0])
	}
}

// TestAnswerThatCannotBeEncodedIsNotMeteredAs200: a classify answer with
// a NaN confidence was a 500 to the caller, "encoding the response", but
// metered (and billed) as a 200: the call was recorded before its answer
// was encoded. It is metered as the 500 it was: not at all on an offline
// engine, and at the status sent with the tokens a model spent on it.
func TestAnswerThatCannotBeEncodedIsNotMeteredAs200(t *testing.T) {
	plugins.FailEncodingWhen(t, func(b []byte) bool { return strings.Contains(string(b), `"mode":"single"`) })
	h := newHarness(t, harnessOptions{plugins: `
  engine: lexical
  llm_model: small
  pricing: {classify: "0.000001", score: "0.000001"}`})
	h.keyed("/v1/classify", `{"text": "my card was charged twice", "labels": ["billing", "bug"]}`).apiError(t, 500, "internal_error")
	// The score after it is the only call metered.
	h.keyed("/v1/score", `{"source": "Server is down!", "attribute": "urgency"}`).ok(t)
	if ev := h.events(1)[0]; ev.Endpoint != "/v1/score" || ev.Status != 200 {
		t.Fatalf("event %+v, want the score's alone", ev)
	}

	h.keyed("/v1/classify", `{"text": "my card was charged twice", "labels": ["billing", "bug"], "model": "small"}`).apiError(t, 500, "internal_error")
	ev := h.events(2)[1]
	if ev.Endpoint != "/v1/classify" || ev.Status != 500 || ev.Model != "small" || ev.PromptTokens == 0 || ev.CostNanos == 0 {
		t.Errorf("llm event %+v, want status 500 with the model's tokens and their cost", ev)
	}
}

// The llm's upstream answering 429 with Retry-After: a 502 without a
// wait had the OpenAI SDKs ask again at once, into the same limit, where
// a chat call passes the 429 and its wait on.
func TestPluginCallTellsTheUpstreamsWait(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Status: 429, RetryAfter: "7"}, plugins: "  engine: llm\n  llm_model: small"})
	r := h.keyed("/v1/classify", `{"text": "Please refund the charge", "labels": ["billing", "bug"]}`)
	if r.status != 429 || r.header.Get("Retry-After") != "7" || r.header.Get("retry-after-ms") != "7000" {
		t.Fatalf("classify with the llm's upstream at its limit: %s (Retry-After %q, retry-after-ms %q)",
			r, r.header.Get("Retry-After"), r.header.Get("retry-after-ms"))
	}
}

// A wait over a minute is passed on with x-should-retry: false, as for a
// chat call's 429s: an SDK that honours any Retry-After slept the hour
// inside classify(), and one that does not retried at once into it.
func TestPluginCallTellsNotToRetryALongWait(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Status: 429, RetryAfter: "3600"}, plugins: "  engine: llm\n  llm_model: small"})
	r := h.keyed("/v1/classify", `{"text": "Please refund the charge", "labels": ["billing", "bug"]}`)
	if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); r.status != 429 || ra <= 60 || r.header.Get("x-should-retry") != "false" {
		t.Fatalf("classify with the llm's upstream resting an hour: %s (Retry-After %q, x-should-retry %q); want 429, over 60 and false",
			r, r.header.Get("Retry-After"), r.header.Get("x-should-retry"))
	}
}
