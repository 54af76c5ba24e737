package config

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/tollgate/tollgate/money"
)

// Defaults for omitted (or zero) fields; gateway.yaml documents each.
const (
	DefaultListen         = "127.0.0.1:8080"
	DefaultDataDir        = "./data"
	DefaultMaxRequestBody = 8 << 20 // 8MiB
	DefaultDemoCreditUSD  = "5.00"

	// DefaultHSTSMaxAge is a year, the least the HSTS preload list and
	// most guidance ask for; MaxHSTSMaxAge (two years) bounds a typo that
	// would pin browsers to https for a decade.
	DefaultHSTSMaxAge = 365 * 24 * time.Hour
	MaxHSTSMaxAge     = 2 * DefaultHSTSMaxAge

	// DefaultShutdownTimeout leaves the 4 s the gateway takes after it
	// (ending streams, closing stalled clients) inside Kubernetes'
	// default 30 s grace period.
	DefaultShutdownTimeout = 25 * time.Second
	DefaultAlgorithm       = "EdDSA"
	DefaultIssuer          = "tollgate"
	// DefaultMaxKeysPerAccount is far above a key per service and
	// environment, and bounds what one account puts in every gateway's
	// memory (about 400 bytes a key) and on its console page.
	DefaultMaxKeysPerAccount = 1000
	DefaultGraceUSD          = "0.50"
	DefaultOutboxMaxBytes    = ByteSize(1 << 30)
	DefaultDurability        = "process"
	DefaultFsyncInterval     = 100 * time.Millisecond
	DefaultBatchMaxEvents    = 1000
	DefaultBatchMaxBytes     = ByteSize(512 << 10)
	DefaultBatchMaxDelay     = 50 * time.Millisecond // each batch costs JetStream ~0.5 ms of CPU: 4 % more calls than 10ms (paired A/B)
	DefaultUsageRetention    = 7 * 24 * time.Hour    // meter.EnsureUsageStream uses it for a retention it cannot take
	DefaultConnectTimeout    = 2 * time.Second
	DefaultWriteTimeout      = 10 * time.Second
	DefaultFirstByteTimeout  = 60 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	// DefaultResponseTimeout ends before the OpenAI SDKs' own 10 minutes,
	// counted from a little earlier: the client then reads the 504 and its
	// x-should-retry: false, instead of timing out and retrying, which
	// pays for the whole generation again.
	DefaultResponseTimeout = 9*time.Minute + 30*time.Second
	DefaultMaxConnections  = 512
	DefaultMaxResponseBody = 64 << 20 // 64MiB
	DefaultEmbeddedListen  = "127.0.0.1:4222"
	DefaultReplicas        = 1
	// DefaultNATSStartTimeout outlasts a JetStream election after a node
	// is lost (seconds; more in a rolling restart), and still ends a start
	// on a cluster that is not coming back soon enough for an orchestrator
	// to show it.
	DefaultNATSStartTimeout = 60 * time.Second
	DefaultClickHouseDSN    = "clickhouse://127.0.0.1:9000/default"
	DefaultEngine           = "auto"
	// DefaultVectors is where scripts/vectors.sh installs the semantic
	// engine's word vectors, relative to the working directory.
	DefaultVectors = "./data/vectors/en.tgv"
	// DefaultPluginPrice is the spec's batch price, 0.08 USD per 1M tokens.
	DefaultPluginPrice   = "0.00000008"
	DefaultMaxTextBytes  = 64 << 10 // 64KiB
	DefaultPublicRPM     = 1
	DefaultPublicTPM     = 10_000
	DefaultPublicConc    = 1
	DefaultKeyRPM        = 600
	DefaultKeyTPM        = 1_000_000
	DefaultKeyConcurrent = 16
)

// MinAdminTokenBytes is the shortest server.admin_token accepted: the
// token is the whole admin API. A generated one is longer.
const MinAdminTokenBytes = 16

// Engines are the values of plugins.engine.
var Engines = []string{"auto", "llm", "semantic", "lexical"}

// Allowed values of the catalog's list fields.
var (
	Modalities = []string{"text", "image", "audio", "video", "file"}
	Features   = []string{"tools", "json_mode", "structured_outputs", "reasoning", "vision", "logprobs", "streaming"}
)

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

