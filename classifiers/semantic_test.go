package classifiers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate/tollgate/internal/testutil"
)

// The semantic engine's tests use the real vectors, found where the
// gateway finds them by default (TOLLGATE_VECTORS, else
// data/vectors/en.tgv under the repository root). They are never
// skipped: without the file they fail and say how to install it. The
// texts here were written for these tests, not taken from the evaluation
// set, and most of them share no word with the right label or answer.

var testVectors = sync.OnceValues(func() (*Vectors, error) {
	path, err := testutil.VectorsPath()
	if err != nil {
		return nil, err
	}
	return LoadVectors(path)
})

func semanticForTest(t testing.TB) Engine {
	t.Helper()
	v, err := testVectors()
	if err != nil {
		t.Fatalf("semantic engine: %v", err)
	}
	return NewSemantic(v)
}

// Label names only, paraphrased texts: a word-overlap engine ties or
// guesses on every one of these.
var paraphraseCases = []struct {
	labels []string
	text   string
	want   string
}{
	{[]string{"payroll", "leave", "recruiting", "benefits", "harassment"}, "My last paycheck was smaller than usual and nobody can tell me why.", "payroll"},
	{[]string{"payroll", "leave", "recruiting", "benefits", "harassment"}, "I'd like two weeks off in August for a family trip.", "leave"},
	{[]string{"payroll", "leave", "recruiting", "benefits", "harassment"}, "We must hire three more engineers before the next quarter.", "recruiting"},
	{[]string{"payroll", "leave", "recruiting", "benefits", "harassment"}, "Does our health insurance cover dental work?", "benefits"},
	{[]string{"payroll", "leave", "recruiting", "benefits", "harassment"}, "My supervisor keeps making crude remarks about my body.", "harassment"},
	{[]string{"sports", "politics", "technology", "business", "health"}, "The striker scored twice in the second half.", "sports"},
	{[]string{"sports", "politics", "technology", "business", "health"}, "Parliament voted down the budget proposal late last night.", "politics"},
	{[]string{"sports", "politics", "technology", "business", "health"}, "The new phone has a faster chip and a brighter display.", "technology"},
	{[]string{"sports", "politics", "technology", "business", "health"}, "Shares of the retailer fell after weak quarterly earnings.", "business"},
	{[]string{"sports", "politics", "technology", "business", "health"}, "Doctors recommend a flu vaccine every autumn.", "health"},
	{[]string{"billing", "technical", "account", "shipping"}, "Money was taken from my card two times for one purchase.", "billing"},
	{[]string{"billing", "technical", "account", "shipping"}, "The app freezes whenever I open the camera.", "technical"},
	{[]string{"billing", "technical", "account", "shipping"}, "I forgot my password and cannot sign in.", "account"},
	{[]string{"billing", "technical", "account", "shipping"}, "My parcel still has not arrived after ten days.", "shipping"},
	{[]string{"price", "quality", "delivery", "customer service"}, "Far too expensive for what you get.", "price"},
	{[]string{"price", "quality", "delivery", "customer service"}, "The stitching came apart after one wash.", "quality"},
	{[]string{"price", "quality", "delivery", "customer service"}, "It took three weeks to arrive and the box was crushed.", "delivery"},
	{[]string{"price", "quality", "delivery", "customer service"}, "The agent on the phone was rude and hung up on me.", "customer service"},
}

func TestSemanticClassifyParaphrasesWithLabelNamesOnly(t *testing.T) {
	e := semanticForTest(t)
	lex := NewLexical()
	right, lexRight := 0, 0
	for _, c := range paraphraseCases {
		for _, labels := range [][]string{c.labels, reversed(c.labels)} {
			req := ClassifyRequest{Text: c.text, Labels: labels, Mode: ModeSingle}
			res, err := e.Classify(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if res.Engine != EngineSemantic {
				t.Fatalf("engine %q, want semantic", res.Engine)
			}
			if !res.Tie && res.Label == c.want {
				right++
			} else {
				t.Logf("%q: %s (tie %v), want %s; scores %v", c.text, res.Label, res.Tie, c.want, res.Scores)
			}
			lr, _ := lex.Classify(context.Background(), req)
			if !lr.Tie && lr.Label == c.want {
				lexRight++
			}
		}
	}
	n := 2 * len(paraphraseCases)
	t.Logf("semantic %d/%d, lexical %d/%d", right, n, lexRight, n)
	if right*10 < n*7 {
		t.Errorf("semantic right on %d of %d (both label orders), want at least 70%%", right, n)
	}
	if right <= lexRight {
		t.Errorf("semantic %d right, lexical %d: the vectors add nothing", right, lexRight)
	}
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[len(s)-1-i] = x
	}
	return out
}

