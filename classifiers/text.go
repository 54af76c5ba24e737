package classifiers

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/tollgate/tollgate/config"
)

// term is one word of a text as the lexical engine sees it.
type term struct {
	word   string // lowercase surface form, apostrophes normalised to '
	stem   string // light English stem of word
	clause int32  // index of the clause (negation does not cross clauses)
	caps   bool   // written in capitals, at least two letters ("URGENT")
	stop   bool   // a function word: ignored for similarity, kept for cues
	// literal: a function word read as a content word, because a label
	// or attribute the text is read against is made of such words (see
	// literalWords).
	literal bool
}

// textStats are the non-word signals of a text, for the attribute scorers.
type textStats struct {
	letters     int
	upper       int // upper-case letters
	exclaims    int // '!' characters
	emoji       int // pictographs and other symbols outside the letter planes
	urls        int // http://, https:// and www. starts
	money       int // currency signs
	percents    int
	digitWords  int // words made only of digits
	repeatPunct int // runs of two or more '!' or '?'
	stretched   int // words with a letter repeated three times ("sooo")
	startsUpper bool
	endsPunct   bool
}

// doc is an analysed text.
type doc struct {
	terms []term
	stats textStats
}

// analyze splits text into terms. Words are maximal runs of Unicode letters
// and digits and the combining marks after them (isWordMark: accents,
// vowel signs), with inner apostrophes kept ("don't") and hyphenated words
// split into their parts plus the joined form ("wi-fi" gives wi, fi, wifi)
// so either spelling matches. A '?' becomes the term "?": whether a text
// asks something is lexical evidence too.
func analyze(text string) doc {
	var d doc
	d.terms = make([]term, 0, len(text)/5+2)
	st := &d.stats
	var clause int32
	lastPunct := rune(0)
	punctRun := 0
	firstLetterSeen := false

	i := 0
	for i < len(text) {
		r, size := utf8.DecodeRuneInString(text[i:])
		if isWordRune(r) {
			end, parts, joined := scanWord(text, i)
			word := text[i:end]
			if joined {
				word = strings.Map(dropJoiner, word)
			}
			if !firstLetterSeen {
				first, _ := utf8.DecodeRuneInString(word)
				st.startsUpper = unicode.IsUpper(first) || unicode.IsDigit(first)
				firstLetterSeen = true
			}
			d.addWord(word, parts, clause)
			for _, c := range word {
				if unicode.IsLetter(c) {
					st.letters++
					if unicode.IsUpper(c) {
						st.upper++
					}
				}
			}
			i = end
			punctRun = 0
			lastPunct = 0
			continue
		}
		switch {
		case r == '!' || r == '?':
			if r == '!' {
				st.exclaims++
			} else {
				d.terms = append(d.terms, term{word: "?", stem: "?", clause: clause})
			}
			if lastPunct == '!' || lastPunct == '?' {
				punctRun++
				if punctRun == 1 {
					st.repeatPunct++
				}
			}
			clause++
		case r == '.' || r == ';' || r == ':' || r == ',' || r == '(' || r == ')' || r == '\n' || r == '"' || r == '–' || r == '—':
			clause++
			punctRun = 0
		case r == '$' || r == '€' || r == '£' || r == '¥':
			st.money++
		case r == '%':
			st.percents++
		case unicode.Is(unicode.So, r) || (r >= 0x1F000 && r <= 0x1FAFF):
			st.emoji++
		}
		if r != ' ' {
			lastPunct = r
		}
		i += size
	}
	st.urls = countURLs(text)
	if trimmed := strings.TrimRightFunc(text, unicode.IsSpace); trimmed != "" {
		last, _ := utf8.DecodeLastRuneInString(trimmed)
		st.endsPunct = last == '.' || last == '!' || last == '?'
	}
	return d
}

// composed is s as the engines read it, in Unicode's composed form (NFC):
// "résumé" with combining accents (NFD, as macOS and some keyboards and
// PDFs write it) is the same word as precomposed, where a combining mark
// read alone ended the word ("re", "sume"). Text composed already comes
// back as it is, ASCII and Latin text without allocating.
func composed(s string) string { return norm.NFC.String(s) }

// composedSet is a label set as the engines read it: labels,
// descriptions and examples composed (see composed), descriptions and
// examples keyed by the composed labels; the set itself when all of it
// is composed already. Only what labels key is kept.
func composedSet(labels []string, descriptions map[string]string, examples map[string][]string) ([]string, map[string]string, map[string][]string) {
	if isComposedSet(labels, descriptions, examples) {
		return labels, descriptions, examples
	}
	ls := make([]string, len(labels))
	ds := make(map[string]string, len(descriptions))
	es := make(map[string][]string, len(examples))
	for i, l := range labels {
		ls[i] = composed(l)
		if d, ok := descriptions[l]; ok {
			ds[ls[i]] = composed(d)
		}
		if exs, ok := examples[l]; ok {
			list := make([]string, len(exs))
			for j, ex := range exs {
				list[j] = composed(ex)
			}
			es[ls[i]] = list
		}
	}
	return ls, ds, es
}

