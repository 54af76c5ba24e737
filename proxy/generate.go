package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/tokens"
)

type endpoint int

const (
	endpointChat endpoint = iota
	endpointResponses
)

func (e endpoint) path() string {
	if e == endpointChat {
		return "/v1/chat/completions"
	}
	return "/v1/responses"
}

var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// authenticate verifies the bearer key. Every failure is 401 INVALID_API_KEY
// with the reason, never which part of a forged key was wrong beyond that.
// authorize is authenticate, then a check that the key has scope.
func (s *Server) authorize(ctx *fasthttp.RequestCtx, scope string) (*accounts.Key, *APIError) {
	key, apiErr := s.authenticate(ctx)
	if apiErr != nil {
		return nil, apiErr
	}
	if scope != "" && !key.HasScope(scope) {
		return nil, Forbidden("this API key lacks the " + scope + " scope")
	}
	return key, nil
}

func (s *Server) authenticate(ctx *fasthttp.RequestCtx) (*accounts.Key, *APIError) {
	h := ctx.Request.Header.Peek("Authorization")
	if len(h) == 0 {
		return nil, errInvalidKey("missing API key: send the header Authorization: Bearer <API key>")
	}
	if len(h) < 7 || !strings.EqualFold(string(h[:7]), "bearer ") {
		return nil, errInvalidKey("the Authorization header must be: Bearer <API key>")
	}
	key, err := s.accounts.Verify(bytes.TrimSpace(h[7:]))
	if err != nil {
		return nil, errInvalidKey(err.Error())
	}
	return key, nil
}

// checkBalance refuses accounts whose balance is below the grace buffer.
func (s *Server) checkBalance(w *World, key *accounts.Key) *APIError {
	bal, ok := s.accounts.Balance(key.Account)
	if !ok {
		return errInvalidKey("the account of this API key does not exist")
	}
	if bal < -w.grace {
		return errInsufficientBalance(fmt.Sprintf("account %s has a balance of %s USD, below the grace buffer of -%s USD; a top-up resumes service at once", key.Account, bal, w.grace))
	}
	return nil
}

