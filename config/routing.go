package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// PoolMember is one upstream of a model's pool. In YAML it is a bare name
// (`- gpu-a`) or a mapping (`- {name: gpu-a, weight: 3}`).
type PoolMember struct {
	Name string `yaml:"name"`
	// Weight is the member's share of the traffic relative to the others
	// (1..1000). Default 1.
	Weight int `yaml:"weight"`
}

// UnmarshalYAML accepts the bare-name form as well as the mapping.
func (p *PoolMember) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		p.Name = n.Value
		return nil
	}
	type plain PoolMember
	return n.Decode((*plain)(p))
}

var poolMemberType = reflect.TypeOf(PoolMember{})

// Routing decides which upstream of a model's pool serves a call, when an
// upstream is taken out, and when a call is tried again elsewhere. Every
// field is hot-reloadable.
type Routing struct {
	// Balance is "p2c" (power of two choices over in-flight requests and
	// latency), "least_in_flight" or "round_robin". Default p2c.
	Balance string `yaml:"balance"`
	// Affinity sends calls that belong together to the same upstream while
	// it is healthy, so its prefix cache hits: "none", "prefix" (a hash of
	// the first AffinityPrefixBytes of messages or input) or "header" (the
	// AffinityHeader request header, falling back to balancing without
	// it). Default none.
	Affinity            string   `yaml:"affinity"`
	AffinityPrefixBytes ByteSize `yaml:"affinity_prefix_bytes"`
	AffinityHeader      string   `yaml:"affinity_header"`
	// Retries is how many more upstreams a call may try when one refuses
	// the connection, times out before the first byte, or answers 429, 502
	// or 503; RetryBudget bounds the time all attempts may take before a
	// first byte. Nothing is retried once a byte went to the client.
	Retries     int           `yaml:"retries"`
	RetryBudget time.Duration `yaml:"retry_budget"`
	// EjectAfter consecutive failures (connect errors, 5xx, first-byte
	// timeouts) take an upstream out for EjectFor, doubling while it keeps
	// failing up to EjectMax (a circuit breaker: closed, open, half-open).
	EjectAfter int           `yaml:"eject_after"`
	EjectFor   time.Duration `yaml:"eject_for"`
	EjectMax   time.Duration `yaml:"eject_max"`
	// ProbeInterval is how often an ejected upstream is probed with
	// GET {base_url}/models; a success brings it back at once.
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// ResponseTTL is how long the gateway remembers which upstream created
	// a /v1/responses response (and for which account), so
	// previous_response_id and GET/DELETE /v1/responses/{id} reach it: the
	// max age of the JetStream KV bucket shared by all gateways. Default
	// 720h (30 days), like OpenAI's retention of stored responses.
	ResponseTTL time.Duration `yaml:"response_ttl"`
}

// Balancing modes and affinity kinds.
var (
	BalanceModes  = []string{"p2c", "least_in_flight", "round_robin"}
	AffinityKinds = []string{"none", "prefix", "header"}
)

// MaxPoolSize bounds the upstreams of one model's pool.
const MaxPoolSize = 64

// Routing defaults.
const (
	DefaultBalance             = "p2c"
	DefaultAffinity            = "none"
	DefaultAffinityPrefixBytes = ByteSize(1 << 10)
	DefaultAffinityHeader      = "x-session-id"
	DefaultRetries             = 2
	// DefaultRetryBudget is above DefaultFirstByteTimeout: at 10s, a
	// member that did not answer within its 60s was never retried on
	// another, and the call got a 503 beside healthy members.
	DefaultRetryBudget   = 2 * time.Minute
	DefaultEjectAfter    = 3
	DefaultEjectFor      = time.Second
	DefaultEjectMax      = 30 * time.Second
	DefaultProbeInterval = 2 * time.Second
	DefaultResponseTTL   = 30 * 24 * time.Hour
)

func (l *loader) applyRoutingDefaults(r *Routing) {
	setDefault(&r.Balance, DefaultBalance)
	setDefault(&r.Affinity, DefaultAffinity)
	setDefault(&r.AffinityPrefixBytes, DefaultAffinityPrefixBytes)
	setDefault(&r.AffinityHeader, DefaultAffinityHeader)
	if !l.isSet("routing.retries") {
		setDefault(&r.Retries, DefaultRetries) // an explicit 0 turns retries off
	}
	setDefault(&r.RetryBudget, DefaultRetryBudget)
	setDefault(&r.EjectAfter, DefaultEjectAfter)
	setDefault(&r.EjectFor, DefaultEjectFor)
	setDefault(&r.EjectMax, DefaultEjectMax)
	setDefault(&r.ProbeInterval, DefaultProbeInterval)
	setDefault(&r.ResponseTTL, DefaultResponseTTL)
}