// isComposedSet reports whether the set is config.Composed throughout,
// by the check the label checks use.
func isComposedSet(labels []string, descriptions map[string]string, examples map[string][]string) bool {
	for _, l := range labels {
		if !config.Composed(l) || !config.Composed(descriptions[l]) {
			return false
		}
		for _, ex := range examples[l] {
			if !config.Composed(ex) {
				return false
			}
		}
	}
	return true
}

// literalWords are the words of the names (labels, tags or an attribute)
// made of nothing but function words: "on" and "off", "up" and "down",
// "more" and "less", "in" and "out", the sizes "S" and "M". The stopword
// list dropped every word of such a name, so no engine read it and every
// text tied between them ("Turn the light off" between on and off). For
// the label set or attribute they name, these words are content words:
// in its names, descriptions and examples, and in the text read against
// it (readLiterally). A catch-all ("other") is not one: it means that
// nothing else fits, not the word. nil when no name is made so, and then
// every text is read as it always was.
func literalWords(names []string) map[string]struct{} {
	var literal map[string]struct{}
	for _, name := range names {
		if _, catchAll := fallbackNames[strings.ToLower(strings.TrimSpace(name))]; catchAll {
			continue
		}
		terms := analyze(name).terms
		words, functionWords := 0, 0
		for _, t := range terms {
			if t.stem == "?" {
				continue
			}
			words++
			if t.stop {
				functionWords++
			}
		}
		if words == 0 || functionWords < words {
			continue
		}
		if literal == nil {
			literal = make(map[string]struct{})
		}
		for _, t := range terms {
			if t.stop {
				literal[t.word] = struct{}{}
			}
		}
	}
	return literal
}

// readLiterally makes the function words of terms that are in literal
// (see literalWords) content words, in place.
func readLiterally(terms []term, literal map[string]struct{}) {
	if len(literal) == 0 {
		return
	}
	for i := range terms {
		if _, ok := literal[terms[i].word]; ok && terms[i].stop {
			terms[i].stop, terms[i].literal = false, true
		}
	}
}

// analyzeFor analyses text as read against a label set or attribute
// whose literal words are literal.
func analyzeFor(text string, literal map[string]struct{}) doc {
	d := analyze(text)
	readLiterally(d.terms, literal)
	return d
}

// countURLs counts web addresses by their usual starts: http://,
// https:// and a www. not right after one of those.
func countURLs(text string) int {
	n := 0
	for i := 0; i < len(text); i++ {
		c := text[i] | 0x20
		switch {
		case c == 'h' && hasPrefixFold(text[i:], "http://"), c == 'h' && hasPrefixFold(text[i:], "https://"):
			n++
		case c == 'w' && hasPrefixFold(text[i:], "www.") && !(i >= 2 && text[i-2:i] == "//"):
			n++
		}
	}
	return n
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

// isWordMark is config.WordMark: the label checks read words as the
// engines do (config.LabelKey). A function, not a func variable, so that
// scanWord's check of each rune inlines (ASCII text makes no call).
func isWordMark(r rune) bool { return config.WordMark(r) }

// isWordJoiner is config.WordJoiner: inside a word, the engines skip it.
func isWordJoiner(r rune) bool { return config.WordJoiner(r) }

func dropJoiner(r rune) rune {
	if isWordJoiner(r) {
		return -1
	}
	return r
}

// scanWord returns the end of the word starting at start, how many
// hyphen-separated parts it has and whether it holds a joiner
// (isWordJoiner) for the caller to drop.
func scanWord(text string, start int) (end, parts int, joined bool) {
	parts = 1
	i := start
	for i < len(text) {
		r, size := utf8.DecodeRuneInString(text[i:])
		if isWordRune(r) || isWordMark(r) {
			i += size
			continue
		}
		if r >= 0x80 && isWordJoiner(r) {
			// A run of joiners inside a word; after its end they are
			// not the word's.
			j := i + size
			for j < len(text) {
				next, nsize := utf8.DecodeRuneInString(text[j:])
				if !isWordJoiner(next) {
					break
				}
				j += nsize
			}
			if next, _ := utf8.DecodeRuneInString(text[j:]); j < len(text) && (isWordRune(next) || isWordMark(next)) {
				i, joined = j, true
				continue
			}
			break
		}
		// An apostrophe or hyphen joins two word characters.
		if r == '\'' || r == '’' || r == '-' {
			next, nsize := utf8.DecodeRuneInString(text[i+size:])
			if nsize > 0 && isWordRune(next) {
				if r == '-' {
					parts++
				}
				i += size + nsize
				continue
			}
		}
		break
	}
	return i, parts, joined
}

func (d *doc) addWord(word string, parts int, clause int32) {
	caps := isCaps(word)
	lower := normalizeWord(word)
	if isDigits(lower) {
		d.stats.digitWords++
	}
	if hasStretch(lower) {
		d.stats.stretched++
	}
	if parts == 1 {
		d.terms = append(d.terms, newTerm(lower, clause, caps))
		return
	}
	joined := make([]byte, 0, len(lower))
	for p := range strings.SplitSeq(lower, "-") {
		d.terms = append(d.terms, newTerm(p, clause, caps))
		joined = append(joined, p...)
	}
	d.terms = append(d.terms, newTerm(string(joined), clause, caps))
}

func newTerm(lower string, clause int32, caps bool) term {
	_, isStop := stopwords[lower]
	return term{word: lower, stem: stem(lower), clause: clause, caps: caps, stop: isStop}
}

// normalizeWord lower-cases word and writes every apostrophe as '.
func normalizeWord(word string) string {
	ascii := true
	for i := 0; i < len(word); i++ {
		if c := word[i]; c >= utf8.RuneSelf || ('A' <= c && c <= 'Z') {
			ascii = false
			break
		}
	}
	if ascii {
		return word
	}
	return strings.ReplaceAll(strings.ToLower(word), "’", "'")
}

func isCaps(word string) bool {
	letters := 0
	for _, r := range word {
		if unicode.IsLetter(r) {
			if !unicode.IsUpper(r) {
				return false
			}
			letters++
		}
	}
	return letters >= 2
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

func hasStretch(s string) bool {
	run := 1
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] && s[i] >= 'a' && s[i] <= 'z' {
			run++
			if run >= 3 {
				return true
			}
		} else {
			run = 1
		}
	}
	return false
}

