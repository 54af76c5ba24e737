package proxy

import (
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/internal/utf8cut"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/tokens"
)

// Tool calls are generated tokens, and tool definitions and earlier calls
// are prompt: usage estimated for a cut stream of tool calls was 0
// completion tokens, and the prompt left out the tools.
func TestEstimatedUsageCountsToolCalls(t *testing.T) {
	var c generationCall
	c.readChoices(gjson.Parse(`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"get_weather","arguments":"{\"city\":"}}]},"finish_reason":null}]`), false)
	c.readChoices(gjson.Parse(`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":null}]`), false)
	if got := string(c.text); got != `get_weather{"city":"Paris"}` {
		t.Errorf("streamed tool call kept as %q", got)
	}

	c = generationCall{ep: endpointChat}
	c.collectWholeText([]byte(`{"choices":[{"message":{"content":null,"tool_calls":[{"function":{"name":"lookup","arguments":"{\"id\":7}"}}]}}]}`))
	if got := string(c.text); got != `lookup{"id":7}` {
		t.Errorf("whole tool call kept as %q", got)
	}

	c = generationCall{ep: endpointResponses}
	c.collectWholeText([]byte(`{"output":[{"type":"function_call","name":"lookup","arguments":"{\"id\":7}"}]}`))
	if got := string(c.text); got != `lookup{"id":7}` {
		t.Errorf("responses function call kept as %q", got)
	}

	// A reasoning item's summary is generated text too; the black-box
	// session found it left out of the estimate.
	c = generationCall{ep: endpointResponses}
	c.collectWholeText([]byte(`{"output":[{"type":"reasoning","summary":[{"type":"summary_text","text":"Look it up."}],"content":[{"type":"reasoning_text","text":"hmm"}]},` +
		`{"type":"function_call","name":"lookup","arguments":"{\"id\":7}"}]}`))
	if got := string(c.text); got != `hmmLook it up.lookup{"id":7}` {
		t.Errorf("responses reasoning and function call kept as %q", got)
	}

	prompt := promptText([]byte(`{"model":"m","tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],`+
		`"messages":[{"role":"user","content":"weather?"},{"role":"assistant","tool_calls":[{"function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","content":"sunny"}]}`), endpointChat)
	for _, want := range []string{`"name":"get_weather"`, "weather?", `{"city":"Paris"}`, "sunny"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("prompt text lacks %q: %q", want, prompt)
		}
	}
	// A structured output's schema is read by the model, as tools are.
	prompt = promptText([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object","properties":{"temperature_celsius":{"type":"number"}}}}}}`), endpointChat)
	if !strings.Contains(prompt, "temperature_celsius") {
		t.Errorf("chat prompt text lacks the response_format schema: %q", prompt)
	}
	prompt = promptText([]byte(`{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"w","schema":{"type":"object","properties":{"temperature_celsius":{"type":"number"}}}}}}`), endpointResponses)
	if !strings.Contains(prompt, "temperature_celsius") {
		t.Errorf("responses prompt text lacks the text.format schema: %q", prompt)
	}
	prompt = promptText([]byte(`{"model":"m","input":[{"type":"function_call","name":"lookup","arguments":"{\"id\":7}"},{"type":"function_call_output","output":"found it"}]}`), endpointResponses)
	for _, want := range []string{`{"id":7}`, "found it"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("responses prompt text lacks %q: %q", want, prompt)
		}
	}
}

// A refusal is generated text: streamed or whole, chat or responses, it
// was left out of an estimate, and a refusal that came without usage was
// billed no completion tokens.
func TestEstimatedUsageCountsRefusals(t *testing.T) {
	var c generationCall
	c.readChoices(gjson.Parse(`[{"index":0,"delta":{"refusal":"I cannot "},"finish_reason":null}]`), false)
	c.readChoices(gjson.Parse(`[{"index":0,"delta":{"refusal":"help with that."},"finish_reason":null}]`), false)
	if got := string(c.text); got != "I cannot help with that." {
		t.Errorf("streamed refusal kept as %q", got)
	}
	c = generationCall{ep: endpointChat}
	c.collectWholeText([]byte(`{"choices":[{"message":{"content":null,"refusal":"I cannot help with that."}}]}`))
	if got := string(c.text); got != "I cannot help with that." {
		t.Errorf("whole refusal kept as %q", got)
	}
	c = generationCall{ep: endpointResponses}
	c.collectWholeText([]byte(`{"output":[{"type":"message","content":[{"type":"refusal","refusal":"I cannot help with that."}]}]}`))
	if got := string(c.text); got != "I cannot help with that." {
		t.Errorf("responses refusal part kept as %q", got)
	}
}

