package classifiers

import (
	"context"
	"math"
	"slices"
	"testing"
)

// A label that negates another of its set is that label's complement:
// until the release after 2026-11-27 "spam" and "not spam" (or "no
// spam", "non-spam") tied on every text, or both applied in multi mode.
// The texts were written for this test.
func TestNegatedLabelIsTheComplement(t *testing.T) {
	engines := []Engine{semanticForTest(t), NewLexical()}
	cases := []struct {
		base, negation string
		others         []string
		text, want     string
	}{
		{"spam", "not spam", nil, "Another spam message slipped through the filter today, delete it", "spam"},
		{"spam", "not spam", nil, "zzqx blorf", "not spam"},
		{"spam", "no spam", nil, "Another spam message slipped through the filter today, delete it", "spam"},
		{"spam", "non-spam", nil, "zzqx blorf", "non-spam"},
		{"Spam", "not_spam", []string{"billing"}, "Another spam message slipped through the filter today, delete it", "Spam"},
		{"Spam", "not_spam", []string{"billing"}, "zzqx blorf", "not_spam"},
		{"urgent", "Not Urgent", nil, "This is urgent: the warehouse door will not lock", "urgent"},
		{"urgent", "Not Urgent", nil, "zzqx blorf", "Not Urgent"},
	}
	for _, e := range engines {
		for _, c := range cases {
			labels := append([]string{c.negation, c.base}, c.others...)
			single, err := e.Classify(context.Background(), ClassifyRequest{Text: c.text, Labels: labels, Mode: ModeSingle})
			if err != nil {
				t.Fatal(err)
			}
			if single.Label != c.want || single.Tie {
				t.Errorf("%s %q over %q: %s at %v (tie %v), want %s without a tie", e.Name(), c.text, labels, single.Label, single.Confidence, single.Tie, c.want)
			}
			for _, threshold := range []float64{0, 0.5} {
				multi, err := e.Classify(context.Background(), ClassifyRequest{Text: c.text, Labels: labels, Mode: ModeMulti, Threshold: threshold})
				if err != nil {
					t.Fatal(err)
				}
				var applies []string
				for _, l := range multi.Labels {
					if l.Label == c.base || l.Label == c.negation {
						applies = append(applies, l.Label)
					}
				}
				if !slices.Equal(applies, []string{c.want}) {
					t.Errorf("%s %q over %q in multi mode at threshold %v: %q apply, want exactly %s", e.Name(), c.text, labels, threshold, applies, c.want)
				}
				if sum := confidenceOf(multi.Scores, c.base) + confidenceOf(multi.Scores, c.negation); math.Abs(sum-1) > 1e-4 {
					t.Errorf("%s %q over %q in multi mode: %s and %s add up to %v, want 1: %v", e.Name(), c.text, labels, c.base, c.negation, sum, multi.Scores)
				}
			}
			tags, err := e.Tag(context.Background(), TagRequest{Text: c.text, Tags: labels, Threshold: 0})
			if err != nil {
				t.Fatal(err)
			}
			var tagged []string
			for _, tag := range tags.Tags {
				if tag.Label == c.base || tag.Label == c.negation {
					tagged = append(tagged, tag.Label)
				}
			}
			if !slices.Equal(tagged, []string{c.want}) {
				t.Errorf("%s %q tagged from %q at threshold 0: %q, want exactly %s", e.Name(), c.text, labels, tagged, c.want)
			}
		}
	}
}

func confidenceOf(scores []LabelScore, label string) float64 {
	for _, s := range scores {
		if s.Label == label {
			return s.Confidence
		}
	}
	return math.NaN()
}

// Only an explicit negation word before another label of the set makes
// a complement; the rest are labels as any other.
func TestNegatedLabelsNeedTheirBaseLabel(t *testing.T) {
	for _, c := range []struct {
		labels []string
		want   []int
	}{
		{[]string{"spam", "ham"}, nil},
		{[]string{"not spam", "billing"}, nil},                     // nothing to negate
		{[]string{"nothing", "thing"}, nil},                        // a word, not a negation
		{[]string{"none", "one"}, nil},                             // a catch-all
		{[]string{"unpaid", "paid"}, nil},                          // a prefix, not a word
		{[]string{"no", "yes"}, nil},                               // an answer, negating nothing
		{[]string{"not not spam", "not spam"}, nil},                // the complement of no label here
		{[]string{"non-spam", "spam"}, []int{1, -1}},               // hyphen
		{[]string{"NOT_SPAM", "Spam"}, []int{1, -1}},               // case and underscore
		{[]string{"no spam", "not spam", "spam"}, []int{2, 2, -1}}, // two ways to say it
	} {
		if got := negatedLabels(c.labels); !slices.Equal(got, c.want) {
			t.Errorf("negatedLabels(%q) = %v, want %v", c.labels, got, c.want)
		}
	}
}
