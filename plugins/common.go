package plugins

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/internal/jsoncheck"
	"github.com/tollgate/tollgate/internal/suggest"
	"github.com/tollgate/tollgate/internal/utf8cut"
	"github.com/tollgate/tollgate/meter"
	"github.com/tollgate/tollgate/money"
	"github.com/tollgate/tollgate/proxy"
)

// A request is validated before it is admitted (a 400 costs no quota), so
// anonymous callers, whom public mode allows one request a minute, can
// send invalid bodies without limit: refusing one must cost little
// whatever it holds. Bodies under server.max_request_body (8 MiB) took
// seconds of CPU each: 400,000 keys of examples, a million labels or
// empty examples, decoded whole, then walked and worded in full for a
// 400 that quotes the first problem. So a body longer than any valid
// request can be is refused unread, and lists and objects with more
// members than a label set can have are refused before decoding.
const (
	// jsonEscapedBytes is the most bytes JSON may spend on one byte of
	// text: \u001f for a control character.
	jsonEscapedBytes = 6
	// bodySlack is room for a body's names, punctuation, white space and
	// short fields (model, classifier, mode, numbers).
	bodySlack = 64 << 10
)

// maxBody is the longest body of an endpoint whose fields hold at most
// texts texts of plugins.max_text_bytes and other bytes besides, every
// byte of them escaped, plus bodySlack.
func maxBody(p config.Plugins, texts int, other int64) int64 {
	return jsonEscapedBytes*(int64(texts)*int64(p.MaxTextBytes)+other) + bodySlack
}

// textFields are the fields held to plugins.max_text_bytes: one whose
// JSON string is over jsonEscapedBytes times that is refused unread.
var textFields = []string{"text", "source", "query", "description", "text_type"}

// decodeBody reads the request body into dst, a pointer to a struct whose
// json tags are the endpoint's fields. Unknown fields are refused by name
// (a client that typed "lables" must hear so, not get a default), and every
// failure names the field at fault. example is a minimal valid body, quoted
// when the body is missing; texts and other bound the body (maxBody), and
// otherIs says in the 413 what other is ("a label set 256 KiB"; "" for
// nothing).
func decodeBody(ctx *fasthttp.RequestCtx, dst any, example string, p config.Plugins, texts int, other int64, otherIs string) *proxy.APIError {
	if n, limit := len(ctx.PostBody()), maxBody(p, texts, other); int64(n) > limit {
		holds := "each text plugins.max_text_bytes"
		if otherIs != "" {
			holds += ", " + otherIs
		}
		return &proxy.APIError{Status: fasthttp.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Message: fmt.Sprintf("the request body is %d bytes; %s takes at most %d: what its fields may hold (%s), every byte escaped", n, ctx.Path(), limit, holds)}
	}
	body := bytes.TrimSpace(ctx.PostBody())
	if len(body) == 0 {
		return proxy.BadRequest("", "the request body is empty: send a JSON object such as "+example)
	}
	if bytes.HasPrefix(body, jsoncheck.UTF8BOM) {
		// Windows tools (PowerShell's Out-File, Notepad) write one; it
		// was answered as if the body were not an object.
		return proxy.BadRequest("", "the request body starts with a UTF-8 byte order mark (EF BB BF): send the JSON object without it")
	}
	if enc := jsoncheck.UTF16Encoding(body); enc != "" {
		// It was "must be a JSON object", of a body that is one.
		return proxy.BadRequest("", "the request body is "+enc+": send the JSON object in UTF-8")
	}
	if body[0] != '{' {
		return proxy.BadRequest("", "the request body must be a JSON object such as "+example)
	}
	if jsoncheck.TooDeep(body, jsoncheck.MaxDepth) {
		// The decoder's "exceeded max depth" read as JSON that is not
		// valid; say what chat says.
		return proxy.BadRequest("", "the request body nests arrays and objects more than "+strconv.Itoa(jsoncheck.MaxDepth)+" deep")
	}
	if gjson.ValidBytes(body) {
		if apiErr := checkMembers(body, dst, p.MaxTextBytes); apiErr != nil {
			return apiErr
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) && gjson.ValidBytes(body) {
			if apiErr := nonStringElement(body, dst); apiErr != nil {
				return apiErr // names the element, where the decoder names its list
			}
		}
		return decodeError(err, dst)
	}
	if _, err := dec.Token(); err != io.EOF {
		return proxy.BadRequest("", "the request body has more after its JSON object: send one object")
	}
	if apiErr := duplicateKey(body, dst); apiErr != nil {
		return apiErr
	}
	if apiErr := nonStringElement(body, dst); apiErr != nil {
		return apiErr
	}
	return unreadableName(body, dst)
}

