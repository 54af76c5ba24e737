package proxy

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/meter"
)

// Tracing, when Options.Tracer is set: a span per generation call named as
// the GenAI semantic conventions ask ("chat <model>"), joined to the
// client's trace when the request carries a traceparent header, and a child
// span per upstream attempt, so a retried call shows where each try went.
// With no tracer every hook below is a nil check.

var traceContext = propagation.TraceContext{}

// The upstream request carries the trace on: with tracing, a traceparent
// naming the attempt's span, so the upstream's own spans (vLLM and SGLang
// export OpenTelemetry) hang under the try that reached them; without, the
// client's traceparent and tracestate unchanged, so the gateway is a
// transparent hop in the client's trace.

// appendClientTraceHeaders appends the client's trace context header
// lines, if it sent any.
func appendClientTraceHeaders(dst []byte, h *fasthttp.RequestHeader) []byte {
	for _, name := range [...]string{"traceparent", "tracestate"} {
		if v := h.Peek(name); len(v) > 0 {
			dst = appendHeaderLine(dst, name, v)
		}
	}
	return dst
}

// appendHeaderLine appends "name: value\r\n", or nothing when value holds
// what could end the line early (CR, LF, NUL).
func appendHeaderLine[V string | []byte](dst []byte, name string, value V) []byte {
	for i := 0; i < len(value); i++ {
		if b := value[i]; b == '\r' || b == '\n' || b == 0 {
			return dst
		}
	}
	dst = append(append(dst, name...), ": "...)
	return append(append(dst, value...), "\r\n"...)
}

// upstreamTraceHeaders returns the trace header lines of an attempt whose
// span is span (nil without tracing).
func (c *generationCall) upstreamTraceHeaders(span trace.Span) []byte {
	if span == nil {
		return c.traceHeaders
	}
	carrier := lineCarrier{dst: c.traceHeaders[:0]}
	traceContext.Inject(trace.ContextWithSpan(context.Background(), span), &carrier)
	c.traceHeaders = carrier.dst
	return c.traceHeaders
}

// lineCarrier writes injected trace context as HTTP header lines.
type lineCarrier struct{ dst []byte }

func (c *lineCarrier) Get(string) string     { return "" }
func (c *lineCarrier) Set(key, value string) { c.dst = appendHeaderLine(c.dst, key, value) }
func (c *lineCarrier) Keys() []string        { return nil }

// headerCarrier reads W3C trace context from a fasthttp request.
type headerCarrier struct{ h *fasthttp.RequestHeader }

func (c headerCarrier) Get(key string) string { return string(c.h.Peek(key)) }
func (c headerCarrier) Set(string, string)    {}
func (c headerCarrier) Keys() []string        { return []string{"traceparent", "tracestate"} }

// genAIProvider is the call spans' gen_ai.provider.name, which the GenAI
// semantic conventions require: every upstream is spoken to in OpenAI's
// API, and the conventions name such calls "openai" whoever hosts the
// model (gen_ai.response.model and server.address tell which). Without
// it, GenAI views that group spans by provider left them out.
var genAIProvider = attribute.String("gen_ai.provider.name", "openai")

// startCallSpan starts the call's span at start, or returns nil.
func (s *Server) startCallSpan(ctx *fasthttp.RequestCtx, start time.Time, ep endpoint, model string, stream bool) trace.Span {
	if s.tracer == nil {
		return nil
	}
	parent := context.Background()
	if len(ctx.Request.Header.Peek("traceparent")) > 0 {
		parent = traceContext.Extract(parent, headerCarrier{&ctx.Request.Header})
	}
	_, span := s.tracer.Start(parent, "chat "+model, trace.WithTimestamp(start), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("gen_ai.operation.name", "chat"),
			genAIProvider,
			attribute.String("gen_ai.request.model", model),
			attribute.String("http.route", ep.path()),
			attribute.Bool("tollgate.stream", stream),
		))
	return span
}

// modelTrace is a plugin request's trace context, for the model calls
// it makes through CallModel (Call.ModelCallContext).
type modelTrace struct {
	tracer trace.Tracer    // nil without tracing
	parent context.Context // the client's span context, with tracing
	// headers are the client's traceparent and tracestate lines, passed on
	// to the model's upstream without tracing, as a chat call's are.
	headers   []byte
	requestID string
}

type modelTraceKey struct{}

// ModelCallContext returns ctx carrying req's trace context for
// CallModel, as a chat call carries its own: with tracing, each model call
// is a span "chat <model>" in the client's trace (or a trace of its own),
// its attempts under it; without, the client's traceparent and
// tracestate reach the model's upstream unchanged. Without either, ctx.
func (c *Call) ModelCallContext(req *fasthttp.RequestCtx) context.Context {
	mt := &modelTrace{tracer: c.Server.tracer, requestID: c.RequestID}
	switch {
	case mt.tracer != nil:
		mt.parent = context.Background()
		if len(req.Request.Header.Peek("traceparent")) > 0 {
			mt.parent = traceContext.Extract(mt.parent, headerCarrier{&req.Request.Header})
		}
	default:
		if mt.headers = appendClientTraceHeaders(nil, &req.Request.Header); mt.headers == nil {
			return req
		}
	}
	return context.WithValue(req, modelTraceKey{}, mt)
}

