package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/catalog"
	"github.com/tollgate/tollgate/internal/utf8cut"
	"github.com/tollgate/tollgate/meter"
)

// ErrModelUnavailable wraps every failure of CallModel that is not the
// model's own answer: unknown model, upstream down or too slow. Plugins
// answer it with 503 or fall back to an offline engine.
var ErrModelUnavailable = errors.New("model unavailable")

// ModelError is a non-2xx answer of the upstream to CallModel.
type ModelError struct {
	Status int
	Body   []byte
	// RetryAfter is the answer's Retry-After (a 429's, a 503's); 0 when
	// it gave none.
	RetryAfter time.Duration
}

// unavailableError is ErrModelUnavailable with when the model's
// upstreams are back, as far as the gateway knows (every one resting
// after a 429, or ejected).
type unavailableError struct {
	msg        string
	retryAfter time.Duration
}

func (e *unavailableError) Error() string { return ErrModelUnavailable.Error() + ": " + e.msg }
func (e *unavailableError) Unwrap() error { return ErrModelUnavailable }

// UpstreamFaultError is a failure of CallModel that only the gateway's
// operator can fix, which a chat call gets as Answer: an upstream's
// redirect (502 upstream_bad_answer naming where it points: a base_url
// that is not where its API answers) or unasked-for 304, or its 401 or
// 403 (502 upstream_credentials_refused: its api_key). It is
// ErrModelUnavailable too, as the model cannot answer until it is fixed:
// auto falls back to an offline engine. Taken for the upstream down, an
// explicit call was a 503 to retry later that named neither.
type UpstreamFaultError struct {
	Answer *APIError
}

func (e *UpstreamFaultError) Error() string {
	return ErrModelUnavailable.Error() + ": " + e.Answer.Message
}
func (e *UpstreamFaultError) Unwrap() error { return ErrModelUnavailable }

// RetryAfter is how long a failed CallModel asked its caller to wait
// before asking again: the upstream's Retry-After, or when the first of
// its resting or ejected upstreams is back; 0 when nothing said.
func RetryAfter(err error) time.Duration {
	var me *ModelError
	var ue *unavailableError
	switch {
	case errors.As(err, &me):
		return me.RetryAfter
	case errors.As(err, &ue):
		return ue.retryAfter
	}
	return 0
}

func (e *ModelError) Error() string {
	return fmt.Sprintf("upstream answered %d: %s", e.Status, utf8cut.Shorten(string(e.Body), 200))
}

// CallModel sends a non-streamed chat completion for a catalog model
// through the same attempts as client traffic — connection pools,
// timeouts, model mapping, retries on another upstream while nothing was
// generated — and returns the body and usage. body is a chat request whose
// "model" is the catalog id; it is rewritten to the upstream's name here.
// CallModel records no event: the plugin that calls it meters its whole
// call, so the tokens are billed once. ctx is checked before the call
// starts; the upstream's timeouts bound it after that. A ctx from
// Call.ModelCallContext makes the call part of the client's trace.
func (w *World) CallModel(ctx context.Context, model string, body []byte) (respBody []byte, usage catalog.Usage, err error) {
	entry, ok := w.Catalog.Resolve(model)
	if !ok {
		return nil, catalog.Usage{}, fmt.Errorf("%w: %q is not in the catalog", ErrModelUnavailable, model)
	}
	p := w.pools[entry.ID]
	if p == nil || len(p.members) == 0 {
		return nil, catalog.Usage{}, fmt.Errorf("%w: %q has no upstream", ErrModelUnavailable, model)
	}
	f, apiErr := scanRequest(body)
	if apiErr != nil {
		return nil, catalog.Usage{}, fmt.Errorf("building model request: %s", apiErr.Message)
	}
	if err := ctx.Err(); err != nil {
		return nil, catalog.Usage{}, err
	}
	out, _ := rewriteRequest(nil, body, &f, entry.UpstreamModelJSON, false)
	call := &generationCall{ep: endpointChat, entry: entry, start: time.Now(), engineCall: true}
	call.traceModelCall(ctx)
	defer func() { call.endModelCallSpan(usage, err) }()
	resp, up, apiErr := attempt(call, p, &w.Config.Routing, 0, out)
	note, _ := ctx.Value(upstreamNoteKey{}).(*UpstreamNote)
	if call.reachedUpstream && note != nil {
		note.reach()
	}
	if apiErr != nil && apiErr.Status >= 400 && apiErr.Status < 500 && apiErr.Status != statusClientClosed {
		// A success status whose body is an error that blames the
		// request, as the upstream's own 4xx would be: a refusal of
		// logprobs is asked again without them (classifiers.llm).
		errBody, _ := apiErr.MarshalJSON()
		return nil, catalog.Usage{}, &ModelError{Status: apiErr.Status, Body: errBody, RetryAfter: apiErr.RetryAfter}
	}
	if apiErr != nil && call.operatorsFault {
		return nil, catalog.Usage{}, &UpstreamFaultError{Answer: apiErr}
	}
	if apiErr != nil {
		return nil, catalog.Usage{}, &unavailableError{msg: apiErr.Message, retryAfter: apiErr.RetryAfter}
	}
	defer up.health.inflight.Add(-1)
	defer resp.Close()
	defer call.dropBody()
	if note != nil {
		note.set(up.cfg.Name)
	}
	// Read whole by attempt like a client's answer: a cut body is an
	// error, never a short answer, and max_response_body holds.
	if err = call.respErr; err == nil && call.respBuf != nil {
		respBody = append([]byte(nil), call.respBuf.B...)
	} else if err == nil {
		respBody, err = resp.readAll(nil, int64(up.cfg.MaxResponseBody)) // an error status: not read by attempt
	}
	if err != nil {
		return nil, catalog.Usage{}, fmt.Errorf("%w: %s", ErrModelUnavailable, upstreamCut(up, err).Message)
	}
	if st := resp.Header.StatusCode(); st < 200 || st > 299 {
		return nil, catalog.Usage{}, &ModelError{Status: st, Body: up.masked(respBody), RetryAfter: retryAfter(&resp.Header)}
	}
	up.completed(call.sent, false)
	return respBody, call.engineUsage(body, respBody), nil
}

