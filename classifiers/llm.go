package classifiers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// ErrUnparseable means the model answered twice with something that is not
// the JSON it was asked for, or named a label outside the set. Retrying the
// same call rarely helps: use a stronger model or the lexical engine.
var ErrUnparseable = errors.New("model output is not the JSON asked for")

// EngineLLM is the Name of the model-backed engine.
const EngineLLM = "llm"

// PromptMarker starts the system prompt of every llm-engine call, followed
// by the task (classify, classify-multi, tag, score, match), so test
// upstreams (proxytest's ClassifierAnswers) recognise classifier calls.
const PromptMarker = "tollgate-classifier:"

// llm asks a catalog model through a ModelCaller.
type llm struct {
	caller ModelCaller
	model  string
}

// NewLLM returns the engine that prompts model (a catalog id) through
// caller, asking for JSON at temperature 0. Confidences come from token
// log-probabilities when the upstream returns them, otherwise from the
// probability the model states. An unparseable answer is retried once with
// a stricter reminder; a second one is an error wrapping ErrUnparseable.
// Results carry engine "llm", the model and the usage of every call made,
// also when an error is returned after a call, so the caller can bill it.
func NewLLM(caller ModelCaller, model string) Engine {
	return &llm{caller: caller, model: model}
}

func (e *llm) Name() string { return EngineLLM }

