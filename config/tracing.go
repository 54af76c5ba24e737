package config

// Tracing exports OpenTelemetry traces over OTLP/HTTP: one span per
// generation call, with the GenAI semantic-convention attributes, and a
// child span per upstream attempt. Off while OTLPEndpoint is empty.
// restart-only.
type Tracing struct {
	// OTLPEndpoint is the collector's traces URL, such as
	// http://127.0.0.1:4318/v1/traces. Empty exports nothing.
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
}

func (l *loader) validateTracing(t Tracing) {
	if t.OTLPEndpoint != "" {
		l.checkHTTPURL(t.OTLPEndpoint, "tracing.otlp_endpoint")
	}
	l.check(t.SampleRatio >= 0 && t.SampleRatio <= 1, "tracing.sample_ratio", "%g is outside 0..1", t.SampleRatio)
}
