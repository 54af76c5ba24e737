package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/config"
)

// attempt sends call to an upstream of its pool and, while the outcome is
// one another upstream may fix (no connection, no first byte in time, 429,
// 502, 503), on to the next, within routing.retries and retry_budget.
// Nothing has gone to the client yet, so a retried call is billed once,
// for the answer returned (an upstream that took it and closed without
// answering may have generated part of it first). A call pinned to
// the upstream holding its previous response goes there or nowhere; one
// whose input's items only prefer their holder (c.first) goes there first,
// and on to the others like any call. The
// returned upstream is also call.upstream; its in-flight count is released
// with the call.
func attempt(c *generationCall, p *pool, rt *config.Routing, affinity uint64, body []byte) (*upstreamResponse, *upstream, *APIError) {
	reqp := bodyPool.Get().(*[]byte)
	defer func() {
		if cap(*reqp) <= 1<<20 {
			bodyPool.Put(reqp)
		}
	}()
	var tried uint64
	var lastErr *APIError
	// failures names each upstream that failed an attempt and why, for
	// the error when every try failed ("b: did not answer within …").
	var failures []string
	// soonest is the least Retry-After of the tries answered 429, 502 or
	// 503 and retried: the error after the last try says when the first
	// of them may take a call again, not only when the last one may.
	var soonest time.Duration
	c.alone = len(p.members) == 1
	for n := 0; ; n++ {
		var up *upstream
		var i int
		var sent ticket
		if c.pinned != nil {
			// The state the call continues lives there and nowhere else.
			up = c.pinned
			now := time.Now().UnixNano()
			var ok bool
			if sent, ok = up.health.send(now); !ok && up.health.resting.Load() {
				// A rest after another caller's 429 steers the pool's
				// calls elsewhere; this one has no elsewhere, and was not
				// the one limited. Sent anyway, as to a model's only
				// upstream (pool.pick): refused, every conversation it
				// held got 503s for the whole Retry-After.
				up.health.await(now)
				sent, ok = ticket{}, true
			}
			if !ok {
				e := Unavailable(fmt.Sprintf("upstream %s%s is unavailable: %s", up.cfg.Name, c.holding(), up.health.describe(now)))
				if until := up.health.openUntil.Load(); until > now {
					e.RetryAfter = time.Duration(until - now) // when its ejection ends, as for a pool all out
				}
				return nil, nil, e
			}
		} else {
			if n == 0 && c.first != nil {
				// Its index goes in tried: a retry goes to the others.
				if i, sent = p.takeMember(c.first); i >= 0 {
					up = c.first
				}
			}
			if up == nil {
				if up, i, sent = p.pick(rt, tried, affinity); up == nil {
					if lastErr != nil {
						return nil, nil, retryAfterSoonest(everyTry(c.entry.ID, lastErr, failures), soonest)
					}
					return nil, nil, retryAfterSoonest(p.allDown(c.entry.ID), soonest)
				}
			}
		}
		tried |= 1 << i
		var before *upstream // the upstream of the try before this one
		if n > 0 {
			before = c.upstream
		}
		c.upstream = up
		head := up.chatHead
		if c.ep == endpointResponses {
			head = up.responsesHead
		}
		span := c.startAttemptSpan(up, n)
		*reqp = appendRequest((*reqp)[:0], head, c.upstreamTraceHeaders(span), body, c.stream)
		sentAt := c.start
		if n > 0 {
			sentAt = time.Now()
		}
		h := &up.health
		h.inflight.Add(1) // awaiting was counted when it was chosen
		firstByte := up.cfg.FirstByteTimeout
		wholeAnswer := !c.stream && !c.engineCall
		if wholeAnswer {
			// The answer comes in one piece once it is generated.
			firstByte = up.cfg.ResponseTimeout
		}
		resp, err := up.pool.roundTrip(*reqp, firstByte, c.client, n > 0)
		reached := sentUpstream(err)
		c.reachedUpstream = c.reachedUpstream || reached
		c.eventStream, c.sseStarted = false, false
		// answerErr is the error a 2xx answer holds in place of an answer.
		var answerErr gjson.Result
		var errStatus int            // its status
		var badAnswer string         // why a 2xx body is no answer (notAnAnswer)
		var refusal string           // the message of a 401 or 403 that refused the gateway's api_key
		var cut bool                 // a whole answer cut short (cutShort)
		var answerWait time.Duration // the Retry-After of an answer that is an error
		if err == nil {
			// An absent Content-Type reads as absent, not as fasthttp's
			// default: the error for a bad answer quoted a "text/plain;
			// charset=utf-8" the upstream never sent.
			resp.Header.SetNoDefaultContentType(true)
			if enc := resp.Header.ContentEncoding(); len(enc) > 0 && !bytes.EqualFold(enc, identity) {
				err = fmt.Errorf("%w: %s", errEncodedAnswer, enc)
				resp.Close()
			}
		}
		if err == nil && resp.Header.StatusCode() < 300 {
			err = resp.awaitBody(wholeAnswer)
			if err == nil && c.stream {
				c.eventStream = c.answersWithEvents(resp)
			}
			if err == nil && c.eventStream {
				// A stream whose first event is an error, not an answer,
				// is the same failure as such a whole body: relayed, it
				// was billed its prompt and recorded a 200.
				if answerErr, err = c.awaitFirstEvent(resp); answerErr.Exists() {
					err, errStatus = errErrorAnswer, resp.Header.StatusCode()
				}
			}
			if err == nil && !c.eventStream {
				// Read whole here, while another upstream may still take
				// the call: passed on, a 200 whose body was an error was
				// billed as an answer, and a stream's SDK read it as an
				// empty stream that succeeded. A classifier engine's call
				// took it for an answer it could not read, asked again up
				// to four times, and was billed each.
				if answerErr = c.readWhole(resp); answerErr.Exists() {
					err, errStatus = errErrorAnswer, resp.Header.StatusCode()
				} else if c.respErr == nil {
					if badAnswer = c.notAnAnswer(resp); badAnswer != "" {
						err, errStatus = errBadAnswer, resp.Header.StatusCode()
					}
				} else if cutShort(c.respErr) {
					// Nothing of it reached the client, as of a body that
					// is no JSON: passed on, a Content-Length cut was a 502
					// with no other member tried, where the same cut of a
					// close-delimited body, read as bad JSON, was retried.
					err, cut = c.respErr, true
				}
			}
			if err != nil && resp.uc.tc != nil && resp.uc.tc.clientGone {
				err = errClientGone
			}
			if errors.Is(err, errErrorAnswer) {
				answerWait = retryAfter(&resp.Header) // read before the answer is closed
			}
			if err != nil {
				c.dropBody()
				resp.Close()
			}
		} else if err == nil && resp.Header.StatusCode() < 400 {
			// A redirect, which no call follows: an http:// base_url of a
			// provider that sends every call to https://. Passed on, the
			// client got the 301 and the front's page without its
			// Location, and the member counted as healthy with nothing
			// logged. Its body says nothing the Location does not.
			badAnswer, errStatus = up.redirectAnswer(&resp.Header), resp.Header.StatusCode()
			err = errBadAnswer
			resp.Close()
		} else if err == nil && resp.Header.StatusCode() <= 499 && resp.Header.StatusCode() != fasthttp.StatusTooManyRequests {
			// An error no client can read: the page of a proxy in front
			// (nginx's "The plain HTTP request was sent to HTTPS port"
			// for an http:// base_url on an https port, on every call).
			// Passed on, every call to that member was a 400 that blamed
			// the client, and the member stayed healthy with nothing
			// logged. Read here, the body is passed on from c.respBuf when
			// it is JSON; a read that failed is passed on as before.
			if c.readWhole(resp); c.respErr == nil {
				if badAnswer = notJSONObject(resp, c.respBuf.B); badAnswer != "" {
					err, errStatus = errBadAnswer, resp.Header.StatusCode()
					c.dropBody()
					resp.Close()
				} else if st := resp.Header.StatusCode(); st == fasthttp.StatusUnauthorized || st == fasthttp.StatusForbidden {
					// The gateway's api_key refused, not the client's:
					// passed on, the SDKs raised AuthenticationError and
					// the user took their own key for bad.
					refusal, errStatus = up.errorMessage(refusalError(c.respBuf.B)), st
					err = errCredentialsRefused
					c.dropBody()
					resp.Close()
				}
			}
		}
		h.awaiting.Add(-1)
		if errors.Is(err, errClientGone) {
			// Nobody waits for the answer: not the upstream's failure, and
			// not worth another upstream's work.
			failAttemptSpan(span, err, err.Error())
			h.inflight.Add(-1)
			if err == errClientGoneUnsent {
				h.undecided(sent) // never sent: nothing to say of the upstream
				if before != nil {
					// A retry that never went out: the call, its 499 in the
					// metrics and the prompt billed are the try's before.
					// Named after this one, they were counted under a
					// member that got nothing.
					c.upstream = before
				}
			} else if wait := time.Since(sentAt); h.held(wait) {
				// Far past its average with no byte: a stopped replica
				// whose every call outlasts its client's timeout was never
				// ejected, and cost a client a timeout every few seconds.
				reason := "no first byte in " + wait.Round(time.Millisecond).String() + ", when its client left"
				up.fail(rt, c.reqID, reason, reason, sent, c.alone, false)
			} else {
				h.undecided(sent)
			}
			c.clientGone = true
			return nil, nil, clientClosed(err)
		}
		if err != nil {
			h.inflight.Add(-1)
			what := c.holding() // no other upstream is tried: say why
			why := unreachableReason(up, err)
			lastErr = Unavailable(fmt.Sprintf("upstream %s%s %s", up.cfg.Name, what, why))
			reason, clientReason := err.Error(), faultForClient(err) // the first with the address, for operators
			if closedWithoutAnswering(err) {
				reason, clientReason = why, why // fasthttp's "error when reading response headers: EOF" said less
			}
			// A connect_timeout is no wait for an answer: nothing was sent.
			timedOut := reached && isTimeout(err)
			generating := timedOut && wholeAnswer
			if timedOut {
				// Its wait is what it costs: left out, a member whose
				// engine was stuck (its API server answering) looked idle
				// and fast after each timeout, and p2c sent it the next
				// calls, each held for the whole timeout.
				h.sample(time.Since(sentAt))
			}
			// requestsFault: the upstream answered with an error that blames
			// the request, which says nothing of its health.
			requestsFault := answerErr.Exists() && !serverFault(answerErr)
			switch {
			case errors.Is(err, errErrorAnswer):
				msg := up.errorMessage(answerErr)
				if requestsFault {
					lastErr = requestFaultAnswer(up.cfg.Name+what, errStatus, answerErr, msg)
					if lastErr.Status == fasthttp.StatusTooManyRequests && answerWait > 0 {
						// Passed on as its own 429's would be.
						lastErr.RetryAfter = answerWait
						if soonest == 0 || answerWait < soonest {
							soonest = answerWait
						}
					}
				} else {
					lastErr = &APIError{Status: 502, Type: "upstream_error", Code: "upstream_bad_answer",
						Message: fmt.Sprintf("upstream %s%s answered %d with an error instead of an answer: %s; it was not passed on as an answer and is not billed",
							up.cfg.Name, what, errStatus, msg)}
				}
				why = fmt.Sprintf("answered %d with an error (%s)", errStatus, msg)
				reason = why
				clientReason = fmt.Sprintf("answered %d with an error", errStatus) // its words are for this call's client
			case errors.Is(err, errBadAnswer):
				lastErr = &APIError{Status: 502, Type: "upstream_error", Code: "upstream_bad_answer",
					Message: fmt.Sprintf("upstream %s%s answered %d with %s; it was not passed on and is not billed", up.cfg.Name, what, errStatus, badAnswer)}
				why = fmt.Sprintf("answered %d with %s", errStatus, badAnswer)
				reason, clientReason = why, why
				switch {
				case errStatus >= 400 && errStatus < 500:
					// A page of a front that may be about this request
					// alone (nginx's 413 for a body over its 1 MiB, a
					// firewall's 403 for a prompt's words): counted
					// against the upstream, one client's requests could
					// eject a whole pool fronted alike. It is still tried
					// on another member, which a misconfigured front
					// (nginx's 400 for http:// on its https port) does
					// not stand before; logged, the operator sees it.
					requestsFault = true
					up.pageInsteadOfError(c.reqID, errStatus, badAnswer)
				case errStatus >= 300 && errStatus < 400:
					// A redirect is the base_url's, as such a front's
					// page is: logged for the operator, tried on
					// another member, and counted against none.
					requestsFault = true
					up.answeredRedirect(c.reqID, errStatus, badAnswer)
				}
			case cut:
				lastErr = upstreamCut(up, err)
				why = "cut its answer short: " + faultForClient(err)
				reason, clientReason = "cut its answer short: "+faultForOperator(err), why
			case errors.Is(err, errCredentialsRefused):
				// Every call to it fails until its api_key is fixed: counted,
				// a pool ejects it and the calls go to the others.
				lastErr = &APIError{Status: 502, Type: "upstream_error", Code: "upstream_credentials_refused",
					Message: fmt.Sprintf("upstream %s%s refused the gateway's credentials for it (answered %d: %s); the gateway's operator must fix its api_key; not billed",
						up.cfg.Name, what, errStatus, refusal)}
				why = fmt.Sprintf("refused the gateway's credentials (answered %d)", errStatus)
				reason = fmt.Sprintf("refused the gateway's credentials (answered %d: %s)", errStatus, refusal)
				clientReason = why
				up.refusedCredentials(c.reqID, errStatus, refusal)
			case generating:
				// The upstream may have been generating all along: another
				// would start over, and be paid for it again.
				lastErr = c.unfinishedAnswer()
				reason = "no answer within response_timeout (" + up.cfg.ResponseTimeout.String() + ")"
				clientReason = reason
				why = "did not finish the answer within response_timeout (" + up.cfg.ResponseTimeout.String() + ")"
			case timedOut:
				reason = "no first byte within first_byte_timeout (" + up.cfg.FirstByteTimeout.String() + ")"
				clientReason = reason
			}
			failAttemptSpan(span, err, reason)
			switch {
			case errors.Is(err, errNoFreeConns):
				// The gateway's own cap is full: the upstream is busy
				// answering, not failing. Counted as a failure, a healthy
				// replica at max_connections was ejected.
				h.busy.Add(1)
				h.undecided(sent)
			case requestsFault:
				// An error that blames the request (context length, bad
				// parameter, a rate limit) says nothing of the upstream's
				// health. Taken for NoRetry, a rate limit, which another
				// upstream may not have, counted as a failure.
				h.undecided(sent)
			default:
				up.fail(rt, c.reqID, reason, clientReason, sent, c.alone, timedOut || cut || answerErr.Exists() || badAnswer != "" || refusal != "")
			}
			failures = append(failures, up.cfg.Name+": "+why)
			if c.pinned == nil && !generating && !lastErr.NoRetry && retryable(n, rt, c.start, p, tried) {
				h.retries.Add(1)
				continue
			}
			c.operatorsFault = errors.Is(err, errCredentialsRefused) ||
				errors.Is(err, errBadAnswer) && errStatus >= 300 && errStatus < 400
			return nil, nil, retryAfterSoonest(everyTry(c.entry.ID, lastErr, failures), soonest)
		}
		status := resp.Header.StatusCode()
		endAttemptSpan(span, status)
		switch {
		case status == fasthttp.StatusTooManyRequests:
			h.count(false)
			// A model's only upstream is not rested (pool.pick): its
			// 429 goes to this caller alone, Retry-After included.
			if d := retryAfter(&resp.Header); d > 0 && !c.alone {
				h.rest(d, "answered 429 with Retry-After "+strconv.Itoa(int(d/time.Second))+"s")
			} else {
				h.undecided(sent) // busy says nothing of its health
			}
		case status >= 500:
			answered := answeredStatus(status)
			up.fail(rt, c.reqID, answered, answered, sent, c.alone, true)
		default:
			// Load first: a Swap on every answer writes memory every call
			// to this upstream shares, though the flag is almost never set.
			if recovered := h.succeeded(sent, time.Since(sentAt)); up.failingAlone.Load() && up.failingAlone.Swap(false) || recovered {
				up.logf("upstream %s is back: a call to it was answered", up.cfg.Name)
			}
			if status > 299 {
				// Passed on as it is: nothing of it is left to break. A
				// 2xx ends the streak once it completes (completed).
				h.endFailingStreak()
			}
		}
		if (status == 429 || status == 502 || status == 503) && c.pinned == nil && retryable(n, rt, c.start, p, tried) {
			failures = append(failures, up.cfg.Name+": "+answeredStatus(status))
			if d := retryAfter(&resp.Header); d > 0 && (soonest == 0 || d < soonest) {
				soonest = d
			}
			resp.Close()
			h.inflight.Add(-1)
			h.retries.Add(1)
			continue
		}
		if (status == 502 || status == 503) && len(failures) > 0 {
			// Earlier tries failed too: the 503 names each, as when the
			// last one could not connect. Passed on, the last upstream's
			// own 502 hid the others, and said "Bad Gateway" for a pool
			// whose every member had failed the call.
			failures = append(failures, up.cfg.Name+": "+answeredStatus(status))
			e := everyTry(c.entry.ID, Unavailable("upstream "+up.cfg.Name+" "+answeredStatus(status)), failures)
			e.RetryAfter = retryAfter(&resp.Header)
			resp.Close()
			h.inflight.Add(-1)
			return nil, nil, retryAfterSoonest(e, soonest)
		}
		c.inflight = true
		c.sent = sent
		return resp, up, nil
	}
}

