package classifiers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// httpCaller is a ModelCaller that posts to a real upstream over TCP, the
// way the gateway's CallModel does, without the gateway around it.
type httpCaller struct{ url string }

func (c httpCaller) CallModel(ctx context.Context, model string, body []byte) ([]byte, catalog.Usage, error) {
	var u catalog.Usage
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, u, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, u, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, u, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, u, fmt.Errorf("upstream answered %d: %s", resp.StatusCode, raw)
	}
	u.PromptTokens = gjson.GetBytes(raw, "usage.prompt_tokens").Int()
	u.CompletionTokens = gjson.GetBytes(raw, "usage.completion_tokens").Int()
	return raw, u, nil
}

func newLLM(t *testing.T, o proxytest.Options) (Engine, *proxytest.Server) {
	t.Helper()
	o.ClassifierAnswers = true
	o.PromptTokens, o.CompletionTokens = 40, 9
	s := proxytest.NewServer(o)
	t.Cleanup(s.Close)
	return NewLLM(httpCaller{s.URL}, "catalog-model"), s
}

var oneCall = Usage{PromptTokens: 40, CompletionTokens: 9, TotalTokens: 49}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-3 }

var supportRequest = ClassifyRequest{
	Text:         "Where is my shipping confirmation?",
	Labels:       []string{"billing", "shipping", "account", "other"},
	Descriptions: map[string]string{"billing": "payments and refunds", "shipping": "delivery of orders"},
	Examples:     map[string][]string{"account": {"I cannot log in"}},
	TextType:     "customer support email",
}

func TestLLMClassifyConfidenceFromLogprobs(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{})
	r, err := e.Classify(ctx, supportRequest)
	if err != nil {
		t.Fatal(err)
	}
	// The fake model gives the chosen label's first token 0.8 and the three
	// other labels 0.2/3 each, and states 0.9.
	if r.Label != "shipping" || !near(r.Confidence, 0.8) || r.Scores[0].Label != "shipping" {
		t.Fatalf("result %+v", r)
	}
	for _, sc := range r.Scores[1:] {
		if !near(sc.Confidence, 0.2/3) {
			t.Errorf("score %+v, want %.4f from the log-probabilities", sc, 0.2/3)
		}
	}
	if r.Engine != "llm" || r.Model != "catalog-model" || r.Usage != oneCall {
		t.Errorf("answer %+v", r.Answer)
	}

	reqs := s.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	body := string(reqs[0].Body)
	for path, want := range map[string]string{
		"model": "catalog-model", "response_format.type": "json_object", "logprobs": "true",
		"top_logprobs": "5", "temperature": "0", "messages.1.content": supportRequest.Text,
	} {
		if got := gjson.Get(body, path).String(); got != want {
			t.Errorf("request %s = %q, want %q", path, got, want)
		}
	}
	system := gjson.Get(body, "messages.0.content").String()
	for _, want := range []string{PromptMarker + " classify", `["billing","shipping","account","other"]`, "payments and refunds", `"I cannot log in"`, "customer support email"} {
		if !strings.Contains(system, want) {
			t.Errorf("system prompt lacks %q:\n%s", want, system)
		}
	}
}

func TestLLMClassifyFallsBackToStatedConfidence(t *testing.T) {
	e, _ := newLLM(t, proxytest.Options{NoLogprobs: true})
	r, err := e.Classify(ctx, supportRequest)
	if err != nil {
		t.Fatal(err)
	}
	if r.Label != "shipping" || !near(r.Confidence, 0.9) {
		t.Fatalf("result %+v, want the stated 0.9", r)
	}
	for _, sc := range r.Scores[1:] {
		if !near(sc.Confidence, 0.1/3) {
			t.Errorf("score %+v: the rest of the stated confidence is spread evenly", sc)
		}
	}
}

