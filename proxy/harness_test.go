package proxy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// harness is one gateway in front of one proxytest upstream, with a real
// embedded NATS behind its account store (internal/gatewaytest).
type harness struct {
	t       *testing.T
	g       *gatewaytest.Gateway
	up      *proxytest.Server
	gw      *proxy.Server
	url     string // gateway base, e.g. http://127.0.0.1:1234
	rec     *meter.Memory
	svc     *accounts.Service
	broker  *broker.Broker
	store   *proxy.ResponseStore // response id -> upstream, in the broker's KV
	key     string               // generate-scoped key of account "acme" (10 USD)
	cfgPath string
	client  *http.Client
}

// gatewayYAML is the test config; %s is the upstream base URL.
const gatewayYAML = `
server:
  listen: 127.0.0.1:0
  data_dir: %[2]s
  max_request_body: 64KiB
  demo_credit_usd: "0"
billing:
  grace_usd: "0.50"
upstreams:
  - name: local
    base_url: %[1]s
    first_byte_timeout: %[3]s
    idle_timeout: %[4]s
models:
  - id: small
    upstream: local
    upstream_model: proxytest-small
    hugging_face_id: test/small
    name: Small
    input_modalities: [text]
    output_modalities: [text]
    quantization: bf16
    context_length: 1000000
    max_output_length: 8192
    pricing: {prompt: "0.0000001", completion: "0.0000003", image: "0", request: "0", input_cache_read: "0.00000005"}
    supported_features: [tools, json_mode]
  - id: large
    upstream: local
    upstream_model: proxytest-large
    hugging_face_id: test/large
    name: Large
    input_modalities: [text, image]
    output_modalities: [text]
    quantization: fp8
    context_length: 262144
    max_output_length: 65536
    pricing: {prompt: "0.0000005", completion: "0.000002", image: "0.001", request: "0.0001", input_cache_read: "0.00000025"}
    supported_features: [tools, json_mode, vision, reasoning]
`

type harnessOptions struct {
	upstream         proxytest.Options
	tracer           trace.Tracer
	firstByteTimeout string
	idleTimeout      string
	maxRequestBody   string               // default 64KiB
	logf             func(string, ...any) // default t.Logf
	// join starts the harness as another gateway of join's deployment
	// (gatewaytest.Options.Join), sharing its accounts: it creates none.
	join *harness
	// recorded is gatewaytest.Options.Recorded.
	recorded func(*meter.Event)
}

func newHarness(t *testing.T, ho harnessOptions) *harness {
	t.Helper()
	if ho.firstByteTimeout == "" {
		ho.firstByteTimeout = "5s"
	}
	if ho.idleTimeout == "" {
		ho.idleTimeout = "5s"
	}
	var join *gatewaytest.Gateway
	if ho.join != nil {
		join = ho.join.g
	}
	g := gatewaytest.Start(t, gatewaytest.Options{
		Join:     join,
		Upstream: &ho.upstream,
		Config: func(upstream, dir string) string {
			cfg := fmt.Sprintf(gatewayYAML, upstream, dir, ho.firstByteTimeout, ho.idleTimeout)
			if ho.maxRequestBody != "" {
				cfg = strings.Replace(cfg, "max_request_body: 64KiB", "max_request_body: "+ho.maxRequestBody, 1)
			}
			return cfg
		},
		Responses: true, Tracer: ho.tracer, Watch: true, Logf: ho.logf, Recorded: ho.recorded,
	})
	h := &harness{t: t, g: g, up: g.Upstream, gw: g.Server, url: g.URL, rec: g.Recorder, svc: g.Accounts, broker: g.Broker,
		store: g.Responses, cfgPath: g.ConfigPath, client: g.Client}
	if ho.join != nil {
		h.key = ho.join.key
		return h
	}
	g.CreateAccount("acme", 10*money.NanosPerUSD)
	h.key = g.CreateKey("acme", accounts.KeyRequest{Name: "test"})
	return h
}

func (h *harness) writeConfig(s string) { h.t.Helper(); h.g.WriteConfig(s) }

// post sends a JSON body with the harness key (or key, if set).
func (h *harness) post(path, body string, key ...string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequest("POST", h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	k := h.key
	if len(key) > 0 {
		k = key[0]
	}
	if k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return b
}

// wantError checks status and the OpenAI envelope's type/code.
func wantError(t *testing.T, resp *http.Response, status int, code string) map[string]any {
	t.Helper()
	body := readAll(t, resp)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, body)
	}
	var env struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil || env.Error == nil {
		t.Fatalf("body is not the error envelope: %s", body)
	}
	for _, f := range []string{"message", "type", "param", "code"} {
		if _, ok := env.Error[f]; !ok {
			t.Fatalf("envelope lacks %q: %s", f, body)
		}
	}
	if env.Error["code"] != code {
		t.Fatalf("code %v, want %s; body %s", env.Error["code"], code, body)
	}
	return env.Error
}

// sseEvents splits a stream body into events (without the blank line).
func sseEvents(body []byte) []string {
	var out []string
	for _, ev := range strings.Split(strings.TrimRight(string(body), "\n"), "\n\n") {
		if ev != "" {
			out = append(out, ev)
		}
	}
	return out
}

// errorEventType is the error type of a chat stream's error event, as
// sseEvents returns it.
func errorEventType(ev string) string {
	return gjson.Get(strings.TrimPrefix(ev, "data: "), "error.type").Str
}

var volatile = regexp.MustCompile(`"(id|item_id)":"[^"]*"|"(created|created_at)":\d+`)

// normalize blanks ids and timestamps, which differ between two calls.
func normalize(s string) string { return volatile.ReplaceAllString(s, `"$1$2":_`) }

// direct calls the upstream itself, bypassing the gateway.
func (h *harness) direct(path, body string) []byte {
	h.t.Helper()
	resp, err := http.Post(strings.TrimSuffix(h.up.URL, "/v1")+path, "application/json", strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	return readAll(h.t, resp)
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

// streamReader reads SSE events from a live response one by one.
type streamReader struct {
	br *bufio.Reader
}

func (s *streamReader) next() (string, error) {
	var ev bytes.Buffer
	for {
		line, err := s.br.ReadString('\n')
		if err != nil {
			return ev.String(), err
		}
		if line == "\n" {
			if ev.Len() == 0 {
				continue
			}
			return strings.TrimRight(ev.String(), "\n"), nil
		}
		ev.WriteString(line)
	}
}

func readFileBytes(p string) ([]byte, error) { return os.ReadFile(p) }

// keyID is the id of the harness key.
func (h *harness) keyID(t *testing.T) string {
	t.Helper()
	key, err := h.svc.Verify([]byte(h.key))
	if err != nil {
		t.Fatal(err)
	}
	return key.ID
}
