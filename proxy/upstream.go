package proxy

import (
	"bytes"
	"context"
	cryptotls "crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/loglimit"
	"github.com/tollgate/tollgate/internal/rawconn"
	"github.com/tollgate/tollgate/internal/utf8cut"
)

// upstream is one generation server and its connection pool. It is immutable;
// a config reload that changes an upstream builds a new one, and requests in
// flight finish on the old, counted in the new one's calls in flight and,
// at the same address, against its max_connections (buildWorld).
type upstream struct {
	cfg config.Upstream
	// modelsURL is what the breaker's probe asks; like every URL of the
	// upstream it keeps base_url's query (config.Upstream.EndpointURL).
	modelsURL  string
	authHeader string // "Bearer …", empty when no key is configured
	// apiKey is cfg.APIKey where it is to be masked in the errors passed
	// on (masked), as maskedKey; nil for none, or for a placeholder too
	// short to be a secret ("EMPTY", "ollama"), which masked would mangle
	// the words of every error that holds it.
	apiKey, maskedKey []byte
	// client serves only the breaker's GET /models probes. Every call
	// made for a client goes through pool: generation calls (plugins'
	// model calls too, see modelcall.go) and a stored response's state
	// calls (responsestate.go), under its rules for kept connections.
	client *fasthttp.HostClient
	pool   *connPool
	// tlsConfig is the TLS client's of an https upstream, nil for http.
	tlsConfig *cryptotls.Config
	// egress is the HTTP proxy its connections go through (HTTPS_PROXY),
	// nil when dialled directly; bypassed, the HTTP_PROXY an http
	// upstream is dialled without (egress.go).
	egress   *egress
	bypassed string
	// chatHead and responsesHead are a request's fixed first lines, up to
	// and including the headers every generation call sends.
	chatHead, responsesHead []byte

	health   upstreamHealth
	logf     func(string, ...any)
	nameHash uint64 // for prefix affinity
	retired  atomic.Bool
	// probeInterval is routing.probe_interval as in force (a
	// time.Duration), read by the probe before each wait; probeRetimed
	// tells a waiting probe it changed.
	probeInterval atomic.Int64
	probeRetimed  chan struct{}
	// failingAlone: its last call, made as the only upstream of its
	// pool, failed, and that was logged.
	failingAlone atomic.Bool
	// brokeAlone: the kinds of answer (kindStream, kindWhole) it cut
	// while the only upstream of its pool, logged, and none of that kind
	// completed since. Apart from failingAlone, which its answers' first
	// bytes clear before they break.
	brokeAlone atomic.Uint32
	// refusedUsageLog holds back the lines saying a usage report of it
	// was not believed (logRefusedUsage).
	refusedUsageLog loglimit.Limiter
	// overrunLog holds back the lines saying it sent bytes after an
	// answer (answerOverran).
	overrunLog loglimit.Limiter
	// pageLog holds back the lines saying it answered a 4xx with a page,
	// not a JSON error (pageInsteadOfError).
	pageLog loglimit.Limiter
	// credentialsLog holds back the lines saying it refused the gateway's
	// api_key (refusedCredentials).
	credentialsLog loglimit.Limiter
	// redirectLog holds back the lines saying it answered a redirect
	// (answeredRedirect).
	redirectLog loglimit.Limiter
	// loopback: base_url's host is this machine (127.0.0.0/8, ::1,
	// localhost), so a refused connection means nothing was started there.
	loopback bool
	// addr is base_url's host:port, the port filled in.
	addr string
}

// idlePoolTime is kept below the 5 s keep-alive of uvicorn (vLLM, SGLang) so
// the pool does not hand out connections the upstream is about to close.
const idlePoolTime = 4 * time.Second