// awaitFirstEvent waits for a stream's first event: the first whole
// event with a data line, which a client dispatches (a ping with data
// counts: it is relayed as an event). It passes over the comment lines
// (": OPENROUTER PROCESSING") and blank lines some upstreams send while a
// request waits in their queue, and leaves in the buffer, to be relayed
// byte for byte before that event, the blocks without data before it
// (retry:, id:, an event: alone), which SSE dispatches as nothing. Until
// that event nothing is an answer: it is still due within
// first_byte_timeout, and an upstream that stalls or closes before it
// has sent nothing yet and is left for another. Counted as the first
// byte, a comment, a retry: line or half an event kept the call on an
// upstream that then stalled or closed, and the client got a 200 with
// only stream_interrupted, billed its prompt. The comments are not
// relayed. An event that outgrows the read buffer (16 KiB) before its end
// counts: the upstream is answering. When that event is an error and no
// answer (firstEventError: a chat stream's {"error":…} before any chunk,
// a Responses stream's error event), it returns that error; an event
// whose data spans several lines is not looked into. A Responses
// stream's prelude (isPreludeEvent) is no answer either: it is held in
// the buffer, unread, and goes out with the first event after it; a
// stream that ends cleanly after it, or whose prelude fills the buffer,
// is relayed as it came.
func (c *generationCall) awaitFirstEvent(resp *upstreamResponse) (gjson.Result, error) {
	if !c.sseStarted { // opened already when its body told it was a stream
		c.openSSE(resp)
	}
	br := c.sse.br
	if tc := resp.uc.tc; tc != nil {
		// One deadline for the whole wait: re-armed at each comment, it
		// let an upstream that sends one a second hold the call forever.
		defer tc.awaitEventBy()()
	}
	closed := func(err error, pending int) error {
		if err != io.EOF && err != io.ErrUnexpectedEOF { // a chunked body cut between chunks is the latter
			return err
		}
		if pending > 0 {
			return errClosedBeforeEvent
		}
		return errClosedBeforeBody
	}
	// Comment and blank lines before anything else are dropped.
	for {
		b, err := br.Peek(1)
		if err != nil {
			return gjson.Result{}, closed(err, 0)
		}
		if b[0] == '\r' || b[0] == '\n' {
			_, _ = br.Discard(1)
			continue
		}
		if b[0] != ':' {
			break
		}
		for {
			_, err := br.ReadSlice('\n')
			if err == nil {
				break
			}
			if err != bufio.ErrBufferFull {
				return gjson.Result{}, closed(err, 0)
			}
		}
	}
	// Then the buffered bytes are read, not taken, up to the end of the
	// first event with data.
	scanned := 0        // bytes of whole lines looked at
	hasData := false    // the block under way has a data line
	namedError := false // the block under way is named error (event: error)
	named := false      // the block under way has an event: line
	prelude := false    // that line names a Responses prelude event
	held := false       // Responses prelude events came before the block under way
	// Where its data is in the buffer, when it has one data line: offsets,
	// as a read that fills the buffer may move its bytes.
	dataFrom, dataTo := 0, 0
	for {
		b, _ := br.Peek(br.Buffered())
		for {
			n := bytes.IndexByte(b[scanned:], '\n')
			if n < 0 {
				break
			}
			line := b[scanned : scanned+n]
			scanned += n + 1
			line = bytes.TrimSuffix(line, []byte{'\r'})
			if scanned == n+1 {
				line = bytes.TrimPrefix(line, bom) // only ever the stream's first
			}
			switch {
			case len(line) == 0:
				if hasData && c.ep == endpointResponses && (prelude || !named && dataTo > 0 && isPreludeEvent(gjson.GetBytes(b[dataFrom:dataTo], "type").Str)) {
					// Sent before the request reached the engine: still
					// no answer. Left in the buffer, to go out with the
					// event that is one.
					held, hasData, dataFrom, dataTo = true, false, 0, 0
				}
				if hasData {
					return c.firstEventError(b[dataFrom:dataTo], namedError), nil
				}
				namedError, named, prelude = false, false, false
			case bytes.Equal(line, fieldData) || bytes.HasPrefix(line, dataColon):
				dataFrom, dataTo = 0, 0 // a second data line: not looked into
				if !hasData && len(line) > len(dataColon) {
					d := bytes.TrimPrefix(line[len(dataColon):], []byte{' '})
					dataFrom = cap(b) - cap(d) // d's offset in b
					dataTo = dataFrom + len(d)
				}
				hasData = true
			case bytes.HasPrefix(line, eventColon):
				name := bytes.TrimPrefix(line[len(eventColon):], []byte{' '})
				namedError, named, prelude = bytes.Equal(name, typeError), true, isPreludeEvent(bstr(name))
			}
		}
		if br.Buffered() == br.Size() {
			// The prelude events held fill the buffer: relayed as they
			// are, the first of them the first byte.
			return gjson.Result{}, nil
		}
		// One more byte, or the end of the stream.
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			if held && !hasData && err == io.EOF && scanned == br.Buffered() {
				// A stream of its prelude alone, ended cleanly: relayed
				// as it came.
				return gjson.Result{}, nil
			}
			return gjson.Result{}, closed(err, br.Buffered())
		}
	}
}