// Score pairs: the first text is higher on the attribute than the second.
// Several high texts carry none of the lexical engine's cue words.
var scorePairs = []struct {
	attribute, description string
	high, low              string
}{
	{"toxicity", "", "Crawl back under whatever rock you came from, nobody wants you here.", "Thanks for the update, I will review it this afternoon."},
	{"toxicity", "", "People like you are a waste of oxygen.", "I disagree with your point, but I see where you are coming from."},
	{"urgency", "", "The patient has stopped breathing, get a doctor to room four.", "Whenever you have a moment, could you look over the draft?"},
	{"urgency", "", "Smoke is pouring out of the server room.", "Let's talk about next year's roadmap at some point."},
	{"politeness", "how courteous and respectful the writer is", "Would you mind sending the report when you get a chance? Thank you so much.", "Send me the report. Now."},
	{"politeness", "how courteous and respectful the writer is", "I really appreciate your patience, and sorry for the trouble.", "Stop wasting my time and fix it."},
	{"sentiment", "", "I absolutely adore this little cafe, the staff are lovely.", "The food was cold and the waiter ignored us all evening."},
	{"spam", "", "Congratulations! You have been selected for a free cruise, reply with your bank details.", "Can we move tomorrow's meeting to 3pm?"},
	{"formality", "", "Dear Ms. Patel, I am writing to inquire about the status of my application.", "hey whats up, u coming tonight?"},
	{"quality", "", "The report compares three suppliers on cost, lead time and defect rate, and recommends the second with reasons.", "stuff is ok i guess whatever"},
	{"excitement", "how thrilled and enthusiastic the writer sounds", "We won the final! I can't believe it, best day ever!", "The meeting has been moved to Thursday."},
	{"sadness", "", "Since my grandmother died the house feels empty and I cry most nights.", "The bus leaves at nine and arrives at noon."},
}

func TestSemanticScorePairs(t *testing.T) {
	e := semanticForTest(t)
	lex := NewLexical()
	ordered, lexOrdered := 0, 0
	for _, p := range scorePairs {
		score := func(en Engine, text string) float64 {
			res, err := en.Score(context.Background(), ScoreRequest{Source: text, Attribute: p.attribute, Description: p.description})
			if err != nil {
				t.Fatal(err)
			}
			return res.Score
		}
		hi, lo := score(e, p.high), score(e, p.low)
		if hi > lo {
			ordered++
		} else {
			t.Logf("%s: %q %.3f <= %q %.3f", p.attribute, p.high, hi, p.low, lo)
		}
		if score(lex, p.high) > score(lex, p.low) {
			lexOrdered++
		}
	}
	t.Logf("semantic ordered %d/%d pairs, lexical %d", ordered, len(scorePairs), lexOrdered)
	if ordered*10 < len(scorePairs)*9 {
		t.Errorf("semantic ordered %d of %d pairs, want at least 90%%", ordered, len(scorePairs))
	}
}

// Match: each query has an answer in other words and a trap that repeats
// the query's words without answering it.
var matchTraps = []struct{ query, answer, trap string }{
	{"how do I reset my router", "Hold the small button on the back of the modem for ten seconds to restore the factory settings.", "Our router reset policy changed in May; ask us how routers are replaced under warranty."},
	{"why is the sky blue", "Sunlight scatters off air molecules, and the shorter wavelengths scatter most, which tints the daytime heavens.", "The sky was blue when we set off on the hike, so why not come along next time?"},
	{"what time does the pharmacy open on sunday", "The drugstore opens at 10 am on weekends and closes at 4 pm.", "Our pharmacy has a new manager, and Sunday is a busy time for the whole street."},
	{"how can I lower my electricity bill", "Switching to LED bulbs and unplugging idle appliances cuts the power you pay for each month.", "The electricity bill passed the lower house and now goes to the senate."},
	{"symptoms of dehydration", "If you have not drunk enough water you may feel dizzy, get headaches and notice dark urine and a dry mouth.", "Our clinic's newsletter has a dehydration symptoms poster you can print."},
	{"best way to learn a new language", "Speak with native speakers every day, listen to podcasts and review vocabulary with flashcards.", "The best new language school in town opened its way-finding signs this week."},
	{"how long should I boil an egg", "Cook it in simmering water for about seven minutes for a firm white and a soft yolk.", "How long the egg queue was! We should boil water for tea while we wait."},
	{"can dogs eat chocolate", "Cocoa contains theobromine, which is poisonous to pets and can cause vomiting, seizures and worse.", "Our dogs love the chocolate brown blanket and can eat on it all day."},
	{"how to fix a flat bicycle tyre", "Take the wheel off, find the puncture, patch the inner tube and pump it back up.", "A flat tyre on a bicycle is how our club's fix-it afternoon began last year."},
	{"who painted the mona lisa", "Leonardo da Vinci worked on the portrait in Florence in the early sixteenth century.", "Mona Lisa is the name of a pizzeria that painted its walls last spring."},
}

