package proxytest

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

type logprobEntry struct {
	Token       string  `json:"token"`
	Logprob     float64 `json:"logprob"`
	Bytes       []int   `json:"bytes"`
	TopLogprobs []struct {
		Token   string  `json:"token"`
		Logprob float64 `json:"logprob"`
	} `json:"top_logprobs"`
}

type replyBody struct {
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

func ask(t *testing.T, s *Server, body string) replyBody {
	t.Helper()
	resp := post(t, context.Background(), s.URL+"/chat/completions", body)
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	var out replyBody
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("body %s: %v", raw, err)
	}
	return out
}

// digitModel answers requests whose user message is "rate" with the digit
// 6, 7 as its alternative, and declines the rest.
func digitModel(request []byte) (string, []byte, bool) {
	if gjson.GetBytes(request, "messages.0.content").String() != "rate" {
		return "", nil, false
	}
	b := []byte{'['}
	b = AppendTokenLogprob(b, "6", math.Log(0.75), []TopLogprob{{"6", math.Log(0.75)}, {"7", math.Log(0.25)}})
	return "6", append(b, ']'), true
}

const rateWithLogprobs = `{"model":"m","messages":[{"role":"user","content":"rate"}],"logprobs":true,"top_logprobs":5}`

func TestReplyAnswersWithLogprobsWhenAsked(t *testing.T) {
	s := newServer(t, Options{Reply: digitModel, PromptTokens: 7})
	out := ask(t, s, rateWithLogprobs)
	if out.Choices[0].Message.Content != "6" || out.Usage.PromptTokens != 7 || out.Choices[0].Logprobs == nil {
		t.Fatalf("answer %+v", out)
	}
	e := out.Choices[0].Logprobs.Content[0]
	if e.Token != "6" || string(toBytes(e.Bytes)) != "6" || len(e.TopLogprobs) != 2 || e.TopLogprobs[1].Token != "7" ||
		math.Abs(math.Exp(e.TopLogprobs[1].Logprob)-0.25) > 1e-12 {
		t.Errorf("logprobs entry %+v", e)
	}
	// Not asked for: not sent.
	if out := ask(t, s, strings.Replace(rateWithLogprobs, `"logprobs":true`, `"logprobs":false`, 1)); out.Choices[0].Logprobs != nil {
		t.Errorf("logprobs sent unasked")
	}
}

func TestReplyHonoursNoLogprobsAndBadAnswerTimes(t *testing.T) {
	s := newServer(t, Options{Reply: digitModel, NoLogprobs: true, BadAnswerTimes: 1})
	if got := ask(t, s, rateWithLogprobs).Choices[0].Message.Content; got != proseAnswer {
		t.Errorf("first answer %q, want prose", got)
	}
	out := ask(t, s, rateWithLogprobs)
	if out.Choices[0].Message.Content != "6" || out.Choices[0].Logprobs != nil {
		t.Errorf("second answer %+v: want 6 without logprobs", out)
	}
}

func TestReplyDeclinedGetsTheUsualAnswer(t *testing.T) {
	s := newServer(t, Options{Reply: digitModel, Chunks: 2})
	if got := ask(t, s, chatReq).Choices[0].Message.Content; got != "tok0 tok1" {
		t.Errorf("content %q", got)
	}
}

func toBytes(v []int) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}
