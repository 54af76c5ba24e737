package classifiers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"unsafe"
)

// Vectors are pretrained English word vectors in the compact form
// `tollgate-vectors` writes: unit-length vectors quantized to int8 with a
// scale per word, the words in order of frequency (so a word's index is
// its frequency rank, which the semantic engine weights by), and an
// open-addressing hash table over them. A copy of the file that is the
// process's own is mapped, off the Go heap (see mapFile), and looked up
// in place: a lookup allocates nothing, and a later change to the file
// does not reach the loaded vectors.
//
// The layout, little-endian, each part 4-byte aligned:
//
//	header   magic "TGVEC001", dims, count, slots, wordBytes (uint32 each)
//	offsets  uint32[count+1]  word i is words[offsets[i]:offsets[i+1]]
//	table    uint32[slots]    index+1 of the word hashed there, 0 empty
//	scales   float32[count]   vector i is scales[i] * data[i*dims:(i+1)*dims]
//	data     int8[count*dims]
//	words    byte[wordBytes]
//
// A Vectors is read-only once loaded and safe for concurrent use.
type Vectors struct {
	dims    int
	count   int
	offsets []uint32
	table   []uint32
	scales  []float32
	data    []int8
	words   []byte
	mapped  []byte // what Close unmaps; nil when read onto the heap
}

const vectorsMagic = "TGVEC001"

const vectorsHeaderSize = len(vectorsMagic) + 4*4

// maxScale is the largest scale a vector's int8s can have (1/127, see
// quantize), with room for float32 rounding.
const maxScale = 1.0001 / 127

// ErrVectorsCorrupt says the vectors file is not one `tollgate-vectors`
// wrote, was cut short, or holds numbers no vector can have: run
// scripts/vectors.sh install again.
var ErrVectorsCorrupt = errors.New("vectors file is corrupt or truncated; rebuild it with scripts/vectors.sh install")

// LoadVectors reads the vectors file at path. The caller keeps the result
// for the life of the process (Close only in tests and tools).
func LoadVectors(path string) (*Vectors, error) {
	buf, mapped, err := mapFile(path)
	if err != nil {
		return nil, err
	}
	v, err := parseVectors(buf)
	if err != nil {
		if mapped {
			unmapFile(buf)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if mapped {
		v.mapped = buf
	}
	return v, nil
}

// Close frees the vectors' memory; the Vectors must not be used afterwards.
func (v *Vectors) Close() error {
	if v.mapped == nil {
		return nil
	}
	err := unmapFile(v.mapped)
	v.mapped = nil
	return err
}

// vectorsLayout reads the header at the start of buf: the vectors'
// dimensions, words, hash slots and bytes of words, and the size of the
// whole file they make; ErrVectorsCorrupt for a header no vectors file
// has. mapFile checks the size against the file's before copying it, so
// that a file named by mistake (a model of 30 GB) is refused unread.
func vectorsLayout(buf []byte) (dims, count, slots, wordBytes, size int, err error) {
	if len(buf) < vectorsHeaderSize || string(buf[:len(vectorsMagic)]) != vectorsMagic {
		return 0, 0, 0, 0, 0, ErrVectorsCorrupt
	}
	h := buf[len(vectorsMagic):]
	dims = int(binary.LittleEndian.Uint32(h[0:]))
	count = int(binary.LittleEndian.Uint32(h[4:]))
	slots = int(binary.LittleEndian.Uint32(h[8:]))
	wordBytes = int(binary.LittleEndian.Uint32(h[12:]))
	if dims == 0 || dims > 1024 || count == 0 || slots < count || slots&(slots-1) != 0 {
		return 0, 0, 0, 0, 0, ErrVectorsCorrupt
	}
	size = vectorsHeaderSize + 4*(count+1) + 4*slots + 4*count + count*dims + wordBytes
	return dims, count, slots, wordBytes, size, nil
}

func parseVectors(buf []byte) (*Vectors, error) {
	dims, count, slots, wordBytes, size, err := vectorsLayout(buf)
	if err != nil {
		return nil, err
	}
	if len(buf) != size {
		return nil, ErrVectorsCorrupt
	}
	v := &Vectors{dims: dims, count: count}
	p := vectorsHeaderSize
	v.offsets = u32s(buf[p:], count+1)
	p += 4 * (count + 1)
	v.table = u32s(buf[p:], slots)
	p += 4 * slots
	v.scales = unsafe.Slice((*float32)(unsafe.Pointer(&buf[p])), count)
	p += 4 * count
	v.data = unsafe.Slice((*int8)(unsafe.Pointer(&buf[p])), count*dims)
	p += count * dims
	v.words = buf[p:]
	// Offsets and table entries are checked once here so that lookups
	// can trust them without bounds surprises.
	if v.offsets[0] != 0 || int(v.offsets[count]) != wordBytes {
		return nil, ErrVectorsCorrupt
	}
	for i := 1; i <= count; i++ {
		if v.offsets[i] <= v.offsets[i-1] {
			return nil, ErrVectorsCorrupt
		}
	}
	empty := 0
	for _, e := range v.table {
		if int(e) > count {
			return nil, ErrVectorsCorrupt
		}
		if e == 0 {
			empty++
		}
	}
	if empty == 0 { // a lookup of an unknown word would never end
		return nil, ErrVectorsCorrupt
	}
	// WriteVectors makes each quantized vector unit length; its largest
	// component is ±127, so its scale is in (0, 1/127]. Any other scale
	// (NaN, infinite, 0, huge) is a damaged file, and would turn every
	// confidence computed with the word into NaN, which no answer can
	// carry.
	for _, sc := range v.scales {
		if !(sc > 0 && sc <= maxScale) {
			return nil, ErrVectorsCorrupt
		}
	}
	return v, nil
}

// u32s views b as n little-endian uint32s; the file is written
// little-endian and the gateway runs on little-endian machines (amd64,
// arm64), where this is a plain reinterpretation.
func u32s(b []byte, n int) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(&b[0])), n)
}

