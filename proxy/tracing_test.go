package proxy_test

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/proxy/proxytest"
)

// startCollector runs an otlpReceiver and a tracer provider exporting to
// it, both closed when the test ends.
func startCollector(t *testing.T) (*otlpReceiver, *sdktrace.TracerProvider) {
	t.Helper()
	recv := &otlpReceiver{}
	collector := httptest.NewServer(recv)
	t.Cleanup(collector.Close)
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(collector.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return recv, tp
}

// otlpReceiver is an in-process OTLP/HTTP traces endpoint.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var msg collectortrace.ExportTraceServiceRequest
	if req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &msg) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range msg.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func attr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			if v, ok := kv.Value.Value.(*commonpb.AnyValue_IntValue); ok {
				return strconv.FormatInt(v.IntValue, 10)
			}
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

func TestTracingExportsCallAndAttemptSpansOverOTLP(t *testing.T) {
	recv, tp := startCollector(t)

	// p0 refuses connections, p1 answers: one call, two attempts.
	h := newPoolHarnessWith(t, harnessOptions{tracer: tp.Tracer("test")}, 2, "  balance: round_robin")
	h.ups[0].Close()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	for range 2 { // round robin starts at p1 or p0; the second call is sure to try p0 first if the first did not
		req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(smallChat))
		req.Header.Set("Authorization", "Bearer "+h.key)
		req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
		resp, err := h.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	if err := tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	var calls []*tracepb.Span
	children := map[string][]*tracepb.Span{}
	for _, s := range recv.spans {
		if hex.EncodeToString(s.TraceId) != traceID {
			t.Fatalf("span %q is in trace %x, not the client's", s.Name, s.TraceId)
		}
		if s.Name == "chat small" {
			calls = append(calls, s)
		} else {
			children[hex.EncodeToString(s.ParentSpanId)] = append(children[hex.EncodeToString(s.ParentSpanId)], s)
		}
	}
	if len(calls) != 2 {
		t.Fatalf("got %d call spans, want 2; spans: %v", len(calls), recv.spans)
	}
	retried := false
	for _, c := range calls {
		if attr(c, "gen_ai.request.model") != "small" || attr(c, "gen_ai.provider.name") != "openai" || attr(c, "gen_ai.usage.input_tokens") != "10" ||
			attr(c, "gen_ai.usage.output_tokens") != "20" || attr(c, "tollgate.upstream") != "p1" {
			t.Fatalf("call span attributes: %v", c.Attributes)
		}
		kids := children[hex.EncodeToString(c.SpanId)]
		if len(kids) == 0 || kids[len(kids)-1].Name != "attempt p1" {
			t.Fatalf("call span's attempts: %v", kids)
		}
		if len(kids) == 2 && kids[0].Name == "attempt p0" && kids[0].Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
			retried = true
		}
	}
	if !retried {
		t.Fatal("no call shows its failed attempt on p0 before p1")
	}
	// Each request p1 got names the attempt that sent it as its parent.
	attempts := map[string]bool{}
	for _, kids := range children {
		for _, k := range kids {
			if k.Name == "attempt p1" {
				attempts["00-"+traceID+"-"+hex.EncodeToString(k.SpanId)+"-01"] = true
			}
		}
	}
	for _, req := range h.ups[1].Requests() {
		if tp := req.Header.Get("traceparent"); !attempts[tp] {
			t.Fatalf("p1 got traceparent %q, want one of its attempt spans %v", tp, attempts)
		}
	}
}

