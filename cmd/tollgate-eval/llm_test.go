package main

import (
	"context"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// evalUpstream is the demo upstream's model: it answers from the lexical
// engine's view, so the llm engine's answers are known.
func evalUpstream(t *testing.T, o proxytest.Options) *proxytest.Server {
	o.Reply = classifiers.NewViewModel(classifiers.NewLexical()).Reply
	o.PromptTokens, o.CompletionTokens = 30, 2
	s := proxytest.NewServer(o)
	t.Cleanup(s.Close)
	t.Setenv("TOLLGATE_EVAL_LLM_URL", s.URL+"/")
	t.Setenv("TOLLGATE_EVAL_LLM_KEY", "sk-eval")
	t.Setenv("TOLLGATE_EVAL_LLM_MODEL", "some-model")
	return s
}

var evalItems = []classifiers.ClassifyRequest{
	{Text: "I was charged twice for my plan", Labels: []string{"billing", "shipping"}, Mode: classifiers.ModeSingle,
		Descriptions: map[string]string{"billing": "charges, refunds, plans", "shipping": "parcels and delivery"}},
	{Text: "My parcel never arrived", Labels: []string{"billing", "shipping"}, Mode: classifiers.ModeSingle,
		Descriptions: map[string]string{"billing": "charges, refunds, plans", "shipping": "parcels and delivery"}},
}

func TestLLMEngineFromEnvCallsTheUpstream(t *testing.T) {
	s := evalUpstream(t, proxytest.Options{})
	e, err := llmEngineFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Classify(context.Background(), evalItems[1])
	if err != nil || res.Label != "shipping" || res.Engine != "llm" || res.Model != "some-model" || res.Usage.TotalTokens != 32 {
		t.Fatalf("classify %+v, %v", res, err)
	}
	reqs := s.Requests()
	if len(reqs) != 1 || reqs[0].Header.Get("Authorization") != "Bearer sk-eval" || reqs[0].Path != "/v1/chat/completions" {
		t.Fatalf("requests %+v", reqs)
	}
	if got := e.(*evalLLM).Summary(); !strings.Contains(got, "some-model") || !strings.Contains(got, "1 calls, 30 prompt + 2 completion tokens") {
		t.Errorf("summary %q", got)
	}
	line, err := llmCalibration(context.Background(), e, evalItems, []string{"billing", "shipping"})
	if err != nil || !strings.Contains(line, "on 2 dev items: temperature") {
		t.Errorf("calibration %q, %v", line, err)
	}
}

func TestLLMEngineFromEnvRefusesWhatItCannotUse(t *testing.T) {
	evalUpstream(t, proxytest.Options{NoLogprobs: true})
	e, err := llmEngineFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := llmCalibration(context.Background(), e, evalItems, []string{"billing", "shipping"}); err == nil || !strings.Contains(err.Error(), "no logprobs") {
		t.Errorf("calibration without logprobs: %v", err)
	}
	t.Setenv("TOLLGATE_EVAL_LLM_TEMPERATURE", "-1")
	if _, err := llmEngineFromEnv(); err == nil || !strings.Contains(err.Error(), "TOLLGATE_EVAL_LLM_TEMPERATURE") {
		t.Errorf("negative temperature: %v", err)
	}
	t.Setenv("TOLLGATE_EVAL_LLM_MODEL", "")
	if _, err := llmEngineFromEnv(); err == nil || !strings.Contains(err.Error(), "TOLLGATE_EVAL_LLM_MODEL") {
		t.Errorf("no model: %v", err)
	}
}