// answersAboveTraps counts the cases whose answer e scores above the trap.
func answersAboveTraps(t *testing.T, e Engine, cases []struct{ query, answer, trap string }) int {
	t.Helper()
	wins := 0
	for _, c := range cases {
		score := func(doc string) float64 {
			res, err := e.Match(context.Background(), MatchRequest{Source: doc, Query: c.query})
			if err != nil {
				t.Fatal(err)
			}
			return res.Score
		}
		a, tr := score(c.answer), score(c.trap)
		if a > tr {
			wins++
		} else {
			t.Logf("%q: answer %.3f <= trap %.3f", c.query, a, tr)
		}
	}
	t.Logf("answer above the trap %d/%d", wins, len(cases))
	return wins
}

func TestSemanticMatchTrapsLoseToAnswers(t *testing.T) {
	wins := answersAboveTraps(t, semanticForTest(t), matchTraps)
	if wins < 8 {
		t.Errorf("answer above the trap %d of %d times, want at least 8", wins, len(matchTraps))
	}
}

// TestSemanticExpansionKeepsSiblingsApart: the nearest words of a
// medical specialty's name are other specialties, so widening each label
// by its plain nearest words makes the labels of such a set alike; the
// contrastive expansion keeps only words nearer to the label's own name,
// and the set's label vectors end up further apart.
func TestSemanticExpansionKeepsSiblingsApart(t *testing.T) {
	e := semanticForTest(t).(*semantic)
	labels := []string{"cardiology", "dermatology", "psychiatry", "pediatrics", "ophthalmology"}
	plain := make([][]float32, len(labels))
	for i, l := range labels {
		nb := make([]float32, e.v.dims)
		for _, n := range e.cachedNeighbours(l, nil)[:expandNeighbours] {
			e.v.addTo(nb, int(n.i), n.c)
		}
		Normalize(nb)
		plain[i] = e.labelVector(l, "", nil, nb, nil)
	}
	contrastive := make([][]float32, len(labels))
	for i, x := range e.contrastiveExpansions(labels, nil) {
		contrastive[i] = e.labelVector(labels[i], "", nil, x, nil)
	}
	meanCos := func(vs [][]float32) float64 {
		var s float64
		n := 0
		for i := range vs {
			for j := i + 1; j < len(vs); j++ {
				s += float64(dot(vs[i], vs[j]))
				n++
			}
		}
		return s / float64(n)
	}
	p, c := meanCos(plain), meanCos(contrastive)
	t.Logf("mean cosine between labels: plain neighbours %.3f, contrastive %.3f", p, c)
	if c >= p-0.05 {
		t.Errorf("contrastive expansion leaves the labels as alike as plain neighbours do (%.3f against %.3f)", c, p)
	}
}

