package proxy

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// Tool calls are generated tokens, and tool definitions and earlier calls
// are prompt: usage estimated for a cut stream of tool calls was 0
// completion tokens, and the prompt left out the tools.
func TestEstimatedUsageCountsToolCalls(t *testing.T) {
	var c generationCall
	c.readChoices(gjson.Parse(`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"get_weather","arguments":"{\"city\":"}}]},"finish_reason":null}]`))
	c.readChoices(gjson.Parse(`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":null}]`))
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

	prompt := promptText([]byte(`{"model":"m","tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],`+
		`"messages":[{"role":"user","content":"weather?"},{"role":"assistant","tool_calls":[{"function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","content":"sunny"}]}`), endpointChat)
	for _, want := range []string{`"name":"get_weather"`, "weather?", `{"city":"Paris"}`, "sunny"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("prompt text lacks %q: %q", want, prompt)
		}
	}
	prompt = promptText([]byte(`{"model":"m","input":[{"type":"function_call","name":"lookup","arguments":"{\"id\":7}"},{"type":"function_call_output","output":"found it"}]}`), endpointResponses)
	for _, want := range []string{`{"id":7}`, "found it"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("responses prompt text lacks %q: %q", want, prompt)
		}
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
