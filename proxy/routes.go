package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/accounts"
)

// AuthMode says whether a plugin route needs an API key.
type AuthMode int

const (
	// AuthRequired refuses calls without a valid key (401).
	AuthRequired AuthMode = iota
	// AuthOptional serves calls without a key in public mode; a key that is
	// sent must still be valid.
	AuthOptional
	// AuthNone never reads the Authorization header: the route
	// authenticates by other means (the web console's session cookie), and
	// a header meant for something else, such as a reverse proxy's Basic
	// auth, must not make it fail. Call.Key is always nil.
	AuthNone
)

// Call is what a plugin handler gets besides the fasthttp context.
type Call struct {
	RequestID string
	Start     time.Time
	Key       *accounts.Key // nil in public mode
	World     *World
	Server    *Server

	limit *admission // nil on routes with LimitNone
}

// Route is an endpoint a module serves (Provisioned.Routes). Path is
// exact, or ends in "/*" to match every path under it (the handler reads
// the rest from ctx.Path()). A GET route answers HEAD too, unless a HEAD
// route is given. Method may be AnyMethod.
type Route struct {
	Method  string
	Path    string
	Auth    AuthMode
	Scope   string // scope a key must carry; empty = any valid key
	Limits  LimitMode
	Handler func(ctx *fasthttp.RequestCtx, call *Call)
	// MethodNotAllowed, when set, answers a method that no route of the
	// path serves, in the module's own form (the console's HTML page);
	// nil: the API's JSON error. The server has set the Allow header
	// (allow) and counted the refusal; it must answer 405. Of the routes
	// that match the path, the one with the longest Path answers.
	MethodNotAllowed func(ctx *fasthttp.RequestCtx, allow string)
	// MaxBody, when above 0 and below server.max_request_body, is the
	// route's own cap on a request body: a Content-Length over it is its
	// 413 from the headers, as one over max_request_body is, and a
	// chunked body is cut there. A route whose credentials are checked
	// only after the body (AuthNone) and whose bodies are small sets one:
	// without it a client with none held max_request_body per connection
	// for the read timeout.
	MaxBody int64
	// Headers, when set, adds the module's own headers to every answer
	// to the route, the server's own refusals included (the 413 of a
	// body over MaxBody, which the handler never sees): the console's
	// 413 lacked its security headers.
	Headers func(ctx *fasthttp.RequestCtx)
}

// AnyMethod as a Route's Method answers every method no route of the
// path serves, where no route has the path exactly; it is not named in a
// 405's Allow. The console answers paths it has no page for with it: a
// 404 for PUT /console/nope, not a 405 claiming GET and POST serve it.
const AnyMethod = "*"

type routeKey struct{ method, path string }

// AdminHandler serves every path under /admin/. The admin API lives in its
// own package (admin), which imports proxy, so the server knows it only
// by this method. w is the World the call runs under: the catalog for
// checking models, the upstreams for their status. routes are the admin
// routes the modules added (Provisioned.AdminRoutes); do not modify them.
type AdminHandler interface {
	ServeAdmin(ctx *fasthttp.RequestCtx, w *World, routes []AdminRoute)
}

// fasthttpPrefetch is how much of a streamed body fasthttp reads before
// the handler runs (min(Content-Length, 8 KiB), in readBodyWithStreaming).
// TestBodiesAroundThePrefetchArriveWhole fails if a new fasthttp changes it.
const fasthttpPrefetch = 8 << 10