// Usage in both dialects is billed in the endpoint's own, the one its SDK
// shows the client.
func TestParseUsagePrefersTheEndpointsDialect(t *testing.T) {
	u := gjson.Parse(`{"input_tokens":7,"output_tokens":3,"prompt_tokens":50000,"completion_tokens":50000}`)
	if got, _ := parseUsage(u, true); got.PromptTokens != 7 || got.CompletionTokens != 3 {
		t.Errorf("responses: %+v, want 7 and 3", got)
	}
	if got, _ := parseUsage(u, false); got.PromptTokens != 50000 || got.CompletionTokens != 50000 {
		t.Errorf("chat: %+v, want 50000 and 50000", got)
	}
}

// A usage object is a report only with both counts given as numbers: {}
// and strings gjson reads as 0 were billed nothing, as the upstream's.
func TestParseUsageNeedsBothCountsAsNumbers(t *testing.T) {
	for _, tc := range []struct {
		usage              string
		reported           bool
		prompt, completion int64
	}{
		{`{"prompt_tokens":12,"completion_tokens":5}`, true, 12, 5},
		{`{"prompt_tokens":"12","completion_tokens":"5"}`, true, 12, 5},
		{`{"prompt_tokens":1e3,"completion_tokens":10.2}`, true, 1000, 11}, // a fraction counts as a token
		{`{"input_tokens":4,"output_tokens":0}`, true, 4, 0},
		{`{}`, false, 0, 0},
		{`{"total_tokens":5000}`, false, 0, 0},
		{`{"prompt_tokens":"abc","completion_tokens":"x"}`, false, 0, 0},
		{`{"prompt_tokens":" 1000","completion_tokens":3}`, false, 0, 3},
		{`{"prompt_tokens":null,"completion_tokens":null}`, false, 0, 0},
		{`{"prompt_tokens":12}`, false, 12, 0},
		{`{"prompt_tokens":true,"completion_tokens":[1]}`, false, 0, 0},
		{`{"prompt_tokens":10,"completion_tokens":-0.5}`, true, 10, -1}, // out of range, for checkUsage
	} {
		got, reported := parseUsage(gjson.Parse(tc.usage), false)
		if reported != tc.reported || got.PromptTokens != tc.prompt || got.CompletionTokens != tc.completion {
			t.Errorf("%s: %+v reported %v; want %d and %d, reported %v", tc.usage, got, reported, tc.prompt, tc.completion, tc.reported)
		}
	}
}

// DeepSeek reports its cache hits as prompt_cache_hit_tokens, not in
// prompt_tokens_details: unread, a call's 40 cached tokens of 100 were
// billed at the full prompt price, on a client's call and on the llm
// engine's alike. OpenAI's spelling wins where both are; either is cut
// to the prompt.
func TestDeepSeekCacheHitsAreCached(t *testing.T) {
	for _, tc := range []struct {
		usage  string
		cached int64
	}{
		{`{"prompt_tokens":100,"completion_tokens":9,"total_tokens":109,"prompt_cache_hit_tokens":40,"prompt_cache_miss_tokens":60}`, 40},
		{`{"prompt_tokens":100,"completion_tokens":9,"total_tokens":109,"prompt_tokens_details":{"cached_tokens":40},"prompt_cache_hit_tokens":40,"prompt_cache_miss_tokens":60}`, 40},
		{`{"prompt_tokens":100,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":30},"prompt_cache_hit_tokens":40}`, 30},
		{`{"prompt_tokens":100,"completion_tokens":9,"prompt_cache_hit_tokens":400}`, 100},
		{`{"prompt_tokens":100,"completion_tokens":9}`, 0},
	} {
		got, refused := believedUsage(gjson.Parse(tc.usage), false)
		if refused != "" || got.PromptTokens != 100 || got.CachedTokens != tc.cached {
			t.Errorf("%s: %+v (refused %q), want 100 prompt tokens, %d cached", tc.usage, got, refused, tc.cached)
		}
	}
	c := &generationCall{ep: endpointChat, upstream: &upstream{}}
	answer := `{"choices":[{"index":0,"message":{"role":"assistant","content":"1"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":100,"completion_tokens":9,"total_tokens":109,"prompt_cache_hit_tokens":40,"prompt_cache_miss_tokens":60}}`
	if got := c.engineUsage([]byte(`{"messages":[{"role":"user","content":"x"}]}`), []byte(answer)); got.CachedTokens != 40 || got.Estimated {
		t.Errorf("the llm engine's call: %+v, want 40 cached tokens as reported", got)
	}
}

