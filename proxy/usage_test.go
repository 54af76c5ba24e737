package proxy_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
	"github.com/tollgate/tollgate/tokens"
)

// usageChunk is a chat chunk carrying usage; delta is its choice's delta
// ("" for a usage-only chunk, as OpenAI's last).
func usageChunk(prompt, completion int, delta string) string {
	choices := "[]"
	if delta != "" {
		choices = `[{"index":0,"delta":` + delta + `,"finish_reason":null}]`
	}
	return fmt.Sprintf(`data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":%s,"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n",
		choices, prompt, completion, prompt+completion)
}

// answerWith has h's upstream answer every call with stream, then close
// the connection.
func answerWith(t *testing.T, h *harness, stream string) {
	t.Helper()
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, closingUpstream(t, stream), 1))
}

// billedStream posts request until the answer is answerWith's (the config
// reload takes a moment), and returns the call's usage event.
func billedStream(t *testing.T, h *harness, request, key string) *meter.Event {
	t.Helper()
	before := len(h.rec.Events())
	posts := 0
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		posts++
		if body := readAll(t, h.post("/v1/chat/completions", request, key)); !strings.Contains(string(body), "chatcmpl-r") {
			return fmt.Errorf("got %s", body)
		}
		return nil
	})
	evs := h.events(before + posts)
	return evs[len(evs)-1]
}

// A usage report early in a stream stopped all counting: the content
// relayed after it was free (a black-box session's repro: usage {10, 0}
// in the first chunk, then 1,000 words, billed 0 completion tokens as the
// upstream's). Output after the last report is counted with the tokenizer
// and added to it, and the event says estimated; a report after all the
// output (OpenAI's usage-only chunk, vLLM's cumulative usage in every
// chunk) is billed as it came.
func TestOutputAfterTheLastUsageReportIsBilled(t *testing.T) {
	const request = `{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}]}`
	word20 := strings.Repeat("word ", 20)
	var words strings.Builder
	for range 50 {
		words.WriteString(chatChunk(word20, ""))
	}
	continuous := ""
	for i := 1; i <= 5; i++ {
		continuous += usageChunk(10, i, `{"content":"tok "}`)
	}
	for _, tc := range []struct {
		name, stream     string
		prompt, complete int64 // billed
		after            string
		source           meter.UsageSource
	}{
		{"early report, then 1,000 words",
			usageChunk(10, 0, `{"role":"assistant","content":""}`) + words.String() + chatChunk("", "stop") + "data: [DONE]\n\n",
			10, 0, strings.Repeat(word20, 50), meter.SourceEstimated},
		{"report, then two more chunks",
			chatChunk("Hello", "") + usageChunk(100, 50, "") + chatChunk(" more", "") + chatChunk(" text", "stop") + "data: [DONE]\n\n",
			100, 50, " more text", meter.SourceEstimated},
		{"report, then a cut stream",
			usageChunk(10, 0, `{"role":"assistant","content":""}`) + chatChunk(word20, "") + chatChunk(word20, ""),
			10, 0, word20 + word20, meter.SourceEstimated},
		{"report, output, and a later report",
			usageChunk(10, 0, "") + chatChunk(word20, "") + chatChunk("", "stop") + usageChunk(10, 21, "") + "data: [DONE]\n\n",
			10, 21, "", meter.SourceUpstream},
		{"OpenAI: usage last", chatChunk("Hello", "") + chatChunk(" there", "stop") + usageChunk(10, 2, "") + "data: [DONE]\n\n",
			10, 2, "", meter.SourceUpstream},
		{"vLLM: cumulative usage in every chunk",
			continuous + usageChunk(10, 5, `{"content":""}`) + "data: [DONE]\n\n", 10, 5, "", meter.SourceUpstream},
		{"nothing generated after the report",
			usageChunk(10, 3, `{"role":"assistant","content":"a b c"}`) + chatChunk("", "") + chatChunk("", "stop") + "data: [DONE]\n\n",
			10, 3, "", meter.SourceUpstream},
	} {
		h := newHarness(t, harnessOptions{})
		logKey := h.g.CreateKey("acme", accounts.KeyRequest{Name: "logged", Logging: accounts.Logging{Enabled: true}})
		answerWith(t, h, tc.stream)
		for _, key := range []string{h.key, logKey} {
			ev := billedStream(t, h, request, key)
			want := tc.complete + int64(tokens.Count(tc.after))
			if ev.PromptTokens != tc.prompt || ev.CompletionTokens != want || ev.UsageSource != tc.source {
				t.Errorf("%s (logging %v): billed %d+%d (%s), want %d+%d (%s)", tc.name, key == logKey,
					ev.PromptTokens, ev.CompletionTokens, ev.UsageSource, tc.prompt, want, tc.source)
			}
			// small: 0.1 USD per million prompt tokens, 0.3 per million completion tokens.
			if cost := 100*ev.PromptTokens + 300*ev.CompletionTokens; ev.CostNanos != money.Nanos(cost) {
				t.Errorf("%s: cost %d nano-USD, want %d", tc.name, ev.CostNanos, cost)
			}
		}
	}
}

// A usage report out of range after one in range was ignored, as it
// should be, but the log said the tokenizer's estimate was billed; so it
// did for a bad report before a good one. The log says what is billed.
func TestUsageOutOfRangeBesideAGoodReportLogsWhatIsBilled(t *testing.T) {
	const request = `{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}]}`
	bad := `data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":50}}` + "\n\n"
	for _, tc := range []struct {
		name, stream string
		prompt       int64
		source       meter.UsageSource
		log          string
	}{
		{"good, then bad", chatChunk("Hello", "stop") + usageChunk(100, 50, "") + bad + "data: [DONE]\n\n",
			100, meter.SourceUpstream, "billing its report in range instead: 100 prompt and 50 completion tokens"},
		{"bad, then good", chatChunk("Hello", "stop") + bad + usageChunk(100, 50, "") + "data: [DONE]\n\n",
			100, meter.SourceUpstream, "billing its report in range instead: 100 prompt and 50 completion tokens"},
		{"bad alone", chatChunk("Hello", "stop") + bad + "data: [DONE]\n\n",
			0, meter.SourceEstimated, "billing the tokenizer's estimate instead"},
	} {
		var log testutil.Log
		h := newHarness(t, harnessOptions{logf: log.Logf})
		answerWith(t, h, tc.stream)
		ev := billedStream(t, h, request, h.key)
		if tc.prompt != 0 && (ev.PromptTokens != tc.prompt || ev.CompletionTokens != 50) || ev.UsageSource != tc.source {
			t.Errorf("%s: billed %d+%d (%s)", tc.name, ev.PromptTokens, ev.CompletionTokens, ev.UsageSource)
		}
		lines := log.Matching("reported usage out of range")
		if len(lines) != 1 || !strings.Contains(lines[0], tc.log) {
			t.Errorf("%s: logged %q, want one line saying %q", tc.name, lines, tc.log)
		}
	}
}

