package config

import (
	"net/url"
	"strings"
	"time"
)

// Config is one complete, validated gateway.yaml. A *Config is never mutated
// after Load returns it: reloads build a new one and swap the pointer.
type Config struct {
	Server    Server     `yaml:"server"`
	Auth      Auth       `yaml:"auth"`
	Billing   Billing    `yaml:"billing"`
	Upstreams []Upstream `yaml:"upstreams"`
	Models    []Model    `yaml:"models"`
	// Routing balances a model's pool, ejects failing upstreams and
	// retries before the first byte (config/routing.go).
	Routing Routing `yaml:"routing"`
	// Tracing exports OpenTelemetry traces (config/tracing.go).
	Tracing    Tracing    `yaml:"tracing"`
	NATS       NATS       `yaml:"nats"`
	ClickHouse ClickHouse `yaml:"clickhouse"`
	Plugins    Plugins    `yaml:"plugins"`
	// Classifiers are the saved classifiers a classify request names with
	// "classifier" instead of sending labels; keyed by name.
	Classifiers map[string]Classifier `yaml:"classifiers"`
	// Storage holds batch job files (config/storage.go).
	Storage Storage `yaml:"storage"`
	// Batch configures batch classification jobs (config/batch.go).
	Batch Batch `yaml:"batch"`

	// Path is the file this config was read from; not part of the YAML.
	Path string `yaml:"-"`
	// source is the SHA-256 of the bytes parsed, so the Watcher can tell a
	// touched file from a changed one.
	source [32]byte
	// envRead holds the variables the file reads (a ${NAME} met while
	// expanding it), set or not.
	envRead map[string]bool
	// unsetEnv warns, a line each, of the ${VAR}s without a default whose
	// variable was not set: they read as empty.
	unsetEnv []string
	// lines maps the yaml paths written in the file to their line, for
	// the messages of a reload that refuses or warns about a setting.
	lines map[string]int
}

// line is the line of path in the file, or of its nearest ancestor
// written there (a default has none); 0 when none is.
func (c *Config) line(path string) int {
	for path != "" {
		if n, ok := c.lines[path]; ok {
			return n
		}
		path = parentPath(path)
	}
	return 0
}

// Server is the public listener. Fields marked restart-only in gateway.yaml
// cannot change on reload: a reload that changes them is refused by name.
type Server struct {
	Listen         string   `yaml:"listen"`           // restart-only
	DataDir        string   `yaml:"data_dir"`         // restart-only
	AdminToken     string   `yaml:"admin_token"`      // restart-only; empty = generated into data_dir
	MaxRequestBody ByteSize `yaml:"max_request_body"` // restart-only (fasthttp enforces it while reading)
	// DemoCreditUSD is the credit of the demo account created on first start;
	// "0" creates no demo account.
	DemoCreditUSD string `yaml:"demo_credit_usd"`
	// TrustedProxies are CIDRs whose X-Forwarded-For is believed.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// PublicURL is the scheme and host clients reach the gateway at, for
	// a gateway behind a TLS proxy: console sign-in links and base URLs
	// use it, and an https one marks the console cookie Secure. Empty:
	// the request's own scheme and Host.
	PublicURL string `yaml:"public_url"`
	// HSTSMaxAge is the max-age of the Strict-Transport-Security header
	// the console's answers carry when served over https (an https
	// PublicURL); 0 sends none, for a proxy in front that sends its own.
	HSTSMaxAge time.Duration `yaml:"hsts_max_age"`
	// DebugListen serves Go's pprof profiles on a private address; empty
	// (the default) serves none. restart-only.
	DebugListen string `yaml:"debug_listen"`
	// MetricsListen serves GET /metrics (and /healthz) on an address of
	// its own, and then /metrics is not served on Listen: the metrics
	// name upstreams and models and need no key, and Listen is where
	// clients call. Empty (the default) serves /metrics on Listen.
	// restart-only.
	MetricsListen string `yaml:"metrics_listen"`
	// ShutdownTimeout is how long calls in flight may take to finish
	// after SIGTERM before the streams still open are ended and billed on
	// estimated usage. It must end before the orchestrator's SIGKILL,
	// which would drop those streams unbilled. Read when SIGTERM arrives.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
}

// Auth configures API key verification.
type Auth struct {
	// Algorithm is the only JWT alg accepted; EdDSA (Ed25519) is the one supported.
	Algorithm string `yaml:"algorithm"`
	// Issuer is written into and required on every key. restart-only.
	Issuer string `yaml:"issuer"`
	// MaxKeysPerAccount is the most keys not revoked (expired ones
	// included) one account may hold; creating one more is a 409.
	// NoLimit (-1) is no cap.
	MaxKeysPerAccount int `yaml:"max_keys_per_account"`
	// MaxKeysCreatedPerHour is the most keys one account may make in the
	// web console in an hour, revoked ones included; one more is a 429.
	// The admin API and the CLI are not limited. NoLimit (-1) is none.
	MaxKeysCreatedPerHour int `yaml:"max_keys_created_per_hour"`
}

