package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/batch"
	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/console"
	"github.com/tollgate/tollgate/internal/durable"
	"github.com/tollgate/tollgate/internal/rawconn"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/plugins"
	"github.com/tollgate/tollgate/proxy"
	"github.com/tollgate/tollgate/storage"
)

func runServe(args []string) error {
	path, err := commandConfigArg(serveUsage, args)
	if err != nil {
		return err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return fmt.Errorf("loading %s:\n%w", path, err)
	}
	ignoreBrokenPipe()
	logf := log.New(os.Stderr, "", log.LstdFlags).Printf
	for _, line := range cfg.Warnings(os.Environ()) {
		logf("%s", line)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := config.CatchSIGHUP() // a reload sent while starting waits for the watcher
	// Locked before the ports are bound and anything opens a store: a
	// second serve on this data_dir is refused for that, whatever its ports.
	unlockDataDir, err := lockDataDir(cfg.Server.DataDir)
	if err != nil {
		return err
	}
	defer unlockDataDir()
	// Bound first: a port already taken must end the start before the
	// first-start work prints a demo key (shown only once) and an
	// OPENAI_BASE_URL pointing at another process.
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		return fmt.Errorf("listening on server.listen (TOLLGATE_LISTEN in gateway.yaml) %s: %w", cfg.Server.Listen, err)
	}
	defer ln.Close()
	// The upload listener too: bound after the first-start work, a taken
	// port ended the start after the demo key was printed, and the next
	// start printed none.
	var storageLn net.Listener
	if cfg.Storage.Backend == config.DefaultStorageBackend {
		if storageLn, err = net.Listen("tcp", cfg.Storage.Local.Listen); err != nil {
			return fmt.Errorf("listening for uploads on storage.local.listen (TOLLGATE_STORAGE_LISTEN in gateway.yaml) %s: %w", cfg.Storage.Local.Listen, err)
		}
		defer storageLn.Close()
		storageLn = sideListener(storageLn, 4)
	}
	var metricsLn net.Listener
	if cfg.Server.MetricsListen != "" {
		if metricsLn, err = net.Listen("tcp", cfg.Server.MetricsListen); err != nil {
			return fmt.Errorf("listening for /metrics on server.metrics_listen (TOLLGATE_METRICS_LISTEN in gateway.yaml) %s: %w", cfg.Server.MetricsListen, err)
		}
		defer metricsLn.Close()
		metricsLn = sideListener(metricsLn, 2)
	}
	if err := prepareProcess(cfg, logf); err != nil {
		return err
	}
	// Read before openAccounts makes the signing key on a first start.
	_, err = os.Stat(filepath.Join(cfg.Server.DataDir, accounts.SigningKeyFile))
	firstStart := errors.Is(err, os.ErrNotExist)
	b, svc, closeAccounts, err := openAccounts(ctx, cfg, logf)
	if err != nil {
		return err
	}
	defer closeAccounts()
	// Opened before the first-start work, as the accounts are: a gateway
	// whose console.secret is not the other gateways' stops here, before
	// it makes an admin token or a demo key.
	con, err := console.Open(ctx, console.Options{Accounts: svc, JetStream: b.JetStream(), Replicas: b.Replicas(),
		DataDir: cfg.Server.DataDir, ClickHouseDSN: cfg.ClickHouse.DSN, Logf: logf})
	if err != nil {
		return fmt.Errorf("starting the web console: %w", err)
	}
	defer con.Close()

	// Printed once, with the first of the first start's blocks.
	exports := cliExports(cfg, ln.Addr())
	adminToken, err := loadAdminToken(cfg, firstStart, &exports)
	if err != nil {
		return err
	}
	if err := ensureDemoAccount(ctx, cfg, svc, reachableAddr(cfg.Server.Listen, ln.Addr()), &exports, os.Stderr); err != nil {
		return err
	}
	rec, closeRecorder, err := openRecorder(ctx, cfg, b, svc, logf)
	if err != nil {
		return err
	}
	defer closeRecorder()
	store, stopStore, err := openStorage(ctx, cfg, storageLn, logf)
	if err != nil {
		return err
	}
	defer stopStore()
	if cfg.Storage.Backend == "local" && cfg.NATS.URL != "" {
		logf("warning: storage.backend local with an external NATS: a batch job's input stays on the gateway it was uploaded to, " +
			"and the job fails if another gateway's worker takes it up; with more than one gateway, use storage.backend s3")
	}

	jobs := &batchJobs{b: b, store: store, rec: rec, logf: logf}
	// The watcher is made first so /metrics can report its reloads; it
	// builds on the server, which exists before RunOn starts it.
	var srv *proxy.Server
	watcher := config.NewWatcher(path, cfg, func(c *config.Config) error {
		if err := srv.Apply(c); err != nil {
			return err
		}
		warnKeysWithNoModelServed(svc, c, logf)
		return nil
	}, logf)
	backlog := newBacklogCache(b.JetStream())
	metrics := func() []byte {
		m := append(metricsText(rec.Stats()), reloadMetrics(watcher)...)
		m = append(m, storeMetrics(b)...)
		return append(m, backlog.Text()...)
	}
	srv, closeServer, err := newServer(ctx, cfg, b, proxy.Options{Accounts: svc, Recorder: rec,
		Admin: admin.New(adminToken, svc), Metrics: metrics, Logf: logf,
		Modules: []proxy.Module{plugins.Module(plugins.Options{Batch: &plugins.Batch{Open: jobs.open},
			// The word vectors are copied as the server starts (36 MiB,
			// well under a second), so that a missing file is said once
			// at start, not found by the first request.
			PreloadVectors: true}), con.Module()}})
	if err != nil {
		return err
	}
	defer closeServer()
	warnKeysWithNoModelServed(svc, cfg, logf)
	if metricsLn != nil {
		serveMetrics(metricsLn, srv, logf)
	}
	workerDone := jobs.runWorker(ctx)
	// Runs before the server's modules, the store, the recorder and NATS
	// close: a job stopped here resumes from its checkpoint on another
	// worker or at next start.
	defer func() { stop(); <-workerDone }()

	go watcher.RunOn(ctx, hup)
	return serveUntilDone(ctx, srv, ln, path, cfg, b, logf)
}

