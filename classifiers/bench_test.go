package classifiers

import (
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/tokens"
)

// Short texts of the size the lexical engine is meant for (one to three
// sentences); the target is well under 200 µs per call.
var benchTexts = []string{
	"I was charged twice for my subscription and need a refund as soon as possible.",
	"The app crashes on start since the last update; error 0x80 on Android 14.",
	"Hi team, just checking whether my parcel has shipped yet. Thanks!",
	"You are all useless, fix this NOW or I cancel!!!",
	"Dear Sir or Madam, please find attached the signed contract for your records.",
}

var benchRequest = ClassifyRequest{
	Labels: []string{"billing", "technical", "account", "shipping", "other"},
	Descriptions: map[string]string{
		"billing":   "Payments, charges, refunds, invoices and plans",
		"technical": "Bugs, errors, crashes and slow pages",
		"account":   "Login, password, profile and security",
		"shipping":  "Delivery, tracking, couriers and parcels",
	},
	Examples: map[string][]string{
		"billing":  {"I want my money back"},
		"shipping": {"Where is my order?"},
	},
}

func benchSetup(b *testing.B) Engine {
	b.Helper()
	if err := tokens.Preload(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	return NewLexical()
}

func BenchmarkLexicalClassify(b *testing.B) {
	e := benchSetup(b)
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

func BenchmarkLexicalScore(b *testing.B) {
	e := benchSetup(b)
	attrs := []string{"urgency", "toxicity", "sentiment", "formality", "quality", "spam"}
	i := 0
	for b.Loop() {
		req := ScoreRequest{Source: benchTexts[i%len(benchTexts)], Attribute: attrs[i%len(attrs)]}
		if _, err := e.Score(ctx, req); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkLexicalMatch(b *testing.B) {
	e := benchSetup(b)
	queries := []string{"refund for double charge", "android app crash", "parcel shipping status"}
	i := 0
	for b.Loop() {
		req := MatchRequest{Query: queries[i%len(queries)], Source: benchTexts[i%len(benchTexts)]}
		if _, err := e.Match(ctx, req); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkLexicalClassifyNewLabels defeats the label-set cache: every call
// brings a label set the engine has not compiled yet, as a stream of
// one-off requests with different labels would.
func BenchmarkLexicalClassifyNewLabels(b *testing.B) {
	e := benchSetup(b)
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