func newUpstream(cfg config.Upstream, logf func(string, ...any)) (*upstream, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: base_url: %w", cfg.Name, err)
	}
	tls := u.Scheme == "https"
	addr := upstreamAddr(u)
	up := &upstream{
		health:    upstreamHealth{inflight: new(atomic.Int64)},
		logf:      logf,
		nameHash:  xxhash.Sum64String(cfg.Name),
		cfg:       cfg,
		modelsURL: cfg.EndpointURL("/models", ""),
		// One pending change is enough: the probe reads the interval.
		probeRetimed: make(chan struct{}, 1),
		loopback:     isLoopbackHost(u.Hostname()),
		addr:         addr,
	}
	if cfg.APIKey != "" {
		up.authHeader = "Bearer " + cfg.APIKey
	}
	if len(cfg.APIKey) >= minSecretKey {
		up.apiKey, up.maskedKey = []byte(cfg.APIKey), []byte(maskAPIKey(cfg.APIKey))
	}
	if tls {
		up.tlsConfig = &cryptotls.Config{ServerName: u.Hostname(), MinVersion: cryptotls.VersionTLS12,
			// Without a cache every new connection was a full handshake:
			// resumed, it costs the upstream no certificate and no key
			// exchange's signature, and a round trip less with TLS 1.2.
			ClientSessionCache: cryptotls.NewLRUClientSessionCache(0)}
		if pem := cfg.TLSCAPEM(); len(pem) > 0 {
			up.tlsConfig.RootCAs = x509.NewCertPool()
			if !up.tlsConfig.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("upstream %s: tls_ca %s: no certificate", cfg.Name, cfg.TLSCA)
			}
		}
	}
	if up.egress, up.bypassed, err = egressFor(egressEnvironment(), u, addr); err != nil {
		return nil, fmt.Errorf("upstream %s: %w", cfg.Name, err)
	}
	up.pool = newConnPool(addr, tls, cfg.MaxConnections, cfg.FirstByteTimeout, up.dialContext)
	up.pool.overran = up.answerOverran
	up.chatHead = requestHead(u, "/chat/completions", up.authHeader)
	up.responsesHead = requestHead(u, "/responses", up.authHeader)
	up.client = &fasthttp.HostClient{
		Addr:                     addr,
		IsTLS:                    tls,
		Name:                     "tollgate",
		NoDefaultUserAgentHeader: false,
		Dial:                     up.dial, // for https, a TLS connection with its handshake done, which fasthttp takes as it is
		MaxConns:                 cfg.MaxConnections,
		MaxConnWaitTimeout:       cfg.FirstByteTimeout,
		MaxIdleConnDuration:      idlePoolTime,
		MaxResponseBodySize:      int(cfg.MaxResponseBody),
		StreamResponseBody:       true,
		ReadBufferSize:           16 << 10,
		DisablePathNormalizing:   true,
		RetryIfErr:               retryStaleConnection,
		// Its parse errors would quote the answer, body and all, into the
		// log and last_error, as the pool's did (headerReadError).
		SecureErrorLogMessage: true,
		// ReadTimeout and WriteTimeout stay zero on purpose: fasthttp's
		// ReadTimeout caps a whole response, which would cut long streams.
		// timeoutConn enforces first-byte and idle timeouts per read.
	}
	return up, nil
}

// upstreamAddr is the host:port of an upstream's base_url u, its
// scheme's port when it names none.
func upstreamAddr(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return u.Host + ":443"
	}
	return u.Host + ":80"
}

// pageInsteadOfError logs now and then a 4xx of the upstream whose body
// is no JSON error (a front's HTML page): the call moves to another
// member of its pool, or is answered 502 when none is left.
func (u *upstream) pageInsteadOfError(reqID string, status int, what string) {
	ok, held := u.pageLog.Allow(time.Now(), upstreamLogEvery)
	if !ok {
		return
	}
	u.logf("upstream %s answered %d with %s%s, no error in OpenAI's shape: a proxy or firewall in front of it, or a base_url that does not reach the API (http:// on an https port); the call was tried on another member of its pool if one was left, else answered 502 upstream_bad_answer%s",
		u.cfg.Name, status, what, onRequest(" to", reqID), loglimit.HeldNote(held, "since the last such line"))
}

