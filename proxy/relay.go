package proxy

// The relay of a streamed answer, event by event, and what it reads from
// the events on the way: finish, usage, the response id.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/utf8cut"
)

// A streamed answer is the generationCall itself, set as the response's
// body stream: fasthttp calls WriteTo from the connection's own goroutine
// with a writer that sends each Write as one chunk and flushes it, then
// Close however writing ended (to an HTTP/1.0 client, sendStream calls
// them, with the connection itself as the writer). Unlike
// SetBodyStreamWriter, no goroutine and no pipe stand between the
// upstream's events and the client's socket.

// SupportsBodyWriteTo tells fasthttp to frame WriteTo's writes directly.
func (c *generationCall) SupportsBodyWriteTo() bool { return true }

// sendStream answers with body, each read of it sent as it comes, and
// closes body once it is written, however writing ended. An HTTP/1.1
// client gets it chunked, written by fasthttp after the handler. An
// HTTP/1.0 client (nginx's default proxy_http_version, curl -0) cannot
// be sent chunked (RFC 9112), yet fasthttp chunked it, having no other
// framing for a body of unknown length, and a client that took the body
// as it came read chunk sizes among the events. It gets the bytes
// unframed, with Connection: close, the body ending as the connection
// closes, written here by the handler, so that a shutdown waits for it as
// for any request.
func sendStream(ctx *fasthttp.RequestCtx, body io.ReadCloser) {
	if ctx.Request.Header.IsHTTP11() {
		ctx.SetBodyStream(body, -1)
		return
	}
	h := &ctx.Response.Header
	h.SetConnectionClose()
	h.SetServer(serverName)
	head := h.AppendBytes(nil)
	conn := ctx.Conn()
	var err error
	if call, ok := body.(*generationCall); ok {
		// The head goes out with the first events, as it does from
		// fasthttp's buffer to an HTTP/1.1 client.
		call.pending = append(head, call.pending...)
	} else {
		_, err = conn.Write(head)
	}
	if err == nil {
		// io.Copy relays through the call's WriteTo; the bare writer
		// keeps the TCP connection's ReadFrom, which would bypass rawconn,
		// out of a stateStream's copy.
		_, _ = io.Copy(struct{ io.Writer }{conn}, body)
	}
	_ = body.Close()
	// fasthttp writes no answer of its own after this one, and closes
	// the connection.
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) {})
}

// maxCoalesced bounds the events that arrived together and go out in one
// write. The SSE reader's buffer and the server's write buffer have the
// same size, so whatever one read from the upstream brought (its reader
// holds 16 KiB) is parsed from one fill and leaves in one write: with 4 KiB
// buffers a 6 KiB answer that came in one read went out in three.
const maxCoalesced = 16 << 10

// WriteTo relays the upstream's events. Each goes out as soon as it is
// read: events that arrived together in one read from the upstream go out
// together in one write (as a bare nginx hop would send them), and an event
// still arriving never holds back those before it. The event that tells the
// client the answer is complete is written only once the call is billed.
func (c *generationCall) WriteTo(w io.Writer) (int64, error) {
	// fasthttp writes the body's last chunk after WriteTo: the upstream
	// may have been quiet for longer than the deadline since the last
	// event went out.
	defer c.expectClientProgress()
	var n int64
	written := c.markText()
	flush := func() error {
		if len(c.pending) == 0 {
			return nil
		}
		c.expectClientProgress()
		m, err := w.Write(c.pending)
		n += int64(m)
		c.pending = c.pending[:0]
		if c.ttfb == 0 {
			c.ttfb = time.Since(c.start)
		}
		if err != nil {
			// A client gone (Close ends the call) never got these events:
			// their text is not the estimate's.
			c.forgetText(written)
			return err
		}
		// Text is counted once the events that brought it are out.
		c.countKeptText()
		written = c.markText()
		return nil
	}
	for {
		out, terminal, err := c.nextEvent()
		if err != nil {
			return n, flush()
		}
		if terminal {
			if c.counting() {
				// The tokenizer's count takes about a second a megabyte:
				// what the upstream sent before the terminal event goes
				// out first, not after it.
				if err := flush(); err != nil {
					return n, err
				}
			}
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
			c.pending = c.appendTerminal(c.pending, out)
		} else {
			c.pending = append(c.pending, out...)
		}
		if len(c.pending) < maxCoalesced && c.sse.eventBuffered() {
			continue
		}
		if err := flush(); err != nil {
			return n, err
		}
	}
}

