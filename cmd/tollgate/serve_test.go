package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/billing"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/gatewaytest"
	"github.com/tollgate/tollgate/meter"
)

// A second gateway on the same NATS, with a data_dir of its own, finds the
// demo account made and mints no second key: each new data_dir once
// printed another live key, with a credit it never added.
func TestDemoAccountOncePerDeployment(t *testing.T) {
	g := gatewaytest.Start(t, gatewaytest.Options{NoListen: true, Config: func(_, dir string) string {
		return "server:\n  data_dir: " + dir + "\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n" +
			"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"
	}})
	ctx := context.Background()
	for range 2 {
		cfg := &config.Config{Server: config.Server{DemoCreditUSD: "5", DataDir: t.TempDir(), Listen: "127.0.0.1:8080"}}
		if err := ensureDemoAccount(ctx, cfg, g.Accounts, "127.0.0.1:8080", new(string), io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := g.Accounts.ListKeys(ctx, "demo")
	if err != nil || len(keys) != 1 {
		t.Fatalf("demo keys after two gateways' first starts: %d (%v), want 1", len(keys), err)
	}
}

// The demo key's OPENAI_BASE_URL names the address the gateway listens
// on: listen: 127.0.0.1:0 printed http://127.0.0.1:0/v1, and :15120
// printed http://:15120/v1, neither of which a client can reach.
func TestDemoKeyNamesTheListenersAddress(t *testing.T) {
	g := gatewaytest.Start(t, gatewaytest.Options{NoListen: true, Config: func(_, dir string) string {
		return "server:\n  data_dir: " + dir + "\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n" +
			"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"
	}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := &config.Config{Server: config.Server{DemoCreditUSD: "5", DataDir: t.TempDir(), Listen: "127.0.0.1:0"}}
	var out strings.Builder
	if err := ensureDemoAccount(context.Background(), cfg, g.Accounts, reachableAddr(cfg.Server.Listen, ln.Addr()), new(string), &out); err != nil {
		t.Fatal(err)
	}
	if want := "export OPENAI_BASE_URL=http://" + ln.Addr().String() + "/v1\n"; !strings.Contains(out.String(), want) {
		t.Errorf("printed %q, want %q", out.String(), want)
	}
	for _, c := range []struct {
		listen string
		ln     net.Addr
		want   string
	}{
		{":15120", &net.TCPAddr{IP: net.IPv6unspecified, Port: 15120}, "127.0.0.1:15120"},
		{"0.0.0.0:0", &net.TCPAddr{IP: net.IPv4zero, Port: 40001}, "127.0.0.1:40001"},
		{"[::]:0", &net.TCPAddr{IP: net.IPv6unspecified, Port: 40002}, "[::1]:40002"},
		{"localhost:0", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40003}, "localhost:40003"},
		{"10.1.2.3:8080", &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 8080}, "10.1.2.3:8080"},
	} {
		if got := reachableAddr(c.listen, c.ln); got != c.want {
			t.Errorf("listen %s on %s: %s, want %s", c.listen, c.ln, got, c.want)
		}
	}
}

// A process with another billing.usage_retention changes the shared
// stream's for every process, and says so.
func TestUsageRetentionChangeIsLogged(t *testing.T) {
	g := gatewaytest.Start(t, gatewaytest.Options{NoListen: true, Config: func(_, dir string) string {
		return "server:\n  data_dir: " + dir + "\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n" +
			"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"
	}})
	var logged []string
	logf := func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) }
	for _, retention := range []time.Duration{168 * time.Hour, 168 * time.Hour, 2 * time.Hour} {
		cfg := &config.Config{Billing: config.Billing{UsageRetention: retention}}
		if err := declareUsageStream(context.Background(), cfg, g.Broker, logf); err != nil {
			t.Fatal(err)
		}
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "2h0m0s, not 168h0m0s") {
		t.Fatalf("logged %q, want one line for the change to 2h", logged)
	}
}

// keys create with -scopes or -models given but empty is refused before
// anything is sent: read as "all", a script's unset variable minted a key
// that may call everything.
func TestKeysCreateRefusesAnEmptyList(t *testing.T) {
	for _, flagName := range []string{"-scopes", "-models"} {
		for _, v := range []string{"", " , "} {
			err := runKeys([]string{"create", "acme", "-name", "c", flagName, v, "-url", "http://127.0.0.1:1", "-token", "x"})
			if err == nil || !strings.Contains(err.Error(), flagName+" is empty") {
				t.Errorf("%s %q: %v", flagName, v, err)
			}
		}
	}
}

