package main

import (
	"math"
	"sort"

	"github.com/tollgate/tollgate/classifiers"
)

// classifyRight is whether one classify item counts as right: the engine
// named the gold label in the given label order and in the reversed one,
// and tied in neither. A tie's label is the first tied one by name, not a
// decision; an answer right in one order only was decided by the order.
func classifyRight(given, reversed classifiers.ClassifyResult, gold string) bool {
	return !given.Tie && !reversed.Tie && given.Label == gold && reversed.Label == gold
}

// pairOrdered is whether a score pair is ordered right: equal scores are
// wrong, since an engine that cannot tell the texts apart has not ordered
// them.
func pairOrdered(higher, lower float64) bool { return higher > lower }

// rankOrder is the documents' indices from the highest score down. Among
// equal scores the less relevant document comes first, so an engine that
// cannot tell documents apart is never credited with the gold order by
// the luck of sorting.
func rankOrder(scores []float64, rel []int) []int {
	order := make([]int, len(scores))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		if scores[order[a]] != scores[order[b]] {
			return scores[order[a]] > scores[order[b]]
		}
		return rel[order[a]] < rel[order[b]]
	})
	return order
}

// reciprocalRank is 1/rank of the first document graded relevantGrade or
// more in the engine's ranking.
func reciprocalRank(scores []float64, rel []int) float64 {
	for pos, i := range rankOrder(scores, rel) {
		if rel[i] >= relevantGrade {
			return 1 / float64(pos+1)
		}
	}
	return 0
}

// answerOf is the index of the top-graded document and whether it is the
// only one with that grade.
func answerOf(rel []int) (int, bool) {
	best, unique := 0, true
	for i := 1; i < len(rel); i++ {
		switch {
		case rel[i] > rel[best]:
			best, unique = i, true
		case rel[i] == rel[best]:
			unique = false
		}
	}
	return best, unique
}

// trapBelow is whether the trap scored strictly below the answer; a tie
// is a failure, as the engine did not tell them apart.
func trapBelow(scores []float64, rel []int, trap int) bool {
	answer, _ := answerOf(rel)
	return scores[trap] < scores[answer]
}

func gain(rel int) float64 { return math.Pow(2, float64(rel)) - 1 }

// ndcgAt is the DCG of the first k documents in the engine's ranking
// (gain 2^rel-1, discount log2(position+1)) over the ideal DCG.
func ndcgAt(k int, scores []float64, rel []int) float64 {
	var dcg float64
	for pos, i := range rankOrder(scores, rel) {
		if pos == k {
			break
		}
		dcg += gain(rel[i]) / math.Log2(float64(pos)+2)
	}
	ideal := idealDCG(k, rel)
	if ideal == 0 {
		return 0
	}
	return dcg / ideal
}

func idealDCG(k int, rel []int) float64 {
	sorted := append([]int(nil), rel...)
	sort.Sort(sort.Reverse(sort.IntSlice(sorted)))
	var dcg float64
	for pos := 0; pos < k && pos < len(sorted); pos++ {
		dcg += gain(sorted[pos]) / math.Log2(float64(pos)+2)
	}
	return dcg
}

// randomNDCGAt is the expected DCG@k of a uniformly random order divided
// by the ideal DCG: every document is equally likely at every position.
func randomNDCGAt(k int, rel []int) float64 {
	var disc float64
	for pos := 0; pos < k && pos < len(rel); pos++ {
		disc += 1 / math.Log2(float64(pos)+2)
	}
	var g float64
	for _, r := range rel {
		g += gain(r)
	}
	return g * disc / float64(len(rel)) / idealDCG(k, rel)
}

func reversed(labels []string) []string {
	out := make([]string, len(labels))
	for i, l := range labels {
		out[len(labels)-1-i] = l
	}
	return out
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// metOrNot is a goal's verdict as make eval and make bench print it.
func metOrNot(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}
