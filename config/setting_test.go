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
		"server":               "server is not a single value",
		"upstreams":            "upstreams is not a single value",
		"server.data_dir.more": "server.data_dir is a single value: it has no more",
	} {
		if _, err := Setting(cfg, setting); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: got %v, want %q", setting, err, wantErr)
		}
	}
}