func (s *Server) generation(ctx *fasthttp.RequestCtx, ep endpoint) {
	start := time.Now()
	w := s.world.Load()
	reqID := newRequestID()
	ctx.Response.Header.Set("x-request-id", reqID)
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	key, apiErr := s.authorize(ctx, accounts.ScopeGenerate)
	if apiErr != nil {
		WriteError(ctx, apiErr)
		return
	}
	if apiErr := s.checkBalance(w, key); apiErr != nil {
		WriteError(ctx, apiErr)
		return
	}
	// A key's own rpm/tpm: the request counts now, its tokens once the
	// usage is known, so a key over its tokens waits for its next call.
	limit := s.limits.keyAdmission(key)
	if limit != nil {
		if apiErr := limit.admit(ctx, 0); apiErr != nil {
			WriteError(ctx, apiErr)
			return
		}
	}
	var call *generationCall
	defer func() {
		if call == nil { // refused before reaching the upstream
			limit.done()
		}
	}()
	body := ctx.PostBody()
	f, apiErr := scanRequest(body)
	if apiErr != nil {
		WriteError(ctx, apiErr)
		return
	}
	switch {
	case !f.Model.Exists():
		WriteError(ctx, BadRequest("model", "you must provide a model parameter; valid models: "+w.Catalog.ValidList()))
		return
	case f.Model.Type != gjson.String:
		WriteError(ctx, BadRequest("model", "model must be a string; valid models: "+w.Catalog.ValidList()))
		return
	}
	entry, ok := w.Catalog.Resolve(f.Model.Str)
	if !ok {
		WriteError(ctx, BadRequest("model", fmt.Sprintf("the model %q does not exist or is not allowed; valid models: %s", f.Model.Str, w.Catalog.ValidList())))
		return
	}
	if !key.AllowsModel(entry.ID) {
		WriteError(ctx, Forbidden(fmt.Sprintf("this API key may not use model %q", entry.ID)))
		return
	}
	p := w.pools[entry.ID]
	if p == nil || len(p.members) == 0 {
		WriteError(ctx, Unavailable(fmt.Sprintf("model %q has no configured upstream", entry.ID)))
		return
	}
	rt := &w.Config.Routing
	// A call that continues a stored response goes to the upstream that
	// holds it, and only for the account that created it.
	var pinned *upstream
	if ep == endpointResponses && f.PreviousResponseID.Type != gjson.Null {
		if f.PreviousResponseID.Type != gjson.String {
			WriteError(ctx, wrongType("previous_response_id", "a string", f.PreviousResponseID))
			return
		}
		if pinned, apiErr = s.previousResponse(w, key, p, f.PreviousResponseID.Str); apiErr != nil {
			WriteError(ctx, apiErr)
			return
		}
	}
	var affinity uint64
	if rt.Affinity != "none" && pinned == nil {
		affinity = affinityKey(rt, ctx, body)
	}
	stream := f.Stream.Type == gjson.True

	bufp := bodyPool.Get().(*[]byte)
	out, injected := rewriteRequest((*bufp)[:0], body, &f, entry.UpstreamModelJSON, stream && ep == endpointChat)
	*bufp = out

	call = callPool.Get().(*generationCall)
	call.server, call.ep, call.entry, call.key = s, ep, entry, key
	call.reqID, call.start, call.stream, call.injected = reqID, start, stream, injected
	call.reqBody, call.limit = bufp, limit
	call.span = s.startCallSpan(ctx, start, ep, entry.ID, stream)
	call.pinned = pinned
	// A stored response is remembered as soon as its id is known; "store":
	// false ones are kept nowhere, so there is nothing to find later.
	call.remember = ep == endpointResponses && f.Store.Type != gjson.False
	if info, ok := s.accounts.KeyInfo(key.ID); ok && info.Logging.Enabled {
		// Copied: a stream's events are recorded after the handler returns
		// and fasthttp reuses the request body.
		call.logging = info.Logging
		call.logRequest = string(body)
	}
	resp, up, apiErr := s.attempt(call, p, rt, affinity, out)
	if apiErr != nil {
		upstreamName := ""
		if call.upstream != nil {
			upstreamName = call.upstream.cfg.Name
		}
		s.calls.observe(entry.ID, upstreamName, ep.path(), apiErr.Status, time.Since(start))
		call.failCallSpan(apiErr.Status, apiErr.Message)
		call.release()
		WriteError(ctx, apiErr)
		return
	}
	call.resp = resp
	status := resp.Header.StatusCode()
	copyUpstreamHeaders(ctx, &resp.Header)
	if status < 200 || status > 299 {
		// Upstream errors pass through as they are; no tokens, no bill.
		s.calls.observe(entry.ID, up.cfg.Name, ep.path(), status, time.Since(start))
		call.failCallSpan(status, "upstream answered "+strconv.Itoa(status))
		errBody, err := call.readBody()
		if err != nil {
			call.release()
			WriteError(ctx, upstreamCut(up, err))
			return
		}
		ctx.SetStatusCode(status)
		ctx.SetBody(errBody)
		call.release()
		return
	}
	if stream && bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")) {
		ctx.SetStatusCode(status)
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		ctx.Response.Header.Set("X-Accel-Buffering", "no")
		ctx.SetBodyStream(call, -1)
		return
	}
	call.forwardWhole(ctx, status)
}

// copyUpstreamHeaders forwards the upstream headers a client may act on.
// The gateway's own x-request-id stays; the upstream's is kept under
// x-upstream-request-id for support requests to the provider.
func copyUpstreamHeaders(ctx *fasthttp.RequestCtx, h *fasthttp.ResponseHeader) {
	if ct := h.ContentType(); len(ct) > 0 {
		ctx.Response.Header.SetContentTypeBytes(ct)
	}
	for _, name := range forwardedHeaders {
		if v := h.Peek(name); len(v) > 0 {
			ctx.Response.Header.SetBytesV(name, v)
		}
	}
	if v := h.Peek("X-Request-Id"); len(v) > 0 {
		ctx.Response.Header.SetBytesV("x-upstream-request-id", v)
	}
}

