package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/proxy"
)

const adminToken = "admin-secret"

// Nothing listens on the upstream: the admin API never calls it.
const gatewayYAML = `
server:
  listen: 127.0.0.1:0
  data_dir: %s
  demo_credit_usd: "0"
upstreams:
  - name: local
    base_url: http://127.0.0.1:1/v1
models:
  - id: small
    upstream: local
    upstream_model: proxytest-small
    context_length: 32768
    max_output_length: 4096
    pricing: {prompt: "0.0000001", completion: "0.0000003"}
`

// gateway is a proxy.Server with the admin API, on real TCP, with an
// embedded NATS behind its account store.
type gateway struct {
	t   *testing.T
	url string
	svc *accounts.Service
	js  jetstream.JetStream
}

// startGateway starts the gateway with modules, which may add admin routes.
func startGateway(t *testing.T, modules ...proxy.Module) *gateway {
	t.Helper()
	return startGatewayWith(t, "", modules...)
}

// startGatewayWith starts the gateway with more of gateway.yaml, sections
// the test file does not have.
func startGatewayWith(t *testing.T, moreYAML string, modules ...proxy.Module) *gateway {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := t.TempDir()
	b, err := broker.Start(ctx, config.NATS{EmbeddedListen: "127.0.0.1:0", Replicas: 1}, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	cfg, err := config.Parse("gateway.yaml", []byte(fmt.Sprintf(gatewayYAML, dir)+moreYAML))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := accounts.Open(ctx, b.JetStream(), 1, dir, cfg.Auth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	gw, err := proxy.New(cfg, proxy.Options{Accounts: svc, Recorder: meter.NewMemory(nil),
		Admin: admin.New(adminToken, svc), Modules: modules, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	return &gateway{t: t, url: gatewaytest.Serve(t, gw), svc: svc, js: b.JetStream()}
}

// call sends an admin call with the admin token and returns the status,
// the Allow header and the body.
func (g *gateway) call(method, path, body string) (int, string, []byte) {
	g.t.Helper()
	req, err := http.NewRequest(method, g.url+path, strings.NewReader(body))
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	client := &http.Client{Timeout: 15 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		g.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Allow"), b
}

type envelope struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// wantError checks that body is the OpenAI error envelope with param and
// code, and returns its message.
func wantError(t *testing.T, body []byte, param, code string) string {
	t.Helper()
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("not the error envelope: %v: %s", err, body)
	}
	gotParam, gotCode := "", ""
	if env.Error.Param != nil {
		gotParam = *env.Error.Param
	}
	if env.Error.Code != nil {
		gotCode = *env.Error.Code
	}
	if gotParam != param || gotCode != code || env.Error.Message == "" {
		t.Fatalf("envelope %s: want param %q, code %q", body, param, code)
	}
	return env.Error.Message
}

func TestCreateKeyRefusesTooLongNameAndRetention(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	for _, tc := range []struct {
		body, param, message string
	}{
		{`{"name":"` + strings.Repeat("n", 201) + `"}`, "name", "name is too long: at most 200 bytes"},
		{`{"name":"ci\u0007"}`, "name", "name must not contain control characters"},
		// As the console refuses them: one check, the same input.
		{`{"name":"  "}`, "name", `name is required: name keys after where they are used, e.g. "prod-backend"`},
		{`{"name":" pad "}`, "name", "name must not begin or end with a space"},
		{`{"name":"c1\u0085x"}`, "name", "name must not contain control characters"},
		{`{"name":"x\u202egpj.exe"}`, "name", "name must not contain bidirectional formatting characters (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069): they can make a name read as another"},
		{`{"name":"ci","logging":{"enabled":true,"retention_days":36501}}`, "logging.retention_days",
			"logging retention must be a whole number of days from 0 to 36500 (0 keeps logged calls with no expiry)"},
		// The CLI refuses -retention-days without -logging; the API stored
		// it on a key that logs nothing.
		{`{"name":"ci","logging":{"enabled":false,"retention_days":5}}`, "logging.retention_days",
			"logging retention (retention_days: 5) applies only when logging is enabled: enable logging, or leave retention_days at 0"},
		{`{"name":"ci","logging":{"retention_days":5}}`, "logging.retention_days",
			"logging retention (retention_days: 5) applies only when logging is enabled: enable logging, or leave retention_days at 0"},
		{`{"name":"ci","models":["gpt-4o"]}`, "models", `model "gpt-4o" is not in the catalog; valid models: small`},
		// Named like any other field, not in Go's words ("cannot unmarshal
		// number 1.5 into Go struct field keyBody.rpm of type int64").
		{`{"name":"ci","rpm":1.5}`, "rpm", "rpm must be an integer, got number 1.5"},
		{`{"name":"ci","scopes":"generate"}`, "scopes", "scopes must be an array, got string"},
		// An empty list is not "all": it once made a key that could call everything.
		{`{"name":"ci","scopes":[]}`, "scopes", "scopes is an empty list: name at least one of generate, classify, batch, console, or omit scopes for all of them"},
		{`{"name":"ci","models":[]}`, "models", "models is an empty list: name at least one catalog model, or omit models for every model"},
		// encoding/json would take the last of two, and match any case:
		// these once made a key with every scope, and one without a limit.
		{`{"name":"ro","scopes":["classify"],"SCOPES":["generate","classify","batch"]}`, "SCOPES",
			`unknown field "SCOPES" (did you mean "scopes"? names are case-sensitive)`},
		{`{"name":"x","rpm":5,"rpm":0}`, "rpm", `"rpm" is given twice: send each field once`},
		{`{"name":"x","logging":{"enabled":true,"Retention_Days":3}}`, "logging.Retention_Days",
			`unknown field "logging.Retention_Days" (did you mean "logging.retention_days"? names are case-sensitive)`},
		{`{"name":"x"} {"name":"y"}`, "", "invalid JSON body: not one well-formed JSON value"},
		// encoding/json reads both as U+FFFD: the console refused the
		// name, the API stored it as another.
		{"{\"name\":\"bad\xfe\xffname\"}", "", "invalid JSON body: not valid UTF-8; send text as UTF-8"},
		{`{"name":"a\ud800b"}`, "", `invalid JSON body: a string escapes a lone surrogate (such as "\ud800" without the "\udc00" to "\udfff" after it), which is no character`},
	} {
		status, _, body := g.call("POST", "/admin/v1/accounts/acme/keys", tc.body)
		if status != 400 {
			t.Fatalf("%s: %d %s, want 400", tc.body, status, body)
		}
		if msg := wantError(t, body, tc.param, "invalid_request_error"); msg != tc.message {
			t.Errorf("%s: message %q, want %q", tc.body, msg, tc.message)
		}
	}
	keys, err := g.svc.ListKeys(t.Context(), "acme")
	if err != nil || len(keys) != 0 {
		t.Fatalf("refused requests left keys %+v (%v)", keys, err)
	}
	// At the caps exactly, the key is created.
	body := `{"name":"` + strings.Repeat("n", 200) + `","logging":{"enabled":true,"retention_days":36500}}`
	if status, _, out := g.call("POST", "/admin/v1/accounts/acme/keys", body); status != 201 {
		t.Fatalf("key at the caps: %d %s", status, out)
	}
}

// TestKeyCapIsAConflictNamingTheSetting: keys were unlimited, so one
// account filled every gateway's memory with them. Past
// auth.max_keys_per_account the create is a 409 that says which setting,
// and that revoking a key frees a place; the OpenAI SDKs are told not to
// retry it (they retry every 409), as asking again changes nothing.
func TestKeyCapIsAConflictNamingTheSetting(t *testing.T) {
	g := startGatewayWith(t, "auth:\n  max_keys_per_account: 2\n")
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	var first struct {
		KeyID string `json:"key_id"`
	}
	for i := range 2 {
		status, _, body := g.call("POST", "/admin/v1/accounts/acme/keys", `{"name":"k"}`)
		if status != 201 {
			t.Fatalf("key %d: %d %s", i+1, status, body)
		}
		if i == 0 {
			_ = json.Unmarshal(body, &first)
		}
	}
	req, _ := http.NewRequest("POST", g.url+"/admin/v1/accounts/acme/keys", strings.NewReader(`{"name":"k"}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 409 || resp.Header.Get("x-should-retry") != "false" {
		t.Fatalf("third key under a cap of 2: %d, x-should-retry %q, %s; want 409 and false", resp.StatusCode, resp.Header.Get("x-should-retry"), body)
	}
	msg := wantError(t, body, "", "too_many_keys")
	for _, want := range []string{"auth.max_keys_per_account", "2", "revoke"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}
	if status, _, body := g.call("DELETE", "/admin/v1/keys/"+first.KeyID, ""); status != 200 {
		t.Fatalf("revoke: %d %s", status, body)
	}
	if status, _, body := g.call("POST", "/admin/v1/accounts/acme/keys", `{"name":"k"}`); status != 201 {
		t.Errorf("a key after a revocation freed a place: %d %s", status, body)
	}
}

// TestAdminKeysAreNotLimitedPerHour: auth.max_keys_created_per_hour holds
// for the console, where the account holder makes keys; the admin API
// (and the CLI through it) is the operator's, trusted to provision many
// keys at once, and its keys do not count against the holder's hour.
func TestAdminKeysAreNotLimitedPerHour(t *testing.T) {
	g := startGatewayWith(t, "auth:\n  max_keys_created_per_hour: 1\n")
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	for i := range 3 {
		if status, _, body := g.call("POST", "/admin/v1/accounts/acme/keys", `{"name":"k"}`); status != 201 {
			t.Fatalf("key %d under a limit of 1 an hour: %d %s; the admin API is not limited", i+1, status, body)
		}
	}
}

func TestRoutesAuthAndMethods(t *testing.T) {
	g := startGateway(t)
	req, _ := http.NewRequest("GET", g.url+"/admin/v1/upstreams", nil)
	req.Header.Set("Authorization", "Bearer wrong")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("wrong token: %d %s", resp.StatusCode, body)
	}
	wantError(t, body, "", "invalid_admin_token")
	// The scheme in any case, as RFC 9110 has it and /v1 reads it.
	req.Header.Set("Authorization", "bearer "+adminToken)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("lower-case scheme: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	steps := []struct {
		method, path, body string
		status             int
		contains           string
	}{
		{"POST", "/admin/v1/accounts", `{"id":"acme","credit_usd":"1.50"}`, 201, `"balance_usd":"1.500000000"`},
		{"POST", "/admin/v1/accounts", `{"id":"acme"}`, 409, `"code":"conflict"`},
		{"POST", "/admin/v1/accounts", `{"id":"x","typo":1}`, 400, `unknown field`},
		{"GET", "/admin/v1/accounts/acme", "", 200, `"id":"acme"`},
		{"GET", "/admin/v1/accounts/nobody", "", 404, `"code":"not_found"`},
		{"POST", "/admin/v1/accounts/acme/credit", `{"usd":"0"}`, 400, `"param":"usd"`},
		{"POST", "/admin/v1/accounts/acme/credit", `{"usd":"2.5"}`, 200, `"balance_usd":"4.000000000"`},
		{"GET", "/admin/v1/accounts/acme/keys", "", 200, `"data":[]`},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":"soon"}`, 400, `"param":"expires_in"`},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":"1ns"}`, 400, `under a second`},
		// A lifetime too long, or in days, was "must be a positive duration".
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":"100000000h"}`, 400, `longer than a key can live (at most 2562047h`},
		// Up to an int64 of nanoseconds less a second, the expiry
		// overflowed: "2562047h47m16s" made a key that expired in 1734.
		// One bound, whole hours: 2562047h is taken, a second more is not.
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":"2562047h47m16s"}`, 400, `"expires_in \"2562047h47m16s\" is longer than a key can live (at most 2562047h, about 292 years)`},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":"2562047h0m1s"}`, 400, `at most 2562047h, about 292 years`},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":"2562047h47m17s"}`, 400, `longer than a key can live (at most 2562047h, about 292 years)`},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":"30d"}`, 400, `there is no d`},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":"-5h"}`, 400, `must be a positive duration`},
		{"GET", "/admin/v1/upstreams", "", 200, `"name":"local"`},
		{"GET", "/admin/v1/nothing/here", "", 404, `no admin route /admin/v1/nothing/here`},
	}
	for _, s := range steps {
		status, _, body := g.call(s.method, s.path, s.body)
		if status != s.status || !bytes.Contains(body, []byte(s.contains)) {
			t.Fatalf("%s %s: %d %s, want %d with %s", s.method, s.path, status, body, s.status, s.contains)
		}
	}
	// The longest lifetime taken expires about 292 years from the call.
	// (From the time after it, the expiry, rounded up to the second,
	// was earlier whenever the call crossed a second.)
	calledAt := time.Now()
	status, _, body := g.call("POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":"2562047h"}`)
	var longest struct {
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(body, &longest); status != 201 || err != nil || longest.ExpiresAt.Before(calledAt.Add(2562047*time.Hour)) {
		t.Fatalf("key of 2562047h: %d %s", status, body)
	}
	if status, allow, body := g.call("PUT", "/admin/v1/accounts/acme/keys", ""); status != 405 || allow != "GET, HEAD, POST" {
		t.Fatalf("PUT keys: %d, Allow %q: %s", status, allow, body)
	}

	status, _, body = g.call("POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","scopes":["generate"]}`)
	var created struct {
		KeyID string `json:"key_id"`
		Key   string `json:"key"`
	}
	if err := json.Unmarshal(body, &created); status != 201 || err != nil || created.Key == "" {
		t.Fatalf("create key: %d %s", status, body)
	}
	if status, _, body := g.call("DELETE", "/admin/v1/keys/"+created.KeyID, ""); status != 200 || !bytes.Contains(body, []byte(`"revoked":true`)) {
		t.Fatalf("revoke: %d %s", status, body)
	}
}

// echoModule adds its admin route the way the console adds console-login.
func echoModule(id string) proxy.Module {
	return proxy.Module{ID: id, New: func(proxy.Host, *proxy.World) (proxy.Provisioned, error) {
		return proxy.Provisioned{AdminRoutes: []admin.Route{{Method: "POST", Path: "accounts/{}/test-echo", Handle: echo}}}, nil
	}}
}

func echo(call *admin.Call) (int, any, error) {
	if _, ok := call.World.Catalog.Resolve("small"); !ok {
		return 0, nil, proxy.Internal("no catalog in the call")
	}
	if call.Args[0] == "nobody" {
		return 0, nil, fmt.Errorf("echo: %w", accounts.ErrNotFound)
	}
	return 201, map[string]string{"account": call.Args[0]}, nil
}

// A route a module adds (as the console adds console-login) gets its path
// arguments, and its errors go out in the envelope with the status the
// admin API gives them. Two modules cannot add the same route.
func TestRegisteredRoute(t *testing.T) {
	g := startGateway(t, echoModule("echo"))
	if status, _, body := g.call("POST", "/admin/v1/accounts/acme/test-echo", ""); status != 201 || string(body) != `{"account":"acme"}` {
		t.Fatalf("registered route: %d %s", status, body)
	}
	status, _, body := g.call("POST", "/admin/v1/accounts/nobody/test-echo", "")
	if status != 404 {
		t.Fatalf("registered route's not-found: %d %s", status, body)
	}
	wantError(t, body, "", "not_found")
	if status, allow, _ := g.call("GET", "/admin/v1/accounts/acme/test-echo", ""); status != 405 || allow != "POST" {
		t.Fatalf("GET on a POST route: %d, Allow %q", status, allow)
	}
	cfg, err := config.Parse("gateway.yaml", []byte(fmt.Sprintf(gatewayYAML, t.TempDir())))
	if err != nil {
		t.Fatal(err)
	}
	_, err = proxy.New(cfg, proxy.Options{Recorder: meter.NewMemory(nil), Admin: admin.New(adminToken, g.svc),
		Modules: []proxy.Module{echoModule("echo"), echoModule("echo-again")}})
	if err == nil || !strings.Contains(err.Error(), "module echo-again") || !strings.Contains(err.Error(), "also module echo's") {
		t.Fatalf("two modules adding one admin route: %v; want an error naming both", err)
	}
}

// A credit sent twice with one idempotency_key (a retried CLI call, a
// payment webhook delivered again) is applied once; the second answer
// says Idempotent-Replayed.
func TestCreditWithIdempotencyKeyAppliesOnce(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	credit := func(body string) (int, string, string) {
		req, err := http.NewRequest("POST", g.url+"/admin/v1/accounts/acme/credit", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)
	}
	for i, wantReplayed := range []string{"", "true"} {
		status, replayed, body := credit(`{"usd":"10.00","idempotency_key":"pay_1"}`)
		if status != 200 || replayed != wantReplayed || !strings.Contains(body, `"balance_usd":"10.000000000"`) {
			t.Fatalf("credit %d: %d replayed %q %s", i+1, status, replayed, body)
		}
	}
	if status, _, body := credit(`{"usd":"11.00","idempotency_key":"pay_1"}`); status != 409 || !strings.Contains(body, `was used at`) {
		t.Fatalf("the key with another amount: %d %s", status, body)
	}
}

// A credit typed wrong ("1000" meant as "10.00") could not be taken back:
// "-5" was "must be greater than zero", and no route debits. A negative
// usd corrects it, once per idempotency key, and never below what was
// credited.
func TestNegativeCreditCorrectsACreditTypedWrong(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme","credit_usd":"1000"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	for i := range 2 {
		status, _, body := g.call("POST", "/admin/v1/accounts/acme/credit", `{"usd":"-990","idempotency_key":"fix_1"}`)
		if status != 200 || !bytes.Contains(body, []byte(`"balance_usd":"10.000000000","credited_usd":"10.000000000"`)) {
			t.Fatalf("correction %d: %d %s", i+1, status, body)
		}
	}
	status, _, body := g.call("POST", "/admin/v1/accounts/acme/credit", `{"usd":"-10.01"}`)
	if status != 400 {
		t.Fatalf("a correction past what was credited: %d %s", status, body)
	}
	want := "correcting by -10.010000000 USD: credited_usd would go below zero (it is 10.000000000); a correction takes back at most what was credited"
	if msg := wantError(t, body, "usd", "invalid_request_error"); msg != want {
		t.Errorf("a correction past what was credited: %q, want %q", msg, want)
	}
	status, _, body = g.call("POST", "/admin/v1/accounts/acme/credit", `{"usd":"-0"}`)
	if msg := wantError(t, body, "usd", "invalid_request_error"); status != 400 || !strings.Contains(msg, "must not be zero") {
		t.Errorf("a credit of -0: %d %q", status, msg)
	}
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"beta","credit_usd":"-1"}`); status != 400 || !bytes.Contains(body, []byte("must not be negative")) {
		t.Errorf("an account created with a negative credit: %d %s", status, body)
	}
}

// An id in the path is one segment as sent: "acme/../acme4" credited
// acme4, and "acme%2Fkeys" (or acme/keys) listed acme's keys, because
// routes matched the path after fasthttp decoded and cleaned it. A
// segment that is '.', '..' or holds an escaped '/' is refused, and
// reaches no route, a module's included.
func TestIDsInThePathStayInTheirSegment(t *testing.T) {
	g := startGateway(t, echoModule("echo"))
	for _, id := range []string{"acme", "acme4"} {
		if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"`+id+`"}`); status != 201 {
			t.Fatalf("create %s: %d %s", id, status, body)
		}
	}
	for _, tc := range []struct{ method, path, body, segment string }{
		{"POST", "/admin/v1/accounts/acme/../acme4/credit", `{"usd":"1"}`, ".."},
		{"POST", "/admin/v1/accounts/acme%2F..%2Facme4/credit", `{"usd":"1"}`, "acme/../acme4"},
		{"POST", "/admin/v1/accounts/%2E%2E/acme4/credit", `{"usd":"1"}`, ".."},
		{"GET", "/admin/v1/accounts/acme%2Fkeys", "", "acme/keys"},
		{"GET", "/admin/v1/accounts/./acme", "", "."},
		{"DELETE", "/admin/v1/keys/x%2F..%2F..%2Faccounts%2Facme", "", "x/../../accounts/acme"},
		{"POST", "/admin/v1/accounts/nobody/..%2Facme/test-echo", "", "../acme"},
	} {
		status, _, body := g.call(tc.method, tc.path, tc.body)
		if status != 400 {
			t.Fatalf("%s %s: %d %s, want 400", tc.method, tc.path, status, body)
		}
		want := fmt.Sprintf("path segment %q is not an id: an id holds no '/', escaped or not, and is not '.' or '..'", tc.segment)
		if msg := wantError(t, body, "", "invalid_request_error"); msg != want {
			t.Errorf("%s %s: %q, want %q", tc.method, tc.path, msg, want)
		}
	}
	// A segment too many finds no route rather than another one.
	if status, _, body := g.call("GET", "/admin/v1/accounts/acme/keys/extra", ""); status != 404 {
		t.Fatalf("a path one segment too long: %d %s", status, body)
	}
	for _, id := range []string{"acme", "acme4"} {
		if acc, err := g.svc.Account(t.Context(), id); err != nil || acc.Balance != 0 {
			t.Fatalf("%s after the refused calls: %+v %v", id, acc, err)
		}
	}
	// Escapes that decode to an id are that id.
	if status, _, body := g.call("GET", "/admin/v1/accounts/%61cme", ""); status != 200 || !bytes.Contains(body, []byte(`"id":"acme"`)) {
		t.Fatalf("an escaped id: %d %s", status, body)
	}
}

// A body that is not an object says so, not in Go's words ("cannot
// unmarshal array into Go value of type struct { ID string "json:\"id\""
// …}").
func TestBodyThatIsNotAnObject(t *testing.T) {
	g := startGateway(t)
	for body, got := range map[string]string{`[{"id":"acme"}]`: "an array", `"acme"`: "a string", `12`: "a number",
		`true`: "a boolean", `null`: "null"} {
		for _, path := range []string{"/admin/v1/accounts", "/admin/v1/accounts/acme/credit", "/admin/v1/accounts/acme/keys"} {
			status, _, out := g.call("POST", path, body)
			if status != 400 {
				t.Fatalf("%s %s: %d %s", path, body, status, out)
			}
			if msg, want := wantError(t, out, "", "invalid_request_error"), "the body must be a JSON object, got "+got; msg != want {
				t.Errorf("%s %s: %q, want %q", path, body, msg, want)
			}
		}
	}
}

// An unknown field is named in the envelope's param, with the fields the
// route takes: only a case variant was ("RPM"); any other was Go's
// "invalid JSON body: json: unknown field" with param null, and a
// PATCH of an account's credit_usd did not say where credits go.
func TestUnknownFieldIsNamedWithTheFieldsTaken(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	for _, tc := range []struct{ method, path, body, param, message string }{
		{"PATCH", "/admin/v1/accounts/acme", `{"credit_usd":"5"}`, "credit_usd",
			`unknown field "credit_usd"; fields of this route: rpm, tpm, max_concurrent; credit an account with POST /admin/v1/accounts/{id}/credit {"usd":"10.00"}`},
		{"PATCH", "/admin/v1/accounts/acme", `{"balance_usd":"5"}`, "balance_usd",
			`unknown field "balance_usd"; fields of this route: rpm, tpm, max_concurrent; credit an account with POST /admin/v1/accounts/{id}/credit {"usd":"10.00"}`},
		{"PATCH", "/admin/v1/accounts/acme", `{"credit":"5"}`, "credit",
			`unknown field "credit"; fields of this route: rpm, tpm, max_concurrent; credit an account with POST /admin/v1/accounts/{id}/credit {"usd":"10.00"}`},
		{"PATCH", "/admin/v1/accounts/acme", `{"rpm":5,"max_concurent":2}`, "max_concurent",
			`unknown field "max_concurent" (did you mean "max_concurrent"?); fields of this route: rpm, tpm, max_concurrent`},
		{"POST", "/admin/v1/accounts", `{"id":"x","typo":1}`, "typo",
			`unknown field "typo"; fields of this route: id, credit_usd, rpm, tpm, max_concurrent`},
		{"POST", "/admin/v1/accounts/acme/credit", `{"usd":"1","idempotency":"p1"}`, "idempotency",
			`unknown field "idempotency"; fields of this route: usd, idempotency_key`},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","logging":{"enabled":true,"days":3}}`, "logging.days",
			`unknown field "logging.days"; fields of logging: enabled, retention_days`},
		{"DELETE", "/admin/v1/keys/key_1", `{"reason":"leak"}`, "reason",
			`unknown field "reason"; this route takes no fields: send no body, or {}`},
		// Still the case variant's own message.
		{"PATCH", "/admin/v1/accounts/acme", `{"RPM":5}`, "RPM",
			`unknown field "RPM" (did you mean "rpm"? names are case-sensitive)`},
	} {
		status, _, body := g.call(tc.method, tc.path, tc.body)
		if status != 400 {
			t.Errorf("%s %s %s: %d %s, want 400", tc.method, tc.path, tc.body, status, body)
			continue
		}
		if msg := wantError(t, body, tc.param, "invalid_request_error"); msg != tc.message {
			t.Errorf("%s %s %s: %q, want %q", tc.method, tc.path, tc.body, msg, tc.message)
		}
	}
}

