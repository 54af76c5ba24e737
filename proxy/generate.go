package proxy

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/accounts"
	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/config"
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

// generation serves a chat completion or a responses call in three steps:
// admit (key, scope, balance, the key's own limits), prepareCall (the
// request read, its model and route resolved, the upstream body written)
// and forward (attempts, then the answer relayed and metered).
//
// Who frees what: the admission belongs to generation until prepareCall
// returns a call, and to the call from then on. A call owns its admission,
// request buffer, span, upstream in-flight count and response, and frees
// them all exactly once: release for an answer sent whole or an error,
// Close (called by fasthttp when the body stream ends, however it ends)
// for a relayed stream.
func (s *Server) generation(ctx *fasthttp.RequestCtx, ep endpoint) {
	start := time.Now()
	w := s.world.Load()
	reqID := newRequestID()
	ctx.Response.Header.Set("x-request-id", reqID)
	// Before admission: a key revoked after this may have been admitted
	// still, and its stream is looked at again when it opens (addStream).
	revocationsSeen := s.streams.revocations.Load()
	key, limit, apiErr := s.admit(ctx, w)
	if apiErr != nil {
		WriteError(ctx, apiErr)
		return
	}
	call, r, apiErr := s.prepareCall(ctx, w, ep, key)
	if apiErr != nil {
		limit.refused(ctx)
		WriteError(ctx, apiErr)
		// A 5xx here (a model without upstreams, the responses state
		// unreadable) is the gateway failing a valid call: counted as
		// calls are, under no upstream. WriteError counted 4xx refusals.
		if apiErr.Status >= 500 {
			if e, ok := w.Catalog.Resolve(gjson.GetBytes(ctx.PostBody(), "model").Str); ok {
				s.calls.observe(e.ID, "", ep.path(), apiErr.Status, time.Since(start))
			}
		}
		return
	}
	call.reqID, call.start, call.limit, call.client = reqID, start, limit, ctx.Conn()
	call.revocationsSeen = revocationsSeen
	call.span, call.tracer = s.startCallSpan(ctx, start, ep, call.entry.ID, call.stream), s.tracer
	if call.span == nil {
		call.traceHeaders = appendClientTraceHeaders(call.traceHeaders[:0], &ctx.Request.Header)
	}
	s.forward(ctx, call, r)
}

// route is where a prepared call may go, and what it sends.
type route struct {
	pool     *pool
	routing  *config.Routing
	affinity uint64
	body     []byte // the request as the upstream gets it, owned by the call
}

