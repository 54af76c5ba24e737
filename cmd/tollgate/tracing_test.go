package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
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
			OTLPEndpoint: "http://127.0.0.1:1/v1/traces", SampleRatio: ratio, ServiceName: "test"}, "test", func(string, ...any) {})
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

// With the collector down every failed batch was logged, about 5 lines a
// second under load: the first error is logged at once, then at most one
// line every tracingErrorEvery, counting the ones left out.
func TestTracingErrorsAreLoggedAtMostEveryTenSeconds(t *testing.T) {
	var lines []string
	logf := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	_, shutdown, err := startTracing(context.Background(), config.Tracing{
		OTLPEndpoint: "http://127.0.0.1:1/v1/traces", SampleRatio: 1, ServiceName: "test"}, "test", logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		shutdown(ctx)
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {}))
	})
	for range 100 {
		otel.Handle(errors.New("traces export: connection refused"))
	}
	if len(lines) != 1 || lines[0] != "tracing: traces export: connection refused" {
		t.Fatalf("100 errors at once logged %q, want the first only", lines)
	}

	lines = nil
	now := time.Unix(1000, 0)
	h := &throttledErrors{logf: logf, every: 10 * time.Second, now: func() time.Time { return now }}
	for i := range 25 { // one a second
		h.Handle(fmt.Errorf("error %d", i))
		now = now.Add(time.Second)
	}
	want := []string{
		"tracing: error 0",
		"tracing: error 10 (and 9 more errors since the last line, not logged; at most one line every 10s)",
		"tracing: error 20 (and 9 more errors since the last line, not logged; at most one line every 10s)",
	}
	if !slices.Equal(lines, want) {
		t.Fatalf("logged %q, want %q", lines, want)
	}
}