// expectClientProgress gives the write about to go out idle_timeout to be
// taken by the client's socket: a client that stops reading a stream held
// its upstream, and a slot of its key's concurrency, for as long as it
// kept the connection open, the relay waiting in a write (the server has
// no write timeout, which would cap every stream). The deadline is moved
// at most once every sixteenth of idle_timeout, so each write gets at
// least 15/16 of it: a stream's writes cost a clock read each, and the
// deadline is set once, and again every sixteenth of idle_timeout it
// lasts. fasthttp clears it once the response is written.
func (c *generationCall) expectClientProgress() {
	if c.clientCtx == nil {
		return
	}
	idle := c.upstream.cfg.IdleTimeout
	now := time.Now()
	if now.Sub(c.clientArmed) <= idle/16 {
		return
	}
	if c.clientCtx.SetWriteDeadline(now.Add(idle)) == nil {
		c.clientArmed = now
	}
}

// Read serves fasthttp paths that read the body instead of calling WriteTo:
// one event per read, split over several if larger than p.
func (c *generationCall) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		c.countKeptText() // the text of the events handed over
		out, terminal, err := c.nextEvent()
		if err != nil {
			return 0, err
		}
		c.pending = c.pending[:0]
		if terminal {
			c.recordAndWait(fasthttp.StatusOK)
			c.pending = c.appendTerminal(c.pending, out)
		} else {
			c.pending = append(c.pending, out...)
		}
	}
	n := copy(p, c.pending)
	c.pending = c.pending[:copy(c.pending, c.pending[n:])]
	if c.ttfb == 0 {
		c.ttfb = time.Since(c.start)
	}
	return n, nil
}

