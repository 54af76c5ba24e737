package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/tollgate/tollgate/classifiers"
)

// A miniature WordNet in Princeton's format: a license line (leading
// spaces), then synsets. "car" and "automobile" share a synset whose
// hypernym is "vehicle"; "car" is also the second sense of a synset with
// "railcar"; "Cable_car" is a collocation the reader drops; "bright(a)"
// carries an adjective marker. Offsets need not be real byte offsets.
var wnSample = map[string]string{
	"data.noun": "  1 This software and database is being provided to you\n" +
		"00000100 06 n 03 car 0 automobile 0 Cable_car 0 001 @ 00000200 n 0000 | a motor vehicle  \n" +
		"00000200 06 n 01 vehicle 0 001 ~ 00000100 n 0000 | a conveyance  \n" +
		"00000300 06 n 02 car 1 railcar 0 000 | a wheeled vehicle on rails  \n",
	"index.noun": "  1 This software and database is being provided to you\n" +
		"automobile n 1 1 @ 1 0 00000100  \n" +
		"car n 2 1 @ 2 0 00000100 00000300  \n" +
		"railcar n 1 0 1 0 00000300  \n" +
		"vehicle n 1 1 ~ 1 0 00000200  \n",
	"data.adj":  "00000400 00 a 01 bright(a) 0 000 | emitting light  \n",
	"index.adj": "bright a 1 0 1 0 00000400  \n",
	"data.verb": "", "index.verb": "", "data.adv": "", "index.adv": "",
}

// writeWordNet writes wnSample into a new folder and returns it.
func writeWordNet(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range wnSample {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestReadWordNet(t *testing.T) {
	all, err := readWordNet(writeWordNet(t))
	if err != nil {
		t.Fatal(err)
	}
	car := all[synsetKey{'n', 100}]
	if car == nil || len(all) != 4 {
		t.Fatalf("read %d synsets, car's: %+v", len(all), car)
	}
	wantWords, wantRanks := []string{"car", "automobile", ""}, []int{1, 1, 0}
	for i := range wantWords {
		if car.words[i] != wantWords[i] || car.ranks[i] != wantRanks[i] {
			t.Errorf("lemma %d: %q rank %d, want %q rank %d", i, car.words[i], car.ranks[i], wantWords[i], wantRanks[i])
		}
	}
	if len(car.ptrs) != 1 || car.ptrs[0].sym != "@" || car.ptrs[0].target != (synsetKey{'n', 200}) {
		t.Errorf("car's pointers: %+v", car.ptrs)
	}
	if rail := all[synsetKey{'n', 300}]; rail.ranks[0] != 2 {
		t.Errorf("car's rank in the railcar synset is %d, want 2", rail.ranks[0])
	}
	if adj := all[synsetKey{'a', 400}]; adj.words[0] != "bright" || adj.ranks[0] != 1 {
		t.Errorf("adjective: %+v", adj)
	}
}

func TestReadWordNetRefusesOtherFiles(t *testing.T) {
	dir := writeWordNet(t)
	if err := os.WriteFile(filepath.Join(dir, "data.noun"), []byte("not wordnet at all\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readWordNet(dir); err == nil {
		t.Error("read a data file that is not WordNet's")
	}
	if _, err := readWordNet(t.TempDir()); err == nil {
		t.Error("read an empty folder")
	}
}

func TestWordGraph(t *testing.T) {
	all, err := readWordNet(writeWordNet(t))
	if err != nil {
		t.Fatal(err)
	}
	index := map[string]int{"car": 0, "automobile": 1, "vehicle": 2, "railcar": 3, "dog": 4}
	g := wordGraph(all, index, map[string]float32{"syn": 1, "@": 0.5})
	want := [][]edge{
		{{1, 1}, {2, 0.5}, {3, 0.5}}, // car: its synonym, its hypernym, and railcar through its second sense
		{{0, 1}, {2, 0.5}},           // automobile
		nil,                          // vehicle: hyponyms (~) not followed here
		{{0, 1}},                     // railcar
		nil,                          // dog: not in WordNet's sample
	}
	for i := range want {
		if len(g[i]) != len(want[i]) {
			t.Errorf("word %d: edges %v, want %v", i, g[i], want[i])
			continue
		}
		for k := range want[i] {
			if g[i][k] != want[i][k] {
				t.Errorf("word %d: edges %v, want %v", i, g[i], want[i])
				break
			}
		}
	}
}

func TestRetrofitMovesNeighboursTogether(t *testing.T) {
	vecs := [][]float32{{1, 0, 0}, {0, 1, 0}, {0, 0, 2}}
	g := [][]edge{{{1, 1}}, {{0, 1}}, nil}
	if n := retrofit(vecs, g, 10, 1); n != 2 {
		t.Errorf("%d words retrofitted, want 2", n)
	}
	cos := func(a, b []float32) float64 {
		var ab, aa, bb float64
		for d := range a {
			ab += float64(a[d] * b[d])
			aa += float64(a[d] * a[d])
			bb += float64(b[d] * b[d])
		}
		return ab / math.Sqrt(aa*bb)
	}
	if c := cos(vecs[0], vecs[1]); c < 0.5 {
		t.Errorf("cosine of two neighbours after retrofitting: %.3f, want > 0.5 (was 0)", c)
	}
	if c := cos(vecs[0], []float32{1, 0, 0}); c < 0.7 {
		t.Errorf("a word drifted from its own vector: cosine %.3f", c)
	}
	if vecs[2][2] != 1 || vecs[2][0] != 0 {
		t.Errorf("a word without neighbours changed beyond unit length: %v", vecs[2])
	}
}

// TestConvertRetrofitted runs the converter with -wordnet on the
// miniatures: the file is a valid vectors file, and differs from the one
// written without WordNet.
func TestConvertRetrofitted(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.json")
	sample := `{"dimensions":3,"words":["car","automobile","vehicle","dog"],` +
		`"vectors":{"car":[1,0,0,1,0],"automobile":[0,1,0,1,1],"vehicle":[0.5,0.5,0.2,0.7,2],"dog":[0,0,1,1,3]}}`
	if err := os.WriteFile(in, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	rels, err := parseRelations(defaultRelations)
	if err != nil {
		t.Fatal(err)
	}
	plain, retro := filepath.Join(dir, "plain.tgv"), filepath.Join(dir, "retro.tgv")
	if err := run(in, plain, options{maxRank: 10}); err != nil {
		t.Fatal(err)
	}
	o := options{maxRank: 10, wordnet: writeWordNet(t), relations: rels, iters: 10, alpha: 1}
	if err := run(in, retro, o); err != nil {
		t.Fatal(err)
	}
	v, err := classifiers.LoadVectors(retro)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if v.Len() != 4 {
		t.Fatalf("%d words, want 4", v.Len())
	}
	a, _ := os.ReadFile(plain)
	b, _ := os.ReadFile(retro)
	if bytes.Equal(a, b) {
		t.Error("retrofitting changed nothing")
	}
	o.wordnet = t.TempDir()
	if err := run(in, filepath.Join(dir, "none.tgv"), o); err == nil {
		t.Error("converted with a -wordnet folder that holds no WordNet")
	}
}

func TestParseRelations(t *testing.T) {
	rels, err := parseRelations(" syn=1, @=0.5 ,")
	if err != nil || len(rels) != 2 || rels["syn"] != 1 || rels["@"] != 0.5 {
		t.Errorf("got %v, %v", rels, err)
	}
	for _, bad := range []string{"syn", "syn=x", "@=-1"} {
		if _, err := parseRelations(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