// readRequestBody reads the streamed request body (see the server's
// StreamRequestBody) into the request, up to limit bytes, and answers why
// the call cannot have it, or nil: a body larger than limit (the rest is
// dropped, discardRest, and the connection will close), one that stopped
// coming before the read timeout (a 408, no broken JSON), one its client
// broke off, or chunks framed wrong. The body is read as its bytes arrive,
// through a limit (fasthttp bounds no chunked body), and not with
// Request.Body, which logs a warning for every streamed body: that log
// cost a fifth of the throughput.
func readRequestBody(ctx *fasthttp.RequestCtx, limit int64, routeCap bool) *APIError {
	tooLarge := func(limit int64) *APIError { return errBodyOver(ctx.Path(), limit, routeCap) }
	req := &ctx.Request
	if !req.IsBodyStream() {
		if int64(len(req.Body())) > limit {
			return tooLarge(limit)
		}
		return nil
	}
	cl := int64(req.Header.ContentLength())
	if cl > limit {
		discardRest(ctx, limit)
		return tooLarge(limit)
	}
	if cl >= 0 && cl <= fasthttpPrefetch {
		// The whole body is in the request's buffer already: closing the
		// stream leaves it there, with no copy.
		_ = req.CloseBodyStream()
		return nil
	}
	buf := bytebufferpool.Get()
	defer bytebufferpool.Put(buf)
	_, err := buf.ReadFrom(io.LimitReader(req.BodyStream(), limit+1))
	read := int64(buf.Len())
	var fault *APIError
	switch {
	case err == nil && read > limit:
		discardRest(ctx, limit)
		fault = tooLarge(limit)
	case err == nil && cl >= 0 && read < cl:
		// fasthttp ends a body whose client closed before its
		// Content-Length with a plain io.EOF: read as whole, what came
		// was forwarded and billed.
		fault = BadRequest("", fmt.Sprintf("the request body was cut short: it ended after %d of the %d bytes its Content-Length announced, when the client closed its connection", read, cl))
	case err == nil:
		req.SetBody(buf.B) // which closes the stream
		return nil
	default:
		fault = bodyBrokenOff(err)
	}
	ctx.SetConnectionClose()
	_ = req.CloseBodyStream()
	return fault
}

// bodyBrokenOff is the answer to a streamed body whose read failed with
// err: it stopped coming (408), its chunks are framed wrong, or its client
// closed or reset the connection. Until 2026-11-27 the last two were
// "not valid JSON": the call read an empty body.
func bodyBrokenOff(err error) *APIError {
	if isTimeout(err) {
		return errRequestTimeout()
	}
	// fasthttp's own words for a chunk's size line or end that is not
	// "hex size CRLF data CRLF" are quoted; "cannot read …" is the
	// connection failing there, its error wrapped with no Unwrap (so a
	// timeout is known by its text) and naming both ends' addresses.
	var broken fasthttp.ErrBrokenChunk
	msg := err.Error()
	switch {
	case errors.As(err, &broken) && strings.Contains(msg, "timeout") && strings.HasPrefix(msg, "cannot "):
		return errRequestTimeout()
	case errors.As(err, &broken) && !strings.HasPrefix(msg, "cannot "),
		msg == "empty hex number", msg == "too large hex number": // fasthttp's errors for a chunk size that is not hex, or over 15 digits
		return BadRequest("", "the request body's chunked framing is broken ("+msg+"): each chunk is its size in hex, CRLF, that many bytes and CRLF, and a chunk of size 0 ends the body")
	}
	// fasthttp refuses a trailer field that frames, routes or authorizes
	// the request (RFC 9110, 6.5.1), in an error of no type of its own
	// that quotes the field's name; it read as a connection that failed.
	if _, field, ok := strings.Cut(msg, "forbidden trailer key "); ok {
		field, _, _ = strings.Cut(field, ":")
		return BadRequest("", "the request body's trailer has the field "+field+", which a trailer may not carry: send it with the headers, or leave it out")
	}
	why := "the client closed its connection before sending it whole"
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		why = "the connection failed before it came whole (" + reasonForClient(err) + ")"
	}
	return BadRequest("", "the request body was cut short: "+why)
}

// discardRest reads and drops what is left of a body over the limit, up
// to discardBound, before the 413 goes out and the connection closes.
// Closed with the body still arriving, the socket resets, and a client
// that sends its whole body before reading (the SDKs, Python's
// http.client) sees a reset instead of the 413: the SDKs call it
// "Connection error." and upload the body twice more. A body past the
// bound is not waited for.
func discardRest(ctx *fasthttp.RequestCtx, limit int64) {
	ctx.SetConnectionClose()
	bound := discardBound(limit)
	if cl := int64(ctx.Request.Header.ContentLength()); cl > bound {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(ctx.Request.BodyStream(), bound))
}

// discardBound is how much of a body over limit is read to answer its 413:
// twice the limit, and at least 64 MiB, which covers a chat message with a
// few base64 images (8 MiB of limit once answered a 20 MiB image with a
// reset).
func discardBound(limit int64) int64 { return max(2*limit, 64<<20) }