// topicalTraps are harder than matchTraps: each trap repeats the query's
// words and its other words stay near the query's topic (a shop, sales,
// a kitchen), while the answer says what to do in words of its own.
var topicalTraps = []struct{ query, answer, trap string }{
	{"how do I get rid of ants in the kitchen", "Wipe the counters with vinegar and seal the cracks where the insects come in; bait stations near their trail work within days.", "Kitchen ants are the bakery's mascot, and the owner says she will never get rid of the cartoon."},
	{"why does my bike chain keep falling off", "A worn derailleur or a stretched chain slips off the gears; adjust the limit screws or replace the links.", "The bike shop's chain of stores keeps falling behind its rivals, and one branch may close."},
	{"how to stop my glasses fogging up", "A drop of dish soap rubbed on the lenses, or a mask pinched tight over the nose, keeps warm breath from condensing.", "The glasses maker's profits are fogging up as it struggles to stop losses."},
	{"how to get chewing gum out of hair", "Rub peanut butter or cooking oil into the strands, then comb the sticky lump out gently.", "Chewing gum sales are up, and the hair salon next door hands it out free."},
	{"how do I unblock a sink", "Pour boiling water down the drain, then work a plunger or a wire snake to clear the clog.", "The sink in the show kitchen was blocked from view by a new display of taps."},
	{"why do my eyes water when I read", "Staring at a page makes you blink less, the surface dries out, and the glands flood it with tears.", "Read why the water park's eye-catching slides are closed this week."},
}

// TestSemanticMatchTopicalTrapsLose: shared words count only when the
// rest of the document restates the query (restatement), so a trap that
// repeats the query and stays on its topic still ranks below the answer.
func TestSemanticMatchTopicalTrapsLose(t *testing.T) {
	wins := answersAboveTraps(t, semanticForTest(t), topicalTraps)
	// Elaboration measured from the document's side (before restatement)
	// put 2 of the 6 answers above their trap; restatement puts 4.
	if wins < 4 {
		t.Errorf("answer above the trap %d of %d times, want at least 4", wins, len(topicalTraps))
	}
}

// TestSemanticMatchSharedWordsStillCount: a document that answers in the
// query's own words beats one on another subject; the gate on shared
// words must not turn into distrust of every overlap.
func TestSemanticMatchSharedWordsStillCount(t *testing.T) {
	e := semanticForTest(t)
	query := "how to descale a kettle"
	answer := "To descale a kettle, fill it with equal parts water and white vinegar, boil, leave it an hour and rinse."
	other := "Our library lends e-books for three weeks and sends a reminder before they expire."
	s := func(doc string) float64 {
		res, err := e.Match(context.Background(), MatchRequest{Source: doc, Query: query})
		if err != nil {
			t.Fatal(err)
		}
		return res.Score
	}
	if a, o := s(answer), s(other); a <= o || a < 0.5 {
		t.Errorf("answer in the query's words %.3f, unrelated %.3f: want the answer above 0.5 and above the other", a, o)
	}
}

// TestSemanticMatchDuplicateIsNotATrap: a document identical to the query
// scored 0.0102, below an unrelated one on refunds (0.3556), and "five
// days" for "5 days" the same: with every word the query's, no other word
// was left to restate it and the gate on shared words closed. Match is
// for finding similar documents too, so the query said again, or nearly,
// ranks at the top; a trap that adds words of its own about something
// else still ranks below the answer.
func TestSemanticMatchDuplicateIsNotATrap(t *testing.T) {
	e := semanticForTest(t)
	s := func(query, doc string) float64 {
		res, err := e.Match(context.Background(), MatchRequest{Source: doc, Query: query})
		if err != nil {
			t.Fatal(err)
		}
		return res.Score
	}
	refunds := "Refunds are issued within 5 days of the request."
	unrelated := "We do not offer refunds on sale items."
	near := []struct{ name, query, doc string }{
		{"identical", refunds, refunds},
		{"identical", "The cat sat on the mat and purred.", "The cat sat on the mat and purred."},
		{"digits for words", refunds, "Refunds are issued within five days of the request."},
		{"words for digits", "Refunds are issued within five days of the request.", refunds},
		{"a rare name added", refunds, "Refunds are issued within 5 days of the request by Klarna."},
	}
	for _, c := range near {
		got, other := s(c.query, c.doc), s(c.query, unrelated)
		if got < 0.9 || got <= other {
			t.Errorf("%s: %q scores %.4f against %q (%q: %.4f), want at least 0.9 and above it", c.name, c.doc, got, c.query, unrelated, other)
		}
	}

	// Traps that repeat every word of the query and add a few of their
	// own: the printer one has only 22% of its weight in them, near the
	// limit (matchEchoLimit) below which a document counts as the query
	// said again.
	traps := []struct{ query, answer, trap string }{
		{"how to fix a flat bicycle tyre", "Take the wheel off, find the puncture, patch the inner tube and pump it back up.", "A flat tyre on a bicycle is how our club's fix-it afternoon began last year."},
		{"my printer says it's offline", "Switch the printer off and on again, then check it is on the same wireless network as the computer.", "The printer company says it went offline for a week."},
	}
	for _, c := range traps {
		a, tr := s(c.query, c.answer), s(c.query, c.trap)
		if tr >= a || tr > 0.2 {
			t.Errorf("%q: trap %.4f, answer %.4f: want the trap at most 0.2 and below the answer", c.query, tr, a)
		}
	}
}

