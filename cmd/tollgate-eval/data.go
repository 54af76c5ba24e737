package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// The files of one part (dev or test). sets.json and classify.jsonl are
// required; score.jsonl (texts with a gold score, turned into pairs),
// score_pairs.jsonl (explicit pairs) and match.jsonl are optional, for a
// part written to measure classify alone (dev3).

type labelSet struct {
	Labels       []string            `json:"labels"`
	Descriptions map[string]string   `json:"descriptions"`
	Examples     map[string][]string `json:"examples"`
}

type classifyItem struct {
	Set    string   `json:"set"`
	Labels []string `json:"labels"` // optional: the set's labels
	Text   string   `json:"text"`
	Label  string   `json:"label"`
}

type scoreItem struct {
	Attribute string  `json:"attribute"`
	Text      string  `json:"text"`
	Score     float64 `json:"score"`
}

// scorePair: Higher should score strictly above Lower on Attribute.
type scorePair struct {
	Attribute   string `json:"attribute"`
	Description string `json:"description"`
	Higher      string `json:"higher"`
	Lower       string `json:"lower"`
}

type matchQuery struct {
	Query     string `json:"query"`
	Relevance []int  `json:"relevance"` // 0-3 per document of the pool
	// Trap is the index of a document that shares the query's words but
	// does not answer it; nil when the query has none.
	Trap *int `json:"trap"`
}

type matchPool struct {
	Docs    []string     `json:"docs"`
	Queries []matchQuery `json:"queries"`
}

type part struct {
	name, dir string
	sets      map[string]labelSet
	classify  []classifyItem
	pairs     []scorePair
	scored    int // texts with a gold score that the pairs were made from
	match     []matchPool
}

// relevantGrade is the lowest grade that counts as answering the query,
// for MRR and for "the answer" a trap must rank below.
const relevantGrade = 2

