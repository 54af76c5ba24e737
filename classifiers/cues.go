package classifiers

import (
	"math"
	"strconv"
	"strings"
)

// A cue is a word or phrase that is evidence for an attribute, with its
// weight (negative weights are evidence against). Cue lists are written as
// "weight phrase" lines and stemmed once, so "crashed" finds "crash".
type cue struct {
	stems   []string
	weight  float64
	negator bool // the phrase itself is a negation ("no rush"): not negated again
}

type cueList map[string][]cue // by first stem, longest phrases first

func compileCues(spec string) cueList {
	l := make(cueList)
	for line := range strings.SplitSeq(spec, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ws, phrase, ok := strings.Cut(line, " ")
		w, err := strconv.ParseFloat(ws, 64)
		if !ok || err != nil {
			panic("classifiers: bad cue line " + strconv.Quote(line))
		}
		terms := analyze(phrase).terms
		c := cue{weight: w}
		for _, t := range terms {
			c.stems = append(c.stems, t.stem)
		}
		if len(c.stems) == 0 {
			panic("classifiers: empty cue " + strconv.Quote(line))
		}
		c.negator = isNegator(terms[0].word)
		first := c.stems[0]
		l[first] = append(l[first], c)
		for i := len(l[first]) - 1; i > 0 && len(l[first][i].stems) > len(l[first][i-1].stems); i-- {
			l[first][i], l[first][i-1] = l[first][i-1], l[first][i]
		}
	}
	return l
}

var negators = setOf(`not no never without hardly barely nor neither nobody nothing none cannot`)

func isNegator(word string) bool {
	if _, ok := negators[word]; ok {
		return true
	}
	return strings.HasSuffix(word, "n't") || strings.HasSuffix(word, "nt") && (word == "dont" || word == "doesnt" || word == "didnt" || word == "isnt" || word == "wasnt" || word == "cant" || word == "wont")
}

var intensifiers = setOf(`very really extremely so super totally completely absolutely incredibly
truly highly seriously utterly such most too especially particularly`)

var diminishers = setOf(`slightly somewhat bit little fairly mildly rather kinda sorta`)

// cueMatch is one cue found in a text.
type cueMatch struct {
	at     int // index of its first term
	end    int // index after its last term
	weight float64
}

// scan finds the cues of l in terms, longest phrase first and without
// overlaps, and weighs each: a negation in the three terms before it (same
// clause) turns a cue into half its weight against; an intensifier before
// it multiplies by 1.5, a diminisher by 0.6; capitals by 1.3.
func (l cueList) scan(terms []term, visit func(m cueMatch)) {
	for i := 0; i < len(terms); {
		matched := false
		for _, c := range l[terms[i].stem] {
			if i+len(c.stems) > len(terms) {
				continue
			}
			ok := true
			for k := 1; k < len(c.stems); k++ {
				if terms[i+k].stem != c.stems[k] {
					ok = false
					break
				}
			}
			if !ok {
				continue
			}
			w := c.weight
			caps := false
			for k := range c.stems {
				caps = caps || terms[i+k].caps
			}
			if caps {
				w *= 1.3
			}
			for back := 1; back <= 3 && i-back >= 0; back++ {
				prev := &terms[i-back]
				if prev.clause != terms[i].clause {
					break
				}
				if !c.negator && isNegator(prev.word) {
					w *= -0.5
					break
				}
				if back == 1 {
					if _, ok := intensifiers[prev.word]; ok {
						w *= 1.5
					} else if _, ok := diminishers[prev.word]; ok {
						w *= 0.6
					}
				}
			}
			visit(cueMatch{at: i, end: i + len(c.stems), weight: w})
			i += len(c.stems)
			matched = true
			break
		}
		if !matched {
			i++
		}
	}
}

// sum is the total weight of the cues of l in terms.
func (l cueList) sum(terms []term) float64 {
	var e float64
	l.scan(terms, func(m cueMatch) { e += m.weight })
	return e
}

// evidenceScore maps evidence to [0,1]: prior with none, rising towards 1
// with positive evidence (scale: the evidence that covers 63% of the way)
// and falling towards 0 with negative evidence.
func evidenceScore(e, prior, scale float64) float64 {
	if e >= 0 {
		return prior + (1-prior)*(1-math.Exp(-e/scale))
	}
	return prior * math.Exp(e/scale)
}

func capped(n int, most int) float64 { return float64(min(n, most)) }
