package classifiers

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func writeTestVectors(t *testing.T, words []string, vecs [][]float32) string {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteVectors(&buf, words, vecs); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "v.tgv")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVectorsRoundTrip(t *testing.T) {
	words := []string{"cat", "dog", "car"}
	vecs := [][]float32{{1, 0.2, 0}, {0.9, 0.3, 0.1}, {-0.2, 0.1, 3}}
	v, err := LoadVectors(writeTestVectors(t, words, vecs))
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if v.Len() != 3 || v.Dims() != 3 {
		t.Fatalf("%d words × %d, want 3 × 3", v.Len(), v.Dims())
	}
	for i, w := range words {
		if v.Index(w) != i || v.Word(i) != w {
			t.Errorf("%q: index %d, word %q", w, v.Index(w), v.Word(i))
		}
	}
	if v.Index("cow") != -1 {
		t.Errorf("an unknown word has index %d", v.Index("cow"))
	}
	cos := func(a, b []float32) float64 {
		var d, na, nb float64
		for i := range a {
			d += float64(a[i] * b[i])
			na += float64(a[i] * a[i])
			nb += float64(b[i] * b[i])
		}
		return d / math.Sqrt(na*nb)
	}
	for i := range words {
		for j := range words {
			if got, want := float64(v.dot(i, j)), cos(vecs[i], vecs[j]); math.Abs(got-want) > 0.02 {
				t.Errorf("cos(%s, %s) = %.3f after quantization, want %.3f", words[i], words[j], got, want)
			}
		}
	}
}

// TestVectorsCorruptFile: a cut or foreign file is refused with the fix,
// never read past its end.
func TestVectorsCorruptFile(t *testing.T) {
	path := writeTestVectors(t, []string{"cat", "dog"}, [][]float32{{1, 0}, {0, 1}})
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"truncated": whole[:len(whole)-1],
		"longer":    append(append([]byte{}, whole...), 0),
		"foreign":   append([]byte("GIF89a.."), whole[8:]...),
		"header":    whole[:10],
	} {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadVectors(p); !errors.Is(err, ErrVectorsCorrupt) {
			t.Errorf("%s: %v, want ErrVectorsCorrupt", name, err)
		}
	}
	// A scale no vector can have made every classify with the word a
	// 500 (NaN confidences cannot be encoded), and score and match a
	// silent 0; a full table made a lookup of an unknown word spin.
	scalesAt := vectorsHeaderSize + 4*3 + 4*4 // 2 words, 4 slots
	tableAt := vectorsHeaderSize + 4*3
	for name, patch := range map[string]func(b []byte){
		"NaN scale":      func(b []byte) { binary.LittleEndian.PutUint32(b[scalesAt:], math.Float32bits(float32(math.NaN()))) },
		"infinite scale": func(b []byte) { binary.LittleEndian.PutUint32(b[scalesAt+4:], math.Float32bits(float32(math.Inf(1)))) },
		"huge scale":     func(b []byte) { binary.LittleEndian.PutUint32(b[scalesAt:], math.Float32bits(1e30)) },
		"zero scale":     func(b []byte) { binary.LittleEndian.PutUint32(b[scalesAt:], 0) },
		"negative scale": func(b []byte) { binary.LittleEndian.PutUint32(b[scalesAt:], math.Float32bits(-1.0/127)) },
		"full table": func(b []byte) {
			for s := 0; s < 4; s++ {
				binary.LittleEndian.PutUint32(b[tableAt+4*s:], 1)
			}
		},
	} {
		b := append([]byte{}, whole...)
		patch(b)
		p := filepath.Join(t.TempDir(), "patched")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadVectors(p); !errors.Is(err, ErrVectorsCorrupt) {
			t.Errorf("%s: %v, want ErrVectorsCorrupt", name, err)
		}
	}
	if _, err := LoadVectors(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want not-exist", err)
	}
}

// TestVectorsFileRewrittenWhileLoaded: an admin who copies a new file
// over the one a gateway has loaded, or cuts it, used to kill the
// gateway with SIGBUS on the next lookup (the file was mapped shared).
// The loaded vectors are the process's own copy and answer as before.
func TestVectorsFileRewrittenWhileLoaded(t *testing.T) {
	var words []string
	var vecs [][]float32
	for i := 0; i < 2000; i++ {
		words = append(words, fmt.Sprintf("w%d", i))
		vec := make([]float32, 64)
		vec[i%64], vec[(i*7+1)%64] = 1, float32(i%5)+0.5
		vecs = append(vecs, vec)
	}
	path := writeTestVectors(t, words, vecs)
	v, err := LoadVectors(path)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	lookAll := func(stage string) {
		t.Helper()
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("%s: a lookup faulted: %v", stage, r)
			}
		}()
		for i, w := range words {
			if v.Index(w) != i || v.Word(i) != w {
				t.Fatalf("%s: %q has index %d, word %d reads %q", stage, w, v.Index(w), i, v.Word(i))
			}
		}
		if d := v.dot(0, 0); math.Abs(float64(d)-1) > 0.01 {
			t.Fatalf("%s: a word's cosine with itself is %.3f", stage, d)
		}
	}
	lookAll("loaded")
	// The copy has no name: nothing is left beside the file to clean up.
	if entries, err := os.ReadDir(filepath.Dir(path)); err != nil || len(entries) != 1 {
		t.Fatalf("the vectors' directory holds %v (%v), want the file alone", entries, err)
	}
	if err := os.WriteFile(path, []byte("TGVEC001 something else entirely"), 0o644); err != nil {
		t.Fatal(err)
	}
	lookAll("after a shorter file was written over it")
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	lookAll("after it was cut to nothing")
}

func TestWriteVectorsRefusesBadInput(t *testing.T) {
	var buf bytes.Buffer
	for name, c := range map[string]struct {
		words []string
		vecs  [][]float32
	}{
		"duplicate": {[]string{"a", "a"}, [][]float32{{1}, {1}}},
		"zero":      {[]string{"a"}, [][]float32{{0, 0}}},
		"ragged":    {[]string{"a", "b"}, [][]float32{{1, 0}, {1}}},
		"empty":     {[]string{""}, [][]float32{{1}}},
	} {
		if err := WriteVectors(&buf, c.words, c.vecs); err == nil {
			t.Errorf("%s: written", name)
		}
	}
}

// TestRealVectors: the installed file is the real one, not a stand-in,
// and has both views (an install that fell back to GloVe alone has 100
// dimensions).
func TestRealVectors(t *testing.T) {
	v, err := testVectors()
	if err != nil {
		t.Fatalf("semantic engine: %v", err)
	}
	if v.Len() < 59000 || v.Dims() != 100+512 {
		t.Fatalf("%d words × %d dimensions; want 60k × (100 GloVe + 512 sentence encoder): see scripts/vectors.sh", v.Len(), v.Dims())
	}
	i, j, k := v.Index("refund"), v.Index("reimbursement"), v.Index("giraffe")
	if i < 0 || j < 0 || k < 0 {
		t.Fatalf("common words missing: %d %d %d", i, j, k)
	}
	if near, far := v.dot(i, j), v.dot(i, k); near < 0.4 || far > 0.2 {
		t.Errorf("cos(refund, reimbursement) %.2f, cos(refund, giraffe) %.2f: not word meaning", near, far)
	}
}
