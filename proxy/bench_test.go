package proxy

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/accounts"
)

var streamBody = strings.Repeat(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}],"usage":null}`+"\n\n", 20) +
	`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}` + "\n\ndata: [DONE]\n\n"

func BenchmarkRewriteRequest(b *testing.B) {
	body := []byte(`{"model":"small","stream":true,"temperature":0.2,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"` + strings.Repeat("hello ", 200) + `"}]}`)
	dst := make([]byte, 0, 8192)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		f, _ := scanRequest(body)
		dst, _ = rewriteRequest(dst[:0], body, &f, `"Qwen/Qwen2.5-14B-Instruct-1M"`, true)
	}
}

// BenchmarkSSERelayInjectedUsage parses and filters one 20-chunk chat
// stream whose usage the client did not ask for: every chunk is stripped
// of "usage":null and the usage-only chunk is dropped.
func BenchmarkSSERelayInjectedUsage(b *testing.B) {
	src := strings.NewReader(streamBody)
	rd := newSSEReader(src, 4096, 0)
	c := &generationCall{injected: true, ep: endpointChat}
	b.SetBytes(int64(len(streamBody)))
	b.ReportAllocs()
	for b.Loop() {
		src.Reset(streamBody)
		rd.reset(src)
		c.haveUsage, c.finished, c.text = false, false, c.text[:0]
		for {
			ev, err := rd.Next()
			if err != nil {
				break
			}
			c.inspectChat(&ev)
		}
	}
}

// responsesToolStream is a Responses stream without usage, as a cut one
// is billed: a reasoning summary, then a function call whose name comes
// in its output_item.added and whose arguments come in deltas (without
// escapes, which gjson allocates to undo), a custom tool's call whose
// input comes in deltas, and an MCP call that ends with its output.
var responsesToolStream = `event: response.created` + "\n" + `data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_0123456789abcdef","object":"response","status":"in_progress","usage":null}}` + "\n\n" +
	strings.Repeat(`event: response.reasoning_summary_text.delta`+"\n"+`data: {"type":"response.reasoning_summary_text.delta","sequence_number":1,"item_id":"rs_1","output_index":0,"summary_index":0,"delta":" think"}`+"\n\n", 10) +
	`event: response.output_item.added` + "\n" + `data: {"type":"response.output_item.added","sequence_number":2,"output_index":1,"item":{"id":"fc_1","type":"function_call","status":"in_progress","arguments":"","call_id":"call_1","name":"get_weather"}}` + "\n\n" +
	strings.Repeat(`event: response.function_call_arguments.delta`+"\n"+`data: {"type":"response.function_call_arguments.delta","sequence_number":3,"item_id":"fc_1","output_index":1,"delta":"city"}`+"\n\n", 10) +
	`event: response.output_item.added` + "\n" + `data: {"type":"response.output_item.added","sequence_number":4,"output_index":2,"item":{"id":"ctc_1","type":"custom_tool_call","status":"in_progress","input":"","call_id":"call_2","name":"apply_patch"}}` + "\n\n" +
	strings.Repeat(`event: response.custom_tool_call_input.delta`+"\n"+`data: {"type":"response.custom_tool_call_input.delta","sequence_number":5,"item_id":"ctc_1","output_index":2,"delta":"+line"}`+"\n\n", 10) +
	`event: response.output_item.done` + "\n" + `data: {"type":"response.output_item.done","sequence_number":6,"output_index":3,"item":{"id":"mcp_1","type":"mcp_call","status":"completed","server_label":"github","name":"search_code","arguments":"usage","output":"found"}}` + "\n\n"

// BenchmarkSSERelayResponsesEstimated parses one Responses stream whose
// usage has to be estimated, keeping the text it forwarded.
func BenchmarkSSERelayResponsesEstimated(b *testing.B) {
	src := strings.NewReader(responsesToolStream)
	rd := newSSEReader(src, 4096, 0)
	c := &generationCall{ep: endpointResponses}
	b.SetBytes(int64(len(responsesToolStream)))
	b.ReportAllocs()
	for b.Loop() {
		src.Reset(responsesToolStream)
		rd.reset(src)
		c.haveUsage, c.finished, c.text, c.textTokens, c.toolOutput, c.items = false, false, c.text[:0], 0, c.toolOutput[:0], [outputItemSlots]outputItem{}
		c.reasoning, c.reasoningTokens = c.reasoning[:0], 0
		inspectAll(c, rd)
	}
}

// inspectAll reads every event of rd into c's Responses inspection, as
// the relay does.
func inspectAll(c *generationCall, rd *sseReader) {
	for {
		ev, err := rd.Next()
		if err != nil {
			return
		}
		c.inspectResponses(&ev)
		c.countKeptText() // as the relay does once the event is written
	}
}

// BenchmarkGenerationAdmission admits, settles and ends one generation
// call under a key's limits and its account's: the limiter's work per call.
func BenchmarkGenerationAdmission(b *testing.B) {
	l := newLimiter()
	live := new(accounts.Live)
	key := &accounts.Key{ID: "key_1", Account: "acme", RPM: 1 << 40, TPM: 1 << 40}
	unlimited := &accounts.Key{ID: "key_2", Account: "acme"}
	for _, bc := range []struct {
		name string
		key  *accounts.Key
		acct accounts.Limits
	}{
		{"none", unlimited, accounts.Limits{}},
		{"account-concurrency", unlimited, accounts.Limits{MaxConcurrent: 1 << 20}},
		{"key", key, accounts.Limits{}},
		{"key+account", key, accounts.Limits{RPM: 1 << 40, TPM: 1 << 40, MaxConcurrent: 1 << 20}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := limitCtx("127.0.0.1")
			b.ReportAllocs()
			for b.Loop() {
				a := l.generationAdmission(bc.key, bc.acct, live, true)
				if err := a.admit(ctx, 100); err != nil {
					b.Fatal(err)
				}
				a.charge(120)
				a.done()
			}
		})
	}
}
