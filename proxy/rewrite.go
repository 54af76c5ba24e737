package proxy

import (
	"bytes"
	"strconv"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/internal/jsoncheck"
)

// requestFields are the top-level fields of a generation request the gateway
// reads, found in one pass over the body.
type requestFields struct {
	Model         gjson.Result
	Stream        gjson.Result
	StreamOptions gjson.Result
	IncludeUsage  gjson.Result // stream_options.include_usage; Index is into the body
	// Responses only: the state a call continues, and whether the upstream
	// keeps the response (store defaults to true).
	PreviousResponseID gjson.Result
	Store              gjson.Result
	Background         gjson.Result
	// RequestID is vLLM's and SGLang's extension that names the response
	// id; refused on responses (see route).
	RequestID gjson.Result
	// Input is read for the stored items it names (item_reference), and
	// Conversation refused: state the upstream holds, like
	// PreviousResponseID.
	Input        gjson.Result
	Conversation gjson.Result
	// Chat only: how many choices a stream carries, each ending with its
	// own finish_reason.
	N   gjson.Result
	end int // offset of the body's closing '}'
}

// scanRequest validates body as one JSON object and locates the fields the
// gateway needs. Duplicate keys are refused: upstreams written in
// Python keep the last duplicate while gjson finds the first, so a second
// "model" would otherwise slip past the allow-list and the price, and a
// second "previous_response_id" (or "input", with the items it names) past
// the owner check. stream
// and stream_options of the wrong type are refused too, as OpenAI refuses
// them, rather than read as "not streaming" or rewritten; null counts as
// absent, as it does at OpenAI.
func scanRequest(body []byte) (requestFields, *APIError) {
	var f requestFields
	if jsoncheck.TooDeep(body, jsoncheck.MaxDepth) {
		return f, BadRequest("", "request body nests arrays and objects more than "+strconv.Itoa(jsoncheck.MaxDepth)+" deep")
	}
	if !gjson.ValidBytes(body) {
		return f, BadRequest("", "request body is not valid JSON"+notUTF8(body))
	}
	root := gjson.Parse(bstr(body))
	if !root.IsObject() {
		return f, BadRequest("", "request body must be a JSON object")
	}
	var dup string
	// Every other top-level key is refused twice as well: the prompt's
	// estimate reads the first "messages" and an upstream prefills the
	// last, so a client that then left paid for a few tokens of a long
	// prompt. Checked in the walk that finds the fields, not in a second.
	var keys jsoncheck.Keys
	root.ForEach(func(key, value gjson.Result) bool {
		if keys.Seen(key) {
			dup = key.Str
			return false
		}
		var slot *gjson.Result
		switch key.Str {
		case "model":
			slot = &f.Model
		case "stream":
			slot = &f.Stream
		case "stream_options":
			slot = &f.StreamOptions
		case "previous_response_id":
			slot = &f.PreviousResponseID
		case "store":
			slot = &f.Store
		case "background":
			slot = &f.Background
		case "request_id":
			slot = &f.RequestID
		case "input":
			slot = &f.Input
		case "conversation":
			slot = &f.Conversation
		case "n":
			slot = &f.N
		default:
			return true
		}
		*slot = value
		return true
	})
	if dup != "" {
		return f, BadRequest(dup, "duplicate key "+strconv.Quote(dup)+" in request body")
	}
	if !isBoolOrNull(f.Stream) {
		return f, wrongType("stream", "a boolean", f.Stream)
	}
	if so := f.StreamOptions; so.Type != gjson.Null {
		if !so.IsObject() {
			return f, wrongType("stream_options", "an object", so)
		}
		// Its members are refused twice too: the gateway rewrites the
		// first include_usage, and an upstream keeping the last would then
		// send no usage, and the call would be billed on an estimate.
		if dup := jsoncheck.DuplicateMember(so); dup != "" {
			return f, BadRequest("stream_options."+dup, "duplicate key "+strconv.Quote(dup)+" in stream_options")
		}
		f.IncludeUsage = so.Get("include_usage")
		if !isBoolOrNull(f.IncludeUsage) {
			return f, wrongType("stream_options.include_usage", "a boolean", f.IncludeUsage)
		}
	}
	// store decides whether the response is remembered for
	// previous_response_id; "false" as a string would have counted as
	// storing.
	if !isBoolOrNull(f.Store) {
		return f, wrongType("store", "a boolean", f.Store)
	}
	if !isBoolOrNull(f.Background) {
		return f, wrongType("background", "a boolean", f.Background)
	}
	f.end = bytes.LastIndexByte(body, '}')
	return f, nil
}

// isBoolOrNull is true for true, false, null and a missing field (whose
// gjson type is Null too).
func isBoolOrNull(v gjson.Result) bool {
	return v.Type == gjson.True || v.Type == gjson.False || v.Type == gjson.Null
}

// wrongType words the refusal as OpenAI does, so a client sees the same
// message from the gateway as from OpenAI.
func wrongType(param, want string, got gjson.Result) *APIError {
	return BadRequest(param, "Invalid type for '"+param+"': expected "+want+", but got "+jsoncheck.Kind(got)+" instead.")
}