// prepareCall reads the request, resolves its model and the upstreams it
// may go to, and writes the upstream's request. Nothing is acquired until
// every check passed, so a refusal leaves nothing to free.
func (s *Server) prepareCall(ctx *fasthttp.RequestCtx, w *World, ep endpoint, key *accounts.Key) (*generationCall, route, *APIError) {
	body := ctx.PostBody()
	f, apiErr := scanRequest(body)
	if apiErr != nil {
		return nil, route{}, apiErr
	}
	entry, apiErr := resolveModel(w, key, &f)
	if apiErr != nil {
		return nil, route{}, apiErr
	}
	r := route{pool: w.pools[entry.ID], routing: &w.Config.Routing}
	if r.pool == nil || len(r.pool.members) == 0 {
		return nil, route{}, Unavailable(fmt.Sprintf("model %q has no configured upstream", entry.ID))
	}
	// A background response is answered "queued" at once and generated
	// upstream afterwards, where no answer passes through the gateway to
	// be billed from: it was billed a prompt estimate and its output free.
	if ep == endpointResponses && f.Background.Type == gjson.True {
		return nil, route{}, BadRequest("background", "background responses are not served by this gateway: a response is billed from the answer it relays, and a background one is generated after the call has ended; send the request without background (with \"stream\": true a long response is not cut by a timeout)")
	}
	// vLLM and SGLang make a response's id from the request's request_id:
	// a client that chose another account's id took the response over
	// (its mapping, then its GET and DELETE) and overwrote it upstream.
	if ep == endpointResponses && f.RequestID.Exists() {
		return nil, route{}, BadRequest("request_id", "request_id is not accepted on /v1/responses: the upstream makes a response's id from it, and ids are not the client's to choose here; send the request without it")
	}
	// A call that continues a stored response, or names stored items in
	// its input, goes to the upstream that holds them, and only for the
	// account that created them.
	var pinned, first *upstream
	var history int64
	var pinnedBy string
	if ep == endpointResponses {
		// The gateway does not map conversations to their upstream or
		// account: passed on, any account could read any conversation.
		if f.Conversation.Type != gjson.Null {
			return nil, route{}, BadRequest("conversation", "conversation is not served by this gateway (it does not serve the Conversations API, whose state lives on one upstream and is not checked for its account here): "+
				"continue with previous_response_id, or send the earlier items in input")
		}
		var holder string
		var preferred bool
		if f.PreviousResponseID.Type != gjson.Null {
			if f.PreviousResponseID.Type != gjson.String {
				return nil, route{}, wrongType("previous_response_id", "a string", f.PreviousResponseID)
			}
			if holder, history, apiErr = s.previousResponse(key, f.PreviousResponseID.Str); apiErr != nil {
				return nil, route{}, apiErr
			}
			pinnedBy = "the previous_response_id"
		}
		refs, apiErr := itemReferences(f.Input)
		if apiErr != nil {
			return nil, route{}, apiErr
		}
		if len(refs) > 0 {
			held, required, apiErr := s.referencedItems(key, refs)
			if apiErr != nil {
				return nil, route{}, apiErr
			}
			switch {
			case held == "" || held == holder:
			case holder == "":
				holder, preferred = held, !required
				if required {
					pinnedBy = "the items input names by id"
				}
			case required:
				first := refs[slices.IndexFunc(refs, func(r itemRef) bool { return !r.selfContained })].id
				return nil, route{}, BadRequest("input", "the item '"+first+"' that input names by id is stored on another upstream than the previous_response_id, "+
					"and a call reaches one: send its content instead of its item_reference")
			}
			// A reasoning item that carries its text only prefers its
			// upstream: the previous_response_id's wins.
		}
		if holder != "" {
			pinned = pinnedIn(w, r.pool, holder)
		}
		// Items that carry their text can be read anywhere: their holder
		// is no reason to fail when it is down, only the first choice
		// (attempt). Asked with eligible, which takes nothing: take
		// took a holder's half-open trial slot here, and the call's
		// attempt, finding it taken, answered 503 and left the holder
		// half-open with no trial let through.
		if preferred {
			if pinned != nil && pinned.health.eligible(time.Now().UnixNano()) {
				first = pinned
			}
			pinned = nil
		}
	}
	if r.routing.Affinity != "none" && pinned == nil && first == nil {
		r.affinity = affinityKey(r.routing, ctx, body)
	}
	stream := f.Stream.Type == gjson.True

	bufp := bodyPool.Get().(*[]byte)
	out, injected := rewriteRequest((*bufp)[:0], body, &f, entry.UpstreamModelJSON, stream && ep == endpointChat)
	*bufp, r.body = out, out

	call := callPool.Get().(*generationCall)
	call.server, call.ep, call.entry, call.key = s, ep, entry, key
	call.stream, call.injected, call.reqBody, call.pinned = stream, injected, bufp, pinned
	call.history, call.pinnedBy, call.first = history, pinnedBy, first
	if n := f.N.Int(); n > 1 && n <= maxChoices && ep == endpointChat {
		call.choices = int(n)
	}
	// A stored response is remembered as soon as its id is known; "store":
	// false ones are kept nowhere, so there is nothing to find later.
	call.remember = ep == endpointResponses && f.Store.Type != gjson.False
	if info, ok := s.accounts.KeyInfo(key.ID); ok && info.Logging.Enabled {
		// Copied: a stream's events are recorded after the handler returns
		// and fasthttp reuses the request body.
		call.logging = info.Logging
		call.logRequest = string(body)
	}
	return call, r, nil
}

// resolveModel finds the request's model in the catalog and checks the
// key may use it.
func resolveModel(w *World, key *accounts.Key, f *requestFields) (*catalog.Entry, *APIError) {
	entry, apiErr := findModel(w, key, f)
	if apiErr != nil && len(key.Models) > 0 && len(w.ModelsAllowed(key.Models)) == 0 {
		// Its models all left the catalog: whatever the call names, the
		// key can call nothing, and "valid models: " listed none.
		return nil, Forbidden(fmt.Sprintf("this API key may use only models no longer served (%s): an admin must replace it "+
			"(revoke it, and create the account a key for models served)", catalog.ListIDs(key.Models)))
	}
	return entry, apiErr
}

func findModel(w *World, key *accounts.Key, f *requestFields) (*catalog.Entry, *APIError) {
	switch {
	case !f.Model.Exists() || f.Model.Type == gjson.Null:
		return nil, BadRequest("model", "you must provide a model parameter; valid models: "+w.ValidModels(key.Models))
	case f.Model.Type != gjson.String:
		return nil, BadRequest("model", "model must be a string; valid models: "+w.ValidModels(key.Models))
	}
	entry, ok := w.Catalog.Resolve(f.Model.Str)
	if !ok {
		return nil, BadRequest("model", fmt.Sprintf("the model %q does not exist or is not allowed; valid models: %s", f.Model.Str, w.ValidModels(key.Models)))
	}
	if !key.AllowsModel(entry.ID) {
		return nil, Forbidden(fmt.Sprintf("this API key may not use model %q", entry.ID))
	}
	return entry, nil
}

