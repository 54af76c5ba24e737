package classifiers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/tidwall/gjson"

	"github.com/tollgate/tollgate/internal/utf8cut"
)

// ErrUnparseable means the model answered twice with something that is not
// the answer it was asked for (a label number, yes/no lines, a digit), or
// named a number outside the list. Retrying the same call rarely helps:
// use a stronger model or the lexical engine.
var ErrUnparseable = errors.New("model output is not the answer asked for")

// EngineLLM is the Name of the model-backed engine.
const EngineLLM = "llm"

// PromptMarker starts the system prompt of every llm-engine call, followed
// by the task (classify, classify-multi, tag, tag-open, score, match), so
// fake upstreams (ViewModel) recognise classifier calls.
const PromptMarker = "tollgate-classifier:"

// TopLogprobs is how many alternatives per answer token the engine asks
// for: OpenAI's cap (vLLM allows more, LLMOptions.TopLogprobs asks it).
const TopLogprobs = 20

// LLMTemperature divides the label log-probabilities of single mode before
// they are normalised (p ∝ p_model^(1/T)), the usual one-parameter
// calibration of a classifier's confidences.
//
// It is 1 (the model's own probabilities) because it has not been fitted
// on a real model yet: none was at hand when the engine was written, and
// fitting it on the demo upstream would calibrate the lexical engine that
// answers there, not a model. To fit it, run `make eval` with
// TOLLGATE_EVAL_LLM_URL (and _KEY, _MODEL) set: FitTemperature's choice on
// the dev part's classify items is printed; write it here with the model,
// the date and the NLL before and after.
const LLMTemperature = 1.0

// LLMOptions tune the llm engine; the zero value is the default.
type LLMOptions struct {
	// Temperature: 0 means LLMTemperature.
	Temperature float64
	// TopLogprobs: 0 means TopLogprobs.
	TopLogprobs int
	// NoLogprobs asks for none: the model is known to refuse them, so
	// asking would cost a refused call each time.
	NoLogprobs bool
	// LogprobsRefused, when set, is told when the model refuses logprobs
	// (before the call is repeated without them), so the caller can set
	// NoLogprobs for the engines it makes next.
	LogprobsRefused func()
}

// llm asks a catalog model through a ModelCaller.
type llm struct {
	caller ModelCaller
	model  string
	temp   float64
	top    int
	// noLogprobs is set once the model refused them: an engine that
	// serves many calls (a batch job's lines, an eval run) asks without
	// them from then on, not twice per call.
	noLogprobs atomic.Bool
	refused    func() // nil: nobody to tell
}

// NewLLM returns the engine that prompts model (a catalog id) through
// caller at temperature 0, with the default LLMOptions.
//
// Every answer is one a model gives in few tokens whose log-probabilities
// are the confidence: a label's number (single mode), a yes or no per
// label (multi mode, closed tags), a digit 0-9 (score, match). Upstreams
// that return no log-probabilities still get the model's answer, but
// results then say NoLogprobs and carry no confidence the model did not
// give (see the Classify, Tag and Score methods). An unparseable answer is
// retried once with a stricter reminder; a second one is an error wrapping
// ErrUnparseable. Results carry engine "llm", the model and the usage of
// every call made, also when an error is returned after a call, so the
// caller can bill it.
func NewLLM(caller ModelCaller, model string) Engine {
	return NewLLMWith(caller, model, LLMOptions{})
}

// NewLLMWith is NewLLM with options.
func NewLLMWith(caller ModelCaller, model string, o LLMOptions) Engine {
	e := &llm{caller: caller, model: model, temp: o.Temperature, top: o.TopLogprobs, refused: o.LogprobsRefused}
	e.noLogprobs.Store(o.NoLogprobs)
	if e.temp <= 0 {
		e.temp = LLMTemperature
	}
	if e.top <= 0 {
		e.top = TopLogprobs
	}
	return e
}

func (e *llm) Name() string { return EngineLLM }