// handle serves the API listener. Every request passes refusalFromHeaders
// first, so what follows it sees only the methods, keys and paths that
// check let through.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	if !ctx.Request.Header.IsHTTP11() {
		// An HTTP/1.0 client's answer leaves once written, never held
		// back for a request it pipelined behind it: a stream to such a
		// client is written to the connection itself (sendStream), and
		// would overtake an answer still in fasthttp's buffer. Setting a
		// write deadline, here none, has fasthttp flush each answer.
		_ = ctx.SetWriteDeadline(time.Time{})
	}
	path := ctx.Path()
	ep, isGeneration := generationEndpoint(path)
	refusal, limit, unread := s.refusalFromHeaders(ctx, path)
	if refusal != nil {
		refuseThenDrain(ctx, refusal, limit)
		return
	}
	var bodyFault *APIError
	if !unread {
		bodyFault = readRequestBody(ctx, limit, s.isRouteCap(limit))
	}
	// A compressed body (Codex CLI compresses its own backend's) read as
	// it came was "not valid JSON", which said nothing of why.
	enc := ctx.Request.Header.ContentEncoding()
	encoded := len(enc) > 0 && !bytes.EqualFold(enc, identity)
	var reqID string
	if !isGeneration || bodyFault != nil || encoded {
		// Every response carries one, as the README promises; a
		// generation call makes its own, which its usage event keeps, and
		// a plugin call is metered under this one.
		reqID = newRequestID()
		ctx.Response.Header.Set("x-request-id", reqID)
	}
	if bodyFault != nil {
		WriteError(ctx, bodyFault)
		return
	}
	if encoded {
		WriteError(ctx, &APIError{Status: fasthttp.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: "unsupported_content_encoding",
			Message: fmt.Sprintf("request bodies are read as they are sent: Content-Encoding %q is not supported; send the body uncompressed", enc)})
		return
	}
	if isGeneration {
		s.generation(ctx, ep)
		return
	}
	switch string(path) {
	case "/v1/models":
		ctx.SetContentType("application/json")
		ctx.SetBody(s.world.Load().Catalog.ModelsJSON())
		return
	case "/healthz":
		ctx.SetContentType("application/json")
		ctx.SetBodyString(HealthzBody)
		return
	case "/readyz":
		status, body := s.Readiness()
		ctx.SetStatusCode(status)
		ctx.SetContentType("application/json")
		ctx.Response.Header.Set("Cache-Control", "no-store")
		ctx.SetBody(body)
		return
	case "/metrics":
		if s.metricsElsewhere {
			break // a 404 as any path not served here
		}
		ctx.SetContentType(MetricsContentType)
		ctx.SetBody(s.MetricsText())
		return
	}
	if rest, ok := bytes.CutPrefix(path, responsesPrefix); ok {
		s.responseState(ctx, rest)
		return
	}
	// Model ids may hold slashes ("Qwen/Qwen2.5-7B"): the id is the whole
	// rest of the path, which fasthttp has already percent-decoded, so the
	// SDKs' escaped "Qwen%2FQwen2.5-7B" finds it too.
	if id, ok := bytes.CutPrefix(path, modelsPrefix); ok && len(id) > 0 {
		s.model(ctx, id)
		return
	}
	if bytes.HasPrefix(path, []byte("/admin/")) && s.admin != nil {
		s.admin.ServeAdmin(ctx, s.world.Load(), s.mods.Load().admin)
		return
	}
	if s.servePlugin(ctx, path, reqID) {
		return
	}
	WriteError(ctx, NotFound("no route for "+string(ctx.Method())+" "+string(path)+s.baseURLHint(ctx, path)))
}