// keysNamedInWarning is how many keys the warning of keys with no model
// served names: the rest it counts.
const keysNamedInWarning = 20

// warnKeysWithNoModelServed logs the keys, neither revoked nor expired,
// limited to models none of which cfg serves: every call they make is
// refused, and a reload that removed their models said nothing of them.
func warnKeysWithNoModelServed(svc *accounts.Service, cfg *config.Config, logf func(string, ...any)) {
	served := make(map[string]bool, len(cfg.Models))
	for _, m := range cfg.Models {
		served[m.ID] = true
	}
	keys := svc.KeysWithNoModelServed(func(model string) bool { return served[model] })
	if len(keys) == 0 {
		return
	}
	var named []string
	for _, k := range keys[:min(len(keys), keysNamedInWarning)] {
		named = append(named, fmt.Sprintf("%s (account %s; models %s)", k.KeyID, k.Account, strings.Join(k.Models, ", ")))
	}
	if more := len(keys) - len(named); more > 0 {
		named = append(named, fmt.Sprintf("and %d more", more))
	}
	logf("warning: API keys limited to models gateway.yaml no longer serves, whose chat completions and responses calls are refused (%d): %s; "+
		"revoke them (tollgate keys revoke KEY_ID) and create their accounts keys for models served", len(keys), strings.Join(named, "; "))
}

// prepareProcess readies what the process itself needs before anything
// opens: the GC target, the debug listener. (lockDataDir made data_dir.)
func prepareProcess(cfg *config.Config, logf func(string, ...any)) error {
	// The heap may grow to 1.5 times what is live rather than Go's default
	// of twice: the gateway's garbage is short-lived request scraps, GC is
	// under 1 % of its CPU, and the difference is about 12 MiB of RSS.
	// GOGC in the environment still decides.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(50)
	}
	// The o200k vocabulary (5 MiB of heap, 15 ms to load) is loaded by the
	// first call that counts tokens: a gateway whose upstreams report usage
	// and whose streams are not cut may never need it.
	if cfg.Server.DebugListen != "" {
		return serveDebug(cfg.Server.DebugListen, logf)
	}
	return nil
}