// DELETE /admin/v1/keys/{id} takes no fields: it ignored its body, so
// "-d garbage" or a misplaced field revoked the key and answered 200. No
// body and {} still revoke.
func TestRevokeKeyRefusesABody(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	newKey := func() string {
		status, _, body := g.call("POST", "/admin/v1/accounts/acme/keys", `{"name":"ci"}`)
		var key struct {
			KeyID string `json:"key_id"`
		}
		if status != 201 || json.Unmarshal(body, &key) != nil {
			t.Fatalf("create key: %d %s", status, body)
		}
		return key.KeyID
	}
	id := newKey()
	for _, tc := range []struct{ body, param, message string }{
		{"garbage", "", "invalid JSON body: not one well-formed JSON value"},
		{`{"reason":"leak"}`, "reason", `unknown field "reason"`},
		{`[]`, "", "the body must be a JSON object, got an array"},
	} {
		status, _, out := g.call("DELETE", "/admin/v1/keys/"+id, tc.body)
		if status != 400 {
			t.Fatalf("%s: %d %s, want 400", tc.body, status, out)
		}
		if msg := wantError(t, out, tc.param, "invalid_request_error"); !strings.Contains(msg, tc.message) {
			t.Errorf("%s: %q, want %q", tc.body, msg, tc.message)
		}
	}
	keys, err := g.svc.ListKeys(t.Context(), "acme")
	if err != nil || len(keys) != 1 || keys[0].RevokedAt != nil {
		t.Fatalf("a refused revoke revoked the key: %+v (%v)", keys, err)
	}
	for _, body := range []string{"", "{}"} {
		if status, _, out := g.call("DELETE", "/admin/v1/keys/"+newKey(), body); status != 200 {
			t.Fatalf("revoke with body %q: %d %s", body, status, out)
		}
	}
	if status, _, out := g.call("DELETE", "/admin/v1/keys/"+id, ""); status != 200 {
		t.Fatalf("revoke: %d %s", status, out)
	}
}