// isPreludeEvent reports whether a Responses stream's event of this type
// is one an upstream sends before the request reached its engine: vLLM's
// generator yields response.created and response.in_progress (OpenAI
// response.queued too) while the request still waits in its queue.
// Taken for the first byte, they kept a call on an upstream that then
// stalled: first_byte_timeout never fired, no other upstream was tried,
// p2c's latency left out the queue's wait, and the client got a 200 with
// them and stream_interrupted, billed its prompt.
func isPreludeEvent(typ string) bool {
	return typ == "response.created" || typ == "response.in_progress" || typ == "response.queued"
}

var (
	dataColon  = []byte("data:")
	eventColon = []byte("event:")
	typeError  = []byte("error")
)

// firstEventError returns the error a stream's first event holds in place
// of an answer (data its data, namedError whether it came as "event:
// error"), as errorAnswer reads a whole body. On /v1/responses it is also
// OpenAI's own error event, {"type":"error","code":…,"message":…,
// "param":…}, its members flat: relayed as an answer, the client got a
// 200 it could not read (the Node SDK's responses.stream() rejected with
// "expected 'response.created' event, got error"), billed its prompt,
// where the same failure on chat moved on to the pool's next member or
// was the 400 it means. Its "type" is the event's, not the error's, and
// is left out. A response.failed is a response, and stays an answer.
func (c *generationCall) firstEventError(data []byte, namedError bool) gjson.Result {
	if e := errorAnswer(data); e.Exists() || c.ep != endpointResponses || !bytes.Contains(data, typeError) {
		return e
	}
	event := gjson.ParseBytes(data)
	if !event.IsObject() || !namedError && event.Get("type").Str != "error" {
		return gjson.Result{}
	}
	flat, err := sjson.Delete(event.Raw, "type")
	if err != nil {
		return gjson.Result{}
	}
	return gjson.Parse(flat)
}