func load(name, dir string) (*part, error) {
	p := &part{name: name, dir: dir}
	if err := loadSets(filepath.Join(dir, "sets.json"), &p.sets); err != nil {
		return nil, err
	}
	if err := readJSONL(filepath.Join(dir, "classify.jsonl"), true, func(it classifyItem) error { return p.addClassify(it) }); err != nil {
		return nil, err
	}
	var items []scoreItem
	errScore := readJSONL(filepath.Join(dir, "score.jsonl"), false, func(it scoreItem) error {
		if it.Attribute == "" || it.Text == "" || it.Score < 0 || it.Score > 1 {
			return errors.New("a score item needs attribute, text and a score in [0,1]")
		}
		items = append(items, it)
		return nil
	})
	if errScore != nil {
		return nil, errScore
	}
	p.scored = len(items)
	p.pairs = pairsFromScores(items)
	if err := readJSONL(filepath.Join(dir, "score_pairs.jsonl"), false, func(sp scorePair) error {
		if sp.Attribute == "" || sp.Higher == "" || sp.Lower == "" || sp.Higher == sp.Lower {
			return errors.New("a pair needs attribute and two different texts, higher and lower")
		}
		p.pairs = append(p.pairs, sp)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := readJSONL(filepath.Join(dir, "match.jsonl"), false, func(mp matchPool) error {
		if err := checkPool(mp); err != nil {
			return err
		}
		p.match = append(p.match, mp)
		return nil
	}); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *part) addClassify(it classifyItem) error {
	ls, ok := p.sets[it.Set]
	if !ok {
		return fmt.Errorf("unknown set %q", it.Set)
	}
	if it.Text == "" {
		return errors.New("empty text")
	}
	if it.Labels == nil {
		it.Labels = ls.Labels
	}
	if err := checkLabels(it.Labels); err != nil {
		return err
	}
	if !contains(it.Labels, it.Label) {
		return fmt.Errorf("gold label %q is not among the labels %q", it.Label, it.Labels)
	}
	p.classify = append(p.classify, it)
	return nil
}

// pairsFromScores makes, for every attribute, a pair of every two texts
// whose gold scores differ, the higher-scored one first.
func pairsFromScores(items []scoreItem) []scorePair {
	var out []scorePair
	for i, a := range items {
		for _, b := range items[i+1:] {
			if a.Attribute != b.Attribute || a.Score == b.Score {
				continue
			}
			hi, lo := a, b
			if b.Score > a.Score {
				hi, lo = b, a
			}
			out = append(out, scorePair{Attribute: a.Attribute, Higher: hi.Text, Lower: lo.Text})
		}
	}
	return out
}

func checkPool(mp matchPool) error {
	if len(mp.Docs) < 2 || len(mp.Queries) == 0 {
		return errors.New("a pool needs at least two documents and one query")
	}
	for _, q := range mp.Queries {
		if len(q.Relevance) != len(mp.Docs) {
			return fmt.Errorf("query %q grades %d of %d documents", q.Query, len(q.Relevance), len(mp.Docs))
		}
		top := 0
		for _, r := range q.Relevance {
			if r < 0 || r > 3 {
				return fmt.Errorf("query %q: grade %d outside 0-3", q.Query, r)
			}
			top = max(top, r)
		}
		if top < relevantGrade {
			return fmt.Errorf("query %q: no document graded %d or more answers it", q.Query, relevantGrade)
		}
		if q.Trap == nil {
			continue
		}
		t := *q.Trap
		if t < 0 || t >= len(mp.Docs) {
			return fmt.Errorf("query %q: trap %d is not a document of the pool", q.Query, t)
		}
		if _, unique := answerOf(q.Relevance); !unique || q.Relevance[t] >= relevantGrade {
			return fmt.Errorf("query %q: a trap query needs one top-graded answer and a trap graded below %d", q.Query, relevantGrade)
		}
	}
	return nil
}

func checkLabels(labels []string) error {
	if len(labels) < 2 {
		return errors.New("fewer than two labels")
	}
	seen := make(map[string]bool, len(labels))
	for _, l := range labels {
		if l == "" || seen[l] {
			return fmt.Errorf("empty or repeated label %q", l)
		}
		seen[l] = true
	}
	return nil
}

func loadSets(path string, out *map[string]labelSet) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading label sets: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("%s:%d: %w", path, lineAt(raw, errorOffset(err, dec)), err)
	}
	for _, name := range sortedKeys(*out) {
		ls := (*out)[name]
		err := checkLabels(ls.Labels)
		for l := range ls.Descriptions {
			if err == nil && !contains(ls.Labels, l) {
				err = fmt.Errorf("description for %q, which is not a label", l)
			}
		}
		for l := range ls.Examples {
			if err == nil && !contains(ls.Labels, l) {
				err = fmt.Errorf("examples for %q, which is not a label", l)
			}
		}
		if err != nil {
			at := bytes.Index(raw, []byte(`"`+name+`"`))
			return fmt.Errorf("%s:%d: set %q: %w", path, lineAt(raw, int64(at)), name, err)
		}
	}
	return nil
}

// readJSONL decodes every non-empty line of path into a T and hands it to
// add; an error names the file and line. A missing file is an error only
// if required.
func readJSONL[T any](path string, required bool, add func(T) error) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) && !required {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading evaluation set: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var v T
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		err := dec.Decode(&v)
		if err == nil && dec.More() {
			err = errors.New("more than one JSON value on the line")
		}
		if err == nil {
			err = add(v)
		}
		if err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// errorOffset is where in the input a decoding error was found.
func errorOffset(err error, dec *json.Decoder) int64 {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return syn.Offset
	case errors.As(err, &typ):
		return typ.Offset
	}
	return dec.InputOffset()
}

func lineAt(raw []byte, offset int64) int {
	offset = min(max(offset, 0), int64(len(raw)))
	return 1 + bytes.Count(raw[:offset], []byte("\n"))
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