// An account's limits are set at creation and changed later, one at a
// time: a PATCH keeps the limits it does not name.
func TestAccountLimitsSetAndChanged(t *testing.T) {
	g := startGateway(t)
	status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme","rpm":60,"max_concurrent":4}`)
	if status != 201 || !strings.Contains(string(body), `"rpm":60,"tpm":0,"max_concurrent":4`) {
		t.Fatalf("create with limits: %d %s", status, body)
	}
	status, _, body = g.call("PATCH", "/admin/v1/accounts/acme", `{"tpm":1000}`)
	if status != 200 || !strings.Contains(string(body), `"rpm":60,"tpm":1000,"max_concurrent":4`) {
		t.Fatalf("patch tpm: %d %s", status, body)
	}
	status, _, body = g.call("PATCH", "/admin/v1/accounts/acme", `{"rpm":0}`)
	if status != 200 || !strings.Contains(string(body), `"rpm":0,"tpm":1000,"max_concurrent":4`) {
		t.Fatalf("patch rpm to none: %d %s", status, body)
	}
	if _, limits, _, _ := g.svc.Standing("acme"); limits != (accounts.Limits{TPM: 1000, MaxConcurrent: 4}) {
		t.Errorf("the gateway admits calls under %+v", limits)
	}
	status, _, body = g.call("GET", "/admin/v1/accounts/acme", "")
	if status != 200 || !strings.Contains(string(body), `"rpm":0,"tpm":1000,"max_concurrent":4`) {
		t.Fatalf("get: %d %s", status, body)
	}
	for _, tc := range []struct{ method, path, body, param string }{
		{"PATCH", "/admin/v1/accounts/acme", `{"max_concurrent":-1}`, "max_concurrent"},
		{"PATCH", "/admin/v1/accounts/acme", `{"RPM":5}`, "RPM"},
		{"PATCH", "/admin/v1/accounts/acme", `{"rpm":1.5}`, "rpm"},
		{"POST", "/admin/v1/accounts", `{"id":"acme2","tpm":-5}`, "tpm"},
		{"POST", "/admin/v1/accounts", `{"id":"acme2","Rpm":5}`, "Rpm"},
	} {
		status, _, body := g.call(tc.method, tc.path, tc.body)
		if status != 400 {
			t.Errorf("%s %s: %d %s, want 400", tc.method, tc.body, status, body)
			continue
		}
		wantError(t, body, tc.param, "invalid_request_error")
	}
	if status, _, body := g.call("PATCH", "/admin/v1/accounts/nobody", `{"rpm":1}`); status != 404 {
		t.Errorf("limits of a missing account: %d %s", status, body)
	}
	if _, limits, _, _ := g.svc.Standing("acme"); limits != (accounts.Limits{TPM: 1000, MaxConcurrent: 4}) {
		t.Errorf("refused changes changed the limits to %+v", limits)
	}
}