// errClosedBeforeEvent: the upstream closed a stream before its first
// whole event with data, after some lines that were none.
var errClosedBeforeEvent = errors.New("closed the stream before its first event")

// errErrorAnswer: a 2xx answer whose body is an error (errorAnswer).
var errErrorAnswer = errors.New("answered a success status with an error")

// answersWithEvents reports whether a streamed call's 2xx answer is a
// stream of events: its Content-Type says so, or, without one, its body
// begins as a stream does (a data:, event:, id: or retry: line, or a
// comment). Not read as one, such an answer was buffered whole, the
// client waiting the whole generation, and then refused as a bad answer,
// unbilled; the SDKs read a stream whatever its Content-Type, as they
// would have from the upstream itself. A JSON body begins with "{". A
// Content-Type that names something else is believed.
func (c *generationCall) answersWithEvents(resp *upstreamResponse) bool {
	if ct := resp.Header.ContentType(); len(ct) > 0 {
		return isEventStream(ct)
	}
	c.openSSE(resp)
	b, _ := c.sse.br.Peek(len("retry:")) // a shorter body is no stream; a read error shows again on the next read
	if len(b) > 0 && b[0] == ':' {
		return true
	}
	for _, field := range [...]string{"data:", "event:", "id:", "retry:"} {
		if bytes.HasPrefix(b, []byte(field)) {
			return true
		}
	}
	return false
}

