package proxy_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// An upstream that cannot stream answers a streamed request with the
// whole answer. Passed on as it came, the SDKs read an empty stream that
// succeeded, and the call was billed. The client now gets the stream it
// asked for, in OpenAI's events, and the bill is the answer's.
func TestWholeAnswerToAStreamedRequestIsRelayedAsAStream(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{WholeAnswers: true, Chunks: 5, PromptTokens: 8, CompletionTokens: 5}})
	client := openai.NewClient(option.WithBaseURL(h.url+"/v1"), option.WithAPIKey(h.key), option.WithMaxRetries(0))
	ctx := t.Context()
	chatParams := openai.ChatCompletionNewParams{
		Model:    "small",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
	}

	whole, err := client.Chat.Completions.New(ctx, chatParams)
	if err != nil {
		t.Fatal(err)
	}
	chatParams.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, chatParams)
	acc := openai.ChatCompletionAccumulator{}
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks != 4 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content != whole.Choices[0].Message.Content ||
		acc.Choices[0].FinishReason != "stop" || acc.Usage.CompletionTokens != 5 {
		t.Fatalf("%d chunks accumulated %+v, want the content of %+v", chunks, acc.ChatCompletion, whole)
	}

	// Without include_usage, no usage chunk: the client did not ask.
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	body := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") ||
		strings.Contains(string(body), `"usage"`) || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("%d %s\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}

	wholeResp, err := client.Responses.New(ctx, responses.ResponseNewParams{
		Model: "large",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
	})
	if err != nil {
		t.Fatal(err)
	}
	rs := client.Responses.NewStreaming(ctx, responses.ResponseNewParams{
		Model: "large",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
	})
	var text strings.Builder
	var types []string
	var completed responses.Response
	for rs.Next() {
		ev := rs.Current()
		types = append(types, ev.Type)
		if ev.Type == "response.output_text.delta" {
			text.WriteString(ev.Delta)
		}
		if ev.Type == "response.completed" {
			completed = ev.Response
		}
	}
	want := "response.created response.in_progress response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.done response.content_part.done response.output_item.done response.completed"
	if rs.Err() != nil || strings.Join(types, " ") != want || text.String() != wholeResp.OutputText() ||
		completed.OutputText() != wholeResp.OutputText() || completed.Usage.OutputTokens != 5 {
		t.Fatalf("responses stream: err %v\nevents %v\ntext %q, want %q; completed %+v", rs.Err(), types, text.String(), wholeResp.OutputText(), completed)
	}

	for i, ev := range h.events(5) {
		if ev.PromptTokens != 8 || ev.CompletionTokens != 5 || ev.Status != 200 {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
}

// toolCallsAnswer is a whole chat answer with two tool calls; its usage
// is the 500 completion tokens useUpstream waits for.
const toolCallsAnswer = `{"id":"chatcmpl-2","object":"chat.completion","created":7,"model":"proxytest-small","system_fingerprint":"fp_1",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[` +
	`{"id":"call_a","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}},` +
	`{"id":"call_b","type":"function","function":{"name":"time","arguments":"{}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],` +
	`"usage":{"prompt_tokens":9,"completion_tokens":500,"total_tokens":509}}`

// Tool calls come out of a whole answer as a stream's deltas, numbered,
// and the SDK's accumulator puts them back together.
func TestWholeAnswerWithToolCallsToAStreamedRequest(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	baseURL, _ := pausingUpstream(t, toolCallsAnswer, len(toolCallsAnswer), 0)
	useUpstream(t, h, baseURL)
	client := openai.NewClient(option.WithBaseURL(h.url+"/v1"), option.WithAPIKey(h.key), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model:    "small",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("weather?")},
	})
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "tool_calls" || acc.SystemFingerprint != "fp_1" {
		t.Fatalf("accumulated %+v", acc.ChatCompletion)
	}
	calls := acc.Choices[0].Message.ToolCalls
	if len(calls) != 2 || calls[0].ID != "call_a" || calls[0].Function.Name != "weather" || calls[0].Function.Arguments != `{"city":"Oslo"}` ||
		calls[1].ID != "call_b" || calls[1].Function.Arguments != "{}" {
		t.Fatalf("tool calls %+v", calls)
	}
}

// logprobsAnswer is a whole chat answer with log-probabilities; its usage
// is the 500 completion tokens useUpstream waits for.
const logprobsAnswer = `{"id":"chatcmpl-4","object":"chat.completion","created":7,"model":"proxytest-small",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Hi there"},"logprobs":{"content":[` +
	`{"token":"Hi","logprob":-0.1,"bytes":[72,105],"top_logprobs":[]},{"token":" there","logprob":-0.2,"bytes":[32,116,104,101,114,101],"top_logprobs":[]}]},` +
	`"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":500,"total_tokens":509}}`

