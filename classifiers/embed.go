package classifiers

import "math"

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
func (v *Vectors) align(a, b *embedding) float32 {
	if a.known == 0 || len(b.words) == 0 {
		return 0
	}
	var sum float32
	for i, wa := range a.words {
		best := float32(-1)
		for _, wb := range b.words {
			c := float32(1)
			if wa != wb {
				c = v.dot(int(wa), int(wb))
			}
			if c > best {
				best = c
			}
		}
		sum += a.weights[i] * best
	}
	return sum / a.known
}
