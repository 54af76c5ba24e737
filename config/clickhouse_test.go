package config

import (
	"errors"
	"strings"
	"testing"
)

// TestParseClickHouseDSN: config check and billing refuse by this one rule;
// http:// and https:// DSNs once passed the check and billing refused them.
func TestParseClickHouseDSN(t *testing.T) {
	for _, dsn := range []string{
		"clickhouse://127.0.0.1:9000/default",
		"tcp://user:pass@ch:9000/billing?dial_timeout=2s",
		"clickhouse://ch:9440/default?secure=true",
		"clickhouse://ch:9000/default?compress=lz4&debug=false&connection_open_strategy=random",
		"clickhouse://ch:9000/default?compress=true&max_execution_time=60",
	} {
		if _, err := ParseClickHouseDSN(dsn); err != nil {
			t.Errorf("%s: %v", dsn, err)
		}
	}
	for _, dsn := range []string{
		"http://127.0.0.1:8123/default",
		"https://ch:8443/default?secure=true",
	} {
		if _, err := ParseClickHouseDSN(dsn); !errors.Is(err, ErrClickHouseNotNative) {
			t.Errorf("%s: got %v, want ErrClickHouseNotNative", dsn, err)
		}
	}
	for _, dsn := range []string{
		"mysql://db:3306/x",
		"clickhouse:///default",
		"clickhouse://ch:9000/default?dial_timeout=soon",
		// Options of the driver it would take silently, or refuse only
		// when billing connects.
		"clickhouse://ch:9000/default?debug=maybe",
		"clickhouse://ch:9000/default?compress=yes",
		"clickhouse://ch:9000/default?compress=gzip",
		"clickhouse://ch:9000/default?connection_open_strategy=fastest",
	} {
		if _, err := ParseClickHouseDSN(dsn); err == nil {
			t.Errorf("%s accepted", dsn)
		}
	}
}

// A space in clickhouse.dsn passed config check: the space was looked for
// in the redacted DSN, which writes it as %20, and billing then failed on
// every connect ("Database default  doesn't exist").
func TestClickHouseDSNWithASpaceIsRefused(t *testing.T) {
	input := "server:\n  listen: 127.0.0.1:8080\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\nclickhouse:\n  dsn: ${CLICKHOUSE_DSN:-}\n"
	for value, want := range map[string]string{
		"clickhouse://127.0.0.1:30830/default ":         "starts or ends with whitespace",
		"clickhouse://h:9000/de fault":                  `"clickhouse://h:9000/de fault" contains a space at byte 23`,
		"clickhouse://user:s3cret@h:9000/de fault":      `"clickhouse://user:xxxxx@h:9000/de fault" contains a space at byte 35`,
		"clickhouse://h:9000/default?dial_timeout=1s\t": "starts or ends with whitespace",
	} {
		env := func(string) (string, bool) { return value, true }
		_, err := parse("gateway.yaml", []byte(input), env)
		if err == nil || !strings.Contains(err.Error(), "clickhouse.dsn") || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", value, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: the message shows the password: %v", value, err)
		}
	}
}