// An upstream whose every answer carried a bad usage report had a log
// line per call (8,629 calls, 8,632 lines), each with up to 300 bytes of
// its JSON, newlines and all. The first is logged, quoted on one line;
// the rest are counted in tollgate_upstream_usage_refused_total.
func TestRefusedUsageIsLoggedOnceAWhileAndCounted(t *testing.T) {
	var log testutil.Log
	h := newHarness(t, harnessOptions{logf: log.Logf})
	body := `{"id":"chatcmpl-badusage","object":"chat.completion","created":1,"model":"m",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],` +
		"\"usage\":{\"prompt_tokens\":-1,\n\"completion_tokens\":50}}"
	bad := proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"+body)
		return false
	})
	h.writeConfig(strings.Replace(readFile(t, h.cfgPath), h.up.URL, bad, 1))
	const request = `{"model":"small","messages":[{"role":"user","content":"one two three"}]}`
	calls := 0
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		calls++
		if got := readAll(t, h.post("/v1/chat/completions", request)); !strings.Contains(string(got), "chatcmpl-badusage") {
			return fmt.Errorf("got %s", got)
		}
		return nil
	})
	refused := 1 // the last call of checkFor's; the ones before it went to the old upstream
	for range 4 {
		readAll(t, h.post("/v1/chat/completions", request))
		refused++
	}
	// Billed, and so counted and logged, as the answer ends.
	checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		if m := scrape(t, h); !strings.Contains(m, fmt.Sprintf("tollgate_upstream_usage_refused_total{upstream=\"local\"} %d\n", refused)) {
			return fmt.Errorf("want %d refused reports counted:\n%s", refused, m)
		}
		lines := log.Matching("reported usage out of range")
		if len(lines) != 1 || strings.Contains(lines[0], "\n") || !strings.Contains(lines[0], `-1,\n\"completion_tokens\":50}"`) {
			return fmt.Errorf("%d calls with a bad report logged %q, want one line with the report quoted", refused, lines)
		}
		return nil
	})
}

