// Package gatewaytest starts a whole gateway in the test's process, for
// tests only: an embedded NATS server on a random loopback port, the
// account store on it, a fake OpenAI-shaped upstream (proxytest), and a
// proxy.Server with the admin API and the modules the test chooses, on a
// real TCP listener. The tests of proxy, plugins, console and batch build
// their harnesses on it.
//
// It imports no module's package (plugins, console, batch): a test hands
// its modules in through Options.Modules, so the console's own tests,
// inside package console, can use it without an import cycle.
package gatewaytest

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// DefaultAdminToken is the admin token when Options.AdminToken is empty.
const DefaultAdminToken = "admin-secret"

// Options configures Start.
type Options struct {
	// Config returns the gateway.yaml text for the upstream's base URL
	// ("" without an upstream) and the data directory. Required.
	Config func(upstreamURL, dataDir string) string
	// Upstream, when set, starts a proxytest upstream with these options.
	Upstream *proxytest.Options
	// Modules returns the server's modules; it is called once NATS and
	// the accounts run, so modules can use them.
	Modules func(g *Gateway) []proxy.Module
	// AdminToken of the admin API; default DefaultAdminToken.
	AdminToken string
	// Responses shares response ids through the NATS KV
	// (proxy.OpenResponseStore), as gateways of a deployment do.
	Responses bool
	Tracer    trace.Tracer
	// Watch reloads the config file when it changes (WriteConfig).
	Watch bool
	// NoListen builds the server without serving it: URL stays empty.
	NoListen bool
	// Logf receives the gateway's log; default t.Logf.
	Logf func(format string, args ...any)
	// Recorded, when set, is called with each usage event as it is
	// recorded, on the recording goroutine (meter.NewMemory's notify).
	Recorded func(*meter.Event)
	// Join starts this gateway as another gateway of Join's deployment: on
	// Join's embedded NATS rather than one of its own, with a copy of
	// Join's signing.key. Other shared files (console.secret) are the
	// test's to copy, in Modules, or not.
	Join *Gateway
}

// Gateway is a running gateway. Its fields are for reading.
type Gateway struct {
	T          testing.TB
	Ctx        context.Context // ends at Close
	Dir        string          // data_dir, also holding gateway.yaml
	ConfigPath string
	Upstream   *proxytest.Server // nil without Options.Upstream
	Broker     *broker.Broker
	Accounts   *accounts.Service
	Recorder   *meter.Memory
	Responses  *proxy.ResponseStore // nil without Options.Responses
	Server     *proxy.Server
	URL        string // e.g. http://127.0.0.1:1234; "" with NoListen
	AdminToken string
	Client     *http.Client

	closeOnce sync.Once
	closers   []func()        // run last first
	watcher   *config.Watcher // with Options.Watch
}