// nameFields are the fields whose strings are names, not texts: labels
// and tags, which the answer names back, the keys of descriptions and
// examples, which name labels, and a score's attribute.
var nameFields = []string{"labels", "tags", "descriptions", "examples", "attribute"}

// unreadableName refuses a name (nameFields) that is not UTF-8 or
// escapes a lone surrogate, as the admin API refuses such a string. The
// JSON decoder reads either as U+FFFD, so labels ["billing\ud800", "bug"]
// were answered "billing\uFFFD", a label the client's own list does not
// hold. A text is read so too, and answered: a stray byte changes a
// word, not a name.
func unreadableName(body []byte, dst any) *proxy.APIError {
	var apiErr *proxy.APIError
	// what says what is wrong with the JSON string raw, "" when nothing.
	what := func(raw string) string {
		switch {
		case !utf8.ValidString(raw):
			return "is not valid UTF-8"
		case strings.IndexByte(raw, '\\') >= 0 && jsoncheck.LoneSurrogate(raw):
			return `escapes a lone surrogate ("\ud800" without the "\udc00" to "\udfff" after it, or one of those alone), which is no character`
		}
		return ""
	}
	const read = "; the JSON decoder would read it as U+FFFD (the replacement character), another name than the one sent: send it as UTF-8"
	gjson.ParseBytes(body).ForEach(func(key, value gjson.Result) bool {
		// The name test first: it spares the reflection of fieldType for
		// every text, on every classify, tag, score and match request.
		if !slices.Contains(nameFields, key.Str) {
			return true
		}
		if _, ok := fieldType(dst, key.Str); !ok {
			return true
		}
		field := key.Str
		switch {
		case value.IsArray():
			i := 0
			value.ForEach(func(_, el gjson.Result) bool {
				if w := what(el.Raw); w != "" {
					p := fmt.Sprintf("%s[%d]", field, i)
					apiErr = proxy.BadRequest(p, p+" "+w+read)
				}
				i++
				return apiErr == nil
			})
		case value.IsObject():
			value.ForEach(func(k, _ gjson.Result) bool {
				if w := what(k.Raw); w != "" {
					asRead := strings.ToValidUTF8(k.Str, "\uFFFD")
					apiErr = proxy.BadRequest(field+"."+asRead, fmt.Sprintf("%s has a key (%+q as read) that %s%s", field, asRead, w, read))
				}
				return apiErr == nil
			})
		case value.Type == gjson.String:
			if w := what(value.Raw); w != "" {
				apiErr = proxy.BadRequest(field, field+" "+w+read)
			}
		}
		return apiErr == nil
	})
	return apiErr
}

// checkMembers walks body's members before it is decoded. It refuses a
// member whose name is one of dst's fields in another case ("Labels",
// "TEXT"), as the admin API and chat refuse it: encoding/json fills the
// field from it, but the checks that walk the body by name
// (nonStringElement, duplicateKey) did not recognise it, so "LABELS":
// [null] passed as an empty label, and an error named the raw key. Names
// are exact, as the endpoints document them. It also refuses a list
// (labels, tags) or an object keyed by label (descriptions, examples)
// with more members than config.MaxLabels, counted, not decoded, and a
// text (textFields) whose JSON string is too long for any escaping to
// bring it under maxTextBytes.
func checkMembers(body []byte, dst any, maxTextBytes config.ByteSize) *proxy.APIError {
	fields := jsonFields(dst)
	var apiErr *proxy.APIError
	gjson.ParseBytes(body).ForEach(func(key, value gjson.Result) bool {
		if t, ok := fieldType(dst, key.Str); ok {
			if value.Type == gjson.String && slices.Contains(textFields, key.Str) && int64(len(value.Raw)-2) > jsonEscapedBytes*int64(maxTextBytes) {
				apiErr = proxy.BadRequest(key.Str, fmt.Sprintf("%s is longer than plugins.max_text_bytes (%d bytes): its JSON string takes %d bytes", key.Str, maxTextBytes, len(value.Raw)-2))
				return false
			}
			apiErr = tooManyMembers(key.Str, value, t)
			return apiErr == nil
		}
		for _, f := range fields {
			if strings.EqualFold(f, key.Str) {
				apiErr = proxy.BadRequest(key.Str, fmt.Sprintf("unknown field %q (did you mean %q? field names are case-sensitive); fields of this endpoint: %s",
					key.Str, f, strings.Join(fields, ", ")))
				return false
			}
		}
		return true
	})
	return apiErr
}

