package config

import (
	"errors"
	"testing"
)

// TestParseClickHouseDSN: config check and billing refuse by this one rule;
// http:// and https:// DSNs once passed the check and billing refused them.
func TestParseClickHouseDSN(t *testing.T) {
	for _, dsn := range []string{
		"clickhouse://127.0.0.1:9000/default",
		"tcp://user:pass@ch:9000/billing?dial_timeout=2s",
		"clickhouse://ch:9440/default?secure=true",
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
	} {
		if _, err := ParseClickHouseDSN(dsn); err == nil {
			t.Errorf("%s accepted", dsn)
		}
	}
}
