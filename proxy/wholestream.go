package proxy

import (
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// A streamed request may be answered with a whole JSON answer: an
// upstream that cannot stream, or ignores "stream". Passed on as it
// came, the SDKs read it as an empty stream that succeeded: the client
// got nothing, and was billed the answer. The whole answer is written
// instead as the stream the client asked for, in the events OpenAI
// sends, all at once. The bill is the whole answer's, as before.

// wholeAnswerAsStream writes the stream of body, a whole answer of ep
// with its choices or output list (attempt's notAnAnswer), to dst.
// billed is the usage object (chatUsage, responsesUsage) of what the
// call is billed, written where the answer carries none; nil for a chat
// client that did not ask for usage, which gets no usage chunk.
func wholeAnswerAsStream(dst, body []byte, ep endpoint, billed []byte) []byte {
	root := gjson.ParseBytes(body)
	if ep == endpointResponses {
		return wholeResponseAsStream(dst, root, billed)
	}
	return wholeChatAsStream(dst, root, billed)
}

// wholeChatAsStream writes each choice as OpenAI streams one: a chunk
// with its role alone, one with the rest of its message as the delta
// and its logprobs, and one with its finish_reason; then, if asked for
// (billed is not nil), the usage chunk with the answer's usage, or billed
// where it has none; and [DONE]. The Node SDK's stream helper takes a
// choice's first chunk for its start and then adds it in: logprobs in
// that chunk came out twice.
func wholeChatAsStream(dst []byte, root gjson.Result, billed []byte) []byte {
	choices := root.Get("choices")
	head := appendChunkHead(nil, root) // every chunk's first members, up to its choices
	head = append(head, `"choices":`...)
	n := 0
	choices.ForEach(func(_, choice gjson.Result) bool {
		index := choice.Get("index").Raw
		if index == "" {
			index = strconv.Itoa(n)
		}
		n++
		// chunk starts a chunk of this choice, up to its delta.
		chunk := func() {
			dst = append(append(append(dst, "data: "...), head...), `[{"index":`...)
			dst = append(append(dst, index...), `,"delta":`...)
		}
		message := choice.Get("message")
		role := `"assistant"`
		if r := message.Get("role"); r.Type == gjson.String {
			role = r.Raw
		}
		chunk()
		dst = append(append(append(dst, `{"role":`...), role...), `},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
		chunk()
		dst = appendDelta(dst, message)
		dst = append(append(append(dst, `,"logprobs":`...), rawOr(choice.Get("logprobs"), "null")...), `,"finish_reason":null}]}`+"\n\n"...)
		chunk()
		dst = append(append(append(dst, `{},"logprobs":null,"finish_reason":`...), rawOr(choice.Get("finish_reason"), "null")...), "}]}\n\n"...)
		return true
	})
	if billed != nil {
		usage := billed
		if u := root.Get("usage"); u.IsObject() {
			usage = []byte(u.Raw)
		}
		dst = append(append(append(dst, "data: "...), head...), `[],"usage":`...)
		dst = append(append(dst, usage...), "}\n\n"...)
	}
	return append(dst, "data: [DONE]\n\n"...)
}

// appendChunkHead writes the first members of a chat chunk, up to its
// choices, from root, a chunk or a whole answer: its id, created,
// model, system_fingerprint and service_tier as they are, and its
// object, "chat.completion.chunk".
func appendChunkHead(dst []byte, root gjson.Result) []byte {
	dst = append(dst, '{')
	for _, name := range [...]string{"id", "object", "created", "model", "system_fingerprint", "service_tier"} {
		v := root.Get(name)
		switch {
		case name == "object":
			dst = append(dst, `"object":"chat.completion.chunk",`...)
		case v.Exists():
			dst = append(append(append(append(dst, '"'), name...), `":`...), v.Raw...)
			dst = append(dst, ',')
		}
	}
	return dst
}