// estimateCall is a call whose upstream reports no usage, enough of one
// for event to bill it.
func estimateCall(ep endpoint) *generationCall {
	up := &upstream{}
	up.cfg.Name = "gpu-a"
	body := []byte(`{"model":"small","messages":[{"role":"user","content":"hi"}]}`)
	return &generationCall{ep: ep, upstream: up, key: &accounts.Key{Account: "acme"}, entry: &catalog.Entry{ID: "small"}, reqBody: &body}
}

// TestEstimateCountsTextOverFourMiB: the text kept for an estimate was
// capped at 4 MiB, and a string that did not fit was dropped whole. An
// answer of 5 MB without usage was billed 0 completion tokens, a stream
// of 8 MB the first 4 MiB of its text; now every byte is counted.
func TestEstimateCountsTextOverFourMiB(t *testing.T) {
	const words = 1_100_000 // " word" is one token: 5.5 MB of text
	text := strings.Repeat(" word", words)

	c := estimateCall(endpointChat)
	if got := c.engineUsage(*c.reqBody, []byte(`{"choices":[{"message":{"content":"`+text+`"}}]}`)).CompletionTokens; got != words {
		t.Errorf("a whole answer of %d bytes: %d completion tokens, want %d", len(text), got, words)
	}

	c = estimateCall(endpointChat)
	const chunkWords, chunks = 13_000, 130 // 8.5 MB of text in 65 kB chunks
	data := []byte(`{"choices":[{"index":0,"delta":{"content":"` + text[:chunkWords*len(" word")] + `"},"finish_reason":null}]}`)
	for range chunks {
		ev := sseEvent{Data: data, Complete: true}
		c.inspectChat(&ev)
	}
	if got := c.event(200).CompletionTokens; got != chunkWords*chunks {
		t.Errorf("a stream of %d bytes of text: %d completion tokens, want %d", chunkWords*chunks*len(" word"), got, chunkWords*chunks)
	}

	c = estimateCall(endpointResponses)
	c.collectWholeText([]byte(`{"output":[{"type":"message","content":[{"type":"output_text","text":"` + text + `"}]}]}`))
	if got := c.event(200).CompletionTokens; got != words {
		t.Errorf("a whole responses answer of %d bytes: %d completion tokens, want %d", len(text), got, words)
	}
}

// An answer's text counted a buffer at a time adds up to the count of the
// whole, whatever the sizes of the pieces it came in: the buffer is cut
// where no token spans the cut. Text without spaces is cut between two
// characters and may count a token or two more per cut.
func TestAppendCountedAddsUpToTheWhole(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name  string
		text  string
		exact bool
	}{
		{"README", string(readme), true},
		{"spaces", strings.Repeat("a  b\u3000 c\t d.\n\n e's  ", 3000), true},
		{"Japanese", strings.Repeat("日本語のテキストと中文文本，还有한국어텍스트。", 2000), true},
		{"base64", strings.Repeat("QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=", 2000), true},
		{"random", randomText(rng, 60000), true},
		{"one word", strings.Repeat("漢字", 20000), false},
	} {
		want := int64(tokens.Count(tc.text))
		for _, limit := range []int{1000, 4096} {
			var text []byte
			var counted int64
			cuts := 0
			for s := tc.text; len(s) > 0; {
				n := min(len(s), 1+rng.IntN(300))
				before := counted
				text, counted = countPast(append(text, s[:n]...), counted, limit)
				if counted != before {
					cuts++
				}
				if len(text) > limit {
					t.Fatalf("%s: %d bytes kept, limit %d", tc.name, len(text), limit)
				}
				s = s[n:]
			}
			got := counted + int64(tokens.Count(string(text)))
			if cuts == 0 {
				t.Fatalf("%s: never cut at limit %d", tc.name, limit)
			}
			if d := max(got-want, want-got); tc.exact && d != 0 || d > 2*int64(cuts) {
				t.Errorf("%s, limit %d: %d tokens in %d cuts, whole %d", tc.name, limit, got, cuts, want)
			}
		}
	}
}