// TestSemanticTiesWithoutEvidence: a text of words the vectors do not
// know, sharing none with the labels, is a tie, whatever the label order.
func TestSemanticTiesWithoutEvidence(t *testing.T) {
	e := semanticForTest(t)
	for _, labels := range [][]string{{"billing", "shipping"}, {"shipping", "billing"}} {
		res, err := e.Classify(context.Background(), ClassifyRequest{Text: "zzqx vrrbl 4471", Labels: labels, Mode: ModeSingle})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Tie || res.Label != "billing" {
			t.Errorf("labels %v: label %q tie %v, want a tie reported as billing (first by name)", labels, res.Label, res.Tie)
		}
	}
}

// TestSemanticLabelOrder: the answer does not depend on the order labels
// are listed in.
func TestSemanticLabelOrder(t *testing.T) {
	e := semanticForTest(t)
	for _, c := range paraphraseCases {
		a, _ := e.Classify(context.Background(), ClassifyRequest{Text: c.text, Labels: c.labels})
		b, _ := e.Classify(context.Background(), ClassifyRequest{Text: c.text, Labels: reversed(c.labels)})
		if a.Label != b.Label || a.Confidence != b.Confidence {
			t.Errorf("%q: %s %.4f in one order, %s %.4f in the other", c.text, a.Label, a.Confidence, b.Label, b.Confidence)
		}
	}
}