// openAccounts starts NATS (embedded or connected) and the account store,
// and waits until the store's snapshots are loaded. closeAll closes both,
// the store first.
func openAccounts(ctx context.Context, cfg *config.Config, logf func(string, ...any)) (*broker.Broker, *accounts.Service, func(), error) {
	// The embedded JetStream syncs to disk as often as the outbox does (its
	// default is every 2 minutes): an event leaves the outbox once
	// JetStream has it, so a power loss must not find it only there.
	b, err := broker.StartWith(ctx, cfg.NATS, cfg.Server.DataDir, logf, broker.DiskSync{
		Interval: cmp.Or(cfg.Billing.FsyncInterval, meter.DefaultFsyncInterval),
		Always:   meter.Durability(cfg.Billing.Durability) == meter.DurabilityFsync,
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("starting NATS: %w", err)
	}
	svc, err := openAccountStore(ctx, cfg, b, cfg.Server.DataDir)
	if err != nil {
		b.Close()
		return nil, nil, nil, err
	}
	return b, svc, func() { svc.Close(); b.Close() }, nil
}

// openAccountStore opens the account store on b and waits until its
// snapshots are loaded, so that a balance or key asked for is there.
// signingDir holds the signing key; "" for a process that issues and
// checks no keys.
func openAccountStore(ctx context.Context, cfg *config.Config, b *broker.Broker, signingDir string) (*accounts.Service, error) {
	svc, err := accounts.Open(ctx, b.JetStream(), b.Replicas(), signingDir, cfg.Auth)
	if err != nil {
		return nil, fmt.Errorf("opening accounts: %w", err)
	}
	syncCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := svc.WaitSynced(syncCtx); err != nil {
		svc.Close()
		return nil, fmt.Errorf("loading accounts: %w", err)
	}
	return svc, nil
}

// newServer builds the public server from opts, adding tracing and the
// shared responses store. closeAll closes the server's modules, then
// those two, responses first.
func newServer(ctx context.Context, cfg *config.Config, b *broker.Broker, opts proxy.Options) (*proxy.Server, func(), error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	tracer, stopTracing, err := startTracing(ctx, cfg.Tracing, version(), logf)
	if err != nil {
		return nil, nil, err
	}
	if tracer != nil {
		logf("tracing: spans to %s, sampling %g of calls without a traceparent (a traceparent's sampled flag decides)", config.RedactURL(cfg.Tracing.OTLPEndpoint), cfg.Tracing.SampleRatio)
	}
	flushTracing := func() {
		// Spans are best effort; a collector that accepts and never
		// answers would otherwise hold the exit past the 4 s the
		// shutdown rule leaves after shutdown_timeout.
		flush, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = stopTracing(flush)
	}
	// Which upstream created each response, shared with the other
	// gateways; written in the background, so the request path never
	// waits on NATS for it.
	responses, err := proxy.OpenResponseStore(ctx, b.JetStream(), b.Replicas(), cfg.Routing.ResponseTTL, opts.Logf)
	if err != nil {
		flushTracing()
		return nil, nil, fmt.Errorf("opening the responses bucket: %w", err)
	}
	closeAll := func() { responses.Close(); flushTracing() }
	opts.Tracer, opts.Responses = tracer, responses
	srv, err := proxy.New(cfg, opts)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return srv, func() { srv.Close(); closeAll() }, nil
}

// batchJobs is this process's batch service: the plugins module opens it
// (open is its Batch.Open) on the runtime it provides, with the NATS, the
// object store and the recorder of the process.
type batchJobs struct {
	b     *broker.Broker
	store storage.Store
	rec   meter.Recorder
	logf  func(string, ...any)
	svc   *batch.Service // set by open
}

func (j *batchJobs) open(ctx context.Context, rt batch.Runtime) (*batch.Service, error) {
	svc, err := batch.Open(ctx, j.b.JetStream(), j.store, batch.Options{
		Replicas: j.b.Replicas(), Runtime: rt, Recorder: j.rec, Logf: j.logf})
	if err != nil {
		return nil, fmt.Errorf("opening batch jobs: %w", err)
	}
	j.svc = svc
	return svc, nil
}

// runWorker runs this process's batch worker until ctx ends; workerDone
// is closed once it has.
func (j *batchJobs) runWorker(ctx context.Context) <-chan struct{} {
	workerDone := make(chan struct{})
	go func() {
		defer close(workerDone)
		if err := j.svc.RunWorker(ctx); err != nil {
			j.logf("batch worker: %v", err)
		}
	}()
	return workerDone
}

// serveUntilDone serves ln until the server fails or ctx ends,
// then waits up to server.shutdown_timeout (as configured when SIGTERM
// arrives) for open requests and streams.
func serveUntilDone(ctx context.Context, srv *proxy.Server, ln net.Listener, path string, cfg *config.Config, b *broker.Broker, logf func(string, ...any)) error {
	logf("tollgate %s listening on http://%s (config %s, data %s, NATS %s)", version(), ln.Addr(), path, cfg.Server.DataDir, b.ClientURL())
	if limit, ok := rawconn.DescriptorLimit(); ok {
		logf("serving at most %d client connections at once (the file limit is %d; the rest is kept for NATS, the outbox and upstreams: raise LimitNOFILE or ulimit -n for more)", srv.ClientConnections(), limit)
	}
	srv.CheckUpstreams() // logs each that does not answer, as the Quick start's with no upstream started
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		// The listener failed (its accept errors that are not a full
		// file table, which it waits out): the streams open still end,
		// billed, as at a SIGTERM, before the process exits. Returned at
		// once, they were cut unbilled.
		logf("serving %s failed: %v; ending the open requests and streams, billed, before exiting", ln.Addr(), err)
		shutDown(srv, srv.World().Config.Server.ShutdownTimeout, nil, logf)
		return err
	case <-ctx.Done():
	}
	// A second Ctrl-C ends the wait: NotifyContext's channel, once ctx
	// ended, kept taking SIGINT and SIGTERM and dropped them, and a
	// gateway with a stream open waited its whole shutdown_timeout.
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	shutDown(srv, srv.World().Config.Server.ShutdownTimeout, again, logf)
	return nil
}

