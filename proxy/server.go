// Package proxy is the gateway's HTTP edge: the fasthttp server, routing,
// authentication, the error envelope, the upstream client and the
// chat/responses forwarding with its SSE relay. Endpoints it does not name
// (plugins, the console) are modules of the server (module.go), listed in
// Options.Modules, provisioned for each configuration and swapped in with
// it.
package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/loglimit"
	"github.com/tollgate/tollgate/internal/rawconn"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
)

// Accounts is what the request path needs from the account store: both
// calls answer from memory.
type Accounts interface {
	Verify(token []byte) (*accounts.Key, error)
	Balance(account string) (money.Nanos, bool)
	// Standing is Balance, the account's own limits and what counts its
	// calls in flight.
	Standing(account string) (money.Nanos, accounts.Limits, *accounts.Live, bool)
	Debited(account string) (money.Nanos, bool)
	// NoteCharge counts a metered cost against Balance until the
	// account's debits show it.
	NoteCharge(account string, cost money.Nanos)
	// KeyInfo carries the key's request-logging settings.
	KeyInfo(keyID string) (accounts.KeyInfo, bool)
}

// World is everything a request reads from configuration, built whole from
// one config and swapped in atomically; a request keeps the World it started
// with until it ends.
type World struct {
	Config    *config.Config
	Catalog   *catalog.Catalog
	upstreams map[string]*upstream
	pools     map[string]*pool // by model id
	grace     money.Nanos
}

// Options configures a Server.
type Options struct {
	Accounts Accounts
	Recorder meter.Recorder
	// Admin serves /admin/ (package admin); nil disables the admin API.
	Admin AdminHandler
	// Responses remembers which upstream created each response, shared
	// with other gateways through JetStream KV (OpenResponseStore); nil
	// remembers in this process only.
	Responses *ResponseStore
	// Metrics renders GET /metrics (Prometheus text); nil serves none.
	Metrics func() []byte
	// Tracer traces generation calls (proxy/tracing.go); nil traces none.
	Tracer trace.Tracer
	// Modules serve the routes proxy does not name (module.go), started
	// and provisioned in this order.
	Modules []Module
	Logf    func(format string, args ...any)
}

// Server is the public listener.
type Server struct {
	world     atomic.Pointer[World]
	accounts  Accounts
	recorder  meter.Recorder
	admin     AdminHandler
	metrics   func() []byte
	logf      func(string, ...any)
	modules   []Module
	mods      atomic.Pointer[moduleSet] // the routes of the last provisioning
	ctx       context.Context           // ends at Close
	cancel    context.CancelFunc
	stops     []func() // of the modules' Start, in start order
	applyMu   sync.Mutex
	closed    bool // under applyMu: Close ran, Apply provisions nothing more
	limits    *limiter
	responses *ResponseStore
	calls     *callMetrics
	tracer    trace.Tracer
	http      *fasthttp.Server
	streams   openStreams

	// phase is phaseStarting until Serve, phaseDraining from Shutdown
	// (Readiness).
	phase atomic.Int32
	// billing is the Recorder when it can say it refuses events.
	billing billingRefusal

	// connCap is how many client connections the API listener holds
	// open at once (clientConnectionCap); 0 leaves them uncapped.
	connCap      int
	refusedConns atomic.Uint64    // connections answered 503 at the cap
	refusedLog   loglimit.Limiter // the lines saying so

	// metricsElsewhere: server.metrics_listen serves /metrics, and the
	// public listener does not (restart-only, so read once in New).
	metricsElsewhere bool
}

