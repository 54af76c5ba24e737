package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// billedEvent waits for the usage event of the call resp answered.
func (h *harness) billedEvent(resp *http.Response) *meter.Event {
	h.t.Helper()
	id := resp.Header.Get("x-request-id")
	var found *meter.Event
	checkFor(h.t, 5*time.Second, 10*time.Millisecond, func() error {
		for _, ev := range h.rec.Events() {
			if ev.ID == id {
				found = ev
				return nil
			}
		}
		return fmt.Errorf("no usage event %q", id)
	})
	return found
}

// usageEvents are the events of a chat stream whose data carries a
// top-level usage object, by their index among all the stream's events.
func usageEvents(events []string) map[int]gjson.Result {
	found := map[int]gjson.Result{}
	for i, ev := range events {
		if u := gjson.Get(strings.TrimPrefix(ev, "data: "), "usage"); u.IsObject() {
			found[i] = gjson.Parse(strings.TrimPrefix(ev, "data: "))
		}
	}
	return found
}

// A client that asked for usage (stream_options.include_usage) of a
// stream whose upstream reports none (many vLLM and Ollama setups, or a
// whole JSON answer without usage written as a stream) got no usage
// chunk: its SDK's usage was undefined while the call was billed on the
// tokenizer's estimate. The usage chunk comes as OpenAI sends it, after
// the last content chunk and before [DONE], and carries what is billed.
// A client that did not ask gets none, as from OpenAI; an upstream's own
// report is relayed once, as it came; a stream that ends in the
// upstream's error gets none after it.
func TestUsageAskedForComesWithWhatIsBilledWhenTheUpstreamReportsNone(t *testing.T) {
	const (
		asked    = `{"model":"small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"one two three"}]}`
		notAsked = `{"model":"small","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"one two three"}]}`
		absent   = `{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}]}`
	)
	engineDied := `data: {"error":{"message":"engine died","type":"server_error","code":500}}` + "\n\n" + "data: [DONE]\n\n"
	groq := chatChunk("Hello there", "") + `data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],` +
		`"x_groq":{"id":"req_01","usage":{"prompt_tokens":100,"completion_tokens":9,"total_tokens":109}}}` + "\n\n" + "data: [DONE]\n\n"
	for _, tc := range []struct {
		name   string
		up     proxytest.Options
		raw    string // a stream the upstream sends instead
		source meter.UsageSource
		done   bool   // the stream ends with [DONE]
		none   bool   // no usage chunk, even asked for
		asCame string // the usage chunk is the upstream's, this usage as it came
	}{
		{"stream without usage", proxytest.Options{Chunks: 5, OmitUsage: true}, "", meter.SourceEstimated, true, false, ""},
		{"stream without usage or [DONE]", proxytest.Options{Chunks: 5, OmitUsage: true, OmitDone: true}, "", meter.SourceEstimated, false, false, ""},
		{"whole answer without usage", proxytest.Options{Chunks: 5, OmitUsage: true, WholeAnswers: true}, "", meter.SourceEstimated, true, false, ""},
		{"stream with usage", proxytest.Options{Chunks: 5, PromptTokens: 8, CompletionTokens: 5}, "", meter.SourceUpstream, true, false, ""},
		{"whole answer with usage", proxytest.Options{Chunks: 5, PromptTokens: 8, CompletionTokens: 5, WholeAnswers: true}, "", meter.SourceUpstream, true, false, ""},
		{"stream ended in the upstream's error", proxytest.Options{Chunks: 5, OmitUsage: true, ErrorEvent: engineDied, ErrorEventAfter: 3}, "", meter.SourceEstimated, true, true, ""},
		{"Groq: usage in x_groq alone", proxytest.Options{}, groq, meter.SourceUpstream, true, false, ""},
		{"a report not believed", proxytest.Options{Chunks: 5, RawUsage: `{"total_tokens":5000}`}, "", meter.SourceEstimated, true, false, `{"total_tokens":5000}`},
	} {
		h := newHarness(t, harnessOptions{upstream: tc.up})
		var resp *http.Response
		var body []byte
		if tc.raw != "" {
			h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, closingUpstream(t, tc.raw), 1))
		}
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error { // the config reload takes a moment
			resp = h.post("/v1/chat/completions", asked)
			if body = readAll(t, resp); tc.raw != "" && !strings.Contains(string(body), "chatcmpl-r") {
				return fmt.Errorf("got %s", body)
			}
			return nil
		})
		ev := h.billedEvent(resp)
		if ev.UsageSource != tc.source {
			t.Errorf("%s: billed %s, want %s", tc.name, ev.UsageSource, tc.source)
		}
		events := sseEvents(body)
		found := usageEvents(events)
		if tc.none {
			if len(found) != 0 {
				t.Errorf("%s: usage after the upstream's error:\n%s", tc.name, body)
			}
			continue
		}
		last := len(events) - 1
		if tc.done {
			last--
			if events[len(events)-1] != "data: [DONE]" {
				t.Errorf("%s: the stream does not end with [DONE]:\n%s", tc.name, body)
			}
		}
		chunk, ok := found[last]
		if len(found) != 1 || !ok {
			t.Errorf("%s: usage in events %v of %d, want one usage chunk just before [DONE]:\n%s", tc.name, keys(found), len(events), body)
			continue
		}
		u := chunk.Get("usage")
		if tc.asCame != "" {
			if u.Raw != tc.asCame {
				t.Errorf("%s: the usage chunk says %s, want the upstream's %s as it came", tc.name, u.Raw, tc.asCame)
			}
		} else if p, c := u.Get("prompt_tokens").Int(), u.Get("completion_tokens").Int(); p != ev.PromptTokens || c != ev.CompletionTokens ||
			u.Get("total_tokens").Int() != p+c || c == 0 {
			t.Errorf("%s: the usage chunk says %s, the call is billed %d+%d", tc.name, u.Raw, ev.PromptTokens, ev.CompletionTokens)
		}
		first := gjson.Parse(strings.TrimPrefix(events[0], "data: "))
		if choices := chunk.Get("choices"); !choices.IsArray() || len(choices.Array()) != 0 ||
			chunk.Get("id").Str != first.Get("id").Str || chunk.Get("object").Str != "chat.completion.chunk" || chunk.Get("model").Str != first.Get("model").Str {
			t.Errorf("%s: usage chunk %s, want OpenAI's (choices [], the stream's id and model)", tc.name, chunk.Raw)
		}
		for _, request := range []string{notAsked, absent} {
			if body := readAll(t, h.post("/v1/chat/completions", request)); len(usageEvents(sseEvents(body))) != 0 {
				t.Errorf("%s: usage the client did not ask for, to %s:\n%s", tc.name, request, body)
			}
		}
	}
}

