package proxy

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/tollgate/tollgate/config"
)

func readEvents(t testing.TB, in string, bufSize int) []sseEvent {
	rd := newSSEReader(iotest.HalfReader(strings.NewReader(in)), bufSize, 0)
	var out []sseEvent
	for {
		ev, err := rd.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		ev.Raw = append([]byte(nil), ev.Raw...)
		ev.Data = append([]byte(nil), ev.Data...)
		ev.Name = append([]byte(nil), ev.Name...)
		out = append(out, ev)
	}
}

func TestSSEReaderSplitsEvents(t *testing.T) {
	in := "data: {\"a\":1}\n\n" +
		": comment\r\nevent: response.created\r\ndata: x\r\n\r\n" +
		"\n\ndata: line1\ndata: line2\nid: 7\n\n" +
		"data:nospace\n\n" +
		"data: [DONE]\n\n" +
		"data: partial"
	evs := readEvents(t, in, 16)
	if len(evs) != 6 {
		t.Fatalf("got %d events", len(evs))
	}
	var joined bytes.Buffer
	for _, ev := range evs {
		joined.Write(ev.Raw)
	}
	if joined.String() != in {
		t.Fatalf("raw bytes not preserved:\n%q\n%q", joined.String(), in)
	}
	want := []struct{ data, name string }{
		{`{"a":1}`, ""}, {"x", "response.created"}, {"line1\nline2", ""}, {"nospace", ""}, {"[DONE]", ""}, {"partial", ""},
	}
	for i, w := range want {
		if string(evs[i].Data) != w.data || string(evs[i].Name) != w.name {
			t.Fatalf("event %d: data %q name %q, want %q %q", i, evs[i].Data, evs[i].Name, w.data, w.name)
		}
	}
	if !evs[4].Complete || evs[5].Complete {
		t.Fatal("Complete flags wrong")
	}
}

func TestSSEReaderEventTooLarge(t *testing.T) {
	rd := newSSEReader(strings.NewReader("data: "+strings.Repeat("x", 1000)+"\n\n"), 16, 100)
	if _, err := rd.Next(); err != errEventTooLarge {
		t.Fatalf("err %v", err)
	}
}

func TestAppendWithDataKeepsOtherFields(t *testing.T) {
	evs := readEvents(t, "event: e\r\ndata: old\r\nid: 1\r\n\r\n", 64)
	got := appendWithData(nil, &evs[0], []byte("new"))
	if string(got) != "event: e\r\ndata: new\r\nid: 1\r\n\r\n" {
		t.Fatalf("got %q", got)
	}
}

// FuzzSSEReader: whatever the bytes, the reader never panics and the events
// it returns are, byte for byte, the stream it read.
func FuzzSSEReader(f *testing.F) {
	f.Add("data: a\n\ndata: b\r\n\r\n")
	f.Add("event: x\ndata: {}\n\n: c\n\n\n\ndata")
	f.Add("\r\r\n\n\ndata: [DONE]\n\n")
	f.Fuzz(func(t *testing.T, in string) {
		rd := newSSEReader(strings.NewReader(in), 16, 0)
		var joined bytes.Buffer
		for {
			ev, err := rd.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if ev.dataEnd > 0 {
				// the single data line can be replaced without losing bytes
				re := appendWithData(nil, &ev, ev.Data)
				if !bytes.Contains(re, ev.Data) {
					t.Fatalf("replacement lost data: %q", re)
				}
			}
			joined.Write(ev.Raw)
		}
		if joined.String() != in {
			t.Fatalf("raw bytes not preserved:\n%q\n%q", joined.String(), in)
		}
	})
}

// When the gateway injected include_usage, the usage it adds is stripped
// from every chunk, also from one whose data comes in several lines and
// from the first one after a byte order mark: both were relayed with the
// usage the client never asked for.
func TestUsageIsStrippedFromMultiLineAndBOMEvents(t *testing.T) {
	stream := "\uFEFFdata: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}],\"usage\":null}\n\n" +
		"event: chunk\ndata: {\"id\":\"a\",\ndata: \"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"finish_reason\":null}],\ndata: \"usage\":null}\n\n" +
		"data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\r\ndata: \"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\r\n\r\n"
	want := "\uFEFFdata: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n" +
		"event: chunk\ndata: {\"id\":\"a\",\ndata: \"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"finish_reason\":null}]}\n\n" +
		"data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\r\n\r\n"
	c := &generationCall{ep: endpointChat, injected: true}
	r := newSSEReader(strings.NewReader(stream), 4096, 1<<20)
	var got strings.Builder
	for {
		ev, err := r.Next()
		if err != nil {
			break
		}
		out, drop := c.inspectChat(&ev)
		if !drop {
			got.Write(out)
		}
	}
	if got.String() != want {
		t.Fatalf("relayed:\n%q\nwant:\n%q", got.String(), want)
	}
	if !c.haveUsage || c.usage.PromptTokens != 3 || c.usage.CompletionTokens != 2 {
		t.Fatalf("usage %+v (have %v), want 3 and 2 from the last chunk", c.usage, c.haveUsage)
	}
}

