// Command tollgate-eval scores the lexical classification engine on the
// hand-labelled set in classifiers/testdata/eval: accuracy for classify,
// agreement for score, NDCG@5 for match (`make eval`). With -bench it
// measures the engine's latency and throughput on the same texts instead
// (`make bench`). The evaluation output is deterministic.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/tokens"
)

type labelSet struct {
	Labels       []string            `json:"labels"`
	Descriptions map[string]string   `json:"descriptions"`
	Examples     map[string][]string `json:"examples"`
}

type classifyItem struct {
	Set    string   `json:"set"`
	Labels []string `json:"labels"`
	Text   string   `json:"text"`
	Label  string   `json:"label"`
}

type scoreItem struct {
	Attribute string  `json:"attribute"`
	Text      string  `json:"text"`
	Score     float64 `json:"score"`
}

type matchPool struct {
	Docs    []string `json:"docs"`
	Queries []struct {
		Query     string `json:"query"`
		Relevance []int  `json:"relevance"`
	} `json:"queries"`
}

type evalSet struct {
	sets     map[string]labelSet
	classify []classifyItem
	score    []scoreItem
	match    []matchPool
}

func main() {
	dir := flag.String("dir", "classifiers/testdata/eval/dev", "directory of the evaluation set")
	bench := flag.Bool("bench", false, "measure latency and throughput instead of quality")
	rounds := flag.Int("rounds", 30, "with -bench: passes over the evaluation texts per operation")
	flag.Parse()

	set, err := load(*dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tollgate-eval: %v\n", err)
		os.Exit(1)
	}
	engine := classifiers.NewLexical()
	if *bench {
		runBench(os.Stdout, engine, set, *rounds)
		return
	}
	if err := evaluate(os.Stdout, engine, set, *dir); err != nil {
		fmt.Fprintf(os.Stderr, "tollgate-eval: %v\n", err)
		os.Exit(1)
	}
}

func load(dir string) (*evalSet, error) {
	s := &evalSet{}
	raw, err := os.ReadFile(filepath.Join(dir, "sets.json"))
	if err != nil {
		return nil, fmt.Errorf("reading label sets: %w", err)
	}
	if err := json.Unmarshal(raw, &s.sets); err != nil {
		return nil, fmt.Errorf("parsing sets.json: %w", err)
	}
	if err := readJSONL(filepath.Join(dir, "classify.jsonl"), &s.classify); err != nil {
		return nil, err
	}
	if err := readJSONL(filepath.Join(dir, "score.jsonl"), &s.score); err != nil {
		return nil, err
	}
	if err := readJSONL(filepath.Join(dir, "match.jsonl"), &s.match); err != nil {
		return nil, err
	}
	for i, it := range s.classify {
		if _, ok := s.sets[it.Set]; !ok {
			return nil, fmt.Errorf("classify.jsonl line %d: unknown set %q", i+1, it.Set)
		}
	}
	for i, p := range s.match {
		for _, q := range p.Queries {
			if len(q.Relevance) != len(p.Docs) {
				return nil, fmt.Errorf("match.jsonl line %d: query %q grades %d of %d documents", i+1, q.Query, len(q.Relevance), len(p.Docs))
			}
		}
	}
	return s, nil
}

func readJSONL[T any](path string, out *[]T) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("reading evaluation set: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			return fmt.Errorf("%s line %d: %w", filepath.Base(path), n, err)
		}
		*out = append(*out, v)
	}
	return sc.Err()
}

func (s *evalSet) texts() int {
	n := len(s.classify) + len(s.score)
	for _, p := range s.match {
		n += len(p.Docs) + len(p.Queries)
	}
	return n
}

func (s *evalSet) classifyRequest(it classifyItem, withHelp bool) classifiers.ClassifyRequest {
	req := classifiers.ClassifyRequest{Text: it.Text, Labels: it.Labels, Mode: classifiers.ModeSingle}
	if withHelp {
		ls := s.sets[it.Set]
		req.Descriptions, req.Examples = ls.Descriptions, ls.Examples
	}
	return req
}

