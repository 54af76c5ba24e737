// Package proxytest runs an in-process OpenAI-shaped upstream for tests and
// benchmarks, the way net/http/httptest runs a plain HTTP server.
//
// It is served by net/http on purpose: the gateway speaks fasthttp, and
// testing it against a different HTTP implementation catches framing
// assumptions that two fasthttp ends would share. Its answers follow what
// OpenAI and vLLM send, byte for byte where clients care: chat.completion and
// chat.completion.chunk objects, usage only when stream_options.include_usage
// asks for it, a trailing "data: [DONE]", and the typed event stream of
// /v1/responses. Options inject the hazards the gateway must survive: slow
// first bytes, stalls, cut connections, missing [DONE], missing usage, error
// statuses.
//
// Like a real server it refuses what it cannot answer: a body that is not
// JSON or has no string "model" gets 400, an unknown path 404, a wrong method
// 405, all in the OpenAI error envelope. Any model is accepted and echoed.
// Responses are kept by id, as vLLM keeps them, for GET, DELETE, cancel and
// input_items under /v1/responses/{id} and for previous_response_id
// (state.go).
package proxytest

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options shape every answer. The zero value of each field is a sensible
// default, so Options{} is a fast, well-behaved upstream.
type Options struct {
	// Chunks is how many words the answer has: one content chunk (or
	// response.output_text.delta) per word in streams. Default 20.
	Chunks int
	// ChunkDelay is waited between two stream events.
	ChunkDelay time.Duration
	// FirstByteDelay is waited before the status line is written.
	FirstByteDelay time.Duration
	// HeaderFlushThenDelay sends the status line and headers at once and
	// waits FirstByteDelay before the first event (or the non-stream body)
	// instead, like a server that accepts quickly and then queues.
	HeaderFlushThenDelay bool

	// Usage reported. PromptTokens defaults to 10 and CompletionTokens to the
	// number of words emitted; CachedTokens and ReasoningTokens default to 0.
	PromptTokens, CompletionTokens, CachedTokens, ReasoningTokens int

	// Status, when not 0, answers every request (including GET /v1/models)
	// with this status and ErrorBody. An empty ErrorBody is replaced by an
	// OpenAI error envelope for the status; a non-empty one is sent verbatim,
	// so tests can also send malformed or non-JSON error bodies.
	Status    int
	ErrorBody string
	// RetryAfter, with Status, is sent as the Retry-After header.
	RetryAfter string
	// StatusHeaders, with Status, are sent as they are (retry-after-ms,
	// x-should-retry).
	StatusHeaders map[string]string

	// DropAfter, for streams, closes the TCP connection after this many
	// events have been written and flushed (the "data: [DONE]" line counts as
	// an event). The chunked encoding's terminating chunk is never sent, so
	// the client sees the body end mid-stream. 0 disables it.
	DropAfter int
	// ErrorEvent, when ErrorEventAfter events have been written, is
	// written verbatim in place of the rest of the stream, which then ends
	// cleanly: an upstream ending its answer with its own error event, as
	// vLLM does when its engine dies mid-generation. Whatever follows the
	// error ("data: [DONE]\n\n") is part of ErrorEvent.
	ErrorEvent      string
	ErrorEventAfter int
	// OmitDone ends a chat stream cleanly without "data: [DONE]". The usage
	// chunk is still sent when the request asked for it.
	OmitDone bool
	// OmitUsage never reports usage: no usage field in non-stream bodies or
	// response.completed, no usage chunk and no "usage":null in chat streams,
	// even when the request asked for stream_options.include_usage.
	OmitUsage bool
	// RawUsage, when set, is written verbatim as every usage object (chat
	// and responses, streamed or not) in place of the counts above: a
	// broken upstream's report, such as {} or {"prompt_tokens":"abc"}.
	RawUsage string
	// UsageOnLastContentChunk imitates vLLM: when usage is asked for in a
	// chat stream, it rides on the finish_reason chunk instead of a separate
	// chunk with "choices":[].
	UsageOnLastContentChunk bool
	// OneWrite sends a stream's events in one write, headers included, as
	// an upstream that generated the whole answer while the client waited
	// for its first byte: the client's first read brings all of it (if
	// under 2 KiB, net/http's buffer before chunking: a few Chunks).
	// ChunkDelay, DropAfter and Stall do not apply.
	OneWrite bool
	// WholeAnswers answers streamed requests with the whole JSON answer a
	// request without "stream" gets, as an upstream that cannot stream.
	WholeAnswers bool
	// Stall stops writing after the first stream event that is an answer
	// (on /v1/responses, the first after response.created and
	// response.in_progress, which an upstream such as vLLM sends while the
	// request is still queued) and holds the connection open until the
	// client goes away (or the server closes).
	Stall bool
	// CutChatTimes closes the connection of the first N chat requests
	// under these options without an answer, as an upstream behind a
	// restarting load balancer drops one; GET /v1/models still answers.
	CutChatTimes int

	// Models are the ids GET /v1/models lists. Default: proxytest-small and
	// proxytest-large. Generation requests accept any model and echo it.
	Models []string
	// NoRecord keeps requests out of Requests(), and responses out of the
	// store behind GET /v1/responses/{id} (see state.go), so the memory of
	// a long-running benchmark or standalone upstream stays flat.
	NoRecord bool

	// Reply, when set, may answer a non-stream chat request the way a
	// model would: it gets the request body and returns the reply's text
	// and, for OpenAI's choices[0].logprobs.content, a JSON array of
	// entries (AppendTokenLogprob writes one), or ok false to leave the
	// request to the usual answer. classifiers.ViewModel.Reply answers the
	// llm classifier engine's prompts this way. Status still takes
	// precedence; logprobs are sent only when the request asked for them.
	Reply func(request []byte) (content string, logprobs []byte, ok bool)
	// BadAnswerTimes makes the first N answers Reply gives under these
	// options prose instead, to exercise retries.
	BadAnswerTimes int
	// NoLogprobs leaves logprobs out of Reply's answers even when asked,
	// like upstreams that ignore the parameter.
	NoLogprobs bool
	// RefuseLogprobs answers a chat request that asks for logprobs with a
	// 400 naming the parameter, as OpenAI's reasoning models do.
	RefuseLogprobs bool
}

