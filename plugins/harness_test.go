package plugins_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/plugins"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// harness is one gateway (with the plugins) in front of one upstream, with
// a real embedded NATS behind its account store (internal/gatewaytest).
type harness struct {
	t      *testing.T
	g      *gatewaytest.Gateway
	up     *proxytest.Server
	url    string // gateway base, e.g. http://127.0.0.1:1234
	rec    *meter.Memory
	svc    *accounts.Service
	key    string // key of account "acme" (10 USD), every scope
	opts   harnessOptions
	client *http.Client
	ctx    context.Context
}

// gatewayYAML is the test config: %[1]s upstream base URL, %[2]s data dir,
// %[3]s trusted proxies, %[4]s the plugins section, %[5]s the classifiers
// section, %[6]s more top-level sections.
const gatewayYAML = `
server:
  listen: 127.0.0.1:0
  data_dir: %[2]s
  demo_credit_usd: "0"
  trusted_proxies: [%[3]s]
billing:
  grace_usd: "0.50"
upstreams:
  - name: local
    base_url: %[1]s
    first_byte_timeout: 5s
models:
  - id: small
    upstream: local
    upstream_model: proxytest-small
    context_length: 1000000
    max_output_length: 8192
    pricing: {prompt: "0.0000001", completion: "0.0000003", input_cache_read: "0.00000005"}
  - id: large
    upstream: local
    upstream_model: proxytest-large
    context_length: 262144
    max_output_length: 65536
plugins:
%[4]s
classifiers:
%[5]s
%[6]s
`

const defaultClassifiers = `
  support-intent:
    labels: [billing, bug, account]
    descriptions:
      billing: Charges and refunds
    examples:
      bug: ["The export button does nothing"]
    text_type: support ticket
`

type harnessOptions struct {
	upstream proxytest.Options
	// plugins is the body of the plugins section, indented two spaces;
	// default: engine lexical, so tests that do not test engine choice
	// never depend on the upstream.
	plugins        string
	classifiers    string
	trustedProxies string // e.g. "127.0.0.1"
	// extra is more top-level sections (storage, batch).
	extra string
	// batch, when set, opens batch jobs on the gateway's NATS.
	batch func(g *gatewaytest.Gateway, rt batch.Runtime) (*batch.Service, error)
	// deadFirstMember, when set, is the base_url of an upstream that
	// refuses connections, made the first member of model small's pool.
	deadFirstMember string
	// deadModel, when set, is the base_url of an upstream that refuses
	// connections, upstream "gone" of model deadmodel alone.
	deadModel string
	// preloadVectors is plugins.Options.PreloadVectors, as tollgate serve
	// sets it.
	preloadVectors bool
	// logf receives the gateway's log; default t.Logf.
	logf func(format string, args ...any)
	// baseURLQuery, such as "?api-version=1", is written after the
	// upstream's base_url.
	baseURLQuery string
	// tracer, when set, traces the gateway's calls.
	tracer trace.Tracer
}

func newHarness(t *testing.T, ho harnessOptions) *harness {
	t.Helper()
	if ho.plugins == "" {
		ho.plugins = "  engine: lexical"
	}
	if ho.classifiers == "" {
		ho.classifiers = defaultClassifiers
	}
	// The llm engine's prompts get the answers a model would give, from
	// the lexical engine's view, as the demo upstream gives them.
	ho.upstream.Reply = classifiers.NewViewModel(classifiers.NewLexical()).Reply
	h := &harness{t: t, opts: ho}
	h.g = gatewaytest.Start(t, gatewaytest.Options{
		Upstream: &ho.upstream,
		Config:   ho.yaml,
		Modules: func(g *gatewaytest.Gateway) []proxy.Module {
			opts := plugins.Options{PreloadVectors: ho.preloadVectors}
			if ho.batch != nil {
				opts.Batch = &plugins.Batch{Open: func(_ context.Context, rt batch.Runtime) (*batch.Service, error) {
					return ho.batch(g, rt)
				}}
			}
			return []proxy.Module{plugins.Module(opts)}
		},
		Watch:  true,
		Logf:   ho.logf,
		Tracer: ho.tracer,
	})
	g := h.g
	h.up, h.url, h.rec, h.svc, h.ctx, h.client = g.Upstream, g.URL, g.Recorder, g.Accounts, g.Ctx, g.Client
	g.CreateAccount("acme", 10*money.NanosPerUSD)
	h.key = h.newKey("acme", accounts.KeyRequest{Name: "test"})
	return h
}