func (l *loader) applyDefaults(c *Config) {
	s := &c.Server
	setDefault(&s.Listen, DefaultListen)
	setDefault(&s.DataDir, DefaultDataDir)
	setDefault(&s.MaxRequestBody, DefaultMaxRequestBody)
	setDefault(&s.DemoCreditUSD, DefaultDemoCreditUSD)
	setDefault(&s.ShutdownTimeout, DefaultShutdownTimeout)
	if !l.writtenZero("server.hsts_max_age") { // 0 sends none
		setDefault(&s.HSTSMaxAge, DefaultHSTSMaxAge)
	}
	setDefault(&c.Auth.Algorithm, DefaultAlgorithm)
	setDefault(&c.Auth.Issuer, DefaultIssuer)
	setDefault(&c.Auth.MaxKeysPerAccount, DefaultMaxKeysPerAccount)
	setDefault(&c.Auth.MaxKeysCreatedPerHour, DefaultMaxKeysCreatedPerHour)
	setDefault(&c.Billing.GraceUSD, DefaultGraceUSD)
	setDefault(&c.Billing.OutboxMaxBytes, DefaultOutboxMaxBytes)
	setDefault(&c.Billing.Durability, DefaultDurability)
	setDefault(&c.Billing.FsyncInterval, DefaultFsyncInterval)
	setDefault(&c.Billing.PublishBatch.MaxEvents, DefaultBatchMaxEvents)
	setDefault(&c.Billing.PublishBatch.MaxBytes, DefaultBatchMaxBytes)
	setDefault(&c.Billing.PublishBatch.MaxDelay, DefaultBatchMaxDelay)
	setDefault(&c.Billing.UsageRetention, DefaultUsageRetention)
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		setDefault(&u.ConnectTimeout, DefaultConnectTimeout)
		setDefault(&u.WriteTimeout, DefaultWriteTimeout)
		setDefault(&u.FirstByteTimeout, DefaultFirstByteTimeout)
		setDefault(&u.IdleTimeout, DefaultIdleTimeout)
		setDefault(&u.ResponseTimeout, DefaultResponseTimeout)
		setDefault(&u.MaxConnections, DefaultMaxConnections)
		setDefault(&u.MaxResponseBody, DefaultMaxResponseBody)
	}
	for i := range c.Models {
		m := &c.Models[i]
		if len(c.Upstreams) == 1 && len(m.Upstreams) == 0 {
			setDefault(&m.Upstream, c.Upstreams[0].Name)
		}
		setDefault(&m.UpstreamModel, m.ID)
		for j := range m.Upstreams {
			setDefault(&m.Upstreams[j].Weight, 1)
		}
	}
	l.applyRoutingDefaults(&c.Routing)
	l.applyTracingDefaults(&c.Tracing)
	setDefault(&c.NATS.EmbeddedListen, DefaultEmbeddedListen)
	setDefault(&c.NATS.Replicas, DefaultReplicas)
	setDefault(&c.NATS.StartTimeout, DefaultNATSStartTimeout)
	setDefault(&c.ClickHouse.DSN, DefaultClickHouseDSN)
	applyStorageDefaults(&c.Storage)
	applyBatchDefaults(&c.Batch)

	p := &c.Plugins
	setDefault(&p.Engine, DefaultEngine)
	setDefault(&p.Vectors, DefaultVectors)
	if len(c.Models) > 0 {
		setDefault(&p.LLMModel, c.Models[0].ID)
	}
	for _, price := range []*string{&p.Pricing.Classify, &p.Pricing.Tag, &p.Pricing.Score, &p.Pricing.Match} {
		setDefault(price, DefaultPluginPrice)
	}
	setDefault(&p.MaxTextBytes, DefaultMaxTextBytes)
	if !l.isSet("plugins.public_limits.requests_per_minute") {
		setDefault(&p.PublicLimits.RequestsPerMinute, DefaultPublicRPM) // a written 0 turns public mode off
	}
	setDefault(&p.PublicLimits.TokensPerMinute, DefaultPublicTPM)
	setDefault(&p.PublicLimits.Concurrent, DefaultPublicConc)
	setDefault(&p.KeyLimits.RequestsPerMinute, DefaultKeyRPM)
	setDefault(&p.KeyLimits.TokensPerMinute, DefaultKeyTPM)
	setDefault(&p.KeyLimits.Concurrent, DefaultKeyConcurrent)
	for name, cl := range c.Classifiers {
		setDefault(&cl.Mode, ModeSingle)
		if !l.isSet("classifiers." + name + ".threshold") {
			cl.Threshold = DefaultThreshold
		}
		c.Classifiers[name] = cl
	}
}

