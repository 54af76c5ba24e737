package config

import (
	"net/url"
	"strings"
)

// Tracing exports OpenTelemetry traces over OTLP/HTTP: one span per
// generation call, with the GenAI semantic-convention attributes, and a
// child span per upstream attempt. Off while OTLPEndpoint is empty.
// restart-only.
type Tracing struct {
	// OTLPEndpoint is the collector's traces URL, such as
	// http://127.0.0.1:4318/v1/traces; one with no path (or "/") gets
	// /v1/traces, as OTEL_EXPORTER_OTLP_ENDPOINT does. Empty exports
	// nothing.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// SampleRatio is the share of calls without a traceparent traced
	// (0..1); a traceparent's sampled flag decides for its call, whatever
	// the ratio (ParentBased), so 0 traces only calls whose traceparent
	// says sampled. Default 1 when omitted (a written 0 is kept).
	SampleRatio float64 `yaml:"sample_ratio"`
	// ServiceName is the service.name resource attribute. Default tollgate.
	ServiceName string `yaml:"service_name"`
}

// Tracing defaults.
const (
	DefaultSampleRatio = 1.0
	DefaultServiceName = "tollgate"
)

func (l *loader) applyTracingDefaults(t *Tracing) {
	if !l.isSet("tracing.sample_ratio") {
		setDefault(&t.SampleRatio, DefaultSampleRatio) // a written 0 traces no call of its own
	}
	setDefault(&t.ServiceName, DefaultServiceName)
	t.OTLPEndpoint = withTracesPath(t.OTLPEndpoint)
}

// tracesPath is where an OTLP/HTTP collector takes traces.
const tracesPath = "/v1/traces"

// withTracesPath is endpoint with tracesPath when it has no path of its
// own: a collector's base URL (http://127.0.0.1:4318, as
// OTEL_EXPORTER_OTLP_ENDPOINT takes it) passed the check, and the
// exporter, which sends to the URL as written, had every export refused
// with a 404. Left as written when it is not a plain http(s) URL, for
// validateTracing to say why.
func withTracesPath(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "" ||
		strings.ContainsAny(endpoint, " \t\r\n#") || (u.Path != "" && u.Path != "/") {
		return endpoint
	}
	u.Path, u.RawPath = tracesPath, ""
	return u.String()
}

func (l *loader) validateTracing(t Tracing) {
	if t.OTLPEndpoint != "" {
		l.checkHTTPURL(t.OTLPEndpoint, "tracing.otlp_endpoint", "http://127.0.0.1:4318"+tracesPath)
	}
	l.check(t.SampleRatio >= 0 && t.SampleRatio <= 1, "tracing.sample_ratio", "%g is outside 0..1", t.SampleRatio)
}
