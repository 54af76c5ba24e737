package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/config"
)

// stderrOf runs f and returns what it wrote to os.Stderr.
func stderrOf(t *testing.T, f func() error) (string, error) {
	t.Helper()
	return outputOf(t, &os.Stderr, f)
}

// /metrics needs no key, and with server.metrics_listen empty it is
// served on server.listen: documented, but an operator who moved listen
// off loopback was told nothing. config check (and serve, from the same
// lines) warns, and says what to set; not on the shipped defaults.
func TestConfigCheckWarnsOfMetricsOnAListenerOffLoopback(t *testing.T) {
	for name := range config.ShippedEnv {
		t.Setenv(name, "")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	const body = "upstreams:\n  - name: default\n    base_url: http://127.0.0.1:8000/v1\nmodels:\n  - id: m\n    context_length: 10\n    max_output_length: 5\n"
	const warning = "server.listen (0.0.0.0:8080) is not a loopback address and server.metrics_listen is empty"
	for _, tc := range []struct {
		server string
		warns  bool
	}{
		{"  listen: 0.0.0.0:8080\n", true},
		{"  listen: 0.0.0.0:8080\n  metrics_listen: 127.0.0.1:9090\n", false},
		{"  listen: 127.0.0.1:8080\n", false},
	} {
		if err := os.WriteFile(path, []byte("server:\n  data_dir: "+dir+"\n  admin_token: a-token-of-enough-bytes\n"+tc.server+body), 0o600); err != nil {
			t.Fatal(err)
		}
		stderr, err := stderrOf(t, func() error {
			_, err := stdoutOf(t, func() error { return runConfig([]string{"check", path}) })
			return err
		})
		if err != nil {
			t.Fatalf("%q: %v", tc.server, err)
		}
		if warned := strings.Contains(stderr, "warning: "+warning) && strings.Contains(stderr, "Set server.metrics_listen"); warned != tc.warns {
			t.Errorf("%q: config check said %q; want the warning: %v", tc.server, stderr, tc.warns)
		}
	}
	shipped, err := config.Load("../../gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range shipped.Warnings(os.Environ()) {
		if strings.Contains(line, "metrics_listen") {
			t.Errorf("the shipped gateway.yaml's defaults warn: %s", line)
		}
	}
}

// The shipped gateway.yaml reads CLICKHOUSE_DSN, UPSTREAM_BASE_URL and
// more besides the TOLLGATE_ ones, and config check warned only of those:
// CLICKHOUSE_DSN set for a file of the admin's own that does not read it
// said ok, and the file's ClickHouse was used. The warning suggests the
// value in force as the default, never a secret of the file.
func TestConfigCheckWarnsOfEveryShippedVariableTheFileDoesNotRead(t *testing.T) {
	for name := range config.ShippedEnv {
		t.Setenv(name, "")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "own.yaml")
	const file = "server:\n  data_dir: %s\n  admin_token: a-token-of-enough-bytes\n" +
		"upstreams:\n  - name: default\n    base_url: http://127.0.0.1:8000/v1\n    api_key: sk-of-the-file\n" +
		"models:\n  - id: m\n    context_length: 10\n    max_output_length: 5\n" +
		"clickhouse:\n  dsn: clickhouse://billing:password-of-the-file@127.0.0.1:9000/default\n"
	if err := os.WriteFile(path, []byte(strings.Replace(file, "%s", dir, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CLICKHOUSE_DSN", "clickhouse://127.0.0.1:9000/other")
	t.Setenv("UPSTREAM_API_KEY", "sk-of-the-environment")
	stderr, err := stderrOf(t, func() error {
		_, err := stdoutOf(t, func() error { return runConfig([]string{"check", path}) })
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"warning: CLICKHOUSE_DSN is set, but " + path + " does not read it: it sets nothing. A variable sets clickhouse.dsn only through the file: write dsn: ${CLICKHOUSE_DSN:-clickhouse://billing:xxxxx@127.0.0.1:9000/default} under clickhouse",
		"warning: UPSTREAM_API_KEY is set, but " + path + " does not read it: it sets nothing. A variable sets upstreams.0.api_key only through the file: write api_key: ${UPSTREAM_API_KEY:-} under upstreams.0",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("config check did not say %q; it said:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "of-the-file") {
		t.Errorf("config check showed a secret of the file:\n%s", stderr)
	}
}