// Billing holds the money rules.
type Billing struct {
	// GraceUSD is the overdraft allowance: requests are refused while
	// balance < -grace. Decimal string.
	GraceUSD string `yaml:"grace_usd"`
	// OutboxMaxBytes bounds the local usage outbox (events not yet
	// acknowledged by JetStream) in data_dir/outbox. restart-only.
	OutboxMaxBytes ByteSize `yaml:"outbox_max_bytes"`
	// Durability is what a usage event must reach before its answer's
	// last byte goes out: "process" (the page cache: survives a killed
	// gateway) or "fsync" (the disk: survives a power loss). restart-only.
	Durability string `yaml:"durability"`
	// FsyncInterval is how often "process" durability writes the outbox
	// to disk. restart-only.
	FsyncInterval time.Duration `yaml:"fsync_interval"`
	// PublishBatch bounds the batches of events sent to JetStream as one
	// message each. restart-only.
	PublishBatch PublishBatch `yaml:"publish_batch"`
	// UsageRetention is how long the USAGE stream keeps events, billed or
	// not; set on the stream when a process starts. restart-only.
	UsageRetention time.Duration `yaml:"usage_retention"`
}

// PublishBatch bounds one JetStream message of usage events.
type PublishBatch struct {
	MaxEvents int           `yaml:"max_events"`
	MaxBytes  ByteSize      `yaml:"max_bytes"`
	MaxDelay  time.Duration `yaml:"max_delay"`
}

// Upstream is one OpenAI-compatible generation server.
type Upstream struct {
	Name    string `yaml:"name"`
	BaseURL string `yaml:"base_url"`
	APIKey  string `yaml:"api_key"`
	// ConnectTimeout bounds opening a connection, the TCP connect and
	// the TLS handshake together; WriteTimeout bounds sending the request.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	WriteTimeout   time.Duration `yaml:"write_timeout"`
	// FirstByteTimeout bounds the wait from sending the request to the first
	// byte of the response's body (a stream's first event), not only its
	// header, which streaming servers send at once; IdleTimeout bounds every later gap between bytes, so a
	// long stream that keeps producing is never cut.
	FirstByteTimeout time.Duration `yaml:"first_byte_timeout"`
	IdleTimeout      time.Duration `yaml:"idle_timeout"`
	// ResponseTimeout replaces FirstByteTimeout for a non-streamed
	// generation call, whose answer comes in one piece once generated: it
	// bounds the generation, not a silence, and is not retried.
	ResponseTimeout time.Duration `yaml:"response_timeout"`
	MaxConnections  int           `yaml:"max_connections"`
	MaxResponseBody ByteSize      `yaml:"max_response_body"`
	// TLSCA is a PEM file of the CA certificates an https upstream's
	// certificate must chain to, in place of the system's roots.
	TLSCA string `yaml:"tls_ca"`

	// tlsCAPEM is TLSCA's content as loaded: a reload (SIGHUP) after the
	// file was replaced rebuilds the upstream, whose settings compare
	// unequal, with the new CAs.
	tlsCAPEM string
}

// TLSCAPEM is the content of the tls_ca file as the config was loaded,
// empty without one.
func (u Upstream) TLSCAPEM() []byte { return []byte(u.tlsCAPEM) }

// EndpointURL is the URL of path (such as "/models") under the upstream's
// base_url, with query added to any query base_url has: a base_url such as
// Azure's http://host/openai/v1?api-version=1 keeps its query a query on
// every call, not text glued before the path ("?api-version=1/models").
func (u Upstream) EndpointURL(path, query string) string {
	base, err := url.Parse(u.BaseURL)
	if err != nil { // a loaded config's base_url always parses
		return strings.TrimRight(u.BaseURL, "/") + path
	}
	s := base.Scheme + "://" + base.Host + strings.TrimRight(base.EscapedPath(), "/") + path
	q := base.RawQuery
	if q != "" && query != "" {
		q += "&"
	}
	if q += query; q != "" {
		s += "?" + q
	}
	return s
}