// Groq reports a stream's usage inside its own member, x_groq, on the
// chunk that finishes the answer, and none at the top level: a black-box
// session's call of 100 prompt and 9 completion tokens was billed the
// tokenizer's estimate, 7 and 4. It is billed as reported, and x_groq
// reaches the client as Groq sent it, whether or not the client asked
// for usage: it is Groq's own member, not the report the gateway asked
// for.
func TestGroqUsageInItsOwnMemberIsBilled(t *testing.T) {
	const groqUsage = `"x_groq":{"id":"req_01","usage":{"queue_time":0.02,"prompt_tokens":100,"prompt_time":0.01,"completion_tokens":9,"completion_time":0.03,"total_tokens":109,"total_time":0.04}}`
	stream := `data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"x_groq":{"id":"req_01"}}` + "\n\n" +
		chatChunk("Hello there, how are you", "") +
		`data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],` + groqUsage + "}\n\n" +
		"data: [DONE]\n\n"
	h := newHarness(t, harnessOptions{})
	answerWith(t, h, stream)
	for _, request := range []string{
		`{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}]}`,
		`{"model":"small","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"one two three"}]}`,
	} {
		ev := billedStream(t, h, request, h.key)
		if ev.PromptTokens != 100 || ev.CompletionTokens != 109-100 || ev.UsageSource != meter.SourceUpstream {
			t.Errorf("%s: billed %d+%d (%s), want 100+9 as Groq reported them", request, ev.PromptTokens, ev.CompletionTokens, ev.UsageSource)
		}
		if body := string(readAll(t, h.post("/v1/chat/completions", request))); !strings.Contains(body, groqUsage) {
			t.Errorf("%s: x_groq did not reach the client as Groq sent it:\n%s", request, body)
		}
	}
}

// Gemini's OpenAI-compatible stream reports the prompt alone in its
// early chunks, {"prompt_tokens":100,"total_tokens":100}, and the whole
// usage in its last: every call logged a refused report and counted one
// in tollgate_upstream_usage_refused_total, though it was billed exactly.
// Such an interim report is no refusal once a whole one follows; alone,
// or beside a report that is out of range, it still is.
func TestInterimUsageBeforeAWholeReportIsNotRefused(t *testing.T) {
	const request = `{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}]}`
	interim := func(delta string) string {
		return `data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta +
			`,"finish_reason":null}],"usage":{"prompt_tokens":100,"total_tokens":100}}` + "\n\n"
	}
	bad := `data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":50}}` + "\n\n"
	for _, tc := range []struct {
		name, stream string
		refused      bool
		source       meter.UsageSource
	}{
		{"interim, then whole", interim(`{"content":"Hello"}`) + interim(`{"content":" there"}`) + usageChunk(100, 2, `{"content":""}`) + chatChunk("", "stop") + "data: [DONE]\n\n",
			false, meter.SourceUpstream},
		{"interim alone", interim(`{"content":"Hello"}`) + chatChunk("", "stop") + "data: [DONE]\n\n", true, meter.SourceEstimated},
		{"out of range, interim, then whole", bad + interim(`{"content":"Hello"}`) + usageChunk(100, 2, `{"content":""}`) + chatChunk("", "stop") + "data: [DONE]\n\n",
			true, meter.SourceUpstream},
		{"interim, out of range, then whole", interim(`{"content":"Hello"}`) + bad + usageChunk(100, 2, `{"content":""}`) + chatChunk("", "stop") + "data: [DONE]\n\n",
			true, meter.SourceUpstream},
	} {
		var log testutil.Log
		h := newHarness(t, harnessOptions{logf: log.Logf})
		answerWith(t, h, tc.stream)
		ev := billedStream(t, h, request, h.key)
		if ev.UsageSource != tc.source || tc.source == meter.SourceUpstream && (ev.PromptTokens != 100 || ev.CompletionTokens != 2) {
			t.Errorf("%s: billed %d+%d (%s), want %s", tc.name, ev.PromptTokens, ev.CompletionTokens, ev.UsageSource, tc.source)
		}
		counted := strings.Contains(scrape(t, h), "tollgate_upstream_usage_refused_total{upstream=\"local\"} 1\n")
		lines := log.Matching("reported usage")
		if counted != tc.refused || (len(lines) == 1) != tc.refused {
			t.Errorf("%s: refusal counted %v, logged %q; want refused %v", tc.name, counted, lines, tc.refused)
		}
		if tc.refused && tc.source == meter.SourceUpstream && (len(lines) != 1 || !strings.Contains(lines[0], "out of range")) {
			t.Errorf("%s: logged %q, want the report out of range", tc.name, lines)
		}
	}
}

