package config

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// Warnings says, a line each, what in c is valid but most likely not
// meant: a ${VAR} without a default whose variable is not set (it
// reads as empty), variables of the shipped gateway.yaml set in environ
// (os.Environ's form) while c's file does not read them (they set
// nothing there), a retry budget that pool members' first-byte timeouts
// outlast, and /metrics served, with no key, on a listen address off
// loopback. serve logs them at start and config check prints them; a
// reload logs those it brings in.
func (c *Config) Warnings(environ []string) []string {
	lines := slices.Clone(c.unsetEnv)
	for _, name := range c.UnreadEnv(environ) {
		if name == "TOLLGATE_ADMIN_TOKEN" {
			// The admin CLI reads it itself, as its token, and the
			// first start tells everyone to export it: not a mistake.
			continue
		}
		setting := ShippedEnv[name]
		section, leaf := setting, setting
		if i := strings.LastIndexByte(setting, '.'); i >= 0 {
			section, leaf = setting[:i], setting[i+1:]
		}
		// The value in force as the default: ${NAME:-} alone would have
		// a data_dir fall back to ./data, a new signing key and an empty
		// store, the day the variable is not set.
		current := c.EnvDefault(name)
		lines = append(lines, fmt.Sprintf("warning: %s is set, but %s does not read it: it sets nothing. A variable sets %s only through the file: write %s: ${%s:-%s} under %s, as the gateway.yaml of this release does",
			name, c.Path, setting, leaf, name, current, section))
	}
	if shadowed := c.RetryBudgetShadows(); len(shadowed) > 0 {
		members := "pool member " + shadowed[0]
		if len(shadowed) > 1 {
			members = "pool members " + strings.Join(shadowed, ", ")
		}
		lines = append(lines, fmt.Sprintf("warning: routing.retry_budget (%s) is not above the first_byte_timeout of %s: a call that gets no first byte within that timeout is never tried on another member, it gets a 503. Raise retry_budget (the default is %s) or lower first_byte_timeout",
			c.Routing.RetryBudget, members, DefaultRetryBudget))
	}
	if u, err := url.Parse(c.Tracing.OTLPEndpoint); err == nil && u.RawQuery != "" {
		// The OTLP exporter keeps the URL's host and path only: a
		// collector that authenticates by a query token refused every
		// export, and the token was in the log besides.
		lines = append(lines, fmt.Sprintf("warning: tracing.otlp_endpoint (%s) has a query, which the OTLP exporter never sends: spans go to the URL without it. Give a collector's credentials in OTEL_EXPORTER_OTLP_HEADERS (such as Authorization=Bearer%%20<token>) instead",
			RedactURL(c.Tracing.OTLPEndpoint)))
	}
	if c.MetricsOnPublicListener() {
		lines = append(lines, fmt.Sprintf("warning: server.listen (%s) is not a loopback address and server.metrics_listen is empty: GET /metrics is served there to anyone who reaches it, with no key, and names upstreams, models and the billing backlog. Set server.metrics_listen (TOLLGATE_METRICS_LISTEN in the shipped gateway.yaml) to a private host:port, such as 127.0.0.1:9090, and scrape it there; the public listener then answers /metrics with a 404",
			c.Server.Listen))
	}
	return lines
}
