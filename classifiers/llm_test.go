package classifiers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/internal/utf8cut"
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
	u.CachedTokens = gjson.GetBytes(raw, "usage.prompt_tokens_details.cached_tokens").Int()
	u.ReasoningTokens = gjson.GetBytes(raw, "usage.completion_tokens_details.reasoning_tokens").Int()
	return raw, u, nil
}

// newLLM returns the llm engine talking over TCP to a fake upstream whose
// model answers from the lexical engine's view.
func newLLM(t *testing.T, o proxytest.Options) (Engine, *proxytest.Server) {
	t.Helper()
	o.Reply = NewViewModel(NewLexical()).Reply
	o.PromptTokens, o.CompletionTokens = 40, 9
	s := proxytest.NewServer(o)
	t.Cleanup(s.Close)
	return NewLLM(httpCaller{s.URL}, "catalog-model"), s
}

var oneCall = Usage{PromptTokens: 40, CompletionTokens: 9, TotalTokens: 49}

func near(a, b float64) bool { return math.Abs(a-b) < 2e-3 }

var supportRequest = ClassifyRequest{
	Text:         "Where is my parcel? The delivery is late.",
	Labels:       []string{"billing", "shipping", "account", "other"},
	Descriptions: map[string]string{"billing": "payments and refunds", "shipping": "delivery of orders, parcels"},
	Examples:     map[string][]string{"account": {"I cannot log in"}},
	TextType:     "customer support email",
	Mode:         ModeSingle,
}

// confidences maps label to confidence.
func confidences(s []LabelScore) map[string]float64 {
	m := make(map[string]float64, len(s))
	for _, x := range s {
		m[x.Label] = x.Confidence
	}
	return m
}

// TestIssue11LLMClassifyIsTheViewsAnswer: the demo upstream used to answer
// every classify with the first label at 0.8. Through the view model the
// llm engine gives the lexical engine's label and confidences, read from
// the log-probabilities of the labels' numbers.
func TestIssue11LLMClassifyIsTheViewsAnswer(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{})
	want, _ := NewLexical().Classify(ctx, supportRequest)
	r, err := e.Classify(ctx, supportRequest)
	if err != nil {
		t.Fatal(err)
	}
	if r.Label != "shipping" || r.Label != want.Label || !near(r.Confidence, want.Confidence) || r.Tie || r.NoLogprobs {
		t.Fatalf("llm %+v, lexical %+v", r, want)
	}
	got := confidences(r.Scores)
	for _, w := range want.Scores {
		if !near(got[w.Label], w.Confidence) {
			t.Errorf("%s: llm %.4f, lexical %.4f", w.Label, got[w.Label], w.Confidence)
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
		"model": "catalog-model", "logprobs": "true", "top_logprobs": "20", "temperature": "0",
		"max_tokens": "4", "messages.1.content": supportRequest.Text, "response_format": "",
	} {
		if got := gjson.Get(body, path).String(); got != want {
			t.Errorf("request %s = %q, want %q", path, got, want)
		}
	}
	system := gjson.Get(body, "messages.0.content").String()
	for _, want := range []string{PromptMarker + " classify\n", "\n1. \"billing\": payments and refunds\n", "\n2. \"shipping\"", "\n3. \"account\"\n   example: \"I cannot log in\"\n", "customer support email", formatCode} {
		if !strings.Contains(system, want) {
			t.Errorf("system prompt lacks %q:\n%s", want, system)
		}
	}
}

// manyLabels is n labels; label i is described by its own word, and the
// text names label 137's word.
func manyLabels(n int) ClassifyRequest {
	req := ClassifyRequest{Mode: ModeSingle, Descriptions: map[string]string{}, Text: "The parcel with the zebra137 figurine arrived broken."}
	for i := 0; i < n; i++ {
		l := fmt.Sprintf("topic-%03d", i)
		req.Labels = append(req.Labels, l)
		req.Descriptions[l] = fmt.Sprintf("texts about zebra%d", i)
	}
	return req
}