// shutDown stops srv: it waits up to wait for open requests and streams,
// or until again receives (a second Ctrl-C or SIGTERM), then ends the
// streams still open, billed, and waits briefly for their last writes.
func shutDown(srv *proxy.Server, wait time.Duration, again <-chan os.Signal, logf func(string, ...any)) {
	logf("shutting down: waiting up to %s for open requests and streams (press Ctrl-C again to end them now, billed)", wait)
	done := make(chan struct{})
	go func() { _ = srv.Shutdown(); close(done) }()
	waited := fmt.Sprintf("waited %s", wait)
	select {
	case <-done:
		return
	case <-time.After(wait):
	case sig := <-again:
		waited = fmt.Sprintf("%s again", sig)
	}
	// Streams still open have sent part of an answer: they are ended as an
	// upstream cut would end them, so that each client gets the
	// stream_interrupted event and each call is billed (estimated) before
	// the outbox closes. Dropped with the process, they went unbilled.
	n := srv.CutStreams()
	logf("shutdown: %s; ending the %d streams still open (billed on estimated usage)", waited, n)
	if waiting := srv.CallsWithUpstreams() - int64(n); waiting > 0 {
		logf("shutdown: %d calls still wait for an upstream's answer (non-streamed, or a stream before its first event): those answered in the next %s are served and billed; the others get no answer at exit, and are not billed", waiting, 2*cutStreamsWait)
	}
	select {
	case <-done:
		return
	case <-time.After(cutStreamsWait):
	}
	// A client that stopped reading holds its relay in a write: its
	// connection is closed, the write fails, and the relay records.
	if n := srv.DropStreamClients(); n > 0 {
		logf("shutdown: closing the connections of %d clients that stopped reading", n)
	}
	select {
	case <-done:
	case <-time.After(cutStreamsWait):
		logf("shutdown: gave up waiting after %s more", cutStreamsWait)
	}
}

// dataDirLockFile is the file in data_dir a running serve holds locked.
const dataDirLockFile = "LOCK"

// errDataDirInUse is returned when another serve holds data_dir: each
// gateway process needs a data_dir of its own.
var errDataDirInUse = errors.New("data_dir in use")

const (
	// cutStreamsWait bounds the wait, after the streams were ended, for
	// their last event to be written; and again, after the connections of
	// clients that stopped reading were closed, for their usage to be
	// recorded.
	cutStreamsWait = 2 * time.Second
)