// New builds a server for cfg, starts its modules and provisions them.
// Apply swaps in later configs; Close stops the modules.
func New(cfg *config.Config, opts Options) (*Server, error) {
	s := &Server{
		accounts:  opts.Accounts,
		recorder:  opts.Recorder,
		admin:     opts.Admin,
		metrics:   opts.Metrics,
		logf:      opts.Logf,
		modules:   opts.Modules,
		limits:    newLimiter(),
		responses: opts.Responses,
		calls:     newCallMetrics(),
		tracer:    opts.Tracer,

		metricsElsewhere: cfg.Server.MetricsListen != "",
		connCap:          clientConnections(),
	}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	s.billing, _ = opts.Recorder.(billingRefusal)
	if s.responses == nil {
		s.responses = newResponseStore(nil, cfg.Routing.ResponseTTL, s.logf)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	w, err := s.buildWorld(cfg)
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.install(w)
	// A revoked key's open streams end at once, not when their upstream
	// is done generating.
	if r, ok := opts.Accounts.(interface{ OnKeyRevoked(func(string)) }); ok {
		r.OnKeyRevoked(func(keyID string) { s.EndStreamsOfKey(keyID) })
	}
	if err := s.start(); err != nil {
		retireUnshared(w, nil) // no server will ever use its pools
		return nil, err
	}
	set, err := s.provision(w)
	if err != nil {
		s.stopModules()
		retireUnshared(w, nil)
		return nil, err
	}
	s.mods.Store(set)
	s.http = &fasthttp.Server{
		Handler:      s.handle,
		ErrorHandler: s.handleParseError,
		Name:         serverName,
		// Bodies are streamed to the handler, which reads them itself
		// (readRequestBody): read whole, fasthttp allocated a buffer of the
		// request's Content-Length before it had a byte of the body, so a
		// hundred bytes of headers, without a key, held 16 MiB for the
		// 60 s ReadTimeout. Streamed, memory grows only as bytes arrive.
		// fasthttp reads the first 8 KiB before the handler runs and
		// leaves a body over this limit to it: handle answers the 413.
		StreamRequestBody:  true,
		MaxRequestBodySize: int(min(cfg.Server.MaxRequestBody, 2<<30)),
		// A multipart body would otherwise be parsed, files spilled to
		// temporary files, before any handler or key check; no API route
		// takes one (batch files go to the storage listener).
		DisablePreParseMultipartForm: true,
		// A client that asks before sending (Expect: 100-continue, as curl
		// does past 1 MiB) is told at once what it would be told after the
		// upload: 413 for a body over the limit, and what its headers earn
		// (refusalFromHeaders), not "100 Continue". fasthttp writes the
		// response as set here, and closes the connection after it.
		ExpectHandler: s.expectContinue,
		// ReadTimeout bounds reading one request; WriteTimeout must stay
		// zero, it would cap every streamed response.
		ReadTimeout:                   requestReadTimeout,
		IdleTimeout:                   120 * time.Second,
		NoDefaultContentType:          true,
		DisableHeaderNamesNormalizing: false,
		CloseOnShutdown:               true,
		ReadBufferSize:                16 << 10,
		// As big as a coalesced relay write (maxCoalesced), so the
		// headers and the first events leave in one system call; the
		// writers are pooled, held only while a response is written.
		WriteBufferSize: maxCoalesced,
		// Without it fasthttp quotes the headers of a request it cannot
		// parse in the log (and in the 400), Authorization included.
		SecureErrorLogMessage: true,
		Logger:                newFasthttpLogger(s.logf),
		// Concurrency stays fasthttp's default: the listener caps the
		// connections itself (Serve), since past fasthttp's cap a
		// connection got fasthttp's plain-text 503.
	}
	return s, nil
}

// serverName is the Server header of every answer.
const serverName = "tollgate"

// clientConnectionCap is how many client connections the API listener
// serves at once, given the process's file limit: half of what is left
// after a reserve (a quarter of the limit, between 64 and 4096) for the
// embedded NATS server's files, the outbox and the other listeners,
// since each client connection may need an upstream connection too.
// Uncapped, a few hundred idle connections, which need no key, took
// every descriptor under a low limit: the listener waited for them (see
// rawconn.Listener), but the embedded NATS server could not open its
// files, failed its streams' writes until a restart, and billing
// stopped. An unknown limit leaves fasthttp's default.
func clientConnectionCap(limit uint64, known bool) int {
	if !known || limit == 0 {
		return 0
	}
	reserve := rawconn.Reserve(limit)
	if limit <= reserve+32 {
		return 16 // a limit too low to serve with: a few calls still get through
	}
	return int(min((limit-reserve)/2, fasthttp.DefaultConcurrency))
}

// clientConnections is the cap of a new server: clientConnectionCap of
// the process's file limit (a variable for the tests, which cannot lower
// that limit without lowering it for every test beside them).
var clientConnections = func() int { return clientConnectionCap(rawconn.DescriptorLimit()) }

// ClientConnections is how many client connections the API listener
// serves at once (clientConnectionCap).
func (s *Server) ClientConnections() int { return s.connCap }

// refuseConnection answers a connection past the client connection cap
// before any request is read, and closes it: a 503 in the error envelope,
// to be retried in a second. Past fasthttp's own cap the answer was plain
// text ("The connection cannot be served because Server.Concurrency limit
// exceeded"), which the OpenAI SDKs showed as an unparsed body. It runs
// on the accepting goroutine, as fasthttp's answer did: a few hundred
// bytes to a new connection's empty send buffer do not wait, and the
// deadline bounds a write that would.
func (s *Server) refuseConnection(c net.Conn) {
	s.refusedConns.Add(1)
	var resp fasthttp.Response
	setError(&resp, errOverloaded(s.connCap))
	resp.Header.SetServer(serverName)
	resp.Header.Set("x-request-id", newRequestID())
	resp.SetConnectionClose()
	_ = c.SetWriteDeadline(time.Now().Add(refusalWriteWait))
	_, _ = resp.WriteTo(c)
	_ = c.Close()
	if ok, held := s.refusedLog.Allow(time.Now(), time.Minute); ok {
		s.logf("http: a client connection was answered 503 and closed: %d are open, the most the API listener serves at once; raise the process's file limit (LimitNOFILE, ulimit -n): the gateway serves at most half of it, less a reserve, at once%s",
			s.connCap, loglimit.HeldNote(held, "connections refused since the last line"))
	}
}

// refusalWriteWait bounds the write of refuseConnection's answer.
const refusalWriteWait = 100 * time.Millisecond

// errOverloaded is the 503 of a connection past the client connection
// cap (refuseConnection).
func errOverloaded(limit int) *APIError {
	return &APIError{Status: fasthttp.StatusServiceUnavailable, Type: "service_unavailable_error", Code: "server_overloaded", RetryAfter: time.Second,
		Message: fmt.Sprintf("the gateway holds as many client connections as it serves at once (%d); try again shortly", limit)}
}

// Apply builds the World for cfg, provisions the modules for it and swaps
// both in, then cleans up the modules' previous routes. It is the build
// step of config.Watcher: on error nothing changes. Upstreams whose
// settings did not change keep their connection pools.
func (s *Server) Apply(cfg *config.Config) error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if s.closed {
		return errors.New("the server is closed")
	}
	w, err := s.buildWorld(cfg)
	if err != nil {
		return err
	}
	set, err := s.provision(w)
	if err != nil {
		retireUnshared(w, s.world.Load())
		return err
	}
	s.install(w)
	if old := s.mods.Swap(set); old != nil {
		old.cleanup()
	}
	return nil
}

