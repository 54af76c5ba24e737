package main

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/config"
)

// sample_ratio applies to calls without a traceparent; a traceparent's
// sampled flag decides either way, whatever the ratio. The README said the
// ratio applied to calls "without a sampled parent", which read as if an
// unsampled parent's calls were sampled at the ratio: they never are.
func TestTraceparentDecidesSamplingWhateverTheRatio(t *testing.T) {
	for _, ratio := range []float64{0, 1} {
		tracer, shutdown, err := startTracing(context.Background(), config.Tracing{
			OTLPEndpoint: "http://127.0.0.1:1/v1/traces", SampleRatio: ratio, ServiceName: "test"}, "test")
		if err != nil {
			t.Fatal(err)
		}
		parent := func(flags trace.TraceFlags) context.Context {
			return trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: flags, Remote: true}))
		}
		for _, c := range []struct {
			name string
			ctx  context.Context
			want bool
		}{
			{"no traceparent", context.Background(), ratio == 1},
			{"sampled traceparent", parent(trace.FlagsSampled), true},
			{"unsampled traceparent", parent(0), false},
		} {
			_, span := tracer.Start(c.ctx, "call")
			if got := span.SpanContext().IsSampled(); got != c.want {
				t.Errorf("sample_ratio %g, %s: sampled %v, want %v", ratio, c.name, got, c.want)
			}
			span.End()
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // nothing to flush to a collector that is not there
		shutdown(ctx)
	}
}
