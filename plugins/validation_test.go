package plugins_test

import (
	"fmt"
	"strings"
	"testing"
)

// TestValidation: every refusal of a malformed body is 400
// invalid_request_error naming the field at fault, before any engine runs
// or any quota is used.
func TestValidation(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: lexical\n  max_text_bytes: 1KiB"})
	labels201 := make([]string, 201)
	for i := range labels201 {
		labels201[i] = fmt.Sprintf("%q", fmt.Sprint("l", i))
	}
	long := strings.Repeat("a", 1025)
	cases := []struct {
		name, path, body, param, msg string
	}{
		{"empty body", "/v1/classify", ``, "", "the request body is empty"},
		{"not an object", "/v1/classify", `["text"]`, "", "must be a JSON object"},
		{"bad JSON", "/v1/classify", `{"text": "x",}`, "", "not valid JSON"},
		{"cut JSON", "/v1/classify", `{"text": "x"`, "", "not valid JSON"},
		{"two objects", "/v1/classify", `{"text": "x", "labels": ["a"]} {}`, "", "more after its JSON object"},
		{"typo", "/v1/classify", `{"text": "x", "lables": ["a"]}`, "lables", `unknown field "lables" (did you mean "labels"?)`},
		{"text missing", "/v1/classify", `{"labels": ["a"]}`, "text", "text is required"},
		{"text empty", "/v1/classify", `{"text": "", "labels": ["a"]}`, "text", "text is required"},
		{"text not a string", "/v1/classify", `{"text": 5, "labels": ["a"]}`, "text", "text must be a string, got a number"},
		{"text too long", "/v1/classify", `{"text": "` + long + `", "labels": ["a"]}`, "text", "text is 1025 bytes, longer than plugins.max_text_bytes (1024 bytes)"},
		{"labels missing", "/v1/classify", `{"text": "x"}`, "labels", "labels is required (1 to 200 labels), unless classifier names a saved classifier"},
		{"labels empty", "/v1/classify", `{"text": "x", "labels": []}`, "labels", "labels must have 1 to 200 entries, got 0"},
		{"labels too many", "/v1/classify", `{"text": "x", "labels": [` + strings.Join(labels201, ",") + `]}`, "labels", "labels must have 1 to 200 entries, got 201"},
		{"label empty", "/v1/classify", `{"text": "x", "labels": ["a", "b", "c", ""]}`, "labels[3]", "labels[3] is empty"},
		{"label twice", "/v1/classify", `{"text": "x", "labels": ["billing", "bug", "billing"]}`, "labels[2]", `labels has "billing" twice`},
		{"description of no label", "/v1/classify", `{"text": "x", "labels": ["a"], "descriptions": {"x": "y"}}`, "descriptions.x", `descriptions has a key "x" that is not a label`},
		{"descriptions not strings", "/v1/classify", `{"text": "x", "labels": ["a"], "descriptions": {"a": 1}}`, "descriptions.a", "descriptions.a must be a string, got a number"},
		{"description null", "/v1/classify", `{"text": "x", "labels": ["a"], "descriptions": {"a": null}}`, "descriptions.a", "descriptions.a must be a string, got null"},
		{"example not a string", "/v1/classify", `{"text": "x", "labels": ["a"], "examples": {"a": ["y", 5]}}`, "examples.a[1]", "examples.a[1] must be a string, got a number"},
		{"example null", "/v1/classify", `{"text": "x", "labels": ["a"], "examples": {"a": [null]}}`, "examples.a[0]", "examples.a[0] must be a string, got null"},
		{"descriptions not an object", "/v1/classify", `{"text": "x", "labels": ["a"], "descriptions": ["a"]}`, "descriptions", "descriptions must be an object whose values are strings, got an array"},
		{"example of no label", "/v1/classify", `{"text": "x", "labels": ["a"], "examples": {"b": ["y"]}}`, "examples.b", `examples has a key "b" that is not a label`},
		{"example empty", "/v1/classify", `{"text": "x", "labels": ["a"], "examples": {"a": [""]}}`, "examples.a[0]", `examples of "a": entry 0 is empty`},
		{"description too long", "/v1/classify", `{"text": "x", "labels": ["a"], "descriptions": {"a": "` + long + `"}}`, "descriptions.a", "descriptions.a is 1025 bytes, longer than plugins.max_text_bytes (1024 bytes)"},
		{"label set too large", "/v1/classify", `{"text": "x", "labels": ["a"], "examples": {"a": [` + strings.TrimSuffix(strings.Repeat(`"`+strings.Repeat("e", 1000)+`",`, 270), ",") + `]}}`, "labels", "labels, descriptions and examples take 270001 bytes; at most 262144 are accepted (as a batch job keeps)"},
		{"example too long", "/v1/classify", `{"text": "x", "labels": ["a"], "examples": {"a": ["y", "` + long + `"]}}`, "examples.a[1]", "examples.a[1] is 1025 bytes, longer than plugins.max_text_bytes (1024 bytes)"},
		{"examples not arrays", "/v1/classify", `{"text": "x", "labels": ["a"], "examples": {"a": "y"}}`, "examples.a", "examples.a must be an array of strings, got a string"},
		{"mode", "/v1/classify", `{"text": "x", "labels": ["a"], "mode": "several"}`, "mode", `mode must be single or multi, got "several"`},
		{"threshold above 1", "/v1/classify", `{"text": "x", "labels": ["a"], "mode": "multi", "threshold": 1.5}`, "threshold", "threshold must be a number between 0 and 1, got 1.5"},
		{"threshold below 0", "/v1/classify", `{"text": "x", "labels": ["a"], "threshold": -0.1}`, "threshold", "threshold must be a number between 0 and 1, got -0.1"},
		{"threshold a string", "/v1/classify", `{"text": "x", "labels": ["a"], "threshold": "0.5"}`, "threshold", "threshold must be a number, got a string"},
		{"threshold overflows", "/v1/classify", `{"text": "x", "labels": ["a"], "mode": "multi", "threshold": 1e400}`, "threshold", "threshold must be a number between 0 and 1, got 1e400"},
		{"threshold overflows below", "/v1/classify", `{"text": "x", "labels": ["a"], "threshold": -1e400}`, "threshold", "threshold must be a number between 0 and 1, got -1e400"},
		{"text twice", "/v1/classify", `{"text": "x", "labels": ["a"], "text": "y"}`, "text", `duplicate key "text" in request body`},
		// A field in another case is unknown, as in the admin API: encoding/json
		// filled labels from "LABELS", but the element checks, which walk the
		// body by name, skipped it ([null] was "labels[0] is empty").
		{"text twice, other case", "/v1/classify", `{"text": "x", "labels": ["a"], "Text": "y"}`, "Text", `unknown field "Text" (did you mean "text"? field names are case-sensitive)`},
		{"labels in capitals", "/v1/classify", `{"text": "x", "LABELS": [null]}`, "LABELS", `unknown field "LABELS" (did you mean "labels"?`},
		{"descriptions capitalised", "/v1/classify", `{"text": "x", "labels": ["a"], "Descriptions": {"a": 5}}`, "Descriptions", `unknown field "Descriptions" (did you mean "descriptions"?`},
		{"tags capitalised, escaped", "/v1/tag", `{"text": "x", "\u0054ags": ["a"]}`, "Tags", `unknown field "Tags" (did you mean "tags"?`},
		{"byte order mark", "/v1/classify", "\ufeff" + `{"text": "x", "labels": ["a"]}`, "", "the request body starts with a UTF-8 byte order mark (EF BB BF)"},
		// Windows PowerShell 5 writes UTF-16: it was "must be a JSON object"
		// of a body that is one, and the decoder's "exceeded max depth"
		// read as JSON that is not valid.
		{"UTF-16 with its mark", "/v1/classify", "\xff\xfe{\x00\"\x00t\x00\"\x00:\x00\"\x00x\x00\"\x00}\x00", "", "the request body is UTF-16 little-endian: send the JSON object in UTF-8"},
		{"UTF-16 big-endian", "/v1/classify", "\x00{\x00\"\x00t\x00\"\x00:\x00\"\x00x\x00\"\x00}", "", "the request body is UTF-16 big-endian: send the JSON object in UTF-8"},
		{"nested too deep", "/v1/classify", `{"text": "x", "labels": ["a"], "mode": ` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, "", "the request body nests arrays and objects more than 10000 deep"},
		{"text twice, escaped", "/v1/classify", `{"text": "x", "labels": ["a"], "te\u0078t": "y"}`, "text", `duplicate key "text" in request body`},
		{"labels twice", "/v1/classify", `{"text": "x", "labels": ["a"], "labels": ["b"]}`, "labels", `duplicate key "labels" in request body`},
		{"model twice", "/v1/classify", `{"text": "x", "labels": ["a"], "model": "lexical", "model": "llm"}`, "model", `duplicate key "model" in request body`},
		{"tags empty", "/v1/tag", `{"text": "x", "tags": []}`, "tags", "tags is empty: give 1 to 200 tags, or leave tags out for open tags"},
		{"text only whitespace", "/v1/classify", `{"text": "  \n ", "labels": ["a", "b"]}`, "text", "text holds only whitespace or invisible characters"},
		{"label only whitespace", "/v1/classify", `{"text": "x", "labels": ["a", "  "]}`, "labels[1]", "labels[1] is empty"},
		{"a description twice", "/v1/classify", `{"text": "x", "labels": ["a", "b"], "descriptions": {"a": "dogs", "a": "refunds"}}`, "descriptions.a", `duplicate key "descriptions.a" in request body`},
		{"examples of a label twice", "/v1/classify", `{"text": "x", "labels": ["a", "b"], "examples": {"b": ["x"], "b": ["y"]}}`, "examples.b", `duplicate key "examples.b" in request body`},
		// Keys read as encoding/json decodes them into the map: both are
		// "x\ufffd", and the last description was kept silently.
		{"descriptions of two lone surrogates", "/v1/classify", `{"text": "x", "labels": ["x\ufffd"], "descriptions": {"x\ud800": "dogs", "x\udc00": "refunds"}}`, "descriptions.x\ufffd", "reads as U+FFFD"},
		{"examples of two bytes not UTF-8", "/v1/classify", "{\"text\": \"x\", \"labels\": [\"a\ufffd\"], \"examples\": {\"a\xff\": [\"y\"], \"a\xfe\": [\"z\"]}}", "examples.a\ufffd", "duplicate key \"examples.a\ufffd\""},
		{"unknown classifier", "/v1/classify", `{"text": "x", "classifier": "foo"}`, "classifier", `classifier "foo" is not defined; saved classifiers: support-intent`},
		{"null label", "/v1/classify", `{"text": "x", "labels": ["a", null]}`, "labels[1]", `labels[1] must be a string, got null`},
		{"number label", "/v1/classify", `{"text": "x", "labels": [1, "b"]}`, "labels[0]", `labels[0] must be a string, got a number`},
		{"misspelt classifier", "/v1/classify", `{"text": "x", "classifier": "support-intnet"}`, "classifier", `classifier "support-intnet" is not defined (did you mean "support-intent"?); saved classifiers: support-intent`},
		{"classifier and labels", "/v1/classify", `{"text": "x", "classifier": "support-intent", "labels": ["a"]}`, "labels", "labels cannot be sent with classifier"},
		{"classifier, bad threshold", "/v1/classify", `{"text": "x", "classifier": "support-intent", "threshold": 2}`, "threshold", "threshold must be a number between 0 and 1, got 2"},
		{"text_type too long", "/v1/classify", `{"text": "x", "labels": ["a"], "text_type": "` + long + `"}`, "text_type", "text_type is 1025 bytes"},
		{"unknown model", "/v1/classify", `{"text": "x", "labels": ["a", "b"], "model": "gpt-5"}`, "model", `model "gpt-5" does not exist; use semantic, lexical, llm or a catalog model: small, large`},

		{"tag text missing", "/v1/tag", `{"tags": ["a"]}`, "text", "text is required"},
		{"tag typo", "/v1/tag", `{"text": "x", "tag": ["a"]}`, "tag", `unknown field "tag" (did you mean "tags"?)`},
		{"tag empty", "/v1/tag", `{"text": "x", "tags": ["a", ""]}`, "tags[1]", "tags[1] is empty"},
		{"tags alike", "/v1/tag", `{"text": "x", "tags": ["bug", "BUG!"]}`, "tags[1]", `tags has "bug" and "BUG!", which differ only in case, spacing, punctuation`},
		{"tag without a word", "/v1/tag", `{"text": "x", "tags": ["a", "_"]}`, "tags[1]", `tags[1] ("_") has no letter or digit`},
		{"labels alike, NFC and NFD", "/v1/classify", `{"text": "x", "labels": ["café", "cafe\u0301"]}`, "labels[1]", `labels has "caf\u00e9" and "cafe\u0301"`},
		{"label without a word", "/v1/classify", `{"text": "x", "labels": ["a", "!!!"]}`, "labels[1]", `labels[1] ("!!!") has no letter or digit`},
		{"tags too many", "/v1/tag", `{"text": "x", "tags": [` + strings.Join(labels201, ",") + `]}`, "tags", "tags must have 1 to 200 entries, got 201"},
		{"tag twice", "/v1/tag", `{"text": "x", "tags": ["a", "a"]}`, "tags[1]", `tags has "a" twice`},
		{"max_tags 0", "/v1/tag", `{"text": "x", "max_tags": 0}`, "max_tags", "max_tags must be an integer between 1 and 50, got 0"},
		{"max_tags fraction", "/v1/tag", `{"text": "x", "max_tags": 2.5}`, "max_tags", "max_tags must be an integer, got a number 2.5"},
		{"max_tags overflows", "/v1/tag", `{"text": "x", "max_tags": 1e400}`, "max_tags", "max_tags must be an integer between 1 and 50, got 1e400"},
		{"max_tags too big for an int", "/v1/tag", `{"text": "x", "max_tags": 99999999999999999999}`, "max_tags", "max_tags must be an integer between 1 and 50, got 99999999999999999999"},
		{"tag threshold overflows", "/v1/tag", `{"text": "x", "threshold": 1e400}`, "threshold", "threshold must be a number between 0 and 1, got 1e400"},
		{"tag text twice", "/v1/tag", `{"text": "x", "text": "y"}`, "text", `duplicate key "text" in request body`},
		{"tag threshold", "/v1/tag", `{"text": "x", "threshold": 7}`, "threshold", "threshold must be a number between 0 and 1, got 7"},

		// One check for empty: white space and invisible characters read
		// as nothing, the score answered 0 and was billed.
		{"score attribute only whitespace", "/v1/score", `{"source": "x", "attribute": "   "}`, "attribute", "attribute holds only whitespace or invisible characters"},
		{"score attribute invisible", "/v1/score", `{"source": "x", "attribute": "\u200b"}`, "attribute", "attribute holds only whitespace or invisible characters"},
		{"text invisible", "/v1/classify", `{"text": "\u200b", "labels": ["a"]}`, "text", "text holds only whitespace or invisible characters"},
		{"text NUL", "/v1/tag", `{"text": "\u0000"}`, "text", "text holds only whitespace or invisible characters"},
		{"match query invisible", "/v1/match", `{"source": "x", "query": "\ufeff "}`, "query", "query holds only whitespace or invisible characters"},
		// Read as absent, but the blank description was billed.
		{"description only whitespace", "/v1/classify", `{"text": "x", "labels": ["a", "bug"], "descriptions": {"a": "letters", "bug": " "}}`, "descriptions.bug", `descriptions of "bug" holds only whitespace or invisible characters`},
		{"text_type only whitespace", "/v1/classify", `{"text": "x", "labels": ["a", "b"], "text_type": " ​"}`, "text_type", "text_type holds only whitespace or invisible characters"},
		{"text_type blank over a saved classifier", "/v1/classify", `{"text": "x", "classifier": "support-intent", "text_type": "  "}`, "text_type", "text_type holds only whitespace or invisible characters"},
		{"example only whitespace", "/v1/classify", `{"text": "x", "labels": ["a"], "examples": {"a": ["y", " "]}}`, "examples.a[1]", `examples of "a": entry 1 is empty`},
		// Scored and billed as if it were absent.
		{"score description only whitespace", "/v1/score", `{"source": "x", "attribute": "urgency", "description": " \u200b\n"}`, "description", "description holds only whitespace or invisible characters"},
		{"score source missing", "/v1/score", `{"attribute": "urgency"}`, "source", "source is required"},
		{"score attribute missing", "/v1/score", `{"source": "x"}`, "attribute", "attribute is required"},
		{"score attribute too long", "/v1/score", `{"source": "x", "attribute": "` + strings.Repeat("u", 201) + `"}`, "attribute", "attribute is 201 bytes, longer than 200"},
		{"score source too long", "/v1/score", `{"source": "` + long + `", "attribute": "urgency"}`, "source", "source is 1025 bytes"},
		{"score description too long", "/v1/score", `{"source": "x", "attribute": "urgency", "description": "` + long + `"}`, "description", "description is 1025 bytes"},
		{"score source twice", "/v1/score", `{"source": "x", "attribute": "urgency", "source": "y"}`, "source", `duplicate key "source" in request body`},
		{"score typo", "/v1/score", `{"source": "x", "atribute": "urgency"}`, "atribute", `unknown field "atribute" (did you mean "attribute"?)`},

		{"match source missing", "/v1/match", `{"query": "x"}`, "source", "source is required"},
		{"match query missing", "/v1/match", `{"source": "x"}`, "query", "query is required"},
		{"match query too long", "/v1/match", `{"source": "x", "query": "` + long + `"}`, "query", "query is 1025 bytes"},
		{"match query twice", "/v1/match", `{"source": "x", "query": "y", "query": "z"}`, "query", `duplicate key "query" in request body`},
		{"match unknown field", "/v1/match", `{"source": "x", "query": "y", "top_k": 3}`, "top_k", `unknown field "top_k"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := h.keyed(c.path, c.body).apiError(t, 400, "invalid_request_error")
			param, _ := e["param"].(string)
			if param != c.param {
				t.Errorf("param %v, want %q", e["param"], c.param)
			}
			if msg := e["message"].(string); !strings.Contains(msg, c.msg) {
				t.Errorf("message %q does not contain %q", msg, c.msg)
			}
		})
	}
	if n := len(h.rec.Events()); n != 0 {
		t.Errorf("%d events recorded for refused requests", n)
	}
	// None of those used the key's quota: the limits count admitted calls.
	r := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"]}`)
	r.ok(t)
	if got := r.header.Get("x-ratelimit-remaining-requests"); got != "599" {
		t.Errorf("x-ratelimit-remaining-requests %q after the first admitted call, want 599", got)
	}
}

// TestOneLabelSingleModeIsRefused: single mode with one label answered
// it at confidence 1 in every engine, with no tie and nothing to say the
// text had no evidence for it ("Let us meet for lunch tomorrow" was spam
// at 1). It is a 400 that points to multi mode, whose confidence says
// whether the label applies; a saved classifier of one label is
// refused likewise unless the request asks for multi mode.
func TestOneLabelSingleModeIsRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{classifiers: defaultClassifiers + `
  spam-only:
    labels: [spam]
`})
	for _, c := range []struct{ body, param, msg string }{
		{`{"text": "Let us meet for lunch tomorrow", "labels": ["spam"]}`, "labels", `single mode with one label always answers it, at confidence 1: send "mode": "multi", whose confidence says whether "spam" applies`},
		{`{"text": "Let us meet for lunch tomorrow", "labels": ["spam"], "mode": "single"}`, "labels", "single mode with one label"},
		{`{"text": "Let us meet for lunch tomorrow", "classifier": "spam-only"}`, "mode", `the saved classifier "spam-only" has one label`},
	} {
		e := h.keyed("/v1/classify", c.body).apiError(t, 400, "invalid_request_error")
		if e["param"] != c.param || !strings.Contains(e["message"].(string), c.msg) {
			t.Errorf("%s: %v", c.body, e)
		}
	}
	for _, body := range []string{
		`{"text": "Let us meet for lunch tomorrow", "labels": ["spam"], "mode": "multi"}`,
		`{"text": "Let us meet for lunch tomorrow", "classifier": "spam-only", "mode": "multi"}`,
	} {
		if m := h.keyed("/v1/classify", body).ok(t); fmt.Sprint(m["labels"]) != "[]" {
			t.Errorf("%s: %v", body, m)
		}
	}
	if n := len(h.rec.Events()); n != 2 {
		t.Errorf("%d events recorded, want the 2 multi-mode calls'", n)
	}
}