func (l *loader) validateRouting(r Routing) {
	l.check(slices.Contains(BalanceModes, r.Balance), "routing.balance", "%q is not one of %s", r.Balance, strings.Join(BalanceModes, ", "))
	l.check(slices.Contains(AffinityKinds, r.Affinity), "routing.affinity", "%q is not one of %s", r.Affinity, strings.Join(AffinityKinds, ", "))
	l.check(r.AffinityPrefixBytes >= 16 && r.AffinityPrefixBytes <= 1<<20, "routing.affinity_prefix_bytes",
		"%d is outside 16..1MiB", r.AffinityPrefixBytes)
	l.check(!strings.ContainsAny(r.AffinityHeader, " :\t\r\n"), "routing.affinity_header", "%q is not a header name", r.AffinityHeader)
	l.check(r.Retries >= 0 && r.Retries <= 10, "routing.retries", "%d is outside 0..10", r.Retries)
	// A written 0 would be replaced by the default, which is not what
	// "no time" meant: each says what to write instead.
	l.check(!l.writtenZero("routing.retry_budget"), "routing.retry_budget",
		"must be positive, got 0: to turn retries off write retries: 0; or leave it out for %s", DefaultRetryBudget)
	l.check(r.RetryBudget > 0, "routing.retry_budget", "must be positive, got %s", r.RetryBudget)
	l.check(r.EjectAfter >= 1 && r.EjectAfter <= 1000, "routing.eject_after", "%d is outside 1..1000", r.EjectAfter)
	l.check(!l.writtenZero("routing.eject_for"), "routing.eject_for",
		"must be positive, got 0: an upstream cannot be ejected for no time; to eject rarely raise eject_after (up to 1000), or leave it out for %s", DefaultEjectFor)
	l.check(r.EjectFor > 0, "routing.eject_for", "must be positive, got %s", r.EjectFor)
	l.check(r.EjectMax >= r.EjectFor, "routing.eject_max", "%s is less than eject_for %s", r.EjectMax, r.EjectFor)
	l.check(r.ProbeInterval >= 100*time.Millisecond, "routing.probe_interval", "%s is under 100ms", r.ProbeInterval)
	l.check(!l.writtenZero("routing.response_ttl"), "routing.response_ttl",
		"0 is outside 1m..8760h: write how long response ids are remembered, or leave it out for 720h (30 days)")
	l.check(r.ResponseTTL >= time.Minute && r.ResponseTTL <= 8760*time.Hour, "routing.response_ttl",
		"%s is outside 1m..8760h", r.ResponseTTL)
}

// Pool returns the upstreams serving m: its upstreams list, or its one
// upstream (after defaults, the only configured one when it named none).
func (m Model) Pool() []PoolMember {
	if len(m.Upstreams) > 0 {
		return m.Upstreams
	}
	if m.Upstream == "" {
		return nil
	}
	return []PoolMember{{Name: m.Upstream, Weight: 1}}
}

// validatePool checks a model's upstream or upstreams against the
// configured upstream names.
func (l *loader) validatePool(m Model, path string, configured int, known map[string]bool, names []string) {
	if m.Upstream != "" && len(m.Upstreams) > 0 {
		l.check(false, path+".upstreams", "give either upstream (one) or upstreams (a pool), not both")
		return
	}
	check := func(name, at string) {
		switch {
		case name == "":
			l.check(false, at, "an upstream name is required")
		case !known[name] && len(names) > 0:
			l.check(false, at, "no upstream is named %q (configured: %s)", name, strings.Join(names, ", "))
		}
	}
	if len(m.Upstreams) == 0 {
		if m.Upstream == "" && configured > 1 {
			l.check(false, path+".upstream", "required when more than one upstream is configured (one of: %s; or a pool with upstreams)",
				strings.Join(names, ", "))
			return
		}
		if m.Upstream != "" {
			check(m.Upstream, path+".upstream")
		}
		return
	}
	// The picker marks tried members in a 64-bit mask.
	l.check(len(m.Upstreams) <= MaxPoolSize, path+".upstreams", "%d upstreams; a pool holds at most %d", len(m.Upstreams), MaxPoolSize)
	seen := map[string]bool{}
	for i, p := range m.Upstreams {
		at := fmt.Sprintf("%s.upstreams[%d]", path, i)
		check(p.Name, at)
		l.check(!seen[p.Name] || p.Name == "", at, "upstream %q is in the pool twice", p.Name)
		seen[p.Name] = true
		// An omitted weight is 1, but one written 0 is an operator draining
		// the member, which a default of 1 would keep sending calls.
		if l.writtenZero(at + ".weight") {
			l.check(false, at+".weight", "0 is outside 1..1000: to take %s out of the pool, remove it from the list (calls in flight finish)", p.Name)
		} else {
			l.check(p.Weight >= 1 && p.Weight <= 1000, at+".weight", "%d is outside 1..1000", p.Weight)
		}
	}
}

// writtenZero reports whether the file writes path as zero (0, 0x0, 0s),
// which the loader's defaults would silently replace: for fields where
// zero reads as "none" or "at once", an error says so instead. A zero
// written through an alias (*zero) is one too; an empty value (null,
// "") is none, and takes the default as gateway.yaml's header says.
func (l *loader) writtenZero(path string) bool {
	n, written := l.nodes[path]
	if !written {
		return false
	}
	if n = resolveAlias(n); n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		return false
	}
	var i int64
	if n.Decode(&i) == nil {
		return i == 0
	}
	d, err := time.ParseDuration(n.Value)
	return err == nil && d == 0
}
