package classifiers

import (
	"context"
	"encoding/json"
	"math"

	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// ViewModel answers the llm engine's prompts the way a model would, but
// from another engine's view: it reads the task, labels and text back from
// the prompt, asks its view engine, and writes the answer the llm engine
// asked for with log-probabilities that say what the view said. The demo
// upstream (cmd/tollgate-upstream) runs one over the offline engine, so
// that the quick start gives sensible answers through the whole llm path,
// and tests check the llm engine against the view's own answers.
//
// Numbers are one token each (as in cl100k or Llama 3) and yes, no and
// digits carry the view's probabilities: a single-mode answer is the
// view's label with the top_logprobs most probable labels as
// alternatives; multi mode and closed tags answer yes when the view's
// confidence is at least 0.5, with P(yes) the confidence (0 for a label
// the view has no evidence for, which it never answers); scores and
// relevance put their mass on the two digits around 9·score, so the
// expected digit is the view's score.
type ViewModel struct{ view Engine }

// NewViewModel returns a model that answers from view's point of view.
func NewViewModel(view Engine) *ViewModel { return &ViewModel{view: view} }

// Reply answers a chat request body whose system prompt is one of the llm
// engine's, in the shape of proxytest.Options.Reply: the answer's text and
// its logprobs.content array. It declines (ok false) other requests.
func (m *ViewModel) Reply(request []byte) (content string, logprobs []byte, ok bool) {
	var system, user string
	for _, msg := range gjson.GetBytes(request, "messages").Array() {
		switch msg.Get("role").String() {
		case "system":
			if system == "" {
				system = msg.Get("content").String()
			}
		case "user":
			if user == "" {
				user = msg.Get("content").String()
			}
		}
	}
	rest, found := strings.CutPrefix(system, PromptMarker+" ")
	if !found {
		return "", nil, false
	}
	task, _, _ := strings.Cut(rest, "\n")
	top := int(gjson.GetBytes(request, "top_logprobs").Int())
	var toks []viewToken
	switch task {
	case "classify":
		toks = m.single(system, user)
	case "classify-multi", "tag":
		toks = m.yesNo(system, user, task == "tag")
	case "tag-open":
		toks = m.openTags(system, user)
	case "score":
		attr, meaning := quotedLine(system, "Attribute: "), lineAfter(system, "Meaning: ")
		if strings.EqualFold(meaning, commonAttributeMeaning[strings.ToLower(attr)]) {
			meaning = "" // the engine's own words, not the caller's
		}
		r, err := m.view.Score(context.Background(), ScoreRequest{Source: user, Attribute: attr, Description: meaning})
		toks = digitTokens(r.Score, err)
	case "match":
		r, err := m.view.Match(context.Background(), MatchRequest{Source: user, Query: quotedLine(system, "Query: ")})
		toks = digitTokens(r.Score, err)
	default:
		return "", nil, false
	}
	return renderView(toks, top)
}

// viewToken is one token of a ViewModel answer and its alternatives,
// most probable first; the token is alts[0] unless alts is empty (sure).
type viewToken struct {
	text string
	alts []altProb
}

func renderView(toks []viewToken, top int) (string, []byte, bool) {
	var text strings.Builder
	b := []byte{'['}
	for i, t := range toks {
		text.WriteString(t.text)
		if i > 0 {
			b = append(b, ',')
		}
		alts := t.alts
		if len(alts) == 0 {
			alts = []altProb{{t.text, -1e-4}}
		}
		lp := alts[0].Logprob
		for _, a := range alts {
			if a.Token == t.text {
				lp = a.Logprob
			}
		}
		alts = alts[:min(len(alts), max(top, 0))]
		e, _ := json.Marshal(tokenLogprob{Token: t.text, Logprob: lp, TopLogprobs: alts}) // plain data always marshals
		b = append(b, e...)
	}
	return text.String(), append(b, ']'), true
}

func logOf(p float64) float64 { return math.Log(min(max(p, 1e-6), 1)) }

// single answers with the view's label's number; the alternatives are
// every label the view gives any weight, most probable first.
func (m *ViewModel) single(system, text string) []viewToken {
	req := parseNumbered(system)
	req.Text, req.Mode = text, ModeSingle
	r, err := m.view.Classify(context.Background(), req)
	if err != nil || len(req.Labels) == 0 {
		return []viewToken{{text: "none"}}
	}
	codes := labelCodes(len(req.Labels))
	code := make(map[string]string, len(codes))
	for i, l := range req.Labels {
		code[l] = codes[i]
	}
	scores := append([]LabelScore(nil), r.Scores...)
	sortScoresByLabel(scores)
	var alts []altProb
	for _, s := range scores {
		if s.Confidence > 0 || s.Label == r.Label {
			alts = append(alts, altProb{code[s.Label], logOf(s.Confidence)})
		}
	}
	// The view's label leads even when it shares its confidence.
	for i, a := range alts {
		if a.Token == code[r.Label] {
			alts[0], alts[i] = alts[i], alts[0]
		}
	}

	return []viewToken{{text: code[r.Label], alts: alts}}
}

// yesNo answers "CODE: yes" lines with P(yes) the view's multi-mode
// confidence, or 0 for a label the view has no evidence for; tags are
// labels without descriptions, as the lexical engine tags.
func (m *ViewModel) yesNo(system, text string, tags bool) []viewToken {
	req := parseNumbered(system)
	req.Text, req.Mode = text, ModeMulti
	if tags {
		req.Descriptions, req.Examples = nil, nil
	}
	r, err := m.view.Classify(context.Background(), req)
	if err != nil {
		return []viewToken{{text: "none"}}
	}
	// The view was asked at threshold 0, so its Labels are the labels it
	// has evidence for. Another label's confidence is the floor every
	// such label gets, which as P(yes) read as a measurement: at
	// threshold 0 the llm engine answered every label where the view
	// answers none. The model says no to it, surely.
	conf := make(map[string]float64, len(r.Labels))
	for _, s := range r.Labels {
		conf[s.Label] = s.Confidence
	}
	codes := labelCodes(len(req.Labels))
	var toks []viewToken
	for i, l := range req.Labels {
		c := conf[l]
		yes, no := altProb{" yes", logOf(c)}, altProb{" no", logOf(1 - c)}
		if c < 0.5 {
			yes, no = no, yes
		}
		toks = append(toks, viewToken{text: codes[i]}, viewToken{text: ":"}, viewToken{text: yes.Token, alts: []altProb{yes, no}}, viewToken{text: "\n"})
	}
	return toks
}

// openTags answers the view's open tags one a line, each first word with
// the view's confidence as its probability.
func (m *ViewModel) openTags(system, text string) []viewToken {
	n := 5
	if i := strings.Index(system, "at most "); i >= 0 {
		f := strings.Fields(system[i+len("at most "):])
		if len(f) > 0 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				n = v
			}
		}
	}
	r, err := m.view.Tag(context.Background(), TagRequest{Text: text, MaxTags: n})
	if err != nil || len(r.Tags) == 0 {
		return []viewToken{{text: "none"}}
	}
	var toks []viewToken
	for i, t := range r.Tags {
		if i > 0 {
			toks = append(toks, viewToken{text: "\n"})
		}
		words := strings.SplitAfter(t.Label, " ")
		toks = append(toks, viewToken{text: words[0], alts: []altProb{{words[0], logOf(t.Confidence)}}})
		for _, w := range words[1:] {
			toks = append(toks, viewToken{text: w})
		}
	}
	return toks
}

