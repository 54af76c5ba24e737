// Package tokens counts tokens offline with the o200k_base BPE vocabulary,
// embedded in the binary (github.com/pkoukk/tiktoken-go-loader), so nothing is
// downloaded at run time. Counts are exact for that vocabulary and an
// estimate for models with other tokenizers: the gateway uses them only where
// an upstream never reported usage, and says so (usage_source = estimated).
//
// The vocabulary is held in flat arrays without pointers (about 5 MiB),
// not in Go maps of strings (about 30 MiB with tiktoken-go): it stays in
// the heap of every gateway that ever met a cut stream, and the garbage
// collector would otherwise walk it on every cycle.
package tokens

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	"github.com/pkoukk/tiktoken-go-loader/assets"
)

// o200kPattern splits text into the pieces BPE runs on; it is o200k_base's
// (tiktoken's openai_public.py), which needs regexp2 for its look-ahead.
var o200kPattern = strings.Join([]string{
	`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
	`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
	`\p{N}{1,3}`,
	` ?[^\s\p{L}\p{N}]+[\r\n/]*`,
	`\s*[\r\n]+`,
	`\s+(?!\S)`,
	`\s+`,
}, "|")

var (
	loadOnce sync.Once
	vocab    *vocabulary
	splitter *regexp2.Regexp
	loadErr  error
)

// Preload loads the vocabulary (about 15 ms, 5 MiB of heap) so the first
// Count is fast. Count loads it too, on first use.
func Preload() error {
	loadOnce.Do(func() {
		data, err := assets.Assets.ReadFile("o200k_base.tiktoken")
		if err == nil {
			vocab, err = parseVocabulary(data)
		}
		if err == nil {
			splitter, err = regexp2.Compile(o200kPattern, regexp2.None)
		}
		loadErr = err
	})
	return loadErr
}

// Count returns the number of tokens in text. If the vocabulary cannot be
// loaded (it is embedded, so only a broken build does that) it falls back to
// one token per four bytes, rounded up.
func Count(text string) int {
	if text == "" {
		return 0
	}
	if Preload() != nil {
		return (len(text) + 3) / 4
	}
	// Like tiktoken, pieces are cut from the text's runes, so an invalid
	// UTF-8 byte counts as U+FFFD.
	runes := []rune(text)
	var pieceBuf [256]byte
	n := 0
	m, _ := splitter.FindRunesMatch(runes)
	for m != nil {
		piece := pieceBuf[:0]
		for _, r := range runes[m.Index : m.Index+m.Length] {
			piece = utf8.AppendRune(piece, r)
		}
		n += vocab.pieceTokens(piece)
		m, _ = splitter.FindNextMatch(m)
	}
	return n
}

// vocabulary is the byte sequences of the tokens and their ranks, found
// through an open-addressing table of token indexes.
type vocabulary struct {
	blob  []byte   // every token's bytes, one after another
	start []uint32 // token i is blob[start[i]:start[i+1]]
	rank  []uint32 // merge rank of token i
	table []uint32 // token index + 1; 0 is an empty slot
	mask  uint32
	seed  maphash.Seed
}

const noRank = ^uint32(0)

func parseVocabulary(data []byte) (*vocabulary, error) {
	lines := bytes.Count(data, []byte{'\n'}) + 1
	v := &vocabulary{
		// Decoded tokens are at most three quarters of their base64: one
		// allocation, so loading does not leave megabytes of garbage.
		blob:  make([]byte, 0, len(data)*3/4),
		start: make([]uint32, 0, lines+1),
		rank:  make([]uint32, 0, lines),
		seed:  maphash.MakeSeed(),
	}
	for line := range bytes.SplitSeq(data, []byte{'\n'}) {
		if len(line) == 0 {
			continue
		}
		sp := bytes.IndexByte(line, ' ')
		if sp < 0 {
			return nil, fmt.Errorf("o200k_base vocabulary: line %q has no rank", line)
		}
		var rank uint32
		for _, c := range line[sp+1:] {
			if c < '0' || c > '9' {
				return nil, fmt.Errorf("o200k_base vocabulary: bad rank in %q", line)
			}
			rank = rank*10 + uint32(c-'0')
		}
		at := len(v.blob)
		v.blob = slices.Grow(v.blob, base64.StdEncoding.DecodedLen(sp))
		k, err := base64.StdEncoding.Decode(v.blob[at:at+base64.StdEncoding.DecodedLen(sp)], line[:sp])
		if err != nil {
			return nil, fmt.Errorf("o200k_base vocabulary: %w", err)
		}
		v.blob = v.blob[:at+k]
		v.start = append(v.start, uint32(at))
		v.rank = append(v.rank, rank)
	}
	if len(v.rank) == 0 {
		return nil, errors.New("o200k_base vocabulary is empty")
	}
	v.start = append(v.start, uint32(len(v.blob)))
	size := uint32(1)
	for size < uint32(2*len(v.rank)) {
		size <<= 1
	}
	v.table, v.mask = make([]uint32, size), size-1
	for i := range v.rank {
		slot := uint32(maphash.Bytes(v.seed, v.token(i))) & v.mask
		for v.table[slot] != 0 {
			slot = (slot + 1) & v.mask
		}
		v.table[slot] = uint32(i) + 1
	}
	return v, nil
}

func (v *vocabulary) token(i int) []byte { return v.blob[v.start[i]:v.start[i+1]] }