// ValidModels lists, as an error message names them, the models a key
// whose model list is models may use, in catalog order: the whole
// catalog (its list made once per catalog) unless the key is limited to
// some. A limited key was told of models it then got a 403 for. Every
// endpoint's 400 for a model that does not exist lists them so, in the
// order GET /v1/models does.
func (w *World) ValidModels(models []string) string {
	if len(models) == 0 {
		return w.Catalog.ValidList()
	}
	return catalog.ListIDs(w.ModelsAllowed(models))
}

// ModelsAllowed lists, in catalog order, the catalog models a key's model
// list allows (accounts.ModelsAllow: an empty list allows all).
func (w *World) ModelsAllowed(models []string) []string {
	var ids []string
	for _, id := range w.Catalog.IDs() {
		if accounts.ModelsAllow(models, id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// forward sends the call to an upstream of its route and answers the
// client with what came back: a gateway error, the upstream's own error
// passed through, a relayed stream or a whole answer.
func (s *Server) forward(ctx *fasthttp.RequestCtx, call *generationCall, r route) {
	resp, up, apiErr := attempt(call, r.pool, r.routing, r.affinity, r.body)
	if apiErr != nil {
		upstreamName := ""
		if call.upstream != nil {
			upstreamName = call.upstream.cfg.Name
		}
		switch {
		case call.clientGone && call.reachedUpstream:
			// The upstream took the prompt in and was stopped (its
			// connection closed) before it answered: the prompt is
			// billed, on estimate, as for a stream cut before any event.
			// record counts the call in the metrics and ends its span.
			call.record(statusClientClosed)
		case call.clientGone:
			// Gone while the call waited for a connection or a retry:
			// no upstream saw a byte of it, and nothing is billed.
			s.calls.observe(call.entry.ID, upstreamName, call.ep.path(), statusClientClosed, time.Since(call.start))
			call.failCallSpan(statusClientClosed, apiErr.Message)
		default:
			s.calls.observe(call.entry.ID, upstreamName, call.ep.path(), apiErr.Status, time.Since(call.start))
			call.failCallSpan(apiErr.Status, apiErr.Message)
		}
		if !call.reachedUpstream {
			// Refused or given up before it reached an upstream (each
			// refused the connection, was ejected or resting, or its
			// client left first): it costs no request, as a call refused
			// before one is chosen. The SDKs retry a 503 twice: one of
			// their calls used three of a key's rpm.
			call.limit.refused(ctx)
		}
		call.release()
		WriteError(ctx, apiErr)
		return
	}
	call.resp = resp
	status := resp.Header.StatusCode()
	if call.eventStream && status >= 200 && status <= 299 && s.addStream(call, ctx.Conn()) { // removed by its Close
		call.refuseRevoked(ctx)
		return
	}
	copyUpstreamHeaders(ctx, &resp.Header)
	switch {
	case status < 200 || status > 299:
		s.calls.observe(call.entry.ID, up.cfg.Name, call.ep.path(), status, time.Since(call.start))
		call.passUpstreamError(ctx, status)
	case call.eventStream:
		ctx.SetStatusCode(status)
		if len(resp.Header.ContentType()) == 0 { // read as a stream by its body (answersWithEvents)
			ctx.SetContentType("text/event-stream")
		}
		setStreamHeaders(ctx)
		call.clientCtx = ctx
		sendStream(ctx, call)
	default:
		call.forwardWhole(ctx, status)
	}
}

// refuseRevoked answers a stream whose key was revoked while it waited
// for its upstream's first event with the 401 a call of a revoked key
// gets: none of the answer has gone out (it was a 200 with only the
// stream_interrupted event). The upstream took the prompt and answered
// it, so the call is billed as one whose client left before the answer's
// first byte: the prompt, estimated, and the request price.
func (c *generationCall) refuseRevoked(ctx *fasthttp.RequestCtx) {
	c.server.streams.remove(c)
	c.cutUpstream() // addStream did, unless EndStreamsOfKey found the call first
	c.record(fasthttp.StatusUnauthorized)
	c.release()
	WriteError(ctx, errInvalidKey(accounts.ErrRevoked.Error()))
}

// setStreamHeaders marks a response as a stream no cache or proxy may
// hold back (nginx buffers unless told X-Accel-Buffering: no).
func setStreamHeaders(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
}

// passUpstreamError relays an upstream's error answer as it is; no tokens,
// no bill.
func (c *generationCall) passUpstreamError(ctx *fasthttp.RequestCtx, status int) {
	c.failCallSpan(status, "upstream answered "+strconv.Itoa(status))
	errBody, err := c.readBody()
	if err != nil {
		apiErr := upstreamCut(c.upstream, err)
		c.release()
		WriteError(ctx, apiErr)
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetBody(c.upstream.masked(errBody))
	c.release()
}

// copyUpstreamHeaders forwards the upstream headers a client may act on.
// The gateway's own x-request-id stays; the upstream's is kept under
// x-upstream-request-id for support requests to the provider.
func copyUpstreamHeaders(ctx *fasthttp.RequestCtx, h *fasthttp.ResponseHeader) {
	if ct := h.ContentType(); len(ct) > 0 {
		ctx.Response.Header.SetContentTypeBytes(ct)
	}
	var retryAfter, retryAfterMs []byte
	for _, name := range forwardedHeaders {
		if v := h.Peek(name); len(v) > 0 {
			ctx.Response.Header.SetBytesV(name, v)
			switch name {
			case "Retry-After":
				retryAfter = v
			case "Retry-After-Ms":
				retryAfterMs = v
			}
		}
	}
	if len(retryAfter) == 0 {
		// retry-after-ms as the loop read it: peeked again, every
		// answer's headers were searched once more.
		setRetryAfterFromMs(ctx, retryAfterMs)
	}
	if v := h.Peek("X-Request-Id"); len(v) > 0 {
		ctx.Response.Header.SetBytesV("x-upstream-request-id", v)
	}
}

// setRetryAfterFromMs adds the Retry-After, in whole seconds rounded up,
// of an upstream answer that said only retry-after-ms (ms): LangChain JS
// reads Retry-After alone, and took such a 429 for one without a wait,
// which it does not retry at all.
func setRetryAfterFromMs(ctx *fasthttp.RequestCtx, ms []byte) {
	if len(ms) == 0 {
		return
	}
	n, err := strconv.ParseFloat(string(ms), 64)
	if err != nil || !(n > 0) || n > 24*3600*1000 {
		return
	}
	ctx.Response.Header.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(n/1000)), 10))
}

// forwardedHeaders are the upstream's headers a client reads. The OpenAI
// SDKs wait retry-after-ms before Retry-After, and follow x-should-retry
// over their own rule (which retries every 5xx): without it, an upstream
// 500 that said not to retry was sent three times.
var forwardedHeaders = []string{"Retry-After", "Retry-After-Ms", "X-Should-Retry", "Openai-Processing-Ms", "Openai-Version"}

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
	// eventStream: the answer attempt chose is a stream of server-sent
	// events (a 2xx text/event-stream to a streamed request), relayed
	// event by event; a streamed request may get a whole JSON answer.
	eventStream bool
	// engineCall: a classifier engine's question (World.CallModel), a few
	// tokens of answer, whose wait stays first_byte_timeout: its caller
	// falls back to the offline engine, and should not wait a
	// generation's response_timeout to do so.
	engineCall bool
	// operatorsFault: the call's last try failed on the upstream's
	// setting, not its health: a redirect (or a 304), or its api_key
	// refused. An engine's call says so (CallModel, UpstreamFaultError).
	operatorsFault bool
	injected       bool
	reqBody        *[]byte
	resp           *upstreamResponse // nil until the upstream answered

	usage     catalog.Usage
	haveUsage bool
	// reports counts the usage reports believed: each one counts the
	// output before it, and the text kept for it is dropped (see setUsage).
	reports int
	// refusedUsage is the first usage report not believed, why and as it
	// came, logged once the call is billed (see logRefusedUsage).
	refusedUsage string
	// refusedInterim: refusedUsage is an interim report (interimUsage),
	// which a believed report after it makes no refusal to count.
	refusedInterim bool
	// promptTokens is the tokenizer's count of the prompt, once
	// promptCounted (see countedPrompt).
	promptTokens  int64
	promptCounted bool
	// keyRevoked: the stream was ended because its key was revoked
	// (EndStreamsOfKey, addStream), not by its upstream.
	keyRevoked atomic.Bool
	// revocationsSeen is openStreams.revocations before the call's
	// admission.
	revocationsSeen uint64
	// text is forwarded output text not counted yet, and textTokens the
	// tokens of what came before it (see countKeptText): the output after
	// the last usage report, or all of it when none came, which the
	// tokenizer's estimate bills.
	text       []byte
	textTokens int64
	// reasoning is the part of that text that is reasoning (chat's
	// reasoning_content, a response's reasoning text and summaries), kept
	// and counted apart as well, and reasoningTokens the tokens of what
	// came before it: the estimate's reasoning tokens, part of its
	// completion.
	reasoning       []byte
	reasoningTokens int64
	rawChunks       []byte // chat chunks whose text is read only at the end (see keepRawChunk)
	// rawChunksRead counts the times rawChunks was read into text and
	// emptied (see forgetText).
	rawChunksRead int
	// items are the Responses output items the stream delivers: what of
	// each the estimate counted.
	items [outputItemSlots]outputItem
	// toolOutput is what tools the upstream ran answered (MCP calls), not
	// counted yet, and toolOutputTokens the tokens of what came before it:
	// prompt, in an estimate (see appendToolOutput).
	toolOutput       []byte
	toolOutputTokens int64
	ttfb             time.Duration
	// finished is set by what ends a stream's content: [DONE] or a
	// finish_reason for every choice (chat), a terminal or error event
	// (responses).
	finished bool
	// choices is a chat request's n when above 1: a stream cut after one
	// choice's finish_reason has not finished the others. choiceDone marks
	// the indexes that finished, choiceSeen those that came in a chunk (an
	// upstream may answer several without n), and choiceBeyond an index
	// the sets cannot hold (see allChoicesFinished).
	choices      int
	choiceDone   [maxChoices / 64]uint64
	choiceSeen   [maxChoices / 64]uint64
	choiceBeyond bool
	doneSeen     bool // a chat stream's [DONE] came
	// choiceFailed: a choice finished with finish_reason "error", as
	// OpenRouter ends a stream a provider broke.
	choiceFailed bool
	// nextSequence is the sequence_number after the last responses event
	// relayed (its own plus one; each event without one counts one), for
	// the error event that ends a cut stream.
	nextSequence int64

	scratchData, scratchEvent []byte // reused for chunks stripped of usage
	recorded                  bool
	// billed is the usage the call's event bills, once recorded.
	billed catalog.Usage
	// usageShown: a usage report reached the client (a chat chunk's
	// top-level usage, the usage of a response's terminal event), or the
	// gateway's own with billed: one is sent where the client asked for
	// usage and the upstream sent none (appendTerminal).
	usageShown bool
	// chunkHead is the first members of a chat stream's chunks (its id,
	// model…), for the usage chunk of a client that asked for usage.
	chunkHead []byte
	// terminalEvent is the event that ended a responses stream for the
	// client, valid until the next event is read, for appendTerminal.
	terminalEvent sseEvent
	// endedByError: the upstream's own error event ended the answer
	// (endedInError), after which a chat stream gets no usage chunk.
	endedByError bool
	// responseEnded: a responses stream's terminal event came
	// (response.completed, .incomplete, .failed), the one billed before
	// it goes out; its error event is not that one (see terminal).
	responseEnded bool
	// crlf: the upstream's last event ended in CRLF, as the gateway's own
	// events (a usage chunk, an error event) then end.
	crlf bool

	// The relay of a streamed answer (WriteTo, Read, Close).
	sse        *sseReader
	sseStarted bool   // sse reads this call's response (it may come from a pooled call)
	pending    []byte // events read and not yet written
	streamDone bool   // the upstream's stream ended; only io.EOF is left
	closed     bool
	// clientCtx is the request the stream answers, valid while fasthttp
	// writes it, and clientArmed when its write deadline was last moved
	// (expectClientProgress).
	clientCtx   *fasthttp.RequestCtx
	clientArmed time.Time

	inflight bool         // counted in upstream's in-flight requests until release
	span     trace.Span   // nil unless tracing
	tracer   trace.Tracer // the tracer of span, for its attempts' spans
	// traceHeaders are the client's traceparent and tracestate lines,
	// passed on to the upstream when the gateway does not trace itself.
	traceHeaders []byte

	pinned *upstream // the upstream holding previous_response_id or input's items; no other is tried
	// pinnedBy says what pinned the call, for the error when pinned fails.
	pinnedBy string
	// first is the upstream holding input's items that carry their text
	// (they only prefer it): the first attempt goes there, retries to
	// the others as for any call.
	first *upstream
	alone bool // the model's pool has one member, which is never ejected
	// sent is the ticket of the attempt that answered: how its answer's
	// end (completed or broken) is judged, as its failure would have been.
	sent ticket
	// interrupted: the upstream cut or stalled the stream after its first
	// byte; the call is billed (estimated) and counted as such.
	interrupted bool
	remember    bool // a responses call whose id is to be remembered
	// responseID is the id remembered, given the call's tokens at its end.
	responseID string
	// history is the tokens of the response previous_response_id names,
	// which the upstream replays before the call's input: an estimate
	// without it billed a cut stream on a long chain its new words only.
	history int64

	limit   admission                  // the key's and its account's limits
	respBuf *bytebufferpool.ByteBuffer // a non-streamed answer, read by readBody
	respErr error                      // the error reading respBuf ended with

	// Request logging, for keys that turned it on.
	logging     accounts.Logging
	logRequest  string
	logResponse []byte // a non-streamed answer's body
	logText     []byte // a stream's text, as much of it as an event can log
	logLeftOut  int64  // the bytes of a stream's text after logText, not kept

	// client is the client's connection, watched while the upstream has
	// not answered (nil for an engine's call); clientGone says it closed
	// then.
	client     net.Conn
	clientGone bool
	// reachedUpstream: an attempt's request may have reached its
	// upstream (sentUpstream), which may have worked on it.
	reachedUpstream bool
}

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
		text: keep(c.text), reasoning: keep(c.reasoning), logText: keep(c.logText), rawChunks: keep(c.rawChunks), toolOutput: keep(c.toolOutput),
		scratchData: keep(c.scratchData), scratchEvent: keep(c.scratchEvent), chunkHead: keep(c.chunkHead),
		pending: keep(c.pending), sse: sse, traceHeaders: keep(c.traceHeaders),
	}
	callPool.Put(c)
}