// Model is one catalog entry; its presence in the list is the allow-list.
type Model struct {
	ID                          string   `yaml:"id"`
	HuggingFaceID               string   `yaml:"hugging_face_id"`
	Name                        string   `yaml:"name"`
	InputModalities             []string `yaml:"input_modalities"`
	OutputModalities            []string `yaml:"output_modalities"`
	Quantization                string   `yaml:"quantization"`
	ContextLength               int      `yaml:"context_length"`
	MaxOutputLength             int      `yaml:"max_output_length"`
	Pricing                     Pricing  `yaml:"pricing"`
	SupportedFeatures           []string `yaml:"supported_features"`
	SupportedSamplingParameters []string `yaml:"supported_sampling_parameters"`
	// Created is GET /v1/models' created; 0 when not written: the gateway
	// cannot know when a model was made (README, "not shown").
	Created Timestamp `yaml:"created"`
	// Upstream names the entry of upstreams that serves this model;
	// Upstreams instead names a pool of several (config/routing.go).
	// UpstreamModel is the model name sent to them (defaults to ID).
	Upstream      string       `yaml:"upstream"`
	Upstreams     []PoolMember `yaml:"upstreams"`
	UpstreamModel string       `yaml:"upstream_model"`
}

// Pricing is USD per unit as decimal strings, never floats.
type Pricing struct {
	Prompt         string `yaml:"prompt"`
	Completion     string `yaml:"completion"`
	Image          string `yaml:"image"`
	Request        string `yaml:"request"`
	InputCacheRead string `yaml:"input_cache_read"`
}

// NATS selects the embedded server or an external one.
type NATS struct {
	// URL empty runs an embedded nats-server with JetStream under data_dir.
	URL string `yaml:"url"`
	// EmbeddedListen is the loopback address of the embedded server, so
	// `tollgate billing` and nats tools can connect. restart-only.
	EmbeddedListen string `yaml:"embedded_listen"`
	CredsFile      string `yaml:"creds_file"`
	TLSCA          string `yaml:"tls_ca"`
	TLSCert        string `yaml:"tls_cert"`
	TLSKey         string `yaml:"tls_key"`
	// Replicas for streams and KV buckets (1 single node, 3 in a cluster).
	Replicas int `yaml:"replicas"`
	// StartTimeout is how long a process's start waits for a JetStream
	// that is electing its leaders (a node lost, the cluster starting)
	// before it gives up. restart-only.
	StartTimeout time.Duration `yaml:"start_timeout"`
}

// ClickHouse is the billing store.
type ClickHouse struct {
	DSN string `yaml:"dsn"`
	// ConsumeInServe runs the billing consumer inside `tollgate serve`.
	ConsumeInServe bool `yaml:"consume_in_serve"`
}

// Plugins configures the classify, tag, score and match endpoints. Every
// field is hot-reloadable.
type Plugins struct {
	// Engine answers requests that name no model: "semantic" (offline,
	// word vectors and lexical evidence), "lexical" (offline, words only),
	// "llm" (prompts LLMModel) or "auto" (llm while its upstream answers a
	// health probe, else semantic, or lexical without vectors).
	Engine string `yaml:"engine"`
	// Vectors is the semantic engine's word-vector file
	// (scripts/vectors.sh install); missing or corrupt, semantic answers
	// as lexical would and the gateway says so at start and at each reload.
	Vectors string `yaml:"vectors"`
	// LLMModel is the catalog id the llm engine prompts; default: the first
	// model of the catalog.
	LLMModel string `yaml:"llm_model"`
	// Pricing is USD per token, billed on keyed calls.
	Pricing PluginPricing `yaml:"pricing"`
	// MaxTextBytes bounds text, source, query and description.
	MaxTextBytes ByteSize `yaml:"max_text_bytes"`
	// PublicLimits apply per client address to calls without a key;
	// KeyLimits per key, where the key carries no rpm/tpm of its own.
	PublicLimits Limits `yaml:"public_limits"`
	KeyLimits    Limits `yaml:"key_limits"`
}

// PluginPricing is USD per token (prompt and completion alike) as decimal
// strings, per endpoint.
type PluginPricing struct {
	Classify string `yaml:"classify"`
	Tag      string `yaml:"tag"`
	Score    string `yaml:"score"`
	Match    string `yaml:"match"`
}

// Limits are rates over a sliding minute and a bound on requests in
// flight. NoLimit (-1) switches one off.
type Limits struct {
	RequestsPerMinute int64 `yaml:"requests_per_minute"`
	TokensPerMinute   int64 `yaml:"tokens_per_minute"`
	Concurrent        int64 `yaml:"concurrent"`
}

// NoLimit in a Limits field means unlimited.
const NoLimit = -1

// Classifier is a saved classify request without its text.
type Classifier struct {
	Labels       []string            `yaml:"labels"`
	Descriptions map[string]string   `yaml:"descriptions"`
	Examples     map[string][]string `yaml:"examples"`
	TextType     string              `yaml:"text_type"`
	Mode         string              `yaml:"mode"`
	// Threshold defaults to DefaultThreshold only when omitted: an explicit
	// 0 (every label in multi mode) is kept.
	Threshold float64 `yaml:"threshold"`
}
