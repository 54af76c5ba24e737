package proxy

import (
	"strings"
	"testing"
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