// tooManyMembers refuses v, the value of field (of type t), when it is
// the list or object t asks for and has more than config.MaxLabels
// members; or, for lists in an object (examples), more entries in all
// than config.MaxLabelSetBytes, as each takes a byte of the label set at
// least (an empty one is refused).
func tooManyMembers(field string, v gjson.Result, t reflect.Type) *proxy.APIError {
	isList, isObject := t.Kind() == reflect.Slice && v.IsArray(), t.Kind() == reflect.Map && v.IsObject()
	if !isList && !isObject {
		return nil
	}
	n, entries := 0, 0
	v.ForEach(func(_, member gjson.Result) bool {
		n++
		if isObject && t.Elem().Kind() == reflect.Slice && member.IsArray() {
			member.ForEach(func(_, _ gjson.Result) bool {
				entries++
				return entries <= config.MaxLabelSetBytes
			})
		}
		return entries <= config.MaxLabelSetBytes // members are counted all, for the message: it costs no allocation
	})
	switch {
	case entries > config.MaxLabelSetBytes:
		return proxy.BadRequest(field, fmt.Sprintf("%s hold more than %d entries: a label set takes at most %d bytes, and each entry one at least", field, config.MaxLabelSetBytes, config.MaxLabelSetBytes))
	case n <= config.MaxLabels:
		return nil
	case isList:
		return proxy.BadRequest(field, fmt.Sprintf("%s must have 1 to %d entries, got %d", field, config.MaxLabels, n))
	}
	return proxy.BadRequest(field, fmt.Sprintf("%s has %d keys: its keys are labels, of which there are at most %d", field, n, config.MaxLabels))
}

// nonStringElement refuses a null in a list of strings, which
// encoding/json reads as "" ("labels":[null] was then "labels[0] is
// empty"), naming the element; so does a number there, which the decoder
// names only by its list. Inside objects too: "descriptions": {"a": 5}
// names descriptions.a, and "examples": {"a": [null]} examples.a[0].
func nonStringElement(body []byte, dst any) *proxy.APIError {
	var apiErr *proxy.APIError
	gjson.ParseBytes(body).ForEach(func(key, value gjson.Result) bool {
		if f, ok := fieldType(dst, key.Str); ok {
			apiErr = wrongMember(key.Str, value, f)
		}
		return apiErr == nil
	})
	return apiErr
}

// wrongMember checks the members of v, the value at path of a field of
// type t, when v is the list or object t asks for (the decoder words
// the mismatch otherwise): each must be a string, or a list of strings,
// as t's element is.
func wrongMember(path string, v gjson.Result, t reflect.Type) *proxy.APIError {
	var apiErr *proxy.APIError
	// path is a func: an element's path is worded only when it is wrong,
	// as a list may hold a million of them.
	check := func(p func() string, el gjson.Result) bool {
		switch t.Elem().Kind() {
		case reflect.String:
			if el.Type != gjson.String {
				apiErr = proxy.BadRequest(p(), fmt.Sprintf("%s must be a string, got %s", p(), gjsonKind(el)))
			}
		case reflect.Slice:
			if !el.IsArray() {
				apiErr = proxy.BadRequest(p(), fmt.Sprintf("%s must be %s, got %s", p(), describeJSONType(t.Elem()), gjsonKind(el)))
			} else {
				apiErr = wrongMember(p(), el, t.Elem())
			}
		}
		return apiErr == nil
	}
	switch {
	case t.Kind() == reflect.Slice && v.IsArray():
		i := 0
		v.ForEach(func(_, el gjson.Result) bool {
			n := i
			i++
			return check(func() string { return fmt.Sprintf("%s[%d]", path, n) }, el)
		})
	case t.Kind() == reflect.Map && v.IsObject():
		v.ForEach(func(key, el gjson.Result) bool { return check(func() string { return path + "." + key.Str }, el) })
	}
	return apiErr
}