// A key made without scopes or models has all of them, and the key object
// says so with null, as README documents: [] would read as none (and is
// a 400 when sent), and a list written out would not follow the catalog.
func TestKeyWithoutScopesOrModelsIsNullInTheKeyObject(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	for _, tc := range []struct{ body, scopes, models string }{
		{`{"name":"all"}`, `null`, `null`},
		{`{"name":"some","scopes":["classify"],"models":["small"]}`, `["classify"]`, `["small"]`},
	} {
		status, _, body := g.call("POST", "/admin/v1/accounts/acme/keys", tc.body)
		var key map[string]json.RawMessage
		if status != 201 || json.Unmarshal(body, &key) != nil {
			t.Fatalf("create %s: %d %s", tc.body, status, body)
		}
		if string(key["scopes"]) != tc.scopes || string(key["models"]) != tc.models {
			t.Errorf("%s: scopes %s, models %s; want %s, %s", tc.body, key["scopes"], key["models"], tc.scopes, tc.models)
		}
	}
}

// HEAD is answered as GET, without the body, as on the API's routes, and
// Allow names HEAD beside GET: HEAD /admin/v1/accounts/acme was a 405
// "Allow: GET, PATCH", which README said it was not.
func TestHeadIsAnsweredAsGet(t *testing.T) {
	g := startGateway(t, echoModule("echo"))
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	for _, path := range []string{"/admin/v1/accounts/acme", "/admin/v1/accounts/acme/keys", "/admin/v1/upstreams"} {
		status, _, body := g.call("HEAD", path, "")
		if status != 200 || len(body) != 0 {
			t.Fatalf("HEAD %s: %d %q, want 200 with no body", path, status, body)
		}
	}
	if status, _, body := g.call("HEAD", "/admin/v1/accounts/nobody", ""); status != 404 || len(body) != 0 {
		t.Fatalf("HEAD of an unknown account: %d %q, want GET's 404 with no body", status, body)
	}
	for _, c := range []struct{ method, path, allow string }{
		{"PUT", "/admin/v1/accounts/acme", "GET, HEAD, PATCH"},
		{"PUT", "/admin/v1/accounts/acme/keys", "GET, HEAD, POST"},
		{"POST", "/admin/v1/upstreams", "GET, HEAD"},
		// A route with no GET answers no HEAD.
		{"HEAD", "/admin/v1/accounts/acme/credit", "POST"},
		{"HEAD", "/admin/v1/accounts/acme/test-echo", "POST"},
	} {
		if status, allow, _ := g.call(c.method, c.path, ""); status != 405 || allow != c.allow {
			t.Fatalf("%s %s: %d, Allow %q; want 405, Allow %q", c.method, c.path, status, allow, c.allow)
		}
	}
}

