package classifiers

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"

	"github.com/tollgate/tollgate/config"
)

// Cache keys. A key made by joining texts with a separator is shared by
// inputs that hold the separator: the labels ["apple\nbanana"] and
// ["apple", "banana"] had one key, so the second call got the first's
// compiled set, of one label, and the process ended on an index out of
// range; a crafted set gave another tenant's call the wrong answer. Each
// part is written with its length before it, so no two inputs write the
// same bytes, and hashed, so a key is 32 bytes whatever the set's size.

type keyWriter struct {
	h    hash.Hash
	buf  [binary.MaxVarintLen64]byte
	size int // bytes of text written
}

func newKeyWriter() *keyWriter { return &keyWriter{h: sha256.New()} }

func (w *keyWriter) count(n int) {
	w.h.Write(w.buf[:binary.PutUvarint(w.buf[:], uint64(n))])
}

func (w *keyWriter) text(s string) {
	w.count(len(s))
	w.h.Write([]byte(s))
	w.size += len(s)
}

func (w *keyWriter) key() string { return string(w.h.Sum(nil)) }

// MaxLabelSetBytes is the most text (labels, descriptions and examples)
// a label set holds to be cached: one of megabytes of descriptions,
// cached 128 times over, was about 10 MB of memory a set. The API refuses
// larger sets in requests and gateway.yaml in saved classifiers; one that
// comes another way is compiled for each call.
const MaxLabelSetBytes = config.MaxLabelSetBytes

// labelSetKey keys a label set with its descriptions and examples; size
// is their bytes.
func labelSetKey(labels []string, descriptions map[string]string, examples map[string][]string) (key string, size int) {
	w := newKeyWriter()
	w.count(len(labels))
	for _, l := range labels {
		w.text(l)
		w.text(descriptions[l])
		w.count(len(examples[l]))
		for _, ex := range examples[l] {
			w.text(ex)
		}
	}
	return w.key(), w.size
}

// wordsKey keys a list of vector indexes.
func wordsKey(words []int32) string {
	w := newKeyWriter()
	w.count(len(words))
	for _, i := range words {
		w.count(int(i))
	}
	return w.key()
}

// textsKey keys a list of texts.
func textsKey(texts ...string) string {
	w := newKeyWriter()
	w.count(len(texts))
	for _, t := range texts {
		w.text(t)
	}
	return w.key()
}