// duplicateKey refuses a body that names one of dst's fields twice, as
// the gateway refuses a second "model" in chat (proxy.scanRequest):
// encoding/json keeps the last one, other readers of the same body the
// first, and a client that sent two texts cannot know which was
// classified. body is valid JSON (decoding it succeeded), and names its
// fields exactly (checkMembers).
func duplicateKey(body []byte, dst any) *proxy.APIError {
	seen := make(map[string]bool, len(jsonFields(dst)))
	// One pass finds both: a field named twice, and, inside a field, a key
	// twice, which is as ambiguous (encoding/json keeps the last
	// description of a label). The field named twice is reported first.
	var dup, nested string
	gjson.ParseBytes(body).ForEach(func(key, value gjson.Result) bool {
		name := key.Str
		if seen[name] {
			dup = name
			return false
		}
		seen[name] = true
		if nested == "" {
			nested = nestedDuplicate(key.Str, value)
		}
		return true
	})
	if dup != "" {
		return proxy.BadRequest(dup, fmt.Sprintf("duplicate key %q in request body: send each field once", dup))
	}
	if nested != "" {
		msg := fmt.Sprintf("duplicate key %q in request body: send each key once", nested)
		if strings.ContainsRune(nested, utf8.RuneError) {
			msg += " (a lone surrogate escape such as \\ud800, or a byte that is not UTF-8, reads as U+FFFD, so keys that differ only there are one key)"
		}
		return proxy.BadRequest(nested, msg)
	}
	return nil
}

// nestedDuplicate returns the path of a key an object within v holds
// twice, or "". path is v's own. Keys compare as encoding/json decodes
// them, into the map the engine reads: "x\ud800" and "x\udc00" are one
// key there (U+FFFD), the last kept silently.
func nestedDuplicate(path string, v gjson.Result) string {
	var dup string
	switch {
	case v.IsObject():
		if d := jsoncheck.DuplicateDecodedMember(v); d != "" {
			return path + "." + d
		}
		v.ForEach(func(key, member gjson.Result) bool {
			dup = nestedDuplicate(path+"."+key.Str, member)
			return dup == ""
		})
	case v.IsArray():
		i := 0
		v.ForEach(func(_, member gjson.Result) bool {
			if member.IsArray() || member.IsObject() { // a string holds no key
				dup = nestedDuplicate(fmt.Sprintf("%s[%d]", path, i), member)
			}
			i++
			return dup == ""
		})
	}
	return dup
}

// wholeNumber is an integer field that also takes an integral number
// written as a float: JSON has one number type, and Python's
// json.dumps(1.0) sends "max_tags": 1.0, which was refused as out of
// range. A fraction, a string or a number beyond 2^53 is refused as an
// int field refuses it, with the decoder's error (see decodeError).
type wholeNumber int

func (n *wholeNumber) UnmarshalJSON(b []byte) error {
	var i int
	err := json.Unmarshal(b, &i)
	if err == nil {
		*n = wholeNumber(i)
		return nil
	}
	var typ *json.UnmarshalTypeError
	if !errors.As(err, &typ) {
		return err
	}
	if f, ferr := strconv.ParseFloat(string(b), 64); ferr == nil && f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
		*n = wholeNumber(f)
		return nil
	}
	return &json.UnmarshalTypeError{Value: typ.Value, Type: reflect.TypeFor[wholeNumber](), Offset: typ.Offset}
}

// numberRanges words the valid values of the numeric fields, for a number
// out of range, whether it fits the field's type (threshold: -1) or not
// (threshold: 1e400): one wording for both (see outOfRangeMsg).
var numberRanges = map[string]string{
	"threshold": config.ThresholdRange,
	"max_tags":  fmt.Sprintf("an integer between 1 and %d", maxMaxTags),
}