func TestLLMClassify150LabelsFromTop20(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{})
	req := manyLabels(150)
	want, _ := NewLexical().Classify(ctx, req)
	r, err := e.Classify(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if r.Label != want.Label || r.Label != "topic-137" || len(r.Scores) != 150 {
		t.Fatalf("llm %s %.4f (%d scores), lexical %s %.4f", r.Label, r.Confidence, len(r.Scores), want.Label, want.Confidence)
	}
	// The numbers are 100 to 249, one width, so no number begins another.
	system := gjson.GetBytes(s.Requests()[0].Body, "messages.0.content").String()
	if !strings.Contains(system, "\n100. \"topic-000\"") || !strings.Contains(system, "\n249. \"topic-149\"") {
		t.Errorf("labels are not numbered 100 to 249:\n%s", utf8cut.Shorten(system, 400))
	}
	// The 20 labels shown carry the view's probabilities; the 130 others
	// share what is left, at most the 20th's each; the sum is 1 up to the
	// rounding of 150 confidences.
	var sum float64
	for _, sc := range r.Scores {
		sum += sc.Confidence
	}
	if math.Abs(sum-1) > 0.01 || !near(r.Confidence, want.Confidence) {
		t.Errorf("confidences sum to %.4f; top %.4f, lexical %.4f", sum, r.Confidence, want.Confidence)
	}
	if twentieth, last := r.Scores[19].Confidence, r.Scores[149].Confidence; last > twentieth {
		t.Errorf("a label outside the top 20 has %.4f, more than the 20th's %.4f", last, twentieth)
	}
}

// TestLLMWithoutLogprobsInventsNoConfidence: the model's label is kept,
// every label gets 1/n and the answer says there were no logprobs.
func TestLLMWithoutLogprobsInventsNoConfidence(t *testing.T) {
	e, _ := newLLM(t, proxytest.Options{NoLogprobs: true})
	r, err := e.Classify(ctx, supportRequest)
	if err != nil {
		t.Fatal(err)
	}
	if r.Label != "shipping" || r.Confidence != 0.25 || !r.NoLogprobs || r.Scores[0].Label != "shipping" {
		t.Fatalf("result %+v", r)
	}
	for _, sc := range r.Scores {
		if sc.Confidence != 0.25 {
			t.Errorf("score %+v, want 1/4", sc)
		}
	}
	m, err := e.Classify(ctx, ClassifyRequest{Text: "refund for the parcel delivery", Labels: []string{"billing", "shipping", "account"},
		Descriptions: supportRequest.Descriptions, Mode: ModeMulti, Threshold: 0.9})
	if err != nil || !m.NoLogprobs || len(m.Labels) == 0 || m.Labels[0].Confidence != 0.5 {
		t.Errorf("multi without logprobs: %+v, %v; want the model's yes labels at 0.5", m, err)
	}
	sc, err := e.Score(ctx, ScoreRequest{Source: "URGENT: the server is down!", Attribute: "urgency"})
	want, _ := NewLexical().Score(ctx, ScoreRequest{Source: "URGENT: the server is down!", Attribute: "urgency"})
	if err != nil || !sc.NoLogprobs || math.Abs(sc.Score-want.Score) > 1.0/18+1e-3 || math.Abs(sc.Score*9-math.Round(sc.Score*9)) > 1e-3 {
		// Scores are rounded to 4 decimals, so 8/9 comes back as 0.8889.
		t.Errorf("score without logprobs %+v, %v; want the nearest digit to lexical's %.4f, over 9", sc, err, want.Score)
	}
}

func TestLLMRetriesOnceOnUnparseableOutput(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{BadAnswerTimes: 1})
	r, err := e.Classify(ctx, supportRequest)
	if err != nil {
		t.Fatal(err)
	}
	if r.Label != "shipping" || r.NoLogprobs {
		t.Errorf("result %+v", r)
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
		!strings.Contains(retry.Get("3.content").String(), "not valid") || !strings.Contains(retry.Get("3.content").String(), formatCode) {
		t.Errorf("retry messages %s", retry.Raw)
	}
}

// TestLLMUsageKeepsCachedAndReasoningTokens: the engine summed only
// prompt and completion tokens, so the part of the prompt its upstream
// had cached was billed at the full prompt price and recorded as none.
func TestLLMUsageKeepsCachedAndReasoningTokens(t *testing.T) {
	e, _ := newLLM(t, proxytest.Options{BadAnswerTimes: 1, CachedTokens: 30, ReasoningTokens: 4})
	r, err := e.Classify(ctx, supportRequest)
	if err != nil {
		t.Fatal(err)
	}
	want := Usage{PromptTokens: 80, CompletionTokens: 18, TotalTokens: 98, CachedTokens: 60, ReasoningTokens: 8}
	if r.Usage != want {
		t.Errorf("usage %+v, want both calls' %+v", r.Usage, want)
	}
	if both := r.Usage.Plus(oneCall); both.CachedTokens != 60 || both.ReasoningTokens != 8 {
		t.Errorf("%+v plus %+v is %+v: the parts are lost", r.Usage, oneCall, both)
	}
	if c := r.Usage.Catalog(); c.CachedTokens != 60 || c.ReasoningTokens != 8 || c.PromptTokens != 80 || c.CompletionTokens != 18 {
		t.Errorf("priced as %+v", c)
	}
}

