package config

import (
	"fmt"
	"sort"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"

	"github.com/tollgate/tollgate/internal/utf8cut"
)

// Rules shared by saved classifiers (here) and classify requests (the
// plugins), so a saved classifier is exactly as valid as the request it
// stands for.
const (
	// MaxLabels bounds the labels of one classification (spec: 1 to 200).
	MaxLabels = 200
	// DefaultThreshold is the multi-mode confidence threshold.
	DefaultThreshold = 0.5
	// ThresholdRange words a threshold's valid values, in every refusal
	// of one (a request's -1 and 1e400, a saved classifier's 1.5).
	ThresholdRange = "a number between 0 and 1"
	ModeSingle     = "single"
	ModeMulti      = "multi"
	// MaxLabelSetBytes bounds the text of a label set (labels,
	// descriptions and examples, or tags), as a batch job keeps it: a set
	// of megabytes was compiled again for every call (not cached),
	// seconds of CPU each.
	MaxLabelSetBytes = 256 << 10
)

// FieldProblem is one invalid field. Field is its path relative to the
// request or classifier ("labels[3]", "descriptions.x"), for placing the
// problem; Msg is a sentence that names the field itself.
type FieldProblem struct {
	Field, Msg string
}

// CheckLabelList checks a list of labels (or tags) as every engine needs
// it: at most MaxLabels, at least minCount, none empty, none twice (in
// either Unicode form). field names the list. What only the offline
// engines need is OfflineLabelProblems'.
func CheckLabelList(field string, labels []string, minCount int) []FieldProblem {
	var ps problems
	checkLabelList(&ps, field, labels, minCount)
	return ps.list
}

// OfflineLabelProblems checks a list of labels (or tags) that passed
// CheckLabelList for the offline engines (semantic and lexical), which
// read a label's words only (LabelKey): each must have a letter or
// digit, and none may read as another ("C" and "C++", "Bug" and
// "bug!"), or every text ties between them. The llm engine reads a
// label as written, and is held to none of it: "C", "C++" and "C#" are
// three languages to a model. field names the list, advice says how to
// have the llm answer instead ("send \"model\": \"llm\""), and max
// bounds the problems (0: all).
func OfflineLabelProblems(field string, labels []string, advice string, max int) []FieldProblem {
	ps := problems{max: max}
	folded := make(map[string]string, len(labels))
	for i, l := range labels {
		if ps.full() {
			break
		}
		key := LabelKey(l)
		switch first := folded[key]; {
		case Blank(l):
			// Refused by CheckLabelList for every engine.
		case key == "":
			p := fmt.Sprintf("%s[%d]", field, i)
			ps.add(FieldProblem{p, fmt.Sprintf("%s (%s) has no letter or digit: the offline engines (semantic and lexical) read only words and find none in it; the llm engine reads it as written (%s)", p, quoteName(l), advice)})
		case first != "" && norm.NFC.String(first) != norm.NFC.String(l):
			a, b := quoteNames(first, l)
			ps.add(FieldProblem{fmt.Sprintf("%s[%d]", field, i),
				fmt.Sprintf("%s has %s and %s, which differ only in case, spacing, punctuation, symbols or invisible characters: the offline engines (semantic and lexical) read only words and do not tell them apart; the llm engine does (%s)", field, a, b, advice)})
		case first == "":
			folded[key] = l
		}
	}
	return ps.list
}

// problems collects FieldProblems, up to max of them (0: all). A request
// is refused with its first problem: the checks stop there instead of
// sorting, walking and wording the rest (an anonymous body of 400,000
// keys took 2 s of CPU for its 400).
type problems struct {
	list []FieldProblem
	max  int
}

func (ps *problems) add(p ...FieldProblem) { ps.list = append(ps.list, p...) }

// full reports whether no more problems are wanted.
func (ps *problems) full() bool { return ps.max > 0 && len(ps.list) >= ps.max }

