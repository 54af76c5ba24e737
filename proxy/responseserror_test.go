package proxy_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/tokens"
)

// responsesEvent is a responses stream's event named as its data's type.
func responsesEvent(data string) string {
	return "event: " + gjson.Get(data, "type").Str + "\ndata: " + data + "\n\n"
}

// billedResponses posts request to /v1/responses until the answer comes
// from the upstream answerWith put in place (its body holds marker), and
// returns the body and the call's usage event.
func billedResponses(t *testing.T, h *harness, request, marker string) ([]byte, *meter.Event) {
	t.Helper()
	var body []byte
	var ev *meter.Event
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		resp := h.post("/v1/responses", request)
		if body = readAll(t, resp); !strings.Contains(string(body), marker) {
			return fmt.Errorf("got %.200s", body)
		}
		ev = h.billedEvent(resp)
		return nil
	})
	return body, ev
}

// An upstream's error event in the middle of a Responses stream, and
// more events after it: the gateway stopped counting at the error (it
// billed there, on the estimate of the text before it) but kept relaying,
// 200 words more and response.completed, whose usage report was not
// read; one without usage had the estimate of the words before the error
// set in it, 5 output tokens for ~400 delivered; and a response.failed
// after the error carrying usage 37/21 was billed 3/6 estimated. What is
// relayed is counted: a usage report after the error is billed, else the
// estimate covers every word relayed, and is what a terminal event
// without usage carries.
func TestResponsesStreamRelayedAfterTheUpstreamsErrorIsBilled(t *testing.T) {
	const request = `{"model":"small","stream":true,"input":"one two three"}`
	response := func(status, output, usage string) string {
		return `{"id":"resp_f7","object":"response","created_at":1,"status":"` + status + `","model":"m","output":` + output + `,"usage":` + usage + `}`
	}
	var words strings.Builder
	var head strings.Builder
	head.WriteString(responsesEvent(`{"type":"response.created","sequence_number":0,"response":` + response("in_progress", "[]", "null") + `}`))
	head.WriteString(responsesEvent(`{"type":"response.in_progress","sequence_number":1,"response":` + response("in_progress", "[]", "null") + `}`))
	head.WriteString(responsesEvent(`{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`))
	head.WriteString(responsesEvent(`{"type":"response.content_part.added","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}`))
	delta := func(seq int, text string) string {
		return responsesEvent(fmt.Sprintf(`{"type":"response.output_text.delta","sequence_number":%d,"item_id":"msg_1","output_index":0,"content_index":0,"delta":%q,"logprobs":[]}`, seq, text))
	}
	head.WriteString(delta(4, "Hello "))
	words.WriteString("Hello ")
	head.WriteString("event: error\ndata: " + `{"type":"error","code":"server_error","message":"transient hiccup","param":null}` + "\n\n")
	for i := range 200 {
		word := fmt.Sprintf("word%d ", i)
		head.WriteString(delta(5+i, word))
		words.WriteString(word)
	}
	text := words.String()
	message := fmt.Sprintf(`{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":%q,"annotations":[]}]}`, text)
	head.WriteString(responsesEvent(fmt.Sprintf(`{"type":"response.output_text.done","sequence_number":205,"item_id":"msg_1","output_index":0,"content_index":0,"text":%q,"logprobs":[]}`, text)))
	head.WriteString(responsesEvent(fmt.Sprintf(`{"type":"response.content_part.done","sequence_number":206,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":%q,"annotations":[]}}`, text)))
	head.WriteString(responsesEvent(`{"type":"response.output_item.done","sequence_number":207,"output_index":0,"item":` + message + `}`))
	const usage = `{"input_tokens":37,"input_tokens_details":{"cached_tokens":10},"output_tokens":21,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":58}`
	output := "[" + message + "]"
	estimated := int64(tokens.Count(text))
	for _, tc := range []struct {
		name, last                 string
		prompt, cached, completion int64
		source                     meter.UsageSource
	}{
		{"response.completed with usage", `{"type":"response.completed","sequence_number":208,"response":` + response("completed", output, usage) + `}`,
			37, 10, 21, meter.SourceUpstream},
		{"response.failed with usage", `{"type":"response.failed","sequence_number":208,"response":` +
			strings.Replace(response("failed", output, usage), `"usage":`, `"error":{"code":"server_error","message":"transient hiccup"},"usage":`, 1) + `}`,
			37, 10, 21, meter.SourceUpstream},
		{"response.completed without usage", `{"type":"response.completed","sequence_number":208,"response":` + response("completed", output, "null") + `}`,
			-1, 0, estimated, meter.SourceEstimated},
	} {
		h := newHarness(t, harnessOptions{})
		stream := head.String() + responsesEvent(tc.last)
		answerWith(t, h, stream)
		body, ev := billedResponses(t, h, request, "resp_f7")
		if ev.CompletionTokens != tc.completion || tc.prompt >= 0 && (ev.PromptTokens != tc.prompt || ev.CachedTokens != tc.cached) || ev.UsageSource != tc.source {
			t.Errorf("%s: billed %d (%d cached) + %d (%s), want %d (%d cached) + %d (%s)", tc.name,
				ev.PromptTokens, ev.CachedTokens, ev.CompletionTokens, ev.UsageSource, tc.prompt, tc.cached, tc.completion, tc.source)
		}
		// small: 0.1 USD per million prompt tokens, 0.3 per million completion tokens.
		if cost := 100*(ev.PromptTokens-ev.CachedTokens) + 50*ev.CachedTokens + 300*ev.CompletionTokens; ev.CostNanos != money.Nanos(cost) {
			t.Errorf("%s: cost %d nano-USD, want %d", tc.name, ev.CostNanos, cost)
		}
		if tc.source == meter.SourceUpstream {
			if string(body) != stream {
				t.Errorf("%s: the client got %d bytes, not the %d the upstream sent", tc.name, len(body), len(stream))
			}
			continue
		}
		// The terminal event carries what is billed, all the words relayed.
		evs := sseEvents(body)
		last := evs[len(evs)-1]
		got := gjson.Get(last[strings.Index(last, "data: ")+len("data: "):], "response.usage")
		if got.Get("output_tokens").Int() != ev.CompletionTokens || got.Get("input_tokens").Int() != ev.PromptTokens {
			t.Errorf("%s: the client's response.completed says usage %s, billed %d+%d", tc.name, got.Raw, ev.PromptTokens, ev.CompletionTokens)
		}
		at := strings.LastIndex(stream, `"usage":null`)
		if want := stream[:at] + `"usage":` + got.Raw + stream[at+len(`"usage":null`):]; string(body) != want {
			t.Errorf("%s: the client got %d bytes, not the %d the upstream sent with the usage billed", tc.name, len(body), len(want))
		}
	}
}