// isSet reports whether the file gives path a value (null is no value).
func (l *loader) isSet(path string) bool {
	n, ok := l.nodes[path]
	if !ok {
		return false
	}
	n = resolveAlias(n)
	return !(n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

// DefaultMaxKeysCreatedPerHour is far above what a person makes by hand,
// and lets a loop of create and revoke, whose revoked keys stay stored,
// add at most 2,400 keys a day.
const DefaultMaxKeysCreatedPerHour = 100

// MaxCountCap bounds the per-account count caps (auth.max_keys_per_account,
// batch.max_pending_jobs) and creations per hour
// (auth.max_keys_created_per_hour): past it, write -1 for none.
const MaxCountCap = 1_000_000

// checkCountCap checks a per-account count cap: 1..MaxCountCap, or -1
// for none. A written 0 is refused, not read as "none allowed" nor
// replaced by the default.
func (l *loader) checkCountCap(path string, v int) { l.checkCount(path, v, "cap") }

// checkPerHour checks a per-account limit of creations per hour, as a
// count cap.
func (l *loader) checkPerHour(path string, v int) { l.checkCount(path, v, "limit") }

func (l *loader) checkCount(path string, v int, none string) {
	if l.writtenZero(path) {
		l.check(false, path, "must be 1..%d, or -1 for no %s; got 0", MaxCountCap, none)
		return
	}
	l.check(v == NoLimit || v >= 1 && v <= MaxCountCap, path, "%d is outside 1..%d (-1 for no %s)", v, MaxCountCap, none)
}

// check reports msg at path unless path (or a parent) already failed to
// decode: a value that did not decode is not also "missing".
func (l *loader) check(ok bool, path, format string, args ...any) {
	if ok {
		return
	}
	for p := path; ; p = parentPath(p) {
		if l.failed[p] {
			return
		}
		if p == "" {
			break
		}
	}
	l.errAt(nil, path, format, args...)
}

func (l *loader) validate(c *Config) {
	l.validateServer(c.Server)
	l.check(c.Auth.Algorithm == "EdDSA", "auth.algorithm",
		"%q is not supported: EdDSA (Ed25519) is the only supported algorithm", c.Auth.Algorithm)
	l.checkCountCap("auth.max_keys_per_account", c.Auth.MaxKeysPerAccount)
	l.checkPerHour("auth.max_keys_created_per_hour", c.Auth.MaxKeysCreatedPerHour)
	l.validateBilling(c.Billing)
	upstreams, upstreamNames := l.validateUpstreams(c.Upstreams)
	models := l.validateModels(c.Models, len(c.Upstreams), upstreams, upstreamNames, c.Server.MaxRequestBody)
	l.validateRouting(c.Routing)
	l.validateTracing(c.Tracing)
	l.validateNATS(c.NATS)
	l.checkClickHouseDSN(c.ClickHouse.DSN, "clickhouse.dsn")
	l.validatePlugins(c, models)
	l.validateStorage(c.Storage)
	l.validateBatch(c.Batch, c.Storage)
	l.validateListeners(c)
}

// validateListeners wants every address serve binds to be its own: two
// listeners on one address passed the check, and serve then stopped with
// "address already in use" (the embedded NATS server after a 10 s wait).
func (l *loader) validateListeners(c *Config) {
	type listener struct{ path, addr string }
	listeners := []listener{{"server.listen", c.Server.Listen}}
	if c.Server.DebugListen != "" {
		listeners = append(listeners, listener{"server.debug_listen", c.Server.DebugListen})
	}
	if c.Server.MetricsListen != "" {
		listeners = append(listeners, listener{"server.metrics_listen", c.Server.MetricsListen})
	}
	if c.NATS.URL == "" {
		listeners = append(listeners, listener{"nats.embedded_listen", c.NATS.EmbeddedListen})
	}
	if c.Storage.Backend == DefaultStorageBackend {
		listeners = append(listeners, listener{"storage.local.listen", c.Storage.Local.Listen})
	}
	for j, b := range listeners {
		for _, a := range listeners[:j] {
			if !listenersClash(a.addr, b.addr) {
				continue
			}
			// Said at the one the file writes: a default has no line.
			if !l.isSet(b.path) && l.isSet(a.path) {
				a, b = b, a
			}
			where := "its default"
			if n, ok := l.nodes[a.path]; ok && l.isSet(a.path) {
				where = fmt.Sprintf("line %d", n.Line)
			}
			everywhere := ""
			if listensEverywhere(a.addr) || listensEverywhere(b.addr) {
				everywhere = " (0.0.0.0, :: or no host takes the port on every address)"
			}
			l.check(false, b.path, "%q takes the address of %s %q (%s): give each listener its own port, or serve stops with \"address already in use\"%s",
				b.addr, a.path, a.addr, where, everywhere)
			break
		}
	}
}

// listenersClash says whether binding both addresses takes one port twice.
// Port 0 picks a free port; an unspecified host (0.0.0.0, ::, none) listens
// on every address, IPv4 and IPv6 alike, as Go binds it.
func listenersClash(a, b string) bool {
	hostA, portA, errA := net.SplitHostPort(a)
	hostB, portB, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil {
		return false
	}
	na, errA := strconv.Atoi(portA)
	nb, errB := strconv.Atoi(portB)
	if errA != nil || errB != nil || na == 0 || na != nb {
		return false
	}
	if listensEverywhere(a) || listensEverywhere(b) {
		return true
	}
	if ipA, ipB := listenIP(hostA), listenIP(hostB); ipA.IsValid() && ipB.IsValid() {
		return ipA == ipB
	}
	return strings.EqualFold(hostA, hostB)
}

func listensEverywhere(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	return err == nil && (host == "" || listenIP(host).IsUnspecified())
}

// listenIP is the address Go listens on for host, if it is one: localhost
// is 127.0.0.1, an IPv4-mapped IPv6 address its IPv4 one. Another host
// name is not looked up (it is compared as written, and the README says
// so): a check that asks DNS would pass or fail, and slow a reload, with
// the resolver, and which of a name's addresses Go binds is its own choice.
func listenIP(host string) netip.Addr {
	if strings.EqualFold(host, "localhost") {
		host = "127.0.0.1"
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return ip.Unmap()
}

func (l *loader) validateServer(s Server) {
	l.checkHostPort(s.Listen, "server.listen")
	if s.DebugListen != "" {
		l.checkHostPort(s.DebugListen, "server.debug_listen")
	}
	if s.MetricsListen != "" {
		l.checkHostPort(s.MetricsListen, "server.metrics_listen")
	}
	l.check(s.MaxRequestBody >= 1<<10 && s.MaxRequestBody <= 1<<30, "server.max_request_body",
		"%d bytes is outside 1KiB..1GiB", s.MaxRequestBody)
	l.checkUSD(s.DemoCreditUSD, "server.demo_credit_usd")
	// Clients' tokens are compared with their spaces trimmed, so a token
	// ending in a secret file's newline started and then refused every
	// admin call, the operator's ones to revoke a leaked key included.
	l.checkBearerToken(s.AdminToken, "server.admin_token", "no client could send it")
	if t := s.AdminToken; t != "" && strings.TrimSpace(t) != t {
		l.check(false, "server.admin_token", "starts or ends with whitespace: remove it; clients' tokens are read without them, so none would match")
	}
	// The token is the whole admin API (keys, balances): "x" was accepted.
	l.check(s.AdminToken == "" || len(s.AdminToken) >= MinAdminTokenBytes, "server.admin_token",
		"length %d, under the %d bytes an admin credential needs: write a random one (openssl rand -hex 16), or leave it empty to have one generated into data_dir",
		len(s.AdminToken), MinAdminTokenBytes)
	if l.writtenZero("server.shutdown_timeout") {
		// Zero would read as the default, 25 s: not what "cut at once" meant.
		l.check(false, "server.shutdown_timeout", "0 is outside 1ns..1h: write how long calls in flight get after SIGTERM, or leave it out for %s", DefaultShutdownTimeout)
	} else {
		l.check(s.ShutdownTimeout > 0 && s.ShutdownTimeout <= time.Hour, "server.shutdown_timeout",
			"%s is outside 1ns..1h", s.ShutdownTimeout)
	}
	l.check(s.HSTSMaxAge >= 0 && s.HSTSMaxAge <= MaxHSTSMaxAge && s.HSTSMaxAge%time.Second == 0, "server.hsts_max_age",
		"%s is outside 0s..%s or not whole seconds (0s sends no Strict-Transport-Security)", s.HSTSMaxAge, MaxHSTSMaxAge)
	for i, p := range s.TrustedProxies {
		_, errPrefix := netip.ParsePrefix(p)
		_, errAddr := netip.ParseAddr(p)
		l.check(errPrefix == nil || errAddr == nil, fmt.Sprintf("server.trusted_proxies[%d]", i),
			"%q is neither a CIDR (10.0.0.0/8) nor an IP address", p)
	}
	if s.PublicURL != "" && l.checkURLBlanks(s.PublicURL, "server.public_url") {
		u, err := url.Parse(s.PublicURL)
		ok := err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != "" &&
			(u.Path == "" || u.Path == "/") && u.RawQuery == "" && u.Fragment == "" && u.User == nil
		// Browsers write Origin with an ASCII host (punycode) and a port
		// as a plain number: "gw.example.com:" or ":0443" never match.
		if ok {
			port := u.Port()
			ok = !strings.HasSuffix(u.Host, ":") && (port == "" || port[0] != '0') && isASCII(u.Host)
		}
		l.check(ok, "server.public_url", "%q is not a scheme and host such as https://gateway.example.com (an ASCII host, punycode for others; a port as a plain number)", s.PublicURL)
	}
}

func (l *loader) validateBilling(b Billing) {
	l.checkUSD(b.GraceUSD, "billing.grace_usd")
	l.check(b.OutboxMaxBytes >= 1<<20, "billing.outbox_max_bytes",
		"%d bytes is below the 1MiB minimum", b.OutboxMaxBytes)
	l.check(b.Durability == "process" || b.Durability == "fsync", "billing.durability",
		"%q is neither process (the page cache: survives a killed gateway) nor fsync (the disk: survives a power loss)", b.Durability)
	l.check(b.FsyncInterval > 0 && b.FsyncInterval <= time.Minute, "billing.fsync_interval",
		"%s is outside 1ns..1m", b.FsyncInterval)
	pb := b.PublishBatch
	l.check(pb.MaxEvents >= 1 && pb.MaxEvents <= 100_000, "billing.publish_batch.max_events",
		"%d is outside 1..100000", pb.MaxEvents)
	l.check(pb.MaxBytes >= 4<<10 && pb.MaxBytes <= 768<<10, "billing.publish_batch.max_bytes",
		"%d bytes is outside 4KiB..768KiB (a batch must fit NATS's 1MB max_payload)", pb.MaxBytes)
	l.check(pb.MaxDelay > 0 && pb.MaxDelay <= time.Second, "billing.publish_batch.max_delay",
		"%s is outside 1ns..1s", pb.MaxDelay)
	l.check(b.UsageRetention >= time.Hour && b.UsageRetention <= 366*24*time.Hour, "billing.usage_retention",
		"%s is outside 1h..8784h (366 days)", b.UsageRetention)
}

// validateUpstreams returns the set of upstream names and the names in
// config order, for checking the models' pools against them.
func (l *loader) validateUpstreams(list []Upstream) (map[string]bool, []string) {
	l.check(len(list) > 0, "upstreams", "at least one upstream is required")
	upstreams := map[string]bool{}
	var upstreamNames []string
	for i, u := range list {
		path := fmt.Sprintf("upstreams[%d]", i)
		l.check(u.Name != "", path+".name", "an upstream needs a name")
		l.check(!upstreams[u.Name] || u.Name == "", path+".name", "upstream %q is listed twice", u.Name)
		if u.Name != "" && !upstreams[u.Name] {
			upstreams[u.Name] = true
			upstreamNames = append(upstreamNames, u.Name)
		}
		l.checkHTTPURL(u.BaseURL, path+".base_url", "http://127.0.0.1:8000/v1")
		if u.TLSCA != "" {
			list[i].tlsCAPEM = l.readCAFile(u.TLSCA, u.BaseURL, path+".tls_ca")
		}
		// The key goes into a header line as it is: a newline (a secret
		// file's last one, a YAML | block) ended the Authorization header
		// early, and the body went upstream as a second request whose
		// answer the next call received.
		l.checkBearerToken(u.APIKey, path+".api_key", "it would end the Authorization header")
		if k := u.APIKey; k != "" && strings.TrimSpace(k) != k {
			// Sent as it is, the space is part of the key the upstream
			// reads (or an empty credential before it), and every call is
			// refused as unauthenticated.
			l.check(false, path+".api_key", "starts or ends with whitespace: remove it; the upstream would read it as part of the key")
		}
		for _, d := range []struct {
			key    string
			v, def time.Duration
		}{
			{"connect_timeout", u.ConnectTimeout, DefaultConnectTimeout}, {"write_timeout", u.WriteTimeout, DefaultWriteTimeout},
			{"first_byte_timeout", u.FirstByteTimeout, DefaultFirstByteTimeout}, {"idle_timeout", u.IdleTimeout, DefaultIdleTimeout},
			{"response_timeout", u.ResponseTimeout, DefaultResponseTimeout},
		} {
			if l.writtenZero(path + "." + d.key) {
				// The default would replace it: no timeout is not on offer.
				l.check(false, path+"."+d.key, "must be positive, got 0: write a duration, or leave it out for %s", d.def)
				continue
			}
			l.check(d.v > 0, path+"."+d.key, "must be positive, got %s", d.v)
		}
		if l.writtenZero(path + ".max_connections") {
			// The default would replace it: 0 reads as "no connections".
			l.check(false, path+".max_connections", "must be positive, got 0: write how many connections it may have, or leave it out for %d", DefaultMaxConnections)
		}
		l.check(u.MaxConnections > 0, path+".max_connections", "must be positive, got %d", u.MaxConnections)
		l.check(u.MaxResponseBody > 0, path+".max_response_body", "must be positive, got %d", u.MaxResponseBody)
	}
	return upstreams, upstreamNames
}

// validateModels returns the set of model ids, for checking what the
// plugins name against it.
func (l *loader) validateModels(list []Model, nUpstreams int, upstreams map[string]bool, upstreamNames []string, maxBody ByteSize) map[string]bool {
	models := map[string]bool{}
	for i, m := range list {
		path := fmt.Sprintf("models[%d]", i)
		switch {
		case m.ID == "":
			l.check(false, path+".id", "a model needs an id")
		case hasSpace(m.ID):
			l.check(false, path+".id", "%q contains whitespace", m.ID)
		case models[m.ID]:
			l.check(false, path+".id", "model %q is listed twice", m.ID)
		}
		models[m.ID] = true
		l.validatePool(m, path, nUpstreams, upstreams, upstreamNames)
		for _, f := range []struct {
			key string
			v   int
		}{{"context_length", m.ContextLength}, {"max_output_length", m.MaxOutputLength}} {
			if !l.isSet(path + "." + f.key) {
				// No default is right for every model: said so, not "got 0".
				l.check(false, path+"."+f.key, "is required: the model's %s in tokens (no default)", strings.ReplaceAll(f.key, "_", " "))
				continue
			}
			l.check(f.v > 0, path+"."+f.key, "must be positive, got %d", f.v)
		}
		l.check(m.MaxOutputLength <= m.ContextLength || m.ContextLength <= 0, path+".max_output_length",
			"%d is more than context_length %d", m.MaxOutputLength, m.ContextLength)
		p := m.Pricing
		// `pricing:` or `pricing: {}` written with nothing in it is a
		// half-written block more likely than a free model.
		if _, written := l.nodes[path+".pricing"]; written && p == (Pricing{}) {
			l.check(false, path+".pricing", `is empty: write prompt and completion ("0" for free), or leave pricing out for a free model`)
		} else if written && !hasUnknownKey(l.nodes[path+".pricing"], "prompt", "completion", "image", "request", "input_cache_read") {
			// A block that prices a model's cached tokens or images but
			// leaves out prompt or completion made every call's tokens
			// free; a model meant to be free there says "0". (A misspelt
			// key is reported as unknown already.)
			var missing []string
			for _, key := range []string{"prompt", "completion"} {
				if _, priced := l.nodes[path+".pricing."+key]; !priced {
					missing = append(missing, key)
				}
			}
			l.check(len(missing) == 0, path+".pricing", `has no %s price: write it (USD per token, "0" for free), or leave pricing out for a free model`, strings.Join(missing, " and no "))
		}
		for _, price := range []struct{ key, v string }{
			{"prompt", p.Prompt}, {"completion", p.Completion}, {"image", p.Image},
			{"request", p.Request}, {"input_cache_read", p.InputCacheRead},
		} {
			if price.v == "" {
				// An omitted price is free. One written but empty
				// (`completion:`, or ${VAR} of an unset variable) is more
				// likely a mistake than a free model.
				_, written := l.nodes[path+".pricing."+price.key]
				hint := `write "0" for a free ` + price.key + `, or leave the line out`
				switch price.key {
				case "prompt", "completion": // the block needs both
					hint = `write the price, "0" for free`
				case "input_cache_read":
					hint = `write "0" for free cached tokens, or leave the line out to bill them at the prompt price`
				}
				l.check(!written, path+".pricing."+price.key, "is empty: %s", hint)
				continue
			}
			_, err := parsePrice(price.v)
			l.check(err == nil, path+".pricing."+price.key, "%v (write USD per unit as a quoted decimal such as \"0.00000015\")", err)
		}
		l.checkModelCallCost(path, p, maxBody)
		l.checkOneOf(m.InputModalities, Modalities, path+".input_modalities")
		l.checkOneOf(m.OutputModalities, Modalities, path+".output_modalities")
		l.checkOneOf(m.SupportedFeatures, Features, path+".supported_features")
		l.checkNoRepeat(m.SupportedSamplingParameters, path+".supported_sampling_parameters")
	}
	return models
}

func (l *loader) validateNATS(n NATS) {
	if n.URL == "" {
		l.checkHostPort(n.EmbeddedListen, "nats.embedded_listen")
		host, _, _ := net.SplitHostPort(n.EmbeddedListen)
		ip := net.ParseIP(host)
		l.check(host == "localhost" || ip != nil && ip.IsLoopback(), "nats.embedded_listen",
			"%q is not a loopback address: the embedded server has no authentication, so anyone who reaches it could rewrite balances and keys; "+
				"use 127.0.0.1, or run an external NATS with credentials (nats.url, nats.creds_file)", n.EmbeddedListen)
	}
	l.check(n.Replicas >= 1 && n.Replicas <= 5, "nats.replicas",
		"must be 1 to 5 (JetStream's limit), got %d", n.Replicas)
	if l.writtenZero("nats.start_timeout") {
		// Zero would read as the default: not what "do not wait" meant.
		l.check(false, "nats.start_timeout", "0 is outside 1s..1h: write how long a start waits for NATS's JetStream, or leave it out for %s", DefaultNATSStartTimeout)
	} else {
		// Under a second is no wait: one try takes longer, and 1ms failed
		// a start on a healthy cluster while 1ns made one try.
		l.check(n.StartTimeout >= time.Second && n.StartTimeout <= time.Hour, "nats.start_timeout", "%s is outside 1s..1h", n.StartTimeout)
	}
	l.check(n.TLSKey != "" || n.TLSCert == "", "nats.tls_cert", "tls_key is missing: set both tls_cert and tls_key, or neither")
	l.check(n.TLSCert != "" || n.TLSKey == "", "nats.tls_key", "tls_cert is missing: set both tls_cert and tls_key, or neither")
	l.checkNATSFiles(n)
}

func (l *loader) validatePlugins(c *Config, models map[string]bool) {
	p := c.Plugins
	l.check(slices.Contains(Engines, p.Engine), "plugins.engine", "%q is not one of %s", p.Engine, strings.Join(Engines, ", "))
	switch {
	case p.LLMModel == "" && p.Engine == "llm":
		l.check(false, "plugins.llm_model", "engine llm needs a model: list one under models or set llm_model")
	case p.LLMModel != "" && !models[p.LLMModel]:
		l.check(false, "plugins.llm_model", "no model has id %q (catalog: %s)", p.LLMModel, strings.Join(catalogIDs(c), ", "))
	}
	for _, price := range []struct{ key, v string }{
		{"classify", p.Pricing.Classify}, {"tag", p.Pricing.Tag}, {"score", p.Pricing.Score}, {"match", p.Pricing.Match},
	} {
		_, err := parsePrice(price.v)
		l.check(err == nil, "plugins.pricing."+price.key, "%v (write USD per token as a quoted decimal such as \"0.00000008\")", err)
		l.checkTokenPriceCallCost("plugins.pricing", price.key, price.v)
	}
	// A missing vectors file is not an error (the gateway answers with
	// the lexical engine and says so at start); a directory is a typo.
	if st, err := os.Stat(p.Vectors); err == nil {
		l.check(!st.IsDir(), "plugins.vectors", "%s is a directory; name the vectors file (default %s)", p.Vectors, DefaultVectors)
	}
	l.check(p.MaxTextBytes >= 1 && p.MaxTextBytes <= 1<<30, "plugins.max_text_bytes", "%d bytes is outside 1..1GiB", p.MaxTextBytes)
	for _, lim := range []struct {
		path string
		v    Limits
	}{{"plugins.public_limits", p.PublicLimits}, {"plugins.key_limits", p.KeyLimits}} {
		for _, f := range []struct {
			key string
			v   int64
		}{{"requests_per_minute", lim.v.RequestsPerMinute}, {"tokens_per_minute", lim.v.TokensPerMinute}, {"concurrent", lim.v.Concurrent}} {
			path := lim.path + "." + f.key
			switch {
			case path == "plugins.public_limits.requests_per_minute" && f.v == 0:
				// Public mode off: classify and tag want a key, as score does.
			case l.writtenZero(path) && lim.path == "plugins.public_limits":
				l.check(false, path, "must be positive, or -1 for no limit; got 0 (to turn public mode off, write requests_per_minute: 0)")
			case l.writtenZero(path):
				// The default would replace it: a 0 meant as "none" would allow the default.
				l.check(false, path, "must be positive, or -1 for no limit; got 0 (to stop a key, revoke it)")
			default:
				l.check(f.v > 0 || f.v == NoLimit, path, "must be positive, or -1 for no limit; got %d", f.v)
			}
		}
	}
	for _, name := range c.ClassifierNames() {
		path := "classifiers." + name
		cl := c.Classifiers[name]
		// The rules a classify request is held to: a saved classifier no
		// request could carry failed every request that named it.
		for _, pr := range CheckClassification(cl, c.Plugins.MaxTextBytes) {
			l.check(false, path+"."+pr.Field, "%s", pr.Msg)
		}
		// An offline engine answers every call that names no model; under
		// auto or llm, labels only the llm tells apart are the operator's
		// choice (and tie, flagged, while auto answers offline).
		if e := c.Plugins.Engine; e == "semantic" || e == "lexical" {
			for _, pr := range OfflineLabelProblems("labels", cl.Labels, fmt.Sprintf("plugins.engine is %s: set it to auto or llm", e), 0) {
				l.check(false, path+"."+pr.Field, "%s", pr.Msg)
			}
		}
		// Checked last: a failed path hides the problems under it.
		l.check(name != "" && !hasSpace(name), path, "a classifier name must be non-empty and without whitespace, got %q", name)
	}
}

func catalogIDs(c *Config) []string {
	ids := make([]string, len(c.Models))
	for i, m := range c.Models {
		ids[i] = m.ID
	}
	return ids
}

func (l *loader) checkHostPort(v, path string) {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		l.check(false, path, "%q: want host:port such as 127.0.0.1:8080", v)
		return
	}
	n, err := strconv.Atoi(port)
	l.check(err == nil && n >= 0 && n <= 65535, path, "%q: port %q is not a number from 0 to 65535", v, port)
	l.check(!hasSpace(host), path, "%q: the host contains whitespace", v)
}

// parsePrice is money.ParsePrice without its leniency for spaces around
// the number, which the config refuses as it does around a key or token:
// " 0.0000001" was taken, billed right, and shown so by config get.
func parsePrice(s string) (money.Price, error) {
	if strings.TrimSpace(s) != s {
		return 0, fmt.Errorf("price %q: starts or ends with whitespace: remove it", s)
	}
	return money.ParsePrice(s)
}

// parseUSD is money.ParseUSD refusing spaces around the number, as
// parsePrice does.
func parseUSD(s string) (money.Nanos, error) {
	if strings.TrimSpace(s) != s {
		return 0, fmt.Errorf("USD amount %q: starts or ends with whitespace: remove it", s)
	}
	return money.ParseUSD(s)
}

func (l *loader) checkUSD(v, path string) {
	n, err := parseUSD(v)
	if err != nil {
		l.check(false, path, "%v (write a quoted decimal such as \"0.50\")", err)
		return
	}
	l.check(n >= 0, path, "must not be negative, got %s", v)
}

// checkHTTPURL checks an absolute http(s) URL; example, in the errors,
// is one the setting takes.
func (l *loader) checkHTTPURL(v, path, example string) {
	if v == "" {
		l.check(false, path, "required: an absolute http:// or https:// URL such as %s", example)
		return
	}
	if !l.checkURLBlanks(v, path) {
		return
	}
	u, err := url.Parse(v)
	shown := RedactURL(v) // the error is logged: a ?token= in it too
	switch {
	case err != nil || !u.IsAbs() || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		l.check(false, path, "%q: want an absolute http:// or https:// URL such as %s", shown, example)
	case u.User != nil:
		// A user and password in the URL were dropped without a word, and
		// every call went without them. Redacted: the error is logged.
		hint := "remove them"
		if strings.HasSuffix(path, ".base_url") {
			hint = `put the upstream's key in api_key instead (sent as "Authorization: Bearer <key>")`
		}
		l.check(false, path, "%q: a user or password before the host is never sent; %s", shown, hint)
	case u.Fragment != "" || strings.HasSuffix(v, "#"):
		l.check(false, path, "%q: a #fragment is never sent to a server; remove it (a query such as ?api-version=1 is kept)", shown)
	}
}

// readCAFile reads the PEM file of CA certificates an upstream's tls_ca
// names, at path, and returns its content: a file with no certificate
// would have made every handshake fail with "certificate signed by
// unknown authority", found only at the first call.
func (l *loader) readCAFile(file, baseURL, path string) string {
	if u, err := url.Parse(baseURL); err == nil && u.Scheme == "http" {
		l.check(false, path, "set for an http:// base_url, which has no TLS to verify: remove it, or use https://")
		return ""
	}
	// A pipe named here held the check, and each reload, on its read.
	data, ok := l.readSettingFile(file, path, "the PEM file of the CA that signed the upstream's certificate")
	if !ok {
		return ""
	}
	certs := 0
	for rest := data; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		certs++
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			l.check(false, path, "%s: certificate %d does not parse: %v", file, certs, err)
			return ""
		}
	}
	if certs == 0 {
		l.check(false, path, "%s holds no PEM certificate (-----BEGIN CERTIFICATE-----): name the file of the CA that signed the upstream's certificate", file)
		return ""
	}
	return string(data)
}

