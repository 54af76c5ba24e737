package proxytest

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// classifierMarker starts the system prompt of the classifiers package's
// llm engine (classifiers.PromptMarker; not imported, so that proxytest
// stays free of the packages it tests). The task follows it.
const classifierMarker = "tollgate-classifier:"

// A classifier answer is built from pieces; a piece with alternatives is
// the token whose top_logprobs carry the model's hesitation, the others
// are near-certain.
type piece struct {
	text    string
	logprob float64
	alts    []alt // empty: the piece is its own only alternative
}

type alt struct {
	token   string
	logprob float64
}

// Probabilities of the fake model's answers; tests compute the expected
// confidences from them.
const (
	chosenLabelProb = 0.8 // the chosen label's first token; the others share the rest
	certainLogprob  = -1e-4
)

// digitAlts are the alternatives of the 0-9 rating the fake model gives:
// 6 with 0.5, 7 with 0.3, 5 with 0.2 (expected value 6.1).
var digitAlts = []alt{{"6", math.Log(0.5)}, {"7", math.Log(0.3)}, {"5", math.Log(0.2)}}

// classifierAnswer answers a classifier prompt the way a model would,
// deterministically, or reports false when the request is not one.
func (s *Server) classifierAnswer(js string, st *rendered, v *values) ([]byte, bool) {
	if gjson.Get(js, "response_format.type").String() != "json_object" {
		return nil, false
	}
	var system, user string
	for _, m := range gjson.Get(js, "messages").Array() {
		switch m.Get("role").String() {
		case "system":
			if system == "" {
				system = m.Get("content").String()
			}
		case "user":
			if user == "" {
				user = m.Get("content").String()
			}
		}
	}
	i := strings.Index(system, classifierMarker)
	if i < 0 {
		return nil, false
	}
	task, _, _ := strings.Cut(strings.TrimSpace(system[i+len(classifierMarker):]), "\n")
	task = strings.TrimSpace(task)

	var pieces []piece
	served := st.classifierServed.Add(1)
	if served <= int64(st.opts.BadJSONTimes) {
		pieces = plain(nil, "Sure! The text looks fine to me.")
	} else {
		pieces = answerPieces(task, system, user)
	}
	withLogprobs := gjson.Get(js, "logprobs").Type == gjson.True && !st.opts.NoLogprobs
	top := int(gjson.Get(js, "top_logprobs").Int())
	return renderClassifierBody(st.opts, v, pieces, withLogprobs, top), true
}

// answerPieces builds the JSON answer of task for text:
//   - classify: {"label": L, "confidence": 0.9}, L the first allowed label
//     found in the text (case-insensitive), else the first allowed label;
//   - classify-multi: every label, 0.9 when found in the text, else 0.1;
//   - tag: allowed tags found in the text (0.9), else the first (0.6); open
//     tags: the text's first three words of four letters or more (0.8);
//   - score, match: {"score": 6} or {"relevance": 6}.
func answerPieces(task, system, text string) []piece {
	lower := strings.ToLower(text)
	var p []piece
	switch task {
	case "classify":
		labels := allowed(system, "labels")
		if len(labels) == 0 {
			return plain(nil, `{"error": "no allowed labels in the prompt"}`)
		}
		chosen := labels[0]
		for _, l := range labels {
			if strings.Contains(lower, strings.ToLower(l)) {
				chosen = l
				break
			}
		}
		p = plain(p, `{"label": "`)
		p = labelPieces(p, chosen, labels)
		p = plain(p, `", "confidence": 0.9}`)
	case "classify-multi":
		labels := allowed(system, "labels")
		p = plain(p, `{"labels": [`)
		for i, l := range labels {
			c := "0.1"
			if strings.Contains(lower, strings.ToLower(l)) {
				c = "0.9"
			}
			if i > 0 {
				p = plain(p, ", ")
			}
			p = plain(p, `{"label": `+quote(l)+`, "confidence": `+c+`}`)
		}
		p = plain(p, `]}`)
	case "tag":
		tags := allowed(system, "tags")
		type tagged struct{ tag, conf string }
		var out []tagged
		if len(tags) > 0 {
			for _, t := range tags {
				if strings.Contains(lower, strings.ToLower(t)) {
					out = append(out, tagged{t, "0.9"})
				}
			}
			if len(out) == 0 {
				out = append(out, tagged{tags[0], "0.6"})
			}
		} else {
			for _, w := range strings.FieldsFunc(lower, func(r rune) bool { return !unicode.IsLetter(r) }) {
				if utf8.RuneCountInString(w) >= 4 && len(out) < 3 {
					out = append(out, tagged{w, "0.8"})
				}
			}
		}
		p = plain(p, `{"tags": [`)
		for i, t := range out {
			if i > 0 {
				p = plain(p, ", ")
			}
			p = plain(p, `{"tag": `+quote(t.tag)+`, "confidence": `+t.conf+`}`)
		}
		p = plain(p, `]}`)
	case "score", "match":
		key := "score"
		if task == "match" {
			key = "relevance"
		}
		p = plain(p, `{"`+key+`": `)
		p = append(p, piece{text: "6", logprob: digitAlts[0].logprob, alts: digitAlts})
		p = plain(p, `}`)
	default:
		p = plain(p, `{"error": "unknown classifier task"}`)
	}
	return p
}