// outOfRangeMsg is the 400 message for value, out of field's range.
func outOfRangeMsg(field string, value any) string {
	return fmt.Sprintf("%s must be %s, got %v", field, numberRanges[field], value)
}

// outOfRange is the message for a number that encoding/json could not
// store in field (of type t): one that overflows a float64, or an integer
// field given an integral number it cannot hold. ok is false for other
// mismatches (a fraction for an integer, a string for a number).
func outOfRange(field string, t reflect.Type, value string) (string, bool) {
	num, isNumber := strings.CutPrefix(value, "number ")
	if !isNumber {
		return "", false
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Float32, reflect.Float64:
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if f, err := strconv.ParseFloat(num, 64); err == nil && f != math.Trunc(f) {
			return "", false // a fraction: "must be an integer" says it
		}
	default:
		return "", false
	}
	if len(num) > 32 {
		num = num[:32] + "…"
	}
	if _, ok := numberRanges[field]; ok {
		return outOfRangeMsg(field, num), true
	}
	return fmt.Sprintf("%s must be %s in range, got %s, which is out of range", field, describeJSONType(t), num), true
}

func decodeError(err error, dst any) *proxy.APIError {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return proxy.BadRequest("", fmt.Sprintf("the request body is not valid JSON: %s (at byte %d)", strings.TrimPrefix(syntax.Error(), "json: "), syntax.Offset))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return proxy.BadRequest("", "the request body is not valid JSON: it ends before the object is closed")
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return proxy.BadRequest("", "the request body must be a JSON object")
		}
		want, got := typ.Type, "got"
		f, ok := fieldType(dst, field)
		if ok && f != typ.Type && !(f.Kind() == reflect.Pointer && f.Elem() == typ.Type) {
			want, got = f, "it holds" // an element of an array or object is wrong
		} else if msg, ok := outOfRange(field, typ.Type, typ.Value); ok {
			return proxy.BadRequest(field, msg)
		}
		return proxy.BadRequest(field, fmt.Sprintf("%s must be %s, %s %s", field, describeJSONType(want), got, describeJSONValue(typ.Value)))
	}
	if quoted, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		// encoding/json quotes the name Go's way: unquoted, it is the
		// key as sent, which %q below quotes once ("text\x00" was
		// "text\\x00").
		name, err := strconv.Unquote(quoted)
		if err != nil {
			name = strings.Trim(quoted, `"`)
		}
		name = quotable(name)
		msg := fmt.Sprintf("unknown field %q", name)
		fields := jsonFields(dst)
		if s := suggest.Nearest(name, fields); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return proxy.BadRequest(name, msg+"; fields of this endpoint: "+strings.Join(fields, ", "))
	}
	return proxy.BadRequest("", "the request body could not be read: "+strings.TrimPrefix(err.Error(), "json: "))
}

func describeJSONType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Slice:
		return "an array of " + pluralJSONType(t.Elem())
	case reflect.Map:
		return "an object whose values are " + pluralJSONType(t.Elem())
	case reflect.Pointer:
		return describeJSONType(t.Elem())
	}
	one := strings.TrimSuffix(pluralJSONType(t), "s")
	if strings.IndexByte("aeiou", one[0]) >= 0 {
		return "an " + one
	}
	return "a " + one
}

func pluralJSONType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "strings"
	case reflect.Float32, reflect.Float64:
		return "numbers"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "integers"
	case reflect.Bool:
		return "booleans"
	case reflect.Slice:
		return "arrays of " + pluralJSONType(t.Elem())
	case reflect.Pointer:
		return pluralJSONType(t.Elem())
	}
	return "objects"
}

// describeJSONValue words encoding/json's UnmarshalTypeError.Value ("number",
// "number 2.5", "string", "array", "object", "bool").
func describeJSONValue(v string) string {
	switch {
	case v == "array" || v == "object":
		return "an " + v
	case v == "bool":
		return "true or false"
	}
	return "a " + v
}

// gjsonKind words the kind of a JSON value as describeJSONValue does.
func gjsonKind(v gjson.Result) string {
	if v.IsBool() {
		return "true or false"
	}
	return jsoncheck.Kind(v)
}

