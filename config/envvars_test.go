package config

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// ShippedEnv is the shipped gateway.yaml's: the variables it reads and the
// setting each one sets.
func TestShippedEnvIsWhatTheShippedFileReads(t *testing.T) {
	data, err := os.ReadFile("../gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := parse("gateway.yaml", data, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	// Every one, not only the TOLLGATE_ ones: CLICKHOUSE_DSN set for a
	// file of the admin's own that does not read it was not warned of,
	// and the file's ClickHouse was used without a word.
	var read []string
	for name := range cfg.envRead {
		read = append(read, name)
	}
	var shipped []string
	for name := range ShippedEnv {
		shipped = append(shipped, name)
	}
	slices.Sort(read)
	slices.Sort(shipped)
	if !slices.Equal(read, shipped) {
		t.Errorf("gateway.yaml reads %v, ShippedEnv lists %v", read, shipped)
	}
	for name, setting := range ShippedEnv {
		marker := "${" + name + ":-"
		line := ""
		for l := range strings.Lines(string(data)) {
			if strings.Contains(l, marker) && !strings.HasPrefix(strings.TrimSpace(l), "#") {
				line = l
			}
		}
		leaf := setting[strings.LastIndexByte(setting, '.')+1:]
		if !strings.HasPrefix(strings.TrimSpace(line), leaf+":") {
			t.Errorf("%s: ShippedEnv says it sets %s, the file reads it in %q", name, setting, line)
		}
		if _, err := Setting(cfg, setting); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A variable set while the file does not read it sets nothing: an older
// release's file has no ${TOLLGATE_METRICS_LISTEN}, and /metrics stayed
// on the public listener without a word.
func TestUnreadEnvNamesShippedVariablesTheFileDoesNotRead(t *testing.T) {
	cfg, err := parse("gateway.yaml", []byte("server:\n  listen: ${TOLLGATE_LISTEN:-127.0.0.1:8080}\nupstreams:\n  - name: default\n    base_url: https://api.example.com/v1\nmodels: []\n"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	environ := []string{"TOLLGATE_METRICS_LISTEN=127.0.0.1:9", "TOLLGATE_LISTEN=127.0.0.1:1", "PATH=/bin",
		"TOLLGATE_MADE_UP=1", "TOLLGATE_OTLP_ENDPOINT=", "TOLLGATE_DEBUG_LISTEN=127.0.0.1:2"}
	got := cfg.UnreadEnv(environ)
	want := []string{"TOLLGATE_DEBUG_LISTEN", "TOLLGATE_METRICS_LISTEN"} // set empty is as unset
	if !slices.Equal(got, want) {
		t.Errorf("UnreadEnv = %v, want %v", got, want)
	}
}

// A pool member whose first_byte_timeout outlasts retry_budget is never
// retried on another member when it does not answer: the release
// before's shipped file wrote retry_budget: 10s under the default 60s.
func TestRetryBudgetShadowsNamesPoolMembersThatOutlastIt(t *testing.T) {
	const file = `
routing:
  retry_budget: %s
upstreams:
  - name: a
    base_url: http://127.0.0.1:1/v1
  - name: b
    base_url: http://127.0.0.1:2/v1
    first_byte_timeout: 5s
  - name: alone
    base_url: http://127.0.0.1:3/v1
models:
  - id: pooled
    upstreams: [a, b]
    context_length: 1000
    max_output_length: 100
    pricing: {prompt: "0.000001", completion: "0.000001"}
  - id: single
    upstream: alone
    context_length: 1000
    max_output_length: 100
    pricing: {prompt: "0.000001", completion: "0.000001"}
`
	for budget, want := range map[string][]string{
		"10s":               {"a"},      // under a's default 60s
		"5s":                {"a", "b"}, // b's 5s as well: not above it
		"2m":                nil,
		"10s\n  retries: 0": nil, // nothing is retried on another member
	} {
		cfg, err := parse("gateway.yaml", []byte(fmt.Sprintf(file, budget)), noEnv)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.RetryBudgetShadows(); !slices.Equal(got, want) {
			t.Errorf("retry_budget %s: %v, want %v (alone serves no pool)", budget, got, want)
		}
	}
}

// /metrics needs no key; with metrics_listen empty it is served on
// listen, which the README says, but an operator who moved listen off
// loopback was told nothing. Not on the shipped file's defaults.
func TestMetricsOnPublicListenerWhenListenIsOffLoopback(t *testing.T) {
	data, err := os.ReadFile("../gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := parse("gateway.yaml", data, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if shipped.MetricsOnPublicListener() {
		t.Errorf("the shipped defaults (listen %s) warn", shipped.Server.Listen)
	}
	const file = "server:\n  listen: %q\n  metrics_listen: %q\nupstreams:\n  - name: default\n    base_url: https://api.example.com/v1\nmodels: []\n"
	for _, tc := range []struct {
		listen, metrics string
		public          bool
	}{
		{"127.0.0.1:8080", "", false},
		{"127.0.0.2:8080", "", false}, // all of 127.0.0.0/8 is loopback
		{"localhost:8080", "", false},
		{"[::1]:8080", "", false},
		{"[::ffff:127.0.0.1]:8080", "", false},
		{"0.0.0.0:8080", "", true},
		{":8080", "", true},
		{"[::]:8080", "", true},
		{"10.0.0.5:8080", "", true},
		{"gateway.internal:8080", "", true}, // not looked up
		{"0.0.0.0:8080", "127.0.0.1:9090", false},
	} {
		cfg, err := parse("gateway.yaml", []byte(fmt.Sprintf(file, tc.listen, tc.metrics)), noEnv)
		if err != nil {
			t.Fatalf("listen %s: %v", tc.listen, err)
		}
		if got := cfg.MetricsOnPublicListener(); got != tc.public {
			t.Errorf("listen %s, metrics_listen %q: public %v, want %v", tc.listen, tc.metrics, got, tc.public)
		}
	}
}

// The default a warning suggests for a variable the file does not read
// is the value in force, printed to a terminal and the log: it showed
// ClickHouse's ?password=, a NATS token given as the user info, and the
// password of the second URL of a NATS list.
func TestRedactURLHidesEveryCredential(t *testing.T) {
	for in, want := range map[string]string{
		"clickhouse://127.0.0.1:9000/default?username=bill&password=S3cr3tQ":   "clickhouse://127.0.0.1:9000/default?username=bill&password=xxxxx",
		"clickhouse://bill:pw@127.0.0.1:9000/default?secure=true&Password=x#f": "clickhouse://bill:xxxxx@127.0.0.1:9000/default?secure=true&Password=xxxxx#f",
		"nats://tokOnly123@127.0.0.1:31505":                                    "nats://xxxxx@127.0.0.1:31505",
		"nats://127.0.0.1:31505,nats://u2:SecondPw77@127.0.0.1:31506":          "nats://127.0.0.1:31505,nats://u2:xxxxx@127.0.0.1:31506",
		"http://127.0.0.1:8000/v1":                                             "http://127.0.0.1:8000/v1",
		"http://c:4318/v1/traces?token=A&access_token=B&sig=C&api-version=1":   "http://c:4318/v1/traces?token=xxxxx&access_token=xxxxx&sig=xxxxx&api-version=1",
		"127.0.0.1:9000": "127.0.0.1:9000",
		// A password with an unescaped "/", and URLs without a scheme.
		"nats://u:pa/ss@127.0.0.1:4222":     "nats://u:xxxxx@127.0.0.1:4222",
		"//admin:S3cr3t@gw.internal:8080":   "//admin:xxxxx@gw.internal:8080",
		"admin:S3cr3t@gw.internal:8080":     "admin:xxxxx@gw.internal:8080",
		"http://h:8080/users/a@b/v1":        "http://h:8080/users/a@b/v1",
		"http://h/v1#frag?password=shown":   "http://h/v1#frag?password=shown",
		"https://u:p@h/v1?x=1&password=p#f": "https://u:xxxxx@h/v1?x=1&password=xxxxx#f",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// The OTLP exporter sends to the endpoint's host and path only: a query
// token was never sent, and was printed at every start. A query is
// warned of, its secrets hidden, and a URL refused is quoted hidden too.
func TestOTLPEndpointQueryIsWarnedOfAndHidden(t *testing.T) {
	const rest = "upstreams:\n  - name: a\n    base_url: http://127.0.0.1:8001/v1\n"
	cfg, err := parse("gateway.yaml", []byte("tracing:\n  otlp_endpoint: http://127.0.0.1:4318/v1/traces?token=S3CRET\n"+rest), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	warnings := strings.Join(cfg.Warnings(nil), "\n")
	if !strings.Contains(warnings, "tracing.otlp_endpoint") || !strings.Contains(warnings, "OTEL_EXPORTER_OTLP_HEADERS") || strings.Contains(warnings, "S3CRET") {
		t.Errorf("warnings %q: want the query warned of, its token hidden", warnings)
	}
	_, err = parse("gateway.yaml", []byte("upstreams:\n  - name: a\n    base_url: http://127.0.0.1:8001/v1?token=S3CRET#f\n"), noEnv)
	if err == nil || strings.Contains(err.Error(), "S3CRET") || !strings.Contains(err.Error(), "fragment") {
		t.Errorf("a base_url with a fragment and a token: %v, want it refused with the token hidden", err)
	}
}

// A ${VAR} without a default whose variable is not set read as empty, and
// nothing said so: data_dir: ${MY_DIR}/data loaded as /data, listen:
// ${MY_HOST}:8080 as :8080 (every interface), and a required setting
// left empty by one was "required" without naming the variable.
func TestUnsetVariableIsNamed(t *testing.T) {
	const valid = "server:\n  listen: ${MY_HOST}:8080\n  data_dir: ${MY_DIR}/data\n  public_url: ${MY_URL:-}\n  debug_listen: ${EMPTY}\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n    api_key: ${KEY}${KEY}\n"
	lookup := func(name string) (string, bool) {
		if name == "EMPTY" {
			return "", true
		}
		return "", false
	}
	cfg, err := parse("gateway.yaml", []byte(valid), lookup)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`warning: gateway.yaml:2: server.listen reads ${MY_HOST}, which is not set: it is ":8080". Set MY_HOST, or write ${MY_HOST:-default} for a default, or ${MY_HOST:?why} to refuse the file without it`,
		`warning: gateway.yaml:3: server.data_dir reads ${MY_DIR}, which is not set: it is "/data". Set MY_DIR, or write ${MY_DIR:-default} for a default, or ${MY_DIR:?why} to refuse the file without it`,
		`warning: gateway.yaml:9: upstreams[0].api_key reads ${KEY}, which is not set: it is "". Set KEY, or write ${KEY:-default} for a default, or ${KEY:?why} to refuse the file without it`,
	}
	// The last warns of /metrics served on :8080, every interface.
	if got := cfg.Warnings(nil); len(got) != len(want)+1 || !reflect.DeepEqual(got[:len(want)], want) {
		t.Errorf("warnings:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	const invalid = "upstreams:\n  - name: u\n    base_url: ${MY_UPSTREAM_URL}\nmodels:\n  - id: m\n    context_length: 4096\n    max_output_length: 100\n    pricing:\n      prompt: \"0.000001\"\n      completion: ${MY_PRICE}\n"
	_, err = parse("gateway.yaml", []byte(invalid), noEnv)
	for _, want := range []string{
		`gateway.yaml:3:15: upstreams[0].base_url: required: ${MY_UPSTREAM_URL} is not set`,
		`gateway.yaml:10:19: models[0].pricing.completion: is empty: ${MY_PRICE} is not set`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v\nwant a line starting %s", err, want)
		}
	}

	// ${VAR:?message}, the shell's: the file is refused without VAR.
	const required = "server:\n  data_dir: ${MY_DIR:?the data disk, such as /srv/tollgate}\n  public_url: ${MY_URL:?}\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n"
	_, err = parse("gateway.yaml", []byte(required), lookup)
	wantErr := "gateway.yaml:2:13: server.data_dir: ${MY_DIR} is not set: the data disk, such as /srv/tollgate\ngateway.yaml:3:15: server.public_url: ${MY_URL} is not set, and the file requires it"
	if err == nil || err.Error() != wantErr {
		t.Errorf("%v\nwant %s", err, wantErr)
	}
	// Set to nothing is refused too, and said so: it said "is not set".
	_, err = parse("gateway.yaml", []byte(required), func(string) (string, bool) { return "", true })
	if err == nil || !strings.Contains(err.Error(), "${MY_DIR} is set but empty: the data disk") {
		t.Errorf("with MY_DIR empty: %v", err)
	}
	cfg, err = parse("gateway.yaml", []byte(required), func(name string) (string, bool) {
		return "https://" + strings.ToLower(strings.ReplaceAll(name, "_", "-")) + ".example", true
	})
	if err != nil {
		t.Fatalf("with the variables set: %v", err)
	}
	if cfg.Server.DataDir != "https://my-dir.example" {
		t.Errorf("with MY_DIR set: %v, data_dir %q", err, cfg.Server.DataDir)
	}

	shipped, err := os.ReadFile("../gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err = parse("gateway.yaml", shipped, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Warnings(nil); len(got) > 0 {
		t.Errorf("the shipped gateway.yaml with no variable set warns:\n%s", strings.Join(got, "\n"))
	}
}