func keys(m map[int]gjson.Result) []int {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// What the SDKs show: the Go SDK's accumulator had no usage from a
// stream without a report, and now has what the call is billed.
func TestSDKSeesTheBilledUsageOfAStreamWithoutAReport(t *testing.T) {
	h := newHarness(t, harnessOptions{upstream: proxytest.Options{Chunks: 5, OmitUsage: true}})
	client := openai.NewClient(option.WithBaseURL(h.url+"/v1"), option.WithAPIKey(h.key), option.WithMaxRetries(0))
	var resp *http.Response
	stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model:         "small",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}, option.WithResponseInto(&resp))
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	ev := h.billedEvent(resp)
	if acc.Usage.PromptTokens != ev.PromptTokens || acc.Usage.CompletionTokens != ev.CompletionTokens || acc.Usage.TotalTokens == 0 ||
		!strings.HasPrefix(acc.Choices[0].Message.Content, "tok0") {
		t.Fatalf("the SDK accumulated usage %q and content %q; the call is billed %d+%d", acc.Usage.RawJSON(),
			acc.Choices[0].Message.Content, ev.PromptTokens, ev.CompletionTokens)
	}
}

// A Responses stream's response.completed carries usage, always: an
// upstream that sends none, or null, in it (and a whole response without
// usage written as a stream) left the SDK's response.usage empty while
// the call was billed on the estimate. It carries what is billed now; an
// upstream's own report is relayed as it came.
func TestResponsesCompletedCarriesWhatIsBilledWhenTheUpstreamReportsNone(t *testing.T) {
	completedWith := func(usage string) string {
		return "event: response.created\ndata: " + `{"type":"response.created","sequence_number":0,"response":{"id":"resp_n","object":"response","status":"in_progress","output":[],"usage":null}}` + "\n\n" +
			"event: response.output_text.delta\ndata: " + `{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello there, how are you"}` + "\n\n" +
			"event: response.completed\ndata: " + `{"type":"response.completed","sequence_number":2,"response":{"id":"resp_n","object":"response","status":"completed",` +
			`"output":[{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","annotations":[],"text":"Hello there, how are you"}]}]` +
			usage + `}}` + "\n\n"
	}
	for _, tc := range []struct {
		name   string
		up     proxytest.Options
		raw    string // a stream the upstream sends instead
		source meter.UsageSource
	}{
		{"stream without usage", proxytest.Options{Chunks: 5, OmitUsage: true}, "", meter.SourceEstimated},
		{"whole response without usage", proxytest.Options{Chunks: 5, OmitUsage: true, WholeAnswers: true}, "", meter.SourceEstimated},
		{"usage null", proxytest.Options{}, completedWith(`,"usage":null`), meter.SourceEstimated},
		{"stream with usage", proxytest.Options{Chunks: 5, PromptTokens: 8, CompletionTokens: 5}, "", meter.SourceUpstream},
	} {
		h := newHarness(t, harnessOptions{upstream: tc.up})
		if tc.raw != "" {
			h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, closingUpstream(t, tc.raw), 1))
		}
		client := openai.NewClient(option.WithBaseURL(h.url+"/v1"), option.WithAPIKey(h.key), option.WithMaxRetries(0))
		var completed responses.Response
		var resp *http.Response
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error { // the config reload takes a moment
			rs := client.Responses.NewStreaming(t.Context(), responses.ResponseNewParams{
				Model: "small",
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("one two three")},
			}, option.WithResponseInto(&resp))
			completed = responses.Response{}
			for rs.Next() {
				if ev := rs.Current(); ev.Type == "response.completed" {
					completed = ev.Response
				}
			}
			if err := rs.Err(); err != nil {
				return err
			}
			if tc.raw != "" && completed.ID != "resp_n" {
				return fmt.Errorf("answered by %q", completed.ID)
			}
			return nil
		})
		ev := h.billedEvent(resp)
		u := completed.Usage
		if ev.UsageSource != tc.source || u.InputTokens != ev.PromptTokens || u.OutputTokens != ev.CompletionTokens ||
			u.TotalTokens != u.InputTokens+u.OutputTokens || u.OutputTokens == 0 {
			t.Errorf("%s: response.completed carries usage %q; the call is billed %d+%d (%s)", tc.name, u.RawJSON(),
				ev.PromptTokens, ev.CompletionTokens, ev.UsageSource)
		}
	}
}