// allowed reads the JSON array on the prompt line "Allowed <noun>: [...]".
func allowed(system, noun string) []string {
	prefix := "Allowed " + noun + ": "
	i := strings.Index(system, prefix)
	if i < 0 {
		return nil
	}
	line, _, _ := strings.Cut(system[i+len(prefix):], "\n")
	var out []string
	_ = json.Unmarshal([]byte(line), &out) // a malformed list reads as none
	return out
}

// labelPieces adds the tokens of chosen; its first token carries the
// alternatives: the first tokens of the other labels share what chosen's
// does not have.
func labelPieces(p []piece, chosen string, labels []string) []piece {
	toks := splitTokens(chosen)
	first := toks[0]
	var others []string
	seen := map[string]bool{first: true}
	for _, l := range labels {
		if t := splitTokens(l)[0]; !seen[t] {
			seen[t] = true
			others = append(others, t)
		}
	}
	alts := []alt{{first, math.Log(chosenLabelProb)}}
	for _, o := range others {
		alts = append(alts, alt{o, math.Log((1 - chosenLabelProb) / float64(len(others)))})
	}
	if len(others) == 0 {
		alts[0].logprob = certainLogprob
	}
	p = append(p, piece{text: first, logprob: alts[0].logprob, alts: alts})
	for _, t := range toks[1:] {
		p = append(p, piece{text: t, logprob: certainLogprob})
	}
	return p
}

func plain(p []piece, s string) []piece {
	for _, t := range splitTokens(s) {
		p = append(p, piece{text: t, logprob: certainLogprob})
	}
	return p
}

// splitTokens cuts s the way BPE vocabularies roughly do: runs of letters,
// single digits, and runs of anything else.
func splitTokens(s string) []string {
	var out []string
	start := 0
	kind := func(r rune) int {
		switch {
		case unicode.IsLetter(r):
			return 1
		case unicode.IsDigit(r):
			return 2
		}
		return 3
	}
	prev := 0
	for i, r := range s {
		k := kind(r)
		if i > start && (k != prev || k == 2) {
			out = append(out, s[start:i])
			start = i
		}
		prev = k
	}
	if start < len(s) || len(out) == 0 {
		out = append(out, s[start:])
	}
	return out
}

func quote(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

func renderClassifierBody(o Options, v *values, pieces []piece, withLogprobs bool, top int) []byte {
	var content strings.Builder
	for _, p := range pieces {
		content.WriteString(p.text)
	}
	b := make([]byte, 0, 512+len(pieces)*96)
	b = append(b, `{"id":"`...)
	b = append(b, v.id...)
	b = append(b, `","object":"chat.completion","created":`...)
	b = append(b, v.created...)
	b = append(b, `,"model":`...)
	b = append(b, v.model...)
	b = append(b, `,"system_fingerprint":null,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
	b = append(b, quote(content.String())...)
	b = append(b, `,"refusal":null},"logprobs":`...)
	if withLogprobs {
		b = append(b, `{"content":[`...)
		for i, p := range pieces {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendTokenLogprob(b, p.text, p.logprob)
			b = b[:len(b)-1] // reopen the object for top_logprobs
			b = append(b, `,"top_logprobs":[`...)
			alts := p.alts
			if len(alts) == 0 {
				alts = []alt{{p.text, p.logprob}}
			}
			for j, a := range alts[:min(len(alts), top)] {
				if j > 0 {
					b = append(b, ',')
				}
				b = appendTokenLogprob(b, a.token, a.logprob)
			}
			b = append(b, "]}"...)
		}
		b = append(b, `],"refusal":null}`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"finish_reason":"stop"}]`...)
	if !o.OmitUsage {
		b = append(b, `,"usage":`...)
		b = append(b, chatUsage(o)...)
	}
	return append(b, '}')
}

// appendTokenLogprob writes {"token":…,"logprob":…,"bytes":[…]}.
func appendTokenLogprob(b []byte, token string, logprob float64) []byte {
	b = append(b, `{"token":`...)
	b = append(b, quote(token)...)
	b = append(b, `,"logprob":`...)
	b = strconv.AppendFloat(b, logprob, 'g', -1, 64)
	b = append(b, `,"bytes":[`...)
	for i := 0; i < len(token); i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(token[i]), 10)
	}
	return append(b, "]}"...)
}