// A USD amount is the decimal alone, as gateway.yaml takes it: " 1.00",
// "1.00\n" and "+1" were credited, so a value pasted from elsewhere, or a
// sign meant for something else, went through unseen.
func TestUSDAmountIsTheDecimalAlone(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	for _, c := range []struct{ usd, says string }{
		{`" 1.00"`, "starts or ends with whitespace: remove it"},
		{`"1.00\n"`, "starts or ends with whitespace: remove it"},
		{`"\t1"`, "starts or ends with whitespace: remove it"},
		{`"1.00\u00a0"`, "starts or ends with whitespace: remove it"},
		{`"+1"`, "'+'"},
	} {
		status, _, body := g.call("POST", "/admin/v1/accounts/acme/credit", `{"usd":`+c.usd+`}`)
		if status != 400 || !strings.Contains(wantError(t, body, "usd", "invalid_request_error"), c.says) {
			t.Fatalf("credit %s: %d %s; want a 400 saying %q", c.usd, status, body, c.says)
		}
		status, _, body = g.call("POST", "/admin/v1/accounts", `{"id":"other","credit_usd":`+c.usd+`}`)
		if status != 400 || !strings.Contains(wantError(t, body, "credit_usd", "invalid_request_error"), c.says) {
			t.Fatalf("create with credit_usd %s: %d %s; want a 400 saying %q", c.usd, status, body, c.says)
		}
	}
	if status, _, body := g.call("GET", "/admin/v1/accounts/acme", ""); status != 200 || !strings.Contains(string(body), `"balance_usd":"0.000000000"`) {
		t.Fatalf("after the refused credits: %d %s", status, body)
	}
}

// An idempotency_key sent empty was taken as none: two credits from a
// payment integration whose id mapped to "" were both applied. One with
// a control character ("a\nb") was kept, to show in no log as it is;
// one with a space at an end was another key than the id without it.
// All are refused, crediting nothing.
func TestCreditRefusesAnEmptyOrControlIdempotencyKey(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	for _, c := range []struct{ key, says string }{
		{`""`, "idempotency_key is empty"},
		{`"a\nb"`, "control character"},
		{`"pay_1\u0000"`, "control character"},
		{`"pay\u007f1"`, "control character"},
		{`"pay\u00851"`, "control character"},
		{`" pay_1"`, "starts or ends with whitespace"}, // another key than "pay_1"
		{`"pay_1\t"`, "starts or ends with whitespace"},
	} {
		status, _, body := g.call("POST", "/admin/v1/accounts/acme/credit", `{"usd":"1","idempotency_key":`+c.key+`}`)
		if status != 400 || !strings.Contains(wantError(t, body, "idempotency_key", "invalid_request_error"), c.says) {
			t.Fatalf("idempotency_key %s: %d %s; want a 400 saying %q", c.key, status, body, c.says)
		}
	}
	if status, _, body := g.call("GET", "/admin/v1/accounts/acme", ""); status != 200 || !strings.Contains(string(body), `"balance_usd":"0.000000000"`) {
		t.Fatalf("after the refused credits: %d %s", status, body)
	}
}

