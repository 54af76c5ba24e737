package classifiers

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/tokens"
)

var ctx = context.Background()

func score(t *testing.T, attribute, text string) float64 {
	t.Helper()
	r, err := NewLexical().Score(ctx, ScoreRequest{Source: text, Attribute: attribute})
	if err != nil {
		t.Fatal(err)
	}
	if r.Engine != "lexical" || r.Model != "" {
		t.Errorf("answer %+v, want engine lexical and no model", r.Answer)
	}
	if r.Score < 0 || r.Score > 1 {
		t.Fatalf("%s(%q) = %v, outside [0,1]", attribute, text, r.Score)
	}
	return r.Score
}

func TestLexicalScoresClearCases(t *testing.T) {
	cases := []struct {
		attribute, text string
		low, high       float64 // the score must lie in [low, high]
	}{
		{"sentiment", "I love this, it's wonderful", 0.7, 1},
		{"sentiment", "This ruined my weekend, a total waste of money.", 0, 0.3},
		{"sentiment", "The package is grey.", 0.4, 0.6},
		{"toxicity", "You are a pathetic idiot, shut up.", 0.7, 1},
		{"toxicity", "Have a lovely evening", 0, 0.2},
		{"toxicity", "I really dislike rainy weather", 0, 0.2},
		{"spam", "WIN A FREE PRIZE click now", 0.7, 1},
		{"spam", "Lunch at noon with the team?", 0, 0.2},
		{"urgency", "URGENT: server down, need help immediately", 0.7, 1},
		{"urgency", "Take your time, no hurry.", 0, 0.15},
		{"formality", "Dear Ms Lee, I write to confirm our appointment. Kind regards.", 0.7, 1},
		{"formality", "lol ok cya", 0, 0.3},
		{"quality", "The library supports streaming, retries with backoff and per-request timeouts, documented with runnable examples.", 0.6, 1},
		{"quality", "nice nice nice!!!", 0, 0.2},
	}
	for _, c := range cases {
		if s := score(t, c.attribute, c.text); s < c.low || s > c.high {
			t.Errorf("%s(%q) = %.3f, want within [%v, %v]", c.attribute, c.text, s, c.low, c.high)
		}
	}
}

func TestLexicalNegationAndIntensifiers(t *testing.T) {
	urgent := score(t, "urgency", "This is urgent.")
	notUrgent := score(t, "urgency", "This is not urgent.")
	veryUrgent := score(t, "urgency", "This is very urgent.")
	if !(notUrgent < urgent && urgent < veryUrgent) {
		t.Errorf("urgency: not urgent %.3f, urgent %.3f, very urgent %.3f; want increasing", notUrgent, urgent, veryUrgent)
	}
	// Negation does not reach across a clause.
	if s := score(t, "urgency", "Not sure why, but this is urgent."); s < urgent-1e-9 {
		t.Errorf("negation crossed a comma: %.3f < %.3f", s, urgent)
	}
	// An insult aimed at someone is worse than the same word alone.
	if aimed, alone := score(t, "toxicity", "you are stupid"), score(t, "toxicity", "stupid rules"); aimed <= alone {
		t.Errorf("toxicity: aimed %.3f <= alone %.3f", aimed, alone)
	}
}

func TestLexicalAttributeAliasesAndUnknownAttributes(t *testing.T) {
	if pos, neg := score(t, "positivity", "What a wonderful day"), score(t, "negativity", "What a wonderful day"); pos < 0.7 || neg > 0.3 {
		t.Errorf("positivity %.3f, negativity %.3f", pos, neg)
	}
	if s := score(t, "offensiveness", "you are a moron"); s < 0.7 {
		t.Errorf("offensiveness of an insult = %.3f", s)
	}
	e := NewLexical()
	about := func(text string) float64 {
		r, err := e.Score(ctx, ScoreRequest{Source: text, Attribute: "cooking", Description: "recipes, ingredients, baking and kitchen techniques"})
		if err != nil {
			t.Fatal(err)
		}
		return r.Score
	}
	on, off := about("Knead the dough and let the ingredients rest before baking."), about("The train was delayed by snow.")
	if on <= off || off != 0 {
		t.Errorf("unknown attribute: on-topic %.3f, off-topic %.3f", on, off)
	}
}