// TestSemanticMulti: in multi mode the labels a text is about pass the
// threshold and an unrelated one does not.
func TestSemanticMulti(t *testing.T) {
	e := semanticForTest(t)
	res, err := e.Classify(context.Background(), ClassifyRequest{
		Text:   "The goalkeeper was fined for dodging taxes on his transfer fee from the club.",
		Labels: []string{"sports", "finance", "cooking"}, Mode: ModeMulti, Threshold: 0.5,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, l := range res.Labels {
		got[l.Label] = true
	}
	if !got["sports"] || got["cooking"] {
		t.Errorf("multi: %v (scores %v), want sports and not cooking", res.Labels, res.Scores)
	}
}

// An attribute no engine knows anything of (no scorer, no vector, no word
// shared with the text) scores 0 and says so; a known one, or one whose
// description the vectors know, does not, even where it scores low.
func TestScoreSaysWhenItHasNoEvidence(t *testing.T) {
	for _, e := range []Engine{semanticForTest(t), NewLexical()} {
		score := func(attribute, description string) ScoreResult {
			res, err := e.Score(context.Background(), ScoreRequest{Source: "The meeting moved to Thursday.", Attribute: attribute, Description: description})
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		if res := score("zorblyness", ""); !res.NoEvidence || res.Score != 0 {
			t.Errorf("%s: an unknown attribute: %+v, want score 0 with no_evidence", e.Name(), res)
		}
		if res := score("urgency", ""); res.NoEvidence {
			t.Errorf("%s: urgency is measured: %+v", e.Name(), res)
		}
		if res := score("zorblyness", "how much the meeting schedule changed"); res.NoEvidence {
			t.Errorf("%s: the description shares words with the text: %+v", e.Name(), res)
		}
	}
}

// TestMatchSaysWhenItHasNoEvidence: a query or source with no word
// ("🔥", "???") scored 0 with nothing to say so, though a duplicate ranks
// at the top: "🔥" for "🔥" read as "not relevant at all".
func TestMatchSaysWhenItHasNoEvidence(t *testing.T) {
	for _, e := range []Engine{semanticForTest(t), NewLexical()} {
		for _, c := range []struct {
			query, source string
			none          bool
		}{
			{"🔥", "🔥", true},
			{"???", "???", true},
			{"how long do refunds take?", "🔥 !!!", true},
			{"🔥", "Refunds are issued within 5 days.", true},
			{"how long do refunds take?", "Preheat the oven to 200 degrees.", false},
			{"zzqx", "blorf", false}, // words, none shared: that is a measure
		} {
			res, err := e.Match(context.Background(), MatchRequest{Query: c.query, Source: c.source})
			if err != nil || res.NoEvidence != c.none || (c.none && res.Score != 0) {
				t.Errorf("%s: %q for %q: %+v, %v; want no_evidence %v", e.Name(), c.source, c.query, res, err, c.none)
			}
		}
	}
}

// align compares each distinct word once, and bounds the words compared:
// a word of the query with every word of the document was quadratic, and
// two 64 KiB texts took a minute of CPU in one /v1/match call. Under the
// bounds (every real query) it scores exactly as the plain loop did.
func TestAlignIsBoundedAndExactUnderTheBounds(t *testing.T) {
	v, err := testVectors()
	if err != nil {
		t.Fatal(err)
	}
	plain := func(a, b *embedding) float32 {
		var sum float32
		for i, wa := range a.words {
			best := float32(-1)
			for _, wb := range b.words {
				c := float32(1)
				if wa != wb {
					c = v.dot(int(wa), int(wb))
				}
				best = max(best, c)
			}
			sum += a.weights[i] * best
		}
		return sum / a.known
	}
	q := v.embedText("how long do refunds take for a cancelled order, and will the refund reach my card")
	d := v.embedText("Refunds reach the card you paid with within five working days of the cancellation; a cancelled order is refunded in full, and a refund for part of an order takes as long.")
	if got, want := v.align(&q, &d), plain(&q, &d); got != want {
		t.Fatalf("align %v, the plain loop %v", got, want)
	}
	// Thousands of distinct words on both sides: each keeps its heaviest,
	// alignMaxA of the query and alignMaxB of the document.
	var long []string
	for i := 100; i < 20_000; i += 3 {
		long = append(long, v.Word(i))
	}
	big := v.embedText(strings.Join(long, " "))
	if kept := keptWords(&big, alignMaxA); len(kept) != alignMaxA {
		t.Fatalf("kept %d words of %d, want %d", len(kept), len(big.words), alignMaxA)
	}
	if n := len(distinctWords(big.words, keptWords(&big, alignMaxB))); n != alignMaxB {
		t.Fatalf("%d document words compared, want %d", n, alignMaxB)
	}
	if s := v.align(&big, &big); s < 0.99 || s > 1.0001 {
		t.Fatalf("a text aligned with itself: %v", s)
	}
}

// A new label name costs a search of the common words, about 15 ms: sets
// of more than expandMaxLabels are not widened (200 new names took 3 s of
// CPU a call), and names made of the same known words share one search.
func TestLabelExpansionWorkIsBounded(t *testing.T) {
	e := semanticForTest(t).(*semantic)
	names := make([]string, expandMaxLabels+1)
	for i := range names {
		names[i] = fmt.Sprintf("bank order q%d", i)
	}
	for _, x := range e.contrastiveExpansions(names, nil) {
		if x != nil {
			t.Fatalf("a set of %d labels was widened", len(names))
		}
	}
	before := e.expanded.len()
	e.contrastiveExpansions([]string{"bank order q1", "bank order q2", "weather"}, nil)
	if n := e.expanded.len() - before; n != 2 {
		t.Fatalf("%d neighbour searches for 3 names of 2 word sets", n)
	}
}

// A label set of more than MaxLabelSetBytes bytes of text is compiled for
// each call, not kept: 128 sets of megabytes of descriptions held about
// 1.3 GB.
func TestLargeLabelSetsAreNotCached(t *testing.T) {
	e := semanticForTest(t).(*semantic)
	desc := map[string]string{"a": strings.Repeat("refund invoice ", MaxLabelSetBytes/15+1)}
	before := e.labels.len()
	e.compileLabels([]string{"a", "b"}, desc, nil)
	e.compileLabels([]string{"a", "b"}, map[string]string{"a": "refund invoice"}, nil)
	if n := e.labels.len() - before; n != 1 {
		t.Fatalf("%d label sets cached, want only the small one", n)
	}
}

// Labels made only of function words ("on" and "off", "up" and "down")
// passed validation, but the stopword list dropped their every word, from
// the label and from the text: "Turn the light off" tied between on and
// off, and "I want more" went to less on the semantic engine. Such a
// label is read by its words now, in both offline engines, for classify,
// tag and score; a catch-all ("other") is not one, and a set without
// such a label reads its texts as before.
func TestLabelsOfFunctionWordsAreReadByTheirWords(t *testing.T) {
	cases := []struct {
		text   string
		labels []string
		want   string
	}{
		{"Turn the light off", []string{"on", "off"}, "off"},
		{"Turn the light on", []string{"on", "off"}, "on"},
		{"I am out of the office", []string{"in", "out"}, "out"},
		{"The server is down", []string{"up", "down"}, "down"},
		{"I want more", []string{"more", "less"}, "more"},
		{"Turn the light off", []string{"on", "off", "other"}, "off"},
	}
	for _, e := range []Engine{semanticForTest(t), NewLexical()} {
		for _, c := range cases {
			for _, labels := range [][]string{c.labels, reversed(c.labels)} {
				res, err := e.Classify(context.Background(), ClassifyRequest{Text: c.text, Labels: labels, Mode: ModeSingle})
				if err != nil {
					t.Fatal(err)
				}
				if res.Label != c.want || res.Tie {
					t.Errorf("%s: %q over %v: %s %.4f tie %v, want %s", e.Name(), c.text, labels, res.Label, res.Confidence, res.Tie, c.want)
				}
			}
		}
		tags, err := e.Tag(context.Background(), TagRequest{Text: "Turn the light off", Tags: []string{"on", "off"}, Threshold: DefaultTagThreshold})
		if err != nil {
			t.Fatal(err)
		}
		if len(tags.Tags) != 1 || tags.Tags[0].Label != "off" {
			t.Errorf("%s: tags %v, want off alone", e.Name(), tags.Tags)
		}
		res, err := e.Score(context.Background(), ScoreRequest{Source: "Server is down", Attribute: "down"})
		if err != nil {
			t.Fatal(err)
		}
		if res.NoEvidence || res.Score < 0.5 {
			t.Errorf("%s: \"Server is down\" on down: %+v, want at least 0.5 with evidence", e.Name(), res)
		}
	}
	// A one-letter label is no sentiment: VADER rates "l" 2, and L beside
	// S and M won every friendly text that names no size.
	for _, e := range []Engine{semanticForTest(t), NewLexical()} {
		for _, text := range []string{"please", "thanks a lot"} {
			res, err := e.Classify(context.Background(), ClassifyRequest{Text: text, Labels: []string{"S", "M", "L"}, Mode: ModeSingle})
			if err != nil {
				t.Fatal(err)
			}
			if res.Label == "L" && !res.Tie {
				t.Errorf("%s: %q over S, M, L: L at %.4f, a text that names no size", e.Name(), text, res.Confidence)
			}
		}
	}
	if w := literalWords([]string{"billing", "other", "n/a"}); w != nil {
		t.Errorf("literal words %v of a set with no label of function words only", w)
	}
}

// Label sets were compiled by every call that did not find them cached,
// so 20 calls at once with a new set of 200 labels compiled it 20 times
// (seconds of CPU in the worst case). Calls at once for one set now wait
// for one compile: each call holds the same compiled set.
func TestConcurrentCallsCompileALabelSetOnce(t *testing.T) {
	v, err := testVectors()
	if err != nil {
		t.Fatal(err)
	}
	labels := make([]string, 200)
	for i := range labels {
		labels[i] = v.Word(3000 + 7*i)
	}
	descriptions := map[string]string{labels[0]: "a fresh set, compiled by no earlier test"}
	const calls = 20
	e := semanticForTest(t).(*semantic)
	compiled := func(compile func() any) int {
		var start, done sync.WaitGroup
		start.Add(1)
		sets := make([]any, calls)
		for i := range calls {
			done.Go(func() {
				start.Wait()
				sets[i] = compile()
			})
		}
		start.Done()
		done.Wait()
		distinct := map[any]bool{}
		for _, s := range sets {
			distinct[s] = true
		}
		return len(distinct)
	}
	if n := compiled(func() any { return e.compileLabels(labels, descriptions, nil) }); n != 1 {
		t.Errorf("semantic: %d calls at once compiled the set %d times, want once", calls, n)
	}
	descriptions[labels[1]] = "and a second one, for the lexical engine"
	if n := compiled(func() any { return compileLabels(labels, descriptions, nil) }); n != 1 {
		t.Errorf("lexical: %d calls at once compiled the set %d times, want once", calls, n)
	}
}