// refusalFromHeaders is the answer that a request's headers alone earn it,
// nil when they refuse nothing: a path no route serves (404), a method its
// route does not take (405, the Allow header set), a missing or bad key
// where the route checks one (401, 403 for a scope it lacks). It follows
// handle's routing, and is asked before the body is read (handle, and the
// ExpectHandler instead of 100 Continue): read first, a request with no
// key held up to max_request_body of memory per connection for the read
// timeout. The call checks the key again after the body (a cached
// Verify, about 0.1 µs), so a key revoked while its body came is seen
// as revoked. The routes that check no key, or check it themselves
// (/admin/, the console's pages), are refused after their body, within
// their own smaller cap (adminMaxBody, Route.MaxBody).
//
// limit is the most body the route takes; a Content-Length over it is
// refused nothing here: its 413 comes first (readRequestBody, or the
// ExpectHandler). unread says the route answers without its body (the
// gateway's own GET routes), which is then never read into memory:
// fasthttp drops up to 256 KiB of it after the answer and closes the
// connection past that. Both came too late for a client with no key,
// who held max_request_body per connection on GET /v1/models.
func (s *Server) refusalFromHeaders(ctx *fasthttp.RequestCtx, path []byte) (refusal *APIError, limit int64, unread bool) {
	limit = int64(s.world.Load().Config.Server.MaxRequestBody)
	if _, ok := generationEndpoint(path); ok {
		if int64(ctx.Request.Header.ContentLength()) > limit {
			return nil, limit, false
		}
		if !ctx.IsPost() {
			return notAllowed(ctx, "POST"), limit, false
		}
		_, apiErr := s.authorize(ctx, accounts.ScopeGenerate)
		return apiErr, limit, false
	}
	switch string(path) {
	case "/v1/models", "/healthz", "/readyz":
		return readOnlyRefusal(ctx), limit, true
	case "/metrics":
		if !s.metricsElsewhere {
			return readOnlyRefusal(ctx), limit, true
		}
	}
	if rest, ok := bytes.CutPrefix(path, responsesPrefix); ok {
		if int64(ctx.Request.Header.ContentLength()) > limit {
			return nil, limit, false
		}
		_, _, _, apiErr := s.admitResponseState(ctx, rest)
		return apiErr, limit, false
	}
	if id, ok := bytes.CutPrefix(path, modelsPrefix); ok && len(id) > 0 {
		return readOnlyRefusal(ctx), limit, true
	}
	if bytes.HasPrefix(path, []byte("/admin/")) && s.admin != nil {
		return nil, min(limit, adminMaxBody), false
	}
	r, ok, allow, answer := moduleRoute(s.mods.Load().routes, string(ctx.Method()), string(path))
	// A 405 the route answers itself is under its cap too: POST /console
	// with 8 MiB was read whole before the console's 405 page.
	if (ok || answer != nil) && r.MaxBody > 0 {
		limit = min(limit, r.MaxBody)
	}
	if (ok || answer != nil) && r.Headers != nil {
		r.Headers(ctx)
	}
	if int64(ctx.Request.Header.ContentLength()) > limit {
		return nil, limit, false
	}
	switch {
	case ok && r.checksKey(ctx):
		_, apiErr := s.authorize(ctx, r.Scope)
		return apiErr, limit, false
	case ok && r.Limits == LimitCaller:
		// A public call over its address's rate or concurrency is its 429
		// before its body, as a keyed one is its 401: read first, an
		// address past its allowance still had every body held.
		call := Call{World: s.world.Load()}
		return s.limits.admissionFor(ctx, &call, accounts.Limits{}, nil).precheck(ctx), limit, false
	case ok, answer != nil:
		return nil, limit, false
	case allow != "":
		return notAllowed(ctx, allow), limit, false
	}
	return NotFound("no route for " + string(ctx.Method()) + " " + string(path) + s.baseURLHint(ctx, path)), limit, false
}

// adminMaxBody caps a request body under /admin/, whose calls are small
// JSON objects and whose token is checked only after the body.
const adminMaxBody = 1 << 20

// readOnlyRefusal is the 405 of a route that only reads, nil for a GET or
// HEAD.
func readOnlyRefusal(ctx *fasthttp.RequestCtx) *APIError {
	if ctx.IsGet() || ctx.IsHead() {
		return nil
	}
	return notAllowed(ctx, "GET, HEAD")
}

// refuseUnread answers refusal to a request whose body is not read, and
// closes the connection if some of that body may still be on its way:
// it is not waited for, and would be read as the next request.
func refuseUnread(ctx *fasthttp.RequestCtx, refusal *APIError) {
	ctx.Response.Header.Set("x-request-id", newRequestID())
	if cl := ctx.Request.Header.ContentLength(); ctx.Request.IsBodyStream() && (cl < 0 || cl > fasthttpPrefetch) {
		ctx.SetConnectionClose()
	}
	WriteError(ctx, refusal)
}