// randomText is n characters of letters, marks, digits, punctuation and
// whitespace of several scripts, in words of random length.
func randomText(rng *rand.Rand, n int) string {
	alphabet := []rune("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789      \n\n\t\r.,;:'\"!?-_/\\()[]{}<>éüßçñøåæœ\u0301\u00a0\u3000漢字かなカナ한글ДжЯ€£¥🙂👍，。")
	var b strings.Builder
	for range n {
		b.WriteRune(alphabet[rng.IntN(len(alphabet))])
	}
	return b.String()
}

// xAI and Gemini's OpenAI-compatible API count reasoning apart from the
// completion: total_tokens = prompt + completion + reasoning. Their
// reasoning was cut to the completion's count and went unbilled (2,809
// tokens of this report); it is now billed as completion. OpenAI's, which
// is part of the completion, is billed as before.
func TestReasoningOutsideTheCompletionIsBilled(t *testing.T) {
	for _, tc := range []struct {
		name, usage          string
		responses            bool
		completion, reasoned int64
	}{
		{"xAI", `{"prompt_tokens":10120,"completion_tokens":1499,"total_tokens":14428,"prompt_tokens_details":{"cached_tokens":128},"completion_tokens_details":{"reasoning_tokens":2809}}`, false, 1499 + 2809, 2809},
		{"OpenAI", `{"prompt_tokens":10120,"completion_tokens":4308,"total_tokens":14428,"completion_tokens_details":{"reasoning_tokens":2809}}`, false, 4308, 2809},
		{"responses apart", `{"input_tokens":100,"output_tokens":20,"total_tokens":150,"output_tokens_details":{"reasoning_tokens":30}}`, true, 50, 30},
		{"apart, fewer", `{"prompt_tokens":10,"completion_tokens":100,"total_tokens":150,"completion_tokens_details":{"reasoning_tokens":40}}`, false, 140, 40},
		{"no total", `{"prompt_tokens":100,"completion_tokens":20,"completion_tokens_details":{"reasoning_tokens":30}}`, false, 20, 20},
		{"total unrelated", `{"prompt_tokens":100,"completion_tokens":20,"total_tokens":999,"completion_tokens_details":{"reasoning_tokens":30}}`, false, 20, 20},
	} {
		u, refused := believedUsage(gjson.Parse(tc.usage), tc.responses)
		if refused != "" || u.CompletionTokens != tc.completion || u.ReasoningTokens != tc.reasoned {
			t.Errorf("%s: completion %d, reasoning %d (%q); want %d and %d", tc.name, u.CompletionTokens, u.ReasoningTokens, refused, tc.completion, tc.reasoned)
		}
	}
}

// oneEventReader hands out one event per Read, as an upstream writing
// them one by one does, so the relay writes each on its own.
type oneEventReader struct{ events []string }

func (r *oneEventReader) Read(p []byte) (int, error) {
	if len(r.events) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.events[0])
	if r.events[0] = r.events[0][n:]; r.events[0] == "" {
		r.events = r.events[1:]
	}
	return n, nil
}

// goneClient accepts writes until it has taken ok of them, then fails
// every one, as the socket of a client that went away does.
type goneClient struct{ ok int }