// UpstreamNote holds the name of the upstream that took a model call
// (the last, if several), which a pool picks: see WithUpstreamNote.
type UpstreamNote struct {
	mu   sync.Mutex
	name string
	// reached: a call's request may have reached an upstream, answered
	// or not (one that sent nothing back in time took it too).
	reached bool
}

func (n *UpstreamNote) set(name string) {
	n.mu.Lock()
	n.name = name
	n.mu.Unlock()
}

func (n *UpstreamNote) reach() {
	n.mu.Lock()
	n.reached = true
	n.mu.Unlock()
}

// Name is the upstream noted, or "" when no call reached one.
func (n *UpstreamNote) Name() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.name
}

// Reached reports whether any call under the note's ctx may have reached
// an upstream. One that failed without reaching any (each refused the
// connection, was ejected or resting, or had no free connection) spent
// nothing upstream: its call costs no quota, as a generation call's does
// not (Call.Refused).
func (n *UpstreamNote) Reached() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.reached
}

type upstreamNoteKey struct{}

// WithUpstreamNote returns ctx with note, which CallModel fills with the
// upstream each call under ctx went to: a plugin's usage event names the
// upstream whose tokens it bills, not the pool's first.
func WithUpstreamNote(ctx context.Context, note *UpstreamNote) context.Context {
	return context.WithValue(ctx, upstreamNoteKey{}, note)
}

// Record hands a plugin's usage event to the meter, and counts it in the
// request metrics as generation calls are. It returns once the meter has
// the event safe from a crash, as a chat answer waits before its last
// byte: at once with billing.durability process, after the outbox's fsync
// with fsync, at most meter.DurableWait. Call it before the answer is written:
// the non-durable Record it made before let plugin answers go out tens of
// milliseconds before their event reached the disk.
func (s *Server) Record(ev *meter.Event) {
	s.calls.observeEvent(ev, false)
	s.noteCharge(ev)
	id := ev.ID // the recorder owns ev once it has it
	if !meter.RecordAndWait(s.recorder, ev) {
		s.logf("meter: usage event %s not on disk after %s; answering anyway", id, meter.DurableWait)
	}
}

// noteCharge has the balance this gateway admits calls on count ev's cost
// at once, not when its debit comes back a second or more later.
func (s *Server) noteCharge(ev *meter.Event) {
	if ev.Account != "" {
		s.NoteCharge(ev.Account, ev.CostNanos)
	}
}

// CheckBalance refuses a keyed call whose account is below the grace
// buffer (402); public calls pass.
func (s *Server) CheckBalance(w *World, call *Call) *APIError {
	if call.Key == nil {
		return nil
	}
	return s.checkBalance(w, call.Key)
}

// engineUsage is what an engine's call is billed: the upstream's usage
// when it reported believable counts, else the tokenizer's count of the
// prompt's messages and the answer's text, as a client's call is counted.
// The engines billed whatever came: a reported 4e18 prompt tokens cost 8
// USD a call (clamped to 100 million), a missing report nothing.
func (c *generationCall) engineUsage(reqBody, respBody []byte) catalog.Usage {
	c.reqBody = &reqBody // for countedPrompt
	collected := false
	if u := gjson.GetBytes(respBody, "usage"); u.IsObject() {
		usage, refused := believedUsage(u, false)
		if refused == "" && usage.CompletionTokens == 0 {
			// A report of no output is checked against the answer's
			// text (contradictedUsage), as a client's call is.
			c.collectWholeText(respBody)
			collected = true
		}
		if refused == "" {
			refused, _ = c.contradictedUsage(usage)
		}
		if refused == "" {
			return usage
		}
		c.upstream.health.usageRefused.Add(1)
	}
	if !collected {
		c.collectWholeText(respBody)
	}
	return catalog.Usage{
		PromptTokens:     c.countedPrompt(),
		CompletionTokens: c.completionEstimate(),
		Estimated:        true,
	}
}