// forwardWhole relays a non-streamed response unchanged and meters it.
func (c *generationCall) forwardWhole(ctx *fasthttp.RequestCtx, status int) {
	body, err := c.readBody()
	if errors.Is(err, errClientGone) {
		// The client left while the body came (awaitBody): the upstream
		// connection is closed, which stops its work, and the call is
		// billed as one whose client left before the answer's first
		// byte, since the client got nothing either.
		c.clientGone = true
		c.record(statusClientClosed)
		c.release()
		WriteError(ctx, clientClosed(err))
		return
	}
	if err != nil {
		apiErr := upstreamCut(c.upstream, err)
		reason := fmt.Sprintf("upstream %s: reading its response: %s", c.upstream.cfg.Name, faultForOperator(err))
		if isTimeout(err) && !c.stream {
			// Its body, as its header, was due within response_timeout.
			apiErr = c.unfinishedAnswer()
			reason = "no answer within response_timeout (" + c.upstream.cfg.ResponseTimeout.String() + ")"
		}
		c.failWhole(ctx, err, reason, apiErr)
		return
	}
	c.upstream.completed(c.sent, false)
	if c.remember {
		c.rememberResponse(gjson.Get(bstr(body), "id"))
		if c.responseID != "" {
			c.rememberItems(gjson.Get(bstr(body), "output"))
		}
	}
	collected := false
	u := gjson.Get(bstr(body), "usage")
	if u.IsObject() {
		if reportsNoCompletion(u, c.ep == endpointResponses) {
			// A report of no output is checked against the answer's
			// text (contradictedUsage); believed, it drops the text.
			c.collectWholeText(body)
			collected = true
		}
		c.setUsage(u)
	}
	if !c.haveUsage && !collected { // none, or none to believe: the answer's text is counted
		c.collectWholeText(body)
	}
	if c.logging.Enabled {
		c.logResponse = body
	}
	// Billed before the answer is written: a stream written from it
	// carries the usage billed where the answer has none. fasthttp sends
	// the answer after the handler returns.
	c.ttfb = time.Since(c.start)
	safe := c.record(status)
	// attempt refused a body that is no answer (notAnAnswer).
	relayed := body
	if !c.stream {
		if u.Type == gjson.Null { // absent or null
			relayed = wholeWithBilledUsage(body, c.ep, c.billed)
		}
	} else {
		// A whole answer to a streamed request (see wholestream.go).
		var billed []byte
		switch {
		case c.ep == endpointResponses:
			billed = appendResponsesUsage(nil, c.billed)
		case !c.injected: // the client asked for the usage chunk
			billed = appendChatUsage(nil, c.billed)
		}
		relayed = wholeAnswerAsStream(nil, body, c.ep, billed)
		ctx.Response.Header.SetContentType("text/event-stream")
		setStreamHeaders(ctx)
	}
	if len(c.resp.Header.ContentType()) == 0 && !c.stream {
		// It is a JSON object (attempt): passed on with no Content-Type,
		// the Node SDK returned it as a string.
		ctx.Response.Header.SetContentType("application/json")
	}
	ctx.SetStatusCode(status)
	ctx.SetBody(relayed)
	c.waitRecorded(safe)
	c.release()
}

// wholeWithBilledUsage returns body, a whole answer whose usage is absent or
// null, with it set to the usage billed, as a stream's is (the usage
// chunk, the terminal event's response): a client got "usage": null, or
// none, for a call billed on the tokenizer's estimate, and the SDKs'
// usage was null.
func wholeWithBilledUsage(body []byte, ep endpoint, billed catalog.Usage) []byte {
	var usage []byte
	if ep == endpointResponses {
		usage = appendResponsesUsage(nil, billed)
	} else {
		usage = appendChatUsage(nil, billed)
	}
	filled, err := sjson.SetRawBytes(body, "usage", usage)
	if err != nil {
		return body
	}
	return filled
}

// failWhole answers a non-streamed call whose upstream answer cannot be
// passed on with apiErr: counted against the upstream (reason for its
// operators), in the metrics and the call's span, and not billed.
func (c *generationCall) failWhole(ctx *fasthttp.RequestCtx, err error, reason string, apiErr *APIError) {
	c.answerBroke(err, reason, apiErr.Message)
	c.server.calls.observe(c.entry.ID, c.upstream.cfg.Name, c.ep.path(), apiErr.Status, time.Since(c.start))
	c.failCallSpan(apiErr.Status, apiErr.Message)
	c.release()
	WriteError(ctx, apiErr)
}

// looksLikeJSONObject tells a JSON object from an HTML page or a body cut
// short by its first and last bytes, without parsing the whole answer.
func looksLikeJSONObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) >= 2 && b[0] == '{' && b[len(b)-1] == '}'
}

// answerBroke counts an answer the upstream cut or stalled after its first
// byte against it (upstream.broke), unless it was cut for being larger
// than max_response_body: that is the setting's doing, not the upstream
// failing.
func (c *generationCall) answerBroke(err error, reason, clientReason string) {
	if errors.Is(err, errBodyTooLarge) || errors.Is(err, errEventTooLarge) {
		return
	}
	if isTimeout(err) {
		// Stalled: what it made the call wait enters its latency, as a
		// first byte's wait that timed out does (attempt), so p2c sends
		// the next calls elsewhere. The wait is the deadline it missed.
		wait := c.upstream.cfg.IdleTimeout
		if !c.eventStream {
			wait = c.upstream.cfg.ResponseTimeout
		}
		c.upstream.health.sample(wait)
	}
	c.upstream.broke(&c.server.world.Load().Config.Routing, c.reqID, reason, clientReason, c.sent, c.alone, c.eventStream)
}

// sentUpstream reports whether an attempt that ended with err (nil: an
// answer came) may have got its request to the upstream: all but one
// whose connection could not be opened (connectFailed), or had to wait
// for one of max_connections in vain.
func sentUpstream(err error) bool {
	if err == nil {
		return true // and the target, which errors.As moves to the heap, is not made on every answered attempt
	}
	return !errors.Is(err, errNoFreeConns) && !connectFailed(err) && err != errClientGoneUnsent
}

// upstreamUnreachable is the 503 for an upstream that refused the
// connection or sent no first byte in time; what names its role in the
// call ("" for a generation call).
func upstreamUnreachable(up *upstream, what string, err error) *APIError {
	return Unavailable(fmt.Sprintf("upstream %s%s %s", up.cfg.Name, what, unreachableReason(up, err)))
}

// unreachableReason says, for a client, how up failed an attempt before
// its first byte ("did not answer within first_byte_timeout (5s)").
func unreachableReason(up *upstream, err error) string {
	if isTimeout(err) && !connectFailed(err) {
		return "did not answer within first_byte_timeout (" + up.cfg.FirstByteTimeout.String() + ")"
	}
	if errors.Is(err, errClosedBeforeBody) || errors.Is(err, errClosedBeforeEvent) || errors.Is(err, errEmptyAnswer) || errors.Is(err, errEncodedAnswer) ||
		errors.Is(err, errTooManyInterim) || errors.Is(err, errBadHeader) {
		return err.Error()
	}
	if errors.Is(err, errNoFreeConns) {
		// The gateway's own cap, not the upstream failing: "is
		// unreachable" contradicted the busy member kept in service.
		return "is busy: every connection is in use (max_connections)"
	}
	if closedWithoutAnswering(err) {
		// It took the connection and the request: "is unreachable" sent
		// its operator looking for a network fault.
		return closedWithoutAnsweringReason
	}
	why := "is unreachable: " + reasonForClient(err)
	if up.loopback && errors.Is(err, syscall.ECONNREFUSED) {
		// Said without the address: an upstream on loopback is the
		// gateway's own operator's to start (the Quick start's, with no
		// upstream running, read a bare "connection refused").
		why += " (" + up.loopbackRefusedHint(true) + ")"
	}
	return why
}

// closedWithoutAnswering reports whether err is an upstream closing a
// connection it had taken, after the request went out, before a byte of
// its answer.
func closedWithoutAnswering(err error) bool {
	return (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) && !connectFailed(err)
}