// refuseThenDrain answers refusal to a request whose body has not been
// read, in handle, then reads and drops the body without keeping it. Up
// to maxUnreadBody fasthttp does that after the answer went out, and the
// connection is kept; a chunked body is left to it too, which keeps the
// connection when the body ended within that and closes it otherwise
// (closed here, a small chunked body's connection was lost, and a
// request pipelined after it never answered). A longer body of a known
// length is read on its own goroutine (at most
// maxDrains at once, each for at most drainFor) after the answer went
// out, and the connection closed: closed with the body still arriving,
// the socket resets, and a client that sends its whole body before
// reading (the SDKs, Python's http.client) saw "Connection error" and
// sent it twice more, instead of a 401. Past maxDrains the connection
// closes at once, as it did for every such body before.
func refuseThenDrain(ctx *fasthttp.RequestCtx, refusal *APIError, limit int64) {
	ctx.Response.Header.Set("x-request-id", newRequestID())
	WriteError(ctx, refusal)
	cl := int64(ctx.Request.Header.ContentLength())
	if !ctx.Request.IsBodyStream() || cl <= maxUnreadBody {
		return
	}
	ctx.SetConnectionClose()
	select {
	case drains <- struct{}{}:
	default:
		return
	}
	answer := []byte(ctx.Response.String())
	bound := min(cl, limit)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		defer func() { <-drains }()
		_ = c.SetDeadline(time.Now().Add(drainFor))
		if _, err := c.Write(answer); err != nil {
			return
		}
		_, _ = io.CopyN(io.Discard, c, bound)
	})
}

const (
	// maxUnreadBody is what fasthttp reads and drops of a body its
	// handler left unread before the next request (its
	// maxUnreadStreamBodySize).
	maxUnreadBody = 256 << 10
	// maxDrains bounds the connections refuseThenDrain reads at once:
	// fasthttp's connection cap does not count them.
	maxDrains = 64
	// drainFor bounds how long one is read.
	drainFor = 30 * time.Second
)

var drains = make(chan struct{}, maxDrains)

// HealthzBody answers GET /healthz, on the public listener and on
// server.metrics_listen: the process answers (liveness). Readiness, which
// says whether calls are taken and billed, is /readyz.
const HealthzBody = `{"status":"ok"}`

// MetricsContentType is the Content-Type of GET /metrics.
const MetricsContentType = "text/plain; version=0.0.4"

// MetricsText renders GET /metrics: the Options.Metrics series, then the
// upstreams', the response store's, the calls' and the refusals'. It is
// what server.metrics_listen serves when set.
func (s *Server) MetricsText() []byte {
	var b []byte
	if s.metrics != nil {
		b = s.metrics()
	}
	b = refusals.appendText(s.calls.appendText(s.responses.metrics(s.world.Load().UpstreamMetrics(b))))
	return s.appendConnectionMetrics(b)
}

// appendConnectionMetrics appends the API listener's client connections
// against their cap (clientConnectionCap). Past the cap a connection is
// answered 503 and closed before any request is read (refuseConnection),
// so those clients are in no other series: without these an operator saw
// only SDK retries and a log line a minute.
func (s *Server) appendConnectionMetrics(b []byte) []byte {
	b = append(b, "# HELP tollgate_client_connections Client connections the API listener holds open now.\n# TYPE tollgate_client_connections gauge\n"...)
	b = fmt.Appendf(b, "tollgate_client_connections %d\n", s.http.GetOpenConnectionsCount())
	if limit := s.connCap; limit > 0 {
		b = append(b, "# HELP tollgate_client_connections_cap Client connections the API listener serves at once, from the process's file limit; past it a connection is answered 503 and closed.\n# TYPE tollgate_client_connections_cap gauge\n"...)
		b = fmt.Appendf(b, "tollgate_client_connections_cap %d\n", limit)
	}
	b = append(b, "# HELP tollgate_client_connections_refused_total Client connections answered 503 and closed because the API listener held tollgate_client_connections_cap already.\n# TYPE tollgate_client_connections_refused_total counter\n"...)
	return fmt.Appendf(b, "tollgate_client_connections_refused_total %d\n", s.refusedConns.Load()+uint64(s.http.GetRejectedConnectionsCount()))
}