func (l *loader) checkOneOf(values, allowed []string, path string) {
	for i, v := range values {
		ok := false
		for _, a := range allowed {
			ok = ok || v == a
		}
		l.check(ok, fmt.Sprintf("%s[%d]", path, i), "%q is not one of %s", v, strings.Join(allowed, ", "))
	}
	l.checkNoRepeat(values, path)
}

// checkNoRepeat refuses an entry listed twice, as upstreams and models
// are: [tools, tools] was taken in silence, a slip (the entry meant
// beside it written over) more likely than meant.
func (l *loader) checkNoRepeat(values []string, path string) {
	for i, v := range values {
		if first := slices.Index(values, v); first < i {
			l.check(false, fmt.Sprintf("%s[%d]", path, i), "%q is listed twice (also at [%d]): remove one", v, first)
		}
	}
}

// RestartOnlyDiff names, as yaml paths, the fields that differ between old
// and c but only take effect at start: the listener, the data directory, the
// admin token, the request size limit fasthttp reads with, everything under
// nats, the clickhouse settings, and the storage backend with its
// connection (storageRestartOnly). A reload that changes any is refused.
func (c *Config) RestartOnlyDiff(old *Config) []string {
	if old == nil {
		return nil
	}
	var changed []string
	add := func(differs bool, path string) {
		if differs {
			changed = append(changed, path)
		}
	}
	add(c.Server.Listen != old.Server.Listen, "server.listen")
	add(c.Server.DataDir != old.Server.DataDir, "server.data_dir")
	add(c.Server.AdminToken != old.Server.AdminToken, "server.admin_token")
	add(c.Server.MaxRequestBody != old.Server.MaxRequestBody, "server.max_request_body")
	add(c.Server.DebugListen != old.Server.DebugListen, "server.debug_listen")
	add(c.Server.MetricsListen != old.Server.MetricsListen, "server.metrics_listen")
	// The account store takes the issuer once, when it opens: a reload
	// that changed it would report success and sign and check keys with
	// the old one until the next start.
	add(c.Auth.Issuer != old.Auth.Issuer, "auth.issuer")
	add(c.Billing.OutboxMaxBytes != old.Billing.OutboxMaxBytes, "billing.outbox_max_bytes")
	add(c.Billing.Durability != old.Billing.Durability, "billing.durability")
	add(c.Billing.FsyncInterval != old.Billing.FsyncInterval, "billing.fsync_interval")
	add(c.Billing.PublishBatch != old.Billing.PublishBatch, "billing.publish_batch")
	add(c.Billing.UsageRetention != old.Billing.UsageRetention, "billing.usage_retention")
	nv, ov := reflect.ValueOf(c.NATS), reflect.ValueOf(old.NATS)
	for i := range nv.NumField() {
		if name := yamlName(nv.Type().Field(i)); name != "" {
			add(!reflect.DeepEqual(nv.Field(i).Interface(), ov.Field(i).Interface()), "nats."+name)
		}
	}
	add(c.ClickHouse.DSN != old.ClickHouse.DSN, "clickhouse.dsn")
	add(c.Tracing != old.Tracing, "tracing")
	// Whether serve runs the billing consumer is decided once at start.
	add(c.ClickHouse.ConsumeInServe != old.ClickHouse.ConsumeInServe, "clickhouse.consume_in_serve")
	changed = append(changed, storageRestartOnly(c.Storage, old.Storage)...)
	add(c.Batch.MaxJobs != old.Batch.MaxJobs, "batch.max_jobs")
	// A shorter max age makes nats-server delete, at once, the mappings
	// older than it, of every gateway on this NATS, and a longer one
	// later brings none back: a slip (72m for 72h) saved in an editor
	// must not do that 2 s later. A longer one harms nothing and reloads.
	add(c.Routing.ResponseTTL < old.Routing.ResponseTTL, "routing.response_ttl")
	return changed
}

