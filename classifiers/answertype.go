package classifiers

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// A question says what kind of answer it wants: "how long" a quantity or
// a time, "why" a cause, "who" a name. A document that repeats the
// question's words but holds nothing of that kind does not answer it,
// which word vectors cannot see (the words are all there). answerKind
// reads the kind from the query, hasAnswerKind looks for it in the
// document; both are general English, not tuned to any text.
type answerKind uint8

const (
	kindNone answerKind = iota
	kindQuantity
	kindCause
	kindName
)

var quantityOpeners = []string{"how long", "how often", "how many", "how much", "how old", "how far",
	"how fast", "how big", "how soon", "what time", "what year", "what date", "when"}

// quantityWords are numbers in words and units of time and amount, as
// words (and their plurals), not stems: stemmed, "one" is "on" and a
// document saying "refunds on sale items" held a quantity. "am" and "may"
// are left out: far more often "I am" and "it may" than a time or a month
// (a time is written with digits, "9 am", which count anyway).
var quantityWords = func() map[string]struct{} {
	m := map[string]struct{}{}
	for w := range strings.FieldsSeq(`one two three four five six seven eight nine ten eleven twelve
	fifteen twenty thirty forty fifty hundred thousand million billion dozen half quarter couple few
	second minute hour day week month year decade century daily weekly monthly yearly annually hourly
	pm noon midnight morning evening night tonight today tomorrow yesterday weekend weekday
	monday tuesday wednesday thursday friday saturday sunday january february march april june
	july august september october november december spring summer autumn fall winter
	percent kilometre kilometer mile metre meter gram kilogram pound dollar euro cent litre liter
	price cost every once twice until before after`) {
		m[w] = struct{}{}
		m[w+"s"] = struct{}{}
	}
	return m
}()

// causeWords leave out "so" and "make", which as often mean nothing
// causal ("so why not", "make a cake").
var causeWords = func() map[string]struct{} {
	m := map[string]struct{}{}
	for w := range strings.FieldsSeq(`because since due cause causes caused reason reasons therefore thus
	hence result results resulting lead leads led trigger triggers triggered effect effects
	explain explains consequence consequently owing`) {
		m[stem(w)] = struct{}{}
	}
	return m
}()

// answerKindOf reads the kind of answer a query asks for.
func answerKindOf(query string) answerKind {
	q := " " + strings.ToLower(strings.TrimSpace(query)) + " "
	for _, o := range quantityOpeners {
		if strings.Contains(q, " "+o+" ") {
			return kindQuantity
		}
	}
	switch {
	case strings.Contains(q, " why "):
		return kindCause
	case strings.Contains(q, " who "), strings.Contains(q, " whom "), strings.Contains(q, " whose "):
		return kindName
	}
	return kindNone
}

// hasAnswerKind says whether doc holds an answer of kind: a number or a
// unit of time or amount; a causal word; a capitalised word that is not
// the start of a sentence and not one of the query's own words.
func hasAnswerKind(kind answerKind, doc *doc, raw string, query []term) bool {
	switch kind {
	case kindQuantity:
		if doc.stats.digitWords > 0 || doc.stats.money > 0 || doc.stats.percents > 0 {
			return true
		}
		return anyWord(doc.terms, quantityWords)
	case kindCause:
		return anyStem(doc.terms, causeWords)
	case kindName:
		return hasNewName(raw, query)
	}
	return true
}

// anyStem reports whether any term's stem is in set; stopwords count
// here ("because", "since" are function words).
func anyStem(terms []term, set map[string]struct{}) bool {
	for i := range terms {
		if _, ok := set[terms[i].stem]; ok {
			return true
		}
		if _, ok := set[terms[i].word]; ok {
			return true
		}
	}
	return false
}

// anyWord reports whether any term's word, as written in lower case, is
// in set.
func anyWord(terms []term, set map[string]struct{}) bool {
	for i := range terms {
		if _, ok := set[terms[i].word]; ok {
			return true
		}
	}
	return false
}

func hasNewName(raw string, query []term) bool {
	inQuery := make(map[string]struct{}, len(query))
	for i := range query {
		inQuery[query[i].word] = struct{}{}
	}
	sentenceStart := true
	for f := range strings.FieldsSeq(raw) {
		word := strings.TrimFunc(f, func(r rune) bool { return !unicode.IsLetter(r) })
		r, _ := utf8.DecodeRuneInString(word)
		if word != "" && !sentenceStart && unicode.IsUpper(r) {
			if _, ok := inQuery[strings.ToLower(word)]; !ok {
				return true
			}
		}
		last, _ := utf8.DecodeLastRuneInString(f)
		sentenceStart = last == '.' || last == '!' || last == '?'
	}
	return false
}