// openSSE points the call's SSE reader at resp, the answer it relays
// (once attempt has chosen it: a retried attempt reads a new one).
func (c *generationCall) openSSE(resp *upstreamResponse) {
	if c.sse == nil {
		c.sse = newSSEReader(resp, maxCoalesced, int(c.upstream.cfg.MaxResponseBody))
	} else {
		c.sse.reset(resp)
		c.sse.maxEvent = int(c.upstream.cfg.MaxResponseBody)
	}
	c.sseStarted = true
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
	if !c.sseStarted {
		c.openSSE(c.resp)
	}
	if c.keyRevoked.Load() && !c.finished {
		// Closing the upstream connection ends its reads, not those of
		// the read buffer: an answer that came in one read, the key
		// revoked while it waited for it (addStream), was relayed to its
		// end and billed in full. Nothing more goes out.
		c.streamDone = true
		return streamErrorEvent(c.ep, endedByRevocation, "the API key of this call was revoked; stream ended", c.nextSequence, c.crlf), false, nil
	}
	ev, err := c.sse.Next()
	if err == nil && !ev.Complete && !c.finished {
		// A body that ends on close (HTTP/1.0, neither a length nor
		// chunks) ended inside an event: cut as a chunked body cut there
		// is. Relayed, its bytes and the error event after them made one
		// line no SDK could parse.
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		c.streamDone = true
		// An ending is judged by its content, not by how the connection
		// went: fasthttp reports one closed between two chunks as a plain
		// EOF, and an upstream may reset it after the answer's last event
		// instead of sending [DONE]. The client has the whole answer then,
		// and an error event would have it ask, and pay, again.
		if c.finished {
			if !c.interrupted { // not ended by the upstream's own error
				c.upstream.completed(c.sent, true)
			}
			if c.owesUsageChunk() {
				// Ended after its finish_reason without [DONE], and
				// without the usage chunk the client asked for: the
				// gateway's comes in their place, once billed.
				return nil, true, nil
			}
			return nil, false, io.EOF
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		// The upstream broke the stream: end it cleanly with an error event
		// the SDKs raise, instead of pretending it completed.
		// The operator's last_error keeps the sockets' own words, but for
		// a close, said as the client reads it (faultForOperator).
		msg := fmt.Sprintf("upstream %s stream was interrupted: %s", c.upstream.cfg.Name, faultForClient(err))
		lastError := fmt.Sprintf("upstream %s stream was interrupted: %s", c.upstream.cfg.Name, faultForOperator(err))
		if isTimeout(err) {
			msg = fmt.Sprintf("upstream %s sent nothing for idle_timeout (%s); stream ended", c.upstream.cfg.Name, c.upstream.cfg.IdleTimeout)
			lastError = msg
		}
		// Ended by the gateway (EndStreamsOfKey, CutStreams): no fault of
		// the upstream's, neither in its health nor in the interrupted
		// count and span, which say the upstream cut the stream.
		endedBy := endedByUpstream
		switch {
		case c.keyRevoked.Load():
			endedBy, msg = endedByRevocation, "the API key of this call was revoked; stream ended"
		case c.server.streams.cutting.Load():
			endedBy, msg = endedByShutdown, "the gateway is shutting down and could not wait for this stream to finish; stream ended"
		default:
			c.interrupted = true
			c.failStreamSpan(lastError)
			c.answerBroke(err, lastError, msg)
		}
		return streamErrorEvent(c.ep, endedBy, msg, c.nextSequence, c.crlf), false, nil
	}
	out = ev.Raw
	c.crlf = bytes.HasSuffix(ev.Raw, blankCRLF)
	if c.ep == endpointChat {
		var drop bool
		if out, drop = c.inspectChat(&ev); drop {
			return nil, false, nil
		}
	} else {
		c.inspectResponses(&ev)
	}
	if c.endedByError {
		// The upstream's own error event, as its error status's body.
		out = c.upstream.masked(out)
	}
	terminal = c.finished && c.terminal(&ev)
	if terminal {
		c.expectEnd()
		if c.ep == endpointResponses {
			c.terminalEvent = ev
		}
	}
	return out, terminal, nil
}

// endGrace is how long an upstream has to end its body after the event
// that ends its answer (a Responses stream's response.completed,
// incomplete or failed, not its error event, after which more may come:
// see terminal; a chat stream's [DONE]). One
// that kept the connection open held the client's body open for
// idle_timeout (60 s by default) after it, and the SDKs, which read a
// stream to its end, with it. Past endGrace the stream ends for the
// client as if the body had, and the connection, its body unfinished,
// is closed; a body that ends in time leaves it to be used again.
const endGrace = 500 * time.Millisecond

// expectEnd makes the reads after the answer's last event wait endGrace
// at most.
func (c *generationCall) expectEnd() {
	if c.resp != nil && c.resp.uc != nil && c.resp.uc.tc != nil {
		c.resp.uc.tc.ending = true
	}
}

// appendTerminal appends out, the event that ends the answer for the
// client, to dst once the call is billed, with the usage billed where
// the client asked for usage and the upstream sent none (many vLLM and
// Ollama setups): a chat stream's usage chunk, as OpenAI sends it, before
// [DONE] (or in its place, at the end of a stream without it); a
// responses stream's terminal event with its response's usage, absent or
// null, set. The SDKs' usage was empty while the call was billed on the
// tokenizer's estimate.
func (c *generationCall) appendTerminal(dst, out []byte) []byte {
	switch {
	case c.owesUsageChunk():
		c.usageShown = true
		dst = append(append(dst, "data: "...), c.chunkHead...)
		if len(c.chunkHead) == 0 { // no chunk came before
			dst = append(dst, `{"object":"chat.completion.chunk",`...)
		}
		dst = appendChatUsage(append(dst, `"choices":[],"usage":`...), c.billed)
		dst = append(append(dst, '}'), eventEnd(c.crlf)...)
	case c.ep == endpointResponses && !c.usageShown:
		if withUsage := c.withBilledUsage(&c.terminalEvent); withUsage != nil {
			c.usageShown = true
			out = withUsage
		}
	}
	return append(dst, out...)
}

// owesUsageChunk reports whether a chat stream's client asked for usage
// (the gateway did not add include_usage) and no usage chunk reached it,
// nor the upstream's error event, after which OpenAI sends none.
func (c *generationCall) owesUsageChunk() bool {
	return c.ep == endpointChat && c.stream && !c.injected && !c.usageShown && !c.endedByError
}

// withBilledUsage returns ev, a responses stream's terminal event, with
// its response's usage, absent or null, set to the usage billed; nil
// when it has a usage of its own, or no response to carry one (an error
// event).
func (c *generationCall) withBilledUsage(ev *sseEvent) []byte {
	data := bstr(ev.Data)
	at, cut, member := 0, 0, ""
	switch usage := gjson.Get(data, "response.usage"); {
	case usage.Type == gjson.Null && usage.Raw != "":
		at, cut = usage.Index, len(usage.Raw)
	case !usage.Exists():
		response := gjson.Get(data, "response")
		if !response.IsObject() {
			return nil
		}
		// Before its closing brace, after a comma unless it is {}.
		at, member = response.Index+len(response.Raw)-1, `,"usage":`
		if isEmptyArray(response.Raw) {
			member = member[1:]
		}
	default:
		return nil
	}
	if at <= 0 || at+cut > len(data) {
		return nil // gjson could not say where
	}
	c.scratchData = append(append(c.scratchData[:0], data[:at]...), member...)
	c.scratchData = append(appendResponsesUsage(c.scratchData, c.billed), data[at+cut:]...)
	if ev.dataEnd == 0 { // several data lines, or a byte order mark first
		c.scratchEvent = appendWithDataLines(c.scratchEvent[:0], ev, c.scratchData)
	} else {
		c.scratchEvent = appendWithData(c.scratchEvent[:0], ev, c.scratchData)
	}
	return c.scratchEvent
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
	c.server.streams.remove(c)
	c.release()
	return nil
}

// The type of a chat stream's closing error event says whose doing the end
// was, as the status of the same failure before the stream began would:
// code that sorts errors by type blamed the provider for a revoked key
// and for the gateway's shutdown, which were all upstream_error.
const (
	endedByUpstream   = "upstream_error"
	endedByRevocation = "authentication_error"      // as the 401 of a revoked key
	endedByShutdown   = "service_unavailable_error" // as the gateway's 503s
)

// streamErrorEvent is the event that ends a cut stream; errType is one of
// the endedBy types. A responses one has no error type (OpenAI's error
// event has none: its type is "error"), and carries sequence_number, the
// next after the upstream's last, as every responses event does (0 when
// none came; events without one count as numbered in turn). Its lines
// end in CRLF when crlf says the upstream's did.
func streamErrorEvent(ep endpoint, errType, msg string, sequence int64, crlf bool) []byte {
	end := eventEnd(crlf)
	if ep == endpointChat {
		e := &APIError{Type: errType, Code: "stream_interrupted", Message: msg}
		body, _ := e.MarshalJSON()
		return append(append([]byte("data: "), body...), end...)
	}
	body, _ := sjson.SetBytes([]byte(`{"type":"error","code":"stream_interrupted","param":null}`), "message", msg)
	body, _ = sjson.SetBytes(body, "sequence_number", sequence)
	ev := append([]byte("event: error"), end[:len(end)/2]...)
	return append(append(append(ev, "data: "...), body...), end...)
}

// eventEnd is what ends an event of the gateway's own: its last line's
// end and the blank line, in CRLF when the upstream's events end so.
func eventEnd(crlf bool) []byte {
	if crlf {
		return blankCRLF
	}
	return blankLF
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
		c.finished, c.doneSeen = true, true
		return ev.Raw, false
	}
	if startsWithError(data) {
		if e := gjson.Get(bstr(data), "error"); isUpstreamError(e) {
			// The upstream's own error event ends its answer: closed after
			// it, the stream is not cut, and a second error would only
			// repeat it.
			c.endedInError(e)
			return ev.Raw, false
		}
	}
	if len(c.chunkHead) == 0 && !c.injected {
		// From the first chunk of a stream whose client asked for usage:
		// the usage chunk the gateway may send at its end
		// (appendTerminal) carries the stream's id and model.
		c.chunkHead = appendChunkHead(c.chunkHead, gjson.Parse(bstr(data)))
	}
	if !c.logging.Enabled && !mayFinish(data) && !mayNameOtherChoice(data) {
		// Most chunks carry only a delta. Their text matters only if no
		// usage report comes after them, so they are kept as they came
		// and read at the end, instead of parsed now. They carry the
		// first choice, whose finish_reason a stream needs in any case:
		// a chunk of another is parsed, for the choices the stream holds.
		usage := gjson.Result{}
		if bytes.Contains(data, keyUsage) {
			usage = gjson.Get(bstr(data), "usage") // top level only
		}
		if usage.Type != gjson.JSON { // absent or null: no usage yet
			c.keepRawChunk(data)
			if !c.injected || !usage.Exists() {
				return ev.Raw, false
			}
			return c.stripUsage(ev, usage), false
		}
	}
	// One pass over the chunk's members finds both fields, and whether it
	// carries anything a chunk of OpenAI's does not.
	var choices, usage, groq, upstreamError gjson.Result
	own := false
	gjson.Parse(bstr(data)).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "choices":
			choices = v
		case "usage":
			usage = v
		case "id", "object", "created", "model", "system_fingerprint", "service_tier", "obfuscation":
		case "x_groq":
			groq = v
			own = true
		case "error":
			upstreamError = v
			own = true
		default:
			own = true
		}
		return true
	})
	report := usage
	if !usage.IsObject() && groq.IsObject() {
		// Groq reports a stream's usage in its own member, on the chunk
		// that finishes the answer, and none at the top level: read only
		// there, a call was billed the tokenizer's estimate, 7.9 times
		// less. The member stays as it came, stripped or not: it is
		// Groq's, sent whatever the client asked.
		report = groq.Get("usage")
	}
	// A report counts the chunk it comes in: vLLM's cumulative usage in
	// every chunk costs no count of its text.
	reported := report.IsObject() && ev.Complete && c.setUsage(report)
	c.readChoices(choices, reported)
	// OpenRouter ends a stream its provider broke with a chunk whose
	// choice finishes with "error" and whose error follows its choices,
	// which startsWithError does not see: the answer counted as
	// completed, the upstream's error rate 0. Such a chunk is parsed
	// anyway, for its finish_reason.
	switch {
	case isUpstreamError(upstreamError):
		c.endedInError(upstreamError)
	case c.choiceFailed:
		c.endedInError(finishedInError)
	}
	if !c.injected {
		c.usageShown = c.usageShown || usage.IsObject()
		return ev.Raw, false
	}
	if !usage.Exists() {
		return ev.Raw, false
	}
	// The usage chunk the client did not ask for goes, unless it carries
	// more than usage: llama.cpp moves its timings onto it when usage is
	// asked for, and they were lost.
	if choices.IsArray() && isEmptyArray(choices.Raw) && !own {
		return nil, true
	}
	return c.stripUsage(ev, usage), false
}

