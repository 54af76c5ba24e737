package proxytest

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"strings"
	"testing"
)

func classifierRequest(task, allowedLine, user string, logprobs bool) string {
	system := "tollgate-classifier: " + task + "\nYou are a classifier.\n" + allowedLine + "\nAnswer with JSON."
	req := map[string]any{
		"model":           "m",
		"messages":        []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
		"response_format": map[string]string{"type": "json_object"},
		"temperature":     0,
	}
	if logprobs {
		req["logprobs"] = true
		req["top_logprobs"] = 5
	}
	b, _ := json.Marshal(req)
	return string(b)
}

type logprobEntry struct {
	Token       string  `json:"token"`
	Logprob     float64 `json:"logprob"`
	Bytes       []int   `json:"bytes"`
	TopLogprobs []struct {
		Token   string  `json:"token"`
		Logprob float64 `json:"logprob"`
	} `json:"top_logprobs"`
}

type classifierBody struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Logprobs *struct {
			Content []logprobEntry `json:"content"`
		} `json:"logprobs"`
	} `json:"choices"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`
}

func askClassifier(t *testing.T, s *Server, body string) classifierBody {
	t.Helper()
	resp := post(t, context.Background(), s.URL+"/chat/completions", body)
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	var out classifierBody
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("body %s: %v", raw, err)
	}
	return out
}

func TestClassifierAnswerPicksLabelInTextWithLogprobs(t *testing.T) {
	s := newServer(t, Options{ClassifierAnswers: true})
	out := askClassifier(t, s, classifierRequest("classify", `Allowed labels: ["billing","shipping","other"]`, "Where is my SHIPPING label?", true))
	c := out.Choices[0]
	if c.Message.Content != `{"label": "shipping", "confidence": 0.9}` {
		t.Fatalf("content %q", c.Message.Content)
	}
	if c.Logprobs == nil {
		t.Fatal("no logprobs although the request asked for them")
	}
	var joined strings.Builder
	var labelTok *logprobEntry
	for i := range c.Logprobs.Content {
		e := &c.Logprobs.Content[i]
		joined.WriteString(e.Token)
		if string(toBytes(e.Bytes)) != e.Token {
			t.Errorf("bytes of %q are %v", e.Token, e.Bytes)
		}
		if e.Token == "shipping" {
			labelTok = e
		}
	}
	if joined.String() != c.Message.Content {
		t.Fatalf("tokens spell %q, content is %q", joined.String(), c.Message.Content)
	}
	if labelTok == nil || len(labelTok.TopLogprobs) != 3 {
		t.Fatalf("label token %+v", labelTok)
	}
	var mass float64
	for _, a := range labelTok.TopLogprobs {
		mass += math.Exp(a.Logprob)
	}
	if math.Abs(math.Exp(labelTok.Logprob)-0.8) > 1e-9 || math.Abs(mass-1) > 1e-9 {
		t.Errorf("label token p=%v, alternatives sum to %v", math.Exp(labelTok.Logprob), mass)
	}
}

func TestClassifierAnswerDefaultsToFirstLabelAndHonoursNoLogprobs(t *testing.T) {
	s := newServer(t, Options{ClassifierAnswers: true, NoLogprobs: true})
	out := askClassifier(t, s, classifierRequest("classify", `Allowed labels: ["billing","shipping"]`, "hello there", true))
	if got := out.Choices[0].Message.Content; got != `{"label": "billing", "confidence": 0.9}` {
		t.Errorf("content %q", got)
	}
	if out.Choices[0].Logprobs != nil {
		t.Errorf("logprobs sent although NoLogprobs is set")
	}
}

func TestClassifierAnswerTasks(t *testing.T) {
	s := newServer(t, Options{ClassifierAnswers: true})
	cases := []struct{ task, allowed, user, want string }{
		{"classify-multi", `Allowed labels: ["a b","cats"]`, "I like cats", `{"labels": [{"label": "a b", "confidence": 0.1}, {"label": "cats", "confidence": 0.9}]}`},
		{"tag", `Allowed tags: ["go","rust"]`, "Rust and Go", `{"tags": [{"tag": "go", "confidence": 0.9}, {"tag": "rust", "confidence": 0.9}]}`},
		{"tag", `Allowed tags: ["go","rust"]`, "Python", `{"tags": [{"tag": "go", "confidence": 0.6}]}`},
		{"tag", ``, "The quick brown fox jumps", `{"tags": [{"tag": "quick", "confidence": 0.8}, {"tag": "brown", "confidence": 0.8}, {"tag": "jumps", "confidence": 0.8}]}`},
		{"score", ``, "anything", `{"score": 6}`},
		{"match", ``, "anything", `{"relevance": 6}`},
	}
	for _, c := range cases {
		out := askClassifier(t, s, classifierRequest(c.task, c.allowed, c.user, false))
		if got := out.Choices[0].Message.Content; got != c.want {
			t.Errorf("%s %q: got %s, want %s", c.task, c.user, got, c.want)
		}
	}
}

func TestClassifierDigitLogprobs(t *testing.T) {
	s := newServer(t, Options{ClassifierAnswers: true})
	out := askClassifier(t, s, classifierRequest("score", "", "text", true))
	for _, e := range out.Choices[0].Logprobs.Content {
		if e.Token != "6" {
			continue
		}
		var expected float64
		for _, a := range e.TopLogprobs {
			expected += math.Exp(a.Logprob) * float64(a.Token[0]-'0')
		}
		if math.Abs(expected-6.1) > 1e-9 {
			t.Errorf("expected digit %v, want 6.1", expected)
		}
		return
	}
	t.Fatalf("no digit token in %+v", out.Choices[0].Logprobs)
}

func TestClassifierBadJSONTimes(t *testing.T) {
	s := newServer(t, Options{ClassifierAnswers: true, BadJSONTimes: 2})
	req := classifierRequest("score", "", "text", false)
	for i := 0; i < 2; i++ {
		if got := askClassifier(t, s, req).Choices[0].Message.Content; json.Valid([]byte(got)) {
			t.Fatalf("answer %d is JSON: %s", i+1, got)
		}
	}
	if got := askClassifier(t, s, req).Choices[0].Message.Content; got != `{"score": 6}` {
		t.Errorf("third answer %q", got)
	}
}

func TestClassifierAnswersLeaveOtherRequestsAlone(t *testing.T) {
	s := newServer(t, Options{ClassifierAnswers: true, Chunks: 2})
	// No classifier marker, and a marker without json_object: plain answers.
	plainSystem := `{"model":"m","response_format":{"type":"json_object"},"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`
	noFormat := `{"model":"m","messages":[{"role":"system","content":"tollgate-classifier: score"},{"role":"user","content":"hi"}]}`
	for _, body := range []string{chatReq, plainSystem, noFormat} {
		out := askClassifier(t, s, body)
		if got := out.Choices[0].Message.Content; got != "tok0 tok1" {
			t.Errorf("%s: content %q", body, got)
		}
	}
}

func toBytes(v []int) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}
