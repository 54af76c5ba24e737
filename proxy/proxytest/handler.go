package proxytest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Header values shared by every response; net/http only reads them.
var (
	contentJSON = []string{"application/json"}
	contentSSE  = []string{"text/event-stream; charset=utf-8"}
	noCache     = []string{"no-cache"}
)

// Error bodies of requests no real upstream would accept either.
var (
	bodyNotFound    = errorEnvelope(http.StatusNotFound, "proxytest: no such route")
	bodyBadMethod   = errorEnvelope(http.StatusMethodNotAllowed, "proxytest: method not allowed")
	bodyInvalidJSON = errorEnvelope(http.StatusBadRequest, "proxytest: request body is not valid JSON")
	bodyNoModel     = errorEnvelope(http.StatusBadRequest, "you must provide a model parameter")
	// bodyLogprobsRefused is OpenAI's answer to logprobs on a reasoning model.
	bodyLogprobsRefused = errorEnvelope(http.StatusBadRequest, "logprobs is not supported with this model.")
	bodyClosing         = errorEnvelope(http.StatusServiceUnavailable, "proxytest: server is closing")
)

// outcome is how a handler ended; only clientGone counts as canceled.
type outcome int

const (
	finished outcome = iota
	clientGone
	serverClosing
	dropped
)

// idSeq numbers answers process-wide, so ids never repeat across servers.
var idSeq atomic.Uint64

// scratch is one request's reusable memory.
type scratch struct {
	vals  values
	slots []byte // backing array of vals
	out   []byte // the body or event being written
	body  bytes.Buffer
	timer *time.Timer
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// ServeHTTP answers one request; it is what the server's net/http.Server runs.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		writeStatic(w, http.StatusServiceUnavailable, bodyClosing)
		return
	}
	defer s.handlers.Done()
	s.active.Add(1)
	defer s.active.Add(-1)

	st := s.state.Load()
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)

	var body []byte
	var err error
	if st.opts.NoRecord {
		sc.body.Reset()
		_, err = sc.body.ReadFrom(r.Body)
		body = sc.body.Bytes()
	} else {
		body, err = io.ReadAll(r.Body)
		s.record(r, body)
	}
	if err != nil {
		// The client hung up while sending the body.
		s.countCanceled()
		return
	}
	if s.serve(w, r, st, body, sc) == clientGone {
		s.countCanceled()
	}
}

// countCanceled counts a request whose connection went away, unless Close
// is what took it away.
func (s *Server) countCanceled() {
	select {
	case <-s.closing:
	default:
		s.canceled.Add(1)
	}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, st *rendered, body []byte, sc *scratch) outcome {
	o := &st.opts
	if o.Status != 0 {
		if o.RetryAfter != "" {
			w.Header().Set("Retry-After", o.RetryAfter)
		}
		for k, v := range o.StatusHeaders {
			w.Header().Set(k, v)
		}
		return s.respond(w, r, o, o.Status, st.errorBody, sc)
	}
	chat := false
	switch r.URL.Path {
	case "/v1/chat/completions":
		chat = true
	case "/v1/responses":
	case "/v1/models":
		if r.Method != http.MethodGet {
			return s.respond(w, r, o, http.StatusMethodNotAllowed, bodyBadMethod, sc)
		}
		return s.respond(w, r, o, http.StatusOK, st.modelsBody, sc)
	default:
		if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/responses/"); ok {
			return s.responseState(w, r, o, rest, sc)
		}
		return s.respond(w, r, o, http.StatusNotFound, bodyNotFound, sc)
	}
	if r.Method != http.MethodPost {
		return s.respond(w, r, o, http.StatusMethodNotAllowed, bodyBadMethod, sc)
	}
	if chat && st.cuts.Add(1) <= int64(o.CutChatTimes) {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
		return dropped
	}
	if !gjson.ValidBytes(body) {
		return s.respond(w, r, o, http.StatusBadRequest, bodyInvalidJSON, sc)
	}
	// body outlives none of these reads, so gjson may look at it in place.
	js := unsafe.String(unsafe.SliceData(body), len(body))
	model := gjson.Get(js, "model")
	if model.Type != gjson.String {
		return s.respond(w, r, o, http.StatusBadRequest, bodyNoModel, sc)
	}
	stream := gjson.Get(js, "stream").Type == gjson.True && !o.WholeAnswers
	if o.RefuseLogprobs && chat && gjson.Get(js, "logprobs").Type == gjson.True {
		return s.respond(w, r, o, http.StatusBadRequest, bodyLogprobsRefused, sc)
	}

	// Responses state is kept unless NoRecord (see state.go).
	keep, background := false, false
	if !chat && !o.NoRecord {
		if prev := gjson.Get(js, "previous_response_id"); prev.Type == gjson.String && !s.Stored(prev.Str) {
			return s.respond(w, r, o, http.StatusNotFound, responseNotFound(prev.Str), sc)
		}
		if id := s.missingItem(js); id != "" {
			return s.respond(w, r, o, http.StatusNotFound, itemNotFound(id), sc)
		}
		keep = gjson.Get(js, "store").Type != gjson.False
		background = !stream && gjson.Get(js, "background").Type == gjson.True
	}

	idPrefix := "resp_"
	if chat {
		idPrefix = "chatcmpl-"
	}
	sc.fill(idPrefix, model.Raw)
	if keep {
		s.keep(st, js, background, sc)
	}

	return s.answer(w, r, st, js, chat, stream, background, sc)
}