func TestLLMRetriesOnceOnUnparseableOutput(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{BadJSONTimes: 1})
	r, err := e.Classify(ctx, supportRequest)
	if err != nil {
		t.Fatal(err)
	}
	if r.Label != "shipping" {
		t.Errorf("label %q", r.Label)
	}
	if want := (Usage{PromptTokens: 80, CompletionTokens: 18, TotalTokens: 98}); r.Usage != want {
		t.Errorf("usage %+v, want both calls %+v", r.Usage, want)
	}
	reqs := s.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	retry := gjson.GetBytes(reqs[1].Body, "messages")
	if n := len(retry.Array()); n != 4 || retry.Get("2.role").String() != "assistant" ||
		!strings.Contains(retry.Get("3.content").String(), "not valid") {
		t.Errorf("retry messages %s", retry.Raw)
	}
}

func TestLLMGivesUpAfterTheSecondUnparseableOutput(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{BadJSONTimes: 2})
	r, err := e.Score(ctx, ScoreRequest{Source: "x", Attribute: "urgency"})
	if !errors.Is(err, ErrUnparseable) || !strings.Contains(err.Error(), "Sure! The text looks fine") {
		t.Fatalf("err %v, want ErrUnparseable quoting the model", err)
	}
	if len(s.Requests()) != 2 {
		t.Errorf("%d requests, want 2", len(s.Requests()))
	}
	if r.Usage.TotalTokens != 2*oneCall.TotalTokens || r.Engine != "llm" {
		t.Errorf("answer %+v: the spent tokens must be reported with the error", r.Answer)
	}
}

func TestLLMUpstreamErrorIsNotUnparseable(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{Status: 503})
	_, err := e.Match(ctx, MatchRequest{Source: "a", Query: "b"})
	if err == nil || errors.Is(err, ErrUnparseable) || !strings.Contains(err.Error(), "503") {
		t.Errorf("err %v", err)
	}
	if len(s.Requests()) != 1 {
		t.Errorf("%d requests: an upstream failure is not retried by the engine", len(s.Requests()))
	}
}

func TestLLMScoreAndMatchFromDigitLogprobs(t *testing.T) {
	withLogprobs, s := newLLM(t, proxytest.Options{})
	without, _ := newLLM(t, proxytest.Options{NoLogprobs: true})

	r, err := withLogprobs.Score(ctx, ScoreRequest{Source: "server down", Attribute: "urgency"})
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.Score, 6.1/9) || r.Usage != oneCall {
		t.Errorf("score %+v, want the expected digit 6.1/9", r)
	}
	if sys := gjson.GetBytes(s.Requests()[0].Body, "messages.0.content").String(); !strings.Contains(sys, "urgently") {
		t.Errorf("the common attribute's meaning is not in the prompt:\n%s", sys)
	}
	m, err := withLogprobs.Match(ctx, MatchRequest{Source: "doc", Query: "q"})
	if err != nil || !near(m.Score, 6.1/9) {
		t.Errorf("match %+v, %v", m, err)
	}
	r, err = without.Score(ctx, ScoreRequest{Source: "x", Attribute: "politeness", Description: "how polite"})
	if err != nil || !near(r.Score, 6.0/9) {
		t.Errorf("stated score %+v, %v; want 6/9", r, err)
	}
}

func TestLLMMultiAndTags(t *testing.T) {
	e, _ := newLLM(t, proxytest.Options{})
	r, err := e.Classify(ctx, ClassifyRequest{Text: "cats and dogs", Labels: []string{"cats", "dogs", "fish"}, Mode: ModeMulti, Threshold: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Labels) != 2 || r.Labels[0].Label != "cats" || r.Labels[1].Label != "dogs" || len(r.Scores) != 3 || r.Label != "" {
		t.Errorf("multi %+v", r)
	}
	tg, err := e.Tag(ctx, TagRequest{Text: "Rust and Go", Tags: []string{"go", "rust", "java"}})
	if err != nil || len(tg.Tags) != 2 || !near(tg.Tags[0].Confidence, 0.9) {
		t.Errorf("closed tags %+v, %v", tg, err)
	}
	tg, err = e.Tag(ctx, TagRequest{Text: "The quick brown fox jumps", MaxTags: 2})
	if err != nil || len(tg.Tags) != 2 || tg.Tags[0].Label != "quick" {
		t.Errorf("open tags %+v, %v", tg, err)
	}
}

// answer builds a model answer whose tokens spell text.
func answer(tokens ...tokenLogprob) modelAnswer {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString(t.Token)
	}
	return modelAnswer{text: b.String(), logprobs: tokens}
}