// answeredRedirect logs now and then a redirect of the upstream (what
// says where to), which no call follows: the call moves to another member
// of its pool, or is answered 502 when none is left or it may go to no
// other (a stored response's).
func (u *upstream) answeredRedirect(reqID string, status int, what string) {
	ok, held := u.redirectLog.Allow(time.Now(), upstreamLogEvery)
	if !ok {
		return
	}
	if status == fasthttp.StatusNotModified {
		u.logf("upstream %s answered %d with %s%s: a cache or proxy in front of it (%s) that answers for the API. Its calls go to another member of their pool where one is left, else are answered 502 upstream_bad_answer%s",
			u.cfg.Name, status, what, onRequest(" to", reqID), logURL(u.cfg.BaseURL), loglimit.HeldNote(held, "since the last such line"))
		return
	}
	u.logf("upstream %s answered %d with %s%s: its base_url (%s) is not where its API answers (an http:// base_url of an https-only provider); set base_url to where the redirect points. Its calls go to another member of their pool where one is left, else are answered 502 upstream_bad_answer%s",
		u.cfg.Name, status, what, onRequest(" to", reqID), logURL(u.cfg.BaseURL), loglimit.HeldNote(held, "since the last such line"))
}

const (
	aRedirect   = "a redirect"
	notModified = "an unexpected Not Modified"
)

// redirectAnswer says where a redirect (3xx) of the upstream points: its
// Location resolved against base_url, without the userinfo, query and
// fragment a Location may carry (a signed URL's token), since it goes
// to the client and the log.
func (u *upstream) redirectAnswer(h *fasthttp.ResponseHeader) string {
	if h.StatusCode() == fasthttp.StatusNotModified {
		// No redirect, but the answer to a conditional request, which
		// the gateway never sends: it read "a redirect with no Location".
		return notModified + " (the gateway's requests are never conditional)"
	}
	loc := h.Peek("Location")
	if len(loc) == 0 {
		return aRedirect + " that names no Location"
	}
	base, err := url.Parse(u.cfg.BaseURL)
	target, err2 := url.Parse(string(loc))
	if err != nil || err2 != nil {
		return aRedirect + " to a Location that is no URL"
	}
	target = base.ResolveReference(target)
	target = &url.URL{Scheme: target.Scheme, Host: target.Host, Path: target.Path}
	return aRedirect + " to " + utf8cut.Shorten(target.String(), 200)
}

// minSecretKey is the shortest api_key masked in the errors passed on.
const minSecretKey = 8

// maskAPIKey is key as an error passed on shows it: as OpenAI masks a
// key in its own errors, its prefix ("sk-") and, for a key long enough
// that 4 characters give nothing away, its last 4 (sk-...3456).
func maskAPIKey(key string) string {
	prefix := ""
	if i := strings.IndexByte(key, '-'); i > 0 && i < 4 {
		prefix = key[:i+1]
	}
	if len(key) < 16 {
		return prefix + "..."
	}
	return prefix + "..." + key[len(key)-4:]
}

// masked is b, an error of the upstream passed on to a client, with its
// api_key masked wherever the error echoes it (a 401's "Incorrect API
// key provided: Bearer sk-…", a proxy's 500 quoting the request's
// headers): passed on as it came, the gateway's own key reached every
// client. b itself when it holds no key, which is almost always; only
// errors are looked into, never an answer.
func (u *upstream) masked(b []byte) []byte {
	if len(u.apiKey) == 0 {
		return b
	}
	if bytes.Contains(b, u.apiKey) {
		b = bytes.ReplaceAll(b, u.apiKey, u.maskedKey)
	}
	if bytes.IndexByte(b, '\\') >= 0 {
		b = u.maskedEscaped(b)
	}
	return b
}

