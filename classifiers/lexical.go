package classifiers

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/jonreiter/govader"

	"github.com/tollgate/tollgate/tokens"
)

// ErrNoLabels is returned by Classify for a request without labels; the
// HTTP layer validates requests first (1 to 200 unique labels), so seeing
// it means a caller skipped that validation.
var ErrNoLabels = errors.New("no labels to classify into: give 1 to 200 labels")

// EngineLexical is the Name of the lexical engine.
const EngineLexical = "lexical"

// vader is the VADER sentiment analyser; its lexicon loads once (a few
// milliseconds) and is only read afterwards, so sharing it is safe.
var vader = sync.OnceValue(govader.NewSentimentIntensityAnalyzer)

// lexical is the offline engine: words, an approximate idf, a sentiment
// lexicon and cue lists. It never touches the network and gives the same
// answer for the same input.
type lexical struct{}

// NewLexical returns the offline, deterministic engine. It answers with
// engine "lexical", counts the input with the o200k tokenizer as prompt
// tokens and reports no completion tokens.
func NewLexical() Engine {
	vader()
	return lexical{}
}

func (lexical) Name() string { return EngineLexical }

// Weights of the parts of a label's profile: the label's own name says
// the most about it.
const (
	nameWeight        = 3
	descriptionWeight = 1
	exampleWeight     = 1
)

// Classification calibration. Similarities are cosines, mostly within
// 0..0.5 for short texts; softmaxTemperature turns their differences into
// a distribution in single mode, and in multi mode each label's similarity
// goes through a logistic centred on multiCentre.
const (
	softmaxTemperature = 0.08
	multiCentre        = 0.1
	multiSpread        = 0.035
	// fallbackFloor is the similarity a catch-all label ("other", "none")
	// gets without any matching word: it wins when no other label shares
	// even one telling word with the text (one shared word of average
	// weight between a short text and a profile is about 0.08).
	fallbackFloor = 0.05
	// sentimentWeight scales the sentiment evidence added to labels whose
	// name carries a polarity (positive, negative, complaint, praise) or
	// says neutral.
	sentimentWeight = 0.35
)

var fallbackNames = setOf(`other others none misc miscellaneous unknown general
unclassified uncategorized uncategorised irrelevant n/a`)

var neutralNames = setOf(`neutral objective factual informational`)

func (e lexical) Classify(ctx context.Context, req ClassifyRequest) (ClassifyResult, error) {
	var res ClassifyResult
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if len(req.Labels) == 0 {
		return res, ErrNoLabels
	}
	req.Labels = inOneOrder(req.Labels)
	ls := compileLabels(req.Labels, req.Descriptions, req.Examples)
	raw := composed(req.Text)
	text := analyzeFor(raw, ls.literal)
	textBag := bagOf(text.terms)
	sims := labelSimilarities(&textBag, raw, ls)

	res.Scores = make([]LabelScore, len(req.Labels))
	if req.Mode == ModeMulti {
		for i, l := range req.Labels {
			res.Scores[i] = LabelScore{Label: l, Confidence: round4(multiConfidence(sims[i]))}
		}
		res.Labels = matched(res.Scores, sims, req.Threshold, len(req.Labels))
		sortScoresByLabel(res.Scores)
	} else {
		probs := softmax(sims, softmaxTemperature)
		for i, l := range req.Labels {
			res.Scores[i] = LabelScore{Label: l, Confidence: round4(probs[i])}
		}
		sortScoresByLabel(res.Scores)
		res.Label, res.Confidence = res.Scores[0].Label, res.Scores[0].Confidence
		// Equal top confidences mean the words could not tell the labels
		// apart (typically: no label shares a word with the text, so all
		// tie at 1/n). sortScoresByLabel put the first tied label by name first,
		// so the answer does not depend on the order labels were listed
		// in, and Tie tells the caller not to trust it as a decision.
		res.Tie = len(res.Scores) > 1 && res.Scores[1].Confidence == res.Scores[0].Confidence
	}
	res.Answer = lexicalAnswer(req.Text, ls.tokens)
	return res, nil
}

// matched is the labels of scores (parallel to sims) at or above
// threshold, highest first, at most limit of them. A label without any
// evidence (similarity 0: no shared word, no sentiment, not a catch-all)
// is never matched, whatever the threshold: its confidence is the
// logistic's floor, the same for every such label, and says nothing about
// the text. The result is never nil.
func matched(scores []LabelScore, sims []float64, threshold float64, limit int) []LabelScore {
	out := []LabelScore{}
	for i, s := range scores {
		if sims[i] > 0 && s.Confidence >= threshold {
			out = append(out, s)
		}
	}
	sortScoresByLabel(out)
	if len(out) > limit {
		out = out[:limit]
	}
	return out
}