var forwardedHeaders = []string{"Retry-After", "Openai-Processing-Ms", "Openai-Version"}

// generationCall is one forwarded chat or responses request, alive until
// its response is fully relayed and metered.
type generationCall struct {
	server   *Server
	ep       endpoint
	entry    *catalog.Entry
	upstream *upstream
	key      *accounts.Key
	reqID    string
	start    time.Time
	stream   bool
	injected bool
	reqBody  *[]byte
	resp     *upstreamResponse // nil until the upstream answered

	usage     catalog.Usage
	haveUsage bool
	text      []byte // forwarded output text, counted only when usage never came
	rawChunks []byte // chat chunks whose text is read only if usage never came
	ttfb      time.Duration
	// finished is set by what ends a stream's content: [DONE] or a
	// finish_reason (chat), a terminal or error event (responses).
	finished bool

	scratchData, scratchEvent []byte // reused for chunks stripped of usage
	recorded                  bool

	// The relay of a streamed answer (WriteTo, Read, Close).
	sse        *sseReader
	sseStarted bool   // sse reads this call's response (it may come from a pooled call)
	pending    []byte // events read and not yet written
	streamDone bool   // the upstream's stream ended; only io.EOF is left
	closed     bool

	inflight bool       // counted in upstream's in-flight requests until release
	span     trace.Span // nil unless tracing

	pinned   *upstream // the upstream holding previous_response_id; no other is tried
	remember bool      // a responses call whose id is to be remembered

	limit   *admission                 // the key's own limits; nil without
	respBuf *bytebufferpool.ByteBuffer // a non-streamed answer, read by readBody

	// Request logging, for keys that turned it on.
	logging     accounts.Logging
	logRequest  string
	logResponse []byte // a non-streamed answer's body; streams log c.text
}

// keepText reports whether delta text must be kept: to estimate usage the
// upstream has not reported (yet), or to log the assembled answer.
func (c *generationCall) keepText() bool { return !c.haveUsage || c.logging.Enabled }

// terminal reports, for a finished call, whether ev is the event that ends
// the answer for the client: [DONE] in chat (the finish_reason chunk comes
// before the usage chunk), and in responses the terminal event itself, which
// is what set finished.
func (c *generationCall) terminal(ev *sseEvent) bool {
	return c.ep == endpointResponses || bytes.Equal(ev.Data, doneData)
}

// maxEstimateText bounds the text kept for estimating a cut stream's usage.
const maxEstimateText = 4 << 20

func (c *generationCall) release() {
	c.limit.done()
	c.failCallSpan(0, "") // a call released without a usage event or status
	if c.inflight {
		c.upstream.health.inflight.Add(-1)
	}
	if c.respBuf != nil {
		bytebufferpool.Put(c.respBuf)
		c.respBuf = nil
	}
	if c.resp != nil {
		c.resp.Close()
		c.resp = nil
	}
	if cap(*c.reqBody) <= 1<<20 {
		bodyPool.Put(c.reqBody)
	}
	c.recycle()
}

var callPool = sync.Pool{New: func() any { return new(generationCall) }}

// maxPooledScratch bounds the buffers a pooled call keeps.
const maxPooledScratch = 64 << 10

// recycle clears c for its next call, keeping its buffers and SSE reader
// when they are small, and puts it in the pool. Nothing may touch c after.
func (c *generationCall) recycle() {
	keep := func(b []byte) []byte {
		if cap(b) > maxPooledScratch {
			return nil
		}
		return b[:0]
	}
	sse := c.sse
	if sse != nil {
		sse.reset(nil)
		if cap(sse.raw) > maxPooledScratch || cap(sse.data) > maxPooledScratch {
			sse = nil
		}
	}
	*c = generationCall{
		text: keep(c.text), rawChunks: keep(c.rawChunks),
		scratchData: keep(c.scratchData), scratchEvent: keep(c.scratchEvent),
		pending: keep(c.pending), sse: sse,
	}
	callPool.Put(c)
}

