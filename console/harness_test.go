package console

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/internal/testutil"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

const adminToken = "admin-secret"

// gateway is one in-process gateway (internal/gatewaytest: real TCP,
// embedded NATS, proxytest upstream) serving the console.
type gateway struct {
	t       *testing.T
	url     string
	svc     *accounts.Service
	console *Console
	broker  *broker.Broker
	log     *logBuffer
	gw      *gatewaytest.Gateway
}

const gatewayYAML = `
server:
  listen: 127.0.0.1:0
  data_dir: %[2]s
  demo_credit_usd: "0"
upstreams:
  - name: local
    base_url: %[1]s
models:
  - id: small
    upstream: local
    upstream_model: proxytest-small
    context_length: 32768
    max_output_length: 4096
    pricing: {prompt: "0.0000001", completion: "0.0000003"}
  - id: large
    upstream: local
    upstream_model: proxytest-large
    context_length: 32768
    max_output_length: 4096
    pricing: {prompt: "0.0000005", completion: "0.000002"}
`

// logBuffer collects everything the gateway logs, to check no secret is
// ever written there.
type logBuffer struct {
	t  *testing.T
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) logf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	l.mu.Lock()
	l.b.WriteString(line + "\n")
	l.mu.Unlock()
	l.t.Log(line)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startGateway starts a gateway whose accounts "acme" (10 USD) and "other"
// (1 USD) exist. clickHouseDSN may be "" (usage unavailable).
func startGateway(t *testing.T, clickHouseDSN string) *gateway {
	t.Helper()
	return startGatewayWith(t, clickHouseDSN, "")
}

// startGatewayWith starts a gateway whose server section also holds
// serverLines (indented YAML lines, each ending in a newline).
func startGatewayWith(t *testing.T, clickHouseDSN, serverLines string) *gateway {
	t.Helper()
	return startGatewayWithSections(t, clickHouseDSN, serverLines, "")
}

// startGatewayWithSections is startGatewayWith whose config also holds
// sections (top-level YAML, such as a plugins section).
func startGatewayWithSections(t *testing.T, clickHouseDSN, serverLines, sections string) *gateway {
	t.Helper()
	g := startGatewayOn(t, clickHouseDSN, serverLines, sections, nil)
	for id, credit := range map[string]money.Nanos{"acme": 10 * money.NanosPerUSD, "other": money.NanosPerUSD} {
		g.gw.CreateAccount(id, credit)
	}
	return g
}

// startSecondGateway starts another gateway of first's deployment: on its
// NATS, with copies of its signing.key and console.secret.
func startSecondGateway(t *testing.T, first *gateway) *gateway {
	t.Helper()
	return startGatewayOn(t, "", "", "", first)
}

// startGatewayOn starts a gateway; with join, as another gateway of
// join's deployment.
func startGatewayOn(t *testing.T, clickHouseDSN, serverLines, sections string, join *gateway) *gateway {
	t.Helper()
	g := &gateway{t: t, log: &logBuffer{t: t}}
	var joinGateway *gatewaytest.Gateway
	if join != nil {
		joinGateway = join.gw
	}
	gw := gatewaytest.Start(t, gatewaytest.Options{
		Join:     joinGateway,
		Upstream: &proxytest.Options{Chunks: 3, PromptTokens: 8, CompletionTokens: 3},
		Config: func(upstream, dir string) string {
			return strings.Replace(fmt.Sprintf(gatewayYAML, upstream, dir), "server:\n", "server:\n"+serverLines, 1) + sections
		},
		Modules: func(gw *gatewaytest.Gateway) []proxy.Module {
			if joinGateway != nil {
				gw.CopyFrom(joinGateway, SecretFile)
			}
			var err error
			g.console, err = Open(gw.Ctx, Options{Accounts: gw.Accounts, JetStream: gw.Broker.JetStream(), Replicas: 1,
				DataDir: gw.Dir, ClickHouseDSN: clickHouseDSN, Logf: g.log.logf})
			if err != nil {
				t.Fatal(err)
			}
			gw.Defer(g.console.Close)
			return []proxy.Module{g.console.Module()}
		},
		AdminToken: adminToken, Logf: g.log.logf,
	})
	g.url, g.svc, g.broker, g.gw = gw.URL, gw.Accounts, gw.Broker, gw
	return g
}