// loadAdminToken returns server.admin_token, or the token kept in the data
// dir, generating and printing it on first start, with *exports, which it
// empties then (see takeExports).
func loadAdminToken(cfg *config.Config, firstStart bool, exports *string) (string, error) {
	if cfg.Server.AdminToken != "" {
		return cfg.Server.AdminToken, nil
	}
	p := filepath.Join(cfg.Server.DataDir, "admin.token")
	if tok, err := readAdminTokenFile(p); err == nil {
		return tok, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	tok := "tga-" + hex.EncodeToString(raw)
	if err := writeFileAtomic(p, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("writing admin token: %w", err)
	}
	if !firstStart {
		// A gateway started without the token the others were given
		// answers only its own: half the admin calls of a fleet then
		// failed with 401, after a "First start" message on a data dir
		// that had served for months.
		fmt.Fprintf(os.Stderr, "\nNo admin token: server.admin_token and TOLLGATE_ADMIN_TOKEN are empty and %s was missing, so a new one was made "+
			"(the other gateways of a deployment keep theirs: give them all one with TOLLGATE_ADMIN_TOKEN):\n\n  export TOLLGATE_ADMIN_TOKEN=%s\n\n", p, tok)
		return tok, nil
	}
	fmt.Fprintf(os.Stderr, "\nFirst start: admin token (also in %s):\n\n  export TOLLGATE_ADMIN_TOKEN=%s\n%s\n", p, tok, takeExports(exports))
	return tok, nil
}

// cliExports are the export lines, each "  export NAME=value\n", that
// point bin/tollgate in another shell at this gateway: the config file
// when it is not ./gateway.yaml, and the listen address and data dir
// when the file took them from TOLLGATE_LISTEN and TOLLGATE_DATA_DIR.
// Printed with the first start's exports: without them, the admin CLI
// in the terminal those were pasted into read ./gateway.yaml with
// neither variable, and called 127.0.0.1:8080 (another gateway, or
// nothing) with ./data's token.
//
// Paths are made absolute: pasted into a shell in another directory, a
// relative one named nothing there ("open conf2.yaml: no such file").
// The listen address has the port bound, ln's: TOLLGATE_LISTEN's port 0
// (a free one) was exported as given, and the CLI called port 0.
func cliExports(cfg *config.Config, ln net.Addr) string {
	var b strings.Builder
	if cfg.Path != "gateway.yaml" {
		fmt.Fprintf(&b, "  export TOLLGATE_CONFIG=%s\n", shellQuote(absolutePath(cfg.Path)))
	}
	for _, name := range []string{"TOLLGATE_LISTEN", "TOLLGATE_DATA_DIR"} {
		if v := os.Getenv(name); v != "" && cfg.ReadsEnv(name) {
			switch name {
			case "TOLLGATE_LISTEN":
				if bound, ok := withBoundPort(v, ln); ok {
					v = bound
				}
			case "TOLLGATE_DATA_DIR":
				v = absolutePath(v)
			}
			fmt.Fprintf(&b, "  export %s=%s\n", name, shellQuote(v))
		}
	}
	return b.String()
}

// takeExports returns *exports and empties it: the export lines go with
// the first block of the first start that prints (the admin token's, else
// the demo key's). Both printed them, the same lines twice.
func takeExports(exports *string) string {
	e := *exports
	*exports = ""
	return e
}

// withBoundPort is listen, a listen address, with the port of ln, where
// it listens: "127.0.0.1:0" as "127.0.0.1:41234"; ok is false when either
// is not host:port.
func withBoundPort(listen string, ln net.Addr) (addr string, ok bool) {
	host, _, errListen := net.SplitHostPort(listen)
	_, port, errLn := net.SplitHostPort(ln.String())
	if errListen != nil || errLn != nil {
		return "", false
	}
	return net.JoinHostPort(host, port), true
}

// absolutePath is p from the root, or p where the working directory is
// unknown.
func absolutePath(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// shellQuote is s as a POSIX shell word: as it is when it holds nothing
// the shell reads specially, else in single quotes.
func shellQuote(s string) string {
	plain := s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@,+=%", r))
	})
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// readAdminTokenFile reads the admin token kept at p, as the gateway and
// the CLI both take it: without a byte order mark and edge spaces. The CLI
// trimmed spaces only, so a file an editor saved with a BOM gave the
// gateway one token and the CLI another (401).
func readAdminTokenFile(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		return "", fmt.Errorf("reading admin token: %w", err)
	}
	tok := strings.TrimSpace(strings.TrimPrefix(string(b), "\uFEFF"))
	// An empty token matched a client's empty (or Unicode-space) Bearer
	// token: the admin API was open to anyone. A made token is printable
	// ASCII; anything else here is an editor's or a copy's doing (a byte
	// order mark, a zero-width space). An inner space is printable, and
	// server.admin_token accepts it: the file refused what the setting
	// took.
	if tok == "" || strings.ContainsFunc(tok, func(r rune) bool { return r < 0x20 || r >= 0x7f }) {
		return "", fmt.Errorf("admin token file %s is empty or holds other than printable ASCII: delete it to have a new one made at start, or set TOLLGATE_ADMIN_TOKEN", p)
	}
	if len(tok) < config.MinAdminTokenBytes {
		// As server.admin_token: the token is the whole admin API.
		return "", fmt.Errorf("admin token file %s holds %d bytes, under the %d an admin credential needs: delete it to have a new one made at start, or set TOLLGATE_ADMIN_TOKEN", p, len(tok), config.MinAdminTokenBytes)
	}
	return tok, nil
}