// stripUsage returns ev without the usage member the client did not ask
// for, or ev as it came where that cannot be done safely.
func (c *generationCall) stripUsage(ev *sseEvent, usage gjson.Result) []byte {
	stripped, ok := appendWithoutMember(c.scratchData[:0], ev.Data, usage, "usage")
	if !ok {
		return ev.Raw
	}
	c.scratchData = stripped
	if ev.dataEnd == 0 { // several data lines, or a byte order mark first
		c.scratchEvent = appendWithDataLines(c.scratchEvent[:0], ev, stripped)
	} else {
		c.scratchEvent = appendWithData(c.scratchEvent[:0], ev, stripped)
	}
	return c.scratchEvent
}

// finishedInError is the error of a choice that finished with
// finish_reason "error" and no error member to say more.
var finishedInError = gjson.Result{Type: gjson.String, Str: `a choice finished with finish_reason "error"`}

// startsWithError reports whether a chunk's first member is "error", as an
// upstream's error event is written (vLLM and OpenAI alike), or is
// "type":"error" (Anthropic's OpenAI-compatible API, its error after it):
// a prefix check, because searching every chunk for the word cost the
// relay 5 %.
func startsWithError(data []byte) bool {
	if len(data) == 0 || data[0] != '{' {
		return false
	}
	rest := skipJSONSpace(data[1:])
	if bytes.HasPrefix(rest, keyError) {
		return true
	}
	if !bytes.HasPrefix(rest, keyType) {
		return false
	}
	rest = skipJSONSpace(rest[len(keyType):])
	if len(rest) == 0 || rest[0] != ':' {
		return false
	}
	return bytes.HasPrefix(skipJSONSpace(rest[1:]), keyError)
}

