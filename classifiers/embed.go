package classifiers

import (
	"cmp"
	"math"
	"slices"
)

// A text's meaning, for the semantic engine, is the weighted mean of its
// words' vectors (Arora et al.'s SIF): each word weighs sifA/(sifA+p),
// where p is its probability in English. The vectors file lists words by
// frequency, so p comes from the word's rank by Zipf's law; frequent
// words ("make", "thing") weigh little, telling ones ("refund",
// "parcel") close to 1. The common direction that SIF removes from
// sentence vectors was removed from the word vectors at conversion.
const (
	sifA = 1e-4
	// zipfNorm is the harmonic number of the vocabulary GloVe counted
	// (400k words): p(rank) ≈ 1/((rank+1)·zipfNorm).
	zipfNorm = 13.5
)

// embedding is an analysed text in vector space: its normalised mean
// vector, and the words it was made of with their weights, for the
// word-by-word alignments.
type embedding struct {
	vec     []float32 // unit length, or all zero when no word was known
	words   []int32   // vector indexes of the known content words
	weights []float32 // their SIF weights
	known   float32   // sum of weights
}

func sifWeight(rank int) float32 {
	p := 1 / (float64(rank+1) * zipfNorm)
	return float32(sifA / (sifA + p))
}

// wordIndex finds a term in the vectors: its surface form, else its stem
// (GloVe has "parcels" and "parcel", but not every inflection of rare
// words), else -1.
func (v *Vectors) wordIndex(t *term) int {
	if i := v.Index(t.word); i >= 0 {
		return i
	}
	if t.stem != t.word {
		if i := v.Index(t.stem); i >= 0 {
			return i
		}
	}
	return -1
}

// embed builds the embedding of terms, skipping function words: they say
// nothing about topic and, being frequent, weigh almost nothing anyway.
// Repeated words count once per occurrence.
func (v *Vectors) embed(terms []term) embedding {
	e := embedding{vec: make([]float32, v.dims)}
	for i := range terms {
		t := &terms[i]
		if t.stop || t.stem == "?" {
			continue
		}
		idx := v.wordIndex(t)
		if idx < 0 {
			continue
		}
		w := sifWeight(idx)
		v.addTo(e.vec, idx, w)
		e.words = append(e.words, int32(idx))
		e.weights = append(e.weights, w)
		e.known += w
	}
	Normalize(e.vec)
	return e
}

// effectiveWords is how many words the embedding's mean is made of, its
// weights counted as Kish's effective sample size: (Σw)²/Σw², 0 for none.
func (e *embedding) effectiveWords() float64 {
	var s1, s2 float64
	for _, w := range e.weights {
		s1 += float64(w)
		s2 += float64(w) * float64(w)
	}
	if s2 == 0 {
		return 0
	}
	return s1 * s1 / s2
}

// embedText analyses and embeds a text.
func (v *Vectors) embedText(text string) embedding {
	return v.embed(analyze(text).terms)
}

// Normalize scales x to unit length in place; a zero vector stays zero.
// The vectors converter uses it too, before retrofitting.
func Normalize(x []float32) {
	var s float64
	for _, c := range x {
		s += float64(c) * float64(c)
	}
	if s == 0 {
		return
	}
	inv := float32(1 / math.Sqrt(s))
	for i := range x {
		x[i] *= inv
	}
}

func dot(a, b []float32) float32 {
	var s float32
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// align is how much of a's meaning b covers: for each word of a, the
// cosine of its closest word in b, averaged with a's weights. Unlike the
// cosine of the means it rewards a text whose every word has a close
// partner, and it is not symmetric: align(query, document) asks whether
// the document speaks of everything the query asks about.
//
// Each distinct word is compared once, and the words compared are
// bounded: a word of a with every word of b was quadratic in the texts'
// length, and two 64 KiB texts took a minute of CPU in one /v1/match call.
// Past alignMaxA distinct words a keeps its rarest (the heaviest), and
// past alignMaxB so does b; texts under both, every real query, score as
// before, to the bit.
func (v *Vectors) align(a, b *embedding) float32 {
	if a.known == 0 || len(b.words) == 0 {
		return 0
	}
	others := distinctWords(b.words, keptWords(b, alignMaxB))
	kept := keptWords(a, alignMaxA)
	best := make(map[int32]float32, min(len(a.words), alignMaxA))
	var sum, known float32
	for i, wa := range a.words {
		if kept != nil && !kept[wa] {
			continue
		}
		c, seen := best[wa]
		if !seen {
			c = -1
			for _, wb := range others {
				d := float32(1)
				if wa != wb {
					d = v.dot(int(wa), int(wb))
				}
				if d > c {
					c = d
				}
			}
			best[wa] = c
		}
		sum += a.weights[i] * c
		known += a.weights[i]
	}
	if kept == nil {
		known = a.known
	}
	return sum / known
}

// Bounds of align's work: at most alignMaxA × alignMaxB dot products.
const (
	alignMaxA = 64
	alignMaxB = 4096
)

// distinctWords is words without repeats, in order, only those in kept
// unless it is nil.
func distinctWords(words []int32, kept map[int32]bool) []int32 {
	seen := make(map[int32]struct{}, len(words))
	out := make([]int32, 0, len(words))
	for _, w := range words {
		if _, ok := seen[w]; ok || kept != nil && !kept[w] {
			continue
		}
		seen[w] = struct{}{}
		out = append(out, w)
	}
	return out
}

// keptWords is the set of e's limit heaviest distinct words, or nil when
// e has no more than limit.
func keptWords(e *embedding, limit int) map[int32]bool {
	weight := make(map[int32]float32, len(e.words))
	for i, w := range e.words {
		weight[w] = e.weights[i]
	}
	if len(weight) <= limit {
		return nil
	}
	words := make([]int32, 0, len(weight))
	for w := range weight {
		words = append(words, w)
	}
	slices.SortFunc(words, func(x, y int32) int {
		return cmp.Or(cmp.Compare(weight[y], weight[x]), cmp.Compare(x, y))
	})
	kept := make(map[int32]bool, limit)
	for _, w := range words[:limit] {
		kept[w] = true
	}
	return kept
}
