package config

import (
	"net"
	"slices"
	"strings"
	"time"
)

// ShippedEnv maps each variable the repository's gateway.yaml reads to
// the setting it sets there (a test holds the two together).
var ShippedEnv = map[string]string{
	"TOLLGATE_LISTEN":             "server.listen",
	"TOLLGATE_DATA_DIR":           "server.data_dir",
	"TOLLGATE_ADMIN_TOKEN":        "server.admin_token",
	"TOLLGATE_PUBLIC_URL":         "server.public_url",
	"TOLLGATE_DEBUG_LISTEN":       "server.debug_listen",
	"TOLLGATE_METRICS_LISTEN":     "server.metrics_listen",
	"TOLLGATE_OTLP_ENDPOINT":      "tracing.otlp_endpoint",
	"TOLLGATE_NATS_LISTEN":        "nats.embedded_listen",
	"TOLLGATE_CONSUME_IN_SERVE":   "clickhouse.consume_in_serve",
	"TOLLGATE_VECTORS":            "plugins.vectors",
	"TOLLGATE_STORAGE_BACKEND":    "storage.backend",
	"TOLLGATE_STORAGE_LISTEN":     "storage.local.listen",
	"TOLLGATE_STORAGE_PUBLIC_URL": "storage.local.public_base_url",
	"UPSTREAM_BASE_URL":           "upstreams.0.base_url",
	"UPSTREAM_API_KEY":            "upstreams.0.api_key",
	"NATS_URL":                    "nats.url",
	"CLICKHOUSE_DSN":              "clickhouse.dsn",
	"S3_ENDPOINT":                 "storage.s3.endpoint",
	"S3_REGION":                   "storage.s3.region",
	"S3_BUCKET":                   "storage.s3.bucket",
	"S3_ACCESS_KEY":               "storage.s3.access_key",
	"S3_SECRET_KEY":               "storage.s3.secret_key",
	"S3_USE_SSL":                  "storage.s3.use_ssl",
	"S3_PUBLIC_ENDPOINT":          "storage.s3.public_endpoint",
}

// secretEnv are the variables of ShippedEnv that hold a secret: the
// shipped file gives them no default, and neither does EnvDefault.
var secretEnv = map[string]bool{
	"TOLLGATE_ADMIN_TOKEN": true,
	"UPSTREAM_API_KEY":     true,
	"S3_ACCESS_KEY":        true,
	"S3_SECRET_KEY":        true,
}

// EnvDefault is the default to write in ${name:-…} for a file that does
// not read name, a variable of ShippedEnv: the value in force, so the
// day name is not set nothing changes, but never a secret of the file
// (an empty default, as the shipped file's, and a URL's password
// hidden), as it goes to a terminal and logs.
func (c *Config) EnvDefault(name string) string {
	if secretEnv[name] {
		return ""
	}
	v, _ := Setting(c, ShippedEnv[name])
	return RedactURL(v)
}

// ReadsEnv reports whether the file c was loaded from reads the variable
// name (a ${name} in it), set or not.
func (c *Config) ReadsEnv(name string) bool { return c.envRead[name] }

// UnreadEnv lists, sorted, the variables of ShippedEnv set (not empty) in environ
// (os.Environ's form) that the file c was loaded from does not read.
// A variable sets a setting only through a ${NAME} in the file, so these
// change nothing. An admin who kept an older release's file and set
// TOLLGATE_METRICS_LISTEN, as the new setting's notes name it, believed
// /metrics was off the public listener while it was still served there.
func (c *Config) UnreadEnv(environ []string) []string {
	var unread []string
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if _, shipped := ShippedEnv[name]; shipped && value != "" && !c.envRead[name] {
			unread = append(unread, name)
		}
	}
	slices.Sort(unread)
	return slices.Compact(unread)
}

// RetryBudgetShadows lists, sorted, the upstreams of a pool of two or
// more whose first_byte_timeout is not under routing.retry_budget: a
// member that does not answer in that time is never retried on another,
// the call gets a 503 beside healthy members. The shipped file of the
// release before wrote retry_budget: 10s under the default 60s timeout,
// and files based on it keep that value, which is valid but rarely meant.
func (c *Config) RetryBudgetShadows() []string {
	if c.Routing.Retries == 0 { // no call is tried on another member anyway
		return nil
	}
	var names []string
	timeouts := map[string]time.Duration{}
	for _, u := range c.Upstreams {
		timeouts[u.Name] = u.FirstByteTimeout
	}
	for _, m := range c.Models {
		pool := m.Pool()
		if len(pool) < 2 {
			continue
		}
		for _, member := range pool {
			if timeouts[member.Name] >= c.Routing.RetryBudget {
				names = append(names, member.Name)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// MetricsOnPublicListener reports whether GET /metrics, which needs no
// key and names upstreams, models and the billing backlog, is served on
// server.listen at an address other machines may reach: metrics_listen
// is empty, and listen is not on loopback (0.0.0.0, ::, no host, an IP
// outside 127.0.0.0/8 and ::1, a host name other than localhost, which
// is not looked up). The README documents it, but nothing told an
// operator who moved listen off loopback.
func (c *Config) MetricsOnPublicListener() bool {
	if c.Server.MetricsListen != "" {
		return false
	}
	host, _, err := net.SplitHostPort(c.Server.Listen)
	if err != nil {
		return false // refused at load
	}
	ip := listenIP(host)
	return !ip.IsValid() || !ip.IsLoopback()
}