// chatRequest is the body sent to the model. There is no response_format:
// the answers are bare numbers and words, which every model can give.
type chatRequest struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	Temperature float64       `json:"temperature"`
	MaxTokens   int           `json:"max_tokens"`
	Logprobs    bool          `json:"logprobs,omitempty"`
	TopLogprobs int           `json:"top_logprobs,omitempty"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// tokenLogprob is one token of the answer with its alternatives.
type tokenLogprob struct {
	Token       string    `json:"token"`
	Logprob     float64   `json:"logprob"`
	TopLogprobs []altProb `json:"top_logprobs"`
}

type altProb struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
}

// modelAnswer is the model's text and, when the upstream sent them and
// they spell the text, the log-probabilities of its tokens.
type modelAnswer struct {
	text     string
	logprobs []tokenLogprob
}

// ask sends system and user to the model and hands the answer to parse;
// when parse rejects it, it asks once more with the answer and a reminder
// of the format, and gives up after that. usage sums both calls.
func (e *llm) ask(ctx context.Context, system, user, format string, maxTokens int, usage *Usage, parse func(modelAnswer) error) error {
	req := chatRequest{
		Model: e.model,
		Messages: []chatMessage{
			{Role: "system", Content: system},
			{Role: "user", Content: user},
		},
		MaxTokens: maxTokens,
	}
	if !e.noLogprobs.Load() {
		req.Logprobs, req.TopLogprobs = true, e.top
	}
	var lastErr error
	var lastText string
	for attempt := 0; attempt < 2; attempt++ {
		if attempt == 1 {
			req.Messages = append(req.Messages,
				chatMessage{Role: "assistant", Content: lastText},
				chatMessage{Role: "user", Content: "That answer is not valid: " + lastErr.Error() + ". " + format})
		}
		raw, err := e.call(ctx, &req, usage)
		if err != nil {
			return err
		}
		ans := readAnswer(raw)
		lastText = ans.text
		if lastErr = parse(ans); lastErr == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: %v; model %s answered %q", ErrUnparseable, lastErr, e.model, utf8cut.Shorten(lastText, 200))
}

// call sends req once. An upstream that refuses logprobs (OpenAI's
// reasoning models answer 400 naming the parameter) is asked again
// without them, and req keeps them off for the retry: the answer then
// says NoLogprobs instead of the request failing. The refusal is told by
// its wording, "answered 400" (or 422) and "logprobs", which
// proxy.ModelError and the eval's client both give.
func (e *llm) call(ctx context.Context, req *chatRequest, usage *Usage) ([]byte, error) {
	for {
		body, err := json.Marshal(req)
		if err != nil {
			return nil, fmt.Errorf("encoding model request: %w", err)
		}
		raw, u, err := e.caller.CallModel(ctx, e.model, body)
		usage.addCall(u)
		if err != nil && req.Logprobs && refusesLogprobs(err) {
			req.Logprobs, req.TopLogprobs = false, 0
			e.noLogprobs.Store(true)
			if e.refused != nil {
				e.refused()
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("calling model %s: %w", e.model, err)
		}
		return raw, nil
	}
}

func refusesLogprobs(err error) bool {
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "logprobs") && (strings.Contains(msg, "answered 400") || strings.Contains(msg, "answered 422"))
}

// readAnswer keeps the log-probabilities only when their tokens spell the
// text (offsets into the text are looked up in the tokens) and they are
// log-probabilities (logprobsPlausible).
func readAnswer(raw []byte) modelAnswer {
	choice := gjson.GetBytes(raw, "choices.0")
	ans := modelAnswer{text: choice.Get("message.content").String()}
	lp := choice.Get("logprobs.content")
	if !lp.IsArray() || json.Unmarshal([]byte(lp.Raw), &ans.logprobs) != nil {
		ans.logprobs = nil
		return ans
	}
	var joined strings.Builder
	for _, t := range ans.logprobs {
		joined.WriteString(t.Token)
	}
	if joined.String() != ans.text || len(ans.logprobs) == 0 || !logprobsPlausible(ans.logprobs) {
		ans.logprobs = nil
	}
	return ans
}

// logprobRounding is how far above 0 an upstream's logprob of a certain
// token may come out of its float arithmetic and still be read as 0.
const logprobRounding = 1e-3

// logprobsPlausible reports whether toks hold log-probabilities, and
// reads those a rounding error put just above 0 as 0. A larger one
// (an upstream that sent 1000) is no probability at all: e^1000 made
// confidences of +Inf and NaN, which no answer can carry, so the answer
// is read as one without logprobs instead.
func logprobsPlausible(toks []tokenLogprob) bool {
	plausible := func(lp *float64) bool {
		if !(*lp <= logprobRounding) { // also NaN
			return false
		}
		*lp = min(*lp, 0)
		return true
	}
	for i := range toks {
		if !plausible(&toks[i].Logprob) {
			return false
		}
		for j := range toks[i].TopLogprobs {
			if !plausible(&toks[i].TopLogprobs[j].Logprob) {
				return false
			}
		}
	}
	return true
}

// oneLine keeps caller text on its prompt line, so that a description
// cannot start a line that reads as another label.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func quote(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

func textTypeLine(t string) string {
	if t == "" {
		return ""
	}
	return "The text is a " + oneLine(t) + ".\n"
}

// labelCodes numbers n labels with decimal codes of one width: 1-9 for up
// to 9 labels, 10-99 for up to 90, 100-999 beyond (200 labels: 100-299).
// One width makes the codes prefix-free, so a tokenizer that splits
// numbers into digits (Llama 2, Mistral, Qwen) still spells each code
// unambiguously, and its first digit's alternatives are read as groups of
// codes (codeDistribution); tokenizers with numbers up to 999 as single
// tokens (cl100k, o200k, Llama 3) see each code as one token.
func labelCodes(n int) []string {
	start := 1
	for 9*start < n {
		start *= 10
	}
	codes := make([]string, n)
	for i := range codes {
		codes[i] = strconv.Itoa(start + i)
	}
	return codes
}

// writeNumbered lists the labels one a line as `CODE. "label": description`,
// each example on an indented line after it. Labels and examples are JSON
// strings, so any label (quotes, newlines) stays on its line; ViewModel
// reads the list back (parseNumbered).
func writeNumbered(b *strings.Builder, codes, labels []string, descriptions map[string]string, examples map[string][]string) {
	for i, l := range labels {
		fmt.Fprintf(b, "%s. %s", codes[i], quote(l))
		if d := descriptions[l]; d != "" {
			b.WriteString(": " + oneLine(d))
		}
		for _, x := range examples[l] {
			b.WriteString("\n   example: " + quote(x))
		}
		b.WriteByte('\n')
	}
}

// Formats asked for, repeated in the retry's reminder.
const (
	formatCode  = "Answer with the number of the one best label only: its digits, nothing else."
	formatYesNo = "Answer with one line per label, in the order given: its number, a colon and yes or no (for example \"12: yes\"), and nothing else."
	formatDigit = "Answer with one digit from 0 to 9 only, nothing else."
	formatTags  = "Answer with one tag per line, most fitting first, and nothing else; if no tag fits, answer none alone."
)

// yesNoPerLine is the max_tokens a yes/no line may take: "123: yes\n" is 6
// tokens where numbers are split into digits, 4 where they are not.
const yesNoPerLine = 6

func classifyPrompt(req ClassifyRequest, codes []string) string {
	var b strings.Builder
	if req.Mode == ModeMulti {
		b.WriteString(PromptMarker + " classify-multi\n")
		b.WriteString("You are a text classifier. For each label below, judge whether it applies to the text the user sends.\n")
	} else {
		b.WriteString(PromptMarker + " classify\n")
		b.WriteString("You are a text classifier. Choose the one label below that fits the text the user sends best.\n")
	}
	b.WriteString(textTypeLine(req.TextType))
	b.WriteString("Labels, each after its number:\n")
	writeNumbered(&b, codes, req.Labels, req.Descriptions, req.Examples)
	if req.Mode == ModeMulti {
		b.WriteString(formatYesNo)
	} else {
		b.WriteString(formatCode)
	}
	return b.String()
}

// Classify in single mode asks for one label's number (max_tokens 4) and
// reads the distribution over labels from the log-probabilities of the
// numbers (codeDistribution), tempered by LLMTemperature. Label is the
// most probable label, the model's own answer under greedy decoding; Tie
// is set, as for the lexical engine, when another label is as probable.
//
// Multi mode asks for a yes or no per label in one call (about 6 tokens a
// label, 1,200 for 200 labels): bounded, where a call per label would
// repeat the text 200 times. Each label's confidence is P(yes)/(P(yes) +
// P(no)) at its answer token (yesNoProbabilities), independent of the
// others as multi mode wants; labels at or above the threshold are
// returned.
//
// Without log-probabilities the model's answer is kept but no confidence
// is made up: single mode gives every label 1/n (Label is still the
// model's choice), multi mode every label 0.5 with Labels the ones the
// model said yes to, and NoLogprobs is set.
func (e *llm) Classify(ctx context.Context, req ClassifyRequest) (ClassifyResult, error) {
	res := ClassifyResult{Answer: Answer{Engine: EngineLLM, Model: e.model}}
	if len(req.Labels) == 0 {
		return res, ErrNoLabels
	}
	codes := labelCodes(len(req.Labels))
	system := classifyPrompt(req, codes)
	if req.Mode == ModeMulti {
		err := e.ask(ctx, system, req.Text, formatYesNo, yesNoPerLine*len(codes)+8, &res.Usage, func(ans modelAnswer) error {
			probs, said, err := yesNoProbabilities(ans, codes)
			if err != nil {
				return err
			}
			res.NoLogprobs = probs == nil
			res.Scores, res.Labels = multiScores(req.Labels, probs, said, req.Threshold)
			return nil
		})
		return res, err
	}
	err := e.ask(ctx, system, req.Text, formatCode, 4, &res.Usage, func(ans modelAnswer) error {
		chosen, dist, err := codeDistribution(ans, codes)
		if err != nil {
			return err
		}
		res.NoLogprobs = dist == nil
		e.singleResult(req.Labels, chosen, dist, &res)
		return nil
	})
	return res, err
}

// singleResult fills res from the model's chosen label index and the
// distribution (nil without log-probabilities).
func (e *llm) singleResult(labels []string, chosen int, dist []float64, res *ClassifyResult) {
	res.Scores = make([]LabelScore, len(labels))
	if dist == nil {
		res.Scores[0] = LabelScore{Label: labels[chosen], Confidence: round4(1 / float64(len(labels)))}
		n := 1
		for i, l := range labels {
			if i != chosen {
				res.Scores[n] = LabelScore{Label: l, Confidence: res.Scores[0].Confidence}
				n++
			}
		}
		res.Label, res.Confidence = labels[chosen], res.Scores[0].Confidence
		return
	}
	dist = temper(dist, e.temp)
	for i, l := range labels {
		res.Scores[i] = LabelScore{Label: l, Confidence: round4(dist[i])}
	}
	sortScoresByLabel(res.Scores)
	res.Label, res.Confidence = res.Scores[0].Label, res.Scores[0].Confidence
	res.Tie = len(res.Scores) > 1 && res.Scores[1].Confidence == res.Scores[0].Confidence
}

// temper raises p to 1/t and normalises: t > 1 flattens, t < 1 sharpens.
func temper(p []float64, t float64) []float64 {
	out := make([]float64, len(p))
	var sum float64
	for i, x := range p {
		if x > 0 {
			out[i] = math.Exp(math.Log(x) / t)
			sum += out[i]
		}
	}
	if sum == 0 {
		return p
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

// multiScores: probs nil means no log-probabilities, and said is all the
// model gave.
func multiScores(labels []string, probs []float64, said []bool, threshold float64) (scores, matched []LabelScore) {
	scores = make([]LabelScore, len(labels))
	matched = []LabelScore{}
	for i, l := range labels {
		s := LabelScore{Label: l, Confidence: 0.5}
		in := said[i]
		if probs != nil {
			s.Confidence = round4(probs[i])
			// The model's P(yes) is the label's evidence: at threshold
			// 0 a label it gives none (0 to four decimals) is still
			// not answered, or every label would be.
			in = s.Confidence > 0 && s.Confidence >= threshold
		}
		scores[i] = s
		if in {
			matched = append(matched, s)
		}
	}
	sortScoresByLabel(scores)
	sortScoresByLabel(matched)
	return scores, matched
}

// Tag with a closed set is multi mode over the tags (a yes or no per tag,
// confidence P(yes)), then the threshold (default 0.5) and MaxTags. Open
// tags are asked for one a line; a tag's confidence is the probability of
// its first token, the model's preference for starting that tag over the
// alternatives it weighed there: a rough measure, as there is no closed
// set to normalise over. Without log-probabilities every tag gets 0.5 and
// NoLogprobs is set; the tags are the ones the model gave, in its order.
func (e *llm) Tag(ctx context.Context, req TagRequest) (TagResult, error) {
	res := TagResult{Answer: Answer{Engine: EngineLLM, Model: e.model}}
	maxTags := req.MaxTags
	if maxTags <= 0 {
		maxTags = 5
	}
	threshold := req.Threshold
	if len(req.Tags) == 0 {
		return e.openTags(ctx, req.Text, maxTags, threshold)
	}
	codes := labelCodes(len(req.Tags))
	var b strings.Builder
	b.WriteString(PromptMarker + " tag\n")
	b.WriteString("You tag texts. For each tag below, judge whether it applies to the text the user sends.\n")
	b.WriteString("Tags, each after its number:\n")
	writeNumbered(&b, codes, req.Tags, nil, nil)
	b.WriteString(formatYesNo)
	err := e.ask(ctx, b.String(), req.Text, formatYesNo, yesNoPerLine*len(codes)+8, &res.Usage, func(ans modelAnswer) error {
		probs, said, err := yesNoProbabilities(ans, codes)
		if err != nil {
			return err
		}
		res.NoLogprobs = probs == nil
		_, res.Tags = multiScores(req.Tags, probs, said, threshold)
		if len(res.Tags) > maxTags {
			res.Tags = res.Tags[:maxTags]
		}
		return nil
	})
	return res, err
}

func (e *llm) openTags(ctx context.Context, text string, maxTags int, threshold float64) (TagResult, error) {
	res := TagResult{Answer: Answer{Engine: EngineLLM, Model: e.model}}
	system := fmt.Sprintf("%s tag-open\nYou tag the text the user sends with at most %d short topical tags, one or two lowercase words each.\n%s",
		PromptMarker, maxTags, formatTags)
	err := e.ask(ctx, system, text, formatTags, 8*maxTags+8, &res.Usage, func(ans modelAnswer) error {
		tags, err := lineTags(ans, maxTags)
		if err != nil {
			return err
		}
		res.NoLogprobs = ans.logprobs == nil
		res.Tags = []LabelScore{}
		for _, t := range tags {
			if t.Confidence >= threshold {
				res.Tags = append(res.Tags, t)
			}
		}
		sortScores(res.Tags)
		return nil
	})
	return res, err
}

// Score asks for a digit 0-9 and reads the expected digit over the digit
// log-probabilities, divided by 9: a graded score, where the digit alone
// would move in steps of 0.11. Without log-probabilities it is the digit
// the model gave, divided by 9, and NoLogprobs is set.
func (e *llm) Score(ctx context.Context, req ScoreRequest) (ScoreResult, error) {
	var b strings.Builder
	b.WriteString(PromptMarker + " score\n")
	b.WriteString("You rate the text the user sends on one attribute.\n")
	b.WriteString("Attribute: " + quote(req.Attribute) + "\n")
	if req.Description != "" {
		b.WriteString("Meaning: " + oneLine(req.Description) + "\n")
	} else if d := commonAttributeMeaning[strings.ToLower(req.Attribute)]; d != "" {
		b.WriteString("Meaning: " + d + "\n")
	}
	b.WriteString("Rate it from 0 (not at all) to 9 (extremely). " + formatDigit)
	return e.digit(ctx, b.String(), req.Source)
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

// Match is Score's digit for the relevance of the document to the query.
func (e *llm) Match(ctx context.Context, req MatchRequest) (ScoreResult, error) {
	system := PromptMarker + " match\n" +
		"You judge how relevant a document is to a search query: does it answer or address the query?\n" +
		"Query: " + quote(req.Query) + "\n" +
		"The user sends the document. Rate its relevance from 0 (unrelated) to 9 (answers the query fully). " + formatDigit
	return e.digit(ctx, system, req.Source)
}

func (e *llm) digit(ctx context.Context, system, user string) (ScoreResult, error) {
	res := ScoreResult{Answer: Answer{Engine: EngineLLM, Model: e.model}}
	err := e.ask(ctx, system, user, formatDigit, 2, &res.Usage, func(ans modelAnswer) error {
		s, err := digitScore(ans)
		res.Score, res.NoLogprobs = s, ans.logprobs == nil
		return err
	})
	return res, err
}