// A whole answer without usage, or with "usage": null, carried none to
// its client, billed the tokenizer's estimate all the same: the SDKs'
// usage was null for a call that cost money. It now carries what is
// billed, as a stream's usage chunk and terminal event do.
func TestWholeAnswerWithoutUsageCarriesWhatIsBilled(t *testing.T) {
	const (
		chat      = `{"model":"small","messages":[{"role":"user","content":"one two three"}]}`
		responses = `{"model":"small","input":"one two three"}`
	)
	for _, tc := range []struct {
		name, path, request, usageNull string
		up                             proxytest.Options
		source                         meter.UsageSource
		prompt, completion             string // the usage's members
	}{
		{"chat without usage", "/v1/chat/completions", chat, "", proxytest.Options{Chunks: 5, OmitUsage: true}, meter.SourceEstimated, "prompt_tokens", "completion_tokens"},
		{"chat with usage null", "/v1/chat/completions", chat, "null", proxytest.Options{Chunks: 5}, meter.SourceEstimated, "prompt_tokens", "completion_tokens"},
		{"responses without usage", "/v1/responses", responses, "", proxytest.Options{Chunks: 5, OmitUsage: true}, meter.SourceEstimated, "input_tokens", "output_tokens"},
		{"responses with usage null", "/v1/responses", responses, "null", proxytest.Options{Chunks: 5}, meter.SourceEstimated, "input_tokens", "output_tokens"},
		{"chat with usage", "/v1/chat/completions", chat, "", proxytest.Options{Chunks: 5, PromptTokens: 8, CompletionTokens: 5}, meter.SourceUpstream, "prompt_tokens", "completion_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.usageNull != "" {
				tc.up.RawUsage = tc.usageNull
			}
			h := newHarness(t, harnessOptions{upstream: tc.up})
			resp := h.post(tc.path, tc.request)
			body := readAll(t, resp)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			ev := h.billedEvent(resp)
			u := gjson.GetBytes(body, "usage")
			if ev.UsageSource != tc.source || u.Get(tc.prompt).Int() != ev.PromptTokens || u.Get(tc.completion).Int() != ev.CompletionTokens ||
				u.Get("total_tokens").Int() != ev.PromptTokens+ev.CompletionTokens || ev.CompletionTokens == 0 {
				t.Fatalf("the answer carries usage %s; the call is billed %d+%d (%s):\n%s", u.Raw, ev.PromptTokens, ev.CompletionTokens, ev.UsageSource, body)
			}
			if !gjson.ValidBytes(body) || strings.Count(string(body), `"usage"`) != 1 {
				t.Fatalf("not one usage in valid JSON:\n%s", body)
			}
		})
	}
}