// maskedEscaped masks the api_key in the JSON strings of b that hold it
// once their escapes are read ("sk\u002d…", PHP's "\/" for a '/'): not
// the key's bytes, but any JSON parser gives the client the key whole.
// The JSON looked into runs from b's first '{' to its last '}': an error
// body, or an error event's data line.
func (u *upstream) maskedEscaped(b []byte) []byte {
	start, end := bytes.IndexByte(b, '{'), bytes.LastIndexByte(b, '}')
	if start < 0 || end < start || !gjson.ValidBytes(b[start:end+1]) {
		return b
	}
	key := string(u.apiKey)
	var out []byte
	done := start // b is copied to out up to here
	var walk func(r gjson.Result)
	walk = func(r gjson.Result) {
		r.ForEach(func(k, v gjson.Result) bool {
			for _, s := range [...]gjson.Result{k, v} {
				switch {
				case s.IsObject() || s.IsArray():
					walk(s)
				case s.Type == gjson.String && strings.IndexByte(s.Raw, '\\') >= 0 && strings.Contains(s.Str, key):
					at := start + s.Index // ForEach gives each offset from the root's start, in order
					if at < done || at+len(s.Raw) > len(b) || string(b[at:at+len(s.Raw)]) != s.Raw {
						continue
					}
					quoted, _ := json.Marshal(strings.ReplaceAll(s.Str, key, string(u.maskedKey)))
					out = append(append(out, b[done:at]...), quoted...)
					done = at + len(s.Raw)
				}
			}
			return true
		})
	}
	out = append(out, b[:start]...)
	walk(gjson.ParseBytes(b[start : end+1]))
	if done == start {
		return b
	}
	return append(out, b[done:]...)
}

// errorMessage is an upstream error's message, its api_key masked and
// shortened for a log line and an error's message.
func (u *upstream) errorMessage(e gjson.Result) string {
	msg := e.Str
	if e.IsObject() {
		msg = e.Get("message").String()
	}
	if msg == "" {
		msg = e.Raw
	}
	return utf8cut.Shorten(string(u.masked([]byte(msg))), 200)
}

// refusedCredentials logs now and then an upstream's 401 or 403, which
// refuses the gateway's api_key, not the client's (msg its message).
func (u *upstream) refusedCredentials(reqID string, status int, msg string) {
	ok, held := u.credentialsLog.Allow(time.Now(), upstreamLogEvery)
	if !ok {
		return
	}
	u.logf("upstream %s (%s) answered %d, refusing the gateway's credentials%s: %s; check its api_key (and the account's access to the model). Its calls go to another member of their pool where one is left, else are answered 502 upstream_credentials_refused%s",
		u.cfg.Name, logURL(u.cfg.BaseURL), status, onRequest(" on", reqID), msg, loglimit.HeldNote(held, "since the last such line"))
}

// adoptTLSSessions makes u resume the TLS sessions of prev, the
// upstream of the same name before a reload: an edit of a timeout or an
// api_key made every connection after it a full handshake again.
// Sessions are kept by server name, so a new host resumes none of the
// old one's; and not across a change of tls_ca, since a resumed session
// is not checked against the CAs again.
func (u *upstream) adoptTLSSessions(prev *upstream) {
	if u.tlsConfig != nil && prev.tlsConfig != nil && bytes.Equal(u.cfg.TLSCAPEM(), prev.cfg.TLSCAPEM()) {
		u.tlsConfig.ClientSessionCache = prev.tlsConfig.ClientSessionCache
	}
}