// A refusal names the field to fix in param, in the API's words: an
// invalid id was "invalid input: account id must be …" with param null
// (a number for id said param "id"), as were a credit that would
// overflow the balance and an idempotency key reused for another amount.
func TestStoreRefusalsNameTheirField(t *testing.T) {
	g := startGateway(t)
	status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"a b"}`)
	if msg := wantError(t, body, "id", "invalid_request_error"); status != 400 || !strings.HasPrefix(msg, "account id must be") {
		t.Fatalf("invalid id: %d %s", status, body)
	}
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme","credit_usd":"9000000000"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	status, _, body = g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`)
	if wantError(t, body, "id", "conflict"); status != 409 {
		t.Fatalf("account that exists: %d %s", status, body)
	}
	status, _, body = g.call("POST", "/admin/v1/accounts/acme/credit", `{"usd":"9000000000"}`)
	// It said "would overflow the balance": credited_usd is what would,
	// and it has a maximum to name.
	want := "crediting 9000000000.000000000 USD would take credited_usd (9000000000.000000000) past its maximum, 9223372036.854775807 USD"
	if msg := wantError(t, body, "usd", "invalid_request_error"); status != 400 || msg != want {
		t.Fatalf("a credit past the balance: %d %s, want %q", status, body, want)
	}
	// Said "usd: USD amount \"\": not a plain decimal number".
	status, _, body = g.call("POST", "/admin/v1/accounts/acme/credit", `{}`)
	want = `usd is required: give an amount such as "10.00" (a negative one corrects credits made before)`
	if msg := wantError(t, body, "usd", "invalid_request_error"); status != 400 || msg != want {
		t.Fatalf("a credit without usd: %d %s, want %q", status, body, want)
	}
	status, _, body = g.call("POST", "/admin/v1/accounts/acme/credit", `{"usd":""}`)
	want = `usd is empty: give an amount such as "10.00" (a negative one corrects credits made before)`
	if msg := wantError(t, body, "usd", "invalid_request_error"); status != 400 || msg != want {
		t.Fatalf("a credit of usd \"\": %d %s, want %q", status, body, want)
	}
	if status, _, body := g.call("POST", "/admin/v1/accounts/acme/credit", `{"usd":"1","idempotency_key":"pay_1"}`); status != 200 {
		t.Fatalf("credit: %d %s", status, body)
	}
	status, _, body = g.call("POST", "/admin/v1/accounts/acme/credit", `{"usd":"2","idempotency_key":"pay_1"}`)
	if msg := wantError(t, body, "idempotency_key", "conflict"); status != 409 || !strings.HasPrefix(msg, `idempotency key "pay_1" was used at`) ||
		!strings.HasSuffix(msg, "another key for another credit") {
		t.Fatalf("the key with another amount: %d %s", status, body)
	}
	// An id in the path is no field: param null, the same words.
	status, _, body = g.call("GET", "/admin/v1/accounts/a%20b", "")
	if msg := wantError(t, body, "", "invalid_request_error"); status != 400 || !strings.HasPrefix(msg, "account id must be") {
		t.Fatalf("invalid id in the path: %d %s", status, body)
	}
	status, _, body = g.call("POST", "/admin/v1/accounts/a%20b/credit", `{"usd":"1"}`)
	if msg := wantError(t, body, "", "invalid_request_error"); status != 400 || !strings.HasPrefix(msg, "account id must be") {
		t.Fatalf("invalid id in a credit's path: %d %s", status, body)
	}
}

// A field sent empty or null is refused, naming it, where it means
// nothing but "left out": "expires_in": "" made a key that never
// expires, {"max_concurrent": null} answered 200 and changed nothing,
// and "credit_usd": null or "" made an account with no credit. A key's
// scopes and models take null: it is how the key object shows "all", and
// the CLI sends it for a flag left out.
func TestEmptyOrNullFieldIsRefused(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	for _, c := range []struct{ method, path, body, param string }{
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":""}`, "expires_in"},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":null}`, "expires_in"},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","rpm":null}`, "rpm"},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","logging":null}`, "logging"},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","logging":{"enabled":true,"retention_days":null}}`, "logging.retention_days"},
		{"POST", "/admin/v1/accounts/acme/keys", `{"name":null}`, "name"},
		{"POST", "/admin/v1/accounts", `{"id":"other","credit_usd":""}`, "credit_usd"},
		{"POST", "/admin/v1/accounts", `{"id":"other","credit_usd":null}`, "credit_usd"},
		{"POST", "/admin/v1/accounts", `{"id":"other","rpm":null}`, "rpm"},
		{"POST", "/admin/v1/accounts", `{"id":null}`, "id"},
		{"PATCH", "/admin/v1/accounts/acme", `{"max_concurrent":null}`, "max_concurrent"},
		{"POST", "/admin/v1/accounts/acme/credit", `{"usd":"1","idempotency_key":null}`, "idempotency_key"},
		{"POST", "/admin/v1/accounts/acme/credit", `{"usd":null}`, "usd"},
	} {
		status, _, body := g.call(c.method, c.path, c.body)
		if status != 400 {
			t.Fatalf("%s %s %s: %d %s, want 400", c.method, c.path, c.body, status, body)
		}
		wantError(t, body, c.param, "invalid_request_error")
	}
	if status, _, body := g.call("GET", "/admin/v1/accounts/other", ""); status != 404 {
		t.Fatalf("an account made by a refused call: %d %s", status, body)
	}
	if status, _, body := g.call("GET", "/admin/v1/accounts/acme/keys", ""); status != 200 || !strings.Contains(string(body), `"data":[]`) {
		t.Fatalf("keys made by refused calls: %d %s", status, body)
	}
	status, _, body := g.call("POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","scopes":null,"models":null}`)
	if status != 201 || !strings.Contains(string(body), `"scopes":null,"models":null`) {
		t.Fatalf("scopes and models null: %d %s, want a key with all of them", status, body)
	}
}