// Start starts a gateway; t's cleanup closes it.
func Start(t testing.TB, o Options) *Gateway {
	t.Helper()
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Gateway{T: t, Ctx: ctx, Dir: t.TempDir(), Recorder: meter.NewMemory(o.Recorded), AdminToken: o.AdminToken,
		Client: &http.Client{Timeout: 30 * time.Second}, closers: []func(){cancel}}
	if g.AdminToken == "" {
		g.AdminToken = DefaultAdminToken
	}
	t.Cleanup(g.Close)
	upstreamURL := ""
	if o.Upstream != nil {
		g.Upstream = proxytest.NewServer(*o.Upstream)
		g.closers = append(g.closers, g.Upstream.Close)
		upstreamURL = g.Upstream.URL
	}
	g.ConfigPath = filepath.Join(g.Dir, "gateway.yaml")
	g.WriteConfig(o.Config(upstreamURL, g.Dir))
	cfg, err := config.Load(g.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	g.openStores(cfg, o)
	g.startServer(cfg, o)
	return g
}

// openStores starts NATS, the account store and, if asked, the responses
// store.
func (g *Gateway) openStores(cfg *config.Config, o Options) {
	t := g.T
	nc := config.NATS{EmbeddedListen: "127.0.0.1:0", Replicas: 1}
	if o.Join != nil {
		nc = config.NATS{URL: o.Join.Broker.ClientURL(), Replicas: 1}
		g.CopyFrom(o.Join, accounts.SigningKeyFile)
	}
	b, err := broker.Start(g.Ctx, nc, g.Dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	g.Broker = b
	g.closers = append(g.closers, b.Close)
	g.Accounts, err = accounts.Open(g.Ctx, b.JetStream(), 1, g.Dir, cfg.Auth)
	if err != nil {
		t.Fatal(err)
	}
	g.closers = append(g.closers, g.Accounts.Close)
	if !o.Responses {
		return
	}
	g.Responses, err = proxy.OpenResponseStore(g.Ctx, b.JetStream(), 1, cfg.Routing.ResponseTTL, o.Logf)
	if err != nil {
		t.Fatal(err)
	}
	g.closers = append(g.closers, g.Responses.Close)
}

// startServer builds the server with its modules and serves it.
func (g *Gateway) startServer(cfg *config.Config, o Options) {
	t := g.T
	var modules []proxy.Module
	if o.Modules != nil {
		modules = o.Modules(g)
	}
	srv, err := proxy.New(cfg, proxy.Options{Accounts: g.Accounts, Recorder: g.Recorder, Responses: g.Responses,
		Admin: admin.New(g.AdminToken, g.Accounts), Tracer: o.Tracer, Modules: modules, Logf: o.Logf})
	if err != nil {
		t.Fatal(err)
	}
	g.Server = srv
	g.closers = append(g.closers, srv.Close)
	if o.Watch {
		g.watcher = config.NewWatcher(g.ConfigPath, cfg, srv.Apply, o.Logf)
		go g.watcher.Run(g.Ctx)
	}
	if o.NoListen {
		return
	}
	ln := listen(t)
	go func() { _ = srv.Serve(ln) }()
	g.closers = append(g.closers, func() { _ = srv.Shutdown() })
	g.URL = "http://" + ln.Addr().String()
}

// Serve serves srv on a loopback port until the test ends (Shutdown in
// t's cleanup) and returns its base URL, for tests that build a
// proxy.Server of their own.
func Serve(t testing.TB, srv *proxy.Server) string {
	t.Helper()
	ln := listen(t)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// Close shuts the gateway down, the server first and NATS last. It is
// safe to call more than once.
func (g *Gateway) Close() {
	g.closeOnce.Do(func() {
		for i := len(g.closers) - 1; i >= 0; i-- {
			g.closers[i]()
		}
	})
}

// Defer has Close run f, last deferred first, among what Start opened: f
// deferred by a Modules function runs once the server has stopped and
// before NATS closes.
func (g *Gateway) Defer(f func()) { g.closers = append(g.closers, f) }

// WriteConfig replaces the config file atomically, as editors do; with
// Options.Watch the gateway reloads it at once, as on SIGHUP (the file
// watch would wait for the file to settle), and logs a refusal.
func (g *Gateway) WriteConfig(s string) {
	g.T.Helper()
	tmp := g.ConfigPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
		g.T.Fatal(err)
	}
	if err := os.Rename(tmp, g.ConfigPath); err != nil {
		g.T.Fatal(err)
	}
	if g.watcher != nil {
		_ = g.watcher.Reload() // logs its outcome
	}
}

// CopyFrom copies the file name from other's data_dir into g's, as an
// operator copies the files the gateways of a deployment share.
func (g *Gateway) CopyFrom(other *Gateway, name string) {
	g.T.Helper()
	data, err := os.ReadFile(filepath.Join(other.Dir, name))
	if err != nil {
		g.T.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(g.Dir, name), data, 0o600); err != nil {
		g.T.Fatal(err)
	}
}

// CreateAccount creates an account with credit.
func (g *Gateway) CreateAccount(id string, credit money.Nanos) {
	g.T.Helper()
	if _, err := g.Accounts.CreateAccount(g.Ctx, id, credit); err != nil {
		g.T.Fatal(err)
	}
}

// CreateKey creates a key of account and waits until the gateway's
// snapshot knows it; it returns the key's secret.
func (g *Gateway) CreateKey(account string, req accounts.KeyRequest) string {
	g.T.Helper()
	_, key, err := g.Accounts.CreateKey(g.Ctx, account, req)
	if err != nil {
		g.T.Fatal(err)
	}
	if err := g.Accounts.WaitSynced(g.Ctx); err != nil {
		g.T.Fatal(err)
	}
	return key
}