// restartOnlyReasons describes each field RestartOnlyDiff named, for the
// refusal: its path, its line in c's file and, where the restart is asked
// for what the change would destroy, what that is.
func (c *Config) restartOnlyReasons(old *Config, fields []string) []string {
	reasons := make([]string, len(fields))
	for i, path := range fields {
		reasons[i] = path
		if line := c.line(path); line > 0 {
			reasons[i] += fmt.Sprintf(" (line %d)", line)
		}
		if path == "routing.response_ttl" {
			reasons[i] += fmt.Sprintf(": %s is shorter than the %s in force, and would delete the stored responses older than %s (the TOLLGATE_RESPONSES bucket's mappings) for every gateway on this NATS, for good; a longer value reloads, a shorter one takes a restart",
				c.Routing.ResponseTTL, old.Routing.ResponseTTL, c.Routing.ResponseTTL)
		}
	}
	return reasons
}

// checkURLBlanks refuses a URL setting with a space or a control
// character in it, and says whether it had none. A trailing space (a copy,
// an env variable written with one) passed url.Parse as part of the path:
// every call then went to "/v1 /chat/completions" and was answered 404.
func (l *loader) checkURLBlanks(v, path string) bool {
	return l.checkURLBlanksShown(v, v, path)
}

// checkURLBlanksShown is checkURLBlanks for a URL with a secret in it: v,
// the value as written, is checked, and shown (v with the secret hidden)
// is what the message quotes. Checking a redacted form instead missed
// spaces, which redaction writes as %20.
func (l *loader) checkURLBlanksShown(v, shown, path string) bool {
	blank := func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }
	i := strings.IndexFunc(v, blank)
	if i < 0 {
		return true
	}
	r, _ := utf8.DecodeRuneInString(v[i:])
	switch {
	case strings.TrimFunc(v, blank) != v:
		l.check(false, path, "%q starts or ends with whitespace: remove it; it would be read as part of the URL", shown)
	case r == ' ':
		l.check(false, path, "%q contains a space at byte %d: remove it, or write it as %%20 if the server's path has one", shown, i+1)
	default:
		l.check(false, path, "%q contains the character %U at byte %d (whitespace or a control character): remove it", shown, r, i+1)
	}
	return false
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// hasUnknownKey reports whether mapping n (or the one it is an alias of)
// has a key other than those known.
func hasUnknownKey(n *yaml.Node, known ...string) bool {
	if n == nil {
		return false
	}
	if n = resolveAlias(n); n.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i < len(n.Content); i += 2 {
		if !slices.Contains(known, n.Content[i].Value) {
			return true
		}
	}
	return false
}

// checkBearerToken refuses a token that cannot go into a header line as it
// is: a control character, above all a secret file's trailing newline.
func (l *loader) checkBearerToken(token, path, consequence string) {
	i := strings.IndexFunc(token, func(r rune) bool { return r < 0x20 || r == 0x7f })
	if i < 0 {
		// A byte order mark or a zero-width space from a copy: invisible
		// in the file, and in no token a client sends.
		if j := strings.IndexFunc(token, func(r rune) bool { return r > 0x7f }); j >= 0 {
			r, _ := utf8.DecodeRuneInString(token[j:])
			l.check(false, path, "contains the non-ASCII character %U at byte %d (a byte order mark or zero-width space from a copy?): remove it; a token is ASCII", r, j+1)
		}
		return
	}
	what := "a control character"
	if c := token[i]; c == '\n' || c == '\r' {
		what = "a line break"
	}
	l.check(false, path, "contains %s at byte %d (a secret file's trailing newline, a YAML | block?): remove it; %s", what, i+1, consequence)
}