// The accounts are listed by id in pages, as OpenAI's list endpoints
// page, each as GET /admin/v1/accounts/{id} shows it: there was no way to
// list them (a 405).
func TestListAccountsInPages(t *testing.T) {
	g := startGateway(t)
	status, _, body := g.call("GET", "/admin/v1/accounts", "")
	if want := `{"object":"list","data":[],"first_id":null,"last_id":null,"has_more":false}`; status != 200 || string(body) != want {
		t.Fatalf("no accounts: %d %s, want %s", status, body, want)
	}
	// Byte order: upper case before lower.
	for _, create := range []string{`{"id":"beta","credit_usd":"2.50","rpm":60}`, `{"id":"Zed"}`, `{"id":"alpha"}`, `{"id":"c.d"}`} {
		if status, _, body := g.call("POST", "/admin/v1/accounts", create); status != 201 {
			t.Fatalf("create %s: %d %s", create, status, body)
		}
	}
	type page struct {
		Object  string            `json:"object"`
		Data    []json.RawMessage `json:"data"`
		FirstID *string           `json:"first_id"`
		LastID  *string           `json:"last_id"`
		HasMore bool              `json:"has_more"`
	}
	list := func(query string) page {
		t.Helper()
		status, _, body := g.call("GET", "/admin/v1/accounts"+query, "")
		var p page
		if err := json.Unmarshal(body, &p); status != 200 || err != nil || p.Object != "list" {
			t.Fatalf("GET /admin/v1/accounts%s: %d %s", query, status, body)
		}
		return p
	}
	ids := func(p page) string {
		var out []string
		for _, raw := range p.Data {
			var acc struct{ ID string }
			json.Unmarshal(raw, &acc)
			out = append(out, acc.ID)
		}
		return strings.Join(out, " ")
	}
	str := func(s *string) string {
		if s == nil {
			return "null"
		}
		return *s
	}
	for _, c := range []struct {
		query, ids, first, last string
		more                    bool
	}{
		{"", "Zed alpha beta c.d", "Zed", "c.d", false},
		{"?limit=2", "Zed alpha", "Zed", "alpha", true},
		{"?limit=2&after=alpha", "beta c.d", "beta", "c.d", false},
		{"?after=c.d", "", "null", "null", false},
		// after need not be an account: it is a place in the order.
		{"?after=b&limit=1", "beta", "beta", "beta", true},
		{"?limit=4", "Zed alpha beta c.d", "Zed", "c.d", false},
	} {
		p := list(c.query)
		if ids(p) != c.ids || str(p.FirstID) != c.first || str(p.LastID) != c.last || p.HasMore != c.more {
			t.Errorf("%s: ids %q first %s last %s has_more %v; want %q %s %s %v", c.query, ids(p), str(p.FirstID), str(p.LastID), p.HasMore,
				c.ids, c.first, c.last, c.more)
		}
	}
	// Each element is the account as GET /admin/v1/accounts/{id} answers.
	p := list("?after=alpha&limit=1")
	if _, _, one := g.call("GET", "/admin/v1/accounts/beta", ""); len(p.Data) != 1 || !bytes.Equal(p.Data[0], one) {
		t.Fatalf("listed %s, GET of the account %s", p.Data, one)
	}
	if status, _, body := g.call("HEAD", "/admin/v1/accounts", ""); status != 200 || len(body) != 0 {
		t.Fatalf("HEAD: %d %q", status, body)
	}
	if status, allow, _ := g.call("PUT", "/admin/v1/accounts", ""); status != 405 || allow != "GET, HEAD, POST" {
		t.Fatalf("PUT: %d, Allow %q", status, allow)
	}
}

// A page holds 100 accounts unless limit says otherwise, and at most 1000.
func TestListAccountsDefaultPage(t *testing.T) {
	g := startGateway(t)
	ctx := context.Background()
	for i := range 101 {
		if _, err := g.svc.CreateAccount(ctx, fmt.Sprintf("acct%03d", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		query string
		n     int
		more  bool
		last  string
	}{{"", 100, true, "acct099"}, {"?limit=1000", 101, false, "acct100"}, {"?after=acct099", 1, false, "acct100"}} {
		status, _, body := g.call("GET", "/admin/v1/accounts"+c.query, "")
		var p struct {
			Data    []json.RawMessage `json:"data"`
			LastID  string            `json:"last_id"`
			HasMore bool              `json:"has_more"`
		}
		if err := json.Unmarshal(body, &p); status != 200 || err != nil || len(p.Data) != c.n || p.HasMore != c.more || p.LastID != c.last {
			t.Fatalf("%q: %d, %d accounts, has_more %v, last %q; want %d, %v, %q", c.query, status, len(p.Data), p.HasMore, p.LastID, c.n, c.more, c.last)
		}
	}
}

// A query the list does not read is refused, naming the parameter: none
// would be ignored ("limt=5" answering 100 accounts).
func TestListAccountsRefusesABadQuery(t *testing.T) {
	g := startGateway(t)
	for _, c := range []struct{ query, param, contains string }{
		{"?limit=0", "limit", "limit must be a whole number from 1 to 1000, got \"0\""},
		{"?limit=1001", "limit", "from 1 to 1000"},
		{"?limit=ten", "limit", "from 1 to 1000"},
		{"?limit=+5", "limit", "from 1 to 1000"},
		{"?limit=010", "limit", "from 1 to 1000"},
		{"?limit=-1", "limit", "from 1 to 1000"},
		{"?limit=", "limit", "got \"\""},
		{"?limit", "limit", "got \"\""},
		{"?limit=5&limit=6", "limit", "limit is given twice"},
		{"?after=", "after", "after is empty"},
		{"?after=a%2Fb", "after", "account id must be 1-64 characters"},
		{"?after=a&after=b", "after", "after is given twice"},
		{"?limt=5", "limt", `unknown query parameter "limt" (did you mean "limit"?); this route takes limit and after`},
		{"?order=desc", "order", `unknown query parameter "order"`},
	} {
		status, _, body := g.call("GET", "/admin/v1/accounts"+c.query, "")
		if status != 400 {
			t.Fatalf("%s: %d %s, want 400", c.query, status, body)
		}
		if msg := wantError(t, body, c.param, "invalid_request_error"); !strings.Contains(msg, c.contains) {
			t.Errorf("%s: %q, want it to hold %q", c.query, msg, c.contains)
		}
	}
}

// A key is looked up by its id, revoked or not, as its element of the
// account's key list shows it: an admin with a key id from a log had to
// query ClickHouse for its account (GET was a 405).
func TestGetKeyByID(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	status, _, body := g.call("POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","scopes":["generate"],"rpm":5}`)
	var created struct {
		KeyID string `json:"key_id"`
		Key   string `json:"key"`
	}
	if err := json.Unmarshal(body, &created); status != 201 || err != nil || created.Key == "" {
		t.Fatalf("create key: %d %s", status, body)
	}
	listed := func() []byte {
		t.Helper()
		_, _, body := g.call("GET", "/admin/v1/accounts/acme/keys", "")
		var list struct{ Data []json.RawMessage }
		if err := json.Unmarshal(body, &list); err != nil || len(list.Data) != 1 {
			t.Fatalf("key list: %s", body)
		}
		return list.Data[0]
	}
	for _, revoked := range []bool{false, true} {
		if revoked {
			if status, _, body := g.call("DELETE", "/admin/v1/keys/"+created.KeyID, ""); status != 200 {
				t.Fatalf("revoke: %d %s", status, body)
			}
		}
		status, _, body := g.call("GET", "/admin/v1/keys/"+created.KeyID, "")
		if status != 200 || !bytes.Equal(body, listed()) {
			t.Fatalf("GET the key (revoked %v): %d %s; want its element of the list, %s", revoked, status, body, listed())
		}
		if !bytes.Contains(body, []byte(`"account":"acme"`)) || bytes.Contains(body, []byte(created.Key)) || bytes.Contains(body, []byte(`"key"`)) {
			t.Fatalf("GET the key: %s; want its account and never the secret", body)
		}
		if got := bytes.Contains(body, []byte(`"revoked_at":null`)); got == revoked {
			t.Fatalf("GET the key (revoked %v): %s", revoked, body)
		}
	}
	status, _, body = g.call("GET", "/admin/v1/keys/key_nothing", "")
	if msg := wantError(t, body, "", "not_found"); status != 404 || msg != "key key_nothing: not found" {
		t.Fatalf("unknown key: %d %s", status, body)
	}
	if status, _, body := g.call("HEAD", "/admin/v1/keys/"+created.KeyID, ""); status != 200 || len(body) != 0 {
		t.Fatalf("HEAD: %d %q", status, body)
	}
	if status, _, body := g.call("HEAD", "/admin/v1/keys/key_nothing", ""); status != 404 || len(body) != 0 {
		t.Fatalf("HEAD of an unknown key: %d %q", status, body)
	}
	if status, allow, _ := g.call("PUT", "/admin/v1/keys/"+created.KeyID, ""); status != 405 || allow != "DELETE, GET, HEAD" {
		t.Fatalf("PUT: %d, Allow %q", status, allow)
	}
}

// Only the accounts list looked at its query: GET /admin/v1/keys/{id}
// answered the key for "?account=other", and DELETE revoked it for
// "?dry_run=true". Every route refuses a parameter it does not read,
// naming it, before it does anything, and one with no name saying so.
func TestEveryAdminRouteRefusesAQueryItDoesNotRead(t *testing.T) {
	g := startGateway(t)
	if status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`); status != 201 {
		t.Fatalf("create account: %d %s", status, body)
	}
	status, _, body := g.call("POST", "/admin/v1/accounts/acme/keys", `{"name":"ci"}`)
	var created struct {
		KeyID string `json:"key_id"`
	}
	if err := json.Unmarshal(body, &created); status != 201 || err != nil {
		t.Fatalf("create key: %d %s", status, body)
	}
	for _, c := range []struct{ method, path, body, param, contains string }{
		{"GET", "/admin/v1/keys/" + created.KeyID + "?account=other", "", "account", `unknown query parameter "account"; this route takes no query parameters`},
		{"GET", "/admin/v1/keys/" + created.KeyID + "/?account=other", "", "account", `unknown query parameter "account"`},
		{"DELETE", "/admin/v1/keys/" + created.KeyID + "?dry_run=true", "", "dry_run", `unknown query parameter "dry_run"`},
		{"POST", "/admin/v1/accounts/acme/credit?usd=5", `{"usd":"1.00"}`, "usd", `unknown query parameter "usd"`},
		{"GET", "/admin/v1/accounts/acme?verbose", "", "verbose", `unknown query parameter "verbose"`},
		{"GET", "/admin/v1/accounts/acme/keys?limit=1", "", "limit", `unknown query parameter "limit"`},
		{"GET", "/admin/v1/upstreams?model=small", "", "model", `unknown query parameter "model"`},
		{"HEAD", "/admin/v1/keys/" + created.KeyID + "?x=1", "", "", ""},
		// "?=" was taken and "?=x" refused as unknown parameter "".
		{"GET", "/admin/v1/accounts/acme?=", "", "", `the query has a parameter with no name ("=")`},
		{"GET", "/admin/v1/accounts?=x", "", "", `the query has a parameter with no name ("=x")`},
		{"GET", "/admin/v1/accounts?limit=5&=", "", "", `a parameter with no name`},
	} {
		status, _, body := g.call(c.method, c.path, c.body)
		if status != 400 {
			t.Fatalf("%s %s: %d %s, want 400", c.method, c.path, status, body)
		}
		if c.method == "HEAD" {
			continue
		}
		if msg := wantError(t, body, c.param, "invalid_request_error"); !strings.Contains(msg, c.contains) {
			t.Errorf("%s %s: %q, want it to hold %q", c.method, c.path, msg, c.contains)
		}
	}
	_, _, body = g.call("GET", "/admin/v1/accounts/acme", "")
	if !bytes.Contains(body, []byte(`"credited_usd":"0.000000000"`)) {
		t.Fatalf("a credit refused for its query was applied: %s", body)
	}
	// A trailing slash is taken on every admin route, as it was.
	if status, _, body := g.call("GET", "/admin/v1/keys/"+created.KeyID+"/", ""); status != 200 || bytes.Contains(body, []byte(`"revoked_at":"`)) {
		t.Fatalf("a key revoked for a query it was refused for, or no key at its path with a slash: %d %s", status, body)
	}
}

// An account's created_at and a key's revoked_at had nanoseconds, a key's
// created_at whole seconds (its token's): every time the admin API
// answers is RFC 3339 in whole seconds, UTC, those of records stored with
// nanoseconds too.
func TestAdminTimesAreWholeSeconds(t *testing.T) {
	g := startGateway(t)
	wholeSecond := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`)
	times := regexp.MustCompile(`"(created_at|expires_at|revoked_at)":"([^"]*)"`)
	check := func(what string, wantTimes int, status int, body []byte) {
		t.Helper()
		found := times.FindAllSubmatch(body, -1)
		if status/100 != 2 || len(found) != wantTimes {
			t.Fatalf("%s: %d, %d times in %s; want %d", what, status, len(found), body, wantTimes)
		}
		for _, m := range found {
			if !wholeSecond.Match(m[2]) {
				t.Errorf("%s: %s %s, want whole seconds, UTC", what, m[1], m[2])
			}
		}
	}
	status, _, body := g.call("POST", "/admin/v1/accounts", `{"id":"acme"}`)
	check("create account", 1, status, body)
	status, _, body = g.call("POST", "/admin/v1/accounts/acme/keys", `{"name":"ci","expires_in":"90m"}`)
	check("create key", 2, status, body)
	var created struct {
		KeyID string `json:"key_id"`
	}
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	status, _, body = g.call("DELETE", "/admin/v1/keys/"+created.KeyID, "")
	check("revoke key", 3, status, body)
	// Stored with nanoseconds, as every release stores them: a precondition
	// of what follows, not a check (one in a billion runs lands on a whole
	// second, and proves less).
	info, err := g.svc.LookupKey(t.Context(), created.KeyID)
	if err != nil || info.RevokedAt == nil {
		t.Fatalf("the revoked key: %+v, %v; want it stored with its revoked_at", info, err)
	}
	if info.RevokedAt.Nanosecond() == 0 {
		t.Logf("revoked_at stored as %v: on a whole second, this run proves less", info.RevokedAt)
	}
	for path, n := range map[string]int{
		"/admin/v1/accounts/acme":         1,
		"/admin/v1/accounts":              1,
		"/admin/v1/accounts/acme/keys":    3,
		"/admin/v1/keys/" + created.KeyID: 3,
	} {
		status, _, body := g.call("GET", path, "")
		check("GET "+path, n, status, body)
	}
}
