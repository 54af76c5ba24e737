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
// until no pair is a token.
func (v *vocabulary) pieceTokens(piece []byte) int {
	switch {
	case len(piece) == 0:
		return 0
	case len(piece) == 1 || v.lookup(piece) != noRank:
		return 1
	}
	type part struct {
		start int
		rank  uint32
	}
	var buf [128]part
	parts := buf[:0]
	if len(piece)+1 > len(buf) {
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
