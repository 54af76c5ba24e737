package plugins_test

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
)

// demoRequests are classify, tag, score and match calls with n labels (or
// tags); the text names label 1's words when n is 2, label 137's when 150.
func demoRequests(n int) map[string]string {
	labels, tags := make([]string, n), make([]string, n)
	desc := map[string]string{}
	for i := range labels {
		labels[i] = fmt.Sprintf("topic-%03d", i)
		tags[i] = fmt.Sprintf("zebra%03d", i)
		desc[labels[i]] = fmt.Sprintf("texts about the zebra%03d figurine", i)
	}
	target := map[int]int{2: 1, 150: 137}[n]
	text := fmt.Sprintf("The parcel with the zebra%03d figurine arrived broken, please help.", target)
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	return map[string]string{
		"classify": fmt.Sprintf(`{"text": %s, "labels": %s, "descriptions": %s}`, js(text), js(labels), js(desc)),
		"multi":    fmt.Sprintf(`{"text": %s, "labels": %s, "descriptions": %s, "mode": "multi"}`, js(text), js(labels), js(desc)),
		"tag":      fmt.Sprintf(`{"text": %s, "tags": %s}`, js(text), js(tags)),
		"score":    `{"source": "URGENT: the parcel service is down and customers cannot pay!", "attribute": "urgency"}`,
		"match":    `{"source": "Refunds are issued within 5 days of the request.", "query": "how long do refunds take?"}`,
	}
}

// withModel adds "model" to a JSON object body.
func withModel(body, model string) string {
	return strings.TrimSuffix(body, "}") + `, "model": "` + model + `"}`
}

// TestIssue11DemoAnswersAreTheOfflineEngines drives every endpoint through
// the gateway's llm engine against the fake upstream as `make
// demo-upstream` runs it (its model answers from the lexical engine's
// view, with log-probabilities), and checks that the answers are the
// lexical engine's, asked through the same gateway, for 2 and 150 labels.
// Before, every classify came back with the first label at 0.8 and every
// score at 0.6778.
func TestIssue11DemoAnswersAreTheOfflineEngines(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: llm\n  llm_model: small"})
	paths := map[string]string{"classify": "/v1/classify", "multi": "/v1/classify", "tag": "/v1/tag", "score": "/v1/score", "match": "/v1/match"}
	for _, n := range []int{2, 150} {
		for kind, body := range demoRequests(n) {
			llm := h.keyed(paths[kind], body).ok(t)
			lex := h.keyed(paths[kind], withModel(body, "lexical")).ok(t)
			if llm["engine"] != "llm" || llm["model"] != "small" || lex["engine"] != "lexical" || llm["no_logprobs"] != nil {
				t.Fatalf("%d labels, %s: engines %v/%v, %v", n, kind, llm["engine"], llm["model"], lex["engine"])
			}
			if u := llm["usage"].(map[string]any); u["completion_tokens"].(float64) == 0 {
				t.Errorf("%d labels, %s: usage %v is not the upstream's", n, kind, u)
			}
			// Not the first label: the old fake model's answer cannot pass.
			if want := map[int]string{2: "topic-001", 150: "topic-137"}[n]; kind == "classify" && lex["label"] != want {
				t.Fatalf("%d labels: lexical chose %v, want %s", n, lex["label"], want)
			}
			agree(t, fmt.Sprintf("%d labels, %s", n, kind), llm, lex)
		}
	}
}

// agree compares what the llm and the lexical engine answered.
func agree(t *testing.T, what string, llm, lex map[string]any) {
	t.Helper()
	near := func(a, b any) bool { return math.Abs(a.(float64)-b.(float64)) < 2e-3 }
	switch {
	case llm["score"] != nil:
		if !near(llm["score"], lex["score"]) {
			t.Errorf("%s: llm %v, lexical %v", what, llm["score"], lex["score"])
		}
	case llm["tags"] != nil:
		if fmt.Sprint(llm["tags"]) != fmt.Sprint(lex["tags"]) || len(llm["tags"].([]any)) == 0 {
			t.Errorf("%s: llm %v, lexical %v", what, llm["tags"], lex["tags"])
		}
	case llm["mode"] == "multi":
		if fmt.Sprint(llm["labels"]) != fmt.Sprint(lex["labels"]) || len(llm["labels"].([]any)) == 0 {
			t.Errorf("%s: llm %v, lexical %v", what, llm["labels"], lex["labels"])
		}
	default:
		if llm["label"] != lex["label"] || !near(llm["confidence"], lex["confidence"]) || llm["tie"] != nil {
			t.Errorf("%s: llm %v %v, lexical %v %v", what, llm["label"], llm["confidence"], lex["label"], lex["confidence"])
		}
	}
}

// TestDemoMultiAtThresholdZeroAgreesOnNoEvidence: multi mode and closed
// tags at threshold 0 through the demo upstream answered every label
// ("zzqx blorf" → gamma, beta and alpha at 0.0392) where the offline
// engine behind it answers [].
func TestDemoMultiAtThresholdZeroAgreesOnNoEvidence(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: llm\n  llm_model: small"})
	for path, body := range map[string]string{
		"/v1/classify": `{"text": "zzqx blorf", "labels": ["gamma", "beta", "alpha"], "mode": "multi", "threshold": 0}`,
		"/v1/tag":      `{"text": "zzqx blorf", "tags": ["gamma", "beta", "alpha"], "threshold": 0}`,
	} {
		llm := h.keyed(path, body).ok(t)
		lex := h.keyed(path, withModel(body, "lexical")).ok(t)
		field := map[string]string{"/v1/classify": "labels", "/v1/tag": "tags"}[path]
		if llm["engine"] != "llm" || fmt.Sprint(llm[field]) != "[]" || fmt.Sprint(lex[field]) != "[]" {
			t.Errorf("%s: llm %v %v, lexical %v", path, llm["engine"], llm[field], lex[field])
		}
	}
}

// TestDemoOpenTagsOfNothingAreNone: open tags of a text without a word,
// through the demo upstream, came back as the made-up tag "none" at
// 0.9999 (the model's way of saying none, read as a tag) where the
// offline engine behind it answers [].
func TestDemoOpenTagsOfNothingAreNone(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: auto\n  llm_model: small"})
	body := `{"text": "???"}`
	llm := h.keyed("/v1/tag", body).ok(t)
	lex := h.keyed("/v1/tag", withModel(body, "lexical")).ok(t)
	if llm["engine"] != "llm" || fmt.Sprint(llm["tags"]) != "[]" || fmt.Sprint(lex["tags"]) != "[]" {
		t.Errorf("open tags of %s: llm %v %v, lexical %v", body, llm["engine"], llm["tags"], lex["tags"])
	}
}