// ensureDemoAccount creates the demo account and key on first start and
// prints the key to out, with the gateway's address addr and *exports,
// which it empties then (see takeExports); it is shown only this once.
func ensureDemoAccount(ctx context.Context, cfg *config.Config, svc *accounts.Service, addr string, exports *string, out io.Writer) error {
	credit, err := money.ParseUSD(cfg.Server.DemoCreditUSD)
	if err != nil || credit <= 0 {
		return nil
	}
	marker := filepath.Join(cfg.Server.DataDir, "demo.created")
	if _, err := os.Stat(marker); err == nil {
		return nil
	}
	writeMarker := func() error {
		return writeFileAtomic(marker, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600)
	}
	_, err = svc.CreateAccount(ctx, "demo", credit)
	if errors.Is(err, accounts.ErrExists) {
		// Another gateway on the same NATS, or an earlier data_dir, made
		// it: minting one more live key per new data_dir (and printing it
		// with a credit that was never added) is what a cluster must not do.
		fmt.Fprintf(out, "The demo account exists already (made by another gateway or an earlier data_dir); no new key. Make one with: tollgate keys create demo -name demo\n")
		return writeMarker()
	}
	if err != nil {
		return fmt.Errorf("creating demo account: %w", err)
	}
	_, token, err := svc.CreateKey(ctx, "demo", accounts.KeyRequest{Name: "demo"})
	if err != nil {
		return fmt.Errorf("creating demo key: %w", err)
	}
	if err := writeMarker(); err != nil {
		return err
	}
	fmt.Fprintf(out, "First start: demo account \"demo\" with %s USD credit. Its API key, shown only now:\n\n  export OPENAI_API_KEY=%s\n  export OPENAI_BASE_URL=http://%s/v1\n%s\n", credit, token, addr, takeExports(exports))
	return nil
}

// reachableAddr is the address a client on this machine reaches a
// gateway at that listens on ln as listen says: listen's host (loopback
// for every address) with ln's port. The address as written printed
// OPENAI_BASE_URL=http://127.0.0.1:0/v1 for port 0, which picks a free
// one, and http://:15120/v1 for no host.
func reachableAddr(listen string, ln net.Addr) string {
	addr, ok := withBoundPort(listen, ln)
	if !ok {
		addr = ln.String()
	}
	return dialable(addr)
}

// writeFileAtomic puts data at path whole or not at all, a crash
// included. Without that, a power loss soon after a first start left
// admin.token empty, and the gateway refused to start until it was
// deleted. Where the directory cannot be synced the file is still there,
// only less surely after a crash: that is good enough here.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	if err := durable.ReplaceFile(path, data, mode); err != nil && !errors.Is(err, durable.ErrDirNotSynced) {
		return err
	}
	return nil
}

// openStorage opens the object store of batch jobs. The local backend
// serves its S3-compatible upload and download endpoint on a listener of its
// own (storage.local.listen): uploads of up to 5 GB stream to disk there,
// which the API listener, which reads bodies whole, must not do.
// ln is storage.local.listen, bound by the caller for the local backend.
func openStorage(ctx context.Context, cfg *config.Config, ln net.Listener, logf func(string, ...any)) (storage.Store, func(), error) {
	store, err := storage.FromConfig(ctx, cfg, logf)
	if err != nil {
		return nil, nil, fmt.Errorf("opening object storage: %w", err)
	}
	local, ok := store.(*storage.Local)
	if !ok || ln == nil {
		return store, func() {}, nil
	}
	go func() {
		if err := local.Serve(ln); err != nil {
			logf("storage: %v", err)
		}
	}()
	logf("object storage (local) on http://%s, files in %s", ln.Addr(), filepath.Join(cfg.Server.DataDir, "objects"))
	return store, func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = local.Shutdown(c)
	}, nil
}