// forwardWhole relays a non-streamed response unchanged and meters it.
func (c *generationCall) forwardWhole(ctx *fasthttp.RequestCtx, status int) {
	body, err := c.readBody()
	if err != nil {
		apiErr := upstreamCut(c.upstream, err)
		c.release()
		WriteError(ctx, apiErr)
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetBody(body)
	c.ttfb = time.Since(c.start)
	if c.remember {
		c.rememberResponse(gjson.Get(bstr(body), "id"))
	}
	if u := gjson.Get(bstr(body), "usage"); u.IsObject() {
		c.setUsage(u)
	} else {
		c.collectWholeText(body)
	}
	if c.logging.Enabled {
		c.logResponse = body
	}
	c.recordAndWait(status) // fasthttp sends the answer after the handler returns
	c.release()
}

// upstreamUnreachable is the 503 for an upstream that refused the
// connection or sent no first byte in time; what names its role in the
// call ("" for a generation call).
func upstreamUnreachable(up *upstream, what string, err error) *APIError {
	if isTimeout(err) {
		return Unavailable(fmt.Sprintf("upstream %s%s did not answer within first_byte_timeout (%s)", up.cfg.Name, what, up.cfg.FirstByteTimeout))
	}
	return Unavailable(fmt.Sprintf("upstream %s%s is unreachable: %v", up.cfg.Name, what, err))
}

func upstreamCut(up *upstream, err error) *APIError {
	return &APIError{Status: 502, Type: "upstream_error", Code: "upstream_response_cut",
		Message: fmt.Sprintf("upstream %s: reading its response: %v", up.cfg.Name, err)}
}

// readBody reads a whole answer, up to max_response_body. A read error is
// returned, never passed on as if it were the body.
func (c *generationCall) readBody() ([]byte, error) {
	c.respBuf = bytebufferpool.Get()
	var err error
	c.respBuf.B, err = c.resp.readAll(c.respBuf.B[:0], int64(c.upstream.cfg.MaxResponseBody))
	return c.respBuf.B, err
}

// A streamed answer is the generationCall itself, set as the response's
// body stream: fasthttp calls WriteTo from the connection's own goroutine
// with a writer that sends each Write as one chunk and flushes it, then
// Close however writing ended. Unlike SetBodyStreamWriter, no goroutine and
// no pipe stand between the upstream's events and the client's socket.

// SupportsBodyWriteTo tells fasthttp to frame WriteTo's writes directly.
func (c *generationCall) SupportsBodyWriteTo() bool { return true }

// maxCoalesced bounds the events that arrived together and go out in one
// write.
const maxCoalesced = 16 << 10

// WriteTo relays the upstream's events. Each goes out as soon as it is
// read: events that arrived together in one read from the upstream go out
// together in one write (as a bare nginx hop would send them), and an event
// still arriving never holds back those before it. The event that tells the
// client the answer is complete is written only once the call is billed.
func (c *generationCall) WriteTo(w io.Writer) (int64, error) {
	var n int64
	flush := func() error {
		if len(c.pending) == 0 {
			return nil
		}
		m, err := w.Write(c.pending)
		n += int64(m)
		c.pending = c.pending[:0]
		if c.ttfb == 0 {
			c.ttfb = time.Since(c.start)
		}
		return err // a failed write is a client gone; Close ends the call
	}
	for {
		out, terminal, err := c.nextEvent()
		if err != nil {
			return n, flush()
		}
		if terminal {
			if c.ttfb == 0 {
				c.ttfb = time.Since(c.start) // the whole answer goes out in this write
			}
			if safe := c.record(fasthttp.StatusOK); safe != nil {
				// Events before the terminal one do not wait for the disk.
				if err := flush(); err != nil {
					return n, err
				}
				c.waitRecorded(safe)
			}
		}
		c.pending = append(c.pending, out...)
		if len(c.pending) < maxCoalesced && c.sse.eventBuffered() {
			continue
		}
		if err := flush(); err != nil {
			return n, err
		}
	}
}

// Read serves fasthttp paths that read the body instead of calling WriteTo:
// one event per read, split over several if larger than p.
func (c *generationCall) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		out, terminal, err := c.nextEvent()
		if err != nil {
			return 0, err
		}
		if terminal {
			c.recordAndWait(fasthttp.StatusOK)
		}
		c.pending = append(c.pending[:0], out...)
	}
	n := copy(p, c.pending)
	c.pending = c.pending[:copy(c.pending, c.pending[n:])]
	if c.ttfb == 0 {
		c.ttfb = time.Since(c.start)
	}
	return n, nil
}