// baseURLHint says how the client's base URL is wrong when path is a
// route of the gateway without its /v1 (a base URL of
// http://host:port) or with /v1 twice (http://host:port/v1/v1, or a
// client that adds /v1 itself): both got a bare "no route for POST
// /chat/completions". "" for any other path.
func (s *Server) baseURLHint(ctx *fasthttp.RequestCtx, path []byte) string {
	var meant []byte
	switch {
	case bytes.HasPrefix(path, []byte("/v1/v1/")):
		meant = path[len("/v1"):]
	case !bytes.HasPrefix(path, []byte("/v1/")):
		meant = append([]byte("/v1"), path...)
	default:
		return ""
	}
	if !s.isRoute(meant) {
		return ""
	}
	base := string(ctx.URI().Scheme()) + "://" + string(ctx.Host()) + "/v1"
	if bytes.HasPrefix(path, []byte("/v1/v1/")) {
		return " (/v1 is in the path twice: the base URL ends in one /v1: " + base + ")"
	}
	return " (the base URL ends in /v1: " + base + ")"
}

// isRoute says whether path, under /v1/, is one the gateway serves.
func (s *Server) isRoute(path []byte) bool {
	if _, ok := generationEndpoint(path); ok {
		return true
	}
	if string(path) == "/v1/models" || bytes.HasPrefix(path, modelsPrefix) || bytes.HasPrefix(path, responsesPrefix) {
		return true
	}
	allow, _, _ := allowedMethods(s.mods.Load().routes, string(path))
	_, anyMethod := findRoute(s.mods.Load().routes, AnyMethod, string(path))
	return allow != "" || anyMethod
}

var modelsPrefix = []byte("/v1/models/")

// generationEndpoint says whether path is one of the two generation
// endpoints, and which.
func generationEndpoint(path []byte) (endpoint, bool) {
	switch string(path) {
	case "/v1/chat/completions":
		return endpointChat, true
	case "/v1/responses":
		return endpointResponses, true
	}
	return 0, false
}