// buildWorld builds the World for cfg, taking over the upstreams of the
// World in force whose settings did not change, and the health, the
// calls in flight and (at the same address) the connections in use of
// those whose settings did. Those connections stay with the old pool,
// closed as their calls end: they were opened with the old timeouts.
func (s *Server) buildWorld(cfg *config.Config) (*World, error) {
	cat, err := catalog.New(cfg.Models)
	if err != nil {
		return nil, err
	}
	grace, err := money.ParseUSD(cfg.Billing.GraceUSD)
	if err != nil {
		return nil, fmt.Errorf("billing.grace_usd: %w", err)
	}
	w := &World{Config: cfg, Catalog: cat, grace: grace, upstreams: make(map[string]*upstream, len(cfg.Upstreams))}
	old := s.world.Load()
	for _, uc := range cfg.Upstreams {
		var prev *upstream
		if old != nil {
			prev = old.upstreams[uc.Name]
		}
		if prev != nil && prev.cfg == uc {
			w.upstreams[uc.Name] = prev
			continue
		}
		up, err := newUpstream(uc, s.logf)
		if err != nil {
			return nil, err
		}
		if prev != nil {
			up.health.carryFrom(&prev.health, prev.cfg.BaseURL == uc.BaseURL)
			up.pool.inheritSlots(prev.pool)
			up.adoptTLSSessions(prev)
		}
		w.upstreams[uc.Name] = up
	}
	w.pools = make(map[string]*pool, len(cfg.Models))
	for _, e := range cat.Entries() {
		w.pools[e.ID] = newPool(e.Pool, w.upstreams)
	}
	return w, nil
}

// install puts w in force and retires the upstreams of the previous World
// that w does not keep.
func (s *Server) install(w *World) {
	old := s.world.Swap(w)
	for _, up := range w.upstreams {
		up.setProbeInterval(w.Config.Routing.ProbeInterval)
	}
	// An upstream rebuilt by an edit that carried an ejection over is
	// probed again: the probe of its old self ends with the retirement,
	// and without one it stayed out until a trial call found it back.
	for name, up := range w.upstreams {
		var prev *upstream
		if old != nil {
			prev = old.upstreams[name]
		}
		if prev == up {
			continue
		}
		up.logEgress(prev)
		if up.health.state.Load() != stateClosed && !up.health.resting.Load() {
			up.startProbing()
		}
	}
	s.responses.setTTL(w.Config.Routing.ResponseTTL)
	retireUnshared(old, w)
	s.calls.forgetRetired(old, w)
}

