package main

import (
	"context"
	"fmt"
	"io"

	"github.com/tollgate/tollgate/classifiers"
)

// partResult is what a part's table says overall, for the goals.
type partResult struct {
	namesOnly, withHelp float64 // classify accuracy in %, both orders
	pairs               float64 // score pairs ordered right, %
	mrr                 float64
	traps, trapsBelow   int
}

// evaluate prints one part's table: classify, score and match, each
// measured as the README's "Evaluation" section says.
func evaluate(w io.Writer, engine classifiers.Engine, p *part, about string) (partResult, error) {
	var r partResult
	fmt.Fprintf(w, "== %s part (%s): %s\n", p.name, p.dir, about)
	fmt.Fprintf(w, "%s engine; %d classify texts in %d label sets, %d score pairs, %d match queries\n\n",
		engine.Name(), len(p.classify), len(p.sets), len(p.pairs), p.queries())
	if err := reportClassify(w, engine, p, &r); err != nil {
		return r, err
	}
	if err := reportScore(w, engine, p, &r); err != nil {
		return r, err
	}
	return r, reportMatch(w, engine, p, &r)
}

// reportGoals prints issue 11's quality goals for the offline engine
// against a part's results: they are judged on the test part, the one
// never tuned on. Latency and memory are judged by -bench (runBench).
func reportGoals(w io.Writer, r partResult) {
	fmt.Fprintln(w, "\ngoals (test part; p99 and memory: tollgate-eval -bench, which make bench runs):")
	fmt.Fprintf(w, "  classify, names only:        %5.1f%%  at least 70%%: %s\n", r.namesOnly, metOrNot(r.namesOnly >= 70))
	fmt.Fprintf(w, "  classify, with descriptions: %5.1f%%  at least 85%%: %s\n", r.withHelp, metOrNot(r.withHelp >= 85))
	fmt.Fprintf(w, "  score pairs ordered:         %5.1f%%  at least 90%%: %s\n", r.pairs, metOrNot(r.pairs >= 90))
	fmt.Fprintf(w, "  match MRR:                   %5.3f   at least 0.85: %s\n", r.mrr, metOrNot(r.mrr >= 0.85))
	if r.traps > 0 {
		fmt.Fprintf(w, "  traps below the answer:      %d of %d  at least 8 in 10: %s\n", r.trapsBelow, r.traps,
			metOrNot(10*r.trapsBelow >= 8*r.traps))
	}
}

func (p *part) queries() int {
	n := 0
	for _, mp := range p.match {
		n += len(mp.Queries)
	}
	return n
}

// classifyTally counts, for one way of asking (names only or with
// descriptions and examples), the items right in both orders, the items
// where either order tied, and the items right in one order only.
type classifyTally struct{ right, ties, oneOrder int }

func (t *classifyTally) add(given, rev classifiers.ClassifyResult, gold string) {
	switch {
	case classifyRight(given, rev, gold):
		t.right++
	case given.Tie || rev.Tie:
		t.ties++
	case given.Label == gold || rev.Label == gold:
		t.oneOrder++
	}
}

// askBothOrders classifies it in the given label order and reversed.
func (p *part) askBothOrders(ctx context.Context, engine classifiers.Engine, it classifyItem, help bool) (given, rev classifiers.ClassifyResult, err error) {
	req := classifiers.ClassifyRequest{Text: it.Text, Labels: it.Labels, Mode: classifiers.ModeSingle}
	if help {
		ls := p.sets[it.Set]
		req.Descriptions, req.Examples = ls.Descriptions, ls.Examples
	}
	if given, err = engine.Classify(ctx, req); err != nil {
		return given, rev, fmt.Errorf("classify %q: %w", it.Text, err)
	}
	req.Labels = reversed(it.Labels)
	if rev, err = engine.Classify(ctx, req); err != nil {
		return given, rev, fmt.Errorf("classify %q: %w", it.Text, err)
	}
	return given, rev, nil
}

// classifyTallies asks every item four times: names only and with
// descriptions and examples, each in both label orders. Index 0 of each
// result is names only, 1 with descriptions.
func classifyTallies(engine classifiers.Engine, p *part) (perSet map[string]*[2]classifyTally, total [2]classifyTally, chance float64, err error) {
	ctx := context.Background()
	perSet = make(map[string]*[2]classifyTally)
	for _, it := range p.classify {
		t := perSet[it.Set]
		if t == nil {
			t = &[2]classifyTally{}
			perSet[it.Set] = t
		}
		chance += 1 / float64(len(it.Labels))
		for i, help := range []bool{false, true} {
			given, rev, err := p.askBothOrders(ctx, engine, it, help)
			if err != nil {
				return nil, total, 0, err
			}
			t[i].add(given, rev, it.Label)
			total[i].add(given, rev, it.Label)
		}
	}
	return perSet, total, chance / float64(len(p.classify)), nil
}