// appendDelta writes a message as a chunk's delta: every member as it
// is, but its role, which the chunk before carried, and tool calls,
// which a delta numbers (index) and which an empty list leaves out.
func appendDelta(dst []byte, message gjson.Result) []byte {
	if !message.IsObject() {
		return append(dst, `{}`...)
	}
	dst = append(dst, '{')
	first := true
	message.ForEach(func(key, v gjson.Result) bool {
		if key.Str == "role" || key.Str == "tool_calls" && (!v.IsArray() || len(v.Array()) == 0) {
			return true
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(append(dst, key.Raw...), ':')
		if key.Str != "tool_calls" {
			dst = append(dst, v.Raw...)
			return true
		}
		dst = append(dst, '[')
		for i, call := range v.Array() {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendIndexed(dst, call, i)
		}
		dst = append(dst, ']')
		return true
	})
	return append(dst, '}')
}

// appendIndexed writes a tool call with its index first, unless it has
// one.
func appendIndexed(dst []byte, call gjson.Result, i int) []byte {
	if !call.IsObject() || call.Get("index").Exists() {
		return append(dst, call.Raw...)
	}
	dst = strconv.AppendInt(append(dst, `{"index":`...), int64(i), 10)
	empty := true
	call.ForEach(func(_, _ gjson.Result) bool {
		empty = false
		return false
	})
	if empty {
		return append(dst, '}')
	}
	return append(append(dst, ','), call.Raw[1:]...) // past its '{': a Raw object has no leading space
}

// responseEvents writes Responses stream events, numbered.
type responseEvents struct {
	dst []byte
	seq int
}

// add writes one event of type typ whose other members are fields (a
// JSON object's members, without braces).
func (w *responseEvents) add(typ string, fields ...string) {
	w.dst = append(append(append(w.dst, "event: "...), typ...), "\ndata: {\"type\":\""...)
	w.dst = append(append(w.dst, typ...), '"')
	for _, f := range fields {
		w.dst = append(append(w.dst, ','), f...)
	}
	w.dst = strconv.AppendInt(append(w.dst, `,"sequence_number":`...), int64(w.seq), 10)
	w.dst = append(w.dst, "}\n\n"...)
	w.seq++
}

// wholeResponseAsStream writes the events OpenAI streams a response in:
// created and in progress (the response with no output yet), each output
// item added, its content, reasoning and arguments as one delta each, the
// item done,
// and the terminal event of its status, whose response carries billed as
// its usage where it has none. A response that has not ended (queued, in
// progress) is written as created alone, as it is.
func wholeResponseAsStream(dst []byte, root gjson.Result, billed []byte) []byte {
	w := responseEvents{dst: dst}
	status := root.Get("status").Str
	var terminal string
	switch status {
	case "completed", "incomplete", "failed":
		terminal = "response." + status
	default:
		w.add("response.created", `"response":`+root.Raw)
		return w.dst
	}
	if u := root.Get("usage"); billed != nil && (!u.Exists() || u.Type == gjson.Null) {
		withUsage, _ := sjson.SetRaw(root.Raw, "usage", string(billed))
		root = gjson.Parse(withUsage)
	}
	output := root.Get("output")
	started := []byte(root.Raw)
	started, _ = sjson.SetBytes(started, "status", "in_progress")
	started, _ = sjson.SetRawBytes(started, "output", []byte("[]"))
	for _, name := range [...]string{"usage", "error", "incomplete_details", "completed_at"} {
		if root.Get(name).Exists() {
			started, _ = sjson.SetRawBytes(started, name, []byte("null"))
		}
	}
	w.add("response.created", `"response":`+string(started))
	w.add("response.in_progress", `"response":`+string(started))
	output.ForEach(func(k, item gjson.Result) bool {
		at := `"output_index":` + strconv.Itoa(int(k.Int()))
		itemID := `"item_id":` + rawOr(item.Get("id"), `""`)
		switch item.Get("type").Str {
		case "message":
			w.add("response.output_item.added", at, `"item":`+unfinished(item, "content", "[]"))
			item.Get("content").ForEach(func(j, part gjson.Result) bool {
				in := `"content_index":` + strconv.Itoa(int(j.Int()))
				switch part.Get("type").Str {
				case "output_text":
					text := rawOr(part.Get("text"), `""`)
					logprobs := `"logprobs":` + rawOr(part.Get("logprobs"), `[]`)
					w.add("response.content_part.added", itemID, at, in, `"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}`)
					w.add("response.output_text.delta", itemID, at, in, `"delta":`+text, logprobs)
					w.add("response.output_text.done", itemID, at, in, `"text":`+text, logprobs)
				case "refusal":
					refusal := rawOr(part.Get("refusal"), `""`)
					w.add("response.content_part.added", itemID, at, in, `"part":{"type":"refusal","refusal":""}`)
					w.add("response.refusal.delta", itemID, at, in, `"delta":`+refusal)
					w.add("response.refusal.done", itemID, at, in, `"refusal":`+refusal)
				default:
					w.add("response.content_part.added", itemID, at, in, `"part":`+part.Raw)
				}
				w.add("response.content_part.done", itemID, at, in, `"part":`+part.Raw)
				return true
			})
		case "reasoning":
			// Its text as OpenAI streams it, each part added empty, its
			// text as one delta, done: sent whole in output_item.added, a
			// UI that shows reasoning as its deltas come showed none.
			added := unfinished(item, "summary", "[]")
			if item.Get("content").IsArray() {
				added, _ = sjson.SetRaw(added, "content", "[]")
			}
			w.add("response.output_item.added", at, `"item":`+added)
			item.Get("content").ForEach(func(j, part gjson.Result) bool {
				in := `"content_index":` + strconv.Itoa(int(j.Int()))
				if part.Get("type").Str != "reasoning_text" {
					w.add("response.content_part.added", itemID, at, in, `"part":`+part.Raw)
				} else {
					text := rawOr(part.Get("text"), `""`)
					w.add("response.content_part.added", itemID, at, in, `"part":{"type":"reasoning_text","text":""}`)
					w.add("response.reasoning_text.delta", itemID, at, in, `"delta":`+text)
					w.add("response.reasoning_text.done", itemID, at, in, `"text":`+text)
				}
				w.add("response.content_part.done", itemID, at, in, `"part":`+part.Raw)
				return true
			})
			item.Get("summary").ForEach(func(j, part gjson.Result) bool {
				in := `"summary_index":` + strconv.Itoa(int(j.Int()))
				text := rawOr(part.Get("text"), `""`)
				w.add("response.reasoning_summary_part.added", itemID, at, in, `"part":{"type":"summary_text","text":""}`)
				w.add("response.reasoning_summary_text.delta", itemID, at, in, `"delta":`+text)
				w.add("response.reasoning_summary_text.done", itemID, at, in, `"text":`+text)
				w.add("response.reasoning_summary_part.done", itemID, at, in, `"part":`+part.Raw)
				return true
			})
		case "function_call":
			args := rawOr(item.Get("arguments"), `""`)
			w.add("response.output_item.added", at, `"item":`+unfinished(item, "arguments", `""`))
			w.add("response.function_call_arguments.delta", itemID, at, `"delta":`+args)
			w.add("response.function_call_arguments.done", itemID, at, `"arguments":`+args)
		default:
			w.add("response.output_item.added", at, `"item":`+item.Raw)
		}
		w.add("response.output_item.done", at, `"item":`+item.Raw)
		return true
	})
	w.add(terminal, `"response":`+root.Raw)
	return w.dst
}

// unfinished returns item as its output_item.added event shows it: in
// progress, with field (its content, its arguments) still empty.
func unfinished(item gjson.Result, field, empty string) string {
	b := []byte(item.Raw)
	if item.Get("status").Exists() {
		b, _ = sjson.SetBytes(b, "status", "in_progress")
	}
	b, _ = sjson.SetRawBytes(b, field, []byte(empty))
	return string(b)
}

func rawOr(v gjson.Result, otherwise string) string {
	if !v.Exists() {
		return otherwise
	}
	return v.Raw
}