// An upstream that reported no tokens for a call with a prompt, or no
// completion tokens for an answer of 20 words, was believed: billed 0,
// marked as the upstream's, not logged nor counted as refused, on chat
// and responses, streamed or not, and on the llm engine's calls. Such a
// zero is out of range as a negative count is: the call is billed on the
// tokenizer's estimate, the report logged (once a while) and counted.
func TestZeroUsageForAPromptOrOutputIsRefused(t *testing.T) {
	for _, raw := range []string{
		`{"input_tokens":0,"output_tokens":0,"total_tokens":0}`,
		`{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}`,
		`{"prompt_tokens":0,"completion_tokens":20,"total_tokens":20}`,
		`{"input_tokens":10,"output_tokens":0,"total_tokens":10}`,
	} {
		var log testutil.Log
		h := newHarness(t, harnessOptions{logf: log.Logf, upstream: proxytest.Options{RawUsage: raw}})
		for _, stream := range []string{"false", "true"} {
			readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":`+stream+`,"messages":[{"role":"user","content":"one two three"}]}`))
			readAll(t, h.post("/v1/responses", `{"model":"small","stream":`+stream+`,"input":"one two three"}`))
		}
		for _, ev := range h.events(4) {
			if ev.UsageSource != meter.SourceEstimated || ev.PromptTokens <= 0 || ev.CompletionTokens < 20 || ev.CostNanos <= 0 {
				t.Errorf("upstream reported usage %s; %s stream %v event %+v", raw, ev.Endpoint, ev.Stream, ev)
			}
		}
		// The llm engine's calls alike.
		if _, usage, err := h.gw.World().CallModel(context.Background(), "small", []byte(modelCallBody)); err != nil ||
			!usage.Estimated || usage.PromptTokens <= 0 || usage.CompletionTokens < 20 {
			t.Errorf("upstream reported usage %s; the engine's call billed %+v (%v)", raw, usage, err)
		}
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
			const want = "tollgate_upstream_usage_refused_total{upstream=\"local\"} 5\n"
			if m := scrape(t, h); !strings.Contains(m, want) {
				return fmt.Errorf("usage %s: want %q", raw, want)
			}
			return nil
		})
		if lines := log.Matching("reported usage out of range"); len(lines) != 1 {
			t.Errorf("usage %s: logged %q, want one line", raw, lines)
		}
	}
}