// newKey creates a key and waits until the gateway's snapshot knows it.
func (h *harness) newKey(account string, req accounts.KeyRequest) string {
	h.t.Helper()
	return h.g.CreateKey(account, req)
}

// writeConfig writes the config file atomically, as editors do.
func (h *harness) writeConfig(ho harnessOptions) {
	h.t.Helper()
	h.g.WriteConfig(ho.yaml(h.up.URL, h.g.Dir))
}

// yaml is the gateway.yaml of these options.
func (ho harnessOptions) yaml(upstream, dir string) string {
	if ho.baseURLQuery != "" {
		upstream = `"` + upstream + ho.baseURLQuery + `"`
	}
	y := fmt.Sprintf(gatewayYAML, upstream, dir, ho.trustedProxies, ho.plugins, ho.classifiers, ho.extra)
	if ho.deadFirstMember != "" {
		// Model small is served by a pool whose first member refuses
		// connections.
		single := "models:\n  - id: small\n    upstream: local\n"
		if !strings.Contains(y, single) {
			// Else the test would run without the dead member and pass.
			panic("gatewayYAML no longer serves model small from local alone")
		}
		y = strings.Replace(y, single,
			"  - name: dead\n    base_url: "+ho.deadFirstMember+"\n    first_byte_timeout: 5s\nmodels:\n  - id: small\n    upstreams: [dead, local]\n", 1)
	}
	if ho.deadModel != "" {
		y = strings.Replace(y, "\nmodels:\n",
			"\n  - name: gone\n    base_url: "+ho.deadModel+"\n    first_byte_timeout: 5s\nmodels:\n  - id: deadmodel\n    upstream: gone\n    context_length: 8192\n    max_output_length: 1024\n", 1)
	}
	return y
}

// request is one call to the gateway.
type request struct {
	path, body string
	key        string // "" sends no Authorization header
	xff        string // X-Forwarded-For, when set
	header     http.Header
}

// reply is a finished response.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) String() string { return fmt.Sprintf("%d %s", r.status, r.body) }

func (h *harness) do(r request) reply {
	h.t.Helper()
	req, err := http.NewRequest("POST", h.url+r.path, strings.NewReader(r.body))
	if err != nil {
		h.t.Fatal(err)
	}
	if r.key != "" {
		req.Header.Set("Authorization", "Bearer "+r.key)
	}
	if r.xff != "" {
		req.Header.Set("X-Forwarded-For", r.xff)
	}
	for name, values := range r.header {
		req.Header[name] = values
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("reading body: %v", err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: body}
}

// keyed calls path with the harness key.
func (h *harness) keyed(path, body string) reply {
	h.t.Helper()
	return h.do(request{path: path, body: body, key: h.key})
}

// ok decodes a 200 answer.
func (r reply) ok(t *testing.T) map[string]any {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("status %d, want 200; body %s", r.status, r.body)
	}
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("answer is not a JSON object: %s", r.body)
	}
	return m
}

// apiError checks status and the OpenAI envelope, returning its body.
func (r reply) apiError(t *testing.T, status int, code string) map[string]any {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d; body %s", r.status, status, r.body)
	}
	var env struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(r.body, &env); err != nil || env.Error == nil {
		t.Fatalf("body is not the error envelope: %s", r.body)
	}
	for _, f := range []string{"message", "type", "param", "code"} {
		if _, ok := env.Error[f]; !ok {
			t.Fatalf("envelope lacks %q: %s", f, r.body)
		}
	}
	if env.Error["code"] != code {
		t.Fatalf("code %v, want %s; body %s", env.Error["code"], code, r.body)
	}
	return env.Error
}

// events waits for n recorded events and returns them.
func (h *harness) events(n int) []*meter.Event {
	h.t.Helper()
	var evs []*meter.Event
	checkFor(h.t, 5*time.Second, 10*time.Millisecond, func() error {
		evs = h.rec.Events()
		if len(evs) != n {
			return fmt.Errorf("%d events recorded, want %d", len(evs), n)
		}
		return nil
	})
	return evs
}

// checkFor polls fn until it returns nil or total passes.
var checkFor = testutil.CheckFor