// readWhole reads a whole 2xx answer, up to max_response_body, into
// c.respBuf, for readBody; a read error waits there too. It returns the
// error the answer is in place of an answer (errorAnswer), if it is one.
func (c *generationCall) readWhole(resp *upstreamResponse) gjson.Result {
	c.respBuf = bytebufferpool.Get()
	limit := int64(c.upstream.cfg.MaxResponseBody)
	if c.sseStarted {
		// Its first bytes were read to see whether it was a stream.
		c.respBuf.B, c.respErr = readAllFrom(c.sse.br, c.respBuf.B[:0], limit)
	} else {
		c.respBuf.B, c.respErr = resp.readAll(c.respBuf.B[:0], limit)
	}
	if c.respErr != nil {
		return gjson.Result{}
	}
	return errorAnswer(c.respBuf.B)
}

// notAnAnswer says why a whole 2xx body readWhole read cannot be passed
// on, or "": an HTML page of a proxy in front of the upstream ("502 Bad
// Gateway") or a body cut to the length announced, which relayed as a
// 200 was billed its prompt and failed the SDKs' parsing as a success;
// or, to a streamed request, JSON with no choices (chat) or output
// (responses) to write as a stream (see wholestream.go). Found here,
// another upstream may still take the call.
func (c *generationCall) notAnAnswer(resp *upstreamResponse) string {
	body := c.respBuf.B
	if why := notJSONObject(resp, body); why != "" {
		return why
	}
	if c.stream {
		list, what := "choices", "a chat completion"
		if c.ep == endpointResponses {
			list, what = "output", "a response"
		}
		if !gjson.GetBytes(body, list).IsArray() {
			return fmt.Sprintf("a whole JSON body, to a streamed request, that is not %s (no %q list)", what, list)
		}
	}
	return ""
}