func TestLLMGivesUpAfterTheSecondUnparseableOutput(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{BadAnswerTimes: 2})
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

// TestIssue11LLMScoreAndMatchAreExpectedDigits: the demo upstream used to
// give every score and match 0.6778; now the expected digit over the
// digit log-probabilities, divided by 9, is the view's score.
func TestIssue11LLMScoreAndMatchAreExpectedDigits(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{})
	lex := NewLexical()
	scores := map[float64]bool{}
	for _, req := range []ScoreRequest{
		{Source: "URGENT: production is down, customers cannot pay!", Attribute: "urgency"},
		{Source: "Whenever you have time, no rush.", Attribute: "urgency"},
		{Source: "You are an idiot and I hate you.", Attribute: "toxicity"},
		{Source: "I love this, thank you so much!", Attribute: "politeness", Description: "how polite and kind the text is"},
	} {
		want, _ := lex.Score(ctx, req)
		r, err := e.Score(ctx, req)
		if err != nil || !near(r.Score, want.Score) || r.NoLogprobs || r.Usage != oneCall {
			t.Errorf("%+v: llm %+v, %v; lexical %.4f", req, r, err, want.Score)
		}
		scores[r.Score] = true
	}
	if len(scores) < 3 {
		t.Errorf("scores %v: the texts should not all score alike", scores)
	}
	if sys := gjson.GetBytes(s.Requests()[0].Body, "messages.0.content").String(); !strings.Contains(sys, "urgently") || !strings.Contains(sys, formatDigit) {
		t.Errorf("the common attribute's meaning is not in the prompt:\n%s", sys)
	}
	for _, req := range []MatchRequest{
		{Source: "Refunds are issued within 5 days of the request.", Query: "how long do refunds take"},
		{Source: "Preheat the oven to 200 degrees.", Query: "how long do refunds take"},
	} {
		want, _ := lex.Match(ctx, req)
		r, err := e.Match(ctx, req)
		if err != nil || !near(r.Score, want.Score) {
			t.Errorf("%+v: llm %+v, %v; lexical %.4f", req, r, err, want.Score)
		}
	}
}

func TestLLMMultiAndTagsAgreeWithTheView(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{})
	lex := NewLexical()
	req := ClassifyRequest{Text: "My parcel arrived broken and I want a refund of the payment.", Labels: []string{"billing", "shipping", "account"},
		Descriptions: supportRequest.Descriptions, Mode: ModeMulti, Threshold: 0.5}
	want, _ := lex.Classify(ctx, req)
	r, err := e.Classify(ctx, req)
	if err != nil || fmt.Sprint(r.Labels) != fmt.Sprint(want.Labels) || len(r.Labels) == 0 || len(r.Scores) != 3 || r.Label != "" {
		t.Errorf("multi: llm %+v, %v; lexical %+v", r, err, want)
	}
	if sys := gjson.GetBytes(s.Requests()[0].Body, "messages.0.content").String(); !strings.Contains(sys, formatYesNo) {
		t.Errorf("multi prompt:\n%s", sys)
	}
	treq := TagRequest{Text: "Rust and Go are fast; Go compiles quickly.", Tags: []string{"go", "rust", "java"}, Threshold: DefaultTagThreshold}
	wantTags, _ := lex.Tag(ctx, treq)
	tg, err := e.Tag(ctx, treq)
	if err != nil || fmt.Sprint(tg.Tags) != fmt.Sprint(wantTags.Tags) || len(tg.Tags) != 2 {
		t.Errorf("closed tags: llm %+v, %v; lexical %+v", tg.Tags, err, wantTags.Tags)
	}
	oreq := TagRequest{Text: "The export button does nothing on Safari; the export fails silently.", MaxTags: 3}
	wantOpen, _ := lex.Tag(ctx, oreq)
	tg, err = e.Tag(ctx, oreq)
	if err != nil || fmt.Sprint(tg.Tags) != fmt.Sprint(wantOpen.Tags) || len(tg.Tags) == 0 {
		t.Errorf("open tags: llm %+v, %v; lexical %+v", tg.Tags, err, wantOpen.Tags)
	}
}