// A zero is believed where nothing contradicts it: no completion tokens
// for an empty answer, streamed or not.
func TestZeroCompletionForNoOutputIsBelieved(t *testing.T) {
	const usage = `"usage":{"prompt_tokens":10,"completion_tokens":0,"total_tokens":10}`
	whole := `{"id":"chatcmpl-r","object":"chat.completion","created":1,"model":"m",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"length"}],` + usage + `}`
	stream := usageChunk(10, 0, `{"role":"assistant","content":""}`) + chatChunk("", "length") +
		`data: {"id":"chatcmpl-r","object":"chat.completion.chunk","created":1,"model":"m","choices":[],` + usage + "}\n\n" + "data: [DONE]\n\n"
	h := newHarness(t, harnessOptions{})
	url := h.up.URL
	for _, tc := range []struct{ request, upstream string }{
		{`{"model":"small","messages":[{"role":"user","content":"one two three"}],"max_tokens":0}`,
			proxy.StartRawUpstream(t, func(_, _ int, c net.Conn) bool {
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(whole), whole)
				return false
			})},
		{`{"model":"small","stream":true,"messages":[{"role":"user","content":"one two three"}],"max_tokens":0}`, closingUpstream(t, stream)},
	} {
		h.writeConfig(strings.Replace(readFile(t, h.cfgPath), url, tc.upstream, 1))
		url = tc.upstream
		before := len(h.rec.Events())
		posts := 0
		checkFor(t, 3*time.Second, 20*time.Millisecond, func() error {
			posts++
			if body := readAll(t, h.post("/v1/chat/completions", tc.request)); !strings.Contains(string(body), "chatcmpl-r") {
				return fmt.Errorf("got %s", body)
			}
			return nil
		})
		evs := h.events(before + posts)
		if ev := evs[len(evs)-1]; ev.PromptTokens != 10 || ev.CompletionTokens != 0 || ev.UsageSource != meter.SourceUpstream {
			t.Errorf("%s: billed %d+%d (%s), want 10+0 as reported", tc.request, ev.PromptTokens, ev.CompletionTokens, ev.UsageSource)
		}
	}
	if m := scrape(t, h); !strings.Contains(m, "tollgate_upstream_usage_refused_total{upstream=\"local\"} 0\n") {
		t.Errorf("a believed zero was counted as refused")
	}
}

// The prompt a cut /v1/responses stream is billed on left out input the
// model reads: a reasoning item's text in its summary alone (vLLM reads
// its content or its summary) counted 2 tokens for ~1,500; an assistant
// message's refusal part 2; a text file's content in an input_file's
// file_data 0. They are counted now; a file that is not text (a PDF) is
// not, the tokenizer having no way to read it.
func TestCutResponsesStreamsPromptCountsSummariesRefusalsAndTextFiles(t *testing.T) {
	long := strings.Repeat("The quick brown fox jumps over the lazy dog near the river bank. ", 110)
	b64 := base64.StdEncoding.EncodeToString([]byte(long))
	cut := responsesEvent(`{"type":"response.created","sequence_number":0,"response":{"id":"resp_cut","object":"response","status":"in_progress","output":[],"usage":null}}`) +
		responsesEvent(`{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Sure"}`)
	next := `{"role":"user","content":"go on"}`
	for _, tc := range []struct {
		name, item string
		text       string // counted in the prompt
	}{
		{"a reasoning item's summary", `{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"` + long + `"}]}`, long},
		{"a reasoning item's content, not its summary too", `{"type":"reasoning","id":"rs_1","content":[{"type":"reasoning_text","text":"` + long + `"}],"summary":[{"type":"summary_text","text":"` + long + `"}]}`, long},
		{"an assistant's refusal", `{"role":"assistant","content":[{"type":"refusal","refusal":"` + long + `"}]}`, long},
		{"a text file", `{"role":"user","content":[{"type":"input_file","filename":"notes.txt","file_data":"data:text/plain;base64,` + b64 + `"}]}`, long},
		{"a text file, not base64", `{"role":"user","content":[{"type":"input_file","filename":"a.txt","file_data":"data:text/plain,one%20two%20three"}]}`, "one two three"},
		{"a PDF", `{"role":"user","content":[{"type":"input_file","filename":"a.pdf","file_data":"data:application/pdf;base64,` + b64 + `"}]}`, ""},
	} {
		h := newHarness(t, harnessOptions{})
		answerWith(t, h, cut)
		_, ev := billedResponses(t, h, `{"model":"small","stream":true,"input":[`+tc.item+`,`+next+`]}`, "resp_cut")
		// Each piece of text counts apart, with a newline after it.
		want := int64(tokens.Count("go on\n"))
		if tc.text != "" {
			want += int64(tokens.Count(tc.text + "\n"))
		}
		if ev.UsageSource != meter.SourceEstimated || ev.PromptTokens < want || ev.PromptTokens > want+2 {
			t.Errorf("%s: prompt billed %d (%s), want %d estimated", tc.name, ev.PromptTokens, ev.UsageSource, want)
		}
	}
}