// outboxOptions are the billing settings of the usage outbox.
func outboxOptions(cfg *config.Config) meter.OutboxOptions {
	return meter.OutboxOptions{
		MaxBytes:       int64(cfg.Billing.OutboxMaxBytes),
		Durability:     meter.Durability(cfg.Billing.Durability),
		FsyncInterval:  cfg.Billing.FsyncInterval,
		BatchMaxEvents: cfg.Billing.PublishBatch.MaxEvents,
		BatchMaxBytes:  int(cfg.Billing.PublishBatch.MaxBytes),
	}
}

// declareUsageStream creates or updates the USAGE stream with this
// process's billing.usage_retention; every process that publishes or
// bills calls it at start.
func declareUsageStream(ctx context.Context, cfg *config.Config, b *broker.Broker, logf func(string, ...any)) error {
	var before time.Duration
	if st, err := b.JetStream().Stream(ctx, meter.UsageStream); err == nil {
		before = st.CachedInfo().Config.MaxAge
	}
	st, err := meter.EnsureUsageStream(ctx, b.JetStream(), b.Replicas(), cfg.Billing.UsageRetention)
	if err != nil {
		return fmt.Errorf("declaring the USAGE stream: %w", err)
	}
	// Every process sets the shared stream's retention at start, so one
	// with another billing.usage_retention changes it for all: say so.
	if after := st.CachedInfo().Config.MaxAge; before != 0 && after != before {
		logf("billing: the USAGE stream now keeps events for %s, not %s (billing.usage_retention of this process; keep it the same in every one)", after, before)
	}
	return nil
}

// openRecorder returns the durable usage pipeline: events go to the local
// outbox (memory-mapped, synced in the background or per answer, as
// billing.durability says), then in batches to JetStream stream USAGE. With
// clickhouse.consume_in_serve the billing consumer runs here too.
func openRecorder(ctx context.Context, cfg *config.Config, b *broker.Broker, svc *accounts.Service, logf func(string, ...any)) (*meter.Publisher, func(), error) {
	if err := declareUsageStream(ctx, cfg, b, logf); err != nil {
		return nil, nil, err
	}
	ob, err := meter.OpenOutboxWith(filepath.Join(cfg.Server.DataDir, "outbox"), outboxOptions(cfg))
	if err != nil {
		return nil, nil, fmt.Errorf("opening the usage outbox: %w", err)
	}
	pub := meter.NewPublisherWith(b.JetStream(), ob, cfg.Billing.PublishBatch.MaxDelay, logf)
	billingCtx, stopBilling := context.WithCancel(ctx)
	billingDone := make(chan struct{})
	if cfg.ClickHouse.ConsumeInServe {
		logf("billing: consuming USAGE into %s in this process (clickhouse.consume_in_serve)", config.RedactURL(cfg.ClickHouse.DSN))
		go func() {
			defer close(billingDone)
			_ = billingLoop(billingCtx, cfg, b, svc, logf, waitOnRefusedDSN) // it logs what it cannot bill
		}()
	} else {
		logf("billing: not consumed here (clickhouse.consume_in_serve false): run tollgate billing")
		close(billingDone)
	}
	return pub, func() {
		stopBilling()
		select {
		case <-billingDone:
		case <-time.After(10 * time.Second):
			// An insert or fetch that does not heed its context; what it
			// had not acknowledged is delivered again at the next start.
			logf("billing: the consumer did not stop within 10 s; exiting without it (its unacknowledged events are delivered again)")
		}
		c, cancel := context.WithTimeout(context.Background(), publisherCloseWait(b.Conn(), b.StoreError()))
		defer cancel()
		if err := pub.Close(c); err != nil {
			logf("meter: closing the publisher: %v", err) // it says which events stay in the outbox, and which could not be written
		}
	}, nil
}

// publisherCloseWait is how long closing the publisher waits for
// JetStream to acknowledge what it has sent: 10 s, but 1 s when no
// acknowledgement can come: while the connection to NATS is down, or
// while the embedded store refuses writes (storeErr, broker.StoreError),
// which nats-server answers with nothing. A gateway SIGTERMed with NATS
// down took 16 s to exit with one event unpublished, and 11 to 14 s with
// its store's disk full, past docker stop's 10 s. What is not
// acknowledged stays in the outbox for the next start either way.
func publisherCloseWait(nc *nats.Conn, storeErr error) time.Duration {
	if nc != nil && !nc.IsConnected() || storeErr != nil {
		return time.Second
	}
	return 10 * time.Second
}