// TestIssueNamesThatAreNotUTF8AreRefused: a label, tag, key of
// descriptions or examples or a score attribute that is not UTF-8, or
// escapes a lone surrogate, was read as U+FFFD by the JSON decoder and
// answered: labels ["billing\ud800", "bug"] came back as
// "billing\uFFFD", which the client cannot find in its own list. They
// are refused by name, as the admin API refuses such strings; a text
// is still read with U+FFFD in its place, and a surrogate pair is one
// character.
func TestIssueNamesThatAreNotUTF8AreRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: lexical"})
	const notUTF8 = "is not valid UTF-8"
	const lone = "escapes a lone surrogate"
	for _, c := range []struct{ path, body, param, msg string }{
		{"/v1/classify", `{"text": "x", "labels": ["billing\ud800", "bug"]}`, "labels[0]", "labels[0] " + lone},
		{"/v1/classify", `{"text": "x", "labels": ["bug", "\udc00billing"]}`, "labels[1]", "labels[1] " + lone},
		{"/v1/classify", "{\"text\": \"x\", \"labels\": [\"caf\xe9\", \"bug\"]}", "labels[0]", "labels[0] " + notUTF8},
		{"/v1/classify", `{"text": "x", "labels": ["a", "b"], "descriptions": {"a\ud800": "y"}}`, "descriptions.a\ufffd", "descriptions has a key (\"a\\ufffd\" as read) that " + lone},
		{"/v1/classify", "{\"text\": \"x\", \"labels\": [\"a\", \"b\"], \"examples\": {\"a\xff\": [\"y\"]}}", "examples.a\ufffd", "examples has a key (\"a\\ufffd\" as read) that " + notUTF8},
		{"/v1/tag", `{"text": "x", "tags": ["a", "b\ud800"]}`, "tags[1]", "tags[1] " + lone},
		{"/v1/score", `{"source": "x", "attribute": "urgency\ud800"}`, "attribute", "attribute " + lone},
		{"/v1/score", "{\"source\": \"x\", \"attribute\": \"urg\xe9ncy\"}", "attribute", "attribute " + notUTF8},
	} {
		e := h.keyed(c.path, c.body).apiError(t, 400, "invalid_request_error")
		if e["param"] != c.param || !strings.Contains(e["message"].(string), c.msg) {
			t.Errorf("%s %q: param %q, message %q; want %q and %q", c.path, c.body, e["param"], e["message"], c.param, c.msg)
		}
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/classify", `{"text": "x", "labels": ["rating \ud83d\udc4d", "rating \ud83d\udc4e bad"]}`},
		{"/v1/classify", "{\"text\": \"caf\xe9 \\ud800\", \"labels\": [\"a\", \"b\"], \"descriptions\": {\"a\": \"caf\xe9\"}}"},
		{"/v1/score", "{\"source\": \"x\", \"attribute\": \"urgency\", \"description\": \"caf\xe9\"}"},
	} {
		h.keyed(c.path, c.body).ok(t)
	}
}

