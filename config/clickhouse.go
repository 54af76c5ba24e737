package config

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// ErrClickHouseNotNative is returned for a DSN of ClickHouse's HTTP
// interface (http://, https://). Fix: use clickhouse://host:9000/db, the
// native protocol; the driver's HTTP protocol does not work with
// ClickHouse 18.16.
var ErrClickHouseNotNative = errors.New("clickhouse dsn must use the native protocol (clickhouse://host:9000/db), not the HTTP port 8123")

// ParseClickHouseDSN parses a clickhouse.dsn into the driver's options,
// refusing what billing cannot connect with. Billing connects with what it
// returns and config check runs it, so a DSN the check passes is one
// billing takes (an http:// DSN once passed the check, and serve then ran
// with billing retrying forever).
func ParseClickHouseDSN(dsn string) (*clickhouse.Options, error) {
	// The driver takes any scheme but http and https for the native
	// protocol; a misspelt one is more likely a mistake than a choice.
	if u, err := url.Parse(dsn); err == nil {
		switch u.Scheme {
		case "http", "https":
			return nil, ErrClickHouseNotNative
		case "clickhouse", "tcp":
		default:
			return nil, errClickHouseScheme
		}
	}
	opts, err := clickhouse.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if opts.Protocol != clickhouse.Native {
		return nil, ErrClickHouseNotNative
	}
	if err := checkDriverOptions(dsn); err != nil {
		return nil, err
	}
	return opts, nil
}

// Values of the driver's own options that it takes without a word when
// they are wrong: debug=maybe is no debugging, compress=yes no
// compression; compress=gzip is refused only at the first connection
// (the native protocol has no gzip).
var (
	nativeCompressions = []string{"lz4", "lz4hc", "zstd", "none"}
	openStrategies     = []string{"in_order", "round_robin", "random"}
)

// checkDriverOptions refuses a wrong value of an option clickhouse-go
// reads itself but does not check. The driver checks the rest
// (secure, skip_verify, dial_timeout, …) in ParseDSN. Any other option
// is a ClickHouse setting, sent to the server with each query: only the
// server knows its settings, so billing reports one it refuses when it
// connects (billing.DSNSettingsError).
func checkDriverOptions(dsn string) error {
	u, err := url.Parse(dsn)
	if err != nil {
		return err
	}
	for key, values := range u.Query() {
		v := values[0]
		_, boolErr := strconv.ParseBool(v)
		switch {
		case key == "debug" && boolErr != nil:
			return fmt.Errorf("debug=%s: want true or false", v)
		case key == "compress" && boolErr != nil && !slices.Contains(nativeCompressions, v):
			return fmt.Errorf("compress=%s: want true, false or a method of the native protocol (%s)", v, strings.Join(nativeCompressions, ", "))
		case key == "connection_open_strategy" && !slices.Contains(openStrategies, v):
			return fmt.Errorf("connection_open_strategy=%s: want one of %s", v, strings.Join(openStrategies, ", "))
		}
	}
	return nil
}

var errClickHouseScheme = errors.New("the scheme must be clickhouse:// or tcp://")

func (l *loader) checkClickHouseDSN(v, path string) {
	const example = "clickhouse://user:password@127.0.0.1:9000/default"
	shown := v
	if _, err := url.Parse(v); err == nil {
		shown = RedactURL(v)
	} else if at := strings.LastIndex(v, "@"); at > strings.Index(v, "://") && strings.Contains(v, "://") {
		// Unparsable, and the error is logged: hide the user and password.
		shown = v[:strings.Index(v, "://")+3] + "xxxxx" + v[at:]
	}
	if !l.checkURLBlanksShown(v, shown, path) {
		return
	}
	_, err := ParseClickHouseDSN(v)
	switch {
	case errors.Is(err, ErrClickHouseNotNative):
		l.check(false, path, "%q: ClickHouse's HTTP interface is not supported: use the native protocol, port 9000, not the HTTP port 8123 (%s; secure: port 9440 with ?secure=true)", shown, example)
	case err != nil:
		l.check(false, path, "%q: %v; want a DSN such as %s", shown, err, example)
	}
}

// RedactURL hides the credentials of a URL, or of a comma-separated list
// of them (nats.url), leaving the rest as written (url.URL.Redacted
// writes a space as %20, and a message about the space then showed
// none): a password in the user info ("user:xxxxx@"), user info that is
// a token alone ("xxxxx@"), and the value of a query parameter that
// holds a secret (ClickHouse's "?password=", a "token="). It is for
// whatever prints a URL a setting holds: a warning, a log line, an error.
func RedactURL(v string) string {
	if !strings.Contains(v, ",") {
		return redactOneURL(v)
	}
	parts := strings.Split(v, ",")
	for i, p := range parts {
		parts[i] = redactOneURL(p)
	}
	return strings.Join(parts, ",")
}

// userInfoEnd is the index of the "@" that ends rest's user info, or -1
// for none. A password may hold an unescaped "/" (url.Parse refuses it,
// people write it): user:pa/ss@host showed pa/ss whole, the "@" after
// the first "/" read as the path's. So an "@" past a "/" still ends the
// user info when a ":" before that "/" starts a password, not a port
// (host:8080/path@x is a path's "@").
func userInfoEnd(rest string) int {
	end := len(rest)
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		end = i
	}
	at := strings.LastIndex(rest[:end], "@")
	slash := strings.Index(rest[:end], "/")
	if at < 0 || slash < 0 || at < slash {
		return at
	}
	colon := strings.Index(rest[:slash], ":")
	if colon < 0 || strings.Trim(rest[colon+1:slash], "0123456789") == "" {
		return strings.LastIndex(rest[:slash], "@")
	}
	return at
}

// secretParams are the query parameters whose values RedactURL hides.
var secretParams = map[string]bool{"password": true, "passwd": true, "pass": true, "pwd": true, "secret": true,
	"token": true, "access_token": true, "auth": true, "key": true, "api_key": true, "api-key": true, "apikey": true,
	"access_key": true, "secret_key": true, "sig": true, "signature": true}

func redactOneURL(v string) string {
	start := 0
	if i := strings.Index(v, "//"); i >= 0 {
		start = i + 2 // with its scheme or without (-url //host)
	}
	if at := userInfoEnd(v[start:]); at >= 0 {
		info := v[start : start+at]
		hidden := "xxxxx"
		if colon := strings.Index(info, ":"); colon >= 0 {
			hidden = info[:colon+1] + "xxxxx"
		}
		v = v[:start] + hidden + v[start+at:]
	}
	q := strings.Index(v, "?")
	if q < 0 || strings.Contains(v[:q], "#") {
		return v
	}
	query, frag := v[q+1:], ""
	if h := strings.Index(query, "#"); h >= 0 {
		query, frag = query[:h], query[h:]
	}
	pairs := strings.Split(query, "&")
	for i, pair := range pairs {
		if k, _, ok := strings.Cut(pair, "="); ok && secretParams[strings.ToLower(k)] {
			pairs[i] = k + "=xxxxx"
		}
	}
	return v[:q+1] + strings.Join(pairs, "&") + frag
}