// nextEvent returns the next bytes to relay: an upstream event as it came
// (or stripped of the usage the client did not ask for; nil for one dropped
// whole), then, if the upstream broke the stream, an error event; then
// io.EOF. terminal marks the event that tells the client the answer is
// complete. The returned slice is valid until the next call.
func (c *generationCall) nextEvent() (out []byte, terminal bool, err error) {
	if c.streamDone {
		return nil, false, io.EOF
	}
	if c.sse == nil {
		c.sse = newSSEReader(c.resp, 4096, int(c.upstream.cfg.MaxResponseBody))
	} else if !c.sseStarted {
		c.sse.reset(c.resp)
		c.sse.maxEvent = int(c.upstream.cfg.MaxResponseBody)
	}
	c.sseStarted = true
	ev, err := c.sse.Next()
	if err != nil {
		c.streamDone = true
		if err == io.EOF {
			if c.finished {
				return nil, false, io.EOF
			}
			// fasthttp reports a connection closed between two chunks as a
			// plain EOF, so an ending is judged by its content.
			err = io.ErrUnexpectedEOF
		}
		// The upstream broke the stream: end it cleanly with an error event
		// the SDKs raise, instead of pretending it completed.
		msg := fmt.Sprintf("upstream %s stream was interrupted: %v", c.upstream.cfg.Name, err)
		if isTimeout(err) {
			msg = fmt.Sprintf("upstream %s sent nothing for idle_timeout (%s); stream ended", c.upstream.cfg.Name, c.upstream.cfg.IdleTimeout)
		}
		return streamErrorEvent(c.ep, msg), false, nil
	}
	out = ev.Raw
	if c.ep == endpointChat {
		var drop bool
		if out, drop = c.inspectChat(&ev); drop {
			return nil, false, nil
		}
	} else {
		c.inspectResponses(&ev)
	}
	return out, c.finished && c.terminal(&ev), nil
}

// Close ends a streamed call however its relay ended: completed, cut by
// the upstream, or abandoned by a client that went away (fasthttp calls it
// after a failed write, and when it drops a response it never wrote).
// Closing an upstream body that was not read to the end closes that
// connection, which is what aborts generation upstream.
func (c *generationCall) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	c.recordAndWait(fasthttp.StatusOK)
	c.release()
	return nil
}

func streamErrorEvent(ep endpoint, msg string) []byte {
	if ep == endpointChat {
		e := &APIError{Type: "upstream_error", Code: "stream_interrupted", Message: msg}
		body, _ := e.MarshalJSON()
		return append(append([]byte("data: "), body...), "\n\n"...)
	}
	body, _ := sjson.SetBytes([]byte(`{"type":"error","code":"stream_interrupted","param":null}`), "message", msg)
	return append(append([]byte("event: error\ndata: "), body...), "\n\n"...)
}

var doneData = []byte("[DONE]")

