package proxytest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

// Every body is rendered once per SetOptions into templates whose few
// per-request values (id, model, timestamp) are slots, so answering a request
// only copies bytes: this server is also the baseline gateway benchmarks are
// measured against, and it must not be the bottleneck.

// slot is a per-request value spliced into a template.
type slot byte

// Slot markers inside a template string: a NUL byte, which JSON text never
// contains raw, followed by one of these letters.
const (
	slotID      slot = 'i' // chatcmpl-… or resp_…
	slotModel   slot = 'm' // the request's model as a JSON string
	slotCreated slot = 'c' // unix seconds
	slotItemID  slot = 't' // msg_… of the responses output item
)

const (
	markID      = "\x00i"
	markModel   = "\x00m"
	markCreated = "\x00c"
	markItemID  = "\x00t"
)

type part struct {
	lit  []byte
	slot slot // 0: none
}

// template is a pre-rendered body or SSE event.
type template []part

func compile(s string) template {
	var t template
	for {
		i := strings.IndexByte(s, 0)
		if i < 0 {
			if s != "" {
				t = append(t, part{lit: []byte(s)})
			}
			return t
		}
		t = append(t, part{lit: []byte(s[:i]), slot: slot(s[i+1])})
		s = s[i+2:]
	}
}

// values are one request's slot contents.
type values struct {
	id, model, created, itemID []byte
}

func (v *values) get(s slot) []byte {
	switch s {
	case slotID:
		return v.id
	case slotModel:
		return v.model
	case slotCreated:
		return v.created
	case slotItemID:
		return v.itemID
	}
	return nil
}

func (t template) appendTo(dst []byte, v *values) []byte {
	for _, p := range t {
		dst = append(dst, p.lit...)
		if p.slot != 0 {
			dst = append(dst, v.get(p.slot)...)
		}
	}
	return dst
}

// rendered is everything one Options value answers with.
type rendered struct {
	opts Options

	chatBody       template
	chatStream     []template // without stream_options.include_usage
	chatStreamUsed []template // with it
	respBody       template
	respQueued     template // a background response, as first answered
	respStream     []template
	modelsBody     []byte
	errorBody      []byte

	replies atomic.Int64 // Reply answers given under opts
	cuts    atomic.Int64 // chat requests seen under opts, for CutChatTimes
}

const (
	defaultChunks       = 20
	defaultPromptTokens = 10
)

func render(o Options) *rendered {
	if o.Chunks <= 0 {
		o.Chunks = defaultChunks
	}
	if o.PromptTokens == 0 {
		o.PromptTokens = defaultPromptTokens
	}
	if o.CompletionTokens == 0 {
		o.CompletionTokens = o.Chunks
	}
	if len(o.Models) == 0 {
		o.Models = []string{"proxytest-small", "proxytest-large"}
	}
	r := &rendered{opts: o}

	words := make([]string, o.Chunks)
	for i := range words {
		words[i] = "tok" + strconv.Itoa(i)
		if i > 0 {
			words[i] = " " + words[i]
		}
	}
	text := strings.Join(words, "")

	r.chatBody = compile(chatCompletion(o, text))
	r.chatStream = chatStream(o, words, false)
	r.chatStreamUsed = chatStream(o, words, true)
	r.respBody = compile(response(o, "completed", itemCompleted(text), true))
	r.respQueued = compile(response(o, "queued", "", false))
	r.respStream = responseStream(o, words, text)
	r.modelsBody = models(o.Models)
	if o.Status != 0 {
		r.errorBody = []byte(o.ErrorBody)
		if o.ErrorBody == "" {
			r.errorBody = errorEnvelope(o.Status, http.StatusText(o.Status))
		}
	}
	return r
}