// answerOverran counts, and logs now and then, an answer the upstream
// followed with n bytes or more nobody asked for, whose connection was
// closed for it (upstreamResponse.Close): a broken server, or a proxy
// before it, out of step with its requests. The bytes are not quoted:
// they may be another call's answer.
func (u *upstream) answerOverran(n int) {
	u.health.overruns.Add(1)
	ok, held := u.overrunLog.Allow(time.Now(), upstreamLogEvery)
	if !ok {
		return
	}
	u.logf("upstream %s sent %d bytes or more after the end of an answer, which nobody asked for: its connection was closed, not kept for the next call, whose answer they would have been taken for%s",
		u.cfg.Name, n, loglimit.HeldNote(held, "answers since the last such line; see tollgate_upstream_overruns_total"))
}

// isLoopbackHost reports whether host (a URL's, without brackets or
// port) names this machine.
func isLoopbackHost(host string) bool {
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	return strings.EqualFold(strings.TrimSuffix(host, "."), "localhost")
}

// requestHead renders the request line and the headers every generation
// call to this upstream sends; appendRequest adds the rest.
func requestHead(u *url.URL, path, auth string) []byte {
	p := strings.TrimRight(u.EscapedPath(), "/") + path
	if u.RawQuery != "" {
		p += "?" + u.RawQuery
	}
	return append(appendHead(nil, "POST", p, u.Host, auth), "Content-Type: application/json\r\n"...)
}

// appendHead appends the request line of method and target and the
// headers every call to an upstream sends. identity: an answer is read
// for its usage and relayed byte for byte; with no Accept-Encoding an
// upstream (or a proxy before it) may compress it, and the client got
// gzip bytes labelled JSON.
func appendHead(dst []byte, method, target, host, auth string) []byte {
	dst = append(dst, method...)
	dst = append(dst, ' ')
	dst = append(dst, target...)
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, host...)
	dst = append(dst, "\r\nUser-Agent: tollgate\r\nAccept-Encoding: identity\r\n"...)
	if auth != "" {
		dst = append(dst, "Authorization: "...)
		dst = append(dst, auth...)
		dst = append(dst, "\r\n"...)
	}
	return dst
}

// appendRequest appends a whole generation request for body to dst; extra
// holds whole header lines of this call's own (its trace context).
func appendRequest(dst, head, extra, body []byte, stream bool) []byte {
	dst = append(dst, head...)
	dst = append(dst, extra...)
	if stream {
		dst = append(dst, "Accept: text/event-stream\r\n"...)
	}
	dst = append(dst, "Content-Length: "...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, "\r\n\r\n"...)
	return append(dst, body...)
}

// retryStaleConnection retries a probe once when a pooled keep-alive
// connection turns out to be closed by the upstream before any response
// byte arrived; a probe that fails otherwise is asked again at the next
// interval.
func retryStaleConnection(_ *fasthttp.Request, attempts int, err error) (bool, bool) {
	return false, attempts < 2 && (errors.Is(err, io.EOF) || errors.Is(err, fasthttp.ErrConnectionClosed))
}

// dial opens a connection to the upstream at addr, ready for a request:
// the TCP connect (through an egress proxy, to the proxy, and its answer
// to CONNECT) and, for https, the TLS handshake, all by one deadline
// connect_timeout after the dial began. Left to the first request's
// write, the handshake was timed by first_byte_timeout (a non-streamed
// call's response_timeout), and its failure read as a request sent and
// not answered: an upstream that took connections and never finished a
// handshake held each non-streamed call for response_timeout, then a
// 504 with no other member tried. Every failure is a *connectError: no
// request went out.
func (u *upstream) dial(addr string) (net.Conn, error) {
	return u.dialContext(context.Background(), addr)
}