func tok(token string, p float64, alts ...any) tokenLogprob {
	t := tokenLogprob{Token: token, Logprob: math.Log(p)}
	for i := 0; i+1 < len(alts); i += 2 {
		t.TopLogprobs = append(t.TopLogprobs, struct {
			Token   string  `json:"token"`
			Logprob float64 `json:"logprob"`
		}{alts[i].(string), math.Log(alts[i+1].(float64))})
	}
	return t
}

func TestLabelDistribution(t *testing.T) {
	labels := []string{"billing", "bugs", "shipping"}
	// The value's first token also holds the opening quote; "b" begins two
	// labels and splits its mass; " maybe" begins none and is left out.
	ans := answer(tok(`{"label":`, 1), tok(`"ship`, 0.6, `"ship`, 0.6, `"b`, 0.2, `"bill`, 0.1, ` maybe`, 0.1), tok(`ping"}`, 1))
	d := labelDistribution(ans, "label", "shipping", labels)
	if !near(d["shipping"], 0.6/0.9) || !near(d["billing"], 0.2/0.9) || !near(d["bugs"], 0.1/0.9) {
		t.Errorf("distribution %v", d)
	}
	// Tokens that do not spell the text: no distribution.
	bad := ans
	bad.text += " "
	if labelDistribution(bad, "label", "shipping", labels) != nil {
		t.Errorf("distribution from tokens that do not spell the answer")
	}
}

func TestParseRejectsInvalidAnswers(t *testing.T) {
	canon := canonicalLabels([]string{"billing", "shipping"})
	for _, text := range []string{
		`the label is billing`,
		`{"label": "refunds", "confidence": 0.9}`,
		`{"label": "billing", "confidence": 1.5}`,
		`{"label": "billing"}`,
		`{"labels": ["billing"]}`,
	} {
		var r ClassifyResult
		if err := parseSingle(modelAnswer{text: text}, canon, []string{"billing", "shipping"}, &r); err == nil {
			t.Errorf("accepted %s as %+v", text, r)
		}
	}
	var r ClassifyResult
	if err := parseSingle(modelAnswer{text: "```json\n{\"label\": \" Billing\", \"confidence\": 0.7}\n```"}, canon, []string{"billing", "shipping"}, &r); err != nil || r.Label != "billing" {
		t.Errorf("fenced answer with odd case: %+v, %v", r, err)
	}
	for _, text := range []string{`{"score": 12}`, `{"score": "7"}`, `{"rating": 7}`} {
		if _, err := digitScore(modelAnswer{text: text}, "score"); err == nil {
			t.Errorf("accepted %s", text)
		}
	}
	if s, err := digitScore(modelAnswer{text: `{"score": 4.5}`}, "score"); err != nil || !near(s, 0.5) {
		t.Errorf("stated 4.5 gave %v, %v", s, err)
	}
}

func TestLLMRequestIsValidJSON(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{})
	if _, err := e.Tag(ctx, TagRequest{Text: `quote " and \ backslash`, Tags: []string{`a "b"`}}); err != nil {
		t.Fatal(err)
	}
	if body := s.Requests()[0].Body; !json.Valid(body) {
		t.Errorf("request is not JSON: %s", body)
	}
}