// TestIssueDescriptionKeyedInNFDDescribesItsLabel: labels ["café",
// "tea"] with descriptions {"cafe\u0301": …} were refused, 'descriptions
// has a key "café" that is not a label'. The key names its label in
// either Unicode form, and the engine reads the description: "I would
// like an espresso" is café by it, a tie without it.
func TestIssueDescriptionKeyedInNFDDescribesItsLabel(t *testing.T) {
	h := newHarness(t, harnessOptions{plugins: "  engine: lexical"})
	for _, c := range []struct{ body, want string }{
		{`{"text": "I would like an espresso", "labels": ["caf\u00e9", "tea"], "descriptions": {"cafe\u0301": "espresso and coffee"}}`, "caf\u00e9"},
		{`{"text": "I would like an espresso", "labels": ["caf\u00e9", "tea"], "examples": {"cafe\u0301": ["an espresso please"]}}`, "caf\u00e9"},
		{`{"text": "I would like an espresso", "labels": ["cafe\u0301", "tea"], "descriptions": {"caf\u00e9": "espresso and coffee"}}`, "cafe\u0301"},
	} {
		m := h.keyed("/v1/classify", c.body).ok(t)
		if m["label"] != c.want || m["tie"] != nil {
			t.Errorf("%s: label %+q, tie %v; want %+q, as the labels write it, and no tie", c.body, m["label"], m["tie"], c.want)
		}
	}
}