func (w *goneClient) Write(p []byte) (int, error) {
	if w.ok == 0 {
		return 0, syscall.EPIPE
	}
	w.ok--
	return len(p), nil
}

// A client that went away was billed for the text of the events whose
// write to it failed, which it never got; the estimate is of the text
// written to its socket.
func TestEstimateLeavesOutTextTheClientNeverGot(t *testing.T) {
	for _, logging := range []bool{false, true} {
		c := estimateCall(endpointChat)
		c.stream, c.logging.Enabled = true, logging
		var events []string
		for range 5 {
			events = append(events, `data: {"id":"a","choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}`+"\n\n")
		}
		c.sse, c.sseStarted = newSSEReader(&oneEventReader{events: events}, 4096, 1<<20), true
		if _, err := c.WriteTo(&goneClient{ok: 2}); err == nil {
			t.Fatal("the relay did not see the client gone")
		}
		if got := c.event(200).CompletionTokens; got != 2 {
			t.Errorf("logging %v: %d completion tokens billed, want the 2 written before the client went", logging, got)
		}
	}
}

// A logging key's stream kept up to 4 MiB of its text, though the usage
// event carries at most 256 KiB of it, and an answer past 4 MiB was logged
// with a cut line that left out what came after them. The stream keeps
// what the event can carry and counts the rest, less the text of events
// the client never got.
func TestStreamLogKeepsWhatTheEventCarriesAndCountsTheRest(t *testing.T) {
	content := "x" + strings.Repeat("é", 50_000) // 100,001 bytes; the bound falls inside an é
	const events, written = 60, 50
	c := estimateCall(endpointChat)
	c.stream, c.eventStream, c.logging.Enabled = true, true, true
	var sse []string
	for range events {
		sse = append(sse, `data: {"id":"a","choices":[{"index":0,"delta":{"content":"`+content+`"},"finish_reason":null}]}`+"\n\n")
	}
	c.sse, c.sseStarted = newSSEReader(&oneEventReader{events: sse}, 4096, 1<<20), true
	if _, err := c.WriteTo(&goneClient{ok: written}); err == nil {
		t.Fatal("the relay did not see the client gone")
	}
	if cap(c.logText) > meter.MaxLogBytes {
		t.Errorf("the stream holds %d bytes for its log; want at most the %d an event carries", cap(c.logText), meter.MaxLogBytes)
	}
	whole := strings.Repeat(content, written)
	log := c.requestLog()
	if len(log.Response) < meter.MaxLogBytes-utf8.UTFMax || !strings.HasPrefix(whole, log.Response) || !utf8.ValidString(log.Response) {
		t.Fatalf("logged %d bytes of the answer; want its start, up to the %d an event carries, cut between characters", len(log.Response), meter.MaxLogBytes)
	}
	if want := int64(len(whole) - len(log.Response)); log.ResponseLeftOut != want {
		t.Errorf("%d bytes counted as left out of the log; want the %d written to the client and not kept", log.ResponseLeftOut, want)
	}
}

