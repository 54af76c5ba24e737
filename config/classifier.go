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

// CheckLabelList checks a list of labels (or tags): at most MaxLabels, at
// least minCount, none empty or without a letter or digit, none twice,
// none that no engine tells apart from another. field names the list.
func CheckLabelList(field string, labels []string, minCount int) []FieldProblem {
	var ps problems
	checkLabelList(&ps, field, labels, minCount)
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
	seen := make(map[string]bool, len(labels))
	// Labels the engines cannot tell apart ("Bug" and "bug", "bug" and
	// "bug.", "feature_request" and "feature request", "café" in NFC and
	// in NFD): every text tied between them, whatever it said.
	folded := make(map[string]string, len(labels))
	for i, l := range labels {
		if ps.full() {
			return
		}
		key := LabelKey(l)
		p := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case Blank(l):
			// Only spaces name nothing an engine can read: it answered
			// such a label as a tie with the others.
			ps.add(FieldProblem{p, p + " is empty"})
		case key == "":
			ps.add(FieldProblem{p, fmt.Sprintf("%s (%q) has no letter or digit: no engine can read it", p, l)})
		case seen[l]:
			ps.add(FieldProblem{p, fmt.Sprintf("%s has %q twice", field, l)})
		case folded[key] != "":
			a, b := fmt.Sprintf("%q", folded[key]), fmt.Sprintf("%q", l)
			if !norm.NFC.IsNormalString(folded[key]) || !norm.NFC.IsNormalString(l) {
				// "café" with a combining accent looks like "café": say
				// which characters differ.
				a, b = fmt.Sprintf("%+q", folded[key]), fmt.Sprintf("%+q", l)
			}
			ps.add(FieldProblem{p,
				fmt.Sprintf("%s has %s and %s, which differ only in case, punctuation, spacing, invisible characters or how an accent is written: no engine tells them apart", field, a, b)})
		}
		seen[l] = true
		if folded[key] == "" {
			folded[key] = l
		}
	}
}

// LabelKey is what the engines read of a label: its words (runs of
// letters and digits and the marks after them, as the lexical engine
// splits a text), lower-cased, in Unicode's composed form (NFC), one
// space apart; "" for a label with no letter or digit. Two labels with
// one key are one label to every engine.
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
	return r >= '\u0300' && unicode.In(r, unicode.Mn, unicode.Mc) && !invisible(r)
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
	isLabel := make(map[string]bool, len(labels))
	for _, l := range labels {
		isLabel[l] = true
	}
	for _, k := range sortedKeys(descriptions) {
		if !isLabel[k] {
			if ps.add(FieldProblem{"descriptions." + k, fmt.Sprintf("descriptions has a key %q that is not a label", k)}); ps.full() {
				return
			}
			continue
		}
		// "" is no description, as an absent one; a blank one was read
		// as none too, but its label set billed as if it said something.
		if d := descriptions[k]; d != "" && Blank(d) {
			if ps.add(FieldProblem{"descriptions." + k, fmt.Sprintf("descriptions of %q holds only whitespace or invisible characters: leave it out, or say in plain words what the label means", k)}); ps.full() {
				return
			}
		}
	}
	for _, k := range sortedKeys(examples) {
		if !isLabel[k] {
			if ps.add(FieldProblem{"examples." + k, fmt.Sprintf("examples has a key %q that is not a label", k)}); ps.full() {
				return
			}
			continue
		}
		for i, e := range examples[k] {
			if Blank(e) {
				if ps.add(FieldProblem{fmt.Sprintf("examples.%s[%d]", k, i), fmt.Sprintf("examples of %q: entry %d is empty", k, i)}); ps.full() {
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
