package classifiers

import (
	"math"
	"slices"
	"sort"
)

// bag is a weighted bag of stems: a text, a label's profile or a document.
// Weights are term frequency times the approximate idf; stopwords are left
// out. Lookups go through exact (stem to index) and prefix (first four
// bytes to indexes) so a soft match costs a map read, not a scan.
type bag struct {
	stems   []string
	weights []float64
	counts  []float64 // raw (field-weighted) counts, for BM25
	exact   map[string]int
	prefix  map[string][]int
	length  int // content terms counted, for BM25's length normalisation
	norm    float64
}

// bagBuilder accumulates terms from several fields before weighting.
type bagBuilder struct {
	index  map[string]int
	stems  []string
	counts []float64
	length int
	// literal holds the stems of function words read as content words
	// (term.literal): they weigh as the most frequent content words do,
	// which is what they are, not as the rare words idf takes an unknown
	// stem for.
	literal map[string]bool
}

func newBagBuilder(sizeHint int) *bagBuilder {
	return &bagBuilder{index: make(map[string]int, sizeHint)}
}

// add counts the content terms of terms, each fieldWeight times.
func (b *bagBuilder) add(terms []term, fieldWeight float64) {
	for i := range terms {
		t := &terms[i]
		if t.stop {
			continue
		}
		b.length++
		if t.literal {
			if b.literal == nil {
				b.literal = make(map[string]bool)
			}
			b.literal[t.stem] = true
		}
		if j, ok := b.index[t.stem]; ok {
			b.counts[j] += fieldWeight
			continue
		}
		b.index[t.stem] = len(b.stems)
		b.stems = append(b.stems, t.stem)
		b.counts = append(b.counts, fieldWeight)
	}
}

// build weights the counts: sublinear, so that a word said five times is
// not five times the evidence.
func (b *bagBuilder) build() bag {
	g := bag{stems: b.stems, counts: b.counts, exact: b.index, length: b.length}
	g.weights = make([]float64, len(b.stems))
	var sq float64
	for i, s := range b.stems {
		rarity := idf(s)
		if b.literal[s] {
			rarity = idfCommon
		}
		w := rarity * (1 + math.Log(b.counts[i]))
		if b.counts[i] < 1 {
			w = rarity * b.counts[i]
		}
		g.weights[i] = w
		sq += w * w
		if len(s) >= 4 {
			if g.prefix == nil {
				g.prefix = make(map[string][]int, len(b.stems))
			}
			g.prefix[s[:4]] = append(g.prefix[s[:4]], i)
		}
	}
	g.norm = math.Sqrt(sq)
	return g
}

func bagOf(terms []term) bag {
	b := newBagBuilder(len(terms))
	b.add(terms, 1)
	return b.build()
}

// lookup returns the index of stem in g and how well it matches: 1 for the
// same stem, softMatch's value for a near one, 0 and -1 for none.
func (g *bag) lookup(stem string) (int, float64) {
	if j, ok := g.exact[stem]; ok {
		return j, 1
	}
	if len(stem) < 4 {
		return -1, 0
	}
	best, bestJ := 0.0, -1
	for _, j := range g.prefix[stem[:4]] {
		if m := softMatch(stem, g.stems[j]); m > best {
			best, bestJ = m, j
		}
	}
	return bestJ, best
}

// cosine is the cosine similarity of a text and a profile, counting soft
// matches at their reduced weight.
func cosine(text, profile *bag) float64 {
	if text.norm == 0 || profile.norm == 0 {
		return 0
	}
	var dot float64
	for i, s := range text.stems {
		if j, m := profile.lookup(s); j >= 0 {
			dot += text.weights[i] * profile.weights[j] * m
		}
	}
	return dot / (text.norm * profile.norm)
}

// BM25 parameters. A single document has no collection to measure an
// average length in: avgDocTerms is the content-word length of a short
// passage, which is what /v1/match is for.
const (
	bm25K1      = 1.2
	bm25B       = 0.75
	avgDocTerms = 16
)

// bm25 scores document against the query's content terms and returns it
// divided by the query's total idf, so that scores of different queries
// are comparable: 0 when nothing matches, about 1 when every query term
// occurs once in a document of average length, up to k1+1.
func bm25(query []term, document *bag) float64 {
	lengthNorm := bm25K1 * (1 - bm25B + bm25B*float64(document.length)/avgDocTerms)
	var score, total float64
	seen := make(map[string]struct{}, len(query))
	for i := range query {
		q := &query[i]
		if q.stop || q.stem == "?" {
			continue
		}
		if _, dup := seen[q.stem]; dup {
			continue
		}
		seen[q.stem] = struct{}{}
		w := idf(q.stem)
		total += w
		j, m := document.lookup(q.stem)
		if j < 0 {
			continue
		}
		tf := document.counts[j] * m
		score += w * tf * (bm25K1 + 1) / (tf + lengthNorm)
	}
	if total == 0 {
		return 0
	}
	return score / total
}

// bigramHits counts adjacent query content-term pairs that occur adjacent
// in the document too (stopwords skipped on both sides): phrase evidence
// that plain bags of words miss.
func bigramHits(query, document []term) int {
	qs := contentStems(query)
	if len(qs) < 2 {
		return 0
	}
	ds := contentStems(document)
	pairs := make(map[[2]string]struct{}, len(ds))
	for i := 1; i < len(ds); i++ {
		pairs[[2]string{ds[i-1], ds[i]}] = struct{}{}
	}
	hits := 0
	for i := 1; i < len(qs); i++ {
		if _, ok := pairs[[2]string{qs[i-1], qs[i]}]; ok {
			hits++
		}
	}
	return hits
}

func contentStems(terms []term) []string {
	out := make([]string, 0, len(terms))
	for i := range terms {
		if !terms[i].stop && terms[i].stem != "?" {
			out = append(out, terms[i].stem)
		}
	}
	return out
}

// sortScores orders by confidence, descending; equal confidences keep the
// caller's label order, so results are deterministic.
func sortScores(s []LabelScore) {
	sort.SliceStable(s, func(i, j int) bool { return s[i].Confidence > s[j].Confidence })
}

// inOneOrder returns labels sorted (labels itself when it is): the
// engines read a label set in one order, whatever the caller's. A set's
// centring and a softmax sum in the order the labels come, and float
// sums in another order moved a confidence in its fourth decimal, enough
// to cross a threshold or break a tie; the compiled set is cached once,
// not once per order.
func inOneOrder(labels []string) []string {
	if slices.IsSorted(labels) {
		return labels
	}
	sorted := slices.Clone(labels)
	slices.Sort(sorted)
	return sorted
}

// sortScoresByLabel orders by confidence, descending, and equal
// confidences by label (byte order): the result does not depend on the
// order the caller listed the labels in. The lexical engine's ties come
// from the words alone, so the caller's order must not break them.
func sortScoresByLabel(s []LabelScore) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].Confidence != s[j].Confidence {
			return s[i].Confidence > s[j].Confidence
		}
		return s[i].Label < s[j].Label
	})
}