// lookup returns the rank of the token whose bytes are b, or noRank.
func (v *vocabulary) lookup(b []byte) uint32 {
	for slot := uint32(maphash.Bytes(v.seed, b)) & v.mask; ; slot = (slot + 1) & v.mask {
		t := v.table[slot]
		if t == 0 {
			return noRank
		}
		if bytes.Equal(v.token(int(t-1)), b) {
			return v.rank[t-1]
		}
	}
}

// pieceTokens is the number of tokens byte-pair encoding gives piece: the
// merge loop of tiktoken, which joins the adjacent pair of lowest rank
// (the leftmost of equals) until no pair is a token. Its scan for the
// lowest pair is quadratic in the piece's length, so a long piece (one
// 64 KiB word took 2.6 s) goes to mergeLong, which keeps the pairs in a
// heap and merges in the same order.
func (v *vocabulary) pieceTokens(piece []byte) int {
	switch {
	case len(piece) == 0:
		return 0
	case len(piece) == 1 || v.lookup(piece) != noRank:
		return 1
	case len(piece) > longPiece:
		return v.mergeLong(piece)
	}
	return v.mergeScan(piece)
}

// mergeScan is pieceTokens by tiktoken's own loop: each merge scans every
// pair for the lowest.
func (v *vocabulary) mergeScan(piece []byte) int {
	type part struct {
		start int
		rank  uint32
	}
	var buf [longPiece + 1]part
	parts := buf[:0]
	if len(piece) >= len(buf) {
		parts = make([]part, 0, len(piece)+1)
	}
	for i := 0; i <= len(piece); i++ {
		parts = append(parts, part{i, noRank})
	}
	pairRank := func(i, skip int) uint32 {
		if i+skip+2 < len(parts) {
			return v.lookup(piece[parts[i].start:parts[i+skip+2].start])
		}
		return noRank
	}
	for i := 0; i < len(parts)-2; i++ {
		parts[i].rank = pairRank(i, 0)
	}
	for len(parts) > 1 {
		lowest, at := noRank, -1
		for i := 0; i < len(parts)-1; i++ {
			if parts[i].rank < lowest {
				lowest, at = parts[i].rank, i
			}
		}
		if at < 0 {
			break
		}
		parts[at].rank = pairRank(at, 1)
		if at > 0 {
			parts[at-1].rank = pairRank(at-1, 1)
		}
		parts = append(parts[:at+1], parts[at+2:]...)
	}
	return len(parts) - 1
}

// longPiece is the length above which pieceTokens merges through a heap:
// below it the plain scan is faster, and nearly every piece of real text
// is far below it.
const longPiece = 127

// mergeLong is pieceTokens for a long piece, in O(n log n): the parts are
// a linked list, and every pair's rank sits in a min-heap keyed by rank,
// then position, so the pair popped is the one the plain scan would pick.
// A merge changes the ranks of the pairs on either side; their old heap
// entries are left behind and skipped when popped, as their rank no
// longer matches.
func (v *vocabulary) mergeLong(piece []byte) int {
	n := len(piece) // parts; part i starts at byte i until merged away
	next := make([]int32, n)
	prev := make([]int32, n)
	rank := make([]uint32, n) // rank of the pair part i starts; noRank if none
	for i := range n {
		next[i], prev[i] = int32(i+1), int32(i-1)
	}
	end := func(i int32) int { // where part i ends
		if next[i] >= int32(n) {
			return n
		}
		return int(next[i])
	}
	pairRank := func(i int32) uint32 {
		j := next[i]
		if j >= int32(n) {
			return noRank
		}
		return v.lookup(piece[i:end(j)])
	}
	h := pairHeap(make([]pairEntry, 0, n))
	for i := range int32(n) {
		rank[i] = pairRank(i)
		if rank[i] != noRank {
			h = append(h, pairEntry{rank[i], i})
		}
	}
	h.init()
	parts := n
	for len(h) > 0 {
		e := h.pop()
		if rank[e.at] != e.rank { // stale, or merged away (noRank)
			continue
		}
		gone := next[e.at]
		next[e.at] = next[gone]
		if next[gone] < int32(n) {
			prev[next[gone]] = e.at
		}
		rank[gone] = noRank
		parts--
		if rank[e.at] = pairRank(e.at); rank[e.at] != noRank {
			h.push(pairEntry{rank[e.at], e.at})
		}
		if p := prev[e.at]; p >= 0 {
			if rank[p] = pairRank(p); rank[p] != noRank {
				h.push(pairEntry{rank[p], p})
			}
		}
	}
	return parts
}

// pairEntry is a pair of adjacent parts in mergeLong's heap: the rank of
// their merge, and where the first part starts.
type pairEntry struct {
	rank uint32
	at   int32
}

// pairHeap is a binary min-heap of pairs by rank, then position; written
// out rather than through container/heap to keep the entries unboxed.
type pairHeap []pairEntry

func (h pairHeap) less(i, j int) bool {
	return h[i].rank < h[j].rank || h[i].rank == h[j].rank && h[i].at < h[j].at
}

func (h pairHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h *pairHeap) push(e pairEntry) {
	*h = append(*h, e)
	s := *h
	for i := len(s) - 1; i > 0; {
		parent := (i - 1) / 2
		if !s.less(i, parent) {
			break
		}
		s[i], s[parent] = s[parent], s[i]
		i = parent
	}
}

func (h *pairHeap) pop() pairEntry {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	*h = s[:last]
	h.down(0)
	return top
}

func (h pairHeap) down(i int) {
	for {
		least := i
		if l := 2*i + 1; l < len(h) && h.less(l, least) {
			least = l
		}
		if r := 2*i + 2; r < len(h) && h.less(r, least) {
			least = r
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}