// labelSimilarities scores text against every label's profile: the cosine
// of the words, plus sentiment evidence for labels that name a polarity,
// and a floor for catch-all labels.
func labelSimilarities(textBag *bag, raw string, ls *labelSet) []float64 {
	sims := make([]float64, len(ls.profiles))
	compound, haveCompound := 0.0, false
	for i := range ls.profiles {
		sims[i] = cosine(textBag, &ls.profiles[i])
		if ls.polarity[i] != 0 || ls.neutral[i] {
			if !haveCompound {
				compound, haveCompound = vader().PolarityScores(raw).Compound, true
			}
			if ls.neutral[i] {
				sims[i] += sentimentWeight * (1 - math.Abs(compound)) * 0.6
			} else {
				sims[i] += sentimentWeight * math.Max(0, compound*ls.polarity[i])
			}
		}
		if ls.fallback[i] && sims[i] < fallbackFloor {
			sims[i] = fallbackFloor
		}
	}
	return sims
}

// labelSet is a label list compiled for the lexical engine: one profile
// per label (its name, description and examples as a weighted bag), what
// its name says about sentiment and catch-alls, the function words its
// texts are read with as content words (literalWords: nil for most sets),
// and the token count of all of it. It is read-only once built, so
// requests share it.
type labelSet struct {
	profiles []bag
	polarity []float64
	neutral  []bool
	fallback []bool
	literal  map[string]struct{}
	tokens   int64
}

// labelSetCache keeps recently compiled label sets: batch jobs and busy
// classifiers send the same labels with every text, and compiling 200
// labels with descriptions costs far more than classifying one text.
var labelSetCache = newBuildCache[*labelSet](labelSetCacheSize)

const labelSetCacheSize = 128

// compileLabels compiles a label set once and keeps it by its names,
// descriptions and examples, unless it is larger than MaxLabelSetBytes.
func compileLabels(labels []string, descriptions map[string]string, examples map[string][]string) *labelSet {
	key, size := labelSetKey(labels, descriptions, examples)
	if size > MaxLabelSetBytes {
		return buildLabelSet(labels, descriptions, examples)
	}
	return labelSetCache.get(key, func() *labelSet { return buildLabelSet(labels, descriptions, examples) })
}

func buildLabelSet(labels []string, descriptions map[string]string, examples map[string][]string) *labelSet {
	// The set as sent is what its tokens are counted on, as a text's are.
	tokenCount := int64(tokens.Count(labelBlock(labels, descriptions, examples)))
	labels, descriptions, examples = composedSet(labels, descriptions, examples)
	ls := &labelSet{
		profiles: make([]bag, len(labels)),
		polarity: make([]float64, len(labels)),
		neutral:  make([]bool, len(labels)),
		fallback: make([]bool, len(labels)),
		literal:  literalWords(labels),
		tokens:   tokenCount,
	}
	for i, label := range labels {
		b := newBagBuilder(16)
		b.add(analyzeFor(label, ls.literal).terms, nameWeight)
		if d := descriptions[label]; d != "" {
			b.add(analyzeFor(d, ls.literal).terms, descriptionWeight)
		}
		for _, ex := range examples[label] {
			b.add(analyzeFor(ex, ls.literal).terms, exampleWeight)
		}
		ls.profiles[i] = b.build()
		name := strings.ToLower(strings.TrimSpace(label))
		ls.polarity[i], ls.neutral[i] = labelPolarity(name)
		_, ls.fallback[i] = fallbackNames[name]
	}
	return ls
}

// labelBlock is the labels with their descriptions and examples as one
// text: the cache key, and what is counted as prompt tokens.
func labelBlock(labels []string, descriptions map[string]string, examples map[string][]string) string {
	var b strings.Builder
	for i, l := range labels {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(l)
		if d := descriptions[l]; d != "" {
			b.WriteString(": ")
			b.WriteString(d)
		}
		for _, ex := range examples[l] {
			b.WriteString("\n  ")
			b.WriteString(ex)
		}
	}
	return b.String()
}

// labelPolarity reads a label name's polarity from the VADER lexicon
// (valence -4..4, scaled to -1..1, ignored below 1 in magnitude) and says
// whether the name means "no polarity".
func labelPolarity(name string) (valence float64, neutral bool) {
	if _, ok := neutralNames[name]; ok {
		return 0, true
	}
	if utf8.RuneCountInString(name) < 2 {
		// A one-letter label is a size, a grade or a code. VADER rates
		// "l" 2 (chat for laugh), and a label L beside S and M won every
		// friendly text ("please" at 0.60) as if it meant "positive".
		return 0, false
	}
	v := vader().Lexicon[name]
	if math.Abs(v) < 1 {
		return 0, false
	}
	return math.Max(-1, math.Min(1, v/2.5)), false
}