// isUpstreamError reports whether an error event's error is one: an
// object (OpenAI, vLLM), or a message alone, as Ollama writes it.
func isUpstreamError(e gjson.Result) bool {
	return e.IsObject() || e.Type == gjson.String
}

// endedInError ends the answer on the upstream's own error event (e is
// its error): closed after it, the stream is not cut, though what the
// upstream sends after it is still relayed and counted (see terminal).
// When the error is the upstream's fault rather than the
// request's, counts the answer as one the upstream broke (answerBroke):
// in its error rate, last_error and the streak that ejects it, and in
// tollgate_requests_interrupted_total, since the client got a 200 and
// then an error event, as for a cut stream. Counted as completed, it
// proved the upstream: a replica whose engine had died ended half its
// streams in "EngineDeadError" and stayed in service, its error rate
// near 0.
func (c *generationCall) endedInError(e gjson.Result) {
	c.finished, c.endedByError = true, true
	if c.interrupted || !serverFault(e) {
		return
	}
	c.interrupted = true
	name := c.upstream.cfg.Name
	msg := e.Str
	if e.IsObject() {
		msg = e.Get("message").Str
	}
	msg = utf8cut.Shorten(string(c.upstream.masked([]byte(msg))), 200) // the log may be read by others than the key's holder
	code := ""
	if cd := e.Get("code"); e.IsObject() && (cd.Type == gjson.Number || cd.Type == gjson.String) && cd.Raw != "" && len(cd.String()) <= 40 {
		code = " (" + cd.String() + ")"
	}
	lastError := fmt.Sprintf("upstream %s ended a stream with its own error%s: %s", name, code, msg)
	c.failStreamSpan(lastError)
	// Other clients read the reason in a 503 while it is out: the
	// upstream's own words stay with the operator and this call's client.
	c.answerBroke(nil, lastError, fmt.Sprintf("upstream %s ended a stream with its own error%s", name, code))
}