// stem strips common English inflections so that charge, charged, charges
// and charging meet. It is deliberately light (no derivational suffixes):
// over-stemming merges unrelated words, and a shared-prefix soft match in
// the scorers covers part of what it leaves apart (deliver, delivery).
func stem(w string) string {
	if len(w) <= 2 || !isASCIILetters(w) {
		if strings.HasSuffix(w, "'s") && len(w) > 2 {
			return stem(w[:len(w)-2])
		}
		return w
	}
	switch {
	case strings.HasSuffix(w, "ies") && len(w) > 4:
		w = w[:len(w)-3] + "y"
	case strings.HasSuffix(w, "sses"):
		w = w[:len(w)-2]
	case strings.HasSuffix(w, "ss"), strings.HasSuffix(w, "us"), strings.HasSuffix(w, "is"):
	case strings.HasSuffix(w, "s") && len(w) >= 4:
		w = w[:len(w)-1]
	}
	switch {
	case strings.HasSuffix(w, "ied") && len(w) > 4:
		w = w[:len(w)-3] + "y"
	case strings.HasSuffix(w, "ing") && hasVowel(w[:len(w)-3]) && len(w) >= 5:
		w = undouble(w[:len(w)-3])
	case strings.HasSuffix(w, "ed") && hasVowel(w[:len(w)-2]) && len(w) >= 4:
		w = undouble(w[:len(w)-2])
	}
	if strings.HasSuffix(w, "ly") && len(w) >= 6 {
		w = w[:len(w)-2]
	}
	if strings.HasSuffix(w, "e") && len(w) >= 3 {
		w = w[:len(w)-1]
	}
	if n := len(w); n >= 4 && w[n-1] == 'y' && !isVowel(w[n-2]) {
		w = w[:n-1] + "i"
	}
	return w
}

func isASCIILetters(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

func isVowel(c byte) bool {
	return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'
}

func hasVowel(s string) bool {
	for i := 0; i < len(s); i++ {
		if isVowel(s[i]) || (s[i] == 'y' && i > 0) {
			return true
		}
	}
	return false
}

// undouble turns "stopp" into "stop" but keeps ll, ss and zz (call, pass).
func undouble(w string) string {
	n := len(w)
	if n >= 3 && w[n-1] == w[n-2] && !isVowel(w[n-1]) && w[n-1] != 'l' && w[n-1] != 's' && w[n-1] != 'z' {
		return w[:n-1]
	}
	return w
}

// softMatch says how far two different stems are the same word: 0.6 when
// one is a prefix of the other or they share a long prefix (deliver and
// deliveri, subscrib and subscript), else 0. Stems shorter than four
// letters never match softly: short prefixes are shared by chance.
func softMatch(a, b string) float64 {
	n := min(len(a), len(b))
	if n < 4 {
		return 0
	}
	common := 0
	for common < n && a[common] == b[common] {
		common++
	}
	if common == n || (common >= 5 && common*4 >= max(len(a), len(b))*3) {
		return 0.6
	}
	return 0
}