// Recorded is one request as the server received it.
type Recorded struct {
	Method   string
	Path     string
	RawQuery string
	Header   http.Header
	Body     []byte
}

// Server is a running fake upstream. Its methods are safe for concurrent use.
type Server struct {
	// URL is the base URL clients use, ending in /v1 (no trailing slash),
	// e.g. http://127.0.0.1:41234/v1.
	URL string
	// Addr is the host:port the server listens on.
	Addr string

	http     *http.Server
	listener net.Listener
	state    atomic.Pointer[rendered]
	served   chan struct{}
	closing  chan struct{}

	mu        sync.Mutex // guards closed, handlers.Add, requests, responses
	closed    bool
	handlers  sync.WaitGroup
	requests  []Recorded
	responses map[string]*storedResponse // by id; see state.go
	items     map[string]string          // output item id -> its response's id

	active   atomic.Int64
	canceled atomic.Int64
}

// NewServer starts a server on a random loopback port. It panics when it
// cannot listen, as httptest.NewServer does: a test cannot go on without it.
func NewServer(opts Options) *Server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("proxytest: listening on 127.0.0.1:0: %v", err))
	}
	return NewServerOn(ln, opts)
}

// NewServerOn serves on ln, which the server then owns and closes on Close.
func NewServerOn(ln net.Listener, opts Options) *Server {
	s := &Server{
		Addr:     ln.Addr().String(),
		URL:      "http://" + ln.Addr().String() + "/v1",
		listener: ln,
		served:   make(chan struct{}),
		closing:  make(chan struct{}),
	}
	s.state.Store(render(opts))
	s.http = &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second}
	go func() {
		defer close(s.served)
		_ = s.http.Serve(ln) // returns http.ErrServerClosed after Close
	}()
	return s
}

// SetOptions replaces the options for requests that arrive from now on;
// requests already being answered finish with the options they started with.
func (s *Server) SetOptions(opts Options) {
	s.state.Store(render(opts))
}

// Options returns the options in effect, defaults filled in.
func (s *Server) Options() Options {
	return s.state.Load().opts
}

// Requests returns a copy of every request received so far, oldest first
// (none when Options.NoRecord is set). The Header and Body values are shared
// with the server's record: do not modify them.
func (s *Server) Requests() []Recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Recorded, len(s.requests))
	copy(out, s.requests)
	return out
}

// ChatCalls counts the chat completions requests received.
func (s *Server) ChatCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if strings.HasSuffix(r.Path, "/chat/completions") {
			n++
		}
	}
	return n
}

// Canceled counts requests whose client went away (closed the connection or
// failed a write) before the handler had sent the whole answer. Connections
// cut by DropAfter or by Close are not counted.
func (s *Server) Canceled() int {
	return int(s.canceled.Load())
}

// Active is the number of requests being handled right now.
func (s *Server) Active() int {
	return int(s.active.Load())
}

// Reset forgets recorded requests and the Canceled count, so one server can
// serve several subtests.
func (s *Server) Reset() {
	s.mu.Lock()
	s.requests = nil
	s.mu.Unlock()
	s.canceled.Store(0)
}

// Close stops the server: it closes the listener and every connection,
// wakes stalled and delayed handlers, and returns once all handlers have
// returned. Calling it twice is harmless.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	close(s.closing)
	_ = s.http.Close()
	s.handlers.Wait()
	<-s.served
}

// enter registers a handler so that Close can wait for it. It reports false
// once Close has begun.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.handlers.Add(1)
	return true
}

func (s *Server) record(r *http.Request, body []byte) {
	rec := Recorded{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: body}
	s.mu.Lock()
	s.requests = append(s.requests, rec)
	s.mu.Unlock()
}