// inspectChat reads usage and text from one chat chunk. When the gateway
// injected include_usage, it drops the usage-only chunk and strips the
// usage field the client did not ask for, returning the event to relay.
func (c *generationCall) inspectChat(ev *sseEvent) (out []byte, drop bool) {
	data := ev.Data
	if len(data) == 0 {
		return ev.Raw, false
	}
	if bytes.Equal(data, doneData) {
		c.finished = true
		return ev.Raw, false
	}
	if !c.logging.Enabled && !mayFinish(data) {
		// Most chunks carry only a delta. Their text matters only if the
		// stream ends without usage, so they are kept as they came and
		// read then, instead of parsed now.
		usage := gjson.Result{}
		if bytes.Contains(data, keyUsage) {
			usage = gjson.Get(bstr(data), "usage") // top level only
		}
		if usage.Type != gjson.JSON { // absent or null: no usage yet
			if !c.haveUsage {
				c.keepRawChunk(data)
			}
			if !c.injected || !usage.Exists() {
				return ev.Raw, false
			}
			return c.stripUsage(ev, usage), false
		}
	}
	// One pass over the chunk's members finds both fields.
	var choices, usage gjson.Result
	gjson.Parse(bstr(data)).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "choices":
			choices = v
		case "usage":
			usage = v
		}
		return true
	})
	c.readChoices(choices)
	if usage.IsObject() && ev.Complete {
		c.setUsage(usage)
	}
	if !c.injected || !usage.Exists() {
		return ev.Raw, false
	}
	if choices.IsArray() && isEmptyArray(choices.Raw) {
		return nil, true
	}
	return c.stripUsage(ev, usage), false
}

// stripUsage returns ev without the usage member the client did not ask
// for, or ev as it came where that cannot be done safely.
func (c *generationCall) stripUsage(ev *sseEvent, usage gjson.Result) []byte {
	if ev.dataEnd == 0 {
		return ev.Raw // several data lines: relay untouched rather than guess
	}
	stripped, ok := appendWithoutMember(c.scratchData[:0], ev.Data, usage, "usage")
	if !ok {
		return ev.Raw
	}
	c.scratchData = stripped
	c.scratchEvent = appendWithData(c.scratchEvent[:0], ev, stripped)
	return c.scratchEvent
}

// mayFinish reports whether a chat chunk may set a finish_reason, which
// must be read as the chunk passes. It errs towards yes: anything it does
// not recognise as "finish_reason":null counts.
func mayFinish(data []byte) bool {
	rest := data
	for {
		i := bytes.Index(rest, keyFinishReason)
		if i < 0 {
			return false
		}
		rest = bytes.TrimLeft(rest[i+len(keyFinishReason):], " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			return true
		}
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		if !bytes.HasPrefix(rest, jsonNull) {
			return true
		}
	}
}

var (
	keyUsage        = []byte(`"usage"`)
	keyFinishReason = []byte(`"finish_reason"`)
	jsonNull        = []byte("null")
)

// keepRawChunk keeps a chunk's data, length-prefixed, for textOfRawChunks.
func (c *generationCall) keepRawChunk(data []byte) {
	if len(c.rawChunks)+len(data)+binary.MaxVarintLen64 <= maxEstimateText {
		c.rawChunks = binary.AppendUvarint(c.rawChunks, uint64(len(data)))
		c.rawChunks = append(c.rawChunks, data...)
	}
}

// textOfRawChunks adds the delta text of the chunks keepRawChunk kept.
func (c *generationCall) textOfRawChunks() {
	for b := c.rawChunks; len(b) > 0; {
		n, w := binary.Uvarint(b)
		if w <= 0 || uint64(len(b)-w) < n {
			break
		}
		c.readChoices(gjson.Get(bstr(b[w:w+int(n)]), "choices"))
		b = b[w+int(n):]
	}
	c.rawChunks = c.rawChunks[:0]
}

func isEmptyArray(raw string) bool {
	return len(strings.TrimSpace(raw[1:len(raw)-1])) == 0
}

func (c *generationCall) inspectResponses(ev *sseEvent) {
	data := ev.Data
	if len(data) == 0 {
		return
	}
	typ := string(ev.Name)
	if typ == "" {
		typ = gjson.Get(bstr(data), "type").Str
	}
	switch typ {
	case "response.created":
		if c.remember {
			c.rememberResponse(gjson.Get(bstr(data), "response.id"))
		}
	case "error":
		c.finished = true
	case "response.completed", "response.incomplete", "response.failed":
		c.finished = true
		if u := gjson.Get(bstr(data), "response.usage"); u.IsObject() {
			c.setUsage(u)
		}
	case "response.output_text.delta", "response.reasoning_text.delta", "response.refusal.delta":
		if c.keepText() {
			c.appendText(gjson.Get(bstr(data), "delta").Str)
		}
	}
}