// chatRequest is the body sent to the model.
type chatRequest struct {
	Model          string        `json:"model"`
	Messages       []chatMessage `json:"messages"`
	Temperature    float64       `json:"temperature"`
	MaxTokens      int           `json:"max_tokens"`
	ResponseFormat struct {
		Type string `json:"type"`
	} `json:"response_format"`
	Logprobs    bool `json:"logprobs"`
	TopLogprobs int  `json:"top_logprobs"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// tokenLogprob is one token of the answer with its alternatives.
type tokenLogprob struct {
	Token       string  `json:"token"`
	Logprob     float64 `json:"logprob"`
	TopLogprobs []struct {
		Token   string  `json:"token"`
		Logprob float64 `json:"logprob"`
	} `json:"top_logprobs"`
}

// modelAnswer is the model's text and, when the upstream sent them, the
// log-probabilities of its tokens.
type modelAnswer struct {
	text     string
	logprobs []tokenLogprob
}

// ask sends system and user to the model and hands the answer to parse;
// when parse rejects it, it asks once more with the answer and a reminder
// of the format, and gives up after that. usage sums both calls.
func (e *llm) ask(ctx context.Context, system, user string, maxTokens int, usage *Usage, parse func(modelAnswer) error) error {
	req := chatRequest{
		Model: e.model,
		Messages: []chatMessage{
			{Role: "system", Content: system},
			{Role: "user", Content: user},
		},
		MaxTokens:   maxTokens,
		Logprobs:    true,
		TopLogprobs: 5,
	}
	req.ResponseFormat.Type = "json_object"
	var lastErr error
	var lastText string
	for attempt := 0; attempt < 2; attempt++ {
		if attempt == 1 {
			req.Messages = append(req.Messages,
				chatMessage{Role: "assistant", Content: lastText},
				chatMessage{Role: "user", Content: "That answer is not valid: " + lastErr.Error() +
					". Reply with the JSON object only, exactly in the format the instructions give, and nothing else."})
		}
		body, err := json.Marshal(req)
		if err != nil {
			return fmt.Errorf("encoding model request: %w", err)
		}
		raw, u, err := e.caller.CallModel(ctx, e.model, body)
		usage.PromptTokens += u.PromptTokens
		usage.CompletionTokens += u.CompletionTokens
		usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
		if err != nil {
			return fmt.Errorf("calling model %s: %w", e.model, err)
		}
		ans := readAnswer(raw)
		lastText = ans.text
		if lastErr = parse(ans); lastErr == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: %v; model %s answered %q", ErrUnparseable, lastErr, e.model, truncateText(lastText, 200))
}

func readAnswer(raw []byte) modelAnswer {
	choice := gjson.GetBytes(raw, "choices.0")
	ans := modelAnswer{text: choice.Get("message.content").String()}
	if lp := choice.Get("logprobs.content"); lp.IsArray() {
		_ = json.Unmarshal([]byte(lp.Raw), &ans.logprobs) // absent or odd logprobs only lose the refinement
	}
	return ans
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// jsonObject extracts the JSON object from a model's text, tolerating the
// code fences and prose some models wrap around it.
func jsonObject(text string) (string, error) {
	start := strings.IndexByte(text, '{')
	end := strings.LastIndexByte(text, '}')
	if start < 0 || end < start {
		return "", errors.New("no JSON object in the answer")
	}
	obj := text[start : end+1]
	if !json.Valid([]byte(obj)) {
		return "", errors.New("the JSON object is malformed")
	}
	return obj, nil
}

// writeLabels lists the labels with their descriptions and examples.
func writeLabels(b *strings.Builder, noun string, labels []string, descriptions map[string]string, examples map[string][]string) {
	list, _ := json.Marshal(labels) // strings always marshal
	fmt.Fprintf(b, "Allowed %s: %s\n", noun, list)
	for _, l := range labels {
		d := descriptions[l]
		ex := examples[l]
		if d == "" && len(ex) == 0 {
			continue
		}
		fmt.Fprintf(b, "- %s", l)
		if d != "" {
			fmt.Fprintf(b, ": %s", d)
		}
		for _, x := range ex {
			q, _ := json.Marshal(x)
			fmt.Fprintf(b, "\n  example: %s", q)
		}
		b.WriteByte('\n')
	}
}

func textTypeLine(t string) string {
	if t == "" {
		return ""
	}
	return "The text is a " + t + ".\n"
}

func (e *llm) Classify(ctx context.Context, req ClassifyRequest) (ClassifyResult, error) {
	res := ClassifyResult{Answer: Answer{Engine: EngineLLM, Model: e.model}}
	if len(req.Labels) == 0 {
		return res, ErrNoLabels
	}
	var b strings.Builder
	if req.Mode == ModeMulti {
		b.WriteString(PromptMarker + " classify-multi\n")
		b.WriteString("You are a text classifier. For every allowed label, judge whether it applies to the text the user sends.\n")
	} else {
		b.WriteString(PromptMarker + " classify\n")
		b.WriteString("You are a text classifier. Choose the one allowed label that fits the text the user sends best.\n")
	}
	b.WriteString(textTypeLine(req.TextType))
	writeLabels(&b, "labels", req.Labels, req.Descriptions, req.Examples)
	if req.Mode == ModeMulti {
		b.WriteString(`Answer with one JSON object and nothing else: {"labels": [{"label": "<allowed label>", "confidence": <probability from 0 to 1 that it applies>}, ...]} with every allowed label once, spelled exactly as given.`)
	} else {
		b.WriteString(`Answer with one JSON object and nothing else: {"label": "<one allowed label, spelled exactly as given>", "confidence": <probability from 0 to 1 that it is right>}.`)
	}
	canon := canonicalLabels(req.Labels)
	maxTokens := 80
	if req.Mode == ModeMulti {
		maxTokens = min(4096, 40+24*len(req.Labels))
	}
	err := e.ask(ctx, b.String(), req.Text, maxTokens, &res.Usage, func(ans modelAnswer) error {
		if req.Mode == ModeMulti {
			return parseMulti(ans, canon, req, &res)
		}
		return parseSingle(ans, canon, req.Labels, &res)
	})
	return res, err
}

// canonicalLabels maps the trimmed, lower-cased form of each label to the
// label, so "Billing " from a model finds "billing".
func canonicalLabels(labels []string) map[string]string {
	m := make(map[string]string, len(labels))
	for _, l := range labels {
		m[strings.ToLower(strings.TrimSpace(l))] = l
	}
	return m
}

func findLabel(c map[string]string, s string) (string, bool) {
	l, ok := c[strings.ToLower(strings.TrimSpace(s))]
	return l, ok
}

func parseSingle(ans modelAnswer, canon map[string]string, labels []string, res *ClassifyResult) error {
	obj, err := jsonObject(ans.text)
	if err != nil {
		return err
	}
	var out struct {
		Label      *string  `json:"label"`
		Confidence *float64 `json:"confidence"`
	}
	if err := json.Unmarshal([]byte(obj), &out); err != nil || out.Label == nil {
		return errors.New(`no "label" string in the JSON object`)
	}
	label, ok := findLabel(canon, *out.Label)
	if !ok {
		return fmt.Errorf("label %q is not one of the allowed labels", *out.Label)
	}
	dist := labelDistribution(ans, "label", label, labels)
	if dist == nil {
		if out.Confidence == nil || !isProbability(*out.Confidence) {
			return errors.New(`"confidence" must be a number from 0 to 1`)
		}
		// Without log-probabilities the model's stated probability is all
		// there is; the rest is spread evenly over the other labels.
		dist = make(map[string]float64, len(labels))
		dist[label] = *out.Confidence
		if len(labels) > 1 {
			for _, l := range labels {
				if l != label {
					dist[l] = (1 - *out.Confidence) / float64(len(labels)-1)
				}
			}
		}
	}
	res.Scores = make([]LabelScore, len(labels))
	for i, l := range labels {
		res.Scores[i] = LabelScore{Label: l, Confidence: round4(dist[l])}
	}
	sortScores(res.Scores)
	// The model's choice is the answer even if rounding ties it.
	res.Label, res.Confidence = label, round4(dist[label])
	return nil
}

func isProbability(x float64) bool { return x >= 0 && x <= 1 && !math.IsNaN(x) }

func parseMulti(ans modelAnswer, canon map[string]string, req ClassifyRequest, res *ClassifyResult) error {
	obj, err := jsonObject(ans.text)
	if err != nil {
		return err
	}
	var out struct {
		Labels []struct {
			Label      string   `json:"label"`
			Confidence *float64 `json:"confidence"`
		} `json:"labels"`
	}
	if err := json.Unmarshal([]byte(obj), &out); err != nil || out.Labels == nil {
		return errors.New(`no "labels" array of {"label", "confidence"} in the JSON object`)
	}
	conf := make(map[string]float64, len(req.Labels))
	for _, l := range out.Labels {
		label, ok := findLabel(canon, l.Label)
		if !ok {
			return fmt.Errorf("label %q is not one of the allowed labels", l.Label)
		}
		if l.Confidence == nil || !isProbability(*l.Confidence) {
			return fmt.Errorf(`"confidence" of %q must be a number from 0 to 1`, l.Label)
		}
		conf[label] = *l.Confidence
	}
	res.Scores = make([]LabelScore, len(req.Labels))
	for i, l := range req.Labels {
		res.Scores[i] = LabelScore{Label: l, Confidence: round4(conf[l])}
	}
	sortScores(res.Scores)
	res.Labels = nil
	for _, s := range res.Scores {
		if s.Confidence >= req.Threshold {
			res.Labels = append(res.Labels, s)
		}
	}
	return nil
}

// valueToken finds the token in which the string or number value of key
// starts, and how many bytes of that token come before the value. The
// tokens must spell the answer's text; ok is false when they do not or
// the key is missing.
func valueToken(ans modelAnswer, key string) (index, offset int, ok bool) {
	var joined strings.Builder
	for _, t := range ans.logprobs {
		joined.WriteString(t.Token)
	}
	text := joined.String()
	if text != ans.text {
		return 0, 0, false
	}
	k := strings.Index(text, `"`+key+`"`)
	if k < 0 {
		return 0, 0, false
	}
	pos := k + len(key) + 2
	for pos < len(text) && (text[pos] == ' ' || text[pos] == ':' || text[pos] == '\n' || text[pos] == '\t') {
		pos++
	}
	if pos < len(text) && text[pos] == '"' {
		pos++
	}
	start := 0
	for i, t := range ans.logprobs {
		end := start + len(t.Token)
		if pos >= start && pos < end {
			return i, pos - start, true
		}
		start = end
	}
	return 0, 0, false
}

// labelDistribution turns the log-probabilities of the first token of the
// chosen label into a distribution over the labels: the chosen token counts
// for the chosen label (its later tokens decided between labels that begin
// alike), every other alternative the model weighed at that position for
// the labels it can begin, split evenly when it begins several, and the
// masses are renormalised over the alternatives that begin some label.
// The later tokens' probabilities are not consulted. It is nil when the
// answer has no usable log-probabilities.
func labelDistribution(ans modelAnswer, key, chosen string, labels []string) map[string]float64 {
	if len(ans.logprobs) == 0 {
		return nil
	}
	idx, offset, ok := valueToken(ans, key)
	if !ok {
		return nil
	}
	tok := ans.logprobs[idx]
	prefix := tok.Token[:offset]
	alts := tok.TopLogprobs
	type alt struct {
		token string
		p     float64
	}
	list := make([]alt, 0, len(alts)+1)
	sawChosen := false
	for _, a := range alts {
		list = append(list, alt{a.Token, math.Exp(a.Logprob)})
		sawChosen = sawChosen || a.Token == tok.Token
	}
	if !sawChosen {
		list = append(list, alt{tok.Token, math.Exp(tok.Logprob)})
	}
	dist := make(map[string]float64, len(labels))
	var total float64
	for _, a := range list {
		if !strings.HasPrefix(a.token, prefix) {
			continue
		}
		rest := a.token[len(prefix):]
		if a.token == tok.Token {
			dist[chosen] += a.p
			total += a.p
			continue
		}
		var begins []string
		for _, l := range labels {
			if labelBegins(l, rest) {
				begins = append(begins, l)
			}
		}
		for _, l := range begins {
			dist[l] += a.p / float64(len(begins))
		}
		if len(begins) > 0 {
			total += a.p
		}
	}
	if total == 0 {
		return nil
	}
	for l := range dist {
		dist[l] /= total
	}
	return dist
}

// labelBegins says whether a token that starts a JSON string value can be
// the start of label: the token is a prefix of the label, or the whole
// label followed by its closing quote.
func labelBegins(label, token string) bool {
	if token == "" {
		return false
	}
	if q := strings.IndexByte(token, '"'); q >= 0 {
		return strings.EqualFold(token[:q], label)
	}
	return len(token) <= len(label) && strings.EqualFold(label[:len(token)], token)
}

// digitScore reads a 0-9 rating: with log-probabilities, the expected
// digit over the alternatives that are digits (a common way to get a
// graded score from a model); otherwise the stated number. It returns a
// score in [0,1].
func digitScore(ans modelAnswer, key string) (float64, error) {
	obj, err := jsonObject(ans.text)
	if err != nil {
		return 0, err
	}
	v := gjson.Get(obj, key)
	if v.Type != gjson.Number {
		return 0, fmt.Errorf(`no %q number in the JSON object`, key)
	}
	stated := v.Float()
	if stated < 0 || stated > 9 {
		return 0, fmt.Errorf("%q is %v, outside 0 to 9", key, stated)
	}
	if idx, offset, ok := valueToken(ans, key); ok && offset == 0 && isDigitToken(ans.logprobs[idx].Token) && stated == math.Trunc(stated) {
		tok := ans.logprobs[idx]
		var sum, mass float64
		seen := false
		for _, a := range tok.TopLogprobs {
			if isDigitToken(a.Token) {
				p := math.Exp(a.Logprob)
				sum += p * float64(a.Token[0]-'0')
				mass += p
				seen = seen || a.Token == tok.Token
			}
		}
		if !seen {
			p := math.Exp(tok.Logprob)
			sum += p * float64(tok.Token[0]-'0')
			mass += p
		}
		if mass > 0 {
			return round4(sum / mass / 9), nil
		}
	}
	return round4(stated / 9), nil
}

func isDigitToken(t string) bool { return len(t) == 1 && t[0] >= '0' && t[0] <= '9' }

func (e *llm) Score(ctx context.Context, req ScoreRequest) (ScoreResult, error) {
	res := ScoreResult{Answer: Answer{Engine: EngineLLM, Model: e.model}}
	var b strings.Builder
	b.WriteString(PromptMarker + " score\n")
	b.WriteString("You rate the text the user sends on one attribute.\n")
	b.WriteString("Attribute: " + strconv.Quote(req.Attribute) + "\n")
	if req.Description != "" {
		b.WriteString("Meaning: " + req.Description + "\n")
	} else if d := commonAttributeMeaning[strings.ToLower(req.Attribute)]; d != "" {
		b.WriteString("Meaning: " + d + "\n")
	}
	b.WriteString(`Rate from 0 (not at all) to 9 (extremely). Answer with one JSON object and nothing else: {"score": <one digit 0-9>}.`)
	err := e.ask(ctx, b.String(), req.Source, 12, &res.Usage, func(ans modelAnswer) error {
		s, err := digitScore(ans, "score")
		res.Score = s
		return err
	})
	return res, err
}

// commonAttributeMeaning spells out the common attributes of /v1/score.
var commonAttributeMeaning = map[string]string{
	"urgency":   "how urgently the writer needs action or an answer",
	"toxicity":  "how toxic, insulting, hateful or offensive the text is",
	"sentiment": "how positive the feeling of the text is (0 very negative, 9 very positive)",
	"formality": "how formal the language is (0 casual chat, 9 formal letter)",
	"quality":   "how well written, clear and informative the text is",
	"spam":      "how likely the text is spam: unsolicited, promotional or fraudulent",
}

func (e *llm) Match(ctx context.Context, req MatchRequest) (ScoreResult, error) {
	res := ScoreResult{Answer: Answer{Engine: EngineLLM, Model: e.model}}
	system := PromptMarker + " match\n" +
		"You judge how relevant a document is to a search query: does it answer or address the query?\n" +
		"Query: " + strconv.Quote(req.Query) + "\n" +
		`The user sends the document. Rate its relevance from 0 (unrelated) to 9 (answers the query fully). Answer with one JSON object and nothing else: {"relevance": <one digit 0-9>}.`
	err := e.ask(ctx, system, req.Source, 12, &res.Usage, func(ans modelAnswer) error {
		s, err := digitScore(ans, "relevance")
		res.Score = s
		return err
	})
	return res, err
}

func (e *llm) Tag(ctx context.Context, req TagRequest) (TagResult, error) {
	res := TagResult{Answer: Answer{Engine: EngineLLM, Model: e.model}}
	maxTags := req.MaxTags
	if maxTags <= 0 {
		maxTags = 5
	}
	threshold := req.Threshold
	if threshold == 0 && len(req.Tags) > 0 {
		threshold = 0.5
	}
	var b strings.Builder
	b.WriteString(PromptMarker + " tag\n")
	if len(req.Tags) > 0 {
		b.WriteString("You tag the text the user sends with the allowed tags that apply.\n")
		writeLabels(&b, "tags", req.Tags, nil, nil)
		fmt.Fprintf(&b, "Give at most %d tags, spelled exactly as given, each with the probability from 0 to 1 that it applies. ", maxTags)
	} else {
		fmt.Fprintf(&b, "You tag the text the user sends with at most %d short topical tags (one or two lowercase words each), each with the probability from 0 to 1 that it fits. ", maxTags)
	}
	b.WriteString(`Answer with one JSON object and nothing else: {"tags": [{"tag": "<tag>", "confidence": <0 to 1>}, ...]}.`)
	canon := canonicalLabels(req.Tags)
	err := e.ask(ctx, b.String(), req.Text, min(4096, 40+24*maxTags), &res.Usage, func(ans modelAnswer) error {
		obj, err := jsonObject(ans.text)
		if err != nil {
			return err
		}
		var out struct {
			Tags []struct {
				Tag        string   `json:"tag"`
				Confidence *float64 `json:"confidence"`
			} `json:"tags"`
		}
		if err := json.Unmarshal([]byte(obj), &out); err != nil || out.Tags == nil {
			return errors.New(`no "tags" array of {"tag", "confidence"} in the JSON object`)
		}
		tags := []LabelScore{}
		seen := map[string]bool{}
		for _, t := range out.Tags {
			name := strings.TrimSpace(t.Tag)
			if len(req.Tags) > 0 {
				c, ok := findLabel(canon, name)
				if !ok {
					return fmt.Errorf("tag %q is not one of the allowed tags", t.Tag)
				}
				name = c
			}
			if t.Confidence == nil || !isProbability(*t.Confidence) {
				return fmt.Errorf(`"confidence" of %q must be a number from 0 to 1`, t.Tag)
			}
			if name == "" || seen[name] || *t.Confidence < threshold {
				continue
			}
			seen[name] = true
			tags = append(tags, LabelScore{Label: name, Confidence: round4(*t.Confidence)})
		}
		sortScores(tags)
		if len(tags) > maxTags {
			tags = tags[:maxTags]
		}
		res.Tags = tags
		return nil
	})
	return res, err
}
