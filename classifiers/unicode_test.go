package classifiers

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// decomposed is s with every accent written as a combining mark (NFD),
// as macOS file names, some keyboards and some PDFs write it.
func decomposed(s string) string { return norm.NFD.String(s) }

// TestIssueDecomposedTextIsReadAsComposed: the engines read a combining
// accent as the end of a word, so a text in NFD lost its accented words:
// "Please review my résumé before Friday" over résumé and invoice was
// invoice at 0.9981 (the composed text: résumé at 0.9985), the lexical
// engine tied, and open tags named "cafe", which the text does not say.
// Whatever form the text, labels, descriptions, examples, tags, match
// documents and attributes come in, the answer is the composed one's.
func TestIssueDecomposedTextIsReadAsComposed(t *testing.T) {
	classify := []ClassifyRequest{
		{Text: "Please review my résumé before Friday", Labels: []string{"résumé", "invoice"}, Mode: ModeSingle},
		{Text: "Voici ma réclamation concernant la facture", Labels: []string{"réclamation", "question"}, Mode: ModeSingle},
		{Text: "Le café était froid et le pâtisserie rassis", Labels: []string{"café", "hôtel", "other"}, Mode: ModeMulti, Threshold: 0.5,
			Descriptions: map[string]string{"café": "café, thé, pâtisserie"}, Examples: map[string][]string{"hôtel": {"la chambre de l'hôtel était sale"}}},
	}
	tag := []TagRequest{
		{Text: "café café menu", MaxTags: 5},
		{Text: "Le café était froid", Tags: []string{"café", "hôtel"}, MaxTags: 5},
	}
	score := []ScoreRequest{{Source: "Le café était froid", Attribute: "café quality", Description: "how good the café is"}}
	match := []MatchRequest{{Query: "réclamation facture", Source: "Voici ma réclamation concernant la facture"}}
	for _, e := range []Engine{semanticForTest(t), NewLexical()} {
		for _, req := range classify {
			want, err := e.Classify(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			nfd := ClassifyRequest{Text: decomposed(req.Text), Mode: req.Mode, Threshold: req.Threshold,
				Descriptions: map[string]string{}, Examples: map[string][]string{}}
			for _, l := range req.Labels {
				d := decomposed(l)
				nfd.Labels = append(nfd.Labels, d)
				if v, ok := req.Descriptions[l]; ok {
					nfd.Descriptions[d] = decomposed(v)
				}
				for _, ex := range req.Examples[l] {
					nfd.Examples[d] = append(nfd.Examples[d], decomposed(ex))
				}
			}
			// The text alone decomposed, then every part of the request.
			for _, r := range []ClassifyRequest{{Text: nfd.Text, Labels: req.Labels, Descriptions: req.Descriptions, Examples: req.Examples, Mode: req.Mode, Threshold: req.Threshold}, nfd} {
				got, err := e.Classify(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				if got.Tie != want.Tie || norm.NFC.String(got.Label) != want.Label || !sameScores(got.Scores, want.Scores) || !sameScores(got.Labels, want.Labels) {
					t.Errorf("%s: %+q over %+q: %+v, want %+v as for the composed text", e.Name(), r.Text, r.Labels, got, want)
				}
			}
		}
		for _, req := range tag {
			want, err := e.Tag(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			nfd := TagRequest{Text: decomposed(req.Text), MaxTags: req.MaxTags}
			for _, tg := range req.Tags {
				nfd.Tags = append(nfd.Tags, decomposed(tg))
			}
			got, err := e.Tag(ctx, nfd)
			if err != nil {
				t.Fatal(err)
			}
			if len(req.Tags) == 0 {
				// An open tag is a word of the text as it stands, composed.
				if !sameScores(got.Tags, want.Tags) {
					t.Errorf("%s: open tags of %+q: %+v, want %+v", e.Name(), nfd.Text, got.Tags, want.Tags)
				}
				continue
			}
			if len(got.Tags) != len(want.Tags) {
				t.Fatalf("%s: tags of %+q from %+q: %+v, want %+v", e.Name(), nfd.Text, nfd.Tags, got.Tags, want.Tags)
			}
			for i := range got.Tags {
				if got.Tags[i].Label != decomposed(want.Tags[i].Label) || got.Tags[i].Confidence != want.Tags[i].Confidence {
					t.Errorf("%s: tags of %+q from %+q: %+v, want %+v written as sent", e.Name(), nfd.Text, nfd.Tags, got.Tags, want.Tags)
				}
			}
		}
		for _, req := range score {
			want, _ := e.Score(ctx, req)
			got, _ := e.Score(ctx, ScoreRequest{Source: decomposed(req.Source), Attribute: decomposed(req.Attribute), Description: decomposed(req.Description)})
			if got.Score != want.Score || got.NoEvidence != want.NoEvidence {
				t.Errorf("%s: score of %q decomposed: %+v, want %+v", e.Name(), req.Attribute, got, want)
			}
		}
		for _, req := range match {
			want, _ := e.Match(ctx, req)
			got, _ := e.Match(ctx, MatchRequest{Query: decomposed(req.Query), Source: decomposed(req.Source)})
			if got.Score != want.Score || got.NoEvidence != want.NoEvidence {
				t.Errorf("%s: match of %q decomposed: %+v, want %+v", e.Name(), req.Query, got, want)
			}
		}
	}
	open, _ := NewLexical().Tag(ctx, TagRequest{Text: decomposed("café café menu"), MaxTags: 5})
	if len(open.Tags) == 0 || open.Tags[0].Label != "café" {
		t.Errorf("open tags of café café menu decomposed: %+v, want café (composed) first", open.Tags)
	}
}

// sameScores compares labels by their composed form: a label comes back
// as the request wrote it.
func sameScores(a, b []LabelScore) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if norm.NFC.String(a[i].Label) != norm.NFC.String(b[i].Label) || a[i].Confidence != b[i].Confidence {
			return false
		}
	}
	return true
}

// TestIssueVowelSignsArePartOfTheWord: Indic, Thai and Arabic vowels are
// combining marks written after a letter, and a mark ended the word, so
// words fell apart into consonants: "मेरे बाल झड़ रहे हैं" (my hair is
// falling out) was बिल (bill) at 1 over बिल and खाता, बाल and बिल both
// read "ब ल"; open tags named fragments such as द and ल, Thai นเง and
// Arabic الط, none of them a word of the text.
func TestIssueVowelSignsArePartOfTheWord(t *testing.T) {
	hair := norm.NFC.String("मेरे बाल झड़ रहे हैं")
	for _, e := range []Engine{semanticForTest(t), NewLexical()} {
		res, err := e.Classify(ctx, ClassifyRequest{Text: hair, Labels: []string{"बिल", "खाता"}, Mode: ModeSingle})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Tie {
			t.Errorf("%s: %q over बिल and खाता: %+v, want a tie: neither is a word of it", e.Name(), hair, res)
		}
		res, _ = e.Classify(ctx, ClassifyRequest{Text: hair, Labels: []string{"बिल", "बाल"}, Mode: ModeSingle})
		if res.Tie || res.Label != "बाल" {
			t.Errorf("%s: %q over बिल and बाल: %+v, want बाल, a word of it", e.Name(), hair, res)
		}
		for _, text := range []string{
			hair,
			norm.NFC.String("दिन भर दान की बात हुई, लेकिन धनवान चुप रहे"),
			"ฉันต้องการเงินคืน กรุณาคืนเงินให้ฉัน",
			"الطَّالِبُ كَتَبَ الدَّرْسَ فِي الكِتَابِ",
		} {
			tags, err := e.Tag(ctx, TagRequest{Text: text, MaxTags: 10})
			if err != nil {
				t.Fatal(err)
			}
			if len(tags.Tags) == 0 {
				t.Errorf("%s: no open tags for %q", e.Name(), text)
			}
			for _, tg := range tags.Tags {
				if !wholeWordOf(text, tg.Label) {
					t.Errorf("%s: open tag %q of %q is not a word of it", e.Name(), tg.Label, text)
				}
			}
		}
	}
}

// wholeWordOf reports whether word is in text, neither started nor ended
// inside a word: no letter or mark right before it, none right after.
func wholeWordOf(text, word string) bool {
	inWord := func(r rune) bool { return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r) }
	for i := 0; ; {
		j := strings.Index(text[i:], word)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(word)
		before, _ := utf8.DecodeLastRuneInString(text[:start])
		after, _ := utf8.DecodeRuneInString(text[end:])
		if (start == 0 || !inWord(before)) && (end == len(text) || !inWord(after)) {
			return true
		}
		i = start + 1
	}
}