// rememberResponse records which upstream created the response with this
// id, once per call, for its state routes and previous_response_id.
func (c *generationCall) rememberResponse(id gjson.Result) {
	c.remember = false
	if id.Type != gjson.String || id.Str == "" || len(id.Str) > maxResponseID {
		return
	}
	// id.Str points into a buffer that is reused: the store keeps a copy.
	c.server.responses.remember(strings.Clone(id.Str), c.upstream.cfg.Name, c.key.Account, c.entry.ID)
}

// setUsage reads the chat (prompt/completion) or responses (input/output)
// spelling of usage.
func (c *generationCall) setUsage(u gjson.Result) {
	var usage catalog.Usage
	if p := u.Get("prompt_tokens"); p.Exists() {
		usage.PromptTokens = p.Int()
		usage.CompletionTokens = u.Get("completion_tokens").Int()
		usage.CachedTokens = u.Get("prompt_tokens_details.cached_tokens").Int()
		usage.ReasoningTokens = u.Get("completion_tokens_details.reasoning_tokens").Int()
	} else {
		usage.PromptTokens = u.Get("input_tokens").Int()
		usage.CompletionTokens = u.Get("output_tokens").Int()
		usage.CachedTokens = u.Get("input_tokens_details.cached_tokens").Int()
		usage.ReasoningTokens = u.Get("output_tokens_details.reasoning_tokens").Int()
	}
	c.usage.PromptTokens, c.usage.CompletionTokens = usage.PromptTokens, usage.CompletionTokens
	c.usage.CachedTokens, c.usage.ReasoningTokens = usage.CachedTokens, usage.ReasoningTokens
	c.haveUsage = true
}

func (c *generationCall) appendText(s string) {
	if len(c.text)+len(s) <= maxEstimateText {
		c.text = append(c.text, s...)
	}
}

// readChoices notes a finish_reason and, until usage is known, keeps the
// delta text for estimating.
func (c *generationCall) readChoices(choices gjson.Result) {
	choices.ForEach(func(_, ch gjson.Result) bool {
		if ch.Get("finish_reason").Type == gjson.String {
			c.finished = true
		}
		if c.keepText() {
			d := ch.Get("delta")
			c.appendText(d.Get("content").Str)
			c.appendText(d.Get("reasoning_content").Str)
			c.appendText(d.Get("reasoning").Str)
		}
		return true
	})
}

func (c *generationCall) collectWholeText(body []byte) {
	if c.ep == endpointChat {
		gjson.Get(bstr(body), "choices").ForEach(func(_, ch gjson.Result) bool {
			c.appendText(ch.Get("message.content").Str)
			return true
		})
		return
	}
	gjson.Get(bstr(body), "output").ForEach(func(_, item gjson.Result) bool {
		item.Get("content").ForEach(func(_, part gjson.Result) bool {
			c.appendText(part.Get("text").Str)
			return true
		})
		return true
	})
}

// durableWait bounds how long an answer waits for its usage event to reach
// disk; past it the answer goes out anyway (a stuck disk must not hang
// clients) and the event is still on its way.
const durableWait = 2 * time.Second

// recordAndWait records the call's event once and waits, bounded, until the
// meter has it safe from a crash (see meter.DurableRecorder), so the answer
// a client receives is billed even if the gateway is killed right after
// sending it.
func (c *generationCall) recordAndWait(status int) {
	c.waitRecorded(c.record(status))
}

// record records the call's event once. It returns a channel closed when
// the event is safe from a crash, or nil when there is nothing to wait for.
func (c *generationCall) record(status int) <-chan struct{} {
	if c.recorded {
		return nil
	}
	c.recorded = true
	ev := c.event(status)
	c.server.calls.observeEvent(ev)
	c.endCallSpan(ev)
	c.limit.charge(ev.PromptTokens + ev.CompletionTokens)
	d, ok := c.server.recorder.(meter.DurableRecorder)
	if !ok {
		c.server.recorder.Record(ev)
		return nil
	}
	safe := d.RecordDurable(ev)
	select {
	case <-safe:
		return nil // in the kernel's hands already: no wait, no timer
	default:
		return safe
	}
}