func checkLabelList(ps *problems, field string, labels []string, minCount int) {
	if len(labels) < minCount || len(labels) > MaxLabels {
		ps.add(FieldProblem{field, fmt.Sprintf("%s must have %d to %d entries, got %d", field, minCount, MaxLabels, len(labels))})
	}
	// seen holds each label by its composed form (NFC): "café" precomposed
	// and with a combining accent are one text to Unicode, one label.
	seen := make(map[string]string, len(labels))
	for i, l := range labels {
		if ps.full() {
			return
		}
		composed := norm.NFC.String(l)
		p := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case Blank(l):
			// Only spaces name nothing an engine can read: it answered
			// such a label as a tie with the others.
			ps.add(FieldProblem{p, p + " is empty"})
		case seen[composed] == l:
			ps.add(FieldProblem{p, fmt.Sprintf("%s has %q twice", field, l)})
		case seen[composed] != "":
			ps.add(FieldProblem{p, fmt.Sprintf("%s has %+q and %+q, one text written two ways (an accent as one character, and as a letter and a combining mark): send it once", field, seen[composed], l)})
		}
		if seen[composed] == "" {
			seen[composed] = l
		}
	}
}

// quoteName quotes a name for a message as quoteNames does.
func quoteName(s string) string {
	if norm.NFC.IsNormalString(s) {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%+q", s)
}

// quoteNames quotes two names for a message, each as %q does, or both
// as %+q (every character past ASCII escaped) when one is not composed
// (NFC): "café" with a combining accent looks like "café", and the
// escapes show which characters differ.
func quoteNames(a, b string) (string, string) {
	if norm.NFC.IsNormalString(a) && norm.NFC.IsNormalString(b) {
		return fmt.Sprintf("%q", a), fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("%+q", a), fmt.Sprintf("%+q", b)
}

// LabelKey is what the offline engines read of a label: its words (runs
// of letters and digits and the marks after them, as the lexical engine
// splits a text), lower-cased, in Unicode's composed form (NFC), one
// space apart; "" for a label with no letter or digit. Two labels with
// one key are one label to the offline engines.
func LabelKey(l string) string {
	var b strings.Builder
	inWord := false
	for _, r := range strings.ToLower(norm.NFC.String(l)) {
		switch {
		case (unicode.IsLetter(r) || unicode.IsDigit(r)) && !invisible(r):
			if !inWord && b.Len() > 0 {
				b.WriteByte(' ')
			}
			inWord = true
		case inWord && WordMark(r):
		case inWord && WordJoiner(r):
			continue
		default:
			inWord = false
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// WordMark reports whether r, after a letter or digit, is part of its
// word: a combining mark that shows, such as an accent no precomposed
// letter has, an Indic or Thai vowel sign or an Arabic vowel mark. Read
// as a break, it cut "बाल" (hair) and "बिल" (bill) alike into "ब ल".
// Enclosing marks (the keycap of "1⃣") make a symbol of their letter,
// not a word.
func WordMark(r rune) bool {
	// Small enough to inline: a word's reader asks it of every rune that
	// is not a letter or digit, and below U+0300 (all of ASCII) that is
	// one comparison, with no call.
	return r >= '\u0300' && isMark(r)
}

func isMark(r rune) bool { return unicode.In(r, unicode.Mn, unicode.Mc) && !invisible(r) }

// WordJoiner reports whether r, inside a word, leaves the word whole and
// is not part of it: a format character that Unicode's word boundaries
// skip (UAX #29, rule WB4), such as a soft hyphen, a word joiner, a
// zero-width joiner or non-joiner or a direction mark, or a variation
// selector. Read as a break, a soft hyphen copied from a web page cut
// "re\u00adfund" into "re" and "fund". U+200B ZERO WIDTH SPACE stays a
// break, as its name and UAX #29 have it.
func WordJoiner(r rune) bool {
	return r != '\u200b' && unicode.In(r, unicode.Cf, unicode.Variation_Selector)
}

// Blank reports whether s is empty or holds only white space and
// invisible characters (controls such as NUL, zero-width and other
// format characters such as U+200B): no text for an engine to read,
// which it answered as a tie or a floor that read like a verdict.
func Blank(s string) bool {
	for _, r := range s {
		if !unicode.IsSpace(r) && !invisible(r) {
			return false
		}
	}
	return true
}

// invisible reports whether r shows nothing: a control or format
// character, one Unicode says to ignore where it cannot be shown (the
// Hangul fillers, which count as letters, the combining grapheme
// joiner), a variation selector, or the blank braille pattern.
func invisible(r rune) bool {
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector) || r == '\u2800'
}

// CheckTextBytes holds a text field to plugins.max_text_bytes.
func CheckTextBytes(field, v string, maxTextBytes ByteSize) []FieldProblem {
	if int64(len(v)) <= int64(maxTextBytes) {
		return nil
	}
	return []FieldProblem{{field, fmt.Sprintf("%s is %d bytes, longer than plugins.max_text_bytes (%d bytes)", field, len(v), maxTextBytes)}}
}

// CheckClassification checks everything of a classification but its text,
// its sizes against maxTextBytes (plugins.max_text_bytes) last. Mode ""
// stands for single.
func CheckClassification(cl Classifier, maxTextBytes ByteSize) []FieldProblem {
	ps := problems{}
	checkClassification(&ps, cl, maxTextBytes)
	return ps.list
}

// FirstClassificationProblem is CheckClassification's first problem
// alone, or none, found without looking for the others: what a request
// is refused with.
func FirstClassificationProblem(cl Classifier, maxTextBytes ByteSize) []FieldProblem {
	ps := problems{max: 1}
	checkClassification(&ps, cl, maxTextBytes)
	return ps.list
}

func checkClassification(ps *problems, cl Classifier, maxTextBytes ByteSize) {
	labels, descriptions, examples, mode, threshold := cl.Labels, cl.Descriptions, cl.Examples, cl.Mode, cl.Threshold
	if checkLabelList(ps, "labels", labels, 1); ps.full() {
		return
	}
	// A key names the label it is in either Unicode form, as the label
	// checks read labels: {"cafe\u0301": …} describes "café".
	label := make(map[string]string, len(labels))
	for _, l := range labels {
		label[norm.NFC.String(l)] = l
	}
	// keyOf reports whether k, a key of field, names a label, and one no
	// other key named (named: label -> key); if not, it adds the problem.
	keyOf := func(field string, named map[string]string, k string) bool {
		l, ok := label[norm.NFC.String(k)]
		switch {
		case !ok:
			ps.add(FieldProblem{field + "." + k, fmt.Sprintf("%s has a key %s that is not a label", field, quoteName(k))})
			return false
		case named[l] != "":
			a, b := quoteNames(named[l], k)
			ps.add(FieldProblem{field + "." + k, fmt.Sprintf("%s has keys %s and %s, one label written two ways (an accent as one character, and as a letter and a combining mark): send it once", field, a, b)})
			return false
		}
		named[l] = k
		return true
	}
	described := make(map[string]string, len(labels))
	for _, k := range sortedKeys(descriptions) {
		if !keyOf("descriptions", described, k) {
			if ps.full() {
				return
			}
			continue
		}
		// "" is no description, as an absent one; a blank one was read
		// as none too, but its label set billed as if it said something.
		if d := descriptions[k]; d != "" && Blank(d) {
			if ps.add(FieldProblem{"descriptions." + k, fmt.Sprintf("descriptions of %s holds only whitespace or invisible characters: leave it out, or say in plain words what the label means", quoteName(k))}); ps.full() {
				return
			}
		}
	}
	exemplified := make(map[string]string, len(labels))
	for _, k := range sortedKeys(examples) {
		if !keyOf("examples", exemplified, k) {
			if ps.full() {
				return
			}
			continue
		}
		for i, e := range examples[k] {
			if Blank(e) {
				if ps.add(FieldProblem{fmt.Sprintf("examples.%s[%d]", k, i), fmt.Sprintf("examples of %s: entry %d is empty", quoteName(k), i)}); ps.full() {
					return
				}
			}
		}
	}
	if cl.TextType != "" && Blank(cl.TextType) && !ps.full() {
		ps.add(FieldProblem{"text_type", "text_type holds only whitespace or invisible characters: leave it out, or name what the texts are (support ticket, product review)"})
	}
	if mode != "" && mode != ModeSingle && mode != ModeMulti && !ps.full() {
		ps.add(FieldProblem{"mode", fmt.Sprintf("mode must be single or multi, got %q", utf8cut.Shorten(mode, 200))})
	}
	if !(threshold >= 0 && threshold <= 1) && !ps.full() { // also refuses NaN
		ps.add(FieldProblem{"threshold", fmt.Sprintf("threshold must be %s, got %v", ThresholdRange, threshold)})
	}
	// Each label, description and example is a text too, held to the
	// same bound (gateway.yaml says so), and the whole set to
	// MaxLabelSetBytes.
	// The field's path is worded only for a text too long: a label set
	// may hold hundreds of thousands of short examples.
	tooLong := func(v string) bool { return int64(len(v)) > int64(maxTextBytes) }
	descriptions, examples = ByLabel(labels, descriptions), ByLabel(labels, examples)
	total := 0
	for i, l := range labels {
		if ps.full() {
			return
		}
		if tooLong(l) {
			ps.add(CheckTextBytes(fmt.Sprintf("labels[%d]", i), l, maxTextBytes)...)
		}
		total += len(l)
	}
	counted := make(map[string]bool, len(labels))
	for _, l := range labels {
		if counted[l] {
			continue // a label twice is refused above
		}
		counted[l] = true
		if ps.full() {
			return
		}
		ps.add(CheckTextBytes("descriptions."+l, descriptions[l], maxTextBytes)...)
		total += len(descriptions[l])
		for i, e := range examples[l] {
			if ps.full() {
				return
			}
			if tooLong(e) {
				ps.add(CheckTextBytes(fmt.Sprintf("examples.%s[%d]", l, i), e, maxTextBytes)...)
			}
			total += len(e)
		}
	}
	if ps.full() {
		return
	}
	if total > MaxLabelSetBytes {
		ps.add(FieldProblem{"labels", fmt.Sprintf("labels, descriptions and examples take %d bytes; at most %d are accepted (as a batch job keeps)", total, MaxLabelSetBytes)})
	}
	ps.add(CheckTextBytes("text_type", cl.TextType, maxTextBytes)...)
}

// ByLabel is m, a label set's descriptions or examples, keyed by its
// labels as they are written: a key that names a label in the other
// Unicode form (NFD for NFC) is moved to the label's spelling, which the
// engines look it up by. m itself when no key needs moving, as for any
// composed set.
func ByLabel[V any](labels []string, m map[string]V) map[string]V {
	if len(m) == 0 || allComposed(labels, m) {
		return m
	}
	spelling := make(map[string]string, len(labels))
	for _, l := range labels {
		spelling[norm.NFC.String(l)] = l
	}
	out := make(map[string]V, len(m))
	for k, v := range m {
		if l, ok := spelling[norm.NFC.String(k)]; ok {
			k = l
		}
		out[k] = v
	}
	return out
}

// Composed reports whether s is in composed form (NFC) by the quick
// check, which costs no allocation; a text it cannot tell about counts
// as not composed, and composing it gives it back as it is.
func Composed(s string) bool { return norm.NFC.QuickSpanString(s) == len(s) }

// allComposed reports whether every label and key of m is Composed.
func allComposed[V any](labels []string, m map[string]V) bool {
	for _, l := range labels {
		if !Composed(l) {
			return false
		}
	}
	for k := range m {
		if !Composed(k) {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ClassifierNames lists the saved classifiers, sorted.
func (c *Config) ClassifierNames() []string { return sortedKeys(c.Classifiers) }