// TestUnknownFieldIsQuotedOnce: a control character in an unknown key was
// escaped twice, encoding/json's quoting quoted again: "text\u0000" was
// refused as unknown field "text\\x00".
func TestUnknownFieldIsQuotedOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	e := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "text\u0000": "y"}`).apiError(t, 400, "invalid_request_error")
	if msg := e["message"].(string); !strings.HasPrefix(msg, `unknown field "text\x00" (did you mean "text"?)`) || e["param"] != "text\x00" {
		t.Errorf("param %q, message %q", e["param"], msg)
	}
}

// TestOutOfRangeNumbersHaveOneWording: a threshold of -1 was "must be
// between 0 and 1" and one of 1e400 "must be a number between 0 and 1
// …, which is out of range"; max_tags likewise. Each field now words
// every out-of-range number one way.
func TestOutOfRangeNumbersHaveOneWording(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, c := range []struct{ path, body, msg string }{
		{"/v1/classify", `{"text": "x", "labels": ["a", "b"], "mode": "multi", "threshold": -1}`, "threshold must be a number between 0 and 1, got -1"},
		{"/v1/classify", `{"text": "x", "labels": ["a", "b"], "mode": "multi", "threshold": 1e400}`, "threshold must be a number between 0 and 1, got 1e400"},
		{"/v1/tag", `{"text": "x", "threshold": 1.5}`, "threshold must be a number between 0 and 1, got 1.5"},
		{"/v1/tag", `{"text": "x", "threshold": -1e400}`, "threshold must be a number between 0 and 1, got -1e400"},
		{"/v1/tag", `{"text": "x", "max_tags": 51}`, "max_tags must be an integer between 1 and 50, got 51"},
		{"/v1/tag", `{"text": "x", "max_tags": 1e400}`, "max_tags must be an integer between 1 and 50, got 1e400"},
	} {
		if e := h.keyed(c.path, c.body).apiError(t, 400, "invalid_request_error"); e["message"] != c.msg {
			t.Errorf("%s: %q, want %q", c.body, e["message"], c.msg)
		}
	}
}

// TestNullNumbersMeanTheDefault: "threshold": null is the default, as an
// omitted field is in OpenAI's API (the README says so); max_tags too.
func TestNullNumbersMeanTheDefault(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	m := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "mode": "multi", "threshold": null}`).ok(t)
	if m["threshold"] != 0.5 {
		t.Errorf("classify, threshold null: %v, want 0.5", m["threshold"])
	}
	h.keyed("/v1/tag", `{"text": "The export button does nothing on Safari", "threshold": null, "max_tags": null}`).ok(t)
}