// fieldType is the type of the field dst's struct calls name in JSON.
func fieldType(dst any, name string) (reflect.Type, bool) {
	t := reflect.TypeOf(dst).Elem()
	for i := range t.NumField() {
		if n, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); n == name {
			return t.Field(i).Type, true
		}
	}
	return nil, false
}

// jsonFields lists the json names of the struct dst points to.
func jsonFields(dst any) []string {
	t := reflect.TypeOf(dst).Elem()
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// labelSetTokens estimates, at one token per 4 bytes, what a label set
// adds to a classify or tag request's text, for admission. Counting it
// exactly costs about as much as classifying; leaving it out let one
// request carry a million tokens of examples past a 10,000 tokens/min
// limit. The engine's usage settles the difference after the call.
func labelSetTokens(labels []string, descriptions map[string]string, examples map[string][]string) int64 {
	n := 0
	for _, l := range labels {
		n += len(l)
	}
	for _, d := range descriptions {
		n += len(d)
	}
	for _, list := range examples {
		for _, e := range list {
			n += len(e)
		}
	}
	return int64(n+3) / 4
}

// quotable is s cut to quote in an error: a model, classifier or field
// name of megabytes was quoted whole, its 400 as long as the body.
func quotable(s string) string { return utf8cut.Shorten(s, 200) }

// requireText checks a required text field against plugins.max_text_bytes.
func requireText(field, v string, p config.Plugins) *proxy.APIError {
	if v == "" {
		return proxy.BadRequest(field, field+" is required")
	}
	if config.Blank(v) {
		// Nothing to classify or score: the engines answered with a tie or
		// a floor that read like a verdict.
		return proxy.BadRequest(field, field+" holds only whitespace or invisible characters")
	}
	return maxText(field, v, p)
}

func maxText(field, v string, p config.Plugins) *proxy.APIError {
	return firstProblem(config.CheckTextBytes(field, v, p.MaxTextBytes))
}

// labelBytes holds each label (or tag) of a set to plugins.max_text_bytes,
// as a text, and returns the bytes they take together. field names the set.
func labelBytes(field string, labels []string, p config.Plugins) (int, *proxy.APIError) {
	n := 0
	for i, l := range labels {
		if apiErr := maxText(fmt.Sprintf("%s[%d]", field, i), l, p); apiErr != nil {
			return 0, apiErr
		}
		n += len(l)
	}
	return n, nil
}

// checkThreshold applies the default to an omitted threshold.
func checkThreshold(t *float64) (float64, *proxy.APIError) {
	if t == nil {
		return config.DefaultThreshold, nil
	}
	if !(*t >= 0 && *t <= 1) {
		return 0, proxy.BadRequest("threshold", outOfRangeMsg("threshold", *t))
	}
	if *t == 0 {
		return 0, nil // -0 too, which multi mode echoed as "threshold": -0
	}
	return *t, nil
}

func firstProblem(problems []config.FieldProblem) *proxy.APIError {
	if len(problems) == 0 {
		return nil
	}
	return proxy.BadRequest(problems[0].Field, problems[0].Msg)
}

// tail is what every response ends with: who answered, the usage and the
// time taken.
type tail struct {
	LatencyMS int64  `json:"latency_ms"`
	Usage     usage  `json:"usage"`
	Engine    string `json:"engine"`
	Model     string `json:"model,omitempty"`
	// Fallback says why an llm answer was wanted and an offline engine gave it.
	Fallback string `json:"fallback,omitempty"`
	// NoLogprobs: the llm's upstream sent no log-probabilities, so the
	// confidences or score carry no measure of the model's certainty.
	NoLogprobs bool `json:"no_logprobs,omitempty"`
}

// usage is a response's tokens, shown as a chat completion shows them:
// the parts of the prompt and completion tokens the llm's upstream
// reported cached and reasoning are in prompt_tokens_details and
// completion_tokens_details. Each is shown only when not 0, so an
// offline engine's answer keeps the spec's three counts; an SDK reads an
// absent part as 0.
type usage struct {
	PromptTokens            int64                    `json:"prompt_tokens"`
	CompletionTokens        int64                    `json:"completion_tokens"`
	TotalTokens             int64                    `json:"total_tokens"`
	PromptTokensDetails     *promptTokensDetails     `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *completionTokensDetails `json:"completion_tokens_details,omitempty"`
}

type promptTokensDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

type completionTokensDetails struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

func shownUsage(u classifiers.Usage) usage {
	shown := usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	if u.CachedTokens > 0 {
		shown.PromptTokensDetails = &promptTokensDetails{u.CachedTokens}
	}
	if u.ReasoningTokens > 0 {
		shown.CompletionTokensDetails = &completionTokensDetails{u.ReasoningTokens}
	}
	return shown
}

// execution is one validated request, ready to run.
type execution struct {
	endpoint string // path, as metered
	price    string // plugins.pricing entry, USD per token
	model    string // the request's "model", "" when absent
	// tokens is what the limits admit the request at: its text's tokens,
	// and an estimate of its labels', descriptions' and examples' (see
	// labelSetTokens), settled with the engine's usage after the call.
	tokens int64
	// labels are the request's labels or closed tags, labelsField names
	// them ("labels", "tags") and classifier the saved classifier they
	// come from: an offline engine answering alone refuses those it
	// cannot read (offlineLabels). None for score and match.
	labels                  []string
	labelsField, classifier string
	// run calls the engine and keeps its result; it may be called twice
	// (llm, then semantic or lexical after a fallback).
	run func(ctx context.Context, e classifiers.Engine) (classifiers.Answer, error)
	// respond is the 200 answer, made from what run kept and the tail.
	respond func(t tail) any
}

// execute picks the engine, checks the balance and the limits, runs the
// request, writes the answer or the error, and meters the call.
func (m *module) execute(ctx *fasthttp.RequestCtx, call *proxy.Call, x execution) {
	choice, apiErr := m.chooseEngine(callerOf(call), x.model)
	if apiErr == nil {
		apiErr = choice.unavailable()
	}
	if apiErr == nil && len(x.labels) > 0 && choice.offlineAlone() {
		apiErr = offlineLabels(x.labelsField, x.labels, x.classifier)
	}
	if apiErr == nil {
		apiErr = call.Server.CheckBalance(call.World, call)
	}
	if apiErr == nil {
		apiErr = call.Admit(ctx, x.tokens)
	}
	if apiErr != nil {
		proxy.WriteError(ctx, apiErr)
		if apiErr.Status >= 500 { // the engine asked for is down
			call.Server.ObserveFailure(x.model, "", x.endpoint, apiErr.Status, time.Since(call.Start))
		}
		return
	}
	ans, apiErr := choice.run(call.ModelCallContext(ctx), x.run)
	if apiErr != nil {
		if choice.untaken && choice.name == engineLLM {
			// Admitted while no probe had found the model down (none
			// yet, or a stale one), it met the 503 unavailable() gives
			// later calls before admission, which cost no quota.
			call.Refused(ctx)
		}
		proxy.WriteError(ctx, apiErr)
		if choice.spent.Tokens() > 0 {
			// The model was asked and answered, if not what was asked.
			record(call, x, choice, choice.spent, apiErr.Status)
		} else if apiErr.Status >= 500 {
			call.Server.ObserveFailure(cmp.Or(choice.model, choice.name), choice.upstream, x.endpoint, apiErr.Status, time.Since(call.Start))
		}
		return
	}
	u := ans.Usage
	u.TotalTokens = u.Tokens()
	call.AddTokens(ctx, u.TotalTokens-x.tokens)
	t := tail{Engine: choice.name, Model: choice.model, Fallback: choice.fallback, NoLogprobs: ans.NoLogprobs,
		Usage: shownUsage(u), LatencyMS: time.Since(call.Start).Milliseconds()}
	body, err := encodeAnswer(x.respond(t))
	if err != nil {
		// Metered as the 500 the caller got, not as the 200 it did not:
		// nothing at the endpoint's price, but a model's tokens, spent on
		// an answer, as on any call that failed after the model answered.
		apiErr := proxy.Internal("encoding the response: " + err.Error())
		proxy.WriteError(ctx, apiErr)
		spent := choice.spent
		if choice.name == engineLLM {
			spent = u
		}
		if spent.Tokens() > 0 {
			record(call, x, choice, spent, apiErr.Status)
		} else {
			call.Server.ObserveFailure(cmp.Or(choice.model, choice.name), choice.upstream, x.endpoint, apiErr.Status, time.Since(call.Start))
		}
		return
	}
	record(call, x, choice, u, fasthttp.StatusOK)
	writeEncoded(ctx, body)
}

// record meters a keyed call at the endpoint's price per token. The
// tokens a model spent on it cost at least what the model's own prices
// make of them: all of them when the llm answered or failed, those of
// the failed attempt when an offline engine answered after it (auto).
// The event then names the model and its upstream, whose usage it
// carries: one row per call, as every call has. A public call is free:
// its event only counts it, tokens and all, in the request metrics.
func record(call *proxy.Call, x execution, choice *engineChoice, u classifiers.Usage, status int) {
	price, err := money.ParsePrice(x.price) // validated with the config
	if err != nil {
		price = 0
	}
	var llm classifiers.Usage // the model's part of u
	model, upstream := choice.name, ""
	switch {
	case choice.name == engineLLM:
		llm, model, upstream = u, choice.model, choice.upstream
	case choice.spent.Tokens() > 0:
		llm, model, upstream = choice.spent, choice.spentModel, choice.spentUpstream
	}
	var offlineCost, llmCost money.Atto
	offlineCost.Add(u.Tokens()-llm.Tokens(), price)
	llmCost.Add(llm.Tokens(), price)
	// At the plugin price alone, a key allowed an expensive model ran up
	// to 64 KiB of text a call through it at a 6th to a 25th of what a
	// chat call pays for the same tokens.
	llmNanos := max(llmCost.Nanos(), modelCost(call.World, model, llm))
	nanos := offlineCost.Nanos() + llmNanos
	source := meter.SourceTokenizer
	switch {
	case u.Estimated: // an llm's upstream reported no usage to believe
		source = meter.SourceEstimated
	case llm.Tokens() > 0:
		source = meter.SourceUpstream
	}
	ev := &meter.Event{
		ID:               call.RequestID,
		Time:             call.Start.UTC(),
		Endpoint:         x.endpoint,
		Model:            model,
		Upstream:         upstream,
		PromptTokens:     u.PromptTokens,
		CachedTokens:     u.CachedTokens,
		CompletionTokens: u.CompletionTokens,
		ReasoningTokens:  u.ReasoningTokens,
		CostNanos:        nanos,
		UsageSource:      source,
		Status:           status,
		Latency:          time.Since(call.Start),
	}
	if call.Key == nil {
		call.Server.ObserveUnmetered(ev)
		return
	}
	ev.Account, ev.KeyID = call.Key.Account, call.Key.ID
	call.Server.Record(ev)
}

// modelCost is what catalog model's own prices (models[].pricing) make
// of u, the tokens it spent on one plugin call, cached ones at
// input_cache_read; 0 when it spent none.
func modelCost(w *proxy.World, model string, u classifiers.Usage) money.Nanos {
	if u.Tokens() == 0 {
		return 0
	}
	e, ok := w.Catalog.Resolve(model)
	if !ok {
		return 0
	}
	return e.Prices.Cost(u.Catalog())
}

// writeJSON writes v as a 200 response.
func writeJSON(ctx *fasthttp.RequestCtx, v any) {
	body, err := encodeJSON(v)
	if err != nil {
		proxy.WriteError(ctx, proxy.Internal("encoding the response: "+err.Error()))
		return
	}
	writeEncoded(ctx, body)
}

// encodeAnswer encodes a classifier endpoint's answer. It is a variable
// so that a test can make it fail: the engines give no answer it cannot
// encode (their numbers are finite), but a call it failed must not be
// metered as a 200.
var encodeAnswer = encodeJSON

func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeEncoded writes body, JSON, as a 200 response.
func writeEncoded(ctx *fasthttp.RequestCtx, body []byte) {
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// sortScores orders scores by confidence, highest first; ties keep the
// order the engine gave.
func sortScores(s []classifiers.LabelScore) []classifiers.LabelScore {
	if s == nil {
		return []classifiers.LabelScore{}
	}
	sort.SliceStable(s, func(i, j int) bool { return s[i].Confidence > s[j].Confidence })
	return s
}