// serverFault reports whether an upstream's error (an error event's, or
// a failed response's) is the upstream's fault: a 5xx code, a server
// error, or nothing saying it is the request's. A 4xx code, or a code or
// type naming the request (invalid_request_error, BadRequestError,
// context_length_exceeded, rate_limit_exceeded, …), is the request's,
// and says nothing of the upstream's health.
func serverFault(e gjson.Result) bool {
	if !e.IsObject() {
		return true // a message alone (Ollama), or no error object at all
	}
	for _, key := range [...]string{"code", "type"} {
		v := e.Get(key)
		if v.Type == gjson.Number {
			return v.Int() < 400 || v.Int() > 499
		}
		if v.Type != gjson.String {
			continue
		}
		if n, err := strconv.Atoi(v.Str); err == nil {
			return n < 400 || n > 499
		}
		lower := strings.ToLower(v.Str)
		for _, request := range requestFaults {
			if strings.Contains(lower, request) {
				return false
			}
		}
	}
	return true
}

// requestFaults are words of error codes and types that blame the
// request, not the upstream (OpenAI's, vLLM's exception names).
var requestFaults = [...]string{"invalid", "bad_request", "badrequest", "not_found", "notfound",
	"rate_limit", "context_length", "quota", "content_filter", "content_policy"}

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
		rest = skipJSONSpace(rest[i+len(keyFinishReason):])
		if len(rest) == 0 || rest[0] != ':' {
			return true
		}
		rest = skipJSONSpace(rest[1:])
		if !bytes.HasPrefix(rest, jsonNull) {
			return true
		}
	}
}

// mayNameOtherChoice reports whether a chat chunk may carry a choice
// other than the first, which must be noted as the chunk passes (see
// seeChoice). A streamed chunk carries one choice, whose "index" comes
// before its delta's (a tool call's): only the first "index" is read,
// which keeps the look to the chunk's head. It errs towards yes: an
// "index" it does not read as 0 counts. Reading every "index" of every
// chunk cost a fifth of a relayed chunk's time.
func mayNameOtherChoice(data []byte) bool {
	i := bytes.Index(data, keyIndex)
	if i < 0 {
		return false
	}
	rest := skipJSONSpace(data[i+len(keyIndex):])
	if len(rest) == 0 || rest[0] != ':' {
		return true
	}
	rest = skipJSONSpace(rest[1:])
	return len(rest) < 2 || rest[0] != '0' || rest[1] >= '0' && rest[1] <= '9' || rest[1] == '.' || rest[1] == 'e' || rest[1] == 'E'
}