// TestIntegralFloatsAreIntegers: "max_tags": 1.0, what Python's
// json.dumps(1.0) sends, and 1e0 were refused as out of range; an integer
// field now takes any integral number, and still refuses a fraction.
func TestIntegralFloatsAreIntegers(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, n := range []string{"1.0", "1e0", "0.1e1", "1.000"} {
		m := h.keyed("/v1/tag", `{"text": "refund refund invoice invoice invoice", "max_tags": `+n+`}`).ok(t)
		if tags := m["tags"].([]any); len(tags) != 1 {
			t.Errorf("max_tags %s: %d tags, want 1", n, len(tags))
		}
	}
	for n, msg := range map[string]string{
		"1.5":  "max_tags must be an integer, got a number 1.5",
		"51.0": "max_tags must be an integer between 1 and 50, got 51",
		`"1"`:  "max_tags must be an integer, got a string",
		"1e20": "max_tags must be an integer between 1 and 50, got 1e20",
	} {
		e := h.keyed("/v1/tag", `{"text": "x", "max_tags": `+n+`}`).apiError(t, 400, "invalid_request_error")
		if e["param"] != "max_tags" || !strings.Contains(e["message"].(string), msg) {
			t.Errorf("max_tags %s: %v, want %q", n, e, msg)
		}
	}
}