// retireUnshared retires the upstreams of from that keep does not hold:
// they take no new calls and keep no idle connections.
func retireUnshared(from, keep *World) {
	if from == nil {
		return
	}
	for name, up := range from.upstreams {
		if keep == nil || keep.upstreams[name] != up {
			up.retired.Store(true)
			up.pool.retire()
		}
	}
}

// World returns the configuration snapshot in force.
func (s *Server) World() *World { return s.world.Load() }

// Grace is how far below zero a balance may go before calls are refused
// (billing.grace_usd).
func (w *World) Grace() money.Nanos { return w.grace }

// Serve accepts connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.phase.CompareAndSwap(phaseStarting, phaseServing)
	return s.http.Serve(rawconn.NewListener(ln, s.logf).Capped(s.connCap, s.refuseConnection))
}

// Shutdown stops accepting and waits for open requests, streams included.
// /readyz answers 503 from its start, not once the wait is over.
func (s *Server) Shutdown() error {
	s.phase.Store(phaseDraining)
	return s.http.Shutdown()
}

// requestReadTimeout bounds the reading of one request, headers and body.
var requestReadTimeout = 60 * time.Second

// expectContinue answers Expect: 100-continue: StatusContinue, or the
// status of the refusal it has written.
func (s *Server) expectContinue(ctx *fasthttp.RequestCtx) int {
	refusal, limit, unread := s.refusalFromHeaders(ctx, ctx.Path())
	switch {
	case int64(ctx.Request.Header.ContentLength()) > limit:
		refusal = errBodyOver(ctx.Path(), limit, s.isRouteCap(limit))
	case refusal == nil && unread:
		// A route that reads no body is answered now, the body never
		// asked for: 100 Continue had GET /v1/models's client send it.
		s.handle(ctx)
		return ctx.Response.StatusCode()
	case refusal == nil:
		return fasthttp.StatusContinue
	}
	refuseUnread(ctx, refusal)
	return refusal.Status
}

// errRequestTimeout is a request whose headers or body stopped coming
// before requestReadTimeout.
func errRequestTimeout() *APIError {
	return &APIError{Status: fasthttp.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
		Message: "the request was not received whole within " + requestReadTimeout.String()}
}

// errRequestTooLarge is the 413 of a request body over max_request_body.
func errRequestTooLarge(limit int64) *APIError {
	return errTooLarge(fmt.Sprintf("request body is larger than server.max_request_body (%d bytes)", limit))
}

// isRouteCap says whether limit, a route's body cap, is its own
// (Route.MaxBody, adminMaxBody) rather than server.max_request_body.
func (s *Server) isRouteCap(limit int64) bool {
	return limit < int64(s.world.Load().Config.Server.MaxRequestBody)
}

// errBodyOver is the 413 of a body over limit on path; routeCap says the
// limit is the route's own (Route.MaxBody, adminMaxBody), under
// server.max_request_body, which that setting would not raise.
func errBodyOver(path []byte, limit int64, routeCap bool) *APIError {
	if !routeCap {
		return errRequestTooLarge(limit)
	}
	if bytes.HasPrefix(path, []byte("/v1/")) {
		// The plugin endpoints' caps are what their fields can hold.
		return errTooLarge(fmt.Sprintf("request body is larger than %s takes: at most %d bytes, what its fields may hold, every byte escaped", path, limit))
	}
	return errTooLarge(fmt.Sprintf("request body is larger than %s takes: at most %d bytes", path, limit))
}

func (s *Server) handleParseError(ctx *fasthttp.RequestCtx, err error) {
	// Every response carries one, as the README promises: these are
	// answered before the handler gives one.
	ctx.Response.Header.Set("x-request-id", newRequestID())
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		WriteError(ctx, errRequestTooLarge(int64(s.world.Load().Config.Server.MaxRequestBody)))
		return
	}
	var small *fasthttp.ErrSmallBuffer
	if errors.As(err, &small) {
		WriteError(ctx, &APIError{Status: 431, Type: "invalid_request_error", Code: "headers_too_large", Message: "request headers are too large"})
		return
	}
	if isTimeout(err) {
		// A body announced and never sent, or headers trickled in: the
		// wait ran out, nothing was malformed. The error's text named both
		// ends' addresses.
		WriteError(ctx, errRequestTimeout())
		return
	}
	WriteError(ctx, BadRequest("", "malformed HTTP request: "+redactSecrets(err.Error())))
}