// skipJSONSpace is b past its leading JSON whitespace. bytes.TrimLeft
// with a cutset built its set on every call: a fifth of a relayed chunk's
// time.
func skipJSONSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	return b
}

var (
	keyIndex        = []byte(`"index"`)
	keyUsage        = []byte(`"usage"`)
	keyError        = []byte(`"error"`)
	keyType         = []byte(`"type"`)
	keyFinishReason = []byte(`"finish_reason"`)
	jsonNull        = []byte("null")
)

// keepRawChunk keeps a chunk's data, length-prefixed, for textOfRawChunks.
// Chunks that would not fit are read for their text first: dropped, a
// long stream without usage was billed at most the ~27,000 tokens whose
// chunks fit in maxEstimateText of JSON, however much it forwarded.
func (c *generationCall) keepRawChunk(data []byte) {
	if len(c.rawChunks)+len(data)+binary.MaxVarintLen64 > maxEstimateText {
		c.textOfRawChunks()
		if len(data)+binary.MaxVarintLen64 > maxEstimateText {
			c.readChoices(gjson.Get(bstr(data), "choices"), false)
			return
		}
	}
	c.rawChunks = binary.AppendUvarint(c.rawChunks, uint64(len(data)))
	c.rawChunks = append(c.rawChunks, data...)
}

// textOfRawChunks adds the delta text of the chunks keepRawChunk kept.
func (c *generationCall) textOfRawChunks() {
	if len(c.rawChunks) > 0 {
		c.rawChunksRead++
	}
	for b := c.rawChunks; len(b) > 0; {
		n, w := binary.Uvarint(b)
		if w <= 0 || uint64(len(b)-w) < n {
			break
		}
		c.readChoices(gjson.Get(bstr(b[w:w+int(n)]), "choices"), false)
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
	if n := gjson.Get(bstr(data), "sequence_number"); n.Type == gjson.Number {
		c.nextSequence = n.Int() + 1
	} else {
		// Numbered as the upstream would have: the error event of a cut
		// stream said 0 after events without numbers, and SDKs that sort
		// by them put it first.
		c.nextSequence++
	}
	// Not string(ev.Name): a copy, allocated for the names longer than
	// 32 bytes (response.function_call_arguments.delta) on every event.
	typ := bstr(ev.Name)
	if typ == "" {
		typ = gjson.Get(bstr(data), "type").Str
	}
	switch typ {
	case "response.created":
		if c.remember {
			c.rememberResponse(gjson.Get(bstr(data), "response.id"))
		}
	case "error":
		e := gjson.Parse(bstr(data))
		if inner := e.Get("error"); inner.IsObject() { // some nest it as chat does
			e = inner
		}
		c.endedInError(e)
	case "response.completed", "response.incomplete", "response.failed":
		c.finished, c.responseEnded = true, true
		if typ == "response.failed" {
			// response.incomplete is a normal end (max_output_tokens, a
			// content filter), not a failure.
			c.endedInError(gjson.Get(bstr(data), "response.error"))
		}
		if u := gjson.Get(bstr(data), "response.usage"); u.IsObject() {
			c.setUsage(u)
			c.usageShown = true
		}
		if c.remember { // no response.created came before
			c.rememberResponse(gjson.Get(bstr(data), "response.id"))
		}
		if c.responseID != "" {
			c.rememberItems(gjson.Get(bstr(data), "response.output"))
		}
	case "response.output_text.delta", "response.reasoning_text.delta", "response.refusal.delta",
		"response.reasoning_summary_text.delta":
		item, part, text, reasoning := textPartEvent(data)
		c.appendPartText(item, part, text, false, reasoning || strings.HasPrefix(typ, "response.reasoning_"))
	case "response.output_text.done", "response.reasoning_text.done", "response.refusal.done", "response.content_part.done",
		"response.reasoning_summary_text.done", "response.reasoning_summary_part.done":
		// A part's text whole, after deltas that carried it or none: an
		// upstream that sends no deltas was billed none of it.
		item, part, text, reasoning := textPartEvent(data)
		c.appendPartText(item, part, text, true, reasoning || strings.HasPrefix(typ, "response.reasoning_"))
	case "response.function_call_arguments.delta", "response.custom_tool_call_input.delta", "response.mcp_call_arguments.delta",
		"response.code_interpreter_call_code.delta":
		c.appendToolInput(gjson.Get(bstr(data), "output_index").Int(), gjson.Get(bstr(data), "delta").Str)
	case "response.output_item.added", "response.output_item.done":
		// A tool call's name comes whole here, never in a delta: a cut
		// stream of tool calls was billed their arguments only. Some
		// upstreams send its input whole here too, in done alone even.
		c.appendOutputItem(gjson.Get(bstr(data), "output_index").Int(), typ == "response.output_item.added", gjson.Get(bstr(data), "item"))
	case "response.function_call_arguments.done", "response.mcp_call_arguments.done",
		"response.custom_tool_call_input.done", "response.code_interpreter_call_code.done":
		// The input whole, after deltas that carried it or none: an
		// upstream that sends no deltas was billed the call's name only.
		c.appendWholeToolCall(gjson.Get(bstr(data), "output_index").Int(), false, "", gjson.Get(bstr(data), toolInputDoneKey(typ)).Str)
	}
}

// textPartEvent reads a text part's event in one pass over its members:
// the output item, the part (a content index, or a summary index), and
// its text, a delta or the part whole ("text", "refusal", or a "part"
// object holding either), and whether the part is reasoning (a summary
// part, or a part of type reasoning_text). Three lookups, each a scan of
// the event, cost every delta of a Responses stream three times one.
func textPartEvent(data []byte) (item int64, part textPart, text string, reasoning bool) {
	gjson.Parse(bstr(data)).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "output_index":
			item = v.Int()
		case "content_index":
			part.index = v.Int()
		case "summary_index":
			part.summary, part.index = true, v.Int()
		case "delta", "text", "refusal":
			text = v.Str
		case "part":
			if text = v.Get("text").Str; text == "" {
				text = v.Get("refusal").Str
			}
			reasoning = v.Get("type").Str == "reasoning_text"
		}
		return true
	})
	return item, part, text, reasoning || part.summary
}