// Dims is the length of every vector.
func (v *Vectors) Dims() int { return v.dims }

// Len is the number of words.
func (v *Vectors) Len() int { return v.count }

// Word is the word of index i (its frequency rank).
func (v *Vectors) Word(i int) string {
	return string(v.words[v.offsets[i]:v.offsets[i+1]])
}

// Index returns the index (frequency rank) of word, or -1. It does not
// allocate.
func (v *Vectors) Index(word string) int {
	mask := uint32(len(v.table) - 1)
	for s := hashWord(word) & mask; ; s = (s + 1) & mask {
		e := v.table[s]
		if e == 0 {
			return -1
		}
		i := e - 1
		if string(v.words[v.offsets[i]:v.offsets[i+1]]) == word {
			return int(i)
		}
	}
}

// addTo adds w times the unit vector of word i to acc.
func (v *Vectors) addTo(acc []float32, i int, w float32) {
	w *= v.scales[i]
	row := v.data[i*v.dims : (i+1)*v.dims]
	for d, q := range row {
		acc[d] += w * float32(q)
	}
}

// dot is the cosine of words i and j (their vectors have unit length).
// It and dotWith keep four sums: with one, each addition waits for the
// last. With the joined vectors' 612 dimensions that took a match from
// 71-80 µs to 45-51 (BenchmarkSemanticMatch).
func (v *Vectors) dot(i, j int) float32 {
	a := v.data[i*v.dims : (i+1)*v.dims]
	b := v.data[j*v.dims : (j+1)*v.dims]
	b = b[:len(a)]
	var s0, s1, s2, s3 int32
	d := 0
	for ; d+4 <= len(a); d += 4 {
		s0 += int32(a[d]) * int32(b[d])
		s1 += int32(a[d+1]) * int32(b[d+1])
		s2 += int32(a[d+2]) * int32(b[d+2])
		s3 += int32(a[d+3]) * int32(b[d+3])
	}
	for ; d < len(a); d++ {
		s0 += int32(a[d]) * int32(b[d])
	}
	return float32(s0+s1+s2+s3) * v.scales[i] * v.scales[j]
}