// dialContext is dial, given up once ctx is done (the call's client
// left: connPool.dialWatching).
func (u *upstream) dialContext(ctx context.Context, addr string) (net.Conn, error) {
	start := time.Now()
	deadline := start.Add(u.cfg.ConnectTimeout)
	var c net.Conn
	var took time.Duration
	if u.egress != nil {
		var err error
		if c, took, err = u.egress.tunnel(ctx, addr, deadline, u.cfg.ConnectTimeout); err != nil {
			return nil, err
		}
	} else {
		d := net.Dialer{Deadline: deadline}
		var err error
		if c, err = d.DialContext(ctx, "tcp", addr); err != nil {
			return nil, &connectError{err: err}
		}
		took = time.Since(start)
	}
	tc := &timeoutConn{Conn: rawconn.Wrap(c), firstByte: u.cfg.FirstByteTimeout, firstByteConfigured: u.cfg.FirstByteTimeout,
		idle: u.cfg.IdleTimeout, write: u.cfg.WriteTimeout, connectTook: took}
	if u.tlsConfig == nil {
		return tc, nil
	}
	conn := cryptotls.Client(tc, u.tlsConfig)
	if err := tc.handshake(ctx, conn, deadline); err != nil {
		_ = c.Close()
		return nil, u.handshakeError(addr, err)
	}
	return conn, nil
}

// handshakeError words a TLS handshake with addr that failed with err.
// The certificate's x509 reason stays in it, for the log and last_error.
func (u *upstream) handshakeError(addr string, err error) *connectError {
	step := "TLS handshake with " + addr
	if u.egress != nil {
		step += " through egress proxy " + u.egress.name
	}
	if isTimeout(err) {
		return &connectError{step: step, reason: "the TLS handshake timed out",
			err: fmt.Errorf("not done within connect_timeout (%s)", u.cfg.ConnectTimeout)}
	}
	return &connectError{step: step, reason: "the TLS handshake failed", err: err}
}

// logEgress says how u is dialled when that is not what it was before
// (prev, nil at start or for a new upstream): through which egress proxy,
// or directly although HTTP_PROXY is set.
func (u *upstream) logEgress(prev *upstream) {
	switch {
	case u.egress != nil && (prev == nil || prev.egress == nil || prev.egress.name != u.egress.name):
		u.logf("upstream %s (%s) goes through the egress proxy %s (HTTPS_PROXY; list its host in NO_PROXY to dial it directly)",
			u.cfg.Name, logURL(u.cfg.BaseURL), u.egress.name)
	case u.bypassed != "" && (prev == nil || prev.bypassed != u.bypassed):
		u.logf("upstream %s (%s) is dialled directly, not through HTTP_PROXY (%s): only https upstreams go through a proxy",
			u.cfg.Name, logURL(u.cfg.BaseURL), u.bypassed)
	}
}

// connectError is a connection to an upstream that could not be opened:
// its TCP connect or TLS handshake failed or did not finish within
// connect_timeout. No request went out on it, so the call may move on
// to another upstream, streamed or not, and it counts against the
// upstream as a refused connection does.
type connectError struct {
	step   string // what failed, for operators; empty for the TCP connect, whose error says so
	reason string // what failed, for a client (reasonForClient); empty: worded from err
	err    error
}

func (e *connectError) Error() string {
	if e.step == "" {
		return e.err.Error()
	}
	return e.step + ": " + e.err.Error()
}

func (e *connectError) Unwrap() error { return e.err }

// connectFailed reports whether err is a connection that could not be
// opened: not a request that went out and timed out.
func connectFailed(err error) bool {
	var ce *connectError
	return errors.As(err, &ce)
}