func reportClassify(w io.Writer, engine classifiers.Engine, p *part, r *partResult) error {
	perSet, total, chance, err := classifyTallies(engine, p)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "classify: top label right in both label orders (as given, and reversed); a tie is a miss")
	fmt.Fprintf(w, "  %-10s %5s %6s %11s %16s\n", "set", "items", "labels", "names only", "with desc.+ex.")
	counts := map[string]int{}
	for _, it := range p.classify {
		counts[it.Set]++
	}
	for _, name := range sortedKeys(perSet) {
		t := perSet[name]
		fmt.Fprintf(w, "  %-10s %5d %6d %10.1f%% %15.1f%%\n", name, counts[name], len(p.sets[name].Labels),
			pct(t[0].right, counts[name]), pct(t[1].right, counts[name]))
	}
	n := len(p.classify)
	r.namesOnly, r.withHelp = pct(total[0].right, n), pct(total[1].right, n)
	fmt.Fprintf(w, "  %-10s %5d %6s %10.1f%% %15.1f%%\n", "overall", n, "", r.namesOnly, r.withHelp)
	fmt.Fprintf(w, "  misses that tied in either order: %d names only, %d with desc.+ex.\n", total[0].ties, total[1].ties)
	fmt.Fprintf(w, "  misses right in one order only:   %d names only, %d with desc.+ex.\n", total[0].oneOrder, total[1].oneOrder)
	fmt.Fprintf(w, "  chance (one label at random): %.1f%%\n\n", 100*chance)
	return nil
}

type scoreKey struct{ attribute, description, text string }

func reportScore(w io.Writer, engine classifiers.Engine, p *part, r *partResult) error {
	ctx := context.Background()
	cache := map[scoreKey]float64{}
	score := func(k scoreKey) (float64, error) {
		if s, ok := cache[k]; ok {
			return s, nil
		}
		res, err := engine.Score(ctx, classifiers.ScoreRequest{Source: k.text, Attribute: k.attribute, Description: k.description})
		if err != nil {
			return 0, fmt.Errorf("score %q on %s: %w", k.text, k.attribute, err)
		}
		cache[k] = res.Score
		return res.Score, nil
	}
	type tally struct{ pairs, ordered, equal int }
	per := map[string]*tally{}
	var total tally
	if len(p.pairs) == 0 {
		fmt.Fprintln(w, "score: no pairs in this part")
		fmt.Fprintln(w)
		return nil
	}
	for _, sp := range p.pairs {
		hi, err := score(scoreKey{sp.Attribute, sp.Description, sp.Higher})
		if err != nil {
			return err
		}
		lo, err := score(scoreKey{sp.Attribute, sp.Description, sp.Lower})
		if err != nil {
			return err
		}
		t := per[sp.Attribute]
		if t == nil {
			t = &tally{}
			per[sp.Attribute] = t
		}
		for _, t := range []*tally{t, &total} {
			t.pairs++
			if pairOrdered(hi, lo) {
				t.ordered++
			} else if hi == lo {
				t.equal++
			}
		}
	}
	if p.scored > 0 {
		fmt.Fprintf(w, "score: pairs ordered right (pairs: every two of %d texts of one attribute with different gold scores)\n", p.scored)
	} else {
		fmt.Fprintln(w, "score: pairs ordered right (the higher text scored strictly higher)")
	}
	fmt.Fprintf(w, "  %-13s %5s %8s %14s\n", "attribute", "pairs", "ordered", "equal (wrong)")
	for _, a := range sortedKeys(per) {
		t := per[a]
		fmt.Fprintf(w, "  %-13s %5d %7.1f%% %14d\n", a, t.pairs, pct(t.ordered, t.pairs), t.equal)
	}
	r.pairs = pct(total.ordered, total.pairs)
	fmt.Fprintf(w, "  %-13s %5d %7.1f%% %14d\n\n", "overall", total.pairs, r.pairs, total.equal)
	return nil
}

func reportMatch(w io.Writer, engine classifiers.Engine, p *part, r *partResult) error {
	ctx := context.Background()
	if len(p.match) == 0 {
		fmt.Fprintln(w, "match: no queries in this part")
		return nil
	}
	var rr, ndcg, random float64
	queries, traps, below, docs := 0, 0, 0, 0
	for _, mp := range p.match {
		docs += len(mp.Docs)
		for _, q := range mp.Queries {
			scores := make([]float64, len(mp.Docs))
			for i, d := range mp.Docs {
				res, err := engine.Match(ctx, classifiers.MatchRequest{Source: d, Query: q.Query})
				if err != nil {
					return fmt.Errorf("match %q: %w", q.Query, err)
				}
				scores[i] = res.Score
			}
			queries++
			rr += reciprocalRank(scores, q.Relevance)
			ndcg += ndcgAt(5, scores, q.Relevance)
			random += randomNDCGAt(5, q.Relevance)
			if q.Trap != nil {
				traps++
				if trapBelow(scores, q.Relevance, *q.Trap) {
					below++
				}
			}
		}
	}
	r.mrr, r.traps, r.trapsBelow = rr/float64(queries), traps, below
	fmt.Fprintf(w, "match: %d queries, each ranking its pool (%d pools, %d documents); equal scores rank the less relevant first\n", queries, len(p.match), docs)
	fmt.Fprintf(w, "  MRR (first document graded %d+): %.3f\n", relevantGrade, r.mrr)
	fmt.Fprintf(w, "  NDCG@5 (grades 0-3): %.3f   (random order: %.3f)\n", ndcg/float64(queries), random/float64(queries))
	if traps == 0 {
		fmt.Fprintln(w, "  trap ranked below the answer: no trap queries in this part")
	} else {
		fmt.Fprintf(w, "  trap ranked below the answer: %d of %d trap queries (%.1f%%)\n", below, traps, pct(below, traps))
	}
	return nil
}
