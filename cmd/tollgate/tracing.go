package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/loglimit"
)

// startTracing builds the tracer the proxy uses, exporting over OTLP/HTTP
// in batches off the request path, or returns a nil tracer when
// tracing.otlp_endpoint is empty. The shutdown function flushes what is
// left. OpenTelemetry's errors (a collector that is down) go to logf, at
// most one line every tracingErrorEvery.
func startTracing(ctx context.Context, cfg config.Tracing, version string, logf func(string, ...any)) (trace.Tracer, func(context.Context) error, error) {
	if cfg.OTLPEndpoint == "" {
		return nil, func(context.Context) error { return nil }, nil
	}
	otel.SetErrorHandler(&throttledErrors{logf: logf, every: tracingErrorEvery, now: time.Now})
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(cfg.OTLPEndpoint), otlptracehttp.WithTimeout(5*time.Second))
	if err != nil {
		return nil, nil, fmt.Errorf("tracing.otlp_endpoint: %w", err)
	}
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(cfg.ServiceName), semconv.ServiceVersion(version))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
	)
	return tp.Tracer("github.com/tollgate/tollgate/proxy"), tp.Shutdown, nil
}

// tracingErrorEvery is the least time between two logged OpenTelemetry
// errors. With the collector down the exporter fails once a batch: about
// 5 lines a second at 1,200 calls a second, which buried the rest of the
// log.
const tracingErrorEvery = 10 * time.Second

// throttledErrors logs the first error at once, then at most one every
// every, saying how many it left out since the last line.
type throttledErrors struct {
	logf  func(string, ...any)
	every time.Duration
	now   func() time.Time
	limit loglimit.Limiter
}

func (h *throttledErrors) Handle(err error) {
	ok, left := h.limit.Allow(h.now(), h.every)
	if !ok {
		return
	}
	if left > 0 {
		h.logf("tracing: %v (and %d more errors since the last line, not logged; at most one line every %s)", err, left, h.every)
		return
	}
	h.logf("tracing: %v", err)
}