func TestLexicalMatchRanksRelevantHigher(t *testing.T) {
	e := NewLexical()
	m := func(q, d string) float64 {
		r, err := e.Match(ctx, MatchRequest{Query: q, Source: d})
		if err != nil {
			t.Fatal(err)
		}
		return r.Score
	}
	q := "reset my password"
	relevant := m(q, "To reset your password, open Settings and choose Security.")
	partial := m(q, "Passwords must be at least twelve characters long.")
	unrelated := m(q, "Our store opens at nine on weekdays.")
	if !(relevant > partial && partial > unrelated) || unrelated != 0 || relevant < 0.6 {
		t.Errorf("relevant %.3f, partial %.3f, unrelated %.3f", relevant, partial, unrelated)
	}
	// A question mark in the query is no word to look for.
	if asked := m(q+"?", "To reset your password, open Settings and choose Security."); asked != relevant {
		t.Errorf("with a question mark %.3f, without %.3f", asked, relevant)
	}
	// A query of function words only still matches on them.
	if s := m("what is it", "What is it? It is a fox."); s == 0 {
		t.Errorf("stopword-only query scored 0")
	}
}

func TestLexicalClassifySingle(t *testing.T) {
	e := NewLexical()
	req := ClassifyRequest{
		Text:   "The export button throws an error every time",
		Labels: []string{"feature request", "bug", "other"},
		Descriptions: map[string]string{
			"bug":             "something is broken, crashes or shows an error",
			"feature request": "asks for new functionality",
		},
	}
	r, err := e.Classify(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if r.Label != "bug" || r.Confidence < 0.5 || r.Scores[0].Label != "bug" || len(r.Labels) != 0 {
		t.Errorf("result %+v", r)
	}
	var sum float64
	for i, s := range r.Scores {
		sum += s.Confidence
		if i > 0 && s.Confidence > r.Scores[i-1].Confidence {
			t.Errorf("scores not sorted: %+v", r.Scores)
		}
	}
	if math.Abs(sum-1) > 1e-3 || len(r.Scores) != 3 {
		t.Errorf("single-mode scores sum to %v over %d labels", sum, len(r.Scores))
	}
	want := int64(tokens.Count(req.Text) + tokens.Count(labelBlock(req.Labels, req.Descriptions, req.Examples)))
	if r.Engine != "lexical" || r.Usage != (Usage{PromptTokens: want, TotalTokens: want}) {
		t.Errorf("answer %+v, want %d prompt tokens", r.Answer, want)
	}

	// Nothing matches: the catch-all label wins.
	req.Text = "Do you sponsor the marathon?"
	if r, _ := e.Classify(ctx, req); r.Label != "other" {
		t.Errorf("unrelated text went to %q: %+v", r.Label, r.Scores)
	}
	// Sentiment labels use the sentiment lexicon.
	r, _ = e.Classify(ctx, ClassifyRequest{Text: "Broke after a day. Awful.", Labels: []string{"positive", "negative", "neutral"}})
	if r.Label != "negative" {
		t.Errorf("sentiment label %q: %+v", r.Label, r.Scores)
	}
	if _, err := e.Classify(ctx, ClassifyRequest{Text: "x"}); !errors.Is(err, ErrNoLabels) {
		t.Errorf("no labels: %v", err)
	}
}

func TestLexicalClassifyMultiThreshold(t *testing.T) {
	e := NewLexical()
	req := ClassifyRequest{
		Text:   "The invoice was wrong and the parcel arrived late",
		Labels: []string{"billing", "delivery", "login"},
		Descriptions: map[string]string{
			"billing":  "invoice, payment, refund",
			"delivery": "parcel, courier, shipping",
			"login":    "password, sign in",
		},
		Mode:      ModeMulti,
		Threshold: 0.5,
	}
	r, err := e.Classify(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, l := range r.Labels {
		got[l.Label] = true
		if l.Confidence < 0.5 {
			t.Errorf("label %+v below the threshold", l)
		}
	}
	if !got["billing"] || !got["delivery"] || got["login"] || r.Label != "" || len(r.Scores) != 3 {
		t.Errorf("multi result %+v", r)
	}
	// Threshold 0 returns every label with evidence; login shares no word
	// with the text, so it is not returned as if it matched.
	req.Threshold = 0
	if r, _ := e.Classify(ctx, req); len(r.Labels) != 2 || len(r.Scores) != 3 {
		t.Errorf("threshold 0 returned %+v", r)
	}
	req.Threshold = 1
	if r, _ := e.Classify(ctx, req); len(r.Labels) != 0 {
		t.Errorf("threshold 1 returned %+v", r.Labels)
	}
}

func TestLexicalTags(t *testing.T) {
	e := NewLexical()
	r, err := e.Tag(ctx, TagRequest{Text: "Kubernetes pods keep restarting after the Helm upgrade; the pods log OOM errors.", MaxTags: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Tags) != 3 || r.Tags[0].Label != "pods" {
		t.Fatalf("open tags %+v", r.Tags)
	}
	for i, tg := range r.Tags {
		if tg.Confidence <= 0 || tg.Confidence >= 1 || (i > 0 && tg.Confidence > r.Tags[i-1].Confidence) {
			t.Errorf("open tags %+v", r.Tags)
		}
	}
	r, err = e.Tag(ctx, TagRequest{Text: "Billing question about my invoice", Tags: []string{"billing", "shipping", "invoice"}, MaxTags: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Tags) != 1 || (r.Tags[0].Label != "billing" && r.Tags[0].Label != "invoice") {
		t.Errorf("closed tags %+v", r.Tags)
	}
	r, _ = e.Tag(ctx, TagRequest{Text: "Nothing relevant here", Tags: []string{"billing"}, Threshold: DefaultTagThreshold})
	if r.Tags == nil || len(r.Tags) != 0 {
		t.Errorf("closed tags without a match: %#v, want an empty list", r.Tags)
	}
}

func TestLexicalIsDeterministicAndSafeForConcurrentUse(t *testing.T) {
	e := NewLexical()
	req := ClassifyRequest{Text: "refund my order please", Labels: []string{"billing", "shipping", "other"},
		Descriptions: map[string]string{"billing": "refunds and payments", "shipping": "orders and delivery"}}
	first, _ := e.Classify(ctx, req)
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				r, _ := e.Classify(ctx, req)
				if !reflect.DeepEqual(r, first) {
					errs <- "classify changed"
				}
				s, _ := e.Score(ctx, ScoreRequest{Source: req.Text, Attribute: "sentiment"})
				s2, _ := e.Score(ctx, ScoreRequest{Source: req.Text, Attribute: "sentiment"})
				if s != s2 {
					errs <- "score changed"
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

func TestLexicalHonoursCanceledContext(t *testing.T) {
	c, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := NewLexical().Match(c, MatchRequest{Query: "a", Source: "b"}); !errors.Is(err, context.Canceled) {
		t.Errorf("err %v", err)
	}
}

func TestStem(t *testing.T) {
	same := [][]string{
		{"charge", "charged", "charges", "charging"},
		{"delivery", "deliveries"},
		{"crash", "crashes", "crashed", "crashing"},
		{"stop", "stopped", "stopping"},
		{"happy", "happily"},
		{"use", "used", "using"},
		{"courier", "courier's"},
	}
	for _, group := range same {
		for _, w := range group[1:] {
			if stem(w) != stem(group[0]) {
				t.Errorf("stem(%q) = %q, stem(%q) = %q", w, stem(w), group[0], stem(group[0]))
			}
		}
	}
	if stem("business") != "business" || stem("status") != "status" || stem("thing") != "thing" {
		t.Errorf("over-stemmed: %q %q %q", stem("business"), stem("status"), stem("thing"))
	}
}

func TestAnalyze(t *testing.T) {
	d := analyze("URGENT: Wi-Fi is DOWN!! Don't wait, see https://x.io?")
	var words []string
	for _, tm := range d.terms {
		words = append(words, tm.word)
	}
	want := []string{"urgent", "wi", "fi", "wifi", "is", "down", "don't", "wait", "see", "https", "x", "io", "?"}
	if !reflect.DeepEqual(words, want) {
		t.Errorf("words %q, want %q", words, want)
	}
	if !d.terms[0].caps || d.terms[1].caps || !d.terms[5].caps {
		t.Errorf("caps flags wrong: %+v", d.terms[:6])
	}
	if d.terms[5].clause == d.terms[6].clause {
		t.Errorf("\"!!\" did not end the clause")
	}
	st := d.stats
	if st.exclaims != 2 || st.repeatPunct != 1 || st.urls != 1 || !st.startsUpper || !st.endsPunct {
		t.Errorf("stats %+v", st)
	}
}

func TestLexicalOddInputs(t *testing.T) {
	e := NewLexical()
	odd := []string{"", " ", "🙂🙂🙂", "\xff\xfe\xfd", "-", "'", "a-", "--x--", "?!?!", strings.Repeat("word ", 5000), "ÉCOLE fermée’s", "www.", "$%$%"}
	inRange := func(what string, x float64) {
		if !(x >= 0 && x <= 1) {
			t.Errorf("%s = %v", what, x)
		}
	}
	for _, text := range odd {
		for _, a := range []string{"urgency", "toxicity", "sentiment", "formality", "quality", "spam", "made-up"} {
			r, err := e.Score(ctx, ScoreRequest{Source: text, Attribute: a, Description: text})
			if err != nil {
				t.Fatal(err)
			}
			inRange(a, r.Score)
		}
		m, _ := e.Match(ctx, MatchRequest{Query: text, Source: text})
		inRange("match", m.Score)
		c, err := e.Classify(ctx, ClassifyRequest{Text: text, Labels: []string{text + "x", "other"}, Mode: ModeMulti, Threshold: 0.5})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range c.Scores {
			inRange("confidence", s.Confidence)
		}
		tg, _ := e.Tag(ctx, TagRequest{Text: text})
		for _, s := range tg.Tags {
			inRange("tag", s.Confidence)
		}
	}
}

// TestLexicalTieIsFlaggedNotPickedByOrder: when no label shares a word
// with the text, every label ties. The answer says so, gives the tied
// labels equal confidences, and does not depend on the order they were
// listed in (it used to be the first listed, at 0.5).
func TestLexicalTieIsFlaggedNotPickedByOrder(t *testing.T) {
	e := NewLexical()
	text := "The export button crashes"
	var first ClassifyResult
	for i, labels := range [][]string{{"billing", "bug"}, {"bug", "billing"}} {
		r, err := e.Classify(ctx, ClassifyRequest{Text: text, Labels: labels, Mode: ModeSingle})
		if err != nil {
			t.Fatal(err)
		}
		if !r.Tie || r.Label != "billing" || r.Confidence != 0.5 ||
			len(r.Scores) != 2 || r.Scores[0] != (LabelScore{"billing", 0.5}) || r.Scores[1] != (LabelScore{"bug", 0.5}) {
			t.Fatalf("labels %v: %+v; want a tie, billing (first by name), both at 0.5", labels, r)
		}
		if i == 0 {
			first = r
		} else if !reflect.DeepEqual(r.Scores, first.Scores) {
			t.Errorf("label order changed the answer: %+v vs %+v", r, first)
		}
	}
	// Three labels without evidence: 1/3 each.
	r, _ := e.Classify(ctx, ClassifyRequest{Text: text, Labels: []string{"shipping", "billing", "account"}, Mode: ModeSingle})
	if !r.Tie || r.Label != "account" || r.Confidence != 0.3333 {
		t.Errorf("three-way tie %+v", r)
	}
	// Evidence for one label: no tie.
	r, _ = e.Classify(ctx, ClassifyRequest{Text: "The export button crashes", Labels: []string{"billing", "bug"}, Mode: ModeSingle,
		Descriptions: map[string]string{"bug": "something is broken: crashes, errors"}})
	if r.Tie || r.Label != "bug" || r.Confidence <= 0.5 {
		t.Errorf("clear case %+v; want bug, no tie", r)
	}
	r, _ = e.Classify(ctx, ClassifyRequest{Text: "I was charged twice on my invoice", Labels: []string{"billing", "bug"}, Mode: ModeSingle,
		Descriptions: map[string]string{"billing": "charges, refunds and invoices"}})
	if r.Tie || r.Label != "billing" {
		t.Errorf("clear case %+v; want billing, no tie", r)
	}
	// A catch-all is a decision, not a tie.
	r, _ = e.Classify(ctx, ClassifyRequest{Text: text, Labels: []string{"billing", "other"}, Mode: ModeSingle})
	if r.Tie || r.Label != "other" {
		t.Errorf("catch-all %+v; want other, no tie", r)
	}
}

// TestLexicalNoEvidenceIsNeverMatched: in multi mode and for closed tags,
// a label that shares nothing with the text is not returned, even at a
// threshold below its (floor) confidence.
func TestLexicalNoEvidenceIsNeverMatched(t *testing.T) {
	e := NewLexical()
	r, err := e.Classify(ctx, ClassifyRequest{Text: "The export button crashes", Labels: []string{"billing", "bug"}, Mode: ModeMulti, Threshold: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Labels) != 0 || len(r.Scores) != 2 || r.Tie {
		t.Errorf("multi without evidence %+v; want no labels, both scores", r)
	}
	tg, err := e.Tag(ctx, TagRequest{Text: "The export button crashes", Tags: []string{"billing", "export", "login"}, Threshold: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	if len(tg.Tags) != 1 || tg.Tags[0].Label != "export" {
		t.Errorf("tags %+v; want export only", tg.Tags)
	}
}
