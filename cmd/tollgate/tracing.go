package main

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/config"
)

// startTracing builds the tracer the proxy uses, exporting over OTLP/HTTP
// in batches off the request path, or returns a nil tracer when
// tracing.otlp_endpoint is empty. The shutdown function flushes what is
// left.
func startTracing(ctx context.Context, cfg config.Tracing, version string) (trace.Tracer, func(context.Context) error, error) {
	if cfg.OTLPEndpoint == "" {
		return nil, func(context.Context) error { return nil }, nil
	}
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
