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
	if got := parseUsage(u, true); got.PromptTokens != 7 || got.CompletionTokens != 3 {
		t.Errorf("responses: %+v, want 7 and 3", got)
	}
	if got := parseUsage(u, false); got.PromptTokens != 50000 || got.CompletionTokens != 50000 {
		t.Errorf("chat: %+v, want 50000 and 50000", got)
	}
}