// Without tracing of its own the gateway is a transparent hop: the
// client's trace context reaches the upstream unchanged, and none is
// made up for a client that sent none.
func TestUntracedGatewayPassesTheClientsTraceContextOn(t *testing.T) {
	h := newPoolHarness(t, 1, "")
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, stream := range []bool{false, true} {
		for _, withTrace := range []bool{true, false} {
			body := smallChat
			if stream {
				body = strings.Replace(smallChat, "{", `{"stream":true,`, 1)
			}
			req, _ := http.NewRequest("POST", h.url+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+h.key)
			if withTrace {
				req.Header.Set("traceparent", traceparent)
				req.Header.Set("tracestate", "vendor=abc")
			}
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if body := readAll(t, resp); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			reqs := h.ups[0].Requests()
			got := reqs[len(reqs)-1].Header
			want, wantState := "", ""
			if withTrace {
				want, wantState = traceparent, "vendor=abc"
			}
			if got.Get("traceparent") != want || got.Get("tracestate") != wantState {
				t.Fatalf("stream %v, client trace %v: upstream got traceparent %q tracestate %q", stream, withTrace, got.Get("traceparent"), got.Get("tracestate"))
			}
		}
	}
}

// A failed call's span carries its request id and upstream, as an answered
// one's does: support goes from a customer's x-request-id to the trace.
func TestFailedCallSpanNamesItsRequestAndUpstream(t *testing.T) {
	recv, tp := startCollector(t)
	h := newHarness(t, harnessOptions{tracer: tp.Tracer("test"), upstream: proxytest.Options{Status: 500}})
	resp := h.post("/v1/chat/completions", smallChat)
	readAll(t, resp)
	if resp.StatusCode != 500 {
		t.Fatalf("status %d, want the upstream's 500", resp.StatusCode)
	}
	if err := tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	for _, s := range recv.spans {
		if s.Name == "chat small" {
			if attr(s, "tollgate.request_id") != resp.Header.Get("x-request-id") || attr(s, "tollgate.upstream") != "local" {
				t.Fatalf("failed call span attributes %v, want request id %s and upstream local", s.Attributes, resp.Header.Get("x-request-id"))
			}
			return
		}
	}
	t.Fatalf("no call span among %v", recv.spans)
}

// An attempt's span says why it failed in the words of the admin API's
// last_error: a first-byte timeout said "fasthttp: timeout" there.
func TestAttemptSpanSaysWhyAsTheAdminAPIDoes(t *testing.T) {
	recv, tp := startCollector(t)
	h := newHarness(t, harnessOptions{tracer: tp.Tracer("test"), firstByteTimeout: "200ms",
		upstream: proxytest.Options{FirstByteDelay: time.Second}})
	resp := h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	readAll(t, resp)
	if resp.StatusCode != 503 {
		t.Fatalf("status %d, want 503 for no first byte in time", resp.StatusCode)
	}
	if err := tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	for _, s := range recv.spans {
		if s.Name == "attempt local" {
			if got, want := s.Status.GetMessage(), "no first byte within first_byte_timeout (200ms)"; got != want {
				t.Fatalf("attempt span status %q, want %q", got, want)
			}
			return
		}
	}
	t.Fatalf("no attempt span among %v", recv.spans)
}

// Spans say what the admin API's last_error says: an attempt answered 500
// said "upstream answered 500" where last_error says "answered 500", and a
// stream cut mid-answer said "the upstream's stream was interrupted" where
// last_error names the upstream and the cause. The attempt's span ended
// with its 200, so the cut is on the call's span.
func TestSpansSayWhatLastErrorSays(t *testing.T) {
	for _, tc := range []struct {
		name, span string
		up         proxytest.Options
	}{
		{"5xx", "attempt p0", proxytest.Options{Status: 500}},
		{"stream cut", "chat small", proxytest.Options{DropAfter: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recv, tp := startCollector(t)
			h := newPoolHarnessWith(t, harnessOptions{tracer: tp.Tracer("test")}, 1, "", tc.up)
			readAll(t, h.post("/v1/chat/completions", `{"model":"small","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			lastError := h.statuses()["p0"].LastError
			if err := tp.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
			recv.mu.Lock()
			defer recv.mu.Unlock()
			for _, s := range recv.spans {
				if s.Name == tc.span {
					if got := s.Status.GetMessage(); got != lastError || lastError == "" || s.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
						t.Fatalf("span %q status %v %q, want an error saying last_error's %q", s.Name, s.Status.GetCode(), got, lastError)
					}
					return
				}
			}
			t.Fatalf("no span %q among %v", tc.span, recv.spans)
		})
	}
}