// timeoutConn owns the deadlines of an upstream connection. After every
// write (a new request) the next read may wait firstByte; each later read
// may wait idle. A stream that keeps producing is therefore never cut, and
// one that stalls is, which fasthttp's whole-response ReadTimeout cannot do.
//
// Re-arming a deadline costs a runtime timer update, so a read within
// a sixteenth of the wait after the last arming keeps the deadline it has:
// the gap allowed is then between 15/16 of the wait and the whole wait.
//
// A connection is used from one goroutine at a time, so it needs no lock.
type timeoutConn struct {
	net.Conn
	firstByte, idle, write time.Duration
	// firstByteConfigured is first_byte_timeout; firstByte is the wait of
	// the request in flight, which a non-streamed call sets to
	// response_timeout.
	firstByteConfigured time.Duration
	// connectTook is how long its TCP connect took: about a round trip.
	connectTook time.Duration
	// handshaking: the TLS handshake is running, under the deadline
	// handshake set; reads and writes arm none of their own.
	handshaking bool
	// heldOnly: reads answer errNothingHeld at once, touching neither
	// the socket nor its deadline, so that a read of the TLS connection
	// over it takes only the records that connection holds already
	// (upstreamConn.strayHeldByTLS).
	heldOnly      bool
	awaitingFirst bool
	// ending: the event that ends the answer came, and the body's end is
	// due within endGrace, not idle_timeout (generationCall.expectEnd).
	ending                bool
	readWait              time.Duration // the wait the read deadline was armed with
	readArmed, writeArmed time.Time     // when the deadlines were last armed
	wroteAt               time.Time     // when the request in flight was written
	// dueBy, while set, is the one deadline of every read, and reads go
	// on watching the client as for the first byte: a stream's first
	// event is due by then however many comments come before it
	// (awaitFirstEvent), and a non-streamed answer's last byte however
	// its body trickles in (awaitBody).
	dueBy time.Time
	// client, while set, is the connection of the client waiting for the
	// request in flight: a wait for its first byte (or, while dueBy is
	// set, for any byte) longer than clientCheckEvery looks every so often
	// whether that client is gone, and clientGone says it was
	// (fasthttp's header reader turns the read's error into io.EOF).
	client     net.Conn
	clientGone bool
	// clientLooked is when the client was last looked at, or the request
	// written: bytes that are no first byte (interim responses, a
	// stream's comments, a whole answer's body) coming more often than
	// clientCheckEvery do not keep the client from being looked at.
	clientLooked time.Time
}

// clientCheckEvery is how often a long wait for an upstream's first byte
// looks at its client's connection. The OpenAI SDKs give up on a call
// after 10 minutes (LangChain, configured, much sooner), close the
// connection and send the call again: the upstream went on generating
// each try, and each was billed in full, for answers nobody received
// (seven with LangChain's six retries).
const clientCheckEvery = time.Second

// errClientGone: the client closed its connection while the upstream had
// not answered yet.
var errClientGone = errors.New("the client closed its connection before the upstream answered")

// errClientGoneUnsent: the client closed its connection before the
// request of a try went out (while the call waited for a connection, or
// before a retry); nothing was sent to the upstream.
var errClientGoneUnsent = fmt.Errorf("%w; its request was not sent", errClientGone)

// readWatchingClient reads under a deadline of until, looking at the
// client's connection every clientCheckEvery meanwhile.
func (c *timeoutConn) readWatchingClient(p []byte, now, until time.Time) (int, error) {
	c.readWait = 0 // the next read arms its deadline anew
	if now.Sub(c.clientLooked) >= clientCheckEvery {
		if rawconn.PeerClosed(c.client) {
			c.clientGone = true
			return 0, errClientGone
		}
		c.clientLooked = now
	}
	for {
		next := now.Add(clientCheckEvery)
		if until.Before(next) {
			next = until
		}
		if err := c.Conn.SetReadDeadline(next); err != nil {
			return 0, err
		}
		c.readArmed = next
		n, err := c.Conn.Read(p)
		if n > 0 || err == nil || !isTimeout(err) || !next.Before(until) {
			return n, err
		}
		if rawconn.PeerClosed(c.client) {
			c.clientGone = true
			return 0, errClientGone
		}
		now = time.Now()
		c.clientLooked = now
	}
}

// awaitEventBy makes every read until done() wait at most until the
// first byte's deadline of the request in flight, counted from when it was
// written, whatever arrives meanwhile.
func (c *timeoutConn) awaitEventBy() (done func()) {
	c.dueBy = c.wroteAt.Add(c.firstByte)
	return func() {
		c.dueBy = time.Time{}
		c.awaitingFirst = false
		c.readWait = 0 // the next read arms idle_timeout
	}
}