type edit struct {
	pos, cut int // replace body[pos:pos+cut] with text
	text     string
}

// rewriteRequest appends to dst the body to send upstream: the model renamed
// to the upstream's name (upstreamModelJSON, already a JSON string) and, when forceUsage, stream_options.include_usage set to
// true. Every other byte is the client's. It reports whether include_usage
// was added (the client had not asked for usage), so the relay can drop
// what the client would not have received. f MUST come from scanRequest
// without an error: stream_options is then absent, null or an object whose
// include_usage is absent, null or a boolean.
func rewriteRequest(dst, body []byte, f *requestFields, upstreamModelJSON string, forceUsage bool) ([]byte, bool) {
	var edits [2]edit
	n := 0
	if f.Model.Raw != upstreamModelJSON {
		edits[n] = edit{pos: f.Model.Index, cut: len(f.Model.Raw), text: upstreamModelJSON}
		n++
	}
	injected := false
	if forceUsage {
		so := f.StreamOptions
		switch {
		case !so.Exists():
			injected = true
			text := `,"stream_options":{"include_usage":true}`
			if !hasMembersBefore(body, f.end) {
				text = text[1:]
			}
			edits[n] = edit{pos: f.end, text: text}
			n++
		case so.IsObject():
			iu := f.IncludeUsage
			switch {
			case iu.Type == gjson.True:
			case iu.Exists():
				injected = true
				edits[n] = edit{pos: iu.Index, cut: len(iu.Raw), text: "true"} // gjson indexes are absolute
				n++
			default:
				injected = true
				text := `"include_usage":true,`
				if len(so.Map()) == 0 {
					text = `"include_usage":true`
				}
				edits[n] = edit{pos: so.Index + 1, text: text}
				n++
			}
		default: // null: the client asked for nothing
			injected = true
			edits[n] = edit{pos: so.Index, cut: len(so.Raw), text: `{"include_usage":true}`}
			n++
		}
	}
	es := edits[:n]
	if n == 2 && es[1].pos < es[0].pos {
		es[0], es[1] = es[1], es[0]
	}
	prev := 0
	for _, e := range es {
		dst = append(dst, body[prev:e.pos]...)
		dst = append(dst, e.text...)
		prev = e.pos + e.cut
	}
	return append(dst, body[prev:]...), injected
}

// hasMembersBefore reports whether the object ending at end has any member,
// i.e. something other than whitespace follows its opening brace.
func hasMembersBefore(body []byte, end int) bool {
	open := bytes.IndexByte(body, '{')
	return len(bytes.TrimSpace(body[open+1:end])) > 0
}

// appendWithoutMember appends obj to dst without the member named key whose
// value v gjson found at the top level of obj, taking one adjacent comma with
// it. It reports false when the bytes around v are not the plain `"key":`
// it expects (an escaped key, say), so the caller can leave obj alone.
func appendWithoutMember(dst, obj []byte, v gjson.Result, key string) ([]byte, bool) {
	valStart, valEnd := v.Index, v.Index+len(v.Raw)
	if valStart <= 0 || valEnd > len(obj) {
		return dst, false
	}
	i := skipSpaceBack(obj, valStart-1)
	if i < 0 || obj[i] != ':' {
		return dst, false
	}
	i = skipSpaceBack(obj, i-1)
	if i < 0 || obj[i] != '"' {
		return dst, false
	}
	keyStart := i - len(key) - 1
	if keyStart < 0 || obj[keyStart] != '"' || string(obj[keyStart+1:i]) != key {
		return dst, false
	}
	if k := skipSpaceBack(obj, keyStart-1); k >= 0 && obj[k] == ',' {
		dst = append(dst, obj[:k]...)
		return append(dst, obj[valEnd:]...), true
	}
	m := valEnd
	for m < len(obj) && isJSONSpace(obj[m]) {
		m++
	}
	if m < len(obj) && obj[m] == ',' {
		valEnd = m + 1
	}
	dst = append(dst, obj[:keyStart]...)
	return append(dst, obj[valEnd:]...), true
}

func skipSpaceBack(b []byte, i int) int {
	for i >= 0 && isJSONSpace(b[i]) {
		i--
	}
	return i
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// bstr views b as a string without copying, for gjson: gjson.GetBytes
// copies every result to stay safe, which costs allocations per chunk.
// The string, and every gjson.Result taken from it, MUST NOT be used after
// b is modified or reused.
func bstr(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// notUTF8 says why a body that is not valid JSON may look valid to its
// sender: the byte order mark or the UTF-16 that Windows tools write.
func notUTF8(body []byte) string {
	if bytes.HasPrefix(body, jsoncheck.UTF8BOM) {
		return ": it starts with a UTF-8 byte order mark (EF BB BF); send the JSON without it"
	}
	if enc := jsoncheck.UTF16Encoding(body); enc != "" {
		return ": it is " + enc + "; send the JSON in UTF-8"
	}
	return ""
}
