package main

// The llm engine in the evaluation: it calls an OpenAI-compatible upstream
// directly (no gateway), so a real model can be measured the day one is at
// hand, with the same tables as the offline engines:
//
//	TOLLGATE_EVAL_LLM_URL=http://127.0.0.1:8001/v1 \
//	TOLLGATE_EVAL_LLM_MODEL=Qwen/Qwen2.5-7B-Instruct make eval ...
//
// TOLLGATE_EVAL_LLM_KEY is sent as a bearer token when set;
// TOLLGATE_EVAL_LLM_TOP_LOGPROBS (default 20, OpenAI's cap) and
// TOLLGATE_EVAL_LLM_TEMPERATURE (the calibration temperature, default
// classifiers.LLMTemperature) tune the engine. The demo upstream (make
// demo-upstream) answers from the lexical engine's view, so pointed at it
// the table is lexical's, which checks the wiring and nothing else.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/classifiers"
)

// llmTimeout bounds one call: a loaded server answering a few tokens.
const llmTimeout = 2 * time.Minute

// llmEngineFromEnv builds the llm engine from the TOLLGATE_EVAL_LLM_*
// variables; URL and MODEL are required.
func llmEngineFromEnv() (classifiers.Engine, error) {
	c := &evalCaller{
		url:    strings.TrimRight(os.Getenv("TOLLGATE_EVAL_LLM_URL"), "/"),
		key:    os.Getenv("TOLLGATE_EVAL_LLM_KEY"),
		client: &http.Client{Timeout: llmTimeout},
	}
	model := os.Getenv("TOLLGATE_EVAL_LLM_MODEL")
	if c.url == "" || model == "" {
		return nil, errors.New("the llm engine needs TOLLGATE_EVAL_LLM_URL (an OpenAI-compatible base URL ending in /v1) and TOLLGATE_EVAL_LLM_MODEL (the upstream's model id); TOLLGATE_EVAL_LLM_KEY is optional")
	}
	var o classifiers.LLMOptions
	for _, v := range []struct {
		name string
		set  func(float64)
	}{
		{"TOLLGATE_EVAL_LLM_TOP_LOGPROBS", func(x float64) { o.TopLogprobs = int(x) }},
		{"TOLLGATE_EVAL_LLM_TEMPERATURE", func(x float64) { o.Temperature = x }},
	} {
		s := os.Getenv(v.name)
		if s == "" {
			continue
		}
		x, err := strconv.ParseFloat(s, 64)
		if err != nil || x <= 0 {
			return nil, fmt.Errorf("%s=%q: want a positive number", v.name, s)
		}
		v.set(x)
	}
	return &evalLLM{Engine: classifiers.NewLLMWith(c, model, o), caller: c, model: model}, nil
}

// evalLLM is the engine with the caller's totals, for a line after the
// tables (Summary).
type evalLLM struct {
	classifiers.Engine
	caller *evalCaller
	model  string
}

// Summary says what the run cost at the upstream.
func (e *evalLLM) Summary() string {
	calls, u := e.caller.totals()
	return fmt.Sprintf("llm: model %s at %s: %d calls, %d prompt + %d completion tokens", e.model, e.caller.url, calls, u.PromptTokens, u.CompletionTokens)
}

// evalCaller is a classifiers.ModelCaller posting to one upstream.
type evalCaller struct {
	url, key string
	client   *http.Client

	mu    sync.Mutex
	calls int
	usage catalog.Usage
}

func (c *evalCaller) CallModel(ctx context.Context, model string, body []byte) ([]byte, catalog.Usage, error) {
	var u catalog.Usage
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, u, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, u, fmt.Errorf("calling %s: %w", c.url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, u, fmt.Errorf("reading the answer of %s: %w", c.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, u, fmt.Errorf("%s answered %d: %s", c.url, resp.StatusCode, bytes.TrimSpace(raw[:min(len(raw), 300)]))
	}
	u.PromptTokens = gjson.GetBytes(raw, "usage.prompt_tokens").Int()
	u.CompletionTokens = gjson.GetBytes(raw, "usage.completion_tokens").Int()
	c.mu.Lock()
	c.calls++
	c.usage.PromptTokens += u.PromptTokens
	c.usage.CompletionTokens += u.CompletionTokens
	c.mu.Unlock()
	return raw, u, nil
}

func (c *evalCaller) totals() (int, catalog.Usage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls, c.usage
}

// llmCalibration classifies the dev items (single mode) and fits the
// calibration temperature to their gold labels (classifiers.FitTemperature),
// returning the line to print. Run it on the dev part only, with the
// engine at temperature 1, and write the result into
// classifiers.LLMTemperature.
func llmCalibration(ctx context.Context, e classifiers.Engine, reqs []classifiers.ClassifyRequest, gold []string) (string, error) {
	var dists [][]float64
	var golds []int
	for i, req := range reqs {
		res, err := e.Classify(ctx, req)
		if err != nil {
			return "", fmt.Errorf("classify %q: %w", req.Text, err)
		}
		if res.NoLogprobs {
			return "", errors.New("the upstream returns no logprobs: there is nothing to calibrate")
		}
		conf := make(map[string]float64, len(res.Scores))
		for _, s := range res.Scores {
			conf[s.Label] = s.Confidence
		}
		d := make([]float64, len(req.Labels))
		g := -1
		for k, l := range req.Labels {
			d[k] = conf[l]
			if l == gold[i] {
				g = k
			}
		}
		if g < 0 {
			return "", fmt.Errorf("gold label %q of %q is not among its labels", gold[i], req.Text)
		}
		dists, golds = append(dists, d), append(golds, g)
	}
	t, before, after := classifiers.FitTemperature(dists, golds)
	return fmt.Sprintf("llm calibration on %d dev items: temperature %.4g (mean NLL %.4f at 1, %.4f at %.4g)", len(dists), t, before, after, t), nil
}