// dotWith is the dot product of word i's unit vector with x.
func (v *Vectors) dotWith(i int, x []float32) float32 {
	row := v.data[i*v.dims : (i+1)*v.dims]
	x = x[:len(row)]
	var s0, s1, s2, s3 float32
	d := 0
	for ; d+4 <= len(row); d += 4 {
		s0 += float32(row[d]) * x[d]
		s1 += float32(row[d+1]) * x[d+1]
		s2 += float32(row[d+2]) * x[d+2]
		s3 += float32(row[d+3]) * x[d+3]
	}
	for ; d < len(row); d++ {
		s0 += float32(row[d]) * x[d]
	}
	return (s0 + s1 + s2 + s3) * v.scales[i]
}

// hashWord is FNV-1a, written out so that a lookup does not allocate.
func hashWord(w string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(w); i++ {
		h ^= uint32(w[i])
		h *= 16777619
	}
	return h
}

// WriteVectors writes words (in frequency order, unique) and their
// vectors in the file format above. Each vector is normalised to unit
// length and quantized to int8 with its own scale; an all-zero vector is
// refused, since it would make every similarity with the word 0.
func WriteVectors(w io.Writer, words []string, vecs [][]float32) error {
	if len(words) == 0 || len(words) != len(vecs) {
		return fmt.Errorf("writing vectors: %d words for %d vectors", len(words), len(vecs))
	}
	dims := len(vecs[0])
	slots := 1
	for slots < 2*len(words) {
		slots <<= 1
	}
	offsets := make([]uint32, len(words)+1)
	table := make([]uint32, slots)
	var blob []byte
	for i, word := range words {
		if word == "" {
			return fmt.Errorf("writing vectors: word %d is empty", i)
		}
		blob = append(blob, word...)
		offsets[i+1] = uint32(len(blob))
		mask := uint32(slots - 1)
		s := hashWord(word) & mask
		for table[s] != 0 {
			if words[table[s]-1] == word {
				return fmt.Errorf("writing vectors: %q twice", word)
			}
			s = (s + 1) & mask
		}
		table[s] = uint32(i + 1)
	}
	scales := make([]float32, len(words))
	data := make([]int8, len(words)*dims)
	for i, vec := range vecs {
		if len(vec) != dims {
			return fmt.Errorf("writing vectors: %q has %d dimensions, not %d", words[i], len(vec), dims)
		}
		if err := quantize(vec, data[i*dims:(i+1)*dims], &scales[i]); err != nil {
			return fmt.Errorf("writing vectors: %q: %w", words[i], err)
		}
	}
	head := make([]byte, 0, vectorsHeaderSize)
	head = append(head, vectorsMagic...)
	for _, x := range []int{dims, len(words), slots, len(blob)} {
		head = binary.LittleEndian.AppendUint32(head, uint32(x))
	}
	parts := [][]byte{head, le32(offsets), le32(table), le32f(scales), i8bytes(data), blob}
	for _, p := range parts {
		if _, err := w.Write(p); err != nil {
			return fmt.Errorf("writing vectors: %w", err)
		}
	}
	return nil
}

func quantize(vec []float32, out []int8, scale *float32) error {
	var norm, hi float64
	for _, x := range vec {
		norm += float64(x) * float64(x)
	}
	norm = math.Sqrt(norm)
	if norm == 0 {
		return errors.New("zero vector")
	}
	for _, x := range vec {
		hi = math.Max(hi, math.Abs(float64(x)/norm))
	}
	s := hi / 127
	var qn float64
	for d, x := range vec {
		q := math.Round(float64(x) / norm / s)
		out[d] = int8(q)
		qn += q * q
	}
	// The scale makes the quantized vector itself unit length, so that
	// the cosine of two words is exactly their scaled dot product.
	*scale = float32(1 / math.Sqrt(qn))
	return nil
}

func le32(xs []uint32) []byte {
	b := make([]byte, 0, 4*len(xs))
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, x)
	}
	return b
}

func le32f(xs []float32) []byte {
	b := make([]byte, 0, 4*len(xs))
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func i8bytes(xs []int8) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&xs[0])), len(xs))
}

// readWhole is the fallback where mapping is not available.
func readWhole(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return b, nil
}