const closedWithoutAnsweringReason = "closed the connection without answering"

// faultForOperator words an error met reading an answer for the
// upstream's last_error and the log: as it is, addresses included, but
// for a close, said in the client's words (faultForClient): Go's and
// fasthttp's "unexpected EOF" and "error when reading response headers:
// EOF" said less than the client read.
func faultForOperator(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return faultForClient(err)
	}
	return err.Error()
}

// loopbackRefusedHint follows the reason of a connection refused by an
// upstream whose base_url is on the gateway's own machine. make
// demo-upstream alone listens on 127.0.0.1:8000: for a base_url elsewhere
// it is given the address as ADDR, in the client's message without it
// (forClient), as that message never names an upstream's address. Done
// literally, "make demo-upstream" started the fake upstream where the
// gateway did not call.
func (up *upstream) loopbackRefusedHint(forClient bool) string {
	demo := "make demo-upstream"
	switch {
	case up.addr == demoUpstreamAddr:
	case forClient:
		demo += " ADDR=HOST:PORT (its base_url's)"
	default:
		demo += " ADDR=" + up.addr
	}
	return "nothing listens at its base_url on the gateway's machine: start the upstream, e.g. " + demo +
		", or point its base_url in gateway.yaml (UPSTREAM_BASE_URL for the shipped file's default upstream) at a running one"
}

// demoUpstreamAddr is where make demo-upstream listens without ADDR.
const demoUpstreamAddr = "127.0.0.1:8000"

// reasonForClient says why a connection failed without where it led: a
// client learns that the upstream is unreachable and why, not its address,
// host name or DNS server ("dial tcp 10.0.3.7:8000: connect: connection
// refused", "lookup gpu-7.internal on 10.0.0.53:53: no such host").
// Operators see the whole error in the admin API's last_error.
func reasonForClient(err error) string {
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var opErr *net.OpError
	var sysErr *os.SyscallError
	var connErr *connectError
	switch {
	case errors.Is(err, errNoFreeConns):
		return err.Error()
	case errors.As(err, &connErr) && connErr.reason != "":
		return connErr.reason
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "it closed the connection"
	case errors.As(err, &dnsErr):
		return "its host name does not resolve"
	case errors.As(err, &certErr), strings.Contains(err.Error(), "tls:"), strings.Contains(err.Error(), "x509:"):
		return "the TLS handshake failed"
	case errors.As(err, &sysErr):
		return sysErr.Err.Error() // "connection refused", "no route to host"
	case errors.As(err, &opErr) && opErr.Timeout():
		return "the connection timed out"
	}
	return "the connection failed"
}

// unfinishedAnswer is the 504 for a non-streamed answer the call's
// upstream did not finish within response_timeout. It is not retried:
// another upstream would generate it all again.
func (c *generationCall) unfinishedAnswer() *APIError {
	return &APIError{Status: 504, Type: "upstream_error", Code: "upstream_timeout", NoRetry: true,
		Message: fmt.Sprintf("upstream %s%s did not finish the answer within response_timeout (%s); ask for a stream (\"stream\": true) for answers that take longer",
			c.upstream.cfg.Name, c.holding(), c.upstream.cfg.ResponseTimeout)}
}

func upstreamCut(up *upstream, err error) *APIError {
	return &APIError{Status: 502, Type: "upstream_error", Code: "upstream_response_cut",
		Message: fmt.Sprintf("upstream %s: reading its response: %s", up.cfg.Name, faultForClient(err))}
}

// faultForClient words an error met reading an answer for the client: the
// gateway's own findings as they are, a socket's error by reasonForClient,
// since Go's wording of it names the gateway's and the upstream's
// addresses ("read tcp 10.0.0.5:35522->10.0.0.9:8000: connection reset
// by peer"). The whole error goes to the upstream's last_error.
func faultForClient(err error) string {
	for _, own := range []error{errEventTooLarge, errBodyTooLarge, errEmptyAnswer, errClosedBeforeBody, errClosedBeforeEvent, errBadChunk, errEncodedAnswer, errTooManyInterim, errBadHeader} {
		if errors.Is(err, own) {
			return err.Error()
		}
	}
	return reasonForClient(err)
}

// readBody reads a whole answer, up to max_response_body. A read error is
// returned, never passed on as if it were the body.
func (c *generationCall) readBody() ([]byte, error) {
	if c.respBuf != nil { // read by attempt (readWhole)
		return c.respBuf.B, c.respErr
	}
	c.respBuf = bytebufferpool.Get()
	var err error
	c.respBuf.B, err = c.resp.readAll(c.respBuf.B[:0], int64(c.upstream.cfg.MaxResponseBody))
	return c.respBuf.B, err
}