// fasthttpLogger routes fasthttp's own messages (malformed requests,
// connections it could not serve) to the gateway's log, redacted, and at
// most one every fasthttpLogEvery after the first, saying how many it
// left out: a line per malformed request, which needs no key, let one
// client write 6,000 lines a second.
type fasthttpLogger struct {
	logf  func(string, ...any)
	every time.Duration
	now   func() time.Time
	limit loglimit.Limiter
}

// fasthttpLogEvery is the least time between two lines of fasthttp's.
const fasthttpLogEvery = 10 * time.Second

func newFasthttpLogger(logf func(string, ...any)) *fasthttpLogger {
	return &fasthttpLogger{logf: logf, every: fasthttpLogEvery, now: time.Now}
}

// Printf redacts secrets: fasthttp quotes a malformed header line whole,
// and "Authorization Bearer tg-…" without its colon is one.
func (l *fasthttpLogger) Printf(format string, args ...any) {
	ok, left := l.limit.Allow(l.now(), l.every)
	if !ok {
		return
	}
	line := redactSecrets(fmt.Sprintf("http: "+format, args...))
	// Server.Concurrency is no setting of the gateway's: it is set from
	// the file limit (clientConnectionCap).
	line = strings.Replace(line, "Try increasing Server.Concurrency", "Raise the process's file limit (LimitNOFILE, ulimit -n): the gateway serves at most half of it, less a reserve, at once", 1)
	if left > 0 {
		line += fmt.Sprintf(" (and %d more lines of fasthttp's since the last, of any kind, not logged; at most one every %s)", left, l.every)
	}
	l.logf("%s", line)
}

// secretPattern matches, each with its value in a group of its own: a
// credential header's value (Authorization, Proxy-Authorization, Cookie,
// Set-Cookie, X-Api-Key, api-key), whatever its format, with or without
// the header's colon, up to the end of the quoted line fasthttp shows;
// a Bearer or Basic credential; API keys (tg-), admin tokens (tga-) and
// console sign-in tokens (tgl-), whole or cut off; a bare JWT (header
// and claims both "eyJ", a JSON object), which is an API key without its
// tg- prefix, under whatever header name; and the console's session
// cookie. An admin token may be any string of 16 bytes (the README
// suggests openssl rand -hex 16), so the prefixes alone let
// "Authorization Bearer <token>" without its colon reach the log whole.
var secretPattern = regexp.MustCompile(`(?i)` +
	`\b(?:proxy-authorization|authorization|set-cookie|cookie|x-api-key|api-key)(?:\s*:\s*|\s+)(?:(?:bearer|basic)\s+)?((?:\\.|[^"\\\r\n])+)` +
	`|\b(?:bearer|basic)\s+((?:\\.|[^"\\\s])+)` +
	`|\b(tg[al]?-[a-z0-9_.\-]{6,})` +
	`|\b(eyJ[a-z0-9_\-]+\.eyJ[a-z0-9_.\-]*)` +
	`|\btollgate_console=([^;\s"]+)`)

// keyPrefix is the prefix of a Tollgate key or token, kept when its value
// is redacted: it says which kind of credential the client sent.
var keyPrefix = regexp.MustCompile(`(?i)^tg[al]?-`)

// redactSecrets replaces the value of every credential in s by
// "[redacted]" (after its tg-, tga- or tgl- prefix), for text bound for a
// log or an error message.
func redactSecrets(s string) string {
	matches := secretPattern.FindAllStringSubmatchIndex(s, -1)
	if matches == nil {
		return s
	}
	var b strings.Builder
	last := 0
	for _, m := range matches {
		value := 2 // the first group that matched holds the value
		for m[value] < 0 {
			value += 2
		}
		from := m[value] + len(keyPrefix.FindString(s[m[value]:m[value+1]]))
		b.WriteString(s[last:from])
		b.WriteString("[redacted]")
		last = m[value+1]
	}
	b.WriteString(s[last:])
	return b.String()
}

// newRequestID returns a UUIDv7: time-ordered, so ClickHouse keeps an
// account's events close together. Its 74 random bits come from the
// runtime's per-thread ChaCha8 generator (math/rand/v2, seeded by the
// OS), not crypto/rand: an id needs to be unique, not secret, and
// uuid.NewV7 took 2 % of the gateway's CPU under load, most of it there.
func newRequestID() string {
	var id uuid.UUID
	binary.BigEndian.PutUint64(id[0:8], uint64(time.Now().UnixMilli())<<16|rand.Uint64()&0xffff)
	binary.BigEndian.PutUint64(id[8:16], rand.Uint64())
	id[6] = 0x70 | id[6]&0x0f // version 7
	id[8] = 0x80 | id[8]&0x3f // RFC 4122 variant
	return id.String()
}