func softmax(x []float64, temperature float64) []float64 {
	out := make([]float64, len(x))
	hi := math.Inf(-1)
	for _, v := range x {
		hi = math.Max(hi, v)
	}
	var sum float64
	for i, v := range x {
		out[i] = math.Exp((v - hi) / temperature)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

func multiConfidence(sim float64) float64 {
	return logistic((sim - multiCentre) / multiSpread)
}

func logistic(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

func (e lexical) Tag(ctx context.Context, req TagRequest) (TagResult, error) {
	var res TagResult
	if err := ctx.Err(); err != nil {
		return res, err
	}
	maxTags := req.MaxTags
	if maxTags <= 0 {
		maxTags = 5
	}
	raw := composed(req.Text)
	text := analyze(raw)
	if len(req.Tags) == 0 {
		res.Tags = atLeast(openTags(text.terms, maxTags), req.Threshold)
		res.Answer = lexicalAnswer(req.Text, 0)
		return res, nil
	}
	threshold := req.Threshold
	req.Tags = inOneOrder(req.Tags)
	ls := compileLabels(req.Tags, nil, nil)
	readLiterally(text.terms, ls.literal)
	textBag := bagOf(text.terms)
	sims := labelSimilarities(&textBag, raw, ls)
	all := make([]LabelScore, len(req.Tags))
	for i, t := range req.Tags {
		all[i] = LabelScore{Label: t, Confidence: round4(multiConfidence(sims[i]))}
	}
	res.Tags = matched(all, sims, threshold, maxTags)
	res.Answer = lexicalAnswer(req.Text, ls.tokens)
	return res, nil
}

// atLeast keeps the tags of at least threshold, in their order.
func atLeast(tags []LabelScore, threshold float64) []LabelScore {
	out := tags[:0]
	for _, t := range tags {
		if t.Confidence >= threshold {
			out = append(out, t)
		}
	}
	return out
}

// openTags picks the text's keywords: content words by frequency times
// idf, shown in their first surface form. The confidence grows with the
// weight and reaches 0.5 for a rare word said once.
func openTags(terms []term, maxTags int) []LabelScore {
	type candidate struct {
		word   string
		weight float64
		first  int
	}
	byStem := make(map[string]int, len(terms))
	var cands []candidate
	for i := range terms {
		t := &terms[i]
		if t.stop || t.stem == "?" || len(t.word) < 3 || isDigits(t.word) {
			continue
		}
		if j, ok := byStem[t.stem]; ok {
			cands[j].weight += idf(t.stem)
			continue
		}
		byStem[t.stem] = len(cands)
		cands = append(cands, candidate{word: t.word, weight: idf(t.stem), first: i})
	}
	// Sorted by weight, then by first appearance: deterministic.
	for i := 1; i < len(cands); i++ {
		for j := i; j > 0 && (cands[j].weight > cands[j-1].weight ||
			(cands[j].weight == cands[j-1].weight && cands[j].first < cands[j-1].first)); j-- {
			cands[j], cands[j-1] = cands[j-1], cands[j]
		}
	}
	out := []LabelScore{}
	for _, c := range cands {
		if len(out) == maxTags {
			break
		}
		out = append(out, LabelScore{Label: c.word, Confidence: round4(c.weight / (c.weight + idfRare))})
	}
	return out
}

func (e lexical) Match(ctx context.Context, req MatchRequest) (ScoreResult, error) {
	var res ScoreResult
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.Score = matchScore(composed(req.Query), composed(req.Source))
	res.NoEvidence = !hasWord(req.Query) || !hasWord(req.Source)
	res.Answer = lexicalAnswer(req.Query+"\n"+req.Source, 0)
	return res, nil
}

// hasWord reports whether text holds a word the offline engines read, a
// letter or digit: a query or document without one ("🔥", "???") scores
// 0 for want of anything to compare, which is not "unrelated".
func hasWord(text string) bool { return strings.IndexFunc(text, isWordRune) >= 0 }

// matchScale maps BM25 per unit of query idf to [0,1]: a document
// holding every query word once scores about 0.75, half of them about 0.5.
const matchScale = 0.7

func matchScore(query, source string) float64 {
	q := analyze(query)
	d := analyze(source)
	if !hasContent(q.terms) {
		// A query of function words only ("what is it"): use them all.
		for i := range q.terms {
			q.terms[i].stop = false
		}
		for i := range d.terms {
			d.terms[i].stop = false
		}
	}
	docBag := bagOf(d.terms)
	x := bm25(q.terms, &docBag)
	x += 0.15 * float64(bigramHits(q.terms, d.terms))
	return round4(1 - math.Exp(-x/matchScale))
}

func hasContent(terms []term) bool {
	for i := range terms {
		if !terms[i].stop && terms[i].stem != "?" {
			return true
		}
	}
	return false
}

func (e lexical) Score(ctx context.Context, req ScoreRequest) (ScoreResult, error) {
	var res ScoreResult
	if err := ctx.Err(); err != nil {
		return res, err
	}
	attribute := composed(req.Attribute)
	res.Score = round4(scoreAttribute(composed(req.Source), attribute, composed(req.Description)))
	kind, _ := attributeKind(attribute)
	res.NoEvidence = res.Score == 0 && kind == ""
	res.Answer = lexicalAnswer(req.Source+"\n"+req.Attribute+"\n"+req.Description, 0)
	return res, nil
}

// lexicalAnswer counts input, plus labelTokens already counted for the
// request's label set, as prompt tokens: everything the engine read.
func lexicalAnswer(input string, labelTokens int64) Answer {
	n := int64(tokens.Count(input)) + labelTokens
	return Answer{Engine: EngineLexical, Usage: Usage{PromptTokens: n, TotalTokens: n}}
}

// round4 keeps four decimals: more would promise a precision the engine
// does not have, and it keeps answers byte-stable across platforms.
func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }
