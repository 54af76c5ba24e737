package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/money"
)

var update = flag.Bool("update", false, "rewrite the want part of testdata/*.yamltest from what the loader says now")

const goldenSeparator = "----- want -----\n"

// envLine sets an environment variable for one golden file: "# env: NAME=value".
var envLine = regexp.MustCompile(`(?m)^# env: ([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)

// TestGolden runs every testdata/*.yamltest: the YAML above the separator is
// parsed as gateway.yaml, seeing only the variables of its "# env:" lines;
// below it is the exact error text, or "ok" followed by "path = value" lines
// that the parsed config must satisfy.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yamltest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yamltest"), func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			input, want, found := strings.Cut(string(raw), goldenSeparator)
			if !found {
				t.Fatalf("%s has no %q line", file, strings.TrimSpace(goldenSeparator))
			}
			env := map[string]string{}
			for _, m := range envLine.FindAllStringSubmatch(input, -1) {
				env[m[1]] = m[2]
			}
			lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }

			cfg, err := parse("gateway.yaml", []byte(input), lookup)
			got := "ok\n"
			if err != nil {
				var errs *Errors
				if !errors.As(err, &errs) {
					t.Fatalf("parse returned %T, want *Errors: %v", err, err)
				}
				got = err.Error() + "\n"
			}
			if *update {
				if got == "ok\n" && strings.HasPrefix(want, "ok\n") {
					return // keep the assertions written by hand
				}
				if err := os.WriteFile(file, []byte(input+goldenSeparator+got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			wantFirst, assertions, _ := strings.Cut(want, "\n")
			if wantFirst != "ok" || err != nil {
				if got != want {
					t.Fatalf("got:\n%s\nwant:\n%s", got, want)
				}
				return
			}
			for _, line := range strings.Split(strings.TrimSpace(assertions), "\n") {
				if line == "" {
					continue
				}
				path, wantValue, ok := strings.Cut(line, " = ")
				if !ok {
					t.Fatalf("assertion %q: want \"path = value\"", line)
				}
				gotValue, err := valueAt(reflect.ValueOf(*cfg), path)
				if err != nil {
					t.Fatalf("assertion %q: %v", line, err)
				}
				if gotValue != wantValue {
					t.Errorf("%s = %s, want %s", path, gotValue, wantValue)
				}
			}
		})
	}
}

// TestGoldenCRLF reads every testdata/*.yamltest input again with CRLF
// line ends, as a file saved on Windows has them: the loader says the
// same. A syntax error was blamed on "the space character U+000D in the
// indentation" of the last blank line before it (found by a re-test
// session).
func TestGoldenCRLF(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yamltest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yamltest"), func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			input, _, _ := strings.Cut(string(raw), goldenSeparator)
			env := map[string]string{}
			for _, m := range envLine.FindAllStringSubmatch(input, -1) {
				env[m[1]] = m[2]
			}
			lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
			_, lfErr := parse("gateway.yaml", []byte(input), lookup)
			_, crlfErr := parse("gateway.yaml", []byte(strings.ReplaceAll(input, "\n", "\r\n")), lookup)
			if fmt.Sprint(crlfErr) != fmt.Sprint(lfErr) {
				t.Fatalf("with CRLF line ends:\n%v\nwith LF:\n%v", crlfErr, lfErr)
			}
		})
	}
}

// valueAt reads a yaml path such as models[1].pricing.prompt out of a
// decoded config, formatted with fmt.Sprint (strings are quoted).
func valueAt(v reflect.Value, path string) (string, error) {
	for _, part := range strings.Split(path, ".") {
		name, index, hasIndex := strings.Cut(part, "[")
		field, ok := fieldByKey(v.Type(), name)
		if !ok {
			return "", fmt.Errorf("no field %q in %s", name, v.Type())
		}
		v = v.FieldByIndex(field.Index)
		if hasIndex {
			i, err := strconv.Atoi(strings.TrimSuffix(index, "]"))
			if err != nil || i >= v.Len() {
				return "", fmt.Errorf("no element %s in %s (%d elements)", part, name, v.Len())
			}
			v = v.Index(i)
		}
	}
	if v.Kind() == reflect.String {
		return strconv.Quote(v.String()), nil
	}
	return fmt.Sprint(v.Interface()), nil
}

func noEnv(string) (string, bool) { return "", false }

// TestDefaultGatewayYAML loads the shipped gateway.yaml as a fresh machine
// sees it (no variables set), then with every variable of the env contract.
func TestDefaultGatewayYAML(t *testing.T) {
	data, err := os.ReadFile("../gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := parse("gateway.yaml", data, noEnv)
	if err != nil {
		t.Fatalf("default gateway.yaml does not load:\n%v", err)
	}
	if cfg.Server.Listen != "127.0.0.1:8080" || cfg.Server.DataDir != "./data" || cfg.Server.AdminToken != "" ||
		cfg.NATS.URL != "" || cfg.ClickHouse.DSN != "clickhouse://127.0.0.1:9000/default" {
		t.Errorf("unexpected defaults: %+v %+v %+v", cfg.Server, cfg.NATS, cfg.ClickHouse)
	}
	if len(cfg.Upstreams) != 1 || cfg.Upstreams[0].Name != "default" ||
		cfg.Upstreams[0].BaseURL != "http://127.0.0.1:8000/v1" || cfg.Upstreams[0].APIKey != "" {
		t.Errorf("unexpected upstreams: %+v", cfg.Upstreams)
	}
	wantModels := map[string]struct {
		hf      string
		context int
		input   []string
	}{
		"qwen2.5-14b-instruct-1m":     {"Qwen/Qwen2.5-14B-Instruct-1M", 1010000, []string{"text"}},
		"qwen3-vl-30b-a3b-instruct":   {"Qwen/Qwen3-VL-30B-A3B-Instruct", 262144, []string{"text", "image"}},
		"qwen3-vl-235b-a22b-thinking": {"Qwen/Qwen3-VL-235B-A22B-Thinking", 262144, []string{"text", "image"}},
	}
	if len(cfg.Models) != len(wantModels) {
		t.Fatalf("got %d models, want %d", len(cfg.Models), len(wantModels))
	}
	for _, m := range cfg.Models {
		want, ok := wantModels[m.ID]
		if !ok {
			t.Errorf("unexpected model %q", m.ID)
			continue
		}
		if m.HuggingFaceID != want.hf || m.UpstreamModel != want.hf || m.Upstream != "default" ||
			m.ContextLength != want.context || !reflect.DeepEqual(m.InputModalities, want.input) ||
			len(m.SupportedSamplingParameters) != 13 || m.Created != 0 {
			t.Errorf("model %s: %+v", m.ID, m)
		}
		// A cached prompt token free where others are not gives the
		// cache away: qwen3-vl-30b-a3b-instruct shipped with "0". An
		// omitted input_cache_read costs the prompt price.
		prompt, _ := money.ParsePrice(m.Pricing.Prompt)
		if cached, err := money.ParsePrice(m.Pricing.InputCacheRead); m.Pricing.InputCacheRead != "" && (err != nil || cached == 0 && prompt != 0) {
			t.Errorf("model %s: input_cache_read %q makes cached prompt tokens free, its prompt costing %q", m.ID, m.Pricing.InputCacheRead, m.Pricing.Prompt)
		}
	}

	env := map[string]string{
		"TOLLGATE_LISTEN":      "0.0.0.0:9000",
		"TOLLGATE_DATA_DIR":    "/var/lib/tollgate",
		"TOLLGATE_ADMIN_TOKEN": "s3cret-admin-token",
		"UPSTREAM_BASE_URL":    "https://api.example.com/v1",
		"UPSTREAM_API_KEY":     "sk-123",
		"NATS_URL":             "nats://10.0.0.1:4222",
		"CLICKHOUSE_DSN":       "clickhouse://ch:9000/billing",
	}
	cfg, err = parse("gateway.yaml", data, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("gateway.yaml with the env contract set:\n%v", err)
	}
	got := map[string]string{
		"TOLLGATE_LISTEN":      cfg.Server.Listen,
		"TOLLGATE_DATA_DIR":    cfg.Server.DataDir,
		"TOLLGATE_ADMIN_TOKEN": cfg.Server.AdminToken,
		"UPSTREAM_BASE_URL":    cfg.Upstreams[0].BaseURL,
		"UPSTREAM_API_KEY":     cfg.Upstreams[0].APIKey,
		"NATS_URL":             cfg.NATS.URL,
		"CLICKHOUSE_DSN":       cfg.ClickHouse.DSN,
	}
	if !reflect.DeepEqual(got, env) {
		t.Errorf("env contract: got %v, want %v", got, env)
	}
}

// TestLoadAndCheck covers the file entry points: Check says ok for the
// default file and returns *Errors for a bad one, and a missing file is an
// I/O error, not *Errors.
func TestLoadAndCheck(t *testing.T) {
	if err := Check("../gateway.yaml"); err != nil {
		t.Fatalf("Check(default gateway.yaml): %v", err)
	}
	cfg, err := Load("../gateway.yaml")
	if err != nil || cfg.Path != "../gateway.yaml" {
		t.Fatalf("Load: %v, Path %q", err, cfg.Path)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("upstreams: []\nauth: {algorithm: HS256}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = Check(bad)
	var errs *Errors
	if !errors.As(err, &errs) || len(*errs) != 2 {
		t.Fatalf("Check(bad) = %v, want *Errors with 2 entries", err)
	}
	if (*errs)[0].File != bad || (*errs)[0].Line != 1 {
		t.Errorf("first error %+v, want it in %s at line 1", (*errs)[0], bad)
	}
	err = Check(filepath.Join(t.TempDir(), "missing.yaml"))
	if err == nil || errors.As(err, &errs) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Check(missing) = %v, want a wrapped os.ErrNotExist", err)
	}
}

// TestEnvValueWithYAMLSyntaxStaysOneValue: a value from the environment is
// never parsed as YAML, so ": #", quotes, brackets, "null" or digits arrive
// exactly as set.
func TestEnvValueWithYAMLSyntaxStaysOneValue(t *testing.T) {
	values := []string{
		"key: value # not a comment",
		`"quoted' [bracket {brace`,
		"null",
		"123",
		"- item\nsecond: line",
		"~",
		"${NOT_EXPANDED_AGAIN}",
	}
	for _, v := range values {
		env := func(name string) (string, bool) {
			if name == "UPSTREAM_API_KEY" {
				return v, true
			}
			return "", false
		}
		// A key must not hold a line break (TestAPIKeyWithALineBreakIsRefused):
		// such a value is checked in the issuer alone.
		apiKey, wantKey := "${UPSTREAM_API_KEY}", v
		if strings.Contains(v, "\n") {
			apiKey, wantKey = "k", "k"
		}
		input := "upstreams:\n  - name: default # comment\n    base_url: http://127.0.0.1:8000/v1\n    api_key: " + apiKey + "\nauth:\n  issuer: x${UPSTREAM_API_KEY}\n"
		cfg, err := parse("gateway.yaml", []byte(input), env)
		if err != nil {
			t.Errorf("value %q: %v", v, err)
			continue
		}
		if cfg.Upstreams[0].APIKey != wantKey || cfg.Auth.Issuer != "x"+v || cfg.Upstreams[0].Name != "default" {
			t.Errorf("value %q: api_key %q, issuer %q, name %q", v, cfg.Upstreams[0].APIKey, cfg.Auth.Issuer, cfg.Upstreams[0].Name)
		}
	}
}

func TestExpandEnv(t *testing.T) {
	env := map[string]string{"SET": "v", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for in, want := range map[string]string{
		"${SET}":                 "v",
		"${UNSET}":               "",
		"${UNSET:-d}":            "d",
		"${EMPTY:-d}":            "d",
		"${SET:-d}":              "v",
		"${UNSET:-a:b#c}":        "a:b#c",
		"${UNSET:-}":             "",
		"$$":                     "$",
		"$${SET}":                "${SET}",
		"a$b$":                   "a$b$",
		"pre-${SET}-${SET}-post": "pre-v-v-post",
		"$$$$":                   "$$",
		// $$ is a literal $ in a default too, as everywhere else: it
		// stayed $$, and gateway.yaml's header excepted nothing.
		"${UNSET:-pa$$word}": "pa$word",
		"${SET:-pa$$word}":   "v",
		"${UNSET:-a$b}":      "a$b",
		"${UNSET:-$${SET}}":  "${SET}",
		"${UNSET:-$$$$}-$$":  "$$-$",
		"${SET:?why}":        "v",
		"${SET:?a:-b}":       "v",
	} {
		got, _, err := expandEnv(in, lookup)
		if err != nil || got != want {
			t.Errorf("expandEnv(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"${SET", "x ${", "${}", "${1X}", "${A B}", "${X:-${Y}}", "${X:-a$$${Y}}", "${UNSET:?why}", "${EMPTY:?}", "${UNSET:?a:-b}"} {
		if got, _, err := expandEnv(in, lookup); err == nil {
			t.Errorf("expandEnv(%q) = %q, want an error", in, got)
		}
	}
}

// ${A:-${B:-4}} was quoted ${A:-${B:-4} (a brace short), and a number
// field got a second error for the text left unexpanded.
func TestNestedDefaultIsOneError(t *testing.T) {
	const want = `gateway.yaml:6:22: upstreams[0].max_connections: ${A:-${B:-4}}: a default cannot hold another ${...}: nested defaults are not supported (write "$${" for a literal "${")`
	data := strings.Replace(configWith("127.0.0.1:8080", "m"), "base_url: http://127.0.0.1:8000/v1\n", "base_url: http://127.0.0.1:8000/v1\n    max_connections: ${A:-${B:-4}}\n", 1)
	_, err := parse("gateway.yaml", []byte(data), noEnv)
	if err == nil || err.Error() != want {
		t.Fatalf("%v\nwant %s", err, want)
	}
}

func TestRestartOnlyDiff(t *testing.T) {
	data, err := os.ReadFile("../gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	old, err := parse("gateway.yaml", data, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	same, _ := parse("gateway.yaml", data, noEnv)
	same.Models = nil
	same.Upstreams[0].IdleTimeout = time.Hour
	same.Billing.GraceUSD = "1"
	same.Routing.ResponseTTL = old.Routing.ResponseTTL + time.Hour // a longer one deletes nothing
	if diff := same.RestartOnlyDiff(old); diff != nil {
		t.Errorf("reloadable changes reported as restart-only: %v", diff)
	}
	changed, _ := parse("gateway.yaml", data, noEnv)
	changed.Server.Listen = "127.0.0.1:1"
	changed.Server.DataDir = "/x"
	changed.Server.AdminToken = "t"
	changed.Server.MaxRequestBody = 1 << 20
	changed.Server.MetricsListen = "127.0.0.1:9090"
	changed.Auth.Issuer = "someone-else"
	changed.Billing.OutboxMaxBytes *= 2
	changed.Billing.Durability = "fsync"
	changed.Billing.FsyncInterval *= 2
	changed.Billing.PublishBatch.MaxDelay *= 2
	changed.Billing.UsageRetention = time.Hour
	changed.NATS = NATS{URL: "nats://x:4222", EmbeddedListen: "127.0.0.1:1", CredsFile: "c", TLSCA: "a", TLSCert: "b", TLSKey: "k", Replicas: 3, StartTimeout: 2 * time.Minute}
	changed.ClickHouse = ClickHouse{DSN: "clickhouse://y:9000/z", ConsumeInServe: !old.ClickHouse.ConsumeInServe}
	changed.Routing.ResponseTTL = old.Routing.ResponseTTL - time.Hour
	want := []string{"server.listen", "server.data_dir", "server.admin_token", "server.max_request_body", "server.metrics_listen", "auth.issuer",
		"billing.outbox_max_bytes", "billing.durability", "billing.fsync_interval", "billing.publish_batch", "billing.usage_retention",
		"nats.url", "nats.embedded_listen", "nats.creds_file", "nats.tls_ca", "nats.tls_cert", "nats.tls_key", "nats.replicas",
		"nats.start_timeout", "clickhouse.dsn", "clickhouse.consume_in_serve", "routing.response_ttl"}
	if diff := changed.RestartOnlyDiff(old); !reflect.DeepEqual(diff, want) {
		t.Errorf("RestartOnlyDiff = %v, want %v", diff, want)
	}
}

// FuzzParse: no input makes Parse panic, and Parse returns exactly one of a
// config or an error.
func FuzzParse(f *testing.F) {
	if data, err := os.ReadFile("../gateway.yaml"); err == nil {
		f.Add(data)
	}
	files, _ := filepath.Glob("testdata/*.yamltest")
	for _, file := range files {
		raw, _ := os.ReadFile(file)
		input, _, _ := strings.Cut(string(raw), goldenSeparator)
		f.Add([]byte(input))
	}
	f.Add([]byte("a: &a [*a]\nserver: &s {<<: *s}\n"))
	f.Add([]byte("models: [{<<: [{id: x}], id: y}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.yaml", data)
		if (cfg == nil) == (err == nil) {
			t.Fatalf("Parse returned config %v and error %v", cfg != nil, err)
		}
		if err != nil && err.Error() == "" {
			t.Fatal("empty error text")
		}
	})
}

// The line of a syntax error is found by halves: where yaml.v3 named the
// line models: starts on, every line after it was cut and parsed, and a
// file of 3,000 models took minutes.
func TestSyntaxErrorLineIsFoundByHalves(t *testing.T) {
	var b strings.Builder
	b.WriteString("server:\n  listen: 127.0.0.1:8080\nmodels:\n")
	for i := range 5000 {
		fmt.Fprintf(&b, "  - id: m%d\n    context_length: 4096\n", i)
	}
	want := strings.Count(b.String(), "\n") + 1
	b.WriteString("   max_output_length: 512\n") // one space short
	data := []byte(b.String())
	err := unmarshalSafely(data)
	m := yamlLine.FindStringSubmatch(fmt.Sprint(err))
	if m == nil {
		t.Fatalf("no syntax error: %v", err)
	}
	parses := 0
	defer func(f func([]byte) error) { unmarshalCut = f }(unmarshalCut)
	unmarshalCut = func(d []byte) error { parses++; return unmarshalSafely(d) }
	// From line 3, as if yaml.v3 had named the start of models:.
	if got := problemLine(data, 3, m[2]); got != want {
		t.Fatalf("line %d, want %d", got, want)
	}
	if parses > 20 {
		t.Fatalf("%d parses of the file to find the line", parses)
	}
}

// The reader's errors (invalid UTF-8, a NUL byte) come from yaml.v3 with
// no line; the search by halves finds it.
func TestReaderErrorsGetALine(t *testing.T) {
	for name, bad := range map[string]string{"invalid UTF-8": "./d\xff", "NUL": "./d\x00x"} {
		data := "server:\n  listen: 127.0.0.1:8080\n  data_dir: " + bad + "\nupstreams: []\n"
		_, err := parse("gateway.yaml", []byte(data), noEnv)
		if err == nil || !strings.HasPrefix(err.Error(), "gateway.yaml:3: ") {
			t.Errorf("%s: %v, want it on line 3", name, err)
		}
	}
}

// An upstream's api_key goes into a header line as it is: a trailing
// newline (a secret file's, a YAML | block) ended the Authorization
// header early, and the body reached the upstream as a second request
// whose answer went to the next call.
func TestAPIKeyWithALineBreakIsRefused(t *testing.T) {
	for name, input := range map[string]string{
		"block":       "upstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n    api_key: |\n      sk-live\n",
		"environment": "upstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n    api_key: ${KEY}\n",
		"escaped":     "upstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n    api_key: \"sk\\r\\nX-Evil: 1\"\n",
	} {
		env := func(string) (string, bool) { return "sk-live\n", true }
		_, err := parse("gateway.yaml", []byte(input), env)
		if err == nil || !strings.Contains(err.Error(), "gateway.yaml:4") || !strings.Contains(err.Error(), "upstreams[0].api_key: contains a line break") {
			t.Errorf("%s: %v, want the line break refused on line 4", name, err)
		}
	}
}

// An editor that indents with tabs gets yaml.v3's "found character that
// cannot start any token", which does not say the tab is the problem.
func TestTabIndentIsNamed(t *testing.T) {
	data := "server:\n  listen: 127.0.0.1:8080\nrouting:\n\tbalance: p2c\n"
	_, err := parse("gateway.yaml", []byte(data), noEnv)
	if err == nil || !strings.Contains(err.Error(), "gateway.yaml:4:1: ") || !strings.Contains(err.Error(), "YAML indents with spaces only") {
		t.Fatalf("%v, want line 4, column 1, naming the tab", err)
	}
}

// The admin token a secret file gives keeps its last newline; clients'
// tokens are read trimmed, so the gateway started and then refused every
// admin call, the ones to revoke a leaked key included.
func TestAdminTokenWithALineBreakOrSpaceIsRefused(t *testing.T) {
	input := "server:\n  listen: 127.0.0.1:8080\n  admin_token: ${TOLLGATE_ADMIN_TOKEN:-}\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n"
	for value, want := range map[string]string{
		"s3cret-admin-token\n": "server.admin_token: contains a line break",
		"s3cret-admin-token ":  "server.admin_token: starts or ends with whitespace",
	} {
		env := func(string) (string, bool) { return value, true }
		_, err := parse("gateway.yaml", []byte(input), env)
		if err == nil || !strings.Contains(err.Error(), "gateway.yaml:3") || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q on line 3", value, err, want)
		}
	}
	env := func(string) (string, bool) { return "s3cret-admin-token", true }
	if _, err := parse("gateway.yaml", []byte(input), env); err != nil {
		t.Fatal(err)
	}
}

// A query in base_url (Azure's ?api-version=) stays a query on every URL
// built from it, after the path, with the call's own query after it.
func TestEndpointURLKeepsBaseURLQuery(t *testing.T) {
	for _, c := range []struct{ base, path, query, want string }{
		{"http://h:8000/v1", "/models", "", "http://h:8000/v1/models"},
		{"http://h:8000/v1/", "/models", "", "http://h:8000/v1/models"},
		{"https://h/openai/v1?api-version=1", "/models", "", "https://h/openai/v1/models?api-version=1"},
		{"https://h/openai/v1/?api-version=1", "/responses/r%2F1", "limit=1", "https://h/openai/v1/responses/r%2F1?api-version=1&limit=1"},
		{"http://h/a%20b", "/models", "x=1", "http://h/a%20b/models?x=1"},
	} {
		if got := (Upstream{BaseURL: c.base}).EndpointURL(c.path, c.query); got != c.want {
			t.Errorf("%s + %s ? %s = %s, want %s", c.base, c.path, c.query, got, c.want)
		}
	}
}

// yaml.v3 counts a parser error's line from 0, so the line "the block
// holding it starts on" was one early (a comment), and a block's first
// key indented one space off was blamed on the key after it.
func TestSyntaxErrorLines(t *testing.T) {
	for name, c := range map[string]struct{ data, want string }{
		"open quote": {
			"server:\n  listen: 127.0.0.1:8080\nbilling:\n  # overdraft\n  grace_usd: \"0.50\n  durability: process\n  fsync_interval: 100ms\nauth:\n  issuer: \"x\"\n",
			"gateway.yaml:9: did not find expected key (the block holding it starts on line 5)",
		},
		"open list": {
			"server:\n  listen: 127.0.0.1:8080\nbilling:\n  # comment\n  durability: [a\n  grace_usd: \"1\"\n",
			"gateway.yaml:5: did not find expected ',' or ']'",
		},
		"first key one space in": {
			"server:\n  listen: 127.0.0.1:8080\nrouting:\n  # p2c\n   balance: p2c\n  # none\n  affinity: none\n  retries: 2\n",
			"gateway.yaml:5: did not find expected key (the first key of its block starts in column 4, the keys after it in column 3; the parser stopped on line 7)",
		},
		"first key one space out": {
			"server:\n  listen: 127.0.0.1:8080\nrouting:\n balance: p2c\n  affinity: none\n  retries: 2\n",
			"gateway.yaml:4: mapping values are not allowed in this context (the first key of its block starts in column 2, the keys after it in column 3; the parser stopped on line 5)",
		},
		"later key one space in": {
			"server:\n  listen: 127.0.0.1:8080\nrouting:\n  balance: p2c\n   affinity: none\n  retries: 2\n",
			"gateway.yaml:5: mapping values are not allowed in this context (indented deeper than line 4 above it, whose key has its value already: line 4 lacks indentation, or this line has too much)",
		},
		// The key before is the one out of place: it ended its block.
		"key at column 0 inside a block": {
			"server:\n  listen: 127.0.0.1:8080\ndata_dir: ./data\n  shutdown_timeout: 25s\n",
			`gateway.yaml:3: mapping values are not allowed in this context ("data_dir" at column 0 is no top-level section: it lacks indentation, and ended the block above it; the parser stopped on line 4)`,
		},
		// A comment line after that key made yaml.v3 say "did not find
		// expected key" instead, and the hint was left out.
		"key at column 0 inside a block, a comment after it": {
			"server:\n  listen: 127.0.0.1:8080\nrouting:\n  retries: 2\nbalance: p2c\n  # comment\n  affinity: none\n",
			`gateway.yaml:5: did not find expected key ("balance" at column 0 is no top-level section: it lacks indentation, and ended the block above it; the parser stopped on line 7)`,
		},
		// A top-level key may have its value: which line is wrong the
		// file does not say.
		"top-level key, a comment after it": {
			"server:\n  listen: 127.0.0.1:8080\nx-note: 1\n  # comment\n  affinity: none\n",
			"gateway.yaml:5: did not find expected key (indented deeper than line 3 above it, whose key has its value already: line 3 lacks indentation, or this line has too much)",
		},
		// A non-breaking space (a copy from a web page) looks like a
		// space, but to YAML it is part of the key.
		"non-breaking spaces": {
			"server:\n  listen: 127.0.0.1:8080\n\u00a0\u00a0data_dir: ./data\n  shutdown_timeout: 25s\n",
			"gateway.yaml:3:1: mapping values are not allowed in this context: a non-breaking space (U+00A0) in the indentation; YAML indents with plain spaces only (the parser stopped on line 4)",
		},
		// Lines ended by a lone CR (classic Mac) were all line 1.
		"CR line ends": {
			"server:\r  listen: 127.0.0.1:8080\rrouting:\r  balance: p2c\r  affinity: none\r # x\r   retries: 2\r",
			"gateway.yaml:7: did not find expected key (indented deeper than line 5 above it, whose key has its value already: line 5 lacks indentation, or this line has too much)",
		},
		"later key one space out": {
			"server:\n  listen: 127.0.0.1:8080\nrouting:\n  balance: p2c\n affinity: none\n  retries: 2\n",
			"gateway.yaml:5: did not find expected key",
		},
		"a value with a colon": {
			"server:\n  listen: 127.0.0.1:8080\nrouting:\n  balance:\n    x: a: b\n    y: 1\n",
			"gateway.yaml:5: mapping values are not allowed in this context",
		},
	} {
		_, err := parse("gateway.yaml", []byte(c.data), noEnv)
		if err == nil || err.Error() != c.want {
			t.Errorf("%s: %v\nwant %s", name, err, c.want)
		}
	}
}

// Un-indenting routing's balance in the shipped file said "did not find
// expected key (the block holding it starts on line 34)": line 34 is
// server:, and the line at fault was named nowhere.
func TestKeyAtColumn0InTheShippedFileIsNamed(t *testing.T) {
	shipped, err := os.ReadFile("../gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(shipped), "\n")
	at := slices.Index(lines, "  balance: p2c")
	if at < 0 {
		t.Fatal(`gateway.yaml has no "  balance: p2c" line`)
	}
	lines[at] = "balance: p2c"
	_, err = parse("gateway.yaml", []byte(strings.Join(lines, "\n")), noEnv)
	want := fmt.Sprintf(`gateway.yaml:%d: did not find expected key ("balance" at column 0 is no top-level section: it lacks indentation, and ended the block above it; the parser stopped on line `, at+1)
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("%v\nwant %s...", err, want)
	}
}

// admin_token: "x" was accepted: a one-character credential for the whole
// admin API. An api_key with edge spaces was sent with them, part of the
// key the upstream read.
func TestShortAdminTokenAndSpacedAPIKeyAreRefused(t *testing.T) {
	input := "server:\n  admin_token: ${TOKEN}\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n    api_key: ${KEY}\n"
	for _, c := range []struct{ token, key, want string }{
		{"x", "sk-abc", "gateway.yaml:2:16: server.admin_token: length 1, under the 16 bytes an admin credential needs"},
		{"0123456789abcde", "sk-abc", "server.admin_token: length 15,"},
		{"0123456789abcdef", " sk-abc ", "gateway.yaml:6:14: upstreams[0].api_key: starts or ends with whitespace"},
		{"0123456789abcdef", "sk-abc ", "upstreams[0].api_key: starts or ends with whitespace"},
		{"0123456789abcdef", "sk-abc", ""},
		{"", "", ""},
	} {
		env := map[string]string{"TOKEN": c.token, "KEY": c.key}
		_, err := parse("gateway.yaml", []byte(input), func(n string) (string, bool) { v, ok := env[n]; return v, ok })
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("token %q, key %q: %v, want %q", c.token, c.key, err, c.want)
		}
	}
}

// A byte order mark or a zero-width space copied into a token is
// invisible in the file and in no token a client sends: an admin_token
// holding one started and refused every admin call.
func TestTokenWithAnInvisibleCharacterIsRefused(t *testing.T) {
	for name, input := range map[string]string{
		"admin bom":        "server:\n  admin_token: \"\\uFEFFtga-0123456789abcdef\"\n",
		"admin zero-width": "server:\n  admin_token: \"tga-0123456789abcdef\\u200B\"\n",
		"upstream key":     "upstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n    api_key: \"sk-\\u200Blive\"\n",
	} {
		_, err := parse("gateway.yaml", []byte(input), func(string) (string, bool) { return "", false })
		if err == nil || !strings.Contains(err.Error(), "non-ASCII character") {
			t.Errorf("%s: %v, want the invisible character refused", name, err)
		}
	}
}

// A first-byte timeout moves a call to another upstream only while
// retry_budget has not passed: the defaults, and the shipped file, keep
// the budget above every upstream's first_byte_timeout. At 10s against
// 60s, a stopped member's calls got a 503 beside healthy members.
func TestShippedRetryBudgetOutlastsFirstByteTimeout(t *testing.T) {
	if DefaultRetryBudget <= DefaultFirstByteTimeout {
		t.Fatalf("default retry_budget %s is not above the default first_byte_timeout %s", DefaultRetryBudget, DefaultFirstByteTimeout)
	}
	cfg, err := Load("../gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range cfg.Upstreams {
		if cfg.Routing.RetryBudget <= u.FirstByteTimeout {
			t.Fatalf("gateway.yaml: retry_budget %s is not above %s's first_byte_timeout %s", cfg.Routing.RetryBudget, u.Name, u.FirstByteTimeout)
		}
	}
}

// nats.start_timeout is 1s to an hour; left out, a minute. A written 0
// is refused, not read as the default.
func TestNATSStartTimeout(t *testing.T) {
	checkDurationSetting(t, "nats.start_timeout", func(c *Config) time.Duration { return c.NATS.StartTimeout },
		map[string]time.Duration{"": DefaultNATSStartTimeout, "5s": 5 * time.Second, "1h": time.Hour},
		map[string]string{"0s": "0 is outside 1s..1h", "-1s": "-1s is outside", "1ms": "1ms is outside 1s..1h", "61m": "1h1m0s is outside"})
}

// server.hsts_max_age is whole seconds from 0s (send none) to two years;
// left out, a year.
func TestHSTSMaxAge(t *testing.T) {
	checkDurationSetting(t, "server.hsts_max_age", func(c *Config) time.Duration { return c.Server.HSTSMaxAge },
		map[string]time.Duration{"": DefaultHSTSMaxAge, "0s": 0, "1h": time.Hour, "17520h": MaxHSTSMaxAge},
		map[string]string{"-1s": "-1s", "1.5s": "1.5s", "17521h": "17521h"})
}

// checkDurationSetting loads a file that writes setting ("section.key")
// as each value of accepted ("" leaves it out) and wants get to read the
// duration given; each value of refused must be refused with a message
// holding "section.key: " and its refusal.
func checkDurationSetting(t *testing.T, setting string, get func(*Config) time.Duration, accepted map[string]time.Duration, refused map[string]string) {
	t.Helper()
	const rest = "upstreams:\n  - name: a\n    base_url: http://127.0.0.1:8001/v1\n"
	section, key, _ := strings.Cut(setting, ".")
	for value, want := range accepted {
		file := rest
		if value != "" {
			file = section + ":\n  " + key + ": " + value + "\n" + rest
		}
		cfg, err := parse("gateway.yaml", []byte(file), noEnv)
		if err != nil || get(cfg) != want {
			t.Errorf("%s %q: %v, %v; want %s", key, value, cfg, err, want)
		}
	}
	for value, refusal := range refused {
		_, err := parse("gateway.yaml", []byte(section+":\n  "+key+": "+value+"\n"+rest), noEnv)
		if err == nil || !strings.Contains(err.Error(), setting+": "+refusal) {
			t.Errorf("%s %q: %v, want it refused (%s)", key, value, err, refusal)
		}
	}
}

// supported_features: [tools, tools] was accepted in silence, where an
// upstream or a model listed twice is refused: a slip more likely than
// meant. Each list of a model's entries refuses a repeat, on its line.
func TestModelListsRefuseARepeatedEntry(t *testing.T) {
	data := configWith("127.0.0.1:8080", "m") +
		"    supported_features: [tools, tools]\n" +
		"    input_modalities:\n      - text\n      - image\n      - text\n" +
		"    supported_sampling_parameters: [temperature, top_p, temperature]\n"
	const want = `gateway.yaml:10:33: models[0].supported_features[1]: "tools" is listed twice (also at [0]): remove one
gateway.yaml:14:9: models[0].input_modalities[2]: "text" is listed twice (also at [0]): remove one
gateway.yaml:15:57: models[0].supported_sampling_parameters[2]: "temperature" is listed twice (also at [0]): remove one`
	_, err := parse("gateway.yaml", []byte(data), noEnv)
	if err == nil || err.Error() != want {
		t.Fatalf("%v\nwant %s", err, want)
	}
}

// A key written without the space after its colon (grace_usd:"0.50") is
// one plain text to YAML, not a key and its value, and the parser fails a
// line or more later: in the shipped file, at the next section's key,
// blaming the block server: starts.
func TestKeyWithoutASpaceAfterItsColonIsNamed(t *testing.T) {
	shipped, err := os.ReadFile("../gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	inShipped := func(line, broken string) (string, int) {
		lines := strings.Split(string(shipped), "\n")
		at := slices.Index(lines, line)
		if at < 0 {
			t.Fatalf("gateway.yaml has no %q line", line)
		}
		lines[at] = broken
		return strings.Join(lines, "\n"), at + 1
	}
	grace, graceLine := inShipped(`  grace_usd: "0.50"`, `  grace_usd:"0.50"`)
	listen, listenLine := inShipped(`  listen: ${TOLLGATE_LISTEN:-127.0.0.1:8080}`, `  listen:${TOLLGATE_LISTEN:-127.0.0.1:8080}`)
	for name, c := range map[string]struct{ data, want string }{
		"shipped grace_usd": {grace, fmt.Sprintf(`gateway.yaml:%d:12: "grace_usd:" needs a space after the colon: YAML reads grace_usd:"0.50" as one text, not a key and its value (the parser stopped on line `, graceLine)},
		"shipped listen":    {listen, fmt.Sprintf(`gateway.yaml:%d:9: "listen:" needs a space after the colon: YAML reads listen:${TOLLGATE_LISTEN:-127.0.0.1:8080} as one text, not a key and its value (the parser stopped on line `, listenLine)},
		"comments after it": {
			"billing:\n  # Overdraft\n  grace_usd:\"0.50\"\n  # a\n  # b\n  # c\n  outbox_max_bytes: 1GiB\n",
			`gateway.yaml:3:12: "grace_usd:" needs a space after the colon: YAML reads grace_usd:"0.50" as one text, not a key and its value (the parser stopped on line 7: did not find expected key)`,
		},
		"no comments": {
			"billing:\n  grace_usd:\"0.50\"\n  outbox_max_bytes: 1GiB\n",
			`gateway.yaml:2:12: "grace_usd:" needs a space after the colon: YAML reads grace_usd:"0.50" as one text, not a key and its value (the parser stopped on line 3: mapping values are not allowed in this context)`,
		},
		"a list item": {
			"upstreams:\n  - name:u\n    base_url: http://127.0.0.1:8000/v1\n",
			`gateway.yaml:2:9: "name:" needs a space after the colon: YAML reads name:u as one text, not a key and its value (the parser stopped on line 3: mapping values are not allowed in this context)`,
		},
		// Text that is no key keeps the parser's own error.
		"a URL in a value going on": {
			"server:\n  listen: 127.0.0.1:8080\n  public_url: see\n    http://x.example\n  data_dir: ./d\n   bad: 1\n",
			"gateway.yaml:6: mapping values are not allowed in this context (indented deeper than line 5 above it, whose key has its value already: line 5 lacks indentation, or this line has too much)",
		},
		"key:value in a literal block": {
			"server:\n  listen: |\n    a:b\n  data_dir: ./d\n   bad: 1\n",
			"gateway.yaml:5: mapping values are not allowed in this context (indented deeper than line 4 above it, whose key has its value already: line 4 lacks indentation, or this line has too much)",
		},
	} {
		_, err := parse("gateway.yaml", []byte(c.data), noEnv)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: %v\nwant %s", name, err, c.want)
		}
	}
}