// A function call whose argument deltas straddled a count of the kept text
// (once every 4 MiB, see countPast) had the part counted before the
// cut counted again when function_call_arguments.done repeated the
// arguments: the kept text no longer ended with all the deltas had
// delivered, and done added what it did not find there. The arguments
// count once, however the counts fall.
func TestToolArgumentsStraddlingACountAreCountedOnce(t *testing.T) {
	event := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	const argWords = 500
	before := strings.Repeat(" word", (maxEstimateText-argWords*len(" arg")/2)/len(" word")) // the count falls amid the deltas
	args := strings.Repeat(" arg", argWords)
	var stream strings.Builder
	stream.WriteString(event("response.output_text.delta", `{"type":"response.output_text.delta","output_index":0,"delta":"`+before+`"}`))
	stream.WriteString(event("response.output_item.added", `{"type":"response.output_item.added","output_index":1,"item":{"type":"function_call","name":"lookup","arguments":""}}`))
	for range argWords {
		stream.WriteString(event("response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","output_index":1,"delta":" arg"}`))
	}
	stream.WriteString(event("response.function_call_arguments.done", `{"type":"response.function_call_arguments.done","output_index":1,"arguments":"`+args+`"}`))
	stream.WriteString(event("response.output_item.done", `{"type":"response.output_item.done","output_index":1,"item":{"type":"function_call","name":"lookup","arguments":"`+args+`"}}`))

	c := estimateCall(endpointResponses)
	inspectAll(c, newSSEReader(strings.NewReader(stream.String()), 4096, 0))
	if c.textTokens == 0 {
		t.Fatal("the kept text was never counted: the test does not straddle a count")
	}
	if got, want := c.completionEstimate(), int64(tokens.Count(before+"lookup"+args)); got != want {
		t.Errorf("estimated %d completion tokens; want the %d of the text, name and arguments relayed", got, want)
	}
}

// A whole Responses answer without usage counted its function calls but
// not its custom tools' calls or MCP calls, and a request's earlier
// custom tool call left its input out of the prompt. An MCP call's output,
// written by the hosted tool and read by the model, is prompt.
func TestEstimateCountsCustomAndMCPToolCalls(t *testing.T) {
	c := estimateCall(endpointResponses)
	c.collectWholeText([]byte(`{"output":[{"type":"custom_tool_call","call_id":"call_1","name":"apply_patch","input":"*** Begin Patch"},` +
		`{"type":"mcp_call","server_label":"github","name":"search_code","arguments":"{\"q\":\"usage\"}","output":"main.go:12"},` +
		`{"type":"mcp_approval_request","server_label":"github","name":"create_issue","arguments":"{\"title\":\"bug\"}"},` +
		`{"type":"code_interpreter_call","container_id":"cntr_1","code":"print(6*7)","outputs":[]}]}`))
	if got, want := string(c.text), `apply_patch*** Begin Patchsearch_code{"q":"usage"}create_issue{"title":"bug"}print(6*7)`; got != want {
		t.Errorf("kept %q, want %q", got, want)
	}
	if got := string(c.toolOutput); got != "main.go:12" {
		t.Errorf("kept %q of the tools' output, want the MCP call's", got)
	}

	prompt := promptText([]byte(`{"model":"m","input":[{"type":"custom_tool_call","call_id":"call_1","name":"apply_patch","input":"*** Begin Patch"},`+
		`{"type":"custom_tool_call_output","call_id":"call_1","output":"done"}]}`), endpointResponses)
	for _, want := range []string{"apply_patch", "*** Begin Patch", "done"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("responses prompt text lacks %q: %q", want, prompt)
		}
	}
}

// An upstream that ends its tool calls' items after later ones began
// (output_item.done of the first after output_item.added of the second)
// has each call's name and input counted once.
func TestToolCallsEndedOutOfOrderAreCountedOnce(t *testing.T) {
	event := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	item := func(typ string, i int, name, args string) string {
		return event("response.output_item."+typ, `{"type":"response.output_item.`+typ+`","output_index":`+strconv.Itoa(i)+
			`,"item":{"type":"function_call","name":"`+name+`","arguments":"`+args+`"}}`)
	}
	delta := func(i int, d string) string {
		return event("response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","output_index":`+strconv.Itoa(i)+`,"delta":"`+d+`"}`)
	}
	stream := item("added", 0, "lookup", "") + delta(0, "seven") + item("added", 1, "fetch", "") + delta(1, "eight") +
		delta(0, " ate") + item("done", 0, "lookup", "seven ate") + item("done", 1, "fetch", "eight nine")
	c := estimateCall(endpointResponses)
	inspectAll(c, newSSEReader(strings.NewReader(stream), 4096, 0))
	if got, want := string(c.text), "lookupsevenfetcheight ate nine"; got != want {
		t.Errorf("kept %q, want %q", got, want)
	}
}

