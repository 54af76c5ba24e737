package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// make run reads the data_dir the gateway will use, from the same file
// and environment, to pick its ClickHouse.
func TestSetting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	yaml := "server:\n  data_dir: ${SETTING_TEST_DIR:-./data}\n  listen: 127.0.0.1:9999\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SETTING_TEST_DIR", "/srv/run2")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	for setting, want := range map[string]string{
		"server.data_dir":         "/srv/run2",
		"server.listen":           "127.0.0.1:9999",
		"server.shutdown_timeout": DefaultShutdownTimeout.String(),
	} {
		if got, err := Setting(cfg, setting); err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", setting, got, err, want)
		}
	}
	for setting, wantErr := range map[string]string{
		"server.nope":          "no setting server.nope: server holds ",
		"nope":                 "no setting nope: the file holds ",
		"server":               "server is a section: name one of its settings, listen, ",
		"upstreams":            "upstreams is a list of 1: name an item by its index, 0 to 0, such as upstreams.0",
		"server.data_dir.more": "server.data_dir is a single value: it has no more",
	} {
		if _, err := Setting(cfg, setting); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: got %v, want %q", setting, err, wantErr)
		}
	}
}

// TestSettingInListsAndMaps: "config get models.0.id" and
// "classifiers.support-intent.mode" said "models is a single value: it has
// no 0"; a list item is named by its index, a map entry by its key.
func TestSettingInListsAndMaps(t *testing.T) {
	cfg, err := parse("gateway.yaml", []byte(`
upstreams:
  - name: a
    base_url: http://127.0.0.1:8000/v1
  - name: b
    base_url: http://127.0.0.1:8001/v1
models:
  - id: small
    upstream: a
    context_length: 100
    max_output_length: 10
    pricing: {prompt: "0.00000010", completion: "0.00000020"}
  - id: big
    upstream: b
    context_length: 1000
    max_output_length: 100
classifiers:
  support-intent:
    labels: [billing, bug]
    mode: single
  v1.5:
    labels: [yes, no]
`), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	for setting, want := range map[string]string{
		"models.0.id":                         "small",
		"models[1].id":                        "big",
		"models.0.pricing.prompt":             "0.00000010",
		"upstreams.1.base_url":                "http://127.0.0.1:8001/v1",
		"classifiers.support-intent.mode":     "single",
		"classifiers.support-intent.labels.1": "bug",
		"classifiers.v1.5.labels.0":           "yes",
		"classifiers.v1.5.labels":             "yes\nno",
		"models.0.supported_features":         "", // an empty list of plain values
	} {
		if got, err := Setting(cfg, setting); err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", setting, got, err, want)
		}
	}
	for setting, wantErr := range map[string]string{
		"models":                "models is a list of 2: name an item by its index, 0 to 1, such as models.0",
		"models.2.id":           "no setting models.2: models is a list of 2",
		"models.first.id":       "no setting models.first: models is a list of 2",
		"models.0":              "models.0 is a section: name one of its settings, id, ",
		"models.0.nope":         "no setting models.0.nope: models.0 holds id, ",
		"models.0.id.more":      "models.0.id is a single value: it has no more",
		"classifiers":           "classifiers is a map: name one of its keys, support-intent, v1.5",
		"classifiers.nope.mode": "no setting classifiers.nope: classifiers is a map: name one of its keys, support-intent, v1.5",
	} {
		if _, err := Setting(cfg, setting); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: got %v, want %q", setting, err, wantErr)
		}
	}
}

// config get printed durations in Go's form (8760h0m0s, 1m0s), not as the
// file writes them, and refused a list of plain values as if its items
// were sections: "models.0.input_modalities is a list of 1: name an item".
func TestSettingPrintsDurationsAndListsAsWritten(t *testing.T) {
	cfg, err := parse("gateway.yaml", []byte("server:\n  trusted_proxies: [10.0.0.0/8, 192.168.1.1]\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n    connect_timeout: 1500ms\nmodels:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n    input_modalities: [text, image]\nrouting:\n  retry_budget: 1m\n  eject_max: 90m\n"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	for setting, want := range map[string]string{
		"server.hsts_max_age":          "8760h",
		"routing.retry_budget":         "1m",
		"routing.eject_max":            "1h30m",
		"routing.response_ttl":         "720h",
		"upstreams.0.response_timeout": "9m30s",
		"upstreams.0.connect_timeout":  "1.5s",
		"billing.fsync_interval":       "100ms",
		"models.0.input_modalities":    "text\nimage",
		"server.trusted_proxies":       "10.0.0.0/8\n192.168.1.1",
		"models.0.output_modalities":   "",
	} {
		if got, err := Setting(cfg, setting); err != nil || got != want {
			t.Errorf("%s: got %q, %v; want %q", setting, got, err, want)
		}
	}
	if _, err := Setting(cfg, "models"); err == nil || !strings.Contains(err.Error(), "models is a list of 1: name an item by its index") {
		t.Errorf("models: %v, want the list of sections refused", err)
	}
}
