package classifiers

import (
	"math"
	"strings"
)

// Scores on the semantic engine: the lexical scorer's answer (cues,
// VADER, text features) averaged with how far the text's meaning leans
// to the attribute's high pole rather than its low one. The poles of the
// six common attributes are a few words of general English written for
// that purpose, not taken from any evaluation text; an attribute the
// engine does not know is its name and description, against nothing.
var attributePoleWords = map[string][2]string{
	"toxicity": {
		`insult idiot stupid moron pathetic worthless disgusting loser hate scum trash
		garbage ugly dumb fool shut contempt despise vile coward liar clown`,
		`thank kind appreciate helpful respectful polite friendly welcome lovely
		grateful pleasant considerate`,
	},
	"urgency": {
		`urgent emergency immediately critical asap now danger severe outage failing
		deadline hurry quickly collapse bleeding fire unconscious injured crash
		threatening catastrophic`,
		`whenever later someday eventually leisurely optional curious wondering
		idea suggestion eventually sometime casual`,
	},
	"sentiment": {
		`great excellent love wonderful happy fantastic pleased delighted perfect
		amazing enjoy superb glad`,
		`terrible awful hate horrible disappointed angry bad worst poor useless
		annoyed miserable broken`,
	},
	"formality": {
		`sincerely regards pursuant accordingly hereby request kindly herewith
		furthermore respectfully acknowledge enclosed inquire regarding`,
		`hey gonna wanna lol yeah cool dude stuff kinda guys awesome yep nope`,
	},
	"spam": {
		`free winner prize click offer discount cash guaranteed limited subscribe
		lottery claim bonus earn exclusive deal unsubscribe`,
		`meeting colleague schedule question project report family friend
		tomorrow lunch document`,
	},
	"quality": {
		`detailed clear specific thorough accurate explained informative precise
		evidence analysis structured concise`,
		`lol idk whatever stuff thing asdf vague random dunno`,
	},
}

// attributePoles is an attribute compiled: unit vectors of its high and
// (when it has one) low pole, the lexical kind it maps to, whether that
// kind is read upside down ("negativity" is sentiment, inverted), and the
// function words it is read by when its name has no other (literalWords).
type attributePoles struct {
	high, low []float32
	kind      string
	inverted  bool
	literal   map[string]struct{}
}

// Mixing and calibration of the meaning score: the lean (high minus low
// pole similarity, or for an attribute known only by name, its
// similarity minus what an unrelated text reaches) through a logistic.
const (
	poleSpread     = 0.08
	poleUnknownMid = 0.15
	poleMeanMix    = 0.5 // share of the whole-text cosine; the rest is the closest word
	// undirectedToxicity shrinks the toxic lean of a text that addresses
	// no one.
	undirectedToxicity = 0.4
	// aimedNegativity adds VADER's negativity to the toxic lean of a text
	// that addresses someone.
	aimedNegativity = 0.2
	scoreSemMix     = 0.4 // share of the meaning score in the final score
)

func (e *semantic) scoreAttribute(text, attribute, description string) float64 {
	lex := scoreAttribute(text, attribute, description)
	p := e.compilePoles(attribute, description)
	if p.high == nil {
		return lex
	}
	t := e.embedFor(text, p.literal)
	if t.known == 0 {
		return lex
	}
	lean := e.poleSimilarity(&t, p.high)
	if p.low != nil {
		lean -= e.poleSimilarity(&t, p.low)
	} else {
		lean -= poleUnknownMid
	}
	aimed := p.kind == "toxicity" && addressesSomeone(text)
	if aimed {
		// Negative words aimed at someone are hostility even when no
		// insult word is among them ("nobody wants you here").
		lean += aimedNegativity * math.Max(0, -vader().PolarityScores(text).Compound)
	}
	sem := logistic(lean / poleSpread)
	if p.kind == "toxicity" && !aimed {
		// Hostile words about the weather or a Monday are negativity,
		// not toxicity: that is aimed at someone.
		sem = 0.5 + (sem-0.5)*undirectedToxicity
	}
	if p.inverted {
		sem = 1 - sem
	}
	return clamp01((1-scoreSemMix)*lex + scoreSemMix*sem)
}

// poleSimilarity mixes the whole text's cosine with the pole and its
// closest word's: one insult in a long, otherwise calm text still counts.
func (e *semantic) poleSimilarity(t *embedding, pole []float32) float64 {
	peak := float32(-1)
	for _, w := range t.words {
		if c := e.v.dotWith(int(w), pole); c > peak {
			peak = c
		}
	}
	return poleMeanMix*float64(dot(t.vec, pole)) + (1-poleMeanMix)*float64(peak)
}

// compilePoles compiles an attribute's poles once and keeps them by its
// name and description.
func (e *semantic) compilePoles(attribute, description string) *attributePoles {
	return e.poles.get(textsKey(attribute, description), func() *attributePoles {
		return e.buildPoles(attribute, description)
	})
}

func (e *semantic) buildPoles(attribute, description string) *attributePoles {
	p := &attributePoles{}
	p.kind, p.inverted = attributeKind(attribute)
	if words, ok := attributePoleWords[p.kind]; ok {
		p.high = e.poleVector(words[0], nil)
		p.low = e.poleVector(words[1], nil)
		if description != "" {
			// The caller's description says what high means to them.
			if d := e.poleVector(description, nil); d != nil && p.high != nil {
				for i := range p.high {
					p.high[i] += 0.5 * d[i]
				}
				Normalize(p.high)
			}
		}
	} else {
		p.literal = literalWords([]string{attribute})
		p.high = e.poleVector(strings.ReplaceAll(attribute, "_", " ")+" "+description, p.literal)
	}
	return p
}

// poleVector is the unweighted mean of the words' unit vectors: pole
// words are chosen one by one, so a frequent one is not worth less.
// literal: the attribute's literal words, or nil.
func (e *semantic) poleVector(words string, literal map[string]struct{}) []float32 {
	acc := make([]float32, e.v.dims)
	n := 0
	for _, t := range analyzeFor(words, literal).terms {
		if t.stop {
			continue
		}
		if i := e.v.wordIndex(&t); i >= 0 {
			e.v.addTo(acc, i, 1)
			n++
		}
	}
	if n == 0 {
		return nil
	}
	Normalize(acc)
	return acc
}

// addressesSomeone reports whether text speaks to or of a person: a
// second-person word, or one of the words people are called by.
func addressesSomeone(text string) bool {
	for _, t := range analyze(text).terms {
		if _, ok := secondPerson[t.word]; ok {
			return true
		}
		if _, ok := personWords[t.word]; ok {
			return true
		}
	}
	return false
}

var personWords = setOf(`he she him her they them his hers their people person guy guys man men
woman women everyone anyone somebody someone`)