// loginURL asks the admin API for a sign-in link.
func (g *gateway) loginURL(account string) string {
	g.t.Helper()
	resp := g.admin("POST", "/admin/v1/accounts/"+account+"/console-login")
	body := readAll(g.t, resp)
	if resp.StatusCode != 201 {
		g.t.Fatalf("console-login: %d %s", resp.StatusCode, body)
	}
	var out struct {
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		g.t.Fatal(err)
	}
	return out.URL
}

func (g *gateway) admin(method, path string) *http.Response {
	g.t.Helper()
	req, err := http.NewRequest(method, g.url+path, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	return resp
}

// browser is a cookie-keeping HTTP client that does not follow redirects,
// so tests see each answer.
type browser struct {
	t      *testing.T
	g      *gateway
	client *http.Client
}

func (g *gateway) browser() *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		g.t.Fatal(err)
	}
	return &browser{t: g.t, g: g, client: &http.Client{
		Jar:           jar,
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// signIn follows a sign-in link as a person would: open it, press the
// button.
func (b *browser) signIn(account string) {
	b.t.Helper()
	link := b.g.loginURL(account)
	status, body := b.get(strings.TrimPrefix(link, b.g.url))
	if status != 200 || !strings.Contains(body, `id="login-account">`+account+`<`) {
		b.t.Fatalf("sign-in page: %d %s", status, body)
	}
	resp := b.post("/console/login", url.Values{"token": {tokenOf(b.t, link)}})
	if body := readAll(b.t, resp); resp.StatusCode != 303 || resp.Header.Get("Location") != "/console" {
		b.t.Fatalf("sign in: %d %s", resp.StatusCode, body)
	}
}

func tokenOf(t *testing.T, link string) string {
	t.Helper()
	u, err := url.Parse(link)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query().Get("token")
}

func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	resp, err := b.client.Get(b.g.url + path)
	if err != nil {
		b.t.Fatal(err)
	}
	return resp.StatusCode, string(readAll(b.t, resp))
}

// post sends a form as a browser does from the console's own page.
func (b *browser) post(path string, form url.Values, header ...string) *http.Response {
	b.t.Helper()
	req, err := http.NewRequest("POST", b.g.url+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.g.url)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	return resp
}

// csrf reads the form token from a console page.
func (b *browser) csrf() string {
	b.t.Helper()
	_, body := b.get("/console/keys")
	const marker = `name="csrf" value="`
	i := strings.Index(body, marker)
	if i < 0 {
		b.t.Fatalf("no csrf field on /console/keys: %s", body)
	}
	rest := body[i+len(marker):]
	return rest[:strings.IndexByte(rest, '"')]
}

// keyForm is the key form as the API keys page gives it (its csrf and
// one-time form_token) with fields filled in.
func (b *browser) keyForm(fields url.Values) url.Values {
	b.t.Helper()
	_, body := b.get("/console/keys")
	form := url.Values{}
	for _, name := range []string{"csrf", "form_token"} {
		marker := `name="` + name + `" value="`
		i := strings.Index(body, marker)
		if i < 0 {
			b.t.Fatalf("no %s field on /console/keys: %s", name, body)
		}
		rest := body[i+len(marker):]
		form.Set(name, rest[:strings.IndexByte(rest, '"')])
	}
	for name, values := range fields {
		form[name] = values
	}
	return form
}

// createKey sends form, a key form, and returns the key the "Key created"
// page shows and what it verifies as.
func (b *browser) createKey(form url.Values) (string, *accounts.Key) {
	b.t.Helper()
	resp := b.post("/console/keys", form)
	page := string(readAll(b.t, resp))
	if resp.StatusCode != 200 || !strings.Contains(page, `id="new-key"`) {
		b.t.Fatalf("create: %d %s", resp.StatusCode, page)
	}
	token := between(page, `id="new-key" class="secret" readonly autocomplete="off" spellcheck="false" value="`, `"`)
	key, err := b.g.svc.Verify([]byte(token))
	if err != nil {
		b.t.Fatalf("the shown key does not verify: %v", err)
	}
	return token, key
}

func (b *browser) cookie() *http.Cookie {
	u, _ := url.Parse(b.g.url + "/console")
	for _, c := range b.client.Jar.Cookies(u) {
		if c.Name == cookieName {
			return c
		}
	}
	return nil
}

func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkFor polls fn until it returns nil or total passes.
var checkFor = testutil.CheckFor
