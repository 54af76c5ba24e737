package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/tollgate/tollgate/classifiers"
)

const sentenceMagic = "TGSEN001"

// readSentenceVectors reads what scripts/sentence-vectors.js wrote: the
// sentence encoder's vector of each word embedded alone, by word.
func readSentenceVectors(path string) (map[string][]float32, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var head [16]byte
	if _, err := io.ReadFull(r, head[:]); err != nil || string(head[:8]) != sentenceMagic {
		return nil, 0, fmt.Errorf("%s: not a sentence-vectors file (%q expected)", path, sentenceMagic)
	}
	dims := int(binary.LittleEndian.Uint32(head[8:]))
	count := int(binary.LittleEndian.Uint32(head[12:]))
	if dims == 0 || dims > 4096 {
		return nil, 0, fmt.Errorf("%s: %d dimensions", path, dims)
	}
	byWord := make(map[string][]float32, count)
	raw := make([]byte, 4*dims)
	for i := range count {
		n, err := r.ReadByte()
		word := make([]byte, n)
		if err == nil {
			_, err = io.ReadFull(r, word)
		}
		if err == nil {
			_, err = io.ReadFull(r, raw)
		}
		if err != nil {
			return nil, 0, fmt.Errorf("%s: cut short at word %d of %d", path, i, count)
		}
		vec := make([]float32, dims)
		for d := range vec {
			vec[d] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*d:]))
		}
		byWord[string(word)] = vec
	}
	if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
		return nil, 0, fmt.Errorf("%s: more than the %d words its header gives", path, count)
	}
	return byWord, dims, nil
}

// joinSentenceVectors gives each word both views: its GloVe vector and its
// sentence-encoder vector, each at unit length, the second scaled by
// weight, one after the other. A cosine of two joined vectors is then a
// weighted mean of the two views' cosines, so a pair must look alike in
// both to come out close. Words the encoder did not embed are dropped:
// every vector of the file has the same dimensions.
func joinSentenceVectors(words []string, vecs [][]float32, byWord map[string][]float32, dims int, weight float32) ([]string, [][]float32, error) {
	var keptWords []string
	var kept [][]float32
	for i, w := range words {
		sv, ok := byWord[w]
		if !ok {
			continue
		}
		joined := make([]float32, 0, len(vecs[i])+dims)
		joined = appendScaled(joined, vecs[i], 1)
		joined = appendScaled(joined, sv, weight)
		keptWords = append(keptWords, w)
		kept = append(kept, joined)
	}
	if len(kept) == 0 {
		return nil, nil, errors.New("no word has both a GloVe and a sentence-encoder vector")
	}
	return keptWords, kept, nil
}

// appendScaled appends v at length scale.
func appendScaled(dst, v []float32, scale float32) []float32 {
	start := len(dst)
	dst = append(dst, v...)
	part := dst[start:]
	classifiers.Normalize(part)
	for i := range part {
		part[i] *= scale
	}
	return dst
}