func jsonString(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

func itoa(n int) string { return strconv.Itoa(n) }

func chatUsage(o Options) string {
	if o.RawUsage != "" {
		return o.RawUsage
	}
	return `{"prompt_tokens":` + itoa(o.PromptTokens) +
		`,"completion_tokens":` + itoa(o.CompletionTokens) +
		`,"total_tokens":` + itoa(o.PromptTokens+o.CompletionTokens) +
		`,"prompt_tokens_details":{"cached_tokens":` + itoa(o.CachedTokens) +
		`},"completion_tokens_details":{"reasoning_tokens":` + itoa(o.ReasoningTokens) + `}}`
}

func chatCompletion(o Options, text string) string {
	s := `{"id":"` + markID + `","object":"chat.completion","created":` + markCreated +
		`,"model":` + markModel + `,"system_fingerprint":null,"choices":[{"index":0,"message":{"role":"assistant","content":` +
		jsonString(text) + `,"refusal":null},"logprobs":null,"finish_reason":"stop"}]`
	if !o.OmitUsage {
		s += `,"usage":` + chatUsage(o)
	}
	return s + "}"
}

// chatStream renders the events of one chat stream. With includeUsage every
// chunk carries "usage":null and a last chunk with "choices":[] carries the
// usage, as OpenAI sends it.
func chatStream(o Options, words []string, includeUsage bool) []template {
	withUsage := includeUsage && !o.OmitUsage
	usageNull := ""
	if withUsage {
		usageNull = `,"usage":null`
	}
	head := `data: {"id":"` + markID + `","object":"chat.completion.chunk","created":` + markCreated +
		`,"model":` + markModel + `,"system_fingerprint":null,"choices":`
	choice := func(delta, finish string) string {
		return `[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":` + finish + `}]`
	}
	events := make([]template, 0, len(words)+4)
	add := func(s string) { events = append(events, compile(s)) }

	add(head + choice(`{"role":"assistant","content":""}`, "null") + usageNull + "}\n\n")
	for _, w := range words {
		add(head + choice(`{"content":`+jsonString(w)+`}`, "null") + usageNull + "}\n\n")
	}
	switch {
	case withUsage && o.UsageOnLastContentChunk:
		add(head + choice(`{}`, `"stop"`) + `,"usage":` + chatUsage(o) + "}\n\n")
	case withUsage:
		add(head + choice(`{}`, `"stop"`) + usageNull + "}\n\n")
		add(head + `[],"usage":` + chatUsage(o) + "}\n\n")
	default:
		add(head + choice(`{}`, `"stop"`) + "}\n\n")
	}
	if !o.OmitDone {
		add("data: [DONE]\n\n")
	}
	return events
}

func responseUsage(o Options) string {
	if o.RawUsage != "" {
		return o.RawUsage
	}
	return `{"input_tokens":` + itoa(o.PromptTokens) +
		`,"input_tokens_details":{"cached_tokens":` + itoa(o.CachedTokens) +
		`},"output_tokens":` + itoa(o.CompletionTokens) +
		`,"output_tokens_details":{"reasoning_tokens":` + itoa(o.ReasoningTokens) +
		`},"total_tokens":` + itoa(o.PromptTokens+o.CompletionTokens) + `}`
}

func outputText(text string) string {
	return `{"type":"output_text","annotations":[],"text":` + jsonString(text) + `}`
}

func itemInProgress() string {
	return `{"id":"` + markItemID + `","type":"message","status":"in_progress","content":[],"role":"assistant"}`
}

func itemCompleted(text string) string {
	return `{"id":"` + markItemID + `","type":"message","status":"completed","content":[` +
		outputText(text) + `],"role":"assistant"}`
}

// response renders a response object; output is the JSON of its one output
// item, or empty for none.
func response(o Options, status, output string, final bool) string {
	s := `{"id":"` + markID + `","object":"response","created_at":` + markCreated +
		`,"status":"` + status + `","error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":` +
		markModel + `,"output":[` + output + `],"parallel_tool_calls":true,"previous_response_id":null,` +
		`"reasoning":{"effort":null,"summary":null},"store":false,"temperature":1.0,"text":{"format":{"type":"text"}},` +
		`"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled"`
	switch {
	case !final:
		s += `,"usage":null`
	case !o.OmitUsage:
		s += `,"usage":` + responseUsage(o)
	}
	return s + `,"user":null,"metadata":{}}`
}

func responseStream(o Options, words []string, text string) []template {
	events := make([]template, 0, len(words)+8)
	add := func(typ, fields string) {
		seq := itoa(len(events))
		events = append(events, compile("event: "+typ+"\ndata: {\"type\":\""+typ+
			"\",\"sequence_number\":"+seq+fields+"}\n\n"))
	}
	const part = `,"item_id":"` + markItemID + `","output_index":0,"content_index":0`

	add("response.created", `,"response":`+response(o, "in_progress", "", false))
	add("response.in_progress", `,"response":`+response(o, "in_progress", "", false))
	add("response.output_item.added", `,"output_index":0,"item":`+itemInProgress())
	add("response.content_part.added", part+`,"part":`+outputText(""))
	for _, w := range words {
		add("response.output_text.delta", part+`,"delta":`+jsonString(w)+`,"logprobs":[]`)
	}
	add("response.output_text.done", part+`,"text":`+jsonString(text)+`,"logprobs":[]`)
	add("response.content_part.done", part+`,"part":`+outputText(text))
	add("response.output_item.done", `,"output_index":0,"item":`+itemCompleted(text))
	add("response.completed", `,"response":`+response(o, "completed", itemCompleted(text), true))
	return events
}

func models(ids []string) []byte {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list"}
	for _, id := range ids {
		list.Data = append(list.Data, model{ID: id, Object: "model", Created: 1700000000, OwnedBy: "proxytest"})
	}
	b, _ := json.Marshal(list) // plain strings and numbers always marshal
	return b
}

// errorEnvelope is the OpenAI error body for status.
func errorEnvelope(status int, message string) []byte {
	typ, code := "server_error", "null"
	switch {
	case status == http.StatusUnauthorized:
		typ, code = "authentication_error", `"invalid_api_key"`
	case status == http.StatusForbidden:
		typ = "permission_error"
	case status == http.StatusTooManyRequests:
		typ, code = "rate_limit_error", `"rate_limit_exceeded"`
	case status >= 400 && status < 500:
		typ = "invalid_request_error"
	}
	if message == "" {
		message = "proxytest error " + itoa(status)
	}
	return []byte(`{"error":{"message":` + jsonString(message) + `,"type":"` + typ +
		`","param":null,"code":` + code + `}}`)
}
