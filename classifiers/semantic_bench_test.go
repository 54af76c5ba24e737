package classifiers

import (
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/tokens"
)

// The semantic engine on the same texts as the lexical benchmarks, side
// by side: go test -run '^$' -bench 'Lexical|Semantic' ./classifiers.

func semanticBenchSetup(b *testing.B) Engine {
	b.Helper()
	if err := tokens.Preload(); err != nil {
		b.Fatal(err)
	}
	e := semanticForTest(b)
	b.ReportAllocs()
	return e
}

func BenchmarkSemanticClassify(b *testing.B) {
	e := semanticBenchSetup(b)
	req := benchRequest
	i := 0
	for b.Loop() {
		req.Text = benchTexts[i%len(benchTexts)]
		if _, err := e.Classify(ctx, req); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkSemanticClassifyLabelNamesOnly(b *testing.B) {
	e := semanticBenchSetup(b)
	req := ClassifyRequest{Labels: benchRequest.Labels}
	i := 0
	for b.Loop() {
		req.Text = benchTexts[i%len(benchTexts)]
		if _, err := e.Classify(ctx, req); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkSemanticScore(b *testing.B) {
	e := semanticBenchSetup(b)
	attrs := []string{"urgency", "toxicity", "sentiment", "formality", "quality", "spam", "politeness"}
	i := 0
	for b.Loop() {
		req := ScoreRequest{Source: benchTexts[i%len(benchTexts)], Attribute: attrs[i%len(attrs)]}
		if _, err := e.Score(ctx, req); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkSemanticMatch(b *testing.B) {
	e := semanticBenchSetup(b)
	i := 0
	for b.Loop() {
		req := MatchRequest{Query: "why was I charged twice", Source: benchTexts[i%len(benchTexts)]}
		if _, err := e.Match(ctx, req); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkSemanticClassifyNewLabels: every call brings a label set not
// seen before (five labels), so it pays for compiling them.
func BenchmarkSemanticClassifyNewLabels(b *testing.B) {
	e := semanticBenchSetup(b)
	i := 0
	for b.Loop() {
		req := benchRequest
		req.Text = benchTexts[i%len(benchTexts)]
		req.Labels = append([]string{"other " + strconv.Itoa(i)}, benchRequest.Labels[:4]...)
		if _, err := e.Classify(ctx, req); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