// model serves GET /v1/models/{id}: like the list, it needs no key.
func (s *Server) model(ctx *fasthttp.RequestCtx, id []byte) {
	body, ok := s.world.Load().Catalog.ModelJSON(string(id))
	if !ok {
		WriteError(ctx, errModelNotFound(string(id)))
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	WriteError(ctx, notAllowed(ctx, allow))
}

// notAllowed is the 405 of a method that allow does not name, with the
// response's Allow header set.
func notAllowed(ctx *fasthttp.RequestCtx, allow string) *APIError {
	ctx.Response.Header.Set("Allow", allow)
	return errMethodNotAllowed(string(ctx.Method()) + " is not allowed here; use " + allow)
}

// servePlugin serves a module's route, as call reqID (already in the
// response's x-request-id); false when no module has path.
func (s *Server) servePlugin(ctx *fasthttp.RequestCtx, path []byte, reqID string) (served bool) {
	method := string(ctx.Method())
	r, ok, allow, answer := moduleRoute(s.mods.Load().routes, method, string(path))
	if !ok {
		switch {
		case allow == "":
			return false
		case answer != nil:
			refusals.count(path, fasthttp.StatusMethodNotAllowed)
			ctx.Response.Header.Set("Allow", allow)
			answer(ctx, allow)
		default:
			methodNotAllowed(ctx, allow)
		}
		return true
	}
	call := &Call{RequestID: reqID, Start: time.Now(), World: s.world.Load(), Server: s}
	if r.checksKey(ctx) {
		key, apiErr := s.authorize(ctx, r.Scope)
		if apiErr != nil {
			WriteError(ctx, apiErr)
			return true
		}
		call.Key = key
	}
	if r.Limits == LimitCaller {
		var acct accounts.Limits
		var live *accounts.Live
		if call.Key != nil {
			acct, live = s.accountLimits(call.Key.Account)
		}
		call.limit = s.limits.admissionFor(ctx, call, acct, live)
		if apiErr := call.limit.precheck(ctx); apiErr != nil {
			WriteError(ctx, apiErr)
			return true
		}
		defer call.limit.done()
	}
	// A module's fault ends its call, not the process: a panic in a
	// classifier once took every stream and call in flight down with it.
	defer func() {
		if v := recover(); v != nil {
			s.logf("module route %s %s, request %s: panic: %v\n%s", method, path, reqID, v, debug.Stack())
			ctx.Response.Reset()
			ctx.Response.Header.Set("x-request-id", reqID)
			WriteError(ctx, Internal("the gateway failed on this request (request "+reqID+"); it is logged"))
			s.calls.observe("", "", r.Path, fasthttp.StatusInternalServerError, time.Since(call.Start)) // the registered path: bounded labels
			served = true
		}
	}()
	r.Handler(ctx, call)
	return true
}

// moduleRoute returns the module route that serves method on path; if
// none does, the methods that would (allow, "" when no route has path)
// and the route's own answer to the others (Route.MethodNotAllowed).
func moduleRoute(routes map[routeKey]Route, method, path string) (r Route, ok bool, allow string, answer func(*fasthttp.RequestCtx, string)) {
	r, ok = findRoute(routes, method, path)
	if !ok && method == fasthttp.MethodHead {
		// HEAD is GET without the body, as on the gateway's own routes
		// (fasthttp drops the body of an answer to HEAD): HEAD /console
		// was a 405.
		r, ok = findRoute(routes, fasthttp.MethodGet, path)
	}
	if ok {
		return r, true, "", nil
	}
	allow, answerer, exact := allowedMethods(routes, path)
	if !exact {
		r, ok = findRoute(routes, AnyMethod, path)
	}
	if !ok {
		// The route that answers the 405 (MethodNotAllowed), whose
		// MaxBody holds for it too.
		r = answerer
	}
	return r, ok, allow, answerer.MethodNotAllowed
}

// checksKey says whether the route verifies the request's key: always
// where it requires one, and where it takes one that was sent.
func (r *Route) checksKey(ctx *fasthttp.RequestCtx) bool {
	return r.Auth != AuthNone && (len(ctx.Request.Header.Peek("Authorization")) > 0 || r.Auth == AuthRequired)
}

// findRoute returns the route of method for path: the exact one, else
// the "/*" one over it.
func findRoute(routes map[routeKey]Route, method, path string) (Route, bool) {
	if r, ok := routes[routeKey{method, path}]; ok {
		return r, true
	}
	return matchPrefix(routes, method, path)
}

func matchPrefix(routes map[routeKey]Route, method, path string) (Route, bool) {
	for k, r := range routes {
		if k.method == method && strings.HasSuffix(k.path, "/*") && strings.HasPrefix(path, k.path[:len(k.path)-1]) {
			return r, true
		}
	}
	return Route{}, false
}

// allowedMethods returns the methods the routes of path serve, for a
// 405's Allow header, each once (HEAD beside GET, which answers it), and
// whether path has a route of its own
// (exact). A path with one is allowed the methods of its exact routes
// only: "/*" routes over it answered the other methods with a 404, and
// Allow named them (PUT /console/style.css: "GET, POST", POST a 404).
// AnyMethod routes are not named. It also returns the MethodNotAllowed of
// the longest such route that sets one, nil if none does.
func allowedMethods(routes map[routeKey]Route, path string) (allow string, answerer Route, exact bool) {
	for k := range routes {
		exact = exact || k.path == path && k.method != AnyMethod
	}
	var methods []string
	for k, r := range routes {
		matches := k.path == path || !exact && strings.HasSuffix(k.path, "/*") && strings.HasPrefix(path, k.path[:len(k.path)-1])
		if matches && k.method != AnyMethod {
			methods = append(methods, k.method)
			if r.MethodNotAllowed != nil && len(r.Path) > len(answerer.Path) {
				answerer = r
			}
		}
	}
	if slices.Contains(methods, fasthttp.MethodGet) {
		methods = append(methods, fasthttp.MethodHead) // answered as GET
	}
	sort.Strings(methods)
	return strings.Join(slices.Compact(methods), ", "), answerer, exact
}