// notJSONObject says, without quoting it, that body is not a JSON
// object, or "" when it looks like one.
func notJSONObject(resp *upstreamResponse, body []byte) string {
	if looksLikeJSONObject(body) {
		return ""
	}
	ct := "no Content-Type"
	if v := resp.Header.ContentType(); len(v) > 0 {
		ct = fmt.Sprintf("Content-Type %q", v)
	}
	return fmt.Sprintf("a body that is not a JSON object (%s, %d bytes)", ct, len(body))
}

// cutShort reports whether err, met reading a whole answer, is the
// upstream cutting it short (a close or reset before its end), not a
// wait past response_timeout (a 504, not retried: it may have been
// generating all along), a body over max_response_body (the setting's
// doing) or a client gone.
func cutShort(err error) bool {
	return !isTimeout(err) && !errors.Is(err, errBodyTooLarge) && !errors.Is(err, errClientGone)
}

// errBadAnswer: a success status with a body that is no answer
// (notAnAnswer), or a 4xx whose body is no JSON error.
var errBadAnswer = errors.New("answered with a body that is no answer and no JSON error")

// errCredentialsRefused: a 401 or 403 in JSON, the upstream refusing
// the gateway's api_key.
var errCredentialsRefused = errors.New("refused the gateway's credentials")

// refusalError is the error of an upstream's 401 or 403 body: its
// "error", or the body itself for a flat one.
func refusalError(body []byte) gjson.Result {
	if e := gjson.GetBytes(body, "error"); isUpstreamError(e) {
		return e
	}
	return gjson.ParseBytes(body)
}

// dropBody frees an answer readWhole read, for one not taken.
func (c *generationCall) dropBody() {
	if c.respBuf != nil {
		bytebufferpool.Put(c.respBuf)
		c.respBuf, c.respErr = nil, nil
	}
}