// toolInputDoneKey is the member of a tool call's input done event that
// holds the input whole, as toolInputKey is that of its output item.
func toolInputDoneKey(event string) string {
	switch event {
	case "response.custom_tool_call_input.done":
		return "input"
	case "response.code_interpreter_call_code.done":
		return "code"
	}
	return "arguments"
}

// rememberResponse records which upstream created the response with this
// id, once per call, for its state routes and previous_response_id.
func (c *generationCall) rememberResponse(id gjson.Result) {
	c.remember = false
	if id.Type != gjson.String || id.Str == "" || len(id.Str) > maxResponseID {
		return
	}
	// id.Str points into a buffer that is reused: the store keeps a copy.
	c.responseID = strings.Clone(id.Str)
	c.server.responses.remember(c.responseID, c.upstream.cfg.Name, c.key.Account, c.entry.ID, c.stream)
}

// rememberItems records the ids of a remembered response's output items
// (its body's output, or the terminal event's response.output), which a
// later call can name in its input as item_reference: they live on the
// same upstream and belong to the same account. Read once per call, from
// an event the relay parses anyway; the events in between cost nothing.
func (c *generationCall) rememberItems(output gjson.Result) {
	if !output.IsArray() {
		return
	}
	n := 0
	output.ForEach(func(_, item gjson.Result) bool {
		if id := item.Get("id"); id.Type == gjson.String && id.Str != "" && len(id.Str) <= maxResponseID {
			// id.Str points into a buffer that is reused.
			c.server.responses.rememberItem(strings.Clone(id.Str), c.upstream.cfg.Name, c.key.Account, c.entry.ID)
		}
		n++
		return n < maxItemIDs
	})
}

// terminal reports, for a finished call, whether ev is the event that ends
// the answer for the client: [DONE] in chat (the finish_reason chunk comes
// before the usage chunk), and in responses the terminal event itself. Not
// the upstream's error event, which also finishes the call: whatever the
// upstream sends after it is relayed, and was not counted once the call
// was billed at the error (200 words and response.completed after it,
// its usage report unread, billed the estimate of the words before it).
// A stream that ends at its error is billed as it closes, as a cut one.
func (c *generationCall) terminal(ev *sseEvent) bool {
	if c.ep == endpointResponses {
		return c.responseEnded
	}
	return bytes.Equal(ev.Data, doneData)
}