// TestLLMMultiAtThresholdZeroAnswersNoLabelWithoutEvidence: through the
// demo upstream, multi mode and closed tags at threshold 0 answered every
// label ("zzqx blorf" → gamma, beta and alpha at 0.0392), where the
// offline engine behind it answers none: the view model gave each label
// the offline engine's floor as P(yes), and the llm engine kept every
// label at or above 0. The view now says no, surely, to a label it has no
// evidence for, and the llm engine keeps no label the model gives no
// probability.
func TestLLMMultiAtThresholdZeroAnswersNoLabelWithoutEvidence(t *testing.T) {
	e, _ := newLLM(t, proxytest.Options{})
	lex := NewLexical()
	for _, threshold := range []float64{0, 0.01} {
		req := ClassifyRequest{Text: "zzqx blorf", Labels: []string{"gamma", "beta", "alpha"}, Mode: ModeMulti, Threshold: threshold}
		want, _ := lex.Classify(ctx, req)
		r, err := e.Classify(ctx, req)
		if err != nil || len(want.Labels) != 0 || len(r.Labels) != 0 || len(r.Scores) != 3 {
			t.Errorf("multi at %v: llm %+v, %v; lexical %+v", threshold, r.Labels, err, want.Labels)
		}
		tg, err := e.Tag(ctx, TagRequest{Text: req.Text, Tags: req.Labels, Threshold: threshold})
		if err != nil || len(tg.Tags) != 0 {
			t.Errorf("closed tags at %v: llm %+v, %v", threshold, tg.Tags, err)
		}
	}
	// A label with evidence is still answered at threshold 0.
	req := ClassifyRequest{Text: "My parcel arrived broken and I want a refund of the payment.", Labels: []string{"billing", "shipping", "account"},
		Descriptions: supportRequest.Descriptions, Mode: ModeMulti}
	want, _ := lex.Classify(ctx, req)
	r, err := e.Classify(ctx, req)
	if err != nil || fmt.Sprint(r.Labels) != fmt.Sprint(want.Labels) || len(r.Labels) == 0 || len(r.Labels) == 3 {
		t.Errorf("multi at 0 with evidence: llm %+v, %v; lexical %+v", r.Labels, err, want.Labels)
	}
}