// The billing backlog is what the consumer has not acknowledged: a
// ClickHouse outage showed nowhere on /metrics.
func TestBillingBacklogCountsUnackedMessages(t *testing.T) {
	g := gatewaytest.Start(t, gatewaytest.Options{NoListen: true, Config: func(_, dir string) string {
		return "server:\n  data_dir: " + dir + "\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n" +
			"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"
	}})
	js := g.Broker.JetStream()
	if got := billingBacklog(js); got != nil {
		t.Fatalf("no stream yet: %q", got)
	}
	ctx := context.Background()
	cfg := &config.Config{Billing: config.Billing{UsageRetention: time.Hour}}
	if err := declareUsageStream(ctx, cfg, g.Broker, t.Logf); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, meter.UsageStream, jetstream.ConsumerConfig{Durable: billing.ConsumerName, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, meter.UsageBatchSubject, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	// The consumer's pending count catches up with the stream a moment
	// after a publish: the gauge is read as a scrape would, until it does.
	deadline := time.Now().Add(3 * time.Second)
	for {
		got := string(billingBacklog(js))
		if strings.Contains(got, "tollgate_billing_backlog_messages 3\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backlog %q, want 3", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Before billing first reached ClickHouse there was no consumer, and the
// backlog was left out of /metrics however many events waited: a
// ClickHouse never reached showed nowhere. Without the consumer every
// message of the stream is its backlog, as the consumer, once made,
// delivers the whole stream.
func TestBillingBacklogWithoutConsumerIsTheStream(t *testing.T) {
	g := gatewaytest.Start(t, gatewaytest.Options{NoListen: true, Config: func(_, dir string) string {
		return "server:\n  data_dir: " + dir + "\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n" +
			"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"
	}})
	js := g.Broker.JetStream()
	ctx := context.Background()
	cfg := &config.Config{Billing: config.Billing{UsageRetention: time.Hour}}
	if err := declareUsageStream(ctx, cfg, g.Broker, t.Logf); err != nil {
		t.Fatal(err)
	}
	if got := string(billingBacklog(js)); !strings.Contains(got, "tollgate_billing_backlog_messages 0\n") {
		t.Fatalf("empty stream, no consumer: backlog %q, want 0", got)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, meter.UsageBatchSubject, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if got := string(billingBacklog(js)); !strings.Contains(got, "tollgate_billing_backlog_messages 3\n") {
		t.Fatalf("3 messages, no consumer: backlog %q, want 3", got)
	}
}

// Two files to check used to check the first and print ok.
func TestConfigCheckRefusesMoreThanOneFile(t *testing.T) {
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("server:\n  listen: 127.0.0.1:8080\nupstreams:\n  - name: default\n    base_url: http://127.0.0.1:8000/v1\nmodels:\n  - id: m\n    context_length: 10\n    max_output_length: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("server: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := runConfig([]string{"check", good}); err != nil {
		t.Fatalf("one good file: %v", err)
	}
	if err := runConfig([]string{"check", good, bad}); err == nil || !strings.Contains(err.Error(), "one config file at most") {
		t.Fatalf("two files: %v, want a usage error", err)
	}
}

// serve refuses a data_dir/admin.token under 16 bytes at start; config
// check, which README says refuses it too, did not read it.
func TestConfigCheckReadsTheAdminTokenFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	body := "upstreams:\n  - name: default\n    base_url: http://127.0.0.1:8000/v1\nmodels:\n  - id: m\n    context_length: 10\n    max_output_length: 5\n"
	write := func(server string) {
		t.Helper()
		if err := os.WriteFile(path, []byte("server:\n  data_dir: "+dir+"\n"+server+body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	if _, err := stdoutOf(t, func() error { return runConfig([]string{"check", path}) }); err != nil {
		t.Fatalf("no token file yet (serve makes one): %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := stdoutOf(t, func() error { return runConfig([]string{"check", path}) }); err == nil || !strings.Contains(err.Error(), "holds 5 bytes") {
		t.Fatalf("a 5-byte admin.token: %v, want it refused", err)
	}
	write("  admin_token: a-token-of-enough-bytes\n")
	if _, err := stdoutOf(t, func() error { return runConfig([]string{"check", path}) }); err != nil {
		t.Fatalf("admin_token set, so the file is not read: %v", err)
	}
}

// serve refuses an HTTPS_PROXY it cannot use for an https upstream (a
// socks5:// or https:// proxy, a value that is no URL) when it builds the
// upstreams, and exited on it after config check, which the Upgrading
// steps have run first, had said ok. config check refuses it in the
// same words, without the proxy's password.
func TestConfigCheckRefusesAnHTTPSProxyServeRefuses(t *testing.T) {
	for _, name := range []string{"https_proxy", "NO_PROXY", "no_proxy"} {
		t.Setenv(name, "")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(path, []byte("server:\n  data_dir: "+dir+"\n  admin_token: a-token-of-enough-bytes\n"+
		"upstreams:\n  - name: hosted\n    base_url: https://api.example.com/v1\n  - name: local\n    base_url: http://127.0.0.1:8000/v1\n"+
		"models:\n  - id: m\n    upstreams: [hosted, local]\n    context_length: 10\n    max_output_length: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for proxyURL, want := range map[string]string{
		"socks5://u:secret@127.0.0.1:1080": "upstream hosted: HTTPS_PROXY (or https_proxy) names socks5://127.0.0.1:1080, a socks5:// proxy: only http:// proxies (HTTP CONNECT) are supported",
		"https://127.0.0.1:22150":          "upstream hosted: HTTPS_PROXY (or https_proxy) names https://127.0.0.1:22150, a https:// proxy: only http:// proxies",
		"::bad":                            "upstream hosted: HTTPS_PROXY (or https_proxy) is not a proxy URL",
		"http://u:secret@proxy.corp:3128":  "",
		"proxy.corp:3128":                  "",
	} {
		t.Setenv("HTTPS_PROXY", proxyURL)
		_, err := stdoutOf(t, func() error { return runConfig([]string{"check", path}) })
		switch {
		case want == "" && err != nil:
			t.Errorf("HTTPS_PROXY=%s: %v, want ok", proxyURL, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("HTTPS_PROXY=%s: %v, want %q", proxyURL, err, want)
		case err != nil && strings.Contains(err.Error(), "secret"):
			t.Errorf("HTTPS_PROXY=%s: the password is in %q", proxyURL, err)
		}
	}
}

// A command newer than the gateway it calls says so, instead of a bare
// "no admin route" (accounts logout against a gateway of the release
// before).
func TestAdminCommandAgainstAnOlderGatewaySaysSo(t *testing.T) {
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"message":"no admin route %s","type":"not_found_error","param":null,"code":"not_found"}}`, r.URL.Path)
	}))
	defer old.Close()
	err := runAccounts([]string{"logout", "acme", "-url", old.URL, "-token", "x"})
	if err == nil || !strings.Contains(err.Error(), "older release") {
		t.Fatalf("got %v", err)
	}
}

// An empty admin.token (or one of spaces) made an empty admin token, which
// a client's empty or Unicode-space Bearer token matched: the admin API
// was open. It is refused at start.
func TestEmptyAdminTokenFileIsRefused(t *testing.T) {
	// A short one too, as server.admin_token: "x" opened the admin API to
	// a guess.
	for _, content := range []string{"", "\n  \n", "tok\x00en", "\xef\xbb\xbf\r\n", "\xe2\x80\x8b", "x\n", "tga-0123456789\n"} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := &config.Config{}
		cfg.Server.DataDir = dir
		if tok, err := loadAdminToken(cfg, false, new(string)); err == nil {
			t.Errorf("admin.token %q gave the token %q", content, tok)
		}
	}
}

// server.admin_token takes an inner space (clients send it, and it
// matches); the file refused the same token at start.
func TestAdminTokenFileTakesWhatTheSettingTakes(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte("0123456789 abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{}
	cfg.Server.DataDir = dir
	if tok, err := loadAdminToken(cfg, false, new(string)); err != nil || tok != "0123456789 abcdef" {
		t.Fatalf("got %q, %v", tok, err)
	}
}

// A failed reload left the old config serving with nothing on /metrics
// to say so: tollgate_config_last_reload_success is 0 after one.
func TestReloadMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	good := "upstreams:\n  - name: u\n    base_url: http://127.0.0.1:8000/v1\n"
	if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	w := config.NewWatcher(path, cfg, nil, func(string, ...any) {})
	if m := string(reloadMetrics(w)); !strings.Contains(m, "\ntollgate_config_last_reload_success 1\n") ||
		!strings.Contains(m, "\ntollgate_config_last_reload_timestamp_seconds 1") {
		t.Fatalf("at start:\n%s", m)
	}
	if err := os.WriteFile(path, []byte(good+"  bad: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if w.Reload() == nil {
		t.Fatal("a broken file reloaded")
	}
	if m := string(reloadMetrics(w)); !strings.Contains(m, "\ntollgate_config_last_reload_success 0\n") {
		t.Fatalf("after a failed reload:\n%s", m)
	}
}

// Every scrape of /metrics asked JetStream for the billing consumer's
// info: 16 connections scraping halved the chat throughput. A read
// serves the scrapes of the next second.
func TestBillingBacklogIsReadOnceASecond(t *testing.T) {
	var reads atomic.Int32
	c := &backlogCache{read: func() []byte {
		reads.Add(1)
		return []byte("tollgate_billing_backlog_messages 1\n")
	}}
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := string(c.Text()); got != "tollgate_billing_backlog_messages 1\n" {
				t.Errorf("text %q", got)
			}
		}()
	}
	wg.Wait()
	if n := reads.Load(); n != 1 {
		t.Fatalf("50 scrapes within a second read the backlog %d times, want 1", n)
	}
	c.mu.Lock()
	c.at = time.Now().Add(-backlogTTL)
	c.mu.Unlock()
	c.Text()
	if n := reads.Load(); n != 2 {
		t.Fatalf("a scrape after %v read the backlog %d times in all, want 2", backlogTTL, n)
	}
}

// /metrics was served only on the public listener, with no key: the
// README's "bind the listener to a private address" could not be
// followed, as clients call that listener. With server.metrics_listen
// the metrics are served there, and the public listener answers 404.
func TestMetricsListenTakesMetricsOffThePublicListener(t *testing.T) {
	g := gatewaytest.Start(t, gatewaytest.Options{Config: func(_, dir string) string {
		return "server:\n  data_dir: " + dir + "\n  metrics_listen: 127.0.0.1:0\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n" +
			"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"
	}})
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get(g.URL + "/metrics"); code != http.StatusNotFound {
		t.Errorf("public /metrics with metrics_listen set: %d %s, want 404", code, body)
	}
	if code, _ := get(g.URL + "/healthz"); code != http.StatusOK {
		t.Errorf("public /healthz: %d, want 200", code)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	serveMetrics(ln, g.Server, t.Logf)
	code, body := get("http://" + ln.Addr().String() + "/metrics")
	if code != http.StatusOK || !strings.Contains(body, "tollgate_upstream_") || !strings.Contains(body, "tollgate_requests_refused_total") {
		t.Errorf("metrics listener /metrics: %d %q", code, body)
	}
	if code, body := get("http://" + ln.Addr().String() + "/healthz"); code != http.StatusOK || body != `{"status":"ok"}` {
		t.Errorf("metrics listener /healthz: %d %q", code, body)
	}
	resp, err := http.Post("http://"+ln.Addr().String()+"/metrics", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics: %d, want 405", resp.StatusCode)
	}
}

// firstStartDir makes a new directory the working one, with a
// gateway.yaml that reads TOLLGATE_LISTEN and TOLLGATE_DATA_DIR (the
// README's example) and gives demo credit, sections between its server
// section and its upstream and model, and sets the environment of a
// first start there: TOLLGATE_LISTEN listen, TOLLGATE_DATA_DIR ./data2,
// no TOLLGATE_CONFIG or TOLLGATE_ADMIN_TOKEN. It returns the directory.
func firstStartDir(t *testing.T, listen, sections string) string {
	t.Helper()
	root := t.TempDir()
	t.Chdir(root)
	if err := os.WriteFile("gateway.yaml", []byte("server:\n  listen: ${TOLLGATE_LISTEN:-127.0.0.1:8080}\n  data_dir: ${TOLLGATE_DATA_DIR:-./data}\n  demo_credit_usd: \"5\"\n"+
		sections+
		"upstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\nmodels:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TOLLGATE_CONFIG", "")
	t.Setenv("TOLLGATE_ADMIN_TOKEN", "")
	t.Setenv("TOLLGATE_LISTEN", listen)
	t.Setenv("TOLLGATE_DATA_DIR", "./data2")
	return root
}

// make run beside another gateway takes TOLLGATE_LISTEN and
// TOLLGATE_DATA_DIR (the README's example), and its first start printed
// export lines for another terminal without them: bin/tollgate accounts
// list there read ./gateway.yaml with neither, and called 127.0.0.1:8080
// (the other gateway, or nothing). The first export block now carries
// them (once: see TestFirstStartBannerExportsTheBoundAddressOnce), and
// the admin CLI, given those lines, calls this gateway.
func TestFirstStartExportsPointTheAdminCLIAtThisGateway(t *testing.T) {
	g := gatewaytest.Start(t, gatewaytest.Options{NoListen: true, Config: func(_, dir string) string {
		return "server:\n  data_dir: " + dir + "\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n" +
			"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"
	}})
	root := firstStartDir(t, "127.0.0.1:8180", "")
	cfg, err := config.Load("gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(cfg.Server.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	bound := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8180}
	exports := cliExports(cfg, bound)
	tokenBlock, err := stderrOf(t, func() error { _, err := loadAdminToken(cfg, true, &exports); return err })
	if err != nil {
		t.Fatal(err)
	}
	var demoBlock strings.Builder
	if err := ensureDemoAccount(context.Background(), cfg, g.Accounts, "127.0.0.1:8180", &exports, &demoBlock); err != nil {
		t.Fatal(err)
	}
	// The data dir from the root: pasted into a shell elsewhere, a
	// relative one named nothing there.
	for _, want := range []string{"  export TOLLGATE_LISTEN=127.0.0.1:8180\n", "  export TOLLGATE_DATA_DIR=" + filepath.Join(root, "data2") + "\n"} {
		if !strings.Contains(tokenBlock, want) {
			t.Errorf("the admin token block lacks %q:\n%s", want, tokenBlock)
		}
		if strings.Contains(demoBlock.String(), want) {
			t.Errorf("the demo key block repeats %q:\n%s", want, demoBlock.String())
		}
	}
	if strings.Contains(tokenBlock, "TOLLGATE_CONFIG") {
		t.Errorf("the admin token block exports TOLLGATE_CONFIG for ./gateway.yaml:\n%s", tokenBlock)
	}

	// The other terminal: a shell with only what the blocks export.
	t.Setenv("TOLLGATE_LISTEN", "")
	t.Setenv("TOLLGATE_DATA_DIR", "")
	for line := range strings.Lines(tokenBlock) {
		if name, value, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "="); ok && strings.HasPrefix(strings.TrimSpace(line), "export ") {
			t.Setenv(name, value)
		}
	}
	target := adminFlags(flag.NewFlagSet("accounts", flag.ContinueOnError))
	if target.cfg == nil {
		t.Fatalf("the admin CLI in the other terminal did not load gateway.yaml: %v", target.cfgErr)
	}
	if *target.url != "http://127.0.0.1:8180" || target.cfg.Server.DataDir != filepath.Join(root, "data2") {
		t.Errorf("the admin CLI in the other terminal calls %s with the data dir %s, want http://127.0.0.1:8180 and %s", *target.url, target.cfg.Server.DataDir, filepath.Join(root, "data2"))
	}

	// A config named on the command line is exported too, quoted.
	cfg.Path = filepath.Join(root, "my gateway.yaml")
	if got, want := cliExports(cfg, bound), "  export TOLLGATE_CONFIG='"+cfg.Path+"'\n"; !strings.HasPrefix(got, want) {
		t.Errorf("cliExports = %q, want it to begin %q", got, want)
	}
	cfg.Path = "conf2.yaml"
	if got, want := cliExports(cfg, bound), "  export TOLLGATE_CONFIG="+filepath.Join(root, "conf2.yaml")+"\n"; !strings.HasPrefix(got, want) {
		t.Errorf("cliExports = %q, want it to begin %q", got, want)
	}
}

// A reload that removed every model of a key left the key refused on
// every call, and logged nothing: it names the key and its account now.
func TestKeysWithNoModelServedAreWarnedAbout(t *testing.T) {
	g := gatewaytest.Start(t, gatewaytest.Options{NoListen: true, Config: func(_, dir string) string {
		return "server:\n  data_dir: " + dir + "\nupstreams:\n  - name: u\n    base_url: http://127.0.0.1:1/v1\n" +
			"models:\n  - id: m\n    context_length: 100\n    max_output_length: 10\n"
	}})
	if _, err := g.Accounts.CreateAccount(g.Ctx, "acme", 0); err != nil {
		t.Fatal(err)
	}
	old, _, err := g.Accounts.CreateKey(g.Ctx, "acme", accounts.KeyRequest{Name: "old", Models: []string{"gone"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Accounts.CreateKey(g.Ctx, "acme", accounts.KeyRequest{Name: "served", Models: []string{"m"}}); err != nil {
		t.Fatal(err)
	}
	var logged []string
	logf := func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) }
	warnKeysWithNoModelServed(g.Accounts, &config.Config{Models: []config.Model{{ID: "m"}}}, logf)
	want := "warning: API keys limited to models gateway.yaml no longer serves, whose chat completions and responses calls are refused (1): " +
		old.KeyID + " (account acme; models gone); revoke them (tollgate keys revoke KEY_ID) and create their accounts keys for models served"
	if len(logged) != 1 || logged[0] != want {
		t.Fatalf("logged %q, want %q", logged, want)
	}
	logged = nil
	warnKeysWithNoModelServed(g.Accounts, &config.Config{Models: []config.Model{{ID: "m"}, {ID: "gone"}}}, logf)
	if len(logged) != 0 {
		t.Fatalf("with every key's models served, logged %q", logged)
	}
}