// awaitAnswerBy makes every later read of the request in flight wait at
// most until its first byte's deadline, counted from when it was written,
// watching the client meanwhile, until the next request: for a
// non-streamed answer, whose body is due whole by then.
func (c *timeoutConn) awaitAnswerBy() {
	c.dueBy = c.wroteAt.Add(c.firstByte)
	c.awaitingFirst = true
}

// handshake runs the TLS handshake of conn, a tls.Client over c, by
// deadline or until ctx is done; the deadlines of c's requests are armed afresh after it.
func (c *timeoutConn) handshake(ctx context.Context, conn *cryptotls.Conn, deadline time.Time) error {
	if err := c.Conn.SetDeadline(deadline); err != nil {
		return err
	}
	c.handshaking = true
	err := conn.HandshakeContext(ctx)
	c.handshaking = false
	if err != nil {
		return err
	}
	return c.Conn.SetDeadline(time.Time{})
}

func (c *timeoutConn) Write(p []byte) (int, error) {
	if c.handshaking {
		return c.Conn.Write(p)
	}
	c.awaitingFirst, c.ending = true, false
	now := time.Now()
	c.wroteAt, c.clientLooked = now, now
	if now.Sub(c.writeArmed) > c.write/16 {
		if err := c.Conn.SetWriteDeadline(now.Add(c.write)); err != nil {
			return 0, err
		}
		c.writeArmed = now
	}
	return c.Conn.Write(p)
}

func (c *timeoutConn) Read(p []byte) (int, error) {
	if c.handshaking {
		return c.Conn.Read(p)
	}
	if c.heldOnly {
		return 0, errNothingHeld
	}
	if c.client != nil && c.awaitingFirst {
		until := c.dueBy
		if until.IsZero() {
			until = c.wroteAt.Add(c.firstByte)
		}
		if now := time.Now(); until.Sub(now) > clientCheckEvery {
			n, err := c.readWatchingClient(p, now, until)
			if n > 0 && c.dueBy.IsZero() {
				c.awaitingFirst = false // as below; with dueBy set, the wait lasts until it is cleared
			}
			return n, err
		}
	}
	if !c.dueBy.IsZero() {
		if !c.readArmed.Equal(c.dueBy) {
			if err := c.Conn.SetReadDeadline(c.dueBy); err != nil {
				return 0, err
			}
			c.readArmed, c.readWait = c.dueBy, 0
		}
		return c.Conn.Read(p)
	}
	wait := c.idle
	if c.awaitingFirst {
		wait = c.firstByte
	}
	if c.ending && wait > endGrace {
		wait = endGrace
	}
	if now := time.Now(); wait != c.readWait || now.Sub(c.readArmed) > wait/16 {
		if err := c.Conn.SetReadDeadline(now.Add(wait)); err != nil {
			return 0, err
		}
		c.readWait, c.readArmed = wait, now
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaitingFirst = false
	}
	return n, err
}

// errNothingHeld is what a read of a timeoutConn answers while heldOnly
// is set. It is a net.Error that is temporary, as a passed deadline is,
// which crypto/tls returns without making it the connection's error for
// good.
var errNothingHeld net.Error = nothingHeldError{}

type nothingHeldError struct{}

func (nothingHeldError) Error() string   { return "nothing more is held" }
func (nothingHeldError) Timeout() bool   { return true }
func (nothingHeldError) Temporary() bool { return true }

// SetReadDeadline and SetWriteDeadline ignore fasthttp's own deadlines; the
// ones set per read and write above are the ones that hold.
func (c *timeoutConn) SetReadDeadline(time.Time) error  { return nil }
func (c *timeoutConn) SetWriteDeadline(time.Time) error { return nil }
func (c *timeoutConn) SetDeadline(time.Time) error      { return nil }

// isTimeout reports whether err came from a read or write deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, fasthttp.ErrTimeout)
}