// The code a model writes for the code interpreter is generated text:
// streamed in code deltas, then whole in their done and the item's done,
// it is counted once; an upstream that sends it only whole is counted too.
func TestCodeInterpreterCodeIsCountedOnce(t *testing.T) {
	event := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	item := func(typ string, i int, code string) string {
		return event("response.output_item."+typ, `{"type":"response.output_item.`+typ+`","output_index":`+strconv.Itoa(i)+
			`,"item":{"type":"code_interpreter_call","container_id":"cntr_1","code":"`+code+`"}}`)
	}
	code := func(kind string, i int, member, text string) string {
		return event("response.code_interpreter_call_code."+kind, `{"type":"response.code_interpreter_call_code.`+kind+`","output_index":`+
			strconv.Itoa(i)+`,"`+member+`":"`+text+`"}`)
	}
	stream := item("added", 0, "") + code("delta", 0, "delta", "print(") + code("delta", 0, "delta", "6*7)") +
		code("done", 0, "code", "print(6*7)") + item("done", 0, "print(6*7)") +
		item("added", 1, "") + code("done", 1, "code", "x = 1")
	c := estimateCall(endpointResponses)
	inspectAll(c, newSSEReader(strings.NewReader(stream), 4096, 0))
	if got, want := string(c.text), "print(6*7)x = 1"; got != want {
		t.Errorf("kept %q, want %q", got, want)
	}
}

// The tool list an MCP server returned (an mcp_list_tools output item) is
// read by the model as its tool definitions are: a cut Responses stream
// counts its tools as prompt, as an MCP call's output is, once, and so
// does the estimate of a request whose input replays such an item.
func TestEstimateCountsMCPToolLists(t *testing.T) {
	const tools = `[{"name":"ask_question","input_schema":{"type":"object","properties":{"question":{"type":"string"}}},"description":"Ask about a repository"}]`
	c := estimateCall(endpointResponses)
	c.collectWholeText([]byte(`{"output":[{"type":"mcp_list_tools","id":"mcpl_1","server_label":"deepwiki","tools":` + tools + `,"error":null}]}`))
	if got := string(c.toolOutput); got != tools {
		t.Errorf("whole answer: kept %q as tool output, want the tools %q", got, tools)
	}
	event := func(typ, item string) string {
		return "event: " + typ + "\ndata: " + `{"type":"` + typ + `","output_index":0,"item":` + item + "}\n\n"
	}
	stream := event("response.output_item.added", `{"type":"mcp_list_tools","id":"mcpl_1","server_label":"deepwiki","tools":[]}`) +
		event("response.output_item.done", `{"type":"mcp_list_tools","id":"mcpl_1","server_label":"deepwiki","tools":`+tools+`}`)
	c = estimateCall(endpointResponses)
	inspectAll(c, newSSEReader(strings.NewReader(stream), 4096, 0))
	if got := string(c.toolOutput); got != tools {
		t.Errorf("stream: kept %q as tool output, want the tools once %q", got, tools)
	}
	prompt := promptText([]byte(`{"model":"m","input":[{"type":"mcp_list_tools","id":"mcpl_1","server_label":"deepwiki","tools":`+tools+`},`+
		`{"role":"user","content":"hi"}]}`), endpointResponses)
	if !strings.Contains(prompt, tools) || !strings.Contains(prompt, "hi") {
		t.Errorf("prompt text %q leaves out the tool list in the input", prompt)
	}
}

// A write that failed carried a usage report and output after it: the
// client got neither, so that output is not billed on top of the report,
// and the text before the report, which it counts, does not come back.
func TestForgetTextAfterAUsageReport(t *testing.T) {
	c := &generationCall{ep: endpointChat}
	c.appendText("before the report")
	m := c.markText()
	if !c.setUsage(gjson.Parse(`{"prompt_tokens":10,"completion_tokens":4}`)) {
		t.Fatal("report not believed")
	}
	c.appendText(" after")
	c.forgetText(m)
	if len(c.text) != 0 || c.textTokens != 0 {
		t.Fatalf("kept %q (%d tokens counted) for the estimate, want nothing", c.text, c.textTokens)
	}
}