// An upstream's own error event ends its answer: a stream closed right
// after it got a second, gateway-made error appended, as if cut.
func TestUpstreamErrorEventEndsTheChatStream(t *testing.T) {
	c := &generationCall{ep: endpointChat}
	words := newSSEReader(strings.NewReader("data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"an \\\"error\\\": {} in the text\"},\"finish_reason\":null}]}\n\n"), 4096, 1<<20)
	if ev, err := words.Next(); err != nil {
		t.Fatal(err)
	} else if c.inspectChat(&ev); c.finished {
		t.Fatal("the word error in a chunk's text ended the stream")
	}
	// vLLM writes the error as an object; Ollama writes it as a string
	// and closes, and the gateway appended its own stream_interrupted.
	for name, errorEvent := range map[string]string{
		"object": "data: {\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":500}}\n\n",
		"string": "data: {\"error\":\"an error was encountered while running the model: unexpected EOF\"}\n\n",
	} {
		srv := &Server{}
		srv.world.Store(&World{Config: &config.Config{}})
		c := &generationCall{ep: endpointChat, server: srv, upstream: testModelPool(t, 1).members[0].up}
		r := newSSEReader(strings.NewReader("data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n"+errorEvent), 4096, 1<<20)
		for {
			ev, err := r.Next()
			if err != nil {
				break
			}
			c.inspectChat(&ev)
		}
		if !c.finished {
			t.Fatalf("the upstream's error event (%s) did not end the stream: a second error would be appended", name)
		}
		if !c.interrupted || c.upstream.health.curFails.Load() != 1 {
			t.Fatalf("the upstream's server error event (%s) did not count against it", name)
		}
	}
}

// OpenRouter ends a stream its provider broke with a chunk whose choice
// finishes with "error" and whose error member follows its choices, then
// [DONE]; Anthropic's OpenAI-compatible API writes {"type":"error",
// "error":…}. Neither has "error" as its first member, and such a stream
// counted as a completed answer: tollgate_requests_interrupted_total 0,
// the upstream's error rate 0, where vLLM's and Ollama's error events
// count against it. An error that blames the request still ends the
// answer without counting against the upstream, and a finish chunk's
// "error":null is no error.
func TestUpstreamErrorAfterTheChunksFirstMemberEndsTheChatStream(t *testing.T) {
	const hi = "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n"
	for _, tc := range []struct {
		name, event string
		fault       bool
	}{
		{"OpenRouter", `data: {"id":"gen-1","object":"chat.completion.chunk","created":1,"model":"m","provider":"p","choices":[{"index":0,"delta":{"content":""},"finish_reason":"error","native_finish_reason":"error"}],"error":{"code":"server_error","message":"Provider disconnected unexpectedly"}}` + "\n\ndata: [DONE]\n\n", true},
		{"finish_reason error alone", `data: {"id":"a","choices":[{"index":0,"delta":{},"finish_reason":"error"}]}` + "\n\ndata: [DONE]\n\n", true},
		{"Anthropic", `data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}` + "\n\n", true},
		{"the request's fault", `data: {"id":"a","choices":[{"index":0,"delta":{},"finish_reason":"error"}],"error":{"code":400,"message":"context too long"}}` + "\n\ndata: [DONE]\n\n", false},
		{"error null", `data: {"id":"a","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"error":null}` + "\n\ndata: [DONE]\n\n", false},
	} {
		for _, injected := range []bool{false, true} {
			srv := &Server{}
			srv.world.Store(&World{Config: &config.Config{}})
			c := &generationCall{ep: endpointChat, server: srv, upstream: testModelPool(t, 1).members[0].up, injected: injected}
			r := newSSEReader(strings.NewReader(hi+tc.event), 4096, 1<<20)
			for {
				ev, err := r.Next()
				if err != nil {
					break
				}
				if out, drop := c.inspectChat(&ev); drop || !bytes.Equal(out, ev.Raw) {
					t.Errorf("%s: the event was not relayed as it came: %q", tc.name, out)
				}
			}
			if !c.finished {
				t.Errorf("%s: did not end the stream: a stream_interrupted would be appended", tc.name)
			}
			if c.interrupted != tc.fault || c.upstream.health.curFails.Load() != map[bool]int64{true: 1}[tc.fault] {
				t.Errorf("%s (injected %v): counted against the upstream %v (%d fails), want %v", tc.name, injected,
					c.interrupted, c.upstream.health.curFails.Load(), tc.fault)
			}
		}
	}
}
