package meter

import (
	"sync"
	"time"

	"github.com/tollgate/tollgate/money"
)

// UsageSource says where token counts came from.
type UsageSource string

const (
	// SourceUpstream: the upstream reported usage.
	SourceUpstream UsageSource = "upstream"
	// SourceEstimated: the upstream never reported usage (stream cut, client
	// went away) and the forwarded text was counted with the tokenizer.
	SourceEstimated UsageSource = "estimated"
	// SourceTokenizer: an offline engine (the lexical classifier) did the
	// work, and the tokenizer's count of its input is the billed measure.
	SourceTokenizer UsageSource = "tokenizer"
)

// Event is one billable call. ID is a UUIDv7, the response's x-request-id,
// the JetStream Nats-Msg-Id and the ClickHouse dedup key.
type Event struct {
	ID               string        `json:"id"`
	Time             time.Time     `json:"time"`
	Account          string        `json:"account"`
	KeyID            string        `json:"key_id"`
	Endpoint         string        `json:"endpoint"` // e.g. /v1/chat/completions
	Model            string        `json:"model"`    // client-facing model id
	Upstream         string        `json:"upstream"` // upstream name from gateway.yaml
	PromptTokens     int64         `json:"prompt_tokens"`
	CachedTokens     int64         `json:"cached_tokens"`
	CompletionTokens int64         `json:"completion_tokens"`
	ReasoningTokens  int64         `json:"reasoning_tokens"`
	Images           int64         `json:"images,omitempty"`
	CostNanos        money.Nanos   `json:"cost_nanos"`
	UsageSource      UsageSource   `json:"usage_source"`
	Status           int           `json:"status"` // HTTP status the client got
	Latency          time.Duration `json:"latency_ns"`
	TTFB             time.Duration `json:"ttfb_ns"` // time to the first byte relayed to the client
	Stream           bool          `json:"stream"`
	// JobID is set on batch billing events.
	JobID string `json:"job_id,omitempty"`
	// Log is set only for keys with request logging on: it travels the
	// same durable pipeline as the usage and lands in request_logs.
	Log *RequestLog `json:"log,omitempty"`
}

// RequestLog is what a logging key exchanged in one call.
type RequestLog struct {
	Request  string `json:"request"`  // the client's request body, as sent
	Response string `json:"response"` // the response body; for streams, the assembled text
	// RetentionDays is the key's retention window; 0 keeps the row forever.
	RetentionDays int `json:"retention_days"`
	// ResponseLeftOut is the bytes of the answer that came after Response
	// and were never kept: a stream keeps no more of its text than an
	// event can carry (MaxLogBytes). The outbox cuts the log there with
	// a line that counts them.
	ResponseLeftOut int64 `json:"-"`
}

// MaxLogBytes is the most of a logged request or answer a usage event can
// carry: the outbox cuts a log to fit its event in this many bytes (or
// fewer, in a segment smaller than that: an outbox_max_bytes under
// 2 MiB), so keeping more of a stream's text is wasted memory.
const MaxLogBytes = maxOutboxEventBytes

// Recorder takes billable events. Record must not block on I/O: it is called
// on the request path. Implementations own ev after the call.
type Recorder interface {
	Record(ev *Event)
}

// DurableRecorder is a Recorder that can say when an event is safe from a
// crash. The proxy waits on the channel, bounded, before it sends the last
// byte of an answer, so a client never holds an answer that is not billed.
type DurableRecorder interface {
	Recorder
	RecordDurable(ev *Event) <-chan struct{}
}

// DurableWait bounds how long what is told after a call (an answer's last
// byte, a plugin's answer, a batch job's completion) waits for its event
// to be safe from a crash: a stuck disk must not hang it, and the event is
// on its way anyway.
const DurableWait = 2 * time.Second

// RecordSafe records ev with rec and returns a channel closed once ev is
// safe from a crash, or nil when there is nothing to wait for: rec is not
// a DurableRecorder, or ev was in the kernel's hands at once (process
// durability). The caller may flush what need not wait before WaitSafe.
func RecordSafe(rec Recorder, ev *Event) <-chan struct{} {
	d, ok := rec.(DurableRecorder)
	if !ok {
		rec.Record(ev)
		return nil
	}
	safe := d.RecordDurable(ev)
	select {
	case <-safe:
		return nil // no wait, no timer
	default:
		return safe
	}
}

// WaitSafe waits for RecordSafe's channel, at most DurableWait, and
// reports whether the event was safe within it.
func WaitSafe(safe <-chan struct{}) bool {
	if safe == nil {
		return true
	}
	t := time.NewTimer(DurableWait)
	defer t.Stop()
	select {
	case <-safe:
		return true
	case <-t.C:
		return false
	}
}

// RecordAndWait is RecordSafe and then WaitSafe: for what is told after
// the call, a plugin's answer or a batch job's completion, which went out
// before their event was on disk under billing.durability fsync.
func RecordAndWait(rec Recorder, ev *Event) bool {
	return WaitSafe(RecordSafe(rec, ev))
}

// Memory is a Recorder that keeps events in memory, for tests and for running
// without durable metering.
type Memory struct {
	mu     sync.Mutex
	events []*Event
	notify func(*Event)
}

// NewMemory returns an empty recorder. notify, if set, is called for each
// event after it is stored, outside the lock.
func NewMemory(notify func(*Event)) *Memory { return &Memory{notify: notify} }

// Record stores ev.
func (m *Memory) Record(ev *Event) {
	m.mu.Lock()
	m.events = append(m.events, ev)
	m.mu.Unlock()
	if m.notify != nil {
		m.notify(ev)
	}
}

// Events returns a copy of what was recorded so far.
func (m *Memory) Events() []*Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*Event(nil), m.events...)
}