// answer writes the success answer of a valid generation request.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, st *rendered, js string, chat, stream, background bool, sc *scratch) outcome {
	o := &st.opts
	if chat && !stream && o.Reply != nil {
		if out, ok := s.reply(js, st, &sc.vals); ok {
			return s.respond(w, r, o, http.StatusOK, out, sc)
		}
	}
	switch {
	case chat && stream:
		events := st.chatStream
		if gjson.Get(js, "stream_options.include_usage").Type == gjson.True {
			events = st.chatStreamUsed
		}
		return s.stream(w, r, o, events, sc)
	case chat:
		sc.out = st.chatBody.appendTo(sc.out[:0], &sc.vals)
	case stream:
		return s.stream(w, r, o, st.respStream, sc)
	case background:
		sc.out = st.respQueued.appendTo(sc.out[:0], &sc.vals)
	default:
		sc.out = st.respBody.appendTo(sc.out[:0], &sc.vals)
	}
	return s.respond(w, r, o, http.StatusOK, sc.out, sc)
}

// fill sets the request's slot values; modelJSON is the model as the client
// wrote it, quotes and escapes included.
func (sc *scratch) fill(idPrefix, modelJSON string) {
	n := idSeq.Add(1)
	b := append(sc.slots[:0], idPrefix...)
	b = appendID(b, n)
	idEnd := len(b)
	b = strconv.AppendInt(b, time.Now().Unix(), 10)
	createdEnd := len(b)
	b = append(b, "msg_"...)
	b = appendID(b, n)
	itemEnd := len(b)
	b = append(b, modelJSON...)
	sc.slots = b
	sc.vals = values{id: b[:idEnd], created: b[idEnd:createdEnd], itemID: b[createdEnd:itemEnd], model: b[itemEnd:]}
}

// appendID writes n as 24 hex digits, the length of OpenAI's id suffixes.
func appendID(b []byte, n uint64) []byte {
	const hex = "0123456789abcdef"
	var d [24]byte
	for i := len(d) - 1; i >= 0; i-- {
		d[i] = hex[n&0xf]
		n >>= 4
	}
	return append(b, d[:]...)
}

// wait sleeps d unless the client goes away or the server closes first.
func (s *Server) wait(ctx context.Context, d time.Duration, sc *scratch) outcome {
	if d <= 0 {
		return finished
	}
	if sc.timer == nil {
		sc.timer = time.NewTimer(d)
	} else {
		sc.timer.Reset(d)
	}
	select {
	case <-sc.timer.C:
		return finished
	case <-ctx.Done():
		sc.timer.Stop()
		return clientGone
	case <-s.closing:
		sc.timer.Stop()
		return serverClosing
	}
}

// respond writes a whole, non-stream body.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, o *Options, status int, body []byte, sc *scratch) outcome {
	h := w.Header()
	h["Content-Type"] = contentJSON
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	if o.HeaderFlushThenDelay {
		w.WriteHeader(status)
		if err := http.NewResponseController(w).Flush(); err != nil {
			return clientGone
		}
		if out := s.wait(r.Context(), o.FirstByteDelay, sc); out != finished {
			return out
		}
	} else {
		if out := s.wait(r.Context(), o.FirstByteDelay, sc); out != finished {
			return out
		}
		w.WriteHeader(status)
	}
	if _, err := w.Write(body); err != nil {
		return clientGone
	}
	return finished
}

// stream writes events as server-sent events, flushing each one so the
// client sees it at once, and applies the hazards of o.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, o *Options, events []template, sc *scratch) outcome {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	h := w.Header()
	h["Content-Type"] = contentSSE
	h["Cache-Control"] = noCache
	if o.HeaderFlushThenDelay {
		w.WriteHeader(http.StatusOK)
		if err := rc.Flush(); err != nil {
			return clientGone
		}
	}
	if out := s.wait(ctx, o.FirstByteDelay, sc); out != finished {
		return out
	}
	if o.OneWrite {
		sc.out = sc.out[:0]
		for _, ev := range events {
			sc.out = ev.appendTo(sc.out, &sc.vals)
		}
		if _, err := w.Write(sc.out); err != nil {
			return clientGone
		}
		if err := rc.Flush(); err != nil {
			return clientGone
		}
		return finished
	}
	stallAt := 1
	if strings.HasSuffix(r.URL.Path, "/responses") {
		stallAt = 3 // after response.created and response.in_progress, which are no answer yet
	}
	for i, ev := range events {
		if i > 0 {
			if out := s.wait(ctx, o.ChunkDelay, sc); out != finished {
				return out
			}
		}
		if ctx.Err() != nil {
			return clientGone
		}
		sc.out = ev.appendTo(sc.out[:0], &sc.vals)
		if _, err := w.Write(sc.out); err != nil {
			return clientGone
		}
		if err := rc.Flush(); err != nil {
			return clientGone
		}
		written := i + 1
		if o.ErrorEvent != "" && written == o.ErrorEventAfter {
			if _, err := io.WriteString(w, o.ErrorEvent); err != nil {
				return clientGone
			}
			return finished
		}
		if written == o.DropAfter {
			// Everything written so far is flushed; closing the hijacked
			// connection leaves the chunked body without its terminator.
			conn, _, err := rc.Hijack()
			if err != nil {
				return clientGone
			}
			_ = conn.Close()
			return dropped
		}
		if o.Stall && written == stallAt {
			select {
			case <-ctx.Done():
				return clientGone
			case <-s.closing:
				return serverClosing
			}
		}
	}
	return finished
}

func writeStatic(w http.ResponseWriter, status int, body []byte) {
	w.Header()["Content-Type"] = contentJSON
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
