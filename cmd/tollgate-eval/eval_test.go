package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/classifiers"
)

func TestClassifyRightNeedsBothOrdersAndNoTie(t *testing.T) {
	res := func(label string, tie bool) classifiers.ClassifyResult {
		return classifiers.ClassifyResult{Label: label, Tie: tie}
	}
	cases := []struct {
		name       string
		given, rev classifiers.ClassifyResult
		want       bool
		wantTally  classifyTally
	}{
		{"right in both", res("a", false), res("a", false), true, classifyTally{right: 1}},
		{"right as given only", res("a", false), res("b", false), false, classifyTally{oneOrder: 1}},
		{"right reversed only", res("b", false), res("a", false), false, classifyTally{oneOrder: 1}},
		{"tie with the gold label", res("a", true), res("a", false), false, classifyTally{ties: 1}},
		{"tie in both", res("a", true), res("a", true), false, classifyTally{ties: 1}},
		{"wrong in both", res("b", false), res("c", false), false, classifyTally{}},
	}
	for _, c := range cases {
		if got := classifyRight(c.given, c.rev, "a"); got != c.want {
			t.Errorf("%s: classifyRight = %v, want %v", c.name, got, c.want)
		}
		var tally classifyTally
		tally.add(c.given, c.rev, "a")
		if tally != c.wantTally {
			t.Errorf("%s: tally %+v, want %+v", c.name, tally, c.wantTally)
		}
	}
}

// fakeEngine answers classify by a rule, and score and match from tables.
type fakeEngine struct {
	pick   func(req classifiers.ClassifyRequest) classifiers.ClassifyResult
	scores map[string]float64
}

func (fakeEngine) Name() string { return "fake" }

func (f fakeEngine) Classify(_ context.Context, req classifiers.ClassifyRequest) (classifiers.ClassifyResult, error) {
	return f.pick(req), nil
}

func (fakeEngine) Tag(context.Context, classifiers.TagRequest) (classifiers.TagResult, error) {
	return classifiers.TagResult{}, nil
}

func (f fakeEngine) Score(_ context.Context, req classifiers.ScoreRequest) (classifiers.ScoreResult, error) {
	return classifiers.ScoreResult{Score: f.scores[req.Source]}, nil
}

func (f fakeEngine) Match(_ context.Context, req classifiers.MatchRequest) (classifiers.ScoreResult, error) {
	return classifiers.ScoreResult{Score: f.scores[req.Source]}, nil
}

func tinyPart() *part {
	labels := []string{"a", "b", "c"}
	return &part{
		sets: map[string]labelSet{"s": {Labels: labels, Descriptions: map[string]string{"a": "about a"}}},
		classify: []classifyItem{
			{Set: "s", Labels: labels, Text: "one", Label: "a"},
			{Set: "s", Labels: labels, Text: "two", Label: "c"},
		},
	}
}

func TestClassifyTalliesAskBothOrders(t *testing.T) {
	first := fakeEngine{pick: func(req classifiers.ClassifyRequest) classifiers.ClassifyResult {
		return classifiers.ClassifyResult{Label: req.Labels[0]}
	}}
	_, total, chance, err := classifyTallies(first, tinyPart())
	if err != nil {
		t.Fatal(err)
	}
	// The first listed label is gold for "one" as given and for "two"
	// reversed: right in one order each, so no item counts.
	for i, want := range []classifyTally{{oneOrder: 2}, {oneOrder: 2}} {
		if total[i] != want {
			t.Errorf("first-listed engine, way %d: %+v, want %+v", i, total[i], want)
		}
	}
	if math.Abs(chance-1.0/3) > 1e-12 {
		t.Errorf("chance %v, want 1/3", chance)
	}

	gold := map[string]string{"one": "a", "two": "c"}
	oracle := fakeEngine{pick: func(req classifiers.ClassifyRequest) classifiers.ClassifyResult {
		// Right only when given the descriptions; a tie on its own.
		if req.Descriptions == nil {
			return classifiers.ClassifyResult{Label: gold[req.Text], Tie: true}
		}
		return classifiers.ClassifyResult{Label: gold[req.Text]}
	}}
	_, total, _, err = classifyTallies(oracle, tinyPart())
	if err != nil {
		t.Fatal(err)
	}
	if want := (classifyTally{ties: 2}); total[0] != want {
		t.Errorf("names only: %+v, want %+v", total[0], want)
	}
	if want := (classifyTally{right: 2}); total[1] != want {
		t.Errorf("with descriptions: %+v, want %+v", total[1], want)
	}
}