func evaluate(w io.Writer, engine classifiers.Engine, s *evalSet, dir string) error {
	ctx := context.Background()
	queries := 0
	for _, p := range s.match {
		queries += len(p.Queries)
	}
	fmt.Fprintf(w, "tollgate-eval: %s engine on %s: %d texts (%d classify, %d score, %d match queries over %d documents)\n\n",
		engine.Name(), dir, s.texts(), len(s.classify), len(s.score), queries, s.texts()-len(s.classify)-len(s.score)-queries)

	// classify
	setNames := sortedKeys(s.sets)
	type tally struct{ n, withHelp, bare, tiesWithHelp, tiesBare int }
	per := map[string]*tally{}
	var total tally
	var chance float64
	for _, it := range s.classify {
		t := per[it.Set]
		if t == nil {
			t = &tally{}
			per[it.Set] = t
		}
		t.n++
		total.n++
		chance += 1 / float64(len(it.Labels))
		for _, help := range []bool{true, false} {
			res, err := engine.Classify(ctx, s.classifyRequest(it, help))
			if err != nil {
				return fmt.Errorf("classify %q: %w", it.Text, err)
			}
			if res.Tie {
				// The engine said it could not decide: its label is the
				// first tied one by name, not a prediction.
				if help {
					total.tiesWithHelp++
				} else {
					total.tiesBare++
				}
				continue
			}
			if res.Label == it.Label {
				if help {
					t.withHelp++
					total.withHelp++
				} else {
					t.bare++
					total.bare++
				}
			}
		}
	}
	fmt.Fprintln(w, "classify: accuracy of the top label (single mode)")
	fmt.Fprintf(w, "  %-12s %5s %8s %22s %12s\n", "set", "items", "labels", "with descriptions+ex.", "labels only")
	for _, name := range setNames {
		t := per[name]
		if t == nil {
			continue
		}
		fmt.Fprintf(w, "  %-12s %5d %8d %21.1f%% %11.1f%%\n", name, t.n, len(s.sets[name].Labels), pct(t.withHelp, t.n), pct(t.bare, t.n))
	}
	fmt.Fprintf(w, "  %-12s %5d %8s %21.1f%% %11.1f%%\n", "overall", total.n, "", pct(total.withHelp, total.n), pct(total.bare, total.n))
	fmt.Fprintf(w, "  ties, counted as misses: %d with descriptions+ex., %d labels only\n", total.tiesWithHelp, total.tiesBare)
	fmt.Fprintf(w, "  chance (one label at random): %.1f%%\n\n", 100*chance/float64(total.n))

	// score
	byAttr := map[string][][2]float64{} // gold, predicted
	for _, it := range s.score {
		res, err := engine.Score(ctx, classifiers.ScoreRequest{Source: it.Text, Attribute: it.Attribute})
		if err != nil {
			return fmt.Errorf("score %q: %w", it.Text, err)
		}
		byAttr[it.Attribute] = append(byAttr[it.Attribute], [2]float64{it.Score, res.Score})
	}
	fmt.Fprintln(w, "score: agreement with the gold score (0, 0.25, 0.5, 0.75 or 1)")
	fmt.Fprintln(w, "  within 0.25: share of items with |predicted - gold| <= 0.25")
	fmt.Fprintln(w, "  pairwise: share of item pairs with different gold scores that the engine orders the same way (ties count half)")
	fmt.Fprintf(w, "  %-12s %5s %12s %10s %10s %10s\n", "attribute", "items", "within 0.25", "pairwise", "spearman", "mean |err|")
	var all [][2]float64
	var pairSum float64
	for _, a := range sortedKeys(byAttr) {
		xs := byAttr[a]
		all = append(all, xs...)
		pw := pairwise(xs)
		pairSum += pw
		fmt.Fprintf(w, "  %-12s %5d %11.1f%% %9.1f%% %10.3f %10.3f\n", a, len(xs), 100*within(xs, 0.25), 100*pw, spearman(xs), meanAbsErr(xs))
	}
	fmt.Fprintf(w, "  %-12s %5d %11.1f%% %9.1f%% %10s %10.3f\n\n", "overall", len(all), 100*within(all, 0.25), 100*pairSum/float64(len(byAttr)), "", meanAbsErr(all))

	// match
	var ndcgSum, randomSum float64
	n := 0
	for _, p := range s.match {
		for _, q := range p.Queries {
			scores := make([]float64, len(p.Docs))
			for i, d := range p.Docs {
				res, err := engine.Match(ctx, classifiers.MatchRequest{Source: d, Query: q.Query})
				if err != nil {
					return fmt.Errorf("match %q: %w", q.Query, err)
				}
				scores[i] = res.Score
			}
			ndcgSum += ndcgAt(5, scores, q.Relevance)
			randomSum += randomNDCGAt(5, q.Relevance)
			n++
		}
	}
	fmt.Fprintln(w, "match: NDCG@5 of each query's candidates ranked by score (graded relevance 0-3, gain 2^rel - 1)")
	fmt.Fprintf(w, "  queries %d, candidates per query %d\n", n, len(s.match[0].Docs))
	fmt.Fprintf(w, "  mean NDCG@5: %.3f   (random order: %.3f)\n", ndcgSum/float64(n), randomSum/float64(n))
	return nil
}

func pct(a, b int) float64 { return 100 * float64(a) / float64(b) }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func within(xs [][2]float64, tol float64) float64 {
	ok := 0
	for _, x := range xs {
		if math.Abs(x[0]-x[1]) <= tol+1e-9 {
			ok++
		}
	}
	return float64(ok) / float64(len(xs))
}

func meanAbsErr(xs [][2]float64) float64 {
	var s float64
	for _, x := range xs {
		s += math.Abs(x[0] - x[1])
	}
	return s / float64(len(xs))
}