// Text a Responses stream sends whole, in a part's done event or in
// output_item.done, with no deltas, is generated text as deltas are: a
// cut stream whose 500 words came in response.output_text.done was billed
// 0 completion tokens. Text that came in deltas is not counted again when
// the done events repeat it; an item whose parts came partly in deltas is
// counted once too.
func TestResponsesTextSentWholeIsCountedOnce(t *testing.T) {
	event := func(typ, data string) string {
		return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\"," + data + "}\n\n"
	}
	part := func(kind string, i, part int, member, text string) string {
		return event("response."+kind, `"output_index":`+strconv.Itoa(i)+`,"content_index":`+strconv.Itoa(part)+`,"`+member+`":"`+text+`"`)
	}
	summary := func(kind string, i, part int, member, text string) string {
		return event("response."+kind, `"output_index":`+strconv.Itoa(i)+`,"summary_index":`+strconv.Itoa(part)+`,"`+member+`":"`+text+`"`)
	}
	item := func(kind string, i int, item string) string {
		return event("response.output_item."+kind, `"output_index":`+strconv.Itoa(i)+`,"item":`+item)
	}
	message := func(parts ...string) string {
		return `{"type":"message","role":"assistant","content":[` + strings.Join(parts, ",") + `]}`
	}
	outputText := func(text string) string { return `{"type":"output_text","annotations":[],"text":"` + text + `"}` }
	words := strings.Repeat(" word", 500)
	for _, tc := range []struct {
		name, stream, want string
	}{{
		name: "text in its done events only",
		stream: item("added", 0, message()) + event("response.content_part.added", `"output_index":0,"content_index":0,"part":`+outputText("")) + part("output_text.done", 0, 0, "text", words) +
			event("response.content_part.done", `"output_index":0,"content_index":0,"part":`+outputText(words)) +
			item("done", 0, message(outputText(words))),
		want: words,
	}, {
		name:   "text in output_item.done only",
		stream: item("added", 0, message()) + item("done", 0, message(outputText(words))),
		want:   words,
	}, {
		name: "text in deltas, repeated whole",
		stream: item("added", 0, message()) + part("output_text.delta", 0, 0, "delta", "Hello") + part("output_text.delta", 0, 0, "delta", " there") +
			part("output_text.done", 0, 0, "text", "Hello there") +
			event("response.content_part.done", `"output_index":0,"content_index":0,"part":`+outputText("Hello there")) +
			item("done", 0, message(outputText("Hello there"))),
		want: "Hello there",
	}, {
		name: "a part in deltas, the next only whole",
		stream: item("added", 0, message()) + part("output_text.delta", 0, 0, "delta", "First.") +
			part("output_text.done", 0, 0, "text", "First.") + item("done", 0, message(outputText("First."), outputText(" Second."))),
		want: "First. Second.",
	}, {
		name: "a refusal and a reasoning summary, whole",
		stream: item("added", 0, `{"type":"reasoning","summary":[]}`) + summary("reasoning_summary_text.done", 0, 0, "text", "Think.") +
			event("response.reasoning_summary_part.done", `"output_index":0,"summary_index":0,"part":{"type":"summary_text","text":"Think."}`) +
			item("done", 0, `{"type":"reasoning","summary":[{"type":"summary_text","text":"Think."}]}`) +
			item("added", 1, message()) + part("refusal.done", 1, 0, "refusal", "No.") +
			event("response.content_part.done", `"output_index":1,"content_index":0,"part":{"type":"refusal","refusal":"No."}`) +
			item("done", 1, message(`{"type":"refusal","refusal":"No."}`)),
		want: "Think.No.",
	}, {
		name: "reasoning text in deltas, its summary whole",
		stream: item("added", 0, `{"type":"reasoning","summary":[],"content":[]}`) + part("reasoning_text.delta", 0, 0, "delta", "hmm") +
			part("reasoning_text.done", 0, 0, "text", "hmm") + summary("reasoning_summary_text.done", 0, 0, "text", "Look it up.") +
			item("done", 0, `{"type":"reasoning","summary":[{"type":"summary_text","text":"Look it up."}],"content":[{"type":"reasoning_text","text":"hmm"}]}`),
		want: "hmmLook it up.",
	}} {
		c := estimateCall(endpointResponses)
		inspectAll(c, newSSEReader(strings.NewReader(tc.stream), 4096, 0))
		if got := string(c.text); got != tc.want {
			t.Errorf("%s: kept %q, want %q", tc.name, utf8cut.Shorten(got, 60), utf8cut.Shorten(tc.want, 60))
		}
	}
}