func TestPairOrderedEqualIsWrong(t *testing.T) {
	if !pairOrdered(0.6, 0.5) || pairOrdered(0.5, 0.5) || pairOrdered(0.4, 0.5) {
		t.Error("pairOrdered: want true only when higher > lower")
	}
	p := &part{pairs: []scorePair{
		{Attribute: "x", Higher: "h1", Lower: "l1"}, // ordered
		{Attribute: "x", Higher: "h2", Lower: "l2"}, // equal
		{Attribute: "x", Higher: "h3", Lower: "l3"}, // reversed
	}}
	e := fakeEngine{scores: map[string]float64{"h1": 0.9, "l1": 0.1, "h2": 0.5, "l2": 0.5, "h3": 0.2, "l3": 0.7}}
	var out bytes.Buffer
	var r partResult
	if err := reportScore(&out, e, p, &r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "  overall           3    33.3%              1") {
		t.Errorf("score report:\n%s", out.String())
	}
	if math.Abs(r.pairs-100.0/3) > 1e-9 {
		t.Errorf("pairs for the goals: %v, want 33.3", r.pairs)
	}
}

// TestGoalsVerdicts checks each goal's threshold from both sides: a
// result exactly at a goal meets it, one just below does not.
func TestGoalsVerdicts(t *testing.T) {
	var out bytes.Buffer
	reportGoals(&out, partResult{namesOnly: 70, withHelp: 84.9, pairs: 90, mrr: 0.849, traps: 10, trapsBelow: 8})
	for _, want := range []string{
		"70.0%  at least 70%: met",
		"84.9%  at least 85%: NOT met",
		"90.0%  at least 90%: met",
		"0.849   at least 0.85: NOT met",
		"8 of 10  at least 8 in 10: met",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("goals lack %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	reportGoals(&out, partResult{traps: 25, trapsBelow: 19})
	if !strings.Contains(out.String(), "19 of 25  at least 8 in 10: NOT met") {
		t.Errorf("19 of 25 traps below is under 8 in 10:\n%s", out.String())
	}
}

func TestPairsFromScores(t *testing.T) {
	pairs := pairsFromScores([]scoreItem{
		{"x", "lo", 0}, {"x", "mid", 0.5}, {"x", "mid2", 0.5}, {"y", "hi", 1},
	})
	// lo<mid, lo<mid2; mid and mid2 share a score; y is another attribute.
	if len(pairs) != 2 || pairs[0].Higher != "mid" || pairs[0].Lower != "lo" || pairs[1].Higher != "mid2" {
		t.Errorf("pairs %+v", pairs)
	}
}

func TestReciprocalRankAndTies(t *testing.T) {
	cases := []struct {
		scores []float64
		rel    []int
		want   float64
	}{
		{[]float64{0.9, 0.5, 0.1}, []int{3, 0, 0}, 1},
		{[]float64{0.9, 0.5, 0.1}, []int{0, 3, 0}, 0.5},
		{[]float64{0.9, 0.5, 0.1}, []int{1, 0, 2}, 1.0 / 3}, // grade 1 is not an answer
		{[]float64{0.5, 0.5, 0.5}, []int{0, 3, 0}, 1.0 / 3}, // equal scores rank against the engine
		{[]float64{0.5, 0.5, 0.1}, []int{2, 0, 0}, 0.5},
	}
	for _, c := range cases {
		if got := reciprocalRank(c.scores, c.rel); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("reciprocalRank(%v, %v) = %v, want %v", c.scores, c.rel, got, c.want)
		}
	}
}

func TestTrapBelowTheAnswer(t *testing.T) {
	rel := []int{0, 3, 0, 1}
	cases := []struct {
		scores []float64
		want   bool
	}{
		{[]float64{0.9, 0.6, 0.1, 0.2}, true},  // trap 2 below the answer, whatever doc 0 does
		{[]float64{0.1, 0.6, 0.6, 0.2}, false}, // equal is not below
		{[]float64{0.1, 0.3, 0.6, 0.2}, false},
	}
	for _, c := range cases {
		if got := trapBelow(c.scores, rel, 2); got != c.want {
			t.Errorf("trapBelow(%v) = %v, want %v", c.scores, got, c.want)
		}
	}
	if _, unique := answerOf([]int{3, 0, 3}); unique {
		t.Error("answerOf: two top grades reported unique")
	}
}

func TestNDCG(t *testing.T) {
	rel := []int{3, 2, 0, 0, 0, 0, 0}
	if got := ndcgAt(5, []float64{0.9, 0.8, 0.1, 0.1, 0.1, 0.1, 0.1}, rel); math.Abs(got-1) > 1e-12 {
		t.Errorf("gold order: NDCG@5 %v, want 1", got)
	}
	swapped := ndcgAt(5, []float64{0.8, 0.9, 0.1, 0.1, 0.1, 0.1, 0.1}, rel)
	// All scores equal: the five irrelevant documents rank first.
	flat := ndcgAt(5, make([]float64, 7), rel)
	if !(flat < swapped && swapped < 1) || flat != 0 {
		t.Errorf("NDCG@5: swapped %v, all equal %v; want 0 = equal < swapped < 1", swapped, flat)
	}
}

func writePart(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadNamesFileAndLine(t *testing.T) {
	sets := `{"s": {"labels": ["a", "b"]}}`
	classify := `{"set": "s", "text": "x", "label": "a"}`
	pairs := `{"attribute": "u", "higher": "h", "lower": "l"}`
	match := `{"docs": ["d0", "d1"], "queries": [{"query": "q", "relevance": [3, 0], "trap": 1}]}`
	good := map[string]string{"sets.json": sets, "classify.jsonl": classify, "score_pairs.jsonl": pairs, "match.jsonl": match}
	if _, err := load("t", writePart(t, good)); err != nil {
		t.Fatalf("a well-formed part: %v", err)
	}
	cases := []struct{ file, body, want string }{
		{"classify.jsonl", classify + "\n\n" + `{"set": "s", "text": "x", "label": "z"}`, "classify.jsonl:3: gold label"},
		{"classify.jsonl", `{"set": "s", "text": "x", "label": "a", "lable": "b"}`, "classify.jsonl:1: json: unknown field"},
		{"score_pairs.jsonl", pairs + "\n" + `{"attribute": "u", "higher": "h"`, "score_pairs.jsonl:2:"},
		{"match.jsonl", `{"docs": ["d0", "d1"], "queries": [{"query": "q", "relevance": [3]}]}`, "match.jsonl:1: query \"q\" grades 1 of 2"},
		{"match.jsonl", `{"docs": ["d0", "d1"], "queries": [{"query": "q", "relevance": [3, 3], "trap": 1}]}`, "match.jsonl:1: query \"q\": a trap query"},
		{"sets.json", "{\n\"s\": {\"labels\": [\"a\", \"b\"]},\n\"t\": {\"labels\": [\"a\"]}\n}", "sets.json:3: set \"t\""},
		{"sets.json", "{\n\"s\": {\"labels\": [\"a\", \"b\"]}\n\"t\": 1}", "sets.json:3:"},
	}
	for _, c := range cases {
		files := map[string]string{}
		for k, v := range good {
			files[k] = v
		}
		files[c.file] = c.body
		_, err := load("t", writePart(t, files))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %q: error %v, want one containing %q", c.file, c.body, err, c.want)
		}
	}
}

func TestRunIsDeterministicAndShowsBothParts(t *testing.T) {
	root := filepath.Join("..", "..", "classifiers", "testdata", "eval")
	var a, b bytes.Buffer
	if err := run(&a, root, classifiers.EngineLexical, defaultParts, false, 0); err != nil {
		t.Fatal(err)
	}
	if err := run(&b, root, classifiers.EngineLexical, defaultParts, false, 0); err != nil {
		t.Fatal(err)
	}
	if a.String() != b.String() {
		t.Error("two runs printed different output")
	}
	for _, want := range []string{"== dev part", "== dev2 part", "== test part", "trap ranked below the answer: "} {
		if !strings.Contains(a.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if err := run(&a, root, "no-such-engine", defaultParts, false, 0); err == nil || !strings.Contains(err.Error(), "lexical") {
		t.Errorf("unknown engine: %v, want an error listing the engines", err)
	}
}

func TestPartsSelectsOnlyThePartsNamed(t *testing.T) {
	root := filepath.Join("..", "..", "classifiers", "testdata", "eval")
	var out bytes.Buffer
	if err := run(&out, root, classifiers.EngineLexical, "dev2, dev", false, 0); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "== dev part") || !strings.Contains(s, "== dev2 part") || strings.Contains(s, "== test part") {
		t.Errorf("-parts dev2,dev printed parts other than dev and dev2 (in that file order):\n%s", s)
	}
	if strings.Index(s, "== dev part") > strings.Index(s, "== dev2 part") {
		t.Error("parts are not printed in their fixed order")
	}
	if err := run(&out, root, classifiers.EngineLexical, "dev,nope", false, 0); err == nil || !strings.Contains(err.Error(), "dev2") {
		t.Errorf("unknown part: %v, want an error listing the parts", err)
	}
}