// digitTokens answers a score s in [0,1] as the digit nearest 9s, with
// the two digits around 9s weighted so that the expected digit is 9s.
func digitTokens(s float64, err error) []viewToken {
	if err != nil {
		return []viewToken{{text: "none"}}
	}
	x := 9 * min(max(s, 0), 1)
	lo := math.Floor(x)
	frac := x - lo
	if lo == 9 {
		return []viewToken{{text: "9"}}
	}
	a := altProb{strconv.Itoa(int(lo)), logOf(1 - frac)}
	b := altProb{strconv.Itoa(int(lo) + 1), logOf(frac)}
	alts := []altProb{a, b}
	if frac == 0 {
		alts = alts[:1]
	} else if frac > 0.5 {
		alts[0], alts[1] = b, a
	}
	return []viewToken{{text: alts[0].Token, alts: alts}}
}

// parseNumbered reads back what writeNumbered wrote: labels with their
// descriptions and examples, and the text type line.
func parseNumbered(system string) ClassifyRequest {
	var req ClassifyRequest
	var last string
	for _, line := range strings.Split(system, "\n") {
		if ex, ok := strings.CutPrefix(line, "   example: "); ok && last != "" {
			var x string
			if json.Unmarshal([]byte(ex), &x) == nil {
				if req.Examples == nil {
					req.Examples = map[string][]string{}
				}
				req.Examples[last] = append(req.Examples[last], x)
			}
			continue
		}
		if t, ok := strings.CutPrefix(line, "The text is a "); ok {
			req.TextType = strings.TrimSuffix(t, ".")
			continue
		}
		d, after := leadingDigits(line, "")
		rest, ok := strings.CutPrefix(after, ". ")
		if d == "" || !ok || !strings.HasPrefix(rest, `"`) {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(rest))
		var label string
		if dec.Decode(&label) != nil {
			continue
		}
		req.Labels, last = append(req.Labels, label), label
		if desc, ok := strings.CutPrefix(rest[dec.InputOffset():], ": "); ok {
			if req.Descriptions == nil {
				req.Descriptions = map[string]string{}
			}
			req.Descriptions[label] = desc
		}
	}
	return req
}

// lineAfter is the rest of the first line that starts with prefix.
func lineAfter(system, prefix string) string {
	for _, line := range strings.Split(system, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return v
		}
	}
	return ""
}

// quotedLine is the JSON string on the line that starts with prefix.
func quotedLine(system, prefix string) string {
	var s string
	_ = json.Unmarshal([]byte(lineAfter(system, prefix)), &s) // unquoted reads as ""
	return s
}