// TestIssueSoftHyphensLeaveWordsWhole: a soft hyphen or a zero-width
// joiner inside a word, as text copied from web pages has, ended the
// word: "I need a re\u00adfund for my or\u00adder" over refund, shipping
// and other was other at 0.66, and open tags named "ton" and "fari" for
// "but\u00adton" and "Sa\u200dfari". The engines now read the words
// whole, as Unicode's word boundaries do; a zero-width space still ends
// one.
func TestIssueSoftHyphensLeaveWordsWhole(t *testing.T) {
	labels := []string{"refund", "shipping", "other"}
	for _, e := range []Engine{semanticForTest(t), NewLexical()} {
		plain, err := e.Classify(ctx, ClassifyRequest{Text: "I need a refund for my order", Labels: labels, Mode: ModeSingle})
		if err != nil {
			t.Fatal(err)
		}
		for _, text := range []string{"I need a re\u00adfund for my or\u00adder", "I need a re\u200dfund\u00ad for my or\u2060\u00adder"} {
			res, err := e.Classify(ctx, ClassifyRequest{Text: text, Labels: labels, Mode: ModeSingle})
			if err != nil {
				t.Fatal(err)
			}
			if res.Label != plain.Label || res.Confidence != plain.Confidence || res.Tie != plain.Tie {
				t.Errorf("%s: %+q: %s at %v (tie %v), want %s at %v as without the joiners", e.Name(), text, res.Label, res.Confidence, res.Tie, plain.Label, plain.Confidence)
			}
		}
		tags, err := e.Tag(ctx, TagRequest{Text: "The ex\u00adport but\u00adton does nothing on Sa\u200dfari", MaxTags: 10})
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range tags.Tags {
			if tg.Label == "ton" || tg.Label == "fari" || tg.Label == "port" || tg.Label == "ex" {
				t.Errorf("%s: open tag %q, a piece of a word", e.Name(), tg.Label)
			}
		}
		res, _ := e.Classify(ctx, ClassifyRequest{Text: "re\u200bfund", Labels: []string{"refund", "fund"}, Mode: ModeSingle})
		if res.Tie || res.Label != "fund" {
			t.Errorf("%s: re, a zero-width space and fund over refund and fund: %+v, want fund: the space ends a word", e.Name(), res)
		}
	}
}