// TestNegativeZeroThresholdIsEchoedAsZero: "threshold": -0 is 0, and
// multi mode echoed it as -0.
func TestNegativeZeroThresholdIsEchoedAsZero(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	r := h.keyed("/v1/classify", `{"text": "x", "labels": ["a", "b"], "mode": "multi", "threshold": -0}`)
	if m := r.ok(t); m["threshold"] != 0.0 || strings.Contains(string(r.body), `"threshold":-0`) {
		t.Errorf("threshold -0 echoed as %s", r.body)
	}
}

// TestValidationPublicCostsNoQuota: a public caller who gets a 400 can fix
// the request and send it again at once.
func TestValidationPublicCostsNoQuota(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.do(request{path: "/v1/classify", body: `{"text": "x", "lables": ["a"]}`}).apiError(t, 400, "invalid_request_error")
	h.do(request{path: "/v1/classify", body: `{"text": "x", "labels": ["a", "b"]}`}).ok(t)
}

// TestOversizedBodiesAreRefusedBeforeDecoding: a body is validated before
// it is admitted, so an anonymous caller could send invalid ones without
// limit, each up to server.max_request_body (8 MiB), and each cost
// seconds of CPU: 400,000 keys of examples took 2.2 s for their 400, as
// the body was decoded whole and every key sorted and worded. Now what
// no valid request can hold is refused unread or only counted.
func TestOversizedBodiesAreRefusedBeforeDecoding(t *testing.T) {
	h := newHarness(t, harnessOptions{}) // max_text_bytes 64 KiB
	keys := make([]string, 400_000)
	for i := range keys {
		keys[i] = fmt.Sprintf(`"k%d":[]`, i)
	}
	for _, c := range []struct{ name, path, body, param, msg string }{
		{"400,000 keys of examples", "/v1/classify", `{"text": "hi", "labels": ["a"], "examples": {` + strings.Join(keys, ",") + `}}`,
			"examples", "examples has 400000 keys: its keys are labels, of which there are at most 200"},
		{"201 descriptions", "/v1/classify", `{"text": "hi", "labels": ["a"], "descriptions": {` + strings.Repeat(`"a": "x",`, 200) + `"b": "y"}}`,
			"descriptions", "descriptions has 201 keys"},
		{"more examples than a label set has bytes", "/v1/classify", `{"text": "hi", "labels": ["a"], "examples": {"a": [` + strings.Repeat(`"",`, 1<<18) + `""]}}`,
			"examples", "examples hold more than 262144 entries"},
		{"a million labels", "/v1/classify", `{"text": "hi", "labels": [` + strings.Repeat(`"a",`, 1_000_000) + `"a"]}`,
			"labels", "labels must have 1 to 200 entries, got 1000001"},
		{"a text 7 times the limit", "/v1/classify", `{"text": "` + strings.Repeat("a", 7<<16) + `", "labels": ["a"]}`,
			"text", "text is longer than plugins.max_text_bytes (65536 bytes): its JSON string takes 458752 bytes"},
		{"a source 7 times the limit", "/v1/match", `{"source": "` + strings.Repeat("a", 7<<16) + `", "query": "q"}`,
			"source", "source is longer than plugins.max_text_bytes (65536 bytes)"},
		// The first problem is the answer: the checks no longer go on to
		// word the 200 others.
		{"a key that is not a label, of 200", "/v1/classify", `{"text": "hi", "labels": ["a"], "examples": {` + strings.Join(keys[:200], ",") + `}}`,
			"examples.k0", `examples has a key "k0" that is not a label`},
		// A name is quoted cut, not whole: its 400 was as long as the body.
		{"a model name of a megabyte", "/v1/classify", `{"text": "hi", "labels": ["a", "b"], "model": "` + strings.Repeat("m", 1<<20) + `"}`,
			"model", `model "` + strings.Repeat("m", 200) + `…" does not exist`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var r reply
			if c.path == "/v1/match" { // no public mode
				r = h.keyed(c.path, c.body)
			} else {
				r = h.do(request{path: c.path, body: c.body})
			}
			e := r.apiError(t, 400, "invalid_request_error")
			if e["param"] != c.param || !strings.Contains(e["message"].(string), c.msg) || len(r.body) > 1000 {
				t.Errorf("param %v, message %.300q: want %q, %q", e["param"], e["message"], c.param, c.msg)
			}
		})
	}
	// Over what the endpoint's fields can hold, every byte escaped as
	// \u00XX, the body is not read at all: tag holds a text and 256 KiB
	// of tags.
	e := h.do(request{path: "/v1/tag", body: `{"text": "` + strings.Repeat("a", 2100_000) + `"}`}).apiError(t, 413, "request_too_large")
	if !strings.Contains(e["message"].(string), "/v1/tag takes: at most 2031616 bytes") || strings.Contains(e["message"].(string), "max_request_body") {
		t.Errorf("413 message %q", e["message"])
	}
	// Score has no label set: its 413 said it could hold one.
	e = h.keyed("/v1/score", `{"source": "`+strings.Repeat("a", 2100_000)+`", "attribute": "urgency"}`).apiError(t, 413, "request_too_large")
	if msg := e["message"].(string); strings.Contains(msg, "max_request_body") || !strings.Contains(msg, "/v1/score takes: at most 853168 bytes") {
		t.Errorf("score's 413 message %q", msg)
	}
	// The largest valid label set passes, escaped as Python's json.dumps
	// escapes it (ensure_ascii: 6 bytes a character of a non-Latin script).
	label := strings.Repeat(`\u4e00`, 300) // 900 bytes of UTF-8, 1800 of JSON
	labels := make([]string, 200)
	for i := range labels {
		labels[i] = fmt.Sprintf(`"%s%d"`, label, i)
	}
	h.keyed("/v1/tag", `{"text": "hi", "tags": [`+strings.Join(labels, ",")+`]}`).ok(t)
}