// A choice starts with a chunk of its role alone, as OpenAI's streams do:
// the Node SDK's stream helper takes a choice's first chunk for its start
// and adds it in too, and logprobs in it came out twice.
func TestWholeAnswerToAStreamedRequestStartsEachChoiceWithItsRole(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	baseURL, _ := pausingUpstream(t, logprobsAnswer, len(logprobsAnswer), 0)
	useUpstream(t, h, baseURL)
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"logprobs":true,"messages":[{"role":"user","content":"hi"}]}`)
	body := readAll(t, resp)
	events := sseEvents(body)
	if len(events) != 4 || !strings.Contains(events[0], `"delta":{"role":"assistant"},"logprobs":null,`) ||
		strings.Count(string(body), `"token":"Hi"`) != 1 || !strings.Contains(events[1], `"token":"Hi"`) || strings.Contains(events[1], `"role"`) {
		t.Fatalf("%d events:\n%s", len(events), body)
	}
}

// A whole JSON body that is no answer (no choices) to a streamed request
// is refused as a bad answer, unbilled, as a body that is not JSON is:
// written as a stream, it would be an empty one that succeeded.
func TestWholeNonAnswerToAStreamedRequestIsRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	const answer = `{"id":"chatcmpl-3","object":"chat.completion","usage":{"prompt_tokens":9,"completion_tokens":500,"total_tokens":509}}`
	baseURL, _ := pausingUpstream(t, answer, len(answer), 0)
	useUpstream(t, h, baseURL)
	before := len(h.rec.Events())
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	e := wantError(t, resp, 502, "upstream_bad_answer")
	if msg, _ := e["message"].(string); !strings.Contains(msg, `no "choices" list`) {
		t.Fatalf("message %q", msg)
	}
	h.events(before)
}

// A logging key's request log of a streamed call answered whole holds
// that answer, as a non-streamed call's does; it was empty, as the
// stream's text it looked for was never assembled.
func TestWholeAnswerToAStreamedRequestIsLogged(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{WholeAnswers: true, Chunks: 3}})
	logKey := h.g.CreateKey("acme", accounts.KeyRequest{Name: "logged", Logging: accounts.Logging{Enabled: true}})
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`, logKey)
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	ev := h.events(1)[0]
	if ev.Log == nil || !strings.Contains(ev.Log.Response, "tok0 tok1 tok2") {
		t.Fatalf("request log %+v, want the answer", ev.Log)
	}
}

// reasoningAnswer is a whole response with a reasoning item, its text and
// its summary, before its message.
const reasoningAnswer = `{"id":"resp_r","object":"response","created_at":7,"status":"completed","model":"proxytest-large","output":[` +
	`{"id":"rs_1","type":"reasoning","content":[{"type":"reasoning_text","text":"Two and two."}],` +
	`"summary":[{"type":"summary_text","text":"Adding."},{"type":"summary_text","text":"Done adding."}]},` +
	`{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","annotations":[],"text":"Four."}]}],` +
	`"usage":{"input_tokens":9,"output_tokens":20,"output_tokens_details":{"reasoning_tokens":12},"total_tokens":29}}`

// A reasoning item of a whole answer came out of the stream written from
// it whole, in output_item.added: a UI that shows reasoning as its deltas
// come (OpenAI streams reasoning_summary_text and reasoning_text deltas)
// showed none. Its text and summary parts come as OpenAI streams them.
func TestWholeAnswerWithReasoningToAStreamedRequest(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	var asked atomic.Int32
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, jsonUpstream(t, reasoningAnswer, &asked), 1))
	client := openai.NewClient(option.WithBaseURL(h.url+"/v1"), option.WithAPIKey(h.key), option.WithMaxRetries(0))
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		var types []string
		var reasoning, summary strings.Builder
		var added responses.ResponseOutputItemUnion
		rs := client.Responses.NewStreaming(t.Context(), responses.ResponseNewParams{
			Model: "large",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("2+2?")},
		})
		for rs.Next() {
			ev := rs.Current()
			types = append(types, strings.TrimPrefix(ev.Type, "response."))
			switch ev.Type {
			case "response.reasoning_text.delta":
				reasoning.WriteString(ev.Delta)
			case "response.reasoning_summary_text.delta":
				fmt.Fprintf(&summary, "%d:%s ", ev.SummaryIndex, ev.Delta)
			case "response.output_item.added":
				if ev.OutputIndex == 0 {
					added = ev.Item
				}
			}
		}
		want := "created in_progress output_item.added " +
			"content_part.added reasoning_text.delta reasoning_text.done content_part.done " +
			"reasoning_summary_part.added reasoning_summary_text.delta reasoning_summary_text.done reasoning_summary_part.done " +
			"reasoning_summary_part.added reasoning_summary_text.delta reasoning_summary_text.done reasoning_summary_part.done " +
			"output_item.done output_item.added content_part.added output_text.delta output_text.done content_part.done output_item.done completed"
		if rs.Err() != nil || strings.Join(types, " ") != want {
			return fmt.Errorf("err %v, events\n%s\nwant\n%s", rs.Err(), strings.Join(types, " "), want)
		}
		if reasoning.String() != "Two and two." || summary.String() != "0:Adding. 1:Done adding. " ||
			added.Type != "reasoning" || len(added.Summary) != 0 || len(added.Content) != 0 {
			t.Fatalf("reasoning deltas %q, summary deltas %q, item added %+v", reasoning.String(), summary.String(), added)
		}
		return nil
	})
	evs := h.events(1)
	if ev := evs[len(evs)-1]; ev.CompletionTokens != 20 || ev.PromptTokens != 9 {
		t.Fatalf("event %+v, want the answer's usage", ev)
	}
}
