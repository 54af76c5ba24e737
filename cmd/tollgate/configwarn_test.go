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
	for _, line := range configWarnings(shipped) {
		if strings.Contains(line, "metrics_listen") {
			t.Errorf("the shipped gateway.yaml's defaults warn: %s", line)
		}
	}
}