// waitRecorded waits for record's channel, at most durableWait: a stuck
// disk must not hang clients, and the event is on its way anyway.
func (c *generationCall) waitRecorded(safe <-chan struct{}) {
	if safe == nil {
		return
	}
	t := time.NewTimer(durableWait)
	defer t.Stop()
	select {
	case <-safe:
	case <-t.C:
		c.server.logf("meter: usage event %s not on disk after %s; answering anyway", c.reqID, durableWait)
	}
}

// event is the call's usage event. Where the upstream never reported
// usage, the prompt and the text actually forwarded are counted with the
// tokenizer and the event says so.
func (c *generationCall) event(status int) *meter.Event {
	u := c.usage
	source := meter.SourceUpstream
	if !c.haveUsage {
		c.textOfRawChunks()
		source = meter.SourceEstimated
		u.PromptTokens = int64(tokens.Count(promptText(*c.reqBody, c.ep)))
		u.CompletionTokens = int64(tokens.Count(string(c.text)))
	}
	if c.entry.Prices.Image != 0 {
		u.Images = countImages(*c.reqBody, c.ep)
	}
	return &meter.Event{
		ID:               c.reqID,
		Time:             c.start.UTC(),
		Account:          c.key.Account,
		KeyID:            c.key.ID,
		Endpoint:         c.ep.path(),
		Model:            c.entry.ID,
		Upstream:         c.upstream.cfg.Name,
		PromptTokens:     u.PromptTokens,
		CachedTokens:     u.CachedTokens,
		CompletionTokens: u.CompletionTokens,
		ReasoningTokens:  u.ReasoningTokens,
		Images:           u.Images,
		CostNanos:        c.entry.Prices.Cost(u),
		UsageSource:      source,
		Status:           status,
		Latency:          time.Since(c.start),
		TTFB:             c.ttfb,
		Stream:           c.stream,
		Log:              c.requestLog(),
	}
}

// requestLog is what a logging key exchanged: the client's request as sent
// and the answer (the body, or for streams the assembled text).
func (c *generationCall) requestLog() *meter.RequestLog {
	if !c.logging.Enabled {
		return nil
	}
	resp := string(c.text)
	if !c.stream {
		resp = string(c.logResponse)
	}
	return &meter.RequestLog{Request: c.logRequest, Response: resp, RetentionDays: c.logging.RetentionDays}
}

// promptText gathers the text of a request's messages (chat) or input and
// instructions (responses), for estimating prompt tokens.
func promptText(body []byte, ep endpoint) string {
	var sb strings.Builder
	add := func(content gjson.Result) {
		if content.Type == gjson.String {
			sb.WriteString(content.Str)
			sb.WriteByte('\n')
			return
		}
		content.ForEach(func(_, part gjson.Result) bool {
			if t := part.Get("text"); t.Type == gjson.String {
				sb.WriteString(t.Str)
				sb.WriteByte('\n')
			}
			return true
		})
	}
	if ep == endpointChat {
		gjson.Get(bstr(body), "messages").ForEach(func(_, m gjson.Result) bool {
			add(m.Get("content"))
			return true
		})
		return sb.String()
	}
	add(gjson.Get(bstr(body), "instructions"))
	input := gjson.Get(bstr(body), "input")
	if input.Type == gjson.String {
		add(input)
	} else {
		input.ForEach(func(_, item gjson.Result) bool {
			add(item.Get("content"))
			return true
		})
	}
	return sb.String()
}

// countImages counts image inputs, billed at the model's image price.
func countImages(body []byte, ep endpoint) int64 {
	var n int64
	list, kind := "messages", "image_url"
	if ep == endpointResponses {
		list, kind = "input", "input_image"
	}
	gjson.Get(bstr(body), list).ForEach(func(_, m gjson.Result) bool {
		m.Get("content").ForEach(func(_, part gjson.Result) bool {
			if part.Get("type").Str == kind {
				n++
			}
			return true
		})
		return true
	})
	return n
}