// traceModelCall has c, a CallModel call under ctx, carry ctx's trace
// context: a span of its own with tracing, the client's header lines
// without.
func (c *generationCall) traceModelCall(ctx context.Context) {
	mt, ok := ctx.Value(modelTraceKey{}).(*modelTrace)
	if !ok {
		return
	}
	if mt.tracer == nil {
		c.traceHeaders = mt.headers
		return
	}
	c.tracer = mt.tracer
	_, c.span = mt.tracer.Start(mt.parent, "chat "+c.entry.ID, trace.WithTimestamp(c.start), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			attribute.String("gen_ai.operation.name", "chat"),
			genAIProvider,
			attribute.String("gen_ai.request.model", c.entry.ID),
			attribute.String("tollgate.request_id", mt.requestID),
			attribute.Bool("tollgate.engine_call", true),
		))
}

// endModelCallSpan ends the span of a CallModel call with its usage, or
// its error.
func (c *generationCall) endModelCallSpan(u catalog.Usage, err error) {
	if c.span == nil {
		return
	}
	if c.upstream != nil {
		c.span.SetAttributes(attribute.String("tollgate.upstream", c.upstream.cfg.Name))
	}
	var answered *ModelError
	switch {
	case errors.As(err, &answered): // its body is the model's words, not ours to export
		c.span.SetAttributes(attribute.Int("http.response.status_code", answered.Status))
		c.span.SetStatus(codes.Error, answeredStatus(answered.Status))
	case err != nil:
		c.span.RecordError(err)
		c.span.SetStatus(codes.Error, err.Error())
	default:
		c.span.SetAttributes(
			attribute.String("gen_ai.response.model", c.entry.UpstreamModel),
			attribute.Int64("gen_ai.usage.input_tokens", u.PromptTokens),
			attribute.Int64("gen_ai.usage.output_tokens", u.CompletionTokens),
			attribute.Bool("tollgate.usage_estimated", u.Estimated),
		)
	}
	c.span.End()
	c.span = nil
}

// startAttemptSpan starts a child of the call's span for one attempt on up.
func (c *generationCall) startAttemptSpan(up *upstream, n int) trace.Span {
	if c.span == nil {
		return nil
	}
	_, span := c.tracer.Start(trace.ContextWithSpan(context.Background(), c.span), "attempt "+up.cfg.Name,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("tollgate.upstream", up.cfg.Name),
			attribute.String("server.address", up.pool.addr),
			attribute.Int("tollgate.attempt", n+1),
		))
	return span
}

// answeredStatus says that an upstream answered status, as the admin
// API's last_error says it of a 5xx, and an attempt's span of its 5xx or 429.
func answeredStatus(status int) string { return "answered " + strconv.Itoa(status) }

// endAttemptSpan ends an attempt's span with the upstream's status. A 429
// is an error of the span (a client span's 4xx is), though last_error
// records one only when its Retry-After rests the upstream.
func endAttemptSpan(span trace.Span, status int) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 || status == 429 {
		span.SetStatus(codes.Error, answeredStatus(status))
	}
	span.End()
}

// failAttemptSpan ends the span of an attempt that got no answer. err is
// recorded as it came; the status says why as the admin API's last_error
// does ("no first byte within first_byte_timeout (5s)", not "fasthttp:
// timeout"), so a trace and the upstream's state tell the same story.
func failAttemptSpan(span trace.Span, err error, reason string) {
	if span == nil {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, reason)
	span.End()
}

// endCallSpan ends the call's span with its usage event's tokens.
func (c *generationCall) endCallSpan(ev *meter.Event) {
	if c.span == nil {
		return
	}
	c.span.SetAttributes(
		attribute.String("gen_ai.response.model", c.entry.UpstreamModel),
		attribute.Int64("gen_ai.usage.input_tokens", ev.PromptTokens),
		attribute.Int64("gen_ai.usage.output_tokens", ev.CompletionTokens),
		attribute.Int64("tollgate.usage.cached_tokens", ev.CachedTokens),
		attribute.Int64("tollgate.usage.reasoning_tokens", ev.ReasoningTokens),
		attribute.String("tollgate.usage_source", string(ev.UsageSource)),
		attribute.String("tollgate.upstream", ev.Upstream),
		attribute.String("tollgate.request_id", ev.ID),
		attribute.Int64("tollgate.cost_nanos", int64(ev.CostNanos)),
		attribute.Int("http.response.status_code", ev.Status),
	)
	if c.interrupted { // its status set by failStreamSpan
		c.span.SetAttributes(attribute.Bool("tollgate.stream_interrupted", true))
	}
	c.span.End()
	c.span = nil
}

// failStreamSpan marks the call's span with why its upstream cut or
// stalled the stream, in the words of the admin API's last_error. It is
// the call's span that says so: its attempt's span ended with the 200.
func (c *generationCall) failStreamSpan(reason string) {
	if c.span != nil {
		c.span.SetStatus(codes.Error, reason)
	}
}

// failCallSpan ends the call's span for a call that got no usage event.
func (c *generationCall) failCallSpan(status int, msg string) {
	if c.span == nil {
		return
	}
	c.span.SetAttributes(attribute.Int("http.response.status_code", status), attribute.String("tollgate.request_id", c.reqID))
	if c.upstream != nil {
		c.span.SetAttributes(attribute.String("tollgate.upstream", c.upstream.cfg.Name))
	}
	if status >= 500 {
		c.span.SetStatus(codes.Error, msg)
	}
	c.span.End()
	c.span = nil
}
