package proxy

import (
	"errors"
	"testing"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/meter"
)

const failingStartYAML = `
server:
  listen: 127.0.0.1:0
  data_dir: /nonexistent
upstreams:
  - name: local
    base_url: http://127.0.0.1:1/v1
models:
  - id: small
    upstream: local
    upstream_model: proxytest-small
    context_length: 32768
    max_output_length: 4096
`

// A server that fails to start leaves no upstream pool behind: its World
// is never served, so its pools are retired (no new calls, no idle
// connections kept) rather than leaked with the server that was never
// returned.
func TestNewRetiresPoolsWhenAModuleFails(t *testing.T) {
	cfg, err := config.Parse("gateway.yaml", []byte(failingStartYAML))
	if err != nil {
		t.Fatal(err)
	}
	for _, stage := range []string{"start", "provision"} {
		var seen *World
		m := Module{ID: "failing"}
		if stage == "start" {
			m.Start = func(h Host) (func(), error) {
				seen = h.World()
				return nil, errors.New("refusing to start")
			}
		} else {
			m.New = func(h Host, w *World) (Provisioned, error) {
				seen = w
				return Provisioned{}, errors.New("refusing to provision")
			}
		}
		if _, err := New(cfg, Options{Recorder: meter.NewMemory(nil), Modules: []Module{m}}); err == nil {
			t.Fatalf("%s: New succeeded with a failing module", stage)
		}
		if seen == nil || len(seen.upstreams) == 0 {
			t.Fatalf("%s: the module never saw a World with upstreams", stage)
		}
		for name, up := range seen.upstreams {
			if !up.retired.Load() {
				t.Errorf("%s: upstream %s of the failed server is not retired", stage, name)
			}
		}
	}
}
