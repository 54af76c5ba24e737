package classifiers

import (
	"strings"

	"github.com/tollgate/tollgate/config"
)

// A label that negates another of its set ("not spam", "no spam",
// "non-spam", "not_spam" beside "spam") is read by the offline engines
// as the complement of the label it negates. Read by its words it was
// that label again (the negation word is a stopword, or one word more
// that every text lacks): every text tied between the two, or both
// applied at once in multi mode. Only explicit negation words count; an
// "un" or "in" prefix ("unpaid", "invalid") is a word of its own, and
// the vectors know what it means.
var negationWords = [...]string{"not ", "no ", "non "}

// negatedLabels is, for each of labels, the index of the label it
// negates, or -1; nil when none negates another, as for most sets. A
// label and its negation are compared as the offline engines read them
// (config.LabelKey: case, spacing and punctuation aside), so "Not-Spam"
// negates "spam". A negation of a negation is read by its words, as
// before: "not not spam" is no complement of anything.
func negatedLabels(labels []string) []int {
	var negations []int // indexes of labels that start with a negation word
	keys := make([]string, len(labels))
	for i, l := range labels {
		keys[i] = config.LabelKey(l)
		if _, ok := cutNegation(keys[i]); ok {
			negations = append(negations, i)
		}
	}
	if len(negations) == 0 {
		return nil
	}
	byKey := make(map[string]int, len(labels))
	for i, k := range keys {
		byKey[k] = i
	}
	var negates []int
	for _, i := range negations {
		rest, _ := cutNegation(keys[i])
		base, ok := byKey[rest]
		if !ok {
			continue
		}
		if _, double := cutNegation(rest); double {
			continue
		}
		if negates == nil {
			negates = make([]int, len(labels))
			for j := range negates {
				negates[j] = -1
			}
		}
		negates[i] = base
	}
	return negates
}

// cutNegation is key without its leading negation word, and whether it
// had one followed by a word.
func cutNegation(key string) (string, bool) {
	for _, w := range negationWords {
		if rest, ok := strings.CutPrefix(key, w); ok && rest != "" {
			return rest, true
		}
	}
	return "", false
}

// negate gives each negated label (negates, from negatedLabels) its
// base label's similarity mirrored about centre, the similarity at which
// the base label's multi-mode confidence is 0.5: the negation's
// multi-mode confidence is then 1 less the base's, and in single mode
// the two are decided where multi mode decides them. Evidence for the
// base label is evidence against its negation, and a text without any
// evidence for it is evidence for the negation, as a catch-all wins
// when nothing else matched: "not spam" is a decision, not a tie.
func negate(sims []float64, negates []int, centre float64) {
	for i, base := range negates {
		if base >= 0 {
			sims[i] = 2*centre - sims[base]
		}
	}
}

// matchedPairs is matched for a set with negated labels: of a label and
// its negation, exactly one is decided, the label when its similarity
// reaches centre (its confidence 0.5) and its negation otherwise, and
// the one decided is matched if its confidence reaches threshold too.
// Each has the other's complement for confidence, so at a threshold of
// 0.5 or below one of them is always matched, and above it neither may
// be (the text says neither clearly enough).
func matchedPairs(scores []LabelScore, sims []float64, threshold float64, limit int, negates []int, centre float64) []LabelScore {
	if negates == nil {
		return matched(scores, sims, threshold, limit)
	}
	isBase := make([]bool, len(negates))
	for _, base := range negates {
		if base >= 0 {
			isBase[base] = true
		}
	}
	out := []LabelScore{}
	for i, s := range scores {
		decided := sims[i] > 0
		switch {
		case negates[i] >= 0:
			decided = sims[negates[i]] < centre
		case isBase[i]:
			decided = sims[i] >= centre
		}
		if decided && s.Confidence >= threshold {
			out = append(out, s)
		}
	}
	sortScoresByLabel(out)
	if len(out) > limit {
		out = out[:limit]
	}
	return out
}