// A model's P(yes) is its own evidence, and threshold 0 keeps every label
// it gives any; one it gives none (0 to four decimals) is not answered.
func TestMultiScoresKeepNoLabelOfProbabilityZero(t *testing.T) {
	_, matched := multiScores([]string{"a", "b"}, []float64{0.00004, 0.2}, []bool{false, false}, 0)
	if fmt.Sprint(matched) != "[{b 0.2}]" {
		t.Errorf("matched %v, want b alone", matched)
	}
}
func TestLLMRequestIsValidJSON(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{})
	tags := []string{`a "b"`, "line\nbreak"}
	if _, err := e.Tag(ctx, TagRequest{Text: `quote " and \ backslash`, Tags: tags}); err != nil {
		t.Fatal(err)
	}
	body := s.Requests()[0].Body
	if !json.Valid(body) {
		t.Errorf("request is not JSON: %s", body)
	}
	// The view model reads the labels back as they were sent.
	if got := parseNumbered(gjson.GetBytes(body, "messages.0.content").String()).Labels; fmt.Sprint(got) != fmt.Sprint(tags) {
		t.Errorf("labels read back as %q", got)
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

// tok is a token of probability p with alternatives (token, p, ...).
func tok(token string, p float64, alts ...any) tokenLogprob {
	t := tokenLogprob{Token: token, Logprob: math.Log(p)}
	for i := 0; i+1 < len(alts); i += 2 {
		t.TopLogprobs = append(t.TopLogprobs, altProb{alts[i].(string), math.Log(alts[i+1].(float64))})
	}
	return t
}

func wantDist(t *testing.T, name string, got []float64, want ...float64) {
	t.Helper()
	for i := range want {
		if !near(got[i], want[i]) {
			t.Errorf("%s: distribution %.4f, want %.4f", name, got, want)
			return
		}
	}
}

func TestCodeDistribution(t *testing.T) {
	four := labelCodes(4)
	// One token per number, after a newline token; "The" is not a label
	// number and is left out; label 4 was not shown and gets the rest,
	// capped at the least probable shown (0.05).
	ans := answer(tok("\n", 1), tok("2", 0.6, "2", 0.6, "1", 0.2, "The", 0.1, "3", 0.05))
	chosen, d, err := codeDistribution(ans, four)
	if err != nil || chosen != 1 {
		t.Fatalf("chosen %d, %v", chosen, err)
	}
	wantDist(t, "one token", d, 0.2/0.9, 0.6/0.9, 0.05/0.9, 0.05/0.9)

	// A tokenizer that splits numbers into digits, 12 labels numbered 10
	// to 21: the first digit's "2" stands for 20 and 21 (split evenly);
	// the second digit's alternatives are weighed by P("1").
	twelve := labelCodes(12)
	ans = answer(tok(" 1", 0.8, " 1", 0.8, " 2", 0.2), tok("3", 0.5, "3", 0.5, "4", 0.3, "0", 0.2))
	chosen, d, err = codeDistribution(ans, twelve)
	if err != nil || twelve[chosen] != "13" {
		t.Fatalf("chosen %s, %v", twelve[chosen], err)
	}
	wantDist(t, "digits", d, 0.8*0.2, 0, 0, 0.8*0.5, 0.8*0.3, 0, 0, 0, 0, 0, 0.1, 0.1)

	// Words before the number are not part of it.
	_, d, err = codeDistribution(answer(tok("Label", 1), tok(" 3", 0.9, " 3", 0.9, " 1", 0.1)), four)
	if err != nil {
		t.Fatal(err)
	}
	wantDist(t, "prose first", d, 0.1, 0, 0.9, 0)

	for _, bad := range []modelAnswer{
		{text: "the shipping one"},
		{text: "7"},
		answer(tok("1", 0.9)), // 12 labels are numbered from 10
	} {
		if _, _, err := codeDistribution(bad, twelve); err == nil {
			t.Errorf("accepted %q", bad.text)
		}
	}
}

func TestTemperatureAndItsFit(t *testing.T) {
	p := []float64{0.7, 0.2, 0.1}
	flat, sharp := temper(p, 2), temper(p, 0.5)
	if !(flat[0] < 0.7 && sharp[0] > 0.7) || !near(flat[0]+flat[1]+flat[2], 1) {
		t.Errorf("tempered %v %v", flat, sharp)
	}
	// A model that says 0.9 and is right 60% of the time is too sure:
	// the fit flattens it, and the NLL goes down.
	var dists [][]float64
	var gold []int
	for i := 0; i < 100; i++ {
		dists = append(dists, []float64{0.9, 0.05, 0.05})
		gold = append(gold, map[bool]int{true: 0, false: 1 + i%2}[i%10 < 6])
	}
	temp, before, after := FitTemperature(dists, gold)
	if temp <= 1 || after >= before {
		t.Errorf("fit t=%v, NLL %.3f -> %.3f", temp, before, after)
	}
	if got := temper([]float64{0.9, 0.05, 0.05}, temp)[0]; math.Abs(got-0.6) > 0.02 {
		t.Errorf("calibrated confidence %.3f, want the accuracy 0.6", got)
	}
}

func TestYesNoProbabilities(t *testing.T) {
	codes := labelCodes(2)
	ans := answer(tok("1", 1), tok(":", 1), tok(" yes", 0.7, " yes", 0.7, " no", 0.2), tok("\n", 1),
		tok("2", 1), tok(":", 1), tok(" no", 0.95, " no", 0.95))
	probs, said, err := yesNoProbabilities(ans, codes)
	if err != nil || !said[0] || said[1] {
		t.Fatalf("said %v, %v", said, err)
	}
	// Label 2's yes was not shown: at most the 0.05 left.
	if !near(probs[0], 0.7/0.9) || !near(probs[1], 0.05/1.0) {
		t.Errorf("P(yes) %v", probs)
	}
	if _, _, err := yesNoProbabilities(modelAnswer{text: "1: yes"}, codes); err == nil {
		t.Errorf("accepted an answer without label 2")
	}
}

// TestLLMMulti200LabelsInOneBoundedCall: one call answers every label,
// with max_tokens bounded by the yes/no lines' length.
func TestLLMMulti200LabelsInOneBoundedCall(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{})
	req := manyLabels(200)
	req.Mode, req.Threshold = ModeMulti, 0.5
	want, _ := NewLexical().Classify(ctx, req)
	r, err := e.Classify(ctx, req)
	if err != nil || len(r.Scores) != 200 || len(r.Labels) == 0 || fmt.Sprint(r.Labels) != fmt.Sprint(want.Labels) {
		t.Fatalf("llm %v, %v; lexical %v", r.Labels, err, want.Labels)
	}
	reqs := s.Requests()
	if len(reqs) != 1 || gjson.GetBytes(reqs[0].Body, "max_tokens").Int() != 200*yesNoPerLine+8 {
		t.Errorf("%d calls, max_tokens %d", len(reqs), gjson.GetBytes(reqs[0].Body, "max_tokens").Int())
	}
}

// TestLLMUpstreamRefusingLogprobsIsAskedWithout: an upstream that answers
// 400 to logprobs (as OpenAI's reasoning models do) still gets its answer
// used, flagged, instead of failing every request.
func TestLLMUpstreamRefusingLogprobsIsAskedWithout(t *testing.T) {
	view := NewViewModel(NewLexical())
	var calls atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		calls.Add(1)
		if gjson.GetBytes(body, "model").String() == "gone" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"the model gone does not exist","type":"invalid_request_error"}}`)
			return
		}
		if gjson.GetBytes(body, "logprobs").Exists() || gjson.GetBytes(body, "top_logprobs").Exists() {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"logprobs is not supported with this model","type":"invalid_request_error","param":"logprobs","code":"unsupported_parameter"}}`)
			return
		}
		content, _, _ := view.Reply(body)
		out, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"message": map[string]any{"content": content}}},
			"usage": map[string]any{"prompt_tokens": 40, "completion_tokens": 9}})
		_, _ = w.Write(out)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	e := NewLLM(httpCaller{"http://" + ln.Addr().String() + "/v1"}, "reasoning-model")
	r, err := e.Classify(ctx, supportRequest)
	if err != nil || r.Label != "shipping" || !r.NoLogprobs || r.Confidence != 0.25 {
		t.Fatalf("classify %+v, %v", r, err)
	}
	if calls.Load() != 2 || r.Usage.TotalTokens != oneCall.TotalTokens {
		t.Errorf("%d calls, usage %+v: want the refusal and one answer", calls.Load(), r.Usage)
	}
	// Other 400s are not retried.
	_, err = NewLLM(httpCaller{"http://" + ln.Addr().String() + "/v1"}, "gone").Score(ctx, ScoreRequest{Source: "x", Attribute: "urgency"})
	if err == nil || !strings.Contains(err.Error(), "does not exist") || calls.Load() != 3 {
		t.Errorf("err %v after %d calls", err, calls.Load())
	}
}

// A digit inside a word is no answer: a model (or a fake) that says
// "tok0 tok1 …" gets asked again or replaced by the offline engine, never
// read as a confident 0.
func TestLLMDigitsInsideWordsAreNoAnswer(t *testing.T) {
	for _, text := range []string{"tok0 tok1 tok2", "gpt4", "v2_3"} {
		if s, err := digitScore(modelAnswer{text: text}); err == nil {
			t.Errorf("score of %q = %v; want an error", text, s)
		}
		if k, err := parsedCode(text, []string{"1", "2"}); err == nil {
			t.Errorf("label of %q = %d; want an error", text, k)
		}
	}
	for text, want := range map[string]float64{"7": round4(7.0 / 9), "Score: 3": round4(3.0 / 9), "\n9.": 1} {
		if s, err := digitScore(modelAnswer{text: text}); err != nil || s != want {
			t.Errorf("score of %q = %v, %v; want %v", text, s, err, want)
		}
	}
	if k, err := parsedCode("Label 2", []string{"1", "2"}); err != nil || k != 1 {
		t.Errorf(`"Label 2" read as %d, %v; want the second label`, k, err)
	}
}

// TestLLMAsksAgainWithoutLogprobsWhenRefused: a model that answers 400 to
// logprobs is asked again without them, and the engine says so to
// LogprobsRefused; with NoLogprobs it is never asked for them.
func TestLLMAsksAgainWithoutLogprobsWhenRefused(t *testing.T) {
	s := proxytest.NewServer(proxytest.Options{Reply: NewViewModel(NewLexical()).Reply, RefuseLogprobs: true})
	t.Cleanup(s.Close)
	told := 0
	e := NewLLMWith(httpCaller{s.URL}, "catalog-model", LLMOptions{LogprobsRefused: func() { told++ }})
	r, err := e.Classify(ctx, supportRequest)
	if err != nil || !r.NoLogprobs || r.Label != "shipping" || told != 1 || len(s.Requests()) != 2 {
		t.Fatalf("refused logprobs: %+v, %v; told %d, %d requests; want the label without logprobs after 2 requests, told once", r, err, told, len(s.Requests()))
	}
	e = NewLLMWith(httpCaller{s.URL}, "catalog-model", LLMOptions{NoLogprobs: true})
	if r, err = e.Classify(ctx, supportRequest); err != nil || !r.NoLogprobs || len(s.Requests()) != 3 {
		t.Fatalf("NoLogprobs: %+v, %v; %d requests, want one more", r, err, len(s.Requests()))
	}
	if last := s.Requests()[2].Body; strings.Contains(string(last), "logprobs") {
		t.Errorf("NoLogprobs sent %s", last)
	}
}

// An engine that serves many calls (a batch job's lines, an eval run)
// remembers the refusal itself: the calls after the first ask without
// logprobs at once.
func TestLLMOneEngineIsRefusedLogprobsOnce(t *testing.T) {
	s := proxytest.NewServer(proxytest.Options{Reply: NewViewModel(NewLexical()).Reply, RefuseLogprobs: true})
	t.Cleanup(s.Close)
	told := 0
	e := NewLLMWith(httpCaller{s.URL}, "catalog-model", LLMOptions{LogprobsRefused: func() { told++ }})
	for i := range 3 {
		if r, err := e.Classify(ctx, supportRequest); err != nil || !r.NoLogprobs || r.Label != "shipping" {
			t.Fatalf("call %d: %+v, %v", i, r, err)
		}
	}
	if n := len(s.Requests()); n != 4 || told != 1 {
		t.Errorf("3 calls made %d requests and told the refusal %d times; want 4 (one refused) and once", n, told)
	}
}

// An open-tags answer's prose lines ("Here are the tags:", a sentence)
// are not tags; an answer of nothing else is no answer.
func TestLineTagsSkipsProse(t *testing.T) {
	tags, err := lineTags(modelAnswer{text: "Here are the tags:\n- billing\n- double charge\nThe customer was charged twice for one order.\n"}, 5)
	if err != nil || len(tags) != 2 || tags[0].Label != "billing" || tags[1].Label != "double charge" {
		t.Fatalf("tags %+v, %v; want billing and double charge", tags, err)
	}
	if _, err := lineTags(modelAnswer{text: "tok0 tok1 tok2 tok3 tok4 tok5 tok6"}, 5); err == nil {
		t.Error("a line of prose was taken for a tag")
	}
}

// TestLLMPositiveLogprobsAreNoLogprobs: an upstream that sent logprob
// 1000 for the chosen token and its alternatives made probabilities of
// e^1000 = +Inf, confidences of Inf/Inf = NaN, and a classify answer the
// gateway could not encode (a 500, billed as a 200). Numbers that are no
// log-probabilities are read as none: the model's answer, placeholders
// and no_logprobs, as for an upstream that sends none.
func TestLLMPositiveLogprobsAreNoLogprobs(t *testing.T) {
	view := NewViewModel(NewLexical()).Reply
	anyLogprob := regexp.MustCompile(`"logprob":[-0-9.eE+]+`)
	s := proxytest.NewServer(proxytest.Options{PromptTokens: 40, CompletionTokens: 9,
		Reply: func(req []byte) (string, []byte, bool) {
			content, logprobs, ok := view(req)
			return content, anyLogprob.ReplaceAll(logprobs, []byte(`"logprob":1000`)), ok
		}})
	t.Cleanup(s.Close)
	e := NewLLM(httpCaller{s.URL}, "catalog-model")
	encodes := func(what string, v any) {
		t.Helper()
		if _, err := json.Marshal(v); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	single, err := e.Classify(ctx, supportRequest)
	if err != nil || !single.NoLogprobs || single.Label != "shipping" || single.Confidence != 0.25 {
		t.Errorf("single: %+v, %v; want shipping at 1/4, no logprobs", single, err)
	}
	encodes("single", single)
	multi, err := e.Classify(ctx, ClassifyRequest{Text: supportRequest.Text, Labels: supportRequest.Labels, Mode: ModeMulti, Threshold: 0.5})
	if err != nil || !multi.NoLogprobs {
		t.Errorf("multi: %+v, %v; want no logprobs", multi, err)
	}
	encodes("multi", multi)
	tags, err := e.Tag(ctx, TagRequest{Text: supportRequest.Text})
	if err != nil || !tags.NoLogprobs {
		t.Errorf("open tags: %+v, %v; want no logprobs", tags, err)
	}
	encodes("open tags", tags)
	sc, err := e.Score(ctx, ScoreRequest{Source: "URGENT: the server is down!", Attribute: "urgency"})
	if err != nil || !sc.NoLogprobs || math.IsNaN(sc.Score) {
		t.Errorf("score: %+v, %v; want the digit over 9, no logprobs", sc, err)
	}
}

// TestReadAnswerLogprobs: logprobs above 0 by more than rounding are
// dropped; a rounding error's tiny positive one counts as 0.
func TestReadAnswerLogprobs(t *testing.T) {
	answer := func(lp, alt string) string {
		return `{"choices":[{"message":{"content":"2"},"logprobs":{"content":[{"token":"2","logprob":` + lp +
			`,"top_logprobs":[{"token":"2","logprob":` + lp + `},{"token":"1","logprob":` + alt + `}]}]}}]}`
	}
	if a := readAnswer([]byte(answer("1000", "-3"))); a.logprobs != nil || a.text != "2" {
		t.Errorf("logprob 1000 kept: %+v", a)
	}
	if a := readAnswer([]byte(answer("-0.1", "0.5"))); a.logprobs != nil {
		t.Errorf("an alternative's logprob 0.5 kept: %+v", a)
	}
	a := readAnswer([]byte(answer("1e-9", "-3")))
	if a.logprobs == nil || a.logprobs[0].Logprob != 0 || a.logprobs[0].TopLogprobs[0].Logprob != 0 || a.logprobs[0].TopLogprobs[1].Logprob != -3 {
		t.Errorf("rounding error not read as 0: %+v", a)
	}
}

// TestLLMUnderflowingLogprobsAreNoLogprobs: logprobs of -1000 (a broken
// server's) are log-probabilities, but every e^-1000 is 0: the label
// distribution summed to 0, and 0/0 made the classify answer a NaN the
// gateway could not encode, a 500 that billed the model's tokens.
func TestLLMUnderflowingLogprobsAreNoLogprobs(t *testing.T) {
	view := NewViewModel(NewLexical()).Reply
	anyLogprob := regexp.MustCompile(`"logprob":[-0-9.eE+]+`)
	s := proxytest.NewServer(proxytest.Options{PromptTokens: 40, CompletionTokens: 9,
		Reply: func(req []byte) (string, []byte, bool) {
			content, logprobs, ok := view(req)
			return content, anyLogprob.ReplaceAll(logprobs, []byte(`"logprob":-1000`)), ok
		}})
	t.Cleanup(s.Close)
	e := NewLLM(httpCaller{s.URL}, "catalog-model")
	single, err := e.Classify(ctx, supportRequest)
	if err != nil || !single.NoLogprobs || single.Label != "shipping" {
		t.Errorf("single: %+v, %v; want shipping, no logprobs", single, err)
	}
	for what, v := range map[string]any{"single": single} {
		if _, err := json.Marshal(v); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	multi, err := e.Classify(ctx, ClassifyRequest{Text: supportRequest.Text, Labels: supportRequest.Labels, Mode: ModeMulti, Threshold: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := json.Marshal(multi); err != nil {
		t.Errorf("multi: %v", err)
	}
}

// TestLLMOpenTagsNoneIsNoTags: asked for open tags, the model had no way
// to say there are none, and its "none" was read as a tag: "???" was
// tagged "none" at 0.9999 where the offline engine tags nothing. The
// prompt says how to answer no tags, and that answer is no tags.
func TestLLMOpenTagsNoneIsNoTags(t *testing.T) {
	e, s := newLLM(t, proxytest.Options{})
	r, err := e.Tag(ctx, TagRequest{Text: "???", MaxTags: 5})
	if err != nil || r.Tags == nil || len(r.Tags) != 0 {
		t.Fatalf("open tags of %q: %+v, %v; want none", "???", r.Tags, err)
	}
	if n := len(s.Requests()); n != 1 {
		t.Errorf("%d requests, want 1: the answer none is an answer", n)
	}
	system := gjson.GetBytes(s.Requests()[0].Body, "messages.0.content").String()
	if !strings.Contains(system, "none") {
		t.Errorf("the prompt does not say how to answer no tags: %q", system)
	}
	for _, text := range []string{"none", "None.", "N/A", " NONE \n", "No tags."} {
		tags, err := lineTags(modelAnswer{text: text}, 5)
		if err != nil || len(tags) != 0 {
			t.Errorf("answer %q: tags %+v, %v; want none", text, tags, err)
		}
	}
	tags, err := lineTags(modelAnswer{text: "refund\nnone\n"}, 5)
	if err != nil || len(tags) != 1 || tags[0].Label != "refund" {
		t.Errorf("answer refund, none: tags %+v, %v; want refund alone", tags, err)
	}
}
