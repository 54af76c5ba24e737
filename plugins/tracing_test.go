package plugins_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tollgate/tollgate/proxy/proxytest"
)

const (
	clientTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientTraceparent = "00-" + clientTraceID + "-00f067aa0ba902b7-01"
)

// lastChat is the last chat completion the upstream got (not a probe).
func lastChat(t *testing.T, h *harness) proxytest.Recorded {
	t.Helper()
	reqs := h.up.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if strings.HasSuffix(reqs[i].Path, "/chat/completions") {
			return reqs[i]
		}
	}
	t.Fatalf("the upstream got no chat completion: %v", reqs)
	return proxytest.Recorded{}
}

func tracedClassify() request {
	return request{path: "/v1/classify", body: `{"text": "Please refund the charge", "labels": ["billing", "bug"]}`,
		header: http.Header{"Traceparent": {clientTraceparent}, "Tracestate": {"vendor=abc"}}}
}

// Without tracing of its own, the gateway passes the client's trace
// context on to the llm engine's model, as it does for a chat call: it
// was dropped, so the model's spans were cut off from the client's trace.
func TestUntracedLLMEnginePassesTheClientsTraceContextOn(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: llm\n  llm_model: small"})
	r := tracedClassify()
	r.key = h.key
	if m := h.do(r).ok(t); m["model"] != "small" {
		t.Fatalf("classify answered by %v, want the llm small", m)
	}
	got := lastChat(t, h).Header
	if got.Get("traceparent") != clientTraceparent || got.Get("tracestate") != "vendor=abc" {
		t.Fatalf("the model got traceparent %q tracestate %q, want the client's", got.Get("traceparent"), got.Get("tracestate"))
	}
}

// With tracing, each model call of the llm engine is a span "chat <model>"
// in the client's trace with its attempt under it, and the model's request
// names that attempt: classify, tag, score and match had no span at all.
func TestTracedLLMEngineCallIsASpanInTheClientsTrace(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h := newHarness(t, harnessOptions{plugins: "  engine: llm\n  llm_model: small", tracer: tp.Tracer("test")})
	if m := h.do(tracedClassify()).ok(t); m["model"] != "small" { // public: no key
		t.Fatalf("classify answered by %v, want the llm small", m)
	}
	var call, attempt sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		switch s.Name() {
		case "chat small":
			call = s
		case "attempt local":
			attempt = s
		}
	}
	if call == nil || attempt == nil {
		t.Fatalf("spans %v, want chat small and attempt local", spans.Ended())
	}
	if call.SpanContext().TraceID().String() != clientTraceID || call.Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("the model call's span is in trace %s under %s, want the client's", call.SpanContext().TraceID(), call.Parent().SpanID())
	}
	if attempt.Parent().SpanID() != call.SpanContext().SpanID() {
		t.Errorf("the attempt's parent is %s, want the model call's span", attempt.Parent().SpanID())
	}
	attrs := map[string]string{}
	for _, kv := range call.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if attrs["gen_ai.request.model"] != "small" || attrs["tollgate.upstream"] != "local" || attrs["gen_ai.usage.input_tokens"] == "" {
		t.Errorf("the model call's span attributes: %v", attrs)
	}
	want := "00-" + clientTraceID + "-" + attempt.SpanContext().SpanID().String() + "-01"
	if got := lastChat(t, h).Header.Get("traceparent"); got != want {
		t.Errorf("the model got traceparent %q, want its attempt's %q", got, want)
	}
}