// pairwise is the share of pairs with different gold scores that the
// predictions order the same way; tied predictions count half.
func pairwise(xs [][2]float64) float64 {
	var agree float64
	pairs := 0
	for i := range xs {
		for j := i + 1; j < len(xs); j++ {
			g := xs[i][0] - xs[j][0]
			if g == 0 {
				continue
			}
			pairs++
			p := xs[i][1] - xs[j][1]
			switch {
			case p == 0:
				agree += 0.5
			case (p > 0) == (g > 0):
				agree++
			}
		}
	}
	if pairs == 0 {
		return 0
	}
	return agree / float64(pairs)
}

func spearman(xs [][2]float64) float64 {
	gold := make([]float64, len(xs))
	pred := make([]float64, len(xs))
	for i, x := range xs {
		gold[i], pred[i] = x[0], x[1]
	}
	return pearson(ranks(gold), ranks(pred))
}

// ranks gives average ranks to ties.
func ranks(v []float64) []float64 {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return v[idx[a]] < v[idx[b]] })
	r := make([]float64, len(v))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && v[idx[j+1]] == v[idx[i]] {
			j++
		}
		avg := float64(i+j)/2 + 1
		for k := i; k <= j; k++ {
			r[idx[k]] = avg
		}
		i = j + 1
	}
	return r
}

func pearson(a, b []float64) float64 {
	n := float64(len(a))
	var ma, mb float64
	for i := range a {
		ma += a[i]
		mb += b[i]
	}
	ma /= n
	mb /= n
	var cov, va, vb float64
	for i := range a {
		cov += (a[i] - ma) * (b[i] - mb)
		va += (a[i] - ma) * (a[i] - ma)
		vb += (b[i] - mb) * (b[i] - mb)
	}
	if va == 0 || vb == 0 {
		return 0
	}
	return cov / math.Sqrt(va*vb)
}

func gain(rel int) float64 { return math.Pow(2, float64(rel)) - 1 }

// ndcgAt ranks candidates by score, descending; among equal scores the
// less relevant document comes first, so a scorer that cannot tell
// documents apart is never credited with the gold order by luck of sorting.
func ndcgAt(k int, scores []float64, rel []int) float64 {
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
	var dcg float64
	for pos := 0; pos < k && pos < len(order); pos++ {
		dcg += gain(rel[order[pos]]) / math.Log2(float64(pos)+2)
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

// runBench times every classify, score and match call of the evaluation
// set, rounds times over, on one goroutine (latency percentiles) and then
// on GOMAXPROCS goroutines (throughput).
func runBench(w io.Writer, engine classifiers.Engine, s *evalSet, rounds int) {
	ctx := context.Background()
	_ = tokens.Preload()
	type op struct {
		name  string
		calls []func()
	}
	var classify, score, match []func()
	for _, it := range s.classify {
		req := s.classifyRequest(it, true)
		classify = append(classify, func() { _, _ = engine.Classify(ctx, req) })
	}
	for _, it := range s.score {
		req := classifiers.ScoreRequest{Source: it.Text, Attribute: it.Attribute}
		score = append(score, func() { _, _ = engine.Score(ctx, req) })
	}
	for _, p := range s.match {
		for _, q := range p.Queries {
			for _, d := range p.Docs {
				req := classifiers.MatchRequest{Source: d, Query: q.Query}
				match = append(match, func() { _, _ = engine.Match(ctx, req) })
			}
		}
	}
	procs := runtime.GOMAXPROCS(0)
	fmt.Fprintf(w, "lexical engine, %d passes over the evaluation texts; %d cores\n", rounds, runtime.NumCPU())
	fmt.Fprintf(w, "%-10s %9s %10s %10s %14s %14s\n", "operation", "calls", "p50 µs", "p99 µs", "calls/s (1)", fmt.Sprintf("calls/s (%d)", procs))
	for _, o := range []op{{"classify", classify}, {"score", score}, {"match", match}} {
		for _, c := range o.calls { // warm-up
			c()
		}
		lat := make([]time.Duration, 0, rounds*len(o.calls))
		start := time.Now()
		for r := 0; r < rounds; r++ {
			for _, c := range o.calls {
				t0 := time.Now()
				c()
				lat = append(lat, time.Since(t0))
			}
		}
		serial := float64(len(lat)) / time.Since(start).Seconds()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })

		var wg sync.WaitGroup
		start = time.Now()
		for p := 0; p < procs; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := 0; r < rounds; r++ {
					for _, c := range o.calls {
						c()
					}
				}
			}()
		}
		wg.Wait()
		parallel := float64(procs*rounds*len(o.calls)) / time.Since(start).Seconds()
		fmt.Fprintf(w, "%-10s %9d %10.1f %10.1f %14.0f %14.0f\n", o.name, len(lat),
			micros(lat[len(lat)/2]), micros(lat[len(lat)*99/100]), serial, parallel)
	}
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