// readAllFrom reads r to its end into dst, refusing more than limit
// bytes.
func readAllFrom(r io.Reader, dst []byte, limit int64) ([]byte, error) {
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if int64(len(dst)) > limit {
			return dst, fmt.Errorf("%w (%d bytes)", errBodyTooLarge, limit)
		}
		if err == io.EOF {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// errorAnswer returns the error of a whole answer that is an error and
// no answer: a top-level "error" (an object, or a message alone as Ollama
// writes it), or the body itself when it is vLLM's and SGLang's flat
// error ("object":"error" with its "message", "type" and "code", the
// HTTP status it means), without "choices" or "output". A failed
// response, which carries both an error and its output, is an answer.
func errorAnswer(body []byte) gjson.Result {
	if !bytes.Contains(body, keyError) {
		return gjson.Result{}
	}
	r := gjson.GetManyBytes(body, "error", "choices", "output", "object", "message")
	if r[1].Exists() || r[2].Exists() {
		return gjson.Result{}
	}
	if isUpstreamError(r[0]) {
		return r[0]
	}
	if !r[0].Exists() && r[3].Str == "error" && r[4].Type == gjson.String {
		// Relayed, a non-streamed one was a 200 billed its prompt.
		return gjson.ParseBytes(body)
	}
	return gjson.Result{}
}

// requestFaultAnswer is the error for a success status whose body is an
// error that blames the request (serverFault false): the status the error
// means (its 4xx code, 429 for a rate limit, else 400), with the
// upstream's type, code and param, which clients branch on
// (context_length_exceeded: trim the history). As a 502
// upstream_bad_answer it hid them, and the SDKs raised a server error for
// a request they should change.
func requestFaultAnswer(upstream string, status int, e gjson.Result, msg string) *APIError {
	apiErr := &APIError{Status: 400, Type: "invalid_request_error", NoRetry: true, upstreams: true,
		Message: fmt.Sprintf("upstream %s answered %d with an error that blames the request: %s; not billed", upstream, status, msg)}
	typed := false
	if t := e.Get("type"); t.Type == gjson.String && t.Str != "" {
		apiErr.Type, typed = t.Str, true
	}
	if c := e.Get("code"); c.Type == gjson.String && c.Str != "" {
		apiErr.Code = c.Str
	}
	if p := e.Get("param"); p.Type == gjson.String {
		apiErr.Param = p.Str
	}
	for _, key := range [...]string{"code", "type"} {
		v := e.Get(key)
		n, err := strconv.Atoi(v.String())
		switch {
		case err == nil && n >= 400 && n <= 499:
			apiErr.Status = n
		case strings.Contains(strings.ToLower(v.Str), "rate_limit") || strings.Contains(strings.ToLower(v.Str), "quota"):
			apiErr.Status = 429
		default:
			continue
		}
		break
	}
	if apiErr.Status == 429 {
		// The upstream is at its limit, which is no fault of the request:
		// said as its own 429 says it, not as an invalid_request_error
		// that "blames the request".
		apiErr.NoRetry = false // the SDKs wait and ask again, as for the upstream's own 429
		if !typed {
			apiErr.Type = "rate_limit_error"
		}
		apiErr.Message = fmt.Sprintf("upstream %s answered %d with an error saying it is at its limit: %s; not billed", upstream, status, msg)
	}
	return apiErr
}

// clientClosed is the error of a call whose client left before its answer
// (err says when); the client reads nothing, the event and logs do.
func clientClosed(err error) *APIError {
	return &APIError{Status: statusClientClosed, Type: "invalid_request_error", Code: "client_closed_request", Message: err.Error()}
}

// holding is ", which holds …," for a call pinned to the upstream holding
// its state, said after the upstream's name in its errors, or "".
func (c *generationCall) holding() string {
	if c.pinned == nil {
		return ""
	}
	return ", which holds " + c.pinnedBy + ","
}

// statusClientClosed is nginx's status for a call whose client closed the
// connection before the answer: it is what the call's event and metrics
// say; the client is gone and reads nothing.
const statusClientClosed = 499

// everyTry is last, the error of a call's last failed attempt, naming
// every upstream the call tried and why each failed (failures) when it
// tried more than one, as the 503 for a pool whose members are all out
// does. Naming the last alone, a 503 said "upstream b did not answer
// within first_byte_timeout (3s)" when c and a had held the call as long.
func everyTry(model string, last *APIError, failures []string) *APIError {
	if len(failures) < 2 {
		return last
	}
	e := *last
	if e.Status == 503 {
		e.Message = fmt.Sprintf("every upstream tried for model %q failed (%s)", model, strings.Join(failures, "; "))
	} else {
		// The 504 of an answer not finished in time says what to do.
		e.Message = fmt.Sprintf("%s (tried before: %s)", last.Message, strings.Join(failures[:len(failures)-1], "; "))
	}
	return &e
}

// retryAfterSoonest gives e the least of its own Retry-After and soonest,
// the least an upstream tried before asked for; none stays none only when
// no try asked for one.
func retryAfterSoonest(e *APIError, soonest time.Duration) *APIError {
	if soonest > 0 && (e.RetryAfter == 0 || soonest < e.RetryAfter) {
		e.RetryAfter = soonest
	}
	return e
}

// retryable reports whether a call whose attempt n failed may try again.
func retryable(n int, rt *config.Routing, start time.Time, p *pool, tried uint64) bool {
	return n < rt.Retries && time.Since(start) < rt.RetryBudget && p.another(tried)
}

// fail counts a failure of the attempt sent with ticket sent against up
// and, when that ejects it, starts probing it so it comes back as soon as
// it answers again.
//
// An upstream alone in the call's pool is never ejected: ejecting it would
// leave its model nothing to answer with, so one client whose requests
// fail (three tries of one call, with an SDK's retries) would turn into a
// 503 for every other caller. The failure is still counted and shown.
//
// reqID names the call in the log, which says "request <reqID>" where
// it is known (a classifier engine's question has none): the id the
// client got in x-request-id leads to the upstream's failure.
// reason is for operators; clientReason says the same without addresses,
// for the 503s of calls that find the upstream out. tookCall: the
// upstream took the call and failed it (a 5xx, a bad answer, a timeout
// while it held it), not a connection that failed.
func (up *upstream) fail(rt *config.Routing, reqID, reason, clientReason string, sent ticket, alone, tookCall bool) {
	if up.health.failed(rt, reason, clientReason, sent, alone, tookCall) {
		up.ejected(rt, reqID, reason)
		return
	}
	// One alone in its pool is never ejected, so nothing was logged: the
	// Quick start's gateway, with its upstream not started, answered 503s
	// and its log said nothing of where it had tried. Once per state
	// change, as an ejection is.
	if alone && up.failingAlone.CompareAndSwap(false, true) {
		up.logf("upstream %s (%s) failed%s: %s; the only upstream of the model, it is not ejected, and its calls fail until it answers", up.cfg.Name, logURL(up.cfg.BaseURL), onRequest(" on", reqID), reason)
	}
}

// onRequest is " <prep> request <reqID>" for a log line, or "" for a call
// without an id.
func onRequest(prep, reqID string) string {
	if reqID == "" {
		return ""
	}
	return prep + " request " + reqID
}

// logURL is base_url for the log: without its query, which may carry a
// provider's key (?key=…).
func logURL(baseURL string) string {
	u, err := url.Parse(baseURL)
	if err != nil {
		return "base_url unparsable"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// broke counts an answer up cut or stalled after its first byte, of the
// attempt sent with ticket sent; reqID and alone as for fail, streamed
// whether the answer was a stream.
func (up *upstream) broke(rt *config.Routing, reqID, reason, clientReason string, sent ticket, alone, streamed bool) {
	if up.health.brokeMidAnswer(rt, reason, clientReason, sent, alone, streamed) {
		up.ejected(rt, reqID, reason)
		return
	}
	// As in fail: one alone is never ejected, and an upstream that cut
	// every stream was never logged. Once per kind that starts breaking,
	// until an answer of that kind completes (completed).
	if kind := answerKind(streamed); alone && up.brokeAlone.Load()&kind == 0 && up.brokeAlone.Or(kind)&kind == 0 {
		up.logf("upstream %s (%s) broke an answer%s: %s; the only upstream of the model, it is not ejected, and its answers may break until one completes", up.cfg.Name, logURL(up.cfg.BaseURL), onRequest(" to", reqID), reason)
	}
}

// completed records an answer of up relayed whole, of the attempt sent
// with ticket sent (upstreamHealth.completedAnswer), and says in the log
// that an upstream logged as breaking answers of that kind is back.
func (up *upstream) completed(sent ticket, streamed bool) {
	up.health.completedAnswer(sent, streamed)
	// Load first, as for failingAlone: the flag is almost never set.
	if kind := answerKind(streamed); up.brokeAlone.Load()&kind != 0 && up.brokeAlone.And(^kind)&kind != 0 {
		up.logf("upstream %s is back: an answer of it completed", up.cfg.Name)
	}
}

func (up *upstream) ejected(rt *config.Routing, reqID, reason string) {
	up.logf("upstream %s (%s) ejected%s: %s", up.cfg.Name, logURL(up.cfg.BaseURL), onRequest(" after", reqID), reason)
	// Installing a World sets the interval; an upstream that never was
	// (a test's) takes the call's.
	up.probeInterval.CompareAndSwap(0, int64(rt.ProbeInterval))
	up.startProbing()
}

// setProbeInterval puts a reloaded routing.probe_interval in force,
// also for a probe waiting already: it waits the new interval from now.
func (up *upstream) setProbeInterval(d time.Duration) {
	if old := up.probeInterval.Swap(int64(d)); old != int64(d) {
		select {
		case up.probeRetimed <- struct{}{}:
		default:
		}
	}
}

// waitProbeInterval waits one probe interval, the one in force: a
// reload that changes it starts the wait again with the new one.
func (up *upstream) waitProbeInterval() {
	for {
		t := time.NewTimer(time.Duration(up.probeInterval.Load()))
		select {
		case <-t.C:
			return
		case <-up.probeRetimed:
			t.Stop()
		}
	}
}

// startProbing starts probe unless one runs already.
func (up *upstream) startProbing() {
	up.health.mu.Lock()
	start := !up.health.probing
	up.health.probing = true
	up.health.mu.Unlock()
	if start {
		go up.probe()
	}
}

// probe asks an ejected upstream GET {base_url}/models every probe
// interval until it answers (its next call is then the trial) or it
// recovered through a trial call, or a reload removed it. It leaves an
// upstream resting after a 429 alone: the rest ends at its Retry-After.
func (up *upstream) probe() {
	defer func() {
		up.health.mu.Lock()
		up.health.probing = false
		up.health.mu.Unlock()
	}()
	for {
		up.waitProbeInterval()
		if up.retired.Load() || up.health.state.Load() == stateClosed || up.health.resting.Load() || up.health.trialFailed.Load() {
			return
		}
		status, err := up.askModels()
		if err == nil && status < 500 && up.health.probeAnswered() {
			up.logf("upstream %s answered GET /models: its next call is a trial", up.cfg.Name)
			return
		}
	}
}

// CheckUpstreams asks each upstream in force GET {base_url}/models once,
// in the background, and logs each that cannot be reached, with its
// base_url: until a call failed the log said nothing, and the Quick
// start's user, whose upstream was not started, learned of it from a 503.
// An upstream that answers, whatever its status, is not logged.
func (s *Server) CheckUpstreams() {
	for _, up := range s.world.Load().upstreams {
		go up.checkReachable()
	}
}

func (up *upstream) checkReachable() {
	_, err := up.askModels()
	if err == nil || up.retired.Load() {
		return
	}
	hint := ""
	if up.loopback && errors.Is(err, syscall.ECONNREFUSED) {
		hint = "; " + up.loopbackRefusedHint(false)
	}
	up.logf("upstream %s (%s) does not answer GET /models: %v; calls to it fail until it answers%s",
		up.cfg.Name, logURL(up.cfg.BaseURL), err, hint)
}

// askModels asks the upstream GET {base_url}/models, with its api_key,
// within connect_timeout and a second: the breaker's probe and the
// start-up check. It answers the status, or why there was none.
func (up *upstream) askModels() (int, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(up.modelsURL)
	if up.authHeader != "" {
		req.Header.Set("Authorization", up.authHeader)
	}
	err := up.client.DoTimeout(req, resp, up.cfg.ConnectTimeout+time.Second)
	return resp.StatusCode(), err
}

// retryAfter reads a Retry-After header in seconds (the form inference
// servers and OpenAI send) or as an HTTP date, capped at 10 minutes; 0
// without one.
func retryAfter(h *fasthttp.ResponseHeader) time.Duration {
	v := h.Peek("Retry-After")
	if len(v) == 0 {
		return 0
	}
	secs, err := strconv.ParseFloat(string(v), 64)
	if err != nil {
		// HTTP also allows a date ("Wed, 21 Oct 2026 07:28:00 GMT").
		at, err := http.ParseTime(string(v))
		if err != nil {
			return 0
		}
		secs = time.Until(at).Seconds()
	}
	if !(secs > 0) { // NaN too
		return 0
	}
	if secs > 600 { // +Inf too, which no Duration holds
		return 10 * time.Minute
	}
	return min(time.Duration(secs*float64(time.Second)), 10*time.Minute)
}

var identity = []byte("identity")

// isEventStream reports whether a Content-Type names server-sent events,
// in any case and with any parameters (text/event-stream; charset=utf-8).
func isEventStream(contentType []byte) bool {
	const sse = "text/event-stream"
	return len(contentType) >= len(sse) && bytes.EqualFold(contentType[:len(sse)], []byte(sse))
}
